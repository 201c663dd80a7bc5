"""The GPT of examples/gpt.rs and the ResNet of examples/resnet.rs in PyTorch, from the
initial weights and batches that `cargo bench --bench models` writes: the first 20 losses
(GPT: AdamW with clipping at 1.0; ResNet: SGD with momentum, dropout off) compared with
smelt's compiled step, and the per-step time of PyTorch eager and torch.compile, with the
peak memory of one step: the most bytes PyTorch's CPU allocator held at once beyond what it
held when the step began, from the profiler's allocation events (the measure of smelt's
profiler in `cargo bench --bench models`).

Usage: python scripts/torch_models.py [DIR] [gpt|resnet|both]
(DIR defaults to target/models-bench; both models by default)
Needs torch and numpy (not installed by CI: this is a comparison, not a test of CI's).
"""

import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CTX, WIDTH, HEADS, LAYERS, BATCH, STEPS = 13, 32, 96, 4, 2, 32, 20


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.proj = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.zeros(CTX, WIDTH))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        x = self.tok(idx) + self.pos[:t]
        for b in self.blocks:
            x = b(x, mask)
        return self.ln_f(x) @ self.tok.weight.t()


def load(model, d):
    """smelt's names → this module's parameters."""
    names = {
        "tok.weight": "tok.weight",
        "pos": "pos",
        "ln_f.weight": "ln_f.weight",
        "ln_f.bias": "ln_f.bias",
    }
    for i in range(LAYERS):
        for part in ["ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "fc.weight", "fc.bias",
                     "proj.weight", "proj.bias", "attn.in_proj_weight", "attn.in_proj_bias",
                     "attn.out_proj.weight", "attn.out_proj.bias"]:
            names[f"blocks.{i}.{part}"] = f"blocks.{i}.{part}"
    params = dict(model.named_parameters())
    with torch.no_grad():
        for smelt_name, ours in names.items():
            params[ours].copy_(torch.from_numpy(np.load(os.path.join(d, f"param.{smelt_name}.npy"))))
    assert len(params) == len(names), sorted(set(params) - set(names.values()))


def step_peak(run, x, y):
    """Peak bytes allocated beyond the start during one call of run(x, y), or None."""
    if os.environ.get("SMELT_SKIP_TIMING"):
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        run(x, y)
    try:
        events = [e for e in p.profiler.kineto_results.events() if e.name() == "[memory]"]
    except AttributeError:  # the profiler's raw events moved
        return None
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def mb(peak):
    return "–" if peak is None else f"{peak / 1e6:.2f} MB"


