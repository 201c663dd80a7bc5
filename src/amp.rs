//! Automatic mixed precision on the CPU: `autocast` scopes and `GradScaler`.
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
use crate::optim::Optimizer;
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
        Op::Matmul | Op::Linear { .. } | Op::Einsum { .. } => CastPolicy::LowerPrecision,
        Op::Softmax { .. }
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

/// Where one optimiser stands in the current iteration of a `GradScaler`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Unscaled,
    Stepped,
}

/// Loss scaling for f16 gradients (`torch.amp.GradScaler`): multiplies the loss by a scale
/// so small gradients survive, divides the gradients back before the step, skips steps whose
/// gradients overflowed and adapts the scale.
pub struct GradScaler {
    scale: f64,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u32,
    growth_tracker: u32,
    enabled: bool,
    /// Per optimiser (by address) this iteration: its stage and whether inf/NaN was found.
    per_optimizer: Vec<(usize, Stage, bool)>,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler::new()
    }
}

impl GradScaler {
    /// PyTorch's defaults: scale 65536, growth ×2 every 2000 clean steps, backoff ×0.5.
    pub fn new() -> GradScaler {
        GradScaler {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            growth_tracker: 0,
            enabled: true,
            per_optimizer: Vec::new(),
        }
    }

    /// A scaler with explicit settings (`GradScaler(init_scale, growth_factor, ...)`).
    pub fn with_settings(
        init_scale: f64,
        growth_factor: f64,
        backoff_factor: f64,
        growth_interval: u32,
        enabled: bool,
    ) -> Result<GradScaler> {
        if growth_factor <= 1.0 {
            bail!(Value, "The growth factor must be > 1.0.");
        }
        if !(backoff_factor > 0.0 && backoff_factor < 1.0) {
            bail!(Value, "The backoff factor must be < 1.0.");
        }
        if growth_interval == 0 || !(init_scale.is_finite() && init_scale > 0.0) {
            bail!(
                Value,
                "GradScaler needs a positive growth interval and a positive finite initial scale"
            );
        }
        Ok(GradScaler {
            scale: init_scale,
            growth_factor,
            backoff_factor,
            growth_interval,
            growth_tracker: 0,
            enabled,
            per_optimizer: Vec::new(),
        })
    }

    /// The current scale (1 when disabled).
    pub fn get_scale(&self) -> f64 {
        if self.enabled { self.scale } else { 1.0 }
    }

    /// Whether scaling is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Clean steps since the scale last changed.
    pub fn growth_tracker(&self) -> u32 {
        self.growth_tracker
    }

    /// `loss * scale` (the loss itself when disabled).
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        if !self.enabled {
            return Ok(loss.clone());
        }
        loss.mul_scalar(self.scale)
    }

    fn entry(&mut self, opt: &dyn Optimizer) -> Option<&mut (usize, Stage, bool)> {
        let key = opt as *const dyn Optimizer as *const () as usize;
        self.per_optimizer.iter_mut().find(|e| e.0 == key)
    }

    /// Divides the optimiser's gradients by the scale in place and records whether any is
    /// inf or NaN (`unscale_`). At most once per optimiser between `update` calls.
    pub fn unscale_(&mut self, opt: &dyn Optimizer) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        match self.entry(opt).map(|e| e.1) {
            Some(Stage::Unscaled) => bail!(
                Value,
                "unscale_() has already been called on this optimizer since the last update()."
            ),
            Some(Stage::Stepped) => bail!(Value, "unscale_() is being called after step()."),
            None => {}
        }
        let inv = 1.0 / self.scale;
        let mut found_inf = false;
        let _g = crate::autograd::no_grad();
        for p in opt.params() {
            if let Some(g) = p.grad() {
                g.mul_scalar_(inv)?;
                found_inf |= !all_finite(&g)?;
            }
        }
        let key = opt as *const dyn Optimizer as *const () as usize;
        self.per_optimizer.push((key, Stage::Unscaled, found_inf));
        Ok(())
    }

    /// Unscales the gradients if `unscale_` was not called, then runs `opt.step()` unless a
    /// gradient is inf or NaN. Returns whether the step ran.
    pub fn step(&mut self, opt: &mut dyn Optimizer) -> Result<bool> {
        if !self.enabled {
            opt.step()?;
            return Ok(true);
        }
        if self.entry(opt).is_none() {
            self.unscale_(opt)?;
        }
        let Some(entry) = self.entry(opt) else {
            bail!(Value, "GradScaler lost track of the optimizer");
        };
        if entry.1 == Stage::Stepped {
            bail!(
                Value,
                "step() has already been called since the last update()."
            );
        }
        entry.1 = Stage::Stepped;
        let skip = entry.2;
        if !skip {
            opt.step()?;
        }
        Ok(!skip)
    }

    /// Adapts the scale after an iteration (`update`): ×backoff if any optimiser saw inf or
    /// NaN, ×growth after `growth_interval` clean iterations in a row.
    pub fn update(&mut self) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        if self.per_optimizer.is_empty() {
            bail!(Value, "No inf checks were recorded prior to update.");
        }
        let found_inf = self.per_optimizer.iter().any(|e| e.2);
        self.per_optimizer.clear();
        if found_inf {
            self.scale *= self.backoff_factor;
            self.growth_tracker = 0;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.growth_interval {
                self.scale *= self.growth_factor;
                self.growth_tracker = 0;
            }
        }
        Ok(())
    }

    /// Sets the scale to a new value (`update(new_scale)`).
    pub fn set_scale(&mut self, new_scale: f64) -> Result<()> {
        if !(new_scale.is_finite() && new_scale > 0.0) {
            bail!(Value, "new_scale should be a positive finite number");
        }
        self.scale = new_scale;
        self.per_optimizer.clear();
        Ok(())
    }
}

/// True when no element is inf or NaN (`x * 0` is NaN exactly for those).
fn all_finite(t: &Tensor) -> Result<bool> {
    if !t.dtype().is_float() || t.numel() == 0 {
        return Ok(true);
    }
    let bad = t.mul_scalar(0.0)?.isnan()?.any()?;
    Ok(!bad.item::<bool>()?)
}
