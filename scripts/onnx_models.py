"""Small real-architecture ONNX models, with inputs and reference outputs, for smelt's tests.

Makes one folder per model under tests/data/onnx_models/ (or --out):

    <name>/model.onnx      exported by torch.onnx.export (legacy TorchScript exporter,
                           dynamo=False, opset 17, constant folding on, weights inside the
                           file), batch dimension named "batch" (text models: also "sequence")
    <name>/input_K.npy     the inputs, in the graph's input order
    <name>/inputs.txt      one line per input: NAME=input_K.npy (NAME: the graph input's name)
    <name>/output_K.npy    onnxruntime's outputs (CPUExecutionProvider, default graph
                           optimisations) for those inputs, in the graph's output order
    <name>/short/          the same for batch 3 (text models: sequence 5), through the
                           named dims

The models, all randomly initialised from fixed seeds (no pretrained weights), batch 2:

    resnet18      torchvision ResNet, BasicBlocks [2, 2, 2, 2] at widths 16/32/64/128,
                  10 classes, input 2x3x64x64
    mobilenet_v3  torchvision mobilenet_v3_small (width_mult 0.75), 10 classes, 2x3x64x64
    vit           torchvision VisionTransformer (32x32 images, 8x8 patches, 2 layers,
                  4 heads, width 64, MLP 128), 10 classes, input 2x3x32x32
    bert          transformers BertModel (vocab 1000, width 64, 2 layers, 4 heads,
                  intermediate 128), input input_ids 2x7; outputs last_hidden_state and
                  pooler_output
    gpt2          transformers GPT2LMHeadModel (vocab 1000, width 64, 2 layers, 4 heads),
                  input input_ids 2x7, output logits

BatchNorm layers get random running statistics and affine parameters, and the CNNs are
exported with training=TrainingMode.PRESERVE (the modules themselves in eval mode), so the
graphs keep their BatchNormalization nodes (inference form) instead of having them folded
into the convolutions. Parameters that start out uniform (zero biases, unit LayerNorm
weights, ViT's class token) get a little noise, so the reference outputs depend on them.

Each model is checked with onnx.checker (full_check), its onnxruntime outputs compared
with PyTorch's, and the symbolic dimensions exercised by a second onnxruntime run at
another batch size (and sequence length). One line per model is printed: name, size of
model.onnx, the ONNX op types used, the opset.

Usage: /tmp/smelt-peers-venv/bin/python scripts/onnx_models.py [--out DIR] [names...]
(DIR defaults to tests/data/onnx_models next to this script's repository root; all models
by default). Needs torch, torchvision, transformers, onnx, onnxruntime and numpy.
"""

import argparse
import io
import os
import shutil
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn

OPSET = 17
BATCH = 2
SEQUENCE = 7
VOCAB = 1000
SEED = 0
MAX_BYTES = 6_000_000

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "onnx_models")


