// opforge._native.DeviceRoutes: a launcher's remembered calls on GPU arrays.
//
// The Python device path (runtime/device_call.py) works a call out the first
// time: placement, stream, DLPack views, plan, pool memory, kernel, launch
// check, exports.  Then it remembers the call as a route: the arguments' type
// and device, the inputs' shapes and dtypes, the kernel and what it needs.
// A later call whose arguments fit a route runs here, in C, with the same
// steps:
//
//   context(device) -> (stream, consumer, CudaRuntime, pool)   the caller's stream, asked each call
//   the route's device made current                   until the launch check
//   x.__dlpack__(stream=consumer, max_version=(1, 0))          each input, then checked against the route
//   outputs and workspace from the pool               DeviceMemory, freed stream-ordered
//   the kernel on the stream, then cudaPeekAtLastError
//   buffer.export(shape, dtype) and from_dlpack       outputs as the inputs' kind
//
// Anything the route does not cover -- another type, device or signature, a
// scalar, a producer that refuses, a failed allocation -- sends the call back
// to Python before any kernel runs, and Python owns the rules and the messages.
// A kernel's error code and a failed launch are raised by the route's Python
// callbacks (failed, launch_failed), which name op and kernel.
#include <cstring>
#include <vector>

#include "device.h"
#include "dlpack.h"

namespace {

using opforge_native::DLTensor;

constexpr int kMaxRoutes = 8;
constexpr int kDLCUDA = 2;

PyObject *g_dlpack_kwnames = nullptr;   // ("stream", "max_version")
PyObject *g_max_version = nullptr;      // (1, 0)
PyObject *g_dlpack_name = nullptr;      // "__dlpack__"
PyObject *g_export_name = nullptr;      // "export"

struct Route {
  PyTypeObject *type = nullptr;      // every argument's exact type
  int device_id = 0;
  std::vector<int64_t> signature;    // per input: ndim, dims...
  std::vector<const char *> dtypes;  // inputs then outputs (kept alive by `spec`)
  std::vector<std::vector<int64_t>> out_shapes;
  std::vector<Py_ssize_t> out_nbytes;
  std::vector<size_t> workspace;     // sizes of the workspace buffers, laid out one after another
  size_t workspace_total = 0;
  void *function = nullptr;
  PyObject *spec = nullptr;          // remember()'s arguments: keeps everything here alive
  PyObject *extra = nullptr;         // borrowed from spec
  PyObject *out_shape_tuples = nullptr, *out_dtype_names = nullptr;
  PyObject *context = nullptr, *from_dlpack = nullptr, *wrap = nullptr, *failed = nullptr,
           *launch_failed = nullptr;
  int users = 0;                     // calls in flight (the GIL is released around the kernel)
  bool evicted = false;

  ~Route() { Py_XDECREF(spec); }
};

void ReleaseRoute(Route *route) {
  route->evicted = true;
  if (route->users == 0) delete route;
}

struct DeviceRoutesObject {
  PyObject_HEAD
  int n_inputs;
  int n_outputs;
  int tuple_output;
  PyObject *interceptors;  // runtime.dispatch.INTERCEPTORS: routes hold while its length does
  Py_ssize_t interceptors_seen;
  Route *routes[kMaxRoutes];
  int n_routes;
  int next_victim;
  long long hits;
};

PyTypeObject DeviceRoutesType = {PyVarObject_HEAD_INIT(nullptr, 0)};

void DropRoutes(DeviceRoutesObject *self) {
  for (int r = 0; r < self->n_routes; ++r) ReleaseRoute(self->routes[r]);
  self->n_routes = 0;
  self->next_victim = 0;
}

bool ReadInts(PyObject *tuple, std::vector<int64_t> *out) {
  if (!PyTuple_Check(tuple)) {
    PyErr_SetString(PyExc_TypeError, "DeviceRoutes: shapes are tuples of ints");
    return false;
  }
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(tuple); ++k) {
    out->push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, k)));
    if (PyErr_Occurred()) return false;
  }
  return true;
}

