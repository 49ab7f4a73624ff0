"""shape: y = x's dims start:end as a 1-D int64 tensor (ONNX Shape).

``start`` and ``end`` count from the end when negative and are clamped to
0..rank, as ONNX Shape (opset 15) does; the default end is the rank.  The
kernel reads only x's shape, never its data (so it runs on empty x too).
A size does not change with x's values: no gradient reaches x.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec

if TYPE_CHECKING:
    import numpy.typing as npt

INT64_MAX = 2**63 - 1
shape = opforge.op(f"shape(Tensor x, *, int start=0, int end={INT64_MAX}) -> Tensor y",
                   traits=["no_side_effect"],
                   doc="x's dims start:end (negative: from the end; clamped to 0..rank; end defaults to the "
                       "rank) as a 1-D int64 tensor.")


def shape_range(rank: int, start: int, end: int) -> range:
    """The dims start:end of a rank-``rank`` tensor takes (ONNX clamping, which is Python's)."""
    return range(rank)[start:end]


@shape.infer
def shape_infer(x: TensorSpec, *, start: int, end: int) -> TensorSpec:
    if x.rank is None:
        return TensorSpec([-1], "int64")
    return TensorSpec([len(shape_range(x.rank, start, end))], "int64")


@shape.reference
def shape_reference(x: npt.NDArray[Any], *, start: int, end: int) -> npt.NDArray[np.int64]:
    return np.asarray([x.shape[d] for d in shape_range(x.ndim, start, end)], np.int64)


@shape.grad()
def shape_grad(saved: Any, dy: Any, *, start: int, end: int) -> None:
    return None  # sizes do not depend on x's values


shape.kernel(function="Shape", code=r"""
#include <cstdint>

#include "custom_aot_extra.h"

extern "C" int Shape(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const int64_t rank = ndims[0];
  int64_t start = extra->Attr<int64_t>("start"), end = extra->Attr<int64_t>("end");
  if (start < 0) start = start < -rank ? 0 : start + rank;
  if (end < 0) end = end < -rank ? 0 : end + rank;
  if (start > rank) start = rank;
  if (end > rank) end = rank;
  const int64_t n = end > start ? end - start : 0;
  if (ndims[1] != 1 || shapes[1][0] != n) return 1;  // inference disagrees with the attributes
  int64_t *y = static_cast<int64_t *>(params[1]);
  for (int64_t d = 0; d < n; d++) y[d] = shapes[0][start + d];
  return 0;
}
""")
