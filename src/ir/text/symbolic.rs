//! Graphs with symbolic dims (`.smelt` version 3): verified for every size of their symbols,
//! bound from a call's inputs, and read again at those sizes.
//!
//! Verification reads the text twice, each symbol sized by a different prime in each read
//! (`sym::sample_size`): every op's shape rule then runs on sizes that no two distinct
//! symbols share, so a graph that mixes `S` and `T` where one size is needed fails there,
//! and the message names the symbols rather than the primes.

use super::parser::parse_with;
use crate::ir::graph::{Graph, Module};
use crate::ir::op::TensorType;
use crate::ir::sym::{Bindings, DimExpr, describe, on_some_ladder, sample_point, sample_size};
use crate::{Error, Result, bail};
use std::collections::{BTreeSet, HashMap};

/// The most symbols one module may have.
const MAX_SYMBOLS: usize = 64;

/// How the parser sizes symbols, and what it learns of them on the way.
pub(super) struct SymEnv {
    /// Sizes so far.
    sizes: Bindings,
    /// Verifying: a symbol without a size takes the sample size of this (ladder, point).
    /// Otherwise (reading at a binding) such a symbol belongs to a graph the binding is not
    /// for, and takes the first sample size.
    round: Option<(usize, usize)>,
    /// Every symbol, in order of first appearance.
    order: Vec<String>,
    /// The expressions read while verifying, each once (to name sizes in messages).
    exprs: Vec<DimExpr>,
    /// Per graph: its inputs' dims as written.
    inputs: HashMap<String, Vec<(String, Vec<DimExpr>)>>,
    /// Per graph: the symbols it names.
    used: HashMap<String, BTreeSet<String>>,
}

impl SymEnv {
    fn new(sizes: Bindings, round: Option<(usize, usize)>) -> SymEnv {
        SymEnv {
            sizes,
            round,
            order: Vec::new(),
            exprs: Vec::new(),
            inputs: HashMap::new(),
            used: HashMap::new(),
        }
    }

    /// Whether this read verifies the graph for every size (rather than reading it at one).
    pub(super) fn verifying(&self) -> bool {
        self.round.is_some()
    }

    pub(super) fn record_input(
        &mut self,
        graph: &str,
        input: &str,
        dims: Vec<DimExpr>,
    ) -> Result<(), String> {
        for s in dims.iter().flat_map(|d| d.symbols()) {
            self.note(graph, s)?;
        }
        self.inputs
            .entry(graph.to_string())
            .or_default()
            .push((input.to_string(), dims));
        Ok(())
    }

    fn note(&mut self, graph: &str, s: &str) -> Result<(), String> {
        if !self.order.iter().any(|o| o == s) {
            if self.order.len() == MAX_SYMBOLS {
                return Err(format!("more than {MAX_SYMBOLS} symbols"));
            }
            self.order.push(s.to_string());
        }
        self.used
            .entry(graph.to_string())
            .or_default()
            .insert(s.to_string());
        if !self.sizes.contains_key(s) {
            let index = self.order.iter().position(|o| o == s).unwrap_or(0);
            let (ladder, point) = self.round.unwrap_or((0, 0));
            let size = sample_size(index, ladder, point);
            self.sizes.insert(s.to_string(), size);
        }
        Ok(())
    }

    /// The size of `e` in `graph`, where `what` is "dim" or an attribute's name; a negative
    /// size is an error (`length S-1 = -1 at S = 0`).
    pub(super) fn size(&mut self, graph: &str, e: &DimExpr, what: &str) -> Result<i64, String> {
        for s in e.symbols() {
            self.note(graph, s)?;
        }
        let v = e.eval(&self.sizes)?;
        if v < 0 {
            return Err(format!("{what} {e} = {v} at {}", describe(e, &self.sizes)));
        }
        if self.verifying() && !self.exprs.contains(e) {
            self.exprs.push(e.clone());
        }
        Ok(v)
    }

    /// A size as the text names it, when a symbol or an expression read has it.
    fn label(&self, v: usize) -> String {
        label(&self.order, &self.exprs, &[(&self.sizes, v as i64)]).unwrap_or(v.to_string())
    }

