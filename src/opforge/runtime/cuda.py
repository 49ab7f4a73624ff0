"""The CUDA runtime by ctypes: device memory, the caller's stream, launch checks.

* ``allocate`` takes device memory stream-ordered (``cudaMallocAsync``) from
  the device's default memory pool, whose release threshold is raised once per
  device so freed blocks stay in the pool and are reused: a call never costs a
  ``cudaMalloc``/``cudaFree``.  A ``DeviceBuffer`` is freed with
  ``cudaFreeAsync`` on its stream when it is released.
* ``current_stream`` is the stream a kernel runs on: ``opforge.cuda.stream``'s
  (thread-local) if one is set, else PyTorch's or CuPy's current stream for
  their arrays, else the legacy default stream (0).
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

import numpy as np

from .. import _native
from ..errors import CudaError, DeviceError

_H2D, _D2H = 1, 2
_RELEASE_THRESHOLD = 4  # cudaMemPoolAttrReleaseThreshold
_KEEP_EVERYTHING = ctypes.c_uint64(2**64 - 1)
_PINNED_MIN = 4096  # pinned staging buffers come in powers of two from here

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
_runtime = None
_pools_ready: set = set()  # devices whose default pool keeps freed memory
_pinned_free: dict = {}  # bucket size -> pinned host pointers ready for reuse


# -- loading ------------------------------------------------------------------
def _candidates():
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
    "cudaMallocAsync": [ctypes.POINTER(_P), _S, _P], "cudaFreeAsync": [_P, _P],
    "cudaDeviceGetDefaultMemPool": [ctypes.POINTER(_P), _I], "cudaMemPoolSetAttribute": [_P, _I, _P],
    "cudaMemcpyAsync": [_P, _P, _S, _I, _P], "cudaMemsetAsync": [_P, _I, _S, _P],
    "cudaHostAlloc": [ctypes.POINTER(_P), _S, _U], "cudaFreeHost": [_P],
    "cudaStreamSynchronize": [_P], "cudaDeviceSynchronize": [],
    "cudaPointerGetAttributes": [_P, _P],
    "cudaStreamBeginCapture": [_P, _I], "cudaStreamEndCapture": [_P, ctypes.POINTER(_P)],
    "cudaGraphInstantiateWithFlags": [ctypes.POINTER(_P), _P, ctypes.c_ulonglong], "cudaGraphLaunch": [_P, _P],
    "cudaGraphDestroy": [_P], "cudaGraphExecDestroy": [_P],
}


def _load():
    errors = []
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
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
    except AttributeError as error:
        raise CudaError(f"the CUDA runtime {lib._name} lacks a call opforge needs ({error}); CUDA >= 11.4 is "
                        "required") from None
    return lib


def runtime():
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
    return device_count() > 0


def _reset():
    """Forget the loaded runtime and everything taken from it (tests point
    ``$OPFORGE_CUDART`` at another library, then call this)."""
    global _runtime
    with _lock:
        _runtime = None
        _pools_ready.clear()
        _pinned_free.clear()
    _local.__dict__.clear()


# -- errors -------------------------------------------------------------------
def _describe(lib, code):
    return f"{lib.cudaGetErrorString(code).decode()} ({lib.cudaGetErrorName(code).decode()}, cudaError {code})"


def _error(lib, code, what, *, sticky=False):
    sticky = sticky or code in STICKY_ERRORS
    message = f"{what}: {_describe(lib, code)}"
    if sticky:
        message += ("; this is a sticky device error: the CUDA context is unusable and every later CUDA call in "
                    "this process fails; restart the process (compute-sanitizer finds the faulting access)")
    error = CudaError(message)
    error.code, error.sticky = code, sticky
    return error


def _failed(lib, code, what, *, reset=True):
    """The CudaError for a failed call.  The call's error is also the thread's
    last error: once that is reset, an error still there is sticky."""
    if reset:
        lib.cudaGetLastError()
    return _error(lib, code, what, sticky=lib.cudaPeekAtLastError() != 0)


def _check(code, what):
    if code != 0:
        raise _failed(_runtime, code, what)


def check_launch(op_name, function_name):
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


@contextlib.contextmanager
def on_device(device_id):
    """Make ``device_id`` the calling thread's current device inside the block."""
    lib = runtime()
    previous = current_device()
    if previous != device_id:
        _check(lib.cudaSetDevice(device_id), f"cudaSetDevice({device_id})")
    outer = getattr(_local, "device", None)
    _local.device = device_id
    try:
        yield
    finally:
        _local.device = outer
        if previous != device_id:
            lib.cudaSetDevice(previous)


