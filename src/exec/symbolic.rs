//! A graph with symbolic dims, callable at any sizes: each call binds the symbols from its
//! inputs and runs the variant compiled for that binding, compiling it on first use.
//!
//! Today every binding is its own compile (the kernels take their sizes as constants); the
//! interface stays when kernels take the sizes as arguments and one compile serves all.

use super::{CompileOptions, Executable, compile};
use crate::ir::graph::Graph;
use crate::ir::sym::Bindings;
use crate::ir::text::SymbolicModule;
use crate::runtime::{Device, Tensor};
use crate::{Result, bail};
use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::hash_map::Entry;

/// A `.smelt` graph whose dims may be symbols, compiled per binding of its symbols.
///
/// ```
/// use smelt::exec::{CompileOptions, SymbolicFn};
/// use smelt::ir::text::SymbolicModule;
/// use smelt::{Device, Tensor};
/// let text = "graph f(%x: f32[N]) {\n  %y = mul(%x, 2.0)\n  return %y\n}\n";
/// let m = SymbolicModule::parse(text, "f.smelt").unwrap();
/// let f = SymbolicFn::new(m, None, Device::Cpu, &CompileOptions::default()).unwrap();
/// for n in [1, 7] {
///     let x = Tensor::ones(&[n], smelt::DType::F32);
///     assert_eq!(f.call(&[x]).unwrap()[0].to_f64_vec(), vec![2.0; n]);
/// }
/// assert_eq!(f.compiles(), 2);
/// ```
pub struct SymbolicFn {
    module: SymbolicModule,
    graph: Option<String>,
    device: Device,
    opts: CompileOptions,
    /// The entry graph's input names, in order.
    inputs: Vec<String>,
    /// Tensors bound to the last inputs (a traced function's parameters).
    trailing: Vec<Tensor>,
    /// One compiled variant per binding (an `Executable` stays on its thread, and so does
    /// this).
    variants: RefCell<HashMap<Bindings, Box<dyn Executable>>>,
}

impl SymbolicFn {
    /// `module`'s graph `graph` (the first when `None`), to run on `device` with `opts`.
    pub fn new(
        module: SymbolicModule,
        graph: Option<&str>,
        device: Device,
        opts: &CompileOptions,
    ) -> Result<SymbolicFn> {
        let g: &Graph = module.sample().pick(graph)?;
        let inputs = g.inputs().iter().map(|&v| g.node(v).name.clone()).collect();
        Ok(SymbolicFn {
            graph: graph.map(str::to_string),
            device,
            opts: opts.clone(),
            inputs,
            trailing: Vec::new(),
            module,
            variants: RefCell::new(HashMap::new()),
        })
    }

    /// Binds `tensors` to the graph's last inputs (a traced function's parameters): calls
    /// then give the inputs before them.
    pub fn bind_trailing(mut self, tensors: Vec<Tensor>) -> Result<SymbolicFn> {
        if tensors.len() > self.inputs.len() {
            bail!(
                Value,
                "{} tensors to bind, but the graph has {} inputs",
                tensors.len(),
                self.inputs.len()
            );
        }
        self.trailing = tensors;
        Ok(self)
    }

    /// The sizes of the symbols that `inputs` (in the graph's input order, without the
    /// bound trailing ones) give.
    pub fn bind(&self, inputs: &[Tensor]) -> Result<Bindings> {
        let want = self.inputs.len() - self.trailing.len();
        if inputs.len() != want {
            bail!(
                Value,
                "expected {want} inputs ({}), got {}",
                self.inputs[..want].join(", "),
                inputs.len()
            );
        }
        let shapes: Vec<(&str, &[usize])> = self
            .inputs
            .iter()
            .zip(inputs.iter().chain(&self.trailing))
            .map(|(n, t)| (n.as_str(), t.shape()))
            .collect();
        self.module.bind(self.graph.as_deref(), &shapes)
    }

    /// Runs on host tensors in the graph's input order (outputs on the host).
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let sizes = self.bind(inputs)?;
        let all: Vec<Tensor>;
        let inputs = match self.trailing.is_empty() {
            true => inputs,
            false => {
                all = inputs.iter().chain(&self.trailing).cloned().collect();
                &all
            }
        };
        let mut variants = self.variants.borrow_mut();
        let f = match variants.entry(sizes) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let module = self.module.instantiate(e.key())?;
                let g = module.pick(self.graph.as_deref())?;
                e.insert(compile(g, self.device, &self.opts)?)
            }
        };
        f.call_from_host(inputs)
    }

    /// How many variants were compiled so far (one per binding called).
    pub fn compiles(&self) -> usize {
        self.variants.borrow().len()
    }

    /// The module it runs.
    pub fn module(&self) -> &SymbolicModule {
        &self.module
    }
}
