/*
 * opforge/parallel.h: opforge's thread pool for kernels.
 *
 *   opforge::parallel_for(begin, end, grain, [&](int64_t lo, int64_t hi) { ... });
 *
 * runs the function on consecutive ranges [lo, hi) that cover [begin, end),
 * each at least `grain` long (pick a grain that is worth a thread: tens of
 * thousands of cheap elements), on the calling thread and opforge's workers,
 * and returns when all are done.  Ranges run concurrently: write to disjoint
 * memory.  The pool has opforge.set_num_threads() threads (OPFORGE_NUM_THREADS;
 * default: the cores this process may use); a call inside a range, or while
 * another thread's kernel holds the pool, runs serially.  An exception thrown
 * by the function is rethrown here once every range has finished.
 *
 * The pool is opforge's (its _native extension).  A library built with this
 * header links nothing: it holds one pointer, opforge_parallel_api, which opforge
 * sets to the pool's entry points when it loads the library.  Loaded by anything
 * else, the pointer stays null and the loops run serially.  (opforge puts nothing
 * into the process's global symbol scope: it would change which definitions the
 * libraries loaded after it bind to.)
 */
#ifndef OPFORGE_PARALLEL_H_
#define OPFORGE_PARALLEL_H_

#include <cstdint>
#include <exception>
#include <mutex>

extern "C" {
typedef void (*OpforgeRangeFn)(int64_t begin, int64_t end, void *context);

/* The pool's entry points (csrc/parallel.cc). */
typedef struct OpforgeParallelApi {
  int (*parallel_for)(int64_t begin, int64_t end, int64_t grain, OpforgeRangeFn fn, void *context);
  int (*threads)(void);
  int (*thread_index)(void);
} OpforgeParallelApi;

/* Set by opforge when it loads the library.  Weak: every file of a library that
 * includes this header shares the one pointer. */
__attribute__((weak, visibility("default"))) const OpforgeParallelApi *opforge_parallel_api = 0;
}

namespace opforge {

/* Threads in opforge's pool (1 where there is none). */
inline int num_threads() { return opforge_parallel_api ? opforge_parallel_api->threads() : 1; }

/* Which of them runs the calling code: 0 for the thread that called the kernel. */
inline int thread_index() { return opforge_parallel_api ? opforge_parallel_api->thread_index() : 0; }

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F &f) {
  if (end <= begin) return;
  const OpforgeParallelApi *pool = opforge_parallel_api;
  if (!pool || end - begin <= grain) {
    f(begin, end);
    return;
  }
  struct Context {
    const F *f;
    std::mutex lock;
    std::exception_ptr error;
  } context{&f, {}, nullptr};
  pool->parallel_for(
      begin, end, grain,
      [](int64_t lo, int64_t hi, void *raw) {
        auto *c = static_cast<Context *>(raw);
        try {
          (*c->f)(lo, hi);
        } catch (...) {
          std::lock_guard<std::mutex> hold(c->lock);
          if (!c->error) c->error = std::current_exception();
        }
      },
      &context);
  if (context.error) std::rethrow_exception(context.error);
}

}  // namespace opforge

#endif  // OPFORGE_PARALLEL_H_
