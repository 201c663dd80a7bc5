//! In-place ops (`x.add_(y)`, `x.copy_(src)`, ...) and `out=` forms. They write through the
//! tensor's layout, so the change shows in every view of the same storage; they bump the
//! storage's version counter, refuse targets whose elements overlap (an `expand`ed tensor),
//! and follow PyTorch's rules: the result must be castable to the target's dtype and the
//! broadcast shape must equal the target's shape. Nothing is allocated except when a source
//! overlaps the target with another layout (it is copied first, as PyTorch does) or the op
//! computes in another dtype than the target's.
//!
//! Every in-place method returns `Result<&Tensor>` (the target, for chaining).

use crate::ir::dtype::{DType, Scalar};
use crate::ir::op::{BinaryOp, Op, TensorType, UnaryOp};
use crate::ir::shape::{expand_shape, wrap_dim};
use crate::profiler::{EventKind, Span};
use crate::runtime::device::Device;
use crate::runtime::kernels::copy::{cast_new, copy_into};
use crate::runtime::kernels::creation::scalar_to;
use crate::runtime::kernels::{index, pointwise};
use crate::runtime::layout::check_no_overlap;
use crate::runtime::strided::{SendPtr, Walk};
use crate::runtime::tensor::Tensor;
use crate::runtime::{access, cuda};
use crate::{Result, bail, dispatch};

/// PyTorch's `canCast`: no float into an integer or bool, no integer into bool.
fn can_cast(from: DType, to: DType) -> bool {
    (to.is_float() || !from.is_float()) && (from.is_bool() || !to.is_bool())
}

/// The type `op` gives `inputs`, checked to be writable into `dst`'s dtype.
fn checked_type(op: &Op, inputs: &[&Tensor], dst: &Tensor) -> Result<TensorType> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.ttype()).collect();
    let out = op.infer(&types.iter().collect::<Vec<_>>())?;
    if !can_cast(out.dtype, dst.dtype()) {
        bail!(
            DType,
            "result type {} can't be cast to the desired output type {}",
            out.dtype.scalar_name(),
            dst.dtype().scalar_name()
        );
    }
    Ok(out)
}

/// The profiler's event for an in-place write into `dst` from `srcs` (`dst` is read and
/// written, each source read once).
fn write_span(name: impl FnOnce() -> String, dst: &Tensor, srcs: &[&Tensor]) -> Option<Span> {
    let mut span = crate::profiler::span(EventKind::Op, name)?;
    let bytes = |t: &Tensor| (t.numel() * t.element_size()) as u64;
    let read: u64 = srcs
        .iter()
        .filter(|t| !std::ptr::eq(**t, dst))
        .map(|t| bytes(t))
        .sum();
    span.work(2 * bytes(dst) + read, dst.numel() as u64);
    if crate::profiler::records_shapes() {
        let mut shapes = vec![dst.shape().to_vec()];
        shapes.extend(
            srcs.iter()
                .filter(|t| !std::ptr::eq(**t, dst))
                .map(|t| t.shape().to_vec()),
        );
        span.shapes(shapes);
    }
    Some(span)
}

/// Same device for every operand, with the message of `apply`.
fn check_devices(inputs: &[&Tensor], dst: &Tensor) -> Result<()> {
    for t in inputs {
        if !t.is_wrapped_number() && t.device() != dst.device() {
            bail!(
                Device,
                "Expected all tensors to be on the same device, but found at least two devices, {} and {}!",
                dst.device(),
                t.device()
            );
        }
    }
    Ok(())
}

/// Writes `src` (broadcast to `dst`'s shape, cast to its dtype) into GPU tensor `dst`.
fn gpu_write(dst: &Tensor, src: &Tensor) -> Result<()> {
    let src = if src.dtype() == dst.dtype() {
        src.clone()
    } else {
        src.to_dtype(dst.dtype())?
    };
    cuda::tensor::copy_into(dst, &src)
}

impl Tensor {
    /// Marks the storage as modified (what every in-place op does).
    pub fn bump_version(&self) {
        self.storage().bump_version();
    }

