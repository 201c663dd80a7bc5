//! Indexing ops against f64 references computed here, for several dtypes and view inputs.

use proptest::prelude::*;
use smelt::ir::op::Op;
use smelt::runtime::apply;
use smelt::{DType, Tensor};

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::I32,
];

/// A tensor of `shape` holding `data` (given as f64) in `dtype`.
fn t(data: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    let x = Tensor::from_vec(data.to_vec(), shape).unwrap();
    apply(Op::To { dtype }, &[&x]).unwrap()
}

fn idx(data: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(data.to_vec(), shape).unwrap()
}

/// Small integers, exact in every dtype.
fn seq(n: usize) -> Vec<f64> {
    (0..n).map(|i| ((i * 7) % 11) as f64 - 3.0).collect()
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// Row-major multi-index of position `p`.
fn unravel(mut p: usize, shape: &[usize]) -> Vec<usize> {
    let mut out = vec![0; shape.len()];
    for k in (0..shape.len()).rev() {
        out[k] = p % shape[k];
        p /= shape[k];
    }
    out
}

fn ravel(ix: &[usize], shape: &[usize]) -> usize {
    ix.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
}

/// `x` viewed through a transpose of a contiguous copy: same values, other strides.
fn transposed_view(data: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    let n = shape.len();
    let mut rev: Vec<usize> = shape.to_vec();
    rev.swap(n - 2, n - 1);
    // lay out the transpose, then transpose back: values equal `data` in `shape`
    let mut tdata = vec![0.0; data.len()];
    for (p, v) in data.iter().enumerate() {
        let mut ix = unravel(p, shape);
        ix.swap(n - 2, n - 1);
        tdata[ravel(&ix, &rev)] = *v;
    }
    let v = t(&tdata, &rev, dtype).transpose(-2, -1).unwrap();
    assert!(!v.is_contiguous() || shape[n - 1] <= 1 || shape[n - 2] <= 1);
    v
}

#[test]
fn cat_and_stack_match_reference_and_promote() {
    for dt in DTYPES {
        let a = t(&seq(6), &[2, 3], dt);
        let b = transposed_view(&seq(9), &[3, 3], dt);
        let c = Tensor::cat(&[&a, &b], 0).unwrap();
        assert_eq!(c.shape(), &[5, 3]);
        let mut want = seq(6);
        want.extend(seq(9));
        assert_eq!(c.to_f64_vec(), want, "{dt}");
        let d = Tensor::cat(&[&a, &a.narrow(1, 1, 2).unwrap()], -1).unwrap();
        let s = seq(6);
        assert_eq!(
            d.to_f64_vec(),
            vec![s[0], s[1], s[2], s[1], s[2], s[3], s[4], s[5], s[4], s[5]]
        );
        let st = Tensor::stack(&[&a, &a], 1).unwrap();
        assert_eq!(st.shape(), &[2, 2, 3]);
        assert_eq!(
            st.to_f64_vec(),
            vec![
                s[0], s[1], s[2], s[0], s[1], s[2], s[3], s[4], s[5], s[3], s[4], s[5]
            ]
        );
    }
    // promotion as torch.cat: int32 with float32 gives float32
    let i = t(&[1.0, 2.0], &[2], DType::I32);
    let f = t(&[0.5], &[1], DType::F32);
    let c = Tensor::cat(&[&i, &f], 0).unwrap();
    assert_eq!(c.dtype(), DType::F32);
    assert_eq!(c.to_f64_vec(), vec![1.0, 2.0, 0.5]);
    let s = Tensor::stack(&[&i, &t(&[3.0, 4.0], &[2], DType::F64)], -1).unwrap();
    assert_eq!(s.dtype(), DType::F64);
    assert_eq!(s.shape(), &[2, 2]);
    assert_eq!(s.to_f64_vec(), vec![1.0, 3.0, 2.0, 4.0]);
    // legacy empty 1-D inputs are skipped; 0-d inputs to stack give a 1-D result
    let e = Tensor::zeros(&[0], DType::F32);
    let m = t(&seq(4), &[2, 2], DType::F32);
    assert_eq!(Tensor::cat(&[&e, &m], 1).unwrap().shape(), &[2, 2]);
    let z = Tensor::stack(&[&Tensor::scalar(1.0), &Tensor::scalar(2.0)], 0).unwrap();
    assert_eq!(z.to_f64_vec(), vec![1.0, 2.0]);
    // expanded input
    let ex = t(&[1.0, 2.0], &[2, 1], DType::F32).expand(&[2, 3]).unwrap();
    let c = Tensor::cat(&[&ex, &ex], 1).unwrap();
    assert_eq!(
        c.to_f64_vec(),
        vec![1., 1., 1., 1., 1., 1., 2., 2., 2., 2., 2., 2.]
    );
}

#[test]
fn cat_errors() {
    let a = t(&seq(6), &[2, 3], DType::F32);
    let b = t(&seq(4), &[2, 2], DType::F32);
    assert_eq!(
        Tensor::cat(&[&a, &b], 0).unwrap_err().to_string(),
        "Sizes of tensors must match except in dimension 0. Expected size 3 but got size 2 for tensor number 1 in the list."
    );
    assert!(Tensor::cat(&[], 0).is_err());
    assert!(
        Tensor::stack(&[&a, &b], 0)
            .unwrap_err()
            .to_string()
            .contains("stack expects each tensor to be equal size")
    );
}

fn flip_ref(data: &[f64], shape: &[usize], dims: &[usize]) -> Vec<f64> {
    (0..data.len())
        .map(|p| {
            let mut ix = unravel(p, shape);
            for &d in dims {
                ix[d] = shape[d] - 1 - ix[d];
            }
            data[ravel(&ix, shape)]
        })
        .collect()
}

fn tri_ref(data: &[f64], shape: &[usize], diag: i64, lower: bool) -> Vec<f64> {
    let n = shape.len();
    (0..data.len())
        .map(|p| {
            let ix = unravel(p, shape);
            let diff = ix[n - 1] as i64 - ix[n - 2] as i64;
            let keep = if lower { diff <= diag } else { diff >= diag };
            if keep { data[p] } else { 0.0 }
        })
        .collect()
}

#[test]
fn flip_and_triangles() {
    for dt in DTYPES {
        let shape = [2, 3, 4];
        let data = seq(24);
        let x = transposed_view(&data, &shape, dt);
        for dims in [vec![0i64], vec![-1], vec![0, 2], vec![0, 1, 2]] {
            let w: Vec<usize> = dims
                .iter()
                .map(|&d| if d < 0 { (d + 3) as usize } else { d as usize })
                .collect();
            assert_eq!(
                x.flip(&dims).unwrap().to_f64_vec(),
                flip_ref(&data, &shape, &w),
                "{dt} {dims:?}"
            );
        }
        for diag in [-2, -1, 0, 1, 5] {
            assert_eq!(
                x.tril(diag).unwrap().to_f64_vec(),
                tri_ref(&data, &shape, diag, true),
                "{dt}"
            );
            assert_eq!(
                x.triu(diag).unwrap().to_f64_vec(),
                tri_ref(&data, &shape, diag, false),
                "{dt}"
            );
        }
    }
    let b = Tensor::from_vec(vec![true, true, false, true], &[2, 2]).unwrap();
    assert_eq!(
        b.tril(0).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false, true]
    );
    assert_eq!(
        b.flip(&[0, 1]).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, true, true]
    );
    let s = Tensor::scalar(4.0);
    assert_eq!(s.flip(&[]).unwrap().to_f64_vec(), vec![4.0]);
    assert!(t(&[1.0], &[1], DType::F32).tril(0).is_err());
    assert!(
        Tensor::zeros(&[0, 3], DType::F32)
            .flip(&[0])
            .unwrap()
            .shape()
            == [0, 3]
    );
    let e = t(&seq(4), &[4], DType::F32)
        .flip(&[0, 0])
        .unwrap_err()
        .to_string();
    assert_eq!(e, "dim 0 appears multiple times in the list of dims");
}

