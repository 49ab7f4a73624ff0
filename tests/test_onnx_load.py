"""opforge.onnx.load: model structure, inputs, constants, opset selection and every error path.

The converters used here live in a private domain (``test.load``) so that
these tests do not depend on, or replace, the built-in ai.onnx converters.
"""
import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from onnx import TensorProto, helper

import opforge
import opforge.onnx as ox
from opforge.onnx.registry import converter

D = "test.load"


@converter("Relu", domain=D)
def _relu(node, x):
    return opforge.ops.relu(x)


@converter("Add", domain=D)
def _add(node, a, b):
    return opforge.ops.add(a, b)


@converter("Fill", domain=D)  # ConstantOfShape-like: a constant of the shape its input holds
def _fill(node, shape):
    shape = node.constant(shape, "shape")
    return np.full(tuple(int(d) for d in shape), node.attr("value", 0.0), np.float32)


@converter("ShapeOf", domain=D)
def _shape_of(node, x):
    return np.asarray(node.static_shape(x), np.int64)


@converter("Scale", domain=D, since=1)  # version 1 multiplies by 2, version 5 by 3
def _scale_v1(node, x):
    return opforge.ops.mul(x, np.float32(2))


@converter("Scale", domain=D, since=5)
def _scale_v5(node, x):
    return opforge.ops.mul(x, np.float32(3))


@converter("Split2", domain=D)  # two outputs; the second optional
def _split2(node, x, bias=None):
    first = opforge.ops.relu(x)
    if bias is not None:
        first = opforge.ops.add(first, bias)
    return first, (opforge.ops.neg(x) if node.num_outputs > 1 else None)


def value(name, elem=TensorProto.FLOAT, shape=("N", 3)):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, initializers=(), opset=1, extra_opsets=()):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(D, opset), *extra_opsets]
    return helper.make_model(graph, opset_imports=opsets)


def relu_add():
    return model([helper.make_node("Relu", ["x"], ["r"], domain=D), helper.make_node("Add", ["r", "c"], ["y"], domain=D)],
                 [value("x")], [value("y", shape=None)],
                 [helper.make_tensor("c", TensorProto.FLOAT, [3], [1, 2, 3])])


X = np.array([[-1, 2, 3], [4, -5, 6]], np.float32)
EXPECTED = np.maximum(X, 0) + np.array([1, 2, 3], np.float32)


def test_load_returns_a_graph_with_the_models_names():
    graph = ox.load(relu_add())
    assert isinstance(graph, opforge.Graph)
    assert graph.input_names == ["x"] and graph.output_names == ["y"]
    assert [v.name for v in graph.inputs] == ["x"] and graph.outputs[0].name == "y"
    assert "%r: " in repr(graph) and "%c: " in repr(graph)  # intermediate values and initializers keep names
    np.testing.assert_array_equal(graph(X), EXPECTED)


def test_dim_param_becomes_an_unknown_dim_and_runs_on_two_batch_sizes():
    graph = ox.load(relu_add())
    assert graph.inputs[0].spec.shape == (-1, 3)
    for batch in (1, 5):
        x = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3) - 4
        np.testing.assert_array_equal(graph(x), np.maximum(x, 0) + [1, 2, 3])


def test_missing_shape_is_unknown_rank():
    m = relu_add()
    m.graph.input[0].type.tensor_type.ClearField("shape")
    graph = ox.load(m)
    assert graph.inputs[0].spec.rank is None
    np.testing.assert_array_equal(graph(X), EXPECTED)


def test_the_three_input_kinds(tmp_path):
    m = relu_add()
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    for given in (m, str(path), path, m.SerializeToString()):
        np.testing.assert_array_equal(ox.load(given)(X), EXPECTED)


def test_not_a_model():
    with pytest.raises(ox.ModelError, match="ModelProto, a file path or the model's bytes"):
        ox.load(42)
    with pytest.raises(ox.ModelError, match="not a serialized ONNX model"):
        ox.load(b"\xff\xff not protobuf")
    with pytest.raises(ox.ModelError, match="no ONNX model file"):
        ox.load("/nonexistent/m.onnx")


def test_external_data_is_read(tmp_path):
    m = relu_add()
    m.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.array([1, 2, 3], np.float32), "c"))
    path = tmp_path / "ext.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    assert (tmp_path / "w.bin").exists()
    np.testing.assert_array_equal(ox.load(path)(X), EXPECTED)


