//! f32 products on register tiles, for operands a GEMM library would first have to copy:
//! `C[m, n] = start + Σ_s A_s · B_s`, where each span `s` is a run of the inner index with
//! its own place in `A` and `B`.
//!
//! A convolution in channels_last is such a product without a column buffer: a row of
//! output pixels times the weights is, per kernel tap, a span of `C_in` channels read
//! straight from the (padded) image. So are its input gradient (a convolution of the
//! padded output gradient with the flipped weights) and its weight gradient (per tap, one
//! span per row of output pixels). At the channel counts of small networks (16, 32) the
//! `gemm` crate's tiles get one vector of output channels and the copies cost as much as
//! the product; these tiles hold up to 12 rows by two vectors of columns in registers.
//!
//! `B`'s columns and `C`'s columns are contiguous; `n` must be a multiple of 8
//! ([`supports`]). Every element of `C` is one f32 sum in span order, one fused
//! multiply-add per term, on every ISA.

use crate::lanes::Lanes;
use crate::vmath::{Level, level};

/// A run of `len` steps of the inner index: its first element in `A` and `B`, as element
/// offsets from [`Operands::a`] and [`Operands::b`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Offset of the span's first element of row 0 of `A`.
    pub a: isize,
    /// Offset of the span's first row of `B`.
    pub b: isize,
    /// Steps of the inner index.
    pub len: usize,
}

/// The two operands of a product and how to walk them.
#[derive(Clone, Copy, Debug)]
pub struct Operands<'a> {
    /// `A`'s origin.
    pub a: *const f32,
    /// `B`'s origin.
    pub b: *const f32,
    /// The inner index, run by run.
    pub spans: &'a [Span],
    /// `A`'s stride from one row of `C` to the next, in elements.
    pub a_rows: isize,
    /// `A`'s stride along the inner index.
    pub a_step: isize,
    /// `B`'s stride along the inner index (its columns are contiguous).
    pub b_step: isize,
}

/// What the sums start from.
#[derive(Clone, Copy, Debug)]
pub enum Start<'a> {
    /// Zero.
    Zero,
    /// The values in `C` (the product is added to them).
    Dst,
    /// The same row of `n` values in every row (a bias).
    Row(&'a [f32]),
}

/// Whether products with `n` columns run here: `n` a multiple of 8, on a CPU with AVX2 and
/// FMA at least (and `SMELT_CPU` not capping below them).
pub fn supports(n: usize) -> bool {
    fits(n) && available()
}

/// Whether products with `n` columns fit the tiles: `n` a multiple of 8.
pub fn fits(n: usize) -> bool {
    n > 0 && n.is_multiple_of(8)
}

/// Whether this CPU runs the tiles: AVX2 and FMA at least, and `SMELT_CPU` not capping below
/// them.
pub fn available() -> bool {
    level() != Level::Unavailable
}

/// `C[m, n] = start + Σ_s A_s · B_s`, `C` at `c` with `c_rows` elements from row to row.
///
/// # Safety
/// [`supports`]`(n)`; for every span, the `m` rows of `A` and the `n` columns of `B` it
/// reaches are readable; the `m × n` block of `C` is writable (and readable with
/// [`Start::Dst`]), and overlaps neither operand; a [`Start::Row`] holds `n` values.
pub unsafe fn product(op: &Operands, m: usize, n: usize, c: *mut f32, c_rows: isize, start: Start) {
    debug_assert!(supports(n));
    let out = Out {
        m,
        n,
        c,
        c_rows,
        start,
    };
    // SAFETY: `level` is what this CPU has; the caller's contract
    unsafe { product_at(level(), op, out) }
}

/// The block of `C` a product writes, as [`product`] takes it.
#[derive(Clone, Copy)]
struct Out<'a> {
    m: usize,
    n: usize,
    c: *mut f32,
    c_rows: isize,
    start: Start<'a>,
}

