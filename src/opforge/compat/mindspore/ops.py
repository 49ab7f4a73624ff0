"""``mindspore.ops`` as far as custom-op programs need it."""
import numpy as np

from ...frontends.mindspore import Custom, CustomRegOp, DataType
from ...infer import broadcast_shapes
from ...operator import Op, PyKernel
from ...spec import TensorSpec


def _elementwise(name, fn):
    def infer(a, b):
        return [TensorSpec(broadcast_shapes(a.shape, b.shape), a.dtype)]

    class Elementwise(Op):
        def __init__(self):
            super().__init__(name, ["x", "y"], ["output"])
            self.add_kernel(PyKernel(fn, name=f"numpy_{name.lower()}"))
            self.def_infer(infer)

    Elementwise.__name__ = Elementwise.__qualname__ = name
    return Elementwise


Add = _elementwise("Add", np.add)
Mul = _elementwise("Mul", np.multiply)
Sub = _elementwise("Sub", np.subtract)
Div = _elementwise("Div", np.divide)

__all__ = ["Custom", "CustomRegOp", "DataType", "Add", "Mul", "Sub", "Div"]
