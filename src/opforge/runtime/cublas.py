"""cuBLAS for the built-in GPU matmul (``builtins/matmul.cu``).

The kernel loads cuBLAS itself, at run time (``include/opforge_cublas.h``):
``$OPFORGE_CUBLAS``, else ``libcublas.so.13``, ``.12``, ``libcublas.so`` by
name, so it builds with a CUDA toolkit that has no cuBLAS and needs no link
flags.  Names are found on the loader's path (the CUDA toolkit's, a
framework that already loaded cuBLAS) -- but not inside NVIDIA's pip wheels
(``nvidia-cublas-cu12`` and the like, which PyTorch's CUDA builds install),
whose folders are on no search path.  :func:`preload` finds a wheel's
library and loads it first; the kernel's dlopen by soname then gets that copy
(the loader matches a name against the sonames of the libraries it holds).
It is loaded ``RTLD_LOCAL``: in the global scope its dependencies would come
before the definitions of every library loaded later.

The kernel declares :func:`prepare` as its ``requires``: it never turns the
kernel down, so a missing cuBLAS is reported by the kernel as a
``KernelError`` that says what was searched, not as a kernel that dispatch
silently skipped.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading

__all__ = ["preload", "prepare", "wheel_library"]

#: Folders of NVIDIA's wheels that hold libcublas, relative to a site-packages folder.
WHEEL_FOLDERS = ("nvidia/cublas/lib", "nvidia/cu13/lib", "nvidia/cu12/lib")

_lock = threading.Lock()
_done = False
_handle: ctypes.CDLL | None = None


def wheel_library() -> str | None:
    """The path of libcublas in an installed NVIDIA wheel (newest soname first), or None."""
    for entry in sys.path:
        for folder in WHEEL_FOLDERS:
            found = sorted(glob.glob(os.path.join(entry or ".", folder, "libcublas.so*")), reverse=True)
            if found:
                return found[0]
    return None


def preload() -> ctypes.CDLL | None:
    """Load a wheel's cuBLAS, once; the ctypes handle, or None (none found, or it does not load)."""
    global _done, _handle
    if _done:
        return _handle
    with _lock:
        if not _done:
            path = None if os.environ.get("OPFORGE_CUBLAS") else wheel_library()
            if path is not None:
                try:
                    _handle = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
                except OSError:
                    _handle = None  # the kernel's own search reports what is missing
            _done = True
    return _handle


def prepare() -> None:
    """``Kernel.requires`` of the GPU matmul: preload a wheel's cuBLAS; never a reason to skip the kernel."""
    preload()
    return None
