"""Graph execution against eager calls, and memory planning.

1. A chain of 50 small ops (relu, neg, add, mul on 64 float32 elements) run
   as a traced graph -- one planned native program -- against the same 50
   calls made eagerly, in one run; per-node time and the ratio
   (target: graph <= eager).
2. Peak intermediate memory of a 20-layer MLP-like graph (matmul + add bias +
   relu per layer) with the executor's memory plan against one buffer per
   value (target: planned <= 0.5x unplanned).
3. A 784-256-10 MLP (batch 64, float32): the forward pass as a traced graph
   against torch eager (under ``no_grad``), and the loss with its gradients
   through ``opforge.value_and_grad`` against torch autograd (``backward``),
   at one thread and at every thread (``opforge.set_num_threads`` and
   ``torch.set_num_threads`` alike).  Needs torch (``n/a`` without it).
   torch's OpenMP threads poll 10000 rounds after a parallel region
   (``GOMP_SPINCOUNT``, set here unless given) rather than 300000 (several
   ms): they polled into the start of opforge's samples, which ran on one
   free core (two-thread forward 194 -> 159 us; torch's own figures stay).
4. An elementwise chain on 4M float32 (``tanh(x * x) * 0.5 + y``), as a graph
   whose nodes fuse into one generated kernel against the same graph unfused
   (``OPFORGE_FUSE=0``), NumPy, and torch eager, at every thread.

    python benchmarks/graph.py

It ends with the ratio lines (lower is better): ``mlp_forward_vs_torch``,
``mlp_grad_vs_torch_autograd`` (the worse of the two thread counts each),
``fused_vs_unfused``, ``fused_vs_best_peer``, ``memory_planned_vs_unplanned``
and ``graph_vs_eager``.
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
os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # before torch loads (item 3 above)
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


def median_of(fns, number, rounds=11):
    """Median seconds per call of each function, rounds rotating their order (noise hits all alike)."""
    times = [[] for _ in fns]
    for r in range(rounds):
        for k in [(r + j) % len(fns) for j in range(len(fns))]:
            times[k].append(timeit.timeit(fns[k], number=number) / number)
    return [float(np.median(t)) for t in times]


def mlp2(x, w1, b1, w2, b2):
    return ops.add(ops.matmul(ops.relu(ops.add(ops.matmul(x, w1), b1)), w2), b2)


def mlp2_loss(x, w1, b1, w2, b2):
    out = mlp2(x, w1, b1, w2, b2)
    return ops.mean(ops.mul(out, out), axes=[0, 1])


def mlp_versus_torch(rng):
    """{threads: (forward ratio, grad ratio)} against torch, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    x = rng.standard_normal((64, 784)).astype(np.float32)
    params = [(rng.standard_normal((784, 256)) / 28).astype(np.float32), np.zeros(256, np.float32),
              (rng.standard_normal((256, 10)) / 16).astype(np.float32), np.zeros(10, np.float32)]
    forward = opforge.trace(mlp2, x, *params)
    both = opforge.value_and_grad(mlp2_loss, argnums=(1, 2, 3, 4))
    tx, tparams = torch.from_numpy(x), [torch.from_numpy(p).clone().requires_grad_() for p in params]

    def torch_forward():
        with torch.no_grad():
            w1, b1, w2, b2 = tparams
            return torch.relu(tx @ w1 + b1) @ w2 + b2

    def torch_grad():
        w1, b1, w2, b2 = tparams
        for p in tparams:
            p.grad = None
        out = torch.relu(tx @ w1 + b1) @ w2 + b2
        loss = (out * out).mean()
        loss.backward()
        return loss

    value, grads = both(x, *params)
    torch_grad()
    np.testing.assert_allclose(forward(x, *params), torch_forward().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(value, torch_grad().item(), rtol=1e-4)
    for g, p in zip(grads, tparams):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-3, atol=1e-6)
    results = {}
    saved = opforge.get_num_threads(), torch.get_num_threads()
    for threads in (1, os.cpu_count() or 1):
        opforge.set_num_threads(threads)
        torch.set_num_threads(threads)
        fwd, tfwd, grad, tgrad = median_of([lambda: forward(x, *params), torch_forward,
                                            lambda: both(x, *params), torch_grad], 200)
        print(f"784-256-10 MLP, batch 64, {threads} thread(s): forward {fwd * 1e6:7.1f} us (torch eager "
              f"{tfwd * 1e6:7.1f} us), forward+backward {grad * 1e6:7.1f} us (torch autograd {tgrad * 1e6:7.1f} us)")
        results[threads] = (fwd / tfwd, grad / tgrad)
    opforge.set_num_threads(saved[0])
    torch.set_num_threads(saved[1])
    return results


