"""Built-in kernels compiled when the package is built: no compiler at their first use.

``setup.py``'s ``build_ext`` runs ``python -m opforge.runtime.prebuilt FOLDER``
after building the extension.  It imports the built-in ops, takes every
:class:`~opforge.runtime.aot.AotKernel` they declare (each dtype, ISA and
layout variant; an ISA the build machine lacks compiles all the same) and
compiles them in parallel into ``opforge/_prebuilt/<key>.so``, with
``index.json`` mapping each key to its library.  Kernels opforge generates
from built-ins (graph fusion's most common chains) are added through
``GENERATED``.

The key is the build cache's key without the compiler's identity: the
source bytes, the bytes of every local header it includes, the flag list
(package paths written relative to the package, so the key is the same in
the build tree and once installed), the libstdc++ string ABI and
``ABI_VERSION``.  At run time ``AotKernel.load`` asks :func:`lookup` first;
a kernel whose key is in the index loads that library and no compiler is
looked for.  Anything else -- a user's op, a built-in whose source or flags
changed since (``OPFORGE_CXXFLAGS`` included), a missing or damaged file --
builds through the cache as before.  ``OPFORGE_PREBUILT=0`` ignores the
prebuilt set; ``OPFORGE_PREBUILD=0`` skips making it at package build.

GPU kernels (``device="gpu"``, the built-ins' ``.cu`` sources) are never in
the set: most machines that build or install opforge have neither nvcc nor
a GPU, and a CUDA library is compiled for the ``sm_XX`` of the GPU it runs
on, which is known only there.  They compile with nvcc at their first use on
a GPU and are kept in the build cache, as a user's kernels are.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from .build import ABI_VERSION, BuiltLibrary, _local_headers
from .cache import TMP_PREFIX, atomic_write, sha256_file
from .compilers import is_source, plan, run_compiler

if TYPE_CHECKING:
    from ..operator import Op
    from .aot import AotKernel
    from .compilers import Plan

__all__ = ["PREBUILT_DIR", "builtin_kernels", "declared_by_builtins", "kernel_key", "load_index", "lookup",
           "prebuild"]

log = logging.getLogger("opforge.build")

PACKAGE = Path(__file__).resolve().parent.parent  # the opforge folder
PREBUILT_DIR = PACKAGE / "_prebuilt"
INDEX = "index.json"
#: Bump when the index layout or the key changes; an index of another format is ignored.
FORMAT = 1
BUILTINS = "opforge.builtins"
PROGRESS_EVERY = 10
STALE_TEMPORARY_SECONDS = 3600


def declared_by_builtins() -> bool:
    """True when the op being declared comes from a module of ``opforge.builtins``.

    Called while a kernel is declared: the nearest caller outside opforge's own
    modules decides, so a user's op (declared from user code, a YAML file or an
    ONNX model) is never a built-in, whatever its source says.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__") or ""
        if name == BUILTINS or name.startswith(BUILTINS + "."):
            return True
        if name != "opforge" and not name.startswith("opforge."):
            return False
        frame = frame.f_back
    return False


def disabled() -> bool:
    return os.environ.get("OPFORGE_PREBUILT", "").strip().lower() in ("0", "false", "no", "off")


# --------------------------------------------------------------------------
# the key


def _source(kernel: AotKernel) -> Path:
    return Path(os.path.realpath(kernel.path))


def _portable(text: str, source_dir: str) -> str:
    """A path (or a flag that is one) with the source folder and the package folder named, not spelled out."""
    for prefix, name in ((source_dir, "<source>"), (str(PACKAGE), "<opforge>")):
        if text == prefix or text.startswith(prefix + os.sep):
            return name + text[len(prefix):]
    return text


def _plan(kernel: AotKernel, compiler: str | None, source: Path | None = None) -> Plan:
    cxx11_abi = False if kernel.cxx11_abi is None else kernel.cxx11_abi  # build()'s default
    return plan(source or _source(kernel), extra_cflags=kernel.cflags, include_dirs=kernel.include_dirs, compiler=compiler,
                cuda_arch=None, cxx11_abi=cxx11_abi, optimization="-O3")


