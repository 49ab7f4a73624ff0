"""The built-ins the tracer records Python arithmetic as (div, pow, maximum,
minimum, comparisons, where, sqrt, log, abs, cast, slice, squeeze,
unsqueeze, concat, mean, dim): every declared dtype against NumPy through
check_op, inference with unknown dims, bad attributes as typed errors, and
gradients on dynamic shapes.  (Each gradient rule is gradchecked in
test_autodiff.py's GRADCHECKS.)"""
import numpy as np
import pytest

import opforge
from opforge import TensorSpec
from opforge.errors import CheckError, DTypeError, NoKernelError, OpforgeError
from opforge.testing import check_op, gradcheck

ops = opforge.ops
FLOATS = ["float32", "float64"]
NUMERIC = FLOATS + ["int32", "int64"]


def rng(seed=0):
    return np.random.default_rng(seed)


def sample(shape, dtype, seed=0, low=-5, high=5):
    values = rng(seed).uniform(low, high, shape)
    return values.astype(dtype) if np.dtype(dtype).kind == "f" else np.round(values).astype(dtype)


def native_kernels_ran(checks):
    """Names of the native kernels check_op compared with the reference."""
    return [name for name, ok, _ in checks if ok and "agrees with" in name]


# -- binary elementwise ops ------------------------------------------------------

BINARY = {"div": np.true_divide, "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
          "equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
          "greater": np.greater, "greater_equal": np.greater_equal}
FLOAT_ONLY = {"div", "pow"}
SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (3, 1)), ((4,), (2, 1, 4)), ((3, 4), ()), ((), ())]


# Integer inputs to the float-only ops are refused: test_float_only_ops_reject_integers.
@pytest.mark.parametrize("name, dtype", [(name, dtype) for name in BINARY for dtype in NUMERIC
                                         if name not in FLOAT_ONLY or dtype in FLOATS])
def test_binary_op_agrees_with_numpy(name, dtype):
    op = getattr(ops, name)
    for k, (sa, sb) in enumerate(SHAPES):
        low = 0.5 if name == "pow" else -5  # pow: real results only
        a, b = sample(sa, dtype, seed=k, low=low), sample(sb, dtype, seed=k + 10, low=-2 if name == "pow" else -5)
        if name == "div":
            b = np.where(b == 0, np.asarray(1, dtype), b)
        if name not in ("pow", "div") and a.size and b.size:
            a.flat[0] = b.flat[0]  # ties and equal elements occur
        checks = check_op(op, a, b)
        assert native_kernels_ran(checks), f"no native kernel ran for {name} {dtype}"
        want = BINARY[name](a, b)
        got = op(a, b)
        assert got.dtype == (np.bool_ if want.dtype == np.bool_ else np.dtype(dtype))
        np.testing.assert_allclose(got, want.astype(got.dtype), rtol=1e-6 if dtype == "float32" else 1e-12)


def test_maximum_and_minimum_propagate_nan():
    a, b = np.array([1.0, np.nan, 3.0]), np.array([np.nan, 2.0, 1.0])
    np.testing.assert_array_equal(ops.maximum(a, b), np.maximum(a, b))
    np.testing.assert_array_equal(ops.minimum(a, b), np.minimum(a, b))


@pytest.mark.parametrize("name", ["div", "pow", "sqrt", "log"])
def test_float_only_ops_reject_integers(name):
    args = [np.arange(3)] * (2 if name in FLOAT_ONLY else 1)
    with pytest.raises((DTypeError, NoKernelError), match=f"op '{name}'.*int64"):
        getattr(ops, name)(*args)
    with pytest.raises(DTypeError, match=f"op '{name}': input '[ax]' has dtype int32.*floating-point"):
        getattr(ops, name).op.infer(*[TensorSpec([None], "int32")] * len(args))  # at trace time too


