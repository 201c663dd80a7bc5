//! The memory roof of a graph on this machine: how long a parallel read of its inputs'
//! bytes and a parallel write of its outputs' bytes take, measured in the same run as the
//! kernels they bound, in memory from the tensor allocator (the same pages the kernels
//! touch). A kernel that only has to read its inputs once and write its outputs once can
//! run no faster than this.

use super::profile::median;
use crate::Result;
use crate::codegen_cpu::vmath::{PREFETCH_AHEAD, prefetch};
use crate::ir::dtype::DType;
use crate::runtime::Tensor;
use rayon::prelude::*;
use std::time::Instant;

/// Elements per parallel task: 256 KiB of u64s.
const CHUNK: usize = 1 << 15;

/// Medians of the two halves of the roof, in ms.
#[derive(Clone, Copy, Debug)]
pub struct Roof {
    /// Parallel read of the inputs' bytes.
    pub read_ms: f64,
    /// Parallel write of the outputs' bytes: plain or streamed stores, whichever was faster.
    pub write_ms: f64,
}

impl Roof {
    /// Read and write together.
    pub fn ms(&self) -> f64 {
        self.read_ms + self.write_ms
    }
}

/// Eight independent xor chains per task, so that loads stay in flight, with the line
/// 8 KiB ahead prefetched as the strip sums do; the result keeps the loop from being
/// optimised away.
fn read(words: &[u64]) -> u64 {
    words
        .par_chunks(CHUNK)
        .map(|c| {
            let mut acc = [0u64; 8];
            let mut it = c.chunks_exact(8);
            for (k, w) in (&mut it).enumerate() {
                // 8 words are 16 f32s: the strip sums' distance ahead, in words
                prefetch(c.as_ptr().wrapping_add(k * 8 + PREFETCH_AHEAD / 2) as *const u8);
                for (a, &x) in acc.iter_mut().zip(w) {
                    *a ^= x;
                }
            }
            it.remainder().iter().chain(&acc).fold(0, |a, &b| a ^ b)
        })
        .reduce(|| 0, |a, b| a ^ b)
}

fn write(words: &mut [u64], v: u64) {
    words.par_chunks_mut(CHUNK).for_each(|c| c.fill(v));
}

/// [`write`] with non-temporal stores where the CPU has them (x86-64), which skip reading
/// each line before writing it, as streamed kernel outputs do.
fn write_streamed(words: &mut [u64], v: u64) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_sfence, _mm_stream_si64};
        words.par_chunks_mut(CHUNK).for_each(|c| {
            for w in c.iter_mut() {
                // SAFETY: `w` is a valid, aligned u64 of the slice; SSE2 is baseline x86-64.
                unsafe { _mm_stream_si64(w as *mut u64 as *mut i64, v as i64) };
            }
            // SAFETY: as above; orders the streamed stores before the task ends.
            unsafe { _mm_sfence() };
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    write(words, v);
}

/// Measures the roof of reading `read_bytes` and writing `write_bytes`: `rounds` timed
/// passes of each (after one untimed pass that touches every page).
pub fn measure(read_bytes: usize, write_bytes: usize, rounds: usize) -> Result<Roof> {
    let words = |b: usize| b.div_ceil(8);
    let src = Tensor::alloc(DType::I64, &[words(read_bytes)])?;
    let dst = Tensor::alloc(DType::I64, &[words(write_bytes)])?;
    let (mut r, mut w, mut ws) = (Vec::new(), Vec::new(), Vec::new());
    src.with_slice_mut(|s: &mut [i64]| {
        dst.with_slice_mut(|d: &mut [i64]| {
            let (s, d): (&mut [u64], &mut [u64]) =
                (bytemuck::cast_slice_mut(s), bytemuck::cast_slice_mut(d));
            write(s, 1);
            write(d, 0);
            // reads first: a read right after 64 MiB of writes competed with their drain
            for _ in 0..rounds.max(1) {
                let t0 = Instant::now();
                std::hint::black_box(read(s));
                r.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            for i in 0..rounds.max(1) {
                let t0 = Instant::now();
                write(d, i as u64);
                std::hint::black_box(&mut *d);
                w.push(t0.elapsed().as_secs_f64() * 1e3);
                let t0 = Instant::now();
                write_streamed(d, i as u64);
                std::hint::black_box(&mut *d);
                ws.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        })
    })??;
    Ok(Roof {
        read_ms: median(r),
        write_ms: median(w).min(median(ws)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_word_and_times_both_halves() {
        let words: Vec<u64> = (0..100_003u64).collect();
        let want = words.iter().fold(0, |a, &b| a ^ b);
        assert_eq!(read(&words), want);
        let mut d = vec![0u64; 70_001];
        write(&mut d, 9);
        assert!(d.iter().all(|&x| x == 9));
        write_streamed(&mut d, 5);
        assert!(d.iter().all(|&x| x == 5));
        let roof = measure(1 << 20, 0, 3).unwrap();
        assert!(roof.read_ms > 0.0 && roof.write_ms >= 0.0);
    }
}
