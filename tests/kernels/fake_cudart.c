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
 *   fake_cuda_fail_next(name, code)  the next call of `name` fails with code, which also becomes the last
 *                                    error (as a real failed call leaves it for cudaGetLastError)
 *   fake_cuda_set_device_count(n)    what cudaGetDeviceCount reports (default 1)
 *   fake_cuda_live_device_blocks()   device allocations made since the last reset and not yet freed
 *   fake_cuda_live_host_blocks()     pinned host allocations made since the last reset and not yet freed
 *   fake_cuda_bad_frees()            frees of pointers this runtime never handed out
 *   fake_cuda_release_threshold(dev) the last cudaMemPoolAttrReleaseThreshold set on dev's default pool
 *   fake_cuda_pool_threshold(pool)   the same for any pool (a default one or one from cudaMemPoolCreate)
 *   fake_cuda_pool_of(pointer)       the pool a live device block came from (its device's default pool
 *                                    for cudaMallocAsync); null for other pointers
 *   fake_cuda_default_pool(dev)      dev's default pool
 *   fake_cuda_capturing()            1 while a stream capture is open
 *   fake_cuda_log_size()             stream-ordered calls logged since the last reset (at most kLogSize kept)
 *   fake_cuda_log_entry(i, &name, &stream, &object, &device)
 *                                    the i-th of them: the call's name, its stream, what it acted on (the
 *                                    pointer allocated, freed, copied to or set; the event recorded or waited
 *                                    for; the graph launched) and the device current then; 0 if i is out of range
 *   fake_cuda_dead_stream_uses()     calls given a stream that cudaStreamDestroy had destroyed
 *   fake_cuda_set_events_pending(on) cudaEventQuery reports cudaErrorNotReady (and leaves it as the last
 *                                    error, the worst a runtime may do) instead of success
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
  kNotReady = 600,
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
    "cudaMemsetAsync", "cudaPointerGetAttributes", "cudaMemPoolCreate", "cudaMemPoolDestroy",
    "cudaMallocFromPoolAsync", "cudaMemPoolGetAttribute",
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
static long dead_stream_uses = 0;
static int events_pending = 0;
static int fail_call = -1; /* fake_cuda_fail_next: the call that fails next, and with what */
static cudaError_t fail_code = kSuccess;

/* Memory pools: one default pool per device, and those cudaMemPoolCreate made (never freed: tests make few). */
struct pool {
  int device;
  uint64_t release_threshold;
};
static struct pool default_pools[16];
enum { kMaxCreatedPools = 64 };
static struct pool *created_pools[kMaxCreatedPools];
static int created_pool_count = 0;

static int is_pool(void *p) {
  if ((struct pool *)p >= default_pools && (struct pool *)p < default_pools + 16) return 1;
  for (int i = 0; i < created_pool_count; i++)
    if (created_pools[i] == p) return 1;
  return 0;
}

/* Streams cudaStreamCreate* made; a destroyed one stays listed (dead) so later uses are caught. */
enum { kMaxStreams = 256 };
static struct {
  void *handle;
  int dead;
} streams[kMaxStreams];
static int stream_count = 0;

/* The stream-ordered calls, in order. */
enum { kLogSize = 4096 };
static struct {
  int call;
  void *stream;
  void *object;
  int device;
} call_log[kLogSize];
static long log_size = 0;

/* Live allocations, a singly linked list (tests make few). */
struct block {
  void *pointer;
  int pinned;
  void *pool;
  long generation; /* the reset it was made after: memory earlier tests keep for good is not counted */
  struct block *next;
};
static long generation = 0;
static struct block *blocks = NULL;

static int index_of(const char *name) {
  for (int i = 0; i < kCallCount; i++)
    if (strcmp(kCallNames[i], name) == 0) return i;
  return -1;
}

/* Counts the call; returns the sticky error, if any, or the failure fake_cuda_fail_next set for it, which the
 * call then returns. */
