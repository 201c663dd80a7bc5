"""Translate a PyTorch FX graph of core-ATen ops into smelt's `.smelt` graph text.

This is the bridge a `torch.compile` backend uses: AOTAutograd hands its forward and
backward compilers `torch.fx.GraphModule`s whose nodes call `torch.ops.aten.*` overloads
(after `torch._decomp.core_aten_decompositions()`), each node carrying its FakeTensor in
`node.meta["val"]`. `to_smelt` writes such a graph as one `.smelt` graph named `fx`;
`supported` says which nodes it can write, so that a partitioner can keep the others in
PyTorch.

Every op of the `.smelt` format means what PyTorch means by the same name (see
docs/ir-format.md), with PyTorch's broadcasting and type promotion, so most ATen ops map
one to one. The rest are composed from primitives here. Each handler takes the
schema-bound arguments of its node, FX values replaced by `V`s, and returns the smelt
value name(s) of the node's result(s). The last statement written for a node carries the
type FakeTensor propagation gave it, so a dtype or shape that smelt infers differently is
an error when the text is read rather than a wrong answer.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Callable

import torch
import torch.fx

aten = torch.ops.aten

__all__ = ["Translation", "Unsupported", "supported", "to_smelt"]


class Unsupported(Exception):
    """A node (named in the message) that this translator cannot write as `.smelt`."""


@dataclass
class Translation:
    text: str
    # One entry per FX output position: ("value", k) is the k-th value of smelt's `return`,
    # ("none",) a None output, ("input", i) placeholder i handed back unchanged, ("copy", i)
    # a copy of placeholder i (the output of a clone the translation elided).
    outputs: list = field(default_factory=list)


_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.bool: "bool",
}

# Constants larger than this stay in PyTorch: they would bloat the text.
_MAX_CONSTANT = 4096


@dataclass(frozen=True)
class V:
    """A tensor value of the graph being written: its smelt name and its FakeTensor type."""

    name: str
    shape: tuple
    dtype: torch.dtype

    def __str__(self) -> str:
        return self.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# --------------------------------------------------------------------------------------
# Writing text


def _num(x) -> str:
    """A Python scalar as a bare `.smelt` number (floats always read back as floats)."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return repr(x)  # '1.0', '1e-05', 'inf', '-inf', 'nan'
    raise Unsupported(f"not a plain Python number: {x!r} ({type(x).__name__})")


def _attr(a) -> str:
    if isinstance(a, torch.dtype):
        if a not in _DTYPES:
            raise Unsupported(f"dtype {a}")
        return _DTYPES[a]
    if isinstance(a, str):
        return '"' + a + '"'
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_attr(x) for x in a) + "]"
    if a is None:
        return "none"
    return _num(a)


def _operand(x) -> str:
    if isinstance(x, (V, str)):
        return str(x)
    if x is None:
        return "none"
    return _num(x)


def _type(shape, dtype) -> str:
    if dtype not in _DTYPES:
        raise Unsupported(f"dtype {dtype}")
    for d in shape:
        if not isinstance(d, int):
            raise Unsupported(f"symbolic size {d} (only concrete shapes are translated)")
    return f"{_DTYPES[dtype]}[{','.join(str(d) for d in shape)}]"


class _Emitter:
    """Collects the statements of the graph body; `op` writes one and returns its name."""

    def __init__(self):
        self.stmts: list[list] = []  # [name, type text or None, "op(operands, attrs)"]
        self.defs: dict[str, int] = {}  # value name -> index of its statement

    def op(self, name: str, *operands, **attrs) -> str:
        v = f"%v{len(self.stmts)}"
        parts = [_operand(o) for o in operands]
        # an attribute given as None takes smelt's default, which is PyTorch's `None`
        parts += [f"{k}={_attr(a)}" for k, a in attrs.items() if a is not None]
        self.defs[v] = len(self.stmts)
        self.stmts.append([v, None, f"{name}({', '.join(parts)})"])
        return v

    def cast(self, x, have: torch.dtype, want: torch.dtype | None):
        return x if want is None or have == want else self.op("to", x, dtype=want)

    def annotate(self, name: str, type_text: str, since: int) -> None:
        """Writes `type_text` on the statement of `name` if that statement is number `since`
        or later (that is, was written for the node being translated)."""
        i = self.defs.get(name)
        if i is not None and i >= since:
            self.stmts[i][1] = type_text

    def body(self) -> str:
        return "".join(
            f"  {v}{'' if t is None else ': ' + t} = {call}\n" for v, t, call in self.stmts
        )


# --------------------------------------------------------------------------------------
# Node metadata


def _val(n):
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def _shape(n) -> list:
    return [int(d) for d in _val(n).shape]


def _dtype(n) -> torch.dtype:
    return _val(n).dtype


def _used(n: torch.fx.Node):
    """The output indices of a multi-output node that are read (through `getitem`), or
    None when the node's result is used as a whole."""
    idx = set()
    for u in n.users:
        if u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int):
            idx.add(u.args[1])
        else:
            return None
    return idx


def _wants(n, i) -> bool:
    used = _used(n)
    return used is None or i in used


def _tensor_ok(t) -> bool:
    """A tensor of a dtype smelt has, with concrete sizes (not a SymInt or other value)."""
    return (
        isinstance(t, torch.Tensor)
        and t.dtype in _DTYPES
        and all(isinstance(d, int) for d in t.shape)
    )


def _bind(node: torch.fx.Node, env=None) -> dict:
    """The node's arguments by schema name ("self" and "input" written "x"), defaults
    filled in, FX nodes replaced by their values in `env` (kept as nodes without one)."""
    args, kwargs = node.args, node.kwargs
    if env is not None:
        args = torch.fx.node.map_arg(args, lambda a: env[a])
        kwargs = torch.fx.node.map_arg(kwargs, lambda a: env[a])
    schema = node.target._schema
    bound = {}
    for i, a in enumerate(schema.arguments):
        if i < len(args) and not a.kwarg_only:
            value = args[i]
        elif a.name in kwargs:
            value = kwargs[a.name]
        elif a.has_default_value():
            value = a.default_value
        else:
            raise Unsupported(f"{node.target}: argument '{a.name}' missing")
        bound["x" if a.name in ("self", "input") else a.name] = value
    return bound


