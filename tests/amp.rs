//! Mixed precision: the dtype each op class runs in under autocast, and GradScaler's
//! scaling, unscaling, skipped steps and scale updates with gradients set by hand.

use smelt::amp::{self, CastPolicy};
use smelt::nn::functional::{self as F, Reduction};
use smelt::nn::{Linear, Module};
use smelt::optim::GradScaler;
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::{DType, Tensor};

fn f32s(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i * 7) % 5) as f32 * 0.25 - 0.5).collect();
    Tensor::from_vec(v, shape).unwrap()
}

#[test]
fn op_classes_under_bf16_autocast() {
    let a = f32s(&[4, 3]);
    let b = f32s(&[3, 5]);
    let w = f32s(&[5, 3]);
    let bias = f32s(&[5]);
    let h = f32s(&[2, 6]).to_dtype(DType::BF16).unwrap();
    assert_eq!(a.matmul(&b).unwrap().dtype(), DType::F32);
    let _g = amp::autocast(DType::BF16).unwrap();
    assert!(amp::is_autocast_enabled());
    // Lower precision: matmul, linear, einsum.
    assert_eq!(a.matmul(&b).unwrap().dtype(), DType::BF16);
    assert_eq!(a.linear(&w, Some(&bias)).unwrap().dtype(), DType::BF16);
    assert_eq!(
        Tensor::einsum("ij,jk->ik", &[&a, &b]).unwrap().dtype(),
        DType::BF16
    );
    // Float32: softmax, log_softmax, layer_norm and reductions.
    assert_eq!(h.softmax(1).unwrap().dtype(), DType::F32);
    assert_eq!(h.log_softmax(-1).unwrap().dtype(), DType::F32);
    assert_eq!(
        h.layer_norm(&[6], None, None, 1e-5).unwrap().dtype(),
        DType::F32
    );
    assert_eq!(h.sum().unwrap().dtype(), DType::F32);
    assert_eq!(h.mean_dim(&[1], false).unwrap().dtype(), DType::F32);
    assert_eq!(h.var(None, 1.0, false).unwrap().dtype(), DType::F32);
    assert_eq!(h.cumsum(0).unwrap().dtype(), DType::F32);
    assert_eq!(h.logsumexp(&[1], false).unwrap().dtype(), DType::F32);
    // Losses compute in f32.
    assert_eq!(
        F::mse_loss(&h, &h, Reduction::Mean).unwrap().dtype(),
        DType::F32
    );
    let target = Tensor::from_slice(&[1i64, 5], &[2]).unwrap();
    assert_eq!(F::cross_entropy(&h, &target).unwrap().dtype(), DType::F32);
    // Everything else follows its inputs.
    assert_eq!(a.relu().unwrap().dtype(), DType::F32);
    assert_eq!(h.relu().unwrap().dtype(), DType::BF16);
    assert_eq!(h.amax().unwrap().dtype(), DType::BF16);
    assert_eq!(h.add(&f32s(&[2, 6])).unwrap().dtype(), DType::F32);
    assert_eq!(h.mul_scalar(2.0).unwrap().dtype(), DType::BF16);
    // f64 and integers are never cast.
    let d = a.to_dtype(DType::F64).unwrap();
    assert_eq!(d.matmul(&d.t().unwrap()).unwrap().dtype(), DType::F64);
    let i = Tensor::from_slice(&[1i64, 2, 3, 4], &[2, 2]).unwrap();
    assert_eq!(i.matmul(&i).unwrap().dtype(), DType::I64);
    // A module's forward follows the same rules.
    let lin = Linear::new(3, 5, true).unwrap();
    assert_eq!(lin.forward(&a).unwrap().dtype(), DType::BF16);
}

#[test]
fn autocast_values_equal_explicit_casts() {
    let a = f32s(&[7, 9]);
    let b = f32s(&[9, 4]).mul_scalar(1.37).unwrap();
    let want = a
        .to_dtype(DType::F16)
        .unwrap()
        .matmul(&b.to_dtype(DType::F16).unwrap())
        .unwrap();
    let got = {
        let _g = amp::autocast(DType::F16).unwrap();
        a.matmul(&b).unwrap()
    };
    assert_eq!(got.dtype(), DType::F16);
    assert_eq!(got.to_f64_vec(), want.to_f64_vec());
    // Non-contiguous inputs are cast too.
    let _g = amp::autocast(DType::BF16).unwrap();
    let at = f32s(&[9, 7]).t().unwrap();
    assert_eq!(at.matmul(&b).unwrap().dtype(), DType::BF16);
}

#[test]
fn guards_nest_restore_and_stay_on_their_thread() {
    assert!(!amp::is_autocast_enabled());
    {
        let _a = amp::autocast(DType::BF16).unwrap();
        {
            let _b = amp::autocast(DType::F16).unwrap();
            assert_eq!(amp::autocast_dtype(), DType::F16);
            let _off = amp::disable_autocast();
            assert!(!amp::is_autocast_enabled());
            assert_eq!(
                f32s(&[2, 2]).matmul(&f32s(&[2, 2])).unwrap().dtype(),
                DType::F32
            );
        }
        assert_eq!(amp::autocast_dtype(), DType::BF16);
        assert!(amp::is_autocast_enabled());
        let other = std::thread::spawn(amp::is_autocast_enabled).join().unwrap();
        assert!(!other);
    }
    assert!(!amp::is_autocast_enabled());
    let e = amp::autocast(DType::F32).err().unwrap();
    assert!(
        e.to_string()
            .starts_with("In CPU autocast, but the target dtype is not supported")
    );
}

