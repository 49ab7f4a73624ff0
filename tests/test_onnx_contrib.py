"""The converters of onnxruntime's contrib ops (opforge/onnx/contrib.py): each op alone in a one-node
model, run by opforge and by onnxruntime's CPU kernels (float32), then a small BERT encoder passed
through onnxruntime's own transformer optimizer, whose fused model runs in both at two sequence
lengths."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opforge.onnx as ox
from opforge.errors import ModelError

ELEM = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("int32"): TensorProto.INT32,
        np.dtype("int64"): TensorProto.INT64}
MS = "com.microsoft"


def sample(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def contrib_model(op_type, inputs, attrs=None, outputs=1, constant=(), domain=MS, opset=17, dynamic=()):
    """One node of ``op_type``; inputs named x0, x1, ... (None: omitted), those in ``constant`` as initializers,
    the graph inputs in ``dynamic`` with unknown dims.  ``outputs``: a count, or names ('' for an omitted one)."""
    names = [f"x{k}" if x is not None else "" for k, x in enumerate(inputs)]
    out_names = [f"y{k}" for k in range(outputs)] if isinstance(outputs, int) else list(outputs)
    node = helper.make_node(op_type, names, out_names, domain=domain, **(attrs or {}))
    graph_inputs, initializers = [], []
    for name, x in zip(names, inputs):
        if x is None:
            continue
        if name in constant:
            initializers.append(numpy_helper.from_array(x, name))
        else:
            shape = [f"{name}_d{j}" for j in range(x.ndim)] if name in dynamic else list(x.shape)
            graph_inputs.append(helper.make_tensor_value_info(name, ELEM[x.dtype], shape))
    graph = helper.make_graph([node], "m", graph_inputs, [helper.make_empty_tensor_value_info(n)
                                                          for n in out_names if n], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def feeds(model, inputs):
    given = {f"x{k}": x for k, x in enumerate(inputs) if x is not None}
    return [given[i.name] for i in model.graph.input]


def run_both(model, inputs):
    loaded = ox.load(model)
    arrays = feeds(model, inputs)
    got = loaded(*arrays)
    got = list(got) if isinstance(got, tuple) else [got]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {i.name: x for i, x in zip(model.graph.input, arrays)})
    return got, expected


def assert_matches_ort(op_type, inputs, attrs=None, outputs=1, rtol=1e-4, atol=1e-5, **kw):
    got, expected = run_both(contrib_model(op_type, inputs, attrs, outputs, **kw), inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return got


# -- activations ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type, with_bias", [("Gelu", False), ("BiasGelu", True), ("FastGelu", False),
                                                ("FastGelu", True), ("QuickGelu", False)])
def test_gelus(op_type, with_bias):
    x = sample(2, 3, 8, scale=2)
    assert_matches_ort(op_type, [x, sample(8, seed=1)] if with_bias else [x])


def test_quick_gelu_alpha():
    assert_matches_ort("QuickGelu", [sample(4, 6, scale=3)], {"alpha": 1.3})


def exact_gelu(x):
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x.astype(np.float64) / np.sqrt(2)))


# BiasSplitGelu and BiasAdd have no CPU kernel in onnxruntime: NumPy says what they compute.
def test_bias_split_gelu():
    x, bias = sample(2, 5, 12), sample(12, seed=1)
    got = ox.load(contrib_model("BiasSplitGelu", [x, bias], constant=("x1",)))(x)
    total = x + bias
    np.testing.assert_allclose(got, total[..., :6] * exact_gelu(total[..., 6:]), rtol=1e-5, atol=1e-6)


def test_bias_add():
    x, bias, skip = sample(2, 5, 8), sample(8, seed=1), sample(2, 5, 8, seed=2)
    got = ox.load(contrib_model("BiasAdd", [x, bias, skip]))(x, bias, skip)
    np.testing.assert_allclose(got, x + bias + skip, rtol=1e-6)


# -- normalizations ---------------------------------------------------------------------------------

@pytest.mark.parametrize("beta, bias", [(True, True), (False, False), (True, False), (False, True)])
def test_skip_layer_normalization_with_every_output(beta, bias):
    x, skip, gamma = sample(2, 3, 16, scale=2), sample(2, 3, 16, seed=1), sample(16, seed=2)
    inputs = [x, skip, gamma, sample(16, seed=3) if beta else None, sample(16, seed=4) if bias else None]
    while inputs[-1] is None:
        inputs.pop()
    assert_matches_ort("SkipLayerNormalization", inputs, {"epsilon": 1e-5}, outputs=4, constant=("x2", "x3", "x4"))


def test_skip_layer_normalization_default_epsilon_broadcast_skip_and_omitted_outputs():
    x, gamma, beta = sample(2, 3, 8), sample(8, seed=2), sample(8, seed=3)
    assert_matches_ort("SkipLayerNormalization", [x, sample(3, 8, seed=1), gamma, beta])
    assert_matches_ort("SkipLayerNormalization", [x, sample(1, 3, 8, seed=1), gamma, beta],
                       outputs=["y0", "", "", "y3"])


@pytest.mark.parametrize("bias", [False, True])
def test_skip_simplified_layer_normalization(bias):
    inputs = [sample(2, 3, 16, scale=2), sample(2, 3, 16, seed=1), sample(16, seed=2)]
    assert_matches_ort("SkipSimplifiedLayerNormalization", inputs + ([sample(16, seed=4)] if bias else []),
                       outputs=4, constant=("x2",))


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_normalization_of_the_onnx_domain(axis):
    x = sample(2, 3, 8, scale=3)
    scale = sample(*x.shape[axis:], seed=1)
    assert_matches_ort("SimplifiedLayerNormalization", [x, scale], {"axis": axis, "epsilon": 1e-6}, outputs=2,
                       domain="")


def test_layer_normalization_before_opset_17_and_under_com_microsoft():
    x, scale, bias = sample(2, 3, 8, scale=3), sample(8, seed=1), sample(8, seed=2)
    assert_matches_ort("LayerNormalization", [x, scale, bias], {"epsilon": 1e-6}, outputs=3, domain="", opset=14)
    # onnxruntime has no com.microsoft LayerNormalization: compare it with its ai.onnx one
    got = ox.load(contrib_model("LayerNormalization", [x, scale, bias], domain=MS))(x, scale, bias)
    expected = run_both(contrib_model("LayerNormalization", [x, scale, bias], domain=""), [x, scale, bias])[1][0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def embed_inputs(batch=2, seq=5, hidden=8, vocab=11, segments=True):
    r = np.random.default_rng(7)
    ids = r.integers(0, vocab, (batch, seq)).astype(np.int32)
    seg = r.integers(0, 2, (batch, seq)).astype(np.int32) if segments else None
    return [ids, seg, sample(vocab, hidden), sample(9, hidden, seed=1), sample(2, hidden, seed=2) if segments else None,
            sample(hidden, seed=3), sample(hidden, seed=4)]


@pytest.mark.parametrize("dynamic", [False, True])
def test_embed_layer_normalization_with_mask(dynamic):
    inputs = embed_inputs() + [np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], np.int32)]
    got = assert_matches_ort("EmbedLayerNormalization", inputs, outputs=3, constant=("x2", "x3", "x4", "x5", "x6"),
                             dynamic=("x0", "x1", "x7") if dynamic else ())
    np.testing.assert_array_equal(got[1], [3, 5])


def test_embed_layer_normalization_mask_index_counts_ones_and_is_zero_without_mask():
    inputs = embed_inputs(segments=False)
    assert_matches_ort("EmbedLayerNormalization", inputs + [np.array([[1, 2, 0, 1, -1], [0, 0, 1, 1, 1]], np.int32)],
                       {"epsilon": 1e-5}, outputs=2)
    got = assert_matches_ort("EmbedLayerNormalization", inputs, outputs=2)
    np.testing.assert_array_equal(got[1], [0, 0])


@pytest.mark.parametrize("position_ids", [[[4, 3, 2, 1, 0]], [[4, 3, 2, 1, 0], [0, 1, 0, 1, 8]]])
def test_embed_layer_normalization_position_ids(position_ids):
    inputs = embed_inputs() + [None, np.array(position_ids, np.int32)]
    assert_matches_ort("EmbedLayerNormalization", inputs, outputs=["y0", "", "y2"])


def test_embed_layer_normalization_of_unknown_sequence_length_runs_without_specializing():
    inputs = embed_inputs()
    model = contrib_model("EmbedLayerNormalization", inputs, outputs=2, constant=("x2", "x3", "x4", "x5", "x6"),
                          dynamic=("x0", "x1"))
    assert not isinstance(ox.load(model), ox.DynamicModel)
    for seq in (5, 3):
        short = embed_inputs(seq=seq)
        got, expected = run_both(model, short)
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(got[1], expected[1])


# -- FusedMatMul ------------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs, a_shape, b_shape", [
    ({}, (2, 3, 4, 5), (2, 3, 5, 6)),
    ({"transA": 1, "alpha": 0.5}, (2, 3, 5, 4), (5, 6)),
    ({"transB": 1}, (3, 4, 5), (3, 6, 5)),
    ({"transA": 1, "transB": 1, "alpha": 2.0}, (5, 4), (6, 5)),
    ({"transBatchA": 1}, (2, 3, 4, 5), (3, 4, 5, 7)),
    ({"transBatchA": 1, "transA": 1}, (2, 3, 4, 5), (3, 4, 2, 7)),
    ({"transBatchB": 1}, (3, 4, 2, 5), (5, 3, 4, 7)),
    ({"transBatchB": 1, "transB": 1}, (3, 4, 2, 5), (7, 3, 4, 5)),
])
def test_fused_matmul(attrs, a_shape, b_shape):
    assert_matches_ort("FusedMatMul", [sample(*a_shape), sample(*b_shape, seed=1)], attrs)


# -- Attention --------------------------------------------------------------------------------------

def attention_inputs(batch=2, seq=5, hidden=12, sizes=(12, 12, 12)):
    return [sample(batch, seq, hidden), sample(hidden, sum(sizes), seed=1, scale=0.5), sample(sum(sizes), seed=2)]


MASKS = {
    "none": None,
    "key lengths": np.array([3, 5], np.int32),
    "end and start positions": np.array([4, 5, 1, 0], np.int32),
    "raw 2-D": np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], np.int32),
    "raw 3-D": (np.random.default_rng(3).random((2, 5, 5)) > 0.3).astype(np.int32),
}


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("mask", list(MASKS))
def test_attention_masks(mask, unidirectional):
    inputs = attention_inputs() + ([MASKS[mask]] if MASKS[mask] is not None else [])
    assert_matches_ort("Attention", inputs, {"num_heads": 3, "unidirectional": unidirectional}, constant=("x1", "x2"))


def test_attention_qkv_hidden_sizes_scale_filter_value_and_no_bias():
    x, w, b = attention_inputs(sizes=(8, 8, 12))
    mask = np.array([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], np.int32)  # the second row masks every key
    assert_matches_ort("Attention", [x, w, b, mask], {"num_heads": 4, "qkv_hidden_sizes": [8, 8, 12]})
    x, w, _ = attention_inputs()
    assert_matches_ort("Attention", [x, w, None, mask], {"num_heads": 2, "scale": 0.3, "mask_filter_value": -50.0})


def test_attention_bias_input():
    x, w, b = attention_inputs()
    assert_matches_ort("Attention", [x, w, b, None, None, sample(1, 3, 5, 5, seed=4)], {"num_heads": 3})


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("mask", [None, "lengths", "raw"])
def test_attention_past_and_present(mask, unidirectional):
    x, w, b = attention_inputs(seq=3)
    past = sample(2, 2, 3, 4, 4, seed=5)
    masks = {None: None, "lengths": np.array([5, 7], np.int32),
             "raw": np.array([[1, 1, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1]], np.int32)}
    assert_matches_ort("Attention", [x, w, b, masks[mask], past], {"num_heads": 3, "unidirectional": unidirectional},
                       outputs=2, constant=("x1", "x2"))


def test_attention_with_unknown_batch_and_sequence_is_converted_per_signature():
    inputs = attention_inputs() + [MASKS["key lengths"]]
    model = contrib_model("Attention", inputs, {"num_heads": 3, "unidirectional": 1}, constant=("x1", "x2"),
                          dynamic=("x0", "x3"))
    loaded = ox.load(model)
    assert isinstance(loaded, ox.DynamicModel)
    for batch, seq, lengths in ((2, 5, [3, 5]), (3, 2, [1, 2, 2])):
        inputs = attention_inputs(batch, seq) + [np.array(lengths, np.int32)]
        got, expected = run_both(model, inputs)
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-5)
        assert loaded.mode(*feeds(model, inputs)) == "graph"


def test_attention_without_a_mask_needs_only_one_known_dim():
    inputs = attention_inputs()
    model = contrib_model("Attention", inputs, {"num_heads": 3}, constant=("x1", "x2"))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    assert not isinstance(ox.load(model), ox.DynamicModel)
    got, expected = run_both(model, inputs)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs, extra, message", [
    ({"do_rotary": 1}, [], "rotary"),
    ({"past_present_share_buffer": 1}, [], "shared"),
    ({}, [np.zeros(8, np.int32)], "not supported"),
    ({}, [np.ones((2, 1, 5, 5), np.int32)], "supported:"),
    ({"qkv_hidden_sizes": [12, 8, 16]}, [], "hidden sizes"),
])
def test_attention_refusals(attrs, extra, message):
    model = contrib_model("Attention", attention_inputs() + extra, {"num_heads": 3, **attrs}, constant=("x1", "x2"))
    with pytest.raises(ModelError, match=message):
        ox.load(model)


# -- MultiHeadAttention -----------------------------------------------------------------------------

def test_multi_head_attention_separate_projections_with_bias_mask_and_past():
    batch, seq, kv, hidden, heads = 2, 3, 4, 8, 2
    q, k, v = sample(batch, seq, hidden), sample(batch, kv, hidden, seed=1), sample(batch, kv, hidden, seed=2)
    bias = sample(hidden * 3, seed=3)
    past_k, past_v = sample(batch, heads, 2, 4, seed=4), sample(batch, heads, 2, 4, seed=5)
    mask = np.array([[1, 1, 1, 0, 1, 1], [1, 0, 1, 1, 1, 1]], np.int32)
    assert_matches_ort("MultiHeadAttention", [q, k, v, bias, mask, None, past_k, past_v], {"num_heads": heads},
                       outputs=3)
    # unidirectional: query i sees the past keys and keys 0..i of its own.  (With kv_sequence != sequence
    # onnxruntime's CPU kernel leaves the last query's row unmasked; opforge keeps the rule, so not tested.)
    k, v = k[:, :seq], v[:, :seq]
    assert_matches_ort("MultiHeadAttention", [q, k, v, None, np.array([2, 3], np.int32)],
                       {"num_heads": heads, "unidirectional": 1, "scale": 0.2})
    assert_matches_ort("MultiHeadAttention", [q, k, v, None, mask[:, 1:], None, past_k, past_v],
                       {"num_heads": heads, "unidirectional": 1}, outputs=3)


def test_multi_head_attention_packed_and_head_split_inputs():
    """onnxruntime's CPU kernel has no packed forms: they must give what the same Q, K and V give unpacked."""
    batch, seq, heads, head = 2, 4, 2, 3
    packed = sample(batch, seq, heads, 3, head)
    q, k, v = (packed[:, :, :, j, :].reshape(batch, seq, heads * head) for j in range(3))
    expected = run_both(contrib_model("MultiHeadAttention", [q, k, v], {"num_heads": heads}), [q, k, v])[1][0]
    got = ox.load(contrib_model("MultiHeadAttention", [packed], {"num_heads": heads}))(packed)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    packed_kv = sample(batch, 5, heads, 2, head, seed=1)
    k, v = (packed_kv[:, :, :, j, :].reshape(batch, 5, heads * head) for j in range(2))
    expected = run_both(contrib_model("MultiHeadAttention", [q, k, v], {"num_heads": heads}), [q, k, v])[1][0]
    got = ox.load(contrib_model("MultiHeadAttention", [q, packed_kv], {"num_heads": heads}))(q, packed_kv)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    split_k, split_v = (t.reshape(batch, 5, heads, head).transpose(0, 2, 1, 3).copy() for t in (k, v))
    assert_matches_ort("MultiHeadAttention", [q, split_k, split_v], {"num_heads": heads})


