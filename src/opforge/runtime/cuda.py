"""The CUDA runtime by ctypes: device memory, the caller's stream, launch checks.

* ``allocate`` takes device memory stream-ordered (``cudaMallocFromPoolAsync``)
  from a memory pool of opforge's own per device, made with a release
  threshold that keeps freed blocks for reuse: a call never costs a
  ``cudaMalloc``/``cudaFree``.  The device's default pool, which other
  libraries share, is left as it is.  A ``DeviceBuffer`` is freed with
  ``cudaFreeAsync`` on the stream that made it, after the streams its DLPack
  consumers named (``DeviceBuffer.export_to``).
* ``current_stream`` is the stream a kernel runs on: ``opforge.cuda.stream``'s
  (thread-local) if one is set, else PyTorch's or CuPy's current stream for
  their arrays, else the legacy default stream (0).  It is a ``StreamHandle``:
  an int that keeps the stream object it came from alive, so a handle kept
  past the call (a buffer's free, a graph plan's next call) is never one its
  owner has destroyed.
* ``check_launch`` reads ``cudaGetLastError`` after a launch (cheap, never a
  synchronization) and tells a sticky device error, after which the process
  must restart, from one that only failed this launch.
* ``run_host_arrays`` is the slow path: NumPy arrays given to a GPU kernel are
  staged through pinned, pooled host buffers with asynchronous copies on the
  current stream, and the call waits for that stream (never the device).

The runtime library is loaded on first use: ``$OPFORGE_CUDART`` names it, else
libcudart is searched for (the dynamic loader's path, ``$CUDA_HOME``,
``$CUDA_PATH``, ``/usr/local/cuda``).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import _native
from ..errors import CudaError, DeviceError

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..operator import Op
    from ..spec import TensorSpec
    from .aot import AotKernel

_H2D, _D2H = 1, 2
_RELEASE_THRESHOLD = 4  # cudaMemPoolAttrReleaseThreshold
_KEEP_EVERYTHING = ctypes.c_uint64(2**64 - 1)
_PINNED_MIN = 4096  # pinned staging buffers come in powers of two from here
_DISABLE_TIMING = 2  # cudaEventDisableTiming
_NOT_READY = 600  # cudaErrorNotReady: queued work has not finished (not a failure)
_DLPACK_CUDA = 2  # kDLCUDA
_CONSTANTS_MAX = 1024  # scalar values kept on each device for calls that mix scalars with device arrays

# Errors after which the CUDA context is unusable: every later call fails too.
STICKY_ERRORS = {
    214: "cudaErrorECCUncorrectable",
    700: "cudaErrorIllegalAddress",
    702: "cudaErrorLaunchTimeout",
    710: "cudaErrorAssert",
    714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure",
}

_lock = threading.Lock()
_local = threading.local()  # .stream: the opforge.cuda.stream override; .device: on_device's device
_runtime: _Runtime | None = None
_pools: dict[int, int] = {}  # device -> opforge's memory pool there
_pinned_free: dict[int, list[int]] = {}  # bucket size -> pinned host pointers ready for reuse
# (event, size, pointer): staging buffers an asynchronous copy may still read
_pinned_pending: list[tuple[int | None, int, int]] = []
# (device, dtype, bytes) -> [device pointer, event of its upload or None once done]
_constants: dict[tuple[int, str, bytes], list[Any]] = {}


# -- loading ------------------------------------------------------------------
def _candidates() -> Iterator[str]:
    override = os.environ.get("OPFORGE_CUDART")
    if override:
        yield override
        return
    found = ctypes.util.find_library("cudart")
    if found:
        yield found
    for root in filter(None, [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]):
        yield from sorted(glob.glob(os.path.join(root, "lib64", "libcudart.so*")))
        yield from sorted(glob.glob(os.path.join(root, "targets", "*", "lib", "libcudart.so*")))
    yield "libcudart.so"


_P, _I, _U, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
_SIGNATURES = {  # name: argument types; every call returns cudaError_t (int)
    "cudaGetDeviceCount": [ctypes.POINTER(_I)], "cudaGetDevice": [ctypes.POINTER(_I)], "cudaSetDevice": [_I],
    "cudaGetLastError": [], "cudaPeekAtLastError": [],
    "cudaMallocFromPoolAsync": [ctypes.POINTER(_P), _S, _P, _P], "cudaFreeAsync": [_P, _P],
    "cudaMemPoolCreate": [ctypes.POINTER(_P), _P], "cudaMemPoolSetAttribute": [_P, _I, _P],
    "cudaMemcpyAsync": [_P, _P, _S, _I, _P], "cudaMemsetAsync": [_P, _I, _S, _P],
    "cudaHostAlloc": [ctypes.POINTER(_P), _S, _U], "cudaFreeHost": [_P],
    "cudaStreamSynchronize": [_P], "cudaDeviceSynchronize": [],
    "cudaPointerGetAttributes": [_P, _P],
    "cudaEventCreateWithFlags": [ctypes.POINTER(_P), _U], "cudaEventRecord": [_P, _P],
    "cudaStreamWaitEvent": [_P, _P, _U], "cudaEventQuery": [_P], "cudaEventDestroy": [_P],
}


_MEMORY_CALLS = ("cudaGetDevice", "cudaSetDevice", "cudaMallocFromPoolAsync", "cudaFreeAsync",
                 "cudaEventCreateWithFlags", "cudaEventRecord", "cudaStreamWaitEvent", "cudaEventDestroy",
                 "cudaPeekAtLastError", "cudaGetLastError")


class _Runtime(ctypes.CDLL):
    """The loaded libcudart; ``memory`` makes and frees DeviceBuffers with its calls, from C."""

    memory: _native.CudaRuntime


def _load() -> _Runtime:
    errors = []
    for name in _candidates():
        try:
            lib = _Runtime(name)
            break
        except OSError as error:
            errors.append(str(error))
    else:
        where = "$OPFORGE_CUDART" if os.environ.get("OPFORGE_CUDART") else "the CUDA toolkit"
        raise CudaError("the CUDA runtime (libcudart) was not found; install the CUDA toolkit, set CUDA_HOME or "
                        f"OPFORGE_CUDART ({where}: {'; '.join(errors) or 'nothing to try'})")
    try:
        for name, argtypes in _SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int
        lib.cudaGetErrorString.argtypes, lib.cudaGetErrorString.restype = [_I], ctypes.c_char_p
        lib.cudaGetErrorName.argtypes, lib.cudaGetErrorName.restype = [_I], ctypes.c_char_p
        # The memory path's calls from C (DeviceMemory); kept with the library it came from.
        lib.memory = _native.CudaRuntime(
            {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _MEMORY_CALLS}, DeviceBuffer)
    except AttributeError as error:
        raise CudaError(f"the CUDA runtime {lib._name} lacks a call opforge needs ({error}); CUDA >= 11.4 is "
                        "required") from None
    return lib


def runtime() -> _Runtime:
    """The loaded CUDA runtime; CudaError if it is missing or sees no device."""
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                lib = _load()
                count = ctypes.c_int(0)
                code = lib.cudaGetDeviceCount(ctypes.byref(count))
                if code != 0 or count.value == 0:
                    reason = f": {lib.cudaGetErrorString(code).decode()}" if code else ""
                    raise CudaError(f"no CUDA device is visible{reason}")
                _runtime = lib
    return _runtime


def device_count() -> int:
    """How many CUDA devices this process sees; 0 without a runtime or a device."""
    try:
        lib = runtime()
    except CudaError:
        return 0
    count = ctypes.c_int(0)
    return count.value if lib.cudaGetDeviceCount(ctypes.byref(count)) == 0 else 0


def is_available() -> bool:
    """True when the CUDA runtime loads and sees at least one device."""
    return device_count() > 0


def _reset() -> None:
    """Forget the loaded runtime and everything taken from it (tests point
    ``$OPFORGE_CUDART`` at another library, then call this)."""
    global _runtime
    with _lock:
        _runtime = None
        _pools.clear()
        _pinned_free.clear()
        _pinned_pending.clear()
        _constants.clear()
    _local.__dict__.clear()


# -- errors -------------------------------------------------------------------
def _describe(lib: ctypes.CDLL, code: int) -> str:
    return f"{lib.cudaGetErrorString(code).decode()} ({lib.cudaGetErrorName(code).decode()}, cudaError {code})"


def _error(lib: ctypes.CDLL, code: int, what: str, *, sticky: bool = False) -> CudaError:
    sticky = sticky or code in STICKY_ERRORS
    message = f"{what}: {_describe(lib, code)}"
    if sticky:
        message += ("; this is a sticky device error: the CUDA context is unusable and every later CUDA call in "
                    "this process fails; restart the process (compute-sanitizer finds the faulting access)")
    error = CudaError(message)
    error.code, error.sticky = code, sticky
    return error


def _failed(lib: ctypes.CDLL, code: int, what: str, *, reset: bool = True) -> CudaError:
    """The CudaError for a failed call.  The call's error is also the thread's
    last error: once that is reset, an error still there is sticky."""
    if reset:
        lib.cudaGetLastError()
    return _error(lib, code, what, sticky=lib.cudaPeekAtLastError() != 0)


def _check(code: int, what: str) -> None:
    if code != 0:
        raise _failed(_runtime, code, what)  # type: ignore[arg-type]  # loaded: the code came from it


def check_launch(op_name: str, function_name: str) -> None:
    """After a kernel call: CudaError naming op and kernel if the launch failed."""
    lib = _runtime if _runtime is not None else runtime()
    code = lib.cudaGetLastError()
    if code != 0:
        raise _failed(lib, code, f"op '{op_name}': kernel '{function_name}' failed on the GPU", reset=False)


def last_error_address() -> int:
    """Address of the runtime's ``cudaGetLastError``, for launch checks made in C++
    (0 without a runtime: the caller then checks nothing)."""
    try:
        lib = runtime()
    except CudaError:
        return 0
    return ctypes.cast(lib.cudaGetLastError, ctypes.c_void_p).value or 0


# -- devices ------------------------------------------------------------------
def current_device() -> int:
    lib = runtime()
    device = ctypes.c_int(0)
    _check(lib.cudaGetDevice(ctypes.byref(device)), "cudaGetDevice")
    return device.value


def enter_device(device_id: int) -> tuple[int | None, int | None]:
    """Make ``device_id`` the calling thread's current device until ``leave_device(token)``
    with the token returned here (``on_device`` without a generator, for the call path)."""
    outer: int | None = getattr(_local, "device", None)
    if outer == device_id:  # inside on_device(device_id) already: it is current
        return (outer, None)
    previous = current_device()
    if previous != device_id:
        _check(runtime().cudaSetDevice(device_id), f"cudaSetDevice({device_id})")
    _local.device = device_id
    return (outer, previous if previous != device_id else None)


def leave_device(token: tuple[int | None, int | None]) -> None:
    outer, previous = token
    _local.device = outer
    if previous is not None:
        runtime().cudaSetDevice(previous)


@contextlib.contextmanager
def on_device(device_id: int) -> Iterator[None]:
    """Make ``device_id`` the calling thread's current device inside the block."""
    token = enter_device(device_id)
    try:
        yield
    finally:
        leave_device(token)


