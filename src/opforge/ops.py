"""The functional API: every registered op as ``opforge.ops.<name>`` (default
namespace) or ``opforge.ops.<namespace>.<name>``, a real Python function with
the schema's signature and a docstring generated from it.
"""
from __future__ import annotations

import inspect

from . import registry
from .attrs import REQUIRED

_functions = {}  # op name -> (op, function)


def _call(op, tensors, attrs):
    """Call with the launcher for these raw attribute values, binding them only once."""
    try:  # (types too: 1, 1.0 and True are equal keys in Python but different attributes)
        key = (len(tensors), tuple(attrs.values()), tuple(map(type, attrs.values())))
        launcher = op._fast_calls.get(key)
    except TypeError:  # unhashable attribute values (lists): the general path
        key, launcher = None, None
    if launcher is None:
        if any(t is None for t in tensors) or op.variadic and not tensors:
            return op.call(tuple(tensors), attrs)
        from .runtime.dispatch import launcher_for

        launcher = launcher_for(op, op.resolve_attrs(attrs), len(tensors))
        if key is not None:
            op._fast_calls.put(key, launcher)
    return launcher(*tensors)


def signature_of(op) -> inspect.Signature:
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


def docstring_of(op) -> str:
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


def function_for(op):
    """The generated Python function of an op (cached per op object)."""
    cached = _functions.get(op.name)
    if cached is not None and cached[0] is op:
        return cached[1]
    signature = signature_of(op)
    # The function is generated as source so that Python itself binds and
    # checks arguments (as fast as any call) and its signature is real.
    P = inspect.Parameter
    pieces, defaults, star_done = [], {}, False
    for p in signature.parameters.values():
        if p.kind == P.VAR_POSITIONAL:
            pieces.append(f"*{p.name}")
            star_done = True
            continue
        if p.kind == P.KEYWORD_ONLY and not star_done:
            pieces.append("*")
            star_done = True
        if p.default is P.empty:
            pieces.append(p.name)
        else:
            defaults[p.name] = p.default
            pieces.append(f"{p.name}=_defaults[{p.name!r}]")
    if op.variadic:
        tensors = op.inputs[0].name
    else:
        tensors = "(" + "".join(f"{i.name}, " for i in op.inputs) + ")"
    attrs = "{" + ", ".join(f"{a!r}: {a}" for a in op.attrs) + "}"
    short = op.name.split("::")[-1]
    source = f"def {short}({', '.join(pieces)}):\n    return _call(_op, {tensors}, {attrs})\n"
    namespace = {"_call": _call, "_op": op, "_defaults": defaults}
    exec(compile(source, f"<opforge.ops.{short}>", "exec"), namespace)
    function = namespace[short]

    function.__signature__ = signature
    function.__doc__ = docstring_of(op)
    function.op = op
    _functions[op.name] = (op, function)
    return function


class Namespace:
    """``opforge.ops.<namespace>``: the ops registered as ``namespace::name``."""

    def __init__(self, prefix):
        self._prefix = prefix

    def __getattr__(self, name):
        op = registry.lookup(f"{self._prefix}{name}")
        if op is not None:
            found = function_for(op)
        elif not self._prefix and any(o.name.startswith(f"{name}::") for o in registry.registered_ops()):
            found = Namespace(f"{name}::")
        else:
            raise AttributeError(f"no op '{self._prefix}{name}' is registered")
        # Cached as a plain attribute, so later lookups cost a dict access;
        # forget() drops it when the op is replaced.
        (globals() if self is _root else self.__dict__)[name] = found
        return found

    def __dir__(self):
        names = set()
        for o in registry.registered_ops():
            if o.name.startswith(self._prefix):
                names.add(o.name[len(self._prefix):].split("::")[0])
        return sorted(names)


_root = Namespace("")


def forget(name):
    """Drop the cached function of op ``name`` (it was replaced or removed)."""
    _functions.pop(name, None)
    prefix, _, short = name.rpartition("::")
    if not prefix:
        globals().pop(short, None)
    elif isinstance(globals().get(prefix), Namespace):
        globals()[prefix].__dict__.pop(short, None)


def __getattr__(name):
    return getattr(_root, name)


def __dir__():
    return dir(_root)


registry.LISTENERS.append(forget)
