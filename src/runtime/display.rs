//! `Display` for `Tensor`, printing what PyTorch's `repr` prints (default print options:
//! precision 4, threshold 1000, edgeitems 3, linewidth 80).

use super::access;
use super::device::Device;
use super::element::Element;
use super::tensor::Tensor;
use crate::dispatch;
use crate::ir::dtype::{DEFAULT_FLOAT, DType};
use std::fmt;

const PRECISION: usize = 4;
const THRESHOLD: usize = 1000;
const EDGE: usize = 3;
const LINEWIDTH: usize = 80;
const PREFIX: &str = "tensor(";

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&repr(self))
    }
}

fn repr(t: &Tensor) -> String {
    let indent = PREFIX.len();
    let mut suffixes = Vec::new();
    if t.device() != Device::Cpu {
        suffixes.push(format!("device='{}'", t.device()));
    }
    // a GPU tensor prints its host copy
    let host;
    let t = if t.device() == Device::Cpu {
        t
    } else {
        match t.cpu() {
            Ok(h) => {
                host = h;
                &host
            }
            Err(e) => return format!("tensor(<not readable: {e}>, device='{}')", t.device()),
        }
    };
    let body = if t.numel() == 0 {
        // numpy-style: the shape is shown unless it is (0,); the dtype unless it is the
        // default float (an empty tensor has no values to tell ints apart).
        if t.dim() != 1 {
            suffixes.push(format!("size={}", py_tuple(t.shape())));
        }
        if t.dtype() != DEFAULT_FLOAT {
            suffixes.push(format!("dtype={}", t.dtype().torch_name()));
        }
        "[]".to_string()
    } else {
        if !matches!(t.dtype(), DEFAULT_FLOAT | DType::I64 | DType::Bool) {
            suffixes.push(format!("dtype={}", t.dtype().torch_name()));
        }
        tensor_str(t, indent)
    };
    add_suffixes(format!("{PREFIX}{body}"), &suffixes, indent)
}

fn py_tuple(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|s| s.to_string()).collect();
    match parts.len() {
        1 => format!("({},)", parts[0]),
        _ => format!("({})", parts.join(", ")),
    }
}

/// Appends `, suffix` items, starting a new line where the line would pass the width.
fn add_suffixes(mut s: String, suffixes: &[String], indent: usize) -> String {
    // PyTorch's own count, including its off-by-two when there is no newline.
    let mut last = match s.rfind('\n') {
        Some(p) => s.len() - p + 1,
        None => s.len() + 2,
    };
    for suffix in suffixes {
        if last + suffix.len() + 2 > LINEWIDTH {
            s.push_str(&format!(",\n{}{suffix}", " ".repeat(indent)));
            last = indent + suffix.len();
        } else {
            s.push_str(&format!(", {suffix}"));
            last += suffix.len() + 2;
        }
    }
    s.push(')');
    s
}

/// The bracketed body of a non-empty tensor.
fn tensor_str(t: &Tensor, indent: usize) -> String {
    let summarize = t.numel() > THRESHOLD;
    let elided: Vec<bool> = t
        .shape()
        .iter()
        .map(|&n| summarize && n > 2 * EDGE)
        .collect();
    let kept: Vec<Vec<usize>> = t
        .shape()
        .iter()
        .zip(&elided)
        .map(|(&n, &e)| {
            if e {
                (0..EDGE).chain(n - EDGE..n).collect()
            } else {
                (0..n).collect()
            }
        })
        .collect();
    // Only the shown elements decide the format, as in PyTorch.
    let (cells, width) = format_cells(t, &kept);
    let sizes: Vec<usize> = kept.iter().map(Vec::len).collect();
    nested_str(&cells, &sizes, &elided, indent, width)
}

/// The shown elements in row-major order, formatted and right-aligned to a common width,
/// and that width (PyTorch's, which ignores nan and inf in float tensors).
fn format_cells(t: &Tensor, kept: &[Vec<usize>]) -> (Vec<String>, usize) {
    let mut offsets = vec![0usize];
    for (idx, &stride) in kept.iter().zip(t.strides()) {
        offsets = offsets
            .iter()
            .flat_map(|&o| idx.iter().map(move |&i| o + i * stride))
            .collect();
    }
    let acc = access::lock(&[t], &[]);
    let (floats, ints): (Vec<f64>, Vec<i64>) = dispatch!(t.dtype(), T => {
        let p = acc.read::<T>(0);
        // SAFETY: every offset is a valid index of `t`'s layout, which lies in its storage.
        let vals: Vec<T> = offsets.iter().map(|&o| unsafe { *p.add(o) }).collect();
        if T::DTYPE.is_float() {
            (vals.iter().map(|v| v.to_f64()).collect(), Vec::new())
        } else {
            (Vec::new(), vals.iter().map(|v| v.to_i64()).collect())
        }
    });
    drop(acc);
    let raw: Vec<String> = if t.dtype().is_float() {
        let ff = FloatFormat::new(&floats);
        let strs: Vec<String> = floats.iter().map(|&v| ff.format(v)).collect();
        return (pad(strs, ff.width), ff.width);
    } else if t.dtype() == DType::Bool {
        ints.iter()
            .map(|&v| if v != 0 { "True" } else { "False" }.to_string())
            .collect()
    } else {
        ints.iter().map(i64::to_string).collect()
    };
    let width = raw.iter().map(String::len).max().unwrap_or(1);
    (pad(raw, width), width)
}

