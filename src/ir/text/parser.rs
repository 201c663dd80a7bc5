//! `.smelt` text → verified graphs, with `file:line:col: message` errors.

use super::fmt_type;
use super::lexer::{Tok, Token, lex};
use super::symbolic::SymEnv;
use crate::ir::attrs::Attr;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::{Graph, Module, ValueId};
use crate::ir::op::{BinaryOp, Op, TensorType};
use crate::ir::sym::{DimExpr, is_symbol_name};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// A `name=value` attribute as written, with the token of its name (of its value `@name` for
/// a body reference), for error positions.
type Attribute = (String, Attr, Token);

/// A statement's result as written (`%a: f32[4]`): its name and token, and its type
/// annotation with the annotation's token.
type Named = (String, Token, Option<(TensorType, Token)>);

/// Parses a `.smelt` file; `file` names it in error messages. A control op's bodies (`@name`)
/// may be any graph of the file, before or after it.
pub fn parse_module(text: &str, file: &str) -> Result<Module> {
    parse_with(text, file, None).map(|(m, _)| m)
}

/// Parses a `.smelt` file whose dims may be symbols, sized by `env` (`SymbolicModule`).
pub(super) fn parse_with(
    text: &str,
    file: &str,
    syms: Option<SymEnv>,
) -> Result<(Module, Option<SymEnv>)> {
    let toks = lex(text).map_err(|e| Error::Parse {
        file: file.to_string(),
        line: e.line,
        col: e.col,
        msg: e.msg,
    })?;
    let mut p = Parser {
        spans: graph_spans(&toks),
        toks,
        pos: 0,
        file,
        done: HashMap::new(),
        active: Vec::new(),
        syms,
        dim_atoms: 0,
    };
    let mut graphs: Vec<Graph> = Vec::new();
    loop {
        let t = p.peek().clone();
        if t.tok == Tok::Eof && !graphs.is_empty() {
            return Ok((Module { graphs }, p.syms));
        }
        let start = p.pos;
        let g = match p.span_at(start) {
            // parsed already, as the body of a graph before it
            Some((name, end)) if p.done.contains_key(&name) => {
                if graphs.iter().any(|h| h.name == name) {
                    return Err(p.err(&t, format!("graph '{name}' defined twice")));
                }
                p.pos = end;
                p.done[&name].as_ref().clone()
            }
            _ => p.graph()?.as_ref().clone(),
        };
        if graphs.iter().any(|h| h.name == g.name) {
            return Err(p.err(&t, format!("graph '{}' defined twice", g.name)));
        }
        graphs.push(g);
    }
}

/// Where each top-level graph's tokens start and end (`graph NAME ... }`), by name: the
/// first definition of a name only (a second one is an error when the main loop reaches it).
fn graph_spans(toks: &[Token]) -> HashMap<String, (usize, usize)> {
    let mut spans = HashMap::new();
    let mut i = 0;
    while let (Some(Tok::Ident(kw)), Some(Tok::Ident(name))) =
        (toks.get(i).map(|t| &t.tok), toks.get(i + 1).map(|t| &t.tok))
    {
        if kw != "graph" {
            break;
        }
        let mut j = i + 2;
        while j < toks.len() && toks[j].tok != Tok::Punct('{') {
            j += 1;
        }
        let mut depth = 0usize;
        let end = loop {
            match toks.get(j).map(|t| &t.tok) {
                Some(Tok::Punct('{')) => depth += 1,
                Some(Tok::Punct('}')) => {
                    depth -= 1;
                    if depth == 0 {
                        break Some(j + 1);
                    }
                }
                None | Some(Tok::Eof) => break None,
                _ => {}
            }
            j += 1;
        };
        let Some(end) = end else { break };
        spans.entry(name.clone()).or_insert((i, end));
        i = end;
    }
    spans
}

struct Parser<'a> {
    toks: Vec<Token>,
    pos: usize,
    file: &'a str,
    /// Top-level graphs by name: first and one-past-last token.
    spans: HashMap<String, (usize, usize)>,
    /// Graphs parsed so far, by name.
    done: HashMap<String, Arc<Graph>>,
    /// Graphs being parsed (outermost first): a body among them is a recursion.
    active: Vec<String>,
    /// How symbolic dims get their sizes; `None` when the reader takes concrete graphs only.
    syms: Option<SymEnv>,
    /// Atoms and parentheses read in the current dimension (bounded: no hostile file makes
    /// the reader recurse deeply).
    dim_atoms: usize,
}

