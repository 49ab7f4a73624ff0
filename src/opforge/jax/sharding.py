"""opforge ops under ``jax.jit`` on sharded inputs: each call site partitioned by the
op's SBP signatures (``opforge.sbp``), so it runs on each device's shard with no
all-gather where a signature fits the inputs' shardings.

XLA treats a custom call as opaque: left alone, it would gather every input on
every device.  ``partitioned`` wraps a call site in ``custom_partitioning``:

* for Shardy's propagation, a sharding rule derived from the signatures on the
  global shapes (the dims a signature splits together share a factor; a factor
  split only on inputs, whose signature sums its output, is a reduction factor;
  dims no signature splits need replication);
* for the partitioning itself, per mesh axis, the signature whose input SBPs are
  the inputs' shardings there (a dim sharded over the axis is ``split``, else
  ``broadcast``); its output SBPs give the result's sharding, and a
  ``partial_sum`` output is summed over the axis (``psum``) in the per-shard
  code.  An axis no signature fits is gathered (XLA inserts the collective), as
  is a split of a dim the axis does not divide evenly.

An operand XLA gives no sharding (GSPMD does so for constants, and for values
inside a differentiated function) counts as replicated.  Absent optional inputs
take no part: the partitioned function takes the present inputs only.
"""
from __future__ import annotations

import itertools
import string
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..sbp import PartialSum, Split, broadcast

if TYPE_CHECKING:
    from ..attrs import AttrValue
    from ..operator import Op
    from ..sbp import SBPValue, Signature
    from ..spec import TensorSpec

    #: A dim of a call: (("in" or "out", tensor index), dim index).
    _Dim: TypeAlias = tuple[tuple[str, int], int]
    #: Per tensor, per dim: the mesh axes it is sharded over.
    _Axes: TypeAlias = list[list[list[str]]]


class _Present(NamedTuple):
    """A signature's SBPs of the present inputs (and every output)."""

    inputs: tuple[SBPValue | None, ...]
    outputs: tuple[SBPValue | None, ...]


def _factor_names() -> Iterator[str]:
    for size in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=size):
            yield "".join(letters)


def sharding_rule(op: Op, in_specs: Sequence[TensorSpec], out_specs: Sequence[TensorSpec],
                  signatures: Iterable[Signature | _Present]) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(Shardy rule string, reduction factors, need-replication factors) for these signatures."""
    parent: dict[_Dim, _Dim] = {}

    def find(key: _Dim) -> _Dim:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    def union(a: _Dim, b: _Dim) -> None:
        parent[find(a)] = find(b)

    reducing: set[_Dim]
    touched: set[_Dim]
    reducing, touched = set(), set()
    for signature in signatures:
        split = [(("in", k), s.axis) for k, s in enumerate(signature.inputs) if isinstance(s, Split)]
        split += [(("out", k), s.axis) for k, s in enumerate(signature.outputs) if isinstance(s, Split)]
        touched.update(split)
        for first, other in zip(split, split[1:]):
            union(first, other)
        if split and any(isinstance(s, PartialSum) for s in signature.outputs):
            reducing.update(key for key in split if key[0][0] == "in")
    factors: dict[_Dim, str]
    reduction: set[str]
    replicated: set[str]
    names, factors = _factor_names(), {}
    reduction, replicated = set(), set()

    def factor(key: _Dim) -> str:
        root = find(key)
        if root not in factors:
            factors[root] = next(names)
        return factors[root]

    def dims(side: str, specs: Sequence[TensorSpec]) -> str:
        text = []
        for k, spec in enumerate(specs):
            text.append(" ".join(factor(((side, k), d)) for d in range(len(spec.shape))))
        return ", ".join(text)

    rule = f"{dims('in', in_specs)} -> {dims('out', out_specs)}"
    split_anywhere = {find(key) for key in touched}
    in_result = {find((("out", k), d)) for k, s in enumerate(out_specs) for d in range(len(s.shape))}
    for root, name in factors.items():
        if root not in in_result:
            if any(find(key) == root for key in reducing):
                reduction.add(name)
            else:
                replicated.add(name)
        elif root not in split_anywhere:
            replicated.add(name)
    return rule, tuple(sorted(reduction)), tuple(sorted(replicated))


def _axes_of(entry: str | Iterable[str] | None) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _choose(mesh: Any, signatures: Sequence[_Present], in_specs: Sequence[TensorSpec],
            arg_shardings: Sequence[Any]) -> dict[str, _Present | None]:
    """Per mesh axis, the signature the inputs' shardings fit, or None (the axis is gathered)."""
    chosen: dict[str, _Present | None] = {}
    for axis in mesh.axis_names:
        given: list[SBPValue] = []
        for spec, sharding in zip(in_specs, arg_shardings):
            written = () if sharding is None else tuple(sharding.spec)  # None: XLA gave it none, replicated
            entries = written + (None,) * (len(spec.shape) - len(written))
            dims = [d for d, entry in enumerate(entries) if axis in _axes_of(entry)]
            given.append(Split(dims[0]) if dims else broadcast)
        size = mesh.shape[axis]
        fitting = [s for s in signatures if tuple(s.inputs) == tuple(given)
                   and all(not isinstance(sbp, Split) or spec.shape[sbp.axis] % size == 0
                           for sbp, spec in zip(s.inputs, in_specs))]
        chosen[axis] = fitting[0] if fitting else None
    return chosen


