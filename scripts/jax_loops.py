"""The peers of benches/control_flow.rs: the seeds' linear regression (y = 2x + 1, 100
points, SGD lr 0.1) for N steps as one jax.lax.fori_loop under jax.jit (jax.grad inside the
body), and as a NumPy loop. Driven by the bench through peer_protocol."""

import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from peer_protocol import serve  # noqa: E402

LR = 0.1


def setup(args):
    import jax
    import jax.numpy as jnp

    steps = int(args[0])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 1)).astype(np.float32)
    y = (2 * x + 1 + 0.1 * rng.standard_normal((100, 1))).astype(np.float32)

    def loss(p, x, y):
        w, b = p
        return jnp.mean((x * w + b - y) ** 2)

    @jax.jit
    def fit(p, x, y):
        def body(_, p):
            g = jax.grad(loss)(p, x, y)
            return (p[0] - LR * g[0], p[1] - LR * g[1])

        return jax.lax.fori_loop(0, steps, body, p)

    p0 = (jnp.zeros((1,), jnp.float32), jnp.zeros((1,), jnp.float32))
    xj, yj = jnp.asarray(x), jnp.asarray(y)

    def run_jax():
        jax.block_until_ready(fit(p0, xj, yj))

    def run_numpy():
        w = np.zeros(1, np.float32)
        b = np.zeros(1, np.float32)
        for _ in range(steps):
            err = x * w + b - y
            w = w - LR * np.mean(2 * err * x)
            b = b - LR * np.mean(2 * err)

    return {"jax_fori_loop": run_jax, "numpy_loop": run_numpy}


if __name__ == "__main__":
    serve(setup)
