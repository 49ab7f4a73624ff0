// Canaries, canary-backed NumPy arrays, guarded mappings and the fault
// handler of checked mode.  See buffers.h.
#define PY_SSIZE_T_CLEAN
#include "buffers.h"

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL opforge_ARRAY_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace opforge_native {

namespace {

std::atomic<bool> checked_mode{false};

// A byte pattern unlikely to be a kernel's output, different in every byte
// position so shifted copies do not match either.
const uint64_t kCanaryWords[kCanaryBytes / 8] = {
    0x9E3779B97F4A7C15ull, 0xBF58476D1CE4E5B9ull, 0x94D049BB133111EBull, 0xD6E8FEB86659FD93ull,
    0xA0761D6478BD642Full, 0xE7037ED1A0B428DBull, 0x8EBC6AF09C88C6E3ull, 0x589965CC75374CC3ull};

// Output memory comes from NumPy's default allocator, canary included, and
// the array is given that allocator as its handler: NumPy frees it as it
// frees its own arrays (through its small-block cache, which keys blocks by
// the size the array reports; a block longer than that is fine in any
// bucket).  So outputs cost what np.empty costs.
PyDataMem_Handler *DefaultAllocator() {
  static auto *handler =
      static_cast<PyDataMem_Handler *>(PyCapsule_GetPointer(PyDataMem_DefaultHandler, "mem_handler"));
  return handler;
}

size_t page_bytes = 0;
constexpr size_t kGuardBytes = 64 * 1024;  // a guard zone, not one page: strided overruns skip less

size_t PageBytes() {
  if (page_bytes == 0) page_bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page_bytes;
}

size_t GuardBytes() { return (kGuardBytes + PageBytes() - 1) / PageBytes() * PageBytes(); }

// Initial-exec: reading it in the signal handler is then a plain load, never
// a lazy TLS allocation (which could call malloc in a thread that crashed in it).
__attribute__((tls_model("initial-exec"))) thread_local FaultScope *active_scope = nullptr;
struct sigaction previous_segv, previous_bus;
std::mutex handler_mutex;

void OnFault(int signal, siginfo_t *info, void *context) {
  FaultScope *scope = active_scope;
  if (scope != nullptr && info != nullptr && info->si_code > 0) {  // a real fault, not kill()
    auto address = reinterpret_cast<uintptr_t>(info->si_addr);
    size_t guard = GuardBytes();
    for (int k = 0; k < scope->count; ++k) {
      auto start = reinterpret_cast<uintptr_t>(scope->buffers[k].data + scope->buffers[k].nbytes);
      if (address >= start && address - start < guard) {
        scope->buffer = k;
#if defined(__x86_64__) && defined(__linux__)
        scope->write = (static_cast<ucontext_t *>(context)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
        (void)context;
#endif
        siglongjmp(scope->jump, 1);
      }
    }
  }
  // Not a guard page of this thread's call: put the previous action back and
  // return, so the faulting instruction runs again under it (a crash report,
  // a core dump) as if opforge's handler had never been there.
  sigaction(signal, signal == SIGBUS ? &previous_bus : &previous_segv, nullptr);
}

void Install(int signal, struct sigaction *previous) {
  struct sigaction current;
  if (sigaction(signal, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == OnFault) return;
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = OnFault;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, previous);
}

}  // namespace

bool CheckedMode() { return checked_mode.load(std::memory_order_relaxed); }
void SetCheckedMode(bool enabled) { checked_mode.store(enabled, std::memory_order_relaxed); }

void WriteCanary(char *end) { std::memcpy(end, kCanaryWords, kCanaryBytes); }
bool CanaryIntact(const char *end) { return std::memcmp(end, kCanaryWords, kCanaryBytes) == 0; }

bool LayoutWorkspace(const std::vector<size_t> &sizes, std::vector<size_t> *offsets, size_t *total) {
  offsets->clear();
  size_t cursor = 0;
  for (size_t size : sizes) {
    size_t padded;
    if (!AddSize(size, kWorkspaceAlign - 1, &padded)) return false;
    padded = padded / kWorkspaceAlign * kWorkspaceAlign;
    offsets->push_back(cursor);
    if (!AddSize(cursor, padded, &cursor) || !AddSize(cursor, kCanaryBytes, &cursor)) return false;
  }
  *total = cursor;
  return true;
}

bool ArrayBytes(PyObject *descr, int nd, const int64_t *dims, size_t *nbytes) {
  size_t bytes = static_cast<size_t>(PyDataType_ELSIZE(reinterpret_cast<PyArray_Descr *>(descr)));
  for (int d = 0; d < nd; ++d) {
    if (dims[d] < 0 || __builtin_mul_overflow(bytes, static_cast<size_t>(dims[d]), &bytes)) return false;
  }
  *nbytes = bytes;
  return bytes <= static_cast<size_t>(PY_SSIZE_T_MAX) - kCanaryBytes;
}

PyObject *NewCanaryArray(PyObject *descr, int nd, const int64_t *dims, size_t *nbytes) {
  if (!ArrayBytes(descr, nd, dims, nbytes)) {
    *nbytes = SIZE_MAX;
    Py_DECREF(descr);
    return nullptr;
  }
  PyDataMem_Handler *allocator = DefaultAllocator();
  if (allocator == nullptr) {
    Py_DECREF(descr);
    return nullptr;  // with the capsule's error set
  }
  char *data = static_cast<char *>(allocator->allocator.malloc(allocator->allocator.ctx, *nbytes + kCanaryBytes));
  if (data == nullptr) {
    Py_DECREF(descr);
    return nullptr;
  }
  WriteCanary(data + *nbytes);
  PyObject *array = PyArray_NewFromDescr(&PyArray_Type, reinterpret_cast<PyArray_Descr *>(descr), nd,
                                         const_cast<npy_intp *>(reinterpret_cast<const npy_intp *>(dims)), nullptr,
                                         data, NPY_ARRAY_CARRAY, nullptr);
  if (array == nullptr) {
    allocator->allocator.free(allocator->allocator.ctx, data, *nbytes + kCanaryBytes);
    if (!PyErr_Occurred()) PyErr_NoMemory();
    return nullptr;
  }
  Py_INCREF(PyDataMem_DefaultHandler);
  reinterpret_cast<PyArrayObject_fields *>(array)->mem_handler = PyDataMem_DefaultHandler;
  PyArray_ENABLEFLAGS(reinterpret_cast<PyArrayObject *>(array), NPY_ARRAY_OWNDATA);
  return array;
}

bool MapGuarded(size_t nbytes, int poison, GuardedBuffer *buffer) {
  size_t page = PageBytes(), span, map_bytes;
  if (!AddSize(nbytes, page - 1, &span)) return false;
  span = span / page * page;
  if (!AddSize(span, GuardBytes(), &map_bytes)) return false;
  void *map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return false;
  char *base = static_cast<char *>(map);
  if (mprotect(base + span, GuardBytes(), PROT_NONE) != 0) {
    munmap(map, map_bytes);
    return false;
  }
  buffer->map = base;
  buffer->map_bytes = map_bytes;
  buffer->data = base + span - nbytes;
  buffer->nbytes = nbytes;
  std::memset(buffer->data, poison, nbytes);
  return true;
}

void UnmapGuarded(GuardedBuffer *buffer) {
  if (buffer->map != nullptr) munmap(buffer->map, buffer->map_bytes);
  *buffer = GuardedBuffer();
}

void ArmFaultHandler() {
  std::lock_guard<std::mutex> lock(handler_mutex);
  PageBytes();
  Install(SIGSEGV, &previous_segv);
  Install(SIGBUS, &previous_bus);
}

void EnterFaultScope(FaultScope *scope) { active_scope = scope; }
void LeaveFaultScope() { active_scope = nullptr; }

}  // namespace opforge_native
