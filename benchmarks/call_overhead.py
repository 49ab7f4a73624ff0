"""Benchmark opforge's per-call overhead on a tiny CPU kernel.

    python benchmarks/call_overhead.py [--rounds N] [--number N]

What is measured
----------------
One compiled kernel, ``benchmarks/sources/add.cc:Add`` (``y = a + b`` on four
float32 values, MindSpore's aot ABI), is called in several ways; the kernel
itself does almost nothing, so each figure is the cost of the call path:

* ``opforge.Custom``          -- ``op(a, b)`` on an op declared MindSpore-style
  with ``Custom(..., out_shape=[4], out_dtype="float32", reg_info=CustomRegOp(...))``;
  allocates its output every call.  This is the headline.
* ``opforge.Op + AotKernel``  -- the same call on an op declared directly with
  ``opforge.Op``, ``opforge.AotKernel`` and ``def_infer`` (the other
  declaration route; both end in the same native ``Launcher``).
* ``opforge Launcher direct`` -- the op's native launcher called without
  ``Op.__call__`` in front of it (informational: the cost of that Python frame).
* ``ctypes, output allocated per call`` -- a hand-written ctypes binding of the
  same library (``op.aot_kernel.library.path``) with argtypes set (POINTER types
  for the 7-argument ABI) and every argument array precomputed; per call it
  allocates a fresh 4-float output, stores its address in ``params[2]``,
  calls, and checks the return code.  This is the baseline: it does the work
  ``op(a, b)`` must do.  The output is allocated the cheapest way we found
  that still yields a NumPy array -- ``buf = (c_float * 4)()``,
  ``out = np.frombuffer(buf, np.float32)``, ``params[2] = addressof(buf)``
  (about 0.28 us) -- so a slow idiom does not flatter opforge.  The usual
  ``out = np.empty(4, np.float32)`` + ``out.ctypes.data`` (about 1 us more)
  is shown as an informational row.
* ``ctypes, output preallocated`` -- the same binding writing into one fixed
  output array: the bare ctypes call.
* ``ctypes no argtypes`` rows (informational) -- the same two calls through a
  function object without ``argtypes``.  The arguments are already ctypes
  pointer objects, so ctypes can pass them as they are; with ``argtypes`` set
  it runs a ``from_param`` conversion per argument, which on CPython 3.11
  costs about 0.5 us per call.  These rows are the strongest ctypes baseline.
* ``np.add(a, b)`` -- NumPy's allocating add: the floor for "a small array op
  from Python".  ``np.empty(4, float32)`` alone is shown for reference.
* ``torch.add`` on 4-element tensors, when torch is importable.

How
---
Every variant is a ``timeit.Timer`` over a short statement (no lambda
around it), warmed up, then timed in ``--rounds`` interleaved rounds of
``--number`` calls: round r times every variant once, in a rotated order, so
slow phases of a noisy machine hit all variants alike.  A variant's figure is
its fastest round (the median round is printed next to it).  Only ratios
between figures from this one run are meaningful; absolute nanoseconds move
from machine to machine and run to run.  The garbage collector is off while
timing (timeit's default), for every variant alike.

Targets: Custom / ctypes(allocating) <= 1.0 and Custom / np.add <= 3.5.

The build cache goes to a temporary folder (removed at exit) unless
``OPFORGE_CACHE_DIR`` is set.  Output ends with

    call_styles_vs_positional: <ratio>   (the worst call style; goal <= 1.2)
    call_overhead_vs_np_add: <ratio>
    call_overhead_vs_ctypes: <ratio>
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
KERNEL_SOURCE = HERE / "sources" / "add.cc"

if not os.environ.get("OPFORGE_CACHE_DIR"):
    _cache = tempfile.mkdtemp(prefix="opforge-bench-cache-")
    os.environ["OPFORGE_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, True)

try:
    import opforge  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent / "src"))

import opforge  # noqa: E402
from opforge import AotKernel, Custom, CustomRegOp, DataType, Op, TensorSpec  # noqa: E402

N = 4
HEADLINE = "opforge.Custom  op(a, b)"
BASELINE = "ctypes, output allocated per call"
FLOOR = "np.add(a, b)"


def make_custom_op():
    reg_info = (CustomRegOp("bench_add")
                .input(0, "a")
                .input(1, "b")
                .output(0, "y")
                .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default)
                .target("CPU")
                .get_op_info())
    return Custom(f"{KERNEL_SOURCE}:Add", out_shape=[N], out_dtype="float32", reg_info=reg_info)


def make_plain_op():
    """The same op through the core API: Op + AotKernel + def_infer."""
    op = Op("bench_add_op", ["a", "b"], ["y"])
    op.add_kernel(AotKernel(f"{KERNEL_SOURCE}:Add", device="cpu",
                            dtypes=[("float32", "float32", "float32")]).load())

    @op.def_infer
    def _infer(*specs, **attrs):
        # def_infer calls fn(*input_specs, **attrs); an older contract was
        # fn(specs_list, attrs_dict) -- accept both, the op is the same.
        a_spec = specs[0][0] if isinstance(specs[0], list) else specs[0]
        return [TensorSpec(a_spec.shape, "float32")]

    return op


def make_ctypes_binding(library_path, a, b):
    """A hand-written ctypes binding of ``Add`` with every argument precomputed.

    Two ``params`` arrays: ``params_pre`` points at one fixed output array;
    ``params`` gets its output slot rewritten by each allocating call.  They
    must differ, or a preallocated call would write through a pointer that an
    allocating call left behind (to an output that is gone by then).
    """
    lib = ctypes.CDLL(str(library_path))
    fn = lib.Add
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
                   ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.c_char_p),
                   ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    # The same function without argtypes (lib["Add"] is a fresh function object;
    # lib.Add is cached): ctypes then passes the precomputed pointer objects
    # as they are, skipping a from_param() conversion per argument.
    bare = lib["Add"]
    bare.restype = ctypes.c_int
    out_pre = np.empty(N, np.float32)
    params_pre = (ctypes.c_void_p * 3)(a.ctypes.data, b.ctypes.data, out_pre.ctypes.data)
    params = (ctypes.c_void_p * 3)(a.ctypes.data, b.ctypes.data, out_pre.ctypes.data)
    ndims = (ctypes.c_int * 3)(1, 1, 1)
    dims = [(ctypes.c_int64 * 1)(N) for _ in range(3)]
    shapes = (ctypes.POINTER(ctypes.c_int64) * 3)(*[ctypes.cast(d, ctypes.POINTER(ctypes.c_int64)) for d in dims])
    dtypes = (ctypes.c_char_p * 3)(b"float32", b"float32", b"float32")

    def pointer(array, ctype):  # exact pointer instances: ctypes passes them without conversion
        return ctypes.cast(array, ctypes.POINTER(ctype))

    return {
        "lib": lib, "fn": fn, "bare": bare, "out_pre": out_pre, "params": params,
        "keep": (params_pre, ndims, dims, shapes, dtypes),
        "pp_pre": pointer(params_pre, ctypes.c_void_p), "pp": pointer(params, ctypes.c_void_p),
        "pn": pointer(ndims, ctypes.c_int), "ps": pointer(shapes, ctypes.POINTER(ctypes.c_int64)),
        "pd": pointer(dtypes, ctypes.c_char_p),
    }


def time_variants(variants, namespace, rounds, number):
    """{name: [seconds per call, one per round]}, rounds interleaved across variants."""
    timers = {name: timeit.Timer(stmt, globals=namespace) for name, stmt in variants.items()}
    for timer in timers.values():  # warm-up: caches, branch predictors, allocator pools
        timer.timeit(max(number // 4, 100))
    results = {name: [] for name in timers}
    names = list(timers)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(timers[name].timeit(number) / number)
    return results


# Each call style against the positional call of the same op object (the goal: within 1.2x).  Two costs
# are the caller's, not opforge's: building the list literal (about 30 ns), and fetching `ops.NAME` (about
# 11 ns, a module attribute).
CALL_STYLES = {  # name -> (statement, the positional statement it is measured against)
    "op(x, alpha=0.1)  keyword attribute": ("leaky(a, alpha=0.1)", "leaky(a)"),
    "op(m, axes=[0, 1])  list attribute": ("reduce(m, axes=[0, 1])", "reduce(m)"),  # both sum all of m
    "ops.add(a, b)  functional API": ("ops.add(a, b)", "add(a, b)"),
    "ops.leaky_relu(x, alpha=0.1)  functional, keyword": ("ops.leaky_relu(a, alpha=0.1)", "leaky(a)"),
}


def call_styles(a, b, rounds, number):
    """{name: (best seconds per call, best seconds of its positional call)} for the built-in ops' call styles."""
    from opforge import ops

    namespace = {"a": a, "b": b, "m": a.reshape(2, 2), "ops": ops, "leaky": opforge.lookup("leaky_relu"),
                 "reduce": opforge.lookup("reduce_sum"), "add": opforge.lookup("add")}
    statements = {stmt: stmt for pair in CALL_STYLES.values() for stmt in pair}
    for stmt in statements:
        eval(stmt, namespace)  # plans and launchers made before timing
    best = {stmt: min(times) for stmt, times in time_variants(statements, namespace, rounds, number).items()}
    return {name: (best[stmt], best[positional]) for name, (stmt, positional) in CALL_STYLES.items()}


