//! Chrome trace-event JSON, the format Perfetto and `chrome://tracing` open: one process per
//! profile, one track per host thread and per CUDA stream, memory as counters.

use super::json::Json;
use super::table::shapes_text;
use super::{MemDevice, Profile, Track};

/// Track numbers of CUDA streams start here, above any host thread's number.
const STREAM_TID: u64 = 1_000_000;

fn tid(t: Track) -> u64 {
    match t {
        Track::Thread(n) => n as u64,
        Track::Stream { device, stream } => STREAM_TID + device as u64 * 1000 + stream as u64,
    }
}

fn meta(name: &str, pid: usize, tid: Option<u64>, arg: (&str, Json)) -> Json {
    let mut v = vec![
        ("name".to_string(), Json::str(name)),
        ("ph".to_string(), Json::str("M")),
        ("pid".to_string(), Json::Num(pid as f64)),
    ];
    if let Some(t) = tid {
        v.push(("tid".to_string(), Json::Num(t as f64)));
    }
    v.push(("args".to_string(), Json::obj([arg])));
    Json::Obj(v)
}

/// The trace of several profiles side by side, each a process named by its label (the
/// three ways of `smelt profile --trace`), in the order given.
pub fn trace(profiles: &[(&str, &Profile)]) -> String {
    let mut ev = Vec::new();
    for (k, (label, p)) in profiles.iter().enumerate() {
        let pid = k + 1;
        ev.push(meta("process_name", pid, None, ("name", Json::str(*label))));
        ev.push(meta(
            "process_sort_index",
            pid,
            None,
            ("sort_index", Json::Num(pid as f64)),
        ));
        for (t, name) in &p.threads {
            ev.push(meta(
                "thread_name",
                pid,
                Some(*t as u64),
                ("name", Json::str(name.clone())),
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
                ev.push(meta(
                    "thread_name",
                    pid,
                    Some(tid(s)),
                    ("name", Json::str(format!("cuda:{device} stream {stream}"))),
                ));
            }
        }
        for e in &p.events {
            let mut args = vec![("kind".to_string(), Json::str(e.kind.name()))];
            if !e.shapes.is_empty() {
                args.push(("input_shapes".into(), Json::str(shapes_text(&e.shapes))));
            }
            if !e.values.is_empty() {
                args.push(("values".into(), Json::str(e.values.join(" "))));
            }
            if e.bytes > 0 {
                args.push(("bytes".into(), Json::Num(e.bytes as f64)));
            }
            if e.flops > 0 {
                args.push(("flops".into(), Json::Num(e.flops as f64)));
            }
            if e.self_alloc > 0 || e.self_freed > 0 {
                args.push(("self_alloc_bytes".into(), Json::Num(e.self_alloc as f64)));
                args.push(("self_freed_bytes".into(), Json::Num(e.self_freed as f64)));
            }
            ev.push(Json::Obj(vec![
                ("name".into(), Json::str(e.name.clone())),
                ("cat".into(), Json::str(e.kind.name())),
                ("ph".into(), Json::str("X")),
                ("ts".into(), Json::Num(e.start_ns as f64 / 1e3)),
                ("dur".into(), Json::Num(e.dur_ns as f64 / 1e3)),
                ("pid".into(), Json::Num(pid as f64)),
                ("tid".into(), Json::Num(tid(e.track) as f64)),
                ("args".into(), Json::Obj(args)),
            ]));
        }
        for m in &p.memory {
            let name = match m.device {
                MemDevice::Cpu => "memory (cpu)".to_string(),
                d => format!("memory ({d})"),
            };
            ev.push(Json::Obj(vec![
                ("name".into(), Json::Str(name)),
                ("ph".into(), Json::str("C")),
                ("ts".into(), Json::Num(m.t_ns as f64 / 1e3)),
                ("pid".into(), Json::Num(pid as f64)),
                (
                    "args".into(),
                    Json::obj([("bytes", Json::Num(m.live as f64))]),
                ),
            ]));
        }
    }
    Json::Obj(vec![
        ("traceEvents".into(), Json::Arr(ev)),
        ("displayTimeUnit".into(), Json::str("ms")),
    ])
    .to_text()
}
