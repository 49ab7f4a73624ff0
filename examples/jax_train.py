"""Train a small JAX model whose activation is an opforge C++ op, with jax.jit(jax.grad(...)).

`softplus` is declared once -- schema, inference, a C++ kernel and a CUDA one
(softplus.cc, softplus.cu), a gradient rule.
Importing `opforge.jax` makes every opforge op called on JAX values an XLA FFI
custom call, so the op runs inside the jitted training step, and its gradient
comes from the rule.  It runs wherever JAX puts the step: on the GPU where JAX
has one (the CUDA kernel is compiled by nvcc at its first use), else on the CPU.
"""
from pathlib import Path

import jax
import jax.numpy as jnp

import opforge
import opforge.jax
from opforge import ops

HERE = Path(__file__).resolve().parent  # softplus.cc and softplus.cu, the kernels

softplus = opforge.op("jaxmlp::softplus(Tensor x) -> Tensor y", traits=["no_side_effect", "elementwise"], replace=True,
                      doc="log(1 + exp(x)), computed without overflow.")
softplus.def_infer(opforge.infer.same_as(0))
softplus.kernel(source=f"{HERE / 'softplus.cc'}:Softplus", dtypes={"x": ["float32", "float64"]})
softplus.kernel(source=f"{HERE / 'softplus.cu'}:SoftplusGpu", device="gpu", dtypes={"x": ["float32", "float64"]})


@softplus.grad(save=["x"])
def _(saved, dy):
    return ops.mul(dy, ops.sigmoid(saved.x))


def predict(params, x):
    hidden = softplus(x @ params["w1"] + params["b1"])  # an XLA FFI call to the C++ kernel
    return hidden @ params["w2"] + params["b2"]


def loss(params, x, target):
    return jnp.mean((predict(params, x) - target) ** 2)


@jax.jit
def step(params, x, target, rate=0.1):
    value, grads = jax.value_and_grad(loss)(params, x, target)
    return value, jax.tree_util.tree_map(lambda p, g: p - rate * g, params, grads)


def main(steps=200):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(k1, (256, 8))
    target = jnp.sin(x.sum(axis=1, keepdims=True))
    params = {"w1": 0.5 * jax.random.normal(k2, (8, 32)), "b1": jnp.zeros(32),
              "w2": 0.2 * jax.random.normal(k3, (32, 1)), "b2": jnp.zeros(1)}
    losses = []
    for k in range(steps):
        value, params = step(params, x, target)
        losses.append(float(value))
        if k % 40 == 0 or k == steps - 1:
            print(f"step {k:3d}  loss {float(value):.4f}")
    return losses


if __name__ == "__main__":
    main()
