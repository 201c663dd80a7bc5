//! Shape rules shared by eager tensors and the graph IR: broadcasting, dim wrapping, sizes,
//! and the output shapes and index ranges of views, reductions, `arange` and `matmul`.

use super::dtype::Scalar;
use crate::{Error, Result, bail};

/// A tensor's sizes, outermost dim first.
pub type Shape = Vec<usize>;

/// Number of elements of `shape` (1 for a 0-d shape).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The element count of `shape`, or an error where it overflows (a shape read from a file or
/// a model, before anything is allocated for it).
pub fn checked_numel(shape: &[usize]) -> crate::Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            crate::Error::OutOfMemory(format!(
                "a tensor of shape {shape:?} has more elements than memory can address"
            ))
        })
}

/// Row-major strides of a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc *= shape[i].max(1);
    }
    strides
}

/// Wraps a possibly negative dim into `0..ndim`, with PyTorch's message when out of range.
/// A 0-d tensor accepts dims -1 and 0, as in PyTorch.
pub fn wrap_dim(dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim.max(1) as i64;
    if dim < -n || dim >= n {
        bail!(
            Index,
            "Dimension out of range (expected to be in range of [{}, {}], but got {})",
            -n,
            n - 1,
            dim
        );
    }
    Ok(if dim < 0 {
        (dim + n) as usize
    } else {
        dim as usize
    })
}

/// Wraps a list of dims, refusing repeats ("dim 1 appears multiple times in the list of dims").
pub fn wrap_dims(dims: &[i64], ndim: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        let w = wrap_dim(d, ndim)?;
        if out.contains(&w) {
            bail!(Shape, "dim {w} appears multiple times in the list of dims");
        }
        out.push(w);
    }
    Ok(out)
}

/// The broadcast shape of two shapes, by PyTorch's rule (align trailing dims; equal or 1).
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Shape> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            bail!(
                Shape,
                "The size of tensor a ({da}) must match the size of tensor b ({db}) at non-singleton dimension {i}"
            );
        };
    }
    Ok(out)
}

/// Broadcasts any number of shapes together.
pub fn broadcast_all(shapes: &[&[usize]]) -> Result<Shape> {
    let mut out: Shape = Vec::new();
    for s in shapes {
        out = broadcast_shapes(&out, s)?;
    }
    Ok(out)
}

/// Checks that `from` can be expanded to `to` (the rule of `Tensor.expand`); `-1` in `to`
/// keeps the size.
pub fn expand_shape(from: &[usize], to: &[i64]) -> Result<Shape> {
    if to.len() < from.len() {
        bail!(
            Shape,
            "expand: the number of sizes provided ({}) must be greater or equal to the number of dimensions in the tensor ({})",
            to.len(),
            from.len()
        );
    }
    let lead = to.len() - from.len();
    let mut out = Vec::with_capacity(to.len());
    for (i, &t) in to.iter().enumerate() {
        if i < lead {
            if t < 0 {
                bail!(
                    Shape,
                    "The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension {i}"
                );
            }
            out.push(t as usize);
            continue;
        }
        let f = from[i - lead];
        let t = if t == -1 { f as i64 } else { t };
        if t < 0 {
            bail!(Value, "expand: invalid size {t}");
        }
        let t = t as usize;
        if f != t && f != 1 {
            bail!(
                Shape,
                "The expanded size of the tensor ({t}) must match the existing size ({f}) at non-singleton dimension {i}.  Target sizes: {to:?}.  Tensor sizes: {from:?}"
            );
        }
        out.push(t);
    }
    Ok(out)
}

/// Resolves a requested shape that may hold one `-1` against `numel` elements.
pub fn infer_size(shape: &[i64], numel: usize) -> Result<Shape> {
    let mut infer = None;
    let mut known: usize = 1;
    for (i, &s) in shape.iter().enumerate() {
        if s == -1 {
            if infer.is_some() {
                bail!(Value, "only one dimension can be inferred");
            }
            infer = Some(i);
        } else if s < 0 {
            bail!(Value, "invalid shape dimension {s}");
        } else {
            known = known
                .checked_mul(s as usize)
                .ok_or_else(|| Error::Value(format!("shape {shape:?} is too large")))?;
        }
    }
    let mut out: Shape = shape.iter().map(|&s| s.max(0) as usize).collect();
    match infer {
        Some(i) => {
            if known == 0 || !numel.is_multiple_of(known) {
                bail!(
                    Shape,
                    "shape '{shape:?}' is invalid for input of size {numel}"
                );
            }
            out[i] = numel / known;
        }
        None if known != numel => {
            bail!(
                Shape,
                "shape '{shape:?}' is invalid for input of size {numel}"
            )
        }
        None => {}
    }
    Ok(out)
}

/// The shape left after reducing `dims` (all dims when `None`).
pub fn reduced_shape(shape: &[usize], dims: &[usize], keepdim: bool) -> Shape {
    let mut out = Vec::with_capacity(shape.len());
    for (i, &s) in shape.iter().enumerate() {
        if dims.contains(&i) {
            if keepdim {
                out.push(1);
            }
        } else {
            out.push(s);
        }
    }
    out
}

