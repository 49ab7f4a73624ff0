// y = a + b, element-wise float32, in MindSpore's aot ABI.
// Used by benchmarks/call_overhead.py to measure per-call overhead; no Init,
// no InferShape, no attributes, so the call path is the whole cost.
#include <cstdint>

extern "C" int Add(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                   void *extra) {
  if (nparam < 3) return 1;
  const float *a = static_cast<const float *>(params[0]);
  const float *b = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  int64_t n = 1;
  for (int i = 0; i < ndims[2]; ++i) n *= shapes[2][i];
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  return 0;
}
