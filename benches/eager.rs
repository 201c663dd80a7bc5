//! Eager-kernel throughput against same-run baselines: a plain memory copy for pointwise
//! ops, a plain read for reductions, and the gemm crate called directly for matmul.
//!
//! Run: `cargo bench --bench eager`. Criterion prints time and throughput (GB/s of bytes
//! moved, or elements/s converted to GFLOP/s in BENCHMARKS.md).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use smelt::{DType, Tensor};
use std::hint::black_box;
use std::time::Duration;

const N: usize = 1 << 24; // 16M elements
const SIDE: usize = 4096;

fn input(seed: u64) -> Tensor {
    smelt::runtime::random::manual_seed(seed);
    Tensor::rand(&[SIDE, SIDE], Some(DType::F32)).expect("rand")
}

fn pointwise(c: &mut Criterion) {
    let x = input(1);
    let y = input(2);
    let src: Vec<f32> = x.to_vec().expect("f32");
    let mut dst = vec![0f32; N];
    let mut g = c.benchmark_group("pointwise_16M_f32");
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    // copy: read 4 B + write 4 B per element
    g.throughput(Throughput::Bytes((8 * N) as u64));
    g.bench_function("memcpy_baseline", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&src)))
    });
    g.bench_function("relu", |b| b.iter(|| black_box(&x).relu().expect("relu")));
    g.bench_function("mul_scalar", |b| {
        b.iter(|| black_box(&x).mul_scalar(0.5).expect("mul"))
    });
    g.throughput(Throughput::Bytes((12 * N) as u64));
    g.bench_function("add", |b| b.iter(|| black_box(&x).add(&y).expect("add")));
    g.finish();
}

fn reductions(c: &mut Criterion) {
    let x = input(3);
    let src: Vec<f32> = x.to_vec().expect("f32");
    let mut g = c.benchmark_group("reduce_16M_f32");
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Bytes((4 * N) as u64));
    g.bench_function("read_baseline", |b| {
        b.iter(|| black_box(&src).iter().fold(0f32, |a, &v| a + v))
    });
    g.bench_function("sum_all", |b| b.iter(|| black_box(&x).sum().expect("sum")));
    g.bench_function("sum_dim1", |b| {
        b.iter(|| black_box(&x).sum_dim(&[1], false).expect("sum"))
    });
    g.bench_function("sum_dim0", |b| {
        b.iter(|| black_box(&x).sum_dim(&[0], false).expect("sum"))
    });
    g.finish();
}

fn matmul(c: &mut Criterion) {
    const M: usize = 1024;
    smelt::runtime::random::manual_seed(4);
    let a = Tensor::rand(&[M, M], Some(DType::F32)).expect("rand");
    let bt = Tensor::rand(&[M, M], Some(DType::F32)).expect("rand");
    let (av, bv): (Vec<f32>, Vec<f32>) = (a.to_vec().expect("f32"), bt.to_vec().expect("f32"));
    let mut out = vec![0f32; M * M];
    let mut g = c.benchmark_group("matmul_1024_f32");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    // 2·M³ flops, reported as "elements" = flops
    g.throughput(Throughput::Elements((2 * M * M * M) as u64));
    g.bench_function("gemm_crate_direct", |b| {
        b.iter(|| unsafe {
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
        })
    });
    g.bench_function("tensor_matmul", |b| {
        b.iter(|| black_box(&a).matmul(&bt).expect("matmul"))
    });
    g.finish();
}

criterion_group!(benches, pointwise, reductions, matmul);
criterion_main!(benches);
