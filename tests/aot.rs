//! Ahead-of-time compiled models (`smelt::aot`, `smelt compile --target cpu`): objects linked
//! by the system C compiler against the run-time library, run, and compared with the
//! reference interpreter; the documented error codes for bad arguments; every model of the
//! repository compiles.
//!
//! The tests that link need a C compiler (`cc`); without one they say so and pass, unless
//! `SMELT_REQUIRE_CXX=1` (CI), where they fail.

mod common;

use common::cli::have_cc;
use common::close::Tol;
use common::{assert_close, inputs_for, temp_dir};
use smelt::aot::{AotOptions, CpuTarget};
use smelt::ir::text::parse_module;
use smelt::{DType, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn module(path: &str) -> smelt::ir::graph::Module {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    parse_module(&text, path).unwrap()
}

use common::aot::{Toolchain, succeed};

/// Links the generic driver against model `m` written to `dir`; returns the executable.
fn link_driver(m: &smelt::aot::AotModel, dir: &Path) -> PathBuf {
    common::aot::link_driver(m, dir, &Toolchain::host())
}

/// Compiles `g` with the default options into a fresh folder named by `tag` and links the
/// generic driver against it: the model, the driver and the folder.
fn built(g: &smelt::ir::Graph, tag: &str) -> (smelt::aot::AotModel, PathBuf, common::cli::TempDir) {
    let dir = temp_dir(tag);
    let m = smelt::aot::compile(g, &AotOptions::default()).unwrap();
    let exe = link_driver(&m, &dir);
    (m, exe, dir)
}

/// Runs a linked driver on `inputs`; returns the outputs and the printed codes.
fn run_driver(
    m: &smelt::aot::AotModel,
    exe: &Path,
    dir: &Path,
    inputs: &[Tensor],
) -> (Vec<Tensor>, String) {
    try_run_driver(m, exe, dir, inputs).unwrap_or_else(|e| panic!("{} failed: {e}", m.name))
}

/// [`run_driver`], or what the driver printed when the call failed.
fn try_run_driver(
    m: &smelt::aot::AotModel,
    exe: &Path,
    dir: &Path,
    inputs: &[Tensor],
) -> Result<(Vec<Tensor>, String), String> {
    common::aot::try_run_driver(m, exe, dir, inputs, &Toolchain::host())
}

/// How an object's outputs must agree with eager's.
#[derive(Clone, Copy)]
enum Eager {
    /// Bit for bit.
    Bits,
    /// Within this tolerance.
    Within(f64),
}

/// Runs `object` (the model, its linked driver and its folder) on `given`, and checks its
/// outputs against the JIT's on `inputs` (the graph `g`'s, of which `given` may bind some)
/// bit for bit, and against eager as `eager` says.
fn matches_jit(
    g: &smelt::ir::Graph,
    inputs: &[Tensor],
    (m, exe, dir): (&smelt::aot::AotModel, &Path, &Path),
    given: &[Tensor],
    eager: Eager,
    what: &str,
) {
    let (got, _) = run_driver(m, exe, dir, given);
    let jit = smelt::exec::CompiledFn::compile(g, &Default::default()).unwrap();
    let want = jit.call(inputs).unwrap();
    let reference = common::inputs::interpret(g, inputs);
    assert_eq!(
        (got.len(), want.len()),
        (reference.len(), reference.len()),
        "{what}"
    );
    for (i, ((a, b), e)) in got.iter().zip(&want).zip(&reference).enumerate() {
        let what = format!("{what} output {i}");
        common::assert_bits(a, b, &format!("{what}: AOT against the JIT"));
        match eager {
            Eager::Bits => common::assert_bits(a, e, &format!("{what}: AOT against eager")),
            Eager::Within(tol) => {
                common::assert_close(a, e, tol, &format!("{what}: AOT against eager"))
            }
        }
    }
}

/// Every graph of a file, with whether its inputs are small enough to run here.
fn graphs_of(path: &str) -> Vec<(smelt::ir::Graph, bool)> {
    module(path)
        .graphs
        .into_iter()
        .map(|g| {
            let elems: usize = g
                .inputs()
                .iter()
                .map(|&v| g.node(v).ty.shape.iter().product::<usize>())
                .sum();
            (g, elems <= 1 << 22)
        })
        .collect()
}

const MODELS: [&str; 9] = [
    "examples/models/attention.smelt",
    "examples/models/residual.smelt",
    "examples/models/mlp_block.smelt",
    "examples/models/layer_norm.smelt",
    "examples/models/linear_regression.smelt",
    "examples/models/softmax.smelt",
    "examples/models/relu_scale.smelt",
    "benches/models/big.smelt",
    "benches/models/gpu.smelt",
];

/// Every `.smelt` model of the repository (examples, benches, tests), found by walking the
/// folders rather than listed, compiles ahead of time, or is refused for an op that
/// tests/common/aot_gaps.rs lists.
#[test]
fn every_model_of_the_repository_compiles() {
    let files = common::aot::repository_models();
    assert!(files.len() >= MODELS.len(), "found {files:?}");
    let mut compiled = 0;
    for path in &files {
        let rel = path.strip_prefix(root()).unwrap().display().to_string();
        for (g, _) in graphs_of(&rel) {
            match smelt::aot::compile(&g, &AotOptions::default()) {
                Ok(m) => {
                    assert_eq!(&m.object[..4], b"\x7fELF", "{rel} {}", g.name);
                    assert_eq!(m.inputs.len(), g.inputs().len());
                    assert!(m.header().contains(&format!("int {}_run(", g.name)));
                    assert!(m.manifest.contains("\"scratch_bytes\""));
                    let size = format!("\"object_bytes\":{}", m.object.len());
                    assert!(m.manifest.contains(&size), "{rel}: {size}");
                    compiled += 1;
                }
                Err(e) => assert!(common::aot::is_listed_gap(&e), "{rel} {}: {e}", g.name),
            }
        }
    }
    assert!(compiled >= MODELS.len(), "{compiled} graphs compiled");
}

#[test]
fn compiled_models_agree_with_the_interpreter_and_refuse_bad_arguments() {
    if !have_cc("compiled_models_agree_with_the_interpreter") {
        return;
    }
    for path in MODELS {
        for (g, small) in graphs_of(path) {
            // the 256 MiB GPU-sized operands are compiled above but not run here
            if !small {
                continue;
            }
            let (m, exe, dir) = built(&g, &g.name);
            for seed in [1, 2] {
                let inputs = inputs_for(&g, seed);
                let want = common::inputs::interpret(&g, &inputs);
                let (got, codes) = run_driver(&m, &exe, &dir, &inputs);
                assert_eq!(got.len(), want.len(), "{path}: outputs");
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.dtype(), b.dtype());
                    assert_close(
                        a,
                        b,
                        Tol::allclose(1e-5, 1e-5),
                        &format!("{path} {} output {i}", g.name),
                    );
                }
                assert_eq!(codes, common::aot::BAD_ARGUMENT_CODES, "{path} {}", g.name);
            }
        }
    }
}