def test_binary_ops_take_one_dtype_per_call():
    with pytest.raises(DTypeError, match="op 'maximum'"):
        ops.maximum(np.ones(3, np.float32), np.ones(3, np.float64))


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_inference_with_unknown_dims(name):
    op = getattr(ops, name).op
    y = op.infer(TensorSpec([None, 1, 4]), TensorSpec([3, None]))
    assert y.shape == (-1, 3, 4)
    assert y.dtype == ("bool" if name not in ("div", "pow", "maximum", "minimum") else "float32")
    assert op.infer(TensorSpec(None), TensorSpec([3])).rank is None
    with pytest.raises(OpforgeError, match="do not broadcast"):
        op.infer(TensorSpec([2, 3]), TensorSpec([4]))


def test_comparisons_have_no_gradient():
    assert all("no_grad" in getattr(ops, name).op.traits for name in BINARY if name not in
               ("div", "pow", "maximum", "minimum"))
    _, pullback = opforge.vjp(lambda x: ops.less(x, x * 2.0), np.ones(3))
    with pytest.raises(opforge.GradientError, match="'less' has trait no_grad"):
        pullback(np.ones(3, bool))
    # Through a cast of a comparison, the gradient is zero (the cast stops it).
    step = opforge.grad(lambda x: ops.reduce_sum(ops.cast(ops.less(x, x * 2.0), dtype="float64")))
    np.testing.assert_array_equal(step(np.ones(3)), np.zeros(3))


# -- where -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMERIC + ["bool"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4), (3, 4)), ((4,), (3, 1), ()), ((2, 1, 4), (3, 1), (1, 4)),
                                    ((), (2,), (3, 1))])
def test_where_agrees_with_numpy(dtype, shapes):
    condition = rng(1).random(shapes[0]) > 0.5
    x, y = sample(shapes[1], dtype, seed=2), sample(shapes[2], dtype, seed=3)
    assert native_kernels_ran(check_op(ops.where, condition, x, y))
    np.testing.assert_array_equal(ops.where(condition, x, y), np.where(condition, x, y))


def test_where_inference_and_dtype_errors():
    out = ops.where.op.infer(TensorSpec([None, 1], "bool"), TensorSpec([4], "float64"), TensorSpec([], "float64"))
    assert out == TensorSpec([-1, 4], "float64")
    with pytest.raises(DTypeError, match="'condition' has dtype float32; it must be bool"):
        ops.where.op.infer(TensorSpec([3], "float32"), TensorSpec([3], "float64"), TensorSpec([3], "float64"))
    with pytest.raises((DTypeError, NoKernelError), match="op 'where'"):
        ops.where(np.ones(3, np.float32), np.ones(3), np.ones(3))
    with pytest.raises(DTypeError, match="'x' .float32. and 'y' .float64."):
        ops.where.op.infer(TensorSpec([3], "bool"), TensorSpec([3], "float32"), TensorSpec([3], "float64"))
    with pytest.raises((DTypeError, NoKernelError), match="op 'where'"):
        ops.where(np.ones(3, bool), np.ones(3, np.float32), np.ones(3))


# -- unary ops and cast ----------------------------------------------------------

UNARY = {"sqrt": (np.sqrt, FLOATS, 0.0), "log": (np.log, FLOATS, 0.01), "abs": (np.abs, NUMERIC, -5)}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_op_agrees_with_numpy(name):
    numpy_fn, dtypes, low = UNARY[name]
    op = getattr(ops, name)
    for dtype in dtypes:
        for shape in [(3, 4), (), (0, 2)]:
            x = sample(shape, dtype, low=low)
            check_op(op, x)
            np.testing.assert_allclose(op(x), numpy_fn(x), rtol=1e-6)
        assert op.op.infer(TensorSpec([None, 2], dtype)) == TensorSpec([-1, 2], dtype)


def test_sqrt_and_log_outside_their_domain_give_nan_as_numpy():
    x = np.array([-1.0, 0.0, 4.0])
    with np.errstate(invalid="ignore", divide="ignore"):
        np.testing.assert_array_equal(ops.sqrt(x), np.sqrt(x))
        np.testing.assert_array_equal(ops.log(x), np.log(x))


