//! In-place ops and out= forms: writes through views, version counters, no allocations,
//! PyTorch's overlap, cast and shape rules.

use smelt::ir::op::{BinaryOp, Op};
use smelt::runtime::apply;
use smelt::runtime::storage::allocation_count;
use smelt::{DType, Scalar, Tensor};

fn t(data: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    let x = Tensor::from_vec(data.to_vec(), shape).unwrap();
    apply(Op::To { dtype }, &[&x]).unwrap()
}

fn seq(n: usize) -> Vec<f64> {
    (0..n).map(|i| ((i * 7) % 11) as f64 - 3.0).collect()
}

const DTYPES: [DType; 5] = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64];

#[test]
fn in_place_through_a_view_changes_the_base() {
    for dt in DTYPES {
        let base = t(&seq(12), &[3, 4], dt);
        let v0 = base.version();
        // a narrow view of the transpose: base elements (1..3, 1) and (1..3, 2)
        let view = base
            .t()
            .unwrap()
            .narrow(0, 1, 2)
            .unwrap()
            .narrow(1, 1, 2)
            .unwrap();
        assert!(view.shares_storage(&base));
        view.add_scalar_(10).unwrap();
        let mut want = seq(12);
        for r in 1..3 {
            for c in 1..3 {
                want[r * 4 + c] += 10.0;
            }
        }
        assert_eq!(base.to_f64_vec(), want, "{dt}");
        assert!(base.version() > v0);
        let other = t(&[1.0, 2.0], &[2], dt);
        view.mul_(&other).unwrap(); // broadcast over rows of the view
        for c in 1..3 {
            for r in 1..3 {
                want[r * 4 + c] *= [1.0, 2.0][r - 1];
            }
        }
        assert_eq!(base.to_f64_vec(), want, "{dt}");
        base.select(0, 0).unwrap().zero_().unwrap();
        for w in want.iter_mut().take(4) {
            *w = 0.0;
        }
        assert_eq!(base.to_f64_vec(), want);
        base.slice(1, Some(0), None, 2).unwrap().fill_(7).unwrap();
        for r in 0..3 {
            want[r * 4] = 7.0;
            want[r * 4 + 2] = 7.0;
        }
        assert_eq!(base.to_f64_vec(), want);
    }
}

#[test]
fn binary_in_place_ops_match_reference() {
    let a = seq(6);
    let b: Vec<f64> = (0..6).map(|i| i as f64 + 1.0).collect();
    type F = fn(f64, f64) -> f64;
    let cases: [(&str, F); 4] = [
        ("add", |x, y| x + y),
        ("sub", |x, y| x - y),
        ("mul", |x, y| x * y),
        ("div", |x, y| x / y),
    ];
    for (name, f) in cases {
        let x = t(&a, &[2, 3], DType::F64);
        let y = t(&b, &[2, 3], DType::F64);
        match name {
            "add" => x.add_(&y),
            "sub" => x.sub_(&y),
            "mul" => x.mul_(&y),
            _ => x.div_(&y),
        }
        .unwrap();
        let want: Vec<f64> = a.iter().zip(&b).map(|(&p, &q)| f(p, q)).collect();
        assert_eq!(x.to_f64_vec(), want, "{name}");
    }
    let x = t(&a, &[6], DType::F32);
    x.div_scalar_(4).unwrap().sub_scalar_(0.5).unwrap();
    let want: Vec<f64> = a.iter().map(|v| v / 4.0 - 0.5).collect();
    assert_eq!(x.to_f64_vec(), want);
    // an int tensor takes an int result; f32 into f64 is allowed
    let i = t(&a, &[6], DType::I32);
    i.mul_scalar_(3).unwrap();
    assert_eq!(
        i.to_f64_vec(),
        a.iter().map(|v| v * 3.0).collect::<Vec<_>>()
    );
    let d = t(&a, &[6], DType::F64);
    d.add_(&t(&b, &[6], DType::F32)).unwrap();
    assert_eq!(d.dtype(), DType::F64);
    // clamp_, relu_, masked_fill_
    let c = t(&a, &[2, 3], DType::F32);
    c.clamp_(Some(Scalar::Int(-1)), Some(Scalar::Int(2)))
        .unwrap();
    assert_eq!(
        c.to_f64_vec(),
        a.iter().map(|v| v.clamp(-1.0, 2.0)).collect::<Vec<_>>()
    );
    let r = t(&a, &[2, 3], DType::I64);
    r.relu_().unwrap();
    assert_eq!(
        r.to_f64_vec(),
        a.iter().map(|v| v.max(0.0)).collect::<Vec<_>>()
    );
    let m = Tensor::from_vec(vec![true, false, true], &[3]).unwrap();
    let mf = t(&a, &[2, 3], DType::F32);
    mf.masked_fill_(&m, 9.5).unwrap();
    let want: Vec<f64> = a
        .iter()
        .enumerate()
        .map(|(k, &v)| if k % 3 != 1 { 9.5 } else { v })
        .collect();
    assert_eq!(mf.to_f64_vec(), want);
}

