//! Convolution (1-d and 2-d, grouped, strided, dilated, asymmetrically padded) and its two
//! gradients on tensors: the shapes checked, the operands made dense in the compute dtype
//! and the order the kernels read, then the kernels of `smelt_rt::conv` (shared with
//! compiled models), and the result presented in its layout.
//!
//! f64 computes in f64; f32 in f32; f16 and bf16 in f32, with one rounding of the result.
//! A 1-d convolution is the 2-d one with a height of 1.

use super::copy;
use crate::ir::dtype::DType;
use crate::ir::op::TensorType;
use crate::layout::Layout;
use crate::tensor::Tensor;
use crate::tensor::access;
use crate::tensor::element::Element;
use crate::{Result, bail};
pub(crate) use smelt_rt::conv::Dims;

mod forward;
mod input_grad;
#[cfg(test)]
mod tests;
mod weight_grad;
mod weights;

pub use crate::ir::conv::ConvGeometry;
pub use forward::{Epilogue, forward, forward_then};
pub use input_grad::backward_input;
pub use weight_grad::backward_weight;

/// Whether a tensor of `shape` with `strides` is dense in channels_last (NHWC) order, as
/// PyTorch's `is_contiguous(memory_format=torch.channels_last)`: 4-d, strides
/// `[H·W·C, 1, W·C, C]`, where a dim of size 1 may have any stride.
pub fn is_channels_last(shape: &[usize], strides: &[usize]) -> bool {
    if shape.len() != 4 || strides.len() != 4 {
        return false;
    }
    let mut expected = 1;
    for d in [1, 3, 2, 0] {
        if shape[d] != 1 {
            if strides[d] != expected {
                return false;
            }
            expected *= shape[d];
        }
    }
    true
}

/// Whether a kernel should read `t` in NHWC order (and give its result in it): when `t`
/// is channels_last. A tensor that is also plain contiguous (one channel, or one pixel) is
/// NHWC only when its strides order the dims as NHWC, PyTorch's tie-break in
/// `suggest_memory_format`: `[N, C, 1, 1]` with strides `[C, 1, C, C]` is, with
/// `[C, 1, 1, 1]` it is not.
pub(crate) fn prefers_nhwc(t: &Tensor) -> bool {
    prefers_nhwc_layout(t.layout())
}

/// [`prefers_nhwc`] of a tensor laid out as `l`.
pub(crate) fn prefers_nhwc_layout(l: &Layout) -> bool {
    let (sh, st) = (l.shape.as_slice(), l.strides.as_slice());
    sh.len() == 4 && is_channels_last(sh, st) && (!l.is_contiguous() || strides_like_nhwc(sh, st))
}

/// PyTorch's `is_channels_last_strides_2d`: the strides, read in the order C, W, H, N,
/// never decrease, ties between size-1 dims resolved towards NCHW.
fn strides_like_nhwc(shape: &[usize], strides: &[usize]) -> bool {
    if strides[1] == 0 {
        return false;
    }
    let mut min = 0;
    for d in [1, 3, 2, 0] {
        if shape[d] == 0 || strides[d] < min || (d == 0 && min == strides[1]) {
            return false;
        }
        min = strides[d];
        if shape[d] > 1 {
            min *= shape[d];
        }
    }
    true
}

/// The float types the kernels compute in.
pub(crate) trait Acc: Element + smelt_rt::conv::Real {}
impl Acc for f32 {}
impl Acc for f64 {}

/// The type a float op on `dtype` computes in: f64 for f64, f32 for f32 and the halves.
pub(crate) fn compute_type(op: &str, dtype: DType) -> Result<DType> {
    match dtype {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::BF16 => Ok(DType::F32),
        d => bail!(DType, "\"{op}\" not implemented for '{}'", d.scalar_name()),
    }
}

