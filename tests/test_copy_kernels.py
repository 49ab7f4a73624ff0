"""The data-movement kernels (pad, slice, expand, tile, constant_of_shape, concat, squeeze, unsqueeze,
reshape, topk, cast) on opforge's thread pool: each agrees exactly with NumPy at 1 and 2 threads on sizes
past the copy grain (256 KiB), with odd shapes, crops, borders, strides and long single rows."""
import numpy as np
import pytest

import opforge
from opforge.builtins.pad import pad_grad_reference, pad_reference
from opforge.builtins.topk import topk_reference
from helpers import assert_native

ops = opforge.ops


def data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-100, 100, shape).astype(dtype)


def same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


PADS = {  # pads on a (3, 70, 301, 33) tensor: borders on every axis, crops, a 1-wide last axis pad
    "borders": [0, 1, 2, 3, 1, 0, 1, 2],
    "crops": [0, -1, 2, -3, 1, 0, -1, 2],
    "last_only": [0, 0, 0, 1, 0, 0, 0, 1],
    "outer_only": [2, 0, 0, 0, 1, 0, 0, 0],
}


@pytest.mark.parametrize("pads", PADS, ids=list(PADS))
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8"])
def test_pad_constant_copies_rows_and_fills_borders(pads, dtype, threads):
    x = data((3, 70, 301, 33), dtype)
    assert_native("pad", x)
    same(ops.pad(x, pads=PADS[pads], value=-2.5), pad_reference(x, pads=PADS[pads], mode="constant", value=-2.5))


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
def test_pad_other_modes_on_threads(mode, threads):
    x = data((5, 301, 67), "float32")
    pads = [1, 3, 2, 0, 2, 5]
    same(ops.pad(x, pads=pads, mode=mode), pad_reference(x, pads=pads, mode=mode, value=0.0))


@pytest.mark.parametrize("pads", PADS, ids=list(PADS))
def test_pad_grad_constant_is_dy_shifted_back(pads, threads):
    x = data((3, 70, 301, 33), "float32")
    y_shape = [n + PADS[pads][k] + PADS[pads][4 + k] for k, n in enumerate(x.shape)]
    dy = data(y_shape, "float32", seed=1)
    assert_native("pad_grad", dy, x)
    same(ops.pad_grad(dy, x, pads=PADS[pads]), pad_grad_reference(dy, x, pads=PADS[pads], mode="constant", value=0))


def test_pad_grad_reflect_adds_repeated_sources(threads):
    x = data((4, 300, 65), "float64")
    pads = [0, 2, 3, 0, 1, 4]
    dy = data([4, 303, 72], "float64", seed=2)
    np.testing.assert_allclose(ops.pad_grad(dy, x, pads=pads, mode="reflect"),
                               pad_grad_reference(dy, x, pads=pads, mode="reflect", value=0), rtol=1e-15)


SLICES = {  # (starts, ends, axes, steps) on a (3, 70, 301, 33) tensor
    "inner_box": ([1, 5], [-3, 300], [1, 2], []),
    "last_axis": ([3], [30], [-1], []),
    "first_axis": ([1], [3], [0], []),
    "steps": ([1, 299], [-3, 2], [1, 2], [2, -3]),
    "reversed_last": ([-1], [-40], [3], [-1]),
}


@pytest.mark.parametrize("case", SLICES, ids=list(SLICES))
@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8"])
def test_slice_and_its_gradient(case, dtype, threads):
    starts, ends, axes, steps = SLICES[case]
    x = data((3, 70, 301, 33), dtype)
    index = [slice(None)] * 4
    for k, (s, e) in enumerate(zip(starts, ends)):
        index[axes[k] % 4] = slice(s, e, steps[k] if steps else 1)
    index = tuple(index)
    assert_native("slice", x)
    same(ops.slice(x, starts=starts, ends=ends, axes=axes, steps=steps), x[index].copy())
    dy = data(x[index].shape, dtype, seed=3)
    want = np.zeros_like(x)
    want[index] = dy
    same(ops.slice_grad(dy, x, starts=starts, ends=ends, axes=axes, steps=steps), want)


