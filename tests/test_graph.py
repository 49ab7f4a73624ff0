"""Graphs: tracing, printing, the executor (plans, the native program, memory
planning), JSON, the passes (dead code, constant folding, layouts) and the
traced-value entry point.  Every result is compared with a NumPy computation."""
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opforge
from helpers import declare
from opforge import TensorSpec
from opforge.errors import ArityError, NoKernelError, OpforgeError, ShapeError
from opforge.graph import (Graph, Node, Value, eliminate_dead_code, fold_constants, plan_memory,
                           select_layouts)
from opforge.graph.ir import constant_node
from opforge.builtins.reorder import to_blocked

ops = opforge.ops


def rng(seed=0):
    return np.random.default_rng(seed)




def op_names(graph):
    return [node.op.name if not node.is_constant else "constant" for node in graph.nodes]


def normalized(graph):
    """The printed graph with value names replaced by their order of appearance."""
    names = {}
    return re.sub(r"%(\w+)", lambda m: "%" + str(names.setdefault(m.group(1), len(names))), repr(graph))


def only_plan(graph):
    plans = list(graph._executor.plans.values())
    assert len(plans) == 1
    return plans[0]


# -- tracing and printing -------------------------------------------------------

def test_trace_builds_a_graph_and_prints_ops_and_specs():
    graph = opforge.trace(lambda x: ops.relu(x), TensorSpec([None, 4]))
    assert isinstance(graph, Graph)
    assert op_names(graph) == ["relu"]
    text = repr(graph)
    assert "relu(" in text and "[?, 4]" in text and "float32" in text
    assert graph.nodes[0].outputs[0].spec == TensorSpec([-1, 4])


def test_unknown_dims_propagate_through_inference():
    w = np.ones((4, 3), np.float32)

    def fn(x):
        y = ops.matmul(x, w)
        return y, ops.reduce_sum(y, axes=[1]), ops.reduce_sum(y, axes=[1], keep_dims=True)

    graph = opforge.trace(fn, TensorSpec([-1, 4]))
    assert [v.spec.shape for v in graph.outputs] == [(-1, 3), (-1,), (-1, 1)]
    assert "[?, 3]" in repr(graph) and "[?, 1]" in repr(graph)


def test_unknown_rank_propagates_and_runs_on_any_rank():
    graph = opforge.trace(lambda x: ops.neg(ops.relu(x)), TensorSpec(None, "float64"))
    assert graph.outputs[0].spec.rank is None
    assert "unknown rank" in repr(graph)
    for shape in [(3,), (2, 3, 4), ()]:
        x = rng().standard_normal(shape)
        np.testing.assert_array_equal(graph(x), -np.maximum(x, 0))


def test_unknown_rank_meets_a_known_rank_in_matmul():
    w = np.arange(6, dtype=np.float64).reshape(3, 2)
    graph = opforge.trace(lambda x: ops.matmul(x, w), TensorSpec(None, "float64"))
    assert graph.outputs[0].spec.shape == (-1, 2)
    x = rng().standard_normal((5, 3))
    np.testing.assert_allclose(graph(x), x @ w, rtol=1e-12)