/// The AOT object and the JIT run the same kernels: their outputs are the same bits.
#[test]
fn compiled_models_match_the_jit_bit_for_bit() {
    if !have_cc("compiled_models_match_the_jit_bit_for_bit") {
        return;
    }
    for path in [
        "examples/models/mlp_block.smelt",
        "examples/models/attention.smelt",
        "examples/models/residual.smelt",
    ] {
        let g = module(path).graphs.remove(0);
        let (m, exe, dir) = built(&g, &format!("jit-{}", g.name));
        let inputs = inputs_for(&g, 7);
        let (got, _) = run_driver(&m, &exe, &dir, &inputs);
        let f = smelt::exec::CompiledFn::compile(&g, &Default::default()).unwrap();
        let want = f.call(&inputs).unwrap();
        assert_eq!(got.len(), want.len(), "{path}: outputs");
        for (a, b) in got.iter().zip(&want) {
            common::assert_bits(a, b, path);
        }
    }
}

/// f64 models with transcendentals (exp, log, tanh, sigmoid, silu, erf, both GELUs, softmax,
/// log_softmax, and the activations built from them: mish, softplus, elu, leaky_relu,
/// hardtanh, hardswish, logsigmoid): the object links the run-time library's f64 formulas,
/// the ones the JIT and the eager kernels call, so the three agree bit for bit.
#[test]
fn f64_transcendentals_compile_ahead_of_time_and_match_the_jit() {
    if !have_cc("f64_transcendentals_compile_ahead_of_time_and_match_the_jit") {
        return;
    }
    let text = "graph f64math(%x: f64[5,7], %y: f64[7]) {
  %a = exp(%x)
  %b = tanh(%a)
  %c = sigmoid(%x)
  %d = silu(%y)
  %e = gelu(%x)
  %f = gelu(%x, approximate=\"tanh\")
  %g = erf(%x)
  %h = add(%b, %d)
  %i = softmax(%h, dim=1)
  %j = log_softmax(%c, dim=0)
  %k = log1p(%a)
  %l = mul(%e, %f)
  %m = add(%l, %g)
  %n = mish(%x)
  %o = softplus(%y, beta=2.0, threshold=5.0)
  %p = elu(%x, alpha=1.5)
  %q = leaky_relu(%x, negative_slope=0.2)
  %r = hardtanh(%x, min_val=-0.5, max_val=2.0)
  %s = hardswish(%x)
  %t = logsigmoid(%x)
  %u = add(%n, %o)
  %v = mul(%p, %q)
  %w = sub(%r, %s)
  %z = add(%t, %u)
  return %i, %j, %k, %m, %v, %w, %z
}
";
    let g = parse_module(text, "f64math.smelt")
        .unwrap()
        .graphs
        .remove(0);
    let (m, exe, dir) = built(&g, "f64math");
    let inputs = inputs_for(&g, 3);
    let (got, _) = run_driver(&m, &exe, &dir, &inputs);
    let jit = smelt::exec::CompiledFn::compile(&g, &Default::default()).unwrap();
    let want = jit.call(&inputs).unwrap();
    let eager = common::inputs::interpret(&g, &inputs);
    assert_eq!((got.len(), want.len()), (7, 7));
    for (i, ((a, b), e)) in got.iter().zip(&want).zip(&eager).enumerate() {
        common::assert_bits(a, b, &format!("AOT against the JIT, output {i}"));
        let tol = Tol::allclose(1e-12, 1e-12);
        assert_close(a, e, tol, &format!("AOT against eager, output {i}"));
    }
}

