//! `smelt check`: parse and verify a model and print it; optionally run the compiler's passes
//! and print the graph or schedule after one of them (`--dump-after`) or the fusion summary
//! (`--fusion`).

use crate::Result;
use crate::ir::graph::Graph;
use crate::ir::{print_graph, print_module};
use crate::kernel::{Schedule, Step};
use crate::passes::memplan::MemoryPlan;
use crate::passes::pipeline::{PassStats, Pipeline, kernel_bytes, kernel_loads, kernel_ops};
use std::fmt::Write;
use std::path::PathBuf;

/// Arguments of `smelt check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The .smelt file.
    pub model: PathBuf,
    /// Print only this graph (default: every graph in the file).
    #[arg(long, value_name = "NAME")]
    pub graph: Option<String>,
    /// Print the graph (or, from `fuse` on, the schedule) after this pass.
    #[arg(long, value_name = "PASS", value_parser = pass_label)]
    pub dump_after: Option<String>,
    /// Print the kernels and extern calls, the statistics of every pass and the memory plan.
    #[arg(long)]
    pub fusion: bool,
    /// Inputs that arrive in the channels_last memory format (comma-separated names): the
    /// 4-D values computed from them are planned NHWC.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub channels_last: Vec<String>,
}

/// Accepts the label of a stage of the default pipeline.
fn pass_label(s: &str) -> std::result::Result<String, String> {
    let labels = Pipeline::default().labels();
    if labels.iter().any(|l| l == s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "unknown pass '{s}'; the passes are: {}",
            labels.join(", ")
        ))
    }
}

