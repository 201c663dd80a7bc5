//! `GridSample` (2-D and 3-D; nearest, linear and cubic; zeros, border and reflection
//! padding): each output point's coordinates are computed per spatial dim, and the value
//! is a weighted sum over the kernel's taps, one `gather` from the flattened input per
//! combination of taps, with indices clamped into the input and taps outside it masked.

use super::list;
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, bail};

#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// Elementwise helpers over values of one float dtype.
struct Ops {
    dtype: DType,
}

impl Ops {
    fn k(&self, cx: &mut Cx, v: f64) -> Result<ValueId> {
        cx.scalar(v, self.dtype)
    }
    fn with(&self, cx: &mut Cx, op: &str, a: ValueId, v: f64) -> Result<ValueId> {
        let c = self.k(cx, v)?;
        cx.op(op, &[a, c])
    }
    fn clamp(&self, cx: &mut Cx, a: ValueId, lo: f64, hi: f64) -> Result<ValueId> {
        cx.call(
            "clamp",
            &[Some(a)],
            &[("min", Attr::Float(lo)), ("max", Attr::Float(hi))],
        )
    }

    /// `x` reflected at `lo` and `hi` until it lies between them.
    fn reflect(&self, cx: &mut Cx, x: ValueId, lo: f64, hi: f64) -> Result<ValueId> {
        let span = hi - lo;
        if span <= 0.0 {
            return self.clamp(cx, x, lo, hi);
        }
        // below: d = lo - x; above: d = x - hi; n = floor(d / span); r = d - n * span
        let side = |cx: &mut Cx, d: ValueId, near: f64, far: f64, toward: f64| -> Result<ValueId> {
            let q = self.with(cx, "div", d, span)?;
            let n = cx.op("floor", &[q])?;
            let ns = self.with(cx, "mul", n, span)?;
            let r = cx.op("sub", &[d, ns])?;
            let half = self.with(cx, "remainder", n, 2.0)?;
            let even = self.with(cx, "eq", half, 0.0)?;
            // even: near + toward * r; odd: far - toward * r
            let tr = self.with(cx, "mul", r, toward)?;
            let a = self.with(cx, "add", tr, near)?;
            let nf = self.k(cx, far)?;
            let b = cx.op("sub", &[nf, tr])?;
            cx.op("where", &[even, a, b])
        };
        let nlo = self.k(cx, lo)?;
        let below_d = cx.op("sub", &[nlo, x])?;
        let below = side(cx, below_d, lo, hi, 1.0)?;
        let above_d = self.with(cx, "sub", x, hi)?;
        let above = side(cx, above_d, hi, lo, -1.0)?;
        let is_below = self.with(cx, "lt", x, lo)?;
        let is_above = self.with(cx, "gt", x, hi)?;
        let y = cx.op("where", &[is_above, above, x])?;
        cx.op("where", &[is_below, below, y])
    }
}

/// Keys' cubic weights (a = -0.75) of the taps at offsets -1, 0, 1, 2 from `floor(x)`, for
/// `t = x - floor(x)`.
fn cubic_weights(o: &Ops, cx: &mut Cx, t: ValueId) -> Result<[ValueId; 4]> {
    let a = -0.75;
    // near taps (|d| <= 1): (a + 2)|d|^3 - (a + 3)|d|^2 + 1; far (1 < |d| < 2):
    // a|d|^3 - 5a|d|^2 + 8a|d| - 4a
    let near = |cx: &mut Cx, d: ValueId| -> Result<ValueId> {
        let p = o.with(cx, "mul", d, a + 2.0)?;
        let p = o.with(cx, "sub", p, a + 3.0)?;
        let dd = cx.op("mul", &[d, d])?;
        let p = cx.op("mul", &[p, dd])?;
        o.with(cx, "add", p, 1.0)
    };
    let far = |cx: &mut Cx, d: ValueId| -> Result<ValueId> {
        let p = o.with(cx, "mul", d, a)?;
        let p = o.with(cx, "sub", p, 5.0 * a)?;
        let p = cx.op("mul", &[p, d])?;
        let p = o.with(cx, "add", p, 8.0 * a)?;
        let p = cx.op("mul", &[p, d])?;
        o.with(cx, "sub", p, 4.0 * a)
    };
    let t1 = o.with(cx, "add", t, 1.0)?;
    let one = o.k(cx, 1.0)?;
    let u = cx.op("sub", &[one, t])?;
    let two = o.k(cx, 2.0)?;
    let u2 = cx.op("sub", &[two, t])?;
    Ok([far(cx, t1)?, near(cx, t)?, near(cx, u)?, far(cx, u2)?])
}

