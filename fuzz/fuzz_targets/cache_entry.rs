#![no_main]
//! Fuzz target: `smelt::fuzz::cache_entry` (docs/fuzzing.md).

libfuzzer_sys::fuzz_target!(|data: &[u8]| smelt::fuzz::cache_entry(data));
