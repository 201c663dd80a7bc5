//! Checkpoints: optimiser state dicts round-trip through a safetensors file, and a training
//! run killed (SIGKILL, at whatever point it is) and resumed from its last checkpoint
//! continues with the losses, bit for bit, of a run that was never stopped.

mod common;

use common::temp_dir;
use smelt::nn::functional::{Reduction, mse_loss};
use smelt::nn::state_dict::{load_safetensors, load_state_dict, save_safetensors, state_dict};
use smelt::nn::{Linear, Module, Sequential, Tanh};
use smelt::optim::{Adam, AdamConfig, AdamW, Optimizer, SGD, SGDConfig};
use smelt::{Generator, Tensor};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

const STEPS: usize = 30;

fn model() -> Sequential {
    smelt::manual_seed(5);
    Sequential::new()
        .add(Linear::new(4, 16, true).unwrap())
        .add(Tanh::new())
        .add(Linear::new(16, 1, true).unwrap())
}

fn optimizer(m: &Sequential) -> Adam {
    let c = AdamConfig {
        amsgrad: true,
        ..AdamConfig::new(0.01)
    };
    Adam::new(m.parameters(), c).unwrap()
}

/// Step `step`'s batch: its own seed, so a resumed run sees the same data.
fn batch(step: usize) -> (Tensor, Tensor) {
    let mut g = Generator::new(100 + step as u64);
    let x = Tensor::randn_with(&[8, 4], None, &mut g).unwrap();
    let y = x.sum_dim(&[1], true).unwrap().sin().unwrap();
    (x, y)
}

