"""Python and NumPy array syntax on traced values.

Every operator, index and NumPy ufunc or function applied to a traced
``Value`` is a call of a built-in op through its one entry point, so it is
recorded like any other op call: ``x / 2`` is ``div``, ``x[1:, 0]`` is
``slice`` then ``squeeze``, ``np.exp(x)`` is ``exp``.  Python and NumPy
scalars are weak: they take the traced value's dtype.  What a trace cannot
record -- Python control flow on tensor values, data handed to NumPy --
raises ``TracingError`` saying what to use instead.

Indexing follows NumPy: ints, slices (any step), ``None`` and ``...``.  On a
known dim the bounds are resolved at trace time; on an unknown one they stay
as written (negative ones count from the end) and the ``slice`` op resolves
them at run time, as Python would.
"""
from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex

import numpy as np

from ..errors import ShapeError, TracingError
from .symbolic import SymDim, call_builtin

if TYPE_CHECKING:
    from ..spec import TensorSpec

_INT64_MAX, _INT64_MIN = 2 ** 63 - 1, -2 ** 63  # slice ends meaning "past the end" either way


def _weak(args: list[Any]) -> list[Any]:
    """NumPy scalars (which NumPy may hand over as 0-d arrays) take the dtype of the first traced
    operand, as Python scalars do."""
    like = next((a for a in args if isinstance(a, ArraySyntax)), None)
    if like is None:
        return args
    return [np.asarray(a, like.dtype) if isinstance(a, np.generic) or isinstance(a, np.ndarray) and a.ndim == 0
            else a for a in args]


def _operand(x: object) -> bool:
    return isinstance(x, (ArraySyntax, SymDim, numbers.Number, np.ndarray, np.generic, list, tuple))


def _binary(name: str, reflected: bool = False) -> Callable[[ArraySyntax, object], Any]:
    def method(self: ArraySyntax, other: object) -> Any:  # a traced value, or NotImplemented
        if not _operand(other):
            return NotImplemented  # e.g. == None is False; other types may answer themselves
        return call_builtin(name, *_weak([other, self] if reflected else [self, other]))

    return method


def _raise_data_dependent(value: ArraySyntax, what: str) -> NoReturn:
    raise TracingError(
        f"{what} of traced %{value.name} ({value.spec}) is only known at run time: Python control flow on tensor "
        "values (if, while, and/or, bool(), float(), int()) cannot be recorded in a graph. Use "
        "opforge.ops.where(condition, a, b) to choose elementwise, or trace each branch as its own graph")


class ArraySyntax:
    """The array syntax of ``Value`` (mixed in): each operation records a built-in op."""

    __array_priority__ = 1000
    __hash__ = object.__hash__  # == records an op, so a value hashes by identity

    if TYPE_CHECKING:  # what Value, the class this is mixed into, provides
        spec: TensorSpec
        name: str

        @property
        def dtype(self) -> str: ...

        @property
        def ndim(self) -> int | None: ...

    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("sub"), _binary("sub", True)
    __mul__, __rmul__ = _binary("mul"), _binary("mul", True)
    __truediv__, __rtruediv__ = _binary("div"), _binary("div", True)
    __pow__, __rpow__ = _binary("pow"), _binary("pow", True)
    __matmul__, __rmatmul__ = _binary("matmul"), _binary("matmul", True)
    __lt__, __le__ = _binary("less"), _binary("less_equal")
    __gt__, __ge__ = _binary("greater"), _binary("greater_equal")
    __eq__, __ne__ = _binary("equal"), _binary("not_equal")

    def __neg__(self) -> Any:
        return call_builtin("neg", self)

    def __pos__(self) -> ArraySyntax:
        return self

    def __abs__(self) -> Any:
        return call_builtin("abs", self)

    def __getitem__(self, key: Any) -> Any:
        return _getitem(self, key)

    def __setitem__(self, key: object, item: object) -> NoReturn:
        raise TracingError(f"traced %{self.name} cannot be assigned to: values in a graph are immutable. Build the "
                           "result instead (opforge.ops.where to choose elementwise, opforge.ops.concat to join)")

    def __bool__(self) -> NoReturn:
        _raise_data_dependent(self, "the truth value")

    def __float__(self) -> NoReturn:
        _raise_data_dependent(self, "the float value")

    def __int__(self) -> NoReturn:
        _raise_data_dependent(self, "the int value")

    def __index__(self) -> NoReturn:
        _raise_data_dependent(self, "the int value (as an index)")

    def __complex__(self) -> NoReturn:
        _raise_data_dependent(self, "the complex value")

    def __round__(self, ndigits: int | None = None) -> NoReturn:
        _raise_data_dependent(self, "round()")

    def __trunc__(self) -> NoReturn:
        _raise_data_dependent(self, "math.trunc()")

    def __len__(self) -> int:
        if self.ndim is None or self.ndim == 0:
            raise TracingError(f"len() of traced %{self.name} ({self.spec}): it has no known leading dim")
        if self.spec.shape[0] < 0:
            raise TracingError(f"len() of traced %{self.name} ({self.spec}): its leading dim is unknown until run "
                               "time, and Python needs an int now. Use x.shape[0] (a symbolic dim usable in "
                               "arithmetic on tensors), or trace with a static leading dim")
        return self.spec.shape[0]

    def __iter__(self) -> Iterator[Any]:
        return (self[k] for k in range(len(self)))

    def __array__(self, dtype: object = None, copy: object = None) -> NoReturn:
        raise TracingError(f"traced %{self.name} ({self.spec}) has no data yet, so NumPy cannot convert it to an "
                           "array: use opforge ops (or NumPy ufuncs and operators, which are recorded) on it")

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        name = UFUNCS.get(ufunc)
        if name is None or method != "__call__" or kwargs:
            call = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
            extra = f" with {', '.join(kwargs)}" if kwargs and name is not None else ""
            raise TracingError(f"{call}{extra} on a traced value has no built-in op to record; supported ufuncs: "
                               f"{', '.join(sorted('np.' + u.__name__ for u in UFUNCS))}")
        return call_builtin(name, *_weak(list(inputs)))

    def __array_function__(self, func: Callable[..., Any], types: object, args: Sequence[Any],
                           kwargs: dict[str, Any]) -> Any:
        handler = FUNCTIONS.get(func)
        if handler is None:
            raise TracingError(f"np.{func.__name__} on a traced value has no built-in op to record; supported: "
                               f"{', '.join(sorted('np.' + f.__name__ for f in FUNCTIONS))} (and ufuncs)")
        return handler(*args, **kwargs)


