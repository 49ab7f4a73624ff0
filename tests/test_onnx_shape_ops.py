"""ONNX shape and indexing ops (src/opforge/onnx/shape.py): one-node models run
by opforge and by onnxruntime must agree, for every opset behaviour the
converters distinguish."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import opforge
import opforge.onnx
import opforge.onnx.shape  # noqa: F401  (registers the converters under test)

rng = np.random.default_rng(0)


def model_of(op_type, inputs, constants=(), attrs=None, n_outputs=1, opset=13, dynamic=()):
    """A one-node model: ``inputs`` is a list of (name, array or None); names in ``constants`` become
    initializers, the rest graph inputs (their dims listed in ``dynamic`` unknown)."""
    graph_inputs, initializers, names = [], [], []
    for name, array in inputs:
        names.append(name if array is not None else "")
        if array is None:
            continue
        if name in constants:
            initializers.append(numpy_helper.from_array(array, name))
        else:
            dims = [None if k in dynamic else d for k, d in enumerate(array.shape)]
            elem = helper.np_dtype_to_tensor_dtype(array.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, dims))
    outputs = [f"y{k}" for k in range(n_outputs)]
    node = helper.make_node(op_type, names, outputs, **(attrs or {}))
    graph = helper.make_graph([node], "g", graph_inputs, [onnx.ValueInfoProto(name=o) for o in outputs],
                              initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(op_type, inputs, constants=(), attrs=None, n_outputs=1, opset=13, dynamic=(), exact=True):
    model = model_of(op_type, inputs, constants, attrs, n_outputs, opset, dynamic)
    feeds = {name: array for name, array in inputs if array is not None and name not in constants}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    graph = opforge.onnx.load(model)
    got = graph(*[feeds[name] for name in graph.input_names])
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        g = np.asarray(g)
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        if exact:
            np.testing.assert_array_equal(g, e)
        else:
            np.testing.assert_allclose(g, e, rtol=1e-6)
    return graph


def r(*shape, dtype=np.float32):
    return np.asarray(rng.standard_normal(shape) * 5).astype(dtype)


def i64(*values):
    return np.asarray(values, np.int64)


# -- Reshape / Flatten ----------------------------------------------------------------

@pytest.mark.parametrize("shape", [[4, -1], [0, 12], [2, 0, -1], [24], [-1], [1, 2, 3, 4]])
def test_reshape(shape):
    check("Reshape", [("x", r(2, 3, 4)), ("s", i64(*shape))], constants={"s"})


def test_reshape_allowzero():
    check("Reshape", [("x", r(0, 3)), ("s", i64(3, 0))], constants={"s"}, attrs={"allowzero": 1}, opset=14)


def test_reshape_opset1_attribute():
    check("Reshape", [("x", r(2, 6))], attrs={"shape": [3, 4]}, opset=1)


def test_reshape_unknown_batch():
    graph = check("Reshape", [("x", r(5, 3, 4)), ("s", i64(0, -1))], constants={"s"}, dynamic={0})
    np.testing.assert_array_equal(graph(np.ones((2, 3, 4), np.float32)), np.ones((2, 12), np.float32))


def test_reshape_to_a_shape_given_at_run_time_runs_node_by_node():
    graph = check("Reshape", [("x", r(2, 3)), ("s", i64(3, 2))])
    assert isinstance(graph, opforge.onnx.DynamicModel) and "known when the model is loaded" in graph.reason
    assert graph.mode(r(2, 3), i64(3, 2)) == "eager"
    np.testing.assert_array_equal(graph(np.arange(6.0, dtype=np.float32).reshape(2, 3), i64(6, 1)),
                                  np.arange(6.0, dtype=np.float32).reshape(6, 1))


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check("Flatten", [("x", r(2, 3, 4))], attrs={"axis": axis}, opset=13)


def test_flatten_unknown_batch():
    check("Flatten", [("x", r(2, 3, 4))], dynamic={0}, opset=11)


# -- Transpose / Concat / Squeeze / Unsqueeze ----------------------------------------

@pytest.mark.parametrize("perm", [None, [0, 2, 1, 3], [3, 1, 0, 2], [0, 1, 2, 3]])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.bool_])
def test_transpose(perm, dtype):
    attrs = {} if perm is None else {"perm": perm}
    check("Transpose", [("x", r(2, 3, 4, 5, dtype=dtype))], attrs=attrs)


def test_transpose_channel_shuffle():  # shufflenet's reshape / transpose / reshape
    check("Transpose", [("x", r(1, 4, 6, 7, 7))], attrs={"perm": [0, 2, 1, 3, 4]}, opset=9)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    check("Concat", [("a", r(2, 3, 4)), ("b", r(2, 3, 4)), ("c", r(2, 3, 4))], attrs={"axis": axis})


def test_concat_of_constants_folds():
    graph = check("Concat", [("a", i64(1, 2)), ("b", i64(3))], constants={"a", "b"}, attrs={"axis": 0})
    assert not [n for n in graph.nodes if getattr(n.op, "name", None) == "concat"]


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze(opset):
    x = r(1, 3, 1, 4)
    if opset < 13:
        check("Squeeze", [("x", x)], attrs={"axes": [0, -2]}, opset=opset)
        check("Unsqueeze", [("x", r(3, 4))], attrs={"axes": [0, -1]}, opset=opset)
    else:
        check("Squeeze", [("x", x), ("a", i64(0, -2))], constants={"a"}, opset=opset)
        check("Unsqueeze", [("x", r(3, 4)), ("a", i64(0, -1))], constants={"a"}, opset=opset)
    check("Squeeze", [("x", x)], opset=opset)  # no axes: every size-1 dim


def test_squeeze_without_axes_of_unknown_dims_converts_per_input_shape():
    graph = check("Squeeze", [("x", r(1, 3))], dynamic={0})
    assert isinstance(graph, opforge.onnx.DynamicModel) and "Squeeze without axes" in graph.reason
    assert graph(r(2, 3)).shape == (2, 3) and graph.mode(r(2, 3)) == "graph"
    assert graph.specialize(opforge.TensorSpec([1, 3], "float32")).outputs[0].spec.shape == (3,)


# -- Slice ------------------------------------------------------------------------------

SLICES = [  # starts, ends, axes, steps
    ([0, 1], [2, 3], None, None),
    ([1], [1000], [1], None),
    ([-1], [-2**63], [2], [-1]),
    ([10], [-10], [0], [-2]),
    ([0, 0, 3], [-1, 2**63 - 1, 0], [0, 1, 2], [1, 2, -1]),
    ([2], [1], [0], None),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    inputs = [("x", r(4, 5, 6)), ("s", i64(*starts)), ("e", i64(*ends)),
              ("a", None if axes is None else i64(*axes)), ("t", None if steps is None else i64(*steps))]
    check("Slice", inputs, constants={"s", "e", "a", "t"})


def test_slice_opset1():
    check("Slice", [("x", r(4, 5))], attrs={"starts": [1, -3], "ends": [3, 100], "axes": [0, 1]}, opset=9)


# -- Shape / ConstantOfShape / Constant ---------------------------------------------------

def test_shape_of_known_dims_folds():
    graph = check("Shape", [("x", r(2, 3, 4))])
    assert not [n for n in graph.nodes if getattr(n.op, "name", None) == "shape"]


@pytest.mark.parametrize("start,end", [(0, None), (1, None), (-1, None), (0, -1), (5, None), (-9, 2)])
def test_shape_start_end(start, end):
    attrs = {"start": start} if end is None else {"start": start, "end": end}
    check("Shape", [("x", r(2, 3, 4))], attrs=attrs, opset=15)
    check("Shape", [("x", r(2, 3, 4))], attrs=attrs, opset=15, dynamic={0})


def test_size():
    check("Size", [("x", r(2, 3, 4))])
    graph = check("Size", [("x", r(2, 3, 4))], dynamic={0, 2})
    np.testing.assert_array_equal(graph(np.ones((5, 3, 1), np.float32)), 15)


def test_shape_of_unknown_dims_runs():
    graph = check("Shape", [("x", r(2, 3))], dynamic={0, 1})
    np.testing.assert_array_equal(graph(np.ones((7, 5), np.float32)), [7, 5])


@pytest.mark.parametrize("value", [None, np.array([2.5], np.float32), np.array([7], np.int64),
                                   np.array([2**60 + 1], np.int64), np.array([True]), np.array([-1.25])])
def test_constant_of_shape(value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    check("ConstantOfShape", [("s", i64(2, 3))], constants={"s"}, attrs=attrs, opset=9)


def test_constant_of_shape_empty_and_scalar():
    check("ConstantOfShape", [("s", i64(2, 0))], constants={"s"}, opset=9)
    check("ConstantOfShape", [("s", np.zeros(0, np.int64))], constants={"s"}, opset=9)


def test_constant_converter_values():
    from opforge.onnx.registry import NodeContext, find_converter

    def run(**attrs):
        node = NodeContext(name="c", op_type="Constant", domain="", opset=13, attrs=attrs, input_names=[],
                           output_names=["y"])
        return find_converter("", "Constant", 13).call(node, [])

    assert run(value_float=1.5).dtype == np.float32
    np.testing.assert_array_equal(run(value_ints=[1, 2]), i64(1, 2))
    np.testing.assert_array_equal(run(value=np.arange(3.0)), np.arange(3.0))
    with pytest.raises(opforge.onnx.ModelError, match="exactly one value"):
        run(value_int=1, value_float=2.0)


# -- Gather / Tile / Expand / TopK / Split --------------------------------------------------

@pytest.mark.parametrize("axis,indices", [(0, [[0, -1], [2, 1]]), (1, [3, -4, 0]), (-1, 2), (2, [[4]])])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather(axis, indices, index_dtype):
    check("Gather", [("x", r(3, 4, 5)), ("i", np.asarray(indices, index_dtype))], attrs={"axis": axis})
    if np.ndim(indices):  # (a 0-d initializer reaches converters as 1-d: a loader matter)
        check("Gather", [("x", r(3, 4, 5)), ("i", np.asarray(indices, index_dtype))], constants={"i"},
              attrs={"axis": axis}, dynamic={0} if axis else {1})


def test_gather_index_out_of_range_is_a_model_error():
    with pytest.raises(opforge.onnx.ModelError, match="holds 5, out of range for axis 0 of size 3"):
        opforge.onnx.load(model_of("Gather", [("x", r(3, 4)), ("i", i64(1, 5))], constants={"i"}))


def test_gather_of_a_shape_folds():  # Shape -> Gather, as exporters write
    graph = check("Gather", [("x", i64(2, 3, 4)), ("i", i64(1, -1))], constants={"x", "i"})
    assert not [n for n in graph.nodes if getattr(n.op, "name", None) == "gather"]


@pytest.mark.parametrize("repeats", [[2, 3], [1, 1], [0, 2], [3, 1]])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_tile(repeats, dtype):
    check("Tile", [("x", r(2, 3, dtype=dtype)), ("r", i64(*repeats))], constants={"r"})


@pytest.mark.parametrize("x_shape,shape", [((3, 1), (2, 1, 6)), ((3, 4), (4,)), ((1,), (2, 3)), ((2, 1, 3), (1, 1)),
                                           ((2, 1, 3), (2, 4, 3)), ((), (3,))])
def test_expand(x_shape, shape):
    check("Expand", [("x", r(*x_shape)), ("s", i64(*shape))], constants={"s"})


@pytest.mark.parametrize("largest,axis", [(1, -1), (0, 1), (1, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_topk(largest, axis, dtype):
    x = rng.integers(-3, 4, (4, 5, 6)).astype(dtype)  # many ties: lower index first
    check("TopK", [("x", x), ("k", i64(3))], constants={"k"}, attrs={"axis": axis, "largest": largest},
          n_outputs=2, opset=11)


def test_topk_opset1_and_10():
    check("TopK", [("x", r(3, 7))], attrs={"k": 2}, n_outputs=2, opset=1)
    check("TopK", [("x", r(3, 7)), ("k", i64(7))], constants={"k"}, n_outputs=2, opset=10)


@pytest.mark.parametrize("opset", [11, 13])
def test_split(opset):
    x = r(4, 6)
    check("Split", [("x", x)], attrs={"axis": 1}, n_outputs=3, opset=opset)
    if opset < 13:
        check("Split", [("x", x)], attrs={"axis": 1, "split": [1, 2, 3]}, n_outputs=3, opset=opset)
    else:
        check("Split", [("x", x), ("s", i64(1, 0, 5))], constants={"s"}, attrs={"axis": -1}, n_outputs=3,
              opset=opset)


def test_split_opset18_num_outputs():
    check("Split", [("x", r(7, 2))], attrs={"num_outputs": 4}, n_outputs=4, opset=18)
    check("Split", [("x", r(6, 2))], attrs={"num_outputs": 3}, n_outputs=3, opset=18)


# -- shapes computed at run time -------------------------------------------------------------

def dynamic_view_model(opset, via="gather"):
    """x.view(x.size(0), -1) as exporters write it, for x of unknown batch size.  (The index is a
    1-element tensor squeezed to 0-d by a node: 0-d initializers are the loader's to keep 0-d.)"""
    nodes = [helper.make_node("Shape", ["x"], ["s"])]
    if via == "slice":
        nodes += [helper.make_node("Slice", ["s", "zero", "one"], ["n1"])]
    else:
        nodes += [helper.make_node("Gather", ["s", "zero"], ["n0"], axis=0)]
        if via == "gather":
            nodes[-1].output[0] = "n1"
        elif opset >= 13:
            nodes += [helper.make_node("Squeeze", ["n0", "zero"], ["n"]),
                      helper.make_node("Unsqueeze", ["n", "zero"], ["n1"])]
        else:
            nodes += [helper.make_node("Squeeze", ["n0"], ["n"], axes=[0]),
                      helper.make_node("Unsqueeze", ["n"], ["n1"], axes=[0])]
    nodes += [helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
              helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [numpy_helper.from_array(i64(0), "zero"), numpy_helper.from_array(i64(1), "one"),
             numpy_helper.from_array(i64(-1), "minus_one")]
    graph = helper.make_graph(nodes, "view", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 4])],
                              [onnx.ValueInfoProto(name="y")], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset,via", [(11, "gather"), (11, "squeeze"), (13, "squeeze"), (13, "slice")])
