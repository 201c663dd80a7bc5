//! A fuzzing campaign: random cases on several threads for a while, failures shrunk and
//! written out, and a summary by family and op.

use super::check::{Checker, Grad, Verdict, random_inputs};
use super::graphs::{Family, random_case};
use super::shrink::shrink;
use crate::ir::text::parse_module;
use crate::runtime::npy;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a campaign does.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long to run.
    pub duration: Duration,
    /// At most this many cases (with `duration`, whichever comes first).
    pub max_cases: Option<u64>,
    /// The campaign's seed: case `i` is drawn from `seed` and `i`, so a campaign replays.
    pub seed: u64,
    /// Worker threads.
    pub jobs: usize,
    /// Where failing cases are written (a folder each).
    pub out: PathBuf,
    /// Most ops in one graph.
    pub max_ops: usize,
    /// Whether gradients are checked.
    pub grads: bool,
    /// Whether a progress bar is drawn.
    pub progress: bool,
}

/// Cases and failures of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Cases judged (passed or failed).
    pub cases: u64,
    /// Cases that failed.
    pub failed: u64,
}

/// What a campaign found.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Cases drawn.
    pub drawn: u64,
    /// Cases judged, by family.
    pub by_family: BTreeMap<&'static str, Tally>,
    /// Cases judged, by op (a case counts once for each op it holds).
    pub by_op: BTreeMap<&'static str, Tally>,
    /// Cases the oracle could not judge, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Gradients checked against finite differences; skipped as not smooth.
    pub grads_checked: u64,
    /// Gradient checks skipped because the graph is not smooth at the point.
    pub grads_nonsmooth: u64,
    /// The folders the failing cases were written to.
    pub failures: Vec<PathBuf>,
}

impl Summary {
    /// Cases judged in all.
    pub fn judged(&self) -> u64 {
        self.by_family.values().map(|t| t.cases).sum()
    }

    /// The summary as a text table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{} cases drawn, {} judged, {} failed; gradients: {} checked, {} not smooth\n\n",
            self.drawn,
            self.judged(),
            self.failures.len(),
            self.grads_checked,
            self.grads_nonsmooth
        );
        s.push_str("family          cases  failed\n");
        for (f, t) in &self.by_family {
            s.push_str(&format!("{f:<14} {:>6}  {:>6}\n", t.cases, t.failed));
        }
        s.push_str("\nop                              cases  failed\n");
        for (o, t) in &self.by_op {
            s.push_str(&format!("{o:<30} {:>7}  {:>6}\n", t.cases, t.failed));
        }
        if !self.skipped.is_empty() {
            s.push_str("\nnot judged (the oracle refused)\n");
            for (why, n) in &self.skipped {
                s.push_str(&format!("{n:>7}  {why}\n"));
            }
        }
        for f in &self.failures {
            s.push_str(&format!("failure: {}\n", f.display()));
        }
        s
    }
}

/// The seed of case `i` of a campaign seeded `seed`.
pub fn case_seed(seed: u64, i: u64) -> u64 {
    // splitmix64 of the pair, so that neighbouring cases share nothing
    let mut z = seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs a campaign.
pub fn run(opts: &Options) -> Result<Summary> {
    let start = Instant::now();
    let next = AtomicU64::new(0);
    let summary = Mutex::new(Summary::default());
    let bar = match opts.progress {
        true => indicatif::ProgressBar::new(opts.duration.as_secs()),
        false => indicatif::ProgressBar::hidden(),
    };
    let scratch = std::env::temp_dir().join(format!("smelt-fuzz-{}", std::process::id()));
    let result = std::thread::scope(|s| {
        let workers: Vec<_> = (0..opts.jobs.max(1))
            .map(|w| {
                let (next, summary, bar, scratch) = (&next, &summary, &bar, &scratch);
                s.spawn(move || worker(opts, w, start, next, summary, bar, scratch))
            })
            .collect();
        workers
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Value("a fuzz worker panicked".into())))
            })
            .collect::<Result<Vec<()>>>()
    });
    bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(&scratch);
    result?;
    Ok(summary.into_inner().unwrap_or_else(|e| e.into_inner()))
}

