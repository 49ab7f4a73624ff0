"""squeeze: y = x without the size-1 axes listed in ``axes``.

Row-major data needs no movement: the kernel (squeeze.cc, shared with
unsqueeze) is a copy for every dtype.  The gradient is unsqueeze.
"""
from pathlib import Path

import numpy as np

import opforge
from opforge import TensorSpec

squeeze = opforge.op("squeeze(Tensor x, *, int[] axes) -> Tensor y", traits=["no_side_effect"],
                     doc="Remove the listed axes, each of size 1 (negative axes count from the end).")


def normalized_axes(axes, rank, tensor="input 'x'"):
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
def squeeze_check(x, *, axes):
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
def squeeze_infer(x, *, axes):
    if x.rank is None:
        return TensorSpec(None, x.dtype)
    removed = normalized_axes(axes, x.rank)
    return TensorSpec([d for k, d in enumerate(x.shape) if k not in removed], x.dtype)


@squeeze.reference
def squeeze_reference(x, *, axes):
    return np.squeeze(x, axis=tuple(axes)).copy()


@squeeze.grad()
def squeeze_grad(saved, dy, *, axes):
    # unsqueeze counts negative axes against its output's rank, which is x's.
    return opforge.ops.unsqueeze(dy, axes=axes)


squeeze.kernel(source=str(Path(__file__).with_name("squeeze.cc")), function="Copy", name="Squeeze")
