"""layer_norm: x normalised over its dims from ``axis`` on, then scaled and shifted (ONNX LayerNormalization).

``y = (x - mean) * inv_std_dev * scale + bias`` where mean and
``inv_std_dev = 1 / sqrt(var + epsilon)`` (population variance) are taken
over dims ``axis..rank-1``; scale and bias broadcast against those dims.
The op also returns mean and inv_std_dev, shaped like x with the
normalised dims set to 1 (ONNX's optional outputs).  The kernel (float32,
float64; generic and AVX2 builds; rows on opforge's pool) takes each row's
mean in double vector lanes, then the squares about it in lanes of the
element type added block by block into a double, and writes y in the
element type; it broadcasts scale and bias itself.  It is compiled a second
time for calls without a bias (``absent_inputs``), which then run natively
too.  The gradient covers all three outputs and every input.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.add import sum_to
from opforge.builtins.common import FLOATS, HEADER_DIRS, floating_point, known_dims, zeros_like
from opforge.spec import UNKNOWN_RANK

if TYPE_CHECKING:
    import numpy.typing as npt

layer_norm = opforge.op("layer_norm(Tensor x, Tensor scale, Tensor? bias=None, *, int axis=-1, float epsilon=1e-05)"
                        " -> (Tensor y, Tensor mean, Tensor inv_std_dev)", traits=["no_side_effect"],
                        doc="Layer normalization over the dims from axis on: (x - mean) / sqrt(var + epsilon) "
                            "* scale + bias; also returns mean and 1 / sqrt(var + epsilon) (normalised dims as 1).")
is_float = floating_point("layer_norm", "x")


@layer_norm.check
def layer_norm_check(x: TensorSpec, scale: TensorSpec, bias: TensorSpec | None, *, axis: int,
                     epsilon: float) -> str | None:
    is_float(x)
    for name, spec in (("scale", scale), ("bias", bias)):
        if spec is not None and spec.dtype != x.dtype:
            raise opforge.DTypeError(f"op 'layer_norm': input '{name}' has dtype {spec.dtype}, 'x' has {x.dtype}; "
                                     f"they must match")
    if x.rank is None:
        return None
    if not -x.rank <= axis < max(x.rank, 1):
        return f"axis {axis} is out of range for input 'x' of rank {x.rank} (valid: {-x.rank}..{x.rank - 1})"
    normalised = x.shape[axis % x.rank:] if x.rank else ()
    for name, spec in (("scale", scale), ("bias", bias)):
        if spec is None or spec.rank is None:
            continue
        if spec.rank > len(normalised) or any(
                s not in (1, -1) and n != -1 and s != n for s, n in zip(spec.shape[::-1], normalised[::-1])):
            return (f"input '{name}' has shape {list(spec.shape)}; it must broadcast to the normalised dims "
                    f"{list(normalised)} of 'x' (axis {axis})")
    return None


@layer_norm.infer
def layer_norm_infer(x: TensorSpec, scale: TensorSpec, bias: TensorSpec | None, *, axis: int,
                     epsilon: float) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
    if x.rank is None:
        return TensorSpec(None, x.dtype), TensorSpec(None, x.dtype), TensorSpec(None, x.dtype)
    axis %= max(x.rank, 1)
    stats = TensorSpec(list(x.shape[:axis]) + [1] * (x.rank - axis), x.dtype)
    return TensorSpec(x.shape, x.dtype), stats, stats


@layer_norm.reference(fallback=True)
def layer_norm_reference(x: npt.NDArray[Any], scale: npt.NDArray[Any], bias: npt.NDArray[Any] | None = None, *,
                         axis: int, epsilon: float) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]:
    axes = tuple(range(axis % max(x.ndim, 1), x.ndim))
    wide = x.astype(np.float64)
    mean = wide.mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(np.square(wide - mean).mean(axis=axes, keepdims=True) + np.float64(np.float32(epsilon)))
    y = (wide - mean) * inv * scale + (0 if bias is None else bias)
    return y.astype(x.dtype), mean.astype(x.dtype), inv.astype(x.dtype)


@layer_norm.grad(save=["x", "scale", "bias", "mean", "inv_std_dev"])
def layer_norm_grad(saved: Any, dy: Any, dmean: Any, dinv: Any, *, axis: int, epsilon: float) -> tuple[Any, Any, Any]:
    ops = opforge.ops
    dims = known_dims(saved.x)
    if dims == UNKNOWN_RANK:
        raise opforge.ShapeError("op 'layer_norm': its gradient needs the rank of input 'x'; it is unknown")
    axes = list(range(axis % max(len(dims), 1), len(dims)))
    inner = dims[axes[0]:] if axes else ()
    if -1 in inner:  # counted at run time
        count = ops.reduce_sum(ops.add(zeros_like(saved.x, dy.dtype), np.ones((), dy.dtype)), axes=axes,
                               keep_dims=True)
    else:
        count = np.asarray(int(np.prod(inner)), dy.dtype)
    r = saved.inv_std_dev
    xhat = ops.mul(ops.sub(saved.x, saved.mean), r)
    g = ops.mul(dy, saved.scale)
    mean_g = ops.mean(g, axes=axes, keep_dims=True)
    mean_gx = ops.mean(ops.mul(g, xhat), axes=axes, keep_dims=True)
    dx = ops.mul(r, ops.sub(ops.sub(g, mean_g), ops.mul(xhat, mean_gx)))
    # mean = sum(x) / n; inv_std_dev's derivative is -r^2 * xhat / n
    dx = ops.add(dx, ops.div(ops.sub(dmean, ops.mul(ops.mul(dinv, ops.mul(r, r)), xhat)), count))
    dscale = sum_to(ops.mul(dy, xhat), saved.scale)
    dbias = None if saved.bias is None else sum_to(dy, saved.bias)
    return dx, dscale, dbias


LAYER_NORM_CC = r"""
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