fn worker(
    opts: &Options,
    w: usize,
    start: Instant,
    next: &AtomicU64,
    summary: &Mutex<Summary>,
    bar: &indicatif::ProgressBar,
    scratch: &Path,
) -> Result<()> {
    let objects = scratch.join(format!("objects-{w}"));
    let mut checker = Checker::new(objects.clone());
    checker.grads = opts.grads;
    loop {
        if start.elapsed() >= opts.duration {
            return Ok(());
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        if opts.max_cases.is_some_and(|m| i >= m) {
            return Ok(());
        }
        let seed = case_seed(opts.seed, i);
        let family = Family::ALL[(i % Family::ALL.len() as u64) as usize];
        let n_ops = 2 + (seed % opts.max_ops.max(2) as u64) as usize;
        let case = random_case(seed, family, n_ops);
        let verdict = judge(&checker, &case.text, seed);
        let written = match &verdict {
            Verdict::Fail { path, message } => Some(write_failure(
                &checker, opts, &case.text, seed, path, message,
            )?),
            _ => None,
        };
        let mut sum = summary.lock().unwrap_or_else(|e| e.into_inner());
        sum.drawn += 1;
        match &verdict {
            Verdict::Skip(why) => {
                // grouped by the message without its numbers (positions, sizes)
                let key: String = why
                    .chars()
                    .map(|c| if c.is_ascii_digit() { '#' } else { c })
                    .take(120)
                    .collect();
                *sum.skipped.entry(key).or_default() += 1;
            }
            Verdict::Pass { .. } | Verdict::Fail { .. } => {
                let failed = matches!(verdict, Verdict::Fail { .. }) as u64;
                let t = sum.by_family.entry(family.name()).or_default();
                t.cases += 1;
                t.failed += failed;
                let mut seen: Vec<&'static str> = case.ops.clone();
                seen.sort_unstable();
                seen.dedup();
                for op in seen {
                    let t = sum.by_op.entry(op).or_default();
                    t.cases += 1;
                    t.failed += failed;
                }
            }
        }
        match verdict {
            Verdict::Pass {
                grad: Grad::Checked,
            } => sum.grads_checked += 1,
            Verdict::Pass {
                grad: Grad::NonSmooth,
            } => sum.grads_nonsmooth += 1,
            _ => {}
        }
        if let Some(dir) = written {
            bar.println(format!("failure written to {}", dir.display()));
            sum.failures.push(dir);
        }
        bar.set_position(start.elapsed().as_secs());
        bar.set_message(format!(
            "{} cases, {} failed",
            sum.drawn,
            sum.failures.len()
        ));
        drop(sum);
        // the object path's cache grows by an entry per graph
        if i % 256 == 255 {
            let _ = std::fs::remove_dir_all(&objects);
        }
    }
}

/// The verdict on `text`, a panic anywhere counted as a failure.
pub fn judge(checker: &Checker, text: &str, seed: u64) -> Verdict {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| checker.check(text, seed)));
    run.unwrap_or_else(|p| Verdict::Fail {
        path: "panic".into(),
        message: p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    })
}

/// Shrinks a failing case and writes it as `OUT/case-SEED/case.smelt` with its inputs
/// (`NAME.npy`); returns the folder.
fn write_failure(
    checker: &Checker,
    opts: &Options,
    text: &str,
    seed: u64,
    path: &str,
    message: &str,
) -> Result<PathBuf> {
    let same = |v: &Verdict| matches!(v, Verdict::Fail { path: p, .. } if p == path);
    let small = shrink(text, &mut |t: &str| same(&judge(checker, t, seed)), 400);
    let message = match judge(checker, &small, seed) {
        Verdict::Fail { message, .. } => message,
        _ => message.to_string(),
    };
    let dir = opts.out.join(format!("case-{seed:016x}"));
    std::fs::create_dir_all(&dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
    let header = format!(
        "# smelt fuzz: seed {seed}, path {path}\n# {}\n",
        message.replace('\n', " ")
    );
    let file = dir.join("case.smelt");
    std::fs::write(&file, format!("{header}{small}"))
        .map_err(|e| Error::Io(format!("{}: {e}", file.display())))?;
    let g = parse_module(&small, "case.smelt")?.entry().clone();
    for (v, t) in g.inputs().iter().zip(random_inputs(&g, &small, seed)?) {
        npy::write_npy(dir.join(format!("{}.npy", g.node(*v).name)), &t)?;
    }
    Ok(dir)
}

/// The seed a case file records (`# smelt fuzz: seed N, ...`).
pub fn recorded_seed(text: &str) -> Option<u64> {
    let rest = text.lines().next()?.strip_prefix("# smelt fuzz: seed ")?;
    rest.split(',').next()?.trim().parse().ok()
}

/// Judges a case folder written by a campaign (`case.smelt` and its inputs) again, on the
/// inputs it holds.
pub fn replay(dir: &Path, checker: &Checker) -> Result<Verdict> {
    let file = dir.join("case.smelt");
    let text = std::fs::read_to_string(&file)
        .map_err(|e| Error::Io(format!("{}: {e}", file.display())))?;
    let Some(seed) = recorded_seed(&text) else {
        return Err(Error::Value(format!(
            "{}: no '# smelt fuzz: seed N' first line",
            file.display()
        )));
    };
    let g = parse_module(&text, &file.display().to_string())?
        .entry()
        .clone();
    // .npy has no bf16: those inputs are stored as f32, which holds them exactly
    let inputs = g
        .inputs()
        .iter()
        .map(|&v| {
            let t = npy::read_npy(dir.join(format!("{}.npy", g.node(v).name)))?;
            match g.node(v).ty.dtype {
                d if d == t.dtype() => Ok(t),
                d => t.to_dtype(d),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(checker.check_on(&g, &text, &inputs, seed))
}
