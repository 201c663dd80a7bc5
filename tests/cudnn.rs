//! Convolutions through cuDNN on a GPU, checked against the CPU interpreter: every
//! convolution case of the CUDA op table (forward with bias, both gradients, 1-d and 2-d,
//! strides, dilations, groups, unbatched and transposed operands, f32/f64/f16/bf16),
//! channels_last operands, a ResNet basic block's forward and gradients, and the calls
//! cuDNN must leave to the generated kernels (an asymmetric `"same"` padding, an empty
//! batch). Without a GPU or without cuDNN's library the tests print why and pass
//! (`SMELT_REQUIRE_GPU=1` makes a missing GPU or cuDNN a failure), and the missing-library
//! answers are tested instead.

mod common;

use common::cuda_cases::CASES;
use common::cuda_check::{assert_matches, graph_of, inputs};
use smelt::exec::{CompileOptions, CudaFn};
use smelt::ir::graph::Graph;
use smelt::ir::op::Op;
use smelt::ir::parse_module;
use smelt::runtime::cuda::{self, dnn};
use smelt::runtime::interp;
use smelt::runtime::{ConvOptions, MemoryFormat};
use smelt::{Device, Tensor};

const GPU: Device = Device::Cuda(0);

fn gpu_and_cudnn_or_skip(test: &str) -> bool {
    let gpu = cuda::is_available() && smelt::codegen_cuda::nvrtc::is_available();
    if gpu && dnn::is_available() {
        return true;
    }
    let why = if gpu {
        "cuDNN's library was not found".to_string()
    } else {
        "no GPU with NVRTC".to_string()
    };
    if std::env::var("SMELT_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("{test}: SMELT_REQUIRE_GPU=1 but {why}");
    }
    eprintln!("{test}: skipped, {why}");
    false
}

/// Runs `g` on the GPU (fused) and on the interpreter and compares; returns how many
/// convolutions cuDNN ran during the GPU call.
fn check(name: &str, g: &Graph, host: &[Tensor]) -> usize {
    let named: Vec<(&str, Tensor)> = g
        .inputs()
        .iter()
        .zip(host)
        .map(|(&v, t)| (g.node(v).name.as_str(), t.clone()))
        .collect();
    let want = interp::run(g, &named).unwrap_or_else(|e| panic!("{name}: {e}"));
    let dev: Vec<Tensor> = host.iter().map(|t| t.to_device(GPU).unwrap()).collect();
    let f =
        CudaFn::compile(g, &CompileOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let before = dnn::calls();
    let got = f.call(&dev).unwrap_or_else(|e| panic!("{name}: {e}"));
    let ran = dnn::calls() - before;
    assert_eq!(got.len(), want.len(), "{name}: outputs");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.device(), GPU, "{name}: output {i} on the GPU");
        assert_matches(&format!("{name} output {i}"), &g.cpu().unwrap(), w);
    }
    ran
}

/// Whether cuDNN should take the convolution of `g`: padding alike on both sides (an odd
/// `"same"` total pads one more at the end, which cuDNN cannot) and no empty operand.
fn cudnn_takes(g: &Graph) -> bool {
    g.topo_order().iter().any(|&v| {
        let operand = |i: usize| g.node(g.operands(v)[i]).ty.shape.clone();
        let (attrs, kernel) = match g.node(v).op() {
            Some(Op::Conv { conv, .. }) | Some(Op::ConvInputGrad { conv, .. }) => {
                (conv, operand(1)[2..].to_vec())
            }
            Some(Op::ConvWeightGrad { conv, weight_size }) => (conv, weight_size[2..].to_vec()),
            _ => return false,
        };
        let geo = attrs.geometry(&kernel).unwrap();
        let empty = g
            .operands(v)
            .iter()
            .any(|&o| g.node(o).ty.shape.contains(&0));
        geo.pad_lo == geo.pad_hi && !empty
    })
}

#[test]
fn every_convolution_case_runs_on_cudnn_and_matches_the_interpreter() {
    if !gpu_and_cudnn_or_skip("every_convolution_case_runs_on_cudnn_and_matches_the_interpreter") {
        return;
    }
    smelt::runtime::random::manual_seed(7);
    let mut taken = 0;
    for (name, params, body) in CASES {
        if !body.contains("conv") {
            continue;
        }
        let g = graph_of(name, params, body);
        let ran = check(name, &g, &inputs(&g));
        let want = usize::from(cudnn_takes(&g));
        assert_eq!(ran, want, "{name}: cuDNN ran {ran} convolutions");
        taken += want;
    }
    assert!(taken >= 10, "only {taken} cases went to cuDNN");
}

