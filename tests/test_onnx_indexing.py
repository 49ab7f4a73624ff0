"""ONNX element indexing and layout ops (src/opforge/onnx/indexing.py): one-node models run by opforge agree
with onnxruntime (or NumPy, for Einsum equations onnxruntime does not take), over the opsets the converters
tell apart, with unknown dims; and what cannot be converted or run is a typed opforge error."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import opforge
import opforge.onnx
from opforge.errors import KernelError, ModelError

rng = np.random.default_rng(0)


def model_of(op_type, inputs, constants=(), attrs=None, opset=13, dynamic=()):
    """A one-node model: ``inputs`` is a list of (name, array); names in ``constants`` become initializers, the
    rest graph inputs (their dims listed in ``dynamic`` unknown)."""
    graph_inputs, initializers = [], []
    for name, array in inputs:
        if name in constants:
            initializers.append(numpy_helper.from_array(array, name))
        else:
            dims = [None if k in dynamic else d for k, d in enumerate(array.shape)]
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                                              dims))
    node = helper.make_node(op_type, [name for name, _ in inputs], ["y"], **(attrs or {}))
    graph = helper.make_graph([node], "g", graph_inputs, [onnx.ValueInfoProto(name="y")], initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(model, inputs, constants=()):
    graph = opforge.onnx.load(model)
    feeds = {name: array for name, array in inputs if name not in constants}
    return graph, np.asarray(graph(*[feeds[name] for name in graph.input_names]))


def check(op_type, inputs, constants=(), attrs=None, opset=13, dynamic=()):
    """opforge's output equals onnxruntime's exactly (dtype, shape, values)."""
    model = model_of(op_type, inputs, constants, attrs, opset, dynamic)
    feeds = {name: array for name, array in inputs if name not in constants}
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph, got = run(model, inputs, constants)
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape, expected.shape)
    np.testing.assert_array_equal(got, expected)
    return graph


def r(*shape, dtype=np.float32):
    return np.asarray(rng.standard_normal(shape) * 5).astype(dtype)


def op_names(graph):
    return [node.op.name for node in graph.nodes if node.op is not None]


# -- GatherElements, ScatterElements, Scatter, GatherND, ScatterND -------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_with_unknown_dims(axis):
    data = r(3, 4)
    indices = rng.integers(-data.shape[axis], data.shape[axis], (2, 4) if axis == 0 else (3, 2))
    check("GatherElements", [("data", data), ("indices", indices)], attrs={"axis": axis}, dynamic=(0, 1))


@pytest.mark.parametrize("opset,reduction", [(11, None), (13, None), (16, "add"), (16, "mul"), (18, "max"),
                                             (18, "min")])
def test_scatter_elements_reductions(opset, reduction):
    data, indices, updates = r(3, 4), np.array([[1, 0, 2, 1], [1, 2, 0, -1]]), r(2, 4)
    attrs = {"axis": 0, **({"reduction": reduction} if reduction else {})}
    check("ScatterElements", [("data", data), ("indices", indices), ("updates", updates)], attrs=attrs,
          opset=opset, dynamic=(0,))


def test_scatter_is_scatter_elements_before_opset_11():
    data, indices, updates = r(3, 4), np.array([[1, 0, 2, 1]]), r(1, 4)
    check("Scatter", [("data", data), ("indices", indices), ("updates", updates)], attrs={"axis": 0}, opset=10)


@pytest.mark.parametrize("opset,batch_dims", [(11, 0), (12, 1), (13, 1), (13, 2)])
def test_gather_nd(opset, batch_dims):
    data = r(2, 3, 4, 5)
    k = 4 - batch_dims - 1
    indices = np.stack([rng.integers(0, data.shape[batch_dims + j], data.shape[:batch_dims] + (3,))
                        for j in range(k)], -1)
    attrs = {"batch_dims": batch_dims} if opset >= 12 else {}
    check("GatherND", [("data", data), ("indices", indices)], attrs=attrs, opset=opset, dynamic=(0,))


@pytest.mark.parametrize("opset,reduction", [(11, None), (16, "add"), (16, "mul"), (18, "max"), (18, "min")])
def test_scatter_nd(opset, reduction):
    data, indices, updates = r(4, 3, 2), np.array([[1], [3], [1]]), r(3, 3, 2)
    attrs = {"reduction": reduction} if reduction else {}
    check("ScatterND", [("data", data), ("indices", indices), ("updates", updates)], attrs=attrs, opset=opset,
          dynamic=(0, 1))


@pytest.mark.parametrize("op_type,inputs", [
    ("GatherElements", [("data", r(3, 4)), ("indices", np.array([[0, 7, 0, 0]]))]),
    ("ScatterElements", [("data", r(3, 4)), ("indices", np.array([[0, 0, -4, 0]])), ("updates", r(1, 4))]),
    ("GatherND", [("data", r(3, 4)), ("indices", np.array([[0, 4]]))]),
    ("ScatterND", [("data", r(3, 4)), ("indices", np.array([[3]])), ("updates", r(1, 4))]),
])
def test_an_index_out_of_range_at_run_time_is_a_kernel_error(op_type, inputs):
    with pytest.raises(KernelError, match="error code 4: input 'indices' holds an index out of range"):
        run(model_of(op_type, inputs, dynamic=(0,)), inputs)


@pytest.mark.parametrize("op_type,inputs,message", [
    ("GatherElements", [("data", r(3, 4)), ("indices", np.array([[0, 7, 0, 0]]))], "holds 7, out of range for axis 0"),
    ("ScatterElements", [("data", r(3, 4)), ("indices", np.array([[0, 0, -4, 0]])), ("updates", r(1, 4))],
     "holds -4"),
    ("GatherND", [("data", r(3, 4)), ("indices", np.array([[0, 4]]))], "holds 4, out of range for dim 1"),
    ("ScatterND", [("data", r(3, 4)), ("indices", np.array([[3]])), ("updates", r(1, 4))], "holds 3"),
])
def test_indices_known_at_load_time_are_checked_then(op_type, inputs, message):
    with pytest.raises(ModelError, match=message):
        opforge.onnx.load(model_of(op_type, inputs, constants=("indices",)))


# -- Einsum ----------------------------------------------------------------------------------

EQUATIONS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij->ji", [(3, 4)]),
    ("ij->i", [(3, 4)]), ("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("...ii->...i", [(2, 3, 4, 4)]), ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]), ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]), ("ijk->", [(2, 3, 4)]), ("abc,cd,de->abe", [(2, 3, 4), (4, 5),
                                                                                                 (5, 6)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]), ("ij,ij", [(3, 4), (3, 4)]), ("ij,jk", [(3, 4), (4, 2)]), ("ba", [(3, 4)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]), ("iij,jk->ik", [(3, 3, 4), (4, 2)]), ("->", [()]),
    ("i...,i...->...", [(3, 2, 4), (3, 2, 4)]), ("ij,kl->ijkl", [(2, 3), (4, 1)]), ("bij,jk->bik", [(2, 0, 3), (3, 4)]),
]


@pytest.mark.parametrize("equation,shapes", EQUATIONS, ids=[e for e, _ in EQUATIONS])
def test_einsum_matches_numpy(equation, shapes):
    arrays = [r(*shape, dtype=np.float64) for shape in shapes]
    inputs = [(f"x{k}", a) for k, a in enumerate(arrays)]
    graph, got = run(model_of("Einsum", inputs, attrs={"equation": equation}, opset=12), inputs)
    expected = np.einsum(equation, *arrays)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("equation, shape", [("ii->i", (3, 3)), ("bii->bi", (2, 3, 3)), ("ii", (3, 3))])
def test_einsum_diagonal_ignores_inf_and_nan_off_the_diagonal(equation, shape):
    x = r(*shape)
    x[..., 0, 1], x[..., 2, 0] = np.inf, np.nan  # a product with a 0/1 mask would make these NaN on the diagonal
    inputs = [("x", x)]
    _, got = run(model_of("Einsum", inputs, attrs={"equation": equation}, opset=12), inputs)
    np.testing.assert_array_equal(got, np.einsum(equation, x))


def test_einsum_contracts_with_matmul_and_keeps_unknown_batch_dims():
    a, b = r(3, 2, 4, dtype=np.float64), r(3, 4, 5, dtype=np.float64)
    inputs = [("a", a), ("b", b)]
    graph, got = run(model_of("Einsum", inputs, attrs={"equation": "bij,bjk->bik"}, opset=12, dynamic=(0,)), inputs)
    np.testing.assert_allclose(got, a @ b, rtol=1e-12)
    assert "matmul" in op_names(graph) and "reduce_sum" not in op_names(graph) and "mul" not in op_names(graph)
    a, b = r(7, 2, 4, dtype=np.float64), r(7, 4, 5, dtype=np.float64)
    np.testing.assert_allclose(graph(a, b), a @ b, rtol=1e-12)
    # attention scores: a transpose of the keys, then one matmul
    q, k = r(2, 3, 4, 5), r(2, 3, 6, 5)
    inputs = [("q", q), ("k", k)]
    graph, _ = run(model_of("Einsum", inputs, attrs={"equation": "bhqd,bhkd->bhqk"}, opset=12, dynamic=(0, 2)),
                   inputs)
    np.testing.assert_allclose(graph(q, k), np.einsum("bhqd,bhkd->bhqk", q, k), rtol=1e-5, atol=1e-4)
    assert op_names(graph).count("matmul") == 1 and "reduce_sum" not in op_names(graph)


@pytest.mark.parametrize("equation,shapes,dynamic,message", [
    ("ij,jk->ik", [(3, 4)], (), "names 2 operands"),
    ("ijk->i", [(3, 4)], (), "does not fit input 0"),
    ("ij->k", [(3, 4)], (), "names one no input has"),
    ("i1->i", [(3, 4)], (), "characters other than letters"),
    ("ij,jk->ik", [(3, 4), (5, 2)], (), "sizes 4 and 5"),
])
def test_einsum_errors_are_model_errors(equation, shapes, dynamic, message):
    inputs = [(f"x{k}", r(*shape)) for k, shape in enumerate(shapes)]
    with pytest.raises(ModelError, match=message):
        opforge.onnx.load(model_of("Einsum", inputs, attrs={"equation": equation}, opset=12, dynamic=dynamic))


def test_einsum_diagonal_of_unknown_size_converts_per_input_shape():
    graph = check("Einsum", [("x0", r(4, 4))], attrs={"equation": "ii->i"}, opset=12, dynamic=(0, 1))
    assert isinstance(graph, opforge.onnx.DynamicModel) and "size of label 'i' known" in graph.reason
    x = r(6, 6)
    np.testing.assert_array_equal(graph(x), np.diagonal(x))


# -- DepthToSpace, SpaceToDepth --------------------------------------------------------------

@pytest.mark.parametrize("mode", [None, "DCR", "CRD"])
@pytest.mark.parametrize("blocksize", [1, 2, 3])
def test_depth_to_space_and_back(mode, blocksize):
    attrs = {"blocksize": blocksize, **({"mode": mode} if mode else {})}
    x = r(2, 2 * blocksize * blocksize, 3, 4)
    check("DepthToSpace", [("x", x)], attrs=attrs, opset=11 if mode else 1, dynamic=(0,))
    x = r(2, 3, 2 * blocksize, 3 * blocksize)
    if mode in (None, "DCR"):  # onnxruntime's SpaceToDepth has no mode
        check("SpaceToDepth", [("x", x)], attrs={"blocksize": blocksize}, opset=13, dynamic=(0,))
    depth = opforge.onnx.load(model_of("SpaceToDepth", [("x", x)], attrs=attrs, opset=28, dynamic=(0,)))
    space = opforge.onnx.load(model_of("DepthToSpace", [("x", depth(x))], attrs=attrs, opset=13, dynamic=(0,)))
    np.testing.assert_array_equal(space(depth(x)), x)  # the two are inverses in either mode


@pytest.mark.parametrize("op_type,shape,dynamic,message", [
    ("DepthToSpace", (1, 6, 2, 3), (), "not a multiple of blocksize"),
    ("SpaceToDepth", (1, 2, 5, 4), (), "multiples of blocksize"),
    ("SpaceToDepth", (2, 4), (), r"takes \[N, C, H, W\]"),
])
def test_depth_space_errors(op_type, shape, dynamic, message):
    with pytest.raises(ModelError, match=message):
        opforge.onnx.load(model_of(op_type, [("x", r(*shape))], attrs={"blocksize": 2}, opset=13, dynamic=dynamic))
    with pytest.raises(ModelError, match="mode"):
        opforge.onnx.load(model_of("DepthToSpace", [("x", r(1, 8, 2, 3))], attrs={"blocksize": 2, "mode": "XYZ"}))


# -- OneHot ----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [None, 0, 1, -2])
@pytest.mark.parametrize("indices_dtype", [np.int64, np.int32, np.float32])
def test_one_hot(axis, indices_dtype):
    indices = np.array([[0, 3, -1], [9, -5, 2]]).astype(indices_dtype)  # 9 and -5 are out of range for depth 4
    values = np.array([-2.0, 7.5], np.float32)
    attrs = {"axis": axis} if axis is not None else {}
    inputs = [("indices", indices), ("depth", np.array(4, np.int64)), ("values", values)]
    # (onnxruntime implements OneHot for a few type combinations only: NumPy is the reference here)
    _, got = run(model_of("OneHot", inputs, constants=("depth", "values"), attrs=attrs, opset=11, dynamic=(0,)),
                 inputs, ("depth", "values"))
    at = indices.astype(np.int64)
    hot = np.arange(4) == np.where(at < 0, at + 4, at)[..., None]
    expected = np.moveaxis(np.where(hot, values[1], values[0]), -1, -1 if axis is None else axis)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


def test_one_hot_before_opset_11_leaves_negative_indices_off():
    inputs = [("indices", np.array([0, -1, 2])), ("depth", np.array([3.0], np.float32)),
              ("values", np.array([0, 1], np.int64))]
    _, got = run(model_of("OneHot", inputs, constants=("depth", "values"), opset=9), inputs, ("depth", "values"))
    np.testing.assert_array_equal(got, [[1, 0, 0], [0, 0, 0], [0, 0, 1]])


def test_depth_to_space_of_unknown_spatial_dims_converts_per_input_shape():
    graph = check("DepthToSpace", [("x", r(1, 8, 2, 3))], attrs={"blocksize": 2}, opset=13, dynamic=(2,))
    assert isinstance(graph, opforge.onnx.DynamicModel) and "dims C, H and W" in graph.reason
    assert graph(r(1, 8, 5, 3)).shape == (1, 2, 10, 6)


def test_one_hot_depth_from_a_graph_input_and_bad_values_or_axis():
    inputs = [("indices", np.array([0, 1])), ("depth", np.array(3, np.int64)), ("values", np.array([0.0, 1.0]))]
    graph = opforge.onnx.load(model_of("OneHot", inputs, constants=("values",), opset=11))
    assert isinstance(graph, opforge.onnx.DynamicModel)  # the depth sizes the output: it runs node by node
    np.testing.assert_array_equal(graph(np.array([0, 1]), np.array(3)), np.eye(3)[:2])
    np.testing.assert_array_equal(graph(np.array([3, 0]), np.array(4)), np.eye(4)[[3, 0]])
    with pytest.raises(ModelError, match="two values"):
        bad = [inputs[0], inputs[1], ("values", np.array([0.0, 1.0, 2.0]))]
        opforge.onnx.load(model_of("OneHot", bad, constants=("depth", "values"), opset=11))
    with pytest.raises(ModelError, match="axis"):
        opforge.onnx.load(model_of("OneHot", inputs, constants=("depth", "values"), attrs={"axis": 2}, opset=11))


# -- export: each built-in is one ONNX node, which onnxruntime runs alike --------------------------

def exported_runs_alike(fn, arrays, opset):
    from opforge.onnx import export

    graph = opforge.trace(fn, *arrays)
    model = export(graph, opset=opset)
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})
    np.testing.assert_allclose(got, graph(*arrays), rtol=1e-6)
    return [node.op_type for node in model.graph.node]


ELEMENT_INDICES = np.array([[2, 0, 1, -1], [0, 2, 2, 1]])
ND_INDICES = np.array([[1, 2], [0, -1]])
EXPORTS = [
    (lambda x: opforge.ops.gather_elements(x, ELEMENT_INDICES), 11, "GatherElements"),
    (lambda x: opforge.ops.scatter_elements(x, ELEMENT_INDICES, x[:2] * 2), 11, "ScatterElements"),
    (lambda x: opforge.ops.scatter_elements(x, ELEMENT_INDICES, x[:2], reduction="add"), 16, "ScatterElements"),
    (lambda x: opforge.ops.scatter_elements(x, ELEMENT_INDICES, x[:2], reduction="max", axis=0), 18,
     "ScatterElements"),
    (lambda x: opforge.ops.gather_nd(x, ND_INDICES), 11, "GatherND"),
    (lambda x: opforge.ops.gather_nd(x, np.array([[1], [3], [0]]), batch_dims=1), 12, "GatherND"),
    (lambda x: opforge.ops.scatter_nd(x, ND_INDICES, np.ones(2, np.float32)), 11, "ScatterND"),
    (lambda x: opforge.ops.scatter_nd(x, ND_INDICES, np.ones(2, np.float32), reduction="mul"), 16, "ScatterND"),
]


@pytest.mark.parametrize("fn,opset,op_type", EXPORTS)
def test_builtins_export_as_one_node(fn, opset, op_type):
    assert op_type in exported_runs_alike(fn, [r(3, 4)], opset)


@pytest.mark.parametrize("fn,opset,message", [
    (lambda x: opforge.ops.scatter_elements(x, ELEMENT_INDICES, x[:2], reduction="add"), 13, "needs opset 16"),
    (lambda x: opforge.ops.scatter_nd(x, ND_INDICES, np.ones(2, np.float32), reduction="min"), 17, "needs opset 18"),
    (lambda x: opforge.ops.gather_nd(x, np.array([[1], [3], [0]]), batch_dims=1), 11, "needs opset 12"),
    (lambda x: opforge.ops.scatter_nd(x, np.array([[1], [3], [0]]), np.ones(3, np.float32), batch_dims=1), 17,
     "no batch dims"),
])
def test_exports_refused_where_onnx_cannot_say_it(fn, opset, message):
    from opforge.onnx import export

    with pytest.raises(ModelError, match=message):
        export(opforge.trace(fn, r(3, 4)), opset=opset)
