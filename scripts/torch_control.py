"""PyTorch's gradients of `torch.cond` and of the higher-order `scan` for
tests/torch_control.rs: reads one case as JSON on stdin and prints the gradients as JSON.

cond: {"case": "cond", "p": bool, "x": [3 floats], "y": [3 floats]}: then = exp(x * y),
else = (x - y)^2; the gradients of the sum of the result with respect to x and y.
scan: {"case": "scan", "c": [3], "w": [3], "xs": [[3] * T], "reverse": bool}: carries
(c, w), body (c, w, x) -> (tanh(c * w + x), w, tanh(c * w + x) * x); the gradients of
sum(final c) + sum(ys) with respect to c, w and xs.
"""

import json
import sys

import torch
from torch._higher_order_ops.scan import scan


def main():
    case = json.loads(sys.stdin.read())
    f64 = lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True)  # noqa: E731
    if case["case"] == "cond":
        x, y = f64(case["x"]), f64(case["y"])
        z = torch.cond(
            torch.tensor(case["p"]),
            lambda a, b: torch.exp(a * b),
            lambda a, b: (a - b) ** 2,
            (x, y),
        )
        z.sum().backward()
        print(json.dumps({"x": x.grad.tolist(), "y": y.grad.tolist()}))
        return
    c, w, xs = f64(case["c"]), f64(case["w"]), f64(case["xs"])

    def body(carry, x):
        c, w = carry
        t = torch.tanh(c * w + x)
        return (t, w.clone()), t * x

    (cf, _), ys = scan(body, (c, w), xs, reverse=case["reverse"])
    (cf.sum() + ys.sum()).backward()
    print(json.dumps({"c": c.grad.tolist(), "w": w.grad.tolist(), "xs": xs.grad.tolist()}))


if __name__ == "__main__":
    main()
