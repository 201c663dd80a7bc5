//! Pointwise ops against f64 references computed here, across dtypes, layouts and edge cases.

mod common;

use common::{Tol, assert_close};
use proptest::prelude::*;
use smelt::ir::op::{BinaryOp, Op};
use smelt::runtime::kernels::pointwise::eval_into;
use smelt::{DType, Result, Scalar, Tensor};

const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

/// `v` rounded to `d` once, by the `half` crate or a plain cast (independent of smelt).
fn rd(v: f64, d: DType) -> f64 {
    match d {
        DType::F16 => half::f16::from_f64(v).to_f64(),
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        DType::F32 => v as f32 as f64,
        _ => v,
    }
}

/// Relative precision of a float dtype.
fn eps(d: DType) -> f64 {
    match d {
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        DType::F32 => 2f64.powi(-23),
        _ => 2f64.powi(-52),
    }
}

/// A tensor of dtype `d` holding `v` (converted by smelt's cast).
fn tensor(v: &[f64], shape: &[usize], d: DType) -> Tensor {
    Tensor::from_slice(v, shape).unwrap().to_dtype(d).unwrap()
}

fn arange(n: i64, shape: &[i64], d: DType) -> Tensor {
    Tensor::arange(0, n, 1, Some(DType::F64))
        .unwrap()
        .reshape(shape)
        .unwrap()
        .to_dtype(d)
        .unwrap()
}

const VALUES: [f64; 18] = [
    -3.7,
    -2.5,
    -1.0,
    -0.5,
    -0.0,
    0.0,
    0.3,
    0.5,
    1.0,
    1.5,
    2.5,
    4.0,
    7.25,
    100.0,
    -100.0,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
];

fn sigmoid_ref(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        x.exp() / (1.0 + x.exp())
    }
}

/// Round half to even, written out.
fn round_even(x: f64) -> f64 {
    let f = x.floor();
    let diff = x - f;
    if diff > 0.5 || (diff == 0.5 && f % 2.0 != 0.0) {
        f + 1.0
    } else if x.is_nan() {
        x
    } else {
        f
    }
}

type Method = fn(&Tensor) -> Result<Tensor>;

/// (name, method, reference, relative tolerance in units of the dtype's precision; 0 = exact)
type UnaryCase = (&'static str, Method, fn(f64) -> f64, f64);

fn unary_cases() -> Vec<UnaryCase> {
    vec![
        ("neg", Tensor::neg, |x| -x, 0.0),
        ("abs", Tensor::abs, f64::abs, 0.0),
        ("exp", Tensor::exp, f64::exp, 2.0),
        ("log", Tensor::log, f64::ln, 2.0),
        ("log1p", Tensor::log1p, f64::ln_1p, 2.0),
        ("expm1", Tensor::expm1, f64::exp_m1, 2.0),
        ("sqrt", Tensor::sqrt, f64::sqrt, 0.0),
        ("rsqrt", Tensor::rsqrt, |x| 1.0 / x.sqrt(), 2.0),
        ("sin", Tensor::sin, f64::sin, 2.0),
        ("cos", Tensor::cos, f64::cos, 2.0),
        ("tanh", Tensor::tanh, f64::tanh, 2.0),
        ("sigmoid", Tensor::sigmoid, sigmoid_ref, 4.0),
        (
            "relu",
            Tensor::relu,
            |x| if x.is_nan() { x } else { x.max(0.0) },
            0.0,
        ),
        (
            "gelu",
            Tensor::gelu,
            |x| 0.5 * x * libm::erfc(-x / 2f64.sqrt()),
            1e5,
        ),
        (
            "gelu_tanh",
            Tensor::gelu_tanh,
            |x| {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (k * (x + 0.044715 * x.powi(3))).tanh())
            },
            1e5,
        ),
        ("silu", Tensor::silu, |x| x * sigmoid_ref(x), 4.0),
        ("erf", Tensor::erf, libm::erf, 2.0),
        ("floor", Tensor::floor, f64::floor, 0.0),
        ("ceil", Tensor::ceil, f64::ceil, 0.0),
        ("round", Tensor::round, round_even, 0.0),
        (
            "sign",
            Tensor::sign,
            |x| {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            },
            0.0,
        ),
        ("reciprocal", Tensor::reciprocal, |x| 1.0 / x, 0.0),
        ("square", Tensor::square, |x| x * x, 0.0),
    ]
}

#[test]
fn unary_float_ops_match_f64_reference() {
    for (name, method, reference, tol) in unary_cases() {
        for d in FLOATS {
            let x = tensor(&VALUES, &[VALUES.len()], d);
            let inputs = x.to_f64_vec();
            let y = method(&x).unwrap();
            assert_eq!(y.dtype(), d, "{name} {d}");
            let want: Vec<f64> = inputs.iter().map(|&v| rd(reference(v), d)).collect();
            // f64 gelu cancels in 1 + erf(x) for negative x, as PyTorch's formula does
            let rtol = if d == DType::F64 {
                tol * eps(d)
            } else {
                tol.min(2.0) * eps(d)
            };
            assert_close(
                &y.to_f64_vec(),
                &want,
                Tol::allclose(rtol, 1e-300),
                &format!("{name} {d}"),
            );
        }
    }
}