    /// `f32[B, S]`: a type with its sizes labelled.
    pub(super) fn fmt_type(&self, t: &TensorType) -> String {
        let dims: Vec<String> = t.shape.iter().map(|&d| self.label(d)).collect();
        format!("{}[{}]", t.dtype.name(), dims.join(", "))
    }

    /// Why `op` on operands of `types` failed while verifying: for a pointwise op whose
    /// operands do not broadcast, two dims that broadcasting needs equal and that may differ;
    /// otherwise the shape rule's message at the sizes tried.
    pub(super) fn explain(
        &self,
        op: &str,
        pointwise: bool,
        types: &[&TensorType],
        e: &Error,
    ) -> String {
        let shapes: Vec<&[usize]> = types.iter().map(|t| t.shape.as_slice()).collect();
        let broadcasting = pointwise && crate::ir::shape::broadcast_all(&shapes).is_err();
        for (i, a) in types.iter().enumerate().filter(|_| broadcasting) {
            for b in &types[i + 1..] {
                let n = a.shape.len().min(b.shape.len());
                let pairs = a.shape.iter().rev().zip(b.shape.iter().rev()).take(n);
                for (&x, &y) in pairs {
                    if x != y && x != 1 && y != 1 {
                        return format!(
                            "{op}: dims {} and {} may differ: {} vs {}",
                            self.label(x),
                            self.label(y),
                            self.fmt_type(a),
                            self.fmt_type(b)
                        );
                    }
                }
            }
        }
        let sizes: Vec<String> = self
            .order
            .iter()
            .map(|s| format!("{s} = {}", self.sizes[s]))
            .collect();
        format!(
            "{op}: {e} (at {}: a graph with symbols must hold for every size)",
            sizes.join(", ")
        )
    }
}

/// The expression that has value `v` under `sizes` for every `(sizes, v)` of `at`: a
/// symbol, one of `exprs`, or a product of two symbols (what `flatten` makes of `[B, S]`).
fn label(symbols: &[String], exprs: &[DimExpr], at: &[(&Bindings, i64)]) -> Option<String> {
    let fits = |e: &DimExpr| at.iter().all(|(env, v)| e.eval(env).ok() == Some(*v));
    let named = symbols.iter().map(|s| DimExpr::Sym(s.clone()));
    if let Some(e) = named.chain(exprs.iter().cloned()).find(|e| fits(e)) {
        return Some(e.to_string());
    }
    for (i, a) in symbols.iter().enumerate() {
        for b in &symbols[i..] {
            let e = DimExpr::Mul(
                Box::new(DimExpr::Sym(a.clone())),
                Box::new(DimExpr::Sym(b.clone())),
            );
            if fits(&e) {
                return Some(e.to_string());
            }
        }
    }
    None
}

/// A `.smelt` module whose dims may be symbols: verified for every size when read, bound
/// from inputs, and read again at a binding to give a concrete [`Module`].
///
/// ```
/// use smelt::ir::text::SymbolicModule;
/// let text = "graph f(%x: f32[B, S]) {\n  %y = view(%x, shape=[B*S])\n  return %y\n}\n";
/// let m = SymbolicModule::parse(text, "f.smelt").unwrap();
/// assert_eq!(m.symbols(), ["B", "S"]);
/// let b = m.bind(None, &[("x", &[2, 3][..])]).unwrap();
/// let g = m.instantiate(&b).unwrap();
/// assert_eq!(g.entry().node(g.entry().outputs()[0]).ty.shape, vec![6]);
/// ```
#[derive(Clone, Debug)]
pub struct SymbolicModule {
    text: String,
    file: String,
    /// Read with round 0's sizes (the module itself when it has no symbols).
    generic: Module,
    /// Read with round 1's sizes, and the sizes of both rounds.
    generic1: Option<Module>,
    sizes: [Bindings; 2],
    /// The expressions the text writes.
    exprs: Vec<DimExpr>,
    /// The ladder of sample sizes it was verified at.
    ladder: usize,
    symbols: Vec<String>,
    inputs: HashMap<String, Vec<(String, Vec<DimExpr>)>>,
    used: HashMap<String, BTreeSet<String>>,
}

impl SymbolicModule {
    /// Reads and verifies `text` (`file` names it in messages) for every size of its
    /// symbols. A file without symbols reads as `parse_module` reads it.
    pub fn parse(text: &str, file: &str) -> Result<SymbolicModule> {
        on_some_ladder(|ladder| Self::parse_at(text, file, ladder))
    }

