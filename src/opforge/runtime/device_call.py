"""Calls on arrays in GPU memory: the inputs' memory goes to a GPU kernel as it is.

The kernel runs on the caller's current stream (``runtime.cuda.current_stream``:
``opforge.cuda.stream``, else PyTorch's or CuPy's current stream, else the
default stream); inputs are taken through DLPack with that stream as the
consumer's, so the producer's pending work on them is ordered before the
kernel (-1, nothing to order, when it is their library's own current stream:
``cuda.call_stream``); an array with only ``__cuda_array_interface__`` names
the stream of that work, which the call's stream waits for.  Outputs and
workspace come from opforge's stream-ordered pool (``cuda.allocate``), launch
errors are read with ``cudaGetLastError`` after the call, and nothing
synchronizes: the outputs are handed back (as the inputs' kind, through
DLPack) while the kernel may still be running, exactly as a framework's own
ops do.  Their exports order each consumer's stream
after the call's (``DeviceBuffer.export_to``).  Python and NumPy scalars among
the inputs become 0-d device arrays (``cuda.constant``), typed as on the CPU.
A call that went through is remembered by its launcher (``_remember``), and
later calls that fit it run in C (``_native.DeviceRoutes``) with the same steps.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np

from .. import _native
from ..bounded_cache import BoundedCache
from ..dtypes import normalize as normalize_dtype
from ..dtypes import to_numpy
from ..errors import DeviceError, DTypeError, OpforgeError, ShapeError
from ..spec import TensorSpec
from . import cuda
from .arrays import CUDA, cuda_interface_device, device_name, kind_of, mixed_devices
from .buffer_plan import BufferPlan
from .dispatch import kernel_error

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..operator import Op
    from .arrays import OpLike, Placement
    from .dispatch import CallPlanner

    class DeviceView(Protocol):
        """One input in GPU memory as a kernel takes it: a DLTensorView, or an _InterfaceView."""

        @property
        def data(self) -> int: ...
        @property
        def shape(self) -> tuple[int, ...]: ...
        @property
        def dtype(self) -> str: ...
        @property
        def c_contiguous(self) -> bool: ...
        @property
        def nbytes(self) -> int: ...
        @property
        def device(self) -> tuple[int, int]: ...

PLANS_PER_OP = 64
_64_BIT = frozenset({"int64", "uint64", "float64"})  # the dtypes JAX narrows without jax_enable_x64


class _InterfaceView:
    """A ``__cuda_array_interface__`` array seen as DLTensorView sees a DLPack one; ``stream``
    is the interface's (v3): where the producer's pending work on it is queued, or None."""

    __slots__ = ("data", "shape", "dtype", "c_contiguous", "nbytes", "device", "owner", "stream")

    data: int
    shape: tuple[int, ...]
    dtype: str
    c_contiguous: bool
    nbytes: int
    device: tuple[int, int]
    owner: Any
    stream: object

    def __init__(self, value: Any) -> None:
        interface = value.__cuda_array_interface__
        self.owner = value
        self.stream = interface.get("stream")
        self.device = cuda_interface_device(value)
        self.data = int(interface["data"][0])
        self.shape = tuple(int(d) for d in interface["shape"])
        dtype = np.dtype(interface["typestr"])
        self.dtype = normalize_dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * dtype.itemsize
        strides = interface.get("strides")
        row_major = tuple(int(s) * dtype.itemsize for s in np.cumprod((self.shape[1:] + (1,))[::-1])[::-1]) \
            if self.shape else ()
        self.c_contiguous = strides is None or all(
            n == 1 or s == r for n, s, r in zip(self.shape, strides, row_major))


class _ScalarView:
    """A Python or NumPy scalar input as a 0-d array; ``data`` is set once it is on the device."""

    __slots__ = ("array", "data", "shape", "dtype", "c_contiguous", "nbytes")

    array: npt.NDArray[Any]
    data: int | None
    shape: tuple[int, ...]
    dtype: str
    c_contiguous: bool
    nbytes: int

    def __init__(self, array: npt.NDArray[Any]) -> None:
        self.array, self.data, self.shape, self.dtype = array, None, (), normalize_dtype(array.dtype)
        self.c_contiguous, self.nbytes = True, array.nbytes


def _is_scalar(value: object) -> bool:
    return type(value) in (int, float, bool) or isinstance(value, np.generic)


def device_view(op: OpLike, index: int, value: Any, stream: int, consumer: int) -> DeviceView:
    """One input on the GPU as a view: data pointer, shape, dtype name, device (no copy).
    ``stream`` is the call's and ``consumer`` what its ``__dlpack__`` is told (``cuda.call_stream``);
    an array with only ``__cuda_array_interface__`` has ``stream`` wait for the one it names."""
    if hasattr(value, "__dlpack__"):
        try:
            try:
                capsule = value.__dlpack__(stream=consumer, max_version=(1, 0))
            except TypeError:  # a producer from before DLPack 1.0
                capsule = value.__dlpack__(stream=consumer)
        except BufferError as error:  # the producer refuses (a tensor that requires grad, say)
            raise DeviceError(f"op '{op.name}': input '{op.input_name(index)}' ({type(value).__name__}) cannot be "
                              f"shared through DLPack: {error}") from None
        try:
            view: DeviceView = _native.DLTensorView(capsule)
        except ValueError as error:
            raise DeviceError(f"op '{op.name}': input '{op.input_name(index)}': {error}") from None
    else:
        view = _InterfaceView(value)
        _order_after_producer(op, index, view.stream, stream)
    if not view.c_contiguous:
        raise ShapeError(f"op '{op.name}': input '{op.input_name(index)}' is a strided view in GPU memory; GPU "
                         "kernels take contiguous arrays (call .contiguous() / cupy.ascontiguousarray first)")
    return view


def _order_after_producer(op: OpLike, index: int, producer: object, stream: int) -> None:
    """The consumer's part of ``__cuda_array_interface__`` v3: ``stream`` waits for the work queued on
    ``producer`` (1: the legacy default stream, 2: the per-thread one; None: nothing to wait for)."""
    if producer is None:
        return
    if isinstance(producer, bool) or not isinstance(producer, (int, np.integer)) or int(producer) < 0:
        raise DeviceError(f"op '{op.name}': input '{op.input_name(index)}': its __cuda_array_interface__ names "
                          f"stream {producer!r}; the interface expects None or a CUDA stream handle (1: legacy "
                          "default, 2: per-thread default)")
    if not cuda.same_stream(int(producer), stream):
        cuda.order_after(int(producer), stream)


def device_views(op: OpLike, args: Sequence[Any], stream: int, consumer: int, device: tuple[int, int],
                 skip: Sequence[int] = ()) -> list[Any]:
    """``device_view`` of each argument (None at the indices in ``skip``); a DeviceError
    naming every input's device when one is not on ``device``."""
    views: list[Any] = [None if k in skip else device_view(op, k, a, stream, consumer) for k, a in enumerate(args)]
    for view in views:
        if view is not None and view.device != device:
            mixed_devices(op, args)
    return views


