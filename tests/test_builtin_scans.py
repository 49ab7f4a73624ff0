"""cumsum and trilu (cumsum.py, trilu.py): kernels against written-out loops
and NumPy for every flag and dtype, errors, empty tensors, unknown dims,
gradients, ONNX CumSum / Trilu converters and exporters against
onnxruntime; and the ONNX Range and EyeLike converters (constants, or
composed from cumsum when EyeLike's dims are known only at run time)."""
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import opforge
import opforge.onnx
from opforge import TensorSpec
from opforge.onnx.export import export
from opforge.runtime.dispatch import select_kernel
from opforge.testing import check_op, gradcheck

ops = opforge.ops


def loop_cumsum(x, axis, exclusive, reverse):
    """Running sums written out index by index (the kernel and the reference are checked against this)."""
    moved = np.moveaxis(x, axis, -1)
    out = np.zeros_like(moved)
    n = moved.shape[-1]
    for index in np.ndindex(moved.shape[:-1]):
        total = moved.dtype.type(0)
        order = range(n - 1, -1, -1) if reverse else range(n)
        for j in order:
            if exclusive:
                out[index + (j,)] = total
                total = total + moved[index + (j,)]
            else:
                total = total + moved[index + (j,)]
                out[index + (j,)] = total
    return np.moveaxis(out, -1, axis)


CUMSUM_SHAPES = [(7,), (3, 4), (2, 3, 5), (1, 1), (3, 0, 2), (0,)]
FLAGS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("exclusive, reverse", FLAGS)
def test_cumsum_agrees_with_a_written_out_scan_on_every_axis(dtype, exclusive, reverse):
    for k, shape in enumerate(CUMSUM_SHAPES):
        x = (np.random.default_rng(k).standard_normal(shape) * 10).astype(dtype)
        for axis in range(-len(shape), len(shape)):
            got = ops.cumsum(x, axis=axis, exclusive=exclusive, reverse=reverse)
            assert got.dtype == x.dtype and got.shape == x.shape
            # summed in the same order, in the same dtype: equal bit for bit
            np.testing.assert_array_equal(got, loop_cumsum(x, axis, exclusive, reverse), err_msg=f"{shape} {axis}")
            checks = check_op(ops.cumsum, x, axis=axis, exclusive=exclusive, reverse=reverse)
            assert all(ok is not False for _, ok, _ in checks), [c for c in checks if c[1] is False]
            if x.size:
                assert [n for n, ok, _ in checks if ok and "agrees with" in n], "no native kernel ran"


@pytest.mark.parametrize("exclusive, reverse", FLAGS)
def test_cumsum_of_large_inputs_split_across_threads_matches_numpy(exclusive, reverse):
    rng = np.random.default_rng(5)
    for shape, axis in [((3, 40_000), 1), ((600, 70), 0), ((4, 300, 1100), 1), ((2, 5, 3000), 2)]:
        x = rng.integers(-1000, 1000, shape).astype(np.int64)
        want = np.cumsum(np.flip(x, axis) if reverse else x, axis=axis)
        if exclusive:
            want = want - (np.flip(x, axis) if reverse else x)
        want = np.flip(want, axis) if reverse else want
        np.testing.assert_array_equal(ops.cumsum(x, axis=axis, exclusive=exclusive, reverse=reverse), want)
        xf = x.astype(np.float64)  # integers in float64: exact sums whatever the order
        np.testing.assert_array_equal(ops.cumsum(xf, axis=axis, exclusive=exclusive, reverse=reverse), want)


def test_cumsum_integers_wrap_on_overflow_as_numpy():
    x = np.array([2**31 - 1, 1, 5], np.int32)
    np.testing.assert_array_equal(ops.cumsum(x, axis=0), np.array([2**31 - 1, -2**31, -2**31 + 5], np.int32))


def test_cumsum_errors_name_op_and_argument():
    with pytest.raises(opforge.ShapeError, match=r"op 'cumsum': attribute 'axis' is 2, out of range .* rank 2"):
        ops.cumsum(np.ones((2, 3)), axis=2)
    with pytest.raises(opforge.ShapeError, match=r"op 'cumsum': input 'x' is 0-d"):
        ops.cumsum(np.ones(()), axis=0)
    with pytest.raises(opforge.DTypeError, match=r"op 'cumsum': input 'x' has dtype bool"):
        ops.cumsum(np.ones(3, bool), axis=0)
    with pytest.raises(opforge.OpforgeError, match="axis"):
        ops.cumsum(np.ones(3))


def test_cumsum_other_dtypes_run_through_the_reference():
    for dtype in ("float16", "uint8", "int16", "uint64"):
        x = np.arange(1, 7, dtype=dtype).reshape(2, 3)
        got = ops.cumsum(x, axis=1, reverse=True)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, loop_cumsum(x, 1, False, True))


