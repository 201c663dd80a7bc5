//! The convolution of tensors, and the tiled epilogue that fused callers run.

use super::*;
use smelt_rt::conv as rt;

/// y[n, g·Cog+o, oh, ow] = bias[o'] + Σ_{c in group g, kh, kw} x[n, c, oh·s − pad_lo + kh·d, …]
/// · w[o', c − g·Cig, kh, kw].
///
/// `x` is `[N, C_in, H, W]` (or `[N, C_in, L]` for 1-d), `w` is `[C_out, C_in/groups, kH, kW]`,
/// `bias` is `[C_out]` or `None`. `out` is the result type (dtype and shape
/// `[N, C_out, OH, OW]`). Inputs may be any strided view. A channels_last `x` gives a
/// channels_last result, anything else a contiguous one.
pub fn forward(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &ConvGeometry,
    out: &TensorType,
) -> Result<Tensor> {
    Ok(forward_then(x, w, bias, geo, out, None)?.0)
}

/// A pointwise epilogue of a convolution: `f(y, start, len)` computes the elements
/// `start..start + len` (in memory order) of whatever reads the convolution's output, `y`
/// being that output's first element. Ranges of different calls never overlap, and calls
/// come from several threads at once.
pub type Epilogue<'a> = &'a (dyn Fn(*mut u8, usize, usize) -> Result<()> + Sync);

/// [`forward`], running `epi` over each tile of the output as soon as the tile is written,
/// while it is still in cache, so that the epilogue costs no pass of its own over memory.
/// The flag says whether it ran: not when the result is rounded to another dtype after the
/// convolution (f16, bf16) or the convolution is depthwise, and then the caller runs it.
pub fn forward_then(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &ConvGeometry,
    out: &TensorType,
    epi: Option<Epilogue>,
) -> Result<(Tensor, bool)> {
    let d = plan("convolution", x.shape(), w.shape(), &out.shape, geo)?;
    if let Some(b) = bias
        && b.shape() != [d.co]
    {
        bail!(
            Shape,
            "convolution: bias of shape {:?} for {} output channels",
            b.shape(),
            d.co
        );
    }
    compute_type("convolution", x.dtype())?;
    match compute_type("convolution", out.dtype)? {
        DType::F64 => forward_in::<f64>(x, w, bias, &d, out, epi),
        _ => forward_in::<f32>(x, w, bias, &d, out, epi),
    }
}

/// An epilogue called from the tile tasks; its first error stops later calls and is
/// returned after the convolution.
struct TileEpilogue<'a> {
    f: Epilogue<'a>,
    failed: std::sync::atomic::AtomicBool,
    err: std::sync::Mutex<Option<crate::Error>>,
}

impl TileEpilogue<'_> {
    fn run(&self, y: *mut u8, start: usize, len: usize) {
        use std::sync::atomic::Ordering;
        if len == 0 || self.failed.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = (self.f)(y, start, len) {
            self.failed.store(true, Ordering::Relaxed);
            let mut slot = self.err.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(e);
        }
    }
}

fn forward_in<A: Acc>(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    d: &Dims,
    out: &TensorType,
    epi: Option<Epilogue>,
) -> Result<(Tensor, bool)> {
    let nhwc = prefers_nhwc(x);
    if d.n * d.co * d.opix() == 0 {
        // nothing for an epilogue to compute either
        return Ok((produce::<A>(out, nhwc, false, |_| {})?, epi.is_some()));
    }
    // an epilogue runs over tiles only on results that need no rounding after
    let tiles = epi.filter(|_| out.dtype == A::DTYPE).map(|f| TileEpilogue {
        f,
        failed: false.into(),
        err: std::sync::Mutex::new(None),
    });
    let bv = match bias {
        Some(b) => Some(copy::to_vec::<A>(&dense::<A>(b, false)?)?),
        None => None,
    };
    let wv = weights::arranged::<A>(w, d, rt::weight_order(d, nhwc, A::DTYPE == DType::F32))?;
    let xd = dense::<A>(x, nhwc)?;
    let mut ran = false;
    let t = produce::<A>(out, nhwc, false, |y| {
        with_elements::<A, _>(&xd, |xs| {
            let run = |y: *mut u8, start: usize, len: usize| {
                if let Some(te) = &tiles {
                    te.run(y, start, len);
                }
            };
            let epi: Option<rt::Epilogue> = match tiles {
                Some(_) => Some(&run),
                None => None,
            };
            ran = rt::forward((xs, wv.as_slice(), bv.as_deref()), d, nhwc, y, epi);
        })
    })?;
    match tiles {
        Some(te) => match te.err.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok((t, ran)),
        },
        None => Ok((t, false)),
    }
}
