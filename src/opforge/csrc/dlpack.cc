// DLPack in and out of opforge (see dlpack.h for the two types).
//
// The capsule protocol: a producer's __dlpack__ returns a capsule named
// "dltensor" (legacy) or "dltensor_versioned" holding a managed tensor.  A
// consumer takes ownership by renaming the capsule "used_..."; from then on
// it, not the capsule, must call the managed tensor's deleter, exactly once.
// A capsule that dies unconsumed calls the deleter from its destructor.
#include "dlpack.h"

#include <cstdlib>
#include <cstring>

namespace opforge_native {
namespace {

constexpr char kLegacyName[] = "dltensor";
constexpr char kVersionedName[] = "dltensor_versioned";
constexpr char kUsedLegacyName[] = "used_dltensor";
constexpr char kUsedVersionedName[] = "used_dltensor_versioned";

// opforge's dtype names (opforge.dtypes) and their DLPack codes, lanes 1.
struct NamedDType {
  const char *name;
  uint8_t code;
  uint8_t bits;
};
constexpr NamedDType kDTypes[] = {
    {"bool", kDLBool, 8},      {"int8", kDLInt, 8},       {"int16", kDLInt, 16},     {"int32", kDLInt, 32},
    {"int64", kDLInt, 64},     {"uint8", kDLUInt, 8},     {"uint16", kDLUInt, 16},   {"uint32", kDLUInt, 32},
    {"uint64", kDLUInt, 64},   {"float16", kDLFloat, 16}, {"float32", kDLFloat, 32}, {"float64", kDLFloat, 64},
    {"bfloat16", kDLBfloat, 16},
};
constexpr char kDTypeList[] =
    "bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, float64, bfloat16";

const char *DTypeName(DLDataType dtype) {
  if (dtype.lanes != 1) return nullptr;
  for (const NamedDType &known : kDTypes)
    if (known.code == dtype.code && known.bits == dtype.bits) return known.name;
  return nullptr;
}

bool DTypeFromName(const char *name, DLDataType *dtype) {
  for (const NamedDType &known : kDTypes) {
    if (std::strcmp(known.name, name) == 0) {
      *dtype = DLDataType{known.code, known.bits, 1};
      return true;
    }
  }
  return false;
}

// Product of the dims, false on overflow (a foreign shape is not trusted).
bool ElementCount(const int64_t *shape, int ndim, uint64_t *count) {
  uint64_t total = 1;
  for (int d = 0; d < ndim; d++)
    if (__builtin_mul_overflow(total, static_cast<uint64_t>(shape[d]), &total)) return false;
  *count = total;
  return true;
}

PyObject *IntTuple(const int64_t *values, int n) {
  PyObject *tuple = PyTuple_New(n);
  if (tuple == nullptr) return nullptr;
  for (int i = 0; i < n; i++) {
    PyObject *item = PyLong_FromLongLong(values[i]);
    if (item == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, i, item);
  }
  return tuple;
}

// --------------------------------------------------------- DLTensorView ----

struct ViewObject {
  PyObject_HEAD
  DLManagedTensor *legacy;             // exactly one of the two is set once consumed
  DLManagedTensorVersioned *versioned;
  const DLTensor *tensor;
  const char *dtype;                   // a kDTypes name
};

PyTypeObject ViewType = {PyVarObject_HEAD_INIT(nullptr, 0)};

void View_dealloc(ViewObject *self) {
  // A producer's deleter may run Python code (NumPy's releases its array);
  // keep an error being raised (a failed construction) from leaking into it.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (self->legacy != nullptr && self->legacy->deleter != nullptr) self->legacy->deleter(self->legacy);
  if (self->versioned != nullptr && self->versioned->deleter != nullptr) self->versioned->deleter(self->versioned);
  PyErr_Restore(type, value, traceback);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

// Checks the consumed tensor; false with ValueError set.  The caller then
// drops the view, whose dealloc hands the tensor back to its producer.
bool View_check(ViewObject *self) {
  if (self->versioned != nullptr && self->versioned->version.major != 1) {
    PyErr_Format(PyExc_ValueError, "DLPack version %u.%u is not supported (opforge reads 1.x)",
                 self->versioned->version.major, self->versioned->version.minor);
    return false;
  }
  const DLTensor &t = *self->tensor;
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    PyErr_Format(PyExc_ValueError, "DLPack tensor has ndim %d and %s shape", t.ndim, t.shape ? "a" : "no");
    return false;
  }
  self->dtype = DTypeName(t.dtype);
  if (self->dtype == nullptr) {
    PyErr_Format(PyExc_ValueError,
                 "DLPack dtype (code %d, bits %d, lanes %d) has no opforge dtype; opforge takes %s (lanes 1)",
                 t.dtype.code, t.dtype.bits, t.dtype.lanes, kDTypeList);
    return false;
  }
  uint64_t count;
  for (int d = 0; d < t.ndim; d++) {
    if (t.shape[d] < 0) {
      PyErr_Format(PyExc_ValueError, "DLPack tensor has a negative dim %lld", static_cast<long long>(t.shape[d]));
      return false;
    }
  }
  if (!ElementCount(t.shape, t.ndim, &count) || __builtin_mul_overflow(count, uint64_t{t.dtype.bits}, &count)) {
    PyErr_SetString(PyExc_ValueError, "DLPack tensor's size overflows 64 bits");
    return false;
  }
  return true;
}

PyObject *View_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  static const char *keywords[] = {"capsule", nullptr};
  PyObject *capsule;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:DLTensorView", const_cast<char **>(keywords), &capsule))
    return nullptr;
  if (!PyCapsule_CheckExact(capsule)) {
    PyErr_Format(PyExc_TypeError, "DLTensorView takes a DLPack capsule (from x.__dlpack__()), got %s",
                 Py_TYPE(capsule)->tp_name);
    return nullptr;
  }
  const char *name = PyCapsule_GetName(capsule);
  bool versioned;
  if (name != nullptr && std::strcmp(name, kVersionedName) == 0) {
    versioned = true;
  } else if (name != nullptr && std::strcmp(name, kLegacyName) == 0) {
    versioned = false;
  } else if (name != nullptr && (std::strcmp(name, kUsedLegacyName) == 0 || std::strcmp(name, kUsedVersionedName) == 0)) {
    PyErr_Format(PyExc_ValueError, "the DLPack capsule was already consumed (it is named '%s'); "
                 "call __dlpack__() again for a new one", name);
    return nullptr;
  } else {
    PyErr_Format(PyExc_ValueError, "not a DLPack capsule: named '%s', expected '%s' or '%s'",
                 name ? name : "(null)", kLegacyName, kVersionedName);
    return nullptr;
  }
  void *managed = PyCapsule_GetPointer(capsule, name);
  if (managed == nullptr) return nullptr;
  auto *self = reinterpret_cast<ViewObject *>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;  // not consumed yet: the capsule still owns the tensor
  if (PyCapsule_SetName(capsule, versioned ? kUsedVersionedName : kUsedLegacyName) < 0) {
    Py_DECREF(self);
    return nullptr;
  }
  // Consumed: from here the view owns the tensor, so every failure below
  // goes through View_dealloc, which calls the deleter.
  if (versioned) {
    self->versioned = static_cast<DLManagedTensorVersioned *>(managed);
    self->tensor = &self->versioned->dl_tensor;
  } else {
    self->legacy = static_cast<DLManagedTensor *>(managed);
    self->tensor = &self->legacy->dl_tensor;
  }
  if (!View_check(self)) {
    Py_DECREF(self);
    return nullptr;
  }
  return reinterpret_cast<PyObject *>(self);
}

PyObject *View_data(ViewObject *self, void *) {
  return PyLong_FromUnsignedLongLong(reinterpret_cast<uintptr_t>(self->tensor->data) + self->tensor->byte_offset);
}

PyObject *View_shape(ViewObject *self, void *) { return IntTuple(self->tensor->shape, self->tensor->ndim); }

PyObject *View_strides(ViewObject *self, void *) {
  if (self->tensor->strides == nullptr || self->tensor->ndim == 0) Py_RETURN_NONE;
  return IntTuple(self->tensor->strides, self->tensor->ndim);
}

PyObject *View_dtype(ViewObject *self, void *) { return PyUnicode_FromString(self->dtype); }

PyObject *View_device(ViewObject *self, void *) {
  return Py_BuildValue("(ii)", self->tensor->device.device_type, self->tensor->device.device_id);
}

PyObject *View_readonly(ViewObject *self, void *) {
  return PyBool_FromLong(self->versioned != nullptr && (self->versioned->flags & kDLFlagReadOnly) != 0);
}

PyObject *View_versioned(ViewObject *self, void *) { return PyBool_FromLong(self->versioned != nullptr); }

// Row-major order; dims of size 1 may carry any stride, and an empty tensor
// has no element to be out of place.
bool CContiguous(const DLTensor &t) {
  if (t.strides == nullptr) return true;
  for (int d = 0; d < t.ndim; d++)
    if (t.shape[d] == 0) return true;
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; d--) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];  // no overflow: View_check bounded the element count
  }
  return true;
}