def _plans(planner: CallPlanner) -> BoundedCache[tuple[Any, ...], BufferPlan]:
    plans = getattr(planner, "_device_plans", None)
    if plans is None:
        plans = planner._device_plans = BoundedCache(PLANS_PER_OP)
    return plans


def run_on_device(planner: CallPlanner, where: Placement, args: Sequence[Any]) -> Any:
    """Run ``planner``'s op on arrays in GPU memory; outputs are the inputs' kind, on their device."""
    op, attrs = planner.op, planner.attrs
    device_type, device_id = where.device
    if device_type != CUDA:
        raise DeviceError(f"op '{op.name}': its inputs are on {device_name(where.device)}; opforge runs kernels on "
                          "the CPU and on CUDA devices")
    kind = where.kind
    scalars = [index for index, value in enumerate(args) if kind_of(value) != kind]  # (placement: no other kind)
    for index in scalars:
        value = args[index]
        if value is None or not _is_scalar(value):
            raise DeviceError(f"op '{op.name}': input '{op.input_name(index)}' is "
                              f"{'absent' if value is None else type(value).__name__} while the other inputs are "
                              f"in GPU memory; pass every input as an array on {device_name(where.device)} (or "
                              "a Python or NumPy scalar)")
    token = cuda.enter_device(device_id)
    try:
        stream, consumer = cuda.call_stream(kind, device_id)
        # (None at the scalars' places until _scalar_views fills them)
        views = device_views(op, args, stream, consumer, where.device, scalars)
        if scalars:
            _scalar_views(op, args, scalars, views)
        signature = tuple([(v.shape, v.dtype) for v in views])
        plan = _plans(planner).get_or_create(
            signature, lambda: BufferPlan(op, attrs, [TensorSpec(v.shape, v.dtype) for v in views], "gpu"))
        if not plan.native:  # a Python GPU kernel works on the caller's own arrays
            return plan.kernel.fn(*args, **attrs)
        held = _upload_scalars(views, scalars, stream, device_id) if scalars else ()
        outputs = [cuda.allocate(n, stream, device_id) for n in plan.out_nbytes]
        if not plan.skip:  # (skipped: every output is empty)
            workspace = cuda.allocate(plan.workspace_bytes, stream, device_id) if plan.workspace_bytes else None
            plan.run([v.data for v in views], [b.pointer for b in outputs],
                     workspace.pointer if workspace is not None else 0, stream)
            del workspace  # freed stream-ordered: after the kernel, on the same stream
        del held  # scalars uploaded for this call alone: freed the same way
        exports = [b.export(s.shape, s.dtype) for b, s in zip(outputs, plan.out_specs)]
        if not scalars and planner.device_routes is not None:
            _remember(planner, where, args, views, plan)
    finally:
        cuda.leave_device(token)
    if where.from_dlpack is None:  # a library with no from_dlpack: the exports are DLPack arrays themselves
        return tuple(exports) if op.tuple_output else exports[0]
    return where.wrap_result(op, tuple(exports) if op.tuple_output else exports[0])


