"""Every built-in op inside jax.jit on its samples (tests/builtin_samples.py): the XLA custom
call gives the op's own result, and jax.test_util.check_grads passes for every sample with a
gradient (64-bit types on: the samples are float64)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import opforge.jax  # noqa: F401 - opforge ops on JAX values become XLA FFI calls
from builtin_samples import GRAPH_ONLY, SAMPLES, op_named, samples_for

pytestmark = pytest.mark.usefixtures("jax_on_host")  # JAX on a GPU: test_jax_gpu.py

CASES = [(name, k) for name in sorted(SAMPLES) for k in range(len(SAMPLES[name])) if name not in GRAPH_ONLY]
IDS = [f"{name}-{k}" for name, k in CASES]
GRADIENT_CASES = [(name, k) for name, k in CASES if SAMPLES[name][k].differentiable]


@pytest.fixture(autouse=True)
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@pytest.mark.parametrize("name, k", CASES, ids=IDS)
def test_jitted_call_matches_the_op(name, k):
    op, sample = op_named(name), samples_for(name)[k]
    expected = as_tuple(op(*sample.args, **sample.attrs))

    def f(*arrays):
        return op(*arrays, **sample.attrs)

    got = as_tuple(jax.jit(f)(*[None if a is None else jnp.asarray(a) for a in sample.args]))
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name, k", GRADIENT_CASES, ids=[f"{n}-{k}" for n, k in GRADIENT_CASES])
def test_check_grads(name, k):
    op, sample = op_named(name), samples_for(name)[k]
    fixed = [None if a is None else jnp.asarray(a) for a in sample.args]

    def f(*varied):
        call = list(fixed)
        for index, value in zip(sample.differentiable, varied):
            call[index] = value
        return tuple(o for o in as_tuple(op(*call, **sample.attrs)) if jnp.issubdtype(o.dtype, jnp.floating))

    check_grads(f, tuple(fixed[i] for i in sample.differentiable), order=1, modes=["rev"], eps=1e-6,
                atol=1e-5, rtol=1e-5)
