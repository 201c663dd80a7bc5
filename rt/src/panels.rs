//! f32 matrix products on packed panels: the AVX2 path of [`crate::gemm`].
//!
//! On AVX2 the `gemm` crate's kernels ran the shapes models use (`[256,1024]·[1024,4096]`,
//! BERT's `[4096,384]·[384,1536]`) measurably slower than OpenBLAS and MKL on one core
//! (BENCHMARKS.md, "GEMMs"). This is the textbook blocking: for each block of `KC` steps of the inner
//! index, `B` is copied into panels of `NR` columns and `A` into panels of `MR` rows, both
//! laid out in the order the tile reads them and aligned to cache lines, and a tile of
//! `MR × NR` sums stays in registers over the block. Unaligned panels measured slower (a row of
//! `B`'s panel is one cache line only when aligned), and so did leaving out the requests
//! for the output's lines before each tile (the output is read back for every block after
//! the first).
//!
//! Every element of the result is the same f32 sum whatever the threads: blocks of the
//! inner index in order, each summed in registers, one fused multiply-add per term. The
//! threads split the output by rows or columns, never the inner index.

use crate::lanes::Lanes;
use crate::tiles::fma_step;
use crate::vmath::{Level, level};
use std::cell::RefCell;

/// Rows of a tile: six rows of two AVX2 vectors are 12 of the 16 registers.
const MR: usize = 6;
/// Vectors of columns in a tile.
const V: usize = 2;
/// Columns of a tile.
const NR: usize = V * 8;
/// Rows of `A` packed at a time (a multiple of `MR`; `MC × KC` f32s stay in L2).
const MC: usize = 192;
/// Columns of `B` packed at a time (`KC × NC` f32s: 2 MiB, the L2 of one core here).
const NC: usize = 1024;
/// The smallest side this path takes. Below it the copies cost more than they save: with
/// 64 columns or rows of `B` each element of `A`'s copy serves few tiles (slower than the
/// crate at [1024,1024]·[1024,64]), and at 128 the two were level within the noise.
const MIN_SIDE: usize = 256;

/// Steps of the inner index per block: `A`'s block (`MC × KC`) and `B`'s (`KC × NC`) stay
/// in L2 (2 MiB a core here), and the output is read back once per block after the first.
/// On one AVX2 core, 512 measured faster than 256 and 384 at the shapes above.
const KC: usize = 512;

/// Whether [`crate::gemm`] runs `m × k · k × n` in f32 here: where the CPU's widest vectors
/// (or a `SMELT_CPU` cap) are AVX2, for products with every side at least `MIN_SIDE` (256). A
/// function of the shape and the ISA only, so that every call of a shape sums alike.
pub fn applies(m: usize, n: usize, k: usize) -> bool {
    level() == Level::Avx2 && m.min(n).min(k) >= MIN_SIDE
}

/// Whether [`crate::gemm`] runs the f32 product `m × k · k × n` on the panels here, `b`'s
/// row and column strides being `b_strides`: where [`applies`] says so, and for a
/// column-major `b` where [`applies_column_major`] does. A function of the shape, `b`'s
/// layout and the ISA only, so that every call of a product sums alike.
pub fn takes(m: usize, n: usize, k: usize, b_strides: (isize, isize)) -> bool {
    let column_major = b_strides.0 == 1 && b_strides.1 != 1;
    applies(m, n, k) || column_major && applies_column_major(m)
}

/// Whether the panels run an f32 product of `m` rows whose `b` is column-major (a
/// weight `w[n, k]` used as `x·wᵀ`, as `linear` uses it) here: from two rows up on AVX2,
/// and from 2 to [`AVX512_COLUMN_MAJOR_ROWS`] rows on AVX-512. The `gemm` crate packs such a
/// `b` whole on every call, which a product of few rows cannot pay back: on one Zen 4 core,
/// `[m,768]·[768,768]` with m from 2 to 32 ran at 4.7–47 GFLOP/s on its AVX-512 kernels and
/// 11–68 on its AVX2 ones, against 18–89 on the panels (`cargo bench -p smelt-rt --bench
/// panels`). At 4096 rows the crate's AVX-512 kernels were 7–16% ahead on two threads. A
/// single row (a matrix-vector product) stays on the crate. A function of the shape, the
/// layout and the ISA only.
pub fn applies_column_major(m: usize) -> bool {
    match level() {
        Level::Avx2 => m >= 2,
        Level::Avx512 => (2..=AVX512_COLUMN_MAJOR_ROWS).contains(&m),
        Level::Unavailable => false,
    }
}

