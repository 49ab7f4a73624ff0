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


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("dtype", NUMERIC)
def test_binary_op_agrees_with_numpy(name, dtype):
    if name in FLOAT_ONLY and dtype not in FLOATS:
        pytest.skip("floating-point only (see test_float_only_ops_reject_integers)")
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
    with pytest.raises(NoKernelError, match="op 'maximum'"):
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
    with pytest.raises(DTypeError, match="'condition' has dtype float32"):
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


CAST_DTYPES = ["bool", "int8", "uint8", "int32", "int64", "float32", "float64"]


@pytest.mark.parametrize("source", CAST_DTYPES)
def test_cast_between_common_dtypes_is_native_and_agrees_with_astype(source):
    x = sample((2, 5), "float64", low=-3, high=100).astype(source)
    for target in CAST_DTYPES:
        checks = check_op(ops.cast, x, dtype=target)
        assert native_kernels_ran(checks), (source, target)
        got = ops.cast(x, dtype=target)
        assert got.dtype == np.dtype(target)
        np.testing.assert_array_equal(got, x.astype(target))


def test_cast_inference_and_uncommon_dtypes():
    assert ops.cast.op.infer(TensorSpec([None, 3], "float32"), dtype="int64") == TensorSpec([-1, 3], "int64")
    x = np.arange(4, dtype=np.float16)  # no native kernel: the reference serves it
    np.testing.assert_array_equal(ops.cast(x, dtype="int16"), x.astype(np.int16))
    with pytest.raises(opforge.AttrError, match="'dtype'"):
        ops.cast(x, dtype="no_such_dtype")


def test_cast_gradient_flows_between_floats_only():
    x = rng().standard_normal((3, 4))
    gradcheck(lambda v: ops.cast(v, dtype="float32"), x, eps=1e-3, rtol=1e-3, atol=1e-3)
    through_int = opforge.grad(lambda v: ops.reduce_sum(ops.cast(ops.cast(v, dtype="int32"), dtype="float64")))
    np.testing.assert_array_equal(through_int(x), np.zeros_like(x))
