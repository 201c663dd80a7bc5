"""`smelt.Tensor`: PyTorch's tensor surface over smelt's eager ops.

Every method names one op of smelt's op table (the `.smelt` names, which mean what PyTorch
means by the same name) and calls it through `_smelt.op`; nothing here computes.
"""

from __future__ import annotations

import builtins

from . import _smelt


class dtype:
    """A smelt dtype; `smelt.float32` and friends, printed as PyTorch prints its own."""

    __slots__ = ("name", "torch_name")

    def __init__(self, name: str, torch_name: str):
        self.name = name
        self.torch_name = torch_name

    def __repr__(self) -> str:
        return f"smelt.{self.torch_name}"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            return _dtype_name(other) == self.name
        return isinstance(other, dtype) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def is_floating_point(self) -> bool:
        return self.name in ("f16", "bf16", "f32", "f64")


_DTYPES = {
    n: dtype(n, t)
    for n, t in [
        ("bool", "bool"), ("u8", "uint8"), ("i8", "int8"), ("i16", "int16"),
        ("i32", "int32"), ("i64", "int64"), ("f16", "float16"), ("bf16", "bfloat16"),
        ("f32", "float32"), ("f64", "float64"),
    ]
}
# PyTorch's and NumPy's spellings of each dtype
_ALIASES = {d.torch_name: n for n, d in _DTYPES.items()}
_ALIASES.update(float="f32", double="f64", half="f16", long="i64", int="i32", short="i16",
                uint8="u8", bool_="bool")


def _dtype_name(d) -> str:
    """The `.smelt` name of a dtype given as a smelt dtype, a name or a torch/numpy dtype."""
    if isinstance(d, dtype):
        return d.name
    s = str(d).removeprefix("torch.").removeprefix("smelt.")
    if s in _DTYPES:
        return s
    if s in _ALIASES:
        return _ALIASES[s]
    raise TypeError(f"unknown dtype {d!r}")


def _raw(x):
    """The native operand for `x`: a tensor's handle, or a Python number or None as is."""
    return x._t if isinstance(x, Tensor) else x


def _call(name: str, *operands, **attrs) -> "Tensor":
    return Tensor(_smelt.op(name, [_raw(o) for o in operands], attrs))


def _dims(dim):
    return None if dim is None else [dim] if isinstance(dim, int) else list(dim)


