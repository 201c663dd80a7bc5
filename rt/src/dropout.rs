//! Dropout masks: which elements a training dropout keeps, drawn from a counter-based
//! generator so that eager tensors, compiled functions and ahead-of-time models draw the
//! same mask for the same seed, and [`step`], the dropout of an ahead-of-time model.

use crate::ElemType;
use half::{bf16, f16};

/// Whether element `i` of a dropout with `seed` is kept with probability `1 - p`: a
/// counter-based draw (SplitMix64 of the seed and the index), so the mask is the same on every
/// backend, in any order of evaluation, and needs no state.
pub fn keep(seed: u64, i: u64, p: f64) -> bool {
    let mut z = seed ^ i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    // the top 53 bits as a uniform number in [0, 1)
    let u = (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    u >= p
}

/// The seed of call `call` (0 for the first) of a compiled dropout written with `seed`:
/// the first call uses `seed` itself (the mask eager mode draws with it), later calls a
/// fresh seed mixed from both, so every call of a compiled training step drops other units.
pub fn seed_of_call(seed: u64, call: u64) -> u64 {
    if call == 0 {
        return seed;
    }
    let mut z = seed.wrapping_add(call.wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    z ^ (z >> 33)
}

/// The walk of a dropout step: `y[i] = x[i] · scale` where element `i` (in the row-major
/// order of `shape`) is kept, else 0.
pub struct Walk<'a> {
    /// The elements' type (a float type).
    pub elem: ElemType,
    /// The sizes.
    pub shape: &'a [usize],
    /// The operand's strides, in elements.
    pub src: &'a [isize],
    /// The result's strides, in elements.
    pub dst: &'a [isize],
}

/// Runs a dropout of probability `p` with `seed` over `w`: each element computed in f64
/// and rounded once to its type, as the eager kernel does. Returns false for an element
/// type that is not a float.
///
/// # Safety
/// Every element the walk reaches is inside the memory behind `src` (readable) and `dst`
/// (writable); the two do not overlap; the ranks agree and are at most
/// [`crate::copy::MAX_RANK`].
pub unsafe fn step(w: &Walk, p: f64, seed: u64, dst: *mut u8, src: *const u8) -> bool {
    let scale = if p >= 1.0 { 0.0 } else { 1.0 / (1.0 - p) };
    let rank = w.shape.len();
    let n: usize = w.shape.iter().product();
    let mut at = [0usize; crate::copy::MAX_RANK];
    macro_rules! walk {
        ($t:ty, $to:expr, $from:expr) => {{
            let (x, y) = (src as *const $t, dst as *mut $t);
            for i in 0..n {
                let (mut so, mut d) = (0isize, 0isize);
                for k in 0..rank {
                    so += at[k] as isize * w.src[k];
                    d += at[k] as isize * w.dst[k];
                }
                // SAFETY: element `at` of the walk lies inside both (this fn's contract).
                unsafe {
                    let v = $to(x.offset(so).read_unaligned());
                    let r = if keep(seed, i as u64, p) {
                        v * scale
                    } else {
                        0.0
                    };
                    y.offset(d).write_unaligned($from(r));
                }
                for k in (0..rank).rev() {
                    at[k] += 1;
                    if at[k] < w.shape[k] {
                        break;
                    }
                    at[k] = 0;
                }
            }
        }};
    }
    match w.elem {
        ElemType::F16 => walk!(f16, f16::to_f64, crate::scalar::f16_from_f64),
        ElemType::BF16 => walk!(bf16, bf16::to_f64, crate::scalar::bf16_from_f64),
        ElemType::F32 => walk!(f32, f64::from, |v: f64| v as f32),
        ElemType::F64 => walk!(f64, |v: f64| v, |v: f64| v),
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_drops_what_keep_says_in_row_major_order() {
        // a transposed 3x4 operand into a contiguous result
        let x: Vec<f32> = (0..12).map(|v| v as f32 + 1.0).collect();
        let mut y = vec![f32::NAN; 12];
        let w = Walk {
            elem: ElemType::F32,
            shape: &[4, 3],
            src: &[1, 4],
            dst: &[3, 1],
        };
        let (p, seed) = (0.4, 11);
        // SAFETY: the walk stays inside both vectors.
        assert!(unsafe { step(&w, p, seed, y.as_mut_ptr().cast(), x.as_ptr().cast()) });
        for (i, got) in y.iter().enumerate() {
            let (r, c) = (i / 3, i % 3);
            let v = f64::from(x[c * 4 + r]);
            let want = if keep(seed, i as u64, p) {
                (v / 0.6) as f32
            } else {
                0.0
            };
            assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
        }
        assert!(y.contains(&0.0) && y.iter().any(|&v| v != 0.0));
    }
}
