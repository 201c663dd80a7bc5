//! Data-parallel training of the two-spirals MLP classifier over MPI:
//!
//! ```text
//! cargo build --release --features mpi --example ddp_mlp
//! mpirun -np 2 target/release/examples/ddp_mlp
//! ```
//!
//! Every rank trains a `DistributedDataParallel` replica on its shard of each epoch
//! (`DistributedSampler`), first eagerly (autograd + `optim::SGD`, gradients all-reduced in
//! buckets during the backward pass), then as one compiled step per batch whose graph
//! all-reduces the gradients before the update. Beside each replica it trains a
//! single-process model on the whole global batch (every rank's shard, in rank order),
//! from the same initial weights, and compares their parameters after every step. It
//! prints the largest difference and the step times, and exits non-zero when the
//! difference exceeds float32 tolerance. Without `mpirun` it runs as one rank.

use smelt::data::DistributedSampler;
use smelt::distributed::{self as dist, Backend};
use smelt::exec::CompileOptions;
use smelt::nn::functional::cross_entropy;
use smelt::nn::{DistributedDataParallel, Module, Sequential};
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::train::{CompiledStep, StepConfig};
use smelt::{Generator, Result, Tensor};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[path = "common/spirals.rs"]
mod spirals;
use spirals::{accuracy, spirals, twin_models};

const POINTS_PER_CLASS: usize = 512;
/// Each rank's share of a batch.
const PER_RANK_BATCH: usize = 32;
const EPOCHS: u64 = 4;
const HIDDEN: usize = 64;
/// The largest parameter difference accepted: float32 rounding over the run's steps.
const TOLERANCE: f64 = 1e-4;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ddp_mlp: {e}");
            ExitCode::from(2)
        }
    }
}

/// One mode's result on this rank.
#[derive(Default)]
struct Outcome {
    steps: usize,
    worst: f64,
    replica: Duration,
    single: Duration,
    accuracy: f64,
}

fn run() -> Result<bool> {
    dist::init_process_group(Backend::Mpi)?;
    let (rank, world) = (dist::rank()?, dist::world_size()?);
    // the same data on every rank
    let mut g = Generator::new(2024);
    let (x, y) = spirals(POINTS_PER_CLASS, &mut g)?;
    let (x_test, y_test) = spirals(POINTS_PER_CLASS / 2, &mut g)?;
    let samplers: Vec<DistributedSampler> = (0..world)
        .map(|r| Ok(DistributedSampler::new(x.shape()[0], world, r)?.seed(7)))
        .collect::<Result<_>>()?;
    let data = Data {
        x,
        y,
        samplers,
        rank,
    };
    let eager = train_eager(&data, rank, &x_test, &y_test)?;
    let compiled = train_compiled(&data, rank, &x_test, &y_test)?;
    // every rank's verdict, so that rank 0 reports the worst
    let worst = Tensor::from_vec(vec![eager.worst.max(compiled.worst)], &[1])?;
    dist::all_reduce(&worst, dist::ReduceOp::Max)?;
    let worst = worst.item_f64()?;
    if rank == 0 {
        println!(
            "two spirals: {} points, MLP 2-{HIDDEN}-{HIDDEN}-2, SGD momentum 0.9; {world} rank(s) x batch {PER_RANK_BATCH} against one process x batch {}",
            data.x.shape()[0],
            world * PER_RANK_BATCH
        );
        println!(
            "{:<9} {:>6} {:>22} {:>16} {:>18} {:>9}",
            "mode", "steps", "largest param diff", "replica ms/step", "single ms/step", "accuracy"
        );
        for (name, o) in [("eager", &eager), ("compiled", &compiled)] {
            let ms = |d: Duration| d.as_secs_f64() * 1e3 / o.steps.max(1) as f64;
            println!(
                "{name:<9} {:>6} {:>22.2e} {:>16.3} {:>18.3} {:>8.1}%",
                o.steps,
                o.worst,
                ms(o.replica),
                ms(o.single),
                100.0 * o.accuracy
            );
        }
        let verdict = if worst <= TOLERANCE {
            "within"
        } else {
            "BEYOND"
        };
        println!(
            "largest difference over all ranks {worst:.2e}: {verdict} the tolerance {TOLERANCE:.0e}"
        );
    }
    dist::destroy_process_group()?;
    Ok(worst <= TOLERANCE)
}

/// The data set, and every rank's sampler (each rank replays the global batches).
struct Data {
    x: Tensor,
    y: Tensor,
    samplers: Vec<DistributedSampler>,
    rank: usize,
}