/// `t` as a 4-d tensor: a 3-d `[N, C, L]` is read as `[N, C, 1, L]`.
fn as4d(t: &Tensor) -> Tensor {
    if t.dim() != 3 {
        return t.clone();
    }
    let (sh, st) = (t.shape(), t.strides());
    t.with_layout(Layout {
        shape: vec![sh[0], sh[1], 1, sh[2]],
        strides: vec![st[0], st[1], st[2] * sh[2], st[2]],
        offset: t.storage_offset(),
    })
}

/// `t` (3-d read as 4-d) converted to the element type `T` in a dense buffer, in NCHW
/// order or, when `nhwc`, NHWC order. A tensor already so is used as it is, uncopied.
pub(crate) fn dense<T: Element>(t: &Tensor, nhwc: bool) -> Result<Tensor> {
    let t4 = as4d(t);
    let v = if nhwc {
        t4.with_layout(t4.layout().permute(&[0, 2, 3, 1]))
    } else {
        t4
    };
    copy::contiguous(&copy::cast(&v, T::DTYPE)?)
}

/// Runs `f` on the elements of `t`, a dense tensor of element type `T`, read-locked.
pub(crate) fn with_elements<T: Element, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> R {
    let acc = access::lock(&[t], &[]);
    let s: &[T] = if t.numel() == 0 {
        &[]
    } else {
        // SAFETY: `t` is dense with numel elements of type T from its first one, and the
        // read lock on its storage is held while `f` runs.
        unsafe { std::slice::from_raw_parts(acc.read::<T>(0), t.numel()) }
    };
    f(s)
}

/// Runs `f` on the elements of `a` and `b`, dense tensors of element types `T` and `U`,
/// both read-locked at once (they may share a storage).
pub(crate) fn with_elements2<T: Element, U: Element, R>(
    a: &Tensor,
    b: &Tensor,
    f: impl FnOnce(&[T], &[U]) -> R,
) -> R {
    let acc = access::lock(&[a, b], &[]);
    let sa: &[T] = if a.numel() == 0 {
        &[]
    } else {
        // SAFETY: `a` is dense with numel elements of type T, read-locked while `f` runs.
        unsafe { std::slice::from_raw_parts(acc.read::<T>(0), a.numel()) }
    };
    let sb: &[U] = if b.numel() == 0 {
        &[]
    } else {
        // SAFETY: as for `a`.
        unsafe { std::slice::from_raw_parts(acc.read::<U>(1), b.numel()) }
    };
    f(sa, sb)
}

/// A contiguous `[N, H, W, C]` tensor seen as `[N, C, H, W]` with channels_last strides.
pub(crate) fn channels_last_view(t: &Tensor) -> Tensor {
    let s = t.shape();
    let (n, h, w, c) = (s[0], s[1], s[2], s[3]);
    t.with_layout(Layout {
        shape: vec![n, c, h, w],
        strides: vec![h * w * c, 1, w * c, c],
        offset: t.storage_offset(),
    })
}

/// The result tensor of type `out` from `data` computed in `A`: NCHW-ordered, or
/// NHWC-ordered when `nhwc`, then presented with channels_last strides.
pub(crate) fn finish<A: Element>(data: Vec<A>, nhwc: bool, out: &TensorType) -> Result<Tensor> {
    let t = Tensor::from_vec(data, &dense_shape(nhwc, &out.shape))?;
    let t = copy::cast(&t, out.dtype)?;
    Ok(present(t, nhwc, &out.shape))
}

/// The shape a result of `shape` is stored in: NHWC order when `nhwc` (4-d only).
fn dense_shape(nhwc: bool, shape: &[usize]) -> Vec<usize> {
    match shape {
        &[n, c, h, w] if nhwc => vec![n, h, w, c],
        _ => shape.to_vec(),
    }
}

/// A dense result stored as [`dense_shape`] gives, seen with `shape`.
fn present(t: Tensor, nhwc: bool, shape: &[usize]) -> Tensor {
    if nhwc && shape.len() == 4 {
        channels_last_view(&t)
    } else {
        t
    }
}

