// opforge._native: the C side of a kernel call.
//
// * Extra     -- owns one AotExtra (attributes, workspace sizes, kernel data)
//                of the string ABI the kernel library was built with.
// * call_init / call_infer / call_kernel -- call a kernel library's entry
//                points inside try/catch, so no C++ exception reaches Python.
// * Launcher  -- the eager fast path: checks NumPy inputs against a small
//                cache of per-signature plans, allocates outputs and
//                workspace, calls the kernel.  Anything unusual (a new
//                signature, a non-contiguous input, an error) goes back to
//                the Python planner, which owns the rules.
// * Program   -- a planned graph: every kernel call in C.
// Outputs and workspaces come from buffers.cc: canaries after each by
// default, guard pages and poison in checked mode.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL opforge_ARRAY_API
#include <numpy/arrayobject.h>
#include <structmember.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "../include/custom_aot_extra.h"
#include "buffers.h"
#include "device.h"
#include "dlpack.h"
#include "extra_state.h"

static_assert(sizeof(npy_intp) == sizeof(int64_t), "opforge needs a 64-bit npy_intp");

opforge_native::AttrErrorSlot &opforge_native::ThreadAttrError() {
  thread_local AttrErrorSlot slot;
  return slot;
}

// For kernel callers outside this extension (opforge.torch's C++ path): clears the
// calling thread's attribute-error slot and returns whether an error was recorded,
// so a kernel that swallowed Attr<T>'s exception is still caught.
extern "C" __attribute__((visibility("default"))) int opforge_take_attr_error() {
  auto &slot = opforge_native::ThreadAttrError();
  const int recorded = slot.kind == opforge_native::kAttrError;
  slot.kind = opforge_native::kNoError;
  return recorded;
}

namespace {

using opforge_native::AttrKind;
using opforge_native::CanaryIntact;
using opforge_native::GuardedBuffer;
using opforge_native::kCanaryBytes;
using opforge_native::kWorkspaceAlign;
using opforge_native::WriteCanary;
using opforge_native::ExtraState;
using opforge_native::NeutralAttr;

using KernelFn = int (*)(int, void **, int *, int64_t **, const char **, void *, void *);
using InitFn = int (*)(int *, int64_t **, const char **, AotExtra *);
using InferFn = std::vector<int64_t> (*)(int *, int64_t **, AotExtra *);
using InferMultiFn = std::vector<std::vector<int64_t>> (*)(int *, int64_t **, AotExtra *);

// ---------------------------------------------------------------- Extra ----

struct ExtraObject {
  PyObject_HEAD
  ExtraState *state;
  AotExtra *extra;
  int cxx11_abi;
};

bool ParseNumberList(PyObject *seq, std::vector<int64_t> *ints, std::vector<double> *reals, bool *all_int) {
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject **items = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject *item = items[k];
    if (PyBool_Check(item)) return false;
    if (PyLong_Check(item)) {
      long long v = PyLong_AsLongLong(item);
      if (v == -1 && PyErr_Occurred()) return false;
      ints->push_back(v);
      reals->push_back(static_cast<double>(v));
    } else if (PyFloat_Check(item)) {
      *all_int = false;
      ints->push_back(0);
      reals->push_back(PyFloat_AS_DOUBLE(item));
    } else {
      return false;
    }
  }
  return true;
}

// Converts one Python attribute value (bool, int, float, str, or a list or
// list of lists of numbers -- already normalised by opforge.attrs) into C++.
bool ParseAttr(PyObject *name, PyObject *value, NeutralAttr *out) {
  Py_ssize_t len;
  const char *utf8 = PyUnicode_AsUTF8AndSize(name, &len);
  if (utf8 == nullptr) return false;
  out->name.assign(utf8, utf8 + len + 1);
  if (PyBool_Check(value)) {
    out->kind = AttrKind::kBool;
    out->b = value == Py_True;
    return true;
  }
  if (PyLong_Check(value)) {
    out->kind = AttrKind::kInt;
    out->i = PyLong_AsLongLong(value);
    return !(out->i == -1 && PyErr_Occurred());
  }
  if (PyFloat_Check(value)) {
    out->kind = AttrKind::kFloat;
    out->f = PyFloat_AS_DOUBLE(value);
    return true;
  }
  if (PyUnicode_Check(value)) {
    const char *text = PyUnicode_AsUTF8AndSize(value, &len);
    if (text == nullptr) return false;
    out->kind = AttrKind::kStr;
    out->text.assign(text, text + len + 1);
    return true;
  }
  if (PyList_Check(value) || PyTuple_Check(value)) {
    PyObject *seq = PySequence_Fast(value, "attribute list");
    if (seq == nullptr) return false;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    bool ok = true, all_int = true;
    if (n == 0) {
      out->kind = AttrKind::kEmptyList;
    } else if (PyList_Check(PySequence_Fast_GET_ITEM(seq, 0)) || PyTuple_Check(PySequence_Fast_GET_ITEM(seq, 0))) {
      for (Py_ssize_t r = 0; ok && r < n; ++r) {
        PyObject *row = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, r), "attribute row");
        if (row == nullptr) { ok = false; break; }
        out->ints.emplace_back();
        out->reals.emplace_back();
        ok = ParseNumberList(row, &out->ints.back(), &out->reals.back(), &all_int);
        Py_DECREF(row);
      }
      out->kind = all_int ? AttrKind::kInt2D : AttrKind::kFloat2D;
    } else {
      out->ints.emplace_back();
      out->reals.emplace_back();
      ok = ParseNumberList(seq, &out->ints.back(), &out->reals.back(), &all_int);
      out->kind = all_int ? AttrKind::kIntList : AttrKind::kFloatList;
    }
    Py_DECREF(seq);
    if (!ok && !PyErr_Occurred())
      PyErr_Format(PyExc_TypeError, "attribute '%s': lists may hold only numbers or lists of numbers", out->name.data());
    return ok;
  }
  PyErr_Format(PyExc_TypeError, "attribute '%s': unsupported value of type %s", out->name.data(),
               Py_TYPE(value)->tp_name);
  return false;
}

int Extra_init(ExtraObject *self, PyObject *args, PyObject *kwds) {
  static const char *kwlist[] = {"op_name", "attrs", "cxx11_abi", nullptr};
  const char *op_name;
  PyObject *attrs;
  int cxx11_abi = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "sO!|p", const_cast<char **>(kwlist), &op_name, &PyDict_Type, &attrs,
                                   &cxx11_abi))
    return -1;
  if (self->extra != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Extra is already initialised");
    return -1;
  }
  auto *state = new ExtraState();
  state->op_name.assign(op_name, op_name + std::strlen(op_name) + 1);
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(attrs, &pos, &key, &value)) {
    state->attrs.emplace_back();
    if (!PyUnicode_Check(key) || !ParseAttr(key, value, &state->attrs.back())) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "attribute names must be str");
      delete state;
      return -1;
    }
  }
  self->state = state;
  self->cxx11_abi = cxx11_abi;
  self->extra = cxx11_abi ? opforge_native::NewExtraAbi1(state) : opforge_native::NewExtraAbi0(state);
  return 0;
}

void Extra_dealloc(ExtraObject *self) {
  if (self->extra != nullptr) {
    // Kernel data set by the kernel's Init is ours: delete it exactly once.
    // Its destructor is user code, so keep any exception on this side.
    try {
      self->extra->DestructKernelData();
    } catch (...) {
    }
    delete self->extra;
  }
  delete self->state;
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

PyObject *Extra_address(ExtraObject *self, void *) {
  if (self->extra == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Extra was not initialised");
    return nullptr;
  } return PyLong_FromVoidPtr(self->extra); }

PyObject *Extra_workspace(ExtraObject *self, void *) {
  if (self->extra == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Extra was not initialised");
    return nullptr;
  }
  const std::vector<size_t> &sizes = self->extra->WorkSpace();
  PyObject *list = PyList_New(static_cast<Py_ssize_t>(sizes.size()));
  if (list == nullptr) return nullptr;
  for (size_t k = 0; k < sizes.size(); ++k) PyList_SET_ITEM(list, k, PyLong_FromSize_t(sizes[k]));
  return list;
}

PyObject *Extra_has_kernel_data(ExtraObject *self, void *) {
  if (self->extra == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Extra was not initialised");
    return nullptr;
  } return PyBool_FromLong(self->extra->KernelData() != nullptr); }

PyObject *Extra_cxx11_abi(ExtraObject *self, void *) { return PyBool_FromLong(self->cxx11_abi); }

PyGetSetDef Extra_getset[] = {
    {"address", reinterpret_cast<getter>(Extra_address), nullptr, "the AotExtra* passed to kernels", nullptr},
    {"workspace", reinterpret_cast<getter>(Extra_workspace), nullptr, "workspace sizes set by Init, in bytes", nullptr},
    {"has_kernel_data", reinterpret_cast<getter>(Extra_has_kernel_data), nullptr, "whether Init set kernel data",
     nullptr},
    {"cxx11_abi", reinterpret_cast<getter>(Extra_cxx11_abi), nullptr, "string ABI of this AotExtra", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject ExtraType = {PyVarObject_HEAD_INIT(nullptr, 0)};

ExtraObject *AsExtra(PyObject *obj) {
  if (obj == Py_None) return nullptr;
  if (!PyObject_TypeCheck(obj, &ExtraType) || reinterpret_cast<ExtraObject *>(obj)->extra == nullptr) {
    PyErr_SetString(PyExc_TypeError, "expected an opforge._native.Extra or None");
    return nullptr;
  }
  return reinterpret_cast<ExtraObject *>(obj);
}

// ------------------------------------------------- calling entry points ----

// Result of a guarded call: either fine, or an error (kind, message) that the
// Python side turns into a typed opforge error.
struct Outcome {
  const char *kind = nullptr;  // nullptr, "attr" or "exception"
  char message[600] = {0};
};

void RecordException(Outcome *outcome, const char *what) {
  const opforge_native::AttrErrorSlot &slot = opforge_native::ThreadAttrError();
  if (slot.kind == opforge_native::kAttrError) {
    outcome->kind = "attr";
    std::snprintf(outcome->message, sizeof(outcome->message), "%s", slot.message);
  } else {
    outcome->kind = "exception";
    std::snprintf(outcome->message, sizeof(outcome->message), "%s", what);
  }
}

// Attribute errors are recorded as well as thrown, so a kernel that swallows
// the exception still fails loudly.
void CheckSwallowed(Outcome *outcome) {
  const opforge_native::AttrErrorSlot &slot = opforge_native::ThreadAttrError();
  if (outcome->kind == nullptr && slot.kind == opforge_native::kAttrError) {
    outcome->kind = "attr";
    std::snprintf(outcome->message, sizeof(outcome->message), "%s", slot.message);
  }
}

template <typename Call>
void Guarded(Outcome *outcome, ExtraState *, Call call) {
  opforge_native::ThreadAttrError().kind = opforge_native::kNoError;
  try {
    call();
  } catch (const std::exception &e) {
    RecordException(outcome, e.what());
  } catch (...) {
    RecordException(outcome, "unknown C++ exception");
  }
  CheckSwallowed(outcome);
}

PyObject *OutcomeError(const Outcome &outcome) {
  if (outcome.kind == nullptr) Py_RETURN_NONE;
  return Py_BuildValue("(ss)", outcome.kind, outcome.message);
}

// Shapes and dtype names of a list of tensors, kept alive for one call.
struct TensorDescs {
  std::vector<std::vector<int64_t>> dims;
  std::vector<int> ndims;
  std::vector<int64_t *> shapes;
  std::vector<const char *> dtypes;
  PyObject *dtype_seq = nullptr;

  ~TensorDescs() { Py_XDECREF(dtype_seq); }

  bool Load(PyObject *shape_list, PyObject *dtype_list) {
    PyObject *seq = PySequence_Fast(shape_list, "shapes must be a sequence");
    if (seq == nullptr) return false;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    dims.resize(n);
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject *shape = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, k), "each shape must be a sequence");
      if (shape == nullptr) { Py_DECREF(seq); return false; }
      Py_ssize_t rank = PySequence_Fast_GET_SIZE(shape);
      dims[k].resize(rank + 1);  // +1 keeps data() valid for rank 0
      for (Py_ssize_t d = 0; d < rank; ++d) dims[k][d] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(shape, d));
      Py_DECREF(shape);
      if (PyErr_Occurred()) { Py_DECREF(seq); return false; }
      ndims.push_back(static_cast<int>(rank));
      shapes.push_back(dims[k].data());
    }
    Py_DECREF(seq);
    if (dtype_list == nullptr) return true;
    dtype_seq = PySequence_Fast(dtype_list, "dtypes must be a sequence");
    if (dtype_seq == nullptr) return false;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(dtype_seq); ++k) {
      const char *name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(dtype_seq, k));
      if (name == nullptr) return false;
      dtypes.push_back(name);
    }
    return true;
  }
};

