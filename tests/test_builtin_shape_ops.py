"""transpose (with perm), shape, constant_of_shape, gather, expand, tile and
topk: every native kernel against the NumPy reference (check_op, in checked
mode: every output element written, nothing past the end), the references
against NumPy, byte-moving kernels on every dtype, inference with unknown
dims and ranks, traced graphs, and bad inputs as typed errors.  (Each
gradient rule is gradchecked in test_autodiff.py's GRADCHECKS.)"""
import numpy as np
import pytest

import opforge
from opforge import TensorSpec
from opforge.errors import CheckError, DTypeError, KernelError, ShapeError
from opforge.testing import check_op

ops = opforge.ops
rng = np.random.default_rng(0)
# Every dtype the kernel ABI has: the byte-moving kernels serve them all.
DTYPES = ["bool", "int8", "uint8", "int16", "float16", "int32", "float32", "int64", "uint64", "float64"]


def sample(shape, dtype):
    values = rng.standard_normal(shape) * 50
    return np.asarray(values > 0 if dtype == "bool" else values).astype(dtype)


def assert_checks_pass(checks, ran=True):
    """No check failed; ``ran``: the kernel ran (it is skipped when every output is empty)."""
    failed = [(name, detail) for name, ok, detail in checks if ok is False]
    assert not failed, failed
    assert not ran or any(ok and "matches inference" in name for name, ok, _ in checks)


def infer(fn, *specs, **attrs):
    return fn.op.infer(*specs, **attrs)


# -- transpose ------------------------------------------------------------------------

PERMS = [((3, 4), []), ((2, 3, 4), [2, 0, 1]), ((2, 3, 4, 5), [0, 2, 1, 3]), ((2, 1, 3), [1, 2, 0]),
         ((5,), [0]), ((2, 3, 4, 5, 2), [4, 3, 2, 1, 0]), ((2, 0, 3), [2, 1, 0]), ((2, 3, 4), [0, 1, 2]),
         ((2, 3, 4), [-1, 0, -2]), ((1, 4, 6, 7, 7), [0, 2, 1, 3, 4])]


@pytest.mark.parametrize("shape,perm", PERMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_every_dtype(shape, perm, dtype):
    x = sample(shape, dtype)
    want = np.swapaxes(x, -1, -2) if not perm else np.transpose(x, [p % len(shape) for p in perm])
    got = ops.transpose(x, perm=perm)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,perm", PERMS[:5])
def test_transpose_check_op(shape, perm):
    assert_checks_pass(check_op(ops.transpose, sample(shape, "float32"), perm=perm))


def test_transpose_inference_and_errors():
    assert infer(ops.transpose, TensorSpec([None, 3, 4]), perm=[2, 0, 1]).shape == (4, -1, 3)
    assert infer(ops.transpose, TensorSpec(None), perm=[1, 0]).shape == (-1, -1)
    assert infer(ops.transpose, TensorSpec(None)).rank is None
    with pytest.raises(ShapeError, match="not a permutation"):
        infer(ops.transpose, TensorSpec(None), perm=[1, 1])
    for x, perm, match in [(np.ones(3), [], "rank 1"), (np.ones((3, 2)), [0, 0], "not a permutation"),
                           (np.ones((3, 2)), [0], "has 1 entries"), (np.ones((3, 2)), [0, 2], "out of range")]:
        with pytest.raises(ShapeError, match=match):
            ops.transpose(x, perm=perm)


def test_transpose_traced_with_unknown_dims():
    graph = opforge.trace(lambda x: ops.transpose(x, perm=[1, 2, 0]), TensorSpec([None, 3, None]))
    x = sample((4, 3, 5), "float32")
    np.testing.assert_array_equal(graph(x), np.transpose(x, [1, 2, 0]))


# -- shape / constant_of_shape -------------------------------------------------------

@pytest.mark.parametrize("start,end", [(0, 2**63 - 1), (1, 2**63 - 1), (-1, 2**63 - 1), (0, -1), (5, 9), (-9, 2)])
def test_shape(start, end):
    x = sample((2, 3, 4), "float32")
    got = ops.shape(x, start=start, end=end)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.asarray(x.shape[start:end], np.int64))
    assert_checks_pass(check_op(ops.shape, x, start=start, end=end), ran=got.size > 0)


def test_shape_of_empty_and_0d():
    np.testing.assert_array_equal(ops.shape(np.ones((2, 0), np.int8)), [2, 0])
    assert ops.shape(np.float32(1)).shape == (0,)
    assert infer(ops.shape, TensorSpec(None)).shape == (-1,)
    assert infer(ops.shape, TensorSpec([None, 3]), start=-1).shape == (1,)
    graph = opforge.trace(lambda x: ops.shape(x), TensorSpec([None, None]))
    np.testing.assert_array_equal(graph(np.ones((7, 5), np.float32)), [7, 5])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3), (), (4, 0), (1000,)])
