"""opforge ops on JAX arrays on a GPU: eagerly through DLPack (on JAX's stream, the output a JAX array on
the same GPU) and under jax.jit, where XLA calls opforge's GPU FFI handler.  They need a CUDA device that
JAX sees; CI has none, and the host side of the same paths is tested in test_dlpack.py and
test_jax_bridge.py."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import opforge
from helpers import declare
from opforge import ops
from opforge.runtime import cuda


def _jax_gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:  # JAX has no GPU backend here
        return None


GPU = _jax_gpu()
pytestmark = pytest.mark.skipif(GPU is None or cuda.device_count() == 0,
                                reason="no CUDA device that JAX sees (jax.devices('gpu') is empty or "
                                       "opforge.cuda.device_count() == 0)")


def on_gpu(array):
    return jax.device_put(array, GPU)


def test_eager_calls_on_jax_gpu_arrays_stay_on_that_gpu(dlpack_path_only):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    gx = on_gpu(x)
    y = ops.relu(gx)
    assert isinstance(y, jax.Array) and y.devices() == {GPU}
    np.testing.assert_array_equal(np.asarray(y), np.maximum(x, 0))
    total = ops.reduce_sum(gx, axes=[1], keep_dims=False)
    assert total.devices() == {GPU}
    np.testing.assert_allclose(np.asarray(total), x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


def test_jit_runs_the_gpu_kernels_on_xlas_buffers():
    import opforge.jax  # noqa: F401  (opforge ops become XLA custom calls)

    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    w = rng.standard_normal((64, 16)).astype(np.float32)

    @jax.jit
    def f(x, w):
        return ops.reduce_sum(ops.relu(ops.matmul(x, w)), axes=[1], keep_dims=False)

    out = f(on_gpu(x), on_gpu(w))
    assert out.devices() == {GPU}
    expected = np.maximum(x.astype(np.float64) @ w, 0).sum(1)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-4)
    assert "opforge_call" in jax.jit(f).lower(on_gpu(x), on_gpu(w)).as_text()


OPS_CC = Path(__file__).resolve().parent / "kernels" / "ops.cc"


def test_jit_on_the_gpu_of_an_op_with_only_a_cpu_kernel_names_the_op(fresh):
    import opforge.jax  # noqa: F401

    op = declare(fresh, "tjaxgpu::twice(Tensor x, *, float scale=2.0) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(source=f"{OPS_CC}:Scale", dtypes={"x": ["float32"]})  # a C++ kernel alone
    x = jnp.arange(4, dtype=jnp.float32)
    with pytest.raises(Exception, match=r"opforge.DeviceError: op 'tjaxgpu::twice' has no gpu kernel"):
        np.asarray(jax.jit(op)(on_gpu(x)))  # (JAX 0.11's block_until_ready would lose the message)
    with jax.default_device(jax.devices("cpu")[0]):  # the way out the message names
        assert np.asarray(jax.jit(op)(jax.device_put(x, jax.devices("cpu")[0]))).tolist() == [0, 2, 4, 6]
