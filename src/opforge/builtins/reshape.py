"""reshape: the same elements in a new shape (one dim may be -1, inferred).

Row-major data needs no movement, so the kernel is squeeze.cc's (threaded)
copy, and in a planned graph (the ``view`` trait) y is x's memory and no
kernel runs; its gradient reshapes back.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.errors import ShapeError

if TYPE_CHECKING:
    import numpy.typing as npt

reshape = opforge.op("reshape(Tensor x, *, Shape shape) -> Tensor y", traits=["no_side_effect", "view"],
                     doc="Row-major reshape; one entry of shape may be -1.")


def resolve_shape(x_shape: Sequence[int], shape: Sequence[int], op_name: str = "reshape") -> tuple[int, ...]:
    """The target shape with its -1 filled in (or -1 kept when x's size is unknown)."""
    if list(shape).count(-1) > 1:
        raise ShapeError(f"op '{op_name}': at most one -1 in shape {list(shape)}")
    known = int(np.prod([d for d in shape if d != -1]))
    if x_shape == (-2,) or -1 in x_shape:
        return tuple(shape)
    size = int(np.prod(x_shape))
    if -1 in shape:
        if known == 0 or size % known:
            raise ShapeError(f"op '{op_name}': cannot reshape {list(x_shape)} into {list(shape)}")
        return tuple(size // known if d == -1 else d for d in shape)
    if known != size:
        raise ShapeError(f"op '{op_name}': cannot reshape {list(x_shape)} ({size} elements) into {list(shape)}")
    return tuple(shape)


@reshape.infer
def _(x: TensorSpec, *, shape: Sequence[int]) -> TensorSpec:
    return TensorSpec(resolve_shape(x.shape, shape), x.dtype)


@reshape.reference(fallback=True)
def reshape_reference(x: npt.NDArray[Any], *, shape: Sequence[int]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = x.reshape(shape).copy()
    return y


@reshape.grad(save=["x"])
def _(saved: Any, dy: Any, *, shape: Sequence[int]) -> Any:
    return opforge.ops.reshape(dy, shape=list(saved.x.spec.shape))


reshape.kernel(source=str(Path(__file__).with_name("squeeze.cc")), function="Copy", name="Reshape")