#[test]
fn asymmetric_padding_and_empty_batches_stay_on_the_generated_kernels() {
    if !gpu_and_cudnn_or_skip("asymmetric_padding_and_empty_batches_stay_on_the_generated_kernels")
    {
        return;
    }
    smelt::runtime::random::manual_seed(8);
    // kernel 4: total padding 3, one more at the end
    let g = graph_of(
        "same_even",
        "%x: f32[2,2,6,5], %w: f32[3,2,4,1]",
        "%y = conv2d(%x, %w, none, padding=\"same\")",
    );
    assert_eq!(check("same_even", &g, &inputs(&g)), 0);
    // an empty batch's weight gradient is zeros, written by the generated kernel
    let g = graph_of(
        "empty_weight_grad",
        "%g: f32[0,4,5,5], %x: f32[0,3,7,7]",
        "%y = convolution_backward_weight(%g, %x, weight_size=[4, 3, 3, 3])",
    );
    assert_eq!(check("empty_weight_grad", &g, &inputs(&g)), 0);
}

#[test]
fn channels_last_operands_are_convolved_by_cudnn() {
    if !gpu_and_cudnn_or_skip("channels_last_operands_are_convolved_by_cudnn") {
        return;
    }
    smelt::runtime::random::manual_seed(9);
    let x = Tensor::randn(&[2, 8, 9, 7], None).unwrap();
    let w = Tensor::randn(&[16, 8, 3, 3], None).unwrap();
    let b = Tensor::randn(&[16], None).unwrap();
    let opts = ConvOptions::default().padding(1);
    let want = x.conv2d(&w, Some(&b), &opts).unwrap();
    for xf in [MemoryFormat::Contiguous, MemoryFormat::ChannelsLast] {
        for wf in [MemoryFormat::Contiguous, MemoryFormat::ChannelsLast] {
            let xd = x.to_memory_format(xf).unwrap().to_device(GPU).unwrap();
            let wd = w.to_memory_format(wf).unwrap().to_device(GPU).unwrap();
            let bd = b.to_device(GPU).unwrap();
            let before = dnn::calls();
            let y = xd.conv2d(&wd, Some(&bd), &opts).unwrap();
            assert_eq!(dnn::calls() - before, 1, "x {xf:?}, w {wf:?}: cuDNN ran");
            assert_eq!(y.shape(), want.shape());
            assert_matches(&format!("x {xf:?}, w {wf:?}"), &y.cpu().unwrap(), &want);
        }
    }
}

const BLOCK: &str = "
graph block(%x: f32[4,16,12,12], %w1: f32[16,16,3,3], %w2: f32[16,16,3,3], %g1: f32[16], %b1: f32[16], %g2: f32[16], %b2: f32[16]) {
  %c1 = conv2d(%x, %w1, none, padding=1)
  %n1 = batch_norm(%c1, none, none, %g1, %b1, training=true)
  %r1 = relu(%n1)
  %c2 = conv2d(%r1, %w2, none, padding=1)
  %n2 = batch_norm(%c2, none, none, %g2, %b2, training=true)
  %s = add(%n2, %x)
  %y = relu(%s)
  %l = sum(%y)
  return %l
}
";

#[test]
fn a_resnet_block_and_its_gradients_match_the_interpreter() {
    if !gpu_and_cudnn_or_skip("a_resnet_block_and_its_gradients_match_the_interpreter") {
        return;
    }
    smelt::runtime::random::manual_seed(10);
    let m = parse_module(BLOCK, "block").unwrap();
    let fwd = &m.graphs[0];
    let grad = smelt::passes::autodiff::autodiff(fwd, &["x", "w1", "w2"]).unwrap();
    let host = inputs(&grad);
    // forward: two convolutions; backward: each one's input and weight gradient, the
    // first one's input gradient included
    let ran = check("block grad", &grad, &host);
    assert!(
        ran >= 6,
        "cuDNN ran {ran} convolutions of the block and its gradient"
    );
}

#[test]
fn without_cudnn_the_answers_are_clean() {
    // whatever this machine has, asking is never a panic
    let present = dnn::is_available();
    match dnn::version() {
        Ok(v) => assert!(present && v >= 8000, "cuDNN version {v}"),
        Err(e) => {
            assert!(!present);
            assert!(e.to_string().contains("libcudnn"), "{e}");
        }
    }
}