def test_constant_subgraphs_fold_at_load_time():
    # ShapeOf(x) -> Fill -> Add(x, .) -> Add(., c): the shape is static, so Fill's result is a constant.
    nodes = [helper.make_node("ShapeOf", ["x"], ["s"], domain=D),
             helper.make_node("Fill", ["s"], ["f"], domain=D, value=2.5),
             helper.make_node("Add", ["f", "c"], ["fc"], domain=D),
             helper.make_node("Add", ["x", "fc"], ["y"], domain=D)]
    m = model(nodes, [value("x", shape=[2, 3])], [value("y", shape=None)],
              [helper.make_tensor("c", TensorProto.FLOAT, [3], [1, 2, 3])])
    graph = ox.load(m)
    ops = [n.op.name for n in graph.nodes if not n.is_constant]
    assert ops == ["add"]  # only the add that reads x remains
    np.testing.assert_allclose(graph(X), X + 2.5 + np.array([1, 2, 3], np.float32))


def test_constant_nodes_all_value_attributes():
    nodes = [helper.make_node("Constant", [], ["a"], value=helper.make_tensor("t", TensorProto.FLOAT, [3], [1, 2, 3])),
             helper.make_node("Constant", [], ["b"], value_float=0.5),
             helper.make_node("Constant", [], ["c"], value_floats=[1.0, 1.0, 1.0]),
             helper.make_node("Add", ["a", "b"], ["ab"], domain=D),
             helper.make_node("Add", ["ab", "c"], ["abc"], domain=D),
             helper.make_node("Add", ["x", "abc"], ["y"], domain=D),
             helper.make_node("Constant", [], ["i"], value_ints=[4, 5]),
             helper.make_node("Constant", [], ["j"], value_int=7)]
    m = model(nodes, [value("x")], [value("y", shape=None), value("i", TensorProto.INT64, None),
                                     value("j", TensorProto.INT64, None)])
    graph = ox.load(m)
    y, i, j = graph(X)
    np.testing.assert_allclose(y, X + np.array([2.5, 3.5, 4.5], np.float32))
    assert i.dtype == np.int64 and i.tolist() == [4, 5] and j.tolist() == 7
    assert graph.output_names == ["y", "i", "j"]


def test_sparse_constant():
    sparse = helper.make_sparse_tensor(helper.make_tensor("v", TensorProto.FLOAT, [2], [5, 7]),
                                       helper.make_tensor("idx", TensorProto.INT64, [2], [0, 2]), [3])
    nodes = [helper.make_node("Constant", [], ["s"], sparse_value=sparse),
             helper.make_node("Add", ["x", "s"], ["y"], domain=D)]
    graph = ox.load(model(nodes, [value("x")], [value("y", shape=None)]))
    np.testing.assert_array_equal(graph(X), X + np.array([5, 0, 7], np.float32))


def test_constants_bind_named_inputs():
    m = model([helper.make_node("Add", ["x", "k"], ["y"], domain=D)], [value("x"), value("k", shape=[3])],
              [value("y", shape=None)])
    graph = ox.load(m, constants={"k": np.array([1, 1, 1], np.float32)})
    assert graph.input_names == ["x"]
    np.testing.assert_array_equal(graph(X), X + 1)
    with pytest.raises(ox.ModelError, match=r"constants= names \['nope'\]"):
        ox.load(m, constants={"nope": np.zeros(3, np.float32)})
    with pytest.raises(ox.ModelError, match="constants\\['k'\\] is float64"):
        ox.load(m, constants={"k": np.zeros(3)})
    with pytest.raises(ox.ModelError, match="has shape \\[4\\]"):
        ox.load(m, constants={"k": np.zeros(4, np.float32)})
    with pytest.raises(ox.ModelError, match="constants= is a dict"):
        ox.load(m, constants=[1])


