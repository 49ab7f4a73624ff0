// opforge's torch ops, the C++ side: a call with no Python on its path.
//
// opforge.torch defines each op twice: `ns::name`, which users call, and
// `ns::_opforge_python_name` (here "the Python op": the same op implemented in
// Python -- typed errors, Python kernels, autograd from the gradient rule, fake
// kernels).  This library adds
// boxed C++ kernels to `ns::name` for the CPU and CUDA keys and their autograd
// keys.  A call whose tensors are plain CPU/CUDA tensors, that needs no
// gradient and whose signature has been seen, runs here: outputs and workspace
// from at::empty, the kernel called on data pointers, on the current CUDA
// stream.  Everything else goes to the Python op: a signature seen for the first
// time (after asking Python for its plan), a tensor a mode or a wrapper owns
// (fake tensors, functionalization: the call is redispatched below autograd),
// a gradient to record, a Python kernel, a kernel error (run again there, so
// the error is raised with its opforge type).
//
// Loaded with ctypes.PyDLL (the GIL is held while Python calls in); built by
// opforge against the installed torch's headers and cached like a kernel.
#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/SmallVector.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using KernelFn = int (*)(int, void **, int *, int64_t **, const char **, void *, void *);
using LastErrorFn = int (*)();
using CurrentStreamFn = int32_t (*)(int32_t, void **);  // aoti_torch_get_current_cuda_stream
using TakeAttrErrorFn = int (*)();                      // opforge._native's opforge_take_attr_error

struct DTypeName {
  c10::ScalarType type;
  const char *name;
};

// The dtype names of the kernel ABI, as torch's scalar types.
constexpr DTypeName kDTypes[] = {
    {c10::ScalarType::Bool, "bool"},        {c10::ScalarType::Char, "int8"},
    {c10::ScalarType::Short, "int16"},      {c10::ScalarType::Int, "int32"},
    {c10::ScalarType::Long, "int64"},       {c10::ScalarType::Byte, "uint8"},
    {c10::ScalarType::UInt16, "uint16"},    {c10::ScalarType::UInt32, "uint32"},
    {c10::ScalarType::UInt64, "uint64"},    {c10::ScalarType::Half, "float16"},
    {c10::ScalarType::Float, "float32"},    {c10::ScalarType::Double, "float64"},
    {c10::ScalarType::BFloat16, "bfloat16"},
};

const char *DTypeNameOf(c10::ScalarType type) {
  for (const auto &entry : kDTypes)
    if (entry.type == type) return entry.name;
  return nullptr;
}

bool ScalarTypeOf(const char *name, c10::ScalarType *type) {
  for (const auto &entry : kDTypes)
    if (std::strcmp(entry.name, name) == 0) {
      *type = entry.type;
      return true;
    }
  return false;
}

struct Plan {
  KernelFn function = nullptr;
  void *extra = nullptr;
  std::vector<std::vector<int64_t>> out_shapes;
  std::vector<c10::ScalarType> out_types;
  std::vector<const char *> out_names;
  std::vector<int64_t> workspace;  // byte sizes, multiples of 64
  int64_t workspace_bytes = 0;
  bool skip = false;               // every output is empty: no kernel
  LastErrorFn last_error = nullptr;
  CurrentStreamFn current_stream = nullptr;  // torch's, for CUDA plans
  TakeAttrErrorFn take_attr_error = nullptr;
  PyObject *keep = nullptr;        // the Python plan, which owns `extra`
};

// Plans are shared with calls in flight; the last owner lets go of the Python plan.
void DeletePlan(Plan *plan) {
  if (plan->keep != nullptr && Py_IsInitialized()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(plan->keep);
    PyGILState_Release(gil);
  }
  delete plan;
}

enum class ArgKind { kTensor, kOptionalTensor, kTensorList, kAttr, kDTypeAttr };

struct OpState {
  c10::OperatorHandle fallback;  // the Python op
  std::vector<ArgKind> kinds;    // per schema argument
  std::vector<std::string> attr_names;
  PyObject *planner = nullptr;   // planner(kind, device_index, specs, attrs) -> tuple | None
  std::shared_mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const Plan>> plans;
  std::atomic<uint64_t> generation{1};  // moves on when the plans are dropped
  const uint64_t id;                    // unique for the process (an address may be reused)
  explicit OpState(c10::OperatorHandle op) : fallback(std::move(op)), id(NextId()) {}

