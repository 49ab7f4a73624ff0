"""GPU figures: opforge's call path on device arrays against CuPy and PyTorch.

    python benchmarks/gpu.py [--repeats N]

1. Per-call time of a 4-element float32 add, ``y = a + b``: one CUDA kernel
   source, called
   * through opforge (an op whose GPU kernel is that source on the aot ABI)
     on CuPy arrays and on torch CUDA tensors -- each call allocates its
     output from opforge's pool;
   * by CuPy's ``RawKernel`` (the same ``__global__`` function, NVRTC-compiled)
     into a preallocated output: a bare launch, the floor;
   * ``torch.add`` (allocating, PyTorch's caching allocator).
2. Bandwidth of an add on 16M float32 elements (3 x 64 MiB moved per call)
   on torch tensors: opforge's built-in ``ops.add`` (the ratio) and the
   benchmark's kernel above, against ``torch.add``.
3. A chain of 50 small ops (relu, neg, add, mul on 64 elements) traced as an
   opforge graph -- replayed as one captured CUDA graph -- against the same 50
   torch ops called eagerly.

Timing: small calls are timed as ``--number`` back-to-back calls between two
synchronizations (wall clock, ``time.perf_counter``), large ones between two
CUDA events on the stream they run on; each figure is the median of
``--repeats`` such loops, and the variants alternate loop by loop so a noisy
phase hits all alike.  Only ratios within one run mean anything.

The last lines are

    gpu_call_vs_raw_launch: <opforge on CuPy / RawKernel>       (goal <= 1.0)
    gpu_call_vs_torch_add: <opforge on torch / torch.add>
    gpu_add_bandwidth_vs_torch: <ops.add GB/s / torch.add GB/s>  (goal >= 0.95)
    gpu_graph_vs_torch_eager: <graph per chain / eager torch per chain>

A ratio whose framework is missing reads ``n/a (<reason>)``.  Without a CUDA
device (or without nvcc, which builds the kernel) the script prints why and
exits 0.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    import opforge
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    import opforge
import numpy as np

from opforge.runtime import dispatch

os.environ.setdefault("OPFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="opforge-bench-"))

# The __global__ function alone is what RawKernel compiles (NVRTC: no host code, no headers).
DEVICE_ADD = r"""
extern "C" __global__ void add_f32(const float *a, const float *b, float *y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long stride = (long long)blockDim.x * gridDim.x;
  for (; i < n; i += stride) y[i] = a[i] + b[i];
}
"""
THREADS = 256
MAX_BLOCKS = 65536

# The opforge kernel: the same __global__ function, launched with the same configuration.
AOT_ADD = DEVICE_ADD + (r"""
#include <cstdint>
extern "C" int AddF32(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  long long n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  long long blocks = (n + %(threads)d - 1) / %(threads)d;
  blocks = blocks < 1 ? 1 : (blocks > %(max_blocks)d ? %(max_blocks)d : blocks);
  add_f32<<<(unsigned)blocks, %(threads)d, 0, (cudaStream_t)stream>>>(
      (const float *)params[0], (const float *)params[1], (float *)params[2], n);
  return 0;
}
""" % {"threads": THREADS, "max_blocks": MAX_BLOCKS})

SMALL, LARGE, CHAIN = 4, 16 * 1024 * 1024, 50


def blocks_for(n):
    return max(1, min(MAX_BLOCKS, -(-n // THREADS)))


def skip(reason):
    print(f"benchmarks/gpu.py: skipped: {reason}")
    sys.exit(0)


def median_per_call(loops, repeats):
    """{name: median seconds per call} for ``loops``: name -> (run N calls, N), alternated per repeat."""
    times = {name: [] for name in loops}
    for _ in range(repeats):
        for name, (run, number) in loops.items():
            times[name].append(run() / number)
    return {name: statistics.median(t) for name, t in times.items()}


def wall_loop(call, sync, number):
    """Seconds for ``number`` calls between two synchronizations."""
    def run():
        sync()
        start = time.perf_counter()
        for _ in range(number):
            call()
        sync()
        return time.perf_counter() - start
    return run, number


def event_loop(call, make_event, number):
    """Seconds for ``number`` calls between two CUDA events on the current stream."""
    def run():
        start, end = make_event(), make_event()
        start.record()
        for _ in range(number):
            call()
        end.record()
        end.synchronize()
        return start_elapsed(start, end) / 1e3
    return run, number


def start_elapsed(start, end):
    """Milliseconds between two events (torch: start.elapsed_time(end); CuPy: cupy.cuda.get_elapsed_time)."""
    if hasattr(start, "elapsed_time"):
        return start.elapsed_time(end)
    import cupy

    return cupy.cuda.get_elapsed_time(start, end)


def chain(x, y, lib):
    """The graph benchmark's 50 ops: ``lib`` is opforge.ops or torch."""
    for k in range(CHAIN):
        step = k % 4
        if step == 0:
            x = lib.relu(x)
        elif step == 1:
            x = lib.neg(x)
        elif step == 2:
            x = lib.add(x, y)
        else:
            x = lib.mul(x, y)
    return x


