"""gather_elements, scatter_elements, scatter_nd and gather_nd: the kernels against NumPy written out here
(check_op too: every output element written, nothing past the end), every dtype the byte-moving paths take,
each reduction, indices out of range as typed errors (never a crash), bad dtypes and shapes, empty tensors,
inference and traced graphs with unknown dims, and gradients (gradcheck)."""
import numpy as np
import pytest

import opforge
from opforge import TensorSpec
from opforge.errors import CheckError, DTypeError, GradientError, KernelError, OpforgeError
from opforge.testing import check_op, gradcheck

ops = opforge.ops
rng = np.random.default_rng(0)
DTYPES = ["bool", "int8", "uint8", "int16", "float16", "int32", "float32", "int64", "uint64", "float64"]


def sample(shape, dtype="float32"):
    values = rng.standard_normal(shape) * 50
    return np.asarray(values > 0 if dtype == "bool" else values).astype(dtype)


def passed(checks):
    failed = [(name, detail) for name, ok, detail in checks if ok is False]
    assert not failed, failed
    return checks


def infer(fn, *specs, **attrs):
    return fn.op.infer(*specs, **attrs)


# -- gather_elements ----------------------------------------------------------------------

def take_elements(data, indices, axis):
    """y[i] = data[i with coordinate `axis` replaced by indices[i]], element by element."""
    y = np.empty(indices.shape, data.dtype)
    for at in np.ndindex(*indices.shape):
        source = list(at)
        source[axis] = int(indices[at]) % data.shape[axis]
        y[at] = data[tuple(source)]
    return y


ELEMENT_CASES = [((3, 4), (2, 4), 0), ((3, 4), (3, 2), 1), ((3, 4), (2, 3), -1), ((2, 3, 4), (2, 5, 4), 1),
                 ((2, 3, 4), (1, 2, 7), 2), ((5,), (9,), 0), ((2, 3, 4, 2), (2, 1, 3, 2), 0)]


@pytest.mark.parametrize("data_shape,indices_shape,axis", ELEMENT_CASES)
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_gather_elements_matches_numpy(data_shape, indices_shape, axis, index_dtype):
    data = sample(data_shape)
    size = data_shape[axis]
    indices = rng.integers(-size, size, indices_shape).astype(index_dtype)
    got = ops.gather_elements(data, indices, axis=axis)
    np.testing.assert_array_equal(got, take_elements(data, indices, axis % len(data_shape)))
    passed(check_op(ops.gather_elements, data, indices, axis=axis))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_elements_every_dtype(dtype):
    data = sample((3, 5), dtype)
    indices = rng.integers(-3, 3, (4, 5))
    np.testing.assert_array_equal(ops.gather_elements(data, indices), take_elements(data, indices, 0))


def test_gather_elements_out_of_range_and_bad_inputs_are_typed_errors():
    data = sample((3, 4))
    for bad in (3, -4, 2**40):
        indices = np.zeros((2, 4), np.int64)
        indices[1, 2] = bad
        with pytest.raises(KernelError, match="error code 4: input 'indices' holds an index out of range"):
            ops.gather_elements(data, indices)
        with pytest.raises(OpforgeError, match="out of range"):  # the reference says it in words
            ops.gather_elements.op.reference_kernel.fn(data, indices, axis=0)
    with pytest.raises(KernelError):  # data empty along the axis: every index is out of range
        ops.gather_elements(np.zeros((0, 4), np.float32), np.zeros((1, 4), np.int64))
    with pytest.raises(DTypeError, match="'indices'.*int32 or int64"):
        ops.gather_elements(data, np.zeros((2, 4), np.float32))
    with pytest.raises(CheckError, match="rank"):
        ops.gather_elements(data, np.zeros((4,), np.int64))
    with pytest.raises(CheckError, match="larger than data"):
        ops.gather_elements(data, np.zeros((2, 5), np.int64))
    with pytest.raises(CheckError, match="axis 2 is out of range"):
        ops.gather_elements(data, np.zeros((2, 4), np.int64), axis=2)
    with pytest.raises(CheckError, match="0-d"):
        ops.gather_elements(np.float32(1), np.int64(0))


