//! `smelt::profiler`: the recorded events against what ran (counts, names, nesting, bytes,
//! FLOPs), the Chrome trace as valid trace-event JSON, and the memory totals against the
//! allocators' own statistics.
//!
//! A session records every thread of the process, so the tests of this file take turns.

use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use smelt::profiler::{
    self, EventKind, MemDevice, Profile, Profiler, ProfilerOptions, SortBy, Track,
};
use smelt::runtime::cuda::alloc::{CachingAllocator, RawAlloc, RawError, StreamId};
use smelt::runtime::storage::memory_stats;
use smelt::{DType, Tensor};
use std::sync::Mutex;

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn eager_ops_are_recorded_with_names_shapes_bytes_and_flops() {
    let _t = turn();
    let a = Tensor::randn(&[8, 16], None).unwrap();
    let b = Tensor::randn(&[16, 4], None).unwrap();
    let (r, prof) = profiler::profile(ProfilerOptions::default(), || {
        let c = a.matmul(&b)?;
        let d = c.relu()?;
        d.add(&d)
    })
    .unwrap();
    let out = r.unwrap();
    assert_eq!(out.shape(), &[8, 4]);
    let ops: Vec<&str> = prof
        .of_kind(EventKind::Op)
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(ops, ["matmul", "relu", "add"]);
    let mm = prof.of_kind(EventKind::Op).next().unwrap();
    assert_eq!(mm.shapes, vec![vec![8, 16], vec![16, 4]]);
    // f32: (8·16 + 16·4 + 8·4) elements of 4 bytes; 2·m·n·k operations
    assert_eq!(mm.bytes, (8 * 16 + 16 * 4 + 8 * 4) * 4);
    assert_eq!(mm.flops, 2 * 8 * 4 * 16);
    assert!(prof.events.iter().all(|e| e.dur_ns != u64::MAX));
    assert!(prof.wall_ns >= prof.events.iter().map(|e| e.end_ns()).max().unwrap());
    let avg = prof.key_averages();
    assert_eq!(avg.row("add").map(|r| r.calls), Some(1));
    let table = avg.table(SortBy::SelfTime, None);
    for name in ["matmul", "relu", "add", "Self time total"] {
        assert!(table.contains(name), "{table}");
    }
}

#[test]
fn in_place_ops_and_out_forms_are_recorded_with_a_trailing_underscore() {
    let _t = turn();
    let x = Tensor::zeros(&[10], DType::F32);
    let y = Tensor::ones(&[10], DType::F32);
    let out = Tensor::zeros(&[10], DType::F32);
    let ((), prof) = profiler::profile(ProfilerOptions::default(), || {
        x.add_(&y).unwrap();
        x.mul_scalar_(2.0).unwrap();
        x.copy_(&y).unwrap();
        x.zero_().unwrap();
        Tensor::add_out(&x, &y, &out).unwrap();
    })
    .unwrap();
    let ops: Vec<&str> = prof
        .of_kind(EventKind::Op)
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(ops, ["add_", "mul_", "copy_", "fill_", "add (out=)"]);
    let add = prof.of_kind(EventKind::Op).next().unwrap();
    // x read and written, y read: 3 × 40 bytes
    assert_eq!(add.bytes, 120);
    assert_eq!(add.shapes, vec![vec![10], vec![10]]);
}

#[test]
fn nothing_is_recorded_outside_a_session_and_sessions_do_not_overlap() {
    let _t = turn();
    let x = Tensor::ones(&[4], DType::F32);
    let _ = x.exp().unwrap();
    assert!(!profiler::enabled());
    assert!(profiler::record_function("outside").is_none());
    let p = Profiler::start(ProfilerOptions::default()).unwrap();
    let err = Profiler::start(ProfilerOptions::default()).unwrap_err();
    assert!(err.to_string().contains("already running"), "{err}");
    let _ = x.exp().unwrap();
    let prof = p.stop();
    assert_eq!(prof.of_kind(EventKind::Op).count(), 1);
    assert!(!profiler::enabled());
    let _ = x.exp().unwrap();
    // a new session starts empty
    let ((), prof) = profiler::profile(ProfilerOptions::default(), || ()).unwrap();
    assert!(prof.events.is_empty());
}

