// The C side of a call on GPU arrays: device memory (device_memory.cc) and
// remembered device calls (device_call.cc).
#ifndef OPFORGE_NATIVE_DEVICE_H_
#define OPFORGE_NATIVE_DEVICE_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

namespace opforge_native {

// -- device_memory.cc: CudaRuntime (the entry points, by address) and DeviceMemory.
bool AddDeviceMemoryTypes(PyObject *module);
bool IsCudaRuntime(PyObject *obj);
// A new buffer of runtime's buffer type; an int (the cudaError_t) when the pool
// refused; nullptr with a Python error set.
PyObject *AllocateDeviceMemory(PyObject *runtime, Py_ssize_t nbytes, PyObject *stream, int device_id, PyObject *pool);
void *DeviceMemoryPointer(PyObject *buffer);  // nullptr when not a DeviceMemory
// Makes device_id current: the device to go back to with RestoreDevice, or -1 when there is none.
int MakeDeviceCurrent(PyObject *runtime, int device_id);
void RestoreDevice(PyObject *runtime, int previous);
int PeekLastError(PyObject *runtime);  // cudaPeekAtLastError: the launch check that leaves the error in place
void ClearLastError(PyObject *runtime);  // cudaGetLastError, its value dropped

// -- device_call.cc: DeviceRoutes, a launcher's remembered calls on GPU arrays.
bool AddDeviceCallTypes(PyObject *module);
bool IsDeviceRoutes(PyObject *obj);
// Runs the call here when a remembered route fits `args` (a tuple): true with *result set
// (nullptr: a Python error is set).  False, with no error set, sends the call to Python.
bool TryDeviceRoutes(PyObject *routes, PyObject *args, PyObject **result);

// -- native.cc: one kernel call on the aot ABI inside try/catch, the GIL released.
// *rc is the kernel's code; returns None or the error (kind, message), a new reference.
PyObject *CallKernelGuarded(void *function, int nparam, void **params, int *ndims, int64_t **shapes,
                            const char **dtypes, void *stream, PyObject *extra, int *rc);

}  // namespace opforge_native

#endif  // OPFORGE_NATIVE_DEVICE_H_
