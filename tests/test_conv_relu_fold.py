"""conv's fused activation (activation="relu") on each of its paths, and the graph pass that folds a relu after a
conv into it (graph.passes.fold_relu_into_conv): the same values as relu(conv), gradients through it, ONNX export."""
import numpy as np
import pytest

import opforge
from opforge import TensorSpec, ops
from opforge.graph.passes import fold_relu_into_conv
from opforge.runtime import blas

PATHS = [  # x shape, w shape, attributes: one case per path of the kernel
    ((2, 16, 12, 12), (16, 16, 3, 3), dict(pads=[1, 1, 1, 1])),               # Winograd
    ((1, 8, 9, 10), (8, 1, 3, 3), dict(group=8, pads=[1, 1, 1, 1])),          # depthwise 2-d
    ((2, 6, 9), (6, 1, 3), dict(group=6, pads=[1, 1])),                        # depthwise, generic taps
    ((1, 8, 5, 7), (12, 8, 1, 1), {}),                                         # 1 x 1, no im2col
    ((2, 4, 11), (6, 4, 3), dict(strides=[2])),                                # im2col + gemm
    ((1, 6, 40, 40), (64, 6, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),  # gemm, tasks on the pool
]


def _op_names(graph):
    return [node.op.name for node in graph.nodes if not node.is_constant]


def _case(x_shape, w_shape, dtype="float32"):
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    return (rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype),
            rng.standard_normal(w_shape[0]).astype(dtype))


@pytest.mark.skipif(not blas.available(), reason="conv's native kernel needs OpenBLAS")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("x_shape,w_shape,attrs", PATHS)
def test_fused_relu_is_relu_of_the_conv_on_every_path(x_shape, w_shape, attrs, dtype, threads):
    x, w, b = _case(x_shape, w_shape, dtype)
    fused = ops.conv(x, w, b, activation="relu", **attrs)
    plain = ops.conv(x, w, b, **attrs)
    assert (plain < 0).any() and (fused > 0).any()  # the clip does something
    np.testing.assert_array_equal(fused, ops.relu(plain))


def test_the_reference_and_a_bad_activation():
    x, w, b = _case((1, 2, 5, 5), (3, 2, 3, 3))
    checks = opforge.testing.check_op(ops.conv, x, w, b, activation="relu")  # raises on any failure
    assert any(ok for _, ok, _ in checks)
    with pytest.raises(opforge.AttrError, match="activation.*'sigmoid'.*expected one of 'none', 'relu'"):
        ops.conv(x, w, b, activation="sigmoid")


def test_the_pass_folds_a_relu_that_is_the_conv_outputs_only_reader():
    x, w, b = _case((2, 4, 9, 9), (8, 4, 3, 3))
    conv = lambda v: ops.conv(v, w, b, pads=[1, 1, 1, 1])  # noqa: E731
    graph = opforge.trace(lambda v: ops.relu(conv(v)), TensorSpec(x.shape))
    assert _op_names(graph) == ["conv"] and graph.nodes[-1].attrs["activation"] == "relu"
    np.testing.assert_array_equal(graph(x), ops.relu(conv(x)))
    # the conv's output read elsewhere too: the relu stays
    kept = opforge.trace(lambda v: (lambda y: ops.add(ops.relu(y), y))(conv(v)), TensorSpec(x.shape))
    assert _op_names(kept) == ["conv", "relu", "add"]
    unoptimized = opforge.trace(lambda v: ops.relu(conv(v)), TensorSpec(x.shape), optimize=False)
    assert _op_names(unoptimized) == ["conv", "relu"] and fold_relu_into_conv(unoptimized) == 1
    assert fold_relu_into_conv(unoptimized) == 0  # nothing left to fold


def test_gradients_through_a_fused_relu():
    x, w, b = _case((1, 3, 6, 6), (4, 3, 3, 3), "float64")

    def loss(x, w, b, activation):
        y = ops.conv(x, w, b, pads=[1, 1, 1, 1], activation=activation)
        return ops.reduce_sum(ops.mul(y, y), axes=[0, 1, 2, 3], keep_dims=False)

    fused = opforge.grad(lambda x, w, b: loss(x, w, b, "relu"), argnums=(0, 1, 2))(x, w, b)
    plain = opforge.grad(lambda x, w, b: ops.reduce_sum(
        ops.mul(*(2 * [ops.relu(ops.conv(x, w, b, pads=[1, 1, 1, 1]))])), axes=[0, 1, 2, 3], keep_dims=False),
        argnums=(0, 1, 2))(x, w, b)
    for got, want in zip(fused, plain):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.abs(fused[0]).sum() > 0


def test_a_folded_conv_exports_as_conv_then_relu(tmp_path):
    onnx = pytest.importorskip("onnx")
    import opforge.onnx

    x, w, b = _case((1, 2, 6, 6), (3, 2, 3, 3))
    graph = opforge.trace(lambda v: ops.relu(ops.conv(v, w, b)), TensorSpec(x.shape))
    path = tmp_path / "conv_relu.onnx"
    opforge.onnx.export(graph, path)
    model = onnx.load(path)
    assert [node.op_type for node in model.graph.node if node.op_type != "Constant"] == ["Conv", "Relu"]
    loaded = opforge.onnx.load(path)
    np.testing.assert_array_equal(loaded(x), graph(x))
