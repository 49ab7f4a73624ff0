"""The eager call path: from bound arguments to a kernel launch.

``launcher_for(op, attrs)`` returns the native ``Launcher`` for one op and one
set of attribute values.  The launcher handles the common case in C (known
input signature, contiguous NumPy arrays); everything else calls back into the
``CallPlanner`` below, which chooses the kernel, runs inference and Init, and
hands the launcher a plan for that signature.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from .. import _native
from ..attrs import attr_key
from ..bounded_cache import BoundedCache
from ..operator import RUNTIME, holds_tensors
from ..errors import AttrError, DeviceError, DTypeError, KernelError, NoKernelError, ShapeError
from ..spec import TensorSpec
from .arrays import placement
from .checks import MEMORY_KINDS, memory_error
from .cpu import isa_rank, isa_reject_reason

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..attrs import AttrValue
    from ..operator import Kernel, Launcher, Op
    from .arrays import Placement
    from .buffer_plan import BufferPlan

    #: What a signature resolves to: input specs, the kernel, output specs.
    _Resolved = tuple[list[TensorSpec | None], Kernel, list[TensorSpec]]

#: Functions ``(op, attrs, args) -> result or NotImplemented`` consulted when a
#: call's arguments are not all plain arrays; layers above the runtime (the
#: graph tracer) register here, so every op call has one entry point.
INTERCEPTORS: list[Callable[..., Any]] = []


class Completed:
    """What ``CallPlanner.prepare`` returns when it finished the call itself."""

    __slots__ = ("value",)

    value: Any

    def __init__(self, value: Any) -> None:
        self.value = value


def launcher_for(op: Op, attrs: dict[str, AttrValue], n_inputs: int) -> Launcher:
    key = (attr_key(attrs), n_inputs)
    launcher = op._launchers.get(key)
    if launcher is None:
        def make() -> Launcher:
            # Calls on GPU arrays the planner has worked out once run in C from then on (device_call.remember).
            routes = _native.DeviceRoutes(n_inputs, len(op.outputs), op.tuple_output, INTERCEPTORS)
            made: Launcher = _native.Launcher(n_inputs, len(op.outputs), op.tuple_output,
                                              CallPlanner(op, attrs, routes), device_routes=routes)
            if not any(a.required for a in op.attrs.values()) and key[0] == attr_key(op.resolve_attrs({})):
                op._default_launcher = made  # what op(*arrays) with no attributes uses
            return made

        launcher = op._launchers.get_or_create(key, make)
    return launcher


def as_array(op: Op, index: int, value: Any) -> npt.NDArray[Any]:
    """One tensor argument as a C-contiguous, native-byte-order NumPy array."""
    if isinstance(value, np.ndarray):
        array = value
    elif hasattr(value, "__array__") or isinstance(value, (list, tuple, numbers.Number, np.generic)):
        try:
            array = np.asarray(value)
        except ValueError as error:  # ragged nested lists
            raise DTypeError(f"op '{op.name}': input '{op.input_name(index)}' is not a rectangular array: "
                             f"{error}") from None
    elif hasattr(value, "__dlpack__"):
        array = np.from_dlpack(value)
    else:
        raise DTypeError(f"op '{op.name}': input '{op.input_name(index)}' must be an array, got {type(value).__name__}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    # (not np.ascontiguousarray: it turns 0-d arrays into 1-d ones)
    return array if array.flags.c_contiguous and array.flags.aligned else array.copy(order="C")


def skips_kernel(op: Op, out_specs: Sequence[TensorSpec]) -> bool:
    """A kernel with nothing to write is not run: every output is empty (then
    so are the arrays returned), unless the op has trait always_compute (say,
    to check its inputs).  An empty input alone never skips the kernel: its
    outputs may still need writing (a concat, a sum over an empty axis)."""
    return "always_compute" not in op.traits and all(0 in s.shape for s in out_specs)


def weak_scalars(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Python scalars take the dtype of the first array argument, as in NumPy
    (``x * 2.0`` stays float32), so the dtype-matched native kernels apply."""
    like = next((a for a in args if isinstance(a, np.ndarray)), None)
    if like is None or not any(type(a) in (int, float, bool) for a in args):
        return args
    return tuple(np.asarray(a, like.dtype) if type(a) in (int, float, bool) else a for a in args)


