"""``Cell``: a module whose ``construct`` runs eagerly on NumPy arrays.

A Cell that defines ``bprop(self, *inputs, out, dout)`` is differentiated
through it, as in MindSpore: under tracing (``ops.GradOperation``) the whole
Cell becomes one op whose kernel runs ``construct`` and whose gradient rule
is ``bprop``.
"""
import numpy as np

from ... import dtypes as _dtypes
from ...errors import ArityError, DTypeError, ShapeError
from ...frontends.mindspore import Custom
from ...graph.ir import Value
from ...graph.trace import trace
from ...spec import TensorSpec
from .tensor import Tensor, unwrap, wrap


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

    def _check_inputs(self, inputs):
        if len(inputs) != len(self._input_specs):
            raise ArityError(f"{type(self).__name__}: set_inputs declared {len(self._input_specs)} inputs, "
                             f"got {len(inputs)}")
        for index, (value, spec) in enumerate(zip(inputs, self._input_specs)):
            # Arrays, and the symbolic values of a trace (GradOperation), both carry shape and dtype.
            given = value if hasattr(value, "shape") and hasattr(value, "dtype") else np.asarray(value)
            dtype = _dtypes.normalize(given.dtype)
            if dtype != spec.dtype:
                raise DTypeError(f"{type(self).__name__}: input {index} is {dtype}, but set_inputs declared "
                                 f"{spec.dtype} ({spec})")
            if not spec.matches(given.shape):
                raise ShapeError(f"{type(self).__name__}: input {index} has shape {list(given.shape)}, but "
                                 f"set_inputs declared {spec}")

    def __call__(self, *inputs):
        inputs = [unwrap(x) for x in inputs]
        if self._input_specs is not None:
            self._check_inputs(inputs)
        if hasattr(self, "bprop") and any(isinstance(x, Value) for x in inputs):
            return self._bprop_op(inputs)(*inputs)
        return wrap(self.construct(*inputs))

    def _bprop_op(self, inputs):
        """The Cell as one op (per input signature) whose gradient rule is its ``bprop``."""
        specs = tuple(x.spec if isinstance(x, Value) else TensorSpec.of(np.asarray(x)) for x in inputs)
        ops = self.__dict__.setdefault("_bprop_ops", {})
        if specs not in ops:
            outputs = trace(self.construct, *specs).outputs  # only for the output specs
            several = len(outputs) > 1
            shapes = tuple(list(v.spec.shape) for v in outputs)
            dtypes = tuple(v.spec.dtype for v in outputs)

            def construct(*arrays):
                return unwrap(self.construct(*arrays))

            def bprop(*arrays):
                return unwrap(self.bprop(*arrays))

            construct.__name__ = type(self).__name__
            ops[specs] = Custom(construct, shapes if several else shapes[0], dtypes if several else dtypes[0],
                                "pyfunc", bprop=bprop)
        return ops[specs]