typedef OPFORGE_T T;

// Compiled twice: with a bias, and with OPFORGE_LAYER_NORM_NO_BIAS for calls without one, whose params
// then hold no bias (the ABI passes present inputs only): x, scale, then the outputs.
#ifdef OPFORGE_LAYER_NORM_NO_BIAS
const int kInputs = 2;
#else
const int kInputs = 3;
#endif

#include "lanes.h"

namespace {

// For each element of the normalised dims (x's dims from axis on), the offset of the element of a
// tensor broadcast against them (its dims aligned at the right); false when it does not broadcast.
bool Broadcast(int rank, const int64_t *x, int64_t axis, int ndim, const int64_t *shape,
                      std::vector<int64_t> *offsets) {
  const int n = rank - static_cast<int>(axis);
  if (ndim > n) return false;
  std::vector<int64_t> stride(n, 0);
  for (int64_t d = n - 1, step = 1; d >= 0; d--) {
    const int k = ndim - (n - static_cast<int>(d));  // the tensor's dim aligned with normalised dim d
    if (k < 0) continue;
    if (shape[k] != 1 && shape[k] != x[axis + d]) return false;
    stride[d] = shape[k] == 1 ? 0 : step;
    step *= shape[k];
  }
  int64_t inner = 1;
  for (int d = 0; d < n; d++) inner *= x[axis + d];
  offsets->assign(inner, 0);
  std::vector<int64_t> index(n, 0);
  for (int64_t i = 0, at = 0; i < inner; i++) {
    (*offsets)[i] = at;
    for (int d = n - 1; d >= 0; d--) {
      at += stride[d];
      if (++index[d] < x[axis + d]) break;
      at -= stride[d] * index[d];
      index[d] = 0;
    }
  }
  return true;
}

// Rows run on opforge's pool in ranges of about this many elements.
const int64_t kParallelWork = 1 << 15;

// The sum of a row with every element in double (the mean must be closer than T's rounding: a row far
// from zero would otherwise centre on a mean off by more than the reference allows).
double WideSum(const T *x, int64_t n) {
  typedef double D __attribute__((vector_size(32)));
  typedef T H __attribute__((vector_size(4 * sizeof(T))));  // 4 elements: one D once widened
  D a = {}, b = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    H h, k;
    __builtin_memcpy(&h, x + i, sizeof h);
    __builtin_memcpy(&k, x + i + 4, sizeof k);
    a += __builtin_convertvector(h, D);
    b += __builtin_convertvector(k, D);
  }
  double total = SumLanes<double>(a + b);
  for (; i < n; i++) total += x[i];
  return total;
}

}  // namespace

// The shape work of a call, once per signature (LayerNormInit, kept as the kernel's data): the rows,
// and where each normalised element's scale and bias are (none when the inputs are laid out as the
// normalised dims already, the usual case: they are read in place).
struct LayerNormPlan : AotKernelData {
  int64_t outer = 1, inner = 1;
  double eps = 0;
  std::vector<int64_t> at_scale, at_bias;  // empty: in place
};

// Offsets 0, 1, 2, ...: the tensor is read as it is.
static void DropIdentity(std::vector<int64_t> *offsets) {
  for (int64_t i = 0; i < static_cast<int64_t>(offsets->size()); i++)
    if ((*offsets)[i] != i) return;
  offsets->clear();
}

