"""Pooling, normalization, pad and resize: the built-in ops (C++ kernels against
their NumPy references, inference with unknown dims, the errors) and their ONNX
converters (opforge/onnx/nn.py: one-node models run by opforge and by
onnxruntime, across the opsets whose attributes differ)."""
import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opforge
import opforge.onnx as ox
from opforge import TensorSpec
from opforge.onnx.converters import import_converters
from opforge.testing import check_op

import_converters()
ops = opforge.ops


def sample(*shape, seed=0, dtype="float32"):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def model_of(op_type, inputs, attrs=None, *, opset=19, outputs=1, constant=()):
    """One node; inputs named in ``constant`` (by index) are initializers; None is an omitted input."""
    names = [f"x{k}" if x is not None else "" for k, x in enumerate(inputs)]
    node = helper.make_node(op_type, names, [f"y{k}" for k in range(outputs)], **(attrs or {}))
    graph_inputs, initializers = [], []
    for k, (name, x) in enumerate(zip(names, inputs)):
        if x is None:
            continue
        if k in constant:
            initializers.append(numpy_helper.from_array(np.asarray(x), name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, np.shape(x)))
    graph = helper.make_graph([node], "m", graph_inputs,
                              [helper.make_empty_tensor_value_info(f"y{k}") for k in range(outputs)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def agree(op_type, inputs, attrs=None, *, opset=19, outputs=1, constant=(), rtol=1e-5, atol=1e-5):
    """opforge's outputs of the one-node model equal onnxruntime's; returns opforge's."""
    model = model_of(op_type, inputs, attrs, opset=opset, outputs=outputs, constant=constant)
    feeds = {f"x{k}": x for k, x in enumerate(inputs) if x is not None and k not in constant}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph = ox.load(model)
    got = graph(*[feeds[name] for name in graph.input_names])
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.asarray(g).shape == w.shape and np.asarray(g).dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


# -- kernels against references ---------------------------------------------------------

POOL_CASES = [
    ((2, 3, 7, 8), dict(kernel_shape=[3, 3])),
    ((1, 2, 7, 8), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=True)),
    ((1, 2, 9, 9), dict(kernel_shape=[2, 2], dilations=[2, 3], pads=[1, 1, 1, 1])),
    ((2, 2, 11), dict(kernel_shape=[4], strides=[3], pads=[2, 1], ceil_mode=True)),
    ((1, 1, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1])),
]


@pytest.mark.parametrize("shape, attrs", POOL_CASES)
def test_pool_kernels_match_references(shape, attrs):
    x = sample(*shape)
    for dtype in ("float32", "float64"):
        check_op(ops.max_pool, x.astype(dtype), **attrs)
        check_op(ops.max_pool_with_indices, x.astype(dtype), storage_order=1, **attrs)
        check_op(ops.average_pool, x.astype(dtype), **attrs)
        check_op(ops.average_pool, x.astype(dtype), count_include_pad=True, **attrs)
        dy = sample(*ops.max_pool(x, **attrs).shape, seed=1, dtype=dtype)
        check_op(ops.max_pool_grad, dy, x.astype(dtype), **attrs)
        check_op(ops.average_pool_grad, dy, x.astype(dtype), count_include_pad=True, **attrs)


