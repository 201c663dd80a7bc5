//! `apply`: the one entry point of eager execution. The op's shape rule (`Op::infer`, shared
//! with the graph IR) checks the operands, then its kernel runs (on the CPU, the reference
//! kernels; on a GPU, the executor the hooks hold), and the hooks above see the op.

use super::hooks;
use super::kernels;
use crate::device::Device;
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::numel;
use crate::tensor::Tensor;
use crate::{Result, bail};

/// Applies an op to tensors: the one entry point of eager execution. The op's shape rule
/// (`Op::infer`, shared with the graph IR) checks the operands, then its kernel runs.
pub fn apply(op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
    if let Some(autocast) = hooks::AUTOCAST.get()
        && let Some(r) = autocast(&op, inputs)
    {
        return r;
    }
    if let Some(first) = inputs.iter().find(|t| !t.is_wrapped_number()) {
        for t in inputs {
            if !t.is_wrapped_number() && t.device() != first.device() {
                bail!(
                    Device,
                    "Expected all tensors to be on the same device, but found at least two devices, {} and {}!",
                    first.device(),
                    t.device()
                );
            }
        }
    }
    let mut span = crate::profiler::span(crate::profiler::EventKind::Op, || op.name().to_string());
    if let Some(s) = span.as_mut()
        && crate::profiler::records_shapes()
    {
        s.shapes(inputs.iter().map(|t| t.shape().to_vec()).collect());
    }
    let types: Vec<TensorType> = inputs.iter().map(|t| t.ttype()).collect();
    let out = kernels::result_type(&op, &types)?;
    if let Some(s) = span.as_mut() {
        let (bytes, flops) = op_work(&op, &types, &out);
        s.work(bytes, flops);
    }
    let device = inputs
        .iter()
        .find(|t| !t.is_wrapped_number())
        .map_or(Device::Cpu, |t| t.device());
    let result = match device {
        Device::Cpu => kernels::eval(&op, inputs, &out)?,
        Device::Cuda(i) => match hooks::DEVICE.get() {
            Some(run) => run(&op, inputs, &out, i)?,
            None => bail!(
                Device,
                "{}: no CUDA executor is loaded; move tensors to a GPU with Tensor::to_device",
                op.name()
            ),
        },
    };
    if let Some(trace) = hooks::TRACE.get() {
        trace(&op, inputs, &result);
    }
    // Eager autograd: records the op on the result when an operand requires grad.
    if let Some(tape) = hooks::TAPE.get() {
        tape(&op, inputs, &result);
    }
    Ok(result)
}

/// Bytes an eager op reads and writes (a view moves none) and its arithmetic operations
/// ([`Op::flops`]): the profiler's figures for it.
fn op_work(op: &Op, inputs: &[TensorType], out: &TensorType) -> (u64, u64) {
    let size = |t: &TensorType| (numel(&t.shape) * t.dtype.size()) as u64;
    if op.is_view() {
        return (0, 0);
    }
    let bytes = inputs.iter().map(size).sum::<u64>() + size(out);
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape.as_slice()).collect();
    let flops = op.flops(&shapes, &out.shape);
    (bytes, flops)
}