/// [`product`] with the tiles of `isa` (tests run every ISA the CPU has).
///
/// # Safety
/// As [`product`], and the CPU has `isa`.
unsafe fn product_at(isa: Level, op: &Operands, out: Out) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512 F/VL/DQ, AVX2 and FMA; the caller's contract
        Level::Avx512 => unsafe { product_avx512(op, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX2 and FMA; the caller's contract
        Level::Avx2 => unsafe { product_avx2(op, out) },
        // no tiles here (`supports` is false)
        _ => {}
    }
}

/// [`product`] on AVX-512 tiles (AVX2 ones where `n` is not a multiple of 16).
///
/// # Safety
/// As [`product`], and the CPU has AVX-512 F/VL/DQ, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
unsafe fn product_avx512(op: &Operands, out: Out) {
    use crate::lanes::{X8, X16};
    // 32 registers: 12 rows of two vectors; rows of one vector stop at 8, where the
    // broadcasts of A (one load per multiply-add) and its row addresses set the pace
    if out.n.is_multiple_of(16) {
        // SAFETY: X16's AVX-512 F is enabled here and on the CPU (this fn's contract); `op`
        // and `out` meet `product`'s contract, which is `walks`'s.
        unsafe { walks::<X16, 8, 12>(op, out) }
    } else {
        // SAFETY: as above, with X8's AVX2 + FMA, also enabled here and on the CPU.
        unsafe { walks::<X8, 8, 12>(op, out) }
    }
}

/// [`product`] on AVX2 tiles.
///
/// # Safety
/// As [`product`], and the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn product_avx2(op: &Operands, out: Out) {
    // 16 registers: 8 rows of one vector, or 6 rows of two, and the operands
    // SAFETY: X8's AVX2 + FMA are enabled here and on the CPU (this fn's contract); `op` and
    // `out` meet `product`'s contract, which is `walks`'s.
    unsafe { walks::<crate::lanes::X8, 8, 6>(op, out) }
}

/// [`columns`] for the walk over `A` its strides allow.
///
/// # Safety
/// The caller is compiled with `L`'s features and the CPU has them; `op` and `out` meet
/// [`product`]'s contract (`out.n` a multiple of `L::N`).
#[inline(always)]
unsafe fn walks<L: Lanes, const R1: usize, const R2: usize>(op: &Operands, out: Out) {
    if op.a_rows == 1 {
        // SAFETY: this fn's contract is `columns`'s; the walk only picks how A's addresses
        // are formed, not which elements are read.
        unsafe { columns::<L, R1, R2, ROWS_UNIT>(op, out) }
    } else if op.a_step == 1 {
        // SAFETY: as above.
        unsafe { columns::<L, R1, R2, STEP_UNIT>(op, out) }
    } else {
        // SAFETY: as above.
        unsafe { columns::<L, R1, R2, GENERAL>(op, out) }
    }
}

/// Blocks of two vectors of columns, then of one, each over all rows: `R1` (`R2`) rows per
/// tile of one (two) vectors.
///
/// # Safety
/// As [`walks`].
#[inline(always)]
unsafe fn columns<L: Lanes, const R1: usize, const R2: usize, const W: u8>(
    op: &Operands,
    out: Out,
) {
    let mut j = 0;
    while j + 2 * L::N <= out.n {
        // SAFETY: `j + 2·L::N <= n`: the columns are inside the block; the rest is this fn's
        // contract, passed on.
        unsafe { rows::<L, 2, R2, W>(op, out, j) };
        j += 2 * L::N;
    }
    while j + L::N <= out.n {
        // SAFETY: as above, `j + L::N <= n`.
        unsafe { rows::<L, 1, R1, W>(op, out, j) };
        j += L::N;
    }
}

