//! A ResNet basic block — conv3x3-bn-relu-conv3x3-bn + residual add + relu, 64 channels,
//! x: f32[N,64,56,56] (N = 32 unless `SMELT_BENCH_BATCH` says otherwise), batch norm in
//! training mode — forward and forward+backward, in both memory formats: smelt eager,
//! compiled fused and compiled unfused; and, when `SMELT_TORCH_PYTHON` names a Python with
//! torch, PyTorch eager and `torch.compile` (scripts/torch_resnet_block.py) in the same
//! run, the two taking turns round by round. Prints the median and range of the rounds.
//! The same block in evaluation mode (forward only, compiled fused) runs twice more: with
//! each convolution's epilogue inside the convolution and as a step of its own.
//!
//! Run: `SMELT_TORCH_PYTHON=python3 cargo bench --bench resnet_block`.

#[path = "timing/peer.rs"]
mod peer;
#[allow(dead_code)] // shared with the other benches; this one needs only `median_ms`
mod timing;

use peer::Peer;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use smelt::passes::autodiff::{Seed, autodiff_with};
use smelt::runtime::{ConvOptions, MemoryFormat};
use smelt::{DType, Generator, Tensor};
use std::collections::BTreeMap;
use timing::median_ms;

const ROUNDS: usize = 3;
const REPS: usize = 3;

fn block_text(n: usize) -> String {
    format!(
        "graph block(%x: f32[{n},64,56,56], %w1: f32[64,64,3,3], %g1: f32[64], %b1: f32[64], %w2: f32[64,64,3,3], %g2: f32[64], %b2: f32[64]) {{
  %c1 = conv2d(%x, %w1, none, padding=1)
  %n1 = batch_norm(%c1, none, none, %g1, %b1, training=true)
  %r1 = relu(%n1)
  %c2 = conv2d(%r1, %w2, none, padding=1)
  %n2 = batch_norm(%c2, none, none, %g2, %b2, training=true)
  %s = add(%n2, %x)
  %y = relu(%s)
  return %y
}}
"
    )
}

/// The block in evaluation mode, its batch norms reading running statistics given as
/// inputs (not constants, so not folded into the convolutions): each convolution's
/// epilogue is one pointwise kernel.
fn eval_block_text(n: usize) -> String {
    block_text(n)
        .replace("%b1: f32[64],", "%b1: f32[64], %m1: f32[64], %v1: f32[64],")
        .replace("%b2: f32[64])", "%b2: f32[64], %m2: f32[64], %v2: f32[64])")
        .replace("none, none, %g1, %b1, training=true", "%m1, %v1, %g1, %b1")
        .replace("none, none, %g2, %b2, training=true", "%m2, %v2, %g2, %b2")
}

/// The block eagerly, on `ps` = [x, w1, g1, b1, w2, g2, b2].
fn eager_block(ps: &[Tensor]) -> Tensor {
    let o = ConvOptions::default().padding(1);
    let bn = |h: &Tensor, g: &Tensor, b: &Tensor| {
        h.batch_norm(None, None, Some(g), Some(b), true, 0.1, 1e-5)
            .unwrap()
    };
    let h = ps[0].conv2d(&ps[1], None, &o).unwrap();
    let h = bn(&h, &ps[2], &ps[3]).relu().unwrap();
    let h = bn(&h.conv2d(&ps[4], None, &o).unwrap(), &ps[5], &ps[6]);
    h.add(&ps[0]).unwrap().relu().unwrap()
}

