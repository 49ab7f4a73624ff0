"""Run by test_jax_export.py in child processes: a function of opforge ops saved with
jax.export in one process, loaded and run in another.  Prints one JSON line.

    python jax_export_script.py save PATH    # exports the functions to PATH.<name>, prints the expected values
    python jax_export_script.py load PATH    # plans other ops first (other plan indices), runs the saved ones
    python jax_export_script.py load PATH unregistered|mismatched   # texp::twice missing, or declared otherwise
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

import opforge
import opforge.jax  # noqa: F401
from opforge import ops

TWICE = r"""
#include <cstdint>
extern "C" int Twice(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                     void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = 2 * x[i];
  return 0;
}
"""


def declare_twice(dtype="float32"):
    op = opforge.op("texp::twice(Tensor x) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0, dtype=dtype))
    op.kernel(code=TWICE, function="Twice", dtypes={"x": ["float32"]})


FUNCTIONS = {
    "tanh_then_relu": lambda v: ops.relu(ops.tanh(v) - 0.25),  # two ops: tanh, then relu
    "softmax": lambda v: ops.softmax(v, axis=1),  # an attribute
    "twice": lambda v: ops.texp.twice(v),  # an op declared by the program's author
    # an optional input absent: its own native kernel (was the NumPy reference, a host callback jax.export refuses)
    "layer_norm_no_bias": lambda v: ops.layer_norm(v, jnp.linspace(0.5, 2.0, 4, dtype=jnp.float32), None,
                                                   axis=-1)[0],
}
x = jnp.linspace(-2.0, 2.0, 12, dtype=jnp.float32).reshape(3, 4)
mode, path = sys.argv[1], sys.argv[2]
results = {}
if mode == "save":
    declare_twice()
    for name, f in FUNCTIONS.items():
        exported = export.export(jax.jit(f), disabled_checks=[export.DisabledSafetyCheck.custom_call("opforge_call")])(x)
        with open(f"{path}.{name}", "wb") as file:
            file.write(exported.serialize())
        results[name] = np.asarray(f(x)).tolist()
else:
    variant = sys.argv[3] if len(sys.argv) > 3 else "registered"
    if variant == "registered":
        declare_twice()
    elif variant == "mismatched":
        declare_twice(dtype="int32")  # its outputs differ from the saved program's
    # Other ops planned first, in another order: the saved plan indices name other plans here
    for f in (lambda v: ops.softmax(v, axis=0), ops.relu, ops.exp, lambda v: ops.add(v, v), ops.tanh):
        jax.block_until_ready(jax.jit(f)(jnp.ones((3, 4))))
    for name in FUNCTIONS:
        with open(f"{path}.{name}", "rb") as file:
            exported = export.deserialize(bytearray(file.read()))
        try:
            results[name] = np.asarray(exported.call(x)).tolist()
        except Exception as error:  # noqa: BLE001  # the message goes back to the test
            results[name] = f"{type(error).__name__}: {error}"
print(json.dumps(results))
