//! The gradient of a convolution of tensors for its weights.

use super::*;

/// dL/dw given dL/dy `gy` (`[N, C_out, OH, OW]`) and the input `x`; `out` is w's type.
/// The result is contiguous.
pub fn backward_weight(
    gy: &Tensor,
    x: &Tensor,
    geo: &ConvGeometry,
    out: &TensorType,
) -> Result<Tensor> {
    let d = plan(
        "convolution_backward",
        x.shape(),
        &out.shape,
        gy.shape(),
        geo,
    )?;
    compute_type("convolution_backward", gy.dtype())?;
    compute_type("convolution_backward", x.dtype())?;
    match compute_type("convolution_backward", out.dtype)? {
        DType::F64 => backward_weight_in::<f64>(gy, x, &d, out),
        _ => backward_weight_in::<f32>(gy, x, &d, out),
    }
}

fn backward_weight_in<A: Acc>(
    gy: &Tensor,
    x: &Tensor,
    d: &Dims,
    out: &TensorType,
) -> Result<Tensor> {
    let nhwc = prefers_nhwc(x);
    let xd = dense::<A>(x, nhwc)?;
    let gd = dense::<A>(gy, nhwc)?;
    let dw = with_elements2::<A, A, _>(&xd, &gd, |xs, gs| {
        smelt_rt::conv::backward_weight(gs, xs, d, nhwc)
    });
    finish(dw, false, out)
}
