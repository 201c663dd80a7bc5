"""`smelt.onnx.load`: an ONNX model as a callable compiled by smelt."""

from __future__ import annotations

from . import _smelt
from ._tensor import Tensor

__all__ = ["load", "Model"]


class Model:
    """An ONNX model: call it with its inputs (smelt tensors or any DLPack producer's),
    positionally in the model's order or by name; it returns the outputs as a list. Each new
    input shape is imported and compiled once, then cached."""

    def __init__(self, native):
        self._m = native

    @property
    def input_names(self) -> list[str]:
        return self._m.input_names

    @property
    def compiles(self) -> int:
        return self._m.compiles

    def __call__(self, *inputs, **named):
        def raw(x):
            return x._t if isinstance(x, Tensor) else x

        outs = self._m(*[raw(x) for x in inputs], **{k: raw(v) for k, v in named.items()})
        return [Tensor(t) for t in outs]


def load(path: str, fuse: bool = True, device: str = "cpu", fast_math: bool = False) -> Model:
    """Reads `path` (external data from beside it) for smelt to run on `device`
    (`fast_math` as for `smelt.compile`)."""
    return Model(_smelt.onnx_load(str(path), fuse=fuse, device=device, fast_math=fast_math))
