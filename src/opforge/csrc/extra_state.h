// ABI-neutral state behind opforge's AotExtra implementation.
//
// The kernel may be built with either libstdc++ string ABI, so the AotExtra
// object handed to it is compiled twice (extra_abi0.cc, extra_abi1.cc).  What
// the two share with the Python module is kept free of std::string: only
// std::vector and plain data, whose layout is the same under both ABIs.
#ifndef OPFORGE_NATIVE_EXTRA_STATE_H_
#define OPFORGE_NATIVE_EXTRA_STATE_H_

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

class AotExtra;

namespace opforge_native {

enum class AttrKind : int { kBool, kInt, kFloat, kStr, kIntList, kFloatList, kInt2D, kFloat2D, kEmptyList };

struct NeutralAttr {
  std::vector<char> name;  // NUL-terminated
  AttrKind kind = AttrKind::kInt;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::vector<char> text;                  // kStr, NUL-terminated
  std::vector<std::vector<int64_t>> ints;  // int lists: one row for 1-D
  std::vector<std::vector<double>> reals;  // numeric lists as doubles (ints too)
};

enum ErrorKind : int { kNoError = 0, kAttrError = 1 };

// The last attribute error of the calling thread.  Per thread, not per
// AotExtra: one AotExtra serves calls on many threads at once.
struct AttrErrorSlot {
  int kind = kNoError;
  char message[512] = {0};
};
AttrErrorSlot &ThreadAttrError();  // defined in native.cc

struct ExtraState {
  std::vector<char> op_name;  // NUL-terminated
  std::vector<NeutralAttr> attrs;

  const NeutralAttr *Find(const char *name) const {
    for (const auto &a : attrs)
      if (std::strcmp(a.name.data(), name) == 0) return &a;
    return nullptr;
  }
};

// Thrown by attribute getters; carries its message in a fixed buffer so it is
// the same type under both string ABIs.
class AttrFailure : public std::exception {
 public:
  explicit AttrFailure(const char *message) { std::snprintf(message_, sizeof(message_), "%s", message); }
  const char *what() const noexcept override { return message_; }

 private:
  char message_[512];
};

AotExtra *NewExtraAbi0(ExtraState *state);  // _GLIBCXX_USE_CXX11_ABI=0
AotExtra *NewExtraAbi1(ExtraState *state);  // _GLIBCXX_USE_CXX11_ABI=1

}  // namespace opforge_native

#endif  // OPFORGE_NATIVE_EXTRA_STATE_H_
