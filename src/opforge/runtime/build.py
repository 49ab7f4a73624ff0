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

The pieces live beside this module: ``compilers`` (which compiler, which
flags, running it), ``cuda_arch`` (the visible GPUs' ``sm_XX``) and ``cache`` (the
folder, its entries, manifests and locks).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from ..errors import BuildError, CompileError, KernelSourceError
from .cache import (
    MANIFEST,
    TMP_PREFIX,
    atomic_write,
    cache_dir,
    cache_errors,
    cache_info,
    clear_cache,
    entry_dir,
    file_lock,
    library_name,
    lock_path,
    read_valid_manifest,
    remove_stray_temporaries,
    sha256_file,
    tidy_loaded_entry,
)
from .compilers import (
    SOURCE_SUFFIXES,
    Plan,
    compiler_identity,
    describe,
    find_compiler,
    include_dir,
    is_source,
    plan,
    run_compiler,
)
from .cuda_arch import detect_cuda_arch, detect_cuda_archs

__all__ = [
    "ABI_VERSION",
    "BuiltLibrary",
    "build",
    "cache_dir",
    "cache_info",
    "clear_cache",
    "detect_cuda_arch",
    "detect_cuda_archs",
    "find_compiler",
    "include_dir",
    "is_source",
]

#: Bump when the cache layout or the way flags are formed changes: every old
#: entry then misses and is rebuilt.
ABI_VERSION = 1

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*(?:"([^"\r\n]+)"|<([^>\r\n]+)>)', re.MULTILINE)


# Progress on long work: a compile that takes more than BUILD_REPORT_SECONDS is
# reported on the "opforge.build" logger.  opforge's own handler prints it to
# stderr unless OPFORGE_QUIET=1; the record also reaches the application's
# logging handlers; a level above INFO on the "opforge" logger drops it.
BUILD_REPORT_SECONDS = 0.5
log = logging.getLogger("opforge.build")


def _quiet() -> bool:
    return os.environ.get("OPFORGE_QUIET", "").strip() not in ("", "0")


class _StderrUnlessQuiet(logging.Handler):
    status = ""  # a progress bar shown on a terminal (runtime.progress): each record prints above it

    def emit(self, record: logging.LogRecord) -> None:
        if _quiet():
            return
        try:
            # the stream of the moment (pytest swaps it); a bar is wiped, then drawn again under the line
            clear = "\r\033[K" if self.status else ""
            sys.stderr.write(clear + self.format(record) + "\n" + self.status)
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own convention
            self.handleError(record)


_opforge_log = logging.getLogger("opforge")
_handler = next((h for h in _opforge_log.handlers if isinstance(h, _StderrUnlessQuiet)), None)
if _handler is None:
    _handler = _StderrUnlessQuiet(logging.INFO)
    _handler.setFormatter(logging.Formatter("opforge: %(message)s"))
    _opforge_log.addHandler(_handler)
    if _opforge_log.level == logging.NOTSET:
        _opforge_log.setLevel(logging.INFO)


def show_status(text: str) -> bool:
    """Draw ``text`` as the last line of a terminal, in place of the one before (a progress
    bar), where progress lines would print: stderr is a terminal, OPFORGE_QUIET is unset
    and the "opforge.progress" logger takes INFO.  "" wipes it.  Whether it was drawn."""
    assert _handler is not None
    stream = sys.stderr
    if text and (_quiet() or not logging.getLogger("opforge.progress").isEnabledFor(logging.INFO)
                 or not getattr(stream, "isatty", lambda: False)()):
        return False
    if not text and not _handler.status:
        return False
    _handler.status = f"opforge: {text}" if text else ""
    stream.write("\r\033[K" + _handler.status)
    stream.flush()
    return True


def report_build(what: str, seconds: float) -> None:
    """One progress line for a finished compile, when it took long enough to notice."""
    if seconds >= BUILD_REPORT_SECONDS:
        log.info("compiled %s in %.1f s", what, seconds)


@dataclass(frozen=True)
class BuiltLibrary:
    """A compiled kernel library in the cache."""

    path: Path  # the cached shared library
    source: Path | None  # the source it was built from
    cxx11_abi: bool  # the libstdc++ string ABI the library was built with
    from_cache: bool  # True when no compiler ran


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


def _cache_key(plan: Plan, source_bytes: bytes) -> str:
    digest = hashlib.sha256()

    def feed(item: object) -> None:
        raw = item if isinstance(item, bytes) else str(item).encode("utf-8", "surrogateescape")
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)

    feed(f"opforge-build abi={ABI_VERSION}")
    feed(plan.language)
    for part in compiler_identity(plan.compiler):
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
# compiling


def _verbose(flag: bool) -> bool:
    return flag or os.environ.get("OPFORGE_VERBOSE", "").strip().lower() in ("1", "true", "yes", "on")


