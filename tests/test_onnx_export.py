"""opforge.onnx.export: traced graphs of built-ins become ONNX models that pass the checker and compute in
onnxruntime what the opforge graph computes; user ops become nodes of their own domain."""
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import opforge
from opforge import TensorSpec
from opforge.errors import ModelError
from opforge.onnx.export import EXPORTERS, export, split_name
from helpers import random_weights

ops = opforge.ops
OPSETS = [11, 13, 17, 18]


def run_ort(model, arrays):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})


def check_against_ort(graph, arrays, opset=17, rtol=1e-5):
    model = export(graph, opset=opset)
    onnx.checker.check_model(model, full_check=True)
    expected = graph(*arrays)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = run_ort(model, arrays)
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected)):
        assert a.dtype == b.dtype, f"output {k}: {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"output {k}: {a.shape} != {b.shape}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6, err_msg=f"output {k}")
    return model


rng = np.random.default_rng(0)
X = rng.standard_normal((4, 3, 5)).astype(np.float32)
Y = rng.standard_normal((3, 5)).astype(np.float32)


def elementwise(x, y):
    a = ops.add(x, y) * y - ops.div(x, ops.abs(y) + 1.0)
    b = ops.pow(ops.abs(x) + 0.5, ops.abs(y))
    c = ops.maximum(ops.relu(x), ops.minimum(x, y)) + ops.neg(ops.tanh(x))
    d = ops.sqrt(ops.exp(ops.log(ops.abs(x) + 1.0)))
    return a, b, ops.leaky_relu(c, alpha=0.2), d


def comparisons(x, y):
    return (ops.equal(x, x), ops.not_equal(x, y), ops.less(x, y), ops.less_equal(x, y), ops.greater(x, y),
            ops.greater_equal(x, y), ops.where(ops.greater(x, y), x, y))


def reductions(x, y):
    return (ops.reduce_sum(x, axes=[1], keep_dims=True), ops.reduce_sum(x), ops.mean(x, axes=[0, -1]),
            ops.mean(x, keep_dims=True), ops.softmax(x), ops.softmax(x, axis=1), ops.softmax(x, axis=0))


def shapes(x, y):
    r = ops.reshape(x, shape=[4, -1])
    t = ops.transpose(x)
    s = ops.slice(x, starts=[1, -1], ends=[100, 0], axes=[0, 2], steps=[2, -2])
    u = ops.unsqueeze(ops.squeeze(ops.slice(x, starts=[0], ends=[1]), axes=[0]), axes=[1, -1])
    c = ops.concat(x, x * 2.0, axis=1)
    return r, t, s, u, c, ops.cast(x, dtype="float64"), ops.cast(x, dtype="int32")


def matmul(x, y):
    return ops.matmul(x, ops.transpose(ops.unsqueeze(y, axes=[0]) + ops.reshape(x, shape=[4, 3, 5])))


def gemm(x, y):
    a = ops.reshape(x, shape=[12, 5])
    return (ops.gemm(a, y, None, trans_b=True), ops.gemm(y, a, y[:, 0:1], alpha=0.5, beta=2.0, trans_b=True),
            ops.gemm(a, a, np.float32(1.5), trans_a=True))


def gradient_ops(x, y):
    return ops.relu_grad(x * y, ops.relu(x)), ops.leaky_relu_grad(x * y, x, alpha=0.3)


def activations(x, y):
    return (ops.clip(x, min=-0.5, max=0.7), ops.clip(x, min=-0.5), ops.clip(x, max=0.2), ops.sigmoid(x),
            ops.hard_sigmoid(x, alpha=0.3, beta=0.4), ops.erf(x), ops.gelu(x), ops.gelu(x, approximate="tanh"),
            ops.sum(x, y, x))


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_mod_matches_onnxruntime(dtype):
    a = np.array([[7, -7, 7, -7, 0, 5.5], [3, -3, 2, 9, -4, -0.5]]).astype(dtype)
    b = np.array([3, 3, -3, -3, 2, 2]).astype(dtype)
    graph = opforge.trace(lambda a, b: (ops.mod(a, b), ops.mod(a, b, fmod=True)), TensorSpec(a.shape, dtype),
                          TensorSpec(b.shape, dtype))
    check_against_ort(graph, (a, b))


def test_integer_clip_needs_opset_12():
    graph = opforge.trace(lambda x: ops.clip(x, min=-3, max=4), TensorSpec([5], "int32"))
    with pytest.raises(ModelError, match="Clip takes int32 from opset 12"):
        export(graph, opset=11)
    check_against_ort(graph, (np.arange(-5, 5, 2, dtype=np.int32),), opset=12)