def test_gather_elements_empty():
    assert ops.gather_elements(sample((3, 4)), np.zeros((0, 4), np.int64)).shape == (0, 4)
    assert ops.gather_elements(sample((3, 0)), np.zeros((2, 0), np.int64)).shape == (2, 0)


def test_gather_elements_inference_and_trace_with_unknown_dims():
    spec = infer(ops.gather_elements, TensorSpec([None, 4], "float64"), TensorSpec([2, None], "int32"), axis=0)
    assert spec.shape == (2, -1) and spec.dtype == "float64"
    assert infer(ops.gather_elements, TensorSpec(None), TensorSpec(None, "int64")).rank is None
    graph = opforge.trace(lambda x, i: ops.gather_elements(x, i, axis=1), TensorSpec([None, 5]),
                          TensorSpec([None, None], "int64"))
    data, indices = sample((3, 5)), rng.integers(0, 5, (2, 7))
    np.testing.assert_array_equal(graph(data, indices), take_elements(data, indices, 1))
    with pytest.raises(KernelError, match="error code 4: input 'indices' holds an index out of range"):
        graph(data, np.full((2, 2), 5))
    with pytest.raises(CheckError, match="larger than data"):  # the sizes are checked when they are known
        graph(data, np.zeros((4, 2), np.int64))


def test_gather_elements_gradient_adds_repeated_indices():
    data = rng.standard_normal((3, 4))
    indices = np.array([[0, 0, 2, -1], [0, 1, 2, 2]])
    gradcheck(lambda x: ops.gather_elements(x, indices, axis=0), data)
    gradcheck(lambda x: ops.gather_elements(x, indices[:, :3], axis=1), data)
    # and traced with unknown dims: the zeros the rule scatters into are made at run time
    backward = opforge.backward(opforge.trace(lambda x: ops.gather_elements(x, indices), TensorSpec([None, 4],
                                                                                                 "float64")))
    dy = rng.standard_normal((2, 4))
    want = np.zeros((3, 4))
    np.add.at(want, (indices % 3, np.arange(4)), dy)
    np.testing.assert_allclose(backward(data, dy)[0], want, rtol=1e-12)


# -- scatter_elements ----------------------------------------------------------------------

def put_elements(data, indices, updates, axis, reduction="none"):
    """data with each update written or combined at its place, in order."""
    y = data.copy()
    combine = {"none": lambda a, b: b, "add": lambda a, b: a + b, "mul": lambda a, b: a * b,
               "max": max, "min": min}[reduction]
    for at in np.ndindex(*indices.shape):
        target = list(at)
        target[axis] = int(indices[at]) % data.shape[axis]
        y[tuple(target)] = combine(y[tuple(target)], updates[at])
    return y


@pytest.mark.parametrize("data_shape,indices_shape,axis", ELEMENT_CASES[:3] + ELEMENT_CASES[5:])
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_matches_numpy(data_shape, indices_shape, axis, reduction):
    data = sample(data_shape, "float64")
    size = data_shape[axis]
    indices = rng.integers(-size, size, indices_shape)
    updates = sample(indices_shape, "float64")
    got = ops.scatter_elements(data, indices.astype(np.int32), updates, axis=axis, reduction=reduction)
    np.testing.assert_array_equal(got, put_elements(data, indices, updates, axis % len(data_shape), reduction))
    passed(check_op(ops.scatter_elements, data, indices, updates, axis=axis, reduction=reduction))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_elements_every_dtype(dtype, reduction):
    data, updates = sample((3, 4), dtype), sample((2, 4), dtype)
    indices = np.array([[0, 2, 1, 1], [0, 1, 1, 2]])
    got = ops.scatter_elements(data, indices, updates, reduction=reduction)
    assert got.dtype == data.dtype
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, put_elements(data, indices, updates, 0, reduction))


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_scatter_max_and_min_keep_nans_as_numpy_does(reduction):
    data = np.array([np.nan, 1.0, 2.0, 3.0])
    indices, updates = np.array([0, 1, 2, 2]), np.array([5.0, np.nan, 7.0, -7.0])
    expected = put_elements(data, indices, updates, 0, reduction)
    expected[:2] = np.nan
    np.testing.assert_array_equal(ops.scatter_elements(data, indices, updates, reduction=reduction), expected)
    np.testing.assert_array_equal(ops.scatter_elements.op.reference_kernel.fn(data, indices, updates, axis=0,
                                                                              reduction=reduction), expected)
    np.testing.assert_array_equal(ops.scatter_nd(data, indices[:, None], updates, reduction=reduction), expected)


