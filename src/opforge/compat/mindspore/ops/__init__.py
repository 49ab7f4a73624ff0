"""``mindspore.ops`` as far as custom-op programs need it.

The arithmetic primitives are opforge's built-in ops, so they have kernels
and gradient rules; ``GradOperation``, ``grad`` and ``value_and_grad``
differentiate a Cell (or function) with ``opforge.vjp``, through those rules
and a Custom op's ``bprop``.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ....errors import GradientError, NoKernelError, TracingError
from ....frontends import mindspore as _frontend
from ....frontends.mindspore import CustomRegOp, DataType
from ....graph.autodiff import vjp
from ....registry import lookup
from ..tensor import Tensor, unwrap, wrap
from .primitive import Primitive


class _BuiltinPrimitive(Primitive):
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


def _name(fn: object) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _outputs_and_pullback(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[tuple[Any, ...], bool, Any]:
    """``fn``'s outputs (a tuple), whether it returned a tuple, and the pullback to every argument."""
    def forward(*values: Any) -> Any:
        return unwrap(fn(*values))

    outputs, pullback = vjp(forward, *[unwrap(a) for a in args])
    several = isinstance(outputs, tuple)
    return (outputs if several else (outputs,)), several, pullback


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

        def gradient(*args: Any) -> Any:
            if self.sens_param:
                if not args:
                    raise GradientError("GradOperation(sens_param=True): the last argument must be the output's "
                                        "gradient (sens), and none was given")
                args, sens = args[:-1], unwrap(args[-1])
            outputs, _, pullback = _outputs_and_pullback(fn, args)
            if not self.sens_param:
                sens = tuple(np.ones_like(o) for o in outputs)
            sens = tuple(sens) if isinstance(sens, (tuple, list)) else (sens,)
            if len(sens) != len(outputs):
                raise GradientError(f"GradOperation(sens_param=True): {_name(fn)} returns {len(outputs)} output(s), "
                                    f"and sens gives {len(sens)} gradient(s)")
            grads = pullback(*sens)
            return wrap(tuple(grads) if self.get_all else grads[0])

        return gradient


def _positions(grad_position: Any, weights: object, caller: str) -> tuple[int, ...] | int:
    if weights is not None:
        raise GradientError(f"{caller}(weights=...) differentiates Parameters, which opforge's Cells do not have: "
                            "pass the weights as inputs and name their positions in grad_position")
    if grad_position is None:
        raise GradientError(f"{caller}: grad_position and weights are both None, so there is nothing to "
                            "differentiate with respect to")
    several = isinstance(grad_position, tuple)
    for position in grad_position if several else (grad_position,):
        if not isinstance(position, numbers.Integral) or isinstance(position, bool) or position < 0:
            raise GradientError(f"{caller}: grad_position must be an input index (an int >= 0) or a tuple of "
                                f"them, got {grad_position!r}")
    return tuple(int(p) for p in grad_position) if several else int(grad_position)


def _differentiate(fn: Callable[..., Any], grad_position: tuple[int, ...] | int, has_aux: bool, return_ids: bool,
                   caller: str, args: Sequence[Any]) -> tuple[Any, Any, Any]:
    """(fn's value, the gradients grad_position asks for, fn's other outputs when has_aux)."""
    for position in grad_position if isinstance(grad_position, tuple) else (grad_position,):
        if position >= len(args):
            raise GradientError(f"{caller}: grad_position {position} names no input: {_name(fn)} was given "
                                f"{len(args)} input(s)")
    outputs, several, pullback = _outputs_and_pullback(fn, args)
    if has_aux and len(outputs) < 2:
        raise GradientError(f"{caller}(has_aux=True): {_name(fn)} must return more than one output (the first is "
                            f"differentiated, the others are returned as they are), and it returns {len(outputs)}")
    # Only the first output counts with has_aux; without it, every output's gradient is ones, as in MindSpore.
    sens = [np.ones_like(o) if k == 0 or not has_aux else np.zeros_like(o) for k, o in enumerate(outputs)]
    grads = pullback(*sens)

    def one(position: int) -> Any:
        return (position, grads[position]) if return_ids else grads[position]

    chosen = tuple(one(p) for p in grad_position) if isinstance(grad_position, tuple) else one(grad_position)
    value = outputs if several else outputs[0]
    return wrap(value), wrap(chosen), wrap(tuple(outputs[1:]))


def grad(fn: Callable[..., Any], grad_position: int | tuple[int, ...] | None = 0, weights: object = None,
         has_aux: bool = False, return_ids: bool = False) -> Callable[..., Any]:
    """MindSpore's functional ``grad``: the gradient of ``fn`` with respect to input
    ``grad_position`` (a tuple of them for a tuple), the output's gradient being ones.
    With ``has_aux`` only the first output is differentiated, and the call returns
    ``(gradient, (other outputs...))``; with ``return_ids`` each gradient comes as
    ``(position, gradient)``."""
    positions = _positions(grad_position, weights, "grad")

    def gradient(*args: Any) -> Any:
        _, grads, aux = _differentiate(fn, positions, has_aux, return_ids, "grad", args)
        return (grads, aux) if has_aux else grads

    return gradient


def value_and_grad(fn: Callable[..., Any], grad_position: int | tuple[int, ...] | None = 0, weights: object = None,
                   has_aux: bool = False, return_ids: bool = False) -> Callable[..., tuple[Any, Any]]:
    """MindSpore's ``value_and_grad``: ``(fn's value, gradients)``, the gradients as
    ``grad`` gives them; with ``has_aux`` the value is every output of ``fn``."""
    positions = _positions(grad_position, weights, "value_and_grad")

    def value_and_gradient(*args: Any) -> tuple[Any, Any]:
        value, grads, _ = _differentiate(fn, positions, has_aux, return_ids, "value_and_grad", args)
        return value, grads

    return value_and_gradient


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

from . import operations  # noqa: E402 - MindSpore's ops.operations (its primitives need the ones above)

__all__ = ["Custom", "CustomRegOp", "DataType", "Primitive", "Add", "Mul", "Sub", "Div", "GradOperation", "grad",
           "value_and_grad", "Shape", "shape", "TensorShape", "DynamicShape", "dyn_shape", "operations"]
