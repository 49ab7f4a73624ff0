"""opforge ops inside JAX: every call an XLA FFI custom call (``pip install "opforge[jax]"``).

Once this module is imported, an opforge op called on JAX arrays -- eagerly, or
on tracers inside ``jax.jit``, ``jax.grad``, ``jax.vmap`` -- becomes one custom
call to opforge's generic FFI handler (``ffi_call.cc``, built once against the
installed jaxlib's FFI headers and cached).  The call site is planned when JAX
traces it: the kernel dispatch picks for the inputs' shapes and dtypes (per
platform: a CPU and a GPU plan), its Init state and workspace, and the output
shapes from opforge's inference.  The custom call names what it computes (the
op, its attributes, its inputs' and outputs' types: ``identity``), so a program
saved with ``jax.export`` runs in another process, planned there on its first
call.  At run time the handler takes XLA's buffers as they are, with the
workspace from XLA (on the GPU its scratch allocator) and XLA's stream.
Gradients come from the op's rule (``jax.custom_vjp``), so ``jax.grad`` works,
again on the gradient; ``jax.vmap`` batches an elementwise op in one call and
anything else one example at a time, whatever the device count.  An eager call
runs its call site's function jitted.  Python kernels run as
``jax.pure_callback``.  jax is imported only here.
"""
from __future__ import annotations

import ctypes
import functools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from .. import _native, registry
from ..attrs import attr_key
from ..bounded_cache import BoundedCache
from ..dtypes import to_numpy
from ..errors import AttrError, DeviceError, DTypeError, InferenceError, NoKernelError, OpforgeError, SchemaError
from ..graph.autodiff import op_backward
from ..operator import PyKernel
from ..runtime.buffer_plan import BufferPlan
from ..runtime.build import build
from ..runtime.dispatch import INTERCEPTORS
from ..spec import TensorSpec

if TYPE_CHECKING:
    from ..attrs import AttrValue
    from ..graph.ir import Graph
    from ..operator import Op

__all__ = ["call", "library"]

TARGET = "opforge_call"
_NO_PLAN = 0xFFFFFFFF
_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_plans_kept: list[BufferPlan] = []  # every BufferPlan a custom call may name: the handler reads their Init state


