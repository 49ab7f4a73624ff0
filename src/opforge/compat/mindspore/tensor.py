"""``Tensor``: a NumPy array with MindSpore's constructor, or a shape-only placeholder.

Arithmetic on Tensors (``+ - * / ** @``, unary ``-``, ``abs``, comparisons),
with Tensors, NumPy arrays or Python scalars on either side, calls opforge's
built-in ops and gives Tensors, as MindSpore's PyNative mode does.  Mixed dtypes
promote first (a Python float meeting an int Tensor makes float32, as in
MindSpore).  With a traced value on the other side (a Tensor that a
differentiated function reads from outside), the op is recorded like any
other, so gradients flow through it.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ... import dtypes as _dtypes
from ...errors import DTypeError, NoKernelError, ShapeError
from ...graph.ir import Value
from ...registry import lookup
from ...spec import ShapeLike, TensorSpec
from .common import dtype as _mstype


def _is_operand(value: object) -> bool:
    return isinstance(value, (Tensor, Value, np.ndarray, np.generic, numbers.Number, list, tuple))


def _is_weak(value: object) -> bool:
    """Python and NumPy scalars take the other operand's dtype where they can, as in MindSpore."""
    return isinstance(value, (numbers.Number, np.generic))


def _promoted(a: Any, b: Any) -> tuple[Any, Any]:
    """Both operands of a binary op in one dtype, where both hold data (traced values are left to the op)."""
    if isinstance(a, Value) or isinstance(b, Value):
        return a, b
    a, b = (x if _is_weak(x) else np.asarray(x) for x in (a, b))
    if _is_weak(a) and _is_weak(b):
        return np.asarray(a), b
    if _is_weak(a) or _is_weak(b):
        array, scalar = (b, a) if _is_weak(a) else (a, b)
        kind = np.asarray(scalar).dtype.kind
        if array.dtype.kind in "biu" and kind == "f":  # an int Tensor meets a float: float32, as in MindSpore
            array = array.astype(np.float32)
        elif array.dtype.kind == "b" and kind in "iu":
            array = array.astype(np.int64)
        return (scalar, array) if _is_weak(a) else (array, scalar)
    if a.dtype != b.dtype:
        try:
            common = np.promote_types(a.dtype, b.dtype)
        except TypeError:  # no common type (bfloat16 with an int): the op says what it takes
            return a, b
        a, b = a.astype(common), b.astype(common)
    return a, b


def _builtin(name: str) -> Callable[..., Any]:
    op = lookup(name)
    if op is None:
        raise NoKernelError(f"Tensor arithmetic needs opforge's built-in op '{name}', which is not registered")
    return op


def _binary(name: str, reflected: bool = False) -> Callable[[Tensor, Any], Any]:
    def method(self: Tensor, other: Any) -> Any:
        if not _is_operand(other):
            return NotImplemented  # == None is False; other types may answer themselves
        a, b = (other, self) if reflected else (self, other)
        return wrap(_builtin(name)(*_promoted(unwrap(a), unwrap(b))))

    return method


def _is_vector(x: Any) -> bool:
    return (x.ndim if isinstance(x, Value) else np.ndim(x)) == 1


def _matmul(a: Any, b: Any) -> Any:
    """``a @ b`` as NumPy defines it: a 1-D operand is a row (left) or a column (right), dropped afterwards."""
    if not _is_operand(a) or not _is_operand(b):
        return NotImplemented
    a, b = _promoted(unwrap(a), unwrap(b))
    a_vector, b_vector = _is_vector(a), _is_vector(b)
    result = _builtin("matmul")(a[None, :] if a_vector else a, b[:, None] if b_vector else b)
    if b_vector:
        result = result[..., 0]
    if a_vector:
        result = result[..., 0] if b_vector else result[..., 0, :]
    return wrap(result)


def _unary(name: str) -> Callable[[Tensor], Any]:
    def method(self: Tensor) -> Any:
        return wrap(_builtin(name)(self.asnumpy()))

    return method


# NumPy ufuncs that are Tensor operators, so that ``array + tensor`` (NumPy on the left) is one too
_OPERATOR_UFUNCS = {np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div", np.power: "pow",
                    np.less: "less", np.less_equal: "less_equal", np.greater: "greater",
                    np.greater_equal: "greater_equal", np.equal: "equal", np.not_equal: "not_equal"}


