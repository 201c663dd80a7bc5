//! The GPT of `examples/gpt.rs` against PyTorch: the same initial weights and batches, 20
//! compiled AdamW steps here, the same in PyTorch (`scripts/torch_models.py`), and the
//! losses compared within float32 tolerance. It needs a Python with torch and numpy
//! (`SMELT_TORCH_PYTHON`, else `python3`); without one, and always in CI, it says why it
//! skips.

#[path = "../examples/common/gpt_model.rs"]
mod gpt_model;

mod common;

use smelt::Tensor;
use smelt::runtime::npy::write_npy;
use std::process::Command;

#[test]
fn the_gpt_trains_as_pytorch_trains_it() {
    let Some(python) = common::torch::python_with_torch() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("smelt-torch-models-{}", std::process::id()));
    let (model, batches) = gpt_model::export_start(&dir, 20).unwrap();
    let mut step = gpt_model::compiled_adamw_step(&model, &batches[0]).unwrap();
    let losses: Vec<f64> = batches
        .iter()
        .map(|(x, y)| {
            step.step(&[x.clone(), y.clone()])
                .unwrap()
                .item_f64()
                .unwrap()
        })
        .collect();
    assert!(losses[19] < losses[0], "{losses:?}");
    write_npy(
        dir.join("losses_compiled.npy"),
        &Tensor::from_vec(losses, &[20]).unwrap(),
    )
    .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/torch_models.py");
    let out = Command::new(&python)
        .args([script, dir.to_str().unwrap()])
        .env("SMELT_SKIP_TIMING", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("agree within float32 tolerance"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}