class _PointerAttributes(ctypes.Structure):  # cudaPointerAttributes since CUDA 11
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("device_pointer", _P), ("host_pointer", _P)]


def pointer_device(pointer: int) -> int:
    """The device a pointer into device memory belongs to (0 when the runtime cannot tell)."""
    lib = runtime()
    attributes = _PointerAttributes()
    if lib.cudaPointerGetAttributes(ctypes.byref(attributes), pointer) != 0:
        lib.cudaGetLastError()  # the query failed; it must not be blamed on the next launch
        return 0
    return attributes.device if attributes.type in (2, 3) and attributes.device >= 0 else 0


# -- streams ------------------------------------------------------------------
class StreamHandle(int):
    """A ``cudaStream_t`` (an int: it goes wherever one does) that keeps ``owner``,
    the stream object it was read from, alive.  A CuPy stream destroys its CUDA
    stream when it is collected; opforge keeps handles past the call that got
    them (a buffer is freed on its stream later; a graph plan orders its next
    call after its last stream), so it keeps their owners with them."""

    owner: object

    def __new__(cls, handle: int, owner: object = None) -> StreamHandle:
        self = super().__new__(cls, handle)
        self.owner = owner
        return self

    # pickled (or copied) as the plain handle: an owner does not travel
    def __reduce__(self) -> tuple[type[int], tuple[int]]:
        return (int, (int(self),))


