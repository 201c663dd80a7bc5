//! Signal processing: the windows (`HannWindow`, `HammingWindow`, `BlackmanWindow`), whose
//! length is known at import, so each is a constant computed in f64 and rounded once to
//! the output type; and `DFT`, as products with cos/sin matrices built the same way.

use crate::ir::attrs::Attr;
use crate::onnx::import::{Cx, Val};
use crate::onnx::tensor::dtype_of;
use crate::{Result, Tensor, bail};
use std::f64::consts::PI;

/// The window of `size` points whose value at `n` over the period `period` is `f(n / period)`.
fn window(cx: &mut Cx, f: impl Fn(f64) -> f64) -> Result<Vec<Val>> {
    let size = match cx.ints_input(0, "size")?.as_deref() {
        Some([n]) if *n >= 0 => *n as usize,
        other => bail!(
            Value,
            "size should be one non-negative integer, got {other:?}"
        ),
    };
    super::import_elems(Some(size), "the window")?;
    let periodic = cx.int("periodic", 1)? != 0;
    let period = if periodic {
        size as f64
    } else {
        size as f64 - 1.0
    };
    let v: Vec<f64> = (0..size).map(|n| f(n as f64 / period)).collect();
    let dtype = dtype_of(cx.int("output_datatype", 1)? as i32)?;
    let t = Tensor::from_vec(v, &[size])?.to_dtype(dtype)?;
    Ok(vec![Val::known(t)])
}

pub fn hann_window(cx: &mut Cx) -> Result<Vec<Val>> {
    window(cx, |u| (PI * u).sin().powi(2))
}

pub fn hamming_window(cx: &mut Cx) -> Result<Vec<Val>> {
    let alpha = 25.0 / 46.0;
    window(cx, move |u| alpha - (1.0 - alpha) * (2.0 * PI * u).cos())
}

pub fn blackman_window(cx: &mut Cx) -> Result<Vec<Val>> {
    window(cx, |u| {
        0.42 - 0.5 * (2.0 * PI * u).cos() + 0.08 * (4.0 * PI * u).cos()
    })
}

/// `DFT` along one axis as products with cos/sin matrices built at import for the length
/// given: forward, inverse (`1/n`) and, for `inverse` with `onesided`, the real inverse of a
/// half spectrum (each frequency between the ends counted twice). The last axis holds the
/// real part, or the real and imaginary parts.
pub fn dft(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let rank = shape.len() as i64;
    let parts = shape.last().copied().unwrap_or(0);
    if rank < 2 || !(parts == 1 || parts == 2) {
        bail!(
            Value,
            "the input's last axis should hold 1 or 2 parts, got shape {shape:?}"
        );
    }
    let axis = if cx.opset() >= 20 {
        match cx.ints_input(2, "axis")?.as_deref() {
            None => -2,
            Some([a]) => *a,
            Some(other) => bail!(Value, "axis should be one integer, got {other:?}"),
        }
    } else {
        cx.int("axis", 1)?
    };
    let a = super::axis(axis, rank)?;
    if a == rank - 1 {
        bail!(Value, "the transform axis cannot be the last (parts) axis");
    }
    let len = shape[a as usize];
    let inverse = cx.int("inverse", 0)? != 0;
    let onesided = cx.int("onesided", 0)? != 0;
    let n = match cx.ints_input(1, "dft_length")?.as_deref() {
        None => {
            if inverse && onesided {
                2 * len.saturating_sub(1)
            } else {
                len
            }
        }
        Some([m]) if *m > 0 => *m as usize,
        Some(other) => bail!(
            Value,
            "dft_length should be one positive integer, got {other:?}"
        ),
    };
    Ok(vec![Val::node(spectrum(cx, x, a, n, inverse, onesided)?)])
}

