//! Affine index maps: how a kernel's index space reaches each value's multi-index through
//! views, broadcasts and reshapes, and from there a buffer's storage.

use super::{Fail, R};
use crate::Error;
use crate::ir::op::Op;
use crate::ir::shape::{slice_range, wrap_dim, wrap_dims};
use crate::kernel::IndexMap;

/// An affine map from a kernel space to a value's multi-index:
/// `index[k] = off[k] + Σ_d coef[k][d] * i[d]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct AMap {
    pub(super) coef: Vec<Vec<i64>>,
    pub(super) off: Vec<i64>,
}

impl AMap {
    pub(super) fn identity(n: usize) -> AMap {
        let coef = (0..n)
            .map(|k| (0..n).map(|d| (k == d) as i64).collect())
            .collect();
        AMap {
            coef,
            off: vec![0; n],
        }
    }
    pub(super) fn zero_row(&self) -> Vec<i64> {
        vec![0; self.cols()]
    }
    pub(super) fn cols(&self) -> usize {
        self.coef.first().map_or(0, Vec::len)
    }
    /// Through a row-major layout with `strides` and `offset`: an index map into storage.
    pub(super) fn through(&self, strides: &[usize], offset: usize, cols: usize) -> R<IndexMap> {
        let mut st = vec![0i64; cols];
        let mut off = offset as i64;
        for (k, &s) in strides.iter().enumerate() {
            off += s as i64 * self.off[k];
            // a row derived from a 0-d map (which has no rows to count columns by) is empty:
            // it moves along nothing
            for (c, &a) in st.iter_mut().zip(&self.coef[k]) {
                *c += s as i64 * a;
            }
        }
        if off < 0 || st.iter().any(|&s| s < 0) {
            return Err(Fail::Error(Error::Unsupported(
                "fusion: a negative stride in an index map".into(),
            )));
        }
        Ok(IndexMap {
            strides: st.into_iter().map(|s| s as usize).collect(),
            offset: off as usize,
        })
    }
}