def test_reshape_to_a_shape_computed_at_run_time(opset, via):
    model = dynamic_view_model(opset, via)
    graph = opforge.onnx.load(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = r(batch, 3, 4)
        np.testing.assert_array_equal(graph(x), session.run(None, {"x": x})[0])
    assert [n.op.name for n in graph.nodes if getattr(n.op, "name", None) == "reshape"] == ["reshape"]


def test_reshape_to_sizes_of_another_input_converts_per_input_shapes():
    model = dynamic_view_model(13)
    model.graph.node[-1].input[0] = "other"
    model.graph.input.append(helper.make_tensor_value_info("other", onnx.TensorProto.FLOAT, ["M", 3, 4]))
    graph = opforge.onnx.load(model)
    assert isinstance(graph, opforge.onnx.DynamicModel) and "unknown when the model is loaded" in graph.reason
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, m in ((2, 4), (4, 2), (1, 1)):
        x, other = r(n, 3, 4), r(m, 3, 4)
        np.testing.assert_array_equal(graph(x, other), session.run(None, {"x": x, "other": other})[0])
    with pytest.raises(opforge.onnx.ModelError, match="cannot reshape"):
        graph(r(5, 3, 4), r(2, 3, 4))  # 24 elements into [5, -1]: ONNX refuses it too


def test_expand_to_a_shape_computed_at_run_time():
    # x [N, 1, 4] expanded to Concat(Shape(x)[0:1], [3, 4]): x's own unknown dim stays
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
             helper.make_node("Concat", ["n", "rest"], ["target"], axis=0),
             helper.make_node("Expand", ["x", "target"], ["y"])]
    inits = [numpy_helper.from_array(i64(0), "zero"), numpy_helper.from_array(i64(1), "one"),
             numpy_helper.from_array(i64(3, 4), "rest")]
    graph = helper.make_graph(nodes, "expand", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                             ["N", 1, 4])],
                              [onnx.ValueInfoProto(name="y")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    loaded = opforge.onnx.load(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = r(2, 1, 4)
    np.testing.assert_array_equal(loaded(x), session.run(None, {"x": x})[0])


def test_a_loaded_chain_differentiates():
    """Transpose -> Gather (a repeated index) -> Tile -> Expand -> TopK: values as onnxruntime's, and the
    gradient rules of each op agree with finite differences on the loaded graph."""
    from opforge.testing import gradcheck

    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Gather", ["t", "i"], ["g"], axis=2), helper.make_node("Tile", ["g", "rep"], ["tt"]),
             helper.make_node("Expand", ["tt", "shape"], ["e"]), helper.make_node("TopK", ["e", "k"], ["v", "ix"])]
    inits = [numpy_helper.from_array(i64(0, 2, 2), "i"), numpy_helper.from_array(i64(1, 2, 1), "rep"),
             numpy_helper.from_array(i64(2, 1, 1, 1), "shape"), numpy_helper.from_array(i64(2), "k")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [2, 3, 4])],
                              [onnx.ValueInfoProto(name="v")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    loaded = opforge.onnx.load(model)
    x = rng.standard_normal((2, 3, 4))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(loaded(x), session.run(None, {"x": x})[0])
    assert gradcheck(loaded, x) < 1e-6


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_nan_ranks_as_onnxruntime_ranks_it(largest):
    x = np.array([[1.0, np.nan, 3.0, np.nan, -1.0, 3.0]], np.float32)
    model = model_of("TopK", [("x", x), ("k", i64(4))], constants={"k"}, attrs={"largest": largest}, n_outputs=2,
                     opset=11)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want_values, want_indices = session.run(None, {"x": x})
    values, indices = opforge.onnx.load(model)(x)
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(values, want_values)
