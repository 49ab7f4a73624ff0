"""Every cache (launchers, resolved signatures, Init states, attribute
extras, graph plans, the functional API) under contention: many threads, a
tiny switch interval, more shapes and attribute values than the caches hold,
and the ISA cap toggled meanwhile.  Each thread checks its own results."""
import sys
import threading

import numpy as np
import pytest

import opforge
from helpers import declare

SCALED = r"""
#include "custom_aot_extra.h"

struct Factor : AotKernelData { explicit Factor(float v) : value(v) {} float value; };

extern "C" int ScaledInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  extra->SetKernelData(new Factor(extra->Attr<float>("factor")));
  extra->SetWorkSpace({static_cast<size_t>(shapes[0][0]) * sizeof(float)});
  return 0;
}

extern "C" int Scaled(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  auto *factor = static_cast<Factor *>(static_cast<AotExtra *>(extra)->KernelData());
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  float *scratch = static_cast<float *>(params[2]);
  for (int64_t i = 0; i < shapes[0][0]; i++) scratch[i] = x[i] * factor->value;
  for (int64_t i = 0; i < shapes[0][0]; i++) y[i] = scratch[i];
  return 0;
}
"""

THREADS = 8
ROUNDS = 150


@pytest.fixture
def contention():
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def run_threads(work):
    errors = []
    start = threading.Barrier(THREADS)

    def body(seed):
        try:
            start.wait()
            work(np.random.default_rng(seed))
        except BaseException as error:  # noqa: BLE001 - reported below with its thread
            errors.append(error)

    threads = [threading.Thread(target=body, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


def test_caches_under_contention(fresh, contention):
    scaled = declare(fresh, "stress::scaled(Tensor x, *, float factor=1.0) -> Tensor y")
    scaled.def_infer(opforge.infer.same_as(0))
    kernel = scaled.kernel(code=SCALED, function="Scaled", dtypes={"x": ["float32"]})
    kernel.init_cache_size = 3  # far fewer than the shapes x factors used below
    graph = opforge.trace(lambda x: opforge.ops.relu(x) * 2.0, opforge.TensorSpec([None], "float32"))
    leaky_relu = opforge.lookup("leaky_relu")
    stop = threading.Event()

    def toggle_isa_cap():
        caps = ["sse41", None, "avx2", None]
        k = 0
        while not stop.is_set():
            opforge.set_isa_cap(caps[k % len(caps)])
            opforge.Op(f"stress::passing_{k % 7}", ["x"], ["y"])  # ops come and go while caps reset them all
            k += 1
        opforge.set_isa_cap(None)

    def work(rng):
        for _ in range(ROUNDS):
            n = int(rng.integers(1, 150))
            x = rng.standard_normal(n).astype(np.float32)
            factor = float(rng.integers(1, 100))
            np.testing.assert_allclose(scaled(x, factor=factor), x * np.float32(factor), rtol=1e-6)
            np.testing.assert_allclose(opforge.ops.stress.scaled(x, factor=factor), x * np.float32(factor),
                                       rtol=1e-6)
            alpha = float(rng.integers(1, 400)) / 1000
            np.testing.assert_allclose(leaky_relu(x, alpha=alpha), np.where(x > 0, x, x * np.float32(alpha)),
                                       rtol=1e-6)
            m = rng.standard_normal((n, 3)).astype(np.float32)
            axes = [int(rng.integers(0, 2))]
            np.testing.assert_allclose(opforge.ops.reduce_sum(m, axes=axes), m.sum(axis=axes[0]), rtol=1e-5,
                                       atol=1e-5)
            np.testing.assert_allclose(graph(x), np.maximum(x, 0) * 2, rtol=1e-6)

    toggler = threading.Thread(target=toggle_isa_cap)
    toggler.start()
    try:
        run_threads(work)
    finally:
        stop.set()
        toggler.join()
    assert kernel.init_cache_entries <= 3


def test_bounded_cache_makes_each_key_once(contention):
    from opforge.bounded_cache import BoundedCache

    cache = BoundedCache(4, lru=True)
    made = []
    lock = threading.Lock()

    def make(key):
        with lock:
            made.append(key)
        return ("value", key)

    def work(rng):
        for _ in range(2000):
            key = int(rng.integers(0, 3))  # fits: no evictions, so each key is made once
            assert cache.get_or_create(key, lambda: make(key)) == ("value", key)

    run_threads(work)
    assert sorted(made) == [0, 1, 2]

    evicted = []
    small = BoundedCache(2, on_evict=lambda k, v: evicted.append(k))
    for key in range(5):
        small.put(key, key)
    assert evicted == [0, 1, 2] and len(small) == 2 and 4 in small
