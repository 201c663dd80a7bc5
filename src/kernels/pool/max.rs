//! Max pooling of tensors, forward and backward.

use super::*;

/// `max_pool2d`: the maximum of each window, positions outside the input skipped. Any
/// numeric dtype; the result has x's dtype, and x's layout when x is channels_last.
pub fn max_pool2d(x: &Tensor, geo: &PoolGeometry, out: &TensorType) -> Result<Tensor> {
    let geo = geometry("max_pool2d", geo)?;
    let p = plan("max_pool2d", x.shape(), &out.shape, prefers_nhwc(x))?;
    if x.dtype() == DType::Bool {
        bail!(DType, "\"max_pool2d\" not implemented for 'Bool'");
    }
    if out.dtype != x.dtype() {
        bail!(
            DType,
            "max_pool2d: a result of dtype {} for an input of dtype {}",
            out.dtype,
            x.dtype()
        );
    }
    dispatch!(x.dtype(), T => max_pool_as::<T>(x, &geo, &p, out))
}

fn max_pool_as<T: Element + rt::Elem>(
    x: &Tensor,
    geo: &rt::Geometry,
    p: &Plan,
    out: &TensorType,
) -> Result<Tensor> {
    let xd = dense::<T>(x, p.nhwc)?;
    produce::<T>(out, p.nhwc, false, |y| {
        with_elements::<T, _>(&xd, |xv| rt::max_forward(xv, p, geo, y))
    })
}

/// The gradient of `max_pool2d`: each output's gradient `gy` goes to the first maximal
/// element of its window in `x` (a NaN counting as the maximum), accumulated where windows
/// overlap. `out` is x's type (a float dtype); the result has x's layout when x is
/// channels_last.
pub fn max_pool2d_backward(
    gy: &Tensor,
    x: &Tensor,
    geo: &PoolGeometry,
    out: &TensorType,
) -> Result<Tensor> {
    let op = "max_pool2d_backward";
    let geo = geometry(op, geo)?;
    let p = plan(op, x.shape(), gy.shape(), prefers_nhwc(x))?;
    if out.shape != x.shape() {
        bail!(
            Shape,
            "{op}: gradient of shape {:?} for an input of shape {:?}",
            out.shape,
            x.shape()
        );
    }
    let acc = compute_type(op, out.dtype)?;
    compute_type(op, gy.dtype())?;
    if x.dtype() == DType::Bool {
        bail!(DType, "\"{op}\" not implemented for 'Bool'");
    }
    dispatch!(x.dtype(), T => match acc {
        DType::F64 => max_backward_as::<T, f64>(gy, x, &geo, &p, out),
        _ => max_backward_as::<T, f32>(gy, x, &geo, &p, out),
    })
}

fn max_backward_as<T: Element + rt::Elem, A: Acc>(
    gy: &Tensor,
    x: &Tensor,
    geo: &rt::Geometry,
    p: &Plan,
    out: &TensorType,
) -> Result<Tensor> {
    let xd = dense::<T>(x, p.nhwc)?;
    let gd = dense::<A>(gy, p.nhwc)?;
    produce::<A>(out, p.nhwc, false, |dx| {
        with_elements2::<T, A, _>(&xd, &gd, |xv, gv| rt::max_backward(gv, xv, p, geo, dx))
    })
}