/// The data-movement library ops (cat, stack, repeat, flip, embedding, index_select,
/// gather) over transposed, sliced and broadcast views: copy steps of the run-time library
/// that move the same bits as the JIT's kernels, and an index out of range is an error code.
#[test]
fn library_copies_match_the_jit_bit_for_bit() {
    if !have_cc("library_copies_match_the_jit_bit_for_bit") {
        return;
    }
    let text = r#"
graph joins(%a: f32[3,5], %b: f32[5,2], %c: f64[2,1,4], %d: f32[5,3]) {
  %bt = transpose(%b, dim0=0, dim1=1)
  %x = cat(%a, %bt, %a, dim=0)
  %n = narrow(%a, dim=1, start=1, length=3)
  %y = cat(%n, %a, dim=-1)
  %dt = transpose(%d, dim0=0, dim1=1)
  %s = stack(%a, %dt, %a, dim=1)
  %r = repeat(%c, repeats=[2, 1, 3, 2])
  %f = flip(%bt, dims=[0, 1])
  %g = neg(%f)
  return %x, %y, %s, %r, %g
}
graph picks(%w: f32[11,6], %ids: i64[4,3], %j: i32[5], %x: f64[4,7], %k: i64[4,2]) {
  %e = embedding(%ids, %w)
  %wt = transpose(%w, dim0=0, dim1=1)
  %s = index_select(%wt, %j, dim=1)
  %t = index_select(%w, %j, dim=0)
  %g = gather(%x, %k, dim=1)
  %h = gather(%x, %k, dim=0)
  %m = mul(%e, 2.0)
  return %m, %s, %t, %g, %h
}
"#;
    let module = parse_module(text, "copies").unwrap();
    for g in &module.graphs {
        let (m, exe, dir) = built(g, &format!("copies-{}", g.name));
        let mut inputs = inputs_for(g, 5);
        if g.name == "picks" {
            inputs[1] =
                Tensor::from_vec(vec![0i64, 10, 3, 3, 7, 1, 0, 0, 9, 2, 5, 4], &[4, 3]).unwrap();
            inputs[2] = Tensor::from_vec(vec![5i32, 0, 10, 2, 2], &[5]).unwrap();
            inputs[4] = Tensor::from_vec(vec![3i64, 0, 1, 1, 3, 2, 0, 2], &[4, 2]).unwrap();
        }
        matches_jit(g, &inputs, (&m, &exe, &dir), &inputs, Eager::Bits, &g.name);
        if g.name == "picks" {
            for (input, bad) in [(1, 11i64), (1, -1), (4, 4)] {
                let mut wrong = inputs.clone();
                let t = &wrong[input];
                let mut v: Vec<i64> = t.to_vec::<i64>().unwrap();
                v[2] = bad;
                wrong[input] = Tensor::from_vec(v, t.shape()).unwrap();
                let e = try_run_driver(&m, &exe, &dir, &wrong).err().unwrap();
                assert!(e.contains("outside the dim it indexes"), "{e}");
            }
        }
    }
}