impl Data {
    /// The batches of `epoch`: this rank's shard and the global batch, per step.
    fn batches(&self, epoch: u64) -> Result<Vec<[Tensor; 4]>> {
        let shards: Vec<Vec<usize>> = self
            .samplers
            .iter()
            .map(|s| {
                s.set_epoch(epoch);
                s.indices()
            })
            .collect::<Result<_>>()?;
        let steps = shards[0].len() / PER_RANK_BATCH;
        let rows = |idx: Vec<usize>| -> Result<(Tensor, Tensor)> {
            let n = idx.len();
            let idx = Tensor::from_vec(idx.into_iter().map(|i| i as i64).collect(), &[n])?;
            Ok((self.x.index_select(0, &idx)?, self.y.index_select(0, &idx)?))
        };
        (0..steps)
            .map(|k| {
                let part =
                    |s: &Vec<usize>| s[k * PER_RANK_BATCH..(k + 1) * PER_RANK_BATCH].to_vec();
                let (xl, yl) = rows(part(&shards[self.rank]))?;
                let (xg, yg) = rows(shards.iter().flat_map(part).collect())?;
                Ok([xl, yl, xg, yg])
            })
            .collect()
    }
}

fn sgd() -> SGDConfig {
    SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.1)
    }
}

/// A replica (rank 0's weights, whatever this rank drew) and a single-process copy of it.
fn models(seed: u64, rank: usize) -> Result<(DistributedDataParallel<Sequential>, Sequential)> {
    let mut g = Generator::new(seed + rank as u64);
    let (replica, single) = twin_models(&[2, HIDDEN, HIDDEN, 2], &mut g)?;
    let ddp = DistributedDataParallel::new(replica)?;
    let _off = smelt::autograd::no_grad();
    for (s, r) in single.parameters().iter().zip(ddp.parameters()) {
        s.copy_(&r)?;
    }
    Ok((ddp, single))
}

fn max_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
    a.iter()
        .zip(b)
        .flat_map(|(p, q)| {
            p.to_f64_vec()
                .into_iter()
                .zip(q.to_f64_vec())
                .map(|(u, v)| (u - v).abs())
        })
        .fold(0.0, f64::max)
}

fn train_eager(data: &Data, rank: usize, xt: &Tensor, yt: &Tensor) -> Result<Outcome> {
    let (ddp, single) = models(100, rank)?;
    let mut opt = SGD::new(ddp.parameters(), sgd())?;
    let mut opt1 = SGD::new(single.parameters(), sgd())?;
    let mut o = Outcome::default();
    for epoch in 0..EPOCHS {
        for [xl, yl, xg, yg] in data.batches(epoch)? {
            let t = Instant::now();
            opt.zero_grad();
            cross_entropy(&ddp.forward(&xl)?, &yl)?.backward()?;
            opt.step()?;
            o.replica += t.elapsed();
            let t = Instant::now();
            opt1.zero_grad();
            cross_entropy(&single.forward(&xg)?, &yg)?.backward()?;
            opt1.step()?;
            o.single += t.elapsed();
            o.worst = o
                .worst
                .max(max_diff(&ddp.parameters(), &single.parameters()));
            o.steps += 1;
        }
    }
    o.accuracy = accuracy(ddp.module(), xt, yt)?;
    Ok(o)
}

fn train_compiled(data: &Data, rank: usize, xt: &Tensor, yt: &Tensor) -> Result<Outcome> {
    let (ddp, single) = models(200, rank)?;
    let first = data.batches(0)?;
    let [xl, yl, xg, yg] = &first[0];
    let opts = CompileOptions::default();
    // the replica's graph averages the gradients over the ranks before the update
    let mut step = CompiledStep::with_config(
        |xs: &[Tensor]| cross_entropy(&ddp.forward(&xs[0])?, &xs[1]),
        &[xl.clone(), yl.clone()],
        ddp.named_parameters(),
        StepConfig::sgd(sgd()).all_reduce_gradients(),
        &opts,
    )?;
    let mut step1 = CompiledStep::with_config(
        |xs: &[Tensor]| cross_entropy(&single.forward(&xs[0])?, &xs[1]),
        &[xg.clone(), yg.clone()],
        single.named_parameters(),
        StepConfig::sgd(sgd()),
        &opts,
    )?;
    let mut o = Outcome::default();
    for epoch in 0..EPOCHS {
        for [xl, yl, xg, yg] in data.batches(epoch)? {
            let t = Instant::now();
            step.step(&[xl, yl])?;
            o.replica += t.elapsed();
            let t = Instant::now();
            step1.step(&[xg, yg])?;
            o.single += t.elapsed();
            o.worst = o
                .worst
                .max(max_diff(&ddp.parameters(), &single.parameters()));
            o.steps += 1;
        }
    }
    drop(step);
    o.accuracy = accuracy(ddp.module(), xt, yt)?;
    Ok(o)
}