 private:
  static uint64_t NextId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1);
  }
};

// ------------------------------------------------------------------ keys ----

void Put(std::string *key, const void *data, size_t n) { key->append(static_cast<const char *>(data), n); }

template <typename T>
void Put(std::string *key, T value) {
  Put(key, &value, sizeof(value));
}

void PutTensor(std::string *key, const at::Tensor &t) {
  Put(key, static_cast<int8_t>(t.scalar_type()));
  Put(key, static_cast<int32_t>(t.dim()));
  for (int64_t d : t.sizes()) Put(key, d);
}

// Appends an attribute's value to the key; false for a kind of value the fast path does not take.
bool PutAttr(std::string *key, const c10::IValue &v) {
  if (v.isNone()) {
    Put(key, 'n');
  } else if (v.isBool()) {
    Put(key, 'b');
    Put(key, v.toBool());
  } else if (v.isInt()) {
    Put(key, 'i');
    Put(key, v.toInt());
  } else if (v.isDouble()) {
    Put(key, 'd');
    Put(key, v.toDouble());
  } else if (v.isString()) {
    const auto &s = v.toStringRef();
    Put(key, 's');
    Put(key, static_cast<int64_t>(s.size()));
    Put(key, s.data(), s.size());
  } else if (v.isIntList()) {
    auto list = v.toIntList();
    Put(key, 'I');
    Put(key, static_cast<int64_t>(list.size()));
    for (int64_t x : list) Put(key, x);
  } else if (v.isDoubleList()) {
    auto list = v.toDoubleList();
    Put(key, 'D');
    Put(key, static_cast<int64_t>(list.size()));
    for (double x : list) Put(key, x);
  } else {
    return false;  // symbolic sizes and anything else: the Python path
  }
  return true;
}

// --------------------------------------------------------- Python plans ----

PyObject *AttrToPython(const c10::IValue &v, bool dtype) {
  if (v.isNone()) Py_RETURN_NONE;
  if (v.isBool()) return PyBool_FromLong(v.toBool());
  if (v.isInt()) {
    if (dtype) {
      const char *name = DTypeNameOf(static_cast<c10::ScalarType>(v.toInt()));
      return name ? PyUnicode_FromString(name) : nullptr;
    }
    return PyLong_FromLongLong(v.toInt());
  }
  if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
  if (v.isString()) return PyUnicode_FromString(v.toStringRef().c_str());
  if (v.isIntList() || v.isDoubleList()) {
    bool ints = v.isIntList();
    std::vector<PyObject *> items;
    if (ints)
      for (int64_t x : v.toIntList()) items.push_back(PyLong_FromLongLong(x));
    else
      for (double x : v.toDoubleList()) items.push_back(PyFloat_FromDouble(x));
    PyObject *list = PyList_New(static_cast<Py_ssize_t>(items.size()));
    if (list == nullptr) return nullptr;
    for (size_t k = 0; k < items.size(); ++k) PyList_SET_ITEM(list, k, items[k]);
    return list;
  }
  return nullptr;
}

PyObject *SpecToPython(const at::Tensor *t) {
  if (t == nullptr) Py_RETURN_NONE;
  const char *name = DTypeNameOf(t->scalar_type());
  if (name == nullptr) return nullptr;
  PyObject *shape = PyTuple_New(t->dim());
  if (shape == nullptr) return nullptr;
  for (int64_t d = 0; d < t->dim(); ++d) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(t->sizes()[d]));
  return Py_BuildValue("(Ns)", shape, name);
}

bool ReadInt64s(PyObject *seq, std::vector<int64_t> *out) {
  PyObject *fast = PySequence_Fast(seq, "a sequence of ints");
  if (fast == nullptr) return false;
  for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fast); ++k) {
    long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, k));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
    out->push_back(v);
  }
  Py_DECREF(fast);
  return true;
}

