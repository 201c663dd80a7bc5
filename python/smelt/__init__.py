"""smelt from Python: tensors that share memory with NumPy and PyTorch, graphs compiled by
smelt's fusing compiler, and a `torch.compile` backend (`backend="smelt"`).

    >>> import smelt
    >>> x = smelt.arange(6.0).reshape(2, 3)
    >>> (x * 2).sum(dim=1).tolist()
    [6.0, 24.0]
"""

from __future__ import annotations

from . import _smelt, onnx
from ._extras import cli, compile_aot, profile
from ._tensor import Tensor, dtype, _DTYPES, _dtype_name, _call, _sizes

__version__ = _smelt.__version__

bool = _DTYPES["bool"]  # noqa: A001 - PyTorch's names
uint8 = _DTYPES["u8"]
int8 = _DTYPES["i8"]
int16 = _DTYPES["i16"]
int32 = _DTYPES["i32"]
int64 = long = _DTYPES["i64"]
float16 = half = _DTYPES["f16"]
bfloat16 = _DTYPES["bf16"]
float32 = float = _DTYPES["f32"]  # noqa: A001
float64 = double = _DTYPES["f64"]


# --- creation
def tensor(data, dtype=None) -> Tensor:
    """`torch.tensor`: a new tensor from (nested lists of) Python numbers."""
    shape, flat = [], []

    def walk(x, depth):
        if isinstance(x, (list, tuple)):
            if len(shape) == depth:
                shape.append(len(x))
            elif shape[depth] != len(x):
                raise ValueError(f"expected sequence of length {shape[depth]} at dim {depth} (got {len(x)})")
            for y in x:
                walk(y, depth + 1)
        else:
            if len(shape) != depth:
                raise ValueError("nested lists of unequal depth")
            flat.append(x)

    walk(data, 0)
    d = None if dtype is None else _dtype_name(dtype)
    return Tensor(_smelt.from_values(flat, shape, d))


def zeros(*size, dtype=float32) -> Tensor:
    return _call("full", size=_sizes(size), fill_value=0, dtype=_dtype_name(dtype))


def ones(*size, dtype=float32) -> Tensor:
    return _call("full", size=_sizes(size), fill_value=1, dtype=_dtype_name(dtype))


def full(size, fill_value, dtype=None) -> Tensor:
    d = None if dtype is None else _dtype_name(dtype)
    return _call("full", size=list(size), fill_value=fill_value, dtype=d)


def arange(start, end=None, step=1, dtype=None) -> Tensor:
    if end is None:
        start, end = 0, start
    d = None if dtype is None else _dtype_name(dtype)
    return _call("arange", start=start, end=end, step=step, dtype=d)


def rand(*size, dtype=float32) -> Tensor:
    return Tensor(_smelt.random(_sizes(size), _dtype_name(dtype), False))


def randn(*size, dtype=float32) -> Tensor:
    return Tensor(_smelt.random(_sizes(size), _dtype_name(dtype), True))


def manual_seed(seed: int) -> None:
    _smelt.manual_seed(seed)


# --- other libraries' tensors, without copies
def from_dlpack(x) -> Tensor:
    """A smelt tensor over the memory of any DLPack producer (PyTorch, NumPy, JAX)."""
    return Tensor(_smelt.from_dlpack(x))


def from_numpy(a) -> Tensor:
    """`torch.from_numpy`: shares the array's memory (through DLPack)."""
    return from_dlpack(a)


# --- functions over several tensors
def cat(tensors, dim: int = 0) -> Tensor:
    return _call("cat", *tensors, dim=dim)


def stack(tensors, dim: int = 0) -> Tensor:
    return _call("stack", *tensors, dim=dim)


def where(cond, x, y) -> Tensor:
    return _call("where", cond, x, y)


def matmul(a, b) -> Tensor:
    return _call("matmul", a, b)


def einsum(equation: str, *operands) -> Tensor:
    return _call("einsum", *operands, equation=equation)


# --- compiled graphs
class Function:
    """A compiled `.smelt` graph: call it with tensors (smelt's, or any DLPack producer's)
    in the graph's input order; it returns the graph's outputs as a list of tensors."""

    def __init__(self, native):
        self._f = native

    def __call__(self, *inputs):
        return [Tensor(t) for t in self._f(*[x._t if isinstance(x, Tensor) else x for x in inputs])]

    @property
    def compiles(self) -> int:
        """How many variants were compiled (one per binding of the graph's symbols)."""
        return self._f.compiles

    def text(self) -> str:
        return self._f.text()


def compile(  # noqa: A001
    text: str, graph: str | None = None, fuse: bool = True, device: str = "cpu", fast_math: bool = False
) -> Function:
    """Compiles `.smelt` text (the first graph, or `graph`) with smelt's passes. `fast_math`
    allows approximations that can change IEEE results (f32 sums in f32 lanes, reassociating
    rewrites, `--use_fast_math` on a GPU)."""
    return Function(_smelt.compile(text, graph=graph, fuse=fuse, device=device, fast_math=fast_math))


def load(
    path: str, graph: str | None = None, fuse: bool = True, device: str = "cpu", fast_math: bool = False
) -> Function:
    """Compiles a `.smelt` file (options as for `compile`)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return Function(
        _smelt.compile(text, graph=graph, fuse=fuse, device=device, file=str(path), fast_math=fast_math)
    )


__all__ = [
    "Tensor", "dtype", "tensor", "zeros", "ones", "full", "arange", "rand", "randn",
    "manual_seed", "from_dlpack", "from_numpy", "cat", "stack", "where", "matmul", "einsum",
    "Function", "compile", "load", "onnx", "profile", "compile_aot", "cli", "explain",
]


def explain(fn, *args, **kwargs):
    """Compiles `fn` with `torch.compile(backend="smelt")`, calls it, and reports which ATen
    ops smelt ran and which stayed in PyTorch (needs PyTorch)."""
    from .dynamo import explain as _explain

    return _explain(fn, *args, **kwargs)