static cudaError_t enter(const char *name) {
  int i = index_of(name);
  pthread_mutex_lock(&lock);
  if (i >= 0) counts[i]++;
  cudaError_t e = sticky_error;
  if (!e && i >= 0 && i == fail_call) {
    e = pending_error = fail_code;
    fail_call = -1;
  }
  pthread_mutex_unlock(&lock);
  return e;
}

static int stream_is_dead(cudaStream_t stream) {
  for (int i = 0; i < stream_count; i++)
    if (streams[i].handle == stream) return streams[i].dead;
  return 0;
}

/* Notes the stream and logs the call; a stream that was destroyed is counted (and fails the call). */
static int note_stream(const char *name, cudaStream_t stream, void *object) {
  pthread_mutex_lock(&lock);
  last_stream = stream;
  int dead = stream_is_dead(stream);
  dead_stream_uses += dead;
  if (log_size < kLogSize) {
    call_log[log_size].call = index_of(name);
    call_log[log_size].stream = stream;
    call_log[log_size].object = object;
    call_log[log_size].device = current_device;
  }
  log_size++;
  pthread_mutex_unlock(&lock);
  return dead;
}

/* Sets what the latest logged call acted on (an allocation's pointer, known once it succeeded). */
static void log_object(void *object) {
  pthread_mutex_lock(&lock);
  if (log_size > 0 && log_size <= kLogSize) call_log[log_size - 1].object = object;
  pthread_mutex_unlock(&lock);
}

/* enter() for a call that takes a stream: the stream is noted and the call logged even when it fails. */
static cudaError_t enter_on(const char *name, cudaStream_t stream, void *object) {
  cudaError_t e = enter(name);
  if (note_stream(name, stream, object) && !e) e = kInvalidResourceHandle;
  return e;
}

static void remember(void *pointer, int pinned, void *pool) {
  struct block *b = malloc(sizeof *b);
  if (b == NULL) return;
  pthread_mutex_lock(&lock);
  b->pointer = pointer;
  b->pinned = pinned;
  b->pool = pool;
  b->generation = generation;
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
  for (struct block *b = blocks; b != NULL; b = b->next) n += b->pinned == pinned && b->generation == generation;
  pthread_mutex_unlock(&lock);
  return n;
}

static cudaError_t allocate(void **out, size_t size, int pinned, void *pool) {
  if (out == NULL) return kInvalidValue;
  void *p = malloc(size ? size : 1);
  if (p == NULL) return kMemoryAllocation;
  remember(p, pinned, pool);
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
  for (int i = 0; i < 16; i++) default_pools[i].release_threshold = 0;
  log_size = 0;
  generation++;
  dead_stream_uses = 0;
  events_pending = 0;
  pending_error = sticky_error = kSuccess;
  fail_call = -1;
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

void fake_cuda_fail_next(const char *name, int code) {
  pthread_mutex_lock(&lock);
  fail_call = index_of(name);
  fail_code = code;
  pthread_mutex_unlock(&lock);
}

void fake_cuda_set_device_count(int n) { device_count = n; }
long fake_cuda_live_device_blocks(void) { return live(0); }
long fake_cuda_live_host_blocks(void) { return live(1); }
long fake_cuda_bad_frees(void) { return bad_frees; }
int fake_cuda_capturing(void) { return capturing; }

uint64_t fake_cuda_release_threshold(int device) {
  return device >= 0 && device < 16 ? default_pools[device].release_threshold : 0;
}

uint64_t fake_cuda_pool_threshold(void *pool) { return is_pool(pool) ? ((struct pool *)pool)->release_threshold : 0; }

void *fake_cuda_default_pool(int device) { return device >= 0 && device < 16 ? &default_pools[device] : NULL; }

void *fake_cuda_pool_of(void *pointer) {
  void *pool = NULL;
  pthread_mutex_lock(&lock);
  for (struct block *b = blocks; b != NULL; b = b->next)
    if (b->pointer == pointer && !b->pinned) pool = b->pool;
  pthread_mutex_unlock(&lock);
  return pool;
}

long fake_cuda_log_size(void) { return log_size; }

int fake_cuda_log_entry(long i, const char **name, void **stream, void **object, int *device) {
  if (i < 0 || i >= log_size || i >= kLogSize) return 0;
  *name = call_log[i].call >= 0 ? kCallNames[call_log[i].call] : "?";
  *stream = call_log[i].stream;
  *object = call_log[i].object;
  *device = call_log[i].device;
  return 1;
}

long fake_cuda_dead_stream_uses(void) { return dead_stream_uses; }

void fake_cuda_set_events_pending(int on) { events_pending = on; }

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
  return e ? e : allocate(pointer, size, 0, NULL);
}