// Asks Python for the plan of one signature.  A plan without a function: the signature runs
// in the Python op (a Python kernel, several kernels).  nullptr: an error, which the Python op
// raises with its type (and which is asked again on the next call).
std::shared_ptr<const Plan> MakePlan(OpState &state, bool cuda, int device_index,
                                     const std::vector<const at::Tensor *> &tensors,
                                     const std::vector<std::pair<const c10::IValue *, bool>> &attrs) {
  PyGILState_STATE gil = PyGILState_Ensure();
  std::shared_ptr<Plan> plan;
  PyObject *specs = PyList_New(0), *values = PyDict_New(), *result = nullptr;
  bool ok = specs != nullptr && values != nullptr;
  for (size_t k = 0; ok && k < tensors.size(); ++k) {
    PyObject *spec = SpecToPython(tensors[k]);
    ok = spec != nullptr && PyList_Append(specs, spec) == 0;
    Py_XDECREF(spec);
  }
  for (size_t k = 0; ok && k < attrs.size(); ++k) {
    PyObject *value = AttrToPython(*attrs[k].first, attrs[k].second);
    ok = value != nullptr && PyDict_SetItemString(values, state.attr_names[k].c_str(), value) == 0;
    Py_XDECREF(value);
  }
  if (ok) result = PyObject_CallFunction(state.planner, "siOO", cuda ? "gpu" : "cpu", device_index, specs, values);
  if (result == Py_None) {  // the signature runs in Python (a Python kernel, a call of several kernels):
    plan = std::shared_ptr<Plan>(new Plan(), DeletePlan);  // remembered, function nullptr, so it is not asked again
  } else if (result != nullptr) {
    // (function, extra, [out shape], [out dtype], (workspace sizes), skip, last_error, current_stream,
    //  take_attr_error, keep)
    PyObject *function, *extra, *shapes, *names, *workspace, *skip, *last_error, *current_stream, *take_attr_error,
        *keep;
    plan = std::shared_ptr<Plan>(new Plan(), DeletePlan);
    ok = PyArg_ParseTuple(result, "OOOOOOOOOO", &function, &extra, &shapes, &names, &workspace, &skip, &last_error,
                          &current_stream, &take_attr_error, &keep);
    if (ok) {
      plan->function = reinterpret_cast<KernelFn>(PyLong_AsVoidPtr(function));
      plan->extra = PyLong_AsVoidPtr(extra);
      plan->last_error = reinterpret_cast<LastErrorFn>(PyLong_AsVoidPtr(last_error));
      plan->current_stream = reinterpret_cast<CurrentStreamFn>(PyLong_AsVoidPtr(current_stream));
      plan->take_attr_error = reinterpret_cast<TakeAttrErrorFn>(PyLong_AsVoidPtr(take_attr_error));
      plan->skip = PyObject_IsTrue(skip) == 1;
      ok = !PyErr_Occurred() && ReadInt64s(workspace, &plan->workspace);
      for (int64_t size : plan->workspace) plan->workspace_bytes += size;
    }
    Py_ssize_t n_out = ok ? PySequence_Size(shapes) : -1;
    for (Py_ssize_t k = 0; ok && k < n_out; ++k) {
      PyObject *shape = PySequence_GetItem(shapes, k);
      PyObject *name = PySequence_GetItem(names, k);
      std::vector<int64_t> dims;
      c10::ScalarType type;
      const char *text = name ? PyUnicode_AsUTF8(name) : nullptr;
      ok = shape != nullptr && text != nullptr && ReadInt64s(shape, &dims) && ScalarTypeOf(text, &type);
      if (ok) {
        plan->out_shapes.push_back(std::move(dims));
        plan->out_types.push_back(type);
        plan->out_names.push_back(DTypeNameOf(type));
      }
      Py_XDECREF(shape);
      Py_XDECREF(name);
    }
    if (ok && plan->function != nullptr) {
      Py_INCREF(keep);
      plan->keep = keep;
    } else {
      plan.reset();  // (errors are not remembered: the Python op raises them, with their types)
    }
  }
  if (PyErr_Occurred()) PyErr_Clear();  // the Python op raises it again, with its type
  Py_XDECREF(result);
  Py_XDECREF(specs);
  Py_XDECREF(values);
  PyGILState_Release(gil);
  return plan;
}

// ---------------------------------------------------------------- calls ----

template <typename T>
using Small = c10::SmallVector<T, 8>;

