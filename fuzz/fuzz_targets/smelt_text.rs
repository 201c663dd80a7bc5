#![no_main]
//! Fuzz target: `smelt::fuzz::smelt_text` (docs/fuzzing.md).

libfuzzer_sys::fuzz_target!(|data: &[u8]| smelt::fuzz::smelt_text(data));