#[test]
fn unary_integer_ops_keep_dtype_and_wrap() {
    let cases: [(DType, &[i64]); 4] = [
        (DType::I8, &[-128, -5, -1, 0, 1, 5, 127]),
        (DType::U8, &[0, 1, 5, 200, 255]),
        (
            DType::I32,
            &[i32::MIN as i64, -7, 0, 3, 46341, i32::MAX as i64],
        ),
        (DType::I64, &[i64::MIN, -7, 0, 3, 1 << 40, i64::MAX]),
    ];
    let wrap = |v: i64, d: DType| match d {
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        DType::I32 => v as i32 as i64,
        _ => v,
    };
    for (d, vals) in cases {
        let x = Tensor::from_slice(vals, &[vals.len()])
            .unwrap()
            .to_dtype(d)
            .unwrap();
        let check = |name: &str, y: Tensor, f: &dyn Fn(i64) -> i64| {
            assert_eq!(y.dtype(), d, "{name} {d}");
            let want: Vec<i64> = vals.iter().map(|&v| wrap(f(v), d)).collect();
            assert_eq!(y.to_i64_vec(), want, "{name} {d}");
        };
        check("neg", x.neg().unwrap(), &|v| v.wrapping_neg());
        check("abs", x.abs().unwrap(), &|v| v.wrapping_abs());
        check("relu", x.relu().unwrap(), &|v| v.max(0));
        check("sign", x.sign().unwrap(), &|v| v.signum());
        check("square", x.square().unwrap(), &|v| v.wrapping_mul(v));
        check("floor", x.floor().unwrap(), &|v| v);
        check("ceil", x.ceil().unwrap(), &|v| v);
        check("round", x.round().unwrap(), &|v| v);
        let isnan = x.isnan().unwrap();
        assert_eq!(isnan.dtype(), DType::Bool);
        assert!(isnan.to_i64_vec().iter().all(|&b| b == 0));
        let not = x.logical_not().unwrap();
        let want: Vec<i64> = vals.iter().map(|&v| (v == 0) as i64).collect();
        assert_eq!(not.to_i64_vec(), want, "logical_not {d}");
    }
    // abs(i8::MIN) wraps to itself, as in PyTorch
    let m = Tensor::from_slice(&[i8::MIN], &[1]).unwrap();
    assert_eq!(m.abs().unwrap().to_vec::<i8>().unwrap(), vec![i8::MIN]);
}

#[test]
fn unary_promotions_and_predicates() {
    let xi = Tensor::from_slice(&[1i64, 4, 9], &[3]).unwrap();
    let s = xi.sqrt().unwrap();
    assert_eq!(s.dtype(), DType::F32);
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(xi.exp().unwrap().dtype(), DType::F32);
    assert_eq!(
        xi.reciprocal().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 0.25, 1.0 / 9.0]
    );
    let b = Tensor::from_slice(&[true, false], &[2]).unwrap();
    assert_eq!(b.square().unwrap().dtype(), DType::I64);
    assert_eq!(b.square().unwrap().to_vec::<i64>().unwrap(), vec![1, 0]);
    assert_eq!(
        b.sign().unwrap().to_vec::<bool>().unwrap(),
        vec![true, false]
    );
    assert_eq!(b.sigmoid().unwrap().dtype(), DType::F32);
    assert_eq!(
        b.logical_not().unwrap().to_vec::<bool>().unwrap(),
        vec![false, true]
    );
    for d in FLOATS {
        let x = tensor(&[0.0, -0.0, f64::NAN, 1.5, f64::INFINITY], &[5], d);
        assert_eq!(
            x.isnan().unwrap().to_vec::<bool>().unwrap(),
            vec![false, false, true, false, false]
        );
        // NaN is nonzero, so logical_not(NaN) is false
        assert_eq!(
            x.logical_not().unwrap().to_vec::<bool>().unwrap(),
            vec![true, true, false, false, false]
        );
    }
    let e = b.neg().unwrap_err().to_string();
    assert!(
        e.starts_with("Negation, the `-` operator, on a bool tensor is not supported."),
        "{e}"
    );
    assert_eq!(
        xi.gelu().unwrap_err().to_string(),
        "\"gelu\" not implemented for 'Long'"
    );
}

fn python_mod(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a.rem_euclid(b)
    } else if b < 0.0 {
        -(-a).rem_euclid(-b)
    } else {
        f64::NAN
    }
}

type BinMethod = fn(&Tensor, &Tensor) -> Result<Tensor>;

#[test]
fn binary_float_ops_match_f64_reference() {
    let av = [
        -3.5,
        -1.0,
        -0.0,
        0.0,
        0.75,
        2.0,
        3.0,
        1e3,
        f64::NAN,
        f64::INFINITY,
        -2.5,
        5.0,
    ];
    let bv = [
        2.0,
        -4.0,
        3.0,
        -1.5,
        0.0,
        0.5,
        -3.0,
        7.0,
        1.0,
        2.0,
        f64::NEG_INFINITY,
        1.0 / 3.0,
    ];
    let max_ref = |a: f64, b: f64| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    };
    let min_ref = |a: f64, b: f64| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.min(b)
        }
    };
    type Case = (&'static str, BinMethod, Box<dyn Fn(f64, f64) -> f64>, f64);
    let cases: Vec<Case> = vec![
        ("add", Tensor::add, Box::new(|a, b| a + b), 0.0),
        ("sub", Tensor::sub, Box::new(|a, b| a - b), 0.0),
        ("mul", Tensor::mul, Box::new(|a, b| a * b), 0.0),
        ("div", Tensor::div, Box::new(|a, b| a / b), 0.0),
        ("pow", Tensor::pow, Box::new(f64::powf), 2.0),
        ("maximum", Tensor::maximum, Box::new(max_ref), 0.0),
        ("minimum", Tensor::minimum, Box::new(min_ref), 0.0),
        ("remainder", Tensor::remainder, Box::new(python_mod), 0.0),
    ];
    for (name, method, reference, tol) in &cases {
        for d in FLOATS {
            let a = tensor(&av, &[av.len()], d);
            let b = tensor(&bv, &[bv.len()], d);
            let (ai, bi) = (a.to_f64_vec(), b.to_f64_vec());
            let y = method(&a, &b).unwrap();
            assert_eq!(y.dtype(), d);
            let want: Vec<f64> = ai
                .iter()
                .zip(&bi)
                .map(|(&x, &z)| rd(reference(x, z), d))
                .collect();
            assert_close(
                &y.to_f64_vec(),
                &want,
                Tol::allclose(tol * eps(d), 0.0),
                &format!("{name} {d}"),
            );
        }
    }
    // remainder takes the divisor's sign
    let r = tensor(&[5.0, -5.0, 5.0, -5.0], &[4], DType::F32)
        .remainder(&tensor(&[3.0, 3.0, -3.0, -3.0], &[4], DType::F32))
        .unwrap();
    assert_eq!(r.to_vec::<f32>().unwrap(), vec![2.0, 1.0, -1.0, -2.0]);
}

