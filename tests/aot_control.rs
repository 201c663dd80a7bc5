//! Control flow in ahead-of-time models: `cond`, `while_loop`, `fori_loop` and `scan`
//! compiled into the object (each body a block of the plan) and run in this process through
//! the C interface, against the interpreter on several inputs each — both branches, loops of
//! zero iterations, backwards scans over strided slices, nested loops and carries that
//! trade places.

mod common;

use common::{assert_close, inputs_for};
use smelt::aot::{AotOptions, compile};
use smelt::ir::text::parse_module;
use smelt::runtime::interp::run_positional;
use smelt::{DType, Tensor};

fn graph(text: &str) -> smelt::ir::Graph {
    parse_module(text, "aot_control.smelt")
        .unwrap()
        .entry()
        .clone()
}

/// Compiles `text` and checks each call on `cases` (inputs) against the interpreter.
fn agrees(text: &str, cases: &[Vec<Tensor>]) {
    let g = graph(text);
    let loaded = compile(&g, &AotOptions::default())
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .load()
        .unwrap();
    for (n, ins) in cases.iter().enumerate() {
        let want = run_positional(&g, ins).unwrap();
        let got = loaded.run(ins).unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.dtype(), b.dtype());
            assert_eq!(a.shape(), b.shape(), "output {i}, case {n} of\n{text}");
            assert_close(a, b, 1e-5, &format!("output {i}, case {n} of\n{text}"));
        }
    }
}

fn f32s(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn_with(shape, None, &mut smelt::Generator::new(seed)).unwrap()
}

fn scalar_i64(v: i64) -> Tensor {
    Tensor::from_vec(vec![v], &[]).unwrap()
}

fn flag(b: bool) -> Tensor {
    Tensor::from_vec(vec![b], &[]).unwrap()
}

#[test]
fn cond_takes_either_branch() {
    let text = "graph f(%p: bool[], %x: f32[3,4], %w: f32[4,2]) {
  %y, %z = cond(%p, %x, %w, then=@prod, else=@same)
  return %y, %z
}
graph prod(%x: f32[3,4], %w: f32[4,2]) {
  %m = matmul(%x, %w)
  %r = relu(%m)
  %t = transpose(%x, dim0=0, dim1=1)
  %n = narrow(%t, dim=1, start=1, length=2)
  return %r, %n
}
graph same(%x: f32[3,4], %w: f32[4,2]) {
  %a = narrow(%x, dim=1, start=0, length=2)
  %s = add(%a, 1.0)
  return %s, %w
}";
    let (x, w) = (randn(&[3, 4], 1), randn(&[4, 2], 2));
    agrees(
        text,
        &[
            vec![flag(true), x.clone(), w.clone()],
            vec![flag(false), x, w],
        ],
    );
}

#[test]
fn while_loops_run_until_their_condition_fails() {
    // fib-like carries that trade places: the body returns one input unchanged
    let text = "graph f(%a: f32[4], %b: f32[4]) {
  %x, %y = while_loop(%a, %b, cond=@small, body=@step)
  return %x, %y
}
graph small(%a: f32[4], %b: f32[4]) {
  %s = sum(%b)
  %c = lt(%s, 50.0)
  return %c
}
graph step(%a: f32[4], %b: f32[4]) {
  %n = add(%a, %b)
  return %b, %n
}";
    let cases = [
        vec![f32s(&[1.0, 0.5, 0.25, 2.0], &[4]), f32s(&[1.0; 4], &[4])],
        // false at once: zero iterations
        vec![f32s(&[1.0; 4], &[4]), f32s(&[20.0; 4], &[4])],
    ];
    agrees(text, &cases);
}

#[test]
fn fori_loops_count_from_lower_to_upper() {
    let text = "graph f(%lo: i64[], %hi: i64[], %x: f32[2,3]) {
  %y, %k = fori_loop(%lo, %hi, %x, 0.0, body=@step)
  return %y, %k
}
graph step(%i: i64[], %x: f32[2,3], %k: f64[]) {
  %f = to(%i, dtype=f32)
  %t = tanh(%x)
  %y = add(%t, %f)
  %k2 = add(%k, %f)
  return %y, %k2
}";
    let x = randn(&[2, 3], 3);
    let cases: Vec<Vec<Tensor>> = [(0, 3), (2, 7), (5, 5), (4, 1), (-2, 2)]
        .iter()
        .map(|&(lo, hi)| vec![scalar_i64(lo), scalar_i64(hi), x.clone()])
        .collect();
    agrees(text, &cases);
}

