// DLPack, the C ABI array libraries exchange tensors through (dmlc/dlpack,
// versions 1.x), declared here from its specification, and opforge's two
// Python types on it (dlpack.cc):
//
// * DLTensorView(capsule) -- consumes a "dltensor" / "dltensor_versioned"
//   capsule and reads the tensor it describes (data pointer, shape,
//   strides, dtype, device); the producer's deleter runs when the view dies.
// * DLPackExport(data, shape, dtype, device_type, device_id, owner,
//   readonly=False, *, sync=None) -- memory opforge holds, handed to any
//   consumer's from_dlpack; the consumer keeps `owner` alive until it calls
//   the deleter.  `sync(stream)` gets each consumer's stream argument first
//   (for CUDA memory: the protocol's producer/consumer stream ordering).
#ifndef OPFORGE_NATIVE_DLPACK_H_
#define OPFORGE_NATIVE_DLPACK_H_

#include <Python.h>

#include <cstddef>
#include <cstdint>

namespace opforge_native {

// DLDeviceType values opforge names; others pass through as plain numbers.
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLCUDAHost = 3;     // pinned host memory
constexpr int32_t kDLCUDAManaged = 13;

// DLDataTypeCode values opforge has dtypes for.
constexpr uint8_t kDLInt = 0;
constexpr uint8_t kDLUInt = 1;
constexpr uint8_t kDLFloat = 2;
constexpr uint8_t kDLBfloat = 4;
constexpr uint8_t kDLBool = 6;

// DLManagedTensorVersioned::flags bits.
constexpr uint64_t kDLFlagReadOnly = uint64_t{1} << 0;

struct DLDevice {
  int32_t device_type;  // a C enum in dlpack.h: int-sized on every ABI we build for
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;       // ndim entries (may be null when ndim == 0)
  int64_t *strides;     // in elements; null (before DLPack 1.2) means compact row-major
  uint64_t byte_offset;
};

// The legacy form, in capsules named "dltensor".
struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(DLManagedTensor *self);
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

// The versioned form (DLPack >= 1.0), in capsules named "dltensor_versioned".
// Only `version`, `manager_ctx` and `deleter` keep their place across major versions.
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
};

// The layout every producer and consumer agrees on (LP64).
static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4, "DLPack layout");
static_assert(offsetof(DLTensor, shape) == 24 && sizeof(DLTensor) == 48, "DLPack layout");
static_assert(offsetof(DLManagedTensor, deleter) == 56 && sizeof(DLManagedTensor) == 64, "DLPack layout");
static_assert(offsetof(DLManagedTensorVersioned, flags) == 24 && offsetof(DLManagedTensorVersioned, dl_tensor) == 32,
              "DLPack layout");

// Adds DLTensorView and DLPackExport to the module; false with a Python error set.
bool AddDLPackTypes(PyObject *module);

// A DLTensorView of a producer's capsule (consuming it), as DLTensorView(capsule) makes one.
PyObject *ViewCapsule(PyObject *capsule);

// The tensor a DLTensorView holds, its opforge dtype name and whether it is C-contiguous;
// nullptr when `view` is not a DLTensorView.
const DLTensor *ViewedTensor(PyObject *view, const char **dtype, bool *c_contiguous);

}  // namespace opforge_native

#endif  // OPFORGE_NATIVE_DLPACK_H_
