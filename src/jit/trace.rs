//! Tracing eager code into a graph, in the spirit of `torch.jit.trace`.
//!
//! [`trace`] runs a function once on example inputs with the ordinary eager kernels while a
//! recorder, installed on the current thread for the duration of the call, writes down every
//! op that goes through `runtime::apply`. Tensors are identified by their handle (the `Arc`
//! a `Tensor` wraps); the recorder keeps every tensor it has seen alive until the trace ends
//! so that no handle is reused.
//!
//! What becomes what:
//! - the example inputs become graph inputs (`x0`, `x1`, ... unless named in
//!   [`TraceOptions`]); tensors marked as parameters become further named inputs, bound to
//!   the parameter tensors' current values at every call;
//! - any other tensor the function reads (captured from its environment, or made without
//!   `apply`, such as `Tensor::zeros`) becomes an `Op::Constant` with its data at trace time;
//! - wrapped Python-style numbers (`&x * 0.5`) become `Op::Scalar` operands;
//! - views become ordinary pure ops: the graph has no aliasing;
//! - in-place ops are recorded out of place through [`record_inplace`].
//!
//! What tracing cannot see, as with `torch.jit.trace`:
//! - Rust control flow that depends on data (`if x.item()? > 0.0`, loops whose length comes
//!   from a tensor's values) is baked in as it went for the example inputs;
//! - values read out of tensors (`item`, `to_vec`) and fed back in become constants;
//! - random ops run once: their results are captured as constants;
//! - work that does not go through `apply` (`Tensor::contiguous`, `from_vec`, writes through
//!   `with_slice_mut`) is invisible: its results look like captured constants;
//! - shapes are specialised: calling the traced function with inputs of other shapes or
//!   dtypes re-traces it or fails, as [`GuardPolicy`] says;
//! - in-place updates of captured tensors are not outputs of the graph (a training step's
//!   buffers are: `train::CompiledStep` traces them as inputs and writes them back).

use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::{Graph, ValueId};
use crate::ir::op::{Op, TensorType};
use crate::ir::sym::Bindings;
use crate::ir::text::{SymbolicModule, fmt_type};
use crate::runtime::tensor::Tensor;
use crate::{Error, Result, bail};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

/// What a traced function does when called with inputs whose types differ from the trace's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GuardPolicy {
    /// Trace again for the new types (kept in a small cache).
    #[default]
    Retrace,
    /// Fail with a message naming the mismatching input.
    Error,
}

/// How to trace: graph and input names, parameters, guard policy.
#[derive(Clone)]
pub struct TraceOptions {
    /// Name of the traced graph.
    pub name: String,
    /// Names of the example inputs; missing ones are `x0`, `x1`, ...
    pub input_names: Vec<String>,
    /// Captured tensors that become named graph inputs instead of constants.
    pub params: Vec<(String, Tensor)>,
    /// What to do on calls with other input types.
    pub guard: GuardPolicy,
    /// How many re-traced specialisations `GuardPolicy::Retrace` keeps.
    pub cache_size: usize,
}

impl Default for TraceOptions {
    fn default() -> TraceOptions {
        TraceOptions {
            name: "traced".into(),
            input_names: Vec::new(),
            params: Vec::new(),
            guard: GuardPolicy::Retrace,
            cache_size: 8,
        }
    }
}

impl TraceOptions {
    /// The defaults: graph `traced`, inputs `x0, x1, ...`, no parameters, re-tracing.
    pub fn new() -> TraceOptions {
        TraceOptions::default()
    }
    /// Names the graph.
    pub fn name(mut self, name: &str) -> TraceOptions {
        self.name = name.to_string();
        self
    }
    /// Names the example inputs in order.
    pub fn input_names(mut self, names: &[&str]) -> TraceOptions {
        self.input_names = names.iter().map(|s| s.to_string()).collect();
        self
    }
    /// Marks a captured tensor as the parameter `name` (a graph input, not a constant).
    pub fn param(mut self, name: &str, t: &Tensor) -> TraceOptions {
        self.params.push((name.to_string(), t.clone()));
        self
    }
    /// Sets the guard policy.
    pub fn guard(mut self, g: GuardPolicy) -> TraceOptions {
        self.guard = g;
        self
    }
    /// Sets how many re-traced graphs are kept.
    pub fn cache_size(mut self, n: usize) -> TraceOptions {
        self.cache_size = n;
        self
    }

