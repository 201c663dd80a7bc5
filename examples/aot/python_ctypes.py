"""Runs a model compiled ahead of time as a shared library from Python, with NumPy and
ctypes only (no smelt package):

    smelt compile examples/models/mlp_block.smelt --target cpu --out DIR --name mlp --shared
    python examples/aot/python_ctypes.py DIR/libmlp.so DIR/manifest.json

Input j holds ((7 i + 3 j) mod 17 - 8) / 8 at element i, as in examples/aot/c/main.c, so
both print the same outputs. The manifest gives every input's and output's dtype and shape.

    python examples/aot/python_ctypes.py LIB MANIFEST INPUT.npy... --expect OUTPUT.npy [--tol T]

runs the model on inputs read from .npy files instead and checks its first output against
OUTPUT.npy (the JIT's, from `smelt run`): it prints the largest difference and fails above
T (1e-5 unless given).
"""

import ctypes
import json
import sys

import numpy as np

# smelt dtype -> NumPy dtype (bf16 has none: its 16-bit patterns travel as uint16)
DTYPES = {
    "f16": np.float16,
    "bf16": np.uint16,
    "f32": np.float32,
    "f64": np.float64,
    "bool": np.bool_,
    "u8": np.uint8,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
}


class Model:
    """A compiled model: call it with NumPy arrays, get NumPy arrays back."""

    def __init__(self, library, manifest):
        with open(manifest) as f:
            self.manifest = json.load(f)
        name = self.manifest["name"]
        lib = ctypes.CDLL(library)
        self._run = getattr(lib, f"{name}_run")
        self._run.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
            ctypes.c_size_t,
        ]
        self._run.restype = ctypes.c_int
        self._error = getattr(lib, f"{name}_error_string")
        self._error.argtypes = [ctypes.c_int]
        self._error.restype = ctypes.c_char_p
        # a scratch buffer of the model's size, 64-byte aligned: calls allocate nothing
        self.scratch_bytes = self.manifest["scratch_bytes"]
        raw = np.empty(self.scratch_bytes + 64, np.uint8)
        start = -raw.ctypes.data % 64
        self._scratch = raw[start : start + self.scratch_bytes]

    def __call__(self, *inputs):
        ports = self.manifest["inputs"]
        if len(inputs) != len(ports):
            raise ValueError(f"the model takes {len(ports)} inputs, got {len(inputs)}")
        arrays = []
        for x, p in zip(inputs, ports):
            a = np.ascontiguousarray(x, dtype=DTYPES[p["dtype"]])
            if list(a.shape) != p["shape"]:
                raise ValueError(f"input {p['name']}: shape {p['shape']} expected, got {list(a.shape)}")
            arrays.append(a)
        outputs = [np.empty(p["shape"], DTYPES[p["dtype"]]) for p in self.manifest["outputs"]]
        ins = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        outs = (ctypes.c_void_p * max(len(outputs), 1))(*[o.ctypes.data for o in outputs])
        rc = self._run(ins, outs, self._scratch.ctypes.data, self.scratch_bytes)
        if rc != 0:
            raise RuntimeError(self._error(rc).decode())
        return outputs


def example_input(port, j):
    """Input j of the C example: ((7 i + 3 j) mod 17 - 8) / 8 at element i."""
    n = int(np.prod(port["shape"], dtype=np.int64))
    i = np.arange(n, dtype=np.int64)
    values = ((7 * i + 3 * j) % 17 - 8) / 8.0
    return values.astype(DTYPES[port["dtype"]]).reshape(port["shape"])


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    model = Model(args[0], args[1])
    name = model.manifest["name"]
    if len(args) == 2:
        inputs = [example_input(p, j) for j, p in enumerate(model.manifest["inputs"])]
        for port, y in zip(model.manifest["outputs"], model(*inputs)):
            print(f"{name} {port['name']}: " + " ".join(f"{v:.6f}" for v in y.ravel()))
        return
    tol = 1e-5
    if len(args) > 2 and args[-2] == "--tol":
        tol = float(args[-1])
        args = args[:-2]
    if len(args) < 5 or args[-2] != "--expect":
        sys.exit(__doc__)
    got = model(*[np.load(f) for f in args[2:-2]])[0]
    want = np.load(args[-1])
    worst = float(np.max(np.abs(got.astype(np.float64) - want))) if got.size else 0.0
    equal = int(np.sum(got == want))
    print(f"{name} from Python: {equal} of {got.size} outputs equal the JIT's, largest difference {worst:.2e}")
    if not worst <= tol:
        sys.exit(1)


if __name__ == "__main__":
    main()
