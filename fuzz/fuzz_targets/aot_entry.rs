#![no_main]
//! Fuzz target: `smelt::fuzz::aot_entry` (docs/fuzzing.md).

libfuzzer_sys::fuzz_target!(|data: &[u8]| smelt::fuzz::aot_entry(data));