# -- a BERT encoder through onnxruntime's optimizer ---------------------------------------------------

HIDDEN, HEADS, LAYERS, VOCAB, MAX_POSITIONS = 32, 4, 2, 50, 16


def bert_model(tmp_path):
    """A 2-layer BERT-like encoder exported by torch (dynamic batch and sequence) and fused by onnxruntime's
    optimizer; the path of the optimized model."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN)
            self.out, self.norm1 = nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN, eps=1e-12)
            self.up, self.down = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)
            self.norm2 = nn.LayerNorm(HIDDEN, eps=1e-12)

        def heads(self, t):
            return t.view(t.size(0), t.size(1), HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

        def forward(self, x, bias):
            q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / (HIDDEN // HEADS) ** 0.5 + bias
            context = torch.matmul(scores.softmax(-1), v).permute(0, 2, 1, 3).contiguous()
            x = self.norm1(x + self.out(context.view(x.size(0), x.size(1), HIDDEN)))
            return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.words, self.positions = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(MAX_POSITIONS, HIDDEN)
            self.segments, self.norm = nn.Embedding(2, HIDDEN), nn.LayerNorm(HIDDEN, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))

        def forward(self, input_ids, attention_mask, token_type_ids):
            positions = torch.arange(input_ids.size(1), dtype=torch.long).unsqueeze(0)
            x = self.norm(self.words(input_ids) + self.positions(positions) + self.segments(token_type_ids))
            bias = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
            for layer in self.layers:
                x = layer(x, bias)
            return x

    torch.manual_seed(0)
    module = Bert().eval()
    ids = torch.randint(0, VOCAB, (2, 7))
    raw, optimized = tmp_path / "bert.onnx", tmp_path / "bert_opt.onnx"
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "token_type_ids": {0: "batch", 1: "sequence"}, "output": {0: "batch", 1: "sequence"}}
    torch.onnx.export(module, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(raw), dynamo=False,
                      input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["output"],
                      dynamic_axes=axes, opset_version=17)
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(str(raw), model_type="bert", num_heads=HEADS, hidden_size=HIDDEN, opt_level=0)
    fused.save_model_to_file(str(optimized))
    return optimized


def test_bert_encoder_fused_by_onnxruntime_loads_and_matches(tmp_path):
    path = bert_model(tmp_path)
    model = onnx.load(str(path))
    op_types = {(n.domain, n.op_type) for n in model.graph.node}
    for fused in ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization"):
        assert (MS, fused) in op_types, sorted(op_types)
    assert (MS, "BiasGelu") in op_types or (MS, "FastGelu") in op_types or (MS, "Gelu") in op_types
    loaded = ox.load(model)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    r = np.random.default_rng(1)
    names = [i.name for i in model.graph.input]
    for batch, seq in ((2, 7), (3, 4)):
        given = {"input_ids": r.integers(0, VOCAB, (batch, seq)), "token_type_ids": r.integers(0, 2, (batch, seq)),
                 "attention_mask": np.ones((batch, seq), np.int64)}
        given["attention_mask"][0, seq - 2:] = 0  # the first row is right-padded
        elem = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
        arrays = [given[n].astype(np.int32 if elem[n] == TensorProto.INT32 else np.int64) for n in names]
        expected = session.run(None, dict(zip(names, arrays)))[0]
        got = loaded(*arrays)
        assert got.shape == (batch, seq, HIDDEN)
        assert loaded.mode(*arrays) == "graph"  # one graph per signature (its Range folds), not node by node
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
