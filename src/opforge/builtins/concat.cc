// concat: the inputs joined along one axis, for every dtype (rows of bytes
// are copied, never looked at).  params: every input, then y.
#include <cstdint>
#include <cstring>

#include "custom_aot_extra.h"
#include "elements.h"

extern "C" int Concat(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const int n_inputs = nparam - 1, rank = ndims[n_inputs];
  int64_t axis = extra->Attr<int64_t>("axis");
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return 1;  // the op's check rejects this first
  // View every tensor as [outer, length along axis * inner]: y's rows are the
  // inputs' rows side by side.
  const int64_t size = ElementSize(dtypes[0]);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < rank; d++) {
    if (d < axis) outer *= shapes[n_inputs][d];
    if (d > axis) inner *= shapes[n_inputs][d];
  }
  int64_t total = 0;  // bytes of one row of y
  for (int k = 0; k < n_inputs; k++) total += shapes[k][axis] * inner * size;
  char *y = static_cast<char *>(params[n_inputs]);
  if (outer * total == 0) return 0;
  if (total >= 4 * OPFORGE_COPY_CHUNK) {  // few long rows: each input's part split across the threads
    for (int64_t o = 0, at = 0; o < outer; o++)
      for (int k = 0; k < n_inputs; k++) {
        const int64_t row = shapes[k][axis] * inner * size;
        if (row) ParallelCopy(y + at, static_cast<const char *>(params[k]) + o * row, row);
        at += row;
      }
    return 0;
  }
  opforge::parallel_for(0, outer, std::max<int64_t>(1, OPFORGE_COPY_GRAIN / total), [&](int64_t o0, int64_t o1) {
    char *out = y + o0 * total;
    for (int64_t o = o0; o < o1; o++)
      for (int k = 0; k < n_inputs; k++) {
        const int64_t row = shapes[k][axis] * inner * size;
        if (row == 0) continue;  // an empty input (its pointer may be anything)
        std::memcpy(out, static_cast<const char *>(params[k]) + o * row, row);
        out += row;
      }
  });
  return 0;
}
