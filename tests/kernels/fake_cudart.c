/* A fake CUDA runtime for tests on machines without a GPU.
 *
 * It exports the CUDA runtime functions opforge.runtime.cuda calls, with the
 * same C signatures, and backs "device" memory with host malloc.  A GPU
 * kernel given these pointers can be any host function with the aot
 * signature, so the whole device call path (allocation, copies, streams,
 * launch checks, graph capture) runs in CI.  It checks which calls are made
 * and with which arguments -- it does not check CUDA itself: no real kernel,
 * stream ordering or device fault happens here.
 *
 * Test hooks (all prefixed fake_cuda_):
 *   fake_cuda_calls(name)            times `name` was called since the last reset (-1: not a faked call)
 *   fake_cuda_reset()                zero the counters, forget injected errors and the last stream
 *   fake_cuda_last_stream()          the stream argument of the latest call that took one
 *   fake_cuda_inject_error(code, sticky)
 *                                    non-sticky: the next cudaGetLastError returns code (once);
 *                                    sticky: every call from now on returns code, as after a device fault
 *   fake_cuda_set_device_count(n)    what cudaGetDeviceCount reports (default 1)
 *   fake_cuda_live_device_blocks()   device allocations not yet freed
 *   fake_cuda_live_host_blocks()     pinned host allocations not yet freed
 *   fake_cuda_bad_frees()            frees of pointers this runtime never handed out
 *   fake_cuda_release_threshold(dev) the last cudaMemPoolAttrReleaseThreshold set on dev's pool
 *   fake_cuda_capturing()            1 while a stream capture is open
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;

enum {
  kSuccess = 0,
  kInvalidValue = 1,
  kMemoryAllocation = 2,
  kInvalidDevice = 101,
  kNoDevice = 100,
  kInvalidResourceHandle = 400,
  kStreamCaptureUnsupported = 900,
  kStreamCaptureInvalidated = 901,
};

static const char *const kCallNames[] = {
    "cudaGetDeviceCount", "cudaGetDevice", "cudaSetDevice", "cudaGetLastError", "cudaPeekAtLastError",
    "cudaGetErrorString", "cudaGetErrorName", "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync",
    "cudaDeviceGetDefaultMemPool", "cudaMemPoolSetAttribute", "cudaMemcpy", "cudaMemcpyAsync",
    "cudaHostAlloc", "cudaMallocHost", "cudaFreeHost", "cudaStreamCreate", "cudaStreamCreateWithFlags",
    "cudaStreamDestroy", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventCreate",
    "cudaEventCreateWithFlags", "cudaEventRecord", "cudaEventSynchronize", "cudaEventQuery",
    "cudaEventDestroy", "cudaEventElapsedTime", "cudaStreamWaitEvent", "cudaStreamBeginCapture",
    "cudaStreamEndCapture", "cudaStreamIsCapturing", "cudaGraphInstantiate", "cudaGraphInstantiateWithFlags",
    "cudaGraphLaunch",
    "cudaGraphDestroy", "cudaGraphExecDestroy", "cudaRuntimeGetVersion", "cudaDriverGetVersion",
    "cudaMemsetAsync", "cudaPointerGetAttributes",
};
enum { kCallCount = sizeof(kCallNames) / sizeof(kCallNames[0]) };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long counts[kCallCount];
static int device_count = 1;
static int current_device = 0;
static cudaError_t pending_error = kSuccess; /* returned once by cudaGetLastError */
static cudaError_t sticky_error = kSuccess;  /* returned by every call */
static cudaStream_t last_stream = 0;
static int capturing = 0;
static cudaStream_t capture_stream = 0;
static long bad_frees = 0;
static uint64_t release_threshold[16];
static char pools[16]; /* one address per device stands for its default pool */

/* Live allocations, a singly linked list (tests make few). */
struct block {
  void *pointer;
  int pinned;
  struct block *next;
};
static struct block *blocks = NULL;

