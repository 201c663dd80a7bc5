"""`torch.compile(backend="smelt")` on real PyTorch models against eager PyTorch: forward
passes, training steps, partitions around unsupported ops, and the options."""

import copy

import pytest

torch = pytest.importorskip("torch")

import smelt  # noqa: E402

torch.manual_seed(0)


def compare(model, *inputs, rtol=1e-4, atol=1e-4):
    """Compiled and eager outputs of `model` on `inputs`, checked close; returns the
    explanation of the split."""
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
        got = torch.compile(model, backend="smelt")(*inputs)
    flat_e = expected if isinstance(expected, (tuple, list)) else [expected]
    flat_g = got if isinstance(got, (tuple, list)) else [got]
    for e, g in zip(flat_e, flat_g):
        torch.testing.assert_close(g, e, rtol=rtol, atol=atol)
    with torch.no_grad():
        report = smelt.explain(model, *inputs)
    # every ATen op of these models' inference runs in smelt
    assert report.smelt_ops > 0 and report.torch_ops == [], report
    return report


def train_steps(model, batch, loss_fn, steps=3, lr=0.05, rtol=1e-4, atol=1e-5):
    """The same SGD steps eagerly and through the backend: losses and weights agree."""
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="smelt")
    opt_e = torch.optim.SGD(eager.parameters(), lr=lr)
    opt_c = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        losses = []
        for m, opt in [(eager, opt_e), (compiled, opt_c)]:
            opt.zero_grad()
            loss = loss_fn(m, batch)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=rtol, atol=atol)
    for pe, pc in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(pc, pe, rtol=10 * rtol, atol=10 * atol)


def test_mlp_forward_runs_in_smelt_alone():
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                            torch.nn.Linear(32, 4), torch.nn.Softmax(dim=-1))
    compare(m, torch.randn(8, 16))


def test_mlp_training_matches_eager():
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    x, y = torch.randn(16, 16), torch.randint(0, 3, (16,))
    train_steps(m, (x, y), lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]))


def test_resnet18_forward():
    tv = pytest.importorskip("torchvision")
    m = tv.models.resnet18(num_classes=10)
    compare(m, torch.randn(2, 3, 64, 64), rtol=1e-3, atol=1e-3)


def test_mobilenet_v3_forward():
    tv = pytest.importorskip("torchvision")
    m = tv.models.mobilenet_v3_small(num_classes=10)
    compare(m, torch.randn(2, 3, 64, 64), rtol=1e-3, atol=1e-3)


def test_small_cnn_training_matches_eager():
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AvgPool2d(2), torch.nn.Conv2d(8, 8, 3, stride=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,))
    train_steps(m, (x, y), lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                rtol=1e-3, atol=1e-4)


def test_vit_forward():
    tv = pytest.importorskip("torchvision")
    m = tv.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                    hidden_dim=32, mlp_dim=64, num_classes=10)
    compare(m, torch.randn(2, 3, 32, 32), rtol=1e-3, atol=1e-4)


def _transformers():
    return pytest.importorskip("transformers")


def test_bert_forward_and_training():
    tr = _transformers()
    cfg = tr.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    m = tr.BertModel(cfg)
    ids = torch.randint(0, 100, (2, 12))
    compare(m, ids, rtol=1e-3, atol=1e-4)
    cls = tr.BertForSequenceClassification(cfg)
    labels = torch.tensor([0, 1])
    train_steps(cls, (ids, labels), lambda m, b: m(input_ids=b[0], labels=b[1]).loss,
                rtol=1e-3, atol=1e-4)


def test_gpt2_forward_and_training():
    tr = _transformers()
    cfg = tr.GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    m = tr.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 100, (2, 10))
    compare(m, ids, rtol=1e-3, atol=1e-4)
    train_steps(m, ids, lambda m, b: m(input_ids=b, labels=b).loss, rtol=1e-3, atol=1e-4)


def test_llama_forward():
    tr = _transformers()
    cfg = tr.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, use_cache=False)
    m = tr.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 100, (2, 10))
    compare(m, ids, rtol=1e-3, atol=1e-4)


def test_unsupported_op_runs_in_pytorch_through_the_partition():
    def f(x):
        y = torch.relu(x) * 2.0
        s, _ = torch.sort(y, dim=-1)  # no sort in smelt's graphs
        return s.exp() + 1.0

    x = torch.randn(4, 7)
    torch.testing.assert_close(torch.compile(f, backend="smelt")(x), f(x))
    report = smelt.explain(f, x)
    assert report.smelt_ops > 0 and any("sort" in op for op in report.torch_ops), report


def test_options_and_errors():
    m = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    unfused = torch.compile(m, backend="smelt", options={"fuse": False})
    torch.testing.assert_close(unfused(x), m(x))
    with pytest.raises(Exception, match="unknown options.*known: fuse, fast_math"):
        torch.compile(m, backend="smelt", options={"fusion": True})(x)


def test_fast_math_reaches_the_compiled_kernels():
    """The option changes the code: a doubled row of 1e8, 4094 ones and -1e8 sums to
    exactly 8188 in f64 lanes (the default), and loses the ones in f32 lanes."""
    x = torch.ones(4, 4096)
    x[:, 0], x[:, -1] = 1e8, -1e8

    def f(x):
        return (x * 2).sum(1)

    torch._dynamo.reset()
    exact = torch.compile(f, backend="smelt")(x)
    torch.testing.assert_close(exact, torch.full((4,), 8188.0), rtol=0, atol=0)
    torch._dynamo.reset()
    fast = torch.compile(f, backend="smelt", options={"fast_math": True})(x)
    assert (fast != 8188.0).all(), fast


def test_each_batch_size_compiles_for_smelt_with_dynamic_false():
    """Dynamo makes a dim symbolic when a second size arrives, and the translation takes
    static sizes only; `dynamic=False` compiles each size, wholly in smelt."""
    import functools

    from smelt.dynamo import smelt_backend

    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    report: list = []
    backend = functools.partial(smelt_backend, options={"_report": report})
    c = torch.compile(m, backend=backend, dynamic=False)
    with torch.no_grad():
        for batch in [2, 3, 5]:
            x = torch.randn(batch, 8)
            torch.testing.assert_close(c(x), m(x))
    assert len(report) == 3 and all(g["torch"] == [] and g["smelt"] for g in report), report