bool ReadNames(PyObject *tuple, Py_ssize_t expected, std::vector<const char *> *out) {
  if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != expected) {
    PyErr_SetString(PyExc_ValueError, "DeviceRoutes: a dtype name per tensor");
    return false;
  }
  for (Py_ssize_t k = 0; k < expected; ++k) {
    const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(tuple, k));
    if (name == nullptr) return false;
    out->push_back(name);
  }
  return true;
}

bool SameCall(const Route *a, const Route *b, int n_inputs) {
  if (a->type != b->type || a->device_id != b->device_id || a->signature != b->signature) return false;
  for (int k = 0; k < n_inputs; ++k)
    if (std::strcmp(a->dtypes[k], b->dtypes[k]) != 0) return false;
  return true;
}

// remember(type, device_id, in_shapes, in_dtypes, function, extra, out_shapes, out_dtypes, out_nbytes,
//          workspace, context, from_dlpack, wrap, failed, launch_failed)
PyObject *DeviceRoutes_remember(DeviceRoutesObject *self, PyObject *args) {
  PyObject *type, *in_shapes, *in_dtypes, *function, *extra, *out_shapes, *out_dtypes, *out_nbytes, *workspace,
      *context, *from_dlpack, *wrap, *failed, *launch_failed;
  int device_id;
  if (!PyArg_ParseTuple(args, "O!iO!O!OOO!O!O!O!OOOOO:remember", &PyType_Type, &type, &device_id, &PyTuple_Type,
                        &in_shapes, &PyTuple_Type, &in_dtypes, &function, &extra, &PyTuple_Type, &out_shapes,
                        &PyTuple_Type, &out_dtypes, &PyTuple_Type, &out_nbytes, &PyTuple_Type, &workspace, &context,
                        &from_dlpack, &wrap, &failed, &launch_failed))
    return nullptr;
  if (PyTuple_GET_SIZE(in_shapes) != self->n_inputs || PyTuple_GET_SIZE(out_shapes) != self->n_outputs ||
      PyTuple_GET_SIZE(out_nbytes) != self->n_outputs) {
    PyErr_SetString(PyExc_ValueError, "DeviceRoutes.remember: a shape per input and per output");
    return nullptr;
  }
  auto *route = new Route();
  Py_INCREF(args);
  route->spec = args;  // holds every object below
  route->type = reinterpret_cast<PyTypeObject *>(type);
  route->device_id = device_id;
  route->function = PyLong_AsVoidPtr(function);
  route->extra = extra;
  route->out_shape_tuples = out_shapes;
  route->out_dtype_names = out_dtypes;
  route->context = context;
  route->from_dlpack = from_dlpack;
  route->wrap = wrap;
  route->failed = failed;
  route->launch_failed = launch_failed;
  bool ok = route->function != nullptr && ReadNames(in_dtypes, self->n_inputs, &route->dtypes) &&
            ReadNames(out_dtypes, self->n_outputs, &route->dtypes);
  for (int k = 0; ok && k < self->n_inputs; ++k) {
    std::vector<int64_t> dims;
    ok = ReadInts(PyTuple_GET_ITEM(in_shapes, k), &dims);
    route->signature.push_back(static_cast<int64_t>(dims.size()));
    route->signature.insert(route->signature.end(), dims.begin(), dims.end());
  }
  for (int k = 0; ok && k < self->n_outputs; ++k) {
    route->out_shapes.emplace_back();
    ok = ReadInts(PyTuple_GET_ITEM(out_shapes, k), &route->out_shapes.back());
    route->out_nbytes.push_back(PyLong_AsSsize_t(PyTuple_GET_ITEM(out_nbytes, k)));
    ok = ok && !PyErr_Occurred();
  }
  for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(workspace); ++k) {
    route->workspace.push_back(PyLong_AsSize_t(PyTuple_GET_ITEM(workspace, k)));
    route->workspace_total += route->workspace.back();
    ok = !PyErr_Occurred();
  }
  if (!ok) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "DeviceRoutes.remember: a null kernel address");
    delete route;
    return nullptr;
  }
  const Py_ssize_t interceptors =
      self->interceptors != nullptr && PyList_Check(self->interceptors) ? PyList_GET_SIZE(self->interceptors) : -1;
  if (interceptors != self->interceptors_seen) DropRoutes(self);  // routes made before an interceptor came
  self->interceptors_seen = interceptors;
  for (int r = 0; r < self->n_routes; ++r) {  // the same call again (its route could not take it): replace
    if (SameCall(self->routes[r], route, self->n_inputs)) {
      ReleaseRoute(self->routes[r]);
      self->routes[r] = route;
      Py_RETURN_NONE;
    }
  }
  if (self->n_routes < kMaxRoutes) {
    self->routes[self->n_routes++] = route;
  } else {
    ReleaseRoute(self->routes[self->next_victim]);
    self->routes[self->next_victim] = route;
    self->next_victim = (self->next_victim + 1) % kMaxRoutes;
  }
  Py_RETURN_NONE;
}

