"""`smelt._fx`: core-ATen FX graphs (as AOTAutograd hands them to a backend) translated to
`.smelt` text, compiled by smelt and compared with PyTorch running the same graph."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from smelt import _fx, _smelt  # noqa: E402


def _capture(f, args, backward=True):
    """Runs `f` under torch.compile with AOTAutograd and core-ATen decompositions; returns
    [(kind, graph module, the real tensors it was called with)] for the forward and, with
    `backward`, the backward graph."""
    from functorch.compile import make_boxed_func
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def compiler(kind):
        def compile_graph(gm, example_inputs):
            record = [kind, gm, None]
            graphs.append(record)

            def run(*inputs):
                if record[2] is None:
                    record[2] = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs]
                return gm(*inputs)

            return make_boxed_func(run)

        return compile_graph

    torch._dynamo.reset()
    backend = aot_autograd(
        fw_compiler=compiler("fw"),
        bw_compiler=compiler("bw"),
        decompositions=core_aten_decompositions(),
    )
    out = torch.compile(f, backend=backend, dynamic=False)(*args)
    if backward:
        out.sum().backward()
    return [tuple(g) for g in graphs]


def _run_smelt(text, inputs):
    """Compiles `.smelt` text and runs it on torch tensors; returns torch tensors in the
    order of the graph's `return`."""
    fn = _smelt.compile(text)
    outs = fn(*[_smelt.from_dlpack(x.contiguous()) for x in inputs])
    return [torch.from_dlpack(o) for o in outs]