CAST_DTYPES = list(opforge.dtypes.ABI_DTYPES)  # bfloat16 too, where ml_dtypes is installed


@pytest.mark.parametrize("source", CAST_DTYPES)
def test_cast_between_every_abi_dtype_is_native_and_agrees_with_astype(source):
    x = sample((2, 5), "float64", low=0, high=100).astype(source)  # (negative to unsigned is undefined in C++)
    for target in CAST_DTYPES:
        checks = check_op(ops.cast, x, dtype=target)
        assert native_kernels_ran(checks), (source, target)
        got = ops.cast(x, dtype=target)
        assert got.dtype == np.dtype(target)
        np.testing.assert_array_equal(got, x.astype(target))


def test_cast_inference_and_bad_dtype():
    assert ops.cast.op.infer(TensorSpec([None, 3], "float32"), dtype="int64") == TensorSpec([-1, 3], "int64")
    x = np.arange(4.0)
    with pytest.raises(opforge.AttrError, match="'dtype'"):
        ops.cast(x, dtype="no_such_dtype")


def test_cast_gradient_flows_between_floats_only():
    x = rng().standard_normal((3, 4))
    gradcheck(lambda v: ops.cast(v, dtype="float32"), x, eps=1e-3, rtol=1e-3, atol=1e-3)
    through_int = opforge.grad(lambda v: ops.reduce_sum(ops.cast(ops.cast(v, dtype="int32"), dtype="float64")))
    np.testing.assert_array_equal(through_int(x), np.zeros_like(x))


# -- slice -----------------------------------------------------------------------

SLICES = [  # (starts, ends, axes, steps)
    ([1], [3], [], []),
    ([0, -1], [100, 0], [2, 1], [2, -1]),
    ([-100], [100], [-1], [-3]),
    ([5], [1], [0], [1]),  # empty
    ([2, 1], [-5, 4], [1, 0], [-1, 2]),
    ([9223372036854775807], [-9223372036854775808], [2], [-1]),  # INT64 bounds, as ONNX exporters write
]


@pytest.mark.parametrize("starts, ends, axes, steps", SLICES)
def test_slice_agrees_with_numpy_slicing(starts, ends, axes, steps):
    x = np.arange(60.0).reshape(3, 4, 5)
    index = [slice(None)] * 3
    for k, (s, e) in enumerate(zip(starts, ends)):
        index[axes[k] if axes else k] = slice(s, e, steps[k] if steps else 1)
    for dtype in NUMERIC + ["bool", "int8", "float16"]:  # one library for every dtype
        xs = x.astype(dtype)
        got = ops.slice(xs, starts=starts, ends=ends, axes=axes, steps=steps)
        np.testing.assert_array_equal(got, xs[tuple(index)])
        assert got.dtype == xs.dtype
    checks = check_op(ops.slice, x, starts=starts, ends=ends, axes=axes, steps=steps)
    assert native_kernels_ran(checks) or 0 in x[tuple(index)].shape


def test_slice_and_squeeze_of_a_0d_tensor_say_it_has_no_axes():
    with pytest.raises(CheckError, match="op 'slice': axis 0 in 'axes' is out of range .*it is 0-d and has no axes"):
        ops.slice(np.float64(1.0), starts=[0], ends=[1])
    with pytest.raises(CheckError, match="op 'squeeze': axis 0 is out of range .*it is 0-d and has no axes"):
        ops.squeeze(np.float64(1.0), axes=[0])


def test_slice_inference_keeps_unknown_dims_unknown():
    infer = ops.slice.op.infer
    assert infer(TensorSpec([None, 10]), starts=[1, -3], ends=[2, 100]) == TensorSpec([-1, 3])
    assert infer(TensorSpec([None, 10]), starts=[-2], ends=[-100], axes=[-1], steps=[-1]) == TensorSpec([-1, 9])
    assert infer(TensorSpec(None), starts=[0], ends=[2]).rank is None


