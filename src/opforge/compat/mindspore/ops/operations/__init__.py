"""``mindspore.ops.operations``: the primitive classes (also in ``ops`` itself)."""
from .. import Add, Custom, Div, DynamicShape, GradOperation, Mul, Primitive, Shape, Sub, TensorShape
from . import _inner_ops

__all__ = ["Add", "Custom", "Div", "DynamicShape", "GradOperation", "Mul", "Primitive", "Shape", "Sub",
           "TensorShape", "_inner_ops"]