/// Convolutions run the JIT's kernels (`smelt_rt::conv`), so objects give the JIT's bits:
/// the register tiles, the column GEMMs (groups, strides, dilation), depthwise, 1-d, f64 and
/// the halves (computed in f32, rounded once),
/// NCHW and channels_last inputs, sliced inputs and transposed weights copied at run time,
/// and weights bound as constants (reordered when the object is built).
#[test]
fn convolutions_match_the_jit_bit_for_bit() {
    if !have_cc("convolutions_match_the_jit_bit_for_bit") {
        return;
    }
    let text = r#"
graph convs(%x: f32[2,8,9,11], %w: f32[16,8,3,3], %b: f32[16], %w2: f32[6,4,3,2], %wd: f32[8,1,3,3], %bd: f32[8], %xl: f32[2,9,11,8], %wt: f32[3,3,8,16]) {
  %y = conv2d(%x, %w, %b, padding=[1, 1])
  %r = relu(%y)
  %z = conv2d(%x, %w2, none, stride=[2, 1], dilation=[1, 2], groups=2)
  %d = conv2d(%x, %wd, %bd, padding=1, groups=8)
  %xs = narrow(%x, dim=3, start=1, length=9)
  %s = conv2d(%xs, %w2, none, groups=2, padding=[0, 2])
  %cl = permute(%xl, dims=[0, 3, 1, 2])
  %n = conv2d(%cl, %w, %b, stride=2)
  %g = conv2d(%cl, %w2, none, groups=2)
  %wp = permute(%wt, dims=[3, 2, 0, 1])
  %t = conv2d(%x, %wp, none, padding=[2, 0], dilation=[2, 1])
  return %r, %z, %d, %s, %n, %g, %t
}
graph halves(%x: f16[2,4,7,7], %w: f16[8,4,3,3], %b: f16[8], %y: bf16[1,3,6,6], %v: bf16[6,1,3,3]) {
  %c = conv2d(%x, %w, %b, padding=1)
  %a = avg_pool2d(%c, kernel_size=[2, 2])
  %d = conv2d(%y, %v, none, groups=3)
  %g = adaptive_avg_pool2d(%d, output_size=[2, 2])
  return %c, %a, %g
}
graph wide(%x: f64[3,4,13], %w: f64[5,4,3], %b: f64[5], %x2: f64[1,6,7,7], %w2: f64[9,2,1,1]) {
  %y = conv1d(%x, %w, %b, padding=2, stride=2)
  %z = conv2d(%x2, %w2, none, groups=3)
  %e = mul(%z, 0.5)
  return %y, %e
}
"#;
    let module = parse_module(text, "convs").unwrap();
    for g in &module.graphs {
        let inputs = inputs_for(g, 7);
        // the weights as inputs, then bound as constants (all inputs but the first)
        let names: Vec<String> = g.inputs().iter().map(|&v| g.node(v).name.clone()).collect();
        let bound: Vec<(String, Tensor)> = names[1..]
            .iter()
            .cloned()
            .zip(inputs[1..].iter().cloned())
            .filter(|(n, _)| n != "xl")
            .collect();
        let fixed = smelt::passes::fold::bind_inputs(g, &bound).unwrap();
        let mut copied = 0;
        for (tag, graph) in [("inputs", g.clone()), ("constants", fixed)] {
            let (m, exe, dir) = built(&graph, &format!("convs-{}-{tag}", g.name));
            let given: Vec<Tensor> = graph
                .inputs()
                .iter()
                .map(|&v| {
                    inputs[names.iter().position(|n| *n == graph.node(v).name).unwrap()].clone()
                })
                .collect();
            // operands out of a kernel's order are copied at run time, constants reordered
            let copies = m.manifest.matches("contiguous").count();
            match tag {
                "inputs" => copied = copies,
                _ => assert!(
                    copies < copied || copied == 0,
                    "{}: {copies} copies",
                    g.name
                ),
            }
            assert!(g.name != "convs" || copied >= 2, "{}", m.manifest);
            let what = format!("{} ({tag})", g.name);
            matches_jit(g, &inputs, (&m, &exe, &dir), &given, Eager::Bits, &what);
        }
    }
}

/// Pooling runs the JIT's kernels (`smelt_rt::pool`): max pooling in every dtype it takes,
/// average pooling with and without the padding counted, adaptive average pooling; NCHW,
/// channels_last and sliced inputs; results bit for bit the JIT's and eager's.
#[test]
fn pooling_matches_the_jit_bit_for_bit() {
    if !have_cc("pooling_matches_the_jit_bit_for_bit") {
        return;
    }
    let text = r#"
graph pools(%x: f32[2,5,9,11], %xl: f32[2,9,11,6]) {
  %m = max_pool2d(%x, kernel_size=[3, 3], stride=[2, 2], padding=[1, 1])
  %a = avg_pool2d(%x, kernel_size=[3, 2], stride=[2, 1], padding=[1, 1])
  %e = avg_pool2d(%x, kernel_size=[3, 3], stride=[2, 2], padding=[1, 1], count_include_pad=false)
  %g = adaptive_avg_pool2d(%x, output_size=[4, 3])
  %cl = permute(%xl, dims=[0, 3, 1, 2])
  %n = max_pool2d(%cl, kernel_size=[2, 3], dilation=[2, 1])
  %r = relu(%n)
  %q = adaptive_avg_pool2d(%cl, output_size=[1, 1])
  %xs = narrow(%x, dim=2, start=1, length=7)
  %s = max_pool2d(%xs, kernel_size=[2, 2])
  return %m, %a, %e, %g, %r, %q, %s
}
graph wide(%x: f64[1,3,8,8], %i: i32[2,3,6,7], %h: bf16[1,2,5,5]) {
  %a = avg_pool2d(%x, kernel_size=[2, 2])
  %g = adaptive_avg_pool2d(%x, output_size=[3, 5])
  %m = max_pool2d(%i, kernel_size=[3, 2], stride=[1, 2])
  %b = max_pool2d(%h, kernel_size=[2, 2], stride=[1, 1])
  return %a, %g, %m, %b
}
"#;
    let module = parse_module(text, "pools").unwrap();
    for g in &module.graphs {
        let (m, exe, dir) = built(g, &format!("pools-{}", g.name));
        let inputs = inputs_for(g, 9);
        matches_jit(g, &inputs, (&m, &exe, &dir), &inputs, Eager::Bits, &g.name);
    }
}

