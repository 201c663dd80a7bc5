#![no_main]
//! Fuzz target: `smelt::fuzz::safetensors` (docs/fuzzing.md).

libfuzzer_sys::fuzz_target!(|data: &[u8]| smelt::fuzz::safetensors(data));
