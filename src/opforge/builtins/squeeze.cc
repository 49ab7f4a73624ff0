// squeeze, unsqueeze and reshape: only the shape changes, so the kernel is a
// copy (threaded above elements.h's grain).
#include "custom_aot_extra.h"
#include "elements.h"

extern "C" int Copy(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra) {
  ParallelCopy(params[1], params[0], ElementCount(ndims[0], shapes[0]) * ElementSize(dtypes[0]));
  return 0;
}