def test_max_pool_integer_dtypes_and_padding_never_wins():
    x = (np.arange(2 * 16).reshape(1, 2, 4, 4) % 7).astype("uint8")
    for dtype in ("uint8", "int8", "int32", "int64"):
        check_op(ops.max_pool, x.astype(dtype), kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    negative = -np.ones((1, 1, 2, 2), np.float32)
    np.testing.assert_array_equal(ops.max_pool(negative, kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
                                  -np.ones((1, 1, 3, 3), np.float32))


def test_max_pool_indices_row_and_column_major():
    x = np.array([[[[1, 9, 2], [3, 4, 8]]]], np.float32)  # 1 x 1 x 2 x 3
    y, rows = ops.max_pool_with_indices(x, kernel_shape=[2, 2])
    _, cols = ops.max_pool_with_indices(x, kernel_shape=[2, 2], storage_order=1)
    np.testing.assert_array_equal(y, [[[[9, 9]]]])
    np.testing.assert_array_equal(rows, [[[[1, 1]]]])
    np.testing.assert_array_equal(cols, [[[[2, 2]]]])  # (h 0, w 1) counted h fastest: 1 * 2 + 0


def test_average_pool_counts():
    x = np.ones((1, 1, 3, 3), np.float32)
    plain = ops.average_pool(x, kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    with_pad = ops.average_pool(x, kernel_shape=[2, 2], pads=[1, 1, 1, 1], count_include_pad=True)
    np.testing.assert_array_equal(plain, np.ones((1, 1, 4, 4)))
    assert with_pad[0, 0, 0, 0] == 0.25 and with_pad[0, 0, 1, 1] == 1.0 and with_pad[0, 0, 0, 1] == 0.5


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 7), (1, 2, 2, 3, 4), (3, 4)])
def test_global_average_pool_batch_norm_lrn_layer_norm_kernels(shape):
    x = sample(*shape)
    c = shape[1]
    stats = [sample(c, seed=k) for k in range(1, 4)] + [np.abs(sample(c, seed=4)) + 0.5]
    for dtype in ("float32", "float64"):
        xd, sd = x.astype(dtype), [s.astype(dtype) for s in stats]
        check_op(ops.global_average_pool, xd)
        check_op(ops.batch_norm, xd, *sd, epsilon=1e-3)
        for size in (1, 2, 3, 5):
            check_op(ops.lrn, xd, size=size, alpha=0.01, beta=0.7, bias=1.5)
            check_op(ops.lrn_grad, sample(*shape, seed=8).astype(dtype), xd, size=size, alpha=0.1, beta=0.7)
        for axis in range(-len(shape), len(shape)):
            normalised = shape[axis % len(shape):]
            check_op(ops.layer_norm, xd, sample(*normalised, seed=5).astype(dtype),
                     sample(*normalised, seed=6).astype(dtype), axis=axis, epsilon=1e-4)
        # scale broadcast inside the normalised dims, bias a single value
        check_op(ops.layer_norm, xd, sample(shape[-1], seed=7).astype(dtype), np.ones(1, dtype), axis=1)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_kernels_match_references(mode):
    x = sample(3, 4, 5)
    for pads in ([1, 0, 2, 2, 1, 0], [0, -1, 2, 1, 2, -2], [2, 3, 4, 2, 3, 4]):
        for dtype in ("float32", "float64", "int32", "int64", "int8"):
            check_op(ops.pad, (x * 10).astype(dtype), pads=pads, mode=mode, value=2.0)
        y = ops.pad(x, pads=pads, mode=mode)
        check_op(ops.pad_grad, sample(*y.shape, seed=1), x, pads=pads, mode=mode)


def test_pad_modes():
    x = np.array([1, 2, 3], np.float32)
    assert ops.pad(x, pads=[2, 2], mode="reflect").tolist() == [3, 2, 1, 2, 3, 2, 1]
    assert ops.pad(x, pads=[2, 2], mode="edge").tolist() == [1, 1, 1, 2, 3, 3, 3]
    assert ops.pad(x, pads=[2, 2], mode="wrap").tolist() == [2, 3, 1, 2, 3, 1, 2]
    assert ops.pad(x, pads=[1, -1], value=9.0).tolist() == [9, 1, 2]
    assert ops.pad(x, pads=[-1, 2], mode="reflect").tolist() == [2, 3, 2, 3]  # cropped first, then reflected


RESIZE_CASES = [
    dict(scales=[1, 1, 2, 1.5], mode="nearest"),
    dict(scales=[1, 1, 0.6, 0.8], mode="nearest", nearest_mode="floor", coordinate_transformation_mode="asymmetric"),
    dict(scales=[1, 1, 2, 1.7], mode="linear"),
    dict(scales=[1, 1, 0.5, 0.7], mode="linear", antialias=True),
    dict(sizes=[9, 13], axes=[3, 2], mode="cubic", exclude_outside=True, cubic_coeff_a=-0.5),
    dict(sizes=[9, 40], axes=[2, 3], mode="cubic", keep_aspect_ratio_policy="not_larger"),
    dict(scales=[1, 1, 0.8, 1.2], mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
         roi=[0, 0, 0.1, 0.3, 1, 1, 0.7, 0.9], extrapolation_value=5.0),
    dict(scales=[1, 1, 1.5, 0.5], mode="linear", coordinate_transformation_mode="half_pixel_symmetric"),
]


@pytest.mark.parametrize("attrs", RESIZE_CASES)
def test_resize_kernel_matches_reference(attrs):
    for dtype in ("float32", "float64"):
        x = sample(2, 3, 10, 12, dtype=dtype)
        check_op(ops.resize, x, **attrs)
        check_op(ops.resize_grad, sample(*ops.resize(x, **attrs).shape, seed=1, dtype=dtype), x, **attrs)


