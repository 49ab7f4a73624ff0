"""sin, cos, tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh:
y = f(x), elementwise (floating-point).

Eleven unary float ops.  float32 has kernels of its own that vectorize
(IN_DOUBLE_FLOAT below, one per instruction set): vecmath.h evaluates each
function in double from the float input, with range reductions and
polynomials (tan from sin and cos's reduction; asin, acos and atan from
fitted polynomials; sinh and cosh from e^x; asinh, acosh and atanh from
log1p) and no libm calls, then rounds once to float.  libm takes a block of
256 elements that holds an x outside the fast range: infinities and NaN,
out of the domain, |x| > 2^16 for sin, cos and tan (the reduction's limit),
|x| > 90 for sinh and cosh (inf from 89.42 on).  float64 compiles abs.py's
unary source with the C++ standard library's function (glibc's libm:
correctly rounded or within an ulp); NumPy's float64 loops are libm calls
too.  libm calls do not vectorize, so one float64 variant serves every ISA;
the work is split across opforge's thread pool in ranges of 8192 elements
(a call costs tens of nanoseconds, so smaller ranges than the cheap ops'
pay off).

Accuracy (max error over a dense sweep, against a float64 reference for
float32 and a long double one for float64; tests/test_builtin_trigonometric.py
asserts it): float32, every function and ISA variant: 0.5 ulp and a hair
where vecmath.h computes, 1 ulp where libm takes over, every ISA variant
giving the same bits (plain multiplies, adds, divisions and square roots, no
fused multiply-adds); float64: sin, cos, tan, asin, acos, atan <= 1 ulp and
sinh, cosh, asinh, acosh, atanh <= 2 ulp.  Out of the domain (asin of 2,
acosh of 0.5, atanh of 2) the result is NaN, atanh(+-1) is +-inf, sinh and
cosh overflow to inf, -0.0 keeps its sign and subnormal inputs give what
NumPy gives.

Gradients: d sin = cos, d cos = -sin, d tan = 1 + tan^2, d asin = 1 / sqrt(1
- x^2), d acos = -1 / sqrt(1 - x^2), d atan = 1 / (1 + x^2), d sinh = cosh,
d cosh = sinh, d asinh = 1 / sqrt(x^2 + 1), d acosh = 1 / (sqrt(x - 1)
sqrt(x + 1)), d atanh = 1 / (1 - x^2).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.abs import UNARY_ELEMENTWISE
from opforge.builtins.common import SIMD_ISAS, every_dtype, floating_point
from opforge.builtins.exp import VECMATH

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import Op


ops: Any = opforge.ops  # (ops made at run time: the gradients below call sin, cos, sinh, cosh)


def _one(x: Any) -> Any:
    return np.ones((), x.dtype)


def _sqrt(x: Any) -> Any:
    return ops.sqrt(x)


def _div(a: Any, b: Any) -> Any:
    return ops.div(a, b)


# The gradient of each op: dx from dy and the one value it saves, the input x (tan: the output y).
GRADIENTS: dict[str, Callable[[Any, Any], Any]] = {
    "sin": lambda x, dy: dy * ops.cos(x),
    "cos": lambda x, dy: ops.neg(dy * ops.sin(x)),
    "tan": lambda y, dy: dy * (_one(y) + y * y),
    "asin": lambda x, dy: _div(dy, _sqrt(_one(x) - x * x)),
    "acos": lambda x, dy: ops.neg(_div(dy, _sqrt(_one(x) - x * x))),
    "atan": lambda x, dy: _div(dy, _one(x) + x * x),
    "sinh": lambda x, dy: dy * ops.cosh(x),
    "cosh": lambda x, dy: dy * ops.sinh(x),
    "asinh": lambda x, dy: _div(dy, _sqrt(x * x + _one(x))),
    # sqrt(x - 1) sqrt(x + 1) rather than sqrt(x^2 - 1): no cancellation near 1, no overflow of x^2
    "acosh": lambda x, dy: _div(dy, _sqrt(x - _one(x)) * _sqrt(x + _one(x))),
    "atanh": lambda x, dy: _div(dy, _one(x) - x * x),
}
# op name -> (what the op computes, for its doc string)
NAMES = {
    "sin": "Sine", "cos": "Cosine", "tan": "Tangent", "asin": "Arcsine", "acos": "Arccosine",
    "atan": "Arctangent", "sinh": "Hyperbolic sine", "cosh": "Hyperbolic cosine",
    "asinh": "Inverse hyperbolic sine", "acosh": "Inverse hyperbolic cosine", "atanh": "Inverse hyperbolic tangent",
}
# NumPy's names where they differ from the C++ library's
NUMPY_NAMES = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh", "acosh": "arccosh",
               "atanh": "arctanh"}


def trigonometric(name: str) -> Op:
    op = opforge.op(f"{name}(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                    doc=f"{NAMES[name]}, elementwise (floating-point inputs).")
    op.def_infer(infer.same_as(0))
    op.fuse_as(f"vecmath::{name.title()}({{x}})")  # (vecmath.h's: the float32 kernels' values, libm's for float64)
    op.check(floating_point(name, "x"))
    numpy_fn = getattr(np, NUMPY_NAMES.get(name, name))

    def reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN / inf out of the domain
            y: npt.NDArray[Any] = numpy_fn(x)
        return y.astype(x.dtype, copy=False)

    reference.__name__ = f"{name}_reference"
    op.reference(fallback=True)(reference)  # float16 and bfloat16 run here
    gradient, kept = GRADIENTS[name], "y" if name == "tan" else "x"

    def grad(saved: Any, dy: Any) -> Any:
        return gradient(getattr(saved, kept), dy)

    grad.__name__ = f"{name}_grad"
    op.grad(save=[kept])(grad)
    # -fno-math-errno: no errno bookkeeping around the calls (NaN out of the domain is the answer)
    libm = ["float64"]  # (float32: IN_DOUBLE_FLOAT below)
    op.kernel(function="Unary", code=every_dtype(UNARY_ELEMENTWISE, "Unary", libm), dtypes=[(d,) for d in libm],
              name=name.title(), cflags=[f"-DOPFORGE_UNARY(x)=std::{name}(x)", "-DOPFORGE_GRAIN=8192",
                                         "-fno-math-errno"])
    return op


sin, cos, tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh = (trigonometric(name) for name in NAMES)


# float32: vecmath.h's NameInDouble, evaluated in double without libm calls, so that the loop vectorizes; a
# block holding an x outside NameInRange (an infinity, a NaN, out of the domain, |x| above 2^16 for sin, cos
# and tan, above 90 for sinh and cosh) takes vecmath::Name, which calls libm for those.
IN_DOUBLE_FLOAT = r"""
#include <cstdint>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"
#include "vecmath.h"

