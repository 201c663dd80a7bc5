//! Ahead-of-time compiled models and the JIT's disk cache, measured in one run:
//!
//! 1. **AOT against JIT**: the same model (same kernels) called from a C program linking its
//!    object and from `CompiledFn::call` in a Rust process of its own (so that neither side
//!    runs beside the other's thread pool), median ns per call, rounds alternating: two blocks
//!    of `examples/models`, a wide MLP, the GPT of `examples/gpt` (random weights, traced
//!    with its weights as constants, batch 2 × 32 tokens) and the ResNet of
//!    `examples/resnet` (random weights, evaluation mode, batches of 1 and 32 images);
//! 2. **a C program's first call**: the wall time of a process that links the MLP block of
//!    `examples/models` (and one that links the ResNet at batch 1), starts, makes one call
//!    and exits (no compilation at run time);
//! 3. **compilation with the disk cache warm**: `CompiledFn::compile_time` of the first
//!    compile in fresh processes, cache off (passes + Cranelift) against warm (loaded), for a
//!    4-op and a 100-op graph.
//!
//! Needs a C compiler (`cc`). Run: `cargo bench --bench aot`; the AVX2 path:
//! `SMELT_CPU=avx2 SMELT_AOT_CPU=x86-64-v3 cargo bench --bench aot`.

#[path = "../examples/common/export.rs"]
mod export;
#[path = "../examples/common/gpt_model.rs"]
mod gpt_model;
#[path = "../examples/common/resnet_model.rs"]
mod resnet_model;

