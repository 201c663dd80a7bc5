//! Compiled training steps with the optimisers people use (`StepConfig`): Adam, AdamW and
//! AMSGrad, clipping by global norm, a warmup-cosine learning-rate schedule given as an
//! input, and gradient accumulation — each against the eager optimiser (`optim`, autograd,
//! `clip_grad_norm_`, `set_lr`) on the same data from the same initial weights.

use smelt::autograd::clip_grad_norm_;
use smelt::exec::CompileOptions;
use smelt::nn::{Linear, Module, Sequential, Tanh};
use smelt::optim::{Adam, AdamConfig, AdamW, Optimizer, SGD, SGDConfig};
use smelt::train::{CompiledStep, LrSchedule, StepConfig};
use smelt::{DType, Generator, Tensor};

/// Two twin 4 → 16 → 3 tanh MLPs (same f32 weights, separate storage) and 6 batches of 8.
fn setup(seed: u64) -> (Sequential, Sequential, Vec<(Tensor, Tensor)>) {
    let mut g = Generator::new(seed);
    let mut a = Sequential::new();
    let mut b = Sequential::new();
    for (i, (fan_in, fan_out)) in [(4usize, 16usize), (16, 3)].into_iter().enumerate() {
        if i > 0 {
            a = a.add(Tanh::new());
            b = b.add(Tanh::new());
        }
        let s = 1.0 / (fan_in as f64).sqrt();
        let w = Tensor::randn_with(&[fan_out, fan_in], Some(DType::F32), &mut g)
            .unwrap()
            .mul_scalar(s)
            .unwrap();
        let bias = Tensor::randn_with(&[fan_out], Some(DType::F32), &mut g)
            .unwrap()
            .mul_scalar(0.1)
            .unwrap();
        let twin = |t: &Tensor| {
            let c = Tensor::from_vec(t.to_vec::<f32>().unwrap(), t.shape()).unwrap();
            c.requires_grad_(true).unwrap();
            c
        };
        a = a.add(Linear::from_tensors(twin(&w), Some(twin(&bias))).unwrap());
        b = b.add(Linear::from_tensors(twin(&w), Some(twin(&bias))).unwrap());
    }
    let batches = (0..6)
        .map(|_| {
            let x = Tensor::randn_with(&[8, 4], Some(DType::F32), &mut g).unwrap();
            let y = Tensor::randn_with(&[8, 3], Some(DType::F32), &mut g).unwrap();
            (x, y)
        })
        .collect();
    (a, b, batches)
}

fn loss(m: &Sequential, x: &Tensor, y: &Tensor) -> smelt::Result<Tensor> {
    m.forward(x)?.sub(y)?.square()?.mean()
}

fn max_param_diff(a: &Sequential, b: &Sequential) -> f64 {
    a.parameters()
        .iter()
        .zip(b.parameters())
        .flat_map(|(p, q)| {
            p.to_f64_vec()
                .into_iter()
                .zip(q.to_f64_vec())
                .map(|(x, y)| (x - y).abs())
        })
        .fold(0.0, f64::max)
}

fn compiled_step<'a>(
    m: &'a Sequential,
    batch: &(Tensor, Tensor),
    cfg: StepConfig,
) -> CompiledStep<'a> {
    CompiledStep::with_config(
        move |xs: &[Tensor]| loss(m, &xs[0], &xs[1]),
        &[batch.0.clone(), batch.1.clone()],
        m.named_parameters(),
        cfg,
        &CompileOptions::default(),
    )
    .unwrap()
}

/// Steps both for every batch, `eager_step` doing the eager side; asserts the losses and
/// parameters agree within `tol` after each step.
fn run_both<'a>(
    eager: &Sequential,
    compiled: &Sequential,
    batches: &[(Tensor, Tensor)],
    mut step: CompiledStep<'a>,
    mut eager_step: impl FnMut(usize, &Tensor),
    tol: f64,
) -> CompiledStep<'a> {
    for (i, (x, y)) in batches.iter().enumerate() {
        let le = loss(eager, x, y).unwrap();
        eager_step(i, &le);
        let lc = step.step(&[x.clone(), y.clone()]).unwrap();
        let (le, lc) = (le.item_f64().unwrap(), lc.item_f64().unwrap());
        assert!(
            (le - lc).abs() <= tol,
            "step {i}: loss {le} eager, {lc} compiled"
        );
        let d = max_param_diff(eager, compiled);
        assert!(d <= tol, "step {i}: parameters differ by {d}");
    }
    step
}

