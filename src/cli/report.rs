//! `smelt profile --trace FILE --html FILE`: one call of each way recorded by the profiler
//! (the three on separate tracks of one Chrome trace), and a self-contained HTML report of
//! fused against unfused: per fused kernel the unfused kernels it replaced, time and bytes,
//! GB/s against the copy bandwidth measured in the same run, the memory plan over the
//! steps, and the compile time by pass.

use super::profile::{Way, eager_run, gbps, human_bytes, ms};
use crate::Result;
use crate::exec::{CompiledFn, StepInfo, step_buffers};
use crate::ir::graph::Graph;
use crate::passes::pipeline::Pipeline;
use crate::profiler::html::{
    Cell, Page, bar_scale, escape, fmt_rate, line_chart, roofline, time_text,
};
use crate::profiler::{self, Profile, ProfilerOptions, SortBy};
use crate::runtime::Tensor;
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

/// The three ways, one call each, recorded with memory.
pub(super) struct Recorded {
    pub eager: Profile,
    pub unfused: Profile,
    pub fused: Profile,
}

/// Records one call of each way.
pub(super) fn record(
    g: &Graph,
    inputs: &[Tensor],
    unfused: &CompiledFn,
    fused: &CompiledFn,
) -> Result<Recorded> {
    let opts = ProfilerOptions::default().profile_memory(true);
    let (r, eager) = profiler::profile(opts.clone(), || eager_run(g, inputs))?;
    r?;
    let (r, unf) = profiler::profile(opts.clone(), || unfused.call(inputs))?;
    r?;
    let (r, fus) = profiler::profile(opts, || fused.call(inputs))?;
    r?;
    Ok(Recorded {
        eager,
        unfused: unf,
        fused: fus,
    })
}

/// Writes the three ways as one Chrome trace, a process each.
pub(super) fn write_trace(path: &Path, r: &Recorded) -> Result<()> {
    let text = profiler::chrome::trace(&[
        ("eager (reference kernels)", &r.eager),
        ("unfused (one kernel per op)", &r.unfused),
        ("fused", &r.fused),
    ]);
    profiler::write_file(path, &text)
}