#[test]
fn binary_integer_ops_wrap_and_follow_python() {
    let a = Tensor::from_slice(&[100i8, -128, 7, -7, 5], &[5]).unwrap();
    let b = Tensor::from_slice(&[100i8, -1, 3, 3, -3], &[5]).unwrap();
    assert_eq!(
        a.add(&b).unwrap().to_vec::<i8>().unwrap(),
        vec![-56, 127, 10, -4, 2]
    );
    assert_eq!(
        a.sub(&b).unwrap().to_vec::<i8>().unwrap(),
        vec![0, -127, 4, -10, 8]
    );
    assert_eq!(
        a.mul(&b).unwrap().to_vec::<i8>().unwrap(),
        vec![16, -128, 21, -21, -15]
    );
    assert_eq!(
        a.remainder(&b).unwrap().to_vec::<i8>().unwrap(),
        vec![0, 0, 1, 2, -1]
    );
    assert_eq!(
        a.maximum(&b).unwrap().to_vec::<i8>().unwrap(),
        vec![100, -1, 7, 3, 5]
    );
    assert_eq!(
        a.minimum(&b).unwrap().to_vec::<i8>().unwrap(),
        vec![100, -128, 3, -7, -3]
    );
    let q = a.div(&b).unwrap();
    assert_eq!(q.dtype(), DType::F32);
    assert_eq!(
        q.to_vec::<f32>().unwrap(),
        vec![1.0, 128.0, 7.0 / 3.0, -7.0 / 3.0, 5.0 / -3.0]
    );
    let u = Tensor::from_slice(&[3u8, 250], &[2]).unwrap();
    assert_eq!(
        u.sub_scalar(5).unwrap().to_vec::<u8>().unwrap(),
        vec![254, 245]
    );
    assert_eq!(
        u.add_scalar(10).unwrap().to_vec::<u8>().unwrap(),
        vec![13, 4]
    );
    // integer pow: by a tensor exponent, negative exponents give PyTorch's integer results
    let base = Tensor::from_slice(&[2i64, 3, -2, 1, -1, -1, 5, 0], &[8]).unwrap();
    let ex = Tensor::from_slice(&[10i64, 3, 3, -4, -3, -2, -1, 0], &[8]).unwrap();
    assert_eq!(
        base.pow(&ex).unwrap().to_vec::<i64>().unwrap(),
        vec![1024, 27, -8, 1, -1, 1, 0, 1]
    );
    let big = Tensor::from_slice(&[3i64], &[1])
        .unwrap()
        .pow_scalar(41)
        .unwrap();
    assert_eq!(big.to_vec::<i64>().unwrap(), vec![3i64.wrapping_pow(41)]);
    let e = base.pow_scalar(-2).unwrap_err().to_string();
    assert_eq!(e, "Integers to negative integer powers are not allowed.");
    assert_eq!(base.pow_scalar(-2.0).unwrap().dtype(), DType::F32);
    let z = Tensor::from_slice(&[0i64, 1], &[2]).unwrap();
    assert_eq!(
        base.remainder(&z.expand(&[4, 2]).unwrap().reshape(&[8]).unwrap())
            .unwrap_err()
            .to_string(),
        "ZeroDivisionError"
    );
    assert_eq!(
        base.remainder_scalar(0).unwrap_err().to_string(),
        "ZeroDivisionError"
    );
    assert_eq!(
        base.remainder_scalar(-3).unwrap().to_vec::<i64>().unwrap(),
        vec![-1, 0, -2, -2, -1, -1, -1, 0]
    );
    // bools: add is "or", sub is refused
    let t = Tensor::from_slice(&[true, true, false], &[3]).unwrap();
    let f = Tensor::from_slice(&[true, false, false], &[3]).unwrap();
    let s = t.add(&f).unwrap();
    assert_eq!(s.dtype(), DType::Bool);
    assert_eq!(s.to_vec::<bool>().unwrap(), vec![true, true, false]);
    assert!(
        t.sub(&f)
            .unwrap_err()
            .to_string()
            .starts_with("Subtraction, the `-` operator, with two bool tensors")
    );
}

#[test]
fn comparisons_and_logical_ops_use_promoted_dtype() {
    // u8 vs i8 compare in i16: 200 > -1 (in u8, -1 would be 255)
    let u = Tensor::from_slice(&[200u8, 0, 5], &[3]).unwrap();
    let i = Tensor::from_slice(&[-1i8, 0, 6], &[3]).unwrap();
    assert_eq!(
        u.gt(&i).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false]
    );
    assert_eq!(
        u.ge(&i).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, false]
    );
    assert_eq!(
        u.eq(&i).unwrap().to_vec::<bool>().unwrap(),
        vec![false, true, false]
    );
    // i64 vs a float scalar compares in f32
    let x = Tensor::from_slice(&[0i64, 1, -1], &[3]).unwrap();
    assert_eq!(
        x.lt_scalar(0.5).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, true]
    );
    assert_eq!(
        x.le_scalar(0).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, true]
    );
    // NaN compares unequal to everything
    let n = Tensor::from_slice(&[f32::NAN, 1.0, 2.0], &[3]).unwrap();
    let m = Tensor::from_slice(&[f32::NAN, 1.0, 3.0], &[3]).unwrap();
    assert_eq!(
        n.eq(&m).unwrap().to_vec::<bool>().unwrap(),
        vec![false, true, false]
    );
    assert_eq!(
        n.ne(&m).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, true]
    );
    assert_eq!(
        n.lt(&m).unwrap().to_vec::<bool>().unwrap(),
        vec![false, false, true]
    );
    assert_eq!(
        n.ge(&m).unwrap().to_vec::<bool>().unwrap(),
        vec![false, true, false]
    );
    // a scalar on the left
    let two = Tensor::wrapped(Scalar::Float(2.0));
    assert_eq!(
        two.lt(&n).unwrap().to_vec::<bool>().unwrap(),
        vec![false, false, false]
    );
    assert_eq!(
        two.le(&n).unwrap().to_vec::<bool>().unwrap(),
        vec![false, false, true]
    );
    // logical ops: nonzero (NaN included) is true, mixed dtypes allowed
    let f = Tensor::from_slice(&[0.0f32, f32::NAN, -2.0, 0.0], &[4]).unwrap();
    let k = Tensor::from_slice(&[5i32, 1, 0, 0], &[4]).unwrap();
    assert_eq!(
        f.logical_and(&k).unwrap().to_vec::<bool>().unwrap(),
        vec![false, true, false, false]
    );
    assert_eq!(
        f.logical_or(&k).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, true, false]
    );
    for d in [
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ] {
        let a = tensor(&[0.0, 1.0, 2.0, 1.0], &[4], d);
        let b = tensor(&[0.0, 2.0, 1.0, 1.0], &[4], d);
        let want_lt: Vec<bool> = if d == DType::Bool {
            vec![false, false, false, false]
        } else {
            vec![false, true, false, false]
        };
        assert_eq!(a.lt(&b).unwrap().to_vec::<bool>().unwrap(), want_lt, "{d}");
        assert_eq!(
            a.eq(&b).unwrap().to_vec::<bool>().unwrap(),
            vec![true, d == DType::Bool, d == DType::Bool, true],
            "{d}"
        );
    }
}

