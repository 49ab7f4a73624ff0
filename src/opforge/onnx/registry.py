"""Converters: one small function per (domain, op_type), chosen by the model's opset.

A converter receives the node (attributes, opset, names) and its inputs --
traced ``Value``s, or ``numpy`` arrays when they are known at load time --
and returns the node's outputs by calling opforge ops.  Ops called on arrays
compute at once, so constant subgraphs fold while the model loads.
"""
from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..errors import ModelError, OpforgeError, SchemaError

if TYPE_CHECKING:
    from ..attrs import AttrDef, AttrValue
    from ..operator import Op

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = ["Converter", "NodeContext", "RunTimeValueError", "bind_op", "converter", "find_converter", "register"]


class RunTimeValueError(ModelError):
    """A converter needs, while converting, a value or size the model computes only at run time (a shape
    computed from unknown dims, a count a tensor holds).  ``load`` takes it as the sign to convert the model
    again per input signature (every dim then known), or to run it node by node on the call's arrays."""


@dataclass(frozen=True)
class Converter:
    domain: str
    op_type: str
    since: int
    function: Callable[..., Any]
    origin: str  # "builtin", or where a user registered it

    def call(self, node: NodeContext, args: Sequence[Any]) -> Any:
        """Run the converter on ``args``; inputs the node omits at the end are passed as None, and more
        inputs than the converter takes are a ModelError."""
        required, most = _arity(self.function)
        if most is not None and len(args) > most:
            raise node.error(f"the node has {len(args)} inputs; {node.op_type} takes at most {most}")
        if len(args) < required:
            args = list(args) + [None] * (required - len(args))
        return self.function(node, *args)


def _arity(function: Callable[..., Any]) -> tuple[int, int | None]:
    """(inputs after ``node`` without defaults, most inputs or None for ``*args``) of a converter."""
    cached = _ARITY.get(function)
    if cached is not None:
        return cached
    counts: tuple[int, int | None]
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        counts = (0, None)
    else:
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = max(0, sum(p.default is p.empty for p in positional) - 1)
        most = None if any(p.kind is p.VAR_POSITIONAL for p in params) else max(0, len(positional) - 1)
        counts = (required, most)
    _ARITY[function] = counts
    return counts


_ARITY: weakref.WeakKeyDictionary[Callable[..., object], tuple[int, int | None]] = weakref.WeakKeyDictionary()


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


def converter(op_type: str, *, domain: str = "", since: int = 1) -> Callable[[_F], _F]:
    """Register the decorated function as the converter of ``domain::op_type`` from opset ``since`` on."""
    def add(function: _F) -> _F:
        add_converter(Converter(domain, op_type, since, function, "builtin"))
        return function
    return add


def find_converter(domain: str, op_type: str, opset: int) -> Converter | None:
    """The converter with the greatest ``since`` <= ``opset``; for a custom domain ``D`` without one, the
    registered opforge op ``D::op_type`` bound to the node; else None."""
    chosen = None
    for entry in _CONVERTERS.get((normalize_domain(domain), op_type), ()):
        if entry.since <= opset:
            chosen = entry
    if chosen is None and normalize_domain(domain):
        from ..registry import lookup

        op = lookup(f"{domain}::{op_type}")
        if op is not None:
            chosen = Converter(domain, op_type, 1, bind_op(op), f"opforge op '{op.name}'")
    return chosen


# -- custom domains: nodes bound to opforge ops ------------------------------------------------------

#: The schema attribute types each ONNX attribute type may fill ("any" takes every one).
ATTRIBUTE_FITS = {
    "INT": ("int", "float", "bool", "DType"),
    "FLOAT": ("float",),
    "STRING": ("str", "DType"),
    "INTS": ("int[]", "float[]", "Shape"),
    "FLOATS": ("float[]",),
    "STRINGS": (),
    "TENSOR": ("int", "float", "bool", "int[]", "float[]", "Shape", "int[][]", "float[][]"),
}


