//! The gradients of `scaled_dot_product_attention` with respect to q, k and v in one pass
//! (the FlashAttention backward): per (batch, head), block by block of query rows, the
//! block's probabilities `P` are recomputed from q and k, then
//!
//! - `dV += Pᵀ·dO`, `dP = dO·Vᵀ`, `dS = P ∘ (dP − rowsum(P ∘ dP))`,
//! - `dQ = scale · dS·K` and `dK += scale · dSᵀ·Q`,
//!
//! five small GEMMs on blocks that stay in cache. What a task holds is two `[rows, S]`
//! blocks, so memory is linear in the sequence length, where the same gradients written as
//! matmul and softmax materialise `[batch, L, S]` probabilities and their gradient.
//! `rowsum(P ∘ dP)` equals `rowsum(dO ∘ O)`, so the forward's output is not needed.
//!
//! Batches run in parallel, each writing its own dQ, dK and dV. f64 computes in f64, f32
//! in f32 (as the forward kernel), f16 and bf16 in f32, rounded once. A query row whose
//! every key is masked out (the forward gives zeros) gets no gradient.

use super::attention::{
    Acc, Dims, Job, Mask, ROWS, Rows, RowsKernel, by_dtype, gemm_into, hide, setup, transposed,
};
use crate::Result;
use crate::ir::op::TensorType;
use crate::kernels::native::chains;
use crate::tensor::Tensor;
use rayon::prelude::*;

/// Evaluates the packed gradients of q, k and v over `inputs` (g, q, k, v, and the mask
/// when `has_mask`).
pub fn eval(
    inputs: &[&Tensor],
    has_mask: bool,
    is_causal: bool,
    scale: Option<f64>,
    out: &TensorType,
) -> Result<Tensor> {
    let (g, q, k, v) = (inputs[0], inputs[1], inputs[2], inputs[3]);
    let (d, mask) = setup([q, k, v], has_mask.then(|| inputs[4]), scale, is_causal)?;
    let job = Job {
        mask: mask.as_ref(),
        d: &d,
    };
    by_dtype(
        "scaled_dot_product_attention_backward",
        [g, q, k, v],
        out,
        &job,
    )
}

impl RowsKernel<4> for Job<'_> {
    fn run<A: Acc>(&self, ops: [Rows<'_, A>; 4], out: &mut [A]) {
        run(ops, self.mask, self.d, out)
    }
}