cudaError_t cudaFree(void *pointer) {
  cudaError_t e = enter("cudaFree");
  return e ? e : release(pointer, 0);
}

cudaError_t cudaMallocAsync(void **pointer, size_t size, cudaStream_t stream) {
  cudaError_t e = enter_on("cudaMallocAsync", stream, NULL);
  if (e) return e;
  e = allocate(pointer, size, 0, &default_pools[current_device]);
  if (!e) log_object(*pointer);
  return e;
}

cudaError_t cudaFreeAsync(void *pointer, cudaStream_t stream) {
  cudaError_t e = enter_on("cudaFreeAsync", stream, pointer);
  if (e) return e;
  return release(pointer, 0);
}

cudaError_t cudaDeviceGetDefaultMemPool(void **pool, int device) {
  cudaError_t e = enter("cudaDeviceGetDefaultMemPool");
  if (e) return e;
  if (pool == NULL) return kInvalidValue;
  if (device < 0 || device >= device_count || device >= 16) return kInvalidDevice;
  *pool = &default_pools[device];
  return kSuccess;
}

/* The layout of cudaMemPoolProps's first members (the rest must be zero). */
struct pool_props {
  int alloc_type;   /* 1: cudaMemAllocationTypePinned */
  int handle_types; /* 0: none */
  int location_type; /* 1: cudaMemLocationTypeDevice */
  int location_id;
};

cudaError_t cudaMemPoolCreate(void **pool, const struct pool_props *props) {
  cudaError_t e = enter("cudaMemPoolCreate");
  if (e) return e;
  if (pool == NULL || props == NULL || props->alloc_type != 1 || props->location_type != 1) return kInvalidValue;
  if (props->location_id < 0 || props->location_id >= device_count) return kInvalidDevice;
  if (created_pool_count == kMaxCreatedPools) return kMemoryAllocation;
  struct pool *p = calloc(1, sizeof *p);
  if (p == NULL) return kMemoryAllocation;
  p->device = props->location_id;
  created_pools[created_pool_count++] = p;
  *pool = p;
  return kSuccess;
}

cudaError_t cudaMemPoolDestroy(void *pool) {
  cudaError_t e = enter("cudaMemPoolDestroy");
  if (e) return e;
  return is_pool(pool) ? kSuccess : kInvalidValue; /* kept: tests may still ask about it */
}

cudaError_t cudaMallocFromPoolAsync(void **pointer, size_t size, void *pool, cudaStream_t stream) {
  cudaError_t e = enter_on("cudaMallocFromPoolAsync", stream, NULL);
  if (e) return e;
  if (!is_pool(pool)) return kInvalidValue;
  e = allocate(pointer, size, 0, pool);
  if (!e) log_object(*pointer);
  return e;
}

cudaError_t cudaMemPoolSetAttribute(void *pool, int attribute, void *value) {
  cudaError_t e = enter("cudaMemPoolSetAttribute");
  if (e) return e;
  if (!is_pool(pool) || value == NULL) return kInvalidValue;
  if (attribute == 4) ((struct pool *)pool)->release_threshold = *(uint64_t *)value; /* ReleaseThreshold */
  return kSuccess;
}

