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

OpenBLAS runs on one thread: the parallelism is opforge's pool's.  matmul and
gemm cut a large product into blocks of columns (or rows) that the pool's
threads multiply (``OpforgeGemmParallel`` in ``opforge_blas.h``), and the
convolutions cut theirs into tasks, each calling OpenBLAS on the thread that
took it.  OpenBLAS's own threads would add to the pool's: after each product
they poll for work for about a tenth of a second, taking the core the pool's
next kernel needs (resnet50 at two threads: 111 ms with them, 63 ms
without).  ``OPFORGE_BLAS_THREADS`` (a non-negative integer; anything else is
ignored) gives OpenBLAS a count of its own when it loads (0: OpenBLAS's
default, one per core), and ``set_num_threads(n)`` here changes it; while it
is above one, matmul and gemm hand OpenBLAS each product whole.
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ..operator import Kernel

__all__ = ["available", "library_path", "load", "reject_reason", "requiring", "set_num_threads"]

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
                    given = os.environ.get("OPFORGE_BLAS_THREADS", "").strip()
                    threads = int(given) if given.isdigit() else 1
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


def available() -> bool:
    """Whether OpenBLAS is installed and loads."""
    return load() is not None


#: OpenBLAS cores whose sgemm adds each output element in the same order whatever block of rows and columns
#: it is given (its AVX-512 kernels); the Haswell kernels' edge tiles add in another order.
CUT_INVARIANT_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


def core_name() -> str | None:
    """The OpenBLAS kernel set in use, lower case (``haswell``, ``skylakex``: OPENBLAS_CORETYPE or the CPU's), or
    None without OpenBLAS."""
    handle = load()
    if handle is None:
        return None
    function = handle.scipy_openblas_get_corename
    function.restype = ctypes.c_char_p
    return bytes(function()).decode("ascii", "replace").strip().lower()


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