def test_constant_of_shape(dtype, shape):
    value = sample((1,), dtype)
    got = ops.constant_of_shape(value, shape=list(shape))
    assert got.dtype == value.dtype and got.shape == shape
    np.testing.assert_array_equal(got, np.full(shape, value[0], value.dtype))
    assert_checks_pass(check_op(ops.constant_of_shape, value, shape=list(shape)), ran=got.size > 0)


def test_constant_of_shape_keeps_exact_values():
    big = np.array([2**60 + 1], np.int64)
    assert ops.constant_of_shape(big, shape=[3])[2] == 2**60 + 1
    assert ops.constant_of_shape(np.array(0.1), shape=[2])[0] == 0.1  # float64, not rounded to float32
    with pytest.raises(CheckError, match="exactly one element"):
        ops.constant_of_shape(np.ones(2), shape=[2])
    with pytest.raises(CheckError, match="negative"):
        ops.constant_of_shape(np.ones(1), shape=[-1])


# -- gather -------------------------------------------------------------------------------

GATHERS = [((5, 4), (3,), 0), ((2, 5, 3), (2, 2), 1), ((2, 5, 3), (), -1), ((4,), (2, 3), 0), ((3, 0), (2,), 0),
           ((3, 4), (0,), 1)]


@pytest.mark.parametrize("shape,index_shape,axis", GATHERS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_gather_every_dtype(shape, index_shape, axis, dtype, index_dtype):
    x = sample(shape, dtype)
    n = shape[axis]
    indices = rng.integers(-n, n, index_shape).astype(index_dtype)
    got = ops.gather(x, indices, axis=axis)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, np.take(x, indices, axis=axis))


@pytest.mark.parametrize("shape,index_shape,axis", GATHERS[:4])
def test_gather_and_its_gradient_check_op(shape, index_shape, axis):
    x = sample(shape, "float64")
    indices = rng.integers(-shape[axis], shape[axis], index_shape)
    assert_checks_pass(check_op(ops.gather, x, indices, axis=axis))
    dy = sample(np.take(x, indices, axis=axis).shape, "float64")
    assert_checks_pass(check_op(ops.gather_grad, dy, indices, x, axis=axis))


def test_gather_grad_adds_repeated_indices():
    dx = ops.gather_grad(np.array([1.0, 2.0, 4.0], np.float32), np.array([1, -2, 0]), np.zeros(3, np.float32))
    np.testing.assert_array_equal(dx, [4.0, 3.0, 0.0])


def test_gather_errors():
    for bad in (np.array([5]), np.array([-6])):
        with pytest.raises(KernelError):
            ops.gather(np.ones(5), bad)
    with pytest.raises(KernelError):
        ops.gather(np.ones((0, 2)), np.array([0]))  # empty data still checks its indices
    with pytest.raises(DTypeError, match="int32 or int64"):
        ops.gather(np.ones(5), np.array([1.0]))
    with pytest.raises(CheckError, match="out of range"):
        ops.gather(np.ones((2, 3)), np.array([0]), axis=2)
    with pytest.raises(CheckError, match="0-d"):
        ops.gather(np.float32(1), np.array([0]))


def test_gather_inference():
    assert infer(ops.gather, TensorSpec([None, 5, 3]), TensorSpec([2, None], "int64"), axis=1).shape == (-1, 2, -1, 3)
    assert infer(ops.gather, TensorSpec(None), TensorSpec([2], "int64")).rank is None


# -- expand / tile ---------------------------------------------------------------------------

EXPANDS = [((3, 1), (2, 1, 4)), ((3, 4), (4,)), ((1,), (5,)), ((), (2, 3)), ((2, 1, 3), (1,)), ((2, 1, 3), (2, 4, 3)),
           ((1, 1), (3, 0)), ((4, 1, 1, 5), (4, 3, 2, 5)), ((1, 5), (7, 1))]


@pytest.mark.parametrize("x_shape,shape", EXPANDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_expand_every_dtype(x_shape, shape, dtype):
    x = sample(x_shape, dtype)
    got = ops.expand(x, shape=list(shape))
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, np.broadcast_to(x, np.broadcast_shapes(x_shape, shape)))


@pytest.mark.parametrize("x_shape,shape", EXPANDS)
def test_expand_check_op(x_shape, shape):
    x = sample(x_shape, "float32")
    assert_checks_pass(check_op(ops.expand, x, shape=list(shape)), ran=0 not in np.broadcast_shapes(x_shape, shape))


