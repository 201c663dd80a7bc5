"""GFLOP/s of the f32 GEMMs of the peer MLP and of a BERT-sized encoder in OpenBLAS (numpy's)
and MKL (PyTorch's), one thread: what the GEMM libraries of the peers reach at the shapes
`cargo bench -p smelt-rt --bench panels` times.

    OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 python scripts/blas_gemms.py numpy
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 python scripts/blas_gemms.py torch

(the environment caps both at AVX2; without it they use what the CPU has).
"""
import sys
import time

import numpy as np

SHAPES = [(256, 4096, 1024), (256, 1024, 4096), (4096, 384, 384), (4096, 1536, 384), (4096, 384, 1536)]


def rate(f, flop):
    reps = max(3, int(2e9 / flop))
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            f()
        best = min(best, (time.perf_counter() - t) / reps)
    return flop / best / 1e9


def main():
    lib = sys.argv[1] if len(sys.argv) > 1 else "numpy"
    if lib == "torch":
        import torch
        torch.set_num_threads(1)
    for m, n, k in SHAPES:
        a = np.random.rand(m, k).astype(np.float32)
        b = np.random.rand(k, n).astype(np.float32)
        if lib == "torch":
            ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.empty(m, n)
            g = rate(lambda: torch.matmul(ta, tb, out=tc), 2.0 * m * n * k)
        else:
            c = np.empty((m, n), np.float32)
            g = rate(lambda: np.matmul(a, b, out=c), 2.0 * m * n * k)
        print(f"{lib}: {m} x {k} . {k} x {n}: {g:.1f} GFLOP/s (one thread)")


if __name__ == "__main__":
    main()
