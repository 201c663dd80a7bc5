//! The ONNX backend node tests: every case of the `onnx` package's conformance suite whose
//! inputs and outputs are plain tensors runs through `smelt run` on the interpreter and on
//! the fused CPU path, compared with the suite's expected outputs at its own tolerances.
//!
//! `scripts/onnx_node_cases.py DIR` writes the cases; `.ci/run` does so and sets
//! `SMELT_ONNX_CASES=DIR`. Without that variable (and without `target/onnx-node-cases`) the
//! test says so and checks nothing else.
//!
//! `tests/onnx_node_expected_failures.txt` lists the cases that fail today, each with its
//! reason. It is checked both ways: a failure not on the list fails the test, and so does a
//! listed case that passes (take it off the list), so the list only shrinks.
//! `SMELT_ONNX_BLESS=1` rewrites the list from the failures of the run;
//! `SMELT_ONNX_FILTER=TEXT` runs only the cases whose names contain TEXT, prints each
//! result, and checks no list.

use smelt::cli::{Backend, RunArgs, run};
use smelt::runtime::npy;
use smelt::{DType, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const EXPECTED: &str = "tests/onnx_node_expected_failures.txt";

struct Case {
    name: String,
    rtol: f64,
    atol: f64,
    ops: String,
}

fn cases_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("SMELT_ONNX_CASES") {
        let d = PathBuf::from(d);
        assert!(
            d.join("cases.tsv").is_file(),
            "SMELT_ONNX_CASES={} holds no cases.tsv",
            d.display()
        );
        return Some(d);
    }
    let d = PathBuf::from("target/onnx-node-cases");
    d.join("cases.tsv").is_file().then_some(d)
}

fn read_cases(dir: &Path) -> Vec<Case> {
    let text = std::fs::read_to_string(dir.join("cases.tsv")).expect("cases.tsv");
    text.lines()
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            // only cases whose inputs and outputs are plain tensors
            (f[3] == "1").then(|| Case {
                name: f[0].to_string(),
                rtol: f[1].parse().expect("rtol"),
                atol: f[2].parse().expect("atol"),
                ops: f.get(4).copied().unwrap_or("").to_string(),
            })
        })
        .collect()
}

fn numbered(dir: &Path, kind: &str) -> Vec<PathBuf> {
    (0..)
        .map(|k| dir.join(format!("{kind}_{k}.pb")))
        .take_while(|p| p.is_file())
        .collect()
}

/// Runs one case on one backend; `Err` says what went wrong.
fn run_case(dir: &Path, case: &Case, backend: Backend, work: &Path) -> Result<(), String> {
    let folder = dir.join(&case.name);
    let model = folder.join("model.onnx");
    let names: Vec<String> = smelt::onnx::load(&model)
        .and_then(|m| m.inputs())
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|i| i.name)
        .collect();
    let out = work.join(format!("{}-{backend:?}", case.name));
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    let mut inputs = Vec::new();
    for (k, (pb, name)) in numbered(&folder, "input").iter().zip(&names).enumerate() {
        let t = smelt::onnx::read_tensor(pb).map_err(|e| e.to_string())?;
        let file = out.join(format!("in{k}.npy"));
        npy::write_npy(&file, &t).map_err(|e| e.to_string())?;
        inputs.push((name.clone(), file));
    }
    let args = RunArgs {
        model,
        inputs,
        out: out.clone(),
        backend,
        no_fuse: false,
        graph: None,
        weights: None,
        repeat: 0,
    };
    run(&args).map_err(|e| e.to_string())?;
    for (k, pb) in numbered(&folder, "output").iter().enumerate() {
        let want = smelt::onnx::read_tensor(pb).map_err(|e| e.to_string())?;
        let got = npy::read_npy(out.join(format!("out{k}.npy"))).map_err(|e| e.to_string())?;
        compare(&got, &want, case.rtol, case.atol).map_err(|e| format!("output {k}: {e}"))?;
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// `numpy.testing.assert_allclose(got, want, rtol, atol)`, with equal dtypes and shapes.
fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    // .npy has no bf16: smelt writes it as f32
    let bf16_as_f32 = want.dtype() == DType::BF16 && got.dtype() == DType::F32;
    if got.dtype() != want.dtype() && !bf16_as_f32 {
        return Err(format!("dtype {} instead of {}", got.dtype(), want.dtype()));
    }
    if got.shape() != want.shape() {
        return Err(format!(
            "shape {:?} instead of {:?}",
            got.shape(),
            want.shape()
        ));
    }
    let g = got.to_dtype(DType::F64).and_then(|t| t.to_vec::<f64>());
    let w = want.to_dtype(DType::F64).and_then(|t| t.to_vec::<f64>());
    let (g, w) = (g.map_err(|e| e.to_string())?, w.map_err(|e| e.to_string())?);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let same = a == b || a.is_nan() && b.is_nan();
        // a NaN difference is no match either
        let within = (a - b).abs() <= atol + rtol * b.abs();
        if !same && !within {
            return Err(format!("element {i}: {a} instead of {b}"));
        }
    }
    Ok(())
}

