"""The C++ path of opforge's torch ops (``fast_call.cc``), built once per torch.

The library is compiled against the installed torch's headers with opforge's
own build cache (about ten seconds, once per torch version and machine), and
loaded with ``ctypes.PyDLL``.  When it cannot be built -- no C++ compiler, a
torch without headers -- every call takes the Python path, which computes
the same results more slowly; ``reason()`` says why.
``OPFORGE_TORCH_FAST=0`` turns the C++ path off.
"""
from __future__ import annotations

import ctypes
import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .. import _native
from ..errors import OpforgeError
from ..runtime.build import build

_lock = threading.Lock()
_library: ctypes.PyDLL | None = None
_reason: str | None = None
_tried = False


def _flags() -> list[str]:
    root = Path(torch.__file__).parent
    lib = root / "lib"
    return [
        "-std=c++20", "-w",  # torch's headers are C++20 in places, and not warning-free
        "-isystem", str(root / "include"), "-isystem", sysconfig.get_paths()["include"],
        f"-DOPFORGE_TORCH_VERSION=\"{torch.__version__}\"",  # a new torch gives a new cache entry
        f"-L{lib}", f"-Wl,-rpath,{lib}", "-Wl,--no-as-needed", "-ltorch", "-ltorch_cpu", "-lc10",
    ]


def library() -> ctypes.PyDLL | None:
    """The loaded C++ path, or None (see ``reason()``)."""
    global _library, _reason, _tried
    if _tried:
        return _library
    with _lock:
        if _tried:
            return _library
        _tried = True
        if os.environ.get("OPFORGE_TORCH_FAST", "1") == "0":
            _reason = "OPFORGE_TORCH_FAST=0"
            return None
        try:
            built = build(Path(__file__).with_name("fast_call.cc"), extra_cflags=_flags(),
                          cxx11_abi=bool(torch.compiled_with_cxx11_abi()))
            handle = ctypes.PyDLL(str(built.path))
        except (OpforgeError, OSError) as error:
            _reason = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            print(f"opforge.torch: calls take the Python path ({_reason})", file=sys.stderr)
            return None
        handle.opforge_torch_bind.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.py_object]
        handle.opforge_torch_bind.restype = ctypes.c_void_p
        handle.opforge_torch_clear.argtypes = handle.opforge_torch_unbind.argtypes = [ctypes.c_void_p]
        handle.opforge_torch_clear.restype = handle.opforge_torch_unbind.restype = None
        _library = handle
        return _library


def reason() -> str | None:
    """Why the C++ path is not in use (None when it is)."""
    library()
    return _reason


def take_attr_error_address() -> int | None:
    """Address of ``_native``'s ``opforge_take_attr_error``, which the C++ path calls around kernels."""
    return ctypes.cast(ctypes.CDLL(_native.__file__).opforge_take_attr_error, ctypes.c_void_p).value


def current_stream_address() -> int:
    """Address of libtorch_cuda's ``aoti_torch_get_current_cuda_stream(device, &stream)``; 0 without it
    (the C++ path then leaves CUDA calls to Python, which asks torch.cuda.current_stream)."""
    path = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    try:
        function = ctypes.CDLL(str(path), mode=os.RTLD_NOLOAD | os.RTLD_LAZY).aoti_torch_get_current_cuda_stream
    except (OSError, AttributeError):
        return 0
    return ctypes.cast(function, ctypes.c_void_p).value or 0


class FastPath:
    """The C++ kernels of one torch op; ``clear()`` drops their plans (with the op's own)."""

    def __init__(self, namespace: str, name: str, python_name: str, planner: Callable[..., Any]) -> None:
        # a FastPath is made only once library() has loaded
        self.handle: int | None = library().opforge_torch_bind(  # type: ignore[union-attr]
            namespace.encode(), name.encode(), python_name.encode(), planner)

    def clear(self) -> None:
        if self.handle:
            library().opforge_torch_clear(self.handle)  # type: ignore[union-attr]  # loaded: see __init__

    def remove(self) -> None:
        if self.handle:
            library().opforge_torch_unbind(self.handle)  # type: ignore[union-attr]  # loaded: see __init__
            self.handle = None