/// Formats a shape as PyTorch does in messages: `[2, 3]`.
pub fn fmt_shape(shape: &[usize]) -> String {
    format!("{shape:?}")
}

/// Dims a reduction runs over: `None` or an empty list means every dim, as in PyTorch.
pub fn reduction_dims(dim: &Option<Vec<i64>>, ndim: usize) -> Result<Vec<usize>> {
    match dim {
        Some(d) if !d.is_empty() => {
            let mut w = wrap_dims(d, ndim)?;
            if ndim == 0 {
                w.clear();
            }
            Ok(w)
        }
        _ => Ok((0..ndim).collect()),
    }
}

/// Clamps a Python slice bound into `0..=size`.
pub fn slice_bound(v: Option<i64>, default: i64, size: usize) -> usize {
    let size = size as i64;
    let v = v.unwrap_or(default);
    let v = if v < 0 { v + size } else { v };
    v.clamp(0, size) as usize
}

/// Number of elements of `arange(start, end, step)`, with PyTorch's checks.
pub fn arange_len(start: Scalar, end: Scalar, step: Scalar) -> Result<usize> {
    let (s, e, st) = (start.to_f64(), end.to_f64(), step.to_f64());
    if st == 0.0 {
        bail!(Value, "step must be nonzero");
    }
    if !s.is_finite() || !e.is_finite() {
        bail!(Value, "unsupported range: {s} -> {e}");
    }
    if (st > 0.0 && e < s) || (st < 0.0 && e > s) {
        bail!(
            Value,
            "upper bound and larger bound inconsistent with step sign"
        );
    }
    let all_int = !start.is_float() && !end.is_float() && !step.is_float();
    let n = if all_int {
        let (s, e, st) = (start.to_i64(), end.to_i64(), step.to_i64());
        let span = e as i128 - s as i128;
        ((span + st as i128 - st.signum() as i128) / st as i128).max(0) as f64
    } else {
        ((e - s) / st).ceil()
    };
    if n > 1e12 {
        bail!(Value, "arange: {n} elements is too many");
    }
    Ok(n as usize)
}

/// Shape of `permute(dims)`; each dim must appear once.
pub fn permute_shape(shape: &[usize], dims: &[i64]) -> Result<Shape> {
    if dims.len() != shape.len() {
        bail!(
            Shape,
            "permute(sparse_coo): number of dimensions in the tensor input does not match the length of the desired ordering of dimensions i.e. input.dim() = {} is not equal to len(dims) = {}",
            shape.len(),
            dims.len()
        );
    }
    let w = wrap_dims(dims, shape.len()).map_err(|e| match e {
        Error::Shape(_) => Error::Shape("permute(): duplicate dims are not allowed.".into()),
        other => other,
    })?;
    Ok(w.iter().map(|&d| shape[d]).collect())
}

/// Shape of `flatten(start, end)`: dims `start..=end` become one (a 0-d tensor becomes `[1]`).
pub fn flatten_shape(shape: &[usize], start: i64, end: i64) -> Result<Shape> {
    if shape.is_empty() {
        wrap_dim(start, 0)?;
        wrap_dim(end, 0)?;
        return Ok(vec![1]);
    }
    let (s, e) = (wrap_dim(start, shape.len())?, wrap_dim(end, shape.len())?);
    if s > e {
        bail!(
            Value,
            "flatten() has invalid args: start_dim cannot come after end_dim"
        );
    }
    let mut out: Shape = shape[..s].to_vec();
    out.push(shape[s..=e].iter().product());
    out.extend_from_slice(&shape[e + 1..]);
    Ok(out)
}

/// `(dim, start)` of a valid `narrow`.
pub fn narrow_range(shape: &[usize], dim: i64, start: i64, length: i64) -> Result<(usize, usize)> {
    if shape.is_empty() {
        bail!(Shape, "narrow() cannot be applied to a 0-dim tensor.");
    }
    let d = wrap_dim(dim, shape.len())?;
    let size = shape[d] as i64;
    if length < 0 {
        bail!(Value, "narrow(): length must be non-negative.");
    }
    if start < -size || start > size {
        bail!(
            Index,
            "start out of range (expected to be in range of [{}, {}], but got {start})",
            -size,
            size
        );
    }
    let s = if start < 0 { start + size } else { start };
    if s + length > size {
        bail!(
            Index,
            "start ({s}) + length ({length}) exceeds dimension size ({size})."
        );
    }
    Ok((d, s as usize))
}

/// `(dim, index)` of a valid `select`.
pub fn select_index(shape: &[usize], dim: i64, index: i64) -> Result<(usize, usize)> {
    if shape.is_empty() {
        bail!(Index, "select() cannot be applied to a 0-dim tensor.");
    }
    let d = wrap_dim(dim, shape.len())?;
    let size = shape[d] as i64;
    if index < -size || index >= size {
        bail!(
            Index,
            "select(): index {index} out of range for tensor of size {shape:?} at dimension {d}"
        );
    }
    Ok((d, if index < 0 { index + size } else { index } as usize))
}

