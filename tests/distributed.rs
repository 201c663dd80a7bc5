//! Collectives across real processes: each test launches itself under
//! `mpirun -np 2 --oversubscribe` and the two ranks check their results against references
//! every rank can compute (each knows every rank's data). Needs the `mpi` feature and
//! OpenMPI's `mpirun` (`.ci/run` installs both).
#![cfg(feature = "mpi")]

use smelt::distributed::{self as dist, Backend, InitOptions, ReduceOp};
use smelt::{DType, Tensor};
use std::process::Command;
use std::time::Duration;

const WORKER: &str = "SMELT_DIST_WORKER";

/// In the test process: runs test `name` on two ranks and checks that both passed. In a
/// rank: true, so the caller runs the test's body.
fn on_two_ranks(name: &str) -> bool {
    if std::env::var(WORKER).is_ok_and(|w| w == name) {
        return true;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("mpirun")
        .args(["-np", "2", "--oversubscribe", "--allow-run-as-root"])
        .args(["--mca", "btl", "self,vader"])
        .args(["-x", &format!("{WORKER}={name}")])
        .arg(&exe)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .output()
        .expect("mpirun (OpenMPI's openmpi-bin) must be installed for these tests");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} failed on two ranks:\n{text}");
    // both ranks ran the body and passed it (not zero tests filtered out)
    assert_eq!(text.matches("1 passed").count(), 2, "{text}");
    false
}

/// Rank `r`'s element `i` for `dtype`: small integers, so every reduction is exact.
fn value(dtype: DType, r: usize, i: usize) -> f64 {
    let v = ((i * 3 + r * 5) % 7) as f64;
    match dtype {
        DType::Bool => (i + r).is_multiple_of(3) as u8 as f64,
        DType::U8 => v,
        _ => v - 3.0,
    }
}

fn data(dtype: DType, r: usize, n: usize) -> Tensor {
    let v: Vec<f64> = (0..n).map(|i| value(dtype, r, i)).collect();
    Tensor::from_vec(v, &[n]).unwrap().to_dtype(dtype).unwrap()
}

fn reduce(op: ReduceOp, dtype: DType, vals: &[f64]) -> f64 {
    let b = dtype == DType::Bool;
    match op {
        ReduceOp::Sum if b => vals.iter().any(|&v| v != 0.0) as u8 as f64,
        ReduceOp::Product if b => vals.iter().all(|&v| v != 0.0) as u8 as f64,
        ReduceOp::Sum => vals.iter().sum(),
        ReduceOp::Avg => vals.iter().sum::<f64>() / vals.len() as f64,
        ReduceOp::Product => vals.iter().product(),
        ReduceOp::Max => vals.iter().cloned().fold(f64::MIN, f64::max),
        ReduceOp::Min => vals.iter().cloned().fold(f64::MAX, f64::min),
    }
}

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Avg,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Product,
];

