//! Chrome trace-event JSON, the format Perfetto and `chrome://tracing` open: one process per
//! profile, one track per host thread and per CUDA stream, memory as counters.

use super::table::shapes_text;
use super::{MemDevice, Profile, Track};
use serde_json::{Value, json};

/// Track numbers of CUDA streams start here, above any host thread's number.
const STREAM_TID: u64 = 1_000_000;

fn tid(t: Track) -> u64 {
    match t {
        Track::Thread(n) => n as u64,
        Track::Stream { device, stream } => STREAM_TID + device as u64 * 1000 + stream as u64,
    }
}

fn meta(name: &str, pid: usize, tid: Option<u64>, key: &str, value: Value) -> Value {
    let mut m = json!({"name": name, "ph": "M", "pid": pid});
    if let Some(t) = tid {
        m["tid"] = json!(t);
    }
    m["args"] = json!({ key: value });
    m
}

/// The trace of several profiles side by side, each a process named by its label (the
/// three ways of `smelt profile --trace`), in the order given.
pub fn trace(profiles: &[(&str, &Profile)]) -> String {
    let mut ev = Vec::new();
    for (k, (label, p)) in profiles.iter().enumerate() {
        let pid = k + 1;
        ev.push(meta("process_name", pid, None, "name", json!(label)));
        let sort = json!(pid);
        ev.push(meta("process_sort_index", pid, None, "sort_index", sort));
        for (t, name) in &p.threads {
            ev.push(meta(
                "thread_name",
                pid,
                Some(*t as u64),
                "name",
                json!(name),
            ));
        }
        let mut streams: Vec<Track> = p
            .events
            .iter()
            .map(|e| e.track)
            .filter(|t| matches!(t, Track::Stream { .. }))
            .collect();
        streams.sort();
        streams.dedup();
        for s in streams {
            if let Track::Stream { device, stream } = s {
                let name = json!(format!("cuda:{device} stream {stream}"));
                ev.push(meta("thread_name", pid, Some(tid(s)), "name", name));
            }
        }
        for e in &p.events {
            let mut args = json!({"kind": e.kind.name()});
            if !e.shapes.is_empty() {
                args["input_shapes"] = json!(shapes_text(&e.shapes));
            }
            if !e.values.is_empty() {
                args["values"] = json!(e.values.join(" "));
            }
            if e.bytes > 0 {
                args["bytes"] = json!(e.bytes);
            }
            if e.flops > 0 {
                args["flops"] = json!(e.flops);
            }
            if e.self_alloc > 0 || e.self_freed > 0 {
                args["self_alloc_bytes"] = json!(e.self_alloc);
                args["self_freed_bytes"] = json!(e.self_freed);
            }
            ev.push(json!({
                "name": e.name,
                "cat": e.kind.name(),
                "ph": "X",
                "ts": e.start_ns as f64 / 1e3,
                "dur": e.dur_ns as f64 / 1e3,
                "pid": pid,
                "tid": tid(e.track),
                "args": args,
            }));
        }
        for m in &p.memory {
            let name = match m.device {
                MemDevice::Cpu => "memory (cpu)".to_string(),
                d => format!("memory ({d})"),
            };
            ev.push(json!({
                "name": name,
                "ph": "C",
                "ts": m.t_ns as f64 / 1e3,
                "pid": pid,
                "args": {"bytes": m.live},
            }));
        }
    }
    json!({"traceEvents": ev, "displayTimeUnit": "ms"}).to_string()
}
