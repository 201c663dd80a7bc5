"""Fits the GELUs' tail polynomials (`GELU_ERF_TAIL`, `GELU_TANH_TAIL` in rt/src/consts.rs).

With a = |x|, both GELUs are x - x*F(a)*exp(-g(a)) above 0 and x*F(a)*exp(-g(a)) below:
the exact one with g = a^2/2 and F = H(a) = erfc(a/sqrt 2) * exp(a^2/2) / 2, the tanh one
with g = v(a) = 2*sqrt(2/pi)*(a + 0.044715*a^3) and F = E(a) = 1 / (1 + exp(-v)). Each F is
fitted on eight intervals of a (those that the exponent and two leading mantissa bits of
a + 4 number), one polynomial of degree 7 per interval in a - center: least squares at Chebyshev nodes, reweighted (Lawson) towards the
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


def e(a):
    v = 2.0 * np.sqrt(2.0 / np.pi) * (a + 0.044715 * a**3)
    return 1.0 / (1.0 + np.exp(-v))


def horner_f32(c, u):
    acc = np.full_like(u, c[-1], dtype=np.float32)
    for ci in c[-2::-1]:
        # the product of two f32s is exact in f64: one rounding, as an fma
        acc = (acc.astype(np.float64) * u.astype(np.float64) + np.float64(ci)).astype(F32)
    return acc


def fit(f, lo, hi, center):
    # a hair past each end: a + 4 may round across a boundary
    lo2, hi2 = max(lo - 1e-3, 0.0), hi + 1e-3
    k = np.arange(400)
    xs = (lo2 + hi2) / 2 + (hi2 - lo2) / 2 * np.cos(np.pi * (k + 0.5) / len(k))
    y = f(xs)
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
    centers = [F32(round((lo + hi) / 2 * 8) / 8) for lo, hi in INTERVALS]
    print("pub const GELU_TAIL_CENTER: [f32; 8] = [" + ", ".join(str(c) for c in centers) + "];")
    for name, f in [("GELU_ERF_TAIL", h), ("GELU_TANH_TAIL", e)]:
        tables = []
        for (lo, hi), center in zip(INTERVALS, centers):
            c = fit(f, lo, hi, center)
            t = np.linspace(lo, hi, 40001).astype(F32).astype(np.float64)
            got = horner_f32(c, (t - float(center)).astype(F32)).astype(np.float64)
            err = np.max(np.abs(got - f(t)) / f(t)) / 2.0**-24
            print(f"// {name} [{lo}, {hi}]: center {center}, max error {err:.2f}·2^-24")
            tables.append(c)
        print(f"pub const {name}: [[f32; 8]; 8] = [")
        for j in range(DEGREE + 1):
            print("    [" + ", ".join(str(t[j]) for t in tables) + "],")
        print("];")


if __name__ == "__main__":
    main()