def input_specs(op: Op, arrays: Sequence[Any]) -> list[TensorSpec | None]:
    specs: list[TensorSpec | None] = []
    for index, array in enumerate(arrays):
        if array is None:  # an absent optional input
            specs.append(None)
            continue
        try:
            specs.append(TensorSpec.of(array))
        except DTypeError as error:
            raise DTypeError(f"op '{op.name}': input '{op.input_name(index)}': {error}") from None
    return specs


def _preference(kernel: Kernel, device: str) -> tuple[bool, bool, int, int]:
    """Sort key: the inputs' device first, then native before Python, the best ISA,
    and the reference kernel last."""
    return (kernel.device != device, getattr(kernel, "reference", False), -getattr(kernel, "priority", 1),
            -isa_rank(kernel.isa))


def kernels_for_device(op: Op, kernels: Sequence[Kernel], device: str) -> Sequence[Kernel]:
    """The kernels a call on ``device`` may use.  A kernel never gets pointers of another
    device; host inputs go to a GPU kernel (through copies) only when the op has no CPU kernel."""
    if device == "cpu":
        if any(k.device == "cpu" and k.dispatchable for k in kernels):
            return [k for k in kernels if k.device == "cpu"]
        return kernels
    chosen = [k for k in kernels if k.device == device]
    if not chosen:
        devices = sorted({k.device for k in kernels})
        raise DeviceError(f"op '{op.name}' has no {device} kernel (its kernels run on {', '.join(devices)}); "
                          f"move the inputs to the host, or add a kernel with device='{device}'")
    return chosen


def select_kernel(op: Op, specs: Sequence[TensorSpec | None], device: str = "cpu",
                  kernels: Sequence[Kernel] | None = None) -> Kernel:
    """The preferred kernel (of ``kernels``, default all the op's) that accepts
    the specs; errors list every candidate."""
    kernels = op.kernels if kernels is None else kernels
    if not kernels:
        raise NoKernelError(f"op '{op.name}' has no kernels")
    kernels = kernels_for_device(op, kernels, device)
    reasons: list[tuple[Kernel, str]] = []
    for kernel in sorted(kernels, key=lambda k: _preference(k, device)):
        if not kernel.dispatchable:
            reasons.append((kernel, "a reference: the semantics kernels are checked against, run only where the op says so; "
                                    "@op.reference(fallback=True) lets it run for inputs no kernel takes"))
            continue
        reason = kernel.reject_reason(op, specs)
        if reason is None and kernel.device == "cpu" and kernel.isa is not None:
            reason = isa_reject_reason(kernel.isa)
        if reason is None:
            return kernel
        reasons.append((kernel, reason))
    if len(reasons) == 1 and "dtype" in reasons[0][1]:
        raise DTypeError(f"op '{op.name}': {reasons[0][1]}")
    lines = "\n".join(f"  {k.name} ({k.device}{', ' + k.isa if k.isa else ''}): {r}" for k, r in reasons)
    # a DTypeError when dtypes are all that kept the inputs from a kernel: references (never dispatched)
    # and kernels for another layout do not count
    deciding = [r for k, r in reasons if k.dispatchable and " is in layout " not in r]
    error = DTypeError if deciding and all("dtype" in r for r in deciding) else NoKernelError
    raise error(f"op '{op.name}': no kernel accepts inputs {specs}; candidates:\n{lines}")


def kernel_error(op: Op, kernel: Kernel, rc: int, error: tuple[str, str] | None,
                 function: str | None = None) -> AttrError | KernelError:
    function = function or getattr(kernel, "function_name", kernel.name)
    if error is not None and error[0] == "attr":
        return AttrError(error[1])
    where = f" ({kernel.location})" if getattr(kernel, "location", None) else ""  # type: ignore[attr-defined]
    if error is not None and error[0] in MEMORY_KINDS:
        # (a str: getattr's Any only makes mypy fall back to the parameter's str | None)
        return memory_error(op, function, where, error)  # type: ignore[arg-type]
    if error is not None:
        message = f"op '{op.name}': kernel function '{function}'{where} raised a C++ exception: {error[1]}"
    else:
        message = f"op '{op.name}': kernel function '{function}'{where} returned error code {rc}"
        meaning = kernel.error_messages.get(rc)
        if meaning:
            message += f": {meaning}"
    return KernelError(message, op=op.name, function=function, code=rc)


_run_on_device: Callable[[CallPlanner, Placement, tuple[Any, ...]], Any] | None = None


