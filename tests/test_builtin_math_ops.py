"""The math built-ins that exported models use beyond the arithmetic ops: the
trigonometric family (trigonometric.py) -- accuracy in ulps on a dense sweep
against a wider reference, special values, dtype errors, empty tensors,
unknown dims in a traced graph, gradients -- and their ONNX converters and
exporters against onnxruntime."""
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import opforge
import opforge.onnx
from opforge import TensorSpec
from opforge.builtins.trigonometric import NAMES, NUMPY_NAMES
from opforge.onnx.export import export
from opforge.runtime.dispatch import select_kernel
from opforge.testing import check_op, gradcheck
from test_kernel_accuracy import ISAS, X32, X64, ulp_error

ops = opforge.ops
TRIGONOMETRIC = list(NAMES)
# max ulps, float32 and float64 alike: the bounds trigonometric.py's doc string states
BOUNDS = {"sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1,
          "sinh": 2, "cosh": 2, "asinh": 2, "acosh": 2, "atanh": 2}
# where each function's gradient is finite, away from its edges
DOMAINS = {"asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9), "acosh": (1.2, 4.0),
           "tan": (-1.2, 1.2)}


def numpy_fn(name):
    return getattr(np, NUMPY_NAMES.get(name, name))


def interior(name, shape, seed):
    low, high = DOMAINS.get(name, (-3.0, 3.0))
    return np.random.default_rng(seed).uniform(low, high, shape)


def kernel_cases():
    """(name, dtype, isa): float32 sin and cos have a vectorized kernel per instruction set, the rest one libm
    kernel for every ISA."""
    for name in TRIGONOMETRIC:
        for dtype in ("float32", "float64"):
            vectorized = name in ("sin", "cos") and dtype == "float32"
            for isa in ISAS if vectorized else ["generic"]:
                yield name, dtype, isa


@pytest.mark.parametrize("name, dtype, isa", list(kernel_cases()))
def test_ulp_bound_on_a_dense_sweep(name, dtype, isa):
    x = X32 if dtype == "float32" else X64[::2]
    opforge.set_isa_cap(isa)
    try:
        chosen = select_kernel(opforge.lookup(name), [TensorSpec.of(x)]).name
        vectorized = name in ("sin", "cos") and dtype == "float32"
        # the C++ kernel, not the NumPy reference
        assert chosen == (f"{name.title()}Float{f'[{isa}]' if isa != 'generic' else ''}<float32>" if vectorized
                          else name.title()), chosen
        got = getattr(ops, name)(x)
    finally:
        opforge.set_isa_cap(None)
    with np.errstate(all="ignore"):
        want = numpy_fn(name)(x.astype(np.float64 if dtype == "float32" else np.longdouble))
    assert got.dtype == x.dtype and got.shape == x.shape
    err = ulp_error(got, want, dtype)
    worst = int(np.argmax(err))
    assert err[worst] <= BOUNDS[name], f"{name} {dtype}: {err[worst]:.3g} ulp at x={x[worst]!r}: {got[worst]!r}"


@pytest.mark.parametrize("isa", ISAS)
def test_float32_sin_and_cos_next_to_multiples_of_half_pi_and_at_the_edge_of_the_fast_range(isa):
    """Where x lies next to k pi/2, r = x - k pi/2 cancels: the floats within 16 ulps of each k pi/2 up to
    2^16 (the range the polynomial serves), and the values around 2^16 where libm takes over."""
    k = np.arange(1, 41_723, dtype=np.float64)
    near = (k * np.pi / 2).astype(np.float32).view(np.int32)[:, None] + np.arange(-16, 17, dtype=np.int32)
    x = near.reshape(-1).view(np.float32)
    edge = np.float32(65536).view(np.int32) + np.arange(-300, 300, dtype=np.int32)
    x = np.concatenate([x, -x, edge.view(np.float32), -edge.view(np.float32)])
    opforge.set_isa_cap(isa)
    try:
        for name, fn in (("sin", np.sin), ("cos", np.cos)):
            got = getattr(ops, name)(x)
            err = ulp_error(got, fn(x.astype(np.longdouble)), "float32")
            worst = int(np.argmax(err))
            assert err[worst] <= 1, f"{name} [{isa}]: {err[worst]:.3g} ulp at x={x[worst]!r}"
    finally:
        opforge.set_isa_cap(None)