/// The most rows of a product with a column-major `b` that the panels take on AVX-512: a
/// BERT-sized layer of 1024 rows (batch 32 at 32 tokens) ran 13% faster on them, 4096 rows
/// slower (see [`applies_column_major`]).
pub const AVX512_COLUMN_MAJOR_ROWS: usize = 1024;

/// A matrix operand: its first element and its row and column strides in elements.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    /// Element `[0, 0]`.
    pub ptr: *const f32,
    /// Elements from one row to the next.
    pub rs: isize,
    /// Elements from one column to the next.
    pub cs: isize,
}

impl Mat {
    /// Element `[i, j]`.
    ///
    /// # Safety
    /// The element is inside the operand.
    #[inline(always)]
    unsafe fn at(&self, i: usize, j: usize) -> *const f32 {
        // SAFETY: the caller's contract
        unsafe { self.ptr.offset(i as isize * self.rs + j as isize * self.cs) }
    }
}

/// The output: `c[i, j]` at `c + i·ldc + j`, and what the product does to it.
#[derive(Clone, Copy)]
struct Out {
    c: *mut f32,
    ldc: usize,
    /// `None`: `c = a·b`; `Some(β)`: `c = c + β·(a·b)`.
    update: Option<f32>,
}

// SAFETY: the parts of one product write disjoint blocks of `c` and only read the operands;
// the caller of `product` lends all three for the call.
unsafe impl Send for Out {}
// SAFETY: as for `Send`.
unsafe impl Sync for Out {}
// SAFETY: operands are only read during the call that lends them.
unsafe impl Send for Mat {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mat {}

/// `c = a·b`, or `c = c + β·(a·b)` with `update = Some(β)`, for `a` of `m × k`, `b` of
/// `k × n` and `c` row-major with `ldc` elements from row to row, on up to `threads`
/// threads of the current rayon pool.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` and `b` reach readable f32s over their shapes; `c`'s
/// `m × n` block is writable (and readable with `update`), overlaps neither operand, and is
/// unused by others during the call.
pub unsafe fn product(
    (m, n, k): (usize, usize, usize),
    a: Mat,
    b: Mat,
    (c, ldc): (*mut f32, usize),
    update: Option<f32>,
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // an empty sum: zeros, or the output unchanged
        if update.is_none() {
            for i in 0..m {
                // SAFETY: row i of the caller's block
                unsafe { std::ptr::write_bytes(c.add(i * ldc), 0, n) };
            }
        }
        return;
    }
    let out = Out { c, ldc, update };
    // split the longer side of the output, in whole tiles
    let parts = threads.clamp(1, 64);
    let by_cols = n >= m;
    let (len, unit) = if by_cols { (n, NR) } else { (m, MR) };
    let step = len.div_ceil(parts).next_multiple_of(unit);
    let part = |t: usize| {
        let (lo, hi) = (t * step, ((t + 1) * step).min(len));
        if lo >= hi {
            return;
        }
        // SAFETY: part `t` reads its rows (columns) of `a` (`b`) and writes its own block
        unsafe {
            if by_cols {
                let b = Mat {
                    ptr: b.at(0, lo),
                    ..b
                };
                serial((m, hi - lo, k), a, b, out.at(0, lo));
            } else {
                let a = Mat {
                    ptr: a.at(lo, 0),
                    ..a
                };
                serial((hi - lo, n, k), a, b, out.at(lo, 0));
            }
        }
    };
    if parts > 1 && step < len {
        use rayon::prelude::*;
        (0..len.div_ceil(step)).into_par_iter().for_each(part);
    } else {
        part(0);
    }
}

