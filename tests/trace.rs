//! Tracing eager code into graphs: captured constants against parameters, running the
//! traced graph, guards, views, wrapped numbers and in-place recording.

use smelt::ir::dtype::Scalar;
use smelt::ir::graph::{Graph, NodeKind};
use smelt::ir::op::Op;
use smelt::ir::{parse_module, print_graph};
use smelt::jit::{
    GuardPolicy, TraceOptions, is_tracing, record_inplace, trace, trace_with, trace_with_params,
};
use smelt::{DType, Error, Result, Tensor};
use std::cell::Cell;

fn t(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape).unwrap()
}

fn seq(n: usize, shape: &[usize], scale: f32) -> Tensor {
    let v: Vec<f32> = (0..n)
        .map(|i| (i as f32 - n as f32 / 2.0) * scale)
        .collect();
    t(&v, shape)
}

/// Op names of the graph's op nodes in order (scalars included).
fn op_names(g: &Graph) -> Vec<&'static str> {
    g.topo_order()
        .into_iter()
        .filter_map(|v| g.node(v).op().map(|op| op.name()))
        .collect()
}

fn input_names(g: &Graph) -> Vec<String> {
    g.inputs().iter().map(|&v| g.node(v).name.clone()).collect()
}

fn assert_text_round_trip(g: &Graph) {
    let text = print_graph(g);
    let m = parse_module(&text, "traced.smelt").unwrap();
    assert!(m.entry() == g, "{text}");
}

fn close(a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape(), b.shape());
    assert_eq!(a.dtype(), b.dtype());
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    for (p, q) in x.iter().zip(&y) {
        assert!((p - q).abs() <= 1e-6 * (1.0 + q.abs()), "{x:?} vs {y:?}");
    }
}

#[test]
fn captured_tensors_become_constants_and_marked_ones_inputs() {
    let w = seq(12, &[4, 3], 0.25);
    let b = t(&[0.5, -1.0, 2.0, 0.0], &[4]);
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        Ok(vec![xs[0].linear(&w, Some(&b))?.softmax(-1)?])
    };
    let x = seq(6, &[2, 3], 1.0);

    let captured = trace(f, std::slice::from_ref(&x)).unwrap();
    let g = captured.graph();
    assert_eq!(input_names(g), vec!["x0"]);
    assert_eq!(
        op_names(g),
        vec!["constant", "constant", "linear", "softmax"]
    );
    assert_text_round_trip(g);

    let marked = trace_with_params(f, std::slice::from_ref(&x), &[("w", &w)]).unwrap();
    let g = marked.graph();
    assert_eq!(input_names(g), vec!["x0", "w"]);
    assert_eq!(op_names(g), vec!["constant", "linear", "softmax"]);
    let lin = g
        .topo_order()
        .into_iter()
        .find(|&v| g.node(v).op() == Some(&Op::Linear { has_bias: true }))
        .unwrap();
    let ops = g.operands(lin);
    assert_eq!(ops[0], g.inputs()[0]);
    assert_eq!(ops[1], g.inputs()[1]);
    assert!(matches!(g.node(ops[2]).op(), Some(Op::Constant(_))));
    assert_text_round_trip(g);

    // A new input: both traced forms compute what the eager function computes.
    let x2 = seq(6, &[2, 3], -0.5);
    let want = f(std::slice::from_ref(&x2)).unwrap();
    close(
        &captured.call(std::slice::from_ref(&x2)).unwrap()[0],
        &want[0],
    );
    close(
        &marked.call(std::slice::from_ref(&x2)).unwrap()[0],
        &want[0],
    );

    // Updating the weight shows through the parameter but not through the constant.
    w.with_slice_mut::<f32, _>(|s| s.iter_mut().for_each(|v| *v *= 2.0))
        .unwrap();
    let new_want = f(std::slice::from_ref(&x2)).unwrap();
    close(
        &marked.call(std::slice::from_ref(&x2)).unwrap()[0],
        &new_want[0],
    );
    close(&captured.call(&[x2]).unwrap()[0], &want[0]);
}

#[test]
fn traced_graph_runs_like_eager_on_new_inputs() {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let (x, y) = (&xs[0], &xs[1]);
        let a = x.transpose(0, 1)?.matmul(y)?;
        let s = a.sum_dim(&[1], true)?;
        let m = a.slice(0, Some(1), None, 2)?.amax_dim(&[0], false)?;
        Ok(vec![s, m, x.clone()])
    };
    let x = seq(12, &[4, 3], 0.5);
    let y = seq(20, &[4, 5], 0.1);
    let tr = trace_with(
        f,
        &[x, y],
        TraceOptions::new().input_names(&["x", "y"]).name("mm"),
    )
    .unwrap();
    assert_eq!(tr.graph().name, "mm");
    assert_eq!(
        op_names(tr.graph()),
        vec!["transpose", "matmul", "sum", "slice", "amax"]
    );
    // the third output is the input itself
    assert_eq!(tr.graph().outputs()[2], tr.graph().inputs()[0]);
    let x2 = seq(12, &[4, 3], -0.25);
    let y2 = seq(20, &[4, 5], 0.3);
    let got = tr.call(&[x2.clone(), y2.clone()]).unwrap();
    let want = f(&[x2, y2]).unwrap();
    assert_eq!(got.len(), 3);
    for (g, w) in got.iter().zip(&want) {
        close(g, w);
    }
    assert_text_round_trip(tr.graph());
}