fn read_expected() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(EXPECTED).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once('\t') {
            Some((n, r)) => (n.to_string(), r.to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

/// The first line of an error, short enough for the list.
fn reason(e: &str) -> String {
    let line = e.lines().next().unwrap_or("").replace('\t', " ");
    line.chars().take(200).collect()
}

#[test]
fn onnx_backend_node_tests() {
    let Some(dir) = cases_dir() else {
        eprintln!(
            "the ONNX node tests are not written: run `python scripts/onnx_node_cases.py \
             target/onnx-node-cases` (needs `pip install onnx`)"
        );
        return;
    };
    let mut cases = read_cases(&dir);
    assert!(
        cases.len() > 1000,
        "only {} cases in {}",
        cases.len(),
        dir.display()
    );
    let filter = std::env::var("SMELT_ONNX_FILTER").ok();
    if let Some(f) = &filter {
        cases.retain(|c| c.name.contains(f.as_str()));
    }
    let work = std::env::temp_dir().join(format!("smelt-onnx-node-{}", std::process::id()));
    let mut failures: BTreeMap<String, String> = BTreeMap::new();
    let mut per_op: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let (mut interp_ok, mut cpu_ok) = (0, 0);
    // the cases on every core (each runs one at a time, on one thread): half the wall time
    // on two
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let results: Vec<_> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|k| {
                let (dir, work, cases) = (&dir, &work, &cases);
                s.spawn(move || {
                    cases
                        .iter()
                        .enumerate()
                        .filter(|(n, _)| n % threads == k)
                        .map(|(n, case)| {
                            let i = run_case(dir, case, Backend::Interp, work);
                            (n, i, run_case(dir, case, Backend::Cpu, work))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("a worker panicked"))
            .collect();
        all.sort_by_key(|r| r.0);
        all
    });
    for (case, (_, i, c)) in cases.iter().zip(results) {
        interp_ok += i.is_ok() as usize;
        cpu_ok += c.is_ok() as usize;
        // the reasons name no folder of this machine
        let here = dir
            .join(&case.name)
            .join("model.onnx")
            .display()
            .to_string();
        let why = |e: &str| reason(&e.replace(&format!("{here}: "), ""));
        let result = match (i, c) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(e), _) => Err(format!("interp: {}", why(&e))),
            (Ok(()), Err(e)) => Err(format!("cpu: {}", why(&e))),
        };
        for op in case.ops.split(',').filter(|o| !o.is_empty()) {
            let e = per_op.entry(op.to_string()).or_default();
            e.0 += 1;
            e.1 += result.is_ok() as usize;
        }
        if filter.is_some() {
            eprintln!(
                "{}: {}",
                case.name,
                result.as_ref().err().map_or("ok", |e| e.as_str())
            );
        }
        if let Err(e) = result {
            failures.insert(case.name.clone(), e);
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    let n = cases.len();
    let pct = |k: usize| 100.0 * k as f64 / n as f64;
    eprintln!(
        "ONNX node tests: {n} cases with plain tensors; interpreter {interp_ok} ({:.1}%), \
         fused CPU {cpu_ok} ({:.1}%), both {} ({:.1}%)",
        pct(interp_ok),
        pct(cpu_ok),
        n - failures.len(),
        pct(n - failures.len())
    );
    let mut report = String::from("| op | cases | passing |\n|---|---|---|\n");
    for (op, (total, ok)) in &per_op {
        report.push_str(&format!("| {op} | {total} | {ok} |\n"));
    }
    if filter.is_some() {
        return;
    }
    let _ = std::fs::write("target/onnx-node-report.md", report);

    if std::env::var("SMELT_ONNX_BLESS").is_ok_and(|v| v == "1") {
        let mut text = String::from(
            "# ONNX backend node tests that fail today: case<TAB>reason.\n\
             # tests/onnx_node.rs fails when a case here passes or a case not here fails.\n",
        );
        for (name, why) in &failures {
            text.push_str(&format!("{name}\t{why}\n"));
        }
        std::fs::write(EXPECTED, text).expect("write the expected failures");
        return;
    }
    let expected = read_expected();
    let known: std::collections::HashSet<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    let new: Vec<String> = failures
        .iter()
        .filter(|(n, _)| !expected.contains_key(*n))
        .map(|(n, e)| format!("  {n}: {e}"))
        .collect();
    let fixed: Vec<&String> = expected
        .keys()
        .filter(|n| known.contains(n.as_str()) && !failures.contains_key(*n))
        .collect();
    assert!(
        new.is_empty() && fixed.is_empty(),
        "{} case(s) fail that are not in {EXPECTED}:\n{}\n{} listed case(s) pass now; take them off \
         the list: {fixed:?}",
        new.len(),
        new.join("\n"),
        fixed.len()
    );
}