def library() -> ctypes.CDLL:
    """The FFI handlers, built and registered with XLA on first use."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            source = Path(__file__).with_name("ffi_call.cc")
            built = build(source, extra_cflags=["-isystem", jax.ffi.include_dir(),
                                                f"-DOPFORGE_JAXLIB_VERSION=\"{jaxlib.__version__}\""])
            handle = ctypes.CDLL(str(built.path))
            handle.opforge_jax_add_plan.restype = ctypes.c_int64
            handle.opforge_jax_add_plan.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                                                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                                    ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_void_p,
                                                    ctypes.c_void_p]
            handle.opforge_jax_set_resolver.argtypes = [ctypes.c_void_p]
            handle.opforge_jax_set_resolver(ctypes.cast(_RESOLVER, ctypes.c_void_p))
            jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handle.OpforgeCallCpu), platform="cpu")
            if _gpu_backend():
                jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handle.OpforgeCallGpu), platform="CUDA")
            _library = handle
    return _library


@functools.cache
def _gpu_backend() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


@functools.cache
def _several_devices() -> bool:
    return len(jax.devices()) > 1


def _take_attr_error_address() -> int | None:
    return ctypes.cast(ctypes.CDLL(_native.__file__).opforge_take_attr_error, ctypes.c_void_p).value


# -- call sites ----------------------------------------------------------------------
class CallSite:
    """One op, attribute values and input signature, planned for XLA: the output
    types, the call's identity, the plan index per platform, the vmap method, and
    the differentiable functions that run it (built once, reused by every call)."""

    def __init__(self, op: Op, attrs: Mapping[str, AttrValue], specs: Sequence[TensorSpec | None]) -> None:
        self.op, self.attrs, self.in_specs = op, attrs, tuple(specs)
        self.cpu = BufferPlan(op, attrs, specs, "cpu")
        self.gpu: BufferPlan | None = None
        if _gpu_backend() and any(k.device == "gpu" for k in op.kernels):
            try:
                self.gpu = BufferPlan(op, attrs, specs, "gpu")
            except OpforgeError:  # no GPU kernel takes these inputs: the CPU plan must do
                self.gpu = None
        self.out_specs = self.cpu.out_specs
        for index, spec in enumerate(self.out_specs):
            if to_numpy(spec.dtype).itemsize == 8 and not jax.config.jax_enable_x64 and spec.dtype != "complex64":
                raise DTypeError(f"op '{op.name}': output '{op.outputs[index]}' is {spec.dtype}, which JAX makes "
                                 "32-bit while 64-bit types are off (jax.config.update('jax_enable_x64', True))")
        self.out_types = [jax.ShapeDtypeStruct(s.shape, to_numpy(s.dtype)) for s in self.out_specs]
        self.native = self.cpu.native
        self.identity = identity(op, attrs, specs, self.out_specs)
        if self.native:  # the handler's attribute: the CPU plan's index, and the GPU one's in the high bits
            gpu_index = _add(self.gpu, self.identity) if self.gpu is not None and self.gpu.native else _NO_PLAN
            self.plans = np.uint64((gpu_index << 32) | _add(self.cpu, self.identity)).astype(np.int64)
        # Elementwise work batches by running once on the stacked inputs, when nothing
        # was sized for the unbatched shapes (a workspace, Init's kernel data).
        batches = "elementwise" in op.traits and not self.cpu.workspace and not getattr(self.cpu.kernel, "has_init",
                                                                                          False)
        self.vmap_method = "broadcast_all" if batches else "sequential"
        self._functions: dict[tuple[frozenset[Any], bool], Callable[..., Any]] = {}

    def __call__(self, args: Sequence[Any], varying: frozenset[Any] = frozenset()) -> Any:
        """The outputs for ``args``; ``varying``: the mesh axes they vary over (inside ``shard_map``)."""
        op = self.op
        if not self.native:  # a Python kernel; an absent optional input (None) is handed to it as None
            kernel, present = self.cpu.kernel, [k for k, a in enumerate(args) if a is not None]

            def run(*arrays: Any) -> Any:
                full = [None] * len(args)
                for k, array in zip(present, arrays):
                    full[k] = array
                return kernel.run(op, full, self.attrs, self.out_specs)

            result = jax.pure_callback(run, self.out_types, *[args[k] for k in present], vmap_method="sequential")
            return tuple(result) if op.tuple_output else result[0]
        out_types = self.out_types if not varying else [_typed_like(args[0], t) for t in self.out_types]
        call = jax.ffi.ffi_call(TARGET, out_types if op.tuple_output else out_types[0], vmap_method=self.vmap_method)
        args = [a for a in args if a is not None]  # the kernel gets the present inputs (an absent one: its own kernel)
        if self.vmap_method == "broadcast_all":
            args = _same_rank(args)  # (planned, checked and inferred on the inputs as given)
        return call(*args, plans=np.int64(self.plans), identity=self.identity)

    def function(self, varying: frozenset[Any], traced: bool) -> Callable[..., Any]:
        """The differentiable function of the call's inputs: for ``traced`` ones (under a JAX
        transformation) with the op's gradient rule; for arrays, that function jitted, so an
        eager call is one dispatch of a compiled program, as a ``jax.numpy`` call is."""
        key = (varying, traced)
        function = self._functions.get(key)
        if function is None:
            function = self._differentiable(varying) if traced else jax.jit(self.function(varying, True))
            self._functions[key] = function
        return function

    def _differentiable(self, varying: frozenset[Any]) -> Callable[..., Any]:
        op, attrs = self.op, self.attrs
        run: Callable[[Sequence[Any]], Any]
        if not varying and self.native and _several_devices():
            run = self._partitioned()  # under jit on sharded arrays: split by the op's SBP signatures
        else:
            run = functools.partial(self.__call__, varying=varying)

        @jax.custom_vjp  # type: ignore[untyped-decorator]  # jax is Any to mypy (follow_imports=skip)
        def apply(*xs: Any) -> Any:
            return run(xs)

        def forward(*xs: Any) -> tuple[Any, tuple[tuple[Any, ...], Any]]:
            out = apply(*xs)  # not run(xs): an outer differentiation of this forward pass needs the rule too
            return out, (xs, out)

        def backward(residuals: tuple[tuple[Any, ...], Any], cotangents: Any) -> tuple[Any, ...]:
            xs, out = residuals
            outs = list(out) if op.tuple_output else [out]
            douts = list(cotangents) if op.tuple_output else [cotangents]
            return _gradients(op, attrs, list(xs), outs, douts)

        apply.defvjp(forward, backward)
        return apply  # type: ignore[no-any-return]  # jax is Any here

    def _partitioned(self) -> Callable[[Sequence[Any]], Any]:
        """The call wrapped for XLA's partitioners (``sharding.partitioned``), each shard a call
        site of its own shapes.  JAX has no batching rule for ``custom_partitioning``: under
        ``jax.vmap`` the call is this site's plain custom call, batched as on one device."""
        from .sharding import partitioned

        op, attrs = self.op, self.attrs
        present = [k for k, spec in enumerate(self.in_specs) if spec is not None]

        def full(arrays: Sequence[Any]) -> list[Any]:
            xs: list[Any] = [None] * len(self.in_specs)
            for k, array in zip(present, arrays):
                xs[k] = array
            return xs

        def shard(arrays: Sequence[Any]) -> Any:
            xs = full(arrays)
            return _site(op, attrs, xs)(xs)

        split = partitioned(op, attrs, self.in_specs, self.out_specs, shard)

        @jax.custom_batching.custom_vmap  # type: ignore[untyped-decorator]  # jax is Any to mypy
        def run(*arrays: Any) -> Any:
            return split(*arrays)

        @run.def_vmap  # type: ignore[untyped-decorator]
        def batched(axis_size: int, in_batched: Sequence[bool], *arrays: Any) -> tuple[Any, Any]:
            if not any(in_batched):
                out = split(*arrays)
                return out, jax.tree.map(lambda _: False, out)
            axes = tuple(0 if b else None for b in in_batched)
            out = jax.vmap(lambda *a: self(full(a)), in_axes=axes)(*arrays)
            return out, jax.tree.map(lambda _: True, out)

        return lambda xs: run(*[xs[k] for k in present])