def _attribute_value(node: NodeContext, op: Op, attr: AttrDef, onnx_name: str, onnx_type: str,
                     value: Any) -> AttrValue:
    """An ONNX attribute's value for the op attribute ``attr``; ModelError when the types do not fit."""
    from ..attrs import check_attr

    def refuse(why: str = "") -> ModelError:
        return node.error(f"attribute '{onnx_name}' is ONNX {onnx_type}; op '{op.name}' declares '{attr.name}' "
                          f"as {attr.type}{why}")

    if attr.type != "any" and attr.type not in ATTRIBUTE_FITS.get(onnx_type, ()):
        raise refuse()
    if onnx_type == "TENSOR":
        value = value.tolist() if attr.type.endswith("]") or attr.type == "Shape" else (
            value.reshape(-1)[0].item() if value.size == 1 else None)
        if value is None:
            raise refuse(" (a tensor of one element fills a scalar attribute)")
    elif attr.type == "bool":
        if value not in (0, 1):
            raise refuse(f" (an INT for a bool must be 0 or 1, got {value})")
        value = bool(value)
    elif attr.type == "DType" and onnx_type == "INT":
        from .load import onnx_dtype

        value = onnx_dtype(value, f"{node!r}: attribute '{onnx_name}'")
    try:
        return check_attr(op.name, attr, value)
    except OpforgeError as error:
        raise refuse(f": {error}") from None


def bind_op(op: Op, attributes: Mapping[str, str] | None = None) -> Callable[..., Any]:
    """A converter calling opforge op ``op`` for a node: ONNX inputs fill the op's tensor inputs in order,
    ONNX attributes its attributes by name (``attributes`` renames: {onnx name: opforge name}), and the
    op's outputs are the node's, in order."""
    renames = dict(attributes or {})
    renamed = set(renames.values())

    def convert(node: NodeContext, *given: Any) -> Any:
        inputs = list(given)
        while inputs and inputs[-1] is None and not op.variadic:
            inputs.pop()
        if op.variadic:
            if any(x is None for x in inputs):
                raise node.error(f"op '{op.name}' takes a list of tensors ({op.inputs[0].name}); the node omits "
                                 f"input {inputs.index(None)}")
        else:
            if len(inputs) > len(op.inputs):
                raise node.error(f"the node has {len(inputs)} inputs; op '{op.name}' takes at most "
                                 f"{len(op.inputs)} ({', '.join(i.name for i in op.inputs)})")
            inputs += [None] * (len(op.inputs) - len(inputs))
            for k, (x, declared) in enumerate(zip(inputs, op.inputs)):
                if x is None and not declared.optional:
                    raise node.error(f"op '{op.name}' needs input {k} ('{declared.name}'), which the node omits")
        values: dict[str, AttrValue] = {}
        for onnx_name, value in node.attrs.items():
            # A renamed attribute is reached only through its ONNX name.
            name = renames.get(onnx_name, None if onnx_name in renamed else onnx_name)
            onnx_type = node.attr_types.get(onnx_name, type(value).__name__)
            if name not in op.attrs:
                known = ", ".join(f"{a.name} ({a.type})" for a in op.attrs.values()) or "none"
                raise node.error(f"attribute '{onnx_name}' (ONNX {onnx_type}) is not an attribute of op "
                                 f"'{op.name}' (its attributes: {known})")
            values[name] = _attribute_value(node, op, op.attrs[name], onnx_name, onnx_type, value)
        for name, attr in op.attrs.items():
            if name not in values and attr.required:
                onnx_name = next((o for o, n in renames.items() if n == name), name)
                raise node.error(f"op '{op.name}' requires attribute '{name}' ({attr.type}); the node has no "
                                 f"attribute '{onnx_name}'")
        if node.num_outputs > len(op.outputs):
            raise node.error(f"the node declares {node.num_outputs} outputs; op '{op.name}' has "
                             f"{len(op.outputs)} ({', '.join(op.outputs)})")
        result = op.call(tuple(inputs), values)  # Op.call declares a tuple (it binds any sequence)
        return tuple(result) if op.tuple_output else result

    convert.op = op  # type: ignore[attr-defined]  # a function attribute: the op a bound converter calls
    return convert