def stream_handle(s: Any) -> int:
    """The ``cudaStream_t`` of anything ``opforge.cuda.stream`` accepts: an int as it is,
    a stream object's handle as a StreamHandle that keeps the object alive."""
    if isinstance(s, bool):
        pass
    elif isinstance(s, (int, np.integer)) and int(s) >= 0:
        return s if isinstance(s, StreamHandle) else int(s)
    elif hasattr(s, "__cuda_stream__"):
        protocol = s.__cuda_stream__()
        if (isinstance(protocol, tuple) and len(protocol) == 2 and isinstance(protocol[1], int)
                and not isinstance(protocol[1], bool) and protocol[1] >= 0):
            return StreamHandle(protocol[1], s)
        raise DeviceError(f"opforge.cuda.stream: {type(s).__name__}.__cuda_stream__() returned {protocol!r}; the "
                          "CUDA stream protocol expects (version, handle) with an int handle")
    elif isinstance(getattr(s, "cuda_stream", None), int):  # torch.cuda.Stream
        return StreamHandle(s.cuda_stream, s)
    elif isinstance(getattr(s, "ptr", None), int) and "cupy" in type(s).__module__:  # cupy.cuda.Stream
        return StreamHandle(s.ptr, s)
    raise DeviceError(f"opforge.cuda.stream: argument 's' must be a CUDA stream (an int cudaStream_t handle >= 0, an "
                      f"object with __cuda_stream__(), a torch.cuda.Stream or a CuPy stream), got {s!r}")


