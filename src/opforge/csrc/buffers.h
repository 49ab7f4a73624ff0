// Memory a kernel writes (outputs, workspaces) and the checks around a call.
//
// * Default mode: every output and workspace is followed by a canary of
//   kCanaryBytes, written before the call and compared after it.  A kernel
//   that wrote past the end of a buffer is reported (the overrun landed in
//   the canary, so small overruns do not reach the heap's own bookkeeping).
// * Checked mode (OPFORGE_CHECK=1, opforge.set_checks(True)): every output
//   and workspace gets its own mapping that ends against PROT_NONE guard
//   pages and is filled with a poison byte.  A fault in a guard page during
//   the call jumps back to the caller (per-thread jump buffer) and is
//   reported instead of crashing the process.
#ifndef OPFORGE_NATIVE_BUFFERS_H_
#define OPFORGE_NATIVE_BUFFERS_H_

#include <Python.h>

#include <csetjmp>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace opforge_native {

constexpr size_t kCanaryBytes = 64;   // absorbs (and detects) overruns of up to a cache line
constexpr size_t kWorkspaceAlign = 64;
constexpr int kCheckedPoison = 0xFF;  // NaN in every float type, -1 in every signed integer

bool CheckedMode();
void SetCheckedMode(bool enabled);

void WriteCanary(char *end);
bool CanaryIntact(const char *end);

// a + b, false when it does not fit in size_t.
inline bool AddSize(size_t a, size_t b, size_t *sum) { return !__builtin_add_overflow(a, b, sum); }

// Offsets of workspaces packed in one block: each rounded up to
// kWorkspaceAlign and followed by its canary.  False when the sizes overflow.
bool LayoutWorkspace(const std::vector<size_t> &sizes, std::vector<size_t> *offsets, size_t *total);

// A C-contiguous NumPy array (steals `descr`) owning memory from NumPy's
// default allocator, with room for a canary after its last byte; the canary
// is written.  Sets
// *nbytes.  Returns nullptr with no Python error set when the memory cannot be
// allocated (*nbytes is SIZE_MAX if the size overflows), with one set when
// creating the array failed otherwise.
PyObject *NewCanaryArray(PyObject *descr, int nd, const int64_t *dims, size_t *nbytes);

// Bytes of an array of this dtype and shape; false on overflow.
bool ArrayBytes(PyObject *descr, int nd, const int64_t *dims, size_t *nbytes);

// ----------------------------------------------------------- checked mode

struct GuardedBuffer {
  char *map = nullptr;  // the whole mapping: data pages, then guard pages
  size_t map_bytes = 0;
  char *data = nullptr;  // ends where the guard pages begin
  size_t nbytes = 0;
};

// Maps `nbytes` ending against guard pages, filled with `poison`.  False
// when the memory cannot be mapped.
bool MapGuarded(size_t nbytes, int poison, GuardedBuffer *buffer);
void UnmapGuarded(GuardedBuffer *buffer);

// Where a guarded call faulted: buffer index (-1: no fault) and whether the
// access was a write (x86-64 Linux tells; elsewhere assumed).
struct Fault {
  int buffer = -1;
  bool write = true;
};

struct FaultScope {
  sigjmp_buf jump;
  const GuardedBuffer *buffers = nullptr;
  int count = 0;
  volatile sig_atomic_t buffer = -1;
  volatile sig_atomic_t write = 1;
};

// Installs the SIGSEGV/SIGBUS handler unless it is the current one (someone,
// e.g. faulthandler, may have replaced it since).  Call with the GIL held.
void ArmFaultHandler();
void EnterFaultScope(FaultScope *scope);
void LeaveFaultScope();

// Runs call() so that a fault in one of the buffers' guard pages returns
// here instead of killing the process.  Faults anywhere else take the action
// that was installed before opforge's handler.
template <typename Call>
Fault CallGuarded(const GuardedBuffer *buffers, int count, Call call) {
  FaultScope scope;
  scope.buffers = buffers;
  scope.count = count;
  if (sigsetjmp(scope.jump, 1) == 0) {
    EnterFaultScope(&scope);
    call();
  }
  LeaveFaultScope();
  Fault fault;
  fault.buffer = scope.buffer;
  fault.write = scope.write != 0;
  return fault;
}

}  // namespace opforge_native

#endif  // OPFORGE_NATIVE_BUFFERS_H_
