// Helpers for kernels that move elements without looking at their values
// (slice, concat, squeeze): one library serves every dtype.
#ifndef OPFORGE_BUILTINS_ELEMENTS_H_
#define OPFORGE_BUILTINS_ELEMENTS_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>

// Bytes per element of an ABI dtype name: the bit count it ends with, or 1 (bool).
static inline int64_t ElementSize(const char *dtype) {
  const char *digits = dtype + std::strcspn(dtype, "0123456789");
  return *digits ? std::atoi(digits) / 8 : 1;
}

static inline int64_t ElementCount(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

#endif  // OPFORGE_BUILTINS_ELEMENTS_H_
