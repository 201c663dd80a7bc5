//! Activation checkpointing: a segment runs without keeping its intermediate values, and its
//! forward runs again during backward to get them (`torch.utils.checkpoint`).

use super::function::{Context, Function, apply_recorded};
use super::{enable_grad, tape::detached};
use crate::runtime::Tensor;
use crate::{Result, bail};
use std::sync::Arc;

/// The closure of a segment.
type SegmentFn = dyn Fn(&[Tensor]) -> Result<Tensor> + Send + Sync;

/// A segment of a model: tensors in, one tensor out. Any such closure converts into one
/// (`Segment::new(f)` or `f.into()`); cloning a segment shares the closure, and a segment is
/// called like one (`seg(&[x])`).
///
/// The closure owns what it captures, since backward runs it again after the caller's
/// scope: move a clone of each parameter into it (a `Tensor` clone is a handle to the same
/// storage and gradient, not a copy of the data).
#[derive(Clone)]
pub struct Segment(Arc<SegmentFn>);

impl Segment {
    /// The segment of closure `f`.
    pub fn new(f: impl Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static) -> Segment {
        Segment(Arc::new(f))
    }

    /// Runs the segment on `inputs` checkpointed (see [`checkpoint`]).
    pub fn checkpoint(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        apply_recorded(Checkpoint { f: self.clone() }, inputs, true)
    }
}

impl<F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static> From<F> for Segment {
    fn from(f: F) -> Segment {
        Segment::new(f)
    }
}

impl std::ops::Deref for Segment {
    type Target = SegmentFn;
    fn deref(&self) -> &SegmentFn {
        &*self.0
    }
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Segment")
    }
}

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

/// Runs closure `f` on `inputs` keeping only the inputs for backward, which runs `f` again
/// ([`Segment::checkpoint`] for a segment). With grad mode on the result is always recorded: `f` may read
/// parameters that require grad.
///
/// ```
/// use smelt::autograd::checkpoint;
/// use smelt::Tensor;
/// let w = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25], &[2, 2])?;
/// w.requires_grad_(true)?;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2])?;
/// let wc = w.clone(); // a handle: the segment updates `w`'s gradient
/// let y = checkpoint(move |xs| xs[0].matmul(&wc)?.tanh(), &[&x])?;
/// y.sum()?.backward()?;
/// assert!(w.grad().is_some());
/// # Ok::<(), smelt::Error>(())
/// ```
pub fn checkpoint(
    f: impl Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
    inputs: &[&Tensor],
) -> Result<Tensor> {
    Segment::new(f).checkpoint(inputs)
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
        let seg = Segment::new(move |ins: &[Tensor]| {
            let mut y = ins[0].clone();
            for f in &run {
                y = f(&[y])?;
            }
            Ok(y)
        });
        x = if i + 1 == chunks.len() {
            seg(&[x])?
        } else {
            seg.checkpoint(&[&x])?
        };
    }
    Ok(x)
}
