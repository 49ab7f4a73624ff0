// Small aot-ABI kernels used by tests/test_custom.py.  Our own test code.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "custom_aot_extra.h"

namespace {

int64_t Elements(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

std::atomic<int> g_init_calls{0};
std::atomic<int> g_deleted{0};
std::atomic<int> g_barrier{0};

// Kernel data whose destruction is counted.
class ScaleData : public AotKernelData {
 public:
  float scale = 0.0f;
  ~ScaleData() override { g_deleted.fetch_add(1); }
};

}  // namespace

// ---- counters, read by the tests through ctypes --------------------------
extern "C" int InitCalls() { return g_init_calls.load(); }
extern "C" int DataDeleted() { return g_deleted.load(); }
extern "C" void ResetBarrier() { g_barrier.store(0); }

// ---- Scale: y = x * scale, with the attribute kept as kernel data ---------
extern "C" int ScaleInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  g_init_calls.fetch_add(1);
  auto *data = new ScaleData;
  data->scale = extra->Attr<float>("scale");
  extra->SetKernelData(data);
  return 0;
}

extern "C" int Scale(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                     void *extra_void) {
  if (nparam != 2) return 1;
  auto *data = static_cast<ScaleData *>(static_cast<AotExtra *>(extra_void)->KernelData());
  if (data == nullptr) return 2;
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  int64_t n = Elements(ndims[1], shapes[1]);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * data->scale;
  return 0;
}

// ---- Rejected: Init sets (counted) kernel data, then fails with attribute "code"
extern "C" int RejectedInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  extra->SetKernelData(new ScaleData);
  return static_cast<int>(extra->Attr<int64_t>("code"));
}

extern "C" int Rejected(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                        void *extra) {
  return 0;
}

// ---- AddMulWs: y = (x + w) + (x * w), both terms built in two workspaces --
extern "C" int AddMulWsInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  size_t bytes = static_cast<size_t>(Elements(ndims[0], shapes[0])) * sizeof(float);
  extra->SetWorkSpace({bytes, bytes});
  return 0;
}

extern "C" int AddMulWs(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                        void *extra) {
  if (nparam != 2 + 1 + 2) return 5;  // inputs + outputs + workspaces
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  float *sum = static_cast<float *>(params[3]);
  float *product = static_cast<float *>(params[4]);
  int64_t n = Elements(ndims[0], shapes[0]);
  for (int64_t i = 0; i < n; ++i) {
    sum[i] = x[i] + w[i];
    product[i] = x[i] * w[i];
  }
  for (int64_t i = 0; i < n; ++i) y[i] = sum[i] + product[i];
  return 0;
}

// ---- Lin: y = a * x + b * w, on float32 (for layout and threading tests) --
extern "C" int Lin(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                   void *extra_void) {
  if (nparam != 3) return 1;
  AotExtra *extra = static_cast<AotExtra *>(extra_void);
  float a = extra->Attr<float>("a");
  float b = extra->Attr<float>("b");
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  int64_t n = Elements(ndims[2], shapes[2]);
  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b * w[i];
  return 0;
}

// ---- RowSum: sums each row of a 2-D input; InferShape handles -1 and [-2] -
extern "C" std::vector<int64_t> RowSumInferShape(int *ndims, int64_t **shapes, AotExtra *extra) {
  if (ndims[0] == 1 && shapes[0][0] == -2) return {-2};
  if (extra->Attr<bool>("keep_dim")) return {shapes[0][0], 1};
  return {shapes[0][0]};
}

extern "C" int RowSum(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                      void *extra) {
  if (nparam != 2 || ndims[0] != 2) return 1;
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  for (int64_t r = 0; r < shapes[0][0]; ++r) {
    float total = 0.0f;
    for (int64_t c = 0; c < shapes[0][1]; ++c) total += x[r * shapes[0][1] + c];
    y[r] = total;
  }
  return 0;
}

// ---- SumDiffDot: three outputs (x + w, x - w, [sum(x * w)]) ---------------
extern "C" std::vector<std::vector<int64_t>> SumDiffDotInferShape(int *ndims, int64_t **shapes, AotExtra *extra) {
  std::vector<int64_t> same(shapes[0], shapes[0] + ndims[0]);
  return {same, same, {1}};
}