#[test]
fn user_ranges_nest_the_ops_inside_them_and_self_time_excludes_children() {
    let _t = turn();
    let x = Tensor::randn(&[256, 256], None).unwrap();
    let ((), prof) = profiler::profile(ProfilerOptions::default(), || {
        let _outer = profiler::record_function("step");
        {
            let _inner = profiler::record_function("forward");
            let _ = x.tanh().unwrap().sigmoid().unwrap();
        }
        let _ = x.sum().unwrap();
    })
    .unwrap();
    let idx = |name: &str| prof.events.iter().position(|e| e.name == name).unwrap();
    let (step, fwd) = (idx("step"), idx("forward"));
    assert_eq!(prof.events[step].parent, None);
    assert_eq!(prof.events[fwd].parent, Some(step));
    assert_eq!(prof.events[idx("tanh")].parent, Some(fwd));
    assert_eq!(prof.events[idx("sigmoid")].parent, Some(fwd));
    assert_eq!(prof.events[idx("sum")].parent, Some(step));
    for (i, e) in prof.events.iter().enumerate() {
        if let Some(p) = e.parent {
            let p = &prof.events[p];
            assert!(
                p.start_ns <= e.start_ns && e.end_ns() <= p.end_ns(),
                "{e:?} in {p:?}"
            );
        }
        assert!(prof.self_ns(i) <= e.dur_ns);
    }
    let children: u64 = prof.children(fwd).map(|(_, c)| c.dur_ns).sum();
    assert_eq!(prof.self_ns(fwd), prof.events[fwd].dur_ns - children);
    let avg = prof.key_averages();
    let s = avg.row("step").unwrap();
    assert!(s.total_ns >= s.self_ns);
    assert_eq!(avg.sorted(SortBy::Name)[0].name, "forward");
}

/// Compiles the graph of `src` and profiles one call of it on `inputs`, made inside a user
/// range named "user step": the function, its outputs and the profile.
fn profile_call(src: &str, name: &str, inputs: &[Tensor]) -> (CompiledFn, Vec<Tensor>, Profile) {
    let m = parse_module(src, name).unwrap();
    let f = CompiledFn::compile(&m.graphs[0], &CompileOptions::default()).unwrap();
    let (r, prof) = profiler::profile(ProfilerOptions::default(), || {
        let _user = profiler::record_function("user step");
        f.call(inputs)
    })
    .unwrap();
    (f, r.unwrap(), prof)
}

#[test]
fn compiled_calls_nest_their_kernels_with_values_bytes_and_flops() {
    let _t = turn();
    let x = Tensor::randn(&[16, 32], None).unwrap();
    let w = Tensor::randn(&[64, 32], None).unwrap();
    let (f, _, prof) = profile_call(
        "graph mlp(%x: f32[16, 32], %w: f32[64, 32]) {\n  %h = linear(%x, %w)\n  %r = relu(%h)\n  %y = mul(%r, 0.5)\n  %s = sum(%y, dim=[1])\n  return %s\n}\n",
        "mlp",
        &[x, w],
    );
    let calls: Vec<usize> = (0..prof.events.len())
        .filter(|&i| prof.events[i].kind == EventKind::Call)
        .collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(prof.events[calls[0]].name, "mlp");
    // the call nests inside the caller's range; its steps are too small to split, so it
    // runs on the caller's thread
    let user = prof.events.iter().position(|e| e.name == "user step");
    assert_eq!(prof.events[calls[0]].parent, user);
    assert_eq!(
        prof.events[calls[0]].track,
        prof.events[user.unwrap()].track
    );
    let steps: Vec<_> = prof.children(calls[0]).map(|(_, e)| e).collect();
    assert_eq!(steps.len(), f.steps().len());
    for (e, info) in steps.iter().zip(f.steps()) {
        assert_eq!(e.name, info.name);
        assert_eq!(e.bytes, info.bytes as u64);
        assert_eq!(e.flops, info.flops);
        let kind = if info.is_extern {
            EventKind::Extern
        } else {
            EventKind::Kernel
        };
        assert_eq!(e.kind, kind);
        assert!(!e.values.is_empty() && e.values.iter().all(|v| v.starts_with('%')));
    }
    // the GEMM: 2·16·64·32 operations
    let gemm = steps.iter().find(|e| e.kind == EventKind::Extern).unwrap();
    assert_eq!(gemm.flops, 2 * 16 * 64 * 32);
    // the last kernel writes the returned value
    assert!(steps.iter().any(|e| e.values.contains(&"%s".to_string())));
}