#[test]
fn index_select_matches_reference() {
    for dt in DTYPES {
        let shape = [3, 4];
        let data = seq(12);
        let x = transposed_view(&data, &shape, dt);
        let ix = [2i64, 0, 2, 1];
        let r = x.index_select(0, &idx(&ix, &[4])).unwrap();
        let want: Vec<f64> = ix
            .iter()
            .flat_map(|&i| data[i as usize * 4..i as usize * 4 + 4].to_vec())
            .collect();
        assert_eq!(r.shape(), &[4, 4]);
        assert_eq!(r.to_f64_vec(), want, "{dt}");
        let ix32 = t(&[3.0, 1.0], &[2], DType::I32);
        let r = x.index_select(-1, &ix32).unwrap();
        assert_eq!(
            r.to_f64_vec(),
            vec![data[3], data[1], data[7], data[5], data[11], data[9]]
        );
    }
    let x = t(&seq(6), &[2, 3], DType::F32);
    assert_eq!(x.index_select(1, &idx(&[], &[0])).unwrap().shape(), &[2, 0]);
    // 0-d self and 0-d index
    let s = Tensor::scalar(2.5);
    assert_eq!(
        s.index_select(0, &idx(&[0], &[])).unwrap().to_f64_vec(),
        vec![2.5]
    );
    // a strided index
    let big = idx(&[1, 9, 0, 9, 2, 9], &[6])
        .slice(0, Some(0), None, 2)
        .unwrap();
    assert_eq!(x.index_select(1, &big).unwrap().to_f64_vec(), {
        let s = seq(6);
        vec![s[1], s[0], s[2], s[4], s[3], s[5]]
    });
}

