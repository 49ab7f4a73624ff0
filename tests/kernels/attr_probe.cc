// Attribute probe for the opforge tests.
//
// Reads one attribute of every type the aot ABI supports and serialises the
// values into a float64 output of shape [2, width]:
//   row 0 -- read in AttrProbeInit and kept as kernel data,
//   row 1 -- read again in the kernel itself, through the same extra.
// Layout of a row (the Python tests decode it the same way):
//   flag, width, ratio, len(label), label chars..., n, ints..., n, floats...,
//   rows, (len, ints...)..., rows, (len, floats...)...,
//   HasAttr("flag"), HasAttr("no_such_attr"), Attr<float>("width")
// AttrProbeInit also asks for one workspace of `width` doubles; the kernel
// builds row 1 in it and checks nparam == inputs + outputs + workspaces.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "custom_aot_extra.h"

namespace {

std::vector<double> Encode(AotExtra *extra) {
  std::vector<double> out;
  out.push_back(extra->Attr<bool>("flag") ? 1.0 : 0.0);
  out.push_back(static_cast<double>(extra->Attr<int64_t>("width")));
  out.push_back(static_cast<double>(extra->Attr<float>("ratio")));
  std::string label = extra->Attr<std::string>("label");
  out.push_back(static_cast<double>(label.size()));
  for (char c : label) out.push_back(static_cast<double>(static_cast<unsigned char>(c)));
  std::vector<int64_t> ints = extra->Attr<std::vector<int64_t>>("ints");
  out.push_back(static_cast<double>(ints.size()));
  for (int64_t v : ints) out.push_back(static_cast<double>(v));
  std::vector<float> floats = extra->Attr<std::vector<float>>("floats");
  out.push_back(static_cast<double>(floats.size()));
  for (float v : floats) out.push_back(static_cast<double>(v));
  std::vector<std::vector<int64_t>> grid = extra->Attr<std::vector<std::vector<int64_t>>>("grid");
  out.push_back(static_cast<double>(grid.size()));
  for (const auto &row : grid) {
    out.push_back(static_cast<double>(row.size()));
    for (int64_t v : row) out.push_back(static_cast<double>(v));
  }
  std::vector<std::vector<float>> table = extra->Attr<std::vector<std::vector<float>>>("table");
  out.push_back(static_cast<double>(table.size()));
  for (const auto &row : table) {
    out.push_back(static_cast<double>(row.size()));
    for (float v : row) out.push_back(static_cast<double>(v));
  }
  out.push_back(extra->HasAttr("flag") ? 1.0 : 0.0);
  out.push_back(extra->HasAttr("no_such_attr") ? 1.0 : 0.0);
  out.push_back(static_cast<double>(extra->Attr<float>("width")));
  return out;
}

class ProbeData : public AotKernelData {
 public:
  std::vector<double> encoded;
};

}  // namespace

extern "C" std::vector<int64_t> AttrProbeInferShape(int *ndims, int64_t **shapes, AotExtra *extra) {
  return {2, extra->Attr<int64_t>("width")};
}

extern "C" int AttrProbeInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  auto *data = new ProbeData;
  data->encoded = Encode(extra);
  extra->SetKernelData(data);
  int64_t width = extra->Attr<int64_t>("width");
  extra->SetWorkSpace({static_cast<size_t>(width) * sizeof(double)});
  return 0;
}

extern "C" int AttrProbe(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                         void *extra_void) {
  AotExtra *extra = static_cast<AotExtra *>(extra_void);
  if (nparam != 3) return 10;  // x, y, one workspace
  if (ndims[1] != 2 || shapes[1][0] != 2) return 11;
  const int64_t width = shapes[1][1];
  auto *data = static_cast<ProbeData *>(extra->KernelData());
  if (data == nullptr) return 12;
  std::vector<double> again = Encode(extra);
  if (static_cast<int64_t>(data->encoded.size()) > width || static_cast<int64_t>(again.size()) > width) return 13;
  double *out = static_cast<double *>(params[1]);
  double *scratch = static_cast<double *>(params[2]);
  for (int64_t i = 0; i < width; ++i) {
    out[i] = i < static_cast<int64_t>(data->encoded.size()) ? data->encoded[i] : -1.0;
    scratch[i] = i < static_cast<int64_t>(again.size()) ? again[i] : -1.0;
  }
  std::memcpy(out + width, scratch, width * sizeof(double));
  return 0;
}

// Which custom_aot_extra.h this library was compiled against.
extern "C" int ProbeHeader() {
#ifdef TEST_OWN_AOT_HEADER
  return 2;
#elif defined(OPFORGE_CUSTOM_AOT_EXTRA_H_)
  return 1;
#else
  return 0;
#endif
}

// The libstdc++ string ABI this library was really compiled with.
extern "C" int ProbeStringAbi() { return _GLIBCXX_USE_CXX11_ABI; }
