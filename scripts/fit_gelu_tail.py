"""Fits the exact GELU's tail polynomials (`GELU_TAIL` in rt/src/consts.rs).

H(a) = erfc(a/sqrt 2) * exp(a^2/2) / 2 on eight intervals of a = |x| (those that the
exponent and two leading mantissa bits of a + 4 number), one polynomial of degree 7 per
interval in a - center: least squares at Chebyshev nodes, reweighted (Lawson) towards the
smallest maximal relative error, the coefficients rounded to f32 from the highest down with
the lower ones refitted after each. Prints the Rust constants and each interval's error
when evaluated in f32 by Horner's rule.

Needs numpy and scipy: python scripts/fit_gelu_tail.py
"""

import numpy as np
from scipy.special import erfcx

F32 = np.float32
DEGREE = 7
INTERVALS = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 6), (6, 8), (8, 10), (10, 13.5)]


def h(a):
    return 0.5 * erfcx(a / np.sqrt(2.0))


def horner_f32(c, u):
    acc = np.full_like(u, c[-1], dtype=np.float32)
    for ci in c[-2::-1]:
        # the product of two f32s is exact in f64: one rounding, as an fma
        acc = (acc.astype(np.float64) * u.astype(np.float64) + np.float64(ci)).astype(F32)
    return acc


def fit(lo, hi, center):
    # a hair past each end: a + 4 may round across a boundary
    lo2, hi2 = max(lo - 1e-3, 0.0), hi + 1e-3
    k = np.arange(400)
    xs = (lo2 + hi2) / 2 + (hi2 - lo2) / 2 * np.cos(np.pi * (k + 0.5) / len(k))
    y = h(xs)
    a = np.vander(xs - float(center), DEGREE + 1, increasing=True)
    w = np.ones_like(y)
    for _ in range(30):
        ww = w / np.abs(y)
        c, *_ = np.linalg.lstsq(a * ww[:, None], y * ww, rcond=None)
        e = np.abs(a @ c - y) / np.abs(y)
        w = w * (e / e.max() + 1e-3)
        w /= w.max()
    ww = w / np.abs(y)
    c, *_ = np.linalg.lstsq(a * ww[:, None], y * ww, rcond=None)
    for j in range(DEGREE, -1, -1):
        c[j] = float(F32(c[j]))
        if j > 0:
            rest = y - a[:, j:] @ c[j:]
            c[:j], *_ = np.linalg.lstsq(a[:, :j] * ww[:, None], rest * ww, rcond=None)
    return c.astype(F32)


def main():
    centers, tables = [], []
    for lo, hi in INTERVALS:
        center = F32(round((lo + hi) / 2 * 8) / 8)
        c = fit(lo, hi, center)
        t = np.linspace(lo, hi, 40001).astype(F32).astype(np.float64)
        got = horner_f32(c, (t - float(center)).astype(F32)).astype(np.float64)
        err = np.max(np.abs(got - h(t)) / h(t)) / 2.0**-24
        print(f"// [{lo}, {hi}]: center {center}, max error {err:.2f}·2^-24 of H")
        centers.append(center)
        tables.append(c)
    print("pub const GELU_TAIL_CENTER: [f32; 8] = [" + ", ".join(str(c) for c in centers) + "];")
    print("pub const GELU_TAIL: [[f32; 8]; 8] = [")
    for j in range(DEGREE + 1):
        print("    [" + ", ".join(str(t[j]) for t in tables) + "],")
    print("];")


if __name__ == "__main__":
    main()
