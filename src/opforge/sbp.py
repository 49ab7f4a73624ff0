"""SBP signatures: the ways an op can run on shards (OneFlow's split / broadcast / partial-sum).

A tensor spread over devices is, on each device, one of

* ``split(a)`` -- a slice of it along axis ``a`` (``S(a)``);
* ``broadcast`` -- all of it (``B``);
* ``partial_sum`` -- an addend: the tensor is the sum of the devices' values (``P``).

A ``Signature`` gives one SBP to each input and output of an op, and says: run
the op on each device's pieces, and the outputs are pieces of that kind of the
op's result on the whole tensors.  ``matmul``'s ``a:S(0), b:B -> y:S(0)`` splits
the rows.  An op declares its signatures once (``@op.sbp``); ``signatures(op,
specs, attrs)`` lists them for given inputs, with what traits derive:

* the ``elementwise`` trait: for each axis of the output, the inputs that have a
  (non-1) dim there split on their own axis, the others broadcast;
* the ``no_side_effect`` trait: every input and output broadcast.

Framework bridges (DTensor's ``register_sharding``, JAX's sharding rules) read
these lists; nothing here runs a kernel.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NoReturn, TypeAlias, TypeVar, cast

from .errors import AttrError, SchemaError
from .spec import TensorSpec

if TYPE_CHECKING:
    from .operator import Op


@dataclass(frozen=True)
class Split:
    """``S(axis)``: each device holds a slice along ``axis``."""

    axis: int

    def __post_init__(self) -> None:
        try:
            axis = operator.index(self.axis)
        except TypeError:
            axis = None
        if axis is None or isinstance(self.axis, bool):
            raise SchemaError(f"split(axis) takes an int axis, got {self.axis!r}")
        object.__setattr__(self, "axis", axis)

    def __repr__(self) -> str:
        return f"S({self.axis})"


def split(axis: int) -> Split:
    """``S(axis)``: a slice along ``axis`` (negative axes count from the end)."""
    return Split(axis)


_S = TypeVar("_S", bound="_Singleton")


class _Singleton:
    """One instance per class, kept as itself through copy and pickle."""

    _name = ""  # the module-level name of the instance
    _instance: ClassVar[_Singleton]

    def __new__(cls: type[_S]) -> _S:
        if "_instance" not in cls.__dict__:
            cls._instance = super().__new__(cls)
        return cast(_S, cls._instance)

    def __reduce__(self) -> str:
        return self._name


class Broadcast(_Singleton):
    """``B``: each device holds the whole tensor."""

    _name = "broadcast"

    def __repr__(self) -> str:
        return "B"


class PartialSum(_Singleton):
    """``P``: each device holds an addend; the tensor is their sum."""

    _name = "partial_sum"

    def __repr__(self) -> str:
        return "P"


broadcast = Broadcast()
partial_sum = PartialSum()
SBP = (Split, Broadcast, PartialSum)


def parse(text: str) -> Split | Broadcast | PartialSum:
    """An SBP from the way it prints, OneFlow's: ``"S(1)"`` (negative axes too), ``"B"`` or ``"P"``."""
    word = str(text).strip()
    if word == "B":
        return broadcast
    if word == "P":
        return partial_sum
    if word.startswith("S(") and word.endswith(")"):
        try:
            return split(int(word[2:-1]))
        except ValueError:
            pass
    raise SchemaError(f"{text!r} is not an SBP; expected S(axis), B or P")
#: One SBP: ``split(axis)``, ``broadcast`` or ``partial_sum``.
SBPValue: TypeAlias = "Split | Broadcast | PartialSum"
#: What ``Op.sbp`` keeps: a function of the input specs and attributes, or the declared signatures.
SBPDeclaration: TypeAlias = "Callable[..., object] | tuple[object, ...]"
_Entries: TypeAlias = "Mapping[str, SBPValue | None] | Iterable[tuple[str, SBPValue | None]]"


