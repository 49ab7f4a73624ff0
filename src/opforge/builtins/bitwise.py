"""bitwise_and, bitwise_or, bitwise_xor, left_shift, right_shift: y = a <op> b
elementwise with NumPy broadcasting, and bitwise_not: y = ~x; integer
tensors (signed and unsigned, 8 to 64 bits), y of the inputs' dtype.

The binary ops compile add.py's broadcasting source with their own
operation, the unary one abs.py's unary source, every integer dtype in one
library each.  Shifts follow ONNX BitShift: right shifts of signed integers
are arithmetic (the sign bit fills the vacated bits), left shifts drop the
bits moved past the top, and a shift count that is negative or at least the
bit width gives what the fill alone gives (-1 for a right shift of a negative
value, 0 otherwise) -- no undefined behaviour in C++.  No gradients (integer ops).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.abs import UNARY_ELEMENTWISE
from opforge.builtins.add import BINARY_BROADCAST
from opforge.builtins.common import SIMD_ISAS, every_dtype

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import Op, TensorSpec

INTEGERS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]

# Shifts by any count, defined for every count (C++ leaves counts outside [0, bits) undefined).
SHIFTS = r"""
#include <type_traits>

template <typename T>
static inline T ShiftLeft(T x, T count) {
  typedef std::make_unsigned_t<T> U;
  const bool inside = count >= T(0) && static_cast<U>(count) < sizeof(T) * 8;
  return inside ? static_cast<T>(static_cast<U>(x) << (inside ? static_cast<int>(count) : 0)) : T(0);
}

template <typename T>
static inline T ShiftRight(T x, T count) {
  typedef std::make_unsigned_t<T> U;
  const bool inside = count >= T(0) && static_cast<U>(count) < sizeof(T) * 8;
  const T fill = x < T(0) ? T(-1) : T(0);  // (unsigned x: never below 0)
  return inside ? static_cast<T>(x >> (inside ? static_cast<int>(count) : 0)) : fill;
}
"""


def _shift_reference(left: bool) -> Callable[[npt.NDArray[Any], npt.NDArray[Any]], npt.NDArray[Any]]:
    def reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
        bits = a.dtype.itemsize * 8
        inside = (b >= 0) & (b < bits)
        count = np.where(inside, b, 0).astype(a.dtype)
        if left:  # on the unsigned bits: the bits moved past the top drop, with no signed overflow
            unsigned = np.dtype(f"uint{bits}")
            wide, counts = np.broadcast_arrays(a, count)
            moved = np.left_shift(wide.astype(unsigned), counts.astype(unsigned)).astype(a.dtype)
            fill = np.zeros((), a.dtype)
        else:
            moved = np.right_shift(a, count)
            fill = np.where(a < 0, np.asarray(-1).astype(a.dtype), np.zeros((), a.dtype))
        y: npt.NDArray[Any] = np.where(inside, moved, fill).astype(a.dtype)
        return y

    return reference


# op name -> (C++ operation, NumPy reference, what it computes)
BINARY: dict[str, tuple[str, Callable[..., Any], str]] = {
    "bitwise_and": ("((x) & (y))", np.bitwise_and, "a & b"),
    "bitwise_or": ("((x) | (y))", np.bitwise_or, "a | b"),
    "bitwise_xor": ("((x) ^ (y))", np.bitwise_xor, "a ^ b"),
    "left_shift": ("ShiftLeft<T>(x, y)", _shift_reference(True), "a << b (0 where b < 0 or b >= bits)"),
    "right_shift": ("ShiftRight<T>(x, y)", _shift_reference(False),
                    "a >> b, arithmetic for signed a (where b < 0 or b >= bits: -1 for negative a, else 0)"),
}


def integer_check(name: str, *inputs: str) -> Callable[..., None]:
    def check(*specs: TensorSpec) -> None:
        for input_name, spec in zip(inputs, specs):
            if spec.dtype not in INTEGERS:
                raise opforge.DTypeError(f"op '{name}': input '{input_name}' has dtype {spec.dtype}; {name} takes "
                                         f"integer tensors ({', '.join(INTEGERS)})")
        if len({spec.dtype for spec in specs}) > 1:
            raise opforge.DTypeError(f"op '{name}': inputs 'a' and 'b' have dtypes {specs[0].dtype} and "
                                     f"{specs[1].dtype}; {name} takes one dtype (cast one of them)")

    return check


def binary(name: str, operation: str, numpy_fn: Callable[..., Any], what: str) -> Op:
    op = opforge.op(f"{name}(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect", "elementwise", "no_grad"],
                    doc=f"Elementwise {what} of integer tensors with NumPy broadcasting.")
    op.def_infer(infer.broadcast())
    op.check(integer_check(name, "a", "b"))

    def reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
        y: npt.NDArray[Any] = np.asarray(numpy_fn(a, b)).astype(a.dtype, copy=False)
        return y

    reference.__name__ = f"{name}_reference"
    op.reference(fallback=True)(reference)  # (every integer dtype has a kernel: the check refuses the rest)
    # Shifts by a count per element vectorize from AVX2 on (and, or, xor do with SSE2 already).
    for isa in SIMD_ISAS if name.endswith("shift") else (None,):
        op.kernel(function="Binary", code=every_dtype(SHIFTS + BINARY_BROADCAST, "Binary", INTEGERS),
                  dtypes=[(d, d) for d in INTEGERS], name=name.title().replace("_", ""), isa=isa,
                  cflags=[f"-DOPFORGE_BINARY(x,y)={operation}"])
    return op


bitwise_and, bitwise_or, bitwise_xor, left_shift, right_shift = (
    binary(name, *entry) for name, entry in BINARY.items())

bitwise_not = opforge.op("bitwise_not(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise", "no_grad"],
                         doc="Elementwise ~x (every bit flipped) of an integer tensor.")
bitwise_not.def_infer(infer.same_as(0))
bitwise_not.check(integer_check("bitwise_not", "x"))


@bitwise_not.reference(fallback=True)
def bitwise_not_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.invert(x)
    return y


bitwise_not.kernel(function="Unary", code=every_dtype(UNARY_ELEMENTWISE, "Unary", INTEGERS),
                   dtypes=[(d,) for d in INTEGERS], name="BitwiseNot",
                   cflags=["-DOPFORGE_UNARY(x)=static_cast<OPFORGE_T>(~(x))"])