class Tensor:
    """``Tensor(array)`` holds data; ``Tensor(shape=[4, None], dtype=...)`` is a
    placeholder for ``Cell.set_inputs`` (None or -1 marks a dynamic dim)."""

    def __init__(self, input_data: Any = None, dtype: _dtypes.DTypeLike = None, shape: ShapeLike = None) -> None:
        if input_data is None:
            if shape is None or dtype is None:
                raise ShapeError("Tensor without data needs both shape and dtype")
            self._array: npt.NDArray[Any] | None = None
            self.spec: TensorSpec | None = TensorSpec(shape, _dtypes.to_numpy(dtype))
            return
        try:
            array = np.asarray(input_data.asnumpy() if isinstance(input_data, Tensor) else input_data)
        except ValueError as error:  # ragged nested lists
            raise DTypeError(f"Tensor: input_data is not a rectangular array: {error}") from None
        if dtype is not None:
            array = array.astype(_dtypes.to_numpy(dtype))
        self._array = array
        self.spec = None

    @property
    def is_placeholder(self) -> bool:
        return self._array is None

    def asnumpy(self) -> npt.NDArray[Any]:
        if self._array is None:
            raise ShapeError(f"{self.spec} is a shape-only placeholder and holds no data")
        return self._array

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> npt.NDArray[Any]:
        array = self.asnumpy()
        return array if dtype is None else array.astype(dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        # spec is set exactly when _array is None (a placeholder)
        return self.spec.shape if self._array is None else self._array.shape  # type: ignore[union-attr]

    @property
    def dtype(self) -> _mstype.Type | np.dtype[Any]:
        """The mstype (``mstype.float32``), which also equals the NumPy dtype; a dtype
        that mstype does not name (complex, object) stays a NumPy dtype."""
        dtype = self.spec.dtype if self._array is None else self._array.dtype  # type: ignore[union-attr]  # as above
        try:
            return _mstype.of(dtype)
        except (DTypeError, KeyError):
            return np.dtype(dtype)

    def __getitem__(self, index: Any) -> Tensor:
        return Tensor(self.asnumpy()[index])

    def __len__(self) -> int:
        return len(self.asnumpy())

    def __bool__(self) -> bool:
        return bool(self.asnumpy())

    def __float__(self) -> float:
        return float(self.asnumpy())

    def __int__(self) -> int:
        return int(self.asnumpy())

    def __str__(self) -> str:
        return str(self.spec) if self._array is None else str(self._array)

    def __repr__(self) -> str:
        return repr(self.spec) if self._array is None else f"Tensor({self._array!r})"

    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("sub"), _binary("sub", True)
    __mul__, __rmul__ = _binary("mul"), _binary("mul", True)
    __truediv__, __rtruediv__ = _binary("div"), _binary("div", True)
    __pow__, __rpow__ = _binary("pow"), _binary("pow", True)
    __lt__, __le__ = _binary("less"), _binary("less_equal")
    __gt__, __ge__ = _binary("greater"), _binary("greater_equal")
    __eq__, __ne__ = _binary("equal"), _binary("not_equal")  # elementwise, as NumPy's
    __hash__ = object.__hash__  # so a Tensor hashes by identity, as in MindSpore
    __neg__, __abs__ = _unary("neg"), _unary("abs")

    def __matmul__(self, other: Any) -> Any:
        return _matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return _matmul(other, self)

    def __pos__(self) -> Tensor:
        return self

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if method == "__call__" and not kwargs:
            if ufunc in _OPERATOR_UFUNCS and len(inputs) == 2:
                left, right = inputs
                if isinstance(left, Tensor):
                    return _binary(_OPERATOR_UFUNCS[ufunc])(left, right)
                return _binary(_OPERATOR_UFUNCS[ufunc], reflected=True)(right, left)
            if ufunc is np.matmul:
                return _matmul(*inputs)
            if ufunc is np.negative:
                return -inputs[0]
        # any other ufunc (np.exp(t), out=...) runs on the arrays, as it would on arrays
        return getattr(ufunc, method)(*unwrap(inputs), **{k: unwrap(v) for k, v in kwargs.items()})


def unwrap(value: Any) -> Any:
    """Tensors (also inside tuples and lists) as their arrays; anything else as it is."""
    if isinstance(value, Tensor):
        return value.asnumpy()
    if isinstance(value, (tuple, list)):
        return type(value)(unwrap(v) for v in value)
    return value


def wrap(value: Any) -> Any:
    """Arrays and NumPy scalars (also inside tuples and lists) as Tensors; traced values stay as they are."""
    if isinstance(value, (np.ndarray, np.generic)):
        return Tensor(value)
    if isinstance(value, (tuple, list)):
        return type(value)(wrap(v) for v in value)
    return value
