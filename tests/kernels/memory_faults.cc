// Kernels that misuse memory, for tests/test_memory_safety.py.  Each takes one
// float32 input x and has one float32 output y of x's shape.
#include <cstring>

#include "custom_aot_extra.h"

static int64_t Count(int *ndims, int64_t **shapes) {
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  return n;
}

static void Copy(void **params, int64_t n) {
  std::memcpy(params[1], params[0], n * sizeof(float));
}

// Well behaved: y = x.
extern "C" int Good(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  Copy(params, Count(ndims, shapes));
  return 0;
}

// Writes 16 floats (64 bytes) past the end of y.
extern "C" int OutputOverrun(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  int64_t n = Count(ndims, shapes);
  Copy(params, n);
  float *y = static_cast<float *>(params[1]);
  for (int64_t i = n; i < n + 16; i++) y[i] = 1.0f;
  return 0;
}

// Asks for 256 bytes of workspace and writes 64 bytes past them.
extern "C" int WorkspaceOverrunInit(int *, int64_t **, const char **, AotExtra *extra) {
  extra->SetWorkSpace({256});
  return 0;
}
extern "C" int WorkspaceOverrun(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  Copy(params, Count(ndims, shapes));
  std::memset(params[2], 7, 256 + 64);
  return 0;
}

// Asks for two workspaces whose sizes add up past 2**64.
extern "C" int HugeWorkspaceInit(int *, int64_t **, const char **, AotExtra *extra) {
  extra->SetWorkSpace({size_t(1) << 63, size_t(1) << 63});
  return 0;
}
extern "C" int HugeWorkspace(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  Copy(params, Count(ndims, shapes));
  std::memset(params[2], 7, 1024);
  return 0;
}

// Asks for 2**52 bytes: representable, but more than any machine gives.
extern "C" int UnsatisfiableWorkspaceInit(int *, int64_t **, const char **, AotExtra *extra) {
  extra->SetWorkSpace({size_t(1) << 52});
  return 0;
}
extern "C" int UnsatisfiableWorkspace(int, void **params, int *ndims, int64_t **shapes, const char **, void *,
                                      void *) {
  Copy(params, Count(ndims, shapes));
  std::memset(params[2], 7, 1024);
  return 0;
}

// Writes only the first half of y.
extern "C" int HalfWrite(int, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  std::memcpy(params[1], params[0], Count(ndims, shapes) / 2 * sizeof(float));
  return 0;
}