/// The DFT of `x` (its last axis holding 1 or 2 parts) along axis `a` (not the last), of
/// length `n`: [`dft`]'s transform, also [`stft`]'s.
fn spectrum(
    cx: &mut Cx,
    x: crate::ir::graph::ValueId,
    a: i64,
    n: usize,
    inverse: bool,
    onesided: bool,
) -> Result<crate::ir::graph::ValueId> {
    let shape = cx.shape(x);
    let rank = shape.len() as i64;
    let parts = shape.last().copied().unwrap_or(0);
    let len = shape[a as usize];
    if n == 0 {
        bail!(Value, "a transform of length 0");
    }
    let real_out = inverse && onesided;
    let k_out = if real_out {
        n
    } else if onesided {
        n / 2 + 1
    } else {
        n
    };
    super::import_elems(
        len.checked_mul(k_out).and_then(|e| e.checked_mul(3)),
        "the DFT matrices",
    )?;
    // cos and sin of 2πtk/n for input index t (rows past the transform length stay zero)
    let (mut cos, mut sin) = (vec![0.0; len * k_out], vec![0.0; len * k_out]);
    let scale = if inverse { 1.0 / n as f64 } else { 1.0 };
    for t in 0..len {
        for k in 0..k_out {
            // irfft: row t is a frequency of the half spectrum, column k a time
            let (freq, time, weight) = if real_out {
                let w = if t == 0 || 2 * t == n { 1.0 } else { 2.0 };
                (t, k, if t <= n / 2 { w } else { 0.0 })
            } else {
                (k, t, if t < n { 1.0 } else { 0.0 })
            };
            let angle = 2.0 * PI * ((freq * time) % n) as f64 / n as f64;
            cos[t * k_out + k] = weight * scale * angle.cos();
            sin[t * k_out + k] = weight * scale * angle.sin();
        }
    }
    // in f64, as the reference (NumPy's FFT) computes: f32 sums of a long signal drift
    let dtype = crate::DType::F64;
    let constant = |cx: &mut Cx, v: Vec<f64>| -> Result<crate::ir::graph::ValueId> {
        let t = Tensor::from_vec(v, &[len, k_out])?.to_dtype(dtype)?;
        cx.tensor(&t)
    };
    let neg_sin: Vec<f64> = sin.iter().map(|s| -s).collect();
    let c = constant(cx, cos)?;
    let s = constant(cx, sin)?;
    let ns = constant(cx, neg_sin)?;
    // the axis last, over the parts-free tensor
    let mut perm: Vec<i64> = (0..rank - 1).filter(|&d| d != a).collect();
    perm.push(a);
    let mut back = vec![0i64; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        back[p as usize] = i as i64;
    }
    let part = |cx: &mut Cx, i: i64| -> Result<crate::ir::graph::ValueId> {
        let p = cx.call(
            "select",
            &[Some(x)],
            &[("dim", Attr::Int(-1)), ("index", Attr::Int(i))],
        )?;
        let p = super::elementwise::cast_to(cx, p, dtype)?;
        cx.call("permute", &[Some(p)], &[("dims", super::list(&perm))])
    };
    let xr = part(cx, 0)?;
    let xi = if parts == 2 { Some(part(cx, 1)?) } else { None };
    let mm =
        |cx: &mut Cx, a: crate::ir::graph::ValueId, b| cx.call("matmul", &[Some(a), Some(b)], &[]);
    let add = |cx: &mut Cx, a, b| cx.call("add", &[Some(a), Some(b)], &[]);
    // forward: re = xr·cos + xi·sin, im = xi·cos - xr·sin; inverse flips the sines' signs
    let (sin_re, sin_im) = if inverse { (ns, s) } else { (s, ns) };
    let mut re = mm(cx, xr, c)?;
    if let Some(xi) = xi {
        let t = mm(cx, xi, sin_re)?;
        re = add(cx, re, t)?;
    }
    let re = cx.call("permute", &[Some(re)], &[("dims", super::list(&back))])?;
    let out = if real_out {
        cx.call("unsqueeze", &[Some(re)], &[("dim", Attr::Int(-1))])?
    } else {
        let mut im = mm(cx, xr, sin_im)?;
        if let Some(xi) = xi {
            let t = mm(cx, xi, c)?;
            im = add(cx, im, t)?;
        }
        let im = cx.call("permute", &[Some(im)], &[("dims", super::list(&back))])?;
        cx.call("stack", &[Some(re), Some(im)], &[("dim", Attr::Int(-1))])?
    };
    super::elementwise::cast_to(cx, out, cx.dtype(x))
}

/// `STFT`: frames of `frame_length` every `frame_step` samples (one `index_select`), each
/// multiplied by the window and transformed by [`spectrum`] (one-sided by default).
pub fn stft(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let [batch, length, parts] = shape[..] else {
        bail!(
            Value,
            "the signal should be [batch, length, 1 or 2], got {shape:?}"
        );
    };
    if !(parts == 1 || parts == 2) {
        bail!(
            Value,
            "the signal's last axis should hold 1 or 2 parts, got {parts}"
        );
    }
    let step = match cx.ints_input(1, "frame_step")?.as_deref() {
        Some([s]) if *s > 0 => *s as usize,
        other => bail!(
            Value,
            "frame_step should be one positive integer, got {other:?}"
        ),
    };
    let window = cx.opt(2)?;
    let frame = match (cx.ints_input(3, "frame_length")?.as_deref(), window) {
        (Some([f]), _) if *f > 0 => *f as usize,
        (Some(other), _) => bail!(
            Value,
            "frame_length should be one positive integer, got {other:?}"
        ),
        (None, Some(w)) => cx.shape(w).first().copied().unwrap_or(0),
        (None, None) => length,
    };
    if let Some(w) = window
        && cx.shape(w) != [frame]
    {
        bail!(Value, "the window {:?} should be [{frame}]", cx.shape(w));
    }
    if frame == 0 || frame > length {
        bail!(Value, "frames of {frame} samples in a signal of {length}");
    }
    let onesided = cx.int("onesided", 1)? != 0;
    if onesided && parts == 2 {
        bail!(Value, "a complex signal has no one-sided transform");
    }
    let frames = (length - frame) / step + 1;
    super::import_elems(frames.checked_mul(frame), "the frame index")?;
    let index: Vec<i64> = (0..frames)
        .flat_map(|f| (0..frame).map(move |t| (f * step + t) as i64))
        .collect();
    let index = cx.tensor(&Tensor::from_vec(index, &[frames * frame])?)?;
    let picked = cx.call(
        "index_select",
        &[Some(x), Some(index)],
        &[("dim", Attr::Int(1))],
    )?;
    let dims = [batch, frames, frame, parts].map(|d| d as i64);
    let mut framed = cx.call("reshape", &[Some(picked)], &[("shape", super::list(&dims))])?;
    if let Some(w) = window {
        let w = super::elementwise::cast_to(cx, w, cx.dtype(x))?;
        let w = cx.call(
            "reshape",
            &[Some(w)],
            &[("shape", super::list(&[frame as i64, 1]))],
        )?;
        framed = cx.call("mul", &[Some(framed), Some(w)], &[])?;
    }
    Ok(vec![Val::node(spectrum(
        cx, framed, 2, frame, false, onesided,
    )?)])
}
