//! `scaled_dot_product_attention` in one pass over the keys with an online softmax (the
//! FlashAttention recurrence): per (batch, head) and block of query rows, keys and values
//! are read block by block, each row keeps its running maximum, its running sum of
//! exponentials and its weighted sum of values, so the `[L, S]` score matrix never exists
//! and memory stays linear in the sequence length. Rows run in parallel.
//!
//! f64 inputs compute in f64; f32 in f32, as PyTorch's CPU kernel; f16 and bf16 compute in
//! f32 and round the result once. A row whose every key is masked out gives zeros.

use super::copy;
use crate::ir::dtype::DType;
use crate::ir::op::TensorType;
use crate::ir::shape::numel;
use crate::runtime::tensor::Tensor;
use crate::{Result, bail};
use rayon::prelude::*;

/// Query rows per parallel task: they share each block of keys while it is in cache.
const ROWS: usize = 16;
/// Keys per block.
const KEYS: usize = 128;

/// Float arithmetic the kernel runs in.
trait Acc: Copy + Send + Sync + PartialOrd + std::fmt::Debug + 'static {
    const ZERO: Self;
    const NEG_INF: Self;
    fn from_f64(x: f64) -> Self;
    fn exp(self) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
}

macro_rules! acc {
    ($t:ty) => {
        impl Acc for $t {
            const ZERO: $t = 0.0;
            const NEG_INF: $t = <$t>::NEG_INFINITY;
            fn from_f64(x: f64) -> $t {
                x as $t
            }
            fn exp(self) -> $t {
                <$t>::exp(self)
            }
            fn add(self, o: $t) -> $t {
                self + o
            }
            fn sub(self, o: $t) -> $t {
                self - o
            }
            fn mul(self, o: $t) -> $t {
                self * o
            }
            fn div(self, o: $t) -> $t {
                self / o
            }
        }
    };
}
acc!(f32);
acc!(f64);

/// Eight partial sums, so that the dot product vectorises without reassociating floats
/// behind the compiler's back.
fn dot<A: Acc>(a: &[A], b: &[A]) -> A {
    let mut part = [A::ZERO; 8];
    let chunks = a.len() / 8;
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            part[l] = part[l].add(ca[l].mul(cb[l]));
        }
    }
    let mut s = A::ZERO;
    for i in chunks * 8..a.len() {
        s = s.add(a[i].mul(b[i]));
    }
    for p in part {
        s = s.add(p);
    }
    s
}

/// The mask's elements.
enum MaskData {
    /// true: takes part.
    Bool(Vec<bool>),
    /// Added to the scores.
    Add(Vec<f64>),
}

/// The mask as the kernel reads it: element (b, i, j) is
/// `data[batch_off[b] + i * row + j * col]`, with stride 0 where it broadcasts.
struct Mask {
    data: MaskData,
    batch_off: Vec<usize>,
    row: usize,
    col: usize,
}

impl Mask {
    /// `mask` broadcast to the scores' shape `[batch_shape.., l, s]`, read in place of its
    /// own (dense) elements: nothing as large as the scores is made.
    fn of(mask: &Tensor, batch_shape: &[usize], l: usize, s: usize) -> Result<Mask> {
        let dense = copy::contiguous(mask)?;
        let mut full: Vec<i64> = batch_shape.iter().map(|&d| d as i64).collect();
        full.extend([l as i64, s as i64]);
        let view = dense.expand(&full)?;
        let st: Vec<usize> = view.strides().to_vec();
        let nb = batch_shape.len();
        let batch_off = (0..numel(batch_shape))
            .map(|mut b| {
                let mut off = 0;
                for d in (0..nb).rev() {
                    off += (b % batch_shape[d]) * st[d];
                    b /= batch_shape[d];
                }
                off + view.storage_offset()
            })
            .collect();
        let values = dense.to_f64_vec();
        let data = if dense.dtype().is_bool() {
            MaskData::Bool(values.iter().map(|&x| x != 0.0).collect())
        } else {
            MaskData::Add(values)
        };
        Ok(Mask {
            data,
            batch_off,
            row: st[nb],
            col: st[nb + 1],
        })
    }

    /// The score `x` of (b, i, j) with the mask applied.
    fn apply<A: Acc>(&self, x: A, b: usize, i: usize, j: usize) -> A {
        let at = self.batch_off[b] + i * self.row + j * self.col;
        match &self.data {
            MaskData::Bool(m) if !m[at] => A::NEG_INF,
            MaskData::Bool(_) => x,
            MaskData::Add(m) => x.add(A::from_f64(m[at])),
        }
    }
}

