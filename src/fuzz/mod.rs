//! Fuzzing smelt.
//!
//! - The readers of files people download, one entry point each, for the coverage-guided
//!   fuzz targets in `fuzz/` and for the corpus replay that CI runs (`tests/fuzz_corpus.rs`).
//!   Each takes arbitrary bytes: an error is the expected answer to most of them; a panic is
//!   a bug, and so is a broken invariant, which these functions check with assertions (what
//!   one reader accepted, writing it and reading it back must give the same thing). The
//!   C entry point of ahead-of-time models is one of them (`aot_entry`): the arguments a
//!   C caller gets wrong get their documented codes.
//! - The differential fuzzer behind `smelt fuzz`: random graphs over the op table
//!   ([`graphs`]) run on every CPU path and checked against a float64 oracle whose tolerance
//!   is each graph's own rounding-error spread ([`oracle`], [`check`]); a failing graph is
//!   shrunk to a small `.smelt` file ([`shrink`]).
//!
//! See `docs/fuzzing.md`.

mod aot_entry;
pub mod campaign;
pub mod check;
pub mod graphs;
pub mod oracle;
mod readers;
pub mod shrink;

pub use readers::{TARGETS, Target, aot_entry, cache_entry, npy, onnx, safetensors, smelt_text};