class CallPlanner:
    """Python half of a Launcher: everything that is not the hot path."""

    _device_plans: BoundedCache[tuple[Any, ...], BufferPlan]  # set by device_call on its first GPU call

    def __init__(self, op: Op, attrs: dict[str, AttrValue], device_routes: Any = None) -> None:
        self.op = op
        self.attrs = attrs
        self.device_routes = device_routes  # its launcher's _native.DeviceRoutes, None for a planner without one
        self._kernels_by_function: dict[int, Kernel] = {}
        self._resolved: BoundedCache[tuple[Any, ...], _Resolved] = BoundedCache(64)

    def reject(self, *args: Any, **kwargs: Any) -> Any:
        # Wrong arity or keywords for the fast path: bind properly (raises on bad input).
        return self.op.call(args, kwargs)

    def prepare(self, args: tuple[Any, ...]) -> Completed | tuple[Any, ...]:
        if self.op.variadic and len(args) == 1 and holds_tensors(args[0]):
            # a Tensor[] op's tensors as one list, reaching a launcher made for one tensor: call it as given
            return Completed(self.op.call(tuple(args[0]), dict(self.attrs)))
        self.op.check_present(args)
        for intercept in INTERCEPTORS:  # e.g. tracing: symbolic values instead of arrays
            result = intercept(self.op, self.attrs, args)
            if result is not NotImplemented:
                return Completed(result)
        where = placement(self.op, args)
        if where is not None:  # torch, JAX, CuPy, ... arrays, or arrays on a GPU
            return Completed(self.run_placed(where, args))
        args = weak_scalars(args)
        if "support_non_contiguous" in self.op.traits and all(k.priority < 2 for k in self.op.kernels):
            return tuple(a if a is None else np.asarray(a) for a in args)  # Python kernels take views
        return tuple(None if a is None else as_array(self.op, k, a) for k, a in enumerate(args))

    def run_placed(self, where: Placement, args: tuple[Any, ...]) -> Any:
        """A call on arrays of another kind than NumPy, or on a GPU: host arrays run as
        NumPy views of their memory; outputs go back as the caller's kind."""
        if where.on_host:
            # (placement() gives a host placement its views)
            result = launcher_for(self.op, self.attrs, len(args))(*where.views)  # type: ignore[misc]
            return where.wrap_result(self.op, result)
        global _run_on_device
        if _run_on_device is None:  # imported on the first GPU call (device_call imports this module)
            from .device_call import run_on_device

            _run_on_device = run_on_device
        return _run_on_device(self, where, args)

    def _resolve(self, arrays: Sequence[Any]) -> _Resolved:
        # Cached per signature: calls that the launcher hands back here every
        # time (Python kernels, GPU kernels on host arrays) skip selection and inference.
        signature = tuple(None if a is None else (a.shape, a.dtype.str) for a in arrays)
        found = self._resolved.get(signature)
        if found is not None:
            return found
        specs = input_specs(self.op, arrays)
        kernel = select_kernel(self.op, specs)
        out_specs = self.op.infer_specs(specs, self.attrs, kernel)
        for spec in out_specs:
            self.op.check_output_shape(spec)
            if spec.layout != "ndarray":
                raise ShapeError(f"op '{self.op.name}': an eager call would produce layout {spec.layout}, which "
                                 "exists only inside graphs (the layout pass inserts reorders there)")
        found = (specs, kernel, out_specs)
        self._resolved.put(signature, found)
        return found

    def plan(self, arrays: Sequence[Any]) -> Any:
        specs, kernel, out_specs = self._resolve(arrays)
        if skips_kernel(self.op, out_specs):
            return None
        plan = kernel.plan(self.op, arrays, specs, out_specs, self.attrs) if hasattr(kernel, "plan") else None
        if plan is not None:
            self._kernels_by_function[plan[0]] = kernel
        return plan

    def run(self, arrays: Sequence[Any]) -> Any:
        specs, kernel, out_specs = self._resolve(arrays)
        if skips_kernel(self.op, out_specs):
            outputs: Sequence[Any] = [np.empty(s.shape, s.dtype) for s in out_specs]
        else:
            outputs = kernel.run(self.op, arrays, self.attrs, out_specs)
        return tuple(outputs) if self.op.tuple_output else outputs[0]

    def failed(self, rc: int, error: tuple[str, str] | None, function_address: int) -> NoReturn:
        kernel = self._kernels_by_function.get(function_address)
        # (the launcher reports failures of this planner's plans only: plan() recorded the kernel)
        raise kernel_error(self.op, kernel, rc, error)  # type: ignore[arg-type]


RUNTIME.launcher_for = launcher_for