// Runs the call on plain tensors; false (stack untouched) when the Python op must run it.
bool TryFast(OpState &state, torch::jit::Stack *stack) {
  const size_t n_args = state.kinds.size();
  auto args = torch::jit::last(*stack, n_args);
  size_t n_tensors = 0;
  for (size_t k = 0; k < n_args; ++k)
    n_tensors += state.kinds[k] == ArgKind::kTensorList ? args[k].toTensorList().size() : 1;
  Small<const at::Tensor *> tensors;  // the present inputs (the kernel's): on the stack, or in `held`
  Small<const at::Tensor *> slots;  // every input in order, nullptr for an absent optional one (the planner's)
  Small<at::Tensor> held;  // contiguous copies of strided inputs, list elements; never grows past the reserve
  held.reserve(n_tensors);
  Small<std::pair<const c10::IValue *, bool>> attrs;
  thread_local std::string key;  // reused: no allocation per call
  key.clear();
  c10::optional<c10::Device> device;
  auto take = [&](const at::Tensor &t, bool lasts) {  // lasts: t outlives the call (it is on the stack)
    if (!t.defined() || t.layout() != c10::kStrided || t.is_conj() || t.is_neg()) return false;
    if (device.has_value() && t.device() != *device) return false;
    device = t.device();
    if (lasts && t.is_contiguous()) {
      tensors.push_back(&t);
    } else {
      held.push_back(t.is_contiguous() ? t : t.contiguous());
      tensors.push_back(&held.back());
    }
    PutTensor(&key, t);
    slots.push_back(tensors.back());
    return true;
  };
  for (size_t k = 0; k < n_args; ++k) {
    const c10::IValue &v = args[k];
    switch (state.kinds[k]) {
      case ArgKind::kTensor:
        if (!take(v.toTensor(), true)) return false;
        break;
      case ArgKind::kOptionalTensor:
        if (v.isNone()) {  // absent: the plan is for kernels that take the call without it
          Put(&key, static_cast<int8_t>(-1));  // (no scalar type is -1)
          slots.push_back(nullptr);
        } else if (!take(v.toTensor(), true)) {
          return false;
        }
        break;
      case ArgKind::kTensorList: {
        auto list = v.toTensorList();
        Put(&key, static_cast<int64_t>(list.size()));
        for (const at::Tensor &t : list)
          if (!take(t, false)) return false;
        break;
      }
      case ArgKind::kAttr:
      case ArgKind::kDTypeAttr:
        if (!PutAttr(&key, v)) return false;
        attrs.emplace_back(&v, state.kinds[k] == ArgKind::kDTypeAttr);
        break;
    }
  }
  if (!device.has_value() || !(device->is_cpu() || device->is_cuda())) return false;
  const bool cuda = device->is_cuda();
  Put(&key, static_cast<int8_t>(device->type()));
  Put(&key, static_cast<int16_t>(device->index()));

  // Calls mostly repeat the last signature: each thread remembers its last plan per op.
  struct Last {
    uint64_t op = 0;
    uint64_t generation = 0;
    std::string key;
    std::shared_ptr<const Plan> plan;
  };
  thread_local Last last;
  const uint64_t generation = state.generation.load(std::memory_order_acquire);
  std::shared_ptr<const Plan> plan;
  if (last.op == state.id && last.generation == generation && last.key == key) {
    plan = last.plan;
  } else {
    std::shared_lock<std::shared_mutex> read(state.mutex);
    auto found = state.plans.find(key);
    if (found != state.plans.end()) plan = found->second;
  }
  if (plan == nullptr) {
    std::vector<const at::Tensor *> specs(slots.begin(), slots.end());
    std::vector<std::pair<const c10::IValue *, bool>> plan_attrs(attrs.begin(), attrs.end());
    plan = MakePlan(state, cuda, cuda ? device->index() : 0, specs, plan_attrs);
    if (plan == nullptr) return false;
    std::unique_lock<std::shared_mutex> write(state.mutex);
    state.plans.emplace(key, plan);
  }
  if (last.plan != plan) {
    last.op = state.id;
    last.generation = generation;
    last.key = key;
    last.plan = plan;
  }
  if (plan->function == nullptr) return false;  // a signature that runs in Python

  c10::optional<c10::DeviceGuard> guard;
  if (cuda) guard.emplace(*device);
  const size_t n_out = plan->out_shapes.size();
  Small<at::Tensor> outputs;
  for (size_t k = 0; k < n_out; ++k)
    outputs.push_back(cuda ? at::empty(plan->out_shapes[k], at::TensorOptions().device(*device).dtype(plan->out_types[k]))
                           : at::Tensor(at::detail::empty_cpu(plan->out_shapes[k], plan->out_types[k])));
  if (!plan->skip) {  // (skipped: every output is empty)
    at::Tensor workspace;
    if (plan->workspace_bytes) {
      workspace = cuda ? at::empty({plan->workspace_bytes}, at::TensorOptions().device(*device).dtype(at::kByte))
                       : at::Tensor(at::detail::empty_cpu({plan->workspace_bytes}, at::kByte));
    }
    const size_t n = tensors.size() + n_out + plan->workspace.size();
    Small<void *> params(n);
    Small<int> ndims(n, 1);
    Small<int64_t *> shapes(n);
    Small<const char *> names(n, "uint8");
    size_t at = 0;
    for (const at::Tensor *t : tensors) {
      params[at] = t->data_ptr();
      ndims[at] = static_cast<int>(t->dim());
      shapes[at] = const_cast<int64_t *>(t->sizes().data());
      names[at++] = DTypeNameOf(t->scalar_type());
    }
    for (size_t k = 0; k < n_out; ++k, ++at) {
      params[at] = outputs[k].data_ptr();
      ndims[at] = static_cast<int>(plan->out_shapes[k].size());
      shapes[at] = const_cast<int64_t *>(plan->out_shapes[k].data());
      names[at] = plan->out_names[k];
    }
    Small<int64_t> workspace_dims(plan->workspace.begin(), plan->workspace.end());
    char *base = plan->workspace_bytes ? static_cast<char *>(workspace.data_ptr()) : nullptr;
    for (size_t k = 0; k < plan->workspace.size(); ++k, ++at) {
      params[at] = base;
      base += plan->workspace[k];
      shapes[at] = &workspace_dims[k];
    }
    void *stream = nullptr;
    if (cuda && (plan->current_stream == nullptr || plan->current_stream(device->index(), &stream) != 0))
      return false;
    int rc;
    if (plan->take_attr_error != nullptr) plan->take_attr_error();
    try {
      rc = plan->function(static_cast<int>(n), params.data(), ndims.data(), shapes.data(), names.data(), stream,
                          plan->extra);
    } catch (...) {
      rc = -1;
    }
    if (plan->take_attr_error != nullptr && plan->take_attr_error()) rc = -1;  // an Attr<T> error it swallowed
    if (rc != 0) return false;  // the Python op runs it again and raises the typed error
    if (cuda && plan->last_error != nullptr && plan->last_error() != 0) return false;
  }
  torch::jit::drop(*stack, n_args);
  for (auto &out : outputs) stack->emplace_back(std::move(out));
  return true;
}

