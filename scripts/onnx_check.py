#!/usr/bin/env python3
"""Checks an ONNX model with onnx.checker (full_check=True) and runs it on onnxruntime.

    python scripts/onnx_check.py MODEL.onnx OUT_DIR [NAME=FILE.npy ...]

Writes onnxruntime's outputs as OUT_DIR/out0.npy, out1.npy, ... in the graph's output
order (the layout `smelt run` writes), so tests compare the two with the same reader.
Needs `pip install onnx onnxruntime numpy`.
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, out = sys.argv[1], sys.argv[2]
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    feeds = {}
    for arg in sys.argv[3:]:
        name, file = arg.split("=", 1)
        feeds[name] = np.load(file)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    os.makedirs(out, exist_ok=True)
    for k, value in enumerate(session.run(None, feeds)):
        np.save(os.path.join(out, f"out{k}.npy"), value)


if __name__ == "__main__":
    main()
