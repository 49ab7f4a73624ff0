"""The memory-bound built-in kernels on opforge's thread pool: every one agrees with NumPy at 1 and 2
threads on sizes past its grain (odd sizes, broadcasts, inner, outer and middle axes), reductions give
the same bits on any number of threads, and float32 sums keep NumPy's pairwise accuracy."""
import numpy as np
import pytest

import opforge
from helpers import assert_native

ops = opforge.ops
N = 3 * 65536 + 7  # past every grain, not a multiple of any vector width or block


def data(shape, dtype, seed=0, low=-4, high=4):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(low, high, shape).astype(dtype)
    return rng.integers(low, high + 1, shape).astype(dtype)


UNARY = {  # op: (call, NumPy, dtypes, input range)
    "abs": (ops.abs, np.abs, ["float32", "float64", "int32", "int64"], (-4, 4)),
    "sqrt": (ops.sqrt, np.sqrt, ["float32", "float64"], (0, 9)),
    "log": (ops.log, np.log, ["float32", "float64"], (0.01, 9)),
    "neg": (ops.neg, np.negative, ["float32", "int32", "int64"], (-4, 4)),
    "relu": (ops.relu, lambda x: np.maximum(x, 0), ["float32", "float64", "int32"], (-4, 4)),
    "clip": (lambda x: ops.clip(x, min=-1.5, max=2.0), lambda x: np.clip(x, -1.5, 2.0), ["float32", "float64"], (-4, 4)),
    "leaky_relu": (lambda x: ops.leaky_relu(x, alpha=0.25), lambda x: np.where(x > 0, x, x * 0.25),
                   ["float32", "float64"], (-4, 4)),
}


@pytest.mark.parametrize("name", UNARY)
def test_unary_kernels_agree_with_numpy(name, threads):
    call, numpy_fn, dtypes, (low, high) = UNARY[name]
    for dtype in dtypes:
        x = data((3, N), dtype, low=low, high=high)
        assert_native(name, x)
        got = call(x)
        want = numpy_fn(x).astype(dtype)
        if name == "log":  # libm against NumPy's vectorized log: two roundings apart at most
            np.testing.assert_allclose(got, want, rtol=4e-7 if dtype == "float32" else 1e-15)
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {dtype}")