def test_results_do_not_depend_on_the_thread_count_or_the_isa(set_threads):
    x = np.random.default_rng(0).uniform(-1e5, 1e5, 300_001).astype(np.float32)  # both paths, several ranges
    x[::1000] = np.float32(3e6)
    set_threads(1)
    one = [getattr(ops, name)(x) for name in ("sin", "cos")]
    set_threads(2)
    two = [getattr(ops, name)(x) for name in ("sin", "cos")]
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    for isa in ISAS:  # (float32 sin and cos: plain multiplies and adds, so every ISA variant rounds alike)
        opforge.set_isa_cap(isa)
        try:
            for name, want in zip(("sin", "cos"), one):
                np.testing.assert_array_equal(getattr(ops, name)(x), want, err_msg=f"{name} [{isa}]")
        finally:
            opforge.set_isa_cap(None)


def test_special_values_follow_numpy():
    for dtype in ("float32", "float64"):
        x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -2.0, 0.5, 1e-30, 800.0], dtype)
        for name in TRIGONOMETRIC:
            got = getattr(ops, name)(x)
            with np.errstate(all="ignore"):
                want = numpy_fn(name)(x)  # (NumPy's float32 sin and cos may be an ulp off: compare in ulps)
            assert np.all(ulp_error(got, want, dtype) <= BOUNDS[name]), f"{name} {dtype}: {got} != {want}"
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name} {dtype}: NaNs")
            numbers = ~np.isnan(want)  # (a NaN's sign bit means nothing)
            np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]),
                                          err_msg=f"{name} {dtype}: signs, -0.0 included")
    assert np.isnan(ops.asin(np.array([2.0]))[0]) and np.isnan(ops.acosh(np.array([0.5]))[0])
    np.testing.assert_array_equal(ops.atanh(np.array([1.0, -1.0])), [np.inf, -np.inf])


@pytest.mark.parametrize("name", TRIGONOMETRIC)
def test_check_op_runs_the_native_kernels_on_every_float_dtype_and_empty_tensors(name):
    for dtype in ("float32", "float64"):
        for shape in [(3, 5), (), (0, 4), (70_001,)]:  # (the last spans several ranges of the pool)
            x = interior(name, shape, 3).astype(dtype)
            checks = check_op(getattr(ops, name), x)
            assert all(ok is not False for _, ok, _ in checks), [c for c in checks if c[1] is False]
            if x.size:
                assert [n for n, ok, _ in checks if ok and "agrees with" in n], f"no native kernel ran for {name}"
            got = getattr(ops, name)(x)
            assert got.dtype == x.dtype and got.shape == shape
            np.testing.assert_allclose(got, numpy_fn(name)(x), rtol=4e-7 if dtype == "float32" else 1e-15)


@pytest.mark.parametrize("name", TRIGONOMETRIC)
def test_integer_and_bool_inputs_are_refused_naming_op_and_input(name):
    for dtype in ("int32", "int64", "bool"):
        with pytest.raises(opforge.DTypeError, match=rf"op '{name}': input 'x' has dtype {dtype}; .*floating-point"):
            getattr(ops, name)(np.ones(3, dtype))


@pytest.mark.parametrize("name", TRIGONOMETRIC)
def test_gradients_match_finite_differences(name):
    x = interior(name, (3, 4), 11)
    assert gradcheck(getattr(ops, name), x) < 1e-6
    # and through a traced graph with an unknown dim (the rule builds ops on traced values)
    graph = opforge.trace(lambda v: getattr(ops, name)(v), TensorSpec([None, 4], "float64"))
    assert gradcheck(graph, x) < 1e-6


def test_hand_derived_gradients_at_chosen_points():
    x = np.array([0.25, 0.5])
    expected = {"sin": np.cos(x), "cos": -np.sin(x), "tan": 1 / np.cos(x) ** 2, "asin": 1 / np.sqrt(1 - x * x),
                "acos": -1 / np.sqrt(1 - x * x), "atan": 1 / (1 + x * x), "sinh": np.cosh(x), "cosh": np.sinh(x),
                "asinh": 1 / np.sqrt(x * x + 1), "atanh": 1 / (1 - x * x)}
    for name, want in expected.items():
        got = opforge.grad(lambda v, f=getattr(ops, name): ops.reduce_sum(f(v)))(x)
        np.testing.assert_allclose(got, want, rtol=1e-14, err_msg=name)
    at = np.array([1.5, 3.0])
    got = opforge.grad(lambda v: ops.reduce_sum(ops.acosh(v)))(at)
    np.testing.assert_allclose(got, 1 / np.sqrt(at * at - 1), rtol=1e-14)