#[test]
fn index_errors_name_the_index_and_size() {
    let x = t(&seq(6), &[3, 2], DType::F32);
    let e = x
        .index_select(0, &idx(&[0, 5], &[2]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "index_select(): index 5 is out of range for dimension 0 with size 3"
    );
    let e = x
        .index_select(0, &idx(&[-1], &[1]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "index_select(): index -1 is out of range for dimension 0 with size 3"
    );
    let e = x.gather(1, &idx(&[0, 5], &[1, 2])).unwrap_err().to_string();
    assert_eq!(e, "index 5 is out of bounds for dimension 1 with size 2");
    let e = x.gather(0, &idx(&[-1], &[1, 1])).unwrap_err().to_string();
    assert_eq!(e, "index -1 is out of bounds for dimension 0 with size 3");
    let src = t(&seq(6), &[3, 2], DType::F32);
    let e = x
        .scatter(0, &idx(&[3], &[1, 1]), &src)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "index 3 is out of bounds for dimension 0 with size 3");
    let e = x
        .scatter_add(1, &idx(&[-2], &[1, 1]), &src)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "index -2 is out of bounds for dimension 1 with size 2");
    let w = t(&seq(6), &[3, 2], DType::F32);
    let e = Tensor::embedding(&idx(&[1, 3], &[2]), &w)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "embedding(): index 3 is out of range for dimension 0 with size 3"
    );
    let e = x
        .index_add(0, &idx(&[4], &[1]), &t(&[1., 1.], &[1, 2], DType::F32))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "index_add(): index 4 is out of range for dimension 0 with size 3"
    );
    let e = x
        .gather(0, &t(&[0.0], &[1, 1], DType::I32))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Expected dtype int64 for index"), "{e}");
    let e = x
        .index_select(0, &t(&[0.0], &[1], DType::F32))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Expected dtype int32/int64 for index"), "{e}");
}

