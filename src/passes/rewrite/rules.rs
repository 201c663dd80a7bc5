//! The rewrite rules. Each rule looks at one e-node (its root op) and the e-classes below it
//! and proposes equivalent terms. A term is added only when `Op::infer` gives it exactly the
//! type of the matched e-class (dtype, shape and wrapped-number flag), so every rule keeps
//! types, and the extracted graph always verifies.
//!
//! Rules marked IEEE-safe give bit-identical results (NaN stays NaN, signed zeros kept) under
//! the interpreter's semantics: every op rounds once to its result dtype. The others may
//! change results and are used only under `RewriteOptions::non_ieee_rules`.

use super::lang::{EG, ENode, Types};
use crate::ir::dtype::{DType, Scalar};
use crate::ir::op::{BinaryOp, Op, TensorType, UnaryOp};
use crate::ir::shape::{permute_shape, wrap_dim};
use crate::runtime::element::round_to_dtype;
use crate::runtime::tensor::{Tensor, apply};
use crate::{Error, Result};
use egg::{Applier, Id, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};

/// A term to add: an existing e-class, or an op over terms.
pub enum Term {
    /// An existing e-class.
    Class(Id),
    /// An op over terms, added to the e-graph.
    Node(Op, Vec<Term>),
}

fn node(op: Op, children: Vec<Term>) -> Term {
    Term::Node(op, children)
}

fn scalar(s: Scalar) -> Term {
    Term::Node(Op::Scalar(s), vec![])
}

fn bin(b: BinaryOp, x: Term, y: Term) -> Term {
    node(Op::Binary(b), vec![x, y])
}

/// The type a term would have, `None` if some op refuses its operands.
fn type_of(eg: &EG, t: &Term) -> Option<TensorType> {
    match t {
        Term::Class(id) => eg[*id].data.clone(),
        Term::Node(op, ch) => {
            let tys: Option<Vec<TensorType>> = ch.iter().map(|c| type_of(eg, c)).collect();
            let tys = tys?;
            op.infer(&tys.iter().collect::<Vec<_>>()).ok()
        }
    }
}

fn add(eg: &mut EG, t: &Term) -> Id {
    match t {
        Term::Class(id) => *id,
        Term::Node(op, ch) => {
            let children = ch.iter().map(|c| add(eg, c)).collect();
            eg.add(ENode::op(op.clone(), children))
        }
    }
}

/// What a rule sees: the e-graph, the matched node's op and operand classes, and the type of
/// the matched class.
pub struct Site<'a> {
    /// The e-graph.
    pub eg: &'a EG,
    /// The matched node's op.
    pub op: &'a Op,
    /// The matched node's operand classes.
    pub ch: &'a [Id],
    /// The type of the matched class.
    pub out: &'a TensorType,
}

impl Site<'_> {
    fn ty(&self, id: Id) -> Option<&TensorType> {
        self.eg[id].data.as_ref()
    }

    /// The (op, operands) of the nodes of class `id` whose op satisfies `pred`.
    fn ops(&self, id: Id, pred: impl Fn(&Op) -> bool) -> Vec<(Op, Vec<Id>)> {
        ops_in(self.eg, id, pred)
    }

    /// The Python scalar held by class `id`, if any.
    fn scalar(&self, id: Id) -> Option<Scalar> {
        self.eg[id].nodes.iter().find_map(|n| match n.as_op() {
            Some(Op::Scalar(s)) => Some(*s),
            _ => None,
        })
    }

    /// True when class `id` is a plain (non-wrapped) tensor of dtype `d`.
    fn is_tensor_of(&self, id: Id, d: DType) -> bool {
        self.ty(id).is_some_and(|t| t.dtype == d && !t.wrapped)
    }

    /// True when `id` is a wrapped scalar or a plain tensor of dtype `d`: then every op over
    /// such operands that computes in `d` sees the same values.
    fn in_domain(&self, id: Id, d: DType) -> bool {
        self.ty(id).is_some_and(|t| t.wrapped || t.dtype == d)
    }
}

fn ops_in(eg: &EG, id: Id, pred: impl Fn(&Op) -> bool) -> Vec<(Op, Vec<Id>)> {
    eg[id]
        .nodes
        .iter()
        .filter_map(|n| {
            n.as_op()
                .filter(|o| pred(o))
                .map(|o| (o.clone(), n.children.clone()))
        })
        .collect()
}

type RuleFn = fn(&Site) -> Vec<Term>;

/// Finds the classes holding a node whose op satisfies `root`.
struct RootSearcher {
    root: fn(&Op) -> bool,
}