def fused_chain(x, y):
    return ops.add(ops.mul(ops.tanh(ops.mul(x, x)), np.float32(0.5)), y)


def fusion_versus_peers(rng):
    """(fused / unfused, fused / best of NumPy and torch) on 4M float32."""
    n = 1 << 22
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    fused = opforge.trace(fused_chain, x, y)
    os.environ["OPFORGE_FUSE"] = "0"
    try:
        unfused = opforge.trace(fused_chain, x, y)
        unfused(x, y)  # planned while fusion is off
    finally:
        del os.environ["OPFORGE_FUSE"]
    fused(x, y)
    assert fused._executor.plan_for([x, y]).memory_report()["fused"], "the chain should fuse"
    np.testing.assert_allclose(fused(x, y), np.tanh(x * x) * 0.5 + y, rtol=1e-5, atol=1e-6)
    contenders = {"opforge fused": lambda: fused(x, y), "opforge unfused": lambda: unfused(x, y),
                  "numpy": lambda: np.tanh(x * x) * np.float32(0.5) + y}
    try:
        import torch

        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        contenders["torch eager"] = lambda: torch.tanh(tx * tx) * 0.5 + ty
    except ImportError:
        pass
    times = dict(zip(contenders, median_of(list(contenders.values()), 5)))
    print(f"elementwise chain tanh(x * x) * 0.5 + y on {n} float32, {opforge.get_num_threads()} thread(s):")
    for name, seconds in times.items():
        print(f"  {name:<16} {seconds * 1e3:7.2f} ms")
    peers = [t for name, t in times.items() if not name.startswith("opforge")]
    return times["opforge fused"] / times["opforge unfused"], times["opforge fused"] / min(peers)


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

    mlp_ratios = mlp_versus_torch(rng)
    fused_ratio, fused_peer_ratio = fusion_versus_peers(rng)
    if mlp_ratios is None:
        print("mlp_forward_vs_torch: n/a (torch is not installed)")
        print("mlp_grad_vs_torch_autograd: n/a (torch is not installed)")
    else:
        worst_fwd = max(mlp_ratios.items(), key=lambda item: item[1][0])
        worst_grad = max(mlp_ratios.items(), key=lambda item: item[1][1])
        print(f"mlp_forward_vs_torch: {worst_fwd[1][0]:.3f} ({worst_fwd[0]} thread(s); "
              + ", ".join(f"{t}t {r[0]:.3f}" for t, r in mlp_ratios.items()) + ")")
        print(f"mlp_grad_vs_torch_autograd: {worst_grad[1][1]:.3f} ({worst_grad[0]} thread(s); "
              + ", ".join(f"{t}t {r[1]:.3f}" for t, r in mlp_ratios.items()) + ")")
    print(f"fused_vs_unfused: {fused_ratio:.3f}")
    print(f"fused_vs_best_peer: {fused_peer_ratio:.3f}")
    print(f"memory_planned_vs_unplanned: {ratio:.3f}")
    print(f"graph_vs_eager: {traced / eager:.3f}")


if __name__ == "__main__":
    main()
