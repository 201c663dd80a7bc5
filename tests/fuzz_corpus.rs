//! Replays the fuzz corpora (`fuzz/corpus/<target>/`, the inputs coverage-guided fuzzing
//! kept) and every input that once crashed a reader (`fuzz/regressions/<target>/`) through
//! the same entry points the fuzz targets call (`smelt::fuzz`), on the stable toolchain and
//! without libFuzzer. A panic here is a reader bug. See docs/fuzzing.md.

use std::path::{Path, PathBuf};
use std::sync::Once;

/// The fuzzer ran under `SMELT_MAX_ALLOC_BYTES=1 GiB` (`fuzz/run.sh`), so the corpus keeps
/// inputs that ask for more and are refused; without the same limit they would be given
/// the default one, most of the machine's memory.
fn fuzzing_limit() {
    static SET: Once = Once::new();
    // SAFETY: every test of this file calls this first, before any code of theirs reads the
    // environment, and `Once` makes the others wait until the one write is done.
    SET.call_once(|| unsafe { std::env::set_var("SMELT_MAX_ALLOC_BYTES", "1073741824") });
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable corpus folder").path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

/// Runs every input of every target under `folder`; the count of inputs run.
fn replay(folder: &str) -> usize {
    fuzzing_limit();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(folder);
    let mut n = 0;
    for (target, run) in smelt::fuzz::TARGETS {
        for f in files(&root.join(target)) {
            let data = std::fs::read(&f).expect("a readable corpus file");
            let result = std::panic::catch_unwind(|| run(&data));
            assert!(result.is_ok(), "{target}: {} panics", f.display());
            n += 1;
        }
    }
    n
}

/// The folders hold every target's inputs (none is left out by a renamed target).
fn check_folders(folder: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(folder);
    let stray = files(&root);
    assert!(
        stray.is_empty(),
        "files where target folders belong: {stray:?}"
    );
    for e in std::fs::read_dir(&root).expect("the folder exists") {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            smelt::fuzz::TARGETS.iter().any(|(t, _)| *t == name),
            "fuzz/{folder}/{name} is no fuzz target's"
        );
    }
}

#[test]
fn the_crashes_found_by_fuzzing_stay_fixed() {
    check_folders("regressions");
    assert!(replay("regressions") > 0, "no regression inputs found");
}

#[test]
fn the_fuzz_corpora_replay_cleanly() {
    check_folders("corpus");
    let n = replay("corpus");
    // every target has a corpus
    for (target, _) in smelt::fuzz::TARGETS {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        assert!(
            !files(&root.join(target)).is_empty(),
            "fuzz/corpus/{target} is empty"
        );
    }
    assert!(n > 0);
}