#[test]
fn type_promotion_with_python_scalars() {
    let h = tensor(&[1.0, 3.0], &[2], DType::F16);
    let y = h.mul_scalar(0.5).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(y.to_f64_vec(), vec![0.5, 1.5]);
    let l = Tensor::from_slice(&[1i64, 3], &[2]).unwrap();
    let y = l.mul_scalar(0.5).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.5, 1.5]);
    let i = Tensor::from_slice(&[1i32, i32::MAX], &[2]).unwrap();
    let y = i.add_scalar(1).unwrap();
    assert_eq!(y.dtype(), DType::I32);
    assert_eq!(y.to_vec::<i32>().unwrap(), vec![2, i32::MIN]);
    // the scalar is rounded to the computation dtype first: x_f32 * 0.1 multiplies by 0.1f32
    let x = Tensor::from_slice(&[3.0f32, 7.0], &[2]).unwrap();
    assert_eq!(
        x.mul_scalar(0.1).unwrap().to_vec::<f32>().unwrap(),
        vec![3.0 * 0.1f32, 7.0 * 0.1f32]
    );
    // tensor-tensor promotion
    assert_eq!(l.add(&h).unwrap().dtype(), DType::F16);
    let u = Tensor::from_slice(&[200u8], &[1]).unwrap();
    let s = Tensor::from_slice(&[-1i8], &[1]).unwrap();
    let y = u.add(&s).unwrap();
    assert_eq!(y.dtype(), DType::I16);
    assert_eq!(y.to_i64_vec(), vec![199]);
    // a 0-d f64 tensor does not promote an f32 tensor, a dimensioned one does
    let z = Tensor::from_slice(&[2.0f64], &[]).unwrap();
    assert_eq!(x.mul(&z).unwrap().dtype(), DType::F32);
    assert_eq!(i.mul(&z).unwrap().dtype(), DType::F64);
    assert_eq!(
        x.rsub_scalar(1).unwrap().to_vec::<f32>().unwrap(),
        vec![-2.0, -6.0]
    );
    assert_eq!(
        x.rdiv_scalar(21).unwrap().to_vec::<f32>().unwrap(),
        vec![7.0, 3.0]
    );
    assert_eq!(
        l.rpow_scalar(2).unwrap().to_vec::<i64>().unwrap(),
        vec![2, 8]
    );
}

#[test]
fn broadcasting_and_its_error() {
    let a = arange(3, &[3, 1], DType::F32);
    let b = arange(4, &[1, 4], DType::F32).mul_scalar(10).unwrap();
    let c = a.add(&b).unwrap();
    assert_eq!(c.shape(), &[3, 4]);
    let want: Vec<f32> = (0..3)
        .flat_map(|i| (0..4).map(move |j| (i + 10 * j) as f32))
        .collect();
    assert_eq!(c.to_vec::<f32>().unwrap(), want);
    let e = arange(3, &[3], DType::F32)
        .add(&arange(4, &[4], DType::F32))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0"
    );
    let e = arange(6, &[2, 3], DType::F32)
        .add(&arange(8, &[2, 4], DType::F32))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1"
    );
    // 0-d with n-d, and [2,1,3] with [4,1]
    let s = Tensor::from_slice(&[2.0f32], &[]).unwrap();
    assert_eq!(s.mul(&c).unwrap().shape(), &[3, 4]);
    let x = arange(6, &[2, 1, 3], DType::F64);
    let y = arange(4, &[4, 1], DType::F64);
    let z = x.sub(&y).unwrap();
    assert_eq!(z.shape(), &[2, 4, 3]);
    let (xv, yv, zv) = (x.to_f64_vec(), y.to_f64_vec(), z.to_f64_vec());
    for i in 0..2 {
        for j in 0..4 {
            for k in 0..3 {
                assert_eq!(zv[i * 12 + j * 3 + k], xv[i * 3 + k] - yv[j]);
            }
        }
    }
}

