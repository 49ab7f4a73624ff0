"""reduce_sum: y = x summed over ``axes`` (all axes when empty).

The template for a reduction with attributes: a check that rejects bad axes
before anything runs, the library's reduce inference, and a kernel reading
the attributes through ``AotExtra``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_NUMERIC, HEADER_DIRS, SIMD_ISAS, gpu_source, same_dtypes, zeros_like
from opforge.sbp import partial_sum, split

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec
    from opforge.sbp import SBPValue

reduce_sum = opforge.op("reduce_sum(Tensor x, *, int[] axes=[], bool keep_dims=False) -> Tensor y",
                        traits=["no_side_effect"],
                        doc="Sum over axes (empty = all; negative axes count from the end). "
                            "An empty reduction sums to 0.")
reduce_sum.def_infer(infer.reduce("axes", "keep_dims"))


@reduce_sum.check
def reduce_sum_check(x: TensorSpec, *, axes: Sequence[int], keep_dims: bool) -> str | None:
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
def reduce_sum_sbp(x: TensorSpec, *, axes: Sequence[int], keep_dims: bool) -> list[dict[str, SBPValue]]:
    # A split on a kept axis stays a split; on a reduced axis each device sums its slice: addends of y.
    # Addends of x sum to addends of y.  (Bools do not add: their sum is cast back to bool.)
    signatures: list[dict[str, SBPValue]] = [{"x": split(x_axis), "y": split(y_axis)}
                                             for x_axis, y_axis in kept_axes(x, axes, keep_dims)]
    if x.dtype != "bool":
        signatures += [{"x": split(axis), "y": partial_sum} for axis in reduced_axes(x, axes)]
        signatures.append({"x": partial_sum, "y": partial_sum})
    return signatures


def reduced_axes(x: TensorSpec, axes: Sequence[int]) -> list[int]:
    """The axes of x that ``axes`` reduces: all of them when empty; none known for an unknown rank."""
    if x.rank is None:
        return []
    return infer.normalize_axes(axes, x.rank, "reduce_sum") or list(range(x.rank))


def kept_axes(x: TensorSpec, axes: Sequence[int], keep_dims: bool) -> list[tuple[int, int]]:
    """(x's axis, y's axis) for each axis of x a reduction keeps; none known for an unknown rank."""
    if x.rank is None:
        return []
    reduced = reduced_axes(x, axes)
    return [(axis, axis if keep_dims else axis - sum(r < axis for r in reduced))
            for axis in range(x.rank) if axis not in reduced]


@reduce_sum.reference(fallback=True)
def reduce_sum_reference(x: npt.NDArray[Any], *, axes: Sequence[int], keep_dims: bool) -> npt.NDArray[Any]:
    y: npt.NDArray[Any] = np.sum(x, axis=tuple(axes) if axes else None, keepdims=keep_dims)
    return y.astype(x.dtype, copy=False)


@reduce_sum.grad(save=["x"])
def reduce_sum_grad(saved: Any, dy: Any, *, axes: Sequence[int], keep_dims: bool) -> Any:
    return spread(dy, saved.x, axes, keep_dims)


def spread(dy: Any, x: Any, axes: Sequence[int], keep_dims: bool) -> Any:
    """dy, the reduced shape, broadcast back over x's shape -- every input
    element contributed once.  Shapes come from x at run time, so graphs
    traced with unknown dims differentiate too."""
    if axes and not keep_dims:  # put the reduced axes back as size 1 (unsqueeze counts them as x does)
        dy = opforge.ops.unsqueeze(dy, axes=axes)
    # (with no axes, dy is 0-d or all size-1 dims, and broadcasts as it is)
    return opforge.ops.add(dy, zeros_like(x, dy.dtype))


# The shape work of a reduction, done once per signature by ReduceSumInit and
# kept as the kernel's data: a call reads no attribute and allocates no plan.
# Outside REDUCE_SUM so that mean's one library of every dtype has one Init.
REDUCE_PLAN = r"""
#include <cstdint>
#include <utility>
#include <vector>

#include "custom_aot_extra.h"
#include "reduce_axes.h"

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

