"""batch_norm: y = (x - mean) / sqrt(var + epsilon) * scale + bias per channel (axis 1), inference form.

ONNX BatchNormalization with running statistics (training_mode=0): x is
N x C x ... (rank >= 2), scale, bias, mean and var have C entries each.
The kernel folds the five into one multiply-add per element (a = scale /
sqrt(var + epsilon), b = bias - mean * a).  The gradient is a composition
of ops: every input, the statistics included, gets one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import FLOATS, floating_point, known_dims
from opforge.spec import UNKNOWN_RANK

if TYPE_CHECKING:
    import numpy.typing as npt

batch_norm = opforge.op("batch_norm(Tensor x, Tensor scale, Tensor bias, Tensor mean, Tensor var, *, "
                        "float epsilon=1e-05) -> Tensor y", traits=["no_side_effect"],
                        doc="Batch normalization with given statistics (inference form): per channel (axis 1) "
                            "(x - mean) / sqrt(var + epsilon) * scale + bias.")
is_float = floating_point("batch_norm", "x")
PARAMS = ("scale", "bias", "mean", "var")


@batch_norm.check
def batch_norm_check(x: TensorSpec, scale: TensorSpec, bias: TensorSpec, mean: TensorSpec, var: TensorSpec, *,
                     epsilon: float) -> str | None:
    is_float(x)
    if x.rank is not None and x.rank < 2:
        return f"input 'x' has rank {x.rank}; batch_norm needs N x C x ... (rank >= 2)"
    channels = x.shape[1] if x.rank is not None else -1
    for name, spec in zip(PARAMS, (scale, bias, mean, var)):
        if spec.dtype != x.dtype:
            raise opforge.DTypeError(f"op 'batch_norm': input '{name}' has dtype {spec.dtype}, 'x' has {x.dtype}; "
                                     f"they must match")
        if spec.rank is not None and (spec.rank != 1 or -1 not in (channels, spec.shape[0])
                                      and spec.shape[0] != channels):
            return f"input '{name}' has shape {list(spec.shape)}; it must be [C] with C = {channels} (x's axis 1)"
    return None


@batch_norm.infer
def batch_norm_infer(x: TensorSpec, *params: TensorSpec, epsilon: float) -> TensorSpec:
    return TensorSpec(x.shape if x.rank is not None else None, x.dtype)


def per_channel(v: npt.NDArray[Any], rank: int) -> npt.NDArray[Any]:
    """A [C] vector shaped to broadcast along axis 1 of a rank-``rank`` tensor."""
    return v.reshape((1, -1) + (1,) * (rank - 2))


@batch_norm.reference(fallback=True)
def batch_norm_reference(x: npt.NDArray[Any], scale: npt.NDArray[Any], bias: npt.NDArray[Any],
                         mean: npt.NDArray[Any], var: npt.NDArray[Any], *, epsilon: float) -> npt.NDArray[Any]:
    shaped = [per_channel(v.astype(np.float64), x.ndim) for v in (scale, bias, mean, var)]
    scale, bias, mean, var = shaped
    y: npt.NDArray[Any] = ((x - mean) / np.sqrt(var + np.float64(np.float32(epsilon))) * scale + bias).astype(x.dtype)
    return y


@batch_norm.grad(save=["x", "scale", "mean", "var"])
def batch_norm_grad(saved: Any, dy: Any, *, epsilon: float) -> tuple[Any, Any, Any, Any, Any]:
    ops = opforge.ops
    dims = known_dims(saved.x)
    if dims == UNKNOWN_RANK:
        raise opforge.ShapeError("op 'batch_norm': its gradient needs the rank of input 'x'; it is unknown")
    rank = len(dims)
    shape = [1, -1] + [1] * (rank - 2)
    axes = [0] + list(range(2, rank))
    eps = np.asarray(np.float32(epsilon), dtype=dy.dtype)
    inv = ops.div(np.ones((), dy.dtype), ops.sqrt(ops.add(saved.var, eps)))   # 1 / sqrt(var + eps), [C]
    centred = ops.sub(saved.x, ops.reshape(saved.mean, shape=shape))
    dbias = ops.reduce_sum(dy, axes=axes)
    dcentred = ops.reduce_sum(ops.mul(dy, centred), axes=axes)                 # sum dy * (x - mean), [C]
    dscale = ops.mul(dcentred, inv)
    a = ops.mul(saved.scale, inv)                                              # dy/dx per channel
    dx = ops.mul(dy, ops.reshape(a, shape=shape))
    dmean = ops.neg(ops.mul(dbias, a))
    # d/dvar of (var + eps)^-1/2 is -(var + eps)^-3/2 / 2
    dvar = ops.mul(ops.mul(dcentred, saved.scale), ops.mul(ops.mul(inv, ops.mul(inv, inv)),
                                                           np.asarray(-0.5, dy.dtype)))
    return dx, dscale, dbias, dmean, dvar


batch_norm.kernel(function="BatchNorm", dtypes=[(d,) * 5 for d in FLOATS], code=r"""
#include <algorithm>
#include <cmath>
#include <cstring>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

template <typename T>
static int Run(void **params, int *ndims, int64_t **shapes, AotExtra *extra) {
  const T *x = static_cast<const T *>(params[0]);
  const T *scale = static_cast<const T *>(params[1]), *bias = static_cast<const T *>(params[2]);
  const T *mean = static_cast<const T *>(params[3]), *var = static_cast<const T *>(params[4]);
  T *y = static_cast<T *>(params[5]);
  if (ndims[0] < 2) return 1;
  const int64_t n = shapes[0][0], c = shapes[0][1];
  for (int k = 1; k < 5; k++)
    if (ndims[k] != 1 || shapes[k][0] != c) return 1;
  int64_t inner = 1;
  for (int d = 2; d < ndims[0]; d++) inner *= shapes[0][d];
  // epsilon crosses the ABI as a float: the reference adds float32(epsilon) too
  const double eps = extra->Attr<float>("epsilon");
  // the (sample, channel) planes run on opforge's pool, in ranges of 32K elements or more
  opforge::parallel_for(0, n * c, std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, inner)),
                     [&](int64_t lo, int64_t hi) {
                       for (int64_t plane = lo; plane < hi; plane++) {
                         const int64_t ch = plane % c;
                         const T a = static_cast<T>(scale[ch] / std::sqrt(static_cast<double>(var[ch]) + eps));
                         const T b = bias[ch] - mean[ch] * a;
                         const T *xp = x + plane * inner;
                         T *yp = y + plane * inner;
                         for (int64_t j = 0; j < inner; j++) yp[j] = xp[j] * a + b;
                       }
                     });
  return 0;
}

extern "C" int BatchNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  AotExtra *e = static_cast<AotExtra *>(extra);
  try {
    if (!std::strcmp(dtypes[0], "float32")) return Run<float>(params, ndims, shapes, e);
    if (!std::strcmp(dtypes[0], "float64")) return Run<double>(params, ndims, shapes, e);
  } catch (...) {  // (attribute lookup, the pool): nothing crosses the ABI
  }
  return 2;
}
""")