#[test]
fn non_contiguous_inputs() {
    let base = arange(24, &[4, 6], DType::F32);
    let t = base.t().unwrap(); // [6, 4], transposed
    let s = base.slice(1, Some(0), None, 2).unwrap(); // [4, 3], step 2
    let e = arange(4, &[4, 1], DType::F32).expand(&[4, 3]).unwrap();
    let tv = t.contiguous().unwrap().to_vec::<f32>().unwrap();
    let got = t.mul_scalar(2.0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got, tv.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    let sv = s.contiguous().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(
        sv,
        vec![0., 2., 4., 6., 8., 10., 12., 14., 16., 18., 20., 22.]
    );
    let ev = e.contiguous().unwrap().to_vec::<f32>().unwrap();
    let got = s.sub(&e).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(
        got,
        sv.iter().zip(&ev).map(|(a, b)| a - b).collect::<Vec<_>>()
    );
    let got = s.exp().unwrap().to_f64_vec();
    let want: Vec<f64> = sv
        .iter()
        .map(|&v| rd((v as f64).exp(), DType::F32))
        .collect();
    assert_close(
        &got,
        &want,
        Tol::allclose(2.0 * eps(DType::F32), 0.0),
        "exp of a strided view",
    );
    // a broadcast scalar on the left of a non-commutative op, on a strided view
    let got = s.rsub_scalar(1.0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got, sv.iter().map(|v| 1.0 - v).collect::<Vec<_>>());
    let c = Tensor::where_cond(&t.gt_scalar(10).unwrap(), &t, &t.neg().unwrap()).unwrap();
    assert_eq!(
        c.to_vec::<f32>().unwrap(),
        tv.iter()
            .map(|&v| if v > 10.0 { v } else { -v })
            .collect::<Vec<_>>()
    );
}

#[test]
fn empty_and_zero_dim() {
    for d in [DType::F32, DType::I64, DType::F16] {
        let e = Tensor::zeros(&[0, 3], d);
        let r = e.add(&Tensor::ones(&[3], d)).unwrap();
        assert_eq!(r.shape(), &[0, 3]);
        assert_eq!(r.numel(), 0);
        assert_eq!(e.neg().unwrap().shape(), &[0, 3]);
        assert_eq!(e.eq_scalar(0).unwrap().shape(), &[0, 3]);
    }
    // an empty output runs no loop, so an integer remainder by zero cannot happen
    let e = Tensor::zeros(&[0], DType::I64);
    assert_eq!(e.remainder_scalar(0).unwrap().shape(), &[0]);
    let z = Tensor::from_slice(&[-2.5f32], &[]).unwrap();
    let r = z.abs().unwrap();
    assert_eq!(r.shape(), &[] as &[usize]);
    assert_eq!(r.item::<f32>().unwrap(), 2.5);
    let r = z
        .maximum(&Tensor::from_slice(&[1.0f32], &[]).unwrap())
        .unwrap();
    assert_eq!(r.shape(), &[] as &[usize]);
    assert_eq!(r.item::<f32>().unwrap(), 1.0);
}

#[test]
fn nan_and_inf_behaviour() {
    let x = Tensor::from_slice(&[f32::NAN, 1.0, f32::NEG_INFINITY], &[3]).unwrap();
    let y = Tensor::from_slice(&[0.0f32, f32::NAN, 0.0], &[3]).unwrap();
    let mx = x.maximum(&y).unwrap().to_vec::<f32>().unwrap();
    assert!(mx[0].is_nan() && mx[1].is_nan() && mx[2] == 0.0);
    let mn = x.minimum(&y).unwrap().to_vec::<f32>().unwrap();
    assert!(mn[0].is_nan() && mn[1].is_nan() && mn[2] == f32::NEG_INFINITY);
    let c = x
        .clamp(Some(Scalar::Float(-1.0)), Some(Scalar::Float(0.5)))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(c[0].is_nan() && c[1] == 0.5 && c[2] == -1.0);
    // a NaN bound: alone it is ignored, with the other bound it makes everything NaN (PyTorch)
    let c = x.clamp_min(f64::NAN).unwrap().to_vec::<f32>().unwrap();
    assert!(c[0].is_nan() && c[1] == 1.0 && c[2] == f32::NEG_INFINITY);
    let c = x
        .clamp(Some(Scalar::Float(f64::NAN)), Some(Scalar::Float(1.0)))
        .unwrap();
    assert!(c.to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
    assert_eq!(x.sign().unwrap().to_vec::<f32>().unwrap()[0], 0.0);
    assert!(x.relu().unwrap().to_vec::<f32>().unwrap()[0].is_nan());
    let r = Tensor::from_slice(&[5.0f64, -5.0, 0.0], &[3])
        .unwrap()
        .remainder_scalar(f64::INFINITY)
        .unwrap();
    assert_eq!(r.to_vec::<f64>().unwrap(), vec![5.0, f64::INFINITY, 0.0]);
    let d = Tensor::from_slice(&[1i32, -1, 0], &[3])
        .unwrap()
        .div_scalar(0)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(d[0] == f32::INFINITY && d[1] == f32::NEG_INFINITY && d[2].is_nan());
    let r = Tensor::from_slice(&[1.0f32], &[1])
        .unwrap()
        .remainder_scalar(0.0)
        .unwrap();
    assert!(r.to_vec::<f32>().unwrap()[0].is_nan());
}

#[test]
fn where_clamp_masked_fill() {
    let c = Tensor::from_slice(&[true, false, true], &[3, 1]).unwrap();
    let x = Tensor::from_slice(&[1i32, 2], &[1, 2]).unwrap();
    let y = Tensor::from_slice(&[0.5f32], &[1]).unwrap();
    let w = Tensor::where_cond(&c, &x, &y).unwrap();
    assert_eq!(w.dtype(), DType::F32);
    assert_eq!(w.shape(), &[3, 2]);
    assert_eq!(
        w.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 0.5, 0.5, 1.0, 2.0]
    );
    let w = Tensor::where_scalar(&c, &x, 7).unwrap();
    assert_eq!(w.dtype(), DType::I32);
    assert_eq!(w.to_vec::<i32>().unwrap(), vec![1, 2, 7, 7, 1, 2]);
    let e = Tensor::where_cond(&x, &x, &x).unwrap_err().to_string();
    assert_eq!(
        e,
        "where expected condition to be a boolean tensor, but got a tensor with dtype Int"
    );
    // clamp: ints stay ints, a float bound makes floats; min > max gives max
    let v = Tensor::from_slice(&[-5i64, 0, 3, 9], &[4]).unwrap();
    let k = v
        .clamp(Some(Scalar::Int(-1)), Some(Scalar::Int(4)))
        .unwrap();
    assert_eq!(k.dtype(), DType::I64);
    assert_eq!(k.to_vec::<i64>().unwrap(), vec![-1, 0, 3, 4]);
    let k = v.clamp_min(0.5).unwrap();
    assert_eq!(k.dtype(), DType::F32);
    assert_eq!(k.to_vec::<f32>().unwrap(), vec![0.5, 0.5, 3.0, 9.0]);
    assert_eq!(
        v.clamp_max(2).unwrap().to_vec::<i64>().unwrap(),
        vec![-5, 0, 2, 2]
    );
    assert_eq!(
        v.clamp(Some(Scalar::Int(5)), Some(Scalar::Int(1)))
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![1; 4]
    );
    for d in FLOATS {
        let f = tensor(&[-2.0, 0.25, 3.0], &[3], d);
        let k = f
            .clamp(Some(Scalar::Float(0.1)), Some(Scalar::Float(2.0)))
            .unwrap();
        assert_eq!(k.dtype(), d);
        assert_eq!(k.to_f64_vec(), vec![rd(0.1, d), 0.25, 2.0], "{d}");
    }
    assert_eq!(
        v.clamp(None::<f64>, None::<f64>).unwrap_err().to_string(),
        "torch.clamp: At least one of 'min' or 'max' must not be None"
    );
    let u = Tensor::from_slice(&[1u8], &[1]).unwrap();
    assert_eq!(
        u.clamp_max(1000).unwrap_err().to_string(),
        "value cannot be converted to type uint8_t without overflow"
    );
    // masked_fill broadcasts both ways and keeps the tensor's dtype
    let m = Tensor::from_slice(&[true, false], &[2, 1]).unwrap();
    let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let r = t.masked_fill(&m, -1.5).unwrap();
    assert_eq!(r.shape(), &[2, 3]);
    assert_eq!(
        r.to_vec::<f32>().unwrap(),
        vec![-1.5, -1.5, -1.5, 1.0, 2.0, 3.0]
    );
    let r = v
        .masked_fill(
            &Tensor::from_slice(&[false, true, false, true], &[4]).unwrap(),
            2.7,
        )
        .unwrap();
    assert_eq!(r.to_vec::<i64>().unwrap(), vec![-5, 2, 3, 2]);
    let e = t.masked_fill(&t, 0).unwrap_err().to_string();
    assert_eq!(
        e,
        "masked_fill_ only supports boolean masks, but got mask with dtype Float"
    );
    let h = tensor(&[1.0], &[1], DType::F16);
    let e = h
        .masked_fill(&Tensor::from_slice(&[true], &[1]).unwrap(), 1e6)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "value cannot be converted to type at::Half without overflow"
    );
}

