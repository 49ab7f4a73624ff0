"""mod: y = a mod b, elementwise with NumPy broadcasting.

``fmod=False`` is Python's and NumPy's ``%``: a non-zero remainder has the
sign of the divisor b.  ``fmod=True`` is C's ``fmod``: it has the sign of the
dividend a.  An integer division by zero gives 0 (as NumPy does), a float one
NaN.  The kernel compiles add.py's broadcasting source twice, once per rule,
and picks one by the attribute; one library holds every dtype, per
instruction set.

Floats skip libm's fmod (a call per element) where the quotient is small:
with |a| < 2^24 |b| (float) or 2^51 |b| (double, with FMA), q = trunc(a / b)
and a - q b are exact in double (for float) or by one fused multiply-add (for
double), so the remainder is fmod's, bit for bit, and the loop vectorizes.  A
block of elements holding a larger quotient, a zero or non-finite divisor or
dividend takes fmod.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST
from opforge.builtins.common import SIMD_ISAS, every_dtype

if TYPE_CHECKING:
    import numpy.typing as npt

mod = opforge.op("mod(Tensor a, Tensor b, *, bool fmod=False) -> Tensor y",
                 traits=["no_side_effect", "elementwise", "no_grad"],
                 doc="Elementwise remainder with NumPy broadcasting: the sign of b (fmod=False, NumPy's %) or of "
                     "a (fmod=True, C's fmod); an integer divisor of 0 gives 0. y has the dtype of a.")
mod.def_infer(infer.broadcast())


@mod.reference(fallback=True)
def mod_reference(a: npt.NDArray[Any], b: npt.NDArray[Any], fmod: bool = False) -> npt.NDArray[Any]:
    with np.errstate(divide="ignore", invalid="ignore"):
        y: npt.NDArray[Any] = np.fmod(a, b) if fmod else np.mod(a, b)
        return y.astype(a.dtype, copy=False)


MOD_DTYPES = ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]

# The two remainders of one element type T (integers: b == 0 gives 0, and b == -1 too, as the most negative
# value % -1 overflows in C++).
REMAINDERS = r"""
#include <cmath>
#include <type_traits>

template <typename T> static inline T TruncMod(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::fmod(a, b);
  } else {
    if (b == T(0)) return T(0);
    if constexpr (std::is_signed_v<T>) {
      if (b == T(-1)) return T(0);
    }
    return static_cast<T>(a % b);
  }
}

// The rule applied to r = TruncMod(a, b): NumPy's % moves a remainder of the
// other sign than b by b (and gives a zero b's sign); fmod keeps r.
template <bool kFloor, typename T> static inline T Finish(T r, T b) {
  if constexpr (!kFloor) {
    return r;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (r == T(0)) return std::copysign(T(0), b);  // NumPy: a zero remainder has b's sign
    if ((r < T(0)) != (b < T(0))) r += b;  // NaN compares false on both sides: stays NaN
  } else if constexpr (std::is_signed_v<T>) {
    if (r != T(0) && (r < T(0)) != (b < T(0))) r = static_cast<T>(r + b);
  }
  return r;
}

template <typename T> static inline T FloorMod(T a, T b) { return Finish<true>(TruncMod(a, b), b); }

// fmod(a, b) for |a| < QuickLimit<T> |b| with a, b finite and b != 0, or b
// infinite and a finite: trunc(a / b) is a / b rounded to an integer, or one
// more in magnitude where the division rounded up onto an integer (a - q b then
// lies just on the other side of 0, and moves back by |b|).  a - q b is exact:
// the remainder is a multiple of the finer of a's and b's ulps below |b|.
template <typename T> constexpr T QuickLimit = std::is_same_v<T, float> ? T(16777216.0) : T(2251799813685248.0);

static inline float QuickTruncMod(float a, float b) {
  const double ad = a, bd = b;
  const double q = double(static_cast<int32_t>(ad / bd));  // |a / b| < 2^24: exact, truncated
  double r = ad - q * bd;                                   // q b: at most 48 bits, exact
  r = r * ad < 0.0 ? r + std::copysign(bd, ad) : r;          // (no underflow: floats in double)
  r = std::isinf(bd) ? ad : r;
  return float(std::copysign(r, ad));                        // a zero remainder has a's sign
}

static inline double QuickTruncMod(double a, double b) {
  const double quotient = a / b, magnitude = std::fabs(quotient);
  double t = (magnitude + 4503599627370496.0) - 4503599627370496.0;  // rounded to an integer (< 2^52)
  t = t > magnitude ? t - 1.0 : t;                                   // truncated
  double r = __builtin_fma(-std::copysign(t, quotient), b, a);
  r = r != 0.0 && std::signbit(r) != std::signbit(a) ? r + std::copysign(b, a) : r;
  r = std::isinf(b) ? a : r;
  return std::copysign(r, a);
}

