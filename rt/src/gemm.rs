//! Matrix products on the `gemm` crate: the one place that calls it for `matmul`, shared by
//! the eager kernel, the JIT's direct GEMMs and ahead-of-time compiled models, so that all
//! three make the same call (sizes, strides, threading rule) and agree bit for bit.

use gemm::Parallelism;
use half::f16;

/// Products with at least this many multiply-adds use several threads.
pub const PAR_FLOPS: usize = 1 << 18;

/// A batch of products runs one product per thread unless each has at least this many
/// multiply-adds (and the batch is short): then the threads share each product.
pub const PAR_INSIDE_FLOPS: usize = 1 << 26;

/// The element types `gemm` multiplies.
pub trait GemmElem: Copy + Send + Sync + std::ops::Add<Output = Self> + 'static {
    /// 1 in this type.
    const ONE: Self;
    /// Whether a long sum may be split into partial products added afterwards (not in f16,
    /// where each partial result would round to 11 bits).
    const SPLIT_K: bool;
}
impl GemmElem for f16 {
    const ONE: f16 = f16::ONE;
    const SPLIT_K: bool = false;
}
impl GemmElem for f32 {
    const ONE: f32 = 1.0;
    const SPLIT_K: bool = true;
}
impl GemmElem for f64 {
    const ONE: f64 = 1.0;
    const SPLIT_K: bool = true;
}

/// Into how many parts along `k` a lone product is split: the gemm crate's threads share
/// the output's tiles, and a product whose output is small next to its sum (a weight's
/// gradient `gᵀ·x` such as `[96,1024]·[1024,384]`, which measured well below the forward
/// GEMMs of its size on 2 threads) has too few of them. The parts depend on the shape only,
/// never on the threads, so results do not change with the machine.
pub fn k_parts(m: usize, n: usize, k: usize) -> usize {
    let wide = m.max(n);
    if m.saturating_mul(n).saturating_mul(k) < PAR_FLOPS
        || k < 2 * wide
        || m.saturating_mul(n) > SPLIT_K_MAX_OUT
    {
        return 1;
    }
    (k / (2 * wide)).clamp(2, 4)
}

/// The largest output split along `k` (its partial results take `(parts - 1)` copies of it).
pub const SPLIT_K_MAX_OUT: usize = 1 << 18;

/// The sizes and strides (in elements) of `out[m,n] = a[m,k] · b[k,n]`; `out` is row-major
/// and contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Product {
    /// Rows of `a` and `out`.
    pub m: usize,
    /// Columns of `b` and `out`.
    pub n: usize,
    /// Columns of `a`, rows of `b`.
    pub k: usize,
    /// Row and column strides of `a`.
    pub a: (isize, isize),
    /// Row and column strides of `b`.
    pub b: (isize, isize),
}

/// A raw pointer that crosses to the worker threads (each batch writes its own block).
#[derive(Clone, Copy)]
struct Ptr<T>(*mut T);
// SAFETY: the pointers address memory the caller of `batches` lends for the call; batches
// write disjoint blocks and only read the operands.
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as for `Send`.
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

/// One operand of a (batched) product: its shape and strides in elements and the offset of
/// its first element. Rank 1 is a vector: a row on the left, a column on the right.
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    /// Sizes, batch dims first.
    pub shape: &'a [usize],
    /// Strides in elements, one per dim.
    pub strides: &'a [isize],
    /// Element offset of the first element.
    pub offset: usize,
}

/// Why two operands do not multiply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// An operand has rank 0 (or strides that do not match its shape).
    Rank,
    /// Columns of the left operand, rows of the right one: they differ.
    Inner(usize, usize),
    /// Two batch sizes that do not broadcast.
    Batch(usize, usize),
}

/// A batched product `[batch..] m×k · k×n` into a contiguous `[batch.., m, n]` result: the
/// matrices' geometry and the `[out, a, b]` element offsets of each matrix (the input of
/// [`batches`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batched {
    /// Sizes and strides of every matrix of the batch.
    pub product: Product,
    /// `[out, a, b]` offsets, one triple per matrix.
    pub offs: Vec<[usize; 3]>,
}