fn gather_ref(x: &[f64], xs: &[usize], d: usize, ix: &[i64], is: &[usize]) -> Vec<f64> {
    (0..ix.len())
        .map(|p| {
            let mut m = unravel(p, is);
            m[d] = ix[p] as usize;
            x[ravel(&m, xs)]
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn scatter_ref(
    x: &[f64],
    xs: &[usize],
    d: usize,
    ix: &[i64],
    is: &[usize],
    src: &[f64],
    ss: &[usize],
    add: bool,
) -> Vec<f64> {
    let mut out = x.to_vec();
    for (p, &v) in ix.iter().enumerate() {
        let m = unravel(p, is);
        let s = src[ravel(&m, ss)];
        let mut o = m.clone();
        o[d] = v as usize;
        let q = ravel(&o, xs);
        out[q] = if add { out[q] + s } else { s };
    }
    out
}

/// `torch.scatter_reduce` (include_self) in f64: `r` combines an element with one value;
/// a mean divides by the count at the end, rounding down for integers.
#[allow(clippy::too_many_arguments)]
fn scatter_reduce_ref(
    x: &[f64],
    xs: &[usize],
    d: usize,
    ix: &[i64],
    is: &[usize],
    src: &[f64],
    reduce: &str,
    int: bool,
) -> Vec<f64> {
    let mut out = x.to_vec();
    let mut count = vec![1.0; x.len()];
    for (p, &v) in ix.iter().enumerate() {
        let m = unravel(p, is);
        let s = src[ravel(&m, is)];
        let mut o = m.clone();
        o[d] = v as usize;
        let q = ravel(&o, xs);
        out[q] = match reduce {
            "sum" | "mean" => out[q] + s,
            "prod" => out[q] * s,
            "amax" => out[q].max(s),
            _ => out[q].min(s),
        };
        count[q] += 1.0;
    }
    if reduce == "mean" {
        for (o, c) in out.iter_mut().zip(&count) {
            *o = if int { (*o / c).floor() } else { *o / c };
        }
    }
    out
}

/// PyTorch's documented examples of `scatter_reduce`, then every reduction on a transposed
/// view in several dtypes against the f64 reference.
#[test]
fn scatter_reduce_known_examples_and_reference() {
    // torch.scatter_reduce docs: input [1,2,3,4], index [0,1,0,1,2,1], src [1..6]
    let input = t(&[1., 2., 3., 4.], &[4], DType::F32);
    let src = t(&[1., 2., 3., 4., 5., 6.], &[6], DType::F32);
    let ix = idx(&[0, 1, 0, 1, 2, 1], &[6]);
    let r = |reduce: &str| {
        input
            .scatter_reduce(0, &ix, &src, reduce)
            .unwrap()
            .to_f64_vec()
    };
    assert_eq!(r("sum"), vec![5., 14., 8., 4.]);
    assert_eq!(r("amax"), vec![3., 6., 5., 4.]);
    assert_eq!(r("amin"), vec![1., 2., 3., 4.]);
    assert_eq!(r("prod"), vec![3., 96., 15., 4.]);
    assert_eq!(r("mean"), vec![(5.0f32 / 3.0) as f64, 3.5, 4., 4.]);
    // integers: the mean rounds down, -5 / 3 is -2
    let neg = t(&[-1., 7.], &[2], DType::I64);
    let m = neg
        .scatter_reduce(
            0,
            &idx(&[0, 0], &[2]),
            &t(&[-2., -2.], &[2], DType::I64),
            "mean",
        )
        .unwrap();
    assert_eq!(m.to_f64_vec(), vec![-2., 7.]);
    // NaN propagates through amax and amin, from either side
    let nan = t(&[f64::NAN, 1.], &[2], DType::F32);
    let mx = nan
        .scatter_reduce(
            0,
            &idx(&[0, 1], &[2]),
            &t(&[5., f64::NAN], &[2], DType::F32),
            "amax",
        )
        .unwrap()
        .to_f64_vec();
    assert!(mx[0].is_nan() && mx[1].is_nan(), "{mx:?}");
    let e = input.scatter_reduce(0, &ix, &src, "max").unwrap_err();
    assert!(
        e.to_string().contains("sum, prod, mean, amax or amin"),
        "{e}"
    );
    let e = input
        .scatter_reduce(0, &idx(&[4], &[1]), &src, "sum")
        .unwrap_err();
    assert!(e.to_string().contains("index 4 is out of bounds"), "{e}");
    for dt in [DType::F32, DType::F64, DType::I64, DType::I32] {
        let (xs, is) = ([3usize, 4], [2usize, 3]);
        let xd = seq(12);
        let x = transposed_view(&xd, &xs, dt);
        let ixd = [2i64, 0, 2, 2, 0, 0];
        let sd: Vec<f64> = (0..6).map(|v| v as f64 - 2.5).collect();
        let sd: Vec<f64> = if dt.is_float() {
            sd
        } else {
            sd.iter().map(|v| v.floor()).collect()
        };
        let sv = t(&sd, &is, dt);
        for reduce in ["sum", "prod", "mean", "amax", "amin"] {
            let got = x.scatter_reduce(0, &idx(&ixd, &is), &sv, reduce).unwrap();
            let want = scatter_reduce_ref(&xd, &xs, 0, &ixd, &is, &sd, reduce, !dt.is_float());
            let got = got.to_f64_vec();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{dt} {reduce}: {got:?} vs {want:?}"
                );
            }
        }
    }
}

#[test]
fn gather_scatter_known_examples() {
    // torch.gather docs: [[1,2],[3,4]].gather(1, [[0,0],[1,0]]) == [[1,1],[4,3]]
    let x = t(&[1., 2., 3., 4.], &[2, 2], DType::F32);
    let g = x.gather(1, &idx(&[0, 0, 1, 0], &[2, 2])).unwrap();
    assert_eq!(g.to_f64_vec(), vec![1., 1., 4., 3.]);
    // Tensor.scatter_ docs: zeros(3, 5).scatter(0, [[0, 1, 2, 0]], arange(1, 11).view(2, 5))
    let src = t(
        &(1..=10).map(f64::from).collect::<Vec<_>>(),
        &[2, 5],
        DType::F32,
    );
    let z = Tensor::zeros(&[3, 5], DType::F32);
    let s = z.scatter(0, &idx(&[0, 1, 2, 0], &[1, 4]), &src).unwrap();
    assert_eq!(
        s.to_f64_vec(),
        vec![1., 0., 0., 4., 0., 0., 2., 0., 0., 0., 0., 0., 3., 0., 0.]
    );
    // scatter_add accumulates repeated indices
    let ones = Tensor::ones(&[2, 5], DType::I64);
    let ix = idx(&[0, 1, 2, 0, 0, 1, 2, 0, 0, 0], &[2, 5]);
    let sa = Tensor::zeros(&[3, 5], DType::I64)
        .scatter_add(0, &ix, &ones)
        .unwrap();
    assert_eq!(
        sa.to_f64_vec(),
        vec![1., 0., 1., 2., 2., 1., 1., 0., 0., 0., 0., 1., 1., 0., 0.]
    );
    for dt in DTYPES {
        let (xs, is) = ([3usize, 4], [2usize, 3]);
        let xd = seq(12);
        let x = transposed_view(&xd, &xs, dt);
        let ixd = [2i64, 0, 1, 1, 2, 0];
        let ixt = idx(&ixd, &is);
        assert_eq!(
            x.gather(0, &ixt).unwrap().to_f64_vec(),
            gather_ref(&xd, &xs, 0, &ixd, &is),
            "{dt}"
        );
        let ixd1 = [3i64, 0, 1, 1, 2, 0];
        assert_eq!(
            x.gather(1, &idx(&ixd1, &is)).unwrap().to_f64_vec(),
            gather_ref(&xd, &xs, 1, &ixd1, &is)
        );
        let (sd, ss) = (
            seq(15).iter().map(|v| v * 2.0).collect::<Vec<_>>(),
            [3usize, 5],
        );
        let src = t(&sd, &ss, dt);
        let sv = src.narrow(1, 0, 4).unwrap(); // non-contiguous src
        let sdata: Vec<f64> = (0..12).map(|p| sd[p / 4 * 5 + p % 4]).collect();
        assert_eq!(
            x.scatter(1, &idx(&ixd1, &is), &sv).unwrap().to_f64_vec(),
            scatter_ref(&xd, &xs, 1, &ixd1, &is, &sdata, &xs, false),
            "{dt}"
        );
        assert_eq!(
            x.scatter_add(0, &ixt, &sv).unwrap().to_f64_vec(),
            scatter_ref(&xd, &xs, 0, &ixd, &is, &sdata, &xs, true),
            "{dt}"
        );
    }
    // the input is never modified
    let x = t(&[1., 2., 3.], &[3], DType::F32);
    let _ = x
        .scatter(0, &idx(&[0], &[1]), &t(&[9.], &[1], DType::F32))
        .unwrap();
    assert_eq!(x.to_f64_vec(), vec![1., 2., 3.]);
}

#[test]
fn index_add_and_embedding() {
    for dt in DTYPES {
        let x = transposed_view(&seq(12), &[3, 4], dt);
        let src = t(&seq(8), &[2, 4], dt);
        let r = x.index_add(0, &idx(&[2, 2], &[2]), &src).unwrap();
        let mut want = seq(12);
        for (i, row) in [2usize, 2].iter().enumerate() {
            for j in 0..4 {
                want[row * 4 + j] += seq(8)[i * 4 + j];
            }
        }
        assert_eq!(r.to_f64_vec(), want, "{dt}");
        let w = transposed_view(&seq(12), &[4, 3], dt);
        let e = Tensor::embedding(&idx(&[3, 0, 3, 1], &[2, 2]), &w).unwrap();
        assert_eq!(e.shape(), &[2, 2, 3]);
        let s = seq(12);
        let want: Vec<f64> = [3, 0, 3, 1]
            .iter()
            .flat_map(|&r| s[r * 3..r * 3 + 3].to_vec())
            .collect();
        assert_eq!(e.to_f64_vec(), want, "{dt}");
    }
    let w = t(&seq(6), &[3, 2], DType::F32);
    let e = Tensor::embedding(&t(&[2.0], &[], DType::I32), &w).unwrap();
    assert_eq!(e.shape(), &[2]);
    assert_eq!(e.to_f64_vec(), seq(6)[4..].to_vec());
    assert!(Tensor::embedding(&idx(&[0], &[1]), &t(&seq(3), &[3], DType::F32)).is_err());
}

#[test]
fn data_dependent_indexing_copies_while_views_share() {
    let x = t(&seq(12), &[3, 4], DType::F32);
    assert!(x.narrow(0, 1, 2).unwrap().shares_storage(&x));
    assert!(x.select(1, 2).unwrap().shares_storage(&x));
    let mask = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
    let m = x.index_mask(&mask).unwrap();
    assert!(!m.shares_storage(&x));
    assert_eq!(m.shape(), &[2, 4]);
    let s = seq(12);
    assert_eq!(m.to_f64_vec(), [&s[0..4], &s[8..12]].concat());
    let i = x.index_tensor(&idx(&[-1, 0, 2, 2], &[2, 2])).unwrap();
    assert!(!i.shares_storage(&x));
    assert_eq!(i.shape(), &[2, 2, 4]);
    assert_eq!(
        i.to_f64_vec(),
        [&s[8..12], &s[0..4], &s[8..12], &s[8..12]].concat()
    );
    let e = x.index_tensor(&idx(&[3], &[1])).unwrap_err().to_string();
    assert_eq!(e, "index 3 is out of bounds for dimension 0 with size 3");
    let e = x.index_tensor(&idx(&[-4], &[1])).unwrap_err().to_string();
    assert_eq!(e, "index -4 is out of bounds for dimension 0 with size 3");
    // a 2-D mask over a transposed view
    let v = x.t().unwrap();
    let m2 = Tensor::from_vec((0..12).map(|i| i % 5 == 0).collect::<Vec<_>>(), &[4, 3]).unwrap();
    let got = v.index_mask(&m2).unwrap();
    let vt: Vec<f64> = (0..12).map(|p| s[(p % 3) * 4 + p / 3]).collect();
    let want: Vec<f64> = (0..12).filter(|p| p % 5 == 0).map(|p| vt[p]).collect();
    assert_eq!(got.to_f64_vec(), want);
    assert_eq!(v.masked_select(&m2).unwrap().to_f64_vec(), want);
    let e = x
        .index_mask(&Tensor::from_vec(vec![true; 4], &[4]).unwrap())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "The shape of the mask [4] at index 0 does not match the shape of the indexed tensor [3, 4] at index 0"
    );
    // bool index through index_tensor is a mask; 0-d masks add a dim of 1 or 0
    assert_eq!(x.index_tensor(&mask).unwrap().shape(), &[2, 4]);
    let sc = Tensor::scalar(5.0);
    assert_eq!(
        sc.index_mask(&Tensor::scalar(true)).unwrap().to_f64_vec(),
        vec![5.0]
    );
    assert_eq!(sc.index_mask(&Tensor::scalar(false)).unwrap().shape(), &[0]);
}