def test_inference_with_unknown_dims_and_rank():
    x = TensorSpec([-1, 3, -1, 10], "float32")
    assert ops.max_pool.op.infer(x, kernel_shape=[3, 3], strides=[2, 2]).shape == (-1, 3, -1, 4)
    assert ops.average_pool.op.infer(TensorSpec(None, "float32"), kernel_shape=[2]).rank is None
    assert ops.global_average_pool.op.infer(x).shape == (-1, 3, 1, 1)
    assert ops.pad.op.infer(x, pads=[0, 1, 2, 3, 0, 1, 2, 3]).shape == (-1, 5, -1, 16)
    assert ops.resize.op.infer(x, scales=[1, 1, 2, 2]).shape == (-1, 3, -1, 20)
    assert ops.resize.op.infer(x, sizes=[7, 8], axes=[2, 3]).shape == (-1, 3, 7, 8)
    y, mean, inv = ops.layer_norm.op.infer(x, TensorSpec([10], "float32"), None, axis=2)
    assert y.shape == (-1, 3, -1, 10) and mean.shape == inv.shape == (-1, 3, 1, 1)


@pytest.mark.parametrize("call, message", [
    (lambda: ops.max_pool(sample(1, 1, 4, 4), kernel_shape=[3]), "rank"),
    (lambda: ops.max_pool(sample(1, 1, 4, 4), kernel_shape=[3, 3], strides=[0, 1]), "strides"),
    (lambda: ops.average_pool(sample(1, 1, 2, 2), kernel_shape=[3, 3]), "smaller than the window"),
    (lambda: ops.average_pool(np.ones((1, 1, 4, 4), np.int32), kernel_shape=[2, 2]), "floating-point"),
    (lambda: ops.batch_norm(sample(2, 3, 4), *[sample(4)] * 4), "C = 3"),
    (lambda: ops.lrn(sample(2, 3), size=0), "size"),
    (lambda: ops.pad(sample(3), pads=[1], mode="constant"), "pads"),
    (lambda: ops.pad(sample(3), pads=[1, 1], mode="mirror"), "mode"),
    (lambda: ops.pad(sample(3), pads=[-2, -1, 1], mode="edge"), "pads"),
    (lambda: ops.resize(sample(1, 4), scales=[1, 2], sizes=[1, 8]), "exactly one"),
    (lambda: ops.resize(sample(1, 4), scales=[2], mode="area"), "mode"),
    (lambda: ops.layer_norm(sample(2, 3), sample(2), axis=1), "broadcast"),
])
def test_bad_arguments_are_typed_errors(call, message):
    with pytest.raises(opforge.errors.OpforgeError, match=message):
        call()


# -- ONNX converters against onnxruntime ------------------------------------------------