@pytest.mark.parametrize("exclusive, reverse", FLAGS)
def test_cumsum_gradient_is_the_reversed_scan_of_dy(exclusive, reverse):
    x = np.random.default_rng(9).standard_normal((3, 5))
    assert gradcheck(ops.cumsum, x, axis=1, exclusive=exclusive, reverse=reverse) < 1e-6
    # d/dx_i of sum_j w_j y_j, written out
    w = np.random.default_rng(10).standard_normal((3, 5))
    got = opforge.grad(lambda v: ops.reduce_sum(ops.mul(ops.cumsum(v, axis=1, exclusive=exclusive,
                                                                   reverse=reverse), w)))(x)
    mask = np.zeros((5, 5))  # mask[i, j]: whether x_i is in y_j's sum
    for i in range(5):
        for j in range(5):
            mask[i, j] = (i > j if reverse else i < j) or (i == j and not exclusive)
    np.testing.assert_allclose(got, w @ mask.T, rtol=1e-12)


def test_cumsum_in_a_traced_graph_with_unknown_dims():
    op = opforge.lookup("cumsum")
    assert op.infer(TensorSpec([None, 4], "int64"), axis=0).shape == (-1, 4)
    assert op.infer(TensorSpec(None, "float32"), axis=3).rank is None
    graph = opforge.trace(lambda x: ops.cumsum(x, axis=0, exclusive=True), TensorSpec([None, 4], "float64"))
    for n in (0, 1, 6):
        x = np.random.default_rng(n).standard_normal((n, 4))
        np.testing.assert_array_equal(graph(x), loop_cumsum(x, 0, True, False))
    assert gradcheck(graph, np.random.default_rng(1).standard_normal((3, 4))) < 1e-6


def cumsum_model(elem, exclusive, reverse, opset=14):
    graph = helper.make_graph(
        [helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)], "cumsum",
        [helper.make_tensor_value_info("x", elem, ["n", 5])], [helper.make_tensor_value_info("y", elem, None)],
        [helper.make_tensor("axis", TensorProto.INT64, [], [-1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("exclusive, reverse", FLAGS)
def test_onnx_cumsum_agrees_with_onnxruntime(dtype, exclusive, reverse):
    x = (np.random.default_rng(3).standard_normal((4, 5)) * 10).astype(dtype)
    for opset in (11, 14):
        model = cumsum_model(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), int(exclusive), int(reverse), opset)
        ours = opforge.onnx.load(model)(x)
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (theirs,) = session.run(None, {"x": x})
        assert ours.dtype == theirs.dtype
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-5)


def test_onnx_cumsum_axis_given_at_run_time_runs_node_by_node():
    graph = helper.make_graph(
        [helper.make_node("CumSum", ["x", "axis"], ["y"])], "cumsum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("axis", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = opforge.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]))
    assert "input 'axis' must be known when the model is loaded" in model.reason
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(model(x, np.array(1)), np.cumsum(x, axis=1))
    np.testing.assert_array_equal(model(x, np.array(0)), np.cumsum(x, axis=0))


def test_cumsum_exports_to_onnx_cumsum():
    graph = opforge.trace(lambda x: ops.cumsum(x, axis=1, exclusive=True, reverse=True),
                          TensorSpec([None, 6], "float32"))
    model = export(graph, opset=14)
    onnx.checker.check_model(model, full_check=True)
    assert [node.op_type for node in model.graph.node] == ["CumSum"]
    x = np.random.default_rng(4).standard_normal((3, 6)).astype(np.float32)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x})[0], graph(x), rtol=1e-6)


# -- trilu -----------------------------------------------------------------------------

TRILU_SHAPES = [(4, 5), (5, 4), (2, 3, 3), (3, 1, 5), (0, 5), (3, 0, 5), (4, 0), (2, 2, 3, 4)]
OFFSETS = [-100, -5, -1, 0, 1, 3, 100, 2**62, -2**62]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "int8", "uint16", "bool", "float16"])
def test_trilu_agrees_with_numpy_triu_and_tril_for_every_dtype(dtype):
    chosen = select_kernel(opforge.lookup("trilu"), [TensorSpec([3, 3], dtype)]).name
    assert chosen == "Trilu", chosen  # one C++ kernel for every element width
    for s, shape in enumerate(TRILU_SHAPES):
        x = (np.random.default_rng(s).standard_normal(shape) * 10).astype(dtype)
        for k in OFFSETS:
            for upper in (True, False):
                got = ops.trilu(x, upper=upper, k=k)
                want = np.triu(x, k) if upper else np.tril(x, k)
                assert got.dtype == x.dtype and got.shape == x.shape
                np.testing.assert_array_equal(got, want, err_msg=f"{shape} k={k} upper={upper}")
        checks = check_op(ops.trilu, x, upper=False, k=1)
        assert all(ok is not False for _, ok, _ in checks), [c for c in checks if c[1] is False]