def identity(op: Op, attrs: Mapping[str, AttrValue], in_specs: Sequence[TensorSpec | None],
             out_specs: Sequence[TensorSpec]) -> str:
    """What a custom call computes, as its ``identity`` attribute carries it: the op's name,
    attribute values and its inputs' and outputs' dtypes and shapes, as JSON (one way
    of writing a call: the handler compares these strings)."""
    def tensor(spec: TensorSpec | None) -> list[Any] | None:
        return None if spec is None else [spec.dtype, list(spec.shape)]

    return json.dumps({"op": op.name, "attrs": {name: attrs[name] for name in sorted(attrs)},
                       "inputs": [tensor(s) for s in in_specs], "outputs": [tensor(s) for s in out_specs]},
                      separators=(",", ":"))


def _plan_identity(text: str, device: str) -> int:
    """Plans the call a custom call's ``identity`` names, in this process (a program
    serialized by another one): its plan's index, or a typed error saying why not."""
    try:
        named = json.loads(text)
        name, given = named["op"], named["attrs"]
        inputs = [None if t is None else TensorSpec(tuple(t[1]), t[0]) for t in named["inputs"]]
        outputs = named["outputs"]
    except (ValueError, KeyError, TypeError, IndexError):
        raise OpforgeError(f"an opforge custom call whose identity opforge cannot read: {text[:200]}") from None
    op = registry.lookup(name)
    if op is None:
        raise SchemaError(f"the program calls op '{name}', which is not registered in this process: declare or "
                          "import it before running the program")
    unknown = sorted(set(given) - set(op.attrs))
    if unknown:
        raise AttrError(f"op '{name}': the program gives attribute '{unknown[0]}', which the op here does not have")
    attrs = op.resolve_attrs({k: _tuples(v) for k, v in given.items()})
    try:
        plan: BufferPlan | None = BufferPlan(op, attrs, inputs, device)
    except OpforgeError:  # (on the CPU the dispatch's own error says why no kernel takes the inputs)
        if device == "cpu":
            raise
        plan = None
    if plan is None or (device == "gpu" and not plan.native):
        raise DeviceError(f"op '{name}' has no {device} kernel for these inputs; add one (a kernel with "
                          f"device='{device}'), or run the function on a device it has a kernel for "
                          "(jax.default_device, JAX_PLATFORMS)")
    if not plan.native:
        raise NoKernelError(f"op '{name}': its kernel for these inputs is a Python kernel, which runs in a program "
                            "only as a callback traced in the same process; give the op a C/C++ kernel")
    found = [[s.dtype, list(s.shape)] for s in plan.out_specs]
    if found != outputs:  # (XLA allocated the outputs the program was built with)
        raise InferenceError(f"op '{name}': the program was built for outputs {outputs}, this process infers "
                             f"{found} for the same inputs and attributes (the op's definition differs)")
    return _add(plan, text)  # under the program's identity, which the handler compares


