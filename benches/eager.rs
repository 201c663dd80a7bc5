//! Eager-kernel throughput against same-run baselines: a memory copy for pointwise ops, a
//! memory read for reductions (both split across the threads), and the gemm crate called
//! directly for matmul.
//!
//! Run: `cargo bench --bench eager` (add `-- quick` for fewer repetitions, `-- linear` for
//! the linear rows only). Each row is the median of the repetitions, its bandwidth (GB/s of
//! bytes moved) or GFLOP/s, and the baseline's time over the kernel's (above 1 is faster
//! than the baseline).

mod timing;

use smelt::{DType, Tensor};
use std::hint::black_box;
use timing::{copy_ms, median_ms, read_ms};

const SIDE: usize = 4096;
const N: usize = SIDE * SIDE;

fn input(seed: u64) -> Tensor {
    smelt::runtime::random::manual_seed(seed);
    Tensor::rand(&[SIDE, SIDE], Some(DType::F32)).expect("rand")
}

/// One table row: name, median ms, rate, and the baseline's time over this one's.
fn row(name: &str, ms: f64, rate: f64, unit: &str, base_ms: f64) {
    println!(
        "| {name} | {ms:.2} ms | {rate:.1} {unit} | {:.2} |",
        base_ms / ms
    );
}

fn gbs(bytes: usize, ms: f64) -> f64 {
    bytes as f64 / ms / 1e6
}

fn pointwise(reps: usize) {
    let x = input(1);
    let y = input(2);
    let copy = copy_ms(8 * N, reps);
    row("copy (baseline)", copy, gbs(8 * N, copy), "GB/s", copy);
    let relu = median_ms(reps, || drop(black_box(&x).relu().expect("relu")));
    row("relu", relu, gbs(8 * N, relu), "GB/s", copy);
    let mul = median_ms(reps, || drop(black_box(&x).mul_scalar(0.5).expect("mul")));
    row("mul_scalar(0.5)", mul, gbs(8 * N, mul), "GB/s", copy);
    // add reads two inputs and writes one: its baseline is the copy of those 12 bytes
    let copy12 = copy_ms(12 * N, reps);
    let add = median_ms(reps, || drop(black_box(&x).add(&y).expect("add")));
    row(
        "add (reads 2, writes 1)",
        add,
        gbs(12 * N, add),
        "GB/s",
        copy12,
    );
}

fn reductions(reps: usize) {
    let x = input(3);
    let read = read_ms(4 * N, reps);
    row("read (baseline)", read, gbs(4 * N, read), "GB/s", read);
    let all = median_ms(reps, || drop(black_box(&x).sum().expect("sum")));
    row("sum()", all, gbs(4 * N, all), "GB/s", read);
    let d1 = median_ms(reps, || {
        drop(black_box(&x).sum_dim(&[1], false).expect("sum"))
    });
    row("sum_dim(&[1])", d1, gbs(4 * N, d1), "GB/s", read);
    let d0 = median_ms(reps, || {
        drop(black_box(&x).sum_dim(&[0], false).expect("sum"))
    });
    row("sum_dim(&[0])", d0, gbs(4 * N, d0), "GB/s", read);
}

fn matmul(reps: usize) {
    const M: usize = 1024;
    smelt::runtime::random::manual_seed(4);
    let a = Tensor::rand(&[M, M], Some(DType::F32)).expect("rand");
    let b = Tensor::rand(&[M, M], Some(DType::F32)).expect("rand");
    let (av, bv): (Vec<f32>, Vec<f32>) = (a.to_vec().expect("f32"), b.to_vec().expect("f32"));
    let mut out = vec![0f32; M * M];
    let flops = 2.0 * (M * M * M) as f64;
    let direct = median_ms(reps, || {
        // SAFETY: the three buffers hold M×M f32s each, row-major with row stride M.
        unsafe {
            gemm::gemm(
                M,
                M,
                M,
                out.as_mut_ptr(),
                1,
                M as isize,
                false,
                av.as_ptr(),
                1,
                M as isize,
                bv.as_ptr(),
                1,
                M as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(rayon::current_num_threads()),
            )
        }
    });
    row(
        "gemm::gemm direct (baseline)",
        direct,
        flops / direct / 1e6,
        "GFLOP/s",
        direct,
    );
    let mm = median_ms(reps, || drop(black_box(&a).matmul(&b).expect("matmul")));
    row("Tensor::matmul", mm, flops / mm / 1e6, "GFLOP/s", direct);
}

/// The GPT's layers: `linear` on [32, 32, 96] (and the MLP's [32, 32, 384]) against the
/// same product through `matmul` of the transposed weight, with and without the bias.
fn linear(reps: usize) {
    smelt::runtime::random::manual_seed(5);
    let rand = |s: &[usize]| Tensor::rand(s, Some(DType::F32)).expect("rand");
    for (x, out) in [([32usize, 32, 96], 288usize), ([32, 32, 384], 96)] {
        let (xt, w, b) = (rand(&x), rand(&[out, x[2]]), rand(&[out]));
        let flops = 2.0 * (32 * 32 * x[2] * out) as f64;
        let wt = w.t().expect("t");
        let base = median_ms(reps, || drop(black_box(&xt).matmul(&wt).expect("matmul")));
        let name = format!("matmul [32,32,{}]·[{},{out}] (baseline)", x[2], x[2]);
        row(&name, base, flops / base / 1e6, "GFLOP/s", base);
        for bias in [None, Some(&b)] {
            let ms = median_ms(reps, || {
                drop(black_box(&xt).linear(&w, bias).expect("linear"))
            });
            let name = format!(
                "linear, {}",
                if bias.is_some() { "bias" } else { "no bias" }
            );
            row(&name, ms, flops / ms / 1e6, "GFLOP/s", base);
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `-- quick` asks for fewer repetitions
    let quick = std::env::args().any(|a| a == "quick");
    let reps = if quick { 5 } else { 21 };
    println!(
        "eager kernels, {} threads, median of {reps}",
        rayon::current_num_threads()
    );
    println!("| kernel | time | rate | baseline/kernel |\n|---|---|---|---|");
    if std::env::args().any(|a| a == "linear") {
        println!("| **linear at the GPT's shapes, f32** | | | |");
        linear(reps);
        return;
    }
    println!("| **pointwise, [{SIDE},{SIDE}] f32** | | | |");
    pointwise(reps);
    println!("| **reductions, [{SIDE},{SIDE}] f32** | | | |");
    reductions(reps);
    println!("| **matmul 1024³ f32** | | | |");
    matmul(reps);
    println!("| **linear at the GPT's shapes, f32** | | | |");
    linear(reps);
}