// x's dims merged into groups alternating between reduced and kept (size-1 dims drop out): the last
// group is the contiguous run; the others are the outer kept dims (one per y row) and the outer
// reduced dims (the rows summed into it).
struct ReducePlan : AotKernelData {
  int64_t nx = 1, ny = 1, count = 0;  // elements of x, of y, summed into each y
  bool one = false;                   // every dim of x is 1
  bool run_reduced = false;
  int64_t run = 0, outer = 0, nrows = 0;
  Dims kept, rows;
};

extern "C" int ReduceSumInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  const int rank = ndims[0];
  const int64_t *shape = shapes[0];
  std::vector<bool> reduced;
  if (const int bad = ReducedAxes(extra, rank, ndims[1], &reduced)) return bad;  // 1: axes, 2: y's rank

  ReducePlan *plan = new ReducePlan;
  extra->SetKernelData(plan);
  for (int d = 0; d < rank; d++) {
    plan->nx *= shape[d];
    if (!reduced[d]) plan->ny *= shape[d];
  }
  plan->count = plan->ny ? plan->nx / plan->ny : 0;
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
  plan->one = group.empty();
  if (plan->one || plan->nx == 0) return 0;
  const int g = static_cast<int>(group.size());
  plan->run = group[g - 1];
  plan->run_reduced = group_reduced[g - 1];
  int64_t stride = plan->run;
  std::vector<std::pair<int64_t, int64_t>> k, r;  // (size, stride), innermost first
  for (int d = g - 2; d >= 0; d--) {
    (group_reduced[d] ? r : k).push_back({group[d], stride});
    stride *= group[d];
  }
  for (auto it = k.rbegin(); it != k.rend(); ++it) {
    plan->kept.size.push_back(it->first);
    plan->kept.stride.push_back(it->second);
  }
  for (auto it = r.rbegin(); it != r.rend(); ++it) {
    plan->rows.size.push_back(it->first);
    plan->rows.stride.push_back(it->second);
  }
  plan->outer = plan->kept.Count();
  plan->nrows = plan->rows.Count();
  return 0;
}
"""

# An empty x with a non-empty y (a reduction over an empty axis) gives zeros,
# the sum of nothing (mean: NaN).
# mean.py compiles this source with OPFORGE_MEAN defined: the sums divided by their counts.
#
# Floats are summed in their own type, pairwise (NumPy's method: the error
# grows with log n, not n) from leaves summed in four vectors of interleaved
# accumulators (32 floats, 16 doubles); down an outer axis, leaves of 16 whole
# rows are added in order into a row of sums that stays in L1, then paired.
# One kernel per ISA (SSE2, AVX2, AVX-512) adds the same values in the same
# order, so every ISA gives the same bits.  Integers add in their
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

static const int64_t kLeaf = 256;          // elements summed by one leaf
static const int64_t kBlock = 1 << 15;     // longer runs: summed in pieces of this size, in parallel
static const int64_t kRowLeaf = 16;        // rows added one after another before pairing
static const int64_t kColumns = 2048;      // columns summed together down the rows
static const int64_t kGrain = 1 << 16;     // elements worth a thread

// A leaf's lanes are four 32-byte vectors, whatever the ISA: four independent chains of additions
// that keep the adder busy, in registers on SSE (two each), AVX and AVX-512 alike, so every ISA adds
// the same values in the same order.
typedef Acc Lanes __attribute__((vector_size(32)));
static const int64_t kLanes = 4 * 32 / sizeof(Acc);

// The lanes of v summed pairwise, as halves: lane k plus lane k + half, then a quarter, ...
template <int Bytes, typename V>
static inline Acc Fold(const V &v) {
  if constexpr (Bytes == sizeof(Acc)) {
    return v[0];
  } else {
    typedef Acc Half __attribute__((vector_size(Bytes / 2)));
    Half lo, hi;
    __builtin_memcpy(&lo, &v, sizeof lo);
    __builtin_memcpy(&hi, reinterpret_cast<const char *>(&v) + sizeof lo, sizeof hi);
    return Fold<Bytes / 2>(Half(lo + hi));
  }
}

template <typename E>
static inline Lanes Load(const E *x) {
  static_assert(sizeof(E) == sizeof(Acc), "a lane vector holds as many E as Acc");
  typedef E Loaded __attribute__((vector_size(32)));
  Loaded v;
  __builtin_memcpy(&v, x, sizeof v);  // (x may be unaligned)
  return __builtin_convertvector(v, Lanes);
}

// Pairwise sum of n contiguous values.
template <typename E>
static Acc SumRun(const E *x, int64_t n) {
  if (n <= kLeaf) {
    const int64_t step = kLanes / 4;
    Lanes a0 = {}, a1 = {}, a2 = {}, a3 = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      a0 += Load(x + i);
      a1 += Load(x + i + step);
      a2 += Load(x + i + 2 * step);
      a3 += Load(x + i + 3 * step);
    }
    Acc tail = 0;
    for (; i < n; i++) tail += Acc(x[i]);
    return Fold<sizeof(Lanes)>(Lanes((a0 + a2) + (a1 + a3))) + tail;
  }
  int64_t half = n / 2;
  half -= half % kLanes;
  return SumRun(x, half) + SumRun(x + half, n - half);
}

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
  if (q1 - q0 <= kRowLeaf) {  // whole rows added one after another into acc (in L1), four rows a pass
    Acc *__restrict__ sum = acc;
    int64_t q = q0 + 1;
    const T *__restrict__ r0 = x + rows.Offset(q0);
    if (q + 3 <= q1) {  // (the same order as row by row: ((r0 + r1) + r2) + r3)
      const T *__restrict__ a = x + rows.Offset(q), *__restrict__ b = x + rows.Offset(q + 1);
      const T *__restrict__ c = x + rows.Offset(q + 2);
      for (int64_t j = 0; j < w; j++) sum[j] = Acc(r0[j]) + Acc(a[j]) + Acc(b[j]) + Acc(c[j]);
      q += 3;
    } else {
      for (int64_t j = 0; j < w; j++) sum[j] = Acc(r0[j]);
    }
    for (; q + 4 <= q1; q += 4) {
      const T *__restrict__ a = x + rows.Offset(q), *__restrict__ b = x + rows.Offset(q + 1);
      const T *__restrict__ c = x + rows.Offset(q + 2), *__restrict__ d = x + rows.Offset(q + 3);
      for (int64_t j = 0; j < w; j++) sum[j] = sum[j] + Acc(a[j]) + Acc(b[j]) + Acc(c[j]) + Acc(d[j]);
    }
    for (; q < q1; q++) {
      const T *__restrict__ a = x + rows.Offset(q);
      for (int64_t j = 0; j < w; j++) sum[j] += Acc(a[j]);
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
                         void *stream, void *extra) {
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  const ReducePlan *plan = static_cast<const ReducePlan *>(static_cast<AotExtra *>(extra)->KernelData());
  if (plan == nullptr) return 3;  // ReduceSumInit makes it for each signature
  const int64_t ny = plan->ny, count = plan->count;
  if (ny == 0) return 0;
  if (plan->nx == 0) {  // (an empty axis) the sum of nothing is 0, its mean NaN
    for (int64_t i = 0; i < ny; i++) y[i] = Finish(Acc(0), 0);
    return 0;
  }
  if (plan->one) {
    y[0] = Finish(Acc(x[0]), 1);
    return 0;
  }
  const Dims &kept = plan->kept, &rows = plan->rows;
  const int64_t run = plan->run, outer = plan->outer, nrows = plan->nrows;

  if (plan->run_reduced) {
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
# One kernel per ISA (wider vectors, the same additions in the same order: the same results).
for isa in SIMD_ISAS:
    reduce_sum.kernel(function="ReduceSum", dtypes={"x": ["float32", "float64", "int32", "int64"]},
                      code=REDUCE_PLAN + REDUCE_SUM, isa=isa, include_dirs=HEADER_DIRS)
reduce_sum.kernel(source=gpu_source("reduce_sum.cu", "ReduceSumGpu"), device="gpu",
                  dtypes=same_dtypes(GPU_NUMERIC))