cudaError_t cudaMemPoolGetAttribute(void *pool, int attribute, void *value) {
  cudaError_t e = enter("cudaMemPoolGetAttribute");
  if (e) return e;
  if (!is_pool(pool) || value == NULL) return kInvalidValue;
  *(uint64_t *)value = attribute == 4 ? ((struct pool *)pool)->release_threshold : 0;
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
  cudaError_t e = enter_on("cudaMemcpyAsync", stream, dst);
  if (e) return e;
  if (kind < 0 || kind > 4 || (count && (dst == NULL || src == NULL))) return kInvalidValue;
  if (count) memcpy(dst, src, count);
  return kSuccess;
}

cudaError_t cudaHostAlloc(void **pointer, size_t size, unsigned int flags) {
  cudaError_t e = enter("cudaHostAlloc");
  (void)flags;
  return e ? e : allocate(pointer, size, 1, NULL);
}

cudaError_t cudaMallocHost(void **pointer, size_t size) {
  cudaError_t e = enter("cudaMallocHost");
  return e ? e : allocate(pointer, size, 1, NULL);
}

cudaError_t cudaFreeHost(void *pointer) {
  cudaError_t e = enter("cudaFreeHost");
  return e ? e : release(pointer, 1);
}

cudaError_t cudaMemsetAsync(void *pointer, int value, size_t count, cudaStream_t stream) {
  cudaError_t e = enter_on("cudaMemsetAsync", stream, pointer);
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

/* A stream is listed for good (a destroyed one is marked dead, not freed, so its handle is never reused). */
static cudaError_t new_stream(cudaStream_t *stream) {
  cudaError_t e = new_handle(stream);
  if (e) return e;
  pthread_mutex_lock(&lock);
  if (stream_count < kMaxStreams) {
    streams[stream_count].handle = *stream;
    streams[stream_count++].dead = 0;
  }
  pthread_mutex_unlock(&lock);
  return kSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  cudaError_t e = enter("cudaStreamCreate");
  return e ? e : new_stream(stream);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  cudaError_t e = enter("cudaStreamCreateWithFlags");
  (void)flags;
  return e ? e : new_stream(stream);
}

cudaError_t cudaStreamDestroy(void *stream) {
  cudaError_t e = enter("cudaStreamDestroy");
  if (e) return e;
  if (stream == NULL) return kInvalidResourceHandle;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < stream_count; i++) {
    if (streams[i].handle == stream) {
      e = streams[i].dead ? kInvalidResourceHandle : kSuccess;
      streams[i].dead = 1;
    }
  }
  pthread_mutex_unlock(&lock);
  return e;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cudaError_t e = enter_on("cudaStreamSynchronize", stream, NULL);
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
  cudaError_t e = enter_on("cudaEventRecord", stream, event);
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
  if (event == NULL) return kInvalidResourceHandle;
  if (!events_pending) return kSuccess;
  pthread_mutex_lock(&lock);
  if (pending_error == kSuccess) pending_error = kNotReady;
  pthread_mutex_unlock(&lock);
  return kNotReady;
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
  cudaError_t e = enter_on("cudaStreamWaitEvent", stream, event);
  (void)flags;
  if (e) return e;
  return event ? kSuccess : kInvalidResourceHandle;
}

/* ---- graphs: capture is recorded, not replayed ---------------------------- */

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode) {
  cudaError_t e = enter_on("cudaStreamBeginCapture", stream, NULL);
  (void)mode;
  if (e) return e;
  if (stream == NULL) return kStreamCaptureUnsupported; /* the legacy stream cannot be captured */
  if (capturing) return kInvalidValue;
  capturing = 1;
  capture_stream = stream;
  return kSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, void **graph) {
  cudaError_t e = enter_on("cudaStreamEndCapture", stream, NULL);
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
  cudaError_t e = enter_on("cudaGraphLaunch", stream, exec);
  if (e) return e;
  return exec ? kSuccess : kInvalidValue;
}

cudaError_t cudaGraphDestroy(void *graph) { return free_handle("cudaGraphDestroy", graph, kInvalidValue); }

cudaError_t cudaGraphExecDestroy(void *exec) { return free_handle("cudaGraphExecDestroy", exec, kInvalidValue); }
