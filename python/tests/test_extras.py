"""ONNX models, compiled `.smelt` files, the profiler and ahead-of-time objects from Python."""

import json
import os
import pathlib

import numpy as np
import pytest

import smelt

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "data" / "onnx_models"


def test_onnx_model_matches_onnxruntime_outputs():
    # the committed ResNet-18 export, its input and onnxruntime's output
    d = MODELS / "resnet18"
    m = smelt.onnx.load(d / "model.onnx")
    x = np.load(d / "input_0.npy")
    (y,) = m(x)
    expected = np.load(d / "output_0.npy")
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-3, atol=1e-4)
    (y2,) = m(**{m.input_names[0]: smelt.from_numpy(x)})
    assert np.array_equal(np.asarray(y2), np.asarray(y))
    assert m.compiles == 1
    with pytest.raises(ValueError, match="missing input"):
        m(nope=x)
    with pytest.raises(ValueError, match="no input named 'nope'"):
        m(x, nope=x)
    with pytest.raises(OSError):
        smelt.onnx.load(d / "missing.onnx")


def test_load_a_smelt_file_and_run_it():
    f = smelt.load(ROOT / "examples" / "models" / "mlp_block.smelt")
    text = f.text()
    assert text.startswith("graph")
    rng = np.random.default_rng(0)
    # the inputs' types, read from the graph's first line: `graph NAME(%x: f32[..], ...)`
    header = text.split("{", 1)[0]
    shapes = [[int(n) for n in p.split("[")[1].split("]")[0].split(",")]
              for p in header.split("%")[1:]]
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    fused = f(*args)
    unfused = smelt.load(ROOT / "examples" / "models" / "mlp_block.smelt", fuse=False)(*args)
    for a, b in zip(fused, unfused):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_profile_records_ops_and_compiled_calls(tmp_path):
    f = smelt.compile("graph f(%x: f32[64, 64]) {\n  %y = matmul(%x, %x)\n  %z = relu(%y)\n"
                      "  return %z\n}\n")
    x = smelt.randn(64, 64)
    f(x)  # compiled outside the recording
    with smelt.profile() as prof:
        (x @ x).relu()
        f(x)
    rows = prof.key_averages()
    keys = {r["key"]: r for r in rows}
    assert keys["matmul"]["kind"] == "op" and keys["matmul"]["count"] == 1
    assert any(r["kind"] != "op" for r in rows), rows
    table = rows.table(sort_by="self_cpu_time_total", row_limit=3)
    assert "matmul" in table or "Self time total" in table
    prof.export_chrome_trace(tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert trace["traceEvents"]
    with pytest.raises(ValueError, match="unknown sort key"):
        rows.table(sort_by="nope")


@pytest.mark.skipif(not os.environ.get("SMELT_RT_LIB"), reason="SMELT_RT_LIB names the run-time library")
def test_compile_aot_writes_object_and_header(tmp_path):
    smelt.compile_aot(ROOT / "examples" / "models" / "mlp_block.smelt", tmp_path, name="mlp")
    names = set(os.listdir(tmp_path))
    assert {"mlp.o", "mlp.h", "manifest.json", "libsmelt_rt.a"} <= names, names
    assert "int mlp_run(" in (tmp_path / "mlp.h").read_text()


def test_cli_errors_are_python_exceptions(tmp_path):
    with pytest.raises(ValueError):
        smelt.cli("no-such-command")
    bad = tmp_path / "bad.smelt"
    bad.write_text("graph f(%x: f32[2]) {\n  %y = relux(%x)\n  return %y\n}\n")
    with pytest.raises(ValueError, match="unknown op 'relux'"):
        smelt.cli("check", bad)
