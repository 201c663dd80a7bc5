#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and no network: run the CUDA tests (every op and example
# model on the GPU against the CPU interpreter), measure compile times with a cold and a
# warm disk cache, profile benches/models/gpu.smelt with smelt and PyTorch, and print a
# table last.
#
# Binaries: with SMELT_PREBUILT=DIR, DIR holds `smelt` and the test executables named in
# GPU_CHECK_TESTS (built elsewhere with `cargo test --release --no-run`); otherwise they are
# built here with cargo (--offline: the crates must already be in the cargo cache).
# GPU_CHECK_TORCH=0 leaves out the PyTorch timings; GPU_CHECK_GRAPHS names the graphs of
# benches/models/gpu.smelt and gpu_conv.smelt to profile (all by default), and PyTorch
# times the same ones. NVRTC, the CUDA headers, cuBLAS and cuDNN come from a CUDA toolkit
# or NVIDIA's pip wheels (docs/cuda.md).
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never SMELT_REQUIRE_NVRTC=1 SMELT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
start=$(date +%s)
status=0
out=${GPU_CHECK_OUT:-$(mktemp -d)}
mkdir -p "$out"

echo "== GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader || true

# cuBLAS and NVRTC from the toolkit or the wheels; cudarc opens libcublas.so by that name
libs=$out/libs
mkdir -p "$libs"
site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
for d in /usr/local/cuda/lib64 /usr/local/nvidia/lib64 $(for s in $site; do ls -d "$s"/nvidia/*/lib 2>/dev/null; done); do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas.so '; then
  for d in ${LD_LIBRARY_PATH//:/ }; do
    f=$(ls "$d"/libcublas.so* 2>/dev/null | head -1)
    if [ -n "$f" ]; then ln -sf "$f" "$libs/libcublas.so"; break; fi
  done
fi
export LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}"

if [ -n "${SMELT_PREBUILT:-}" ]; then
  bin=$SMELT_PREBUILT/smelt
  run_test() { timeout 300 "$SMELT_PREBUILT/$1" --test-threads=1 2>&1; }
else
  echo "== build"
  cargo build --release --offline --bin smelt || { echo "build failed"; exit 1; }
  bin=${CARGO_TARGET_DIR:-target}/release/smelt
  run_test() { timeout 600 cargo test --release --offline --test "$1" -- --test-threads=1 2>&1; }
fi
export SMELT_BIN=$bin

echo "== CUDA tests"
# control_flow runs its programs on the GPU too when one is here; cudnn needs cuDNN
for t in ${GPU_CHECK_TESTS:-cuda_device cuda_codegen cuda_exec control_flow cudnn nccl}; do
  echo "-- $t"
  if ! run_test "$t" > "$out/test_$t.log"; then status=1; fi
  grep -E "^test |test result|panicked|skipped" "$out/test_$t.log" | grep -v " ok$" | head -40
done

echo "== compile times (cold disk cache, then warm), mlp_block"
export SMELT_CACHE_DIR=$out/cache
for run in cold warm; do
  "$bin" profile examples/models/mlp_block.smelt --backend cuda --repeat 1 --json "$out/compile_$run.json" > /dev/null || status=1
  python3 -c "import json; j=json.load(open('$out/compile_$run.json')); print(f\"  $run: {j['compile_ms']:.1f} ms ({j['compile_origin']})\")" || true
done

echo "== smelt profiles (benches/models/gpu.smelt)"
graphs=${GPU_CHECK_GRAPHS:-chain chain4 gelu softmax layer_norm rowsum colsum mlp matmul_bf16 conv conv_bf16}
for g in $graphs; do
  extra=()
  # the CPU interpreter would take long over these; tests/cudnn.rs checks convolutions
  case $g in matmul_bf16|conv*) extra=(--no-check) ;; esac
  file=benches/models/gpu.smelt
  case $g in conv*) file=benches/models/gpu_conv.smelt ;; esac
  if ! timeout 60 "$bin" profile "$file" --graph "$g" --backend cuda --repeat 10 \
      "${extra[@]}" --json "$out/smelt_$g.json" > "$out/profile_$g.txt" 2>&1; then
    status=1; echo "  $g failed:"; tail -5 "$out/profile_$g.txt"
  else
    grep -E "fused is|of the measured copy|max \|" "$out/profile_$g.txt" | sed "s/^/  $g:/"
  fi
done

echo "== convolutions on the generated kernel (SMELT_CUDNN=0)"
for g in $graphs; do
  case $g in conv*) ;; *) continue ;; esac
  SMELT_CUDNN=0 timeout 120 "$bin" profile benches/models/gpu_conv.smelt --graph "$g" --backend cuda \
    --repeat 5 --no-check --json "$out/smelt_${g}_generated.json" > /dev/null 2>&1 \
    || echo "  $g generated: failed"
done

echo "== PyTorch"
if [ "${GPU_CHECK_TORCH:-1}" != 0 ]; then
  GPU_BENCH_WORKLOADS="$graphs" timeout 170 python3 scripts/gpu_bench.py torch "$out/torch.json" \
    || echo "  PyTorch timings incomplete"
fi

echo "== done in $(( $(date +%s) - start )) s, status $status"
python3 scripts/gpu_bench.py table "$out"
exit $status
