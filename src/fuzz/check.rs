//! One case through every CPU path, each checked against the float64 oracle
//! ([`super::oracle`]), and its gradient checked twice: compiled against the oracle of the
//! gradient graph, and the f64 gradient against central finite differences.

use super::graphs::{constants, index_ranges};
use super::oracle::{self, Expected};
use crate::exec::{CompileOptions, CompiledFn, DiskCache, KernelBackend};
use crate::ir::dtype::DType;
use crate::ir::graph::{Graph, Module};
use crate::ir::text::{parse_module, print_module};
use crate::passes::autodiff::autodiff;
use crate::runtime::interp;
use crate::{Result, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

/// A way to run a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Path {
    /// The reference interpreter in the graph's own dtypes.
    Interp,
    /// Compiled, fused, one thread.
    Fused,
    /// Compiled, every op its own kernel.
    Unfused,
    /// Compiled, fused, on a pool of four threads.
    Threads,
    /// The schedule run by the kernel-IR interpreter instead of machine code.
    KernelInterp,
    /// Compiled to a relocatable object (the code ahead-of-time models hold), stored in
    /// a disk cache and loaded from it.
    Object,
    /// Compiled ahead of time as `smelt compile` does, its `NAME_run` called in this
    /// process: the run-time library runs the model's plan.
    Aot,
}

impl Path {
    /// Every path a forward graph takes.
    pub const ALL: [Path; 7] = [
        Path::Interp,
        Path::Fused,
        Path::Unfused,
        Path::Threads,
        Path::KernelInterp,
        Path::Object,
        Path::Aot,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Path::Interp => "interp",
            Path::Fused => "fused",
            Path::Unfused => "unfused",
            Path::Threads => "threads",
            Path::KernelInterp => "kernel-interp",
            Path::Object => "object",
            Path::Aot => "aot",
        }
    }
}

/// How a case ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Every path agreed with the oracle.
    Pass {
        /// What became of the gradient check.
        grad: Grad,
    },
    /// The case could not be judged (the reason): the oracle itself refused it.
    Skip(String),
    /// A path disagreed with the oracle, or failed where the oracle ran.
    Fail {
        /// The path (`fused`, `grad/unfused`, `autodiff`, ...).
        path: String,
        /// What differed.
        message: String,
    },
}

/// What became of a case's gradient check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grad {
    /// Compiled gradients matched their oracle and the f64 gradient matched finite
    /// differences.
    Checked,
    /// The graph is not smooth at this point (finite differences at two step sizes
    /// disagree, or a value is not finite): the finite-difference comparison is skipped.
    NonSmooth,
    /// No float input, or the gradient pass does not cover an op of the graph.
    None,
}

/// Runs cases; holds the disk-cache folder of the [`Path::Object`] path.
pub struct Checker {
    object_dir: PathBuf,
    /// Whether gradients are checked.
    pub grads: bool,
}

impl Checker {
    /// A checker whose object path caches in `object_dir`.
    pub fn new(object_dir: PathBuf) -> Checker {
        Checker {
            object_dir,
            grads: true,
        }
    }

    fn options(&self, path: Path) -> CompileOptions {
        let base = CompileOptions::default()
            .disk_cache(DiskCache::Off)
            .threads(1);
        match path {
            Path::Interp | Path::Fused | Path::Aot => base,
            Path::Unfused => base.fused(false),
            Path::Threads => base.threads(4),
            Path::KernelInterp => {
                let mut o = base;
                o.cpu.kernels = KernelBackend::Interp;
                o
            }
            Path::Object => base.disk_cache(DiskCache::At(self.object_dir.clone())),
        }
    }

    /// Runs `g` on `path`.
    pub fn run(&self, g: &Graph, path: Path, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        match path {
            Path::Interp => interp::run_positional(g, inputs),
            Path::Aot => {
                let opts = crate::aot::AotOptions {
                    name: Some("fuzz".into()),
                    ..Default::default()
                };
                crate::aot::compile(g, &opts)?.load()?.run(inputs)
            }
            _ => CompiledFn::compile(g, &self.options(path))?.call(inputs),
        }
    }

    /// Checks the case `text` on inputs drawn from `seed`.
    pub fn check(&self, text: &str, seed: u64) -> Verdict {
        let g = match parse_module(text, "case.smelt") {
            Ok(m) => m.entry().clone(),
            Err(e) => return Verdict::Skip(format!("does not parse: {e}")),
        };
        match random_inputs(&g, text, seed) {
            Ok(inputs) => self.check_on(&g, text, &inputs, seed),
            Err(e) => Verdict::Skip(format!("inputs: {e}")),
        }
    }

