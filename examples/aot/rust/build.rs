//! Compiles the repository's MLP block and attention block into objects linked into this
//! program, and writes their typed Rust functions into OUT_DIR.

use smelt::aot::{AotOptions, compile_model};
use std::path::{Path, PathBuf};

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    for (file, name) in [("mlp_block.smelt", "mlp"), ("attention.smelt", "attention")] {
        let opts = AotOptions {
            name: Some(name.into()),
            ..AotOptions::default()
        };
        if let Err(e) = compile_model(models.join(file), &out, &opts) {
            panic!("compiling {file}: {e}");
        }
    }
}
