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
  char *y = static_cast<char *>(params[n_inputs]);
  for (int64_t o = 0; o < outer; o++) {
    for (int k = 0; k < n_inputs; k++) {
      const int64_t row = shapes[k][axis] * inner * size;
      if (row == 0) continue;  // an empty input (its pointer may be anything)
      std::memcpy(y, static_cast<const char *>(params[k]) + o * row, row);
      y += row;
    }
  }
  return 0;
}
