"""Compile kernel sources into shared libraries, with an on-disk cache.

``build(source)`` turns a ``.c``/``.cc``/``.cpp``/``.cxx``/``.cu`` file into a
shared library under :func:`cache_dir` and returns a :class:`BuiltLibrary`.

The cache is keyed by everything that decides the compiler's output and can be
known without running anything: the source bytes, the bytes of every local
header it pulls in (recursively; ``#include "..."``, and ``<...>`` found in
the ``-I`` folders -- system headers are not read), the full flag list,
the compiler binary's identity (real path, size, mtime) and ``ABI_VERSION``.
So editing a source or one of its headers, changing flags or upgrading the
compiler gives a new entry, and a warm hit costs a few file reads and one
sha256 -- it never spawns a process.

Layout of one entry::

    <cache_dir>/<stem>-<key[:16]>.lock      flock()ed around check + build
    <cache_dir>/<stem>-<key[:16]>/<name>.so  e.g. add.cc.so, as MindSpore names it
    <cache_dir>/<stem>-<key[:16]>/manifest.json

The manifest is written last and is the commit marker: an entry counts only
if its manifest parses, names the same key, and the library's size and sha256
match it.  Anything else (a build killed half-way, a truncated file, garbage)
is rebuilt.  Files are compiled under temporary names and moved into place
with ``os.replace``, so a final name never holds a partial file, and a
library another process has already loaded keeps its (old) inode.

Locks are OS file locks (``flock``), which the kernel drops when the holder
dies: a build killed with SIGKILL never leaves a lock that hangs the next run.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ..errors import CompileError, CompilerNotFoundError

__all__ = [
    "ABI_VERSION",
    "BuiltLibrary",
    "build",
    "cache_dir",
    "cache_info",
    "clear_cache",
    "detect_cuda_arch",
    "find_compiler",
    "include_dir",
    "is_source",
]

log = logging.getLogger("opforge.build")

#: Bump when the cache layout or the way flags are formed changes: every old
#: entry then misses and is rebuilt.
ABI_VERSION = 1

DEFAULT_CUDA_ARCH = "sm_80"

_LANGUAGE_BY_SUFFIX = {
    ".c": "c",
    ".cc": "c++",
    ".cpp": "c++",
    ".cxx": "c++",
    ".cu": "cuda",
}
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

_MANIFEST = "manifest.json"
_TMP_PREFIX = ".tmp-"
_ABI_MACRO = "_GLIBCXX_USE_CXX11_ABI"
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*(?:"([^"\r\n]+)"|<([^>\r\n]+)>)', re.MULTILINE)


@dataclass(frozen=True)
class BuiltLibrary:
    """A compiled kernel library in the cache."""

    path: Path  # the cached shared library
    source: Path | None  # the source it was built from
    cxx11_abi: bool  # the libstdc++ string ABI the library was built with
    from_cache: bool  # True when no compiler ran


# --------------------------------------------------------------------------
# small public helpers


@functools.lru_cache(maxsize=None)
def include_dir() -> Path:
    """The folder holding opforge's ``custom_aot_extra.h``."""
    return Path(__file__).resolve().parent.parent / "include"


def is_source(path) -> bool:
    """True for a path whose suffix names a kernel source opforge compiles."""
    return Path(path).suffix.lower() in _LANGUAGE_BY_SUFFIX


def cache_dir() -> Path:
    """``$OPFORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/opforge``, else ``~/.cache/opforge``.

    The folder is not created here; :func:`build` creates it on demand.
    """
    explicit = os.environ.get("OPFORGE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "opforge"
    return Path.home() / ".cache" / "opforge"


def _language_of(source: Path) -> str:
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
                f"{_describe(language)} compiler {value!r} from ${var} was not found or is not "
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
        f"no {_describe(language)} compiler found (searched {', '.join(searched)}); "
        f"install one or set {own_var} to its path"
    )


def _describe(language: str) -> str:
    return {"c": "C", "c++": "C++", "cuda": "CUDA"}[language]


