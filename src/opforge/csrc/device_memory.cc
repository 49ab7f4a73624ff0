// opforge._native.CudaRuntime and DeviceMemory: device memory from opforge's
// stream-ordered pool, allocated and freed in C.
//
// The CUDA runtime is the library runtime/cuda.py loaded (the real libcudart
// or the tests' fake); CudaRuntime holds the addresses of the few entry points
// the memory path calls, so an allocation or a free is a C call instead of
// several ctypes calls.  Each buffer keeps the CudaRuntime it came from: a
// buffer outlives a switch of runtimes (the tests make one) and is still freed
// by its own.
//
// DeviceMemory is the base of runtime.cuda.DeviceBuffer, which adds the
// DLPack export in Python.  Freeing follows DeviceBuffer's rules: the free is
// queued on the buffer's stream after that stream has waited for every stream
// a DLPack consumer named (`users`), on the buffer's own device.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <cstdint>

#include "device.h"

namespace {

using GetDeviceFn = int (*)(int *);
using SetDeviceFn = int (*)(int);
using MallocFromPoolFn = int (*)(void **, size_t, void *, void *);
using FreeAsyncFn = int (*)(void *, void *);
using EventCreateFn = int (*)(void **, unsigned);
using EventRecordFn = int (*)(void *, void *);
using StreamWaitEventFn = int (*)(void *, void *, unsigned);
using EventDestroyFn = int (*)(void *);
using LastErrorFn = int (*)();

constexpr unsigned kDisableTiming = 2;  // cudaEventDisableTiming

struct CudaRuntimeObject {
  PyObject_HEAD
  GetDeviceFn get_device;
  SetDeviceFn set_device;
  MallocFromPoolFn malloc_from_pool;
  FreeAsyncFn free_async;
  EventCreateFn event_create;
  EventRecordFn event_record;
  StreamWaitEventFn stream_wait_event;
  EventDestroyFn event_destroy;
  LastErrorFn peek_at_last_error, get_last_error;
  PyTypeObject *buffer_type;  // what allocate() makes: DeviceMemory or a subclass of it
};

struct DeviceMemoryObject {
  PyObject_HEAD
  void *pointer;
  Py_ssize_t nbytes;
  int device_id;
  PyObject *stream;  // an int handle (a StreamHandle keeps its stream object alive)
  PyObject *users;   // None, or a list of int handles of the streams DLPack consumers named
  CudaRuntimeObject *runtime;
};

PyTypeObject CudaRuntimeType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject DeviceMemoryType = {PyVarObject_HEAD_INIT(nullptr, 0)};

bool ReadHandle(PyObject *value, void **handle) {
  *handle = PyLong_AsVoidPtr(value);
  return !(*handle == nullptr && PyErr_Occurred());
}

// -------------------------------------------------------------- CudaRuntime --

// CudaRuntime(addresses, buffer_type): addresses maps each entry point's name to its address.
int CudaRuntime_init(CudaRuntimeObject *self, PyObject *args, PyObject *) {
  PyObject *addresses, *buffer_type;
  if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &addresses, &PyType_Type, &buffer_type)) return -1;
  if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject *>(buffer_type), &DeviceMemoryType)) {
    PyErr_SetString(PyExc_TypeError, "CudaRuntime: buffer_type must be a subclass of DeviceMemory");
    return -1;
  }
  struct Entry {
    const char *name;
    void **slot;
  } entries[] = {
      {"cudaGetDevice", reinterpret_cast<void **>(&self->get_device)},
      {"cudaSetDevice", reinterpret_cast<void **>(&self->set_device)},
      {"cudaMallocFromPoolAsync", reinterpret_cast<void **>(&self->malloc_from_pool)},
      {"cudaFreeAsync", reinterpret_cast<void **>(&self->free_async)},
      {"cudaEventCreateWithFlags", reinterpret_cast<void **>(&self->event_create)},
      {"cudaEventRecord", reinterpret_cast<void **>(&self->event_record)},
      {"cudaStreamWaitEvent", reinterpret_cast<void **>(&self->stream_wait_event)},
      {"cudaEventDestroy", reinterpret_cast<void **>(&self->event_destroy)},
      {"cudaPeekAtLastError", reinterpret_cast<void **>(&self->peek_at_last_error)},
      {"cudaGetLastError", reinterpret_cast<void **>(&self->get_last_error)},
  };
  for (const Entry &entry : entries) {
    PyObject *address = PyDict_GetItemString(addresses, entry.name);  // borrowed
    if (address == nullptr) {
      PyErr_Format(PyExc_KeyError, "CudaRuntime: no address for %s", entry.name);
      return -1;
    }
    *entry.slot = PyLong_AsVoidPtr(address);
    if (*entry.slot == nullptr) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "CudaRuntime: %s is at address 0", entry.name);
      return -1;
    }
  }
  Py_INCREF(buffer_type);
  Py_XSETREF(self->buffer_type, reinterpret_cast<PyTypeObject *>(buffer_type));
  return 0;
}

