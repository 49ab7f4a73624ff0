"""Folding an inference-form batch_norm into the conv before it (graph.passes.fold_batch_norm_into_conv), and
a per-channel mul / add into the conv or batch_norm before it (fold_scale_and_shift)."""
import numpy as np
import pytest

import opforge
from opforge import TensorSpec, ops
from opforge.graph.passes import fold_batch_norm_into_conv, fold_scale_and_shift


def _params(channels, in_per_group, kernel, dtype, seed=0, bias=True):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((channels, in_per_group, *kernel)).astype(dtype)
    b = rng.standard_normal(channels).astype(dtype) if bias else None
    scale, shift, mean = (rng.standard_normal(channels).astype(dtype) for _ in range(3))
    var = rng.uniform(0.1, 2.0, channels).astype(dtype)
    return w, b, scale, shift, mean, var


def _op_names(graph):
    return [node.op.name for node in graph.nodes if not node.is_constant]


def _reference(x, w, b, scale, shift, mean, var, epsilon, **geometry):
    """conv then batch_norm in float64."""
    from opforge.builtins.conv import conv_reference

    geometry = {"strides": [], "pads": [], "dilations": [], "group": 1, **geometry}
    y = conv_reference(x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64),
                       **geometry)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    a = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + np.float64(np.float32(epsilon)))
    return (y - mean.reshape(shape)) * a.reshape(shape) + shift.reshape(shape)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("geometry", [
    dict(strides=[1, 1], pads=[1, 1, 1, 1], group=1, kernel=(3, 3), channels=(4, 6)),
    dict(strides=[2, 2], pads=[0, 1, 0, 1], group=2, kernel=(3, 3), channels=(4, 6)),
    dict(strides=[1, 1], pads=[1, 1, 1, 1], group=6, kernel=(3, 3), channels=(6, 6)),  # depthwise
    dict(strides=[1, 1], pads=[0, 0, 0, 0], group=1, kernel=(1, 1), channels=(5, 3)),
])
def test_folded_graph_has_no_batch_norm_and_agrees(dtype, bias, geometry):
    geometry = dict(geometry)
    kernel, (c_in, c_out) = geometry.pop("kernel"), geometry.pop("channels")
    w, b, scale, shift, mean, var = _params(c_out, c_in // geometry["group"], kernel, dtype, bias=bias)
    x = np.random.default_rng(1).standard_normal((2, c_in, 7, 8)).astype(dtype)

    def model(x):
        return ops.batch_norm(ops.conv(x, w, b, **geometry), scale, shift, mean, var, epsilon=1e-3)

    plain = opforge.trace(model, TensorSpec((-1, c_in, 7, 8), dtype), optimize=False)
    assert _op_names(plain) == ["conv", "batch_norm"]
    folded = opforge.trace(model, TensorSpec((-1, c_in, 7, 8), dtype), optimize=False)
    assert fold_batch_norm_into_conv(folded) == 1
    assert _op_names(folded) == ["conv"]
    assert fold_batch_norm_into_conv(folded) == 0  # nothing left to fold
    # trace folds by default
    assert _op_names(opforge.trace(model, TensorSpec((-1, c_in, 7, 8), dtype))) == ["conv"]

    expected = _reference(x, w, b, scale, shift, mean, var, 1e-3, **geometry)
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(folded(x), expected, **tolerance)
    np.testing.assert_allclose(folded(x), plain(x), **tolerance)
    assert folded(x).dtype == np.dtype(dtype)


def test_folded_weights_are_the_exact_products():
    w, b, scale, shift, mean, var = _params(3, 2, (1, 1), "float32")
    graph = opforge.trace(lambda x: ops.batch_norm(ops.conv(x, w, b), scale, shift, mean, var, epsilon=1e-5),
                          TensorSpec((1, 2, 4, 4), "float32"))
    (conv,) = [node for node in graph.nodes if not node.is_constant]
    new_w, new_b = (v.producer.value for v in conv.inputs[1:])
    a = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + np.float64(np.float32(1e-5)))
    np.testing.assert_array_equal(new_w, (w.astype(np.float64) * a.reshape(-1, 1, 1, 1)).astype(np.float32))
    np.testing.assert_array_equal(new_b, ((b.astype(np.float64) - mean) * a + shift).astype(np.float32))
    assert new_w.dtype == np.float32 and new_b.dtype == np.float32


def test_not_folded_when_the_conv_output_has_another_reader():
    w, b, scale, shift, mean, var = _params(3, 2, (3, 3), "float32")

    def model(x):
        y = ops.conv(x, w, b, pads=[1, 1, 1, 1])
        return ops.batch_norm(y, scale, shift, mean, var), ops.relu(y)

    graph = opforge.trace(model, TensorSpec((1, 2, 5, 5), "float32"))
    assert sorted(_op_names(graph)) == ["batch_norm", "conv", "relu"]

    def as_output(x):
        y = ops.conv(x, w, b, pads=[1, 1, 1, 1])
        return ops.batch_norm(y, scale, shift, mean, var), y

    assert sorted(_op_names(opforge.trace(as_output, TensorSpec((1, 2, 5, 5), "float32")))) == ["batch_norm", "conv"]