static int index_of(const char *name) {
  for (int i = 0; i < kCallCount; i++)
    if (strcmp(kCallNames[i], name) == 0) return i;
  return -1;
}

/* Counts the call; returns the sticky error, if any, which the call then returns. */
static cudaError_t enter(const char *name) {
  int i = index_of(name);
  pthread_mutex_lock(&lock);
  if (i >= 0) counts[i]++;
  cudaError_t sticky = sticky_error;
  pthread_mutex_unlock(&lock);
  return sticky;
}

static void note_stream(cudaStream_t stream) {
  pthread_mutex_lock(&lock);
  last_stream = stream;
  pthread_mutex_unlock(&lock);
}

/* enter() for a call that takes a stream: the stream is noted even when the call fails. */
static cudaError_t enter_on(const char *name, cudaStream_t stream) {
  cudaError_t e = enter(name);
  note_stream(stream);
  return e;
}

static void remember(void *pointer, int pinned) {
  struct block *b = malloc(sizeof *b);
  if (b == NULL) return;
  pthread_mutex_lock(&lock);
  b->pointer = pointer;
  b->pinned = pinned;
  b->next = blocks;
  blocks = b;
  pthread_mutex_unlock(&lock);
}

/* Removes the block; 0 when it was never handed out (or was freed already). */
static int forget(void *pointer, int pinned) {
  pthread_mutex_lock(&lock);
  for (struct block **at = &blocks; *at != NULL; at = &(*at)->next) {
    if ((*at)->pointer == pointer && (*at)->pinned == pinned) {
      struct block *b = *at;
      *at = b->next;
      pthread_mutex_unlock(&lock);
      free(b);
      return 1;
    }
  }
  bad_frees++;
  pthread_mutex_unlock(&lock);
  return 0;
}

static long live(int pinned) {
  long n = 0;
  pthread_mutex_lock(&lock);
  for (struct block *b = blocks; b != NULL; b = b->next) n += b->pinned == pinned;
  pthread_mutex_unlock(&lock);
  return n;
}

static cudaError_t allocate(void **out, size_t size, int pinned) {
  if (out == NULL) return kInvalidValue;
  void *p = malloc(size ? size : 1);
  if (p == NULL) return kMemoryAllocation;
  remember(p, pinned);
  *out = p;
  return kSuccess;
}

static cudaError_t release(void *pointer, int pinned) {
  if (pointer == NULL) return kSuccess;
  if (!forget(pointer, pinned)) return kInvalidValue;
  free(pointer);
  return kSuccess;
}

/* ---- test hooks ---------------------------------------------------------- */

long fake_cuda_calls(const char *name) {
  int i = index_of(name);
  if (i < 0) return -1;
  pthread_mutex_lock(&lock);
  long n = counts[i];
  pthread_mutex_unlock(&lock);
  return n;
}

void fake_cuda_reset(void) {
  pthread_mutex_lock(&lock);
  memset(counts, 0, sizeof counts);
  memset(release_threshold, 0, sizeof release_threshold);
  pending_error = sticky_error = kSuccess;
  last_stream = 0;
  capturing = 0;
  capture_stream = 0;
  bad_frees = 0;
  device_count = 1;
  current_device = 0;
  pthread_mutex_unlock(&lock);
}

void *fake_cuda_last_stream(void) { return last_stream; }

void fake_cuda_inject_error(int code, int sticky) {
  pthread_mutex_lock(&lock);
  if (sticky)
    sticky_error = code;
  else
    pending_error = code;
  pthread_mutex_unlock(&lock);
}

void fake_cuda_set_device_count(int n) { device_count = n; }
long fake_cuda_live_device_blocks(void) { return live(0); }
long fake_cuda_live_host_blocks(void) { return live(1); }
long fake_cuda_bad_frees(void) { return bad_frees; }
int fake_cuda_capturing(void) { return capturing; }

