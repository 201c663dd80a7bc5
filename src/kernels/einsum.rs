//! einsum, lowered to views, sums and batched matmuls: per operand, repeated subscripts
//! become `diagonal` views and subscripts used nowhere else are summed out; operands are then
//! contracted pairwise, left to right, each pair as ONE batched matmul of
//! `[batch, m, k] @ [batch, k, n]`; a final permute puts the output dims in order.

use super::copy::cast_new;
use super::run;
use crate::ir::einsum::EinsumSpec;
use crate::ir::op::{Op, ReduceOp, TensorType};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// An intermediate: a tensor whose dims carry einsum labels.
struct Term {
    t: Tensor,
    labels: Vec<usize>,
}

/// Evaluates `einsum(equation, inputs)`: diagonals and sums per operand, then pairwise batched
/// matmuls.
pub fn eval(equation: &str, inputs: &[&Tensor], out: &TensorType) -> Result<Tensor> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let spec = EinsumSpec::parse(equation, &shapes)?;
    let mut terms = Vec::with_capacity(inputs.len());
    for (x, labels) in inputs.iter().zip(&spec.inputs) {
        terms.push(prepare(x, labels, &spec)?);
    }
    let mut terms = terms.into_iter();
    let mut acc = terms
        .next()
        .ok_or_else(|| Error::Value("einsum(): must provide at least one operand".into()))?;
    let rest: Vec<Term> = terms.collect();
    for (i, b) in rest.iter().enumerate() {
        // labels still needed after this pair: the output's and later operands'
        let later: Vec<usize> = spec
            .output
            .iter()
            .chain(rest[i + 1..].iter().flat_map(|t| t.labels.iter()))
            .copied()
            .collect();
        let a = sum_unneeded(acc, &[&later, &b.labels])?;
        let b = sum_unneeded(
            Term {
                t: b.t.clone(),
                labels: b.labels.clone(),
            },
            &[&later, &a.labels],
        )?;
        acc = contract(a, b, &later)?;
    }
    let acc = sum_unneeded(acc, &[&spec.output])?;
    let perm: Vec<usize> = spec
        .output
        .iter()
        .map(|l| acc.labels.iter().position(|m| m == l))
        .collect::<Option<_>>()
        .ok_or_else(|| Error::Value("einsum(): internal label mismatch".into()))?;
    let r = acc.t.with_layout(acc.t.layout().permute(&perm));
    // einsum returns a new tensor, never a view of an operand
    if inputs.iter().any(|x| x.shares_storage(&r)) || r.dtype() != out.dtype {
        cast_new(&r, out.dtype)
    } else {
        Ok(r)
    }
}

/// Takes diagonals of repeated labels and broadcasts size-1 dims to their label's size.
fn prepare(x: &Tensor, labels: &[usize], spec: &EinsumSpec) -> Result<Term> {
    let mut t = x.clone();
    let mut labels = labels.to_vec();
    while let Some((a, b)) = first_repeat(&labels) {
        // diagonal removes dims a and b and appends their diagonal as the last dim
        t = t.with_layout(t.layout().diagonal(0, a as i64, b as i64)?);
        let l = labels[a];
        labels.remove(b);
        labels.remove(a);
        labels.push(l);
    }
    let full: Vec<usize> = labels.iter().map(|&l| spec.sizes[l]).collect();
    if full != t.shape() {
        t = t.with_layout(t.layout().expand(&full));
    }
    Ok(Term { t, labels })
}

fn first_repeat(labels: &[usize]) -> Option<(usize, usize)> {
    (0..labels.len()).find_map(|b| {
        labels[..b]
            .iter()
            .position(|&l| l == labels[b])
            .map(|a| (a, b))
    })
}

/// Sums out the dims whose labels appear in none of `keep`.
fn sum_unneeded(x: Term, keep: &[&[usize]]) -> Result<Term> {
    let dims: Vec<usize> = (0..x.labels.len())
        .filter(|&d| !keep.iter().any(|k| k.contains(&x.labels[d])))
        .collect();
    if dims.is_empty() {
        return Ok(x);
    }
    let dtype = x.t.dtype();
    let sum = Op::Reduce {
        op: ReduceOp::Sum,
        dim: Some(dims.iter().map(|&d| d as i64).collect()),
        keepdim: false,
    };
    let mut t = run(sum, &[&x.t])?;
    if t.dtype() != dtype {
        // integer sums widen to int64; einsum keeps the operands' dtype
        t = run(Op::To { dtype }, &[&t])?;
    }
    let labels = x
        .labels
        .iter()
        .enumerate()
        .filter(|(d, _)| !dims.contains(d))
        .map(|(_, &l)| l)
        .collect();
    Ok(Term { t, labels })
}

/// Contracts two terms with one batched matmul. Shared labels still needed later are batch
/// dims; shared labels not needed are contracted; the others are rows (a) or columns (b).
fn contract(a: Term, b: Term, later: &[usize]) -> Result<Term> {
    let in_b = |l: &usize| b.labels.contains(l);
    let batch: Vec<usize> = a
        .labels
        .iter()
        .copied()
        .filter(|l| in_b(l) && later.contains(l))
        .collect();
    let k: Vec<usize> = a
        .labels
        .iter()
        .copied()
        .filter(|l| in_b(l) && !later.contains(l))
        .collect();
    let m: Vec<usize> = a.labels.iter().copied().filter(|l| !in_b(l)).collect();
    let n: Vec<usize> = b
        .labels
        .iter()
        .copied()
        .filter(|l| !a.labels.contains(l))
        .collect();
    let size_of = |t: &Term, ls: &[usize]| -> Vec<usize> {
        ls.iter()
            .map(|l| {
                t.labels
                    .iter()
                    .position(|m| m == l)
                    .map_or(1, |d| t.t.shape()[d])
            })
            .collect()
    };
    let prod = |v: &[usize]| v.iter().product::<usize>() as i64;
    let (bs, ms, ks, ns) = (
        size_of(&a, &batch),
        size_of(&a, &m),
        size_of(&a, &k),
        size_of(&b, &n),
    );
    let a3 = arrange(&a, &[&batch, &m, &k], &[prod(&bs), prod(&ms), prod(&ks)])?;
    let b3 = arrange(&b, &[&batch, &k, &n], &[prod(&bs), prod(&ks), prod(&ns)])?;
    let c = run(Op::Matmul, &[&a3, &b3])?;
    let shape: Vec<i64> = bs.iter().chain(&ms).chain(&ns).map(|&s| s as i64).collect();
    let t = run(Op::Reshape { shape }, &[&c])?;
    let labels = batch.into_iter().chain(m).chain(n).collect();
    Ok(Term { t, labels })
}

/// Permutes `x` so its labels follow `groups`, then reshapes to one dim per group.
fn arrange(x: &Term, groups: &[&[usize]], shape: &[i64]) -> Result<Tensor> {
    let perm: Vec<usize> = groups
        .iter()
        .flat_map(|g| g.iter())
        .map(|l| x.labels.iter().position(|m| m == l))
        .collect::<Option<_>>()
        .ok_or_else(|| Error::Value("einsum(): internal label mismatch".into()))?;
    let p = x.t.with_layout(x.t.layout().permute(&perm));
    run(
        Op::Reshape {
            shape: shape.to_vec(),
        },
        &[&p],
    )
}