def _arg(n: torch.fx.Node, name: str):
    """One argument of `n` by schema name (for the checks)."""
    return _bind(n)[name]


def _dim_list(dim):
    """A reduction's dims as a list; None (smelt's default: every dim) for None or [],
    which ATen also reads as every dim."""
    if isinstance(dim, int):
        return [dim]
    return list(dim) if dim else None


def _opt(x, default):
    """`x`, or None (smelt's "leave out") when it equals PyTorch's default."""
    return None if x == default else x


# --------------------------------------------------------------------------------------
# The op table: OpOverload -> (handler, check). A handler is called as
# `handler(e, node, **args)` with the node's arguments bound to its schema's names ("self"
# and "input" renamed "x"), FX nodes replaced by their values; it returns the smelt name of
# the result, a tuple of them for a multi-output op (None where nobody reads that output),
# or an existing `V` when the op is the identity. `check(node)`, optional, refuses the
# nodes whose arguments the handler cannot express.

Handler = Callable[..., Any]
_HANDLERS: dict[Any, tuple[Handler, Callable[[torch.fx.Node], bool] | None]] = {}


def _op(*targets, check=None):
    def register(fn):
        for t in targets:
            _HANDLERS[t] = (fn, check)
        return fn

    return register


def _simple(smelt_name):
    """A handler for an op that maps one to one, attributes named as in PyTorch."""

    def handler(e, n, x, **attrs):
        return e.op(smelt_name, x, **attrs)

    return handler


_UNARY = {
    aten.neg.default: "neg",
    aten.abs.default: "abs",
    aten.exp.default: "exp",
    aten.log.default: "log",
    aten.log1p.default: "log1p",
    aten.expm1.default: "expm1",
    aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt",
    aten.sin.default: "sin",
    aten.cos.default: "cos",
    aten.asin.default: "asin",
    aten.acos.default: "acos",
    aten.atan.default: "atan",
    aten.bitwise_not.default: "bitwise_not",
    aten.tanh.default: "tanh",
    aten.sigmoid.default: "sigmoid",
    aten.relu.default: "relu",
    aten.gelu.default: "gelu",  # approximate=
    aten.silu.default: "silu",
    aten.erf.default: "erf",
    aten.floor.default: "floor",
    aten.ceil.default: "ceil",
    aten.round.default: "round",
    aten.sign.default: "sign",
    aten.reciprocal.default: "reciprocal",
    aten.logical_not.default: "logical_not",
    aten.isnan.default: "isnan",
    aten.leaky_relu.default: "leaky_relu",  # negative_slope=
    aten.hardtanh.default: "hardtanh",  # min_val=, max_val=
    aten.hardswish.default: "hardswish",
    aten.mish.default: "mish",
    aten.softplus.default: "softplus",  # beta=, threshold=
}
for _target, _name in _UNARY.items():
    _HANDLERS[_target] = (_simple(_name), None)


def _binary(smelt_name):
    def handler(e, n, x, **other):
        (y,) = other.values()  # "other", or pow's "exponent"
        return e.op(smelt_name, x, y)

    return handler


_BINARY = {
    "mul": [aten.mul.Tensor, aten.mul.Scalar],
    "div": [aten.div.Tensor, aten.div.Scalar],
    "pow": [aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar],
    "maximum": [aten.maximum.default],
    "minimum": [aten.minimum.default],
    "remainder": [aten.remainder.Tensor, aten.remainder.Scalar],
    "eq": [aten.eq.Tensor, aten.eq.Scalar],
    "ne": [aten.ne.Tensor, aten.ne.Scalar],
    "lt": [aten.lt.Tensor, aten.lt.Scalar],
    "le": [aten.le.Tensor, aten.le.Scalar],
    "gt": [aten.gt.Tensor, aten.gt.Scalar],
    "ge": [aten.ge.Tensor, aten.ge.Scalar],
    "logical_and": [aten.logical_and.default],
    "logical_or": [aten.logical_or.default],
    "bitwise_and": [aten.bitwise_and.Tensor, aten.bitwise_and.Scalar],
    "bitwise_or": [aten.bitwise_or.Tensor, aten.bitwise_or.Scalar],
    "bitwise_xor": [aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar],
}
for _name, _ts in _BINARY.items():
    for _target in _ts:
        _HANDLERS[_target] = (_binary(_name), None)




@_op(aten.logical_xor.default)
def _logical_xor(e, n, x, other):
    return e.op("ne", e.op("to", x, dtype=torch.bool), e.op("to", other, dtype=torch.bool))


@_op(aten.pow.Scalar)
def _pow_scalar_base(e, n, x, exponent):
    return e.op("pow", x, exponent)  # x is the Python number here


@_op(aten.add.Tensor, aten.add.Scalar)
def _add(e, n, x, other, alpha):
    return e.op("add", x, other, alpha=_opt(alpha, 1))


@_op(aten.sub.Tensor, aten.sub.Scalar)
def _sub(e, n, x, other, alpha):
    return e.op("sub", x, other, alpha=_opt(alpha, 1))


