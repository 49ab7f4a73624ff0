// An independent, minimal declaration of the aot "extra" classes, written for
// the opforge tests from the layout facts alone (shared/AOT-ABI.md):
//   * AotKernelData: polymorphic, only a virtual destructor;
//   * AotExtra: vtable = destructor, HasAttr, then GetAttrBool, GetAttrInt,
//     GetAttrFloat, GetAttrStr, GetAttrIntVec, GetAttrFloatVec,
//     GetAttrInt2DVec, GetAttrFloat2DVec (each taking std::string by value);
//     data after the vptr: std::vector<size_t> workspace_, then
//     AotKernelData *kernel_data_.
// It stands in for a user's downloaded copy of MindSpore's header: a kernel
// next to this file includes it instead of opforge's.  Deliberately shares no
// code with opforge's header (Attr is one `if constexpr` template here).
#ifndef TEST_OWN_AOT_HEADER
#define TEST_OWN_AOT_HEADER 1

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

class AotKernelData {
 public:
  virtual ~AotKernelData() {}
};

class AotExtra {
 public:
  virtual ~AotExtra() {}
  virtual bool HasAttr(std::string name) = 0;

  template <class T>
  T Attr(std::string name) {
    if constexpr (std::is_same<T, bool>::value) {
      return GetAttrBool(name);
    } else if constexpr (std::is_same<T, int64_t>::value) {
      return GetAttrInt(name);
    } else if constexpr (std::is_same<T, float>::value) {
      return GetAttrFloat(name);
    } else if constexpr (std::is_same<T, std::string>::value) {
      return GetAttrStr(name);
    } else if constexpr (std::is_same<T, std::vector<int64_t>>::value) {
      return GetAttrIntVec(name);
    } else if constexpr (std::is_same<T, std::vector<float>>::value) {
      return GetAttrFloatVec(name);
    } else if constexpr (std::is_same<T, std::vector<std::vector<int64_t>>>::value) {
      return GetAttrInt2DVec(name);
    } else {
      static_assert(std::is_same<T, std::vector<std::vector<float>>>::value, "unsupported attribute type");
      return GetAttrFloat2DVec(name);
    }
  }

  void SetWorkSpace(const std::vector<size_t> &sizes) { workspace_ = sizes; }
  const std::vector<size_t> &WorkSpace() const { return workspace_; }
  void SetKernelData(AotKernelData *data) { kernel_data_ = data; }
  AotKernelData *KernelData() const { return kernel_data_; }
  void DestructKernelData() {
    delete kernel_data_;
    kernel_data_ = nullptr;
  }

 private:
  virtual bool GetAttrBool(std::string name) = 0;
  virtual int64_t GetAttrInt(std::string name) = 0;
  virtual float GetAttrFloat(std::string name) = 0;
  virtual std::string GetAttrStr(std::string name) = 0;
  virtual std::vector<int64_t> GetAttrIntVec(std::string name) = 0;
  virtual std::vector<float> GetAttrFloatVec(std::string name) = 0;
  virtual std::vector<std::vector<int64_t>> GetAttrInt2DVec(std::string name) = 0;
  virtual std::vector<std::vector<float>> GetAttrFloat2DVec(std::string name) = 0;

  std::vector<size_t> workspace_;
  AotKernelData *kernel_data_ = nullptr;
};

#endif  // TEST_OWN_AOT_HEADER
