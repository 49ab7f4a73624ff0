"""pow: y = a ** b, with NumPy broadcasting.

Compiles add.py's broadcasting source with std::pow.  Floating-point only:
integer powers overflow or (negative exponents) leave the integers.
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST, sum_to
from opforge.builtins.common import FLOATS, every_dtype, floating_point

pow = opforge.op("pow(Tensor a, Tensor b) -> Tensor y",  # noqa: A001 - the op's name
                 traits=["no_side_effect", "elementwise"],
                 doc="Elementwise power with NumPy broadcasting (floating-point); y has the dtype of a.")
pow.def_infer(infer.broadcast())
pow.fuse_as("std::pow({a}, {b})")
pow.check(floating_point("pow", "a"))


@pow.reference
def pow_reference(a, b):
    return np.power(a, b).astype(a.dtype, copy=False)


@pow.grad(save=["a", "b", "y"])
def pow_grad(saved, dy):
    ops = opforge.ops
    a, b, y = saved.a, saved.b, saved.y
    one = np.ones((), a.dtype)
    da = dy * b * ops.pow(a, ops.sub(b, one))
    # d(a ** b)/db = a ** b * log(a); at a == 0 the limit is 0 (log(1) stands in
    # for log(0)); negative a has no real log and gives NaN, as in NumPy.
    db = dy * y * ops.log(ops.where(ops.equal(a, np.zeros((), a.dtype)), one, a))
    return sum_to(da, a), sum_to(db, b)


pow.kernel(function="Binary", code=every_dtype(BINARY_BROADCAST, "Binary", FLOATS), dtypes=[(d, d) for d in FLOATS],
           name="Pow", cflags=["-include", "cmath", "-DOPFORGE_BINARY(x,y)=std::pow(x,y)"])