#[test]
fn error_guard_names_the_mismatching_input() {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> { Ok(vec![xs[0].sum_dim(&[0], false)?]) };
    let opts = TraceOptions::new()
        .input_names(&["x"])
        .guard(GuardPolicy::Error);
    let tr = trace_with(f, &[seq(6, &[2, 3], 1.0)], opts).unwrap();
    assert_eq!(tr.guard_policy(), GuardPolicy::Error);
    let e = tr.call(&[seq(12, &[4, 3], 1.0)]).unwrap_err().to_string();
    assert_eq!(e, "input 0 (x): expected f32[2,3] but got f32[4,3]");
    let x64 = Tensor::from_slice(&[1.0f64; 6], &[2, 3]).unwrap();
    let e = tr.call(&[x64]).unwrap_err().to_string();
    assert_eq!(e, "input 0 (x): expected f32[2,3] but got f64[2,3]");
    let e = tr.call(&[]).unwrap_err().to_string();
    assert_eq!(e, "expected 1 input but got 0");
    let ok = tr.call(&[seq(6, &[2, 3], 2.0)]).unwrap();
    close(&ok[0], &seq(6, &[2, 3], 2.0).sum_dim(&[0], false).unwrap());
}

#[test]
fn retrace_guard_traces_new_types_once_and_caches_them() {
    let runs = Cell::new(0);
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        runs.set(runs.get() + 1);
        Ok(vec![xs[0].t()?.sum_dim(&[-1], false)?])
    };
    let tr = trace(f, &[seq(6, &[2, 3], 1.0)]).unwrap();
    assert_eq!(tr.guard_policy(), GuardPolicy::Retrace);
    assert_eq!(runs.get(), 1);
    // same types: the graph runs, not the function
    tr.call(&[seq(6, &[2, 3], 3.0)]).unwrap();
    assert_eq!(runs.get(), 1);
    // new shape: traced again, once
    let x = seq(20, &[5, 4], 0.5);
    let want = x.t().unwrap().sum_dim(&[-1], false).unwrap();
    close(&tr.call(std::slice::from_ref(&x)).unwrap()[0], &want);
    assert_eq!((runs.get(), tr.retraced_count()), (2, 1));
    close(&tr.call(&[x]).unwrap()[0], &want);
    assert_eq!((runs.get(), tr.retraced_count()), (2, 1));

    // the cache keeps at most `cache_size` specialisations
    let small = trace_with(
        f,
        &[seq(6, &[2, 3], 1.0)],
        TraceOptions::new().cache_size(1),
    )
    .unwrap();
    small.call(&[seq(4, &[2, 2], 1.0)]).unwrap();
    small.call(&[seq(8, &[2, 4], 1.0)]).unwrap();
    assert_eq!(small.retraced_count(), 1);
}

#[test]
fn views_are_recorded_as_pure_ops() {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let x = &xs[0];
        let v = x
            .permute(&[2, 0, 1])?
            .select(0, 1)?
            .unsqueeze(0)?
            .expand(&[2, -1, -1])?;
        let d = x.narrow(1, 1, 2)?.diagonal(0, 0, 1)?;
        Ok(vec![v, d, x.flatten(0, -1)?.view(&[6, 4])?])
    };
    let x = seq(24, &[2, 3, 4], 1.0);
    let tr = trace(f, &[x]).unwrap();
    let g = tr.graph();
    assert_eq!(
        op_names(g),
        vec![
            "permute",
            "select",
            "unsqueeze",
            "expand",
            "narrow",
            "diagonal",
            "flatten",
            "view"
        ]
    );
    let x2 = seq(24, &[2, 3, 4], -2.0);
    let got = tr.call(std::slice::from_ref(&x2)).unwrap();
    for (a, b) in got.iter().zip(f(&[x2]).unwrap()) {
        assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    }
    assert_text_round_trip(g);
}

