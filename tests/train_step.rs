//! Compiled training steps (`train::CompiledStep`) against eager training (nn + autograd +
//! `optim::SGD`) on the same data and the same initial parameters.

use smelt::exec::{CompileOptions, KernelBackend};
use smelt::nn::functional::{Reduction, cross_entropy, mse_loss};
use smelt::nn::{Linear, Module, ReLU, Sequential, Tanh};
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::train::CompiledStep;
use smelt::{DType, Generator, Tensor};

/// A deep copy of `t` (own storage), requiring grad when `t` does.
fn copy_of(t: &Tensor) -> Tensor {
    let c = Tensor::from_vec(t.to_f64_vec(), t.shape())
        .unwrap()
        .to_dtype(t.dtype())
        .unwrap();
    c.requires_grad_(t.requires_grad()).unwrap();
    c
}

fn randn(shape: &[usize], dtype: DType, g: &mut Generator) -> Tensor {
    Tensor::randn_with(shape, Some(dtype), g).unwrap()
}

/// `Linear` layers of the given widths (with `act` between them) over the given tensors.
fn mlp(ws: &[(Tensor, Tensor)], tanh: bool) -> Sequential {
    let mut m = Sequential::new();
    for (i, (w, b)) in ws.iter().enumerate() {
        if i > 0 {
            if tanh {
                m = m.add(Tanh::new());
            } else {
                m = m.add(ReLU::new());
            }
        }
        m = m.add(Linear::from_tensors(w.clone(), Some(b.clone())).unwrap());
    }
    m
}

fn layer_params(widths: &[usize], dtype: DType, g: &mut Generator) -> Vec<(Tensor, Tensor)> {
    widths
        .windows(2)
        .map(|io| {
            let scale = 1.0 / (io[0] as f64).sqrt();
            let w = randn(&[io[1], io[0]], dtype, g).mul_scalar(scale).unwrap();
            let b = randn(&[io[1]], dtype, g).mul_scalar(0.1).unwrap();
            w.requires_grad_(true).unwrap();
            b.requires_grad_(true).unwrap();
            (w, b)
        })
        .collect()
}

