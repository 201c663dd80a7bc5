//! Control flow kept in the graph (`cargo bench --bench control_flow`):
//! 1. the seeds' linear regression (y = 2x + 1, 100 points, SGD) for 1000 steps as one
//!    compiled `fori_loop`, and as `train::CompiledLoop` (autodiff inside the scan body),
//!    against `CompiledStep` called step by step, eager autograd, and (same run, when
//!    `SMELT_TORCH_PYTHON` names a Python with JAX and NumPy) JAX's `fori_loop` and NumPy;
//! 2. compile time of a `fori_loop` against its trip count, and of the same loop traced as
//!    Rust control flow (the body copied once per step);
//! 3. the MLP of `examples/mlp_classifier` trained one epoch as one `CompiledLoop` call
//!    against `CompiledStep` step by step.
//!
//! Rounds alternate the sides; each figure is the median of the rounds' medians, with their
//! range. `-- --rounds N` sets the number of rounds (default 5).

#[path = "timing/peer.rs"]
mod peer;
#[allow(dead_code)]
mod timing;

use peer::Peer;
use smelt::exec::{CompileOptions, CompiledFn, DiskCache};
use smelt::jit::{fori_loop, trace};
use smelt::nn::functional::{Reduction, cross_entropy, mse_loss};
use smelt::nn::{Linear, Module, ReLU, Sequential};
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::train::{CompiledLoop, CompiledStep, StepConfig};
use smelt::{DType, Generator, Result, Tensor};
use std::time::Instant;
use timing::median_ms;

const STEPS: i64 = 1000;
const LR: f64 = 0.1;

