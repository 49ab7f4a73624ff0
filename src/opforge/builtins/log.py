"""log: y = the natural logarithm of x, elementwise (floating-point).

Compiles abs.py's unary source with std::log (-inf at 0, NaN below, as NumPy).
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.abs import UNARY_ELEMENTWISE
from opforge.builtins.common import FLOATS, GPU_FLOATS, every_dtype, floating_point, gpu_source, same_dtypes

log = opforge.op("log(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"],
                 doc="Natural logarithm, elementwise (floating-point inputs).")
log.def_infer(infer.same_as(0))
log.fuse_as("std::log({x})")
log.check(floating_point("log", "x"))


@log.reference
def log_reference(x):
    return np.log(x).astype(x.dtype, copy=False)


@log.grad(save=["x"])
def log_grad(saved, dy):
    return opforge.ops.div(dy, saved.x)


log.kernel(function="Unary", code=every_dtype(UNARY_ELEMENTWISE, "Unary", FLOATS), dtypes=[(d,) for d in FLOATS],
           name="Log",
           cflags=["-DOPFORGE_UNARY(x)=std::log(x)"])
log.kernel(source=gpu_source("elementwise.cu", "LogGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))
