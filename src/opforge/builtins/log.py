"""log: y = the natural logarithm of x, elementwise (floating-point).

The CPU kernel is vecmath.h's log: x = 2^k m with m in [sqrt(1/2),
sqrt(2)), log x = k ln2 + log1p(m - 1), log1p from a fitted polynomial
(float) or from s = f / (2 + f) (double); compiled per float dtype and
instruction set and split across opforge's thread pool, as exp's.  Each
block of 256 elements is looked over first: one without zeros, subnormals,
negatives, inf or NaN (nearly every block) skips their cases, a third of
the work (2048^2 float32, one thread: 2.30 -> 1.37-1.47 ms).

Accuracy (max error over a dense sweep of the whole range, against a float64
reference for float32 and a long double one for float64; every ISA variant):
float32 <= 1 ulp, float64 <= 1 ulp.  log(+-0) = -inf, negative inputs
(-inf included) give NaN, log(inf) = inf, NaN stays NaN and subnormal inputs
are computed, not flushed, as NumPy does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_FLOATS, floating_point, gpu_source, same_dtypes
from opforge.builtins.exp import vecmath_kernels

if TYPE_CHECKING:
    import numpy.typing as npt

log = opforge.op("log(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                 doc="Natural logarithm, elementwise (floating-point inputs).")
log.def_infer(infer.same_as(0))
log.fuse_as("vecmath::Log({x})")
log.check(floating_point("log", "x"))


@log.reference
def log_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.log(x)
    return y.astype(x.dtype, copy=False)


@log.grad(save=["x"])
def log_grad(saved: Any, dy: Any) -> Any:
    return opforge.ops.div(dy, saved.x)


vecmath_kernels(log, "Log", "VecLog")
log.kernel(source=gpu_source("elementwise.cu", "LogGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