/// Evaluates attention over `inputs` (q, k, v, and the mask when `has_mask`).
pub fn eval(
    inputs: &[&Tensor],
    has_mask: bool,
    is_causal: bool,
    scale: Option<f64>,
    out: &TensorType,
) -> Result<Tensor> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let n = q.dim();
    let (l, e) = (q.shape()[n - 2], q.shape()[n - 1]);
    let (s, ev) = (k.shape()[n - 2], v.shape()[n - 1]);
    let batch_shape = &q.shape()[..n - 2];
    let batch = numel(batch_shape);
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    let mask = match has_mask {
        true => Some(Mask::of(inputs[3], batch_shape, l, s)?),
        false => None,
    };
    let dims = Dims {
        batch,
        l,
        s,
        e,
        ev,
        scale,
        is_causal,
    };
    let result = match q.dtype() {
        DType::F64 => {
            let (q, k, v) = (dense::<f64>(q)?, dense::<f64>(k)?, dense::<f64>(v)?);
            let o = run(&q, &k, &v, mask.as_ref(), &dims);
            Tensor::from_vec(o, &out.shape)?
        }
        DType::F32 | DType::F16 | DType::BF16 => {
            let (qf, kf, vf) = (dense::<f32>(q)?, dense::<f32>(k)?, dense::<f32>(v)?);
            let o = run(&qf, &kf, &vf, mask.as_ref(), &dims);
            let t = Tensor::from_vec(o, &out.shape)?;
            copy::cast(&t, out.dtype)?
        }
        d => bail!(
            DType,
            "scaled_dot_product_attention: not implemented for '{}'",
            d.scalar_name()
        ),
    };
    Ok(result)
}

/// The elements of `t` as a dense vector of `A` (f32 for halves).
fn dense<A: crate::runtime::Element>(t: &Tensor) -> Result<Vec<A>> {
    let c = copy::contiguous(&copy::cast(t, A::DTYPE)?)?;
    c.with_slice(|x: &[A]| x.to_vec())
}

struct Dims {
    batch: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    scale: f64,
    is_causal: bool,
}

fn run<A: Acc>(q: &[A], k: &[A], v: &[A], mask: Option<&Mask>, d: &Dims) -> Vec<A> {
    let mut out = vec![A::ZERO; d.batch * d.l * d.ev];
    if out.is_empty() || d.ev == 0 {
        return out;
    }
    // per batch its rows, in blocks of ROWS written by one task each
    out.par_chunks_mut(d.l * d.ev)
        .enumerate()
        .for_each(|(b, ob)| {
            ob.par_chunks_mut(ROWS * d.ev)
                .enumerate()
                .for_each(|(blk, o)| rows_of(q, k, v, mask, d, b, blk * ROWS, o));
        });
    out
}

/// Query rows `i0 ..` of batch `b`, as many as `acc` holds, written into `acc`.
#[allow(clippy::too_many_arguments)]
fn rows_of<A: Acc>(
    q: &[A],
    k: &[A],
    v: &[A],
    mask: Option<&Mask>,
    d: &Dims,
    b: usize,
    i0: usize,
    acc: &mut [A],
) {
    let rows = acc.len() / d.ev;
    let scale = A::from_f64(d.scale);
    let mut m = vec![A::NEG_INF; rows];
    let mut sum = vec![A::ZERO; rows];
    let mut scores = [A::ZERO; KEYS];
    let kb = &k[b * d.s * d.e..(b + 1) * d.s * d.e];
    let vb = &v[b * d.s * d.ev..(b + 1) * d.s * d.ev];
    let mut j0 = 0;
    while j0 < d.s {
        let keys = KEYS.min(d.s - j0);
        for r in 0..rows {
            let i = i0 + r;
            // causal: keys j <= i only
            let last = if d.is_causal {
                if i < j0 {
                    continue;
                }
                (i - j0 + 1).min(keys)
            } else {
                keys
            };
            let qi = &q[(b * d.l + i) * d.e..(b * d.l + i + 1) * d.e];
            let mut block_max = A::NEG_INF;
            for (jj, sc) in scores.iter_mut().enumerate().take(last) {
                let j = j0 + jj;
                let mut x = dot(qi, &kb[j * d.e..(j + 1) * d.e]).mul(scale);
                if let Some(mk) = mask {
                    x = mk.apply(x, b, i, j);
                }
                *sc = x;
                if x > block_max {
                    block_max = x;
                }
            }
            if block_max == A::NEG_INF {
                continue;
            }
            let new_m = if block_max > m[r] { block_max } else { m[r] };
            let a_row = &mut acc[r * d.ev..(r + 1) * d.ev];
            if m[r] != A::NEG_INF && new_m != m[r] {
                let corr = m[r].sub(new_m).exp();
                sum[r] = sum[r].mul(corr);
                for a in a_row.iter_mut() {
                    *a = a.mul(corr);
                }
            }
            m[r] = new_m;
            for (jj, &sc) in scores.iter().enumerate().take(last) {
                if sc == A::NEG_INF {
                    continue;
                }
                let p = sc.sub(new_m).exp();
                sum[r] = sum[r].add(p);
                let vj = &vb[(j0 + jj) * d.ev..(j0 + jj + 1) * d.ev];
                for (a, &x) in a_row.iter_mut().zip(vj) {
                    *a = a.add(p.mul(x));
                }
            }
        }
        j0 += keys;
    }
    for r in 0..rows {
        let a_row = &mut acc[r * d.ev..(r + 1) * d.ev];
        if sum[r] == A::ZERO {
            // every key masked out
            a_row.iter_mut().for_each(|a| *a = A::ZERO);
        } else {
            for a in a_row.iter_mut() {
                *a = a.div(sum[r]);
            }
        }
    }
}