#[test]
fn operators() {
    let a = Tensor::from_slice(&[1.0f32, 2.0, 4.0], &[3]).unwrap();
    let b = Tensor::from_slice(&[2.0f32, 8.0, 1.0], &[3]).unwrap();
    let v = |t: Tensor| t.to_vec::<f32>().unwrap();
    assert_eq!(v(&a + &b), vec![3.0, 10.0, 5.0]);
    assert_eq!(v(a.clone() - &b), vec![-1.0, -6.0, 3.0]);
    assert_eq!(v(&a * b.clone()), vec![2.0, 16.0, 4.0]);
    assert_eq!(v(a.clone() / b.clone()), vec![0.5, 0.25, 4.0]);
    assert_eq!(v(&b % 3.0), vec![2.0, 2.0, 1.0]);
    assert_eq!(v(&a * 0.5), vec![0.5, 1.0, 2.0]);
    assert_eq!(v(2.0 * &a), vec![2.0, 4.0, 8.0]);
    assert_eq!(v(1 - &a), vec![0.0, -1.0, -3.0]);
    assert_eq!(v(8i64 / a.clone()), vec![8.0, 4.0, 2.0]);
    assert_eq!(v(a.clone() + 1.5), vec![2.5, 3.5, 5.5]);
    assert_eq!(v(-&a), vec![-1.0, -2.0, -4.0]);
    assert_eq!(v(-a.clone()), vec![-1.0, -2.0, -4.0]);
    let i = Tensor::from_slice(&[7i32, -7], &[2]).unwrap();
    assert_eq!((&i % 3).to_vec::<i32>().unwrap(), vec![1, 2]);
    assert_eq!((&i * 2).dtype(), DType::I32);
    let m = Tensor::from_slice(&[true, false, true], &[3]).unwrap();
    let n = Tensor::from_slice(&[true, true, false], &[3]).unwrap();
    assert_eq!((!&m).to_vec::<bool>().unwrap(), vec![false, true, false]);
    assert_eq!(
        (&m & &n).to_vec::<bool>().unwrap(),
        vec![true, false, false]
    );
    assert_eq!(
        (m.clone() | n).to_vec::<bool>().unwrap(),
        vec![true, true, true]
    );
}

#[test]
#[should_panic(expected = "must match the size of tensor b")]
fn operators_panic_with_the_method_error() {
    let _ = Tensor::zeros(&[3], DType::F32) + Tensor::zeros(&[4], DType::F32);
}

#[test]
#[should_panic(expected = "\"bitwise_not_cpu\" not implemented for 'Float'")]
fn bitwise_operators_refuse_floats() {
    let _ = !Tensor::zeros(&[3], DType::F32);
}

/// `~`, `&`, `|`, `^` of integers are PyTorch's bitwise ops, in the operands' dtype
/// (two's complement, as Python's ints), and the logical ones for bools.
#[test]
fn bitwise_operators_on_integers_and_bools() {
    let a = Tensor::from_slice(&[12i32, -7, 0, 255], &[4]).unwrap();
    let b = Tensor::from_slice(&[10i32, 3, -1, 256], &[4]).unwrap();
    let v = |t: Tensor| t.to_vec::<i32>().unwrap();
    assert_eq!(v(!&a), vec![!12, 6, -1, -256]);
    assert_eq!(v(&a & &b), vec![8, 1, 0, 0]);
    assert_eq!(v(&a | &b), vec![14, -5, -1, 511]);
    assert_eq!(v(&a ^ &b), vec![6, -6, -1, 511]);
    // u8 wraps as unsigned; a Python int operand keeps the tensor's dtype
    let u = Tensor::from_slice(&[0u8, 1, 200], &[3]).unwrap();
    assert_eq!((!&u).to_vec::<u8>().unwrap(), vec![255, 254, 55]);
    let x = u.bitwise_xor_scalar(0xff).unwrap();
    assert_eq!(x.dtype(), DType::U8);
    assert_eq!(x.to_vec::<u8>().unwrap(), vec![255, 254, 55]);
    let m = Tensor::from_slice(&[true, false, true], &[3]).unwrap();
    let n = Tensor::from_slice(&[true, true, false], &[3]).unwrap();
    assert_eq!((&m ^ &n).to_vec::<bool>().unwrap(), vec![false, true, true]);
    assert_eq!(
        m.bitwise_not().unwrap().to_vec::<bool>().unwrap(),
        vec![false, true, false]
    );
    // a bool with an integer promotes to the integer
    let mixed = m.bitwise_or(&Tensor::from_slice(&[2i64, 2, 2], &[3]).unwrap());
    assert_eq!(mixed.unwrap().to_vec::<i64>().unwrap(), vec![3, 2, 3]);
    let e = a
        .to_dtype(DType::F32)
        .unwrap()
        .bitwise_and(&b)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"bitwise_and_cpu\" not implemented for 'Float'"),
        "{e}"
    );
}

