//! The strided-iteration engine every eager kernel runs on: walks an index space for several
//! operands at once, merges dims that are contiguous for all of them, hands out innermost
//! runs, and splits large walks across rayon's pool.

use crate::tensor::threads::Ranges;

/// A split kernel's chunks hold at least half this many elements (whether it splits at all:
/// `threads::eager_par_min`).
pub const PAR_THRESHOLD: usize = 1 << 15;

/// A raw pointer that may cross threads: kernels guarantee disjoint writes.
#[derive(Clone, Copy, Debug)]
pub struct SendPtr<T>(pub *mut T);
// SAFETY: only used by kernels whose parallel chunks touch disjoint elements.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as for `Send`: a shared `SendPtr` only yields a copy of the pointer (`get`);
// the kernels that share one write disjoint elements through it.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer. A method, so closures capture the whole `SendPtr` and not its field.
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// A joint walk over `shape` for K operands with the given element strides.
#[derive(Clone, Debug)]
pub struct Walk<const K: usize> {
    /// Coalesced dims, outermost first; never empty (a 0-d walk is one dim of size 1).
    sizes: Vec<usize>,
    strides: Vec<[usize; K]>,
    numel: usize,
}

impl<const K: usize> Walk<K> {
    /// A walk over `shape` with one stride list per operand (dims coalesced where all allow).
    pub fn new(shape: &[usize], strides: [&[usize]; K]) -> Walk<K> {
        let numel = shape.iter().product();
        let mut sizes: Vec<usize> = Vec::with_capacity(shape.len());
        let mut st: Vec<[usize; K]> = Vec::with_capacity(shape.len());
        for (i, &n) in shape.iter().enumerate() {
            if n == 1 {
                continue;
            }
            let s: [usize; K] = std::array::from_fn(|k| strides[k][i]);
            if let (Some(ps), Some(pst)) = (sizes.last_mut(), st.last_mut())
                && (0..K).all(|k| pst[k] == s[k] * n)
            {
                *ps *= n;
                *pst = s;
                continue;
            }
            sizes.push(n);
            st.push(s);
        }
        if sizes.is_empty() {
            sizes.push(1);
            st.push([0; K]);
        }
        Walk {
            sizes,
            strides: st,
            numel,
        }
    }

    /// Number of positions walked.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Calls `f(base_offsets, len, inner_strides)` for each innermost run of elements
    /// `lo..hi` (in row-major order of the index space).
    pub fn run_range(
        &self,
        lo: usize,
        hi: usize,
        f: &mut dyn FnMut([usize; K], usize, [usize; K]),
    ) {
        if lo >= hi {
            return;
        }
        let nd = self.sizes.len();
        let inner = self.sizes[nd - 1];
        let inner_st = self.strides[nd - 1];
        let mut idx = vec![0usize; nd - 1];
        let mut rem = lo / inner;
        let mut base = [0usize; K];
        for d in (0..nd - 1).rev() {
            idx[d] = rem % self.sizes[d];
            rem /= self.sizes[d];
            for (k, b) in base.iter_mut().enumerate() {
                *b += idx[d] * self.strides[d][k];
            }
        }
        let mut i_in = lo % inner;
        let mut pos = lo;
        while pos < hi {
            let len = (inner - i_in).min(hi - pos);
            let start: [usize; K] = std::array::from_fn(|k| base[k] + i_in * inner_st[k]);
            f(start, len, inner_st);
            pos += len;
            i_in = 0;
            // advance the odometer over the outer dims
            for d in (0..nd - 1).rev() {
                idx[d] += 1;
                for (k, b) in base.iter_mut().enumerate() {
                    *b += self.strides[d][k];
                }
                if idx[d] < self.sizes[d] {
                    break;
                }
                for (k, b) in base.iter_mut().enumerate() {
                    *b -= self.sizes[d] * self.strides[d][k];
                }
                idx[d] = 0;
            }
        }
    }

    /// Like `run_range` over everything, split across threads when large. `f` must only
    /// write elements of its own runs.
    pub fn par_run(&self, f: impl Fn([usize; K], usize, [usize; K]) + Sync) {
        // One monomorphic body per K: the closure is called once per run, not per element,
        // so dynamic dispatch costs nothing measurable.
        self.par_run_dyn(&f)
    }

    fn par_run_dyn(&self, f: &(dyn Fn([usize; K], usize, [usize; K]) + Sync)) {
        let n = self.numel;
        if n < crate::tensor::threads::eager_par_min() || crate::tensor::threads::available() == 1 {
            self.run_range(0, n, &mut |b, l, s| f(b, l, s));
            return;
        }
        let chunks = (crate::tensor::threads::available() * 4).min(n / (PAR_THRESHOLD / 2));
        crate::tensor::threads::par_each(&Ranges::new(n, chunks, 16), &|_, lo, hi| {
            self.run_range(lo, hi, &mut |b, l, s| f(b, l, s));
        });
    }
}