PyObject *View_c_contiguous(ViewObject *self, void *) { return PyBool_FromLong(CContiguous(*self->tensor)); }

PyObject *View_nbytes(ViewObject *self, void *) {
  uint64_t count = 1;
  ElementCount(self->tensor->shape, self->tensor->ndim, &count);  // checked in View_check
  return PyLong_FromUnsignedLongLong(count * self->tensor->dtype.bits / 8);
}

PyObject *View_ndim(ViewObject *self, void *) { return PyLong_FromLong(self->tensor->ndim); }

PyObject *View_repr(ViewObject *self) {
  PyObject *shape = View_shape(self, nullptr);
  if (shape == nullptr) return nullptr;
  PyObject *repr = PyUnicode_FromFormat("<DLTensorView %s%R on (%d, %d) at %p>", self->dtype, shape,
                                        self->tensor->device.device_type, self->tensor->device.device_id,
                                        reinterpret_cast<char *>(self->tensor->data) + self->tensor->byte_offset);
  Py_DECREF(shape);
  return repr;
}

PyGetSetDef View_getset[] = {
    {"data", reinterpret_cast<getter>(View_data), nullptr, "data pointer plus byte_offset, as an int", nullptr},
    {"shape", reinterpret_cast<getter>(View_shape), nullptr, "tuple of ints", nullptr},
    {"strides", reinterpret_cast<getter>(View_strides), nullptr, "tuple of strides in elements, or None (compact)",
     nullptr},
    {"dtype", reinterpret_cast<getter>(View_dtype), nullptr, "opforge dtype name", nullptr},
    {"device", reinterpret_cast<getter>(View_device), nullptr, "(device_type, device_id)", nullptr},
    {"readonly", reinterpret_cast<getter>(View_readonly), nullptr, "the producer marked the memory read-only",
     nullptr},
    {"versioned", reinterpret_cast<getter>(View_versioned), nullptr, "came from a 'dltensor_versioned' capsule",
     nullptr},
    {"c_contiguous", reinterpret_cast<getter>(View_c_contiguous), nullptr, "row-major and compact", nullptr},
    {"nbytes", reinterpret_cast<getter>(View_nbytes), nullptr, "bytes the elements take", nullptr},
    {"ndim", reinterpret_cast<getter>(View_ndim), nullptr, "number of dims", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// --------------------------------------------------------- DLPackExport ----

struct ExportObject {
  PyObject_HEAD
  uintptr_t data;
  int64_t *shape;  // PyMem block of ndim entries (null when ndim == 0)
  int ndim;
  DLDataType dtype;
  DLDevice device;
  int readonly;
  PyObject *owner;
  PyObject *sync;  // called with the consumer's `stream` before each capsule is made; may be null
};

PyTypeObject ExportType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// The managed tensor's deleter.  Consumers call it from whatever thread
// drops the tensor (a framework's allocator thread, say), with or without
// the GIL, so take the GIL to release the owner.  After interpreter
// finalization there is no GIL to take: the owner is then left alone.
template <typename Managed>
void ReleaseManaged(Managed *managed) {
  if (managed == nullptr) return;
  auto *owner = static_cast<PyObject *>(managed->manager_ctx);
  if (owner != nullptr && Py_IsInitialized()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(owner);
    PyGILState_Release(gil);
  }
  std::free(managed);  // malloc, not PyMem: this may run without the GIL
}

// A capsule's destructor: hands the tensor back only if no consumer took it.
template <typename Managed, const char *kName>
void DestroyCapsule(PyObject *capsule) {
  if (!PyCapsule_IsValid(capsule, kName)) return;  // renamed "used_...": the consumer owns it
  auto *managed = static_cast<Managed *>(PyCapsule_GetPointer(capsule, kName));
  if (managed->deleter != nullptr) managed->deleter(managed);
}

// One malloc block: the managed tensor, then its shape, then its strides
// (compact row-major, always given: DLPack 1.2 consumers may require them).
template <typename Managed>
Managed *NewManaged(ExportObject *self) {
  size_t bytes = sizeof(Managed) + 2 * static_cast<size_t>(self->ndim) * sizeof(int64_t);
  auto *managed = static_cast<Managed *>(std::calloc(1, bytes));
  if (managed == nullptr) {
    PyErr_NoMemory();
    return nullptr;
  }
  auto *shape = reinterpret_cast<int64_t *>(managed + 1);
  int64_t *strides = shape + self->ndim;
  int64_t stride = 1;
  for (int d = self->ndim - 1; d >= 0; d--) {
    shape[d] = self->shape[d];
    strides[d] = stride;
    stride *= self->shape[d] > 1 ? self->shape[d] : 1;  // as NumPy strides empty arrays
  }
  DLTensor &t = managed->dl_tensor;
  t.data = reinterpret_cast<void *>(self->data);
  t.device = self->device;
  t.ndim = self->ndim;
  t.dtype = self->dtype;
  t.shape = self->ndim > 0 ? shape : nullptr;
  t.strides = self->ndim > 0 ? strides : nullptr;
  t.byte_offset = 0;
  Py_INCREF(self->owner);
  managed->manager_ctx = self->owner;
  managed->deleter = ReleaseManaged<Managed>;
  return managed;
}

// ints from a Python sequence of length 2 (max_version, dl_device); false with an error set.
bool IntPair(PyObject *value, const char *what, long long *first, long long *second) {
  PyObject *items = PySequence_Fast(value, what);
  if (items == nullptr) return false;
  bool ok = PySequence_Fast_GET_SIZE(items) == 2;
  if (ok) {
    *first = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(items, 0));
    *second = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(items, 1));
    ok = !PyErr_Occurred();
  } else {
    PyErr_Format(PyExc_TypeError, "%s must be a pair of ints", what);
  }
  Py_DECREF(items);
  return ok;
}