def test_trilu_of_a_large_batch_across_threads_and_keeps_nan_and_negative_zero_where_kept():
    x = np.random.default_rng(1).standard_normal((6, 300, 400))
    x[:, 5, 7], x[:, 9, 2] = np.nan, -0.0
    for upper, k in [(True, 0), (False, 0), (True, -3), (False, 250)]:
        got = ops.trilu(x, upper=upper, k=k)
        want = np.triu(x, k) if upper else np.tril(x, k)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_trilu_refuses_rank_below_2_and_keeps_unknown_dims():
    with pytest.raises(opforge.ShapeError, match=r"op 'trilu': input 'x' has rank 1; trilu needs rank >= 2"):
        ops.trilu(np.ones(3))
    op = opforge.lookup("trilu")
    assert op.infer(TensorSpec([None, None, 4], "float32"), upper=True, k=0).shape == (-1, -1, 4)
    assert op.infer(TensorSpec(None, "float32"), upper=False, k=1).rank is None
    graph = opforge.trace(lambda x: ops.trilu(x, upper=False), TensorSpec([None, None], "float64"))
    for n in (0, 1, 5):
        x = np.random.default_rng(n).standard_normal((n, n + 2))
        np.testing.assert_array_equal(graph(x), np.tril(x))


@pytest.mark.parametrize("upper, k", [(True, 0), (False, 0), (True, 2), (False, -1)])
def test_trilu_gradient_is_the_same_mask_on_dy(upper, k):
    x = np.random.default_rng(2).standard_normal((2, 4, 5))
    assert gradcheck(ops.trilu, x, upper=upper, k=k) < 1e-6
    w = np.random.default_rng(3).standard_normal((2, 4, 5))
    got = opforge.grad(lambda v: ops.reduce_sum(ops.mul(ops.trilu(v, upper=upper, k=k), w)))(x)
    np.testing.assert_array_equal(got, np.triu(w, k) if upper else np.tril(w, k))
    graph = opforge.trace(lambda v: ops.trilu(v, upper=upper, k=k), TensorSpec([None, 4, 5], "float64"))
    assert gradcheck(graph, x) < 1e-6


def trilu_model(elem, upper, k=None):
    inputs = ["x"] if k is None else ["x", "k"]
    initializers = [] if k is None else [helper.make_tensor("k", TensorProto.INT64, [], [k])]
    graph = helper.make_graph([helper.make_node("Trilu", inputs, ["y"], upper=upper)], "trilu",
                              [helper.make_tensor_value_info("x", elem, ["b", "n", 6])],
                              [helper.make_tensor_value_info("y", elem, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool"])
def test_onnx_trilu_agrees_with_onnxruntime(dtype):
    x = (np.random.default_rng(6).standard_normal((2, 5, 6)) * 10).astype(dtype)
    for upper in (0, 1):
        for k in (None, -2, 0, 3):
            model = trilu_model(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), upper, k)
            ours = opforge.onnx.load(model)(x)
            session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            (theirs,) = session.run(None, {"x": x})
            assert ours.dtype == theirs.dtype
            np.testing.assert_array_equal(ours, theirs, err_msg=f"upper={upper} k={k}")


def test_onnx_trilu_errors():
    graph = helper.make_graph(
        [helper.make_node("Trilu", ["x", "k"], ["y"])], "trilu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = opforge.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]))
    assert "input 'k' must be known when the model is loaded" in model.reason  # k from a graph input: per call
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    np.testing.assert_array_equal(model(x, np.array(1)), np.triu(x, 1))
    graph = helper.make_graph(
        [helper.make_node("Trilu", ["x"], ["y"])], "trilu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(opforge.onnx.ModelError, match="rank 1; Trilu needs rank >= 2"):
        opforge.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]))


def test_trilu_exports_to_onnx_trilu():
    graph = opforge.trace(lambda x: ops.trilu(x, upper=False, k=-1), TensorSpec([None, 4, 4], "float32"))
    model = export(graph, opset=14)
    onnx.checker.check_model(model, full_check=True)
    assert [node.op_type for node in model.graph.node] == ["Trilu"]
    x = np.random.default_rng(4).standard_normal((2, 4, 4)).astype(np.float32)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {session.get_inputs()[0].name: x})[0], graph(x))
    with pytest.raises(opforge.onnx.ModelError, match="Trilu from opset 14"):
        export(graph, opset=13)


# -- Range, EyeLike (ONNX converters: constants, or composed) ---------------------------