impl Out {
    /// The same output from element `[i, j]` on.
    fn at(self, i: usize, j: usize) -> Out {
        Out {
            c: self.c.wrapping_add(i * self.ldc + j),
            ..self
        }
    }
}

thread_local! {
    /// The packed panels of `A` and `B`, kept between calls (fresh pages per call cost more
    /// than the copy at these sizes).
    static PACKED: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `len` f32s of `buf` from its first 64-byte boundary on (grown as needed).
fn aligned(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len + 16, 0.0);
    let skip = buf.as_ptr().align_offset(64).min(16);
    &mut buf[skip..skip + len]
}

/// The whole product on this thread.
///
/// # Safety
/// As [`product`], for this block.
unsafe fn serial((m, n, k): (usize, usize, usize), a: Mat, b: Mat, out: Out) {
    let kc = KC;
    let isa = level();
    PACKED.with(|bufs| {
        let (abuf, bbuf) = &mut *bufs.borrow_mut();
        let ap = aligned(abuf, MC * kc);
        let bp = aligned(bbuf, kc * NC);
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(kc) {
                let kb = kc.min(k - pc);
                // SAFETY: rows pc..pc+kb, columns jc..jc+nc of `b`
                unsafe { pack_b(b, (pc, kb), (jc, nc), bp) };
                // the first block writes the output (or updates it); the others add to it
                let update = match (pc, out.update) {
                    (0, u) => u,
                    (_, u) => Some(u.unwrap_or(1.0)),
                };
                for ic in (0..m).step_by(MC) {
                    let mb = MC.min(m - ic);
                    // SAFETY: rows ic..ic+mb, columns pc..pc+kb of `a`
                    unsafe { pack_a(a, (ic, mb), (pc, kb), ap) };
                    for jr in (0..nc).step_by(NR) {
                        for ir in (0..mb).step_by(MR) {
                            let tile = Tile {
                                a: ap[ir * kb..].as_ptr(),
                                b: bp[jr * kb..].as_ptr(),
                                k: kb,
                                rows: MR.min(mb - ir),
                                cols: NR.min(nc - jr),
                            };
                            // SAFETY: the tile's rows and columns are inside the block
                            unsafe { tile_at(isa, &tile, out.at(ic + ir, jc + jr), update) };
                        }
                    }
                }
            }
        }
    });
}

/// Packs rows `k0..k0 + kb` and columns `j0..j0 + nc` of `b` into panels of `NR` columns,
/// `[panel][step][NR]`, zeros past column `nc`.
///
/// # Safety
/// Those elements of `b` are readable; `out` holds `kb · nc` rounded up to whole panels.
unsafe fn pack_b(b: Mat, (k0, kb): (usize, usize), (j0, nc): (usize, usize), out: &mut [f32]) {
    for (p, panel) in out
        .chunks_exact_mut(kb * NR)
        .take(nc.div_ceil(NR))
        .enumerate()
    {
        let (j, w) = (j0 + p * NR, NR.min(nc - p * NR));
        // whole panels in vectors: rows copied, or columns (a transposed weight, `rs` 1)
        // transposed eight steps at a time
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if w == NR && level() != Level::Unavailable && (b.cs == 1 || b.rs == 1) {
            // SAFETY: AVX2 is there; rows k0..k0 + kb, columns j..j + NR of `b`
            done = unsafe { pack_b_avx2(b, (k0, kb), j, panel) };
        }
        for (s, row) in panel.chunks_exact_mut(NR).enumerate().skip(done) {
            // SAFETY: row k0 + s, columns j..j + w of `b`
            unsafe {
                let src = b.at(k0 + s, j);
                for (q, x) in row[..w].iter_mut().enumerate() {
                    *x = *src.offset(q as isize * b.cs);
                }
            }
            row[w..].fill(0.0);
        }
    }
}

