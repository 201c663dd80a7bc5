//! The gradients of the products: `matmul` and `einsum`.

use super::Grads;
use crate::ir::dtype::Scalar;
use crate::ir::graph::ValueId;
use crate::ir::op::{BinaryOp, Op};
use crate::passes::autodiff::graph_builder::Emit;
use crate::{Result, bail};

/// Gradients of `matmul(a, b)` for PyTorch's 1-D, 2-D and batched cases.
pub(super) fn matmul(
    e: &mut Emit,
    a: ValueId,
    b: ValueId,
    g: ValueId,
    na: bool,
    nb: bool,
) -> Result<(Option<ValueId>, Option<ValueId>)> {
    let (ra, rb) = (e.ty(a).ndim(), e.ty(b).ndim());
    let mm = |e: &mut Emit, x, y| e.op(Op::Matmul, &[x, y]);
    let (mut ga, mut gb) = (None, None);
    match (ra, rb) {
        (1, 1) => {
            if na {
                ga = Some(e.mul(g, b)?);
            }
            if nb {
                gb = Some(e.mul(g, a)?);
            }
        }
        (1, _) => {
            let gu = e.unsqueeze(g, -2)?;
            if na {
                let bt = e.transpose_last(b)?;
                let r = mm(e, gu, bt)?;
                ga = Some(e.squeeze(r, -2)?);
            }
            if nb {
                let au = e.unsqueeze(a, -1)?;
                gb = Some(mm(e, au, gu)?);
            }
        }
        (_, 1) => {
            let gu = e.unsqueeze(g, -1)?;
            if na {
                let bu = e.unsqueeze(b, 0)?;
                ga = Some(mm(e, gu, bu)?);
            }
            if nb {
                let at = e.transpose_last(a)?;
                let r = mm(e, at, gu)?;
                gb = Some(e.squeeze(r, -1)?);
            }
        }
        _ => {
            if na {
                let bt = e.transpose_last(b)?;
                ga = Some(mm(e, g, bt)?);
            }
            if nb && rb == 2 {
                // b is shared by a's whole batch (a 3-D activation times a weight): fold the
                // batch into the rows, one [k, rows] · [rows, n] GEMM instead of a batch of
                // products and a sum over it
                let sa = e.shape(a);
                let (rows, k) = (sa[..ra - 1].iter().product::<usize>(), sa[ra - 1]);
                let n = *e.shape(g).last().unwrap_or(&0);
                let a2 = e.reshape(a, &[rows, k])?;
                let g2 = e.reshape(g, &[rows, n])?;
                let at = e.op(Op::T, &[a2])?;
                gb = Some(mm(e, at, g2)?);
            } else if nb {
                let at = e.transpose_last(a)?;
                gb = Some(mm(e, at, g)?);
            }
        }
    }
    Ok((ga, gb))
}

/// Each operand's gradient is another einsum: the result gradient contracted with the other
/// operands onto the operand's subscripts; labels only that operand has are broadcast back.
pub(super) fn einsum(
    e: &mut Emit,
    equation: &str,
    xs: &[ValueId],
    g: ValueId,
    needs: &[bool],
) -> Result<Grads> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    if eq.contains('.') {
        bail!(
            Value,
            "einsum gradient: equations with '...' are not supported ({equation})"
        );
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), r.to_string()),
        None => {
            // Implicit output: the labels used once, in alphabetical order.
            let mut once: Vec<char> = eq
                .chars()
                .filter(|c| c.is_alphabetic() && eq.matches(*c).count() == 1)
                .collect();
            once.sort_unstable();
            (eq.clone(), once.into_iter().collect())
        }
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    let mut out = Vec::with_capacity(xs.len());
    for (i, term) in terms.iter().enumerate() {
        if !needs.get(i).copied().unwrap_or(false) {
            out.push(None);
            continue;
        }
        let all: Vec<char> = term.chars().collect();
        // A repeated subscript reads a diagonal: differentiate with respect to the diagonal
        // (each label once), then place that gradient back on the diagonal below.
        let mut chars: Vec<char> = Vec::new();
        for &c in &all {
            if !chars.contains(&c) {
                chars.push(c);
            }
        }
        let full_shape = e.shape(xs[i]);
        let shape: Vec<usize> = chars
            .iter()
            .map(|c| full_shape[all.iter().position(|a| a == c).unwrap_or(0)])
            .collect();
        let others: Vec<usize> = (0..terms.len()).filter(|&j| j != i).collect();
        let known = |c: &char| rhs.contains(*c) || others.iter().any(|&j| terms[j].contains(*c));
        let kept: String = chars.iter().filter(|c| known(c)).collect();
        let mut parts = vec![rhs.clone()];
        parts.extend(others.iter().map(|&j| terms[j].to_string()));
        let geq = format!("{}->{kept}", parts.join(","));
        let mut operands = vec![g];
        operands.extend(others.iter().map(|&j| xs[j]));
        let r = e.op(Op::Einsum { equation: geq }, &operands)?;
        let missing: Vec<usize> = (0..chars.len()).filter(|&j| !known(&chars[j])).collect();
        let r = if missing.is_empty() {
            r
        } else {
            e.unreduce(r, &shape, &missing)?
        };
        let r = if chars.len() == all.len() {
            r
        } else {
            onto_diagonal(e, r, &chars, &all, &shape, &eq)?
        };
        out.push(Some(r));
    }
    Ok(out)
}

/// `d` (subscripts `uniq`, each label once) placed on the diagonals of an operand with
/// subscripts `all` (some labels repeated): zero off the diagonals. Each repeat of a label
/// becomes a fresh label tied to the first by an identity matrix, in one einsum.
fn onto_diagonal(
    e: &mut Emit,
    d: ValueId,
    uniq: &[char],
    all: &[char],
    shape: &[usize],
    eq: &str,
) -> Result<ValueId> {
    let mut fresh = ('a'..='z')
        .chain('A'..='Z')
        .filter(|c| !eq.contains(*c))
        .collect::<Vec<char>>()
        .into_iter();
    let mut target = String::new();
    let mut terms = vec![uniq.iter().collect::<String>()];
    let mut operands = vec![d];
    let dtype = e.dtype(d);
    for (j, &c) in all.iter().enumerate() {
        if !all[..j].contains(&c) {
            target.push(c);
            continue;
        }
        let Some(f) = fresh.next() else {
            bail!(
                Value,
                "einsum gradient: too many repeated subscripts ({eq})"
            );
        };
        target.push(f);
        terms.push(format!("{c}{f}"));
        let n = shape[uniq.iter().position(|u| *u == c).unwrap_or(0)];
        operands.push(identity(e, n, dtype)?);
    }
    let equation = format!("{}->{target}", terms.join(","));
    e.op(Op::Einsum { equation }, &operands)
}

/// The `n`×`n` identity matrix of `dtype`: `arange(n)[:, None] == arange(n)`.
fn identity(e: &mut Emit, n: usize, dtype: crate::ir::dtype::DType) -> Result<ValueId> {
    let r = e.op(
        Op::Arange {
            start: Scalar::Int(0),
            end: Scalar::Int(n as i64),
            step: Scalar::Int(1),
            dtype: None,
        },
        &[],
    )?;
    let col = e.unsqueeze(r, 1)?;
    let eye = e.bin(BinaryOp::Eq, col, r)?;
    e.cast(eye, dtype)
}
