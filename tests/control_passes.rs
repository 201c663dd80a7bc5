//! `passes::control`: constant branches inlined, short loops unrolled, loop invariants
//! hoisted, dead carries removed, each checked structurally and against the interpreter on
//! the original graph (fused and unfused compiled code too).

use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::control::Control;
use smelt::ir::graph::Graph;
use smelt::ir::op::Op;
use smelt::ir::{parse_module, print_graph};
use smelt::passes::control::{ControlOptions, simplify_control};
use smelt::{DType, Tensor};

fn parse(text: &str) -> Graph {
    parse_module(text, "cf.smelt")
        .unwrap_or_else(|e| panic!("{e}"))
        .entry()
        .clone()
}

fn ops(g: &Graph, name: &str) -> usize {
    g.topo_order()
        .into_iter()
        .filter(|&v| g.node(v).op().is_some_and(|o| o.name() == name))
        .count()
}

/// The one control op of `g`.
fn control(g: &Graph) -> Control {
    g.topo_order()
        .into_iter()
        .find_map(|v| match g.node(v).op() {
            Some(Op::Control(c)) => Some((**c).clone()),
            _ => None,
        })
        .expect("a control op")
}

/// Simplifies `text`'s entry graph and checks that it computes what the original does.
fn simplified(text: &str, inputs: &[Tensor]) -> Graph {
    let g = parse(text);
    let s = simplify_control(&g, &ControlOptions::default()).unwrap();
    s.verify().unwrap();
    // the simplified graph prints and parses back
    parse_module(&print_graph(&s), "s.smelt")
        .unwrap_or_else(|e| panic!("{e}\n{}", print_graph(&s)));
    let want = smelt::jit::run_graph(&g, inputs).unwrap();
    let got = smelt::jit::run_graph(&s, inputs).unwrap();
    let mut all = vec![got];
    for fuse in [true, false] {
        let f = CompiledFn::compile(&g, &CompileOptions::default().fused(fuse)).unwrap();
        all.push(f.call(inputs).unwrap());
    }
    for got in all {
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.shape(), b.shape());
            for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "{x} vs {y}\n{}",
                    print_graph(&s)
                );
            }
        }
    }
    s
}

fn randn(shape: &[usize]) -> Tensor {
    Tensor::randn(shape, Some(DType::F32)).unwrap()
}

const BRANCHES: &str = "
graph t(%x: f32[3], %y: f32[3]) {
  %m = mul(%x, %y)
  return %m
}
graph e(%x: f32[3], %y: f32[3]) {
  %m = sub(%x, %y)
  return %m
}";

#[test]
fn a_constant_predicate_inlines_its_branch() {
    for (p, kept) in [("true", "mul"), ("false", "sub")] {
        let text = format!(
            "graph main(%x: f32[3], %y: f32[3]) {{\n  %z = cond({p}, %x, %y, then=@t, else=@e)\n  return %z\n}}\n{BRANCHES}"
        );
        let s = simplified(&text, &[randn(&[3]), randn(&[3])]);
        assert_eq!(ops(&s, "cond"), 0, "{}", print_graph(&s));
        assert_eq!(ops(&s, kept), 1);
    }
    // a computed predicate stays
    let text = format!(
        "graph main(%x: f32[3], %y: f32[3], %p: bool[]) {{\n  %z = cond(%p, %x, %y, then=@t, else=@e)\n  return %z\n}}\n{BRANCHES}"
    );
    let s = simplified(&text, &[randn(&[3]), randn(&[3]), Tensor::scalar(true)]);
    assert_eq!(ops(&s, "cond"), 1);
}

fn fori(lo: i64, hi: i64) -> String {
    format!(
        "graph main(%x: f32[4]) {{
  %y = fori_loop({lo}, {hi}, %x, body=@b)
  return %y
}}
graph b(%i: i64[], %x: f32[4]) {{
  %f = to(%i, dtype=f32)
  %h = mul(%x, 0.5)
  %y = add(%h, %f)
  return %y
}}"
    )
}