/// One spatial dim's taps: (integer-valued coordinate, weight) pairs.
type Taps = Vec<(ValueId, Option<ValueId>)>;

pub fn grid_sample(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, grid) = (cx.x(0)?, cx.x(1)?);
    let (xs, gs) = (cx.shape(x), cx.shape(grid));
    let k = xs.len().saturating_sub(2);
    if k == 0 || gs.len() != k + 2 || gs[0] != xs[0] || gs[k + 1] != k {
        bail!(Value, "an input of shape {xs:?} and a grid of shape {gs:?}");
    }
    let mode = cx.string("mode")?.unwrap_or_else(|| "linear".into());
    let padding = match cx.string("padding_mode")?.as_deref().unwrap_or("zeros") {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        other => bail!(Value, "padding_mode '{other}' is not one ONNX defines"),
    };
    let align = cx.int("align_corners", 0)? != 0;
    let dtype = cx.dtype(x);
    if !dtype.is_float() {
        bail!(DType, "GridSample of a {dtype} input");
    }
    let o = Ops { dtype };
    let grid = super::elementwise::cast_to(cx, grid, dtype)?;
    let mut dims_taps: Vec<Taps> = Vec::with_capacity(k);
    let mut bounds = Vec::with_capacity(k);
    for i in 0..k {
        let len = xs[2 + i] as f64;
        let (lo, hi) = if align {
            (0.0, len - 1.0)
        } else {
            (-0.5, len - 0.5)
        };
        bounds.push((lo, hi));
        // grid's last axis lists the coordinates innermost dim first
        let n = cx.call(
            "select",
            &[Some(grid)],
            &[
                ("dim", Attr::Int(-1)),
                ("index", Attr::Int((k - 1 - i) as i64)),
            ],
        )?;
        let n1 = o.with(cx, "add", n, 1.0)?;
        let mut c = if align {
            o.with(cx, "mul", n1, (len - 1.0) / 2.0)?
        } else {
            let s = o.with(cx, "mul", n1, len)?;
            let s = o.with(cx, "sub", s, 1.0)?;
            o.with(cx, "div", s, 2.0)?
        };
        if mode == "nearest" {
            c = cx.op("round", &[c])?;
        }
        c = match padding {
            Padding::Zeros => c,
            Padding::Border => {
                let out = {
                    let a = o.with(cx, "lt", c, lo)?;
                    let b = o.with(cx, "gt", c, hi)?;
                    cx.op("logical_or", &[a, b])?
                };
                let cl = o.clamp(cx, c, 0.0, len - 1.0)?;
                cx.op("where", &[out, cl, c])?
            }
            Padding::Reflection => o.reflect(cx, c, lo, hi)?,
        };
        let taps: Taps = match mode.as_str() {
            "nearest" => vec![(trunc(&o, cx, c)?, None)],
            "linear" | "bilinear" => {
                let f = cx.op("floor", &[c])?;
                let t = cx.op("sub", &[c, f])?;
                let one = o.k(cx, 1.0)?;
                let w0 = cx.op("sub", &[one, t])?;
                let f1 = o.with(cx, "add", f, 1.0)?;
                vec![(f, Some(w0)), (f1, Some(t))]
            }
            "cubic" | "bicubic" => {
                let f = cx.op("floor", &[c])?;
                let t = cx.op("sub", &[c, f])?;
                let w = cubic_weights(&o, cx, t)?;
                let mut v = Vec::with_capacity(4);
                for (j, wj) in w.into_iter().enumerate() {
                    let at = o.with(cx, "add", f, j as f64 - 1.0)?;
                    v.push((at, Some(wj)));
                }
                v
            }
            other => bail!(Value, "mode '{other}' is not one ONNX defines"),
        };
        dims_taps.push(taps);
    }
    // the input as [N, C, P]; each tap combination gathers [N, C, Q]
    let (nb, ch) = (xs[0] as i64, xs[1] as i64);
    let points: i64 = xs[2..].iter().map(|&d| d as i64).product();
    let outs: Vec<i64> = gs[1..=k].iter().map(|&d| d as i64).collect();
    let q: i64 = outs.iter().product();
    let flat_x = cx.call("reshape", &[Some(x)], &[("shape", list(&[nb, ch, points]))])?;
    let combos: usize = dims_taps.iter().map(Vec::len).product();
    let mut acc: Option<ValueId> = None;
    for combo in 0..combos {
        let mut rem = combo;
        let mut flat: Option<ValueId> = None;
        let mut weight: Option<ValueId> = None;
        let mut stride = 1.0;
        for i in (0..k).rev() {
            let taps = &dims_taps[i];
            let (at, w) = taps[rem % taps.len()];
            rem /= taps.len();
            let len = xs[2 + i] as f64;
            let (lo, hi) = bounds[i];
            // where the tap reads: padding decides what lies outside
            let (idx, valid) = match padding {
                Padding::Zeros => {
                    let a = o.with(cx, "ge", at, 0.0)?;
                    let b = o.with(cx, "le", at, len - 1.0)?;
                    (
                        o.clamp(cx, at, 0.0, len - 1.0)?,
                        Some(cx.op("logical_and", &[a, b])?),
                    )
                }
                Padding::Border => (o.clamp(cx, at, 0.0, len - 1.0)?, None),
                Padding::Reflection => {
                    let r = o.reflect(cx, at, lo, hi)?;
                    let r = trunc(&o, cx, r)?;
                    (o.clamp(cx, r, 0.0, len - 1.0)?, None)
                }
            };
            let scaled = o.with(cx, "mul", idx, stride)?;
            flat = Some(match flat {
                None => scaled,
                Some(f) => cx.op("add", &[f, scaled])?,
            });
            let mut wv = w;
            if let Some(v) = valid {
                let m = super::elementwise::cast_to(cx, v, dtype)?;
                wv = Some(match wv {
                    None => m,
                    Some(w) => cx.op("mul", &[w, m])?,
                });
            }
            if let Some(wv) = wv {
                weight = Some(match weight {
                    None => wv,
                    Some(w) => cx.op("mul", &[w, wv])?,
                });
            }
            stride *= len;
        }
        let Some(flat) = flat else {
            bail!(Value, "a grid sample without spatial dims");
        };
        let idx = super::elementwise::cast_to(cx, flat, DType::I64)?;
        let idx = cx.call("reshape", &[Some(idx)], &[("shape", list(&[nb, 1, q]))])?;
        let idx = cx.call("expand", &[Some(idx)], &[("size", list(&[nb, ch, q]))])?;
        let mut v = cx.call(
            "gather",
            &[Some(flat_x), Some(idx)],
            &[("dim", Attr::Int(2))],
        )?;
        if let Some(w) = weight {
            let w = cx.call("reshape", &[Some(w)], &[("shape", list(&[nb, 1, q]))])?;
            v = cx.op("mul", &[v, w])?;
        }
        acc = Some(match acc {
            None => v,
            Some(a) => cx.op("add", &[a, v])?,
        });
    }
    let Some(acc) = acc else {
        bail!(Value, "a grid sample without taps");
    };
    let mut shape = vec![nb, ch];
    shape.extend(&outs);
    Ok(vec![Val::node(cx.call(
        "reshape",
        &[Some(acc)],
        &[("shape", list(&shape))],
    )?)])
}

/// `x` rounded toward zero.
fn trunc(o: &Ops, cx: &mut Cx, x: ValueId) -> Result<ValueId> {
    let f = cx.op("floor", &[x])?;
    let c = cx.op("ceil", &[x])?;
    let neg = o.with(cx, "lt", x, 0.0)?;
    cx.op("where", &[neg, c, f])
}