fn copies(ws: &[(Tensor, Tensor)]) -> Vec<(Tensor, Tensor)> {
    ws.iter().map(|(w, b)| (copy_of(w), copy_of(b))).collect()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Trains `eager` with `optim::SGD` and `compiled` with a `CompiledStep` for `steps` steps
/// on the same batches; checks the losses and parameters agree within `tol` at every step
/// and returns the compiled losses.
fn train_both(
    eager: &Sequential,
    compiled: &Sequential,
    loss: impl Fn(&Tensor, &Tensor) -> smelt::Result<Tensor>,
    batches: &[(Tensor, Tensor)],
    config: SGDConfig,
    steps: usize,
    tol: f64,
) -> Vec<f64> {
    let mut opt = SGD::new(eager.parameters(), config).unwrap();
    let mut step = CompiledStep::new(
        |xs: &[Tensor]| loss(&compiled.forward(&xs[0])?, &xs[1]),
        &[batches[0].0.clone(), batches[0].1.clone()],
        compiled.named_parameters(),
        config,
        &CompileOptions::default(),
    )
    .unwrap();
    let mut losses = Vec::new();
    for i in 0..steps {
        let (x, y) = &batches[i % batches.len()];
        opt.zero_grad();
        let l_eager = loss(&eager.forward(x).unwrap(), y).unwrap();
        l_eager.backward().unwrap();
        opt.step().unwrap();
        let l_comp = step.step(&[x.clone(), y.clone()]).unwrap();
        let (le, lc) = (l_eager.item_f64().unwrap(), l_comp.item_f64().unwrap());
        assert!(
            (le - lc).abs() <= tol * (1.0 + le.abs()),
            "step {i}: eager loss {le}, compiled {lc}"
        );
        for ((name, pe), (_, pc)) in eager
            .named_parameters()
            .iter()
            .zip(&compiled.named_parameters())
        {
            let d = max_abs_diff(pe, pc);
            assert!(d <= tol, "step {i}: {name} differs by {d}");
        }
        losses.push(lc);
    }
    losses
}

fn regression_data(n: usize, g: &mut Generator) -> (Tensor, Tensor) {
    let x = randn(&[n, 1], DType::F32, g);
    let noise = randn(&[n, 1], DType::F32, g).mul_scalar(0.1).unwrap();
    let y = x
        .mul_scalar(2.0)
        .unwrap()
        .add_scalar(1.0)
        .unwrap()
        .add(&noise)
        .unwrap();
    (x, y)
}

fn mse(out: &Tensor, y: &Tensor) -> smelt::Result<Tensor> {
    mse_loss(out, y, Reduction::Mean)
}

#[test]
fn linear_regression_matches_eager_sgd_and_converges() {
    let mut g = Generator::new(3);
    let data = regression_data(100, &mut g);
    let ws = layer_params(&[1, 1], DType::F32, &mut g);
    let (eager, compiled) = (mlp(&ws, false), mlp(&copies(&ws), false));
    let losses = train_both(
        &eager,
        &compiled,
        mse,
        &[data],
        SGDConfig::new(0.1),
        100,
        1e-5,
    );
    assert!(losses[99] < losses[0] / 10.0, "{losses:?}");
    let p = compiled.named_parameters();
    let (w, b) = (p[0].1.to_f64_vec()[0], p[1].1.to_f64_vec()[0]);
    assert!(
        (w - 2.0).abs() < 0.05 && (b - 1.0).abs() < 0.05,
        "w {w}, b {b}"
    );
}

#[test]
fn mlp_with_momentum_matches_eager_sgd() {
    let mut g = Generator::new(5);
    let batches: Vec<(Tensor, Tensor)> = (0..3)
        .map(|_| {
            let x = randn(&[7, 5], DType::F32, &mut g);
            let y = randn(&[7, 3], DType::F32, &mut g);
            (x, y)
        })
        .collect();
    let ws = layer_params(&[5, 16, 3], DType::F32, &mut g);
    let (eager, compiled) = (mlp(&ws, false), mlp(&copies(&ws), false));
    let mut cfg = SGDConfig::new(0.05);
    cfg.momentum = 0.9;
    let losses = train_both(&eager, &compiled, mse, &batches, cfg, 12, 1e-5);
    let first: f64 = losses[..3].iter().sum();
    let last: f64 = losses[9..].iter().sum();
    assert!(last < first, "{losses:?}");
}

#[test]
fn nesterov_weight_decay_and_dampening_match_eager_sgd() {
    let mut g = Generator::new(9);
    let x = randn(&[9, 4], DType::F32, &mut g);
    let y = randn(&[9, 2], DType::F32, &mut g);
    for (nesterov, dampening) in [(true, 0.0), (false, 0.3)] {
        let ws = layer_params(&[4, 6, 2], DType::F32, &mut g);
        let (eager, compiled) = (mlp(&ws, true), mlp(&copies(&ws), true));
        let cfg = SGDConfig {
            lr: 0.1,
            momentum: 0.8,
            dampening,
            weight_decay: 0.01,
            nesterov,
        };
        train_both(
            &eager,
            &compiled,
            mse,
            &[(x.clone(), y.clone())],
            cfg,
            6,
            1e-5,
        );
    }
}

#[test]
fn classifier_in_f64_with_cross_entropy_matches_eager() {
    let mut g = Generator::new(13);
    let x = randn(&[33, 2], DType::F64, &mut g);
    let labels: Vec<i64> = x
        .to_f64_vec()
        .chunks(2)
        .map(|r| i64::from(r[0] * r[1] > 0.0))
        .collect();
    let y = Tensor::from_vec(labels, &[33]).unwrap();
    let ws = layer_params(&[2, 8, 2], DType::F64, &mut g);
    let (eager, compiled) = (mlp(&ws, false), mlp(&copies(&ws), false));
    let ce = |out: &Tensor, y: &Tensor| cross_entropy(out, y);
    let mut cfg = SGDConfig::new(0.2);
    cfg.momentum = 0.5;
    let losses = train_both(&eager, &compiled, ce, &[(x, y)], cfg, 20, 1e-10);
    assert!(losses[19] < losses[0], "{losses:?}");
}

#[test]
fn the_update_fuses_into_the_backward_kernels() {
    let mut g = Generator::new(17);
    let x = randn(&[8, 6], DType::F32, &mut g);
    let y = randn(&[8, 4], DType::F32, &mut g);
    let model = mlp(&layer_params(&[6, 10, 4], DType::F32, &mut g), false);
    let mut cfg = SGDConfig::new(0.01);
    cfg.momentum = 0.9;
    cfg.weight_decay = 1e-4;
    let loss_fn = |xs: &[Tensor]| mse(&model.forward(&xs[0])?, &xs[1]);
    let inputs = [x, y];
    let fused = CompiledStep::new(
        loss_fn,
        &inputs,
        model.named_parameters(),
        cfg,
        &CompileOptions::default(),
    )
    .unwrap();
    let unfused = CompiledStep::new(
        loss_fn,
        &inputs,
        model.named_parameters(),
        cfg,
        &CompileOptions::default().fused(false),
    )
    .unwrap();
    // The gradients alone (no update), compiled the same way.
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let forward = {
        let opts = model
            .named_parameters()
            .iter()
            .fold(smelt::jit::TraceOptions::new(), |o, (n, t)| o.param(n, t));
        let t = smelt::jit::trace_with(|xs| Ok(vec![loss_fn(xs)?]), &inputs, opts).unwrap();
        t.graph().clone()
    };
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let grads = smelt::passes::autodiff::autodiff(&forward, &refs).unwrap();
    let grads_only = smelt::exec::CompiledFn::compile(&grads, &CompileOptions::default()).unwrap();
    let s = fused.compiled().schedule();
    let k_fused = s.kernel_count();
    let k_unfused = unfused.compiled().schedule().kernel_count();
    let k_grads = grads_only.schedule().kernel_count();
    // Weight decay, momentum and the update add 4 pointwise ops per parameter. Fused, a
    // bias update rides in the kernel that reduces its gradient; a weight's gradient comes
    // out of a GEMM, so its update takes one kernel of its own (2 weights here).
    assert!(
        k_fused <= k_grads + 2,
        "step: {k_fused} kernels, gradients alone: {k_grads}"
    );
    assert!(
        k_unfused >= k_fused + 4 * names.len(),
        "unfused {k_unfused}, fused {k_fused}"
    );
    assert_eq!(s.gemm_count(), grads_only.schedule().gemm_count());
    // Each parameter's new value and new momentum buffer come out of one kernel; a bias's
    // kernel also holds the reduction that makes its gradient.
    let n = names.len();
    for (i, name) in names.iter().enumerate() {
        let writer = |out: usize| {
            s.kernels()
                .position(|k| k.stores.iter().any(|st| st.buffer == s.outputs[out].buffer))
        };
        let kp = writer(1 + i).unwrap_or_else(|| panic!("no kernel writes new {name}"));
        assert_eq!(
            writer(1 + n + i),
            Some(kp),
            "{name}: buffer written elsewhere"
        );
        if name.ends_with("bias") {
            let k = s.kernels().nth(kp).unwrap();
            assert!(
                k.reductions() >= 1,
                "{name}: update not fused with its reduction"
            );
        }
    }
}

#[test]
fn kernel_interpreter_backend_gives_the_same_step() {
    let mut g = Generator::new(21);
    let x = randn(&[5, 3], DType::F32, &mut g);
    let y = randn(&[5, 2], DType::F32, &mut g);
    let ws = layer_params(&[3, 4, 2], DType::F32, &mut g);
    let (a, b) = (mlp(&ws, true), mlp(&copies(&ws), true));
    let cfg = SGDConfig::new(0.1);
    let mut sa = CompiledStep::new(
        |xs: &[Tensor]| mse(&a.forward(&xs[0])?, &xs[1]),
        &[x.clone(), y.clone()],
        a.named_parameters(),
        cfg,
        &CompileOptions::default(),
    )
    .unwrap();
    let mut sb = CompiledStep::new(
        |xs: &[Tensor]| mse(&b.forward(&xs[0])?, &xs[1]),
        &[x.clone(), y.clone()],
        b.named_parameters(),
        cfg,
        &CompileOptions::with_backend(KernelBackend::Interp),
    )
    .unwrap();
    for _ in 0..3 {
        sa.step(&[x.clone(), y.clone()]).unwrap();
        sb.step(&[x.clone(), y.clone()]).unwrap();
    }
    for ((n, pa), (_, pb)) in a.named_parameters().iter().zip(&b.named_parameters()) {
        assert!(max_abs_diff(pa, pb) < 1e-5, "{n}");
    }
    assert_eq!(sa.steps_done(), 3);
}

#[test]
fn non_contiguous_batches_and_momentum_buffers() {
    let mut g = Generator::new(23);
    // A transposed input and a strided target.
    let xt = randn(&[3, 6], DType::F32, &mut g);
    let x = xt.t().unwrap();
    let yy = randn(&[12, 1], DType::F32, &mut g);
    let y = yy.slice(0, Some(0), Some(12), 2).unwrap();
    let ws = layer_params(&[3, 1], DType::F32, &mut g);
    let (eager, compiled) = (mlp(&ws, false), mlp(&copies(&ws), false));
    let mut cfg = SGDConfig::new(0.1);
    cfg.momentum = 0.9;
    train_both(
        &eager,
        &compiled,
        mse,
        &[(x.clone(), y.clone())],
        cfg,
        4,
        1e-5,
    );
    let mut opt = SGD::new(eager.parameters(), cfg).unwrap();
    let mut step = CompiledStep::new(
        |xs: &[Tensor]| mse(&compiled.forward(&xs[0])?, &xs[1]),
        &[x.clone(), y.clone()],
        compiled.named_parameters(),
        cfg,
        &CompileOptions::default(),
    )
    .unwrap();
    assert!(step.momentum_buffer(0).is_none());
    opt.zero_grad();
    mse(&eager.forward(&x).unwrap(), &y)
        .unwrap()
        .backward()
        .unwrap();
    opt.step().unwrap();
    step.step(&[x, y]).unwrap();
    for i in 0..2 {
        let (be, bc) = (
            opt.momentum_buffer(i).unwrap(),
            step.momentum_buffer(i).unwrap(),
        );
        assert!(max_abs_diff(be, bc) < 1e-5);
    }
}

#[test]
fn a_parameter_the_loss_ignores_is_left_alone() {
    let mut g = Generator::new(29);
    let x = randn(&[4, 2], DType::F32, &mut g);
    let y = randn(&[4, 1], DType::F32, &mut g);
    let ws = layer_params(&[2, 1], DType::F32, &mut g);
    let unused = randn(&[3], DType::F32, &mut g);
    unused.requires_grad_(true).unwrap();
    let before = unused.to_f64_vec();
    let model = mlp(&ws, false);
    let mut params = model.named_parameters();
    params.push(("unused".into(), unused.clone()));
    let mut cfg = SGDConfig::new(0.1);
    cfg.weight_decay = 0.5;
    cfg.momentum = 0.9;
    let mut step = CompiledStep::new(
        |xs: &[Tensor]| mse(&model.forward(&xs[0])?, &xs[1]),
        &[x.clone(), y.clone()],
        params,
        cfg,
        &CompileOptions::default(),
    )
    .unwrap();
    let w0 = model.named_parameters()[0].1.to_f64_vec();
    step.step(&[x.clone(), y.clone()]).unwrap();
    step.step(&[x, y]).unwrap();
    assert_eq!(unused.to_f64_vec(), before);
    assert!(step.momentum_buffer(2).is_none());
    assert_ne!(model.named_parameters()[0].1.to_f64_vec(), w0);
}

#[test]
fn errors() {
    let mut g = Generator::new(31);
    let x = randn(&[4, 2], DType::F32, &mut g);
    let y = randn(&[4, 1], DType::F32, &mut g);
    let model = mlp(&layer_params(&[2, 1], DType::F32, &mut g), false);
    let new = |f: &dyn Fn(&[Tensor]) -> smelt::Result<Tensor>, cfg: SGDConfig| {
        CompiledStep::new(
            f,
            &[x.clone(), y.clone()],
            model.named_parameters(),
            cfg,
            &CompileOptions::default(),
        )
        .map(|_| ())
    };
    // A loss with more than one element.
    let e = new(
        &|xs| model.forward(&xs[0])?.sub(&xs[1]),
        SGDConfig::new(0.1),
    )
    .err()
    .unwrap();
    assert!(
        e.to_string()
            .contains("grad can be implicitly created only for scalar outputs"),
        "{e}"
    );
    // Settings the eager optimiser refuses.
    let e = new(
        &|xs| mse(&model.forward(&xs[0])?, &xs[1]),
        SGDConfig::new(-1.0),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("Invalid learning rate: -1"), "{e}");
    let mut nest = SGDConfig::new(0.1);
    nest.nesterov = true;
    assert!(new(&|xs| mse(&model.forward(&xs[0])?, &xs[1]), nest).is_err());
    // Calls with the wrong number or shape of inputs.
    let loss = |xs: &[Tensor]| mse(&model.forward(&xs[0])?, &xs[1]);
    let mut step = CompiledStep::new(
        loss,
        &[x.clone(), y.clone()],
        model.named_parameters(),
        SGDConfig::new(0.1),
        &CompileOptions::default(),
    )
    .unwrap();
    let e = step.step(std::slice::from_ref(&x)).err().unwrap();
    assert!(
        e.to_string().contains("takes 2 inputs but 1 was given"),
        "{e}"
    );
    // a batch of another size is traced anew, and its shape rule refuses a mismatch
    let e = step
        .step(&[randn(&[5, 2], DType::F32, &mut g), y.clone()])
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("target size (torch.Size([4, 1])) that is different to the input size (torch.Size([5, 1]))"),
        "{e}"
    );
    assert_eq!(step.specialisations(), 1);
    // An integer parameter.
    let ip = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
    let e = CompiledStep::new(
        |xs: &[Tensor]| mse(&model.forward(&xs[0])?, &xs[1]),
        &[x.clone(), y.clone()],
        vec![("i".into(), ip)],
        SGDConfig::new(0.1),
        &CompileOptions::default(),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("floating point"), "{e}");
    // Nothing was updated by the failed calls.
    assert_eq!(step.steps_done(), 0);
}

