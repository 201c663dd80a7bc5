"""`torch.compile(model, backend="smelt")`.

Dynamo hands the backend an FX graph; AOTAutograd lowers it to core-ATen ops (forward and,
for training, backward graphs) and passes each to `_compile_graph`. There the graph is
partitioned: the nodes smelt can express (`_fx.supported`) are grouped into subgraphs, each
translated to `.smelt` text and compiled by smelt; any other node stays in PyTorch. Tensors
cross between the two by DLPack, without copies.

Options (`torch.compile(..., options={...})`): `fuse` (default True) and `fast_math`
(default False: approximations that can change IEEE results, as `smelt.compile` takes them).

PyTorch loads this module through the backend's entry point; `import smelt` alone does not.
"""

from __future__ import annotations

import functools
import operator

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from . import _fx, _smelt

__all__ = ["smelt_backend", "explain"]


def smelt_backend(gm, example_inputs, options=None, **_ignored):
    """The backend Dynamo calls (registered as "smelt" through the package's entry point)."""
    options = dict(options or {})
    report = options.pop("_report", None)
    known = {"fuse": True, "fast_math": False}
    unknown = set(options) - set(known)
    if unknown:
        raise ValueError(f"smelt backend: unknown options {sorted(unknown)} (known: {', '.join(known)})")
    flags = {k: bool(options.get(k, default)) for k, default in known.items()}
    compiler = functools.partial(_compile_graph, flags=flags, report=report)
    if any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in example_inputs):
        # smelt's Python binding exchanges host tensors only for now: PyTorch runs the graph
        if report is not None:
            report.append({"graph": len(report), "smelt": [], "torch": ["(not on the CPU)"]})
        return gm.forward
    return aot_autograd(
        fw_compiler=compiler,
        bw_compiler=compiler,
        decompositions=core_aten_decompositions(),
    )(gm, example_inputs)


def _compile_graph(gm, example_inputs, flags=None, report=None):
    """One ATen graph: smelt runs the parts it supports, PyTorch the rest."""
    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    fused = partitioner.fuse_partitions(partitions)
    in_smelt, in_torch = [], []
    for node in list(fused.graph.nodes):
        if node.op == "call_module" and node.target.startswith("fused_"):
            sub = getattr(fused, node.target)
            _carry_meta(node, sub)
            in_smelt.append(sorted(n.target.__name__ for n in sub.graph.nodes
                                   if n.op == "call_function"))
            setattr(fused, node.target, SmeltModule(sub, flags or {}))
        elif node.op == "call_function" and node.target is not operator.getitem:
            # (getitem only unpacks a fused subgraph's tuple of results)
            in_torch.append(getattr(node.target, "__name__", str(node.target)))
    fused.recompile()
    if report is not None:
        report.append({"graph": len(report), "smelt": in_smelt, "torch": sorted(in_torch)})
    return make_boxed_func(fused.forward)


def _carry_meta(call, sub):
    """Gives the subgraph's placeholders the example values of the parent's arguments (the
    partitioner makes new placeholders without them)."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for p, a in zip(placeholders, call.args):
        if "val" in getattr(a, "meta", {}):
            p.meta["val"] = a.meta["val"]


class _Support(OperatorSupportBase):
    def is_node_supported(self, submodules, node):
        return node.op == "call_function" and _fx.supported(node)


class SmeltModule(torch.nn.Module):
    """Stands in for a fused subgraph: translates it once, compiles it with smelt, and runs
    it on the subgraph's inputs through DLPack."""

    def __init__(self, sub, flags: dict):
        super().__init__()
        example = [p.meta.get("val") for p in sub.graph.nodes if p.op == "placeholder"]
        self.translation = _fx.to_smelt(sub, example)
        self.fn = _smelt.compile(self.translation.text, file="<torch.compile>", **flags)
        self.single = _single_output(sub)
        self.kept = {}  # argument position -> (parameter, its version, smelt's view)

    def imported(self, i, a):
        """`a` as a smelt tensor. A parameter keeps its smelt view between calls while
        PyTorch has not written to it, so that what smelt derives from a weight (a
        convolution's reordered copy) is reused, as for its own."""
        if not isinstance(a, torch.nn.Parameter):
            return _smelt.from_dlpack(a.detach())
        kept = self.kept.get(i)
        if kept is not None and kept[0] is a and kept[1] == a._version:
            return kept[2]
        raw = _smelt.from_dlpack(a.detach())
        self.kept[i] = (a, a._version, raw)
        return raw

    def forward(self, *args):
        outs = self.fn(*[self.imported(i, a) for i, a in enumerate(args)])
        results = []
        for spec in self.translation.outputs:
            if spec[0] == "value":
                results.append(torch.from_dlpack(outs[spec[1]]))
            elif spec[0] == "input":
                results.append(args[spec[1]])
            elif spec[0] == "copy":
                results.append(args[spec[1]].clone())
            else:
                results.append(None)
        return results[0] if self.single else tuple(results)


def _single_output(sub) -> bool:
    """Whether the subgraph returns one value rather than a tuple."""
    out = next(n for n in sub.graph.nodes if n.op == "output")
    return not isinstance(out.args[0], (tuple, list))


def explain(fn, *args, **kwargs):
    """Compiles `fn` with the smelt backend, calls it on `args`, and reports how each graph
    was split: the ATen ops smelt runs (per compiled subgraph) and those left to PyTorch."""
    report: list = []
    backend = functools.partial(smelt_backend, options={"_report": report})
    compiled = torch.compile(fn, backend=backend)
    compiled(*args, **kwargs)
    return Explanation(report)


class Explanation:
    """What `explain` found: one entry per ATen graph (forward, and backward if run)."""

    def __init__(self, graphs):
        self.graphs = graphs

    @property
    def smelt_ops(self) -> int:
        return sum(len(s) for g in self.graphs for s in g["smelt"])

    @property
    def torch_ops(self) -> list:
        return [op for g in self.graphs for op in g["torch"]]

    def __repr__(self) -> str:
        lines = []
        for g in self.graphs:
            lines.append(f"graph {g['graph']}: {len(g['smelt'])} smelt subgraph(s) with "
                         f"{sum(map(len, g['smelt']))} ops; {len(g['torch'])} ops in PyTorch"
                         + (f" ({', '.join(sorted(set(g['torch'])))})" if g["torch"] else ""))
        return "\n".join(lines)