/// `scatter`, `scatter_add` and `index_add` run as a copy of the operand and a scatter
/// through the index, in the eager kernels' order and arithmetic: duplicate indices (the
/// last write wins, sums accumulate), transposed and sliced sources, integer, half and bool
/// sums, the JIT's bits; an index out of range is an error code. `cumsum` runs the eager
/// kernel's scan (`smelt_rt::scan`) on the same kinds of operands.
#[test]
fn scatters_and_running_sums_match_the_jit_bit_for_bit() {
    if !have_cc("scatters_and_running_sums_match_the_jit_bit_for_bit") {
        return;
    }
    let text = r#"
graph scatters(%x: f32[5,4], %i: i64[3,4], %s: f32[4,3], %xd: f64[2,6,3], %j: i32[4], %t: f64[2,4,3], %xh: bf16[5,4], %sh: bf16[3,4], %xi: i32[6,2], %k: i64[5], %ti: i32[5,2], %xb: bool[6,2], %tb: bool[5,2]) {
  %st = transpose(%s, dim0=0, dim1=1)
  %a = scatter(%x, %i, %st, dim=0)
  %b = scatter_add(%x, %i, %st, dim=0)
  %n = narrow(%t, dim=2, start=0, length=3)
  %c = index_add(%xd, %j, %n, dim=1)
  %h = scatter_add(%xh, %i, %sh, dim=0)
  %m = index_add(%xi, %k, %ti, dim=0)
  %o = index_add(%xb, %k, %tb, dim=0)
  %cs = cumsum(%st, dim=1)
  %ci = cumsum(%xi, dim=0)
  %cb = cumsum(%xb, dim=1)
  %ch = cumsum(%xh, dim=0)
  %cd = cumsum(%n, dim=2)
  return %a, %b, %c, %h, %m, %o, %cs, %ci, %cb, %ch, %cd
}
"#;
    let g = &parse_module(text, "scatters").unwrap().graphs[0];
    let (m, exe, dir) = built(g, "scatters");
    let mut inputs = inputs_for(g, 13);
    // duplicates along the scattered dims
    let i: Vec<i64> = vec![0, 4, 2, 2, 4, 4, 0, 1, 0, 3, 2, 2];
    inputs[1] = Tensor::from_vec(i, &[3, 4]).unwrap();
    inputs[4] = Tensor::from_vec(vec![5i32, 0, 5, 3], &[4]).unwrap();
    inputs[9] = Tensor::from_vec(vec![1i64, 5, 1, 0, 1], &[5]).unwrap();
    matches_jit(
        g,
        &inputs,
        (&m, &exe, &dir),
        &inputs,
        Eager::Bits,
        "scatters",
    );
    for (input, bad) in [(1, 5i64), (9, -1)] {
        let mut wrong = inputs.clone();
        let mut v: Vec<i64> = wrong[input].to_vec::<i64>().unwrap();
        v[1] = bad;
        wrong[input] = Tensor::from_vec(v, inputs[input].shape()).unwrap();
        let e = try_run_driver(&m, &exe, &dir, &wrong).err().unwrap();
        assert!(e.contains("outside the dim it indexes"), "{e}");
    }
}

/// The gradients of convolutions and pooling compile too, on the JIT's kernels: a small
/// CNN's gradient graph (NCHW and channels_last) and the gradient ops themselves in f64,
/// f16 and bf16, with the JIT's bits.
#[test]
fn cnn_gradients_match_the_jit_bit_for_bit() {
    if !have_cc("cnn_gradients_match_the_jit_bit_for_bit") {
        return;
    }
    let text = r#"
graph cnn(%x: f32[2,3,10,9], %w1: f32[8,3,3,3], %b1: f32[8], %w2: f32[6,4,3,3], %wd: f32[6,1,3,3], %xl: f32[2,10,9,3]) {
  %c = conv2d(%x, %w1, %b1, padding=1)
  %r = relu(%c)
  %m = max_pool2d(%r, kernel_size=[2, 2], padding=[1, 0])
  %d = conv2d(%m, %w2, none, stride=2, padding=1, groups=2)
  %e = conv2d(%d, %wd, none, padding=1, groups=6)
  %a = avg_pool2d(%e, kernel_size=[2, 2], padding=[1, 1], count_include_pad=false)
  %g = adaptive_avg_pool2d(%a, output_size=[1, 2])
  %cl = permute(%xl, dims=[0, 3, 1, 2])
  %k = conv2d(%cl, %w1, none, padding=1)
  %p = max_pool2d(%k, kernel_size=[3, 3], stride=2)
  %q = adaptive_avg_pool2d(%p, output_size=[1, 1])
  %s = sum(%g)
  %t = sum(%q)
  %y = add(%s, %t)
  return %y
}
graph ops(%gy: f64[2,4,4,4], %w: f64[4,3,3,3], %x: f64[2,3,6,6], %gp: f64[2,3,3,3], %gh: f16[2,3,3,3], %xh: f16[2,3,6,6], %gb: bf16[2,3,3,3], %gc: bf16[2,4,4,4], %wb: bf16[4,3,3,3]) {
  %dx = convolution_backward_input(%gy, %w, input_size=[2, 3, 6, 6])
  %dw = convolution_backward_weight(%gy, %x, weight_size=[4, 3, 3, 3])
  %mx = max_pool2d_backward(%gp, %x, kernel_size=[2, 2])
  %av = avg_pool2d_backward(%gp, kernel_size=[2, 2], input_size=[2, 3, 6, 6])
  %ad = adaptive_avg_pool2d_backward(%gp, input_size=[2, 3, 6, 6])
  %mh = max_pool2d_backward(%gh, %xh, kernel_size=[2, 2])
  %ab = avg_pool2d_backward(%gb, kernel_size=[2, 2], input_size=[2, 3, 6, 6])
  %cb = convolution_backward_input(%gc, %wb, input_size=[2, 3, 6, 6])
  return %dx, %dw, %mx, %av, %ad, %mh, %ab, %cb
}
"#;
    let module = parse_module(text, "grads").unwrap();
    for g in &module.graphs {
        let g = match g.name.as_str() {
            "cnn" => {
                smelt::passes::autodiff::autodiff(g, &["x", "w1", "b1", "w2", "wd", "xl"]).unwrap()
            }
            _ => g.clone(),
        };
        let (m, exe, dir) = built(&g, &format!("grads-{}", g.name));
        // (the averages' gradients of the CNN fuse into kernels; `ops` has them as steps)
        let steps: &[&str] = match g.name.as_str() {
            "cnn" => &["convolution_backward_input", "max_pool2d_backward"],
            _ => &[
                "convolution_backward_weight",
                "adaptive_avg_pool2d_backward",
            ],
        };
        for op in steps {
            assert!(m.manifest.contains(op), "{}: no {op} step", g.name);
        }
        let inputs = inputs_for(&g, 11);
        let eager = Eager::Within(1e-5);
        matches_jit(&g, &inputs, (&m, &exe, &dir), &inputs, eager, &g.name);
    }
}