// One boxed kernel for the CPU and CUDA keys (below autograd) and their autograd keys.
class FastKernel final : public c10::OperatorKernel {
 public:
  FastKernel(std::shared_ptr<OpState> state, bool autograd) : state_(std::move(state)), autograd_(autograd) {}

  void operator()(const c10::OperatorHandle &op, c10::DispatchKeySet keys, torch::jit::Stack *stack) {
    OpState &state = *state_;
    if (autograd_) {
      if (NeedsGradient(state, *stack)) {
        state.fallback.callBoxed(stack);  // the Python op records the gradient
        return;
      }
      // A mode or wrapper tensor (fake, functional, ...) owns the call below autograd: hand it on.
      c10::DispatchKeySet below = keys & c10::after_autograd_keyset;
      below = below.remove(c10::DispatchKey::ADInplaceOrView);
      c10::DispatchKey next = below.highestPriorityTypeId();
      if (next != c10::DispatchKey::CPU && next != c10::DispatchKey::CUDA) {
        op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
        return;
      }
    }
    if (!TryFast(state, stack)) state.fallback.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
  }

 private:
  // A tensor that needs a gradient, or carries a forward-mode tangent (dual level 0, where
  // forward_ad and torch.func.jvp put them): the Python op records or computes it.
  static bool Differentiated(const at::Tensor &t, bool grad_mode) {
    return (grad_mode && t.requires_grad()) || (t.defined() && t._fw_grad(0).defined());
  }

