"""An opforge op's SBP signatures as DTensor sharding strategies.

Each signature (OneFlow's split / broadcast / partial-sum, ``opforge.sbp``) is
one acceptable way to run the op on shards: ``split(a)`` is DTensor's
``Shard(a)``, ``broadcast`` its ``Replicate()``, ``partial_sum`` its
``Partial("sum")``.  ``torch.distributed.tensor.experimental.register_sharding``
takes them, so a DTensor sharded on a mesh runs through the op shard by shard,
redistributed only where no signature fits its placements.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..sbp import Split, broadcast, partial_sum
from ..spec import TensorSpec
from .schema import dtype_name

if TYPE_CHECKING:
    from .calls import Binding


def available() -> bool:
    return torch.distributed.is_available()  # type: ignore[no-any-return]  # torch is Any to mypy here


def _placement(sbp: object) -> Any:
    from torch.distributed.tensor import Partial, Replicate, Shard

    if isinstance(sbp, Split):
        return Shard(sbp.axis)
    if sbp is broadcast:
        return Replicate()
    if sbp is partial_sum:
        return Partial("sum")
    return None  # an absent optional input


def register(binding: Binding) -> None:
    """Give DTensor the op's signatures (none for ops with a Tensor[] input)."""
    from torch.distributed.tensor.experimental import register_sharding

    op = binding.op
    if op.variadic:
        return
    n_positional_attrs = len(binding.positional)

    def strategies(*args: Any, **kwargs: Any) -> list[tuple[list[Any], list[Any]]]:
        tensors, attrs = binding.split(args, kwargs)
        specs = [None if t is None else TensorSpec(tuple(t.shape), dtype_name(t.tensor_meta.dtype, op=op))
                 for t in tensors]
        result = []
        for signature in op.sbp_signatures(specs, attrs):
            inputs = [_placement(s) for s in signature.inputs] + [None] * n_positional_attrs
            result.append(([_placement(s) for s in signature.outputs], inputs[:len(args)]))
        return result

    register_sharding(binding.packet.default)(strategies)