    fn input_name(&self, i: usize) -> String {
        self.input_names
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("x{i}"))
    }
}

type TraceFn<'f> = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + 'f>;

/// A traced function: its graph, the function itself (for re-tracing) and its guard policy.
pub struct Traced<'f> {
    f: TraceFn<'f>,
    opts: TraceOptions,
    graph: Graph,
    cache: RefCell<Vec<Graph>>,
    /// The example inputs (to trace again at other sizes).
    examples: Vec<Tensor>,
    /// Dims of the inputs that are symbols: (input, dim, symbol).
    dynamic: Vec<(usize, usize, String)>,
}

/// Traces `f` on `example_inputs`; captured tensors become constants (a captured module's
/// weights too: `nn::trace_module` keeps them as inputs, `trace_with_params` names them).
pub fn trace<'f>(
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + 'f,
    example_inputs: &[Tensor],
) -> Result<Traced<'f>> {
    trace_with(f, example_inputs, TraceOptions::default())
}

/// Traces `f` with the given captured tensors as named parameters (graph inputs).
pub fn trace_with_params<'f>(
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + 'f,
    example_inputs: &[Tensor],
    params: &[(&str, &Tensor)],
) -> Result<Traced<'f>> {
    let opts = params
        .iter()
        .fold(TraceOptions::default(), |o, (n, t)| o.param(n, t));
    trace_with(f, example_inputs, opts)
}

/// Traces `f` with full options.
pub fn trace_with<'f>(
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + 'f,
    example_inputs: &[Tensor],
    opts: TraceOptions,
) -> Result<Traced<'f>> {
    let (graph, _) = record(&f, example_inputs, &opts)?;
    Ok(Traced {
        f: Box::new(f),
        opts,
        graph,
        cache: RefCell::new(Vec::new()),
        examples: example_inputs.to_vec(),
        dynamic: Vec::new(),
    })
}