/// The map to the index of a view's source (shape `sshape`) given the map `m` to the index
/// of the view (`op`, shape `vshape`) of it.
pub(super) fn view_map(op: &Op, sshape: &[usize], vshape: &[usize], m: &AMap) -> Option<AMap> {
    let nd = sshape.len();
    let z = m.zero_row();
    let mut coef: Vec<Vec<i64>>;
    let mut off: Vec<i64>;
    match op {
        Op::Contiguous => return Some(m.clone()),
        Op::Permute { dims } => {
            let dims = wrap_dims(dims, nd).ok()?;
            coef = vec![z.clone(); nd];
            off = vec![0; nd];
            for (k, &d) in dims.iter().enumerate() {
                coef[d] = m.coef[k].clone();
                off[d] = m.off[k];
            }
        }
        Op::Transpose { dim0, dim1 } => {
            let (a, b) = (wrap_dim(*dim0, nd).ok()?, wrap_dim(*dim1, nd).ok()?);
            (coef, off) = (m.coef.clone(), m.off.clone());
            if nd > 0 {
                coef.swap(a, b);
                off.swap(a, b);
            }
        }
        Op::T => {
            (coef, off) = (m.coef.clone(), m.off.clone());
            coef.reverse();
            off.reverse();
        }
        Op::Expand { .. } => {
            let lead = vshape.len() - nd;
            coef = Vec::new();
            off = Vec::new();
            for j in 0..nd {
                if sshape[j] == vshape[lead + j] {
                    coef.push(m.coef[lead + j].clone());
                    off.push(m.off[lead + j]);
                } else {
                    coef.push(z.clone());
                    off.push(0);
                }
            }
        }
        Op::Unsqueeze { dim } => {
            let d = wrap_dim(*dim, nd + 1).ok()?;
            (coef, off) = (m.coef.clone(), m.off.clone());
            coef.remove(d);
            off.remove(d);
        }
        Op::Narrow { dim, start, .. } => {
            let d = wrap_dim(*dim, nd).ok()?;
            let s = if *start < 0 {
                start + sshape[d] as i64
            } else {
                *start
            };
            (coef, off) = (m.coef.clone(), m.off.clone());
            off[d] += s;
        }
        Op::Select { dim, index } => {
            let d = wrap_dim(*dim, nd).ok()?;
            let i = if *index < 0 {
                index + sshape[d] as i64
            } else {
                *index
            };
            (coef, off) = (m.coef.clone(), m.off.clone());
            coef.insert(d, z.clone());
            off.insert(d, i);
        }
        Op::Slice {
            dim,
            start,
            end,
            step,
        } => {
            let (d, s, _) = slice_range(sshape, *dim, *start, *end, *step).ok()?;
            (coef, off) = (m.coef.clone(), m.off.clone());
            coef[d] = coef[d].iter().map(|c| c * step).collect();
            off[d] = off[d] * step + s as i64;
        }
        Op::Diagonal { offset, dim1, dim2 } => {
            let (a, b) = (wrap_dim(*dim1, nd).ok()?, wrap_dim(*dim2, nd).ok()?);
            let last = vshape.len() - 1;
            coef = vec![z.clone(); nd];
            off = vec![0; nd];
            let mut k = 0;
            for d in 0..nd {
                if d != a && d != b {
                    coef[d] = m.coef[k].clone();
                    off[d] = m.off[k];
                    k += 1;
                }
            }
            coef[a] = m.coef[last].clone();
            coef[b] = m.coef[last].clone();
            off[a] = m.off[last] + if *offset < 0 { -offset } else { 0 };
            off[b] = m.off[last] + if *offset > 0 { *offset } else { 0 };
        }
        Op::Squeeze { .. } | Op::Reshape { .. } | Op::View { .. } | Op::Flatten { .. } => {
            return reshape_map(sshape, vshape, m);
        }
        _ => return None,
    }
    Some(AMap { coef, off })
}

/// The map to an operand of shape `from` broadcast to `to`, given the map `m` to `to`.
pub(super) fn broadcast_map(from: &[usize], to: &[usize], m: &AMap) -> AMap {
    let lead = to.len() - from.len();
    let mut coef = Vec::with_capacity(from.len());
    let mut off = Vec::with_capacity(from.len());
    for (j, &n) in from.iter().enumerate() {
        if n == to[lead + j] {
            coef.push(m.coef[lead + j].clone());
            off.push(m.off[lead + j]);
        } else {
            coef.push(m.zero_row());
            off.push(0);
        }
    }
    AMap { coef, off }
}

/// Through a reshape from `src` to `view`: possible when every dim of `src` larger than one
/// is split into (not merged from) dims of the view; size-1 dims come and go freely.
fn reshape_map(src: &[usize], view: &[usize], m: &AMap) -> Option<AMap> {
    let cols = m.cols();
    let mut coef = Vec::with_capacity(src.len());
    let mut off = Vec::with_capacity(src.len());
    let mut j = 0;
    for &n in src {
        if n == 1 {
            coef.push(vec![0; cols]);
            off.push(0);
            continue;
        }
        // gather view dims until their product is n
        let mut prod = 1usize;
        let mut group = Vec::new();
        while prod < n {
            let &s = view.get(j)?;
            group.push(j);
            prod = prod.checked_mul(s)?;
            j += 1;
        }
        if prod != n {
            return None;
        }
        let mut row = vec![0i64; cols];
        let mut o = 0i64;
        let mut scale = 1i64;
        for &g in group.iter().rev() {
            for (c, r) in row.iter_mut().enumerate() {
                *r += scale * m.coef[g][c];
            }
            o += scale * m.off[g];
            scale *= view[g] as i64;
        }
        coef.push(row);
        off.push(o);
    }
    while j < view.len() {
        if view[j] != 1 {
            return None;
        }
        j += 1;
    }
    Some(AMap { coef, off })
}
