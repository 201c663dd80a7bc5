//! The pass manager: the ordered passes from a traced or parsed graph to a planned schedule,
//!
//! `fold_bn → decompose → cse → fold → control → dce → rewrite → cse2 → dce2 → fuse → memplan`,
//!
//! each callable alone, with statistics per pass. Graph passes implement [`GraphPass`]; a pass
//! that runs twice is labelled with its run number from the second run on (`cse2`), so every
//! label names one point of the pipeline (`smelt check --dump-after=LABEL`).

use super::fold::{FoldOptions, fold_with};
use super::fuse::{FuseOptions, fuse_with};
use super::memplan::{MemoryPlan, plan};
use super::rewrite::{RewriteOptions, rewrite};
use super::simplify::{cse, dce};
use crate::ir::graph::Graph;
use crate::kernel::{BufferId, Expr, IndexMap, Kernel, Schedule, Step};
use crate::{Error, Result};
use std::collections::HashSet;

/// Options of every pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassOptions {
    /// Options of constant folding.
    pub fold: FoldOptions,
    /// Options of control-flow simplification.
    pub control: super::control::ControlOptions,
    /// Options of the egg rewriter.
    pub rewrite: RewriteOptions,
    /// Options of fusion.
    pub fuse: FuseOptions,
}

/// A pass from graph to graph that preserves the values of the outputs.
pub trait GraphPass {
    /// The pass's name (`cse`).
    fn name(&self) -> &'static str;
    /// Runs the pass on `g`.
    fn run(&self, g: &Graph, opts: &PassOptions) -> Result<Graph>;
}

/// Evaluation-mode batch norms folded into their convolutions ([`super::fold_bn`]).
pub struct FoldBatchNorm;
/// Composite ops into primitives ([`super::decompose`](mod@super::decompose)).
pub struct Decompose;
/// Common-subexpression elimination ([`super::cse`]).
pub struct Cse;
/// Constant folding ([`super::fold`](mod@super::fold)).
pub struct Fold;
/// Dead-code elimination ([`super::dce`]).
pub struct Dce;
/// Control-flow simplification: constant branches, short loops, invariants, dead carries
/// ([`super::control`]).
pub struct ControlFlow;
/// Equality saturation with IEEE-exact (and, if asked, fast-math) rules ([`super::rewrite`]).
pub struct Rewrite;

impl GraphPass for FoldBatchNorm {
    fn name(&self) -> &'static str {
        "fold_bn"
    }
    fn run(&self, g: &Graph, _: &PassOptions) -> Result<Graph> {
        super::fold_bn::fold_batch_norm(g)
    }
}

impl GraphPass for Decompose {
    fn name(&self) -> &'static str {
        "decompose"
    }
    fn run(&self, g: &Graph, opts: &PassOptions) -> Result<Graph> {
        let d = super::decompose(g)?;
        let inputs = &opts.fuse.channels_last_inputs;
        if inputs.is_empty() {
            return Ok(d);
        }
        // per-channel statistics of NHWC values per image, then across images (column
        // reductions of a permuted view), reshapes of them through a row-major copy
        let nhwc = super::fuse::nhwc_values(&d, inputs);
        super::decompose(&super::decompose::nhwc_rewrites(&d, &nhwc)?)
    }
}

impl GraphPass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }
    fn run(&self, g: &Graph, _: &PassOptions) -> Result<Graph> {
        cse(g)
    }
}

impl GraphPass for Fold {
    fn name(&self) -> &'static str {
        "fold"
    }
    fn run(&self, g: &Graph, opts: &PassOptions) -> Result<Graph> {
        fold_with(g, &opts.fold)
    }
}

impl GraphPass for ControlFlow {
    fn name(&self) -> &'static str {
        "control"
    }
    fn run(&self, g: &Graph, opts: &PassOptions) -> Result<Graph> {
        super::control::simplify_control(g, &opts.control)
    }
}

impl GraphPass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }
    fn run(&self, g: &Graph, _: &PassOptions) -> Result<Graph> {
        dce(g)
    }
}

impl GraphPass for Rewrite {
    fn name(&self) -> &'static str {
        "rewrite"
    }
    fn run(&self, g: &Graph, opts: &PassOptions) -> Result<Graph> {
        Ok(rewrite(g, &opts.rewrite)?.0)
    }
}