/// asin, acos and atan against f64 math, integers promoted to f32 as PyTorch does.
#[test]
fn inverse_trigonometric_functions() {
    let xs = [-1.0f64, -0.5, 0.0, 0.25, 1.0, 1.5, f64::INFINITY, f64::NAN];
    let t = Tensor::from_slice(&xs, &[8]).unwrap();
    type F = fn(f64) -> f64;
    let cases: [(&str, F); 3] = [
        ("asin", f64::asin),
        ("acos", f64::acos),
        ("atan", f64::atan),
    ];
    for (name, f) in cases {
        let got = match name {
            "asin" => t.asin(),
            "acos" => t.acos(),
            _ => t.atan(),
        }
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
        for (x, g) in xs.iter().zip(&got) {
            let want = f(*x);
            assert!(
                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                "{name}({x}) = {g}, want {want}"
            );
        }
    }
    // known values
    let half = Tensor::from_slice(&[0.5f64], &[1]).unwrap();
    let pi = std::f64::consts::PI;
    assert!((half.asin().unwrap().to_vec::<f64>().unwrap()[0] - pi / 6.0).abs() < 1e-15);
    assert!((half.acos().unwrap().to_vec::<f64>().unwrap()[0] - pi / 3.0).abs() < 1e-15);
    let one = Tensor::from_slice(&[1i64], &[1]).unwrap().atan().unwrap();
    assert_eq!(one.dtype(), DType::F32);
    assert_eq!(one.to_vec::<f32>().unwrap()[0], (pi / 4.0) as f32);
}

#[test]
fn eval_into_writes_existing_tensors() {
    let add = Op::Binary(BinaryOp::Add);
    // in place: dst is an input with the same layout
    let x = arange(6, &[2, 3], DType::F32);
    let y = arange(3, &[3], DType::F32);
    let v0 = x.version();
    eval_into(&add, &[&x, &y], &x).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![0., 2., 4., 3., 5., 7.]);
    assert!(x.version() > v0);
    // into a transposed view of another tensor
    let out = Tensor::zeros(&[3, 2], DType::F32);
    let ot = out.t().unwrap();
    eval_into(&add, &[&x, &x], &ot).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![0., 6., 4., 10., 8., 14.]);
    // an input overlapping dst with another layout reads the old values
    let sq = arange(4, &[2, 2], DType::F64);
    let sqt = sq.t().unwrap();
    eval_into(&add, &[&sq, &sqt], &sq).unwrap();
    assert_eq!(sq.to_vec::<f64>().unwrap(), vec![0., 3., 3., 6.]);
    // a result of another dtype is converted to dst's
    let h = Tensor::zeros(&[2], DType::F32);
    let a = Tensor::from_slice(&[1.0f64 / 3.0, 2.0], &[2]).unwrap();
    eval_into(
        &Op::Binary(BinaryOp::Mul),
        &[&h.add_scalar(1).unwrap(), &a],
        &h,
    )
    .unwrap();
    assert_eq!(h.to_vec::<f32>().unwrap(), vec![1.0f32 / 3.0, 2.0]);
    // shape mismatch and an expanded dst are refused
    let small = Tensor::zeros(&[3, 1], DType::F32);
    let e = eval_into(&add, &[&small, &Tensor::zeros(&[1, 4], DType::F32)], &small).unwrap_err();
    assert_eq!(
        e.to_string(),
        "output with shape [3, 1] doesn't match the broadcast shape [3, 4]"
    );
    let wide = small.expand(&[3, 4]).unwrap();
    let e = eval_into(&add, &[&wide, &wide], &wide)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("unsupported operation: more than one element"),
        "{e}"
    );
}

/// The elements as f64 (empty tensors included: they read back as no elements).
fn f64s(t: &Tensor) -> Vec<f64> {
    t.try_to_f64_vec().unwrap()
}

/// A random shape of 0 to 3 dims with sizes 0 to 4.
fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..5, 0..4)
}

/// A tensor of `shape` seen through a non-contiguous layout: a transposed or step-2 slice of
/// a bigger tensor, chosen by `kind`.
fn strided_view(shape: &[usize], kind: u8, seed: f64) -> Tensor {
    let n: usize = shape.iter().product::<usize>() * 2 + 2;
    let data: Vec<f64> = (0..n)
        .map(|i| ((i as f64 + seed) * 0.37).sin() * 10.0)
        .collect();
    let raw = Tensor::from_vec(data, &[n]).unwrap();
    let nd = shape.len();
    match (kind % 3, nd) {
        (0, 2..) => {
            let rev: Vec<i64> = shape.iter().rev().map(|&s| s as i64).collect();
            let total: usize = shape.iter().product();
            let c = raw
                .narrow(0, 0, total as i64)
                .unwrap()
                .reshape(&rev)
                .unwrap();
            let dims: Vec<i64> = (0..nd as i64).rev().collect();
            c.permute(&dims).unwrap()
        }
        (1, 1..) => {
            let mut big: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
            big[nd - 1] *= 2;
            let total: usize = big.iter().product::<i64>() as usize;
            raw.narrow(0, 0, total as i64)
                .unwrap()
                .reshape(&big)
                .unwrap()
                .slice(nd as i64 - 1, Some(0), None, 2)
                .unwrap()
        }
        _ => {
            let total: usize = shape.iter().product();
            let s: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
            raw.narrow(0, 1, total as i64).unwrap().reshape(&s).unwrap()
        }
    }
}