def test_inference_keeps_unknown_dims_and_rank_and_a_traced_graph_runs_any_size():
    for name in TRIGONOMETRIC:
        op = opforge.lookup(name)
        y = op.infer(TensorSpec([None, 3], "float32"))
        assert y.shape == (-1, 3) and y.dtype == "float32"
        assert op.infer(TensorSpec(None, "float64")).rank is None
    # a rotary embedding's core: x * cos(t) + rotate(x) * sin(t), with the sequence length unknown
    graph = opforge.trace(lambda x, t: ops.add(ops.mul(x, ops.cos(t)), ops.mul(x, ops.sin(t))),
                          TensorSpec([None, 8], "float32"), TensorSpec([None, 8], "float32"))
    for n in (0, 1, 17):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
        t = np.random.default_rng(n + 1).uniform(-50, 50, (n, 8)).astype(np.float32)
        np.testing.assert_allclose(graph(x, t), x * np.cos(t) + x * np.sin(t), rtol=1e-6, atol=1e-6)


def test_float16_runs_through_the_reference():
    x = np.linspace(-1, 1, 9).astype(np.float16)
    got = ops.sin(x)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.sin(x))


# -- ONNX ----------------------------------------------------------------------------

def unary_model(op_type, elem, opset):
    graph = helper.make_graph([helper.make_node(op_type, ["x"], ["y"])], op_type.lower(),
                              [helper.make_tensor_value_info("x", elem, ["n", 6])],
                              [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op_type", ["Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
                                     "Atanh"])
def test_onnx_nodes_agree_with_onnxruntime(op_type, dtype):
    name = op_type.lower()
    x = interior(name, (5, 6), 21).astype(dtype)
    for opset in (9, 13, 22):  # the versions before and after opset 22 added bfloat16
        model = unary_model(op_type, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), opset)
        ours = opforge.onnx.load(model)(x)
        assert ours.dtype == np.dtype(dtype) and ours.shape == x.shape
        rtol = {"float16": 1e-3, "float32": 2e-6, "float64": 1e-14}[dtype]
        want = numpy_fn(name)(x.astype(np.float64)).astype(dtype)
        np.testing.assert_allclose(ours, want, rtol=rtol, atol=rtol, err_msg=f"{op_type} opset {opset}")
        if dtype == "float32":  # (onnxruntime's CPU provider has no float16 or float64 kernel for several)
            session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            (theirs,) = session.run(None, {"x": x})
            np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=rtol, err_msg=f"{op_type} opset {opset}")


def test_onnx_integer_input_is_a_model_error():
    model = unary_model("Sin", TensorProto.INT32, 13)
    with pytest.raises(opforge.onnx.ModelError, match="int32"):
        opforge.onnx.load(model)


def test_export_writes_one_node_each_and_onnxruntime_agrees():
    names = TRIGONOMETRIC

    def f(x, y):
        return tuple(getattr(ops, n)(y if n in ("acosh",) else x) for n in names)

    graph = opforge.trace(f, TensorSpec([None, 4], "float32"), TensorSpec([None, 4], "float32"))
    model = export(graph, opset=17)
    onnx.checker.check_model(model, full_check=True)
    assert sorted(node.op_type for node in model.graph.node) == sorted(n.title() for n in names)
    x = interior("asin", (3, 4), 31).astype(np.float32)
    y = interior("acosh", (3, 4), 32).astype(np.float32)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, {i.name: a for i, a in zip(session.get_inputs(), (x, y))}), graph(x, y)):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


# -- cumsum ----------------------------------------------------------------------------

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


def test_onnx_cumsum_axis_computed_at_run_time_is_a_model_error():
    graph = helper.make_graph(
        [helper.make_node("CumSum", ["x", "axis"], ["y"])], "cumsum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("axis", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(opforge.onnx.ModelError, match="input 'axis' must be known when the model is loaded"):
        opforge.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]))


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
    with pytest.raises(opforge.onnx.ModelError, match="input 'k' must be known when the model is loaded"):
        opforge.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]))
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