/// Attention compiles as matmul and softmax (the run-time library has no fused kernel):
/// with a causal mask, a bool mask with a fully masked row, and an additive mask.
#[test]
fn attention_compiles_ahead_of_time_as_products_and_softmax() {
    if !have_cc("attention_compiles_ahead_of_time_as_products_and_softmax") {
        return;
    }
    let text = r#"
graph causal(%q: f32[2,3,5,8], %k: f32[2,3,7,8], %v: f32[2,3,7,4]) {
  %y = scaled_dot_product_attention(%q, %k, %v, is_causal=true)
  return %y
}
graph masked(%q: f64[3,5,8], %k: f64[3,6,8], %v: f64[3,6,8], %m: bool[5,6]) {
  %y = scaled_dot_product_attention(%q, %k, %v, %m, scale=0.5)
  return %y
}
graph additive(%q: f32[4,8], %k: f32[9,8], %v: f32[9,3], %m: f32[4,9]) {
  %y = scaled_dot_product_attention(%q, %k, %v, %m)
  %z = relu(%y)
  return %z
}
"#;
    let module = parse_module(text, "attention").unwrap();
    for g in &module.graphs {
        let (m, exe, dir) = built(g, &format!("sdpa-{}", g.name));
        // the header names the outputs as the graph does, rewritten or not
        let out = &g.node(g.outputs()[0]).name;
        assert_eq!(&m.outputs[0].name, out, "{}", g.name);
        let mut inputs = inputs_for(g, 9);
        if g.name == "masked" {
            // row 2 sees no key at all: zeros, as eagerly
            let keep: Vec<bool> = (0..30).map(|i| i / 6 != 2 && i % 4 != 1).collect();
            inputs[3] = Tensor::from_vec(keep, &[5, 6]).unwrap();
        }
        let (got, _) = run_driver(&m, &exe, &dir, &inputs);
        let eager = common::inputs::interpret(g, &inputs);
        let tol = match got[0].dtype() {
            DType::F64 => Tol::allclose(1e-12, 1e-12),
            _ => Tol::allclose(1e-5, 1e-5),
        };
        assert_close(
            &got[0],
            &eager[0],
            tol,
            &format!("{} against eager", g.name),
        );
    }
}

/// Batched and broadcast products, f64, f16 and bf16 products (computed in f32 as eagerly), and
/// integer products (wrapping i64 sums, the same bits as eagerly).
#[test]
fn products_of_every_float_dtype_and_batch_shape_agree() {
    if !have_cc("products_of_every_float_dtype_and_batch_shape_agree") {
        return;
    }
    let text = r#"
graph batched(%a: f32[3,1,5,7], %b: f32[4,7,6]) {
  %y = matmul(%a, %b)
  return %y
}
graph vec_mat(%v: f64[7], %b: f64[2,7,3], %c: f64[3]) {
  %y = matmul(%v, %b)
  %z = matmul(%y, %c)
  return %y, %z
}
graph halves(%a: bf16[4,8], %b: bf16[8,5], %c: f16[4,8], %d: f16[8,5]) {
  %y = matmul(%a, %b)
  %t = transpose(%y, dim0=0, dim1=1)
  %z = matmul(%c, %d)
  return %t, %z
}
graph empty_sum(%a: f32[3,0], %b: f32[0,4]) {
  %y = matmul(%a, %b)
  return %y
}
graph ints(%a: i64[2,3,5], %b: i64[5,4], %c: i32[4,7], %d: i32[3,7,2], %e: u8[6,9], %f: u8[9,3]) {
  %bt = transpose(%b, dim0=0, dim1=1)
  %y = matmul(%a, %b)
  %z = matmul(%c, %d)
  %w = matmul(%e, %f)
  %at = transpose(%a, dim0=1, dim1=2)
  %v = matmul(%bt, %at)
  return %y, %z, %w, %v
}
"#;
    let module = parse_module(text, "products").unwrap();
    for g in &module.graphs {
        let (m, exe, dir) = built(g, &g.name);
        let inputs = inputs_for(g, 3);
        let want = common::inputs::interpret(g, &inputs);
        let (got, _) = run_driver(&m, &exe, &dir, &inputs);
        assert_eq!(got.len(), want.len(), "{}: outputs", g.name);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let what = format!("{} output {i}", g.name);
            let tol = match a.dtype() {
                // integer products wrap exactly: the same bits as eagerly
                d if !d.is_float() => {
                    common::assert_bits(a, b, &what);
                    continue;
                }
                // halves: the f32 product rounded once, the same bits as eagerly
                DType::BF16 | DType::F16 => {
                    common::assert_bits(a, b, &what);
                    continue;
                }
                _ => Tol::allclose(1e-5, 1e-5),
            };
            assert_close(a, b, tol, &what);
        }
    }
}

