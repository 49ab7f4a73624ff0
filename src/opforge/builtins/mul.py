"""mul: y = a * b, with NumPy broadcasting.

Compiles add.py's broadcasting source with its own operation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST, BINARY_DTYPES, GPU_BINARY_DTYPES, sum_to, summable
from opforge.builtins.common import gpu_source
from opforge.sbp import broadcast, partial_sum

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec
    from opforge.sbp import SBPValue

mul = opforge.op("mul(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect", "elementwise"],
                 doc="Elementwise product with NumPy broadcasting; y has the dtype of a.")
mul.def_infer(infer.broadcast())
mul.fuse_as("{a} * {b}")


@mul.sbp
def mul_sbp(a: TensorSpec, b: TensorSpec) -> list[dict[str, SBPValue]]:
    # Beside the elementwise splits: linear in each operand while the other is whole.
    if not summable(a, b):
        return []
    return [{"a": partial_sum, "b": broadcast, "y": partial_sum}, {"a": broadcast, "b": partial_sum, "y": partial_sum}]


@mul.reference(fallback=True)
def mul_reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.multiply(a, b)
    return y.astype(a.dtype, copy=False)


@mul.grad(save=["a", "b"])
def mul_grad(saved: Any, dy: Any) -> tuple[Any, Any]:
    return sum_to(dy * saved.b, saved.a), sum_to(dy * saved.a, saved.b)


# Integer overflow is undefined in C++ (NumPy wraps): keep products in range.
mul.kernel(function="Binary", dtypes=BINARY_DTYPES, code=BINARY_BROADCAST, name="Mul",
           cflags=["-DOPFORGE_BINARY(x,y)=((x)*(y))"])
mul.kernel(source=gpu_source("elementwise.cu", "MulGpu"), device="gpu", dtypes=GPU_BINARY_DTYPES)
