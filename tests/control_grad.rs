//! Gradients through control flow: `cond` (the taken branch's), `scan` forward and reversed,
//! `fori_loop` with constant bounds, nested loops; each against the gradient of the same
//! program unrolled by hand (plain ops, differentiated by the ordinary rules) and against
//! central differences in float64. `while_loop` is refused, as in JAX.

use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::graph::Graph;
use smelt::ir::parse_module;
use smelt::passes::autodiff::autodiff;
use smelt::{DType, Tensor};

fn parse(text: &str) -> Graph {
    parse_module(text, "grad.smelt")
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .entry()
        .clone()
}

fn randn(shape: &[usize]) -> Tensor {
    Tensor::randn(shape, Some(DType::F64)).unwrap()
}

/// The gradients of the sum of `g`'s outputs with respect to `wrt`, on the interpreter.
fn grads(g: &Graph, wrt: &[&str], inputs: &[Tensor]) -> Vec<Tensor> {
    let d = autodiff(g, wrt).unwrap_or_else(|e| panic!("{e}"));
    let out = smelt::jit::run_graph(&d, inputs).unwrap();
    out[out.len() - wrt.len()..].to_vec()
}

fn close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}: {x} vs {y}");
    }
}

/// Central differences of the sum of the outputs with respect to input `k`.
fn numeric(g: &Graph, inputs: &[Tensor], k: usize) -> Tensor {
    let f = |xs: &[Tensor]| -> f64 {
        smelt::jit::run_graph(g, xs)
            .unwrap()
            .iter()
            .map(|t| t.to_f64_vec().iter().sum::<f64>())
            .sum()
    };
    let base = inputs[k].to_f64_vec();
    let h = 1e-6;
    let mut grad = Vec::with_capacity(base.len());
    for i in 0..base.len() {
        let at = |d: f64| {
            let mut v = base.clone();
            v[i] += d;
            let mut xs = inputs.to_vec();
            xs[k] = Tensor::from_vec(v, inputs[k].shape()).unwrap();
            f(&xs)
        };
        grad.push((at(h) - at(-h)) / (2.0 * h));
    }
    Tensor::from_vec(grad, inputs[k].shape()).unwrap()
}

/// Checks the control-flow gradient against the unrolled one and central differences, and
/// the compiled gradient graph against the interpreter.
fn check(looped: &str, unrolled: &str, wrt: &[&str], inputs: &[Tensor]) {
    let g = parse(looped);
    let u = parse(unrolled);
    let got = grads(&g, wrt, inputs);
    let want = grads(&u, wrt, inputs);
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        close(
            a,
            b,
            1e-10,
            &format!("d/d{} against the unrolled graph", wrt[k]),
        );
    }
    for (k, name) in wrt.iter().enumerate() {
        let pos = g
            .inputs()
            .iter()
            .position(|&v| g.node(v).name == *name)
            .unwrap();
        close(
            &got[k],
            &numeric(&g, inputs, pos),
            1e-5,
            &format!("d/d{name} numerically"),
        );
    }
    let d = autodiff(&g, wrt).unwrap();
    let interp = smelt::jit::run_graph(&d, inputs).unwrap();
    for fuse in [true, false] {
        let f = CompiledFn::compile(&d, &CompileOptions::default().fused(fuse)).unwrap();
        for (a, b) in f.call(inputs).unwrap().iter().zip(&interp) {
            close(a, b, 1e-9, "compiled gradient graph");
        }
    }
}

const SCAN_BODY: &str = "
graph s(%c: f64[3], %w: f64[3], %x: f64[3]) {
  %m = mul(%c, %w)
  %n = add(%m, %x)
  %t = tanh(%n)
  %y = mul(%t, %x)
  return %t, %w, %y
}";

fn scan_unrolled(len: usize, reverse: bool) -> String {
    let mut s = format!(
        "graph main(%c: f64[3], %w: f64[3], %xs: f64[{len},3]) {{
"
    );
    let mut c = "c".to_string();
    let mut ys = vec![String::new(); len];
    for step in 0..len {
        let t = if reverse { len - 1 - step } else { step };
        s += &format!("  %x{t} = select(%xs, dim=0, index={t})\n");
        s += &format!(
            "  %m{t} = mul(%{c}, %w)\n  %n{t} = add(%m{t}, %x{t})\n  %t{t} = tanh(%n{t})\n  %y{t} = mul(%t{t}, %x{t})\n"
        );
        c = format!("t{t}");
        ys[t] = format!("%y{t}");
    }
    s += &format!(
        "  %ys = stack({}, dim=0)\n  return %{c}, %ys\n}}\n",
        ys.join(", ")
    );
    s
}