void CudaRuntime_dealloc(CudaRuntimeObject *self) {
  Py_XDECREF(self->buffer_type);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

// Makes `device_id` current; the device to go back to, or -1 when it already was (or cannot be told).
int MakeCurrent(CudaRuntimeObject *runtime, int device_id) {
  int current = -1;
  if (runtime->get_device(&current) != 0 || current == device_id) return -1;
  return runtime->set_device(device_id) == 0 ? current : -1;
}

PyObject *Allocate(CudaRuntimeObject *self, Py_ssize_t nbytes, PyObject *stream_obj, int device_id,
                   PyObject *pool_obj) {
  if (nbytes < 0) {
    PyErr_SetString(PyExc_ValueError, "allocate: nbytes must be >= 0");
    return nullptr;
  }
  void *stream, *pool;
  if (!ReadHandle(stream_obj, &stream) || !ReadHandle(pool_obj, &pool)) return nullptr;
  PyTypeObject *type = self->buffer_type;
  auto *buffer = reinterpret_cast<DeviceMemoryObject *>(type->tp_alloc(type, 0));
  if (buffer == nullptr) return nullptr;
  int previous = MakeCurrent(self, device_id);
  void *pointer = nullptr;
  int code = self->malloc_from_pool(&pointer, nbytes > 0 ? static_cast<size_t>(nbytes) : 1, pool, stream);
  if (previous >= 0) self->set_device(previous);
  if (code != 0) {
    Py_DECREF(buffer);  // (its pointer is NULL: nothing to free)
    return PyLong_FromLong(code);
  }
  buffer->pointer = pointer;
  buffer->nbytes = nbytes;
  buffer->device_id = device_id;
  Py_INCREF(stream_obj);
  buffer->stream = stream_obj;
  Py_INCREF(Py_None);
  buffer->users = Py_None;
  Py_INCREF(self);
  buffer->runtime = self;
  return reinterpret_cast<PyObject *>(buffer);
}

// allocate(nbytes, stream, device_id, pool) -> a new buffer_type instance, or the
// int cudaError_t of a failed allocation (the Python side names it).
PyObject *CudaRuntime_allocate(CudaRuntimeObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "allocate(nbytes, stream, device_id, pool)");
    return nullptr;
  }
  Py_ssize_t nbytes = PyLong_AsSsize_t(args[0]);
  long device_id = PyLong_AsLong(args[2]);
  if (PyErr_Occurred()) return nullptr;
  return Allocate(self, nbytes, args[1], static_cast<int>(device_id), args[3]);
}

PyMethodDef CudaRuntime_methods[] = {
    {"allocate", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(CudaRuntime_allocate)),
     METH_FASTCALL, "allocate(nbytes, stream, device_id, pool) -> buffer, or the int error of a failed allocation"},
    {nullptr, nullptr, 0, nullptr},
};

// ------------------------------------------------------------- DeviceMemory --

bool IsDefaultStream(void *stream) {
  auto handle = reinterpret_cast<uintptr_t>(stream);
  return handle <= 2;  // the default, legacy and per-thread default streams name the current device's
}

