"""ONNX ops whose output sizes depend on input values (src/opforge/onnx/value_sized.py): NonZero,
NonMaxSuppression, Unique, Compress, and TopK with a k computed at run time.  On traced inputs the model
loads as a DynamicModel that runs node by node; on arrays each op computes at load time; Compress with a
constant condition is a gather in the graph.  Everything is compared with onnxruntime exactly, and onnx's
own conformance cases for these ops pass."""
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opforge
import opforge.onnx as ox
from opforge.errors import ModelError
from opforge.onnx.backend import OpforgeBackend, check_case, conformance_cases

rng = np.random.default_rng(0)


def model_of(op_type, inputs, constants=(), attrs=None, opset=13, outputs=1, dynamic=()):
    """A one-node model: ``inputs`` is a list of (name, array), or (name, None) for an omitted optional input;
    names in ``constants`` become initializers, the rest graph inputs (their dims in ``dynamic`` unknown)."""
    graph_inputs, initializers = [], []
    for name, array in inputs:
        if array is None:
            continue
        if name in constants:
            initializers.append(numpy_helper.from_array(array, name))
        else:
            dims = [None if k in dynamic else d for k, d in enumerate(array.shape)]
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                                              dims))
    names = [f"y{k}" for k in range(outputs)]
    node = helper.make_node(op_type, [name if array is not None else "" for name, array in inputs], names,
                            **(attrs or {}))
    graph = helper.make_graph([node], "g", graph_inputs, [onnx.ValueInfoProto(name=n) for n in names],
                              initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def ort_run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def opforge_run(graph, feeds):
    result = graph(*[feeds[name] for name in graph.input_names])
    return [np.asarray(x) for x in (result if isinstance(result, tuple) else (result,))]


def assert_same(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_array_equal(a, b)


def check(op_type, inputs, constants=(), attrs=None, opset=13, outputs=1, dynamic=()):
    """opforge's outputs equal onnxruntime's exactly (dtypes, shapes, values); returns what load gave."""
    model = model_of(op_type, inputs, constants, attrs, opset, outputs, dynamic)
    feeds = {name: array for name, array in inputs if array is not None and name not in constants}
    graph = ox.load(model)
    assert_same(opforge_run(graph, feeds), ort_run(model, feeds))
    return graph


def eager(graph, feeds):
    assert isinstance(graph, ox.DynamicModel)
    return graph.mode(*[feeds[name] for name in graph.input_names]) == "eager"


# -- onnx's conformance cases ---------------------------------------------------------------

CASES = conformance_cases(["NonZero", "NonMaxSuppression", "Unique", "Compress"])


def test_onnx_has_conformance_cases_for_each_op():
    assert {op: len(cases) >= 1 for op, cases in CASES.items()} == dict.fromkeys(
        ["Compress", "NonMaxSuppression", "NonZero", "Unique"], True)


@pytest.mark.parametrize("case", [case for cases in CASES.values() for case in cases], ids=lambda c: c.name)
def test_conformance_case_passes(case):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        check_case(OpforgeBackend, case)


# -- NonZero -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "bool", "uint8", "float16"])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4), (0, 3), ()])
def test_nonzero_matches_ort(dtype, shape):
    x = (rng.integers(-1, 2, size=shape)).astype(dtype)
    graph = check("NonZero", [("x", x)])
    assert eager(graph, {"x": x})


def test_nonzero_of_all_zeros_and_of_a_zero_scalar():
    for x in (np.zeros((2, 3), np.float32), np.zeros((), np.float32), np.ones((), np.float32)):
        check("NonZero", [("x", x)])


def test_nonzero_of_an_initializer_folds_at_load_time():
    x = np.array([[0, 1, 0], [2, 0, 3]], np.float32)
    graph = check("NonZero", [("x", x)], constants=["x"], opset=9)
    assert isinstance(graph, opforge.Graph) and not [n for n in graph.nodes if n.op is not None]


def test_nonzero_after_graph_ops_runs_node_by_node_on_each_call():
    nodes = [helper.make_node("Greater", ["x", "t"], ["m"]), helper.make_node("NonZero", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [onnx.ValueInfoProto(name="y")],
                              initializer=[numpy_helper.from_array(np.float32(0.5), "t")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    loaded = ox.load(model)
    assert isinstance(loaded, ox.DynamicModel) and "output size depends on the values" in loaded.reason
    for n in (1, 3, 6):
        x = rng.random((n, 4), np.float32)
        assert eager(loaded, {"x": x})
        assert_same(opforge_run(loaded, {"x": x}), ort_run(model, {"x": x}))


# -- Compress ----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [None, 0, 1, -1, -2])
@pytest.mark.parametrize("length", [2, 3, 5])  # shorter than, as long as and longer than the axis (size 3)
def test_compress_matches_ort(axis, length):
    x = rng.standard_normal((3, 3)).astype(np.float32)
    if axis is None:
        length += 4  # against 9 flattened elements: shorter, and 3 ... past them
    condition = rng.random(length) > 0.4
    condition[-1] = True  # a true entry past the axis is ignored, as onnxruntime ignores it
    attrs = {} if axis is None else {"axis": axis}
    graph = check("Compress", [("x", x), ("c", condition)], attrs=attrs, opset=11)
    assert eager(graph, {"x": x, "c": condition})


@pytest.mark.parametrize("dtype", ["int64", "bool", "float64", "uint16"])
def test_compress_dtypes_match_ort(dtype):
    x = rng.integers(0, 5, size=(4, 2, 3)).astype(dtype)
    check("Compress", [("x", x), ("c", np.array([True, False, True, True]))], attrs={"axis": 0}, opset=11)


@pytest.mark.parametrize("axis", [None, 1, -1])
def test_compress_with_a_constant_condition_is_a_gather_in_the_graph(axis):
    x = rng.standard_normal((2, 4)).astype(np.float32)
    condition = np.array([False, True, True, False, True])
    attrs = {} if axis is None else {"axis": axis}
    graph = check("Compress", [("x", x), ("c", condition)], constants=["c"], attrs=attrs, opset=11)
    assert isinstance(graph, opforge.Graph)
    assert "gather" in [n.op.name for n in graph.nodes if n.op is not None]


def test_compress_with_a_constant_condition_none_true_gives_an_empty_result():
    x = rng.standard_normal((2, 4)).astype(np.float32)
    graph = check("Compress", [("x", x), ("c", np.zeros(4, bool))], constants=["c"], attrs={"axis": 1}, opset=11)
    assert isinstance(graph, opforge.Graph)


def test_compress_along_an_unknown_dim_becomes_a_graph_per_signature():
    condition = np.array([True, False, True, True])
    model = model_of("Compress", [("x", np.zeros((3, 2), np.float32)), ("c", condition)], constants=["c"],
                     attrs={"axis": 0}, opset=11, dynamic=[0])
    loaded = ox.load(model)
    assert isinstance(loaded, ox.DynamicModel)
    for n in (2, 3, 6):
        x = rng.standard_normal((n, 2)).astype(np.float32)
        assert loaded.mode(x) == "graph"
        assert_same(opforge_run(loaded, {"x": x}), ort_run(model, {"x": x}))
    # along a known axis beside the unknown one: one graph for every batch size
    graph = check("Compress", [("x", np.ones((3, 4), np.float32)), ("c", condition)], constants=["c"],
                  attrs={"axis": 1}, opset=11, dynamic=[0])
    assert isinstance(graph, opforge.Graph)


def test_compress_errors():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ModelError, match="'axis' 2 is out of range"):
        ox.load(model_of("Compress", [("x", x), ("c", np.ones(3, bool))], attrs={"axis": 2}, opset=11))
    with pytest.raises(ModelError, match="bool condition"):
        ox.load(model_of("Compress", [("x", x), ("c", np.ones(3, np.int64))], constants=["c"], opset=11))
    with pytest.raises(ModelError, match="1-d condition"):
        ox.load(model_of("Compress", [("x", x), ("c", np.ones((1, 3), bool))], constants=["c"], opset=11))


# -- Unique ------------------------------------------------------------------------------------

@pytest.mark.parametrize("is_sorted", [1, 0])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, 2])
@pytest.mark.parametrize("dtype", ["float32", "int64", "int8"])
def test_unique_matches_ort_with_all_four_outputs(is_sorted, axis, dtype):
    x = rng.integers(0, 3, size=(4, 3, 2)).astype(dtype)
    x[2] = x[0]  # repeated slices along each axis
    x[:, 2] = x[:, 1]
    attrs = {"sorted": is_sorted} if axis is None else {"sorted": is_sorted, "axis": axis}
    graph = check("Unique", [("x", x)], attrs=attrs, opset=11, outputs=4)
    assert eager(graph, {"x": x})


def test_unique_outputs_declared_partly_and_special_values():
    x = np.array([2.0, -0.0, 1.5, 0.0, 2.0, -3.0, 1.5], np.float32)  # -0.0 equals 0.0: the first one is kept
    check("Unique", [("x", x)], attrs={"sorted": 0}, opset=11, outputs=4)
    check("Unique", [("x", x)], opset=11, outputs=2)
    check("Unique", [("x", np.array(5, np.int64))], opset=11, outputs=4)
    check("Unique", [("x", np.zeros((0, 3), np.float32))], attrs={"axis": 1}, opset=11, outputs=4)
    x = np.array([True, False, True, True])  # onnxruntime has no bool Unique: against NumPy's
    got = opforge_run(ox.load(model_of("Unique", [("x", x)], opset=11, outputs=4)), {"x": x})
    expected = [a.astype(np.int64) if a.dtype != bool else a for a in np.unique(x, True, True, True)]
    assert_same(got, expected)


def test_unique_of_an_initializer_folds_and_bad_attributes_are_model_errors():
    x = np.array([[1, 2], [1, 2], [0, 9]], np.int64)
    graph = check("Unique", [("x", x)], constants=["x"], attrs={"axis": 0}, opset=11, outputs=4)
    assert isinstance(graph, opforge.Graph)
    with pytest.raises(ModelError, match="'sorted' is 2; it must be 0 or 1"):
        ox.load(model_of("Unique", [("x", x)], attrs={"sorted": 2}, opset=11))
    with pytest.raises(ModelError, match="'axis' -3 is out of range for input of rank 2"):
        ox.load(model_of("Unique", [("x", x)], attrs={"axis": -3}, opset=11))


# -- NonMaxSuppression -----------------------------------------------------------------------

def random_boxes(batches, count, center=False, seed=0):
    r = np.random.default_rng(seed)
    low = r.random((batches, count, 2)) * 10
    size = r.random((batches, count, 2)) * 4 + 0.5
    if center:
        boxes = np.concatenate([low + size / 2, size], axis=2)
    else:
        boxes = np.concatenate([low, low + size], axis=2)
        flip = r.random((batches, count)) < 0.3  # the other diagonal
        boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    return boxes.astype(np.float32)


def nms_inputs(batches, classes, count, most, iou, score, center=False, seed=0):
    r = np.random.default_rng(seed + 1)
    scores = np.round(r.random((batches, classes, count)), 1).astype(np.float32)  # ties too
    given = [("boxes", random_boxes(batches, count, center, seed)), ("scores", scores)]
    for name, value, dtype in (("most", most, np.int64), ("iou", iou, np.float32), ("score", score, np.float32)):
        given.append((name, None if value is None else np.array([value], dtype)))
    while given[-1][1] is None:
        given.pop()
    return given


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("most, iou, score", [(3, 0.5, 0.2), (100, 0.3, None), (2, None, None), (5, 0.0, 0.5),
                                              (None, 0.5, 0.1), (4, 1.0, 0.0), (0, 0.5, 0.0)])
def test_nms_matches_ort(center, most, iou, score):
    inputs = nms_inputs(2, 3, 40, most, iou, score, bool(center), seed=center)
    graph = check("NonMaxSuppression", inputs, attrs={"center_point_box": center}, opset=11)
    assert eager(graph, {name: value for name, value in inputs if value is not None})


def test_nms_opset_10_of_constants_folds_and_only_the_boxes_and_scores_given():
    inputs = nms_inputs(1, 2, 12, 4, 0.4, 0.3)
    graph = check("NonMaxSuppression", inputs, constants=["boxes", "scores", "most", "iou", "score"], opset=10)
    assert isinstance(graph, opforge.Graph)
    check("NonMaxSuppression", inputs[:2], opset=11)  # no max_output_boxes_per_class: nothing selected
    check("NonMaxSuppression", inputs[:3], opset=11)


def test_nms_of_many_boxes_matches_ort():
    inputs = nms_inputs(2, 4, 500, 50, 0.45, 0.05, seed=3)
    check("NonMaxSuppression", inputs, opset=11)


def test_nms_errors():
    inputs = nms_inputs(1, 2, 6, 3, 0.5, 0.0)
    with pytest.raises(ModelError, match="'center_point_box' is 2"):
        ox.load(model_of("NonMaxSuppression", inputs, attrs={"center_point_box": 2}, opset=11))
    bad = [("boxes", inputs[0][1]), ("scores", inputs[1][1][:, :, :5])]
    with pytest.raises(ModelError, match="disagree on the number of boxes"):
        ox.load(model_of("NonMaxSuppression", bad, opset=11))
    with pytest.raises(ModelError, match=r"must be \[batch, boxes, 4\]"):
        ox.load(model_of("NonMaxSuppression", [("boxes", inputs[0][1][..., :3]), inputs[1]], opset=11))
    loaded = ox.load(model_of("NonMaxSuppression", inputs, opset=11))
    feeds = {name: value for name, value in inputs}
    feeds["iou"] = np.array([1.5], np.float32)
    with pytest.raises(ModelError, match=r"'iou_threshold' is 1.5; it must be in \[0, 1\]"):
        opforge_run(loaded, feeds)


# -- TopK with k computed at run time ------------------------------------------------------------

def test_topk_with_k_computed_from_the_data_runs_node_by_node():
    nodes = [helper.make_node("Greater", ["x", "t"], ["m"]), helper.make_node("Cast", ["m"], ["mi"], to=7),
             helper.make_node("ReduceSum", ["mi"], ["k"], keepdims=1),  # how many are above t: shape [1]
             helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [onnx.ValueInfoProto(name="values"), onnx.ValueInfoProto(name="indices")],
                              initializer=[numpy_helper.from_array(np.float32(0.0), "t")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    loaded = ox.load(model)
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
        assert eager(loaded, {"x": x})
        assert_same(opforge_run(loaded, {"x": x}), ort_run(model, {"x": x}))


# -- a detection head: boxes and scores from a few ops, NonMaxSuppression, the selected boxes gathered ----

def detection_head(features=6, classes=3):
    r = np.random.default_rng(7)
    constants = {
        "w_box": (r.standard_normal((features, 4)) * 2).astype(np.float32),
        "w_cls": r.standard_normal((features, classes)).astype(np.float32),
        "most": np.array([4], np.int64), "iou": np.array([0.3], np.float32), "score": np.array([0.6], np.float32),
        "batch_and_box": np.array([0, 2], np.int64), "one": np.array([1], np.int64), "two": np.array([2], np.int64),
        "axis1": np.array([1], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w_box"], ["boxes"]),                       # [B, N, 4]
        helper.make_node("MatMul", ["x", "w_cls"], ["logits"]),                      # [B, N, C]
        helper.make_node("Transpose", ["logits"], ["logits_t"], perm=[0, 2, 1]),     # [B, C, N]
        helper.make_node("Sigmoid", ["logits_t"], ["scores"]),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "score"], ["selected"],
                         center_point_box=1),                                        # [K, 3]
        helper.make_node("Gather", ["selected", "batch_and_box"], ["where"], axis=1),  # [K, 2]
        helper.make_node("GatherND", ["boxes", "where"], ["picked_boxes"]),          # [K, 4]
        helper.make_node("GatherND", ["scores", "selected"], ["picked_scores"]),     # [K]
        helper.make_node("Slice", ["selected", "one", "two", "axis1"], ["class_column"]),
        helper.make_node("Squeeze", ["class_column", "axis1"], ["classes"]),         # [K]
    ]
    graph = helper.make_graph(
        nodes, "detection_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 20, features])],
        [onnx.ValueInfoProto(name=n) for n in ("picked_boxes", "picked_scores", "classes", "selected")],
        initializer=[numpy_helper.from_array(v, k) for k, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_detection_head_runs_node_by_node_and_matches_ort():
    model = detection_head()
    loaded = ox.load(model)
    assert isinstance(loaded, ox.DynamicModel)
    counts = set()
    for seed, batch in ((0, 1), (5, 2)):
        x = np.random.default_rng(seed).standard_normal((batch, 20, 6)).astype(np.float32)
        assert loaded.mode(x) == "eager"
        got = opforge_run(loaded, {"x": x})
        expected = ort_run(model, {"x": x})
        assert got[3].dtype == np.int64 and got[3].shape == expected[3].shape
        np.testing.assert_array_equal(got[3], expected[3])
        np.testing.assert_array_equal(got[2], expected[2])
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-6)
        counts.add(len(got[3]))
    assert len(counts) == 2  # the two inputs select different numbers of boxes