def randomize_batchnorm(model, generator):
    """Give every BatchNorm non-trivial running statistics and affine parameters, so the
    reference outputs depend on them (fresh BatchNorms are nearly the identity)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
                m.running_var.copy_(0.5 + torch.rand(n, generator=generator))
                m.weight.copy_(1.0 + 0.1 * torch.randn(n, generator=generator))
                m.bias.copy_(0.1 * torch.randn(n, generator=generator))


def perturb_uniform_parameters(model, generator, scale=0.02):
    """Add noise to every parameter whose entries are all equal (zero biases, unit norm
    weights, ViT's class token), so the outputs depend on them and the exporter does not
    merge equal initialisers into Identity nodes."""
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(scale * torch.randn(p.shape, generator=generator))


def image_input(rng, size):
    return {"input": rng.standard_normal((BATCH, 3, size, size)).astype(np.float32)}


def token_input(rng, batch=BATCH, sequence=SEQUENCE):
    return {"input_ids": rng.integers(0, VOCAB, size=(batch, sequence), dtype=np.int64)}


# Each builder returns (module, {input name: array}, [output names], extra keyword arguments
# for torch.onnx.export). It seeds torch itself, so a model's weights do not depend on which
# other models are made in the same run; export_and_record perturbs uniform parameters.


def build_resnet18(rng):
    from torchvision.models.resnet import BasicBlock, ResNet

    class NarrowResNet(ResNet):
        """torchvision's ResNet with the stem and the four stages at chosen widths."""

        def __init__(self, widths, layers, num_classes):
            super().__init__(BasicBlock, layers, num_classes=num_classes)
            self.inplanes = widths[0]
            self.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = self._norm_layer(widths[0])
            self.layer1 = self._make_layer(BasicBlock, widths[0], layers[0])
            self.layer2 = self._make_layer(BasicBlock, widths[1], layers[1], stride=2)
            self.layer3 = self._make_layer(BasicBlock, widths[2], layers[2], stride=2)
            self.layer4 = self._make_layer(BasicBlock, widths[3], layers[3], stride=2)
            self.fc = nn.Linear(widths[3] * BasicBlock.expansion, num_classes)
            for m in self.modules():  # ResNet's own initialisation, for the new layers
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    torch.manual_seed(SEED)
    model = NarrowResNet((16, 32, 64, 128), [2, 2, 2, 2], num_classes=10)
    randomize_batchnorm(model, torch.Generator().manual_seed(SEED + 1))
    return model.eval(), image_input(rng, 64), ["output"], {"training": torch.onnx.TrainingMode.PRESERVE}


def build_mobilenet_v3(rng):
    from torchvision.models import mobilenet_v3_small

    torch.manual_seed(SEED)
    # Full width is ~1.5M parameters (~6.1 MB); 0.75 keeps every block type under 6 MB.
    model = mobilenet_v3_small(num_classes=10, width_mult=0.75)
    randomize_batchnorm(model, torch.Generator().manual_seed(SEED + 1))
    return model.eval(), image_input(rng, 64), ["output"], {"training": torch.onnx.TrainingMode.PRESERVE}


def build_vit(rng):
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(SEED)
    model = VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
        num_classes=10,
    )
    # torchvision zero-initialises the classification head; give it weights so the
    # output depends on the whole network.
    nn.init.normal_(model.heads.head.weight, std=0.02)
    nn.init.normal_(model.heads.head.bias, std=0.02)
    return model.eval(), image_input(rng, 32), ["output"], {}