#[test]
fn a_call_with_large_steps_runs_on_a_worker_inside_the_callers_range() {
    let _t = turn();
    let x = Tensor::randn(&[256, 256], None).unwrap();
    let (_, out, prof) = profile_call(
        "graph big(%x: f32[256, 256]) {\n  %y = mul(%x, 0.5)\n  %z = sum(%y)\n  return %z\n}\n",
        "big",
        std::slice::from_ref(&x),
    );
    let got = out[0].item_f64().unwrap();
    let want: f64 = x.to_f64_vec().iter().map(|v| v * 0.5).sum();
    assert!(
        (got - want).abs() < 1e-3 * want.abs().max(1.0),
        "{got} {want}"
    );
    let user = prof.events.iter().position(|e| e.name == "user step");
    let call = prof
        .events
        .iter()
        .position(|e| e.kind == EventKind::Call)
        .unwrap();
    assert_eq!(prof.events[call].parent, user);
    assert!(
        prof.children(call).count() > 0,
        "the steps nest in the call"
    );
    if rayon::current_num_threads() > 1 {
        assert_ne!(
            prof.events[call].track,
            prof.events[user.unwrap()].track,
            "65 536 elements split: the call moves to a worker"
        );
    }
}

#[test]
fn the_chrome_trace_is_valid_trace_event_json() {
    let _t = turn();
    let x = Tensor::randn(&[32, 32], None).unwrap();
    let ((), prof) = profiler::profile(ProfilerOptions::default().profile_memory(true), || {
        let _r = profiler::record_function("block \"one\"");
        let _ = x.matmul(&x).unwrap().exp().unwrap();
    })
    .unwrap();
    let dir = std::env::temp_dir().join(format!("smelt-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.json");
    prof.export_chrome_trace(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .expect("the trace parses as JSON");
    let evs = v["traceEvents"].as_array().unwrap();
    let complete: Vec<_> = evs.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), prof.events.len());
    for e in &complete {
        assert!(e["ts"].as_f64().is_some() && e["dur"].as_f64().unwrap() >= 0.0);
        assert!(e["pid"].as_u64().is_some() && e["tid"].as_u64().is_some());
        assert!(e["name"].is_string() && e["cat"].is_string());
    }
    let names: Vec<&str> = complete
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["block \"one\"", "matmul", "exp"]);
    assert!(
        evs.iter()
            .any(|e| e["ph"] == "M" && e["name"] == "thread_name")
    );
    let counters = evs.iter().filter(|e| e["ph"] == "C").count();
    assert_eq!(counters, prof.memory.len());
    assert!(counters >= 2, "matmul and exp each allocate their result");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn host_memory_totals_match_the_storage_statistics() {
    let _t = turn();
    let before = memory_stats();
    let ((), prof) = profiler::profile(ProfilerOptions::default().profile_memory(true), || {
        let a = Tensor::zeros(&[1000], DType::F32);
        let b = a.exp().unwrap();
        let c = b.to_dtype(DType::F64).unwrap();
        drop(a);
        let _ = c.sum().unwrap();
    })
    .unwrap();
    let after = memory_stats();
    let (alloc, freed) = prof.memory_totals(MemDevice::Cpu);
    assert_eq!(alloc, after.total_allocated - before.total_allocated);
    assert_eq!(freed, after.total_freed - before.total_freed);
    // zeros 4000 B, exp 4000 B, to f64 8000 B, sum 8 B: all freed by the end
    assert_eq!(alloc, 4000 + 4000 + 8000 + 8);
    assert_eq!(freed, alloc);
    assert_eq!(prof.peak_memory(MemDevice::Cpu), 16000);
    let avg = prof.key_averages();
    assert_eq!(avg.row("to").map(|r| r.self_alloc), Some(8000));
    assert!(avg.table(SortBy::Memory, Some(3)).contains("8.0 kB"));
}

