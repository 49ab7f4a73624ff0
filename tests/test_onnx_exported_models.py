"""Models exported by torch.onnx with random weights and dynamic dims, loaded as exported and checked against
onnxruntime (and torch) at several sizes."""
import io
import math
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import opforge
import opforge.onnx

torch.manual_seed(0)


def export(module, example, names, dynamic, opset=17):
    """The ONNX bytes of ``module`` traced on ``example``, with the dims ``dynamic`` names left symbolic."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), example, buffer, dynamo=False, opset_version=opset, input_names=names,
                          output_names=["y"], dynamic_axes=dynamic)
    return buffer.getvalue()


def check_sizes(model_bytes, module, make_inputs, sizes, rtol=1e-4, atol=1e-5):
    graph = opforge.onnx.load(model_bytes)
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for size in sizes:
        arrays = make_inputs(*size)
        ours = np.asarray(graph(*arrays))
        (theirs,) = session.run(None, dict(zip(names, arrays)))
        with torch.no_grad():
            reference = module(*[torch.from_numpy(a) for a in arrays]).numpy()
        assert ours.shape == theirs.shape == reference.shape
        np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol)
        np.testing.assert_allclose(ours, reference, rtol=rtol, atol=atol)
    return graph


class TinyBert(nn.Module):
    """A BERT-style encoder: embeddings, a padding mask from a 0/1 input, attention written out with sizes read
    from the input (as exporters keep them symbolic), post-norm blocks.  (torch's own nn.TransformerEncoder
    exports with its traced sizes baked into Reshape shapes, so it runs only at the traced size, in
    onnxruntime too.)"""

    def __init__(self, vocab=40, width=32, heads=4, layers=2, context=64):
        super().__init__()
        self.heads = heads
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.norm = nn.LayerNorm(width)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "qkv": nn.Linear(width, 3 * width), "proj": nn.Linear(width, width), "ln1": nn.LayerNorm(width),
            "up": nn.Linear(width, 2 * width), "down": nn.Linear(2 * width, width), "ln2": nn.LayerNorm(width)})
            for _ in range(layers))

    def forward(self, ids, mask):
        batch, length = ids.shape
        x = self.norm(self.tokens(ids) + self.positions(torch.arange(length)))
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -10000.0
        for block in self.blocks:
            q, k, v = block["qkv"](x).chunk(3, dim=-1)
            q, k, v = (t.reshape(batch, length, self.heads, -1).permute(0, 2, 1, 3) for t in (q, k, v))
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
            context = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(batch, length, -1)
            x = block["ln1"](x + block["proj"](context))
            x = block["ln2"](x + block["down"](torch.tanh(block["up"](x))))
        return x


def test_bert_style_encoder_with_dynamic_batch_and_sequence():
    bert = TinyBert()
    model = export(bert, (torch.randint(0, 40, (2, 7)), torch.ones(2, 7, dtype=torch.int64)), ["ids", "mask"],
                   {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}})
    rng = np.random.default_rng(1)

    def inputs(b, t):
        mask = np.ones((b, t), np.int64)
        mask[0, t // 2:] = 0  # padding in the first sequence
        return [rng.integers(0, 40, (b, t)).astype(np.int64), mask]

    graph = check_sizes(model, bert, inputs, [(2, 7), (1, 3), (3, 12)])
    assert graph.input_names == ["ids", "mask"]


class TinyGPT(nn.Module):
    """A GPT-2-style decoder: token and position embeddings (positions from the sequence length), causal
    self-attention written out (a mask from the length), GELU MLP, pre-norm blocks, a tied head."""

    def __init__(self, vocab=50, width=32, heads=4, layers=2, context=64):
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln1": nn.LayerNorm(width), "qkv": nn.Linear(width, 3 * width), "proj": nn.Linear(width, width),
            "ln2": nn.LayerNorm(width), "up": nn.Linear(width, 4 * width), "down": nn.Linear(4 * width, width)})
            for _ in range(layers))
        self.final = nn.LayerNorm(width)

    def forward(self, ids):
        batch, length = ids.shape
        x = self.tokens(ids) + self.positions(torch.arange(length, device=ids.device))
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        for block in self.blocks:
            q, k, v = block["qkv"](block["ln1"](x)).split(x.shape[-1], dim=-1)
            q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            attention = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
            x = x + block["proj"](attention.transpose(1, 2).reshape(batch, length, -1))
            x = x + block["down"](nn.functional.gelu(block["up"](block["ln2"](x))))
        return self.final(x) @ self.tokens.weight.T


def test_gpt2_style_decoder_with_a_dynamic_sequence_runs_at_every_length():
    gpt = TinyGPT()
    model = export(gpt, (torch.randint(0, 50, (2, 5)),), ["ids"], {"ids": {0: "batch", 1: "seq"}})
    rng = np.random.default_rng(2)
    graph = check_sizes(model, gpt, lambda b, t: [rng.integers(0, 50, (b, t)).astype(np.int64)],
                        [(2, 5), (1, 1), (1, 9), (3, 17)])
    if isinstance(graph, opforge.onnx.DynamicModel):  # shapes from the length: one graph per signature
        assert graph.mode(np.zeros((1, 4), np.int64)) == "graph"


def test_exported_models_need_no_fixed_dims_from_the_user():
    # A conv net that upsamples to twice its input's size and flattens with x.view(x.size(0), -1): the
    # shapes are computed from the input's, and it runs at any batch and image size.
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)

        def forward(self, x):
            y = nn.functional.interpolate(torch.relu(self.conv(x)), size=(2 * x.shape[2], 2 * x.shape[3]))
            pooled = y.mean(dim=(2, 3), keepdim=True)
            return self.head(pooled.view(pooled.size(0), -1)) + y.view(y.size(0), 8, -1).amax(-1)[:, :5]

    net = Net()
    model = export(net, (torch.randn(2, 3, 16, 16),), ["x"], {"x": {0: "batch", 2: "h", 3: "w"}})
    rng = np.random.default_rng(3)
    check_sizes(model, net, lambda b, h: [rng.standard_normal((b, 3, h, h)).astype(np.float32)],
                [(2, 16), (1, 8), (4, 12)])


@pytest.mark.parametrize("length", [3, 8])
def test_a_dynamic_model_keeps_one_graph_per_signature(length):
    gpt = TinyGPT(layers=1)
    graph = opforge.onnx.load(export(gpt, (torch.randint(0, 50, (1, 4)),), ["ids"], {"ids": {1: "seq"}}))
    if not isinstance(graph, opforge.onnx.DynamicModel):
        pytest.skip("this export keeps every shape symbolic: one graph serves every length")
    ids = np.arange(length, dtype=np.int64).reshape(1, length) % 50
    assert graph.specialize(ids) is graph.specialize(opforge.TensorSpec([1, length], "int64"))
    with pytest.raises(opforge.DTypeError, match="input 'ids' is int32"):
        graph(ids.astype(np.int32))
    with pytest.raises(opforge.ShapeError, match="input 'ids' has shape"):
        graph(ids.reshape(length, 1, 1))