#[test]
fn zero_step_batch_size_one_and_odd_sizes() {
    // A batch of one row and a layer of width 7.
    let mut g = Generator::new(37);
    let x = randn(&[1, 7], DType::F32, &mut g);
    let y = randn(&[1, 1], DType::F32, &mut g);
    let ws = layer_params(&[7, 7, 1], DType::F32, &mut g);
    let (eager, compiled) = (mlp(&ws, true), mlp(&copies(&ws), true));
    train_both(
        &eager,
        &compiled,
        mse,
        &[(x, y)],
        SGDConfig::new(0.05),
        3,
        1e-5,
    );
    // No steps: the parameters are untouched.
    let ws2 = layer_params(&[2, 1], DType::F32, &mut g);
    let m = mlp(&ws2, false);
    let before: Vec<Vec<f64>> = m.parameters().iter().map(Tensor::to_f64_vec).collect();
    let x2 = randn(&[3, 2], DType::F32, &mut g);
    let y2 = randn(&[3, 1], DType::F32, &mut g);
    let _step = CompiledStep::new(
        |xs: &[Tensor]| mse(&m.forward(&xs[0])?, &xs[1]),
        &[x2, y2],
        m.named_parameters(),
        SGDConfig::new(0.1),
        &CompileOptions::default(),
    )
    .unwrap();
    let after: Vec<Vec<f64>> = m.parameters().iter().map(Tensor::to_f64_vec).collect();
    assert_eq!(before, after);
}

