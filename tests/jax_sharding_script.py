"""Run by test_jax_sharding.py in a child process: JAX must see 4 host devices from its start
(XLA_FLAGS=--xla_force_host_platform_device_count=4).  Prints one JSON line of results.

    python jax_sharding_script.py [shardy|gspmd]      (the partitioner; Shardy, JAX's default, if not given)
"""
import json
import os
import sys

assert "xla_force_host_platform_device_count=4" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import opforge.jax  # noqa: E402,F401
from opforge import ops  # noqa: E402

jax.config.update("jax_enable_x64", True)
PARTITIONER = sys.argv[1] if len(sys.argv) > 1 else "shardy"
jax.config.update("jax_use_shardy_partitioner", PARTITIONER == "shardy")
mesh = jax.make_mesh((4,), ("i",))
rng = np.random.default_rng(0)
x_host, w_host = rng.standard_normal((8, 3)), rng.standard_normal((3, 5))
x = jax.device_put(x_host, NamedSharding(mesh, P("i")))
w = jax.device_put(w_host, NamedSharding(mesh, P()))
results = {"devices": len(jax.devices()), "partitioner": PARTITIONER}


def model(x, w):
    return ops.reduce_sum(ops.softmax(ops.tanh(ops.matmul(x, w)), axis=1), axes=[1], keep_dims=False) * x[:, 0]


def loss(x, w):
    return jnp.sum(model(x, w) ** 2)


# shard_map, the default check_vma=True: per-shard calls, gradients of the broadcast w summed over shards
sharded = jax.shard_map(model, mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"))
value = jax.jit(sharded)(x, w)
grads = jax.jit(jax.grad(lambda x, w: jnp.sum(sharded(x, w) ** 2), argnums=(0, 1)))(x, w)
expected = model(jnp.asarray(x_host), jnp.asarray(w_host))
expected_grads = jax.grad(loss, argnums=(0, 1))(jnp.asarray(x_host), jnp.asarray(w_host))
results["shard_map_value"] = bool(np.allclose(value, expected, rtol=1e-12, atol=1e-12))
results["shard_map_grad_x"] = bool(np.allclose(grads[0], expected_grads[0], rtol=1e-10, atol=1e-12))
results["shard_map_grad_w"] = bool(np.allclose(grads[1], expected_grads[1], rtol=1e-10, atol=1e-12))
# jax.jit on sharded inputs: each call partitioned by the op's SBP signatures
value = jax.jit(model)(x, w)
grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
results["jit_value"] = bool(np.allclose(value, expected, rtol=1e-12, atol=1e-12))
results["jit_grad_x"] = bool(np.allclose(grads[0], expected_grads[0], rtol=1e-10, atol=1e-12))
results["jit_grad_w"] = bool(np.allclose(grads[1], expected_grads[1], rtol=1e-10, atol=1e-12))
results["jit_value_sharding"] = str(value.sharding.spec)

COLLECTIVES = ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter")


def collectives(f, *args):
    text = jax.jit(f).lower(*args).compile().as_text()
    return sorted(c for c in COLLECTIVES if c in text)


b = jax.device_put(rng.standard_normal(3), NamedSharding(mesh, P()))
results["elementwise_collectives"] = collectives(lambda x, b: ops.tanh(ops.add(x, b)), x, b)
results["rows_matmul_collectives"] = collectives(lambda x, w: ops.matmul(x, w), x, w)
results["row_sums_collectives"] = collectives(lambda x: ops.reduce_sum(x, axes=[1], keep_dims=False), x)
column_sums = jax.jit(lambda x: ops.reduce_sum(x, axes=[0], keep_dims=False))(x)  # over the split axis: a psum
results["column_sums"] = bool(np.allclose(column_sums, x_host.sum(axis=0), rtol=1e-12))
results["column_sums_collectives"] = collectives(lambda x: ops.reduce_sum(x, axes=[0], keep_dims=False), x)
values, indices = jax.jit(lambda x: ops.topk(x, k=2, axis=1))(x)  # two outputs, each sharded as x
want = np.sort(x_host, axis=1)[:, ::-1][:, :2]
results["two_outputs"] = bool(np.array_equal(np.asarray(values), want)
                              and np.array_equal(np.take_along_axis(x_host, np.asarray(indices), 1), want))
eager = ops.tanh(x)  # an eager call on a sharded array: one jitted call, partitioned as under jax.jit
results["eager_sharded"] = [bool(np.allclose(eager, np.tanh(x_host), rtol=1e-12)), str(eager.sharding.spec)]

# A NumPy constant operand: XLA gives it no sharding (GSPMD's None)
constant = np.linspace(-1.0, 1.0, 3)
results["numpy_constant"] = bool(np.allclose(jax.jit(lambda x: ops.mul(x, constant))(x), x_host * constant,
                                             rtol=1e-12))

# jax.vmap, with 4 devices visible: custom_partitioning has no batching rule, so a batched call is the
# plain custom call, batched as on one device (elementwise ops in one call, the others per example)
xs = jnp.asarray(rng.standard_normal((3, 4, 5)))
softmax_rows = np.exp(np.asarray(xs)) / np.exp(np.asarray(xs)).sum(axis=2, keepdims=True)
results["vmap_elementwise"] = bool(np.allclose(jax.vmap(ops.tanh)(xs), np.tanh(np.asarray(xs)), rtol=1e-12))
results["vmap_sequential"] = bool(np.allclose(jax.vmap(lambda v: ops.softmax(v, axis=1))(xs), softmax_rows,
                                              rtol=1e-12))
results["jit_of_vmap"] = bool(np.allclose(jax.jit(jax.vmap(lambda v: ops.softmax(v, axis=1)))(xs), softmax_rows,
                                          rtol=1e-12))
results["vmap_of_jit"] = bool(np.allclose(jax.vmap(jax.jit(lambda v: ops.softmax(v, axis=1)))(xs), softmax_rows,
                                          rtol=1e-12))
bias = jnp.asarray(rng.standard_normal(5))
results["vmap_unbatched_input"] = bool(np.allclose(jax.vmap(ops.add, in_axes=(0, None))(xs, bias),
                                                   np.asarray(xs) + np.asarray(bias), rtol=1e-12))
per_example = jax.vmap(jax.grad(lambda v: jnp.sum(ops.tanh(v) ** 2)))(xs)
results["vmap_of_grad"] = bool(np.allclose(per_example, 2 * np.tanh(xs) * (1 - np.tanh(xs) ** 2), rtol=1e-10))
top_values, _ = jax.vmap(lambda v: ops.topk(v, k=2, axis=1))(xs)
results["vmap_two_outputs"] = bool(np.allclose(top_values, np.sort(np.asarray(xs), axis=2)[..., ::-1][..., :2]))
x_batched = jax.device_put(np.stack([x_host] * 2), NamedSharding(mesh, P(None, "i")))
results["vmap_sharded"] = bool(np.allclose(jax.jit(jax.vmap(lambda v: ops.matmul(v, w)))(x_batched),
                                           np.stack([x_host @ w_host] * 2), rtol=1e-12))
print(json.dumps(results))
