"""sigmoid: y = 1 / (1 + e ** -x), elementwise (floating-point).

A unary float op with its gradient written from the saved output:
dy * y * (1 - y).  The CPU kernel is vecmath.h's sigmoid: with
e = e ** -|x|, 1 / (1 + e) for x >= 0 and e / (1 + e) below, so nothing
overflows and the negative side reaches the subnormals accurately (the
NumPy reference, computed in float32 for float32, flushes below -88 to 0).
Compiled per float dtype and instruction set and split across opforge's
thread pool, as exp's.

Accuracy (max error over a dense sweep of the whole range, against a float64
reference for float32 and a long double one for float64; every ISA variant):
float32 <= 3 ulp, float64 <= 3 ulp.
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

sigmoid = opforge.op("sigmoid(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                     doc="Logistic sigmoid 1 / (1 + exp(-x)), elementwise (floating-point inputs).")
sigmoid.def_infer(infer.same_as(0))
sigmoid.fuse_as("vecmath::Sigmoid({x})")
sigmoid.check(floating_point("sigmoid", "x"))


@sigmoid.reference(fallback=True)
def sigmoid_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    wide = x.astype(np.promote_types(x.dtype, np.float32), copy=False)  # float16's exp overflows from 11.1 on
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x: 1 / inf = 0, as intended
        y: npt.NDArray[Any] = 1 / (1 + np.exp(-wide))
        return y.astype(x.dtype, copy=False)


@sigmoid.grad(save=["y"])
def sigmoid_grad(saved: Any, dy: Any) -> Any:
    y = saved.y
    return dy * (y * (np.ones((), y.dtype) - y))


vecmath_kernels(sigmoid, "Sigmoid", "VecSigmoid")
sigmoid.kernel(source=gpu_source("elementwise.cu", "SigmoidGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
