"""Memory safety of native kernel calls: impossible workspace requests, writes
past the end of outputs and workspaces (canaries by default, guard pages in
checked mode), and never-written outputs found by check_op.

Kernels that misbehave run in a subprocess, so a regression crashes that
process, not pytest.  The kernels are in tests/kernels/memory_faults.cc.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opforge
from helpers import declare
from opforge.errors import AllocationError, KernelError, OpforgeError
from opforge.testing import OpCheckFailure, check_op

KERNELS = Path(__file__).resolve().parent / "kernels"
SOURCE = KERNELS / "memory_faults.cc"

# Runs each named kernel of memory_faults.cc as an op on 16 floats: twice
# through the op (the launcher), once through AotKernel.run, and in two graphs
# (its output a graph output; its output an intermediate).  Prints JSON:
# {function: {path: [error type, message] or ["ok", values]}}.
SCENARIOS = r"""
import json, sys
import numpy as np
import opforge
from opforge import TensorSpec, infer, ops

source, functions = sys.argv[1], sys.argv[2].split(",")
x = np.arange(16, dtype=np.float32)

def attempt(call):
    try:
        return ["ok", np.asarray(call()).tolist()]
    except Exception as error:
        return [type(error).__name__, str(error)]

results = {}
for function in functions:
    op = opforge.op(f"memtest::{function.lower()}(Tensor x) -> Tensor y")
    op.def_infer(infer.same_as(0))
    kernel = op.kernel(source=f"{source}:{function}")
    spec = TensorSpec([16], "float32")
    results[function] = {
        "call": attempt(lambda: op(x)),
        "second call": attempt(lambda: op(x)),
        "run": attempt(lambda: kernel.run(op, [x], {}, [spec])[0]),
        "graph output": attempt(lambda: opforge.trace(lambda v: op(v), spec)(x)),
        "graph intermediate": attempt(lambda: opforge.trace(lambda v: ops.relu(op(v)), spec)(x)),
        # made in place as the first part of a concat: its canary lies on the second part
        "concat part": attempt(lambda: opforge.trace(lambda v: ops.concat(op(v), ops.relu(v), axis=0), spec)(x)),
    }
    sys.stdout.flush()
print(json.dumps(results))
"""


def run_scenarios(functions, checked=False):
    env = dict(os.environ, OPFORGE_CHECK="1" if checked else "0")
    done = subprocess.run([sys.executable, "-c", SCENARIOS, str(SOURCE), ",".join(functions)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the subprocess died ({done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def default_mode():
    return run_scenarios(["Good", "OutputOverrun", "WorkspaceOverrun", "HugeWorkspace", "UnsatisfiableWorkspace"])


@pytest.fixture(scope="module")
def checked_mode():
    return run_scenarios(["Good", "OutputOverrun", "WorkspaceOverrun", "UnsatisfiableWorkspace"], checked=True)


PATHS = ["call", "second call", "run", "graph output", "graph intermediate", "concat part"]


@pytest.mark.parametrize("mode", ["default_mode", "checked_mode"])
def test_a_normal_kernel_is_unaffected(mode, request):
    results = request.getfixturevalue(mode)["Good"]
    for path in PATHS:
        assert results[path] == ["ok", list(range(16)) * (2 if path == "concat part" else 1)], path


@pytest.mark.parametrize("function", ["HugeWorkspace", "UnsatisfiableWorkspace"])
def test_impossible_workspace_is_a_typed_error_on_every_call(default_mode, function):
    for path in PATHS:
        kind, message = default_mode[function][path]
        assert kind == "AllocationError", (path, message)
        assert f"memtest::{function.lower()}" in message and f"{function}Init" in message, message
    # the sizes are named: the wrapping pair as requested, the representable one as rounded
    if function == "HugeWorkspace":
        assert "[9223372036854775808, 9223372036854775808]" in default_mode[function]["call"][1]
    else:
        assert str(1 << 52) in default_mode[function]["call"][1]


def test_unsatisfiable_workspace_in_checked_mode(checked_mode):
    for path in PATHS:
        kind, message = checked_mode["UnsatisfiableWorkspace"][path]
        assert kind == "AllocationError" and "cannot allocate" in message, (path, message)


@pytest.mark.parametrize("function, buffer", [("OutputOverrun", "output 'y'"), ("WorkspaceOverrun", "workspace 0")])
def test_canary_catches_writes_past_the_end(default_mode, function, buffer):
    for path in PATHS:
        kind, message = default_mode[function][path]
        assert kind == "KernelError", (path, message)
        assert f"kernel function '{function}'" in message and f"op 'memtest::{function.lower()}'" in message
        assert f"wrote past the end of {buffer}; the process may be corrupt" in message, (path, message)
        assert "OPFORGE_CHECK=1 stops the kernel" in message, (path, message)  # what to do next


@pytest.mark.parametrize("function, buffer", [("OutputOverrun", "output 'y'"), ("WorkspaceOverrun", "workspace 0")])
def test_checked_mode_stops_writes_at_the_guard_page(checked_mode, function, buffer):
    for path in PATHS:
        kind, message = checked_mode[function][path]
        assert kind == "KernelError", (path, message)
        assert f"kernel function '{function}'" in message
        assert f"wrote past the end of {buffer} (stopped at its guard page" in message, (path, message)


THREADS = r"""
import sys, threading
import numpy as np
import opforge
from opforge import infer

