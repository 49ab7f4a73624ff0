"""The functional API: every registered op as ``opforge.ops.<name>`` (default
namespace) or ``opforge.ops.<namespace>.<name>``, a real Python function with
the schema's signature and a docstring generated from it.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from . import _native, registry
from .attrs import REQUIRED
from .errors import ArityError, AttrError
from .operator import Op

if TYPE_CHECKING:
    from typing import Protocol

    class _GeneratedFunction(Protocol):
        """What ``function_for`` makes: a function that also carries its signature and op."""

        __name__: str
        __qualname__: str
        __signature__: inspect.Signature
        _describe: Callable[[], str]
        _reduce: Callable[[], tuple[Any, ...]]
        op: Op

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

_functions: dict[str, tuple[Op, Callable[..., Any]]] = {}  # op name -> (op, function)


def signature_of(op: Op) -> inspect.Signature:
    """The Python signature of ``opforge.ops.<name>``: inputs, then attributes with their defaults."""
    P = inspect.Parameter
    params = []
    for i in op.inputs:
        if i.variadic:
            params.append(P(i.name, P.VAR_POSITIONAL))
        else:
            params.append(P(i.name, P.POSITIONAL_OR_KEYWORD, default=None if i.optional else P.empty))
    for a in op.attrs.values():
        kind = P.POSITIONAL_OR_KEYWORD if a.positional and not op.variadic else P.KEYWORD_ONLY
        params.append(P(a.name, kind, default=P.empty if a.default is REQUIRED else a.default))
    # Python forbids a required positional after a defaulted one; such attributes become keyword-only.
    seen_default = False
    for k, p in enumerate(params):
        if p.kind == P.POSITIONAL_OR_KEYWORD:
            if p.default is not P.empty:
                seen_default = True
            elif seen_default:
                params[k] = p.replace(kind=P.KEYWORD_ONLY)
    params.sort(key=lambda p: p.kind == P.KEYWORD_ONLY)
    return inspect.Signature(params)


def docstring_of(op: Op) -> str:
    """The docstring of ``opforge.ops.<name>``: schema, doc, attributes, traits and kernels."""
    lines = [getattr(op, "schema", repr(op)), ""]
    if op.doc:
        lines += [op.doc, ""]
    if op.attrs:
        lines.append("Attributes:")
        for a in op.attrs.values():
            default = "required" if a.default is REQUIRED else f"default {a.default!r}"
            lines.append(f"    {a.name} ({a.type}): {default}")
    if op.traits:
        lines.append(f"Traits: {', '.join(sorted(op.traits))}")
    if op.kernels:
        lines.append("Kernels: " + ", ".join(f"{k.name} ({k.device})" for k in op.kernels))
    return "\n".join(lines)


_MISSING = object()  # an argument the call did not give


def function_for(op: Op) -> Callable[..., Any]:
    """The generated Python function of an op (cached per op object)."""
    cached = _functions.get(op.name)
    if cached is not None and cached[0] is op:
        return cached[1]
    signature = signature_of(op)
    # The function is generated as source, so that a well-formed call costs one
    # Python frame and its signature is real.  Python's own binding must never
    # fail (it would raise a bare TypeError), so every parameter has a default,
    # positional ones are positional-only, and extra or unknown arguments are
    # collected: any call the fast path does not take goes to _bind_by_name.
    P = inspect.Parameter
    params = signature.parameters.values()
    positional = [p.name for p in params if p.kind == P.POSITIONAL_OR_KEYWORD]
    keyword = [p.name for p in params if p.kind == P.KEYWORD_ONLY]
    defaults = {p.name: p.default for p in params if p.default is not P.empty}
    required = [p.name for p in params if p.default is P.empty and p.kind != P.VAR_POSITIONAL]
    pieces = [f"{name}=_MISSING" for name in positional] + (["/"] if positional else [])
    pieces.append(f"*{op.inputs[0].name}" if op.variadic else "*_extra")
    pieces += [f"{name}={'_MISSING' if name in required else f'_defaults[{name!r}]'}" for name in keyword]
    pieces.append("**_unknown")
    off_path = ["_unknown"] + ([] if op.variadic else ["_extra"]) + [f"{name} is _MISSING" for name in required]
    if op.variadic:
        given = op.inputs[0].name
    else:
        given = "(" + "".join(f"{name}, " for name in positional) + ") + _extra"
    by_name = "{" + ", ".join(f"{name!r}: {name}" for name in keyword) + "}"
    fill = "".join(f"    if {name} is _MISSING:\n        {name} = _defaults[{name!r}]\n"
                   for name in positional if name in defaults)
    # The call itself is the op object's: without attributes (or with every one at its
    # default, the same objects) the op's default launcher; else its launcher for these
    # keyword values, which the op's C base remembers.
    tensors = f"*{op.inputs[0].name}" if op.variadic else ", ".join(i.name for i in op.inputs)
    attrs = ", ".join(f"{a}={a}" for a in op.attrs)
    at_defaults = " and ".join(f"{a} is _defaults[{a!r}]" for a in op.attrs if a in defaults)
    if attrs and at_defaults and all(a in defaults for a in op.attrs):
        fill += f"    if {at_defaults}:\n        return _op({tensors})\n"
    short = op.name.split("::")[-1]
    source = (f"def _function({', '.join(pieces)}):\n"
              f"    if {' or '.join(off_path)}:\n"
              f"        return _bind_by_name(_op, {given}, {{**{by_name}, **_unknown}})\n"
              f"{fill}"
              f"    return _op({', '.join(filter(None, [tensors, attrs]))})\n")
    namespace: dict[str, Any] = {"_bind_by_name": _bind_by_name, "_op": op, "_defaults": defaults, "_MISSING": _MISSING}
    exec(compile(source, f"<opforge.ops.{short}>", "exec"), namespace)
    # The generated function binds every call; _native.OpFunction sends the usual ones (tensors by position,
    # attributes by keyword: a schema lists its tensors first) straight to the op object, with no Python frame.
    function: _GeneratedFunction = _native.OpFunction(
        op, namespace["_function"], -1 if op.variadic else len(op.inputs), frozenset(op.attrs),
        tuple(name for name in op.attrs if name in required))
    function.__name__ = function.__qualname__ = short  # may be a Python keyword: 'mylib::def' is ops.mylib.def
    function.__module__ = __name__
    function.__signature__ = signature
    function._describe = functools.partial(docstring_of, op)  # __doc__, made when read: kernels come later
    function._reduce = functools.partial(_reduce, op.name)
    function.op = op
    _functions[op.name] = (op, function)
    return function


def _bind_by_name(op: Op, given: Iterable[Any], by_name: dict[str, Any]) -> Any:
    """Bind a call the generated function's fast path does not take (a tensor
    given by name, a missing or extra argument, an unknown keyword) as Python
    would, but raising opforge's errors: ArityError for tensors, AttrError for
    attributes.  ``given`` holds the positional arguments (unfilled slots are
    _MISSING), ``by_name`` the keyword ones."""
    P = inspect.Parameter
    params = signature_of(op).parameters
    slots = [p.name for p in params.values() if p.kind == P.POSITIONAL_OR_KEYWORD]
    args = []
    for value in given:  # what the caller passed by position: everything before the first unfilled slot
        if value is _MISSING:
            break
        args.append(value)
    inputs = ", ".join(i.name for i in op.inputs)
    if op.variadic:
        values = {op.inputs[0].name: tuple(args)}
    elif len(args) > len(slots):
        raise ArityError(f"op '{op.name}' takes {len(slots)} positional argument(s) ({', '.join(slots)}), "
                         f"got {len(args)}")
    else:
        values = dict(zip(slots, args))
    for name, value in by_name.items():
        if value is _MISSING:  # a keyword-only attribute the call did not give
            continue
        if name not in params or params[name].kind == P.VAR_POSITIONAL:
            raise AttrError(f"op '{op.name}' has no input or attribute '{name}' "
                            f"(inputs: {inputs or 'none'}; attributes: {', '.join(op.attrs) or 'none'})")
        if name in values:
            error = ArityError if any(i.name == name for i in op.inputs) else AttrError
            raise error(f"op '{op.name}': '{name}' is given twice, by position and by name")
        values[name] = value
    if op.variadic:
        tensors = values.pop(op.inputs[0].name)
    else:
        missing = [i.name for i in op.inputs if not i.optional and i.name not in values]
        if missing:
            raise ArityError(f"op '{op.name}' takes {len(op.inputs)} tensor input(s) ({inputs}), "
                             f"got {len(op.inputs) - len(missing)}; missing: {', '.join(missing)}")
        tensors = tuple(values.pop(i.name, None) for i in op.inputs)
    for name, attr in op.attrs.items():
        if name not in values and attr.default is REQUIRED:
            raise AttrError(f"op '{op.name}': required attribute '{name}' ({attr.type}) was not given")
    return op(*tensors, **values)


class Namespace:
    """``opforge.ops.<namespace>``: the ops registered as ``namespace::name``."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        op = registry.lookup(f"{self._prefix}{name}")
        found: Callable[..., Any] | Namespace
        if op is not None:
            found = function_for(op)
        elif any(o.name.startswith(f"{self._prefix}{name}::") for o in registry.registered_ops()):
            found = Namespace(f"{self._prefix}{name}::")
        else:
            raise AttributeError(f"no op '{self._prefix}{name}' is registered")
        self.__dict__[name] = found  # later lookups cost a dict access; forget() drops it when the op changes
        return found

    def __dir__(self) -> list[str]:
        names: set[str] = set()
        for o in registry.registered_ops():
            if o.name.startswith(self._prefix):
                names.add(o.name[len(self._prefix):].split("::")[0])
        return sorted(names)