/// The `m` rows of columns `j..j + V·L::N`: tiles of `R` rows, the rest in tiles of 8, 4, 2
/// and 1 (fewer instances of the tile than one per remainder).
///
/// # Safety
/// As [`walks`], and `j + V·L::N <= out.n`.
#[inline(always)]
unsafe fn rows<L: Lanes, const V: usize, const R: usize, const W: u8>(
    op: &Operands,
    out: Out,
    j: usize,
) {
    let mut i = 0;
    let m = out.m;
    while i + R <= m {
        // SAFETY: `i + R <= m`: the tile's rows are inside the block; its columns are by this
        // fn's contract, as are the features and operands.
        unsafe { tile::<L, R, V, W>(op, out, i, j) };
        i += R;
    }
    if R > 8 && i + 8 <= m {
        // SAFETY: as above, `i + 8 <= m`.
        unsafe { tile::<L, 8, V, W>(op, out, i, j) };
        i += 8;
    }
    if R > 4 && i + 4 <= m {
        // SAFETY: as above, `i + 4 <= m`.
        unsafe { tile::<L, 4, V, W>(op, out, i, j) };
        i += 4;
    }
    if R > 2 && i + 2 <= m {
        // SAFETY: as above, `i + 2 <= m`.
        unsafe { tile::<L, 2, V, W>(op, out, i, j) };
        i += 2;
    }
    if i < m {
        // SAFETY: as above, `i + 1 <= m`.
        unsafe { tile::<L, 1, V, W>(op, out, i, j) };
    }
}

/// One step of the inner index: `acc[r] += a(r) · b[..V·L::N]`.
///
/// # Safety
/// The caller is compiled with `L`'s features and the CPU has them; `b` points to `V·L::N`
/// readable f32s.
#[inline(always)]
pub(crate) unsafe fn fma_step<L: Lanes, const R: usize, const V: usize>(
    acc: &mut [[L; V]; R],
    a: impl Fn(usize) -> f32,
    b: *const f32,
) {
    // SAFETY: vector `v` reads `b[v·N..(v + 1)·N]`, inside the `V·L::N` readable f32s at `b`
    // (this fn's contract), with `L`'s features there by the same contract
    let bv: [L; V] = std::array::from_fn(|v| unsafe { L::load(b.add(v * L::N)) });
    for (r, row) in acc.iter_mut().enumerate() {
        let x = L::splat(a(r));
        for (y, &w) in row.iter_mut().zip(&bv) {
            *y = x.fma(w, *y);
        }
    }
}

/// `A`'s rows are adjacent (`a_rows == 1`).
const ROWS_UNIT: u8 = 0;
/// `A`'s inner index is adjacent (`a_step == 1`).
const STEP_UNIT: u8 = 1;
/// Any strides.
const GENERAL: u8 = 2;

/// Rows `i..i + R`, columns `j..j + V·L::N` of `C`, summed in registers.
///
/// # Safety
/// As [`rows`], and `i + R <= out.m`.
#[inline(always)]
unsafe fn tile<L: Lanes, const R: usize, const V: usize, const W: u8>(
    op: &Operands,
    out: Out,
    i: usize,
    j: usize,
) {
    // SAFETY: by this fn's contract (`product`'s, narrowed to this tile) rows i..i + R and
    // columns j..j + V·N are inside C's block, which every load and store of C (and of a
    // bias row, which holds n values) stays in; every span reaches readable elements of A
    // (these rows) and B (these columns); `L`'s features are enabled and present.
    unsafe {
        let c_rows = out.c_rows;
        let c = out.c.offset(i as isize * c_rows).add(j);
        let mut acc = [[L::splat(0.0); V]; R];
        match out.start {
            Start::Zero => {}
            Start::Dst => {
                for (r, row) in acc.iter_mut().enumerate() {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x = L::load(c.offset(r as isize * c_rows).add(v * L::N));
                    }
                }
            }
            Start::Row(b) => {
                for row in acc.iter_mut() {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x = L::load(b.as_ptr().add(j + v * L::N));
                    }
                }
            }
        }
        let a0 = op.a.offset(i as isize * op.a_rows);
        // the walks differ only in how A's addresses are formed: few live pointers keep
        // the loop's registers out of memory
        for s in op.spans {
            let b = op.b.offset(s.b).add(j);
            let a = a0.offset(s.a);
            match W {
                ROWS_UNIT => {
                    for k in 0..s.len as isize {
                        let ak = a.offset(k * op.a_step);
                        fma_step::<L, R, V>(&mut acc, |r| *ak.add(r), b.offset(k * op.b_step));
                    }
                }
                STEP_UNIT => {
                    let rows: [*const f32; R] =
                        std::array::from_fn(|r| a.offset(r as isize * op.a_rows));
                    for k in 0..s.len {
                        fma_step::<L, R, V>(
                            &mut acc,
                            |r| *rows[r].add(k),
                            b.offset(k as isize * op.b_step),
                        );
                    }
                }
                _ => {
                    for k in 0..s.len as isize {
                        let ak = a.offset(k * op.a_step);
                        fma_step::<L, R, V>(
                            &mut acc,
                            |r| *ak.offset(r as isize * op.a_rows),
                            b.offset(k * op.b_step),
                        );
                    }
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, x) in row.iter().enumerate() {
                x.store(c.offset(r as isize * c_rows).add(v * L::N));
            }
        }
    }
}

