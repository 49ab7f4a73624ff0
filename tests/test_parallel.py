"""opforge's thread pool (opforge/parallel.h, opforge.set_num_threads): kernels run ranges
on several threads, results are exact, errors come back, nothing deadlocks (nested
calls, calls from several Python threads, a forked child)."""
import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import opforge
from helpers import declare

# y[i] = x[i] + 100 * (the pool thread that wrote it); each range spins a little, so
# that every thread gets some; x[0] == -1 throws from inside a range.
WHO_WROTE = r"""
#include <chrono>
#include <stdexcept>
#include "opforge/parallel.h"
extern "C" int WhoWrote(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *stream, void *extra) {
  const double *x = static_cast<const double *>(params[0]);
  double *y = static_cast<double *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  opforge::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    if (x[0] == -1) throw std::runtime_error("a range failed");
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(300);
    while (std::chrono::steady_clock::now() < until) {}
    opforge::parallel_for(lo, hi, 1, [&](int64_t a, int64_t b) {  // nested: runs serially
      for (int64_t i = a; i < b; i++) y[i] = x[i] + 100 * opforge::thread_index();
    });
  });
  return 0;
}
"""


@pytest.fixture
def who_wrote(fresh):
    op = declare(fresh, "tparallel::who_wrote(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(code=WHO_WROTE, function="WhoWrote", dtypes={"x": ["float64"]})
    return op


def test_ranges_run_on_every_thread_and_cover_the_range_once(who_wrote, set_threads):
    x = np.arange(64.0)
    set_threads(2)
    seen = set()
    for _ in range(20):  # a busy machine may leave one thread descheduled for a whole call: try again
        writers = (who_wrote(x) - x) / 100
        assert set(writers.tolist()) <= {0.0, 1.0}  # every element written, by the caller or the worker
        seen |= set(writers.tolist())
        if seen == {0.0, 1.0}:
            break
    assert seen == {0.0, 1.0}  # both took ranges
    set_threads(1)
    np.testing.assert_array_equal(who_wrote(x), x)  # serial: all by the caller


def test_an_exception_in_a_range_is_a_kernel_error(who_wrote, set_threads):
    set_threads(2)
    with pytest.raises(opforge.KernelError, match="a range failed"):
        who_wrote(np.full(32, -1.0))
    np.testing.assert_array_equal(who_wrote(np.zeros(8)) % 100, np.zeros(8))  # the pool still works


def test_kernels_on_several_python_threads_share_the_pool(who_wrote, set_threads):
    set_threads(2)
    x = np.arange(40.0)
    results, errors = [], []

    def run():
        try:
            for _ in range(20):
                results.append(np.array_equal(who_wrote(x) % 100, x % 100))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    workers = [threading.Thread(target=run) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert not errors and len(results) == 80 and all(results)


def test_the_pools_size(set_threads):
    set_threads(3)
    assert opforge.get_num_threads() == 3
    for bad in (0, -2, 1.5, "2", True):
        with pytest.raises(opforge.OpforgeError, match="positive int"):
            opforge.set_num_threads(bad)
    code = "import opforge; print(opforge.get_num_threads())"
    env = {**os.environ, "OPFORGE_NUM_THREADS": "5"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "5", done.stderr
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == str(len(os.sched_getaffinity(0)))


def test_a_forked_child_makes_its_own_pool(who_wrote, set_threads):
    set_threads(2)
    x = np.arange(16.0)
    who_wrote(x)  # the parent's pool exists
    child = os.fork()
    if child == 0:  # the child: a kernel on the pool must not wait for the parent's workers
        ok = False
        try:
            ok = np.array_equal(who_wrote(x) % 100, x % 100)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_set_num_threads_leaves_openblas_on_one_thread(set_threads):
    from opforge.runtime import blas

    if not blas.available():
        pytest.skip(f"OpenBLAS: {blas.reject_reason()}")
    handle = blas.load()
    given = handle.scipy_openblas_get_num_threads()
    for count in (1, 3, 2):
        set_threads(count)  # the pool's threads multiply (OpforgeGemmParallel); OpenBLAS adds none
        assert handle.scipy_openblas_get_num_threads() == given
    x = np.random.default_rng(0).standard_normal((200, 300)).astype(np.float32)
    np.testing.assert_allclose(opforge.ops.matmul(x, x.T), x @ x.T, rtol=1e-4, atol=1e-4)


def test_openblas_loads_on_one_thread_unless_given_its_own():
    from opforge.runtime import blas

    if not blas.available():
        pytest.skip(f"OpenBLAS: {blas.reject_reason()}")
    code = ("import opforge; from opforge.runtime import blas; opforge.set_num_threads(3); "
            "print(blas.load().scipy_openblas_get_num_threads())")
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_BLAS_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "1", done.stderr  # the pool's threads multiply; OpenBLAS adds none
    done = subprocess.run([sys.executable, "-c", code], env={**env, "OPFORGE_BLAS_THREADS": "2"},
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "2", done.stderr


def test_opforge_puts_nothing_into_the_global_symbol_scope(who_wrote):
    """Libraries loaded after opforge (torch's, JAX's) must bind their symbols where they would without it:
    neither _native, nor its C++ runtime through it, nor a kernel library is global."""
    code = ("import ctypes, numpy as np, opforge\n"
            "opforge.ops.relu(np.ones(3, np.float32))\n"
            "for name in ('opforge_parallel_for', 'opforge_parallel_table', 'opforge_parallel_api', 'PyInit__native'):\n"
            "    assert not hasattr(ctypes.CDLL(None), name), name\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr
    who_wrote(np.arange(4.0))
    assert not hasattr(ctypes.CDLL(None), "opforge_parallel_api")  # this process too, after its kernels