def train(model, batches, step_fn=None):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, times = [], []

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    run = step_fn(step) if step_fn else step
    for x, y in batches:
        t0 = time.perf_counter()
        loss = run(x, y)
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
    return losses, times, step_peak(run, *batches[0])


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.proj = None
        if cin != cout or stride != 1:
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.proj(x) if self.proj is not None else x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.blocks = nn.ModuleList([BasicBlock(16, 16, 1), BasicBlock(16, 32, 2)])
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = F.relu(self.bn(self.stem(x)))
        for b in self.blocks:
            h = b(h)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def resnet(d):
    """The ResNet's losses against smelt's compiled step, then eager and compiled timings."""
    batches = [(torch.from_numpy(np.load(os.path.join(d, f"resnet.x{i}.npy"))),
                torch.from_numpy(np.load(os.path.join(d, f"resnet.y{i}.npy")))) for i in range(STEPS)]
    smelt = np.load(os.path.join(d, "resnet.losses_compiled.npy"))

    def fresh(fmt=torch.contiguous_format):
        model = ResNet()
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(torch.from_numpy(np.load(os.path.join(d, f"resnet.param.{name}.npy"))))
        return model.to(memory_format=fmt)

    def train(model, fmt=torch.contiguous_format, step_fn=None):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        run = step_fn(step) if step_fn else step
        losses, times = [], []
        for x, y in batches:
            x = x.contiguous(memory_format=fmt)
            t0 = time.perf_counter()
            loss = run(x, y)
            times.append((time.perf_counter() - t0) * 1e3)
            losses.append(loss.item())
        return losses, times, step_peak(run, batches[0][0].contiguous(memory_format=fmt), batches[0][1])

    losses, t_nchw, p_nchw = train(fresh())
    gap = max(abs(a - b) for a, b in zip(losses, smelt))
    print(f"ResNet: first {STEPS} losses, PyTorch: {losses[0]:.4f} → {losses[-1]:.4f}; smelt compiled: "
          f"{smelt[0]:.4f} → {smelt[-1]:.4f}; largest gap {gap:.1e}")
    ok = gap <= 1e-3 * max(1.0, max(abs(x) for x in losses))
    print("the ResNet losses agree within float32 tolerance" if ok else "THE RESNET LOSSES DISAGREE")
    if os.environ.get("SMELT_SKIP_TIMING"):
        return ok
    _, t_cl, p_cl = train(fresh(torch.channels_last), torch.channels_last)
    try:
        _, t_comp, p_comp = train(fresh(), step_fn=torch.compile)
        comp = f"{summary(t_comp[3:])} | {mb(p_comp)}"
    except Exception as e:  # torch.compile needs a working C++ toolchain
        comp = f"unavailable ({type(e).__name__}) | –"
    print("| step | time per step (median, range) | peak memory of one step |")
    print("|---|---|---|")
    print(f"| PyTorch eager NCHW | {summary(t_nchw[2:])} | {mb(p_nchw)} |")
    print(f"| PyTorch eager channels_last | {summary(t_cl[2:])} | {mb(p_cl)} |")
    print(f"| torch.compile NCHW | {comp} |")
    return ok


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "target", "models-bench")
    which = sys.argv[2] if len(sys.argv) > 2 else "both"
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    ok = True
    if which in ("gpt", "both"):
        ok = gpt(d) and ok
    if which in ("resnet", "both"):
        ok = resnet(d) and ok
    sys.exit(0 if ok else 1)


def gpt(d):
    """The GPT's losses against smelt's compiled step, then eager and compiled timings."""
    batches = [(torch.from_numpy(np.load(os.path.join(d, f"x{i}.npy"))),
                torch.from_numpy(np.load(os.path.join(d, f"y{i}.npy")))) for i in range(STEPS)]
    smelt = np.load(os.path.join(d, "losses_compiled.npy"))
    model = Gpt()
    load(model, d)
    losses, t_eager, p_eager = train(model, batches)
    gap = max(abs(a - b) for a, b in zip(losses, smelt))
    print(f"first {STEPS} losses, PyTorch: {losses[0]:.4f} → {losses[-1]:.4f}; smelt compiled: "
          f"{smelt[0]:.4f} → {smelt[-1]:.4f}; largest gap {gap:.1e}")
    ok = gap <= 1e-3 * max(1.0, max(abs(x) for x in losses))
    print("the losses agree within float32 tolerance" if ok else "THE LOSSES DISAGREE")
    if os.environ.get("SMELT_SKIP_TIMING"):
        return ok
    compiled = Gpt()
    load(compiled, d)
    try:
        _, t_comp, p_comp = train(compiled, batches, step_fn=torch.compile)
        comp = f"{summary(t_comp[3:])} | {mb(p_comp)}"
    except Exception as e:  # torch.compile needs a working C++ toolchain
        comp = f"unavailable ({type(e).__name__}) | –"
    print("| step | time per step (median, range) | peak memory of one step |")
    print("|---|---|---|")
    print(f"| PyTorch eager | {summary(t_eager[2:])} | {mb(p_eager)} |")
    print(f"| torch.compile | {comp} |")
    return ok


def summary(t):
    t = sorted(t)
    return f"{statistics.median(t):.2f} ms ({t[0]:.2f}–{t[-1]:.2f})"


if __name__ == "__main__":
    main()