def test_scatter_elements_repeated_indices_take_the_last_write():
    got = ops.scatter_elements(np.zeros(3, np.float32), np.array([1, 1, 1]), np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(got, [0, 3, 0])


def test_scatter_elements_errors():
    data = sample((3, 4))
    indices = np.array([[0, 3, 1, 1]])
    with pytest.raises(KernelError, match="error code 4: input 'indices' holds an index out of range"):
        ops.scatter_elements(data, indices, sample((1, 4)))
    assert not np.isnan(data).any()
    with pytest.raises(DTypeError, match="'updates'"):
        ops.scatter_elements(data, indices % 3, sample((1, 4), "float64"))
    with pytest.raises(DTypeError, match="'indices'"):
        ops.scatter_elements(data, indices.astype(np.float32), sample((1, 4)))
    with pytest.raises(CheckError, match="'updates'.*indices' shape"):
        ops.scatter_elements(data, indices % 3, sample((1, 3)))
    with pytest.raises(CheckError, match="reduction"):
        ops.scatter_elements(data, indices % 3, sample((1, 4)), reduction="sum")


def test_scatter_elements_empty_and_unknown_dims():
    data = sample((3, 4))
    np.testing.assert_array_equal(ops.scatter_elements(data, np.zeros((0, 4), np.int64), sample((0, 4))), data)
    assert ops.scatter_elements(sample((0, 4)), np.zeros((0, 4), np.int64), sample((0, 4))).shape == (0, 4)
    assert infer(ops.scatter_elements, TensorSpec([None, 4]), TensorSpec([2, None], "int64"),
                 TensorSpec([None, 4])).shape == (-1, 4)
    graph = opforge.trace(lambda d, i, u: ops.scatter_elements(d, i, u, axis=1, reduction="add"),
                          TensorSpec([None, None]), TensorSpec([None, None], "int64"), TensorSpec([None, None]))
    indices, updates = rng.integers(0, 4, (3, 6)), sample((3, 6))
    np.testing.assert_allclose(graph(data, indices, updates), put_elements(data, indices, updates, 1, "add"),
                               rtol=1e-6)


def test_scatter_elements_gradients():
    data, updates = rng.standard_normal((3, 4)), rng.standard_normal((2, 4))
    distinct = np.array([[2, 0, 1, -1], [0, 1, 2, 0]])
    gradcheck(lambda d, u: ops.scatter_elements(d, distinct, u), data, updates)
    gradcheck(lambda d, u: ops.scatter_elements(d, np.ones((2, 4), np.int64), u, reduction="add"), data, updates)
    with pytest.raises(GradientError, match="reduction 'max'"):
        opforge.grad(lambda d: ops.reduce_sum(ops.scatter_elements(d, distinct, updates, reduction="max")))(data)


# -- gather_nd / scatter_nd ------------------------------------------------------------------

def nd_tuples(data_shape, outer, k, batch_dims, dtype="int64"):
    """Random index tuples (negative ones too) of shape outer + (k,), outer starting with the batch dims."""
    columns = [rng.integers(-data_shape[batch_dims + j], data_shape[batch_dims + j], outer) for j in range(k)]
    return np.stack(columns, -1).astype(dtype) if k else np.zeros(outer + (0,), dtype)


def take_nd(data, indices, batch_dims):
    """gather_nd written out: one tuple at a time."""
    outer, k = indices.shape[:-1], indices.shape[-1]
    y = np.empty(outer + data.shape[batch_dims + k:], data.dtype)
    for at in np.ndindex(*outer):
        source = at[:batch_dims] + tuple(int(i) % n for i, n in zip(indices[at], data.shape[batch_dims:]))
        y[at] = data[source]
    return y


def put_nd(data, indices, updates, batch_dims, reduction="none"):
    y = data.copy()
    combine = {"none": lambda a, b: b, "add": np.add, "mul": np.multiply, "max": np.maximum,
               "min": np.minimum}[reduction]
    for at in np.ndindex(*indices.shape[:-1]):
        target = at[:batch_dims] + tuple(int(i) % n for i, n in zip(indices[at], data.shape[batch_dims:]))
        y[target] = combine(y[target], updates[at])
    return y


ND_CASES = [((5,), (3,), 1, 0), ((3, 4), (2, 3), 1, 0), ((3, 4), (5,), 2, 0), ((2, 3, 4), (2, 2), 2, 0),
            ((2, 3, 4), (2, 5), 1, 1), ((2, 3, 4), (2, 3), 1, 2), ((2, 3, 4, 2), (2, 3, 2), 2, 1),
            ((2, 3), (4,), 0, 0), ((2, 3), (2, 1), 0, 1)]


@pytest.mark.parametrize("data_shape,outer,k,batch_dims", ND_CASES)
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_gather_nd_matches_numpy(data_shape, outer, k, batch_dims, index_dtype):
    data = sample(data_shape)
    indices = nd_tuples(data_shape, outer, k, batch_dims, index_dtype)
    got = ops.gather_nd(data, indices, batch_dims=batch_dims)
    np.testing.assert_array_equal(got, take_nd(data, indices, batch_dims))
    passed(check_op(ops.gather_nd, data, indices, batch_dims=batch_dims))


@pytest.mark.parametrize("data_shape,outer,k,batch_dims", ND_CASES)
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_matches_numpy(data_shape, outer, k, batch_dims, reduction):
    data = sample(data_shape, "float64")
    indices = nd_tuples(data_shape, outer, k, batch_dims)
    updates = sample(outer + data_shape[batch_dims + k:], "float64")
    got = ops.scatter_nd(data, indices, updates, reduction=reduction, batch_dims=batch_dims)
    np.testing.assert_array_equal(got, put_nd(data, indices, updates, batch_dims, reduction))
    passed(check_op(ops.scatter_nd, data, indices, updates, reduction=reduction, batch_dims=batch_dims))


@pytest.mark.parametrize("dtype", DTYPES)
def test_nd_ops_every_dtype(dtype):
    data = sample((3, 4), dtype)
    indices = np.array([[2], [0], [2]])
    np.testing.assert_array_equal(ops.gather_nd(data, indices), data[[2, 0, 2]])
    updates = sample((3, 4), dtype)
    for reduction in ("none", "add"):
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(ops.scatter_nd(data, indices, updates, reduction=reduction),
                                          put_nd(data, indices, updates, 0, reduction))


def test_nd_ops_errors():
    data = sample((2, 3, 4))
    for bad in ([2, 0], [0, -4], [0, 2**35]):
        indices = np.array([[1, 1], bad])
        with pytest.raises(KernelError, match="error code 4: input 'indices' holds an index out of range"):
            ops.gather_nd(data, indices)
        with pytest.raises(KernelError, match="error code 4: input 'indices' holds an index out of range"):
            ops.scatter_nd(data, indices, sample((2, 4)))
        with pytest.raises(OpforgeError, match="out of range"):
            ops.gather_nd.op.reference_kernel.fn(data, indices, batch_dims=0)
    with pytest.raises(KernelError):  # an empty dim holds no index
        ops.gather_nd(np.zeros((0, 3), np.float32), np.zeros((1, 1), np.int64))
    with pytest.raises(DTypeError, match="'indices'"):
        ops.gather_nd(data, np.zeros((1, 2), np.float32))
    with pytest.raises(DTypeError, match="'updates'"):
        ops.scatter_nd(data, np.zeros((1, 2), np.int64), sample((1, 4), "float64"))
    with pytest.raises(CheckError, match="tuples of 4 indices"):
        ops.gather_nd(data, np.zeros((1, 4), np.int64))
    with pytest.raises(CheckError, match="batch dim 0"):
        ops.gather_nd(data, np.zeros((3, 1), np.int64), batch_dims=1)
    with pytest.raises(CheckError, match="batch_dims"):
        ops.gather_nd(data, np.zeros((2,), np.int64), batch_dims=1)
    with pytest.raises(CheckError, match="'updates' has shape"):
        ops.scatter_nd(data, np.zeros((1, 2), np.int64), sample((1, 3)))
    with pytest.raises(CheckError, match="reduction"):
        ops.scatter_nd(data, np.zeros((1, 2), np.int64), sample((1, 4)), reduction="prod")


def test_nd_ops_empty_and_unknown_dims():
    data = sample((3, 4))
    assert ops.gather_nd(data, np.zeros((0, 2), np.int64)).shape == (0,)
    np.testing.assert_array_equal(ops.scatter_nd(data, np.zeros((0, 1), np.int64), sample((0, 4))), data)
    assert ops.gather_nd(sample((3, 0)), np.array([[1]])).shape == (1, 0)
    assert infer(ops.gather_nd, TensorSpec([None, 4, 5]), TensorSpec([None, 2], "int64")).shape == (-1, 5)
    assert infer(ops.gather_nd, TensorSpec([2, 4, 5]), TensorSpec([2, None], "int64")).rank is None
    graph = opforge.trace(lambda d, i: ops.gather_nd(d, i), TensorSpec([None, None]), TensorSpec([None, 1], "int64"))
    indices = np.array([[2], [0]])
    np.testing.assert_array_equal(graph(data, indices), data[[2, 0]])
    graph = opforge.trace(lambda d, i, u: ops.scatter_nd(d, i, u, reduction="add"), TensorSpec([None, None]),
                          TensorSpec([None, 2], "int64"), TensorSpec([None]))
    indices, updates = np.array([[2, 3], [2, 3], [0, 0]]), sample((3,))
    np.testing.assert_allclose(graph(data, indices, updates), put_nd(data, indices, updates, 0, "add"), rtol=1e-6)
    with pytest.raises(CheckError, match="'updates' has shape"):  # the sizes are checked when they are known
        graph(data, indices, sample((2,)))


def test_nd_ops_gradients():
    data = rng.standard_normal((2, 3, 4))
    repeated = np.array([[1, 2], [1, 2], [0, -1]])
    gradcheck(lambda d: ops.gather_nd(d, repeated), data)
    gradcheck(lambda d: ops.gather_nd(d, np.array([[[2], [2]], [[0], [1]]]), batch_dims=1), data)
    distinct = np.array([[1, 2], [0, 0]])
    gradcheck(lambda d, u: ops.scatter_nd(d, distinct, u), data, rng.standard_normal((2, 4)))
    gradcheck(lambda d, u: ops.scatter_nd(d, repeated, u, reduction="add"), data, rng.standard_normal((3, 4)))
    with pytest.raises(GradientError, match="reduction 'mul'"):
        opforge.grad(lambda d: ops.reduce_sum(ops.scatter_nd(d, distinct, np.ones((2, 4)), reduction="mul")))(data)
    backward = opforge.backward(opforge.trace(lambda d: ops.gather_nd(d, repeated), TensorSpec([None, 3, 4],
                                                                                            "float64")))
    dy = rng.standard_normal((3, 4))
    want = np.zeros((2, 3, 4))
    np.add.at(want, (repeated[:, 0], repeated[:, 1] % 3), dy)
    np.testing.assert_allclose(backward(data, dy)[0], want, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "int64", "uint64"])
@pytest.mark.parametrize("reduction, ufunc", [("add", np.add), ("mul", np.multiply)])
def test_integer_scatter_reductions_wrap_as_numpy(dtype, reduction, ufunc):
    info = np.iinfo(dtype)
    data = np.array([info.max, info.min, info.max - 1, 3], dtype)
    updates = np.array([[info.max, 2], [info.max, info.max]], dtype)
    indices = np.array([[0, 0], [2, 1]])
    want = data.copy()
    ufunc.at(want, indices.reshape(-1), updates.reshape(-1))
    got = ops.scatter_elements(data, indices.reshape(-1), updates.reshape(-1), reduction=reduction)
    np.testing.assert_array_equal(got, want)
    got_nd = ops.scatter_nd(data, indices.reshape(-1, 1), updates.reshape(-1), reduction=reduction)
    np.testing.assert_array_equal(got_nd, want)
