//! matmul and linear against a naive f64 triple loop written here.

use proptest::prelude::*;
use smelt::runtime::element::round_to_dtype;
use smelt::runtime::storage::allocation_count;
use smelt::{DType, Element, Tensor};

fn make(vals: &[f64], shape: &[usize], dt: DType) -> Tensor {
    smelt::dispatch!(dt, T => Tensor::from_vec(
        vals.iter().map(|&v| <T as Element>::from_f64(v)).collect::<Vec<T>>(), shape).unwrap())
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// Small values (multiples of 1/4) so f16 and bf16 hold inputs exactly.
fn vals(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 31 + seed * 17) % 13) as f64 * 0.25 - 1.5)
        .collect()
}

fn rand_tensor(shape: &[usize], dt: DType, seed: usize) -> Tensor {
    make(&vals(numel(shape), seed), shape, dt)
}

/// PyTorch's matmul on row-major f64 arrays: 1-D operands promoted then squeezed, batch
/// dims broadcast.
fn ref_matmul(sa: &[usize], a: &[f64], sb: &[usize], b: &[f64]) -> (Vec<usize>, Vec<f64>) {
    let a2: Vec<usize> = if sa.len() == 1 {
        vec![1, sa[0]]
    } else {
        sa.to_vec()
    };
    let b2: Vec<usize> = if sb.len() == 1 {
        vec![sb[0], 1]
    } else {
        sb.to_vec()
    };
    let (m, k, n) = (a2[a2.len() - 2], a2[a2.len() - 1], b2[b2.len() - 1]);
    let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let nb = ba.len().max(bb.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        let mut v = vec![1; nb - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (pa, pb) = (pad(ba), pad(bb));
    let batch: Vec<usize> = pa.iter().zip(&pb).map(|(&x, &y)| x.max(y)).collect();
    let mut out = vec![];
    for bi in 0..numel(&batch) {
        // batch index → each operand's batch offset (size-1 dims broadcast)
        let (mut rem, mut oa, mut ob, mut sta, mut stb) = (bi, 0, 0, 1, 1);
        for d in (0..nb).rev() {
            let i = rem % batch[d];
            rem /= batch[d];
            oa += if pa[d] == 1 { 0 } else { i * sta };
            ob += if pb[d] == 1 { 0 } else { i * stb };
            sta *= pa[d];
            stb *= pb[d];
        }
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for l in 0..k {
                    s += a[oa * m * k + i * k + l] * b[ob * k * n + l * n + j];
                }
                out.push(s);
            }
        }
    }
    let mut shape = batch;
    if sa.len() > 1 {
        shape.push(m);
    }
    if sb.len() > 1 {
        shape.push(n);
    }
    (shape, out)
}

fn tol(dt: DType) -> f64 {
    match dt {
        DType::F16 => 4e-3,
        DType::BF16 => 2e-2,
        DType::F32 => 1e-5,
        DType::F64 => 1e-12,
        _ => 0.0,
    }
}

fn check_matmul(ctx: &str, a: &Tensor, b: &Tensor, got: &Tensor) {
    let (shape, want) = ref_matmul(a.shape(), &a.to_f64_vec(), b.shape(), &b.to_f64_vec());
    assert_eq!(got.shape(), &shape[..], "{ctx}: shape");
    assert_eq!(got.dtype(), a.dtype(), "{ctx}: dtype");
    let dt = a.dtype();
    let want: Vec<f64> = if dt.is_float() {
        want.iter().map(|&w| round_to_dtype(w, dt)).collect()
    } else {
        want
    };
    let scale = want.iter().fold(1.0f64, |m, w| m.max(w.abs()));
    for (i, (g, w)) in got.to_f64_vec().iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= tol(dt) * scale,
            "{ctx}: element {i}: got {g}, want {w}"
        );
    }
}

const DTYPES: [DType; 6] = [
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
];

