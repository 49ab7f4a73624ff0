"""div: y = a / b (true division), with NumPy broadcasting.

Compiles add.py's broadcasting source with its own operation.  Floating-point
only: integer true division would need a float output, and y keeps a's dtype.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST, sum_to, summable
from opforge.builtins.common import FLOATS, GPU_FLOATS, every_dtype, floating_point, gpu_source, same_dtypes
from opforge.sbp import broadcast, partial_sum

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec
    from opforge.sbp import SBPValue

div = opforge.op("div(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect", "elementwise"],
                 doc="Elementwise true division with NumPy broadcasting (floating-point); y has the dtype of a.")
div.def_infer(infer.broadcast())
div.fuse_as("{a} / {b}")
div.check(floating_point("div", "a"))


@div.sbp
def div_sbp(a: TensorSpec, b: TensorSpec) -> list[dict[str, SBPValue]]:
    # Beside the elementwise splits: linear in the numerator (not in the divisor).
    return [{"a": partial_sum, "b": broadcast, "y": partial_sum}] if summable(a, b) else []


@div.reference
def div_reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.true_divide(a, b).astype(a.dtype, copy=False)
    return y


@div.grad(save=["b", "y", "a"])
def div_grad(saved: Any, dy: Any) -> tuple[Any, Any]:
    da = opforge.ops.div(dy, saved.b)
    return sum_to(da, saved.a), sum_to(opforge.ops.neg(da * saved.y), saved.b)


div.kernel(function="Binary", code=every_dtype(BINARY_BROADCAST, "Binary", FLOATS), dtypes=[(d, d) for d in FLOATS],
           name="Div", cflags=["-DOPFORGE_BINARY(x,y)=((x)/(y))"])
div.kernel(source=gpu_source("elementwise.cu", "DivGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS, inputs=2))
