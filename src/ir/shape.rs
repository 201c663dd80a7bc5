//! Shape rules shared by eager tensors and the graph IR: broadcasting, dim wrapping, sizes.

use crate::{Error, Result, bail};

pub type Shape = Vec<usize>;

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
