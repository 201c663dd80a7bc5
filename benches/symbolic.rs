//! Symbolic shapes: a MiniLM-shaped encoder written once with its batch and sequence as
//! symbols (`x: f32[B,S,384]`) against the same text written at each size.
//!
//! - first compile: `SymbolicModule::parse` (verified for every size), bind, read at the
//!   sizes and compile, against `parse_module` and compile of the text at those sizes;
//! - calls at S = 8, 32, 128, 512 (B = 1) through one `SymbolicFn` against a `CompiledFn`
//!   compiled for each S, the two taking turns round by round; and how many compiles the
//!   `SymbolicFn` made.
//!
//! Run: `cargo bench --bench symbolic`. The disk cache is off, so every compile compiles.

#[path = "timing/encoder.rs"]
mod encoder;
#[allow(dead_code)] // shared with the other benches; this one needs only `median_ms`
mod timing;

use smelt::exec::{CompileOptions, CompiledFn, DiskCache, SymbolicFn};
use smelt::ir::parse_module;
use smelt::ir::sym::Bindings;
use smelt::ir::text::SymbolicModule;
use smelt::{Device, Tensor};
use std::time::Instant;
use timing::median_ms;

const ROUNDS: usize = 5;
const REPS: usize = 5;
const SEQS: [usize; 4] = [8, 32, 128, 512];

fn median_range(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// One first compile in this process: the encoder at B=1, S=128 from static text, or from
/// the symbolic text bound to those sizes; its time in ms.
fn first_compile_ms(which: &str, opts: &CompileOptions) -> f64 {
    let dims = &encoder::MINILM;
    let t = Instant::now();
    let g = if which == "static" {
        parse_module(&encoder::encoder_text("1", "128", dims), "bert").unwrap()
    } else {
        let m = SymbolicModule::parse(&encoder::encoder_text("B", "S", dims), "bert").unwrap();
        let x = [("x", &[1usize, 128, dims.d][..])];
        m.instantiate(&m.bind(None, &x).unwrap()).unwrap()
    };
    drop(CompiledFn::compile(g.entry(), opts).unwrap());
    t.elapsed().as_secs_f64() * 1e3
}

/// [`first_compile_ms`] run by a fresh copy of this program.
fn in_fresh_process(which: &str) -> f64 {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .env("SMELT_BENCH_FIRST_COMPILE", which)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("no time from the child: {text}"))
}

fn main() {
    let dims = &encoder::MINILM;
    let opts = CompileOptions::default().disk_cache(DiskCache::Off);
    let sizes = |s: usize| Bindings::from([("B".into(), 1), ("S".into(), s as i64)]);

    // first compile, each in a fresh process (no code cached in memory), alternating
    if let Ok(which) = std::env::var("SMELT_BENCH_FIRST_COMPILE") {
        println!("{}", first_compile_ms(&which, &opts));
        return;
    }
    let (mut stat, mut sym) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        stat.push(in_fresh_process("static"));
        sym.push(in_fresh_process("symbolic"));
    }
    let (s, s0, s1) = median_range(stat);
    let (y, y0, y1) = median_range(sym);
    println!(
        "MiniLM-shaped encoder ({} layers, width {}), x f32[1,128,{}], {} threads",
        dims.l,
        dims.d,
        dims.d,
        rayon::current_num_threads()
    );
    println!("| first compile | ms, median of {ROUNDS} (range) |");
    println!("|---|---|");
    println!("| static text at B=1, S=128 (fresh process) | {s:.1} ({s0:.1}–{s1:.1}) |");
    println!("| symbolic text, bound to B=1, S=128 | {y:.1} ({y0:.1}–{y1:.1}) |");
    println!("| ratio symbolic / static | {:.2} |", y / s);

    // calls
    let symbolic_text = encoder::encoder_text("B", "S", dims);
    let module = SymbolicModule::parse(&symbolic_text, "bert").unwrap();
    let symbolic = SymbolicFn::new(module.clone(), None, Device::Cpu, &opts).unwrap();
    let mut rows = Vec::new();
    for s in SEQS {
        let g = module.instantiate(&sizes(s)).unwrap();
        let inputs: Vec<Tensor> = encoder::encoder_inputs(g.entry(), 0);
        let text = encoder::encoder_text("1", &s.to_string(), dims);
        let fixed =
            CompiledFn::compile(parse_module(&text, "bert").unwrap().entry(), &opts).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            a.push(median_ms(REPS, || drop(symbolic.call(&inputs).unwrap())));
            b.push(median_ms(REPS, || drop(fixed.call(&inputs).unwrap())));
        }
        let ratios: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x / y).collect();
        rows.push((s, median_range(a), median_range(b), median_range(ratios)));
    }
    println!();
    println!("| S | one SymbolicFn, ms | compiled for S, ms | ratio (range) |");
    println!("|---|---|---|---|");
    for (s, (a, ..), (b, ..), (r, r0, r1)) in rows {
        println!("| {s} | {a:.2} | {b:.2} | {r:.2} ({r0:.2}–{r1:.2}) |");
    }
    println!(
        "\ncompiles made by the SymbolicFn for {} sizes: {}",
        SEQS.len(),
        symbolic.compiles()
    );
}