def find_compiler(language: str) -> str:
    """Path of the compiler opforge uses for ``language`` ("c", "c++" or "cuda").

    Looks at ``OPFORGE_CC``/``OPFORGE_CXX``/``OPFORGE_NVCC``, then ``CC``/``CXX``,
    then gcc/g++/nvcc on PATH (and ``$CUDA_HOME/bin`` for nvcc).  Raises
    :class:`CompilerNotFoundError` naming what was searched and the variable to set.
    """
    key = _LANGUAGE_ALIASES.get(str(language).lower())
    if key is None:
        raise ValueError(f"unknown language {language!r}; expected 'c', 'c++' or 'cuda'")
    return _compiler_argv(key)[0]


def _compiler_identity(argv: Sequence[str]) -> list[str]:
    """Identify the compiler from its file alone: a warm hit must not run it."""
    real = os.path.realpath(argv[0])
    try:
        st = os.stat(real)
        stamp = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        stamp = "?"
    return [real, stamp, *argv[1:]]


# --------------------------------------------------------------------------
# CUDA architecture


def _normalize_arch(arch) -> str:
    """"sm_90", "90", "9.0", "compute_90", "sm_90a" -> "sm_90" / "sm_90a"."""
    text = str(arch).strip().lower()
    for prefix in ("sm_", "compute_", "sm", "compute"):
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    if re.fullmatch(r"\d+\.\d+", text):
        major, minor = text.split(".")
        text = f"{major}{minor}"
    if not re.fullmatch(r"\d{2,3}[a-z]?", text):
        raise ValueError(f"cannot read CUDA architecture {arch!r}; use a form like 'sm_90' or '9.0'")
    return f"sm_{text}"


_arch_memo: dict[str, str] = {}


def detect_cuda_arch() -> str:
    """The ``sm_XX`` of the visible GPU, else ``"sm_80"``; ``$OPFORGE_CUDA_ARCH`` wins.

    Asks ``nvidia-smi --query-gpu=compute_cap``, else the CUDA driver/runtime
    library.  The answer is remembered on disk, keyed by the driver's view of
    the GPUs in ``/proc/driver/nvidia``, so a warm build of a ``.cu`` source
    in a fresh process spawns nothing.  Without an NVIDIA driver no probe runs.
    """
    override = os.environ.get("OPFORGE_CUDA_ARCH", "").strip()
    if override:
        return _normalize_arch(override)
    fingerprint = _gpu_fingerprint()
    if fingerprint is None:
        return DEFAULT_CUDA_ARCH
    if fingerprint in _arch_memo:
        return _arch_memo[fingerprint]
    memo_file = cache_dir() / ".cuda-arch.json"
    try:
        stored = json.loads(memo_file.read_text())
        if isinstance(stored, dict) and isinstance(stored.get(fingerprint), str):
            arch = _normalize_arch(stored[fingerprint])
            _arch_memo[fingerprint] = arch
            return arch
    except (OSError, ValueError):
        pass
    arch = _probe_cuda_arch()
    found = arch is not None
    arch = arch or DEFAULT_CUDA_ARCH
    _arch_memo[fingerprint] = arch
    if found:
        with contextlib.suppress(OSError):
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(memo_file, json.dumps({fingerprint: arch}).encode())
    return arch


