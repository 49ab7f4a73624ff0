"""The few CUDA runtime calls opforge needs to run a GPU kernel on host arrays.

A GPU kernel called with NumPy arrays gets device copies of its inputs,
device outputs and workspaces, runs on the default stream, and its outputs
are copied back.  The CUDA runtime library is loaded on first use.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os

import numpy as np

from .. import _native
from ..errors import CudaError

_H2D, _D2H = 1, 2
_runtime = None


def _candidates():
    found = ctypes.util.find_library("cudart")
    if found:
        yield found
    for root in filter(None, [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]):
        yield from sorted(glob.glob(os.path.join(root, "lib64", "libcudart.so*")))
        yield from sorted(glob.glob(os.path.join(root, "targets", "*", "lib", "libcudart.so*")))
    yield "libcudart.so"


def runtime():
    """The loaded CUDA runtime; CudaError if it is missing or sees no device."""
    global _runtime
    if _runtime is None:
        errors = []
        for name in _candidates():
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as error:
                errors.append(str(error))
        else:
            raise CudaError("the CUDA runtime (libcudart) was not found; install the CUDA toolkit or set CUDA_HOME")
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        count = ctypes.c_int(0)
        if lib.cudaGetDeviceCount(ctypes.byref(count)) != 0 or count.value == 0:
            raise CudaError("no CUDA device is visible")
        _runtime = lib
    return _runtime


def device_count() -> int:
    try:
        runtime()
    except CudaError:
        return 0
    count = ctypes.c_int(0)
    _runtime.cudaGetDeviceCount(ctypes.byref(count))
    return count.value


def _check(code, what):
    if code != 0:
        raise CudaError(f"{what} failed: {_runtime.cudaGetErrorString(code).decode()} (cudaError {code})")


def run_on_device(kernel, op, arrays, out_specs, workspace, shapes, names, extra):
    from .dispatch import kernel_error

    lib = runtime()
    buffers = []

    def alloc(nbytes):
        pointer = ctypes.c_void_p()
        _check(lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(max(nbytes, 1))), "cudaMalloc")
        buffers.append(pointer)
        return pointer.value

    try:
        inputs = []
        for array in arrays:
            pointer = alloc(array.nbytes)
            _check(lib.cudaMemcpy(ctypes.c_void_p(pointer), ctypes.c_void_p(array.ctypes.data),
                                  ctypes.c_size_t(array.nbytes), _H2D), "cudaMemcpy to device")
            inputs.append(pointer)
        outputs = [np.empty(s.shape, s.dtype) for s in out_specs]
        out_pointers = [alloc(o.nbytes) for o in outputs]
        ws_pointers = [alloc(size) for size in workspace]
        rc, error = _native.call_kernel(kernel._function, inputs + out_pointers + ws_pointers, shapes, names,
                                        None, extra)
        if rc != 0 or error is not None:
            raise kernel_error(op, kernel, rc, error)
        _check(lib.cudaDeviceSynchronize(), f"op '{op.name}': kernel '{kernel.function_name}'")
        _check(lib.cudaGetLastError(), f"op '{op.name}': kernel '{kernel.function_name}' launch")
        for output, pointer in zip(outputs, out_pointers):
            _check(lib.cudaMemcpy(ctypes.c_void_p(output.ctypes.data), ctypes.c_void_p(pointer),
                                  ctypes.c_size_t(output.nbytes), _D2H), "cudaMemcpy to host")
        return outputs
    finally:
        for pointer in buffers:
            lib.cudaFree(pointer)
