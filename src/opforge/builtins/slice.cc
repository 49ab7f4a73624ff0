// slice (gather) and slice_grad (scatter into zeros), for every dtype
// (elements are moved, never looked at).  Unit steps copy a box of rows
// (elements.h's ShiftCopy); other steps read x at strides (StridedCopy), and
// their gradient walks the sliced elements.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "custom_aot_extra.h"
#include "elements.h"

// Per dim of x: the first index taken and the step (ONNX Slice semantics;
// the op's check has rejected bad attributes, inference fixed the counts).
static bool Bounds(AotExtra *extra, int rank, const int64_t *shape, std::vector<int64_t> *first,
                   std::vector<int64_t> *step) {
  std::vector<int64_t> starts = extra->Attr<std::vector<int64_t>>("starts");
  std::vector<int64_t> axes = extra->Attr<std::vector<int64_t>>("axes");
  std::vector<int64_t> steps = extra->Attr<std::vector<int64_t>>("steps");
  first->assign(rank, 0);
  step->assign(rank, 1);
  for (size_t k = 0; k < starts.size(); k++) {
    int64_t axis = axes.empty() ? static_cast<int64_t>(k) : axes[k];
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return false;
    const int64_t s = steps.empty() ? 1 : steps[k], dim = shape[axis];
    int64_t start = starts[k] < 0 ? starts[k] + dim : starts[k];
    start = std::clamp<int64_t>(start, 0, s > 0 || dim == 0 ? dim : dim - 1);
    (*first)[axis] = start;
    (*step)[axis] = s;
  }
  return true;
}

// Visits every element of the sliced shape `out` (row-major) with the
// offset of its source in x, and calls move(out_index, x_offset).
template <typename Move>
static void Walk(int rank, const int64_t *x_shape, const int64_t *out, const std::vector<int64_t> &first,
                 const std::vector<int64_t> &step, Move move) {
  std::vector<int64_t> stride(rank), index(rank, 0);
  int64_t n = 1, offset = 0;
  for (int d = rank - 1; d >= 0; d--) {
    stride[d] = d == rank - 1 ? 1 : stride[d + 1] * x_shape[d + 1];
    n *= out[d];
  }
  for (int d = 0; d < rank; d++) offset += first[d] * stride[d];
  if (n == 0) return;
  const int64_t inner = rank ? out[rank - 1] : 1, inner_step = rank ? step[rank - 1] : 0;
  for (int64_t start = 0; start < n; start += inner) {
    for (int64_t j = 0; j < inner; j++) move(start + j, offset + j * inner_step);
    for (int d = rank - 2; d >= 0; d--) {
      offset += step[d] * stride[d];
      if (++index[d] < out[d]) break;
      offset -= step[d] * stride[d] * out[d];
      index[d] = 0;
    }
  }
}

template <typename E>
static int Run(bool scatter, void **params, int *ndims, int64_t **shapes, AotExtra *extra) {
  // slice: params x, y.  slice_grad: params dy, x, dx (x only lends its shape).
  const int rank = scatter ? ndims[1] : ndims[0];
  const int64_t *x_shape = scatter ? shapes[1] : shapes[0];
  const int64_t *sliced = scatter ? shapes[0] : shapes[1];
  std::vector<int64_t> first, step;
  if (!Bounds(extra, rank, x_shape, &first, &step)) return 1;
  const bool unit = std::all_of(step.begin(), step.end(), [](int64_t s) { return s == 1; });
  if (unit) {  // a box of x: rows of memcpy (slice), or of memcpy between zero fills (slice_grad)
    std::vector<int64_t> shift(first);
    if (scatter) {
      ShiftCopy<E>(static_cast<const E *>(params[0]), sliced, static_cast<E *>(params[2]), x_shape, shift.data(),
                   rank, E(0));
    } else {
      for (int64_t &s : shift) s = -s;
      ShiftCopy<E>(static_cast<const E *>(params[0]), x_shape, static_cast<E *>(params[1]), sliced, shift.data(),
                   rank, E(0));
    }
    return 0;
  }
  if (scatter) {
    const E *dy = static_cast<const E *>(params[0]);
    E *dx = static_cast<E *>(params[2]);
    ParallelFill(dx, ElementCount(rank, x_shape), E(0));
    Walk(rank, x_shape, sliced, first, step, [&](int64_t i, int64_t at) { dx[at] = dy[i]; });
  } else {  // x read at its strides times the steps, from the first element taken
    std::vector<int64_t> from(rank);
    int64_t stride = 1, offset = 0;
    for (int d = rank - 1; d >= 0; d--) {
      from[d] = stride * step[d];
      offset += stride * first[d];
      stride *= x_shape[d];
    }
    if (ElementCount(rank, sliced) == 0) return 0;
    StridedCopy<E>(static_cast<const E *>(params[0]) + offset, static_cast<E *>(params[1]), sliced, from.data(),
                   rank);
  }
  return 0;
}

static int Dispatch(bool scatter, void **params, int *ndims, int64_t **shapes, const char *dtype, void *extra) {
  AotExtra *e = static_cast<AotExtra *>(extra);
  switch (ElementSize(dtype)) {
    case 1: return Run<uint8_t>(scatter, params, ndims, shapes, e);
    case 2: return Run<uint16_t>(scatter, params, ndims, shapes, e);
    case 4: return Run<uint32_t>(scatter, params, ndims, shapes, e);
    case 8: return Run<uint64_t>(scatter, params, ndims, shapes, e);
  }
  return 2;
}

extern "C" int Slice(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra) {
  return Dispatch(false, params, ndims, shapes, dtypes[0], extra);
}

extern "C" int SliceGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  return Dispatch(true, params, ndims, shapes, dtypes[0], extra);
}
