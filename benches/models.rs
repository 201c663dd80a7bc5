//! The GPT of `examples/gpt.rs` trained with AdamW (lr 3e-3, clipping at 1.0) and the
//! ResNet of `examples/resnet.rs` trained with SGD (momentum 0.9, lr 0.05, dropout off),
//! each from fixed initial weights on fixed batches: per-step time eager and compiled, and
//! the peak memory of one step of each (recorded by `smelt::profiler`), median and range
//! over the steps.
//!
//! It writes the initial weights, the batches and the first 20 losses (eager and compiled)
//! as `.npy` files to `target/models-bench/` (or the directory after `--out`), which
//! `scripts/torch_models.py` reads to train the same models in PyTorch and compare.
//!
//! The compiled step's peak is that of its first call: a compiled function keeps its
//! temporaries' storage between calls, so only a cold call allocates all it holds.
//!
//! `--long N` then runs N more compiled steps of each model and prints the host memory held
//! by tensor storages (and the process's resident set) after step 100 and every N/10 steps:
//! it must not grow after the first 100.
//!
//! `--profile` then profiles 20 more compiled steps of each model (the ResNet in both
//! memory formats) and prints the ops and kernels that took the most time.
//!
//! Run: `cargo bench --bench models`, `cargo bench --bench models -- --long 10000`,
//! `cargo bench --bench models -- --profile`.

#[path = "../examples/common/gpt_model.rs"]
mod gpt_model;
#[path = "../examples/common/resnet_model.rs"]
mod resnet_model;

use gpt_model::{Gpt, compiled_adamw_step, export_start, loss};
use smelt::nn::Module;
use smelt::optim::{AdamConfig, AdamW, Optimizer, SGD};
use smelt::profiler::{self, MemDevice, ProfilerOptions};
use smelt::runtime::MemoryFormat;
use smelt::runtime::npy::write_npy;
use smelt::{Result, Tensor};
use std::path::PathBuf;
use std::time::Instant;

const STEPS: usize = 20;

fn out_dir() -> PathBuf {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--out") {
        Some(i) if i + 1 < args.len() => PathBuf::from(&args[i + 1]),
        _ => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/models-bench")),
    }
}

/// Median and range of per-step times in ms.
fn summary(mut t: Vec<f64>) -> String {
    t.sort_by(f64::total_cmp);
    format!(
        "{:.2} ms ({:.2}–{:.2})",
        t[t.len() / 2],
        t[0],
        t[t.len() - 1]
    )
}

/// The number after `--long`, if given.
fn long_steps() -> Result<Option<usize>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--long") else {
        return Ok(None);
    };
    match args.get(i + 1).and_then(|n| n.parse().ok()) {
        Some(n) if n > 100 => Ok(Some(n)),
        _ => Err(smelt::Error::Value(
            "--long takes a number of steps above 100".into(),
        )),
    }
}

