"""Graphs of built-in ops on a machine with no compiler and an empty cache (each in a child process, as the
environment must be set before opforge reads it).

Planning a graph fuses elementwise runs into generated kernels (graph.fusion).  The chains models use most
are prebuilt with the package; any other one needs a compiler, and without one (or with one that fails, or
an unusable cache folder) its run stays unfused, on the built-ins' prebuilt kernels, with one line saying
so per process.  Everything else a plan may load -- blocked layouts and their reorders, each ISA variant
under a cap, the kernels a saved graph pins, checked mode -- is prebuilt: nothing compiles.
"""
import json
import os

import numpy as np
import pytest

import opforge
from helpers import run_without_compiler

FALLBACK = "cannot build fused elementwise kernels"
REBUILD = "rebuild the prebuilt set: python setup.py build_ext --inplace (or pip install -e .)"


def chain(x, y):
    """A fusable run that is not one of fusion's prebuilt COMMON_CHAINS."""
    return opforge.ops.exp(opforge.ops.tanh(opforge.ops.sub(x, y)))


def chain_inputs(n):
    x = np.linspace(-2, 2, n).astype(np.float32)
    return x, np.cos(x).astype(np.float32)


def save_fused_results(tmp_path):
    """The chain's fused results, made here (this process has a compiler), for a child to compare with."""
    fused = {}
    for n in (1000, 4097):
        x, y = chain_inputs(n)
        graph = opforge.trace(chain, x, y)
        fused[n] = graph(x, y)
        (plan,) = graph._executor.plans.values()
        assert plan.fused == ["fused::sub_tanh_exp"]
    np.savez(tmp_path / "fused.npz", **{str(n): v for n, v in fused.items()})


def test_the_chain_fuses_where_there_is_a_compiler(tmp_path):
    save_fused_results(tmp_path)


FALLBACK_CHILD = """
    import logging
    from test_no_compiler import chain, chain_inputs
    from opforge.graph import select_layouts

    results, fused, steps = {}, [], []
    for n in (1000, 4097):  # two shapes: two plans, each called several times
        x, y = chain_inputs(n)
        graph = opforge.trace(chain, x, y)
        for _ in range(3):
            results[str(n)] = graph(x, y)
        (plan,) = graph._executor.plans.values()
        fused.append(plan.fused)
        steps.append(len(plan.steps))
    again = opforge.trace(chain, *chain_inputs(1000))  # another graph of the same chain
    again(*chain_inputs(1000))
    opforge.set_checks(True)  # node by node, with guard pages
    checked = opforge.trace(chain, *chain_inputs(1000))(*chain_inputs(1000))
    opforge.set_checks(False)
    # a blocked layout: reorders in and out, the chain's add and relus on nchw16c
    x = np.random.default_rng(0).standard_normal((2, 16, 5, 5)).astype(np.float32)
    f = lambda a, b: opforge.ops.relu(opforge.ops.add(opforge.ops.relu(a), b))
    blocked = opforge.trace(f, x, x[::-1].copy())
    plain = blocked(x, x[::-1].copy())
    select_layouts(blocked, prefer="nchw16c")
    np.testing.assert_array_equal(blocked(x, x[::-1].copy()), plain)
    np.savez("unfused.npz", checked=checked, **results)
    print(json.dumps({"builds": BUILDS, "fused": fused, "steps": steps}))
"""


def _compare_with_fused(tmp_path, done):
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["fused"] == [[], []] and report["steps"] == [3, 3]  # sub, tanh, exp: unfused
    with np.load(tmp_path / "fused.npz") as fused, np.load(tmp_path / "unfused.npz") as unfused:
        for n in ("1000", "4097"):
            # the fused kernel rounds as the built-ins' own kernels do
            np.testing.assert_allclose(unfused[n], fused[n], rtol=1e-6, atol=0)
        np.testing.assert_array_equal(unfused["checked"], unfused["1000"])
    lines = [line for line in done.stderr.splitlines() if FALLBACK in line]
    assert len(lines) == 1, done.stderr  # once per process, not per call, plan or graph
    return report, lines[0]


@pytest.mark.parametrize("how", ["no compiler", "a missing OPFORGE_CXX"])
def test_without_a_compiler_a_chain_runs_unfused_and_says_so_once(tmp_path, how):
    save_fused_results(tmp_path)
    settings = {"OPFORGE_CXX": str(tmp_path / "nonexistent")} if how != "no compiler" else {}
    done, cache = run_without_compiler(tmp_path, FALLBACK_CHILD, **settings)
    report, line = _compare_with_fused(tmp_path, done)
    assert line.startswith("opforge: ") and ("no C++ compiler found" in line or "OPFORGE_CXX" in line)
    assert all(".inline" in source and "fused__" in source for source in report["builds"]), report["builds"]
    assert not [p for p in cache.rglob("*") if p.is_file() and ".inline" not in p.parts]  # no cache entry


