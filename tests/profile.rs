//! `smelt profile`: the printed tables and the JSON report, checked against the schedules the
//! library builds for the same model and sizes computed from the model's types.

mod common;

use common::{smelt_in, temp_dir};
use smelt::Tensor;
use smelt::exec::{CompileOptions, CompiledFn, KernelBackend};
use smelt::ir::parse_module;
use smelt::profiler::html::time_text;
use smelt::runtime::npy::write_npy;
use std::path::Path;

fn model(name: &str) -> String {
    format!(
        "{}/examples/models/{name}.smelt",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Kernel backends to profile with: the interpreter always, Cranelift when it is built.
fn kernel_backends(dir: &Path) -> Vec<&'static str> {
    let o = smelt_in(
        dir,
        &[
            "profile",
            &model("relu_scale"),
            "--repeat",
            "1",
            "--kernels",
            "cranelift",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    vec!["interp", "cranelift"]
}

fn steps_of(path: &str, fuse: bool) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    let m = parse_module(&text, path).unwrap();
    let opts = CompileOptions::with_backend(KernelBackend::Interp).fused(fuse);
    CompiledFn::compile(&m.graphs[0], &opts)
        .unwrap()
        .schedule()
        .steps
        .len()
}

fn num(v: &serde_json::Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

fn check_way(j: &serde_json::Value, way: &str, steps: Option<usize>) {
    let w = &j[way];
    let total = num(&w["median_ms"], way);
    assert!(total > 0.0 && total < 60_000.0, "{way}: {total}");
    let ks = w["kernels"].as_array().unwrap();
    if let Some(n) = steps {
        assert_eq!(ks.len(), n, "{way} kernels");
    }
    let mut sum = 0.0;
    for k in ks {
        assert!(!k["name"].as_str().unwrap().is_empty());
        assert!(!k["ops"].as_array().unwrap().is_empty());
        let t = num(&k["median_ms"], "median_ms");
        assert!(t >= 0.0);
        sum += t;
        assert!(num(&k["bytes"], "bytes") >= 0.0);
    }
    // the steps run inside the call: their medians add up to about the call's median
    assert!(
        sum <= total * 3.0 + 1.0,
        "{way}: steps {sum} ms vs call {total} ms"
    );
}

#[test]
fn profile_json_has_every_field_with_sane_values() {
    let d = temp_dir("json");
    for kernels in kernel_backends(&d) {
        for name in ["mlp_block", "softmax", "layer_norm", "attention"] {
            let path = model(name);
            let json = d.join(format!("{name}-{kernels}.json"));
            let o = smelt_in(
                &d,
                &[
                    "profile",
                    &path,
                    "--repeat",
                    "3",
                    "--kernels",
                    kernels,
                    "--json",
                    json.to_str().unwrap(),
                ],
            );
            let out = String::from_utf8_lossy(&o.stdout).to_string();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            for s in ["eager", "unfused", "fused", "summary", "GB/s", "GFLOP/s"] {
                assert!(out.contains(s), "missing {s} in\n{out}");
            }
            let j: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            assert_eq!(j["graph"], name);
            assert!(num(&j["compile_ms"], "compile_ms") > 0.0);
            check_way(&j, "eager", None);
            check_way(&j, "unfused", Some(steps_of(&path, false)));
            check_way(&j, "fused", Some(steps_of(&path, true)));
            let m = parse_module(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
            let g = &m.graphs[0];
            let want: usize = g
                .inputs()
                .iter()
                .chain(g.outputs())
                .map(|&v| {
                    let t = &g.node(v).ty;
                    t.shape.iter().product::<usize>() * t.dtype.size()
                })
                .sum();
            assert_eq!(num(&j["bytes_min"], "bytes_min"), want as f64);
            assert!(num(&j["max_abs_diff"], "max_abs_diff") < 1e-4);
        }
    }
}

#[test]
fn profile_reads_given_inputs_and_reports_errors() {
    let d = temp_dir("inputs");
    let x = Tensor::from_vec(
        (0..128).map(|i| i as f32 - 64.0).collect::<Vec<_>>(),
        &[8, 16],
    )
    .unwrap();
    write_npy(d.join("x.npy"), &x).unwrap();
    let path = model("relu_scale");
    let o = smelt_in(
        &d,
        &[
            "profile",
            &path,
            "--input",
            "x=x.npy",
            "--repeat",
            "2",
            "--kernels",
            "interp",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("max |fused - eager| = 0e0"), "{out}");
    let bad = Tensor::zeros(&[16, 8], smelt::DType::F32);
    write_npy(d.join("bad.npy"), &bad).unwrap();
    let o = smelt_in(
        &d,
        &[
            "profile",
            &path,
            "--input",
            "x=bad.npy",
            "--kernels",
            "interp",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("expected f32[8,16] but got f32[16,8]"),
        "{err}"
    );
    let o = smelt_in(
        &d,
        &[
            "profile",
            &path,
            "--input",
            "y=x.npy",
            "--kernels",
            "interp",
        ],
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("no input named 'y'"));
    let o = smelt_in(
        &d,
        &["profile", &path, "--repeat", "0", "--kernels", "interp"],
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("--repeat must be at least 1"));
}

#[test]
fn run_without_a_gpu_refuses_cuda_and_compiles_by_default() {
    let d = temp_dir("run");
    let x = Tensor::from_vec(
        (0..128).map(|i| i as f32 - 64.0).collect::<Vec<_>>(),
        &[8, 16],
    )
    .unwrap();
    write_npy(d.join("x.npy"), &x).unwrap();
    let path = model("relu_scale");
    let o = smelt_in(
        &d,
        &[
            "run",
            &path,
            "--input",
            "x=x.npy",
            "--out",
            "o",
            "--backend",
            "cuda",
        ],
    );
    if !smelt::runtime::cuda::is_available() {
        assert_eq!(o.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&o.stderr).contains("CUDA driver"));
    }
    for extra in [&[][..], &["--no-fuse"][..]] {
        let mut args = vec!["run", &path, "--input", "x=x.npy", "--out", "o"];
        args.extend_from_slice(extra);
        let o = smelt_in(&d, &args);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{err}");
        let y = smelt::runtime::npy::read_npy(d.join("o/out0.npy")).unwrap();
        let want: Vec<f32> = (0..128).map(|i| (i as f32 - 64.0).max(0.0) * 0.5).collect();
        assert_eq!(y.to_vec::<f32>().unwrap(), want);
    }
}

/// Profiles `text` (one graph, no inputs given) and returns its stdout and JSON report.
fn profile_text(d: &Path, name: &str, text: &str) -> (String, serde_json::Value) {
    let path = d.join(format!("{name}.smelt"));
    std::fs::write(&path, text).unwrap();
    let json = d.join(format!("{name}.json"));
    let args = ["profile", path.to_str().unwrap(), "--repeat", "1", "--json"];
    let o = smelt_in(d, &[&args[..], &[json.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (String::from_utf8_lossy(&o.stdout).to_string(), j)
}

#[test]
fn minimum_traffic_counts_only_the_memory_behind_view_outputs() {
    let d = temp_dir("views");
    // %z is a 4 GB view of 1000 computed floats (the comparison of the ways' outputs reads
    // one element along dims both broadcast, so it costs no memory); %t shares the memory of
    // the input %w; %y is returned twice but written once
    let text = "graph views(%x: f32[1,1000], %w: f32[3,4]) {
  %y = exp(%x)
  %z: f32[1000000,1000] = expand(%y, size=[1000000,1000])
  %t: f32[4,3] = transpose(%w, dim0=0, dim1=1)
  %n: f32[2,1000] = narrow(%z, dim=0, start=5, length=2)
  return %z, %t, %y, %y, %n
}
";
    let (_, j) = profile_text(&d, "views", text);
    // inputs 4000 + 48 bytes; %z 4000 (the floats behind it); %t nothing; %y 4000 once;
    // %n 4000 (a narrow of the same 1000 floats, no more than its chain's smallest value)
    assert_eq!(num(&j["bytes_min"], "bytes_min"), 16048.0);
}

#[test]
fn a_fully_folded_graph_says_that_it_has_no_kernels() {
    let d = temp_dir("folded");
    let text = "graph folded() {
  %a: f32[3] = full(size=[3], fill_value=2.0)
  %b = mul(%a, 3.0)
  return %b
}
";
    let (out, j) = profile_text(&d, "folded", text);
    assert!(out.contains("no fused kernels: constant folding"), "{out}");
    assert_eq!(j["fused"]["kernels"].as_array().map(Vec::len), Some(0));
    assert_eq!(num(&j["bytes_min"], "bytes_min"), 12.0);
    // a graph with kernels says nothing of the kind
    let (out, _) = profile_text(
        &d,
        "relu",
        "graph relu(%x: f32[4]) {\n  %y = relu(%x)\n  return %y\n}\n",
    );
    assert!(!out.contains("no fused kernels"), "{out}");
}

/// The Chrome trace's complete events of the process named `label`.
fn process_events<'a>(trace: &'a serde_json::Value, label: &str) -> Vec<&'a serde_json::Value> {
    let evs = trace["traceEvents"].as_array().unwrap();
    let pid = evs
        .iter()
        .find(|e| e["name"] == "process_name" && e["args"]["name"].as_str() == Some(label))
        .unwrap_or_else(|| panic!("no process {label}"))["pid"]
        .clone();
    evs.iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == pid)
        .collect()
}

#[test]
fn trace_and_html_report_hold_what_ran() {
    let dir = temp_dir("profile-report");
    let (json, trace, html) = (
        dir.join("p.json"),
        dir.join("trace.json"),
        dir.join("report.html"),
    );
    let path = model("attention");
    let o = smelt_in(
        &dir,
        &[
            "profile",
            &path,
            "--repeat",
            "2",
            "--json",
            json.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).expect("valid JSON");
    let (fused_steps, unfused_steps) = (steps_of(&path, true), steps_of(&path, false));

    // the compiled ways: one call each, its steps nested inside it in order
    for (label, way, steps) in [
        ("fused", "fused", fused_steps),
        ("unfused (one kernel per op)", "unfused", unfused_steps),
    ] {
        let evs = process_events(&t, label);
        let calls: Vec<_> = evs.iter().filter(|e| e["cat"] == "call").collect();
        assert_eq!(calls.len(), 1, "{label}");
        let (c0, c1) = (
            num(&calls[0]["ts"], "ts"),
            num(&calls[0]["ts"], "ts") + num(&calls[0]["dur"], "dur"),
        );
        let kernels: Vec<_> = evs
            .iter()
            .filter(|e| e["cat"] == "kernel" || e["cat"] == "extern")
            .collect();
        assert_eq!(kernels.len(), steps, "{label}");
        let names: Vec<&str> = j[way]["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["name"].as_str().unwrap())
            .collect();
        for (k, name) in kernels.iter().zip(&names) {
            assert_eq!(k["name"].as_str(), Some(*name));
            let (s, e) = (
                num(&k["ts"], "ts"),
                num(&k["ts"], "ts") + num(&k["dur"], "dur"),
            );
            assert!(c0 <= s && e <= c1 + 1e-3, "{label}: {k} outside its call");
        }
    }
    // the eager way: one op event per eager step
    let eager = process_events(&t, "eager (reference kernels)");
    let eager_steps = j["eager"]["kernels"].as_array().unwrap().len();
    assert_eq!(
        eager.iter().filter(|e| e["cat"] == "op").count(),
        eager_steps
    );

    // the report: every fused kernel with the unfused ones it replaced, all accounted for
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
    assert!(!page.contains("<script") && !page.contains("http"));
    let mut replaced = 0;
    for k in j["fused"]["kernels"].as_array().unwrap() {
        let name = k["name"].as_str().unwrap();
        let at = page
            .find(&format!("<td class=l>{name} (replaces "))
            .unwrap_or_else(|| panic!("no row for {name}"));
        let n: usize = page[at..]
            .split("(replaces ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        replaced += n;
    }
    assert_eq!(
        replaced, unfused_steps,
        "every unfused kernel is under one fused kernel"
    );
    let fused_ms = time_text(num(&j["fused"]["median_ms"], "fused"));
    let unfused_ms = time_text(num(&j["unfused"]["median_ms"], "unfused"));
    let steps = format!("{unfused_steps} → {fused_steps}");
    for must in [
        fused_ms.as_str(),
        unfused_ms.as_str(),
        steps.as_str(),
        "copy bandwidth",
        "Memory plan over the fused steps",
        "Compile time by pass",
        "decompose",
        "memplan",
        "codegen",
        "<svg",
    ] {
        assert!(page.contains(must), "the report lacks {must}");
    }
}

#[test]
fn the_report_of_a_200_step_model_lists_every_step() {
    let dir = temp_dir("profile-report-large");
    let mut text = String::from("graph deep(%x: f32[4, 8]");
    for i in 0..100 {
        text += &format!(", %w{i}: f32[8, 8]");
    }
    text += ") {\n";
    let mut prev = "x".to_string();
    for i in 0..100 {
        text += &format!("  %h{i} = linear(%{prev}, %w{i})\n  %a{i} = tanh(%h{i})\n");
        prev = format!("a{i}");
    }
    text += &format!("  return %{prev}\n}}\n");
    let path = dir.join("deep.smelt");
    std::fs::write(&path, &text).unwrap();
    let html = dir.join("deep.html");
    let o = smelt_in(
        &dir,
        &[
            "profile",
            path.to_str().unwrap(),
            "--repeat",
            "1",
            "--html",
            html.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(steps_of(path.to_str().unwrap(), true), 200);
    assert_eq!(page.matches("<tr class=group>").count(), 200);
    let unfused = steps_of(path.to_str().unwrap(), false);
    assert!(page.contains(&format!("{unfused} → 200")));
    // long tables scroll inside the page instead of stretching it
    assert!(page.contains("<div class=scroll>"));
}

#[test]
fn smelt_cpu_caps_the_strip_helpers_without_changing_results() {
    let d = temp_dir("isa");
    let text = "graph g(%x: f32[64,256]) {\n  %y = gelu(%x, approximate=\"tanh\")\n  %s = sum(%y, dim=1)\n  return %s\n}\n";
    let path = d.join("g.smelt");
    std::fs::write(&path, text).unwrap();
    let run = |cap: Option<&str>| {
        let json = d.join(format!("{}.json", cap.unwrap_or("native")));
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_smelt"));
        c.args(["profile", path.to_str().unwrap(), "--repeat", "1", "--json"])
            .arg(&json)
            .current_dir(&d);
        if let Some(cap) = cap {
            c.env("SMELT_CPU", cap);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        j
    };
    let native = run(None);
    let base = run(Some("baseline"));
    assert_eq!(base["strip_isa"], "none");
    let avx2 = run(Some("avx2"));
    assert_ne!(avx2["strip_isa"], "avx512");
    assert!(["avx512", "avx2+fma", "none"].contains(&native["strip_isa"].as_str().unwrap()));
    // every way still agrees with the eager kernels within the profile's own check
    for j in [&native, &base, &avx2] {
        assert!(num(&j["max_abs_diff"], "max_abs_diff") < 1e-3, "{j}");
    }
    // and the levels agree with each other, on the same inputs, closely
    let x: Vec<f32> = (0..64 * 256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
        .collect();
    let x = smelt::Tensor::from_vec(x, &[64, 256]).unwrap();
    smelt::runtime::npy::write_npy(d.join("x.npy"), &x).unwrap();
    let outputs = |cap: &str| {
        let out = d.join(format!("out-{cap}"));
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_smelt"));
        c.args(["run", path.to_str().unwrap(), "--input", "x=x.npy", "--out"])
            .arg(&out)
            .current_dir(&d);
        if cap != "native" {
            c.env("SMELT_CPU", cap);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        smelt::runtime::npy::read_npy(out.join("out0.npy")).unwrap()
    };
    let reference = outputs("baseline");
    for cap in ["native", "avx2"] {
        let got = outputs(cap);
        common::assert_close(&got, &reference, common::Tol::rel(1e-5), cap);
    }
}
