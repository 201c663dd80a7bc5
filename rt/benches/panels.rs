//! f32 GEMMs on `smelt_rt::panels` against the `gemm` crate, at the shapes of the peer
//! benchmark's MLP and of a BERT-sized encoder's `linear` layers (the weight as a
//! transposed view, as `linear` passes it), and of batch-1 inference (a few rows): GFLOP/s,
//! the median of 7 rounds in which the two take turns (range in brackets), on one thread
//! and on two. The last column says which of the two `smelt_rt::gemm` picks here.
//!
//! The panels take every f32 product on AVX2, and products of two rows or more whose `b` is
//! transposed on AVX-512 too (`panels::applies_column_major`): `cargo bench -p smelt-rt
//! --bench panels` on an AVX-512 CPU, and on a larger one the AVX2 path with
//! `SMELT_CPU=avx2 cargo bench -p smelt-rt --no-default-features --bench panels`, so that
//! the crate runs its AVX2 kernels too (`SMELT_CPU` caps smelt's helpers, the missing
//! feature the crate's).

use smelt_rt::panels::{Mat, product, takes};
use std::time::Instant;

const ROUNDS: usize = 7;

/// GFLOP/s of `run` over `reps` calls.
fn rate(fl: f64, reps: usize, mut run: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        run();
    }
    fl * reps as f64 / t.elapsed().as_secs_f64()
}

/// Median (range) with `digits` decimals.
fn summary(mut v: Vec<f64>, digits: usize) -> String {
    v.sort_by(f64::total_cmp);
    let (mid, lo, hi) = (v[v.len() / 2], v[0], v[v.len() - 1]);
    format!("{mid:.digits$} ({lo:.digits$}–{hi:.digits$})")
}

fn main() {
    if !smelt_rt::vmath::available() {
        println!("no AVX2 and FMA on this CPU: the panels do not run here");
        return;
    }
    println!(
        "f32 GEMMs, GFLOP/s: the gemm crate against the panels (helpers on {}), median of {ROUNDS} rounds (range)",
        smelt_rt::vmath::isa()
    );
    println!("| m × k · k × n | b | threads | gemm crate | panels | panels / crate | smelt runs |");
    println!("|---|---|---|---|---|---|---|");
    // (m, n, k, b transposed)
    let shapes = [
        (256, 4096, 1024, false),
        (256, 1024, 4096, false),
        (4096, 384, 384, true),
        (4096, 1536, 384, true),
        (4096, 384, 1536, true),
        (512, 512, 512, false),
        // batch-1 inference: a few rows through a BERT-base layer's weights
        (2, 768, 768, true),
        (8, 768, 768, true),
        (32, 768, 768, true),
        (32, 768, 3072, true),
        (1, 3072, 768, true),
        (32, 768, 768, false),
    ];
    for (m, n, k, bt) in shapes {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0)
            .collect();
        // b as [k, n]: row-major, or the transposed view of a row-major [n, k]
        let (brs, bcs) = if bt { (1, k as isize) } else { (n as isize, 1) };
        let (mut c0, mut c1) = (vec![0f32; m * n], vec![0f32; m * n]);
        let fl = 2.0 * (m * n * k) as f64 / 1e9;
        let reps = (0.5 / fl).ceil() as usize;
        for threads in [1, 2] {
            let par = if threads > 1 {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            };
            let (mut crate_, mut ours) = (vec![], vec![]);
            for _ in 0..ROUNDS {
                crate_.push(rate(fl, reps, || {
                    // SAFETY: the buffers hold what the sizes and strides address
                    unsafe {
                        gemm::gemm(
                            m,
                            n,
                            k,
                            c0.as_mut_ptr(),
                            1,
                            n as isize,
                            false,
                            a.as_ptr(),
                            1,
                            k as isize,
                            b.as_ptr(),
                            bcs,
                            brs,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            par,
                        )
                    }
                }));
                ours.push(rate(fl, reps, || {
                    let (a, b) = (
                        Mat {
                            ptr: a.as_ptr(),
                            rs: k as isize,
                            cs: 1,
                        },
                        Mat {
                            ptr: b.as_ptr(),
                            rs: brs,
                            cs: bcs,
                        },
                    );
                    // SAFETY: as above; AVX2 and FMA are there
                    unsafe { product((m, n, k), a, b, (c1.as_mut_ptr(), n), None, threads) }
                }));
            }
            assert!(
                c0.iter().zip(&c1).all(|(x, y)| x == y),
                "{m}x{k}x{n}: the two products differ (the inputs are exact in f32)"
            );
            let ratio: Vec<f64> = ours.iter().zip(&crate_).map(|(o, c)| o / c).collect();
            println!(
                "| {m} × {k} · {k} × {n} | {} | {threads} | {} | {} | {} | {} |",
                if bt { "transposed" } else { "row-major" },
                summary(crate_, 1),
                summary(ours, 1),
                summary(ratio, 2),
                if takes(m, n, k, (brs, bcs)) {
                    "panels"
                } else {
                    "crate"
                }
            );
        }
    }
}