/// `out = f(a)` elementwise. Pointers are already offset to the first element; strides
/// are broadcast to `shape`.
///
/// # Safety
/// Every index reachable through `shape` and the strides must be in bounds of its buffer,
/// and `out` must not alias itself (no stride-0 dims of size > 1).
pub unsafe fn map1<A: Copy, O: Copy>(
    shape: &[usize],
    out: (*mut O, &[usize]),
    a: (*const A, &[usize]),
    f: impl Fn(A) -> O + Sync,
) {
    let (po, pa) = (SendPtr(out.0), SendPtr(a.0 as *mut A));
    // SAFETY: every index reachable through `shape` and the strides is in bounds (this fn's
    // contract), and the walk hands out exactly those: runs `bo + i·so`, `ba + i·sa`,
    // i < len; `out` does not alias itself, and `par_run` gives each chunk disjoint
    // positions of the walk, so no output element is written twice.
    Walk::new(shape, [out.1, a.1]).par_run(|[bo, ba], len, [so, sa]| unsafe {
        let (o, a) = (po.get().add(bo), pa.get().add(ba) as *const A);
        if so == 1 && sa == 1 {
            let o = std::slice::from_raw_parts_mut(o, len);
            let a = std::slice::from_raw_parts(a, len);
            for (o, &a) in o.iter_mut().zip(a) {
                *o = f(a);
            }
        } else {
            for i in 0..len {
                *o.add(i * so) = f(*a.add(i * sa));
            }
        }
    });
}

/// `out = f(a, b)` elementwise; see `map1` for the contract.
///
/// # Safety
/// As for `map1`.
pub unsafe fn map2<A: Copy, B: Copy, O: Copy>(
    shape: &[usize],
    out: (*mut O, &[usize]),
    a: (*const A, &[usize]),
    b: (*const B, &[usize]),
    f: impl Fn(A, B) -> O + Sync,
) {
    let (po, pa, pb) = (
        SendPtr(out.0),
        SendPtr(a.0 as *mut A),
        SendPtr(b.0 as *mut B),
    );
    // SAFETY: as in `map1`, with a third operand: every index of the walk is in bounds,
    // and chunks write disjoint output elements.
    Walk::new(shape, [out.1, a.1, b.1]).par_run(|[bo, ba, bb], len, [so, sa, sb]| unsafe {
        let (o, a, b) = (
            po.get().add(bo),
            pa.get().add(ba) as *const A,
            pb.get().add(bb) as *const B,
        );
        if so == 1 && sa == 1 && sb == 1 {
            let o = std::slice::from_raw_parts_mut(o, len);
            let a = std::slice::from_raw_parts(a, len);
            let b = std::slice::from_raw_parts(b, len);
            for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                *o = f(a, b);
            }
        } else if so == 1 && sa == 1 && sb == 0 {
            let o = std::slice::from_raw_parts_mut(o, len);
            let a = std::slice::from_raw_parts(a, len);
            let b = *b;
            for (o, &a) in o.iter_mut().zip(a) {
                *o = f(a, b);
            }
        } else if so == 1 && sa == 0 && sb == 1 {
            // a scalar on the left (`1 - x`)
            let o = std::slice::from_raw_parts_mut(o, len);
            let (a, b) = (*a, std::slice::from_raw_parts(b, len));
            for (o, &b) in o.iter_mut().zip(b) {
                *o = f(a, b);
            }
        } else {
            for i in 0..len {
                *o.add(i * so) = f(*a.add(i * sa), *b.add(i * sb));
            }
        }
    });
}

/// `out = f(a, b, c)` elementwise; see `map1` for the contract.
///
/// # Safety
/// As for `map1`.
pub unsafe fn map3<A: Copy, B: Copy, C: Copy, O: Copy>(
    shape: &[usize],
    out: (*mut O, &[usize]),
    a: (*const A, &[usize]),
    b: (*const B, &[usize]),
    c: (*const C, &[usize]),
    f: impl Fn(A, B, C) -> O + Sync,
) {
    let po = SendPtr(out.0);
    let (pa, pb, pc) = (
        SendPtr(a.0 as *mut A),
        SendPtr(b.0 as *mut B),
        SendPtr(c.0 as *mut C),
    );
    Walk::new(shape, [out.1, a.1, b.1, c.1]).par_run(
        // SAFETY: as in `map1`, with four operands.
        |[bo, ba, bb, bc], len, [so, sa, sb, sc]| unsafe {
            let o = po.get().add(bo);
            let (a, b, c) = (pa.get().add(ba), pb.get().add(bb), pc.get().add(bc));
            for i in 0..len {
                *o.add(i * so) = f(*a.add(i * sa), *b.add(i * sb), *c.add(i * sc));
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesces_and_visits_in_order() {
        let w = Walk::new(&[2, 3, 4], [&[12, 4, 1]]);
        assert_eq!(w.sizes, vec![24]);
        let w = Walk::new(&[2, 3], [&[1, 2]]); // transposed
        let mut seen = vec![];
        w.run_range(1, 5, &mut |[b], len, [s]| {
            for i in 0..len {
                seen.push(b + i * s);
            }
        });
        assert_eq!(seen, vec![2, 4, 1, 3]);
    }
}