def _sizes(args):
    """`f(2, 3)` and `f((2, 3))` alike, as PyTorch accepts both."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return list(args[0])
    return list(args)


class Tensor:
    """A smelt tensor: an n-dimensional array with a dtype, strided views of shared memory,
    and PyTorch's operators, promotion and broadcasting."""

    __slots__ = ("_t", "__weakref__")

    def __init__(self, raw):
        if not isinstance(raw, _smelt.RawTensor):
            raise TypeError("use smelt.tensor(...) to make a tensor from data")
        self._t = raw

    # --- what a tensor is
    @property
    def shape(self) -> tuple:
        return tuple(self._t.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    @property
    def ndim(self) -> int:
        return len(self._t.shape)

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        n = 1
        for s in self._t.shape:
            n *= s
        return n

    def stride(self, dim: int | None = None):
        s = tuple(self._t.strides)
        return s if dim is None else s[dim]

    @property
    def dtype(self) -> dtype:
        return _DTYPES[self._t.dtype]

    @property
    def device(self) -> str:
        return self._t.device

    def data_ptr(self) -> int:
        return self._t.data_ptr

    def storage_offset(self) -> int:
        return self._t.storage_offset

    def is_contiguous(self) -> bool:
        return self._t.is_contiguous()

    def __len__(self) -> int:
        if not self._t.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._t.shape[0]

    def __repr__(self) -> str:
        return repr(self._t)

    # --- data out
    def tolist(self):
        flat = self._t.values()
        for n in reversed(self.shape[1:]):
            flat = [flat[i:i + n] for i in range(0, len(flat), n)] if n else []
        return flat if self.shape else flat[0]

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"a Tensor with {self.numel()} elements cannot be converted to Scalar")
        return self._t.values()[0]

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def numpy(self):
        """A NumPy array over the same memory (as `torch.Tensor.numpy`)."""
        import numpy as np
        return np.asarray(self)

    @property
    def __array_interface__(self):
        return self._t.__array_interface__

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self._t.__dlpack__(stream=stream, max_version=max_version,
                                  dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()

    # --- dtype and device
    def to(self, dtype_or_device):
        s = str(dtype_or_device)
        if s == "cpu" or s.startswith("cuda"):
            return Tensor(_smelt.to_device(self._t, s))
        return _call("to", self, dtype=_dtype_name(dtype_or_device))

    def float(self):
        return self.to("f32")

    def double(self):
        return self.to("f64")

    def half(self):
        return self.to("f16")

    def long(self):
        return self.to("i64")

    def int(self):
        return self.to("i32")

    def bool(self):
        return self.to("bool")

    def cpu(self):
        return self.to("cpu")

    # --- movement (views share memory)
    def reshape(self, *shape):
        return _call("reshape", self, shape=_sizes(shape))

    def view(self, *shape):
        return _call("view", self, shape=_sizes(shape))

    def permute(self, *dims):
        return _call("permute", self, dims=_sizes(dims))

    def transpose(self, dim0: int, dim1: int):
        return _call("transpose", self, dim0=dim0, dim1=dim1)

    def t(self):
        return _call("t", self)

    @property
    def T(self):
        return self.permute(list(range(self.ndim))[::-1])

    def expand(self, *size):
        return _call("expand", self, size=_sizes(size))

    def squeeze(self, dim=None):
        return _call("squeeze", self, dim=_dims(dim))

    def unsqueeze(self, dim: int):
        return _call("unsqueeze", self, dim=dim)

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        return _call("flatten", self, start_dim=start_dim, end_dim=end_dim)

    def narrow(self, dim: int, start: int, length: int):
        return _call("narrow", self, dim=dim, start=start, length=length)

    def select(self, dim: int, index: int):
        return _call("select", self, dim=dim, index=index)

    def contiguous(self):
        return self if self.is_contiguous() else _call("contiguous", self)

    def clone(self):
        """A contiguous copy that shares no memory with `self`."""
        return Tensor(_smelt.clone(self._t))

    def repeat(self, *repeats):
        return _call("repeat", self, repeats=_sizes(repeats))

    def flip(self, *dims):
        return _call("flip", self, dims=_sizes(dims))

    def __getitem__(self, key):
        """Basic indexing: ints, slices with positive steps, `None` and `...`."""
        if not isinstance(key, tuple):
            key = (key,)
        if builtins.sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        used = builtins.sum(k is not None and k is not Ellipsis for k in key)
        if used > self.ndim:
            raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
        out, dim = self, 0
        for k in key:
            if k is Ellipsis:
                dim += self.ndim - used
            elif k is None:
                out = out.unsqueeze(dim)
                dim += 1
            elif isinstance(k, builtins.int):
                out = out.select(dim, k)
            elif isinstance(k, slice):
                step = 1 if k.step is None else k.step
                if step <= 0:
                    raise ValueError("step must be greater than zero")
                out = _call("slice", out, dim=dim, start=k.start, end=k.stop, step=step)
                dim += 1
            else:
                raise IndexError(f"smelt tensors take ints, slices, None and ... as indices, not {type(k).__name__}")
        return out

    # --- reductions (sum, mean, amax, amin, logsumexp, all, any: set below)
    def max(self):
        return self.amax()

    def min(self):
        return self.amin()

    def prod(self, dim=None, keepdim: bool = False):
        return _call("prod", self, dim=dim, keepdim=keepdim)

    def argmax(self, dim=None, keepdim: bool = False):
        return _call("argmax", self, dim=dim, keepdim=keepdim)

    def argmin(self, dim=None, keepdim: bool = False):
        return _call("argmin", self, dim=dim, keepdim=keepdim)

    def var(self, dim=None, correction: int = 1, keepdim: bool = False):
        return _call("var", self, dim=_dims(dim), correction=correction, keepdim=keepdim)

    def std(self, dim=None, correction: int = 1, keepdim: bool = False):
        return _call("std", self, dim=_dims(dim), correction=correction, keepdim=keepdim)

    def softmax(self, dim: int):
        return _call("softmax", self, dim=dim)

    def log_softmax(self, dim: int):
        return _call("log_softmax", self, dim=dim)

    def matmul(self, other):
        return _call("matmul", self, other)

    def clamp(self, min=None, max=None):
        return _call("clamp", self, min=min, max=max)

    def masked_fill(self, mask, value):
        return _call("masked_fill", self, mask, value=value)

    def where(self, cond, other):
        return _call("where", cond, self, other)

    def gelu(self, approximate: str = "none"):
        return _call("gelu", self, approximate=approximate)

    def div(self, other, rounding_mode=None):
        return _call("div", self, other, rounding_mode=rounding_mode)

    def add(self, other, alpha=1):
        return _call("add", self, other, alpha=alpha)

    def sub(self, other, alpha=1):
        return _call("sub", self, other, alpha=alpha)


def _unary(name):
    def method(self):
        return _call(name, self)
    method.__name__ = name
    method.__doc__ = f"`torch.Tensor.{name}`."
    return method


def _binary(name, reflected=False):
    def method(self, other):
        return _call(name, other, self) if reflected else _call(name, self, other)
    method.__name__ = name
    return method


def _reduction(name):
    def method(self, dim=None, keepdim: bool = False):
        return _call(name, self, dim=_dims(dim), keepdim=keepdim)
    method.__name__ = name
    method.__doc__ = f"`torch.Tensor.{name}` over `dim` (an int, a list, or None for all)."
    return method


_REDUCTIONS = "sum mean amax amin logsumexp all any".split()
_UNARY = ("neg abs exp log log1p expm1 sqrt rsqrt sin cos asin acos atan tanh sigmoid relu silu "
          "erf floor ceil round sign reciprocal square logical_not isnan bitwise_not").split()
_BINARY = ("mul pow maximum minimum remainder eq ne lt le gt ge logical_and logical_or "
           "bitwise_and bitwise_or bitwise_xor").split()

for _n in _REDUCTIONS:
    setattr(Tensor, _n, _reduction(_n))
for _n in _UNARY:
    setattr(Tensor, _n, _unary(_n))
for _n in _BINARY:
    setattr(Tensor, _n, _binary(_n))

# Python's operators, each one op
for _dunder, _name in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"),
                       ("pow", "pow"), ("mod", "remainder"), ("matmul", "matmul"),
                       ("and", "bitwise_and"), ("or", "bitwise_or"), ("xor", "bitwise_xor")]:
    setattr(Tensor, f"__{_dunder}__", _binary(_name))
    setattr(Tensor, f"__r{_dunder}__", _binary(_name, reflected=True))
for _dunder, _name in [("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"),
                       ("ge", "ge")]:
    setattr(Tensor, f"__{_dunder}__", _binary(_name))
Tensor.__neg__ = _unary("neg")
Tensor.__abs__ = _unary("abs")
Tensor.__invert__ = _unary("bitwise_not")
Tensor.__floordiv__ = lambda self, other: _call("div", self, other, rounding_mode="floor")
Tensor.__rfloordiv__ = lambda self, other: _call("div", other, self, rounding_mode="floor")
Tensor.__hash__ = object.__hash__
del _n, _dunder, _name
