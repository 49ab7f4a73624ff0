"""Benchmark an opforge op inside jax.jit, against JAX's own ways.

    python benchmarks/jax_bridge.py [--rounds N] [--number N]

What is measured
----------------
A 4-element float32 add, ``y = a + b``, per call of a jitted function on CPU
arrays, ``f(a, b).block_until_ready()``:

* ``opforge op in jax.jit`` -- ``benchmarks/sources/add.cc:Add`` (the aot ABI)
  declared as an opforge op and called on the traced arrays: one XLA FFI
  custom call to opforge's generic handler;
* ``jax.jit(lambda a, b: a + b)`` -- the baseline: XLA's own add;
* ``hand-written XLA FFI handler`` -- the same loop as a typed FFI handler
  (``sources/jax_add_handler.cc``, built against ``jax.ffi.include_dir()``)
  through ``jax.ffi.ffi_call``: what a JAX user writes by hand for one kernel;
* ``jax.pure_callback`` of a NumPy add.

Two more pairs, each against its JAX counterpart in the same run:

* eager: ``op(a, b)`` on the arrays, no ``jax.jit`` around it, against
  ``jnp.add(a, b)`` (each ``...block_until_ready()``);
* forward with gradient: ``jax.jit(jax.value_and_grad(loss))`` of
  ``loss = sum(op(a, b) * b)`` (the op's gradient rule), against the same
  loss written with ``a + b``.

Variants are timed in interleaved rounds (``call_overhead.py``'s
``time_variants``); a figure is its fastest round.  Only ratios within one run
mean anything.  The last three lines are

    jax_eager_op_vs_jnp_add: <ratio>      (goal <= 3)
    jax_value_and_grad_vs_jnp: <ratio>
    jax_op_vs_jit_add: <ratio>            (goal <= 1.05)
"""
from __future__ import annotations

import argparse
import ctypes
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

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import opforge  # noqa: E402
import opforge.jax  # noqa: E402
from call_overhead import time_variants  # noqa: E402

HEADLINE = "opforge op in jax.jit"
BASELINE = "jax.jit(lambda a, b: a + b)"
EAGER, EAGER_BASELINE = "opforge op, eager", "jnp.add(a, b), eager"
GRAD, GRAD_BASELINE = "opforge op, jit(value_and_grad)", "a + b, jit(value_and_grad)"


def add_op():
    op = opforge.op("bench::add(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{HERE / 'sources' / 'add.cc'}:Add", dtypes={"a": ["float32"], "b": ["float32"]})

    @op.grad
    def _(saved, dy):
        return dy, dy

    return op


def value_and_grad(add):
    return jax.jit(jax.value_and_grad(lambda a, b: jnp.sum(add(a, b) * b), argnums=(0, 1)))


def hand_written_add():
    built = opforge.build(HERE / "sources" / "jax_add_handler.cc", extra_cflags=["-isystem", jax.ffi.include_dir()])
    library = ctypes.CDLL(str(built.path))
    jax.ffi.register_ffi_target("bench_add", jax.ffi.pycapsule(library.BenchAdd), platform="cpu")
    return jax.jit(lambda a, b: jax.ffi.ffi_call("bench_add", jax.ShapeDtypeStruct(a.shape, a.dtype))(a, b))


def callback_add():
    return jax.jit(lambda a, b: jax.pure_callback(lambda x, y: np.add(x, y), jax.ShapeDtypeStruct(a.shape, a.dtype),
                                                  a, b))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=5000)
    args = parser.parse_args(argv)

    a = jnp.arange(1, 5, dtype=jnp.float32)
    b = jnp.full((4,), 0.5, jnp.float32)
    expected = np.asarray(a) + np.asarray(b)
    op = add_op()
    functions = {HEADLINE: jax.jit(lambda a, b: op(a, b)), BASELINE: jax.jit(lambda a, b: a + b),
                 "hand-written XLA FFI handler": hand_written_add(), "jax.pure_callback (NumPy add)": callback_add(),
                 EAGER: op, EAGER_BASELINE: jnp.add}
    print(f"jax {jax.__version__}, backend {jax.default_backend()}")
    namespace = {"a": a, "b": b}
    variants = {}
    for k, (name, f) in enumerate(functions.items()):
        if not np.array_equal(np.asarray(f(a, b)), expected):
            raise SystemExit(f"{name} computed {f(a, b)}, expected {expected}")
        namespace[f"f{k}"] = f
        variants[name] = f"f{k}(a, b).block_until_ready()"
    grads = {GRAD: value_and_grad(op), GRAD_BASELINE: value_and_grad(lambda a, b: a + b)}
    want = grads[GRAD_BASELINE](a, b)
    for k, (name, f) in enumerate(grads.items()):
        got = f(a, b)
        if not all(np.allclose(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(got),
                                                                           jax.tree.leaves(want))):
            raise SystemExit(f"{name} computed {got}, expected {want}")
        namespace[f"g{k}"] = f
        variants[name] = f"jax.block_until_ready(g{k}(a, b))"
    namespace["jax"] = jax
    results = time_variants(variants, namespace, args.rounds, args.number)
    best = {name: min(times) for name, times in results.items()}
    against = {EAGER: EAGER_BASELINE, EAGER_BASELINE: EAGER_BASELINE, GRAD: GRAD_BASELINE,
               GRAD_BASELINE: GRAD_BASELINE}
    width = max(map(len, best))
    for name, seconds in best.items():
        base = against.get(name, BASELINE)
        print(f"{name:<{width}}  {seconds * 1e6:8.3f} us   {seconds / best[base]:6.2f}x {base}")
    print()
    print(f"hand_written_ffi_vs_jit_add: {best['hand-written XLA FFI handler'] / best[BASELINE]:.2f}")
    print(f"jax_eager_op_vs_jnp_add: {best[EAGER] / best[EAGER_BASELINE]:.2f}")
    print(f"jax_value_and_grad_vs_jnp: {best[GRAD] / best[GRAD_BASELINE]:.2f}")
    print(f"jax_op_vs_jit_add: {best[HEADLINE] / best[BASELINE]:.2f}")


if __name__ == "__main__":
    main()
