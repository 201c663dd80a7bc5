//! The `smelt` binary: outputs of `run`, `check` and `dot`, and every error path with its
//! exit status (1 for errors, 2 for usage errors).

mod common;

use common::{smelt_in, stderr, stdout, temp_dir};
use smelt::Tensor;
use smelt::runtime::npy::{read_npy, write_npy};
use std::path::Path;
use std::process::Output;

/// Asserts exit status 1 and an `error: ` line on stderr that contains every needle.
fn assert_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(err.starts_with("error: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "{err:?} should mention {n:?}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

fn assert_usage_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
}

/// A model with two graphs: `mm` returns x @ w, its row sums and x itself.
const MODEL: &str = "\
graph mm(%x: f32[2,3], %w: f32[3,2]) {
  %y: f32[2,2] = matmul(%x, %w)
  %s: f32[2] = sum(%y, dim=[1])
  return %s, %y, %x
}

graph sm(%x: f32[2,3]) {
  %p = softmax(%x, dim=0)
  return %p
}
";

const X: [f32; 6] = [1.0, 2.0, 3.0, -1.0, 0.5, 4.0];
const W: [f32; 6] = [1.0, 0.0, 0.0, 1.0, 2.0, -1.0];

/// Writes the model and inputs x (f32[2,3]) and w (f32[3,2]) into `dir`.
fn setup(dir: &Path) {
    std::fs::write(dir.join("model.smelt"), MODEL).unwrap();
    let x = Tensor::from_vec(X.to_vec(), &[2, 3]).unwrap();
    let w = Tensor::from_vec(W.to_vec(), &[3, 2]).unwrap();
    write_npy(dir.join("x.npy"), &x).unwrap();
    write_npy(dir.join("w.npy"), &w).unwrap();
}

fn matmul_ref() -> Vec<f32> {
    let mut y = vec![0.0f32; 4];
    for i in 0..2 {
        for j in 0..2 {
            y[i * 2 + j] = (0..3).map(|k| X[i * 3 + k] * W[k * 2 + j]).sum();
        }
    }
    y
}