/// `out[c · n + j] = scale · x[j · rs + c]` for `j < n`, `c < e`: `scale` times the
/// transpose of `n` rows of `e` elements (`rs` apart), so that an operand read by columns
/// (attention's keys in `q·kᵀ`) is read by rows, as [`product`] reads `B`. Blocks of 8 × 8
/// go through registers; done one element at a time, the copy of a [128, 32] key block
/// took a large share of attention's time on AVX2 (`perf`).
///
/// # Panics
/// If `x` or `out` is shorter than the shape says.
pub fn transpose_scaled(x: &[f32], (n, e, rs): (usize, usize, usize), scale: f32, out: &mut [f32]) {
    if n == 0 || e == 0 {
        return;
    }
    assert!(x.len() >= (n - 1) * rs + e && out.len() >= n * e);
    // whole 8 × 8 blocks in registers where the CPU has AVX2, the edges one by one
    let (n8, e8) = match level() {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 | Level::Avx2 => {
            // SAFETY: AVX2 is there; the assert bounds every block read and written
            unsafe { transpose_blocks_avx2(x, (n, e, rs), scale, out) };
            (n / 8 * 8, e / 8 * 8)
        }
        _ => (0, 0),
    };
    for j in 0..n {
        let cs = if j < n8 { e8..e } else { 0..e };
        for c in cs {
            out[c * n + j] = scale * x[j * rs + c];
        }
    }
}

/// The whole 8 × 8 blocks of [`transpose_scaled`].
///
/// # Safety
/// The CPU has AVX2; `x` and `out` hold what the shape addresses.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_blocks_avx2(
    x: &[f32],
    (n, e, rs): (usize, usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 by this fn's contract. With j + 8 <= n and c + 8 <= e, the last element
    // read, `(j + 7)·rs + c + 7`, is below `(n - 1)·rs + e`, and the last written,
    // `(c + 7)·n + j + 7`, is below `e·n`: inside `x` and `out` by the caller's contract (the
    // assert in `transpose_scaled`).
    unsafe {
        let s = _mm256_set1_ps(scale);
        for j in (0..n / 8 * 8).step_by(8) {
            for c in (0..e / 8 * 8).step_by(8) {
                let r: [__m256; 8] =
                    std::array::from_fn(|t| _mm256_loadu_ps(x.as_ptr().add((j + t) * rs + c)));
                let cols = transpose8(r);
                for (t, v) in cols.into_iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add((c + t) * n + j), _mm256_mul_ps(v, s));
                }
            }
        }
    }
}

