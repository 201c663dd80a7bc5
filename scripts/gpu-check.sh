#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and no network: build, run the CUDA tests, compile the
# example models for this GPU, and time reference workloads. Crates must already be in the
# cargo cache (`cargo fetch` beforehand); NVRTC comes from a CUDA toolkit or NVIDIA's pip
# wheels (PyTorch installs them), found as described in docs/cuda.md.
#
# What is not measured, and why: running smelt's compiled schedules on the GPU (device
# tensors and kernel launches) is not implemented yet, so there are no smelt kernel times;
# the table shows the references a later version must be compared with.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
export SMELT_REQUIRE_NVRTC=1
start=$(date +%s)
status=0

echo "== GPU"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
else
  echo "nvidia-smi not found"
  cap=90
fi
arch="sm_${cap:-90}"

echo "== build"
if ! cargo build --offline --bin smelt; then
  echo "build failed (are the crates in the cargo cache? run 'cargo fetch' with network first)"
  exit 1
fi

echo "== CUDA tests (device queries, allocator, NVRTC compile of every op)"
if ! cargo test --offline --test cuda_device --test cuda_codegen -- --nocapture 2>&1 | grep -E "^test |test result|skipped|no CUDA|driver:|devices:|cuda:[0-9]|nvrtc:|headers:|panicked"; then
  status=1
fi
cargo test --offline --test cuda_device --test cuda_codegen >/dev/null 2>&1 || status=1

echo "== compile the example models for $arch"
bin=${CARGO_TARGET_DIR:-target}/debug/smelt
out=$(mktemp -d)
for m in examples/models/*.smelt; do
  t0=$(date +%s%N)
  if "$bin" compile "$m" --target cuda --arch "$arch" --out "$out/$(basename "$m" .smelt)"; then
    t1=$(date +%s%N)
    n=$(ls "$out/$(basename "$m" .smelt)"/*.cubin 2>/dev/null | wc -l)
    printf "  %-22s %2d kernels  %6.0f ms\n" "$(basename "$m")" "$n" "$(( (t1 - t0) / 1000000 ))"
  else
    status=1
  fi
done
rm -rf "$out"

echo "== reference timings (smelt on GPU: skipped, execution not implemented yet)"
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  timeout 180 python3 - <<'PY'
import time, torch
dev = "cuda"
def bench(f, *a, n=50):
    for _ in range(3): f(*a)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): f(*a)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3
x = torch.randn(4096, 4096, device=dev)
b = torch.randn(4096, device=dev)
y = torch.empty_like(x)
copy_ms = bench(lambda: y.copy_(x))
gbs = lambda ms, nbytes: nbytes / ms / 1e6
print(f"{'workload':<28}{'eager ms':>10}{'compile ms':>12}{'GB/s eager':>12}")
print(f"{'d2d copy 64 MiB':<28}{copy_ms:>10.3f}{'':>12}{gbs(copy_ms, 2 * x.numel() * 4):>12.0f}")
work = {
    "relu(x)*0.5+b [4096,4096]": (lambda x, b: torch.relu(x) * 0.5 + b, (x, b), 2 * x.numel() * 4),
    "softmax dim=-1": (lambda x: torch.softmax(x, -1), (x,), 2 * x.numel() * 4),
    "layer_norm": (lambda x: torch.nn.functional.layer_norm(x, (4096,)), (x,), 2 * x.numel() * 4),
    "sum dim=1": (lambda x: x.sum(1), (x,), x.numel() * 4),
}
for name, (f, args, nbytes) in work.items():
    e = bench(f, *args)
    try:
        c = bench(torch.compile(f), *args)
        cs = f"{c:>12.3f}"
    except Exception as ex:
        cs = f"{'failed':>12}"
    print(f"{name:<28}{e:>10.3f}{cs}{gbs(e, nbytes):>12.0f}")
PY
else
  echo "  PyTorch with CUDA not installed: reference timings skipped"
fi
echo "== done in $(( $(date +%s) - start )) s, status $status"
exit $status