/// A smaller last batch (a DataLoader without drop_last) compiles a second specialisation and
/// trains as eager SGD does on the same batches; momentum buffers carry across.
#[test]
fn a_smaller_last_batch_gets_its_own_specialisation() {
    let mut g = Generator::new(41);
    let params = layer_params(&[3, 5, 1], DType::F64, &mut g);
    let xs = randn(&[10, 3], DType::F64, &mut g);
    let ys = randn(&[10, 1], DType::F64, &mut g);
    // batches of 4, 4 and 2 rows, twice over
    let batches: Vec<(Tensor, Tensor)> = [(0, 4), (4, 4), (8, 2)]
        .iter()
        .map(|&(s, n)| (xs.narrow(0, s, n).unwrap(), ys.narrow(0, s, n).unwrap()))
        .collect();
    let cfg = SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.05)
    };
    let eager = mlp(&params, true);
    let compiled = mlp(&copies(&params), true);
    let losses = train_both(&eager, &compiled, mse, &batches, cfg, 6, 1e-12);
    assert_eq!(losses.len(), 6);
    // the step keeps one specialisation per batch shape
    let mut step = CompiledStep::new(
        |xs: &[Tensor]| mse(&compiled.forward(&xs[0])?, &xs[1]),
        &[batches[0].0.clone(), batches[0].1.clone()],
        compiled.named_parameters(),
        cfg,
        &CompileOptions::default(),
    )
    .unwrap();
    for (x, y) in &batches {
        step.step(&[x.clone(), y.clone()]).unwrap();
    }
    assert_eq!(step.specialisations(), 2);
}