def range_model(dtype, start, limit, delta, opset=11):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Range", ["start", "limit", "delta"], ["y"])], "range", [],
        [helper.make_tensor_value_info("y", elem, None)],
        [helper.make_tensor(n, elem, [], [v]) for n, v in (("start", start), ("limit", limit), ("delta", delta))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


RANGES = [("int64", 0, 10, 3), ("int32", 10, -4, -3), ("int64", 5, 5, 1), ("int64", 5, 0, 2),
          ("int64", -2**40, 2**40, 2**39 + 7), ("float32", 0.5, 3.7, 0.3), ("float64", 1.0, -2.0, -0.25),
          ("float32", 0.0, 1.0, 0.1), ("float64", 3.0, 1.0, 0.5)]


@pytest.mark.parametrize("dtype, start, limit, delta", RANGES)
def test_onnx_range_of_constants_is_a_constant_that_agrees_with_onnxruntime(dtype, start, limit, delta):
    model = range_model(dtype, start, limit, delta)
    loaded = opforge.onnx.load(model)
    ours = loaded()
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (theirs,) = session.run(None, {})
    assert ours.dtype == theirs.dtype == np.dtype(dtype) and ours.shape == theirs.shape
    # (onnxruntime adds delta step by step, rounding each time; opforge rounds start + i * delta once)
    np.testing.assert_allclose(ours, theirs, rtol=len(ours) * np.finfo(dtype).eps if ours.dtype.kind == "f" else 0)
    typed = np.dtype(dtype).type
    np.testing.assert_array_equal(ours, np.arange(typed(start).item(), typed(limit).item(), typed(delta).item())
                                  .astype(dtype))


def test_onnx_range_with_values_known_only_at_run_time_runs_node_by_node():
    graph = helper.make_graph(
        [helper.make_node("Range", ["start", "limit", "delta"], ["y"])], "range",
        [helper.make_tensor_value_info("limit", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [helper.make_tensor("start", TensorProto.INT64, [], [0]), helper.make_tensor("delta", TensorProto.INT64, [],
                                                                                     [1])])
    model = opforge.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]))
    assert "length of Range's output depends on its value" in model.reason
    np.testing.assert_array_equal(model(np.int64(4)), [0, 1, 2, 3])
    assert model(np.int64(0)).shape == (0,) and model.mode(np.int64(2)) == "eager"
    with pytest.raises(opforge.onnx.ModelError, match="input 'delta' is 0"):
        opforge.onnx.load(range_model("int64", 0, 4, 0))


def eye_like_model(elem, dims, **attrs):
    graph = helper.make_graph([helper.make_node("EyeLike", ["x"], ["y"], **attrs)], "eye_like",
                              [helper.make_tensor_value_info("x", elem, dims)],
                              [helper.make_tensor_value_info("y", attrs.get("dtype", elem), None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])


@pytest.mark.parametrize("dims", [[3, 5], ["n", "m"], [4, "m"]])
@pytest.mark.parametrize("k", [0, 2, -1, 7])
def test_onnx_eye_like_agrees_with_onnxruntime_with_known_or_unknown_dims(dims, k):
    for elem, attrs in [(TensorProto.FLOAT, {}), (TensorProto.INT32, {"dtype": TensorProto.DOUBLE}),
                        (TensorProto.INT64, {"dtype": TensorProto.INT32})]:
        model = eye_like_model(elem, dims, k=k, **attrs)
        x = np.zeros((3, 5) if dims[0] != 4 else (4, 6), helper.tensor_dtype_to_np_dtype(elem))
        ours = opforge.onnx.load(model)(x)
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (theirs,) = session.run(None, {"x": x})
        assert ours.dtype == theirs.dtype and ours.shape == x.shape
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(ours, np.eye(*x.shape, k=k))


def test_onnx_eye_like_of_unknown_dims_runs_at_every_size_and_refuses_other_ranks():
    loaded = opforge.onnx.load(eye_like_model(TensorProto.FLOAT, ["n", "m"], k=1))
    for shape in [(0, 3), (1, 1), (5, 2), (2, 7)]:
        np.testing.assert_array_equal(loaded(np.ones(shape, np.float32)), np.eye(*shape, k=1, dtype=np.float32))
    for elem in (TensorProto.BOOL, TensorProto.UINT8, TensorProto.FLOAT16, TensorProto.INT8):
        loaded = opforge.onnx.load(eye_like_model(elem, ["n", "m"], k=-1))
        dtype = helper.tensor_dtype_to_np_dtype(elem)
        got = loaded(np.zeros((4, 3), dtype))
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, np.eye(4, 3, k=-1, dtype=dtype))
    with pytest.raises(opforge.onnx.ModelError, match="rank 3; EyeLike takes a matrix"):
        opforge.onnx.load(eye_like_model(TensorProto.FLOAT, [2, 3, 4]))