UFUNCS = {np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div", np.power: "pow",
          np.matmul: "matmul", np.negative: "neg", np.absolute: "abs", np.sqrt: "sqrt", np.log: "log",
          np.exp: "exp", np.tanh: "tanh", np.maximum: "maximum", np.minimum: "minimum", np.equal: "equal",
          np.not_equal: "not_equal", np.less: "less", np.less_equal: "less_equal", np.greater: "greater",
          np.greater_equal: "greater_equal"}


# -- NumPy functions: their signatures, mapped onto built-in ops --------------------

def _refuse(function: str, **given: object) -> None:
    used = [name for name, value in given.items() if value is not None and value is not np._NoValue]
    if used:
        raise TracingError(f"{function}(..., {'=..., '.join(used)}=...) on a traced value cannot be recorded: the "
                           "built-in op has no such option")


def _axes(axis: Any) -> list[SupportsIndex]:  # axis=: None, an int or ints (NumPy ints too)
    return [] if axis is None else [axis] if isinstance(axis, numbers.Integral) else list(axis)


def _np_sum(a: object, axis: Any = None, dtype: object = None, out: object = None, keepdims: object = False,
            initial: object = None, where: object = None) -> Any:
    _refuse("np.sum", dtype=dtype, out=out, initial=initial, where=where)
    return call_builtin("reduce_sum", a, axes=_axes(axis), keep_dims=bool(keepdims))


def _np_mean(a: object, axis: Any = None, dtype: object = None, out: object = None, keepdims: object = False, *,
             where: object = None) -> Any:
    _refuse("np.mean", dtype=dtype, out=out, where=where)
    return call_builtin("mean", a, axes=_axes(axis), keep_dims=bool(keepdims))


def _np_where(condition: object, x: object = None, y: object = None) -> Any:
    if x is None or y is None:
        raise TracingError("np.where(condition) (the indices of true elements) has a data-dependent shape and "
                           "cannot be recorded; give np.where(condition, x, y)")
    x, y = _weak([x, y])
    return call_builtin("where", condition, x, y)


def _np_concatenate(arrays: Sequence[Any], axis: SupportsIndex | None = 0, out: object = None, dtype: object = None,
                    casting: object = None) -> Any:
    _refuse("np.concatenate", out=out, dtype=dtype, casting=casting)
    if axis is None:
        raise TracingError("np.concatenate(..., axis=None) flattens first; reshape each input, then concatenate")
    return call_builtin("concat", *_weak(list(arrays)), axis=axis)


def _np_reshape(a: object, shape: Any = None, order: str = "C", *, newshape: Any = None, copy: object = None) -> Any:
    _refuse("np.reshape", copy=copy, order=None if order == "C" else order)
    shape = newshape if shape is None else shape
    return call_builtin("reshape", a, shape=[shape] if isinstance(shape, numbers.Integral) else list(shape))


def _np_transpose(a: ArraySyntax, axes: Sequence[int] | None = None) -> Any:
    rank = a.ndim
    swap_last_two = None if rank is None else list(range(rank - 2)) + [rank - 1, rank - 2]
    if rank is None or rank < 2 or (axes is not None and list(axes) != swap_last_two) or \
            (axes is None and rank != 2):
        raise TracingError(f"np.transpose(axes={axes}) on traced %{a.name} ({a.spec}): the built-in transpose "
                           "swaps the last two axes only")
    return call_builtin("transpose", a)