@contextlib.contextmanager
def stream(s: Any) -> Iterator[Any]:
    """Run opforge's GPU calls in this thread on stream ``s`` inside the block.

    ``s`` is an int ``cudaStream_t`` (0: the legacy default stream), an object
    with ``__cuda_stream__()``, a ``torch.cuda.Stream`` or a CuPy stream;
    ``None`` sets no stream (the framework's current stream applies again).
    A stream object is kept alive by what opforge makes on it (outputs are
    freed on it); an int handle must stay valid until those are released.
    """
    handle = None if s is None else stream_handle(s)
    outer = getattr(_local, "stream", None)
    _local.stream = handle
    try:
        yield s
    finally:
        _local.stream = outer


def current_stream(kind: str | None = None, device_id: int = 0) -> int:
    """The stream a call on ``kind`` arrays runs on: ``opforge.cuda.stream``'s, else
    PyTorch's or CuPy's current stream for their arrays, else 0 (legacy default).
    A stream read from CuPy comes as a StreamHandle holding its stream object."""
    return call_stream(kind, device_id)[0]


def call_stream(kind: str | None, device_id: int) -> tuple[int, int]:
    """(stream, consumer) of a call on ``kind`` arrays: the stream it runs on
    (``current_stream``) and what its inputs' ``__dlpack__(stream=...)`` is told.
    That is -1, DLPack's "nothing to order", when the stream is the arrays'
    library's own current stream: their producer's work is queued there already,
    and the library would only compare the two streams (torch spends 11 us per
    input on that).  Else it is DLPack's name for the stream (1 for the legacy
    default), so the producer orders its work before the call's."""
    handle: int | None = getattr(_local, "stream", None)
    if handle is None:
        library_stream = _library_stream(kind, device_id)
        if library_stream is not None:
            return library_stream, -1
        handle = 0
    return handle, int(handle) or 1  # a plain int: torch refuses int subclasses (StreamHandle)