def test_onnx_range_with_values_known_only_at_run_time_is_a_model_error_naming_why():
    graph = helper.make_graph(
        [helper.make_node("Range", ["start", "limit", "delta"], ["y"])], "range",
        [helper.make_tensor_value_info("limit", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [helper.make_tensor("start", TensorProto.INT64, [], [0]), helper.make_tensor("delta", TensorProto.INT64, [],
                                                                                     [1])])
    with pytest.raises(opforge.onnx.ModelError, match=r"input 'limit' must be known when the model is loaded .* "
                                                      r"length of Range's output depends on its value"):
        opforge.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]))
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
    with pytest.raises(opforge.onnx.ModelError, match="rank 3; EyeLike takes a matrix"):
        opforge.onnx.load(eye_like_model(TensorProto.FLOAT, [2, 3, 4]))


# -- bitwise integer ops ---------------------------------------------------------------------

from opforge.builtins.bitwise import INTEGERS  # noqa: E402

BITWISE_SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((4, 1), (1, 5)), ((), (3,)), ((0, 3), (3,)), ((), ())]


def random_integers(shape, dtype, seed):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def python_shift(x, count, bits, signed, left):
    """ONNX BitShift on Python ints: counts outside [0, bits) give the sign fill (right) or 0 (left)."""
    if not 0 <= count < bits:
        return -1 if (not left and x < 0) else 0
    if not left:
        return x >> count
    v = (x << count) & ((1 << bits) - 1)
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


@pytest.mark.parametrize("dtype", INTEGERS)
def test_bitwise_and_or_xor_not_agree_with_numpy_and_run_native_kernels(dtype):
    for k, (sa, sb) in enumerate(BITWISE_SHAPES):
        a, b = random_integers(sa, dtype, k), random_integers(sb, dtype, k + 20)
        for name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
            got = getattr(ops, name)(a, b)
            want = getattr(np, name)(a, b)
            assert got.dtype == np.dtype(dtype) and got.shape == want.shape
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {sa} {sb}")
            checks = check_op(getattr(ops, name), a, b)
            assert all(ok is not False for _, ok, _ in checks), [c for c in checks if c[1] is False]
            if got.size:
                assert [n for n, ok, _ in checks if ok and "agrees with" in n], f"no native kernel ran for {name}"
        got = ops.bitwise_not(a)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, np.invert(a))


@pytest.mark.parametrize("dtype", INTEGERS)
def test_shifts_follow_onnx_for_every_count_including_negative_and_too_large(dtype):
    info = np.iinfo(dtype)
    x = random_integers((3, 6), dtype, 1)
    x[0, :3] = [info.min, info.max, 0]
    counts = np.arange(-3 if info.min < 0 else 0, info.bits + 3)
    counts = np.resize(counts, (6,)) if counts.size < 6 else counts
    for k in range(0, counts.size, 6):
        c = counts[k:k + 6].astype(dtype)
        if c.size < 6:
            continue
        for name, left in (("left_shift", True), ("right_shift", False)):
            got = getattr(ops, name)(x, c)
            want = np.array([[python_shift(int(v), int(s), info.bits, info.min < 0, left) for v, s in zip(row, c)]
                             for row in x], dtype=dtype)
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} counts {c}")
            ref = opforge.lookup(name).reference_kernel.fn(x, c)
            np.testing.assert_array_equal(ref, want, err_msg=f"{name} reference")