@pytest.mark.parametrize("attrs, message", [
    (dict(starts=[0, 1], ends=[2]), "'starts' has 2 entries and 'ends' 1"),
    (dict(starts=[0], ends=[2], axes=[0, 1]), "'axes' has 2 entries and 'starts' 1"),
    (dict(starts=[0], ends=[2], steps=[0]), "'steps' .0. contains 0"),
    (dict(starts=[0], ends=[2], axes=[2]), "axis 2 in 'axes' is out of range for input 'x' of rank 2"),
    (dict(starts=[0, 0], ends=[2, 2], axes=[1, -1]), r"'axes' \[1, -1\] names the same axis more than once"),
])
def test_slice_rejects_bad_attributes(attrs, message):
    with pytest.raises(CheckError, match=f"op 'slice': {message}"):
        ops.slice(np.ones((3, 4)), **attrs)
    with pytest.raises(CheckError, match="op 'slice'"):  # at trace time too
        ops.slice.op.infer(TensorSpec([None, None]), **attrs)


def test_slice_gradient_on_an_unknown_batch():
    graph = opforge.trace(lambda x: ops.slice(x, starts=[-1, 3], ends=[0, 0], axes=[0, 1], steps=[-2, -2]),
                          TensorSpec([None, 4], "float64"))
    backward = opforge.backward(graph)
    for n in (3, 6):
        x = rng(n).standard_normal((n, 4))
        dy = rng(n + 1).standard_normal(np.shape(graph(x)))
        want = np.zeros_like(x)
        want[-1:0:-2, 3:0:-2] = dy
        np.testing.assert_array_equal(backward(x, dy)[0], want)


# -- squeeze and unsqueeze ---------------------------------------------------------

def test_squeeze_and_unsqueeze_agree_with_numpy():
    x = sample((1, 3, 1, 2), "float64")
    for dtype in NUMERIC + ["bool"]:
        xs = x.astype(dtype)
        np.testing.assert_array_equal(ops.squeeze(xs, axes=[0, -2]), np.squeeze(xs, (0, 2)))
        np.testing.assert_array_equal(ops.unsqueeze(xs, axes=[-1, 1]), np.expand_dims(xs, (-1, 1)))
        assert native_kernels_ran(check_op(ops.squeeze, xs, axes=[2]))
        assert native_kernels_ran(check_op(ops.unsqueeze, xs, axes=[0, 5]))
    assert ops.squeeze.op.infer(TensorSpec([None, 1, None]), axes=[1]) == TensorSpec([-1, -1])
    assert ops.squeeze.op.infer(TensorSpec([None, 3]), axes=[0]) == TensorSpec([3])  # size 1 checked at run time
    assert ops.unsqueeze.op.infer(TensorSpec([None, 3]), axes=[0, -1]) == TensorSpec([1, -1, 3, 1])


@pytest.mark.parametrize("op, axes, message", [
    ("squeeze", [1], "axis 1 of input 'x' has size 3; squeeze removes only size-1 axes"),
    ("squeeze", [4], "axis 4 is out of range for input 'x' of rank 4"),
    ("unsqueeze", [1, -5], r"axes \[1, -5\] name the same axis more than once"),
    ("squeeze", [0, -4], r"axes \[0, -4\] name the same axis more than once"),
    ("unsqueeze", [5], r"axis 5 is out of range for output 'y' of rank 5 \(valid: -5..4\)"),
])
def test_squeeze_and_unsqueeze_reject_bad_axes(op, axes, message):
    with pytest.raises(CheckError, match=f"op '{op}': {message}"):
        getattr(ops, op)(np.ones((1, 3, 1, 2)), axes=axes)


# -- concat ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMERIC + ["bool", "float16"])
def test_concat_agrees_with_numpy(dtype):
    a, b, empty = sample((2, 3, 4), dtype), sample((2, 1, 4), dtype, seed=1), np.zeros((2, 0, 4), dtype)
    for inputs, axis in [((a, b, empty, a), 1), ((a, a), 0), ((a, a), -1), ((b,), 2), ((empty, b), -2)]:
        got = ops.concat(*inputs, axis=axis)
        np.testing.assert_array_equal(got, np.concatenate(inputs, axis=axis))
        assert native_kernels_ran(check_op(ops.concat, *inputs, axis=axis))


