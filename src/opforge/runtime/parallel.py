"""opforge's thread pool (csrc/parallel.cc), which built-in and user kernels share
through ``opforge/parallel.h``.

The pool's functions live in the ``_native`` extension.  A kernel library built
with the header holds one pointer, ``opforge_parallel_api``, which ``attach``
sets to the pool's table when ``runtime.library`` loads it; a kernel links
nothing.  (``_native`` stays out of the global symbol scope: there, its C++
runtime and the template code it exports would come before the definitions of
libraries loaded later, torch's and JAX's among them.)  The pool's size is
``OPFORGE_NUM_THREADS`` when set, else the cores this process may run on;
``set_num_threads`` changes it, and so the threads that multiply matmul's,
gemm's and conv's products (OpenBLAS itself runs on one thread, see
``runtime.blas``): one count for every thread opforge starts.
"""
from __future__ import annotations

import ctypes
import os

from .. import _native
from ..errors import OpforgeError

_pool = ctypes.CDLL(_native.__file__)  # the loaded extension, in its own (local) scope
_pool.opforge_set_num_threads.argtypes = [ctypes.c_int]
_pool.opforge_set_num_threads.restype = None
_TABLE = ctypes.addressof(ctypes.c_char.in_dll(_pool, "opforge_parallel_table"))


def attach(library: ctypes.CDLL) -> None:
    """Give a kernel library built with ``opforge/parallel.h`` the pool (a library without the header is
    left as it is)."""
    try:
        pointer = ctypes.c_void_p.in_dll(library, "opforge_parallel_api")
    except ValueError:  # no such symbol
        return
    pointer.value = _TABLE


def _default() -> int:
    given = os.environ.get("OPFORGE_NUM_THREADS", "").strip()
    if given:
        try:
            return _checked(int(given), "OPFORGE_NUM_THREADS")
        except ValueError:
            raise OpforgeError(f"OPFORGE_NUM_THREADS must be a positive int, got {given!r}") from None
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def _checked(threads: object, what: str) -> int:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise OpforgeError(f"{what} must be a positive int, got {threads!r}")
    return threads


def set_num_threads(threads: int) -> None:
    """Use ``threads`` threads (the calling one included) in kernels that run in
    parallel, the products behind matmul, gemm and conv included; 1 runs them
    serially.  A kernel already running keeps its pool."""
    _pool.opforge_set_num_threads(_checked(threads, "opforge.set_num_threads"))


def get_num_threads() -> int:
    """The pool's size."""
    threads: int = _pool.opforge_parallel_threads()
    return threads


set_num_threads(_default())