class Signature(Mapping[str, "SBPValue | None"]):
    """One SBP per input and output name (None for an absent optional input), frozen.

    ``inputs`` and ``outputs`` are the SBPs in the op's order; ``str`` reads
    ``x:S(0), w:B -> y:S(0)``.
    """

    __slots__ = ("_inputs", "_outputs", "_by_name")

    def __init__(self, inputs: _Entries, outputs: _Entries) -> None:
        """``inputs`` and ``outputs``: dicts (or ``(name, sbp)`` pairs) in the op's order."""
        self._inputs = tuple(dict(inputs).items())
        self._outputs = tuple(dict(outputs).items())
        self._by_name = dict(self._inputs + self._outputs)

    @property
    def inputs(self) -> tuple[SBPValue | None, ...]:
        return tuple(sbp for _, sbp in self._inputs)

    @property
    def outputs(self) -> tuple[SBPValue | None, ...]:
        return tuple(sbp for _, sbp in self._outputs)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._outputs)

    def __getitem__(self, name: str) -> SBPValue | None:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Signature):
            return (self._inputs, self._outputs) == (other._inputs, other._outputs)
        return Mapping.__eq__(self, other)  # a dict of the same entries is equal

    def __hash__(self) -> int:
        return hash((self._inputs, self._outputs))

    def __str__(self) -> str:
        def show(pairs: Iterable[tuple[str, SBPValue | None]]) -> str:
            return ", ".join(f"{name}:{sbp!r}" for name, sbp in pairs)

        return f"{show(self._inputs)} -> {show(self._outputs)}"

    def __repr__(self) -> str:
        return f"Signature({self})"


def elementwise_splits(*shapes: Sequence[int] | None) -> list[tuple[int, tuple[SBPValue, ...]]]:
    """For inputs of these shapes broadcast together (NumPy's rules, -1 for an unknown dim):
    ``(axis, sbps)`` for each axis of the result along which it can be split -- ``sbps``
    gives each input ``split`` on its own axis, or ``broadcast`` where its dim is 1 or missing.

    An axis is left out where no input has a non-1 dim on it (every device would compute
    the whole result), and where an unknown dim might be a broadcast 1 against another
    input's dim.  Any unknown rank (None) gives nothing.
    """
    known = [shape for shape in shapes if shape is not None]
    if len(known) != len(shapes):
        return []
    rank = max((len(shape) for shape in known), default=0)
    result: list[tuple[int, tuple[SBPValue, ...]]] = []
    for axis in range(rank):
        own = [axis - (rank - len(shape)) for shape in known]  # each input's axis here (< 0: missing)
        sized = [k for k, shape in enumerate(known) if own[k] >= 0 and shape[own[k]] != 1]
        if not sized or (len(sized) > 1 and any(known[k][own[k]] == -1 for k in sized)):
            continue
        result.append((axis, tuple(Split(own[k]) if k in sized else broadcast for k in range(len(known)))))
    return result


def _all_broadcast(input_names: Iterable[str], present: Iterable[bool], outputs: Iterable[str]) -> Signature:
    return Signature({name: broadcast if here else None for name, here in zip(input_names, present)},
                     {name: broadcast for name in outputs})


def _derived_elementwise(op: Op, input_names: Sequence[str], specs: Sequence[TensorSpec | None]) -> list[Signature]:
    shapes = [spec.shape if spec.rank is not None else None for spec in specs if spec is not None]
    index = [k for k, spec in enumerate(specs) if spec is not None]
    signatures = []
    for axis, sbps in elementwise_splits(*shapes):
        by_input: dict[str, SBPValue | None] = dict.fromkeys(input_names)
        for k, sbp in zip(index, sbps):
            by_input[input_names[k]] = sbp
        signatures.append(Signature(by_input, {name: Split(axis) for name in op.outputs}))
    return signatures


def _checked(op: Op, entry: object, input_names: Sequence[str], specs: Sequence[TensorSpec | None],
             output_specs: Callable[[], Sequence[TensorSpec]]) -> Signature:
    """The Signature a declared ``entry`` (a dict name -> SBP) stands for, with axes normalised;
    SchemaError naming the op and the entry for anything wrong.  ``output_specs()`` gives
    the output specs, computed only when an output is split."""

    def fail(problem: str) -> NoReturn:
        raise SchemaError(f"op '{op.name}': SBP signature {entry!r}: {problem}")

    if not isinstance(entry, Mapping):
        raise SchemaError(f"op '{op.name}': an SBP signature is a dict of input and output names to "
                          f"split(axis), broadcast or partial_sum, got {entry!r}")
    known = list(input_names) + list(op.outputs)
    for name in entry:
        if name not in known:
            fail(f"'{name}' is not an input or output of the op (they are: {', '.join(known)})")

    def checked_sbp(name: str, sbp: object, spec_of: Callable[[], TensorSpec]) -> SBPValue:
        if not isinstance(sbp, SBP):
            fail(f"'{name}' has {sbp!r}; an SBP is split(axis), broadcast or partial_sum")
        if not isinstance(sbp, Split):
            return sbp
        rank = spec_of().rank
        if rank is None:  # an unknown rank: the axis stays as written
            return sbp
        if not -rank <= sbp.axis < rank:
            fail(f"split axis {sbp.axis} of '{name}' is out of range for rank {rank} (valid: {-rank}..{rank - 1})"
                 if rank else f"'{name}' is 0-d and cannot be split")
        return Split(sbp.axis % rank)

    inputs: dict[str, SBPValue | None] = {}
    for name, spec in zip(input_names, specs):
        if spec is None:  # an absent optional input takes no part, whatever the entry says
            inputs[name] = None
        elif entry.get(name) is None:
            fail(f"input '{name}' has no SBP (every input and output needs one)")
        else:
            inputs[name] = checked_sbp(name, entry[name], lambda: spec)
    outputs: dict[str, SBPValue | None] = {}
    for index, name in enumerate(op.outputs):
        if entry.get(name) is None:
            fail(f"output '{name}' has no SBP (every input and output needs one)")
        outputs[name] = checked_sbp(name, entry[name], lambda: output_specs()[index])
    return Signature(inputs, outputs)


