//! `smelt export`: every `.smelt` model of `examples/` and graphs covering the exported op
//! families are written as ONNX, checked by `onnx.checker` (full check) and run on
//! onnxruntime, whose outputs must match the interpreter's on random inputs. Also the round
//! trip through `smelt import`'s reader.
//!
//! The checks need a Python with `onnx` and `onnxruntime`: `SMELT_PYTHON` (set by `.ci/run`,
//! where they are required), else `python3` when it has both; without one the onnxruntime
//! part says so and only the round trip runs.

#[path = "../examples/common/gpt_model.rs"]
mod gpt_model;
#[path = "../examples/common/resnet_model.rs"]
mod resnet_model;

use smelt::cli::{Command, execute, export::ExportArgs};
use smelt::ir::parse_module;
use smelt::runtime::{interp, npy};
use smelt::{DType, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command as Process;

fn python() -> Option<String> {
    if let Ok(p) = std::env::var("SMELT_PYTHON") {
        return Some(p);
    }
    let ok = Process::new("python3")
        .args(["-c", "import onnx, onnxruntime"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then(|| "python3".to_string())
}

/// Random inputs for a graph: normal floats, integers below the smallest dim, random bools.
fn random_inputs(g: &smelt::ir::graph::Graph) -> Vec<(String, Tensor)> {
    smelt::manual_seed(7);
    g.inputs()
        .iter()
        .map(|&v| {
            let n = g.node(v);
            let t = match n.ty.dtype {
                d if d.is_float() => Tensor::randn(&n.ty.shape, Some(d)).unwrap(),
                DType::Bool => Tensor::randint(0, 2, &n.ty.shape, Some(DType::I64))
                    .unwrap()
                    .to_dtype(DType::Bool)
                    .unwrap(),
                d => Tensor::randint(0, 3, &n.ty.shape, Some(d)).unwrap(),
            };
            (n.name.clone(), t)
        })
        .collect()
}

fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let g = got.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    let w = want.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 + 1e-4 * b.abs();
        assert!(ok, "{what}: element {i}: {a} instead of {b}");
    }
}

/// Exports the first graph of `text`, checks it on onnxruntime (when there is a Python for
/// it) and through smelt's own reader.
fn check(name: &str, text: &str) {
    check_at(name, text, 17)
}

/// [`check`] at ONNX opset `opset`.
fn check_at(name: &str, text: &str, opset: i64) {
    let work = std::env::temp_dir().join(format!("smelt-export-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let model = work.join(format!("{name}.smelt"));
    std::fs::write(&model, text).unwrap();
    let module = parse_module(text, name).unwrap();
    let g = module.entry();
    let inputs = random_inputs(g);
    let want = interp::run(g, &inputs).unwrap();
    let onnx_file = work.join(format!("{name}.onnx"));
    execute(&Command::Export(ExportArgs {
        model: model.clone(),
        weights: None,
        onnx: onnx_file.clone(),
        opset,
        graph: None,
    }))
    .unwrap_or_else(|e| panic!("{name}: export: {e}"));

    // smelt's reader gives the same graph back
    let back = smelt::onnx::load(&onnx_file).unwrap();
    let refs: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let imported = back.import_for(&refs).unwrap();
    let owned: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    let again = interp::run_positional(&imported.graph, &imported.bind(&owned).unwrap()).unwrap();
    for (k, (a, b)) in again.iter().zip(&want).enumerate() {
        close(a, b, &format!("{name} through smelt's reader, output {k}"));
    }

    let Some(py) = python() else {
        eprintln!("{name}: no Python with onnx and onnxruntime; onnxruntime check skipped");
        return;
    };
    let mut args: Vec<String> = vec![
        "scripts/onnx_check.py".into(),
        onnx_file.display().to_string(),
        work.join("ort").display().to_string(),
    ];
    for (k, (n, t)) in inputs.iter().enumerate() {
        let f = work.join(format!("in{k}.npy"));
        npy::write_npy(&f, t).unwrap();
        args.push(format!("{n}={}", f.display()));
    }
    let out = Process::new(&py).args(&args).output().expect("run python");
    assert!(
        out.status.success(),
        "{name}: onnx checker or onnxruntime failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (k, w) in want.iter().enumerate() {
        let got = npy::read_npy(work.join("ort").join(format!("out{k}.npy"))).unwrap();
        close(&got, w, &format!("{name} on onnxruntime, output {k}"));
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn every_example_model_exports() {
    let mut files: Vec<PathBuf> = std::fs::read_dir("examples/models")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "smelt"))
        .collect();
    files.sort();
    assert!(files.len() >= 5);
    for f in files {
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        check(&name, &std::fs::read_to_string(Path::new(&f)).unwrap());
    }
}

#[test]
fn convolutional_ops_export() {
    check(
        "cnn",
        "graph cnn(%x: f32[2,3,9,9], %w: f32[4,3,3,3], %b: f32[4], %m: f32[4], %v: f32[4],
                   %g: f32[4], %bb: f32[4], %dw: f32[4,1,3,3]) {
          %va = abs(%v)
          %vp = add(%va, 1.0)
          %c = conv2d(%x, %w, %b, stride=2, padding=1)
          %n = batch_norm(%c, %m, %vp, %g, %bb, training=false, eps=0.001)
          %r = relu(%n)
          %d = conv2d(%r, %dw, none, padding=\"same\", groups=4)
          %p = max_pool2d(%d, kernel_size=2, stride=1, padding=1)
          %a = avg_pool2d(%p, kernel_size=3, stride=2, padding=1, count_include_pad=false)
          %q = adaptive_avg_pool2d(%a, output_size=[1, 1])
          %f = flatten(%q, start_dim=1)
          return %f, %a
        }",
    );
}

#[test]
fn pointwise_and_reduction_ops_export() {
    check(
        "pointwise",
        "graph pw(%x: f32[3,4], %y: f32[4], %i: i64[3,4], %k: bool[3,4]) {
          %a = gelu(%x, approximate=\"tanh\")
          %b = gelu(%x)
          %c = silu(%a)
          %d = softplus(%b, beta=2.0)
          %e = leaky_relu(%c, negative_slope=0.1)
          %f = hardtanh(%d, min_val=-0.5, max_val=0.5)
          %g = mul(%e, %y)
          %h = sub(%g, %f)
          %j = div(%h, 3)
          %m = maximum(%j, %x)
          %n = where(%k, %m, %x)
          %o = masked_fill(%n, %k, value=-1.5)
          %p = clamp(%o, min=-1.0)
          %q = rsqrt(%y)
          %r = add(%i, 2)
          %s = mul(%r, 0.5)
          %t = sum(%p, dim=[1], keepdim=true)
          %u = mean(%p)
          %v = amax(%p, dim=[0])
          %w = argmax(%p, dim=1, keepdim=false)
          %z = var(%p, dim=[1], correction=1)
          %sd = std(%p)
          %l = logsumexp(%p, dim=[1])
          %sm = softmax(%p, dim=0)
          %ls = log_softmax(%p, dim=-1)
          %gt = gt(%p, 0.25)
          %an = any(%gt, dim=[1])
          %cs = cumsum(%p, dim=1)
          %fd = div(%i, 2, rounding_mode=\"floor\")
          %rm = remainder(%x, 0.75)
          return %t, %u, %v, %w, %z, %sd, %l, %sm, %ls, %an, %cs, %q, %s, %fd, %rm
        }",
    );
}

#[test]
fn movement_and_indexing_ops_export() {
    check(
        "movement",
        "graph mv(%x: f32[2,3,4], %idx: i64[5], %emb: f32[6,4], %tok: i64[2,3]) {
          %a = permute(%x, dims=[2, 0, 1])
          %b = reshape(%a, shape=[4, -1])
          %c = transpose(%b, dim0=0, dim1=1)
          %d = narrow(%c, dim=0, start=1, length=3)
          %e = select(%x, dim=1, index=-1)
          %f = unsqueeze(%e, dim=0)
          %g = expand(%f, size=[3, 2, 4])
          %h = cat(%g, %g, dim=1)
          %s = stack(%e, %e, dim=2)
          %fl = flip(%x, dims=[0, 2])
          %r = repeat(%e, repeats=[2, 1, 2])
          %tr = triu(%b, diagonal=1)
          %ix = index_select(%emb, %idx, dim=0)
          %em = embedding(%tok, %emb)
          %sl = slice(%x, dim=2, start=1, end=4, step=2)
          return %d, %h, %s, %fl, %r, %tr, %ix, %em, %sl
        }",
    );
}

/// Bitwise ops (the logical ONNX ops for bools, opset 18's bitwise ones for integers), the
/// inverse trigonometric functions and the scatter reductions ONNX has.
#[test]
fn bitwise_trigonometric_and_scatter_reduce_ops_export() {
    check_at(
        "bitwise",
        "graph bw(%x: f32[3,4], %i: i64[3,4], %j: i64[4], %k: bool[3,4], %ix: i64[2,4], %s: f32[2,4]) {
          %xc = clamp(%x, min=-1.0, max=1.0)
          %a = asin(%xc)
          %b = acos(%xc)
          %c = atan(%x)
          %d = bitwise_and(%i, %j)
          %e = bitwise_or(%i, 5)
          %f = bitwise_xor(%i, %j)
          %g = bitwise_not(%i)
          %h = bitwise_not(%k)
          %m = bitwise_xor(%k, %h)
          %n = scatter_reduce(%x, %ix, %s, dim=0, reduce=\"amax\")
          %o = scatter_reduce(%x, %ix, %s, dim=0, reduce=\"prod\")
          %p = scatter_reduce(%x, %ix, %s, dim=0, reduce=\"amin\")
          %q = scatter_reduce(%x, %ix, %s, dim=1, reduce=\"sum\")
          return %a, %b, %c, %d, %e, %f, %g, %h, %m, %n, %o, %p, %q
        }",
        18,
    );
}

#[test]
fn an_op_without_an_onnx_form_is_named() {
    let text = "graph g(%x: f32[4]) {
      %y = dropout(%x, p=0.5, training=true, seed=3)
      return %y
    }";
    let g = parse_module(text, "t").unwrap();
    let e = smelt::onnx::export(g.entry(), &[], 17)
        .unwrap_err()
        .to_string();
    assert!(e.contains("dropout"), "{e}");
    let e = smelt::onnx::export(g.entry(), &[], 5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("opset 5"), "{e}");
    // ONNX has no scatter mean, and integer bitwise ops from opset 18 only
    let text = "graph g(%x: f32[4], %i: i64[2], %s: f32[2], %n: i64[4]) {
      %y = scatter_reduce(%x, %i, %s, dim=0, reduce=\"mean\")
      return %y
    }";
    let g = parse_module(text, "t").unwrap();
    let e = smelt::onnx::export(g.entry(), &[], 18)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("scatter_reduce(reduce=\"mean\") has no ONNX form"),
        "{e}"
    );
    let text = "graph g(%n: i64[4]) {
      %y = bitwise_not(%n)
      return %y
    }";
    let g = parse_module(text, "t").unwrap();
    let e = smelt::onnx::export(g.entry(), &[], 17)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'bitwise_not' of integers needs ONNX opset 18"),
        "{e}"
    );
}

/// Traces `forward` on `x` (no gradients) and checks the graph's export, as `check` does.
fn check_traced(name: &str, forward: impl Fn(&Tensor) -> smelt::Result<Tensor>, x: &Tensor) {
    let traced = {
        let _off = smelt::autograd::no_grad();
        smelt::jit::trace(|xs| Ok(vec![forward(&xs[0])?]), std::slice::from_ref(x)).unwrap()
    };
    check(name, &smelt::ir::print_graph(traced.graph()));
}

/// The models the examples train (examples/gpt, examples/resnet), traced for inference,
/// deploy as ONNX: onnxruntime gives the interpreter's outputs.
#[test]
fn the_example_models_export() {
    use smelt::nn::Module;
    smelt::manual_seed(3);
    let gpt = gpt_model::Gpt::new().unwrap();
    let mut g = smelt::Generator::new(4);
    let x = gpt_model::batch(&mut g).unwrap().0.narrow(0, 0, 2).unwrap();
    check_traced("gpt", |x| gpt.forward(x), &x);
    let mut resnet = resnet_model::ResNet::new().unwrap();
    resnet.train(false);
    let images = resnet_model::images(2, &mut g).unwrap().0;
    check_traced("resnet", |x| resnet.forward(x), &images);
}
