//! Average pooling of tensors, fixed windows (with or without the padding counted) and
//! adaptive, forward and backward.

use super::*;

/// Average pooling with dilation 1.
fn avg_geometry(op: &str, geo: &PoolGeometry) -> Result<rt::Geometry> {
    let g = geometry(op, geo)?;
    if geo.dilation != [1, 1] {
        bail!(Unsupported, "{op}: dilation is not supported, got {geo:?}");
    }
    Ok(g)
}

/// `avg_pool2d`: each window's sum divided by PyTorch's divisor: the window's size before
/// clipping to the input (it ends at most `padding` past it) with `count_include_pad`,
/// else the number of its elements inside the input. `geo.dilation` must be `[1, 1]`.
/// The result has x's layout when x is channels_last.
pub fn avg_pool2d(
    x: &Tensor,
    geo: &PoolGeometry,
    count_include_pad: bool,
    out: &TensorType,
) -> Result<Tensor> {
    let op = "avg_pool2d";
    let geo = avg_geometry(op, geo)?;
    let p = plan(op, x.shape(), &out.shape, prefers_nhwc(x))?;
    compute_type(op, x.dtype())?;
    match compute_type(op, out.dtype)? {
        DType::F64 => avg_as::<f64>(x, &geo, count_include_pad, &p, out),
        _ => avg_as::<f32>(x, &geo, count_include_pad, &p, out),
    }
}

fn avg_as<A: Acc>(
    x: &Tensor,
    geo: &rt::Geometry,
    count_include_pad: bool,
    p: &Plan,
    out: &TensorType,
) -> Result<Tensor> {
    let xd = dense::<A>(x, p.nhwc)?;
    produce::<A>(out, p.nhwc, false, |y| {
        with_elements::<A, _>(&xd, |xv| rt::avg_forward(xv, p, geo, count_include_pad, y))
    })
}

/// The gradient of `avg_pool2d`: each output's gradient divided by its divisor, added to
/// every input element of its window. `out` is x's type; the result is channels_last
/// when `gy` is.
pub fn avg_pool2d_backward(
    gy: &Tensor,
    geo: &PoolGeometry,
    count_include_pad: bool,
    out: &TensorType,
) -> Result<Tensor> {
    let op = "avg_pool2d_backward";
    let geo = avg_geometry(op, geo)?;
    let p = plan(op, &out.shape, gy.shape(), prefers_nhwc(gy))?;
    compute_type(op, gy.dtype())?;
    match compute_type(op, out.dtype)? {
        DType::F64 => avg_backward_as::<f64>(gy, &geo, count_include_pad, &p, out),
        _ => avg_backward_as::<f32>(gy, &geo, count_include_pad, &p, out),
    }
}

fn avg_backward_as<A: Acc>(
    gy: &Tensor,
    geo: &rt::Geometry,
    count_include_pad: bool,
    p: &Plan,
    out: &TensorType,
) -> Result<Tensor> {
    let gd = dense::<A>(gy, p.nhwc)?;
    produce::<A>(out, p.nhwc, false, |dx| {
        with_elements::<A, _>(&gd, |gv| {
            rt::avg_backward(gv, p, geo, count_include_pad, dx)
        })
    })
}

/// `adaptive_avg_pool2d`: output (`i`, `j`) averages input rows
/// `floor(i·H/OH)..ceil((i+1)·H/OH)` and the columns alike; the output size is `out`'s.
/// The result has x's layout when x is channels_last.
pub fn adaptive_avg_pool2d(x: &Tensor, out: &TensorType) -> Result<Tensor> {
    let op = "adaptive_avg_pool2d";
    let p = plan(op, x.shape(), &out.shape, prefers_nhwc(x))?;
    compute_type(op, x.dtype())?;
    match compute_type(op, out.dtype)? {
        DType::F64 => adaptive_as::<f64>(x, &p, out),
        _ => adaptive_as::<f32>(x, &p, out),
    }
}

fn adaptive_as<A: Acc>(x: &Tensor, p: &Plan, out: &TensorType) -> Result<Tensor> {
    let xd = dense::<A>(x, p.nhwc)?;
    produce::<A>(out, p.nhwc, false, |y| {
        with_elements::<A, _>(&xd, |xv| rt::adaptive_avg_forward(xv, p, y))
    })
}

/// The gradient of `adaptive_avg_pool2d`: each output's gradient divided by its window's
/// size, added to every input element of the window. `out` is x's type; the result is
/// channels_last when `gy` is.
pub fn adaptive_avg_pool2d_backward(gy: &Tensor, out: &TensorType) -> Result<Tensor> {
    let op = "adaptive_avg_pool2d_backward";
    let p = plan(op, &out.shape, gy.shape(), prefers_nhwc(gy))?;
    compute_type(op, gy.dtype())?;
    match compute_type(op, out.dtype)? {
        DType::F64 => adaptive_backward_as::<f64>(gy, &p, out),
        _ => adaptive_backward_as::<f32>(gy, &p, out),
    }
}

fn adaptive_backward_as<A: Acc>(gy: &Tensor, p: &Plan, out: &TensorType) -> Result<Tensor> {
    let gd = dense::<A>(gy, p.nhwc)?;
    produce::<A>(out, p.nhwc, false, |dx| {
        with_elements::<A, _>(&gd, |gv| rt::adaptive_avg_backward(gv, p, dx))
    })
}
