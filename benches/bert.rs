//! A BERT-sized encoder (all-MiniLM-L6's shapes: 6 post-norm layers, width 384, 12 heads,
//! FFN 1536, exact GELU; random weights) over a batch of 32 sequences of 128 tokens,
//! inference: smelt compiled fused and unfused, one `.smelt` graph; and, when
//! `SMELT_TORCH_PYTHON` names a Python with torch, the same encoder in PyTorch eager and
//! `torch.compile` (scripts/torch_bert.py), the two sides taking turns round by round.
//! Prints the median and range of the rounds' medians, and the GEMMs' share of the time.
//!
//! Run: `SMELT_TORCH_PYTHON=python3 cargo bench --bench bert`. With `-- --write FILE` it
//! only writes the graph to FILE (for `smelt profile FILE`).

#[path = "timing/encoder.rs"]
mod encoder;
#[path = "timing/peer.rs"]
mod peer;
#[allow(dead_code)] // shared with the other benches; this one needs only `median_ms`
mod timing;

use peer::Peer;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use std::collections::BTreeMap;
use timing::median_ms;

const ROUNDS: usize = 3;
const REPS: usize = 3;
const B: usize = 32;
const T: usize = 128;
const D: usize = encoder::MINILM.d;
const H: usize = encoder::MINILM.h;
const F: usize = encoder::MINILM.f;
const L: usize = encoder::MINILM.l;

fn main() {
    let dims = &encoder::MINILM;
    let text = encoder::encoder_text(&B.to_string(), &T.to_string(), dims);
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
    let inputs = encoder::encoder_inputs(g, 0);
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