#[test]
fn collectives_agree_with_references_for_every_dtype_and_op() {
    if !on_two_ranks("collectives_agree_with_references_for_every_dtype_and_op") {
        return;
    }
    dist::init_process_group(Backend::Mpi).unwrap();
    let (rank, world) = (dist::rank().unwrap(), dist::world_size().unwrap());
    assert_eq!(world, 2);
    for dtype in DType::ALL {
        for n in [0usize, 1, 7, 1000] {
            for op in OPS {
                let t = data(dtype, rank, n);
                let r = dist::all_reduce(&t, op);
                if op == ReduceOp::Avg && !dtype.is_float() {
                    assert!(r.is_err(), "{dtype} avg");
                    continue;
                }
                r.unwrap();
                let want: Vec<f64> = (0..n)
                    .map(|i| {
                        let vals: Vec<f64> = (0..world).map(|r| value(dtype, r, i)).collect();
                        reduce(op, dtype, &vals)
                    })
                    .collect();
                assert_eq!(t.to_f64_vec(), want, "all_reduce {op:?} {dtype} n={n}");
                assert_eq!(t.dtype(), dtype);
            }
            // broadcast from rank 1
            let t = data(dtype, rank, n);
            dist::broadcast(&t, 1).unwrap();
            assert_eq!(
                t.to_f64_vec(),
                data(dtype, 1, n).to_f64_vec(),
                "broadcast {dtype}"
            );
            // all_gather: every rank's data in rank order
            let parts = dist::all_gather(&data(dtype, rank, n)).unwrap();
            for (r, p) in parts.iter().enumerate() {
                assert_eq!(
                    p.to_f64_vec(),
                    data(dtype, r, n).to_f64_vec(),
                    "all_gather {dtype}"
                );
            }
            // reduce_scatter: rank r keeps the r-th half of the sum of [2n] inputs
            if dtype != DType::Bool {
                let input = data(dtype, rank, 2 * n);
                let out = Tensor::zeros(&[n], dtype);
                dist::reduce_scatter(&out, &input, ReduceOp::Max).unwrap();
                let want: Vec<f64> = (0..n)
                    .map(|i| {
                        let j = rank * n + i;
                        (0..world)
                            .map(|r| value(dtype, r, j))
                            .fold(f64::MIN, f64::max)
                    })
                    .collect();
                assert_eq!(out.to_f64_vec(), want, "reduce_scatter {dtype}");
            }
        }
    }
    // views: a transposed all-reduce writes through the view into its base
    let base = Tensor::from_vec(vec![1.0f32 + rank as f32; 6], &[2, 3]).unwrap();
    let t = base.t().unwrap();
    dist::all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), vec![3.0; 6]);
    // async works complete in order, and hold their results after wait()
    let xs: Vec<Tensor> = (0..4)
        .map(|k| Tensor::from_vec(vec![(k + rank) as f64; 5], &[5]).unwrap())
        .collect();
    let works: Vec<_> = xs
        .iter()
        .map(|x| dist::all_reduce_async(x, ReduceOp::Sum).unwrap())
        .collect();
    for w in works {
        w.wait().unwrap();
    }
    for (k, x) in xs.iter().enumerate() {
        assert_eq!(x.to_vec::<f64>().unwrap(), vec![(2 * k + 1) as f64; 5]);
    }
    // bad arguments are errors on the caller, before anything moves
    let small = Tensor::zeros(&[3], DType::F32);
    assert!(dist::broadcast(&small, 2).is_err());
    assert!(dist::reduce_scatter(&small, &Tensor::zeros(&[5], DType::F32), ReduceOp::Sum).is_err());
    // GradScaler: an inf on rank 1 alone makes both ranks skip the step and back off
    let p = Tensor::ones(&[3], DType::F32);
    p.requires_grad_(true).unwrap();
    let g = if rank == 1 { f32::INFINITY } else { 1.0 };
    p.set_grad(Some(Tensor::from_vec(vec![g, 1.0, 1.0], &[3]).unwrap()));
    let mut opt =
        smelt::optim::SGD::new(vec![p.clone()], smelt::optim::SGDConfig::new(0.1)).unwrap();
    let mut scaler = smelt::optim::GradScaler::new();
    let before = scaler.get_scale();
    assert!(!scaler.step(&mut opt).unwrap(), "rank {rank} stepped");
    scaler.update().unwrap();
    assert_eq!(scaler.get_scale(), before * 0.5);
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0; 3]);
    dist::barrier().unwrap();
    dist::destroy_process_group().unwrap();
}