void *AsFunction(PyObject *address) {
  void *fn = PyLong_AsVoidPtr(address);
  if (fn == nullptr && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null function address");
  return fn;
}

// call_init(fn, extra, shapes, dtypes) -> (rc, error)
PyObject *CallInit(PyObject *, PyObject *args) {
  PyObject *address, *extra_obj, *shape_list, *dtype_list;
  if (!PyArg_ParseTuple(args, "OOOO", &address, &extra_obj, &shape_list, &dtype_list)) return nullptr;
  auto fn = reinterpret_cast<InitFn>(AsFunction(address));
  ExtraObject *extra = AsExtra(extra_obj);
  TensorDescs descs;
  if (fn == nullptr || extra == nullptr || !descs.Load(shape_list, dtype_list)) return nullptr;
  int rc = 0;
  Outcome outcome;
  Guarded(&outcome, extra->state, [&] { rc = fn(descs.ndims.data(), descs.shapes.data(), descs.dtypes.data(), extra->extra); });
  PyObject *error = OutcomeError(outcome);
  return Py_BuildValue("(iN)", rc, error);
}

PyObject *ShapeToList(const std::vector<int64_t> &shape) {
  PyObject *list = PyList_New(static_cast<Py_ssize_t>(shape.size()));
  if (list == nullptr) return nullptr;
  for (size_t d = 0; d < shape.size(); ++d) PyList_SET_ITEM(list, d, PyLong_FromLongLong(shape[d]));
  return list;
}

// call_infer(fn, extra, shapes, several) -> (shape list or list of shape lists, error)
PyObject *CallInfer(PyObject *, PyObject *args) {
  PyObject *address, *extra_obj, *shape_list;
  int several = 0;
  if (!PyArg_ParseTuple(args, "OOOp", &address, &extra_obj, &shape_list, &several)) return nullptr;
  void *fn = AsFunction(address);
  ExtraObject *extra = AsExtra(extra_obj);
  TensorDescs descs;
  if (fn == nullptr || extra == nullptr || !descs.Load(shape_list, nullptr)) return nullptr;
  std::vector<std::vector<int64_t>> result;
  Outcome outcome;
  Guarded(&outcome, extra->state, [&] {
    if (several) {
      result = reinterpret_cast<InferMultiFn>(fn)(descs.ndims.data(), descs.shapes.data(), extra->extra);
    } else {
      result.push_back(reinterpret_cast<InferFn>(fn)(descs.ndims.data(), descs.shapes.data(), extra->extra));
    }
  });
  if (outcome.kind != nullptr) return Py_BuildValue("(ON)", Py_None, OutcomeError(outcome));
  PyObject *shapes = PyList_New(static_cast<Py_ssize_t>(result.size()));
  if (shapes == nullptr) return nullptr;
  for (size_t k = 0; k < result.size(); ++k) {
    PyObject *shape = ShapeToList(result[k]);
    if (shape == nullptr) { Py_DECREF(shapes); return nullptr; }
    PyList_SET_ITEM(shapes, k, shape);
  }
  return Py_BuildValue("(NO)", shapes, Py_None);
}

// call_kernel(fn, pointers, shapes, dtypes, stream, extra) -> (rc, error)
// pointers: inputs, outputs then workspaces; shapes/dtypes: inputs and outputs.
PyObject *CallKernel(PyObject *, PyObject *args) {
  PyObject *address, *pointer_list, *shape_list, *dtype_list, *stream_obj, *extra_obj;
  if (!PyArg_ParseTuple(args, "OOOOOO", &address, &pointer_list, &shape_list, &dtype_list, &stream_obj, &extra_obj))
    return nullptr;
  auto fn = reinterpret_cast<KernelFn>(AsFunction(address));
  if (fn == nullptr) return nullptr;
  ExtraObject *extra = nullptr;
  if (extra_obj != Py_None && (extra = AsExtra(extra_obj)) == nullptr) return nullptr;
  void *stream = stream_obj == Py_None ? nullptr : PyLong_AsVoidPtr(stream_obj);
  if (PyErr_Occurred()) return nullptr;
  TensorDescs descs;
  if (!descs.Load(shape_list, dtype_list)) return nullptr;
  PyObject *seq = PySequence_Fast(pointer_list, "pointers must be a sequence");
  if (seq == nullptr) return nullptr;
  std::vector<void *> params(PySequence_Fast_GET_SIZE(seq));
  for (size_t k = 0; k < params.size(); ++k) params[k] = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(seq, k));
  Py_DECREF(seq);
  if (PyErr_Occurred()) return nullptr;
  int rc = 0;
  Outcome outcome;
  ExtraState *state = extra ? extra->state : nullptr;
  void *extra_ptr = extra ? extra->extra : nullptr;
  Py_BEGIN_ALLOW_THREADS
  Guarded(&outcome, state, [&] {
    rc = fn(static_cast<int>(params.size()), params.data(), descs.ndims.data(), descs.shapes.data(),
            descs.dtypes.data(), stream, extra_ptr);
  });
  Py_END_ALLOW_THREADS
  return Py_BuildValue("(iN)", rc, OutcomeError(outcome));
}

// ------------------------------------------------------------- Launcher ----

constexpr int kMaxPlans = 8;
constexpr int kStackTensors = 16;

struct Plan {
  KernelFn fn = nullptr;           // nullptr: the planner runs this signature itself
  std::vector<int64_t> signature;  // per input: type_num, ndim, dims... (-1, 0 for an absent one)
  int n_present = 0;               // the inputs the kernel gets: those not absent
  PyObject *spec = nullptr;        // the planner's tuple; keeps everything below alive
  std::vector<PyArray_Descr *> out_descrs;
  std::vector<std::vector<npy_intp>> out_dims;
  std::vector<size_t> workspace;   // byte sizes
  std::vector<size_t> workspace_at;  // offsets in one block (LayoutWorkspace: aligned, a canary after each)
  size_t workspace_total = 0;
  std::vector<const char *> dtype_names;  // inputs then outputs
  ExtraObject *extra = nullptr;
  void *buffer = nullptr;          // reused workspace, when no other call holds it
  bool buffer_busy = false;
  int users = 0;                   // calls in flight (the GIL is released during a kernel)
  bool evicted = false;

  ~Plan() {
    Py_XDECREF(spec);
    std::free(buffer);
  }
};

// A plan leaves the cache when evicted, but is deleted only when no call uses it.
void ReleasePlan(Plan *plan) {
  plan->evicted = true;
  if (plan->users == 0) delete plan;
}

struct LauncherObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;  // Launcher_vectorcall: a call builds no argument tuple
  int n_inputs;
  int n_outputs;
  int tuple_output;
  PyObject *planner;
  PyObject *device_routes;  // a DeviceRoutes (calls on GPU arrays it remembers), or nullptr
  Plan *plans[kMaxPlans];
  int n_plans;
  int next_victim;
  long long plan_misses;
};

// An absent optional input: None in the call, passed to no kernel (those for such calls take the others).
bool IsAbsent(const PyArrayObject *a) { return reinterpret_cast<const PyObject *>(a) == Py_None; }

bool SignatureMatches(const std::vector<int64_t> &sig, PyArrayObject **arrays, int n) {
  size_t pos = 0;
  for (int k = 0; k < n; ++k) {
    if (IsAbsent(arrays[k])) {  // (no type_num is -1)
      if (pos + 2 > sig.size() || sig[pos] != -1) return false;
      pos += 2;
      continue;
    }
    int ndim = PyArray_NDIM(arrays[k]);
    if (pos + 2 + ndim > sig.size()) return false;
    if (sig[pos] != PyArray_DESCR(arrays[k])->type_num || sig[pos + 1] != ndim) return false;
    if (ndim && std::memcmp(&sig[pos + 2], PyArray_DIMS(arrays[k]), ndim * sizeof(int64_t)) != 0) return false;
    pos += 2 + ndim;
  }
  return pos == sig.size();
}

void MakeSignature(std::vector<int64_t> *sig, PyArrayObject **arrays, int n) {
  sig->clear();
  for (int k = 0; k < n; ++k) {
    if (IsAbsent(arrays[k])) {
      sig->push_back(-1);
      sig->push_back(0);
      continue;
    }
    sig->push_back(PyArray_DESCR(arrays[k])->type_num);
    sig->push_back(PyArray_NDIM(arrays[k]));
    for (int d = 0; d < PyArray_NDIM(arrays[k]); ++d) sig->push_back(PyArray_DIM(arrays[k], d));
  }
}