def _library_stream(kind: str | None, device_id: int) -> int | None:
    """PyTorch's or CuPy's current stream on the device, for their arrays; None for other kinds."""
    if kind == "torch":
        torch = sys.modules.get("torch")
        if torch is not None:
            # torch never destroys the streams it hands out (its pool's live on; an ExternalStream is the
            # caller's to keep): the raw handle needs no owner.  The C query skips building a Stream object.
            raw_stream = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
            if raw_stream is not None:
                return int(raw_stream(device_id))
            return int(torch.cuda.current_stream(device_id).cuda_stream)
    elif kind == "cupy":
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            try:
                current = cupy.cuda.get_current_stream(device_id)
            except TypeError:  # CuPy before 13 takes no device
                with cupy.cuda.Device(device_id):
                    current = cupy.cuda.get_current_stream()
            return StreamHandle(current.ptr, current)
    return None


def call_context(kind: str, device_id: int) -> tuple[int, int, _native.CudaRuntime, int]:
    """What a call remembered in C (``_native.DeviceRoutes``) asks Python each time: the
    stream and the inputs' consumer stream (``call_stream``), the runtime's memory calls
    and opforge's pool on the device."""
    lib = _runtime if _runtime is not None else runtime()
    stream, consumer = call_stream(kind, device_id)
    return stream, consumer, lib.memory, _pools.get(device_id) or memory_pool(device_id)


def same_stream(a: int, b: int) -> bool:
    """Whether two handles name one stream (0 and cudaStreamLegacy, 1, are both the legacy default stream)."""
    return (a or 1) == (b or 1)


def synchronize(s: Any = None) -> None:
    """Wait for stream ``s`` (anything ``stream`` accepts), or for the whole device
    when ``s`` is None; CudaError names a failure found there."""
    lib = runtime()
    if s is None:
        _check(lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
    else:
        _check(lib.cudaStreamSynchronize(stream_handle(s)), "cudaStreamSynchronize")


def _new_event(lib: ctypes.CDLL) -> int | None:
    event = ctypes.c_void_p()
    _check(lib.cudaEventCreateWithFlags(ctypes.byref(event), _DISABLE_TIMING), "cudaEventCreateWithFlags")
    return event.value


def order_after(previous: int, stream: int) -> None:
    """Make ``stream`` wait for the work queued so far on ``previous`` (an event; no host wait).
    Both are streams of the current device."""
    lib = runtime()
    event = _new_event(lib)
    try:
        _check(lib.cudaEventRecord(event, previous), "cudaEventRecord")
        _check(lib.cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent")
    finally:
        lib.cudaEventDestroy(event)  # CUDA keeps what the wait needs


def _query(lib: ctypes.CDLL, event: int | None) -> int:
    """cudaEventQuery, without leaving cudaErrorNotReady as the thread's last error
    (the next launch check would blame a kernel for it)."""
    code: int = lib.cudaEventQuery(event)
    if code == _NOT_READY and lib.cudaPeekAtLastError() == _NOT_READY:
        lib.cudaGetLastError()
    return code


def dlpack_consumer_stream(stream: object) -> int | None:
    """The ``cudaStream_t`` a DLPack consumer named with ``__dlpack__(stream=...)`` for
    a CUDA tensor, or None when it asked for no ordering (-1).  None (not given) and
    1 mean the legacy default stream, 2 the per-thread default stream (both are
    also CUDA's own handles for them).  The protocol disallows 0 as ambiguous; a
    consumer that sends it anyway gets what CUDA's handle 0 is in opforge's
    runtime, the legacy default stream (as PyTorch's producer does)."""
    if stream is None:
        return 1
    if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)) or int(stream) < -1:
        raise BufferError(f"__dlpack__: stream must be an int CUDA stream handle, 1 (legacy default), 2 "
                          f"(per-thread default) or -1 (no synchronization), got {stream!r}")
    if stream == -1:
        return None
    return int(stream) or 1