#[test]
fn mismatched_shapes_and_missing_ranks_are_errors_on_every_rank() {
    if !on_two_ranks("mismatched_shapes_and_missing_ranks_are_errors_on_every_rank") {
        return;
    }
    let opts = InitOptions::default().timeout(Duration::from_millis(1500));
    dist::init_process_group_with(Backend::Mpi, &opts).unwrap();
    let rank = dist::rank().unwrap();
    // a shape mismatch: both ranks get the same error naming both shapes
    let t = Tensor::zeros(&[4 + rank], DType::F32);
    let e = dist::all_reduce(&t, ReduceOp::Sum).unwrap_err().to_string();
    assert_eq!(
        e,
        "all_reduce #0: the ranks disagree: rank 0 called all_reduce(sum) of f32[4]; rank 1 called all_reduce(sum) of f32[5]"
    );
    // a different collective
    let t = Tensor::ones(&[2], DType::F32);
    let e = if rank == 0 {
        dist::all_reduce(&t, ReduceOp::Sum)
    } else {
        dist::broadcast(&t, 0)
    }
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("rank 1 called broadcast(src=0) of f32[2]"),
        "{e}"
    );
    // the group goes on after an agreed error
    dist::all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![2.0, 2.0]);
    // rank 1 stops calling collectives: rank 0 is told, within the timeout, who is missing
    if rank == 0 {
        let start = std::time::Instant::now();
        let e = dist::all_reduce(&t, ReduceOp::Sum).unwrap_err().to_string();
        assert!(e.contains("rank 1 did not join within the timeout"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(20));
        // and the group is broken from then on
        let e = dist::barrier().unwrap_err().to_string();
        assert!(e.contains("broken"), "{e}");
    } else {
        std::thread::sleep(Duration::from_millis(2500));
    }
    dist::destroy_process_group().unwrap();
}

fn mlp() -> smelt::nn::Sequential {
    use smelt::nn::{GELU, Linear, Sequential};
    Sequential::new()
        .add(Linear::new(4, 16, true).unwrap())
        .add(GELU::default())
        .add(Linear::new(16, 3, true).unwrap())
}

fn max_param_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            x.to_f64_vec()
                .iter()
                .zip(y.to_f64_vec())
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f64::max)
        })
        .fold(0.0, f64::max)
}

#[test]
fn ddp_on_two_ranks_matches_one_process_with_twice_the_batch() {
    use smelt::Generator;
    use smelt::nn::functional::mse_loss;
    use smelt::nn::{DistributedDataParallel, Module, Reduction};
    use smelt::optim::{Optimizer, SGD, SGDConfig};
    if !on_two_ranks("ddp_on_two_ranks_matches_one_process_with_twice_the_batch") {
        return;
    }
    dist::init_process_group(Backend::Mpi).unwrap();
    let rank = dist::rank().unwrap();
    // different initial weights per rank: DDP must start every replica from rank 0's
    smelt::manual_seed(rank as u64 + 1);
    let group = dist::default_group().unwrap();
    // a small bucket cap: several buckets, reduced while the backward pass goes on
    let ddp = DistributedDataParallel::with_group(mlp(), group, 0.0002).unwrap();
    assert!(ddp.num_buckets() > 1, "{}", ddp.num_buckets());
    let single = mlp();
    let off = smelt::autograd::no_grad();
    for (s, d) in single.parameters().iter().zip(ddp.parameters()) {
        s.copy_(&d).unwrap();
    }
    drop(off);
    let cfg = SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.1)
    };
    let mut opt = SGD::new(ddp.parameters(), cfg).unwrap();
    let mut opt1 = SGD::new(single.parameters(), cfg).unwrap();
    let b = 8;
    let mut worst: f64 = 0.0;
    for step in 0..20u64 {
        let mut g = Generator::new(1000 + step);
        let x = Tensor::randn_with(&[2 * b, 4], None, &mut g).unwrap();
        let y = Tensor::randn_with(&[2 * b, 3], None, &mut g).unwrap();
        // every third step accumulates two micro-batches, the first under no_sync
        let micro = if step % 3 == 2 { 2 } else { 1 };
        let part = b / micro;
        ddp.zero_grad();
        for m in 0..micro {
            let lo = (rank * b + m * part) as i64;
            let xs = x.narrow(0, lo, part as i64).unwrap();
            let ys = y.narrow(0, lo, part as i64).unwrap();
            let loss = mse_loss(&ddp.forward(&xs).unwrap(), &ys, Reduction::Mean).unwrap();
            let loss = &loss * (1.0 / micro as f64);
            if m + 1 < micro {
                let _quiet = ddp.no_sync();
                loss.backward().unwrap();
            } else {
                loss.backward().unwrap();
            }
        }
        opt.step().unwrap();
        single.zero_grad();
        let loss1 = mse_loss(&single.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
        loss1.backward().unwrap();
        opt1.step().unwrap();
        let d = max_param_diff(&ddp.parameters(), &single.parameters());
        worst = worst.max(d);
        assert!(d < 1e-5, "step {step}: parameters differ by {d}");
    }
    println!("rank {rank}: largest parameter difference over 20 steps {worst:.2e}");
    // the replicas agree exactly with each other
    for p in ddp.parameters() {
        let parts = dist::all_gather(&p).unwrap();
        assert_eq!(parts[0].to_f64_vec(), parts[1].to_f64_vec());
    }
    drop(opt);
    drop(ddp);
    dist::destroy_process_group().unwrap();
}