/// `(dim, start, len)` of `x[start:end:step]` along `dim`.
pub fn slice_range(
    shape: &[usize],
    dim: i64,
    start: Option<i64>,
    end: Option<i64>,
    step: i64,
) -> Result<(usize, usize, usize)> {
    if shape.is_empty() {
        bail!(Index, "slice() cannot be applied to a 0-dim tensor.");
    }
    if step <= 0 {
        bail!(Value, "slice step must be positive");
    }
    let d = wrap_dim(dim, shape.len())?;
    let s = slice_bound(start, 0, shape[d]);
    let e = slice_bound(end, shape[d] as i64, shape[d]).max(s);
    let len = (e - s).div_ceil(step as usize);
    Ok((d, s, len))
}

/// Shape of `diagonal(offset, dim1, dim2)`: the two dims go, the diagonal's length is appended.
pub fn diagonal_shape(shape: &[usize], offset: i64, dim1: i64, dim2: i64) -> Result<Shape> {
    if shape.len() < 2 {
        bail!(Shape, "diagonal(): input must have at least 2 dimensions");
    }
    let (a, b) = (wrap_dim(dim1, shape.len())?, wrap_dim(dim2, shape.len())?);
    if a == b {
        bail!(
            Shape,
            "diagonal dimensions cannot be identical {dim1}, {dim2}"
        );
    }
    let len = diagonal_len(shape[a], shape[b], offset);
    let mut out: Shape = shape
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != a && i != b)
        .map(|(_, &s)| s)
        .collect();
    out.push(len);
    Ok(out)
}

/// Length of the diagonal at `offset` of a `rows × cols` matrix (0 when it misses it).
pub fn diagonal_len(rows: usize, cols: usize, offset: i64) -> usize {
    if offset >= 0 {
        cols.saturating_sub(offset as usize).min(rows)
    } else {
        rows.saturating_sub((-offset) as usize).min(cols)
    }
}

/// Shape of `matmul` of operands of shapes `sa` and `sb`, with PyTorch's rules for 1-D, 2-D
/// and batched operands and the messages of the kernel PyTorch would pick.
pub fn matmul_shape(sa: &[usize], sb: &[usize]) -> Result<Shape> {
    if sa.is_empty() || sb.is_empty() {
        bail!(
            Shape,
            "both arguments to matmul need to be at least 1D, but they are {}D and {}D",
            sa.len(),
            sb.len()
        );
    }
    if sa.len() == 1 && sb.len() == 1 {
        if sa[0] != sb[0] {
            bail!(
                Shape,
                "inconsistent tensor size, expected tensor [{}] and src [{}] to have the same number of elements, but got {} and {} elements respectively",
                sa[0],
                sb[0],
                sa[0],
                sb[0]
            );
        }
        return Ok(vec![]);
    }
    let a2: Shape = if sa.len() == 1 {
        vec![1, sa[0]]
    } else {
        sa.to_vec()
    };
    let b2: Shape = if sb.len() == 1 {
        vec![sb[0], 1]
    } else {
        sb.to_vec()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    let batch = broadcast_shapes(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
    if k != k2 {
        // PyTorch reports the mismatch of the kernel it picks: mm / mv, with the batch of a
        // 3-D+ first operand folded into its rows, else bmm.
        let rows = if sb.len() <= 2 {
            numel(&a2[..a2.len() - 1])
        } else {
            m
        };
        if sb.len() == 1 && sa.len() >= 2 {
            bail!(
                Shape,
                "size mismatch, got input ({rows}), mat ({rows}x{k}), vec ({k2})"
            );
        }
        if sb.len() == 2 {
            bail!(
                Shape,
                "mat1 and mat2 shapes cannot be multiplied ({rows}x{k} and {k2}x{n})"
            );
        }
        bail!(
            Shape,
            "Expected size for first two dimensions of batch2 tensor to be: [{}, {k}] but got: [{}, {k2}].",
            numel(&batch),
            numel(&batch)
        );
    }
    let mut shape = batch;
    if sa.len() > 1 {
        shape.push(m);
    }
    if sb.len() > 1 {
        shape.push(n);
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[3, 1], &[1, 4]).unwrap(), vec![3, 4]);
        assert_eq!(broadcast_shapes(&[5, 3, 1], &[4]).unwrap(), vec![5, 3, 4]);
        assert_eq!(broadcast_shapes(&[], &[2]).unwrap(), vec![2]);
        assert_eq!(broadcast_shapes(&[0], &[1]).unwrap(), vec![0]);
        let e = broadcast_shapes(&[2, 3], &[2, 4]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1"
        );
    }

    #[test]
    fn dims_and_sizes() {
        assert_eq!(wrap_dim(-1, 3).unwrap(), 2);
        assert!(wrap_dim(3, 3).is_err());
        assert_eq!(wrap_dim(-1, 0).unwrap(), 0);
        assert_eq!(infer_size(&[-1, 4], 12).unwrap(), vec![3, 4]);
        assert!(infer_size(&[-1, 5], 12).is_err());
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
    }
}
