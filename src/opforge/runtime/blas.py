"""OpenBLAS for the built-in linear ops (matmul, gemm, conv, conv_transpose).

OpenBLAS comes from the optional ``scipy-openblas32`` wheel (``pip install
"opforge[blas]"``), whose library exports the CBLAS functions with a
``scipy_`` prefix (``scipy_cblas_sgemm``, 32-bit integers).  Kernel sources
declare the few they call in ``opforge_blas.h`` and link no library: their
undefined symbols resolve, when the kernel library is loaded, from OpenBLAS
loaded here once with ``RTLD_GLOBAL``.  So the kernels build anywhere (also
ahead of time, into a wheel), and dispatch selects them only where OpenBLAS is
installed: each carries ``requires=blas.reject_reason`` (see
``Kernel.requires``), which loads OpenBLAS on first use.  Without it those
ops run their NumPy reference, which is BLAS-backed too.

OpenBLAS runs on as many threads as opforge's pool (``opforge.set_num_threads``,
``OPFORGE_NUM_THREADS``): one knob for both, so the two never add up to more
threads than the pool was given.  They never run at once: matmul and gemm
hold the calling thread while OpenBLAS works, and the pool's workers sleep;
the convolutions cut their products into blocks for the pool instead and
hold OpenBLAS at one thread meanwhile (each block's gemm runs on the thread
that took it), giving OpenBLAS its count back as they return.
``OPFORGE_BLAS_THREADS`` gives OpenBLAS a count of its own when it loads (0:
OpenBLAS's default, one per core), and ``set_num_threads(n)`` here changes
OpenBLAS alone, until the next ``opforge.set_num_threads``.  On a machine
whose cores are busy, one thread (``opforge.set_num_threads(1)``) suits small
products best: each multi-threaded product waits for its threads to be
scheduled (about a scheduler tick, 4 ms, per call was measured with 2 cores
shared).
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ..operator import Kernel

__all__ = ["available", "follow_pool", "library_path", "load", "reject_reason", "requiring", "set_num_threads"]

_K = TypeVar("_K", bound="Kernel | list[Kernel]")

_lock = threading.Lock()
_handle: ctypes.CDLL | None = None
_error: str | None = None  # why loading failed, once it did


def library_path() -> Path | None:
    """The OpenBLAS shared library of the scipy-openblas32 wheel, or None without the wheel."""
    try:
        import scipy_openblas32
    except ImportError:
        return None
    lib_dir = Path(scipy_openblas32.get_lib_dir())
    path = lib_dir / f"lib{scipy_openblas32.get_library()}.so"
    if not path.exists():  # another suffix (a versioned .so, .dylib)
        path = next(iter(sorted(lib_dir.glob(f"lib{scipy_openblas32.get_library()}.*"))), path)
    return path if path.exists() else None


def load() -> ctypes.CDLL | None:
    """Load OpenBLAS once, globally (its symbols then resolve in kernel libraries
    loaded after it); the ctypes handle, or None when it is not installed or does not load."""
    global _handle, _error
    if _handle is not None or _error is not None:
        return _handle
    with _lock:
        if _handle is None and _error is None:
            path = library_path()
            if path is None:
                _error = "OpenBLAS is not installed (pip install scipy-openblas32, or opforge[blas])"
            else:
                try:
                    handle = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
                except OSError as error:
                    _error = f"OpenBLAS at {path} does not load: {error}"
                else:
                    threads: str | int
                    threads = os.environ.get("OPFORGE_BLAS_THREADS", "").strip()
                    if threads.isdigit():
                        threads = int(threads)
                    else:
                        from .parallel import get_num_threads
                        threads = get_num_threads()
                    if threads > 0:
                        handle.scipy_openblas_set_num_threads(threads)
                    _handle = handle
    return _handle


def set_num_threads(n: int) -> None:
    """How many threads OpenBLAS's gemm uses (loads OpenBLAS; nothing happens without it)."""
    from ..errors import OpforgeError

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OpforgeError(f"set_num_threads takes a positive int, got {n!r}")
    handle = load()
    if handle is not None:
        handle.scipy_openblas_set_num_threads(n)


def follow_pool(n: int) -> None:
    """opforge.set_num_threads's share: OpenBLAS takes the pool's new size now
    if it is loaded (else it reads the size when it loads)."""
    if _handle is not None:
        _handle.scipy_openblas_set_num_threads(n)


def available() -> bool:
    """Whether OpenBLAS is installed and loads."""
    return load() is not None


def reject_reason() -> str | None:
    """A kernel's ``requires``: None once OpenBLAS is loaded, else why it is not."""
    if available():
        return None
    return _error or "OpenBLAS is not available"


def requiring(kernels: _K) -> _K:
    """Mark ``op.kernel(...)``'s result (a kernel or a list) as needing OpenBLAS; returns it."""
    for kernel in kernels if isinstance(kernels, list) else [kernels]:
        kernel.requires = reject_reason
    return kernels
