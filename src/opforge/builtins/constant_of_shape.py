"""constant_of_shape: y = a tensor of ``shape`` filled with value's one element.

ONNX ConstantOfShape.  The fill value is a one-element tensor (not a float
attribute), so every dtype keeps its exact value -- an int64 above 2**53, a
float64 -- and y has value's dtype.  The kernel fills y with the element's bytes
(threaded; a memset when they are all zero), one library for every dtype.  The gradient of
the value is the sum of dy.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import HEADER_DIRS, known_dims

if TYPE_CHECKING:
    import numpy.typing as npt

constant_of_shape = opforge.op("constant_of_shape(Tensor value, *, Shape shape) -> Tensor y",
                               traits=["no_side_effect"],
                               doc="A tensor of the given shape (dims >= 0) filled with the one element of "
                                   "value, in value's dtype.")


@constant_of_shape.check
def constant_of_shape_check(value: TensorSpec, *, shape: Sequence[int]) -> str | None:
    bad = [d for d in shape if d < 0]
    if bad:
        return f"attribute 'shape' {list(shape)} has negative dims; dims are >= 0"
    if value.rank is not None and -1 not in value.shape and int(np.prod(value.shape)) != 1:
        return f"input 'value' has shape {list(value.shape)}; it must hold exactly one element"
    return None


@constant_of_shape.infer
def constant_of_shape_infer(value: TensorSpec, *, shape: Sequence[int]) -> TensorSpec:
    return TensorSpec(shape, value.dtype)


@constant_of_shape.reference(fallback=True)
def constant_of_shape_reference(value: npt.NDArray[Any], *, shape: Sequence[int]) -> npt.NDArray[Any]:
    return np.full(shape, value.reshape(-1)[0], value.dtype)


@constant_of_shape.grad(save=["value"])
def constant_of_shape_grad(saved: Any, dy: Any, *, shape: Sequence[int]) -> Any:
    total = opforge.ops.reduce_sum(dy)  # every element of y is the value
    return opforge.ops.reshape(total, shape=list(known_dims(saved.value)))


constant_of_shape.kernel(function="ConstantOfShape", include_dirs=HEADER_DIRS, code=r"""
#include "custom_aot_extra.h"
#include "elements.h"

template <typename E>
static int Run(const void *value, void *y, int64_t n) {
  ParallelFill(static_cast<E *>(y), n, *static_cast<const E *>(value));  // all-zero bytes: memset
  return 0;
}

extern "C" int ConstantOfShape(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  if (ElementCount(ndims[0], shapes[0]) != 1) return 1;  // the op's check rejects this first
  const int64_t n = ElementCount(ndims[1], shapes[1]);
#define CONSTANT_RUN(E) return Run<E>(params[0], params[1], n)
  OPFORGE_BY_ELEMENT_SIZE(ElementSize(dtypes[0]), CONSTANT_RUN)
}
""")