#[test]
fn scan_gradient_matches_the_unrolled_loop() {
    for (len, reverse) in [(4, false), (3, true), (1, false)] {
        let looped = format!(
            "graph main(%c: f64[3], %w: f64[3], %xs: f64[{len},3]) {{
  %cf, %w2, %ys = scan(%c, %w, %xs, body=@s, carries=2, reverse={reverse})
  return %cf, %ys
}}
{SCAN_BODY}"
        );
        let inputs = [randn(&[3]), randn(&[3]), randn(&[len, 3])];
        check(
            &looped,
            &scan_unrolled(len, reverse),
            &["c", "w", "xs"],
            &inputs,
        );
    }
}

#[test]
fn fori_loop_gradient_with_constant_bounds() {
    let looped = "
graph main(%x: f64[2,2], %a: f64[2]) {
  %y, %a2 = fori_loop(2, 5, %x, %a, body=@b)
  return %y
}
graph b(%i: i64[], %x: f64[2,2], %a: f64[2]) {
  %f = to(%i, dtype=f64)
  %s = mul(%x, %a)
  %t = sin(%s)
  %u = mul(%t, %f)
  return %u, %a
}";
    let mut unrolled = String::from("graph main(%x: f64[2,2], %a: f64[2]) {\n");
    let mut x = "x".to_string();
    for i in 2..5 {
        unrolled += &format!(
            "  %s{i} = mul(%{x}, %a)\n  %t{i} = sin(%s{i})\n  %u{i} = mul(%t{i}, {i}.0)\n"
        );
        x = format!("u{i}");
    }
    unrolled += &format!("  return %{x}\n}}\n");
    check(
        looped,
        &unrolled,
        &["x", "a"],
        &[randn(&[2, 2]), randn(&[2])],
    );
}

#[test]
fn cond_gradient_is_the_taken_branch() {
    let looped = "
graph main(%p: bool[], %x: f64[3], %y: f64[3]) {
  %z = cond(%p, %x, %y, then=@t, else=@e)
  return %z
}
graph t(%x: f64[3], %y: f64[3]) {
  %m = mul(%x, %y)
  %e = exp(%m)
  return %e
}
graph e(%x: f64[3], %y: f64[3]) {
  %s = sub(%x, %y)
  %q = mul(%s, %s)
  return %q
}";
    let then_u = "graph main(%p: bool[], %x: f64[3], %y: f64[3]) {\n  %m = mul(%x, %y)\n  %e = exp(%m)\n  return %e\n}";
    let else_u = "graph main(%p: bool[], %x: f64[3], %y: f64[3]) {\n  %s = sub(%x, %y)\n  %q = mul(%s, %s)\n  return %q\n}";
    for (p, unrolled) in [(true, then_u), (false, else_u)] {
        let inputs = [Tensor::scalar(p), randn(&[3]), randn(&[3])];
        check(looped, unrolled, &["x", "y"], &inputs);
    }
}

#[test]
fn nested_cond_inside_a_scan() {
    let looped = "
graph main(%c: f64[2], %xs: f64[3,2], %ps: bool[3]) {
  %cf, %ys = scan(%c, %xs, %ps, body=@s, carries=1)
  return %cf, %ys
}
graph s(%c: f64[2], %x: f64[2], %p: bool[]) {
  %n = cond(%p, %c, %x, then=@t, else=@e)
  %y = mul(%n, 3.0)
  return %n, %y
}
graph t(%c: f64[2], %x: f64[2]) {
  %m = mul(%c, %x)
  return %m
}
graph e(%c: f64[2], %x: f64[2]) {
  %m = add(%c, %x)
  %r = tanh(%m)
  return %r
}";
    let ps = [true, false, true];
    let mut unrolled = String::from("graph main(%c: f64[2], %xs: f64[3,2], %ps: bool[3]) {\n");
    let mut c = "c".to_string();
    let mut ys = Vec::new();
    for (t, p) in ps.iter().enumerate() {
        unrolled += &format!("  %x{t} = select(%xs, dim=0, index={t})\n");
        if *p {
            unrolled += &format!("  %n{t} = mul(%{c}, %x{t})\n");
        } else {
            unrolled += &format!("  %m{t} = add(%{c}, %x{t})\n  %n{t} = tanh(%m{t})\n");
        }
        unrolled += &format!("  %y{t} = mul(%n{t}, 3.0)\n");
        c = format!("n{t}");
        ys.push(format!("%y{t}"));
    }
    unrolled += &format!(
        "  %ys = stack({}, dim=0)\n  return %{c}, %ys\n}}\n",
        ys.join(", ")
    );
    let inputs = [
        randn(&[2]),
        randn(&[3, 2]),
        Tensor::from_vec(ps.to_vec(), &[3]).unwrap(),
    ];
    check(looped, &unrolled, &["c", "xs"], &inputs);
}