#[test]
fn cast_policy_classes() {
    use smelt::ir::op::Op;
    assert_eq!(amp::cast_policy(&Op::Matmul), CastPolicy::LowerPrecision);
    assert_eq!(
        amp::cast_policy(&Op::Softmax { dim: 0 }),
        CastPolicy::Float32
    );
    assert_eq!(amp::cast_policy(&Op::Contiguous), CastPolicy::Unchanged);
}

// ---- GradScaler ------------------------------------------------------------------------

fn setup(value: f64) -> (Tensor, SGD) {
    let p = Tensor::from_slice(&[value, value], &[2]).unwrap();
    p.requires_grad_(true).unwrap();
    let opt = SGD::new(vec![p.clone()], SGDConfig::new(0.5)).unwrap();
    (p, opt)
}

#[test]
fn scaler_defaults_and_scale() {
    let s = GradScaler::new();
    assert_eq!(s.get_scale(), 65536.0);
    let loss = Tensor::from_slice(&[0.5f32], &[]).unwrap();
    assert_eq!(s.scale(&loss).unwrap().item_f64().unwrap(), 32768.0);
}

#[test]
fn finite_grads_are_unscaled_and_stepped() {
    let mut s = GradScaler::new();
    let (p, mut opt) = setup(1.0);
    // The scaled gradient of a loss whose true gradient is [0.25, -1].
    p.set_grad(Some(
        Tensor::from_slice(&[0.25 * 65536.0, -65536.0], &[2]).unwrap(),
    ));
    assert!(s.step(&mut opt).unwrap());
    assert_eq!(p.grad().unwrap().to_f64_vec(), vec![0.25, -1.0]);
    assert_eq!(p.to_f64_vec(), vec![1.0 - 0.125, 1.5]);
    s.update().unwrap();
    assert_eq!(s.get_scale(), 65536.0);
    assert_eq!(s.growth_tracker(), 1);
}

#[test]
fn explicit_unscale_then_step_unscales_once() {
    let mut s = GradScaler::with_settings(8.0, 2.0, 0.5, 2000, true).unwrap();
    let (p, mut opt) = setup(0.0);
    p.set_grad(Some(Tensor::from_slice(&[8.0, 16.0], &[2]).unwrap()));
    s.unscale_(&opt).unwrap();
    assert_eq!(p.grad().unwrap().to_f64_vec(), vec![1.0, 2.0]);
    let e = s.unscale_(&opt).unwrap_err();
    assert_eq!(
        e.to_string(),
        "unscale_() has already been called on this optimizer since the last update()."
    );
    assert!(s.step(&mut opt).unwrap());
    assert_eq!(p.to_f64_vec(), vec![-0.5, -1.0]);
    assert!(s.step(&mut opt).is_err());
    s.update().unwrap();
    // A new iteration may unscale again.
    s.unscale_(&opt).unwrap();
}

#[test]
fn inf_or_nan_grads_skip_the_step_and_back_off() {
    for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
        let mut s = GradScaler::new();
        let (p, mut opt) = setup(1.0);
        p.set_grad(Some(Tensor::from_slice(&[1.0, bad], &[2]).unwrap()));
        assert!(!s.step(&mut opt).unwrap());
        assert_eq!(p.to_f64_vec(), vec![1.0, 1.0]);
        s.update().unwrap();
        assert_eq!(s.get_scale(), 32768.0);
        assert_eq!(s.growth_tracker(), 0);
    }
    // f16 gradients overflowing to inf are caught too.
    let mut s = GradScaler::new();
    let p = Tensor::ones(&[3], DType::F16);
    p.requires_grad_(true).unwrap();
    let mut opt = SGD::new(vec![p.clone()], SGDConfig::new(0.1)).unwrap();
    let g = Tensor::from_slice(&[1.0f32, 7e4, 2.0], &[3])
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    p.set_grad(Some(g));
    assert!(!s.step(&mut opt).unwrap());
    assert_eq!(p.to_f64_vec(), vec![1.0; 3]);
}

#[test]
fn scale_grows_after_the_interval_and_resets_on_overflow() {
    let mut s = GradScaler::with_settings(4.0, 2.0, 0.5, 3, true).unwrap();
    let (p, mut opt) = setup(0.0);
    let mut scales = Vec::new();
    for k in 0..7 {
        let g = if k == 4 { f64::INFINITY } else { 1.0 };
        p.set_grad(Some(Tensor::from_slice(&[g, g], &[2]).unwrap()));
        s.step(&mut opt).unwrap();
        s.update().unwrap();
        scales.push(s.get_scale());
    }
    // Growth after 3 clean steps, backoff at the overflow, tracker restarted.
    assert_eq!(scales, vec![4.0, 4.0, 8.0, 8.0, 4.0, 4.0, 4.0]);
    opt.zero_grad();
}

#[test]
fn scaler_misuse_and_disabled() {
    let mut s = GradScaler::new();
    assert_eq!(
        s.update().unwrap_err().to_string(),
        "No inf checks were recorded prior to update."
    );
    assert!(GradScaler::with_settings(1.0, 0.5, 0.5, 10, true).is_err());
    assert!(GradScaler::with_settings(1.0, 2.0, 1.5, 10, true).is_err());
    let mut off = GradScaler::with_settings(65536.0, 2.0, 0.5, 10, false).unwrap();
    let (p, mut opt) = setup(1.0);
    let loss = Tensor::from_slice(&[3.0f32], &[]).unwrap();
    assert_eq!(off.scale(&loss).unwrap().item_f64().unwrap(), 3.0);
    assert_eq!(off.get_scale(), 1.0);
    p.set_grad(Some(Tensor::from_slice(&[1.0, 1.0], &[2]).unwrap()));
    assert!(off.step(&mut opt).unwrap());
    assert_eq!(p.to_f64_vec(), vec![0.5, 0.5]);
    off.update().unwrap();
}
