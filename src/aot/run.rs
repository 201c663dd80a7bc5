//! Runs a compiled model in this process: its object loaded by the disk cache's linker, its
//! `NAME_run` called through the C interface a C program would call, the run-time library's
//! `smelt_rt_run` (its plan, GEMM and convolution steps) included. This is how tests and
//! `smelt fuzz` check what the object does without a C compiler.

use super::{AotModel, Port};
use crate::codegen_cpu::linker::Loaded;
use crate::{Result, Tensor, bail};

/// `NAME_run`'s signature (the model's C header).
type RunFn = unsafe extern "C" fn(*const *const u8, *const *mut u8, *mut u8, usize) -> i32;

/// A compiled model loaded into executable memory.
pub struct LoadedModel {
    run: RunFn,
    inputs: Vec<Port>,
    outputs: Vec<Port>,
    scratch_bytes: usize,
    /// Owns the code `run` points into.
    _image: Loaded,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LoadedModel({} inputs, {} outputs)",
            self.inputs.len(),
            self.outputs.len()
        )
    }
}

/// The address of a function a model's object calls: the run-time library's entry points,
/// then what kernels call (those the disk cache's objects call).
fn resolve(name: &str) -> Option<usize> {
    match name {
        "smelt_rt_run" => Some(smelt_rt::model::smelt_rt_run as *const () as usize),
        "smelt_rt_error_string" => {
            Some(smelt_rt::model::smelt_rt_error_string as *const () as usize)
        }
        _ => crate::exec::cpu::cache::resolve(name),
    }
}

impl AotModel {
    /// Loads the object into this process (x86-64 only, for the CPU it runs on).
    pub fn load(&self) -> Result<LoadedModel> {
        // (the CPU's extensions are checked by `smelt_rt_run` at each call)
        let image = Loaded::new(&self.object, &resolve)?;
        let symbol = format!("{}_run", self.name);
        let Some(entry) = image.symbol(&symbol) else {
            bail!(Value, "aot: the object defines no {symbol}");
        };
        // SAFETY: `NAME_run` is defined by `compile` with exactly this signature.
        let run = unsafe { std::mem::transmute::<*const u8, RunFn>(entry) };
        Ok(LoadedModel {
            run,
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            scratch_bytes: self.scratch_bytes,
            _image: image,
        })
    }
}

impl LoadedModel {
    /// Runs the model on `inputs` (any layout: they are copied row-major, as a C caller
    /// passes them), returning its outputs.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        if inputs.len() != self.inputs.len() {
            bail!(
                Value,
                "aot: the model takes {} inputs, got {}",
                self.inputs.len(),
                inputs.len()
            );
        }
        let mut bytes = Vec::with_capacity(inputs.len());
        for (t, p) in inputs.iter().zip(&self.inputs) {
            if t.dtype() != p.dtype || t.shape() != p.shape.as_slice() {
                bail!(
                    Value,
                    "aot: input {} is {}{:?}, the model takes {}{:?}",
                    p.name,
                    t.dtype(),
                    t.shape(),
                    p.dtype,
                    p.shape
                );
            }
            bytes.push(aligned(&t.to_bytes()?));
        }
        let mut outs: Vec<Vec<u128>> = self
            .outputs
            .iter()
            .map(|p| vec![0u128; p.bytes().div_ceil(16)])
            .collect();
        let mut scratch = vec![0u128; self.scratch_bytes.div_ceil(16)];
        let in_ptrs: Vec<*const u8> = bytes.iter().map(|b| b.as_ptr() as *const u8).collect();
        let out_ptrs: Vec<*mut u8> = outs.iter_mut().map(|b| b.as_mut_ptr() as *mut u8).collect();
        // SAFETY: one pointer per input and output, each to at least its port's bytes,
        // 16-byte aligned; the scratch holds `scratch_bytes`; all outlive the call, which
        // nothing else touches.
        let code = unsafe {
            (self.run)(
                in_ptrs.as_ptr(),
                out_ptrs.as_ptr(),
                scratch.as_mut_ptr() as *mut u8,
                scratch.len() * 16,
            )
        };
        if code != 0 {
            bail!(
                Value,
                "aot: the model returned {code}: {}",
                smelt_rt::model::error_message(code)
            );
        }
        outs.iter()
            .zip(&self.outputs)
            .map(|(b, p)| {
                // SAFETY: reading the initialised u128 words as their bytes
                let all =
                    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, b.len() * 16) };
                Tensor::from_bytes(p.dtype, &p.shape, &all[..p.bytes()])
            })
            .collect()
    }
}

impl LoadedModel {
    /// The model's inputs, in parameter order.
    pub(crate) fn inputs(&self) -> &[Port] {
        &self.inputs
    }

    /// The model's outputs, in return order.
    pub(crate) fn outputs(&self) -> &[Port] {
        &self.outputs
    }

    /// Bytes of scratch a call needs.
    pub(crate) fn scratch_bytes(&self) -> usize {
        self.scratch_bytes
    }

    /// Calls `NAME_run` with these arguments, as a C program would.
    ///
    /// # Safety
    /// As the C header says: where `inputs` (`outputs`) is not NULL, it holds a pointer per
    /// input (output), each NULL or to the port's bytes (writable for outputs); a non-NULL
    /// `scratch` points to `scratch_len` writable bytes.
    pub(crate) unsafe fn call_raw(
        &self,
        inputs: *const *const u8,
        outputs: *const *mut u8,
        scratch: *mut u8,
        scratch_len: usize,
    ) -> i32 {
        // SAFETY: the caller's contract is `NAME_run`'s.
        unsafe { (self.run)(inputs, outputs, scratch, scratch_len) }
    }
}

/// `b` copied into 16-byte aligned words.
fn aligned(b: &[u8]) -> Vec<u128> {
    let mut w = vec![0u128; b.len().div_ceil(16)];
    // SAFETY: `w` holds at least `b.len()` bytes
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), w.as_mut_ptr() as *mut u8, b.len()) };
    w
}
