//! Timing shared by the benches: medians of repeated runs and a same-run copy baseline.

use rayon::prelude::*;
use std::time::Instant;

/// Median wall time of `reps` calls of `f` in ms, after one warm-up call.
pub fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut v: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median time of copying `bytes` bytes (half read, half written) split across the threads.
pub fn copy_ms(bytes: usize, reps: usize) -> f64 {
    let n = (bytes / 2 / 4).max(1);
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let chunk = n.div_ceil(rayon::current_num_threads()).max(1 << 12);
    median_ms(reps, || {
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
    })
}

/// Median time of reading `bytes` bytes of f32s (a sum per thread) split across the threads.
pub fn read_ms(bytes: usize, reps: usize) -> f64 {
    let src = vec![1.0f32; (bytes / 4).max(1)];
    let chunk = src
        .len()
        .div_ceil(rayon::current_num_threads())
        .max(1 << 12);
    median_ms(reps, || {
        let s: f32 = src
            .par_chunks(chunk)
            .map(|c| {
                // sixteen partial sums, so the adds do not wait on each other and vectorise
                let mut acc = [0f32; 16];
                let runs = c.chunks_exact(16);
                let tail: f32 = runs.remainder().iter().sum();
                for w in runs {
                    for (a, &x) in acc.iter_mut().zip(w) {
                        *a += x;
                    }
                }
                acc.iter().sum::<f32>() + tail
            })
            .sum();
        std::hint::black_box(s);
    })
}