def test_concat_inference_with_unknown_dims():
    infer = ops.concat.op.infer
    assert infer(TensorSpec([None, 3]), TensorSpec([2, None]), axis=0) == TensorSpec([-1, 3])
    assert infer(TensorSpec([None, 3]), TensorSpec([None, 4]), axis=1) == TensorSpec([-1, 7])
    assert infer(TensorSpec(None), TensorSpec([2, 3]), axis=1) == TensorSpec([2, -1])


@pytest.mark.parametrize("inputs, axis, error, message", [
    ([np.ones((2, 3)), np.ones((3, 3))], 1, CheckError, r"'inputs\[1\]' has shape \[3, 3\].*only along axis 1"),
    ([np.ones((2, 3)), np.ones(3)], 0, CheckError, r"'inputs\[1\]' has rank 1, 'inputs\[0\]' has rank 2"),
    ([np.ones((2, 3)), np.ones((2, 3), np.float32)], 0, DTypeError, r"'inputs\[1\]' has dtype float32"),
    ([np.ones((2, 3))], 2, CheckError, "axis 2 is out of range for inputs of rank 2"),
    ([np.ones(())], 0, CheckError, r"'inputs\[0\]' is 0-d"),
    ([], 0, OpforgeError, "concat"),
])
def test_concat_rejects_mismatched_inputs(inputs, axis, error, message):
    with pytest.raises(error, match=message):
        ops.concat(*inputs, axis=axis)


def test_concat_gradient_with_one_unknown_length():
    graph = opforge.trace(lambda x, y: ops.concat(y, x, y, axis=0),
                          TensorSpec([None, 2], "float64"), TensorSpec([1, 2], "float64"))
    backward = opforge.backward(graph)
    x, y = rng().standard_normal((3, 2)), rng(1).standard_normal((1, 2))
    dout = rng(2).standard_normal((5, 2))
    dx, dy = backward(x, y, dout)
    np.testing.assert_array_equal(dx, dout[1:4])
    np.testing.assert_array_equal(dy, dout[0:1] + dout[4:5])
    graph = opforge.trace(lambda x, y: ops.concat(y, y, x, y, axis=1),
                          TensorSpec([2, None], "float64"), TensorSpec([2, 0], "float64"))
    dx, dy = opforge.backward(graph)(np.ones((2, 3)), np.ones((2, 0)), dout[:2, :2].repeat(2, axis=1)[:, :3])
    np.testing.assert_array_equal(dx, dout[:2, :2].repeat(2, axis=1)[:, :3])
    assert dy.shape == (2, 0)
    two_unknown = opforge.trace(lambda x: ops.concat(x, x, axis=0), TensorSpec([None, 2], "float64"))
    with pytest.raises(opforge.ShapeError, match="op 'concat': its gradient needs"):
        opforge.backward(two_unknown)


# -- mean, dim, and reduce_sum's gradient on unknown dims --------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("attrs", [{}, {"axes": [1]}, {"axes": [0, -1], "keep_dims": True}, {"keep_dims": True}])
def test_mean_agrees_with_numpy(dtype, attrs):
    x = sample((2, 3, 4), dtype)
    axes = tuple(attrs.get("axes", ())) or None
    assert native_kernels_ran(check_op(ops.mean, x, **attrs))
    np.testing.assert_allclose(ops.mean(x, **attrs), np.mean(x, axis=axes, keepdims=attrs.get("keep_dims", False)),
                               rtol=1e-6)