FUNCTIONS: dict[Callable[..., Any], Callable[..., Any]]  # NumPy function -> its recording
FUNCTIONS = {np.sum: _np_sum, np.mean: _np_mean, np.where: _np_where, np.concatenate: _np_concatenate,
             np.reshape: _np_reshape, np.transpose: _np_transpose}


# -- indexing: ints, slices, None, Ellipsis -> slice, squeeze, reshape -------------

def _index_int(value: ArraySyntax, item: Any, what: str) -> int:
    """An int from an index or slice bound, or TracingError saying why it is not one."""
    if isinstance(item, SymDim):
        raise TracingError(f"{what} {item!r} of traced %{value.name} depends on an unknown dim: indices are "
                           "attributes fixed at trace time. Count from the end with negative indices "
                           "(x[-3:], x[:-1]), or trace with a static shape")
    if isinstance(item, (ArraySyntax, np.ndarray, list, tuple)) or isinstance(item, (bool, np.bool_)):
        raise TracingError(f"{what} {type(item).__name__} of traced %{value.name}: indexing with arrays, tensors "
                           "or booleans (NumPy advanced indexing) has no built-in op to record; use ints, "
                           "slices, None and ...")
    try:
        return operator.index(item)
    except TypeError:
        raise TracingError(f"{what} {item!r} of traced %{value.name}: indices must be ints, slices, None or "
                           "...") from None


def _slice_bounds(value: ArraySyntax, axis: int, dim: int, item: slice) -> tuple[int, int, int] | None:
    """(start, end, step) for one axis, or None when the slice keeps the whole axis."""
    start, stop, step = (None if b is None else _index_int(value, b, "slice bound")
                         for b in (item.start, item.stop, item.step))
    step = 1 if step is None else step
    if step == 0:
        raise ShapeError(f"indexing traced %{value.name}: slice step cannot be zero")
    if dim >= 0:  # known dim: exactly Python's slice
        picked = range(dim)[slice(start, stop, step)]
        if picked == range(dim):
            return None
        if not picked:
            return 0, 0, 1
        return picked.start, picked.stop if picked.stop >= 0 else _INT64_MIN, step
    if (start, stop, step) == (None, None, 1):
        return None
    start = (0 if step > 0 else _INT64_MAX) if start is None else start
    stop = (_INT64_MAX if step > 0 else _INT64_MIN) if stop is None else stop
    return start, stop, step


def _getitem(value: ArraySyntax, key: object) -> Any:
    items = list(key) if isinstance(key, tuple) else [key]
    rank = value.ndim
    if rank is None:
        raise TracingError(f"indexing traced %{value.name}: its rank is unknown; trace with a TensorSpec of known "
                           "rank")
    ellipses = sum(item is Ellipsis for item in items)
    indexed = sum(item is not None and item is not Ellipsis for item in items)
    if ellipses > 1:
        raise ShapeError(f"indexing traced %{value.name}: an index can hold only one Ellipsis (...)")
    if indexed > rank:
        raise ShapeError(f"indexing traced %{value.name} ({value.spec}): {indexed} indices for {rank} dims")
    fill = [slice(None)] * (rank - indexed)
    if ellipses:
        at = next(k for k, item in enumerate(items) if item is Ellipsis)
        items[at:at + 1] = fill
    else:
        items += fill

    starts: list[int]
    ends: list[int]
    steps: list[int]
    starts, ends, axes, steps, squeezed, inserted = [], [], [], [], [], []
    axis = kept = 0  # axis of the input; axis of the result
    for item in items:
        if item is None:
            inserted.append(kept)
            kept += 1
            continue
        dim = value.spec.shape[axis]
        if isinstance(item, slice):
            bounds = _slice_bounds(value, axis, dim, item)
            kept += 1
        else:
            k = _index_int(value, item, "index")
            if dim >= 0:
                if not -dim <= k < dim:
                    raise ShapeError(f"index {k} is out of range for axis {axis} of traced %{value.name} "
                                     f"({value.spec})")
                k %= dim
            bounds = (k, k + 1 if k != -1 else _INT64_MAX, 1)
            squeezed.append(axis)
        if bounds is not None:
            for bound_list, bound in zip((starts, ends, steps), bounds):
                bound_list.append(bound)
            axes.append(axis)
        axis += 1

    result = value
    if axes:
        result = call_builtin("slice", result, starts=starts, ends=ends, axes=axes, steps=steps)
    if squeezed:
        result = call_builtin("squeeze", result, axes=squeezed)
    if inserted:
        shape = list(result.spec.shape)
        for position in inserted:
            shape.insert(position, 1)
        if shape.count(-1) > 1:
            raise TracingError(f"x[None] on traced %{value.name} ({value.spec}): a new axis is a reshape, which "
                               "takes at most one unknown dim")
        result = call_builtin("reshape", result, shape=shape)
    return result