def indexing(x, y):
    indices = np.array([[0, -1], [2, 1]], np.int64)
    values, where = ops.topk(x, k=2, axis=1)
    return (ops.gather(x, indices, axis=1), ops.tile(y, repeats=[2, 1]), ops.expand(y, shape=[2, 1, 3, 5]),
            values, where, ops.shape(x), ops.shape(x, start=1, end=-1),
            ops.constant_of_shape(np.array([1.5], np.float32), shape=[2, 3]) + ops.reduce_sum(y, axes=[1])[:2, None])


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("fn", [elementwise, comparisons, reductions, shapes, matmul, gradient_ops, activations,
                                indexing, gemm])
def test_builtin_graph_matches_onnxruntime(fn, opset):
    graph = opforge.trace(fn, TensorSpec(X.shape), TensorSpec(Y.shape))
    check_against_ort(graph, (X, Y), opset=opset)


@pytest.mark.parametrize("opset", [11, 17, 19])
def test_pooling_and_normalization_match_onnxruntime(opset):
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    scale, bias, mean = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    var = rng.random(3).astype(np.float32) + 0.5

    def f(x):
        outs = (ops.max_pool(x, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], ceil_mode=True),
                ops.max_pool(x, kernel_shape=[2, 2], dilations=[2, 1]),
                ops.average_pool(x, kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=True),
                ops.average_pool(x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                ops.global_average_pool(x), ops.batch_norm(x, scale, bias, mean, var, epsilon=1e-3),
                ops.lrn(x, size=3, alpha=0.01, beta=0.6, bias=1.5)) + \
            ops.max_pool_with_indices(x, kernel_shape=[2, 3], strides=[2, 2], pads=[0, 1, 1, 1])
        return outs + ((ops.average_pool(x, kernel_shape=[2, 2], dilations=[2, 2]),) if opset >= 19 else ())
    check_against_ort(opforge.trace(f, TensorSpec(x.shape)), (x,), opset=opset)


