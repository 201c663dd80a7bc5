#![no_main]
//! Fuzz target: `smelt::fuzz::npy` (docs/fuzzing.md).

libfuzzer_sys::fuzz_target!(|data: &[u8]| smelt::fuzz::npy(data));
