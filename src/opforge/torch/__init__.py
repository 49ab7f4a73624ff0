"""opforge ops as PyTorch ops (``pip install "opforge[torch]"``).

``opforge.torch.register(op)`` defines ``torch.ops.<ns>.<name>`` through
``torch.library``: the schema translated from opforge's, the op's kernels
running on the tensors' own memory (CPU and CUDA, the current stream, outputs
from torch's allocator), a fake kernel from opforge's inference (so
``torch.compile`` and ``torch.export`` trace it without a graph break) and an
autograd formula from its gradient rule.  Built-ins, which have no namespace,
appear as ``torch.ops.opforge.<name>``.

Importing this module registers every op opforge knows, and each op declared
later, as it is declared: compiled torch programs (inductor's caches included)
may name any of them, a gradient rule's ops among them.  An opforge op called
on torch tensors runs as its torch op, so it records autograd.  torch is
imported only here.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import SchemaError
from ..operator import Op
from ..registry import LISTENERS, lookup, registered_ops
from ..runtime.dispatch import INTERCEPTORS
from . import fast as fast_path
from . import sharding
from .autograd import Gradient
from .calls import Binding
from .schema import qualified_name, torch_schema

if TYPE_CHECKING:
    from ..attrs import AttrValue

__all__ = ["register", "register_all", "torch_schema"]

PYTHON_PREFIX = "_opforge_python_"  # ns::<prefix><name>: the op's Python implementation

_bindings: dict[tuple[str, str], Binding] = {}  # (torch namespace, name) -> its binding
_lock = threading.RLock()


def _define(op: Op) -> Binding:
    """Define ``op`` in torch (once per Op object; a replaced op is defined anew).

    Two torch ops: ``ns::name``, which users call, and ``ns::_opforge_python_name``,
    the same op in Python (kernels, autograd, fake).  With the C++ path loaded,
    ``ns::name`` runs its calls in C++ and hands anything else to the Python op;
    without it, both are the Python implementation.  (A second op rather than an
    overload: torch 2.13 crashes redefining an op whose library defined two
    overloads of it.)"""
    with _lock:
        namespace, name = qualified_name(op)
        existing = _bindings.get((namespace, name))
        if existing is not None and existing.op is op:
            return existing
        if existing is not None and lookup(op.name) is not op:  # only the registry's op of a name replaces
            raise SchemaError(f"op '{op.name}' would be torch.ops.{namespace}.{name}, which is op "
                              f"'{existing.op.name}' already; give it a namespace of its own ('mylib::{name}')")
        schema = torch_schema(op)
        if existing is not None:
            existing.remove()
            existing.op.__dict__.pop("_torch_binding", None)
            del _bindings[(namespace, name)]
        library = torch.library.Library(namespace, "FRAGMENT")
        python_name = PYTHON_PREFIX + name
        try:
            library.define(schema)
            library.define(schema.replace(f"{name}(", f"{python_name}(", 1))
        except Exception as error:  # names torch reserves (Python keywords, ...), its own limits (an IndexError, ...)
            library._destroy()
            raise SchemaError(f"op '{op.name}': PyTorch cannot define it as {namespace}::{schema}: "
                              f"{str(error).splitlines()[0]}") from None
        ns = getattr(torch.ops, namespace)
        binding = Binding(op, getattr(ns, name))
        binding.library = library
        gradient = Gradient(binding)
        fast = fast_path.library() is not None
        for defined in [python_name] + ([] if fast else [name]):
            library.impl(defined, binding.run, "CPU")
            library.impl(defined, binding.run, "CUDA")
            library.impl(defined, gradient.kernel(getattr(ns, defined).default), "Autograd")
        for defined in (name, python_name):
            torch.library.register_fake(f"{namespace}::{defined}", binding.fake, lib=library)
        for key in _AUTOCAST_KEYS:
            library.impl(name, _autocast_kernel(getattr(ns, name).default, key), key)
        if fast:
            binding.fast = fast_path.FastPath(namespace, name, python_name, binding.native_plan)
            op.plan_caches.append(binding.fast)
        if sharding.available():
            sharding.register(binding)
        _bindings[(namespace, name)] = binding
        op._torch_binding = binding  # type: ignore[attr-defined]  # the op's binding, read by _binding_of
        return binding


_AUTOCAST_KEYS = ("AutocastCPU", "AutocastCUDA")


def _autocast_kernel(packet: Any, key: str) -> Any:
    """The op inside ``torch.autocast``: its floating inputs at one dtype, the widest among them
    (torch's "promote" policy), so a bfloat16 activation meets a float32 weight and the op runs
    on the weight's dtype rather than failing on the mix.  opforge never narrows an input: its
    CPU kernels compute bfloat16 and float16 in float32, so narrowing would gain nothing."""
    excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

    def autocast(*args: Any, **kwargs: Any) -> Any:
        floats = [t.dtype for a in (*args, *kwargs.values()) for t in (a if isinstance(a, (list, tuple)) else [a])
                  if isinstance(t, torch.Tensor) and t.is_floating_point()]
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            if len(set(floats)) < 2:
                return packet(*args, **kwargs)
            widest = floats[0]
            for dtype in floats[1:]:
                widest = torch.promote_types(widest, dtype)

            def cast(value: Any) -> Any:
                if isinstance(value, (list, tuple)):
                    return [cast(v) for v in value]
                is_float = isinstance(value, torch.Tensor) and value.is_floating_point()
                return value.to(widest) if is_float else value

            return packet(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

    return autocast


def _ops_named(target: Op | str) -> list[Op]:
    if isinstance(target, Op):
        return [target]
    if not isinstance(target, str):
        raise SchemaError(f"opforge.torch.register takes ops, op names or namespaces, got {type(target).__name__}")
    op = lookup(target)
    if op is not None:
        return [op]
    found = [o for o in registered_ops() if o.name.rpartition("::")[0] == target]
    if not found:
        raise SchemaError(f"opforge.torch.register: no op and no namespace is named '{target}'")
    return found


def register(*targets: Op | str) -> Any:
    """Define opforge ops in PyTorch: each target is an ``Op``, an op's name, or a
    namespace (all its ops).  Returns the torch op (``torch.ops.<ns>.<name>``),
    or a list of them when several ops were named."""
    packets = [_define(op).packet for target in targets for op in _ops_named(target)]
    return packets[0] if len(packets) == 1 else packets


def register_all() -> list[Any]:
    """Define every registered opforge op in PyTorch (ops whose attributes torch's
    schemas cannot express are skipped); returns the torch ops."""
    packets: list[Any] = []
    for op in registered_ops():
        try:
            packets.append(_define(op).packet)
        except SchemaError:
            continue
    return packets


def _binding_of(op: Op) -> Binding:
    binding = op.__dict__.get("_torch_binding")  # the op's current binding, set by _define
    return binding if binding is not None else _define(op)


def torch_op_call(op: Op, attrs: Mapping[str, AttrValue], tensors: Sequence[Any]) -> Any:
    """``op`` on torch tensors (``attrs``: opforge's values) as a call of its torch op."""
    binding = _binding_of(op)
    args, kwargs = binding.call_args(tensors, binding.torch_attrs(attrs))
    return binding.packet.default(*args, **kwargs)


_JOINS_TENSORS = (torch.Tensor, bool, int, float, type(None))


def _call_on_tensors(op: Op, attrs: Mapping[str, AttrValue], args: Sequence[Any]) -> Any:
    """The interceptor: an opforge op called on torch tensors runs as its torch op.
    Python scalars join as tensors of the first tensor's dtype (weak, as in NumPy);
    arrays of another kind are left to the DLPack path, which refuses the mix."""
    like = None
    for a in args:
        if isinstance(a, torch.Tensor):
            like = like if like is not None else a
        elif not isinstance(a, _JOINS_TENSORS):
            return NotImplemented
    if like is None:
        return NotImplemented
    try:
        binding = _binding_of(op)
    except SchemaError:  # torch's schemas cannot express an attribute: the op runs through DLPack instead
        return NotImplemented
    tensors = [a if a is None or isinstance(a, torch.Tensor)
               else torch.tensor(a, dtype=like.dtype, device=like.device) for a in args]
    call_args, kwargs = binding.call_args(tensors, binding.torch_attrs(attrs))
    return binding.packet.default(*call_args, **kwargs)  # (torch_op_call, with the binding found already)


def _on_declared(name: str) -> None:
    """A registry listener: an op declared (or declared again) becomes a torch op at once."""
    op = lookup(name)
    if op is not None:
        try:
            _define(op)
        except SchemaError:  # attributes torch cannot express: the op stays an opforge op
            pass


if _call_on_tensors not in INTERCEPTORS:
    INTERCEPTORS.append(_call_on_tensors)
    LISTENERS.append(_on_declared)
    register_all()
