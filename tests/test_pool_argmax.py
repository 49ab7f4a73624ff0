"""max_pool, max_pool_with_indices, their gradients (pool.cc's max and vectorised argmax passes, the scatter of
dy) and global_average_pool against
their NumPy references, exactly: ties (small integers), NaN and -inf anywhere in a window, widths past the
vector blocks, the strides and kernels the kernel compiles in and others, padding, dilation, ceil_mode, 1 to 3
spatial dims, at 1 and 2 threads."""
import numpy as np
import pytest

import opforge
from opforge.builtins.average_pool import average_pool_reference
from opforge.builtins.global_average_pool import global_average_pool_reference
from opforge.builtins.max_pool import (max_pool_grad_reference, max_pool_with_indices_grad_reference,
                                       max_pool_with_indices_reference)
from helpers import assert_native

ops = opforge.ops


def tied(shape, dtype, seed, specials=True):
    """Small integers (many ties); for floats some NaN and -inf too, first taps of windows included."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(dtype)
    if specials and np.dtype(dtype).kind == "f":
        x[rng.random(shape) < 0.05] = np.nan
        x[rng.random(shape) < 0.03] = -np.inf
    return x


def full(attrs):
    """The attributes with max_pool's defaults filled in, as the references take them."""
    return dict(dict(strides=[], pads=[], dilations=[], ceil_mode=False), **attrs)


CASES = [  # (x shape, attributes)
    ((2, 3, 21, 37), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),  # ResNet's stem
    ((1, 2, 17, 40), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 2, 9, 45), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ((1, 2, 8, 33), dict(kernel_shape=[2, 2], strides=[1, 1], pads=[0, 1, 0, 0])),
    ((1, 2, 11, 50), dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2], pads=[2, 2, 1, 2])),
    ((1, 2, 10, 52), dict(kernel_shape=[3, 4], strides=[3, 3], pads=[1, 2, 0, 1], ceil_mode=True)),
    ((2, 2, 64), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((1, 2, 5, 6, 41), dict(kernel_shape=[2, 3, 3], strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1])),
    ((1, 1, 3, 3), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[2, 2, 2, 2], ceil_mode=True)),  # padding-only windows
    ((1, 2, 13, 37), dict(kernel_shape=[5, 5], strides=[2, 2], pads=[2, 1, 2, 1])),  # rows folded 3, then 2
]


@pytest.mark.parametrize("shape, attrs", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_pool_argmax_matches_reference_exactly(shape, attrs, dtype, threads):
    x = tied(shape, dtype, seed=len(shape) + shape[-1])
    assert_native("max_pool_with_indices", x)
    want_dx = None
    for order in (0, 1):
        y, indices = ops.max_pool_with_indices(x, storage_order=order, **attrs)
        want_y, want_indices = max_pool_with_indices_reference(x, storage_order=order, **full(attrs))
        np.testing.assert_array_equal(indices, want_indices)
        np.testing.assert_array_equal(y, want_y)  # NaN where NaN
        dy = np.random.default_rng(1).integers(-4, 5, y.shape).astype(dtype)  # sums exact in any order
        want_dx = max_pool_grad_reference(dy, x, storage_order=0, **full(attrs))
        assert_native("max_pool_with_indices_grad", dy, indices, x)
        np.testing.assert_array_equal(ops.max_pool_with_indices_grad(dy, indices, x, storage_order=order, **attrs),
                                      want_dx)
        np.testing.assert_array_equal(  # the reference reads indices of either order too
            max_pool_with_indices_grad_reference(dy, indices, x, storage_order=order, **full(attrs)), want_dx)
    assert_native("max_pool", x)
    np.testing.assert_array_equal(ops.max_pool(x, **attrs), want_y)  # the kernel that tracks no position
    assert_native("max_pool_grad", dy, x)
    np.testing.assert_array_equal(ops.max_pool_grad(dy, x, **attrs), want_dx)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64"])
def test_max_pool_indices_integers(dtype, threads):
    x = tied((2, 2, 13, 35), dtype, seed=3) + (3 if dtype == "uint8" else 0)
    for shape_attrs in CASES[:3]:
        attrs = shape_attrs[1]
        got, want = ops.max_pool_with_indices(x, **attrs), max_pool_with_indices_reference(x, storage_order=0, **full(attrs))
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])


