//! The weights of a convolution in the order its kernel reads them, the register tiles'
//! reordering kept between calls.

use super::*;
use smelt_rt::conv::{WeightOrder, taps_by_channel};
use std::any::Any;
use std::sync::{Arc, Mutex};

/// `w` (`[Cout, Cin_g, kH, kW]`) as the kernels read it in `order`, in the compute type `A`.
pub(super) fn arranged<A: Acc>(w: &Tensor, d: &Dims, order: WeightOrder) -> Result<Arc<Vec<A>>> {
    if order == WeightOrder::Taps {
        let any: Arc<dyn Any + Send + Sync> = prepared(w, d)?;
        if let Ok(v) = any.downcast::<Vec<A>>() {
            return Ok(v);
        }
        bail!(
            DType,
            "convolution: the register tiles take f32 weights only"
        );
    }
    let dense = dense::<A>(w, order == WeightOrder::Nhwc)?;
    Ok(Arc::new(copy::to_vec::<A>(&dense)?))
}

/// Reordered forward weights of recent calls, kept with the tensor they came from: a model
/// called again with the same weights (inference, or a frozen layer) skips the reorder. An
/// entry is used only while its source is the same view of the same storage at the same
/// version (every in-place write bumps it); the cache holds the sources, so their storage
/// cannot be freed and reused meanwhile.
static PREPARED: Mutex<Vec<Prepared>> = Mutex::new(Vec::new());

/// The bytes of reordered weights [`PREPARED`] keeps at most (the oldest go first).
const PREPARED_MAX_BYTES: usize = 256 << 20;

struct Prepared {
    source: Tensor,
    version: u64,
    wt: Arc<Vec<f32>>,
}

/// The forward weights of `w` (an f32 `[Cout, Cin, kH, kW]` tensor) in the tiles' order,
/// `[kH·kW·Cin, Cout]`, from the cache when `w` has not changed since.
fn prepared(w: &Tensor, d: &Dims) -> Result<Arc<Vec<f32>>> {
    let same = |p: &Prepared| {
        p.source.shares_storage(w) && p.source.layout() == w.layout() && p.version == w.version()
    };
    let mut cache = PREPARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = cache.iter().position(same) {
        // most recently used last
        let p = cache.remove(i);
        let wt = p.wt.clone();
        cache.push(p);
        return Ok(wt);
    }
    drop(cache);
    let version = w.version();
    let dense = dense::<f32>(w, false)?;
    let wt = with_elements::<f32, _>(&dense, |wv| {
        taps_by_channel(wv, false, (d.kh * d.kw, d.c, d.co))
    });
    let wt = Arc::new(wt);
    let mut cache = PREPARED.lock().unwrap_or_else(|p| p.into_inner());
    cache.push(Prepared {
        source: w.clone(),
        version,
        wt: wt.clone(),
    });
    let mut bytes: usize = cache.iter().map(|p| p.wt.len() * 4).sum();
    while bytes > PREPARED_MAX_BYTES && cache.len() > 1 {
        bytes -= cache.remove(0).wt.len() * 4;
    }
    Ok(wt)
}
