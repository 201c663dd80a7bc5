//! The gradient of a convolution of tensors for its input.

use super::*;

/// dL/dx given dL/dy `gy` (`[N, C_out, OH, OW]`) and the weight `w`; `out` is x's type.
/// A channels_last `gy` gives a channels_last result, anything else a contiguous one.
pub fn backward_input(
    gy: &Tensor,
    w: &Tensor,
    geo: &ConvGeometry,
    out: &TensorType,
) -> Result<Tensor> {
    let d = plan(
        "convolution_backward",
        &out.shape,
        w.shape(),
        gy.shape(),
        geo,
    )?;
    compute_type("convolution_backward", gy.dtype())?;
    match compute_type("convolution_backward", out.dtype)? {
        DType::F64 => backward_input_in::<f64>(gy, w, &d, out),
        _ => backward_input_in::<f32>(gy, w, &d, out),
    }
}

fn backward_input_in<A: Acc>(
    gy: &Tensor,
    w: &Tensor,
    d: &Dims,
    out: &TensorType,
) -> Result<Tensor> {
    let nhwc = prefers_nhwc(gy);
    let wv = copy::to_vec::<A>(&dense::<A>(w, nhwc && !d.depthwise())?)?;
    let gd = dense::<A>(gy, nhwc)?;
    produce::<A>(out, nhwc, false, |dx| {
        with_elements::<A, _>(&gd, |gs| {
            smelt_rt::conv::backward_input(gs, &wv, d, nhwc, dx);
        })
    })
}