/// Kernel-level figures of a schedule.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ScheduleStats {
    /// Number of fused kernels.
    pub kernels: usize,
    /// Number of extern calls (GEMMs included).
    pub externs: usize,
    /// Extern calls that are GEMMs.
    pub gemms: usize,
    /// Σ over kernels of bytes loaded + stored; a broadcast load counts each element it
    /// actually reads once.
    pub bytes_moved: usize,
}

/// What one pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassStats {
    /// The pass's label in the pipeline (`cse2` for the second `cse`).
    pub pass: String,
    /// Graph values before the pass.
    pub nodes_before: usize,
    /// Graph values after the pass.
    pub nodes_after: usize,
    /// For `fuse`: the schedule's figures.
    pub schedule: Option<ScheduleStats>,
    /// For `memplan`: `(peak_planned, peak_unplanned)` in bytes.
    pub memory: Option<(usize, usize)>,
    /// How long the pass took.
    pub time: std::time::Duration,
}

/// A fully compiled graph.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The graph after the last graph pass (the one `schedule` computes).
    pub graph: Graph,
    /// The kernels and extern calls.
    pub schedule: Schedule,
    /// Where each temporary buffer lives.
    pub plan: MemoryPlan,
    /// What each pass did, in order.
    pub stats: Vec<PassStats>,
}

/// The state after some prefix of the pipeline.
#[derive(Clone, Debug)]
pub struct Stage {
    /// The graph after the graph passes run so far.
    pub graph: Graph,
    /// Present once `fuse` has run.
    pub schedule: Option<Schedule>,
    /// Present once `memplan` has run.
    pub plan: Option<MemoryPlan>,
    /// What each pass did, in order.
    pub stats: Vec<PassStats>,
}

/// The ordered passes.
pub struct Pipeline {
    /// The graph-to-graph passes, in order; `fuse` and `memplan` follow them.
    pub graph_passes: Vec<Box<dyn GraphPass>>,
    /// The passes' options.
    pub options: PassOptions,
}

impl Default for Pipeline {
    fn default() -> Pipeline {
        Pipeline {
            graph_passes: vec![
                Box::new(FoldBatchNorm),
                Box::new(Decompose),
                Box::new(Cse),
                Box::new(Fold),
                Box::new(ControlFlow),
                Box::new(Dce),
                // the second cse/dce round cleans up after the rewrites
                Box::new(Rewrite),
                Box::new(Cse),
                Box::new(Dce),
            ],
            options: PassOptions::default(),
        }
    }
}

impl Pipeline {
    /// The labels of every stage in order, `fuse` and `memplan` last.
    pub fn labels(&self) -> Vec<String> {
        let mut labels = Vec::new();
        for p in &self.graph_passes {
            let n = labels
                .iter()
                .filter(|l: &&String| strip_run(l) == p.name())
                .count();
            labels.push(if n == 0 {
                p.name().to_string()
            } else {
                format!("{}{}", p.name(), n + 1)
            });
        }
        labels.push("fuse".into());
        labels.push("memplan".into());
        labels
    }

    /// Runs every pass.
    pub fn run(&self, g: &Graph) -> Result<Compiled> {
        let st = self.run_until(g, "memplan")?;
        match (st.schedule, st.plan) {
            (Some(schedule), Some(plan)) => Ok(Compiled {
                graph: st.graph,
                schedule,
                plan,
                stats: st.stats,
            }),
            _ => Err(Error::Value("the pipeline stopped before memplan".into())),
        }
    }

