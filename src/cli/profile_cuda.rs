//! `smelt profile --backend cuda`: the three ways of `smelt profile` on a GPU — eager (one
//! cached one-op kernel per node), unfused and fused compiled schedules — timed with CUDA
//! events, checked against the CPU interpreter, with the device's measured copy bandwidth
//! as the yardstick for GB/s.

use super::pick;
use super::profile::{
    ProfileArgs, Way, eager_run, eager_run_synced, gather_inputs, gbps, human_bytes,
    load_with_inputs, max_abs_diff, note_folded, ratio, table, time_compiled, way_json, write_json,
};
use crate::Result;
use crate::exec::{CompileOptions, CudaFn};
use crate::ir::graph::Graph;
use crate::runtime::cuda::driver::{Gpu, Timer};
use crate::runtime::cuda::memory::DeviceBuffer;
use crate::runtime::cuda::program::cache_dir;
use crate::runtime::{Device, Tensor};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn dur(ms: f32) -> Duration {
    Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3)
}

/// Device-to-device copy bandwidth (bytes read + written per second, GB/s), the median of
/// 10 copies of 1 GiB.
fn copy_bandwidth(gpu: &Arc<Gpu>) -> Result<f64> {
    let n = 1usize << 30;
    let (a, b) = (
        DeviceBuffer::alloc(gpu.ordinal(), n)?,
        DeviceBuffer::alloc(gpu.ordinal(), n)?,
    );
    gpu.zero(a.ptr(), n)?;
    let t = Timer::new(gpu)?;
    let mut ms = Vec::new();
    for i in 0..12 {
        t.start()?;
        gpu.dtod(b.ptr(), a.ptr(), n)?;
        t.stop()?;
        let e = t.elapsed_ms()? as f64;
        if i >= 2 {
            ms.push(e);
        }
    }
    ms.sort_by(f64::total_cmp);
    Ok(gbps(2 * n, ms[ms.len() / 2]))
}

fn time_eager(g: &Graph, gpu: &Arc<Gpu>, inputs: &[Tensor], repeat: usize) -> Result<Way> {
    let sync = || gpu.synchronize();
    let (_, first) = eager_run_synced(g, inputs, &sync)?;
    let mut w = Way {
        steps: first.1,
        samples: Vec::new(),
        totals: Vec::new(),
    };
    let t = Timer::new(gpu)?;
    for _ in 0..repeat {
        t.start()?;
        drop(eager_run(g, inputs)?);
        t.stop()?;
        w.totals.push(dur(t.elapsed_ms()?));
        let (out, (times, _)) = eager_run_synced(g, inputs, &sync)?;
        drop(out);
        w.samples.push(times);
    }
    Ok(w)
}

/// Runs `smelt profile --backend cuda`.
pub fn profile(a: &ProfileArgs) -> Result<()> {
    crate::runtime::random::manual_seed(0);
    let gpu = Gpu::get(0)?;
    let (loaded, given) = load_with_inputs(a)?;
    let g = pick(&loaded.module, a.graph.as_deref())?;
    let t0 = Instant::now();
    let fused = CudaFn::compile(g, &CompileOptions::default())?;
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    let origin = fused.origin();
    let unfused = CudaFn::compile(g, &CompileOptions::default().fused(false))?;
    let host = gather_inputs(g, a, &loaded, given)?;
    let inputs = host
        .iter()
        .map(|t| t.to_device(Device::Cuda(0)))
        .collect::<Result<Vec<_>>>()?;
    let copy = copy_bandwidth(&gpu)?;

    let eager = time_eager(g, &gpu, &inputs, a.repeat)?;
    let unf = time_compiled(&unfused, &inputs, a.repeat)?;
    let fus = time_compiled(&fused, &inputs, a.repeat)?;
    let diff = if a.no_check {
        f64::NAN
    } else {
        let (reference, _) = eager_run(g, &host)?;
        let got = fused
            .call(&inputs)?
            .iter()
            .map(Tensor::cpu)
            .collect::<Result<Vec<_>>>()?;
        max_abs_diff(&reference, &got)
    };
    let bytes_min = super::profile::bytes_min(g);

    let name = crate::runtime::cuda::device_name(0)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "profile of {} on {name} (CUDA events), median of {} calls\n",
        g.name, a.repeat
    );
    table(&mut out, "eager (one cached kernel per op)", &eager);
    table(&mut out, "unfused (one kernel per op)", &unf);
    table(&mut out, "fused", &fus);
    let (e, u, f) = (eager.median_ms(), unf.median_ms(), fus.median_ms());
    let _ = writeln!(out, "summary");
    let _ = writeln!(
        out,
        "  compile (passes + codegen + {} + load): {compile_ms:.3} ms (disk cache: {})",
        origin.name(),
        cache_dir().map_or("off".into(), |d| d.display().to_string())
    );
    let _ = writeln!(
        out,
        "  eager {e:.4} ms | unfused {u:.4} ms ({} steps) | fused {f:.4} ms ({} steps)",
        unf.steps.len(),
        fus.steps.len()
    );
    note_folded(&mut out, &fus);
    let _ = writeln!(
        out,
        "  fused is {:.2}x eager, {:.2}x unfused",
        ratio(e, f),
        ratio(u, f)
    );
    let achieved = gbps(bytes_min, f);
    let _ = writeln!(
        out,
        "  minimum traffic {}: {achieved:.1} GB/s fused = {:.1}% of the measured copy ({copy:.1} GB/s)",
        human_bytes(bytes_min),
        100.0 * achieved / copy
    );
    if a.no_check {
        let _ = writeln!(out, "  not compared with the CPU interpreter (--no-check)");
    } else {
        let _ = writeln!(out, "  max |fused - cpu interpreter| = {diff:e}");
    }
    print!("{out}");

    if let Some(path) = &a.json {
        let j = serde_json::json!({
            "graph": g.name,
            "backend": "cuda",
            "device": name,
            "repeat": a.repeat,
            "compile_ms": compile_ms,
            "compile_origin": origin.name(),
            "copy_gbps": copy,
            "bytes_min": bytes_min,
            "max_abs_diff": diff,
            "eager": way_json(&eager),
            "unfused": way_json(&unf),
            "fused": way_json(&fus),
        });
        write_json(path, &j)?;
    }
    Ok(())
}
