//! Loss scaling for f16 gradients (`torch.amp.GradScaler`), driving any [`Optimizer`].

use super::Optimizer;
use crate::runtime::Tensor;
use crate::{Result, bail};

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
        // with a process group, every rank skips the step when any rank saw inf or NaN
        // (its gradients may not have been all-reduced, e.g. under no_sync)
        if crate::distributed::is_initialized() {
            let flag = Tensor::scalar(found_inf as u8 as f32);
            crate::distributed::all_reduce(&flag, crate::distributed::ReduceOp::Max)?;
            found_inf = flag.item_f64()? != 0.0;
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
