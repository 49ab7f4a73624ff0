"""``Cell``: a module whose ``construct`` runs eagerly on NumPy arrays."""
import numpy as np

from ...errors import ArityError, ShapeError
from ...spec import TensorSpec
from .tensor import Tensor


def _unwrap(value):
    return value.asnumpy() if isinstance(value, Tensor) else value


def _wrap(value):
    if isinstance(value, np.ndarray):
        return Tensor(value)
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class Cell:
    def __init__(self, auto_prefix=True, flags=None):
        self._input_specs = None

    def set_inputs(self, *inputs):
        """Declare the inputs' specs (None dims are dynamic); calls are checked against them.

        opforge needs no graph compilation for dynamic shapes: every op infers
        per call.  To see what an op produces for a dynamic spec, ask it:
        ``op.infer(opforge.TensorSpec([4, None], "float32"), ...)``.
        """
        self._input_specs = [t.spec if isinstance(t, Tensor) and t.is_placeholder else TensorSpec.of(np.asarray(t))
                             for t in inputs]

    def construct(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must define construct()")

    def __call__(self, *inputs):
        arrays = [_unwrap(x) for x in inputs]
        if self._input_specs is not None:
            if len(arrays) != len(self._input_specs):
                raise ArityError(f"{type(self).__name__}: set_inputs declared {len(self._input_specs)} inputs, "
                                 f"got {len(arrays)}")
            for index, (array, spec) in enumerate(zip(arrays, self._input_specs)):
                array = np.asarray(array)
                if not spec.matches(array.shape, array.dtype):
                    raise ShapeError(f"{type(self).__name__}: input {index} is {TensorSpec.of(array)}, "
                                     f"but set_inputs declared {spec}")
        return _wrap(self.construct(*arrays))