// Frees the memory (once).  A call failing here also leaves its error as the thread's last error, where the
// next launch check would blame a kernel for it: it is cleared.  A sticky error cannot be cleared, and the next
// checked call reports it as sticky.
void Release(DeviceMemoryObject *self) {
  void *pointer = self->pointer;
  if (pointer == nullptr || self->runtime == nullptr) return;
  self->pointer = nullptr;
  CudaRuntimeObject *runtime = self->runtime;
  void *stream = nullptr;
  if (!ReadHandle(self->stream, &stream)) {
    PyErr_Clear();  // not a handle: the memory stays with the pool's owner rather than be freed on a wrong stream
    return;
  }
  PyObject *users = self->users;
  bool has_users = users != Py_None && PyList_Check(users) && PyList_GET_SIZE(users) > 0;
  int previous = (has_users || IsDefaultStream(stream)) ? MakeCurrent(runtime, self->device_id) : -1;
  bool failed = false;
  if (has_users) {
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(users); k++) {
      void *user = nullptr;
      if (!ReadHandle(PyList_GET_ITEM(users, k), &user)) {
        PyErr_Clear();
        continue;
      }
      void *event = nullptr;
      if (runtime->event_create(&event, kDisableTiming) == 0) {
        failed |= runtime->event_record(event, user) != 0;
        failed |= runtime->stream_wait_event(stream, event, 0) != 0;
        failed |= runtime->event_destroy(event) != 0;
      } else {
        failed = true;
      }
    }
  }
  failed |= runtime->free_async(pointer, stream) != 0;
  if (failed) runtime->get_last_error();
  if (previous >= 0) runtime->set_device(previous);
  Py_INCREF(Py_None);
  Py_SETREF(self->users, Py_None);
}

PyObject *DeviceMemory_release(DeviceMemoryObject *self, PyObject *) {
  Release(self);
  Py_RETURN_NONE;
}

// keep(): the memory is never freed (kept for the process; the buffer reads as released).
PyObject *DeviceMemory_keep(DeviceMemoryObject *self, PyObject *) {
  self->pointer = nullptr;
  Py_RETURN_NONE;
}

PyObject *DeviceMemory_new(PyTypeObject *, PyObject *, PyObject *) {
  PyErr_SetString(PyExc_TypeError, "device memory comes from opforge.runtime.cuda.allocate");
  return nullptr;
}

void DeviceMemory_dealloc(DeviceMemoryObject *self) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);  // a free during another error's unwinding keeps that error
  Release(self);
  PyErr_Restore(type, value, traceback);
  Py_XDECREF(self->stream);
  Py_XDECREF(self->users);
  Py_XDECREF(self->runtime);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

PyObject *DeviceMemory_get_pointer(DeviceMemoryObject *self, void *) { return PyLong_FromVoidPtr(self->pointer); }

PyObject *DeviceMemory_get_stream(DeviceMemoryObject *self, void *) {
  Py_INCREF(self->stream);
  return self->stream;
}

int DeviceMemory_set_stream(DeviceMemoryObject *self, PyObject *value, void *) {
  void *handle;
  if (value == nullptr || !PyLong_Check(value) || !ReadHandle(value, &handle)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "stream must be an int CUDA stream handle");
    return -1;
  }
  Py_INCREF(value);
  Py_SETREF(self->stream, value);
  return 0;
}

PyObject *DeviceMemory_get_users(DeviceMemoryObject *self, void *) {
  Py_INCREF(self->users);
  return self->users;
}

int DeviceMemory_set_users(DeviceMemoryObject *self, PyObject *value, void *) {
  if (value == nullptr || (value != Py_None && !PyList_Check(value))) {
    PyErr_SetString(PyExc_TypeError, "users must be None or a list of int stream handles");
    return -1;
  }
  Py_INCREF(value);
  Py_SETREF(self->users, value);
  return 0;
}