#[test]
fn short_constant_loops_unroll_and_long_ones_stay() {
    let x = randn(&[4]);
    for (lo, hi, loops, adds) in [(0, 3, 0, 3), (2, 6, 0, 4), (5, 2, 0, 0), (0, 10, 1, 0)] {
        let s = simplified(&fori(lo, hi), std::slice::from_ref(&x));
        assert_eq!(
            ops(&s, "fori_loop"),
            loops,
            "{lo}..{hi}\n{}",
            print_graph(&s)
        );
        assert_eq!(ops(&s, "add"), adds, "{lo}..{hi}");
    }
}

#[test]
fn loop_invariants_are_computed_once_outside() {
    // exp(w) · 2 depends only on the pass-through carry w: hoisted
    let text = "
graph main(%x: f32[4], %w: f32[4]) {
  %y, %w2 = fori_loop(0, 10, %x, %w, body=@b)
  return %y
}
graph b(%i: i64[], %x: f32[4], %w: f32[4]) {
  %e = exp(%w)
  %s = mul(%e, 2.0)
  %m = mul(%x, %s)
  %y = tanh(%m)
  return %y, %w
}";
    let s = simplified(text, &[randn(&[4]), randn(&[4])]);
    assert_eq!(ops(&s, "exp"), 1, "{}", print_graph(&s));
    let body = control(&s).bodies[0].graph().clone();
    assert_eq!(ops(&body, "exp"), 0, "{}", print_graph(&s));
    assert_eq!(ops(&body, "tanh"), 1);
}

#[test]
fn dead_carries_and_unread_ys_are_removed() {
    // while_loop: %junk is never read after the loop and nothing kept depends on it
    let text = "
graph main(%x: f32[2], %junk: f32[2]) {
  %y, %j = while_loop(%x, %junk, cond=@c, body=@b)
  return %y
}
graph c(%x: f32[2], %junk: f32[2]) {
  %s = sum(%x)
  %k = lt(%s, 50.0)
  return %k
}
graph b(%x: f32[2], %junk: f32[2]) {
  %y = mul(%x, 2.0)
  %j = exp(%junk)
  return %y, %j
}";
    let x = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let s = simplified(text, &[x, randn(&[2])]);
    let c = control(&s);
    assert_eq!(c.bodies[1].graph().inputs().len(), 1, "{}", print_graph(&s));
    assert_eq!(ops(&s, "exp"), 0);
    // scan: an unread per-step output, and a carry read by a read y stays
    let text = "
graph main(%c: f32[2], %d: f32[2], %xs: f32[3,2]) {
  %c2, %d2, %ys, %zs = scan(%c, %d, %xs, body=@s, carries=2)
  return %ys
}
graph s(%c: f32[2], %d: f32[2], %x: f32[2]) {
  %n = add(%c, %x)
  %m = mul(%d, %x)
  %y = mul(%n, 2.0)
  %z = exp(%m)
  return %n, %m, %y, %z
}";
    let s = simplified(text, &[randn(&[2]), randn(&[2]), randn(&[3, 2])]);
    let body = control(&s).bodies[0].graph().clone();
    assert_eq!(body.inputs().len(), 2, "{}", print_graph(&s));
    assert_eq!(body.outputs().len(), 2);
    assert_eq!(ops(&body, "exp"), 0);
}

#[test]
fn dot_draws_bodies_as_clusters() {
    let text = format!(
        "graph main(%x: f32[3], %y: f32[3], %p: bool[]) {{\n  %z = cond(%p, %x, %y, then=@t, else=@e)\n  return %z\n}}\n{BRANCHES}"
    );
    let dot = parse(&text).to_dot();
    for want in [
        "subgraph cluster_0",
        "label=\"@t\"",
        "label=\"@e\"",
        "lhead=cluster_1, label=\"then\"",
        "lhead=cluster_2, label=\"else\"",
    ] {
        assert!(dot.contains(want), "{want}\n{dot}");
    }
}