PyObject *DeviceRoutes_forget(DeviceRoutesObject *self, PyObject *) {
  DropRoutes(self);
  Py_RETURN_NONE;
}

PyObject *DeviceRoutes_stats(DeviceRoutesObject *self, void *) {
  return Py_BuildValue("{s:i,s:L}", "routes", self->n_routes, "hits", self->hits);
}

// The inputs of one call as the kernel sees them (views hold the producers' memory until the end of the call).
struct Inputs {
  std::vector<PyObject *> views;
  std::vector<const DLTensor *> tensors;
  std::vector<const char *> dtypes;

  ~Inputs() {
    for (PyObject *view : views) Py_DECREF(view);
  }
};

// Takes each argument through DLPack with `consumer` as the consumer's stream; false (no error set) when a
// producer refuses or an input is not a compact array on the route's device.
bool TakeInputs(PyObject *args, PyObject *consumer, int device_id, Inputs *inputs) {
  // (a free slot first: PY_VECTORCALL_ARGUMENTS_OFFSET lets the callee use it)
  PyObject *call_args[4] = {nullptr, nullptr, consumer, g_max_version};
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(args); ++k) {
    call_args[1] = PyTuple_GET_ITEM(args, k);
    PyObject *capsule = PyObject_VectorcallMethod(g_dlpack_name, call_args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                  g_dlpack_kwnames);
    if (capsule == nullptr) return false;
    PyObject *view = opforge_native::ViewCapsule(capsule);
    Py_DECREF(capsule);
    if (view == nullptr) return false;
    inputs->views.push_back(view);
    const char *dtype;
    bool contiguous;
    const DLTensor *tensor = opforge_native::ViewedTensor(view, &dtype, &contiguous);
    if (tensor == nullptr || !contiguous || tensor->device.device_type != kDLCUDA ||
        tensor->device.device_id != device_id)
      return false;
    inputs->tensors.push_back(tensor);
    inputs->dtypes.push_back(dtype);
  }
  return true;
}

bool RouteFits(const Route *route, const Inputs &inputs) {
  size_t pos = 0;
  for (size_t k = 0; k < inputs.tensors.size(); ++k) {
    const DLTensor *t = inputs.tensors[k];
    if (pos + 1 + t->ndim > route->signature.size() || route->signature[pos] != t->ndim) return false;
    if (t->ndim && std::memcmp(&route->signature[pos + 1], t->shape, t->ndim * sizeof(int64_t)) != 0) return false;
    if (std::strcmp(route->dtypes[k], inputs.dtypes[k]) != 0) return false;
    pos += 1 + t->ndim;
  }
  return pos == route->signature.size();
}

