// opforge's thread pool: one per process, for built-in and user kernels alike.
//
// Kernels reach it through include/opforge/parallel.h: each kernel library
// holds a pointer, opforge_parallel_api, that runtime/parallel.py sets to
// opforge_parallel_table below when the library is loaded; where it stays null
// a kernel runs serially.
//
// opforge_parallel_for(begin, end, grain, fn, context) splits [begin, end)
// into chunks of at least `grain` and runs fn(chunk_begin, chunk_end,
// context) on the calling thread and the pool's workers, returning when all
// chunks are done.  The caller takes chunks too, and waits for the chunks to
// be done, never for a worker to turn up: a worker that wakes late (waking a
// sleeping thread cost 50-150 us on the virtual machines measured, more than
// a short kernel's whole run) finds the job finished and sleeps again, so a
// parallel call is never much slower than a serial one.  Workers poll for the
// next job for kWorkerSpin after each before sleeping on a condition variable
// (back-to-back kernels then start on both threads at once); an idle pool
// takes no CPU from NumPy's or torch's threads.  A caller done with its
// chunks polls for the others' end for a short while (kSpin) before
// sleeping.  A call from inside a chunk, or while another thread holds the
// pool, runs serially on its caller: threads never pile up.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <thread>
#include <vector>

#include "../include/opforge/parallel.h"

using RangeFn = void (*)(int64_t, int64_t, void *);