/// The result tensor of type `out`, its dense buffer (NCHW order, or NHWC when `nhwc`,
/// then presented with channels_last strides) written by `f` in the compute type `A`:
/// straight into a new (possibly recycled) buffer when `A` is the result dtype, else into
/// a temporary one rounded once. The buffer `f` gets holds zeros when `zeroed`, anything
/// otherwise (then `f` writes every element).
pub(crate) fn produce<A: Element>(
    out: &TensorType,
    nhwc: bool,
    zeroed: bool,
    f: impl FnOnce(&mut [A]),
) -> Result<Tensor> {
    if out.dtype != A::DTYPE {
        let mut v = vec![A::zero(); out.shape.iter().product()];
        f(&mut v);
        return finish(v, nhwc, out);
    }
    let t = Tensor::alloc_for_overwrite(A::DTYPE, &dense_shape(nhwc, &out.shape))?;
    {
        let acc = access::lock(&[], &[&t]);
        let buf: &mut [A] = if t.numel() == 0 {
            &mut []
        } else {
            // SAFETY: `t` is a new contiguous tensor of numel elements of type A (initialised,
            // contents unspecified), write-locked here and seen by nobody else yet.
            unsafe { std::slice::from_raw_parts_mut(acc.write::<A>(0), t.numel()) }
        };
        if zeroed {
            buf.fill(A::zero());
        }
        f(buf);
    }
    Ok(present(t, nhwc, &out.shape))
}

/// Checks the shapes of input `x`, weight `w` and output `y` against `geo` and gives the
/// problem as 4-d.
pub(crate) fn plan(
    op: &str,
    x: &[usize],
    w: &[usize],
    y: &[usize],
    geo: &ConvGeometry,
) -> Result<Dims> {
    let r = x.len();
    if !(r == 3 || r == 4) || w.len() != r || y.len() != r {
        bail!(
            Shape,
            "{op}: expected 3-d or 4-d input, weight and output of one rank, got {x:?}, {w:?} and {y:?}"
        );
    }
    let nd = r - 2;
    let g = geo.groups;
    if [&geo.stride, &geo.pad_lo, &geo.pad_hi, &geo.dilation]
        .iter()
        .any(|v| v.len() != nd)
    {
        bail!(
            Shape,
            "{op}: expected a geometry of {nd} spatial dims, got {geo:?}"
        );
    }
    if g == 0 || geo.stride.contains(&0) || geo.dilation.contains(&0) {
        bail!(
            Value,
            "{op}: groups, strides and dilations must be positive, got {geo:?}"
        );
    }
    let (n, c, co) = (x[0], x[1], w[0]);
    if c % g != 0 || co % g != 0 || w[1] * g != c {
        bail!(
            Shape,
            "{op}: weight {w:?} does not fit input {x:?} with {g} groups"
        );
    }
    let mut sizes = [(1, 1, 1, 0, 1, 1); 2]; // (in, kernel, stride, pad_lo, dilation, out)
    for k in 0..nd {
        let (i, kz, s, pl, ph, dl) = (
            x[2 + k],
            w[2 + k],
            geo.stride[k],
            geo.pad_lo[k],
            geo.pad_hi[k],
            geo.dilation[k],
        );
        let span = (kz.max(1) - 1).saturating_mul(dl).saturating_add(1);
        let padded = i.saturating_add(pl).saturating_add(ph);
        if kz == 0 || padded < span {
            bail!(
                Shape,
                "{op}: kernel size {w:?} (dilated) is greater than the padded input size {x:?}"
            );
        }
        let o = (padded - span) / s + 1;
        if y[2 + k] != o {
            bail!(
                Shape,
                "{op}: output shape {y:?} does not match input {x:?}, weight {w:?} and {geo:?}"
            );
        }
        sizes[2 - nd + k] = (i, kz, s, pl, dl, o);
    }
    if y[0] != n || y[1] != co {
        bail!(Shape, "{op}: output shape {y:?} does not match input {x:?}");
    }
    let [(h, kh, sh, ph, dh, oh), (wd, kw, sw, pw, dw, ow)] = sizes;
    Ok(Dims::from_array([
        n, c, h, wd, co, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, g,
    ]))
}
