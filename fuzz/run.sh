#!/usr/bin/env bash
# Coverage-guided fuzzing of smelt's file readers with cargo-fuzz (docs/fuzzing.md).
#
#   fuzz/run.sh SECONDS [TARGET...]   fuzz each target (default: all) for SECONDS, then
#                                     merge what found new coverage into fuzz/corpus/TARGET
#
# Needs `cargo install cargo-fuzz`; builds on the stable toolchain (`-s none`: coverage
# instrumentation without a sanitizer, which would need nightly). Seeds: fuzz/seeds/TARGET
# when `python3 fuzz/seed.py target/release/smelt` made them. Crashes are written to
# fuzz/artifacts/TARGET/; copy each into fuzz/regressions/TARGET/ once it is fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(smelt_text npy safetensors onnx cache_entry aot_entry)
fi
cargo fuzz build -s none
bin=fuzz/target/x86_64-unknown-linux-gnu/release
# hostile sizes must hit smelt's own limit (an error) well before libFuzzer's (a crash)
export SMELT_MAX_ALLOC_BYTES=$((1 << 30)) SMELT_CACHE_DIR=off
for t in "${targets[@]}"; do
    mkdir -p "fuzz/work/$t" "fuzz/corpus/$t" "fuzz/artifacts/$t" "fuzz/seeds/$t"
    "$bin/$t" "fuzz/work/$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -max_total_time="$secs" \
        -rss_limit_mb=2048 -malloc_limit_mb=1500 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" 2>&1 | grep -E "^#[0-9]+ +DONE|stat::|SUMMARY" || true
    # keep only what adds edges to the committed corpus, by a small set cover
    "$bin/$t" -set_cover_merge=1 -use_counters=0 "fuzz/corpus/$t" "fuzz/work/$t" 2>&1 \
        | grep -E "MERGE-OUTER: [0-9]+ new files" || true
done