#[test]
fn masked_select_broadcasts_and_nonzero() {
    let x = t(&seq(6), &[2, 3], DType::I64);
    let row = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
    let s = seq(6);
    assert_eq!(
        x.masked_select(&row).unwrap().to_f64_vec(),
        vec![s[0], s[2], s[3], s[5]]
    );
    // the mask can broadcast x too
    let col = t(&[7.0, 8.0], &[2, 1], DType::F32);
    let m = Tensor::from_vec(vec![true, false, true, true, false, false], &[2, 3]).unwrap();
    assert_eq!(
        col.masked_select(&m).unwrap().to_f64_vec(),
        vec![7., 7., 8.]
    );
    let e = x.masked_select(&x).unwrap_err().to_string();
    assert!(e.contains("expected BoolTensor"), "{e}");
    let z = t(&[0.0, 1.5, f64::NAN, 0.0, -0.0, 2.0], &[3, 2], DType::F32);
    let nz = z.nonzero().unwrap();
    assert_eq!(nz.dtype(), DType::I64);
    assert_eq!(nz.shape(), &[3, 2]);
    assert_eq!(nz.to_i64_vec(), vec![0, 1, 1, 0, 2, 1]);
    assert_eq!(Tensor::scalar(3).nonzero().unwrap().shape(), &[1, 0]);
    assert_eq!(
        Tensor::zeros(&[2, 0], DType::F32)
            .nonzero()
            .unwrap()
            .shape(),
        &[0, 2]
    );
    let tv = z.t().unwrap().nonzero().unwrap();
    assert_eq!(tv.to_i64_vec(), vec![0, 1, 1, 0, 1, 2]);
}