/// dQ, dK and dV of every batch, one after another, into `out`.
fn run<A: Acc>(ops: [Rows<'_, A>; 4], mask: Option<&Mask>, d: &Dims, out: &mut [A]) {
    let (nq, nk) = (d.l * d.e, d.s * d.e);
    let nv = d.s * d.ev;
    let (dq, rest) = out.split_at_mut(d.batch * nq);
    let (dk, dv) = rest.split_at_mut(d.batch * nk);
    // each batch's three slices (some may be empty), handed to its task
    let mut tasks = Vec::with_capacity(d.batch);
    let (mut dq, mut dk, mut dv) = (dq, dk, dv);
    for b in 0..d.batch {
        let (q1, q2) = dq.split_at_mut(nq);
        let (k1, k2) = dk.split_at_mut(nk);
        let (v1, v2) = dv.split_at_mut(nv);
        tasks.push((b, q1, k1, v1));
        (dq, dk, dv) = (q2, k2, v2);
    }
    tasks
        .into_par_iter()
        .for_each(|(b, dq, dk, dv)| batch_grads(&ops, mask, d, b, dq, dk, dv));
}

/// The gradients of batch `b`, block by block of query rows.
fn batch_grads<A: Acc>(
    [g, q, k, v]: &[Rows<'_, A>; 4],
    mask: Option<&Mask>,
    d: &Dims,
    b: usize,
    dq: &mut [A],
    dk: &mut [A],
    dv: &mut [A],
) {
    // dK and dV accumulate over the blocks; dQ rows that see no key stay 0
    dk.fill(A::ZERO);
    dv.fill(A::ZERO);
    let block = ROWS.min(d.l);
    let mut p = vec![A::ZERO; block * d.s];
    let mut dp = vec![A::ZERO; block * d.s];
    let scale = A::from_f64(d.scale);
    // the scaled keys and the values transposed, so that the scores and dP = dO·Vᵀ read
    // their right operands by rows
    let (mut kt, mut vt) = (Vec::new(), Vec::new());
    transposed(k.from(b, 0), (d.s, d.e, k.rs), scale, &mut kt);
    transposed(v.from(b, 0), (d.s, d.ev, v.rs), A::ONE, &mut vt);
    for i0 in (0..d.l).step_by(ROWS) {
        let rows = ROWS.min(d.l - i0);
        // causal rows see keys up to their own index: later keys get no gradient from them
        let end = if d.is_causal { d.s.min(i0 + rows) } else { d.s };
        if end == 0 {
            dq[i0 * d.e..(i0 + rows) * d.e].fill(A::ZERO);
            continue;
        }
        let (p, dp) = (&mut p[..rows * end], &mut dp[..rows * end]);
        if d.e == 0 {
            p.iter_mut().for_each(|x| *x = A::ZERO);
        } else {
            // SAFETY: `gemm_into`'s contract: p holds rows × end (row stride end); q holds `rows`
            // rows of E from row i0 of batch b; kt is the S × E scaled keys, transposed, read
            // for `end <= S` columns.
            unsafe {
                gemm_into(
                    (rows, end, d.e),
                    p,
                    end,
                    false,
                    q.from(b, i0),
                    (q.rs, 1),
                    &kt,
                    (d.s, 1),
                    A::ONE,
                );
            }
        }
        probabilities(p, mask, d, b, i0, end);
        if d.ev == 0 {
            dp.iter_mut().for_each(|x| *x = A::ZERO);
        } else {
            // SAFETY: as above: dp holds rows × end; g holds `rows` rows of Ev from i0; vt is Ev
            // × S, read for `end` columns; dv holds S rows of Ev, of which the first `end` are
            // written; p (rows × end) is read transposed through strides (1, end).
            unsafe {
                gemm_into(
                    (rows, end, d.ev),
                    dp,
                    end,
                    false,
                    g.from(b, i0),
                    (g.rs, 1),
                    &vt,
                    (d.s, 1),
                    A::ONE,
                );
                // dV[..end] += Pᵀ · dO
                gemm_into(
                    (end, d.ev, rows),
                    dv,
                    d.ev,
                    true,
                    p,
                    (1, end),
                    g.from(b, i0),
                    (g.rs, 1),
                    A::ONE,
                );
            }
        }
        // scale · dS = scale · P ∘ (dP − rowsum(P ∘ dP)), in place of dP
        for (pr, dr) in p.chunks_exact(end).zip(dp.chunks_exact_mut(end)) {
            let dot = pr
                .iter()
                .zip(dr.iter())
                .fold(A::ZERO, |a, (&x, &y)| a.add(x.mul(y)));
            for (y, &x) in dr.iter_mut().zip(pr) {
                *y = x.mul(y.sub(dot)).mul(scale);
            }
        }
        if d.e > 0 {
            // SAFETY: as above: dq from row i0 holds `rows` rows of E; dp holds rows × end; k holds
            // S >= end rows of E; dk holds S rows of E, the first `end` written; q holds `rows`
            // rows of E from i0.
            unsafe {
                // dQ = scale · dS · K[..end]
                gemm_into(
                    (rows, d.e, end),
                    &mut dq[i0 * d.e..],
                    d.e,
                    false,
                    dp,
                    (end, 1),
                    k.from(b, 0),
                    (k.rs, 1),
                    A::ONE,
                );
                // dK[..end] += scale · dSᵀ · Q
                gemm_into(
                    (end, d.e, rows),
                    dk,
                    d.e,
                    true,
                    dp,
                    (1, end),
                    q.from(b, i0),
                    (q.rs, 1),
                    A::ONE,
                );
            }
        }
    }
}

/// The block's scores `p` (rows × `end` keys, from query row `i0` of batch `b`) turned
/// into probabilities: masked, causal positions hidden, softmax per row; a row with every
/// key hidden becomes zeros.
fn probabilities<A: Acc>(
    p: &mut [A],
    mask: Option<&Mask>,
    d: &Dims,
    b: usize,
    i0: usize,
    end: usize,
) {
    let max = |a: A, x: A| if x > a { x } else { a };
    for (r, row) in p.chunks_exact_mut(end).enumerate() {
        let i = i0 + r;
        hide(row, mask, d, b, i, 0);
        let m = chains(row, A::NEG_INF, max, max);
        if m != A::NEG_INF {
            row.iter_mut().for_each(|x| *x = x.sub(m));
        }
        // a fully hidden row stays -inf: its exponentials are 0
    }
    A::exp_le0_all(p);
    for row in p.chunks_exact_mut(end) {
        let sum = chains(row, A::ZERO, A::add, A::add);
        if sum != A::ZERO {
            row.iter_mut().for_each(|x| *x = x.div(sum));
        }
    }
}
