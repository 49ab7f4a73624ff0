"""Load kernel shared libraries and look up their entry points.

``load_library(path)`` dlopens a library once per file version (the cache is
keyed by real path and mtime) with ``RTLD_LOCAL | RTLD_NOW``: symbols of one
kernel library never leak into another, and unresolved symbols fail at load
time with the loader's message instead of crashing at the first call.

Looking a symbol up is one ``dlsym``; listing the exported names (``nm -D``)
only happens on the error path, to suggest what the user probably meant.
"""

from __future__ import annotations

import ctypes
import difflib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from ..errors import KernelSourceError, OpforgeError, SymbolNotFoundError
from . import parallel

__all__ = ["Library", "detect_cxx11_abi", "load_library"]

# "__cxx11": the std::__cxx11 namespace of new-ABI strings and lists;
# "B5cxx11": the abi tag on a C++ function that returns such a type.
_CXX11_MARKERS = (b"__cxx11", b"B5cxx11")
# The old (copy-on-write) std::string: class "Ss" in mangled names.
_OLD_ABI_MARKERS = (b"_ZNSs", b"_ZNKSs")
# nm symbol types of defined functions: text (global/local), weak, indirect.
_FUNCTION_TYPES = {"T", "t", "W", "i"}


def detect_cxx11_abi(path: str | os.PathLike[str]) -> bool:
    """True if the library was built with the new libstdc++ string ABI.

    Evidence, in order: mangled names containing ``__cxx11`` (the new ABI's
    string namespace) or the ``B5cxx11`` abi tag mean the new ABI; references
    to the old copy-on-write string (``_ZNSs``, ``_ZNKSs``: its ``_Rep``
    helpers are never fully inlined) mean ``_GLIBCXX_USE_CXX11_ABI=0``,
    MindSpore's default.  With neither, the library either uses no
    ``std::string`` at all or is new-ABI code that g++ -O3 inlined completely
    (as ``Attr<std::string>`` can be), so the answer is the new ABI.
    Libraries opforge builds itself carry their setting in
    ``BuiltLibrary.cxx11_abi`` instead.
    """
    data = Path(path).read_bytes()
    if any(marker in data for marker in _CXX11_MARKERS):
        return True
    return not any(marker in data for marker in _OLD_ABI_MARKERS)


class Library:
    """A loaded kernel library."""

    def __init__(self, path: Path, handle: ctypes.CDLL, cxx11_abi: bool):
        self.path = path
        self.cxx11_abi = cxx11_abi
        self.handle = handle  # the ctypes.CDLL; keeps the library mapped
        self._addresses: dict[str, int | None] = {}  # None: a symbol at address 0
        self._exported: list[str] | None = None

    def __repr__(self) -> str:
        return f"Library({str(self.path)!r}, cxx11_abi={self.cxx11_abi})"

    def address(self, name: str, required: bool = True) -> int | None:
        """The address of function ``name``, or None when absent and not ``required``.

        Raises :class:`SymbolNotFoundError` (with ``close_matches``) when a
        required symbol is missing.
        """
        found = self._addresses.get(name)
        if found is not None:
            return found
        try:
            pointer = self.handle[name]
        except AttributeError:
            if not required:
                return None
            raise self._missing(name) from None
        found = ctypes.cast(pointer, ctypes.c_void_p).value
        self._addresses[name] = found
        return found

    def exported_symbols(self) -> list[str]:
        """Names of the functions the library defines and exports (``nm -D``).

        Returns ``[]`` when ``nm`` is not available.
        """
        if self._exported is None:
            self._exported = _nm_functions(self.path)
        return list(self._exported)

    def _missing(self, name: str) -> SymbolNotFoundError:
        exported = self.exported_symbols()
        close = difflib.get_close_matches(name, exported, n=5, cutoff=0.5)
        message = f"symbol {name!r} not found in {self.path}"
        if close:
            message += f"; did you mean {', '.join(close)}?"
        mangled = [s for s in exported if s.startswith("_Z") and f"{len(name)}{name}" in s]
        if mangled:
            message += (f"; the library exports the C++ (mangled) name {mangled[0]!r}: "
                        f"declare the function extern \"C\"")
        elif not close and exported:
            shown = ", ".join(sorted(exported)[:20])
            more = "" if len(exported) <= 20 else f" (and {len(exported) - 20} more)"
            message += f"; it exports: {shown}{more}"
        return SymbolNotFoundError(message, symbol=name, library=str(self.path),
                                   close_matches=close)


def _nm_functions(path: Path) -> list[str]:
    nm = shutil.which("nm")
    if not nm:
        return []
    try:
        done = subprocess.run([nm, "-D", "--defined-only", str(path)], capture_output=True,
                              text=True, errors="replace", timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    names = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[-2] in _FUNCTION_TYPES:
            names.append(parts[-1].split("@", 1)[0])
    return sorted(set(names))


# --------------------------------------------------------------------------
# loading

_lock = threading.Lock()
_handles: dict[tuple[str, int], ctypes.CDLL] = {}
_libraries: dict[tuple[str, int, bool | None], Library] = {}
_loaded_paths: set[str] = set()


def _dlopen_mode() -> int:
    return getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_NOW", 2)


def _dlopen(real: str, fresh: bool) -> ctypes.CDLL:
    """dlopen ``real``; with ``fresh``, make sure the loader maps the current file.

    The dynamic loader returns the already-loaded object for a path string it
    has seen, even if the file was replaced since.  A replaced file has a new
    inode, so loading it through a private copy maps the new code.
    """
    mode = _dlopen_mode()
    if not fresh:
        return ctypes.CDLL(real, mode=mode)
    folder = tempfile.mkdtemp(prefix="opforge-reload-")
    copy = os.path.join(folder, os.path.basename(real))
    try:
        shutil.copy2(real, copy)
        return ctypes.CDLL(copy, mode=mode)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the mapping outlives the file


def load_library(path: str | os.PathLike[str], *, cxx11_abi: bool | None = None) -> Library:
    """Load the shared library at ``path`` (once per file version) and wrap it.

    ``cxx11_abi=None`` detects the string ABI from the file (see
    :func:`detect_cxx11_abi`).  Raises :class:`OpforgeError` with the loader's
    message when the library cannot be loaded.
    """
    real = os.path.realpath(os.fspath(path))
    try:
        stamp = os.stat(real).st_mtime_ns
    except FileNotFoundError:
        raise KernelSourceError(f"kernel library {path} does not exist") from None
    except OSError as exc:
        raise OpforgeError(f"cannot load kernel library {path}: {exc.strerror or exc}") from exc
    with _lock:
        handle = _handles.get((real, stamp))
        if handle is None:
            try:
                handle = _dlopen(real, fresh=real in _loaded_paths)
            except OSError as exc:
                raise OpforgeError(f"cannot load kernel library {real}: {exc}") from exc
            parallel.attach(handle)
            _handles[(real, stamp)] = handle
            _loaded_paths.add(real)
        key = (real, stamp, None if cxx11_abi is None else bool(cxx11_abi))
        library = _libraries.get(key)
        if library is None:
            abi = detect_cxx11_abi(real) if cxx11_abi is None else bool(cxx11_abi)
            library = _libraries[key] = Library(Path(real), handle, abi)
        return library
