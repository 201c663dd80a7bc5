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

/// Both GELUs are `x - m` above 0 and `m` below, `m = x·F(a)·e^{-g(a)}` with `a = |x|`: the
/// exact one with `g = a²/2`, `F = H(a) = erfc(a/√2)·e^{a²/2}/2`, the tanh one with
/// `g = v(a) = 2·√(2/π)·(a + 0.044715·a³)`, `F = E(a) = 1/(1 + e^{-v})`. `F` is one of eight
/// polynomials picked per lane. The exact GELU clamps `x` into `±GELU_ERF_END`: beyond it
/// `m` is subnormal, so flushed, or far below half an ulp of `x`.
pub const GELU_ERF_END: f32 = 13.5;
/// As [`GELU_ERF_END`] for the tanh GELU (where `e^{-v}` keeps its scale `2^k` with
/// `k ≥ -252`, which `scale2n` needs).
pub const GELU_TANH_END: f32 = 10.5;
/// `(a + 4).to_bits() >> 21` at `a = 0`: the exponent and two leading mantissa bits of `a + 4`
/// number the intervals of the tails from this value, `a ∈ [0,1), [1,2), [2,3), [3,4),
/// [4,6), [6,8), [8,10)` and `[10, ∞)` (every index from 7 up).
pub const GELU_TAIL_FIRST: i32 = 516;
/// The centers of the intervals of [`GELU_ERF_TAIL`] and [`GELU_TANH_TAIL`].
pub const GELU_TAIL_CENTER: [f32; 8] = [0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 9.0, 11.75];
/// `H(a)` as one polynomial of degree 7 in `a - GELU_TAIL_CENTER[i]` per interval `i`: row `j`
/// holds the coefficients of `u^j` of the eight intervals (the lookup table of one
/// multiply-add). Fitted by `scripts/fit_gelu_tail.py`; evaluated in f32 by Horner's rule
/// the error is at most 1.92·2^-24 of `H` (interval 0, the largest).
pub const GELU_ERF_TAIL: [[f32; 8]; 8] = [
    [
        0.34961882,
        0.20578067,
        0.14133133,
        0.106345154,
        0.0769193,
        0.05589348,
        0.04379879,
        0.033711772,
    ],
    [
        -0.2241329,
        -0.09027128,
        -0.045613952,
        -0.026734242,
        -0.014345756,
        -0.0076879035,
        -0.004753181,
        -0.0028289545,
    ],
    [
        0.118777476,
        0.035186984,
        0.013648239,
        0.006387654,
        0.0025952777,
        0.0010390808,
        0.00051008206,
        0.00023577885,
    ],
    [
        -0.054914277,
        -0.012496968,
        -0.0038311281,
        -0.0014591534,
        -0.0004564793,
        -0.00013811539,
        -5.414783e-05,
        -1.951973e-05,
    ],
    [
        0.022803972,
        0.0041081808,
        0.0010173398,
        0.00032011152,
        7.814731e-05,
        1.806216e-05,
        5.687071e-06,
        1.6045884e-06,
    ],
    [
        -0.008700653,
        -0.0012661399,
        -0.00025739978,
        -6.771861e-05,
        -1.307181e-05,
        -2.3273158e-06,
        -5.91338e-07,
        -1.3114133e-07,
    ],
    [
        0.003244367,
        0.00038226333,
        6.399842e-05,
        1.4122651e-05,
        2.2478744e-06,
        3.0488403e-07,
        6.2155934e-08,
        1.1087074e-08,
    ],
    [
        -0.0010526496,
        -0.00010452807,
        -1.4800448e-05,
        -2.790218e-06,
        -3.565818e-07,
        -3.8016644e-08,
        -6.3228955e-09,
        -8.9130703e-10,
    ],
];
/// `E(a) = 1/(1 + e^{-v(a)})`, `v(a) = 2·√(2/π)·(a + 0.044715·a³)`, laid out as
/// [`GELU_ERF_TAIL`] (at most 1.54·2^-24 of `E`; from `a = 6` on it is 1 in f32).
pub const GELU_TANH_TAIL: [[f32; 8]; 8] = [
    [
        0.691428, 0.9330477, 0.9939663, 0.9998239, 0.99999994, 1.0, 1.0, 1.0,
    ],
    [
        0.3518838,
        0.12977538,
        0.017594112,
        0.0007424866,
        2.990796e-07,
        -5.5853233e-13,
        9.618045e-16,
        -1.0402145e-14,
    ],
    [
        -0.08825921,
        -0.09669042,
        -0.022286637,
        -0.0014334363,
        -1.3770821e-06,
        -3.074849e-12,
        -2.7468501e-15,
        -2.5473505e-16,
    ],
    [
        -0.04388575,
        0.02672412,
        0.01545492,
        0.0016558201,
        2.4561566e-06,
        6.2466313e-12,
        -3.067842e-15,
        1.0017315e-14,
    ],
    [
        0.020482436,
        0.005753873,
        -0.005746152,
        -0.0012474563,
        -1.7383743e-06,
        1.3043163e-11,
        5.8617966e-15,
        -6.19496e-16,
    ],
    [
        0.0045592524,
        -0.0057167793,
        0.0005469568,
        0.00061373354,
        2.9239397e-06,
        -1.7272345e-11,
        3.5978262e-15,
        -3.1711736e-15,
    ],
    [
        -0.0030318417,
        0.0006839675,
        0.0004922801,
        -0.00016839373,
        -5.619712e-06,
        -1.6974424e-11,
        -3.303941e-15,
        1.522353e-16,
    ],
    [
        -0.00034132233,
        0.00049575686,
        -0.00021358844,
        6.5649606e-06,
        3.1007257e-06,
        1.8589802e-11,
        -1.4040268e-15,
        3.291877e-16,
    ],
];

/// `1/√(2π)`, the standard normal density at 0 (the GELUs' slopes).
pub const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// The sigmoid's `k` (of `e^{-|x|} = p·2^k`) below which its result `q·2^k` (`q < √2`) rounds
/// to 0: computed as ±0 there, without a subnormal product.
pub const SIGMOID_GONE: i32 = -150;
