"""Helpers shared by several built-in ops."""
import numpy as np

import opforge


def floating_point(op_name, input_name):
    """A check rejecting a non-float input (integer true division, sqrt, log
    of integers would otherwise need a dtype the op does not give)."""

    def check(*specs, **attrs):
        spec = specs[0]
        if not spec.dtype.startswith(("float", "bfloat")):
            raise opforge.DTypeError(f"op '{op_name}': input '{input_name}' has dtype {spec.dtype}; "
                                     f"{op_name} takes floating-point tensors (cast it first)")

    return check


def known_dims(value):
    """The shape of an array, or of a traced value with -1 for its unknown dims
    (for gradient rules, which build attributes from shapes)."""
    spec = getattr(value, "spec", None)
    return tuple(spec.shape) if spec is not None else tuple(value.shape)


def zeros_like(x, dtype):
    """Zeros of x's shape, known at trace time or only at run time (for
    gradient rules on graphs traced with unknown dims)."""
    spec = getattr(x, "spec", None)
    if spec is None or spec.is_static:
        return np.zeros(known_dims(x), dtype)
    # x < x is false for every x, NaN and infinities included (x * 0 is not).
    return opforge.ops.cast(opforge.ops.less(x, x), dtype=dtype)
