//! A structural key of an [`Op`], for passes that must tell ops apart exactly (CSE, the
//! e-graph). `Op` is only `PartialEq`, since its float attributes compare as floats
//! (`0.0 == -0.0`, `NaN != NaN`): merging `x * 0.0` with `x * -0.0` would change results, and
//! a `NaN` attribute would never equal itself. [`OpKey`] compares, orders and hashes every
//! attribute exactly instead: floats by their bits, captured constants by dtype, shape and
//! bytes.

use super::conv::{ConvAttrs, ConvPadding, PoolAttrs};
use super::dtype::{DType, Scalar};
use super::op::{Op, UnaryOp};
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

/// An op compared, ordered and hashed by its exact structure. The order is total (as egg's
/// `Language` needs) but otherwise arbitrary.
#[derive(Clone, Copy)]
pub struct OpKey<'a>(pub &'a Op);

/// One token of an op's encoding. Variants and `Option`s start with a tag and lists with
/// their length, so equal token sequences mean equal ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Tok<'a> {
    Tag(&'static str),
    Int(i64),
    /// A float, by its bits.
    Bits(u64),
    Str(&'a str),
    Bytes(&'a [u8]),
}

/// Writes tokens to a sink (a hasher, or a list to compare).
struct Enc<'a, 'f>(&'f mut dyn FnMut(Tok<'a>));

impl<'a> Enc<'a, '_> {
    fn tok(&mut self, t: Tok<'a>) {
        (self.0)(t)
    }
    fn tag(&mut self, s: &'static str) {
        self.tok(Tok::Tag(s))
    }
    fn int(&mut self, i: i64) {
        self.tok(Tok::Int(i))
    }
    fn size(&mut self, n: usize) {
        // `as` is one-to-one from usize to i64 (wrapping), which is all a key needs
        self.int(n as i64)
    }
    fn bool(&mut self, b: bool) {
        self.int(b as i64)
    }
    fn float(&mut self, x: f64) {
        self.tok(Tok::Bits(x.to_bits()))
    }
    fn dtype(&mut self, d: DType) {
        self.int(d as i64)
    }
    fn ints(&mut self, v: &[i64]) {
        self.size(v.len());
        for &i in v {
            self.int(i);
        }
    }
    fn sizes(&mut self, v: &[usize]) {
        self.size(v.len());
        for &n in v {
            self.size(n);
        }
    }
    fn opt_int(&mut self, v: Option<i64>) {
        match v {
            None => self.tag("none"),
            Some(i) => {
                self.tag("some");
                self.int(i);
            }
        }
    }
    fn opt_ints(&mut self, v: &Option<Vec<i64>>) {
        match v {
            None => self.tag("none"),
            Some(v) => {
                self.tag("some");
                self.ints(v);
            }
        }
    }
    fn opt_dtype(&mut self, d: Option<DType>) {
        match d {
            None => self.tag("none"),
            Some(d) => {
                self.tag("some");
                self.dtype(d);
            }
        }
    }
    fn scalar(&mut self, s: Scalar) {
        match s {
            Scalar::Bool(b) => {
                self.tag("bool");
                self.bool(b);
            }
            Scalar::Int(i) => {
                self.tag("int");
                self.int(i);
            }
            Scalar::Float(x) => {
                self.tag("float");
                self.float(x);
            }
        }
    }
    fn opt_scalar(&mut self, s: Option<Scalar>) {
        match s {
            None => self.tag("none"),
            Some(s) => {
                self.tag("some");
                self.scalar(s);
            }
        }
    }
    /// A unary op by its name (one per variant) and its attributes as compiled code gets
    /// them (floats as themselves, flags as 0 or 1), which tells its variants apart exactly.
    fn unary(&mut self, u: UnaryOp) {
        self.tag(u.name());
        for c in u.attr_codes() {
            self.float(c);
        }
    }

    /// Every attribute of `op`. The match lists every variant, so a new one must be keyed.
    fn op(&mut self, op: &'a Op) {
        match op {
            Op::Scalar(s) => {
                self.tag("Scalar");
                self.scalar(*s);
            }
            Op::Constant(lit) => {
                self.tag("Constant");
                self.dtype(lit.dtype);
                self.sizes(&lit.shape);
                self.tok(Tok::Bytes(&lit.bytes));
            }
            Op::Full {
                size,
                fill_value,
                dtype,
            } => {
                self.tag("Full");
                self.sizes(size);
                self.scalar(*fill_value);
                self.opt_dtype(*dtype);
            }
            Op::Arange {
                start,
                end,
                step,
                dtype,
            } => {
                self.tag("Arange");
                self.scalar(*start);
                self.scalar(*end);
                self.scalar(*step);
                self.opt_dtype(*dtype);
            }
            Op::Unary(u) => {
                self.tag("Unary");
                self.unary(*u);
            }
            Op::Binary(b) => {
                self.tag("Binary");
                self.int(*b as i64);
            }
            Op::Where => self.tag("Where"),
            Op::Clamp { min, max } => {
                self.tag("Clamp");
                self.opt_scalar(*min);
                self.opt_scalar(*max);
            }
            Op::To { dtype } => {
                self.tag("To");
                self.dtype(*dtype);
            }
            Op::ViewDtype { dtype } => {
                self.tag("ViewDtype");
                self.dtype(*dtype);
            }
            Op::MaskedFill { value } => {
                self.tag("MaskedFill");
                self.scalar(*value);
            }
            Op::Reduce { op, dim, keepdim } => {
                self.tag("Reduce");
                self.int(*op as i64);
                self.opt_ints(dim);
                self.bool(*keepdim);
            }
            Op::ArgMax { dim, keepdim } => {
                self.tag("ArgMax");
                self.opt_int(*dim);
                self.bool(*keepdim);
            }
            Op::ArgMin { dim, keepdim } => {
                self.tag("ArgMin");
                self.opt_int(*dim);
                self.bool(*keepdim);
            }
            Op::Var {
                dim,
                correction,
                keepdim,
            } => {
                self.tag("Var");
                self.opt_ints(dim);
                self.float(*correction);
                self.bool(*keepdim);
            }
            Op::Std {
                dim,
                correction,
                keepdim,
            } => {
                self.tag("Std");
                self.opt_ints(dim);
                self.float(*correction);
                self.bool(*keepdim);
            }
            Op::Cumsum { dim } => {
                self.tag("Cumsum");
                self.int(*dim);
            }
            Op::Softmax { dim } => {
                self.tag("Softmax");
                self.int(*dim);
            }
            Op::LogSoftmax { dim } => {
                self.tag("LogSoftmax");
                self.int(*dim);
            }
            Op::LayerNorm {
                normalized_shape,
                eps,
                has_weight,
                has_bias,
            } => {
                self.tag("LayerNorm");
                self.sizes(normalized_shape);
                self.float(*eps);
                self.bool(*has_weight);
                self.bool(*has_bias);
            }
            Op::Matmul => self.tag("Matmul"),
            Op::Linear { has_bias } => {
                self.tag("Linear");
                self.bool(*has_bias);
            }
            Op::Einsum { equation } => {
                self.tag("Einsum");
                self.tok(Tok::Str(equation));
            }
            Op::Attention {
                has_mask,
                is_causal,
                scale,
            }
            | Op::AttentionGrad {
                has_mask,
                is_causal,
                scale,
            } => {
                self.tag(match op {
                    Op::Attention { .. } => "Attention",
                    _ => "AttentionGrad",
                });
                self.bool(*has_mask);
                self.bool(*is_causal);
                match scale {
                    None => self.tag("none"),
                    Some(s) => {
                        self.tag("some");
                        self.float(s.get());
                    }
                }
            }
            Op::Reshape { shape } => {
                self.tag("Reshape");
                self.ints(shape);
            }
            Op::View { shape } => {
                self.tag("View");
                self.ints(shape);
            }
            Op::Permute { dims } => {
                self.tag("Permute");
                self.ints(dims);
            }
            Op::Transpose { dim0, dim1 } => {
                self.tag("Transpose");
                self.int(*dim0);
                self.int(*dim1);
            }
            Op::T => self.tag("T"),
            Op::Expand { size } => {
                self.tag("Expand");
                self.ints(size);
            }
            Op::Squeeze { dim } => {
                self.tag("Squeeze");
                self.opt_ints(dim);
            }
            Op::Unsqueeze { dim } => {
                self.tag("Unsqueeze");
                self.int(*dim);
            }
            Op::Flatten { start_dim, end_dim } => {
                self.tag("Flatten");
                self.int(*start_dim);
                self.int(*end_dim);
            }
            Op::Narrow { dim, start, length } => {
                self.tag("Narrow");
                self.int(*dim);
                self.int(*start);
                self.int(*length);
            }
            Op::Select { dim, index } => {
                self.tag("Select");
                self.int(*dim);
                self.int(*index);
            }
            Op::Slice {
                dim,
                start,
                end,
                step,
            } => {
                self.tag("Slice");
                self.int(*dim);
                self.opt_int(*start);
                self.opt_int(*end);
                self.int(*step);
            }
            Op::Diagonal { offset, dim1, dim2 } => {
                self.tag("Diagonal");
                self.int(*offset);
                self.int(*dim1);
                self.int(*dim2);
            }
            Op::Contiguous => self.tag("Contiguous"),
            Op::Repeat { repeats } => {
                self.tag("Repeat");
                self.sizes(repeats);
            }
            Op::Cat { dim } => {
                self.tag("Cat");
                self.int(*dim);
            }
            Op::Stack { dim } => {
                self.tag("Stack");
                self.int(*dim);
            }
            Op::Flip { dims } => {
                self.tag("Flip");
                self.ints(dims);
            }
            Op::Tril { diagonal } => {
                self.tag("Tril");
                self.int(*diagonal);
            }
            Op::Triu { diagonal } => {
                self.tag("Triu");
                self.int(*diagonal);
            }
            Op::IndexSelect { dim } => {
                self.tag("IndexSelect");
                self.int(*dim);
            }
            Op::Gather { dim } => {
                self.tag("Gather");
                self.int(*dim);
            }
            Op::Scatter { dim } => {
                self.tag("Scatter");
                self.int(*dim);
            }
            Op::ScatterAdd { dim } => {
                self.tag("ScatterAdd");
                self.int(*dim);
            }
            Op::ScatterReduce { dim, reduce } => {
                self.tag("ScatterReduce");
                self.int(*dim);
                self.tag(reduce.name());
            }
            Op::IndexAdd { dim } => {
                self.tag("IndexAdd");
                self.int(*dim);
            }
            Op::Embedding => self.tag("Embedding"),
            Op::Conv { conv, has_bias } => {
                self.tag("Conv");
                self.conv(conv);
                self.bool(*has_bias);
            }
            Op::ConvInputGrad { conv, input_size } => {
                self.tag("ConvInputGrad");
                self.conv(conv);
                self.sizes(input_size);
            }
            Op::ConvWeightGrad { conv, weight_size } => {
                self.tag("ConvWeightGrad");
                self.conv(conv);
                self.sizes(weight_size);
            }
            Op::MaxPool2d { pool } => {
                self.tag("MaxPool2d");
                self.pool(pool);
            }
            Op::MaxPool2dGrad { pool } => {
                self.tag("MaxPool2dGrad");
                self.pool(pool);
            }
            Op::AvgPool2d {
                pool,
                count_include_pad,
            } => {
                self.tag("AvgPool2d");
                self.pool(pool);
                self.bool(*count_include_pad);
            }
            Op::AvgPool2dGrad {
                pool,
                count_include_pad,
                input_size,
            } => {
                self.tag("AvgPool2dGrad");
                self.pool(pool);
                self.bool(*count_include_pad);
                self.sizes(input_size);
            }
            Op::AdaptiveAvgPool2d { output_size } => {
                self.tag("AdaptiveAvgPool2d");
                self.ints(output_size);
            }
            Op::AdaptiveAvgPool2dGrad { input_size } => {
                self.tag("AdaptiveAvgPool2dGrad");
                self.sizes(input_size);
            }
            Op::BatchNorm(bn) => {
                self.tag("BatchNorm");
                for f in [bn.has_running, bn.has_weight, bn.has_bias, bn.training] {
                    self.bool(f);
                }
                self.float(bn.momentum.get());
                self.float(bn.eps.get());
            }
            Op::AllReduce { op } => {
                self.tag("AllReduce");
                self.tag(op.name());
            }
            Op::Dropout { p, training, seed } => {
                self.tag("Dropout");
                self.float(p.get());
                self.bool(*training);
                self.int(*seed as i64);
            }
            Op::Control(c) => {
                self.tag(c.name());
                if let crate::ir::control::ControlKind::Scan { carries, reverse } = c.kind {
                    self.size(carries);
                    self.bool(reverse);
                }
                // bodies by identity: ops calling one shared body are equal
                self.size(c.bodies.len());
                for b in &c.bodies {
                    self.tok(Tok::Str(&b.0.name));
                    self.size(std::sync::Arc::as_ptr(&b.0) as usize);
                }
            }
            Op::Result { index, ty } => {
                self.tag("Result");
                self.size(*index);
                self.dtype(ty.dtype);
                self.size(ty.shape.len());
                for &d in &ty.shape {
                    self.size(d);
                }
            }
        }
    }

    fn conv(&mut self, c: &ConvAttrs) {
        self.ints(&c.stride);
        match &c.padding {
            ConvPadding::Explicit(p) => {
                self.tag("explicit");
                self.ints(p);
            }
            ConvPadding::Same => self.tag("same"),
            ConvPadding::Valid => self.tag("valid"),
        }
        self.ints(&c.dilation);
        self.int(c.groups);
    }

    fn pool(&mut self, p: &PoolAttrs) {
        for v in [&p.kernel_size, &p.stride, &p.padding, &p.dilation] {
            self.ints(v);
        }
        self.bool(p.ceil_mode);
    }
}

