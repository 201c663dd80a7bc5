//! `smelt fuzz`: the differential fuzzer ([`crate::fuzz`]) for a while, its summary by
//! family and op, and each failing case shrunk and written to a folder of its own.

use crate::fuzz::campaign::{self, Options};
use crate::fuzz::check::{Checker, Verdict};
use crate::{Error, Result};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `smelt fuzz`.
#[derive(clap::Args, Debug)]
pub struct FuzzArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Stop after this many cases (or at --seconds, whichever comes first).
    #[arg(long)]
    pub cases: Option<u64>,
    /// The campaign's seed (default: drawn from the clock and printed): the same seed
    /// draws the same cases.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Where failing cases are written, a folder each (case.smelt and NAME.npy inputs).
    #[arg(long, value_name = "DIR", default_value = "fuzz-failures")]
    pub out: PathBuf,
    /// Most ops in one graph.
    #[arg(long, default_value_t = 12)]
    pub max_ops: usize,
    /// Skip the gradient checks.
    #[arg(long)]
    pub no_grad: bool,
    /// Judge the case folders given (as written to --out) again instead of drawing cases.
    #[arg(long, value_name = "CASE_DIR", num_args = 1..)]
    pub replay: Vec<PathBuf>,
}

/// Runs `smelt fuzz`: fails when a case failed.
pub fn fuzz(a: &FuzzArgs) -> Result<()> {
    if !(a.seconds.is_finite() && a.seconds > 0.0) {
        return Err(Error::Value(format!(
            "--seconds must be positive, got {}",
            a.seconds
        )));
    }
    if !a.replay.is_empty() {
        return replay(a);
    }
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    eprintln!("smelt fuzz: seed {seed}, {jobs} jobs, {} s", a.seconds);
    let summary = campaign::run(&Options {
        duration: Duration::from_secs_f64(a.seconds),
        max_cases: a.cases,
        seed,
        jobs,
        out: a.out.clone(),
        max_ops: a.max_ops,
        grads: !a.no_grad,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
    })?;
    print!("{}", summary.table());
    match summary.failures.len() {
        0 => Ok(()),
        n => Err(Error::Value(format!(
            "{n} failing case(s) written to {} (seed {seed})",
            a.out.display()
        ))),
    }
}

fn replay(a: &FuzzArgs) -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("smelt-fuzz-{}", std::process::id()));
    let mut checker = Checker::new(scratch.join("objects"));
    checker.grads = !a.no_grad;
    let mut failed = 0;
    for dir in &a.replay {
        let verdict = campaign::replay(dir, &checker);
        let line = match &verdict {
            Ok(Verdict::Pass { grad }) => format!("passes (gradient: {grad:?})"),
            Ok(Verdict::Skip(why)) => format!("not judged: {why}"),
            Ok(Verdict::Fail { path, message }) => format!("FAILS on {path}: {message}"),
            Err(e) => format!("cannot be replayed: {e}"),
        };
        failed += !matches!(verdict, Ok(Verdict::Pass { .. })) as usize;
        println!("{}: {line}", dir.display());
    }
    let _ = std::fs::remove_dir_all(&scratch);
    match failed {
        0 => Ok(()),
        n => Err(Error::Value(format!(
            "{n} of {} cases do not pass",
            a.replay.len()
        ))),
    }
}