/// The steps of one whole panel of [`pack_b`] that vectors cover (all of them for rows of
/// `b`, whole groups of eight for columns); returns how many.
///
/// # Safety
/// The CPU has AVX2; rows `k0..k0 + kb`, columns `j..j + NR` of `b` are readable; `b.cs`
/// or `b.rs` is 1; `panel` holds `kb · NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_b_avx2(b: Mat, (k0, kb): (usize, usize), j: usize, panel: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let dst = panel.as_mut_ptr();
    // SAFETY: AVX2 by this fn's contract. With `cs` 1, step s reads columns j..j + NR of row
    // k0 + s; with `rs` 1, each group of eight steps s..s + 8 <= kb reads rows k0 + s.. of
    // columns j..j + NR: all inside the readable block of the contract. Every store lands in
    // `panel[(s + t)·NR + v·8..][..8]`, below `kb·NR`, which `panel` holds.
    unsafe {
        if b.cs == 1 {
            for s in 0..kb {
                let src = b.at(k0 + s, j);
                for v in 0..V {
                    _mm256_storeu_ps(dst.add(s * NR + v * 8), _mm256_loadu_ps(src.add(v * 8)));
                }
            }
            return kb;
        }
        let cols: [*const f32; NR] = std::array::from_fn(|q| b.at(k0, j + q));
        let mut s = 0;
        while s + 8 <= kb {
            for v in 0..V {
                let r = std::array::from_fn(|t| _mm256_loadu_ps(cols[v * 8 + t].add(s)));
                for (t, x) in crate::tiles::transpose8(r).into_iter().enumerate() {
                    _mm256_storeu_ps(dst.add((s + t) * NR + v * 8), x);
                }
            }
            s += 8;
        }
        s
    }
}

/// Packs rows `i0..i0 + mb` and columns `k0..k0 + kb` of `a` into panels of `MR` rows,
/// `[panel][step][MR]`, zeros past row `mb`.
///
/// # Safety
/// Those elements of `a` are readable; `out` holds `mb` rounded up to whole panels times `kb`.
unsafe fn pack_a(a: Mat, (i0, mb): (usize, usize), (k0, kb): (usize, usize), out: &mut [f32]) {
    for (p, panel) in out
        .chunks_exact_mut(kb * MR)
        .take(mb.div_ceil(MR))
        .enumerate()
    {
        let (i, h) = (i0 + p * MR, MR.min(mb - p * MR));
        // whole panels of rows of `a` in vectors, eight steps at a time
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if h == MR && a.cs == 1 && level() != Level::Unavailable {
            // SAFETY: AVX2 is there; rows i..i + MR, columns k0..k0 + kb of `a`
            done = unsafe { pack_a_avx2(a, (i, k0, kb), panel) };
        }
        for r in 0..MR {
            let steps = panel[r..].iter_mut().step_by(MR).enumerate().skip(done);
            if r >= h {
                steps.for_each(|(_, x)| *x = 0.0);
                continue;
            }
            // SAFETY: row i + r, columns k0..k0 + kb of `a`
            let src = unsafe { a.at(i + r, k0) };
            for (s, x) in steps {
                // SAFETY: as above
                *x = unsafe { *src.offset(s as isize * a.cs) };
            }
        }
    }
}

/// The whole groups of eight steps of one full panel of [`pack_a`]; returns how many
/// steps.
///
/// # Safety
/// The CPU has AVX2; rows `i..i + MR`, columns `k0..k0 + kb` of `a` are readable; `a.cs`
/// is 1; `panel` holds `kb · MR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_a_avx2(a: Mat, (i, k0, kb): (usize, usize, usize), panel: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let dst = panel.as_mut_ptr();
    // SAFETY: AVX2 by this fn's contract. Each group of steps s..s + 8 <= kb reads columns
    // k0 + s..k0 + s + 8 of rows i..i + MR (`cs` 1: contiguous), inside the readable block of
    // the contract; step s + t writes 4 + 2 = MR f32s at `(s + t)·MR`, below `kb·MR`, which
    // `panel` holds (the transpose's lanes past MR are not stored).
    unsafe {
        let rows: [*const f32; MR] = std::array::from_fn(|r| a.at(i + r, k0));
        let mut s = 0;
        while s + 8 <= kb {
            let zero = _mm256_setzero_ps();
            let r = std::array::from_fn(|t| {
                if t < MR {
                    _mm256_loadu_ps(rows[t].add(s))
                } else {
                    zero
                }
            });
            // each step's MR = 6 lanes: four, then two, so nothing is written past the panel
            for (t, x) in crate::tiles::transpose8(r).into_iter().enumerate() {
                let d = dst.add((s + t) * MR);
                _mm_storeu_ps(d, _mm256_castps256_ps128(x));
                let hi = _mm_cvtsi128_si64(_mm_castps_si128(_mm256_extractf128_ps::<1>(x)));
                std::ptr::write_unaligned(d.add(4) as *mut i64, hi);
            }
            s += 8;
        }
        s
    }
}

