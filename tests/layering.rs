//! The floors of both crates, as one map: the tables under "## Floors" (smelt, `src/`) and
//! "## Floors of smelt-rt" (`rt/src/`) in docs/architecture.md are the only statement of
//! them. Each top-level module imports only from floors below its own, or from modules of
//! its own floor without a circle. These tests read every `crate::` and `super::` path of
//! both crates and fail, naming the file and line, on any that goes up; on a module missing
//! from its table, or a table row naming a module that does not exist.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The floors of the table under `heading` in docs/architecture.md, lowest first: the
/// back-quoted names of each row's second column.
fn floors_from_doc(heading: &str) -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let start = doc
        .lines()
        .position(|l| l.trim() == heading)
        .unwrap_or_else(|| panic!("docs/architecture.md has no heading {heading:?}"));
    let mut floors = Vec::new();
    for line in doc.lines().skip(start + 1) {
        if line.starts_with("## ") {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // `| floor | modules | what they hold |`: data rows start with the floor's number
        if cells.len() < 4 || cells[1].parse::<usize>().is_err() {
            continue;
        }
        assert_eq!(
            cells[1].parse::<usize>().unwrap(),
            floors.len(),
            "{heading}: floors are numbered 0, 1, 2, ... in order"
        );
        let names: Vec<String> = cells[2]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        assert!(!names.is_empty(), "{heading}: a floor without modules");
        floors.push(names);
    }
    assert!(!floors.is_empty(), "{heading}: no table rows");
    floors
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

/// The module path of a file (`src/exec/cpu/cache.rs` → `exec::cpu::cache`,
/// `src/exec/mod.rs` → `exec`, `src/lib.rs` → the root).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The name that starts `rest` (an identifier).
fn ident(rest: &str) -> String {
    rest.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The first names of the items a path prefix reaches: `NAME` of `NAME::...`, or every name
/// of a `{a, b::c}` group.
fn names_after(rest: &str) -> Vec<String> {
    match rest.strip_prefix('{') {
        Some(group) => {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|item| ident(item.trim()))
                .collect()
        }
        None => vec![ident(rest)],
    }
}

/// The top-level modules a line of the file at module path `at` refers to, through
/// `crate::NAME` and `super::` paths (comments and doc comments skipped).
fn refs(line: &str, at: &[String]) -> Vec<String> {
    let code = line.trim_start();
    if code.starts_with("//") {
        return vec![];
    }
    let code = code.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let preceded = code[..i]
            .chars()
            .last()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        if !preceded && rest.starts_with("crate::") {
            out.extend(names_after(&rest["crate::".len()..]));
            i += "crate::".len();
        } else if !preceded && rest.starts_with("super::") {
            let mut ups = 0;
            let mut r = rest;
            while let Some(next) = r.strip_prefix("super::") {
                ups += 1;
                r = next;
            }
            let base = &at[..at.len().saturating_sub(ups)];
            match base.first() {
                Some(top) => out.push(top.clone()),
                None => out.extend(names_after(r)),
            }
            i += rest.len() - r.len();
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// Checks the crate whose sources are in `src` against `floors`.
fn check_crate(src: &Path, floors: &[Vec<String>], label: &str) {
    let floor_of = |m: &str| floors.iter().position(|f| f.iter().any(|n| n == m));
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(src, f).first().cloned())
        .filter(|m| m != "bin" && m != "main")
        .collect();
    let listed: BTreeSet<String> = floors.iter().flatten().cloned().collect();
    let unlisted: Vec<&String> = modules.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "{label}: modules missing from the floors of docs/architecture.md: {unlisted:?}"
    );
    let stale: Vec<&String> = listed.difference(&modules).collect();
    assert!(
        stale.is_empty(),
        "{label}: docs/architecture.md lists modules that do not exist: {stale:?}"
    );
    let mut ups = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let at = module_path(src, f);
        // the crate root and the binary sit above every floor
        let Some(from) = at.first().filter(|m| *m != "bin" && *m != "main") else {
            continue;
        };
        let fl = floor_of(from).unwrap();
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            for to in refs(line, &at) {
                // items of the crate root (`crate::Result`, `crate::bail!`) are no module
                if &to == from || !modules.contains(&to) {
                    continue;
                }
                let tf = floor_of(&to).unwrap();
                if tf > fl {
                    ups.push(format!(
                        "{}:{}: `{from}` (floor {fl}) uses `{to}` (floor {tf}): {}",
                        f.strip_prefix(src).unwrap().display(),
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
        ups.is_empty(),
        "{label}: imports that go up a floor:\n{}",
        ups.join("\n")
    );
    if let Some(circle) = find_circle(&edges) {
        panic!("{label}: a circle between floor-mates: {circle:?}");
    }
}

/// A circle in `edges`, as the path that closes it.
fn find_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    for start in edges.keys() {
        let mut stack = vec![vec![start.clone()]];
        while let Some(path) = stack.pop() {
            let last = path.last().unwrap();
            for next in edges.get(last).into_iter().flatten() {
                if next == start {
                    let mut p = path.clone();
                    p.push(next.clone());
                    return Some(p);
                }
                if !path.contains(next) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push(p);
                }
            }
        }
    }
    None
}

#[test]
fn no_module_of_smelt_imports_from_a_floor_above_its_own() {
    check_crate(&root().join("src"), &floors_from_doc("## Floors"), "smelt");
}

#[test]
fn no_module_of_smelt_rt_imports_from_a_floor_above_its_own() {
    check_crate(
        &root().join("rt/src"),
        &floors_from_doc("## Floors of smelt-rt"),
        "smelt-rt",
    );
}

#[test]
fn the_reader_resolves_crate_and_super_paths_and_skips_comments() {
    let at = |p: &str| -> Vec<String> { p.split("::").map(str::to_string).collect() };
    assert_eq!(refs("use crate::ir::op::Op;", &at("exec")), ["ir"]);
    assert_eq!(
        refs("use crate::{Result, bail};", &at("exec")),
        ["Result", "bail"]
    );
    assert!(refs("    // crate::jit is mentioned", &at("exec")).is_empty());
    assert_eq!(
        refs(
            "let x = crate::runtime::apply(op); // crate::amp",
            &at("exec")
        ),
        ["runtime"]
    );
    // `super::` from a module's own files stays in the module; from its root file it
    // reaches the crate's modules
    assert_eq!(
        refs("use super::plan::X;", &at("exec::cpu::cache")),
        ["exec"]
    );
    assert_eq!(
        refs("use super::kernels::eval;", &at("runtime")),
        ["kernels"]
    );
    assert_eq!(
        refs("use super::super::{ir, passes::X};", &at("exec::cpu")),
        ["ir", "passes"]
    );
    assert!(refs("let a = my_crate::x;", &at("exec")).is_empty());
}

#[test]
fn a_circle_is_found_and_a_chain_is_not() {
    let edges = |pairs: &[(&str, &str)]| {
        let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            e.entry(a.to_string()).or_default().insert(b.to_string());
        }
        e
    };
    assert!(find_circle(&edges(&[("a", "b"), ("b", "c")])).is_none());
    assert!(find_circle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])).is_some());
}
