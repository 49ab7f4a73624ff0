"""The ``opforge`` command line.

    opforge build FILE [--dtype [NAME=]DTYPE]... [--isa ISA] [--layout LAYOUT] [-D NAME[=VALUE]]...
                       [--cflags FLAGS] [-I DIR]... [--cuda-arch ARCH] [--cxx11-abi] [--force] [--verbose]
    opforge build (--op NAME)... | --all  [-j N] [--load FILE]... [--import MODULE]...
    opforge cache info | clear
    opforge include
    opforge ops [--load FILE]... [--import MODULE]...
    opforge doctor
    opforge run MODEL.onnx [--input NAME=FILE.npy]... [--seed S] [--threads N] [--bench [--repeat N]]
                           [--load FILE]... [--import MODULE]...
    opforge convert MODEL.onnx GRAPH.json [--load FILE]... [--import MODULE]...
    opforge convert GRAPH.json MODEL.onnx [--opset N] [--load FILE]... [--import MODULE]...

Each subcommand is one ``add_<name>(subparsers)`` function that declares its
arguments and sets ``func`` to the function that runs it; ``SUBCOMMANDS``
lists them in help order.  A handler returns the exit status (0 when it
returns None); it reports a usage problem with :class:`UsageError` (exit 2).
Every error is one line on stderr, never a traceback.  To add a subcommand,
write both functions and append the ``add_`` function to ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .errors import CompileError, GraphError, OpforgeError

if TYPE_CHECKING:
    from typing import TypeAlias

    import numpy as np

    from .graph import Graph
    from .operator import Op
    from .spec import TensorSpec

    _Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class UsageError(OpforgeError):
    """A command was given something it cannot use: exit status 2."""


# --------------------------------------------------------------------------
# opforge build


def add_build(subparsers: _Subparsers) -> None:
    from .runtime.cpu import ISA_LEVELS

    parser = subparsers.add_parser(
        "build", help="compile a kernel source, or every kernel variant of ops, into the cache",
        description="Compile a kernel source (.c .cc .cpp .cxx .cu) into opforge's cache and "
                    "print the library's path. A source that is already built is not recompiled. "
                    "--dtype, --isa and --layout define the macros op.kernel(dtypes=, isa=, layout=) "
                    "compiles a source with. With --op (or --all) instead of FILE: compile every CPU "
                    "kernel variant (dtype, ISA, layout) of those ops, -j at a time, with a progress bar, "
                    "so their first calls find them built.")
    parser.add_argument("file", nargs="?", help="kernel source file")
    parser.add_argument("--op", dest="ops", action="append", default=[], metavar="NAME",
                        help="build every CPU kernel variant of this op (repeatable)")
    parser.add_argument("--all", action="store_true",
                        help="build the kernels of every op that --load and --import declare")
    parser.add_argument("-j", "--jobs", type=_positive_int, default=None, metavar="N",
                        help="compilers at a time for --op/--all (default: the CPU count)")
    _add_declaration_options(parser)
    parser.add_argument("--dtype", dest="dtypes", action="append", default=[], metavar="[NAME=]DTYPE",
                        help="define OPFORGE_T as the dtype's C type and OPFORGE_DTYPE_<DTYPE>=1 (the first "
                             "--dtype); NAME=DTYPE also defines OPFORGE_T_<NAME> (repeatable)")
    parser.add_argument("--isa", choices=ISA_LEVELS[1:],
                        help="compile with this instruction set's flags (e.g. avx2: -mavx2 -mfma)")
    parser.add_argument("--layout", default="ndarray", metavar="LAYOUT",
                        help="define OPFORGE_LAYOUT_<LAYOUT>=1 for a blocked layout, e.g. nchw16c")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=VALUE]",
                        help="define a macro (repeatable)")
    parser.add_argument("--cflags", action="append", default=[], metavar="FLAGS",
                        help='extra compiler flags, split like a shell would: --cflags "-DN=4 -g", '
                             "--cflags=-g or --cflags -g (repeatable)")
    parser.add_argument("-I", dest="include_dirs", action="append", default=[], metavar="DIR",
                        help="add an include folder (repeatable)")
    parser.add_argument("--cuda-arch", default=None, metavar="ARCH",
                        help="CUDA targets, e.g. sm_90 or sm_80,sm_90 (default: the visible GPUs')")
    parser.add_argument("--cxx11-abi", action="store_true",
                        help="build with -D_GLIBCXX_USE_CXX11_ABI=1 (default 0, as MindSpore)")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--verbose", "-v", action="store_true", help="print the compiler command")
    parser.set_defaults(func=run_build)


def _identifier(name: str, what: str) -> str:
    if not name.isidentifier():
        raise UsageError(f"{what} {name!r} is not a C identifier")
    return name


def variant_flags(args: argparse.Namespace) -> list[str]:
    """The -D and instruction-set flags ``--dtype``, ``--isa``, ``--layout`` and ``-D`` ask for,
    made by the functions op.kernel uses, in the same order."""
    import shlex

    from .dtypes import normalize
    from .runtime.aot import C_TYPES, layout_flags, named_dtype_flags
    from .runtime.cpu import ISA_COMPILE_FLAGS

    flags = [f"-D{_identifier(name, 'macro')}" + (f"={value}" if sep else "")
             for name, sep, value in (define.partition("=") for define in args.defines)]
    for words in args.cflags:
        try:
            flags += shlex.split(words)
        except ValueError as exc:
            raise UsageError(f"--cflags {words}: {exc}") from None
    typed = []
    for given in args.dtypes:
        name, _, dtype = given.rpartition("=")
        try:
            dtype = normalize(dtype)
        except OpforgeError as exc:
            raise UsageError(f"--dtype {given}: {exc}") from None
        if dtype not in C_TYPES:
            raise UsageError(f"--dtype {given}: {dtype} has no C type; expected one of {', '.join(C_TYPES)}")
        typed.append((_identifier(name, "--dtype name") if name else None, dtype))
    return flags + ISA_COMPILE_FLAGS[args.isa or "generic"] + named_dtype_flags(typed) + \
        layout_flags(_identifier(args.layout, "--layout").lower())


def run_build(args: argparse.Namespace) -> int:
    from .runtime.build import build, is_source
    from .runtime.compilers import SOURCE_SUFFIXES

    if args.ops or args.all:
        if args.file:
            raise UsageError("give a kernel source FILE or --op/--all, not both")
        return build_op_kernels(args)
    if args.file is None:
        raise UsageError("give a kernel source FILE to build, or --op NAME / --all to build ops' kernels")
    if not is_source(args.file):
        raise UsageError(f"{args.file} is not a kernel source (expected {' '.join(SOURCE_SUFFIXES)}); "
                         "a prebuilt library needs no build")
    if args.isa and args.file.lower().endswith(".cu"):
        raise UsageError("--isa chooses a CPU instruction set; a .cu source is compiled for the GPU")
    flags = variant_flags(args)
    start = time.perf_counter()
    built = build(args.file, extra_cflags=flags, include_dirs=args.include_dirs,
                  cuda_arch=args.cuda_arch, cxx11_abi=args.cxx11_abi,
                  verbose=args.verbose, force=args.force)
    elapsed = time.perf_counter() - start
    how = "cached" if built.from_cache else f"built in {elapsed:.2f} s"
    print(f"{built.path}  ({how})")
    return 0


def build_op_kernels(args: argparse.Namespace) -> int:
    """``opforge build --op NAME... | --all``: every CPU kernel variant of the ops, into the cache."""
    import concurrent.futures

    import opforge
    from .runtime.aot import AotKernel
    from .runtime.progress import Progress

    builtin = {op.name for op in opforge.registered_ops()}  # (import opforge registers the built-ins)
    declare_ops(args)
    if args.all:
        ops = [op for op in opforge.registered_ops() if op.name not in builtin]
        if not ops and not args.ops:
            raise UsageError("--all builds the ops that --load and --import declare; they declared none")
    else:
        ops = []
    for name in args.ops:
        op = opforge.lookup(name)
        if op is None:
            raise UsageError(f"no op named {name!r} (see `opforge ops`; declare yours with --load or --import)")
        if op not in ops:
            ops.append(op)
    kernels = [(op, k) for op in ops for k in op.kernels if isinstance(k, AotKernel)]
    cpu = [(op, k) for op, k in kernels if k.device == "cpu"]
    if len(cpu) < len(kernels):
        print(f"{len(kernels) - len(cpu)} GPU kernel(s) left to build at their first use on a GPU (nvcc targets "
              "the GPU it runs on)")
    built = failed = 0
    progress = Progress(f"building {len(cpu)} kernel variant(s)", len(cpu), after=0.5)
    start = time.perf_counter()

    def load(kernel: AotKernel) -> bool:  # whether a compiler ran
        return kernel.load().compiled

    with concurrent.futures.ThreadPoolExecutor(args.jobs or os.cpu_count() or 1) as pool:  # compilers run apart
        futures = {pool.submit(load, kernel): (op, kernel) for op, kernel in cpu}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            op, kernel = futures[future]
            try:
                built += future.result()
            except OpforgeError as exc:
                failed += 1
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                print(f"op '{op.name}', kernel {kernel.name}: {first}", file=sys.stderr)
            progress.step(done)
    progress.close()
    print(f"{len(cpu)} kernel variant(s) of {len(ops)} op(s): {built} compiled, {len(cpu) - built - failed} "
          f"already built, {failed} failed ({time.perf_counter() - start:.1f} s)")
    return 1 if failed else 0


# --------------------------------------------------------------------------
# opforge cache


def add_cache(subparsers: _Subparsers) -> None:
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


def run_cache_info(args: argparse.Namespace) -> int:
    from .runtime.build import cache_info

    info = cache_info()
    print(f"path:    {info['path']}")
    print(f"entries: {info['entries']}")
    print(f"size:    {_human_size(info['bytes'])} ({info['bytes']} bytes)")
    return 0


def run_cache_clear(args: argparse.Namespace) -> int:
    from .runtime.build import cache_dir, clear_cache

    removed = clear_cache()
    print(f"removed {removed} cache {'entry' if removed == 1 else 'entries'} from {cache_dir()}")
    return 0


# --------------------------------------------------------------------------
# opforge include


def add_include(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "include", help="print the folder holding custom_aot_extra.h",
        description="Print the folder holding opforge's custom_aot_extra.h, "
                    "for use as -I$(opforge include) in a Makefile.")
    parser.set_defaults(func=run_include)


def run_include(args: argparse.Namespace) -> int:
    from .runtime.build import include_dir

    print(include_dir())
    return 0


# --------------------------------------------------------------------------
# opforge ops


def add_ops(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "ops", help="list registered ops with signatures and kernels",
        description="List every registered op (the built-ins, and the ops the files and modules given "
                    "here declare) with its schema, traits and kernels.")
    _add_declaration_options(parser)
    parser.set_defaults(func=run_ops)


def _import_user_module(name: str) -> None:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the user's own modules first
    try:
        importlib.import_module(name)
    except ImportError as exc:
        raise UsageError(f"cannot import module {name!r}: {exc}") from None
    except OpforgeError:
        raise
    except Exception as exc:  # the module itself failed: report it as one line
        raise UsageError(f"importing module {name!r} raised {type(exc).__name__}: {exc}") from None


def _kernel_line(kernel: Any) -> str:  # any Kernel: its optional attributes are read with getattr
    tags = [kernel.device]
    if kernel.isa:
        tags.append(kernel.isa)
    if kernel.layout != "ndarray":
        tags.append(kernel.layout)
    if getattr(kernel, "reference", False):
        tags.append("reference")
    line = f"    kernel {kernel.name} ({', '.join(tags)})"
    if getattr(kernel, "function_name", None) and getattr(kernel, "code", None) is None:
        line += f"  {kernel.location}:{kernel.function_name}"  # a source or library file
    elif getattr(kernel, "fn", None) is not None and not kernel.fn.__module__.startswith("opforge."):
        line += f"  {kernel.fn.__module__}:{kernel.fn.__qualname__}"
    return line


def declare_ops(args: argparse.Namespace) -> None:
    """Import ``--import`` modules and load ``--load`` declaration files."""
    import opforge

    for name in args.modules:
        _import_user_module(name)
    for path in args.load:
        try:
            opforge.load_ops(path)
        except OpforgeError as exc:
            raise UsageError(str(exc)) from None


def run_ops(args: argparse.Namespace) -> int:
    import opforge

    declare_ops(args)
    for op in opforge.registered_ops():
        print(getattr(op, "schema", op.name))
        if getattr(op, "defined_at", None):
            print(f"    defined at: {op.defined_at}")
        if op.traits:
            print(f"    traits: {', '.join(sorted(op.traits))}")
        for kernel in op.kernels:
            print(_kernel_line(kernel))
        print(_sbp_line(op))
    return 0


def _sbp_line(op: Op) -> str:
    """The op's SBP signatures as far as they are known without shapes: a fixed list is shown
    (on inputs of unknown rank), a function or trait that needs shapes is named."""
    from opforge.spec import TensorSpec

    parts = ["elementwise splits"] if "elementwise" in op.traits else []
    declared = op.sbp_declaration
    if declared is not None and not callable(declared) and not op.variadic:
        try:
            signatures = op.sbp_signatures([TensorSpec(None)] * len(op.inputs))
            return "    sbp: " + " | ".join(parts + [str(s) for s in signatures])
        except OpforgeError:  # its outputs' ranks need attributes or shapes after all
            pass
    if declared is not None:
        parts.append("declared (depends on shapes)")
    if "no_side_effect" in op.traits:
        parts.append("all broadcast")
    return "    sbp: " + (" | ".join(parts) or "none (runs unsharded)")


# --------------------------------------------------------------------------
# opforge doctor


def add_doctor(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser("doctor", help="report compilers, CPU features, CUDA and the framework bridges")
    parser.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
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
    print(f"threads: {opforge.get_num_threads()} (OPFORGE_NUM_THREADS / opforge.set_num_threads)")
    for line in _framework_lines():
        print(line)
    return 0


def _framework_lines() -> Iterator[str]:
    """One line per optional framework: its version, and whether opforge's bridge to it works
    (an op run through it on a tiny input), or why not."""
    import importlib
    import importlib.metadata

    def version(distribution: str) -> str | None:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def bridge_torch() -> bool:
        import torch

        import opforge.torch  # noqa: F401 - registers every op with torch.library

        y = torch.ops.opforge.relu(torch.tensor([-1.0, 2.0]))
        return y.tolist() == [0.0, 2.0]  # type: ignore[no-any-return]  # torch is Any to mypy

    def bridge_jax() -> bool:
        import jax.numpy as jnp

        import opforge.jax  # noqa: F401 - opforge ops take JAX arrays as XLA FFI calls
        from opforge import ops

        return ops.relu(jnp.array([-1.0, 2.0])).tolist() == [0.0, 2.0]  # type: ignore[no-any-return]  # jax: Any

    def bridge_onnx() -> bool:
        import numpy as np
        import onnx
        from onnx import helper

        import opforge.onnx

        node = helper.make_node("Relu", ["x"], ["y"])
        x_info = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
        y_info = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
        model = helper.make_model(helper.make_graph([node], "doctor", [x_info], [y_info]))
        return (opforge.onnx.load(model)(np.array([-1.0, 2.0], np.float32)).tolist()  # type: ignore[no-any-return]
                == [0.0, 2.0])  # (a graph's outputs are Any to mypy)

    # JAX last: a compiler started after JAX's threads exist draws a fork warning from JAX
    checks = [("torch", "torch", bridge_torch), ("onnx", "onnx", bridge_onnx), ("onnxruntime", "onnxruntime", None),
              ("cupy", "cupy", None), ("jax", "jax", bridge_jax)]
    for name, distribution, check in checks:
        found = version(distribution) or (version("cupy-cuda12x") if name == "cupy" else None)
        if found is None:
            yield f"{name:>11}: not installed"
            continue
        if check is None:
            yield f"{name:>11}: {found}"
            continue
        try:
            works = check()
            yield f"{name:>11}: {found}, bridge {'works' if works else 'gave a wrong result'}"
        except Exception as error:  # noqa: BLE001 - doctor reports any failure instead of dying
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            yield f"{name:>11}: {found}, bridge fails: {type(error).__name__}: {first}"


# --------------------------------------------------------------------------
# opforge run / opforge convert (ONNX models; need the optional onnx package)


def add_run(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="run an ONNX model and print its outputs and latency",
        description="Load an ONNX model, run it once on the inputs given (random ones, seeded, for the "
                    "inputs not given) and print each output's name, shape and dtype with the latency of "
                    "the first run (load included). --bench runs it --repeat more times and prints the "
                    "median and minimum.")
    parser.add_argument("model", help="ONNX model file (.onnx), or an opforge graph JSON file (.json)")
    parser.add_argument("--input", dest="inputs", action="append", default=[], metavar="NAME=FILE.npy",
                        help="the array for the model input NAME, from a .npy file (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--threads", type=_positive_int, metavar="N",
                        help="threads for opforge's kernels and the BLAS behind matmul, gemm and conv "
                             "(opforge.set_num_threads; default: OPFORGE_NUM_THREADS, else every core)")
    _add_declaration_options(parser, models=True)
    parser.add_argument("--bench", action="store_true", help="time --repeat runs after the first")
    parser.add_argument("--repeat", type=_positive_int, default=10, metavar="N",
                        help="runs timed by --bench (default 10)")
    parser.set_defaults(func=run_run)


def _add_declaration_options(parser: argparse.ArgumentParser, models: bool = False) -> None:
    """--load and --import, which ``declare_ops`` reads (``models``: a command that loads a model)."""
    parser.add_argument("--load", action="append", default=[], metavar="FILE",
                        help="load op declarations (YAML or JSON) first"
                             + (", e.g. the ops of the model's custom domains" if models else "") + " (repeatable)")
    parser.add_argument("--import", dest="modules", action="append", default=[], metavar="MODULE",
                        help="import a Python module that declares ops"
                             + (" (or registers converters) first" if models else "")
                             + ", found from the current folder (repeatable)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def set_threads(count: int) -> None:
    """Run opforge's kernels (the products of its linear ops included) on ``count`` threads, now and in
    child processes."""
    from .runtime.parallel import set_num_threads

    os.environ["OPFORGE_NUM_THREADS"] = str(count)
    set_num_threads(count)


def _onnx() -> Any:
    try:
        import opforge.onnx
    except ImportError as exc:
        raise UsageError(f"ONNX models need the onnx package (pip install \"opforge[onnx]\"): {exc}") from None
    return opforge.onnx


def _load_model(args: argparse.Namespace) -> Any:
    """The model of ``args.model`` as a Graph, once the ops of ``--import`` / ``--load`` are declared."""
    if not os.path.isfile(args.model):
        raise UsageError(f"no model file at {args.model!r}")
    declare_ops(args)
    if args.model.lower().endswith(".json"):  # convert: a graph to export
        from .graph import Graph

        return Graph.load(args.model)
    return _onnx().load(args.model)


def _graph_input_names(graph: Graph) -> list[str]:
    names = getattr(graph, "input_names", None)
    return list(names) if names is not None else [v.name for v in graph.inputs]


def _given_inputs(pairs: list[str], names: list[str]) -> dict[str, np.ndarray[Any, Any]]:
    import numpy as np

    given = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input {pair}: expected NAME=FILE.npy")
        if name not in names:
            raise UsageError(f"--input {pair}: the model has no input {name!r}; its inputs: {', '.join(names)}")
        try:
            given[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:  # EOFError: an empty file
            raise UsageError(f"--input {pair}: cannot read {path!r} as a .npy array: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
    return given


def _random_input(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """A random array for ``spec``: unknown dims are 1; floats normal, integers in [0, 10), bools fair."""
    import numpy as np

    shape = tuple(d if d >= 0 else 1 for d in spec.shape)
    dtype = np.dtype(spec.dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 10, shape).astype(dtype)


def _model_inputs(graph: Graph, args: argparse.Namespace) -> list[np.ndarray[Any, Any]]:
    import numpy as np

    names = _graph_input_names(graph)
    given = _given_inputs(args.inputs, names)
    rng = np.random.default_rng(args.seed)
    arrays = []
    for name, value in zip(names, graph.inputs):
        spec = value.spec
        if name in given:
            array = given[name]
            if array.dtype.name != spec.dtype or not spec.matches(array.shape):
                raise UsageError(f"input {name!r} is {spec.dtype} {_dims(spec.shape)} in the model; the file "
                                 f"given holds {array.dtype} {list(array.shape)}")
        else:
            if spec.rank is None:
                raise UsageError(f"input {name!r} has unknown rank: give it with --input {name}=FILE.npy")
            array = _random_input(spec, rng)
            print(f"input {name}: not given, random {spec.dtype} {list(array.shape)} (seed {args.seed})")
        arrays.append(array)
    return arrays


def _dims(shape: Sequence[int]) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


def run_run(args: argparse.Namespace) -> int:
    import numpy as np

    if args.threads is not None:
        set_threads(args.threads)
    start = time.perf_counter()
    graph = _load_model(args)
    loaded = time.perf_counter()
    arrays = _model_inputs(graph, args)
    before_run = time.perf_counter()
    outputs = graph(*arrays)
    first = time.perf_counter()
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    names = getattr(graph, "output_names", None) or [v.name for v in graph.outputs]
    for name, output in zip(names, outputs):
        output = np.asarray(output)
        line = f"output {name}: shape {list(output.shape)}, {output.dtype}"
        if output.size and output.dtype.kind in "fiub":
            values = output.astype(np.float64)
            line += f", min {values.min():.6g}, max {values.max():.6g}, mean {values.mean():.6g}"
        print(line)
    print(f"latency: load {1e3 * (loaded - start):.2f} ms, first run {1e3 * (first - before_run):.2f} ms "
          f"(load + first run {1e3 * (loaded - start + first - before_run):.2f} ms)")
    if args.bench:
        times = []
        for _ in range(args.repeat):
            begin = time.perf_counter()
            graph(*arrays)
            times.append(time.perf_counter() - begin)
        print(f"bench: {args.repeat} runs, median {1e3 * float(np.median(times)):.3f} ms, "
              f"min {1e3 * min(times):.3f} ms")
    return 0


def add_convert(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert an ONNX model into an opforge graph JSON file, or back",
        description="Load an ONNX model and write it as an opforge graph (Graph.save), which "
                    "opforge.Graph.load reads back without the onnx package. An output ending in .onnx "
                    "is written as an ONNX model instead (opforge.onnx.export), from a model or a graph "
                    "JSON file (.json).")
    parser.add_argument("model", help="ONNX model file (.onnx), or a graph JSON file (.json) to export")
    parser.add_argument("output", help="graph JSON file to write (.onnx: the exported ONNX model)")
    parser.add_argument("--opset", type=_positive_int, default=17,
                        help="the ai.onnx opset of an exported model (default 17)")
    _add_declaration_options(parser, models=True)
    parser.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    graph = _load_model(args)
    if args.output.lower().endswith(".onnx"):
        model = _onnx().export(graph, args.output, opset=args.opset)
        print(f"{args.output}: {len(model.graph.input)} input(s), {len(model.graph.node)} node(s), "
              f"{len(model.graph.output)} output(s), opset {args.opset}")
        return 0
    if not hasattr(graph, "save"):  # an onnx.DynamicModel: a graph per input signature, none to save
        raise GraphError(f"{args.model}: model '{graph.name}' computes its shapes at run time, so it converts per "
                         f"input signature, not into one graph file; run it with 'opforge run' ({graph.reason})")
    graph.save(args.output)
    print(f"{args.output}: {len(graph.inputs)} input(s), {len(graph.nodes)} node(s), "
          f"{len(graph.outputs)} output(s)")
    return 0


# --------------------------------------------------------------------------

SUBCOMMANDS: list[Callable[[_Subparsers], None]] = [add_build, add_cache, add_include, add_ops, add_doctor, add_run,
                                                    add_convert]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opforge",
        description="Build, cache and inspect opforge kernel libraries; run and convert ONNX models.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"opforge {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def _attach_flag_values(argv: Sequence[str]) -> list[str]:
    """``--cflags -DX`` as ``--cflags=-DX``: argparse would take ``-DX`` for an option."""
    joined: list[str] = []
    words = iter(argv)
    for word in words:
        value = next(words, None) if word == "--cflags" else None
        joined.append(word if value is None else f"{word}={value}")
    return joined


def _one_line(error: BaseException) -> str:
    """The error's first line (a schema error's column pointer is left out); a compile
    error keeps the compiler's output below it."""
    text = str(error).strip() or type(error).__name__
    return text if isinstance(error, CompileError) else text.splitlines()[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = make_parser()
    args = parser.parse_args(_attach_flag_values(sys.argv[1:] if argv is None else argv))
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        status = func(args)
    except KeyboardInterrupt:
        return 130
    except UsageError as exc:
        print(f"opforge {args.command}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (OpforgeError, OSError) as exc:
        print(f"opforge {args.command}: {_one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug: still one line, with what it was
        print(f"opforge {args.command}: internal error, {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 1
    return 0 if status is None else int(status)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