@pytest.mark.parametrize("opset", [11, 19])
def test_conv_and_pad_match_onnxruntime(opset):
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    wt = rng.standard_normal((4, 3, 2, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)

    def f(x):
        outs = (ops.conv(x, w, b, strides=[2, 1], pads=[1, 0, 1, 2], dilations=[1, 2], group=2),
                ops.conv(x, w[:, :, :1, :1].repeat(2, axis=1), None),
                ops.conv_transpose(x, wt, b[:3], strides=[2, 2], pads=[0, 1, 1, 0], output_padding=[1, 0]),
                ops.pad(x, pads=[0, 1, 2, -1, 0, 0, 1, 3], value=0.3), ops.pad(x, pads=[0, 0, 1, 2, 0, 0, 2, 1],
                                                                             mode="reflect"),
                ops.pad(x, pads=[0, 0, 1, 2, 0, 0, 2, 1], mode="edge"))
        return outs + ((ops.pad(x, pads=[0, 0, 1, 2, 0, 0, 2, 1], mode="wrap"),) if opset >= 19 else ())
    check_against_ort(opforge.trace(f, TensorSpec(x.shape)), (x,), opset=opset, rtol=1e-4)


@pytest.mark.parametrize("opset, dtype", [(11, "float32"), (17, "float32"), (18, "float64")])
def test_layer_norm_matches_onnxruntime(opset, dtype):
    x = rng.standard_normal((2, 3, 4)).astype(dtype)
    scale, bias = (rng.standard_normal((3, 4)).astype(dtype) for _ in range(2))

    def f(x):
        y, mean, inv_std_dev = ops.layer_norm(x, scale, bias, axis=1, epsilon=1e-3)
        return y, mean, inv_std_dev, ops.layer_norm(x, scale[0], axis=-1)[0]
    model = check_against_ort(opforge.trace(f, TensorSpec(x.shape, dtype)), (x,), opset=opset, rtol=1e-4)
    assert ("LayerNormalization" in {n.op_type for n in model.graph.node}) == (opset >= 17 and dtype == "float32")


RESIZES = [
    (11, dict(scales=[1.0, 1.0, 2.0, 1.5])),
    (11, dict(sizes=[5, 3], axes=[2, 3], mode="linear", coordinate_transformation_mode="align_corners")),
    (11, dict(scales=[0.5, 2.0], axes=[-2, -1], mode="cubic", coordinate_transformation_mode="asymmetric",
              exclude_outside=True)),
    (11, dict(sizes=[1, 3, 5, 5], mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
              roi=[0, 0, 0.2, 0.1, 1, 1, 0.9, 0.8], extrapolation_value=2.0)),
    (11, dict(scales=[1.0, 1.0, 2.0, 1.5], coordinate_transformation_mode="tf_half_pixel_for_nn")),
    (13, dict(scales=[1.0, 1.0, 1.7, 0.6], mode="nearest", nearest_mode="ceil",
              coordinate_transformation_mode="pytorch_half_pixel")),
    (18, dict(scales=[0.6, 0.5], axes=[2, 3], mode="linear", antialias=True)),
    (18, dict(sizes=[5, 7], axes=[2, 3], keep_aspect_ratio_policy="not_larger")),
    (19, dict(scales=[2.0, 1.5], axes=[2, 3], mode="linear", coordinate_transformation_mode="half_pixel_symmetric")),
]


@pytest.mark.parametrize("opset, attrs", RESIZES)
def test_resize_matches_onnxruntime(opset, attrs):
    x = rng.standard_normal((1, 3, 4, 6)).astype(np.float32)
    graph = opforge.trace(lambda x: ops.resize(x, **attrs), TensorSpec(x.shape))
    model = check_against_ort(graph, (x,), opset=opset, rtol=1e-4)
    assert [n.op_type for n in model.graph.node] == ["Resize"]


@pytest.mark.parametrize("fn, opset, message", [
    (lambda x: ops.average_pool(x, kernel_shape=[2], dilations=[2]), 18, "dilations \\[2\\] need opset 19"),
    (lambda x: ops.pad(x, pads=[0, 0, 1, 0, 0, 1], mode="wrap"), 18, "mode 'wrap' needs opset 19"),
    (lambda x: ops.resize(x, scales=[0.5], axes=[2], antialias=True, mode="linear"), 17, "antialias needs opset 18"),
    (lambda x: ops.resize(x, scales=[1, 1, 2.0], coordinate_transformation_mode="half_pixel_symmetric"), 18,
     "'half_pixel_symmetric' needs opset 19"),
    (lambda x: ops.resize(x, scales=[1, 1, 2.0], coordinate_transformation_mode="tf_half_pixel_for_nn"), 13,
     "before opset 13 only"),
])
def test_newer_attributes_need_their_opset(fn, opset, message):
    graph = opforge.trace(fn, TensorSpec([1, 1, 6]))
    with pytest.raises(ModelError, match=message):
        export(graph, opset=opset)


def test_gelu_is_one_node_from_opset_20():
    graph = opforge.trace(lambda x: ops.gelu(x, approximate="tanh"), TensorSpec(Y.shape))
    model = check_against_ort(graph, (Y,), opset=20)
    assert [n.op_type for n in model.graph.node] == ["Gelu"]


def test_dynamic_dims_become_dim_params_and_run_at_two_sizes():
    def f(x):
        n = x.shape[0]  # a symbolic dim: dim ops at run time
        return ops.reshape(ops.softmax(x), shape=[-1]), ops.mul(ops.cast(ops.dim(x, axis=0), dtype="float32"),
                                                                 ops.reduce_sum(x, axes=[1])), n * 2
    graph = opforge.trace(f, TensorSpec([None, 3]))
    model = export(graph)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and not dims[0].HasField("dim_value") and dims[1].dim_value == 3
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param
    for n in (2, 7):
        check_against_ort(graph, (rng.standard_normal((n, 3)).astype(np.float32),))


def test_constants_become_initializers_and_path_is_written(tmp_path):
    w = rng.standard_normal((5, 2)).astype(np.float32)
    graph = opforge.trace(lambda x: ops.matmul(x, w) + np.float32(1.5), TensorSpec([3, 5]))
    path = tmp_path / "m.onnx"
    model = export(graph, path)
    assert path.exists() and onnx.load(str(path)) == model
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    assert any(a.shape == (5, 2) and np.array_equal(a, w) for a in initializers.values())
    assert [o.domain for o in model.opset_import] == [""] and model.opset_import[0].version == 17
    x = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(run_ort(model, [x])[0], x @ w + 1.5, rtol=1e-5)


def test_outputs_that_are_inputs_or_repeated_get_their_own_names():
    graph = opforge.trace(lambda x: (x, ops.relu(x)), TensorSpec([2, 5]))
    graph.outputs = [graph.outputs[0], graph.outputs[1], graph.outputs[1]]
    graph.invalidate()
    model = check_against_ort(graph, (X[0, :2],))
    names = [o.name for o in model.graph.output]
    assert len(set(names)) == 3 and model.graph.input[0].name not in names


def test_reduce_axes_are_an_input_from_opset_13_and_an_attribute_before():
    graph = opforge.trace(lambda x: ops.reduce_sum(x, axes=[1]), TensorSpec([2, 3]))
    old, new = export(graph, opset=11), export(graph, opset=13)
    (node_old,), (node_new,) = old.graph.node, new.graph.node
    assert node_old.op_type == node_new.op_type == "ReduceSum"
    assert [a.name for a in node_old.attribute if a.name == "axes"] == ["axes"] and len(node_old.input) == 1
    assert len(node_new.input) == 2 and "axes" not in [a.name for a in node_new.attribute]


def test_layout_reorder_is_identity():
    x = rng.standard_normal((1, 20, 3, 3)).astype(np.float32)
    graph = opforge.trace(lambda x: ops.reorder(ops.relu(ops.reorder(x, layout="nchw16c")), layout="ndarray"),
                          TensorSpec(x.shape))
    model = check_against_ort(graph, (x,))
    assert [n.op_type for n in model.graph.node].count("Identity") == 2


user_scale = opforge.op("export_test::scale(Tensor x, Tensor? bias, *, float factor=2.0, int[] axes=[], "
                        "bool flag=False, str mode='fast', DType out='float32', float[] weights=[0.5, 1.5]) "
                        "-> Tensor y", traits=["no_side_effect"])
user_scale.def_infer(opforge.infer.same_as(0))


@user_scale.reference(fallback=True)
def _(x, bias=None, *, factor, axes, flag, mode, out, weights):
    return (x * factor if bias is None else x * factor + bias).astype(x.dtype)


plain_op = opforge.op("export_test_plain(Tensor x) -> Tensor y")
plain_op.def_infer(opforge.infer.same_as(0))
plain_op.reference(fallback=True)(lambda x: x + 1)


def test_user_op_exports_as_a_node_of_its_domain():
    def f(x):
        return plain_op(ops.export_test.scale(ops.relu(x), factor=3.0, axes=[1, 2], flag=True))
    graph = opforge.trace(f, TensorSpec([2, 3]))
    model = export(graph)
    relu, scale, plain = model.graph.node
    assert (relu.domain, relu.op_type) == ("", "Relu")
    assert (scale.domain, scale.op_type) == ("export_test", "scale")
    assert list(scale.input) == [relu.output[0]]  # the omitted optional input is left out
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in scale.attribute}
    assert attrs == {"factor": pytest.approx(3.0), "axes": [1, 2], "flag": 1, "mode": b"fast", "out": b"float32",
                     "weights": [0.5, 1.5]}
    assert (plain.domain, plain.op_type) == ("opforge", "export_test_plain")
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 17), ("export_test", 1), ("opforge", 1)}


