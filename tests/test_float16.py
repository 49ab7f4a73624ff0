"""float16 and bfloat16 graphs computed in float32 (``opforge.graph.float16``).

Single float16 nodes of each heavy op and a float16 CNN are compared with
onnxruntime's CPU provider, which computes what it has no float16 kernel for in
float32 too: the results agree to about one float16 rounding.  Plans are checked
for what makes them fast: every kernel native, and casts only at the float32
region's boundary.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opforge
import opforge.onnx
from opforge.graph.float16 import compute_in_float32

ops = opforge.ops
F16 = TensorProto.FLOAT16


def _rng():
    return np.random.default_rng(0)


def _model(nodes, inputs, initializers=(), outputs=("y",), elem=F16):
    graph = helper.make_graph(nodes, "float16_model",
                              [helper.make_tensor_value_info(name, elem, a.shape) for name, a in inputs.items()],
                              [helper.make_tensor_value_info(name, elem, None) for name in outputs],
                              [numpy_helper.from_array(a, name) for name, a in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _onnxruntime(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _plan(graph):
    (plan,) = graph._executor.plans.values()
    return plan


def _casts(plan):
    return sum(node.op.name == "cast" for node, *_ in plan.steps)


def _close(ours, theirs):
    """Within two float16 roundings of onnxruntime's (both round a float32 result; sums may differ in order)."""
    assert ours.dtype == theirs.dtype == np.float16 and ours.shape == theirs.shape
    scale = float(np.max(np.abs(theirs.astype(np.float32)))) or 1.0
    np.testing.assert_allclose(ours.astype(np.float32), theirs.astype(np.float32), rtol=2e-3, atol=2e-3 * scale)