def test_bitwise_errors_name_op_and_input():
    with pytest.raises(opforge.DTypeError, match=r"op 'bitwise_and': input 'a' has dtype float32; .*integer"):
        ops.bitwise_and(np.ones(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(opforge.DTypeError, match=r"op 'left_shift': input 'b' has dtype bool"):
        ops.left_shift(np.ones(3, np.int32), np.ones(3, bool))
    with pytest.raises(opforge.DTypeError, match=r"op 'bitwise_xor': inputs 'a' and 'b' have dtypes int32 and int64"):
        ops.bitwise_xor(np.ones(3, np.int32), np.ones(3, np.int64))
    with pytest.raises(opforge.DTypeError, match=r"op 'bitwise_not': input 'x' has dtype float64"):
        ops.bitwise_not(np.ones(3))
    with pytest.raises(opforge.OpforgeError, match="do not broadcast"):
        ops.bitwise_or(np.ones((2, 3), np.int32), np.ones(4, np.int32))


def test_bitwise_ops_keep_unknown_dims_and_have_no_gradient():
    op = opforge.lookup("bitwise_and")
    y = op.infer(TensorSpec([None, 1, 4], "int64"), TensorSpec([3, None], "int64"))
    assert y.shape == (-1, 3, 4) and y.dtype == "int64"
    assert "no_grad" in op.traits and "no_grad" in opforge.lookup("right_shift").traits
    graph = opforge.trace(lambda a, b: ops.bitwise_not(ops.right_shift(ops.bitwise_xor(a, b), b)),
                          TensorSpec([None, 3], "int32"), TensorSpec([3], "int32"))
    for n in (0, 2, 9):
        a = random_integers((n, 3), "int32", n)
        b = np.array([1, 5, 31], np.int32)
        np.testing.assert_array_equal(graph(a, b), ~((a ^ b) >> b))


def bitwise_model(op_type, elem, shapes, opset, **attrs):
    names = ["x", "y"][:len(shapes)]
    graph = helper.make_graph([helper.make_node(op_type, names, ["z"], **attrs)], op_type.lower(),
                              [helper.make_tensor_value_info(n, elem, s) for n, s in zip(names, shapes)],
                              [helper.make_tensor_value_info("z", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "int8", "int32", "int64"])
def test_onnx_bitwise_nodes_agree_with_onnxruntime(dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x, y = random_integers((2, 3, 4), dtype, 3), random_integers((4,), dtype, 4)
    bits = np.iinfo(dtype).bits
    counts = np.random.default_rng(5).integers(0, bits, (4,)).astype(dtype)  # (onnxruntime: counts in range)
    cases = [("BitwiseAnd", {}, y, 18), ("BitwiseOr", {}, y, 18), ("BitwiseXor", {}, y, 18),
             ("BitShift", {"direction": "LEFT"}, counts, 11), ("BitShift", {"direction": "RIGHT"}, counts, 11)]
    for op_type, attrs, second, opset in cases:
        if op_type == "BitShift" and dtype.startswith("int"):
            continue  # (signed BitShift is opset 28; the conformance cases cover it)
        model = bitwise_model(op_type, elem, [x.shape, second.shape], opset, **attrs)
        ours = opforge.onnx.load(model)(x, second)
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (theirs,) = session.run(None, {"x": x, "y": second})
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{op_type} {attrs}")
    model = bitwise_model("BitwiseNot", elem, [x.shape], 18)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(opforge.onnx.load(model)(x), session.run(None, {"x": x})[0])


def test_onnx_bitshift_errors():
    with pytest.raises(opforge.onnx.ModelError, match="attribute 'direction' is 'UP'"):
        opforge.onnx.load(bitwise_model("BitShift", TensorProto.UINT8, [[3], [3]], 11, direction="UP"))


def test_bitwise_ops_export_to_onnx():
    def f(a, b):
        return ops.bitwise_and(a, b), ops.bitwise_or(a, b), ops.bitwise_xor(a, b), ops.bitwise_not(a), \
            ops.left_shift(a, b), ops.right_shift(a, b)

    graph = opforge.trace(f, TensorSpec([None, 4], "uint32"), TensorSpec([4], "uint32"))
    model = export(graph, opset=18)
    onnx.checker.check_model(model, full_check=True)
    assert sorted(n.op_type for n in model.graph.node) == sorted(
        ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift", "BitShift"])
    a = random_integers((3, 4), "uint32", 7)
    b = np.array([0, 1, 7, 31], np.uint32)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, {i.name: v for i, v in zip(session.get_inputs(), (a, b))}), graph(a, b)):
        np.testing.assert_array_equal(got, want)
    signed = opforge.trace(lambda a, b: ops.right_shift(a, b), TensorSpec([3], "int32"), TensorSpec([3], "int32"))
    with pytest.raises(opforge.onnx.ModelError, match="BitShift of int32 from opset 28"):
        export(signed, opset=18)
