//! The float64 oracle of the differential fuzzer, and the tolerance it grants each element.
//!
//! The reference is the graph with every floating-point dtype made f64 ([`oracle_module`]:
//! integers that an op would make f32 are cast to f64 first, and float literals are rounded
//! to the dtype their op computes in), run by the reference interpreter. How far a correct run in the graph's own dtypes may stray from it is
//! measured rather than assumed (Monte Carlo arithmetic): the oracle runs [`RUNS`] more
//! times, and every float result is perturbed by the error a correct kernel may make there,
//! then rounded to the dtype the graph gives it (so an f16 value overflows as it would):
//! - a relative `2u` for any op (`u`: the unit roundoff of the graph's coarsest float dtype),
//! - for ops that accumulate `K` terms (reductions, contractions, convolutions, pooling,
//!   normalisations, attention) also `K·u_acc·|op|(|x|)`, the classic bound on a sum's
//!   rounding error whatever its order (`u_acc`: f32's for half precision, which PyTorch
//!   accumulates in f32).
//!
//! The perturbations propagate through the rest of the graph, so an element's spread over
//! the runs is its condition times the rounding: an ill-conditioned output (cancellation, an
//! exp chain) gets a wide tolerance, a well-conditioned one a tight one, and a compiled path
//! that computes an f64 graph in f32 fails. An element whose class (NaN, an infinity, or
//! the value of an integer or bool) changes between runs is unstable and not compared.