#[test]
fn an_all_reducing_step_buckets_its_gradients_and_needs_a_process_group() {
    use smelt::ir::op::Op;
    use smelt::jit::{TraceOptions, trace_with};
    use smelt::train::{Phase, StepConfig, build_update_graph};
    let mut g = Generator::new(3);
    let ws = layer_params(&[4, 8, 8, 2], DType::F32, &mut g);
    let m = mlp(&ws, false);
    let x = randn(&[5, 4], DType::F32, &mut g);
    let y = randn(&[5, 2], DType::F32, &mut g);
    let named = m.named_parameters();
    let opts = named
        .iter()
        .fold(TraceOptions::new(), |o, (n, t)| o.param(n, t));
    let traced = {
        let _off = smelt::autograd::no_grad();
        trace_with(
            |xs| Ok(vec![mse(&m.forward(&xs[0])?, &xs[1])?]),
            &[x.clone(), y.clone()],
            opts,
        )
        .unwrap()
    };
    let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
    let count = |g: &smelt::ir::Graph| {
        g.topo_order()
            .into_iter()
            .filter(|&v| matches!(g.node(v).op(), Some(Op::AllReduce { .. })))
            .count()
    };
    let sgd = StepConfig::sgd(SGDConfig::new(0.1));
    let build = |cfg: StepConfig, phase| {
        build_update_graph(traced.graph(), 2, &names, &cfg, phase)
            .unwrap()
            .0
    };
    let update = Phase::Update { first_step: false };
    assert_eq!(count(&build(sgd, update)), 0);
    // gradient bytes in reverse order: 8, 64, 32, 256, 32, 128
    assert_eq!(count(&build(sgd.all_reduce_bucket_bytes(1), update)), 6);
    assert_eq!(count(&build(sgd.all_reduce_bucket_bytes(72), update)), 5);
    assert_eq!(count(&build(sgd.all_reduce_bucket_bytes(400), update)), 2);
    assert_eq!(count(&build(sgd.all_reduce_gradients(), update)), 1);
    // micro-batches that only accumulate do not communicate
    let acc = sgd.accumulate(2).all_reduce_gradients();
    assert_eq!(count(&build(acc, Phase::Accumulate)), 0);
    assert_eq!(count(&build(acc, update)), 1);
    // the collective survives the passes (never folded) and needs a process group to run
    let graph = build(sgd.all_reduce_bucket_bytes(72), update);
    let f = smelt::exec::CompiledFn::compile(&graph, &CompileOptions::default()).unwrap();
    let mut args = vec![x.clone(), y.clone()];
    args.extend(named.iter().map(|(_, t)| t.clone()));
    let e = f.call(&args).unwrap_err().to_string();
    assert!(e.contains("process group has not been initialized"), "{e}");
    let e = CompiledStep::with_config(
        |xs: &[Tensor]| mse(&m.forward(&xs[0])?, &xs[1]),
        &[x, y],
        named,
        sgd.all_reduce_gradients(),
        &CompileOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("process group has not been initialized"), "{e}");
}