#[test]
fn matmul_shapes_and_dtypes() {
    let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
        (vec![5], vec![5]),
        (vec![3], vec![3, 4]),
        (vec![2, 3], vec![3]),
        (vec![2, 3], vec![3, 4]),
        (vec![1, 1], vec![1, 1]),
        (vec![7, 33], vec![33, 7]),
        (vec![33, 1], vec![1, 33]),
        (vec![2, 3, 4], vec![2, 4, 5]),
        (vec![2, 1, 3, 4], vec![5, 4, 2]),
        (vec![2, 3, 4], vec![4]),
        (vec![4], vec![2, 4, 3]),
        (vec![3, 4], vec![2, 4, 5]),
        (vec![2, 3, 4], vec![4, 5]),
        (vec![1, 3, 4], vec![6, 4, 2]),
    ];
    for dt in DTYPES {
        for (sa, sb) in &cases {
            let (a, b) = (rand_tensor(sa, dt, 1), rand_tensor(sb, dt, 2));
            let got = a.matmul(&b).unwrap();
            check_matmul(&format!("{dt} {sa:?}x{sb:?}"), &a, &b, &got);
        }
    }
}

#[test]
fn matmul_reads_views_in_place() {
    for dt in DTYPES {
        // transposed operands
        let a = rand_tensor(&[7, 5], dt, 3).t().unwrap();
        let b = rand_tensor(&[9, 7], dt, 4).t().unwrap();
        check_matmul(&format!("{dt} transposed"), &a, &b, &a.matmul(&b).unwrap());
        // stepped slices (no unit stride in either dim of a)
        let a = rand_tensor(&[6, 10], dt, 5)
            .slice(0, None, None, 2)
            .unwrap()
            .slice(1, None, None, 2)
            .unwrap();
        let b = rand_tensor(&[5, 8], dt, 6)
            .slice(1, Some(1), None, 3)
            .unwrap();
        check_matmul(&format!("{dt} stepped"), &a, &b, &a.matmul(&b).unwrap());
        // expanded operands and batch dims with stride 0
        let a = rand_tensor(&[1, 4], dt, 7).expand(&[3, 4]).unwrap();
        let b = rand_tensor(&[4, 1], dt, 8).expand(&[2, 4, 5]).unwrap();
        check_matmul(&format!("{dt} expanded"), &a, &b, &a.matmul(&b).unwrap());
        // batched transposes
        let a = rand_tensor(&[2, 4, 3], dt, 9).transpose(1, 2).unwrap();
        let b = rand_tensor(&[5, 4, 2], dt, 10).permute(&[2, 1, 0]).unwrap();
        check_matmul(
            &format!("{dt} batched views"),
            &a,
            &b,
            &a.matmul(&b).unwrap(),
        );
    }
}

#[test]
fn large_products_match() {
    for dt in [DType::F32, DType::F64, DType::BF16] {
        let a = rand_tensor(&[70, 65], dt, 11);
        let b = rand_tensor(&[80, 65], dt, 12).t().unwrap();
        check_matmul(&format!("{dt} large"), &a, &b, &a.matmul(&b).unwrap());
        let a = rand_tensor(&[64, 9, 17], dt, 13);
        let b = rand_tensor(&[17, 10], dt, 14);
        check_matmul(&format!("{dt} many small"), &a, &b, &a.matmul(&b).unwrap());
    }
}

#[test]
fn empty_products() {
    for dt in DTYPES {
        let a = rand_tensor(&[2, 0], dt, 1);
        let b = rand_tensor(&[0, 3], dt, 2);
        let c = a.matmul(&b).unwrap();
        assert_eq!(c.shape(), &[2, 3]);
        assert!(c.to_f64_vec().iter().all(|&v| v == 0.0), "{dt}");
        let d = rand_tensor(&[0, 4], dt, 1)
            .matmul(&rand_tensor(&[4, 3], dt, 2))
            .unwrap();
        assert_eq!(d.shape(), &[0, 3]);
        let e = rand_tensor(&[0], dt, 1)
            .matmul(&rand_tensor(&[0], dt, 2))
            .unwrap();
        assert_eq!(e.shape(), &[] as &[usize]);
        assert_eq!(e.item_f64().unwrap(), 0.0);
        let f = rand_tensor(&[0, 2, 3], dt, 1)
            .matmul(&rand_tensor(&[3, 4], dt, 2))
            .unwrap();
        assert_eq!(f.shape(), &[0, 2, 4]);
    }
}

