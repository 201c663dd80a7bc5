//! The floors of `src/` (docs/architecture.md): each top-level module imports only from
//! floors below its own, or from modules of its own floor without a circle. This test reads
//! every `crate::` path in `src/` and fails, naming the file and line, on any that goes up.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, lowest first; modules on one floor may use each other if they form no circle.
const FLOORS: &[&[&str]] = &[
    // what every floor may use: the error type
    &["error"],
    // `profiler` records what the floors above run; it needs nothing but the error type
    &["ir", "profiler"],
    // `macros` holds `tensor!`, which builds runtime tensors
    &["runtime", "macros"],
    &["kernel"],
    &["passes"],
    &["codegen_cpu", "codegen_cuda"],
    &["exec"],
    &["autograd", "jit", "amp", "aot", "distributed"],
    &["nn", "optim", "train", "data"],
    &["cli"],
    // re-exports of every floor for `use smelt::prelude::*`
    &["prelude"],
];

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/ir/op.rs` → `ir`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// Every `crate::NAME` in a line of code (comments and doc comments skipped), and `NAME`s of
/// a `use crate::{a, b::c}` group.
fn crate_refs(line: &str) -> Vec<String> {
    let code = line.trim_start();
    if code.starts_with("//") {
        return vec![];
    }
    let code = code.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(name);
            }
        } else {
            out.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    out
}

#[test]
fn no_module_imports_from_a_floor_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut ups = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut unknown = BTreeSet::new();
    for f in &files {
        let from = module_of(&src, f);
        // the crate root and the binary sit above every floor
        if from == "lib" || from == "bin" {
            continue;
        }
        let Some(fl) = floor_of(&from) else {
            unknown.insert(from);
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            for to in crate_refs(line) {
                // items of the crate root (`crate::Result`, `crate::bail!`) are no module
                if to == from || !modules.contains(&to) || to == "lib" {
                    continue;
                }
                let Some(tf) = floor_of(&to) else {
                    unknown.insert(to.clone());
                    continue;
                };
                if tf > fl {
                    ups.push(format!(
                        "{}:{}: `{from}` (floor {fl}) uses `{to}` (floor {tf}): {}",
                        f.strip_prefix(&src).unwrap().display(),
                        n + 1,
                        line.trim()
                    ));
                }
                if tf == fl {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "modules missing from FLOORS (and docs/architecture.md): {unknown:?}"
    );
    assert!(
        ups.is_empty(),
        "imports that go up a floor:\n{}",
        ups.join("\n")
    );
    // modules sharing a floor: no circle among them
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        while let Some((m, path)) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                assert!(
                    next != start,
                    "a circle between floor-mates: {path:?} -> {next}"
                );
                if !path.contains(next) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
}

#[test]
fn the_reader_sees_groups_and_skips_comments() {
    assert_eq!(crate_refs("use crate::ir::op::Op;"), ["ir"]);
    assert_eq!(crate_refs("use crate::{Result, bail};"), ["Result", "bail"]);
    assert_eq!(
        crate_refs("    // crate::jit is mentioned"),
        Vec::<String>::new()
    );
    assert_eq!(
        crate_refs("let x = crate::runtime::apply(op); // crate::amp"),
        ["runtime"]
    );
}
