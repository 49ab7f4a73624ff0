// Vector sums for kernels whose element type is T (typedef'd before this header):
// 32-byte vectors of GCC's vector extensions (one AVX register, two SSE ones),
// summed in four chains (the adds' latency overlaps) and block by block into a
// double, so a float32 lane holds at most kLaneBlock / kLanes terms.
#ifndef OPFORGE_BUILTINS_LANES_H_
#define OPFORGE_BUILTINS_LANES_H_

#include <algorithm>
#include <cstdint>

typedef T V __attribute__((vector_size(32)));
const int kLanes = sizeof(V) / sizeof(T);
const int64_t kLaneBlock = 4096;

inline V Load(const T *p) {
  V v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// The sum of a vector's lanes, as a tree of halves (E: the lanes' type).
template <typename E, typename W>
inline E SumLanes(W v) {
  if constexpr (sizeof(W) / sizeof(E) == 8) {
    auto h = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
    auto q = __builtin_shufflevector(h, h, 0, 1) + __builtin_shufflevector(h, h, 2, 3);
    return q[0] + q[1];
  } else {
    auto h = __builtin_shufflevector(v, v, 0, 1) + __builtin_shufflevector(v, v, 2, 3);
    return h[0] + h[1];
  }
}

// The sum of f(x[i]) for i < n (f maps a V and a T alike).
template <typename F>
double LaneSum(const T *x, int64_t n, F f) {
  double total = 0;
  int64_t i = 0;
  while (n - i >= kLanes) {
    const int64_t end = i + std::min(kLaneBlock, (n - i) / kLanes * kLanes);
    V a = {}, b = {}, c = {}, d = {};
    for (; i + 4 * kLanes <= end; i += 4 * kLanes) {
      a += f(Load(x + i));
      b += f(Load(x + i + kLanes));
      c += f(Load(x + i + 2 * kLanes));
      d += f(Load(x + i + 3 * kLanes));
    }
    for (; i < end; i += kLanes) a += f(Load(x + i));
    total += SumLanes<T>((a + b) + (c + d));
  }
  for (; i < n; i++) total += f(x[i]);
  return total;
}

#endif  // OPFORGE_BUILTINS_LANES_H_