def _tuples(value: Any) -> Any:
    """JSON's lists back to the tuples attribute values are."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _resolve(text: bytes, platform: int, error: int, size: int) -> int:
    """The handlers' callback for a call no plan in this process was made for (``_RESOLVER``)."""
    try:
        return _plan_identity(text.decode(), "gpu" if platform == 1 else "cpu")
    except Exception as failure:  # noqa: BLE001  # every failure goes back to XLA as the call's error
        kind = type(failure).__name__ if isinstance(failure, OpforgeError) else "OpforgeError"
        message = f"opforge.{kind}: {failure}".encode()[:max(size - 1, 0)]
        ctypes.memmove(error, message + b"\0", len(message) + 1)
        return -1


_RESOLVER = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64)(_resolve)


def _add(plan: BufferPlan, identity: str) -> int:
    """Puts a native plan, of the call ``identity`` names, in the handlers' table; its index."""
    from ..runtime import cuda

    lib = library()
    sizes = (ctypes.c_int64 * max(len(plan.workspace), 1))(*plan.workspace)
    last_error = cuda.last_error_address() if plan.device == "gpu" else 0
    extra = plan.extra.address if plan.extra is not None else 0
    _plans_kept.append(plan)
    index: int = lib.opforge_jax_add_plan(identity.encode(), int(plan.device == "gpu"), plan.op.name.encode(),
                                          plan.kernel.name.encode(), plan.function, extra, len(plan.workspace),
                                          sizes, int(plan.skip), last_error, _take_attr_error_address())
    if not 0 <= index < _NO_PLAN:
        raise OpforgeError(f"op '{plan.op.name}': opforge's table of JAX call sites is full")
    return index


def _spec(op: Op, index: int, value: Any) -> TensorSpec:
    try:
        dtype = np.dtype(value.dtype).name
    except TypeError:
        raise DTypeError(f"op '{op.name}': input '{op.input_name(index)}' has dtype {value.dtype}, which opforge "
                         "kernels do not take") from None
    return TensorSpec(tuple(int(d) for d in value.shape), dtype)


def _call_sites(op: Op) -> BoundedCache[tuple[Any, ...], CallSite]:
    sites: BoundedCache[tuple[Any, ...], CallSite] | None = op.__dict__.get("_jax_sites")
    if sites is None:
        sites = op._jax_sites = BoundedCache(256)  # type: ignore[attr-defined]  # the op's call sites, read above
        op.plan_caches.append(sites)  # dropped when the op's kernels or the ISA cap change
    return sites


def _site(op: Op, attrs: Mapping[str, AttrValue], args: Sequence[Any]) -> CallSite:
    # Keyed by the values' own dtypes and shapes: making TensorSpecs (dtype names) would
    # cost an eager call more than the call itself.
    key = (attr_key(attrs), tuple(None if a is None else (a.dtype, a.shape) for a in args))
    sites = _call_sites(op)
    site = sites.get(key)
    if site is None:
        specs = [None if a is None else _spec(op, k, a) for k, a in enumerate(args)]
        site = sites.get_or_create(key, lambda: CallSite(op, attrs, specs))
    return site


# -- calls and gradients ------------------------------------------------------------------
def call(op: Op, attrs: Mapping[str, AttrValue], args: Sequence[Any]) -> Any:
    """``op`` on JAX values (arrays or tracers) with resolved ``attrs``: its outputs,
    differentiable with the op's rule.  An absent optional input is None."""
    site = _site(op, attrs, args)
    # Inside shard_map each input varies over some mesh axes (a split one does, a
    # broadcast one does not): the call runs on inputs that all vary over the union,
    # as JAX's own ops do, and gives outputs that do.  The broadcast inputs' gradients
    # are then summed over those axes by the transpose of that cast (pcast's: psum).
    traced = any(isinstance(a, jax.core.Tracer) for a in args)
    varying = frozenset().union(*(_varying(a) for a in args if a is not None)) if traced else frozenset()
    if varying:
        args = [a if a is None or _varying(a) == varying else
                jax.lax.pcast(a, tuple(sorted(varying - _varying(a))), to="varying") for a in args]
    return site.function(varying, traced)(*args)


