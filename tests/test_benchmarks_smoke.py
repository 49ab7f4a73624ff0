"""Smoke runs of the benchmarks: they start, measure and print their summary lines.

Only the output's form is checked, never a timing.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_benchmark(script, *args, timeout=600):
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], env=dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def test_kernels_quick_prints_rows_and_summary_lines():
    pytest.importorskip("torch")
    out = run_benchmark("kernels.py", "--quick", "--ops", "add,exp,matmul", "--threads", "1,all")
    lines = out.strip().splitlines()

    # A row per op in every thread count's table, with opforge's time and the dispatched kernel.
    headers = [line for line in lines if line.startswith("== ")]
    assert headers and headers[0].startswith("== 1 thread:")
    for op in ("add", "exp", "matmul"):
        rows = [line for line in lines if re.match(rf"{op}\s+[0-9.]+ (us|ms)\s", line)]
        assert len(rows) == len(headers), (op, out)
    assert not re.search(r"^\S+ +error: ", out, re.M), out  # an op that failed
    assert "result differs from opforge's (no ratio taken)" not in out, out  # a peer computing something else
    assert re.search(r"GFLOP/s opforge [0-9.]+ / numpy [0-9.]+", out), out

    matmul = re.fullmatch(r"matmul1024_vs_numpy_gflops: ([0-9.]+) \((\d+) threads?: .*\)", lines[-2])
    assert matmul, lines[-2]
    assert float(matmul.group(1)) > 0
    worst = re.fullmatch(r"worst_kernel_vs_best_peer: ([0-9.]+) \((\w+), (\d+) threads?\)", lines[-1])
    assert worst, lines[-1]
    assert float(worst.group(1)) > 0
    assert worst.group(2) in ("add", "exp", "matmul")


def test_onnx_models_prints_a_row_and_its_ratio_lines():
    pytest.importorskip("onnxruntime")
    out = run_benchmark("onnx_models.py", "--models", "squeezenet", "--exported", "gpt_tiny", "--repeat", "1",
                        "--warmup", "0")
    lines = out.strip().splitlines()
    assert re.match(r"squeezenet\s+\d+\s+yes(\s+[0-9.]+){6}$", lines[-4]), out
    assert re.match(r"gpt_tiny\s+\d+\s+yes(\s+[0-9.]+){6}$", lines[-3]), out
    assert re.fullmatch(r"onnx_models_geomean: [0-9.]+ [0-9.]+", lines[-2]), out
    worst = re.fullmatch(r"worst_model_vs_ort: ([0-9.]+) \((squeezenet|gpt_tiny), (1 thread|all threads)\)", lines[-1])
    assert worst and float(worst.group(1)) > 0, out


def test_graph_prints_its_ratio_lines():
    pytest.importorskip("torch")
    out = run_benchmark("graph.py")
    for name in ("mlp_forward_vs_torch", "mlp_grad_vs_torch_autograd"):
        line = re.search(rf"^{name}: ([0-9.]+) \(\d+ thread\(s\); 1t ([0-9.]+)(, \d+t [0-9.]+)*\)$", out, re.M)
        assert line and float(line.group(1)) > 0 and float(line.group(2)) > 0, out
    for name in ("fused_vs_unfused", "fused_vs_best_peer", "memory_planned_vs_unplanned"):
        assert re.search(rf"^{name}: [0-9.]+$", out, re.M), out
    assert re.fullmatch(r"graph_vs_eager: [0-9.]+", out.strip().splitlines()[-1]), out


def test_kernels_rejects_an_op_without_a_case():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "kernels.py"), "--quick", "--ops", "no_such_op"],
                          env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no case for no_such_op" in done.stderr


def test_device_call_host_runs_its_calls_through_the_remembered_route():
    out = run_benchmark("device_call_host.py", "--rounds", "2", "--number", "200")
    assert re.search(r"calls taken in C [1-9]\d*", out)  # (the script asserts it took every timed op call)
    for line in ("device_call_python_vs_route", "device_call_host_vs_ctypes"):
        assert re.search(rf"^{line}: \d+\.\d\d$", out, re.M), out


def test_jax_bridge_prints_its_ratio_lines():
    pytest.importorskip("jax")
    out = run_benchmark("jax_bridge.py", "--rounds", "1", "--number", "200")
    lines = out.strip().splitlines()
    names = ["jax_eager_op_vs_jnp_add", "jax_value_and_grad_vs_jnp", "jax_op_vs_jit_add"]
    for line, name in zip(lines[-3:], names):
        assert re.fullmatch(rf"{name}: [0-9.]+", line), out
