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
#
# Floats are summed in their own type, pairwise (NumPy's method: the error
# grows with log n, not n) from leaves summed in 16 interleaved accumulators,
# which the compiler keeps in vector registers.  Integers add in their
# unsigned type, whose wrap-around is NumPy's int64 sum cast back.  The
# order of every addition depends on the shapes only, never on the number
# of threads, so results are the same on any number of them.
REDUCE_SUM = r"""
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

typedef OPFORGE_T T;
template <typename V, bool F = std::is_floating_point<V>::value>
struct AccOf {
  typedef V type;
};
template <typename V>
struct AccOf<V, false> {
  typedef typename std::make_unsigned<V>::type type;
};
typedef typename AccOf<T>::type Acc;

static const int64_t kLanes = 16;          // interleaved accumulators of a leaf
static const int64_t kLeaf = 256;          // elements summed by one leaf
static const int64_t kBlock = 1 << 15;     // longer runs: summed in pieces of this size, in parallel
static const int64_t kRowLeaf = 16;        // rows added one after another before pairing
static const int64_t kColumns = 2048;      // columns summed together down the rows
static const int64_t kStrip = 128 / sizeof(Acc);  // columns of a leaf held in registers
static const int64_t kGrain = 1 << 16;     // elements worth a thread

// Pairwise sum of n contiguous values.
template <typename E>
static Acc SumRun(const E *x, int64_t n) {
  if (n <= kLeaf) {
    Acc lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int64_t k = 0; k < kLanes; k++) lane[k] += Acc(x[i + k]);
    Acc tail = 0;
    for (; i < n; i++) tail += Acc(x[i]);
    for (int64_t w = kLanes / 2; w > 0; w /= 2)
      for (int64_t k = 0; k < w; k++) lane[k] += lane[k + w];
    return lane[0] + tail;
  }
  int64_t half = n / 2;
  half -= half % kLanes;
  return SumRun(x, half) + SumRun(x + half, n - half);
}

// Some dims of x (sizes, element strides): the offset of a row-major index over them.
struct Dims {
  std::vector<int64_t> size, stride;
  int64_t Count() const {
    int64_t n = 1;
    for (int64_t s : size) n *= s;
    return n;
  }
  int64_t Offset(int64_t i) const {
    if (size.size() == 1) return i * stride[0];
    int64_t off = 0;
    for (int d = static_cast<int>(size.size()) - 1; d >= 0; d--) {
      off += i % size[d] * stride[d];
      i /= size[d];
    }
    return off;
  }
};

// Pairwise sum over the rows [q0, q1) (offsets by `rows`) of each row's n contiguous values.
static Acc SumRows(const T *x, const Dims &rows, int64_t q0, int64_t q1, int64_t n) {
  if (q1 - q0 == 1) return SumRun(x + rows.Offset(q0), n);
  const int64_t mid = q0 + (q1 - q0) / 2;
  return SumRows(x, rows, q0, mid, n) + SumRows(x, rows, mid, q1, n);
}

// acc[0:w] = the sum over the rows [q0, q1) of each row's w contiguous
// values: runs of kRowLeaf rows one after another, the runs pairwise.
// scratch holds w values per level of pairing below this one.
static void SumColumns(const T *x, const Dims &rows, int64_t q0, int64_t q1, int64_t w, Acc *acc, Acc *scratch) {
  if (q1 - q0 <= kRowLeaf) {  // strips of kStrip columns summed down the rows in registers
    const int64_t m = q1 - q0;
    const T *row[kRowLeaf];
    for (int64_t k = 0; k < m; k++) row[k] = x + rows.Offset(q0 + k);
    int64_t j = 0;
    for (; j + kStrip <= w; j += kStrip) {
      Acc r[kStrip];
      for (int64_t c = 0; c < kStrip; c++) r[c] = Acc(row[0][j + c]);
      for (int64_t k = 1; k < m; k++)
        for (int64_t c = 0; c < kStrip; c++) r[c] += Acc(row[k][j + c]);
      for (int64_t c = 0; c < kStrip; c++) acc[j + c] = r[c];
    }
    for (; j < w; j++) {
      Acc v = Acc(row[0][j]);
      for (int64_t k = 1; k < m; k++) v += Acc(row[k][j]);
      acc[j] = v;
    }
    return;
  }
  const int64_t mid = q0 + (q1 - q0) / 2;
  SumColumns(x, rows, q0, mid, w, acc, scratch + w);
  SumColumns(x, rows, mid, q1, w, scratch, scratch + w);
  for (int64_t j = 0; j < w; j++) acc[j] += scratch[j];
}

static int64_t Levels(int64_t rows) {  // pairing levels SumColumns goes through, plus one
  int64_t levels = 1;
  for (; rows > kRowLeaf; rows = (rows + 1) / 2) levels++;
  return levels;
}

// The value y holds for a sum of `count` elements.
static inline T Finish(Acc sum, int64_t count) {
#ifdef OPFORGE_MEAN
  return static_cast<T>(static_cast<double>(sum) / static_cast<double>(count));
#else
  (void)count;
  return static_cast<T>(sum);
#endif
}

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

  int64_t nx = 1, ny = 1;
  for (int d = 0; d < rank; d++) {
    nx *= shape[d];
    if (!reduced[d]) ny *= shape[d];
  }
  if (ny == 0) return 0;
  if (nx == 0) {  // (mean only: always_compute) the sum of nothing is 0, its mean NaN
    for (int64_t i = 0; i < ny; i++) y[i] = Finish(Acc(0), 0);
    return 0;
  }
  const int64_t count = nx / ny;  // elements summed into each y

  // Merge neighbouring dims that are both reduced or both kept (size-1 dims
  // drop out): x becomes groups alternating between reduced and kept.
  std::vector<int64_t> group;
  std::vector<bool> group_reduced;
  for (int d = 0; d < rank; d++) {
    if (shape[d] == 1) continue;
    if (!group.empty() && group_reduced.back() == reduced[d]) {
      group.back() *= shape[d];
    } else {
      group.push_back(shape[d]);
      group_reduced.push_back(reduced[d]);
    }
  }
  if (group.empty()) {  // one element
    y[0] = Finish(Acc(x[0]), 1);
    return 0;
  }
  // The last group is the contiguous run; the others are the outer kept
  // dims (one per y row) and the outer reduced dims (the rows summed into it).
  const int g = static_cast<int>(group.size());
  const int64_t run = group[g - 1];
  Dims kept, rows;
  {
    int64_t stride = run;
    std::vector<std::pair<int64_t, int64_t>> k, r;  // (size, stride), innermost first
    for (int d = g - 2; d >= 0; d--) {
      (group_reduced[d] ? r : k).push_back({group[d], stride});
      stride *= group[d];
    }
    for (auto it = k.rbegin(); it != k.rend(); ++it) kept.size.push_back(it->first), kept.stride.push_back(it->second);
    for (auto it = r.rbegin(); it != r.rend(); ++it) rows.size.push_back(it->first), rows.stride.push_back(it->second);
  }
  const int64_t outer = kept.Count(), nrows = rows.Count();

  if (group_reduced[g - 1]) {
    // The run is reduced: each y is a sum of runs, one per reduced row.
    if (run <= kBlock) {
      const int64_t per_y = nrows * run;
      opforge::parallel_for(0, outer, std::max<int64_t>(1, kGrain / per_y), [&](int64_t o0, int64_t o1) {
        for (int64_t o = o0; o < o1; o++) y[o] = Finish(SumRows(x + kept.Offset(o), rows, 0, nrows, run), count);
      });
      return 0;
    }
    // Long runs: fixed pieces of kBlock summed in parallel, then paired.
    const int64_t pieces = (run + kBlock - 1) / kBlock, per_y = nrows * pieces;
    std::vector<Acc> part(outer * per_y);
    opforge::parallel_for(0, outer * per_y, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; i++) {
        const int64_t o = i / per_y, q = i % per_y / pieces, p = i % pieces;
        const int64_t lo = p * kBlock, n = std::min(kBlock, run - lo);
        part[i] = SumRun(x + kept.Offset(o) + rows.Offset(q) + lo, n);
      }
    });
    for (int64_t o = 0; o < outer; o++) y[o] = Finish(SumRun(part.data() + o * per_y, per_y), count);
    return 0;
  }

  // The run is kept: y's rows of `run` values are sums of x's rows, summed
  // kColumns columns at a time.  With few such tasks and many rows, the rows
  // are cut into `splits` fixed parts summed apart, then paired.
  const int64_t blocks = (run + kColumns - 1) / kColumns, tasks = outer * blocks;
  const int64_t splits = tasks >= 16 ? 1 : std::max<int64_t>(1, std::min<int64_t>(16, nrows / 256));
  const bool direct = splits == 1 && sizeof(Acc) == sizeof(T);  // sum straight into y
  std::vector<Acc> part(direct ? 0 : splits * ny);
  Acc *sums = direct ? reinterpret_cast<Acc *>(y) : part.data();
  const int64_t rows_per_task = (nrows + splits - 1) / splits;
  const int64_t grain = std::max<int64_t>(1, kGrain / (rows_per_task * std::min(run, kColumns)));
  opforge::parallel_for(0, splits * tasks, grain, [&](int64_t i0, int64_t i1) {
    std::vector<Acc> scratch(kColumns * Levels(rows_per_task));
    for (int64_t i = i0; i < i1; i++) {
      const int64_t s = i / tasks, o = i % tasks / blocks, c = i % blocks * kColumns;
      const int64_t q0 = nrows * s / splits, q1 = nrows * (s + 1) / splits;
      SumColumns(x + kept.Offset(o) + c, rows, q0, q1, std::min(kColumns, run - c), sums + s * ny + o * run + c,
                 scratch.data());
    }
  });
#ifndef OPFORGE_MEAN
  if (direct && std::is_same<Acc, T>::value) return 0;  // the sums are y
#endif
  opforge::parallel_for(0, ny, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
      Acc level[16];  // the parts, paired
      for (int64_t s = 0; s < splits; s++) level[s] = sums[s * ny + i];
      for (int64_t m = splits; m > 1;) {
        const int64_t half = m / 2;
        for (int64_t k = 0; k < half; k++) level[k] = level[2 * k] + level[2 * k + 1];
        if (m % 2) level[half] = level[m - 1];
        m = half + m % 2;
      }
      y[i] = Finish(level[0], count);
    }
  });
  return 0;
}
"""
reduce_sum.kernel(function="ReduceSum", dtypes={"x": ["float32", "float64", "int32", "int64"]}, code=REDUCE_SUM)
reduce_sum.kernel(source=gpu_source("reduce_sum.cu", "ReduceSumGpu"), device="gpu",
                  dtypes=same_dtypes(GPU_NUMERIC))