# -- device memory ------------------------------------------------------------
class DeviceBuffer(_native.DeviceMemory):
    """Device memory from opforge's stream-ordered pool, freed when released
    (explicitly, or when the last reference goes); made by ``allocate``.

    ``stream`` made the memory (and, for opforge's own reuse, is set to the last
    stream that used it); ``users`` are the other streams DLPack consumers named
    (``export_to``).  The free is queued on ``stream`` after it has waited for
    every user: the pool never hands the memory out again while a consumer's
    queued work may still read it.  Allocation and release are C
    (``_native.DeviceMemory``): a call's outputs cost no ctypes calls.
    """

    __slots__ = ()

    def export_to(self, stream: int | None) -> None:
        """DLPack's stream semantics when a consumer takes this memory with
        ``__dlpack__(stream=stream)``: its stream waits for the work queued on
        ``self.stream`` (which produced the contents), and the eventual free
        waits for that stream.  -1 asks for nothing."""
        consumer = dlpack_consumer_stream(stream)
        if consumer is None or same_stream(consumer, self.stream):
            return
        with on_device(self.device_id):
            order_after(self.stream, consumer)
        users = self.users if self.users is not None else []
        if not any(same_stream(consumer, u) for u in users):
            users.append(consumer)
        self.users = users

    def export(self, shape: Sequence[int], dtype: str) -> Any:
        """This memory as a C-contiguous DLPack tensor of ``shape`` and ``dtype`` (a
        DLPackExport that keeps the buffer alive and orders its consumers' streams)."""
        return _native.DLPackExport(self.pointer, shape, dtype, _DLPACK_CUDA, self.device_id, self,
                                    sync=self.export_to)

    def __repr__(self) -> str:
        return f"DeviceBuffer(0x{self.pointer:x}, {self.nbytes} bytes, device {self.device_id}, stream {self.stream})"


class _PoolProps(ctypes.Structure):  # cudaMemPoolProps (88 bytes since CUDA 11.2; unused fields zero)
    _fields_ = [("alloc_type", ctypes.c_int), ("handle_types", ctypes.c_int), ("location_type", ctypes.c_int),
                ("location_id", ctypes.c_int), ("win32_security_attributes", ctypes.c_void_p),
                ("reserved", ctypes.c_ubyte * 64)]


def memory_pool(device_id: int = 0) -> int:
    """opforge's own memory pool on ``device_id`` (a ``cudaMemPool_t``), made on first use.

    Its release threshold keeps freed memory for reuse.  That attribute is set on
    this pool only: the device's default pool (``cudaMallocAsync``'s, which
    PyTorch, CuPy and others may use) keeps whatever its owner chose.
    """
    pool = _pools.get(device_id)
    if pool is not None:
        return pool
    lib = runtime()
    with _lock:
        pool = _pools.get(device_id)
        if pool is None:
            props = _PoolProps(alloc_type=1, handle_types=0, location_type=1, location_id=device_id)  # pinned, device
            handle = ctypes.c_void_p()
            _check(lib.cudaMemPoolCreate(ctypes.byref(handle), ctypes.byref(props)),
                   f"cudaMemPoolCreate(device {device_id})")
            _check(lib.cudaMemPoolSetAttribute(handle, _RELEASE_THRESHOLD, ctypes.byref(_KEEP_EVERYTHING)),
                   "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)")
            # never destroyed: its memory may outlive any caller; non-NULL, as the create succeeded
            pool = _pools[device_id] = cast(int, handle.value)
    return pool


def allocate(nbytes: int, stream: int, device_id: int = 0) -> DeviceBuffer:
    """``nbytes`` of device memory on ``device_id`` from opforge's pool, ordered on ``stream``."""
    lib = runtime()
    made = lib.memory.allocate(int(nbytes), stream, device_id, _pools.get(device_id) or memory_pool(device_id))
    if type(made) is int:
        raise _failed(lib, made, f"cudaMallocFromPoolAsync of {nbytes} bytes on device {device_id}")
    return made  # type: ignore[no-any-return]  # the CudaRuntime makes DeviceBuffers