def _gpu_fingerprint() -> str | None:
    """A digest of what the NVIDIA driver reports, or None when there is no driver."""
    proc = Path("/proc/driver/nvidia")
    parts = [os.environ.get("CUDA_VISIBLE_DEVICES", "<all>"), os.environ.get("CUDA_DEVICE_ORDER", "")]
    if proc.is_dir():
        with contextlib.suppress(OSError):
            parts.append((proc / "version").read_text())
        with contextlib.suppress(OSError):
            for gpu in sorted((proc / "gpus").iterdir()):
                parts.append(gpu.name)
                with contextlib.suppress(OSError):
                    parts.append((gpu / "information").read_text())
    elif sys.platform.startswith("linux") or not shutil.which("nvidia-smi"):
        # Linux without the driver's /proc entries has no usable NVIDIA GPU.
        return None
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _first_visible_index() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def _probe_cuda_arch() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run(
                [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=15,
            )
            caps = [line.strip() for line in done.stdout.splitlines() if line.strip()]
            if done.returncode == 0 and caps:
                index = _first_visible_index()
                return _normalize_arch(caps[index if index < len(caps) else 0])
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            log.debug("nvidia-smi could not report the compute capability: %s", exc)
    return _probe_cuda_arch_ctypes()


def _probe_cuda_arch_ctypes() -> str | None:
    import ctypes

    major, minor = ctypes.c_int(), ctypes.c_int()
    with contextlib.suppress(OSError, AttributeError):
        cuda = ctypes.CDLL("libcuda.so.1")
        device = ctypes.c_int()
        if (cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
                and cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device) == 0
                and cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device) == 0):
            return f"sm_{major.value}{minor.value}"
    candidates = ["libcudart.so"]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "lib64", "libcudart.so"))
    candidates.append("/usr/local/cuda/lib64/libcudart.so")
    for name in candidates:
        with contextlib.suppress(OSError, AttributeError):
            cudart = ctypes.CDLL(name)
            if (cudart.cudaDeviceGetAttribute(ctypes.byref(major), 75, 0) == 0
                    and cudart.cudaDeviceGetAttribute(ctypes.byref(minor), 76, 0) == 0):
                return f"sm_{major.value}{minor.value}"
    return None


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
class _Plan:
    """Everything about one build that is decided before looking at the cache."""

    source: Path
    language: str
    compiler: list[str]  # argv prefix
    flags: list[str]  # everything between the compiler and the source
    search_dirs: list[Path]  # the -I folders, in order, for the header scan
    cxx11_abi: bool

    def command(self, output: str | os.PathLike) -> list[str]:
        return [*self.compiler, *self.flags, str(self.source), "-o", str(output)]


def _plan(source: Path, *, extra_cflags, include_dirs, compiler, cuda_arch,
          cxx11_abi, optimization) -> _Plan:
    language = _language_of(source)
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
        arch = _normalize_arch(cuda_arch) if cuda_arch else detect_cuda_arch()
        number = arch[len("sm_"):]
        base = ["--shared", "-Xcompiler", "-fPIC", optimization, "--use_fast_math",
                "--expt-relaxed-constexpr", *abi_flag,
                "-gencode", f"arch=compute_{number},code=sm_{number}"]
    flags = [f for f in base if f] + includes + user_flags
    search = dirs + [Path(d).expanduser().resolve() for d in _include_dirs_in(user_flags)]
    return _Plan(source, language, argv, flags, search, abi)


# --------------------------------------------------------------------------
# cache key


def _local_headers(source: Path, data: bytes, search_dirs: Sequence[Path]) -> Iterator[tuple[Path, bytes]]:
    """Every header reachable from ``source`` through the ``-I`` folders, once each.

    ``#include "x"`` is looked up next to the including file, then in the
    ``-I`` folders, as the compiler does; ``#include <x>`` in the ``-I``
    folders only (a user's copy of ``custom_aot_extra.h`` may be included
    either way).  System headers, and headers that cannot be found, are left
    out: the compiler's identity covers the former and will report the latter.
    Includes inside ``#if`` blocks are followed too, which can only cause a
    spurious rebuild.
    """
    seen: set[Path] = set()
    stack = [(source, data)]
    while stack:
        current, text = stack.pop()
        for match in _INCLUDE.finditer(text):
            quoted, angled = match.groups()
            name = os.fsdecode(quoted or angled)
            folders = (current.parent, *search_dirs) if quoted else search_dirs
            for folder in folders:
                candidate = folder / name
                try:
                    content = candidate.read_bytes()
                except OSError:
                    continue
                resolved = Path(os.path.normpath(candidate))
                if resolved not in seen:
                    seen.add(resolved)
                    yield resolved, content
                    stack.append((resolved, content))
                break


def _cache_key(plan: _Plan, source_bytes: bytes) -> str:
    digest = hashlib.sha256()

    def feed(item) -> None:
        raw = item if isinstance(item, bytes) else str(item).encode("utf-8", "surrogateescape")
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)

    feed(f"opforge-build abi={ABI_VERSION}")
    feed(plan.language)
    for part in _compiler_identity(plan.compiler):
        feed(part)
    feed(f"flags:{len(plan.flags)}")
    for flag in plan.flags:
        feed(flag)
    feed(str(plan.source))
    feed(source_bytes)
    for header, content in _local_headers(plan.source, source_bytes, plan.search_dirs):
        feed(str(header))
        feed(content)
    return digest.hexdigest()


# --------------------------------------------------------------------------
# locking