// The call's outputs, as the caller's kind: from_dlpack of each export, or the Python wrap where that
// raises (it names the error, or takes another way: JAX's device_put).
PyObject *HandBack(DeviceRoutesObject *self, Route *route, PyObject **buffers) {
  PyObject *result = self->tuple_output ? PyTuple_New(self->n_outputs) : nullptr;
  if (self->tuple_output && result == nullptr) return nullptr;
  for (int k = 0; k < self->n_outputs; ++k) {
    PyObject *export_args[4] = {nullptr, buffers[k], PyTuple_GET_ITEM(route->out_shape_tuples, k),
                                PyTuple_GET_ITEM(route->out_dtype_names, k)};
    PyObject *value = PyObject_VectorcallMethod(g_export_name, export_args + 1,
                                                3 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    if (value != nullptr && route->from_dlpack != Py_None) {
      PyObject *exported = value;
      value = PyObject_CallOneArg(route->from_dlpack, exported);
      if (value == nullptr) {
        PyErr_Clear();
        PyObject *index = PyLong_FromLong(k);
        value = index == nullptr ? nullptr : PyObject_CallFunctionObjArgs(route->wrap, index, exported, nullptr);
        Py_XDECREF(index);
      }
      Py_DECREF(exported);
    }
    if (value == nullptr) {
      Py_XDECREF(result);
      return nullptr;
    }
    if (!self->tuple_output) return value;
    PyTuple_SET_ITEM(result, k, value);
  }
  return result;
}

// Allocation, the kernel and the launch check, on the route's device (made current by the caller, which
// passes `previous`, the device to go back to before the outputs are handed back).  false (no error set)
// hands the call back to Python: nothing ran.
bool Launch(DeviceRoutesObject *self, Route *route, const Inputs &inputs, PyObject *stream_obj, PyObject *memory,
            PyObject *pool, int previous, PyObject **buffers, PyObject **result) {
  void *stream = PyLong_AsVoidPtr(stream_obj);
  if (stream == nullptr && PyErr_Occurred()) {
    PyErr_Clear();
    opforge_native::RestoreDevice(memory, previous);
    return false;
  }
  const int n_in = self->n_inputs, n_out = self->n_outputs, n_work = static_cast<int>(route->workspace.size());
  std::vector<void *> params(n_in + n_out + n_work);
  std::vector<int> ndims(n_in + n_out);
  std::vector<int64_t *> shapes(n_in + n_out);
  static int64_t scalar_shape[1] = {0};
  for (int k = 0; k < n_in; ++k) {
    const DLTensor *t = inputs.tensors[k];
    params[k] = static_cast<char *>(t->data) + t->byte_offset;
    ndims[k] = t->ndim;
    shapes[k] = t->ndim ? t->shape : scalar_shape;
  }
  PyObject *workspace = nullptr;
  bool allocated = true;
  for (int k = 0; k < n_out && allocated; ++k) {
    buffers[k] = opforge_native::AllocateDeviceMemory(memory, route->out_nbytes[k], stream_obj, route->device_id, pool);
    allocated = buffers[k] != nullptr && !PyLong_Check(buffers[k]);
    if (allocated) params[n_in + k] = opforge_native::DeviceMemoryPointer(buffers[k]);
    ndims[n_in + k] = static_cast<int>(route->out_shapes[k].size());
    shapes[n_in + k] = ndims[n_in + k] ? route->out_shapes[k].data() : scalar_shape;
  }
  if (allocated && route->workspace_total) {
    workspace = opforge_native::AllocateDeviceMemory(memory, static_cast<Py_ssize_t>(route->workspace_total),
                                                     stream_obj, route->device_id, pool);
    allocated = workspace != nullptr && !PyLong_Check(workspace);
    char *at = allocated ? static_cast<char *>(opforge_native::DeviceMemoryPointer(workspace)) : nullptr;
    for (int w = 0; allocated && w < n_work; at += route->workspace[w], ++w) params[n_in + n_out + w] = at;
  }
  if (!allocated) {  // the Python path allocates again and names the failure
    // (a failed allocation is also the thread's last error: not the next launch check's to find)
    opforge_native::ClearLastError(memory);
    PyErr_Clear();
    Py_XDECREF(workspace);
    for (int k = 0; k < n_out; ++k) Py_CLEAR(buffers[k]);
    opforge_native::RestoreDevice(memory, previous);
    return false;
  }
  int rc = 0;
  PyObject *error = opforge_native::CallKernelGuarded(route->function, static_cast<int>(params.size()), params.data(),
                                                      ndims.data(), shapes.data(), route->dtypes.data(), stream,
                                                      route->extra, &rc);
  // (checked before the workspace goes: a call failing in its free must not pass for a failed launch)
  bool launched = opforge_native::PeekLastError(memory) == 0;
  Py_XDECREF(workspace);  // freed stream-ordered: after the kernel, on its stream
  opforge_native::RestoreDevice(memory, previous);
  *result = nullptr;
  if (error == nullptr) return true;  // (a Python error is set)
  bool failed = rc != 0 || error != Py_None;
  PyObject *raised = failed ? PyObject_CallFunction(route->failed, "iO", rc, error)  // raises the op's KernelError
                            : launched ? Py_NewRef(Py_None)
                                       : PyObject_CallNoArgs(route->launch_failed);  // raises the op's CudaError
  Py_DECREF(error);
  if (raised == nullptr) return true;
  Py_DECREF(raised);
  if (failed) {
    PyErr_Format(PyExc_RuntimeError, "kernel failed with code %d, and its op raised nothing", rc);
    return true;
  }
  *result = HandBack(self, route, buffers);  // (launch_failed found the error gone: the launch went through)
  return true;
}

}  // namespace

