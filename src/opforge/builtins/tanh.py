"""tanh: y = tanh(x), elementwise.

A unary float op: same shape and dtype out as in.  The CPU kernel is
vecmath.h's tanh, -expm1(-2|x|) / (expm1(-2|x|) + 2) with x's sign (no
cancellation near 0, exactly +-1 where it saturates), compiled per float
dtype and instruction set and split across opforge's thread pool, as exp's.

Accuracy (max error over a dense sweep of the whole range, against a float64
reference for float32 and a long double one for float64; every ISA variant):
float32 <= 3 ulp, float64 <= 3 ulp; -0.0, +-inf (+-1), NaN and subnormals as
NumPy.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_FLOATS, gpu_source, same_dtypes
from opforge.builtins.exp import vecmath_kernels

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec

tanh = opforge.op("tanh(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                  doc="Hyperbolic tangent, elementwise (floating-point inputs).")
tanh.def_infer(infer.same_as(0))
tanh.fuse_as("vecmath::Tanh({x})")


@tanh.check
def tanh_check(x: TensorSpec) -> None:
    # Without this, integer inputs would fall through to the reference and
    # come back truncated to integers.
    if not x.dtype.startswith(("float", "bfloat")):
        raise opforge.DTypeError(f"op 'tanh': input 'x' has dtype {x.dtype}; tanh takes floating-point tensors")


@tanh.reference(fallback=True)
def tanh_reference(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.tanh(x)
    return y.astype(x.dtype, copy=False)


@tanh.grad(save=["y"])
def tanh_grad(saved: Any, dy: Any) -> Any:
    y = saved.y
    return dy * (np.ones((), y.dtype) - y * y)


vecmath_kernels(tanh, "Tanh", "VecTanh")
tanh.kernel(source=gpu_source("elementwise.cu", "TanhGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