#[test]
fn run_writes_every_output_in_return_order() {
    let d = temp_dir("outputs");
    setup(&d);
    let o = smelt_in(
        &d,
        &[
            "run",
            "model.smelt",
            "--input",
            "x=x.npy",
            "--input",
            "w=w.npy",
            "--out",
            "res/deep",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let y = matmul_ref();
    let out0 = read_npy(d.join("res/deep/out0.npy")).unwrap();
    assert_eq!(out0.shape(), &[2]);
    assert_eq!(
        out0.to_vec::<f32>().unwrap(),
        vec![y[0] + y[1], y[2] + y[3]]
    );
    let out1 = read_npy(d.join("res/deep/out1.npy")).unwrap();
    assert_eq!(out1.shape(), &[2, 2]);
    assert_eq!(out1.to_vec::<f32>().unwrap(), y);
    let out2 = read_npy(d.join("res/deep/out2.npy")).unwrap();
    assert_eq!(out2.to_vec::<f32>().unwrap(), X.to_vec());
    assert!(!d.join("res/deep/out3.npy").exists());
}

#[test]
fn run_options_graph_backend_no_fuse_and_percent_names() {
    let d = temp_dir("options");
    setup(&d);
    let o = smelt_in(
        &d,
        &[
            "run",
            "model.smelt",
            "--graph",
            "sm",
            "--input",
            "%x=x.npy",
            "--out",
            "o",
            "--backend",
            "interp",
            "--no-fuse",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let p = read_npy(d.join("o/out0.npy"))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for j in 0..3 {
        let (a, b) = (X[j] as f64, X[3 + j] as f64);
        let m = a.max(b);
        let z = (a - m).exp() + (b - m).exp();
        assert!((p[j] as f64 - (a - m).exp() / z).abs() < 1e-6);
        assert!((p[3 + j] as f64 - (b - m).exp() / z).abs() < 1e-6);
    }
}

#[test]
fn missing_extra_and_mistyped_inputs() {
    let d = temp_dir("inputs");
    setup(&d);
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "model.smelt", "--out", "o"];
        args.extend_from_slice(extra);
        smelt_in(&d, &args)
    };
    assert_error(
        &run(&["--input", "x=x.npy"]),
        &["missing input w: f32[3,2]"],
    );
    assert_error(&run(&[]), &["missing input x: f32[2,3]", "w: f32[3,2]"]);
    assert_error(
        &run(&[
            "--input", "x=x.npy", "--input", "w=w.npy", "--input", "z=x.npy",
        ]),
        &["no input named 'z'", "x: f32[2,3]"],
    );
    assert_error(
        &run(&[
            "--input", "x=x.npy", "--input", "w=w.npy", "--input", "x=x.npy",
        ]),
        &["input x is given more than once"],
    );
    // x.npy where w is expected: wrong shape.
    assert_error(
        &run(&["--input", "x=x.npy", "--input", "w=x.npy"]),
        &["input w: expected f32[3,2] but got f32[2,3]"],
    );
    // Right shape, wrong dtype.
    let x64 = Tensor::from_vec(X.iter().map(|&v| v as f64).collect::<Vec<f64>>(), &[2, 3]).unwrap();
    write_npy(d.join("x64.npy"), &x64).unwrap();
    assert_error(
        &run(&["--input", "x=x64.npy", "--input", "w=w.npy"]),
        &["input x: expected f32[2,3] but got f64[2,3]"],
    );
    assert!(
        !d.join("o").exists(),
        "no output directory after a failed run"
    );
}

#[test]
fn unreadable_input_files() {
    let d = temp_dir("files");
    setup(&d);
    let o = smelt_in(
        &d,
        &[
            "run",
            "model.smelt",
            "--input",
            "x=nope.npy",
            "--input",
            "w=w.npy",
            "--out",
            "o",
        ],
    );
    assert_error(&o, &["nope.npy"]);
    std::fs::write(d.join("junk.npy"), b"not an array").unwrap();
    let o = smelt_in(
        &d,
        &[
            "run",
            "model.smelt",
            "--input",
            "x=junk.npy",
            "--input",
            "w=w.npy",
            "--out",
            "o",
        ],
    );
    assert_error(&o, &["junk.npy", "not a .npy file"]);
    let bytes = std::fs::read(d.join("x.npy")).unwrap();
    std::fs::write(d.join("cut.npy"), &bytes[..bytes.len() - 3]).unwrap();
    let o = smelt_in(
        &d,
        &[
            "run",
            "model.smelt",
            "--input",
            "x=cut.npy",
            "--input",
            "w=w.npy",
            "--out",
            "o",
        ],
    );
    assert_error(&o, &["cut.npy", "truncated"]);
}

#[test]
fn output_directory_that_cannot_be_created() {
    let d = temp_dir("outdir");
    setup(&d);
    std::fs::write(d.join("taken"), b"a file").unwrap();
    let o = smelt_in(
        &d,
        &[
            "run",
            "model.smelt",
            "--input",
            "x=x.npy",
            "--input",
            "w=w.npy",
            "--out",
            "taken",
        ],
    );
    assert_error(&o, &["taken"]);
}

#[test]
fn bad_models() {
    let d = temp_dir("models");
    setup(&d);
    std::fs::write(
        d.join("typo.smelt"),
        "graph g(%x: f32[2]) {\n  %y = relux(%x)\n  return %y\n}\n",
    )
    .unwrap();
    for cmd in ["check", "dot"] {
        assert_error(
            &smelt_in(&d, &[cmd, "typo.smelt"]),
            &["typo.smelt:2:", "unknown op 'relux'"],
        );
    }
    let o = smelt_in(
        &d,
        &["run", "typo.smelt", "--input", "x=x.npy", "--out", "o"],
    );
    assert_error(&o, &["typo.smelt:2:", "relux"]);
    std::fs::write(
        d.join("shapes.smelt"),
        "graph g(%x: f32[2,3], %w: f32[2,3]) {\n  %y = matmul(%x, %w)\n  return %y\n}\n",
    )
    .unwrap();
    assert_error(
        &smelt_in(&d, &["check", "shapes.smelt"]),
        &["shapes.smelt:2:"],
    );
    assert_error(&smelt_in(&d, &["check", "absent.smelt"]), &["absent.smelt"]);
    assert_error(
        &smelt_in(&d, &["check", "model.smelt", "--graph", "zz"]),
        &["no graph named 'zz'", "mm, sm"],
    );
    assert_error(
        &smelt_in(&d, &["dot", "model.smelt", "--graph", "zz"]),
        &["no graph named 'zz'"],
    );
    let o = smelt_in(
        &d,
        &[
            "run",
            "model.smelt",
            "--graph",
            "zz",
            "--input",
            "x=x.npy",
            "--out",
            "o",
        ],
    );
    assert_error(&o, &["no graph named 'zz'"]);
}

#[test]
fn op_errors_at_run_time() {
    let d = temp_dir("operr");
    setup(&d);
    // The types check out, but a transposed tensor cannot be viewed as one dimension.
    let m = "graph g(%x: f32[2,3]) {\n  %t = transpose(%x, dim0=0, dim1=1)\n  %v = view(%t, shape=[6])\n  return %v\n}\n";
    std::fs::write(d.join("view.smelt"), m).unwrap();
    let o = smelt_in(
        &d,
        &["run", "view.smelt", "--input", "x=x.npy", "--out", "o"],
    );
    assert_error(&o, &["view"]);
}

#[test]
fn cuda_backend_without_a_gpu_is_a_clear_error() {
    if smelt::runtime::cuda::is_available() {
        eprintln!("cuda_backend_without_a_gpu_is_a_clear_error: skipped, a GPU is present");
        return;
    }
    let d = temp_dir("backends");
    setup(&d);
    let o = smelt_in(
        &d,
        &[
            "run",
            "model.smelt",
            "--input",
            "x=x.npy",
            "--input",
            "w=w.npy",
            "--out",
            "o",
            "--backend",
            "cuda",
        ],
    );
    assert_error(&o, &["CUDA driver"]);
    assert!(!d.join("o").exists());
}

#[test]
fn usage_errors_exit_with_2() {
    let d = temp_dir("usage");
    setup(&d);
    assert_usage_error(&smelt_in(&d, &[] as &[&str]), "Usage");
    assert_usage_error(&smelt_in(&d, &["frobnicate"]), "frobnicate");
    assert_usage_error(
        &smelt_in(&d, &["run", "model.smelt", "--input", "x=x.npy"]),
        "--out",
    );
    assert_usage_error(
        &smelt_in(&d, &["run", "model.smelt", "--input", "x", "--out", "o"]),
        "NAME=FILE",
    );
    assert_usage_error(
        &smelt_in(
            &d,
            &["run", "model.smelt", "--input", "=x.npy", "--out", "o"],
        ),
        "NAME=FILE",
    );
    assert_usage_error(
        &smelt_in(
            &d,
            &["run", "model.smelt", "--out", "o", "--backend", "tpu"],
        ),
        "tpu",
    );
    assert_usage_error(&smelt_in(&d, &["check", "model.smelt", "--frob"]), "--frob");
    assert_usage_error(&smelt_in(&d, &["check"]), "MODEL");
    let help = smelt_in(&d, &["run", "--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("--backend"));
}

#[test]
fn check_prints_every_type_and_reparses() {
    let d = temp_dir("check");
    setup(&d);
    let o = smelt_in(&d, &["check", "model.smelt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("%s: f32[2] = sum(%y, dim=[1])"), "{text}");
    assert!(text.contains("%p: f32[2,3] = softmax(%x, dim=0)"), "{text}");
    assert!(
        text.contains("graph mm(%x: f32[2,3], %w: f32[3,2])"),
        "{text}"
    );
    // Every statement carries its type.
    for line in text.lines().filter(|l| l.contains(" = ")) {
        assert!(
            line.trim_start().starts_with('%') && line.contains(": "),
            "{line}"
        );
    }
    // The printed text is itself a valid model that prints the same.
    std::fs::write(d.join("printed.smelt"), &text).unwrap();
    let again = smelt_in(&d, &["check", "printed.smelt"]);
    assert_eq!(stdout(&again), text);

    let one = stdout(&smelt_in(&d, &["check", "model.smelt", "--graph", "sm"]));
    assert!(
        one.starts_with("graph sm(") && !one.contains("graph mm"),
        "{one}"
    );
}

#[test]
fn dot_prints_or_writes_graphviz() {
    let d = temp_dir("dot");
    setup(&d);
    let o = smelt_in(&d, &["dot", "model.smelt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.starts_with("digraph"), "{text}");
    assert!(
        text.contains("matmul") && text.contains("f32[2,2]"),
        "{text}"
    );
    let o = smelt_in(&d, &["dot", "model.smelt", "--graph", "sm", "-o", "g.dot"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
    let file = std::fs::read_to_string(d.join("g.dot")).unwrap();
    assert!(
        file.contains("softmax") && !file.contains("matmul"),
        "{file}"
    );
    let o = smelt_in(&d, &["dot", "model.smelt", "-o", "no/such/dir/g.dot"]);
    assert_error(&o, &["g.dot"]);
}

/// Shapes that fit the type rules but not memory: random inputs, and an intermediate expanded
/// from a small input. Each is PyTorch's allocation error (exit status 1), never an abort, for
/// every command and backend.
#[test]
fn tensors_larger_than_memory_are_errors() {
    let d = temp_dir("oom");
    setup(&d);
    let models = [
        (
            "input.smelt",
            "graph g(%x: f32[1000000,1000000]) {\n  %y = relu(%x)\n  return %y\n}\n",
        ),
        (
            "expand.smelt",
            "graph g(%x: f32[3]) {\n  %e = expand(%x, size=[40000000000000, 3])\n  %y = relu(%e)\n  return %y\n}\n",
        ),
    ];
    for (file, text) in models {
        std::fs::write(d.join(file), text).unwrap();
    }
    let oom = "DefaultCPUAllocator: can't allocate memory";
    let o = smelt_in(&d, &["profile", "input.smelt", "--random-inputs"]);
    assert_error(&o, &[oom, "4000000000000 bytes"]);
    let x3 = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], &[3]).unwrap();
    write_npy(d.join("x3.npy"), &x3).unwrap();
    for backend in ["cpu", "interp"] {
        let o = smelt_in(
            &d,
            &[
                "run",
                "expand.smelt",
                "--input",
                "x=x3.npy",
                "--out",
                "o",
                "--backend",
                backend,
            ],
        );
        assert_error(&o, &[oom, "480000000000000 bytes"]);
    }
    let o = smelt_in(
        &d,
        &[
            "grad",
            "expand.smelt",
            "--input",
            "x=x3.npy",
            "--wrt",
            "x",
            "--out",
            "o",
        ],
    );
    assert_error(&o, &[oom]);
    let o = smelt_in(&d, &["profile", "expand.smelt", "--random-inputs"]);
    assert_error(&o, &[oom]);
}

/// `compile --target cpu` writes the object, header, manifest, run-time library and link
/// flags; a bad CPU target or C name is an error with nothing written.
#[test]
fn compile_for_the_cpu_writes_every_file() {
    let dir = temp_dir("compile-cpu");
    setup(&dir);
    let o = smelt_in(
        &dir,
        &[
            "compile",
            "model.smelt",
            "--target",
            "cpu",
            "--out",
            "out",
            "--name",
            "mm_model",
            "--cpu",
            "x86-64-v3",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    for f in [
        "mm_model.o",
        "mm_model.h",
        "manifest.json",
        "libsmelt_rt.a",
        "link-flags.txt",
    ] {
        assert!(dir.join("out").join(f).is_file(), "{f}");
    }
    let h = std::fs::read_to_string(dir.join("out/mm_model.h")).unwrap();
    assert!(h.contains("#define MM_MODEL_NUM_INPUTS 2"), "{h}");
    assert!(h.contains("#define MM_MODEL_NUM_OUTPUTS 3"), "{h}");
    assert!(h.contains("extern const size_t mm_model_input_bytes[MM_MODEL_NUM_INPUTS];"));
    assert!(h.contains("const char *mm_model_error_string(int code);"));
    let flags = std::fs::read_to_string(dir.join("out/link-flags.txt")).unwrap();
    assert!(
        flags.contains("libsmelt_rt.a") && flags.contains("-lpthread"),
        "{flags}"
    );
    let manifest = std::fs::read_to_string(dir.join("out/manifest.json")).unwrap();
    let m: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(m["cpu"], "x86-64-v3");
    assert_eq!(m["outputs"][1]["shape"], serde_json::json!([2, 2]));
    assert!(
        m["cpu_features"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "avx2")
    );

    let o = smelt_in(
        &dir,
        &[
            "compile",
            "model.smelt",
            "--target",
            "cpu",
            "--out",
            "bad",
            "--cpu",
            "i386",
        ],
    );
    assert_error(&o, &["unknown CPU target 'i386'"]);
    let o = smelt_in(
        &dir,
        &[
            "compile",
            "model.smelt",
            "--target",
            "cpu",
            "--out",
            "bad",
            "--name",
            "a-b",
        ],
    );
    assert_error(&o, &["not a C identifier"]);
    assert!(!dir.join("bad").exists());
}
