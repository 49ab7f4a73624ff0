"""Output shapes from opforge's inference when torch traces with symbolic sizes.

Under ``torch.compile`` or ``torch.export`` a dim may be a SymInt.  Inference
sees it as unknown (-1).  An output dim inference can only give as unknown is
found as an expression of the inputs' symbols: inference runs again on the
sizes torch traced with (each symbol's hint), then with each symbol moved by
2; a dim that moves by whole multiples, and predicts one more run, is that
linear combination of the symbols (a shared dim, a concat's sum).  Anything
else (a strided conv's floor division) is computed from the sizes themselves,
which makes torch guard on them (a specialization, never a wrong shape).  A
dim inference cannot give even from sizes depends on the data: the caller
makes it an unbacked size.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..spec import TensorSpec
from .schema import dtype_name

if TYPE_CHECKING:
    import torch

    from ..attrs import AttrValue
    from ..operator import Op

_NO_HINT = 1024  # where a symbol without a hint (an unbacked size) is evaluated


class Signature:
    """The specs of tensors whose dims may be SymInts, and where each symbol sits."""

    unknown: list[TensorSpec | None]
    where: list[list[int | None] | None]  # per dim of each tensor: the index of its symbol, or None
    dtypes: list[str | None]

    def __init__(self, op: Op, tensors: Sequence[Any], names: Sequence[str] | None = None) -> None:
        self.op = op
        self.symbols: list[tuple[torch.SymInt, int]] = []  # [(SymInt, the size it is evaluated at)]
        index_of: dict[str, int] = {}
        dims: list[int]
        where: list[int | None]
        self.unknown, self.where, self.dtypes = [], [], []
        for k, t in enumerate(tensors):
            if t is None:
                self.unknown.append(None)
                self.where.append(None)
                self.dtypes.append(None)
                continue
            what = f"input '{op.input_name(k)}'" if names is None else f"'{names[k]}'"
            dtype = dtype_name(t.dtype, op=op, what=what)
            dims, where = [], []
            for d in t.shape:
                if isinstance(d, int):
                    dims.append(d)
                    where.append(None)
                    continue
                key = str(d)
                if key not in index_of:
                    hint = getattr(d.node, "hint", None)
                    index_of[key] = len(self.symbols)
                    self.symbols.append((d, int(hint) if hint is not None else _NO_HINT + 2 * len(self.symbols)))
                dims.append(-1)
                where.append(index_of[key])
            self.unknown.append(TensorSpec(dims, dtype))
            self.where.append(where)
            self.dtypes.append(dtype)

    def evaluated(self, shift: Mapping[int, int] | None = None) -> list[TensorSpec | None]:
        """The specs with every symbol at its size (plus ``shift[symbol index]``)."""
        shift = shift or {}
        specs: list[TensorSpec | None] = []
        for spec, where, dtype in zip(self.unknown, self.where, self.dtypes):
            if spec is None:
                specs.append(None)
                continue
            # (where is None only for an absent tensor, whose spec is None)
            specs.append(TensorSpec([d if at is None else self.symbols[at][1] + shift.get(at, 0)
                                     for d, at in zip(spec.shape, where)], dtype))  # type: ignore[arg-type]
        return specs

    def output_dims(self, attrs: Mapping[str, AttrValue], out_specs: Sequence[TensorSpec],
                    concrete_specs: Callable[[], Sequence[TensorSpec | None]]) -> list[list[Any]]:
        """Each output's dims: ints, SymInt expressions, or -1 for a size only the data
        decides.  ``concrete_specs()`` gives the inputs' specs with symbols specialized."""
        shapes = [list(s.shape) for s in out_specs]
        if not self.symbols or not any(d < 0 for shape in shapes for d in shape):
            return shapes
        op = self.op

        def run(shift: Mapping[int, int]) -> list[tuple[int, ...]] | None:
            try:
                return [s.shape for s in op.infer_specs(self.evaluated(shift), attrs)]
            except Exception:  # the moved sizes broke one of the op's checks
                return None

        base = run({})
        # Each symbol is moved alone.  One whose move breaks the op's checks is tied to something:
        # symbols that move together (two inputs' batch dims that must match) are one variable, with
        # a guard that they are equal, as torch's own ops add; one tied to a fixed size (a matmul's
        # inner dim against a parameter's) is pinned, with a guard on its size.  The other symbols
        # stay free, so the batch size of matmul(x, weight) never recompiles.
        count = len(self.symbols)
        variables: list[list[int]] = []  # the symbols each variable moves
        moved: list[list[tuple[int, ...]]] = []  # the output shapes with each variable moved by 2
        check = None
        if base is not None:
            alone = [run({k: 2}) for k in range(count)]
            tied = [k for k in range(count) if alone[k] is None]
            variables = [[k] for k in range(count) if k not in tied]
            moved = [found for found in alone if found is not None]
            equal = len(tied) > 1 and len({self.symbols[k][1] for k in tied}) == 1
            together = run(dict.fromkeys(tied, 2)) if equal else None
            if together is not None:
                variables.append(tied)
                moved.append(together)
            check = run({k: 2 * (v + 1) for v, members in enumerate(variables) for k in members}) if variables \
                else None
        if check is None:
            variables = []
        result = []
        for o, shape in enumerate(shapes):
            dims = []
            for at, d in enumerate(shape):
                found = None
                if d < 0 and base is not None and check is not None:
                    found = self._linear(base[o][at], [members[0] for members in variables],
                                         [m[o][at] for m in moved], check[o][at])
                dims.append(d if d >= 0 else found if found is not None else -1)
            result.append(dims)
        if any(isinstance(d, int) and d < 0 for dims in result for d in dims):
            concrete = op.infer_specs(concrete_specs(), attrs)  # every symbol specialized
            return [[c if isinstance(d, int) and d < 0 else d for d, c in zip(dims, spec.shape)]
                    for dims, spec in zip(result, concrete)]
        # the guards the dims above assume
        in_variables = {k for members in variables for k in members}
        for members in variables:
            for k in members[1:]:
                bool(self.symbols[k][0] == self.symbols[members[0]][0])
        for k in range(count):
            if k not in in_variables:
                int(self.symbols[k][0])
        return result

    def _linear(self, base: int, variables: Sequence[int], moved: Sequence[int],
                check: int) -> int | torch.SymInt | None:
        """``base`` as ``c0 + sum(c_v * symbol_v)`` over the variables (each named by one of its
        symbols) from the dims ``moved`` gave (variable v moved by 2), verified on ``check`` (each
        variable v moved by 2(v+1)); None when it is not such a combination with integer
        coefficients."""
        if base < 0 or check < 0 or any(m < 0 for m in moved):
            return None
        steps = [m - base for m in moved]
        if any(step % 2 for step in steps):
            return None
        coefficients = [step // 2 for step in steps]
        if base + sum(c * 2 * (v + 1) for v, c in enumerate(coefficients)) != check:
            return None
        value = base - sum(c * self.symbols[k][1] for c, k in zip(coefficients, variables))
        for c, k in zip(coefficients, variables):
            if c:
                value = value + c * self.symbols[k][0]
        return value