// __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None).
// `stream` goes to the export's `sync` (opforge's Python side for CUDA
// memory: the consumer's stream is made to wait for the producing one, as
// the protocol asks), after the other arguments are found acceptable and
// before the capsule exists, so a refusal there (BufferError) hands nothing
// out.  Without `sync` (host memory) there is nothing to order.
PyObject *Export_dlpack(ExportObject *self, PyObject *args, PyObject *kwds) {
  static const char *keywords[] = {"stream", "max_version", "dl_device", "copy", nullptr};
  PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OOOO:__dlpack__", const_cast<char **>(keywords), &stream,
                                   &max_version, &dl_device, &copy))
    return nullptr;
  if (copy != Py_None) {
    int wanted = PyObject_IsTrue(copy);
    if (wanted < 0) return nullptr;
    if (wanted) {
      PyErr_SetString(PyExc_BufferError, "opforge's DLPack export cannot copy; call __dlpack__ with copy=None or False");
      return nullptr;
    }
  }
  if (dl_device != Py_None) {
    long long type, id;
    if (!IntPair(dl_device, "dl_device", &type, &id)) return nullptr;
    if (type != self->device.device_type || id != self->device.device_id) {
      PyErr_Format(PyExc_BufferError, "the tensor is on device (%d, %d), not (%lld, %lld); opforge exports do not move",
                   self->device.device_type, self->device.device_id, type, id);
      return nullptr;
    }
  }
  bool versioned = false;
  if (max_version != Py_None) {
    long long major, minor;
    if (!IntPair(max_version, "max_version", &major, &minor)) return nullptr;
    versioned = major >= 1;
  }
  if (self->readonly && !versioned) {
    // Only the versioned form can say "read-only"; a legacy consumer would write.
    PyErr_SetString(PyExc_BufferError, "a read-only tensor is exported only as 'dltensor_versioned' "
                    "(pass max_version=(1, 0) or higher)");
    return nullptr;
  }
  if (self->sync != nullptr) {
    PyObject *done = PyObject_CallOneArg(self->sync, stream);
    if (done == nullptr) return nullptr;
    Py_DECREF(done);
  }
  if (versioned) {
    auto *managed = NewManaged<DLManagedTensorVersioned>(self);
    if (managed == nullptr) return nullptr;
    managed->version = DLPackVersion{1, 0};
    managed->flags = self->readonly ? kDLFlagReadOnly : 0;
    PyObject *capsule = PyCapsule_New(managed, kVersionedName, DestroyCapsule<DLManagedTensorVersioned, kVersionedName>);
    if (capsule == nullptr) managed->deleter(managed);
    return capsule;
  }
  auto *managed = NewManaged<DLManagedTensor>(self);
  if (managed == nullptr) return nullptr;
  PyObject *capsule = PyCapsule_New(managed, kLegacyName, DestroyCapsule<DLManagedTensor, kLegacyName>);
  if (capsule == nullptr) managed->deleter(managed);
  return capsule;
}

