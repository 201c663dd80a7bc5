//! Equality saturation over graphs with egg: the graph becomes an e-graph whose e-classes
//! carry their types, rules add equivalent forms (IEEE-exact ones always, value-changing ones
//! only under fast math), and the cheapest graph under a memory-traffic cost model is
//! extracted. See `rules` for the rule list and `cost` for the cost model.

pub mod convert;
pub mod cost;
pub mod lang;
pub mod rules;

use crate::Result;
use crate::ir::graph::Graph;
use egg::{Runner, StopReason};
use std::collections::BTreeMap;
use std::time::Duration;

/// Limits and semantics of a rewrite run.
///
/// Saturation stops at an e-node budget that grows with the graph,
/// `min(node_limit, max(MIN_NODE_BUDGET, nodes_per_node × input e-nodes))`, or after
/// `iter_limit` iterations, whichever comes first: both make the result a function of the
/// graph alone. `time_limit` is only a backstop against a pathological rule set; with the
/// defaults the budgets bind long before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RewriteOptions {
    /// Also use rules that can change IEEE results (reassociation, `x*0 → 0`, ...): the
    /// fast-math rules.
    pub non_ieee_rules: bool,
    /// Never let the e-graph grow past this many e-nodes, whatever the graph's size.
    pub node_limit: usize,
    /// E-nodes the e-graph may grow to per e-node of the input graph (see above).
    pub nodes_per_node: usize,
    /// Stop saturating after this long.
    pub time_limit: Duration,
    /// Stop saturating after this many iterations.
    pub iter_limit: usize,
}

/// The smallest e-node budget a graph gets, however small it is.
pub const MIN_NODE_BUDGET: usize = 1_000;

impl Default for RewriteOptions {
    fn default() -> RewriteOptions {
        RewriteOptions {
            non_ieee_rules: false,
            node_limit: 10_000,
            nodes_per_node: 16,
            time_limit: Duration::from_secs(1),
            iter_limit: 16,
        }
    }
}

impl RewriteOptions {
    /// The e-node budget for an input graph of `start_size` e-nodes.
    pub fn node_budget(&self, start_size: usize) -> usize {
        self.node_limit
            .min(MIN_NODE_BUDGET.max(self.nodes_per_node.saturating_mul(start_size)))
    }
}

/// What a rewrite run did.
#[derive(Clone, Debug, Default)]
pub struct RewriteStats {
    /// Values in the input graph.
    pub nodes_before: usize,
    /// Values in the extracted graph.
    pub nodes_after: usize,
    /// E-nodes in the saturated e-graph.
    pub egraph_nodes: usize,
    /// Saturation iterations run.
    pub iterations: usize,
    /// (rule name, times it added something), for the rules that did, sorted by name.
    pub fired: Vec<(String, usize)>,
    /// Why saturation stopped: `Saturated`, `IterationLimit(n)`, `NodeLimit(n)`,
    /// `TimeLimit(s)`.
    pub stop_reason: String,
}

/// Rewrites `g` into an equivalent graph that is cheapest under the memory-traffic cost
/// model: same name, inputs (in order, with their names) and outputs.
pub fn rewrite(g: &Graph, opts: &RewriteOptions) -> Result<(Graph, RewriteStats)> {
    g.verify()?;
    let (eg, roots, ids) = convert::to_egraph(g)?;
    let rules = rules::rules(opts.non_ieee_rules)?;
    let mut stats = RewriteStats {
        nodes_before: g.len(),
        ..RewriteStats::default()
    };
    let start_size = eg.total_size();
    let budget = opts.node_budget(start_size);
    let eg = if start_size > budget {
        stats.stop_reason = format!("{:?}", StopReason::NodeLimit(start_size));
        eg
    } else if opts.iter_limit == 0 {
        stats.stop_reason = format!("{:?}", StopReason::IterationLimit(0));
        eg
    } else {
        let runner: Runner<lang::ENode, lang::Types> = Runner::new(lang::Types::default())
            .with_egraph(eg)
            .with_node_limit(budget)
            .with_time_limit(opts.time_limit)
            .with_iter_limit(opts.iter_limit)
            .run(&rules);
        let mut fired: BTreeMap<String, usize> = BTreeMap::new();
        for it in &runner.iterations {
            for (name, &n) in &it.applied {
                if n > 0 {
                    *fired.entry(name.to_string()).or_default() += n;
                }
            }
        }
        stats.iterations = runner.iterations.len();
        stats.fired = fired.into_iter().collect();
        stats.stop_reason = runner
            .stop_reason
            .as_ref()
            .map(|r| format!("{r:?}"))
            .unwrap_or_default();
        runner.egraph
    };
    stats.egraph_nodes = eg.total_size();
    let out = convert::extract(g, &eg, &roots, &ids)?;
    stats.nodes_after = out.len();
    Ok((out, stats))
}