extern "C" int LayerNormInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  const int rank = ndims[0];
  int64_t axis = extra->Attr<int64_t>("axis");
  if (axis < 0) axis += rank;
  if (axis < 0 || axis > rank) return 1;
  LayerNormPlan *plan = new LayerNormPlan;
  extra->SetKernelData(plan);
  for (int d = 0; d < rank; d++) (d < axis ? plan->outer : plan->inner) *= shapes[0][d];
  // (the op's check refuses a scale or bias that does not broadcast first)
  if (!Broadcast(rank, shapes[0], axis, ndims[1], shapes[1], &plan->at_scale)) return 3;
#ifndef OPFORGE_LAYER_NORM_NO_BIAS
  if (!Broadcast(rank, shapes[0], axis, ndims[2], shapes[2], &plan->at_bias)) return 3;
#endif
  DropIdentity(&plan->at_scale);
  DropIdentity(&plan->at_bias);
  plan->eps = extra->Attr<float>("epsilon");
  return 0;
}

// params: x, scale, bias (unless OPFORGE_LAYER_NORM_NO_BIAS), y, mean, inv_std_dev.  Per row: the mean, then the squares about it (two
// passes over a row that sits in cache), then y in T arithmetic against scale and bias, laid out
// contiguously once per call where they broadcast.
extern "C" int LayerNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  try {
    const LayerNormPlan *plan = static_cast<const LayerNormPlan *>(static_cast<AotExtra *>(extra)->KernelData());
    if (plan == nullptr) return 4;  // LayerNormInit makes it for each signature
    const int64_t outer = plan->outer, inner = plan->inner;
    const T *x = static_cast<const T *>(params[0]), *scale_in = static_cast<const T *>(params[1]),
            *bias_in = kInputs == 3 ? static_cast<const T *>(params[2]) : nullptr;
    T *y = static_cast<T *>(params[kInputs]), *mean_out = static_cast<T *>(params[kInputs + 1]),
      *inv_out = static_cast<T *>(params[kInputs + 2]);
    std::vector<T> scale, bias;  // (broadcast ones only)
    const T *s = scale_in, *b = bias_in;
    if (!plan->at_scale.empty()) {
      scale.resize(inner);
      for (int64_t i = 0; i < inner; i++) scale[i] = scale_in[plan->at_scale[i]];
      s = scale.data();
    }
    if (!plan->at_bias.empty()) {
      bias.resize(inner);
      for (int64_t i = 0; i < inner; i++) bias[i] = bias_in[plan->at_bias[i]];
      b = bias.data();
    }
    const double eps = plan->eps;
    opforge::parallel_for(0, outer, std::max<int64_t>(1, kParallelWork / std::max<int64_t>(1, inner)),
                          [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; o++) {
        const T *xr = x + o * inner;
        T *yr = y + o * inner;
        // (no elements to normalise: the mean and deviation of nothing are NaN, as the reference's)
        const double none = std::numeric_limits<double>::quiet_NaN();
        const double mean = inner ? WideSum(xr, inner) / inner : none;
        // Squares about m, the mean rounded to T: sum (x - mean)^2 = sum (x - m)^2 - n (mean - m)^2.
        const T m = static_cast<T>(mean);
        const double shift = mean - m;
        const double squares = LaneSum(xr, inner, [m](auto v) {
          const auto c = v - m;
          return c * c;
        });
        const double var = inner ? std::max(0.0, squares / inner - shift * shift) : none;
        const double inv = 1.0 / std::sqrt(var + eps);
        const T dm = static_cast<T>(shift), r = static_cast<T>(inv);
#ifdef OPFORGE_LAYER_NORM_NO_BIAS
        (void)b;
        for (int64_t i = 0; i < inner; i++) yr[i] = ((xr[i] - m) - dm) * r * s[i];
#else
        for (int64_t i = 0; i < inner; i++) yr[i] = ((xr[i] - m) - dm) * r * s[i] + b[i];
#endif
        mean_out[o] = static_cast<T>(mean);
        inv_out[o] = static_cast<T>(inv);
      }
    });
    return 0;
  } catch (...) {  // (attribute lookup, the pool): nothing crosses the ABI
    return 2;
  }
}
"""
for _isa in (None, "avx2"):
    layer_norm.kernel(function="LayerNorm", dtypes={"x": FLOATS, "scale": FLOATS, "bias": FLOATS}, isa=_isa,
                      cflags=["-Wno-psabi"], include_dirs=HEADER_DIRS, code=LAYER_NORM_CC)
    # the same source for calls without a bias (the ABI passes present inputs only)
    layer_norm.kernel(function="LayerNorm", dtypes={"x": FLOATS, "scale": FLOATS}, isa=_isa,
                      cflags=["-Wno-psabi", "-DOPFORGE_LAYER_NORM_NO_BIAS=1"], include_dirs=HEADER_DIRS,
                      code=LAYER_NORM_CC, name="LayerNormNoBias", absent_inputs=["bias"])
del _isa
