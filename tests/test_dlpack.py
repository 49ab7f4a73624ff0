"""Arrays of other libraries in, the same kind out, through DLPack, with no copy.

torch and JAX are in the test extra, so these run in CI (CPU arrays); the GPU
side is in test_gpu_*.py.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import opforge
from opforge import ops

from helpers import addresses_op, declare

pytestmark = pytest.mark.usefixtures("jax_on_host", "dlpack_path_only")


@pytest.fixture
def addresses(fresh):
    return addresses_op(fresh, "tdlpack::addresses")


def torch_address(tensor):
    return tensor.data_ptr()


def jax_address(array):
    return array.unsafe_buffer_pointer()


def test_torch_cpu_tensors_reach_the_kernel_unchanged(addresses):
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.ones(5, dtype=torch.float64)
    seen = addresses(a, b)
    assert isinstance(seen, torch.Tensor)
    assert seen.tolist()[:2] == [a.data_ptr(), b.data_ptr()]


@pytest.fixture
def jax_x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def test_jax_cpu_arrays_reach_the_kernel_unchanged(addresses, jax_x64):
    a = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    b = jnp.ones(5, dtype=jnp.float32)
    seen = addresses(a, b)
    assert isinstance(seen, jax.Array) and seen.dtype == jnp.int64
    assert [int(v) for v in np.asarray(seen)][:2] == [jax_address(a), jax_address(b)]


def test_a_64_bit_output_jax_would_narrow_is_an_error(addresses):
    with pytest.raises(opforge.DTypeError, match=r"output 'y' is int64, but jax made it int32 .*jax_enable_x64"):
        addresses(jnp.ones(2), jnp.ones(2))


def test_torch_in_torch_out_values_and_no_shared_output():
    x = torch.linspace(-2, 2, 12, dtype=torch.float32).reshape(3, 4)
    y = torch.full((4,), 0.5, dtype=torch.float32)
    out = ops.add(x, y)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (3, 4)
    torch.testing.assert_close(out, x + y)
    assert out.data_ptr() not in (x.data_ptr(), y.data_ptr())
    out += 1  # the output is the caller's to change: inputs are untouched
    torch.testing.assert_close(x, torch.linspace(-2, 2, 12, dtype=torch.float32).reshape(3, 4))


def test_jax_in_jax_out_values():
    x = jnp.linspace(-2, 2, 12, dtype=jnp.float32).reshape(3, 4)
    out = ops.relu(x)
    assert isinstance(out, jax.Array) and out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), np.maximum(np.asarray(x), 0))
    assert float(ops.reduce_sum(x, axes=[0, 1], keep_dims=False)) == pytest.approx(float(jnp.sum(x)), abs=1e-5)


def test_numpy_in_numpy_out_stays_the_plain_path():
    x = np.arange(4, dtype=np.float32)
    out = ops.add(x, x)
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, x + x)


def test_several_outputs_come_back_as_the_kind():
    x = torch.tensor([[3.0, 1.0, 2.0], [0.5, 4.0, -1.0]])
    values, indices = ops.topk(x, k=2, axis=1)
    assert isinstance(values, torch.Tensor) and isinstance(indices, torch.Tensor)
    expected = torch.topk(x, 2, dim=1)
    torch.testing.assert_close(values, expected.values)
    assert indices.tolist() == expected.indices.tolist()


def test_python_scalars_join_any_kind():
    x = torch.arange(4, dtype=torch.float32)
    out = ops.mul(x, 2.0)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_a_strided_view_is_copied_once_and_still_correct():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = base.t()  # not contiguous: the kernel gets a contiguous copy
    out = ops.neg(view)
    torch.testing.assert_close(out, -view)


def test_python_kernels_see_numpy_views_of_torch_memory(fresh):
    op = declare(fresh, "tdlpack::twice(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    seen = []

    @op.kernel
    def _(x):
        seen.append(x.ctypes.data)
        return x * 2

    x = torch.ones(3)
    out = op(x)
    assert isinstance(out, torch.Tensor) and out.tolist() == [2.0, 2.0, 2.0]
    assert seen == [x.data_ptr()]


def test_mixed_kinds_are_a_device_error_naming_the_inputs():
    x = torch.ones(4)
    with pytest.raises(opforge.DeviceError, match=r"'a' is torch on cpu, 'b' is numpy on cpu"):
        ops.add(x, np.ones(4, np.float32))
    with pytest.raises(opforge.DeviceError, match=r"'a' is jax on cpu, 'b' is torch on cpu"):
        ops.add(jnp.ones(4), x)


def test_a_tensor_that_requires_grad_is_a_clear_error():
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(opforge.DeviceError, match=r"op 'relu': input 'x' .*detach"):
        ops.relu(x)


def test_a_dtype_numpy_lacks_is_a_dtype_error():
    x = torch.ones(3, dtype=torch.bfloat16)
    with pytest.raises(opforge.DTypeError, match=r"op 'relu': input 'x' .*bfloat16"):
        ops.relu(x)


def test_keyword_and_functional_calls_take_the_same_path():
    x = torch.tensor([-1.0, 2.0])
    assert opforge.lookup("leaky_relu")(x, alpha=0.5).tolist() == [-0.5, 2.0]
    assert ops.leaky_relu(x, alpha=0.25).tolist() == [-0.25, 2.0]


def test_a_graph_called_on_torch_or_jax_arrays_returns_their_kind():
    graph = opforge.trace(lambda a, b: ops.relu(ops.add(a, b)), np.ones(3, np.float32), np.ones(3, np.float32))
    a, b = torch.tensor([-3.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, -5.0])
    out = graph(a, b)
    assert isinstance(out, torch.Tensor) and out.tolist() == [0.0, 2.0, 0.0]
    out = graph(jnp.asarray(a.numpy()), jnp.asarray(b.numpy()))
    assert isinstance(out, jax.Array) and np.asarray(out).tolist() == [0.0, 2.0, 0.0]
    with pytest.raises(opforge.DeviceError, match=r"'%\w+' is torch on cpu, '%\w+' is numpy on cpu"):
        graph(a, b.numpy())
