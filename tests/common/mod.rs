//! What the integration tests share. Each test file is its own crate and uses only part of
//! this module, hence the `dead_code` allowance.
//!
//! - [`close`]: the one value comparison, [`assert_close`] within a [`Tol`], and
//!   [`assert_bits`] for bit-identical results;
//! - [`graphs`]: the one random-graph generator, [`random_graph_from`] a [`Recipe`];
//! - [`inputs`]: random inputs for a graph's parameters ([`inputs_for`] and its variants);
//! - [`onnx_protos`]: ONNX messages built in code (a value's type, a node, a model);
//! - [`torch`]: the Python of the PyTorch comparisons, or why they skip;
//! - [`cli`]: fresh temporary directories and runs of the `smelt` binary;
//! - [`aot`]: ahead-of-time models linked with the C driver, here or for another machine;
//! - [`aot_gaps`]: the ops ahead-of-time objects refuse today, and why;
//! - [`cuda_cases`] and [`cuda_check`]: the per-op graphs and inputs of the CUDA tests.

#![allow(dead_code)]

pub mod aot;
pub mod aot_gaps;
pub mod cli;
pub mod close;
pub mod cuda_cases;
pub mod cuda_check;
pub mod graphs;
pub mod inputs;
pub mod load;
pub mod onnx_protos;
pub mod torch;

// The names the tests use most, at the top; each test uses only some of them.
#[allow(unused_imports)]
pub use cli::{smelt, smelt_in, stderr, stdout, temp_dir};
#[allow(unused_imports)]
pub use close::{Tol, Values, assert_bits, assert_close, same_bits};
#[allow(unused_imports)]
pub use graphs::{Recipe, random_graph, random_graph_from};
#[allow(unused_imports)]
pub use inputs::{Dist, inputs_for, inputs_with, random_tensor, special_inputs_for};