@contextlib.contextmanager
def _file_lock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive OS lock on ``path``; yields False if not blocking and busy.

    After acquiring, checks the lock file is still the one at ``path``
    (``clear_cache`` may have unlinked it meanwhile) and retries if not, so
    two processes can never both believe they hold the lock.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _lock_fd(fd, blocking):
                os.close(fd)
                yield False
                return
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)
    try:
        yield True
    finally:
        os.close(fd)  # closing drops the lock


if os.name == "nt":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _lock_fd(fd: int, blocking: bool) -> bool:
        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                return True
            except OSError:
                if not blocking:
                    return False
                time.sleep(0.05)
else:
    import fcntl

    def _lock_fd(fd: int, blocking: bool) -> bool:
        flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
            return True
        except BlockingIOError:
            return False


# --------------------------------------------------------------------------
# entries


def _entry_dir(source: Path, key: str) -> Path:
    return cache_dir() / f"{source.stem}-{key[:16]}"


def _lock_path(entry: Path) -> Path:
    return entry.with_name(entry.name + ".lock")


def _sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _read_valid_manifest(entry: Path, library: Path, key: str) -> dict | None:
    """The entry's manifest if the entry is complete and intact, else None."""
    manifest_path = entry / _MANIFEST
    try:
        manifest = json.loads(manifest_path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.debug("cache entry %s: unreadable manifest (%s); rebuilding", entry, exc)
        return None
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        log.debug("cache entry %s: manifest does not match the key; rebuilding", entry)
        return None
    try:
        size = os.stat(library).st_size
        if size != manifest.get("size"):
            log.debug("cache entry %s: library size %s != %s; rebuilding", entry, size, manifest.get("size"))
            return None
        sha, _ = _sha256_file(library)
    except OSError as exc:
        log.debug("cache entry %s: library unreadable (%s); rebuilding", entry, exc)
        return None
    if sha != manifest.get("sha256"):
        log.debug("cache entry %s: library checksum mismatch; rebuilding", entry)
        return None
    return manifest


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TMP_PREFIX, suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _remove_stale_temporaries(entry: Path) -> None:
    """Drop temporaries left by a build that died; callers hold the entry lock."""
    with contextlib.suppress(OSError):
        for child in entry.iterdir():
            if child.name.startswith(_TMP_PREFIX):
                with contextlib.suppress(OSError):
                    child.unlink()


def _verbose(flag: bool) -> bool:
    return flag or os.environ.get("OPFORGE_VERBOSE", "").strip().lower() in ("1", "true", "yes", "on")


def _compile(plan: _Plan, entry: Path, library: Path, key: str, verbose: bool) -> None:
    entry.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(entry)
    fd, tmp_name = tempfile.mkstemp(dir=entry, prefix=_TMP_PREFIX, suffix=".so")
    os.close(fd)
    tmp = Path(tmp_name)
    command = plan.command(tmp)
    shown = shlex.join(plan.command(library))
    if verbose:
        print(f"opforge: {shown}", file=sys.stderr, flush=True)
    try:
        try:
            done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, text=True, errors="replace")
        except OSError as exc:
            raise CompilerNotFoundError(f"could not run the compiler {command[0]!r}: {exc}") from exc
        output = done.stdout or ""
        if done.returncode != 0:
            raise CompileError(
                f"failed to compile {plan.source} ({_describe(plan.language)}, "
                f"{os.path.basename(plan.compiler[0])} exited with status {done.returncode})\n"
                f"command: {shown}\n{output.rstrip()}",
                command=plan.command(library),
                output=output,
            )
        if verbose and output.strip():
            print(output.rstrip(), file=sys.stderr, flush=True)
        os.chmod(tmp, 0o755)
        sha, size = _sha256_file(tmp)
        manifest = {
            "key": key,
            "abi_version": ABI_VERSION,
            "source": str(plan.source),
            "command": plan.command(library),
            "sha256": sha,
            "size": size,
            "cxx11_abi": plan.cxx11_abi,
            "created": time.time(),
        }
        # The library first, the manifest last: the manifest commits the entry.
        os.replace(tmp, library)
        _atomic_write(entry / _MANIFEST, json.dumps(manifest, indent=1).encode())
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if not (entry / _MANIFEST).exists():
            with contextlib.suppress(OSError):
                entry.rmdir()  # a failed first build leaves no empty entry behind


