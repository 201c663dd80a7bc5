//! Data-parallel costs on two MPI ranks, each side timed in the same run, taking turns
//! round by round (median and range of the rounds):
//!
//! 1. all-reduce bandwidth of f32 tensors of 1–256 MB: `ProcessGroup::all_reduce` (sum, in
//!    place) against a plain in-place `MPI_Allreduce` loop on the same MPI library;
//! 2. one training step of an MLP: DistributedDataParallel (eager) and a compiled step
//!    that all-reduces in its graph, each on 2 ranks with batch B per rank, against one
//!    process alone with batch 2B (the other rank waits);
//! 3. the overlap of communication with the backward pass, from the profiler: how many
//!    bucket all-reduces began before the backward pass ended; the trace is written to
//!    `target/ddp_trace.json` (Perfetto, `chrome://tracing`).
//!
//! Run: `cargo bench --features mpi --bench distributed` (it launches itself under
//! `mpirun -np 2`; OpenMPI's `mpirun` must be installed).

use smelt::distributed::{self as dist, Backend, ReduceOp};
use smelt::exec::CompileOptions;
use smelt::nn::functional::cross_entropy;
use smelt::nn::{DistributedDataParallel, Linear, Module, ReLU, Sequential};
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::profiler::{self, EventKind, ProfilerOptions};
use smelt::train::{CompiledStep, StepConfig};
use smelt::{Generator, Result, Tensor};
use std::process::{Command, ExitCode};
use std::time::Instant;

const ROUNDS: usize = 5;
const SIZES_MB: [usize; 5] = [1, 4, 16, 64, 256];
const WORKER: &str = "SMELT_BENCH_RANK";