/// `shape` with some dims set to 1 (by `mask`) and some leading dims dropped.
fn broadcastable(shape: &[usize], mask: u8, drop: usize) -> Vec<usize> {
    let d = drop.min(shape.len());
    shape[d..]
        .iter()
        .enumerate()
        .map(|(i, &s)| if mask >> i & 1 == 1 { 1 } else { s })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn ops_on_views_equal_ops_on_copies(shape in shape_strategy(), ka in 0u8..3, kb in 0u8..3, d in 0usize..4) {
        let dt = [DType::F32, DType::F64, DType::I32, DType::F16][d];
        let a = strided_view(&shape, ka, 0.0).to_dtype(dt).unwrap();
        let b = strided_view(&shape, kb, 5.0).to_dtype(dt).unwrap();
        prop_assert_eq!(a.shape(), &shape[..]);
        let (ac, bc) = (a.contiguous().unwrap(), b.contiguous().unwrap());
        for (va, vb) in [(a.mul(&b), ac.mul(&bc)), (a.sub(&b), ac.sub(&bc)), (a.maximum(&b), ac.maximum(&bc)),
            (a.lt(&b), ac.lt(&bc)), (a.abs(), ac.abs())] {
            let (va, vb) = (va.unwrap(), vb.unwrap());
            prop_assert_eq!(va.shape(), vb.shape());
            prop_assert_eq!(f64s(&va), f64s(&vb));
        }
    }

    #[test]
    fn broadcasting_equals_explicit_expand(shape in shape_strategy(), mask in 0u8..16, drop in 0usize..3, left in any::<bool>()) {
        let other = broadcastable(&shape, mask, drop);
        let a = strided_view(&shape, 2, 1.0).to_dtype(DType::F32).unwrap();
        let b = strided_view(&other, 0, 2.0).to_dtype(DType::F32).unwrap();
        let (a, b) = if left { (b, a) } else { (a, b) };
        let out = a.sub(&b).unwrap();
        let size: Vec<i64> = out.shape().iter().map(|&s| s as i64).collect();
        let ae = a.expand(&size).unwrap().contiguous().unwrap();
        let be = b.expand(&size).unwrap().contiguous().unwrap();
        let want: Vec<f64> = f64s(&ae).iter().zip(f64s(&be)).map(|(x, y)| (*x as f32 - y as f32) as f64).collect();
        prop_assert_eq!(f64s(&out), want);
    }
}

/// Python-number operands of operators infer from bare literals: one float and one integer
/// impl each, so `(&w * &w * 3.0).sum()` compiles without a suffix (it did not while f32 and
/// i32 impls stood beside f64 and i64).
#[test]
fn literal_operands_infer_and_keep_pytorch_promotion() {
    let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let s = (&w * &w * 3.0).sum().unwrap();
    assert_eq!(s.item_f64().unwrap(), 15.0);
    assert_eq!(s.dtype(), DType::F32);
    let t = (2 * &w + 1).to_f64_vec();
    assert_eq!(t, vec![3.0, 5.0]);
    let i = Tensor::from_vec(vec![3i32, 4], &[2]).unwrap();
    // i32 + Python int stays i32; i32 * Python float is f32; i32 / i32 is f32
    assert_eq!((&i + 1).dtype(), DType::I32);
    assert_eq!((&i * 0.5).dtype(), DType::F32);
    assert_eq!((&i / 2).to_f64_vec(), vec![1.5, 2.0]);
    assert_eq!((1.0 - &w).to_f64_vec(), vec![0.0, -1.0]);
}

/// `clamp` takes bare numbers, as `torch.clamp(x, 0.0, 6.0)` does, or `Option`s.
#[test]
fn clamp_takes_numbers_and_options() {
    let x = Tensor::from_vec(vec![-2.0f32, 3.0, 9.0, f32::NAN], &[4]).unwrap();
    let y = x.clamp(0.0, 6.0).unwrap().to_f64_vec();
    assert_eq!(&y[..3], &[0.0, 3.0, 6.0]);
    assert!(y[3].is_nan());
    assert_eq!(
        x.clamp(Some(1.0), None::<f64>).unwrap().to_f64_vec()[..3],
        [1.0, 3.0, 9.0]
    );
    let i = Tensor::from_vec(vec![-5i64, 2, 8], &[3]).unwrap();
    let c = i.clamp(0, 6).unwrap();
    assert_eq!(c.dtype(), DType::I64);
    assert_eq!(c.to_f64_vec(), vec![0.0, 2.0, 6.0]);
    // a float bound promotes an integer tensor, as in PyTorch
    assert_eq!(i.clamp(0.5, 6).unwrap().dtype(), DType::F32);
}

/// f64 to f16 and bf16 as PyTorch converts (`c10::BFloat16(float(x))`): through f32, each
/// step rounded to nearest even. The values are PyTorch 2.15's
/// (`torch.tensor(v, dtype=torch.float64).to(torch.bfloat16)`), on the interpreter, eager
/// and compiled code alike.
#[test]
fn casts_to_half_precision_round_through_f32_as_pytorch_does() {
    use smelt::exec::{CompileOptions, CompiledFn};
    let v = vec![
        // just past bf16's tie between -4 and -4.03125, by less than f32 keeps of it in
        // bf16's top bits: -4.03125 (rounding from the f64's top 32 bits gives -4)
        -4.015625 - 2f64.powi(-21),
        // a tie once in f32: to even, 1.0 (rounded once from f64 it would be 1.0078125)
        1.0 + 2f64.powi(-8) + 2f64.powi(-40),
        // the same for f16: 1.0
        1.0 + 2f64.powi(-11) + 2f64.powi(-40),
    ];
    let want_bf16 = vec![-4.03125, 1.0, 1.0];
    let want_f16 = vec![-4.015625, 1.00390625, 1.0];
    let x = Tensor::from_vec(v, &[3]).unwrap();
    assert_eq!(x.to_dtype(DType::BF16).unwrap().to_f64_vec(), want_bf16);
    assert_eq!(x.to_dtype(DType::F16).unwrap().to_f64_vec(), want_f16);
    let text = "graph f(%x: f64[3]) {\n  %b = to(%x, dtype=bf16)\n  %h = to(%x, dtype=f16)\n  \
                %s = mul(%b, 1.0)\n  return %b, %h, %s\n}\n";
    let m = smelt::ir::parse_module(text, "casts.smelt").unwrap();
    let interp = smelt::runtime::interp::run(m.entry(), &[("x".to_string(), x.clone())]).unwrap();
    let compiled = CompiledFn::compile(m.entry(), &CompileOptions::default())
        .unwrap()
        .call(&[x])
        .unwrap();
    for out in [&interp, &compiled] {
        assert_eq!(out[0].to_f64_vec(), want_bf16);
        assert_eq!(out[1].to_f64_vec(), want_f16);
        assert_eq!(out[2].to_f64_vec(), want_bf16);
    }
}
