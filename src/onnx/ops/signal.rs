//! Signal windows (`HannWindow`, `HammingWindow`, `BlackmanWindow`): their length is known
//! at import, so each is a constant computed in f64 and rounded once to the output type.

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
