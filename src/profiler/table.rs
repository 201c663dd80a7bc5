//! `key_averages()`: events grouped by what they are, and the table PyTorch users know.

use super::{EventKind, Profile};
use std::fmt::Write as _;

/// One group of events with the same kind and name (and input shapes, when grouped so).
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The events' name.
    pub name: String,
    /// Their kind.
    pub kind: EventKind,
    /// Their input shapes, when grouped by shape; empty otherwise.
    pub shapes: Vec<Vec<usize>>,
    /// How many ran.
    pub calls: usize,
    /// Time spent in them, nested events included (an event nested in one of the same
    /// key counts once, through the outer one).
    pub total_ns: u64,
    /// Time spent in them and not in events nested inside them.
    pub self_ns: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Arithmetic operations.
    pub flops: u64,
    /// Bytes allocated while they were innermost.
    pub self_alloc: u64,
    /// Bytes freed while they were innermost.
    pub self_freed: u64,
}

impl Row {
    /// Mean time per call, nested events included, in microseconds.
    pub fn avg_us(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.total_ns as f64 / self.calls as f64 / 1e3
        }
    }
    /// Bytes per second over the self time, in GB/s (NaN without time).
    pub fn gbps(&self) -> f64 {
        per_ns(self.bytes, self.self_ns)
    }
    /// FLOPs per second over the self time, in GFLOP/s (NaN without time).
    pub fn gflops(&self) -> f64 {
        per_ns(self.flops, self.self_ns)
    }
}

fn per_ns(x: u64, ns: u64) -> f64 {
    if ns == 0 {
        f64::NAN
    } else {
        x as f64 / ns as f64
    }
}

/// The column a table is sorted by (largest first, except the name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    /// Self time (`self_cpu_time_total`).
    SelfTime,
    /// Total time (`cpu_time_total`).
    TotalTime,
    /// Number of calls.
    Calls,
    /// Bytes moved.
    Bytes,
    /// Arithmetic operations.
    Flops,
    /// Bytes allocated (`self_cpu_memory_usage`).
    Memory,
    /// The name, alphabetically.
    Name,
}

/// Events grouped by key, in the order each key first ran.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyAverages {
    /// One row per key.
    pub rows: Vec<Row>,
    /// The sum of every row's self time.
    pub self_total_ns: u64,
}

pub(super) fn key_averages(p: &Profile, by_shape: bool) -> KeyAverages {
    let mut rows: Vec<Row> = Vec::new();
    for (i, e) in p.events.iter().enumerate() {
        let shapes = if by_shape {
            e.shapes.clone()
        } else {
            Vec::new()
        };
        let pos = rows
            .iter()
            .position(|r| r.kind == e.kind && r.name == e.name && r.shapes == shapes);
        let r = match pos {
            Some(k) => &mut rows[k],
            None => {
                rows.push(Row {
                    name: e.name.clone(),
                    kind: e.kind,
                    shapes,
                    calls: 0,
                    total_ns: 0,
                    self_ns: 0,
                    bytes: 0,
                    flops: 0,
                    self_alloc: 0,
                    self_freed: 0,
                });
                rows.last_mut().expect("just pushed")
            }
        };
        r.calls += 1;
        // an op nested in an op of the same key (a composite calling itself) counts once
        if !same_key_ancestor(p, i) {
            r.total_ns += e.dur_ns;
        }
        r.self_ns += p.self_ns(i);
        r.bytes += e.bytes;
        r.flops += e.flops;
        r.self_alloc += e.self_alloc;
        r.self_freed += e.self_freed;
    }
    let self_total_ns = rows.iter().map(|r| r.self_ns).sum();
    KeyAverages {
        rows,
        self_total_ns,
    }
}

fn same_key_ancestor(p: &Profile, i: usize) -> bool {
    let e = &p.events[i];
    let mut a = e.parent;
    while let Some(j) = a {
        let x = &p.events[j];
        if x.kind == e.kind && x.name == e.name {
            return true;
        }
        a = x.parent;
    }
    false
}

