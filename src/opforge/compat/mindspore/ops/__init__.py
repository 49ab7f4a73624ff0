"""``mindspore.ops`` as far as custom-op programs need it.

The arithmetic primitives are opforge's built-in ops, so they have kernels
and gradient rules; ``GradOperation`` differentiates a Cell (or function)
with ``opforge.vjp``, through those rules and a Custom op's ``bprop``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import GradientError, NoKernelError, TracingError
from ...frontends import mindspore as _frontend
from ...frontends.mindspore import CustomRegOp, DataType
from ...graph.autodiff import vjp
from ...registry import lookup
from .tensor import Tensor, unwrap, wrap


class _BuiltinPrimitive:
    """A MindSpore primitive backed by the opforge built-in op ``builtin``:
    Tensors in give Tensors out, arrays give arrays, traced values trace."""

    builtin: str | None = None  # the built-in op's name, set by each subclass

    def __call__(self, x: Any, y: Any) -> Any:
        op = lookup(self.builtin)  # type: ignore[arg-type]  # each subclass sets builtin
        if op is None:
            raise NoKernelError(f"ops.{type(self).__name__} needs opforge's built-in op '{self.builtin}', "
                                "which is not registered")
        result = op(unwrap(x), unwrap(y))
        return wrap(result) if isinstance(x, Tensor) or isinstance(y, Tensor) else result


class Custom(_frontend.Custom):
    """``opforge.Custom``, called as MindSpore's PyNative mode calls it: Tensors in give Tensors out
    (arrays in, arrays out; traced values trace, as inside a Cell)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = super().__call__(*unwrap(args), **kwargs)
        return wrap(result) if any(isinstance(a, Tensor) for a in args) else result


class Add(_BuiltinPrimitive):
    builtin = "add"


class Sub(_BuiltinPrimitive):
    builtin = "sub"


class Mul(_BuiltinPrimitive):
    builtin = "mul"


class Div(_BuiltinPrimitive):
    builtin = "div"


class GradOperation:
    """``GradOperation(get_all=False, sens_param=False)(net)(*inputs[, sens])``:
    the gradient of the first input (every input with ``get_all``).  Without
    ``sens_param`` the output's gradient is ones, as in MindSpore; with it, the
    last argument is the output's gradient (a tuple for several outputs)."""

    def __init__(self, get_all: bool = False, get_by_list: bool = False, sens_param: bool = False) -> None:
        if get_by_list:
            raise GradientError("GradOperation(get_by_list=True) differentiates Parameters, which opforge's Cells "
                                "do not have: pass the weights as inputs and use get_all=True")
        self.get_all = get_all
        self.sens_param = sens_param

    def __call__(self, fn: Callable[..., Any], weights: object = None) -> Callable[..., Any]:
        if weights is not None:
            raise GradientError("GradOperation takes no weights (get_by_list is not supported): pass the weights "
                                "as inputs and use get_all=True")

        def forward(*values: Any) -> Any:
            return unwrap(fn(*values))

        def gradient(*args: Any) -> Any:
            if self.sens_param:
                if not args:
                    raise GradientError("GradOperation(sens_param=True): the last argument must be the output's "
                                        "gradient (sens), and none was given")
                args, sens = args[:-1], unwrap(args[-1])
            outputs, pullback = vjp(forward, *[unwrap(a) for a in args])
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            if not self.sens_param:
                sens = tuple(np.ones_like(o) for o in outputs)
            sens = tuple(sens) if isinstance(sens, (tuple, list)) else (sens,)
            if len(sens) != len(outputs):
                raise GradientError(f"GradOperation(sens_param=True): {getattr(fn, '__name__', type(fn).__name__)} "
                                    f"returns {len(outputs)} output(s), and sens gives {len(sens)} gradient(s)")
            grads = pullback(*sens)
            return wrap(tuple(grads) if self.get_all else grads[0])

        return gradient


def shape(input_x: Any) -> tuple[int, ...]:
    """The shape as a tuple of ints (MindSpore's ``ops.shape``); -1 for a dynamic dim of a placeholder."""
    return tuple(np.shape(input_x) if isinstance(input_x, (list, tuple, int, float)) else input_x.shape)


def dyn_shape(input_x: Any) -> Tensor:
    """The shape as an int64 Tensor (MindSpore's ``ops.dyn_shape``)."""
    dims = shape(input_x)
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise TracingError(f"dyn_shape of a traced value with unknown dims {list(dims)}: a Tensor of the shape "
                           "would bake them in; use ops.shape(x) (or x.shape) for arithmetic on dims")
    return Tensor(np.array(dims, np.int64))


class Shape:
    """``ops.Shape()(x)``: the shape as a tuple of ints."""

    def __call__(self, input_x: Any) -> tuple[int, ...]:
        return shape(input_x)


class TensorShape:
    """``ops.TensorShape()(x)``: the shape as an int64 Tensor."""

    def __call__(self, input_x: Any) -> Tensor:
        return dyn_shape(input_x)


DynamicShape = TensorShape  # MindSpore's deprecated name for it

__all__ = ["Custom", "CustomRegOp", "DataType", "Add", "Mul", "Sub", "Div", "GradOperation", "Shape", "shape",
           "TensorShape", "DynamicShape", "dyn_shape"]