def test_empty_list_attribute_keeps_its_type():
    graph = opforge.trace(lambda x: ops.export_test.scale(x, weights=[]), TensorSpec([2]))
    (node,) = export(graph).graph.node
    kinds = {a.name: a.type for a in node.attribute}
    assert kinds["axes"] == onnx.AttributeProto.INTS and kinds["weights"] == onnx.AttributeProto.FLOATS


def test_split_name():
    assert split_name("com.example::MyOp") == ("com.example", "MyOp")
    assert split_name("a::b::op") == ("a.b", "op")
    assert split_name("op") == ("opforge", "op")


def test_builtin_without_onnx_form_is_model_error_listing_them():
    def f(x, dy):
        return ops.slice_grad(dy, x, starts=[0], ends=[1]), ops.relu(x)
    graph = opforge.trace(f, TensorSpec([3]), TensorSpec([1]))
    assert "slice_grad" not in EXPORTERS
    with pytest.raises(ModelError, match="no ONNX form: slice_grad"):
        export(graph)


@pytest.mark.parametrize("opset", [10, 1000, "17", True])
def test_bad_opset_is_model_error(opset):
    graph = opforge.trace(ops.relu, TensorSpec([3]))
    with pytest.raises(ModelError, match="opset must be an int"):
        export(graph, opset=opset)


def test_non_graph_is_model_error():
    with pytest.raises(ModelError, match="takes an opforge Graph, got OpFunction"):
        export(ops.relu)
    with pytest.raises(ModelError, match="path must be a file path"):
        export(opforge.trace(ops.relu, TensorSpec([3])), 3.5)


def test_unwritable_path_is_model_error(tmp_path):
    graph = opforge.trace(ops.relu, TensorSpec([3]))
    with pytest.raises(ModelError, match="cannot write"):
        export(graph, tmp_path / "missing" / "m.onnx")


