"""The op registry: qualified name -> Op, and ``op(schema)`` to declare one.

Names are ``namespace::name``; ops without a namespace live in the default
(flat) one.  Registering a taken name is an error unless ``replace=True``.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from types import FrameType

from .errors import SchemaError
from .operator import Op
from .schema import parse_schema

TRAITS = frozenset({"no_grad", "cpu_only", "no_side_effect", "always_compute", "support_non_contiguous",
                    "elementwise", "view"})

_ops: dict[str, Op] = {}


def register(op: Op, *, replace: bool = False) -> Op:
    if op.name in _ops and not replace:
        raise SchemaError(f"op '{op.name}' is already registered; pass replace=True to replace it, "
                          "or give it a namespace ('mylib::name')")
    _ops[op.name] = op
    _forget_function(op.name)
    return op


#: Called with an op's name when it is registered again or removed (the
#: functional API drops the function it cached for it).
LISTENERS: list[Callable[[str], object]] = []


def _forget_function(name: str) -> None:
    for listener in LISTENERS:
        listener(name)


def unregister(name: str) -> None:
    _ops.pop(name, None)
    _forget_function(name)


def lookup(name: str) -> Op | None:
    """The registered op called ``name`` (``'add'``, ``'mylib::scale'``), or None."""
    if not isinstance(name, str):
        raise SchemaError(f"an op name is a string such as 'add' or 'mylib::scale', got {name!r}")
    return _ops.get(name)


def registered_ops() -> list[Op]:
    """Every registered op, built-ins included, sorted by name."""
    return [_ops[name] for name in sorted(_ops)]


def op(schema: str, *, traits: Iterable[str] = (), doc: str | None = None, replace: bool = False) -> Op:
    """Declare and register an op from a schema string.

    ``opforge.op("mylib::leaky_relu(Tensor x, *, float alpha=0.01) -> Tensor y")``
    returns the ``Op``; attach inference, checks and kernels to it with
    ``@op.infer``, ``@op.check``, ``op.kernel(...)``; call it directly or as
    ``opforge.ops.mylib.leaky_relu``.
    """
    parsed = parse_schema(schema)
    trait_set = frozenset(traits)
    unknown = trait_set - TRAITS
    if unknown:
        raise SchemaError(f"op '{parsed.qualified_name}': unknown trait(s) {sorted(unknown)}; "
                          f"known: {', '.join(sorted(TRAITS))}")
    new = Op(parsed.qualified_name, parsed.inputs, parsed.outputs, parsed.attrs, traits=trait_set, doc=doc)
    new.schema = schema
    new.defined_at = _caller()
    return register(new, replace=replace)


def _caller() -> str | None:
    """``file:line`` of the code that declared an op: the first frame outside opforge's core."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(("opforge.registry", "opforge.frontends",
                                                                               "opforge.compat")):
        frame = frame.f_back
    return None if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"
