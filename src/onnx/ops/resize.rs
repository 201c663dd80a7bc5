//! `Resize` and `Upsample`. The output sizes are known at import, so each resized axis is
//! planned in Rust exactly as the ONNX reference does (source coordinate, neighbours, kernel
//! weights) and lowered to an `index_select` of constant indices followed, unless every
//! output takes a single source element, by a weighted sum with constant weights. The axes
//! are resized one after the other (the interpolation is separable).

use super::axis;
use super::elementwise::cast_to;
use super::list;
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, Tensor, bail};

/// How one axis is interpolated.
struct Spec {
    /// `nearest`, `linear` or `cubic`.
    mode: String,
    coord: String,
    nearest: String,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f64,
    antialias: bool,
}

impl Spec {
    /// The opset ≤ 10 form (`Upsample`, `Resize`-10): asymmetric coordinates, nearest
    /// rounding down.
    fn legacy(cx: &Cx) -> Result<Spec> {
        let mode = cx.string("mode")?.unwrap_or_else(|| "nearest".into());
        let mode = match mode.as_str() {
            "bilinear" | "trilinear" => "linear".to_string(),
            _ => mode,
        };
        Ok(Spec {
            mode,
            coord: "asymmetric".into(),
            nearest: "floor".into(),
            cubic_a: -0.75,
            exclude_outside: false,
            extrapolation: 0.0,
            antialias: false,
        })
    }

    fn check(&self) -> Result<()> {
        if !matches!(self.mode.as_str(), "nearest" | "linear" | "cubic") {
            bail!(
                Value,
                "mode '{}' is not one of nearest, linear, cubic",
                self.mode
            );
        }
        if !matches!(
            self.coord.as_str(),
            "half_pixel"
                | "half_pixel_symmetric"
                | "pytorch_half_pixel"
                | "align_corners"
                | "asymmetric"
                | "tf_crop_and_resize"
        ) {
            bail!(
                Value,
                "coordinate_transformation_mode '{}' is not supported",
                self.coord
            );
        }
        if !matches!(
            self.nearest.as_str(),
            "round_prefer_floor" | "round_prefer_ceil" | "floor" | "ceil"
        ) {
            bail!(Value, "nearest_mode '{}' is not supported", self.nearest);
        }
        if self.antialias && self.mode == "nearest" {
            bail!(Value, "antialias is not supported with mode 'nearest'");
        }
        Ok(())
    }

