"""erf: y = the Gauss error function of x, elementwise (floating-point).

std::erf in the kernel; the NumPy reference has no erf of its own, so it
applies math.erf element by element (exact to double rounding).  The
gradient is dy * 2 / sqrt(pi) * e ** -(x * x).
"""
import math

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.abs import UNARY_ELEMENTWISE
from opforge.builtins.common import FLOATS, every_dtype, floating_point

erf = opforge.op("erf(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                 doc="Gauss error function, elementwise (floating-point inputs).")
erf.def_infer(infer.same_as(0))
erf.check(floating_point("erf", "x"))

_ERF = np.frompyfunc(math.erf, 1, 1)


@erf.reference(fallback=True)
def erf_reference(x):
    return np.asarray(_ERF(x.astype(np.float64)), dtype=np.float64).astype(x.dtype, copy=False)


@erf.grad(save=["x"])
def erf_grad(saved, dy):
    ops = opforge.ops
    x = saved.x
    return dy * ops.mul(ops.exp(ops.neg(x * x)), np.asarray(2 / math.sqrt(math.pi), x.dtype))


# abs.py's unary source with std::erf (float and double overloads).
erf.kernel(function="Unary", code=every_dtype(UNARY_ELEMENTWISE, "Unary", FLOATS), dtypes=[(d,) for d in FLOATS],
           name="Erf", cflags=["-DOPFORGE_UNARY(x)=std::erf(x)"])