/// Read-plus-write bandwidth of a parallel copy of 64 MiB, median of 7, in GB/s: the roof
/// every kernel's GB/s is compared with.
pub(super) fn copy_bandwidth() -> f64 {
    use rayon::prelude::*;
    const N: usize = 16 << 20;
    let src = vec![1.0f32; N];
    let mut dst = vec![0.0f32; N];
    let chunk = 1 << 16;
    let mut t = Vec::new();
    for _ in 0..7 {
        let t0 = Instant::now();
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        t.push(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    t.sort_by(f64::total_cmp);
    (2 * N * 4) as f64 / t[t.len() / 2] / 1e9
}

/// Which fused step each unfused step's work went to: the fused step that writes the same
/// graph value, else the earliest fused step that needs it (a value a fused kernel computes
/// in registers feeds that kernel's outputs). `None`: folded or rewritten away.
pub(super) fn replaced_by(unfused: &CompiledFn, fused: &CompiledFn) -> Vec<Option<usize>> {
    let us = unfused.schedule();
    let fs = fused.schedule();
    let mut writer: HashMap<&str, usize> = HashMap::new();
    for (i, st) in fs.steps.iter().enumerate() {
        for b in step_buffers(st).1 {
            writer.entry(fs.buffers[b].name.as_str()).or_insert(i);
        }
    }
    let io: Vec<(Vec<usize>, Vec<usize>)> = us.steps.iter().map(step_buffers).collect();
    let mut owner: Vec<Option<usize>> = vec![None; us.steps.len()];
    for i in (0..us.steps.len()).rev() {
        let writes = &io[i].1;
        let direct = writes
            .iter()
            .find_map(|&b| writer.get(us.buffers[b].name.as_str()).copied());
        owner[i] = direct.or_else(|| {
            // the consumers of what step i writes, later in the unfused order
            (i + 1..us.steps.len())
                .filter(|&j| io[j].0.iter().any(|b| writes.contains(b)))
                .filter_map(|j| owner[j])
                .min()
        });
    }
    owner
}

/// (x, y) points of a chart.
type Points = Vec<(f64, f64)>;

/// Live temporary bytes during each step (drawn over [i, i + 1)): with the executor's plan
/// (buffers given back after their last use) and without one (nothing given back until
/// the call ends); and the bytes of the plan's slots.
fn memory_over_steps(f: &CompiledFn) -> (Points, Points, usize) {
    let s = f.schedule();
    let plan = f.temp_plan();
    let (mut live, mut all) = (0usize, 0usize);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..s.steps.len() {
        for &b in plan.alloc_before.get(i).into_iter().flatten() {
            live += s.buffers[b].bytes();
            all += s.buffers[b].bytes();
        }
        with.push((i as f64, live as f64));
        without.push((i as f64, all as f64));
        for &b in plan.free_after.get(i).into_iter().flatten() {
            live = live.saturating_sub(s.buffers[b].bytes());
        }
    }
    // the last step's level runs to the end of the axis
    let n = s.steps.len() as f64;
    if let (Some(&(_, a)), Some(&(_, b))) = (with.last(), without.last()) {
        with.push((n, a));
        without.push((n, b));
    }
    let slots = plan.slots.iter().map(|(d, n)| d.size() * n).sum::<usize>();
    (with, without, slots)
}

/// Everything the report shows.
pub(super) struct ReportInput<'a> {
    pub graph: &'a Graph,
    pub backend: &'a str,
    pub eager: &'a Way,
    pub unfused: &'a Way,
    pub fused: &'a Way,
    pub unfused_fn: &'a CompiledFn,
    pub fused_fn: &'a CompiledFn,
    pub recorded: &'a Recorded,
    pub copy_gbps: f64,
    pub compile_ms: f64,
    pub bytes_min: usize,
    pub repeat: usize,
}

fn step_row(name: &str, info: &StepInfo, t: f64, scale: f64, copy: f64, s: usize) -> Vec<Cell> {
    let bw = gbps(info.bytes, t);
    vec![
        Cell::Text(name.to_string()),
        Cell::Bars(vec![(s, t / scale)], time_text(t)),
        Cell::Num(human_bytes(info.bytes)),
        Cell::Num(fmt_rate(bw)),
        Cell::Num(if copy > 0.0 && bw.is_finite() {
            format!("{:.0}%", 100.0 * bw / copy)
        } else {
            "–".into()
        }),
        Cell::Num(fmt_rate(if t > 0.0 {
            info.flops as f64 / (t * 1e6)
        } else {
            f64::NAN
        })),
        Cell::Ops(info.ops.join(" ")),
    ]
}

/// The report as one HTML document.
pub(super) fn html(r: &ReportInput) -> Result<String> {
    let g = r.graph;
    let mut page = Page::new(&format!("smelt profile: {}", g.name));
    let (e, u, f) = (
        r.eager.median_ms(),
        r.unfused.median_ms(),
        r.fused.median_ms(),
    );
    page.p(&format!(
        "Kernels: {}. Median of {} calls per way, after one warm-up call; copy bandwidth \
         measured in the same run (parallel copy of 64 MiB, read + write).",
        r.backend, r.repeat
    ));
    page.cards(&[
        (time_text(f), "fused".into()),
        (time_text(u), "unfused".into()),
        (time_text(e), "eager (reference kernels)".into()),
        (
            format!("{:.2}x", if f > 0.0 { u / f } else { f64::NAN }),
            "fused vs unfused".into(),
        ),
        (
            format!("{} → {}", r.unfused.steps.len(), r.fused.steps.len()),
            "steps unfused → fused".into(),
        ),
        (format!("{:.1} GB/s", r.copy_gbps), "copy bandwidth".into()),
        (
            format!("{:.2} GB/s", gbps(r.bytes_min, f)),
            format!(
                "fused, on the minimum traffic of {}",
                human_bytes(r.bytes_min)
            ),
        ),
        (time_text(r.compile_ms), "compile (cold)".into()),
    ]);

    // fused kernels and what they replaced
    page.h2("Fused kernels and the unfused kernels they replaced");
    page.legend(&["fused kernel", "unfused kernels it replaced"]);
    let owner = replaced_by(r.unfused_fn, r.fused_fn);
    let ftimes: Vec<f64> = (0..r.fused.steps.len())
        .map(|i| r.fused.step_ms(i))
        .collect();
    let utimes: Vec<f64> = (0..r.unfused.steps.len())
        .map(|i| r.unfused.step_ms(i))
        .collect();
    let mut groups: Vec<(Option<usize>, Vec<usize>)> = (0..r.fused.steps.len())
        .map(|i| (Some(i), Vec::new()))
        .collect();
    let mut gone = Vec::new();
    for (j, o) in owner.iter().enumerate() {
        match o {
            Some(i) => groups[*i].1.push(j),
            None => gone.push(j),
        }
    }
    if !gone.is_empty() {
        groups.push((None, gone));
    }
    let all: Vec<f64> = ftimes.iter().chain(&utimes).copied().collect();
    let scale = bar_scale(&all);
    let mut rows = Vec::new();
    let mut first = Vec::new();
    for (i, js) in &groups {
        match i {
            Some(i) => {
                let info = &r.fused.steps[*i];
                let sum: f64 = js.iter().map(|&j| utimes[j]).sum();
                let mut row = step_row(&info.name, info, ftimes[*i], scale, r.copy_gbps, 0);
                if let Cell::Text(t) = &mut row[0] {
                    *t = format!(
                        "{} (replaces {} unfused, {})",
                        info.name,
                        js.len(),
                        time_text(sum)
                    );
                }
                rows.push(row);
            }
            None => rows.push(vec![
                Cell::Text("(no fused step: folded or rewritten away)".into()),
                Cell::Text(String::new()),
                Cell::Num(String::new()),
                Cell::Num(String::new()),
                Cell::Num(String::new()),
                Cell::Num(String::new()),
                Cell::Ops(String::new()),
            ]),
        }
        first.push(true);
        for &j in js {
            let info = &r.unfused.steps[j];
            rows.push(step_row(
                &format!("    {}", info.name),
                info,
                utimes[j],
                scale,
                r.copy_gbps,
                1,
            ));
            first.push(false);
        }
    }
    page.table(
        &[
            "kernel",
            "time",
            "bytes",
            "GB/s",
            "of copy bw",
            "GFLOP/s",
            "ops",
        ],
        &rows,
        &first,
    );

    // bytes moved, fused against unfused
    page.h2("Bytes moved");
    let fb: usize = r.fused.steps.iter().map(|s| s.bytes).sum();
    let ub: usize = r.unfused.steps.iter().map(|s| s.bytes).sum();
    let top = fb.max(ub).max(1) as f64;
    page.table(
        &["schedule", "bytes read + written", "steps", "time"],
        &[
            vec![
                Cell::Text("fused".into()),
                Cell::Bars(vec![(0, fb as f64 / top)], human_bytes(fb)),
                Cell::Num(r.fused.steps.len().to_string()),
                Cell::Num(time_text(f)),
            ],
            vec![
                Cell::Text("unfused".into()),
                Cell::Bars(vec![(1, ub as f64 / top)], human_bytes(ub)),
                Cell::Num(r.unfused.steps.len().to_string()),
                Cell::Num(time_text(u)),
            ],
            vec![
                Cell::Text("minimum (inputs once, outputs once)".into()),
                Cell::Bars(
                    vec![(2, r.bytes_min as f64 / top)],
                    human_bytes(r.bytes_min),
                ),
                Cell::Num("–".into()),
                Cell::Num("–".into()),
            ],
        ],
        &[],
    );

    // roofline
    page.h2("Kernels against the copy roof");
    page.p(
        "Each dot is a kernel of the fused schedule (hover for its name). A kernel on the \
         dashed line moves its bytes as fast as a plain parallel copy does.",
    );
    let pts: Vec<(String, f64, f64)> = r
        .fused
        .steps
        .iter()
        .zip(&ftimes)
        .map(|(s, &t)| {
            let intensity = s.flops as f64 / s.bytes.max(1) as f64;
            let gf = if t > 0.0 {
                s.flops as f64 / (t * 1e6)
            } else {
                0.0
            };
            (s.name.clone(), intensity, gf)
        })
        .collect();
    page.raw(&roofline(&pts, r.copy_gbps));

    // memory plan
    let (with, without, slots) = memory_over_steps(r.fused_fn);
    let peak_with = with.iter().map(|p| p.1).fold(0.0, f64::max);
    let peak_without = without.iter().map(|p| p.1).fold(0.0, f64::max);
    page.h2("Memory plan over the fused steps");
    page.cards(&[
        (human_bytes(slots), "temporaries with the plan (slots)".into()),
        (human_bytes(peak_with as usize), "peak live temporaries".into()),
        (
            human_bytes(peak_without as usize),
            "temporaries without a plan (none freed)".into(),
        ),
        (
            human_bytes(
                r.recorded
                    .fused
                    .peak_memory(profiler::MemDevice::Cpu)
                    .max(0) as usize,
            ),
            "host memory newly taken by one fused call at its peak (recorded; slots are reused across calls)".into(),
        ),
    ]);
    page.raw(&line_chart(
        &[
            ("live temporaries, planned", with),
            ("without a plan", without),
        ],
        "step",
        "bytes",
    ));

    // compile time by pass
    page.h2("Compile time by pass");
    let pipeline = Pipeline {
        options: r.fused_fn.options().passes.clone(),
        ..Pipeline::default()
    };
    let compiled = pipeline.run(g)?;
    let names: Vec<String> = g.inputs().iter().map(|&v| g.node(v).name.clone()).collect();
    let codegen =
        CompiledFn::from_schedule(compiled.schedule.clone(), names, r.fused_fn.options())?
            .compile_time();
    let mut passes: Vec<(String, f64, String)> = compiled
        .stats
        .iter()
        .map(|p| {
            (
                p.pass.clone(),
                ms(&p.time),
                format!("{} → {} values", p.nodes_before, p.nodes_after),
            )
        })
        .collect();
    passes.push((
        "codegen".into(),
        ms(&codegen),
        format!("{} steps", compiled.schedule.steps.len()),
    ));
    let top = passes.iter().map(|p| p.1).fold(1e-9, f64::max);
    let rows: Vec<Vec<Cell>> = passes
        .iter()
        .map(|(n, t, what)| {
            vec![
                Cell::Text(n.clone()),
                Cell::Bars(vec![(3, t / top)], time_text(*t)),
                Cell::Ops(what.clone()),
            ]
        })
        .collect();
    page.table(&["pass", "time", "graph"], &rows, &[]);

    // the eager ops
    page.h2("Eager ops (one call, reference kernels)");
    let avg = r.recorded.eager.key_averages();
    let sorted = avg.sorted(SortBy::SelfTime);
    let top = sorted.first().map_or(1, |x| x.self_ns.max(1)) as f64;
    let rows: Vec<Vec<Cell>> = sorted
        .iter()
        .take(40)
        .map(|x| {
            vec![
                Cell::Text(x.name.clone()),
                Cell::Num(x.calls.to_string()),
                Cell::Bars(
                    vec![(1, x.self_ns as f64 / top)],
                    time_text(x.self_ns as f64 / 1e6),
                ),
                Cell::Num(profiler::human_bytes(x.bytes)),
                Cell::Num(profiler::human_bytes(x.self_alloc)),
            ]
        })
        .collect();
    page.table(
        &["op", "calls", "self time", "bytes", "allocated"],
        &rows,
        &[],
    );
    page.raw(&format!(
        "<p class=sub>Graph <code>{}</code>: {} inputs, {} outputs.</p>",
        escape(&g.name),
        g.inputs().len(),
        g.outputs().len()
    ));
    Ok(page.finish())
}