impl<'a> OpKey<'a> {
    fn tokens(&self) -> Vec<Tok<'a>> {
        let mut out = Vec::with_capacity(8);
        Enc(&mut |t| out.push(t)).op(self.0);
        out
    }
}

impl PartialEq for OpKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0) || self.tokens() == other.tokens()
    }
}
impl Eq for OpKey<'_> {}

impl PartialOrd for OpKey<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OpKey<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        if std::ptr::eq(self.0, other.0) {
            return Ordering::Equal;
        }
        self.tokens().cmp(&other.tokens())
    }
}

impl Hash for OpKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Enc(&mut |t| t.hash(state)).op(self.0);
    }
}

/// The op as `Debug` prints it, except a constant, whose bytes are summarised.
impl fmt::Debug for OpKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Op::Constant(lit) => write!(
                f,
                "Constant({:?}, {:?}, {} bytes)",
                lit.dtype,
                lit.shape,
                lit.bytes.len()
            ),
            op => write!(f, "{op:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::op::{BinaryOp, Literal};
    use std::collections::HashSet;
    use std::hash::DefaultHasher;
    use std::sync::Arc;

    fn hash(op: &Op) -> u64 {
        let mut h = DefaultHasher::new();
        OpKey(op).hash(&mut h);
        h.finish()
    }

    fn same(a: &Op, b: &Op) -> bool {
        let eq = OpKey(a) == OpKey(b);
        assert_eq!(eq, OpKey(a).cmp(&OpKey(b)) == Ordering::Equal);
        if eq {
            assert_eq!(hash(a), hash(b));
        }
        eq
    }

    #[test]
    fn floats_compare_by_bits() {
        let s = |x: f64| Op::Scalar(Scalar::Float(x));
        assert!(!same(&s(0.0), &s(-0.0)));
        assert!(same(&s(-0.0), &s(-0.0)));
        assert!(same(&s(f64::NAN), &s(f64::NAN)));
        assert!(!same(&s(f64::NAN), &s(-f64::NAN)));
        assert!(!same(&Op::Scalar(Scalar::Int(1)), &s(1.0)));
        let var = |c: f64| Op::Var {
            dim: None,
            correction: c,
            keepdim: false,
        };
        assert!(same(&var(1.0), &var(1.0)));
        assert!(!same(&var(1.0), &var(0.0)));
    }

    #[test]
    fn attributes_and_lists_are_told_apart() {
        let t = |a, b| Op::Transpose { dim0: a, dim1: b };
        assert!(same(&t(0, 1), &t(0, 1)));
        assert!(!same(&t(0, 1), &t(1, 0)));
        let sq = |d: Option<Vec<i64>>| Op::Squeeze { dim: d };
        assert!(!same(&sq(None), &sq(Some(vec![]))));
        assert!(!same(&sq(Some(vec![0])), &sq(Some(vec![0, 1]))));
        assert!(!same(
            &Op::Binary(BinaryOp::Add),
            &Op::Binary(BinaryOp::Sub)
        ));
        assert!(!same(&Op::Cat { dim: 0 }, &Op::Stack { dim: 0 }));
    }

    #[test]
    fn unary_ops_are_told_apart() {
        let ops: Vec<Op> = UnaryOp::ALL.iter().map(|&u| Op::Unary(u)).collect();
        let keys: HashSet<OpKey> = ops.iter().map(OpKey).collect();
        assert_eq!(keys.len(), ops.len());
    }

    #[test]
    fn constants_compare_by_dtype_shape_and_bytes() {
        let c = |d: DType, shape: Vec<usize>, b: Vec<u8>| {
            Op::Constant(Literal {
                dtype: d,
                shape,
                bytes: Arc::new(b),
            })
        };
        assert!(same(
            &c(DType::U8, vec![3], vec![1, 2, 3]),
            &c(DType::U8, vec![3], vec![1, 2, 3])
        ));
        assert!(!same(
            &c(DType::U8, vec![3], vec![1, 2, 3]),
            &c(DType::U8, vec![3], vec![1, 2, 4])
        ));
        assert!(!same(
            &c(DType::U8, vec![3], vec![1, 2, 3]),
            &c(DType::I8, vec![3], vec![1, 2, 3])
        ));
        assert!(!same(
            &c(DType::U8, vec![3], vec![1, 2, 3]),
            &c(DType::U8, vec![1, 3], vec![1, 2, 3])
        ));
    }
}
