//! User-defined differentiable functions, in the manner of `torch.autograd.Function`: a
//! forward that runs without recording and a backward that maps the result's gradient to
//! the inputs' gradients.

use super::engine::modified_error;
use super::tape::{NodeOp, attach, detached, edge_of};
use super::{is_grad_enabled, no_grad};
use crate::Result;
use crate::runtime::Tensor;
use std::sync::Arc;

/// Per-call state shared by forward and backward (`ctx` in PyTorch).
#[derive(Default)]
pub struct Context {
    saved: Vec<(Tensor, u64)>,
    needs_input_grad: Vec<bool>,
}

impl Context {
    /// Keeps tensors for backward; backward fails if they are modified in place meanwhile.
    pub fn save_for_backward(&mut self, tensors: &[&Tensor]) {
        self.saved = tensors.iter().map(|t| (detached(t), t.version())).collect();
    }

    /// The saved tensors, checked to be unmodified since they were saved.
    pub fn saved_tensors(&self) -> Result<Vec<Tensor>> {
        self.saved
            .iter()
            .map(|(t, v)| {
                if t.version() != *v {
                    Err(modified_error(t, None, *v))
                } else {
                    Ok(t.clone())
                }
            })
            .collect()
    }

    /// Whether input `i` wants a gradient.
    pub fn needs_input_grad(&self, i: usize) -> bool {
        self.needs_input_grad.get(i).copied().unwrap_or(false)
    }

    pub(crate) fn saved_bytes(&self) -> Vec<(u64, usize)> {
        self.saved
            .iter()
            .map(|(t, _)| (t.storage().id(), t.storage().nbytes()))
            .collect()
    }
}

/// A differentiable function with a hand-written backward (`torch.autograd.Function`).
pub trait Function: Send + Sync + 'static {
    /// Name shown in messages (`<name>Backward`).
    fn name(&self) -> &str {
        "Function"
    }
    /// Computes the result; runs with grad mode off.
    fn forward(&self, ctx: &mut Context, inputs: &[Tensor]) -> Result<Tensor>;
    /// Gradients of the inputs (one entry per input; `None` for none) given the result's.
    fn backward(&self, ctx: &Context, grad_output: &Tensor) -> Result<Vec<Option<Tensor>>>;
}

/// What the engine calls for a custom node.
pub(crate) trait CustomBackward: Send + Sync {
    fn name(&self) -> String;
    fn backward(&self, grad: &Tensor) -> Result<Vec<Option<Tensor>>>;
    /// (storage id, bytes) of what the node keeps for backward.
    fn saved(&self) -> Vec<(u64, usize)>;
}

struct Bound<F: Function> {
    f: F,
    ctx: Context,
}

impl<F: Function> CustomBackward for Bound<F> {
    fn name(&self) -> String {
        self.f.name().to_string()
    }
    fn backward(&self, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        self.f.backward(&self.ctx, grad)
    }
    fn saved(&self) -> Vec<(u64, usize)> {
        self.ctx.saved_bytes()
    }
}

/// Runs `f` on `inputs` (`MyFunction.apply(...)`): the result records `f`'s backward when
/// grad mode is on and an input requires grad.
pub fn apply_function<F: Function>(f: F, inputs: &[&Tensor]) -> Result<Tensor> {
    apply_recorded(f, inputs, false)
}

/// `apply_function`; with `always`, records even when no input requires grad (for functions
/// whose forward reads parameters that are not inputs, as checkpointed segments do).
pub(crate) fn apply_recorded<F: Function>(
    f: F,
    inputs: &[&Tensor],
    always: bool,
) -> Result<Tensor> {
    let record = is_grad_enabled() && (always || inputs.iter().any(|t| t.requires_grad()));
    let mut ctx = Context {
        saved: Vec::new(),
        needs_input_grad: inputs.iter().map(|t| t.requires_grad()).collect(),
    };
    let plain: Vec<Tensor> = inputs.iter().map(|t| detached(t)).collect();
    let out = {
        let _off = no_grad();
        f.forward(&mut ctx, &plain)?
    };
    if !record || !out.dtype().is_float() {
        return Ok(out);
    }
    // A fresh handle, so that a forward returning its input does not alter that input.
    let out = detached(&out);
    let edges = inputs.iter().map(|t| edge_of(t)).collect();
    let versions = inputs.iter().map(|t| t.version()).collect();
    attach(
        NodeOp::Custom(Arc::new(Bound { f, ctx })),
        edges,
        versions,
        &out,
    );
    Ok(out)
}