impl<'f> Traced<'f> {
    /// Marks dim `dim` of input `input` as the symbol `symbol` (the same name on several
    /// inputs is one size): [`Traced::symbolic`] then gives a graph for every size of it,
    /// as `torch._dynamo.mark_dynamic` does for `torch.compile`.
    pub fn dynamic(mut self, input: usize, dim: usize, symbol: &str) -> Traced<'f> {
        self.dynamic.push((input, dim, symbol.to_string()));
        self
    }

    /// The graph traced from the example inputs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// What a call with inputs of other types does: re-trace or fail.
    pub fn guard_policy(&self) -> GuardPolicy {
        self.opts.guard
    }

    /// Number of re-traced specialisations in the cache.
    pub fn retraced_count(&self) -> usize {
        self.cache.borrow().len()
    }

    /// Runs the traced graph on `inputs` (parameters bound to their current values). Inputs
    /// of other types re-trace or fail, as the guard policy says.
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let mismatch = match guard(&self.graph, inputs, self.opts.params.len()) {
            Ok(()) => return self.run(&self.graph, inputs),
            Err(e) => e,
        };
        if self.opts.guard == GuardPolicy::Error {
            return Err(mismatch);
        }
        let hit = self
            .cache
            .borrow()
            .iter()
            .position(|g| guard(g, inputs, self.opts.params.len()).is_ok());
        if let Some(i) = hit {
            let g = self.cache.borrow()[i].clone();
            return self.run(&g, inputs);
        }
        // The re-trace runs the function eagerly: its results are the answer.
        let (g, outs) = record(&self.f, inputs, &self.opts)?;
        let mut cache = self.cache.borrow_mut();
        cache.push(g);
        let excess = cache.len().saturating_sub(self.opts.cache_size);
        cache.drain(..excess);
        Ok(outs)
    }

    /// Compiles the traced graph for the CPU. The parameters are bound to their tensors (an
    /// in-place update of a parameter shows in later calls); call the result with the
    /// example inputs' types. Other types are an error, not a re-trace.
    pub fn compile(&self, opts: &crate::exec::CompileOptions) -> Result<crate::exec::CompiledFn> {
        let f = crate::exec::CompiledFn::compile(&self.graph, opts)?;
        f.bind_trailing(self.opts.params.iter().map(|(_, t)| t.clone()).collect())
    }

    /// The graph for every size of the dims marked [`Traced::dynamic`]: the function
    /// is traced again at three sample sizes of its symbols (inputs made from the example
    /// inputs' elements, repeated) and the graphs merged, each size that differs written as
    /// the expression of the symbols that gives it (`SymbolicModule::from_samples`). An error
    /// when no dim is marked, or when the function traces to graphs that differ in more than
    /// their sizes (control flow or values that depend on the sizes).
    pub fn symbolic(&self) -> Result<SymbolicModule> {
        let dynamic = &self.dynamic;
        if dynamic.is_empty() {
            bail!(Value, "no dim is marked dynamic (Traced::dynamic)");
        }
        let mut symbols: Vec<String> = Vec::new();
        for (input, dim, sym) in dynamic {
            let Some(t) = self.examples.get(*input).map(Tensor::shape) else {
                bail!(
                    Value,
                    "dynamic dim of input {input}, but there are {} inputs",
                    self.examples.len()
                );
            };
            if *dim >= t.len() {
                bail!(
                    Value,
                    "dynamic dim {dim} of input {input}, which has {} dims",
                    t.len()
                );
            }
            if !crate::ir::sym::is_symbol_name(sym) {
                bail!(
                    Value,
                    "'{sym}' is no symbol name (letters, digits and _, starting with a letter)"
                );
            }
            if !symbols.contains(sym) {
                symbols.push(sym.clone());
            }
        }
        crate::ir::sym::on_some_ladder(|ladder| self.symbolic_at(&symbols, ladder))
    }

    /// [`Traced::symbolic`] compiled for `device`, one variant per binding of its symbols,
    /// with the parameters bound to their tensors: call it with the inputs at any sizes.
    pub fn compile_symbolic(
        &self,
        device: crate::Device,
        opts: &crate::exec::CompileOptions,
    ) -> Result<crate::exec::SymbolicFn> {
        let f = crate::exec::SymbolicFn::new(self.symbolic()?, None, device, opts)?;
        f.bind_trailing(self.opts.params.iter().map(|(_, t)| t.clone()).collect())
    }

    fn symbolic_at(&self, symbols: &[String], ladder: usize) -> Result<SymbolicModule> {
        let points: Vec<Bindings> = (0..3)
            .map(|p| crate::ir::sym::sample_point(symbols, ladder, p))
            .collect();
        let mut texts = Vec::new();
        for point in &points {
            let inputs = self
                .examples
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let mut shape = t.shape().to_vec();
                    for (input, dim, sym) in &self.dynamic {
                        if *input == i {
                            shape[*dim] = point[sym] as usize;
                        }
                    }
                    repeated(t, &shape)
                })
                .collect::<Result<Vec<_>>>()?;
            let (g, _) = record(&self.f, &inputs, &self.opts)?;
            texts.push(crate::ir::print_graph(&g));
        }
        SymbolicModule::from_samples(&texts, symbols, &points, &self.opts.name)
    }

    fn run(&self, g: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let mut all = inputs.to_vec();
        all.extend(self.opts.params.iter().map(|(_, t)| t.clone()));
        run_graph(g, &all)
    }
}

/// A tensor of `shape` and `t`'s dtype holding `t`'s elements in order, repeated as often as
/// needed (zeros when `t` has none): an input like the example at another size.
fn repeated(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let v = t.to_dtype(DType::F64)?.contiguous()?.to_vec::<f64>()?;
    let n: usize = shape.iter().product();
    let data: Vec<f64> = match v.is_empty() {
        true => vec![0.0; n],
        false => (0..n).map(|i| v[i % v.len()]).collect(),
    };
    Tensor::from_vec(data, shape)?.to_dtype(t.dtype())
}