#[test]
fn adam_adamw_and_amsgrad_match_the_eager_optimisers() {
    for (name, amsgrad, decoupled, wd) in [
        ("adam", false, false, None),
        ("adam_l2", false, false, Some(0.05)),
        ("adamw_default_decay", false, true, None),
        ("adamw_amsgrad", true, true, Some(0.1)),
    ] {
        let (e, c, batches) = setup(1);
        let cfg = AdamConfig {
            lr: 0.01,
            amsgrad,
            weight_decay: wd,
            ..AdamConfig::default()
        };
        let mut opt: Box<dyn Optimizer> = if decoupled {
            Box::new(AdamW::new(e.parameters(), cfg).unwrap())
        } else {
            Box::new(Adam::new(e.parameters(), cfg).unwrap())
        };
        let sc = if decoupled {
            StepConfig::adamw(cfg)
        } else {
            StepConfig::adam(cfg)
        };
        let step = compiled_step(&c, &batches[0], sc);
        let step = run_both(
            &e,
            &c,
            &batches,
            step,
            |_, l| {
                opt.zero_grad();
                l.backward().unwrap();
                opt.step().unwrap();
            },
            1e-6,
        );
        assert_eq!(step.steps_done(), 6, "{name}");
        assert!(step.optimizer_state(0, "exp_avg").is_some(), "{name}");
        assert_eq!(
            step.optimizer_state(0, "max_exp_avg_sq").is_some(),
            amsgrad,
            "{name}"
        );
        // the bias corrections are inputs: one compiled function served every step
        assert_eq!(step.specialisations(), 1);
        assert!(step.graph().value("step_size").is_some());
    }
}

#[test]
fn clipping_by_global_norm_matches_clip_grad_norm() {
    let (e, c, batches) = setup(2);
    let cfg = SGDConfig::new(0.5);
    let mut opt = SGD::new(e.parameters(), cfg).unwrap();
    let max_norm = 0.05;
    let step = compiled_step(
        &c,
        &batches[0],
        StepConfig::sgd(cfg).clip_grad_norm(max_norm),
    );
    let mut norms = Vec::new();
    let step = run_both(
        &e,
        &c,
        &batches[..1],
        step,
        |_, l| {
            opt.zero_grad();
            l.backward().unwrap();
            norms.push(clip_grad_norm_(&e.parameters(), max_norm, 2.0).unwrap());
            opt.step().unwrap();
        },
        1e-6,
    );
    let got = step.last_grad_norm().unwrap();
    // the f32 gradients themselves differ in their last bits (GEMM summation order)
    assert!(
        (got - norms[0]).abs() <= 1e-6 * norms[0],
        "{got} vs {}",
        norms[0]
    );
    // the norm is above the bound, so the clip did act
    assert!(norms[0] > max_norm, "{}", norms[0]);
}

#[test]
fn warmup_cosine_rates_are_the_documented_ones() {
    let s = LrSchedule::WarmupCosine {
        warmup_steps: 4,
        total_steps: 14,
        min_lr: 0.1,
    };
    let base = 1.0;
    assert_eq!(s.lr(base, 0), 0.25);
    assert_eq!(s.lr(base, 3), 1.0);
    assert_eq!(s.lr(base, 4), 1.0);
    // half way through the cosine: the mean of base and min
    assert!((s.lr(base, 9) - 0.55).abs() < 1e-12);
    assert!((s.lr(base, 14) - 0.1).abs() < 1e-12);
    assert_eq!(s.lr(base, 100), 0.1);
    assert_eq!(LrSchedule::Constant.lr(0.3, 7), 0.3);
}

#[test]
fn a_schedule_is_an_input_and_matches_set_lr_on_the_eager_optimiser() {
    let schedule = LrSchedule::WarmupCosine {
        warmup_steps: 2,
        total_steps: 6,
        min_lr: 0.01,
    };
    for momentum in [0.0, 0.9] {
        let (e, c, batches) = setup(3);
        let mut cfg = SGDConfig::new(0.2);
        cfg.momentum = momentum;
        let mut opt = SGD::new(e.parameters(), cfg).unwrap();
        let step = compiled_step(&c, &batches[0], StepConfig::sgd(cfg).schedule(schedule));
        assert!(step.graph().value("lr").is_some());
        assert_eq!(step.lr(), 0.1);
        let step = run_both(
            &e,
            &c,
            &batches,
            step,
            |i, l| {
                opt.set_lr(schedule.lr(cfg.lr, i as u64));
                opt.zero_grad();
                l.backward().unwrap();
                opt.step().unwrap();
            },
            1e-6,
        );
        assert_eq!(step.specialisations(), 1);
        assert!((step.lr() - schedule.lr(0.2, 6)).abs() < 1e-15);
    }
}

