"""The ResNet basic block of `cargo bench --bench resnet_block` in PyTorch, timed on
request so that the bench can alternate rounds of smelt and PyTorch in one run.

Protocol (one line per message): the bench writes `setup N` (batch size), the script
builds the block in NCHW and channels_last, eager and torch.compile'd, warms every variant
up and answers `ready`; then each `round` line is answered with one JSON object of
median milliseconds per variant; `quit` ends it.

Needs torch (not installed by CI: a comparison, not a test).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from peer_protocol import serve


class Block(nn.Module):
    """conv3x3-bn-relu-conv3x3-bn + residual add + relu, 64 channels, training mode."""

    def __init__(self, c=64):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c, track_running_stats=False)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c, track_running_stats=False)

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(h)) + x)


def setup(args):
    n = int(args[0])
    variants = {}
    for fmt_name, fmt in [("nchw", torch.contiguous_format), ("cl", torch.channels_last)]:
        block = Block().to(memory_format=fmt)
        compiled = torch.compile(block)
        x = torch.randn(n, 64, 56, 56).to(memory_format=fmt)
        gy = torch.randn(n, 64, 56, 56).to(memory_format=fmt)
        xg = x.clone().requires_grad_(True)

        def fwd(m=block, x=x):
            with torch.no_grad():
                m(x)

        def fwd_bwd(m=block, x=xg, gy=gy):
            m.zero_grad(set_to_none=True)
            x.grad = None
            m(x).backward(gy)

        def cfwd(m=compiled, x=x):
            with torch.no_grad():
                m(x)

        def cfwd_bwd(m=compiled, x=xg, gy=gy):
            m.zero_grad(set_to_none=True)
            x.grad = None
            m(x).backward(gy)

        variants[f"torch eager {fmt_name} fwd"] = fwd
        variants[f"torch eager {fmt_name} fwd+bwd"] = fwd_bwd
        variants[f"torch.compile {fmt_name} fwd"] = cfwd
        variants[f"torch.compile {fmt_name} fwd+bwd"] = cfwd_bwd
    return variants


if __name__ == "__main__":
    torch.set_num_threads(2)
    torch.manual_seed(0)
    serve(setup)
