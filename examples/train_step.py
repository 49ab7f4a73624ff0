"""Train a two-layer MLP whose activation is a custom C++ op.

`softplus` is declared once -- schema, inference, a C++ kernel and a gradient
rule that calls a second C++ op, `softplus_grad` (the forward/backward pair
pattern).  `opforge.value_and_grad` traces the loss into a graph and builds
its backward graph from the ops' rules; each SGD step runs both graphs.
"""
from pathlib import Path

import numpy as np

import opforge
from opforge import ops

HERE = Path(__file__).resolve().parent  # softplus.cc, the forward kernel

softplus = opforge.op("mlp::softplus(Tensor x) -> Tensor y", traits=["no_side_effect"], replace=True,
                      doc="log(1 + exp(x)), computed without overflow.")
softplus.def_infer(opforge.infer.same_as(0))
softplus.kernel(source=f"{HERE / 'softplus.cc'}:Softplus", dtypes={"x": ["float32", "float64"]})

softplus_grad = opforge.op("mlp::softplus_grad(Tensor dy, Tensor x) -> Tensor dx", replace=True,
                           doc="dy * sigmoid(x), the gradient of softplus.")
softplus_grad.def_infer(opforge.infer.same_as(0))
softplus_grad.kernel(function="SoftplusGrad", dtypes={"dy": ["float32", "float64"], "x": ["float32", "float64"]},
                     code=r"""
#include <cmath>
#include "custom_aot_extra.h"

extern "C" int SoftplusGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  const OPFORGE_T *dy = static_cast<const OPFORGE_T *>(params[0]);
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[1]);
  OPFORGE_T *dx = static_cast<OPFORGE_T *>(params[2]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] / (OPFORGE_T(1) + std::exp(-x[i]));
  return 0;
}
""")


@softplus.grad(save=["x"])
def _(saved, dy):
    return ops.mlp.softplus_grad(dy, saved.x)


def loss(w1, b1, w2, b2, x, target):
    hidden = ops.mlp.softplus(x @ w1 + b1)
    error = hidden @ w2 + b2 - target
    return ops.reduce_sum(error * error) * np.float32(1.0 / target.shape[0])


def main(steps=30, learning_rate=0.05):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    target = np.sin(x[:, :2] * 1.5) + 0.1 * rng.standard_normal((64, 2)).astype(np.float32)
    params = [rng.standard_normal((8, 32)).astype(np.float32) * 0.3, np.zeros(32, np.float32),
              rng.standard_normal((32, 2)).astype(np.float32) * 0.3, np.zeros(2, np.float32)]
    step = opforge.value_and_grad(loss, argnums=(0, 1, 2, 3))
    history = []
    for i in range(steps):
        value, grads = step(*params, x, target)
        params = [p - learning_rate * g for p, g in zip(params, grads)]
        history.append(float(value))
        if i % 5 == 0 or i == steps - 1:
            print(f"step {i:3d}  loss {float(value):.4f}")
    return history


if __name__ == "__main__":
    history = main()
    print("loss decreased" if history[-1] < history[0] else "loss did NOT decrease")
