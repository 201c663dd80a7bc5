//! Eager autograd: recording, backward, accumulation, grad mode, the error cases PyTorch
//! reports, custom functions, checkpointing and gradient clipping.

use smelt::autograd::{
    Context, Function, Segment, apply_function, checkpoint, checkpoint_sequential, clip_grad_norm_,
    clip_grad_value_, no_grad, saved_tensor_bytes, zero_grad,
};
use smelt::{DType, Result, Tensor};

fn leaf(v: &[f32], shape: &[usize]) -> Tensor {
    let t = Tensor::from_slice(v, shape).unwrap();
    t.requires_grad_(true).unwrap();
    t
}

fn grad(t: &Tensor) -> Vec<f64> {
    t.grad().expect("a gradient").to_f64_vec()
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

#[test]
fn seeds_square_plus_linear() {
    // d(x² + 3x)/dx = 2x + 3 = 7 at x = 2.
    let x = leaf(&[2.0], &[]);
    let y = x
        .pow_scalar(2)
        .unwrap()
        .add(&x.mul_scalar(3).unwrap())
        .unwrap();
    assert!(y.requires_grad() && !y.is_leaf() && x.is_leaf());
    assert_eq!(y.grad_fn_name().as_deref(), Some("AddBackward0"));
    y.backward().unwrap();
    assert_eq!(grad(&x), vec![7.0]);
}

#[test]
fn linear_regression_step_matches_hand_gradient() {
    // loss = mean((x·w + b - y)²): dw = 2/n·xᵀ(r), db = 2/n·Σr.
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
    let y = Tensor::from_slice(&[1.0f32, 0.0, 2.0], &[3, 1]).unwrap();
    let w = leaf(&[0.5, -0.25], &[2, 1]);
    let b = leaf(&[0.1], &[1]);
    let r = x.matmul(&w).unwrap().add(&b).unwrap().sub(&y).unwrap();
    let loss = r.mul(&r).unwrap().mean().unwrap();
    loss.backward().unwrap();
    let rv: Vec<f64> = r.detach().to_f64_vec();
    let xv = x.to_f64_vec();
    let dw: Vec<f64> = (0..2)
        .map(|j| (0..3).map(|i| 2.0 / 3.0 * xv[i * 2 + j] * rv[i]).sum())
        .collect();
    let db: f64 = rv.iter().map(|v| 2.0 / 3.0 * v).sum();
    close(&grad(&w), &dw);
    close(&grad(&b), &[db]);
}

#[test]
fn gradients_accumulate_until_cleared() {
    let w = leaf(&[1.0, 2.0], &[2]);
    for _ in 0..3 {
        w.mul_scalar(2.0)
            .unwrap()
            .sum()
            .unwrap()
            .backward()
            .unwrap();
    }
    assert_eq!(grad(&w), vec![6.0, 6.0]);
    zero_grad(std::slice::from_ref(&w));
    assert!(w.grad().is_none());
    w.mul(&w).unwrap().sum().unwrap().backward().unwrap();
    assert_eq!(grad(&w), vec![2.0, 4.0]);
}

#[test]
fn no_grad_records_nothing() {
    let w = leaf(&[1.0], &[1]);
    let y = {
        let _g = no_grad();
        w.mul_scalar(2.0).unwrap()
    };
    assert!(!y.requires_grad() && y.is_leaf());
    let e = y.sum().unwrap().backward().unwrap_err();
    assert!(e.to_string().contains("does not require grad"), "{e}");
    // Detach cuts the graph the same way.
    let d = w.mul_scalar(3.0).unwrap().detach();
    assert!(!d.requires_grad());
}

#[test]
fn second_backward_needs_retain_graph() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.exp().unwrap().sum().unwrap();
    y.backward_retain_graph().unwrap();
    y.backward().unwrap();
    let e = x.exp().unwrap();
    let _ = e; // a fresh graph is independent of the freed one
    let err = y.backward().unwrap_err().to_string();
    assert!(
        err.starts_with("Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed)"),
        "{err}"
    );
    let ex: Vec<f64> = [1.0f64, 2.0].iter().map(|v| 2.0 * v.exp()).collect();
    close(&grad(&x), &ex);
}