class _PointerAttributes(ctypes.Structure):  # cudaPointerAttributes since CUDA 11
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("device_pointer", _P), ("host_pointer", _P)]


def pointer_device(pointer) -> int:
    """The device a pointer into device memory belongs to (0 when the runtime cannot tell)."""
    lib = runtime()
    attributes = _PointerAttributes()
    if lib.cudaPointerGetAttributes(ctypes.byref(attributes), pointer) != 0:
        lib.cudaGetLastError()  # the query failed; it must not be blamed on the next launch
        return 0
    return attributes.device if attributes.type in (2, 3) and attributes.device >= 0 else 0


# -- streams ------------------------------------------------------------------
def stream_handle(s) -> int:
    """The ``cudaStream_t`` (as an int) of anything ``opforge.cuda.stream`` accepts."""
    if isinstance(s, bool):
        pass
    elif isinstance(s, (int, np.integer)) and int(s) >= 0:
        return int(s)
    elif hasattr(s, "__cuda_stream__"):
        protocol = s.__cuda_stream__()
        if (isinstance(protocol, tuple) and len(protocol) == 2 and isinstance(protocol[1], int)
                and not isinstance(protocol[1], bool) and protocol[1] >= 0):
            return protocol[1]
        raise DeviceError(f"opforge.cuda.stream: {type(s).__name__}.__cuda_stream__() returned {protocol!r}; the "
                          "CUDA stream protocol expects (version, handle) with an int handle")
    elif isinstance(getattr(s, "cuda_stream", None), int):  # torch.cuda.Stream
        return s.cuda_stream
    elif isinstance(getattr(s, "ptr", None), int) and "cupy" in type(s).__module__:  # cupy.cuda.Stream
        return s.ptr
    raise DeviceError(f"opforge.cuda.stream: argument 's' must be a CUDA stream (an int cudaStream_t handle >= 0, an "
                      f"object with __cuda_stream__(), a torch.cuda.Stream or a CuPy stream), got {s!r}")


@contextlib.contextmanager
def stream(s):
    """Run opforge's GPU calls in this thread on stream ``s`` inside the block.

    ``s`` is an int ``cudaStream_t`` (0: the legacy default stream), an object
    with ``__cuda_stream__()``, a ``torch.cuda.Stream`` or a CuPy stream;
    ``None`` sets no stream (the framework's current stream applies again).
    """
    handle = None if s is None else stream_handle(s)
    outer = getattr(_local, "stream", None)
    _local.stream = handle
    try:
        yield s
    finally:
        _local.stream = outer


def current_stream(kind=None, device_id=0) -> int:
    """The stream a call on ``kind`` arrays runs on: ``opforge.cuda.stream``'s, else
    PyTorch's or CuPy's current stream for their arrays, else 0 (legacy default)."""
    handle = getattr(_local, "stream", None)
    if handle is not None:
        return handle
    if kind == "torch":
        torch = sys.modules.get("torch")
        if torch is not None:
            return torch.cuda.current_stream(device_id).cuda_stream
    elif kind == "cupy":
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            with cupy.cuda.Device(device_id):
                return cupy.cuda.get_current_stream().ptr
    return 0


def synchronize(s=None):
    """Wait for stream ``s`` (anything ``stream`` accepts), or for the whole device
    when ``s`` is None; CudaError names a failure found there."""
    lib = runtime()
    if s is None:
        _check(lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
    else:
        _check(lib.cudaStreamSynchronize(stream_handle(s)), "cudaStreamSynchronize")


# -- device memory ------------------------------------------------------------
class DeviceBuffer:
    """Device memory from the stream-ordered pool, freed on its stream when released
    (explicitly, or when the last reference goes)."""

    __slots__ = ("pointer", "nbytes", "device_id", "stream", "_lib")

    def __init__(self, pointer, nbytes, device_id, stream, lib):
        self.pointer, self.nbytes, self.device_id, self.stream, self._lib = pointer, nbytes, device_id, stream, lib

    def release(self):
        pointer, self.pointer = self.pointer, 0
        if pointer:
            # Ordered after the work already queued on the stream; a failure here
            # (a sticky error) is reported by the next checked call.
            self._lib.cudaFreeAsync(pointer, self.stream)

    __del__ = release

    def __repr__(self):
        return f"DeviceBuffer(0x{self.pointer:x}, {self.nbytes} bytes, device {self.device_id}, stream {self.stream})"


def _prepare_pool(lib, device_id):
    """Raise the release threshold of the device's default pool once, so freed memory stays for reuse."""
    with _lock:
        if device_id in _pools_ready:
            return
        pool = ctypes.c_void_p()
        _check(lib.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), device_id),
               f"cudaDeviceGetDefaultMemPool(device {device_id})")
        _check(lib.cudaMemPoolSetAttribute(pool, _RELEASE_THRESHOLD, ctypes.byref(_KEEP_EVERYTHING)),
               "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)")
        _pools_ready.add(device_id)