def test_max_pool_grad_past_the_grain(threads):
    """Many planes (the pool splits them) of the stem's shape, every window a different first maximum."""
    x = tied((4, 16, 30, 30), "float32", seed=5, specials=False)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    dy = np.random.default_rng(6).integers(-4, 5, ops.max_pool(x, **attrs).shape).astype("float32")
    np.testing.assert_array_equal(ops.max_pool_grad(dy, x, **attrs),
                                  max_pool_grad_reference(dy, x, storage_order=0, **full(attrs)))


@pytest.mark.parametrize("shape", [(2, 64, 95, 97), (1, 3, 40, 40), (1, 2, 300, 301)],
                         ids=["streamed", "cached", "large-planes"])
def test_max_pool_gradients_large_and_small(shape, threads):
    """Planes are summed in a buffer and written out, past the cache for a dx over 4 MiB (planes of an odd size:
    they start off a 16-byte boundary), copied for a small one; planes over 256 KiB are summed in dx itself.
    Both gradients, every way, against the reference."""
    x = tied(shape, "float32", seed=7, specials=False)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y, indices = ops.max_pool_with_indices(x, **attrs)
    dy = np.random.default_rng(8).integers(-4, 5, y.shape).astype("float32")
    assert_native("max_pool_with_indices_grad", dy, indices, x)
    assert_native("max_pool_grad", dy, x)
    want = max_pool_grad_reference(dy, x, storage_order=0, **full(attrs))
    np.testing.assert_array_equal(ops.max_pool_with_indices_grad(dy, indices, x, **attrs), want)
    np.testing.assert_array_equal(ops.max_pool_grad(dy, x, **attrs), want)


def test_max_pool_with_indices_grad_refuses_an_index_outside_its_plane():
    x = tied((2, 3, 8, 8), "float32", seed=9, specials=False)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    y, indices = ops.max_pool_with_indices(x, **attrs)
    dy = np.ones_like(y)
    info = np.iinfo(np.int64)  # past x; below -1; the next plane's first element (from plane 0); the extremes
    for stray in (64 * 6, -2, 64, info.min, info.max):
        bad = indices.copy()
        bad[0, 0, 1, 1] = stray
        with pytest.raises(opforge.KernelError, match="max_pool_with_indices_grad"):
            ops.max_pool_with_indices_grad(dy, bad, x, **attrs)
        with pytest.raises(opforge.ShapeError, match="outside its own"):
            max_pool_with_indices_grad_reference(dy, bad, x, storage_order=0, **full(attrs))
    with pytest.raises(opforge.DTypeError, match="op 'max_pool_with_indices_grad': inputs 'dy'"):
        ops.max_pool_with_indices_grad(dy.astype(np.float64), indices, x, **attrs)
    with pytest.raises(opforge.DTypeError, match="'indices' has dtype int32"):
        ops.max_pool_with_indices_grad(dy, indices.astype(np.int32), x, **attrs)
    with pytest.raises(opforge.CheckError, match="'indices' has shape"):
        ops.max_pool_with_indices_grad(dy, indices[:, :, :2], x, **attrs)


def test_max_pool_gradients_of_an_empty_batch():
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for dtype in ("float16", "float32"):  # the reference, the kernel
        x = np.zeros((0, 3, 8, 8), dtype)
        y, indices = ops.max_pool_with_indices(x, **attrs)
        assert ops.max_pool_with_indices_grad(y, indices, x, **attrs).shape == x.shape
        assert ops.max_pool_grad(y, x, **attrs).shape == x.shape