def print_call_styles(styles):
    print()
    print("call styles of built-in ops on 4 float32 values (fastest round), against the op's positional call:")
    for name, (seconds, positional) in styles.items():
        print(f"  {name:<44} {seconds * 1e9:7.1f} ns  positional {positional * 1e9:7.1f} ns  "
              f"ratio {seconds / positional:.2f}")
    print(f"call_styles_vs_positional: {max(s / p for s, p in styles.values()):.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=25, help="interleaved timing rounds (default 25)")
    parser.add_argument("--number", type=int, default=20000, help="calls per round per variant (default 20000)")
    args = parser.parse_args(argv)

    a = np.arange(1, N + 1, dtype=np.float32)
    b = np.full(N, 0.5, np.float32)
    expected = a + b

    custom = make_custom_op()
    plain = make_plain_op()
    library_path = custom.aot_kernel.library.path
    binding = make_ctypes_binding(library_path, a, b)

    # Correctness first, which also makes each op build its launcher and plan.
    for name, op in (("Custom", custom), ("Op", plain)):
        for _ in range(3):
            got = op(a, b)
            if not (isinstance(got, np.ndarray) and got.dtype == np.float32 and np.array_equal(got, expected)):
                raise SystemExit(f"{name} op returned {got!r}, expected {expected!r}")
    # The op's native launcher (a private attribute: if it moves, skip that row).
    launcher = getattr(custom, "_default_launcher", None)
    launcher_calls = launcher.stats["misses"] if launcher is not None else None

    namespace = {
        "a": a, "b": b, "np": np, "empty": np.empty, "f32": np.float32, "add": np.add,
        "custom": custom, "plain": plain, "launcher": launcher,
        "C4": ctypes.c_float * N, "frombuffer": np.frombuffer, "addressof": ctypes.addressof,
        **{k: binding[k] for k in ("fn", "bare", "params", "pp_pre", "pp", "pn", "ps", "pd")},
    }
    check = ": raise RuntimeError('kernel failed')"
    alloc = "buf = C4()\nout = frombuffer(buf, f32)\nparams[2] = addressof(buf)\n"
    variants = {  # name -> statement; "(info)" rows explain, they are not targets
        HEADLINE: "out = custom(a, b)",
        "opforge.Op + AotKernel  op(a, b)": "out = plain(a, b)",
        BASELINE: alloc + "if fn(3, pp, pn, ps, pd, None, None)" + check,
        "ctypes, output preallocated": "if fn(3, pp_pre, pn, ps, pd, None, None)" + check,
        "ctypes, alloc np.empty + .ctypes.data (info)":
            "out = empty(4, f32)\nparams[2] = out.ctypes.data\nif fn(3, pp, pn, ps, pd, None, None)" + check,
        "ctypes no argtypes, alloc (info)": alloc + "if bare(3, pp, pn, ps, pd, None, None)" + check,
        "ctypes no argtypes, prealloc (info)": "if bare(3, pp_pre, pn, ps, pd, None, None)" + check,
        FLOOR: "out = add(a, b)",
        "np.empty(4, float32) (info)": "out = empty(4, f32)",
        "timeit loop, empty statement (info)": "pass",
    }
    if launcher is not None:
        variants = dict(list(variants.items())[:2] + [("opforge Launcher direct (info)", "out = launcher(a, b)")]
                        + list(variants.items())[2:])
    else:
        print("note: Custom op has no _default_launcher attribute; skipping the 'Launcher direct' row")
    # Every statement that computes a + b must get it right (once, before timing).
    for name, stmt in variants.items():
        if "empty" in name or "loop" in name:
            continue
        binding["out_pre"][:] = 0
        scope = dict(namespace)
        exec(stmt, scope)
        got = scope.get("out", binding["out_pre"])
        if not (isinstance(got, np.ndarray) and got.dtype == np.float32 and np.array_equal(got, expected)):
            raise SystemExit(f"variant {name!r} computed {got!r}, expected {expected!r}")

    try:
        import torch
    except ImportError:
        print("note: torch is not installed; skipping the torch.add variant")
    else:
        namespace.update(torch=torch, ta=torch.from_numpy(a.copy()), tb=torch.from_numpy(b.copy()))
        variants["torch.add(ta, tb)"] = "out = torch.add(ta, tb)"
        # torch CPU tensors in, a torch tensor out, through DLPack (no copies; see runtime/arrays.py).
        if not torch.equal(custom(namespace["ta"], namespace["tb"]), torch.from_numpy(expected)):
            raise SystemExit("custom(ta, tb) on torch tensors computed the wrong result")
        variants["custom(ta, tb) on torch CPU tensors"] = "out = custom(ta, tb)"

    results = time_variants(variants, namespace, args.rounds, args.number)
    styles = call_styles(a, b, args.rounds, args.number)
    best = {name: min(times) for name, times in results.items()}
    median = {name: statistics.median(times) for name, times in results.items()}

    if launcher is not None and launcher.stats["misses"] != launcher_calls:
        print(f"warning: Custom's launcher planned {launcher.stats['misses'] - launcher_calls} more time(s) while "
              "timing; expected none (the fast path was missed)")

    print(f"opforge {opforge.__version__}, numpy {np.__version__}, Python {sys.version.split()[0]}")
    print(f"kernel: {KERNEL_SOURCE}:Add, library: {library_path}")
    print(f"{args.rounds} interleaved rounds x {args.number} calls per variant; "
          "ns/call = fastest round (median round in brackets)\n")
    width = max(len(name) for name in best)
    print(f"{'variant':<{width}}  {'ns/call':>9} {'(median)':>10}  {'vs ctypes(alloc)':>16}  {'vs np.add':>9}")
    print("-" * (width + 52))
    for name in variants:
        print(f"{name:<{width}}  {best[name] * 1e9:9.1f} {f'({median[name] * 1e9:.1f})':>10}  "
              f"{best[name] / best[BASELINE]:16.2f}  {best[name] / best[FLOOR]:9.2f}")
    print()
    print_call_styles(styles)
    print()
    print(f"call_overhead_vs_np_add: {best[HEADLINE] / best[FLOOR]:.2f}")
    print(f"call_overhead_vs_ctypes: {best[HEADLINE] / best[BASELINE]:.2f}")
    if "torch.add(ta, tb)" in best:
        print(f"torch_cpu_call_vs_torch_add: "
              f"{best['custom(ta, tb) on torch CPU tensors'] / best['torch.add(ta, tb)']:.2f}")


if __name__ == "__main__":
    main()