/// Median and range of a list of figures.
fn summary(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn row(name: &str, v: &mut [f64], unit: &str, base: Option<f64>) {
    let (m, lo, hi) = summary(v);
    let ratio = base.map_or(String::new(), |b| format!("   {:.2}×", m / b));
    println!("  {name:<46} {m:>10.3} {unit}  ({lo:.3} – {hi:.3}){ratio}");
}

/// One SGD step of y ≈ w·x + b on the mean squared error, with its gradient by hand.
fn sgd_step(w: &Tensor, b: &Tensor, x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    let err = &(&(x * w) + b) - y;
    let dw = (&(&err * x) * 2.0).mean()?;
    let db = (&err * 2.0).mean()?;
    Ok(vec![w - &(&dw * LR), b - &(&db * LR)])
}

fn linear_data() -> Result<(Tensor, Tensor)> {
    let mut g = Generator::new(0);
    let x = Tensor::randn_with(&[100, 1], Some(DType::F32), &mut g)?;
    let noise = Tensor::randn_with(&[100, 1], Some(DType::F32), &mut g)?.mul_scalar(0.1)?;
    let y = x.mul_scalar(2.0)?.add_scalar(1.0)?.add(&noise)?;
    Ok((x, y))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(5usize);
    let threads = rayon::current_num_threads();
    println!("control flow, {threads} threads, {rounds} rounds (median of rounds, range)");
    linear_regression(rounds)?;
    compile_time(rounds)?;
    mlp_epoch(rounds)?;
    Ok(())
}

fn linear_regression(rounds: usize) -> Result<()> {
    let (x, y) = linear_data()?;
    let w0 = Tensor::zeros(&[1], DType::F32);
    let b0 = Tensor::zeros(&[1], DType::F32);
    // 1. the whole loop traced as one fori_loop and compiled
    let traced = trace(
        |v: &[Tensor]| {
            let (x, y) = (&v[2], &v[3]);
            fori_loop(0, STEPS, &[v[0].clone(), v[1].clone()], |_, c| {
                sgd_step(&c[0], &c[1], x, y)
            })
        },
        &[w0.clone(), b0.clone(), x.clone(), y.clone()],
    )?;
    let opts = CompileOptions::default().threads(1);
    let looped = CompiledFn::compile(traced.graph(), &opts)?;
    let args = [w0.clone(), b0.clone(), x.clone(), y.clone()];
    let fit = looped.call(&args)?;
    println!(
        "\nlinear regression, 100 points, SGD lr {LR}, {STEPS} steps: w = {:.4}, b = {:.4} (1 thread)",
        fit[0].item_f64()?,
        fit[1].item_f64()?
    );
    // 2. CompiledLoop: the loss traced, differentiated and updated inside the scan body
    let model = Linear::new(1, 1, true)?;
    let loss = |m: &Linear, xs: &[Tensor]| mse_loss(&m.forward(&xs[0])?, &xs[1], Reduction::Mean);
    let mut lp = CompiledLoop::new(
        |xs: &[Tensor]| loss(&model, xs),
        &[x.clone(), y.clone()],
        model.named_parameters(),
        StepConfig::sgd(SGDConfig::new(LR)),
        STEPS as usize,
        &opts,
    )?;
    let xs_all = x.unsqueeze(0)?.expand(&[STEPS, 100, 1])?.contiguous()?;
    let ys_all = y.unsqueeze(0)?.expand(&[STEPS, 100, 1])?.contiguous()?;
    // 3. CompiledStep step by step, 4. eager autograd
    let model2 = Linear::new(1, 1, true)?;
    let mut step = CompiledStep::new(
        |xs: &[Tensor]| loss(&model2, xs),
        &[x.clone(), y.clone()],
        model2.named_parameters(),
        SGDConfig::new(LR),
        &opts,
    )?;
    let model3 = Linear::new(1, 1, true)?;
    let mut opt = SGD::new(model3.parameters(), SGDConfig::new(LR))?;
    let mut peer = Peer::start("jax_loops.py", &STEPS.to_string());
    let mut fori = Vec::new();
    let mut cloop = Vec::new();
    let mut cstep = Vec::new();
    let mut eager = Vec::new();
    let mut peers: Vec<(String, Vec<f64>)> = Vec::new();
    let per = |ms: f64, n: i64| ms * 1e3 / n as f64;
    for _ in 0..rounds {
        fori.push(per(median_ms(5, || drop(looped.call(&args))), STEPS));
        cloop.push(per(
            median_ms(5, || drop(lp.run(&[xs_all.clone(), ys_all.clone()]))),
            STEPS,
        ));
        cstep.push(per(
            median_ms(5, || {
                for _ in 0..100 {
                    drop(step.step(&[x.clone(), y.clone()]));
                }
            }),
            100,
        ));
        eager.push(per(
            median_ms(3, || {
                for _ in 0..100 {
                    opt.zero_grad();
                    let l = mse_loss(&model3.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
                    l.backward().unwrap();
                    opt.step().unwrap();
                }
            }),
            100,
        ));
        if let Some(p) = peer.as_mut() {
            for (name, ms) in p.round() {
                let us = per(ms, STEPS);
                match peers.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, v)) => v.push(us),
                    None => peers.push((name, vec![us])),
                }
            }
        }
    }
    println!("  per step (µs):");
    let base = peers
        .iter()
        .find(|(n, _)| n == "jax_fori_loop")
        .map(|(_, v)| summary(&mut v.clone()).0);
    row(
        "smelt fori_loop, compiled (hand gradient)",
        &mut fori,
        "µs",
        base,
    );
    row(
        "smelt CompiledLoop (scan, autodiff)",
        &mut cloop,
        "µs",
        base,
    );
    row("smelt CompiledStep, step by step", &mut cstep, "µs", base);
    row(
        "smelt eager (autograd + optim::SGD)",
        &mut eager,
        "µs",
        base,
    );
    for (name, v) in peers.iter_mut() {
        row(name, v, "µs", base);
    }
    if base.is_some() {
        println!("  (ratios against jax_fori_loop)");
    } else {
        println!("  (set SMELT_TORCH_PYTHON to a Python with jax and numpy for the peers)");
    }
    Ok(())
}

