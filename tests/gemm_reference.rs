//! Matrix products at real sizes (every side at least 256, odd sides, transposed operands)
//! against references that share no code with smelt's GEMM: integer-valued inputs, whose
//! products and sums are exact in f32 and f64 whatever the order of summation, against an
//! i64 product; and random inputs against a float64 product within the rounding bound
//! `gamma_K * sum |a||b|` (Higham, Accuracy and Stability, 3.1). The interpreter and the
//! compiled code share the GEMM, so comparing them with each other could not see a bug in it.

mod common;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use smelt::{DType, Tensor};

/// (m, k, n) with every side at least 256, odd ones among them.
const SIZES: [(usize, usize, usize); 3] = [(256, 256, 256), (257, 300, 263), (300, 511, 259)];

fn ints(rng: &mut StdRng, n: usize) -> Vec<i64> {
    (0..n).map(|_| rng.random_range(-8..=8)).collect()
}

/// `a [m,k] @ b [k,n]` in i64, row-major.
fn int_product(a: &[i64], b: &[i64], m: usize, k: usize, n: usize) -> Vec<i64> {
    let mut c = vec![0i64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += x * b[p * n + j];
            }
        }
    }
    c
}

fn tensor(v: &[i64], shape: &[usize], dtype: DType) -> Tensor {
    let f: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    Tensor::from_vec(f, shape).unwrap().to_dtype(dtype).unwrap()
}

/// The product three ways: eager, and compiled from a graph with `b` given as written or
/// as the transpose of a `[n, k]` input (the GEMM's other packing).
fn products(a: &Tensor, b: &Tensor, dtype: DType) -> Vec<(String, Tensor)> {
    let (m, k) = (a.shape()[0], a.shape()[1]);
    let n = b.shape()[1];
    let d = dtype.name();
    let plain = format!(
        "graph g(%a: {d}[{m},{k}], %b: {d}[{k},{n}]) {{\n  %c = matmul(%a, %b)\n  return %c\n}}\n"
    );
    let transposed = format!(
        "graph g(%a: {d}[{m},{k}], %bt: {d}[{n},{k}]) {{\n  %b = transpose(%bt, dim0=0, dim1=1)\n  %c = matmul(%a, %b)\n  return %c\n}}\n"
    );
    let bt = b.transpose(0, 1).unwrap().contiguous().unwrap();
    let mut out = vec![("eager".to_string(), a.matmul(b).unwrap())];
    for (what, text, second) in [
        ("compiled", plain, b),
        ("compiled, b transposed", transposed, &bt),
    ] {
        let g = parse_module(&text, "g.smelt").unwrap();
        let f = CompiledFn::compile(g.entry(), &CompileOptions::default()).unwrap();
        let c = f.call(&[a.clone(), second.clone()]).unwrap().remove(0);
        out.push((what.to_string(), c));
    }
    out
}

#[test]
fn integer_products_are_exact_at_every_size_and_dtype() {
    let mut rng = StdRng::seed_from_u64(1);
    for (m, k, n) in SIZES {
        let (a, b) = (ints(&mut rng, m * k), ints(&mut rng, k * n));
        let want: Vec<f64> = int_product(&a, &b, m, k, n)
            .iter()
            .map(|&x| x as f64)
            .collect();
        // |c| <= 64 k < 2^24: every partial sum is exact in f32 as in f64
        for dtype in [DType::F32, DType::F64] {
            let (ta, tb) = (tensor(&a, &[m, k], dtype), tensor(&b, &[k, n], dtype));
            for (what, c) in products(&ta, &tb, dtype) {
                assert_eq!(c.shape(), &[m, n]);
                assert_eq!(c.dtype(), dtype);
                let got = c.try_to_f64_vec().unwrap();
                assert!(
                    got == want,
                    "{what} {dtype:?} [{m},{k}]@[{k},{n}]: not the exact integer product"
                );
            }
        }
    }
}

#[test]
fn float_products_are_within_the_rounding_bound() {
    let mut rng = StdRng::seed_from_u64(2);
    for (m, k, n) in SIZES {
        let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        // the exact product of the f32 inputs, to f64's precision, and sum |a||b|
        let (mut want, mut mag) = (vec![0f64; m * n], vec![0f64; m * n]);
        for i in 0..m {
            for p in 0..k {
                let x = a[i * k + p] as f64;
                for j in 0..n {
                    let y = b[p * n + j] as f64;
                    want[i * n + j] += x * y;
                    mag[i * n + j] += (x * y).abs();
                }
            }
        }
        let u = f32::EPSILON as f64 / 2.0;
        let gamma = k as f64 * u / (1.0 - k as f64 * u);
        let ta = Tensor::from_vec(a, &[m, k]).unwrap();
        let tb = Tensor::from_vec(b, &[k, n]).unwrap();
        for (what, c) in products(&ta, &tb, DType::F32) {
            assert_eq!(c.shape(), &[m, n]);
            let got = c.try_to_f64_vec().unwrap();
            for (i, ((g, w), s)) in got.iter().zip(&want).zip(&mag).enumerate() {
                // the f32 result's own rounding adds u |c|
                let bound = gamma * s + u * w.abs();
                assert!(
                    (g - w).abs() <= bound,
                    "{what} [{m},{k}]@[{k},{n}] element {i}: {g} vs {w} (bound {bound:e})"
                );
            }
        }
    }
}
