#!/usr/bin/env bash
# The ahead-of-time examples from a fresh clone: builds smelt, the run-time library
# (libsmelt_rt.a) and the Rust example (whose build.rs compiles both models), compiles an
# MLP block and an attention block with `smelt compile --target cpu`, links them into the C
# program with the system C compiler, runs both programs and checks that they print the
# same outputs (the same kernels on the same inputs); links the MLP as a shared library and
# runs it from Python with ctypes and NumPy. Then the GPT of examples/gpt: trained
# briefly, exported, compiled, checked from C and from Python against the JIT's logits, and
# generating text from C. Then the ResNet of examples/resnet: trained briefly, exported, compiled, and
# classifying held-out images from C and from Python, checked against the JIT's logits.
set -euo pipefail
cd "$(dirname "$0")/../.."
# cargo's target directory, wherever CARGO_TARGET_DIR or a config puts it
TARGET="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
OUT="${OUT:-$TARGET/aot-example}"
# the test profile (the settings of dev): what `cargo test` built is reused (not
# `--workspace`: the Python package's dependencies would change the others' features)
cargo build --profile test -p smelt -p smelt-rt -p smelt-aot-example
SMELT="$TARGET/debug/smelt"
mkdir -p "$OUT"
"$SMELT" compile examples/models/mlp_block.smelt --target cpu --out "$OUT" --name mlp
"$SMELT" compile examples/models/attention.smelt --target cpu --out "$OUT" --name attention
cc -O2 -Wall -I "$OUT" examples/aot/c/main.c "$OUT/mlp.o" "$OUT/attention.o" \
  $(cat "$OUT/link-flags.txt") -o "$OUT/aot-c"
echo "== C (examples/aot/c/main.c)"
"$OUT/aot-c" | tee "$OUT/c.txt"
echo "== Rust (examples/aot/rust)"
"$TARGET/debug/smelt-aot-example" | tee "$OUT/rust.txt"
grep -E '^(mlp y|attention out):' "$OUT/c.txt" | diff - "$OUT/rust.txt"
echo "the C and Rust programs print the same outputs"

echo "== Python, ctypes and NumPy (examples/aot/python_ctypes.py) on libmlp.so"
"$SMELT" compile examples/models/mlp_block.smelt --target cpu --out "$OUT/shared" --name mlp \
  --shared
PYTHON="${SMELT_PYTHON:-python3}"
if "$PYTHON" -c "import numpy" 2> /dev/null; then
  "$PYTHON" examples/aot/python_ctypes.py "$OUT/shared/libmlp.so" "$OUT/shared/manifest.json" |
    tee "$OUT/python.txt"
  grep -E '^mlp y:' "$OUT/c.txt" | diff - "$OUT/python.txt"
  echo "the C and Python programs print the same outputs"
else
  echo "skipped: $PYTHON has no NumPy (set SMELT_PYTHON to a Python that has)"
fi

echo "== the GPT (examples/gpt), compiled ahead of time and run from C (examples/aot/c/gpt.c)"
# the example writes gpt.smelt, the held-out batch idx.npy and the JIT's logits out0.npy
# to $TMPDIR/smelt-gpt
mkdir -p "$OUT/gpt-run"
TMPDIR="$(cd "$OUT/gpt-run" && pwd)" cargo run --profile test --example gpt -- --steps 400 |
  tee "$OUT/gpt-train.txt"
GPT="$OUT/gpt-run/smelt-gpt"
"$SMELT" compile "$GPT/gpt.smelt" --target cpu --out "$OUT" --name gpt
cc -O2 -Wall -I "$OUT" examples/aot/c/gpt.c "$OUT/gpt.o" $(cat "$OUT/link-flags.txt") -lm \
  -o "$OUT/gpt-c"
"$OUT/gpt-c" check "$GPT/idx.npy" "$GPT/out0.npy"
echo "greedy:       $("$OUT/gpt-c" generate '12+34=')"
echo "sampled, t=1: $("$OUT/gpt-c" generate '12+34=' 1.0 7)"
if "$PYTHON" -c "import numpy" 2> /dev/null; then
  # attention compiles as products and a softmax: within rounding of the JIT's fused kernel
  "$SMELT" compile "$GPT/gpt.smelt" --target cpu --out "$OUT/gpt-shared" --name gpt --shared
  "$PYTHON" examples/aot/python_ctypes.py "$OUT/gpt-shared/libgpt.so" \
    "$OUT/gpt-shared/manifest.json" "$GPT/idx.npy" --expect "$GPT/out0.npy" --tol 1e-4
else
  echo "skipped the GPT from Python: $PYTHON has no NumPy"
fi

echo "== the ResNet (examples/resnet), compiled ahead of time and run from C (examples/aot/c/resnet.c)"
# the example writes resnet.smelt, images.npy, labels.npy and the JIT's logits out0.npy to
# $TMPDIR/smelt-resnet
mkdir -p "$OUT/resnet-run"
TMPDIR="$(cd "$OUT/resnet-run" && pwd)" cargo run --profile test --example resnet -- --steps 40 |
  tee "$OUT/resnet-train.txt"
RESNET="$OUT/resnet-run/smelt-resnet"
"$SMELT" compile "$RESNET/resnet.smelt" --target cpu --out "$OUT" --name resnet
cc -O2 -Wall -I "$OUT" examples/aot/c/resnet.c "$OUT/resnet.o" $(cat "$OUT/link-flags.txt") -lm \
  -o "$OUT/resnet-c"
"$OUT/resnet-c" "$RESNET/images.npy" "$RESNET/labels.npy" "$RESNET/out0.npy"
if "$PYTHON" -c "import numpy" 2> /dev/null; then
  "$SMELT" compile "$RESNET/resnet.smelt" --target cpu --out "$OUT/resnet-shared" --name resnet \
    --shared
  "$PYTHON" examples/aot/python_ctypes.py "$OUT/resnet-shared/libresnet.so" \
    "$OUT/resnet-shared/manifest.json" "$RESNET/images.npy" --expect "$RESNET/out0.npy"
else
  echo "skipped the ResNet from Python: $PYTHON has no NumPy"
fi
