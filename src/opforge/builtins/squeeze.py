"""squeeze: y = x without the size-1 axes listed in ``axes``.

Row-major data needs no movement: the kernel (squeeze.cc, shared with
unsqueeze) is a copy for every dtype.  The gradient is unsqueeze.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec

if TYPE_CHECKING:
    import numpy.typing as npt

squeeze = opforge.op("squeeze(Tensor x, *, int[] axes) -> Tensor y", traits=["no_side_effect", "view"],
                     doc="Remove the listed axes, each of size 1 (negative axes count from the end).")


def normalized_axes(axes: Sequence[int], rank: int, tensor: str = "input 'x'") -> list[int] | str:
    """``axes`` in 0..rank-1, or the reason they are not valid axes of a rank-``rank`` tensor."""
    for axis in axes:
        if not -rank <= axis < rank:
            valid = f"valid: {-rank}..{rank - 1}" if rank else "it is 0-d and has no axes"
            return f"axis {axis} is out of range for {tensor} of rank {rank} ({valid})"
    normalized = [axis % rank for axis in axes]
    if len(set(normalized)) != len(normalized):
        return f"axes {list(axes)} name the same axis more than once"
    return normalized


@squeeze.check
def squeeze_check(x: TensorSpec, *, axes: Sequence[int]) -> str | None:
    if x.rank is None:
        return None
    normalized = normalized_axes(axes, x.rank)
    if isinstance(normalized, str):
        return normalized
    for axis in normalized:
        if x.shape[axis] not in (1, -1):
            return f"axis {axis} of input 'x' has size {x.shape[axis]}; squeeze removes only size-1 axes"
    return None


@squeeze.infer
def squeeze_infer(x: TensorSpec, *, axes: Sequence[int]) -> TensorSpec:
    if x.rank is None:
        return TensorSpec(None, x.dtype)
    removed = normalized_axes(axes, x.rank)
    return TensorSpec([d for k, d in enumerate(x.shape) if k not in removed], x.dtype)


@squeeze.reference
def squeeze_reference(x: npt.NDArray[Any], *, axes: Sequence[int]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.squeeze(x, axis=tuple(axes)).copy()
    return y


@squeeze.grad()
def squeeze_grad(saved: Any, dy: Any, *, axes: Sequence[int]) -> Any:
    # unsqueeze counts negative axes against its output's rank, which is x's.
    return opforge.ops.unsqueeze(dy, axes=axes)


squeeze.kernel(source=str(Path(__file__).with_name("squeeze.cc")), function="Copy", name="Squeeze")