#[test]
fn integer_products_wrap() {
    let a = Tensor::from_vec(vec![i64::MAX, 2], &[1, 2]).unwrap();
    let b = Tensor::from_vec(vec![2i64, 3], &[2, 1]).unwrap();
    let want = i64::MAX.wrapping_mul(2).wrapping_add(6);
    assert_eq!(a.matmul(&b).unwrap().to_vec::<i64>().unwrap(), vec![want]);
    let a = Tensor::from_vec(vec![100u8, 3], &[2]).unwrap();
    let b = Tensor::from_vec(vec![3u8, 1], &[2]).unwrap();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.dtype(), DType::U8);
    assert_eq!(c.item::<u8>().unwrap(), 303u32 as u8);
}

fn err(a: &[usize], b: &[usize]) -> String {
    let (a, b) = (rand_tensor(a, DType::F32, 0), rand_tensor(b, DType::F32, 0));
    a.matmul(&b).unwrap_err().to_string()
}

#[test]
fn matmul_error_messages() {
    assert_eq!(
        err(&[2, 3], &[4, 5]),
        "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"
    );
    assert_eq!(
        err(&[3], &[4, 5]),
        "mat1 and mat2 shapes cannot be multiplied (1x3 and 4x5)"
    );
    assert_eq!(
        err(&[2, 2, 3], &[4, 5]),
        "mat1 and mat2 shapes cannot be multiplied (4x3 and 4x5)"
    );
    assert_eq!(
        err(&[2, 3], &[4]),
        "size mismatch, got input (2), mat (2x3), vec (4)"
    );
    assert_eq!(
        err(&[3], &[4]),
        "inconsistent tensor size, expected tensor [3] and src [4] to have the same number of elements, but got 3 and 4 elements respectively"
    );
    assert_eq!(
        err(&[2, 2, 3], &[2, 4, 5]),
        "Expected size for first two dimensions of batch2 tensor to be: [2, 3] but got: [2, 4]."
    );
    assert_eq!(
        err(&[], &[3]),
        "both arguments to matmul need to be at least 1D, but they are 0D and 1D"
    );
    assert!(err(&[2, 2, 3], &[3, 3, 4]).contains("must match the size of tensor b"));
    let a = rand_tensor(&[2, 2], DType::F32, 0);
    let b = rand_tensor(&[2, 2], DType::F64, 0);
    assert!(a.matmul(&b).unwrap_err().to_string().contains("same dtype"));
    let c = rand_tensor(&[2, 2], DType::Bool, 0);
    assert!(
        c.matmul(&c)
            .unwrap_err()
            .to_string()
            .contains("not implemented for 'Bool'")
    );
}

fn ref_linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> (Vec<usize>, Vec<f64>) {
    let ws = w.shape();
    let wt: Vec<f64> = if ws.len() == 2 {
        let wv = w.to_f64_vec();
        (0..ws[1])
            .flat_map(|j| (0..ws[0]).map(move |i| (i, j)))
            .map(|(i, j)| wv[i * ws[1] + j])
            .collect()
    } else {
        w.to_f64_vec()
    };
    let wts: Vec<usize> = ws.iter().rev().copied().collect();
    let (shape, mut out) = ref_matmul(x.shape(), &x.to_f64_vec(), &wts, &wt);
    if let Some(b) = b {
        let bv = b.to_f64_vec();
        let n = bv.len();
        for (i, o) in out.iter_mut().enumerate() {
            *o += bv[i % n];
        }
    }
    (shape, out)
}

