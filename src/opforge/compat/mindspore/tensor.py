"""``Tensor``: a NumPy array with MindSpore's constructor, or a shape-only placeholder."""
from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ... import dtypes as _dtypes
from ...errors import DTypeError, ShapeError
from ...spec import ShapeLike, TensorSpec


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
    def dtype(self) -> str | np.dtype[Any]:
        return self.spec.dtype if self._array is None else self._array.dtype  # type: ignore[union-attr]  # as above

    def __getitem__(self, index: Any) -> Tensor:
        return Tensor(self.asnumpy()[index])

    def __len__(self) -> int:
        return len(self.asnumpy())

    def __str__(self) -> str:
        return str(self.spec) if self._array is None else str(self._array)

    def __repr__(self) -> str:
        return repr(self.spec) if self._array is None else f"Tensor({self._array!r})"


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
