//! Pooling the fixed 2-D kernels cannot run (3-D windows, dilated average and Lp pooling),
//! as one strided slice of the padded input per kernel tap, combined elementwise: the
//! maximum, or the sum divided by each window's count (a constant computed at import), or
//! `(Σ|x|^p)^(1/p)`. Output sizes, padding and `ceil_mode` follow PyTorch's pooling.

use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::Cx;
use crate::{Result, Tensor, bail};

/// The most kernel taps a pooling is unrolled to.
const MAX_TAPS: usize = 1024;

/// How the taps of a window combine.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Combine {
    Max,
    Mean { include_pad: bool },
    Lp(f64),
}

/// One spatial dim's window: kernel, stride, dilation and padding before and after.
pub(super) struct Dim {
    pub kernel: i64,
    pub stride: i64,
    pub dilation: i64,
    pub lo: i64,
    pub hi: i64,
}

impl Dim {
    fn span(&self) -> i64 {
        (self.kernel - 1) * self.dilation + 1
    }

    /// Output positions over an input of `n`.
    fn out(&self, n: i64, ceil: bool) -> Result<i64> {
        let room = n + self.lo + self.hi - self.span();
        if room < 0 {
            bail!(
                Value,
                "a window of {} does not fit an input of {n} padded by {}+{}",
                self.span(),
                self.lo,
                self.hi
            );
        }
        let mut o = if ceil {
            (room + self.stride - 1) / self.stride
        } else {
            room / self.stride
        } + 1;
        // the last window must start inside the input or its left padding
        if ceil && (o - 1) * self.stride >= n + self.lo {
            o -= 1;
        }
        Ok(o)
    }

    /// For output position `o`, the taps that land on real elements (or, with
    /// `include_pad`, on the declared padding too).
    fn count(&self, o: i64, n: i64, include_pad: bool) -> i64 {
        let (first, end) = if include_pad {
            (-self.lo, n + self.hi)
        } else {
            (0, n)
        };
        (0..self.kernel)
            .filter(|k| {
                let p = o * self.stride + k * self.dilation - self.lo;
                p >= first && p < end
            })
            .count() as i64
    }
}

/// The input's spatial sizes, the number of kernel taps (bounded) and the output sizes.
fn geometry(cx: &Cx, x: ValueId, dims: &[Dim], ceil: bool) -> Result<(Vec<i64>, usize, Vec<i64>)> {
    let spatial: Vec<i64> = cx.shape(x)[2..].iter().map(|&d| d as i64).collect();
    let taps: usize = dims.iter().map(|d| d.kernel.max(0) as usize).product();
    if taps == 0 || taps > MAX_TAPS {
        bail!(
            Value,
            "a pooling window of {taps} taps (smelt unrolls at most {MAX_TAPS})"
        );
    }
    let outs = dims
        .iter()
        .zip(&spatial)
        .map(|(d, &n)| d.out(n, ceil))
        .collect::<Result<_>>()?;
    Ok((spatial, taps, outs))
}

/// `v` padded by each dim's padding with `fill`, and at the end as far as the last window
/// of `outs` reaches.
fn pad_for(
    cx: &mut Cx,
    mut v: ValueId,
    dims: &[Dim],
    outs: &[i64],
    spatial: &[i64],
    fill: f64,
) -> Result<ValueId> {
    for (i, (d, &o)) in dims.iter().zip(outs).enumerate() {
        let extra = ((o - 1) * d.stride + d.span() - (spatial[i] + d.lo + d.hi)).max(0);
        if d.lo != 0 || d.hi + extra != 0 {
            v = super::shape::pad_axis(cx, v, 2 + i as i64, d.lo, d.hi + extra, "constant", fill)?;
        }
    }
    Ok(v)
}

/// Tap `t`'s kernel offset in each dim (row-major over the kernel).
fn tap_offsets(dims: &[Dim], t: usize) -> Vec<i64> {
    let mut rem = t;
    let mut offs = vec![0i64; dims.len()];
    for (i, d) in dims.iter().enumerate().rev() {
        offs[i] = (rem % d.kernel as usize) as i64;
        rem /= d.kernel as usize;
    }
    offs
}

/// What each output position reads of the padded `v` at the tap of offsets `offs`.
fn tap_slice(cx: &mut Cx, v: ValueId, dims: &[Dim], outs: &[i64], offs: &[i64]) -> Result<ValueId> {
    let mut s = v;
    for (i, (d, &o)) in dims.iter().zip(outs).enumerate() {
        let start = offs[i] * d.dilation;
        s = cx.call(
            "slice",
            &[Some(s)],
            &[
                ("dim", Attr::Int(2 + i as i64)),
                ("start", Attr::Int(start)),
                ("end", Attr::Int(start + (o - 1) * d.stride + 1)),
                ("step", Attr::Int(d.stride)),
            ],
        )?;
    }
    Ok(s)
}

