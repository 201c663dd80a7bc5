//! The Python the PyTorch comparisons run: `SMELT_TORCH_PYTHON`, else `python3`.

use std::process::Command;

/// A Python with torch and numpy, or `None` after saying why the test skips (always in
/// CI: the comparisons are for developers' machines).
pub fn python_with_torch() -> Option<String> {
    if std::env::var_os("CI").is_some() {
        eprintln!("skipped: the PyTorch comparison never runs in CI");
        return None;
    }
    let python = std::env::var("SMELT_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_torch = Command::new(&python)
        .args(["-c", "import torch, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_torch {
        eprintln!("skipped: {python} has no torch and numpy (set SMELT_TORCH_PYTHON)");
        return None;
    }
    Some(python)
}