def function_named(name: str) -> Callable[..., Any]:
    """The function of the registered op ``name`` (how a pickled function comes back)."""
    op = registry.lookup(name)
    if op is None:
        raise AttributeError(f"no op '{name}' is registered")
    return function_for(op)


def _reduce(name: str) -> tuple[Any, ...]:
    return (function_named, (name,))


def forget(name: str) -> None:
    """Drop the function of op ``name`` (it was replaced or removed)."""
    _functions.pop(name, None)
    prefix, _, short = name.rpartition("::")
    if not prefix:
        if isinstance(globals().get(short), _native.OpFunction):  # never a namespace, nor this module's own
            del globals()[short]
        return
    top, *inner = prefix.split("::")
    namespace = globals().get(top)
    for part in inner:
        namespace = namespace.__dict__.get(part) if isinstance(namespace, Namespace) else None
    if isinstance(namespace, Namespace):
        namespace.__dict__.pop(short, None)


def publish(name: str) -> None:
    """Keep ``opforge.ops`` in step with the registry (op ``name`` was registered, replaced or removed).

    Each op without a namespace is a global of this module and each namespace a Namespace, put here
    when they are registered rather than made on first use by a module ``__getattr__``: CPython does not
    specialise attribute loads on a module that has one, which would cost every ``ops.NAME(...)`` call
    about 25 ns.  A name this module uses itself stays this module's, and an op's name is not taken
    over by a namespace of the same name.
    """
    op = registry.lookup(name)
    top = name.split("::")[0]
    if op is None:
        forget(name)
        if "::" not in name and name not in globals() and any(o.name.startswith(f"{name}::")
                                                               for o in registry.registered_ops()):
            globals()[name] = Namespace(f"{name}::")  # the name an op held is its namespace's again
    elif "::" in name:
        forget(name)  # a namespace makes its functions on first use
        if top not in globals():
            globals()[top] = Namespace(f"{top}::")
    elif name not in _OWN_NAMES:
        _functions.pop(name, None)
        try:
            function = function_for(op)  # made before it replaces the old one: the name never goes missing
        except (ValueError, SyntaxError):  # a name Python cannot take as a parameter: the op is lookup()'s only
            forget(name)
            return
        globals()[name] = function


if TYPE_CHECKING:  # for type checkers only: the ops are made at run time (a real one would slow every call)
    def __getattr__(name: str) -> Any: ...


def __dir__() -> list[str]:
    names = {o.name.split("::")[0] for o in registry.registered_ops()}
    return sorted(names - _OWN_NAMES)


_OWN_NAMES = frozenset(globals()) | {"_OWN_NAMES", "__all__"}
# `from opforge.ops import *` takes this module's own names, not every op (abs, pow, sum would shadow Python's).
__all__ = sorted(name for name in _OWN_NAMES if not name.startswith("_"))
registry.LISTENERS.append(publish)
for _op in registry.registered_ops():
    publish(_op.name)
