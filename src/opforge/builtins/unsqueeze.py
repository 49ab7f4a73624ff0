"""unsqueeze: y = x with size-1 axes inserted at ``axes`` (positions in y).

The inverse of squeeze, and its gradient; also how reduce_sum's gradient
puts reduced axes back when their neighbours' sizes are unknown.  The
kernel is squeeze's copy.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.squeeze import normalized_axes

if TYPE_CHECKING:
    import numpy.typing as npt

unsqueeze = opforge.op("unsqueeze(Tensor x, *, int[] axes) -> Tensor y", traits=["no_side_effect", "view"],
                       doc="Insert size-1 axes at the listed positions of the output "
                           "(negative axes count from the output's end).")


@unsqueeze.check
def unsqueeze_check(x: TensorSpec, *, axes: Sequence[int]) -> str | None:
    if x.rank is None:
        return None
    normalized = normalized_axes(axes, x.rank + len(axes), "output 'y'")
    return normalized if isinstance(normalized, str) else None


@unsqueeze.infer
def unsqueeze_infer(x: TensorSpec, *, axes: Sequence[int]) -> TensorSpec:
    if x.rank is None:
        return TensorSpec(None, x.dtype)
    rank = x.rank + len(axes)
    inserted = normalized_axes(axes, rank, "output 'y'")
    dims = iter(x.shape)
    return TensorSpec([1 if k in inserted else next(dims) for k in range(rank)], x.dtype)


@unsqueeze.reference
def unsqueeze_reference(x: npt.NDArray[Any], *, axes: Sequence[int]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.expand_dims(x, tuple(axes)).copy()
    return y


@unsqueeze.grad()
def unsqueeze_grad(saved: Any, dy: Any, *, axes: Sequence[int]) -> Any:
    return opforge.ops.squeeze(dy, axes=axes)


unsqueeze.kernel(source=str(Path(__file__).with_name("squeeze.cc")), function="Copy", name="Unsqueeze")