#[test]
fn linear_matches_reference_without_copying_the_weight() {
    for dt in [DType::F16, DType::BF16, DType::F32, DType::F64, DType::I64] {
        for (sx, sw, bias) in [
            (vec![4, 3], vec![5, 3], true),
            (vec![4, 3], vec![5, 3], false),
            (vec![2, 4, 3], vec![5, 3], true),
            (vec![3], vec![5, 3], true),
            (vec![4, 3], vec![3], false),
            (vec![4, 0], vec![5, 0], true),
        ] {
            let x = rand_tensor(&sx, dt, 1);
            let w = rand_tensor(&sw, dt, 2);
            let b = bias.then(|| rand_tensor(&sw[..1], dt, 3));
            let got = x.linear(&w, b.as_ref()).unwrap();
            let (shape, want) = ref_linear(&x, &w, b.as_ref());
            assert_eq!(got.shape(), &shape[..], "{dt} {sx:?} {sw:?}");
            for (g, w) in got.to_f64_vec().iter().zip(&want) {
                let w = if dt.is_float() {
                    round_to_dtype(*w, dt)
                } else {
                    *w
                };
                assert!(
                    (g - w).abs() <= tol(dt) * (1.0 + w.abs()) * 4.0,
                    "{dt} {sx:?}: {g} vs {w}"
                );
            }
        }
    }
    let x = rand_tensor(&[8, 16], DType::F32, 1);
    let w = rand_tensor(&[4, 16], DType::F32, 2);
    let b = rand_tensor(&[4], DType::F32, 3);
    let before = allocation_count();
    x.linear(&w, Some(&b)).unwrap();
    assert_eq!(
        allocation_count(),
        before + 1,
        "only the output is allocated"
    );
    let e = x
        .linear(&rand_tensor(&[4, 15], DType::F32, 2), None)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "mat1 and mat2 shapes cannot be multiplied (8x16 and 15x4)"
    );
}

#[test]
fn products_overwrite_recycled_buffers() {
    // a freed buffer of the output's size full of NaN: the storage pool hands it to the next
    // product, whose GEMM must write every element without reading it
    let (m, k, n) = (64, 48, 301);
    let x = rand_tensor(&[m, k], DType::F32, 1);
    let w = rand_tensor(&[n, k], DType::F32, 2);
    let b = rand_tensor(&[n], DType::F32, 3);
    let (shape, want) = ref_linear(&x, &w, Some(&b));
    let (_, want_nobias) = ref_linear(&x, &w, None);
    for bias in [Some(&b), None] {
        let nan = Tensor::full(&[m, n], f64::NAN, Some(DType::F32)).unwrap();
        let at = nan.data_ptr();
        drop(nan);
        let got = x.linear(&w, bias).unwrap();
        assert_eq!(got.data_ptr(), at, "the output reuses the freed buffer");
        assert_eq!(got.shape(), &shape[..]);
        let want = if bias.is_some() { &want } else { &want_nobias };
        for (g, w) in got.to_f64_vec().iter().zip(want) {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }
}

fn shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, bool, bool)> {
    (
        0usize..3,
        0usize..3,
        0usize..6,
        0usize..6,
        0usize..6,
        1usize..3,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(da, db, m, k, n, bt, ta, tb)| {
            let a = match da {
                0 => vec![k],
                1 => vec![m, k],
                _ => vec![bt, m, k],
            };
            let b = match db {
                0 => vec![k],
                1 => vec![k, n],
                _ => vec![if da == 2 { 1 } else { bt }, k, n],
            };
            (a, b, ta, tb)
        })
}

/// A tensor of logical shape `s`, stored transposed in its last two dims when `t`.
fn maybe_transposed(s: &[usize], t: bool, seed: usize) -> Tensor {
    if !t || s.len() < 2 {
        return rand_tensor(s, DType::F64, seed);
    }
    let mut p = s.to_vec();
    let n = p.len();
    p.swap(n - 2, n - 1);
    rand_tensor(&p, DType::F64, seed).transpose(-1, -2).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matmul_equals_naive_loop((sa, sb, ta, tb) in shapes()) {
        let a = maybe_transposed(&sa, ta, 1);
        let b = maybe_transposed(&sb, tb, 2);
        let got = a.matmul(&b).unwrap();
        check_matmul(&format!("{sa:?} {sb:?}"), &a, &b, &got);
        let f = a.to_f64_vec();
        let a32 = make(&f, a.shape(), DType::F32);
        let b32 = make(&b.to_f64_vec(), b.shape(), DType::F32);
        check_matmul("f32", &a32, &b32, &a32.matmul(&b32).unwrap());
    }
}
