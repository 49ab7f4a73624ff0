"""pow: y = a ** b, with NumPy broadcasting.

Floating-point only: integer powers overflow or (negative exponents) leave
the integers.  The CPU kernel compiles add.py's broadcasting source with
vecmath.h's pow, per float dtype and instruction set: e^(b log|a|) with
log|a| carried beyond the element type's precision (float: 2^(b log2|a|) in
double, by short polynomials without tables; double: log|a| and b log|a| in
double-double), since an error e in b log|a| is an error e relative to the
result.  The special values' selects run only for blocks of 256 elements
that hold one (VecPow).  A scalar exponent of 0, 1, 2, -1 or 0.5 takes a
shortcut (1, a, a * a, 1 / a, sqrt(a) with pow's values at -0.0 and -inf),
each correctly rounded.  Zeros, infinities, NaN and
negative bases (NaN unless b is an integer; a's sign for odd b) as NumPy.

Accuracy (max error over a dense sweep of bases and exponents, the results
from the subnormals to overflow, against a float64 reference for float32 and
a long double one for float64; every ISA variant): float32 <= 1 ulp, float64
<= 2 ulp.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST, sum_to
from opforge.builtins.common import SIMD_ISAS, floating_point
from opforge.builtins.exp import VECMATH

if TYPE_CHECKING:
    import numpy.typing as npt

pow = opforge.op("pow(Tensor a, Tensor b) -> Tensor y",  # noqa: A001 - the op's name
                 traits=["no_side_effect", "elementwise"],
                 doc="Elementwise power with NumPy broadcasting (floating-point); y has the dtype of a.")
pow.def_infer(infer.broadcast())
pow.fuse_as("vecmath::Pow({a}, {b})")
pow.check(floating_point("pow", "a"))


@pow.reference
def pow_reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.power(a, b)
    return y.astype(a.dtype, copy=False)


@pow.grad(save=["a", "b", "y"])
def pow_grad(saved: Any, dy: Any) -> tuple[Any, Any]:
    ops = opforge.ops
    a, b, y = saved.a, saved.b, saved.y
    one = np.ones((), a.dtype)
    da = dy * b * ops.pow(a, ops.sub(b, one))
    # d(a ** b)/db = a ** b * log(a); at a == 0 the limit is 0 (log(1) stands in
    # for log(0)); negative a has no real log and gives NaN, as in NumPy.
    db = dy * y * ops.log(ops.where(ops.equal(a, np.zeros((), a.dtype)), one, a))
    return sum_to(da, a), sum_to(db, b)


# add.py's broadcasting source with its Span (one run of elements) replaced:
# a run with one exponent for all checks that exponent for a shortcut first,
# and the others go to vecmath.h's VecPow (the special values only for blocks
# that hold one).
POW_SPAN = r"""
static void Span(const T *a, int64_t ia, const T *b, int64_t ib, Y *y, int64_t n) {
  if (ia == 1 && ib == 0) {
    const T s = b[0];
    if (s == T(0)) {
      for (int64_t i = 0; i < n; i++) y[i] = T(1);
      return;
    }
    if (s == T(1)) {
      for (int64_t i = 0; i < n; i++) y[i] = a[i];
      return;
    }
    if (s == T(2)) {
      for (int64_t i = 0; i < n; i++) y[i] = a[i] * a[i];
      return;
    }
    if (s == T(-1)) {
      for (int64_t i = 0; i < n; i++) y[i] = T(1) / a[i];
      return;
    }
    if (s == T(0.5)) {  // pow(-0, 0.5) = +0 (sqrt gives -0; adding +0 clears it), pow(-inf, 0.5) = inf
      const T inf = std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < n; i++) y[i] = a[i] == -inf ? inf : std::sqrt(a[i]) + T(0);
      return;
    }
  }
  vecmath::VecPow(a, ia, b, ib, y, n);
}
"""
POW_CC = ("#include <cmath>\n#include \"vecmath.h\"\n#define OPFORGE_BINARY(x, y) vecmath::Pow((x), (y))\n" +
          BINARY_BROADCAST.replace("static void Span(", "[[maybe_unused]] static void ElementSpan(", 1)
          .replace('extern "C" int Binary(', POW_SPAN + 'extern "C" int Binary(', 1))
assert POW_CC.count("ElementSpan(") == 1 and POW_CC.count("static void Span(") == 1
for _isa in SIMD_ISAS:  # (-fno-math-errno: std::sqrt becomes the instruction, vectorized)
    pow.kernel(function="Binary", code=POW_CC, dtypes={"a": ["float32", "float64"], "b": ["float32", "float64"]},
               name="Pow", isa=_isa, include_dirs=VECMATH["include_dirs"],
               cflags=VECMATH["cflags"] + ["-fno-math-errno"])
del _isa