    /// Checks graph `g` (the entry of `text`) on `inputs`.
    pub fn check_on(&self, g: &Graph, text: &str, inputs: &[Tensor], seed: u64) -> Verdict {
        let expected = match oracle::expect(g, text, inputs, seed) {
            Ok(e) => e,
            Err(e) => return Verdict::Skip(format!("oracle: {e}")),
        };
        for path in Path::ALL {
            if let Some(message) = self.path_differs(g, path, inputs, &expected) {
                return Verdict::Fail {
                    path: path.name().into(),
                    message,
                };
            }
        }
        if !self.grads {
            return Verdict::Pass { grad: Grad::None };
        }
        self.check_grad(g, text, inputs, seed)
    }

    fn path_differs(
        &self,
        g: &Graph,
        path: Path,
        inputs: &[Tensor],
        expected: &[Expected],
    ) -> Option<String> {
        match self.run(g, path, inputs) {
            Ok(got) => differs(expected, &got),
            // what ahead-of-time models do not compile yet (some library ops) they
            // refuse, which is not a wrong answer
            Err(crate::Error::Unsupported(_)) if path == Path::Aot => None,
            Err(e) => Some(format!("fails where the oracle runs: {e}")),
        }
    }

    fn check_grad(&self, g: &Graph, text: &str, inputs: &[Tensor], seed: u64) -> Verdict {
        let Some((gg, wrt)) = gradient_graph(g, &constants(text)) else {
            return Verdict::Pass { grad: Grad::None };
        };
        let mut gtext: String = text
            .lines()
            .filter(|l| l.starts_with("# range"))
            .map(|l| format!("{l}\n"))
            .collect();
        gtext.push_str(&print_module(&Module {
            graphs: vec![gg.clone()],
        }));
        let expected = match oracle::expect(&gg, &gtext, inputs, seed) {
            Ok(e) => e,
            Err(_) => return Verdict::Pass { grad: Grad::None },
        };
        for path in [Path::Fused, Path::Unfused] {
            if let Some(message) = self.path_differs(&gg, path, inputs, &expected) {
                return Verdict::Fail {
                    path: format!("grad/{}", path.name()),
                    message,
                };
            }
        }
        match finite_differences(&gtext, g.outputs().len(), &wrt, inputs, seed) {
            Ok(FdResult::Agrees) => Verdict::Pass {
                grad: Grad::Checked,
            },
            Ok(FdResult::NonSmooth) | Err(_) => Verdict::Pass {
                grad: Grad::NonSmooth,
            },
            Ok(FdResult::Differs(message)) => Verdict::Fail {
                path: "autodiff".into(),
                message,
            },
        }
    }
}

/// The gradient graph of the sum of `g`'s outputs with respect to its float inputs (but
/// the `constants`), and those inputs' positions; `None` when there is no such input or the
/// pass refuses.
fn gradient_graph(g: &Graph, constants: &[String]) -> Option<(Graph, Vec<usize>)> {
    let (wrt, names): (Vec<usize>, Vec<&str>) = g
        .inputs()
        .iter()
        .enumerate()
        .filter(|(_, v)| g.node(**v).ty.dtype.is_float() && !constants.contains(&g.node(**v).name))
        .map(|(i, v)| (i, g.node(*v).name.as_str()))
        .unzip();
    if wrt.is_empty() {
        return None;
    }
    let gg = autodiff(g, &names).ok()?;
    Some((gg, wrt))
}

enum FdResult {
    Agrees,
    NonSmooth,
    Differs(String),
}

