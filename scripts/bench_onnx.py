#!/usr/bin/env python3
"""smelt against onnxruntime on ONNX exports of real architectures, same machine, same run.

    python scripts/bench_onnx.py [--rounds 3] [--repeat 5] [--batches 1,32] [models...]

Run it with the peers' Python (`../shared/bench/setup.sh` prints it: torch, torchvision,
transformers, onnx, onnxruntime). It builds `target/release/smelt` if needed, exports each
model once with random weights (torch.onnx, opset 17, batch and sequence dims named) to
target/onnx-bench/, then for each model and batch alternates rounds of

  - smelt: `smelt run MODEL.onnx --repeat N` (import, fused JIT compile, N timed calls),
  - onnxruntime: one InferenceSession (ORT_ENABLE_ALL, intra-op threads = the CPU count),
    N timed calls,

and prints a Markdown table: the median of the rounds' median call times, with the range
over rounds, the ratio smelt / onnxruntime, and smelt's import + compile time against
onnxruntime's session creation. Models: resnet18, resnet50, mobilenet_v3 (large), vit_b_16,
bert_base (sequence 128), gpt2 (small, sequence 128).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np
import onnxruntime as ort
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "target", "onnx-bench")
SMELT = os.path.join(ROOT, "target", "release", "smelt")
SEQ = 128


class Logits(torch.nn.Module):
    """A transformers model returning only its first output (no caches). The attention mask
    of ones is made inside the graph: without one, transformers checks the positions with
    `torch.diff`, which the exporter cannot write."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(input_ids=ids, attention_mask=torch.ones_like(ids))[0]


def build(name):
    """The model in eval mode and whether it takes token ids."""
    torch.manual_seed(0)
    if name in ("resnet18", "resnet50", "vit_b_16"):
        import torchvision

        return getattr(torchvision.models, name)(weights=None), False
    if name == "mobilenet_v3":
        import torchvision

        return torchvision.models.mobilenet_v3_large(weights=None), False
    import transformers

    if name == "bert_base":
        cfg = transformers.BertConfig(attn_implementation="eager")
        return Logits(transformers.BertModel(cfg)), True
    if name == "gpt2":
        cfg = transformers.GPT2Config(use_cache=False, attn_implementation="eager")
        return Logits(transformers.GPT2LMHeadModel(cfg)), True
    raise SystemExit(f"unknown model {name}")


def example(text, batch, rng):
    if text:
        return rng.integers(0, 1000, size=(batch, SEQ)).astype(np.int64)
    return rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)


def export(name):
    """target/onnx-bench/<name>/model.onnx (made once)."""
    folder = os.path.join(CACHE, name)
    path = os.path.join(folder, "model.onnx")
    model, text = build(name)
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        model.eval()
        x = torch.from_numpy(example(text, 1, np.random.default_rng(0)))
        axes = {0: "batch", 1: "sequence"} if text else {0: "batch"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model, (x,), path, dynamo=False, opset_version=17,
                input_names=["input"], output_names=["output"],
                dynamic_axes={"input": axes, "output": {0: "batch"}},
            )
    return path, text


def time_smelt(path, npy, out, repeat):
    """(median call ms, load + compile ms) of one `smelt run --repeat` process."""
    cmd = [SMELT, "run", path, "--input", f"input={npy}", "--out", out, "--repeat", str(repeat)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    m = re.search(r"load and compile ([\d.]+) ms; \d+ calls: median ([\d.]+) ms", r.stderr)
    return float(m.group(2)), float(m.group(1))


def time_ort(session, x, repeat):
    session.run(None, {"input": x})
    ms = []
    for _ in range(repeat):
        t = time.perf_counter()
        session.run(None, {"input": x})
        ms.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ms)


def fmt(values):
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batches", default="1,32")
    p.add_argument("models", nargs="*",
                   default=["resnet18", "resnet50", "mobilenet_v3", "vit_b_16", "bert_base", "gpt2"])
    a = p.parse_args()
    if not os.path.exists(SMELT):
        subprocess.run(["cargo", "build", "--release", "--bin", "smelt"], cwd=ROOT, check=True)
    threads = os.cpu_count()
    print(f"CPU: {cpu_model()}; {threads} threads; onnxruntime {ort.__version__}", flush=True)
    print("| model | batch | smelt ms | onnxruntime ms | smelt / ort | smelt import+compile ms "
          "| ort session ms |")
    print("|---|---|---|---|---|---|---|")
    for name in a.models:
        path, text = export(name)
        for batch in [int(b) for b in a.batches.split(",")]:
            x = example(text, batch, np.random.default_rng(1))
            npy = os.path.join(CACHE, name, f"input_b{batch}.npy")
            np.save(npy, x)
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            opts.intra_op_num_threads = threads
            t = time.perf_counter()
            session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            session_ms = (time.perf_counter() - t) * 1e3
            repeat = a.repeat if batch == 1 else max(2, a.repeat // 2)
            smelt, ortt, compile_ms = [], [], []
            for r in range(a.rounds):
                sides = ["smelt", "ort"] if r % 2 == 0 else ["ort", "smelt"]
                for side in sides:
                    if side == "smelt":
                        ms, c = time_smelt(path, npy, os.path.join(CACHE, name, "out"), repeat)
                        smelt.append(ms)
                        compile_ms.append(c)
                    else:
                        ortt.append(time_ort(session, x, repeat))
            ratio = statistics.median(smelt) / statistics.median(ortt)
            print(f"| {name} | {batch} | {fmt(smelt)} | {fmt(ortt)} | {ratio:.2f} "
                  f"| {statistics.median(compile_ms):.0f} | {session_ms:.0f} |", flush=True)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
