"""reduce_sum: y = x summed over ``axes`` (all axes when empty).

The template for a reduction with attributes: a check that rejects bad axes
before anything runs, the library's reduce inference, and a kernel reading
the attributes through ``AotExtra``.
"""
import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_NUMERIC, gpu_source, same_dtypes, zeros_like
from opforge.sbp import partial_sum, split

reduce_sum = opforge.op("reduce_sum(Tensor x, *, int[] axes=[], bool keep_dims=False) -> Tensor y",
                        traits=["no_side_effect"],
                        doc="Sum over axes (empty = all; negative axes count from the end). "
                            "An empty reduction sums to 0.")
reduce_sum.def_infer(infer.reduce("axes", "keep_dims"))


@reduce_sum.check
def reduce_sum_check(x, *, axes, keep_dims):
    if x.rank is None:  # unknown rank: nothing to check against yet
        return None
    for axis in axes:
        if x.rank == 0:
            return f"axis {axis} is out of range: input 'x' is 0-d and has no axes"
        if not -x.rank <= axis < x.rank:
            return f"axis {axis} is out of range for input 'x' of rank {x.rank} (valid: {-x.rank}..{x.rank - 1})"
    normalized = [axis % x.rank for axis in axes]
    if len(set(normalized)) != len(normalized):
        return f"axes {list(axes)} name the same axis more than once"
    return None


@reduce_sum.sbp
def reduce_sum_sbp(x, *, axes, keep_dims):
    # A split on a kept axis stays a split; on a reduced axis each device sums its slice: addends of y.
    # Addends of x sum to addends of y.  (Bools do not add: their sum is cast back to bool.)
    signatures = [{"x": split(x_axis), "y": split(y_axis)} for x_axis, y_axis in kept_axes(x, axes, keep_dims)]
    if x.dtype != "bool":
        signatures += [{"x": split(axis), "y": partial_sum} for axis in reduced_axes(x, axes)]
        signatures.append({"x": partial_sum, "y": partial_sum})
    return signatures


def reduced_axes(x, axes):
    """The axes of x that ``axes`` reduces: all of them when empty; none known for an unknown rank."""
    if x.rank is None:
        return []
    return infer.normalize_axes(axes, x.rank, "reduce_sum") or list(range(x.rank))


def kept_axes(x, axes, keep_dims):
    """(x's axis, y's axis) for each axis of x a reduction keeps; none known for an unknown rank."""
    if x.rank is None:
        return []
    reduced = reduced_axes(x, axes)
    return [(axis, axis if keep_dims else axis - sum(r < axis for r in reduced))
            for axis in range(x.rank) if axis not in reduced]


@reduce_sum.reference(fallback=True)
def reduce_sum_reference(x, *, axes, keep_dims):
    return np.sum(x, axis=tuple(axes) if axes else None, keepdims=keep_dims).astype(x.dtype, copy=False)


@reduce_sum.grad(save=["x"])
def reduce_sum_grad(saved, dy, *, axes, keep_dims):
    return spread(dy, saved.x, axes, keep_dims)


def spread(dy, x, axes, keep_dims):
    """dy, the reduced shape, broadcast back over x's shape -- every input
    element contributed once.  Shapes come from x at run time, so graphs
    traced with unknown dims differentiate too."""
    if axes and not keep_dims:  # put the reduced axes back as size 1 (unsqueeze counts them as x does)
        dy = opforge.ops.unsqueeze(dy, axes=axes)
    # (with no axes, dy is 0-d or all size-1 dims, and broadcasts as it is)
    return opforge.ops.add(dy, zeros_like(x, dy.dtype))


# An empty x never reaches the kernel: opforge returns zeros of the output
# shape, which is exactly the sum of an empty reduction (and of nothing when
# the output is empty too), so the op needs no always_compute trait.
# mean.py compiles this source with OPFORGE_MEAN defined: the sums divided by their counts.
REDUCE_SUM = r"""
#include <type_traits>
#include <vector>

#include "custom_aot_extra.h"

typedef OPFORGE_T T;
// Accumulate floats in double and integers in int64 (as NumPy does for
// int32), so long float32 sums stay close to NumPy's pairwise summation.
typedef std::conditional<std::is_floating_point<T>::value, double, int64_t>::type Acc;

extern "C" int ReduceSum(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  const int rank = ndims[0];
  const int64_t *shape = shapes[0];

  std::vector<int64_t> axes = extra->Attr<std::vector<int64_t>>("axes");
  const bool keep_dims = extra->Attr<bool>("keep_dims");
  std::vector<bool> reduced(rank, axes.empty());  // no axes: reduce them all
  for (int64_t axis : axes) {
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || reduced[axis]) return 1;  // the op's check rejects these first
    reduced[axis] = true;
  }
  int n_reduced = 0;
  for (int d = 0; d < rank; d++) n_reduced += reduced[d];
  if (ndims[1] != (keep_dims ? rank : rank - n_reduced)) return 2;  // output shape disagrees with the attributes

  // y, with or without keep_dims, is laid out like x with the reduced dims
  // set to 1: so each x element adds into y at offset sum(index[d] * ystride[d])
  // with ystride 0 along reduced dims.
  std::vector<int64_t> ystride(rank);
  int64_t ny = 1, nx = 1;
  for (int d = rank - 1; d >= 0; d--) {
    ystride[d] = reduced[d] ? 0 : ny;
    if (!reduced[d]) ny *= shape[d];
    nx *= shape[d];
  }
  std::vector<Acc> acc(ny, Acc(0));

  // Walk x linearly, innermost dim as a plain loop, the outer dims as an odometer.
  const int64_t inner = rank ? shape[rank - 1] : 1;
  const int64_t inner_stride = rank ? ystride[rank - 1] : 0;
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0;
  for (int64_t start = 0; start < nx; start += inner) {
    const T *row = x + start;
    if (inner_stride == 0) {  // reducing the innermost dim: one running sum per row
      Acc sum = 0;
      for (int64_t j = 0; j < inner; j++) sum += row[j];
      acc[offset] += sum;
    } else {
      for (int64_t j = 0; j < inner; j++) acc[offset + j] += row[j];
    }
    for (int d = rank - 2; d >= 0; d--) {
      offset += ystride[d];
      if (++index[d] < shape[d]) break;
      offset -= ystride[d] * shape[d];
      index[d] = 0;
    }
  }
#ifdef OPFORGE_MEAN
  const Acc count = static_cast<Acc>(ny ? nx / ny : 0);  // 0 / 0: NumPy's NaN mean of nothing
  for (int64_t i = 0; i < ny; i++) y[i] = static_cast<T>(acc[i] / count);
#else
  for (int64_t i = 0; i < ny; i++) y[i] = static_cast<T>(acc[i]);
#endif
  return 0;
}
"""
reduce_sum.kernel(function="ReduceSum", dtypes={"x": ["float32", "float64", "int32", "int64"]}, code=REDUCE_SUM)
reduce_sum.kernel(source=gpu_source("reduce_sum.cu", "ReduceSumGpu"), device="gpu",
                  dtypes=same_dtypes(GPU_NUMERIC))