// Reads the planner's answer: None (the planner runs such calls itself) or
// (function, out_shapes, out_dtypes, workspace_sizes, dtype_names, extra).
bool FillPlan(Plan *plan, PyObject *spec, int n_inputs, int n_outputs) {
  if (spec == Py_None) {
    Py_INCREF(spec);
    plan->spec = spec;
    return true;
  }
  PyObject *address, *out_shapes, *out_dtypes, *workspace, *names, *extra_obj;
  if (!PyArg_ParseTuple(spec, "OOOOOO", &address, &out_shapes, &out_dtypes, &workspace, &names, &extra_obj))
    return false;
  plan->fn = reinterpret_cast<KernelFn>(AsFunction(address));
  if (plan->fn == nullptr) return false;
  if (PyTuple_Size(out_shapes) != n_outputs || PyTuple_Size(out_dtypes) != n_outputs ||
      PyTuple_Size(names) != n_inputs + n_outputs) {
    PyErr_SetString(PyExc_ValueError, "planner returned a plan of the wrong size");
    return false;
  }
  plan->out_descrs.clear();
  plan->out_dims.clear();
  for (int k = 0; k < n_outputs; ++k) {
    PyObject *descr = PyTuple_GET_ITEM(out_dtypes, k);
    if (!PyArray_DescrCheck(descr)) {
      PyErr_SetString(PyExc_TypeError, "planner returned a dtype that is not a numpy.dtype");
      return false;
    }
    plan->out_descrs.push_back(reinterpret_cast<PyArray_Descr *>(descr));
    PyObject *shape = PyTuple_GET_ITEM(out_shapes, k);
    plan->out_dims.emplace_back(PyTuple_Size(shape));
    for (size_t d = 0; d < plan->out_dims.back().size(); ++d) plan->out_dims.back()[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
  }
  plan->workspace.clear();
  for (Py_ssize_t k = 0; k < PyTuple_Size(workspace); ++k) {
    plan->workspace.push_back(PyLong_AsSize_t(PyTuple_GET_ITEM(workspace, k)));
    if (PyErr_Occurred()) return false;
  }
  // The planner refuses impossible sizes with a typed error; as a backstop,
  // sizes whose total overflows make every call report an allocation failure.
  if (!opforge_native::LayoutWorkspace(plan->workspace, &plan->workspace_at, &plan->workspace_total))
    plan->workspace_total = SIZE_MAX;
  plan->dtype_names.clear();
  for (int k = 0; k < n_inputs + n_outputs; ++k) plan->dtype_names.push_back(PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, k)));
  if (PyErr_Occurred()) return false;
  plan->extra = extra_obj == Py_None ? nullptr : AsExtra(extra_obj);
  if (extra_obj != Py_None && plan->extra == nullptr) return false;
  Py_INCREF(spec);
  plan->spec = spec;
  return true;
}

// planner.<method>(argument), passing a tuple argument as one object.
PyObject *CallPlanner(LauncherObject *self, const char *method, PyObject *argument) {
  PyObject *name = PyUnicode_InternFromString(method);
  if (name == nullptr) return nullptr;
  PyObject *result = PyObject_CallMethodObjArgs(self->planner, name, argument, nullptr);
  Py_DECREF(name);
  return result;
}

// The plan of these arrays' signature, made by the planner on a miss: array_tuple() gives the arrays as
// a tuple (a borrowed reference, nullptr with an error set).
template <typename MakeTuple>
Plan *FindOrMakePlan(LauncherObject *self, PyArrayObject **arrays, MakeTuple array_tuple) {
  for (int p = 0; p < self->n_plans; ++p)
    if (SignatureMatches(self->plans[p]->signature, arrays, self->n_inputs)) return self->plans[p];
  self->plan_misses++;
  PyObject *tuple = array_tuple();
  if (tuple == nullptr) return nullptr;
  PyObject *spec = CallPlanner(self, "plan", tuple);
  if (spec == nullptr) return nullptr;
  auto *plan = new Plan();
  for (int k = 0; k < self->n_inputs; ++k) plan->n_present += !IsAbsent(arrays[k]);
  bool ok = FillPlan(plan, spec, plan->n_present, self->n_outputs);
  Py_DECREF(spec);
  if (!ok) {
    delete plan;
    return nullptr;
  }
  MakeSignature(&plan->signature, arrays, self->n_inputs);
  if (self->n_plans < kMaxPlans) {
    self->plans[self->n_plans++] = plan;
  } else {
    ReleasePlan(self->plans[self->next_victim]);
    self->plans[self->next_victim] = plan;
    self->next_victim = (self->next_victim + 1) % kMaxPlans;
  }
  return plan;
}

// A new tuple of the first n arrays.
PyObject *ArrayTuple(PyArrayObject *const *arrays, int n) {
  PyObject *tuple = PyTuple_New(n);
  if (tuple == nullptr) return nullptr;
  for (int k = 0; k < n; ++k) {
    Py_INCREF(arrays[k]);
    PyTuple_SET_ITEM(tuple, k, reinterpret_cast<PyObject *>(arrays[k]));
  }
  return tuple;
}

bool IsPlainArray(PyObject *obj) {
  if (!PyArray_CheckExact(obj)) return false;
  auto *a = reinterpret_cast<PyArrayObject *>(obj);
  return PyArray_IS_C_CONTIGUOUS(a) && PyArray_ISALIGNED(a) && PyArray_ISNOTSWAPPED(a);
}

// Memory problems travel as Outcomes too; the Python side names the buffer.
// Buffers are counted outputs first, then workspaces:
//   ("overrun", "k")       the canary after buffer k was damaged
//   ("guard", "k write")   checked mode stopped an access ("write"/"read") past the end of buffer k
//   ("alloc", "k b1 b2..") buffer k (-1: the plan's workspace block) of these sizes could not be allocated
void MemoryOutcome(Outcome *outcome, const char *kind, const char *detail) {
  outcome->kind = kind;
  std::snprintf(outcome->message, sizeof(outcome->message), "%s", detail);
}

void AllocOutcome(Outcome *outcome, int buffer, const std::vector<size_t> &sizes) {
  int used = std::snprintf(outcome->message, sizeof(outcome->message), "%d", buffer);
  for (size_t size : sizes) {
    if (used < 0 || used >= static_cast<int>(sizeof(outcome->message)) - 24) break;
    used += std::snprintf(outcome->message + used, sizeof(outcome->message) - used, " %zu", size);
  }
  outcome->kind = "alloc";
}

// One kernel call of a plan.  arrays[0, n_inputs) are the inputs; on success
// arrays[n_inputs, n_inputs + n_outputs) receive new output arrays (new
// references).  poison < 0: default mode (canaries), else checked mode with
// that poison byte.  A failed kernel or a memory problem comes back in *rc and
// *outcome, with no outputs; false means a Python error is set.
bool RunPlan(Plan *plan, PyArrayObject **arrays, int n_inputs, int n_outputs, int poison, int *rc,
             Outcome *outcome) {
  const int n_tensors = n_inputs + n_outputs;
  const int n_work = static_cast<int>(plan->workspace.size());
  const int n_params = n_tensors + n_work;
  void *stack_params[kStackTensors * 2];
  size_t stack_bytes[kStackTensors * 2];
  int stack_ndims[kStackTensors];
  int64_t *stack_shapes[kStackTensors];
  std::vector<void *> heap_params;
  std::vector<size_t> heap_bytes;
  std::vector<int> heap_ndims;
  std::vector<int64_t *> heap_shapes;
  void **params = stack_params;
  size_t *bytes = stack_bytes;  // per output and workspace, from params[n_inputs]
  int *ndims = stack_ndims;
  int64_t **shapes = stack_shapes;
  if (n_params > kStackTensors * 2 || n_tensors > kStackTensors) {
    heap_params.resize(n_params);
    heap_bytes.resize(n_params);
    heap_ndims.resize(n_tensors);
    heap_shapes.resize(n_tensors);
    params = heap_params.data();
    bytes = heap_bytes.data();
    ndims = heap_ndims.data();
    shapes = heap_shapes.data();
  }
  static int64_t scalar_shape[1] = {0};
  for (int k = 0; k < n_inputs; ++k) {
    params[k] = PyArray_DATA(arrays[k]);
    ndims[k] = PyArray_NDIM(arrays[k]);
    shapes[k] = ndims[k] ? reinterpret_cast<int64_t *>(PyArray_DIMS(arrays[k])) : scalar_shape;
  }
  for (int k = 0; k < n_outputs; ++k) {
    ndims[n_inputs + k] = static_cast<int>(plan->out_dims[k].size());
    shapes[n_inputs + k] = ndims[n_inputs + k] ? plan->out_dims[k].data() : scalar_shape;
    arrays[n_inputs + k] = nullptr;
  }
  ExtraState *state = plan->extra ? plan->extra->state : nullptr;
  void *extra_ptr = plan->extra ? plan->extra->extra : nullptr;
  const char **dtypes = plan->dtype_names.data();
  KernelFn fn = plan->fn;
  auto call = [&] { *rc = fn(n_params, params, ndims, shapes, dtypes, nullptr, extra_ptr); };
  bool ok = true;

  if (poison < 0) {
    for (int k = 0; k < n_outputs && outcome->kind == nullptr; ++k) {
      Py_INCREF(plan->out_descrs[k]);
      PyObject *out = opforge_native::NewCanaryArray(reinterpret_cast<PyObject *>(plan->out_descrs[k]),
                                                      ndims[n_inputs + k], shapes[n_inputs + k], &bytes[k]);
      if (out == nullptr) {
        if (PyErr_Occurred()) ok = false;
        else AllocOutcome(outcome, k, {bytes[k]});
        break;
      }
      arrays[n_inputs + k] = reinterpret_cast<PyArrayObject *>(out);
      params[n_inputs + k] = PyArray_DATA(arrays[n_inputs + k]);
    }
    // Workspace: the plan's own block, or a private one if another thread holds it.
    char *workspace = nullptr;
    bool own_block = false;
    if (ok && outcome->kind == nullptr && plan->workspace_total == SIZE_MAX) {
      AllocOutcome(outcome, -1, plan->workspace);
    } else if (ok && outcome->kind == nullptr && plan->workspace_total) {
      if (!plan->buffer_busy) {
        if (plan->buffer == nullptr) plan->buffer = std::aligned_alloc(kWorkspaceAlign, plan->workspace_total);
        workspace = static_cast<char *>(plan->buffer);
        plan->buffer_busy = workspace != nullptr;
      } else {
        workspace = static_cast<char *>(std::aligned_alloc(kWorkspaceAlign, plan->workspace_total));
        own_block = true;
      }
      if (workspace == nullptr) AllocOutcome(outcome, -1, plan->workspace);
      for (int w = 0; workspace != nullptr && w < n_work; ++w) {
        params[n_tensors + w] = workspace + plan->workspace_at[w];
        bytes[n_outputs + w] = plan->workspace[w];
        WriteCanary(workspace + plan->workspace_at[w] + plan->workspace[w]);
      }
    }
    if (ok && outcome->kind == nullptr) {
      Py_BEGIN_ALLOW_THREADS
      Guarded(outcome, state, call);
      Py_END_ALLOW_THREADS
      for (int b = 0; b < n_outputs + n_work; ++b) {
        if (!CanaryIntact(static_cast<char *>(params[n_inputs + b]) + bytes[b])) {
          char detail[16];
          std::snprintf(detail, sizeof(detail), "%d", b);
          MemoryOutcome(outcome, "overrun", detail);
          break;
        }
      }
    }
    if (own_block) std::free(workspace);
    else if (workspace != nullptr) plan->buffer_busy = false;
  } else {
    std::vector<GuardedBuffer> guarded(n_outputs + n_work);
    for (int b = 0; b < n_outputs + n_work && outcome->kind == nullptr; ++b) {
      size_t size = SIZE_MAX;
      if (b >= n_outputs) size = plan->workspace[b - n_outputs];
      else if (!opforge_native::ArrayBytes(reinterpret_cast<PyObject *>(plan->out_descrs[b]), ndims[n_inputs + b],
                                           shapes[n_inputs + b], &size)) size = SIZE_MAX;
      if (size == SIZE_MAX || !opforge_native::MapGuarded(size, poison, &guarded[b])) {
        AllocOutcome(outcome, b, {size});
        break;
      }
      params[n_inputs + b] = guarded[b].data;
    }
    if (outcome->kind == nullptr) {
      opforge_native::ArmFaultHandler();
      opforge_native::Fault fault;
      Py_BEGIN_ALLOW_THREADS
      fault = opforge_native::CallGuarded(guarded.data(), n_outputs + n_work, [&] { Guarded(outcome, state, call); });
      Py_END_ALLOW_THREADS
      if (fault.buffer >= 0) {
        char detail[32];
        std::snprintf(detail, sizeof(detail), "%d %s", fault.buffer, fault.write ? "write" : "read");
        MemoryOutcome(outcome, "guard", detail);
      }
    }
    // The caller gets ordinary arrays: the guarded mappings go away now.
    for (int k = 0; k < n_outputs && outcome->kind == nullptr && *rc == 0; ++k) {
      Py_INCREF(plan->out_descrs[k]);
      PyObject *out = PyArray_Empty(ndims[n_inputs + k], shapes[n_inputs + k], plan->out_descrs[k], 0);
      if (out == nullptr) {
        ok = false;
        break;
      }
      arrays[n_inputs + k] = reinterpret_cast<PyArrayObject *>(out);
      std::memcpy(PyArray_DATA(arrays[n_inputs + k]), guarded[k].data, guarded[k].nbytes);
    }
    for (GuardedBuffer &buffer : guarded) opforge_native::UnmapGuarded(&buffer);
  }
  if (!ok || *rc != 0 || outcome->kind != nullptr) {
    for (int k = 0; k < n_outputs; ++k) Py_CLEAR(arrays[n_inputs + k]);
  }
  return ok;
}

