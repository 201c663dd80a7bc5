"""The tensor surface against NumPy, DLPack without copies, and errors as exceptions."""

import gc

import numpy as np
import pytest

import smelt


def close(t, expected, rtol=1e-6, atol=1e-6):
    got = np.asarray(t)
    assert got.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_creation_and_properties():
    x = smelt.arange(6.0).reshape(2, 3)
    assert x.shape == (2, 3) and x.ndim == 2 and x.numel() == 6
    assert x.dtype == smelt.float32 and x.dtype == "float32" and x.stride() == (3, 1)
    assert x.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert smelt.tensor([[1, 2], [3, 4]]).dtype == smelt.int64
    assert smelt.tensor([True, False]).dtype == smelt.bool
    assert smelt.tensor([1, 2.5]).dtype == smelt.float32
    assert smelt.tensor(3.5).shape == () and smelt.tensor(3.5).item() == 3.5
    assert smelt.zeros(2, 3).tolist() == [[0.0] * 3] * 2
    assert smelt.ones((2,), dtype=smelt.int32).tolist() == [1, 1]
    assert smelt.full((2,), 7).dtype == smelt.int64
    assert smelt.arange(0, 10, 3).tolist() == [0, 3, 6, 9]
    assert "tensor([[0., 1., 2.]" in repr(x)
    with pytest.raises(ValueError):
        smelt.tensor([[1, 2], [3]])


def test_random_is_seeded():
    smelt.manual_seed(3)
    a = smelt.randn(4, 5)
    smelt.manual_seed(3)
    b = smelt.randn(4, 5)
    assert a.tolist() == b.tolist()
    u = np.asarray(smelt.rand(1000))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.05


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pointwise_and_broadcasting_match_numpy(rng, dtype):
    a = rng.standard_normal((3, 1, 5)).astype(dtype)
    b = rng.standard_normal((4, 5)).astype(dtype)
    x, y = smelt.from_numpy(a), smelt.from_numpy(b)
    close(x + y, a + b)
    close(x - y, a - b)
    close(x * y, a * b)
    close(x / y, a / b, rtol=1e-5)
    close(2.0 - x, 2.0 - a)
    close(-x, -a)
    close(abs(x), np.abs(a))
    close(x.exp(), np.exp(a), rtol=1e-5)
    close(x.tanh(), np.tanh(a), rtol=1e-5)
    close(x.relu(), np.maximum(a, 0))
    close(x.sigmoid(), 1 / (1 + np.exp(-a)), rtol=1e-5)
    close(x.maximum(y), np.maximum(a, b))
    close(x > y, a > b)
    close(x ** 2, a ** 2, rtol=1e-5)
    close(smelt.where(x > 0, x, y), np.where(a > 0, a, b))
    close(x.clamp(min=-0.5, max=0.5), np.clip(a, -0.5, 0.5))
    assert (x * 0.5).dtype == x.dtype  # a Python number keeps the tensor's dtype