namespace {

thread_local int thread_index = 0;        // 0: a caller; workers are 1..n-1
thread_local bool inside_a_chunk = false;

constexpr auto kSpin = std::chrono::microseconds(200);
constexpr auto kWorkerSpin = std::chrono::microseconds(100);

// Polls `ready` until it holds or `spin` has passed; whether it held.
template <typename Ready>
bool SpinUntil(const Ready &ready, std::chrono::microseconds spin = kSpin) {
  const auto until = std::chrono::steady_clock::now() + spin;
  for (int k = 0;; ++k) {
    if (ready()) return true;
    if ((k & 63) == 63 && std::chrono::steady_clock::now() >= until) return false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

// One parallel call.  Chunks are claimed through `claim`: the job's number in the high 32 bits, the
// next chunk in the low ones, so a worker still holding an earlier job's copy claims nothing of a
// later job's (its compare-and-swap fails on the number).
struct Job {
  uint32_t number = 0;
  int64_t begin = 0, end = 0, chunks = 0;
  RangeFn fn = nullptr;
  void *context = nullptr;
};

class Pool {
 public:
  explicit Pool(int threads) : threads_(std::max(threads, 1)) {
    try {
      for (int k = 1; k < threads_; ++k) workers_.emplace_back([this, k] { Work(k); });
    } catch (...) {  // a thread could not start: end those that did, and let the caller run serially
      Stop();
      throw;
    }
  }

  ~Pool() { Stop(); }

  int threads() const { return threads_; }

  // Runs the job on this thread and every worker that comes; false when the pool is busy (the caller
  // runs it serially).
  bool Run(int64_t begin, int64_t end, int64_t grain, RangeFn fn, void *context) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    Job job;
    {
      std::lock_guard<std::mutex> hold(mutex_);
      job = {++number_, begin, end, std::min<int64_t>((end - begin + grain - 1) / grain, int64_t(threads_) * 4),
             fn, context};
      job_ = job;
      done_.store(0, std::memory_order_relaxed);
      claim_.store(uint64_t(job.number) << 32, std::memory_order_release);
    }
    wake_.notify_all();
    Chunks(job);
    const auto finished = [&] { return done_.load(std::memory_order_acquire) == job.chunks; };
    if (SpinUntil(finished)) return true;
    std::unique_lock<std::mutex> hold(mutex_);
    all_done_.wait(hold, finished);
    return true;
  }

 private:
  void Stop() {
    {
      std::lock_guard<std::mutex> hold(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread &worker : workers_) worker.join();
    workers_.clear();
  }

  // Runs chunks of `job` until none is left to claim (or a later job has replaced it).  fn must not
  // throw (opforge/parallel.h's wrapper catches and rethrows on the caller).
  void Chunks(const Job &job) {
    inside_a_chunk = true;
    const int64_t n = job.end - job.begin;
    for (uint64_t seen = claim_.load(std::memory_order_acquire);;) {
      if (uint32_t(seen >> 32) != job.number || int64_t(seen & 0xffffffffu) >= job.chunks) break;
      if (!claim_.compare_exchange_weak(seen, seen + 1, std::memory_order_acq_rel, std::memory_order_acquire))
        continue;  // (seen now holds the current value)
      const int64_t c = int64_t(seen & 0xffffffffu);
      job.fn(job.begin + n * c / job.chunks, job.begin + n * (c + 1) / job.chunks, job.context);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == job.chunks) {
        std::lock_guard<std::mutex> hold(mutex_);  // (the caller checks under it before it sleeps)
        all_done_.notify_one();
      }
      seen = claim_.load(std::memory_order_acquire);
    }
    inside_a_chunk = false;
  }

  void Work(int index) {
    thread_index = index;
    uint32_t seen = 0;
    for (;;) {
      // the next job, if it comes soon, without sleeping
      SpinUntil([&] { return uint32_t(claim_.load(std::memory_order_acquire) >> 32) != seen; }, kWorkerSpin);
      Job job;
      {
        std::unique_lock<std::mutex> hold(mutex_);  // the job was written under this lock
        wake_.wait(hold, [&] { return stopping_ || job_.number != seen; });
        if (stopping_) return;
        job = job_;
        seen = job.number;
      }
      Chunks(job);
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable wake_, all_done_;
  bool stopping_ = false;
  uint32_t number_ = 0;  // the last job's number (under mutex_)
  Job job_;              // the current job (under mutex_)
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};  // the current job's chunks done
};

std::mutex pool_mutex;
std::shared_ptr<Pool> pool;  // made at first use; a replaced pool lives until its last job returns
int wanted_threads = 1;

// A forked child has none of the parent's workers: it makes a pool of its own
// at its first parallel call (the parent's is left behind, never joined).
void PrepareFork() { pool_mutex.lock(); }
void AfterForkInParent() { pool_mutex.unlock(); }
void AfterForkInChild() {
  new std::shared_ptr<Pool>(std::move(pool));  // leaked on purpose: its threads are not in this process
  pool_mutex.unlock();
}
[[maybe_unused]] const int fork_handlers = pthread_atfork(PrepareFork, AfterForkInParent, AfterForkInChild);

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int opforge_parallel_for(int64_t begin, int64_t end, int64_t grain,
                                                                  RangeFn fn, void *context) {
  if (end <= begin) return 0;
  grain = std::max<int64_t>(grain, 1);
  std::shared_ptr<Pool> current;
  {
    std::lock_guard<std::mutex> hold(pool_mutex);
    if (pool == nullptr && wanted_threads > 1 && !inside_a_chunk) {
      try {
        pool = std::make_shared<Pool>(wanted_threads);
      } catch (...) {  // no threads to be had: this call runs serially, the next tries again
      }
    }
    current = pool;
  }
  if (current == nullptr || current->threads() == 1 || inside_a_chunk || end - begin <= grain ||
      !current->Run(begin, end, grain, fn, context))
    fn(begin, end, context);
  return 0;
}

__attribute__((visibility("default"))) int opforge_parallel_threads(void) {
  std::lock_guard<std::mutex> hold(pool_mutex);
  return wanted_threads;
}

__attribute__((visibility("default"))) int opforge_parallel_thread_index(void) { return thread_index; }

// Sets the pool's size (threads, the caller included).  A kernel on another
// thread may still run on the pool being replaced: the last one out ends it.
__attribute__((visibility("default"))) void opforge_set_num_threads(int threads) {
  threads = std::max(threads, 1);
  std::shared_ptr<Pool> replaced;  // ended (its workers joined) after the lock is released
  std::lock_guard<std::mutex> hold(pool_mutex);
  if (threads == wanted_threads) return;
  replaced = std::move(pool);  // the next parallel call makes one of the new size
  wanted_threads = threads;
}

// What parallel.h's opforge_parallel_api points to in every kernel library opforge loads.
__attribute__((visibility("default"))) extern const OpforgeParallelApi opforge_parallel_table;
const OpforgeParallelApi opforge_parallel_table = {opforge_parallel_for, opforge_parallel_threads,
                                                   opforge_parallel_thread_index};

}  // extern "C"