/// One step; the loss's bits.
fn train_step(m: &Sequential, opt: &mut Adam, step: usize) -> u32 {
    let (x, y) = batch(step);
    opt.zero_grad();
    let loss = mse_loss(&m.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
    loss.backward().unwrap();
    opt.step().unwrap();
    loss.to_vec::<f32>().unwrap()[0].to_bits()
}

fn prefixed(prefix: &str, v: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    v.into_iter()
        .map(|(k, t)| (format!("{prefix}{k}"), t))
        .collect()
}

fn unprefixed(prefix: &str, v: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    v.iter()
        .filter_map(|(k, t)| Some((k.strip_prefix(prefix)?.to_string(), t.clone())))
        .collect()
}

/// The training loop a child process runs: from the checkpoint in `dir` if there is one,
/// printing each step's loss and writing a checkpoint (model, optimiser, next step) after it.
fn run_from(dir: &Path) {
    let m = model();
    let mut opt = optimizer(&m);
    let ckpt = dir.join("ckpt.safetensors");
    let mut start = 0;
    if ckpt.exists() {
        let all = load_safetensors(&ckpt).unwrap();
        load_state_dict(&m, &unprefixed("model.", &all), true).unwrap();
        opt.load_state_dict(&unprefixed("optim.", &all)).unwrap();
        let next = all.iter().find(|(k, _)| k == "next_step").unwrap();
        start = next.1.item_f64().unwrap() as usize;
    }
    for step in start..STEPS {
        let bits = train_step(&m, &mut opt, step);
        println!("loss {step} {bits}");
        let mut all = prefixed("model.", state_dict(&m));
        all.extend(prefixed("optim.", opt.state_dict()));
        let next = Tensor::from_vec(vec![step as i64 + 1], &[]).unwrap();
        all.push(("next_step".into(), next));
        save_safetensors(&ckpt, &all).unwrap();
        // slow enough for the parent to kill it halfway
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The child's entry point: runs only when the parent test starts it.
#[test]
#[ignore = "started by killed_training_resumes_with_the_same_losses"]
fn child_run() {
    if let Ok(dir) = std::env::var("SMELT_RESUME_DIR") {
        run_from(Path::new(&dir));
    }
}

/// Starts the child on `dir`; it is killed once it has printed the loss of `kill_after`.
fn child(dir: &Path, kill_after: Option<usize>) -> Vec<(usize, u32)> {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_run", "--include-ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env("SMELT_RESUME_DIR", dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let out = BufReader::new(c.stdout.take().unwrap());
    for line in out.lines() {
        let line = line.unwrap();
        let Some(rest) = line.strip_prefix("loss ") else {
            continue;
        };
        let (s, b) = rest.split_once(' ').unwrap();
        let step: usize = s.parse().unwrap();
        seen.push((step, b.parse().unwrap()));
        if kill_after == Some(step) {
            c.kill().unwrap();
            break;
        }
    }
    let status = c.wait().unwrap();
    if kill_after.is_none() {
        assert!(status.success(), "the resumed run failed: {status}");
    }
    seen
}

#[test]
fn killed_training_resumes_with_the_same_losses() {
    let m = model();
    let mut opt = optimizer(&m);
    let want: Vec<u32> = (0..STEPS).map(|s| train_step(&m, &mut opt, s)).collect();
    let dir = temp_dir("resume");
    let first = child(&dir, Some(9));
    assert_eq!(first.last().map(|l| l.0), Some(9));
    let resumed = child(&dir, None);
    let start = resumed.first().expect("the resumed run trains").0;
    // the checkpoint is the last one written before the kill: at least step 9's input
    assert!((9..STEPS).contains(&start), "resumed at step {start}");
    assert_eq!(resumed.last().map(|l| l.0), Some(STEPS - 1));
    for (step, bits) in first.iter().chain(&resumed) {
        assert_eq!(*bits, want[*step], "the loss of step {step}");
    }
}

/// Two optimisers, one restored from the other's state dict after three steps, take the
/// same next three steps.
fn round_trip(make: impl Fn(Vec<Tensor>) -> Box<dyn Optimizer>) {
    let dir = temp_dir("optim-state");
    let p = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25], &[2, 2]).unwrap();
    let q = Tensor::zeros(p.shape(), p.dtype());
    let mut a = make(vec![p.clone()]);
    let grad = |k: usize| Tensor::from_vec(vec![0.1f32 * k as f32, -0.2, 0.3, 0.05], &[2, 2]);
    for k in 1..=3 {
        p.set_grad(Some(grad(k).unwrap()));
        a.step().unwrap();
    }
    let file = dir.join("optim.safetensors");
    save_safetensors(&file, &a.state_dict()).unwrap();
    q.copy_(&p).unwrap();
    let mut b = make(vec![q.clone()]);
    b.load_state_dict(&load_safetensors(&file).unwrap())
        .unwrap();
    for k in 4..=6 {
        p.set_grad(Some(grad(k).unwrap()));
        q.set_grad(Some(grad(k).unwrap()));
        a.step().unwrap();
        b.step().unwrap();
        assert_eq!(p.to_vec::<f32>().unwrap(), q.to_vec::<f32>().unwrap());
    }
}

#[test]
fn optimizer_state_dicts_round_trip_through_a_file() {
    let amsgrad = AdamConfig {
        amsgrad: true,
        ..AdamConfig::new(0.1)
    };
    round_trip(|ps| Box::new(Adam::new(ps, amsgrad).unwrap()));
    round_trip(|ps| Box::new(AdamW::new(ps, AdamConfig::new(0.1)).unwrap()));
    let momentum = SGDConfig {
        momentum: 0.9,
        nesterov: true,
        ..SGDConfig::new(0.1)
    };
    round_trip(|ps| Box::new(SGD::new(ps, momentum).unwrap()));
    // the learning rate travels with the state
    let p = Tensor::zeros(&[3], smelt::DType::F32);
    let mut a = SGD::new(vec![p.clone()], SGDConfig::new(0.5)).unwrap();
    let b = SGD::new(vec![p.clone()], SGDConfig::new(0.25)).unwrap();
    a.load_state_dict(&b.state_dict()).unwrap();
    assert_eq!(a.lr(), 0.25);
}

#[test]
fn bad_optimizer_state_is_named() {
    let p = Tensor::zeros(&[3], smelt::DType::F32);
    let mut opt = Adam::new(vec![p.clone()], AdamConfig::new(0.1)).unwrap();
    let t = |shape: &[usize]| Tensor::zeros(shape, smelt::DType::F32);
    let err = |opt: &mut Adam, state: Vec<(String, Tensor)>| {
        opt.load_state_dict(&state).unwrap_err().to_string()
    };
    let e = err(&mut opt, vec![("state.0.momentum".into(), t(&[3]))]);
    assert!(e.contains("unknown entry 'state.0.momentum'"), "{e}");
    let e = err(&mut opt, vec![("state.4.exp_avg".into(), t(&[3]))]);
    assert!(e.contains("parameter 4, there are 1"), "{e}");
    let e = err(&mut opt, vec![("state.0.exp_avg".into(), t(&[2]))]);
    assert!(e.contains("has shape [2], its parameter [3]"), "{e}");
    let e = err(&mut opt, vec![("state.0.exp_avg".into(), t(&[3]))]);
    assert!(e.contains("without its step"), "{e}");
}
