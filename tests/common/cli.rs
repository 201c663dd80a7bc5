//! Fresh temporary directories and runs of the `smelt` binary.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh, empty directory for one test: `smelt-{test file}-{process}-{name}` under the
/// system's temporary directory (whatever an earlier run left there is removed). It is
/// removed again when the guard drops, so test runs do not fill the disk.
pub fn temp_dir(name: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!(
        "smelt-{}-{}-{name}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

/// A directory that is removed with everything in it when dropped; it derefs to its path.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for TempDir {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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

/// Whether `cc` runs; panics under `SMELT_REQUIRE_CXX=1` when it does not.
pub fn have_cc(test: &str) -> bool {
    let ok = Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var("SMELT_REQUIRE_CXX").as_deref() == Ok("1") {
            panic!("{test}: SMELT_REQUIRE_CXX=1 but no C compiler runs as `cc`");
        }
        eprintln!("{test}: skipped: no C compiler runs as `cc`");
    }
    ok
}
