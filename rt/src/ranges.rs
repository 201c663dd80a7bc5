//! How work splits into chunks for the threads: eager kernels, compiled kernels and
//! ahead-of-time models cut their rows or elements the same way.

/// `0..n` cut into at most `chunks` ranges whose edges fall on multiples of `align` (whole
/// SIMD runs, cache lines, blocks of rows run as lanes); the last range takes the remainder.
#[derive(Clone, Copy, Debug)]
pub struct Ranges {
    n: usize,
    step: usize,
}

impl Ranges {
    /// `0..n` in at most `chunks` ranges with edges on multiples of `align`.
    pub fn new(n: usize, chunks: usize, align: usize) -> Ranges {
        let step = n
            .div_ceil(chunks.max(1))
            .next_multiple_of(align.max(1))
            .max(1);
        Ranges { n, step }
    }

    /// The number of ranges.
    pub fn count(&self) -> usize {
        self.n.div_ceil(self.step)
    }

    /// Range `c` as `(lo, hi)`.
    pub fn get(&self, c: usize) -> (usize, usize) {
        let lo = c * self.step;
        (lo, (lo + self.step).min(self.n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_everything_once_on_aligned_edges() {
        // 100 into at most 3 ranges on multiples of 16: step 48 (34 rounded up)
        let r = Ranges::new(100, 3, 16);
        let all: Vec<_> = (0..r.count()).map(|c| r.get(c)).collect();
        assert_eq!(all, vec![(0, 48), (48, 96), (96, 100)]);
        // 96 rows run 16 at a time, 8 chunks asked: 6 of 16 rows, none of 12
        let r = Ranges::new(96, 8, 16);
        assert_eq!((r.count(), r.get(5)), (6, (80, 96)));
        for (n, chunks, align) in [(0, 4, 16), (1, 8, 64), (1000, 0, 1), (4096, 8, 16)] {
            let r = Ranges::new(n, chunks, align);
            let mut seen = vec![0u8; n];
            let mut next = 0;
            for c in 0..r.count() {
                let (lo, hi) = r.get(c);
                assert_eq!(lo, next, "ranges follow each other");
                assert!(
                    lo % align == 0 && lo < hi,
                    "{n} {chunks} {align}: ({lo}, {hi})"
                );
                seen[lo..hi].iter_mut().for_each(|s| *s += 1);
                next = hi;
            }
            assert_eq!(next, n);
            assert!(seen.iter().all(|&s| s == 1));
            assert!(r.count() <= chunks.max(1));
        }
    }
}