use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::{Graph, Module, NodeKind};
use crate::ir::op::{BinaryOp, Op, ReduceOp, TensorType};
use crate::ir::text::parse_module;
use crate::runtime::interp;
use crate::runtime::tensor::apply;
use crate::{Result, Tensor, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// Perturbed runs behind each tolerance.
pub const RUNS: usize = 6;

/// How much wider than the largest perturbed deviation a result may be.
const SPREAD_FACTOR: f64 = 4.0;

/// What one output must be.
#[derive(Clone, Debug)]
pub struct Expected {
    /// The output's type in the graph under test.
    pub ty: TensorType,
    /// The f64 reference, rounded to the output's dtype.
    pub value: Vec<f64>,
    /// Allowed distance per element; `f64::INFINITY` where the element is unstable.
    pub tol: Vec<f64>,
}

/// The unit roundoff of a float dtype (half the distance from 1 to the next value).
pub fn unit_roundoff(dt: DType) -> f64 {
    match dt {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F32 => 2f64.powi(-24),
        _ => 2f64.powi(-53),
    }
}

/// `text` with every floating-point dtype made f64. Statements lose their type
/// annotations, and where an op would make the default dtype (f32) of an integer or bool
/// operand (`exp(%i)`, `mul(%i, 0.5)`), that operand is cast to f64 first, so that no
/// value of the oracle is computed in f32.
pub fn to_f64_text(text: &str) -> String {
    match parse_module(text, "case.smelt") {
        Ok(m) => f64_text_of(text, &m),
        Err(_) => widen_annotations(text),
    }
}

/// [`to_f64_text`] of `text`, already parsed as `m`.
fn f64_text_of(text: &str, m: &Module) -> String {
    insert_casts(&widen_annotations(text), &default_float_operands(m))
}

/// The oracle of `text`: [`to_f64_text`], parsed, with each float literal rounded to the
/// dtype its op computes in within `text`, as PyTorch converts a Python scalar to the
/// operation's dtype (`remainder(x, 0.001)` of an f16 `x` divides by 0.001 in f16).
pub fn oracle_module(text: &str) -> Result<Module> {
    let Ok(m) = parse_module(text, "case.smelt") else {
        return parse_module(&widen_annotations(text), "oracle.smelt");
    };
    let mut m64 = parse_module(&f64_text_of(text, &m), "oracle.smelt")?;
    for g in &m.graphs {
        let Some(g64) = m64.graphs.iter_mut().find(|b| b.name == g.name) else {
            continue;
        };
        for v in g.topo_order() {
            let n = g.node(v);
            let operands = g.operands(v);
            let tensors: Vec<DType> = operands
                .iter()
                .map(|&o| g.node(o))
                .filter(|o| !o.name.starts_with('$'))
                .map(|o| o.ty.dtype)
                .collect();
            // the dtype the op computes in: its float result, or that of the operands it
            // compares
            let dt = match n.ty.dtype.is_float() {
                true => n.ty.dtype,
                false => match tensors
                    .iter()
                    .filter(|d| d.is_float())
                    .copied()
                    .reduce(DType::promote)
                {
                    Some(d) => d,
                    None => crate::ir::dtype::DEFAULT_FLOAT,
                },
            };
            let Some(c64) = g64.value(&n.name) else {
                continue;
            };
            for (i, &o) in operands.iter().enumerate() {
                let Some(Op::Scalar(Scalar::Float(x))) = g.node(o).op() else {
                    continue;
                };
                let Some(&l64) = g64.operands(c64).get(i) else {
                    continue;
                };
                if let NodeKind::Op(Op::Scalar(Scalar::Float(y))) =
                    &mut g64.petgraph_mut()[l64].kind
                {
                    *y = round_to(*x, dt);
                }
            }
        }
    }
    Ok(m64)
}

/// `x` rounded to the float dtype `dt` (f64 as it is).
fn round_to(x: f64, dt: DType) -> f64 {
    match dt {
        DType::F16 => smelt_rt::scalar::f16_from_f64(x).to_f64(),
        DType::BF16 => smelt_rt::scalar::bf16_from_f64(x).to_f64(),
        DType::F32 => x as f32 as f64,
        _ => x,
    }
}

fn widen_annotations(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let stmt = line.trim_start().starts_with('%');
        match (stmt, line.find(": "), line.find(" = ")) {
            (true, Some(colon), Some(eq)) if colon < eq => {
                out.push_str(&line[..colon]);
                out.push_str(&line[eq..]);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out.replace("bf16", "f64")
        .replace("f16", "f64")
        .replace("f32", "f64")
}

/// By graph and statement name, the integer and bool operands of statements whose result
/// is a float though no operand is (the default dtype of PyTorch's promotion).
fn default_float_operands(m: &crate::ir::graph::Module) -> HashMap<(String, String), Vec<String>> {
    let mut casts = HashMap::new();
    for g in &m.graphs {
        for v in g.topo_order() {
            let n = g.node(v);
            let Some(op) = n.op() else { continue };
            if !n.ty.dtype.is_float() || matches!(op, Op::Control(_) | Op::Result { .. }) {
                continue;
            }
            // (literals, named `$N`, stay Python scalars; a condition or mask stays bool)
            let mask = match op {
                Op::Where => Some(0),
                Op::MaskedFill { .. } => Some(1),
                _ => None,
            };
            let operands: Vec<_> = g
                .operands(v)
                .into_iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != mask)
                .map(|(_, o)| g.node(o))
                .filter(|o| !o.name.starts_with('$'))
                .collect();
            if operands.iter().any(|o| o.ty.dtype.is_float()) {
                continue;
            }
            let mut names: Vec<String> = operands.into_iter().map(|o| o.name.clone()).collect();
            names.sort();
            names.dedup();
            if !names.is_empty() {
                casts.insert((g.name.clone(), n.name.clone()), names);
            }
        }
    }
    casts
}

/// `text` with a cast to f64 before each statement of `casts`, read by that statement in
/// place of the operand.
fn insert_casts(text: &str, casts: &HashMap<(String, String), Vec<String>>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut graph = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("graph ") {
            graph = rest.split('(').next().unwrap_or("").trim().to_string();
        }
        let name = t
            .strip_prefix('%')
            .and_then(|r| r.split(" = ").next())
            .filter(|_| t.contains(" = "));
        let Some(ops) = name.and_then(|n| casts.get(&(graph.clone(), n.to_string()))) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let stmt = name.unwrap_or_default();
        let eq = line.find(" = ").unwrap_or(0);
        let mut rhs = line[eq..].to_string();
        for o in ops {
            let wide = format!("{stmt}__{o}_f64");
            out.push_str(&format!("  %{wide} = to(%{o}, dtype=f64)\n"));
            rhs = replace_name(&rhs, o, &wide);
        }
        out.push_str(&line[..eq]);
        out.push_str(&rhs);
        out.push('\n');
    }
    out
}

/// `s` with every reference `%from` (the whole name) made `%to`.
fn replace_name(s: &str, from: &str, to: &str) -> String {
    let pat = format!("%{from}");
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(&pat) {
        let after = &rest[i + pat.len()..];
        let whole = !after.starts_with(|c: char| c.is_alphanumeric() || c == '_');
        out.push_str(&rest[..i]);
        out.push_str(if whole { "%" } else { &pat });
        if whole {
            out.push_str(to);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `inputs` as the f64 graph of [`to_f64_text`] takes them: floats widened, the rest as
/// they are.
pub fn to_f64_inputs(inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    inputs
        .iter()
        .map(|t| match t.dtype().is_float() {
            true => t.to_dtype(DType::F64),
            false => Ok(t.clone()),
        })
        .collect()
}

/// The expected outputs of `g` (parsed from `text`) on `inputs`, with their tolerances.
pub fn expect(g: &Graph, text: &str, inputs: &[Tensor], seed: u64) -> Result<Vec<Expected>> {
    let m64 = oracle_module(text)?;
    let g64 = m64.entry();
    let inputs64 = to_f64_inputs(inputs)?;
    // the dtype each value has in the graph under test (bodies included), by graph and name
    let module = parse_module(text, "case.smelt")?;
    let dtypes: HashMap<(String, String), DType> = module
        .graphs
        .iter()
        .flat_map(|b| {
            b.topo_order()
                .into_iter()
                .map(|v| ((b.name.clone(), b.node(v).name.clone()), b.node(v).ty.dtype))
        })
        .collect();
    let floats = dtypes.values().filter(|d| d.is_float());
    let u = floats
        .clone()
        .map(|&d| unit_roundoff(d))
        .fold(0.0, f64::max);
    let u_acc = floats
        .map(|&d| unit_roundoff(if d == DType::F64 { d } else { DType::F32 }))
        .fold(0.0, f64::max);
    let named = |ts: &[Tensor]| -> Vec<(String, Tensor)> {
        g64.inputs()
            .iter()
            .zip(ts)
            .map(|(&v, t)| (g64.node(v).name.clone(), t.clone()))
            .collect()
    };
    let mut exact_orders = Orders::default();
    let exact = interp::run_with(g64, &named(&inputs64), &mut |graph, name, op, args, t| {
        exact_orders.record(graph, name, op, args, &t)?;
        Ok(t)
    })?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x05ee_d0f0_ac1e);
    let mut runs = Vec::with_capacity(RUNS + 1);
    for run in 0..=RUNS {
        // the first run only rounds each result to its dtype: where that alone flips a
        // result (a value landing on an integer, an overflow), the flip is seen for sure
        let scale = if run == 0 { 0.0 } else { 1.0 };
        let mut orders = Orders::default();
        let mut hook = |graph: &str, name: &str, op: &Op, args: &[&Tensor], t: Tensor| {
            if let Some(key) = orders.record(graph, name, op, args, &t)? {
                return exact_orders.unsettle(&key, &orders, t);
            }
            let errs = (scale * u, scale * u_acc);
            let dt = dtypes.get(&(graph.to_string(), name.to_string())).copied();
            let probe = match run {
                1 => Probe::Cancel,
                2 => Probe::Cross,
                _ => Probe::Random,
            };
            perturb(&mut rng, dt, errs, probe, op, args, t)
        };
        runs.push(interp::run_with(g64, &named(&inputs64), &mut hook)?);
    }
    let mut out = Vec::with_capacity(exact.len());
    for (i, &o) in g.outputs().iter().enumerate() {
        let ty = g.node(o).ty.clone();
        let exact_i = rounded(&exact[i], ty.dtype)?;
        let mut tol = vec![0.0; exact_i.len()];
        for run in &runs {
            let r = rounded(&run[i], ty.dtype)?;
            for ((t, &e), &p) in tol.iter_mut().zip(&exact_i).zip(&r) {
                *t = f64::max(*t, deviation(e, p, ty.dtype));
            }
        }
        // two ulps of the output's own dtype beside the spread: a result that its last
        // rounding alone moves by one ulp either way is not a bug
        let (floor, ulps) = (min_normal(ty.dtype), 4.0 * unit_roundoff(ty.dtype));
        for (t, &e) in tol.iter_mut().zip(&exact_i) {
            if e.is_nan() {
                *t = if t.is_finite() { 0.0 } else { *t };
            } else if ty.dtype.is_float() && t.is_finite() {
                *t = SPREAD_FACTOR * *t + (2.0 * u + ulps) * e.abs() + floor;
            }
        }
        out.push(Expected {
            ty,
            value: exact_i,
            tol,
        });
    }
    Ok(out)
}

/// The comparisons of float operands in one run: per element, which operand is larger
/// (`a - b`'s sign, 2 for NaN) and the result, by graph, name and occurrence (a body runs
/// once per trip).
#[derive(Default)]
struct Orders {
    seen: HashMap<(String, String), usize>,
    orders: HashMap<(String, String, usize), Vec<(i8, bool)>>,
}

/// Where [`Orders`] keeps one comparison.
type OrderKey = (String, String, usize);

impl Orders {
    /// Records `op`'s operand order and result if it compares floats; returns its key.
    fn record(
        &mut self,
        graph: &str,
        name: &str,
        op: &Op,
        args: &[&Tensor],
        t: &Tensor,
    ) -> Result<Option<OrderKey>> {
        let compares = matches!(op, Op::Binary(b) if b.is_comparison());
        if !compares || args.iter().any(|a| a.dtype() != DType::F64) {
            return Ok(None);
        }
        let gap = apply(Op::Binary(BinaryOp::Sub), args)?.try_to_f64_vec()?;
        let order = gap.iter().zip(t.try_to_f64_vec()?).map(|(&g, r)| {
            let sign = if g.is_nan() {
                2
            } else {
                (g > 0.0) as i8 - (g < 0.0) as i8
            };
            (sign, r != 0.0)
        });
        let seen = self
            .seen
            .entry((graph.to_string(), name.to_string()))
            .or_default();
        *seen += 1;
        let key = (graph.to_string(), name.to_string(), *seen);
        self.orders.insert(key.clone(), order.collect());
        Ok(Some(key))
    }

    /// A perturbed run's comparison `t` (recorded under `key` in `perturbed`) with every
    /// element whose operands changed order from this, the exact run, set against the exact
    /// result. Between the two orders lies a perturbation where the operands are equal, so
    /// an `eq` or `ne` there is not settled either, though no random perturbation lands on
    /// equality: rounding one add at a time (a scatter with repeated indices) can.
    fn unsettle(&self, key: &OrderKey, perturbed: &Orders, t: Tensor) -> Result<Tensor> {
        let (Some(exact), Some(now)) = (self.orders.get(key), perturbed.orders.get(key)) else {
            return Ok(t);
        };
        if exact.len() != now.len() {
            return Ok(t);
        }
        let mut v: Vec<bool> = now.iter().map(|&(_, r)| r).collect();
        for (r, (&(then, was), &(sign, _))) in v.iter_mut().zip(exact.iter().zip(now)) {
            if sign != then {
                *r = !was;
            }
        }
        Tensor::from_vec(v, t.shape())
    }
}

/// How far a perturbed element lies from the exact one: infinite when their class differs
/// (finite or not; for integers and bools, any difference).
fn deviation(exact: f64, perturbed: f64, dt: DType) -> f64 {
    if exact.is_nan() || perturbed.is_nan() {
        return if exact.is_nan() && perturbed.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if exact.is_infinite() || perturbed.is_infinite() || !dt.is_float() {
        return if exact == perturbed {
            0.0
        } else {
            f64::INFINITY
        };
    }
    (exact - perturbed).abs()
}

fn min_normal(dt: DType) -> f64 {
    match dt {
        DType::F16 => 6.104e-5,
        DType::BF16 | DType::F32 => f32::MIN_POSITIVE as f64,
        DType::F64 => f64::MIN_POSITIVE,
        _ => 0.0,
    }
}

/// `t`'s elements as they are in `dt` (a float rounded to it; integers and bools as they
/// are).
fn rounded(t: &Tensor, dt: DType) -> Result<Vec<f64>> {
    if t.dtype() == dt || !dt.is_float() {
        return t.try_to_f64_vec();
    }
    t.to_dtype(dt)?.try_to_f64_vec()
}

/// What a perturbed run tries besides random errors.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// Random errors only.
    Random,
    /// A sum whose error may exceed it is 0.
    Cancel,
    /// Every sum within its error of a rounding boundary of its dtype rounds the other way
    /// (the rest stay exact). A sum made in f32 and rounded once to f16 or bf16 lands on one
    /// of two neighbours; random errors larger than an ulp scatter it over several and may
    /// miss the one that matters (the integer where a negative base's `pow` is defined).
    Cross,
}

/// One op's result with the error a correct kernel may make there, rounded to `dt` (the
/// value's dtype in the graph under test).
fn perturb(
    rng: &mut StdRng,
    dt: Option<DType>,
    (u, u_acc): (f64, f64),
    probe: Probe,
    op: &Op,
    args: &[&Tensor],
    t: Tensor,
) -> Result<Tensor> {
    // a literal is exact, and stays a wrapped Python scalar for type promotion
    if t.dtype() != DType::F64 || matches!(op, Op::Scalar(_)) {
        return Ok(t);
    }
    let k = accumulated_terms(op, args, &t);
    let (t, acc) = match (k, backward_stable(op)) {
        // normalisations: the result of inputs perturbed by the sums' rounding (backward
        // error), which their centring and scaling then amplify as a real kernel's do,
        (Some(k), true) if u_acc > 0.0 && probe != Probe::Cross => {
            let move_by = k * u_acc;
            let moved = args
                .iter()
                .map(|a| match a.dtype() == DType::F64 {
                    true => {
                        let v: Vec<f64> = a
                            .try_to_f64_vec()?
                            .into_iter()
                            .map(|x| x * (1.0 + move_by * rng.random_range(-1.0..=1.0)))
                            .collect();
                        Tensor::from_vec(v, a.shape())
                    }
                    false => Ok((*a).clone()),
                })
                .collect::<Result<Vec<Tensor>>>()?;
            let refs: Vec<&Tensor> = moved.iter().collect();
            // and the forward error of what they compute last (a log of a sum ≥ 1, a
            // division by a norm), at least one unit of roundoff per term
            let m = magnitude(op, args, &t)?;
            (apply(op.clone(), &refs)?, Some((k, m)))
        }
        (Some(k), false) => {
            let m = magnitude(op, args, &t)?;
            (t, Some((k, m)))
        }
        _ => (t, None),
    };
    let mut v = t.try_to_f64_vec()?;
    let rel = u * match op {
        Op::Unary(f) => unary_ulps(*f),
        _ => 2.0,
    };
    // functions whose formula adds terms that cancel err relative to the terms, which grow
    // with |x|, not to the result (gelu's tail, where the result is 0 or tiny)
    let terms = match op {
        Op::Unary(f) if cancels(*f) => Some(args[0].try_to_f64_vec()?),
        _ => None,
    };
    // scatters add one value at a time in the tensor's own dtype, as PyTorch's do
    let u_acc = match op {
        Op::ScatterAdd { .. } | Op::IndexAdd { .. } => u,
        _ => u_acc,
    };
    for (i, x) in v.iter_mut().enumerate() {
        let mut y = *x * (1.0 + rel * rng.random_range(-1.0..=1.0));
        if let Some(t) = &terms {
            y += rel * (1.0 + t.get(i).map_or(0.0, |a| a.abs())) * rng.random_range(-1.0..=1.0);
        }
        let mut reach = 0.0;
        if let Some((k, m)) = &acc {
            // einsum first sums the dims only one operand has, rounding that to the dtype
            let partial = if matches!(op, Op::Einsum { .. }) {
                u
            } else {
                0.0
            };
            reach = (k * u_acc + partial) * m[i];
            y += reach * rng.random_range(-1.0..=1.0);
        }
        // a sum whose rounding may exceed it may also cancel to exactly 0 (which a
        // comparison with 0 or a cast to bool then tells apart): one run says so
        if probe == Probe::Cancel && reach >= x.abs() {
            y = 0.0;
        }
        if probe == Probe::Cross && acc.is_some() {
            y = match dt {
                Some(d) if d.is_float() && d != DType::F64 => {
                    across_rounding(*x, reach, d).unwrap_or(*x)
                }
                _ => *x,
            };
        }
        *x = y;
    }
    let p = Tensor::from_vec(v, t.shape())?;
    match dt {
        Some(d) if d.is_float() && d != DType::F64 => p.to_dtype(d)?.to_dtype(DType::F64),
        _ => Ok(p),
    }
}

/// The value of `dt` on the far side of the rounding boundary nearest `x`, when that
/// boundary lies within `reach` of `x` (`None` otherwise, or where `x` is not finite).
fn across_rounding(x: f64, reach: f64, dt: DType) -> Option<f64> {
    let r = round_to(x, dt);
    if !r.is_finite() {
        return None;
    }
    [neighbour(r, dt, true), neighbour(r, dt, false)]
        .into_iter()
        .map(|n| (n, (x - (r + n) / 2.0).abs()))
        .filter(|&(n, gap)| n.is_finite() && gap <= reach)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(n, _)| n)
}

/// The next value of the float dtype `dt` above (`up`) or below `r`, a value of `dt`.
fn neighbour(r: f64, dt: DType, up: bool) -> f64 {
    // IEEE formats are sign and magnitude: a step away from 0 is the next bit pattern
    fn step16(bits: u16, up: bool) -> u16 {
        let negative = bits & 0x8000 != 0;
        match (bits & 0x7fff == 0, up != negative) {
            (true, _) => {
                if up {
                    1
                } else {
                    0x8001
                }
            }
            (false, true) => bits + 1,
            (false, false) => bits - 1,
        }
    }
    match dt {
        DType::F16 => {
            half::f16::from_bits(step16(smelt_rt::scalar::f16_from_f64(r).to_bits(), up)).to_f64()
        }
        DType::BF16 => {
            half::bf16::from_bits(step16(smelt_rt::scalar::bf16_from_f64(r).to_bits(), up)).to_f64()
        }
        DType::F32 if up => (r as f32).next_up() as f64,
        DType::F32 => (r as f32).next_down() as f64,
        _ if up => r.next_up(),
        _ => r.next_down(),
    }
}

/// The error a unary function's compiled code may make, in units of the roundoff: the
/// accuracy `codegen_cpu::math` promises for its f32 polynomials (≤ 6 ulp for the
/// transcendentals, up to 16 for formulas of several; an ulp is two units of roundoff),
/// which `tests/codegen_cpu.rs` holds every function to.
fn unary_ulps(f: crate::ir::op::UnaryOp) -> f64 {
    use crate::ir::op::UnaryOp::*;
    2.0 * match f {
        Exp | Log | Log1p | Expm1 | Sin | Cos | Tanh | Sigmoid | Gelu { .. } | Silu | Erf => 6.0,
        // the terms cancel where the slope crosses 0
        GeluSlope { .. } => 32.0,
        Elu { .. } | Softplus { .. } | Mish | LogSigmoid => 16.0,
        _ => 3.0,
    }
}

/// Ops whose error is best described backward (the exact result of inputs moved by the
/// rounding of their internal sums): the normalisations and attention.
fn backward_stable(op: &Op) -> bool {
    matches!(
        op,
        Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::LayerNorm { .. }
            | Op::BatchNorm { .. }
            | Op::Var { .. }
            | Op::Std { .. }
            | Op::Attention { .. }
            | Op::AttentionGrad { .. }
    )
}

/// Whether a unary function is computed as terms that cancel (gelu and its slope, the
/// silu family), so that its error scales with its operand rather than its result.
fn cancels(f: crate::ir::op::UnaryOp) -> bool {
    use crate::ir::op::UnaryOp::*;
    matches!(
        f,
        Gelu { .. } | GeluSlope { .. } | Silu | Mish | Softplus { .. } | LogSigmoid | Elu { .. }
    )
}

/// How many terms each result element of `op` accumulates, for ops that accumulate.
fn accumulated_terms(op: &Op, args: &[&Tensor], t: &Tensor) -> Option<f64> {
    let numel = |x: &Tensor| x.numel() as f64;
    let max_dim = args
        .iter()
        .flat_map(|a| a.shape().iter().copied())
        .max()
        .unwrap_or(1) as f64;
    let per_output = || numel(args[0]) / numel(t).max(1.0);
    let k = match op {
        Op::Reduce {
            op: ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod | ReduceOp::LogSumExp,
            ..
        } => per_output(),
        Op::Var { .. } | Op::Std { .. } => per_output(),
        Op::Matmul | Op::Linear { .. } => *args[0].shape().last().unwrap_or(&1) as f64,
        Op::Conv { .. } => {
            let w = args.get(1)?;
            numel(w) / (*w.shape().first().unwrap_or(&1) as f64).max(1.0)
        }
        Op::Einsum { .. }
        | Op::Cumsum { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::LayerNorm { .. }
        | Op::BatchNorm { .. }
        | Op::Attention { .. }
        | Op::AttentionGrad { .. }
        | Op::ScatterAdd { .. }
        | Op::IndexAdd { .. } => max_dim,
        Op::AvgPool2d { .. }
        | Op::AdaptiveAvgPool2d { .. }
        | Op::AvgPool2dGrad { .. }
        | Op::AdaptiveAvgPool2dGrad { .. } => per_output().max(max_dim),
        // sums over the batch and the image (a weight's gradient), or over the output
        // channels and the window (an input's)
        Op::ConvWeightGrad { .. } => numel(args[0]) / (*args[0].shape().get(1)? as f64).max(1.0),
        Op::ConvInputGrad { .. } => {
            let w = args.get(1)?;
            numel(w) / (*w.shape().get(1)? as f64).max(1.0)
        }
        _ => return None,
    };
    Some(k.max(1.0))
}

/// The scale of an accumulated result's error: `|op|(|x|)` for ops linear in each operand
/// (the sum of the terms' magnitudes), else `|result|`, at least 1 where the result is
/// normalised.
fn magnitude(op: &Op, args: &[&Tensor], t: &Tensor) -> Result<Vec<f64>> {
    let linear = matches!(
        op,
        Op::Reduce {
            op: ReduceOp::Sum | ReduceOp::Mean,
            ..
        } | Op::Matmul
            | Op::Linear { .. }
            | Op::Einsum { .. }
            | Op::Conv { .. }
            | Op::Cumsum { .. }
            | Op::AvgPool2d { .. }
            | Op::AdaptiveAvgPool2d { .. }
            | Op::AvgPool2dGrad { .. }
            | Op::AdaptiveAvgPool2dGrad { .. }
            | Op::ConvWeightGrad { .. }
            | Op::ConvInputGrad { .. }
            | Op::ScatterAdd { .. }
            | Op::IndexAdd { .. }
    );
    if linear {
        let abs: Vec<Tensor> = args
            .iter()
            .map(|a| match a.dtype().is_float() {
                true => apply(Op::Unary(crate::ir::op::UnaryOp::Abs), &[a]),
                false => Ok((*a).clone()),
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = abs.iter().collect();
        let m = apply(op.clone(), &refs)?;
        if m.shape() != t.shape() {
            bail!(Value, "{}: |op|(|x|) has another shape", op.name());
        }
        return m.try_to_f64_vec();
    }
    let normalised = matches!(
        op,
        Op::Reduce {
            op: ReduceOp::LogSumExp,
            ..
        } | Op::LogSoftmax { .. }
            | Op::LayerNorm { .. }
            | Op::BatchNorm { .. }
            | Op::Attention { .. }
            | Op::AttentionGrad { .. }
            | Op::Var { .. }
            | Op::Std { .. }
    );
    let floor = if normalised { 1.0 } else { 0.0 };
    Ok(t.try_to_f64_vec()?
        .into_iter()
        .map(|x| x.abs().max(floor))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f64s(v: &[f64]) -> Tensor {
        Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
    }

    fn record(orders: &mut Orders, a: &[f64], b: &[f64]) -> OrderKey {
        let (a, b) = (f64s(a), f64s(b));
        let op = Op::Binary(BinaryOp::Ne);
        let t = apply(op.clone(), &[&a, &b]).unwrap();
        orders
            .record("g", "%c", &op, &[&a, &b], &t)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn a_comparison_whose_operands_change_order_is_unsettled() {
        let mut exact = Orders::default();
        record(&mut exact, &[1.0, 5.0, 2.0], &[1.0 + 1e-6, 1.0, 2.0]);
        let mut run = Orders::default();
        let key = record(&mut run, &[1.0 + 2e-6, 5.5, 2.0], &[1.0 + 1e-6, 1.0, 2.0]);
        let t = Tensor::from_vec(vec![true, true, false], &[3]).unwrap();
        let got = exact.unsettle(&key, &run, t).unwrap().to_f64_vec();
        // the first pair crossed (exact: ne is true, so it is set false); the others kept
        // their order and keep this run's result
        assert_eq!(got, vec![0.0, 1.0, 0.0]);
        // ops that compare nothing are not recorded
        let (a, b) = (f64s(&[1.0]), f64s(&[2.0]));
        let add = Op::Binary(BinaryOp::Add);
        let sum = apply(add.clone(), &[&a, &b]).unwrap();
        assert!(
            run.record("g", "%s", &add, &[&a, &b], &sum)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn neighbours_are_the_next_values_of_the_dtype() {
        assert_eq!(neighbour(1.0, DType::F16, true), 1.0 + 1.0 / 1024.0);
        assert_eq!(neighbour(1.0, DType::F16, false), 1.0 - 1.0 / 2048.0);
        assert_eq!(neighbour(-4.0, DType::BF16, false), -4.03125);
        assert_eq!(neighbour(-4.0, DType::BF16, true), -3.984375);
        assert_eq!(neighbour(0.0, DType::F16, true), 2f64.powi(-24));
        assert_eq!(neighbour(0.0, DType::BF16, false), -(2f64.powi(-133)));
        assert_eq!(neighbour(1.0, DType::F32, true), 1.0 + 2f64.powi(-23));
        // -4.015625 is the bf16 boundary between -4 and -4.03125
        let x = -4.015625 - 2f64.powi(-21);
        assert_eq!(round_to(x, DType::BF16), -4.03125);
        assert_eq!(across_rounding(x, 1e-6, DType::BF16), Some(-4.0));
        assert_eq!(across_rounding(x, 1e-7, DType::BF16), None);
        assert_eq!(across_rounding(f64::INFINITY, 1.0, DType::F16), None);
    }

    #[test]
    fn a_sum_that_may_round_onto_an_integer_is_not_judged_by_pow() {
        // the sum is -4.015625 - 2^-21 exactly, which rounds to -4.03125 in bf16, where
        // pow(x, x) is NaN; summed in f32 it may round to -4, where it is 1/256
        let text = "graph f(%x: bf16[1,3], %w: bf16[1,3], %b: bf16[1]) {\n  \
                    %s = linear(%x, %w, %b)\n  %p = pow(%s, %s)\n  return %p\n}\n";
        let m = parse_module(text, "case.smelt").unwrap();
        let bf16 = |v: Vec<f32>, shape: &[usize]| {
            Tensor::from_vec(v, shape)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap()
        };
        let inputs = [
            bf16(vec![1.0, 1.0, 1.0], &[1, 3]),
            bf16(vec![-4.0, -0.015625, -(2f32.powi(-21))], &[1, 3]),
            bf16(vec![0.0], &[1]),
        ];
        for seed in 0..20 {
            let e = expect(m.entry(), text, &inputs, seed).unwrap();
            assert!(e[0].value[0].is_nan());
            assert_eq!(e[0].tol[0], f64::INFINITY, "seed {seed}");
        }
    }

    #[test]
    fn equality_of_exact_inputs_stays_judged() {
        // inputs one f16 ulp apart, and equal ones: nothing rounds, so nothing is unsettled
        let text = "graph f(%a: f16[3], %b: f16[3]) {\n  %c = ne(%a, %b)\n  return %c\n}\n";
        let m = parse_module(text, "case.smelt").unwrap();
        let a = Tensor::from_vec(vec![1.0f32, 2.0, -3.0], &[3])
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let b = Tensor::from_vec(vec![1.0f32 + 1.0 / 1024.0, 2.0, -3.0], &[3])
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let e = expect(m.entry(), text, &[a, b], 7).unwrap();
        assert_eq!(e[0].value, vec![1.0, 0.0, 0.0]);
        assert_eq!(e[0].tol, vec![0.0; 3]);
    }
}