// The poison of this call: -1 (default mode) unless checked mode is on.
int CallPoison() { return opforge_native::CheckedMode() ? opforge_native::kCheckedPoison : -1; }

PyObject *RunArrays(LauncherObject *self, PyArrayObject *const *given, PyObject *inputs);
PyObject *CallWithTupleAndDict(ternaryfunc call, PyObject *callable, PyObject *const *args, Py_ssize_t n_args,
                               PyObject *kwnames);

PyObject *Launcher_call(LauncherObject *self, PyObject *args, PyObject *kwargs) {
  if (self->planner == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Launcher was not initialised");
    return nullptr;
  }
  if ((kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) || PyTuple_GET_SIZE(args) != self->n_inputs) {
    PyObject *reject = PyObject_GetAttrString(self->planner, "reject");
    if (reject == nullptr) return nullptr;
    PyObject *result = PyObject_Call(reject, args, kwargs);
    Py_DECREF(reject);
    return result;
  }

  PyObject *inputs = args;
  Py_INCREF(inputs);
  for (int k = 0; k < self->n_inputs; ++k) {
    if (!IsPlainArray(PyTuple_GET_ITEM(args, k))) {  // lists, views, byte-swapped...: let Python convert
      Py_DECREF(inputs);
      PyObject *result;
      if (self->device_routes != nullptr && opforge_native::TryDeviceRoutes(self->device_routes, args, &result))
        return result;  // GPU arrays of a call made before

      inputs = CallPlanner(self, "prepare", args);
      if (inputs == nullptr) return nullptr;
      if (!PyTuple_CheckExact(inputs)) {  // the planner completed the call itself (e.g. tracing)
        PyObject *value = PyObject_GetAttrString(inputs, "value");
        Py_DECREF(inputs);
        return value;
      }
      if (PyTuple_GET_SIZE(inputs) != self->n_inputs) {
        Py_DECREF(inputs);
        PyErr_SetString(PyExc_RuntimeError, "planner.prepare returned the wrong number of inputs");
        return nullptr;
      }
      for (int j = 0; j < self->n_inputs; ++j) {
        PyObject *item = PyTuple_GET_ITEM(inputs, j);
        if (!IsPlainArray(item) && item != Py_None) {  // views for Python kernels, ...
          PyObject *result = CallPlanner(self, "run", inputs);
          Py_DECREF(inputs);
          return result;
        }
      }
      break;
    }
  }
  auto *items = reinterpret_cast<PyTupleObject *>(inputs)->ob_item;
  PyObject *result = RunArrays(self, reinterpret_cast<PyArrayObject *const *>(items), inputs);
  Py_DECREF(inputs);
  return result;
}

// A call of plain arrays (IsPlainArray), one per input: `inputs` is their tuple, or nullptr when the call
// came without one (one is made where the planner needs it).
PyObject *RunArrays(LauncherObject *self, PyArrayObject *const *given, PyObject *inputs) {
  PyArrayObject *stack_arrays[kStackTensors];
  std::vector<PyArrayObject *> heap_arrays;
  PyArrayObject **arrays = stack_arrays;
  int n_tensors = self->n_inputs + self->n_outputs;
  if (n_tensors > kStackTensors) {
    heap_arrays.resize(n_tensors);
    arrays = heap_arrays.data();
  }
  for (int k = 0; k < self->n_inputs; ++k) arrays[k] = given[k];
  PyObject *made = nullptr;  // the tuple made for the planner, if one was
  auto tuple = [&]() -> PyObject * {
    if (inputs == nullptr) inputs = made = ArrayTuple(given, self->n_inputs);
    return inputs;
  };

  Plan *plan = FindOrMakePlan(self, arrays, tuple);
  if (plan == nullptr) {
    Py_XDECREF(made);
    return nullptr;
  }
  if (plan->fn == nullptr) {
    PyObject *result = tuple() == nullptr ? nullptr : CallPlanner(self, "run", inputs);
    Py_XDECREF(made);
    return result;
  }
  plan->users++;  // keeps the plan alive even if a call on another thread evicts it
  // The kernel gets the present inputs only (a plan of a signature with absent ones says so).
  PyArrayObject *stack_present[kStackTensors];
  std::vector<PyArrayObject *> heap_present;
  PyArrayObject **run_arrays = arrays;
  const int n_present = plan->n_present;
  if (n_present != self->n_inputs) {
    if (n_tensors > kStackTensors) heap_present.resize(n_tensors);
    run_arrays = n_tensors > kStackTensors ? heap_present.data() : stack_present;
    for (int k = 0, at = 0; k < self->n_inputs; ++k)
      if (!IsAbsent(arrays[k])) run_arrays[at++] = arrays[k];
  }
  int rc = 0;
  Outcome outcome;
  PyObject *result = nullptr;
  const bool ran = RunPlan(plan, run_arrays, n_present, self->n_outputs, CallPoison(), &rc, &outcome);
  if (run_arrays != arrays)  // (the outputs, after the present inputs there)
    for (int k = 0; k < self->n_outputs; ++k) arrays[self->n_inputs + k] = run_arrays[n_present + k];
  if (ran) {
    if (rc != 0 || outcome.kind != nullptr) {
      PyObject *raised = PyObject_CallMethod(self->planner, "failed", "iNN", rc, OutcomeError(outcome),
                                             PyLong_FromVoidPtr(reinterpret_cast<void *>(plan->fn)));
      Py_XDECREF(raised);  // failed() raises; nullptr with the error set
    } else if (self->tuple_output) {
      result = PyTuple_New(self->n_outputs);
      for (int k = 0; k < self->n_outputs; ++k) {
        if (result != nullptr) PyTuple_SET_ITEM(result, k, reinterpret_cast<PyObject *>(arrays[self->n_inputs + k]));
        else Py_DECREF(arrays[self->n_inputs + k]);
      }
    } else {
      result = reinterpret_cast<PyObject *>(arrays[self->n_inputs]);
    }
  }
  plan->users--;
  if (plan->evicted && plan->users == 0) delete plan;
  Py_XDECREF(made);
  return result;
}

// The launcher's call without an argument tuple (vectorcall): plain arrays, one per input, go straight to
// RunArrays; any other call (keywords, another count, objects to convert) takes Launcher_call's path.
PyObject *Launcher_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  auto *self = reinterpret_cast<LauncherObject *>(callable);
  const Py_ssize_t n_args = PyVectorcall_NARGS(nargsf);
  bool plain = self->planner != nullptr && n_args == self->n_inputs &&
               (kwnames == nullptr || PyTuple_GET_SIZE(kwnames) == 0);
  for (Py_ssize_t k = 0; plain && k < n_args; ++k) plain = IsPlainArray(args[k]);
  if (plain) return RunArrays(self, reinterpret_cast<PyArrayObject *const *>(args), nullptr);
  return CallWithTupleAndDict(reinterpret_cast<ternaryfunc>(Launcher_call), callable, args, n_args, kwnames);
}

int Launcher_init(LauncherObject *self, PyObject *args, PyObject *kwds) {
  static const char *kwlist[] = {"n_inputs", "n_outputs", "tuple_output", "planner", "device_routes", nullptr};
  PyObject *planner, *device_routes = nullptr;
  int n_inputs, n_outputs, tuple_output;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "iipO|O", const_cast<char **>(kwlist), &n_inputs, &n_outputs,
                                   &tuple_output, &planner, &device_routes))
    return -1;
  if (device_routes == Py_None) device_routes = nullptr;
  if (device_routes != nullptr && !opforge_native::IsDeviceRoutes(device_routes)) {
    PyErr_SetString(PyExc_TypeError, "Launcher: device_routes must be a DeviceRoutes or None");
    return -1;
  }
  if (n_inputs < 0 || n_outputs < 1) {
    PyErr_SetString(PyExc_ValueError, "a launcher needs n_inputs >= 0 and n_outputs >= 1");
    return -1;
  }
  self->n_inputs = n_inputs;
  self->n_outputs = n_outputs;
  self->tuple_output = tuple_output;
  Py_INCREF(planner);
  Py_XSETREF(self->planner, planner);
  Py_XINCREF(device_routes);
  Py_XSETREF(self->device_routes, device_routes);
  return 0;
}

