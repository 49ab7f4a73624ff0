"""``mindspore.ops.operations._inner_ops``: the internal primitive MindSpore's own tests import.

``ConvertToDynamic`` makes its input's shape unknown to MindSpore's graph
compiler, so a test can check that a Custom op handles a dynamic input
(its InferShape then sees -1 dims, or [-2] with ``is_dynamic_rank``).  opforge
compiles no graph ahead of the data: every op call infers from the shapes it
is given, so every input already is what ConvertToDynamic makes it, and the
primitive passes its input through -- a Tensor as the same Tensor, a traced
value as the same value (so gradients flow through it unchanged).  To see what
an op gives for unknown dims, ask it: ``op.infer(TensorSpec([-2], "float32"))``.
"""
from __future__ import annotations

from typing import Any

from .....errors import SchemaError
from ..primitive import Primitive


class ConvertToDynamic(Primitive):
    """``ConvertToDynamic(is_dynamic_rank=False)(x)``: ``x``, marked dynamic (see above)."""

    def __init__(self, is_dynamic_rank: bool = False) -> None:
        super().__init__("ConvertToDynamic")
        if not isinstance(is_dynamic_rank, bool):
            raise SchemaError(f"ConvertToDynamic: is_dynamic_rank must be a bool, got {is_dynamic_rank!r}")
        self.add_prim_attr("is_dynamic_rank", is_dynamic_rank)

    @property
    def is_dynamic_rank(self) -> bool:
        return bool(self.attrs["is_dynamic_rank"])

    def __call__(self, input_x: Any) -> Any:
        return input_x


__all__ = ["ConvertToDynamic"]
