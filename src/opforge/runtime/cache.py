"""The on-disk build cache: its folder, entries, manifests and locks.

Layout of one entry::

    <cache_dir>/<stem>-<key[:16]>.lock      flock()ed around check + build
    <cache_dir>/<stem>-<key[:16]>/<name>.so  e.g. add.cc.so, as MindSpore names it
    <cache_dir>/<stem>-<key[:16]>/manifest.json

Long stems are cut (the key keeps names unique), so an entry's path never
exceeds the file system's name limit.  The manifest is written last and is
the commit marker: an entry counts only if its manifest parses, names the
same key, and the library's size and sha256 match it.  Files are written
under ``.tmp-`` names and moved into place with ``os.replace``; temporaries
a dead build left behind are removed by the next process that holds the
entry's lock.

Locks are OS file locks (``flock``), which the kernel drops when the holder
dies: a build killed with SIGKILL never leaves a lock that hangs the next run.
Every failure to use the folder itself is a :class:`CacheError` naming the
folder, what is wrong with it and ``OPFORGE_CACHE_DIR``.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from ..errors import CacheError, OpforgeError

__all__ = ["cache_dir", "cache_errors", "cache_info", "clear_cache"]

log = logging.getLogger("opforge.build")

MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
# Bytes of a source's stem kept in entry and library names; the key makes them unique.
STEM_BYTES = 48


def cache_dir() -> Path:
    """``$OPFORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/opforge``, else ``~/.cache/opforge``.

    The folder is not created here; a build creates it on demand.
    """
    explicit = os.environ.get("OPFORGE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "opforge"
    return Path.home() / ".cache" / "opforge"


# --------------------------------------------------------------------------
# an unusable folder


def _what_is_wrong(root: Path, exc: OSError) -> str:
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        for path in (root, *root.parents):
            if path.exists() and not path.is_dir():
                return f"{path} is a file, not a folder" if path == root else \
                    f"{path} is a file, so no folder can be made under it"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"no permission to write {exc.filename or root}"
    if exc.errno == errno.EROFS:
        return "it is on a read-only file system"
    if exc.errno == errno.ENOSPC:
        return "the disk is full"
    return exc.strerror or str(exc)


@contextlib.contextmanager
def cache_errors() -> Iterator[None]:
    """Turn an OS error met while using the cache folder into a :class:`CacheError`."""
    try:
        yield
    except OpforgeError:
        raise
    except OSError as exc:
        root = cache_dir()
        raise CacheError(f"cannot use the opforge cache folder {root}: {_what_is_wrong(root, exc)}; "
                         f"set OPFORGE_CACHE_DIR to a folder you can write") from exc


# --------------------------------------------------------------------------
# locking


@contextlib.contextmanager
def file_lock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
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


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
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


def short_stem(stem: str) -> str:
    """``stem`` cut to :data:`STEM_BYTES` bytes of its file-system encoding, on a character boundary."""
    kept, size = [], 0
    for char in stem:
        size += len(os.fsencode(char))
        if size > STEM_BYTES:
            break
        kept.append(char)
    return "".join(kept)


def entry_dir(source: Path, key: str) -> Path:
    return cache_dir() / f"{short_stem(source.stem)}-{key[:16]}"


def library_name(source: Path) -> str:
    """``add.cc.so`` as MindSpore names it; a long stem is cut, the suffix kept."""
    return f"{short_stem(source.stem)}{source.suffix}.so"


def lock_path(entry: Path) -> Path:
    return entry.with_name(entry.name + ".lock")


def sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def read_valid_manifest(entry: Path, library: Path, key: str) -> dict[str, Any] | None:
    """The entry's manifest if the entry is complete and intact, else None."""
    manifest_path = entry / MANIFEST
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
        sha, _ = sha256_file(library)
    except OSError as exc:
        log.debug("cache entry %s: library unreadable (%s); rebuilding", entry, exc)
        return None
    if sha != manifest.get("sha256"):
        log.debug("cache entry %s: library checksum mismatch; rebuilding", entry)
        return None
    return manifest


def atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def stray_temporaries(entry: Path) -> list[Path]:
    try:
        return [child for child in entry.iterdir() if child.name.startswith(TMP_PREFIX)]
    except OSError:
        return []


def remove_stray_temporaries(entry: Path) -> None:
    """Drop temporaries left by builds that died.  Callers hold the entry's lock, so
    every temporary there predates them: no live build of this entry can own one."""
    for child in stray_temporaries(entry):
        with contextlib.suppress(OSError):
            child.unlink()


def tidy_loaded_entry(entry: Path) -> None:
    """On a cache hit: remove a dead build's temporaries, unless a build holds the lock now."""
    if not stray_temporaries(entry):
        return
    with contextlib.suppress(OSError), file_lock(lock_path(entry), blocking=False) as held:
        if held:
            remove_stray_temporaries(entry)


# --------------------------------------------------------------------------
# maintenance


def _entries(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def cache_info() -> dict[str, Any]:
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
    with cache_errors():
        for entry in _entries(root):
            lock = lock_path(entry)
            with file_lock(lock, blocking=False) as held:
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
                with file_lock(stray, blocking=False) as held:
                    if held:
                        with contextlib.suppress(OSError):
                            stray.unlink()
    with contextlib.suppress(OSError):
        (root / ".cuda-arch.json").unlink()
    return removed