PyObject *Launcher_new(PyTypeObject *type, PyObject *, PyObject *) {
  auto *self = reinterpret_cast<LauncherObject *>(type->tp_alloc(type, 0));
  if (self != nullptr) self->vectorcall = Launcher_vectorcall;
  return reinterpret_cast<PyObject *>(self);
}

int Launcher_traverse(LauncherObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->planner);
  Py_VISIT(self->device_routes);
  for (int p = 0; p < self->n_plans; ++p) Py_VISIT(self->plans[p]->spec);
  return 0;
}

int Launcher_clear(LauncherObject *self) {
  Py_CLEAR(self->planner);
  Py_CLEAR(self->device_routes);
  for (int p = 0; p < self->n_plans; ++p) ReleasePlan(self->plans[p]);
  self->n_plans = 0;
  self->next_victim = 0;
  return 0;
}

void Launcher_dealloc(LauncherObject *self) {
  PyObject_GC_UnTrack(self);
  Launcher_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

void DropPlans(LauncherObject *self) {
  for (int p = 0; p < self->n_plans; ++p) ReleasePlan(self->plans[p]);
  self->n_plans = 0;
  self->next_victim = 0;
}

PyObject *Launcher_forget(LauncherObject *self, PyObject *) {
  DropPlans(self);
  if (self->device_routes != nullptr) {
    PyObject *done = PyObject_CallMethod(self->device_routes, "forget", nullptr);
    if (done == nullptr) return nullptr;
    Py_DECREF(done);
  }
  Py_RETURN_NONE;
}

PyObject *Launcher_stats(LauncherObject *self, void *) {
  return Py_BuildValue("{s:i,s:L}", "plans", self->n_plans, "misses", self->plan_misses);
}

PyObject *Launcher_get_planner(LauncherObject *self, void *) {
  if (self->planner == nullptr) Py_RETURN_NONE;
  Py_INCREF(self->planner);
  return self->planner;
}

PyMethodDef Launcher_methods[] = {
    {"forget", reinterpret_cast<PyCFunction>(Launcher_forget), METH_NOARGS, "drop every cached plan"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef Launcher_getset[] = {
    {"stats", reinterpret_cast<getter>(Launcher_stats), nullptr, "plan cache statistics", nullptr},
    {"planner", reinterpret_cast<getter>(Launcher_get_planner), nullptr, "the Python planner", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject LauncherType = {PyVarObject_HEAD_INIT(nullptr, 0)};


// -------------------------------------------------------------- Program ----
//
// A planned graph: a list of kernel calls whose tensor pointers are
// (buffer, byte offset) pairs.  run() takes the buffers' base addresses (the
// arena, graph inputs, graph outputs, constants) and makes every call in C
// with the GIL released; the plan (shapes, Init state, offsets) was computed
// once in Python for this input signature.  Each step's outputs and
// workspaces (its last params) are followed by room for a canary, written
// before the step and checked after it; the bytes it covered are put back
// after the check (a concat's parts are written in place, one after another:
// a part's canary lies on the next part).

struct Step {
  KernelFn fn = nullptr;
  std::vector<std::pair<int, int64_t>> refs;  // per param: buffer index, byte offset
  std::vector<int> ndims;
  std::vector<std::vector<int64_t>> dims;
  std::vector<int64_t *> shapes;
  std::vector<const char *> dtypes;
  ExtraObject *extra = nullptr;
  std::vector<size_t> written;  // bytes of the last params: outputs, then workspaces
};

struct ProgramObject {
  PyObject_HEAD
  std::vector<Step> *steps;
  PyObject *keepalive;  // the step tuples: dtype strings and Extra objects
  int n_buffers;
};

int Program_init(ProgramObject *self, PyObject *args, PyObject *) {
  PyObject *step_list;
  int n_buffers;
  if (!PyArg_ParseTuple(args, "O!i", &PyList_Type, &step_list, &n_buffers)) return -1;
  auto steps = new std::vector<Step>(PyList_GET_SIZE(step_list));
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(step_list); ++k) {
    Step &step = (*steps)[k];
    PyObject *address, *refs, *shape_list, *names, *extra_obj, *written;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(step_list, k), "OO!O!O!OO!", &address, &PyTuple_Type, &refs, &PyTuple_Type,
                          &shape_list, &PyTuple_Type, &names, &extra_obj, &PyTuple_Type, &written)) {
      delete steps;
      return -1;
    }
    step.fn = reinterpret_cast<KernelFn>(AsFunction(address));
    for (Py_ssize_t r = 0; r < PyTuple_GET_SIZE(refs); ++r) {
      int buffer;
      long long offset;
      if (!PyArg_ParseTuple(PyTuple_GET_ITEM(refs, r), "iL", &buffer, &offset)) break;
      if (buffer < 0 || buffer >= n_buffers) {
        PyErr_SetString(PyExc_ValueError, "program step refers to a buffer out of range");
        break;
      }
      step.refs.emplace_back(buffer, offset);
    }
    step.dims.resize(PyTuple_GET_SIZE(shape_list));
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(shape_list); ++t) {
      PyObject *shape = PyTuple_GET_ITEM(shape_list, t);
      step.dims[t].resize(PyTuple_GET_SIZE(shape) + 1);
      for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); ++d) step.dims[t][d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
      step.ndims.push_back(static_cast<int>(PyTuple_GET_SIZE(shape)));
      step.shapes.push_back(step.dims[t].data());
    }
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(names); ++t) step.dtypes.push_back(PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, t)));
    for (Py_ssize_t w = 0; w < PyTuple_GET_SIZE(written); ++w) step.written.push_back(PyLong_AsSize_t(PyTuple_GET_ITEM(written, w)));
    if (step.written.size() > step.refs.size() && !PyErr_Occurred())
      PyErr_SetString(PyExc_ValueError, "program step writes more buffers than it has params");
    step.extra = extra_obj == Py_None ? nullptr : AsExtra(extra_obj);
    if (PyErr_Occurred() || step.fn == nullptr || (extra_obj != Py_None && step.extra == nullptr)) {
      delete steps;
      return -1;
    }
  }
  delete self->steps;
  self->steps = steps;
  self->n_buffers = n_buffers;
  Py_INCREF(step_list);
  Py_XSETREF(self->keepalive, step_list);
  return 0;
}

void Program_dealloc(ProgramObject *self) {
  delete self->steps;
  Py_XDECREF(self->keepalive);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

// run(addresses) -> None, or (step index, rc, error) for the first step that failed.
PyObject *Program_run(ProgramObject *self, PyObject *args) {
  PyObject *address_tuple;
  if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &address_tuple)) return nullptr;
  if (self->steps == nullptr || PyTuple_GET_SIZE(address_tuple) != self->n_buffers) {
    PyErr_SetString(PyExc_ValueError, "Program.run needs one address per buffer");
    return nullptr;
  }
  std::vector<char *> bases(self->n_buffers);
  for (int b = 0; b < self->n_buffers; ++b) {  // a buffer: a C-contiguous NumPy array, or an address
    PyObject *buffer = PyTuple_GET_ITEM(address_tuple, b);
    bases[b] = PyArray_Check(buffer) ? static_cast<char *>(PyArray_DATA(reinterpret_cast<PyArrayObject *>(buffer)))
                                     : static_cast<char *>(PyLong_AsVoidPtr(buffer));
  }
  if (PyErr_Occurred()) return nullptr;
  Py_ssize_t failed = -1;
  int rc = 0;
  Outcome outcome;
  std::vector<void *> params;
  std::vector<char> covered;  // per written buffer: the bytes its canary covers
  Py_BEGIN_ALLOW_THREADS
  for (size_t k = 0; k < self->steps->size(); ++k) {
    Step &step = (*self->steps)[k];
    // params live on this call's stack: several threads may run one Program.
    params.resize(step.refs.size());
    for (size_t p = 0; p < step.refs.size(); ++p) params[p] = bases[step.refs[p].first] + step.refs[p].second;
    ExtraState *state = step.extra ? step.extra->state : nullptr;
    void *extra_ptr = step.extra ? step.extra->extra : nullptr;
    size_t first_written = params.size() - step.written.size();
    covered.resize(step.written.size() * kCanaryBytes);
    for (size_t w = 0; w < step.written.size(); ++w) {
      char *end = static_cast<char *>(params[first_written + w]) + step.written[w];
      std::memcpy(covered.data() + w * kCanaryBytes, end, kCanaryBytes);
      WriteCanary(end);
    }
    Guarded(&outcome, state, [&] {
      rc = step.fn(static_cast<int>(params.size()), params.data(), step.ndims.data(), step.shapes.data(),
                   step.dtypes.data(), nullptr, extra_ptr);
    });
    for (size_t w = 0; w < step.written.size() && outcome.kind == nullptr; ++w) {
      if (!CanaryIntact(static_cast<char *>(params[first_written + w]) + step.written[w])) {
        char detail[32];
        std::snprintf(detail, sizeof(detail), "%zu", w);
        MemoryOutcome(&outcome, "overrun", detail);
      }
    }
    for (size_t w = step.written.size(); w-- > 0;)
      std::memcpy(static_cast<char *>(params[first_written + w]) + step.written[w], covered.data() + w * kCanaryBytes,
                  kCanaryBytes);
    if (rc != 0 || outcome.kind != nullptr) {
      failed = static_cast<Py_ssize_t>(k);
      break;
    }
  }
  Py_END_ALLOW_THREADS
  if (failed < 0) Py_RETURN_NONE;
  return Py_BuildValue("(niN)", failed, rc, OutcomeError(outcome));
}

