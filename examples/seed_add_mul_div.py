"""A custom operator with three outputs (x + y, x * y, x / y), used as a tuple.

On CPU the C++ kernel aot/add_mul_div.cc runs; with a CUDA device and
`--gpu`, the CUDA kernel aot/add_mul_div.cu does.  The net computes
(x + y + x * y) * (x / y), so it prints [3. 3. 3.] for x = y = 1.
"""
import os
import sys

import numpy as np

from opforge.compat.mindspore import Tensor
from opforge.compat.mindspore import dtype as mstype
from opforge.compat.mindspore.nn import Cell
import opforge.compat.mindspore.ops as ops
from opforge.compat.mindspore.ops import DataType, CustomRegOp

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aot")


def registration(target):
    return CustomRegOp() \
        .input(0, "x1") \
        .input(1, "x2") \
        .output(0, "y1") \
        .output(1, "y2") \
        .output(2, "y3") \
        .dtype_format(DataType.F32_Default, DataType.F32_Default,
                      DataType.F32_Default, DataType.F32_Default, DataType.F32_Default) \
        .target(target) \
        .get_op_info()


class AOTMultiOutputNet(Cell):
    def __init__(self, func, out_shapes, out_types, bprop=None, reg=None):
        super(AOTMultiOutputNet, self).__init__()
        self.program = ops.Custom(func, out_shapes, out_types, "aot", bprop, reg)
        self.add = ops.Add()
        self.mul = ops.Mul()

    def construct(self, x, y):
        aot = self.program(x, y)
        add_res = self.add(aot[0], aot[1])
        mul_res = self.mul(add_res, aot[2])
        return mul_res


if __name__ == "__main__":
    on_gpu = "--gpu" in sys.argv
    source = "add_mul_div.cu" if on_gpu else "add_mul_div.cc"
    x = np.array([1.0, 1.0, 1.0]).astype(np.float32)
    y = np.array([1.0, 1.0, 1.0]).astype(np.float32)
    net = AOTMultiOutputNet(os.path.join(HERE, source) + ":CustomAddMulDiv", ([3], [3], [3]),
                            (mstype.float32, mstype.float32, mstype.float32),
                            reg=registration("GPU" if on_gpu else "CPU"))
    output = net(Tensor(x), Tensor(y))
    print(output)