def _same_rank(args: Sequence[Any]) -> list[Any]:
    """An elementwise kernel's inputs with leading 1s up to one rank, as NumPy's broadcasting reads
    them.  vmap batches such a call by running it once with the batch axis put first on every input
    (``broadcast_all``): a lower-rank input's batch axis would otherwise line up with another
    input's last axes."""
    rank = max((a.ndim for a in args if a is not None), default=0)
    return [a if a is None or a.ndim == rank else jnp.reshape(a, (1,) * (rank - a.ndim) + tuple(a.shape))
            for a in args]


_graphs: BoundedCache[tuple[object, ...], Any] = BoundedCache(1024)  # (op, attrs, specs) -> (backward graph, present)


def _gradients(op: Op, attrs: Mapping[str, AttrValue], xs: list[Any], outs: list[Any],
               douts: list[Any]) -> tuple[Any, ...]:
    in_specs = [None if x is None else _spec(op, k, x) for k, x in enumerate(xs)]
    out_specs = [TensorSpec(tuple(o.shape), np.dtype(o.dtype).name) for o in outs]
    key = (id(op), attr_key(attrs), tuple(in_specs), tuple(out_specs))
    graph, present = _graphs.get_or_create(key, lambda: op_backward(op, attrs, in_specs, out_specs))
    douts = [jnp.zeros(o.shape, o.dtype) if d is None or _is_float0(d) else d for d, o in zip(douts, outs)]
    found = iter(replay(graph, xs + outs + douts))
    grads: list[Any] = []
    for x, keep in zip(xs, present):
        gradient = next(found) if keep else None
        if x is None:
            grads.append(None)
        elif not jnp.issubdtype(x.dtype, jnp.inexact):
            grads.append(np.zeros(x.shape, jax.dtypes.float0))  # integer inputs have no gradient
        else:
            grads.append(jnp.zeros(x.shape, x.dtype) if gradient is None else gradient.astype(x.dtype))
    return tuple(grads)


def _varying(value: Any) -> frozenset[Any]:
    """The manual mesh axes a JAX value varies over (inside shard_map; else none)."""
    kind = getattr(jax.typeof(value), "manual_axis_type", None)
    return frozenset(getattr(kind, "varying", ()))


def _typed_like(value: Any, result: Any) -> Any:
    """``result``'s shape and dtype with the JAX type of ``value`` otherwise: inside shard_map,
    its mesh and the axes it varies over."""
    like = jax.typeof(value)
    sharding = jax.sharding.NamedSharding(like.sharding.mesh, jax.sharding.PartitionSpec(*[None] * len(result.shape)))
    return like.update(shape=tuple(result.shape), dtype=result.dtype, sharding=sharding, weak_type=False)


def _is_float0(value: object) -> bool:
    return getattr(value, "dtype", None) == jax.dtypes.float0  # type: ignore[no-any-return]  # jax is Any here


def replay(graph: Graph, args: Sequence[Any]) -> list[Any]:
    """The graph's outputs for JAX values ``args``, each node an opforge op on JAX values
    (so the result is differentiable again)."""
    env = {v.id: x for v, x in zip(graph.inputs, args)}
    for node in graph.nodes:
        if node.is_constant:
            env[node.outputs[0].id] = jnp.asarray(node.value)
            continue
        result = call(node.op, node.attrs, [None if v is None else env[v.id] for v in node.inputs])
        for value, out in zip(node.outputs, result if node.op.tuple_output else (result,)):
            env[value.id] = out
    return [env[v.id] for v in graph.outputs]


# -- opforge ops called on JAX values ----------------------------------------------------------
_JAX_VALUES = (jax.Array, jax.core.Tracer)


def _call_on_jax_values(op: Op, attrs: Mapping[str, AttrValue], args: Sequence[Any]) -> Any:
    """The interceptor: an opforge op called on JAX arrays or tracers runs as an FFI call.
    Python scalars take the dtype of the first JAX operand (weak, as in NumPy); NumPy
    arrays join as constants."""
    like = next((a for a in args if isinstance(a, _JAX_VALUES)), None)
    if like is None:
        return NotImplemented
    values: list[Any] = []
    for a in args:
        if a is None or isinstance(a, _JAX_VALUES):
            values.append(a)
        elif isinstance(a, (bool, int, float)):
            values.append(jnp.asarray(a, dtype=like.dtype))
        elif isinstance(a, (np.ndarray, np.generic)):
            values.append(jnp.asarray(a))
        else:
            return NotImplemented
    return call(op, attrs, values)


if _call_on_jax_values not in INTERCEPTORS:
    INTERCEPTORS.append(_call_on_jax_values)
