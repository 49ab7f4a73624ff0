"""Host time of opforge's call path on GPU arrays, measured without a GPU.

    python benchmarks/device_call_host.py [--rounds N] [--number N]

What is measured
----------------
The CUDA runtime is the tests' fake (``tests/kernels/fake_cudart.c``, built
with ``opforge.build``): device memory is host memory and every runtime call
returns at once.  So this measures what opforge does on the host for one call
on GPU arrays -- DLPack in with the caller's stream, two outputs of the pool,
the kernel call, the launch check, DLPack out -- and nothing of CUDA; figures
on a GPU machine come from ``benchmarks/gpu.py``.  The kernel
(``y = a + b`` on 4 float32 values, the aot ABI) returns at once.

The arrays are a minimal DLPack array type: ``__dlpack__`` hands out a capsule
of an export made once, and ``from_dlpack`` wraps an export without reading it,
so the producer and the consumer cost as little as they can (CuPy's and torch's
own cost more, and come on top on a GPU).

Variants:

* ``opforge op(a, b)`` -- the op called on the arrays; after its first call a
  call like it runs in C (the launcher's remembered routes).
* ``opforge, worked out in Python`` -- the Python path every call
  (``planner.prepare``: placement, stream, views, plan, pool, kernel, exports),
  what a first call, a call with scalars or a new signature takes.
* ``ctypes, pointers ready`` -- the kernel function called through ctypes with
  its parameters built once (inputs' and a preallocated output's pointers):
  what a launch with everything known costs, the floor.

Each is a ``timeit.Timer`` warmed up, then timed in ``--rounds`` interleaved
rounds of ``--number`` calls; a figure is its fastest round.  Only the ratios
of one run mean anything.  The last lines:

    device_call_python_vs_route: <Python path / remembered call>
    device_call_host_vs_ctypes: <remembered call / ctypes>
"""
import argparse
import ctypes
import os
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import opforge
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))
    import opforge
import numpy as np

os.environ.setdefault("OPFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="opforge-bench-"))

KERNEL = r"""
#include <cstdint>
extern "C" int AddF32(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  return 0;
}
"""


class DeviceArray:
    """A 'CUDA' array of host memory through DLPack: the cheapest producer and consumer."""

    def __init__(self, export, owner=None):
        self.export, self.owner = export, owner

    def __dlpack_device__(self):
        return self.export.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self.export.__dlpack__(stream=stream, max_version=max_version)


def from_dlpack(exported, stream=None):
    return DeviceArray(exported)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()

    fake = opforge.build(ROOT / "tests" / "kernels" / "fake_cudart.c")
    os.environ["OPFORGE_CUDART"] = str(fake.path)
    from opforge import _native
    from opforge.runtime import dispatch

    module = type(sys)("device_arrays")  # opforge hands outputs back through the arrays' module
    module.from_dlpack, DeviceArray.__module__ = from_dlpack, "device_arrays"
    sys.modules["device_arrays"] = module

    source = Path(os.environ["OPFORGE_CACHE_DIR"]) / "device_add.cc"
    source.write_text(KERNEL)
    op = opforge.op("bench_device::add(Tensor a, Tensor b) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{source}:AddF32", device="gpu")

    host = [np.ones(4, np.float32) for _ in range(3)]
    a, b = (DeviceArray(_native.DLPackExport(h.ctypes.data, h.shape, "float32", 2, 0, h)) for h in host[:2])
    op(a, b)
    planner = dispatch.launcher_for(op, op.resolve_attrs({}), 2).planner
    pair = (a, b)

    library = ctypes.CDLL(str(op.kernels[0].library.path))  # the very library the op calls
    function = library.AddF32
    function.restype = ctypes.c_int
    params = (ctypes.c_void_p * 3)(host[0].ctypes.data, host[1].ctypes.data, host[2].ctypes.data)
    ndims = (ctypes.c_int * 3)(1, 1, 1)
    dims = (ctypes.c_int64 * 1)(4)
    shapes = (ctypes.POINTER(ctypes.c_int64) * 3)(dims, dims, dims)
    names = (ctypes.c_char_p * 3)(b"float32", b"float32", b"float32")
    stream = ctypes.c_void_p(0)

    variants = {
        "opforge op(a, b)": ("op(a, b)", {"op": op, "a": a, "b": b}),
        "opforge, worked out in Python": ("prepare(pair)", {"prepare": planner.prepare, "pair": pair}),
        "ctypes, pointers ready": ("function(3, params, ndims, shapes, names, stream, None)",
                                   {"function": function, "params": params, "ndims": ndims, "shapes": shapes,
                                    "names": names, "stream": stream}),
    }
    timers = {name: timeit.Timer(statement, globals=names_) for name, (statement, names_) in variants.items()}
    for timer in timers.values():
        timer.timeit(args.number // 10)
    rounds: dict[str, list[float]] = {name: [] for name in timers}
    order = list(timers)
    for r in range(args.rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            rounds[name].append(timers[name].timeit(args.number) / args.number * 1e9)
    best = {name: min(times) for name, times in rounds.items()}
    routes = planner.device_routes.stats
    print(f"{'variant':34s} {'ns/call':>9s} {'median':>9s}")
    for name, times in rounds.items():
        print(f"{name:34s} {best[name]:9.0f} {sorted(times)[len(times) // 2]:9.0f}")
    print(f"(remembered routes {routes['routes']}, calls taken in C {routes['hits']}; fake runtime: {fake.path.name})")
    assert routes["hits"] > args.number, "the op's calls did not run through its remembered route"
    print(f"device_call_python_vs_route: {best['opforge, worked out in Python'] / best['opforge op(a, b)']:.2f}")
    print(f"device_call_host_vs_ctypes: {best['opforge op(a, b)'] / best['ctypes, pointers ready']:.2f}")


if __name__ == "__main__":
    main()