impl KeyAverages {
    /// The first row named `name`.
    pub fn row(&self, name: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.name == name)
    }

    /// The rows sorted by `by`.
    pub fn sorted(&self, by: SortBy) -> Vec<&Row> {
        let mut v: Vec<&Row> = self.rows.iter().collect();
        match by {
            SortBy::Name => v.sort_by(|a, b| a.name.cmp(&b.name)),
            _ => v.sort_by_key(|r| {
                std::cmp::Reverse(match by {
                    SortBy::SelfTime => r.self_ns as u128,
                    SortBy::TotalTime => r.total_ns as u128,
                    SortBy::Calls => r.calls as u128,
                    SortBy::Bytes => r.bytes as u128,
                    SortBy::Flops => r.flops as u128,
                    SortBy::Memory => r.self_alloc as u128,
                    SortBy::Name => 0,
                })
            }),
        }
        v
    }

    /// The table of `prof.key_averages().table(sort_by=.., row_limit=..)`: the first
    /// `limit` rows (all with `None`) sorted by `by`, and the total self time.
    pub fn table(&self, by: SortBy, limit: Option<usize>) -> String {
        let rows = self.sorted(by);
        let shown = &rows[..limit.unwrap_or(rows.len()).min(rows.len())];
        let with_shapes = shown.iter().any(|r| !r.shapes.is_empty());
        let w = shown
            .iter()
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(4)
            .clamp(4, 40);
        let mut out = String::new();
        let _ = write!(
            out,
            "{:<w$}  {:<10} {:>6} {:>10} {:>7} {:>10} {:>10} {:>10} {:>8} {:>9} {:>10}",
            "Name",
            "Kind",
            "Calls",
            "Self ms",
            "Self %",
            "Total ms",
            "Avg us",
            "Bytes",
            "GB/s",
            "GFLOP/s",
            "Self mem",
        );
        if with_shapes {
            out.push_str("  Input shapes");
        }
        out.push('\n');
        let rule = out.trim_end().chars().count();
        let _ = writeln!(out, "{}", "-".repeat(rule));
        for r in shown {
            let pct = if self.self_total_ns == 0 {
                0.0
            } else {
                100.0 * r.self_ns as f64 / self.self_total_ns as f64
            };
            let name: String = r.name.chars().take(w).collect();
            let _ = write!(
                out,
                "{name:<w$}  {:<10} {:>6} {:>10.3} {:>6.1}% {:>10.3} {:>10.1} {:>10} {:>8.2} {:>9.2} {:>10}",
                r.kind.name(),
                r.calls,
                r.self_ns as f64 / 1e6,
                pct,
                r.total_ns as f64 / 1e6,
                r.avg_us(),
                human_bytes(r.bytes),
                r.gbps(),
                r.gflops(),
                human_bytes(r.self_alloc),
            );
            if with_shapes {
                let _ = write!(out, "  {}", shapes_text(&r.shapes));
            }
            out.push('\n');
        }
        let _ = writeln!(out, "{}", "-".repeat(rule));
        let _ = writeln!(
            out,
            "Self time total: {:.3} ms ({} of {} rows shown)",
            self.self_total_ns as f64 / 1e6,
            shown.len(),
            rows.len()
        );
        out
    }
}

/// `[[64, 64], [64]]`.
pub fn shapes_text(shapes: &[Vec<usize>]) -> String {
    let inner: Vec<String> = shapes.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", inner.join(", "))
}

/// Bytes with a decimal unit (`1.50 MB`).
pub fn human_bytes(b: u64) -> String {
    let f = b as f64;
    if f >= 1e9 {
        format!("{:.2} GB", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.2} MB", f / 1e6)
    } else if f >= 1e3 {
        format!("{:.1} kB", f / 1e3)
    } else {
        format!("{b} B")
    }
}
