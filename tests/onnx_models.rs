//! Real architectures exported by `torch.onnx` (`scripts/onnx_models.py`: ResNet-18,
//! MobileNetV3, a ViT, BERT and GPT-2 at small widths, random weights) run through
//! `smelt run` on the interpreter and the fused CPU path to onnxruntime's outputs.

use smelt::cli::{Backend, RunArgs, run};
use smelt::runtime::npy;
use smelt::{DType, Tensor};
use std::path::{Path, PathBuf};

const MODELS: &str = "tests/data/onnx_models";

/// The `NAME=FILE` lines of `inputs.txt`, files relative to the model's folder.
fn inputs(dir: &Path) -> Vec<(String, PathBuf)> {
    std::fs::read_to_string(dir.join("inputs.txt"))
        .expect("inputs.txt")
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, f) = l.split_once('=').expect("NAME=FILE");
            (n.to_string(), dir.join(f))
        })
        .collect()
}

/// Largest |got - want| relative to the largest |want|.
fn relative_error(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape(), want.shape());
    assert_eq!(got.dtype(), want.dtype());
    let g = got.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    let w = want.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    let scale = w.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    g.iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0f64, f64::max)
        / scale
}

/// Runs `model` on the inputs of `set` (its folder, or `short/` for other sizes) and
/// compares with onnxruntime's outputs.
fn check(model: &str, set: &str) {
    let dir = Path::new(MODELS).join(model);
    let data = dir.join(set);
    for backend in [Backend::Interp, Backend::Cpu] {
        let out = std::env::temp_dir().join(format!(
            "smelt-onnx-{model}-{backend:?}-{}",
            std::process::id()
        ));
        let given = inputs(&dir)
            .into_iter()
            .map(|(n, f)| (n, data.join(f.file_name().expect("a file"))))
            .collect();
        run(&RunArgs {
            model: dir.join("model.onnx"),
            inputs: given,
            out: out.clone(),
            backend,
            no_fuse: false,
            graph: None,
            weights: None,
            repeat: 0,
        })
        .unwrap_or_else(|e| panic!("{model} on {backend:?}: {e}"));
        let mut k = 0;
        while data.join(format!("output_{k}.npy")).is_file() {
            let want = npy::read_npy(data.join(format!("output_{k}.npy"))).unwrap();
            let got = npy::read_npy(out.join(format!("out{k}.npy"))).unwrap();
            let err = relative_error(&got, &want);
            assert!(
                err < 1e-3,
                "{model} ({set}) output {k} on {backend:?}: relative error {err:e}"
            );
            k += 1;
        }
        assert!(k > 0, "{model}: no outputs to compare");
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn resnet18_matches_onnxruntime() {
    check("resnet18", "");
}

#[test]
fn mobilenet_v3_matches_onnxruntime() {
    check("mobilenet_v3", "");
}

#[test]
fn vit_matches_onnxruntime() {
    check("vit", "");
}

#[test]
fn bert_matches_onnxruntime() {
    check("bert", "");
}

#[test]
fn gpt2_matches_onnxruntime() {
    check("gpt2", "");
}

/// Batch 3 (sequence 5 for the text models) through the same files: the named dims are
/// bound from the inputs of each call.
#[test]
fn symbolic_dims_follow_the_inputs() {
    for model in ["resnet18", "mobilenet_v3", "vit", "bert", "gpt2"] {
        check(model, "short");
    }
}