    /// Writes pointwise `op` of `inputs` into the existing tensor `out` (PyTorch's `out=`),
    /// without allocating when dtypes match and nothing aliases.
    pub fn apply_out(op: Op, inputs: &[&Tensor], out: &Tensor) -> Result<()> {
        if !op.is_pointwise() {
            bail!(
                Value,
                "{}: out= is only supported for pointwise ops",
                op.name()
            );
        }
        // `x.add_(y)` passes x as first operand and target; `add(a, b, out=c)` does not
        let _span = write_span(
            || match inputs.first() {
                Some(&first) if std::ptr::eq(first, out) => format!("{}_", op.name()),
                _ => format!("{} (out=)", op.name()),
            },
            out,
            inputs,
        );
        check_devices(inputs, out)?;
        checked_type(&op, inputs, out)?;
        crate::runtime::hooks::before_inplace(out, &op, inputs)?;
        if out.device() != Device::Cpu {
            // the result computed on the GPU, then written through `out`'s layout
            let r = crate::runtime::apply(op, inputs)?;
            return gpu_write(out, &r);
        }
        pointwise::eval_into(&op, inputs, out)
    }
    /// `torch.add(a, b, out=out)`.
    pub fn add_out(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        Tensor::apply_out(Op::Binary(BinaryOp::Add), &[a, b], out)
    }
    /// `torch.sub(a, b, out=out)`.
    pub fn sub_out(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        Tensor::apply_out(Op::Binary(BinaryOp::Sub), &[a, b], out)
    }
    /// `torch.mul(a, b, out=out)`.
    pub fn mul_out(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        Tensor::apply_out(Op::Binary(BinaryOp::Mul), &[a, b], out)
    }
    /// `torch.div(a, b, out=out)`.
    pub fn div_out(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        Tensor::apply_out(Op::Binary(BinaryOp::Div), &[a, b], out)
    }

    /// Runs pointwise `op` with `self` as first operand and writes the result into `self`.
    fn update_(&self, op: Op, rest: &[&Tensor]) -> Result<&Tensor> {
        let mut inputs = vec![self];
        inputs.extend_from_slice(rest);
        Tensor::apply_out(op, &inputs, self)?;
        Ok(self)
    }
    fn binary_(&self, op: BinaryOp, other: &Tensor) -> Result<&Tensor> {
        self.update_(Op::Binary(op), &[other])
    }
    fn binary_scalar_(&self, op: BinaryOp, other: Scalar) -> Result<&Tensor> {
        self.update_(Op::Binary(op), &[&Tensor::wrapped(other)])
    }

    /// `self += other` (broadcasting `other` to `self`).
    pub fn add_(&self, other: &Tensor) -> Result<&Tensor> {
        self.binary_(BinaryOp::Add, other)
    }
    /// `self -= other`.
    pub fn sub_(&self, other: &Tensor) -> Result<&Tensor> {
        self.binary_(BinaryOp::Sub, other)
    }
    /// `self *= other`.
    pub fn mul_(&self, other: &Tensor) -> Result<&Tensor> {
        self.binary_(BinaryOp::Mul, other)
    }
    /// `self /= other` (true division: refused for integer `self`, as in PyTorch).
    pub fn div_(&self, other: &Tensor) -> Result<&Tensor> {
        self.binary_(BinaryOp::Div, other)
    }
    /// `self += value`, a Python number.
    pub fn add_scalar_(&self, value: impl Into<Scalar>) -> Result<&Tensor> {
        self.binary_scalar_(BinaryOp::Add, value.into())
    }
    /// `self -= value`.
    pub fn sub_scalar_(&self, value: impl Into<Scalar>) -> Result<&Tensor> {
        self.binary_scalar_(BinaryOp::Sub, value.into())
    }
    /// `self *= value`.
    pub fn mul_scalar_(&self, value: impl Into<Scalar>) -> Result<&Tensor> {
        self.binary_scalar_(BinaryOp::Mul, value.into())
    }
    /// `self /= value`.
    pub fn div_scalar_(&self, value: impl Into<Scalar>) -> Result<&Tensor> {
        self.binary_scalar_(BinaryOp::Div, value.into())
    }
    /// Clamps in place; at least one bound must be given.
    pub fn clamp_(&self, min: Option<Scalar>, max: Option<Scalar>) -> Result<&Tensor> {
        self.update_(Op::Clamp { min, max }, &[])
    }
    /// `relu` in place.
    pub fn relu_(&self) -> Result<&Tensor> {
        self.update_(Op::Unary(UnaryOp::Relu), &[])
    }
    /// Writes `value` where the bool `mask` (broadcast to `self`) is true.
    pub fn masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<&Tensor> {
        self.update_(
            Op::MaskedFill {
                value: value.into(),
            },
            &[mask],
        )
    }

