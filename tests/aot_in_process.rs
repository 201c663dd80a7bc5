//! Ahead-of-time models loaded into the test process (`AotModel::load`): the object's
//! `NAME_run` called through its C interface, checked against the interpreter, without a C
//! compiler. `smelt fuzz` runs random graphs this way.

mod common;

use common::{assert_close, inputs_for};
use smelt::aot::{AotOptions, compile};
use smelt::ir::text::parse_module;
use smelt::runtime::interp::run_positional;
use smelt::{DType, Tensor};

fn graph(text: &str) -> smelt::ir::Graph {
    parse_module(text, "aot.smelt").unwrap().entry().clone()
}

/// The graph of `text` and its ahead-of-time model, loaded.
fn load_model(text: &str) -> (smelt::ir::Graph, smelt::aot::LoadedModel) {
    let g = graph(text);
    let m = compile(&g, &AotOptions::default())
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .load()
        .unwrap();
    (g, m)
}

/// Compiles `text`, runs it in this process on random inputs and compares each output with
/// the interpreter's, exactly (the kernels and library routines are the JIT's).
fn matches_interpreter(text: &str) {
    let g = graph(text);
    let model = compile(&g, &AotOptions::default()).unwrap();
    let loaded = model.load().unwrap();
    for seed in 0..3 {
        let ins = inputs_for(&g, seed);
        let want = run_positional(&g, &ins).unwrap();
        let got = loaded.run(&ins).unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.dtype(), b.dtype(), "output {i} of\n{text}");
            assert_close(a, b, 1e-6, &format!("output {i} of\n{text}"));
        }
    }
}

#[test]
fn models_run_in_process_as_the_interpreter_runs_them() {
    matches_interpreter(
        "graph mlp(%x: f32[5,7], %w: f32[7,3], %b: f32[3]) {
  %h = matmul(%x, %w)
  %y = add(%h, %b)
  %r = relu(%y)
  %s = softmax(%r, dim=-1)
  return %s, %h
}",
    );
    matches_interpreter(
        "graph views(%x: f64[4,6]) {
  %t = transpose(%x, dim0=0, dim1=1)
  %n = narrow(%t, dim=0, start=1, length=3)
  %e = exp(%n)
  %c = cat(%e, %n, dim=1)
  %s = sum(%c, dim=[0])
  return %s, %c
}",
    );
}

#[test]
fn a_cat_of_mixed_dtypes_converts_its_operands() {
    // the copy steps move elements: a bool operand of a bf16 cat is cast first
    matches_interpreter(
        "graph mixed(%x: bf16[4,2,3]) {
  %b = logical_and(%x, 3.25)
  %c = cat(%x, %b, dim=-1)
  %s = stack(%b, %x, dim=0)
  return %c, %s
}",
    );
}

#[test]
fn joins_of_mixed_dtypes_in_loop_bodies_convert_too() {
    // unrolled (two trips) and kept as a loop (a trip count read at run time): the body's
    // stack of an f64 and a bool is cast in the body before either
    for upper in ["2", "%n"] {
        let text = format!(
            "graph looped(%x: f64[], %n: i64[]) {{
  %out = fori_loop(0, {upper}, %x, body=@body)
  return %out
}}
graph body(%i: i64[], %x1: f64[]) {{
  %2 = gt(%x1, 3.25)
  %3 = stack(%x1, %2, dim=-1)
  %6 = sum(%3)
  return %6
}}"
        );
        let (g, loaded) = load_model(&text);
        for (x, n) in [(1.5, 2), (4.0, 2), (-2.0, 0)] {
            let ins = [
                Tensor::from_vec(vec![x], &[]).unwrap(),
                Tensor::from_vec(vec![n as i64], &[]).unwrap(),
            ];
            let got = loaded.run(&ins).unwrap();
            let want = run_positional(&g, &ins).unwrap();
            assert_close(&got[0], &want[0], 0.0, &format!("x={x} n={n}\n{text}"));
        }
    }
}

#[test]
fn bad_arguments_are_errors() {
    let g = graph("graph f(%x: f32[3]) {\n  %y = neg(%x)\n  return %y\n}");
    let loaded = compile(&g, &AotOptions::default()).unwrap().load().unwrap();
    let wrong_shape = Tensor::zeros(&[4], DType::F32);
    let e = loaded.run(&[wrong_shape]).unwrap_err().to_string();
    assert!(e.contains("input x"), "{e}");
    let wrong_dtype = Tensor::zeros(&[3], DType::F64);
    assert!(loaded.run(&[wrong_dtype]).is_err());
    assert!(
        loaded
            .run(&[])
            .unwrap_err()
            .to_string()
            .contains("takes 1 inputs")
    );
    // a transposed (non-contiguous) input is copied row-major, as a C caller passes it
    let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let g2 = graph("graph f(%x: f32[3,2]) {\n  %y = neg(%x)\n  return %y\n}");
    let l2 = compile(&g2, &AotOptions::default())
        .unwrap()
        .load()
        .unwrap();
    let tt = t.transpose(0, 1).unwrap();
    let got = l2.run(std::slice::from_ref(&tt)).unwrap();
    let want = run_positional(&g2, &[tt]).unwrap();
    assert_close(&got[0], &want[0], 0.0, "transposed input");
}

