"""concat: y = the inputs joined along ``axis``.

A variadic op: ``concat(a, b, c, axis=1)``.  Every input has one dtype and
rank, and equal dims except along the axis.  The kernel (concat.cc) copies
rows of bytes, so one library serves every dtype; in a planned graph a
concat with only size-1 dims before its axis copies nothing, its inputs made
in place (graph.executor).  The gradient slices dy.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import known_dims
from opforge.spec import UNKNOWN_RANK

if TYPE_CHECKING:
    import numpy.typing as npt

concat = opforge.op("concat(Tensor[] inputs, *, int axis=0) -> Tensor y",
                    traits=["no_side_effect"],
                    doc="Join tensors of one dtype and rank along axis (their other dims equal).")


@concat.check
def concat_check(*inputs: TensorSpec, axis: int) -> str | None:
    if not inputs:
        return "needs at least one input"
    for k, spec in enumerate(inputs[1:], 1):
        if spec.dtype != inputs[0].dtype:
            raise opforge.DTypeError(f"op 'concat': input 'inputs[{k}]' has dtype {spec.dtype}, "
                                     f"'inputs[0]' has {inputs[0].dtype}; concat takes one dtype")
    ranked = [(k, s) for k, s in enumerate(inputs) if s.rank is not None]
    if not ranked:
        return None
    rank: int  # ranked specs have a known rank
    first, rank = ranked[0][0], ranked[0][1].rank  # type: ignore[assignment]
    if rank == 0:
        return f"input 'inputs[{first}]' is 0-d; concat needs rank >= 1"
    if not -rank <= axis < rank:
        return f"axis {axis} is out of range for inputs of rank {rank} (valid: {-rank}..{rank - 1})"
    for k, spec in ranked:
        if spec.rank != rank:
            return f"input 'inputs[{k}]' has rank {spec.rank}, 'inputs[{first}]' has rank {rank}"
        for d in range(rank):
            a, b = spec.shape[d], ranked[0][1].shape[d]
            if d != axis % rank and -1 not in (a, b) and a != b:
                return (f"input 'inputs[{k}]' has shape {list(spec.shape)}, 'inputs[{first}]' has "
                        f"{list(ranked[0][1].shape)}: they may differ only along axis {axis}")
    return None


@concat.infer
def concat_infer(*inputs: TensorSpec, axis: int) -> TensorSpec:
    ranked = [s for s in inputs if s.rank is not None]
    if not ranked:
        return TensorSpec(None, inputs[0].dtype)
    rank: int = ranked[0].rank  # type: ignore[assignment]  # ranked specs have a known rank
    axis %= rank
    shape = []
    for d in range(rank):
        dims = [s.shape[d] for s in inputs if s.rank is not None]
        if d == axis:
            unknown = len(ranked) < len(inputs) or -1 in dims
            shape.append(-1 if unknown else sum(dims))
        else:
            shape.append(next((x for x in dims if x != -1), -1))  # a known dim wins over -1
    return TensorSpec(shape, inputs[0].dtype)


@concat.reference
def concat_reference(*inputs: npt.NDArray[Any], axis: int) -> npt.NDArray[Any]:
    return np.concatenate(inputs, axis=axis)


@concat.grad(save=["inputs"])
def concat_grad(saved: Any, dy: Any, *, axis: int) -> tuple[Any, ...]:
    """Each input's part of dy, sliced at its offset along the axis.  Offsets
    before an input of unknown length count from the start, those after it
    from the end, so one unknown length is fine; two are not."""
    lengths = [-1 if dims == UNKNOWN_RANK else dims[axis] for dims in map(known_dims, saved.inputs)]
    if lengths.count(-1) > 1:
        raise opforge.ShapeError(f"op 'concat': its gradient needs every input's length along axis {axis} but "
                                 f"one to be known; got {lengths}")
    grads, start = [], 0
    for k, length in enumerate(lengths):
        end = -sum(lengths[k + 1:]) if length == -1 else start + length
        if end == 0 and (length == -1 or start < 0):  # counted back from the end, to the end
            end = np.iinfo(np.int64).max
        grads.append(opforge.ops.slice(dy, starts=[start], ends=[end], axes=[axis]))
        start = end
    return tuple(grads)


concat.kernel(source=str(Path(__file__).with_name("concat.cc")), function="Concat")
