//! A BERT-sized encoder (all-MiniLM-L6's shapes: 6 post-norm layers, width 384, 12 heads,
//! FFN 1536, exact GELU; random weights) over a batch of 32 sequences of 128 tokens,
//! inference: smelt compiled fused and unfused, one `.smelt` graph; and, when
//! `SMELT_TORCH_PYTHON` names a Python with torch, the same encoder in PyTorch eager and
//! `torch.compile` (scripts/torch_bert.py), the two sides taking turns round by round.
//! Prints the median and range of the rounds' medians, and the GEMMs' share of the time.
//!
//! Run: `SMELT_TORCH_PYTHON=python3 cargo bench --bench bert`. With `-- --write FILE` it
//! only writes the graph to FILE (for `smelt profile FILE`).

#[path = "timing/peer.rs"]
mod peer;
#[allow(dead_code)] // shared with the other benches; this one needs only `median_ms`
mod timing;

use peer::Peer;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use smelt::{DType, Generator, Tensor};
use std::collections::BTreeMap;
use std::fmt::Write;
use timing::median_ms;

const ROUNDS: usize = 3;
const REPS: usize = 3;
const B: usize = 32;
const T: usize = 128;
const D: usize = 384;
const H: usize = 12;
const F: usize = 1536;
const L: usize = 6;

/// The encoder as `.smelt` text: inputs `x` and each layer's weights, PyTorch's layouts.
fn encoder_text() -> String {
    let dh = D / H;
    let mut params = format!("%x: f32[{B},{T},{D}]");
    let mut body = String::new();
    let mut h = "x".to_string();
    for l in 0..L {
        for (n, shape) in [
            ("wq", format!("{D},{D}")),
            ("bq", format!("{D}")),
            ("wk", format!("{D},{D}")),
            ("bk", format!("{D}")),
            ("wv", format!("{D},{D}")),
            ("bv", format!("{D}")),
            ("wo", format!("{D},{D}")),
            ("bo", format!("{D}")),
            ("g1", format!("{D}")),
            ("e1", format!("{D}")),
            ("w1", format!("{F},{D}")),
            ("b1", format!("{F}")),
            ("w2", format!("{D},{F}")),
            ("b2", format!("{D}")),
            ("g2", format!("{D}")),
            ("e2", format!("{D}")),
        ] {
            let _ = write!(params, ", %l{l}_{n}: f32[{shape}]");
        }
        let p = format!("l{l}_");
        for x in ["q", "k", "v"] {
            let _ = writeln!(
                body,
                "  %{p}{x} = linear(%{h}, %{p}w{x}, %{p}b{x})
  %{p}{x}4 = reshape(%{p}{x}, shape=[{B}, {T}, {H}, {dh}])
  %{p}{x}h = transpose(%{p}{x}4, dim0=1, dim1=2)"
            );
        }
        let _ = writeln!(
            body,
            "  %{p}a = scaled_dot_product_attention(%{p}qh, %{p}kh, %{p}vh)
  %{p}at = transpose(%{p}a, dim0=1, dim1=2)
  %{p}ac = reshape(%{p}at, shape=[{B}, {T}, {D}])
  %{p}o = linear(%{p}ac, %{p}wo, %{p}bo)
  %{p}r1 = add(%{h}, %{p}o)
  %{p}h1 = layer_norm(%{p}r1, %{p}g1, %{p}e1, normalized_shape=[{D}], eps=1e-12)
  %{p}f = linear(%{p}h1, %{p}w1, %{p}b1)
  %{p}fg = gelu(%{p}f)
  %{p}f2 = linear(%{p}fg, %{p}w2, %{p}b2)
  %{p}r2 = add(%{p}h1, %{p}f2)
  %{p}y = layer_norm(%{p}r2, %{p}g2, %{p}e2, normalized_shape=[{D}], eps=1e-12)"
        );
        h = format!("{p}y");
    }
    format!("graph bert({params}) {{\n{body}  return %{h}\n}}\n")
}

fn main() {
    let text = encoder_text();
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--write") {
        let written = match args.get(i + 1) {
            Some(path) => std::fs::write(path, &text).map_err(|e| format!("{path}: {e}")),
            None => Err("--write needs a file name".into()),
        };
        if let Err(e) = written {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
        return;
    }
    let m = parse_module(&text, "bert").unwrap();
    let g = &m.graphs[0];
    let mut rng = Generator::new(0);
    // weights ~ N(0, 0.02) as BERT initialises them, norms' scales 1
    let inputs: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&v| {
            let node = g.node(v);
            let t = Tensor::randn_with(&node.ty.shape, Some(DType::F32), &mut rng).unwrap();
            match node.name.rsplit('_').next() {
                Some("g1" | "g2") => t.mul_scalar(0.0).unwrap().add_scalar(1.0).unwrap(),
                Some("x") => t,
                _ => t.mul_scalar(0.02).unwrap(),
            }
        })
        .collect();
    let mut runs: Vec<(String, CompiledFn)> = Vec::new();
    for fuse in [true, false] {
        let f = CompiledFn::compile(g, &CompileOptions::default().fused(fuse)).unwrap();
        let what = if fuse { "fused" } else { "unfused" };
        runs.push((format!("smelt compiled {what}"), f));
    }
    let flops: f64 = {
        let lin = 2.0 * (B * T) as f64 * (4.0 * (D * D) as f64 + 2.0 * (D * F) as f64);
        let attn = 2.0 * 2.0 * (B * H) as f64 * (T * T) as f64 * (D / H) as f64;
        L as f64 * (lin + attn)
    };
    let mut torch = Peer::start("torch_bert.py", "");
    let mut times: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in 0..ROUNDS {
        eprintln!("round {}/{ROUNDS}", round + 1);
        for (name, f) in &runs {
            let t = median_ms(REPS, || drop(f.call(&inputs).unwrap()));
            times.entry(name.clone()).or_default().push(t);
        }
        if let Some(t) = torch.as_mut() {
            for (k, v) in t.round() {
                times.entry(k).or_default().push(v);
            }
        }
    }
    drop(torch);
    println!(
        "BERT-sized encoder ({L} layers, width {D}, {H} heads, FFN {F}, exact GELU), x f32[{B},{T},{D}], inference, {} threads, {:.1} GFLOP; median of {ROUNDS} rounds (range), ms",
        rayon::current_num_threads(),
        flops / 1e9
    );
    println!("| variant | ms | GFLOP/s |");
    println!("|---|---|---|");
    for (k, mut v) in times {
        v.sort_by(f64::total_cmp);
        let med = v[v.len() / 2];
        println!(
            "| {k} | {med:.1} ({:.1}–{:.1}) | {:.0} |",
            v[0],
            v[v.len() - 1],
            flops / med / 1e6
        );
    }
}