/// Runs `smelt check`.
pub fn check(a: &CheckArgs) -> Result<()> {
    let module = match super::model::read_smelt(&a.model)? {
        Some(m) if m.is_symbolic() && a.dump_after.is_none() && !a.fusion => {
            print!("{}", m.print(a.graph.as_deref())?);
            return Ok(());
        }
        // the passes run at the sample sizes, which the output names
        Some(m) if m.is_symbolic() => {
            println!("# at sample sizes {}", m.sample_sizes());
            m.sample().clone()
        }
        Some(m) => m.into_sample(),
        None => super::load(&a.model)?,
    };
    let graphs: Vec<&Graph> = match &a.graph {
        Some(name) => vec![module.graph(name)?],
        None => module.graphs.iter().collect(),
    };
    for g in &graphs {
        g.verify()?;
    }
    if a.dump_after.is_none() && !a.fusion {
        let text = match &a.graph {
            Some(_) => print_graph(graphs[0]),
            None => print_module(&module),
        };
        print!("{text}");
        return Ok(());
    }
    let mut pipeline = Pipeline::default();
    pipeline.options.fuse.channels_last_inputs = a.channels_last.clone();
    let mut out = String::new();
    for g in graphs {
        if let Some(label) = &a.dump_after {
            let st = pipeline.run_until(g, label)?;
            match (&st.schedule, &st.plan) {
                (Some(s), Some(p)) => {
                    out.push_str(&s.to_string());
                    out.push_str(&plan_text(s, p));
                }
                (Some(s), None) => out.push_str(&s.to_string()),
                _ => out.push_str(&print_graph(&st.graph)),
            }
        }
        if a.fusion {
            crate::exec::check_channels_last(g, &a.channels_last)?;
            let c = pipeline.run(g)?;
            out.push_str(&fusion_text(&c.schedule, &c.plan, &c.stats));
        }
    }
    print!("{out}");
    Ok(())
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The fusion summary of a compiled graph: steps with their ops, per-pass figures, memory.
pub fn fusion_text(s: &Schedule, plan: &MemoryPlan, stats: &[PassStats]) -> String {
    let mut t = String::new();
    let bufname = |b: usize| {
        s.buffers.get(b).map_or(format!("b{b}"), |x| {
            let nhwc = if x.channels_last { " nhwc" } else { "" };
            format!("b{b} %{}{nhwc}", x.name)
        })
    };
    let _ = writeln!(
        t,
        "graph {}: {}, {}",
        s.name,
        plural(s.kernel_count(), "kernel", "kernels"),
        plural(s.externs().count(), "extern call", "extern calls")
    );
    let nhwc: Vec<String> = s
        .buffers
        .iter()
        .filter(|b| b.channels_last)
        .map(|b| format!("%{}", b.name))
        .collect();
    if !nhwc.is_empty() {
        let _ = writeln!(t, "layout: channels_last (NHWC) {}", nhwc.join(", "));
    }
    // kernels numbered as below: the steps before each nested one
    let nested = crate::exec::cpu::nested_epilogues(s);
    if !nested.is_empty() {
        let names: Vec<String> = nested
            .iter()
            .map(|&i| {
                let k = s.steps[..i]
                    .iter()
                    .filter(|st| matches!(st, Step::Kernel(_)))
                    .count();
                format!("kernel {k}")
            })
            .collect();
        let _ = writeln!(
            t,
            "epilogues run inside the convolution before them, tile by tile: {}",
            names.join(", ")
        );
    }
    let (mut nk, mut ne) = (0, 0);
    for step in &s.steps {
        match step {
            Step::Kernel(k) => {
                let _ = writeln!(
                    t,
                    "kernel {nk} [{}] : {}, {} ({} bytes)",
                    kernel_ops(k).join(", "),
                    plural(k.stores.len(), "store", "stores"),
                    plural(kernel_loads(k).len(), "load", "loads"),
                    kernel_bytes(s, k)
                );
                nk += 1;
            }
            Step::Extern(e) => {
                let args: Vec<String> = e
                    .args
                    .iter()
                    .map(|v| {
                        // the buffer as it is laid out (contiguous, or NHWC)
                        let whole = s
                            .buffers
                            .get(v.buffer)
                            .is_some_and(|b| b.shape == v.shape && b.strides() == v.strides);
                        let how = if whole && v.offset == 0 {
                            ""
                        } else {
                            " (view)"
                        };
                        format!("{}{how}", bufname(v.buffer))
                    })
                    .collect();
                let _ = writeln!(
                    t,
                    "extern {ne} {}({}) -> {}",
                    e.op.name(),
                    args.join(", "),
                    bufname(e.out)
                );
                ne += 1;
            }
            Step::Control(c) => {
                let bodies: Vec<String> = c
                    .control
                    .kind
                    .body_names()
                    .iter()
                    .zip(&c.control.bodies)
                    .map(|(r, b)| format!("{r}=@{}", b.0.name))
                    .collect();
                let outs: Vec<String> = c
                    .outs
                    .iter()
                    .map(|o| o.map_or_else(|| "_".to_string(), bufname))
                    .collect();
                let _ = writeln!(
                    t,
                    "control {}({} args, {}) -> {}",
                    c.control.name(),
                    c.args.len(),
                    bodies.join(", "),
                    outs.join(", ")
                );
            }
        }
    }
    let _ = writeln!(t, "passes:");
    for p in stats {
        let what = if let Some(f) = &p.schedule {
            format!(
                "{}, {} ({} GEMM), {} bytes moved",
                plural(f.kernels, "kernel", "kernels"),
                plural(f.externs, "extern call", "extern calls"),
                f.gemms,
                f.bytes_moved
            )
        } else if let Some((planned, unplanned)) = p.memory {
            format!("peak {planned} bytes planned, {unplanned} bytes unplanned")
        } else {
            format!("nodes {} -> {}", p.nodes_before, p.nodes_after)
        };
        let _ = writeln!(t, "  {:<10} {what}", p.pass);
    }
    t.push_str(&plan_text(s, plan));
    t
}

/// The memory plan: each slot with its size and the buffers it holds.
pub fn plan_text(s: &Schedule, plan: &MemoryPlan) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "memory plan: {}, {} bytes planned, {} bytes unplanned",
        plural(plan.slots(), "slot", "slots"),
        plan.peak_planned,
        plan.peak_unplanned
    );
    for (k, bytes) in plan.slot_bytes.iter().enumerate() {
        let held: Vec<String> = plan
            .slot_of
            .iter()
            .enumerate()
            .filter(|&(_, sl)| *sl == Some(k))
            .map(|(b, _)| format!("b{b} %{}", s.buffers[b].name))
            .collect();
        let _ = writeln!(t, "  slot {k} ({bytes} bytes): {}", held.join(", "));
    }
    t
}
