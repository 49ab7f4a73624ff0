"""sqrt: y = the square root of x, elementwise (floating-point).

Compiles abs.py's unary source with std::sqrt (NaN for negative x, as NumPy;
correctly rounded), per float dtype and instruction set (SSE2, AVX2,
AVX-512).  -fno-math-errno lets g++ use the square-root instruction in a
vector loop (with errno, std::sqrt of a negative number is a libm call).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.abs import UNARY_ELEMENTWISE
from opforge.builtins.common import FLOATS, GPU_FLOATS, SIMD_ISAS, floating_point, gpu_source, same_dtypes

if TYPE_CHECKING:
    import numpy.typing as npt

sqrt = opforge.op("sqrt(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                  doc="Square root, elementwise (floating-point inputs).")
sqrt.def_infer(infer.same_as(0))
sqrt.fuse_as("std::sqrt({x})")
sqrt.check(floating_point("sqrt", "x"))


@sqrt.reference
def sqrt_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.sqrt(x)
    return y.astype(x.dtype, copy=False)


@sqrt.grad(save=["y"])
def sqrt_grad(saved: Any, dy: Any) -> Any:
    return opforge.ops.div(dy, saved.y * 2)


for _isa in SIMD_ISAS:
    sqrt.kernel(function="Unary", code=UNARY_ELEMENTWISE, dtypes={"x": FLOATS}, name="Sqrt", isa=_isa,
                cflags=["-DOPFORGE_UNARY(x)=std::sqrt(x)", "-fno-math-errno"])
del _isa
sqrt.kernel(source=gpu_source("elementwise.cu", "SqrtGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