/// One tile's packed operands: `k` steps of an `A` panel and a `B` panel, and how much of
/// the `MR × NR` tile is inside the output.
struct Tile {
    a: *const f32,
    b: *const f32,
    k: usize,
    rows: usize,
    cols: usize,
}

/// [`tile`] with the vectors of `isa`.
///
/// # Safety
/// As [`tile`]; the CPU has `isa`.
unsafe fn tile_at(isa: Level, t: &Tile, out: Out, update: Option<f32>) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX2 and FMA; the caller's contract
        Level::Avx2 | Level::Avx512 => unsafe { tile_avx2(t, out, update) },
        // the caller's contract rules this out
        _ => {}
    }
}

/// [`tile`] on AVX2 vectors.
///
/// # Safety
/// As [`tile`], and the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(t: &Tile, out: Out, update: Option<f32>) {
    // SAFETY: X8's AVX2 + FMA are enabled here and present (this fn's contract); the panels
    // and the output block are as `tile` requires, by the same contract
    unsafe { tile::<crate::lanes::X8>(t, out, update) }
}

/// The `MR × NR` sums of one tile in registers, then into the output: written, or added
/// (times β) to what is there. A partial tile goes through a buffer.
///
/// # Safety
/// The caller is compiled with `L`'s features and the CPU has them; `L::N · V` is `NR`;
/// `t`'s panels hold `k` steps; the output's `rows × cols` block is writable (readable with
/// `update`).
#[inline(always)]
unsafe fn tile<L: Lanes>(t: &Tile, out: Out, update: Option<f32>) {
    // SAFETY: by this fn's contract: step s reads `MR` f32s of A's panel at `s·MR` and `NR`
    // of B's at `s·NR`, for s < k; a full tile's loads and stores of the output stay in its
    // `MR × NR` block, a partial tile's vectors go to `buf` (`MR × NR` f32s) and only its
    // `rows × cols` elements are copied out; `L`'s features are enabled and present.
    unsafe {
        // the output's lines arrive while the sums run
        for r in 0..t.rows {
            let row = out.c.wrapping_add(r * out.ldc);
            crate::vmath::prefetch(row as *const u8);
            crate::vmath::prefetch(row.wrapping_add(NR - 1) as *const u8);
        }
        let mut acc = [[L::splat(0.0); V]; MR];
        for s in 0..t.k {
            let a = t.a.add(s * MR);
            fma_step::<L, MR, V>(&mut acc, |r| *a.add(r), t.b.add(s * NR));
        }
        let full = t.rows == MR && t.cols == NR;
        let mut buf = [0.0f32; MR * NR];
        for (r, row) in acc.iter().enumerate().take(t.rows) {
            let dst = if full {
                out.c.add(r * out.ldc)
            } else {
                buf.as_mut_ptr().add(r * NR)
            };
            for (v, &x) in row.iter().enumerate() {
                let d = dst.add(v * L::N);
                match update {
                    None => x.store(d),
                    Some(beta) if full => L::splat(beta).fma(x, L::load(d)).store(d),
                    Some(_) => x.store(d),
                }
            }
        }
        if !full {
            for r in 0..t.rows {
                for (q, &x) in buf[r * NR..][..t.cols].iter().enumerate() {
                    let d = out.c.add(r * out.ldc + q);
                    *d = match update {
                        None => x,
                        Some(beta) => beta.mul_add(x, *d),
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` values in [-1, 1) from a fixed sequence.
    fn values(count: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..count)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// An `rows × cols` operand in a buffer of its own, laid out as `layout` says: 0
    /// row-major, 1 column-major (a transposed view), 2 every element two apart along rows
    /// and columns three rows apart (a strided view).
    fn operand(rows: usize, cols: usize, layout: u8, seed: u64) -> (Vec<f32>, isize, isize) {
        let (rs, cs) = match layout {
            0 => (cols as isize, 1),
            1 => (1, rows as isize),
            _ => (3 * 2 * cols as isize, 2),
        };
        let len = (rows.max(1) - 1) * rs as usize + (cols.max(1) - 1) * cs as usize + 1;
        (values(len, seed), rs, cs)
    }

    #[test]
    fn products_match_float64_sums_for_any_strides_tails_and_threads() {
        if level() == Level::Unavailable {
            eprintln!("no AVX2 and FMA on this CPU: the panels never run here");
            return;
        }
        // tails of every kind; the last crosses the blocks of rows (MC), columns (NC) and
        // the inner index (KC, twice)
        let shapes = [
            (4, 20, 0),
            (1, 1, 1),
            (6, 16, 512),
            (7, 17, 5),
            (13, 33, 513),
            (200, 1030, 1100),
        ];
        for (case, &(m, n, k)) in shapes.iter().enumerate() {
            let layouts: &[(u8, u8)] = if m * n * k > 1 << 24 {
                &[(0, 1)]
            } else {
                &[(0, 0), (0, 1), (1, 0), (2, 2)]
            };
            for &(la, lb) in layouts {
                let (xa, ars, acs) = operand(m, k, la, 1 + case as u64);
                let (xb, brs, bcs) = operand(k, n, lb, 100 + case as u64);
                let at = |i: usize, j: usize| xa[(i as isize * ars + j as isize * acs) as usize];
                let bt = |i: usize, j: usize| xb[(i as isize * brs + j as isize * bcs) as usize];
                let c0 = values(m * n, 7);
                for update in [None, Some(-0.75f32)] {
                    let mut runs = vec![];
                    for threads in [1, 2, 3] {
                        let mut c = c0.clone();
                        // SAFETY: the operands are the buffers their strides address; `c` is
                        // m × n and row-major; AVX2 and FMA are there
                        unsafe {
                            product(
                                (m, n, k),
                                Mat {
                                    ptr: xa.as_ptr(),
                                    rs: ars,
                                    cs: acs,
                                },
                                Mat {
                                    ptr: xb.as_ptr(),
                                    rs: brs,
                                    cs: bcs,
                                },
                                (c.as_mut_ptr(), n),
                                update,
                                threads,
                            )
                        };
                        runs.push(c);
                    }
                    let bits = |c: &[f32]| c.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&runs[0]),
                        bits(&runs[1]),
                        "{m}x{n}x{k}: 1 vs 2 threads"
                    );
                    assert_eq!(
                        bits(&runs[0]),
                        bits(&runs[2]),
                        "{m}x{n}x{k}: 1 vs 3 threads"
                    );
                    for i in 0..m {
                        for j in 0..n {
                            let (mut s, mut mag) = (0.0f64, 0.0f64);
                            for l in 0..k {
                                let t = f64::from(at(i, l)) * f64::from(bt(l, j));
                                s += t;
                                mag += t.abs();
                            }
                            let want = match update {
                                None => s,
                                Some(beta) => f64::from(c0[i * n + j]) + f64::from(beta) * s,
                            };
                            let got = f64::from(runs[0][i * n + j]);
                            // one f32 rounding per term and per block, on the sum's scale
                            let tol =
                                2.0 * (k as f64 + 4.0) * f64::from(f32::EPSILON) * (mag + 1.0);
                            assert!(
                                (got - want).abs() <= tol,
                                "{m}x{n}x{k} layouts {la}{lb} {update:?} [{i},{j}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