extern "C" int KERNEL(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  try {
    opforge::parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; b += 256) {
        const int64_t e = b + 256 < hi ? b + 256 : hi;
        int slow = 0;
        for (int64_t i = b; i < e; i++) slow |= !vecmath::NAMEInRange(x[i]);
        if (!slow) {
          for (int64_t i = b; i < e; i++) y[i] = vecmath::NAMEInDouble(x[i]);
        } else {  // (each x[i] read before y[i] is written: y may be x)
          for (int64_t i = b; i < e; i++) y[i] = vecmath::NAME(x[i]);
        }
      }
    });
  } catch (...) {  // the ranges do not throw; the pool's own failures stay on this side of the ABI
    return 2;
  }
  return 0;
}
"""
for _op in (sin, cos, tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh):
    _kernel = f"{_op.name.title()}Float"
    _code = IN_DOUBLE_FLOAT.replace("KERNEL", _kernel).replace("NAME", _op.name.title())
    for _isa in SIMD_ISAS:  # (per instruction set, as exp's: the double polynomial is the cost)
        _op.kernel(function=_kernel, code=_code, dtypes={"x": ["float32"]}, isa=_isa,
                   include_dirs=VECMATH["include_dirs"], cflags=[*VECMATH["cflags"], "-fno-math-errno"])
del _op, _kernel, _code, _isa
