"""Converters: one small function per (domain, op_type), chosen by the model's opset.

A converter receives the node (attributes, opset, names) and its inputs --
traced ``Value``s, or ``numpy`` arrays when they are known at load time --
and returns the node's outputs by calling opforge ops.  Ops called on arrays
compute at once, so constant subgraphs fold while the model loads.
"""
from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ModelError

__all__ = ["Converter", "NodeContext", "converter", "find_converter"]


@dataclass(frozen=True)
class Converter:
    domain: str
    op_type: str
    since: int
    function: Callable
    origin: str  # "builtin", or where a user registered it

    def call(self, node, args):
        """Run the converter on ``args``; inputs the node omits at the end are passed as None."""
        wanted = _required_positional(self.function)
        if wanted is not None and len(args) < wanted:
            args = list(args) + [None] * (wanted - len(args))
        return self.function(node, *args)


def _required_positional(function):
    """How many inputs (after ``node``) ``function`` takes without defaults; None when it takes ``*args``."""
    cached = _ARITY.get(function)
    if cached is not None or function in _ARITY:
        return cached
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        count = None
    else:
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            count = None
        else:
            count = max(0, sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
                               for p in params) - 1)
    _ARITY[function] = count
    return count


_ARITY: dict = {}


_CONVERTERS: dict[tuple[str, str], list[Converter]] = {}
_LOCK = threading.Lock()


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def add_converter(entry: Converter) -> Converter:
    key = (normalize_domain(entry.domain), entry.op_type)
    with _LOCK:
        entries = [c for c in _CONVERTERS.get(key, []) if c.since != entry.since]
        entries.append(entry)
        entries.sort(key=lambda c: c.since)
        _CONVERTERS[key] = entries
    return entry


def converter(op_type: str, *, domain: str = "", since: int = 1):
    """Register the decorated function as the converter of ``domain::op_type`` from opset ``since`` on."""
    def register(function):
        add_converter(Converter(domain, op_type, since, function, "builtin"))
        return function
    return register


def find_converter(domain: str, op_type: str, opset: int) -> Converter | None:
    """The converter with the greatest ``since`` <= ``opset``, or None."""
    chosen = None
    for entry in _CONVERTERS.get((normalize_domain(domain), op_type), ()):
        if entry.since <= opset:
            chosen = entry
    return chosen


class NodeContext:
    """What a converter knows of its node."""

    def __init__(self, *, name, op_type, domain, opset, attrs, input_names, output_names, attr_types=None):
        self.name = name
        self.op_type = op_type
        self.domain = domain
        self.opset = opset
        self.attrs = attrs
        self.attr_types = dict(attr_types or {})  # {name: ONNX AttributeType name, e.g. "INT"}
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        while self.output_names and not self.output_names[-1]:
            self.output_names.pop()
        self.num_outputs = len(self.output_names)

    def __repr__(self):
        return f"node '{self.name}' ({self.op_type})"

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def error(self, message) -> ModelError:
        return ModelError(f"{self!r}: {message}")

    def constant(self, value, what="input"):
        """``value`` as an ndarray; a ModelError when it is only known at run time."""
        if value is None or isinstance(value, np.ndarray):
            return value
        if isinstance(value, (int, float, bool, np.generic)):
            return np.asarray(value)
        raise self.error(f"{what} must be known when the model is loaded (an initializer, a Constant or computed "
                         f"from them); it is computed at run time")

    def static_shape(self, value, what="input") -> tuple:
        if isinstance(value, np.ndarray):
            return value.shape
        spec = getattr(value, "spec", None)
        if spec is None or spec.rank is None or any(d < 0 for d in spec.shape):
            shown = "unknown rank" if spec is None or spec.rank is None else list(spec.shape)
            raise self.error(f"the shape of {what} must be known when the model is loaded; it is {shown}")
        return tuple(spec.shape)