#[test]
fn cast_and_shape_rules_follow_pytorch() {
    let i = t(&[1.0, 2.0], &[2], DType::I64);
    let f = t(&[0.5, 0.5], &[2], DType::F32);
    assert_eq!(
        i.add_(&f).unwrap_err().to_string(),
        "result type Float can't be cast to the desired output type Long"
    );
    assert_eq!(i.to_f64_vec(), vec![1.0, 2.0]);
    let e = i.div_scalar_(2).unwrap_err().to_string();
    assert_eq!(
        e,
        "result type Float can't be cast to the desired output type Long"
    );
    let e = i
        .clamp_(Some(Scalar::Float(0.5)), None)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "result type Float can't be cast to the desired output type Long"
    );
    let b = Tensor::from_vec(vec![true, false], &[2]).unwrap();
    assert!(
        b.add_(&i)
            .unwrap_err()
            .to_string()
            .contains("can't be cast to the desired output type Bool")
    );
    let col = t(&[1.0, 2.0, 3.0], &[3, 1], DType::F32);
    let wide = t(&seq(12), &[3, 4], DType::F32);
    assert_eq!(
        col.add_(&wide).unwrap_err().to_string(),
        "output with shape [3, 1] doesn't match the broadcast shape [3, 4]"
    );
    assert_eq!(col.to_f64_vec(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn in_place_on_expanded_tensor_is_refused() {
    let msg = "unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.";
    let x = t(&[1.0, 2.0, 3.0], &[3, 1], DType::F32);
    let e = x.expand(&[3, 4]).unwrap();
    assert_eq!(e.add_scalar_(1).unwrap_err().to_string(), msg);
    assert_eq!(e.fill_(0).unwrap_err().to_string(), msg);
    assert_eq!(e.zero_().unwrap_err().to_string(), msg);
    assert_eq!(
        e.copy_(&t(&seq(12), &[3, 4], DType::F32))
            .unwrap_err()
            .to_string(),
        msg
    );
    let idx = Tensor::from_vec(vec![0i64], &[1]).unwrap();
    assert_eq!(
        e.index_add_(1, &idx, &t(&[1.0; 3], &[3, 1], DType::F32))
            .unwrap_err()
            .to_string(),
        msg
    );
    assert_eq!(x.to_f64_vec(), vec![1.0, 2.0, 3.0]);
    let v = x.version();
    let _ = e.relu_();
    assert_eq!(x.version(), v);
}

#[test]
fn copy_broadcasts_casts_and_allocates_nothing() {
    let buf = Tensor::zeros(&[3, 4], DType::F32);
    let src = t(&seq(12), &[3, 4], DType::F64);
    let row = t(&[1.0, 2.0, 3.0, 4.0], &[4], DType::I64);
    let srct = t(&seq(12), &[4, 3], DType::F32).t().unwrap();
    let before = allocation_count();
    let v0 = buf.version();
    buf.copy_(&src).unwrap();
    assert_eq!(buf.to_f64_vec(), seq(12));
    buf.copy_(&row).unwrap();
    buf.copy_(&srct).unwrap();
    assert_eq!(allocation_count(), before);
    assert_eq!(buf.version(), v0 + 3);
    let s = seq(12);
    let want: Vec<f64> = (0..12).map(|p| s[(p % 4) * 3 + p / 4]).collect();
    assert_eq!(buf.to_f64_vec(), want);
    buf.copy_(&row).unwrap();
    assert_eq!(buf.to_f64_vec(), [1.0, 2.0, 3.0, 4.0].repeat(3));
    // float into int truncates, as a cast
    let ib = Tensor::zeros(&[2], DType::I32);
    ib.copy_(&t(&[2.7, -1.5], &[2], DType::F32)).unwrap();
    assert_eq!(ib.to_f64_vec(), vec![2.0, -1.0]);
    let e = buf
        .copy_(&t(&seq(3), &[3], DType::F32))
        .unwrap_err()
        .to_string();
    assert!(e.contains("must match the existing size"), "{e}");
    // copying a tensor into its own transpose reads the old values
    let sq = t(&seq(9), &[3, 3], DType::F64);
    sq.copy_(&sq.t().unwrap()).unwrap();
    let s9 = seq(9);
    assert_eq!(
        sq.to_f64_vec(),
        (0..9).map(|p| s9[(p % 3) * 3 + p / 3]).collect::<Vec<_>>()
    );
    // a shifted overlapping view
    let line = t(&[1.0, 2.0, 3.0, 4.0], &[4], DType::F32);
    line.narrow(0, 1, 3)
        .unwrap()
        .copy_(&line.narrow(0, 0, 3).unwrap())
        .unwrap();
    assert_eq!(line.to_f64_vec(), vec![1.0, 1.0, 2.0, 3.0]);
}

#[test]
fn out_forms_reuse_buffers_without_allocating() {
    let a = t(&seq(12), &[3, 4], DType::F32);
    let b = t(&[1.0, 2.0, 3.0, 4.0], &[4], DType::F32);
    let out = Tensor::zeros(&[3, 4], DType::F32);
    let before = allocation_count();
    Tensor::add_out(&a, &b, &out).unwrap();
    Tensor::mul_out(&a, &b, &out).unwrap();
    assert_eq!(allocation_count(), before);
    let s = seq(12);
    let want: Vec<f64> = (0..12)
        .map(|p| s[p] * [1.0, 2.0, 3.0, 4.0][p % 4])
        .collect();
    assert_eq!(out.to_f64_vec(), want);
    // a transposed out buffer
    let ot = Tensor::zeros(&[4, 3], DType::F32).t().unwrap();
    Tensor::sub_out(&a, &b, &ot).unwrap();
    let want: Vec<f64> = (0..12)
        .map(|p| s[p] - [1.0, 2.0, 3.0, 4.0][p % 4])
        .collect();
    assert_eq!(ot.to_f64_vec(), want);
    Tensor::apply_out(Op::Binary(BinaryOp::Maximum), &[&a, &b], &out).unwrap();
    assert_eq!(
        out.to_f64_vec(),
        (0..12)
            .map(|p| s[p].max([1.0, 2.0, 3.0, 4.0][p % 4]))
            .collect::<Vec<_>>()
    );
    let io = Tensor::zeros(&[3, 4], DType::I64);
    let e = Tensor::div_out(&a, &b, &io).unwrap_err().to_string();
    assert_eq!(
        e,
        "result type Float can't be cast to the desired output type Long"
    );
    let small = Tensor::zeros(&[4], DType::F32);
    assert!(
        Tensor::add_out(&a, &b, &small)
            .unwrap_err()
            .to_string()
            .contains("doesn't match the broadcast shape")
    );
    assert!(Tensor::apply_out(Op::Matmul, &[&a, &b], &out).is_err());
}

#[test]
fn index_add_in_place() {
    for dt in DTYPES {
        let base = t(&seq(12), &[4, 3], dt);
        let view = base.t().unwrap(); // [3, 4], dim 1 indexes base rows
        let idx = Tensor::from_vec(vec![3i64, 0, 3], &[3]).unwrap();
        let src = t(&[1.0; 9], &[3, 3], dt);
        let v0 = base.version();
        view.index_add_(1, &idx, &src).unwrap();
        assert!(base.version() > v0);
        let mut want = seq(12);
        for &r in &[3usize, 0, 3] {
            for c in 0..3 {
                want[r * 3 + c] += 1.0;
            }
        }
        assert_eq!(base.to_f64_vec(), want, "{dt}");
    }
    let x = t(&seq(3), &[3], DType::F32);
    let e = x.index_add_(
        0,
        &Tensor::from_vec(vec![3i64], &[1]).unwrap(),
        &t(&[1.0], &[1], DType::F32),
    );
    assert_eq!(
        e.unwrap_err().to_string(),
        "index_add(): index 3 is out of range for dimension 0 with size 3"
    );
    assert_eq!(x.to_f64_vec(), seq(3));
}