#[test]
fn bad_names_targets_and_library_ops_are_clear_errors() {
    let g = module("examples/models/relu_scale.smelt").graphs.remove(0);
    let opts = AotOptions {
        name: Some("9lives".into()),
        ..AotOptions::default()
    };
    let e = smelt::aot::compile(&g, &opts).err().unwrap().to_string();
    assert!(e.contains("not a C identifier"), "{e}");
    let e = CpuTarget::parse("pentium").err().unwrap().to_string();
    assert!(e.contains("x86-64-v3"), "{e}");
    let sort = parse_module(
        "graph s(%x: f32[4]) {\n  %v, %i = sort(%x)\n  return %v\n}\n",
        "s",
    );
    if let Ok(m) = sort {
        let e = smelt::aot::compile(&m.graphs[0], &AotOptions::default());
        assert!(e.is_err());
    }
    // an op that stays out of objects by design is named, with the reason
    let reduce = parse_module(
        "graph c(%x: f32[2,3]) {\n  %y = all_reduce(%x, op=\"sum\")\n  return %y\n}\n",
        "c",
    )
    .unwrap();
    let e = smelt::aot::compile(&reduce.graphs[0], &AotOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("all_reduce") && e.contains("process group"),
        "{e}"
    );
}

/// Code for x86-64-v3 needs no AVX-512; x86-64-v4 names it.
#[test]
fn cpu_targets_record_the_extensions_they_need() {
    let g = module("examples/models/softmax.smelt").graphs.remove(0);
    let v3 = smelt::aot::compile(
        &g,
        &AotOptions {
            cpu: CpuTarget::X86_64V3,
            ..AotOptions::default()
        },
    )
    .unwrap();
    assert!(v3.features.contains(&"avx2") && v3.features.contains(&"fma"));
    assert!(!v3.features.iter().any(|f| f.starts_with("avx512")));
    let v4 = smelt::aot::compile(
        &g,
        &AotOptions {
            cpu: CpuTarget::X86_64V4,
            ..AotOptions::default()
        },
    )
    .unwrap();
    assert!(v4.features.contains(&"avx512f"));
    assert!(v4.manifest.contains("\"x86-64-v4\""));
}

/// The C example (examples/aot/c/main.c) prints what the interpreter computes.
#[test]
fn the_c_example_prints_the_interpreters_values() {
    if !have_cc("the_c_example_prints_the_interpreters_values") {
        return;
    }
    let dir = temp_dir("c-example");
    let mut objects = Vec::new();
    let mut graphs = Vec::new();
    for (path, name) in [
        ("examples/models/mlp_block.smelt", "mlp"),
        ("examples/models/attention.smelt", "attention"),
    ] {
        let g = module(path).graphs.remove(0);
        let opts = AotOptions {
            name: Some(name.into()),
            ..AotOptions::default()
        };
        smelt::aot::compile(&g, &opts).unwrap().write(&dir).unwrap();
        objects.push(dir.join(format!("{name}.o")));
        graphs.push((name, g));
    }
    let rt = smelt::aot::runtime_library().unwrap();
    let exe = dir.join("example");
    succeed(
        Command::new("cc")
            .arg("-O1")
            .arg("-I")
            .arg(&dir)
            .arg(root().join("examples/aot/c/main.c"))
            .args(&objects)
            .args(smelt::aot::link_flags(&rt).split_whitespace())
            .arg("-o")
            .arg(&exe),
        "linking the C example",
    );
    let text = succeed(&mut Command::new(&exe), "the C example");
    for (name, g) in &graphs {
        // input j holds ((7 i + 3 j) mod 17 - 8) / 8 at element i
        let inputs: Vec<Tensor> = g
            .inputs()
            .iter()
            .enumerate()
            .map(|(j, &v)| {
                let shape = &g.node(v).ty.shape;
                let n: usize = shape.iter().product();
                let x: Vec<f32> = (0..n)
                    .map(|i| (((7 * i + 3 * j) % 17) as f32 - 8.0) / 8.0)
                    .collect();
                Tensor::from_vec(x, shape).unwrap()
            })
            .collect();
        let want = common::inputs::interpret(g, &inputs);
        let out_name = &g.node(g.outputs()[0]).name;
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} {out_name}:")))
            .unwrap_or_else(|| panic!("no output line for {name} in:\n{text}"));
        let got: Vec<f32> = line
            .split_once(':')
            .unwrap()
            .1
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        let got = Tensor::from_vec(got, want[0].shape()).unwrap();
        // printed with six decimals
        assert_close(&got, &want[0], Tol::allclose(1e-5, 2e-6), name);
        assert!(text.contains(&format!("{name} null inputs: 1 (")), "{text}");
        assert!(
            text.contains(&format!("{name} small scratch: 2 (")),
            "{text}"
        );
        assert!(text.contains(&format!("{name} null scratch: 0")), "{text}");
    }
}

