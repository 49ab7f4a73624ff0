/*
 * custom_aot_extra.h -- the opforge kernel header for the "aot" custom-op ABI.
 *
 * A kernel library exports, with C linkage:
 *
 *   int Fn(int nparam, void **params, int *ndims, int64_t **shapes,
 *          const char **dtypes, void *stream, void *extra);            required
 *   int FnInit(int *ndims, int64_t **shapes, const char **dtypes,
 *              AotExtra *extra);                                        optional
 *   std::vector<int64_t> FnInferShape(int *ndims, int64_t **shapes,
 *                                     AotExtra *extra);                 optional
 *     (an op with several outputs may return
 *      std::vector<std::vector<int64_t>> instead)
 *
 * params holds the inputs, then the outputs, then the workspace buffers that
 * FnInit asked for; ndims/shapes/dtypes describe inputs and outputs only.
 * Return 0 on success.  `extra` is an AotExtra*: read attributes with
 * extra->Attr<T>("name"), request workspace with SetWorkSpace (sizes in bytes)
 * and keep per-signature state with SetKernelData (opforge deletes it, once).
 *
 * The classes below keep the exact virtual-function order and member layout
 * of the header MindSpore ships under the same name, so a kernel built
 * against either header runs under opforge and under MindSpore.  Do not
 * reorder members.
 */
#ifndef OPFORGE_CUSTOM_AOT_EXTRA_H_
#define OPFORGE_CUSTOM_AOT_EXTRA_H_

#ifdef __cplusplus

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

/* Base class of per-signature kernel state.  Derive from it; opforge deletes
 * the object through this base when the signature's entry is dropped. */
class AotKernelData {
 public:
  AotKernelData() = default;
  virtual ~AotKernelData() = default;
};

class AotExtra {
 public:
  AotExtra() = default;
  virtual ~AotExtra() = default;

  /* True when the op was given an attribute of this name. */
  virtual bool HasAttr(std::string name) = 0;

  /* Attribute value.  T is one of: bool, int64_t, float, std::string,
   * std::vector<int64_t>, std::vector<float>,
   * std::vector<std::vector<int64_t>>, std::vector<std::vector<float>>.
   * An unknown name or a type that does not fit the value throws; opforge
   * reports it as opforge.AttrError naming the op and the attribute. */
  template <typename T>
  T Attr(std::string name) {
    static_assert(sizeof(T) == 0, "AotExtra::Attr<T>: unsupported attribute type");
    return T();
  }

  void SetWorkSpace(const std::vector<size_t> &workspace) { workspace_ = workspace; }
  const std::vector<size_t> &WorkSpace() const { return workspace_; }

  void SetKernelData(AotKernelData *kernel_data) { kernel_data_ = kernel_data; }
  AotKernelData *KernelData() const { return kernel_data_; }
  void DestructKernelData() {
    delete kernel_data_;
    kernel_data_ = nullptr;
  }

 private:
  /* Vtable slots after HasAttr, in this order; implemented by the host. */
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

template <>
inline bool AotExtra::Attr<bool>(std::string name) { return GetAttrBool(name); }
template <>
inline int64_t AotExtra::Attr<int64_t>(std::string name) { return GetAttrInt(name); }
template <>
inline float AotExtra::Attr<float>(std::string name) { return GetAttrFloat(name); }
template <>
inline std::string AotExtra::Attr<std::string>(std::string name) { return GetAttrStr(name); }
template <>
inline std::vector<int64_t> AotExtra::Attr<std::vector<int64_t>>(std::string name) {
  return GetAttrIntVec(name);
}
template <>
inline std::vector<float> AotExtra::Attr<std::vector<float>>(std::string name) {
  return GetAttrFloatVec(name);
}
template <>
inline std::vector<std::vector<int64_t>> AotExtra::Attr<std::vector<std::vector<int64_t>>>(std::string name) {
  return GetAttrInt2DVec(name);
}
template <>
inline std::vector<std::vector<float>> AotExtra::Attr<std::vector<std::vector<float>>>(std::string name) {
  return GetAttrFloat2DVec(name);
}

#else /* C: kernels see the extra object as an opaque pointer. */

#include <stddef.h>
#include <stdint.h>
typedef struct AotExtra AotExtra;

#endif /* __cplusplus */

#endif /* OPFORGE_CUSTOM_AOT_EXTRA_H_ */
