"""mod: y = a mod b, elementwise with NumPy broadcasting.

``fmod=False`` is Python's and NumPy's ``%``: a non-zero remainder has the
sign of the divisor b.  ``fmod=True`` is C's ``fmod``: it has the sign of the
dividend a.  An integer division by zero gives 0 (as NumPy does), a float one
NaN.  The kernel compiles add.py's broadcasting source twice, once per rule,
and picks one by the attribute; one library holds every dtype.
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST
from opforge.builtins.common import every_dtype

mod = opforge.op("mod(Tensor a, Tensor b, *, bool fmod=False) -> Tensor y",
                 traits=["no_side_effect", "elementwise", "no_grad"],
                 doc="Elementwise remainder with NumPy broadcasting: the sign of b (fmod=False, NumPy's %) or of "
                     "a (fmod=True, C's fmod); an integer divisor of 0 gives 0. y has the dtype of a.")
mod.def_infer(infer.broadcast())


@mod.reference(fallback=True)
def mod_reference(a, b, fmod=False):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.fmod(a, b) if fmod else np.mod(a, b)).astype(a.dtype, copy=False)


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

template <typename T> static inline T FloorMod(T a, T b) {
  T r = TruncMod(a, b);
  if constexpr (std::is_floating_point_v<T>) {
    if (r == T(0)) return std::copysign(T(0), b);  // NumPy: a zero remainder has b's sign
    if ((r < T(0)) != (b < T(0))) r += b;  // NaN compares false on both sides: stays NaN
  } else if constexpr (std::is_signed_v<T>) {
    if (r != T(0) && (r < T(0)) != (b < T(0))) r = static_cast<T>(r + b);
  }
  return r;
}
"""
# Both rules' copies are internal functions (an extern "C" name would be one symbol for every copy).
BROADCAST = BINARY_BROADCAST.replace('extern "C" int Binary(', 'static int Binary(')
assert BROADCAST != BINARY_BROADCAST
MOD = REMAINDERS + f"""
namespace floor_rule {{
#undef OPFORGE_BINARY
#define OPFORGE_BINARY(x, y) FloorMod<T>((x), (y))
{BROADCAST}
}}
namespace trunc_rule {{
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
mod.kernel(function="Mod", code=every_dtype(MOD, "Mod", MOD_DTYPES), dtypes=[(d, d) for d in MOD_DTYPES],
           name="Mod")
