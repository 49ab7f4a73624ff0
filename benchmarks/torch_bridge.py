"""Benchmark an opforge op called as a PyTorch op, against PyTorch's own ways.

    python benchmarks/torch_bridge.py [--rounds N] [--number N] [--no-compile]

What is measured
----------------
A 4-element float32 add, ``y = a + b`` (``benchmarks/sources/add.cc:Add``, the
aot ABI), declared as an opforge op and registered with
``opforge.torch.register``, called per call as ``torch.ops.bench.add(a, b)``
on CPU tensors, against:

* ``native TORCH_LIBRARY op`` -- the same loop as a C++ torch op (``TORCH_LIBRARY``
  + ``m.impl(..., kCPU)``, ``at::empty_like`` output, a Meta kernel for
  torch.compile; no autograd) built with
  ``torch.utils.cpp_extension.load_inline`` (one build, cached by torch):
  the baseline, what a user writing the op in PyTorch's C++ API gets;
* ``torch.add(a, b)``;
* ``torch.library.custom_op`` with a Python implementation (``a + b``).

The forward-with-gradient path is timed apart: ``torch.autograd.grad(op(a, b),
(a, b), g)`` on inputs that require grad, one forward and one backward per
call, for the opforge op (its gradient rule, ``dy`` for each input, replayed
as torch ops), ``torch.add`` and a ``torch.library.custom_op`` with
``register_autograd`` (the baseline: a custom op with a gradient in PyTorch's
own Python API).

Each op is also called from a function compiled with
``torch.compile(fullgraph=True)`` (inductor), so a call there pays the compiled
wrapper too.  Variants are timed in interleaved rounds (``call_overhead.py``'s
``time_variants``); a figure is its fastest round.  Only ratios within one run
mean anything.  The last lines are

    torch_compiled_op_vs_native: <ratio>
    torch_op_vs_native: <ratio>          (goal <= 1.0)
    torch_grad_op_vs_custom_op: <ratio>
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

if not os.environ.get("OPFORGE_CACHE_DIR"):  # a fresh build cache, removed at exit
    import atexit

    _cache = tempfile.mkdtemp(prefix="opforge-bench-cache-")
    os.environ["OPFORGE_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, True)

import torch  # noqa: E402

import opforge  # noqa: E402
import opforge.torch  # noqa: E402
from call_overhead import time_variants  # noqa: E402

N = 4
HEADLINE = "opforge op  torch.ops.bench.add(a, b)"
NATIVE = "native TORCH_LIBRARY op"

NATIVE_SOURCE = r"""
#include <ATen/ATen.h>
#include <torch/library.h>

at::Tensor add(const at::Tensor &a, const at::Tensor &b) {
  TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.is_contiguous() &&
              b.is_contiguous() && a.numel() == b.numel(), "add takes two contiguous float32 tensors of one size");
  at::Tensor y = at::empty_like(a);
  const float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>();
  float *py = y.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) py[i] = pa[i] + pb[i];
  return y;
}

at::Tensor add_meta(const at::Tensor &a, const at::Tensor &b) { return at::empty_like(a); }

TORCH_LIBRARY(bench_native, m) {
  m.def("add(Tensor a, Tensor b) -> Tensor");
  m.impl("add", c10::DispatchKey::CPU, &add);
  m.impl("add", c10::DispatchKey::Meta, &add_meta);  // for torch.compile
}
"""


def opforge_op():
    op = opforge.op("bench::add(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{HERE / 'sources' / 'add.cc'}:Add", dtypes={"a": ["float32"], "b": ["float32"]})

    @op.grad
    def _(saved, dy):
        return dy, dy

    return opforge.torch.register(op)


def native_op():
    from torch.utils.cpp_extension import load_inline

    load_inline("opforge_bench_native_add2", cpp_sources=[NATIVE_SOURCE], is_python_module=False,
                extra_cflags=["-O2"], verbose=False)
    return torch.ops.bench_native.add


def custom_op():
    @torch.library.custom_op("bench_py::add", mutates_args=())
    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    @add.register_fake
    def _(a, b):
        return torch.empty_like(a)

    def backward(ctx, grad):
        return grad, grad

    add.register_autograd(backward)
    return add


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    a = torch.arange(1, N + 1, dtype=torch.float32)
    b = torch.full((N,), 0.5)
    expected = a + b
    ops = {HEADLINE: opforge_op(), NATIVE: native_op(), "torch.add": torch.add,
           "torch.library.custom_op (Python impl)": custom_op()}
    from opforge.torch import fast

    print(f"torch {torch.__version__}; opforge's C++ path: {'on' if fast.library() else fast.reason()}")
    namespace = {"a": a, "b": b}
    variants = {}
    for k, (name, op) in enumerate(ops.items()):
        if not torch.equal(op(a, b), expected):
            raise SystemExit(f"{name} computed {op(a, b)}, expected {expected}")
        namespace[f"op{k}"] = op
        variants[name] = f"op{k}(a, b)"
        if not args.no_compile:
            compiled = torch.compile(lambda a, b, op=op: op(a, b), fullgraph=True)
            if not torch.equal(compiled(a, b), expected):
                raise SystemExit(f"compiled {name} computed the wrong result")
            namespace[f"compiled{k}"] = compiled
            variants[f"torch.compile: {name}"] = f"compiled{k}(a, b)"

    results = time_variants(variants, namespace, args.rounds, args.number)
    best = {name: min(times) for name, times in results.items()}
    # forward with gradient: fewer calls per round, each is a forward and a backward
    namespace.update(ag=a.clone().requires_grad_(), bg=b.clone().requires_grad_(), g=torch.ones(N), torch=torch)
    with_grad = {}
    for k, name in enumerate(ops):
        if name == NATIVE:  # (no autograd)
            continue
        (da, db) = torch.autograd.grad(ops[name](namespace["ag"], namespace["bg"]), (namespace["ag"], namespace["bg"]),
                                       namespace["g"])
        if not (torch.equal(da, namespace["g"]) and torch.equal(db, namespace["g"])):
            raise SystemExit(f"{name}: wrong gradient {da}, {db}")
        with_grad[f"with grad: {name}"] = f"torch.autograd.grad(op{k}(ag, bg), (ag, bg), g)"
    results = time_variants(with_grad, namespace, args.rounds, max(args.number // 10, 1))
    best.update({name: min(times) for name, times in results.items()})
    width = max(map(len, best))
    for name, seconds in best.items():
        print(f"{name:<{width}}  {seconds * 1e6:8.3f} us   {seconds / best[NATIVE]:6.2f}x native")
    print()
    if not args.no_compile:
        print(f"torch_compiled_op_vs_native: "
              f"{best['torch.compile: ' + HEADLINE] / best['torch.compile: ' + NATIVE]:.2f}")
    print(f"torch_op_vs_native: {best[HEADLINE] / best[NATIVE]:.2f}")
    print(f"torch_grad_op_vs_custom_op: "
          f"{best['with grad: ' + HEADLINE] / best['with grad: torch.library.custom_op (Python impl)']:.2f}")


if __name__ == "__main__":
    main()
