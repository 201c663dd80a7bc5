"""The small CNN of tests/torch_cnn.rs in PyTorch, in float64: the same weights and batch
(read from the `.npy` files the test writes to DIR), three SGD steps (lr 0.1, momentum 0.9)
in training mode, then the logits in evaluation mode. Prints one line per result, a name
and its values: the losses, the first step's gradients (`grad.NAME`), the running
statistics and the evaluation logits.

Usage: python scripts/torch_cnn.py DIR   (needs torch and numpy; never run by CI)
"""

import sys

import numpy as np
import torch
import torch.nn.functional as F

NAMES = ["w1", "b1", "g1", "be1", "w2", "g2", "be2", "wl", "bl"]


def main():
    d = sys.argv[1]
    load = lambda n: torch.from_numpy(np.load(f"{d}/{n}.npy"))
    p = {n: load(n).requires_grad_(True) for n in NAMES}
    x, y = load("x"), load("y")
    stats = {n: load(n) for n in ["rm1", "rv1", "rm2", "rv2"]}

    def forward(training):
        h = F.conv2d(x, p["w1"], p["b1"], padding=1)
        h = F.batch_norm(h, stats["rm1"], stats["rv1"], p["g1"], p["be1"], training, 0.1, 1e-5)
        h = F.max_pool2d(F.relu(h), 3, stride=2, padding=1, ceil_mode=True)
        r = F.conv2d(h, p["w2"], None, padding="same", dilation=2, groups=2)
        r = F.batch_norm(r, stats["rm2"], stats["rv2"], p["g2"], p["be2"], training, 0.1, 1e-5)
        h = F.relu(r + h)
        h = F.avg_pool2d(h, 2, padding=1, ceil_mode=True, count_include_pad=False)
        h = F.adaptive_avg_pool2d(h, (2, 2)).flatten(1)
        return F.linear(h, p["wl"], p["bl"])

    opt = torch.optim.SGD(p.values(), lr=0.1, momentum=0.9)
    losses, grads = [], {}
    for step in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(forward(True), y)
        loss.backward()
        if step == 0:
            grads = {n: p[n].grad.flatten().tolist() for n in NAMES}
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        logits = forward(False)
    line = lambda name, vals: print(name, " ".join(repr(float(v)) for v in vals))
    line("losses", losses)
    for n, g in grads.items():
        line(f"grad.{n}", g)
    for n, t in stats.items():
        line(n, t.flatten().tolist())
    line("logits", logits.flatten().tolist())


if __name__ == "__main__":
    main()