fn main() {
    let n: usize = std::env::var("SMELT_BENCH_BATCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32);
    let m = parse_module(&block_text(n), "block").unwrap();
    let g = &m.graphs[0];
    let names = ["x", "w1", "g1", "b1", "w2", "g2", "b2"];
    let grad = autodiff_with(g, &names, Seed::Inputs).unwrap();
    let mut rng = Generator::new(0);
    let mut params: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&v| Tensor::randn_with(&g.node(v).ty.shape, Some(DType::F32), &mut rng).unwrap())
        .collect();
    params[1] = params[1].mul_scalar(0.06).unwrap();
    params[4] = params[4].mul_scalar(0.06).unwrap();
    let gy = Tensor::randn_with(&[n, 64, 56, 56], Some(DType::F32), &mut rng).unwrap();
    let nhwc = |t: &Tensor| t.to_memory_format(MemoryFormat::ChannelsLast).unwrap();

    // smelt's variants: (name, closure)
    let mut smelt_runs: Vec<(String, Box<dyn Fn()>)> = Vec::new();
    for (fmt, cl) in [("nchw", false), ("cl", true)] {
        let mut ps = params.clone();
        let mut gyf = gy.clone();
        if cl {
            ps[0] = nhwc(&ps[0]);
            gyf = nhwc(&gy);
        }
        let psf = ps.clone();
        smelt_runs.push((
            format!("smelt eager {fmt} fwd"),
            Box::new(move || drop(eager_block(&psf))),
        ));
        let psb = ps.clone();
        let gyb = gyf.clone();
        smelt_runs.push((
            format!("smelt eager {fmt} fwd+bwd"),
            Box::new(move || {
                let leaves: Vec<Tensor> = psb.iter().map(Tensor::detach).collect();
                for l in &leaves {
                    l.requires_grad_(true).unwrap();
                }
                eager_block(&leaves).backward_with(&gyb).unwrap();
            }),
        ));
        for fuse in [true, false] {
            let what = if fuse { "fused" } else { "unfused" };
            let opts = CompileOptions::default().fused(fuse);
            // the forward graph has no gradient input to name
            let (fwd_opts, bwd_opts) = if cl {
                (
                    opts.clone().channels_last(&["x"]),
                    opts.channels_last(&["x", "grad_out0"]),
                )
            } else {
                (opts.clone(), opts)
            };
            let f = CompiledFn::compile(g, &fwd_opts).unwrap();
            let b = CompiledFn::compile(&grad, &bwd_opts).unwrap();
            let psf = ps.clone();
            smelt_runs.push((
                format!("smelt compiled {what} {fmt} fwd"),
                Box::new(move || drop(f.call(&psf).unwrap())),
            ));
            let mut psb = ps.clone();
            psb.push(gyf.clone());
            smelt_runs.push((
                format!("smelt compiled {what} {fmt} fwd+bwd"),
                Box::new(move || drop(b.call(&psb).unwrap())),
            ));
        }
    }
    // evaluation mode, each convolution's epilogue run inside it or as a step of its own
    let em = parse_module(&eval_block_text(n), "eval_block").unwrap();
    let eg = &em.graphs[0];
    let eps: Vec<Tensor> = eg
        .inputs()
        .iter()
        .map(|&v| {
            let name = &eg.node(v).name;
            let t = Tensor::randn_with(&eg.node(v).ty.shape, Some(DType::F32), &mut rng).unwrap();
            match name.as_str() {
                "w1" | "w2" => t.mul_scalar(0.06).unwrap(),
                "v1" | "v2" => t.abs().unwrap(),
                _ => t,
            }
        })
        .collect();
    for (fmt, cl) in [("nchw", false), ("cl", true)] {
        let mut ps = eps.clone();
        let mut opts = CompileOptions::default();
        if cl {
            ps[0] = nhwc(&ps[0]);
            opts = opts.channels_last(&["x"]);
        }
        for nest in [true, false] {
            let f = CompiledFn::compile(eg, &opts.clone().conv_epilogues(nest)).unwrap();
            assert_eq!(f.epilogues_in_convolutions(), if nest { 2 } else { 0 });
            let where_ = if nest { "in conv" } else { "apart" };
            let ps = ps.clone();
            smelt_runs.push((
                format!("smelt compiled fused eval {fmt}, epilogues {where_} fwd"),
                Box::new(move || drop(f.call(&ps).unwrap())),
            ));
        }
    }
    // the eager block computes what the graph does
    let want = smelt::runtime::interp::run(
        g,
        &names
            .iter()
            .zip(&params)
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let diff = eager_block(&params)
        .sub(&want[0])
        .unwrap()
        .abs()
        .unwrap()
        .amax()
        .unwrap()
        .item::<f32>()
        .unwrap();
    assert!(diff < 1e-3, "eager and graph differ by {diff}");

    let mut torch = Peer::start("torch_resnet_block.py", &n.to_string());
    let mut times: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in 0..ROUNDS {
        eprintln!("round {}/{ROUNDS}", round + 1);
        for (name, f) in &smelt_runs {
            times
                .entry(name.clone())
                .or_default()
                .push(median_ms(REPS, f));
        }
        if let Some(t) = torch.as_mut() {
            for (k, v) in t.round() {
                times.entry(k).or_default().push(v);
            }
        }
    }
    drop(torch);
    println!(
        "ResNet basic block, x f32[{n},64,56,56], batch norm in training mode, {} threads; median of {ROUNDS} rounds (range), ms",
        rayon::current_num_threads()
    );
    println!("| variant | forward | forward+backward |");
    println!("|---|---|---|");
    let mut rows: Vec<String> = times
        .keys()
        .filter_map(|k| k.strip_suffix(" fwd").map(str::to_string))
        .collect();
    rows.sort();
    let cell = |v: Option<&Vec<f64>>| match v {
        Some(v) if !v.is_empty() => {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            format!("{:.1} ({:.1}–{:.1})", v[v.len() / 2], v[0], v[v.len() - 1])
        }
        _ => "—".into(),
    };
    for r in rows {
        println!(
            "| {r} | {} | {} |",
            cell(times.get(&format!("{r} fwd"))),
            cell(times.get(&format!("{r} fwd+bwd")))
        );
    }
}