@pytest.mark.parametrize("shape, attrs", POOL_CASES)
def test_onnx_pooling(shape, attrs):
    x = sample(*shape)
    onnx_attrs = {**attrs, "ceil_mode": int(attrs.get("ceil_mode", False))}
    agree("MaxPool", [x], onnx_attrs)
    agree("MaxPool", [x], {**onnx_attrs, "storage_order": 1}, outputs=2)
    agree("AveragePool", [x], onnx_attrs)
    agree("AveragePool", [x], {**onnx_attrs, "count_include_pad": 1})


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_onnx_pooling_auto_pad(auto_pad):
    x = sample(1, 2, 7, 6)
    for op_type in ("MaxPool", "AveragePool"):
        agree(op_type, [x], {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": auto_pad})
    agree("MaxPool", [x], {"kernel_shape": [2, 2], "auto_pad": auto_pad}, opset=7)


def test_onnx_global_pools_and_lrn():
    x = sample(2, 5, 4, 3)
    agree("GlobalAveragePool", [x])
    agree("GlobalMaxPool", [x])
    agree("LRN", [x], {"size": 3, "alpha": 0.02, "beta": 0.6, "bias": 2.0})
    agree("LRN", [x], {"size": 5})


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
def test_onnx_batch_normalization(opset):
    x = sample(2, 3, 4, 5)
    stats = [sample(3, seed=1), sample(3, seed=2), sample(3, seed=3), np.abs(sample(3, seed=4)) + 0.5]
    agree("BatchNormalization", [x, *stats], {"epsilon": 1e-3}, opset=opset, constant=(1, 2, 3, 4))
    agree("BatchNormalization", [x, *stats], {}, opset=opset)  # statistics as graph inputs


def test_onnx_batch_normalization_training_mode():
    x = sample(4, 3, 5)
    stats = [sample(3, seed=1), sample(3, seed=2), sample(3, seed=3), np.abs(sample(3, seed=4)) + 0.5]
    model = model_of("BatchNormalization", [x, *stats], {"training_mode": 1, "momentum": 0.8}, opset=15, outputs=3)
    y, running_mean, running_var = ox.load(model)(x, *stats)
    mean, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    want = (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5) * stats[0][:, None] + stats[1][:, None]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(running_mean, stats[2] * 0.8 + mean * 0.2, rtol=1e-5)
    np.testing.assert_allclose(running_var, stats[3] * 0.8 + var * 0.2, rtol=1e-5)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_onnx_layer_normalization(axis):
    x = sample(2, 3, 4)
    normalised = x.shape[axis % 3:]
    scale, bias = sample(*normalised, seed=1), sample(*normalised, seed=2)
    agree("LayerNormalization", [x, scale, bias], {"axis": axis, "epsilon": 1e-3}, opset=17, outputs=3)
    agree("LayerNormalization", [x, scale], {"axis": axis}, opset=17, constant=(1,))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_onnx_pad(mode):
    x = sample(3, 4, 5)
    pads = np.array([1, 0, 2, 2, 1, 1], np.int64)
    agree("Pad", [x, pads, np.array(1.5, np.float32)], {"mode": mode}, constant=(1, 2))
    agree("Pad", [x, np.array([2, 1, 1, 2], np.int64), None, np.array([0, -1], np.int64)], {"mode": mode},
          constant=(1, 3))
    if mode != "wrap":  # (wrap is new in opset 19)
        agree("Pad", [x], {"mode": mode, "pads": [1, 0, 2, 2, 1, 1]}, opset=2)


def test_onnx_pad_constant_value_known_only_at_run_time():
    x = sample(2, 3)
    agree("Pad", [x, np.array([1, 2, 0, 1], np.int64), np.array(-4.0, np.float32)], constant=(1,))


@pytest.mark.parametrize("attrs, scales", [
    ({"mode": "nearest"}, [1, 1, 2, 3]),
    ({"mode": "nearest", "nearest_mode": "floor", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 0.5, 0.7]),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, [1, 1, 1.5, 2.5]),
    ({"mode": "linear"}, [1, 1, 2, 1.5]),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 0.5, 0.75]),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 2, 3]),
    ({"mode": "cubic"}, [1, 1, 1.5, 2]),
    ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, [1, 1, 0.5, 0.75]),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.6]),
])
def test_onnx_resize_scales(attrs, scales):
    x = sample(1, 2, 8, 10)
    agree("Resize", [x, None, np.array(scales, np.float32)], attrs, constant=(2,), rtol=1e-4, atol=1e-4)