#[test]
fn compiled_steps_on_two_ranks_match_one_process_with_twice_the_batch() {
    use smelt::Generator;
    use smelt::exec::CompileOptions;
    use smelt::ir::op::Op;
    use smelt::nn::functional::mse_loss;
    use smelt::nn::{Module, Reduction};
    use smelt::optim::SGDConfig;
    use smelt::train::{CompiledStep, StepConfig};
    if !on_two_ranks("compiled_steps_on_two_ranks_match_one_process_with_twice_the_batch") {
        return;
    }
    dist::init_process_group(Backend::Mpi).unwrap();
    let rank = dist::rank().unwrap();
    smelt::manual_seed(rank as u64 + 1);
    let model = mlp();
    // the replicas start from rank 0's weights, as DistributedDataParallel makes them
    for p in model.parameters() {
        dist::broadcast(&p, 0).unwrap();
    }
    let single = mlp();
    let off = smelt::autograd::no_grad();
    for (s, d) in single.parameters().iter().zip(model.parameters()) {
        s.copy_(&d).unwrap();
    }
    drop(off);
    let b = 8;
    let batch = |step: u64| {
        let mut g = Generator::new(1000 + step);
        let x = Tensor::randn_with(&[2 * b, 4], None, &mut g).unwrap();
        let y = Tensor::randn_with(&[2 * b, 3], None, &mut g).unwrap();
        (x, y)
    };
    let shard = |t: &Tensor| t.narrow(0, (rank * b) as i64, b as i64).unwrap();
    let loss = |m: &smelt::nn::Sequential, xs: &[Tensor]| {
        mse_loss(&m.forward(&xs[0])?, &xs[1], Reduction::Mean)
    };
    let cfg = StepConfig::sgd(SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.1)
    })
    .clip_grad_norm(0.5);
    let opts = CompileOptions::default();
    let (x0, y0) = batch(0);
    // a small bucket cap: several all-reduce steps in the graph
    let mut step = CompiledStep::with_config(
        |xs: &[Tensor]| loss(&model, xs),
        &[shard(&x0), shard(&y0)],
        model.named_parameters(),
        cfg.all_reduce_bucket_bytes(256),
        &opts,
    )
    .unwrap();
    let g = step.graph();
    let reduces = g
        .topo_order()
        .into_iter()
        .filter(|&v| matches!(g.node(v).op(), Some(Op::AllReduce { .. })))
        .count();
    assert!(reduces > 1, "{reduces} all_reduce steps");
    let mut step1 = CompiledStep::with_config(
        |xs: &[Tensor]| loss(&single, xs),
        &[x0.clone(), y0.clone()],
        single.named_parameters(),
        cfg,
        &opts,
    )
    .unwrap();
    let mut worst: f64 = 0.0;
    for s in 0..20u64 {
        let (x, y) = batch(s);
        step.step(&[shard(&x), shard(&y)]).unwrap();
        step1.step(&[x, y]).unwrap();
        let d = max_param_diff(&model.parameters(), &single.parameters());
        worst = worst.max(d);
        assert!(d < 1e-5, "step {s}: parameters differ by {d}");
        // clipping saw the global norm of the averaged gradients
        let (n, n1) = (
            step.last_grad_norm().unwrap(),
            step1.last_grad_norm().unwrap(),
        );
        assert!(
            (n - n1).abs() <= 1e-5 * n1.max(1.0),
            "step {s}: norms {n} and {n1}"
        );
    }
    println!("rank {rank}: compiled, largest parameter difference over 20 steps {worst:.2e}");
    drop(step);
    dist::destroy_process_group().unwrap();
}
