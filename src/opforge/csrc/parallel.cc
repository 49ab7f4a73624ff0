// opforge's thread pool: one per process, for built-in and user kernels alike.
//
// Kernels reach it through include/opforge/parallel.h, whose functions are
// these C symbols: opforge loads this extension into the global symbol scope
// (runtime/parallel.py) before any kernel library, so the loader resolves a
// kernel's references to them; without them a kernel runs serially.
//
// opforge_parallel_for(begin, end, grain, fn, context) splits [begin, end)
// into chunks of at least `grain` and runs fn(chunk_begin, chunk_end,
// context) on the calling thread and the pool's workers, returning when all
// chunks are done.  Workers sleep on a condition variable between calls, so
// an idle pool takes no CPU from NumPy's or torch's BLAS threads (workers that
// spun for the next job took cores from OpenBLAS's threads in a model's
// matmuls).  A caller done with its chunks polls for the workers' end for a
// short while (kSpin) before sleeping: waking it would cost tens of
// microseconds, as much as a short kernel's whole run.  A call from
// inside a chunk, or while another thread holds the pool, runs serially on
// its caller: threads never pile up.
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

using RangeFn = void (*)(int64_t, int64_t, void *);

namespace {

thread_local int thread_index = 0;        // 0: a caller; workers are 1..n-1
thread_local bool inside_a_chunk = false;

constexpr auto kSpin = std::chrono::microseconds(200);

// Polls `ready` until it holds or kSpin has passed; whether it held.
template <typename Ready>
bool SpinUntil(const Ready &ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int k = 0;; ++k) {
    if (ready()) return true;
    if ((k & 63) == 63 && std::chrono::steady_clock::now() >= until) return false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

class Pool {
 public:
  explicit Pool(int threads) : threads_(std::max(threads, 1)) {
    for (int k = 1; k < threads_; ++k) workers_.emplace_back([this, k] { Work(k); });
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> hold(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread &worker : workers_) worker.join();
  }

  int threads() const { return threads_; }

  // Runs the job on this thread and every worker; false when the pool is busy (the caller runs it serially).
  bool Run(int64_t begin, int64_t end, int64_t grain, RangeFn fn, void *context) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    const int64_t n = end - begin;
    const int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, int64_t(threads_) * 4);
    {
      std::lock_guard<std::mutex> hold(mutex_);
      begin_ = begin;
      end_ = end;
      chunks_ = chunks;
      fn_ = fn;
      context_ = context;
      next_.store(0, std::memory_order_relaxed);
      active_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    Chunks();
    if (SpinUntil([this] { return active_.load(std::memory_order_acquire) == 0; })) return true;
    std::unique_lock<std::mutex> hold(mutex_);
    done_.wait(hold, [this] { return active_.load(std::memory_order_acquire) == 0; });
    return true;
  }

 private:
  void Chunks() {
    inside_a_chunk = true;
    for (int64_t c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < chunks_;) {
      const int64_t n = end_ - begin_;
      fn_(begin_ + n * c / chunks_, begin_ + n * (c + 1) / chunks_, context_);
    }
    inside_a_chunk = false;
  }

  void Work(int index) {
    thread_index = index;
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> hold(mutex_);  // the job's fields were written under this lock
        wake_.wait(hold, [&] { return stopping_ || generation_.load(std::memory_order_relaxed) != seen; });
        if (stopping_) return;
        seen = generation_.load(std::memory_order_relaxed);
      }
      Chunks();
      std::lock_guard<std::mutex> hold(mutex_);
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_.notify_one();
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  bool stopping_ = false;
  std::atomic<uint64_t> generation_{0};  // changed under mutex_; read without it while spinning
  std::atomic<int> active_{0};
  int64_t begin_ = 0, end_ = 0, chunks_ = 0;
  RangeFn fn_ = nullptr;
  void *context_ = nullptr;
  std::atomic<int64_t> next_{0};
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
    if (pool == nullptr && wanted_threads > 1 && !inside_a_chunk) pool = std::make_shared<Pool>(wanted_threads);
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

}  // extern "C"
