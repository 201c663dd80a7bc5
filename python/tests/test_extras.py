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


def lane_sum_case():
    """Rows of 1e8, 4094 ones and -1e8, doubled and summed: exactly 8188 in float64, but
    not when the vector lanes accumulate in f32 (1e8 + 2 rounds back to 1e8)."""
    x = np.ones((4, 4096), np.float32)
    x[:, 0], x[:, -1] = 1e8, -1e8
    return x, 8188.0


def test_fast_math_sums_in_f32_lanes_and_the_default_is_exact():
    text = "graph f(%x: f32[4, 4096]) {\n  %y = mul(%x, 2.0)\n  %s = sum(%y, dim=[1])\n  return %s\n}\n"
    x, exact = lane_sum_case()
    assert float(x.astype(np.float64).sum(1)[0] * 2) == exact
    np.testing.assert_array_equal(np.asarray(smelt.compile(text)(x)[0]), np.full(4, exact))
    fast = np.asarray(smelt.compile(text, fast_math=True)(x)[0])
    assert (fast != exact).all(), fast


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