uint64_t fake_cuda_release_threshold(int device) {
  return device >= 0 && device < 16 ? release_threshold[device] : 0;
}

/* ---- device and errors --------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count) {
  enter("cudaGetDeviceCount");
  if (count == NULL) return kInvalidValue;
  *count = device_count;
  return device_count > 0 ? kSuccess : kNoDevice;
}

cudaError_t cudaGetDevice(int *device) {
  cudaError_t e = enter("cudaGetDevice");
  if (e) return e;
  if (device == NULL) return kInvalidValue;
  *device = current_device;
  return kSuccess;
}

cudaError_t cudaSetDevice(int device) {
  cudaError_t e = enter("cudaSetDevice");
  if (e) return e;
  if (device < 0 || device >= device_count) return kInvalidDevice;
  current_device = device;
  return kSuccess;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = enter("cudaGetLastError");
  if (e) return e;
  pthread_mutex_lock(&lock);
  e = pending_error;
  pending_error = kSuccess;
  pthread_mutex_unlock(&lock);
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  cudaError_t e = enter("cudaPeekAtLastError");
  return e ? e : pending_error;
}

const char *cudaGetErrorString(cudaError_t code) {
  enter("cudaGetErrorString");
  switch (code) {
    case 0: return "no error";
    case 1: return "invalid argument";
    case 2: return "out of memory";
    case 9: return "invalid configuration argument";
    case 100: return "no CUDA-capable device is detected";
    case 101: return "invalid device ordinal";
    case 400: return "invalid resource handle";
    case 700: return "an illegal memory access was encountered";
    case 716: return "misaligned address";
    case 719: return "unspecified launch failure";
    case 900: return "operation not permitted when stream is capturing";
    default: return "unknown error";
  }
}

const char *cudaGetErrorName(cudaError_t code) {
  enter("cudaGetErrorName");
  switch (code) {
    case 0: return "cudaSuccess";
    case 1: return "cudaErrorInvalidValue";
    case 2: return "cudaErrorMemoryAllocation";
    case 9: return "cudaErrorInvalidConfiguration";
    case 100: return "cudaErrorNoDevice";
    case 101: return "cudaErrorInvalidDevice";
    case 700: return "cudaErrorIllegalAddress";
    case 719: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}

cudaError_t cudaRuntimeGetVersion(int *version) {
  enter("cudaRuntimeGetVersion");
  if (version == NULL) return kInvalidValue;
  *version = 13000;
  return kSuccess;
}

cudaError_t cudaDriverGetVersion(int *version) {
  enter("cudaDriverGetVersion");
  if (version == NULL) return kInvalidValue;
  *version = 13000;
  return kSuccess;
}

/* ---- memory -------------------------------------------------------------- */

cudaError_t cudaMalloc(void **pointer, size_t size) {
  cudaError_t e = enter("cudaMalloc");
  return e ? e : allocate(pointer, size, 0);
}

cudaError_t cudaFree(void *pointer) {
  cudaError_t e = enter("cudaFree");
  return e ? e : release(pointer, 0);
}

cudaError_t cudaMallocAsync(void **pointer, size_t size, cudaStream_t stream) {
  cudaError_t e = enter_on("cudaMallocAsync", stream);
  if (e) return e;
  return allocate(pointer, size, 0);
}

cudaError_t cudaFreeAsync(void *pointer, cudaStream_t stream) {
  cudaError_t e = enter_on("cudaFreeAsync", stream);
  if (e) return e;
  return release(pointer, 0);
}

cudaError_t cudaDeviceGetDefaultMemPool(void **pool, int device) {
  cudaError_t e = enter("cudaDeviceGetDefaultMemPool");
  if (e) return e;
  if (pool == NULL) return kInvalidValue;
  if (device < 0 || device >= device_count || device >= 16) return kInvalidDevice;
  *pool = &pools[device];
  return kSuccess;
}