#[test]
fn sort_and_topk() {
    let nan = f64::NAN;
    let x = t(&[3.0, nan, 1.0, 3.0, -2.0, 1.0], &[6], DType::F32);
    let (v, i) = x.sort(0, false).unwrap();
    let vv = v.to_f64_vec();
    assert_eq!(&vv[..5], &[-2.0, 1.0, 1.0, 3.0, 3.0]);
    assert!(vv[5].is_nan());
    assert_eq!(i.to_i64_vec(), vec![4, 2, 5, 0, 3, 1]); // stable
    let (v, i) = x.sort(0, true).unwrap();
    assert!(v.to_f64_vec()[0].is_nan());
    assert_eq!(i.to_i64_vec(), vec![1, 0, 3, 2, 5, 4]); // stable descending
    for dt in DTYPES {
        let data = seq(12);
        let m = transposed_view(&data, &[3, 4], dt);
        let (v, i) = m.sort(0, true).unwrap();
        for c in 0..4 {
            let mut col: Vec<(f64, i64)> = (0..3).map(|r| (data[r * 4 + c], r as i64)).collect();
            col.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());
            for (r, (cv, ci)) in col.iter().enumerate() {
                assert_eq!(v.to_f64_vec()[r * 4 + c], *cv, "{dt}");
                assert_eq!(i.to_i64_vec()[r * 4 + c], *ci, "{dt}");
            }
        }
        let (tv, ti) = m.topk(2, -1, true, true).unwrap();
        assert_eq!(tv.shape(), &[3, 2]);
        for r in 0..3 {
            let mut row: Vec<f64> = data[r * 4..r * 4 + 4].to_vec();
            row.sort_by(|a, b| b.partial_cmp(a).unwrap());
            assert_eq!(&tv.to_f64_vec()[r * 2..r * 2 + 2], &row[..2]);
            for (j, want) in row.iter().take(2).enumerate() {
                let k = ti.to_i64_vec()[r * 2 + j] as usize;
                assert_eq!(data[r * 4 + k], *want);
            }
        }
        let (sv, _) = m.topk(1, 0, false, false).unwrap();
        let mins: Vec<f64> = (0..4)
            .map(|c| {
                (0..3)
                    .map(|r| data[r * 4 + c])
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        assert_eq!(sv.to_f64_vec(), mins);
    }
    // large integers compare exactly
    let big = idx(&[i64::MAX, i64::MAX - 1], &[2]);
    assert_eq!(big.sort(0, false).unwrap().1.to_i64_vec(), vec![1, 0]);
    let e = x.topk(7, 0, true, true).unwrap_err().to_string();
    assert_eq!(e, "selected index k out of range");
    assert_eq!(
        Tensor::scalar(2.0).sort(0, false).unwrap().0.to_f64_vec(),
        vec![2.0]
    );
    assert_eq!(
        Tensor::zeros(&[0, 3], DType::F32)
            .sort(1, false)
            .unwrap()
            .0
            .shape(),
        &[0, 3]
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Scattering a permutation and gathering it back gives the source.
    #[test]
    fn scatter_then_gather_round_trips(rows in 1usize..5, cols in 1usize..6, seed in 0u64..1000, dim in 0i64..2) {
        let shape = [rows, cols];
        let n = shape[dim as usize];
        let src = t(&seq(rows * cols), &shape, DType::F32);
        // along `dim`, every line gets its own rotation: unique indices per line
        let ix: Vec<i64> = (0..rows * cols)
            .map(|p| {
                let (r, c) = (p / cols, p % cols);
                let (pos, line) = if dim == 0 { (r, c) } else { (c, r) };
                ((pos + line + seed as usize) % n) as i64
            })
            .collect();
        let ixt = idx(&ix, &shape);
        let z = Tensor::zeros(&shape, DType::F32);
        let s = z.scatter(dim, &ixt, &src).unwrap();
        let back = s.gather(dim, &ixt).unwrap();
        prop_assert_eq!(back.to_f64_vec(), src.to_f64_vec());
    }

    /// `index_select` equals stacking `select`s.
    #[test]
    fn index_select_is_stacked_selects(shape in prop::collection::vec(1usize..4, 1..4), picks in prop::collection::vec(0usize..100, 0..5), d in 0usize..3) {
        let d = d % shape.len();
        let x = t(&seq(numel(&shape)), &shape, DType::F64);
        let ix: Vec<i64> = picks.iter().map(|p| (p % shape[d]) as i64).collect();
        let got = x.index_select(d as i64, &idx(&ix, &[ix.len()])).unwrap();
        if ix.is_empty() {
            let mut s = shape.clone();
            s[d] = 0;
            prop_assert_eq!(got.shape(), &s[..]);
        } else {
            let parts: Vec<Tensor> = ix.iter().map(|&i| x.select(d as i64, i).unwrap()).collect();
            let refs: Vec<&Tensor> = parts.iter().collect();
            let want = Tensor::stack(&refs, d as i64).unwrap();
            prop_assert_eq!(got.shape(), want.shape());
            prop_assert_eq!(got.to_f64_vec(), want.to_f64_vec());
        }
    }

    /// `flip` on random shapes and dims matches the index reference.
    #[test]
    fn flip_matches_reference(shape in prop::collection::vec(0usize..4, 1..4), mask in 0u8..8) {
        let data = seq(numel(&shape));
        let x = t(&data, &shape, DType::I64);
        let dims: Vec<usize> = (0..shape.len()).filter(|k| mask >> k & 1 == 1).collect();
        let di: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let f = x.flip(&di).unwrap();
        prop_assert_eq!(f.shape(), &shape[..]);
        prop_assert_eq!(f.try_to_f64_vec().unwrap(), flip_ref(&data, &shape, &dims));
    }
}

#[test]
fn devices() {
    use smelt::Device;
    let x = t(&seq(4), &[2, 2], DType::F32);
    let c = x.cpu().unwrap();
    assert!(c.shares_storage(&x));
    assert_eq!(c.data_ptr(), x.data_ptr());
    assert!(x.to_device(Device::Cpu).unwrap().shares_storage(&x));
    if smelt::runtime::cuda::is_available() {
        return; // tests/cuda_exec.rs covers the GPU
    }
    for r in [x.cuda(), x.to_device(Device::Cuda(1))] {
        let e = r.unwrap_err();
        assert!(matches!(e, smelt::Error::Device(_)));
        assert!(e.to_string().contains("NVIDIA driver"), "{e}");
    }
}

/// Compiled `tril`/`triu` (a `where` over positions, fused with what follows) agree with
/// the f64 reference for every dtype, diagonal, and a transposed operand.
#[test]
fn compiled_triangles_match_the_reference() {
    let shape = [2, 3, 4];
    let data = seq(24);
    let x = t(&data, &shape, DType::F64);
    for dt in DTYPES.into_iter().chain([DType::Bool]) {
        let xd = apply(Op::To { dtype: dt }, &[&x]).unwrap();
        let want_data: Vec<f64> = xd.to_f64_vec();
        for diag in [-2, -1, 0, 1, 5] {
            for (op, lower) in [("tril", true), ("triu", false)] {
                let text = format!(
                    "graph tri(%x: {dt}[2,4,3]) {{\n  %t = transpose(%x, dim0=1, dim1=2)\n  %y = {op}(%t, diagonal={diag})\n  %z = neg(%y)\n  return %y, %z\n}}\n"
                );
                let text = if dt == DType::Bool {
                    text.replace("%z = neg(%y)", "%z = logical_not(%y)")
                } else {
                    text
                };
                let g = smelt::ir::text::parse_module(&text, "tri")
                    .unwrap()
                    .graphs
                    .remove(0);
                // the transposed view of a [2, 4, 3] input holds `data` in [2, 3, 4] order
                let xt = apply(Op::Transpose { dim0: 1, dim1: 2 }, &[&xd]).unwrap();
                let xt = apply(Op::Contiguous, &[&xt]).unwrap();
                let f = smelt::exec::CompiledFn::compile(&g, &Default::default()).unwrap();
                let got = f.call(&[xt]).unwrap();
                let want = tri_ref(&want_data, &shape, diag, lower);
                assert_eq!(got[0].to_f64_vec(), want, "{op} {dt} {diag}");
                assert_eq!(got[0].dtype(), dt);
                let neg: Vec<f64> = match dt {
                    DType::Bool => want.iter().map(|&v| f64::from(v == 0.0)).collect(),
                    _ => want.iter().map(|&v| -v).collect(),
                };
                assert_eq!(got[1].to_f64_vec(), neg, "{op} {dt} {diag} then neg");
            }
        }
    }
}
