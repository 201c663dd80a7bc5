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

/// Taylor coefficients of `e^r` to `r^7`.
pub const EXP_TAYLOR7: [f64; 8] = [
    1.0,
    1.0,
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
];