def test_value_arithmetic_traces_builtin_ops():
    graph = opforge.trace(lambda a, b: (a + b, a - b, a * b, a @ b, -a),
                          TensorSpec([3, 3], "float64"), TensorSpec([3, 3], "float64"))
    assert op_names(graph) == ["add", "sub", "mul", "matmul", "neg"]
    a, b = rng(1).standard_normal((3, 3)), rng(2).standard_normal((3, 3))
    results = graph(a, b)
    assert isinstance(results, tuple) and len(results) == 5
    for got, want in zip(results, [a + b, a - b, a * b, a @ b, -a]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_numpy_arrays_become_constant_nodes_on_either_side():
    c = rng(3).standard_normal((2, 3)).astype(np.float32)
    w = rng(4).standard_normal((3, 2)).astype(np.float32)

    def fn(x):
        return c - x, x * c + c, w @ x  # ndarray on the left defers to the Value

    graph = opforge.trace(fn, TensorSpec([2, 3]))
    constants = [n for n in graph.nodes if n.is_constant]
    # c is used three times but becomes one constant node; w is the other.
    assert len(constants) == 2
    assert any(np.array_equal(n.value, c) for n in constants)
    assert any(np.array_equal(n.value, w) for n in constants)
    assert [n for n in op_names(graph) if n != "constant"] == ["sub", "mul", "add", "matmul"]
    sub = next(n for n in graph.nodes if not n.is_constant and n.op.name == "sub")
    assert sub.inputs[0].producer.is_constant and sub.inputs[1] is graph.inputs[0]
    x = rng(5).standard_normal((2, 3)).astype(np.float32)
    d, e, f = graph(x)
    np.testing.assert_array_equal(d, c - x)
    np.testing.assert_allclose(e, x * c + c, rtol=1e-6)
    np.testing.assert_allclose(f, w @ x, rtol=1e-5, atol=1e-6)


def test_constants_are_copied_at_trace_time():
    c = np.ones(3)
    graph = opforge.trace(lambda x: x + c, TensorSpec([3], "float64"))
    c[:] = 100.0
    np.testing.assert_array_equal(graph(np.zeros(3)), np.ones(3))


def test_calling_an_op_on_a_traced_value_outside_trace_raises():
    captured = []
    opforge.trace(lambda x: captured.append(x) or ops.relu(x), TensorSpec([2]))
    value = captured[0]
    assert isinstance(value, Value)
    relu = opforge.lookup("relu")
    for call in (lambda: ops.relu(value), lambda: relu(value), lambda: value + 1.0, lambda: -value,
                 lambda: ops.reduce_sum(value, axes=[0])):
        with pytest.raises(OpforgeError, match="outside of opforge.trace"):
            call()


# -- the executor -----------------------------------------------------------------

def test_graph_matches_eager_and_numpy():
    w = rng(6).standard_normal((4, 3)).astype(np.float32)
    b = rng(7).standard_normal(3).astype(np.float32)

    def fn(x):
        return ops.softmax(ops.tanh(ops.add(ops.matmul(x, w), b)), axis=-1)

    graph = opforge.trace(fn, TensorSpec([-1, 4]))
    x = rng(8).standard_normal((5, 4)).astype(np.float32)
    got = graph(x)
    np.testing.assert_array_equal(got, fn(x))  # the same kernels run eagerly
    t = np.tanh(x @ w + b)
    want = np.exp(t) / np.exp(t).sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got.dtype == np.float32 and got.shape == (5, 3)


def test_new_batch_size_makes_a_new_plan_and_known_shapes_reuse_theirs():
    w = rng(9).standard_normal((4, 3)).astype(np.float32)
    graph = opforge.trace(lambda x: ops.relu(ops.matmul(x, w)), TensorSpec([-1, 4]))
    x5 = rng(10).standard_normal((5, 4)).astype(np.float32)
    x7 = rng(11).standard_normal((7, 4)).astype(np.float32)
    np.testing.assert_allclose(graph(x5), np.maximum(x5 @ w, 0), rtol=1e-5, atol=1e-6)
    assert len(graph._executor.plans) == 1
    np.testing.assert_allclose(graph(x7), np.maximum(x7 @ w, 0), rtol=1e-5, atol=1e-6)
    assert len(graph._executor.plans) == 2
    np.testing.assert_allclose(graph(x5 * 2), np.maximum((x5 * 2) @ w, 0), rtol=1e-5, atol=1e-6)
    assert len(graph._executor.plans) == 2


def test_results_of_earlier_calls_are_not_overwritten():
    graph = opforge.trace(lambda x: ops.relu(ops.neg(x)), TensorSpec([4], "float64"))
    x1, x2 = np.array([1.0, -2.0, 3.0, -4.0]), np.array([-5.0, 6.0, -7.0, 8.0])
    y1 = graph(x1)
    y2 = graph(x2)
    np.testing.assert_array_equal(y1, [0.0, 2.0, 0.0, 4.0])
    np.testing.assert_array_equal(y2, [5.0, 0.0, 7.0, 0.0])


def test_wrong_arity_and_wrong_static_dim_are_rejected():
    graph = opforge.trace(lambda x: ops.relu(x), TensorSpec([-1, 4]))
    x = np.ones((2, 4), np.float32)
    with pytest.raises(ArityError):
        graph(x, x)
    with pytest.raises(ArityError):
        graph()
    with pytest.raises(ShapeError):
        graph(np.ones((2, 5), np.float32))
    with pytest.raises(ShapeError):
        graph(np.ones((2, 4, 1), np.float32))


# -- JSON -------------------------------------------------------------------------

def two_output_graph():
    w = rng(12).standard_normal((4, 3))

    def fn(x):
        h = ops.relu(ops.matmul(x, w))
        return h, ops.reduce_sum(h, axes=[0], keep_dims=True)

    return opforge.trace(fn, TensorSpec([-1, 4], "float64")), w


def test_json_round_trip_gives_equal_results_and_structure(tmp_path):
    graph, w = two_output_graph()
    x = rng(13).standard_normal((6, 4))
    expected = np.maximum(x @ w, 0)
    before = graph(x)
    loaded = Graph.from_json(graph.to_json())
    path = tmp_path / "g.json"
    graph.save(path)
    reloaded = Graph.load(path)
    for copy in (loaded, reloaded):
        assert normalized(copy) == normalized(graph)
        after = copy(x)
        assert isinstance(after, tuple) and len(after) == 2
        np.testing.assert_allclose(after[0], expected, rtol=1e-12)
        np.testing.assert_allclose(after[1], expected.sum(0, keepdims=True), rtol=1e-12)
        for got, want in zip(after, before):
            np.testing.assert_array_equal(got, want)
    # -1 dims survive: the loaded graph still takes any batch.
    x3 = rng(14).standard_normal((3, 4))
    np.testing.assert_allclose(loaded(x3)[0], np.maximum(x3 @ w, 0), rtol=1e-12)


def test_json_round_trip_keeps_a_single_output_an_array():
    graph = opforge.trace(lambda x: ops.relu(x), TensorSpec([3], "float64"))
    x = np.array([-1.0, 0.5, 2.0])
    assert isinstance(graph(x), np.ndarray)
    loaded = Graph.from_json(graph.to_json())
    result = loaded(x)
    assert isinstance(result, np.ndarray)
    np.testing.assert_array_equal(result, np.maximum(x, 0))


def test_saving_a_graph_with_an_unregistered_op_raises(tmp_path):
    raw = opforge.Op("tgraph_unregistered_twice", ["x"], ["y"])
    raw.def_infer(opforge.infer.same_as(0))
    raw.kernel(lambda x: x * 2)
    graph = opforge.trace(lambda x: raw(x), TensorSpec([3], "float64"))
    np.testing.assert_array_equal(graph(np.arange(3.0)), [0.0, 2.0, 4.0])
    with pytest.raises(OpforgeError, match="tgraph_unregistered_twice"):
        graph.to_json()
    with pytest.raises(OpforgeError):
        graph.save(tmp_path / "raw.json")

    custom = opforge.Custom(lambda x: x + 1, lambda s: s, lambda d: d, "pyfunc")
    graph = opforge.trace(lambda x: custom(x), TensorSpec([3], "float64"))
    np.testing.assert_array_equal(graph(np.zeros(3)), np.ones(3))
    with pytest.raises(OpforgeError):
        graph.to_json()


def test_a_failed_save_leaves_the_existing_file_alone(tmp_path):
    path = tmp_path / "model.json"
    good = opforge.trace(lambda x: ops.relu(x), TensorSpec([3], "float64"))
    good.save(path)
    saved = path.read_text()
    raw = opforge.Op("tgraph_unregistered_save", ["x"], ["y"])
    raw.def_infer(opforge.infer.same_as(0))
    raw.kernel(lambda x: x)
    bad = opforge.trace(lambda x: raw(x), TensorSpec([3], "float64"))
    with pytest.raises(OpforgeError):
        bad.save(path)
    assert path.read_text() == saved


def test_loading_json_with_an_unknown_op_raises():
    graph = opforge.trace(lambda x: ops.relu(x), TensorSpec([3], "float64"))
    text = graph.to_json().replace('"op": "relu"', '"op": "tgraph_no_such_op"')
    assert "tgraph_no_such_op" in text
    with pytest.raises(OpforgeError, match="tgraph_no_such_op"):
        Graph.from_json(text)


# -- dead code and constant folding -------------------------------------------------

def dead_code_fn(x):
    unused = ops.tanh(ops.exp(x))  # noqa: F841 - dead on purpose
    kept = ops.neg(x)
    ops.reduce_sum(kept)  # dead too
    return ops.mul(kept, x)


def test_dead_code_elimination_removes_unused_nodes_and_keeps_results():
    graph = opforge.trace(dead_code_fn, TensorSpec([2, 3], "float64"), optimize=False)
    assert op_names(graph) == ["exp", "tanh", "neg", "reduce_sum", "mul"]
    x = rng(15).standard_normal((2, 3))
    before = graph(x)
    assert eliminate_dead_code(graph) == 3
    assert op_names(graph) == ["neg", "mul"]
    np.testing.assert_array_equal(graph(x), before)
    np.testing.assert_allclose(graph(x), -x * x, rtol=1e-12)
    assert eliminate_dead_code(graph) == 0
    # trace optimizes by default.
    assert op_names(opforge.trace(dead_code_fn, TensorSpec([2, 3], "float64"))) == ["neg", "mul"]


def test_dead_code_elimination_keeps_ops_with_side_effects(fresh):
    calls = []
    log = declare(fresh, "tgraph::log(Tensor x) -> Tensor y")  # no no_side_effect trait
    log.def_infer(opforge.infer.same_as(0))

    @log.kernel
    def _(x):
        calls.append(x.copy())
        return x

    graph = opforge.trace(lambda x: (log(x), ops.neg(x))[1], TensorSpec([2], "float64"), optimize=False)
    assert eliminate_dead_code(graph) == 0
    assert "tgraph::log" in op_names(graph)
    np.testing.assert_array_equal(graph(np.array([1.0, 2.0])), [-1.0, -2.0])
    assert len(calls) == 1


def test_fold_constants_folds_a_constant_subgraph_into_one_constant():
    c = np.arange(6, dtype=np.float64).reshape(2, 3)
    const = constant_node(c)
    negated = Node(opforge.lookup("neg"), [const.outputs[0]], {}, [TensorSpec([2, 3], "float64")])
    exped = Node(opforge.lookup("exp"), [negated.outputs[0]], {}, [TensorSpec([2, 3], "float64")])
    summed = Node(opforge.lookup("reduce_sum"), [exped.outputs[0]], {"axes": (1,), "keep_dims": True},
                  [TensorSpec([2, 1], "float64")])
    x = Value(TensorSpec([2, 3], "float64"), name="x")
    out = Node(opforge.lookup("add"), [x, summed.outputs[0]], {}, [TensorSpec([2, 3], "float64")])
    graph = Graph([x], [const, negated, exped, summed, out], [out.outputs[0]])
    graph.tuple_output = False
    xs = rng(16).standard_normal((2, 3))
    want = xs + np.exp(-c).sum(1, keepdims=True)
    np.testing.assert_allclose(graph(xs), want, rtol=1e-12)

    assert fold_constants(graph) == 3
    assert op_names(graph) == ["constant", "add"]
    np.testing.assert_allclose(graph.nodes[0].value, np.exp(-c).sum(1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(graph(xs), want, rtol=1e-12)
    assert fold_constants(graph) == 0


def test_fold_constants_on_a_graph_output():
    c = np.array([1.0, -2.0, 3.0])
    const = constant_node(c)
    negated = Node(opforge.lookup("neg"), [const.outputs[0]], {}, [TensorSpec([3], "float64")])
    x = Value(TensorSpec([3], "float64"), name="x")
    relu = Node(opforge.lookup("relu"), [x], {}, [TensorSpec([3], "float64")])
    graph = Graph([x], [const, negated, relu], [relu.outputs[0], negated.outputs[0]])
    assert fold_constants(graph) == 1
    assert op_names(graph) == ["constant", "relu"]
    a, b = graph(np.array([-1.0, 1.0, 2.0]))
    np.testing.assert_array_equal(a, [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(b, -c)


# -- memory planning --------------------------------------------------------------

def overlaps(first, second):
    return not (first[1] < second[0] or second[1] < first[0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 30), st.integers(0, 10)), min_size=0, max_size=25))
def test_plan_memory_never_overlaps_live_buffers(buffers):
    sizes = [size for size, _, _ in buffers]
    lifetimes = [(start, start + length) for _, start, length in buffers]
    offsets, arena = plan_memory(sizes, lifetimes)
    assert len(offsets) == len(sizes)
    for k in range(len(sizes)):
        assert offsets[k] >= 0 and offsets[k] + sizes[k] <= arena
        for j in range(k):
            if overlaps(lifetimes[k], lifetimes[j]) and sizes[k] and sizes[j]:
                disjoint = offsets[k] + sizes[k] <= offsets[j] or offsets[j] + sizes[j] <= offsets[k]
                assert disjoint, (k, j, sizes, lifetimes, offsets)
    assert arena <= sum(-(-s // 64) * 64 for s in sizes)


def test_plan_memory_reuses_space_of_dead_buffers():
    sizes = [1000, 1000, 1000, 1000]
    chain = [(0, 1), (1, 2), (2, 3), (3, 4)]  # each buffer lives while the next is written
    offsets, arena = plan_memory(sizes, chain)
    assert arena <= 2 * 1024 < sum(sizes)
    for k in range(3):
        assert offsets[k] != offsets[k + 1]
    assert offsets[0] == offsets[2] or offsets[1] == offsets[3]
    offsets, arena = plan_memory([100, 200, 300], [(0, 0), (1, 1), (2, 2)])
    assert arena == 320 and offsets == [0, 0, 0]


def test_mlp_chain_plans_less_than_half_the_memory_and_matches_eager():
    width, batch, layers = 64, 32, 20
    g = rng(17)
    weights = [(g.standard_normal((width, width)) * np.sqrt(2.0 / width)).astype(np.float32)
               for _ in range(layers)]

    def mlp(x):
        for w in weights:
            x = ops.relu(ops.matmul(x, w))
        return x

    graph = opforge.trace(mlp, TensorSpec([-1, width]))
    assert op_names(graph).count("matmul") == layers and op_names(graph).count("relu") == layers
    x = g.standard_normal((batch, width)).astype(np.float32)
    got = graph(x)
    plan = only_plan(graph)
    assert plan.program is not None
    report = plan.memory_report()
    assert report["unplanned_bytes"] >= (2 * layers - 1) * batch * width * 4
    assert report["planned_bytes"] <= 0.5 * report["unplanned_bytes"]
    np.testing.assert_array_equal(got, mlp(x))  # eager, op by op
    want = x.astype(np.float64)
    for w in weights:
        want = np.maximum(want @ w, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert np.abs(want).max() > 0.1  # the chain did not die out


def test_reshapes_inside_a_planned_graph_share_their_input_memory_and_run_no_kernel():
    """reshape / squeeze / unsqueeze (the view trait) between kernels take their input's memory; one that is a
    graph output is still a new array, as is a graph input passed through a reshape; checked mode runs them."""
    def channel_shuffle(x, w):
        y = ops.relu(ops.reshape(x, shape=[2, 3, 4]))  # of a graph input
        y = ops.transpose(ops.reshape(y, shape=[2, 3, 2, 2]), perm=[0, 2, 1, 3])
        z = ops.squeeze(ops.unsqueeze(ops.reshape(y, shape=[2, 12]), axes=[0]), axes=[0])  # views of views
        return ops.matmul(z, w), ops.reshape(z, shape=[24])  # the second: a graph output

    graph = opforge.trace(channel_shuffle, TensorSpec([6, 4]), TensorSpec([12, 5]))
    x = rng(21).standard_normal((6, 4)).astype(np.float32)
    w = rng(22).standard_normal((12, 5)).astype(np.float32)
    want = np.maximum(x.reshape(2, 3, 4), 0).reshape(2, 3, 2, 2).transpose(0, 2, 1, 3).reshape(2, 12)
    product, flat = graph(x, w)
    plan = only_plan(graph)
    assert plan.program is not None and plan.memory_report()["views"] == 5  # all but the graph output
    np.testing.assert_allclose(product, want @ w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(flat, want.reshape(24))
    again, _ = graph(x, w)
    assert not np.shares_memory(again, product) and not np.shares_memory(flat, x)
    np.testing.assert_array_equal(again, product)
    opforge.set_checks(True)
    try:
        checked, checked_flat = graph(x, w)
    finally:
        opforge.set_checks(False)
    np.testing.assert_array_equal(checked, product)
    np.testing.assert_array_equal(checked_flat, flat)


def test_concat_parts_are_made_in_place_in_its_output():
    """A concat along an axis with only size-1 dims before it (channels at batch 1) runs no kernel: its parts are
    made where it would copy them, nested concats included, and other readers of a part still see it; a part
    that is a graph input, used twice, or cut by a batch dim is copied as before."""
    w = rng(23).standard_normal((1, 4, 4)).astype(np.float32)

    def blocks(x, y):
        a, b = ops.relu(x), ops.neg(x)
        inner = ops.concat(a, b, axis=1)  # [1, 8, 4]
        outer = ops.concat(inner, ops.matmul(b, w), axis=1)  # [1, 12, 4], inner nested in it
        late = ops.sum(a, ops.abs(b))  # reads the parts after both concats were made
        copied = ops.concat(x, a, axis=1)  # x is a graph input: a copy
        twice = ops.concat(b, b, axis=1)  # b twice: a copy
        batch = ops.concat(ops.relu(y), ops.neg(y), axis=1)  # batch 2 before the axis: a copy
        return ops.tanh(outer), late, copied, twice, batch

    graph = opforge.trace(blocks, TensorSpec([1, 4, 4]), TensorSpec([2, 3, 4]))
    x = rng(24).standard_normal((1, 4, 4)).astype(np.float32)
    y = rng(25).standard_normal((2, 3, 4)).astype(np.float32)
    got = graph(x, y)
    plan = only_plan(graph)
    assert plan.program is not None and plan.memory_report()["in_place"] == 4  # a, b, inner, matmul(b, w)
    a, b = np.maximum(x, 0), -x
    want = (np.tanh(np.concatenate([a, b, b @ w], axis=1)), a + np.abs(b), np.concatenate([x, a], axis=1),
            np.concatenate([b, b], axis=1), np.concatenate([np.maximum(y, 0), -y], axis=1))
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(graph(x, y)[0], got[0])  # the second run of the plan


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_of_concats_and_views_match_their_ops_called_one_by_one(seed):
    """Random graphs of relu / neg / reshape / concat on [1, 2, n] values -- concats along axis 1 (made in
    place, nested, parts reused and read after them) and along axis 2 (copied) -- planned as one program give
    the same arrays as the same ops called eagerly."""
    def build(x, choices):
        values = [ops.relu(x), ops.neg(x)]  # (a graph input is never made in place)
        for _ in range(14):
            pick = values[int(choices.integers(len(values)))]
            kind = int(choices.integers(6))
            if kind in (0, 5):
                values.append(ops.relu(pick))
            elif kind == 1:
                values.append(ops.neg(pick))
            elif kind == 2:
                values.append(ops.reshape(ops.reshape(pick, shape=[-1]), shape=[1, 2, -1]))
            else:
                width = [v for v in values if v.shape[2] == pick.shape[2]] if kind == 3 else values
                count = min(len(width), int(choices.integers(2, 4)))
                parts = [width[int(k)] for k in choices.choice(len(width), size=count, replace=False)]
                if kind == 3:  # channels at batch 1: in place (unless a part is in place in another concat)
                    values.append(ops.reshape(ops.concat(*parts, axis=1), shape=[1, 2, -1]))
                else:  # a size-2 dim before the axis: copied
                    values.append(ops.concat(*parts, axis=2))
        return tuple(values[-3:]) + (ops.reshape(values[1], shape=[-1]),)

    x = rng(200 + seed).standard_normal((1, 2, 3)).astype(np.float32)
    graph = opforge.trace(lambda v: build(v, rng(100 + seed)), TensorSpec([1, 2, 3]))
    want = build(x, rng(100 + seed))  # the same choices, each op called eagerly
    got = graph(x)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert only_plan(graph).program is not None  # (about half of the seeds make parts in place, up to 7)


def test_a_concat_that_is_a_graph_output_gets_its_parts_made_in_the_output_array():
    graph = opforge.trace(lambda x: ops.concat(ops.relu(x), ops.neg(x), axis=0), TensorSpec([3, 2]))
    x = rng(26).standard_normal((3, 2)).astype(np.float32)
    first = graph(x)
    assert only_plan(graph).memory_report()["in_place"] == 2
    second = graph(x * 2)
    np.testing.assert_array_equal(first, np.concatenate([np.maximum(x, 0), -x]))
    np.testing.assert_array_equal(second, np.concatenate([np.maximum(2 * x, 0), -2 * x]))


# -- native program vs. interpreted -----------------------------------------------

def test_native_ops_compile_to_one_program():
    graph = opforge.trace(lambda x, y: ops.tanh(ops.add(ops.relu(x), y)), TensorSpec([3, 4]), TensorSpec([4]))
    x = rng(18).standard_normal((3, 4)).astype(np.float32)
    y = rng(19).standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(graph(x, y), np.tanh(np.maximum(x, 0) + y), rtol=1e-6, atol=1e-7)
    assert only_plan(graph).program is not None


def test_python_kernel_op_runs_interpreted(fresh):
    square = declare(fresh, "tgraph::square(Tensor x) -> Tensor y", traits=["no_side_effect"])
    square.def_infer(opforge.infer.same_as(0))

    @square.kernel
    def _(x):
        return x * x

    graph = opforge.trace(lambda x: ops.relu(square(ops.neg(x))) + x, TensorSpec([-1, 3], "float64"))
    x = rng(20).standard_normal((4, 3))
    np.testing.assert_allclose(graph(x), x * x + x, rtol=1e-12)
    plan = only_plan(graph)
    assert plan.program is None
    with pytest.raises(OpforgeError):
        plan.memory_report()


# -- layouts ----------------------------------------------------------------------

SHAPE = (2, 20, 3, 5)  # C = 20: not a multiple of 16, so blocked buffers are padded


def blocked_kernel_layouts(graph):
    return {node.op.name: node.kernel.layout for node in graph.nodes
            if not node.is_constant and node.op.name != "reorder"}


def test_prefer_nchw16c_inserts_reorders_and_keeps_results():
    def fn(x, y):
        return ops.relu(ops.add(ops.relu(x), y))

    x = rng(21).standard_normal(SHAPE).astype(np.float32)
    y = rng(22).standard_normal(SHAPE).astype(np.float32)
    graph = opforge.trace(fn, TensorSpec(SHAPE), TensorSpec(SHAPE))
    plain = graph(x, y)
    np.testing.assert_array_equal(plain, np.maximum(np.maximum(x, 0) + y, 0))
    inserted = select_layouts(graph, prefer="nchw16c")
    assert inserted == 3  # x and y in, the result out
    text = repr(graph)
    assert "nchw16c" in text and "reorder" in text
    assert op_names(graph).count("reorder") == 3
    assert blocked_kernel_layouts(graph) == {"relu": "nchw16c", "add": "nchw16c"}
    out = graph(x, y)
    assert out.shape == SHAPE and out.dtype == np.float32
    np.testing.assert_array_equal(out, plain)
    assert select_layouts(graph, prefer="nchw16c") == 0  # already decided
    np.testing.assert_array_equal(graph(x, y), plain)


def test_prefer_nchw16c_reorders_back_around_an_ndarray_only_op():
    def fn(x, y):
        return ops.relu(ops.softmax(ops.add(ops.relu(x), y), axis=1))

    x = rng(23).standard_normal(SHAPE).astype(np.float32)
    y = rng(24).standard_normal(SHAPE).astype(np.float32)
    graph = opforge.trace(fn, TensorSpec(SHAPE), TensorSpec(SHAPE))
    plain = graph(x, y)
    s = np.maximum(x, 0) + y
    want = np.exp(s - s.max(1, keepdims=True))
    np.testing.assert_allclose(plain, want / want.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert select_layouts(graph, prefer="nchw16c") == 5
    names = op_names(graph)
    at = names.index("softmax")
    assert names[at - 1] == "reorder" and names[at + 1] == "reorder"
    softmax = graph.nodes[at]
    assert softmax.inputs[0].spec.layout == "ndarray" and softmax.outputs[0].spec.layout == "ndarray"
    np.testing.assert_allclose(graph(x, y), plain, rtol=1e-6, atol=0)


def test_without_prefer_layouts_stay_plain():
    graph = opforge.trace(lambda x, y: ops.relu(ops.add(ops.relu(x), y)), TensorSpec(SHAPE), TensorSpec(SHAPE))
    assert select_layouts(graph) == 0
    assert "reorder" not in op_names(graph)
    assert set(blocked_kernel_layouts(graph).values()) == {"ndarray"}
    x = rng(25).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_array_equal(graph(x, x), np.maximum(np.maximum(x, 0) + x, 0))


def test_prefer_keeps_broadcasts_int_tensors_and_constants_correct():
    c = rng(26).standard_normal(SHAPE).astype(np.float32)
    bias = rng(27).standard_normal((1, 20, 1, 1)).astype(np.float32)
    graph = opforge.trace(lambda x: ops.relu(ops.add(ops.relu(x), c) + bias), TensorSpec(SHAPE))
    select_layouts(graph, prefer="nchw16c")
    broadcast = next(n for n in graph.nodes if not n.is_constant and n.op.name == "add" and
                     n.inputs[1].spec.shape == (1, 20, 1, 1))
    assert broadcast.kernel.layout == "ndarray"  # blocked kernels are elementwise over equal shapes
    x = rng(28).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_array_equal(graph(x), np.maximum(np.maximum(x, 0) + c + bias, 0))

    ints = opforge.trace(lambda x: ops.relu(x) + x, TensorSpec(SHAPE, "int32"))
    assert select_layouts(ints, prefer="nchw16c") == 0  # no int32 blocked kernels
    xi = rng(29).integers(-5, 5, SHAPE).astype(np.int32)
    np.testing.assert_array_equal(ints(xi), np.maximum(xi, 0) + xi)


def test_blocked_graph_with_unknown_batch_runs_at_several_batches():
    graph = opforge.trace(lambda x: ops.relu(ops.relu(x) + x), TensorSpec([-1, 20, 3, 5]))
    assert select_layouts(graph, prefer="nchw16c") == 2
    for n in (1, 3):
        x = rng(30 + n).standard_normal((n, 20, 3, 5)).astype(np.float32)
        np.testing.assert_array_equal(graph(x), np.maximum(np.maximum(x, 0) + x, 0))
    assert len(graph._executor.plans) == 2


def test_blocked_graph_survives_json():
    graph = opforge.trace(lambda x, y: (ops.relu(ops.add(ops.relu(x), y)),), TensorSpec(SHAPE), TensorSpec(SHAPE))
    select_layouts(graph, prefer="nchw16c")
    loaded = Graph.from_json(graph.to_json())
    assert normalized(loaded) == normalized(graph)
    assert blocked_kernel_layouts(loaded) == {"relu": "nchw16c", "add": "nchw16c"}
    x = rng(33).standard_normal(SHAPE).astype(np.float32)
    y = rng(34).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_array_equal(loaded(x, y)[0], np.maximum(np.maximum(x, 0) + y, 0))


DOUBLE_16C = r"""
#include "custom_aot_extra.h"

// y = 2 x over the padded nchw16c buffer (padding lanes stay 0).
extern "C" int Double16c(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
#ifndef OPFORGE_LAYOUT_NCHW16C
  return 7;
#endif
  if (ndims[0] != 4) return 3;
  const int64_t n = shapes[0][0] * ((shapes[0][1] + 15) / 16 * 16) * shapes[0][2] * shapes[0][3];
  for (int64_t i = 0; i < n; i++) y[i] = OPFORGE_T(2) * x[i];
  return 0;
}
"""


@pytest.fixture
def double16c(fresh):
    op = declare(fresh, "tgraph::double16c(Tensor x) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(code=DOUBLE_16C, function="Double16c", layout="nchw16c", dtypes={"x": ["float32"]})
    return op


def test_an_op_with_only_a_blocked_kernel_pulls_its_neighbours_into_nchw16c(double16c):
    def fn(x):
        d = double16c(x)
        r = ops.relu(d)
        return ops.relu(ops.add(r, d))

    graph = opforge.trace(fn, TensorSpec(SHAPE))
    with pytest.raises(NoKernelError):  # before layout selection, nothing takes its ndarray input
        graph(np.ones(SHAPE, np.float32))
    graph = opforge.trace(fn, TensorSpec(SHAPE))
    assert select_layouts(graph) == 2  # into the op, and the result back out: no reorders in between
    assert blocked_kernel_layouts(graph) == {"tgraph::double16c": "nchw16c", "relu": "nchw16c", "add": "nchw16c"}
    names = op_names(graph)
    assert names[0] == "reorder" and names[-1] == "reorder" and names.count("reorder") == 2
    x = rng(35).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_array_equal(graph(x), np.maximum(np.maximum(2 * x, 0) + 2 * x, 0))
    assert only_plan(graph).program is not None


def test_a_blocked_only_op_between_plain_ops(double16c):
    graph = opforge.trace(lambda x, y: ops.add(double16c(ops.relu(x)), y), TensorSpec(SHAPE), TensorSpec(SHAPE))
    assert select_layouts(graph) == 2
    layouts = blocked_kernel_layouts(graph)
    assert layouts["tgraph::double16c"] == "nchw16c"
    x = rng(36).standard_normal(SHAPE).astype(np.float32)
    y = rng(37).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_array_equal(graph(x, y), 2 * np.maximum(x, 0) + y)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_reorder_round_trips_exactly(dtype):
    graph = opforge.trace(lambda x: ops.reorder(ops.reorder(x, layout="nchw16c"), layout="ndarray"),
                          TensorSpec(SHAPE, dtype))
    assert "nchw16c" in repr(graph)
    x = rng(38).standard_normal(SHAPE).astype(dtype)
    out = graph(x)
    assert out.dtype == x.dtype and out.shape == SHAPE
    np.testing.assert_array_equal(out, x)
    blocked = opforge.trace(lambda x: ops.reorder(x, layout="nchw16c"), TensorSpec(SHAPE, dtype))(x)
    np.testing.assert_array_equal(blocked.ravel(), to_blocked(x).ravel())
    # the reference blocking itself: channel c of pixel (h, w) sits in block c // 16, lane c % 16
    assert to_blocked(x)[1, 1, 2, 4, 3] == x[1, 19, 2, 4]
    assert to_blocked(x)[0, 1, 0, 0, 4:].tolist() == [0.0] * 12


EAGER_REORDER = """
import numpy as np, opforge
x = np.arange(2 * 20 * 3 * 5, dtype=np.float32).reshape(2, 20, 3, 5)
try:
    opforge.ops.reorder(x, layout="nchw16c")
except opforge.ShapeError as error:
    assert "nchw16c" in str(error) and "graph" in str(error), error
junk = [np.ones(1000) for _ in range(200)]  # let the allocator notice a corrupted heap, if any
try:
    opforge.ops.reorder(x, layout="ndarray")
except opforge.CheckError as error:
    assert "already in layout ndarray" in str(error), error
print("OK")
"""


def test_eager_reorder_to_nchw16c_is_refused_cleanly():
    # Blocked layouts exist only inside graphs; an eager call says so (in a subprocess: a heap overrun would abort).
    done = subprocess.run([sys.executable, "-c", EAGER_REORDER], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "OK", (done.returncode, done.stderr[-2000:])


def test_train_step_example_lowers_the_loss():
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "examples" / "train_step.py")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    losses = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step")]
    assert len(losses) >= 3 and losses[-1] < 0.5 * losses[0], done.stdout
    assert done.stdout.strip().endswith("loss decreased")


def test_one_graph_run_from_several_threads_gives_every_caller_its_own_result():
    import threading

    rng = np.random.default_rng(7)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    xs = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(4)]
    graph = opforge.trace(lambda x, w: ops.relu(x @ w) @ w, xs[0], w)
    expected = [np.maximum(x @ w, 0) @ w for x in xs]
    wrong = []

    def worker(k):
        for _ in range(50):
            if not np.allclose(graph(xs[k], w), expected[k], rtol=1e-4, atol=1e-4):
                wrong.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_tracing_from_several_threads_keeps_the_traces_apart():
    import threading

    results = {}

    def worker(k):
        depth = 5 + k
        def chain(x):
            for _ in range(depth):
                x = ops.relu(x)
            return x
        results[k] = [len(opforge.trace(chain, np.ones(3)).nodes) for _ in range(20)]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: [5 + k] * 20 for k in range(4)}


def test_a_pinned_kernel_follows_the_isa_cap():
    if not opforge.cpu_features()["avx2"]:
        pytest.skip("this CPU lacks AVX2")
    graph = opforge.trace(lambda x: ops.leaky_relu(x, alpha=0.5), TensorSpec([2, 16, 2, 2], "float32"))
    opforge.graph.select_layouts(graph, prefer="nchw16c")
    x = np.random.default_rng(0).standard_normal((2, 16, 2, 2)).astype(np.float32)
    expected = np.where(x > 0, x, 0.5 * x)
    opforge.set_isa_cap("sse41")
    try:
        np.testing.assert_allclose(graph(x), expected)
        plan = graph._executor.plan_for([x])
        assert {k.isa for _, k, _, _ in plan.steps if k.isa} == {"sse41"}
    finally:
        opforge.set_isa_cap(None)
    assert "sse41" not in {k.isa for _, k, _, _ in graph._executor.plan_for([x]).steps if k.isa}


def test_python_scalars_keep_the_traced_dtype_and_the_native_program(fresh):
    graph = opforge.trace(lambda x: 2.0 * x - 1.0, np.ones(4, np.float32))
    assert graph.outputs[0].spec.dtype == "float32"
    x = np.arange(4, dtype=np.float32)
    out = graph(x)
    assert out.dtype == np.float32 and np.array_equal(out, 2 * x - 1)
    assert graph._executor.plan_for([x]).program is not None
    eager = ops.mul(x, 2.0)  # the same rule eagerly
    assert eager.dtype == np.float32 and np.array_equal(eager, 2 * x)


def test_constant_folding_leaves_side_effects_and_blocked_layouts_alone(fresh):
    calls = []
    noisy = declare(fresh, "tgraph::noisy(Tensor x) -> Tensor y")
    noisy.def_infer(opforge.infer.same_as(0))
    noisy.kernel(lambda x: (calls.append(1), x + 1)[1])
    from opforge.graph.ir import Graph, Node, Value, constant_node

    const = constant_node(np.ones(3))
    node = Node(noisy, [const.outputs[0]], {}, [TensorSpec([3], "float64")])
    graph = Graph([Value(TensorSpec([3], "float64"))], [const, node], node.outputs)
    assert opforge.graph.fold_constants(graph) == 0 and calls == []
    np.testing.assert_array_equal(graph(np.zeros(3))[0], [2, 2, 2])
    assert calls == [1]
