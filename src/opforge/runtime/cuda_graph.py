"""CUDA graphs: a sequence of launches captured once, replayed with one ``cudaGraphLaunch``.

``capture(record, device_id)`` runs ``record(stream)`` on a private stream
under ``cudaStreamBeginCapture`` (thread-local mode: a kernel that calls
something a capture cannot record, ``cudaMalloc`` or a launch on the legacy
stream, fails the capture instead of running outside it), ends the capture
and instantiates it.  Capturing on opforge's own non-blocking stream rather
than the caller's lets a graph be captured whatever the caller's stream is
(the legacy default stream, which PyTorch and CuPy use unless told
otherwise, cannot be captured); the graph is then launched on the caller's
stream, which orders it after the caller's earlier work.

``CaptureUnsupported`` says the kernels could not be captured (the caller runs
them eagerly instead); any other failure is the kernel's own.  The calls are
made through ``runtime.cuda.runtime()``; this module is opforge's one place
for CUDA graphs.
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any, cast

from ..errors import CudaError
from . import cuda
from .cuda import order_after as order_after  # noqa: F401  (the graph executor orders its arena's streams with it)

_P, _I, _U = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
_SIGNATURES = {
    "cudaStreamBeginCapture": [_P, _I], "cudaStreamEndCapture": [_P, ctypes.POINTER(_P)],
    "cudaStreamIsCapturing": [_P, ctypes.POINTER(_I)],
    "cudaGraphLaunch": [_P, _P], "cudaGraphDestroy": [_P], "cudaGraphExecDestroy": [_P],
    "cudaStreamCreateWithFlags": [ctypes.POINTER(_P), _U], "cudaRuntimeGetVersion": [ctypes.POINTER(_I)],
}
_H2D, _D2D = 1, 3  # cudaMemcpyKind
_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal
_NON_BLOCKING = 1  # cudaStreamNonBlocking
_CAPTURE_INVALIDATED = 2  # cudaStreamCaptureStatusInvalidated
#: cudaErrorStreamCapture* and cudaErrorCapturedEvent: the work cannot be captured, nothing is broken.
CAPTURE_ERRORS = frozenset(range(900, 909))

_lock = threading.Lock()  # one capture at a time in this process: the private streams are shared
_state: dict[str, Any] = {"lib": None, "streams": {}, "instantiate": None}


class CaptureUnsupported(CudaError):
    """The launches could not be recorded into a CUDA graph (run them eagerly)."""


def enabled() -> bool:
    """Whether graphs are captured: ``OPFORGE_CUDA_GRAPHS=0`` turns capture off."""
    return os.environ.get("OPFORGE_CUDA_GRAPHS", "1").strip() not in ("0", "false", "no", "off")


def _runtime() -> ctypes.CDLL:
    """The CUDA runtime with the graph calls' signatures set (once per loaded runtime)."""
    lib = cuda.runtime()
    if _state["lib"] is not lib:
        with _lock:
            if _state["lib"] is not lib:
                _configure(lib)
    return lib


def _configure(lib: ctypes.CDLL) -> None:
    try:
        for name, argtypes in _SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int
        version = ctypes.c_int(0)
        lib.cudaRuntimeGetVersion(ctypes.byref(version))
        # CUDA 12 gave cudaGraphInstantiate the (exec, graph, flags) signature; 11.4+ has it as ...WithFlags.
        instantiate = lib.cudaGraphInstantiate if version.value >= 12000 else lib.cudaGraphInstantiateWithFlags
    except AttributeError as error:
        raise CudaError(f"the CUDA runtime lacks a CUDA graph call ({error}); CUDA >= 11.4 is required") from None
    instantiate.argtypes, instantiate.restype = [ctypes.POINTER(_P), _P, ctypes.c_ulonglong], ctypes.c_int
    _state.update(lib=lib, streams={}, instantiate=instantiate)


def _check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        error_type = CaptureUnsupported if code in CAPTURE_ERRORS else CudaError
        lib.cudaGetLastError()  # a failed capture call must not be blamed on the next launch
        error = error_type(f"{what}: {lib.cudaGetErrorString(code).decode()} (cudaError {code})")
        error.code = code
        raise error