PyObject *Export_dlpack_device(ExportObject *self, PyObject *) {
  return Py_BuildValue("(ii)", self->device.device_type, self->device.device_id);
}

int Export_traverse(ExportObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->owner);
  Py_VISIT(self->sync);
  return 0;
}

int Export_clear(ExportObject *self) {
  Py_CLEAR(self->owner);
  Py_CLEAR(self->sync);
  return 0;
}

void Export_dealloc(ExportObject *self) {
  PyObject_GC_UnTrack(self);
  Export_clear(self);
  PyMem_Free(self->shape);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

PyObject *Export_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  static const char *keywords[] = {"data",  "shape",    "dtype", "device_type", "device_id",
                                   "owner", "readonly", "sync",  nullptr};
  PyObject *data, *shape, *owner, *sync = Py_None;
  const char *dtype_name;
  int device_type, device_id, readonly = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOsiiO|p$O:DLPackExport", const_cast<char **>(keywords), &data,
                                   &shape, &dtype_name, &device_type, &device_id, &owner, &readonly, &sync))
    return nullptr;
  if (sync != Py_None && !PyCallable_Check(sync)) {
    PyErr_Format(PyExc_TypeError, "DLPackExport: sync must be callable or None, got %s", Py_TYPE(sync)->tp_name);
    return nullptr;
  }
  DLDataType dtype;
  if (!DTypeFromName(dtype_name, &dtype)) {
    PyErr_Format(PyExc_ValueError, "DLPackExport: dtype '%s' is not one of %s", dtype_name, kDTypeList);
    return nullptr;
  }
  if (device_type <= 0 || device_id < 0) {
    PyErr_Format(PyExc_ValueError, "DLPackExport: device (%d, %d) is not a DLPack device", device_type, device_id);
    return nullptr;
  }
  PyObject *index = PyNumber_Index(data);
  if (index == nullptr) return nullptr;
  unsigned long long pointer = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (PyErr_Occurred()) return nullptr;
  PyObject *dims = PySequence_Fast(shape, "DLPackExport: shape must be a sequence of ints");
  if (dims == nullptr) return nullptr;
  auto *self = reinterpret_cast<ExportObject *>(type->tp_alloc(type, 0));
  Py_ssize_t ndim = PySequence_Fast_GET_SIZE(dims);
  if (self != nullptr && ndim > 0) {
    self->shape = static_cast<int64_t *>(PyMem_Malloc(ndim * sizeof(int64_t)));
    if (self->shape == nullptr) PyErr_NoMemory();
  }
  if (self == nullptr || (ndim > 0 && self->shape == nullptr)) {
    Py_XDECREF(self);
    Py_DECREF(dims);
    return nullptr;
  }
  self->ndim = static_cast<int>(ndim);
  for (Py_ssize_t d = 0; d < ndim; d++) {
    long long dim = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dims, d));
    if (dim < 0 && !PyErr_Occurred())
      PyErr_Format(PyExc_ValueError, "DLPackExport: shape has a negative dim %lld", dim);
    if (PyErr_Occurred()) {
      Py_DECREF(dims);
      Py_DECREF(self);
      return nullptr;
    }
    self->shape[d] = dim;
  }
  Py_DECREF(dims);
  self->data = static_cast<uintptr_t>(pointer);
  self->dtype = dtype;
  self->device = DLDevice{device_type, device_id};
  self->readonly = readonly;
  Py_INCREF(owner);
  self->owner = owner;
  if (sync != Py_None) {
    Py_INCREF(sync);
    self->sync = sync;
  }
  return reinterpret_cast<PyObject *>(self);
}

