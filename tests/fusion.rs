//! Fusion: kernel counts of known graphs, and the kernel-IR interpreter's results against
//! eager evaluation of the graph node by node.

mod common;

use common::{assert_close, inputs_for, random_graph};
use proptest::prelude::*;
use smelt::ir::graph::{Graph, ValueId};
use smelt::ir::op::{BinaryOp, Op, ReduceOp, TensorType, UnaryOp};
use smelt::jit::run_graph;
use smelt::kernel::interp::run;
use smelt::kernel::{Expr, Schedule, Step};
use smelt::passes::{compile, decompose};
use smelt::{DType, Scalar};

/// Compiles `g`, runs the schedule and the graph on the same random inputs, compares.
fn check(g: &Graph, tol: f64) -> Schedule {
    let s = compile(g).unwrap_or_else(|e| panic!("compile {}: {e}", g.name));
    for seed in 0..2 {
        let ins = inputs_for(g, seed);
        let want = run_graph(g, &ins).unwrap();
        let got = run(&s, &ins).unwrap_or_else(|e| panic!("run {}: {e}\n{s}", g.name));
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let tol = common::Tol::from(tol).for_dtype(b.dtype());
            assert_close(a, b, tol, &format!("{} output {i}\n{s}", g.name));
        }
    }
    s
}

fn input(g: &mut Graph, name: &str, dtype: DType, shape: &[usize]) -> ValueId {
    g.add_input(name, TensorType::new(dtype, shape.to_vec()))
        .unwrap()
}

fn un(g: &mut Graph, u: UnaryOp, x: ValueId) -> ValueId {
    g.add_op(Op::Unary(u), &[x]).unwrap()
}

fn bin(g: &mut Graph, b: BinaryOp, x: ValueId, y: ValueId) -> ValueId {
    g.add_op(Op::Binary(b), &[x, y]).unwrap()
}

fn num(g: &mut Graph, v: f64) -> ValueId {
    g.add_scalar(Scalar::Float(v)).unwrap()
}

fn red(g: &mut Graph, op: ReduceOp, x: ValueId, dim: i64, keepdim: bool) -> ValueId {
    let dim = Some(vec![dim]);
    g.add_op(Op::Reduce { op, dim, keepdim }, &[x]).unwrap()
}

fn relu_scale_bias(xshape: &[usize], bshape: &[usize], transposed: bool) -> Graph {
    let mut g = Graph::new("relu_scale_bias");
    let x = input(&mut g, "x", DType::F32, xshape);
    let b = input(&mut g, "b", DType::F32, bshape);
    let x = if transposed {
        g.add_op(Op::T, &[x]).unwrap()
    } else {
        x
    };
    let r = un(&mut g, UnaryOp::Relu, x);
    let h = num(&mut g, 0.5);
    let m = bin(&mut g, BinaryOp::Mul, r, h);
    let y = bin(&mut g, BinaryOp::Add, m, b);
    g.set_outputs(vec![y]);
    g
}

#[test]
fn relu_scale_bias_is_one_kernel() {
    for (xs, bs, tr) in [
        (vec![7, 33], vec![33], false),
        (vec![33, 7], vec![33], true),
        (vec![1, 1], vec![1], false),
        (vec![4, 7, 33], vec![7, 1], false),
        (vec![], vec![], false),
    ] {
        let g = relu_scale_bias(&xs, &bs, tr);
        let s = check(&g, 0.0);
        assert_eq!(s.kernel_count(), 1, "{s}");
        assert_eq!(s.steps.len(), 1, "{s}");
    }
}