def _input_names(op: Op, count: int) -> list[str]:
    return [op.input_name(k) for k in range(count)]


def signatures(op: Op, specs: Iterable[object], attrs: Mapping[str, object] | None = None) -> list[Signature]:
    """The op's valid SBP signatures for inputs of these specs (TensorSpecs, arrays, None for an
    absent optional input) and attribute values (defaults filled in): the ``elementwise``
    trait's splits, then the op's declared signatures, then all-broadcast for a
    ``no_side_effect`` op; without duplicates, in that order.  Split axes are normalised
    (0..rank-1) where the rank is known.  A declaration naming an unknown input or output,
    leaving one out, or splitting out of range raises SchemaError.
    """
    given = [s if s is None or isinstance(s, TensorSpec) else TensorSpec.of(s) for s in specs]
    count = len(op.inputs)
    if op.variadic:
        count = len(given)
    elif len(given) < count and all(i.optional for i in op.inputs[len(given):]):  # trailing optional ones left out
        given += [None] * (count - len(given))
    if len(given) != count:
        raise SchemaError(f"op '{op.name}' takes {count} input(s), got {len(given)} spec(s) for its SBP signatures")
    unknown = sorted(set(attrs or {}) - set(op.attrs))
    if unknown:
        known = ", ".join(op.attrs) or "none"
        raise AttrError(f"op '{op.name}' has no attribute '{unknown[0]}' (attributes: {known})")
    input_names = _input_names(op, count)
    found = []
    if "elementwise" in op.traits:
        found += _derived_elementwise(op, input_names, given)
    declared = op.sbp_declaration
    if declared is not None:
        resolved = op.resolve_attrs(dict(attrs or {}))
        entries = declared(*given, **resolved) if callable(declared) else declared
        if isinstance(entries, Mapping) or not isinstance(entries, (list, tuple)):
            raise SchemaError(f"op '{op.name}': its sbp function must return a list of signatures "
                              f"(dicts of name -> SBP), got {entries!r}")
        inferred: list[TensorSpec] = []

        def output_specs() -> list[TensorSpec]:  # inference runs only when a declaration splits an output
            if not inferred:
                inferred.extend(op.infer_specs(given, resolved))
            return inferred

        found += [_checked(op, entry, input_names, given, output_specs) for entry in entries]
    if "no_side_effect" in op.traits:
        found.append(_all_broadcast(input_names, [s is not None for s in given], op.outputs))
    return list(dict.fromkeys(found))


def checked_declaration(op: Op, declaration: object) -> SBPDeclaration:
    """What ``Op.sbp`` stores: a function ``fn(*input_specs, **attrs) -> [dict, ...]``, or a list
    of dicts (checked now against inputs of unknown rank: names and SBP kinds)."""
    if callable(declaration):
        return declaration
    if isinstance(declaration, Mapping) or not isinstance(declaration, (list, tuple)):
        raise SchemaError(f"op '{op.name}': sbp takes a function (input specs, attributes) -> list of "
                          f"signatures, or a list of signatures (dicts of name -> SBP), got {declaration!r}")
    entries = tuple(declaration)
    if not op.variadic:
        unknown_rank = [TensorSpec(None)] * len(op.inputs)
        for entry in entries:
            _checked(op, entry, _input_names(op, len(op.inputs)), unknown_rank,
                     lambda: [TensorSpec(None)] * len(op.outputs))
    return entries
