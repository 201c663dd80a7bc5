//! Activation checkpointing: a segment runs without keeping its intermediate values, and its
//! forward runs again during backward to get them (`torch.utils.checkpoint`).

use super::function::{Context, Function, apply_recorded};
use super::{enable_grad, tape::detached};
use crate::runtime::Tensor;
use crate::{Result, bail};
use std::sync::Arc;

/// A segment of a model: tensors in, one tensor out.
pub type Segment = Arc<dyn Fn(&[Tensor]) -> Result<Tensor> + Send + Sync>;

struct Checkpoint {
    f: Segment,
}

impl Function for Checkpoint {
    fn name(&self) -> &str {
        "Checkpoint"
    }
    fn forward(&self, ctx: &mut Context, inputs: &[Tensor]) -> Result<Tensor> {
        ctx.save_for_backward(&inputs.iter().collect::<Vec<_>>());
        (self.f)(inputs)
    }
    fn backward(&self, ctx: &Context, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let saved = ctx.saved_tensors()?;
        let _on = enable_grad();
        let ins: Vec<Tensor> = saved
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let d = detached(t);
                if ctx.needs_input_grad(i) {
                    d.requires_grad_(true)?;
                }
                Ok(d)
            })
            .collect::<Result<_>>()?;
        let out = (self.f)(&ins)?;
        if out.requires_grad() {
            out.backward_with(grad)?;
        }
        Ok(ins
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if ctx.needs_input_grad(i) {
                    t.grad()
                } else {
                    None
                }
            })
            .collect())
    }
}

/// Runs `f` on `inputs` keeping only the inputs for backward, which runs `f` again. With
/// grad mode on the result is always recorded: `f` may read parameters that require grad.
pub fn checkpoint(f: Segment, inputs: &[&Tensor]) -> Result<Tensor> {
    apply_recorded(Checkpoint { f }, inputs, true)
}

/// Runs `fns` in order on `input`, split into `segments` runs of consecutive functions; every
/// run but the last is checkpointed (`torch.utils.checkpoint.checkpoint_sequential`).
pub fn checkpoint_sequential(fns: &[Segment], segments: usize, input: &Tensor) -> Result<Tensor> {
    if segments == 0 {
        bail!(Value, "checkpoint_sequential: segments must be at least 1");
    }
    let per = fns.len().div_ceil(segments).max(1);
    let chunks: Vec<&[Segment]> = fns.chunks(per).collect();
    let mut x = input.clone();
    for (i, chunk) in chunks.iter().enumerate() {
        let run: Vec<Segment> = chunk.to_vec();
        let seg: Segment = Arc::new(move |ins: &[Tensor]| {
            let mut y = ins[0].clone();
            for f in &run {
                y = f(&[y])?;
            }
            Ok(y)
        });
        x = if i + 1 == chunks.len() {
            seg(&[x])?
        } else {
            checkpoint(seg, &[&x])?
        };
    }
    Ok(x)
}