/// The most atoms and parentheses one dimension may hold.
const MAX_DIM_ATOMS: usize = 64;

/// One parsed call argument.
enum Arg {
    Operand(ValueId),
    None,
}

impl Parser<'_> {
    fn peek(&self) -> &Token {
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn peek2(&self) -> &Tok {
        &self.toks[(self.pos + 1).min(self.toks.len() - 1)].tok
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn err(&self, at: &Token, msg: String) -> Error {
        Error::Parse {
            file: self.file.to_string(),
            line: at.line,
            col: at.col,
            msg,
        }
    }

    fn expected(&self, what: &str) -> Error {
        let t = self.peek();
        self.err(t, format!("expected {what}, found {}", t.tok))
    }

    fn punct(&mut self, c: char) -> Result<Token> {
        if self.peek().tok == Tok::Punct(c) {
            Ok(self.next())
        } else {
            Err(self.expected(&format!("'{c}'")))
        }
    }

    fn eat(&mut self, c: char) -> bool {
        let hit = self.peek().tok == Tok::Punct(c);
        if hit {
            self.next();
        }
        hit
    }

    fn keyword(&mut self, kw: &str) -> Result<Token> {
        match &self.peek().tok {
            Tok::Ident(s) if s == kw => Ok(self.next()),
            _ => Err(self.expected(&format!("'{kw}'"))),
        }
    }

    fn ident(&mut self, what: &str) -> Result<(String, Token)> {
        match self.peek().tok.clone() {
            Tok::Ident(s) => Ok((s, self.next())),
            _ => Err(self.expected(what)),
        }
    }

    fn value_name(&mut self) -> Result<(String, Token)> {
        match self.peek().tok.clone() {
            Tok::Value(s) => Ok((s, self.next())),
            _ => Err(self.expected("a value (%name)")),
        }
    }

    /// The graph whose definition starts at token `start`, and its end.
    fn span_at(&self, start: usize) -> Option<(String, usize)> {
        self.spans
            .iter()
            .find(|(_, (s, _))| *s == start)
            .map(|(n, (_, e))| (n.clone(), *e))
    }

    /// The graph `@name` (at token `at`), parsed now if the file defines it later.
    fn body(&mut self, name: &str, at: &Token) -> Result<Arc<Graph>> {
        if let Some(g) = self.done.get(name) {
            return Ok(g.clone());
        }
        if self.active.iter().any(|a| a == name) {
            let chain: Vec<String> = self.active.iter().map(|a| format!("@{a}")).collect();
            return Err(self.err(
                at,
                format!(
                    "recursive body @{name}: {} -> @{name} (bodies may not call themselves)",
                    chain.join(" -> ")
                ),
            ));
        }
        let Some(&(start, _)) = self.spans.get(name) else {
            return Err(self.err(at, format!("no graph named @{name} in this file")));
        };
        let back = self.pos;
        self.pos = start;
        let g = self.graph();
        self.pos = back;
        g
    }

    fn graph(&mut self) -> Result<Arc<Graph>> {
        self.active.push(String::new());
        let g = self.graph_inner();
        self.active.pop();
        let g = Arc::new(g?);
        self.done.insert(g.name.clone(), g.clone());
        Ok(g)
    }

    fn graph_inner(&mut self) -> Result<Graph> {
        let kw = self.keyword("graph")?;
        let (name, _) = self.ident("a graph name")?;
        if let Some(a) = self.active.last_mut() {
            *a = name.clone();
        }
        let mut g = Graph::new(&name);
        self.punct('(')?;
        if !self.eat(')') {
            loop {
                let (pname, at) = self.value_name()?;
                self.punct(':')?;
                let (ty, dims) = self.ty_dims()?;
                if let Some(env) = &mut self.syms {
                    env.record_input(&name, &pname, dims)
                        .map_err(|m| self.err(&at, m))?;
                }
                g.add_input(&pname, ty)
                    .map_err(|e| self.err(&at, e.to_string()))?;
                if self.eat(')') {
                    break;
                }
                if !self.eat(',') {
                    return Err(self.expected("',' or ')'"));
                }
            }
        }
        self.punct('{')?;
        while matches!(self.peek().tok, Tok::Value(_)) {
            self.stmt(&mut g)?;
        }
        if !matches!(&self.peek().tok, Tok::Ident(s) if s == "return") {
            return Err(self.expected("a statement or 'return'"));
        }
        self.next();
        let mut outs = vec![self.use_value(&g)?];
        while self.eat(',') {
            outs.push(self.use_value(&g)?);
        }
        self.punct('}')?;
        g.set_outputs(outs);
        g.verify().map_err(|e| self.err(&kw, e.to_string()))?;
        Ok(g)
    }

    fn ty(&mut self) -> Result<TensorType> {
        self.ty_dims().map(|(t, _)| t)
    }

    /// A type and its dims as written (symbols and expressions sized through `syms`).
    fn ty_dims(&mut self) -> Result<(TensorType, Vec<DimExpr>)> {
        let (d, at) = self.ident("a dtype")?;
        let dtype =
            DType::from_name(&d).ok_or_else(|| self.err(&at, format!("unknown dtype '{d}'")))?;
        self.punct('[')?;
        let (mut shape, mut dims) = (Vec::new(), Vec::new());
        if !self.eat(']') {
            loop {
                let t = self.peek().clone();
                let e = match t.tok {
                    Tok::Int(_) | Tok::Ident(_) | Tok::Punct('(') => self.dim()?,
                    _ => {
                        return Err(
                            self.err(&t, format!("expected a dimension size, found {}", t.tok))
                        );
                    }
                };
                let n = match e {
                    DimExpr::Int(n) if n >= 0 => n,
                    DimExpr::Int(_) => {
                        return Err(
                            self.err(&t, format!("expected a dimension size, found {}", t.tok))
                        );
                    }
                    _ => self.size(&e, "dim", &t)?,
                };
                shape.push(n as usize);
                dims.push(e);
                if self.eat(']') {
                    break;
                }
                if !self.eat(',') {
                    return Err(self.expected("',' or ']'"));
                }
            }
        }
        Ok((TensorType::new(dtype, shape), dims))
    }

    /// The size of a symbolic `e` (written at `at`, in `what`: "dim", an attribute's name).
    fn size(&mut self, e: &DimExpr, what: &str, at: &Token) -> Result<i64> {
        if e.is_constant() {
            return match e.eval(&Default::default()) {
                Ok(n) if n >= 0 || what != "dim" => Ok(n),
                Ok(n) => Err(self.err(at, format!("{what} {e} = {n} is negative"))),
                Err(m) => Err(self.err(at, m)),
            };
        }
        let graph = self.active.last().cloned().unwrap_or_default();
        let Some(env) = &mut self.syms else {
            return Err(self.err(
                at,
                format!(
                    "symbolic size {e}: a graph with symbols is read by SymbolicModule::parse \
                     (or `smelt run`, which sizes them from the inputs)"
                ),
            ));
        };
        env.size(&graph, e, what).map_err(|m| self.err(at, m))
    }

    /// One dimension as written (an integer, a symbol or an expression of them).
    fn dim(&mut self) -> Result<DimExpr> {
        self.dim_atoms = 0;
        self.dim_expr()
    }

    /// `+ -` of terms; a negative integer after a term subtracts (`S-1` lexes as `S` then
    /// `-1`).
    fn dim_expr(&mut self) -> Result<DimExpr> {
        let mut e = self.dim_term()?;
        loop {
            match self.peek().tok {
                Tok::Punct('+') => {
                    self.next();
                    e = DimExpr::Add(Box::new(e), Box::new(self.dim_term()?));
                }
                Tok::Punct('-') => {
                    self.next();
                    e = DimExpr::Sub(Box::new(e), Box::new(self.dim_term()?));
                }
                Tok::Int(n) if n < 0 => {
                    let t = self.next();
                    let Some(m) = n.checked_neg() else {
                        return Err(self.err(&t, format!("size {n} is out of range")));
                    };
                    let rest = self.dim_term_after(DimExpr::Int(m))?;
                    e = DimExpr::Sub(Box::new(e), Box::new(rest));
                }
                _ => return Ok(e),
            }
        }
    }

    fn dim_term(&mut self) -> Result<DimExpr> {
        let a = self.dim_atom()?;
        self.dim_term_after(a)
    }

    /// `* //` of atoms, the first one `a`.
    fn dim_term_after(&mut self, mut a: DimExpr) -> Result<DimExpr> {
        loop {
            if self.eat('*') {
                a = DimExpr::Mul(Box::new(a), Box::new(self.dim_atom()?));
            } else if self.peek().tok == Tok::Punct('/') {
                self.next();
                self.punct('/')?;
                a = DimExpr::FloorDiv(Box::new(a), Box::new(self.dim_atom()?));
            } else {
                return Ok(a);
            }
        }
    }

    fn dim_atom(&mut self) -> Result<DimExpr> {
        let t = self.next();
        self.dim_atoms += 1;
        if self.dim_atoms > MAX_DIM_ATOMS {
            return Err(self.err(
                &t,
                format!("a size of more than {MAX_DIM_ATOMS} terms and parentheses"),
            ));
        }
        match t.tok {
            Tok::Int(n) => Ok(DimExpr::Int(n)),
            Tok::Ident(ref name) if is_symbol_name(name) && !is_reserved(name) => {
                Ok(DimExpr::Sym(name.clone()))
            }
            Tok::Punct('(') => {
                let e = self.dim_expr()?;
                self.punct(')')?;
                Ok(e)
            }
            _ => Err(self.err(&t, format!("expected a size or a symbol, found {}", t.tok))),
        }
    }

    /// Whether an attribute value at the current token is a symbolic size: a symbol, a
    /// parenthesis, or an integer followed by an operator.
    fn at_dim_expr(&self) -> bool {
        match &self.peek().tok {
            Tok::Ident(w) => is_symbol_name(w) && !is_reserved(w),
            Tok::Punct('(') => true,
            Tok::Int(_) => {
                matches!(self.peek2(), Tok::Punct('+' | '-' | '*' | '/'))
                    || matches!(self.peek2(), Tok::Int(n) if *n < 0)
            }
            _ => false,
        }
    }

    fn use_value(&mut self, g: &Graph) -> Result<ValueId> {
        let (name, at) = self.value_name()?;
        g.value(&name)
            .ok_or_else(|| self.err(&at, format!("use of undefined value %{name}")))
    }

    fn stmt(&mut self, g: &mut Graph) -> Result<()> {
        // `%a, %b: f32[4] = op(...)`: one or more results, each optionally typed
        let mut results: Vec<Named> = Vec::new();
        loop {
            let (name, at) = self.value_name()?;
            if g.value(&name).is_some() || results.iter().any(|(n, _, _)| *n == name) {
                return Err(self.err(&at, format!("value %{name} defined twice")));
            }
            let annot = if self.eat(':') {
                let t = self.peek().clone();
                Some((self.ty()?, t))
            } else {
                None
            };
            results.push((name, at, annot));
            if !self.eat(',') {
                break;
            }
        }
        self.punct('=')?;
        let (op_name, op_at) = self.ident("an op name")?;
        if crate::ir::control::CONTROL_OPS.contains(&op_name.as_str()) {
            return self.control_stmt(g, &op_name, &op_at, results);
        }
        if !crate::ir::attrs::op_names().contains(&op_name.as_str()) {
            return Err(self.err(&op_at, format!("unknown op '{op_name}'")));
        }
        if results.len() > 1 {
            return Err(self.err(
                &results[1].1,
                format!("'{op_name}' has one result but {} are named", results.len()),
            ));
        }
        let Some((name, _, annot)) = results.pop() else {
            return Err(self.expected("a value (%name)"));
        };
        self.punct('(')?;
        let (args, attrs) = self.args(g)?;
        let slots: Vec<bool> = args.iter().map(|a| matches!(a, Arg::Operand(_))).collect();
        let operands: Vec<ValueId> = args
            .iter()
            .filter_map(|a| match a {
                Arg::Operand(v) => Some(*v),
                Arg::None => None,
            })
            .collect();
        let (operands, attrs) = self.sugar(g, &op_name, &name, operands, attrs)?;
        let attr_refs: Vec<(&str, Attr)> = attrs
            .iter()
            .map(|(n, a, _)| (n.as_str(), a.clone()))
            .collect();
        let op = Op::from_call_detailed(&op_name, &slots, &attr_refs).map_err(|e| {
            let at = e
                .attr
                .and_then(|n| {
                    attrs
                        .iter()
                        .find(|(m, _, _)| *m == n)
                        .map(|(_, _, t)| t.clone())
                })
                .unwrap_or_else(|| op_at.clone());
            self.err(&at, e.msg)
        })?;
        let pointwise = op.is_pointwise();
        let v = g.add_op_named(op, &operands, &name).map_err(|e| {
            let types: Vec<&TensorType> = operands.iter().map(|&o| &g.node(o).ty).collect();
            let msg = match &self.syms {
                Some(env) if env.verifying() => env.explain(&op_name, pointwise, &types, &e),
                _ => format!("{op_name}: {e}"),
            };
            self.err(&op_at, msg)
        })?;
        self.check_annotation(g, v, annot)
    }

    fn check_annotation(
        &self,
        g: &Graph,
        v: ValueId,
        annot: Option<(TensorType, Token)>,
    ) -> Result<()> {
        if let Some((want, t)) = annot {
            let got = &g.node(v).ty;
            if got.dtype != want.dtype || got.shape != want.shape {
                let show = |t: &TensorType| match &self.syms {
                    Some(env) if env.verifying() => env.fmt_type(t),
                    _ => fmt_type(t),
                };
                return Err(self.err(
                    &t,
                    format!(
                        "type annotation {} does not match inferred {}",
                        show(&want),
                        show(got)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `%a, %b = while_loop(%x, %y, cond=@c, body=@b)` and the other control ops: operands,
    /// bodies by name, and `scan`'s `carries=`/`reverse=`.
    fn control_stmt(
        &mut self,
        g: &mut Graph,
        op_name: &str,
        op_at: &Token,
        results: Vec<Named>,
    ) -> Result<()> {
        use crate::ir::control::{Control, ControlKind};
        self.punct('(')?;
        let (args, attrs) = self.args(g)?;
        let mut operands = Vec::with_capacity(args.len());
        for a in args {
            match a {
                Arg::Operand(v) => operands.push(v),
                Arg::None => return Err(self.err(op_at, format!("{op_name}: an operand is none"))),
            }
        }
        let mut carries: Option<usize> = None;
        let mut reverse = false;
        let mut refs: Vec<(String, String, Token)> = Vec::new();
        for (n, a, at) in attrs {
            match (n.as_str(), a) {
                ("carries", Attr::Int(c)) if op_name == "scan" && c >= 0 => {
                    carries = Some(c as usize)
                }
                ("reverse", Attr::Bool(r)) if op_name == "scan" => reverse = r,
                (_, Attr::Graph(b)) => refs.push((n, b, at)),
                (_, other) => {
                    return Err(
                        self.err(&at, format!("{op_name}: unexpected attribute {n}={other}"))
                    );
                }
            }
        }
        let kind = match op_name {
            "cond" => ControlKind::Cond,
            "while_loop" => ControlKind::WhileLoop,
            "fori_loop" => ControlKind::ForiLoop,
            _ => ControlKind::Scan {
                carries: carries.ok_or_else(|| {
                    self.err(
                        op_at,
                        "scan: expects carries=N (how many operands are carries)".into(),
                    )
                })?,
                reverse,
            },
        };
        let mut bodies = Vec::new();
        for role in kind.body_names() {
            let Some(i) = refs.iter().position(|(n, _, _)| n == role) else {
                return Err(self.err(op_at, format!("{op_name}: expects {role}=@graph")));
            };
            let (_, b, at) = refs.remove(i);
            bodies.push(crate::ir::control::Body(self.body(&b, &at)?));
        }
        if let Some((n, _, at)) = refs.first() {
            return Err(self.err(at, format!("{op_name}: unexpected attribute {n}=@...")));
        }
        let names: Vec<String> = results.iter().map(|(n, _, _)| n.clone()).collect();
        let c = Control { kind, bodies };
        let vs = g
            .add_control(c, &operands, Some(&names))
            .map_err(|e| self.err(op_at, e.to_string()))?;
        for (v, (_, _, annot)) in vs.into_iter().zip(results) {
            self.check_annotation(g, v, annot)?;
        }
        Ok(())
    }

    /// PyTorch's forms that the graph spells with more than one op, rewritten into those
    /// ops (each extra value named after the statement's, `%z.alpha`):
    /// - `add(x, y, alpha=a)` and `sub(x, y, alpha=a)`: `y * a` first, with PyTorch's
    ///   checks of `alpha` against the operands' dtype;
    /// - `scatter(x, index, value, dim=)` with a bare number `value`: the number cast to
    ///   `x`'s dtype and expanded to `index`'s shape (a view, no memory).
    fn sugar(
        &self,
        g: &mut Graph,
        op: &str,
        name: &str,
        mut operands: Vec<ValueId>,
        mut attrs: Vec<Attribute>,
    ) -> Result<(Vec<ValueId>, Vec<Attribute>)> {
        match op {
            "add" | "sub" => {
                let Some(i) = attrs.iter().position(|(n, _, _)| n == "alpha") else {
                    return Ok((operands, attrs));
                };
                let (_, alpha, at) = attrs.remove(i);
                let alpha = match alpha {
                    Attr::Int(i) => Scalar::Int(i),
                    Attr::Float(x) => Scalar::Float(x),
                    Attr::Bool(b) => Scalar::Bool(b),
                    other => {
                        return Err(self.err(
                            &at,
                            format!("attribute 'alpha' of '{op}' expects a number, got {other}"),
                        ));
                    }
                };
                let &[x, y] = operands.as_slice() else {
                    return Ok((operands, attrs));
                };
                let (tx, ty) = (g.node(x).ty.clone(), g.node(y).ty.clone());
                let common = BinaryOp::Add
                    .compute_dtype(&tx, &ty)
                    .map_err(|e| self.err(&at, e.to_string()))?;
                crate::ir::op::check_alpha(alpha, common)
                    .map_err(|e| self.err(&at, e.to_string()))?;
                if alpha.to_f64() != 1.0 {
                    let a = g
                        .add_scalar(alpha)
                        .map_err(|e| self.err(&at, e.to_string()))?;
                    let scaled = g
                        .add_op_named(Op::Binary(BinaryOp::Mul), &[y, a], &format!("{name}.alpha"))
                        .map_err(|e| self.err(&at, e.to_string()))?;
                    operands = vec![x, scaled];
                }
                Ok((operands, attrs))
            }
            "scatter" if operands.len() == 3 && g.node(operands[2]).is_inline_scalar() => {
                let (x, index, v) = (operands[0], operands[1], operands[2]);
                let dtype = g.node(x).ty.dtype;
                let size: Vec<i64> = g.node(index).ty.shape.iter().map(|&d| d as i64).collect();
                let at = self.peek().clone();
                let cast = g
                    .add_op_named(Op::To { dtype }, &[v], &format!("{name}.value"))
                    .map_err(|e| self.err(&at, e.to_string()))?;
                let src = g
                    .add_op_named(Op::Expand { size }, &[cast], &format!("{name}.src"))
                    .map_err(|e| self.err(&at, e.to_string()))?;
                operands[2] = src;
                Ok((operands, attrs))
            }
            _ => Ok((operands, attrs)),
        }
    }

    /// Arguments up to and including ')': positional operands, then `name=value` attributes.
    #[allow(clippy::type_complexity)]
    fn args(&mut self, g: &mut Graph) -> Result<(Vec<Arg>, Vec<(String, Attr, Token)>)> {
        let mut args = Vec::new();
        let mut attrs: Vec<(String, Attr, Token)> = Vec::new();
        if self.eat(')') {
            return Ok((args, attrs));
        }
        loop {
            let t = self.peek().clone();
            let is_attr = matches!(t.tok, Tok::Ident(_)) && *self.peek2() == Tok::Punct('=');
            if is_attr {
                let (n, at) = self.ident("an attribute name")?;
                self.punct('=')?;
                if attrs.iter().any(|(m, _, _)| *m == n) {
                    return Err(self.err(&at, format!("attribute '{n}' given twice")));
                }
                let value_at = self.peek().clone();
                let a = self.attr(&n)?;
                // what is wrong with a body reference (missing, recursive) is reported at
                // its `@name`; anything else at the attribute's name
                let at = if matches!(a, Attr::Graph(_)) {
                    value_at
                } else {
                    at
                };
                attrs.push((n, a, at));
            } else {
                if !attrs.is_empty() {
                    return Err(self.err(
                        &t,
                        "positional operands must come before name=value attributes".into(),
                    ));
                }
                args.push(self.operand(g)?);
            }
            if self.eat(')') {
                return Ok((args, attrs));
            }
            if !self.eat(',') {
                return Err(self.expected("',' or ')'"));
            }
        }
    }

    fn operand(&mut self, g: &mut Graph) -> Result<Arg> {
        let t = self.next();
        let s = match &t.tok {
            Tok::Value(name) => {
                return g
                    .value(name)
                    .map(Arg::Operand)
                    .ok_or_else(|| self.err(&t, format!("use of undefined value %{name}")));
            }
            Tok::Int(i) => Scalar::Int(*i),
            Tok::Float(x) => Scalar::Float(*x),
            Tok::Ident(w) => match w.as_str() {
                "none" => return Ok(Arg::None),
                "true" => Scalar::Bool(true),
                "false" => Scalar::Bool(false),
                "inf" => Scalar::Float(f64::INFINITY),
                "nan" => Scalar::Float(f64::NAN),
                _ => {
                    return Err(self.err(
                        &t,
                        format!("expected an operand or name=value, found {}", t.tok),
                    ));
                }
            },
            _ => {
                return Err(self.err(
                    &t,
                    format!("expected an operand or name=value, found {}", t.tok),
                ));
            }
        };
        let v = g.add_scalar(s).map_err(|e| self.err(&t, e.to_string()))?;
        Ok(Arg::Operand(v))
    }

    /// An attribute's value (`name` is the attribute's, for messages about symbolic sizes).
    fn attr(&mut self, name: &str) -> Result<Attr> {
        if self.at_dim_expr() {
            let at = self.peek().clone();
            let e = self.dim()?;
            return Ok(Attr::Int(match e {
                DimExpr::Int(n) => n,
                _ => self.size(&e, name, &at)?,
            }));
        }
        let t = self.next();
        Ok(match t.tok {
            Tok::Int(i) => Attr::Int(i),
            Tok::Float(x) => Attr::Float(x),
            Tok::Str(ref s) => Attr::Str(s.clone()),
            Tok::GraphRef(ref s) => Attr::Graph(s.clone()),
            Tok::Punct('[') => {
                let mut xs = Vec::new();
                if !self.eat(']') {
                    loop {
                        xs.push(self.attr(name)?);
                        if self.eat(']') {
                            break;
                        }
                        if !self.eat(',') {
                            return Err(self.expected("',' or ']'"));
                        }
                    }
                }
                Attr::List(xs)
            }
            Tok::Ident(ref w) => match w.as_str() {
                "true" => Attr::Bool(true),
                "false" => Attr::Bool(false),
                "none" => Attr::None,
                "inf" => Attr::Float(f64::INFINITY),
                "nan" => Attr::Float(f64::NAN),
                d => match DType::from_name(d) {
                    Some(d) => Attr::DType(d),
                    None => {
                        return Err(
                            self.err(&t, format!("expected an attribute value, found {}", t.tok))
                        );
                    }
                },
            },
            _ => return Err(self.err(&t, format!("expected an attribute value, found {}", t.tok))),
        })
    }
}

/// Words that are values, not symbols, where an attribute is read.
fn is_reserved(w: &str) -> bool {
    matches!(w, "true" | "false" | "none" | "inf" | "nan") || DType::from_name(w).is_some()
}