def register(domain: str, op_type: str, op: Op | str, *, since_version: int = 1,
             attributes: Mapping[str, str] | None = None) -> Converter:
    """Bind ONNX nodes ``domain::op_type`` (from opset ``since_version`` of that domain on) to opforge op
    ``op`` (an Op or a registered name).  ``attributes={"onnx_name": "opforge_name"}`` renames attributes.
    Without a registration, a custom-domain node binds to the op named ``domain::op_type``."""
    from ..operator import Op
    from ..registry import lookup

    if not isinstance(domain, str) or not isinstance(op_type, str) or not op_type:
        raise SchemaError(f"opforge.onnx.register: domain and op_type are strings, got {domain!r}, {op_type!r}")
    if isinstance(op, str):
        found = lookup(op)
        if found is None:
            raise SchemaError(f"opforge.onnx.register: no op '{op}' is registered")
        op = found
    if not isinstance(op, Op):
        raise SchemaError(f"opforge.onnx.register: op is an opforge Op or the name of one, got {type(op).__name__}")
    if type(since_version) is not int or since_version < 1:
        raise SchemaError(f"opforge.onnx.register: since_version is an int >= 1, got {since_version!r}")
    renames = dict(attributes or {})
    unknown = sorted(name for name in renames.values() if name not in op.attrs)
    if unknown:
        raise SchemaError(f"opforge.onnx.register: attributes= maps to {unknown}, which op '{op.name}' does not "
                          f"have (its attributes: {', '.join(op.attrs) or 'none'})")
    return add_converter(Converter(domain, op_type, since_version, bind_op(op, renames),
                                   f"opforge.onnx.register -> op '{op.name}'"))


class NodeContext:
    """What a converter knows of its node."""

    def __init__(self, *, name: str, op_type: str, domain: str, opset: int, attrs: dict[str, Any],
                 input_names: Iterable[str], output_names: Iterable[str],
                 attr_types: Mapping[str, str] | None = None) -> None:
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
        # run_graph(subgraph, input values) -> its output values: the loader sets it (If, Loop, Scan bodies).
        self.run_graph: Callable[[Any, Sequence[Any]], list[Any]] = self._no_subgraphs

    def _no_subgraphs(self, graph: Any, values: Sequence[Any]) -> list[Any]:
        raise self.error("subgraphs run only inside opforge.onnx.load")

    def __repr__(self) -> str:
        return f"node '{self.name}' ({self.op_type})"

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def error(self, message: str) -> ModelError:
        return ModelError(f"{self!r}: {message}")

    def unknown(self, message: str) -> RunTimeValueError:
        """The error of a value or size this converter needs that is known only at run time."""
        return RunTimeValueError(f"{self!r}: {message}")

    def constant(self, value: Any, what: str = "input") -> npt.NDArray[Any] | None:
        """``value`` as an ndarray; a ModelError when it is only known at run time."""
        if value is None or isinstance(value, np.ndarray):
            return value
        if isinstance(value, (int, float, bool, np.generic)):
            return np.asarray(value)
        raise self.unknown(f"{what} must be known when the model is loaded (an initializer, a Constant or computed "
                         f"from them); it is computed at run time")

    def static_shape(self, value: Any, what: str = "input") -> tuple[int, ...]:
        if isinstance(value, np.ndarray):
            shape: tuple[int, ...] = value.shape
            return shape
        spec = getattr(value, "spec", None)
        if spec is None or spec.rank is None or any(d < 0 for d in spec.shape):
            shown = "unknown rank" if spec is None or spec.rank is None else list(spec.shape)
            raise self.unknown(f"the shape of {what} must be known when the model is loaded; it is {shown}")
        return tuple(spec.shape)