namespace opforge_native {

bool IsDeviceRoutes(PyObject *obj) { return Py_TYPE(obj) == &DeviceRoutesType; }

bool TryDeviceRoutes(PyObject *routes_obj, PyObject *args, PyObject **result) {
  auto *self = reinterpret_cast<DeviceRoutesObject *>(routes_obj);
  if (self->n_routes == 0 || PyTuple_GET_SIZE(args) != self->n_inputs || self->n_inputs == 0) return false;
  if (self->interceptors == nullptr || !PyList_Check(self->interceptors) ||
      PyList_GET_SIZE(self->interceptors) != self->interceptors_seen) {
    DropRoutes(self);  // an interceptor came since (a bridge imported): it may take these calls now
    return false;
  }
  PyTypeObject *type = Py_TYPE(PyTuple_GET_ITEM(args, 0));
  for (Py_ssize_t k = 1; k < PyTuple_GET_SIZE(args); ++k)
    if (Py_TYPE(PyTuple_GET_ITEM(args, k)) != type) return false;
  Route *guess = nullptr;  // the device of the first route of this type: most programs use one GPU
  for (int r = 0; r < self->n_routes && guess == nullptr; ++r)
    if (self->routes[r]->type == type) guess = self->routes[r];
  if (guess == nullptr) return false;
  int device_id = guess->device_id;
  guess->users++;  // (context() runs Python code, which may forget the routes)
  PyObject *context = PyObject_CallFunction(guess->context, "i", device_id);
  guess->users--;
  if (guess->evicted && guess->users == 0) delete guess;
  if (context == nullptr || !PyTuple_Check(context) || PyTuple_GET_SIZE(context) != 4 ||
      !PyLong_Check(PyTuple_GET_ITEM(context, 0)) || !PyLong_Check(PyTuple_GET_ITEM(context, 1)) ||
      !IsCudaRuntime(PyTuple_GET_ITEM(context, 2))) {
    PyErr_Clear();
    Py_XDECREF(context);
    return false;
  }
  PyObject *stream_obj = PyTuple_GET_ITEM(context, 0), *memory = PyTuple_GET_ITEM(context, 2);
  // The inputs' device is current before they are taken: a producer orders its work before the consumer's
  // stream with the current device's streams (as the Python path's enter_device does).
  int previous = MakeDeviceCurrent(memory, device_id);
  Inputs inputs;
  bool taken = TakeInputs(args, PyTuple_GET_ITEM(context, 1), device_id, &inputs);
  Route *route = nullptr;
  for (int r = 0; taken && r < self->n_routes && route == nullptr; ++r)
    if (self->routes[r]->type == type && self->routes[r]->device_id == device_id && RouteFits(self->routes[r], inputs))
      route = self->routes[r];
  if (route == nullptr) {
    PyErr_Clear();
    RestoreDevice(memory, previous);
    Py_DECREF(context);
    return false;
  }
  route->users++;
  std::vector<PyObject *> buffers(self->n_outputs, nullptr);
  bool handled = Launch(self, route, inputs, stream_obj, memory, PyTuple_GET_ITEM(context, 3), previous,
                        buffers.data(), result);
  for (PyObject *buffer : buffers) Py_XDECREF(buffer);
  route->users--;
  if (route->evicted && route->users == 0) delete route;
  Py_DECREF(context);
  if (handled) self->hits++;
  return handled;
}

}  // namespace opforge_native

