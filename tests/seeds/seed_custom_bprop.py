# A MindSpore program differentiating an aot Custom op through its bprop, with only its imports changed.
# Run it where mindspore_compat.cc is (tests/kernels): it refers to "./mindspore_compat.cc".
import numpy as np
from opforge.compat.mindspore import Tensor
import opforge.compat.mindspore as ms
from opforge.compat.mindspore.nn import Cell
import opforge.compat.mindspore.ops as ops
from opforge.compat.mindspore.ops import DataType, CustomRegOp

square_cpu_info = CustomRegOp("square_kernel_cpu") \
    .input(0, "x") \
    .output(0, "y") \
    .dtype_format(DataType.F32_Default, DataType.F32_Default) \
    .target("CPU") \
    .get_op_info()

square_grad_cpu_info = CustomRegOp("square_grad_kernel_cpu") \
    .input(0, "x") \
    .input(1, "dout") \
    .output(0, "dx") \
    .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default) \
    .target("CPU") \
    .get_op_info()


def square_bprop():
    # The backward pass is a second Custom op, bound to the forward one through bprop.
    square_grad = ops.Custom("./mindspore_compat.cc:SquareGrad", lambda x, dout: x, lambda x, dout: x, "aot",
                             reg_info=square_grad_cpu_info)

    def bprop(x, out, dout):
        return (square_grad(x, dout),)

    return bprop


class SquareMulNet(Cell):
    def __init__(self):
        super(SquareMulNet, self).__init__()
        self.square = ops.Custom("./mindspore_compat.cc:Square", lambda x: x, lambda x: x, "aot",
                                 bprop=square_bprop(), reg_info=square_cpu_info)
        self.mul = ops.Mul()

    def construct(self, x, y):
        return self.mul(self.square(x), y)


if __name__ == "__main__":
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    x = np.array([1.0, 2.0, 3.0]).astype(np.float32)
    y = np.array([2.0, 2.0, 0.5]).astype(np.float32)
    sens = np.array([1.0, 1.0, 2.0]).astype(np.float32)

    net = SquareMulNet()
    print(net(Tensor(x), Tensor(y)))
    dx, dy = ops.GradOperation(get_all=True, sens_param=True)(net)(Tensor(x), Tensor(y), Tensor(sens))
    print(dx, dy)
    print(ops.GradOperation()(net)(Tensor(x), Tensor(y)))