def _h(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def _single(op_type, inputs, initializers=(), **attrs):
    names = list(inputs) + [name for name, _ in initializers]
    return _model([helper.make_node(op_type, names, ["y"], **attrs)], inputs, initializers)


def _cases():
    r = _rng()
    return {
        "Conv": _single("Conv", {"x": _h(r, 1, 16, 20, 20)}, [("w", _h(r, 24, 16, 3, 3, scale=0.1)),
                                                              ("b", _h(r, 24))], pads=[1, 1, 1, 1]),
        "Conv_grouped": _single("Conv", {"x": _h(r, 2, 8, 12, 12)}, [("w", _h(r, 8, 2, 3, 3, scale=0.2))],
                                group=4, strides=[2, 2]),
        "ConvTranspose": _single("ConvTranspose", {"x": _h(r, 1, 8, 10, 10)}, [("w", _h(r, 8, 4, 3, 3, scale=0.2))],
                                 strides=[2, 2]),
        "MatMul": _single("MatMul", {"a": _h(r, 2, 24, 40), "b": _h(r, 40, 16, scale=0.2)}),
        "Gemm": _single("Gemm", {"a": _h(r, 8, 64)}, [("w", _h(r, 32, 64, scale=0.1)), ("c", _h(r, 32))], transB=1),
        "BatchNormalization": _single("BatchNormalization", {"x": _h(r, 2, 6, 7, 7)},
                                      [("s", _h(r, 6)), ("b", _h(r, 6)), ("m", _h(r, 6)),
                                       ("v", (np.abs(_h(r, 6)) + 0.5).astype(np.float16))]),
        "MaxPool": _single("MaxPool", {"x": _h(r, 1, 8, 15, 15)}, kernel_shape=[3, 3], strides=[2, 2],
                           pads=[1, 1, 1, 1]),
        "AveragePool": _single("AveragePool", {"x": _h(r, 1, 8, 12, 12)}, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        "GlobalAveragePool": _single("GlobalAveragePool", {"x": _h(r, 2, 16, 7, 7)}),
        "Softmax": _single("Softmax", {"x": _h(r, 4, 100)}),
        "LayerNormalization": _single("LayerNormalization", {"x": _h(r, 3, 5, 64)}, [("g", _h(r, 64)), ("b", _h(r, 64))],
                                      axis=-1),
        "Resize": _single("Resize", {"x": _h(r, 1, 4, 6, 6)}, [("roi", np.zeros(0, np.float32)),
                                                               ("scales", np.array([1, 1, 2, 2], np.float32))],
                          mode="linear"),
        "LRN": _single("LRN", {"x": _h(r, 1, 12, 6, 6)}, size=5),
        "ReduceMean": _single("ReduceMean", {"x": _h(r, 2, 16, 9, 9)}, axes=[2, 3]),
        "Relu": _single("Relu", {"x": _h(r, 2, 8, 9, 9)}),
        "Add": _single("Add", {"a": _h(r, 2, 8, 9, 9), "b": _h(r, 8, 1, 1)}),
        "Sigmoid": _single("Sigmoid", {"x": _h(r, 4, 50)}),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_float16_node_computes_in_float32_and_matches_onnxruntime(name):
    model = CASES[name]
    r = _rng()
    feeds = {info.name: _h(r, *[d.dim_value for d in info.type.tensor_type.shape.dim]) for info in model.graph.input}
    graph = opforge.onnx.load(model)
    ours = graph(*feeds.values())
    (theirs,) = _onnxruntime(model, feeds)
    _close(ours, theirs)
    plan = _plan(graph)
    assert plan.program is not None  # every kernel native: no NumPy reference ran
    heavy = [node for node, *_ in plan.steps if node.op.name != "cast" and "view" not in node.op.traits]
    assert heavy and all(node.outputs[0].spec.dtype == "float32" for node in heavy)
    assert _casts(plan) == len(feeds) + 1  # each input widened once (a view of it may come first), the output
    #                                         rounded once


def small_cnn(rng, dtype=np.float16):
    """A ResNet-like CNN for 1x3x32x32: conv-bn-relu stem, a max pool, two residual blocks (one with a
    1x1 projection), global pooling, flatten, gemm and softmax; batch norms left unfolded."""
    nodes, weights = [], []

    def weight(name, array):
        weights.append((name, array.astype(dtype)))
        return name

    def conv_bn(x, name, c_in, c_out, k, stride, relu=True):
        w = weight(f"{name}_w", rng.standard_normal((c_out, c_in, k, k)) * np.sqrt(2 / (c_in * k * k)))
        nodes.append(helper.make_node("Conv", [x, w], [f"{name}_c"], kernel_shape=[k, k], strides=[stride] * 2,
                                      pads=[k // 2] * 4))
        stats = [weight(f"{name}_{s}", v) for s, v in (
            ("s", rng.uniform(0.5, 1.5, c_out)), ("b", rng.uniform(-0.1, 0.1, c_out)),
            ("m", rng.uniform(-0.1, 0.1, c_out)), ("v", rng.uniform(0.5, 1.5, c_out)))]
        nodes.append(helper.make_node("BatchNormalization", [f"{name}_c", *stats], [f"{name}_bn"]))
        if not relu:
            return f"{name}_bn"
        nodes.append(helper.make_node("Relu", [f"{name}_bn"], [f"{name}_r"]))
        return f"{name}_r"

    x = conv_bn("x", "stem", 3, 16, 3, 1)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    x, c_in = "pool", 16
    for name, c_out, stride in (("b1", 16, 1), ("b2", 32, 2)):
        y = conv_bn(conv_bn(x, f"{name}a", c_in, c_out, 3, stride), f"{name}b", c_out, c_out, 3, 1, relu=False)
        skip = x if c_in == c_out else conv_bn(x, f"{name}d", c_in, c_out, 1, stride, relu=False)
        nodes += [helper.make_node("Add", [y, skip], [f"{name}_sum"]),
                  helper.make_node("Relu", [f"{name}_sum"], [f"{name}_out"])]
        x, c_in = f"{name}_out", c_out
    fc_w = weight("fc_w", rng.standard_normal((10, 32)) / np.sqrt(32))
    fc_b = weight("fc_b", rng.uniform(-0.1, 0.1, 10))
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"]), helper.make_node("Flatten", ["gap"], ["flat"]),
              helper.make_node("Gemm", ["flat", fc_w, fc_b], ["logits"], transB=1),
              helper.make_node("Softmax", ["logits"], ["y"], axis=1)]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return _model(nodes, {"x": np.zeros((1, 3, 32, 32), dtype)}, weights, elem=elem)


def test_float16_cnn_matches_onnxruntime_and_casts_only_at_its_ends():
    rng = _rng()
    model = small_cnn(rng)
    x = _h(rng, 1, 3, 32, 32)
    graph = opforge.onnx.load(model)
    ours = graph(x)
    (theirs,) = _onnxruntime(model, {"x": x})
    _close(ours, theirs)
    plan = _plan(graph)
    assert plan.program is not None
    assert _casts(plan) == 2  # the input's widening, the output's rounding
    assert [spec.dtype for node, _, _, specs in plan.steps for spec in specs if node.op.name != "cast"] == \
        ["float32"] * (len(plan.steps) - 2)
    # batch norms fold into the convs and relus into them as they do in float32
    assert not any(node.op.name == "batch_norm" for node, *_ in plan.steps)


def test_float16_cnn_agrees_with_its_float32_twin():
    """The float16 model computes what the float32 model computes on the same (float16) values, rounded."""
    model16 = small_cnn(_rng())
    model32 = small_cnn(_rng(), np.float32)
    for t16, t32 in zip(model16.graph.initializer, model32.graph.initializer):  # the float16 weights, widened
        t32.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t16).astype(np.float32), t32.name))
    x = _h(np.random.default_rng(1), 1, 3, 32, 32)
    ours = opforge.onnx.load(model16)(x)
    wide = opforge.onnx.load(model32)(x.astype(np.float32))
    np.testing.assert_allclose(ours.astype(np.float32), wide, rtol=2e-3, atol=1e-4)


def test_adjacent_casts_cancel_between_float32_computed_ops():
    """Conv -> Softmax -> Conv -> Div: the converters compute Softmax and Div in float32 and cast back;
    between the float32-computed nodes those roundings and their widenings disappear."""
    rng = _rng()
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Softmax", ["c1"], ["s"], axis=1),
             helper.make_node("Conv", ["s", "w2"], ["c2"]),
             helper.make_node("Div", ["c2", "d"], ["y"])]
    model = _model(nodes, {"x": _h(rng, 1, 4, 9, 9)}, [("w1", _h(rng, 6, 4, 3, 3, scale=0.3)),
                                                       ("w2", _h(rng, 5, 6, 1, 1)), ("d", np.float16([3.0]))])
    x = _h(rng, 1, 4, 9, 9)
    graph = opforge.onnx.load(model)
    ours = graph(x)
    (theirs,) = _onnxruntime(model, {"x": x})
    _close(ours, theirs)
    plan = _plan(graph)
    assert plan.program is not None and _casts(plan) == 2
    assert {node.op.name for node, *_ in plan.steps} == {"cast", "conv", "softmax", "div"}


def test_casts_a_function_writes_itself_stay():
    """A rounding to float16 the traced function asks for is kept, between float32 ops too."""
    w = (_rng().standard_normal((8, 8)) * 0.3).astype(np.float16)

    def fn(x):
        y = ops.relu(ops.matmul(x, w))  # float16 ops: computed in float32
        y = ops.cast(ops.cast(ops.softmax(ops.cast(y, dtype="float32"), axis=-1), dtype="float16"), dtype="float32")
        return ops.matmul(ops.cast(y, dtype="float16"), w)

    graph = opforge.trace(fn, opforge.TensorSpec([4, 8], "float16"))
    nodes = [(n.op.name, n.outputs[0].spec.dtype) for n in graph.nodes if not n.is_constant]
    # the relu's float32 result is what the softmax reads; the function's own rounding stays (its widening
    # back is the float32 version the last matmul reads, and its narrowing again is the rounded value
    # itself); the result is rounded once
    assert nodes == [("cast", "float32"), ("matmul", "float32"), ("relu", "float32"), ("softmax", "float32"),
                     ("cast", "float16"), ("cast", "float32"), ("matmul", "float32"), ("cast", "float16")]
    x = _rng().standard_normal((4, 8)).astype(np.float16)
    wide = w.astype(np.float32)
    hidden = np.maximum(x.astype(np.float32) @ wide, 0)
    soft = np.exp(hidden - hidden.max(-1, keepdims=True))
    soft = (soft / soft.sum(-1, keepdims=True)).astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(graph(x).astype(np.float32), (soft @ wide).astype(np.float16).astype(np.float32),
                               rtol=2e-3, atol=1e-3)


def test_an_intermediate_graph_output_is_rounded_where_float32_readers_keep_going():
    w = (_rng().standard_normal((6, 6)) * 0.3).astype(np.float16)
    graph = opforge.trace(lambda x: (ops.matmul(x, w), ops.relu(ops.matmul(x, w))), opforge.TensorSpec([3, 6],
                                                                                                       "float16"))
    casts = [n for n in graph.nodes if not n.is_constant and n.op.name == "cast"]
    assert len(casts) == 3  # x in; each output out
    x = _rng().standard_normal((3, 6)).astype(np.float16)
    first, second = graph(x)
    product = x.astype(np.float32) @ w.astype(np.float32)
    assert first.dtype == second.dtype == np.float16
    np.testing.assert_array_equal(first, product.astype(np.float16))
    np.testing.assert_array_equal(second, np.maximum(product, 0).astype(np.float16))


def test_ops_with_native_float16_kernels_stay_float16_unless_their_inputs_are_float32_already():
    # A reshape of a graph input has its own kernel: nothing to cast.
    graph = opforge.trace(lambda x: ops.reshape(x, shape=[6, 2]), opforge.TensorSpec([3, 4], "float16"))
    assert [n.op.name for n in graph.nodes if not n.is_constant] == ["reshape"]
    # After a float32-computed relu, the reshape moves too: one rounding at the end.
    graph = opforge.trace(lambda x: ops.reshape(ops.relu(x), shape=[6, 2]), opforge.TensorSpec([3, 4], "float16"))
    nodes = [(n.op.name, n.outputs[0].spec.dtype) for n in graph.nodes if not n.is_constant]
    assert nodes == [("cast", "float32"), ("relu", "float32"), ("reshape", "float32"), ("cast", "float16")]


def test_float32_graphs_are_left_alone():
    graph = opforge.trace(lambda x: ops.relu(x), opforge.TensorSpec([4], "float32"), optimize=False)
    assert compute_in_float32(graph) == 0 and [n.op.name for n in graph.nodes] == ["relu"]


def test_bfloat16_graph_computes_in_float32():
    bfloat16 = pytest.importorskip("ml_dtypes").bfloat16
    rng = _rng()
    w = (rng.standard_normal((16, 12)) * 0.3).astype(bfloat16)
    graph = opforge.trace(lambda x: ops.softmax(ops.relu(ops.matmul(x, w)), axis=-1),
                          opforge.TensorSpec([5, 16], "bfloat16"))
    nodes = [(n.op.name, n.outputs[0].spec.dtype) for n in graph.nodes if not n.is_constant]
    assert nodes == [("cast", "float32"), ("matmul", "float32"), ("relu", "float32"), ("softmax", "float32"),
                     ("cast", "bfloat16")]
    x = rng.standard_normal((5, 16)).astype(bfloat16)
    hidden = np.maximum(x.astype(np.float32) @ w.astype(np.float32), 0)
    soft = np.exp(hidden - hidden.max(-1, keepdims=True))
    expected = (soft / soft.sum(-1, keepdims=True)).astype(bfloat16)
    ours = graph(x)
    assert ours.dtype == bfloat16
    np.testing.assert_allclose(ours.astype(np.float32), expected.astype(np.float32), rtol=1e-2, atol=1e-3)
    assert _plan(graph).program is not None


def test_cast_between_float16_and_float32_is_exact():
    every_half = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    wide = ops.cast(every_half, dtype="float32")
    expected = every_half.astype(np.float32)
    numbers = ~np.isnan(expected)
    np.testing.assert_array_equal(wide.view(np.uint32)[numbers], expected.view(np.uint32)[numbers])
    assert np.isnan(wide[~numbers]).all()
    rng = _rng()
    finite = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)  # 0 up to 65504
    ties = finite[:-1] + np.diff(finite) / 2  # halfway between neighbours: to the even one
    floats = np.concatenate([  # every exponent a float16 reaches and beyond; ties; specials; an odd length
        (rng.standard_normal(20011) * 2.0 ** rng.integers(-30, 20, 20011)).astype(np.float32),
        np.float32([65504, 65519.99, 65520, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 1e-45, -0.0, np.inf, -np.inf]),
        ties, -ties])
    with np.errstate(over="ignore"):
        expected = floats.astype(np.float16)
    np.testing.assert_array_equal(ops.cast(floats, dtype="float16").view(np.uint16), expected.view(np.uint16))
    assert np.isnan(ops.cast(np.float32([np.nan]), dtype="float16")).all()