def _remember(planner: CallPlanner, where: Placement, args: Sequence[Any], views: Sequence[Any],
              plan: BufferPlan) -> None:
    """Hand a call that went through to its launcher's DeviceRoutes: later calls with arguments
    of the same type, device, shapes and dtypes run in C, with the steps above.  Only the plain
    case is remembered: arrays of one type with ``__dlpack__``, a native kernel with work to do,
    no 64-bit outputs for JAX (its check of them stays in Python)."""
    array_type = type(args[0]) if args else None
    if (array_type is None or plan.skip or not all(type(a) is array_type for a in args)
            or not hasattr(array_type, "__dlpack__")
            or (where.kind == "jax" and any(s.dtype in _64_BIT for s in plan.out_specs))):
        return
    op, kernel, detached = planner.op, plan.kernel, where.detached()

    def failed(rc: int, error: tuple[str, str] | None) -> NoReturn:
        raise kernel_error(op, kernel, rc, error)

    planner.device_routes.remember(
        array_type, where.device[1], tuple(v.shape for v in views), tuple(v.dtype for v in views), plan.function,
        plan.extra, tuple(s.shape for s in plan.out_specs), tuple(s.dtype for s in plan.out_specs), plan.out_nbytes,
        plan.workspace, functools.partial(cuda.call_context, where.kind), where.from_dlpack,
        functools.partial(detached.wrap, op), failed,
        functools.partial(cuda.check_launch, op.name, kernel.function_name))


def _scalar_views(op: Op, args: Sequence[Any], scalars: Sequence[int], views: list[Any]) -> None:
    """Fills ``views`` at the scalars' places with 0-d arrays.  A Python scalar takes
    the dtype of the first array input, as on the CPU (``x * 2.0`` stays float32);
    a NumPy scalar keeps its own."""
    like = next(v.dtype for v in views if v is not None)
    for index in scalars:
        value = args[index]
        target = value.dtype if isinstance(value, np.generic) else to_numpy(like)
        try:
            views[index] = _ScalarView(np.asarray(value, target))
        except (OpforgeError, TypeError, ValueError, OverflowError) as error:
            raise DTypeError(f"op '{op.name}': input '{op.input_name(index)}': the scalar {value!r} cannot be "
                             f"passed to a GPU kernel as a 0-d {target} array: {error}") from None


def _upload_scalars(views: Sequence[Any], scalars: Sequence[int], stream: int, device_id: int) -> list[Any]:
    """Puts the scalar views' values on the device; the buffers to release after the
    launch (values the per-device cache of constants does not hold)."""
    held = []
    for index in scalars:
        view = views[index]
        view.data, holder = cuda.constant(view.array, stream, device_id)
        if holder is not None:
            held.append(holder)
    return held