def test_expand_inference_and_errors():
    assert infer(ops.expand, TensorSpec([None, 1]), shape=[4, 1, 5]).shape == (4, -1, 5)
    assert infer(ops.expand, TensorSpec(None), shape=[4]).rank is None
    with pytest.raises(ShapeError, match="does not broadcast"):
        ops.expand(np.ones((3, 2)), shape=[4])
    with pytest.raises(CheckError, match="negative"):
        ops.expand(np.ones(3), shape=[-1])


TILES = [((3, 2), (2, 3)), ((2,), (4,)), ((2, 3, 4), (1, 2, 1)), ((2, 3), (0, 2)), ((2, 3), (1, 1)), ((1, 3), (5, 1)),
         ((0, 3), (2, 2))]


@pytest.mark.parametrize("x_shape,repeats", TILES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_tile_every_dtype(x_shape, repeats, dtype):
    x = sample(x_shape, dtype)
    got = ops.tile(x, repeats=list(repeats))
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, np.tile(x, repeats))


@pytest.mark.parametrize("x_shape,repeats", TILES)
def test_tile_check_op(x_shape, repeats):
    x = sample(x_shape, "float32")
    assert_checks_pass(check_op(ops.tile, x, repeats=list(repeats)), ran=np.tile(x, repeats).size > 0)


def test_tile_inference_errors_and_tracing():
    assert infer(ops.tile, TensorSpec([None, 3]), repeats=[2, 2]).shape == (-1, 6)
    assert infer(ops.tile, TensorSpec(None), repeats=[2, 2]).shape == (-1, -1)
    with pytest.raises(CheckError, match="one per dim"):
        ops.tile(np.ones((2, 3)), repeats=[2])
    with pytest.raises(CheckError, match="negative"):
        ops.tile(np.ones(3), repeats=[-1])
    graph = opforge.trace(lambda x: ops.tile(x, repeats=[2, 1]), TensorSpec([None, 3]))
    x = sample((2, 3), "float32")
    np.testing.assert_array_equal(graph(x), np.tile(x, (2, 1)))


# -- topk ----------------------------------------------------------------------------------------

TOPKS = [((5, 7), -1, 3), ((4, 6, 3), 1, 6), ((4, 6, 3), 0, 0), ((9,), 0, 9), ((3, 8), 0, 1)]


def topk_numpy(x, k, axis, largest):
    """Stable ranking by value (descending when largest), ties in index order, NaN as the largest."""
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    keys = np.where(np.isnan(moved), np.inf, moved)
    rank_nan = np.isnan(moved)
    order = np.empty(moved.shape, np.int64)
    for index in np.ndindex(moved.shape[:-1]):
        items = list(range(moved.shape[-1]))
        if largest:
            items.sort(key=lambda j: (not rank_nan[index][j], -keys[index][j], j))
        else:
            items.sort(key=lambda j: (rank_nan[index][j], keys[index][j], j))
        order[index] = items
    order = order[..., :k]
    values = np.take_along_axis(np.moveaxis(x, axis, -1), order, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(order, -1, axis)


@pytest.mark.parametrize("shape,axis,k", TOPKS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "float16", "uint8", "bool"])
@pytest.mark.parametrize("largest", [True, False])
def test_topk(shape, axis, k, dtype, largest):
    x = rng.integers(-3, 4, shape).astype(dtype)  # many ties
    if x.dtype.kind == "f":
        x.reshape(-1)[::5] = np.nan
    values, indices = ops.topk(x, k=k, axis=axis, largest=largest)
    want_values, want_indices = topk_numpy(x, k, axis, largest)
    assert values.dtype == x.dtype and indices.dtype == np.int64
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(values, want_values)


@pytest.mark.parametrize("shape,axis,k", TOPKS)
def test_topk_and_its_gradient_check_op(shape, axis, k):
    x = sample(shape, "float64")
    assert_checks_pass(check_op(ops.topk, x, k=k, axis=axis), ran=k > 0)
    values, indices = ops.topk(x, k=k, axis=axis)
    dx = ops.topk_grad(np.ones_like(values), indices, x, axis=axis)
    assert dx.sum() == values.size
    assert_checks_pass(check_op(ops.topk_grad, np.ones_like(values), indices, x, axis=axis))


def test_topk_inference_and_errors():
    values, indices = infer(ops.topk, TensorSpec([None, 5]), k=2)
    assert values.shape == (-1, 2) and indices.dtype == "int64"
    assert infer(ops.topk, TensorSpec(None), k=2)[0].rank is None
    with pytest.raises(CheckError, match="only 3 elements"):
        ops.topk(np.ones(3), k=4)
    with pytest.raises(CheckError, match=">= 0"):
        ops.topk(np.ones(3), k=-1)
    with pytest.raises(CheckError, match="0-d"):
        ops.topk(np.float32(1), k=1)
