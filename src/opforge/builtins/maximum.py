"""maximum: y = the larger of a and b, elementwise, with NumPy broadcasting.

Compiles add.py's broadcasting source with its own operation; a NaN on
either side gives NaN, as np.maximum does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST, sum_to
from opforge.builtins.common import GPU_NUMERIC, NUMERIC, SIMD_ISAS, every_dtype, gpu_source, same_dtypes

if TYPE_CHECKING:
    import numpy.typing as npt

maximum = opforge.op("maximum(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect", "elementwise"],
                     doc="Elementwise maximum with NumPy broadcasting (NaN propagates); y has the dtype of a.")
maximum.def_infer(infer.broadcast())
maximum.fuse_as("{a} != {a} || {a} > {b} ? {a} : {b}")


@maximum.reference
def maximum_reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.maximum(a, b)
    return y.astype(a.dtype, copy=False)


def split_by(chosen: Any, tied: Any, dy: Any) -> tuple[Any, Any]:
    """The gradients of a two-way choice: dy goes where the first input was
    chosen, half of it to each side of a tie (as in PyTorch)."""
    ops = opforge.ops
    half = np.full((), 0.5, dy.dtype)
    share = ops.add(ops.cast(chosen, dtype=dy.dtype), ops.mul(ops.cast(tied, dtype=dy.dtype), half))
    first = dy * share
    return first, ops.sub(dy, first)


@maximum.grad(save=["a", "b"])
def maximum_grad(saved: Any, dy: Any) -> tuple[Any, Any]:
    ops = opforge.ops
    da, db = split_by(ops.greater(saved.a, saved.b), ops.equal(saved.a, saved.b), dy)
    return sum_to(da, saved.a), sum_to(db, saved.b)


for _isa in SIMD_ISAS:  # wider vectors for the NaN-aware select
    maximum.kernel(function="Binary", code=every_dtype(BINARY_BROADCAST, "Binary", NUMERIC),
                   dtypes=[(d, d) for d in NUMERIC], name="Maximum", isa=_isa,
                   cflags=["-fno-trapping-math", "-DOPFORGE_BINARY(x,y)=((x) != (x) || (x) > (y) ? (x) : (y))"])
maximum.kernel(source=gpu_source("elementwise.cu", "MaximumGpu"), device="gpu",
               dtypes=same_dtypes(GPU_NUMERIC, inputs=2))
