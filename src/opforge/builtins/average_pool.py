"""average_pool: the mean over sliding windows of an NC + 1..3 spatial-dim tensor (ONNX AveragePool).

max_pool's window attributes and geometry.  ``count_include_pad`` divides
by the taps inside x and its explicit padding; otherwise (the default) by
the taps inside x alone.  Taps past the end padding -- the extra reach of
``ceil_mode`` -- never count.  Floating-point; the kernels are pool.cc's
(float32, float64, summing in double; the 3 x 3 stride-1 "same" pools of
inception modules sum their nine taps in the input's type, a plane at a
time), the gradient ``average_pool_grad`` spreads each dy over its window's
taps.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge.builtins.common import FLOATS, floating_point
from opforge.builtins.max_pool import (GRADIENT_DTYPES, POOL_ATTRS, gradient_op, pool_kernels, pool_params,
                                      pool_problem, pooled_dim, pooled_spec, windows)

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec

AVERAGE_ATTRS = f"{POOL_ATTRS}, bool count_include_pad=False"

average_pool = opforge.op(f"average_pool(Tensor x, *, {AVERAGE_ATTRS}) -> Tensor y", traits=["no_side_effect"],
                          doc="ONNX AveragePool on N x C x spatial (1 to 3 dims): the mean of each window, over "
                              "the taps inside x (or inside x and its padding with count_include_pad).")
is_float = floating_point("average_pool", "x")


@average_pool.check
def average_pool_check(x: TensorSpec, *, kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                       dilations: Sequence[int], ceil_mode: bool, count_include_pad: bool) -> str | None:
    is_float(x)
    return pool_problem("average_pool", x, kernel_shape, strides, pads, dilations)


@average_pool.infer
def average_pool_infer(x: TensorSpec, *, kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                       dilations: Sequence[int], ceil_mode: bool, count_include_pad: bool) -> TensorSpec:
    return pooled_spec(x, kernel_shape, strides, pads, dilations, ceil_mode)


def axis_counts(n: int, out: int, k: int, s: int, pb: int, pe: int, d: int,
                count_include_pad: bool) -> npt.NDArray[np.intp]:
    """Per output along one spatial dim: how many of its taps count (inside x, or inside x and its pads)."""
    low, high = (-pb, n + pe) if count_include_pad else (0, n)
    starts = np.arange(out) * s - pb
    positions = starts[:, None] + np.arange(k)[None, :] * d
    counts: npt.NDArray[np.intp] = ((positions >= low) & (positions < high)).sum(axis=1)
    return counts


def pool_counts(shape: Sequence[int], kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                dilations: Sequence[int], ceil_mode: bool, count_include_pad: bool) -> npt.NDArray[np.int64]:
    """Each window's divisor, shaped (1, 1, *out): a product of per-dim counts."""
    spatial = len(shape) - 2
    count = np.ones((1, 1), np.int64)
    for n, p in zip(shape[2:], pool_params(spatial, kernel_shape, strides, pads, dilations)):
        per_axis = axis_counts(n, pooled_dim(n, *p, ceil_mode), *p, count_include_pad)
        count = count[..., None] * per_axis
    return count


@average_pool.reference(fallback=True)
def average_pool_reference(x: npt.NDArray[Any], *, kernel_shape: Sequence[int], strides: Sequence[int],
                           pads: Sequence[int], dilations: Sequence[int], ceil_mode: bool,
                           count_include_pad: bool) -> npt.NDArray[Any]:
    out, tap, taps, _ = windows(x, kernel_shape, strides, pads, dilations, ceil_mode, 0)
    total = np.zeros(x.shape[:2] + tuple(out), np.float64)
    for offsets in itertools.product(*taps):
        total += tap(offsets)
    count = pool_counts(x.shape, kernel_shape, strides, pads, dilations, ceil_mode, count_include_pad)
    return np.where(count > 0, total / np.maximum(count, 1), 0).astype(x.dtype)


@average_pool.grad(save=["x"])
def average_pool_grad_rule(saved: Any, dy: Any, **attrs: Any) -> Any:
    return opforge.ops.average_pool_grad(dy, saved.x, **attrs)


pool_kernels(average_pool, "AveragePool", [(d,) for d in FLOATS])


# -- the gradient -----------------------------------------------------------------

average_pool_grad = gradient_op("average_pool", AVERAGE_ATTRS, average_pool_check, average_pool_infer,
                                doc="Gradient of average_pool: each dy divided by its window's count and added "
                                    "to the window's taps inside x (x lends only its shape).")


@average_pool_grad.reference(fallback=True)
def average_pool_grad_reference(dy: npt.NDArray[Any], x: npt.NDArray[Any], *, kernel_shape: Sequence[int],
                                strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                                ceil_mode: bool, count_include_pad: bool) -> npt.NDArray[Any]:
    # The adjoint of the window sums: each tap's view of a padded zeros-like-x receives every window's share.
    count = pool_counts(x.shape, kernel_shape, strides, pads, dilations, ceil_mode, count_include_pad)
    share = np.where(count > 0, dy / np.maximum(count, 1), 0)
    _, tap, taps, padded = windows(np.zeros(x.shape), kernel_shape, strides, pads, dilations, ceil_mode, 0)
    for offsets in itertools.product(*taps):
        tap(offsets)[...] += share
    begin = pool_params(x.ndim - 2, kernel_shape, strides, pads, dilations)
    index = (np.s_[:], np.s_[:]) + tuple(np.s_[p[2]: p[2] + n] for p, n in zip(begin, x.shape[2:]))
    return padded[index].astype(dy.dtype)


pool_kernels(average_pool_grad, "AveragePoolGrad", GRADIENT_DTYPES)