pub(super) fn pool_by_taps(
    cx: &mut Cx,
    x: ValueId,
    dims: &[Dim],
    ceil: bool,
    how: Combine,
) -> Result<ValueId> {
    let (spatial, taps, outs) = geometry(cx, x, dims, ceil)?;
    let dtype = cx.dtype(x);
    let mut v = x;
    if let Combine::Lp(p) = how {
        let a = cx.call("abs", &[Some(v)], &[])?;
        let pe = cx.scalar(p, dtype)?;
        v = cx.call("pow", &[Some(a), Some(pe)], &[])?;
    }
    let fill = if how == Combine::Max {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    let v = pad_for(cx, v, dims, &outs, &spatial, fill)?;
    let mut acc: Option<ValueId> = None;
    for t in 0..taps {
        let s = tap_slice(cx, v, dims, &outs, &tap_offsets(dims, t))?;
        let op = if how == Combine::Max {
            "maximum"
        } else {
            "add"
        };
        acc = Some(match acc {
            None => s,
            Some(a) => cx.call(op, &[Some(a), Some(s)], &[])?,
        });
    }
    let Some(acc) = acc else {
        bail!(Value, "a pooling window without taps");
    };
    match how {
        Combine::Max => Ok(acc),
        Combine::Lp(p) => {
            let inv = cx.scalar(1.0 / p, dtype)?;
            cx.call("pow", &[Some(acc), Some(inv)], &[])
        }
        Combine::Mean { include_pad } => {
            let per_dim: Vec<Vec<i64>> = dims
                .iter()
                .zip(&spatial)
                .zip(&outs)
                .map(|((d, &n), &o)| (0..o).map(|j| d.count(j, n, include_pad)).collect())
                .collect();
            let total = outs
                .iter()
                .try_fold(1usize, |n, &o| n.checked_mul(o as usize));
            let total = super::import_elems(total, "the pooling counts")?;
            let mut counts = Vec::with_capacity(total);
            for flat in 0..total {
                let mut rem = flat;
                let mut c = 1.0f64;
                for (i, &o) in outs.iter().enumerate().rev() {
                    c *= per_dim[i][rem % o as usize] as f64;
                    rem /= o as usize;
                }
                counts.push(c.max(1.0));
            }
            let shape: Vec<usize> = outs.iter().map(|&o| o as usize).collect();
            let t = Tensor::from_vec(counts, &shape)?.to_dtype(dtype)?;
            let c = cx.tensor(&t)?;
            cx.call("div", &[Some(acc), Some(c)], &[])
        }
    }
}

/// Max pooling with the position of each maximum: a flat index over the input (the plane's
/// offset `(n * C + c) * H * W` plus the spatial position, row-major, or column-major when
/// `col_major`), the first of equal maxima in window order.
pub(super) fn max_with_indices(
    cx: &mut Cx,
    x: ValueId,
    dims: &[Dim],
    ceil: bool,
    col_major: bool,
) -> Result<(ValueId, ValueId)> {
    let shape = cx.shape(x);
    let (spatial, taps, outs) = geometry(cx, x, dims, ceil)?;
    let total = outs
        .iter()
        .try_fold(1usize, |n, &o| n.checked_mul(o as usize));
    let total = super::import_elems(
        total.and_then(|t| t.checked_mul(taps)),
        "the pooling indices",
    )? / taps;
    let v = pad_for(cx, x, dims, &outs, &spatial, f64::NEG_INFINITY)?;
    let out_shape: Vec<usize> = outs.iter().map(|&o| o as usize).collect();
    let mut best: Option<(ValueId, ValueId)> = None;
    for t in 0..taps {
        let offs = tap_offsets(dims, t);
        let s = tap_slice(cx, v, dims, &outs, &offs)?;
        // the input position each output reads at this tap (clamped: a padded tap is -inf)
        let mut pos = Vec::with_capacity(total);
        for flat in 0..total {
            let mut r = flat;
            let mut at = vec![0i64; dims.len()];
            for i in (0..dims.len()).rev() {
                let o = r % outs[i] as usize;
                r /= outs[i] as usize;
                let p = o as i64 * dims[i].stride + offs[i] * dims[i].dilation - dims[i].lo;
                at[i] = p.clamp(0, spatial[i] - 1);
            }
            let (mut index, mut stride) = (0i64, 1i64);
            let order: Vec<usize> = if col_major {
                (0..dims.len()).collect()
            } else {
                (0..dims.len()).rev().collect()
            };
            for i in order {
                index += at[i] * stride;
                stride *= spatial[i];
            }
            pos.push(index);
        }
        let p = cx.tensor(&Tensor::from_vec(pos, &out_shape)?)?;
        best = Some(match best {
            None => (s, p),
            Some((b, bi)) => {
                let better = cx.call("gt", &[Some(s), Some(b)], &[])?;
                (
                    cx.call("where", &[Some(better), Some(s), Some(b)], &[])?,
                    cx.call("where", &[Some(better), Some(p), Some(bi)], &[])?,
                )
            }
        });
    }
    let Some((vals, idx)) = best else {
        bail!(Value, "a pooling window without taps");
    };
    // the plane's offset: (n * C + c) * the plane's size
    let plane: i64 = spatial.iter().product();
    let (n, c) = (shape[0] as i64, shape[1] as i64);
    let planes = cx.call(
        "arange",
        &[],
        &[
            ("start", Attr::Int(0)),
            ("end", Attr::Int(n * c * plane)),
            ("step", Attr::Int(plane.max(1))),
            ("dtype", Attr::DType(crate::DType::I64)),
        ],
    )?;
    let mut pshape = vec![n, c];
    pshape.extend(std::iter::repeat_n(1, dims.len()));
    let planes = cx.call(
        "reshape",
        &[Some(planes)],
        &[("shape", super::list(&pshape))],
    )?;
    let idx = cx.call("add", &[Some(idx), Some(planes)], &[])?;
    Ok((vals, idx))
}
