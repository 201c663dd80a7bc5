#![no_main]
//! Fuzz target: `smelt::fuzz::onnx` (docs/fuzzing.md).

libfuzzer_sys::fuzz_target!(|data: &[u8]| smelt::fuzz::onnx(data));