fn pad(strs: Vec<String>, width: usize) -> Vec<String> {
    strs.into_iter().map(|s| format!("{s:>width$}")).collect()
}

/// PyTorch's common format of a float tensor: integer mode (`1.`), fixed (`0.1000`) or
/// scientific (`1.0000e+10`), decided from the nonzero finite values.
struct FloatFormat {
    int_mode: bool,
    sci: bool,
    width: usize,
}

impl FloatFormat {
    fn new(vals: &[f64]) -> FloatFormat {
        let nz: Vec<f64> = vals
            .iter()
            .copied()
            .filter(|v| v.is_finite() && *v != 0.0)
            .collect();
        let mut ff = FloatFormat {
            int_mode: true,
            sci: false,
            width: 1,
        };
        if nz.is_empty() {
            return ff;
        }
        let max = nz.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let min = nz.iter().fold(f64::INFINITY, |m, v| m.min(v.abs()));
        ff.int_mode = nz.iter().all(|v| *v == v.ceil());
        let wide = max / min > 1000.0 || max > 1.0e8;
        ff.sci = wide || (!ff.int_mode && min < 1.0e-4);
        ff.width = nz
            .iter()
            .map(|&v| match (ff.sci, ff.int_mode) {
                (true, _) => sci(v).len(),
                (false, true) => format!("{v:.0}").len() + 1,
                (false, false) => format!("{v:.PRECISION$}").len(),
            })
            .max()
            .unwrap_or(1);
        ff
    }

    fn format(&self, v: f64) -> String {
        if !v.is_finite() {
            return non_finite(v).to_string();
        }
        if self.sci {
            sci(v)
        } else if self.int_mode {
            format!("{v:.0}.")
        } else {
            format!("{v:.PRECISION$}")
        }
    }
}

fn non_finite(v: f64) -> &'static str {
    if v.is_nan() {
        "nan"
    } else if v > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}

/// Python's `{:.4e}`: a signed exponent of at least two digits (`1.0000e+10`).
fn sci(v: f64) -> String {
    if !v.is_finite() {
        return non_finite(v).to_string();
    }
    let s = format!("{v:.PRECISION$e}");
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = exp.parse().unwrap_or(0);
    let sign = if e < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", e.abs())
}

/// Brackets the cells of a (kept) shape, with `...` after the first `EDGE` items of each
/// elided dim; `indent` is the column of the opening bracket plus one.
fn nested_str(
    cells: &[String],
    sizes: &[usize],
    elided: &[bool],
    indent: usize,
    width: usize,
) -> String {
    match sizes.len() {
        0 => cells.first().cloned().unwrap_or_default(),
        1 => vector_str(cells, elided[0], indent, width),
        dim => {
            let chunk = cells.len() / sizes[0].max(1);
            let mut slices: Vec<String> = cells
                .chunks(chunk.max(1))
                .map(|c| nested_str(c, &sizes[1..], &elided[1..], indent + 1, width))
                .collect();
            if elided[0] {
                slices.insert(EDGE, "...".to_string());
            }
            let sep = format!(",{}{}", "\n".repeat(dim - 1), " ".repeat(indent + 1));
            format!("[{}]", slices.join(&sep))
        }
    }
}

/// One innermost row, wrapped to the line width as PyTorch wraps it.
fn vector_str(cells: &[String], elided: bool, indent: usize, width: usize) -> String {
    let per_line = (LINEWIDTH.saturating_sub(indent) / (width + 2)).max(1);
    let mut data: Vec<&str> = cells.iter().map(String::as_str).collect();
    if elided {
        data.insert(EDGE, " ...");
    }
    let lines: Vec<String> = data.chunks(per_line).map(|c| c.join(", ")).collect();
    format!(
        "[{}]",
        lines.join(&format!(",\n{}", " ".repeat(indent + 1)))
    )
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