PyGetSetDef DeviceMemory_getset[] = {
    {"pointer", reinterpret_cast<getter>(DeviceMemory_get_pointer), nullptr, "device address (0 once released)",
     nullptr},
    {"stream", reinterpret_cast<getter>(DeviceMemory_get_stream), reinterpret_cast<setter>(DeviceMemory_set_stream),
     "the stream the memory is freed on: the one that made it, or the last that used it", nullptr},
    {"users", reinterpret_cast<getter>(DeviceMemory_get_users), reinterpret_cast<setter>(DeviceMemory_set_users),
     "None, or the other streams DLPack consumers named", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMemberDef DeviceMemory_members[] = {
    {"nbytes", T_PYSSIZET, offsetof(DeviceMemoryObject, nbytes), READONLY, "bytes asked for"},
    {"device_id", T_INT, offsetof(DeviceMemoryObject, device_id), READONLY, "the CUDA device"},
    {nullptr, 0, 0, 0, nullptr},
};

PyMethodDef DeviceMemory_methods[] = {
    {"release", reinterpret_cast<PyCFunction>(DeviceMemory_release), METH_NOARGS,
     "free the memory now, stream-ordered (a second release does nothing)"},
    {"keep", reinterpret_cast<PyCFunction>(DeviceMemory_keep), METH_NOARGS,
     "never free the memory: it stays allocated for the process, and the buffer reads as released"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

namespace opforge_native {

bool IsCudaRuntime(PyObject *obj) { return Py_TYPE(obj) == &CudaRuntimeType; }

PyObject *AllocateDeviceMemory(PyObject *runtime, Py_ssize_t nbytes, PyObject *stream, int device_id, PyObject *pool) {
  return Allocate(reinterpret_cast<CudaRuntimeObject *>(runtime), nbytes, stream, device_id, pool);
}

void *DeviceMemoryPointer(PyObject *buffer) {
  if (!PyObject_TypeCheck(buffer, &DeviceMemoryType)) return nullptr;
  return reinterpret_cast<DeviceMemoryObject *>(buffer)->pointer;
}

int MakeDeviceCurrent(PyObject *runtime, int device_id) {
  return MakeCurrent(reinterpret_cast<CudaRuntimeObject *>(runtime), device_id);
}

void RestoreDevice(PyObject *runtime, int previous) {
  if (previous >= 0) reinterpret_cast<CudaRuntimeObject *>(runtime)->set_device(previous);
}

int PeekLastError(PyObject *runtime) { return reinterpret_cast<CudaRuntimeObject *>(runtime)->peek_at_last_error(); }

void ClearLastError(PyObject *runtime) { reinterpret_cast<CudaRuntimeObject *>(runtime)->get_last_error(); }

bool AddDeviceMemoryTypes(PyObject *module) {
  CudaRuntimeType.tp_name = "opforge._native.CudaRuntime";
  CudaRuntimeType.tp_basicsize = sizeof(CudaRuntimeObject);
  CudaRuntimeType.tp_flags = Py_TPFLAGS_DEFAULT;
  CudaRuntimeType.tp_doc = "The CUDA runtime entry points opforge's device memory calls, by address.";
  CudaRuntimeType.tp_new = PyType_GenericNew;
  CudaRuntimeType.tp_init = reinterpret_cast<initproc>(CudaRuntime_init);
  CudaRuntimeType.tp_dealloc = reinterpret_cast<destructor>(CudaRuntime_dealloc);
  CudaRuntimeType.tp_methods = CudaRuntime_methods;

  DeviceMemoryType.tp_name = "opforge._native.DeviceMemory";
  DeviceMemoryType.tp_basicsize = sizeof(DeviceMemoryObject);
  DeviceMemoryType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE;
  DeviceMemoryType.tp_doc = "Device memory from opforge's pool, freed stream-ordered when released or collected.";
  DeviceMemoryType.tp_new = DeviceMemory_new;
  DeviceMemoryType.tp_dealloc = reinterpret_cast<destructor>(DeviceMemory_dealloc);
  DeviceMemoryType.tp_methods = DeviceMemory_methods;
  DeviceMemoryType.tp_members = DeviceMemory_members;
  DeviceMemoryType.tp_getset = DeviceMemory_getset;
  if (PyType_Ready(&CudaRuntimeType) < 0 || PyType_Ready(&DeviceMemoryType) < 0) return false;
  Py_INCREF(&CudaRuntimeType);
  Py_INCREF(&DeviceMemoryType);
  return PyModule_AddObject(module, "CudaRuntime", reinterpret_cast<PyObject *>(&CudaRuntimeType)) == 0 &&
         PyModule_AddObject(module, "DeviceMemory", reinterpret_cast<PyObject *>(&DeviceMemoryType)) == 0;
}

}  // namespace opforge_native