#[test]
fn scatter_reductions_combine_as_the_eager_kernel() {
    // duplicate indices, NaN and signed zeros, in a float and an integer dtype
    let x = Tensor::from_vec(vec![1.5f32, -0.0, 2.0, f32::NAN, 4.0, -3.0], &[2, 3]).unwrap();
    let src = Tensor::from_vec(
        vec![2.0f32, 0.0, -1.0, 0.5, 7.0, f32::NAN, -2.5, 3.0],
        &[2, 4],
    )
    .unwrap();
    let index = Tensor::from_vec(vec![0i64, 2, 2, 0, 1, 1, 2, 0], &[2, 4]).unwrap();
    let ints = Tensor::from_vec(vec![5i32, -7, 9, 11, -2, 4], &[2, 3]).unwrap();
    let int_src = Tensor::from_vec(vec![3i32, -4, 6, 2, -9, 8, 1, 5], &[2, 4]).unwrap();
    let (xh, srch) = (
        x.to_dtype(DType::BF16).unwrap(),
        src.to_dtype(DType::BF16).unwrap(),
    );
    let (xb, srcb) = (
        ints.to_dtype(DType::Bool).unwrap(),
        int_src.to_dtype(DType::Bool).unwrap(),
    );
    for reduce in ["sum", "prod", "mean", "amax", "amin"] {
        let dtypes = [
            ("f32", &x, &src),
            ("bf16", &xh, &srch),
            ("i32", &ints, &int_src),
            ("bool", &xb, &srcb),
        ];
        for (dtype, a, b) in dtypes {
            let text = format!(
                "graph f(%x: {dtype}[2,3], %i: i64[2,4], %s: {dtype}[2,4]) {{
  %y = scatter_reduce(%x, %i, %s, dim=1, reduce=\"{reduce}\")
  %w = add(%y, %x)
  return %y, %w
}}"
            );
            let (g, loaded) = load_model(&text);
            let ins = [a.clone(), index.clone(), b.clone()];
            let want = run_positional(&g, &ins).unwrap();
            let got = loaded.run(&ins).unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_close(a, b, 0.0, &format!("{reduce} {dtype} output {i}"));
            }
        }
    }
    // an index out of range is the model's error code, not a write outside the result
    let text = "graph f(%x: f32[2,3], %i: i64[2,4], %s: f32[2,4]) {
  %y = scatter_reduce(%x, %i, %s, dim=1, reduce=\"amax\")
  return %y
}";
    let loaded = compile(&graph(text), &AotOptions::default())
        .unwrap()
        .load()
        .unwrap();
    let bad = Tensor::from_vec(vec![0i64, 2, 3, 0, 1, 1, 2, 0], &[2, 4]).unwrap();
    let e = loaded.run(&[x, bad, src]).unwrap_err().to_string();
    assert!(e.contains("index"), "{e}");
}

#[test]
fn attention_gradients_compile_as_products_and_a_softmax() {
    // the JIT's fused gradient kernel is not in the run-time library: AOT computes the same
    // gradients from the probabilities, within rounding
    for (mask, causal) in [("", "false"), (", %m", "false"), ("", "true")] {
        let mask_in = if mask.is_empty() {
            ""
        } else {
            ", %m: f32[4,5]"
        };
        let text = format!(
            "graph f(%g: f32[2,4,8], %q: f32[2,4,8], %k: f32[2,5,8], %v: f32[2,5,8]{mask_in}) {{
  %y = scaled_dot_product_attention_backward(%g, %q, %k, %v{mask}, is_causal={causal})
  return %y
}}"
        );
        let (g, loaded) = load_model(&text);
        for seed in 0..2 {
            let ins: Vec<Tensor> = g
                .inputs()
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let shape = g.node(v).ty.shape.clone();
                    let mut r = smelt::Generator::new(seed * 10 + i as u64);
                    Tensor::randn_with(&shape, None, &mut r).unwrap()
                })
                .collect();
            let want = run_positional(&g, &ins).unwrap();
            let got = loaded.run(&ins).unwrap();
            assert_close(&got[0], &want[0], 1e-4, &format!("seed {seed} of\n{text}"));
        }
    }
}

#[test]
fn a_training_dropout_draws_the_jits_masks_call_after_call() {
    // call k of a loaded model draws the mask of call k of a fresh compiled function: the
    // first the eager mask of the seed, each later one another
    let text = "graph f(%x: f32[6,5], %w: bf16[3,2,4]) {
  %t = transpose(%x, dim0=0, dim1=1)
  %h = tanh(%t)
  %d = dropout(%h, p=0.3, training=true, seed=42)
  %y = mul(%d, 2.0)
  %e = dropout(%w, p=0.6, training=true, seed=7)
  return %y, %e
}";
    let g = graph(text);
    let loaded = compile(&g, &AotOptions::default()).unwrap().load().unwrap();
    let jit = smelt::exec::CompiledFn::compile(&g, &Default::default()).unwrap();
    let ins = inputs_for(&g, 3);
    let mut firsts = Vec::new();
    for call in 0..3 {
        let got = loaded.run(&ins).unwrap();
        let want = jit.call(&ins).unwrap();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_close(a, b, 0.0, &format!("call {call}, output {i}"));
        }
        firsts.push(got[0].to_f64_vec());
    }
    let kept = |v: &[f64]| v.iter().map(|x| *x != 0.0).collect::<Vec<_>>();
    assert_ne!(kept(&firsts[0]), kept(&firsts[1]), "a new mask each call");
    // the first call's mask is the eager one of the seed
    let h = ins[0].transpose(0, 1).unwrap().tanh().unwrap();
    let eager = h.dropout_seeded(0.3, true, 42).unwrap();
    let eager = (&eager * 2.0).to_f64_vec();
    assert_eq!(kept(&eager), kept(&firsts[0]));
}