def test_first_tap_nan_wins_and_later_nan_never_does():
    x = np.array([[[[np.nan, 1, 2, 3], [4, 5, 6, np.nan]]]], np.float32)  # 1 x 1 x 2 x 4
    y, indices = ops.max_pool_with_indices(x, kernel_shape=[2, 2], strides=[1, 1])
    assert np.isnan(y[0, 0, 0, 0]) and indices[0, 0, 0, 0] == 0  # the first tap
    np.testing.assert_array_equal(y[0, 0, 0, 1:], [6, 6])
    np.testing.assert_array_equal(indices[0, 0, 0, 1:], [6, 6])  # NaN at offset 7 never wins
    np.testing.assert_array_equal(ops.max_pool(x, kernel_shape=[2, 2], strides=[1, 1]), y)


def test_a_nan_in_a_windows_first_row_hides_no_larger_tap_of_a_later_row():
    x = np.array([[[[1, np.nan, 0, 2], [0, 5, 0, 3]]]], np.float32)  # 1 x 1 x 2 x 4
    for op in (ops.max_pool, lambda x, **attrs: ops.max_pool_with_indices(x, **attrs)[0]):
        np.testing.assert_array_equal(op(x, kernel_shape=[2, 2], strides=[2, 2]), [[[[5, 3]]]])


SAME = dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])  # inception's pools: pool.cc's flat-plane path


@pytest.mark.parametrize("shape", [(1, 3, 2, 2), (2, 5, 7, 7), (1, 4, 14, 14), (1, 2, 3, 33), (1, 2, 40, 3)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_3x3_same_pools_match_the_references(shape, dtype, threads):
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    x.flat[::7] = -np.inf  # never a maximum unless the whole window is -inf
    assert_native("average_pool", x)
    for include_pad in (False, True):
        got = ops.average_pool(x.clip(-4, 4), count_include_pad=include_pad, **SAME)
        want = average_pool_reference(x.clip(-4, 4), count_include_pad=include_pad, ceil_mode=False, dilations=[],
                                      **SAME)
        np.testing.assert_allclose(got, want, rtol=2e-6 if dtype == "float32" else 1e-14, atol=1e-6)
    np.testing.assert_array_equal(ops.max_pool(x, **SAME), max_pool_with_indices_reference(
        x, storage_order=0, **full(SAME))[0])
    ints = (x.clip(-4, 4) * 10).astype(np.int32)
    x[0, 0, -1, 0] = np.nan  # one plane with a NaN: the rows' path for that plane, which keeps NaN's rule
    np.testing.assert_array_equal(ops.max_pool(x, **SAME), max_pool_with_indices_reference(
        x, storage_order=0, **full(SAME))[0])
    np.testing.assert_array_equal(ops.max_pool(ints, **SAME), max_pool_with_indices_reference(
        ints, storage_order=0, **full(SAME))[0])


@pytest.mark.parametrize("shape", [(3, 5, 7, 7), (2, 3, 1), (1, 2, 3, 257), (2, 70000), (1, 3, 5000, 3), (2, 3, 0, 4)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_global_average_pool_sizes(shape, dtype, threads):
    """Planes shorter than a vector, longer than a lane block, many planes (past the grain) and empty ones."""
    x = np.random.default_rng(7).uniform(-4, 4, shape).astype(dtype) + 3
    if x.size:
        assert_native("global_average_pool", x)
    got, want = ops.global_average_pool(x), global_average_pool_reference(x) if x.size else None
    if want is None:  # the mean of no elements, as np.mean gives
        want = np.full(shape[:2] + (1,) * (len(shape) - 2), np.nan, dtype)
    tolerance = dict(rtol=2e-6) if dtype == "float32" else dict(rtol=1e-13)
    np.testing.assert_allclose(got, want, **tolerance)
    assert got.shape == want.shape and got.dtype == want.dtype


def test_global_average_pool_many_planes(threads):
    x = np.random.default_rng(8).standard_normal((16, 1024, 7, 7)).astype("float32")
    np.testing.assert_allclose(ops.global_average_pool(x), global_average_pool_reference(x), rtol=2e-6, atol=1e-7)