def test_integer_promotion_and_division_like_torch():
    i = smelt.tensor([7, -7])
    assert (i + 1).dtype == smelt.int64
    assert (i * 0.5).dtype == smelt.float32
    assert (i / 2).tolist() == [3.5, -3.5]
    assert (i // 2).tolist() == [3, -4]
    assert (i % 3).tolist() == [1, 2]
    # Python's bitwise operators on integers, logical ones on bools, as torch
    assert (~i).tolist() == [-8, 6]
    assert (i & 3).tolist() == [3, 1]
    assert (i | 8).tolist() == [15, -7]
    assert (i ^ smelt.tensor([1, 1])).tolist() == [6, -8]
    m = smelt.tensor([True, False])
    assert (~m).tolist() == [False, True]
    assert (m ^ smelt.tensor([True, True])).tolist() == [False, True]


def test_reductions_match_numpy(rng):
    a = rng.standard_normal((4, 6, 5)).astype(np.float64)
    x = smelt.from_numpy(a)
    close(x.sum(), a.sum())
    close(x.sum(dim=1), a.sum(axis=1))
    close(x.sum(dim=(0, 2), keepdim=True), a.sum(axis=(0, 2), keepdims=True))
    close(x.mean(dim=-1), a.mean(axis=-1))
    close(x.amax(dim=1), a.max(axis=1))
    close(x.amin(), a.min())
    close(x.argmax(dim=2), a.argmax(axis=2))
    close(x.var(dim=1), a.var(axis=1, ddof=1))
    close(x.std(dim=1, correction=0), a.std(axis=1))
    close(x.prod(dim=0), a.prod(axis=0))
    close(x.softmax(dim=-1), np.exp(a) / np.exp(a).sum(-1, keepdims=True))
    close(x.logsumexp(dim=1), np.log(np.exp(a).sum(1)))


def test_matmul_and_einsum_match_numpy(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    x, y = smelt.from_numpy(a), smelt.from_numpy(b)
    close(x @ y, a @ b, rtol=1e-5, atol=1e-5)
    close(smelt.matmul(x, y), a @ b, rtol=1e-5, atol=1e-5)
    close(smelt.einsum("bij,jk->bik", x, y), np.einsum("bij,jk->bik", a, b), rtol=1e-5, atol=1e-5)


def test_views_share_memory(rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    x = smelt.from_numpy(a)
    for v, expected in [
        (x.t(), a.T),
        (x.T, a.T),
        (x.transpose(0, 1), a.T),
        (x.reshape(2, 12), a.reshape(2, 12)),
        (x.view(24), a.reshape(24)),
        (x[1], a[1]),
        (x[:, 1:5:2], a[:, 1:5:2]),
        (x[..., None, 2], a[..., None, 2]),
        (x.unsqueeze(0), a[None]),
        (x.narrow(1, 2, 3), a[:, 2:5]),
        (x.expand(3, 4, 6), np.broadcast_to(a, (3, 4, 6))),
        (x.permute(1, 0), a.transpose(1, 0)),
    ]:
        close(v, expected)
        assert np.shares_memory(np.asarray(v), a) or v.numel() == 0
    c = x.t().contiguous()
    assert c.is_contiguous() and c.stride() == (4, 1)
    close(c, a.T)
    d = x.clone()
    assert d.data_ptr() != x.data_ptr()
    close(smelt.cat([x, x], dim=0), np.concatenate([a, a]))
    close(smelt.stack([x, x], dim=1), np.stack([a, a], axis=1))


def test_numpy_round_trip_without_copies(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    x = smelt.from_numpy(a)
    assert x.data_ptr() == a.ctypes.data
    b = x.numpy()
    assert b.ctypes.data == a.ctypes.data
    a[0, 0] = 42.0
    assert x[0, 0].item() == 42.0 and b[0, 0] == 42.0
    # a strided NumPy view arrives with its strides
    s = smelt.from_numpy(a[:, ::2])
    assert s.stride() == (4, 2)
    close(s, a[:, ::2])
    # NumPy's dtypes
    for dt, sd in [(np.float64, smelt.float64), (np.int32, smelt.int32), (np.int64, smelt.int64),
                   (np.uint8, smelt.uint8), (np.bool_, smelt.bool), (np.float16, smelt.float16),
                   (np.int8, smelt.int8), (np.int16, smelt.int16)]:
        arr = (np.arange(6) % 2).astype(dt).reshape(2, 3)
        t = smelt.from_numpy(arr)
        assert t.dtype == sd
        back = np.asarray(t)
        assert back.dtype == arr.dtype and (back == arr).all()


def test_lifetimes_outlive_the_producer():
    a = np.arange(1000, dtype=np.float64)
    x = smelt.from_numpy(a)
    del a
    gc.collect()
    assert x.sum().item() == 499500.0
    y = smelt.arange(10.0)
    b = y.numpy()
    del y
    gc.collect()
    assert b.sum() == 45.0


def test_bad_input_raises_python_exceptions():
    x = smelt.ones(2, 3)
    with pytest.raises(ValueError, match="cannot be multiplied"):
        x @ x
    with pytest.raises(ValueError):
        x.view(4)
    with pytest.raises(IndexError):
        x[5]
    with pytest.raises(IndexError):
        x[0, 0, 0]
    with pytest.raises(TypeError):
        x.to("complex128")
    with pytest.raises(TypeError):
        smelt.from_dlpack(object())
    with pytest.raises(ValueError, match="negative strides"):
        smelt.from_numpy(np.arange(4.0)[::-1])
    with pytest.raises(TypeError, match="bfloat16"):
        np.asarray(x.to(smelt.bfloat16))
    with pytest.raises(ValueError):
        smelt.compile("graph f(%x: f32[2]) {\n  %y = relux(%x)\n  return %y\n}\n")


def test_compiled_function_runs_at_every_binding():
    f = smelt.compile("graph f(%x: f32[N], %y: f32[N]) {\n"
                      "  %s = mul(%x, %y)\n  %r = relu(%s)\n  %t = sum(%r)\n  return %r, %t\n}\n")
    for n in [1, 7, 64]:
        a = np.linspace(-1, 1, n, dtype=np.float32)
        r, t = f(smelt.from_numpy(a), a)
        close(r, np.maximum(a * a, 0))
        close(t, np.maximum(a * a, 0).sum(), rtol=1e-5)
    assert f.compiles == 3
    with pytest.raises(ValueError):
        f(np.ones(2, np.float32), np.ones(3, np.float32))


def test_imports_without_numpy_or_torch():
    """The package needs neither: each is imported only where it is used."""
    import subprocess
    import sys

    code = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("numpy", "torch"):
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Absent())
for m in [m for m in sys.modules if m.split(".")[0] in ("numpy", "torch")]:
    del sys.modules[m]
import smelt
x = smelt.arange(6.0).reshape(2, 3)
assert (x @ x.T).tolist() == [[5.0, 14.0], [14.0, 50.0]]
f = smelt.compile("graph f(%x: f32[2]) {\\n  %y = neg(%x)\\n  return %y\\n}\\n")
assert f(smelt.tensor([1.0, 2.0]))[0].tolist() == [-1.0, -2.0]
"""
    subprocess.run([sys.executable, "-c", code], check=True)
