//! Reductions and row ops against f64 references computed here with plain loops.

mod common;

use common::{Tol, assert_close};
use proptest::prelude::*;
use smelt::runtime::element::round_to_dtype;
use smelt::{DType, Element, Tensor};

const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];
const ALL: [DType; 8] = [
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::Bool,
];

fn make(vals: &[f64], shape: &[usize], dt: DType) -> Tensor {
    smelt::dispatch!(dt, T => Tensor::from_vec(
        vals.iter().map(|&v| <T as Element>::from_f64(v)).collect::<Vec<T>>(), shape).unwrap())
}

/// A deterministic value that every dtype stores exactly.
fn val(i: usize, dt: DType) -> f64 {
    match dt {
        DType::Bool => (i * 7).is_multiple_of(3) as i64 as f64,
        DType::U8 => ((i * 7) % 11) as f64,
        d if d.is_float() => ((i * 37) % 23) as f64 * 0.375 - 4.125,
        _ => ((i * 37) % 23) as f64 - 11.0,
    }
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// The same logical shape as a contiguous tensor, a transposed view, a stepped slice and an
/// expanded view (each with its own values).
fn variants(shape: &[usize], dt: DType) -> Vec<(&'static str, Tensor)> {
    let n = numel(shape);
    let values = |s: &[usize]| -> Vec<f64> { (0..numel(s)).map(|i| val(i, dt)).collect() };
    let mut v = vec![("contiguous", make(&values(shape), shape, dt))];
    let nd = shape.len();
    if nd >= 2 {
        let mut s = shape.to_vec();
        s.swap(nd - 2, nd - 1);
        v.push((
            "transposed",
            make(&values(&s), &s, dt).transpose(-1, -2).unwrap(),
        ));
    }
    if nd >= 1 {
        let mut s = shape.to_vec();
        s[0] = s[0] * 2 + 1;
        v.push((
            "stepped",
            make(&values(&s), &s, dt)
                .slice(0, Some(1), None, 2)
                .unwrap(),
        ));
        let mut s = shape.to_vec();
        s[0] = 1;
        let size: Vec<i64> = shape.iter().map(|&x| x as i64).collect();
        v.push(("expanded", make(&values(&s), &s, dt).expand(&size).unwrap()));
    }
    for (_, t) in &v {
        assert_eq!(t.shape(), shape);
        assert_eq!(t.numel(), n);
    }
    v
}

fn wrap(d: i64, nd: usize) -> usize {
    if d < 0 {
        (d + nd.max(1) as i64) as usize
    } else {
        d as usize
    }
}

/// Groups the elements of a row-major array by their kept index: one group per output.
fn groups(shape: &[usize], vals: &[f64], dims: &[usize]) -> Vec<Vec<f64>> {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let n_out = kept.iter().map(|&d| shape[d]).product::<usize>();
    let mut g = vec![vec![]; n_out];
    for (i, &v) in vals.iter().enumerate() {
        let mut rem = i;
        let mut idx = vec![0; shape.len()];
        for d in (0..shape.len()).rev() {
            idx[d] = rem % shape[d];
            rem /= shape[d];
        }
        let o = kept.iter().fold(0, |o, &d| o * shape[d] + idx[d]);
        g[o].push(v);
    }
    g
}

fn out_shape(shape: &[usize], dims: &[usize], keepdim: bool) -> Vec<usize> {
    (0..shape.len())
        .filter_map(|d| match (dims.contains(&d), keepdim) {
            (true, true) => Some(1),
            (true, false) => None,
            _ => Some(shape[d]),
        })
        .collect()
}

/// Within `t + t·|expected|`, `t` by dtype.
fn tol(dt: DType) -> Tol {
    let t = match dt {
        DType::F16 => 2e-3,
        DType::BF16 => 1e-2,
        DType::F32 => 2e-6,
        DType::F64 => 1e-12,
        _ => 0.0,
    };
    Tol::allclose(t, t)
}

/// Whether `a` is within `t + t·|b|` of `b`.
fn close(a: f64, b: f64, t: f64) -> bool {
    Tol::allclose(t, t).accepts(a, b, false)
}

/// The f64 reference values rounded to `dt`, as the result stores them.
fn rounded(want: &[f64], dt: DType) -> Vec<f64> {
    want.iter().map(|&w| round_to_dtype(w, dt)).collect()
}

/// Checks a reduction of `x` over `dims` (None = all) against `f` applied to each group.
fn check(
    ctx: &str,
    x: &Tensor,
    dims: Option<&[i64]>,
    keepdim: bool,
    got: &Tensor,
    dtype: DType,
    f: &dyn Fn(&[f64]) -> f64,
) {
    let nd = x.dim();
    let dims: Vec<usize> = match dims {
        Some(d) if !d.is_empty() && nd > 0 => d.iter().map(|&d| wrap(d, nd)).collect(),
        _ => (0..nd).collect(),
    };
    assert_eq!(got.dtype(), dtype, "{ctx}: dtype");
    assert_eq!(
        got.shape(),
        out_shape(x.shape(), &dims, keepdim),
        "{ctx}: shape"
    );
    let want: Vec<f64> = groups(x.shape(), &x.to_f64_vec(), &dims)
        .iter()
        .map(|g| f(g))
        .collect();
    assert_close(&got.to_f64_vec(), &rounded(&want, dtype), tol(dtype), ctx);
}

/// Shapes with their lists of dims to reduce.
fn dim_cases() -> Vec<(Vec<usize>, Vec<Vec<i64>>)> {
    vec![
        (
            vec![2, 3, 4],
            vec![vec![0], vec![-1], vec![1], vec![0, 2], vec![-1, 0], vec![]],
        ),
        (vec![5], vec![vec![0], vec![-1]]),
        // more outputs than one block of neighbours (512 + 5), reduced walks of 9 and 27
        // steps (four per pass, then the rest)
        (vec![9, 3, 517], vec![vec![0], vec![0, 1], vec![1]]),
        (vec![3, 1, 2], vec![vec![1], vec![0, 1, 2]]),
        (vec![0, 3], vec![vec![0], vec![1]]),
        (vec![1], vec![vec![0]]),
        (vec![], vec![vec![0], vec![-1]]),
    ]
}

fn isum(g: &[f64]) -> f64 {
    g.iter().fold(0i64, |s, &v| s.wrapping_add(v as i64)) as f64
}

fn sum_dtype(dt: DType) -> DType {
    if dt.is_float() { dt } else { DType::I64 }
}

#[test]
fn sum_and_mean_match_reference() {
    for dt in ALL {
        for (shape, dimsets) in dim_cases() {
            for (name, x) in variants(&shape, dt) {
                for keepdim in [false, true] {
                    let ctx = format!("sum {dt} {name} {shape:?} all");
                    let f: &dyn Fn(&[f64]) -> f64 = if dt.is_float() {
                        &|g| g.iter().sum()
                    } else {
                        &isum
                    };
                    check(&ctx, &x, None, false, &x.sum().unwrap(), sum_dtype(dt), f);
                    for dims in &dimsets {
                        let ctx = format!("sum {dt} {name} {shape:?} {dims:?} {keepdim}");
                        let got = x.sum_dim(dims, keepdim).unwrap();
                        check(&ctx, &x, Some(dims), keepdim, &got, sum_dtype(dt), f);
                        if dt.is_float() {
                            let got = x.mean_dim(dims, keepdim).unwrap();
                            let mean = |g: &[f64]| g.iter().sum::<f64>() / g.len() as f64;
                            check(
                                &format!("mean {ctx}"),
                                &x,
                                Some(dims),
                                keepdim,
                                &got,
                                dt,
                                &mean,
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn mean_of_ints_is_refused_and_empty_mean_is_nan() {
    let x = make(&[1.0, 2.0], &[2], DType::I64);
    let e = x.mean().unwrap_err().to_string();
    assert!(e.contains("mean(): could not infer output dtype"), "{e}");
    let m = make(&[], &[0, 3], DType::F32)
        .mean_dim(&[0], false)
        .unwrap();
    assert_eq!(m.shape(), &[3]);
    assert!(m.to_f64_vec().iter().all(|v| v.is_nan()));
    assert!(
        make(&[], &[0], DType::F32)
            .mean()
            .unwrap()
            .item_f64()
            .unwrap()
            .is_nan()
    );
}

#[test]
fn prod_matches_reference() {
    for dt in ALL {
        for (shape, dimsets) in dim_cases() {
            for (name, x) in variants(&shape, dt) {
                let f: &dyn Fn(&[f64]) -> f64 = if dt.is_float() {
                    &|g| g.iter().product()
                } else {
                    &|g| g.iter().fold(1i64, |p, &v| p.wrapping_mul(v as i64)) as f64
                };
                let ctx = format!("prod {dt} {name} {shape:?}");
                check(&ctx, &x, None, false, &x.prod().unwrap(), sum_dtype(dt), f);
                for dims in dimsets.iter().filter(|d| d.len() == 1) {
                    for keepdim in [false, true] {
                        let got = x.prod_dim(dims[0], keepdim).unwrap();
                        let ctx = format!("{ctx} {dims:?} {keepdim}");
                        check(&ctx, &x, Some(dims), keepdim, &got, sum_dtype(dt), f);
                    }
                }
            }
        }
    }
    assert_eq!(
        make(&[], &[0], DType::F32)
            .prod()
            .unwrap()
            .item_f64()
            .unwrap(),
        1.0
    );
}

fn fmax(g: &[f64]) -> f64 {
    g.iter().fold(f64::NEG_INFINITY, |m, &v| {
        if v.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(v)
        }
    })
}
fn fmin(g: &[f64]) -> f64 {
    g.iter().fold(f64::INFINITY, |m, &v| {
        if v.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.min(v)
        }
    })
}

#[test]
fn amax_amin_match_reference_and_propagate_nan() {
    for dt in ALL {
        for (shape, dimsets) in dim_cases() {
            if shape.contains(&0) {
                continue;
            }
            for (name, x) in variants(&shape, dt) {
                for dims in &dimsets {
                    for keepdim in [false, true] {
                        let ctx = format!("amax {dt} {name} {shape:?} {dims:?} {keepdim}");
                        let got = x.amax_dim(dims, keepdim).unwrap();
                        check(&ctx, &x, Some(dims), keepdim, &got, dt, &fmax);
                        let got = x.amin_dim(dims, keepdim).unwrap();
                        check(&ctx, &x, Some(dims), keepdim, &got, dt, &fmin);
                    }
                }
            }
        }
    }
    for dt in FLOATS {
        let x = make(&[1.0, f64::NAN, 3.0, -1.0, 2.0, 5.0], &[2, 3], dt);
        let m = x.amax_dim(&[1], false).unwrap().to_f64_vec();
        assert!(m[0].is_nan() && m[1] == 5.0, "{dt}: {m:?}");
        let m = x.amin_dim(&[1], false).unwrap().to_f64_vec();
        assert!(m[0].is_nan() && m[1] == -1.0, "{dt}: {m:?}");
        assert!(x.amax().unwrap().item_f64().unwrap().is_nan());
    }
    // i64 extremes are exact (no detour through f64)
    let big = Tensor::from_vec(vec![i64::MAX - 1, i64::MAX, i64::MIN], &[3]).unwrap();
    assert_eq!(big.amax().unwrap().item::<i64>().unwrap(), i64::MAX);
    assert_eq!(big.amin().unwrap().item::<i64>().unwrap(), i64::MIN);
}

#[test]
fn amax_of_an_empty_dim_is_an_error() {
    let x = make(&[], &[2, 0], DType::F32);
    let e = x.amax_dim(&[1], false).unwrap_err().to_string();
    assert_eq!(e, "amax(): Expected reduction dim 1 to have non-zero size.");
    assert_eq!(x.amax_dim(&[0], false).unwrap().shape(), &[0]);
    assert!(x.amin().is_err());
}

#[test]
fn all_any_match_reference() {
    for dt in ALL {
        for (shape, dimsets) in dim_cases() {
            for (name, x) in variants(&shape, dt) {
                let out = if dt == DType::U8 {
                    DType::U8
                } else {
                    DType::Bool
                };
                let all = |g: &[f64]| g.iter().all(|&v| v != 0.0) as i64 as f64;
                let any = |g: &[f64]| g.iter().any(|&v| v != 0.0) as i64 as f64;
                let ctx = format!("all/any {dt} {name} {shape:?}");
                check(&ctx, &x, None, false, &x.all().unwrap(), out, &all);
                check(&ctx, &x, None, false, &x.any().unwrap(), out, &any);
                for dims in &dimsets {
                    check(
                        &ctx,
                        &x,
                        Some(dims),
                        true,
                        &x.all_dim(dims, true).unwrap(),
                        out,
                        &all,
                    );
                    check(
                        &ctx,
                        &x,
                        Some(dims),
                        false,
                        &x.any_dim(dims, false).unwrap(),
                        out,
                        &any,
                    );
                }
            }
        }
    }
    let nan = make(&[f64::NAN, -0.0], &[2], DType::F32);
    assert!(nan.any().unwrap().item::<bool>().unwrap());
    assert!(!nan.all().unwrap().item::<bool>().unwrap());
    let empty = make(&[], &[0], DType::F32);
    assert!(empty.all().unwrap().item::<bool>().unwrap());
    assert!(!empty.any().unwrap().item::<bool>().unwrap());
}

fn lse(g: &[f64]) -> f64 {
    let m = fmax(g);
    if m.is_nan() || m.is_infinite() {
        return m;
    }
    m + g.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
}

#[test]
fn logsumexp_matches_reference_and_is_stable() {
    for dt in [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
    ] {
        for (shape, dimsets) in dim_cases() {
            for (name, x) in variants(&shape, dt) {
                let out = if dt.is_float() { dt } else { DType::F32 };
                for dims in &dimsets {
                    for keepdim in [false, true] {
                        let ctx = format!("logsumexp {dt} {name} {shape:?} {dims:?}");
                        let got = x.logsumexp(dims, keepdim).unwrap();
                        check(&ctx, &x, Some(dims), keepdim, &got, out, &lse);
                    }
                }
            }
        }
    }
    let inf = f64::INFINITY;
    let x = make(
        &[1000.0, 1000.0, -inf, -inf, inf, 1.0, f64::NAN, 1.0],
        &[4, 2],
        DType::F32,
    );
    let got = x.logsumexp(&[1], false).unwrap().to_f64_vec();
    assert!(close(got[0], 1000.0 + 2f64.ln(), 1e-6), "{got:?}");
    assert_eq!(got[1], -inf);
    assert_eq!(got[2], inf);
    assert!(got[3].is_nan());
    let e = make(&[], &[0], DType::F64).logsumexp(&[0], false).unwrap();
    assert_eq!(e.item_f64().unwrap(), -inf);
}

fn argext(g: &[f64], max: bool) -> f64 {
    let mut best = 0;
    for (i, &v) in g.iter().enumerate() {
        let b = g[best];
        if b.is_nan() {
            break;
        }
        if v.is_nan() || (max && v > b) || (!max && v < b) {
            best = i;
        }
    }
    best as f64
}

#[test]
fn argmax_argmin_match_reference() {
    for dt in [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U8,
    ] {
        for (shape, _) in dim_cases() {
            for (name, x) in variants(&shape, dt) {
                let nd = shape.len() as i64;
                for dim in (-nd.max(1)..nd.max(1)).map(Some).chain([None]) {
                    if x.numel() == 0 && dim.is_none_or(|d| shape[wrap(d, shape.len())] == 0) {
                        continue;
                    }
                    for keepdim in [false, true] {
                        let ctx = format!("arg {dt} {name} {shape:?} {dim:?} {keepdim}");
                        let dims: Option<Vec<i64>> = dim.map(|d| vec![d]);
                        let got = x.argmax(dim, keepdim).unwrap();
                        let kd = keepdim;
                        let dd = dims.as_deref();
                        if dim.is_none() && keepdim {
                            assert_eq!(got.shape(), vec![1; shape.len()], "{ctx}");
                            let want = argext(&x.to_f64_vec(), true);
                            assert_eq!(got.to_f64_vec(), vec![want], "{ctx}");
                            continue;
                        }
                        check(&ctx, &x, dd, kd, &got, DType::I64, &|g| argext(g, true));
                        let got = x.argmin(dim, keepdim).unwrap();
                        check(&ctx, &x, dd, kd, &got, DType::I64, &|g| argext(g, false));
                    }
                }
            }
        }
    }
}

#[test]
fn argmax_ties_nan_and_errors() {
    let x = make(
        &[1.0, 3.0, 3.0, 0.0, f64::NAN, 2.0, f64::NAN],
        &[7],
        DType::F32,
    );
    assert_eq!(x.argmax(None, false).unwrap().item::<i64>().unwrap(), 4);
    assert_eq!(x.argmin(None, false).unwrap().item::<i64>().unwrap(), 4);
    let y = make(&[1.0, 3.0, 3.0, 0.0, 0.0], &[5], DType::F64);
    assert_eq!(y.argmax(Some(0), false).unwrap().item::<i64>().unwrap(), 1);
    assert_eq!(y.argmin(Some(-1), false).unwrap().item::<i64>().unwrap(), 3);
    // flattened index of a transposed view counts in its logical (row-major) order:
    // t = [[0, 2], [5, 3], [1, 4]], so 5 sits at flat index 2 (at 1 in storage)
    let t = make(&[0.0, 5.0, 1.0, 2.0, 3.0, 4.0], &[2, 3], DType::F32)
        .t()
        .unwrap();
    assert_eq!(t.argmax(None, false).unwrap().item::<i64>().unwrap(), 2);
    let e = make(&[], &[0], DType::F32)
        .argmax(None, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Expected reduction dim to be specified for input.numel() == 0"),
        "{e}"
    );
    let e = make(&[], &[2, 0], DType::F32)
        .argmax(Some(1), false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "argmax(): Expected reduction dim 1 to have non-zero size."
    );
    assert!(make(&[1.0], &[1], DType::Bool).argmax(None, false).is_err());
    let s = make(&[7.0], &[], DType::F32);
    assert_eq!(s.argmax(Some(0), false).unwrap().item::<i64>().unwrap(), 0);
}

fn variance(g: &[f64], correction: f64) -> f64 {
    let n = g.len() as f64;
    let mean = g.iter().sum::<f64>() / n;
    let m2: f64 = g.iter().map(|v| (v - mean) * (v - mean)).sum();
    m2 / (n - correction).max(0.0)
}

#[test]
fn var_std_match_reference() {
    for dt in FLOATS {
        for (shape, dimsets) in dim_cases() {
            for (name, x) in variants(&shape, dt) {
                for correction in [0.0, 1.0, 2.0] {
                    let v = move |g: &[f64]| variance(g, correction);
                    let s = move |g: &[f64]| variance(g, correction).sqrt();
                    let ctx = format!("var {dt} {name} {shape:?} c={correction}");
                    check(
                        &ctx,
                        &x,
                        None,
                        false,
                        &x.var(None, correction, false).unwrap(),
                        dt,
                        &v,
                    );
                    for dims in &dimsets {
                        let got = x.var(Some(dims), correction, true).unwrap();
                        check(&ctx, &x, Some(dims), true, &got, dt, &v);
                        let got = x.std(Some(dims), correction, false).unwrap();
                        check(&ctx, &x, Some(dims), false, &got, dt, &s);
                    }
                }
            }
        }
    }
    let one = make(&[3.0], &[1], DType::F32);
    assert!(
        one.var(None, 1.0, false)
            .unwrap()
            .item_f64()
            .unwrap()
            .is_nan()
    );
    let two = make(&[1.0, 2.0], &[2], DType::F32);
    assert_eq!(
        two.var(None, 2.0, false).unwrap().item_f64().unwrap(),
        f64::INFINITY
    );
    // large offset: no cancellation
    let big = make(&[1e8 + 1.0, 1e8 + 2.0, 1e8 + 3.0], &[3], DType::F64);
    assert_eq!(big.var(None, 1.0, false).unwrap().item_f64().unwrap(), 1.0);
    let e = make(&[1.0], &[1], DType::I64)
        .var(None, 1.0, false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "std and var only support floating point and complex dtypes"
    );
}

/// Applies `f` to every 1-D lane of a row-major array along `dim`, in place.
fn along(shape: &[usize], vals: &[f64], dim: usize, f: &dyn Fn(&mut [f64])) -> Vec<f64> {
    if shape.is_empty() {
        let mut v = vals.to_vec();
        f(&mut v);
        return v;
    }
    let inner: usize = shape[dim + 1..].iter().product();
    let outer: usize = shape[..dim].iter().product();
    let n = shape[dim];
    let mut out = vals.to_vec();
    for o in 0..outer {
        for i in 0..inner {
            let idx: Vec<usize> = (0..n).map(|j| (o * n + j) * inner + i).collect();
            let mut lane: Vec<f64> = idx.iter().map(|&k| vals[k]).collect();
            f(&mut lane);
            for (k, v) in idx.iter().zip(lane) {
                out[*k] = v;
            }
        }
    }
    out
}

fn check_rows(ctx: &str, x: &Tensor, dim: i64, got: &Tensor, dt: DType, f: &dyn Fn(&mut [f64])) {
    assert_eq!(got.dtype(), dt, "{ctx}");
    assert_eq!(got.shape(), x.shape(), "{ctx}");
    let want = along(x.shape(), &x.to_f64_vec(), wrap(dim, x.dim()), f);
    assert_close(&got.to_f64_vec(), &rounded(&want, dt), tol(dt), ctx);
}

fn row_cases() -> Vec<Vec<usize>> {
    vec![
        vec![2, 3, 4],
        vec![5],
        vec![3, 1],
        vec![0, 3],
        vec![1],
        vec![],
    ]
}

#[test]
fn cumsum_matches_reference() {
    for dt in ALL {
        for shape in row_cases() {
            for (name, x) in variants(&shape, dt) {
                let nd = shape.len().max(1) as i64;
                for dim in -nd..nd {
                    let ctx = format!("cumsum {dt} {name} {shape:?} {dim}");
                    let got = x.cumsum(dim).unwrap();
                    check_rows(&ctx, &x, dim, &got, sum_dtype(dt), &|v| {
                        let mut s = 0.0;
                        v.iter_mut().for_each(|x| {
                            s += *x;
                            *x = s;
                        });
                    });
                }
            }
        }
    }
    assert!(make(&[1.0], &[1], DType::F32).cumsum(1).is_err());
}

fn softmax_ref(v: &mut [f64], log: bool) {
    let m = fmax(v);
    let s: f64 = v.iter().map(|x| (x - m).exp()).sum();
    for x in v.iter_mut() {
        *x = if log {
            *x - m - s.ln()
        } else {
            (*x - m).exp() / s
        };
    }
}

#[test]
fn softmax_and_log_softmax_match_reference() {
    for dt in FLOATS {
        for shape in row_cases() {
            for (name, x) in variants(&shape, dt) {
                let nd = shape.len().max(1) as i64;
                for dim in -nd..nd {
                    let ctx = format!("softmax {dt} {name} {shape:?} {dim}");
                    let got = x.softmax(dim).unwrap();
                    check_rows(&ctx, &x, dim, &got, dt, &|v| softmax_ref(v, false));
                    let got = x.log_softmax(dim).unwrap();
                    check_rows(&ctx, &x, dim, &got, dt, &|v| softmax_ref(v, true));
                }
            }
        }
    }
    let inf = f64::INFINITY;
    let x = make(
        &[1000.0, 1000.0, 999.0, -inf, -inf, -inf],
        &[2, 3],
        DType::F32,
    );
    let s = x.softmax(1).unwrap().to_f64_vec();
    let e = (-1f64).exp();
    let want = [1.0 / (2.0 + e), 1.0 / (2.0 + e), e / (2.0 + e)];
    assert_close(
        &s[..3],
        &rounded(&want, DType::F32),
        tol(DType::F32),
        "stable softmax",
    );
    assert!(s[3..].iter().all(|v| v.is_nan()), "{s:?}");
    let l = x.log_softmax(-1).unwrap().to_f64_vec();
    assert!(close(l[2], -1.0 - (2.0 + e).ln(), 1e-6), "{l:?}");
    let e = make(&[1.0], &[1], DType::I64)
        .softmax(0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not implemented for 'Long'"), "{e}");
}

#[test]
fn layer_norm_matches_reference() {
    for dt in FLOATS {
        for (shape, norm) in [
            (vec![2, 3, 4], vec![4]),
            (vec![2, 3, 4], vec![3, 4]),
            (vec![5], vec![5]),
        ] {
            let k: usize = numel(&norm);
            let w = make(
                &(0..k).map(|i| 0.5 + i as f64 * 0.25).collect::<Vec<_>>(),
                &norm,
                dt,
            );
            let b = make(
                &(0..k).map(|i| i as f64 * 0.125 - 1.0).collect::<Vec<_>>(),
                &norm,
                dt,
            );
            let (wv, bv) = (w.to_f64_vec(), b.to_f64_vec());
            for (name, x) in variants(&shape, dt) {
                for (wo, bo) in [
                    (None, None),
                    (Some(&w), None),
                    (None, Some(&b)),
                    (Some(&w), Some(&b)),
                ] {
                    let ctx = format!(
                        "layer_norm {dt} {name} {shape:?} {norm:?} {}{}",
                        wo.is_some(),
                        bo.is_some()
                    );
                    let got = x.layer_norm(&norm, wo, bo, 1e-5).unwrap();
                    assert_eq!(got.shape(), &shape[..]);
                    let xs = x.to_f64_vec();
                    let mut want = vec![];
                    for row in xs.chunks(k) {
                        let mean = row.iter().sum::<f64>() / k as f64;
                        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / k as f64;
                        for (i, v) in row.iter().enumerate() {
                            let y = (v - mean) / (var + 1e-5).sqrt();
                            let y = if wo.is_some() { y * wv[i] } else { y };
                            want.push(if bo.is_some() { y + bv[i] } else { y });
                        }
                    }
                    assert_close(&got.to_f64_vec(), &rounded(&want, dt), tol(dt), &ctx);
                }
            }
        }
    }
    let x = make(&[0.0; 6], &[2, 3], DType::F32);
    let e = x
        .layer_norm(&[2], None, None, 1e-5)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "Given normalized_shape=[2], expected input with shape [*, 2], but got input of size[2, 3]"
    );
    let w = make(&[1.0; 2], &[2], DType::F32);
    let e = x
        .layer_norm(&[3], Some(&w), None, 1e-5)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Expected weight to be of same shape as normalized_shape"),
        "{e}"
    );
}

#[test]
fn float_sums_do_not_drift() {
    let n = 10_000_000;
    let x = Tensor::full(&[n], 0.1, Some(DType::F32)).unwrap();
    let exact = n as f64 * (0.1f32 as f64);
    let got = x.sum().unwrap().item::<f32>().unwrap() as f64;
    assert!((got - exact).abs() <= 1e-6 * exact, "sum {got} vs {exact}");
    let naive = (0..n).fold(0f32, |s, _| s + 0.1f32) as f64;
    assert!(
        (naive - exact).abs() > 1e-3 * exact,
        "naive f32 sum {naive} should drift"
    );
    let m = x.mean().unwrap().item::<f32>().unwrap();
    assert_eq!(m, 0.1f32);
    let r = x
        .reshape(&[10, -1])
        .unwrap()
        .sum_dim(&[1], false)
        .unwrap()
        .to_f64_vec();
    assert!(
        r.iter()
            .all(|&v| (v - exact / 10.0).abs() <= 1e-6 * exact / 10.0),
        "{r:?}"
    );
}

/// Sizes large enough for the parallel and blocked paths (many outputs, few outputs with a
/// long reduction split in chunks, contiguous outputs reduced side by side).
#[test]
fn large_reductions_take_every_path() {
    let cases: Vec<(Vec<usize>, Vec<i64>)> = vec![
        (vec![64, 1030], vec![0]),
        (vec![64, 1030], vec![1]),
        (vec![3, 40001], vec![1]),
        (vec![3, 40001], vec![0, 1]),
        (vec![40001, 3], vec![0]),
        (vec![9, 70, 60], vec![0, 2]),
    ];
    for (shape, dims) in cases {
        for (name, x) in variants(&shape, DType::F32) {
            let ctx = format!("large {name} {shape:?} {dims:?}");
            let got = x.sum_dim(&dims, false).unwrap();
            check(&ctx, &x, Some(&dims), false, &got, DType::F32, &|g| {
                g.iter().sum()
            });
            let got = x.var(Some(&dims), 1.0, false).unwrap();
            check(&ctx, &x, Some(&dims), false, &got, DType::F32, &|g| {
                variance(g, 1.0)
            });
            let got = x.amax_dim(&dims, true).unwrap();
            check(&ctx, &x, Some(&dims), true, &got, DType::F32, &fmax);
            let got = x.logsumexp(&dims, false).unwrap();
            check(&ctx, &x, Some(&dims), false, &got, DType::F32, &lse);
            if dims.len() == 1 {
                let got = x.argmax(Some(dims[0]), false).unwrap();
                check(&ctx, &x, Some(&dims), false, &got, DType::I64, &|g| {
                    argext(g, true)
                });
                let got = x.softmax(dims[0]).unwrap();
                check_rows(&ctx, &x, dims[0], &got, DType::F32, &|v| {
                    softmax_ref(v, false)
                });
            }
        }
    }
    // ties spread over many chunks of a long reduction: the first index wins
    let mut v = vec![0.0; 100_000];
    for i in [70_001, 30_000, 99_999] {
        v[i] = 7.0;
    }
    let x = make(&v, &[100_000], DType::F32);
    assert_eq!(
        x.argmax(None, false).unwrap().item::<i64>().unwrap(),
        30_000
    );
    v[80_000] = f64::NAN;
    v[90_000] = f64::NAN;
    let x = make(&v, &[100_000], DType::F32);
    assert_eq!(
        x.argmin(Some(0), false).unwrap().item::<i64>().unwrap(),
        80_000
    );
}

fn view_strategy() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, usize, Vec<i64>, bool)> {
    (1usize..=4)
        .prop_flat_map(|nd| {
            (
                proptest::collection::vec(0usize..5, nd),
                Just((0..nd).collect::<Vec<usize>>()).prop_shuffle(),
                1usize..3,
                proptest::collection::vec(any::<bool>(), nd),
                any::<bool>(),
            )
        })
        .prop_map(|(shape, perm, step, pick, keepdim)| {
            let dims = pick
                .iter()
                .enumerate()
                .filter(|(_, p)| **p)
                .map(|(i, _)| i as i64)
                .collect();
            (shape, perm, step, dims, keepdim)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A reduction of a permuted, stepped view equals the same reduction of its contiguous copy.
    #[test]
    fn reductions_on_views_equal_contiguous((shape, perm, step, dims, keepdim) in view_strategy()) {
        let mut phys = shape.clone();
        phys[0] *= step;
        let vals: Vec<f64> = (0..numel(&phys)).map(|i| val(i, DType::F64)).collect();
        let base = make(&vals, &phys, DType::F64).slice(0, None, None, step as i64).unwrap();
        let perm_i: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
        let v = base.permute(&perm_i).unwrap();
        let c = v.contiguous().unwrap();
        prop_assert_eq!(v.sum_dim(&dims, keepdim).unwrap().to_f64_vec(), c.sum_dim(&dims, keepdim).unwrap().to_f64_vec());
        prop_assert_eq!(v.any_dim(&dims, keepdim).unwrap().to_f64_vec(), c.any_dim(&dims, keepdim).unwrap().to_f64_vec());
        let a = v.var(Some(&dims), 1.0, keepdim).unwrap().to_f64_vec();
        let b = c.var(Some(&dims), 1.0, keepdim).unwrap().to_f64_vec();
        for (x, y) in a.iter().zip(&b) {
            prop_assert!(close(*x, *y, 1e-12), "{} vs {}", x, y);
        }
        if v.numel() > 0 && dims.iter().all(|&d| v.shape()[d as usize] > 0) {
            prop_assert_eq!(v.amax_dim(&dims, keepdim).unwrap().to_f64_vec(), c.amax_dim(&dims, keepdim).unwrap().to_f64_vec());
        }
        let d = dims.first().copied().unwrap_or(0);
        if v.shape()[d as usize] > 0 {
            prop_assert_eq!(v.argmin(Some(d), keepdim).unwrap().to_i64_vec(), c.argmin(Some(d), keepdim).unwrap().to_i64_vec());
        }
        prop_assert_eq!(v.cumsum(d).unwrap().to_f64_vec(), c.cumsum(d).unwrap().to_f64_vec());
        prop_assert_eq!(v.log_softmax(d).unwrap().to_f64_vec(), c.log_softmax(d).unwrap().to_f64_vec());
    }
}

#[test]
fn long_f32_rows_take_their_extremes_on_the_strip_helpers() {
    use smelt::exec::{CompileOptions, CompiledFn};
    // Rows longer than the helpers' 32 lanes, with a NaN, an infinity or a new extreme
    // in the first chunk, mid-row or in the tail: eager (native helper), compiled (strip
    // helper) and the reference interpreter all give the f64 fold's value.
    let (rows, n) = (4usize, 4099usize);
    let base: Vec<f64> = (0..rows * n)
        .map(|i| ((i * 7919 % 10007) as f64 - 5000.0) * 1e-3)
        .collect();
    let g = smelt::ir::parse_module(
        "graph m(%x: f32[4,4099]) {
  %a = amax(%x, dim=[1])
  %b = amin(%x, dim=[1], keepdim=true)
  return %a, %b
}
",
        "m",
    )
    .unwrap();
    let f = CompiledFn::compile(&g.graphs[0], &CompileOptions::default()).unwrap();
    for at in [3usize, 2048, 4097] {
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 9.0, -9.0] {
            let mut xs = base.clone();
            xs[n + at] = v; // row 1 only
            let x = Tensor::from_vec(xs.clone(), &[rows, n])
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            let want = |max: bool| -> Vec<f64> {
                xs.chunks(n)
                    .map(|r| {
                        let r: Vec<f64> = r.iter().map(|&v| v as f32 as f64).collect();
                        if r.iter().any(|v| v.is_nan()) {
                            f64::NAN
                        } else if max {
                            r.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                        } else {
                            r.iter().copied().fold(f64::INFINITY, f64::min)
                        }
                    })
                    .collect()
            };
            let same = |got: &[f64], want: &[f64], what: &str| {
                for (g, w) in got.iter().zip(want) {
                    assert!(
                        g == w || (g.is_nan() && w.is_nan()),
                        "{what} at {at}, {v}: {got:?} vs {want:?}"
                    );
                }
            };
            let out = f.call(std::slice::from_ref(&x)).unwrap();
            same(&out[0].to_f64_vec(), &want(true), "compiled amax");
            same(&out[1].to_f64_vec(), &want(false), "compiled amin");
            same(
                &x.amax_dim(&[1], false).unwrap().to_f64_vec(),
                &want(true),
                "eager amax",
            );
            same(
                &x.amin_dim(&[1], false).unwrap().to_f64_vec(),
                &want(false),
                "eager amin",
            );
            let interp = smelt::runtime::interp::run(&g.graphs[0], &[("x", x.clone())]).unwrap();
            same(&interp[0].to_f64_vec(), &want(true), "interpreted amax");
        }
    }
}