/// The transpose of eight rows of eight lanes: lane `t` of result `c` is lane `c` of row `t`.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn transpose8(
    r: [std::arch::x86_64::__m256; 8],
) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    // pairs, then quads, then halves of the 8 × 8 block
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1) (xorshift).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
            })
            .collect()
    }

    fn isas() -> Vec<Level> {
        let mut v = vec![];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                v.push(Level::Avx2);
            }
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512dq")
            {
                v.push(Level::Avx512);
            }
        }
        v
    }

    /// Strided A (rows a_rows apart, steps a_step apart), spans of uneven lengths at
    /// scattered places, every start, against sums in f64; all row counts through 40 so
    /// every tail of every tile runs.
    #[test]
    fn spans_agree_with_f64_sums_on_every_isa() {
        let a = values(20_000, 3);
        let b = values(20_000, 5);
        let spans = [
            Span { a: 0, b: 0, len: 3 },
            Span {
                a: 40,
                b: 700,
                len: 1,
            },
            Span {
                a: 7,
                b: 300,
                len: 0,
            },
            Span {
                a: 90,
                b: 2000,
                len: 9,
            },
        ];
        for isa in isas() {
            for n in [8, 16, 24, 32, 40, 48, 64] {
                for m in (1..=40).step_by(3).chain([16, 12, 6]) {
                    for (a_rows, a_step) in [(3isize, 1isize), (1, 5)] {
                        let b_step = n as isize + 4;
                        let op = Operands {
                            a: a.as_ptr(),
                            b: b.as_ptr(),
                            spans: &spans,
                            a_rows,
                            a_step,
                            b_step,
                        };
                        let bias = values(n, 11);
                        let c_rows = n as isize + 3;
                        for start in [Start::Zero, Start::Dst, Start::Row(&bias)] {
                            let init = values(m * c_rows as usize, 13);
                            let mut c = init.clone();
                            // SAFETY: every index below is inside `a`, `b` and `c`
                            unsafe {
                                let c = c.as_mut_ptr();
                                let out = Out {
                                    m,
                                    n,
                                    c,
                                    c_rows,
                                    start,
                                };
                                product_at(isa, &op, out)
                            };
                            for r in 0..m {
                                for col in 0..n {
                                    let mut want = match start {
                                        Start::Zero => 0.0,
                                        Start::Dst => init[r * c_rows as usize + col] as f64,
                                        Start::Row(b) => b[col] as f64,
                                    };
                                    let mut mag = want.abs();
                                    for s in &spans {
                                        for k in 0..s.len as isize {
                                            let x = a
                                                [(s.a + r as isize * a_rows + k * a_step) as usize]
                                                as f64;
                                            let y = b[(s.b + k * b_step) as usize + col] as f64;
                                            want += x * y;
                                            mag += (x * y).abs();
                                        }
                                    }
                                    let got = c[r * c_rows as usize + col] as f64;
                                    assert!(
                                        (got - want).abs() <= 1e-6 * mag.max(1.0),
                                        "{isa:?} n {n} m {m} row {r} col {col}: {got} vs {want}"
                                    );
                                }
                                // the padding after each row is untouched
                                for col in n..c_rows as usize {
                                    let i = r * c_rows as usize + col;
                                    assert_eq!(c[i], init[i]);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn transposes_match_one_element_at_a_time() {
        for (n, e, pad) in [
            (1, 1, 0),
            (8, 8, 0),
            (128, 32, 352),
            (13, 21, 3),
            (16, 7, 1),
            (5, 24, 0),
        ] {
            let rs = e + pad;
            let x = values((n - 1) * rs + e, (n * 31 + e) as u64);
            let mut out = vec![f32::NAN; n * e];
            transpose_scaled(&x, (n, e, rs), 0.375, &mut out);
            for j in 0..n {
                for c in 0..e {
                    assert_eq!(out[c * n + j], 0.375 * x[j * rs + c], "{n}x{e} [{j},{c}]");
                }
            }
        }
    }
}
