"""The elementwise and reduction converters (opforge/onnx/elementwise.py and
reduce.py): one-node models run by opforge and by onnxruntime, inputs traced
(graph inputs) and folded at load time (initializers), across opsets whose
semantics differ (Softmax before 13, legacy broadcasting, Clip's attributes
then inputs, reduction axes as attribute then input), dtypes opforge's ops
widen, and the ModelErrors for what opforge refuses."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opforge
import opforge.onnx as ox
from opforge.onnx.converters import import_converters

import_converters()
ELEM = {np.dtype(k): v for k, v in [("float32", TensorProto.FLOAT), ("float64", TensorProto.DOUBLE),
                                     ("float16", TensorProto.FLOAT16), ("int32", TensorProto.INT32),
                                     ("int64", TensorProto.INT64), ("int8", TensorProto.INT8),
                                     ("uint8", TensorProto.UINT8), ("bool", TensorProto.BOOL),
                                     ("int16", TensorProto.INT16), ("uint16", TensorProto.UINT16),
                                     ("uint32", TensorProto.UINT32), ("uint64", TensorProto.UINT64)]}


def rng(seed=0):
    return np.random.default_rng(seed)


def sample(shape, dtype="float32", seed=0, low=-3.0, high=3.0):
    values = rng(seed).uniform(low, high, shape)
    if np.dtype(dtype) == np.bool_:
        return values > 0
    return values.astype(dtype) if np.dtype(dtype).kind == "f" else np.round(values).astype(dtype)


def one_node_model(op_type, inputs, attrs=None, opset=13, outputs=1, constant=(), input_names=None):
    """A model of one node; the inputs named in ``constant`` are initializers (folded at load time).
    ``inputs`` is a list of arrays (None: an omitted optional input)."""
    names = input_names or [f"x{k}" if x is not None else "" for k, x in enumerate(inputs)]
    node = helper.make_node(op_type, names, [f"y{k}" for k in range(outputs)], **(attrs or {}))
    graph_inputs, initializers = [], []
    for name, x in zip(names, inputs):
        if x is None:
            continue
        if name in constant:
            initializers.append(numpy_helper.from_array(np.asarray(x), name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, ELEM[np.asarray(x).dtype], np.shape(x)))
    graph = helper.make_graph([node], "m", graph_inputs, [helper.make_empty_tensor_value_info(f"y{k}")
                                                          for k in range(outputs)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def run_opforge(model, inputs, constant=()):
    graph = ox.load(model)
    feeds = {f"x{k}": x for k, x in enumerate(inputs) if x is not None and f"x{k}" not in constant}
    got = graph(*[feeds[name] for name in graph.input_names])
    return list(got) if isinstance(got, tuple) else [got]


def run_ort(model, inputs, constant=()):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {f"x{k}": x for k, x in enumerate(inputs) if x is not None and f"x{k}" not in constant}
    return session.run(None, feeds)


def assert_matches_ort(op_type, inputs, attrs=None, opset=13, outputs=1, constant=(), rtol=1e-5, atol=1e-6):
    model = one_node_model(op_type, inputs, attrs, opset, outputs, constant)
    want = run_ort(model, inputs, constant)
    got = run_opforge(model, inputs, constant)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.dtype == w.dtype, (op_type, g.dtype, w.dtype)
        assert g.shape == w.shape, (op_type, g.shape, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)
    return got


# -- binary arithmetic ----------------------------------------------------------------------

BINARY_SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), ()), ((), (3,))]


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", BINARY_SHAPES)
@pytest.mark.parametrize("constant", [(), ("x1",)])
def test_binary_float32_matches_ort(op_type, shapes, constant):
    a, b = sample(shapes[0]), sample(shapes[1], seed=1, low=0.5)
    assert_matches_ort(op_type, [a, b], opset=14, constant=constant)


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", ["float64", "int32", "int64", "float16", "int8", "uint8"])
def test_binary_dtypes_match_ort(op_type, dtype):
    a, b = sample((3, 4), dtype, low=-20, high=20), sample((4,), dtype, seed=1, low=1, high=9)
    if np.dtype(dtype).kind == "u":
        a = sample((3, 4), dtype, low=0, high=200)
    if op_type in ("Add", "Sub", "Mul") and dtype in ("int8", "uint8"):
        a, b = a // 4, b // 2  # stay in range: no wrap-around
    assert_matches_ort(op_type, [a, b], opset=14, rtol=1e-3 if dtype == "float16" else 1e-6)


def test_integer_division_truncates_toward_zero_traced_and_folded():
    a = np.array([7, -7, 7, -7, 0, 9], np.int64)
    b = np.array([2, 2, -2, -2, 3, -4], np.int64)
    want = np.array([3, -3, -3, 3, 0, -2], np.int64)
    np.testing.assert_array_equal(assert_matches_ort("Div", [a, b], opset=14)[0], want)
    folded = one_node_model("Div", [a, b], opset=14, constant=("x0", "x1"))  # computed at load time, exactly
    np.testing.assert_array_equal(run_opforge(folded, [a, b], ("x0", "x1"))[0], want)


@pytest.mark.parametrize("base, exponent", [("float32", "float32"), ("float32", "int64"), ("float64", "float32"),
                                            ("int32", "int32"), ("int64", "float32"), ("float16", "float16")])
def test_pow_mixed_dtypes_match_ort(base, exponent):
    a = sample((3, 4), base, low=1, high=4)
    b = sample((4,), exponent, seed=1, low=-2, high=3)
    if np.dtype(base).kind == "i":
        b = np.abs(b)
    assert_matches_ort("Pow", [a, b], opset=15, rtol=2e-3 if base == "float16" else 1e-5)


def test_legacy_broadcast_with_axis():
    a, b = sample((2, 3, 4, 5)), sample((3, 4), seed=1)
    model = one_node_model("Mul", [a, b], {"broadcast": 1, "axis": 1}, opset=6)
    np.testing.assert_allclose(run_opforge(model, [a, b])[0], a * b[None, :, :, None], rtol=1e-6)
    c = sample((5,), seed=2)
    model = one_node_model("Add", [a, c], {"broadcast": 1}, opset=1)  # no axis: a's last dims
    np.testing.assert_allclose(run_opforge(model, [a, c])[0], a + c, rtol=1e-6)


def test_legacy_mismatched_shapes_without_broadcast_are_refused():
    model = one_node_model("Sub", [sample((2, 3)), sample((3,), seed=1)], opset=6)
    with pytest.raises(ox.ModelError, match="'broadcast' is 0"):
        ox.load(model)
    model = one_node_model("Sub", [sample((2, 3)), sample((3,), seed=1)], {"broadcast": 1, "axis": 2}, opset=6)
    with pytest.raises(ox.ModelError, match="axis"):
        ox.load(model)


def test_mixed_dtypes_are_a_model_error():
    model = one_node_model("Add", [sample((3,)), sample((3,), "float64")], opset=14)
    with pytest.raises(ox.ModelError, match="dtypes"):
        ox.load(model)


# -- variadic -------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["Sum", "Mean", "Max", "Min"])
@pytest.mark.parametrize("shapes", [[(3, 4)], [(3, 4), (3, 4)], [(2, 3, 4), (3, 1), (4,)], [(), (2, 3)]])
def test_variadic_matches_ort(op_type, shapes):
    inputs = [sample(s, seed=k) for k, s in enumerate(shapes)]
    assert_matches_ort(op_type, inputs, opset=13)


@pytest.mark.parametrize("op_type, dtype", [("Max", "int64"), ("Sum", "float64"), ("Max", "int32"),
                                            ("Min", "uint8"), ("Max", "float16"), ("Mean", "float16"),
                                            ("Min", "int8")])
def test_variadic_dtypes_match_ort(op_type, dtype):
    low = 0 if np.dtype(dtype).kind == "u" else -9
    inputs = [sample((3, 4), dtype, low=low, high=9), sample((4,), dtype, seed=1, low=low, high=9)]
    assert_matches_ort(op_type, inputs, opset=13, rtol=1e-3 if dtype == "float16" else 1e-6)


def test_sum_opset_6_and_folded():
    inputs = [sample((3, 4), seed=k) for k in range(3)]
    assert_matches_ort("Sum", inputs, opset=6)
    got = assert_matches_ort("Sum", inputs, opset=8, constant=("x1", "x2"))
    np.testing.assert_allclose(got[0], inputs[0] + inputs[1] + inputs[2], rtol=1e-6)


def test_a_sum_of_two_loads_as_an_add_that_fuses_with_the_relu_after_it():
    """ResNet's residual connections (Sum, then Relu): two inputs become add, which a planned graph fuses with the
    relu into one generated kernel; three stay a sum."""
    nodes = [helper.make_node("Sum", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Sum", ["r", "a", "b"], ["y"])]
    info = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 8]) for name in ("a", "b")]
    model = helper.make_model(helper.make_graph(nodes, "m", info, [helper.make_empty_tensor_value_info("y")]),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    graph = ox.load(model)
    assert [n.op.name for n in graph.nodes if not n.is_constant] == ["add", "relu", "sum"]
    a, b = sample((2, 8)), sample((2, 8), seed=1)
    np.testing.assert_allclose(graph(a, b), np.maximum(a + b, 0) + a + b, rtol=1e-6)
    (plan,) = graph._executor.plans.values()
    assert plan.memory_report()["fused"] == ["fused::add_relu"]


# -- unary ----------------------------------------------------------------------------------

UNARY = [("Relu", {}, 14), ("Exp", {}, 13), ("Tanh", {}, 13), ("Neg", {}, 13), ("Sigmoid", {}, 13),
         ("Erf", {}, 13), ("Sqrt", {}, 13), ("Log", {}, 13), ("Abs", {}, 13), ("Reciprocal", {}, 13),
         ("LeakyRelu", {}, 16), ("LeakyRelu", {"alpha": 0.3}, 16), ("HardSigmoid", {}, 6),
         ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 6), ("HardSwish", {}, 14), ("Elu", {"alpha": 0.7}, 6),
         ("Selu", {}, 6), ("Celu", {"alpha": 1.5}, 12), ("Softplus", {}, 1), ("Softsign", {}, 1),
         ("ThresholdedRelu", {"alpha": 0.5}, 10), ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
         ("Identity", {}, 16), ("Relu", {}, 6)]


@pytest.mark.parametrize("op_type, attrs, opset", UNARY)
@pytest.mark.parametrize("constant", [(), ("x0",)])
def test_unary_matches_ort(op_type, attrs, opset, constant):
    positive = op_type in ("Sqrt", "Log")
    x = sample((2, 3, 5), low=0.1 if positive else -4, high=4)
    if op_type == "Reciprocal":
        x = np.where(np.abs(x) < 0.1, 0.5, x).astype(np.float32)
    if op_type == "Softplus":
        x = x * 30  # large |x|: no overflow
    assert_matches_ort(op_type, [x], attrs, opset=opset, constant=constant)


@pytest.mark.parametrize("op_type", ["Relu", "Sqrt", "Sigmoid", "Abs", "Neg", "Exp", "Tanh"])
@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_unary_float_dtypes_match_ort(op_type, dtype):
    x = sample((4, 5), dtype, low=0.1 if op_type == "Sqrt" else -3)
    assert_matches_ort(op_type, [x], opset=13, rtol=2e-3 if dtype == "float16" else 1e-7)


@pytest.mark.parametrize("op_type, dtype", [("Relu", "int32"), ("Abs", "int64"), ("Abs", "int8"),
                                            ("Neg", "int32"), ("Relu", "int8")])
def test_unary_integers_match_ort(op_type, dtype):
    assert_matches_ort(op_type, [sample((4, 5), dtype, low=-50, high=50)], opset=14)


def test_prelu_matches_ort():
    x = sample((2, 3, 4, 5))
    assert_matches_ort("PRelu", [x, sample((3, 1, 1), seed=1)], opset=9, constant=("x1",))
    assert_matches_ort("PRelu", [x, sample((5,), seed=1)], opset=16)
    model = one_node_model("PRelu", [x, sample((3,), seed=1)], opset=6, constant=("x1",))  # one slope per channel
    want = np.where(x < 0, x * sample((3,), seed=1)[:, None, None], x)
    np.testing.assert_allclose(run_opforge(model, [x, sample((3,), seed=1)], ("x1",))[0], want, rtol=1e-6)


def test_unary_special_values_match_ort():
    x = np.array([-np.inf, -50, -1, -0.0, 0, 1, 50, np.inf, np.nan], np.float32)
    for op_type in ["Relu", "Sigmoid", "Tanh", "Erf", "HardSigmoid", "Exp", "Abs", "Softsign"]:
        assert_matches_ort(op_type, [x], opset=13 if op_type != "HardSigmoid" else 6)


# -- Clip -------------------------------------------------------------------------------------

def test_clip_attributes_before_opset_11():
    x = sample((3, 4), low=-5, high=5)
    assert_matches_ort("Clip", [x], {"min": -1.0, "max": 2.0}, opset=6)
    assert_matches_ort("Clip", [x], {"max": 2.0}, opset=6)
    assert_matches_ort("Clip", [x], {}, opset=6)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "int8", "uint8", "float16"])
@pytest.mark.parametrize("bounds", [(-1.5, 2.25), (None, 2.25), (-1.5, None), (None, None), (3.0, 1.0)])
def test_clip_inputs_match_ort(dtype, bounds):
    low = 0 if np.dtype(dtype).kind == "u" else -5
    x = sample((3, 4), dtype, low=low, high=5)
    kind = np.dtype(dtype).kind
    lo, hi = (None if b is None else np.asarray(b if kind == "f" else max(round(b), 0 if kind == "u" else -9), dtype)
              for b in bounds)
    inputs = [x, lo, hi]
    while inputs[-1] is None:
        inputs.pop()
    constant = tuple(f"x{k}" for k in (1, 2) if k < len(inputs) and inputs[k] is not None)
    assert_matches_ort("Clip", inputs, opset=13, constant=constant, rtol=1e-3 if dtype == "float16" else 0, atol=0)


def test_clip_float64_bounds_are_exact_and_runtime_bounds_work():
    x = np.array([0.1, 0.2, 0.3, 0.7], np.float64)
    lo, hi = np.asarray(0.2, np.float64), np.asarray(0.3000000001, np.float64)
    got = assert_matches_ort("Clip", [x, lo, hi], opset=13, constant=("x1", "x2"), rtol=0, atol=0)
    assert got[0].tolist() == [0.2, 0.2, 0.3, 0.3000000001]
    x32 = sample((3, 4), low=-5, high=5)
    got = assert_matches_ort("Clip", [x32, np.asarray(-1, np.float32), np.asarray(1, np.float32)], opset=13)
    assert got[0].min() == -1 and got[0].max() == 1


# -- comparisons, Where ---------------------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", ["float32", "int64", "int32", "float16", "uint8"])
def test_comparisons_match_ort(op_type, dtype):
    a, b = sample((3, 4), dtype, low=0, high=4), sample((4,), dtype, seed=1, low=0, high=4)
    got = assert_matches_ort(op_type, [a, b], opset=16)
    assert got[0].dtype == np.bool_


def test_equal_on_bool_matches_ort():
    assert_matches_ort("Equal", [sample((3, 4), bool), sample((4,), bool, seed=1)], opset=13)


@pytest.mark.parametrize("dtype", ["float32", "int64", "float16", "uint8", "bool"])
def test_where_matches_ort(dtype):
    condition = sample((3, 1, 4), bool)
    inputs = [condition, sample((2, 4), dtype, seed=1), sample((4,), dtype, seed=2)]
    if dtype != "bool":
        assert_matches_ort("Where", inputs, opset=16)
    else:  # (onnxruntime has no bool Where)
        got = run_opforge(one_node_model("Where", inputs, opset=16), inputs)[0]
        np.testing.assert_array_equal(got, np.where(*inputs))


def test_where_needs_a_bool_condition():
    model = one_node_model("Where", [sample((3,)), sample((3,)), sample((3,))], opset=16)
    with pytest.raises(ox.ModelError, match="bool"):
        ox.load(model)


# -- Identity, Dropout, Cast ----------------------------------------------------------------------

@pytest.mark.parametrize("opset", [7, 10, 12, 13])
def test_dropout_is_the_identity_with_a_mask_of_ones(opset):
    x = sample((2, 3))
    model = one_node_model("Dropout", [x], {"ratio": 0.3} if opset < 12 else {}, opset=opset, outputs=2)
    if opset >= 12:
        got = assert_matches_ort("Dropout", [x], {}, opset=opset, outputs=2)
    else:  # (onnxruntime's inference Dropout before opset 12 gives a mask of zeros; onnx's reference, ones)
        got = run_opforge(model, [x])
    np.testing.assert_array_equal(got[0], x)
    assert got[1].all() and got[1].dtype == (np.bool_ if opset >= 10 else np.float32)


def test_dropout_training_mode_constant_true_is_refused():
    x = sample((2, 3))
    ratio, training = np.asarray(0.5, np.float32), np.asarray(True)
    model = one_node_model("Dropout", [x, ratio, training], opset=13, constant=("x1", "x2"))
    with pytest.raises(ox.ModelError, match="training_mode"):
        ox.load(model)
    # ratio 0 in training mode drops nothing: allowed
    got = assert_matches_ort("Dropout", [x, np.asarray(0.0, np.float32), training], opset=13, constant=("x1", "x2"),
                             outputs=2)
    np.testing.assert_array_equal(got[0], x)


def test_dropout_mask_with_an_unknown_dim():
    node = helper.make_node("Dropout", ["x"], ["y", "mask"])
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_empty_tensor_value_info("y"), helper.make_empty_tensor_value_info("mask")])
    graph = ox.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    y, mask = graph(sample((5, 3)))
    assert mask.shape == (5, 3) and mask.dtype == np.bool_ and mask.all()


@pytest.mark.parametrize("source, to", [("float32", TensorProto.INT32), ("float32", TensorProto.DOUBLE),
                                        ("int64", TensorProto.FLOAT), ("float32", TensorProto.FLOAT16),
                                        ("float16", TensorProto.FLOAT), ("int32", TensorProto.BOOL),
                                        ("bool", TensorProto.FLOAT), ("float32", TensorProto.FLOAT),
                                        ("float64", TensorProto.UINT8)])
def test_cast_matches_ort(source, to):
    x = sample((3, 4), source, low=0 if to == TensorProto.UINT8 else -5, high=5)
    assert_matches_ort("Cast", [x], {"to": to}, opset=13)


def test_cast_to_unsupported_types_is_a_model_error():
    for to in (TensorProto.STRING, TensorProto.FLOAT8E4M3FN, TensorProto.COMPLEX64):
        model = one_node_model("Cast", [sample((3,))], {"to": to}, opset=19)
        with pytest.raises(ox.ModelError, match="attribute 'to'"):
            ox.load(model)


def test_cast_like_matches_ort():
    assert_matches_ort("CastLike", [sample((3, 4)), np.zeros((1,), np.int64)], opset=15)


# -- Softmax ----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -2])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_matches_ort(axis, opset):
    x = sample((2, 3, 4), low=-10, high=10)
    assert_matches_ort("Softmax", [x], {} if axis is None else {"axis": axis}, opset=opset)


def test_softmax_before_13_flattens_with_an_unknown_batch():
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 8
    g = ox.load(model)
    for n in (1, 5):
        x = sample((n, 3, 4), seed=n)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_allclose(g(x), want[0], rtol=1e-5, atol=1e-7)


def test_softmax_before_13_with_two_unknown_dims():
    node = helper.make_node("Softmax", ["x"], ["y"], axis=2)
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M", 3, 4])],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    g = ox.load(model)
    x = sample((2, 5, 3, 4), low=-10, high=10)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(g(x), want[0], rtol=1e-5, atol=1e-7)


def test_softmax_float64_and_float16():
    assert_matches_ort("Softmax", [sample((3, 5), "float64")], opset=13, rtol=1e-12)
    assert_matches_ort("Softmax", [sample((3, 5), "float16")], opset=13, rtol=2e-3, atol=1e-3)


# -- reductions -------------------------------------------------------------------------------

REDUCTIONS = ["ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum"]


@pytest.mark.parametrize("op_type", REDUCTIONS)
@pytest.mark.parametrize("axes", [None, [1], [0, -1], [-2]])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [11, 18])
def test_reductions_match_ort(op_type, axes, keepdims, opset):
    x = sample((2, 3, 4), low=0.1 if op_type == "ReduceLogSum" else -3)
    from_input = opset >= 18 or (op_type == "ReduceSum" and opset >= 13)
    if from_input:
        inputs = [x] if axes is None else [x, np.asarray(axes, np.int64)]
        assert_matches_ort(op_type, inputs, {"keepdims": keepdims}, opset=opset, constant=("x1",))
    else:
        attrs = {"keepdims": keepdims, **({} if axes is None else {"axes": axes})}
        assert_matches_ort(op_type, [x], attrs, opset=opset)


@pytest.mark.parametrize("op_type, opset", [("ReduceSum", 13), ("ReduceMean", 18)])
def test_noop_with_empty_axes(op_type, opset):
    x = sample((2, 3))
    got = assert_matches_ort(op_type, [x], {"noop_with_empty_axes": 1}, opset=opset)
    np.testing.assert_array_equal(got[0], x)
    assert_matches_ort(op_type, [x], {"noop_with_empty_axes": 0, "keepdims": 0}, opset=opset)


@pytest.mark.parametrize("dtype", ["int32", "int64", "float64", "float16"])
def test_reduce_dtypes_match_ort(dtype):
    x = sample((3, 4), dtype, low=-20, high=20)
    for op_type in ("ReduceSum", "ReduceMean"):
        assert_matches_ort(op_type, [x], {"axes": [1]}, opset=11, rtol=2e-3 if dtype == "float16" else 1e-6)


def test_reduction_axes_from_a_graph_input_run_per_call_and_must_be_in_range():
    x = sample((2, 3))
    model = one_node_model("ReduceSum", [x, np.asarray([1], np.int64)], opset=13)  # axes as a graph input
    g = ox.load(model)
    assert isinstance(g, ox.DynamicModel) and g.mode(x, np.asarray([1])) == "eager"
    np.testing.assert_allclose(g(x, np.asarray([1])), x.sum(axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(g(x, np.asarray([0])), x.sum(axis=0, keepdims=True), rtol=1e-6)
    model = one_node_model("ReduceMean", [x], {"axes": [2]}, opset=13)
    with pytest.raises(ox.ModelError, match="out of range"):
        ox.load(model)


def test_reduce_with_unknown_dims_runs_on_two_batch_sizes():
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_empty_tensor_value_info("y")])
    g = ox.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    for n in (2, 7):
        x = sample((n, 3), seed=n)
        np.testing.assert_allclose(g(x), x.mean(axis=1), rtol=1e-6)


def test_traced_graph_records_opforge_ops():
    model = one_node_model("Softmax", [sample((2, 3))], opset=13)
    graph = ox.load(model)
    assert [node.op.name for node in graph.nodes] == ["softmax"]
    model = one_node_model("Sum", [sample((2, 3)), sample((3,)), sample((2, 1))], opset=13)
    assert [node.op.name for node in ox.load(model).nodes] == ["sum"]
    assert opforge.lookup("sum") is not None


# -- composites, logic, uint64 --------------------------------------------------------------------

COMPOSITES = [("Mish", {}, 18), ("Shrink", {"lambd": 0.7, "bias": 0.2}, 9), ("Sign", {}, 13), ("IsNaN", {}, 13),
              ("IsInf", {}, 10), ("IsInf", {"detect_negative": 0}, 10), ("IsInf", {"detect_positive": 0}, 10),
              ("Elu", {}, 6), ("Softplus", {}, 1), ("HardSwish", {}, 14)]


@pytest.mark.parametrize("op_type, attrs, opset", COMPOSITES)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_composites_match_ort(op_type, attrs, opset, dtype):
    x = sample((3, 5), dtype, low=-4, high=4)
    x[0, :4] = [np.inf, -np.inf, np.nan, 0] if op_type in ("IsNaN", "IsInf", "Sign") else x[0, :4]
    if dtype == "float16" and op_type in ("Shrink", "IsInf", "Sign", "Elu", "Softplus"):  # (onnxruntime lacks them)
        got = run_opforge(one_node_model(op_type, [x], attrs, opset=opset), [x])[0]
        want = run_ort(one_node_model(op_type, [x.astype(np.float32)], attrs, opset=opset), [x.astype(np.float32)])[0]
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
    else:
        assert_matches_ort(op_type, [x], attrs, opset=opset, rtol=2e-3 if dtype == "float16" else 1e-5)


@pytest.mark.parametrize("op_type", ["And", "Or", "Xor"])
def test_logic_matches_ort(op_type):
    a, b = sample((3, 4), bool), sample((4,), bool, seed=1)
    assert_matches_ort(op_type, [a, b], opset=7)
    assert_matches_ort("Not", [a], opset=1)


def test_logic_refuses_non_bool():
    with pytest.raises(ox.ModelError, match="bool"):
        ox.load(one_node_model("And", [sample((3,)), sample((3,))], opset=7))


@pytest.mark.parametrize("op_type", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Max", "Min"])
def test_uint64_compares_across_the_sign_bit(op_type):
    a = np.array([0, 1, 2**63 - 1, 2**63, 2**64 - 1, 5, 2**63 + 7], np.uint64)
    b = np.array([1, 0, 2**63, 2**63 - 1, 2**64 - 2, 5, 2**63 + 7], np.uint64)
    got = assert_matches_ort(op_type, [a, b], opset=16 if op_type not in ("Max", "Min") else 13)
    want = {"Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
            "GreaterOrEqual": np.greater_equal, "Max": np.maximum, "Min": np.minimum}[op_type](a, b)
    np.testing.assert_array_equal(got[0], want)


# -- ReduceMax, ReduceMin, ReduceLogSumExp, LogSoftmax --------------------------------------------

@pytest.mark.parametrize("op_type", ["ReduceMax", "ReduceMin", "ReduceLogSumExp"])
@pytest.mark.parametrize("axes", [None, [0], [1], [-1, 0]])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("shape", [(5, 7), (4, 1, 3)])
def test_extremes_match_ort(op_type, axes, keepdims, shape):
    x = sample(shape, low=-50, high=50)
    attrs = {"keepdims": keepdims, **({} if axes is None else {"axes": axes})}
    assert_matches_ort(op_type, [x], attrs, opset=13)
    inputs = [x] if axes is None else [x, np.asarray(axes, np.int64)]
    assert_matches_ort(op_type, inputs, {"keepdims": keepdims}, opset=18, constant=("x1",))


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "float16", "float64"])
def test_extremes_dtypes_match_ort(dtype):
    x = sample((3, 6), dtype, low=0, high=100)
    for op_type in ("ReduceMax", "ReduceMin"):
        assert_matches_ort(op_type, [x], {"axes": [1]}, opset=13)


def test_extremes_of_nothing_and_with_an_unknown_reduced_dim():
    x = np.zeros((2, 0), np.float32)
    got = assert_matches_ort("ReduceMax", [x, np.asarray([1], np.int64)], {"keepdims": 1}, opset=18, constant=("x1",))
    assert (got[0] == -np.inf).all() and got[0].shape == (2, 1)
    node = helper.make_node("ReduceMax", ["x"], ["y"], axes=[0])
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_empty_tensor_value_info("y")])
    g = ox.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert isinstance(g, ox.DynamicModel) and "known when the model is loaded" in g.reason  # N = 0 matters
    np.testing.assert_array_equal(g(np.arange(6, dtype=np.float32).reshape(2, 3)), [[3, 4, 5]])
    assert (g(np.zeros((0, 3), np.float32)) == -np.inf).all()


def test_reduce_log_sum_exp_does_not_overflow():
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]], np.float32)
    got = assert_matches_ort("ReduceLogSumExp", [x], {"axes": [1], "keepdims": 0}, opset=13)
    np.testing.assert_allclose(got[0], [1000 + np.log(2), 0.0], rtol=1e-6)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("opset", [11, 13])
def test_log_softmax_matches_ort(axis, opset):
    x = sample((2, 3, 4), low=-200, high=200)
    assert_matches_ort("LogSoftmax", [x], {} if axis is None else {"axis": axis}, opset=opset, rtol=1e-5, atol=1e-4)


def test_cast_before_opset_6_names_the_type():
    node = helper.make_node("Cast", ["x0"], ["y0"])
    node.attribute.append(helper.make_attribute("to", "INT32"))
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [3])],
                              [helper.make_empty_tensor_value_info("y0")])
    g = ox.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 1)]))
    got = g(np.array([1.5, -2.7, 3.0], np.float32))
    assert got.dtype == np.int32 and got.tolist() == [1, -2, 3]
    graph.node[0].attribute[0].s = b"NOT_A_TYPE"
    with pytest.raises(ox.ModelError, match="NOT_A_TYPE"):
        ox.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 1)]))


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1}, {"axis": -1, "keepdims": 0}, {"axis": 1, "select_last_index": 1}])
@pytest.mark.parametrize("dtype", ["float32", "int32", "float16", "uint8"])
def test_arg_extremes_match_ort(op_type, attrs, dtype):
    x = sample((3, 7, 2), dtype, low=0, high=4)  # small integers: ties occur
    if dtype == "float16" or dtype == "uint8" and "select_last_index" in attrs:  # (onnxruntime lacks these)
        got = run_opforge(one_node_model(op_type, [x], attrs, opset=13), [x])[0]
        want = run_ort(one_node_model(op_type, [x.astype(np.float32)], attrs, opset=13), [x.astype(np.float32)])[0]
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)
    else:
        got = assert_matches_ort(op_type, [x], attrs, opset=13)
        assert got[0].dtype == np.int64


@pytest.mark.parametrize("shape, axes", [((5, 7), [1]), ((3, 4, 5), [0, 2]), ((6,), None), ((2, 1), [1])])
@pytest.mark.parametrize("dtype", ["float32", "int64", "float16"])
def test_reduce_prod_matches_ort(shape, axes, dtype):
    x = sample(shape, dtype, low=0.5, high=1.5) if dtype != "int64" else sample(shape, dtype, low=-2, high=2)
    attrs = {"keepdims": 0, **({} if axes is None else {"axes": axes})}
    if dtype == "float16":  # (onnxruntime lacks it)
        got = run_opforge(one_node_model("ReduceProd", [x], attrs, opset=13), [x])[0]
        np.testing.assert_allclose(got, np.prod(x.astype(np.float64), axis=None if axes is None else tuple(axes)),
                                   rtol=5e-3)
    else:
        assert_matches_ort("ReduceProd", [x], attrs, opset=13)


def test_reduce_max_and_min_of_bool():
    x = np.array([[True, False], [False, False]])
    for op_type, want in [("ReduceMax", [True, False]), ("ReduceMin", [False, False])]:
        got = run_opforge(one_node_model(op_type, [x, np.asarray([1], np.int64)], {"keepdims": 0}, opset=20,
                                         constant=("x1",)), [x], ("x1",))[0]
        assert got.dtype == np.bool_ and got.tolist() == want
    empty = np.zeros((2, 0), bool)
    model = one_node_model("ReduceMax", [empty, np.asarray([1], np.int64)], opset=20, constant=("x1",))
    assert run_opforge(model, [empty], ("x1",))[0].tolist() == [[False], [False]]


@pytest.mark.parametrize("op_type", ["Floor", "Ceil", "Round"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_rounding_matches_ort_and_numpy(op_type, dtype):
    with np.errstate(over="ignore"):  # (1e30 is inf in float16)
        x = np.concatenate([sample((20,), dtype, low=-6, high=6), np.arange(-3.5, 4, 0.5),
                            [0.49999997, -0.49999997, 2.0 ** 40 + 0.5, 1e30, -1e30, np.inf, -np.inf, np.nan]]).astype(dtype)
    got = run_opforge(one_node_model(op_type, [x], opset=13), [x])[0]
    want = {"Floor": np.floor, "Ceil": np.ceil, "Round": np.round}[op_type](x)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)
    if dtype != "float16":
        assert_matches_ort(op_type, [x], opset=13, rtol=0, atol=0)
    with pytest.raises(ox.ModelError, match="floating-point"):
        ox.load(one_node_model(op_type, [np.arange(3)], opset=13))


@pytest.mark.parametrize("attrs", [{}, {"axes": [1]}, {"axes": [0, 2]}])
def test_mean_variance_normalization_matches_ort(attrs):
    x = sample((2, 3, 4, 5), low=-4, high=9)
    assert_matches_ort("MeanVarianceNormalization", [x], attrs, opset=13, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype, fmod", [(d, f) for d in ["int8", "int16", "int32", "uint8", "uint32", "float16"]
                                         for f in (0, 1) if (d, f) != ("float16", 0)])  # (float16 % : below)
def test_mod_matches_ort(dtype, fmod):
    low = 0 if np.dtype(dtype).kind == "u" else -100
    a = sample((4, 6), dtype, low=low, high=100)
    b = sample((6,), dtype, seed=1, low=1, high=9)
    if np.dtype(dtype).kind != "u":
        b = b * np.where(np.arange(6) % 2, 1, -1).astype(dtype)  # mixed signs
    got = assert_matches_ort("Mod", [a, b], {"fmod": fmod}, opset=13, rtol=0, atol=0)
    want = np.fmod(a, b) if fmod else np.mod(a, b)
    np.testing.assert_array_equal(got[0], want)


def test_mod_float16_python_style():
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, 3.0, -3.0, np.inf, 2.0], np.float16)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, np.inf, np.inf, 2.0, 0.0], np.float16)
    got = run_opforge(one_node_model("Mod", [a, b], {"fmod": 0}, opset=13), [a, b])[0]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, np.mod(a, b))


def test_mod_of_wide_dtypes_folds_and_runs():
    a, b = np.array([7, -7, 2**62 + 3], np.int64), np.array([3, 3, -5], np.int64)
    model = one_node_model("Mod", [a, b], opset=13, constant=("x0", "x1"))
    np.testing.assert_array_equal(run_opforge(model, [a, b], ("x0", "x1"))[0], np.mod(a, b))
    x, y = sample((3,)), sample((3,), seed=1)
    got = ox.load(one_node_model("Mod", [x, y], {"fmod": 1}, opset=13))(x, y)
    np.testing.assert_allclose(got, np.fmod(x, y), rtol=1e-6)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("opset", [11, 13])
def test_hardmax_matches_ort(axis, opset):
    x = sample((3, 4, 5), low=0, high=3).round()  # ties: the first maximum wins
    assert_matches_ort("Hardmax", [x], {} if axis is None else {"axis": axis}, opset=opset, rtol=0, atol=0)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_lp_normalization_matches_ort(p, axis):
    x = sample((3, 4, 5), low=-3, high=3)
    x[0, 0, :] = 0  # a zero norm along the last axis gives zeros
    x[:, 0, 0] = 0
    assert_matches_ort("LpNormalization", [x], {"p": p, "axis": axis}, opset=13)


def test_binarizer_of_the_ml_domain():
    x = sample((3, 4), low=-2, high=2)
    node = helper.make_node("Binarizer", ["x0"], ["y0"], domain="ai.onnx.ml", threshold=0.5)
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [3, 4])],
                              [helper.make_empty_tensor_value_info("y0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    got = run_opforge(model, [x])[0]
    np.testing.assert_array_equal(got, (x > 0.5).astype(np.float32))
    np.testing.assert_array_equal(got, run_ort(model, [x])[0])


@pytest.mark.parametrize("op_type, with_bias", [("Gelu", False), ("BiasGelu", True), ("FastGelu", False),
                                                ("FastGelu", True)])
def test_onnxruntime_contrib_gelus(op_type, with_bias):
    x, bias = sample((2, 3, 8), low=-4, high=4), sample((8,), seed=1)
    inputs = [x, bias] if with_bias else [x]
    names = ["x0", "x1"] if with_bias else ["x0"]
    node = helper.make_node(op_type, names, ["y0"], domain="com.microsoft")
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape)
                                            for n, v in zip(names, inputs)], [helper.make_empty_tensor_value_info("y0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    got = run_opforge(model, inputs)[0]
    np.testing.assert_allclose(got, run_ort(model, inputs)[0], rtol=1e-4, atol=1e-5)
