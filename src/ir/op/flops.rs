//! `Op::flops`: the arithmetic an op does, as profilers report it.

use super::Op;
use crate::ir::shape::numel;

impl Op {
    /// Arithmetic operations of the op on operands of shapes `inputs` with result shape
    /// `out` (what profilers report): `2·m·n·k` for a matrix product, `2·L·S·(E + Ev)` per
    /// batch for attention, none for a view, one per result element otherwise.
    pub fn flops(&self, inputs: &[&[usize]], out: &[usize]) -> u64 {
        let n = numel(out) as u64;
        let last = |i: usize| inputs.get(i).and_then(|s| s.last()).copied().unwrap_or(1) as u64;
        match self {
            Op::Matmul | Op::Linear { .. } => 2 * n * last(0),
            Op::Attention { .. } => {
                // out is [.., L, Ev]; k is [.., S, E]
                let k = inputs.get(1).copied().unwrap_or(&[]);
                let s = if k.len() >= 2 { k[k.len() - 2] } else { 1 } as u64;
                let ev = out.last().copied().unwrap_or(1).max(1) as u64;
                2 * (n / ev) * s * (last(0) + ev)
            }
            Op::AttentionGrad { .. } => {
                // g is [.., L, Ev], q [.., L, E], k [.., S, E]: five products of the
                // forward's sizes (scores, dP, dV, dQ, dK)
                let (g, q, k) = (
                    inputs.first().copied().unwrap_or(&[]),
                    inputs.get(1).copied().unwrap_or(&[]),
                    inputs.get(2).copied().unwrap_or(&[]),
                );
                let rows = numel(q) as u64 / last(1).max(1);
                let s = if k.len() >= 2 { k[k.len() - 2] } else { 1 } as u64;
                let ev = g.last().copied().unwrap_or(1) as u64;
                let e = last(1);
                2 * rows * s * (3 * e + 2 * ev)
            }
            // per output element, one multiply-add per tap of its input channels
            Op::Conv { .. } => 2 * n * inputs.get(1).map_or(1, |w| numel(&w[1..]) as u64),
            Op::ConvInputGrad { .. } => {
                let g = inputs.first().map_or(0, |g| numel(g)) as u64;
                2 * g * inputs.get(1).map_or(1, |w| numel(&w[1..]) as u64)
            }
            Op::ConvWeightGrad { weight_size, .. } => {
                let g = inputs.first().map_or(0, |g| numel(g)) as u64;
                2 * g * numel(&weight_size[1..]) as u64
            }
            _ if self.is_view() => 0,
            _ => n,
        }
    }
}