def load_torch():
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, f"this PyTorch ({torch.__version__}) has no CUDA"
    return torch, None


def load_cupy():
    try:
        import cupy
    except ImportError:
        return None, "CuPy is not installed"
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # CuPy built for another CUDA, or no driver
        return None, f"CuPy cannot use the GPU: {error}"
    return cupy, None


def make_add_op():
    op = opforge.op("bench::gpu_add(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(code=AOT_ADD, function="AddF32", device="gpu", dtypes={"a": ["float32"], "b": ["float32"]})
    return op


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed loops per variant (median taken)")
    parser.add_argument("--number", type=int, default=2000, help="calls per loop for the 4-element add")
    args = parser.parse_args()

    from opforge.runtime import cuda

    if cuda.device_count() == 0:
        skip("no CUDA device (opforge.cuda.device_count() == 0); the GPU figures need one")
    from opforge.runtime.compilers import find_compiler

    try:
        find_compiler("cuda")
    except opforge.OpforgeError as error:
        skip(f"nvcc is needed to build the benchmark's kernel: {error}")
    torch, no_torch = load_torch()
    cupy, no_cupy = load_cupy()
    if torch is None and cupy is None:
        skip(f"neither framework can give device arrays ({no_torch}; {no_cupy})")

    add = make_add_op()
    print(f"device: {cuda_device_name(torch, cupy)}")
    ratios = {}

    # 1. a 4-element add, per call
    loops, checks = {}, []
    if cupy is not None:
        a = cupy.arange(SMALL, dtype=cupy.float32)
        b = cupy.full(SMALL, 0.5, dtype=cupy.float32)
        out = cupy.empty_like(a)
        raw = cupy.RawKernel(DEVICE_ADD, "add_f32")
        grid, n = (blocks_for(SMALL),), np.int64(SMALL)

        def launch():
            raw(grid, (THREADS,), (a, b, out, n))

        sync = cupy.cuda.get_current_stream().synchronize
        checks.append((add(a, b), a + b, cupy.asnumpy))
        launch()
        checks.append((out, a + b, cupy.asnumpy))
        loops["opforge on CuPy arrays"] = wall_loop(lambda: add(a, b), sync, args.number)
        loops["CuPy RawKernel, preallocated output"] = wall_loop(launch, sync, args.number)
    if torch is not None:
        ta = torch.arange(SMALL, dtype=torch.float32, device="cuda")
        tb = torch.full((SMALL,), 0.5, device="cuda")
        checks.append((add(ta, tb), ta + tb, lambda t: t.cpu().numpy()))
        loops["opforge on torch CUDA tensors"] = wall_loop(lambda: add(ta, tb), torch.cuda.synchronize, args.number)
        loops["torch.add"] = wall_loop(lambda: torch.add(ta, tb), torch.cuda.synchronize, args.number)
    for got, expected, host in checks:
        np.testing.assert_array_equal(host(got), host(expected))
    for name, (run, _) in loops.items():  # warm-up: compile, pools, caches
        run()
    small = median_per_call(loops, args.repeats)
    print(f"\n{SMALL}-element float32 add, per call (median of {args.repeats} loops of {args.number}):")
    for name, seconds in small.items():
        print(f"  {name:40s} {seconds * 1e6:8.2f} us")
    # Calls after the first run in C when their launcher remembers them (runtime.device_call): say whether they did.
    routes = dispatch.launcher_for(add, add.resolve_attrs({}), 2).planner.device_routes.stats
    print(f"  (the op's remembered calls: {routes['routes']}, calls they took in C: {routes['hits']})")
    if cupy is not None:
        ratios["gpu_call_vs_raw_launch"] = small["opforge on CuPy arrays"] / small[
            "CuPy RawKernel, preallocated output"]
    else:
        ratios["gpu_call_vs_raw_launch"] = f"n/a ({no_cupy})"
    if torch is not None:
        ratios["gpu_call_vs_torch_add"] = small["opforge on torch CUDA tensors"] / small["torch.add"]
    else:
        ratios["gpu_call_vs_torch_add"] = f"n/a ({no_torch})"

    # 2. bandwidth, 16M elements
    if torch is not None:
        la = torch.rand(LARGE, device="cuda")
        lb = torch.rand(LARGE, device="cuda")
        torch.testing.assert_close(add(la, lb), la + lb, rtol=0, atol=0)
        torch.testing.assert_close(opforge.ops.add(la, lb), la + lb, rtol=0, atol=0)
        make_event = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        number = 20
        big = {"opforge ops.add (built-in)": event_loop(lambda: opforge.ops.add(la, lb), make_event, number),
               "opforge, the benchmark's kernel": event_loop(lambda: add(la, lb), make_event, number),
               "torch.add": event_loop(lambda: torch.add(la, lb), make_event, number)}
        for run, _ in big.values():
            run()
        times = median_per_call(big, args.repeats)
        moved = 3 * LARGE * 4
        print(f"\n{LARGE // (1024 * 1024)}M-element float32 add (median of {args.repeats} loops of {number}):")
        for name, seconds in times.items():
            print(f"  {name:40s} {seconds * 1e6:8.1f} us  {moved / seconds / 1e9:7.1f} GB/s")
        # bandwidth: the inverse of time; the built-in add is what users call (16-byte loads and stores, where
        # the benchmark's kernel above moves one element per thread, as the RawKernel it is compared with)
        ratios["gpu_add_bandwidth_vs_torch"] = times["torch.add"] / times["opforge ops.add (built-in)"]
    else:
        ratios["gpu_add_bandwidth_vs_torch"] = f"n/a ({no_torch})"

    # 3. 50 small ops: a captured graph against eager torch
    if torch is not None:
        rng = np.random.default_rng(0)
        x = torch.from_numpy(rng.standard_normal(64).astype(np.float32)).cuda()
        y = torch.from_numpy((rng.standard_normal(64) * 0.1 + 1).astype(np.float32)).cuda()
        graph = opforge.trace(lambda x, y: chain(x, y, opforge.ops), opforge.TensorSpec([64], "float32"),
                              opforge.TensorSpec([64], "float32"))
        expected = chain(x, y, torch)
        for _ in range(3):  # the first call runs node by node, the second captures, the third replays
            torch.testing.assert_close(graph(x, y), expected, rtol=1e-5, atol=1e-6)
        number = max(1, args.number // 10)
        runs = {"opforge graph (CUDA graph replay)": wall_loop(lambda: graph(x, y), torch.cuda.synchronize, number),
                "torch, 50 eager calls": wall_loop(lambda: chain(x, y, torch), torch.cuda.synchronize, number),
                "opforge, 50 eager calls": wall_loop(lambda: chain(x, y, opforge.ops), torch.cuda.synchronize,
                                                     number)}
        for run, _ in runs.values():
            run()
        times = median_per_call(runs, args.repeats)
        print(f"\n{CHAIN}-op chain on 64 float32 elements, per chain (median of {args.repeats} loops of {number}):")
        for name, seconds in times.items():
            print(f"  {name:40s} {seconds * 1e6:8.1f} us")
        ratios["gpu_graph_vs_torch_eager"] = times["opforge graph (CUDA graph replay)"] / times[
            "torch, 50 eager calls"]
    else:
        ratios["gpu_graph_vs_torch_eager"] = f"n/a ({no_torch})"

    print()
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")


def cuda_device_name(torch, cupy):
    if torch is not None:
        return torch.cuda.get_device_name()
    properties = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = properties["name"]
    return name.decode() if isinstance(name, bytes) else name


if __name__ == "__main__":
    main()