#[test]
fn accumulation_adds_micro_batch_gradients_before_one_update() {
    let (e, c, batches) = setup(4);
    let cfg = AdamConfig::new(0.02);
    let mut opt = Adam::new(e.parameters(), cfg).unwrap();
    let n = 3;
    let mut step = compiled_step(&c, &batches[0], StepConfig::adam(cfg).accumulate(n));
    for (i, (x, y)) in batches.iter().enumerate() {
        // eager: (loss / n).backward() per micro-batch, one step per n
        let l = loss(&e, x, y).unwrap();
        l.div_scalar(n as f64).unwrap().backward().unwrap();
        if (i + 1) % n == 0 {
            opt.step().unwrap();
            opt.zero_grad();
        }
        let before = c.parameters()[0].to_f64_vec();
        let lc = step.step(&[x.clone(), y.clone()]).unwrap();
        assert!((lc.item_f64().unwrap() - l.item_f64().unwrap()).abs() < 1e-6);
        let moved = c.parameters()[0].to_f64_vec() != before;
        assert_eq!(moved, (i + 1) % n == 0, "micro-batch {i}");
        let d = max_param_diff(&e, &c);
        assert!(d <= 1e-6, "micro-batch {i}: parameters differ by {d}");
    }
    assert_eq!(step.steps_done(), 2);
}

#[test]
fn accumulated_micro_batches_update_as_the_whole_batch_does() {
    // the mean loss over 4 micro-batches of 8 is the mean over the batch of 32
    let (_, c, batches) = setup(5);
    let (_, whole, _) = setup(5);
    let cfg = SGDConfig::new(0.3);
    let mut micro = compiled_step(&c, &batches[0], StepConfig::sgd(cfg).accumulate(4));
    for (x, y) in &batches[..4] {
        micro.step(&[x.clone(), y.clone()]).unwrap();
    }
    let xs: Vec<&Tensor> = batches[..4].iter().map(|b| &b.0).collect();
    let ys: Vec<&Tensor> = batches[..4].iter().map(|b| &b.1).collect();
    let big = (Tensor::cat(&xs, 0).unwrap(), Tensor::cat(&ys, 0).unwrap());
    let mut once = compiled_step(&whole, &big, StepConfig::sgd(cfg));
    once.step(&[big.0.clone(), big.1.clone()]).unwrap();
    let d = max_param_diff(&c, &whole);
    assert!(d <= 1e-6, "differ by {d}");
    assert!(c.parameters()[0].to_f64_vec() != setup(5).0.parameters()[0].to_f64_vec());
}

#[test]
fn bad_step_settings_are_errors() {
    let (_, c, batches) = setup(6);
    let mk = |cfg: StepConfig| {
        CompiledStep::with_config(
            |xs: &[Tensor]| loss(&c, &xs[0], &xs[1]),
            &[batches[0].0.clone(), batches[0].1.clone()],
            c.named_parameters(),
            cfg,
            &CompileOptions::default(),
        )
        .err()
        .map(|e| e.to_string())
    };
    let sgd = StepConfig::sgd(SGDConfig::new(0.1));
    assert!(
        mk(sgd.accumulate(0))
            .unwrap()
            .contains("accumulation_steps")
    );
    assert!(mk(sgd.clip_grad_norm(-1.0)).unwrap().contains("max_norm"));
    let bad_beta = AdamConfig {
        betas: (1.5, 0.9),
        ..AdamConfig::default()
    };
    let e = mk(StepConfig::adam(bad_beta)).unwrap();
    assert!(e.contains("Invalid beta parameter at index 0"), "{e}");
    assert!(mk(sgd).is_none());
}

#[test]
fn large_parameters_and_their_adam_state_are_updated_in_place() {
    let mut g = Generator::new(7);
    let w = Tensor::randn_with(&[256, 128], Some(DType::F32), &mut g).unwrap();
    w.requires_grad_(true).unwrap();
    let x = Tensor::randn_with(&[16, 128], Some(DType::F32), &mut g).unwrap();
    let y = Tensor::randn_with(&[16, 256], Some(DType::F32), &mut g).unwrap();
    let lin = Linear::from_tensors(w.clone(), None).unwrap();
    let mut step = CompiledStep::with_config(
        |xs: &[Tensor]| lin.forward(&xs[0])?.sub(&xs[1])?.square()?.mean(),
        &[x.clone(), y.clone()],
        lin.named_parameters(),
        StepConfig::adamw(AdamConfig::new(1e-3)),
        &CompileOptions::default(),
    )
    .unwrap();
    step.step(&[x.clone(), y.clone()]).unwrap();
    // handles on the state's storage: they see the next steps' values only if the
    // compiled update writes into that storage rather than into new tensors
    let m = step.optimizer_state(0, "exp_avg").unwrap().clone();
    let v = step.optimizer_state(0, "exp_avg_sq").unwrap().clone();
    let (m1, v1, w1) = (m.to_f64_vec(), v.to_f64_vec(), w.to_f64_vec());
    for _ in 0..3 {
        step.step(&[x.clone(), y.clone()]).unwrap();
    }
    assert_ne!(w.to_f64_vec(), w1, "the parameter moved");
    assert_ne!(m.to_f64_vec(), m1, "exp_avg was not updated in place");
    assert_ne!(v.to_f64_vec(), v1, "exp_avg_sq was not updated in place");
    assert!(m.shares_storage(step.optimizer_state(0, "exp_avg").unwrap()));
    assert!(v.shares_storage(step.optimizer_state(0, "exp_avg_sq").unwrap()));
}