def memset(buffer: DeviceBuffer, value: int, stream: int) -> None:
    """Fill a DeviceBuffer with the byte ``value``, ordered on ``stream``."""
    _check(runtime().cudaMemsetAsync(buffer.pointer, value, buffer.nbytes, stream), "cudaMemsetAsync")


def upload(array: npt.NDArray[Any], stream: int, device_id: int = 0) -> DeviceBuffer:
    """A copy of host ``array``'s bytes in device memory, made on ``stream`` without
    waiting: staged through a pinned buffer that is reused once an event says the
    copy has read it.  Call inside ``on_device(device_id)``."""
    lib = runtime()
    array = np.ascontiguousarray(array)
    buffer = allocate(array.nbytes, stream, device_id)
    if not array.nbytes:
        return buffer
    size, staging = _take_pinned(lib, array.nbytes)
    ctypes.memmove(staging, array.ctypes.data, array.nbytes)
    event = None
    try:
        _check(lib.cudaMemcpyAsync(buffer.pointer, staging, array.nbytes, _H2D, stream),
               "cudaMemcpyAsync to the device")
        event = _new_event(lib)
        _check(lib.cudaEventRecord(event, stream), "cudaEventRecord")
    except BaseException:
        buffer.release()
        if event is not None:
            lib.cudaEventDestroy(event)
        if lib.cudaStreamSynchronize(stream) == 0:  # the copy, if queued, is done with the staging buffer
            _give_back_pinned([(size, staging)])
        raise
    with _lock:
        _pinned_pending.append((event, size, staging))
    return buffer