/// A pointwise body looped `n` times: as a fori_loop, or traced as Rust control flow.
fn compile_time(rounds: usize) -> Result<()> {
    let x = Tensor::randn(&[256], None)?;
    let body = |c: &Tensor| -> Result<Tensor> { (&(c * 0.9) + 0.1).tanh() };
    let opts = CompileOptions::default().disk_cache(DiskCache::Off);
    println!("\ncompile time of a pointwise body looped n times (ms):");
    let show = |name: String, f: &dyn Fn() -> Result<smelt::ir::graph::Graph>| -> Result<()> {
        let g = f()?;
        let mut v = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            let c = CompiledFn::compile(&g, &opts)?;
            v.push(t.elapsed().as_secs_f64() * 1e3);
            drop(c);
        }
        row(
            &format!("{name} ({} graph values)", g.len()),
            &mut v,
            "ms",
            None,
        );
        Ok(())
    };
    for n in [8i64, 1000, 100_000] {
        show(format!("fori_loop, n = {n}"), &|| {
            Ok(trace(
                |v: &[Tensor]| fori_loop(0, n, &[v[0].clone()], |_, c| Ok(vec![body(&c[0])?])),
                std::slice::from_ref(&x),
            )?
            .graph()
            .clone())
        })?;
    }
    for n in [8usize, 1000] {
        show(format!("Rust loop traced, n = {n}"), &|| {
            Ok(trace(
                |v: &[Tensor]| {
                    let mut c = v[0].clone();
                    for _ in 0..n {
                        c = body(&c)?;
                    }
                    Ok(vec![c])
                },
                std::slice::from_ref(&x),
            )?
            .graph()
            .clone())
        })?;
    }
    Ok(())
}

fn mlp_epoch(rounds: usize) -> Result<()> {
    const BATCH: usize = 128;
    const STEPS: usize = 8;
    let mut g = Generator::new(1);
    let model = |g: &mut Generator| -> Result<Sequential> {
        let mut m = Sequential::new();
        for (i, (a, b)) in [(2usize, 64usize), (64, 64), (64, 2)]
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                m = m.add(ReLU::new());
            }
            let w = Tensor::randn_with(&[b, a], Some(DType::F32), g)?.mul_scalar(0.3)?;
            m = m.add(Linear::from_tensors(
                w,
                Some(Tensor::zeros(&[b], DType::F32)),
            )?);
        }
        Ok(m)
    };
    let (ma, mb) = (model(&mut g)?, model(&mut g)?);
    let xs = Tensor::randn_with(&[STEPS, BATCH, 2], Some(DType::F32), &mut g)?;
    let labels: Vec<i64> = (0..STEPS * BATCH).map(|i| (i % 2) as i64).collect();
    let ys = Tensor::from_vec(labels, &[STEPS, BATCH])?;
    let loss = |m: &Sequential, v: &[Tensor]| cross_entropy(&m.forward(&v[0])?, &v[1]);
    let ex = [xs.select(0, 0)?, ys.select(0, 0)?];
    let opts = CompileOptions::default();
    let cfg = SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.05)
    };
    let mut lp = CompiledLoop::new(
        |v: &[Tensor]| loss(&ma, v),
        &ex,
        ma.named_parameters(),
        StepConfig::sgd(cfg),
        STEPS,
        &opts,
    )?;
    let mut step = CompiledStep::new(
        |v: &[Tensor]| loss(&mb, v),
        &ex,
        mb.named_parameters(),
        cfg,
        &opts,
    )?;
    let batches: Vec<[Tensor; 2]> = (0..STEPS)
        .map(|i| Ok([xs.select(0, i as i64)?, ys.select(0, i as i64)?]))
        .collect::<Result<_>>()?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(median_ms(5, || drop(lp.run(&[xs.clone(), ys.clone()]))) * 1e3 / STEPS as f64);
        b.push(
            median_ms(5, || {
                for bt in &batches {
                    drop(step.step(bt));
                }
            }) * 1e3
                / STEPS as f64,
        );
    }
    println!("\nMLP 2→64→64→2, batch {BATCH}, SGD momentum, {STEPS} steps per call (µs per step):");
    let base = summary(&mut b.clone()).0;
    row(
        "CompiledLoop (one call per epoch)",
        &mut a,
        "µs",
        Some(base),
    );
    row("CompiledStep (one call per step)", &mut b, "µs", Some(base));
    Ok(())
}