// Whether QuickTruncMod serves this element type here (double needs a real FMA).
template <typename T> constexpr bool kQuick = std::is_same_v<T, float>
#ifdef __FMA__
    || std::is_same_v<T, double>
#endif
    ;

// y[i] = Finish<kFloor>(TruncMod(a[i * ia], b[i * ib]), b[i * ib]), IA and IB
// the steps when known at compile time (0 or 1; -1: ia and ib); floats in
// blocks, each checked for an element QuickTruncMod does not serve first.
template <bool kFloor, int IA, int IB, typename T>
static void ModSteps(const T *a, int64_t ia, const T *b, int64_t ib, T *y, int64_t n) {
  if (IA >= 0) ia = IA;
  if (IB >= 0) ib = IB;
  if constexpr (kQuick<T>) {
    constexpr int64_t kBlock = 256;
    for (int64_t lo = 0; lo < n; lo += kBlock) {
      const int64_t hi = lo + kBlock < n ? lo + kBlock : n;
      int slow = 0;  // (NaN fails the comparison: slow)
      for (int64_t i = lo; i < hi; i++) slow |= !(std::fabs(a[i * ia]) < QuickLimit<T> * std::fabs(b[i * ib]));
      if (slow) {
        for (int64_t i = lo; i < hi; i++) y[i] = Finish<kFloor>(TruncMod(a[i * ia], b[i * ib]), b[i * ib]);
      } else {
        for (int64_t i = lo; i < hi; i++) y[i] = Finish<kFloor>(QuickTruncMod(a[i * ia], b[i * ib]), b[i * ib]);
      }
    }
  } else {
    for (int64_t i = 0; i < n; i++) y[i] = Finish<kFloor>(TruncMod(a[i * ia], b[i * ib]), b[i * ib]);
  }
}

template <bool kFloor, typename T>
static void ModSpan(const T *a, int64_t ia, const T *b, int64_t ib, T *y, int64_t n) {
  if (ia == 1 && ib == 1) {
    ModSteps<kFloor, 1, 1>(a, ia, b, ib, y, n);
  } else if (ia == 1 && ib == 0) {
    ModSteps<kFloor, 1, 0>(a, ia, b, ib, y, n);
  } else if (ia == 0 && ib == 1) {
    ModSteps<kFloor, 0, 1>(a, ia, b, ib, y, n);
  } else {
    ModSteps<kFloor, -1, -1>(a, ia, b, ib, y, n);
  }
}
"""
# Both rules' copies are internal functions (an extern "C" name would be one symbol for every copy), their
# runs of elements ModSpan's.
BROADCAST = (BINARY_BROADCAST.replace('extern "C" int Binary(', 'static int Binary(')
             .replace("static void Span(", "[[maybe_unused]] static void ElementSpan(", 1)
             .replace("static int Binary(", "static void Span(const T *a, int64_t ia, const T *b, int64_t ib, Y *y, "
                      "int64_t n) {\n  ModSpan<kFloor>(a, ia, b, ib, y, n);\n}\n\nstatic int Binary(", 1))
assert BROADCAST.count("ModSpan<kFloor>") == 1 and BROADCAST.count("static void Span(") == 1
MOD = REMAINDERS + f"""
namespace floor_rule {{
constexpr bool kFloor = true;
#undef OPFORGE_BINARY
#define OPFORGE_BINARY(x, y) FloorMod<T>((x), (y))
{BROADCAST}
}}
namespace trunc_rule {{
constexpr bool kFloor = false;
#undef OPFORGE_BINARY
#define OPFORGE_BINARY(x, y) TruncMod<T>((x), (y))
{BROADCAST}
}}
#undef OPFORGE_BINARY
""" + r"""
extern "C" int Mod(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                   void *stream, void *extra) {
  const bool c_style = static_cast<AotExtra *>(extra)->Attr<bool>("fmod");
  return c_style ? trunc_rule::Binary(nparam, params, ndims, shapes, dtypes, stream, extra)
                 : floor_rule::Binary(nparam, params, ndims, shapes, dtypes, stream, extra);
}
"""
_CODE = every_dtype(MOD, "Mod", MOD_DTYPES)
for _isa in SIMD_ISAS:  # (no FP-trap semantics: the selects become vector blends)
    mod.kernel(function="Mod", code=_CODE, dtypes=[(d, d) for d in MOD_DTYPES], name="Mod", isa=_isa,
               cflags=["-fno-trapping-math", "-fno-math-errno"])
del _isa, _CODE