def test_initializers_listed_as_inputs_are_not_graph_inputs():
    m = relu_add()
    m.graph.input.append(value("c", shape=[3]))
    graph = ox.load(m)
    assert graph.input_names == ["x"]
    np.testing.assert_array_equal(graph(X), EXPECTED)
    # constants= overrides the initializer's value (the default an input-listed initializer gives).
    graph = ox.load(m, constants={"c": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(graph(X), np.maximum(X, 0))


def test_opset_selects_the_converter_version():
    for opset, factor in ((1, 2), (4, 2), (5, 3), (9, 3)):
        m = model([helper.make_node("Scale", ["x"], ["y"], domain=D)], [value("x")], [value("y", shape=None)],
                  opset=opset)
        np.testing.assert_array_equal(ox.load(m)(X), X * factor)


def test_optional_inputs_and_outputs():
    # An omitted trailing input is None; an empty name in the middle too; unused optional outputs may be None.
    one = model([helper.make_node("Split2", ["x"], ["y"], domain=D)], [value("x")], [value("y", shape=None)])
    np.testing.assert_array_equal(ox.load(one)(X), np.maximum(X, 0))
    two = model([helper.make_node("Split2", ["x", ""], ["y", "z"], domain=D)], [value("x")],
                [value("y", shape=None), value("z", shape=None)])
    y, z = ox.load(two)(X)
    np.testing.assert_array_equal(z, -X)
    skipped = model([helper.make_node("Split2", ["x"], ["", "z"], domain=D)], [value("x")], [value("z", shape=None)])
    np.testing.assert_array_equal(ox.load(skipped)(X), -X)


def test_unsupported_ops_are_listed_all_at_once():
    nodes = [helper.make_node("Frobnicate", ["x"], ["a"], domain=D),
             helper.make_node("Relu", ["a"], ["b"], domain=D),
             helper.make_node("Wibble", ["b"], ["c"]),
             helper.make_node("Frobnicate", ["c"], ["y"], domain=D)]
    m = model(nodes, [value("x")], [value("y", shape=None)], opset=3)
    with pytest.raises(ox.UnsupportedOpError) as info:
        ox.load(m)
    assert info.value.unsupported == [("ai.onnx", "Wibble", 17), (D, "Frobnicate", 3)]
    assert "Frobnicate" in str(info.value) and "Wibble" in str(info.value) and "2 op type" in str(info.value)
    assert isinstance(info.value, ox.ModelError)


def test_an_if_branch_missing_outputs_is_a_model_error_naming_it():
    body = helper.make_graph([], "body", [], [])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)],
              [value("c", TensorProto.BOOL, [])], [value("y", shape=None)])
    g = ox.load(m)  # the condition is a graph input: the branch is taken per call
    with pytest.raises(ox.ModelError, match=r"node '0' \(If\): its then_branch has 0 output\(s\)"):
        g(np.array(True))


def test_ops_with_subgraphs_and_no_converter_are_unsupported():
    body = helper.make_graph([], "body", [], [])
    m = model([helper.make_node("SequenceMap", ["c"], ["y"], body=body)],
              [value("c", TensorProto.BOOL, [])], [value("y", shape=None)])
    with pytest.raises(ox.UnsupportedOpError) as info:
        ox.load(m)
    assert info.value.unsupported == [("ai.onnx", "SequenceMap", 17)]


@pytest.mark.parametrize("elem, name", [(TensorProto.FLOAT16, "float16"), (TensorProto.DOUBLE, "float64"),
                                        (TensorProto.INT8, "int8"), (TensorProto.UINT64, "uint64"),
                                        (TensorProto.BOOL, "bool"), (TensorProto.INT64, "int64")])
def test_element_types_map_to_dtypes(elem, name):
    m = model([helper.make_node("Relu", ["x"], ["y"], domain=D)], [value("x", elem)], [value("y", elem, None)])
    assert ox.load(m).inputs[0].spec.dtype == name


def test_unsupported_element_types_name_the_input():
    for elem, text in ((TensorProto.STRING, "STRING"), (TensorProto.COMPLEX64, "COMPLEX64")):
        m = model([helper.make_node("Relu", ["x"], ["y"], domain=D)], [value("x", elem)], [value("y", shape=None)])
        with pytest.raises(ox.ModelError, match=f"graph input 'x' has ONNX element type {text}"):
            ox.load(m)
    m = relu_add()
    m.graph.initializer[0].CopyFrom(helper.make_tensor("c", TensorProto.STRING, [1], [b"a"]))
    with pytest.raises(ox.ModelError, match="initializer 'c' has ONNX element type STRING"):
        ox.load(m)


def test_non_tensor_inputs_are_refused():
    seq = helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, None)
    m = model([helper.make_node("Relu", ["x"], ["y"], domain=D)], [seq], [value("y", shape=None)])
    with pytest.raises(ox.ModelError, match="graph input 'x' is of ONNX type sequence_type"):
        ox.load(m)