// What the export describes, so callers (a dtype check on a framework's
// from_dlpack result, say) need not consume a capsule to learn it.
PyObject *Export_dtype(ExportObject *self, void *) { return PyUnicode_FromString(DTypeName(self->dtype)); }

PyObject *Export_shape(ExportObject *self, void *) { return IntTuple(self->shape, self->ndim); }

PyObject *Export_device(ExportObject *self, void *) {
  return Py_BuildValue("(ii)", self->device.device_type, self->device.device_id);
}

PyGetSetDef Export_getset[] = {
    {"dtype", reinterpret_cast<getter>(Export_dtype), nullptr, "opforge dtype name", nullptr},
    {"shape", reinterpret_cast<getter>(Export_shape), nullptr, "tuple of ints", nullptr},
    {"device", reinterpret_cast<getter>(Export_device), nullptr, "(device_type, device_id)", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMethodDef Export_methods[] = {
    {"__dlpack__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Export_dlpack)),
     METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None) -> capsule "
     "('dltensor_versioned' when max_version >= (1, 0), else 'dltensor'); stream goes to the export's sync"},
    {"__dlpack_device__", reinterpret_cast<PyCFunction>(Export_dlpack_device), METH_NOARGS,
     "__dlpack_device__() -> (device_type, device_id)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PyObject *ViewCapsule(PyObject *capsule) {
  PyObject *args = PyTuple_Pack(1, capsule);
  if (args == nullptr) return nullptr;
  PyObject *view = View_new(&ViewType, args, nullptr);
  Py_DECREF(args);
  return view;
}

const DLTensor *ViewedTensor(PyObject *view, const char **dtype, bool *c_contiguous) {
  if (Py_TYPE(view) != &ViewType) return nullptr;
  auto *self = reinterpret_cast<ViewObject *>(view);
  *dtype = self->dtype;
  *c_contiguous = CContiguous(*self->tensor);
  return self->tensor;
}

bool AddDLPackTypes(PyObject *module) {
  ViewType.tp_name = "opforge._native.DLTensorView";
  ViewType.tp_basicsize = sizeof(ViewObject);
  ViewType.tp_flags = Py_TPFLAGS_DEFAULT;
  ViewType.tp_doc =
      "DLTensorView(capsule): consumes a DLPack capsule and reads its tensor; the producer's deleter runs "
      "when the view is dropped";
  ViewType.tp_new = View_new;
  ViewType.tp_dealloc = reinterpret_cast<destructor>(View_dealloc);
  ViewType.tp_repr = reinterpret_cast<reprfunc>(View_repr);
  ViewType.tp_getset = View_getset;

  ExportType.tp_name = "opforge._native.DLPackExport";
  ExportType.tp_basicsize = sizeof(ExportObject);
  ExportType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  ExportType.tp_doc =
      "DLPackExport(data, shape, dtype, device_type, device_id, owner, readonly=False, *, sync=None): a "
      "C-contiguous tensor at `data` for any from_dlpack; each capsule keeps `owner` (what owns the memory) "
      "alive until its consumer is done.  `sync(stream)` is called by __dlpack__ with the consumer's stream "
      "argument (None when not given) before a capsule is made; what it raises goes to the consumer.  "
      "device_type 2 with a host pointer fakes a CUDA array for tests.";
  ExportType.tp_new = Export_new;
  ExportType.tp_dealloc = reinterpret_cast<destructor>(Export_dealloc);
  ExportType.tp_traverse = reinterpret_cast<traverseproc>(Export_traverse);
  ExportType.tp_clear = reinterpret_cast<inquiry>(Export_clear);
  ExportType.tp_methods = Export_methods;
  ExportType.tp_getset = Export_getset;

  if (PyType_Ready(&ViewType) < 0 || PyType_Ready(&ExportType) < 0) return false;
  Py_INCREF(&ViewType);
  if (PyModule_AddObject(module, "DLTensorView", reinterpret_cast<PyObject *>(&ViewType)) < 0) {
    Py_DECREF(&ViewType);
    return false;
  }
  Py_INCREF(&ExportType);
  if (PyModule_AddObject(module, "DLPackExport", reinterpret_cast<PyObject *>(&ExportType)) < 0) {
    Py_DECREF(&ExportType);
    return false;
  }
  return true;
}

}  // namespace opforge_native