extern "C" int SumDiffDot(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                          void *extra) {
  if (nparam != 5) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  float *sum = static_cast<float *>(params[2]);
  float *diff = static_cast<float *>(params[3]);
  float *dot = static_cast<float *>(params[4]);
  int64_t n = Elements(ndims[0], shapes[0]);
  dot[0] = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    sum[i] = x[i] + w[i];
    diff[i] = x[i] - w[i];
    dot[0] += x[i] * w[i];
  }
  return 0;
}

// ---- DtypeName: writes dtypes[0] into a uint8 output and checks it against
// the "expected" attribute (returns 3 on a mismatch) --------------------------
extern "C" int DtypeName(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                         void *extra_void) {
  if (nparam != 2) return 1;
  if (std::strcmp(dtypes[1], "uint8") != 0) return 2;
  int64_t room = Elements(ndims[1], shapes[1]);
  uint8_t *out = static_cast<uint8_t *>(params[1]);
  std::memset(out, 0, room);
  size_t len = std::strlen(dtypes[0]);
  if (static_cast<int64_t>(len) >= room) return 4;
  std::memcpy(out, dtypes[0], len);
  std::string expected = static_cast<AotExtra *>(extra_void)->Attr<std::string>("expected");
  return expected == dtypes[0] ? 0 : 3;
}

// ---- error paths ------------------------------------------------------------
extern "C" int FailWith(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                        void *extra) {
  return static_cast<int>(static_cast<AotExtra *>(extra)->Attr<int64_t>("code"));
}

extern "C" int Throw(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                     void *extra) {
  throw std::runtime_error("kernel gave up: " + static_cast<AotExtra *>(extra)->Attr<std::string>("why"));
}

// Reads an attribute the op does not have.
extern "C" int AskUnknown(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                          void *extra) {
  float *y = static_cast<float *>(params[1]);
  y[0] = static_cast<AotExtra *>(extra)->Attr<float>("no_such_attr");
  return 0;
}

// The same, in Init.
extern "C" int AskUnknownInInitInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  extra->SetWorkSpace({static_cast<size_t>(extra->Attr<int64_t>("missing_in_init"))});
  return 0;
}
extern "C" int AskUnknownInInit(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                void *stream, void *extra) {
  return 0;
}

// The same, but the kernel swallows the exception and reports success.
extern "C" int SwallowUnknown(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  float *y = static_cast<float *>(params[1]);
  y[0] = 1.0f;
  try {
    y[0] = static_cast<float>(static_cast<AotExtra *>(extra)->Attr<int64_t>("ghost"));
  } catch (...) {
  }
  return 0;
}

// Reads attribute "value" as int64 and as float; writes both.
extern "C" int ReadInt(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                       void *extra) {
  double *y = static_cast<double *>(params[1]);
  y[0] = static_cast<double>(static_cast<AotExtra *>(extra)->Attr<int64_t>("value"));
  return 0;
}
extern "C" int ReadFloat(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                         void *extra) {
  double *y = static_cast<double *>(params[1]);
  y[0] = static_cast<double>(static_cast<AotExtra *>(extra)->Attr<float>("value"));
  return 0;
}

// ---- Rendezvous: copies x into its workspace, waits until `parties` calls are
// inside the kernel at once (or 10 s pass: returns 9), then y = 2 * workspace.
// Only possible if the GIL is released while kernels run; a workspace shared
// between concurrent calls would mix up their results.
extern "C" int RendezvousInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  extra->SetWorkSpace({static_cast<size_t>(Elements(ndims[0], shapes[0])) * sizeof(float)});
  return 0;
}

extern "C" int Rendezvous(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                          void *extra) {
  if (nparam != 3) return 1;
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  float *ws = static_cast<float *>(params[2]);
  int64_t n = Elements(ndims[0], shapes[0]);
  for (int64_t i = 0; i < n; ++i) ws[i] = x[i];
  int parties = static_cast<int>(static_cast<AotExtra *>(extra)->Attr<int64_t>("parties"));
  g_barrier.fetch_add(1);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (g_barrier.load() < parties) {
    if (std::chrono::steady_clock::now() > deadline) return 9;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (int64_t i = 0; i < n; ++i) y[i] = 2.0f * ws[i];
  return 0;
}