/// Conv, batch norm (training mode), ReLU, flatten, linear: the same initial weights for
/// every call (the seed is reset).
fn conv_bn_net() -> Sequential {
    use smelt::nn::{BatchNorm2d, Conv2d, Flatten};
    use smelt::prelude::ConvOptions;
    smelt::manual_seed(7);
    Sequential::new()
        .add(Conv2d::new(2, 4, [3, 3], ConvOptions::default().padding(1), 1, false).unwrap())
        .add(BatchNorm2d::new_2d(4).unwrap())
        .add(ReLU::new())
        .add(Flatten::new(1, -1))
        .add(Linear::new(4 * 5 * 5, 3, true).unwrap())
}

/// Checks that the two models' buffers and parameters agree within 1e-5.
fn same_state(eager: &Sequential, compiled: &Sequential, when: &str) {
    let pairs = |m: &Sequential| [m.named_buffers(), m.named_parameters()].concat();
    for ((name, e), (_, c)) in pairs(eager).iter().zip(&pairs(compiled)) {
        let d = max_abs_diff(e, c);
        assert!(d < 1e-5, "{when}: {name} differs by {d}");
    }
}

fn image_batches(n: usize, g: &mut Generator) -> Vec<(Tensor, Tensor)> {
    (0..n)
        .map(|i| {
            let x = randn(&[6, 2, 5, 5], DType::F32, g)
                .add_scalar(i as f64 * 0.1)
                .unwrap();
            let y = Tensor::from_vec(vec![0i64, 1, 2, 1, 0, 2], &[6]).unwrap();
            (x, y)
        })
        .collect()
}