def allocate(nbytes, stream, device_id=0) -> DeviceBuffer:
    """``nbytes`` of device memory on ``device_id``, ordered on ``stream`` (cudaMallocAsync)."""
    lib = runtime()
    if device_id not in _pools_ready:
        _prepare_pool(lib, device_id)
    pointer = ctypes.c_void_p()
    size = max(int(nbytes), 1)
    if getattr(_local, "device", None) == device_id:
        code = lib.cudaMallocAsync(ctypes.byref(pointer), size, stream)
    else:
        with on_device(device_id):
            code = lib.cudaMallocAsync(ctypes.byref(pointer), size, stream)
    if code != 0:
        raise _failed(lib, code, f"cudaMallocAsync of {nbytes} bytes on device {device_id}")
    return DeviceBuffer(pointer.value, int(nbytes), device_id, stream, lib)


def memset(buffer, value, stream):
    """Fill a DeviceBuffer with the byte ``value``, ordered on ``stream``."""
    _check(runtime().cudaMemsetAsync(buffer.pointer, value, buffer.nbytes, stream), "cudaMemsetAsync")


# -- CUDA graphs --------------------------------------------------------------
class CapturedGraph:
    """Work captured from a stream, instantiated once; ``launch`` replays all of it as one launch."""

    __slots__ = ("_graph", "_exec", "_lib")

    def __init__(self, lib, graph, executable):
        self._lib, self._graph, self._exec = lib, graph, executable

    def launch(self, stream):
        _check(self._lib.cudaGraphLaunch(self._exec, stream), "cudaGraphLaunch")

    def close(self):
        executable, graph, self._exec, self._graph = self._exec, self._graph, None, None
        if executable:
            self._lib.cudaGraphExecDestroy(executable)
        if graph:
            self._lib.cudaGraphDestroy(graph)

    __del__ = close


def capture(stream, record) -> CapturedGraph:
    """Call ``record()`` with ``stream`` capturing (thread-local mode) and return what
    it queued there as a CapturedGraph.  ``stream`` must be a created stream, not
    the legacy default (0); nothing queued is run until ``launch``.  If
    ``record`` raises, the capture is ended and dropped, and the error goes on."""
    lib = runtime()
    if not stream:
        raise CudaError("capture: the legacy default stream (0) cannot be captured; capture on a created stream")
    _check(lib.cudaStreamBeginCapture(stream, 1), "cudaStreamBeginCapture")  # cudaStreamCaptureModeThreadLocal
    graph = ctypes.c_void_p()
    try:
        record()
    except BaseException:
        if lib.cudaStreamEndCapture(stream, ctypes.byref(graph)) == 0 and graph.value:
            lib.cudaGraphDestroy(graph)
        lib.cudaGetLastError()  # the failed capture's error belongs to the error already on its way
        raise
    _check(lib.cudaStreamEndCapture(stream, ctypes.byref(graph)), "cudaStreamEndCapture")
    executable = ctypes.c_void_p()
    code = lib.cudaGraphInstantiateWithFlags(ctypes.byref(executable), graph, 0)
    if code != 0:
        lib.cudaGraphDestroy(graph)
        raise _failed(lib, code, "cudaGraphInstantiateWithFlags")
    return CapturedGraph(lib, graph.value, executable.value)


# -- host arrays: the slow path -----------------------------------------------
def _bucket(nbytes):
    return max(_PINNED_MIN, 1 << (max(int(nbytes), 1) - 1).bit_length())


def _take_pinned(lib, nbytes):
    size = _bucket(nbytes)
    with _lock:
        free = _pinned_free.get(size)
        if free:
            return size, free.pop()
    pointer = ctypes.c_void_p()
    _check(lib.cudaHostAlloc(ctypes.byref(pointer), size, 0), f"cudaHostAlloc of {size} bytes")
    return size, pointer.value


def _give_back_pinned(taken):
    with _lock:
        for size, pointer in taken:
            _pinned_free.setdefault(size, []).append(pointer)


def run_host_arrays(kernel, op, arrays, out_specs, workspace_sizes, shapes, names, extra):
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


run_on_device = run_host_arrays  # the name runtime/aot.py calls