use smelt::aot::{AotOptions, CpuTarget};
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::text::parse_module;
use smelt::{DType, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const ROUNDS: usize = 7;

fn median_range(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn fmt(v: Vec<f64>, unit: &str) -> String {
    let (m, lo, hi) = median_range(v);
    format!("{m:.1} {unit} ({lo:.1}–{hi:.1})")
}

/// A chain of `n` pointwise ops on a [64, 64] input.
fn chain(n: usize) -> String {
    let mut s = String::from("graph chain(%x: f32[64,64], %b: f32[64]) {\n");
    let mut prev = "%x".to_string();
    for i in 0..n {
        let line = match i % 4 {
            0 => format!("  %v{i} = relu({prev})\n"),
            1 => format!("  %v{i} = mul({prev}, 0.5)\n"),
            2 => format!("  %v{i} = add({prev}, %b)\n"),
            _ => format!("  %v{i} = tanh({prev})\n"),
        };
        s.push_str(&line);
        prev = format!("%v{i}");
    }
    s + &format!("  return {prev}\n}}\n")
}

/// The MLP block of a transformer at a size where a call takes tens of µs.
const MLP: &str = "graph mlp(%x: f32[64,256], %w1: f32[1024,256], %b1: f32[1024], %w2: f32[256,1024], %b2: f32[256]) {
  %h = linear(%x, %w1, %b1)
  %a = gelu(%h)
  %y = linear(%a, %w2, %b2)
  return %y
}
";

/// The GPT of `examples/gpt` with its random initial weights, traced for inference (the
/// weights captured as constants) on a batch of 2 × 32 tokens, as `.smelt` text.
fn gpt_text() -> String {
    smelt::manual_seed(0);
    let model = gpt_model::Gpt::new().unwrap();
    let x = Tensor::zeros(&[2, gpt_model::CTX], DType::I64);
    smelt::ir::print_graph(&export::inference_graph(&model, &x).unwrap())
}

/// The ResNet of `examples/resnet` with its random initial weights in evaluation mode,
/// traced for inference on `batch` images, as `.smelt` text.
fn resnet_text(batch: usize) -> String {
    use smelt::nn::Module;
    smelt::manual_seed(0);
    let mut model = resnet_model::ResNet::new().unwrap();
    model.eval();
    let s = resnet_model::SIZE;
    let x = Tensor::zeros(&[batch, 1, s, s], DType::F32);
    smelt::ir::print_graph(&export::inference_graph(&model, &x).unwrap())
}

/// The instruction set of the AOT objects: `SMELT_AOT_CPU` (`x86-64-v3` with `SMELT_CPU=avx2`
/// measures the AVX2 path), else the machine's own.
fn cpu_target() -> CpuTarget {
    std::env::var("SMELT_AOT_CPU")
        .ok()
        .map(|s| CpuTarget::parse(&s).unwrap())
        .unwrap_or_default()
}

/// Links the timing driver against `m` in `dir`.
fn link(m: &smelt::aot::AotModel, dir: &Path) -> PathBuf {
    m.write(dir).unwrap();
    let rt = smelt::aot::runtime_library().unwrap();
    let exe = dir.join(format!("{}_timing", m.name));
    let out = Command::new("cc")
        .arg("-O2")
        .arg(format!("-DMODEL={}", m.name))
        .arg(format!("-DNIN={}", m.inputs.len()))
        .arg(format!("-DNOUT={}", m.outputs.len()))
        .arg(format!("-DSCRATCH={}", m.scratch_bytes))
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/aot_timing.c"))
        .arg(dir.join(format!("{}.o", m.name)))
        .args(smelt::aot::link_flags(&rt).split_whitespace())
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// In a child process: compiles `file`'s graph once and prints the compile time in µs.
fn child(file: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    let m = parse_module(&text, file).unwrap();
    let f = CompiledFn::compile(&m.graphs[0], &CompileOptions::default()).unwrap();
    println!(
        "{} {}",
        f.compile_time().as_secs_f64() * 1e6,
        f.code_origin().name()
    );
}

fn fresh_compile(file: &Path, cache: &str) -> (f64, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--child", file.to_str().unwrap()])
        .env("SMELT_CACHE_DIR", cache)
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    let (t, origin) = s.trim().split_once(' ').unwrap();
    (t.parse().unwrap(), origin.to_string())
}

/// In a child process: compiles `args[0]`'s graph, reads its inputs' bytes from the files
/// `args[2..]`, makes `args[1]` calls after a tenth as many to warm up, and prints the
/// median ns per call.
fn jit_child(args: &[String]) {
    let text = std::fs::read_to_string(&args[0]).unwrap();
    let g = parse_module(&text, &args[0]).unwrap().graphs.remove(0);
    let calls: usize = args[1].parse().unwrap();
    let inputs: Vec<Tensor> = g
        .inputs()
        .iter()
        .zip(&args[2..])
        .map(|(&v, file)| {
            let ty = &g.node(v).ty;
            Tensor::from_bytes(ty.dtype, &ty.shape, &std::fs::read(file).unwrap()).unwrap()
        })
        .collect();
    let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
    for _ in 0..calls / 10 {
        std::hint::black_box(f.call(&inputs).unwrap());
    }
    let mut t = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t0 = Instant::now();
        std::hint::black_box(f.call(&inputs).unwrap());
        t.push(t0.elapsed().as_nanos() as f64);
    }
    println!("{}", median_range(t).0);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child(&args[i + 1]);
    }
    if let Some(i) = args.iter().position(|a| a == "--jit-child") {
        return jit_child(&args[i + 1..]);
    }
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/aot-bench"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "CPU: strips {}, AOT objects for {}, smelt {}",
        smelt::codegen_cpu::vmath::isa(),
        cpu_target().name(),
        env!("CARGO_PKG_VERSION")
    );

    // 1. AOT against JIT, and 2. the first call of a C program
    println!("\n1. AOT vs JIT, median ns per call over {ROUNDS} rounds (range)");
    let example = |f: &str| {
        std::fs::read_to_string(format!(
            "{}/examples/models/{f}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    for (text, name, calls) in [
        (example("mlp_block.smelt"), "mlp_block", 20000),
        (example("attention.smelt"), "attention", 20000),
        (MLP.to_string(), "mlp_64x256x1024", 200),
        (gpt_text(), "gpt", 200),
        (resnet_text(1), "resnet_b1", 2000),
        (resnet_text(32), "resnet_b32", 200),
    ] {
        let text = &text[..];
        let g = parse_module(text, name).unwrap().graphs.remove(0);
        let m = smelt::aot::compile(
            &g,
            &AotOptions {
                name: Some(name.into()),
                cpu: cpu_target(),
                ..AotOptions::default()
            },
        )
        .unwrap();
        let exe = link(&m, &dir);
        let model = dir.join(format!("{name}.smelt"));
        std::fs::write(&model, text).unwrap();
        let inputs: Vec<Tensor> = g
            .inputs()
            .iter()
            .map(|&v| {
                let ty = &g.node(v).ty;
                let n: usize = ty.shape.iter().product();
                match ty.dtype {
                    DType::F32 => {
                        let x: Vec<f32> = (0..n).map(|j| 1.0 / (1 + j % 7) as f32).collect();
                        Tensor::from_vec(x, &ty.shape).unwrap()
                    }
                    // token ids
                    DType::I64 => {
                        let vocab = gpt_model::VOCAB.len();
                        let x: Vec<i64> = (0..n).map(|j| ((j * 5) % vocab) as i64).collect();
                        Tensor::from_vec(x, &ty.shape).unwrap()
                    }
                    d => panic!("{name}: no inputs of {d} here"),
                }
            })
            .collect();
        let files: Vec<PathBuf> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let p = dir.join(format!("{name}_in{i}.bin"));
                std::fs::write(&p, t.to_bytes().unwrap()).unwrap();
                p
            })
            .collect();
        let median_of = |cmd: &mut Command| -> f64 {
            let out = cmd.output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            text.trim().parse().unwrap_or_else(|_| {
                panic!("{name}: {text} {}", String::from_utf8_lossy(&out.stderr))
            })
        };
        let (mut aot, mut jit) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            aot.push(median_of(
                Command::new(&exe).arg(calls.to_string()).args(&files),
            ));
            jit.push(median_of(
                Command::new(std::env::current_exe().unwrap())
                    .arg("--jit-child")
                    .arg(&model)
                    .arg(calls.to_string())
                    .args(&files),
            ));
        }
        let ratio: Vec<f64> = aot.iter().zip(&jit).map(|(a, j)| a / j).collect();
        println!(
            "  {name}: AOT {} | JIT {} | AOT/JIT {}",
            fmt(aot, "ns"),
            fmt(jit, "ns"),
            fmt(ratio.iter().map(|r| r * 100.0).collect(), "%")
        );
        if name == "mlp_block" || name == "resnet_b1" {
            let mut wall = Vec::new();
            for _ in 0..ROUNDS * 3 {
                let t0 = Instant::now();
                let st = Command::new(&exe).status().unwrap();
                wall.push(t0.elapsed().as_secs_f64() * 1e3);
                assert!(st.success());
            }
            let size = std::fs::metadata(&exe).unwrap().len();
            println!(
                "  2. a C program linking {name} ({:.1} MB, no compiler): start + first call + exit {}",
                size as f64 / 1e6,
                fmt(wall, "ms")
            );
        }
    }

    // 3. compilation in fresh processes, cache off against warm
    println!("\n3. first compile in a fresh process, µs (median of {ROUNDS}, range)");
    for n in [4, 100] {
        let file = dir.join(format!("chain{n}.smelt"));
        std::fs::write(&file, chain(n)).unwrap();
        let cache = dir.join(format!("cache{n}"));
        let cache = cache.to_str().unwrap();
        let (_, first) = fresh_compile(&file, cache);
        assert_eq!(first, "compiled, stored in the disk cache");
        let (mut off, mut warm) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            off.push(fresh_compile(&file, "off").0);
            let (t, origin) = fresh_compile(&file, cache);
            assert_eq!(origin, "disk cache");
            warm.push(t);
        }
        println!(
            "  {n:>3}-op chain: cache off {} | warm {}",
            fmt(off, "µs"),
            fmt(warm, "µs")
        );
    }
}