cudaError_t cudaMemPoolSetAttribute(void *pool, int attribute, void *value) {
  cudaError_t e = enter("cudaMemPoolSetAttribute");
  if (e) return e;
  char *p = pool;
  if (p < pools || p >= pools + 16 || value == NULL) return kInvalidValue;
  if (attribute == 4) release_threshold[p - pools] = *(uint64_t *)value; /* cudaMemPoolAttrReleaseThreshold */
  return kSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind) {
  cudaError_t e = enter("cudaMemcpy");
  if (e) return e;
  if (kind < 0 || kind > 4 || (count && (dst == NULL || src == NULL))) return kInvalidValue;
  if (count) memcpy(dst, src, count);
  return kSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t stream) {
  cudaError_t e = enter_on("cudaMemcpyAsync", stream);
  if (e) return e;
  if (kind < 0 || kind > 4 || (count && (dst == NULL || src == NULL))) return kInvalidValue;
  if (count) memcpy(dst, src, count);
  return kSuccess;
}

cudaError_t cudaHostAlloc(void **pointer, size_t size, unsigned int flags) {
  cudaError_t e = enter("cudaHostAlloc");
  (void)flags;
  return e ? e : allocate(pointer, size, 1);
}

cudaError_t cudaMallocHost(void **pointer, size_t size) {
  cudaError_t e = enter("cudaMallocHost");
  return e ? e : allocate(pointer, size, 1);
}

cudaError_t cudaFreeHost(void *pointer) {
  cudaError_t e = enter("cudaFreeHost");
  return e ? e : release(pointer, 1);
}

cudaError_t cudaMemsetAsync(void *pointer, int value, size_t count, cudaStream_t stream) {
  cudaError_t e = enter_on("cudaMemsetAsync", stream);
  if (e) return e;
  if (count && pointer == NULL) return kInvalidValue;
  if (count) memset(pointer, value, count);
  return kSuccess;
}

/* The layout of cudaPointerAttributes since CUDA 11. */
struct pointer_attributes {
  int type; /* 0 unregistered, 1 host, 2 device, 3 managed */
  int device;
  void *device_pointer;
  void *host_pointer;
};

/* Device blocks are found by their start only (tests ask about pointers they were given). */
cudaError_t cudaPointerGetAttributes(struct pointer_attributes *attributes, const void *pointer) {
  cudaError_t e = enter("cudaPointerGetAttributes");
  if (e) return e;
  if (attributes == NULL) return kInvalidValue;
  memset(attributes, 0, sizeof *attributes);
  attributes->device = -2;
  pthread_mutex_lock(&lock);
  for (struct block *b = blocks; b != NULL; b = b->next) {
    if (b->pointer == pointer) {
      attributes->type = b->pinned ? 1 : 2;
      attributes->device = current_device;
      attributes->device_pointer = b->pointer;
      attributes->host_pointer = b->pinned ? b->pointer : NULL;
    }
  }
  pthread_mutex_unlock(&lock);
  return kSuccess;
}

/* ---- streams and events -------------------------------------------------- */

/* Streams and events are small heap objects, so handles are distinct and non-zero. */
static cudaError_t new_handle(void **out) {
  if (out == NULL) return kInvalidValue;
  *out = malloc(16);
  return *out ? kSuccess : kMemoryAllocation;
}

static cudaError_t free_handle(const char *name, void *handle, cudaError_t if_null) {
  cudaError_t e = enter(name);
  if (e) return e;
  if (handle == NULL) return if_null;
  free(handle);
  return kSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  cudaError_t e = enter("cudaStreamCreate");
  return e ? e : new_handle(stream);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  cudaError_t e = enter("cudaStreamCreateWithFlags");
  (void)flags;
  return e ? e : new_handle(stream);
}

cudaError_t cudaStreamDestroy(void *stream) { return free_handle("cudaStreamDestroy", stream, kInvalidResourceHandle); }

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cudaError_t e = enter_on("cudaStreamSynchronize", stream);
  if (e) return e;
  return capturing ? kStreamCaptureUnsupported : kSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  cudaError_t e = enter("cudaDeviceSynchronize");
  if (e) return e;
  return capturing ? kStreamCaptureUnsupported : kSuccess;
}

