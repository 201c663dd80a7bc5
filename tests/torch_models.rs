//! The GPT of `examples/gpt.rs` and the ResNet of `examples/resnet.rs` against PyTorch: the
//! same initial weights and batches, 20 compiled steps here (AdamW with clipping; SGD with
//! momentum), the same in PyTorch (`scripts/torch_models.py`), and the losses compared
//! within float32 tolerance. It needs a Python with torch and numpy
//! (`SMELT_TORCH_PYTHON`, else `python3`); without one, and always in CI, it says why it
//! skips.

#[path = "../examples/common/gpt_model.rs"]
mod gpt_model;
#[path = "../examples/common/resnet_model.rs"]
mod resnet_model;

mod common;

use smelt::Tensor;
use smelt::runtime::npy::write_npy;
use std::path::Path;
use std::process::Command;

/// Writes smelt's losses to `dir` as `file`, runs the script on `dir` for `model`, and
/// checks that it finds the losses in agreement (`says`).
fn compare(python: &str, dir: &Path, file: &str, losses: Vec<f64>, model: &str, says: &str) {
    let n = losses.len();
    write_npy(dir.join(file), &Tensor::from_vec(losses, &[n]).unwrap()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/torch_models.py");
    let out = Command::new(python)
        .args([script, dir.to_str().unwrap(), model])
        .env("SMELT_SKIP_TIMING", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(says), "{text}");
}

/// The loss of each compiled step over `batches`; the last must be below the first.
fn train(step: &mut smelt::train::CompiledStep, batches: &[(Tensor, Tensor)]) -> Vec<f64> {
    let losses: Vec<f64> = batches
        .iter()
        .map(|(x, y)| {
            step.step(&[x.clone(), y.clone()])
                .unwrap()
                .item_f64()
                .unwrap()
        })
        .collect();
    assert!(losses[losses.len() - 1] < losses[0], "{losses:?}");
    losses
}

#[test]
fn the_gpt_trains_as_pytorch_trains_it() {
    let Some(python) = common::torch::python_with_torch() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("smelt-torch-models-{}", std::process::id()));
    let (model, batches) = gpt_model::export_start(&dir, 20).unwrap();
    let mut step = gpt_model::compiled_adamw_step(&model, &batches[0]).unwrap();
    let losses = train(&mut step, &batches);
    compare(
        &python,
        &dir,
        "losses_compiled.npy",
        losses,
        "gpt",
        "the losses agree within float32 tolerance",
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_resnet_trains_as_pytorch_trains_it() {
    let Some(python) = common::torch::python_with_torch() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("smelt-torch-resnet-{}", std::process::id()));
    let (model, batches) = resnet_model::export_start(&dir, 20).unwrap();
    let mut step = resnet_model::compiled_sgd_step(&model, &batches[0]).unwrap();
    let losses = train(&mut step, &batches);
    compare(
        &python,
        &dir,
        "resnet.losses_compiled.npy",
        losses,
        "resnet",
        "the ResNet losses agree within float32 tolerance",
    );
    std::fs::remove_dir_all(&dir).ok();
}