    /// Sets every element to zero.
    pub fn zero_(&self) -> Result<&Tensor> {
        self.fill_(0)
    }
    /// Sets every element to `value` (converted as a cast would).
    pub fn fill_(&self, value: impl Into<Scalar>) -> Result<&Tensor> {
        let _span = write_span(|| "fill_".into(), self, &[]);
        check_no_overlap(self.layout())?;
        let value = value.into();
        if value.is_float() && self.dtype().is_int() && !value.to_f64().is_finite() {
            bail!(
                Value,
                "value cannot be converted to type {} without overflow",
                self.dtype().torch_name().trim_start_matches("torch.")
            );
        }
        let full = Op::Full {
            size: self.shape().to_vec(),
            fill_value: value,
            dtype: Some(self.dtype()),
        };
        crate::runtime::hooks::before_inplace(self, &full, &[])?;
        if self.device() != Device::Cpu {
            let v = Tensor::scalar(value)
                .to_dtype(self.dtype())?
                .transfer(self.device())?;
            gpu_write(self, &v)?;
            return Ok(self);
        }
        let acc = access::lock(&[], &[self]);
        dispatch!(self.dtype(), T => {
            let v: T = scalar_to::<T>(value);
            let p = SendPtr(acc.write::<T>(0));
            Walk::new(self.shape(), [self.strides()]).par_run(|[b], len, [s]| {
                for i in 0..len {
                    // SAFETY: the walk stays inside self's layout, which has no overlap.
                    unsafe { *p.get().add(b + i * s) = v };
                }
            });
        });
        drop(acc);
        self.bump_version();
        Ok(self)
    }
    /// Copies `src` into `self`, broadcasting it to `self`'s shape and casting its dtype.
    /// Allocates nothing unless `src` overlaps `self` with another layout (e.g.
    /// `x.copy_(&x.t())`), in which case `src` is read from a copy.
    pub fn copy_(&self, src: &Tensor) -> Result<&Tensor> {
        let _span = write_span(|| "copy_".into(), self, &[src]);
        check_devices(&[src], self)?;
        let to: Vec<i64> = self.shape().iter().map(|&s| s as i64).collect();
        expand_shape(src.shape(), &to)?;
        check_no_overlap(self.layout())?;
        crate::runtime::hooks::before_inplace(self, &Op::Expand { size: to }, &[src])?;
        if self.device() != Device::Cpu {
            let src = if src.shares_storage(self) {
                cuda::tensor::contiguous_copy(src)?
            } else {
                src.clone()
            };
            gpu_write(self, &src)?;
            return Ok(self);
        }
        let copied;
        let src = if src.shares_storage(self) && src.layout() != self.layout() {
            copied = cast_new(src, src.dtype())?;
            &copied
        } else {
            src
        };
        copy_into(self, src);
        self.bump_version();
        Ok(self)
    }
    /// `self.index_add_(dim, index, source)`: adds slice `i` of `source` along `dim` into
    /// slice `index[i]` of `self`; repeated indices accumulate.
    pub fn index_add_(&self, dim: i64, index: &Tensor, source: &Tensor) -> Result<&Tensor> {
        let _span = write_span(|| "index_add_".into(), self, &[index, source]);
        check_devices(&[index, source], self)?;
        let op = Op::IndexAdd { dim };
        checked_type(&op, &[self, index, source], self)?;
        check_no_overlap(self.layout())?;
        crate::runtime::hooks::before_inplace(self, &op, &[self, index, source])?;
        if self.device() != Device::Cpu {
            // the CPU's kernel on host copies, written back
            let h = self.cpu()?;
            index::index_add_into(&h, wrap_dim(dim, h.dim())?, &index.cpu()?, &source.cpu()?)?;
            gpu_write(self, &h.transfer(self.device())?)?;
            return Ok(self);
        }
        index::index_add_into(self, wrap_dim(dim, self.dim())?, index, source)?;
        Ok(self)
    }
}