def kernel_key(kernel: AotKernel) -> str | None:
    """The prebuilt key of a built-in CPU kernel compiled from source, else None (GPU kernels: see above).

    Never looks for a compiler: the plan is made with a stand-in one and only
    its flags are used.
    """
    if not getattr(kernel, "builtin", False) or kernel.device != "cpu" or not is_source(kernel.path):
        return None
    source = _source(kernel)
    try:
        data = kernel.code.encode() if kernel.code is not None else source.read_bytes()
    except OSError:
        return None
    build_plan = _plan(kernel, sys.executable)
    folder = str(source.parent)
    parts = [f"opforge-prebuilt format={FORMAT} abi={ABI_VERSION}", build_plan.language,
             f"cxx11_abi={int(build_plan.cxx11_abi)}", [_portable(flag, folder) for flag in build_plan.flags],
             [_portable(str(source), folder), hashlib.sha256(data).hexdigest()]]
    parts += [[_portable(str(header), folder), hashlib.sha256(content).hexdigest()]
              for header, content in _local_headers(source, data, build_plan.search_dirs)]
    return hashlib.sha256(json.dumps(parts).encode("utf-8", "surrogateescape")).hexdigest()


# --------------------------------------------------------------------------
# run time


def load_index(folder: Path = PREBUILT_DIR) -> dict[str, Any]:
    """key -> entry of the index in ``folder``; empty when there is none or it is of another format."""
    try:
        index = json.loads((Path(folder) / INDEX).read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("abi_version") != ABI_VERSION:
        return {}
    kernels = index.get("kernels")
    return kernels if isinstance(kernels, dict) else {}


def _intact(folder: Path, entry: object) -> bool:
    """Whether the library of index entry ``entry`` is in ``folder`` with the checksum and size it lists."""
    try:
        return isinstance(entry, dict) and sha256_file(folder / entry["file"]) == (entry["sha256"], entry["size"])
    except (OSError, KeyError, TypeError):
        return False


_loaded: dict[Path, dict[str, Any]] = {}


def lookup(kernel: AotKernel, folder: Path | None = None) -> BuiltLibrary | None:
    """The prebuilt library of ``kernel``, or None when it has none (then it builds as usual)."""
    if not getattr(kernel, "builtin", False) or disabled():
        return None
    folder = PREBUILT_DIR if folder is None else Path(folder)
    index = _loaded.get(folder)
    if index is None:
        index = _loaded[folder] = load_index(folder)
    if not index:
        return None
    key = kernel_key(kernel)
    entry = index.get(key) if key else None
    if entry is None:
        return None
    if not _intact(folder, entry):
        log.debug("prebuilt %s of %s: missing, unreadable or changed; building instead", entry, kernel.name)
        return None
    return BuiltLibrary(folder / entry["file"], _source(kernel), bool(entry.get("cxx11_abi")), True)


# --------------------------------------------------------------------------
# package build


#: Functions giving more (op, kernel) pairs to prebuild than the registered ops declare: kernels opforge
#: generates from built-ins, as graph fusion does for the chains models use most (it adds its own on import).
GENERATED: list[Callable[[], list[tuple[Op, AotKernel]]]] = []


def builtin_kernels() -> list[tuple[Op, AotKernel]]:
    """(op, kernel) for every built-in kernel that can be prebuilt: in registry order, then the generated ones."""
    import opforge  # noqa: F401 - registers the built-in ops (and, through the graph layer, GENERATED's functions)

    from ..registry import registered_ops
    from .aot import AotKernel

    declared = [(op, kernel) for op in registered_ops() for kernel in op.kernels if isinstance(kernel, AotKernel)]
    generated = [pair for generate in GENERATED for pair in generate()]
    return [(op, kernel) for op, kernel in declared + generated if kernel_key(kernel) is not None]


def _compile(kernel: AotKernel, key: str, folder: Path, staging: Path) -> dict[str, Any]:
    """Compile one variant to ``folder/<key>.so``; its index entry."""
    # an inline source compiles from the copy prebuild wrote, the others from where they are
    build_plan = _plan(kernel, None, staging / _source(kernel).name if kernel.code is not None else None)
    name = f"{key}.so"
    temporary = folder / f"{TMP_PREFIX}{os.getpid()}-{name}"  # another build of the folder may run too
    try:
        done = run_compiler(build_plan.command(temporary))
        if done.returncode != 0:
            raise RuntimeError(f"exit status {done.returncode}: {(done.stdout or '').strip()[:2000]}")
        sha, size = sha256_file(temporary)
        os.replace(temporary, folder / name)
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()
    return {"file": name, "sha256": sha, "size": size, "cxx11_abi": build_plan.cxx11_abi}


def prebuild(folder: Path = PREBUILT_DIR, *, kernels: Iterable[tuple[Op, AotKernel]] | None = None,
             jobs: int | None = None, stream: TextIO = sys.stderr) -> dict[str, Any]:
    """Compile ``kernels`` ((op, kernel) pairs; every built-in by default) into ``folder``.

    Libraries already there under the same key are kept.  A variant that fails
    to compile is reported and left out (it then builds at first use, where
    its error shows).  Returns ``{"variants", "compiled", "reused", "failed", "seconds"}``.
    """
    started = time.monotonic()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pairs = builtin_kernels() if kernels is None else list(kernels)
    wanted: dict[str, tuple[Op, AotKernel]] = {}  # key -> (op, kernel): identical variants compile once
    for op, kernel in pairs:
        key = kernel_key(kernel)
        if key is not None:
            wanted.setdefault(key, (op, kernel))
    old = load_index(folder)
    index = {key: dict(old[key]) for key in wanted if _intact(folder, old.get(key))}
    todo = [key for key in wanted if key not in index]
    staging = folder / f"{TMP_PREFIX}sources-{os.getpid()}"
    staging.mkdir(exist_ok=True)
    for key in todo:
        kernel = wanted[key][1]
        if kernel.code is not None:
            (staging / _source(kernel).name).write_text(kernel.code)
    failed = []
    workers = max(1, jobs or os.cpu_count() or 1)
    print(f"opforge: prebuilding {len(todo)} built-in kernel variant(s) of {len(wanted)} into {folder} "
          f"({workers} at a time)", file=stream, flush=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:  # each job is a compiler process
            futures = {pool.submit(_compile, wanted[key][1], key, folder, staging): key for key in todo}
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                key = futures[future]
                op, kernel = wanted[key]
                try:
                    index[key] = future.result()
                except Exception as exc:  # noqa: BLE001 - reported, and the variant builds at first use
                    failed.append(f"{op.name} {kernel.name}: {exc}")
                else:
                    index[key].update(op=op.name, kernel=kernel.name)
                if done % PROGRESS_EVERY == 0 or done == len(todo):
                    print(f"opforge: prebuilt {done}/{len(todo)} ({time.monotonic() - started:.0f} s)",
                          file=stream, flush=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for key, entry in index.items():
        entry.setdefault("op", wanted[key][0].name)
        entry.setdefault("kernel", wanted[key][1].name)
    atomic_write(folder / INDEX, json.dumps({"format": FORMAT, "abi_version": ABI_VERSION,
                                             "kernels": dict(sorted(index.items()))}, indent=1).encode())
    kept = {entry["file"] for entry in index.values()} | {INDEX}
    for stale in folder.iterdir():
        with contextlib.suppress(OSError):
            # a temporary may be another build's, running now: only an old one is left over
            if stale.name.startswith(TMP_PREFIX) and time.time() - stale.stat().st_mtime < STALE_TEMPORARY_SECONDS:
                continue
            if stale.name not in kept and stale.is_file():
                stale.unlink()
            elif stale.name.startswith(TMP_PREFIX) and stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
    for line in failed:
        print(f"opforge: could not prebuild {line}", file=stream, flush=True)
    seconds = time.monotonic() - started
    print(f"opforge: {len(index)} prebuilt kernel variant(s) in {folder}: {len(todo) - len(failed)} compiled, "
          f"{len(index) - len(todo) + len(failed)} reused, {len(failed)} failed ({seconds:.1f} s)",
          file=stream, flush=True)
    return {"variants": len(index), "compiled": len(todo) - len(failed), "reused": len(index) - len(todo) + len(failed),
            "failed": failed, "seconds": seconds}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opforge.runtime.prebuilt",
                                     description="Compile opforge's built-in kernels into the prebuilt folder.")
    parser.add_argument("folder", nargs="?", default=str(PREBUILT_DIR), help="where (default: %(default)s)")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="compilers at a time (default: CPU count)")
    args = parser.parse_args(argv)
    summary = prebuild(Path(args.folder), jobs=args.jobs)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    # Run as ``python -m``, this file is a second module, ``__main__``: hooks (GENERATED) went to the first.
    from opforge.runtime import prebuilt as _imported

    sys.exit(_imported.main())