    /// Runs the passes up to and including the one labelled `label`; an unknown label is an
    /// error that lists the valid ones.
    pub fn run_until(&self, g: &Graph, label: &str) -> Result<Stage> {
        let labels = self.labels();
        let Some(stop) = labels.iter().position(|l| l == label) else {
            return Err(Error::Value(format!(
                "unknown pass '{label}'; the passes are: {}",
                labels.join(", ")
            )));
        };
        g.verify()?;
        // `view` errors depend on the layouts of the graph as written, before any rewrite.
        super::fuse::check_views(g)?;
        let mut graph = g.clone();
        let mut stats = Vec::new();
        for (i, p) in self.graph_passes.iter().enumerate() {
            if i > stop {
                break;
            }
            let t0 = std::time::Instant::now();
            let next = p.run(&graph, &self.options)?;
            let time = t0.elapsed();
            next.verify()?;
            stats.push(PassStats {
                pass: labels[i].clone(),
                nodes_before: graph.len(),
                nodes_after: next.len(),
                schedule: None,
                memory: None,
                time,
            });
            graph = next;
        }
        let fuse_at = self.graph_passes.len();
        let mut stage = Stage {
            graph,
            schedule: None,
            plan: None,
            stats,
        };
        if stop < fuse_at {
            return Ok(stage);
        }
        let t0 = std::time::Instant::now();
        let s = fuse_with(&stage.graph, &self.options.fuse)?;
        let time = t0.elapsed();
        let n = stage.graph.len();
        stage.stats.push(PassStats {
            pass: "fuse".into(),
            nodes_before: n,
            nodes_after: n,
            schedule: Some(schedule_stats(&s)),
            memory: None,
            time,
        });
        if stop > fuse_at {
            let t0 = std::time::Instant::now();
            let p = plan(&s);
            let time = t0.elapsed();
            stage.stats.push(PassStats {
                pass: "memplan".into(),
                nodes_before: n,
                nodes_after: n,
                schedule: None,
                memory: Some((p.peak_planned, p.peak_unplanned)),
                time,
            });
            stage.plan = Some(p);
        }
        stage.schedule = Some(s);
        Ok(stage)
    }
}

/// `cse2` → `cse`.
fn strip_run(label: &str) -> &str {
    label.trim_end_matches(|c: char| c.is_ascii_digit())
}

/// Compiles `g` with the default pipeline.
pub fn compile_graph(g: &Graph) -> Result<Compiled> {
    Pipeline::default().run(g)
}

/// Number of distinct elements a map reads over `space`: the product of the sizes of the
/// dims it moves along (0 for an empty space).
fn elements_touched(map: &IndexMap, space: &[usize]) -> usize {
    if space.contains(&0) {
        return 0;
    }
    space
        .iter()
        .zip(&map.strides)
        .filter(|&(_, &s)| s != 0)
        .map(|(&n, _)| n)
        .product()
}

/// The distinct loads of a kernel: `(buffer, map)` pairs.
pub fn kernel_loads(k: &Kernel) -> Vec<(BufferId, IndexMap)> {
    let mut seen = HashSet::new();
    let mut loads = Vec::new();
    for v in &k.values {
        if let Expr::Load { buffer, map } = &v.expr
            && seen.insert((*buffer, map.clone()))
        {
            loads.push((*buffer, map.clone()));
        }
    }
    loads
}

/// Bytes a kernel loads and stores, each element read or written counted once per map.
pub fn kernel_bytes(s: &Schedule, k: &Kernel) -> usize {
    let space = k.space();
    let size = |b: BufferId| s.buffers.get(b).map_or(0, |b| b.dtype.size());
    let loads: usize = kernel_loads(k)
        .iter()
        .map(|(b, m)| elements_touched(m, &space) * size(*b))
        .sum();
    let stores: usize = k
        .stores
        .iter()
        .map(|st| elements_touched(&st.map, &space) * size(st.buffer))
        .sum();
    loads + stores
}

/// The ops a kernel computes, in order, named as in the graph (`relu`, `mul`, `sum`, ...).
pub fn kernel_ops(k: &Kernel) -> Vec<String> {
    k.values
        .iter()
        .filter_map(|v| match &v.expr {
            Expr::Load { .. } | Expr::Index { .. } | Expr::Const(_) => None,
            Expr::Unary(u, _) => Some(u.name().to_string()),
            Expr::Binary(b, _, _) => Some(b.name().to_string()),
            Expr::Where(..) => Some("where".into()),
            Expr::Clamp { .. } => Some("clamp".into()),
            Expr::Cast(_) => Some("to".into()),
            Expr::MaskedFill { .. } => Some("masked_fill".into()),
            Expr::Reduce { combiner, .. } => Some(combiner.name().to_string()),
        })
        .collect()
}

/// Kernel counts and bytes moved of a schedule.
pub fn schedule_stats(s: &Schedule) -> ScheduleStats {
    ScheduleStats {
        kernels: s.kernel_count(),
        externs: s.externs().count(),
        gemms: s.gemm_count(),
        bytes_moved: s
            .steps
            .iter()
            .map(|st| match st {
                Step::Kernel(k) => kernel_bytes(s, k),
                Step::Extern(_) | Step::Control(_) => 0,
            })
            .sum(),
    }
}