def test_leaky_relu_streams_large_outputs_on_every_thread(threads):
    x = data(10 * (1 << 20) // 4 + 4099, "float32", seed=1)  # past the streaming size, odd length
    np.testing.assert_array_equal(ops.leaky_relu(x, alpha=0.5), np.where(x > 0, x, x * np.float32(0.5)))
    np.testing.assert_array_equal(ops.leaky_relu(x[1:], alpha=0.5)[-5:], np.where(x > 0, x, x * np.float32(0.5))[-5:])


def test_gradient_kernels_agree_with_numpy(threads):
    dy, x = data(N, "float32", seed=2), data(N, "float32", seed=3)
    np.testing.assert_array_equal(ops.relu_grad(dy, x), np.where(x > 0, dy, 0))
    np.testing.assert_array_equal(ops.leaky_relu_grad(dy, x, alpha=0.5), np.where(x > 0, dy, np.float32(0.5) * dy))


# (shape of a, shape of b): same shapes, scalars on either side, a row, a column, a middle dim, a
# broadcast of both, a short innermost dim.
BROADCASTS = [((5, N // 5), (5, N // 5)), ((N,), ()), ((), (N,)), ((771, 257), (257,)), ((771, 257), (771, 1)),
              ((7, 1, 30011), (1, 5, 1)), ((3, 101, 677), (101, 1)), ((1, 401, 1), (333, 1, 3)), ((70001, 3), (3,))]
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "greater": np.greater, "equal": np.equal,
    "less_equal": np.less_equal,
}


@pytest.mark.parametrize("name", BINARY)
def test_binary_kernels_agree_with_numpy_on_every_broadcast(name, threads):
    dtypes = ["float32", "float64"] if name in ("div", "pow") else ["float32", "int32", "int64"]
    for dtype in dtypes:
        for k, (sa, sb) in enumerate(BROADCASTS):
            a = data(sa, dtype, seed=k, low=0.5 if name == "pow" else -4)
            b = data(sb, dtype, seed=k + 20, low=1 if name in ("div", "pow") else -4, high=3 if name == "pow" else 4)
            assert_native(name, a, b)
            got = getattr(ops, name)(a, b)
            want = BINARY[name](a, b)
            want = want if want.dtype == bool else want.astype(dtype)
            assert got.shape == want.shape and got.dtype == want.dtype, (sa, sb)
            if name == "pow":  # libm's powf against NumPy's: a rounding apart at most
                np.testing.assert_allclose(got, want, rtol=3e-7 if dtype == "float32" else 1e-15)
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {dtype} {sa} {sb}")


def test_nan_propagates_through_maximum_and_minimum_fast_paths(threads):
    a = data(N, "float32", seed=4)
    a[::1001] = np.nan
    for b in (data(N, "float32", seed=5), np.float32(0.5), data((1,), "float32")):
        np.testing.assert_array_equal(ops.maximum(a, b), np.maximum(a, b))
        np.testing.assert_array_equal(ops.minimum(b, a), np.minimum(b, a))


@pytest.mark.parametrize("shapes", [((N,), (N,), (N,)), ((771, 257), (257,), (771, 1)), ((771, 1), (771, 257), ()),
                                    ((7, 1, 30011), (1, 5, 1), (5, 30011)), ((), (N,), (N,))])
def test_where_agrees_with_numpy(shapes, threads):
    sc, sx, sy = shapes
    condition = data(sc, "float32", seed=6) > 0
    for dtype in ("float32", "int64", "bool"):
        x, y = data(sx, "float32", seed=7).astype(dtype), data(sy, "float32", seed=8).astype(dtype)
        assert_native("where", condition, x, y)
        np.testing.assert_array_equal(ops.where(condition, x, y), np.where(condition, x, y))


# (shape, axes): all, inner, outer, middle, inner and outer, every other, long rows with few outputs,
# many rows of a few columns, size-1 dims.
REDUCTIONS = [((N,), []), ((513, 1029), [1]), ((513, 1029), [0]), ((33, 101, 61), [1]), ((33, 101, 61), [0, 2]),
              ((9, 8, 7, 6, 5), [1, 3]), ((3, 70001), [1]), ((3, 70001), [0]), ((70001, 3), [0]), ((100003, 40), [0]),
              ((4, 1, 50001), [0, 1]), ((2, 3, 4), [0, 1, 2])]


@pytest.mark.parametrize("shape,axes", REDUCTIONS)
def test_reductions_agree_with_numpy(shape, axes, threads):
    axis = tuple(axes) if axes else None
    for keep_dims in (False, True):
        for dtype in ("float32", "float64", "int32", "int64"):
            x = data(shape, dtype, seed=len(shape))
            assert_native("reduce_sum", x)
            got = ops.reduce_sum(x, axes=axes, keep_dims=keep_dims)
            if dtype.startswith("int"):
                np.testing.assert_array_equal(got, np.sum(x, axis=axis, keepdims=keep_dims).astype(dtype))
                continue
            exact = np.sum(x.astype(np.float64), axis=axis, keepdims=keep_dims)
            assert got.shape == exact.shape and got.dtype == x.dtype
            tolerance = 1e-5 if dtype == "float32" else 1e-13  # relative to the sum of magnitudes
            scale = np.sum(np.abs(x.astype(np.float64)), axis=axis, keepdims=keep_dims)
            assert np.all(np.abs(got - exact) <= tolerance * scale), (shape, axes, dtype)
            mean = ops.mean(x, axes=axes, keep_dims=keep_dims)
            count = x.size // max(exact.size, 1)
            assert np.all(np.abs(mean - exact / count) <= tolerance * scale / count + 1e-7), (shape, axes, dtype)


def test_int32_sums_wrap_as_numpys_do(threads):
    x = np.full((3, 70001), 2**30, np.int32)
    np.testing.assert_array_equal(ops.reduce_sum(x, axes=[1]), np.sum(x, axis=1).astype(np.int32))
    np.testing.assert_array_equal(ops.reduce_sum(x, axes=[0]), np.sum(x, axis=0).astype(np.int32))


@pytest.mark.parametrize("shape,axes", REDUCTIONS)
def test_reductions_give_the_same_bits_on_any_number_of_threads(shape, axes):
    x = data(shape, "float32", seed=9)
    before = opforge.get_num_threads()
    try:
        results = []
        for count in (1, 2, 3):
            opforge.set_num_threads(count)
            results.append((ops.reduce_sum(x, axes=axes), ops.mean(x, axes=axes)))
    finally:
        opforge.set_num_threads(before)
    for total, mean in results[1:]:
        assert total.tobytes() == results[0][0].tobytes() and mean.tobytes() == results[0][1].tobytes()


def test_float32_sums_are_as_accurate_as_numpys(threads):
    ones = np.ones(1 << 24, np.float32)
    assert ops.reduce_sum(ones) == np.float32(1 << 24)  # a serial float32 sum stops at 2**24 ... exactly here
    assert ops.reduce_sum(np.ones(1 << 24 | 1001, np.float32)) == np.float32((1 << 24) + 1000)  # ... and stays there
    x = np.random.default_rng(10).random(1 << 24, dtype=np.float32)
    exact = np.sum(x, dtype=np.float64)
    error = abs(float(ops.reduce_sum(x)) - exact)
    numpy_error = abs(float(np.sum(x)) - exact)
    serial_error = abs(float(np.cumsum(x)[-1]) - exact)  # one float32 accumulator, element after element
    assert error <= 4 * numpy_error + 2e-7 * exact and error * 100 < serial_error
    columns = x.reshape(1 << 12, 1 << 12)  # down the rows too (NumPy adds those one row after another)
    exact_columns = np.sum(columns, axis=0, dtype=np.float64)
    assert np.max(np.abs(ops.reduce_sum(columns, axes=[0]) - exact_columns) / exact_columns) < 1e-6


TRANSPOSES = [((1001, 777), []), ((3, 301, 517), []), ((5, 6, 7, 301), [3, 1, 0, 2]), ((5, 6, 7, 301), [0, 2, 1, 3]),
              ((64, 1, 3001), [2, 1, 0]), ((301, 301, 3), [1, 0, 2]), ((70001, 3), []), ((N,), [0])]


@pytest.mark.parametrize("shape,perm", TRANSPOSES)
def test_transpose_agrees_with_numpy(shape, perm, threads):
    order = perm or [*range(len(shape) - 2), len(shape) - 1, len(shape) - 2]
    for dtype in ("float32", "float64", "int8", "float16"):
        x = data(shape, "float32", seed=11).astype(dtype)
        np.testing.assert_array_equal(ops.transpose(x, perm=perm), np.transpose(x, order), err_msg=f"{shape} {dtype}")


# (data shape, axis, index count): one block of long rows, several blocks, short rows, few rows (fewer
# than the threads: a range per thread would start past the end), indices along the last axis.
GATHERS = [((4096, 301), 0, 5000), ((3, 700, 257), 1, 900), ((60001, 3), 0, 70001), ((5, 40000), 0, 9),
           ((2, 3, 30001), 2, 40000)]


@pytest.mark.parametrize("shape,axis,count", GATHERS)
def test_gather_and_its_gradient_agree_with_numpy_on_any_number_of_threads(shape, axis, count, set_threads):
    x = data(shape, "float32", seed=12)
    rng = np.random.default_rng(13)
    indices = rng.integers(-shape[axis], shape[axis], count)  # repeated and negative ones
    indices[:3] = indices[0]  # one index three times over: its rows add up
    want = np.take(x, indices, axis=axis)
    dy = data(want.shape, "float32", seed=14)
    assert_native("gather", x, indices)
    assert_native("gather_grad", dy, indices.astype(np.int32), x)
    dx_want = np.zeros_like(x)
    np.add.at(np.moveaxis(dx_want, axis, 0), indices, np.moveaxis(dy, axis, 0))
    grads = []
    for count_threads in (1, 2, 3, 4):
        set_threads(count_threads)
        np.testing.assert_array_equal(ops.gather(x, indices, axis=axis), want)
        grads.append(ops.gather_grad(dy, indices.astype(np.int32), x, axis=axis))
    np.testing.assert_allclose(grads[0], dx_want, rtol=1e-6, atol=1e-6)
    for dx in grads[1:]:  # each element summed in index order on any thread count
        assert dx.tobytes() == grads[0].tobytes()


def test_gather_and_its_gradient_refuse_an_index_out_of_range(threads):
    x = data((4096, 300), "float32", seed=15)
    indices = np.arange(4096)
    indices[-1] = 4096
    with pytest.raises(opforge.KernelError):
        ops.gather_grad(data((4096, 300), "float32", seed=16), indices, x)
    with pytest.raises(opforge.KernelError):
        ops.gather(x, indices)


# Past the grain: planes resampled along both axes, along one (the other's taps made up), the last two axes
# of a rank-3 input, and resampling a leading axis (one axis at a time through buffers, not the plane path).
RESIZES = [((2, 9, 40, 56), dict(scales=[1, 1, 2, 2], mode="linear")),
           ((3, 5, 33, 70), dict(scales=[1, 1, 1, 0.6], mode="cubic", antialias=True)),
           ((70, 40, 30), dict(sizes=[57, 23], axes=[1, 2], mode="nearest")),
           ((6, 40, 300), dict(scales=[1.5, 1, 1], mode="linear")),
           ((4, 8, 40, 56), dict(scales=[1, 1, 1.3, 0.7], mode="linear",
                                 coordinate_transformation_mode="tf_crop_and_resize",
                                 roi=[0, 0, 0.1, 0.2, 1, 1, 0.8, 0.9], extrapolation_value=2.0))]


@pytest.mark.parametrize("shape,attrs", RESIZES)
def test_resize_and_its_gradient_give_the_same_bits_on_any_number_of_threads(shape, attrs, set_threads):
    from opforge.testing import check_op

    x = data(shape, "float32", seed=17)
    dy = data(ops.resize(x, **attrs).shape, "float32", seed=18)
    assert_native("resize", x)
    assert_native("resize_grad", dy, x)
    results = []
    for count in (1, 2, 3):
        set_threads(count)
        results.append((ops.resize(x, **attrs), ops.resize_grad(dy, x, **attrs)))
        if count == 2:  # the kernels against their float64 references
            check_op(ops.resize, x, **attrs)
            check_op(ops.resize_grad, dy, x, **attrs)
    for y, dx in results[1:]:
        assert y.tobytes() == results[0][0].tobytes() and dx.tobytes() == results[0][1].tobytes()


@pytest.mark.parametrize("shape,axis", [((4096, 301), 1), ((301, 4096), 0), ((7, 3001, 5), 1)])
def test_topk_gradient_agrees_with_numpy(shape, axis, threads):
    x = data(shape, "float32", seed=19)
    values, indices = ops.topk(x, k=8, axis=axis)
    dvalues = data(values.shape, "float32", seed=20)
    assert_native("topk_grad", dvalues, indices, x)
    want = np.zeros_like(x)
    np.put_along_axis(want, indices, dvalues, axis=axis)
    np.testing.assert_array_equal(ops.topk_grad(dvalues, indices, x, axis=axis), want)
    indices[-1] = shape[axis]  # past the end: an error, not a write out of bounds
    with pytest.raises(opforge.KernelError):
        ops.topk_grad(dvalues, indices, x, axis=axis)


def test_gradients_of_empty_gathers_and_topks_are_empty(threads):
    dy = np.zeros((0, 2), np.float32)
    dx = ops.gather_grad(dy, np.array([0, 1]), np.zeros((0, 5), np.float32), axis=1)  # no block before the axis
    assert dx.shape == (0, 5)
    assert ops.gather_grad(np.zeros((3, 0), np.float32), np.zeros(0, np.int64), np.ones((3, 4), np.float32),
                           axis=1).tolist() == [[0] * 4] * 3
    x = np.zeros((0, 7), np.float32)
    values, indices = ops.topk(x, k=2, axis=1)
    assert ops.topk_grad(values, indices, x, axis=1).shape == (0, 7)


def test_topk_gradient_refuses_dvalues_of_another_shape():
    x = data((64, 300), "float32", seed=21)
    values, indices = ops.topk(x, k=4, axis=1)
    with pytest.raises(opforge.OpforgeError, match="dvalues"):
        ops.topk_grad(values[:32], indices[:32], x, axis=1)  # fewer rows than x: the kernel would read past them
