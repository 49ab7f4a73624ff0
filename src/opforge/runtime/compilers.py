"""Compilers and their command lines: which compiler a source needs, with which flags.

``plan(source, ...)`` decides everything about one build before the cache is
consulted: the compiler (``OPFORGE_CC``/``OPFORGE_CXX``/``OPFORGE_NVCC``, then
``CC``/``CXX``, then PATH), the flags (opforge's, the caller's, then
``OPFORGE_CFLAGS``/``OPFORGE_CXXFLAGS``/``OPFORGE_NVCC_FLAGS``) and the
include folders.  ``run_compiler`` runs it so that it dies with its parent:
a builder killed half-way leaves no compiler going on to link a library
into the cache entry (a linker already running may still finish; the next
build or load of the entry removes what it wrote).
"""
from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import BuildError, CompilerNotFoundError
from .cuda_arch import detect_cuda_archs, normalize_archs

__all__ = ["SOURCE_SUFFIXES", "Plan", "describe", "find_compiler", "include_dir", "is_source", "plan", "run_compiler"]

_LANGUAGE_BY_SUFFIX = {
    ".c": "c",
    ".cc": "c++",
    ".cpp": "c++",
    ".cxx": "c++",
    ".cu": "cuda",
}
SOURCE_SUFFIXES = tuple(_LANGUAGE_BY_SUFFIX)
_LANGUAGE_ALIASES = {
    "c": "c",
    "c++": "c++",
    "cxx": "c++",
    "cpp": "c++",
    "cuda": "cuda",
    "cu": "cuda",
}
# (opforge's own variable, generic variable or None, names searched on PATH)
_COMPILER_SEARCH = {
    "c": ("OPFORGE_CC", "CC", ("gcc", "cc")),
    "c++": ("OPFORGE_CXX", "CXX", ("g++", "c++")),
    "cuda": ("OPFORGE_NVCC", None, ("nvcc",)),
}
_FLAGS_ENV = {"c": "OPFORGE_CFLAGS", "c++": "OPFORGE_CXXFLAGS", "cuda": "OPFORGE_NVCC_FLAGS"}

_ABI_MACRO = "_GLIBCXX_USE_CXX11_ABI"


@functools.lru_cache(maxsize=None)
def include_dir() -> Path:
    """The folder holding opforge's ``custom_aot_extra.h``."""
    return Path(__file__).resolve().parent.parent / "include"


def is_source(path: str | os.PathLike[str]) -> bool:
    """True for a path whose suffix names a kernel source opforge compiles."""
    return Path(path).suffix.lower() in _LANGUAGE_BY_SUFFIX


def language_of(source: Path) -> str:
    return _LANGUAGE_BY_SUFFIX[source.suffix.lower()]


# --------------------------------------------------------------------------
# compilers


def _which(name: str) -> str | None:
    found = shutil.which(name)
    return os.path.abspath(found) if found else None


def _compiler_argv(language: str) -> list[str]:
    """The command prefix that runs the compiler (usually one word).

    An environment value may hold a launcher and a compiler ("ccache g++");
    its first word is resolved on PATH.
    """
    own_var, generic_var, names = _COMPILER_SEARCH[language]
    searched: list[str] = []
    for var in (own_var, generic_var):
        if not var:
            continue
        value = os.environ.get(var, "").strip()
        if not value:
            continue
        words = [value] if os.path.isfile(value) else shlex.split(value)
        resolved = _which(words[0]) if words else None
        if resolved:
            return [resolved, *words[1:]]
        if var == own_var:
            # An explicit opforge setting that is wrong is an error, not a hint.
            raise CompilerNotFoundError(
                f"{describe(language)} compiler {value!r} from ${var} was not found or is not "
                f"executable; set {var} to the compiler's path"
            )
        searched.append(f"${var}={value!r}")
    for name in names:
        resolved = _which(name)
        if resolved:
            return [resolved]
        searched.append(f"{name!r} on PATH")
    if language == "cuda":
        roots = []
        for var in ("CUDA_HOME", "CUDA_PATH"):
            if os.environ.get(var):
                roots.append((f"${var}/bin", os.environ[var]))
        roots.append(("/usr/local/cuda/bin", "/usr/local/cuda"))
        for label, root in roots:
            candidate = os.path.join(root, "bin", "nvcc")
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return [os.path.abspath(candidate)]
            searched.append(label)
    raise CompilerNotFoundError(
        f"no {describe(language)} compiler found (searched {', '.join(searched)}); "
        f"install one or set {own_var} to its path"
    )


