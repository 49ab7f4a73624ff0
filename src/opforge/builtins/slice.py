"""slice: y = x[starts:ends:steps] along ``axes`` (ONNX Slice semantics).

``axes`` default to 0..len(starts)-1 and ``steps`` to 1; negative starts and
ends count from the end and are clamped to the dim; steps may be negative
(never 0).  An unknown dim stays unknown.  The gradient is ``slice_grad``,
which scatters dy back into zeros of x's shape; both kernels are slice.cc,
one library for every dtype.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import shapes_agree

if TYPE_CHECKING:
    import builtins  # (in this module, ``slice`` is the op)

    import numpy.typing as npt

SCHEMA_ATTRS = "int[] starts, int[] ends, int[] axes=[], int[] steps=[]"
slice = opforge.op(f"slice(Tensor x, *, {SCHEMA_ATTRS}) -> Tensor y",  # noqa: A001 - the op's name
                   traits=["no_side_effect"],
                   doc="ONNX Slice: x[starts:ends:steps] along axes (default 0..); negative indices count "
                       "from the end, out-of-range ones are clamped; steps may be negative, not 0.")


def slice_problem(x: TensorSpec, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
                  steps: Sequence[int]) -> str | None:
    """What is wrong with the attributes for input spec ``x``, or None."""
    if len(ends) != len(starts):
        return f"'starts' has {len(starts)} entries and 'ends' {len(ends)}; they must match"
    for name, values in (("axes", axes), ("steps", steps)):
        if values and len(values) != len(starts):
            return f"'{name}' has {len(values)} entries and 'starts' {len(starts)}; give one per start (or none)"
    if 0 in steps:
        return f"'steps' {list(steps)} contains 0"
    rank = x.rank
    if rank is None:
        return None
    axes = axes or range(len(starts))
    for axis in axes:
        if not -rank <= axis < rank:
            valid = f"valid: {-rank}..{rank - 1}" if rank else "it is 0-d and has no axes"
            return f"axis {axis} in 'axes' is out of range for input 'x' of rank {rank} ({valid})"
    if len({axis % rank for axis in axes}) != len(axes):
        return f"'axes' {list(axes)} names the same axis more than once"
    return None


@slice.check
def slice_check(x: TensorSpec, *, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
                steps: Sequence[int]) -> str | None:
    return slice_problem(x, starts, ends, axes, steps)


def sliced_dim(dim: int, start: int, end: int, step: int) -> int:
    """How many elements start:end:step takes from a dim of size ``dim`` (-1: unknown)."""
    if dim == -1:
        return -1
    return len(range(dim)[start:end:step])  # Python slices clamp as ONNX does


def sliced_shape(shape: Sequence[int], starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
                 steps: Sequence[int]) -> list[int]:
    out = list(shape)
    for k, (start, end) in enumerate(zip(starts, ends)):
        axis = (axes[k] if axes else k) % len(shape)
        out[axis] = sliced_dim(shape[axis], start, end, steps[k] if steps else 1)
    return out


@slice.infer
def slice_infer(x: TensorSpec, *, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
                steps: Sequence[int]) -> TensorSpec:
    if x.rank is None:
        return TensorSpec(None, x.dtype)
    return TensorSpec(sliced_shape(x.shape, starts, ends, axes, steps), x.dtype)


def index_of(x: npt.NDArray[Any], starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
             steps: Sequence[int]) -> tuple[builtins.slice, ...]:
    index: list[builtins.slice] = [np.s_[:]] * x.ndim
    for k, (start, end) in enumerate(zip(starts, ends)):
        index[(axes[k] if axes else k) % x.ndim] = np.s_[start:end:steps[k] if steps else 1]
    return tuple(index)


@slice.reference
def slice_reference(x: npt.NDArray[Any], *, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
                    steps: Sequence[int]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = x[index_of(x, starts, ends, axes, steps)].copy()
    return y


@slice.grad(save=["x"])
def slice_grad(saved: Any, dy: Any, **attrs: Any) -> Any:
    return opforge.ops.slice_grad(dy, saved.x, **attrs)


SLICE_CC = str(Path(__file__).with_name("slice.cc"))
slice.kernel(source=SLICE_CC, function="Slice")


# The gradient is an op too: dx = zeros like x, with dy where slice took its elements.
slice_grad_op = opforge.op(f"slice_grad(Tensor dy, Tensor x, *, {SCHEMA_ATTRS}) -> Tensor dx",
                           traits=["no_side_effect"],
                           doc="Gradient of slice: zeros of x's shape, with dy scattered where slice took "
                               "its elements (x only lends its shape).")


@slice_grad_op.check
def slice_grad_check(dy: TensorSpec, x: TensorSpec, *, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
                     steps: Sequence[int]) -> str | None:
    if dy.dtype != x.dtype:
        raise opforge.DTypeError(f"op 'slice_grad': inputs 'dy' ({dy.dtype}) and 'x' ({x.dtype}) must have one dtype")
    problem = slice_problem(x, starts, ends, axes, steps)
    if problem is None and x.rank is not None and dy.rank is not None:
        want = TensorSpec(sliced_shape(x.shape, starts, ends, axes, steps))
        if not shapes_agree(want.shape, dy.shape):
            problem = f"input 'dy' has shape {list(dy.shape)}, the slice of 'x' has {list(want.shape)}"
    return problem


@slice_grad_op.infer
def slice_grad_infer(dy: TensorSpec, x: TensorSpec, **attrs: Any) -> TensorSpec:
    return TensorSpec(x.shape, dy.dtype)


@slice_grad_op.reference
def slice_grad_reference(dy: npt.NDArray[Any], x: npt.NDArray[Any], *, starts: Sequence[int], ends: Sequence[int],
                         axes: Sequence[int], steps: Sequence[int]) -> npt.NDArray[Any]:
    dx = np.zeros_like(x)
    dx[index_of(x, starts, ends, axes, steps)] = dy
    return dx


@slice_grad_op.grad()
def _(saved: Any, ddx: Any, **attrs: Any) -> tuple[Any, None]:
    return opforge.ops.slice(ddx, **attrs), None


slice_grad_op.kernel(source=SLICE_CC, function="SliceGrad")
