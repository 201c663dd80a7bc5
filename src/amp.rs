//! Automatic mixed precision on the CPU: `autocast` scopes (loss scaling for f16 gradients,
//! `GradScaler`, is in [`crate::optim`], since it drives optimisers).
//!
//! Inside `autocast(dtype)` (thread-local, like `torch.autocast("cpu", dtype)`), every op
//! that goes through `apply` picks its precision by class, as PyTorch's autocast does:
//!
//! * low precision (`Matmul`, `Linear`, `Einsum`): f32 floating inputs are cast to the
//!   autocast dtype;
//! * f32 (`Softmax`, `LogSoftmax`, `LayerNorm`, and the reductions `sum`, `mean`, `prod`,
//!   `logsumexp`, `var`, `std`, `cumsum`): f16/bf16 inputs are cast to f32; the losses of
//!   `nn::functional` also compute in f32;
//! * every other op runs in the dtype of its inputs.
//!
//! f64 inputs are never cast, and neither are integer, bool or Python-number operands.

use crate::ir::op::{Op, ReduceOp};
use crate::runtime::Tensor;
use crate::{DType, Result, bail};
use std::cell::Cell;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
    static DTYPE: Cell<DType> = const { Cell::new(DType::BF16) };
}

/// Whether autocast is on in this thread (`torch.is_autocast_enabled("cpu")`).
pub fn is_autocast_enabled() -> bool {
    ENABLED.with(Cell::get)
}

/// The low-precision dtype of the current autocast scope (bf16 outside any scope, PyTorch's
/// CPU default).
pub fn autocast_dtype() -> DType {
    DTYPE.with(Cell::get)
}

/// Restores the previous autocast state of its thread when dropped.
#[must_use = "autocast ends when the guard is dropped"]
pub struct AutocastGuard {
    enabled: bool,
    dtype: DType,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        ENABLED.with(|e| e.set(self.enabled));
        DTYPE.with(|d| d.set(self.dtype));
    }
}

fn set_state(enabled: bool, dtype: DType) -> AutocastGuard {
    AutocastGuard {
        enabled: ENABLED.with(|e| e.replace(enabled)),
        dtype: DTYPE.with(|d| d.replace(dtype)),
    }
}

/// Turns autocast on in this thread with `dtype` (bf16 or f16) until the guard drops.
pub fn autocast(dtype: DType) -> Result<AutocastGuard> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        bail!(
            DType,
            "In CPU autocast, but the target dtype is not supported. CPU Autocast only supports dtype of torch.bfloat16, torch.float16 currently, got {}.",
            dtype.torch_name()
        );
    }
    crate::runtime::hooks::AUTOCAST.register(intercept);
    Ok(set_state(true, dtype))
}

/// Turns autocast off in this thread until the guard drops (`autocast(enabled=False)`).
pub fn disable_autocast() -> AutocastGuard {
    set_state(false, autocast_dtype())
}

/// The precision an op runs in under autocast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CastPolicy {
    /// Cast f32 inputs down to the autocast dtype.
    LowerPrecision,
    /// Cast f16/bf16 inputs up to f32.
    Float32,
    /// Leave the inputs alone.
    Unchanged,
}

/// The autocast class of an op.
pub fn cast_policy(op: &Op) -> CastPolicy {
    match op {
        Op::Matmul
        | Op::Linear { .. }
        | Op::Einsum { .. }
        | Op::Attention { .. }
        | Op::Conv { .. } => CastPolicy::LowerPrecision,
        // its f32 parameters and statistics take a lower-precision input up to f32
        Op::BatchNorm(_)
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::LayerNorm { .. }
        | Op::Var { .. }
        | Op::Std { .. }
        | Op::Cumsum { .. } => CastPolicy::Float32,
        Op::Reduce {
            op: ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod | ReduceOp::LogSumExp,
            ..
        } => CastPolicy::Float32,
        _ => CastPolicy::Unchanged,
    }
}

/// The hook `apply` calls first: outside autocast (one thread-local read) or for ops that
/// keep their inputs' precision it returns `None`; otherwise it runs the op on cast inputs.
#[inline]
pub(crate) fn intercept(op: &Op, inputs: &[&Tensor]) -> Option<Result<Tensor>> {
    if !is_autocast_enabled() {
        return None;
    }
    intercept_slow(op, inputs)
}

fn intercept_slow(op: &Op, inputs: &[&Tensor]) -> Option<Result<Tensor>> {
    let low = autocast_dtype();
    let target = |d: DType| match cast_policy(op) {
        CastPolicy::LowerPrecision if d == DType::F32 => Some(low),
        CastPolicy::Float32 if matches!(d, DType::F16 | DType::BF16) => Some(DType::F32),
        _ => None,
    };
    let needs = |t: &&Tensor| !t.is_wrapped_number() && target(t.dtype()).is_some();
    if !inputs.iter().any(needs) {
        return None;
    }
    // The casts and the op itself run with autocast off, so they are not intercepted again.
    let _off = disable_autocast();
    let run = || {
        let cast = inputs
            .iter()
            .map(|t| match target(t.dtype()) {
                Some(d) if !t.is_wrapped_number() => t.to_dtype(d),
                _ => Ok((*t).clone()),
            })
            .collect::<Result<Vec<Tensor>>>()?;
        let refs: Vec<&Tensor> = cast.iter().collect();
        crate::runtime::apply(op.clone(), &refs)
    };
    Some(run())
}

/// `t` in f32 when autocast is on and `t` is f16/bf16 (what f32-policy composite functions,
/// the losses, do with their inputs); otherwise `t` itself.
pub fn autocast_f32(t: &Tensor) -> Result<Tensor> {
    if is_autocast_enabled() && matches!(t.dtype(), DType::F16 | DType::BF16) {
        let _off = disable_autocast();
        return t.to_dtype(DType::F32);
    }
    Ok(t.clone())
}
