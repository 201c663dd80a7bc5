"""GPU benchmark helper for scripts/gpu-check.sh.

`python3 gpu_bench.py torch OUT.json` times the workloads of benches/models/gpu.smelt in
PyTorch (eager and torch.compile, CUDA events, medians) and the device-to-device copy.
`python3 gpu_bench.py table DIR` reads DIR/torch.json and the `smelt profile --json` files
DIR/smelt_NAME.json and prints one table.
"""

import json
import os
import statistics
import sys
import time


def workloads(torch):
    F = torch.nn.functional
    dev = "cuda"
    n = 8192

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=dev, dtype=dtype)

    x, b = rnd(n, n), rnd(n)
    h = 4096
    xm, w1, b1, w2, b2 = rnd(h, h), rnd(h, h), rnd(h), rnd(h, h), rnd(h)
    a16, b16 = rnd(n, n, dtype=torch.bfloat16), rnd(n, n, dtype=torch.bfloat16)
    cx, cw, cb = rnd(32, 64, 56, 56), rnd(64, 64, 3, 3), rnd(64)
    conv = lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1))  # noqa: E731
    return {
        "chain": (lambda x, b: torch.relu(x) * 0.5 + b, (x, b)),
        "chain4": (lambda x, b: torch.tanh(x * 1.5 + b) * 0.5, (x, b)),
        "gelu": (lambda x: F.gelu(x, approximate="tanh"), (x,)),
        "softmax": (lambda x: torch.softmax(x, -1), (x,)),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5), (x, b, b)),
        "rowsum": (lambda x: x.sum(1), (x,)),
        "colsum": (lambda x: x.sum(0), (x,)),
        "mlp": (
            lambda x, w1, b1, w2, b2: F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2),
            (xm, w1, b1, w2, b2),
        ),
        "matmul_bf16": (lambda a, b: a @ b, (a16, b16)),
        "conv": (conv, (cx, cw, cb)),
        "conv_bf16": (conv, tuple(t.to(torch.bfloat16) for t in (cx, cw, cb))),
    }


def timed(torch, f, args, n=20):
    for _ in range(3):
        f(*args)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(n):
        s.record()
        f(*args)
        e.record()
        e.synchronize()
        ms.append(s.elapsed_time(e))
    return statistics.median(ms)


def run_torch(out_path, budget_s=100.0):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    start = time.time()
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    src = torch.empty(1 << 28, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = timed(torch, lambda: dst.copy_(src), ())
    res["copy_gbps"] = 2 * src.numel() * 4 / copy_ms / 1e6
    res["eager_ms"], res["compile_ms"] = {}, {}
    work = workloads(torch)
    only = os.environ.get("GPU_BENCH_WORKLOADS", "").split()
    if only:
        work = {k: v for k, v in work.items() if k in only}
    for name, (f, args) in work.items():
        res["eager_ms"][name] = timed(torch, f, args)
    with open(out_path, "w") as fh:
        json.dump(res, fh)
    # the fusion showcases first: torch.compile takes seconds per graph
    order = ["chain4", "softmax", "layer_norm", "conv", "chain", "gelu", "rowsum", "colsum", "mlp", "matmul_bf16", "conv_bf16"]
    for name in order:
        if name not in work:
            continue
        f, args = work[name]
        if time.time() - start > budget_s:
            print(f"torch.compile: time budget spent, {name} and later skipped", flush=True)
            break
        try:
            res["compile_ms"][name] = timed(torch, torch.compile(f), args)
        except Exception as ex:  # noqa: BLE001 - report and go on
            print(f"torch.compile {name}: {ex}", flush=True)
        with open(out_path, "w") as fh:
            json.dump(res, fh)


CONV_FLOPS = 2 * 32 * 64 * 56 * 56 * 64 * 9
FLOPS = {"mlp": 2 * 2 * 4096**3, "matmul_bf16": 2 * 8192**3, "conv": CONV_FLOPS, "conv_bf16": CONV_FLOPS}


def table(d):
    t = json.load(open(os.path.join(d, "torch.json"))) if os.path.exists(os.path.join(d, "torch.json")) else {}
    copy = t.get("copy_gbps")
    print(f"GPU: {t.get('device', '?')}, torch {t.get('torch', '?')}, torch d2d copy {copy or float('nan'):.0f} GB/s")
    head = f"{'graph':<12}{'fused':>9}{'unfused':>9}{'s.eager':>9}{'t.eager':>9}{'t.comp':>9}{'GB/s':>8}{'%copy':>7}{'vs t.eager':>11}{'TFLOP/s':>9}{'compile':>9}"
    print(head)
    for name in workloads_names():
        p = os.path.join(d, f"smelt_{name}.json")
        if not os.path.exists(p):
            print(f"{name:<12} (no smelt figures)")
            continue
        s = json.load(open(p))
        fu, un, ea = s["fused"]["median_ms"], s["unfused"]["median_ms"], s["eager"]["median_ms"]
        te = t.get("eager_ms", {}).get(name, float("nan"))
        tc = t.get("compile_ms", {}).get(name, float("nan"))
        gbs = s["bytes_min"] / fu / 1e6 if fu > 0 else float("nan")
        ref = copy or s.get("copy_gbps", float("nan"))
        tf = FLOPS.get(name, 0) / fu / 1e9 if name in FLOPS and fu > 0 else float("nan")
        print(
            f"{name:<12}{fu:>9.3f}{un:>9.3f}{ea:>9.3f}{te:>9.3f}{tc:>9.3f}{gbs:>8.0f}{100 * gbs / ref:>6.1f}%"
            f"{te / fu:>10.2f}x{tf:>9.1f}{s['compile_ms']:>7.0f}ms"
        )
    for name in ["conv", "conv_bf16"]:
        p = os.path.join(d, f"smelt_{name}_generated.json")
        if os.path.exists(p):
            g = json.load(open(p))["fused"]["median_ms"]
            print(f"{name}: generated kernel (SMELT_CUDNN=0) {g:.3f} ms, {CONV_FLOPS / g / 1e9:.1f} TFLOP/s")
    print("times in ms (medians, CUDA events); fused/unfused/s.eager = smelt, t.* = PyTorch;")
    print("GB/s = inputs read once + outputs written once over the fused time; %copy against the copy above")


def workloads_names():
    return ["chain", "chain4", "gelu", "softmax", "layer_norm", "rowsum", "colsum", "mlp", "matmul_bf16", "conv", "conv_bf16"]


if __name__ == "__main__":
    if sys.argv[1] == "torch":
        run_torch(sys.argv[2])
    else:
        table(sys.argv[2])