#[test]
fn wrapped_numbers_become_scalar_operands() {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let half = Tensor::wrapped(Scalar::Float(2.5));
        Ok(vec![
            half.sum()?,
            xs[0].sum()?,
            Tensor::wrapped(Scalar::Int(7)),
        ])
    };
    let tr = trace(f, &[seq(4, &[4], 1.0)]).unwrap();
    let g = tr.graph();
    let text = print_graph(g);
    assert!(text.contains("= sum(2.5)"), "{text}");
    assert!(text.contains("%out2: i64[] = scalar(value=7)"), "{text}");
    let s = g.outputs()[0];
    let arg = g.operands(s)[0];
    assert!(g.node(arg).is_inline_scalar());
    assert_eq!(g.node(arg).op(), Some(&Op::Scalar(Scalar::Float(2.5))));
    assert_eq!(g.node(s).ty.dtype, DType::F64);
    let out = tr.call(&[seq(4, &[4], 1.0)]).unwrap();
    assert_eq!(out[0].item::<f64>().unwrap(), 2.5);
    assert_eq!(out[2].item::<i64>().unwrap(), 7);
    assert!(out[2].is_wrapped_number());
    assert_text_round_trip(g);
}

#[test]
fn tensors_made_outside_apply_are_constants() {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let ones = Tensor::ones(&[3], DType::F32);
        Ok(vec![xs[0].matmul(&ones)?])
    };
    let tr = trace(f, &[seq(6, &[2, 3], 1.0)]).unwrap();
    assert_eq!(op_names(tr.graph()), vec!["constant", "matmul"]);
    let x2 = seq(6, &[2, 3], 0.5);
    close(
        &tr.call(std::slice::from_ref(&x2)).unwrap()[0],
        &x2.sum_dim(&[1], false).unwrap(),
    );
}

/// An in-place cumulative sum of a contiguous 1-D f32 tensor, done the way an in-place op
/// does it: record first, then write.
fn cumsum_inplace(y: &Tensor) -> Result<()> {
    record_inplace(y, Op::Cumsum { dim: 0 }, &[y])?;
    y.with_slice_mut::<f32, _>(|s| {
        for j in 1..s.len() {
            s[j] += s[j - 1];
        }
    })
}

#[test]
fn record_inplace_functionalizes_the_write() {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        // reshaping a transpose copies: `y` owns its storage
        let y = xs[0].t()?.reshape(&[-1])?;
        let before = y.amax()?;
        cumsum_inplace(&y)?;
        Ok(vec![y.clone(), y.sum()?, before])
    };
    let x = seq(6, &[2, 3], 1.0);
    let tr = trace(f, &[x]).unwrap();
    let g = tr.graph();
    assert_eq!(op_names(g), vec!["t", "reshape", "amax", "cumsum", "sum"]);
    let out = g.outputs();
    assert_eq!(g.node(out[0]).op(), Some(&Op::Cumsum { dim: 0 }));
    assert_eq!(g.operands(out[1]), vec![out[0]]);
    assert_eq!(g.node(out[2]).op().map(|o| o.name()), Some("amax"));
    let x2 = seq(6, &[2, 3], -0.5);
    let got = tr.call(std::slice::from_ref(&x2)).unwrap();
    let want = f(&[x2]).unwrap();
    for (a, b) in got.iter().zip(&want) {
        close(a, b);
    }
    assert_text_round_trip(g);
}

#[test]
fn record_inplace_casts_back_and_checks_shapes_and_views() {
    // a result of another dtype is cast back to the target's
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let y = xs[0].t()?.reshape(&[-1])?;
        record_inplace(&y, Op::Cumsum { dim: 0 }, &[&y])?;
        Ok(vec![y])
    };
    let xi = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2]).unwrap();
    let g = trace(f, &[xi]).unwrap().graph().clone();
    // cumsum of i32 gives i64; the in-place result keeps the target's i32
    assert_eq!(op_names(&g), vec!["t", "reshape", "cumsum", "to"]);
    assert_eq!(
        g.node(g.outputs()[0]).op(),
        Some(&Op::To { dtype: DType::I32 })
    );

    // a result of another shape is an error
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let y = xs[0].sum_dim(&[1], true)?;
        record_inplace(&y, Op::Expand { size: vec![2, 3] }, &[&y])?;
        Ok(vec![y])
    };
    let e = trace(f, &[seq(6, &[2, 3], 1.0)]).err().unwrap().to_string();
    assert_eq!(
        e,
        "output with shape [2, 1] doesn't match the broadcast shape [2, 3]"
    );

    // writing into a view of a traced tensor is refused
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let y = xs[0].sum_dim(&[1], true)?;
        let v = y.view(&[2])?;
        record_inplace(&v, Op::Cumsum { dim: 0 }, &[&v])?;
        Ok(vec![y])
    };
    let e = trace(f, &[seq(6, &[2, 3], 1.0)]).err().unwrap();
    assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("in-place writes into views are not supported while tracing"),
        "{e}"
    );

    // outside a trace it records nothing and succeeds
    let x = seq(4, &[4], 1.0);
    record_inplace(&x, Op::Cumsum { dim: 0 }, &[&x]).unwrap();
}