/// A compiled cross-entropy step of `net` that writes its buffers back.
fn bn_step<'a>(
    net: &'a Sequential,
    example: &(Tensor, Tensor),
    config: smelt::train::StepConfig,
) -> CompiledStep<'a> {
    CompiledStep::with_buffers(
        move |xs: &[Tensor]| cross_entropy(&net.forward(&xs[0])?, &xs[1]),
        &[example.0.clone(), example.1.clone()],
        net.named_parameters(),
        net.named_buffers(),
        config,
        &CompileOptions::default(),
    )
    .unwrap()
}

#[test]
fn batch_norm_running_statistics_move_as_in_eager_training() {
    use smelt::train::StepConfig;
    let batches = image_batches(3, &mut Generator::new(3));
    let eager = conv_bn_net();
    let compiled = conv_bn_net();
    let config = SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.1)
    };
    let ce = |out: &Tensor, y: &Tensor| cross_entropy(out, y);
    let mut step = bn_step(&compiled, &batches[0], StepConfig::sgd(config));
    // tracing ran the forward once eagerly; the buffers are as they were
    let bufs = compiled.named_buffers();
    assert_eq!(bufs[0].1.to_f64_vec(), vec![0.0; 4], "{}", bufs[0].0);
    assert_eq!(bufs[1].1.to_f64_vec(), vec![1.0; 4], "{}", bufs[1].0);
    assert_eq!(bufs[2].1.to_i64_vec(), vec![0], "{}", bufs[2].0);
    assert_eq!(step.buffers().len(), 3);

    let mut opt = SGD::new(eager.parameters(), config).unwrap();
    for (i, (x, y)) in batches.iter().enumerate() {
        opt.zero_grad();
        let le = ce(&eager.forward(x).unwrap(), y).unwrap();
        le.backward().unwrap();
        opt.step().unwrap();
        let lc = step.step(&[x.clone(), y.clone()]).unwrap();
        let (le, lc) = (le.item_f64().unwrap(), lc.item_f64().unwrap());
        assert!((le - lc).abs() < 1e-5, "step {i}: loss {le} vs {lc}");
        same_state(&eager, &compiled, &format!("step {i}"));
    }
    let bufs = compiled.named_buffers();
    assert_eq!(bufs[2].1.to_i64_vec(), vec![3]);
    // the running mean moved away from its zeros: 1 - 0.9^3 of the batch means' weight
    assert!(bufs[0].1.to_f64_vec().iter().any(|m| m.abs() > 1e-3));

    // evaluation mode reads the running statistics the step wrote
    drop(step);
    let mut eager = eager;
    let mut compiled = compiled;
    eager.train(false);
    compiled.train(false);
    let x = &batches[0].0;
    let d = max_abs_diff(&eager.forward(x).unwrap(), &compiled.forward(x).unwrap());
    assert!(d < 1e-4, "evaluation outputs differ by {d}");
}

