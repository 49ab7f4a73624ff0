"""leaky_relu in depth on 16M float32: its ISA variants, streaming stores, allocation.

    python benchmarks/leaky_relu.py [--rounds N] [--log2n K] [--alpha A]

(``benchmarks/kernels.py`` times every built-in against NumPy and torch; this
study looks at one memory-bound kernel closely.)

What is measured
----------------
``x = np.random.randn(1 << 24).astype(np.float32)`` (64 MiB) and
``y = leaky_relu(x, alpha=0.1)``; throughput is counted as bytes read +
written, 2 * 4 * n, per second (GB = 1e9 bytes).

* ``alloc`` rows -- the real call path, which allocates its output every call:
  - ``opforge leaky_relu [isa]``: ``opforge.ops.leaky_relu(x, alpha=0.1)``
    with dispatch capped at each ISA the CPU has (``opforge.set_isa_cap``), so
    each ISA variant runs through the ordinary dispatch path (the op's cached
    plans are dropped and re-made, untimed, after each change of cap: the cap
    alone does not re-dispatch a signature already called -- see ``Capped``);
  - ``np.copy(x)``: the allocating copy, the memory-bound ceiling for an op
    that returns a fresh array (target: best variant >= 0.8x it);
  - ``np.where(x > 0, x, a * x)``: plain NumPy (target: best variant >= 3x it).
* ``prealloc`` rows -- the kernel alone: each variant's compiled function
  called (through opforge's native ``call_kernel``, the same entry the
  launcher uses) on a preallocated, already-faulted output, and
  ``np.copyto(out, x)`` as the copy it is measured against.
* ``nostream`` rows -- the same source compiled with streaming stores turned
  off (``-DLEAKY_RELU_STREAM_BYTES=UINT64_MAX``, a private op), to show what
  the non-temporal stores buy, allocating and preallocated.
* ``alloc+fault only``: ``np.empty`` of the 64 MiB output plus one write per
  4 KiB page -- the page faults every allocating row pays, on their own.
  An allocating row costs less than its ``prealloc`` row plus this: the
  zeroing of fresh pages partly merges with the kernel's own traffic (and
  more so when the kernel runs downwards, as leaky_relu's does, and as
  glibc's memmove does for np.copy here), so the summary reports the
  measured difference ``alloc - prealloc`` as the allocation's share.

Every variant is timed once per round, rounds rotate the order (so a noisy
phase of the machine hits all alike), after a warm-up; a figure is the
median over rounds (the best round is shown too).  Only ratios within one run
mean much.

The build cache goes to a temporary folder (removed at exit) unless
``OPFORGE_CACHE_DIR`` is set.  Output ends with

    leaky_relu_vs_numpy: <ratio>
    leaky_relu_vs_copy: <ratio>

both from the ``alloc`` rows: the best ISA variant's GB/s over NumPy's and
over ``np.copy``'s.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if "OPFORGE_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="opforge-bench-leaky-relu-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["OPFORGE_CACHE_DIR"] = _cache

import numpy as np  # noqa: E402

try:
    import opforge  # noqa: E402
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import opforge  # noqa: E402

from opforge import _native  # noqa: E402
from opforge.builtins.leaky_relu import LEAKY_RELU_CC  # noqa: E402
from opforge.runtime.dispatch import select_kernel  # noqa: E402

ISAS = ("sse41", "avx2", "avx512")
PAGE = 4096


def kernel_for(op, isa, dtype="float32"):
    for kernel in op.kernels:
        if kernel.isa == isa and kernel.dtypes and kernel.dtypes[0][0] == dtype:
            return kernel.load()
    raise LookupError(f"{op.name}: no {isa} kernel for {dtype}")


def prealloc_call(op, kernel, x, out, alpha):
    """A zero-argument function calling the kernel on x into the preallocated out."""
    spec = opforge.TensorSpec.of(x)
    extra, _ = kernel.signature_state(op, [spec, spec], {"alpha": alpha})
    function, pointers = kernel._function, [x.ctypes.data, out.ctypes.data]
    shapes, dtypes = [x.shape, out.shape], [str(x.dtype), str(out.dtype)]

    def call():
        rc, error = _native.call_kernel(function, pointers, shapes, dtypes, None, extra)
        if rc or error:
            raise RuntimeError(f"{kernel.name}: rc={rc} error={error}")
    return call


class Capped:
    """``fn`` run with dispatch capped at ``isa``: ``enter`` sets the cap (which
    makes every op choose its kernels again) and makes one untimed call to
    plan; only the calls after it are timed, and ``leave`` lifts the cap."""

    def __init__(self, isa, op, fn):
        self.isa, self.op, self.fn = isa, op, fn

    def enter(self):
        opforge.set_isa_cap(self.isa)
        self.fn()

    def leave(self):
        opforge.set_isa_cap(None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--log2n", type=int, default=24)
    parser.add_argument("--alpha", type=float, default=0.1)
    args = parser.parse_args(argv)
    n, a = 1 << args.log2n, args.alpha
    nbytes = 2 * 4 * n

    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    out = np.empty_like(x)
    out.fill(0)  # fault its pages in once
    a32 = np.float32(a)
    expected = np.where(x > 0, x, a32 * x)

    op = opforge.lookup("leaky_relu")
    features = opforge.cpu_features()
    isas = [isa for isa in ISAS if features[isa]]
    skipped = [isa for isa in ISAS if not features[isa]]

    # The same source without streaming stores, as a private op.
    plain = opforge.op("bench_leaky_relu::leaky_relu_nostream(Tensor x, *, float alpha=0.01) -> Tensor y")
    plain.def_infer(opforge.infer.same_as(0))
    for isa in isas:
        plain.kernel(function="LeakyRelu", dtypes={"x": ["float32"]}, isa=isa, code=LEAKY_RELU_CC,
                     cflags=["-DLEAKY_RELU_STREAM_BYTES=UINT64_MAX"])

    leaky = opforge.ops.leaky_relu
    variants = {}  # label -> (mode, fn)
    variants["np.copy(x)"] = ("alloc", lambda: np.copy(x))
    variants["np.where(x > 0, x, a * x)"] = ("alloc", lambda: np.where(x > 0, x, a * x))
    for isa in isas:
        variants[f"opforge leaky_relu [{isa}]"] = ("alloc", Capped(isa, op, lambda: leaky(x, alpha=a)))
        variants[f"nostream leaky_relu [{isa}]"] = ("alloc", Capped(isa, plain, lambda: plain(x, alpha=a)))
    variants["np.copyto(out, x)"] = ("prealloc", lambda: np.copyto(out, x))
    for isa in isas:
        variants[f"kernel LeakyRelu [{isa}]"] = ("prealloc", prealloc_call(op, kernel_for(op, isa), x, out, a))
        variants[f"nostream kernel [{isa}]"] = ("prealloc", prealloc_call(plain, kernel_for(plain, isa), x, out, a))

    def fault_only():
        y = np.empty(n, np.float32)
        y[:: PAGE // 4] = 0
        return y
    variants["alloc+fault only (np.empty + 1 write/page)"] = ("fault", fault_only)

    def timed(variant):
        """One timed call (its untimed set-up and tear-down around it)."""
        fn = variant[1]
        if isinstance(fn, Capped):
            fn.enter()
            try:
                t0 = time.perf_counter()
                result = fn.fn()
                t1 = time.perf_counter()
            finally:
                fn.leave()
        else:
            t0 = time.perf_counter()
            result = fn()
            t1 = time.perf_counter()
        return t1 - t0, result

    # Correctness first (and the warm-up: builds, plans, first faults), and
    # which kernel each capped row really runs.
    for label, variant in variants.items():
        mode, fn = variant
        if isinstance(fn, Capped):
            fn.enter()
            try:
                chosen = select_kernel(fn.op, [opforge.TensorSpec.of(x)])
            finally:
                fn.leave()
            assert chosen.isa == fn.isa, (label, chosen.name)
        _, result = timed(variant)
        if mode == "alloc" and not label.startswith("np."):
            np.testing.assert_array_equal(result, expected, err_msg=label)
        if mode == "prealloc" and not label.startswith("np."):
            np.testing.assert_array_equal(out, expected, err_msg=label)
        del result
    for _ in range(2):
        for variant in variants.values():
            timed(variant)

    labels = list(variants)
    samples = {label: [] for label in labels}
    for r in range(args.rounds):
        k = r % len(labels)
        for label in labels[k:] + labels[:k]:
            seconds, result = timed(variants[label])
            del result  # freeing (munmap) is outside the timed region
            samples[label].append(seconds)

    median = {label: statistics.median(s) for label, s in samples.items()}
    gbps = {label: nbytes / median[label] / 1e9 for label in labels}

    print(f"leaky_relu, n = {n} float32 ({n * 4 / 2**20:.0f} MiB in, same out), alpha = {a}; "
          f"GB/s counts 2*4*n bytes; median of {args.rounds} rounds after warm-up")
    print(f"CPU features: {', '.join(k for k, v in features.items() if v)}"
          + (f"; skipped ISA variants (CPU lacks them): {', '.join(skipped)}" if skipped else ""))
    print(f"{'variant':46s} {'mode':9s} {'median ms':>10s} {'best ms':>9s} {'GB/s':>8s}")
    for label in labels:
        mode = variants[label][0]
        rate = f"{gbps[label]:8.2f}" if mode != "fault" else f"{'-':>8s}"
        print(f"{label:46s} {mode:9s} {median[label] * 1e3:10.3f} {min(samples[label]) * 1e3:9.3f} {rate}")

    best_isa = max(isas, key=lambda isa: gbps[f"opforge leaky_relu [{isa}]"])
    best = f"opforge leaky_relu [{best_isa}]"
    fault = median["alloc+fault only (np.empty + 1 write/page)"]
    kernel_alone = median[f"kernel LeakyRelu [{best_isa}]"]
    print()
    alloc_cost = median[best] - kernel_alone
    copy_alloc_cost = median["np.copy(x)"] - median["np.copyto(out, x)"]
    print(f"where the time goes ({best}): the call takes {median[best] * 1e3:.2f} ms, the kernel alone on a warm "
          f"output {kernel_alone * 1e3:.2f} ms; allocating the output adds {alloc_cost * 1e3:.2f} ms "
          f"({alloc_cost / median[best]:.0%} of the call) -- page faults (zeroing the fresh pages), which "
          f"cost {fault * 1e3:.2f} ms on their own but partly overlap the kernel's memory traffic")
    print(f"np.copy(x) takes {median['np.copy(x)'] * 1e3:.2f} ms, np.copyto into a warm output "
          f"{median['np.copyto(out, x)'] * 1e3:.2f} ms (allocation adds {copy_alloc_cost * 1e3:.2f} ms: glibc's "
          f"memmove copies downwards when source and destination alias modulo 4 KiB, which hides the faults)")
    for isa in isas:
        print(f"streaming stores [{isa}]: kernel alone {gbps[f'nostream kernel [{isa}]']:.2f} -> "
              f"{gbps[f'kernel LeakyRelu [{isa}]']:.2f} GB/s, allocating "
              f"{gbps[f'nostream leaky_relu [{isa}]']:.2f} -> {gbps[f'opforge leaky_relu [{isa}]']:.2f} GB/s")
    print(f"kernel_alone_vs_copyto: {gbps[f'kernel LeakyRelu [{best_isa}]'] / gbps['np.copyto(out, x)']:.3f}")
    print(f"leaky_relu_vs_numpy: {gbps[best] / gbps['np.where(x > 0, x, a * x)']:.3f}")
    print(f"leaky_relu_vs_copy: {gbps[best] / gbps['np.copy(x)']:.3f}")


if __name__ == "__main__":
    main()