#[test]
fn nested_traces_fail_and_a_panicking_function_leaves_no_recorder() {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        assert!(is_tracing());
        let inner = trace(|ys: &[Tensor]| Ok(vec![ys[0].clone()]), xs);
        Err(inner
            .err()
            .unwrap_or(Error::Value("nested trace succeeded".into())))
    };
    let e = trace(f, &[seq(2, &[2], 1.0)]).err().unwrap().to_string();
    assert!(e.contains("nested traces are not supported"), "{e}");
    assert!(!is_tracing());

    let r = std::panic::catch_unwind(|| {
        let _ = trace(
            |_: &[Tensor]| -> Result<Vec<Tensor>> { panic!("boom") },
            &[],
        );
    });
    assert!(r.is_err());
    assert!(!is_tracing());
    let tr = trace(|xs: &[Tensor]| Ok(vec![xs[0].sum()?]), &[seq(3, &[3], 1.0)]).unwrap();
    assert_eq!(op_names(tr.graph()), vec!["sum"]);
}

#[test]
fn the_same_tensor_passed_twice_gives_two_inputs() {
    let x = seq(4, &[2, 2], 1.0);
    let tr = trace(
        |xs: &[Tensor]| Ok(vec![xs[0].matmul(&xs[1])?]),
        &[x.clone(), x.clone()],
    )
    .unwrap();
    let g = tr.graph();
    let mm = g.outputs()[0];
    assert_eq!(g.operands(mm), g.inputs().to_vec());
    let y = seq(4, &[2, 2], -1.0);
    close(
        &tr.call(&[x.clone(), y.clone()]).unwrap()[0],
        &x.matmul(&y).unwrap(),
    );
    assert!(
        g.topo_order()
            .iter()
            .all(|&v| !matches!(g.node(v).kind, NodeKind::Op(Op::Constant(_))))
    );
}

/// The seeds' fusion example: `relu(x) * 0.5 + b`, with `b` captured as a constant or marked
/// as a parameter; the traced graph computes what eager code computes on new inputs.
#[test]
fn relu_scale_bias_traces_to_three_ops() {
    let b = seq(4, &[4], 0.25);
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        Ok(vec![xs[0].relu()?.mul_scalar(0.5)?.add(&b)?])
    };
    let x = seq(12, &[3, 4], -0.5);
    let traced = trace(f, std::slice::from_ref(&x)).unwrap();
    let g = traced.graph();
    let sorted = |g: &Graph| {
        let mut n: Vec<_> = op_names(g).into_iter().filter(|&n| n != "scalar").collect();
        n.sort_unstable();
        n
    };
    assert_eq!(sorted(g), vec!["add", "constant", "mul", "relu"]);
    assert_text_round_trip(g);

    let with_param = trace_with_params(f, std::slice::from_ref(&x), &[("b", &b)]).unwrap();
    assert_eq!(sorted(with_param.graph()), vec!["add", "mul", "relu"]);
    assert_eq!(input_names(with_param.graph()).len(), 2);

    let x2 = seq(12, &[3, 4], 0.75).sub_scalar(3.0).unwrap();
    let got = traced.call(std::slice::from_ref(&x2)).unwrap();
    let want: Vec<f64> = x2
        .to_f64_vec()
        .iter()
        .enumerate()
        .map(|(i, &v)| v.max(0.0) * 0.5 + b.to_f64_vec()[i % 4])
        .collect();
    assert_eq!(got[0].to_f64_vec(), want);
}

/// In-place methods are functionalized while tracing: the graph computes what the mutated
/// tensors hold, and running it on new inputs matches eager execution.
#[test]
fn in_place_methods_are_functionalized() {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let y = xs[0].mul_scalar(2.0)?;
        y.add_(&xs[0])?.relu_()?;
        let z = Tensor::zeros(&[3, 4], DType::F32);
        z.fill_(1.5)?;
        z.copy_(&xs[1])?;
        z.mul_scalar_(3.0)?;
        Ok(vec![y, z])
    };
    let (x, b) = (seq(12, &[3, 4], 0.5), seq(4, &[4], 1.0));
    let traced = trace(f, &[x, b]).unwrap();
    assert_text_round_trip(traced.graph());
    let (x2, b2) = (seq(12, &[3, 4], -0.25), seq(4, &[4], 0.5));
    let got = traced.call(&[x2.clone(), b2.clone()]).unwrap();
    let want = f(&[x2, b2]).unwrap();
    assert_eq!(got[0].to_f64_vec(), want[0].to_f64_vec());
    assert_eq!(got[1].to_f64_vec(), want[1].to_f64_vec());
    assert_eq!(got[1].shape(), &[3, 4]);
}