namespace {

int DeviceRoutes_init(DeviceRoutesObject *self, PyObject *args, PyObject *) {
  PyObject *interceptors;
  if (!PyArg_ParseTuple(args, "iipO!", &self->n_inputs, &self->n_outputs, &self->tuple_output, &PyList_Type,
                        &interceptors))
    return -1;
  Py_INCREF(interceptors);
  Py_XSETREF(self->interceptors, interceptors);
  DropRoutes(self);
  return 0;
}

// Routes hold callables that reach the op, whose launchers hold these routes: a cycle the collector must see.
int DeviceRoutes_traverse(DeviceRoutesObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->interceptors);
  for (int r = 0; r < self->n_routes; ++r) Py_VISIT(self->routes[r]->spec);
  return 0;
}

int DeviceRoutes_clear(DeviceRoutesObject *self) {
  DropRoutes(self);
  Py_CLEAR(self->interceptors);
  return 0;
}

void DeviceRoutes_dealloc(DeviceRoutesObject *self) {
  PyObject_GC_UnTrack(self);
  DeviceRoutes_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

PyMethodDef DeviceRoutes_methods[] = {
    {"remember", reinterpret_cast<PyCFunction>(DeviceRoutes_remember), METH_VARARGS,
     "remember(type, device_id, in_shapes, in_dtypes, function, extra, out_shapes, out_dtypes, out_nbytes, "
     "workspace, context, from_dlpack, wrap, failed, launch_failed): calls that fit run in C from now on"},
    {"forget", reinterpret_cast<PyCFunction>(DeviceRoutes_forget), METH_NOARGS, "drop every remembered call"},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef DeviceRoutes_getset[] = {
    {"stats", reinterpret_cast<getter>(DeviceRoutes_stats), nullptr, "{'routes': remembered, 'hits': calls run}",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

}  // namespace

namespace opforge_native {

bool AddDeviceCallTypes(PyObject *module) {
  g_dlpack_kwnames = Py_BuildValue("(ss)", "stream", "max_version");
  g_max_version = Py_BuildValue("(ii)", 1, 0);
  g_dlpack_name = PyUnicode_InternFromString("__dlpack__");
  g_export_name = PyUnicode_InternFromString("export");
  if (g_dlpack_kwnames == nullptr || g_max_version == nullptr || g_dlpack_name == nullptr || g_export_name == nullptr)
    return false;
  DeviceRoutesType.tp_name = "opforge._native.DeviceRoutes";
  DeviceRoutesType.tp_basicsize = sizeof(DeviceRoutesObject);
  DeviceRoutesType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  DeviceRoutesType.tp_doc =
      "DeviceRoutes(n_inputs, n_outputs, tuple_output, interceptors): a launcher's remembered calls on GPU arrays";
  DeviceRoutesType.tp_new = PyType_GenericNew;
  DeviceRoutesType.tp_init = reinterpret_cast<initproc>(DeviceRoutes_init);
  DeviceRoutesType.tp_dealloc = reinterpret_cast<destructor>(DeviceRoutes_dealloc);
  DeviceRoutesType.tp_traverse = reinterpret_cast<traverseproc>(DeviceRoutes_traverse);
  DeviceRoutesType.tp_clear = reinterpret_cast<inquiry>(DeviceRoutes_clear);
  DeviceRoutesType.tp_methods = DeviceRoutes_methods;
  DeviceRoutesType.tp_getset = DeviceRoutes_getset;
  if (PyType_Ready(&DeviceRoutesType) < 0) return false;
  Py_INCREF(&DeviceRoutesType);
  return PyModule_AddObject(module, "DeviceRoutes", reinterpret_cast<PyObject *>(&DeviceRoutesType)) == 0;
}

}  // namespace opforge_native