    fn parse_at(text: &str, file: &str, ladder: usize) -> Result<SymbolicModule> {
        let (generic, env) = read(text, file, Bindings::new(), Some((ladder, 0)))?;
        // a second read at other sizes: a relation between symbols that held in the first
        // by chance fails here
        let (generic1, env1) = match env.order.is_empty() {
            true => (None, SymEnv::new(Bindings::new(), Some((ladder, 1)))),
            false => {
                let (m, env1) = read(text, file, Bindings::new(), Some((ladder, 1)))?;
                (Some(m), env1)
            }
        };
        Ok(SymbolicModule {
            text: text.to_string(),
            file: file.to_string(),
            generic,
            generic1,
            sizes: [env.sizes, env1.sizes],
            exprs: env.exprs,
            ladder,
            symbols: env.order,
            inputs: env.inputs,
            used: env.used,
        })
    }

    /// A module from one graph's text printed at several sizes of `symbols` (`texts[i]` at
    /// `points[i]`; three points or more): each integer that differs between the texts is
    /// written as the expression of the symbols that fits every point (`sym::fit`), then
    /// the text is verified as [`SymbolicModule::parse`] verifies it. An error when the
    /// texts differ in anything but sizes, or a size follows no such expression.
    pub fn from_samples(
        texts: &[String],
        symbols: &[String],
        points: &[Bindings],
        file: &str,
    ) -> Result<SymbolicModule> {
        let mut unnamed: Option<Vec<i64>> = None;
        let merged = merge_sizes(texts, |v| match crate::ir::sym::fit(symbols, points, v) {
            Some(e) => Some(e.to_string()),
            None => {
                unnamed.get_or_insert(v.to_vec());
                None
            }
        });
        match (merged, unnamed) {
            (Some(text), _) => SymbolicModule::parse(&text, file),
            (None, Some(v)) => bail!(
                Shape,
                "a size takes the values {v:?} at {}: no expression of {} gives them",
                points
                    .iter()
                    .map(|p| format!("{p:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                symbols.join(", ")
            ),
            (None, None) => bail!(
                Shape,
                "the graph differs between sizes in more than its sizes (an op or a value \
                 that changes with them)"
            ),
        }
    }

    /// `f` (a pass: the gradient, a rewrite) applied to graph `graph` (the first when
    /// `None`), for every size: `f` runs on the graph at three sample sizes of the symbols
    /// and the results are merged as [`SymbolicModule::from_samples`] merges them; an error
    /// when what `f` makes differs between sizes in more than its sizes.
    ///
    /// ```
    /// use smelt::ir::text::SymbolicModule;
    /// let text = "graph f(%x: f32[N]) {\n  %y = mul(%x, %x)\n  %s = sum(%y)\n  return %s\n}\n";
    /// let m = SymbolicModule::parse(text, "f.smelt").unwrap();
    /// let grad = m.transform(None, |g| smelt::passes::autodiff::autodiff(g, &["x"])).unwrap();
    /// assert!(grad.print(None).unwrap().contains("f32[N]"));
    /// ```
    pub fn transform(
        &self,
        graph: Option<&str>,
        f: impl Fn(&Graph) -> Result<Graph>,
    ) -> Result<SymbolicModule> {
        if !self.is_symbolic() {
            let g = f(self.generic.pick(graph)?)?;
            return SymbolicModule::parse(&super::print_graph(&g), &self.file);
        }
        let third = sample_point(&self.symbols, self.ladder, 2);
        let points = [self.sizes[0].clone(), self.sizes[1].clone(), third];
        let texts = points
            .iter()
            .map(|p| {
                let m = self.instantiate(p)?;
                Ok(super::print_graph(&f(m.pick(graph)?)?))
            })
            .collect::<Result<Vec<_>>>()?;
        SymbolicModule::from_samples(&texts, &self.symbols, &points, &self.file)
    }

    /// The symbols, in order of first appearance.
    pub fn symbols(&self) -> &[String] {
        &self.symbols
    }

    /// Whether any dim is a symbol.
    pub fn is_symbolic(&self) -> bool {
        !self.symbols.is_empty()
    }

    /// The module at sample sizes of its symbols (each a prime above 100), for looking at
    /// its structure; for a module without symbols, the module.
    pub fn sample(&self) -> &Module {
        &self.generic
    }

    /// The text of graph `graph` (every graph when `None`) with every type written out, as
    /// `print_module` writes a concrete module, its sizes written as the symbols give them
    /// (`f32[B*S, 128]`, `view(%x, shape=[B*S, 128])`).
    pub fn print(&self, graph: Option<&str>) -> Result<String> {
        self.render(|m| {
            Ok(match graph {
                Some(name) => super::print_graph(m.graph(name)?),
                None => super::print_module(m),
            })
        })
    }

    /// What `text` writes of the module (a `.smelt` text, a Graphviz drawing), its sizes
    /// written as the symbols give them: `text` runs on the module at two sample sizes, and
    /// each integer that differs between the two is replaced by its expression (`?` where
    /// none is known).
    pub fn render(&self, text: impl Fn(&Module) -> Result<String>) -> Result<String> {
        let Some(generic1) = &self.generic1 else {
            return text(&self.generic);
        };
        let texts = [text(&self.generic)?, text(generic1)?];
        let merged = merge_sizes(&texts, |v| {
            let named = label(
                &self.symbols,
                &self.exprs,
                &[(&self.sizes[0], v[0]), (&self.sizes[1], v[1])],
            );
            Some(named.unwrap_or_else(|| "?".into()))
        });
        let [first, _] = texts;
        Ok(merged.unwrap_or(first))
    }

    /// `B = 101, S = 103`: the sizes of [`SymbolicModule::sample`].
    pub fn sample_sizes(&self) -> String {
        self.symbols
            .iter()
            .map(|s| format!("{s} = {}", self.sizes[0][s]))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// [`SymbolicModule::sample`], taken: for a module without symbols, the module.
    pub fn into_sample(self) -> Module {
        self.generic
    }

    /// The dims of graph `graph`'s inputs as written, by input.
    pub fn input_dims(&self, graph: &str) -> Option<&[(String, Vec<DimExpr>)]> {
        self.inputs.get(graph).map(Vec::as_slice)
    }

    /// The sizes of the symbols of graph `graph` (the first when `None`) that the inputs
    /// `given` (by name, with their shapes) give. A symbol two inputs size differently is an
    /// error naming both (`S is 5 from %x but 6 from %b`); so is a dim written as an
    /// expression that the binding contradicts, and a symbol of the graph no input sizes.
    pub fn bind(&self, graph: Option<&str>, given: &[(&str, &[usize])]) -> Result<Bindings> {
        let g = self.generic.pick(graph)?;
        let mut env = Bindings::new();
        let mut from: HashMap<String, String> = HashMap::new();
        let declared = self.inputs.get(&g.name).map(Vec::as_slice).unwrap_or(&[]);
        let shape_of = |input: &str| given.iter().find(|(n, _)| *n == input).map(|(_, s)| *s);
        // bare symbols first: they size the expressions
        for (input, dims) in declared {
            let Some(shape) = shape_of(input).filter(|s| s.len() == dims.len()) else {
                continue; // missing or of another rank: the concrete read says so
            };
            for (d, &n) in dims.iter().zip(shape) {
                let DimExpr::Sym(s) = d else { continue };
                let n = n as i64;
                match env.get(s) {
                    Some(&m) if m != n => {
                        bail!(Shape, "{s} is {m} from %{} but {n} from %{input}", from[s])
                    }
                    Some(_) => {}
                    None => {
                        env.insert(s.clone(), n);
                        from.insert(s.clone(), input.clone());
                    }
                }
            }
        }
        // then expressions: solved for a symbol they alone name, checked otherwise
        for (input, dims) in declared {
            let Some(shape) = shape_of(input).filter(|s| s.len() == dims.len()) else {
                continue;
            };
            for (i, (d, &n)) in dims.iter().zip(shape).enumerate() {
                if matches!(d, DimExpr::Sym(_) | DimExpr::Int(_)) {
                    continue;
                }
                let n = n as i64;
                let unbound: Vec<&str> = d
                    .symbols()
                    .into_iter()
                    .filter(|s| !env.contains_key(*s))
                    .collect();
                if let [s] = unbound.as_slice() {
                    let Some(v) = d.solve(s, n, &env) else {
                        bail!(
                            Shape,
                            "%{input}: dim {i} is {d}, and no size of {s} makes it {n}"
                        );
                    };
                    env.insert(s.to_string(), v);
                    from.insert(s.to_string(), input.clone());
                    continue;
                }
                if !unbound.is_empty() {
                    continue; // reported below as unbound
                }
                let want = d.eval(&env).map_err(Error::Shape)?;
                if want != n {
                    bail!(
                        Shape,
                        "%{input}: dim {i} is {d} = {want} at {}, but the input's is {n}",
                        describe(d, &env)
                    );
                }
            }
        }
        let mut needed: BTreeSet<&String> = BTreeSet::new();
        for name in graph_and_bodies(g) {
            needed.extend(self.used.get(&name).into_iter().flatten());
        }
        if let Some(s) = needed.into_iter().find(|s| !env.contains_key(*s)) {
            let what = match given.is_empty() {
                true => {
                    "no input is given to size it (commands without inputs, and ahead-of-time objects, need fixed sizes)"
                }
                false => "no input given sizes it",
            };
            bail!(Shape, "symbol {s} of graph {} has no size: {what}", g.name);
        }
        Ok(env)
    }

    /// The module at `sizes` (from [`SymbolicModule::bind`]), verified at those sizes; an
    /// expression that comes out negative is an error (`length S-1 = -1 at S = 0`).
    pub fn instantiate(&self, sizes: &Bindings) -> Result<Module> {
        if !self.is_symbolic() {
            return Ok(self.generic.clone());
        }
        Ok(read(&self.text, &self.file, sizes.clone(), None)?.0)
    }
}

/// `g`'s name and those of the bodies it calls, transitively.
fn graph_and_bodies(g: &Graph) -> Vec<String> {
    let mut names = vec![g.name.clone()];
    names.extend(
        crate::ir::control::Control::bodies_of(g)
            .iter()
            .map(|b| b.name.clone()),
    );
    names
}

fn read(
    text: &str,
    file: &str,
    sizes: Bindings,
    round: Option<(usize, usize)>,
) -> Result<(Module, SymEnv)> {
    let (m, env) = parse_with(text, file, Some(SymEnv::new(sizes, round)))?;
    let env = env.ok_or_else(|| Error::Value("the symbolic reader lost its sizes".into()))?;
    Ok((m, env))
}

/// A text cut into integers (those that start a word) and the text between them.
fn pieces(s: &str) -> Vec<(bool, String)> {
    let mut out: Vec<(bool, String)> = Vec::new();
    let (mut prev, mut prev2): (Option<char>, Option<char>) = (None, None);
    for c in s.chars() {
        // not inside a name, a float's fraction or its exponent (`1e-05`)
        let exponent = matches!(prev, Some('-' | '+')) && matches!(prev2, Some('e' | 'E'));
        let word_start =
            !exponent && !prev.is_some_and(|p| p.is_alphanumeric() || p == '_' || p == '.');
        let int = c.is_ascii_digit() && (word_start || out.last().is_some_and(|(n, _)| *n));
        match out.last_mut() {
            Some((n, piece)) if *n == int && !(int && word_start) => piece.push(c),
            _ => out.push((int, c.to_string())),
        }
        (prev2, prev) = (prev, Some(c));
    }
    out
}

/// The texts (one module printed at several sizes) as one, each integer that differs
/// between them replaced by `name(its values)`; `None` when they differ in anything else, or
/// `name` names nothing.
fn merge_sizes(texts: &[String], mut name: impl FnMut(&[i64]) -> Option<String>) -> Option<String> {
    let cut: Vec<Vec<(bool, String)>> = texts.iter().map(|t| pieces(t)).collect();
    let first = cut.first()?;
    if cut.iter().any(|c| c.len() != first.len()) {
        return None;
    }
    let mut out = String::new();
    for (k, (int, piece)) in first.iter().enumerate() {
        let same = cut.iter().all(|c| c[k].1 == *piece);
        if same {
            out.push_str(piece);
        } else if *int && cut.iter().all(|c| c[k].0) {
            let values: Option<Vec<i64>> = cut.iter().map(|c| c[k].1.parse().ok()).collect();
            out.push_str(&name(&values?)?);
        } else {
            return None;
        }
    }
    Some(out)
}
