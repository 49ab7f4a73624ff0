"""erf: y = the Gauss error function of x, elementwise (floating-point).

The CPU kernel is vecmath.h's erf: |x| * S(x^2) below 0.875, 1 - erfc(|x|)
above, erfc from e^-(x^2) (x^2 split exactly) times a fitted polynomial,
with x's sign; compiled per float dtype and instruction set and split across
opforge's thread pool, as exp's.  The NumPy reference has no erf of its
own, so it applies math.erf element by element (exact to double rounding).
The gradient is dy * 2 / sqrt(pi) * e ** -(x * x).

Accuracy (max error over a dense sweep of the whole range, against a float64
reference for float32 and math.erf / mpmath for float64; every ISA variant):
float32 <= 3 ulp, float64 <= 4 ulp (from math.erf, itself within 1 ulp).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import floating_point
from opforge.builtins.exp import vecmath_kernels

if TYPE_CHECKING:
    import numpy.typing as npt

erf = opforge.op("erf(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                 doc="Gauss error function, elementwise (floating-point inputs).")
erf.def_infer(infer.same_as(0))
erf.fuse_as("vecmath::Erf({x})")
erf.check(floating_point("erf", "x"))

_ERF = np.frompyfunc(math.erf, 1, 1)


@erf.reference(fallback=True)
def erf_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return np.asarray(_ERF(x.astype(np.float64)), dtype=np.float64).astype(x.dtype, copy=False)


@erf.grad(save=["x"])
def erf_grad(saved: Any, dy: Any) -> Any:
    ops = opforge.ops
    x = saved.x
    return dy * ops.mul(ops.exp(ops.neg(x * x)), np.asarray(2 / math.sqrt(math.pi), x.dtype))


vecmath_kernels(erf, "Erf", "VecErf")
