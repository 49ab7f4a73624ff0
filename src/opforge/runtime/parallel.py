"""opforge's thread pool (csrc/parallel.cc), which built-in and user kernels share
through ``opforge/parallel.h``.

The pool's functions live in the ``_native`` extension.  Importing this module
loads that extension again into the global symbol scope (it exports nothing
else: its other symbols are hidden), so a kernel library loaded afterwards
finds them without linking anything.  Its size is ``OPFORGE_NUM_THREADS`` when
set, else the cores this process may run on; ``set_num_threads`` changes it,
and so the threads that multiply matmul's, gemm's and conv's products
(OpenBLAS itself runs on one thread, see ``runtime.blas``): one count for every
thread opforge starts.
"""
from __future__ import annotations

import ctypes
import os

from .. import _native
from ..errors import OpforgeError

_pool = ctypes.CDLL(_native.__file__, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
_pool.opforge_set_num_threads.argtypes = [ctypes.c_int]
_pool.opforge_set_num_threads.restype = None


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