class BertOutputs(nn.Module):
    """BertModel as a plain tuple (last_hidden_state, pooler_output) of input_ids."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids):
        out = self.bert(input_ids=input_ids, return_dict=True)
        return out.last_hidden_state, out.pooler_output


def build_bert(rng):
    from transformers import BertConfig, BertModel

    torch.manual_seed(SEED)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, attn_implementation="eager",
    )
    model = BertOutputs(BertModel(config))
    return model.eval(), token_input(rng), ["last_hidden_state", "pooler_output"], {}


class Gpt2Logits(nn.Module):
    """GPT2LMHeadModel returning only the logits (no past key values).

    The all-ones attention mask is made inside the graph: without one, transformers checks
    the position ids for packed sequences with torch.diff, which the TorchScript exporter
    cannot translate."""

    def __init__(self, gpt2):
        super().__init__()
        self.gpt2 = gpt2

    def forward(self, input_ids):
        attention_mask = torch.ones_like(input_ids)
        return self.gpt2(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                         return_dict=True).logits


def build_gpt2(rng):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, attn_implementation="eager",
    )
    model = Gpt2Logits(GPT2LMHeadModel(config))
    return model.eval(), token_input(rng), ["logits"], {}


BUILDERS = {
    "resnet18": build_resnet18,
    "mobilenet_v3": build_mobilenet_v3,
    "vit": build_vit,
    "bert": build_bert,
    "gpt2": build_gpt2,
}


def op_types(graph):
    """The op types of a graph's nodes and of any subgraphs' nodes."""
    ops = set()
    for node in graph.node:
        ops.add(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}")
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                ops |= op_types(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    ops |= op_types(g)
    return ops


def run_ort(data, feeds):
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return names, session.run(names, feeds)


def run_torch(model, feeds):
    with torch.no_grad():
        out = model(*(torch.from_numpy(v) for v in feeds.values()))
    out = out if isinstance(out, tuple) else (out,)
    return [o.numpy() for o in out]


def assert_close(name, what, expected, actual, tol=1e-4):
    for e, a in zip(expected, actual):
        if e.shape != a.shape or not np.allclose(e, a, rtol=tol, atol=tol):
            diff = np.abs(e - a).max() if e.shape == a.shape else f"shapes {e.shape} vs {a.shape}"
            raise AssertionError(f"{name}: onnxruntime and PyTorch differ ({what}): {diff}")


def export_and_record(name, model, inputs, output_names, out_dir, rng, **export_kwargs):
    """Export `model` at `inputs` to <out_dir>/<name>/model.onnx, check it, write the inputs
    and onnxruntime's outputs, and return (bytes, sorted op types, opset)."""
    model.eval()
    perturb_uniform_parameters(model, torch.Generator().manual_seed(SEED + 2))
    input_names = list(inputs)
    text = "input_ids" in inputs
    axes = {0: "batch", 1: "sequence"} if text else {0: "batch"}
    dynamic_axes = {n: axes for n in input_names}
    dynamic_axes.update({n: axes for n in output_names if n != "pooler_output"})
    if "pooler_output" in output_names:
        dynamic_axes["pooler_output"] = {0: "batch"}

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, tuple(torch.from_numpy(v) for v in inputs.values()), buffer,
            dynamo=False, opset_version=OPSET, do_constant_folding=True,
            input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes,
            **export_kwargs,
        )
    data = buffer.getvalue()
    proto = onnx.load_from_string(data)
    onnx.checker.check_model(proto, full_check=True)
    if len(data) > MAX_BYTES:
        raise AssertionError(f"{name}: model.onnx is {len(data)} bytes, over {MAX_BYTES}")
    graph_inputs = [i.name for i in proto.graph.input]
    if graph_inputs != input_names:
        raise AssertionError(f"{name}: graph inputs {graph_inputs}, expected {input_names}")

    names, outputs = run_ort(data, inputs)
    assert_close(name, "reference inputs", run_torch(model, inputs), outputs)

    # Another batch size (and sequence length) through the symbolic dimensions.
    other = token_input(rng, 3, 5) if text else {
        k: rng.standard_normal((3,) + v.shape[1:]).astype(v.dtype) for k, v in inputs.items()
    }
    other_outputs = run_ort(data, other)[1]
    assert_close(name, "batch 3" + (", sequence 5" if text else ""), run_torch(model, other),
                 other_outputs)

    folder = os.path.join(out_dir, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(data)
    with open(os.path.join(folder, "inputs.txt"), "w") as f:
        for k, input_name in enumerate(input_names):
            np.save(os.path.join(folder, f"input_{k}.npy"), inputs[input_name])
            f.write(f"{input_name}={'input_%d.npy' % k}\n")
    for k, value in enumerate(outputs):
        np.save(os.path.join(folder, f"output_{k}.npy"), value)
    # the other sizes too, in short/ (same file names), for tests of the symbolic dims
    os.makedirs(os.path.join(folder, "short"))
    for k, input_name in enumerate(input_names):
        np.save(os.path.join(folder, "short", f"input_{k}.npy"), other[input_name])
    for k, value in enumerate(other_outputs):
        np.save(os.path.join(folder, "short", f"output_{k}.npy"), value)

    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return len(data), sorted(op_types(proto.graph)), opset


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    parser.add_argument("names", nargs="*", metavar="name",
                        help=f"models to make (default: all of {', '.join(BUILDERS)})")
    args = parser.parse_args()
    names = args.names or list(BUILDERS)
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(BUILDERS)}")

    torch.use_deterministic_algorithms(True)
    for name in names:
        rng = np.random.default_rng(SEED)
        model, inputs, output_names, export_kwargs = BUILDERS[name](rng)
        size, ops, opset = export_and_record(name, model, inputs, output_names, args.out, rng,
                                             **export_kwargs)
        print(f"{name}: {size} bytes, opset {opset}, ops {','.join(ops)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