impl Searcher<ENode, Types> for RootSearcher {
    fn search_eclass_with_limit(
        &self,
        eg: &EG,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, ENode>> {
        let hit = limit > 0
            && eg[eclass]
                .nodes
                .iter()
                .any(|n| n.as_op().is_some_and(|o| (self.root)(o)));
        hit.then(|| SearchMatches {
            eclass,
            substs: vec![Subst::default()],
            ast: None,
        })
    }

    fn vars(&self) -> Vec<Var> {
        vec![]
    }
}

/// Runs a rule on every root node of a matched class and unions the well-typed results.
struct RuleApplier {
    root: fn(&Op) -> bool,
    rule: RuleFn,
}

impl Applier<ENode, Types> for RuleApplier {
    fn apply_one(
        &self,
        eg: &mut EG,
        eclass: Id,
        _subst: &Subst,
        _ast: Option<&PatternAst<ENode>>,
        _name: Symbol,
    ) -> Vec<Id> {
        let Some(want) = eg[eclass].data.clone() else {
            return vec![];
        };
        let mut changed = Vec::new();
        for (op, ch) in ops_in(eg, eclass, self.root) {
            let terms = (self.rule)(&Site {
                eg: &*eg,
                op: &op,
                ch: &ch,
                out: &want,
            });
            for t in terms {
                if type_of(eg, &t).as_ref() != Some(&want) {
                    continue;
                }
                let id = add(eg, &t);
                if eg.union(eclass, id) {
                    changed.push(id);
                }
            }
        }
        changed
    }
}

struct Rule {
    name: &'static str,
    root: fn(&Op) -> bool,
    rule: RuleFn,
    /// Whether the rule can change IEEE results (a fast-math rule, named `fm-...`).
    non_ieee: bool,
}

/// The rules in force: the IEEE-safe ones, plus the fast-math ones when asked.
pub fn rules(non_ieee: bool) -> Result<Vec<Rewrite<ENode, Types>>> {
    RULES
        .iter()
        .filter(|r| non_ieee || !r.non_ieee)
        .map(|r| {
            Rewrite::new(
                r.name,
                RootSearcher { root: r.root },
                RuleApplier {
                    root: r.root,
                    rule: r.rule,
                },
            )
            .map_err(|e| Error::Value(format!("rewrite rule {}: {e}", r.name)))
        })
        .collect()
}

/// The names of all rules, with whether each is fast-math only.
pub fn rule_names() -> Vec<(&'static str, bool)> {
    RULES.iter().map(|r| (r.name, r.non_ieee)).collect()
}

macro_rules! rule {
    ($name:literal, $root:pat, $f:expr) => {
        Rule {
            name: $name,
            root: |o| matches!(o, $root),
            rule: $f,
            non_ieee: false,
        }
    };
    (fast $name:literal, $root:pat, $f:expr) => {
        Rule {
            name: $name,
            root: |o| matches!(o, $root),
            rule: $f,
            non_ieee: true,
        }
    };
}

const RULES: &[Rule] = &[
    rule!(
        "relu-mul-to-where",
        Op::Binary(BinaryOp::Mul),
        relu_mul_to_where
    ),
    rule!("binary-into-where", Op::Binary(_), binary_into_where),
    rule!("unary-into-where", Op::Unary(_), unary_into_where),
    rule!("where-same-branches", Op::Where, where_same),
    rule!("mul-by-one", Op::Binary(BinaryOp::Mul), mul_one),
    rule!("div-by-one", Op::Binary(BinaryOp::Div), div_one),
    rule!("add-zero-exact", Op::Binary(BinaryOp::Add), add_zero_exact),
    rule!("sub-zero-exact", Op::Binary(BinaryOp::Sub), sub_zero_exact),
    rule!("neg-neg", Op::Unary(UnaryOp::Neg), neg_neg),
    rule!("div-pow2-to-mul", Op::Binary(BinaryOp::Div), div_pow2),
    rule!("cast-identity", Op::To { .. }, cast_identity),
    rule!("cast-cast-lossless", Op::To { .. }, cast_cast),
    rule!("view-to-reshape", Op::View { .. }, view_to_reshape),
    rule!(
        "permute-compose",
        Op::Permute { .. } | Op::Transpose { .. } | Op::T,
        permute_compose
    ),
    rule!(
        "reshape-compose",
        Op::Reshape { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Flatten { .. },
        reshape_compose
    ),
    rule!("expand-compose", Op::Expand { .. }, expand_compose),
    rule!(
        "identity-view",
        Op::Narrow { .. } | Op::Slice { .. } | Op::Expand { .. },
        identity_view
    ),
    rule!("broadcast-absorbs-expand", Op::Binary(_), absorb_expand),
    rule!(
        "drop-contiguous-operand",
        Op::Matmul
            | Op::Linear { .. }
            | Op::Einsum { .. }
            | Op::Reduce { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::To { .. }
            | Op::Contiguous
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. },
        drop_contiguous
    ),
    rule!(fast "fm-mul-zero", Op::Binary(BinaryOp::Mul), fm_mul_zero),
    rule!(fast "fm-sub-self", Op::Binary(BinaryOp::Sub), fm_sub_self),
    rule!(fast "fm-add-zero", Op::Binary(BinaryOp::Add), fm_add_zero),
    rule!(fast "fm-exp-log", Op::Unary(UnaryOp::Exp | UnaryOp::Log), fm_exp_log),
    rule!(fast "fm-div-to-mul", Op::Binary(BinaryOp::Div), fm_div_to_mul),
    rule!(
        fast "fm-reassociate-constants",
        Op::Binary(BinaryOp::Add | BinaryOp::Mul),
        fm_reassociate
    ),
];

/// Both operand orders of a binary node: (this, other, this-was-left).
fn sides(ch: &[Id]) -> Vec<(Id, Id, bool)> {
    match ch {
        [a, b] => vec![(*a, *b, true), (*b, *a, false)],
        _ => vec![],
    }
}

/// `x op y` keeping the original operand order.
fn ordered(b: BinaryOp, x: Term, y: Term, x_left: bool) -> Term {
    if x_left { bin(b, x, y) } else { bin(b, y, x) }
}

/// `op` evaluated on Python scalars converted to `d`, by the eager kernels themselves, as a
/// Python scalar (exact: the result is a value of `d`).
fn fold(op: Op, vals: &[Scalar], d: DType) -> Option<Scalar> {
    let ts: Vec<Tensor> = vals
        .iter()
        .map(|&s| Tensor::full(&[], s, Some(d)))
        .collect::<Result<_>>()
        .ok()?;
    let r = apply(op, &ts.iter().collect::<Vec<_>>()).ok()?;
    if r.dtype() != d {
        return None;
    }
    if d.is_float() {
        r.item_f64().ok().map(Scalar::Float)
    } else if d.is_int() {
        r.to_i64_vec().first().map(|&v| Scalar::Int(v))
    } else {
        None
    }
}

/// True when `relu(x) * c` may become a `where` in dtype `d`: `c` is finite with its sign bit
/// clear in `d`.
fn relu_safe_factor(c: Scalar, d: DType) -> bool {
    match c {
        Scalar::Bool(_) => false,
        _ if d.is_float() => {
            let v = round_to_dtype(c.to_f64(), d);
            v.is_finite() && v.is_sign_positive()
        }
        Scalar::Int(i) => d.is_int() && i >= 0,
        Scalar::Float(_) => false,
    }
}

/// `relu(x) * c` → `where(x < 0, 0, x * c)` for a constant `c` that is finite with its sign
/// bit clear in the compute dtype. IEEE-safe: for `x < 0` both give `+0` (`0 * c`); otherwise
/// `relu(x)` is `x` itself (NaN and `-0.0` included, as `relu` is `x < 0 ? 0 : x`).
fn relu_mul_to_where(s: &Site) -> Vec<Term> {
    let d = s.out.dtype;
    let mut out = Vec::new();
    for (r, k, r_left) in sides(s.ch) {
        let Some(c) = s.scalar(k) else { continue };
        if !relu_safe_factor(c, d) {
            continue;
        }
        for (_, rc) in s.ops(r, |o| matches!(o, Op::Unary(UnaryOp::Relu))) {
            let x = rc[0];
            if !s.is_tensor_of(x, d) {
                continue;
            }
            let zero = if d.is_float() {
                Scalar::Float(0.0)
            } else {
                Scalar::Int(0)
            };
            let cond = bin(BinaryOp::Lt, Term::Class(x), scalar(Scalar::Int(0)));
            let prod = ordered(BinaryOp::Mul, Term::Class(x), Term::Class(k), r_left);
            out.push(node(Op::Where, vec![cond, scalar(zero), prod]));
        }
    }
    out
}

/// A `where` branch with `f` applied: folded when the branch is a Python scalar, else the op
/// node; `None` when the branch is outside the dtype `d` (its values would round otherwise).
fn map_branch(
    s: &Site,
    br: Id,
    d: DType,
    f: &dyn Fn(Term, Option<Scalar>) -> Option<Term>,
) -> Option<Term> {
    match s.scalar(br) {
        Some(v) => f(Term::Class(br), Some(v)),
        None if s.is_tensor_of(br, d) => f(Term::Class(br), None),
        None => None,
    }
}

/// A pointwise op being moved into the branches of a `where`: a unary op, or a binary op
/// with a Python-scalar operand on one side.
#[derive(Clone, Copy)]
enum Pushed {
    Unary(UnaryOp),
    Binary { op: BinaryOp, k: Scalar },
}

/// How deep `push_pays_off` follows nested `where`s.
const PUSH_DEPTH: usize = 3;

/// True when applying `p` to the tensor branch `q` (of dtype `d`) lets a rule remove work
/// there: `neg` meets a `neg`, `* c` meets a `relu` (`relu-mul-to-where`), an op meets a
/// `contiguous` copy it can read through, or a nested `where` whose own push pays off.
///
/// Moving an op into a `where` with a Python-scalar branch is cost-neutral in itself (the op
/// still runs on every element of the other branch), so the `*-into-where` rules fire only
/// when this holds or both branches fold. Pushing unconditionally case-splits every pointwise
/// op after a `relu(x) * c` in a chain, and every later `relu(x) * c` splits each case again:
/// the e-graph grows exponentially with the chain length without finding anything cheaper.
fn push_pays_off(s: &Site, q: Id, d: DType, p: Pushed, depth: usize) -> bool {
    s.eg[q].nodes.iter().any(|n| match (n.as_op(), p) {
        (Some(Op::Unary(UnaryOp::Neg)), Pushed::Unary(UnaryOp::Neg)) => true,
        (
            Some(Op::Unary(UnaryOp::Relu)),
            Pushed::Binary {
                op: BinaryOp::Mul,
                k,
                ..
            },
        ) => relu_safe_factor(k, d) && s.is_tensor_of(n.children[0], d),
        (Some(Op::Contiguous), _) => true,
        (Some(Op::Where), _) if depth > 0 => {
            let (a, b) = (n.children[1], n.children[2]);
            match (s.scalar(a), s.scalar(b)) {
                (Some(_), Some(_)) => true,
                (Some(_), None) => push_pays_off(s, b, d, p, depth - 1),
                (None, Some(_)) => push_pays_off(s, a, d, p, depth - 1),
                (None, None) => false,
            }
        }
        _ => false,
    })
}

/// Whether moving `p` into `where(_, a, b)` pays off: both branches fold, or the tensor
/// branch meets something `p` cancels against (`push_pays_off`).
fn push_into_where_pays_off(s: &Site, a: Id, b: Id, d: DType, p: Pushed) -> bool {
    match (s.scalar(a), s.scalar(b)) {
        (Some(_), Some(_)) => true,
        (Some(_), None) => push_pays_off(s, b, d, p, PUSH_DEPTH),
        (None, Some(_)) => push_pays_off(s, a, d, p, PUSH_DEPTH),
        (None, None) => false,
    }
}

/// `where(c, a, b) op k` → `where(c, a op k, b op k)` for a Python scalar `k` and a `where`
/// with a Python-scalar branch (folded), all in the result dtype, when that pays off (see
/// `push_pays_off`). IEEE-safe: selecting commutes with an elementwise op when both forms
/// round in the same dtype.
fn binary_into_where(s: &Site) -> Vec<Term> {
    let Op::Binary(b) = *s.op else { return vec![] };
    let d = s.out.dtype;
    if b.is_comparison() || b.is_logical() || !(d.is_float() || d.is_int()) {
        return vec![];
    }
    let mut out = Vec::new();
    for (w, k, w_left) in sides(s.ch) {
        let Some(kv) = s.scalar(k) else { continue };
        for (_, wc) in s.ops(w, |o| matches!(o, Op::Where)) {
            let (c, p, q) = (wc[0], wc[1], wc[2]);
            if s.ty(w).is_none_or(|t| t.dtype != d) {
                continue;
            }
            let pushed = Pushed::Binary { op: b, k: kv };
            if !push_into_where_pays_off(s, p, q, d, pushed) {
                continue;
            }
            let f = |t: Term, v: Option<Scalar>| match v {
                Some(v) => {
                    let args = if w_left { [v, kv] } else { [kv, v] };
                    fold(Op::Binary(b), &args, d).map(scalar)
                }
                None => Some(ordered(b, t, Term::Class(k), w_left)),
            };
            let (Some(p2), Some(q2)) = (map_branch(s, p, d, &f), map_branch(s, q, d, &f)) else {
                continue;
            };
            out.push(node(Op::Where, vec![Term::Class(c), p2, q2]));
        }
    }
    out
}

/// `u(where(c, a, b))` → `where(c, u(a), u(b))` with a Python-scalar branch (folded), for a
/// unary op that keeps the dtype, when that pays off. IEEE-safe for the same reason as `binary-into-where`.
fn unary_into_where(s: &Site) -> Vec<Term> {
    let Op::Unary(u) = *s.op else { return vec![] };
    let d = s.out.dtype;
    let mut out = Vec::new();
    for (_, wc) in s.ops(s.ch[0], |o| matches!(o, Op::Where)) {
        let (c, p, q) = (wc[0], wc[1], wc[2]);
        if s.ty(s.ch[0]).is_none_or(|t| t.dtype != d) || !d.is_float() {
            continue;
        }
        if !push_into_where_pays_off(s, p, q, d, Pushed::Unary(u)) {
            continue;
        }
        let f = |t: Term, v: Option<Scalar>| match v {
            Some(v) => fold(Op::Unary(u), &[v], d).map(scalar),
            None => Some(node(Op::Unary(u), vec![t])),
        };
        let (Some(p2), Some(q2)) = (map_branch(s, p, d, &f), map_branch(s, q, d, &f)) else {
            continue;
        };
        out.push(node(Op::Where, vec![Term::Class(c), p2, q2]));
    }
    out
}

/// `where(c, x, x)` → `x`. IEEE-safe.
fn where_same(s: &Site) -> Vec<Term> {
    let (p, q) = (s.eg.find(s.ch[1]), s.eg.find(s.ch[2]));
    if p == q { vec![Term::Class(p)] } else { vec![] }
}

fn scalar_is(s: &Site, id: Id, pred: impl Fn(Scalar) -> bool) -> bool {
    s.scalar(id).is_some_and(pred)
}

/// `x * 1` → `x`. IEEE-safe (the type check refuses a change of dtype).
fn mul_one(s: &Site) -> Vec<Term> {
    sides(s.ch)
        .into_iter()
        .filter(|&(_, k, _)| {
            scalar_is(s, k, |v| !matches!(v, Scalar::Bool(_)) && v.to_f64() == 1.0)
        })
        .map(|(x, _, _)| Term::Class(x))
        .collect()
}

/// `x / 1` → `x`. IEEE-safe.
fn div_one(s: &Site) -> Vec<Term> {
    if scalar_is(s, s.ch[1], |v| {
        !matches!(v, Scalar::Bool(_)) && v.to_f64() == 1.0
    }) {
        vec![Term::Class(s.ch[0])]
    } else {
        vec![]
    }
}

/// `x + (-0.0)` → `x` for floats, `x + 0` → `x` for integers. IEEE-safe; `x + 0.0` is not
/// (`-0.0 + 0.0` is `+0.0`).
fn add_zero_exact(s: &Site) -> Vec<Term> {
    let d = s.out.dtype;
    sides(s.ch)
        .into_iter()
        .filter(|&(_, k, _)| {
            scalar_is(s, k, |v| match v {
                Scalar::Float(f) => d.is_float() && f == 0.0 && f.is_sign_negative(),
                Scalar::Int(0) => d.is_int(),
                _ => false,
            })
        })
        .map(|(x, _, _)| Term::Class(x))
        .collect()
}

/// `x - 0` → `x` (`+0.0` or an integer zero). IEEE-safe: `x - (+0)` is `x + (-0)`.
fn sub_zero_exact(s: &Site) -> Vec<Term> {
    let zero = scalar_is(s, s.ch[1], |v| match v {
        Scalar::Float(f) => f == 0.0 && f.is_sign_positive(),
        Scalar::Int(i) => i == 0,
        Scalar::Bool(_) => false,
    });
    if zero {
        vec![Term::Class(s.ch[0])]
    } else {
        vec![]
    }
}

/// `neg(neg(x))` → `x`. IEEE-safe (and exact for wrapping integers).
fn neg_neg(s: &Site) -> Vec<Term> {
    s.ops(s.ch[0], |o| matches!(o, Op::Unary(UnaryOp::Neg)))
        .into_iter()
        .map(|(_, c)| Term::Class(c[0]))
        .collect()
}

/// `x / c` → `x * (1/c)` for `c` a power of two whose reciprocal is a value of the dtype.
/// IEEE-safe: both are the correctly rounded value of the same real number.
fn div_pow2(s: &Site) -> Vec<Term> {
    let d = s.out.dtype;
    let (x, k) = (s.ch[0], s.ch[1]);
    let Some(c) = s.scalar(k) else { return vec![] };
    if !d.is_float() || !s.is_tensor_of(x, d) || matches!(c, Scalar::Bool(_)) {
        return vec![];
    }
    let c = round_to_dtype(c.to_f64(), d);
    let mantissa = c.to_bits() & ((1u64 << 52) - 1);
    if !c.is_normal() || mantissa != 0 {
        return vec![];
    }
    let r = 1.0 / c;
    if !r.is_normal() || round_to_dtype(r, d) != r {
        return vec![];
    }
    vec![bin(BinaryOp::Mul, Term::Class(x), scalar(Scalar::Float(r)))]
}

/// `to(x, d)` → `x` when `x` already has dtype `d`. IEEE-safe.
fn cast_identity(s: &Site) -> Vec<Term> {
    if s.is_tensor_of(s.ch[0], s.out.dtype) {
        vec![Term::Class(s.ch[0])]
    } else {
        vec![]
    }
}

/// True when every value of `from` is exactly a value of `to`.
pub fn lossless(from: DType, to: DType) -> bool {
    use DType::*;
    from == to
        || match from {
            Bool => true,
            U8 | I8 => !matches!(to, Bool | U8 | I8),
            I16 => matches!(to, I32 | I64 | F32 | F64),
            I32 => matches!(to, I64 | F64),
            I64 => false,
            F16 | BF16 => matches!(to, F32 | F64),
            F32 => to == F64,
            F64 => false,
        }
}

/// `to(to(x, d1), d2)` → `to(x, d2)` when `x → d1` is lossless (f32→f64→f32 is the identity;
/// f64→f32→f64 is not). IEEE-safe: the second cast sees `x`'s exact value.
fn cast_cast(s: &Site) -> Vec<Term> {
    let Op::To { dtype: d2 } = *s.op else {
        return vec![];
    };
    let mut out = Vec::new();
    for (op, c) in s.ops(s.ch[0], |o| matches!(o, Op::To { .. })) {
        let Op::To { dtype: d1 } = op else { continue };
        if s.ty(c[0])
            .is_some_and(|t| !t.wrapped && lossless(t.dtype, d1))
        {
            out.push(node(Op::To { dtype: d2 }, vec![Term::Class(c[0])]));
        }
    }
    out
}

/// `view(x, s)` → `reshape(x, s)`: the same values, and no failure if a rewrite below changes
/// the operand's layout. Exact.
fn view_to_reshape(s: &Site) -> Vec<Term> {
    let Op::View { shape } = s.op else {
        return vec![];
    };
    vec![node(
        Op::Reshape {
            shape: shape.clone(),
        },
        vec![Term::Class(s.ch[0])],
    )]
}

/// The permutation a permute-like op applies to an operand of rank `n`: output dim `i` is
/// operand dim `p[i]`.
fn perm_of(op: &Op, n: usize) -> Option<Vec<usize>> {
    let mut p: Vec<usize> = (0..n).collect();
    match op {
        Op::Permute { dims } => {
            let shape = vec![1; n];
            permute_shape(&shape, dims).ok()?;
            p = dims
                .iter()
                .map(|&d| wrap_dim(d, n))
                .collect::<Result<_>>()
                .ok()?;
        }
        Op::Transpose { dim0, dim1 } => {
            if n == 0 {
                return Some(p);
            }
            let (a, b) = (wrap_dim(*dim0, n).ok()?, wrap_dim(*dim1, n).ok()?);
            p.swap(a, b);
        }
        Op::T => {
            if n == 2 {
                p.swap(0, 1);
            }
        }
        _ => return None,
    }
    Some(p)
}

fn permute_term(x: Id, p: Vec<usize>) -> Term {
    if p.iter().enumerate().all(|(i, &d)| i == d) {
        Term::Class(x)
    } else {
        let dims = p.into_iter().map(|d| d as i64).collect();
        node(Op::Permute { dims }, vec![Term::Class(x)])
    }
}

/// Permute/transpose/t of permute/transpose/t → one `permute` (or nothing when the
/// composition is the identity); a lone identity permutation → its operand. Exact.
fn permute_compose(s: &Site) -> Vec<Term> {
    let n = s.out.ndim();
    let Some(outer) = perm_of(s.op, n) else {
        return vec![];
    };
    let mut out = vec![permute_term(s.ch[0], outer.clone())];
    let inner_ops = s.ops(s.ch[0], |o| {
        matches!(o, Op::Permute { .. } | Op::Transpose { .. } | Op::T)
    });
    for (op, c) in inner_ops {
        if let Some(inner) = perm_of(&op, n) {
            let p: Vec<usize> = outer.iter().map(|&j| inner[j]).collect();
            out.push(permute_term(c[0], p));
        }
    }
    out
}

fn reshape_term(x: Id, from: &TensorType, shape: &[usize]) -> Term {
    if from.shape == shape {
        Term::Class(x)
    } else {
        let shape = shape.iter().map(|&d| d as i64).collect();
        node(Op::Reshape { shape }, vec![Term::Class(x)])
    }
}

fn is_reshape_like(o: &Op) -> bool {
    matches!(
        o,
        Op::Reshape { .. }
            | Op::View { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Flatten { .. }
    )
}

/// A reshape-like op (reshape, squeeze, unsqueeze, flatten) of another (view included) → one
/// `reshape` to the final shape, or the operand itself when the shapes agree; a lone
/// reshape-like op that keeps the shape → its operand. Exact: all of them keep the
/// row-major element order.
fn reshape_compose(s: &Site) -> Vec<Term> {
    let mut out = Vec::new();
    if let Some(t) = s.ty(s.ch[0])
        && t.shape == s.out.shape
    {
        out.push(Term::Class(s.ch[0]));
    }
    for (_, c) in s.ops(s.ch[0], is_reshape_like) {
        if let Some(t) = s.ty(c[0]) {
            out.push(reshape_term(c[0], t, &s.out.shape));
        }
    }
    out
}

/// `expand(expand(x))` → `expand(x)` to the final shape. Exact.
fn expand_compose(s: &Site) -> Vec<Term> {
    let size: Vec<i64> = s.out.shape.iter().map(|&d| d as i64).collect();
    s.ops(s.ch[0], |o| matches!(o, Op::Expand { .. }))
        .into_iter()
        .map(|(_, c)| node(Op::Expand { size: size.clone() }, vec![Term::Class(c[0])]))
        .collect()
}

/// Narrow, slice (step 1) or expand that keep the whole operand → the operand. Exact.
fn identity_view(s: &Site) -> Vec<Term> {
    let Some(t) = s.ty(s.ch[0]) else {
        return vec![];
    };
    let whole = t.shape == s.out.shape
        && match s.op {
            Op::Slice { step, .. } => *step == 1,
            Op::Narrow { .. } | Op::Expand { .. } => true,
            _ => false,
        };
    if whole {
        vec![Term::Class(s.ch[0])]
    } else {
        vec![]
    }
}

/// `a op expand(b)` → `a op b` when broadcasting gives the same shape and `b` has at least one
/// dim (so type promotion sees the same kinds of operands). Exact: broadcasting is expansion.
fn absorb_expand(s: &Site) -> Vec<Term> {
    let Op::Binary(b) = *s.op else { return vec![] };
    let mut out = Vec::new();
    for (e, other, e_left) in sides(s.ch) {
        for (_, c) in s.ops(e, |o| matches!(o, Op::Expand { .. })) {
            let (Some(te), Some(ti)) = (s.ty(e), s.ty(c[0])) else {
                continue;
            };
            if ti.ndim() == 0 || ti.dtype != te.dtype || ti.wrapped {
                continue;
            }
            out.push(ordered(b, Term::Class(c[0]), Term::Class(other), e_left));
        }
    }
    out
}

/// An operand `contiguous(y)` of an op that reads any layout → `y`: a transposed matmul
/// operand stays a view instead of a copy. Exact: `contiguous` keeps values. (Not applied
/// under `view`, which needs a contiguous operand.)
fn drop_contiguous(s: &Site) -> Vec<Term> {
    let mut out = Vec::new();
    for (i, &c) in s.ch.iter().enumerate() {
        for (_, y) in s.ops(c, |o| matches!(o, Op::Contiguous)) {
            let mut children: Vec<Term> = s.ch.iter().map(|&x| Term::Class(x)).collect();
            children[i] = Term::Class(y[0]);
            out.push(node(s.op.clone(), children));
        }
    }
    out
}

fn zeros(out: &TensorType) -> Term {
    let fill_value = if out.dtype.is_float() {
        Scalar::Float(0.0)
    } else if out.dtype.is_bool() {
        Scalar::Bool(false)
    } else {
        Scalar::Int(0)
    };
    node(
        Op::Full {
            size: out.shape.clone(),
            fill_value,
            dtype: Some(out.dtype),
        },
        vec![],
    )
}

/// Fast math: `x * 0` → zeros (wrong for NaN, infinities and signed zeros).
fn fm_mul_zero(s: &Site) -> Vec<Term> {
    let zero = sides(s.ch)
        .iter()
        .any(|&(_, k, _)| scalar_is(s, k, |v| v.to_f64() == 0.0));
    if zero { vec![zeros(s.out)] } else { vec![] }
}

/// Fast math: `x - x` → zeros (wrong for NaN and infinities).
fn fm_sub_self(s: &Site) -> Vec<Term> {
    if s.eg.find(s.ch[0]) == s.eg.find(s.ch[1]) {
        vec![zeros(s.out)]
    } else {
        vec![]
    }
}

/// Fast math: `x + 0.0` → `x` (wrong for `x = -0.0`).
fn fm_add_zero(s: &Site) -> Vec<Term> {
    sides(s.ch)
        .into_iter()
        .filter(|&(_, k, _)| {
            scalar_is(s, k, |v| !matches!(v, Scalar::Bool(_)) && v.to_f64() == 0.0)
        })
        .map(|(x, _, _)| Term::Class(x))
        .collect()
}

/// Fast math: `exp(log(x))` → `x`, `log(exp(x))` → `x` (rounding, negative inputs, overflow).
fn fm_exp_log(s: &Site) -> Vec<Term> {
    let inverse = match s.op {
        Op::Unary(UnaryOp::Exp) => UnaryOp::Log,
        Op::Unary(UnaryOp::Log) => UnaryOp::Exp,
        _ => return vec![],
    };
    s.ops(s.ch[0], |o| *o == Op::Unary(inverse))
        .into_iter()
        .map(|(_, c)| Term::Class(c[0]))
        .collect()
}

/// Fast math: `x / c` → `x * (1/c)` for any finite non-zero constant (one extra rounding).
fn fm_div_to_mul(s: &Site) -> Vec<Term> {
    let Some(c) = s.scalar(s.ch[1]) else {
        return vec![];
    };
    let v = c.to_f64();
    if matches!(c, Scalar::Bool(_)) || !v.is_finite() || v == 0.0 || !s.out.dtype.is_float() {
        return vec![];
    }
    vec![bin(
        BinaryOp::Mul,
        Term::Class(s.ch[0]),
        scalar(Scalar::Float(1.0 / v)),
    )]
}

/// Fast math: `(x op a) op b` → `x op (a op b)` for Python scalars `a`, `b` and op `+` or `*`
/// (reassociation changes rounding).
fn fm_reassociate(s: &Site) -> Vec<Term> {
    let Op::Binary(b) = *s.op else { return vec![] };
    let d = s.out.dtype;
    if !d.is_float() {
        return vec![];
    }
    let mut out = Vec::new();
    for (inner, k, _) in sides(s.ch) {
        let Some(bv) = s.scalar(k) else { continue };
        for (_, c) in s.ops(inner, |o| *o == Op::Binary(b)) {
            for (x, a, _) in sides(&c) {
                let Some(av) = s.scalar(a) else { continue };
                if !s.in_domain(x, d) || s.scalar(x).is_some() {
                    continue;
                }
                let folded = match b {
                    BinaryOp::Add => av.to_f64() + bv.to_f64(),
                    _ => av.to_f64() * bv.to_f64(),
                };
                out.push(bin(b, Term::Class(x), scalar(Scalar::Float(folded))));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lossless_casts_are_the_exact_widenings() {
        use DType::*;
        assert!(lossless(F32, F64));
        assert!(!lossless(F64, F32));
        assert!(lossless(F16, F32) && lossless(BF16, F32));
        assert!(!lossless(F16, BF16) && !lossless(BF16, F16));
        assert!(lossless(I16, F32) && !lossless(I16, F16));
        assert!(lossless(I32, F64) && !lossless(I32, F32));
        assert!(!lossless(I64, F64));
        assert!(lossless(U8, I16) && !lossless(U8, I8) && !lossless(I8, U8));
        assert!(
            DType::ALL
                .iter()
                .all(|&d| lossless(Bool, d) && lossless(d, d))
        );
    }

    #[test]
    fn every_rule_name_is_unique_and_fast_math_rules_are_marked() {
        let names = rule_names();
        let mut sorted: Vec<_> = names.iter().map(|(n, _)| *n).collect();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        for (n, fast) in names {
            assert_eq!(n.starts_with("fm-"), fast, "{n}");
        }
        assert!(rules(true).unwrap().len() > rules(false).unwrap().len());
    }

    #[test]
    fn folding_rounds_in_the_dtype() {
        // 0.1 in f16 is 0.0999755859375; times 3 rounds again in f16
        let v = fold(
            Op::Binary(BinaryOp::Mul),
            &[Scalar::Float(0.1), Scalar::Float(3.0)],
            DType::F16,
        );
        let want = round_to_dtype(round_to_dtype(0.1, DType::F16) * 3.0, DType::F16);
        assert_eq!(v, Some(Scalar::Float(want)));
        assert_eq!(
            fold(Op::Unary(UnaryOp::Neg), &[Scalar::Int(5)], DType::I8),
            Some(Scalar::Int(-5))
        );
    }
}
