//! The seam between the executors and what uses them: [`Executable`] is what a compiled
//! graph offers whichever executor compiled it, and [`compile`] picks the executor by
//! device, so the commands (`smelt run`, `grad`, `profile`) are written once above it.

use super::{CompileOptions, CompiledFn, CudaFn, StepInfo};
use crate::Result;
use crate::ir::graph::Graph;
use crate::kernel::Schedule;
use crate::runtime::{Device, Tensor};
use std::time::{Duration, Instant};

/// A graph compiled for one device: [`CompiledFn`] on the CPU, [`CudaFn`] on a GPU.
pub trait Executable {
    /// The device its inputs and outputs live on.
    fn device(&self) -> Device;
    /// The schedule it runs.
    fn schedule(&self) -> &Schedule;
    /// Per step: its name, ops, bytes and flops.
    fn steps(&self) -> &[StepInfo];
    /// How long compiling took.
    fn compile_time(&self) -> Duration;
    /// Runs on tensors on [`Executable::device`], in the graph's input order.
    fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>>;
    /// Times one call as a whole and step by step, by the device's own clock: wall time
    /// on the CPU; on a GPU, CUDA events around an unsynchronised call, then per step.
    fn time(&self, inputs: &[Tensor]) -> Result<(Duration, Vec<Duration>)>;

    /// Runs on host tensors: copies the inputs to the device and the outputs back.
    fn call_from_host(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let device = self.device();
        if device == Device::Cpu {
            return self.call(inputs);
        }
        let on_device = inputs
            .iter()
            .map(|t| t.to_device(device))
            .collect::<Result<Vec<_>>>()?;
        self.call(&on_device)?.iter().map(Tensor::cpu).collect()
    }
}

/// Compiles `g` for `device` with `opts`: the CPU executor, or the CUDA executor on GPU
/// `n` (which overrides `opts.gpu.device`).
pub fn compile(g: &Graph, device: Device, opts: &CompileOptions) -> Result<Box<dyn Executable>> {
    Ok(match device {
        Device::Cpu => Box::new(CompiledFn::compile(g, opts)?),
        Device::Cuda(n) => Box::new(CudaFn::compile(g, &opts.clone().on_gpu(n))?),
    })
}

impl Executable for CompiledFn {
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn schedule(&self) -> &Schedule {
        CompiledFn::schedule(self)
    }
    fn steps(&self) -> &[StepInfo] {
        CompiledFn::steps(self)
    }
    fn compile_time(&self) -> Duration {
        CompiledFn::compile_time(self)
    }
    fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        CompiledFn::call(self, inputs)
    }
    fn time(&self, inputs: &[Tensor]) -> Result<(Duration, Vec<Duration>)> {
        let t0 = Instant::now();
        let (out, steps) = self.call_timed(inputs)?;
        drop(out);
        Ok((t0.elapsed(), steps.0))
    }
}

impl Executable for CudaFn {
    fn device(&self) -> Device {
        CudaFn::device(self)
    }
    fn schedule(&self) -> &Schedule {
        CudaFn::schedule(self)
    }
    fn steps(&self) -> &[StepInfo] {
        CudaFn::steps(self)
    }
    fn compile_time(&self) -> Duration {
        CudaFn::compile_time(self)
    }
    fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        CudaFn::call(self, inputs)
    }
    fn time(&self, inputs: &[Tensor]) -> Result<(Duration, Vec<Duration>)> {
        let ms = |ms: f32| Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3);
        let whole = self.time_whole(inputs)?;
        let (out, steps) = self.call_timed(inputs)?;
        drop(out);
        Ok((ms(whole), steps.into_iter().map(ms).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::interp;

    fn graph() -> Graph {
        let text = "graph g(%x: f32[3,5], %b: f32[5]) {\n  %r = relu(%x)\n  %y = add(%r, %b)\n  %e = exp(%y)\n  return %e\n}\n";
        crate::ir::text::parse_module(text, "g")
            .unwrap()
            .graphs
            .remove(0)
    }

    #[test]
    fn the_cpu_executable_computes_what_the_interpreter_does() {
        let g = graph();
        let x = Tensor::randn(&[3, 5], None).unwrap();
        let b = Tensor::randn(&[5], None).unwrap();
        let want = interp::run(&g, &[("x", x.clone()), ("b", b.clone())]).unwrap();
        for fuse in [true, false] {
            let opts = CompileOptions::default().fused(fuse);
            let f = compile(&g, Device::Cpu, &opts).unwrap();
            assert_eq!(f.device(), Device::Cpu);
            assert_eq!(f.steps().len(), f.schedule().steps.len());
            let got = f.call_from_host(&[x.clone(), b.clone()]).unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].shape(), want[0].shape());
            let (g64, w64) = (got[0].to_f64_vec(), want[0].to_f64_vec());
            assert_eq!(g64.len(), 15);
            for (a, w) in g64.iter().zip(&w64) {
                assert!(
                    (a - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "fuse {fuse}: {a} vs {w}"
                );
            }
            let (whole, steps) = f.time(&[x.clone(), b.clone()]).unwrap();
            assert_eq!(steps.len(), f.steps().len());
            assert!(steps.iter().all(|s| *s <= whole));
        }
    }

    #[test]
    fn a_gpu_compiles_where_there_is_one_and_is_an_error_where_not() {
        let gpus = crate::runtime::cuda::device_count().unwrap_or(0);
        let f = compile(&graph(), Device::Cuda(0), &CompileOptions::default());
        assert_eq!(f.is_ok(), gpus > 0, "{:?}", f.err());
    }
}
