//! The differential fuzzer in CI: every case it ever failed on (`tests/fuzz_regressions/`,
//! one folder each, written by `smelt fuzz`) passes now, and a short campaign of fresh
//! random graphs (ten of each family) passes on every path.

use smelt::fuzz::campaign::{self, Options};
use smelt::fuzz::check::{Checker, Verdict};
use smelt::fuzz::graphs::Family;
use std::path::Path;
use std::time::Duration;

mod common;
use common::cli::temp_dir;

#[test]
fn every_case_the_fuzzer_found_passes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions");
    let scratch = temp_dir("fuzz-regressions");
    let checker = Checker::new(scratch.join("objects"));
    let mut cases = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        cases += 1;
        match campaign::replay(&dir, &checker).unwrap() {
            Verdict::Pass { .. } => {}
            v => panic!("{}: {v:?}", dir.display()),
        }
    }
    assert!(
        cases >= 4,
        "only {cases} regression cases in {}",
        root.display()
    );
}

#[test]
fn a_short_campaign_passes_on_every_path() {
    let scratch = temp_dir("fuzz-campaign");
    // SMELT_FUZZ_SEED replays another campaign; the seed is printed on failure
    let seed = std::env::var("SMELT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261207);
    let summary = campaign::run(&Options {
        duration: Duration::from_secs(600),
        max_cases: Some(50),
        seed,
        jobs: 2,
        out: scratch.join("failures"),
        max_ops: 10,
        grads: true,
        progress: false,
    })
    .unwrap();
    assert!(
        summary.failures.is_empty(),
        "seed {seed}:\n{}",
        summary.table()
    );
    // the oracle judges most cases, and every family is drawn
    assert!(summary.judged() >= 40, "seed {seed}:\n{}", summary.table());
    assert_eq!(
        summary.by_family.len(),
        Family::ALL.len(),
        "{}",
        summary.table()
    );
}
