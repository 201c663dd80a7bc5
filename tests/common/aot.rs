//! Ahead-of-time models driven from C: the generic driver (`tests/aot_driver.c`) linked
//! against a compiled model, for this machine or for another one whose programs run under
//! an emulator; and the repository's `.smelt` models, found by walking its folders.

use smelt::Tensor;
use smelt::aot::AotModel;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How to link and run a driver: the C compiler, the run-time library it links and what
/// runs the program (nothing on this machine, an emulator for another).
pub struct Toolchain {
    /// The C compiler (and linker).
    pub cc: String,
    /// The run-time library built for the target (`libsmelt_rt.a`).
    pub runtime: PathBuf,
    /// The command that runs a program, with its arguments; empty to run it directly.
    pub runner: Vec<String>,
}

impl Toolchain {
    /// This machine's: `cc`, the run-time library the compiler finds, no emulator.
    pub fn host() -> Toolchain {
        Toolchain {
            cc: "cc".into(),
            runtime: smelt::aot::runtime_library().unwrap(),
            runner: Vec::new(),
        }
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `cmd` to success (a failure panics with its stderr, under `what`); its stdout.
pub fn succeed(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes model `m` to `dir` and links the generic driver against it with `tc`; returns the
/// executable.
pub fn link_driver(m: &AotModel, dir: &Path, tc: &Toolchain) -> PathBuf {
    m.write(dir).unwrap();
    let exe = dir.join(format!("{}_driver", m.name));
    let mut cmd = Command::new(&tc.cc);
    cmd.arg("-O1")
        .arg(format!("-DMODEL={}", m.name))
        .arg(format!("-DNIN={}", m.inputs.len()))
        .arg(format!("-DNOUT={}", m.outputs.len()))
        .arg(format!("-DSCRATCH={}", m.scratch_bytes))
        .arg(root().join("tests/aot_driver.c"))
        .arg(dir.join(format!("{}.o", m.name)))
        .args(smelt::aot::link_flags(&tc.runtime).split_whitespace())
        .arg("-o")
        .arg(&exe);
    succeed(&mut cmd, &format!("linking {}", m.name));
    exe
}

/// Runs a linked driver on `inputs` (through `tc`'s runner); returns the outputs and the
/// printed codes, or what the driver printed when the call failed.
pub fn try_run_driver(
    m: &AotModel,
    exe: &Path,
    dir: &Path,
    inputs: &[Tensor],
    tc: &Toolchain,
) -> Result<(Vec<Tensor>, String), String> {
    let mut args = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        let p = dir.join(format!("in{i}.bin"));
        std::fs::write(&p, t.to_bytes().unwrap()).unwrap();
        args.push(p);
    }
    let outs: Vec<PathBuf> = (0..m.outputs.len())
        .map(|i| dir.join(format!("out{i}.bin")))
        .collect();
    args.extend(outs.iter().cloned());
    let mut cmd = match tc.runner.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    let out = cmd.args(&args).output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let tensors = m
        .outputs
        .iter()
        .zip(&outs)
        .map(|(p, f)| Tensor::from_bytes(p.dtype, &p.shape, &std::fs::read(f).unwrap()).unwrap())
        .collect();
    Ok((tensors, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// What the driver prints after a model's good call: the codes of its calls with bad
/// arguments.
pub const BAD_ARGUMENT_CODES: &str = "threads_agree 1\nnull_inputs 1\nnull_outputs 1\nnull_entry 1\nsmall_scratch 2\nmisaligned_scratch 8\nnull_scratch 0\nmessage the scratch buffer is smaller than the model's scratch size\n";

/// Every `.smelt` file of the repository (examples, benches, tests), sorted.
pub fn repository_models() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, found);
            } else if p.extension().is_some_and(|x| x == "smelt") {
                found.push(p);
            }
        }
    }
    let mut files = Vec::new();
    for dir in ["examples", "benches", "tests"] {
        walk(&root().join(dir), &mut files);
    }
    files.sort();
    files
}

/// Whether an AOT compile error is one of the refusals `aot_gaps` lists.
pub fn is_listed_gap(e: &smelt::Error) -> bool {
    let e = e.to_string();
    super::aot_gaps::GAPS
        .iter()
        .filter_map(|(key, _)| key.split(' ').next())
        .any(|op| e.contains(&format!("library op {op} ")))
}