/// A matrix operand: batch dims `(size, stride)`, then rows, columns and their strides.
struct Mat {
    batch: Vec<(usize, isize)>,
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
}

fn mat(x: &Operand, left: bool) -> Result<Mat, PlanError> {
    let (sh, st) = (x.shape, x.strides);
    let r = sh.len();
    if r == 0 || st.len() != r {
        return Err(PlanError::Rank);
    }
    Ok(match r {
        1 if left => Mat {
            batch: vec![],
            rows: 1,
            cols: sh[0],
            rs: 0,
            cs: st[0],
        },
        1 => Mat {
            batch: vec![],
            rows: sh[0],
            cols: 1,
            rs: st[0],
            cs: 0,
        },
        _ => Mat {
            batch: sh[..r - 2]
                .iter()
                .copied()
                .zip(st[..r - 2].iter().copied())
                .collect(),
            rows: sh[r - 2],
            cols: sh[r - 1],
            rs: st[r - 2],
            cs: st[r - 1],
        },
    })
}

/// Plans `a · b` with PyTorch's `matmul` rules: batch dims broadcast, right-aligned.
///
/// Batch dims over which `b` is broadcast and `a`'s rows run on at an even stride (a 3-D
/// activation times a weight) fold into the rows: one tall product instead of a batch of
/// short ones, which the GEMM packs once and threads well.
pub fn plan(a: Operand, b: Operand) -> Result<Batched, PlanError> {
    let (mut ma, mb) = (mat(&a, true)?, mat(&b, false)?);
    if ma.cols != mb.rows {
        return Err(PlanError::Inner(ma.cols, mb.rows));
    }
    let rank = ma.batch.len().max(mb.batch.len());
    // (size, stride) of batch dim d of x, broadcast: stride 0 where x has size 1 or no dim
    let dim = |x: &Mat, d: usize| -> (usize, isize) {
        let pad = rank - x.batch.len();
        match d.checked_sub(pad).map(|i| x.batch[i]) {
            Some((size, st)) if size != 1 => (size, st),
            _ => (1, 0),
        }
    };
    let mut dims = Vec::with_capacity(rank);
    for d in 0..rank {
        let ((da, sa), (db, sb)) = (dim(&ma, d), dim(&mb, d));
        if da != db && da != 1 && db != 1 {
            return Err(PlanError::Batch(da, db));
        }
        dims.push((if da == 1 { db } else { da }, sa, sb));
    }
    // fold trailing batch dims into a's rows
    while let Some(&(size, sa, sb)) = dims.last() {
        let even = ma.rows == 1 || Some(sa) == isize::try_from(ma.rows).ok().map(|r| r * ma.rs);
        if size != 1 && !(sb == 0 && sa != 0 && even) {
            break;
        }
        if size != 1 {
            if ma.rows == 1 {
                ma.rs = sa;
            }
            ma.rows *= size;
        }
        dims.pop();
    }
    let (m, n, k) = (ma.rows, mb.cols, ma.cols);
    let count: usize = dims.iter().map(|d| d.0).product();
    let mut offs = Vec::with_capacity(count);
    let mut idx = vec![0usize; dims.len()];
    for bi in 0..count {
        let (mut oa, mut ob) = (a.offset as isize, b.offset as isize);
        for (&i, &(_, sa, sb)) in idx.iter().zip(&dims) {
            oa += i as isize * sa;
            ob += i as isize * sb;
        }
        offs.push([bi * m * n, oa as usize, ob as usize]);
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            if idx[d] < dims[d].0 {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(Batched {
        product: Product {
            m,
            n,
            k,
            a: (ma.rs, ma.cs),
            b: (mb.rs, mb.cs),
        },
        offs,
    })
}

/// Whether [`batches`] splits `count` products of `macs` multiply-adds each across threads
/// (given more than one): inside a product or across the batch.
pub fn splits(macs: usize, count: usize) -> bool {
    macs.saturating_mul(count) >= PAR_FLOPS
}

/// Element types of integer products: each product is a wrapping sum of i64 products,
/// converted back with C cast semantics (narrower integers wrap).
pub trait IntElem: Copy + Send + Sync + 'static {
    /// The value as i64.
    fn to_i64(self) -> i64;
    /// `v` with C cast semantics.
    fn from_i64(v: i64) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl IntElem for $t {
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    )*};
}
int_elem!(u8, i8, i16, i32, i64);