#[test]
fn scans_walk_strided_slices_both_ways() {
    for reverse in [false, true] {
        let text = format!(
            "graph f(%c: f32[3], %xs: f32[3,5]) {{
  %t = transpose(%xs, dim0=0, dim1=1)
  %d, %ys, %zs = scan(%c, %t, body=@s, carries=1, reverse={reverse})
  return %d, %ys, %zs
}}
graph s(%c: f32[3], %x: f32[3]) {{
  %d = add(%c, %x)
  %y = mul(%d, 2.0)
  %e = exp(%x)
  return %d, %y, %e
}}"
        );
        agrees(&text, &[vec![randn(&[3], 5), randn(&[3, 5], 6)]]);
    }
}

#[test]
fn loops_nest_and_bodies_hold_library_ops() {
    // a scan whose body runs a fori_loop of products and a cond, over slices of a batch
    let text = "graph f(%h: f32[2,2], %xs: f32[4,2,2], %n: i64[]) {
  %hn, %nn, %ys = scan(%h, %n, %xs, body=@cell, carries=2)
  return %hn, %ys
}
graph cell(%h: f32[2,2], %n: i64[], %x: f32[2,2]) {
  %m, %x2 = fori_loop(0, %n, %h, %x, body=@power)
  %s = sum(%m)
  %p = gt(%s, 0.0)
  %r = cond(%p, %m, then=@keep, else=@flip)
  %c = cat(%r, %x, dim=0)
  %y = sum(%c, dim=[0])
  return %r, %n, %y
}
graph power(%i: i64[], %m: f32[2,2], %x: f32[2,2]) {
  %p = matmul(%m, %x)
  %t = tanh(%p)
  return %t, %x
}
graph keep(%m: f32[2,2]) {
  return %m
}
graph flip(%m: f32[2,2]) {
  %t = transpose(%m, dim0=0, dim1=1)
  %z = neg(%t)
  return %z
}";
    let cases: Vec<Vec<Tensor>> = (0..4)
        .map(|n| {
            vec![
                randn(&[2, 2], 7 + n),
                randn(&[4, 2, 2], 8 + n),
                scalar_i64(n as i64),
            ]
        })
        .collect();
    agrees(text, &cases);
}

#[test]
fn control_ops_of_the_op_table_run_on_random_inputs() {
    // the one-op graphs of tests/aot_ops.rs, run rather than only compiled
    let cases = [
        "graph c(%p: bool[], %x: f32[3]) {\n  %y = cond(%p, %x, then=@pos, else=@neg)\n  return %y\n}\ngraph pos(%x: f32[3]) {\n  %y = relu(%x)\n  return %y\n}\ngraph neg(%x: f32[3]) {\n  %y = neg(%x)\n  return %y\n}",
        "graph w(%x: f32[3]) {\n  %y = while_loop(%x, cond=@small, body=@grow)\n  return %y\n}\ngraph small(%x: f32[3]) {\n  %s = sum(%x)\n  %c = lt(%s, 100.0)\n  return %c\n}\ngraph grow(%x: f32[3]) {\n  %y = add(%x, 1.0)\n  return %y\n}",
        "graph main(%c: f64[3], %xs: f64[5,3]) {\n  %d, %ys: f64[5,3] = scan(%c, %xs, body=@s, carries=1)\n  return %d, %ys\n}\ngraph s(%c: f64[3], %x: f64[3]) {\n  %d = add(%c, %x)\n  %y = mul(%d, 2.0)\n  return %d, %y\n}",
    ];
    for text in cases {
        let g = graph(text);
        let ins: Vec<Vec<Tensor>> = (0..3)
            .map(|seed| {
                inputs_for(&g, seed)
                    .into_iter()
                    // keep infinities out of the while loop's sum: it would never end
                    .map(|t| match t.dtype() {
                        DType::F32 | DType::F64 => t.clamp(-1e3, 1e3).unwrap(),
                        _ => t,
                    })
                    .collect()
            })
            .collect();
        agrees(text, &ins);
    }
}