@pytest.mark.parametrize("x_shape, shape", [((1, 301, 1), [5, 7, 301, 130]), ((1, 100003), [9, 100003]),
                                            ((257, 1), [257, 1031]), ((3,), [2, 1, 70001, 3])])
def test_expand_on_threads(x_shape, shape, threads):
    x = data(x_shape, "float64")
    assert_native("expand", x)
    same(ops.expand(x, shape=shape), np.broadcast_to(x, np.broadcast_shapes(x_shape, tuple(shape))).copy())


@pytest.mark.parametrize("x_shape, repeats", [((3, 70, 301, 33), [2, 1, 3, 2]), ((1, 90001), [5, 1]),
                                              ((517, 3), [1, 300])])
def test_tile_on_threads(x_shape, repeats, threads):
    x = data(x_shape, "int32")
    same(ops.tile(x, repeats=repeats), np.tile(x, repeats))


@pytest.mark.parametrize("value", [np.array([7], np.int16), np.array([0.0], np.float64), np.array([-0.0], np.float32),
                                   np.array([True])])
def test_constant_of_shape_fills_past_the_grain(value, threads):
    got = ops.constant_of_shape(value, shape=[301, 1003])
    same(got, np.full((301, 1003), value[0], value.dtype))
    assert np.array_equal(np.signbit(got), np.signbit(np.full((301, 1003), value[0])))  # -0.0 keeps its sign


@pytest.mark.parametrize("axis, lengths, other", [(1, [7, 0, 130, 1], (3, 500)), (0, [3, 1, 2], (300, 500)),
                                                  (-1, [512, 511, 1, 3], (2048,))])
def test_concat_short_and_long_rows(axis, lengths, other, threads):
    shapes = []
    for n in lengths:
        shape = list(other)
        shape.insert(axis % (len(other) + 1), n)
        shapes.append(shape)
    xs = [data(s, "float32", seed=k) for k, s in enumerate(shapes)]
    assert_native("concat", *xs)
    same(ops.concat(*xs, axis=axis), np.concatenate(xs, axis=axis))


def test_squeeze_unsqueeze_reshape_copy_on_threads(threads):
    x = data((1, 3, 70001, 1), "float32")
    same(ops.squeeze(x, axes=[0, 3]), x.reshape(3, 70001))
    same(ops.unsqueeze(x, axes=[2]), x.reshape(1, 3, 1, 70001, 1))
    same(ops.reshape(x, shape=[70001, -1]), x.reshape(70001, 3))
    odd = data((100003,), "int8")  # a byte count no piece divides evenly
    same(ops.reshape(odd, shape=[100003, 1]), odd.reshape(100003, 1))


TOPK = [((400, 517), -1, 8), ((400, 517), -1, 200), ((7, 301, 9), 1, 5), ((3000, 40), 0, 70), ((5, 70, 3), -1, 3)]


@pytest.mark.parametrize("shape, axis, k", TOPK)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_selection_matches_the_stable_sort(shape, axis, k, dtype, largest, threads):
    rng = np.random.default_rng(4)
    x = rng.integers(-5, 6, size=shape).astype(dtype)  # many ties: the lower index comes first
    if x.dtype.kind == "f":
        x[rng.random(shape) < 0.05] = np.nan
        x[rng.random(shape) < 0.02] = -np.inf
    assert_native("topk", x)
    values, indices = ops.topk(x, k=k, axis=axis, largest=largest)
    want_values, want_indices = topk_reference(x, k=k, axis=axis, largest=largest, sorted=True)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(indices, want_indices)


@pytest.mark.parametrize("pair", [("float32", "float64"), ("float64", "float32"), ("int32", "float32"),
                                  ("float32", "int64"), ("uint8", "float32")])
def test_cast_on_threads(pair, threads):
    x = data((3, 65536 + 7), pair[0])
    got = ops.cast(x, dtype=pair[1])
    same(got, x.astype(pair[1]))