def test_zero_dim_reshape_needs_allowzero():
    graph = opforge.trace(lambda x: ops.reshape(x, shape=[0, 4]), TensorSpec([0, 2]))
    with pytest.raises(ModelError, match="allowzero"):
        export(graph, opset=13)
    model = check_against_ort(graph, (np.zeros((0, 2), np.float32),), opset=14)
    assert any(a.name == "allowzero" and a.i == 1 for a in model.graph.node[0].attribute)


@pytest.mark.parametrize("fn", [elementwise, reductions, shapes, activations, indexing])
def test_round_trip_through_load(fn):
    graph = opforge.trace(fn, TensorSpec([None, 3, 5]), TensorSpec(Y.shape))
    loaded = opforge.onnx.load(export(graph))
    for n in (4,) if fn is shapes else (4, 2):  # shapes reshapes to a fixed [4, -1]
        x = rng.standard_normal((n, 3, 5)).astype(np.float32)
        for got, expected in zip(loaded(x, Y), graph(x, Y)):
            assert got.dtype == expected.dtype
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_round_trip_keeps_names_and_user_ops():
    model = export(opforge.trace(lambda x: ops.export_test.scale(ops.relu(x), factor=3.0, flag=True),
                                 TensorSpec([2, 3])))
    traced_name, model.graph.input[0].name = model.graph.input[0].name, "image"
    for node in model.graph.node:
        node.input[:] = ["image" if name == traced_name else name for name in node.input]
    loaded = opforge.onnx.load(model)
    assert [n.op.name for n in loaded.nodes if not n.is_constant] == ["relu", "export_test::scale"]
    again = export(loaded)
    assert [i.name for i in again.graph.input] == ["image"]
    assert [o.name for o in again.graph.output] == [o.name for o in model.graph.output]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), np.maximum(x, 0) * 3.0, rtol=1e-6)


dotted_op = opforge.op("com.example::ExportShift(Tensor x, *, float by=1.0) -> Tensor y")
dotted_op.def_infer(opforge.infer.same_as(0))
dotted_op.reference(fallback=True)(lambda x, *, by: (x + by).astype(x.dtype))


def test_dotted_namespace_is_the_domain_and_round_trips():
    graph = opforge.trace(lambda x: dotted_op(x, by=2.5), TensorSpec([3]))
    model = export(graph)
    (node,) = model.graph.node
    assert (node.domain, node.op_type) == ("com.example", "ExportShift")
    assert ("com.example", 1) in {(o.domain, o.version) for o in model.opset_import}
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(opforge.onnx.load(model)(x), x + 2.5)


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_loaded_light_model_exports_back(name):
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    light = random_weights(onnx.load(path))  # the fills' near-equal logits would compare rounding, not the graph
    graph = opforge.onnx.load(light)
    model = export(graph)
    x = rng.standard_normal(graph.inputs[0].spec.shape).astype(np.float32)
    original = ort.InferenceSession(light.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = original.run(None, {original.get_inputs()[0].name: x})
    np.testing.assert_allclose(run_ort(model, [x])[0], expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(graph(x), expected[0], rtol=1e-3, atol=1e-6)
    assert [o.name for o in model.graph.output] == [o.name for o in original.get_outputs()]


def test_backward_graph_exports():
    from opforge.graph.autodiff import backward

    def f(x, w, b):
        h = ops.add(ops.matmul(x, w), b)
        return ops.reduce_sum(ops.leaky_relu(h, alpha=0.1) * ops.softmax(ops.relu(h)))
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3, 5), (5,)))
    graph = backward(opforge.trace(f, TensorSpec(x.shape), TensorSpec(w.shape), TensorSpec(b.shape)))
    model = check_against_ort(graph, (x, w, b, np.array(1.0, np.float32)), rtol=1e-4)
    assert {"Where", "MatMul", "Softmax"} <= {n.op_type for n in model.graph.node}


def test_unknown_rank_input_is_model_error():
    graph = opforge.trace(ops.relu, TensorSpec(None))
    with pytest.raises(ModelError, match="input '.*' has unknown rank"):
        export(graph)


def test_every_builtin_op_but_gradient_ops_has_an_onnx_form():
    from opforge.onnx.export import is_builtin

    builtins = [op.name for op in opforge.registered_ops() if is_builtin(op)]
    assert {"relu", "conv", "resize", "layer_norm"} <= set(builtins)
    assert [name for name in builtins if name not in EXPORTERS and not name.endswith("_grad")] == []