def test_mean_of_nothing_is_nan_and_bad_input_is_refused():
    np.testing.assert_array_equal(ops.mean(np.zeros((0, 3)), axes=[0]), np.full(3, np.nan))
    assert ops.mean.op.infer(TensorSpec([None, 3]), axes=[0]) == TensorSpec([3])
    with pytest.raises(CheckError, match="op 'mean': axis 2 is out of range"):
        ops.mean(np.ones((2, 2)), axes=[2])
    with pytest.raises(DTypeError, match="op 'mean': input 'x' has dtype int32"):
        ops.mean.op.infer(TensorSpec([2], "int32"))


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64"])
def test_dim_reads_the_size_at_run_time(dtype):
    x = np.zeros((3, 0, 5), np.float32)  # empty: dim still runs, reading only the shape
    for axis, size in [(0, 3), (1, 0), (-1, 5)]:
        got = ops.dim(x, axis=axis, dtype=dtype)
        assert got.shape == () and got.dtype == np.dtype(dtype) and got == size
    assert native_kernels_ran(check_op(ops.dim, np.ones((2, 7)), axis=1, dtype=dtype))
    graph = opforge.trace(lambda v: ops.dim(v, axis=0, dtype=dtype), TensorSpec([None, 2]))
    assert graph.outputs[0].spec == TensorSpec([], dtype)
    assert graph(np.ones((6, 2), np.float32)) == 6


def test_dim_rejects_bad_attributes():
    assert "no_grad" not in ops.dim.op.traits  # its rule passes no gradient on, so x * x.shape[0] differentiates
    with pytest.raises(CheckError, match="op 'dim': axis 2 is out of range for input 'x' of rank 2"):
        ops.dim(np.ones((2, 2)), axis=2)
    with pytest.raises(DTypeError, match="op 'dim': attribute 'dtype' is bool"):
        ops.dim(np.ones(2), axis=0, dtype="bool")


REDUCTIONS = {
    "sum_axis": (lambda v: ops.reduce_sum(v, axes=[1]), lambda x, dy: np.broadcast_to(dy[:, None], x.shape)),
    "sum_all": (lambda v: ops.reduce_sum(v), lambda x, dy: np.broadcast_to(dy, x.shape)),
    "sum_keep": (lambda v: ops.reduce_sum(v, axes=[0], keep_dims=True), lambda x, dy: np.broadcast_to(dy, x.shape)),
    "mean_axis": (lambda v: ops.mean(v, axes=[-1]), lambda x, dy: np.broadcast_to(dy[:, None], x.shape) / 3),
    "mean_all": (lambda v: ops.mean(v), lambda x, dy: np.broadcast_to(dy, x.shape) / x.size),
    "mean_batch": (lambda v: ops.mean(v, axes=[0]), lambda x, dy: np.broadcast_to(dy, x.shape) / len(x)),
}


@pytest.mark.parametrize("case", list(REDUCTIONS))
def test_reduction_gradient_of_a_graph_traced_with_an_unknown_batch(case):
    fn, expected = REDUCTIONS[case]
    backward = opforge.backward(opforge.trace(fn, TensorSpec([None, 3], "float64")))
    for n in (2, 5):
        x = rng(n).standard_normal((n, 3))
        dy = rng(n + 1).standard_normal(np.shape(fn(x)))
        np.testing.assert_allclose(backward(x, dy)[0], expected(x, dy), rtol=1e-12)


def test_reduce_sum_gradient_with_several_unknown_dims():
    fn = lambda v: ops.reduce_sum(ops.mul(v, v), axes=[2])  # noqa: E731
    backward = opforge.backward(opforge.trace(fn, TensorSpec([None, None, 3], "float64")))
    x, dy = rng().standard_normal((2, 4, 3)), rng(1).standard_normal((2, 4))
    np.testing.assert_allclose(backward(x, dy)[0], 2 * x * dy[:, :, None], rtol=1e-12)


def test_grad_of_a_reduce_sum_over_a_graph_with_an_unknown_dim():
    graph = opforge.trace(lambda v: ops.reduce_sum(ops.exp(v)), TensorSpec([None, 3], "float64"))
    x = rng().standard_normal((4, 3))
    np.testing.assert_allclose(opforge.grad(graph)(x), np.exp(x), rtol=1e-12)