def _compile(plan: Plan, entry: Path, library: Path, key: str, verbose: bool) -> None:
    entry.mkdir(parents=True, exist_ok=True)
    remove_stray_temporaries(entry)
    # Named, not created: the compiler creates it, so a build killed before the
    # compiler finishes leaves nothing behind.  The entry's lock makes it unique.
    tmp = entry / f"{TMP_PREFIX}{secrets.token_hex(6)}.so"
    command = plan.command(tmp)
    shown = shlex.join(plan.command(library))
    if verbose:
        print(f"opforge: {shown}", file=sys.stderr, flush=True)
    try:
        done = run_compiler(command)
        output = done.stdout or ""
        if done.returncode != 0:
            raise CompileError(
                f"failed to compile {plan.source} ({describe(plan.language)}, "
                f"{os.path.basename(plan.compiler[0])} exited with status {done.returncode})\n"
                f"command: {shown}\n{output.rstrip()}",
                command=plan.command(library),
                output=output,
            )
        if verbose and output.strip():
            print(output.rstrip(), file=sys.stderr, flush=True)
        os.chmod(tmp, 0o755)
        sha, size = sha256_file(tmp)
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
        atomic_write(entry / MANIFEST, json.dumps(manifest, indent=1).encode())
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if not (entry / MANIFEST).exists():
            with contextlib.suppress(OSError):
                entry.rmdir()  # a failed first build leaves no empty entry behind


def build(source: str | os.PathLike[str], *, extra_cflags: Iterable[str] | str = (),
          include_dirs: Iterable[str | os.PathLike[str]] = (),
          compiler: str | None = None, cuda_arch: str | Sequence[str] | None = None, cxx11_abi: bool = False,
          optimization: str = "-O3", verbose: bool = False, force: bool = False) -> BuiltLibrary:
    """Compile ``source`` into the cache (or find it there) and return the library.

    ``extra_cflags`` are appended after opforge's flags (a string is split like
    a shell would); ``$OPFORGE_CFLAGS``/``$OPFORGE_CXXFLAGS``/``$OPFORGE_NVCC_FLAGS``
    are appended after those.  A ``-D_GLIBCXX_USE_CXX11_ABI=N`` among them
    overrides ``cxx11_abi``.  ``cuda_arch`` (a ``.cu`` source's targets: ``"sm_90"``,
    ``"sm_80,sm_90"`` or a list) defaults to every visible GPU's.  ``force=True``
    rebuilds even when the entry looks valid (for example after the dynamic
    loader rejected it).

    Raises ``CompileError`` when the compiler fails,
    ``CompilerNotFoundError`` when there is none,
    ``KernelSourceError`` when ``source`` does not exist,
    ``CacheError`` when the cache folder cannot be used, ``BuildError``
    for a path that is not a kernel source (load it as a prebuilt library instead)
    or an unreadable ``cuda_arch``.
    """
    if not isinstance(source, (str, os.PathLike)):
        raise BuildError(f"build() takes the path of a kernel source, got {source!r}")
    source = Path(source)
    if not is_source(source):
        raise BuildError(
            f"{source} is not a kernel source (expected one of "
            f"{' '.join(SOURCE_SUFFIXES)}); load it as a prebuilt library"
        )
    source = Path(os.path.realpath(os.path.expanduser(source)))
    try:
        source_bytes = source.read_bytes()
    except OSError as exc:
        raise KernelSourceError(f"cannot read kernel source {source}: {exc.strerror or exc}") from None
    verbose = _verbose(verbose)
    build_plan = plan(source, extra_cflags=extra_cflags, include_dirs=include_dirs, compiler=compiler,
                      cuda_arch=cuda_arch, cxx11_abi=cxx11_abi, optimization=optimization)
    key = _cache_key(build_plan, source_bytes)
    entry = entry_dir(source, key)
    library = entry / library_name(source)

    def cached(manifest: dict[str, Any]) -> BuiltLibrary:
        if verbose:
            print(f"opforge: using cached {library}", file=sys.stderr, flush=True)
        tidy_loaded_entry(entry)
        return BuiltLibrary(library, source, bool(manifest.get("cxx11_abi", build_plan.cxx11_abi)), True)

    # Optimistic check without the lock: entries are only ever swapped in whole
    # (os.replace), so a reader sees either a complete entry or a mismatch.
    if not force:
        manifest = read_valid_manifest(entry, library, key)
        if manifest is not None:
            return cached(manifest)

    with cache_errors():
        entry.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(lock_path(entry)):
            if not force:
                # Another process may have built it while we waited for the lock.
                manifest = read_valid_manifest(entry, library, key)
                if manifest is not None:
                    return cached(manifest)
            _compile(build_plan, entry, library, key, verbose)
    return BuiltLibrary(library, source, build_plan.cxx11_abi, False)