def _shardings(mesh: Any, chosen: Mapping[str, _Present | None], in_specs: Sequence[TensorSpec],
               out_specs: Sequence[TensorSpec]) -> tuple[list[Any], list[Any], list[list[str]]]:
    """(input shardings to ask for, output shardings, axes to psum each output over)."""
    inputs: _Axes = [[[] for _ in spec.shape] for spec in in_specs]
    outputs: _Axes = [[[] for _ in spec.shape] for spec in out_specs]
    sums: list[list[str]] = [[] for _ in out_specs]
    for axis, signature in chosen.items():
        if signature is None:
            continue
        for k, sbp in enumerate(signature.inputs):
            if isinstance(sbp, Split):
                inputs[k][sbp.axis].append(axis)
        for k, sbp in enumerate(signature.outputs):
            if isinstance(sbp, Split):
                outputs[k][sbp.axis].append(axis)
            elif isinstance(sbp, PartialSum):
                sums[k].append(axis)

    def named(dims: Sequence[Sequence[str]]) -> Any:
        return NamedSharding(mesh, P(*[None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
                                       for axes in dims]))

    return [named(d) for d in inputs], [named(d) for d in outputs], sums


def partitioned(op: Op, attrs: Mapping[str, AttrValue], all_specs: Sequence[TensorSpec | None],
                out_specs: Sequence[TensorSpec], run_shard: Callable[[Sequence[Any]], Any]) -> Any:
    """A function of the call's present arrays (``all_specs``: None for an absent optional input)
    that XLA's partitioners split by the op's signatures; ``run_shard(arrays)`` runs the op on
    present arrays of whatever shape (a device's shard)."""
    present = [k for k, spec in enumerate(all_specs) if spec is not None]
    in_specs = [spec for spec in all_specs if spec is not None]
    signatures = [_Present(tuple(s.inputs[k] for k in present), tuple(s.outputs))
                  for s in op.sbp_signatures(all_specs, attrs)]
    rule, reduction, replicated = sharding_rule(op, in_specs, out_specs, signatures)
    several = op.tuple_output

    @custom_partitioning  # type: ignore[untyped-decorator]  # jax is Any to mypy (follow_imports=skip)
    def call(*arrays: Any) -> Any:
        return run_shard(arrays)

    def plan(mesh: Any, arg_shapes: Sequence[Any]) -> tuple[list[Any], list[Any], list[list[str]]]:
        arg_shardings = [shape.sharding for shape in arg_shapes]
        chosen = _choose(mesh, signatures, in_specs, arg_shardings)
        return _shardings(mesh, chosen, in_specs, out_specs)

    def infer_sharding_from_operands(mesh: Any, arg_shapes: Sequence[Any], result_shape: Any) -> Any:
        _, outputs, _ = plan(mesh, arg_shapes)
        return list(outputs) if several else outputs[0]  # (JAX takes a list for several)

    def partition(mesh: Any, arg_shapes: Sequence[Any],
                  result_shape: Any) -> tuple[Any, Callable[..., Any], Any, tuple[Any, ...]]:
        inputs, outputs, sums = plan(mesh, arg_shapes)

        def per_shard(*arrays: Any) -> Any:
            result = run_shard(arrays)
            results = list(result) if several else [result]
            results = [jax.lax.psum(r, tuple(axes)) if axes else r for r, axes in zip(results, sums)]
            return tuple(results) if several else results[0]

        return mesh, per_shard, (list(outputs) if several else outputs[0]), tuple(inputs)

    call.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                       sharding_rule=rule, reduction_factors=reduction, need_replication_factors=replicated)
    return call