/// Integer products, one per batch as [`batches`]: `out = a·b`, or `out += a·b` when
/// `accumulate`, every element a wrapping i64 sum. Integer sums wrap exactly, so any order
/// of the terms gives the same bits: rows split over at most `threads` threads when the
/// batch has [`PAR_FLOPS`] multiply-adds.
///
/// # Safety
/// As [`batches`].
pub unsafe fn int_batches<T: IntElem>(
    p: &Product,
    (a, b, out): (*const T, *const T, *mut T),
    offs: &[[usize; 3]],
    accumulate: bool,
    threads: usize,
) {
    let (m, k, n) = (p.m, p.k, p.n);
    let ((ars, acs), (brs, bcs)) = (p.a, p.b);
    let (pa, pb, po) = (Ptr(a as *mut T), Ptr(b as *mut T), Ptr(out));
    let rows = offs.len() * m;
    // SAFETY: `r < offs.len()·m`, so `offs[r / m]` is a batch and `r % m` one of its rows;
    // every element read (l < k, j < n) and written is inside the batch's operands and
    // block (this fn's contract), and each output row is written by one call only.
    let row = |r: usize| unsafe {
        let [o, ao, bo] = offs[r / m];
        let i = (r % m) as isize;
        for j in 0..n {
            let mut s = 0i64;
            for l in 0..k as isize {
                let x = *pa.get().offset(ao as isize + i * ars + l * acs);
                let y = *pb.get().offset(bo as isize + l * brs + j as isize * bcs);
                s = s.wrapping_add(x.to_i64().wrapping_mul(y.to_i64()));
            }
            let d = po.get().add(o + r % m * n + j);
            let before = if accumulate { (*d).to_i64() } else { 0 };
            *d = T::from_i64(before.wrapping_add(s));
        }
    };
    if threads > 1 && splits(m.saturating_mul(n).saturating_mul(k), offs.len()) {
        use rayon::prelude::*;
        (0..rows).into_par_iter().for_each(row);
    } else {
        (0..rows).for_each(row);
    }
}

/// Runs one product per batch, `[out, a, b]` element offsets each: `out = a·b`, or with
/// `beta = Some(β)`, `out += β·(a·b)` (`out` holding the value to update). Threads (at most
/// `threads`): inside a large product, across small ones.
///
/// # Safety
/// For every batch, the `m×k` (`k×n`) elements of `a` (`b`) at its offset and strides are
/// readable, and the contiguous `m×n` block of `out` at its offset is writable, disjoint
/// from the other batches' blocks and the operands, and unused by others during the call.
pub unsafe fn batches<T: GemmElem>(
    p: &Product,
    (a, b, out): (*const T, *const T, *mut T),
    offs: &[[usize; 3]],
    beta: Option<T>,
    threads: usize,
) {
    let (m, n, k) = (p.m, p.n, p.k);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // an empty sum: zeros, or the value to update unchanged
        if beta.is_none() {
            for &[o, _, _] in offs {
                // SAFETY: the caller's contract on every batch's block.
                unsafe { std::ptr::write_bytes(out.add(o), 0, m * n) };
            }
        }
        return;
    }
    let (pa, pb, po) = (Ptr(a as *mut T), Ptr(b as *mut T), Ptr(out));
    let (read_dst, beta) = match beta {
        Some(beta) => (true, beta),
        None => (false, T::ONE),
    };
    let run = |&[o, ao, bo]: &[usize; 3], par: Parallelism| {
        let (a, b) = (pa.get().wrapping_add(ao), pb.get().wrapping_add(bo));
        let panels = on_panels::<T>(p, k);
        // SAFETY: the caller's contract on every batch's block and operands; `on_panels`
        // saw f32 and AVX2 and FMA.
        unsafe { product(p, k, po.get().add(o), (a, b), (read_dst, beta), par, panels) }
    };
    let flops = m * n * k;
    // Across the batch when there is a batch to share: small products split poorly inside
    // (a [128,384]·[384,384] ran no faster on two threads than on one), while whole
    // products per thread scale; inside one product only when it is alone or huge.
    let across = offs.len() > 1
        && splits(flops, offs.len())
        && threads > 1
        && (flops < PAR_INSIDE_FLOPS || offs.len() >= 4 * threads);
    let parts = if T::SPLIT_K && offs.len() == 1 {
        k_parts(m, n, k)
    } else {
        1
    };
    if across {
        use rayon::prelude::*;
        offs.par_iter().for_each(|o| run(o, Parallelism::None));
    } else if parts > 1 {
        // SAFETY: the caller's contract, for the one product.
        unsafe { split_k(p, (pa, pb, po), offs[0], (read_dst, beta), parts, threads) };
    } else {
        let par = if flops >= PAR_FLOPS && threads > 1 {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        offs.iter().for_each(|o| run(o, par));
    }
}

