//! PyTorch's attribute forms of version-1 ops: `div(x, y, rounding_mode="floor"|"trunc")`,
//! `add`/`sub` with `alpha=`, and `scatter` with a bare number as `value`. Known values are
//! Python's and PyTorch's documented results; compiled code (fused and unfused) is compared
//! with the reference interpreter on random inputs, broadcasts and transposed views.

mod common;

use common::close::{Tol, assert_close};
use common::inputs::inputs_for;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::{parse_module, print_graph};
use smelt::runtime::interp;
use smelt::{DType, Tensor};

fn t64(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

fn ti64(v: &[i64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

/// The reference interpreter on inputs in the graph's order.
fn interp_run(g: &smelt::ir::Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    let named: Vec<(String, Tensor)> = g
        .inputs()
        .iter()
        .zip(inputs)
        .map(|(&v, t)| (g.node(v).name.clone(), t.clone()))
        .collect();
    interp::run(g, &named).unwrap()
}

/// Bit patterns, every NaN as one (x86 makes 0/0 a negative NaN); zeros keep their sign.
fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec()
        .iter()
        .map(|x| {
            if x.is_nan() {
                f64::NAN.to_bits()
            } else {
                x.to_bits()
            }
        })
        .collect()
}

#[test]
fn floor_and_trunc_division_of_floats_give_pythons_results() {
    let a = t64(&[7.0, -7.0, 7.0, -7.0, 1.0, 0.0, -0.5, 1.0, -1.0, 0.0, 5.5]);
    let b = t64(&[
        2.0,
        2.0,
        -2.0,
        -2.0,
        0.1,
        -1.0,
        1.0,
        0.0,
        0.0,
        0.0,
        f64::INFINITY,
    ]);
    // Python: 7.0 // 2.0, ..., 1.0 // 0.1 == 9.0, 0.0 // -1.0 == -0.0, 5.5 // inf == 0.0
    let floor = [
        3.0,
        -4.0,
        -4.0,
        3.0,
        9.0,
        -0.0,
        -1.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        0.0,
    ];
    let got = a.floor_divide(&b).unwrap();
    assert_eq!(got.dtype(), DType::F64);
    assert_eq!(bits(&got), bits(&t64(&floor)));
    // math.trunc(a / b): 1 / 0.1 is 10.0 in doubles
    let trunc = [
        3.0,
        -3.0,
        -3.0,
        3.0,
        10.0,
        -0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        0.0,
    ];
    assert_eq!(bits(&a.div_trunc(&b).unwrap()), bits(&t64(&trunc)));
}

#[test]
fn float32_quotients_round_in_float32_as_pytorch() {
    // torch.div(torch.tensor(1.), torch.tensor(.1), rounding_mode="trunc") is 10: the f32
    // quotient rounds to 10.0f; in f64 it would be 9.99999985 and truncate to 9
    let a = Tensor::from_vec(vec![1.0f32, -1.0, 3.0], &[3]).unwrap();
    let b = Tensor::from_vec(vec![0.1f32, 0.1, 0.3], &[3]).unwrap();
    assert_eq!(
        a.div_trunc(&b).unwrap().to_vec::<f32>().unwrap(),
        [10.0, -10.0, 10.0]
    );
    // floor goes through fmod: 1 // 0.1f is 9 (as 1.0 // 0.1 in Python)
    assert_eq!(
        a.floor_divide(&b).unwrap().to_vec::<f32>().unwrap(),
        [9.0, -10.0, 9.0]
    );
}

#[test]
fn integer_floor_and_trunc_division_stay_integers_and_refuse_zero() {
    let a = ti64(&[7, -7, 7, -7, 0, 9, -9]);
    let b = ti64(&[2, 2, -2, -2, 5, 3, 3]);
    let f = a.floor_divide(&b).unwrap();
    assert_eq!(f.dtype(), DType::I64);
    assert_eq!(f.to_i64_vec(), [3, -4, -4, 3, 0, 3, -3]);
    assert_eq!(
        a.div_trunc(&b).unwrap().to_i64_vec(),
        [3, -3, -3, 3, 0, 3, -3]
    );
    // u8 and i8 operands promote to i16
    let u = Tensor::from_vec(vec![200u8, 7], &[2]).unwrap();
    let s = Tensor::from_vec(vec![-3i8, 2], &[2]).unwrap();
    let q = u.floor_divide(&s).unwrap();
    assert_eq!(q.dtype(), DType::I16);
    assert_eq!(q.to_i64_vec(), [-67, 3]);
    // Python scalar divisors keep the tensor's dtype
    assert_eq!(
        a.floor_divide_scalar(-4).unwrap().to_i64_vec(),
        [-2, 1, -2, 1, 0, -3, 2]
    );
    for e in [
        a.floor_divide(&ti64(&[1, 1, 1, 0, 1, 1, 1])).unwrap_err(),
        a.div_trunc_scalar(0).unwrap_err(),
    ] {
        assert!(e.to_string().contains("ZeroDivisionError"), "{e}");
    }
    let flags = Tensor::from_vec(vec![true, false], &[2]).unwrap();
    let e = flags.floor_divide(&flags).unwrap_err().to_string();
    assert!(e.contains("not implemented for 'Bool'"), "{e}");
}

fn compile_both(text: &str) -> (smelt::ir::Graph, CompiledFn, CompiledFn) {
    let m = parse_module(text, "forms.smelt").unwrap();
    let g = m.graphs[0].clone();
    let fused = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
    let unfused = CompiledFn::compile(&g, &CompileOptions::default().fused(false)).unwrap();
    (g, fused, unfused)
}

/// Compiled fused and unfused against the interpreter, bit for bit (every one of these ops
/// is exactly rounded once its quotient is).
fn check_against_interp(text: &str, inputs: &[Tensor]) {
    let (g, fused, unfused) = compile_both(text);
    let want = interp_run(&g, inputs);
    for (how, f) in [("fused", &fused), ("unfused", &unfused)] {
        let got = f.call(inputs).unwrap();
        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
            assert_eq!(x.dtype(), y.dtype(), "{how} output {i}");
            assert_eq!(x.shape(), y.shape(), "{how} output {i}");
            assert_eq!(bits(x), bits(y), "{how} output {i} of\n{text}");
        }
    }
}

#[test]
fn compiled_rounding_divisions_match_the_interpreter() {
    // floats: random operands, a broadcast row, a transposed view, the f32 helper path
    let text = "graph g(%x: f32[6, 5], %y: f32[5], %w: f64[5, 6]) {
  %t = t(%w)
  %a = div(%x, %y, rounding_mode=\"floor\")
  %b = div(%x, %y, rounding_mode=\"trunc\")
  %c = div(%t, %x, rounding_mode=\"floor\")
  %d = div(%t, -0.7, rounding_mode=\"trunc\")
  %e = mul(%a, %b)
  return %e, %c, %d
}
";
    let (g, _, _) = compile_both(text);
    for seed in 0..4 {
        let ins = inputs_for(&g, seed);
        check_against_interp(text, &ins);
    }
    // exact quotients, negative zeros and zero divisors
    let x = Tensor::from_vec(
        vec![1.0f32, -1.0, 0.0, -0.0, 6.0, -6.0, 1e30, 5.0, -5.0, 0.0],
        &[2, 5],
    )
    .unwrap()
    .repeat(&[3, 1])
    .unwrap();
    let y = Tensor::from_vec(vec![0.1f32, 3.0, -2.0, 0.0, -0.5], &[5]).unwrap();
    let w = Tensor::from_vec((0..30).map(|i| i as f64 - 15.0).collect(), &[5, 6]).unwrap();
    check_against_interp(text, &[x, y, w]);
}

#[test]
fn compiled_integer_divisions_match_and_report_zero_divisors() {
    let text = "graph g(%x: i32[4, 6], %y: i32[6], %u: u8[4, 6], %s: i8[6], %l: i64[6]) {
  %a = div(%x, %y, rounding_mode=\"floor\")
  %b = div(%x, %y, rounding_mode=\"trunc\")
  %c = div(%u, %s, rounding_mode=\"floor\")
  %d = div(%l, -1, rounding_mode=\"floor\")
  %e = add(%a, %b)
  return %e, %c, %d
}
";
    let x = Tensor::from_vec(
        (0..24).map(|i| i * 37 % 101 - 50).collect::<Vec<i32>>(),
        &[4, 6],
    )
    .unwrap();
    let y = Tensor::from_vec(vec![3i32, -4, 7, -1, 1, 50], &[6]).unwrap();
    let u = Tensor::from_vec(
        (0..24).map(|i| (i * 11) as u8).collect::<Vec<u8>>(),
        &[4, 6],
    )
    .unwrap();
    let s = Tensor::from_vec(vec![-3i8, 2, -128, 127, 1, -1], &[6]).unwrap();
    // MIN // -1 wraps to MIN, as the reference does
    let l = ti64(&[i64::MIN, -7, 7, 0, i64::MAX, 1]);
    check_against_interp(text, &[x.clone(), y, u.clone(), s.clone(), l.clone()]);
    let (_, fused, unfused) = compile_both(text);
    let y0 = Tensor::from_vec(vec![3i32, -4, 0, -1, 1, 50], &[6]).unwrap();
    for f in [&fused, &unfused] {
        let e = f
            .call(&[x.clone(), y0.clone(), u.clone(), s.clone(), l.clone()])
            .unwrap_err();
        assert!(e.to_string().contains("ZeroDivisionError"), "{e}");
    }
}

#[test]
fn rounding_mode_prints_back_and_bad_modes_are_errors_with_a_position() {
    let text = "graph g(%x: f32[3], %y: f32[3]) {
  %a: f32[3] = div(%x, %y, rounding_mode=\"floor\")
  %b: f32[3] = div(%a, %y, rounding_mode=\"trunc\")
  %c: f32[3] = div(%b, %y)
  return %c
}
";
    let m = parse_module(text, "m").unwrap();
    assert_eq!(print_graph(&m.graphs[0]), text);
    let bad = text.replace("\"trunc\"", "\"round\"");
    let e = parse_module(&bad, "bad.smelt").unwrap_err().to_string();
    assert!(
        e.contains("bad.smelt:3:")
            && e.contains("rounding_mode to be one of None, 'trunc', or 'floor' but found 'round'"),
        "{e}"
    );
    let e = parse_module(&text.replace("\"trunc\"", "1"), "m").unwrap_err();
    assert!(e.to_string().contains("rounding_mode"), "{e}");
}

#[test]
fn add_and_sub_with_alpha_scale_the_second_operand() {
    let text = "graph g(%x: f32[4], %y: f32[4], %i: i64[4], %j: i64[4]) {
  %a = add(%x, %y, alpha=2.5)
  %b = sub(%x, %y, alpha=-3)
  %c = add(%i, %j, alpha=4)
  %d = sub(%i, %j, alpha=1)
  return %a, %b, %c, %d
}
";
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 0.5, 8.0], &[4]).unwrap();
    let y = Tensor::from_vec(vec![0.25f32, 4.0, -1.0, 3.0], &[4]).unwrap();
    let i = ti64(&[1, -2, 3, 100]);
    let j = ti64(&[5, 6, -7, 8]);
    let m = parse_module(text, "m").unwrap();
    let g = &m.graphs[0];
    let outs = interp_run(g, &[x.clone(), y.clone(), i.clone(), j.clone()]);
    assert_eq!(outs[0].to_vec::<f32>().unwrap(), [1.625, 8.0, -2.0, 15.5]);
    assert_eq!(outs[1].to_vec::<f32>().unwrap(), [1.75, 10.0, -2.5, 17.0]);
    assert_eq!(outs[2].to_i64_vec(), [21, 22, -25, 132]);
    assert_eq!(outs[3].to_i64_vec(), [-4, -8, 10, 92]);
    // the same through the eager methods and compiled code
    assert_eq!(
        x.add_alpha(&y, 2.5).unwrap().to_vec::<f32>().unwrap(),
        [1.625, 8.0, -2.0, 15.5]
    );
    assert_eq!(i.sub_alpha(&j, 1).unwrap().to_i64_vec(), [-4, -8, 10, 92]);
    check_against_interp(text, &[x, y, i, j]);
    // alpha=1 adds no op; other alphas add one named after the statement
    let printed = print_graph(g);
    assert!(
        printed.contains("%a.alpha: f32[4] = mul(%y, 2.5)"),
        "{printed}"
    );
    assert!(!printed.contains("%d.alpha"), "{printed}");
    assert_eq!(
        print_graph(&parse_module(&printed, "m").unwrap().graphs[0]),
        printed
    );
}

#[test]
fn alpha_is_checked_against_the_operand_dtypes_as_pytorch_does() {
    let bad = [
        (
            "graph g(%i: i64[2]) {\n  %a = add(%i, %i, alpha=0.5)\n  return %a\n}\n",
            "For integral input tensors, argument alpha must not be a floating point number.",
        ),
        (
            "graph g(%x: f32[2]) {\n  %a = sub(%x, %x, alpha=true)\n  return %a\n}\n",
            "Boolean alpha only supported for Boolean results.",
        ),
        (
            "graph g(%x: f32[2]) {\n  %a = add(%x, %x, alpha=\"2\")\n  return %a\n}\n",
            "attribute 'alpha' of 'add' expects a number",
        ),
    ];
    for (text, want) in bad {
        let e = parse_module(text, "a.smelt").unwrap_err().to_string();
        assert!(e.contains("a.smelt:2:") && e.contains(want), "{e}");
    }
    let i = ti64(&[1, 2]);
    let e = i.add_alpha(&i, 0.5).unwrap_err().to_string();
    assert!(
        e.contains("alpha must not be a floating point number"),
        "{e}"
    );
    // bool alpha with bool tensors: logical or with the scaled operand
    let b = Tensor::from_vec(vec![true, false], &[2]).unwrap();
    let f = Tensor::from_vec(vec![false, false], &[2]).unwrap();
    assert_eq!(f.add_alpha(&b, true).unwrap().to_i64_vec(), [1, 0]);
}

#[test]
fn alpha_has_the_gradient_of_the_scaled_operand() {
    let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3]).unwrap();
    let y = Tensor::from_vec(vec![4.0f64, 5.0, 6.0], &[3]).unwrap();
    x.requires_grad_(true).unwrap();
    y.requires_grad_(true).unwrap();
    x.sub_alpha(&y, 2.5)
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(x.grad().unwrap().to_f64_vec(), [1.0, 1.0, 1.0]);
    assert_eq!(y.grad().unwrap().to_f64_vec(), [-2.5, -2.5, -2.5]);
}

#[test]
fn rounded_quotients_have_a_zero_gradient() {
    // derivatives.yaml: div with a rounding_mode gives grad.zero_() for both operands
    let x = Tensor::from_vec(vec![7.0f64, -7.5, 3.0], &[3]).unwrap();
    let y = Tensor::from_vec(vec![2.0f64, 2.0, -0.5], &[3]).unwrap();
    x.requires_grad_(true).unwrap();
    y.requires_grad_(true).unwrap();
    let q = x
        .floor_divide(&y)
        .unwrap()
        .add(&x.div_trunc(&y).unwrap())
        .unwrap();
    q.add(&x).unwrap().sum().unwrap().backward().unwrap();
    // only the added x contributes
    assert_eq!(x.grad().unwrap().to_f64_vec(), [1.0, 1.0, 1.0]);
    let gy = y.grad().map(|g| g.to_f64_vec());
    assert!(gy.as_ref().is_none_or(|g| g == &[0.0, 0.0, 0.0]), "{gy:?}");
}

#[test]
fn scatter_with_a_number_writes_it_at_every_index() {
    // torch.zeros(3, 4).scatter(1, torch.tensor([[0, 2], [1, 1]]), 1.5)
    let text = "graph g(%m: f32[3, 4], %idx: i64[2, 2]) {
  %s = scatter(%m, %idx, 1.5, dim=1)
  %k = scatter(%m, %idx, -2, dim=0)
  return %s, %k
}
";
    let m = Tensor::zeros(&[3, 4], DType::F32);
    let idx = Tensor::from_vec(vec![0i64, 2, 1, 1], &[2, 2]).unwrap();
    let g = parse_module(text, "m").unwrap().graphs[0].clone();
    let outs = interp_run(&g, &[m.clone(), idx.clone()]);
    assert_eq!(
        outs[0].to_vec::<f32>().unwrap(),
        [1.5, 0.0, 1.5, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    );
    // dim 0: row idx[i][j] of column j: (0, 0), (2, 1), (1, 0), (1, 1)
    assert_eq!(
        outs[1].to_vec::<f32>().unwrap(),
        [
            -2.0, 0.0, 0.0, 0.0, -2.0, -2.0, 0.0, 0.0, 0.0, -2.0, 0.0, 0.0
        ]
    );
    let eager = m.scatter_value(1, &idx, 1.5).unwrap();
    assert_eq!(
        eager.to_vec::<f32>().unwrap(),
        outs[0].to_vec::<f32>().unwrap()
    );
    check_against_interp(text, &[m.clone(), idx.clone()]);
    let bad = Tensor::from_vec(vec![0i64, 4, 1, 1], &[2, 2]).unwrap();
    assert!(m.scatter_value(1, &bad, 1.0).is_err());
    let ints = Tensor::zeros(&[2, 2], DType::I32);
    let w = ints.scatter_value(0, &Tensor::from_vec(vec![1i64, 0], &[1, 2]).unwrap(), 7.9);
    assert_eq!(w.unwrap().to_i64_vec(), [0, 7, 7, 0]);
}

#[test]
fn rounding_divisions_of_halves_match_their_float32_results() {
    let a = Tensor::from_vec(vec![7.0f32, -7.0, 1.0, 100.0, -0.25], &[5]).unwrap();
    let b = Tensor::from_vec(vec![2.0f32, 2.0, 0.1, 3.0, 8.0], &[5]).unwrap();
    for d in [DType::F16, DType::BF16] {
        let (ah, bh) = (a.to_dtype(d).unwrap(), b.to_dtype(d).unwrap());
        let want = ah
            .to_dtype(DType::F32)
            .unwrap()
            .floor_divide(&bh.to_dtype(DType::F32).unwrap())
            .unwrap();
        let got = ah.floor_divide(&bh).unwrap();
        assert_eq!(got.dtype(), d);
        assert_close(
            &got.to_f64_vec(),
            &want.to_f64_vec(),
            Tol::EXACT,
            "floor of halves",
        );
        let text = format!(
            "graph g(%a: {0}[5], %b: {0}[5]) {{\n  %q = div(%a, %b, rounding_mode=\"floor\")\n  %r = div(%a, %b, rounding_mode=\"trunc\")\n  return %q, %r\n}}\n",
            d.name()
        );
        check_against_interp(&text, &[ah, bh]);
    }
}