    /// The kernel weights of a source coordinate whose distance to the pixel on its left is
    /// `ratio` (in (0, 1]), for an axis scaled by `scale`.
    fn coeffs(&self, ratio: f64, scale: f64) -> Vec<f64> {
        let a = self.cubic_a;
        match (self.mode.as_str(), self.antialias) {
            ("nearest", _) => {
                let right = if ratio == 1.0 {
                    true
                } else {
                    match self.nearest.as_str() {
                        "round_prefer_floor" => ratio > 0.5,
                        "round_prefer_ceil" => ratio >= 0.5,
                        "floor" => false,
                        _ => true,
                    }
                };
                if right {
                    vec![0.0, 1.0]
                } else {
                    vec![1.0, 0.0]
                }
            }
            ("linear", false) => vec![1.0 - ratio, ratio],
            ("linear", true) => {
                let s = scale.min(1.0);
                let start = (-1.0 / s).floor() as i64 + 1;
                let c: Vec<f64> = (start..start + 2 - 2 * start)
                    .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                    .collect();
                normalized(c)
            }
            (_, false) => {
                let (r, q) = (ratio, 1.0 - ratio);
                vec![
                    ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                    ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                ]
            }
            (_, true) => {
                let s = scale.min(1.0);
                let start = (-2.0 / s).floor() as i64 + 1;
                let c: Vec<f64> = (start..2 - start)
                    .map(|i| {
                        let x = (s * (i as f64 - ratio)).abs();
                        let (x2, x3) = (x * x, x * x * x);
                        if x <= 1.0 {
                            (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
                        } else if x < 2.0 {
                            a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
                        } else {
                            0.0
                        }
                    })
                    .collect();
                normalized(c)
            }
        }
    }
}

fn normalized(c: Vec<f64>) -> Vec<f64> {
    let s: f64 = c.iter().sum();
    c.into_iter().map(|v| v / s).collect()
}

/// One resized axis: for each output position, `n` source indices and their weights, and
/// the positions that take the extrapolation value (`tf_crop_and_resize`).
struct Plan {
    n: usize,
    idx: Vec<i64>,
    w: Vec<f64>,
    outside: Vec<bool>,
}

/// Plans an axis of `input` elements resized to `out` by `scale` (`roi`: its region of
/// interest, for `tf_crop_and_resize`).
fn plan(
    spec: &Spec,
    input: usize,
    out: usize,
    scale: f64,
    roi: Option<(f64, f64)>,
) -> Result<Plan> {
    let (inw, outw) = (input as f64, scale * input as f64);
    let mut p = Plan {
        n: 0,
        idx: Vec::new(),
        w: Vec::new(),
        outside: Vec::new(),
    };
    for y in 0..out {
        let y = y as f64;
        let mut outside = false;
        let x = match spec.coord.as_str() {
            "align_corners" if outw == 1.0 => 0.0,
            "align_corners" => y * (inw - 1.0) / (outw - 1.0),
            "asymmetric" => y / scale,
            "tf_crop_and_resize" => {
                let Some((r0, r1)) = roi else {
                    bail!(Value, "tf_crop_and_resize needs the roi input");
                };
                // the reference takes these differences in f32
                let span = (r1 as f32 - r0 as f32) as f64;
                let x = if outw == 1.0 {
                    span * (inw - 1.0) / 2.0
                } else {
                    y * span * (inw - 1.0) / (outw - 1.0)
                };
                let x = x + (r0 as f32 * (input as f32 - 1.0)) as f64;
                outside = x < 0.0 || x > inw - 1.0;
                x
            }
            "pytorch_half_pixel" if outw == 1.0 => -0.5,
            "half_pixel_symmetric" => {
                let adjustment = out as f64 / outw;
                let offset = inw / 2.0 * (1.0 - adjustment);
                offset + (y + 0.5) / scale - 0.5
            }
            _ => (y + 0.5) / scale - 0.5,
        };
        let ratio = if x == x.floor() { 1.0 } else { x - x.floor() };
        let mut c = spec.coeffs(ratio, scale);
        let n = c.len();
        p.n = n;
        // the n neighbours nearest to x, ties going to the smaller index
        let pad = n.div_ceil(2) as i64;
        let xp = x + pad as f64;
        let pp = xp.floor();
        let frac = xp - pp;
        let half = (n / 2) as i64;
        let off = if n.is_multiple_of(2) {
            if frac == 0.0 { -half } else { 1 - half }
        } else {
            let base = -(((n - 1) / 2) as i64);
            if frac <= 0.5 { base } else { base + 1 }
        };
        let start = pp as i64 + off - pad;
        let idx: Vec<i64> = (0..n as i64).map(|k| start + k).collect();
        if spec.exclude_outside {
            for (ci, &i) in c.iter_mut().zip(&idx) {
                if i < 0 || i >= input as i64 {
                    *ci = 0.0;
                }
            }
            let s: f64 = c.iter().sum();
            let s = if s == 0.0 { 1.0 } else { s };
            c.iter_mut().for_each(|v| *v /= s);
        }
        if outside {
            c.iter_mut().for_each(|v| *v = 0.0);
        }
        p.idx
            .extend(idx.iter().map(|&i| i.clamp(0, input as i64 - 1)));
        p.w.extend(c);
        p.outside.push(outside);
    }
    Ok(p)
}

/// `x` resized along `ax` as `p` says.
fn apply(cx: &mut Cx, x: ValueId, ax: usize, p: &Plan, extrapolation: f64) -> Result<ValueId> {
    let shape = cx.shape(x);
    let r = shape.len();
    let out = p.outside.len();
    let trailing = vec![1usize; r - ax - 1];
    let select = |cx: &mut Cx, idx: Vec<i64>| -> Result<ValueId> {
        let n = idx.len();
        let i = cx.tensor(&Tensor::from_vec(idx, &[n])?)?;
        cx.call(
            "index_select",
            &[Some(x), Some(i)],
            &[("dim", Attr::Int(ax as i64))],
        )
    };
    // every output one source element: a plain selection (exact for any dtype)
    let one_hot = !p.outside.iter().any(|&o| o)
        && p.w
            .chunks(p.n)
            .all(|c| c.iter().all(|&v| v == 0.0 || v == 1.0) && c.iter().sum::<f64>() == 1.0);
    if one_hot {
        let idx =
            p.w.chunks(p.n)
                .zip(p.idx.chunks(p.n))
                .map(|(w, i)| i[w.iter().position(|&v| v == 1.0).unwrap_or(0)])
                .collect();
        return select(cx, idx);
    }
    let dt = cx.dtype(x);
    let g = select(cx, p.idx.clone())?;
    let g = if dt.is_float() {
        g
    } else {
        cast_to(cx, g, DType::F32)?
    };
    let wdt = cx.dtype(g);
    let mut s: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    s.splice(ax..=ax, [out as i64, p.n as i64]);
    let g = cx.call("reshape", &[Some(g)], &[("shape", list(&s))])?;
    let wshape: Vec<usize> = [out, p.n].iter().chain(&trailing).copied().collect();
    let w = cx.tensor(&Tensor::from_slice(&p.w, &wshape)?.to_dtype(wdt)?)?;
    let m = cx.call("mul", &[Some(g), Some(w)], &[])?;
    let mut y = cx.call(
        "sum",
        &[Some(m)],
        &[
            ("dim", list(&[ax as i64 + 1])),
            ("keepdim", Attr::Bool(false)),
        ],
    )?;
    if p.outside.iter().any(|&o| o) {
        let b: Vec<f64> = p
            .outside
            .iter()
            .map(|&o| if o { extrapolation } else { 0.0 })
            .collect();
        let bshape: Vec<usize> = [out].iter().chain(&trailing).copied().collect();
        let b = cx.tensor(&Tensor::from_slice(&b, &bshape)?.to_dtype(wdt)?)?;
        y = cx.call("add", &[Some(y), Some(b)], &[])?;
    }
    if !dt.is_float() {
        // the reference rounds to the nearest integer and saturates
        y = cx.call("round", &[Some(y)], &[])?;
        let (lo, hi) = int_range(dt);
        y = cx.call(
            "clamp",
            &[Some(y)],
            &[("min", Attr::Float(lo)), ("max", Attr::Float(hi))],
        )?;
        y = cast_to(cx, y, dt)?;
    }
    Ok(y)
}

fn int_range(dt: DType) -> (f64, f64) {
    match dt {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::Bool => (0.0, 1.0),
        _ => (i64::MIN as f64, i64::MAX as f64),
    }
}

/// Resizes `x` along `axes` to `outs`, with the scale factors `scales` (`roi`: per listed
/// axis, for `tf_crop_and_resize`).
fn resize_axes(
    cx: &mut Cx,
    x: ValueId,
    spec: &Spec,
    axes: &[usize],
    scales: &[f64],
    outs: &[usize],
    roi: Option<&[f64]>,
) -> Result<ValueId> {
    spec.check()?;
    let shape = cx.shape(x);
    let k = axes.len();
    let mut y = x;
    for (i, &ax) in axes.iter().enumerate() {
        let (scale, out) = (scales[i], outs[i]);
        if !(scale > 0.0 && scale.is_finite()) {
            bail!(
                Value,
                "the scale of axis {ax} is {scale}, not a positive number"
            );
        }
        if out == 0 {
            bail!(Value, "axis {ax} would be resized to 0 elements");
        }
        let roi = roi.map(|r| (r[i], r[k + i]));
        let plain_roi = roi.is_none_or(|(a, b)| close(a, 0.0) && close(b, 1.0));
        if close(scale, 1.0) && out == shape[ax] && plain_roi {
            continue;
        }
        let p = plan(spec, shape[ax], out, scale, roi)?;
        y = apply(cx, y, ax, &p, spec.extrapolation)?;
    }
    if y == x {
        y = cx.call("contiguous", &[Some(x)], &[])?;
    }
    Ok(y)
}

/// Python's `math.isclose` at its default tolerance.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// Per-dim scale factors → output sizes (rounded down), over all dims.
fn by_scales(cx: &mut Cx, x: ValueId, spec: &Spec, scales: &[f64]) -> Result<Vec<Val>> {
    let shape = cx.shape(x);
    if scales.len() != shape.len() {
        bail!(
            Value,
            "{} scales for an input of rank {}",
            scales.len(),
            shape.len()
        );
    }
    let outs: Vec<usize> = scales
        .iter()
        .zip(&shape)
        .map(|(&s, &d)| (s * d as f64).max(0.0) as usize)
        .collect();
    let axes: Vec<usize> = (0..shape.len()).collect();
    Ok(vec![Val::node(resize_axes(
        cx, x, spec, &axes, scales, &outs, None,
    )?)])
}

pub fn upsample_v7(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let Some(scales) = cx.floats("scales")? else {
        bail!(Value, "attribute 'scales' is required");
    };
    let scales: Vec<f64> = scales.iter().map(|&s| s as f64).collect();
    let spec = Spec::legacy(cx)?;
    by_scales(cx, x, &spec, &scales)
}

/// `Upsample`-9 and `Resize`-10: the scales are input 1.
pub fn upsample(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let Some(scales) = cx.floats_input(1, "scales")? else {
        bail!(Value, "the scales input is required");
    };
    let spec = Spec::legacy(cx)?;
    by_scales(cx, x, &spec, &scales)
}

pub fn resize(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let rank = shape.len();
    let spec = Spec {
        mode: cx.string("mode")?.unwrap_or_else(|| "nearest".into()),
        coord: cx
            .string("coordinate_transformation_mode")?
            .unwrap_or_else(|| "half_pixel".into()),
        nearest: cx
            .string("nearest_mode")?
            .unwrap_or_else(|| "round_prefer_floor".into()),
        cubic_a: cx.float("cubic_coeff_a", -0.75)?,
        exclude_outside: cx.int("exclude_outside", 0)? != 0,
        extrapolation: cx.float("extrapolation_value", 0.0)?,
        antialias: cx.int("antialias", 0)? != 0,
    };
    spec.check()?;
    let axes: Vec<usize> = match cx.ints("axes")? {
        Some(a) => a
            .iter()
            .map(|&d| axis(d, rank as i64).map(|d| d as usize))
            .collect::<Result<_>>()?,
        None => (0..rank).collect(),
    };
    if (1..axes.len()).any(|i| axes[..i].contains(&axes[i])) {
        bail!(Value, "axes {axes:?} repeat an axis");
    }
    let k = axes.len();
    let nonempty = |v: Option<Vec<f64>>| v.filter(|v| !v.is_empty());
    let scales = nonempty(cx.floats_input(2, "scales")?);
    let sizes = cx.ints_input(3, "sizes")?.filter(|v| !v.is_empty());
    // the roi matters to tf_crop_and_resize only (elsewhere it need not be known)
    let roi = if spec.coord == "tf_crop_and_resize" {
        match nonempty(cx.floats_input(1, "roi")?) {
            Some(r) if r.len() == 2 * k => Some(r),
            Some(r) => bail!(Value, "roi has {} entries, expected {}", r.len(), 2 * k),
            None => bail!(Value, "tf_crop_and_resize needs the roi input"),
        }
    } else {
        None
    };
    let (scales, outs): (Vec<f64>, Vec<usize>) = match (scales, sizes) {
        (Some(s), None) => {
            if s.len() != k {
                bail!(Value, "{} scales for {k} axes", s.len());
            }
            let outs = s
                .iter()
                .zip(&axes)
                .map(|(&s, &a)| (s * shape[a] as f64).max(0.0) as usize)
                .collect();
            (s, outs)
        }
        (None, Some(z)) => {
            if z.len() != k {
                bail!(Value, "{} sizes for {k} axes", z.len());
            }
            if z.iter().any(|&v| v <= 0) {
                bail!(Value, "sizes {z:?} must be positive");
            }
            let mut scales: Vec<f64> = z
                .iter()
                .zip(&axes)
                .map(|(&o, &a)| o as f64 / shape[a] as f64)
                .collect();
            let policy = cx
                .string("keep_aspect_ratio_policy")?
                .unwrap_or_else(|| "stretch".into());
            let outs = match policy.as_str() {
                "stretch" => z.iter().map(|&v| v as usize).collect(),
                "not_larger" | "not_smaller" => {
                    let s = if policy == "not_larger" {
                        scales.iter().copied().fold(f64::INFINITY, f64::min)
                    } else {
                        scales.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                    };
                    scales = vec![s; k];
                    axes.iter()
                        .map(|&a| (s * shape[a] as f64 + 0.5) as usize)
                        .collect()
                }
                other => bail!(Value, "keep_aspect_ratio_policy '{other}' is not supported"),
            };
            (scales, outs)
        }
        (Some(_), Some(_)) => bail!(Value, "only one of scales and sizes may be given"),
        (None, None) => bail!(Value, "one of scales and sizes is required"),
    };
    let y = resize_axes(cx, x, &spec, &axes, &scales, &outs, roi.as_deref())?;
    Ok(vec![Val::node(y)])
}

/// `AffineGrid`: the normalised coordinates of every output point (a constant for the size
/// given, `[x, y(, z), 1]` per point) times each batch entry's `theta`.
pub fn affine_grid(cx: &mut Cx) -> Result<Vec<Val>> {
    let theta = cx.x(0)?;
    let Some(size) = cx.ints_input(1, "size")? else {
        bail!(Value, "input 1 (size) is required");
    };
    let align = cx.int("align_corners", 0)? != 0;
    let spatial: Vec<usize> = match size.as_slice() {
        [_, _, rest @ ..]
            if (rest.len() == 2 || rest.len() == 3) && rest.iter().all(|&d| d > 0) =>
        {
            rest.iter().map(|&d| d as usize).collect()
        }
        _ => bail!(
            Value,
            "size should be [N, C, H, W] or [N, C, D, H, W], got {size:?}"
        ),
    };
    let nd = spatial.len();
    let ts = cx.shape(theta);
    if ts.len() != 3 || ts[1] != nd || ts[2] != nd + 1 || ts[0] as i64 != size[0] {
        bail!(
            Value,
            "theta of shape {ts:?} for a {nd}-D grid of batch {}",
            size[0]
        );
    }
    // coordinate k of n points along one axis
    let coord = |k: usize, n: usize| -> f64 {
        if align {
            if n == 1 {
                -1.0
            } else {
                -1.0 + 2.0 * k as f64 / (n - 1) as f64
            }
        } else {
            -1.0 + (2 * k + 1) as f64 / n as f64
        }
    };
    let points = spatial.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let points = super::import_elems(points.and_then(|p| p.checked_mul(nd + 1)), "the base grid")?
        / (nd + 1);
    let mut base = Vec::with_capacity(points * (nd + 1));
    for p in 0..points {
        // row-major index: the last spatial axis varies fastest and is x
        let mut rem = p;
        let mut idx = vec![0; nd];
        for a in (0..nd).rev() {
            idx[a] = rem % spatial[a];
            rem /= spatial[a];
        }
        for a in (0..nd).rev() {
            base.push(coord(idx[a], spatial[a]));
        }
        base.push(1.0);
    }
    let dtype = cx.dtype(theta);
    let base = Tensor::from_vec(base, &[points, nd + 1])?.to_dtype(dtype)?;
    let base = cx.tensor(&base)?;
    let tt = cx.call(
        "transpose",
        &[Some(theta)],
        &[("dim0", Attr::Int(1)), ("dim1", Attr::Int(2))],
    )?;
    let g = cx.call("matmul", &[Some(base), Some(tt)], &[])?;
    let mut dims = vec![size[0]];
    dims.extend(spatial.iter().map(|&d| d as i64));
    dims.push(nd as i64);
    Ok(vec![Val::node(cx.call(
        "reshape",
        &[Some(g)],
        &[("shape", list(&dims))],
    )?)])
}