#[test]
fn inplace_after_use_is_detected() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let a = x.mul_scalar(1.0).unwrap();
    let b = a.exp().unwrap(); // exp's backward needs its result
    b.add_scalar_(1.0).unwrap(); // ... which this overwrites
    let err = b.sum().unwrap().backward().unwrap_err().to_string();
    assert!(
        err.starts_with("one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [2]], which is output 0 of ExpBackward0, is at version 1; expected version 0 instead."),
        "{err}"
    );
}

#[test]
fn inplace_that_backward_does_not_need_is_fine() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let a = x.mul_scalar(2.0).unwrap();
    a.add_scalar_(1.0).unwrap(); // add's gradient needs no saved value
    a.mul_scalar_(3.0).unwrap();
    assert_eq!(a.to_f64_vec(), vec![9.0, 15.0]);
    a.sum().unwrap().backward().unwrap();
    assert_eq!(grad(&x), vec![6.0, 6.0]);
}

#[test]
fn inplace_on_leaf_is_refused_unless_no_grad() {
    let w = leaf(&[1.0], &[1]);
    let err = w.add_scalar_(1.0).unwrap_err().to_string();
    assert_eq!(
        err,
        "a leaf Variable that requires grad is being used in an in-place operation."
    );
    assert_eq!(w.to_f64_vec(), vec![1.0]);
    let e2 = w.narrow(0, 0, 1).unwrap().mul_scalar_(2.0).unwrap_err();
    assert!(e2.to_string().contains("view of a leaf Variable"), "{e2}");
    {
        let _g = no_grad();
        w.sub_scalar_(0.5).unwrap(); // an optimiser step
    }
    assert_eq!(w.to_f64_vec(), vec![0.5]);
}

#[test]
fn leaf_modified_between_forward_and_backward() {
    let w = leaf(&[1.0, 2.0], &[2]);
    let y = w.mul(&w).unwrap().sum().unwrap();
    {
        let _g = no_grad();
        w.mul_scalar_(2.0).unwrap();
    }
    let err = y.backward().unwrap_err().to_string();
    assert!(err.contains("modified by an inplace operation"), "{err}");
}

#[test]
fn retain_grad_on_non_leaf() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let h = x.mul_scalar(3.0).unwrap();
    h.retain_grad().unwrap();
    assert!(h.retains_grad());
    let y = h.mul(&h).unwrap().sum().unwrap();
    y.backward().unwrap();
    assert_eq!(grad(&h), vec![6.0, 12.0]);
    assert_eq!(grad(&x), vec![18.0, 36.0]);
}

#[test]
fn requires_grad_propagates_and_int_results_do_not() {
    let x = leaf(&[1.0, -2.0], &[2]);
    let c = Tensor::from_slice(&[1.0f32, 1.0], &[2]).unwrap();
    assert!(x.add(&c).unwrap().requires_grad());
    assert!(!c.add(&c).unwrap().requires_grad());
    assert!(!x.gt_scalar(0.0).unwrap().requires_grad());
    assert!(!x.argmax(None, false).unwrap().requires_grad());
    let i = Tensor::from_slice(&[1i64], &[1]).unwrap();
    let e = i.requires_grad_(true).unwrap_err().to_string();
    assert_eq!(
        e,
        "only Tensors of floating point dtype can require gradients"
    );
}

#[test]
fn backward_errors() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.mul_scalar(2.0).unwrap();
    let e = y.backward().unwrap_err().to_string();
    assert_eq!(e, "grad can be implicitly created only for scalar outputs");
    let bad = Tensor::ones(&[3], DType::F32);
    let e = y.backward_with(&bad).unwrap_err().to_string();
    assert!(e.starts_with("Mismatch in shape"), "{e}");
    y.backward_with(&Tensor::from_slice(&[1.0f32, 10.0], &[2]).unwrap())
        .unwrap();
    assert_eq!(grad(&x), vec![2.0, 20.0]);
}

#[test]
fn several_dtypes_and_noncontiguous_leaves() {
    for dt in [DType::F32, DType::F64, DType::F16] {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
            .unwrap()
            .to_dtype(dt)
            .unwrap();
        x.requires_grad_(true).unwrap();
        let v = x.t().unwrap().slice(0, Some(0), None, 2).unwrap(); // [2, 2], strided
        v.mul(&v).unwrap().sum().unwrap().backward().unwrap();
        let g = x.grad().unwrap();
        assert_eq!(g.dtype(), dt);
        assert_eq!(g.to_f64_vec(), vec![2.0, 0.0, 6.0, 8.0, 0.0, 12.0]);
    }
}

