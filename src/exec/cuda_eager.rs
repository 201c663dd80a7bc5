//! Eager ops on GPU tensors. Views change layouts only, as on the CPU; every other op runs
//! as a one-op graph compiled by the CUDA backend (the same generator as compiled graphs),
//! cached per op, operand types and Python-number values, so each distinct op compiles once
//! per process (and once per machine, through the disk cache).

use super::CompileOptions;
use super::cuda::CudaFn;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::Graph;
use crate::ir::op::{Op, TensorType};
use crate::runtime::kernels::views;
use crate::runtime::tensor::Tensor;
use crate::{Result, bail};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Installs [`apply`] as eager execution's GPU path (`runtime::hooks::DEVICE`).
pub(crate) fn register() {
    crate::runtime::hooks::DEVICE.register(apply);
}

/// Runs `op` on `inputs` (GPU tensors of device `device`, and Python numbers).
pub fn apply(op: &Op, inputs: &[&Tensor], out: &TensorType, device: usize) -> Result<Tensor> {
    match op {
        _ if op.is_view() => return views::eval(op, inputs[0], out),
        Op::Reshape { .. } | Op::Flatten { .. } => {
            let x = if inputs[0].layout().view(&out.shape).is_some() {
                inputs[0].clone()
            } else {
                crate::runtime::cuda::tensor::contiguous_copy(inputs[0])?
            };
            return views::eval(op, &x, out);
        }
        Op::Contiguous => return crate::runtime::cuda::tensor::contiguous(inputs[0]),
        Op::To { dtype } if *dtype == inputs[0].dtype() && !inputs[0].is_wrapped_number() => {
            return Ok(inputs[0].clone());
        }
        _ => {}
    }
    let (key, graph) = one_op_graph(op, inputs)?;
    let f = compiled(key, &graph, device)?;
    let args: Vec<Tensor> = inputs
        .iter()
        .filter(|t| !t.is_wrapped_number())
        .map(|t| (*t).clone())
        .collect();
    let mut outs = f.call(&args)?;
    match outs.pop() {
        Some(t) if outs.is_empty() => Ok(t),
        _ => bail!(Value, "{}: expected one result", op.name()),
    }
}

/// The value of a Python-number operand.
fn wrapped_value(t: &Tensor) -> Scalar {
    let v = t.to_f64_vec().first().copied().unwrap_or(0.0);
    match t.dtype() {
        DType::Bool => Scalar::Bool(v != 0.0),
        d if d.is_float() => Scalar::Float(v),
        _ => Scalar::Int(v as i64),
    }
}

/// A graph applying `op` to inputs of the operands' types (Python numbers become scalar
/// nodes), and the cache key that identifies it.
fn one_op_graph(op: &Op, inputs: &[&Tensor]) -> Result<(String, Graph)> {
    let mut g = Graph::new("eager");
    let mut key = format!("{op:?}");
    let mut operands = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        if t.is_wrapped_number() {
            let s = wrapped_value(t);
            key.push_str(&format!("|{s:?}"));
            operands.push(g.add_scalar(s)?);
        } else {
            let ty = TensorType::new(t.dtype(), t.shape().to_vec());
            key.push_str(&format!("|{}{:?}", t.dtype(), t.shape()));
            operands.push(g.add_input(&format!("x{i}"), ty)?);
        }
    }
    let out = g.add_op(op.clone(), &operands)?;
    g.set_outputs(vec![out]);
    Ok((key, g))
}

type Cache = Mutex<HashMap<(usize, String), Arc<CudaFn>>>;

/// The compiled one-op graph for `key` on `device`.
fn compiled(key: String, g: &Graph, device: usize) -> Result<Arc<CudaFn>> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let k = (device, key);
    if let Some(f) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&k) {
        return Ok(f.clone());
    }
    let opts = CompileOptions::default().on_gpu(device);
    let f = Arc::new(CudaFn::compile(g, &opts)?);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(k, f.clone());
    Ok(f)
}