def test_a_compiler_that_fails_leaves_the_chain_unfused_and_runs_once_per_source(tmp_path):
    save_fused_results(tmp_path)
    calls = tmp_path / "calls"
    broken = tmp_path / "broken-c++"
    broken.write_text(f"#!/bin/sh\necho run >> {calls}\necho 'error: this compiler is broken' >&2\nexit 1\n")
    broken.chmod(0o755)
    done, _ = run_without_compiler(tmp_path, FALLBACK_CHILD, OPFORGE_CXX=str(broken))
    _, line = _compare_with_fused(tmp_path, done)
    assert "failed to compile" in line and "fused::sub_tanh_exp" in line
    # one source (the chain's, at one ISA) for both shapes and both graphs: compiled once, then not tried
    # again in the process; the blocked graph's relu-add-relu is a second source
    assert len(calls.read_text().split()) == 2


def test_an_unusable_cache_folder_leaves_the_chain_unfused(tmp_path):
    save_fused_results(tmp_path)
    (tmp_path / "a-file").write_text("")
    done, _ = run_without_compiler(tmp_path, FALLBACK_CHILD, OPFORGE_CACHE_DIR=str(tmp_path / "a-file"))
    _, line = _compare_with_fused(tmp_path, done)
    assert "a-file" in line


def test_onnx_light_models_run_without_a_compiler(tmp_path):
    """Every light model tests/test_onnx_models.py runs (they ship with the onnx package's test data):
    against onnxruntime, with no compile; the residual blocks of resnet50 and shufflenet run fused,
    from the prebuilt set."""
    done, cache = run_without_compiler(tmp_path, """
        import gc
        import opforge.onnx
        from helpers import assert_softmax_close, logits_exposed
        from test_onnx_models import MODELS, _model, _onnxruntime, _runner_input

        fused = {}
        for name in MODELS:
            model = logits_exposed(_model(name))
            input_name, x = _runner_input(model)
            graph = opforge.onnx.load(model)
            ours = graph(x)
            ours = list(ours) if isinstance(ours, tuple) else [ours]
            theirs = _onnxruntime(model, {input_name: x})
            if len(ours) == 1:
                np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-3, atol=1e-4, err_msg=name)
            else:
                assert_softmax_close(ours[0], theirs[0], ours[1], theirs[1], rtol=1e-3, atol=1e-4)
            (plan,) = graph._executor.plans.values()
            fused[name] = sorted(set(plan.fused))
            del graph, model
            gc.collect()
        print(json.dumps({"builds": BUILDS, "fused": fused}))
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["builds"] == [], f"{report['builds']}: {REBUILD}"
    assert FALLBACK not in done.stderr
    assert report["fused"]["resnet50"] == report["fused"]["shufflenet"] == ["fused::add_relu"]
    assert list(cache.iterdir()) == []  # no inline source written, no cache entry


def test_every_isa_cap_and_a_saved_graph_run_without_a_compiler(tmp_path):
    """Dispatch under each ISA cap picks that ISA's prebuilt variants (conv's, the fused add_relu's);
    a graph saved with its kernels pinned loads and runs them."""
    done, cache = run_without_compiler(tmp_path, """
        from opforge.runtime import cpu

        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, 8, 9, 9)).astype(np.float32)
        w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) / 8
        ops = opforge.ops
        block = lambda a: ops.relu(ops.add(ops.conv(a, w, None, pads=[1, 1, 1, 1]), a))  # a residual block
        want = None
        fused = {}
        for isa in [i for i in cpu.ISA_LEVELS if cpu.cpu_features()[i]]:
            opforge.set_isa_cap(isa)
            graph = opforge.trace(block, x)
            got = graph(x)
            want = got if want is None else want
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=isa)
            (plan,) = graph._executor.plans.values()
            fused[isa] = [(name, kernel.isa) for (node, kernel, *_), name in
                          zip([s for s in plan.steps if s[0].op.name.startswith("fused::")], plan.fused)]
        opforge.set_isa_cap(None)
        graph.save("block.json")
        np.testing.assert_allclose(opforge.Graph.load("block.json")(x), want, rtol=1e-5, atol=1e-6)
        print(json.dumps({"builds": BUILDS, "fused": fused}))
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["builds"] == [], f"{report['builds']}: {REBUILD}"
    assert FALLBACK not in done.stderr
    for isa, runs in report["fused"].items():
        assert runs == [["fused::add_relu", None if isa == "generic" else isa]], (isa, runs)
    assert list(cache.iterdir()) == []
