// The attribute probe (../attr_probe.cc) compiled against the header in this
// folder instead of opforge's: the quoted include below finds the copy next
// to this source first, and attr_probe.cc's own include resolves to it too.
#include "custom_aot_extra.h"

#include "../attr_probe.cc"

// Kernel data whose destructor is counted, to check opforge deletes it once
// through this header's AotKernelData.
#include <atomic>

namespace {
std::atomic<int> g_own_deleted{0};
class OwnData : public AotKernelData {
 public:
  ~OwnData() override { g_own_deleted.fetch_add(1); }
  int64_t width = 0;
};
}  // namespace

extern "C" int OwnDeleted() { return g_own_deleted.load(); }

// Init keeps `width` in kernel data and asks for a workspace of width floats;
// the kernel fills the workspace and then y[i] = x[i] + workspace[i] = x[i] + i.
extern "C" int RampInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  auto *data = new OwnData;
  data->width = extra->Attr<int64_t>("width");
  extra->SetKernelData(data);
  extra->SetWorkSpace({static_cast<size_t>(data->width) * sizeof(float)});
  return 0;
}

extern "C" int Ramp(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                    void *extra_void) {
  if (nparam != 3) return 1;
  auto *data = dynamic_cast<OwnData *>(static_cast<AotExtra *>(extra_void)->KernelData());
  if (data == nullptr) return 2;
  if (shapes[0][0] != data->width) return 3;
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  float *ws = static_cast<float *>(params[2]);
  for (int64_t i = 0; i < data->width; ++i) ws[i] = static_cast<float>(i);
  for (int64_t i = 0; i < data->width; ++i) y[i] = x[i] + ws[i];
  return 0;
}
