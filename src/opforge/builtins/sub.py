"""sub: y = a - b, with NumPy broadcasting.

Compiles add.py's broadcasting source with its own operation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BINARY_BROADCAST, BINARY_DTYPES, GPU_BINARY_DTYPES, sum_to, summable
from opforge.builtins.common import gpu_source
from opforge.sbp import partial_sum

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec
    from opforge.sbp import SBPValue

sub = opforge.op("sub(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect", "elementwise"],
                 doc="Elementwise difference with NumPy broadcasting; y has the dtype of a.")
sub.def_infer(infer.broadcast())
sub.fuse_as("{a} - {b}")


@sub.sbp
def sub_sbp(a: TensorSpec, b: TensorSpec) -> list[dict[str, SBPValue]]:
    # Beside the elementwise splits: (a1 + a2) - (b1 + b2) = (a1 - b1) + (a2 - b2).
    return [{"a": partial_sum, "b": partial_sum, "y": partial_sum}] if summable(a, b) else []


@sub.reference(fallback=True)
def sub_reference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.subtract(a, b)
    return y.astype(a.dtype, copy=False)


@sub.grad(save=["a", "b"])
def sub_grad(saved: Any, dy: Any) -> tuple[Any, Any]:
    return sum_to(dy, saved.a), sum_to(opforge.ops.neg(dy), saved.b)


sub.kernel(function="Binary", dtypes=BINARY_DTYPES, code=BINARY_BROADCAST, name="Sub",
           cflags=["-DOPFORGE_BINARY(x,y)=((x)-(y))"])
sub.kernel(source=gpu_source("elementwise.cu", "SubGpu"), device="gpu", dtypes=GPU_BINARY_DTYPES)
