"""Builds the seed corpora of the fuzz targets from the repository's own files.

Usage: python3 fuzz/seed.py SMELT_BINARY [ONNX_CASES_DIR]

Writes fuzz/seeds/<target>/: the .smelt models in the repository and those `smelt import`
makes of its ONNX models; small .npy files of every dtype the reader takes, both byte
orders and both memory orders; small safetensors files; the ONNX models `smelt export`
makes of the .smelt ones (and, given ONNX_CASES_DIR, the node test cases' models); and the
payloads of the disk-cache entries that compiling the .smelt models writes; and calls of
the AOT entry point's models with each fault of its arguments. Needs numpy.
"""

import hashlib
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "seeds"
# ONNX models above this size would slow every run of the target down for little coverage
MAX_SEED_BYTES = 64 * 1024


def put(target, data):
    """Stores one seed under its content's hash (the corpus convention)."""
    if len(data) > MAX_SEED_BYTES:
        return
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


def repo_files(suffix):
    out = subprocess.run(["git", "ls-files", f"*{suffix}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    return [ROOT / f for f in out]


def npy_seeds():
    dtypes = ["bool", "u1", "i1", "i2", "i4", "i8", "f2", "f4", "f8", "u2", "u4", "u8"]
    for dt in dtypes:
        a = (np.arange(6) % 3).astype(dt).reshape(2, 3)
        for order in ("C", "F"):
            for end in ("<", ">"):
                b = np.asarray(a, dtype=np.dtype(dt).newbyteorder(end), order=order)
                with tempfile.TemporaryFile() as f:
                    np.save(f, b)
                    f.seek(0)
                    put("npy", f.read())
    for shape in [(), (0,), (1, 0, 3), (5,)]:
        with tempfile.TemporaryFile() as f:
            np.save(f, np.ones(shape, dtype="f4"))
            f.seek(0)
            put("npy", f.read())
    for f in repo_files(".npy"):
        put("npy", f.read_bytes())


def safetensors(tensors):
    """The bytes of a safetensors file holding (name, dtype tag, shape, bytes)."""
    header, offset, data = {}, 0, b""
    for name, tag, shape, raw in tensors:
        header[name] = {"dtype": tag, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    tags = {"F64": "f8", "F32": "f4", "F16": "f2", "I64": "i8", "I32": "i4", "I16": "i2",
            "I8": "i1", "U8": "u1", "BOOL": "bool"}
    for tag, dt in tags.items():
        a = (np.arange(6) % 2).astype(dt)
        put("safetensors", safetensors([("w", tag, (2, 3), a.tobytes())]))
    put("safetensors", safetensors([]))
    put("safetensors", safetensors([("a.weight", "F32", (2,), np.ones(2, "f4").tobytes()),
                                    ("b", "BF16", (1, 1), b"\x80\x3f"),
                                    ("empty", "F32", (0, 4), b"")]))


def aot_entry_seeds():
    """Calls of the aot_entry target's models (src/fuzz/aot_entry.rs): the first byte picks
    the model (low two bits) and the faults (one bit each), the second which pointer and how
    far off the scratch is, the rest the inputs' bytes."""
    rng = np.random.default_rng(0)
    fills = [b"", bytes(range(1, 9)), rng.integers(0, 256, 64, dtype=np.uint8).tobytes()]
    for model in range(3):
        for fault in [0] + [1 << b for b in range(2, 8)] + [0x30, 0xc0]:
            for fill in fills:
                put("aot_entry", bytes([model | fault, 3]) + fill)


def main():
    smelt = pathlib.Path(sys.argv[1]).resolve()
    cases = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        models = repo_files(".smelt")
        for i, f in enumerate(repo_files(".onnx")):
            d = tmp / f"import{i}"
            r = subprocess.run([smelt, "import", f, "--out", d], capture_output=True)
            if r.returncode == 0:
                models += sorted(d.glob("*.smelt"))
        for f in models:
            put("smelt_text", f.read_bytes())
        for i, f in enumerate(repo_files(".smelt")):
            onnx = tmp / f"export{i}.onnx"
            r = subprocess.run([smelt, "export", f, "--onnx", onnx], capture_output=True)
            if r.returncode == 0:
                put("onnx", onnx.read_bytes())
        if cases:
            for f in sorted(cases.glob("*/model.onnx")):
                put("onnx", f.read_bytes())
        cache = tmp / "cache"
        env = dict(os.environ, SMELT_CACHE_DIR=str(cache))
        for f in repo_files(".smelt"):
            subprocess.run([smelt, "profile", f, "--random-inputs", "--repeat", "1"], env=env,
                           capture_output=True)
        for f in sorted(cache.rglob("*")):
            if f.is_file() and f.read_bytes()[:8] == b"SMELTCPU":
                put("cache_entry", f.read_bytes()[20:])
    npy_seeds()
    safetensors_seeds()
    aot_entry_seeds()
    for t in sorted(OUT.iterdir()):
        print(f"{t.name}: {len(list(t.iterdir()))} seeds")


if __name__ == "__main__":
    main()