/// Whether the f32 panels run `p` over `k` of its inner dim (else the `gemm` crate): a
/// function of the shape, `b`'s layout and the ISA only ([`crate::panels::takes`]).
fn on_panels<T: 'static>(p: &Product, k: usize) -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
        && crate::panels::takes(p.m, p.n, k, p.b)
}

/// `dst = a·b` (`dst = dst + β·a·b` when `read_dst`) over `k` of `p`'s inner dim, `dst` a
/// contiguous `m × n` block, on the panels (`panels`, see [`on_panels`]) or the `gemm`
/// crate.
///
/// # Safety
/// `a`, `b` and `dst` address what `p`'s strides reach over `m`, `n` and `k`; with
/// `panels`, `T` is f32 and the CPU has AVX2 and FMA.
unsafe fn product<T: GemmElem>(
    p: &Product,
    k: usize,
    dst: *mut T,
    (a, b): (*mut T, *mut T),
    (read_dst, beta): (bool, T),
    par: Parallelism,
    panels: bool,
) {
    if panels {
        use crate::panels::Mat;
        let threads = match par {
            Parallelism::Rayon(t) => t.max(1),
            _ => 1,
        };
        let mat = |ptr: *mut T, (rs, cs): (isize, isize)| Mat {
            ptr: ptr as *const f32,
            rs,
            cs,
        };
        // SAFETY: `T` is f32 (the caller's contract), so is β
        let update = read_dst.then(|| unsafe { *(&beta as *const T as *const f32) });
        // SAFETY: the caller's contract
        unsafe {
            crate::panels::product(
                (p.m, p.n, k),
                mat(a, p.a),
                mat(b, p.b),
                (dst as *mut f32, p.n),
                update,
                threads,
            )
        };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            p.m,
            p.n,
            k,
            dst,
            1,
            p.n as isize,
            read_dst,
            a as *const T,
            p.a.1,
            p.a.0,
            b as *const T,
            p.b.1,
            p.b.0,
            T::ONE,
            beta,
            false,
            false,
            false,
            par,
        )
    }
}

