"""dim: y = x.shape[axis] at run time, a 0-d tensor of ``dtype``.

How graphs traced with unknown dims compute with them: the tracer records
``x.shape[0]`` as this op.  The kernel reads only x's shape, never its data
(so it runs on empty x too), and writes the size in the output's dtype.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec

if TYPE_CHECKING:
    import numpy.typing as npt

dim = opforge.op('dim(Tensor x, *, int axis, DType dtype="int64") -> Tensor y',
                 traits=["no_side_effect"],
                 doc="The size of x along axis at run time, as a 0-d tensor of dtype "
                     "(int32, int64, float32 or float64).")
DTYPES = ["int32", "int64", "float32", "float64"]


@dim.check
def dim_check(x: TensorSpec, *, axis: int, dtype: str) -> str | None:
    if dtype not in DTYPES:
        raise opforge.DTypeError(f"op 'dim': attribute 'dtype' is {dtype}; expected one of {', '.join(DTYPES)}")
    if x.rank is not None and not -x.rank <= axis < x.rank:
        valid = f"valid: {-x.rank}..{x.rank - 1}" if x.rank else "it is 0-d and has no axes"
        return f"axis {axis} is out of range for input 'x' of rank {x.rank} ({valid})"
    return None


@dim.infer
def dim_infer(x: TensorSpec, *, axis: int, dtype: str) -> TensorSpec:
    return TensorSpec((), dtype)


@dim.reference
def dim_reference(x: npt.NDArray[Any], *, axis: int, dtype: str) -> npt.NDArray[Any]:
    return np.asarray(x.shape[axis], dtype)


@dim.grad()
def dim_grad(saved: Any, dy: Any, *, axis: int, dtype: str) -> None:
    return None  # a size does not change with x's values: no gradient reaches x (x * x.shape[0] differentiates)


# One library for every output dtype: dispatch picks kernels by input
# dtypes, so the kernel reads the output's dtype name itself.
dim.kernel(function="Dim", code=r"""
#include <cstring>

#include "custom_aot_extra.h"

template <typename T>
static void Write(void *y, int64_t size) {
  *static_cast<T *>(y) = static_cast<T>(size);
}

extern "C" int Dim(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                   void *stream, void *extra) {
  int64_t axis = static_cast<AotExtra *>(extra)->Attr<int64_t>("axis");
  if (axis < 0) axis += ndims[0];
  if (axis < 0 || axis >= ndims[0]) return 1;  // the op's check rejects this first
  const int64_t size = shapes[0][axis];
  if (!std::strcmp(dtypes[1], "int64")) Write<int64_t>(params[1], size);
  else if (!std::strcmp(dtypes[1], "int32")) Write<int32_t>(params[1], size);
  else if (!std::strcmp(dtypes[1], "float32")) Write<float>(params[1], size);
  else if (!std::strcmp(dtypes[1], "float64")) Write<double>(params[1], size);
  else return 2;
  return 0;
}
""")
