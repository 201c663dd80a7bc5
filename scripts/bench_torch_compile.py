#!/usr/bin/env python3
"""`torch.compile(backend="smelt")` against `backend="inductor"`, same machine, same run.

    python scripts/bench_torch_compile.py [--rounds 5] [--repeat 5] [--batches 1,32]
                                          [--isa native|avx2] [models...]

Needs the smelt package installed (`pip install ./python`, a release build) next to torch,
torchvision and transformers. Models (random weights): resnet18 (224×224 images), bert
(BERT-base, 32 tokens), gpt2 (GPT-2 small, 32 tokens). Each figure comes from processes of
its own, so that no compile cache of either side is warm:

  - cold compile: the first call of the compiled model at batch 1, minus an eager call,
    with both sides' disk caches off; the two backends alternate over `--compile-rounds`;
  - time per call: both compiled in one process, then rounds alternate between them, each
    round timing `--repeat` calls after a warm-up; the median of the rounds' medians and
    the range over rounds are printed, with the ratio smelt / inductor;
  - binding overhead: a one-op graph on 16 floats called from Python (`smelt.compile`)
    against the same graph timed from Rust by `smelt profile`.

`--isa avx2` runs both sides on AVX2: smelt with `SMELT_CPU=avx2` (install the package built
without AVX-512 GEMMs first: `MATURIN_PEP517_ARGS=--no-default-features pip install ./python`),
PyTorch capped with `ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
ONEDNN_MAX_CPU_ISA=AVX2`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = ["resnet18", "bert", "gpt2"]
SEQ = 32


def build(name, batch):
    import torch

    torch.manual_seed(0)
    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18().eval(), (torch.randn(batch, 3, 224, 224),)
    import transformers as tr

    ids = torch.randint(0, 1000, (batch, SEQ))
    if name == "bert":
        return tr.BertModel(tr.BertConfig()).eval(), (ids,)
    if name == "gpt2":
        return tr.GPT2LMHeadModel(tr.GPT2Config(use_cache=False)).eval(), (ids,)
    raise SystemExit(f"unknown model {name}")


def timed(f, args):
    t = time.perf_counter()
    f(*args)
    return time.perf_counter() - t


def child_compile(name, backend):
    """Prints the seconds the first compiled call takes beyond an eager call."""
    import torch

    m, args = build(name, 1)
    with torch.no_grad():
        m(*args)
        eager = min(timed(m, args) for _ in range(3))
        c = torch.compile(m, backend=backend)
        first = timed(c, args)
    print(json.dumps({"compile_s": first - eager}))


def child_calls(name, batch, rounds, repeat):
    """Prints each backend's median call time per round, the rounds alternating."""
    import torch

    m, args = build(name, batch)
    out = {"smelt": [], "inductor": []}
    with torch.no_grad():
        fns = {b: torch.compile(m, backend=b) for b in out}
        for f in fns.values():
            f(*args)
            f(*args)
        for r in range(rounds):
            order = list(fns) if r % 2 == 0 else list(fns)[::-1]
            for b in order:
                out[b].append(statistics.median(timed(fns[b], args) for _ in range(repeat)))
    print(json.dumps(out))


def child_binding(repeat):
    """Seconds per call of a one-op graph from Python, and from Rust (`smelt profile`)."""
    import numpy as np

    import smelt

    text = "graph f(%x: f32[16]) {\n  %y = add(%x, 1.0)\n  return %y\n}\n"
    f = smelt.compile(text)
    x = smelt.from_numpy(np.ones(16, np.float32))
    for _ in range(1000):
        f(x)
    py = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(10000):
            f(x)
        py.append((time.perf_counter() - t) / 10000)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.smelt")
        with open(path, "w") as fh:
            fh.write(text)
        smelt.cli("profile", path, "--repeat", "10000", "--json", os.path.join(d, "p.json"))
        with open(os.path.join(d, "p.json")) as fh:
            prof = json.load(fh)
    print(json.dumps({"python_s": statistics.median(py), "rust": prof}))


def run_child(args, env):
    out = subprocess.run([sys.executable, __file__, "--child", *args], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def fmt(seconds):
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="*", default=MODELS)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--compile-rounds", type=int, default=2)
    p.add_argument("--batches", default="1,32")
    p.add_argument("--isa", choices=["native", "avx2"], default="native")
    p.add_argument("--child", nargs="+")
    a = p.parse_args()
    if a.child:
        kind, *rest = a.child
        if kind == "compile":
            child_compile(rest[0], rest[1])
        elif kind == "calls":
            child_calls(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
        else:
            child_binding(int(rest[0]))
        return
    env = dict(os.environ, SMELT_CACHE_DIR="off", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    if a.isa == "avx2":
        env.update(SMELT_CPU="avx2", ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2",
                   ONEDNN_MAX_CPU_ISA="AVX2")
    print(f"{cpu_model()}, {os.cpu_count()} threads, ISA {a.isa}\n")
    print("| model | batch | smelt | inductor | smelt / inductor |")
    print("|---|---|---|---|---|")
    for name in a.models:
        comp = {"smelt": [], "inductor": []}
        for r in range(a.compile_rounds):
            for b in (["smelt", "inductor"] if r % 2 == 0 else ["inductor", "smelt"]):
                comp[b].append(run_child(["compile", name, b], env)["compile_s"])
        s, i = statistics.median(comp["smelt"]), statistics.median(comp["inductor"])
        print(f"| {name} compile (cold) | 1 | {s:.2f} s | {i:.2f} s | {s / i:.3f} |", flush=True)
        for batch in [int(b) for b in a.batches.split(",")]:
            calls = run_child(["calls", name, str(batch), str(a.rounds), str(a.repeat)], env)
            s, i = statistics.median(calls["smelt"]), statistics.median(calls["inductor"])
            ratios = [x / y for x, y in zip(calls["smelt"], calls["inductor"])]
            print(f"| {name} | {batch} | {fmt(s)} | {fmt(i)} | {s / i:.2f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f}) |", flush=True)
    b = run_child(["binding", "7"], env)
    py, rust = b["python_s"] * 1e6, b["rust"]["fused"]["median_ms"] * 1e3
    print(f"\nbinding: a one-op graph on 16 floats takes {py:.2f} µs per call from Python "
          f"and {rust:.2f} µs from Rust (smelt profile): {py - rust:.2f} µs added")


if __name__ == "__main__":
    main()