@_op(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(e, n, x, other, alpha):
    return e.op("sub", other, x, alpha=_opt(alpha, 1))


@_op(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(e, n, x, other, rounding_mode):
    return e.op("div", x, other, rounding_mode=rounding_mode)


@_op(aten.trunc.default)
def _trunc(e, n, x):
    # trunc(x / 1) is trunc(x) exactly, and integers stay integers
    return e.op("div", x, 1, rounding_mode="trunc")


@_op(aten.isinf.default)
def _isinf(e, n, x):
    return e.op("eq", e.op("abs", x), math.inf)


@_op(aten.elu.default, check=lambda n: _arg(n, "scale") == 1 and _arg(n, "input_scale") == 1)
def _elu(e, n, x, alpha, scale, input_scale):
    return e.op("elu", x, alpha=_opt(alpha, 1))


@_op(aten.where.self)
def _where(e, n, condition, x, other):
    return e.op("where", condition, x, other)


@_op(aten.clamp.default)
def _clamp(e, n, x, min, max):
    return e.op("clamp", x, min=min, max=max)


@_op(aten.clamp_min.default)
def _clamp_min(e, n, x, min):
    return e.op("clamp", x, min=min)


@_op(aten.clamp_max.default)
def _clamp_max(e, n, x, max):
    return e.op("clamp", x, max=max)


@_op(aten.clamp.Tensor)
def _clamp_tensor(e, n, x, min, max):
    if min is not None:
        x = e.op("maximum", x, min)
    if max is not None:
        x = e.op("minimum", x, max)
    # maximum/minimum promote as clamp does; the cast only pins the result type down
    return e.op("to", x, dtype=_dtype(n))


@_op(aten.masked_fill.Scalar)
def _masked_fill(e, n, x, mask, value):
    return e.op("masked_fill", x, mask, value=value)


@_op(aten.masked_fill.Tensor)
def _masked_fill_tensor(e, n, x, mask, value):
    return e.op("where", mask, e.cast(value, value.dtype, x.dtype), x)


# ---- linear algebra


@_op(aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default)
def _matmul(e, n, x, **other):
    (y,) = other.values()  # mat2 / vec / tensor
    return e.op("matmul", x, y)


@_op(aten.addmm.default)
def _addmm(e, n, x, mat1, mat2, beta, alpha):
    # beta * x + alpha * (mat1 @ mat2); with beta == 0 the bias is ignored (NaNs included)
    m = e.op("matmul", mat1, mat2)
    if alpha != 1:
        m = e.op("mul", m, alpha)
    if beta == 0:
        return m
    return e.op("add", m, x if beta == 1 else e.op("mul", x, beta))


# ---- reductions


def _reduce(smelt_name):
    def handler(e, n, x, dim=None, keepdim=False, dtype=None):
        x = e.cast(x, x.dtype, dtype)
        return e.op(smelt_name, x, dim=_dim_list(dim), keepdim=_opt(keepdim, False))

    return handler


for _name, _ts in {
    "sum": [aten.sum.default, aten.sum.dim_IntList],
    "mean": [aten.mean.default, aten.mean.dim],
    "amax": [aten.amax.default, aten.max.default],
    "amin": [aten.amin.default, aten.min.default],
    "any": [aten.any.default, aten.any.dim, aten.any.dims],
    "all": [aten.all.default, aten.all.dim, aten.all.dims],
    "logsumexp": [aten.logsumexp.default],
}.items():
    for _target in _ts:
        _HANDLERS[_target] = (_reduce(_name), None)


@_op(aten.prod.default, aten.prod.dim_int)
def _prod(e, n, x, dim=None, keepdim=False, dtype=None):
    return e.op("prod", e.cast(x, x.dtype, dtype), dim=dim, keepdim=_opt(keepdim, False))


@_op(aten.argmax.default)
def _argmax(e, n, x, dim, keepdim):
    return e.op("argmax", x, dim=dim, keepdim=_opt(keepdim, False))


@_op(aten.argmin.default)
def _argmin(e, n, x, dim, keepdim):
    return e.op("argmin", x, dim=dim, keepdim=_opt(keepdim, False))


def _extreme_dim(value_op, index_op):
    """`max.dim`/`min.dim`: the values and their indices, each written only if read."""

    def handler(e, n, x, dim, keepdim):
        k = _opt(keepdim, False)
        return (
            e.op(value_op, x, dim=[dim], keepdim=k) if _wants(n, 0) else None,
            e.op(index_op, x, dim=dim, keepdim=k) if _wants(n, 1) else None,
        )

    return handler


_op(aten.max.dim)(_extreme_dim("amax", "argmax"))
_op(aten.min.dim)(_extreme_dim("amin", "argmin"))


def _var_attrs(dim, correction, keepdim):
    # correction None is PyTorch's default, 1 (Bessel's)
    return dict(dim=_dim_list(dim), correction=correction, keepdim=_opt(keepdim, False))


@_op(aten.var.correction)
def _var(e, n, x, dim, correction, keepdim):
    return e.op("var", x, **_var_attrs(dim, correction, keepdim))


@_op(aten.std.correction)
def _std(e, n, x, dim, correction, keepdim):
    return e.op("std", x, **_var_attrs(dim, correction, keepdim))


@_op(aten.var_mean.correction)
def _var_mean(e, n, x, dim, correction, keepdim):
    attrs = _var_attrs(dim, correction, keepdim)
    return (
        e.op("var", x, **attrs) if _wants(n, 0) else None,
        e.op("mean", x, dim=attrs["dim"], keepdim=attrs["keepdim"]) if _wants(n, 1) else None,
    )


@_op(aten.cumsum.default)
def _cumsum(e, n, x, dim, dtype):
    return e.op("cumsum", e.cast(x, x.dtype, dtype), dim=dim)


# ---- softmax and normalisation


@_op(aten._softmax.default)
def _softmax(e, n, x, dim, half_to_float):
    return e.op("softmax", e.cast(x, x.dtype, _dtype(n)), dim=dim)


@_op(aten._log_softmax.default)
def _log_softmax(e, n, x, dim, half_to_float):
    return e.op("log_softmax", e.cast(x, x.dtype, _dtype(n)), dim=dim)


@_op(aten._softmax_backward_data.default)
def _softmax_backward(e, n, grad_output, output, dim, input_dtype):
    # y * (g - sum(g * y, dim, keepdim))
    g, y = grad_output, output
    s = e.op("sum", e.op("mul", g, y), dim=[dim], keepdim=True)
    return e.cast(e.op("mul", y, e.op("sub", g, s)), g.dtype, input_dtype)


@_op(aten._log_softmax_backward_data.default)
def _log_softmax_backward(e, n, grad_output, output, dim, input_dtype):
    # g - exp(y) * sum(g, dim, keepdim)
    g, y = grad_output, output
    s = e.op("sum", g, dim=[dim], keepdim=True)
    return e.cast(e.op("sub", g, e.op("mul", e.op("exp", y), s)), g.dtype, input_dtype)


def _low_precision(dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


@_op(aten.native_layer_norm.default)
def _native_layer_norm(e, n, x, normalized_shape, weight, bias, eps):
    out_dtypes = [t.dtype for t in _val(n)]
    if not (_wants(n, 1) or _wants(n, 2)):
        y = e.op("layer_norm", x, weight, bias, normalized_shape=list(normalized_shape), eps=eps)
        return y, None, None
    # The statistics are wanted too (training): compute all three from primitives, over
    # the normalised (trailing) dims with keepdim so that mean and rstd are [.., 1, 1] as
    # in PyTorch. Half-precision inputs are normalised in f32, as PyTorch does.
    dims = list(range(x.ndim - len(normalized_shape), x.ndim))
    compute = torch.float32 if _low_precision(x.dtype) else x.dtype
    xs = e.cast(x, x.dtype, compute)
    mean = e.op("mean", xs, dim=dims, keepdim=True)
    var = e.op("var", xs, dim=dims, correction=0, keepdim=True)
    rstd = e.op("rsqrt", e.op("add", var, eps))
    y = e.op("mul", e.op("sub", xs, mean), rstd)
    if weight is not None:
        y = e.op("mul", y, weight)
    if bias is not None:
        y = e.op("add", y, bias)
    return (
        e.cast(y, compute, out_dtypes[0]),
        e.cast(mean, compute, out_dtypes[1]) if _wants(n, 1) else None,
        e.cast(rstd, compute, out_dtypes[2]) if _wants(n, 2) else None,
    )


def _empty(e, n, i):
    """Output `i` of `n`, where PyTorch gives an empty tensor (statistics it did not compute)."""
    t = _val(n)[i]
    if t.numel() != 0:
        raise Unsupported(f"{n.target}: output {i} is not empty")
    return e.op("full", size=list(t.shape), fill_value=0, dtype=t.dtype)


@_op(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_eval(e, n, x, weight, bias, running_mean, running_var, momentum, eps):
    y = e.op("batch_norm", x, running_mean, running_var, weight, bias,
             training=False, momentum=momentum, eps=eps)
    return (y,) + tuple(_empty(e, n, i) if _wants(n, i) else None for i in (1, 2))


def _batch_norm_train(e, n, x, weight, bias, running_mean, running_var, momentum, eps):
    """Training-mode batch norm from primitives: (y, mean, invstd, new running mean, new
    running var), statistics over every dim but 1 (in f32 for half-precision inputs)."""
    out_dtypes = [None if t is None else t.dtype for t in _val(n)]
    c = x.shape[1]
    dims = [0] + list(range(2, x.ndim))
    count = x.numel // c if c else 0
    bshape = [1, c] + [1] * (x.ndim - 2)
    compute = torch.float32 if _low_precision(x.dtype) else x.dtype
    xs = e.cast(x, x.dtype, compute)
    mean = e.op("mean", xs, dim=dims)
    var = e.op("var", xs, dim=dims, correction=0)
    invstd = e.op("rsqrt", e.op("add", var, eps))
    y = e.op("mul", e.op("sub", xs, e.op("reshape", mean, shape=bshape)),
             e.op("reshape", invstd, shape=bshape))
    if weight is not None:
        y = e.op("mul", y, e.op("reshape", weight, shape=bshape))
    if bias is not None:
        y = e.op("add", y, e.op("reshape", bias, shape=bshape))
    outs = [e.cast(y, compute, out_dtypes[0])]
    outs.append(e.cast(mean, compute, out_dtypes[1]) if _wants(n, 1) else None)
    outs.append(e.cast(invstd, compute, out_dtypes[2]) if _wants(n, 2) else None)
    if running_mean is not None:
        # PyTorch: running = (1 - momentum) * running + momentum * stat, where the variance
        # taken into the running one is the unbiased one
        unbiased = momentum * count / max(count - 1, 1)
        for running, stat, scale, i in ((running_mean, mean, momentum, 3),
                                        (running_var, var, unbiased, 4)):
            if _wants(n, i):
                new = e.op("add", e.op("mul", running, 1 - momentum), e.op("mul", stat, scale))
                outs.append(e.cast(new, compute, out_dtypes[i]))
            else:
                outs.append(None)
    return tuple(outs)


@_op(aten._native_batch_norm_legit_functional.default)
def _batch_norm_functional(e, n, x, weight, bias, running_mean, running_var, training,
                           momentum, eps):
    if training:
        return _batch_norm_train(e, n, x, weight, bias, running_mean, running_var, momentum, eps)
    # evaluation: the running statistics pass through unchanged
    ev = _batch_norm_eval(e, n, x, weight, bias, running_mean, running_var, momentum, eps)
    return ev + (running_mean, running_var)


@_op(aten._native_batch_norm_legit.no_stats, check=lambda n: n.args[3])
def _batch_norm_no_stats(e, n, x, weight, bias, training, momentum, eps):
    return _batch_norm_train(e, n, x, weight, bias, None, None, momentum, eps)


# ---- pointwise backward ops (usually decomposed already; kept for graphs that have them)


@_op(aten.threshold_backward.default)
def _threshold_backward(e, n, grad_output, x, threshold):
    zero = 0.0 if grad_output.dtype.is_floating_point else 0
    return e.op("where", e.op("le", x, threshold), zero, grad_output)


@_op(aten.gelu_backward.default)
def _gelu_backward(e, n, grad_output, x, approximate):
    return e.op("mul", grad_output, e.op("gelu_slope", x, approximate=approximate))


@_op(aten.tanh_backward.default)
def _tanh_backward(e, n, grad_output, output):
    return e.op("mul", grad_output, e.op("sub", 1, e.op("mul", output, output)))


@_op(aten.sigmoid_backward.default)
def _sigmoid_backward(e, n, grad_output, output):
    return e.op("mul", e.op("mul", grad_output, e.op("sub", 1, output)), output)


# ---- movement


@_op(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _reshape(e, n, x, **size):
    # the output type has the shape with any -1 resolved
    return e.op("reshape", x, shape=_shape(n))


@_op(aten.expand.default)
def _expand(e, n, x, size, implicit):
    return e.op("expand", x, size=_shape(n))


@_op(aten.permute.default)
def _permute(e, n, x, dims):
    return e.op("permute", x, dims=list(dims))


@_op(aten.t.default)
def _t2d(e, n, x):
    return e.op("t", x)


@_op(aten.transpose.int)
def _transpose(e, n, x, dim0, dim1):
    return e.op("transpose", x, dim0=dim0, dim1=dim1)


@_op(aten.unsqueeze.default)
def _unsqueeze(e, n, x, dim):
    return e.op("unsqueeze", x, dim=dim)


@_op(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(e, n, x, dim=None):
    if list(x.shape) == _shape(n):
        return x  # nothing of size 1 among the dims
    return e.op("squeeze", x, dim=dim)


def _identity(e, n, x, *args, **kwargs):
    # Values are immutable in smelt, so a copy or an alias is the value itself.
    return x


for _target in (aten.alias.default, aten.clone.default, aten.detach.default,
           aten.lift_fresh_copy.default):
    _HANDLERS[_target] = (_identity, None)


def _same_device(n) -> bool:
    device, x = _arg(n, "device"), _val(n.args[0])
    return device is None or x is None or torch.device(device) == x.device


@_op(aten._to_copy.default, check=_same_device)
def _to_copy(e, n, x, dtype, **_):
    return e.cast(x, x.dtype, dtype)


@_op(aten.copy.default)
def _copy(e, n, x, src, non_blocking):
    # the result is `src` broadcast into x's shape and dtype
    out = src if list(src.shape) == list(x.shape) else e.op("expand", src, size=list(x.shape))
    return e.cast(out, src.dtype, x.dtype)


def _bounds(size, start, end):
    """Python slice bounds clamped into [0, size] (ATen's `end` may be sys.maxsize)."""

    def clamp(i, default):
        if i is None:
            return default
        if i < 0:
            i += size
        return min(max(i, 0), size)

    start = clamp(start, 0)
    return start, max(clamp(end, size), start)


@_op(aten.slice.Tensor)
def _slice(e, n, x, dim, start, end, step):
    size = x.shape[dim]
    start, end = _bounds(size, start, end)
    return e.op("slice", x, dim=dim, start=_opt(start, 0), end=_opt(end, size),
                step=_opt(step, 1))


@_op(aten.select.int)
def _select(e, n, x, dim, index):
    return e.op("select", x, dim=dim, index=index)


@_op(aten.cat.default)
def _cat(e, n, tensors, dim):
    # PyTorch skips 1-D empty tensors in a cat of higher-rank ones (a legacy rule)
    xs = [t for t in tensors if not (t.shape == (0,) and len(_shape(n)) != 1)]
    return e.op("cat", *xs, dim=dim) if len(xs) != 1 else xs[0]


def _split(e, n, x, sizes, dim):
    outs, start = [], 0
    for i, length in enumerate(sizes):
        wanted = _wants(n, i)
        outs.append(e.op("narrow", x, dim=dim, start=start, length=length) if wanted else None)
        start += length
    return tuple(outs)


@_op(aten.split_with_sizes.default)
def _split_with_sizes(e, n, x, split_sizes, dim):
    return _split(e, n, x, split_sizes, dim)


@_op(aten.split.Tensor)
def _split_tensor(e, n, x, split_size, dim):
    return _split(e, n, x, [t.shape[dim] for t in _val(n)], dim)


@_op(aten.flip.default)
def _flip(e, n, x, dims):
    return e.op("flip", x, dims=list(dims))


@_op(aten.repeat.default)
def _repeat(e, n, x, repeats):
    return e.op("repeat", x, repeats=list(repeats))


@_op(aten.tril.default)
def _tril(e, n, x, diagonal):
    return e.op("tril", x, diagonal=_opt(diagonal, 0))


@_op(aten.triu.default)
def _triu(e, n, x, diagonal):
    return e.op("triu", x, diagonal=_opt(diagonal, 0))


@_op(aten.diagonal.default)
def _diagonal(e, n, x, offset, dim1, dim2):
    return e.op("diagonal", x, offset=offset, dim1=dim1, dim2=dim2)


def _put_slice(e, x, src, dim, start, end):
    """x with [start:end) along dim replaced by src: a cat of the pieces around it."""
    size = x.shape[dim]
    pieces = []
    if start > 0:
        pieces.append(e.op("narrow", x, dim=dim, start=0, length=start))
    pieces.append(src)
    if end < size:
        pieces.append(e.op("narrow", x, dim=dim, start=end, length=size - end))
    return e.op("cat", *pieces, dim=dim) if len(pieces) > 1 else e.op("to", src, dtype=x.dtype)


@_op(aten.slice_scatter.default, check=lambda n: _arg(n, "step") == 1)
def _slice_scatter(e, n, x, src, dim, start, end, step):
    dim %= x.ndim
    start, end = _bounds(x.shape[dim], start, end)
    return _put_slice(e, x, src, dim, start, end)


@_op(aten.select_scatter.default)
def _select_scatter(e, n, x, src, dim, index):
    dim %= x.ndim
    index %= x.shape[dim]
    return _put_slice(e, x, e.op("unsqueeze", src, dim=dim), dim, index, index + 1)


@_op(aten.constant_pad_nd.default)
def _constant_pad(e, n, x, pad, value):
    # `pad` lists (before, after) pairs from the last dim backwards; a negative amount
    # crops instead
    shape = list(x.shape)
    out = x
    for i in range(len(pad) // 2):
        dim = x.ndim - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        crop_start, crop_end = max(-before, 0), max(-after, 0)
        if crop_start or crop_end:
            length = shape[dim] - crop_start - crop_end
            out = e.op("narrow", out, dim=dim, start=crop_start, length=length)
            shape[dim] = length
        pieces = []
        for amount in (before, None, after):
            if amount is None:
                pieces.append(out)
            elif amount > 0:
                size = shape[:dim] + [amount] + shape[dim + 1 :]
                pieces.append(e.op("full", size=size, fill_value=value, dtype=x.dtype))
        if len(pieces) > 1:
            out = e.op("cat", *pieces, dim=dim)
        shape[dim] += max(before, 0) + max(after, 0)
    return out


# ---- indexing


@_op(aten.index_select.default)
def _index_select(e, n, x, dim, index):
    return e.op("index_select", x, index, dim=dim)


@_op(aten.gather.default)
def _gather(e, n, x, dim, index, sparse_grad):
    return e.op("gather", x, index, dim=dim)


@_op(aten.scatter.src, aten.scatter.value)
def _scatter(e, n, x, dim, index, **src_or_value):
    (src,) = src_or_value.values()
    return e.op("scatter", x, index, src, dim=dim)


@_op(aten.scatter_add.default)
def _scatter_add(e, n, x, dim, index, src):
    return e.op("scatter_add", x, index, src, dim=dim)


@_op(aten.scatter_reduce.two, check=lambda n: _arg(n, "include_self") is not False)
def _scatter_reduce(e, n, x, dim, index, src, reduce, include_self=True):
    return e.op("scatter_reduce", x, index, src, dim=dim, reduce=reduce)


@_op(aten.index_add.default)
def _index_add(e, n, x, dim, index, source, alpha):
    if alpha != 1:
        source = e.op("mul", source, alpha)
    return e.op("index_add", x, index, source, dim=dim)


@_op(aten.embedding.default)
def _embedding(e, n, weight, indices, padding_idx, scale_grad_by_freq, sparse):
    return e.op("embedding", indices, weight)


def _one_index(n) -> bool:
    """`x[..., idx, ...]` with a single integer index tensor (bool masks have data-dependent
    shapes; several index tensors broadcast together, which is not written here)."""
    indices = [i for i in n.args[1] if i is not None]
    return len(indices) == 1 and _val(indices[0]) is not None and (
        _dtype(indices[0]) in (torch.int64, torch.int32)
    )




def _adjacent_indices(n) -> bool:
    """`x[..., i, j, ...]`: integer index tensors on adjacent dims (their broadcast shape
    then stands where those dims stood; separated ones would move it to the front)."""
    given = [k for k, i in enumerate(n.args[1]) if i is not None]
    return (
        bool(given)
        and given == list(range(given[0], given[-1] + 1))
        and all(_val(n.args[1][k]) is not None for k in given)
        and all(_dtype(n.args[1][k]) in (torch.int64, torch.int32) for k in given)
    )


def _wrapped(e, idx, size):
    """Negative entries of an index counted from the end, as PyTorch does."""
    return e.op("where", e.op("lt", idx, 0), e.op("add", idx, size), idx)


def _flat_index(e, idx, size):
    """The index tensor flattened to 1-D, negative entries wrapped."""
    return _wrapped(e, e.op("reshape", idx, shape=[idx.numel]) if idx.ndim != 1 else idx, size)


@_op(aten.index.Tensor, check=_adjacent_indices)
def _index(e, n, x, indices):
    given = [k for k, i in enumerate(indices) if i is not None]
    first, last = given[0], given[-1]
    if len(given) == 1:
        idx = indices[first]
        out = e.op("index_select", x, _flat_index(e, idx, x.shape[first]), dim=first)
        return e.op("reshape", out, shape=_shape(n)) if idx.ndim != 1 else out
    # several: one index into the indexed dims flattened together, row-major
    sizes = [x.shape[k] for k in given]
    linear = bad = None
    for k, size in zip(given, sizes):
        term = _wrapped(e, indices[k], size)
        linear = term if linear is None else e.op("add", e.op("mul", linear, size), term)
        out_of_range = e.op("logical_or", e.op("lt", term, 0), e.op("ge", term, size))
        bad = out_of_range if bad is None else e.op("logical_or", bad, out_of_range)
    # an index outside its own dim must fail as PyTorch's does, not land in another row:
    # -1 makes index_select report it
    linear = e.op("where", bad, -1, linear)
    out_shape = _shape(n)
    picked = out_shape[first:len(out_shape) - (x.ndim - last - 1)]
    flat = e.op("reshape", e.op("expand", linear, size=picked), shape=[math.prod(picked)])
    rows = list(x.shape[:first]) + [math.prod(sizes)] + list(x.shape[last + 1:])
    out = e.op("index_select", e.op("reshape", x, shape=rows), flat, dim=first)
    return e.op("reshape", out, shape=out_shape)


@_op(aten.index_put.default, check=_one_index)
def _index_put(e, n, x, indices, values, accumulate):
    dim = next(i for i, t in enumerate(indices) if t is not None)
    idx = indices[dim]
    flat = _flat_index(e, idx, x.shape[dim])
    # values broadcast to x[..., idx, ...]'s shape, the index dims then flattened to one
    full = list(x.shape[:dim]) + list(idx.shape) + list(x.shape[dim + 1 :])
    rows = list(x.shape[:dim]) + [idx.numel] + list(x.shape[dim + 1 :])
    vdtype = values.dtype
    if list(values.shape) != full:
        values = e.op("expand", values, size=full)
    values = e.cast(e.op("reshape", values, shape=rows), vdtype, x.dtype)
    if accumulate:
        return e.op("index_add", x, flat, values, dim=dim)
    # a scatter along dim, with the index broadcast over the other dims
    one_hot = [1] * x.ndim
    one_hot[dim] = idx.numel
    index = e.op("expand", e.op("reshape", flat, shape=one_hot), size=rows)
    return e.op("scatter", x, index, values, dim=dim)


# ---- creation (dtype and shape always from the output type)


def _fill_value(value, dtype):
    if dtype == torch.bool:
        return bool(value)
    if not dtype.is_floating_point:
        if isinstance(value, float) and not math.isfinite(value):
            raise Unsupported(f"fill value {value} for {dtype}")
        return int(value)  # PyTorch truncates a float fill value too
    return float(value)


def _filled(get_value):
    def handler(e, n, **args):
        dtype = _dtype(n)
        value = _fill_value(get_value(args), dtype)
        return e.op("full", size=_shape(n), fill_value=value, dtype=dtype)

    return handler


for _target, _get in {
    aten.full.default: lambda a: a["fill_value"],
    aten.full_like.default: lambda a: a["fill_value"],
    aten.new_full.default: lambda a: a["fill_value"],
    aten.scalar_tensor.default: lambda a: a["s"],
    # an empty tensor may hold anything: zeros will do
    aten.zeros.default: lambda a: 0,
    aten.zeros_like.default: lambda a: 0,
    aten.new_zeros.default: lambda a: 0,
    aten.empty.memory_format: lambda a: 0,
    aten.empty_like.default: lambda a: 0,
    aten.empty_strided.default: lambda a: 0,
    aten.new_empty.default: lambda a: 0,
    aten.ones.default: lambda a: 1,
    aten.ones_like.default: lambda a: 1,
    aten.new_ones.default: lambda a: 1,
}.items():
    _HANDLERS[_target] = (_filled(_get), None)


@_op(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(e, n, end, start=0, step=1, **_):
    return e.op("arange", start=start, end=end, step=step, dtype=_dtype(n))


# ---- convolutional networks


def _conv_ok(n) -> bool:
    # not transposed, output_padding zero, 1-D or 2-D
    a = _bind(n)
    w = _val(a["weight"])
    return (
        not a["transposed"]
        and not any(a["output_padding"])
        and w is not None
        and w.ndim in (3, 4)
    )


def _conv_attrs(stride, padding, dilation, groups):
    return dict(stride=list(stride), padding=list(padding), dilation=list(dilation), groups=groups)


@_op(aten.convolution.default, check=_conv_ok)
def _convolution(e, n, x, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    name = "conv1d" if weight.ndim == 3 else "conv2d"
    return e.op(name, x, weight, bias, **_conv_attrs(stride, padding, dilation, groups))


@_op(aten.convolution_backward.default, check=_conv_ok)
def _convolution_backward(e, n, grad_output, x, weight, bias_sizes, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    attrs = _conv_attrs(stride, padding, dilation, groups)
    g = grad_output
    want = [output_mask[i] and _wants(n, i) for i in range(3)]
    return (
        e.op("convolution_backward_input", g, weight, input_size=list(x.shape), **attrs)
        if want[0] else None,
        e.op("convolution_backward_weight", g, x, weight_size=list(weight.shape), **attrs)
        if want[1] else None,
        e.op("sum", g, dim=[0] + list(range(2, g.ndim))) if want[2] else None,
    )


def _pool_attrs(kernel_size, stride, padding, ceil_mode):
    return dict(
        kernel_size=list(kernel_size),
        stride=list(stride) if stride else None,  # [] means "the kernel size"
        padding=list(padding),
        ceil_mode=_opt(ceil_mode, False),
    )


def _no_divisor(n) -> bool:
    return _arg(n, "divisor_override") is None


@_op(aten.avg_pool2d.default, check=_no_divisor)
def _avg_pool2d(e, n, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                divisor_override):
    return e.op("avg_pool2d", x, **_pool_attrs(kernel_size, stride, padding, ceil_mode),
                count_include_pad=_opt(count_include_pad, True))


@_op(aten.avg_pool2d_backward.default, check=_no_divisor)
def _avg_pool2d_backward(e, n, grad_output, x, kernel_size, stride, padding, ceil_mode,
                         count_include_pad, divisor_override):
    return e.op("avg_pool2d_backward", grad_output, input_size=list(x.shape),
                **_pool_attrs(kernel_size, stride, padding, ceil_mode),
                count_include_pad=_opt(count_include_pad, True))


@_op(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(e, n, x, output_size):
    return e.op("adaptive_avg_pool2d", x, output_size=list(output_size))


@_op(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(e, n, grad_output, x):
    return e.op("adaptive_avg_pool2d_backward", grad_output, input_size=list(x.shape))


# The indices of max_pool2d_with_indices have no smelt equivalent: only a node whose
# indices nobody reads is translated. The backward recomputes the argmax from the input
# (the first maximal element of each window, as PyTorch's CPU kernel picks) instead.
@_op(aten.max_pool2d_with_indices.default, check=lambda n: not _wants(n, 1))
def _max_pool2d(e, n, x, kernel_size, stride, padding, dilation, ceil_mode):
    attrs = _pool_attrs(kernel_size, stride, padding, ceil_mode)
    return e.op("max_pool2d", x, dilation=list(dilation), **attrs), None


@_op(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(e, n, grad_output, x, kernel_size, stride, padding, dilation,
                         ceil_mode, indices):
    attrs = _pool_attrs(kernel_size, stride, padding, ceil_mode)
    return e.op("max_pool2d_backward", grad_output, x, dilation=list(dilation), **attrs)


# ---- attention


def _sdpa_ok(n) -> bool:
    fw = n.target is aten._scaled_dot_product_flash_attention_for_cpu.default
    # no dropout; the forward's logsumexp is not computed, so nobody may read it
    return _arg(n, "dropout_p") == 0.0 and (not fw or not _wants(n, 1))


@_op(aten._scaled_dot_product_flash_attention_for_cpu.default, check=_sdpa_ok)
def _sdpa(e, n, query, key, value, dropout_p, is_causal, attn_mask, scale):
    out = e.op("scaled_dot_product_attention", query, key, value, attn_mask,
               is_causal=_opt(is_causal, False), scale=scale)
    return out, None


@_op(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, check=_sdpa_ok)
def _sdpa_backward(e, n, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                   attn_mask, scale):
    # smelt's op gives the three gradients flattened and concatenated (q's, k's, v's)
    flat = e.op("scaled_dot_product_attention_backward", grad_out, query, key, value,
                attn_mask, is_causal=_opt(is_causal, False), scale=scale)
    outs, start = [], 0
    for i, t in enumerate((query, key, value)):
        if _wants(n, i):
            part = e.op("narrow", flat, dim=0, start=start, length=t.numel)
            outs.append(e.op("reshape", part, shape=list(t.shape)))
        else:
            outs.append(None)
        start += t.numel
    return tuple(outs)


# ---- multi-output plumbing


def _getitem_ok(n) -> bool:
    # one result of a multi-output op (not Python indexing of a tensor)
    src = n.args[0]
    return (
        isinstance(src, torch.fx.Node)
        and isinstance(_val(src), (tuple, list))
        and isinstance(n.args[1], int)
        and supported(src)
    )


def _getitem(e, n, seq, i):
    v = seq[i]
    if v is None:
        raise Unsupported(f"output {i} of {n.args[0].target} is not computed")
    return v


_HANDLERS[operator.getitem] = (_getitem, _getitem_ok)


# --------------------------------------------------------------------------------------
# Public entry points


def supported(node: torch.fx.Node) -> bool:
    """True when `node` (a `call_function`) can be translated by `to_smelt`."""
    if node.op != "call_function":
        return False
    entry = _HANDLERS.get(node.target)
    if entry is None:
        return False
    # dtypes and shapes: every tensor the node reads or makes must be writable
    vals = [_val(a) for a in node.all_input_nodes]
    out = _val(node)
    vals += list(out) if isinstance(out, (tuple, list)) else [out]
    if node.target is not operator.getitem:  # (its input is a tuple; its output is checked)
        if any(v is not None and not _tensor_ok(v) for v in vals):
            return False
    # symbolic scalars (SymInt sizes of dynamic shapes) have no literal to write
    leaves = []
    torch.fx.node.map_aggregate((node.args, node.kwargs), leaves.append)
    if any(isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) for x in leaves):
        return False
    check = entry[1]
    try:
        return check is None or bool(check(node))
    except Exception:  # an unusual argument form: leave the node to PyTorch
        return False


def _ensure_meta(gm: torch.fx.GraphModule, example_inputs) -> None:
    """Fills node.meta["val"] by fake propagation when the graph lacks it (a graph made
    by symbolic_trace, say); AOTAutograd's graphs have it already."""
    if all("val" in n.meta for n in gm.graph.nodes if n.op == "call_function"):
        return
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = detect_fake_mode(example_inputs)
    if mode is not None:  # fake example inputs: propagate in their own mode
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*example_inputs)
    else:
        FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*example_inputs)


def _constant(e: _Emitter, gm, node) -> V:
    t = reduce(getattr, node.target.split("."), gm)
    if not isinstance(t, torch.Tensor):
        raise Unsupported(f"get_attr {node.target}: not a tensor")
    if t.dtype not in _DTYPES:
        raise Unsupported(f"get_attr {node.target}: dtype {t.dtype}")
    if t.numel() > _MAX_CONSTANT:
        raise Unsupported(
            f"get_attr {node.target}: {t.numel()} elements (at most {_MAX_CONSTANT})"
        )
    try:
        flat = t.detach().cpu().reshape(-1)
        values = (flat.double() if t.dtype.is_floating_point else flat).tolist()
    except Exception as ex:  # a FakeTensor or other tensor without data
        raise Unsupported(f"get_attr {node.target}: no data ({ex})") from None
    # floats print exactly (repr of the double holding the value); bools as true/false
    kind = float if t.dtype.is_floating_point else bool if t.dtype == torch.bool else int
    data = [kind(x) for x in values]
    name = e.op("constant", dtype=t.dtype, shape=list(t.shape), data=data)
    return V(name, tuple(t.shape), t.dtype)


def _wrap(e: _Emitter, node, result, since: int):
    """Turns a handler's result into `V`s typed from the node's FakeTensor(s), writing the
    types on the statements this node made."""
    val = _val(node)
    if isinstance(result, V) or result is None:
        return result
    if isinstance(result, str):
        e.annotate(result, _type(val.shape, val.dtype), since)
        return V(result, tuple(int(d) for d in val.shape), val.dtype)
    outs = []
    for r, t in zip(result, val):
        if isinstance(r, str):
            e.annotate(r, _type(t.shape, t.dtype), since)
            r = V(r, tuple(int(d) for d in t.shape), t.dtype)
        outs.append(r)
    return tuple(outs)


def to_smelt(gm: torch.fx.GraphModule, example_inputs: list) -> Translation:
    """Writes `gm` as a `.smelt` module holding one graph, `fx`, whose inputs are the
    placeholders in order (`%a0`, `%a1`, ...). Raises `Unsupported` naming the first node
    that cannot be written."""
    _ensure_meta(gm, example_inputs)
    e = _Emitter()
    env: dict[torch.fx.Node, Any] = {}
    params: list[str] = []
    inputs: dict[str, int] = {}  # placeholder name -> its position
    out_args = None

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            i = len(params)
            val = node.meta.get("val")
            if val is None and i < len(example_inputs):
                val = example_inputs[i]
            if not isinstance(val, torch.Tensor):
                raise Unsupported(f"input {node.name} is not a tensor ({type(val).__name__})")
            name = f"%a{i}"
            params.append(f"{name}: {_type(val.shape, val.dtype)}")
            env[node] = V(name, tuple(val.shape), val.dtype)
            inputs[name] = i
        elif node.op == "get_attr":
            env[node] = _constant(e, gm, node)
        elif node.op == "call_function":
            if not supported(node):
                raise Unsupported(f"{node.target} ({node.name}) has no smelt translation here")
            fn = _HANDLERS[node.target][0]
            since = len(e.stmts)
            if node.target is operator.getitem:
                result = fn(e, node, env[node.args[0]], node.args[1])
            else:
                result = fn(e, node, **_bind(node, env))
            env[node] = _wrap(e, node, result, since)
        elif node.op == "output":
            out_args = node.args[0]
        else:
            raise Unsupported(f"{node.op} {node.target}")

    if not isinstance(out_args, (tuple, list)):
        out_args = [out_args]
    outputs, returned, position = [], [], {}
    for o in out_args:
        if o is None:
            outputs.append(("none",))
            continue
        v = env.get(o) if isinstance(o, torch.fx.Node) else None
        if not isinstance(v, V):
            raise Unsupported(f"output {o!r} is not a tensor")
        if v.name in inputs:
            # a placeholder returned as it is aliases it; one that only reached the output
            # through a clone must come back as a copy
            kind = "input" if o.op == "placeholder" else "copy"
            outputs.append((kind, inputs[v.name]))
            continue
        if v.name not in position:
            position[v.name] = len(returned)
            returned.append(v.name)
        outputs.append(("value", position[v.name]))
    if not returned:  # a graph returns at least one value; this one is never read
        returned.append(e.op("scalar", value=0))

    text = (
        f"graph fx({', '.join(params)}) {{\n"
        + e.body()
        + f"  return {', '.join(returned)}\n}}\n"
    )
    return Translation(text=text, outputs=outputs)
