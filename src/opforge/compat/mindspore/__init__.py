"""The slice of MindSpore's Python API that aot custom-op programs use.

A MindSpore program runs on opforge by changing its imports only:

    from opforge.compat.mindspore import Tensor
    from opforge.compat.mindspore import dtype as mstype
    from opforge.compat.mindspore.nn import Cell
    import opforge.compat.mindspore as ms
    import opforge.compat.mindspore.ops as ops
    from opforge.compat.mindspore.ops import DataType, CustomRegOp

Tensors are NumPy arrays underneath, with MindSpore's arithmetic and dtypes;
``Cell`` runs ``construct`` eagerly; ``ops.GradOperation``, ``ms.grad`` and
``ms.value_and_grad`` differentiate it with opforge's gradient rules.
"""
from . import common, context, nn, ops
from .common import dtype
from .common.dtype import *  # noqa: F401,F403 - ms.float32 and friends, as in MindSpore
from .context import GRAPH_MODE, PYNATIVE_MODE, get_context, set_context, set_device
from .ops import grad, value_and_grad
from .tensor import Tensor

__all__ = ["Tensor", "dtype", "nn", "ops", "common", "context", "set_context", "get_context", "set_device",
           "GRAPH_MODE", "PYNATIVE_MODE", "grad", "value_and_grad", *common.dtype.__all__]
