"""The ``opforge`` command line.

    opforge build FILE [--cflags "..."] [-I DIR]... [--verbose]
    opforge cache info | clear
    opforge include
    opforge ops
    opforge doctor

Each subcommand is one ``add_<name>(subparsers)`` function that declares its
arguments and sets ``func`` to the function that runs it; ``SUBCOMMANDS``
lists them in help order.  A handler returns the exit status (0 when it
returns None).  To add a subcommand, write both functions and append the
``add_`` function to ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Sequence

from .errors import OpforgeError

# --------------------------------------------------------------------------
# opforge build


def add_build(subparsers) -> None:
    parser = subparsers.add_parser(
        "build", help="compile a kernel source into the cache",
        description="Compile a kernel source (.c .cc .cpp .cxx .cu) into opforge's cache and "
                    "print the library's path. A source that is already built is not recompiled.")
    parser.add_argument("file", help="kernel source file")
    parser.add_argument("--cflags", default="", metavar="FLAGS",
                        help='extra compiler flags, split like a shell would (e.g. "-DN=4 -g")')
    parser.add_argument("-I", dest="include_dirs", action="append", default=[], metavar="DIR",
                        help="add an include folder (repeatable)")
    parser.add_argument("--cuda-arch", default=None, metavar="ARCH",
                        help="CUDA target, e.g. sm_90 (default: the visible GPU's)")
    parser.add_argument("--cxx11-abi", action="store_true",
                        help="build with -D_GLIBCXX_USE_CXX11_ABI=1 (default 0, as MindSpore)")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--verbose", "-v", action="store_true", help="print the compiler command")
    parser.set_defaults(func=run_build)


def run_build(args) -> int:
    from .runtime.build import build, is_source

    if not is_source(args.file):
        print(f"opforge build: {args.file} is not a kernel source "
              f"(expected .c .cc .cpp .cxx or .cu)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        built = build(args.file, extra_cflags=args.cflags, include_dirs=args.include_dirs,
                      cuda_arch=args.cuda_arch, cxx11_abi=args.cxx11_abi,
                      verbose=args.verbose, force=args.force)
    except (OpforgeError, FileNotFoundError) as exc:
        print(f"opforge build: {exc}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    how = "cached" if built.from_cache else f"built in {elapsed:.2f} s"
    print(f"{built.path}  ({how})")
    return 0


# --------------------------------------------------------------------------
# opforge cache


def add_cache(subparsers) -> None:
    parser = subparsers.add_parser("cache", help="inspect or clear the build cache",
                                   description="Inspect or clear opforge's build cache "
                                               "($OPFORGE_CACHE_DIR, else ~/.cache/opforge).")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    actions.add_parser("info", help="print the cache folder, entry count and size"
                       ).set_defaults(func=run_cache_info)
    actions.add_parser("clear", help="remove every cache entry").set_defaults(func=run_cache_clear)


def _human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # unreachable


def run_cache_info(args) -> int:
    from .runtime.build import cache_info

    info = cache_info()
    print(f"path:    {info['path']}")
    print(f"entries: {info['entries']}")
    print(f"size:    {_human_size(info['bytes'])} ({info['bytes']} bytes)")
    return 0


def run_cache_clear(args) -> int:
    from .runtime.build import cache_dir, clear_cache

    removed = clear_cache()
    print(f"removed {removed} cache {'entry' if removed == 1 else 'entries'} from {cache_dir()}")
    return 0


# --------------------------------------------------------------------------
# opforge include


def add_include(subparsers) -> None:
    parser = subparsers.add_parser(
        "include", help="print the folder holding custom_aot_extra.h",
        description="Print the folder holding opforge's custom_aot_extra.h, "
                    "for use as -I$(opforge include) in a Makefile.")
    parser.set_defaults(func=run_include)


def run_include(args) -> int:
    from .runtime.build import include_dir

    print(include_dir())
    return 0


# --------------------------------------------------------------------------
# opforge ops


def add_ops(subparsers) -> None:
    parser = subparsers.add_parser("ops", help="list registered ops with signatures and kernels")
    parser.add_argument("--load", action="append", default=[], metavar="FILE",
                        help="load op declarations (YAML or JSON) first (repeatable)")
    parser.set_defaults(func=run_ops)


def run_ops(args) -> int:
    import opforge

    for path in args.load:
        opforge.load_ops(path)
    for op in opforge.registered_ops():
        print(getattr(op, "schema", op.name))
        if op.traits:
            print(f"    traits: {', '.join(sorted(op.traits))}")
        for kernel in op.kernels:
            tags = [kernel.device]
            if kernel.isa:
                tags.append(kernel.isa)
            if kernel.layout != "ndarray":
                tags.append(kernel.layout)
            if getattr(kernel, "reference", False):
                tags.append("reference")
            print(f"    kernel {kernel.name} ({', '.join(tags)})")
    return 0


# --------------------------------------------------------------------------
# opforge doctor


def add_doctor(subparsers) -> None:
    parser = subparsers.add_parser("doctor", help="report compilers, CPU features and CUDA")
    parser.set_defaults(func=run_doctor)


def run_doctor(args) -> int:
    import platform

    import numpy

    import opforge
    from opforge.errors import CompilerNotFoundError
    from opforge.runtime import build, cpu, cuda

    print(f"opforge {opforge.__version__}, Python {platform.python_version()}, NumPy {numpy.__version__}, "
          f"{platform.system()} {platform.machine()}")
    for language in ("c", "c++", "cuda"):
        try:
            print(f"{language:>5} compiler: {build.find_compiler(language)}")
        except CompilerNotFoundError as error:
            print(f"{language:>5} compiler: not found ({str(error).splitlines()[0]})")
    features = cpu.cpu_features()
    print("CPU features: " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in features.items()))
    print(f"ISA used by dispatch: {cpu.best_isa()} (cap {cpu.isa_cap()})")
    count = cuda.device_count()
    print(f"CUDA devices: {count}" + ("" if count else " (GPU kernels will not run; CUDA sources still compile)"))
    print(f"cache: {build.cache_dir()}")
    return 0


# --------------------------------------------------------------------------

SUBCOMMANDS: list[Callable] = [add_build, add_cache, add_include, add_ops, add_doctor]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opforge", description="Build, cache and inspect opforge kernel libraries.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = make_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        status = func(args)
    except KeyboardInterrupt:
        return 130
    except OpforgeError as exc:
        print(f"opforge {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0 if status is None else int(status)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