fn main() -> ExitCode {
    if std::env::var(WORKER).is_err() {
        return launch();
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("distributed bench: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs this bench again on two ranks.
fn launch() -> ExitCode {
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("distributed bench: cannot find its own executable");
        return ExitCode::from(1);
    };
    let status = Command::new("mpirun")
        .args(["-np", "2", "--oversubscribe", "--allow-run-as-root"])
        .args(["--mca", "btl", "self,vader"])
        .args(["-x", &format!("{WORKER}=1")])
        .arg(exe)
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("distributed bench: mpirun exited with {s}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("distributed bench: cannot run mpirun (install openmpi-bin): {e}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<()> {
    dist::init_process_group(Backend::Mpi)?;
    let rank = dist::rank()?;
    if rank == 0 {
        println!(
            "2 ranks on one machine ({} hardware threads), OpenMPI shared memory (btl vader)",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }
    bandwidth(rank)?;
    training_step(rank)?;
    overlap(rank)?;
    dist::destroy_process_group()
}

/// Median, minimum and maximum.
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// A plain in-place `MPI_Allreduce` (sum) of `buf` over MPI_COMM_WORLD, as
/// `dist::all_reduce(&t, ..)` reduces `t`.
fn mpi_allreduce(buf: &mut [f32]) -> Result<()> {
    use smelt::distributed::mpi_ffi as ffi;
    // SAFETY: MPI is initialised (with MPI_THREAD_MULTIPLE, checked by the caller) and
    // `buf` holds `len` floats.
    let rc = unsafe {
        ffi::MPI_Allreduce(
            dist::mpi_in_place(),
            buf.as_mut_ptr().cast(),
            buf.len() as i32,
            ffi::RSMPI_FLOAT,
            ffi::RSMPI_SUM,
            ffi::RSMPI_COMM_WORLD,
        )
    };
    if rc != 0 {
        return Err(smelt::Error::Distributed(format!(
            "MPI_Allreduce failed: {rc}"
        )));
    }
    Ok(())
}

fn bandwidth(rank: usize) -> Result<()> {
    if !dist::mpi_thread_multiple() {
        if rank == 0 {
            println!("MPI does not provide MPI_THREAD_MULTIPLE: the plain MPI loop is skipped");
        }
        return Ok(());
    }
    if rank == 0 {
        println!(
            "\nall-reduce (sum) of f32, 2 ranks: bus bandwidth GB/s = 2(n-1)/n bytes / time, median [min, max] of {ROUNDS} rounds"
        );
        println!(
            "{:>7} {:>26} {:>26} {:>12}",
            "size", "smelt all_reduce", "MPI_Allreduce loop", "smelt / MPI"
        );
    }
    for mb in SIZES_MB {
        let n = mb * (1 << 20) / 4;
        let bytes = (n * 4) as f64;
        let reps = (64 / mb).clamp(2, 16);
        let t = Tensor::ones(&[n], smelt::DType::F32);
        let mut raw = vec![1.0f32; n];
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        // one warm-up each: first touches of the buffers and of MPI's shared segments
        dist::all_reduce(&t, ReduceOp::Sum)?;
        mpi_allreduce(&mut raw)?;
        for round in 0..ROUNDS {
            for side in [round % 2, 1 - round % 2] {
                dist::barrier()?;
                let t0 = Instant::now();
                for _ in 0..reps {
                    if side == 0 {
                        dist::all_reduce(&t, ReduceOp::Sum)?;
                    } else {
                        mpi_allreduce(&mut raw)?;
                    }
                }
                let s = t0.elapsed().as_secs_f64() / reps as f64;
                // bus bandwidth with 2 ranks: 2(n-1)/n = 1
                let gbs = bytes / s / 1e9;
                if side == 0 {
                    ours.push(gbs);
                } else {
                    theirs.push(gbs);
                }
            }
        }
        if rank == 0 {
            let (a, a0, a1) = stats(ours);
            let (b, b0, b1) = stats(theirs);
            println!(
                "{:>5}MB {:>8.2} [{:>6.2}, {:>6.2}] {:>8.2} [{:>6.2}, {:>6.2}] {:>12.2}",
                mb,
                a,
                a0,
                a1,
                b,
                b0,
                b1,
                a / b
            );
        }
    }
    Ok(())
}

const IN: usize = 256;
const HIDDEN: usize = 1024;
const CLASSES: usize = 10;
const BATCH: usize = 64;
const STEPS: usize = 10;

fn mlp(g: &mut Generator) -> Result<Sequential> {
    let lin = |i: usize, o: usize, g: &mut Generator| -> Result<Linear> {
        let w = Tensor::randn_with(&[o, i], None, g)?.mul_scalar(1.0 / (i as f64).sqrt())?;
        let b = Tensor::zeros(&[o], smelt::DType::F32);
        w.requires_grad_(true)?;
        b.requires_grad_(true)?;
        Linear::from_tensors(w, Some(b))
    };
    Ok(Sequential::new()
        .add(lin(IN, HIDDEN, g)?)
        .add(ReLU::new())
        .add(lin(HIDDEN, HIDDEN, g)?)
        .add(ReLU::new())
        .add(lin(HIDDEN, CLASSES, g)?))
}

fn batch(n: usize, g: &mut Generator) -> Result<(Tensor, Tensor)> {
    let x = Tensor::randn_with(&[n, IN], None, g)?;
    let y = Tensor::randint_with(0, CLASSES as i64, &[n], None, g)?;
    Ok((x, y))
}

/// ms per step of `step`, run `STEPS` times.
fn per_step(mut step: impl FnMut() -> Result<()>) -> Result<f64> {
    step()?;
    let t0 = Instant::now();
    for _ in 0..STEPS {
        step()?;
    }
    Ok(t0.elapsed().as_secs_f64() * 1e3 / STEPS as f64)
}

fn training_step(rank: usize) -> Result<()> {
    let mut g = Generator::new(5);
    let cfg = SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.01)
    };
    let ddp = DistributedDataParallel::new(mlp(&mut g)?)?;
    let single = mlp(&mut g)?;
    let (x, y) = batch(BATCH, &mut g)?;
    let (x2, y2) = batch(2 * BATCH, &mut g)?;
    let mut opt = SGD::new(ddp.parameters(), cfg)?;
    let mut opt1 = SGD::new(single.parameters(), cfg)?;
    let opts = CompileOptions::default();
    let replica = mlp(&mut g)?;
    let mut step = CompiledStep::with_config(
        |xs: &[Tensor]| cross_entropy(&replica.forward(&xs[0])?, &xs[1]),
        &[x.clone(), y.clone()],
        replica.named_parameters(),
        StepConfig::sgd(cfg).all_reduce_gradients(),
        &opts,
    )?;
    let alone = mlp(&mut g)?;
    let mut step1 = CompiledStep::with_config(
        |xs: &[Tensor]| cross_entropy(&alone.forward(&xs[0])?, &xs[1]),
        &[x2.clone(), y2.clone()],
        alone.named_parameters(),
        StepConfig::sgd(cfg),
        &opts,
    )?;
    let mut eager = |on_two: bool| -> Result<f64> {
        if on_two {
            per_step(|| {
                opt.zero_grad();
                cross_entropy(&ddp.forward(&x)?, &y)?.backward()?;
                opt.step()
            })
        } else {
            per_step(|| {
                opt1.zero_grad();
                cross_entropy(&single.forward(&x2)?, &y2)?.backward()?;
                opt1.step()
            })
        }
    };
    let mut compiled = |on_two: bool| -> Result<f64> {
        if on_two {
            per_step(|| step.step(&[x.clone(), y.clone()]).map(drop))
        } else {
            per_step(|| step1.step(&[x2.clone(), y2.clone()]).map(drop))
        }
    };
    let mut rows: Vec<(&str, Vec<f64>, Vec<f64>)> = vec![
        ("eager", Vec::new(), Vec::new()),
        ("compiled", Vec::new(), Vec::new()),
    ];
    for round in 0..ROUNDS {
        for side in [round % 2 == 0, round % 2 == 1] {
            for (mode, row) in rows.iter_mut().enumerate() {
                dist::barrier()?;
                let run = |f: &mut dyn FnMut(bool) -> Result<f64>| f(side);
                if side {
                    let ms = if mode == 0 {
                        run(&mut eager)?
                    } else {
                        run(&mut compiled)?
                    };
                    row.1.push(ms);
                } else if rank == 0 {
                    // one process alone: the other rank waits at the barrier
                    let ms = if mode == 0 {
                        run(&mut eager)?
                    } else {
                        run(&mut compiled)?
                    };
                    row.2.push(ms);
                }
            }
        }
    }
    dist::barrier()?;
    if rank == 0 {
        let params: usize = single.parameters().iter().map(Tensor::numel).sum();
        println!(
            "\none training step, MLP {IN}-{HIDDEN}-{HIDDEN}-{CLASSES} ({:.1} MB of f32 gradients), SGD momentum; ms, median [min, max] of {ROUNDS} rounds of {STEPS} steps",
            params as f64 * 4.0 / 1e6
        );
        println!(
            "{:<9} {:>30} {:>30} {:>10}",
            "mode",
            format!("2 ranks x batch {BATCH}"),
            format!("1 process x batch {}", 2 * BATCH),
            "ratio"
        );
        for (name, two, one) in rows {
            let (a, a0, a1) = stats(two);
            let (b, b0, b1) = stats(one);
            println!(
                "{name:<9} {a:>14.2} [{a0:>6.2}, {a1:>6.2}] {b:>14.2} [{b0:>6.2}, {b1:>6.2}] {:>10.2}",
                a / b
            );
        }
    }
    Ok(())
}

/// Profiles a few DDP steps with small buckets and counts the all-reduces that began
/// before the backward pass ended.
fn overlap(rank: usize) -> Result<()> {
    let mut g = Generator::new(9);
    let group = dist::default_group()?;
    // 1 MB buckets: the 4.5 MB of gradients make several
    let ddp = DistributedDataParallel::with_group(mlp(&mut g)?, group, 1.0)?;
    let buckets = ddp.num_buckets();
    let (x, y) = batch(BATCH, &mut g)?;
    let mut opt = SGD::new(ddp.parameters(), SGDConfig::new(0.01))?;
    let mut step = || -> Result<()> {
        opt.zero_grad();
        let loss = cross_entropy(&ddp.forward(&x)?, &y)?;
        {
            let _b = profiler::record_function("backward");
            loss.backward()?;
        }
        opt.step()
    };
    step()?;
    let (r, prof) = profiler::profile(ProfilerOptions::default(), || -> Result<()> {
        for _ in 0..3 {
            step()?;
        }
        Ok(())
    })?;
    r?;
    let backwards: Vec<(u64, u64)> = prof
        .of_kind(EventKind::Range)
        .filter(|e| e.name == "backward")
        .map(|e| (e.start_ns, e.end_ns()))
        .collect();
    let collectives: Vec<u64> = prof
        .of_kind(EventKind::Collective)
        .map(|e| e.start_ns)
        .collect();
    let early = collectives
        .iter()
        .filter(|&&s| backwards.iter().any(|&(b0, b1)| s >= b0 && s < b1))
        .count();
    if rank == 0 {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ddp_trace.json");
        prof.export_chrome_trace(&path)?;
        println!(
            "\noverlap: {early} of {} bucket all-reduces ({buckets} buckets x {} steps) began while the backward pass was running; trace: {}",
            collectives.len(),
            backwards.len(),
            path.display()
        );
    }
    Ok(())
}
