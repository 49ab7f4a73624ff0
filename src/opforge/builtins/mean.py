"""mean: y = x averaged over ``axes`` (all axes when empty), floating-point.

reduce_sum's attributes, check and source (compiled with OPFORGE_MEAN, so
the sums are divided by their counts); the mean of nothing is NaN, as in
NumPy.  The gradient is reduce_sum's, divided by the counts.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import FLOATS, HEADER_DIRS, SIMD_ISAS, every_dtype, floating_point, known_dims, zeros_like
from opforge.builtins.reduce_sum import REDUCE_PLAN, REDUCE_SUM, kept_axes, reduce_sum_check, spread
from opforge.sbp import split
from opforge.spec import UNKNOWN_RANK

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec
    from opforge.sbp import SBPValue

mean = opforge.op("mean(Tensor x, *, int[] axes=[], bool keep_dims=False) -> Tensor y",
                  traits=["no_side_effect"],
                  doc="Mean over axes (empty = all; negative axes count from the end), floating-point. "
                      "The mean of no elements is NaN.")
mean.def_infer(infer.reduce("axes", "keep_dims"))
is_float = floating_point("mean", "x")


@mean.check
def mean_check(x: TensorSpec, *, axes: Sequence[int], keep_dims: bool) -> str | None:
    is_float(x)
    return reduce_sum_check(x, axes=axes, keep_dims=keep_dims)


@mean.sbp
def mean_sbp(x: TensorSpec, *, axes: Sequence[int], keep_dims: bool) -> list[dict[str, SBPValue]]:
    # A split on a kept axis stays a split; the mean over a split axis would need each slice's count.
    return [{"x": split(x_axis), "y": split(y_axis)} for x_axis, y_axis in kept_axes(x, axes, keep_dims)]


@mean.reference
def mean_reference(x: npt.NDArray[Any], *, axes: Sequence[int], keep_dims: bool) -> npt.NDArray[Any]:
    with np.errstate(invalid="ignore", divide="ignore"):  # an empty mean is NaN, without a warning
        total = np.sum(x, axis=tuple(axes) if axes else None, keepdims=keep_dims, dtype=np.float64)
        count = np.sum(np.ones_like(x, np.float64), axis=tuple(axes) if axes else None, keepdims=keep_dims)
        return (total / count).astype(x.dtype)


@mean.grad(save=["x"])
def mean_grad(saved: Any, dy: Any, *, axes: Sequence[int], keep_dims: bool) -> Any:
    x = saved.x
    shape = known_dims(x)
    if -1 not in shape and shape != UNKNOWN_RANK:
        kept = infer.reduce_shape(shape, axes, True)
        count = np.asarray(np.prod(shape) // max(int(np.prod(kept)), 1), dy.dtype)
    else:  # counted at run time: a sum of ones like x
        ones = opforge.ops.add(zeros_like(x, dy.dtype), np.ones((), dy.dtype))
        count = opforge.ops.reduce_sum(ones, axes=axes, keep_dims=keep_dims)
    return spread(opforge.ops.div(dy, count), x, axes, keep_dims)


for isa in SIMD_ISAS:
    mean.kernel(function="ReduceSum", code=REDUCE_PLAN + every_dtype(REDUCE_SUM, "ReduceSum", FLOATS),
                dtypes=[(d,) for d in FLOATS], name="Mean", cflags=["-DOPFORGE_MEAN=1"], isa=isa,
                include_dirs=HEADER_DIRS)