#[test]
fn while_loop_is_forward_only() {
    let g = parse(
        "
graph main(%x: f64[2]) {
  %y = while_loop(%x, cond=@c, body=@b)
  return %y
}
graph c(%x: f64[2]) {
  %s = sum(%x)
  %k = lt(%s, 10.0)
  return %k
}
graph b(%x: f64[2]) {
  %y = mul(%x, 2.0)
  return %y
}",
    );
    let e = autodiff(&g, &["x"]).unwrap_err();
    assert!(
        e.to_string().contains("while_loop is not differentiable"),
        "{e}"
    );
}

#[test]
fn fori_loop_with_value_bounds_is_refused() {
    let g = parse(
        "
graph main(%x: f64[2], %n: i64[]) {
  %y = fori_loop(0, %n, %x, body=@b)
  return %y
}
graph b(%i: i64[], %x: f64[2]) {
  %y = mul(%x, 2.0)
  return %y
}",
    );
    let e = autodiff(&g, &["x"]).unwrap_err();
    assert!(e.to_string().contains("constant trip count"), "{e}");
}

/// The leading sizes of the control results of a graph (a scan's stacked outputs).
fn saved_rows(g: &Graph) -> Vec<usize> {
    g.topo_order()
        .into_iter()
        .filter(|&v| g.node(v).op().is_some_and(|o| o.name() == "result"))
        .map(|v| g.node(v).ty.shape.first().copied().unwrap_or(0))
        .collect()
}

#[test]
fn checkpointed_scans_save_every_kth_carry_and_agree() {
    use smelt::passes::autodiff::{GradOptions, autodiff_opts};
    for (len, every, reverse) in [(6, 2, false), (6, 3, true), (7, 3, false), (8, 4, false)] {
        let looped = format!(
            "graph main(%c: f64[3], %w: f64[3], %xs: f64[{len},3]) {{
  %cf, %w2, %ys = scan(%c, %w, %xs, body=@s, carries=2, reverse={reverse})
  return %cf, %ys
}}
{SCAN_BODY}"
        );
        let g = parse(&looped);
        let inputs = [randn(&[3]), randn(&[3]), randn(&[len, 3])];
        let wrt = ["c", "w", "xs"];
        let want = grads(&g, &wrt, &inputs);
        let opts = GradOptions {
            checkpoint_every: every,
            ..GradOptions::default()
        };
        let d = autodiff_opts(&g, &wrt, &opts).unwrap();
        let out = smelt::jit::run_graph(&d, &inputs).unwrap();
        for (k, (a, b)) in out[out.len() - 3..].iter().zip(&want).enumerate() {
            close(
                a,
                b,
                1e-12,
                &format!("len {len} every {every}: d/d{}", wrt[k]),
            );
        }
        let f = CompiledFn::compile(&d, &CompileOptions::default()).unwrap();
        for (a, b) in f.call(&inputs).unwrap().iter().zip(&out) {
            close(a, b, 1e-9, "compiled checkpointed gradient");
        }
        // the outer graph saves one carry per chunk (a divisor of the length up to `every`)
        let k = (1..=every).rev().find(|d| len % d == 0).unwrap();
        let rows = saved_rows(&d);
        if k > 1 {
            assert!(
                rows.contains(&(len / k)),
                "len {len} every {every}: {rows:?}"
            );
        }
    }
}

#[test]
fn a_scan_saves_its_carries_itself_and_runs_forward_once() {
    let len = 5;
    let looped = format!(
        "graph main(%c: f64[3], %w: f64[3], %xs: f64[{len},3]) {{
  %cf, %w2, %ys = scan(%c, %w, %xs, body=@s, carries=2)
  return %cf, %ys
}}
{SCAN_BODY}"
    );
    let g = parse(&looped);
    let d = autodiff(&g, &["c", "w", "xs"]).unwrap();
    let scans = d
        .topo_order()
        .into_iter()
        .filter(|&v| d.node(v).op().is_some_and(|o| o.name() == "scan"))
        .count();
    // the forward (now also saving its carries) and the reverse scan: no second forward
    assert_eq!(scans, 2, "{}", smelt::ir::print_graph(&d));
    // its original results keep their values
    let inputs = [randn(&[3]), randn(&[3]), randn(&[len, 3])];
    let want = smelt::jit::run_graph(&g, &inputs).unwrap();
    let got = smelt::jit::run_graph(&d, &inputs).unwrap();
    for (a, b) in got.iter().zip(&want) {
        close(a, b, 0.0, "forward results");
    }
}