PyMethodDef Program_methods[] = {
    {"run", reinterpret_cast<PyCFunction>(Program_run), METH_VARARGS, "run(buffers) -> None or (step, rc, error); each buffer a NumPy array or an address"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject ProgramType = {PyVarObject_HEAD_INIT(nullptr, 0)};


// --------------------------------------------------------------- OpBase ----
//
// The C base of opforge.Op: a call with no keyword arguments goes straight to
// the op's default Launcher (a C call, no Python frame in between).  A call
// with keyword attributes looks for its launcher among the last few keyword
// calls -- the same number of positional tensors, the same keywords with
// strictly equal values (1, 1.0 and True differ; lists compare by content,
// against copies, so a list changed in place is a new call) -- and asks the
// Python method ``_keyword_launcher(args, kwargs)`` for it otherwise (which
// checks the attributes).  Anything else goes to ``call(args, kwargs)``.

constexpr int kKeywordCalls = 8;

struct KeywordCall {
  Py_ssize_t n_args = -1;
  PyObject *items = nullptr;     // ((name, value copy), ...) in the call's order
  PyObject *launcher = nullptr;
};

struct OpBaseObject {
  PyObject_HEAD
  PyObject *default_launcher;
  KeywordCall calls[kKeywordCalls];
  int next_call;
  vectorcallfunc vectorcall;  // OpBase_vectorcall: keyword calls need no dict
};

// A copy of an attribute value that the caller cannot change: lists (nested too) are copied.
PyObject *FrozenValue(PyObject *value) {
  if (!PyList_Check(value)) {
    Py_INCREF(value);
    return value;
  }
  Py_ssize_t n = PyList_GET_SIZE(value);
  PyObject *copy = PyList_New(n);
  if (copy == nullptr) return nullptr;
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject *item = FrozenValue(PyList_GET_ITEM(value, k));
    if (item == nullptr) {
      Py_DECREF(copy);
      return nullptr;
    }
    PyList_SET_ITEM(copy, k, item);
  }
  return copy;
}

// 1 when a and b are the same attribute value: one type, equal (lists and tuples element by element).
int StrictlyEqual(PyObject *a, PyObject *b) {
  if (a == b) return 1;
  if (Py_TYPE(a) != Py_TYPE(b)) return 0;
  if (PyFloat_CheckExact(a)) return PyFloat_AS_DOUBLE(a) == PyFloat_AS_DOUBLE(b);
  if (PyList_CheckExact(a) || PyTuple_CheckExact(a)) {
    const bool list = PyList_CheckExact(a);
    const Py_ssize_t n = list ? PyList_GET_SIZE(a) : PyTuple_GET_SIZE(a);
    if (n != (list ? PyList_GET_SIZE(b) : PyTuple_GET_SIZE(b))) return 0;
    for (Py_ssize_t k = 0; k < n; ++k) {
      int same = list ? StrictlyEqual(PyList_GET_ITEM(a, k), PyList_GET_ITEM(b, k))
                      : StrictlyEqual(PyTuple_GET_ITEM(a, k), PyTuple_GET_ITEM(b, k));
      if (same != 1) return same;
    }
    return 1;
  }
  return PyObject_RichCompareBool(a, b, Py_EQ);  // -1: an error, left set for the caller
}

// 1 when a call with keyword arguments (`kwargs`) is the one remembered as `items`; -1 on error.
int SameKeywords(PyObject *items, PyObject *kwargs) {
  if (PyTuple_GET_SIZE(items) != PyDict_GET_SIZE(kwargs)) return 0;
  Py_ssize_t pos = 0, k = 0;
  PyObject *name, *value;
  int same = 1;
  while (same == 1 && PyDict_Next(kwargs, &pos, &name, &value)) {
    PyObject *item = PyTuple_GET_ITEM(items, k++);
    PyObject *known = PyTuple_GET_ITEM(item, 0);
    same = known == name || PyUnicode_Compare(known, name) == 0 ? StrictlyEqual(PyTuple_GET_ITEM(item, 1), value)
                                                                 : 0;
  }
  return same;
}

// The same for a vectorcall's keywords: names in `kwnames`, values in `values`.
int SameVectorKeywords(PyObject *items, PyObject *const *values, PyObject *kwnames) {
  const Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
  if (PyTuple_GET_SIZE(items) != n) return 0;
  int same = 1;
  for (Py_ssize_t k = 0; same == 1 && k < n; ++k) {
    PyObject *item = PyTuple_GET_ITEM(items, k), *known = PyTuple_GET_ITEM(item, 0), *name = PyTuple_GET_ITEM(kwnames, k);
    same = known == name || PyUnicode_Compare(known, name) == 0 ? StrictlyEqual(PyTuple_GET_ITEM(item, 1), values[k]) : 0;
  }
  return same;
}

// The launcher remembered for a call of `n_args` positional arguments whose keywords `same(items)` accepts:
// a new reference, or nullptr (with an error set if a comparison failed).  A comparison may run Python code
// (an attribute value's __eq__), which may replace or forget the slot: then it is not the call's.
template <typename Same>
PyObject *RememberedLauncher(OpBaseObject *self, Py_ssize_t n_args, Same same) {
  for (const KeywordCall &call : self->calls) {
    if (call.launcher == nullptr || call.n_args != n_args) continue;
    PyObject *items = call.items, *launcher = call.launcher;
    Py_INCREF(items);
    Py_INCREF(launcher);
    const int found = same(items);
    const bool current = call.items == items && call.launcher == launcher;
    Py_DECREF(items);
    if (found < 0) {
      Py_DECREF(launcher);
      return nullptr;
    }
    if (found == 1 && current) return launcher;
    Py_DECREF(launcher);
  }
  return nullptr;
}

void ForgetCalls(OpBaseObject *self) {
  for (KeywordCall &call : self->calls) {
    Py_CLEAR(call.items);
    Py_CLEAR(call.launcher);
    call.n_args = -1;
  }
}

// Remembers the launcher of a keyword call (replacing the oldest); false with an error set.
bool RememberCall(OpBaseObject *self, PyObject *args, PyObject *kwargs, PyObject *launcher) {
  PyObject *items = PyTuple_New(PyDict_GET_SIZE(kwargs));
  if (items == nullptr) return false;
  Py_ssize_t pos = 0, k = 0;
  PyObject *name, *value;
  while (PyDict_Next(kwargs, &pos, &name, &value)) {
    PyObject *frozen = FrozenValue(value);
    PyObject *item = frozen == nullptr ? nullptr : PyTuple_Pack(2, name, frozen);
    Py_XDECREF(frozen);
    if (item == nullptr) {
      Py_DECREF(items);
      return false;
    }
    PyTuple_SET_ITEM(items, k++, item);
  }
  KeywordCall &slot = self->calls[self->next_call];
  self->next_call = (self->next_call + 1) % kKeywordCalls;
  Py_XDECREF(slot.items);
  Py_XDECREF(slot.launcher);
  slot.items = items;
  Py_INCREF(launcher);
  slot.launcher = launcher;
  slot.n_args = PyTuple_GET_SIZE(args);
  return true;
}

PyObject *CallLauncher(PyObject *launcher, PyObject *args) {
  Py_INCREF(launcher);  // the call may replace it
  PyObject *result = PyObject_Call(launcher, args, nullptr);
  Py_DECREF(launcher);
  return result;
}

// A call no launcher was found for: with keywords, the op's launcher for them (remembered for the next such
// call); else, or when it has none, the general path Op.call.
PyObject *CallUnremembered(OpBaseObject *self, PyObject *args, PyObject *kwargs) {
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) > 0) {
    PyObject *found = PyObject_CallMethod(reinterpret_cast<PyObject *>(self), "_keyword_launcher", "OO", args, kwargs);
    if (found == nullptr) return nullptr;
    if (found != Py_None) {
      PyObject *result = RememberCall(self, args, kwargs, found) ? CallLauncher(found, args) : nullptr;
      Py_DECREF(found);
      return result;
    }
    Py_DECREF(found);
  }
  PyObject *method = PyObject_GetAttrString(reinterpret_cast<PyObject *>(self), "call");
  if (method == nullptr) return nullptr;
  PyObject *empty = nullptr;
  if (kwargs == nullptr) kwargs = empty = PyDict_New();
  PyObject *result = kwargs == nullptr ? nullptr : PyObject_CallFunctionObjArgs(method, args, kwargs, nullptr);
  Py_XDECREF(empty);
  Py_DECREF(method);
  return result;
}

PyObject *OpBase_call(OpBaseObject *self, PyObject *args, PyObject *kwargs) {
  PyObject *launcher = self->default_launcher;
  const bool keywords = kwargs != nullptr && PyDict_GET_SIZE(kwargs) > 0;
  if (!keywords && launcher != nullptr && launcher != Py_None) return CallLauncher(launcher, args);
  if (keywords) {
    PyObject *remembered = RememberedLauncher(self, PyTuple_GET_SIZE(args),
                                              [kwargs](PyObject *items) { return SameKeywords(items, kwargs); });
    if (remembered != nullptr) {
      PyObject *result = PyObject_Call(remembered, args, nullptr);
      Py_DECREF(remembered);
      return result;
    }
    if (PyErr_Occurred()) return nullptr;
  }
  return CallUnremembered(self, args, kwargs);
}

PyObject *CallLauncherVector(PyObject *launcher, PyObject *const *args, Py_ssize_t n_args) {
  Py_INCREF(launcher);  // the call may replace it
  PyObject *result = PyObject_Vectorcall(launcher, args, static_cast<size_t>(n_args), nullptr);
  Py_DECREF(launcher);
  return result;
}

// A vectorcall made as a tp_call: `call` with an argument tuple and a keyword dict.
PyObject *CallWithTupleAndDict(ternaryfunc call, PyObject *callable, PyObject *const *args, Py_ssize_t n_args,
                               PyObject *kwnames) {
  PyObject *tuple = PyTuple_New(n_args);
  if (tuple == nullptr) return nullptr;
  for (Py_ssize_t k = 0; k < n_args; ++k) {
    Py_INCREF(args[k]);
    PyTuple_SET_ITEM(tuple, k, args[k]);
  }
  PyObject *kwargs = nullptr;
  const Py_ssize_t n_keywords = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  if (n_keywords > 0) {
    kwargs = PyDict_New();
    for (Py_ssize_t k = 0; kwargs != nullptr && k < n_keywords; ++k) {
      if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, k), args[n_args + k]) < 0) Py_CLEAR(kwargs);
    }
    if (kwargs == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
  }
  PyObject *result = call(callable, tuple, kwargs);
  Py_DECREF(tuple);
  Py_XDECREF(kwargs);
  return result;
}

// The same call as OpBase_call, without the tuple and dict a tp_call needs when it finds a launcher.
PyObject *OpBase_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  OpBaseObject *self = reinterpret_cast<OpBaseObject *>(callable);
  const Py_ssize_t n_args = PyVectorcall_NARGS(nargsf);
  const ternaryfunc type_call = Py_TYPE(callable)->tp_call;
  // A class whose __call__ was set after use_vectorcall (Python before 3.12 keeps the flag): its __call__.
  if (type_call != reinterpret_cast<ternaryfunc>(OpBase_call))
    return CallWithTupleAndDict(type_call, callable, args, n_args, kwnames);
  const Py_ssize_t n_keywords = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  PyObject *launcher = self->default_launcher;
  if (n_keywords == 0 && launcher != nullptr && launcher != Py_None) return CallLauncherVector(launcher, args, n_args);
  if (n_keywords > 0) {
    PyObject *const *values = args + n_args;
    PyObject *remembered = RememberedLauncher(
        self, n_args, [values, kwnames](PyObject *items) { return SameVectorKeywords(items, values, kwnames); });
    if (remembered != nullptr) {
      PyObject *result = PyObject_Vectorcall(remembered, args, static_cast<size_t>(n_args), nullptr);
      Py_DECREF(remembered);
      return result;
    }
    if (PyErr_Occurred()) return nullptr;
  }
  // Everything else: the same as OpBase_call after its search, which was just made.
  return CallWithTupleAndDict(reinterpret_cast<ternaryfunc>(CallUnremembered), callable, args, n_args, kwnames);
}

