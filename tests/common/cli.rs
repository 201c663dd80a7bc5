//! Fresh temporary directories and runs of the `smelt` binary.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh, empty directory for one test: `smelt-{test file}-{process}-{name}` under the
/// system's temporary directory (whatever an earlier run left there is removed).
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "smelt-{}-{}-{name}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the `smelt` binary with `args` in `dir`.
pub fn smelt_in<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_smelt"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the smelt binary runs")
}

/// Runs the `smelt` binary with `args` in the package's root directory.
pub fn smelt<S: AsRef<OsStr>>(args: &[S]) -> Output {
    smelt_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

/// What a run printed on standard output.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What a run printed on standard error.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
