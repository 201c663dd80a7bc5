#!/usr/bin/env python3
"""Two builds of `smelt` side by side: `smelt profile --json` of the same models, the builds
taking turns round after round, and per model the median and range of B's time over A's
(fused, unfused and eager). Absolute times on a shared machine drift; ratios of turns taken
side by side hold.

    python3 scripts/ab_builds.py OLD/smelt NEW/smelt [--rounds 3] [--repeat 20] [MODEL.smelt ...]

Without models it times the peer benchmark's workloads (relu chain, both GELUs, softmax,
layer_norm, sums, the MLP forward) on random inputs. Needs Python 3 only.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

WORKLOADS = {
    "relu_chain": "graph a(%x: f32[4096,4096], %b: f32[4096]) {\n  %r = relu(%x)\n  %m = mul(%r, 0.5)\n"
                  "  %y = add(%m, %b)\n  return %y\n}\n",
    "gelu_tanh": "graph b(%x: f32[4096,4096]) {\n  %y = gelu(%x, approximate=\"tanh\")\n  return %y\n}\n",
    "gelu_erf": "graph b(%x: f32[4096,4096]) {\n  %y = gelu(%x)\n  return %y\n}\n",
    "softmax": "graph c(%x: f32[4096,4096]) {\n  %y = softmax(%x, dim=-1)\n  return %y\n}\n",
    "layer_norm": "graph d(%x: f32[16384,1024], %w: f32[1024], %b: f32[1024]) {\n"
                  "  %y = layer_norm(%x, %w, %b, normalized_shape=[1024], eps=1e-5)\n  return %y\n}\n",
    "sum_dim1": "graph e(%x: f32[4096,4096]) {\n  %y = sum(%x, dim=[1])\n  return %y\n}\n",
    "sum_all": "graph e(%x: f32[4096,4096]) {\n  %y = sum(%x)\n  return %y\n}\n",
    "mlp_fwd": "graph f(%x: f32[256,1024], %W1: f32[1024,4096], %b1: f32[4096], %W2: f32[4096,1024], "
               "%b2: f32[1024]) {\n  %h = matmul(%x, %W1)\n  %hb = add(%h, %b1)\n"
               "  %g = gelu(%hb, approximate=\"tanh\")\n  %o = matmul(%g, %W2)\n  %y = add(%o, %b2)\n"
               "  return %y\n}\n",
}
WAYS = ("fused", "unfused", "eager")


def profile(binary, model, repeat, tmp):
    out = os.path.join(tmp, "profile.json")
    if os.path.exists(out):
        os.remove(out)
    r = subprocess.run([binary, "profile", model, "--random-inputs", "--no-check",
                        "--repeat", str(repeat), "--json", out], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{binary} profile {model}: {r.stderr.strip()[-300:]}")
    j = json.load(open(out))
    return {w: float(j[w]["median_ms"]) for w in WAYS}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the first build's smelt binary (the baseline)")
    ap.add_argument("b", help="the second build's smelt binary")
    ap.add_argument("models", nargs="*", help=".smelt files (default: the peer workloads)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_intermixed_args()
    tmp = tempfile.mkdtemp(prefix="smelt-ab-")
    models = {os.path.basename(m): m for m in a.models}
    if not models:
        for name, text in WORKLOADS.items():
            path = os.path.join(tmp, name + ".smelt")
            open(path, "w").write(text)
            models[name] = path
    ratios = {m: {w: [] for w in WAYS} for m in models}
    times = {m: {"a": [], "b": []} for m in models}
    for _ in range(a.rounds):
        for name, path in models.items():
            ta = profile(a.a, path, a.repeat, tmp)
            tb = profile(a.b, path, a.repeat, tmp)
            times[name]["a"].append(ta["fused"])
            times[name]["b"].append(tb["fused"])
            for w in WAYS:
                ratios[name][w].append(tb[w] / ta[w])
    print(f"{'model':14} {'A fused ms':>10} {'B fused ms':>10}  " +
          "  ".join(f"{'B/A ' + w:>20}" for w in WAYS) + f"   ({a.rounds} rounds, median and range)")
    for name in models:
        cells = []
        for w in WAYS:
            r = ratios[name][w]
            cells.append(f"{statistics.median(r):6.3f} ({min(r):.3f}-{max(r):.3f})")
        print(f"{name:14} {statistics.median(times[name]['a']):10.3f} "
              f"{statistics.median(times[name]['b']):10.3f}  " + "  ".join(f"{c:>20}" for c in cells))


if __name__ == "__main__":
    main()
