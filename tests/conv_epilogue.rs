//! A convolution's pointwise epilogue (bias, batch norm with given statistics, relu, a
//! residual add) runs inside the compiled convolution, tile by tile: which kernels nest,
//! that the results are the interpreter's in NCHW and NHWC, for 1-d and grouped
//! convolutions, and that the calls it cannot take (f16, a depthwise convolution, an
//! epilogue reading the convolution's own input, an unbatched input) still compute the
//! same values.

mod common;

use common::inputs::interpret;
use common::{Tol, assert_bits, assert_close};
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use smelt::runtime::MemoryFormat;
use smelt::{DType, Generator, Tensor};

/// Random inputs for the graph's parameters (variances positive).
fn inputs(g: &smelt::ir::graph::Graph, seed: u64) -> Vec<Tensor> {
    let mut rng = Generator::new(seed);
    g.inputs()
        .iter()
        .map(|&v| {
            let n = g.node(v);
            let t = Tensor::randn_with(&n.ty.shape, Some(DType::F64), &mut rng).unwrap();
            let t = if n.name.starts_with('v') {
                t.abs().unwrap().add_scalar(0.5).unwrap()
            } else {
                t
            };
            t.to_dtype(n.ty.dtype).unwrap()
        })
        .collect()
}

/// Compiles `text` fused (NCHW, and NHWC for the inputs named in `nhwc`), checks the
/// number of nested epilogues and the results against the interpreter.
fn check(text: &str, nested: usize, nhwc: &[&str], tol: f64) {
    let m = parse_module(text, "epilogue").unwrap();
    let g = &m.graphs[0];
    let ins = inputs(g, 3);
    let want = interpret(g, &ins);
    let name = &g.name;
    for layout in [false, true] {
        if layout && nhwc.is_empty() {
            continue;
        }
        let mut opts = CompileOptions::default();
        let mut args = ins.clone();
        if layout {
            opts = opts.channels_last(nhwc);
            for (i, &v) in g.inputs().iter().enumerate() {
                if nhwc.contains(&g.node(v).name.as_str()) {
                    args[i] = ins[i].to_memory_format(MemoryFormat::ChannelsLast).unwrap();
                }
            }
        }
        let f = CompiledFn::compile(g, &opts).unwrap();
        assert_eq!(
            f.epilogues_in_convolutions(),
            nested,
            "{name} nhwc={layout}\n{}",
            f.schedule()
        );
        // the same schedule with every step on its own gives the same bits
        let apart = CompiledFn::compile(g, &opts.clone().conv_epilogues(false)).unwrap();
        assert_eq!(apart.epilogues_in_convolutions(), 0);
        let sequential = apart.call(&args).unwrap();
        // twice: a call leaves nothing behind that changes the next
        for call in 0..2 {
            let got = f.call(&args).unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_close(
                    a,
                    b,
                    Tol::rel(tol),
                    &format!("{name} nhwc={layout} call {call} output {i}"),
                );
                assert_bits(
                    a,
                    &sequential[i],
                    &format!("{name} nhwc={layout} call {call} output {i} against the steps apart"),
                );
            }
        }
        // the unfused schedule, one kernel per op, agrees as well
        let u = CompiledFn::compile(g, &opts.clone().fused(false)).unwrap();
        let got = u.call(&args).unwrap();
        assert_close(&got[0], &want[0], Tol::rel(tol), &format!("{name} unfused"));
    }
}

#[test]
fn a_conv_bn_relu_block_runs_its_epilogue_in_the_convolution() {
    check(
        "graph cbr(%x: f32[3,8,13,11], %w: f32[16,8,3,3], %b: f32[16], %m: f32[16], %v: f32[16], %g: f32[16], %t: f32[16]) {
  %c = conv2d(%x, %w, %b, padding=1)
  %n = batch_norm(%c, %m, %v, %g, %t)
  %y = relu(%n)
  return %y
}
",
        1,
        &["x"],
        1e-5,
    );
}

#[test]
fn both_convolutions_of_a_residual_block_nest_their_epilogues() {
    // the second epilogue adds the block's input and writes where, planned step by step,
    // the first epilogue's result (the second convolution's input) would have lived
    check(
        "graph block(%x: f32[2,8,10,9], %w1: f32[8,8,3,3], %w2: f32[8,8,3,3], %s1: f32[8,1,1]) {
  %c1 = conv2d(%x, %w1, none, padding=1)
  %a1 = mul(%c1, %s1)
  %r1 = relu(%a1)
  %c2 = conv2d(%r1, %w2, none, padding=1)
  %a2 = add(%c2, %x)
  %y = relu(%a2)
  return %y
}
",
        2,
        &["x"],
        // two f32 convolutions in a row, then a sum that cancels: as computed step by step
        1e-4,
    );
}

