"""If, Loop and Scan: subgraphs converted inline, against onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opforge
import opforge.onnx

rng = np.random.default_rng(7)
F = TensorProto.FLOAT


def info(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def make(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "cf", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model


def ort_run(model, *arrays):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, arrays)))


def branches():
    """then: x * 2; else: x - 1 (each reads x from the graph around it)."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [], [info("t")],
                             [numpy_helper.from_array(np.float32(2), "two")])
    other = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["e"])], "else", [], [info("e")],
                              [numpy_helper.from_array(np.float32(1), "one")])
    return then, other


def test_if_on_a_constant_condition_folds_to_its_branch():
    then, other = branches()
    model = make([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                 [info("x", F, ["N", 3])], [info("y")], [("c", np.array(False))])
    graph = opforge.onnx.load(model)
    assert isinstance(graph, opforge.Graph)
    assert [n.op.name for n in graph.nodes if not n.is_constant] == ["sub"]
    x = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(graph(x), ort_run(model, x)[0])


def test_if_on_a_condition_computed_from_a_shape_converts_per_input_shape():
    # y = x * 2 if x.shape[0] > 2 else x - 1, as an exporter writes a shape test
    then, other = branches()
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Greater", ["n", "two_i"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = make(nodes, [info("x", F, ["N", 3])], [info("y")],
                 [("zero", np.array(0, np.int64)), ("two_i", np.array(2, np.int64))])
    graph = opforge.onnx.load(model)
    assert isinstance(graph, opforge.onnx.DynamicModel)
    for n in (1, 2, 3, 5):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        assert graph.mode(x) == "graph"
        np.testing.assert_array_equal(graph(x), ort_run(model, x)[0])


def test_if_on_data_runs_node_by_node():
    then, other = branches()
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = make(nodes, [info("x", F, [2, 3])], [info("y")], [("zero", np.float32(0))])
    graph = opforge.onnx.load(model)
    x = np.abs(rng.standard_normal((2, 3))).astype(np.float32)
    assert isinstance(graph, opforge.onnx.DynamicModel) and graph.mode(x) == "eager"
    for sign in (1, -1):
        np.testing.assert_array_equal(graph(sign * x), ort_run(model, sign * x)[0])


def counting_loop(cond_from_data=False):
    """v <- v * 1.5 + i for M iterations (or while sum(v) < 100), scanning v each step."""
    body_nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F),
                  helper.make_node("Mul", ["v_in", "k"], ["scaled"]),
                  helper.make_node("Add", ["scaled", "fi"], ["v_out"]),
                  helper.make_node("Identity", ["v_out"], ["scan"])]
    if cond_from_data:
        body_nodes += [helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
                       helper.make_node("Less", ["s", "limit"], ["c_out"])]
    else:
        body_nodes += [helper.make_node("Identity", ["c_in"], ["c_out"])]
    body = helper.make_graph(body_nodes, "body",
                             [info("i", TensorProto.INT64, []), info("c_in", TensorProto.BOOL, []),
                              info("v_in", F, [3])],
                             [info("c_out", TensorProto.BOOL, []), info("v_out", F, [3]), info("scan", F, [3])],
                             [numpy_helper.from_array(np.float32(1.5), "k"),
                              numpy_helper.from_array(np.float32(100), "limit")])
    return body


def test_loop_with_a_known_trip_count_unrolls_into_the_graph():
    model = make([helper.make_node("Loop", ["m", "c", "v0"], ["v", "scanned"], body=counting_loop())],
                 [info("v0", F, [3])], [info("v"), info("scanned")],
                 [("m", np.array(5, np.int64)), ("c", np.array(True))])
    graph = opforge.onnx.load(model)
    assert isinstance(graph, opforge.Graph)
    v0 = rng.standard_normal(3).astype(np.float32)
    for ours, theirs in zip(graph(v0), ort_run(model, v0)):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_loop_while_a_condition_on_data_holds_runs_node_by_node():
    model = make([helper.make_node("Loop", ["", "c", "v0"], ["v", "scanned"], body=counting_loop(True))],
                 [info("v0", F, [3])], [info("v"), info("scanned")], [("c", np.array(True))])
    graph = opforge.onnx.load(model)
    assert isinstance(graph, opforge.onnx.DynamicModel)
    for start in (0.5, 3.0, 20.0):  # different iteration counts
        v0 = np.full(3, start, np.float32)
        ours, theirs = graph(v0), ort_run(model, v0)
        assert ours[1].shape == theirs[1].shape
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("reverse", [0, 1])
def test_scan_runs_a_cumulative_sum_over_a_dynamic_sequence(reverse):
    body = helper.make_graph([helper.make_node("Add", ["acc_in", "x_t"], ["acc_out"]),
                              helper.make_node("Identity", ["acc_out"], ["y_t"])], "body",
                             [info("acc_in", F, [2]), info("x_t", F, [2])],
                             [info("acc_out", F, [2]), info("y_t", F, [2])])
    node = helper.make_node("Scan", ["acc0", "xs"], ["acc", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[reverse], scan_output_axes=[1])
    model = make([node], [info("acc0", F, [2]), info("xs", F, ["T", 2])], [info("acc"), info("ys")])
    graph = opforge.onnx.load(model)
    assert isinstance(graph, opforge.onnx.DynamicModel)  # the sequence length is T's
    for steps in (1, 4, 7):
        acc0, xs = rng.standard_normal(2).astype(np.float32), rng.standard_normal((steps, 2)).astype(np.float32)
        for a, b in zip(graph(acc0, xs), ort_run(model, acc0, xs)):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_subgraph_reading_an_undefined_name_is_refused_when_loading():
    body = helper.make_graph([helper.make_node("Neg", ["nowhere"], ["t"])], "then", [], [info("t")])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)], "cf",
        [info("c", TensorProto.BOOL, [])], [info("y")]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(opforge.onnx.ModelError, match="attribute '(then|else)_branch'.*reads 'nowhere'"):
        opforge.onnx.load(model)


def test_an_unsupported_op_inside_a_subgraph_is_listed_when_loading():
    body = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["t"])], "then", [], [info("t")])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)], "cf",
        [info("x", F, [2]), info("c", TensorProto.BOOL, [])], [info("y")]),
        opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(opforge.onnx.UnsupportedOpError, match="NoSuchOp"):
        opforge.onnx.load(model)