def test_malformed_models():
    # A name used before it is defined.
    m = model([helper.make_node("Add", ["x", "later"], ["y"], domain=D),
               helper.make_node("Relu", ["x"], ["later"], domain=D)], [value("x")], [value("y", shape=None)])
    with pytest.raises(ox.ModelError, match="reads 'later', which no graph input, initializer or earlier node"):
        ox.load(m)
    # A domain the opset_import does not list.
    m = model([helper.make_node("Relu", ["x"], ["y"], domain="nowhere")], [value("x")], [value("y", shape=None)])
    with pytest.raises(ox.ModelError, match="domain 'nowhere', which the model's opset_import does not list"):
        ox.load(m)
    # A graph input without a name.
    m = relu_add()
    m.graph.input[0].name = ""
    with pytest.raises(ox.ModelError, match="graph input 0 has no name"):
        ox.load(m)
    # An output nothing defines.
    m = relu_add()
    m.graph.output[0].name = "ghost"
    with pytest.raises(ox.ModelError, match="graph output 'ghost' is not defined"):
        ox.load(m)
    # A value defined twice.
    m = model([helper.make_node("Relu", ["x"], ["y"], domain=D), helper.make_node("Relu", ["x"], ["y"], domain=D)],
              [value("x")], [value("y", shape=None)])
    with pytest.raises(ox.ModelError, match="defines 'y', which is already defined"):
        ox.load(m)
    # A Constant without a value.
    m = model([helper.make_node("Constant", [], ["y"])], [], [value("y", shape=None)])
    with pytest.raises(ox.ModelError, match="exactly one of value"):
        ox.load(m)


def test_standard_nodes_are_checked_against_their_onnx_schema():
    # What onnxruntime refuses: an attribute the op does not have, one of another type, an opset from the future.
    relu = model([helper.make_node("Relu", ["x"], ["y"], foo=2.0)], [value("x")], [value("y", shape=None)])
    with pytest.raises(ox.ModelError, match=r"node '0' \(Relu\) has attribute 'foo', which Relu of opset 14 does not"):
        ox.load(relu)
    pool = model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3.0, 3.0])],
                 [value("x", shape=(1, 1, 4, 4))], [value("y", shape=None)])
    with pytest.raises(ox.ModelError, match="attribute 'kernel_shape' is ONNX FLOATS; MaxPool takes INTS"):
        ox.load(pool)
    future = relu_add()
    future.opset_import[0].version = 99
    with pytest.raises(ox.ModelError, match="imports ONNX opset 99; the onnx package here knows opsets up to"):
        ox.load(future)


def test_more_inputs_than_the_converter_takes():
    m = model([helper.make_node("Relu", ["x", "x"], ["y"], domain=D)], [value("x")], [value("y", shape=None)])
    with pytest.raises(ox.ModelError, match=r"node '0' \(Relu\): the node has 2 inputs; Relu takes at most 1"):
        ox.load(m)


def test_errors_inside_converters_become_model_errors():
    # Fill needs its shape at load time; here it comes from a graph input: the model runs node by node,
    # and its own ModelErrors still name the model and the node.
    m = model([helper.make_node("Fill", ["s"], ["y"], domain=D)], [value("s", TensorProto.INT64, [2])],
              [value("y", shape=None)])
    g = ox.load(m)
    assert isinstance(g, ox.DynamicModel)
    assert "node '0' (Fill): shape must be known when the model is loaded" in g.reason
    np.testing.assert_array_equal(g(np.array([2, 3])), np.zeros((2, 3), np.float32))
    with pytest.raises(ox.ModelError, match=r"model 'm'.*node '0' \(Fill\).*cannot convert"):
        g(np.array([2, -3]))
    # Shapes that do not broadcast: the op's ShapeError, as a ModelError naming the node.
    m = model([helper.make_node("Add", ["x", "c"], ["y"], domain=D, name="the_add")], [value("x")],
              [value("y", shape=None)], [helper.make_tensor("c", TensorProto.FLOAT, [4], [1, 2, 3, 4])])
    with pytest.raises(ox.ModelError, match="the_add") as info:
        ox.load(m)
    assert isinstance(info.value.__cause__, opforge.ShapeError)


def test_a_node_missing_a_required_input_is_a_model_error():
    # Slice (opset 13) needs starts and ends; Reshape its shape.  Neither is there.
    for node in (helper.make_node("Slice", ["x"], ["y"], name="cut"), helper.make_node("Reshape", ["x"], ["y"],
                                                                                       name="cut")):
        graph = helper.make_graph([node], "g", [value("x")], [value("y", shape=None)])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        with pytest.raises(ox.ModelError, match=rf"cut.*{node.op_type}.*cannot convert it") as info:
            ox.load(m)
        assert "inputs ['x']" in str(info.value)


def test_importing_opforge_does_not_import_onnx():
    import subprocess
    import sys

    code = "import sys, opforge; assert 'onnx' not in sys.modules and 'opforge.onnx' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_standard_model_agrees_with_onnxruntime():
    import onnxruntime

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "c"], ["y"]),
             helper.make_node("Mul", ["y", "x"], ["z"])]
    m = helper.make_model(helper.make_graph(nodes, "std", [value("x")], [value("y"), value("z")],
                                            [helper.make_tensor("c", TensorProto.FLOAT, [3], [1, 2, 3])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": X})
    got = ox.load(m)(X)
    assert len(got) == 2
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-6)
