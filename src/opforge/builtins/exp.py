"""exp: y = e ** x, elementwise.

A unary float op: same shape and dtype out as in.  The CPU kernel is
vecmath.h's exp (range reduction + polynomial, vectorized by the compiler),
compiled per float dtype and per instruction set (SSE2, AVX2, AVX-512: the
best the CPU has runs), and split across opforge's thread pool.

Accuracy (max error over a dense sweep of the whole range, against a float64
reference for float32 and a long double one for float64; every ISA variant):
float32 <= 1.5 ulp, float64 <= 1.5 ulp.  inf, -inf, NaN, overflow (inf),
underflow (through the subnormals to 0) and subnormal inputs as NumPy.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_FLOATS, HEADER_DIRS, SIMD_ISAS, gpu_source, same_dtypes

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import Op, TensorSpec

exp = opforge.op("exp(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                 doc="Exponential, elementwise (floating-point inputs).")
exp.def_infer(infer.same_as(0))
exp.fuse_as("vecmath::Exp({x})")


@exp.check
def exp_check(x: TensorSpec) -> None:
    # Without this, integer inputs would fall through to the reference and
    # come back truncated to integers.
    if not x.dtype.startswith(("float", "bfloat")):
        raise opforge.DTypeError(f"op 'exp': input 'x' has dtype {x.dtype}; exp takes floating-point tensors")


@exp.reference(fallback=True)
def exp_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.exp(x).astype(x.dtype, copy=False)
    return y


@exp.grad(save=["y"])
def exp_grad(saved: Any, dy: Any) -> Any:
    return dy * saved.y


# What every vecmath.h kernel is compiled with: explicit FMAs only (so the
# vector body and the scalar tail round alike) and no FP-trap semantics (else
# g++ will not turn the selects into vector blends below AVX).
VECMATH: dict[str, Any] = dict(include_dirs=HEADER_DIRS,
                               cflags=["-ffp-contract=off", "-fno-trapping-math"])

# y = f(x) for vecmath.h's array function VECMATH_FN, over the thread pool in
# ranges of 32768 elements (about 10 us of work or more: worth a thread).
VECMATH_UNARY = r"""
#include "custom_aot_extra.h"
#include "opforge/parallel.h"
#include "vecmath.h"

extern "C" int VECMATH_KERNEL(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  try {
    opforge::parallel_for(0, n, 1 << 15, [&](int64_t lo, int64_t hi) { vecmath::VECMATH_FN(x + lo, y + lo, hi - lo); });
  } catch (...) {  // the ranges do not throw; the pool's own failures stay on this side of the ABI
    return 2;
  }
  return 0;
}
"""


def vecmath_kernels(op: Op, kernel: str, fn: str) -> None:
    """One kernel per float dtype and ISA: ``kernel`` applying vecmath.h's ``fn``."""
    code = VECMATH_UNARY.replace("VECMATH_KERNEL", kernel).replace("VECMATH_FN", fn)
    for isa in SIMD_ISAS:
        op.kernel(function=kernel, code=code, dtypes={"x": ["float32", "float64"]}, isa=isa, **VECMATH)


vecmath_kernels(exp, "Exp", "VecExp")
exp.kernel(source=gpu_source("elementwise.cu", "ExpGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