#[test]
fn transposed_input_is_read_through_strides() {
    let g = relu_scale_bias(&[33, 7], &[33], true);
    let s = compile(&g).unwrap();
    let k = s.kernels().next().unwrap();
    let load_x = k
        .values
        .iter()
        .find_map(|v| match &v.expr {
            Expr::Load { buffer: 0, map } => Some(map.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(load_x.strides, vec![1, 7]);
}

fn softmax_graph(shape: &[usize], dim: i64, dtype: DType, log: bool) -> Graph {
    let mut g = Graph::new("softmax");
    let x = input(&mut g, "x", dtype, shape);
    let op = if log {
        Op::LogSoftmax { dim }
    } else {
        Op::Softmax { dim }
    };
    let y = g.add_op(op, &[x]).unwrap();
    g.set_outputs(vec![y]);
    g
}

#[test]
fn softmax_and_log_softmax_are_one_kernel_along_rows() {
    for log in [false, true] {
        // Along the last dim: one kernel, max then sum, the result stored along the row.
        for (shape, dim) in [(vec![5, 33], -1), (vec![2, 7], 1), (vec![1], 0)] {
            let g = softmax_graph(&shape, dim, DType::F32, log);
            let s = check(&g, 1e-6);
            assert_eq!(s.kernel_count(), 1, "{s}");
            let k = s.kernels().next().unwrap();
            assert_eq!(k.passes.len(), 2, "max then sum: {s}");
        }
        // Across rows: the reductions in one kernel, the full-size result in a pointwise kernel
        // so that it is stored contiguously rather than column by column.
        for (shape, dim) in [(vec![5, 33], 0), (vec![3, 1, 7], 1), (vec![2, 7, 3], 1)] {
            let g = softmax_graph(&shape, dim, DType::F32, log);
            let s = check(&g, 1e-6);
            assert_eq!(s.kernel_count(), 2, "{s}");
            let passes: Vec<usize> = s.kernels().map(|k| k.passes.len()).collect();
            assert_eq!(passes, [2, 0], "reductions, then the pointwise result: {s}");
        }
    }
}

#[test]
fn half_precision_softmax_computes_in_f32() {
    for d in [DType::F16, DType::BF16] {
        let g = softmax_graph(&[4, 33], -1, d, false);
        let s = check(&g, 1e-2);
        assert_eq!(s.kernel_count(), 1);
        let k = s.kernels().next().unwrap();
        assert!(
            k.values.iter().any(|v| matches!(
                v.expr,
                Expr::Reduce {
                    acc: DType::F32,
                    ..
                }
            )),
            "{s}"
        );
    }
}

#[test]
fn hand_written_softmax_matches_builtin_kernel_count() {
    let mut g = Graph::new("hand_softmax");
    let x = input(&mut g, "x", DType::F32, &[7, 33]);
    let m = red(&mut g, ReduceOp::Amax, x, -1, true);
    let d = bin(&mut g, BinaryOp::Sub, x, m);
    let e = un(&mut g, UnaryOp::Exp, d);
    let z = red(&mut g, ReduceOp::Sum, e, -1, false);
    let z = g.add_op(Op::Unsqueeze { dim: -1 }, &[z]).unwrap();
    let y = bin(&mut g, BinaryOp::Div, e, z);
    g.set_outputs(vec![y]);
    let s = check(&g, 1e-6);
    let builtin = compile(&softmax_graph(&[7, 33], -1, DType::F32, false)).unwrap();
    assert_eq!(s.kernel_count(), builtin.kernel_count(), "{s}");
    assert_eq!(s.kernel_count(), 1);
}

#[test]
fn layer_norm_is_one_kernel() {
    for (shape, norm) in [
        (vec![3, 7, 33], vec![33]),
        (vec![2, 7, 5], vec![7, 5]),
        (vec![1, 1], vec![1]),
    ] {
        for (w, b) in [(true, true), (false, false), (true, false)] {
            let mut g = Graph::new("ln");
            let x = input(&mut g, "x", DType::F32, &shape);
            let mut ops = vec![x];
            if w {
                ops.push(input(&mut g, "w", DType::F32, &norm));
            }
            if b {
                ops.push(input(&mut g, "b", DType::F32, &norm));
            }
            let op = Op::LayerNorm {
                normalized_shape: norm.clone(),
                eps: 1e-5,
                has_weight: w,
                has_bias: b,
            };
            let y = g.add_op(op, &ops).unwrap();
            g.set_outputs(vec![y]);
            let s = check(&g, 1e-5);
            assert_eq!(s.kernel_count(), 1, "{s}");
        }
    }
}

#[test]
fn mlp_block_is_two_gemms_and_two_epilogues() {
    let mut g = Graph::new("mlp");
    let x = input(&mut g, "x", DType::F32, &[7, 33]);
    let w1 = input(&mut g, "w1", DType::F32, &[16, 33]);
    let b1 = input(&mut g, "b1", DType::F32, &[16]);
    let w2 = input(&mut g, "w2", DType::F32, &[5, 16]);
    let b2 = input(&mut g, "b2", DType::F32, &[5]);
    let h = g
        .add_op(Op::Linear { has_bias: true }, &[x, w1, b1])
        .unwrap();
    let a = un(&mut g, UnaryOp::Gelu { tanh: false }, h);
    let y = g
        .add_op(Op::Linear { has_bias: true }, &[a, w2, b2])
        .unwrap();
    g.set_outputs(vec![y]);
    let s = check(&g, 1e-5);
    assert_eq!(s.gemm_count(), 2, "{s}");
    assert_eq!(s.kernel_count(), 2, "{s}");
    let kinds: Vec<bool> = s
        .steps
        .iter()
        .map(|s| matches!(s, Step::Kernel(_)))
        .collect();
    assert_eq!(kinds, vec![false, true, false, true], "{s}");
    // the weight is passed transposed, as a view of the input buffer
    let first = s.externs().next().unwrap();
    assert_eq!(first.args[1].buffer, 1);
    assert_eq!(first.args[1].strides, vec![1, 33]);
}

#[test]
fn attention_is_two_gemms_and_one_kernel() {
    let (t, d) = (7, 4);
    let mut g = Graph::new("attention");
    let q = input(&mut g, "q", DType::F32, &[t, d]);
    let k = input(&mut g, "k", DType::F32, &[t, d]);
    let v = input(&mut g, "v", DType::F32, &[t, d]);
    let kt = g.add_op(Op::Transpose { dim0: 0, dim1: 1 }, &[k]).unwrap();
    let sc = g.add_op(Op::Matmul, &[q, kt]).unwrap();
    let scale = num(&mut g, 1.0 / (d as f64).sqrt());
    let sc = bin(&mut g, BinaryOp::Mul, sc, scale);
    let ar = |g: &mut Graph| {
        g.add_op(
            Op::Arange {
                start: Scalar::Int(0),
                end: Scalar::Int(t as i64),
                step: Scalar::Int(1),
                dtype: None,
            },
            &[],
        )
        .unwrap()
    };
    let (a, b) = (ar(&mut g), ar(&mut g));
    let i = g.add_op(Op::Unsqueeze { dim: 1 }, &[a]).unwrap();
    let j = g.add_op(Op::Unsqueeze { dim: 0 }, &[b]).unwrap();
    let mask = bin(&mut g, BinaryOp::Gt, j, i);
    let masked = g
        .add_op(
            Op::MaskedFill {
                value: Scalar::Float(f64::NEG_INFINITY),
            },
            &[sc, mask],
        )
        .unwrap();
    let p = g.add_op(Op::Softmax { dim: -1 }, &[masked]).unwrap();
    let o = g.add_op(Op::Matmul, &[p, v]).unwrap();
    g.set_outputs(vec![o]);
    let s = check(&g, 1e-5);
    assert_eq!(s.gemm_count(), 2, "{s}");
    assert_eq!(s.kernel_count(), 1, "{s}");
    let first = s.externs().next().unwrap();
    assert_eq!(first.args[1].buffer, 1, "kᵀ is a view of k: {s}");
    assert_eq!(first.args[1].strides, vec![1, d]);
}

#[test]
fn sliced_and_expanded_views_fold_into_maps() {
    let mut g = Graph::new("views");
    let x = input(&mut g, "x", DType::F32, &[9, 8]);
    let y = input(&mut g, "y", DType::F32, &[4]);
    let s = g
        .add_op(
            Op::Slice {
                dim: 0,
                start: Some(1),
                end: None,
                step: 2,
            },
            &[x],
        )
        .unwrap(); // [4, 8]
    let st = g.add_op(Op::T, &[s]).unwrap(); // [8, 4]
    let n = g
        .add_op(
            Op::Narrow {
                dim: 0,
                start: 2,
                length: 5,
            },
            &[st],
        )
        .unwrap(); // [5, 4]
    let e = g.add_op(Op::Unsqueeze { dim: 0 }, &[y]).unwrap();
    let e = g.add_op(Op::Expand { size: vec![5, 4] }, &[e]).unwrap();
    let z = bin(&mut g, BinaryOp::Mul, n, e);
    let z = un(&mut g, UnaryOp::Tanh, z);
    g.set_outputs(vec![z, n]);
    let sch = check(&g, 0.0);
    assert_eq!(sch.kernel_count(), 1, "{sch}");
    // the second output is a view of the input, not a copy
    assert_eq!(sch.outputs[1].buffer, 0);
    assert_eq!(sch.outputs[1].strides, vec![1, 16]);
}

#[test]
fn reduction_read_at_another_row_is_stored() {
    // x - sum(x, 0).t(): the reduced value is read transposed, so it cannot stay in the row
    let mut g = Graph::new("cross");
    let x = input(&mut g, "x", DType::F32, &[7, 7]);
    let s = red(&mut g, ReduceOp::Sum, x, 0, true); // [1, 7]
    let st = g.add_op(Op::T, &[s]).unwrap(); // [7, 1]
    let y = bin(&mut g, BinaryOp::Sub, x, st);
    g.set_outputs(vec![y]);
    let sch = check(&g, 1e-6);
    assert_eq!(sch.kernel_count(), 2, "{sch}");
}

#[test]
fn expensive_producer_is_not_recomputed_per_broadcast_element() {
    let mut g = Graph::new("bcast");
    let a = input(&mut g, "a", DType::F32, &[33]);
    let x = input(&mut g, "x", DType::F32, &[64, 33]);
    let mut e = a;
    for _ in 0..3 {
        e = un(&mut g, UnaryOp::Exp, e);
        e = un(&mut g, UnaryOp::Tanh, e);
    }
    let z = bin(&mut g, BinaryOp::Add, x, e); // e broadcast over 64 rows
    g.set_outputs(vec![z]);
    let sch = check(&g, 0.0);
    assert_eq!(
        sch.kernel_count(),
        2,
        "the exp/tanh chain runs once per element of a: {sch}"
    );
}

/// How many kernels of `s` read input `i`.
fn kernels_reading_input(s: &Schedule, i: usize) -> usize {
    let b = s
        .buffers
        .iter()
        .position(|b| b.kind == smelt::kernel::BufferKind::Input(i))
        .unwrap();
    kernels_reading(s, b)
}

/// How many kernels of `s` load buffer `b`.
fn kernels_reading(s: &Schedule, b: usize) -> usize {
    s.kernels().filter(|k| reads(k, b)).count()
}

fn reads(k: &smelt::kernel::Kernel, b: usize) -> bool {
    k.values
        .iter()
        .any(|v| matches!(v.expr, Expr::Load { buffer, .. } if buffer == b))
}

/// A cheap value of three same-sized buffers read by three kernels (a ResNet block's output
/// gradient `where(y > 0, g1 + g2, 0)` feeding its batch norms' backward) is stored once:
/// its three inputs are read by one kernel, not three, and may die there.
#[test]
fn a_cheap_value_of_several_buffers_read_by_several_kernels_is_stored_once() {
    let shape = [8usize, 16, 12];
    let mut g = Graph::new("grad_fan_out");
    let y = input(&mut g, "y", DType::F32, &shape);
    let a = input(&mut g, "a", DType::F32, &shape);
    let b = input(&mut g, "b", DType::F32, &shape);
    let zero = num(&mut g, 0.0);
    let pos = bin(&mut g, BinaryOp::Gt, y, zero);
    let s = bin(&mut g, BinaryOp::Add, a, b);
    let w = g.add_op(Op::Where, &[pos, s, zero]).unwrap();
    let outs: Vec<ValueId> = (0..3)
        .map(|d| red(&mut g, ReduceOp::Sum, w, d, false))
        .collect();
    g.set_outputs(outs);
    let sch = check(&g, 1e-5);
    for i in 0..3 {
        assert_eq!(kernels_reading_input(&sch, i), 1, "input {i}\n{sch}");
    }
    // two buffers: recomputing their sum in three kernels reads less than storing it
    let mut g = Graph::new("two_reads");
    let a = input(&mut g, "a", DType::F32, &shape);
    let b = input(&mut g, "b", DType::F32, &shape);
    let s = bin(&mut g, BinaryOp::Add, a, b);
    let outs: Vec<ValueId> = (0..3)
        .map(|d| red(&mut g, ReduceOp::Sum, s, d, false))
        .collect();
    g.set_outputs(outs);
    let sch = check(&g, 1e-5);
    assert_eq!(kernels_reading_input(&sch, 0), 3, "{sch}");
}

/// The tie of `a_cheap_value_...`'s rule: a value of three temporaries (here GEMM results)
/// read by two kernels moves as much stored as recomputed, and storing it lets the three
/// die at once, so it is stored, by a kernel of its own, and read back by both (its sum of
/// graph inputs, which stay alive anyway, is still recomputed: the test above).
#[test]
fn a_tie_that_frees_temporaries_is_stored_by_a_kernel_of_its_own() {
    let mut g = Graph::new("tie");
    let x = input(&mut g, "x", DType::F32, &[6, 5]);
    let ws: Vec<ValueId> = (0..3)
        .map(|i| input(&mut g, &format!("w{i}"), DType::F32, &[5, 12]))
        .collect();
    let m: Vec<ValueId> = ws
        .iter()
        .map(|&w| g.add_op(Op::Matmul, &[x, w]).unwrap())
        .collect();
    let zero = num(&mut g, 0.0);
    let pos = bin(&mut g, BinaryOp::Gt, m[2], zero);
    let sum = bin(&mut g, BinaryOp::Add, m[0], m[1]);
    let w = g.add_op(Op::Where, &[pos, sum, zero]).unwrap();
    let outs = vec![
        red(&mut g, ReduceOp::Sum, w, 0, false),
        red(&mut g, ReduceOp::Sum, w, 1, false),
    ];
    g.set_outputs(outs);
    let s = check(&g, 1e-5);
    let results: Vec<usize> = s.externs().map(|e| e.out).collect();
    assert_eq!(results.len(), 3, "{s}");
    for &b in &results {
        assert_eq!(kernels_reading(&s, b), 1, "GEMM result {b} read once\n{s}");
    }
    // the kernel that reads them stores one value and nothing else
    let storer = s.kernels().find(|k| reads(k, results[0])).unwrap();
    assert_eq!(storer.stores.len(), 1, "{s}");
    assert_eq!(s.kernel_count(), 3, "{s}");
}

#[test]
fn shared_inputs_fuse_horizontally_and_outputs_are_stored() {
    let mut g = Graph::new("horiz");
    let x = input(&mut g, "x", DType::F32, &[7, 33]);
    let a = un(&mut g, UnaryOp::Sin, x);
    let b = un(&mut g, UnaryOp::Cos, x);
    let s = red(&mut g, ReduceOp::Sum, x, 1, false);
    let m = red(&mut g, ReduceOp::Amax, x, 1, true);
    g.set_outputs(vec![a, b, s, m]);
    let sch = check(&g, 1e-6);
    assert_eq!(sch.kernel_count(), 1, "{sch}");
    assert_eq!(sch.kernels().next().unwrap().stores.len(), 4);
}

#[test]
fn var_std_logsumexp_decompose_and_fuse() {
    for op in [
        Op::Var {
            dim: Some(vec![1]),
            correction: 1.0,
            keepdim: false,
        },
        Op::Std {
            dim: None,
            correction: 0.0,
            keepdim: true,
        },
        Op::Reduce {
            op: ReduceOp::LogSumExp,
            dim: Some(vec![-1]),
            keepdim: false,
        },
    ] {
        let mut g = Graph::new("stat");
        let x = input(&mut g, "x", DType::F32, &[5, 7]);
        let y = g.add_op(op.clone(), &[x]).unwrap();
        g.set_outputs(vec![y]);
        let d = decompose(&g).unwrap();
        d.verify().unwrap();
        assert!(d.len() > g.len());
        let s = check(&g, 1e-5);
        assert_eq!(s.kernel_count(), 1, "{op:?}\n{s}");
    }
}

#[test]
fn dump_is_readable() {
    let s = compile(&softmax_graph(&[4, 7], -1, DType::F32, false)).unwrap();
    let text = s.to_string();
    for needle in [
        "schedule softmax",
        "rows=[4] row=[7]",
        "reduce max",
        "reduce sum",
        "pass 1",
        "store b1[7*i0 + i1]",
        "return b1",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[test]
fn maps_outside_a_buffer_are_refused() {
    let mut s = compile(&relu_scale_bias(&[3, 4], &[4], false)).unwrap();
    if let Step::Kernel(k) = &mut s.steps[0] {
        k.stores[0].map.offset = 1;
    }
    let ins = inputs_for(&relu_scale_bias(&[3, 4], &[4], false), 0);
    assert!(run(&s, &ins).is_err());
    assert!(s.validate().is_err());
}

// ---- random graphs ------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_graphs_fuse_to_the_same_values(seed in any::<u64>(), n in 1usize..14) {
        let g = random_graph(seed, n);
        let s = check(&g, 1e-5);
        prop_assert!(s.kernel_count() <= g.len());
        assert_no_dead_values(&s);
    }
}

/// Every value of every kernel feeds a store or a reduction: no dead constants in the
/// schedules people read (`smelt check --dump-after=fuse`).
fn assert_no_dead_values(s: &Schedule) {
    for step in &s.steps {
        let Step::Kernel(k) = step else { continue };
        let mut used = vec![false; k.values.len()];
        for v in &k.values {
            for o in v.expr.operands() {
                used[o] = true;
            }
        }
        k.stores.iter().for_each(|st| used[st.value] = true);
        k.passes.iter().flatten().for_each(|&r| used[r] = true);
        if let Some(i) = used.iter().position(|&u| !u) {
            panic!("kernel {}: v{i} is computed but never used", k.name);
        }
    }
}

#[test]
fn a_scalar_cast_leaves_no_dead_constant() {
    // layer_norm's eps is an f64 scalar cast to f32: the f64 constant used to stay behind
    let text = "graph ln(%x: f32[4,8], %w: f32[8], %b: f32[8]) {
  %y = layer_norm(%x, %w, %b, normalized_shape=[8], eps=1e-5)
  %z = mul(%y, 0.5)
  return %z
}
";
    let m = smelt::ir::parse_module(text, "ln").unwrap();
    let s = compile(m.entry()).unwrap();
    assert_no_dead_values(&s);
    check(m.entry(), 1e-5);
}

#[test]
fn mixed_dtype_chains_get_explicit_casts() {
    let mut g = Graph::new("mixed");
    let x = input(&mut g, "x", DType::I32, &[5, 7]);
    let y = input(&mut g, "y", DType::F16, &[7]);
    let one = g.add_scalar(Scalar::Int(1)).unwrap();
    let a = bin(&mut g, BinaryOp::Add, x, one); // i32
    let h = num(&mut g, 0.5);
    let b = bin(&mut g, BinaryOp::Mul, a, h); // f32
    let c = bin(&mut g, BinaryOp::Add, b, y); // f32
    let am = g
        .add_op(
            Op::ArgMax {
                dim: Some(1),
                keepdim: false,
            },
            &[c],
        )
        .unwrap();
    let ar = g
        .add_op(
            Op::Arange {
                start: Scalar::Float(0.5),
                end: Scalar::Float(7.5),
                step: Scalar::Float(1.0),
                dtype: None,
            },
            &[],
        )
        .unwrap();
    let d = bin(&mut g, BinaryOp::Mul, c, ar);
    g.set_outputs(vec![d, am, a]);
    let s = check(&g, 0.0);
    assert_eq!(s.kernel_count(), 1, "{s}");
    let k = s.kernels().next().unwrap();
    assert!(
        k.values.iter().any(|v| matches!(v.expr, Expr::Cast(_))),
        "{s}"
    );
    assert!(
        k.values
            .iter()
            .any(|v| matches!(v.expr, Expr::Index { .. })),
        "{s}"
    );
}

/// The bias gradient of a ReLU layer: `d = where(h > 0, g, 0)` is an output and is summed over
/// the batch. Summing across rows walks memory with a stride, so `d` is stored by its own
/// pointwise kernel and the reduction reads it back; the bias update joins the reduction.
#[test]
fn column_reductions_leave_full_size_outputs_to_a_pointwise_kernel() {
    let text = "graph bias_grad(%g: f32[6,33], %h: f32[6,33], %b: f32[33]) {
  %z = gt(%h, 0.0)
  %d = where(%z, %g, 0.0)
  %s = sum(%d, dim=[0])
  %m = mul(%s, 0.1)
  %nb = sub(%b, %m)
  return %d, %nb
}";
    let m = smelt::ir::text::parse_module(text, "bias_grad.smelt").unwrap();
    let s = check(m.entry(), 1e-5);
    assert_eq!(s.kernel_count(), 2, "{s}");
    let passes: Vec<usize> = s.kernels().map(|k| k.passes.len()).collect();
    assert_eq!(passes, [0, 1], "pointwise d, then sum and update: {s}");
    // Along rows the same graph stays one kernel.
    let row = text
        .replace("dim=[0]", "dim=[1]")
        .replace("%b: f32[33]", "%b: f32[6]");
    let m = smelt::ir::text::parse_module(&row, "bias_grad_rows.smelt").unwrap();
    assert_eq!(check(m.entry(), 1e-5).kernel_count(), 1);
}

#[test]
fn extern_reading_a_stored_view_runs_after_its_kernel() {
    // The reshape needs the narrowed view as a copy, so fusion stores it from the kernel of
    // `%p`, which waits for the second matmul: the first must wait for that kernel too,
    // not read the input under the view.
    let text = "graph narrowed(%x: f32[2,3,3,4], %w: f32[4,1], %v: f32[12,1], %a: f32[2,3,2,1], %b: f32[1,4]) {
  %n = narrow(%x, dim=2, start=0, length=2)
  %y = matmul(%n, %w)
  %u = matmul(%a, %b)
  %p = add(%n, %u)
  %r = reshape(%n, shape=[12, 4])
  %t = t(%r)
  %z = matmul(%t, %v)
  return %y, %p, %z
}";
    let m = smelt::ir::text::parse_module(text, "narrowed.smelt").unwrap();
    let s = check(m.entry(), 1e-6);
    assert_eq!(s.kernel_count(), 2, "{s}");
}