def constant(array: npt.NDArray[Any], stream: int, device_id: int = 0) -> tuple[int, DeviceBuffer | None]:
    """Device memory holding the value of the 0-d host ``array``, ready for work on
    ``stream``: ``(pointer, holder)``.  Each value is uploaded once per device and
    kept for the process (up to ``_CONSTANTS_MAX`` values; then each call uploads
    its own copy, which ``holder``, a DeviceBuffer, keeps until it is released
    stream-ordered after the call).  A value uploaded on another stream is waited
    for through its upload's event until that event has completed."""
    lib = runtime()
    key = (device_id, array.dtype.str, array.tobytes())
    entry = _constants.get(key)
    if entry is None:
        buffer = upload(array, stream, device_id)
        if len(_constants) >= _CONSTANTS_MAX:
            return buffer.pointer, buffer
        event = _new_event(lib)
        _check(lib.cudaEventRecord(event, stream), "cudaEventRecord")
        with _lock:
            entry = _constants.setdefault(key, [buffer.pointer, event])
        if entry[0] == buffer.pointer:
            buffer.keep()  # kept for the process: never freed
        else:  # another thread cached the value meanwhile
            lib.cudaEventDestroy(event)
    if entry[1] is not None:
        with _lock:  # one thread at a time may destroy the event
            event = entry[1]
            if event is not None and _query(lib, event) == 0:
                entry[1] = None
                lib.cudaEventDestroy(event)
            elif event is not None:
                _check(lib.cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent")
    return entry[0], None


# -- host arrays: the slow path -----------------------------------------------
def _bucket(nbytes: int) -> int:
    return max(_PINNED_MIN, 1 << (max(int(nbytes), 1) - 1).bit_length())


def _reclaim_pinned(lib: ctypes.CDLL) -> None:
    """Return to the pool the staging buffers whose asynchronous copies have finished."""
    with _lock:  # held throughout: an event is queried and destroyed by one thread
        still = []
        for event, size, pointer in _pinned_pending:
            code = _query(lib, event)
            if code == _NOT_READY:
                still.append((event, size, pointer))
                continue
            lib.cudaEventDestroy(event)
            if code == 0:  # (after a failure the context is lost: the buffer is left alone)
                _pinned_free.setdefault(size, []).append(pointer)
        _pinned_pending[:] = still


def _take_pinned(lib: ctypes.CDLL, nbytes: int) -> tuple[int, int]:
    size = _bucket(nbytes)
    if _pinned_pending:
        _reclaim_pinned(lib)
    with _lock:
        free = _pinned_free.get(size)
        if free:
            return size, free.pop()
    pointer = ctypes.c_void_p()
    _check(lib.cudaHostAlloc(ctypes.byref(pointer), size, 0), f"cudaHostAlloc of {size} bytes")
    return size, pointer.value  # type: ignore[return-value]  # not NULL: cudaHostAlloc succeeded


def _give_back_pinned(taken: Iterable[tuple[int, int]]) -> None:
    with _lock:
        for size, pointer in taken:
            _pinned_free.setdefault(size, []).append(pointer)


def run_host_arrays(kernel: AotKernel, op: Op, arrays: Sequence[Any], out_specs: Sequence[TensorSpec],
                    workspace_sizes: Sequence[int], shapes: Sequence[tuple[int, ...]], names: Sequence[str],
                    extra: Any) -> list[npt.NDArray[Any]]:
    """Run a GPU kernel on host (NumPy) arrays: the slow path.

    Inputs are staged through pinned, pooled host buffers and copied to device
    memory from the pool asynchronously on the current stream; the kernel runs
    there; outputs come back the same way, and the call waits for that stream
    (cudaStreamSynchronize, never the whole device).  Pass arrays in GPU memory
    (torch, CuPy, JAX) to avoid all of this.
    """
    from .dispatch import kernel_error

    lib = runtime()
    device_id = current_device()
    stream = current_stream(None, device_id)
    arrays = [np.ascontiguousarray(a) for a in arrays]
    outputs = [np.empty(s.shape, s.dtype) for s in out_specs]
    pinned, buffers, synchronized = [], [], False
    try:
        pointers = []
        for array in arrays:
            buffer = allocate(array.nbytes, stream, device_id)
            buffers.append(buffer)
            if array.nbytes:
                pinned.append(_take_pinned(lib, array.nbytes))
                staging = pinned[-1][1]
                ctypes.memmove(staging, array.ctypes.data, array.nbytes)
                _check(lib.cudaMemcpyAsync(buffer.pointer, staging, array.nbytes, _H2D, stream),
                       f"op '{op.name}': cudaMemcpyAsync to the device")
            pointers.append(buffer.pointer)
        out_buffers = [allocate(o.nbytes, stream, device_id) for o in outputs]
        buffers += out_buffers
        pointers += [b.pointer for b in out_buffers]
        for size in workspace_sizes:
            buffers.append(allocate(size, stream, device_id))
            pointers.append(buffers[-1].pointer)
        rc, error = _native.call_kernel(kernel._function, pointers, shapes, names, stream, extra)
        if rc != 0 or error is not None:
            raise kernel_error(op, kernel, rc, error)
        check_launch(op.name, kernel.function_name)
        out_staging = []
        for output, buffer in zip(outputs, out_buffers):
            if output.nbytes:
                pinned.append(_take_pinned(lib, output.nbytes))
                out_staging.append((output, pinned[-1][1]))
                _check(lib.cudaMemcpyAsync(pinned[-1][1], buffer.pointer, output.nbytes, _D2H, stream),
                       f"op '{op.name}': cudaMemcpyAsync to the host")
        _check(lib.cudaStreamSynchronize(stream),
               f"op '{op.name}': kernel '{kernel.function_name}' (found when waiting for its stream)")
        synchronized = True
        for output, staging in out_staging:
            ctypes.memmove(output.ctypes.data, staging, output.nbytes)
        return outputs
    finally:
        for buffer in buffers:
            buffer.release()
        # Staging buffers are reused only once no copy can still be reading or writing them.
        if synchronized or lib.cudaStreamSynchronize(stream) == 0:
            _give_back_pinned(pinned)

