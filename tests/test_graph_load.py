"""Fuzzing the graph JSON loader: real saved graphs, mutated (keys deleted or
replaced, types changed, numbers swapped for strings, floats, huge ints, NaN,
text truncated, bytes changed).  Loading either succeeds and the graph runs,
or raises an OpforgeError; nothing else escapes, nothing crashes."""
import functools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opforge
from opforge import Graph, TensorSpec
from opforge.errors import OpforgeError
from opforge.graph import select_layouts

ops = opforge.ops


@pytest.fixture(scope="module", autouse=True)
def min_max():
    """A registered op with two outputs (no built-in has them yet)."""
    op = opforge.op("tgraph_load::min_max(Tensor x, *, int axis=-1) -> (Tensor low, Tensor high)",
                    traits=["no_side_effect"])
    op.def_infer(lambda x, axis: [opforge.infer.reduce("axes", "keep")(x, axes=[axis], keep=False)] * 2)
    op.kernel(lambda x, axis: (x.min(axis), x.max(axis)))
    yield op
    opforge.registry.unregister(op.name)


@functools.cache
def saved_graphs():
    """(JSON text, input arrays) of graphs worth mutating."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((4, 8)).astype(np.float32)
    b1 = rng.standard_normal(8).astype(np.float32)
    w2 = rng.standard_normal((8, 2)).astype(np.float32)
    mlp = opforge.trace(lambda x: ops.softmax(ops.relu(x @ w1 + b1) @ w2, axis=-1), TensorSpec([-1, 4]))
    attrs = opforge.trace(lambda x: ops.reduce_sum(ops.transpose(ops.leaky_relu(ops.reshape(x, shape=[2, 3]),
                                                                                   alpha=0.1)),
                                                   axes=[1], keep_dims=True), TensorSpec([6], "float64"))
    min_max = opforge.lookup("tgraph_load::min_max")
    pair = opforge.trace(lambda x: min_max(ops.exp(x), axis=0), TensorSpec([3, 2], "float64"))
    blocked = opforge.trace(lambda x: ops.relu(ops.relu(x) + x), TensorSpec([1, 20, 2, 3]))
    select_layouts(blocked, prefer="nchw16c")
    return [(mlp.to_json(), [rng.standard_normal((3, 4)).astype(np.float32)]),
            (attrs.to_json(), [np.arange(6.0) - 3]),
            (pair.to_json(), [rng.standard_normal((3, 2))]),
            (blocked.to_json(), [rng.standard_normal((1, 20, 2, 3)).astype(np.float32)])]


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2 ** 31, 2 ** 63, -2 ** 63 - 1,
                    10 ** 30, 2.5, -1.0, float("nan"), float("inf"), 1e308]), st.text(max_size=8),
                    st.sampled_from(["relu", "x0", "v0", "v1", "constant", "float64", "nchw16c", "ndarray",
                                     "int8", "bool"]))
JUNK = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                    max_leaves=6)


def paths(tree, prefix=()):
    """Every position in the JSON tree: tuples of keys and indices."""
    yield prefix
    if isinstance(tree, dict):
        for key, child in tree.items():
            yield from paths(child, prefix + (key,))
    elif isinstance(tree, list):
        for k, child in enumerate(tree):
            yield from paths(child, prefix + (k,))


@st.composite
def mutated(draw):
    text, arrays = saved_graphs()[draw(st.integers(0, 3))]
    tree = json.loads(text)
    for _ in range(draw(st.integers(1, 3))):
        places = [p for p in paths(tree) if p]
        path = draw(st.sampled_from(places))
        parent = tree
        for step in path[:-1]:
            parent = parent[step]
        key = path[-1]
        action = draw(st.sampled_from(["replace", "replace", "delete", "insert", "duplicate", "number"]))
        if action == "replace":
            parent[key] = draw(JUNK)
        elif action == "delete":
            del parent[key]
        elif action == "insert" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "kernel", "attrs", "inputs", "layout", "value"]))] = draw(JUNK)
        elif action == "insert":
            parent.insert(key, draw(JUNK))
        elif action == "duplicate" and isinstance(parent, list):
            parent.append(parent[key])
        elif isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = draw(st.sampled_from([parent[key] + 1, -parent[key], parent[key] * 1000, 0, -2,
                                                float(parent[key]) + 0.5, str(parent[key])]))
    data = json.dumps(tree, indent=draw(st.sampled_from([None, 1]))).encode()
    edit = draw(st.sampled_from(["none", "none", "none", "truncate", "byte"]))
    if edit == "truncate":
        data = data[:draw(st.integers(0, len(data)))]
    elif edit == "byte" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    return data, arrays


def test_the_unmutated_graphs_load_and_run():
    for text, arrays in saved_graphs():
        graph = Graph.from_json(text)
        assert graph.to_json() == text
        graph(*arrays)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_graph_json_loads_and_runs_or_raises_an_opforge_error(case):
    data, arrays = case
    try:
        graph = Graph.from_json(data)
    except OpforgeError:
        return
    try:
        graph(*arrays)
    except OpforgeError:
        pass


@pytest.mark.parametrize("junk", [b"", b"\x00" * 10, b"\xc3\x28", b"null", b"1e999", b"[" * 50000,
                                  b'{"name": "g", "inputs": [], "nodes": [], "outputs": [], "format": 1' * 3,
                                  "\ud800".encode("utf-8", "surrogatepass"), b"9" * 5000])
def test_junk_bytes_raise_an_opforge_error(junk):
    with pytest.raises(OpforgeError):
        Graph.from_json(junk)