#[test]
fn micro_batches_each_update_the_running_statistics() {
    use smelt::train::StepConfig;
    let batches = image_batches(4, &mut Generator::new(4));
    let eager = conv_bn_net();
    let compiled = conv_bn_net();
    let ce = |out: &Tensor, y: &Tensor| cross_entropy(out, y);
    let mut step = bn_step(
        &compiled,
        &batches[0],
        StepConfig::sgd(SGDConfig::new(0.05)).accumulate(2),
    );
    // eager: two micro-batches' gradients, halved, then one update
    let mut opt = SGD::new(eager.parameters(), SGDConfig::new(0.05)).unwrap();
    for pair in batches.chunks(2) {
        opt.zero_grad();
        for (x, y) in pair {
            let l = ce(&eager.forward(x).unwrap(), y)
                .unwrap()
                .mul_scalar(0.5)
                .unwrap();
            l.backward().unwrap();
            step.step(&[x.clone(), y.clone()]).unwrap();
        }
        opt.step().unwrap();
    }
    same_state(&eager, &compiled, "after 2 updates");
    assert_eq!(compiled.named_buffers()[2].1.to_i64_vec(), vec![4]);
}

#[test]
fn a_channels_last_example_keeps_the_step_in_nhwc() {
    use smelt::runtime::MemoryFormat;
    use smelt::train::StepConfig;
    // Batches given channels_last: the step plans its convolutions NHWC by itself (as
    // `torch.compile` follows its inputs' strides) and trains exactly as eager NCHW.
    let batches = image_batches(3, &mut Generator::new(5));
    let cl = |t: &Tensor| t.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
    let eager = conv_bn_net();
    let compiled = conv_bn_net();
    let config = SGDConfig::new(0.1);
    let nhwc_example = (cl(&batches[0].0), batches[0].1.clone());
    let mut step = bn_step(&compiled, &nhwc_example, StepConfig::sgd(config));
    let s = step.compiled().schedule();
    let conv_out = s
        .externs()
        .find(|e| e.op.name() == "conv2d")
        .map(|e| s.buffers[e.out].channels_last);
    assert_eq!(conv_out, Some(true), "{s}");
    let mut opt = SGD::new(eager.parameters(), config).unwrap();
    for (i, (x, y)) in batches.iter().enumerate() {
        opt.zero_grad();
        let le = cross_entropy(&eager.forward(x).unwrap(), y).unwrap();
        le.backward().unwrap();
        opt.step().unwrap();
        let lc = step.step(&[cl(x), y.clone()]).unwrap();
        let (le, lc) = (le.item_f64().unwrap(), lc.item_f64().unwrap());
        assert!((le - lc).abs() < 1e-5, "step {i}: loss {le} vs {lc}");
        same_state(&eager, &compiled, &format!("step {i}"));
    }
    // an NCHW batch is converted on entry, with the same result as eager
    let (x, y) = &batches[0];
    opt.zero_grad();
    let le = cross_entropy(&eager.forward(x).unwrap(), y).unwrap();
    le.backward().unwrap();
    opt.step().unwrap();
    let lc = step.step(&[x.clone(), y.clone()]).unwrap();
    assert!((le.item_f64().unwrap() - lc.item_f64().unwrap()).abs() < 1e-5);
    same_state(&eager, &compiled, "an NCHW batch");
}