def describe(language: str) -> str:
    return {"c": "C", "c++": "C++", "cuda": "CUDA"}[language]


def find_compiler(language: str) -> str:
    """Path of the compiler opforge uses for ``language`` ("c", "c++" or "cuda").

    Looks at ``OPFORGE_CC``/``OPFORGE_CXX``/``OPFORGE_NVCC``, then ``CC``/``CXX``,
    then gcc/g++/nvcc on PATH (and ``$CUDA_HOME/bin`` for nvcc).  Raises
    :class:`CompilerNotFoundError` naming what was searched and the variable to set.
    """
    key = _LANGUAGE_ALIASES.get(str(language).lower())
    if key is None:
        raise BuildError(f"unknown language {language!r}; expected 'c', 'c++' or 'cuda'")
    return _compiler_argv(key)[0]


def compiler_identity(argv: Sequence[str]) -> list[str]:
    """Identify the compiler from its file alone: a warm hit must not run it."""
    real = os.path.realpath(argv[0])
    try:
        st = os.stat(real)
        stamp = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        stamp = "?"
    return [real, stamp, *argv[1:]]


# --------------------------------------------------------------------------
# flags


def _env_words(var: str) -> list[str]:
    value = os.environ.get(var, "")
    return shlex.split(value) if value.strip() else []


def _env_include_dirs() -> list[str]:
    value = os.environ.get("OPFORGE_INCLUDE_DIRS", "")
    return [part for part in value.split(os.pathsep) if part.strip()]


def _user_abi_setting(flags: Sequence[str]) -> bool | None:
    """The last ``-D_GLIBCXX_USE_CXX11_ABI[=N]`` among ``flags``, if any."""
    setting = None
    for i, flag in enumerate(flags):
        if flag == "-D" and i + 1 < len(flags):
            macro = flags[i + 1]
        elif flag.startswith("-D"):
            macro = flag[2:]
        else:
            continue
        name, _, value = macro.partition("=")
        if name == _ABI_MACRO:
            setting = value.strip() not in ("0",) if value else True
    return setting


def _include_dirs_in(flags: Sequence[str]) -> list[str]:
    """Directories named by ``-I``/``-iquote`` in user flags, for the header scan."""
    dirs = []
    for i, flag in enumerate(flags):
        for opt in ("-I", "-iquote"):
            if flag == opt and i + 1 < len(flags):
                dirs.append(flags[i + 1])
            elif flag.startswith(opt) and len(flag) > len(opt):
                dirs.append(flag[len(opt):])
    return dirs


@dataclass
class Plan:
    """Everything about one build that is decided before looking at the cache."""

    source: Path
    language: str
    compiler: list[str]  # argv prefix
    flags: list[str]  # everything between the compiler and the source
    search_dirs: list[Path]  # the -I folders, in order, for the header scan
    cxx11_abi: bool

    def command(self, output: str | os.PathLike[str]) -> list[str]:
        return [*self.compiler, *self.flags, str(self.source), "-o", str(output)]


def _cuda_runtime_rpath(nvcc: str) -> list[str]:
    """Linker flags that let a kernel library find the toolkit's libcudart beside this nvcc."""
    root = Path(os.path.realpath(nvcc)).parent.parent
    for lib in (root / "lib64", root / "lib"):
        if any(lib.glob("libcudart.so*")):
            return ["-Xlinker", f"-rpath,{lib}"]
    return []


def gencode_flags(archs: Iterable[str]) -> list[str]:
    """nvcc's targets for ``archs`` (``sm_XX`` each): the machine code of each, and its PTX beside
    it, which the driver of a newer GPU than any of them compiles when the library loads."""
    flags = []
    for arch in archs:
        number = arch[len("sm_"):]
        flags += ["-gencode", f"arch=compute_{number},code=[sm_{number},compute_{number}]"]
    return flags


