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

/// Each model imported once with its named dims as symbols runs both input sets (two
/// batch sizes, two sequence lengths) to onnxruntime's outputs: one import, one graph.
#[test]
fn one_symbolic_import_serves_every_size() {
    use smelt::exec::{CompileOptions, SymbolicFn};
    for (model, symbols) in [
        ("resnet18", vec!["batch"]),
        ("mobilenet_v3", vec!["batch"]),
        ("vit", vec!["batch"]),
        ("bert", vec!["batch", "sequence"]),
        ("gpt2", vec!["batch", "sequence"]),
    ] {
        let dir = Path::new(MODELS).join(model);
        let m = smelt::onnx::load(dir.join("model.onnx")).unwrap();
        let imported = m
            .import_symbolic()
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        assert_eq!(imported.module.symbols(), symbols, "{model}");
        let g = imported.module.sample().entry();
        let names: Vec<String> = g.inputs().iter().map(|&v| g.node(v).name.clone()).collect();
        let f = SymbolicFn::new(
            imported.module.clone(),
            None,
            smelt::Device::Cpu,
            &CompileOptions::default(),
        )
        .unwrap();
        for set in ["", "short"] {
            let data = dir.join(set);
            let mut given: Vec<(String, Tensor)> = inputs(&dir)
                .into_iter()
                .map(|(onnx, file)| {
                    let t = npy::read_npy(data.join(file.file_name().unwrap())).unwrap();
                    let (_, gname) = imported.inputs.iter().find(|(o, _)| *o == onnx).unwrap();
                    (gname.clone(), t)
                })
                .collect();
            given.extend(imported.weights.iter().cloned());
            let positional: Vec<Tensor> = names
                .iter()
                .map(|n| given.iter().find(|(m, _)| m == n).unwrap().1.clone())
                .collect();
            let outs = f
                .call(&positional)
                .unwrap_or_else(|e| panic!("{model} ({set}): {e}"));
            for (k, got) in outs.iter().enumerate() {
                let want = npy::read_npy(data.join(format!("output_{k}.npy"))).unwrap();
                let err = relative_error(got, &want);
                assert!(
                    err < 1e-3,
                    "{model} ({set}) output {k}: relative error {err:e}"
                );
            }
        }
        assert_eq!(f.compiles(), 2, "{model}: one compile per binding");
    }
}

/// `smelt import` writes BERT with its named dims as symbols; `smelt run` on the `.smelt`
/// file and its weights takes both input sets to onnxruntime's outputs.
#[test]
fn smelt_import_writes_symbols_that_smelt_run_binds() {
    use smelt::cli::import::{ImportArgs, import};
    let dir = Path::new(MODELS).join("bert");
    let out = std::env::temp_dir().join(format!("smelt-onnx-import-{}", std::process::id()));
    import(&ImportArgs {
        model: dir.join("model.onnx"),
        out: out.clone(),
        name: Some("bert".into()),
    })
    .unwrap();
    let text = std::fs::read_to_string(out.join("bert.smelt")).unwrap();
    assert!(
        text.contains("graph bert(%input_ids: i64[batch,sequence]"),
        "{}",
        &text[..300.min(text.len())]
    );
    for set in ["", "short"] {
        let data = dir.join(set);
        let results = out.join(format!("run{set}"));
        run(&RunArgs {
            model: out.join("bert.smelt"),
            inputs: vec![("input_ids".into(), data.join("input_0.npy"))],
            out: results.clone(),
            backend: Backend::Cpu,
            no_fuse: false,
            graph: None,
            weights: Some(out.join("bert.safetensors")),
            repeat: 0,
        })
        .unwrap();
        for k in 0..2 {
            let want = npy::read_npy(data.join(format!("output_{k}.npy"))).unwrap();
            let got = npy::read_npy(results.join(format!("out{k}.npy"))).unwrap();
            let err = relative_error(&got, &want);
            assert!(
                err < 1e-3,
                "bert ({set}) output {k}: relative error {err:e}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}
