//! Where eager execution calls the floors above it without importing them.
//!
//! `apply` runs every op; autocast (`amp`), the tracer (`jit`), the autograd tape and the CUDA
//! executor (`exec`) must see those ops, but they are built on this floor and sit above it.
//! Each registers its function here when it is first switched on: autocast when an autocast
//! region opens, the tracer when a trace starts, the tape when a tensor first requires grad,
//! the CUDA executor when a tensor first moves to a GPU. Until then the slot is empty and
//! `apply` skips it, which is exactly right: none of them has anything to do before that.

use super::Tensor;
use crate::Result;
use crate::ir::collective::ReduceOp;
use crate::ir::op::{Op, TensorType};
use std::sync::OnceLock;

/// Runs `op` on cast inputs when autocast applies to it; `None` otherwise.
pub type AutocastFn = fn(&Op, &[&Tensor]) -> Option<Result<Tensor>>;
/// Sees an op after it ran: its inputs and its result.
pub type AfterFn = fn(&Op, &[&Tensor], &Tensor);
/// Sees an in-place write `target = op(operands)` before it happens; may refuse it.
pub type InplaceFn = fn(&Tensor, &Op, &[&Tensor]) -> Result<()>;
/// Reduces a copy of a tensor over the default process group (`distributed`): the eager
/// kernel of the `all_reduce` graph op.
pub type CollectiveFn = fn(&Tensor, ReduceOp) -> Result<Tensor>;
/// Runs `op` on device `index` (the inputs' device), its result of type `out`.
pub type DeviceFn = fn(&Op, &[&Tensor], &TensorType, usize) -> Result<Tensor>;

/// One function slot, set once by the floor that owns it.
pub struct Hook<F: 'static>(OnceLock<F>);

impl<F: Copy> Hook<F> {
    const fn new() -> Hook<F> {
        Hook(OnceLock::new())
    }
    /// Installs `f`; later calls keep the first one (every caller installs the same function).
    pub fn register(&self, f: F) {
        let _ = self.0.set(f);
    }
    #[inline]
    /// The installed function, if one is.
    pub fn get(&self) -> Option<F> {
        self.0.get().copied()
    }
}

/// Autocast's interception of ops (`amp`).
pub static AUTOCAST: Hook<AutocastFn> = Hook::new();
/// The tracer's record of each op (`jit`).
pub static TRACE: Hook<AfterFn> = Hook::new();
/// The tracer's record of in-place writes (`jit`).
pub static TRACE_INPLACE: Hook<InplaceFn> = Hook::new();
/// The autograd tape's record of each op (`autograd`).
pub static TAPE: Hook<AfterFn> = Hook::new();
/// The autograd tape's check of in-place writes (`autograd`).
pub static TAPE_INPLACE: Hook<InplaceFn> = Hook::new();
/// The default process group's all-reduce (`distributed`), once a group exists.
pub static COLLECTIVE: Hook<CollectiveFn> = Hook::new();
/// Eager ops on GPU tensors (`exec`, which compiles them with the CUDA backend).
pub static DEVICE: Hook<DeviceFn> = Hook::new();

/// Calls the in-place hooks, tape first (it may refuse the write), then the tracer.
pub(crate) fn before_inplace(target: &Tensor, op: &Op, operands: &[&Tensor]) -> Result<()> {
    if let Some(f) = TAPE_INPLACE.get() {
        f(target, op, operands)?;
    }
    if let Some(f) = TRACE_INPLACE.get() {
        f(target, op, operands)?;
    }
    Ok(())
}
