"""``Cell``: a module whose ``construct`` runs eagerly on NumPy arrays.

A Cell that defines ``bprop(self, *inputs, out, dout)`` is differentiated
through it, as in MindSpore: under tracing (``ops.GradOperation``) the whole
Cell becomes one op whose kernel runs ``construct`` and whose gradient rule
is ``bprop``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import dtypes as _dtypes
from ...errors import ArityError, DTypeError, ShapeError
from ...frontends.mindspore import Custom
from ...graph.ir import Value
from ...graph.trace import trace
from ...spec import TensorSpec
from .tensor import Tensor, unwrap, wrap


class Cell:
    bprop: Callable[..., Any]  # optional: a Cell may define bprop(self, *inputs, out, dout)

    def __init__(self, auto_prefix: bool = True, flags: object = None) -> None:
        self._input_specs: list[TensorSpec] | None = None

    def set_inputs(self, *inputs: Any) -> None:
        """Declare the inputs' specs (None dims are dynamic); calls are checked against them.

        opforge needs no graph compilation for dynamic shapes: every op infers
        per call.  To see what an op produces for a dynamic spec, ask it:
        ``op.infer(opforge.TensorSpec([4, None], "float32"), ...)``.
        """
        self._input_specs = [t.spec  # type: ignore[misc]  # a placeholder's spec is set
                             if isinstance(t, Tensor) and t.is_placeholder else TensorSpec.of(np.asarray(t))
                             for t in inputs]

    def construct(self, *inputs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define construct()")

    def _check_inputs(self, inputs: Sequence[Any]) -> None:
        # called once set_inputs has set _input_specs
        if len(inputs) != len(self._input_specs):  # type: ignore[arg-type]
            raise ArityError(f"{type(self).__name__}: set_inputs declared "
                             f"{len(self._input_specs)} inputs, got {len(inputs)}")  # type: ignore[arg-type]
        for index, (value, spec) in enumerate(zip(inputs, self._input_specs)):  # type: ignore[arg-type]
            # Arrays, and the symbolic values of a trace (GradOperation), both carry shape and dtype.
            given = value if hasattr(value, "shape") and hasattr(value, "dtype") else np.asarray(value)
            dtype = _dtypes.normalize(given.dtype)
            if dtype != spec.dtype:
                raise DTypeError(f"{type(self).__name__}: input {index} is {dtype}, but set_inputs declared "
                                 f"{spec.dtype} ({spec})")
            if not spec.matches(given.shape):
                raise ShapeError(f"{type(self).__name__}: input {index} has shape {list(given.shape)}, but "
                                 f"set_inputs declared {spec}")

    def __call__(self, *inputs: Any) -> Any:
        inputs = [unwrap(x) for x in inputs]  # type: ignore[assignment]  # the args, now as a list
        if self._input_specs is not None:
            self._check_inputs(inputs)
        if hasattr(self, "bprop") and any(isinstance(x, Value) for x in inputs):
            return self._bprop_op(inputs)(*inputs)
        return wrap(self.construct(*inputs))

    def _bprop_op(self, inputs: Sequence[Any]) -> Custom:
        """The Cell as one op (per input signature) whose gradient rule is its ``bprop``."""
        specs = tuple(x.spec if isinstance(x, Value) else TensorSpec.of(np.asarray(x)) for x in inputs)
        ops: dict[tuple[TensorSpec, ...], Custom] = self.__dict__.setdefault("_bprop_ops", {})
        if specs not in ops:
            outputs = trace(self.construct, *specs).outputs  # only for the output specs
            several = len(outputs) > 1
            shapes = tuple(list(v.spec.shape) for v in outputs)
            dtypes = tuple(v.spec.dtype for v in outputs)

            def construct(*arrays: Any) -> Any:
                return unwrap(self.construct(*arrays))

            def bprop(*arrays: Any) -> Any:
                return unwrap(self.bprop(*arrays))

            construct.__name__ = type(self).__name__
            ops[specs] = Custom(construct, shapes if several else shapes[0], dtypes if several else dtypes[0],
                                "pyfunc", bprop=bprop)
        return ops[specs]
