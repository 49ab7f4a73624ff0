"""The main demo: a fused add + reduce-sum operator from C++ source.

The kernel (aot/kernel.cc) has an Init that sizes a workspace and reads the
attributes `axis` and `keep_dim`, and an InferShape for dynamic shapes.
opforge compiles it on first use (cached afterwards) and runs it on NumPy
arrays.  This is MindSpore's aot tutorial program with only its imports
changed and the kernel path taken relative to this file.
"""
import os

import numpy as np

from opforge.compat.mindspore import Tensor
from opforge.compat.mindspore.common import dtype as mstype
from opforge.compat.mindspore.nn import Cell
import opforge.compat.mindspore as ms
import opforge.compat.mindspore.ops as ops
from opforge.compat.mindspore.ops import DataType, CustomRegOp

KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aot", "kernel.cc")


class ReduceDynNet(Cell):
    def __init__(self, out_types, axis, keep_dim):
        super(ReduceDynNet, self).__init__()
        reduce_cpu_info = CustomRegOp("reduce_kernel_cpu") \
            .input(0, "x1") \
            .input(0, "x2") \
            .output(0, "y") \
            .dtype_format(DataType.None_None, DataType.None_None, DataType.None_None) \
            .attr("axis", "required", "all", value=axis) \
            .attr("keep_dim", "required", "all", value=keep_dim) \
            .target("CPU") \
            .get_op_info()
        # The C++ InferShape gives the output shape, so out_shape is None.
        self.program = ops.Custom(KERNEL + ":CustomKernel", None, out_types, "aot", reg_info=reduce_cpu_info)

    def construct(self, x, y):
        return self.program(x, y)


if __name__ == "__main__":
    shape = (4, 5)
    axis = 1
    keep_dim = False
    ms.set_context(device_target="CPU")

    input_x = np.ones(shape).astype(np.float32)
    input_y = np.ones(shape).astype(np.float32)

    test = ReduceDynNet(mstype.float32, axis, keep_dim)
    dyn_x = Tensor(shape=[4, None], dtype=mstype.float32)
    test.set_inputs(dyn_x, dyn_x)
    output = test(Tensor(input_x), Tensor(input_y))
    print(output)