def _check(gm, inputs, rtol=1e-4, atol=1e-5):
    """Translates `gm`, runs it on smelt and compares every output with PyTorch's."""
    tr = _fx.to_smelt(gm, inputs)
    values = _run_smelt(tr.text, inputs)
    want = gm(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(tr.outputs) == len(want)
    for i, (spec, w) in enumerate(zip(tr.outputs, want)):
        if spec[0] == "none":
            assert w is None
            continue
        got = inputs[spec[1]] if spec[0] in ("input", "copy") else values[spec[1]]
        assert got.dtype == w.dtype, f"output {i}"
        assert tuple(got.shape) == tuple(w.shape), f"output {i}"
        if w.dtype.is_floating_point:
            torch.testing.assert_close(got, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert torch.equal(got, w), f"output {i}"
    return tr


def _check_all(f, args, backward=True, **tol):
    graphs = _capture(f, args, backward)
    assert len(graphs) == (2 if backward else 1)
    for _, gm, inputs in graphs:
        _check(gm, inputs, **tol)


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 6)

    def forward(self, x):
        return torch.softmax(self.l2(F.gelu(self.ln(torch.relu(self.l1(x))))), -1)


def test_mlp_forward_and_backward():
    torch.manual_seed(0)
    _check_all(_MLP(), [torch.randn(4, 8)])


class _CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Linear(4, 5)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def test_cnn_inference():
    torch.manual_seed(0)
    model = _CNN().eval()
    model.bn.running_mean.uniform_(-0.5, 0.5)
    model.bn.running_var.uniform_(0.5, 2.0)

    def f(x):
        with torch.no_grad():
            return model(x)

    _check_all(f, [torch.randn(2, 3, 8, 8)], backward=False)


def test_cnn_training_backward_and_unsupported_forward():
    torch.manual_seed(0)
    (_, fw, fw_inputs), (_, bw, bw_inputs) = _capture(_CNN(), [torch.randn(2, 3, 8, 8)])
    # the forward keeps max_pool2d's indices for the backward: smelt has no such output
    pool = next(n for n in fw.graph.nodes if n.target is torch.ops.aten.max_pool2d_with_indices.default)
    assert not _fx.supported(pool)
    with pytest.raises(_fx.Unsupported, match="max_pool2d_with_indices"):
        _fx.to_smelt(fw, fw_inputs)
    # batch norm in training mode (statistics, running averages) is translated
    bn = next(n for n in fw.graph.nodes if "batch_norm" in str(n.target))
    assert _fx.supported(bn)
    _check(bw, bw_inputs, atol=1e-4)


def test_attention_block():
    torch.manual_seed(0)
    qkv, proj = nn.Linear(8, 24), nn.Linear(8, 8)

    def attention(x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, 2, d // 2).transpose(1, 2) for z in qkv(x).split(d, dim=-1))
        scores = (q @ k.transpose(-2, -1)) * (d // 2) ** -0.5
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        y = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        return proj(y.transpose(1, 2).reshape(b, t, d))

    _check_all(attention, [torch.randn(2, 5, 8)])


def test_embedding_cat_slice():
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)

    def f(ids):
        h = emb(ids)
        return torch.cat([h, h[:, 1:3]], 1)[..., 0:2] * 2

    _check_all(f, [torch.randint(0, 10, (2, 5))])


def test_reductions():
    def f(x):
        return (x.sum(1, keepdim=True), x.mean((0, 2)), x.amax(-1, keepdim=True), x.argmax(1),
                x.var(1, keepdim=True), torch.logsumexp(x, 1), (x > 0).any(1), x.max(2).indices,
                x.sum(dtype=torch.float64))  # fmt: skip

    torch.manual_seed(0)
    _check_all(f, [torch.randn(3, 4, 5)], backward=False)


def test_integer_and_bool_ops():
    def f(a, b, m):
        return (a + 2 * b, a // (b.abs() + 1), a % 3, a.clamp(-2, 3), a == b, (a < b) & m,
                ~m, torch.where(m, a, b), a.to(torch.float32) / 2, m.sum(), a * 1.5, ~a, a & b,
                a | 6, a ^ b, m ^ (a > 0), torch.atan(a), (a / 6).asin(), (a / 6).acos())  # fmt: skip

    torch.manual_seed(0)
    args = [torch.randint(-5, 6, (3, 4)), torch.randint(-5, 6, (3, 4)), torch.rand(3, 4) > 0.5]
    _check_all(f, args, backward=False)


def test_scatter_reductions():
    def f(x, i, s):
        return tuple(x.scatter_reduce(1, i, s, r) for r in ("sum", "prod", "mean", "amax", "amin"))

    torch.manual_seed(0)
    args = [torch.randn(3, 5), torch.randint(0, 5, (3, 7)), torch.randn(3, 7)]
    _check_all(f, args, backward=False)


def test_text_and_output_kinds():
    """Inputs handed back and None outputs are reported, not returned by smelt; the text
    types every value a node produces."""
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    s = g.call_function(aten.add.Tensor, (x, y), {"alpha": 2})
    r = g.call_function(aten.sum.dim_IntList, (s, [1], True))
    c = g.call_function(aten.clone.default, (y,))
    g.output((r, x, None, s, r, c))
    gm = torch.fx.GraphModule({}, g)
    inputs = [torch.randn(2, 3), torch.randn(3)]
    tr = _check(gm, inputs)
    assert tr.outputs == [
        ("value", 0), ("input", 0), ("none",), ("value", 1), ("value", 0), ("copy", 1)]
    assert tr.text.startswith("graph fx(%a0: f32[2,3], %a1: f32[3]) {")
    assert "add(%a0, %a1, alpha=2)" in tr.text
    assert "f32[2,1] = sum(" in tr.text


def test_unsupported_op_is_refused():
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    d = g.call_function(aten.native_dropout.default, (x, 0.5, True))
    g.output((g.call_function(__import__("operator").getitem, (d, 0)),))
    gm = torch.fx.GraphModule({}, g)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert not _fx.supported(node)
    with pytest.raises(_fx.Unsupported, match="native_dropout"):
        _fx.to_smelt(gm, [torch.randn(4)])


def test_indexing_with_several_index_tensors():
    """`x[i, j]` with broadcast index tensors on adjacent dims (GPT-2's and Llama's masks),
    negative entries included; an index outside its own dim is an error, as in PyTorch."""
    aten = torch.ops.aten
    x = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    cases = [
        (x, [torch.tensor([[0], [2]]), torch.tensor([[1, -1, 3]])]),          # dims 0, 1
        (x, [None, torch.tensor([0, 3, -2]), torch.tensor([[4], [0]])]),      # dims 1, 2
        (x, [torch.tensor([2, 0]), torch.tensor([1, 1]), torch.tensor([-1, 0])]),
    ]
    for t, idx in cases:
        g = torch.fx.Graph()
        ph = g.placeholder("x")
        ph.meta["val"] = t
        nodes = []
        for k, i in enumerate(idx):
            if i is None:
                nodes.append(None)
                continue
            p = g.placeholder(f"i{k}")
            p.meta["val"] = i
            nodes.append(p)
        out = g.call_function(aten.index.Tensor, (ph, nodes))
        out.meta["val"] = aten.index.Tensor(t, idx)
        g.output(out)
        gm = torch.fx.GraphModule({}, g)
        assert _fx.supported(out)
        _check(gm, [t] + [i for i in idx if i is not None])
    # an index past its own dim (but inside the flattened rows) is refused at run time
    g = torch.fx.Graph()
    ph, p0, p1 = g.placeholder("x"), g.placeholder("i"), g.placeholder("j")
    ph.meta["val"], p0.meta["val"], p1.meta["val"] = x, torch.tensor([0]), torch.tensor([5])
    out = g.call_function(aten.index.Tensor, (ph, [p0, p1]))
    out.meta["val"] = torch.empty(1, 5)
    g.output(out)
    tr = _fx.to_smelt(torch.fx.GraphModule({}, g), [x, torch.tensor([0]), torch.tensor([5])])
    with pytest.raises(IndexError):
        _run_smelt(tr.text, [x, torch.tensor([0]), torch.tensor([5])])