PyObject *OpBase_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  PyObject *self = PyType_GenericNew(type, args, kwargs);
  if (self != nullptr) reinterpret_cast<OpBaseObject *>(self)->vectorcall = OpBase_vectorcall;
  return self;
}

PyObject *OpBase_forget_calls(OpBaseObject *self, PyObject *) {
  ForgetCalls(self);
  Py_RETURN_NONE;
}

PyMethodDef OpBase_methods[] = {
    {"_forget_keyword_calls", reinterpret_cast<PyCFunction>(OpBase_forget_calls), METH_NOARGS,
     "drop the launchers remembered for keyword calls"},
    {nullptr, nullptr, 0, nullptr}};

int OpBase_traverse(OpBaseObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->default_launcher);
  for (const KeywordCall &call : self->calls) {
    Py_VISIT(call.items);
    Py_VISIT(call.launcher);
  }
  return 0;
}

int OpBase_clear(OpBaseObject *self) {
  Py_CLEAR(self->default_launcher);
  ForgetCalls(self);
  return 0;
}

void OpBase_dealloc(OpBaseObject *self) {
  PyObject_GC_UnTrack(self);
  OpBase_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));  // a subclass's dealloc releases its type
}

PyMemberDef OpBase_members[] = {
    {const_cast<char *>("_default_launcher"), T_OBJECT, offsetof(OpBaseObject, default_launcher), 0,
     const_cast<char *>("the Launcher used by calls without attributes, or None")},
    {nullptr, 0, 0, 0, nullptr}};

PyTypeObject OpBaseType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// use_vectorcall(cls): calls of a Python subclass of OpBase take the vectorcall path.  Python 3.12 lets a
// heap type inherit it (when it does not define __call__); before 3.12 only the flag is missing, as the
// slot offset is inherited: set it here.
PyObject *UseVectorcall(PyObject *, PyObject *cls) {
  if (!PyType_Check(cls) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject *>(cls), &OpBaseType)) {
    PyErr_SetString(PyExc_TypeError, "use_vectorcall needs a subclass of OpBase");
    return nullptr;
  }
  PyTypeObject *type = reinterpret_cast<PyTypeObject *>(cls);
  if (type->tp_call == OpBaseType.tp_call && type->tp_vectorcall_offset == OpBaseType.tp_vectorcall_offset &&
      !(type->tp_flags & Py_TPFLAGS_HAVE_VECTORCALL)) {
    type->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
    PyType_Modified(type);
  }
  return PyBool_FromLong((type->tp_flags & Py_TPFLAGS_HAVE_VECTORCALL) != 0);
}

// OpFunction(op, fallback, n_inputs, attrs, required): a function of opforge.ops.  A call with the op's
// tensors by position (n_inputs of them; any number when n_inputs < 0, a variadic op) and only attribute
// keywords, every required one among them, is the op object's own call; any other call goes to `fallback`,
// the Python function that binds arguments by name and raises opforge's errors.  No Python frame runs on
// the first path, so the functional API costs what the op object does.
struct OpFunctionObject {
  PyObject_HEAD
  PyObject *op;
  PyObject *fallback;
  Py_ssize_t n_inputs;
  PyObject *attrs;     // frozenset of attribute names
  PyObject *required;  // tuple of attribute names without a default
  PyObject *dict;      // __name__, __doc__, __signature__, op, ...
  PyObject *checked;   // the last keyword names that passed the checks (a call site's constant tuple)
  PyObject *weakrefs;
  vectorcallfunc vectorcall;
};

// 1 when `name` is one of the tuple's strings.
int NamedIn(PyObject *names, PyObject *name) {
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); ++k) {
    PyObject *known = PyTuple_GET_ITEM(names, k);
    if (known == name) return 1;
    const int same = PyObject_RichCompareBool(known, name, Py_EQ);
    if (same != 0) return same;
  }
  return 0;
}

PyObject *OpFunction_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  OpFunctionObject *self = reinterpret_cast<OpFunctionObject *>(callable);
  if (self->op == nullptr) {
    PyErr_SetString(PyExc_TypeError, "OpFunction was not initialised");
    return nullptr;
  }
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t n_keywords = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  bool direct = self->n_inputs < 0 || n == self->n_inputs;
  if (direct && kwnames != nullptr && kwnames == self->checked)
    return PyObject_Vectorcall(self->op, args, nargsf, kwnames);
  for (Py_ssize_t k = 0; direct && k < n_keywords; ++k) {
    const int known = PySet_Contains(self->attrs, PyTuple_GET_ITEM(kwnames, k));
    if (known < 0) return nullptr;
    direct = known == 1;
  }
  for (Py_ssize_t k = 0; direct && k < PyTuple_GET_SIZE(self->required); ++k) {
    const int given = n_keywords > 0 ? NamedIn(kwnames, PyTuple_GET_ITEM(self->required, k)) : 0;
    if (given < 0) return nullptr;
    direct = given == 1;
  }
  if (direct && kwnames != nullptr) {
    Py_INCREF(kwnames);
    Py_XSETREF(self->checked, kwnames);
  }
  return PyObject_Vectorcall(direct ? self->op : self->fallback, args, nargsf, kwnames);
}

PyObject *OpFunction_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  PyObject *self = PyType_GenericNew(type, args, kwargs);
  if (self != nullptr) reinterpret_cast<OpFunctionObject *>(self)->vectorcall = OpFunction_vectorcall;
  return self;
}

int OpFunction_init(OpFunctionObject *self, PyObject *args, PyObject *) {
  PyObject *op, *fallback, *attrs, *required;
  Py_ssize_t n_inputs;
  if (!PyArg_ParseTuple(args, "OOnO!O!", &op, &fallback, &n_inputs, &PyFrozenSet_Type, &attrs, &PyTuple_Type,
                        &required))
    return -1;
  Py_INCREF(op);
  Py_INCREF(fallback);
  Py_INCREF(attrs);
  Py_INCREF(required);
  Py_XSETREF(self->op, op);
  Py_XSETREF(self->fallback, fallback);
  Py_XSETREF(self->attrs, attrs);
  Py_XSETREF(self->required, required);
  self->n_inputs = n_inputs;
  return 0;
}

int OpFunction_traverse(OpFunctionObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->op);
  Py_VISIT(self->fallback);
  Py_VISIT(self->dict);
  return 0;
}

int OpFunction_clear(OpFunctionObject *self) {
  Py_CLEAR(self->op);
  Py_CLEAR(self->fallback);
  Py_CLEAR(self->attrs);
  Py_CLEAR(self->required);
  Py_CLEAR(self->dict);
  Py_CLEAR(self->checked);
  return 0;
}