def _capture_stream(lib: ctypes.CDLL, device_id: int) -> int:
    """opforge's own stream for capturing on ``device_id`` (made once; never destroyed)."""
    stream: int | None = _state["streams"].get(device_id)
    if stream is None:
        handle = ctypes.c_void_p()
        with cuda.on_device(device_id):
            _check(lib, lib.cudaStreamCreateWithFlags(ctypes.byref(handle), _NON_BLOCKING), "cudaStreamCreateWithFlags")
        stream = _state["streams"][device_id] = cast(int, handle.value)  # non-NULL, as the create succeeded
    return stream


class CapturedGraph:
    """An instantiated CUDA graph (``cudaGraphExec_t``); destroyed by ``close`` or with the object
    (CUDA lets a graph still running finish first)."""

    __slots__ = ("handle", "_lib")

    handle: int | None
    _lib: ctypes.CDLL

    def __init__(self, lib: ctypes.CDLL, handle: int | None) -> None:
        self._lib, self.handle = lib, handle

    def launch(self, stream: int) -> None:
        """Replay the whole graph on ``stream``: one call, ordered after the stream's earlier work."""
        if not self.handle:
            raise CudaError("cudaGraphLaunch: the captured graph was closed")
        _check(self._lib, self._lib.cudaGraphLaunch(self.handle, stream), "cudaGraphLaunch")

    def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle:
            self._lib.cudaGraphExecDestroy(handle)

    __del__ = close


def is_invalidated(lib: ctypes.CDLL, stream: int) -> bool:
    """Whether the capture open on ``stream`` was invalidated (a call it could not record)."""
    status = ctypes.c_int(0)
    return lib.cudaStreamIsCapturing(stream, ctypes.byref(status)) == 0 and status.value == _CAPTURE_INVALIDATED


def capture(record: Callable[[int], object], device_id: int) -> CapturedGraph:
    """Capture what ``record(stream)`` enqueues on ``stream`` into an instantiated graph.

    ``record`` gets opforge's capture stream and must enqueue all its work
    there.  If it raises, the capture is ended and dropped, and the error
    goes on (as ``CaptureUnsupported`` when the capture was invalidated).
    """
    lib = _runtime()
    with _lock:
        stream = _capture_stream(lib, device_id)
        with cuda.on_device(device_id):
            _check(lib, lib.cudaStreamBeginCapture(stream, _THREAD_LOCAL), "cudaStreamBeginCapture")
            try:
                record(stream)
            except Exception as error:
                unsupported = is_invalidated(lib, stream) or getattr(error, "code", None) in CAPTURE_ERRORS
                _end(lib, stream, quiet=True)
                if unsupported and not isinstance(error, CaptureUnsupported):
                    raise CaptureUnsupported(f"the capture was invalidated: {error}") from error
                raise
            graph = _end(lib, stream)
            try:
                executable = ctypes.c_void_p()
                _check(lib, _state["instantiate"](ctypes.byref(executable), graph, 0), "cudaGraphInstantiate")
            finally:
                lib.cudaGraphDestroy(graph)  # the executable graph does not need it
    return CapturedGraph(lib, executable.value)


def _end(lib: ctypes.CDLL, stream: int, quiet: bool = False) -> int | None:
    graph = ctypes.c_void_p()
    code = lib.cudaStreamEndCapture(stream, ctypes.byref(graph))
    if quiet:
        lib.cudaGetLastError()
        if code == 0 and graph.value:
            lib.cudaGraphDestroy(graph.value)
        return None
    _check(lib, code, "cudaStreamEndCapture")
    return graph.value


def copy_async(destination: int, source: int, nbytes: int, stream: int, what: str, *, from_host: bool = False) -> None:
    """Copy ``nbytes`` device-to-device (``from_host``: host-to-device) on ``stream``."""
    if nbytes:
        lib = cuda.runtime()
        _check(lib, lib.cudaMemcpyAsync(destination, source, nbytes, _H2D if from_host else _D2D, stream),
               f"{what}: cudaMemcpyAsync")