/// `smelt compile --target cpu --weights W --shared`: the parameters are compiled into the
/// object as constants (the C interface keeps the other inputs), and `libNAME.so` holds the
/// model and the run-time library, exporting only the model's entry points; a C program
/// linked against it gets the interpreter's values.
#[test]
fn shared_libraries_with_bound_weights_run_through_the_c_interface() {
    if !have_cc("shared_libraries_with_bound_weights_run_through_the_c_interface") {
        return;
    }
    use object::{Object, ObjectSymbol};
    use smelt::cli::compile::{CompileArgs, Target, run};
    let dir = temp_dir("shared-lib");
    let text = "graph block(%x: f32[4,8], %w: f32[16,8], %b: f32[16]) {\n  %h = linear(%x, %w, %b)\n  %y = gelu(%h)\n  return %y\n}\n";
    let model = dir.join("block.smelt");
    std::fs::write(&model, text).unwrap();
    let g = parse_module(text, "block").unwrap().graphs.remove(0);
    let all = inputs_for(&g, 11);
    let weights = dir.join("block.safetensors");
    let named = vec![
        ("w".to_string(), all[1].clone()),
        ("b".to_string(), all[2].clone()),
    ];
    smelt::nn::state_dict::save_safetensors(&weights, &named).unwrap();
    let args = CompileArgs {
        model,
        target: Target::Cpu,
        out: dir.clone(),
        arch: "sm_90".into(),
        graph: None,
        fast_math: false,
        name: Some("blk".into()),
        cpu: "native".into(),
        weights: Some(weights),
        shared: true,
        target_triple: None,
    };
    run(&args).unwrap();
    let header = std::fs::read_to_string(dir.join("blk.h")).unwrap();
    assert!(header.contains("#define BLK_NUM_INPUTS 1"), "{header}");
    let scratch: usize = header
        .lines()
        .find_map(|l| l.strip_prefix("#define BLK_SCRATCH_BYTES "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // only the model's own symbols are exported
    let so = std::fs::read(dir.join("libblk.so")).unwrap();
    let file = object::File::parse(so.as_slice()).unwrap();
    let exported: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .map(|s| s.name().unwrap().to_string())
        .collect();
    assert!(exported.contains(&"blk_run".to_string()), "{exported:?}");
    assert!(
        exported.iter().all(|n| n.starts_with("blk_")),
        "{exported:?}"
    );
    // the generic driver, linked against the shared library
    let exe = dir.join("blk_driver");
    succeed(
        Command::new("cc")
            .arg("-O1")
            .args(["-DMODEL=blk", "-DNIN=1", "-DNOUT=1"])
            .arg(format!("-DSCRATCH={scratch}"))
            .arg(root().join("tests/aot_driver.c"))
            .arg("-L")
            .arg(&dir)
            .arg("-lblk")
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lpthread")
            .arg("-o")
            .arg(&exe),
        "linking against libblk.so",
    );
    let input = dir.join("x.bin");
    std::fs::write(&input, all[0].to_bytes().unwrap()).unwrap();
    let output = dir.join("y.bin");
    succeed(
        Command::new(&exe).arg(&input).arg(&output),
        "the driver on libblk.so",
    );
    let got = Tensor::from_bytes(DType::F32, &[4, 16], &std::fs::read(&output).unwrap()).unwrap();
    let want = common::inputs::interpret(&g, &all);
    assert_close(&got, &want[0], Tol::allclose(1e-5, 1e-5), "libblk.so");
}

/// Weights that do not fit the graph are errors naming the parameter.
#[test]
fn weights_that_do_not_fit_are_named() {
    let text =
        "graph block(%x: f32[4,8], %w: f32[16,8]) {\n  %y = linear(%x, %w)\n  return %y\n}\n";
    let g = parse_module(text, "block").unwrap().graphs.remove(0);
    let wrong = vec![("w".to_string(), Tensor::zeros(&[8, 16], DType::F32))];
    let e = smelt::passes::fold::bind_inputs(&g, &wrong)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("'w'") && e.contains("[16, 8]") && e.contains("[8, 16]"),
        "{e}"
    );
    let stray = vec![("v".to_string(), Tensor::zeros(&[16, 8], DType::F32))];
    let e = smelt::passes::fold::bind_inputs(&g, &stray)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("'v' is no input"), "{e}");
    let right = vec![("w".to_string(), Tensor::zeros(&[16, 8], DType::F32))];
    let bound = smelt::passes::fold::bind_inputs(&g, &right).unwrap();
    assert_eq!(bound.inputs().len(), 1);
}
