"""An opforge op's SBP signatures as DTensor sharding strategies.

Each signature (OneFlow's split / broadcast / partial-sum, ``opforge.sbp``) is
one acceptable way to run the op on shards: ``split(a)`` is DTensor's
``Shard(a)``, ``broadcast`` its ``Replicate()``, ``partial_sum`` its
``Partial("sum")``.  ``torch.distributed.tensor.experimental.register_sharding``
takes them, so a DTensor sharded on a mesh runs through the op shard by shard,
redistributed only where no signature fits its placements.

DTensor caches a sharding decision per call signature: the inputs' specs and
the non-tensor arguments its ``RuntimeSchemaInfo`` names.  Every attribute of
an opforge op is among them (see ``_schema_info_table``), so two calls that
differ only in an attribute (``reduce_sum``'s ``axes``) are decided apart.
"""
from __future__ import annotations

import functools
import sys
import warnings
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


def constant_like(value: Any, like: Any) -> Any:
    """A constant tensor made for a computation on ``like`` (a gradient rule's zeros, say):
    on a DTensor's mesh, replicated (every rank makes the same constant), when ``like`` is
    a DTensor, which takes no plain tensor beside it; ``value`` itself otherwise."""
    dtensor = sys.modules.get("torch.distributed.tensor")  # not imported: like is no DTensor
    if dtensor is None or not isinstance(like, dtensor.DTensor):
        return value
    mesh = like.device_mesh
    return dtensor.DTensor.from_local(value, mesh, [dtensor.Replicate()] * mesh.ndim, run_check=False)


def register(binding: Binding) -> None:
    """Give DTensor the op's signatures (none for ops with a Tensor[] input)."""
    from torch.distributed.tensor.experimental import register_sharding

    op = binding.op
    if op.variadic:
        return
    found = _schema_info_table()
    if found is None:  # DTensor would reuse a decision across attributes: give it no signatures
        return
    schema_infos, schema_info = found
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
    # Every attribute keys DTensor's cache: positional ones from the first non-tensor argument
    # on (the tensor inputs come first), keyword-only ones by name.
    keywords = [a.name for a in binding.attrs if not a.positional]
    schema_infos[binding.packet.default] = schema_info(static_argnum=binding.n_tensors,
                                                       static_kwargkey=keywords or None, needs_pytree=True)


@functools.cache
def _schema_info_table() -> tuple[dict[Any, Any], Any] | None:
    """(DTensor's table of RuntimeSchemaInfo by op, the RuntimeSchemaInfo class), or None,
    with a warning, where this torch has no such table.

    The one place that relies on DTensor's private API (torch 2.13).  ``register_sharding``
    derives the non-tensor arguments that key DTensor's sharding cache from the schema's
    int arguments alone, so an ``int[]``, ``bool``, ``float`` or ``str`` attribute is left
    out and a second call with another value would reuse the first call's placements;
    ``register`` puts a RuntimeSchemaInfo naming them all in its place.  (DTensor's C++
    cache key hashes a list item by item.  Its Python key, made only where the C++ one
    cannot be -- inputs of symbolic shape outside tracing -- turns a positional list into a
    tuple but keeps a keyword-only one a list, unhashable: an error there, not a stale
    decision.)  Without the table, ops get no signatures, so a DTensor call fails in
    DTensor, naming the op, and tests/test_torch_distributed.py fails, rather than reusing
    a decision silently."""
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

        schema_infos = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info
        if not isinstance(schema_infos, dict):
            raise TypeError(f"op_to_schema_info is a {type(schema_infos).__name__}, not a dict")
        RuntimeSchemaInfo(static_argnum=0, static_kwargkey=None, needs_pytree=True)  # the fields register sets
    except (ImportError, AttributeError, TypeError) as error:
        warnings.warn(f"opforge ops get no DTensor sharding signatures: this torch ({torch.__version__}) has "
                      f"no table of RuntimeSchemaInfo that opforge can key DTensor's sharding cache with "
                      f"({error})", RuntimeWarning, stacklevel=2)
        return None
    return schema_infos, RuntimeSchemaInfo
