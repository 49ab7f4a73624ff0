"""minimum: y = the smaller of a and b, elementwise, with NumPy broadcasting.

Compiles add.py's broadcasting source with its own operation; a NaN on
either side gives NaN, as np.minimum does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST, sum_to
from opforge.builtins.common import GPU_NUMERIC, NUMERIC, SIMD_ISAS, every_dtype, gpu_source, same_dtypes
from opforge.builtins.maximum import split_by

if TYPE_CHECKING:
    import numpy.typing as npt

minimum = opforge.op("minimum(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect", "elementwise"],
                     doc="Elementwise minimum with NumPy broadcasting (NaN propagates); y has the dtype of a.")
minimum.def_infer(infer.broadcast())
minimum.fuse_as("{a} != {a} || {a} < {b} ? {a} : {b}")


@minimum.reference
def minimum_reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.minimum(a, b)
    return y.astype(a.dtype, copy=False)


@minimum.grad(save=["a", "b"])
def minimum_grad(saved: Any, dy: Any) -> tuple[Any, Any]:
    ops = opforge.ops
    da, db = split_by(ops.less(saved.a, saved.b), ops.equal(saved.a, saved.b), dy)
    return sum_to(da, saved.a), sum_to(db, saved.b)


for _isa in SIMD_ISAS:  # wider vectors for the NaN-aware select
    minimum.kernel(function="Binary", code=every_dtype(BINARY_BROADCAST, "Binary", NUMERIC),
                   dtypes=[(d, d) for d in NUMERIC], name="Minimum", isa=_isa,
                   cflags=["-fno-trapping-math", "-DOPFORGE_BINARY(x,y)=((x) != (x) || (x) < (y) ? (x) : (y))"])
minimum.kernel(source=gpu_source("elementwise.cu", "MinimumGpu"), device="gpu",
               dtypes=same_dtypes(GPU_NUMERIC, inputs=2))
