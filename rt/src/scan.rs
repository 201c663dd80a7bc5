//! Running sums along one dim (`cumsum`), as the eager kernels compute them: floats summed
//! in f64 and rounded to their dtype at every element, integers and bool summed wrapping in
//! i64 (the result is i64, as PyTorch's).

use crate::ElemType;
use crate::threads::{SendPtr, run_chunks};
use half::{bf16, f16};

/// Element `at` of `p` as f64 (floats) or i64 bits (the rest), as the kind reads it.
///
/// # Safety
/// `p + at` holds an element of `k`'s type.
unsafe fn load(k: ElemType, p: *const u8, at: isize) -> (f64, i64) {
    // SAFETY: the caller's contract; unaligned, as views may start anywhere.
    unsafe {
        match k {
            ElemType::F16 => ((p as *const f16).offset(at).read_unaligned().to_f64(), 0),
            ElemType::BF16 => ((p as *const bf16).offset(at).read_unaligned().to_f64(), 0),
            ElemType::F32 => (f64::from((p as *const f32).offset(at).read_unaligned()), 0),
            ElemType::F64 => ((p as *const f64).offset(at).read_unaligned(), 0),
            ElemType::U8 => (0.0, i64::from(p.offset(at).read())),
            ElemType::I8 => (0.0, i64::from((p as *const i8).offset(at).read())),
            ElemType::I16 => (
                0.0,
                i64::from((p as *const i16).offset(at).read_unaligned()),
            ),
            ElemType::I32 => (
                0.0,
                i64::from((p as *const i32).offset(at).read_unaligned()),
            ),
            ElemType::I64 => (0.0, (p as *const i64).offset(at).read_unaligned()),
            ElemType::Bool => (0.0, i64::from(p.offset(at).read() != 0)),
        }
    }
}

/// Writes a running sum as `k`'s result type.
///
/// # Safety
/// `p + at` holds an element of the result type.
unsafe fn store(k: ElemType, p: *mut u8, at: isize, (f, i): (f64, i64)) {
    // SAFETY: the caller's contract.
    unsafe {
        match k {
            ElemType::F16 => (p as *mut f16)
                .offset(at)
                .write_unaligned(crate::scalar::f16_from_f64(f)),
            ElemType::BF16 => (p as *mut bf16)
                .offset(at)
                .write_unaligned(crate::scalar::bf16_from_f64(f)),
            ElemType::F32 => (p as *mut f32).offset(at).write_unaligned(f as f32),
            ElemType::F64 => (p as *mut f64).offset(at).write_unaligned(f),
            _ => (p as *mut i64).offset(at).write_unaligned(i),
        }
    }
}

/// Rows at most this many elements in all run on the calling thread.
const PAR_ELEMS: usize = 1 << 16;

/// `y = cumsum(x, dim)` over `shape`, `x` read and `y` written with the given element
/// strides (a rank-0 walk is one element).
///
/// # Safety
/// Every element the walk reaches is inside `x` (readable, of `k`'s type) and `y` (writable,
/// of its result type), `y`'s elements are distinct and overlap none of `x`'s, `dim` is a
/// dim of `shape` (or 0 for rank 0), and the stride slices have `shape`'s length.
pub unsafe fn cumsum(
    k: ElemType,
    (shape, dim): (&[usize], usize),
    (y, ys): (*mut u8, &[isize]),
    (x, xs): (*const u8, &[isize]),
) {
    if shape.is_empty() {
        // SAFETY: one element on each side (contract).
        unsafe { store(k, y, 0, load(k, x, 0)) };
        return;
    }
    let len = shape[dim];
    let rows: usize = shape
        .iter()
        .enumerate()
        .filter(|&(d, _)| d != dim)
        .map(|(_, &n)| n)
        .product();
    if len == 0 || rows == 0 {
        return;
    }
    let (yp, xp) = (SendPtr(y), SendPtr(x as *mut u8));
    let run = |lo: usize, hi: usize| {
        for r in lo..hi {
            // the row's first element: `r` spelled out over the other dims, last fastest
            let (mut rest, mut oy, mut ox) = (r, 0isize, 0isize);
            for d in (0..shape.len()).rev().filter(|&d| d != dim) {
                let i = (rest % shape[d]) as isize;
                rest /= shape[d];
                oy += i * ys[d];
                ox += i * xs[d];
            }
            let (mut f, mut n) = (0.0f64, 0i64);
            for j in 0..len as isize {
                // SAFETY: element j of row r is inside both walks (contract).
                unsafe {
                    let (a, b) = load(k, xp.get(), ox + j * xs[dim]);
                    f += a;
                    n = n.wrapping_add(b);
                    store(k, yp.get(), oy + j * ys[dim], (f, n));
                }
            }
        }
    };
    let chunks = if rows * len < PAR_ELEMS {
        1
    } else {
        crate::threads::available() * 4
    };
    run_chunks(rows, chunks, &|_, lo, hi| run(lo, hi));
}