  static bool NeedsGradient(const OpState &state, const torch::jit::Stack &stack) {
    const bool grad_mode = c10::GradMode::is_enabled();
    auto args = torch::jit::last(stack, state.kinds.size());
    for (size_t k = 0; k < state.kinds.size(); ++k) {
      const c10::IValue &v = args[k];
      if (v.isTensor()) {
        if (Differentiated(v.toTensor(), grad_mode)) return true;
      } else if (v.isTensorList()) {
        for (const at::Tensor &t : v.toTensorList())
          if (Differentiated(t, grad_mode)) return true;
      }
    }
    return false;
  }

  std::shared_ptr<OpState> state_;
  bool autograd_;
};

struct Binding {
  std::shared_ptr<OpState> state;
  std::unique_ptr<torch::Library> library;
};

}  // namespace

extern "C" {

// Adds the C++ kernels to `ns::name`; it and the Python op `ns::python_name` must
// exist.  Returns a handle, or nullptr with a Python exception set.
void *opforge_torch_bind(const char *ns, const char *name, const char *python_name, PyObject *planner) {
  try {
    const std::string qualified = std::string(ns) + "::" + name;
    const std::string python_qualified = std::string(ns) + "::" + python_name;
    auto fallback = c10::Dispatcher::singleton().findSchema({python_qualified, ""});
    auto op = c10::Dispatcher::singleton().findSchema({qualified, ""});
    if (!fallback.has_value() || !op.has_value()) {
      PyErr_Format(PyExc_RuntimeError, "%s and %s must be defined first", qualified.c_str(),
                   python_qualified.c_str());
      return nullptr;
    }
    auto state = std::make_shared<OpState>(*fallback);
    for (const auto &argument : op->schema().arguments()) {
      const auto &type = argument.type();
      if (type->kind() == c10::TypeKind::TensorType) {
        state->kinds.push_back(ArgKind::kTensor);
      } else if (type->kind() == c10::TypeKind::ListType &&
                 type->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType) {
        state->kinds.push_back(ArgKind::kTensorList);
      } else if (type->kind() == c10::TypeKind::OptionalType &&
                 type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType) {
        state->kinds.push_back(ArgKind::kOptionalTensor);
      } else {
        // A ScalarType argument is an int to the dispatcher (type()); its real type says it is a dtype.
        const auto &real = argument.real_type();
        bool dtype = real->kind() == c10::TypeKind::ScalarTypeType ||
                     (real->kind() == c10::TypeKind::OptionalType &&
                      real->castRaw<c10::OptionalType>()->getElementType()->kind() ==
                          c10::TypeKind::ScalarTypeType);
        state->kinds.push_back(dtype ? ArgKind::kDTypeAttr : ArgKind::kAttr);
        state->attr_names.push_back(argument.name());
      }
    }
    Py_INCREF(planner);
    state->planner = planner;
    auto binding = std::make_unique<Binding>();
    binding->state = state;
    binding->library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, std::nullopt, __FILE__, __LINE__);
    for (auto key : {c10::DispatchKey::CPU, c10::DispatchKey::CUDA}) {
      binding->library->impl(name, torch::dispatch(key, torch::CppFunction::makeFromBoxedFunctor(
                                                            std::make_unique<FastKernel>(state, false))));
    }
    for (auto key : {c10::DispatchKey::AutogradCPU, c10::DispatchKey::AutogradCUDA}) {
      binding->library->impl(name, torch::dispatch(key, torch::CppFunction::makeFromBoxedFunctor(
                                                            std::make_unique<FastKernel>(state, true))));
    }
    return binding.release();
  } catch (const std::exception &error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
}

// Forgets every plan (the op's kernels, or the ISA cap, changed).
void opforge_torch_clear(void *handle) {
  auto *binding = static_cast<Binding *>(handle);
  std::unordered_map<std::string, std::shared_ptr<const Plan>> dropped;
  {
    std::unique_lock<std::shared_mutex> write(binding->state->mutex);
    dropped.swap(binding->state->plans);
    binding->state->generation.fetch_add(1, std::memory_order_acq_rel);
  }  // plans are released outside the lock: releasing one takes the GIL
}

// Removes the C++ kernels (the op is being defined again).
void opforge_torch_unbind(void *handle) {
  auto *binding = static_cast<Binding *>(handle);
  opforge_torch_clear(handle);
  binding->library.reset();
  Py_CLEAR(binding->state->planner);
  delete binding;
}

}  // extern "C"