cudaError_t cudaEventCreate(void **event) {
  cudaError_t e = enter("cudaEventCreate");
  return e ? e : new_handle(event);
}

cudaError_t cudaEventCreateWithFlags(void **event, unsigned int flags) {
  cudaError_t e = enter("cudaEventCreateWithFlags");
  (void)flags;
  return e ? e : new_handle(event);
}

cudaError_t cudaEventRecord(void *event, cudaStream_t stream) {
  cudaError_t e = enter_on("cudaEventRecord", stream);
  if (e) return e;
  return event ? kSuccess : kInvalidResourceHandle;
}

cudaError_t cudaEventSynchronize(void *event) {
  cudaError_t e = enter("cudaEventSynchronize");
  if (e) return e;
  return event ? kSuccess : kInvalidResourceHandle;
}

cudaError_t cudaEventQuery(void *event) {
  cudaError_t e = enter("cudaEventQuery");
  if (e) return e;
  return event ? kSuccess : kInvalidResourceHandle;
}

cudaError_t cudaEventDestroy(void *event) { return free_handle("cudaEventDestroy", event, kInvalidResourceHandle); }

cudaError_t cudaEventElapsedTime(float *ms, void *start, void *end) {
  cudaError_t e = enter("cudaEventElapsedTime");
  if (e) return e;
  if (ms == NULL || start == NULL || end == NULL) return kInvalidValue;
  *ms = 0.0f;
  return kSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, void *event, unsigned int flags) {
  cudaError_t e = enter_on("cudaStreamWaitEvent", stream);
  (void)flags;
  if (e) return e;
  return event ? kSuccess : kInvalidResourceHandle;
}

/* ---- graphs: capture is recorded, not replayed ---------------------------- */

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode) {
  cudaError_t e = enter_on("cudaStreamBeginCapture", stream);
  (void)mode;
  if (e) return e;
  if (stream == NULL) return kStreamCaptureUnsupported; /* the legacy stream cannot be captured */
  if (capturing) return kInvalidValue;
  capturing = 1;
  capture_stream = stream;
  return kSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, void **graph) {
  cudaError_t e = enter_on("cudaStreamEndCapture", stream);
  if (e) return e;
  if (!capturing || stream != capture_stream || graph == NULL) return kStreamCaptureInvalidated;
  capturing = 0;
  capture_stream = 0;
  return new_handle(graph);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, int *status) {
  cudaError_t e = enter("cudaStreamIsCapturing");
  if (e) return e;
  if (status == NULL) return kInvalidValue;
  *status = capturing && stream == capture_stream; /* cudaStreamCaptureStatusActive = 1 */
  return kSuccess;
}

static cudaError_t instantiate(const char *name, void **exec, void *graph) {
  cudaError_t e = enter(name);
  if (e) return e;
  if (graph == NULL) return kInvalidValue;
  return new_handle(exec);
}

cudaError_t cudaGraphInstantiate(void **exec, void *graph, unsigned long long flags) {
  (void)flags;
  return instantiate("cudaGraphInstantiate", exec, graph);
}

cudaError_t cudaGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  (void)flags;
  return instantiate("cudaGraphInstantiateWithFlags", exec, graph);
}

cudaError_t cudaGraphLaunch(void *exec, cudaStream_t stream) {
  cudaError_t e = enter_on("cudaGraphLaunch", stream);
  if (e) return e;
  return exec ? kSuccess : kInvalidValue;
}

cudaError_t cudaGraphDestroy(void *graph) { return free_handle("cudaGraphDestroy", graph, kInvalidValue); }

cudaError_t cudaGraphExecDestroy(void *exec) { return free_handle("cudaGraphExecDestroy", exec, kInvalidValue); }
