"""Checks shared by several built-in ops."""
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