/// The f64 gradient graph `gtext` (outputs: the `n_out` forward outputs, then one gradient
/// per input of `wrt`) against central differences of the sum of the forward outputs along
/// a random direction, at two step sizes.
fn finite_differences(
    gtext: &str,
    n_out: usize,
    wrt: &[usize],
    inputs: &[Tensor],
    seed: u64,
) -> Result<FdResult> {
    // literals exact: this checks the gradient pass, not the rounding of its constants
    let m = parse_module(&oracle::to_f64_text(gtext), "grad.smelt")?;
    let g = m.entry();
    let x = oracle::to_f64_inputs(inputs)?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xfd);
    let dirs: Vec<Vec<f64>> = wrt
        .iter()
        .map(|&i| {
            (0..x[i].numel())
                .map(|_| rng.random_range(-1.0..=1.0))
                .collect()
        })
        .collect();
    let out = interp::run_positional(g, &x)?;
    let (mut along, mut scale) = (0.0, 0.0);
    for (grad, d) in out[n_out..].iter().zip(&dirs) {
        for (a, b) in grad.try_to_f64_vec()?.iter().zip(d) {
            along += a * b;
            scale += (a * b).abs();
        }
    }
    let loss = |h: f64| -> Result<f64> {
        let mut xs = x.clone();
        for (&i, d) in wrt.iter().zip(&dirs) {
            let v: Vec<f64> = x[i]
                .try_to_f64_vec()?
                .iter()
                .zip(d)
                .map(|(a, b)| a + h * b)
                .collect();
            xs[i] = Tensor::from_vec(v, x[i].shape())?;
        }
        let outs = interp::run_positional(g, &xs)?;
        let mut s = 0.0;
        for o in &outs[..n_out] {
            if o.dtype().is_float() {
                s += o.try_to_f64_vec()?.iter().sum::<f64>();
            }
        }
        Ok(s)
    };
    let (h, wide, narrow) = (1e-5, 1e-4, 1e-6);
    let (at, up, down) = (loss(0.0)?, loss(h)?, loss(-h)?);
    let (up10, down10) = (loss(wide)?, loss(-wide)?);
    let fine = (up - down) / (2.0 * h);
    let coarse = (up10 - down10) / (2.0 * wide);
    // jumps closer together than both steps (a remainder by a tiny divisor) look smooth at
    // those steps, with the slope of the function they average to: a third, smaller step
    // sees fewer of them
    let finest = (loss(narrow)? - loss(-narrow)?) / (2.0 * narrow);
    let bound = 1e-6 * (1.0 + fine.abs() + scale);
    // the one-sided slopes differ by the second difference over h: O(h) where the graph is
    // smooth (ten times as much at ten times the step), but the same at both steps at a
    // kink on the point itself (an input exactly at a clamp's bound, tied maxima)
    let bend = |h: f64, up: f64, down: f64| ((up - at) - (at - down)).abs() / h;
    let (b1, b10) = (bend(h, up, down), bend(wide, up10, down10));
    let kink = b1 > 1e-9 * (1.0 + scale) && b1 > 0.3 * b10;
    let smooth = [coarse, fine, along, at].iter().all(|v| v.is_finite())
        && finest.is_finite()
        && (coarse - fine).abs() <= bound
        && (finest - fine).abs() <= 10.0 * bound
        && !kink;
    if !smooth {
        return Ok(FdResult::NonSmooth);
    }
    if (along - fine).abs() > 10.0 * bound {
        return Ok(FdResult::Differs(format!(
            "directional derivative {along:e} from the gradient graph, {fine:e} by central differences"
        )));
    }
    Ok(FdResult::Agrees)
}

/// Where `got` differs from `expected`: the first bad element and how many there are.
pub fn differs(expected: &[Expected], got: &[Tensor]) -> Option<String> {
    if got.len() != expected.len() {
        return Some(format!(
            "{} outputs, expected {}",
            got.len(),
            expected.len()
        ));
    }
    for (i, (e, t)) in expected.iter().zip(got).enumerate() {
        if t.dtype() != e.ty.dtype || t.shape() != e.ty.shape.as_slice() {
            return Some(format!(
                "output {i} is {}{:?}, expected {}{:?}",
                t.dtype(),
                t.shape(),
                e.ty.dtype,
                e.ty.shape
            ));
        }
        let v = match t.try_to_f64_vec() {
            Ok(v) => v,
            Err(err) => return Some(format!("output {i} cannot be read: {err}")),
        };
        let bad: Vec<usize> = (0..v.len())
            .filter(|&j| !within(e.value[j], v[j], e.tol[j]))
            .collect();
        if let Some(&j) = bad.first() {
            return Some(format!(
                "output {i}: {} of {} elements differ; element {j} is {:e}, expected {:e} ± {:e}",
                bad.len(),
                v.len(),
                v[j],
                e.value[j],
                e.tol[j]
            ));
        }
    }
    None
}

fn within(expected: f64, got: f64, tol: f64) -> bool {
    if tol.is_infinite() {
        return true;
    }
    if expected.is_nan() {
        return got.is_nan();
    }
    if expected.is_infinite() {
        return got == expected;
    }
    (got - expected).abs() <= tol
}

/// Inputs for `g` drawn from `seed`: floats uniform in [-2, 2] (rounded to their dtype),
/// integers in [-5, 5] or in their `# range`, bools at random.
pub fn random_inputs(g: &Graph, text: &str, seed: u64) -> Result<Vec<Tensor>> {
    let ranges = index_ranges(text);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1a9u64);
    g.inputs()
        .iter()
        .map(|&v| {
            let node = g.node(v);
            let (dt, shape) = (node.ty.dtype, node.ty.shape.as_slice());
            let n: usize = shape.iter().product();
            let range = ranges.iter().find(|r| r.0 == node.name);
            let vals: Vec<f64> = (0..n)
                .map(|_| match (dt, range) {
                    (_, Some(&(_, lo, hi))) => rng.random_range(lo..hi.max(lo + 1)) as f64,
                    (DType::Bool, _) => rng.random_bool(0.5) as u8 as f64,
                    (d, _) if d.is_float() => rng.random_range(-2.0..=2.0),
                    _ => rng.random_range(-5..=5) as f64,
                })
                .collect();
            Tensor::from_vec(vals, shape)?.to_dtype(dt)
        })
        .collect()
}