source = sys.argv[1]
ops = {}
for function in ("Good", "OutputOverrun"):
    ops[function] = opforge.op(f"memtest::{function.lower()}(Tensor x) -> Tensor y")
    ops[function].def_infer(infer.same_as(0))
    ops[function].kernel(source=f"{source}:{function}")
x = np.arange(16, dtype=np.float32)
problems = []

def work(function):
    for _ in range(25):
        try:
            y = ops[function](x)
            if function != "Good" or not np.array_equal(y, x):
                problems.append(f"{function} returned {y}")
        except opforge.KernelError as error:
            if function == "Good" or "wrote past the end of output 'y' (stopped" not in str(error):
                problems.append(f"{function}: {error}")

threads = [threading.Thread(target=work, args=(f,)) for f in ("Good", "OutputOverrun") * 3]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(problems or "fine")
"""


def test_checked_mode_is_per_thread():
    """Threads fault on their own guard pages while others run well-behaved kernels."""
    env = dict(os.environ, OPFORGE_CHECK="1")
    done = subprocess.run([sys.executable, "-c", THREADS, str(SOURCE)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"the subprocess died ({done.returncode}):\n{done.stderr[-3000:]}"
    assert done.stdout.strip() == "fine"


@pytest.mark.parametrize("checked", [False, True])
def test_native_plan_refuses_sizes_that_wrap(fresh, checked):
    """The native side checks sizes itself, whatever the planner hands it: no kernel runs."""
    op = declare(fresh, "memtest::wrap(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    kernel = op.kernel(source=f"{SOURCE}:HugeWorkspace")
    kernel.load()
    x = np.arange(16, dtype=np.float32)
    plan = (kernel._function, ((16,),), (np.dtype(np.float32),), (1 << 63, 1 << 63), ("float32", "float32"), None)
    opforge.set_checks(checked)
    try:
        outputs, rc, error = opforge._native.run_plan(plan, (x,))
    finally:
        opforge.set_checks(False)
    assert outputs is None and error[0] == "alloc"
    sizes = [int(s) for s in error[1].split()[1:]]
    assert sizes in ([1 << 63, 1 << 63], [1 << 63])


def test_allocation_error_is_a_kernel_and_memory_error():
    assert issubclass(AllocationError, KernelError) and issubclass(AllocationError, MemoryError)
    assert issubclass(AllocationError, OpforgeError)


def test_set_checks_switches_checked_mode():
    assert not opforge.checks_enabled()
    opforge.set_checks(True)
    try:
        assert opforge.checks_enabled()
    finally:
        opforge.set_checks(False)
    assert not opforge.checks_enabled()
    with pytest.raises(OpforgeError, match="set_checks takes True or False"):
        opforge.set_checks("yes")
    assert not opforge.checks_enabled()


def test_outputs_are_ordinary_arrays(fresh):
    op = declare(fresh, "memtest::good(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{SOURCE}:Good")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for checked in (False, True):
        opforge.set_checks(checked)
        try:
            y = op(x)
        finally:
            opforge.set_checks(False)
        assert y.flags.c_contiguous and y.flags.writeable and y.flags.owndata and y.base is None
        np.testing.assert_array_equal(y, x)
        y.resize(12, refcheck=False)  # NumPy can still resize (realloc) and free it
        y[6:] = 1
        assert y.sum() == x.sum() + 6


def test_check_op_reports_never_written_output(fresh):
    op = declare(fresh, "memtest::half(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{SOURCE}:HalfWrite")
    with pytest.raises(OpCheckFailure, match=r"HalfWrite writes every element of output 'y': 8 of 16 element"):
        check_op(op, np.arange(16, dtype=np.float32))


def test_check_op_passes_a_kernel_that_writes_everything(fresh):
    op = declare(fresh, "memtest::good(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{SOURCE}:Good")
    checks = check_op(op, np.arange(16, dtype=np.float32))
    assert [ok for name, ok, _ in checks if name == "kernel Good writes every element of output 'y'"] == [True]


@pytest.mark.parametrize("checks", [False, True])
def test_graphs_run_node_by_node_size_blocked_layouts_by_their_padding(checks):
    """A graph run node by node (checked mode, or a node with only a Python kernel: layer_norm
    without a bias) gives an nchw16c value its padded size; 20 channels pad to 32."""
    from opforge import ops

    x = np.random.default_rng(0).standard_normal((1, 20, 2, 3))

    def fn(x):
        blocked = ops.reorder(x, layout="nchw16c")
        return ops.layer_norm(ops.reorder(ops.relu(blocked), layout="ndarray"), np.ones(3))[0]

    graph = opforge.trace(fn, x)
    opforge.set_checks(checks)
    try:
        y = graph(x)
    finally:
        opforge.set_checks(False)
    relu = np.maximum(x, 0)
    expected = (relu - relu.mean(-1, keepdims=True)) / np.sqrt(relu.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, expected, rtol=1e-7, atol=1e-9)