def test_not_folded_when_weights_or_statistics_are_inputs():
    w, b, scale, shift, mean, var = _params(3, 2, (3, 3), "float32")
    x = np.random.default_rng(2).standard_normal((1, 2, 5, 5)).astype(np.float32)

    weights_in = opforge.trace(lambda x, w: ops.batch_norm(ops.conv(x, w, b), scale, shift, mean, var), x, w)
    assert _op_names(weights_in) == ["conv", "batch_norm"]
    stats_in = opforge.trace(lambda x, m: ops.batch_norm(ops.conv(x, w, b), scale, shift, m, var), x, mean)
    assert _op_names(stats_in) == ["conv", "batch_norm"]
    np.testing.assert_allclose(stats_in(x, mean), _reference(x, w, b, scale, shift, mean, var, 1e-5),
                               rtol=1e-4, atol=1e-4)


def test_onnx_conv_batch_normalization_matches_onnxruntime():
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import opforge.onnx
    from onnx import TensorProto, helper, numpy_helper

    w, b, scale, shift, mean, var = _params(8, 4, (3, 3), "float32", seed=3)
    initializers = [numpy_helper.from_array(a, name) for a, name in
                    ((w, "w"), (b, "b"), (scale, "scale"), (shift, "shift"), (mean, "mean"), (var, "var"))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"], epsilon=1e-4),
             helper.make_node("Relu", ["n"], ["y"])]
    graph = helper.make_graph(nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               [1, 4, 11, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    loaded = opforge.onnx.load(model)
    assert "batch_norm" not in _op_names(loaded) and "conv" in _op_names(loaded)
    x = np.random.default_rng(4).standard_normal((1, 4, 11, 9)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # ORT's unfused result
    (expected,) = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(loaded(x), expected, rtol=1e-4, atol=1e-4)


# -- fold_scale_and_shift ------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("constant_shape", [(6, 1, 1), (1, 6, 1, 1), (), (1,)])
def test_scale_and_shift_fold_into_the_conv_and_agree(dtype, constant_shape):
    w, b, *_ = _params(6, 4, (3, 3), dtype)
    rng = np.random.default_rng(3)
    s = rng.uniform(0.5, 2.0, constant_shape).astype(dtype)
    t = rng.standard_normal(constant_shape).astype(dtype)
    x = rng.standard_normal((2, 4, 6, 7)).astype(dtype)

    def model(x):
        return ops.relu(ops.add(ops.mul(ops.conv(x, w, b, pads=[1, 1, 1, 1]), s), t))

    plain = opforge.trace(model, TensorSpec((-1, 4, 6, 7), dtype), optimize=False)
    folded = opforge.trace(model, TensorSpec((-1, 4, 6, 7), dtype), optimize=False)
    assert fold_scale_and_shift(folded) == 2 and fold_scale_and_shift(folded) == 0
    assert _op_names(folded) == ["conv", "relu"]
    traced = opforge.trace(model, TensorSpec((-1, 4, 6, 7), dtype))  # trace folds (the relu too)
    assert _op_names(traced) == ["conv"] and traced.nodes[-1].attrs["activation"] == "relu"
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(folded(x), plain(x), **tolerance)
    assert folded(x).dtype == np.dtype(dtype)


def test_scale_and_shift_fold_into_a_batch_norm_with_the_constant_first():
    _, _, scale, shift, mean, var = _params(5, 1, (1, 1), "float32")
    s, t = np.float32(1.5) * np.ones((5, 1, 1), np.float32), np.arange(5, dtype=np.float32).reshape(5, 1, 1)
    x = np.random.default_rng(4).standard_normal((1, 5, 3, 3)).astype(np.float32)

    def model(x):
        return ops.add(t, ops.mul(s, ops.batch_norm(x, scale, shift, mean, var, epsilon=1e-5)))

    graph = opforge.trace(model, x)
    assert _op_names(graph) == ["batch_norm"]
    (norm,) = [n for n in graph.nodes if not n.is_constant]
    np.testing.assert_array_equal(norm.inputs[1].producer.value, scale * np.float32(1.5))
    np.testing.assert_allclose(graph(x), model(x), rtol=1e-5, atol=1e-5)


def test_scale_and_shift_stay_when_they_are_not_per_channel_or_not_the_only_reader():
    w, b, *_ = _params(3, 2, (1, 1), "float32")
    x = np.random.default_rng(5).standard_normal((1, 2, 4, 4)).astype(np.float32)
    along_width = np.arange(1, 5, dtype=np.float32)  # (4,): broadcasts along the last dim, not the channels
    graph = opforge.trace(lambda x: ops.mul(ops.conv(x, w, b), along_width), x)
    assert _op_names(graph) == ["conv", "mul"]
    np.testing.assert_allclose(graph(x), ops.mul(ops.conv(x, w, b), along_width), rtol=1e-6)

    def shared(x):
        y = ops.conv(x, w, b)
        return ops.mul(y, np.float32(2)), ops.neg(y)

    assert sorted(_op_names(opforge.trace(shared, x))) == ["conv", "mul", "neg"]
    wider = np.ones((1, 3, 4, 4), np.float32)  # per element, not per channel
    assert _op_names(opforge.trace(lambda x: ops.add(ops.conv(x, w, b), wider), x)) == ["conv", "add"]
    as_input = opforge.trace(lambda x, s: ops.mul(ops.conv(x, w, b), s), x, np.ones((3, 1, 1), np.float32))
    assert _op_names(as_input) == ["conv", "mul"]
