"""reshape: the same elements in a new shape (one dim may be -1, inferred).

Row-major data needs no movement, so the kernel is squeeze.cc's (threaded)
copy; its gradient reshapes back.
"""
from pathlib import Path

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.errors import ShapeError

reshape = opforge.op("reshape(Tensor x, *, Shape shape) -> Tensor y", traits=["no_side_effect"],
                     doc="Row-major reshape; one entry of shape may be -1.")


def resolve_shape(x_shape, shape, op_name="reshape"):
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
def _(x, *, shape):
    return TensorSpec(resolve_shape(x.shape, shape), x.dtype)


@reshape.reference(fallback=True)
def reshape_reference(x, *, shape):
    return x.reshape(shape).copy()


@reshape.grad(save=["x"])
def _(saved, dy, *, shape):
    return opforge.ops.reshape(dy, shape=list(saved.x.spec.shape))


reshape.kernel(source=str(Path(__file__).with_name("squeeze.cc")), function="Copy", name="Reshape")
