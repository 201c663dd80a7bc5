//! Constants shared by the inline math of the code generator and the native strip helpers
//! ([`crate::vmath`]): both must use the same ones for their results to agree bit for bit.

/// 1.5·2^23: adding it rounds an f32 to an integer.
pub const SHIFT32: f64 = 12582912.0;
/// 1.5·2^52: adding it rounds an f64 to an integer.
pub const SHIFT64: f64 = 6755399441055744.0;
/// The f32 nearest to ln 2.
pub const LN2_HI: f64 = 0.693_147_182_464_599_6;
/// ln 2 - [`LN2_HI`].
pub const LN2_LO: f64 = -1.904_654_299_957_768e-9;
/// log2(e).
pub const LOG2E: f64 = std::f64::consts::LOG2_E;
/// `(exp(r) - 1 - r) / r²` on `|r| ≤ ln2/2`, Chebyshev fit (max error 9e-9 after f32 rounding).
pub const EXP_G: [f64; 6] = [
    0.5,
    0.166_666_671_633_720_4,
    0.041_666_466_742_753_98,
    0.008_333_310_484_886_17,
    0.001_393_364_160_321_652_9,
    0.000_198_909_809_114_411_47,
];

/// `erf(x)/x` as a polynomial in `u = x²` on `[0, 1]` (Chebyshev fit, 5.5e-8 after rounding).
pub const ERF_SMALL: [f64; 6] = [
    1.128_379_106_521_606_4,
    -0.376_123_428_344_726_56,
    0.112_803_168_594_837_19,
    -0.026_715_055_108_070_374,
    0.004_921_761_807_054_281,
    -0.000_564_805_988_688_021_9,
];

/// The center of [`ERFC_Q`]: `Q(t) = erfc(z)·e^{z²}/t` with `t = 2/(2+z)`, as a polynomial in `t - 0.48`, fitted at
/// Chebyshev nodes on `t ∈ [0.16, 0.8]` (`z ∈ [0.5, 10.5]`; max error 1.1e-8 after rounding).
pub const ERFC_Q_CENTER: f64 = 0.48;
/// The coefficients of `Q` (see [`ERFC_Q_CENTER`]).
pub const ERFC_Q: [f64; 10] = [
    0.497_270_524_501_800_54,
    0.664_983_272_552_490_2,
    0.549_792_885_780_334_5,
    0.159_105_673_432_350_16,
    -0.161_085_739_731_788_64,
    -0.115_054_689_347_743_99,
    0.088_909_037_411_212_92,
    0.067_203_886_806_964_87,
    -0.063_872_873_783_111_57,
    -0.027_606_032_788_753_51,
];

/// `S(t) = Q(t) + t·Q'(t)`, the slope of `t·Q(t)`, as a cubic in `t - 0.48` (least squares at
/// Chebyshev nodes of the same interval; relative error 5.4e-3). The erfc tail multiplies it
/// by the rounding error of `t` (below 2^-23 of `t`), so this error stays below 2^-30 of the
/// result, where the degree-8 derivative of `Q` cost six more multiply-adds per element.
pub const ERFC_SLOPE: [f64; 4] = [
    0.817_354_953_735_842_7,
    1.858_766_535_357_416_3,
    1.789_453_346_528_62,
    0.280_684_612_967_383_8,
];