#[test]
fn eager_backward_through_traced_code_coexists() {
    // Tracing records the same ops the tape records; both work in one run.
    let w = leaf(&[0.5, 1.5], &[2]);
    let w2 = w.clone();
    let traced = smelt::jit::trace::trace(
        move |xs| Ok(vec![xs[0].mul(&w2)?.sum()?]),
        &[Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()],
    )
    .unwrap();
    assert!(!traced.graph().outputs().is_empty());
    let y = Tensor::from_slice(&[3.0f32, 4.0], &[2])
        .unwrap()
        .mul(&w)
        .unwrap()
        .sum()
        .unwrap();
    y.backward().unwrap();
    assert_eq!(grad(&w), vec![3.0, 4.0]);
}

struct MyReLU;

impl Function for MyReLU {
    fn name(&self) -> &str {
        "MyReLU"
    }
    fn forward(&self, ctx: &mut Context, x: &[Tensor]) -> Result<Tensor> {
        ctx.save_for_backward(&[&x[0]]);
        x[0].clamp_min(0.0)
    }
    fn backward(&self, ctx: &Context, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let x = &ctx.saved_tensors()?[0];
        Ok(vec![Some(g.masked_fill(&x.lt_scalar(0.0)?, 0.0)?)])
    }
}

#[test]
fn custom_function_my_relu() {
    let x = leaf(&[-1.0, 2.0, 3.0], &[3]);
    let h = x.mul_scalar(2.0).unwrap();
    let y = apply_function(MyReLU, &[&h]).unwrap();
    assert_eq!(y.to_f64_vec(), vec![0.0, 4.0, 6.0]);
    assert_eq!(y.grad_fn_name().as_deref(), Some("MyReLUBackward"));
    // The custom node sits between two recorded ops.
    let z = y.mul(&x).unwrap().sum().unwrap();
    z.backward().unwrap();
    // dz/dx = relu(2x) + x · 2·[x > 0]
    assert_eq!(grad(&x), vec![0.0, 4.0 + 4.0, 6.0 + 6.0]);
}

#[test]
fn custom_function_saved_tensor_modified() {
    let x = leaf(&[-1.0, 2.0], &[2]);
    let h = x.mul_scalar(1.0).unwrap();
    let y = apply_function(MyReLU, &[&h]).unwrap();
    h.add_scalar_(1.0).unwrap();
    let e = y.sum().unwrap().backward().unwrap_err().to_string();
    assert!(e.contains("modified by an inplace operation"), "{e}");
}

fn layer(w: &Tensor) -> Segment {
    let w = w.clone();
    // Four saved intermediates per layer: what checkpointing avoids keeping.
    Segment::new(move |xs: &[Tensor]| xs[0].matmul(&w)?.tanh()?.mul_scalar(0.5)?.sin())
}

#[test]
fn checkpoint_same_gradients_less_saved_memory() {
    let n = 16;
    let ws: Vec<Tensor> = (0..6)
        .map(|k| {
            let v: Vec<f32> = (0..n * n)
                .map(|i| ((i * 7 + k * 3) % 11) as f32 / 40.0 - 0.12)
                .collect();
            leaf(&v, &[n, n])
        })
        .collect();
    let x: Vec<f32> = (0..8 * n).map(|i| (i % 5) as f32 / 5.0).collect();
    let x = Tensor::from_vec(x, &[8, n]).unwrap();
    let fns: Vec<Segment> = ws.iter().map(layer).collect();

    let mut plain = x.clone();
    for f in &fns {
        plain = f(&[plain]).unwrap();
    }
    let plain_loss = plain.sum().unwrap();
    let plain_bytes = saved_tensor_bytes(&plain_loss);
    plain_loss.backward().unwrap();
    let plain_grads: Vec<Vec<f64>> = ws.iter().map(grad).collect();
    zero_grad(&ws);

    let ck = checkpoint_sequential(&fns, 3, &x).unwrap();
    let ck_loss = ck.sum().unwrap();
    let ck_bytes = saved_tensor_bytes(&ck_loss);
    ck_loss.backward().unwrap();
    for (w, p) in ws.iter().zip(&plain_grads) {
        close(&grad(w), p);
    }
    assert!(
        ck_bytes * 2 <= plain_bytes,
        "checkpointed graph keeps {ck_bytes} bytes, plain keeps {plain_bytes}"
    );

    zero_grad(&ws);
    let one = fns[0].checkpoint(&[&x]).unwrap();
    one.sum().unwrap().backward().unwrap();
    assert!(ws[0].grad().is_some() && ws[1].grad().is_none());

    // a plain closure is a segment too, with the gradient of the unsegmented run
    zero_grad(&ws);
    let w0 = ws[0].clone();
    let direct = checkpoint(
        move |xs: &[Tensor]| xs[0].matmul(&w0)?.tanh()?.mul_scalar(0.5)?.sin(),
        &[&x],
    )
    .unwrap();
    direct.sum().unwrap().backward().unwrap();
    let by_closure = grad(&ws[0]);
    zero_grad(&ws);
    fns[0](std::slice::from_ref(&x))
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    close(&by_closure, &grad(&ws[0]));
}

