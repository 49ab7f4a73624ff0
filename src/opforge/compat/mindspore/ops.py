"""``mindspore.ops`` as far as custom-op programs need it."""
import numpy as np

from ...frontends.mindspore import Custom, CustomRegOp, DataType
from ...operator import Op, PyKernel
from ...spec import TensorSpec


def _elementwise(name, fn):
    def infer(a, b):
        if a.rank is None or b.rank is None:
            return [TensorSpec(None, a.dtype)]
        shape = np.broadcast_shapes(tuple(max(d, 1) for d in a.shape), tuple(max(d, 1) for d in b.shape))
        dynamic = {i for spec in (a, b) for i, d in enumerate(reversed(spec.shape)) if d == -1}
        shape = tuple(-1 if i in dynamic else d for i, d in enumerate(reversed(shape)))[::-1]
        return [TensorSpec(shape, a.dtype)]

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