/// A device that hands out addresses from a counter.
struct FakeDevice(u64);

impl RawAlloc for FakeDevice {
    fn raw_alloc(&mut self, bytes: usize) -> Result<u64, RawError> {
        self.0 += bytes as u64;
        Ok(self.0)
    }
    fn raw_free(&mut self, _: u64) -> Result<(), RawError> {
        Ok(())
    }
    fn record_event(&mut self, _: StreamId) -> Result<u64, RawError> {
        Ok(1)
    }
    fn event_done(&mut self, _: u64) -> Result<bool, RawError> {
        Ok(true)
    }
    fn event_wait(&mut self, _: u64) -> Result<(), RawError> {
        Ok(())
    }
}

#[test]
fn device_memory_totals_match_the_caching_allocator() {
    let _t = turn();
    let mut a = CachingAllocator::new(FakeDevice(0x1000), 3);
    let mut served = 0u64;
    let ((), prof) = profiler::profile(ProfilerOptions::default().profile_memory(true), || {
        let _r = profiler::record_function("alloc");
        let x = a.alloc(1000, 0).unwrap();
        let y = a.alloc(3 << 20, 0).unwrap();
        a.free(x).unwrap();
        let z = a.alloc(10, 0).unwrap();
        served = (x.size + y.size + z.size) as u64;
        a.free(y).unwrap();
        a.free(z).unwrap();
    })
    .unwrap();
    let (alloc, freed) = prof.memory_totals(MemDevice::Cuda(3));
    // every block as the allocator served it (rounded, or a cached block reused whole)
    assert_eq!(alloc, served);
    assert_eq!(freed, served);
    assert_eq!(a.stats().allocated, 0);
    assert_eq!(
        prof.peak_memory(MemDevice::Cuda(3)) as usize,
        a.stats().max_allocated
    );
    assert!(served >= (1000 + (3 << 20) + 10) as u64);
    assert_eq!(prof.key_averages().row("alloc").unwrap().self_alloc, served);
}

#[test]
fn events_on_a_cuda_stream_get_their_own_track() {
    let _t = turn();
    let ((), prof) = profiler::profile(ProfilerOptions::default(), || {
        let _r = profiler::record_function("launch");
        let t0 = std::time::Instant::now();
        profiler::record_measured(
            EventKind::Kernel,
            "k0",
            Track::Stream {
                device: 0,
                stream: 0,
            },
            t0,
            std::time::Duration::from_micros(5),
            profiler::Measured {
                values: vec!["%y".into()],
                bytes: 64,
                flops: 16,
            },
        );
    })
    .unwrap();
    let k = prof.events.iter().find(|e| e.name == "k0").unwrap();
    assert_eq!(k.dur_ns, 5000);
    assert_eq!(k.parent, Some(0));
    let trace: serde_json::Value = serde_json::from_str(&prof.chrome_trace()).unwrap();
    let track_names: Vec<String> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        track_names.contains(&"cuda:0 stream 0".to_string()),
        "{track_names:?}"
    );
}

#[test]
fn the_html_report_of_a_profile_is_self_contained_and_names_what_ran() {
    let _t = turn();
    let x = Tensor::randn(&[64, 64], None).unwrap();
    let ((), prof) = profiler::profile(ProfilerOptions::default().profile_memory(true), || {
        let _ = x.softmax(-1).unwrap().matmul(&x).unwrap();
    })
    .unwrap();
    let html = prof.html_report("softmax <then> matmul");
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("softmax &lt;then&gt; matmul"));
    for name in ["softmax", "matmul", "[[64, 64], [64, 64]]", "<svg"] {
        assert!(html.contains(name), "{name}");
    }
    assert!(!html.contains("<script") && !html.contains("http"));

    let dir = std::env::temp_dir().join(format!("smelt-export-{}", std::process::id()));
    let (trace, report) = profiler::export_dir(&dir, "two", &[("a", &prof), ("b", &prof)]).unwrap();
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let processes = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .count();
    assert_eq!(processes, 2);
    let page = std::fs::read_to_string(&report).unwrap();
    assert_eq!(page.matches("<h2>").count(), 2);
    std::fs::remove_dir_all(&dir).ok();
}