def plan(source: Path, *, extra_cflags: Iterable[str] | str,
         include_dirs: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
         compiler: str | os.PathLike[str] | None, cuda_arch: str | Iterable[str] | None, cxx11_abi: bool,
         optimization: str) -> Plan:
    language = language_of(source)
    if compiler:
        compiler = os.fspath(compiler)
        words = [compiler] if os.path.isfile(compiler) else shlex.split(compiler)
        resolved = _which(words[0]) if words else None
        if not resolved:
            raise CompilerNotFoundError(f"compiler {compiler!r} was not found or is not executable")
        argv = [resolved, *words[1:]]
    else:
        argv = _compiler_argv(language)

    if isinstance(extra_cflags, (str, bytes)):
        extra_cflags = shlex.split(os.fsdecode(extra_cflags))
    if isinstance(include_dirs, (str, bytes, os.PathLike)):
        include_dirs = [include_dirs]
    user_flags = [str(f) for f in extra_cflags] + _env_words(_FLAGS_ENV[language])
    user_abi = _user_abi_setting(user_flags)
    abi = bool(cxx11_abi) if user_abi is None else user_abi

    dirs = [source.parent, include_dir()]
    dirs += [Path(os.fsdecode(d)).expanduser().resolve() for d in include_dirs]
    dirs += [Path(d).expanduser().resolve() for d in _env_include_dirs()]
    includes = []
    for d in dirs:
        includes += ["-I", str(d)]

    abi_flag = [] if user_abi is not None else [f"-D{_ABI_MACRO}={int(abi)}"]
    if language == "c":
        base = ["-std=c11", "-shared", "-fPIC", optimization]
    elif language == "c++":
        base = ["-std=c++17", "-shared", "-fPIC", optimization, *abi_flag]
    else:
        # Every visible GPU's arch, in one order: the flags, and so the cache key, name the set.
        archs = normalize_archs(cuda_arch) if cuda_arch else detect_cuda_archs()
        # The shared CUDA runtime: a library with its own static copy keeps its own last-error state, where
        # opforge's launch check (cudaGetLastError through libcudart) could not see its failed launches.
        base = ["--shared", "-Xcompiler", "-fPIC", optimization, "--use_fast_math",
                "--expt-relaxed-constexpr", *abi_flag, "-cudart", "shared", *_cuda_runtime_rpath(argv[0]),
                *gencode_flags(archs)]
    flags = [f for f in base if f] + includes + user_flags
    search = dirs + [Path(d).expanduser().resolve() for d in _include_dirs_in(user_flags)]
    return Plan(source, language, argv, flags, search, abi)


# --------------------------------------------------------------------------
# running


# A fresh interpreter that asks Linux to SIGKILL it when its parent (the builder) dies, then becomes the
# compiler (exec keeps the request).  argv: the builder's pid, then the command.
_LAUNCH_FAILED = "opforge: cannot start the compiler: "
_LAUNCHER = f"""
import ctypes, os, sys
try:
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):  # the builder died before the request was made
    os._exit(137)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as error:
    print({_LAUNCH_FAILED!r} + str(error), flush=True)
    os._exit(127)
"""


def run_compiler(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a compiler command, its output and errors together in ``stdout``.

    The compiler dies with this process (SIGKILL included) on Linux; on any
    exception here (KeyboardInterrupt too) ``subprocess.run`` kills it.  The
    death signal is asked for by a fresh interpreter that then execs the
    compiler (``_LAUNCHER``, some 12 ms), not by a ``preexec_fn``: the callers'
    processes have threads (OpenBLAS's, torch's, JAX's), where Python code in
    a forked child may deadlock, and JAX warns of every such fork.
    """
    argv = list(command)
    if sys.platform.startswith("linux"):
        argv = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *argv]
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, text=True, errors="replace")
    except OSError as exc:
        raise CompilerNotFoundError(f"could not run the compiler {command[0]!r}: {exc}") from exc
    if done.returncode == 127 and done.stdout.startswith(_LAUNCH_FAILED):
        raise CompilerNotFoundError(f"could not run the compiler {command[0]!r}: "
                                    f"{done.stdout[len(_LAUNCH_FAILED):].strip()}")
    return done
