"""sigmoid: y = 1 / (1 + e ** -x), elementwise (floating-point).

A unary float op with its gradient written from the saved output:
dy * y * (1 - y).  The kernel's form saturates cleanly: e ** -x overflows
to inf for very negative x, giving 0, and underflows to 0 for large x,
giving 1.
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.abs import UNARY_ELEMENTWISE
from opforge.builtins.common import FLOATS, GPU_FLOATS, every_dtype, floating_point, gpu_source, same_dtypes

sigmoid = opforge.op("sigmoid(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                     doc="Logistic sigmoid 1 / (1 + exp(-x)), elementwise (floating-point inputs).")
sigmoid.def_infer(infer.same_as(0))
sigmoid.check(floating_point("sigmoid", "x"))


@sigmoid.reference(fallback=True)
def sigmoid_reference(x):
    wide = x.astype(np.promote_types(x.dtype, np.float32), copy=False)  # float16's exp overflows from 11.1 on
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x: 1 / inf = 0, as intended
        return (1 / (1 + np.exp(-wide))).astype(x.dtype, copy=False)


@sigmoid.grad(save=["y"])
def sigmoid_grad(saved, dy):
    y = saved.y
    return dy * (y * (np.ones((), y.dtype) - y))


# abs.py's unary source with the logistic function (std::exp's float overload for float).
sigmoid.kernel(function="Unary", code=every_dtype(UNARY_ELEMENTWISE, "Unary", FLOATS), dtypes=[(d,) for d in FLOATS],
               name="Sigmoid", cflags=["-DOPFORGE_UNARY(x)=(OPFORGE_T(1)/(OPFORGE_T(1)+std::exp(-(x))))"])
sigmoid.kernel(source=gpu_source("elementwise.cu", "SigmoidGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
