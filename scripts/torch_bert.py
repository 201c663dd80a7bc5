"""The BERT-sized encoder of `cargo bench --bench bert` in PyTorch (6 post-norm layers,
width 384, 12 heads, FFN 1536, exact GELU, random weights; x [32, 128, 384]; inference),
eager and torch.compile'd, timed on request so that the bench alternates rounds of smelt
and PyTorch in one run.

The protocol is scripts/peer_protocol.py's. Needs torch (not installed by CI: a comparison, not a test).
"""

import torch
import torch.nn.functional as F

from peer_protocol import serve

B, T, D, H, FF, L = 32, 128, 384, 12, 1536, 6


def make_layers():
    w = lambda *s: torch.randn(*s) * 0.02
    return [dict(wq=w(D, D), bq=w(D), wk=w(D, D), bk=w(D), wv=w(D, D), bv=w(D),
                 wo=w(D, D), bo=w(D), g1=torch.ones(D), e1=w(D), w1=w(FF, D), b1=w(FF),
                 w2=w(D, FF), b2=w(D), g2=torch.ones(D), e2=w(D)) for _ in range(L)]


def encoder(x, layers):
    dh = D // H
    for p in layers:
        heads = [F.linear(x, p["w" + n], p["b" + n]).reshape(B, T, H, dh).transpose(1, 2)
                 for n in "qkv"]
        a = F.scaled_dot_product_attention(*heads).transpose(1, 2).reshape(B, T, D)
        x = F.layer_norm(x + F.linear(a, p["wo"], p["bo"]), (D,), p["g1"], p["e1"], 1e-12)
        f = F.linear(F.gelu(F.linear(x, p["w1"], p["b1"])), p["w2"], p["b2"])
        x = F.layer_norm(x + f, (D,), p["g2"], p["e2"], 1e-12)
    return x


def setup(_args):
    layers = make_layers()
    x = torch.randn(B, T, D)
    compiled = torch.compile(encoder)

    def eager():
        with torch.no_grad():
            encoder(x, layers)

    def comp():
        with torch.no_grad():
            compiled(x, layers)

    return {"torch eager": eager, "torch.compile": comp}


if __name__ == "__main__":
    torch.set_num_threads(2)
    torch.manual_seed(0)
    serve(setup)