/// One product as `parts` products over consecutive ranges of `k` (in parallel where there
/// are threads): the first into `out` (updating it if asked), the others into scratch, then
/// added into `out` in order.
///
/// # Safety
/// As [`batches`], for the one product at offsets `[o, ao, bo]`.
unsafe fn split_k<T: GemmElem>(
    p: &Product,
    (pa, pb, po): (Ptr<T>, Ptr<T>, Ptr<T>),
    [o, ao, bo]: [usize; 3],
    (read_dst, beta): (bool, T),
    parts: usize,
    threads: usize,
) {
    use rayon::prelude::*;
    let (m, n, k) = (p.m, p.n, p.k);
    let chunk = k.div_ceil(parts).next_multiple_of(16);
    let mut scratch = vec![T::ONE; (parts - 1) * m * n];
    let ps = Ptr(scratch.as_mut_ptr());
    let part = |i: usize| {
        let (k0, k1) = (i * chunk, ((i + 1) * chunk).min(k));
        if k0 >= k1 {
            return;
        }
        let dst = if i == 0 {
            po.get().wrapping_add(o)
        } else {
            ps.get().wrapping_add((i - 1) * m * n)
        };
        let a = pa
            .get()
            .wrapping_add(ao)
            .wrapping_offset(k0 as isize * p.a.1);
        let b = pb
            .get()
            .wrapping_add(bo)
            .wrapping_offset(k0 as isize * p.b.0);
        // SAFETY: the caller's contract; part `i` reads columns (rows) `k0..k1` of `a` (`b`)
        // and writes its own block.
        unsafe {
            product(
                p,
                k1 - k0,
                dst,
                (a, b),
                (read_dst && i == 0, beta),
                Parallelism::None,
                on_panels::<T>(p, k1 - k0),
            )
        }
    };
    if threads > 1 {
        (0..parts).into_par_iter().for_each(part);
    } else {
        (0..parts).for_each(part);
    }
    // SAFETY: the caller's contract on `out`'s block.
    let out = unsafe { std::slice::from_raw_parts_mut(po.get().add(o), m * n) };
    for (i, s) in scratch.chunks_exact(m * n).enumerate() {
        if (i + 1) * chunk < k {
            for (d, &x) in out.iter_mut().zip(s) {
                *d = *d + x;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row-major strides of `shape`.
    fn strides(shape: &[usize]) -> Vec<isize> {
        let mut st = vec![0isize; shape.len()];
        let mut acc = 1isize;
        for d in (0..shape.len()).rev() {
            st[d] = acc;
            acc *= shape[d] as isize;
        }
        st
    }

    /// `a · b` by PyTorch's matmul rules, summed in f64 element by element, read through
    /// shapes and strides: the reference the planned products are checked against.
    fn reference(a: (&[usize], &[isize], &[f64]), b: (&[usize], &[isize], &[f64])) -> Vec<f64> {
        let (sa, ta, xa) = a;
        let (sb, tb, xb) = b;
        // vectors as a row / a column, dims to drop from the result afterwards
        let (sa, ta) = if sa.len() == 1 {
            (vec![1, sa[0]], vec![0, ta[0]])
        } else {
            (sa.to_vec(), ta.to_vec())
        };
        let (sb, tb) = if sb.len() == 1 {
            (vec![sb[0], 1], vec![tb[0], 0])
        } else {
            (sb.to_vec(), tb.to_vec())
        };
        let (ra, rb) = (sa.len() - 2, sb.len() - 2);
        let rank = ra.max(rb);
        let size = |s: &[usize], r: usize, d: usize| {
            if d < rank - r { 1 } else { s[d - (rank - r)] }
        };
        let batch: Vec<usize> = (0..rank)
            .map(|d| match (size(&sa, ra, d), size(&sb, rb, d)) {
                (1, y) => y,
                (x, _) => x,
            })
            .collect();
        let (m, k, n) = (sa[ra], sa[ra + 1], sb[rb + 1]);
        let count: usize = batch.iter().product();
        let mut out = Vec::with_capacity(count * m * n);
        for bi in 0..count {
            // batch index, then each operand's offset (broadcast dims stay at 0)
            let mut idx = vec![0usize; rank];
            let mut r = bi;
            for d in (0..rank).rev() {
                idx[d] = r % batch[d];
                r /= batch[d];
            }
            let off = |s: &[usize], t: &[isize], rr: usize| -> isize {
                (0..rank)
                    .filter(|&d| d >= rank - rr)
                    .map(|d| {
                        let i = d - (rank - rr);
                        if s[i] == 1 { 0 } else { idx[d] as isize * t[i] }
                    })
                    .sum()
            };
            let (oa, ob) = (off(&sa, &ta, ra), off(&sb, &tb, rb));
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0;
                    for l in 0..k {
                        let pa = oa + i as isize * ta[ra] + l as isize * ta[ra + 1];
                        let pb = ob + l as isize * tb[rb] + j as isize * tb[rb + 1];
                        s += xa[pa as usize] * xb[pb as usize];
                    }
                    out.push(s);
                }
            }
        }
        out
    }

    /// Runs the planned product of `a` and `b` in f64.
    fn planned(a: (&[usize], &[isize], &[f64]), b: (&[usize], &[isize], &[f64])) -> Vec<f64> {
        let p = plan(
            Operand {
                shape: a.0,
                strides: a.1,
                offset: 0,
            },
            Operand {
                shape: b.0,
                strides: b.1,
                offset: 0,
            },
        )
        .expect("shapes multiply");
        let mut out = vec![0.0; p.offs.len() * p.product.m * p.product.n];
        // SAFETY: the operands are the full buffers their shapes and strides address.
        unsafe {
            batches(
                &p.product,
                (a.2.as_ptr(), b.2.as_ptr(), out.as_mut_ptr()),
                &p.offs,
                None,
                2,
            )
        };
        out
    }

    #[test]
    fn planned_products_match_a_float64_reference() {
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        // (a shape, b shape, transpose b's last two dims)
        let cases: &[(&[usize], &[usize], bool)] = &[
            (&[5, 7, 3], &[3, 4], false),
            (&[5, 7, 3], &[4, 3], true),
            (&[2, 3, 7, 3], &[4, 3], true),
            (&[2, 1, 7, 3], &[4, 3, 5], false),
            (&[1, 7, 3], &[6, 3, 5], false),
            (&[6, 7, 3], &[6, 5, 3], true),
            (&[7], &[4, 7, 5], false),
            (&[4, 7, 5], &[5], false),
            (&[3], &[3], false),
            (&[4, 1, 3], &[3, 2], false),
            (&[0, 7, 3], &[3, 4], false),
            (&[2, 0, 3], &[3, 4], false),
            (&[64, 33, 17], &[19, 17], true),
            // sums long next to the output: split along k (4 parts, the last short; 2 parts)
            (&[24, 1000], &[1000, 40], false),
            (&[24, 1000], &[40, 1000], true),
            (&[100, 700], &[700, 300], false),
        ];
        for &(sa, sb0, tb) in cases {
            let xa: Vec<f64> = (0..sa.iter().product::<usize>())
                .map(|_| (next() % 17) as f64 - 8.0)
                .collect();
            let xb: Vec<f64> = (0..sb0.iter().product::<usize>())
                .map(|_| (next() % 13) as f64 - 6.0)
                .collect();
            let ta = strides(sa);
            let (sb, stb) = if tb {
                // the transposed view of a row-major buffer, as linear's weight
                let r = sb0.len();
                let mut s = sb0.to_vec();
                let mut t = strides(sb0);
                s.swap(r - 2, r - 1);
                t.swap(r - 2, r - 1);
                (s, t)
            } else {
                (sb0.to_vec(), strides(sb0))
            };
            let want = reference((sa, &ta, &xa), (&sb, &stb, &xb));
            let got = planned((sa, &ta, &xa), (&sb, &stb, &xb));
            assert_eq!(got, want, "{sa:?} x {sb:?}");
        }
    }

    #[test]
    fn long_sums_split_along_k_by_shape_only() {
        assert_eq!(k_parts(24, 40, 1000), 4);
        assert_eq!(k_parts(100, 300, 700), 2);
        assert_eq!(k_parts(96, 384, 1024), 2);
        // forward GEMMs of a linear, and products too small to share
        assert_eq!(k_parts(1024, 384, 96), 1);
        assert_eq!(k_parts(8, 8, 1000), 1);
        // a product updating its output adds each part once (`out += a·b` with β = 2)
        let (m, n, k) = (24usize, 40usize, 1000usize);
        let a: Vec<f64> = (0..m * k).map(|i| (i % 7) as f64 - 3.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i % 5) as f64 - 2.0).collect();
        let out: Vec<f64> = (0..m * n).map(|i| i as f64).collect();
        let want: Vec<f64> = (0..m * n)
            .map(|idx| {
                let (i, j) = (idx / n, idx % n);
                let dot: f64 = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
                idx as f64 + 2.0 * dot
            })
            .collect();
        let p = Product {
            m,
            n,
            k,
            a: (k as isize, 1),
            b: (n as isize, 1),
        };
        for threads in [1, 2] {
            let mut o = out.clone();
            // SAFETY: the buffers hold the shapes the product addresses.
            unsafe {
                batches(
                    &p,
                    (a.as_ptr(), b.as_ptr(), o.as_mut_ptr()),
                    &[[0, 0, 0]],
                    Some(2.0),
                    threads,
                )
            };
            assert_eq!(o, want, "{threads} threads");
        }
    }

    #[test]
    fn a_weight_shared_by_the_batch_folds_into_the_rows() {
        let (sa, sb) = ([32usize, 16, 8], [8usize, 4]);
        let (ta, tb) = (strides(&sa), strides(&sb));
        let op = |shape, strides| Operand {
            shape,
            strides,
            offset: 0,
        };
        let p = plan(op(&sa, &ta), op(&sb, &tb)).expect("shapes multiply");
        assert_eq!((p.product.m, p.offs.len()), (512, 1));
        // a batched right operand keeps the batch
        let sb3 = [32usize, 8, 4];
        let tb3 = strides(&sb3);
        let p = plan(op(&sa, &ta), op(&sb3, &tb3)).expect("shapes multiply");
        assert_eq!((p.product.m, p.offs.len()), (16, 32));
        // rows that do not run on evenly (a slice of every matrix) keep the batch too
        let ts = [16 * 9, 8, 1];
        let p = plan(op(&sa, &ts), op(&sb, &tb)).expect("shapes multiply");
        assert_eq!((p.product.m, p.offs.len()), (16, 32));
        let xa: Vec<f64> = (0..32 * 16 * 9).map(|i| (i % 11) as f64).collect();
        let xb: Vec<f64> = (0..32).map(|i| (i % 5) as f64 - 2.0).collect();
        assert_eq!(
            planned((&sa, &ts, &xa), (&sb, &tb, &xb)),
            reference((&sa, &ts, &xa), (&sb, &tb, &xb))
        );
        assert_eq!(
            plan(op(&sa, &ta), op(&[7, 4], &[4, 1])),
            Err(PlanError::Inner(8, 7))
        );
        assert_eq!(
            plan(op(&[3, 2, 8], &[16, 8, 1]), op(&[4, 8, 2], &[16, 2, 1])),
            Err(PlanError::Batch(3, 4))
        );
        assert_eq!(plan(op(&[], &[]), op(&sb, &tb)), Err(PlanError::Rank));
    }

    #[test]
    fn the_f32_panels_and_the_crate_compute_the_same_products() {
        if crate::vmath::level() == crate::vmath::Level::Unavailable {
            eprintln!("no AVX2 and FMA on this CPU: the panels never run here");
            return;
        }
        let (m, n, k) = (37, 45, 600);
        let xa: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 19) as f32 - 9.0) / 8.0)
            .collect();
        let xb: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5 % 23) as f32 - 11.0) / 8.0)
            .collect();
        // a row-major, b the transposed view of a row-major [n, k] (as linear's weight)
        let p = Product {
            m,
            n,
            k,
            a: (k as isize, 1),
            b: (1, k as isize),
        };
        let c0: Vec<f32> = (0..m * n).map(|i| (i % 11) as f32 - 5.0).collect();
        for (read_dst, beta) in [(false, 1.0f32), (true, -0.5)] {
            let run = |panels: bool| {
                let mut c = c0.clone();
                let (pa, pb) = (xa.as_ptr() as *mut f32, xb.as_ptr() as *mut f32);
                let par = Parallelism::Rayon(2);
                // SAFETY: the buffers are what the strides reach; AVX2 and FMA are there
                unsafe {
                    product(
                        &p,
                        k,
                        c.as_mut_ptr(),
                        (pa, pb),
                        (read_dst, beta),
                        par,
                        panels,
                    )
                };
                c
            };
            let (ours, crate_) = (run(true), run(false));
            for i in 0..m {
                for j in 0..n {
                    let s: f64 = (0..k)
                        .map(|l| f64::from(xa[i * k + l]) * f64::from(xb[j * k + l]))
                        .sum();
                    let want = if read_dst {
                        f64::from(c0[i * n + j]) + f64::from(beta) * s
                    } else {
                        s
                    };
                    // the inputs are multiples of 1/8 and the sums below 2^13: both exact
                    assert_eq!(f64::from(ours[i * n + j]), want, "panels [{i},{j}]");
                    assert_eq!(f64::from(crate_[i * n + j]), want, "crate [{i},{j}]");
                }
            }
        }
    }
}
