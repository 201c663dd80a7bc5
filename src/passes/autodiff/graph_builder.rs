//! Small graph-building helpers the gradient rules are written with: each adds one or a few
//! op nodes and returns the new value.

use crate::Result;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::{Graph, ValueId};
use crate::ir::op::{BinaryOp, Op, ReduceOp, TensorType, UnaryOp};

/// Appends nodes to a graph.
pub(crate) struct Emit<'a> {
    pub g: &'a mut Graph,
}

impl Emit<'_> {
    pub fn op(&mut self, op: Op, xs: &[ValueId]) -> Result<ValueId> {
        self.g.add_op(op, xs)
    }
    pub fn ty(&self, v: ValueId) -> TensorType {
        self.g.node(v).ty.clone()
    }
    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.g.node(v).ty.shape.clone()
    }
    pub fn dtype(&self, v: ValueId) -> DType {
        self.g.node(v).ty.dtype
    }
    /// The value of a Python-scalar node, if `v` is one.
    pub fn scalar_value(&self, v: ValueId) -> Option<Scalar> {
        match self.g.node(v).op() {
            Some(Op::Scalar(s)) => Some(*s),
            _ => None,
        }
    }
    pub fn scalar(&mut self, f: f64) -> Result<ValueId> {
        self.g.add_scalar(Scalar::Float(f))
    }
    pub fn unary(&mut self, u: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.op(Op::Unary(u), &[x])
    }
    pub fn bin(&mut self, b: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.op(Op::Binary(b), &[x, y])
    }
    pub fn bin_s(&mut self, b: BinaryOp, x: ValueId, s: f64) -> Result<ValueId> {
        let s = self.scalar(s)?;
        self.bin(b, x, s)
    }
    pub fn add(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.bin(BinaryOp::Add, x, y)
    }
    pub fn sub(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.bin(BinaryOp::Sub, x, y)
    }
    pub fn mul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.bin(BinaryOp::Mul, x, y)
    }
    pub fn div(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.bin(BinaryOp::Div, x, y)
    }
    pub fn neg(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Neg, x)
    }
    pub fn mul_s(&mut self, x: ValueId, s: f64) -> Result<ValueId> {
        self.bin_s(BinaryOp::Mul, x, s)
    }
    pub fn add_s(&mut self, x: ValueId, s: f64) -> Result<ValueId> {
        self.bin_s(BinaryOp::Add, x, s)
    }
    /// `s - x`.
    pub fn rsub_s(&mut self, s: f64, x: ValueId) -> Result<ValueId> {
        let s = self.scalar(s)?;
        self.sub(s, x)
    }
    /// A tensor of `shape` filled with `value`.
    pub fn full(&mut self, shape: &[usize], value: f64, dtype: DType) -> Result<ValueId> {
        self.op(
            Op::Full {
                size: shape.to_vec(),
                fill_value: Scalar::Float(value),
                dtype: Some(dtype),
            },
            &[],
        )
    }
    pub fn zeros_like(&mut self, x: ValueId) -> Result<ValueId> {
        let t = self.ty(x);
        self.full(&t.shape, 0.0, t.dtype)
    }
    /// `x` as `dtype` (no node when it already is).
    pub fn cast(&mut self, x: ValueId, dtype: DType) -> Result<ValueId> {
        if self.dtype(x) == dtype {
            return Ok(x);
        }
        self.op(Op::To { dtype }, &[x])
    }
    /// A 0/1 tensor of `dtype` from a bool mask.
    pub fn mask(&mut self, m: ValueId, dtype: DType) -> Result<ValueId> {
        self.op(Op::To { dtype }, &[m])
    }
    /// `where(c, x, 0)`.
    pub fn keep_where(&mut self, c: ValueId, x: ValueId) -> Result<ValueId> {
        let z = self.scalar(0.0)?;
        self.op(Op::Where, &[c, x, z])
    }
    pub fn reshape(&mut self, x: ValueId, shape: &[usize]) -> Result<ValueId> {
        if self.shape(x) == shape {
            return Ok(x);
        }
        let shape = shape.iter().map(|&d| d as i64).collect();
        self.op(Op::Reshape { shape }, &[x])
    }
    pub fn expand(&mut self, x: ValueId, shape: &[usize]) -> Result<ValueId> {
        if self.shape(x) == shape {
            return Ok(x);
        }
        let size = shape.iter().map(|&d| d as i64).collect();
        self.op(Op::Expand { size }, &[x])
    }
    /// Sum over `dims` (must not be empty), keeping them as size 1 when `keepdim`.
    pub fn sum_dims(&mut self, x: ValueId, dims: &[usize], keepdim: bool) -> Result<ValueId> {
        self.reduce(ReduceOp::Sum, x, dims, keepdim)
    }
    pub fn reduce(
        &mut self,
        op: ReduceOp,
        x: ValueId,
        dims: &[usize],
        keepdim: bool,
    ) -> Result<ValueId> {
        // All dims as `None`: prod takes at most one explicit dim.
        let dim = if dims.len() == self.ty(x).ndim() {
            None
        } else {
            Some(dims.iter().map(|&d| d as i64).collect())
        };
        self.op(Op::Reduce { op, dim, keepdim }, &[x])
    }
    /// Sums a gradient of a broadcast result back to the operand's `shape`.
    pub fn sum_to(&mut self, x: ValueId, shape: &[usize]) -> Result<ValueId> {
        let from = self.shape(x);
        if from == shape {
            return Ok(x);
        }
        let lead = from.len().saturating_sub(shape.len());
        let dims: Vec<usize> = (0..from.len())
            .filter(|&i| i < lead || (shape[i - lead] == 1 && from[i] != 1))
            .collect();
        let s = if dims.is_empty() {
            x
        } else {
            self.sum_dims(x, &dims, true)?
        };
        self.reshape(s, shape)
    }
    /// Broadcasts the gradient of a reduction over `dims` back to the input's `shape`.
    pub fn unreduce(&mut self, g: ValueId, shape: &[usize], dims: &[usize]) -> Result<ValueId> {
        let kept = keep_shape(shape, dims);
        let r = self.reshape(g, &kept)?;
        self.expand(r, shape)
    }
    /// `x` reshaped to the keepdim shape of a reduction over `dims` of a `shape` tensor.
    pub fn keep(&mut self, x: ValueId, shape: &[usize], dims: &[usize]) -> Result<ValueId> {
        self.reshape(x, &keep_shape(shape, dims))
    }
    pub fn transpose_last(&mut self, x: ValueId) -> Result<ValueId> {
        self.op(Op::Transpose { dim0: -2, dim1: -1 }, &[x])
    }
    pub fn unsqueeze(&mut self, x: ValueId, dim: i64) -> Result<ValueId> {
        self.op(Op::Unsqueeze { dim }, &[x])
    }
    pub fn squeeze(&mut self, x: ValueId, dim: i64) -> Result<ValueId> {
        self.op(
            Op::Squeeze {
                dim: Some(vec![dim]),
            },
            &[x],
        )
    }
    /// `zeros(shape).index_add(dim, arange(start, start + len*step, step), src)`: puts a
    /// strided slice's gradient back into a tensor of the input's shape (for a step of 1, as
    /// the concatenation of zeros, `src` and zeros).
    pub fn place_slice(
        &mut self,
        src: ValueId,
        shape: &[usize],
        dim: usize,
        start: usize,
        step: usize,
    ) -> Result<ValueId> {
        let len = self.shape(src)[dim];
        let dt = self.dtype(src);
        if step == 1 {
            // zeros, `src`, zeros along `dim`: a concatenation fuses with what adds it up
            // (the three slices of a fused projection's weight become one kernel), where an
            // index_add into zeros is a library call each
            let mut parts = Vec::new();
            for size in [start, shape[dim] - start - len] {
                let mut s = shape.to_vec();
                s[dim] = size;
                parts.push((size > 0).then(|| self.full(&s, 0.0, dt)).transpose()?);
            }
            let parts: Vec<ValueId> = [parts[0], Some(src), parts[1]]
                .into_iter()
                .flatten()
                .collect();
            if parts.len() == 1 {
                return Ok(src);
            }
            return self.op(Op::Cat { dim: dim as i64 }, &parts);
        }
        let zeros = self.full(shape, 0.0, dt)?;
        let idx = self.op(
            Op::Arange {
                start: Scalar::Int(start as i64),
                end: Scalar::Int((start + len * step) as i64),
                step: Scalar::Int(step as i64),
                dtype: Some(DType::I64),
            },
            &[],
        )?;
        self.op(Op::IndexAdd { dim: dim as i64 }, &[zeros, idx, src])
    }
}

/// `shape` with the `dims` set to 1.
pub(crate) fn keep_shape(shape: &[usize], dims: &[usize]) -> Vec<usize> {
    let mut s = shape.to_vec();
    for &d in dims {
        if d < s.len() {
            s[d] = 1;
        }
    }
    s
}
