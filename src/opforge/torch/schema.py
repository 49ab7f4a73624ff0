"""opforge schemas as ``torch.library`` schemas, and torch's values as opforge's.

An opforge op ``ns::name`` becomes ``torch.ops.<ns>.<name>``; a dotted
namespace (an ONNX domain such as ``com.example``) has its dots replaced by
underscores, and the built-ins, which have no namespace, live in ``opforge``.
Tensor inputs keep their kind (``Tensor``, ``Tensor?``, ``Tensor[]``);
attributes map to torch's types, with ``Shape`` as ``SymInt[]`` so dynamic
shapes flow through ``torch.compile``.  A default torch's schema language
cannot write (an infinity, a dtype) becomes ``T? name=None``, and ``None``
is read back as opforge's default, so both give the same value.
"""
from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import torch

from ..attrs import REQUIRED
from ..dtypes import ABI_DTYPES
from ..errors import DTypeError, SchemaError

if TYPE_CHECKING:
    from ..attrs import AttrDef
    from ..operator import Op

BUILTIN_NAMESPACE = "opforge"

_TYPES = {"bool": "bool", "int": "int", "float": "float", "str": "str", "int[]": "int[]", "float[]": "float[]",
          "Shape": "SymInt[]", "DType": "ScalarType"}

_TORCH_DTYPES = {name: getattr(torch, name) for name in ABI_DTYPES if isinstance(getattr(torch, name, None),
                                                                                    torch.dtype)}
_OPFORGE_DTYPES = {dtype: name for name, dtype in _TORCH_DTYPES.items()}


def qualified_name(op: Op) -> tuple[str, str]:
    """(torch namespace, op name) of an opforge op."""
    namespace, _, name = op.name.rpartition("::")
    return (namespace.replace(".", "_") if namespace else BUILTIN_NAMESPACE), name


def _literal(value: object) -> str | None:
    """A default as torch's schema writes it, or None where it has no way to."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # torch reads floats with std::stod, which refuses infinities and subnormals
        return repr(value) if math.isfinite(value) and (value == 0 or abs(value) >= sys.float_info.min) else None
    if isinstance(value, str):
        return "'" + value + "'" if "'" not in value and "\\" not in value else None
    if isinstance(value, tuple):
        items = [item for item in map(_literal, value) if item is not None]
        return "[" + ", ".join(items) + "]" if len(items) == len(value) else None
    return None


def _type_of_value(value: object) -> str | None:
    """The torch type of an untyped (``any``) attribute, from its default: such attributes
    (MindSpore ``Custom``'s) reach the kernel with their value's own type."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, tuple) and value and all(type(v) is int for v in value):
        return "int[]"
    if isinstance(value, tuple) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in value):
        return "float[]"
    return None


def torch_schema(op: Op) -> str:
    """The ``torch.library`` schema of ``op`` (without its namespace)."""
    # torch takes no positional parameter without a default after one with a default
    positional = [(i.optional, i) for i in op.inputs] + [(a.default is not REQUIRED, a) for a in op.attrs.values()
                                                          if a.positional]
    may_default, later_required = set(), False
    for has_default, item in reversed(positional):
        later_required = later_required or not has_default
        if has_default and not later_required:
            may_default.add(id(item))
    params = []
    for tensor in op.inputs:
        kind = "Tensor[]" if tensor.variadic else "Tensor?" if tensor.optional else "Tensor"
        params.append(f"{kind} {tensor.name}" + ("=None" if id(tensor) in may_default else ""))
    star = False
    for attr in op.attrs.values():
        torch_type = _TYPES.get(attr.type) or _type_of_value(attr.default)
        if torch_type is None:
            raise SchemaError(f"op '{op.name}': attribute '{attr.name}' has type {attr.type}"
                              + (" and no default to take a type from" if attr.type == "any" else "")
                              + f", which PyTorch's schemas cannot express (they take {', '.join(_TYPES)})")
        if not attr.positional and not star:
            params.append("*")
            star = True
        if attr.default is REQUIRED or (attr.positional and id(attr) not in may_default):
            params.append(f"{torch_type} {attr.name}")
            continue
        literal = None if attr.type == "DType" else _literal(attr.default)
        params.append(f"{torch_type} {attr.name}={literal}" if literal is not None
                      else f"{torch_type}? {attr.name}=None")  # None reads back as opforge's default
    outputs = ", ".join(f"Tensor {name}" for name in op.outputs)
    name = qualified_name(op)[1]
    return f"{name}({', '.join(params)}) -> " + (f"({outputs})" if op.tuple_output else outputs)


def torch_dtype(name: str) -> Any:
    return _TORCH_DTYPES[name]


def dtype_name(dtype: Any, *, op: Op | None = None, what: str = "a tensor") -> str:
    """The opforge (ABI) name of a torch dtype; DTypeError for one kernels cannot take."""
    name = _OPFORGE_DTYPES.get(dtype)
    if name is None:
        where = f"op '{op.name}': " if op is not None else ""
        raise DTypeError(f"{where}{what} has dtype {dtype}, which opforge kernels do not take "
                         f"(they take {', '.join(_TORCH_DTYPES)})")
    return name


def attr_value(op: Op, attr: AttrDef, value: Any) -> object:
    """One attribute as torch handed it, as opforge takes it."""
    if value is None and attr.default is not REQUIRED:  # the `T? name=None` spelling of a default
        return attr.default
    if attr.type == "DType" and isinstance(value, torch.dtype):
        return dtype_name(value, op=op, what=f"attribute '{attr.name}'")
    if isinstance(value, list):
        return [int(v) if isinstance(v, torch.SymInt) else v for v in value]
    return value