/// The process's resident set in bytes (Linux; 0 elsewhere).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Runs `n` steps, printing the memory held after step 100 and every `n/10` steps, and
/// the growth after step 100.
fn long_run(what: &str, n: usize, mut step: impl FnMut(usize) -> Result<()>) -> Result<()> {
    use smelt::runtime::storage::memory_stats;
    println!(
        "{what}: {n} compiled steps; memory held after step 100, then every {} steps",
        n / 10
    );
    println!("| step | tensor storages (MB) | resident set (MB) |");
    println!("|---|---|---|");
    let mut at_100 = (0, 0);
    let t0 = Instant::now();
    for i in 1..=n {
        step(i)?;
        if i == 100 || i % (n / 10) == 0 {
            let (held, res) = (memory_stats().allocated, rss());
            if i == 100 {
                at_100 = (held, res);
            }
            println!(
                "| {i} | {:.3} | {:.1} |",
                held as f64 / 1e6,
                res as f64 / 1e6
            );
        }
    }
    let (held, res) = (memory_stats().allocated, rss());
    println!(
        "after step 100: tensor storages {:+} bytes, resident set {:+.1} MB ({:.1} s)",
        held as i64 - at_100.0 as i64,
        (res as f64 - at_100.1 as f64) / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// With `--profile`: the 8 ops and kernels that took the most self time over 20 more calls
/// of `step`.
fn profile_steps(what: &str, mut step: impl FnMut() -> Result<()>) -> Result<()> {
    if !std::env::args().any(|a| a == "--profile") {
        return Ok(());
    }
    let (r, prof) = profiler::profile(ProfilerOptions::default(), || -> Result<()> {
        for _ in 0..20 {
            step()?;
        }
        Ok(())
    })?;
    r?;
    println!("{what}: 20 compiled steps, the ops and kernels that took the most time");
    println!(
        "{}",
        prof.key_averages()
            .table(profiler::SortBy::SelfTime, Some(8))
    );
    Ok(())
}

/// Peak host memory allocated during one call of `f`.
fn peak(f: impl FnOnce() -> Result<()>) -> Result<i64> {
    let opts = ProfilerOptions::default().profile_memory(true);
    let (r, prof) = profiler::profile(opts, f)?;
    r?;
    Ok(prof.peak_memory(MemDevice::Cpu))
}

fn main() -> Result<()> {
    let dir = out_dir();
    gpt(&dir)?;
    resnet(&dir)
}

/// Largest difference of two loss curves.
fn gap(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

fn gpt(dir: &std::path::Path) -> Result<()> {
    let (eager, batches) = export_start(dir, STEPS)?;
    // a twin of the same start for the compiled step
    let compiled = Gpt::new()?;
    for ((_, pe), (_, pc)) in eager
        .named_parameters()
        .iter()
        .zip(compiled.named_parameters())
    {
        let _off = smelt::autograd::no_grad();
        pc.copy_(pe)?;
    }
    let cfg = AdamConfig::new(3e-3);
    let mut opt = AdamW::new(eager.parameters(), cfg)?;
    let mut step = compiled_adamw_step(&compiled, &batches[0])?;
    let (mut te, mut tc) = (Vec::new(), Vec::new());
    let (mut le, mut lc) = (Vec::new(), Vec::new());
    // each kind's steps in a row, as `scripts/torch_models.py` times PyTorch's: a step
    // between two of the other kind finds the caches and the pool's workers cold
    for (x, y) in &batches {
        let t0 = Instant::now();
        opt.zero_grad();
        let l = loss(&eager, x, y)?;
        l.backward()?;
        smelt::autograd::clip_grad_norm_(&eager.parameters(), 1.0, 2.0)?;
        opt.step()?;
        te.push(t0.elapsed().as_secs_f64() * 1e3);
        le.push(l.item_f64()?);
    }
    for (x, y) in &batches {
        let t0 = Instant::now();
        let l = step.step(&[x.clone(), y.clone()])?;
        tc.push(t0.elapsed().as_secs_f64() * 1e3);
        lc.push(l.item_f64()?);
    }
    write_npy(
        dir.join("losses_eager.npy"),
        &Tensor::from_vec(le.clone(), &[STEPS])?,
    )?;
    write_npy(
        dir.join("losses_compiled.npy"),
        &Tensor::from_vec(lc.clone(), &[STEPS])?,
    )?;
    let (x, y) = &batches[0];
    let peak_eager = peak(|| {
        opt.zero_grad();
        let l = loss(&eager, x, y)?;
        l.backward()?;
        opt.step()
    })?;
    // a cold step: its first call allocates every temporary it keeps
    let cold = Gpt::new()?;
    let mut cold_step = compiled_adamw_step(&cold, &batches[0])?;
    let peak_compiled = peak(|| cold_step.step(&[x.clone(), y.clone()]).map(drop))?;
    drop(cold_step);
    // the first steps pay for allocation and, compiled, nothing else: the rest are timed
    let (te, tc) = (te[2..].to_vec(), tc[2..].to_vec());
    println!(
        "GPT (2 layers, width 96, 4 heads, context 32, batch 32), AdamW with clipping, {STEPS} steps, 2 threads"
    );
    println!(
        "| step | time per step (median, range over steps 3–{STEPS}) | peak memory of one step |"
    );
    println!("|---|---|---|");
    println!(
        "| smelt eager | {} | {:.2} MB |",
        summary(te),
        peak_eager as f64 / 1e6
    );
    println!(
        "| smelt compiled | {} | {:.2} MB |",
        summary(tc),
        peak_compiled as f64 / 1e6
    );
    let gap = gap(&le, &lc);
    println!(
        "first {STEPS} losses: eager {:.4} → {:.4}, compiled {:.4} → {:.4}, largest gap {gap:.1e}",
        le[0],
        le[STEPS - 1],
        lc[0],
        lc[STEPS - 1]
    );
    println!(
        "initial weights, batches and losses written to {}",
        dir.display()
    );
    profile_steps("GPT", || step.step(&[x.clone(), y.clone()]).map(drop))?;
    if let Some(n) = long_steps()? {
        long_run("GPT", n, |i| {
            let (x, y) = &batches[i % STEPS];
            step.step(&[x.clone(), y.clone()]).map(drop)
        })?;
    }
    Ok(())
}

/// The ResNet: eager and compiled, NCHW and channels_last, from one start.
fn resnet(dir: &std::path::Path) -> Result<()> {
    let (start, batches) = resnet_model::export_start(dir, STEPS)?;
    let twin = || -> Result<resnet_model::ResNet> {
        let m = resnet_model::ResNet::with_dropout(0.0)?;
        let _off = smelt::autograd::no_grad();
        for ((_, a), (_, b)) in m.named_parameters().iter().zip(start.named_parameters()) {
            a.copy_(&b)?;
        }
        Ok(m)
    };
    let eager_run = |fmt: MemoryFormat| -> Result<(Vec<f64>, Vec<f64>)> {
        let model = twin()?;
        let mut opt = SGD::new(model.parameters(), resnet_model::sgd())?;
        let (mut t, mut l) = (Vec::new(), Vec::new());
        for (x, y) in &batches {
            let x = x.to_memory_format(fmt)?;
            let t0 = Instant::now();
            opt.zero_grad();
            let loss = resnet_model::loss(&model, &x, y)?;
            loss.backward()?;
            opt.step()?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
            l.push(loss.item_f64()?);
        }
        Ok((t, l))
    };
    let (te, le) = eager_run(MemoryFormat::Contiguous)?;
    let (tl, _) = eager_run(MemoryFormat::ChannelsLast)?;
    // compiled, from batches in each memory format (channels_last batches plan the step NHWC)
    let compiled_run = |fmt: MemoryFormat| -> Result<(Vec<f64>, Vec<f64>, i64)> {
        let model = twin()?;
        let batches: Vec<(Tensor, Tensor)> = batches
            .iter()
            .map(|(x, y)| Ok((x.to_memory_format(fmt)?, y.clone())))
            .collect::<Result<_>>()?;
        let mut step = resnet_model::compiled_sgd_step(&model, &batches[0])?;
        let (mut t, mut l) = (Vec::new(), Vec::new());
        for (x, y) in &batches {
            let t0 = Instant::now();
            let loss = step.step(&[x.clone(), y.clone()])?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
            l.push(loss.item_f64()?);
        }
        let (x, y) = &batches[0];
        profile_steps(&format!("ResNet {fmt:?}"), || {
            step.step(&[x.clone(), y.clone()]).map(drop)
        })?;
        drop(step);
        let cold = twin()?;
        let (x, y) = &batches[0];
        let mut cold_step = resnet_model::compiled_sgd_step(&cold, &batches[0])?;
        let peak = peak(|| cold_step.step(&[x.clone(), y.clone()]).map(drop))?;
        Ok((t, l, peak))
    };
    let (tc, lc, peak_compiled) = compiled_run(MemoryFormat::Contiguous)?;
    let (tcl, lcl, peak_cl) = compiled_run(MemoryFormat::ChannelsLast)?;
    write_npy(
        dir.join("resnet.losses_compiled.npy"),
        &Tensor::from_vec(lc.clone(), &[STEPS])?,
    )?;
    println!(
        "ResNet (stem 16, blocks 16 and 32, images [{}, 1, 16, 16]), SGD momentum 0.9, {STEPS} steps, 2 threads",
        resnet_model::BATCH
    );
    println!("| step | time per step (median, range over steps 3–{STEPS}) |");
    println!("|---|---|");
    println!("| smelt eager NCHW | {} |", summary(te[2..].to_vec()));
    println!(
        "| smelt eager channels_last | {} |",
        summary(tl[2..].to_vec())
    );
    println!(
        "| smelt compiled NCHW | {} (peak memory {:.2} MB) |",
        summary(tc[2..].to_vec()),
        peak_compiled as f64 / 1e6
    );
    println!(
        "| smelt compiled channels_last | {} (peak memory {:.2} MB) |",
        summary(tcl[2..].to_vec()),
        peak_cl as f64 / 1e6
    );
    println!(
        "first {STEPS} losses: eager {:.4} → {:.4}, compiled {:.4} → {:.4}, largest gap {:.1e} (channels_last {:.1e})",
        le[0],
        le[STEPS - 1],
        lc[0],
        lc[STEPS - 1],
        gap(&le, &lc),
        gap(&le, &lcl)
    );
    if let Some(n) = long_steps()? {
        let compiled = twin()?;
        let mut step = resnet_model::compiled_sgd_step(&compiled, &batches[0])?;
        long_run("ResNet", n, |i| {
            let (x, y) = &batches[i % STEPS];
            step.step(&[x.clone(), y.clone()]).map(drop)
        })?;
    }
    Ok(())
}