void OpFunction_dealloc(OpFunctionObject *self) {
  PyObject_GC_UnTrack(self);
  if (self->weakrefs != nullptr) PyObject_ClearWeakRefs(reinterpret_cast<PyObject *>(self));
  OpFunction_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

PyObject *OpFunction_repr(OpFunctionObject *self) {
  PyObject *name = self->dict == nullptr ? nullptr : PyDict_GetItemString(self->dict, "__qualname__");
  return name != nullptr ? PyUnicode_FromFormat("<function opforge.ops.%S>", name)
                         : PyUnicode_FromString("<function of opforge.ops>");
}

// Looked up on a class, it binds as a Python function does.
PyObject *OpFunction_get(PyObject *self, PyObject *instance, PyObject *) {
  if (instance == nullptr || instance == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, instance);
}

// A Python callable the instance keeps in its dict under `name`, called with no arguments; `fallback` (a new
// reference) when there is none.
PyObject *CallHook(OpFunctionObject *self, const char *name, PyObject *fallback) {
  PyObject *hook = self->dict == nullptr ? nullptr : PyDict_GetItemString(self->dict, name);
  if (hook == nullptr) {
    Py_XINCREF(fallback);
    return fallback;
  }
  Py_INCREF(hook);  // the call may change the dict
  PyObject *result = PyObject_CallNoArgs(hook);
  Py_DECREF(hook);
  return result;
}

// __doc__: one set on the instance, else made on each read by its `_describe` (kernels may come later).
PyObject *OpFunction_get_doc(OpFunctionObject *self, void *) {
  PyObject *fixed = self->dict == nullptr ? nullptr : PyDict_GetItemString(self->dict, "_doc");
  if (fixed != nullptr) {
    Py_INCREF(fixed);
    return fixed;
  }
  return CallHook(self, "_describe", Py_None);
}

int OpFunction_set_doc(OpFunctionObject *self, PyObject *value, void *) {
  PyObject *dict = PyObject_GenericGetDict(reinterpret_cast<PyObject *>(self), nullptr);
  if (dict == nullptr) return -1;
  int rc;
  if (value != nullptr) {
    rc = PyDict_SetItemString(dict, "_doc", value);
  } else {  // del f.__doc__: back to the made one
    rc = PyDict_DelItemString(dict, "_doc");
    if (rc < 0 && PyErr_ExceptionMatches(PyExc_KeyError)) {
      PyErr_Clear();
      rc = 0;
    }
  }
  Py_DECREF(dict);
  return rc;
}

PyGetSetDef OpFunction_getset[] = {
    {const_cast<char *>("__doc__"), reinterpret_cast<getter>(OpFunction_get_doc),
     reinterpret_cast<setter>(OpFunction_set_doc), nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// Pickled and copied by the op's name, through the instance's `_reduce` (opforge.ops sets it).
PyObject *OpFunction_reduce(OpFunctionObject *self, PyObject *) {
  PyObject *reduced = CallHook(self, "_reduce", nullptr);
  if (reduced == nullptr && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "this OpFunction cannot be pickled");
  return reduced;
}

PyMethodDef OpFunction_methods[] = {
    {"__reduce__", reinterpret_cast<PyCFunction>(OpFunction_reduce), METH_NOARGS, "pickled by the op's name"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject OpFunctionType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// run_plan(plan, inputs, poison=-1) -> (outputs tuple or None, rc, error)
// One call of a planner's plan (see FillPlan) outside a Launcher.  poison >= 0
// runs it in checked mode with outputs and workspaces filled with that byte.
PyObject *RunPlanOnce(PyObject *, PyObject *args) {
  PyObject *spec, *inputs;
  int poison = -1;
  if (!PyArg_ParseTuple(args, "O!O!|i", &PyTuple_Type, &spec, &PyTuple_Type, &inputs, &poison)) return nullptr;
  int n_inputs = static_cast<int>(PyTuple_GET_SIZE(inputs));
  if (PyTuple_GET_SIZE(spec) < 2 || !PyTuple_Check(PyTuple_GET_ITEM(spec, 1))) {
    PyErr_SetString(PyExc_TypeError, "run_plan needs a plan tuple (function, out_shapes, ...)");
    return nullptr;
  }
  int n_outputs = static_cast<int>(PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 1)));
  std::vector<PyArrayObject *> arrays(n_inputs + n_outputs);
  for (int k = 0; k < n_inputs; ++k) {
    if (!IsPlainArray(PyTuple_GET_ITEM(inputs, k))) {
      PyErr_SetString(PyExc_TypeError, "run_plan needs C-contiguous, aligned, native-order NumPy arrays");
      return nullptr;
    }
    arrays[k] = reinterpret_cast<PyArrayObject *>(PyTuple_GET_ITEM(inputs, k));
  }
  Plan plan;
  if (!FillPlan(&plan, spec, n_inputs, n_outputs)) return nullptr;
  int rc = 0;
  Outcome outcome;
  if (!RunPlan(&plan, arrays.data(), n_inputs, n_outputs, poison < 0 ? CallPoison() : poison & 0xFF, &rc, &outcome))
    return nullptr;
  if (rc != 0 || outcome.kind != nullptr) return Py_BuildValue("(OiN)", Py_None, rc, OutcomeError(outcome));
  PyObject *outputs = PyTuple_New(n_outputs);
  for (int k = 0; k < n_outputs; ++k) {
    if (outputs != nullptr) PyTuple_SET_ITEM(outputs, k, reinterpret_cast<PyObject *>(arrays[n_inputs + k]));
    else Py_DECREF(arrays[n_inputs + k]);
  }
  if (outputs == nullptr) return nullptr;
  return Py_BuildValue("(NiO)", outputs, rc, Py_None);
}

// empty(shape, dtype) -> an uninitialised C-contiguous array with room for a canary after it.
PyObject *EmptyWithCanary(PyObject *, PyObject *args) {
  PyObject *shape;
  PyArray_Descr *descr;
  if (!PyArg_ParseTuple(args, "O!O&", &PyTuple_Type, &shape, PyArray_DescrConverter, &descr)) return nullptr;
  std::vector<int64_t> dims(PyTuple_GET_SIZE(shape) + 1);
  for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); ++d) dims[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
  if (PyErr_Occurred()) {
    Py_DECREF(descr);
    return nullptr;
  }
  size_t nbytes;
  PyObject *array = opforge_native::NewCanaryArray(reinterpret_cast<PyObject *>(descr),
                                                   static_cast<int>(PyTuple_GET_SIZE(shape)), dims.data(), &nbytes);
  if (array == nullptr && !PyErr_Occurred()) PyErr_Format(PyExc_MemoryError, "cannot allocate %zu bytes", nbytes);
  return array;
}

PyObject *SetChecked(PyObject *, PyObject *flag) {
  int enabled = PyObject_IsTrue(flag);
  if (enabled < 0) return nullptr;
  opforge_native::SetCheckedMode(enabled != 0);
  Py_RETURN_NONE;
}

PyObject *Checked(PyObject *, PyObject *) { return PyBool_FromLong(opforge_native::CheckedMode()); }

PyMethodDef module_methods[] = {
    {"call_init", CallInit, METH_VARARGS, "call_init(fn, extra, shapes, dtypes) -> (rc, error)"},
    {"call_infer", CallInfer, METH_VARARGS, "call_infer(fn, extra, shapes, several) -> (shapes, error)"},
    {"call_kernel", CallKernel, METH_VARARGS, "call_kernel(fn, pointers, shapes, dtypes, stream, extra) -> (rc, error)"},
    {"run_plan", RunPlanOnce, METH_VARARGS, "run_plan(plan, inputs, poison=-1) -> (outputs or None, rc, error)"},
    {"empty", EmptyWithCanary, METH_VARARGS, "empty(shape, dtype) -> array with room for a canary after its end"},
    {"set_checked", SetChecked, METH_O, "set_checked(flag): guard pages and poison for every kernel call"},
    {"checked", Checked, METH_NOARGS, "checked() -> whether checked mode is on"},
    {"use_vectorcall", UseVectorcall, METH_O, "use_vectorcall(cls): calls of an OpBase subclass skip tp_call"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "opforge._native", "C side of opforge kernel calls.", -1,
                             module_methods};

}  // namespace

PyObject *opforge_native::CallKernelGuarded(void *function, int nparam, void **params, int *ndims, int64_t **shapes,
                                            const char **dtypes, void *stream, PyObject *extra_obj, int *rc) {
  ExtraObject *extra = nullptr;
  if (extra_obj != Py_None && (extra = AsExtra(extra_obj)) == nullptr) return nullptr;
  auto fn = reinterpret_cast<KernelFn>(function);
  void *extra_ptr = extra ? extra->extra : nullptr;
  Outcome outcome;
  Py_BEGIN_ALLOW_THREADS
  Guarded(&outcome, extra ? extra->state : nullptr,
          [&] { *rc = fn(nparam, params, ndims, shapes, dtypes, stream, extra_ptr); });
  Py_END_ALLOW_THREADS
  return OutcomeError(outcome);
}

PyMODINIT_FUNC PyInit__native(void) {
  import_array();

  ExtraType.tp_name = "opforge._native.Extra";
  ExtraType.tp_basicsize = sizeof(ExtraObject);
  ExtraType.tp_flags = Py_TPFLAGS_DEFAULT;
  ExtraType.tp_doc = "Extra(op_name, attrs, cxx11_abi=False): one AotExtra with its attributes";
  ExtraType.tp_new = PyType_GenericNew;
  ExtraType.tp_init = reinterpret_cast<initproc>(Extra_init);
  ExtraType.tp_dealloc = reinterpret_cast<destructor>(Extra_dealloc);
  ExtraType.tp_getset = Extra_getset;

  LauncherType.tp_name = "opforge._native.Launcher";
  LauncherType.tp_basicsize = sizeof(LauncherObject);
  LauncherType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  LauncherType.tp_vectorcall_offset = offsetof(LauncherObject, vectorcall);
  LauncherType.tp_doc = "Launcher(n_inputs, n_outputs, tuple_output, planner): eager kernel calls";
  LauncherType.tp_new = Launcher_new;
  LauncherType.tp_init = reinterpret_cast<initproc>(Launcher_init);
  LauncherType.tp_dealloc = reinterpret_cast<destructor>(Launcher_dealloc);
  LauncherType.tp_traverse = reinterpret_cast<traverseproc>(Launcher_traverse);
  LauncherType.tp_clear = reinterpret_cast<inquiry>(Launcher_clear);
  LauncherType.tp_call = PyVectorcall_Call;
  LauncherType.tp_methods = Launcher_methods;
  LauncherType.tp_getset = Launcher_getset;

  ProgramType.tp_name = "opforge._native.Program";
  ProgramType.tp_basicsize = sizeof(ProgramObject);
  ProgramType.tp_flags = Py_TPFLAGS_DEFAULT;
  ProgramType.tp_doc = "Program(steps, n_buffers): a planned graph run in C";
  ProgramType.tp_new = PyType_GenericNew;
  ProgramType.tp_init = reinterpret_cast<initproc>(Program_init);
  ProgramType.tp_dealloc = reinterpret_cast<destructor>(Program_dealloc);
  ProgramType.tp_methods = Program_methods;

  OpBaseType.tp_name = "opforge._native.OpBase";
  OpBaseType.tp_basicsize = sizeof(OpBaseObject);
  OpBaseType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  OpBaseType.tp_doc = "C base of opforge.Op: the call path";
  OpBaseType.tp_new = OpBase_new;
  OpBaseType.tp_vectorcall_offset = offsetof(OpBaseObject, vectorcall);
  OpBaseType.tp_call = reinterpret_cast<ternaryfunc>(OpBase_call);
  OpBaseType.tp_traverse = reinterpret_cast<traverseproc>(OpBase_traverse);
  OpBaseType.tp_clear = reinterpret_cast<inquiry>(OpBase_clear);
  OpBaseType.tp_dealloc = reinterpret_cast<destructor>(OpBase_dealloc);
  OpBaseType.tp_members = OpBase_members;
  OpBaseType.tp_methods = OpBase_methods;

  OpFunctionType.tp_name = "opforge._native.OpFunction";
  OpFunctionType.tp_basicsize = sizeof(OpFunctionObject);
  OpFunctionType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  OpFunctionType.tp_doc = "OpFunction(op, fallback, n_inputs, attrs, required): a function of opforge.ops";
  OpFunctionType.tp_new = OpFunction_new;
  OpFunctionType.tp_init = reinterpret_cast<initproc>(OpFunction_init);
  OpFunctionType.tp_vectorcall_offset = offsetof(OpFunctionObject, vectorcall);
  OpFunctionType.tp_call = PyVectorcall_Call;
  OpFunctionType.tp_repr = reinterpret_cast<reprfunc>(OpFunction_repr);
  OpFunctionType.tp_descr_get = OpFunction_get;
  OpFunctionType.tp_getset = OpFunction_getset;
  OpFunctionType.tp_methods = OpFunction_methods;
  OpFunctionType.tp_weaklistoffset = offsetof(OpFunctionObject, weakrefs);
  OpFunctionType.tp_dictoffset = offsetof(OpFunctionObject, dict);
  OpFunctionType.tp_traverse = reinterpret_cast<traverseproc>(OpFunction_traverse);
  OpFunctionType.tp_clear = reinterpret_cast<inquiry>(OpFunction_clear);
  OpFunctionType.tp_dealloc = reinterpret_cast<destructor>(OpFunction_dealloc);

  if (PyType_Ready(&ExtraType) < 0 || PyType_Ready(&LauncherType) < 0 || PyType_Ready(&ProgramType) < 0 ||
      PyType_Ready(&OpBaseType) < 0 || PyType_Ready(&OpFunctionType) < 0)
    return nullptr;
  PyObject *module = PyModule_Create(&native_module);
  if (module == nullptr) return nullptr;
  Py_INCREF(&ExtraType);
  Py_INCREF(&LauncherType);
  Py_INCREF(&ProgramType);
  Py_INCREF(&OpBaseType);
  Py_INCREF(&OpFunctionType);
  if (PyModule_AddObject(module, "Extra", reinterpret_cast<PyObject *>(&ExtraType)) < 0 ||
      PyModule_AddObject(module, "Program", reinterpret_cast<PyObject *>(&ProgramType)) < 0 ||
      PyModule_AddObject(module, "OpBase", reinterpret_cast<PyObject *>(&OpBaseType)) < 0 ||
      PyModule_AddObject(module, "Launcher", reinterpret_cast<PyObject *>(&LauncherType)) < 0 ||
      PyModule_AddObject(module, "OpFunction", reinterpret_cast<PyObject *>(&OpFunctionType)) < 0 ||
      PyModule_AddIntConstant(module, "MAX_PLANS", kMaxPlans) < 0 ||
      PyModule_AddIntConstant(module, "CANARY_BYTES", static_cast<int>(opforge_native::kCanaryBytes)) < 0 ||
      PyModule_AddIntConstant(module, "CHECKED_POISON", opforge_native::kCheckedPoison) < 0 ||
      !opforge_native::AddDLPackTypes(module) || !opforge_native::AddDeviceMemoryTypes(module) ||
      !opforge_native::AddDeviceCallTypes(module)) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
