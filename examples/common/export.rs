//! A trained model written for `smelt run`, `smelt compile` and the programs of
//! `examples/aot`: its inference graph, an input batch, and the JIT's outputs on it.

#![allow(dead_code)] // each user takes what it needs

use smelt::nn::Module;
use smelt::runtime::npy::{read_npy, write_npy};
use smelt::{Result, Tensor};
use std::path::{Path, PathBuf};

/// The graph of `model`'s forward pass on a batch shaped like `x`, its parameters captured
/// as constants (put the model in evaluation mode first where it has one).
pub fn inference_graph(model: &impl Module, x: &Tensor) -> Result<smelt::ir::Graph> {
    let _off = smelt::autograd::no_grad();
    let traced = smelt::jit::trace(
        |xs| Ok(vec![model.forward(&xs[0])?]),
        std::slice::from_ref(x),
    )?;
    Ok(traced.graph().clone())
}

/// Writes `graph` as `dir/name.smelt` and `x` as `dir/input`, runs `smelt run` on them
/// (which writes the JIT's output to `dir/out0.npy`) and returns that output and the
/// graph's path.
pub fn run_exported(
    dir: &Path,
    name: &str,
    graph: &smelt::ir::Graph,
    (x, input): (&Tensor, &str),
) -> Result<(Tensor, PathBuf)> {
    std::fs::create_dir_all(dir).map_err(|e| smelt::Error::Io(e.to_string()))?;
    let graph_path = dir.join(format!("{name}.smelt"));
    std::fs::write(&graph_path, smelt::ir::print_graph(graph))
        .map_err(|e| smelt::Error::Io(e.to_string()))?;
    let input_path = dir.join(input);
    write_npy(&input_path, x)?;
    smelt::cli::run(&smelt::cli::RunArgs {
        model: graph_path.clone(),
        inputs: vec![(graph.node(graph.inputs()[0]).name.clone(), input_path)],
        out: dir.to_path_buf(),
        backend: smelt::cli::Backend::Cpu,
        no_fuse: false,
        graph: None,
        weights: None,
        repeat: 0,
    })?;
    Ok((read_npy(dir.join("out0.npy"))?, graph_path))
}
