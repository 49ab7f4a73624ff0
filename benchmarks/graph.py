"""Graph execution against eager calls, and memory planning.

1. A chain of 50 small ops (relu, neg, add, mul on 64 float32 elements) run
   as a traced graph -- one planned native program -- against the same 50
   calls made eagerly, in one run; per-node time and the ratio
   (target: graph <= eager).
2. Peak intermediate memory of a 20-layer MLP-like graph (matmul + add bias +
   relu per layer) with the executor's memory plan against one buffer per
   value (target: planned <= 0.5x unplanned).

    python benchmarks/graph.py

The last line is ``graph_vs_eager: <ratio>``.
"""
import os
import sys
import tempfile
import timeit
from pathlib import Path

try:
    import opforge
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    import opforge
import numpy as np

os.environ.setdefault("OPFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="opforge-bench-"))
ops = opforge.ops
CHAIN = 50


def chain(x, y):
    for k in range(CHAIN):
        step = k % 4
        if step == 0:
            x = ops.relu(x)
        elif step == 1:
            x = ops.neg(x)
        elif step == 2:
            x = ops.add(x, y)
        else:
            x = ops.mul(x, y)
    return x


def mlp(x, *weights):
    for w, b in zip(weights[::2], weights[1::2]):
        x = ops.relu(ops.add(ops.matmul(x, w), b))
    return x


def best(fn, number, rounds=15):
    return min(timeit.repeat(fn, number=number, repeat=rounds)) / number


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(64).astype(np.float32)
    y = (rng.standard_normal(64) * 0.1 + 1).astype(np.float32)
    graph = opforge.trace(chain, x, y)
    np.testing.assert_allclose(graph(x, y), chain(x, y), rtol=1e-6)
    plan = graph._executor.plan_for([x, y])
    assert plan.program is not None, "the chain should run as one native program"
    eager = best(lambda: chain(x, y), 2000)
    traced = best(lambda: graph(x, y), 2000)
    print(f"{CHAIN}-node chain, 64 float32 elements")
    print(f"  eager: {eager * 1e6:8.2f} us per chain, {eager / CHAIN * 1e9:6.0f} ns per node")
    print(f"  graph: {traced * 1e6:8.2f} us per chain, {traced / CHAIN * 1e9:6.0f} ns per node")

    layers, width, batch = 20, 256, 64
    weights = []
    for _ in range(layers):
        weights += [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
                    np.zeros(width, np.float32)]
    inputs = rng.standard_normal((batch, width)).astype(np.float32)
    net = opforge.trace(mlp, inputs, *weights)
    np.testing.assert_allclose(net(inputs, *weights), mlp(inputs, *weights), rtol=1e-4, atol=1e-5)
    report = net._executor.plan_for([inputs, *weights]).memory_report()
    ratio = report["planned_bytes"] / report["unplanned_bytes"]
    print(f"{layers}-layer MLP graph ({report['nodes']} nodes, batch {batch}, width {width})")
    print(f"  intermediates, one buffer each: {report['unplanned_bytes'] / 1024:8.0f} KiB")
    print(f"  planned arena:                  {report['planned_bytes'] / 1024:8.0f} KiB")
    print(f"memory_planned_vs_unplanned: {ratio:.3f}")
    print(f"graph_vs_eager: {traced / eager:.3f}")


if __name__ == "__main__":
    main()