#[test]
fn clipping() {
    let a = leaf(&[0.0, 0.0], &[2]);
    let b = leaf(&[0.0], &[1]);
    a.set_grad(Some(Tensor::from_slice(&[3.0f32, 0.0], &[2]).unwrap()));
    b.set_grad(Some(Tensor::from_slice(&[4.0f32], &[1]).unwrap()));
    let params = [a.clone(), b.clone()];
    let norm = clip_grad_norm_(&params, 1.0, 2.0).unwrap();
    assert!((norm - 5.0).abs() < 1e-9);
    close(&grad(&a), &[0.6, 0.0]);
    close(&grad(&b), &[0.8]);
    clip_grad_value_(&params, 0.7).unwrap();
    close(&grad(&a), &[0.6, 0.0]);
    close(&grad(&b), &[0.7]);
    let inf = clip_grad_norm_(&params, 10.0, f64::INFINITY).unwrap();
    assert!((inf - 0.7).abs() < 1e-6);
}

/// A leaf with a post-accumulate hook gets its gradient as soon as the op that makes it has
/// run, so the hook (DDP's bucket launch) runs while the rest of the backward still
/// computes: the profiler sees gradient ops after the first hook, and every hook once.
#[test]
fn hooked_leaves_get_their_gradients_during_the_sweep() {
    use smelt::profiler::{self, EventKind, ProfilerOptions};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut g = smelt::Generator::new(4);
    let leaf = |shape: &[usize], g: &mut smelt::Generator| {
        let t = Tensor::randn_with(shape, None, g).unwrap();
        t.requires_grad_(true).unwrap();
        t
    };
    let ws: Vec<Tensor> = (0..4).map(|_| leaf(&[16, 16], &mut g)).collect();
    let x = Tensor::randn_with(&[8, 16], None, &mut g).unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    for w in &ws {
        let fired = fired.clone();
        w.register_post_accumulate_grad_hook(move |t| {
            let _s = profiler::record_function("hook");
            assert!(t.grad().is_some());
            fired.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    }
    let forward = |ws: &[Tensor]| {
        let mut h = x.clone();
        for w in ws {
            h = h.matmul(w).unwrap().tanh().unwrap();
        }
        h.sum().unwrap()
    };
    let loss = forward(&ws);
    let (r, prof) = profiler::profile(ProfilerOptions::default(), || loss.backward()).unwrap();
    r.unwrap();
    assert_eq!(fired.load(Ordering::SeqCst), ws.len());
    let first_hook = prof
        .of_kind(EventKind::Range)
        .filter(|e| e.name == "hook")
        .map(|e| e.end_ns())
        .min()
        .unwrap();
    let later_ops = prof
        .of_kind(EventKind::Op)
        .filter(|e| e.start_ns >= first_hook)
        .count();
    assert!(later_ops > 0, "every gradient op ran before the first hook");
    // the gradients are those of the same sweep without hooks
    let grads: Vec<Vec<f64>> = ws.iter().map(|w| w.grad().unwrap().to_f64_vec()).collect();
    let copies: Vec<Tensor> = ws
        .iter()
        .map(|w| {
            let c = Tensor::from_vec(w.to_vec::<f32>().unwrap(), w.shape()).unwrap();
            c.requires_grad_(true).unwrap();
            c
        })
        .collect();
    forward(&copies).backward().unwrap();
    for (c, want) in copies.iter().zip(&grads) {
        assert_eq!(&c.grad().unwrap().to_f64_vec(), want);
    }
}
