#!/usr/bin/env python3
"""Writes the ONNX backend node tests (the `onnx` package's own conformance cases) to a folder
that `tests/onnx_node.rs` runs through `smelt run`.

    python scripts/onnx_node_cases.py OUT_DIR

For every case: OUT_DIR/<case>/model.onnx, and the first data set as input_K.pb and
output_K.pb (serialized TensorProtos). OUT_DIR/cases.tsv lists each case with the suite's
tolerances and whether its inputs and outputs are plain tensors (sequences, maps and optional
values are not):

    name<TAB>rtol<TAB>atol<TAB>plain<TAB>op types (comma-separated)
"""

import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node


def is_plain(model):
    """Whether every graph input and output is a tensor."""
    values = list(model.graph.input) + list(model.graph.output)
    return all(v.type.HasField("tensor_type") for v in values)


def as_tensor(value, name):
    """A case's value as a TensorProto (already one, or a numpy array)."""
    if isinstance(value, onnx.TensorProto):
        return value
    return numpy_helper.from_array(np.asarray(value), name)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rows = []
    for case in node.collect_testcases(None):
        if not case.data_sets:
            continue
        plain = is_plain(case.model)
        folder = os.path.join(out, case.name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        if plain:
            inputs, outputs = case.data_sets[0]
            for kind, values, infos in (
                ("input", inputs, case.model.graph.input),
                ("output", outputs, case.model.graph.output),
            ):
                for k, (value, info) in enumerate(zip(values, infos)):
                    path = os.path.join(folder, f"{kind}_{k}.pb")
                    with open(path, "wb") as f:
                        f.write(as_tensor(value, info.name).SerializeToString())
        ops = sorted({n.op_type for n in case.model.graph.node})
        rows.append(
            f"{case.name}\t{case.rtol}\t{case.atol}\t{int(plain)}\t{','.join(ops)}"
        )
    with open(os.path.join(out, "cases.tsv"), "w") as f:
        f.write("\n".join(sorted(rows)) + "\n")
    print(f"{len(rows)} cases written to {out} (onnx {onnx.__version__})")


if __name__ == "__main__":
    main()
