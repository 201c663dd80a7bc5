#!/usr/bin/env bash
# The ahead-of-time examples from a fresh clone: builds smelt, the run-time library
# (libsmelt_rt.a) and the Rust example (whose build.rs compiles both models), compiles an
# MLP block and an attention block with `smelt compile --target cpu`, links them into the C
# program with the system C compiler, runs both programs and checks that they print the
# same outputs (the same kernels on the same inputs).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-target/aot-example}"
# the test profile (the settings of dev): what `cargo test` built is reused
cargo build --workspace --profile test
mkdir -p "$OUT"
target/debug/smelt compile examples/models/mlp_block.smelt --target cpu --out "$OUT" --name mlp
target/debug/smelt compile examples/models/attention.smelt --target cpu --out "$OUT" --name attention
cc -O2 -Wall -I "$OUT" examples/aot/c/main.c "$OUT/mlp.o" "$OUT/attention.o" \
  $(cat "$OUT/link-flags.txt") -o "$OUT/aot-c"
echo "== C (examples/aot/c/main.c)"
"$OUT/aot-c" | tee "$OUT/c.txt"
echo "== Rust (examples/aot/rust)"
target/debug/smelt-aot-example | tee "$OUT/rust.txt"
grep -E '^(mlp y|attention out):' "$OUT/c.txt" | diff - "$OUT/rust.txt"
echo "the C and Rust programs print the same outputs"