#[test]
fn strided_grouped_1d_and_f64_convolutions_nest_too() {
    check(
        "graph g(%x: f32[2,6,11,10], %w: f32[9,2,3,2], %b: f32[9]) {
  %c = conv2d(%x, %w, %b, stride=[2, 1], padding=[1, 0], dilation=[1, 2], groups=3)
  %y = gelu(%c)
  return %y
}
",
        1,
        &["x"],
        1e-5,
    );
    check(
        "graph one(%x: f64[3,4,17], %w: f64[5,4,3]) {
  %c = conv1d(%x, %w, none, stride=2, padding=1)
  %y = tanh(%c)
  return %y
}
",
        1,
        &[],
        1e-12,
    );
}

#[test]
fn calls_the_tiles_cannot_take_compute_the_same_values() {
    // f16 results are rounded after the convolution: the kernel runs after it
    check(
        "graph h(%x: f16[2,4,7,7], %w: f16[6,4,3,3]) {
  %c = conv2d(%x, %w, none, padding=1)
  %y = relu(%c)
  return %y
}
",
        1,
        &[],
        2e-2,
    );
    // depthwise convolutions run a direct loop
    check(
        "graph dw(%x: f32[2,5,9,9], %w: f32[5,1,3,3]) {
  %c = conv2d(%x, %w, none, padding=1, groups=5)
  %y = relu(%c)
  return %y
}
",
        1,
        &["x"],
        1e-5,
    );
    // the epilogue reads the convolution's own input: the two run one after the other
    check(
        "graph own(%x: f32[2,6,8,8], %w: f32[6,6,3,3]) {
  %c = conv2d(%x, %w, none, padding=1)
  %a = add(%c, %x)
  %y = relu(%a)
  return %y
}
",
        1,
        &["x"],
        1e-5,
    );
    // an NCHW image larger than a tile: each task's output is no contiguous run
    check(
        "graph big(%x: f32[1,8,50,50], %w: f32[4,8,3,3], %b: f32[4]) {
  %c = conv2d(%x, %w, %b, padding=1)
  %y = relu(%c)
  return %y
}
",
        1,
        &[],
        1e-5,
    );
    // an unbatched input
    check(
        "graph u(%x: f32[4,9,9], %w: f32[6,4,3,3]) {
  %c = conv2d(%x, %w, none)
  %y = sigmoid(%c)
  return %y
}
",
        1,
        &[],
        1e-5,
    );
}

#[test]
fn kernels_that_do_not_fit_a_tile_stay_steps_of_their_own() {
    for (text, why) in [
        (
            "graph r(%x: f32[2,4,8,8], %w: f32[6,4,3,3]) {
  %c = conv2d(%x, %w, none, padding=1)
  %y = softmax(%c, dim=1)
  return %y
}
",
            "a reduction over channels",
        ),
        (
            "graph t(%x: f32[2,4,8,8], %w: f32[6,4,3,3]) {
  %c = conv2d(%x, %w, none, padding=1)
  %t = transpose(%c, dim0=2, dim1=3)
  %y = exp(%t)
  return %y
}
",
            "a transposed read",
        ),
    ] {
        let m = parse_module(text, "no").unwrap();
        let g = &m.graphs[0];
        let f = CompiledFn::compile(g, &CompileOptions::default()).unwrap();
        assert_eq!(f.epilogues_in_convolutions(), 0, "{why}\n{}", f.schedule());
        let ins = inputs(g, 5);
        let want = interpret(g, &ins);
        assert_close(&f.call(&ins).unwrap()[0], &want[0], Tol::rel(1e-5), why);
    }
}

#[test]
fn smelt_check_names_the_epilogues_that_run_inside_convolutions() {
    let dir = common::temp_dir("conv_epilogue_check");
    let path = dir.join("block.smelt");
    std::fs::write(
        &path,
        "graph cbr(%x: f32[2,8,9,9], %w: f32[16,8,3,3], %b: f32[16]) {
  %c = conv2d(%x, %w, %b, padding=1)
  %y = relu(%c)
  %p = max_pool2d(%y, kernel_size=2)
  return %p
}
",
    )
    .unwrap();
    let out = common::smelt(&["check", path.to_str().unwrap(), "--fusion"]);
    let text = common::stdout(&out);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(
        text.contains("epilogues run inside the convolution before them, tile by tile: kernel 0\n"),
        "{text}"
    );
}