def test_onnx_resize_sizes_axes_roi_and_upsample():
    x = sample(1, 2, 8, 10)
    agree("Resize", [x, None, None, np.array([12, 5], np.int64)], {"mode": "linear", "axes": [3, 2]}, constant=(3,))
    agree("Resize", [x, None, None, np.array([12, 30], np.int64)],
          {"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}, constant=(3,))
    agree("Resize", [x, np.array([0, 0, 0.2, 0.1, 1, 1, 0.9, 0.8], np.float32), None,
                     np.array([1, 2, 6, 7], np.int64)],
          {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 3.0},
          constant=(1, 3), opset=13)
    agree("Resize", [x, np.array([1, 1, 2, 2], np.float32)], {"mode": "linear"}, opset=10, constant=(1,))
    agree("Upsample", [x, np.array([1, 1, 2, 3], np.float32)], {"mode": "nearest"}, opset=9, constant=(1,))


def test_onnx_converter_errors():
    x = sample(1, 1, 4, 4)
    dynamic = helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, 1, "h", "w"])
    node = helper.make_node("MaxPool", ["x0"], ["y0"], kernel_shape=[2, 2], auto_pad="SAME_UPPER")
    graph = helper.make_graph([node], "m", [dynamic], [helper.make_empty_tensor_value_info("y0")])
    pooled = ox.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert isinstance(pooled, ox.DynamicModel) and "auto_pad SAME_UPPER" in pooled.reason  # per input shape
    assert pooled(sample(1, 1, 5, 3)).shape == (1, 1, 5, 3)  # stride 1: SAME keeps the size
    stats = [np.ones(1, np.float32)] * 4
    with pytest.raises(ox.ModelError, match="spatial"):
        ox.load(model_of("BatchNormalization", [x, *stats], {"spatial": 0}, opset=7))
    resize = ox.load(model_of("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], opset=13))
    assert resize.mode(x, np.array([1, 1, 2, 2], np.float32)) == "eager"  # scales at run time: node by node
    assert resize(x, np.array([1, 1, 3, 2], np.float32)).shape == (1, 1, 12, 8)


def test_onnx_pooling_with_unknown_batch_and_size_runs():
    dynamic = helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["n", 2, "h", "w"])
    nodes = [helper.make_node("MaxPool", ["x0"], ["t"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["t"], ["y0"])]
    graph = helper.make_graph(nodes, "m", [dynamic], [helper.make_empty_tensor_value_info("y0")])
    loaded = ox.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    for shape in [(1, 2, 9, 9), (3, 2, 6, 11)]:
        x = sample(*shape)
        want = ops.global_average_pool(ops.max_pool(x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
        np.testing.assert_allclose(loaded(x), want, rtol=1e-6)


def test_every_pool_combination_agrees_with_onnxruntime_in_1d():
    x = sample(2, 3, 9)
    for k, s, p, ceil, d in itertools.product([2, 3], [1, 2], [0, 1], [0, 1], [1, 2]):
        attrs = {"kernel_shape": [k], "strides": [s], "pads": [p, 1 - p], "ceil_mode": ceil, "dilations": [d]}
        agree("MaxPool", [x], attrs)
        agree("AveragePool", [x], {**attrs, "count_include_pad": p})


def test_edge_shapes():
    check_op(ops.pad, np.zeros((0, 3), np.float32), pads=[1, 0, 1, 2], value=3.0)
    np.testing.assert_array_equal(ops.pad(np.zeros((0, 3), np.float32), pads=[1, 0, 1, 2], value=3.0),
                                  np.full((2, 5), 3.0))
    check_op(ops.pad, np.array(5.0, np.float32), pads=[])
    check_op(ops.resize, sample(2, 3), scales=[0.2, 1.0])  # an output dim of 0
    assert ops.resize(sample(2, 3), scales=[0.2, 1.0]).shape == (0, 3)
    check_op(ops.layer_norm, np.arange(4.0), np.ones(4), np.zeros(4), axis=0)
    check_op(ops.max_pool, sample(0, 3, 4, 4), kernel_shape=[2, 2])
    # windows of padding only: the lowest value and index -1 (max), 0 (average)
    y, where = ops.max_pool_with_indices(sample(1, 1, 2, 2), kernel_shape=[2, 2], pads=[2, 2, 2, 2])
    assert y[0, 0, 0, 0] == -np.inf and where[0, 0, 0, 0] == -1
    assert ops.average_pool(sample(1, 1, 2, 2), kernel_shape=[2, 2], pads=[2, 2, 2, 2])[0, 0, 0, 0] == 0


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [1, 0, 1, 1], "p": 3},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "p": 1, "dilations": [1, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"},
])
def test_onnx_lp_pool(attrs):
    agree("LpPool", [sample(1, 2, 7, 8)], attrs, opset=18, rtol=1e-4)


def test_onnx_global_lp_pool_instance_and_group_normalization():
    x = sample(2, 4, 3, 5)
    agree("GlobalLpPool", [x], {"p": 3}, opset=18, rtol=1e-4)
    agree("InstanceNormalization", [x, sample(4, seed=1), sample(4, seed=2)], {"epsilon": 1e-3}, rtol=1e-4, atol=1e-5)
    agree("InstanceNormalization", [sample(2, 3, 7), sample(3, seed=1), sample(3, seed=2)], rtol=1e-4, atol=1e-5)
    agree("GroupNormalization", [x, sample(4, seed=1), sample(4, seed=2)], {"num_groups": 2}, opset=21,
          rtol=1e-4, atol=1e-5)


def test_onnx_center_crop_pad():
    x = sample(5, 6, 3)
    graph = ox.load(model_of("CenterCropPad", [x, np.array([8, 3], np.int64)], {"axes": [0, 1]}, opset=18,
                             constant=(1,)))
    want = np.zeros((8, 3, 3), np.float32)
    want[1:6] = x[:, 1:4]  # padded 1 + 2 along axis 0, cropped from 1 along axis 1
    np.testing.assert_array_equal(graph(x), want)
