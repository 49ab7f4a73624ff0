"""cast: y = x converted to ``dtype``, elementwise (as NumPy's astype).

One C++ library (cast.cc) converts between every pair of ABI dtypes: it
reads the pair from the dtype names at run time, so it is compiled once.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.sbp import partial_sum

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge.dtypes import DTypeLike
    from opforge.sbp import SBPValue

cast = opforge.op("cast(Tensor x, *, DType dtype) -> Tensor y", traits=["no_side_effect", "elementwise"],
                  doc="Elementwise conversion to dtype (NumPy's astype: floats to integers truncate; "
                      "out-of-range values are undefined).")


@cast.infer
def cast_infer(x: TensorSpec, *, dtype: str) -> TensorSpec:
    return TensorSpec(x.shape, dtype, x.layout)


@cast.reference
def cast_reference(x: npt.NDArray[Any], *, dtype: str) -> npt.NDArray[Any]:
    return x.astype(dtype)


def _is_float(dtype: DTypeLike) -> bool:
    return np.dtype(dtype).kind == "f"


@cast.sbp
def cast_sbp(x: TensorSpec, *, dtype: str) -> list[dict[str, SBPValue]]:
    # Beside the elementwise splits: float to float keeps sums (up to rounding); to or from
    # integers each addend would be truncated, and bools do not add.
    return [{"x": partial_sum, "y": partial_sum}] if _is_float(x.dtype) and _is_float(dtype) else []


@cast.grad(save=["x"])
def cast_grad(saved: Any, dy: Any, *, dtype: str) -> Any:
    # Only float-to-float casts carry a gradient; through integers it is zero.
    if not (_is_float(saved.x.dtype) and _is_float(dtype)):
        return None
    return opforge.ops.cast(dy, dtype=saved.x.dtype)


# -O2: the 169 conversion loops compile in a third of -O3's time; the vectorizer
# with its full cost model still makes the loops SIMD (float32 -> float64 ~2.5x).
cast.kernel(source=str(Path(__file__).with_name("cast.cc")), function="Cast",
            cflags=["-O2", "-ftree-vectorize", "-fvect-cost-model=dynamic"])
