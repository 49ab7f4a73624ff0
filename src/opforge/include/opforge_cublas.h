/*
 * opforge_cublas.h: the few cuBLAS functions opforge's GPU matmul calls,
 * loaded at run time.
 *
 * Kernels link no cuBLAS (the CUDA toolkit that compiles them may not have
 * it; NVIDIA's pip wheel, which PyTorch brings, has it without headers).
 * OpforgeCublasLibrary() dlopens it once: $OPFORGE_CUBLAS if set, else
 * libcublas.so.13, .12, libcublas.so.  opforge.runtime.cublas loads the
 * wheel's copy globally first when there is one, and dlopen then finds it by
 * its soname.  The prototypes below follow cuBLAS's v2 API; the enums are
 * passed as int, as the C ABI does.
 *
 * OpforgeCublasHandle() gives the calling thread's handle for the current
 * device, created once and kept (handles are not thread-safe to share, and
 * creating one costs far more than a call); an exiting thread's handles are
 * taken up by later threads.  The stream is set on every call.
 * Failures throw std::runtime_error (see opforge_cuda.h): opforge reports
 * them as KernelError with the message.
 */
#ifndef OPFORGE_CUBLAS_H_
#define OPFORGE_CUBLAS_H_

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "opforge_cuda.h"

typedef struct cublasContext *OpforgeCublasHandle_t;
enum { OpforgeCublasOpN = 0, OpforgeCublasOpT = 1 };

struct OpforgeCublas {
  int (*Create)(OpforgeCublasHandle_t *) = nullptr;
  int (*SetStream)(OpforgeCublasHandle_t, cudaStream_t) = nullptr;
  int (*Sgemm)(OpforgeCublasHandle_t, int, int, int, int, int, const float *, const float *, int, const float *, int,
               const float *, float *, int) = nullptr;
  int (*Dgemm)(OpforgeCublasHandle_t, int, int, int, int, int, const double *, const double *, int, const double *,
               int, const double *, double *, int) = nullptr;
  int (*SgemmStridedBatched)(OpforgeCublasHandle_t, int, int, int, int, int, const float *, const float *, int,
                             long long, const float *, int, long long, const float *, float *, int, long long,
                             int) = nullptr;
  int (*DgemmStridedBatched)(OpforgeCublasHandle_t, int, int, int, int, int, const double *, const double *, int,
                             long long, const double *, int, long long, const double *, double *, int, long long,
                             int) = nullptr;
  std::string error;  // why it did not load; empty when it did
};

inline OpforgeCublas LoadOpforgeCublas() {
  OpforgeCublas lib;
  const char *names[] = {std::getenv("OPFORGE_CUBLAS"), "libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  void *handle = nullptr;
  std::string tried;
  for (const char *name : names) {
    if (name == nullptr || !*name) continue;
    handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    const char *why = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (why ? why : name);
  }
  if (handle == nullptr) {
    lib.error = "cuBLAS was not found (tried $OPFORGE_CUBLAS, libcublas.so.13, libcublas.so.12, libcublas.so: " +
                tried + "); install cuBLAS (the CUDA toolkit's, or pip install nvidia-cublas for CUDA 13, "
                "nvidia-cublas-cu12 for CUDA 12) or set OPFORGE_CUBLAS to the library's path";
    return lib;
  }
  struct Entry {
    const char *symbol;
    void **slot;
  } entries[] = {
      {"cublasCreate_v2", reinterpret_cast<void **>(&lib.Create)},
      {"cublasSetStream_v2", reinterpret_cast<void **>(&lib.SetStream)},
      {"cublasSgemm_v2", reinterpret_cast<void **>(&lib.Sgemm)},
      {"cublasDgemm_v2", reinterpret_cast<void **>(&lib.Dgemm)},
      {"cublasSgemmStridedBatched", reinterpret_cast<void **>(&lib.SgemmStridedBatched)},
      {"cublasDgemmStridedBatched", reinterpret_cast<void **>(&lib.DgemmStridedBatched)},
  };
  for (const Entry &entry : entries) {
    *entry.slot = dlsym(handle, entry.symbol);
    if (*entry.slot == nullptr) {
      lib.error = std::string("cuBLAS was loaded but has no ") + entry.symbol;
      return lib;
    }
  }
  return lib;
}

// The library, loaded on first use (thread-safe: a function-local static); throws when it is missing.
inline const OpforgeCublas &OpforgeCublasLibrary() {
  static const OpforgeCublas lib = LoadOpforgeCublas();
  if (!lib.error.empty()) OpforgeFail(lib.error);
  return lib;
}

inline void OpforgeCublasCheck(int status, const char *what) {
  if (status == 0) return;
  char message[200];
  std::snprintf(message, sizeof(message), "cuBLAS %s failed with status %d", what, status);
  OpforgeFail(message);
}

constexpr int kOpforgeCublasMaxDevices = 64;

// Handles of threads that have exited, per device, for the next threads to take.  Never destroyed, nor
// are the handles: destroying them at exit could run after the CUDA driver has shut down.
struct OpforgeCublasSpareHandles {
  std::mutex lock;
  std::vector<OpforgeCublasHandle_t> spare[kOpforgeCublasMaxDevices];
};

inline OpforgeCublasSpareHandles &OpforgeCublasSpares() {
  static auto *spares = new OpforgeCublasSpareHandles();
  return *spares;
}

// One thread's handles, one per device; at thread exit they go to the spares, so a process that starts
// and ends threads (a request pool) keeps as many handles as it ever ran threads at once, not one per thread.
struct OpforgeCublasThreadHandles {
  OpforgeCublasHandle_t handles[kOpforgeCublasMaxDevices] = {};
  ~OpforgeCublasThreadHandles() {
    OpforgeCublasSpareHandles &spares = OpforgeCublasSpares();
    std::lock_guard<std::mutex> hold(spares.lock);
    for (int d = 0; d < kOpforgeCublasMaxDevices; ++d)
      if (handles[d] != nullptr) spares.spare[d].push_back(handles[d]);
  }
};

// This thread's handle on the current device, bound to `stream`: a spare one if there is one, else new.
inline OpforgeCublasHandle_t OpforgeCublasHandle(cudaStream_t stream) {
  thread_local OpforgeCublasThreadHandles mine;
  const OpforgeCublas &lib = OpforgeCublasLibrary();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kOpforgeCublasMaxDevices) {
    cudaGetLastError();
    OpforgeFail("cuBLAS: cudaGetDevice failed, or the device number is out of range");
  }
  OpforgeCublasHandle_t &handle = mine.handles[device];
  if (handle == nullptr) {
    OpforgeCublasSpareHandles &spares = OpforgeCublasSpares();
    std::lock_guard<std::mutex> hold(spares.lock);
    if (!spares.spare[device].empty()) {
      handle = spares.spare[device].back();
      spares.spare[device].pop_back();
    }
  }
  if (handle == nullptr) OpforgeCublasCheck(lib.Create(&handle), "cublasCreate");
  OpforgeCublasCheck(lib.SetStream(handle, stream), "cublasSetStream");
  return handle;
}

#endif  // OPFORGE_CUBLAS_H_