/// Checks that `inputs` have the types of the graph's leading inputs (the trailing
/// `n_params` inputs are the parameters).
fn guard(g: &Graph, inputs: &[Tensor], n_params: usize) -> Result<()> {
    let user = &g.inputs()[..g.inputs().len().min(inputs.len())];
    if inputs.len() + n_params != g.inputs().len() {
        bail!(
            Value,
            "expected {} input{} but got {}",
            g.inputs().len() - n_params,
            if g.inputs().len() - n_params == 1 {
                ""
            } else {
                "s"
            },
            inputs.len()
        );
    }
    for (i, (&v, t)) in user.iter().zip(inputs).enumerate() {
        let n = g.node(v);
        if n.ty.dtype != t.dtype() || n.ty.shape != t.shape() {
            bail!(
                Value,
                "input {i} ({}): expected {} but got {}",
                n.name,
                fmt_type(&n.ty),
                fmt_type(&t.ttype())
            );
        }
    }
    Ok(())
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Evaluates a graph with the reference interpreter (`inputs` in the graph's input order).
pub fn run_graph(g: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    crate::runtime::interp::run_positional(g, inputs)
}

/// True while a trace is being recorded on this thread.
pub fn is_tracing() -> bool {
    RECORDER.with(|r| r.try_borrow().map(|r| r.is_some()).unwrap_or(true))
}

/// The hook `runtime::apply` calls after every op: records it when tracing.
pub(crate) fn on_apply(op: &Op, inputs: &[&Tensor], out: &Tensor) {
    RECORDER.with(|r| {
        let Ok(mut r) = r.try_borrow_mut() else {
            return;
        };
        if let Some(rec) = r.as_mut()
            && rec.error.is_none()
            && let Err(e) = rec.record(op, inputs, out)
        {
            rec.error = Some(e);
        }
    });
}

/// Records the in-place op `target = op(operands)` while tracing (outside tracing it does
/// nothing). Call it before writing into `target`: from then on the trace sees `target` as
/// the op's result. A result of another dtype is cast back to `target`'s dtype, as in-place
/// ops do; a result of another shape is an error. Writing into a tensor that shares storage
/// with another traced tensor (a view, or a tensor that has views) is refused, since the
/// graph has no aliasing to carry the write over. The autograd tape sees the write too.
pub fn record_inplace(target: &Tensor, op: Op, operands: &[&Tensor]) -> Result<()> {
    crate::runtime::hooks::before_inplace(target, &op, operands)
}

/// The tracer's in-place hook (`runtime::hooks::TRACE_INPLACE`).
fn on_inplace(target: &Tensor, op: &Op, operands: &[&Tensor]) -> Result<()> {
    RECORDER.with(|r| {
        let Ok(mut r) = r.try_borrow_mut() else {
            return Ok(());
        };
        match r.as_mut() {
            Some(rec) => rec.record_inplace(target, op.clone(), operands),
            None => Ok(()),
        }
    })
}

/// Installs the tracer's hooks into eager execution; called when a trace starts.
fn register_hooks() {
    use crate::runtime::hooks::{TRACE, TRACE_INPLACE};
    TRACE.register(on_apply);
    TRACE_INPLACE.register(on_inplace);
}

fn key(t: &Tensor) -> usize {
    Arc::as_ptr(&t.0) as usize
}

/// A new handle on the same data, so each input has its own identity.
fn fresh_handle(t: &Tensor) -> Result<Tensor> {
    if t.is_wrapped_number() {
        Ok(Tensor::wrapped(scalar_value(t)?))
    } else {
        Ok(t.with_layout(t.layout().clone()))
    }
}

fn scalar_value(t: &Tensor) -> Result<Scalar> {
    Ok(match t.dtype() {
        DType::Bool => Scalar::Bool(t.item::<bool>()?),
        d if d.is_float() => Scalar::Float(t.item_f64()?),
        _ => Scalar::Int(t.to_i64_vec().first().copied().unwrap_or(0)),
    })
}

struct Recorder {
    graph: Graph,
    values: HashMap<usize, ValueId>,
    /// Every tensor seen, kept alive so that no handle address is reused during the trace.
    keep: Vec<Tensor>,
    error: Option<Error>,
    /// In a body's trace: the tensors the enclosing traces know. A body that reads one
    /// takes it as an extra input (a capture) rather than as a constant.
    outer: std::collections::HashSet<usize>,
    /// The captured tensors, in the order of their inputs.
    captures: Vec<Tensor>,
}

impl Recorder {
    fn new(name: &str) -> Recorder {
        Recorder {
            graph: Graph::new(name),
            values: HashMap::new(),
            keep: Vec::new(),
            error: None,
            outer: Default::default(),
            captures: Vec::new(),
        }
    }

    /// Runs `f` on `inputs` with this recorder installed; the graph's outputs become `f`'s
    /// results. Returns the recorder and the (eager) results.
    fn run(
        self,
        f: &mut dyn FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
        inputs: &[Tensor],
    ) -> Result<(Recorder, Vec<Tensor>)> {
        let installed = Installed::new(self)?;
        let result = f(inputs);
        let mut rec = installed
            .finish()
            .ok_or_else(|| Error::Value("trace: the recorder vanished".into()))?;
        let outs = result?;
        if let Some(e) = rec.error.take() {
            return Err(e);
        }
        let ids = rec.output_values(&outs)?;
        rec.graph.set_outputs(ids);
        Ok((rec, outs))
    }

    /// The values of a traced function's results: an inline number gets a named statement
    /// of its own (an output must be a named value).
    fn output_values(&mut self, outs: &[Tensor]) -> Result<Vec<ValueId>> {
        let mut ids = Vec::with_capacity(outs.len());
        for (i, t) in outs.iter().enumerate() {
            let v = self.value_of(t)?;
            let v = if self.graph.node(v).is_inline_scalar() {
                let op = self.graph.node(v).op().cloned().unwrap_or(Op::Contiguous);
                self.graph.add_op_named(op, &[], &format!("out{i}"))?
            } else {
                v
            };
            ids.push(v);
        }
        Ok(ids)
    }

    fn bind(&mut self, t: &Tensor, v: ValueId) {
        self.values.insert(key(t), v);
        self.keep.push(t.clone());
    }

    /// The value of a tensor, capturing it as a scalar or constant when it is new.
    fn value_of(&mut self, t: &Tensor) -> Result<ValueId> {
        if let Some(&v) = self.values.get(&key(t)) {
            return Ok(v);
        }
        let v = if t.is_wrapped_number() {
            self.graph.add_scalar(scalar_value(t)?)?
        } else if self.outer.contains(&key(t)) {
            self.captures.push(t.clone());
            let name = format!("capture{}", self.captures.len() - 1);
            self.graph.add_input(&name, t.ttype())?
        } else {
            self.graph
                .add_op(Op::Constant(crate::runtime::literal(t)?), &[])?
        };
        self.bind(t, v);
        Ok(v)
    }

    fn record(&mut self, op: &Op, inputs: &[&Tensor], out: &Tensor) -> Result<()> {
        let ids = inputs
            .iter()
            .map(|t| self.value_of(t))
            .collect::<Result<Vec<_>>>()?;
        let v = self.graph.add_op(op.clone(), &ids)?;
        let (ty, got) = (&self.graph.node(v).ty, out.ttype());
        if ty.dtype != got.dtype || ty.shape != got.shape {
            bail!(
                Value,
                "trace: {} returned {} but its shape rule says {}",
                op.name(),
                fmt_type(&got),
                fmt_type(ty)
            );
        }
        self.bind(out, v);
        Ok(())
    }

    fn record_inplace(&mut self, target: &Tensor, op: Op, operands: &[&Tensor]) -> Result<()> {
        let name = op.name();
        if target.is_wrapped_number() {
            bail!(Value, "{name}_: cannot write in place into a Python number");
        }
        let k = key(target);
        if self
            .keep
            .iter()
            .any(|t| key(t) != k && t.shares_storage(target))
        {
            bail!(
                Unsupported,
                "in-place writes into views are not supported while tracing: {name}_ writes into a tensor that shares storage with another traced tensor (use the out-of-place {name})"
            );
        }
        let ids = operands
            .iter()
            .map(|t| self.value_of(t))
            .collect::<Result<Vec<_>>>()?;
        let mut v = self.graph.add_op(op, &ids)?;
        let want: TensorType = target.ttype();
        let got = self.graph.node(v).ty.clone();
        if got.shape != want.shape {
            bail!(
                Shape,
                "output with shape {:?} doesn't match the broadcast shape {:?}",
                want.shape,
                got.shape
            );
        }
        if got.dtype != want.dtype {
            v = self.graph.add_op(Op::To { dtype: want.dtype }, &[v])?;
        }
        self.bind(target, v);
        Ok(())
    }
}

/// Removes the recorder when the trace ends, even if the traced function panics.
struct Installed;

impl Installed {
    fn new(rec: Recorder) -> Result<Installed> {
        register_hooks();
        RECORDER.with(|r| {
            let mut r = r
                .try_borrow_mut()
                .map_err(|_| Error::Value("trace: the recorder is busy".into()))?;
            if r.is_some() {
                bail!(
                    Value,
                    "trace: already tracing on this thread (nested traces are not supported)"
                );
            }
            *r = Some(rec);
            Ok(Installed)
        })
    }

    fn finish(self) -> Option<Recorder> {
        RECORDER.with(|r| r.borrow_mut().take())
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        RECORDER.with(|r| {
            if let Ok(mut r) = r.try_borrow_mut() {
                r.take();
            }
        });
    }
}

/// Runs `f` under a recorder and returns the verified graph and the eager results.
fn record(
    f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    inputs: &[Tensor],
    opts: &TraceOptions,
) -> Result<(Graph, Vec<Tensor>)> {
    let (graph, outs, _) = record_buffers(f, inputs, opts, &[])?;
    Ok((graph, outs))
}

/// [`record`] with `buffers` as named inputs after the parameters; a buffer `f` writes in
/// place gets its final value as an output after `f`'s results. Also returns which buffers
/// were written.
fn record_buffers(
    f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    inputs: &[Tensor],
    opts: &TraceOptions,
    buffers: &[(String, Tensor)],
) -> Result<(Graph, Vec<Tensor>, Vec<bool>)> {
    let mut rec = Recorder::new(&opts.name);
    let fresh = inputs
        .iter()
        .map(fresh_handle)
        .collect::<Result<Vec<_>>>()?;
    for (i, t) in fresh.iter().enumerate() {
        let v = rec.graph.add_input(&opts.input_name(i), t.ttype())?;
        rec.bind(t, v);
    }
    let named = opts.params.iter().map(|(n, t)| (n, t, "parameter"));
    let named = named.chain(buffers.iter().map(|(n, t)| (n, t, "buffer")));
    let mut buffer_inputs = Vec::with_capacity(buffers.len());
    for (name, p, what) in named {
        if rec.values.contains_key(&key(p)) {
            bail!(Value, "trace: {what} '{name}' is given twice");
        }
        let v = rec.graph.add_input(name, p.ttype())?;
        rec.bind(p, v);
        if what == "buffer" {
            buffer_inputs.push(v);
        }
    }
    let (mut rec, outs) = rec.run(&mut |x: &[Tensor]| f(x), &fresh)?;
    let mut written = Vec::with_capacity(buffers.len());
    let mut outputs = rec.graph.outputs().to_vec();
    for ((name, b), &input) in buffers.iter().zip(&buffer_inputs) {
        let last = rec.values.get(&key(b)).copied().unwrap_or(input);
        written.push(last != input);
        if last != input {
            outputs.push(rec.graph.add_op_named(
                Op::Contiguous,
                &[last],
                &format!("new.{name}"),
            )?);
        }
    }
    rec.graph.set_outputs(outputs);
    rec.graph.verify()?;
    Ok((rec.graph, outs, written))
}

/// Traces `f` with `opts`' parameters, then `buffers`, as named graph inputs. A buffer `f`
/// writes in place (batch norm's running statistics, its batch counter) gets its final value
/// as an extra graph output after `f`'s results, named `new.<buffer>`, in the buffers' order:
/// the graph is functional, and its caller writes the new values back. The eager run of the
/// trace leaves the buffers as they were. Returns the graph and which buffers it writes.
pub(crate) fn trace_with_buffers(
    f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    example_inputs: &[Tensor],
    opts: &TraceOptions,
    buffers: &[(String, Tensor)],
) -> Result<(Graph, Vec<bool>)> {
    let saved = {
        let _off = crate::autograd::no_grad();
        buffers
            .iter()
            .map(|(_, b)| {
                let s = b.empty_like();
                s.copy_(b).map(|_| s.clone())
            })
            .collect::<Result<Vec<_>>>()?
    };
    let traced = record_buffers(f, example_inputs, opts, buffers);
    let _off = crate::autograd::no_grad();
    for ((_, b), s) in buffers.iter().zip(&saved) {
        b.copy_(s)?;
    }
    traced.map(|(g, _, written)| (g, written))
}

/// A body traced for a control op: its graph (inputs: the examples' values, then one per
/// captured tensor) and the tensors of the enclosing trace it captured, in input order.
pub(crate) struct TracedBody {
    pub graph: Graph,
    pub captures: Vec<Tensor>,
}

/// While tracing, traces `f` on `examples` as the body graph `name` of a control op: the
/// enclosing trace is set aside meanwhile. Tensors the enclosing traces know become captures
/// (extra inputs after the examples), `seed` ones first (so that two bodies of one op share
/// their captures' order), then any other in the order `f` reads them.
pub(crate) fn trace_body(
    name: &str,
    examples: &[Tensor],
    seed: &[Tensor],
    f: &mut dyn FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<TracedBody> {
    let outer = suspend()?;
    let mut rec = Recorder::new(name);
    rec.outer = outer.values.keys().copied().collect();
    rec.outer.extend(outer.outer.iter().copied());
    let traced = (|| {
        let fresh = examples
            .iter()
            .map(fresh_handle)
            .collect::<Result<Vec<_>>>()?;
        for (i, t) in fresh.iter().enumerate() {
            let v = rec.graph.add_input(&format!("in{i}"), t.ttype())?;
            rec.bind(t, v);
        }
        for t in seed {
            rec.value_of(t)?;
        }
        let (rec, _) = rec.run(f, &fresh)?;
        Ok(TracedBody {
            graph: rec.graph,
            captures: rec.captures,
        })
    })();
    resume(outer)?;
    traced
}

/// Runs `f` with the current trace set aside: nothing it does is recorded.
pub(crate) fn untraced<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let outer = suspend()?;
    let r = f();
    resume(outer)?;
    r
}

/// Records control op `c` on `operands` with the eager `results` as its values.
pub(crate) fn record_control(
    c: crate::ir::control::Control,
    operands: &[&Tensor],
    results: &[Tensor],
) -> Result<()> {
    RECORDER.with(|r| {
        let mut r = r
            .try_borrow_mut()
            .map_err(|_| Error::Value("trace: the recorder is busy".into()))?;
        let Some(rec) = r.as_mut() else {
            return Ok(());
        };
        let ids = operands
            .iter()
            .map(|t| rec.value_of(t))
            .collect::<Result<Vec<_>>>()?;
        let vs = rec.graph.add_control(c, &ids, None)?;
        for (t, v) in results.iter().zip(vs) {
            rec.bind(t, v);
        }
        Ok(())
    })
}

fn suspend() -> Result<Recorder> {
    RECORDER.with(|r| {
        r.try_borrow_mut()
            .map_err(|_| Error::Value("trace: the recorder is busy".into()))?
            .take()
            .ok_or_else(|| Error::Value("trace: not tracing".into()))
    })
}

fn resume(rec: Recorder) -> Result<()> {
    RECORDER.with(|r| {
        *r.try_borrow_mut()
            .map_err(|_| Error::Value("trace: the recorder is busy".into()))? = Some(rec);
        Ok(())
    })
}
