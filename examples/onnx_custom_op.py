"""A custom ONNX op, PPLNN style: ``ppl::LeakyReLU`` with SSE and AVX2/FMA kernels and an N16CX one.

PPLNN adds a custom x86 op in four steps: parse its parameters from the ONNX
node, define it (type and shape inference, layout selection), write the
call interface that picks a kernel by ISA, and write the kernels, one file
per instruction set.  With opforge the same op is one declaration:

* the schema names the domain (``ppl``) and the parameter (``alpha``, read
  from the node's attribute of that name, default 0.01);
* ``same_as(0)`` is PPLNN's GenericInferType + ReshapeLeakyReLU;
* one kernel per ISA (``isa="sse41"``, ``isa="avx2"``: compiled with -mavx2
  -mfma); dispatch runs the best one the CPU has, as ``MayUseISA`` does;
* ``layout="nchw16c"`` adds the N16CX variant; ``select_layouts`` then plays
  ``SelectFormat``: the op runs blocked when its input arrives blocked (or
  when asked to prefer it), and reorder nodes go where layouts change.

An ONNX model holding a node of domain ``ppl`` and op_type ``LeakyReLU``
binds to it by name: ``opforge.onnx.load`` needs nothing more.

    python examples/onnx_custom_op.py
"""
import numpy as np
from onnx import TensorProto, helper

import opforge
import opforge.onnx
from opforge.graph.passes import select_layouts
from opforge.runtime.dispatch import select_kernel

# -- 1 + 2: parameters, inference -------------------------------------------------
leaky = opforge.op("ppl::LeakyReLU(Tensor x, *, float alpha=0.01) -> Tensor y", traits=["no_side_effect"],
                   replace=True)
leaky.def_infer(opforge.infer.same_as(0))


@leaky.reference(fallback=True)  # the semantics; also runs for dtypes without a kernel
def leaky_reference(x, alpha=0.01):
    return np.where(x > 0, x, x * np.float32(alpha)).astype(x.dtype, copy=False)


# -- 4: kernels, one source per ISA (leaky_relu_fp32_sse.cpp / _avx.cpp in PPLNN) ---------
# Both work on the whole buffer: in N16CX (OPFORGE_LAYOUT_NCHW16C) that is
# N x ceil(C/16)*16 x H x W elements, channel padding included.
COMMON = r"""
#include <immintrin.h>
#include "custom_aot_extra.h"

static int64_t element_count(int *ndims, int64_t **shapes) {
#ifdef OPFORGE_LAYOUT_NCHW16C
  if (ndims[0] != 4) return -1;
  return shapes[0][0] * ((shapes[0][1] + 15) / 16 * 16) * shapes[0][2] * shapes[0][3];
#else
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  return n;
#endif
}
"""

SSE = COMMON + r"""
// y = max(x, 0) + alpha * min(x, 0), four floats at a time.
extern "C" int LeakyReluSse(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  const float alpha = static_cast<AotExtra *>(extra)->Attr<float>("alpha");
  const int64_t n = element_count(ndims, shapes);
  if (n < 0) return 3;  // N16CX needs a 4-d tensor
  const __m128 zero = _mm_setzero_ps(), a = _mm_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m128 v = _mm_loadu_ps(x + i);
    _mm_storeu_ps(y + i, _mm_add_ps(_mm_max_ps(v, zero), _mm_mul_ps(a, _mm_min_ps(v, zero))));
  }
  for (; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : alpha * x[i];
  return 0;
}
"""

AVX2 = COMMON + r"""
// y = fma(alpha, min(x, 0), max(x, 0)), eight floats at a time.
extern "C" int LeakyReluFma(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  const float alpha = static_cast<AotExtra *>(extra)->Attr<float>("alpha");
  const int64_t n = element_count(ndims, shapes);
  if (n < 0) return 3;
  const __m256 zero = _mm256_setzero_ps(), a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_min_ps(v, zero), _mm256_max_ps(v, zero)));
  }
  for (; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : alpha * x[i];
  return 0;
}
"""

for layout in ("ndarray", "nchw16c"):
    leaky.kernel(code=SSE, function="LeakyReluSse", dtypes={"x": ["float32"]}, isa="sse41", layout=layout)
    leaky.kernel(code=AVX2, function="LeakyReluFma", dtypes={"x": ["float32"]}, isa="avx2", layout=layout)


# -- the model: Relu(x) + ppl::LeakyReLU(x) ------------------------------------------------
def build_model(channels=20, alpha=0.2):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("LeakyReLU", ["x"], ["l"], domain="ppl", alpha=alpha),
             helper.make_node("Add", ["r", "l"], ["y"])]
    shape = ["N", channels, 4, 4]  # N: a dim_param, any batch size
    graph = helper.make_graph(nodes, "ppl_leaky", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ppl", 1)])


def expected(x, alpha=0.2):
    return np.maximum(x, 0) + np.where(x > 0, x, x * np.float32(alpha))


def main():
    model = build_model()
    graph = opforge.onnx.load(model)
    reorders = select_layouts(graph, prefer="nchw16c")
    print(graph)
    node = next(n for n in graph.nodes if not n.is_constant and n.op is leaky)
    print(f"{reorders} reorder node(s); ppl::LeakyReLU runs {node.kernel.name}")
    x = np.random.default_rng(0).standard_normal((2, 20, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(graph(x), expected(x), rtol=1e-6, atol=1e-6)
    eager = select_kernel(leaky, [opforge.TensorSpec(x.shape, "float32")])
    print(f"eager calls run {eager.name}; results match NumPy")


if __name__ == "__main__":
    main()