def build(source, *, extra_cflags: Iterable[str] | str = (), include_dirs: Iterable = (),
          compiler: str | None = None, cuda_arch: str | None = None, cxx11_abi: bool = False,
          optimization: str = "-O3", verbose: bool = False, force: bool = False) -> BuiltLibrary:
    """Compile ``source`` into the cache (or find it there) and return the library.

    ``extra_cflags`` are appended after opforge's flags (a string is split like
    a shell would); ``$OPFORGE_CFLAGS``/``$OPFORGE_CXXFLAGS``/``$OPFORGE_NVCC_FLAGS``
    are appended after those.  A ``-D_GLIBCXX_USE_CXX11_ABI=N`` among them
    overrides ``cxx11_abi``.  ``force=True`` rebuilds even when the entry looks
    valid (for example after the dynamic loader rejected it).

    Raises :class:`CompileError` when the compiler fails,
    :class:`CompilerNotFoundError` when there is none, ``ValueError`` for a
    path that is not a kernel source (load it as a prebuilt library instead).
    """
    source = Path(source)
    if not is_source(source):
        raise ValueError(
            f"{source} is not a kernel source (expected one of "
            f"{' '.join(sorted(_LANGUAGE_BY_SUFFIX))}); load it as a prebuilt library"
        )
    source = Path(os.path.realpath(os.path.expanduser(source)))
    try:
        source_bytes = source.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"kernel source {source} does not exist") from None
    verbose = _verbose(verbose)
    plan = _plan(source, extra_cflags=extra_cflags, include_dirs=include_dirs, compiler=compiler,
                 cuda_arch=cuda_arch, cxx11_abi=cxx11_abi, optimization=optimization)
    key = _cache_key(plan, source_bytes)
    entry = _entry_dir(source, key)
    library = entry / f"{source.name}.so"

    def cached(manifest: dict) -> BuiltLibrary:
        if verbose:
            print(f"opforge: using cached {library}", file=sys.stderr, flush=True)
        return BuiltLibrary(library, source, bool(manifest.get("cxx11_abi", plan.cxx11_abi)), True)

    # Optimistic check without the lock: entries are only ever swapped in whole
    # (os.replace), so a reader sees either a complete entry or a mismatch.
    if not force:
        manifest = _read_valid_manifest(entry, library, key)
        if manifest is not None:
            return cached(manifest)

    entry.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(_lock_path(entry)):
        if not force:
            # Another process may have built it while we waited for the lock.
            manifest = _read_valid_manifest(entry, library, key)
            if manifest is not None:
                return cached(manifest)
        _compile(plan, entry, library, key, verbose)
    return BuiltLibrary(library, source, plan.cxx11_abi, False)


# --------------------------------------------------------------------------
# cache maintenance


def _entries(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def cache_info() -> dict:
    """``{"path": str, "entries": int, "bytes": int}`` for the cache folder."""
    root = cache_dir()
    total = 0
    if root.is_dir():
        for folder, _, files in os.walk(root):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(folder, name)).st_size
    return {"path": str(root), "entries": len(_entries(root)), "bytes": total}


def clear_cache() -> int:
    """Remove every cache entry and return how many were removed.

    Each entry is removed under its lock, taken without waiting: an entry
    another process is building right now is left alone, so clearing never
    pulls files from under a running build.  A library already loaded by
    some process stays usable there (its mapping keeps the inode alive).
    """
    root = cache_dir()
    removed = 0
    for entry in _entries(root):
        lock = _lock_path(entry)
        with _file_lock(lock, blocking=False) as held:
            if not held:
                log.debug("cache entry %s is being built by another process; left in place", entry)
                continue
            shutil.rmtree(entry, ignore_errors=True)
            if not entry.exists():
                removed += 1
            with contextlib.suppress(OSError):
                lock.unlink()
    # Locks whose entry is gone (e.g. a failed build), and the arch memo.
    with contextlib.suppress(OSError):
        for stray in root.glob("*.lock"):
            if not stray.with_suffix("").exists():
                with _file_lock(stray, blocking=False) as held:
                    if held:
                        with contextlib.suppress(OSError):
                            stray.unlink()
    with contextlib.suppress(OSError):
        (root / ".cuda-arch.json").unlink()
    return removed
