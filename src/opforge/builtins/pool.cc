// max_pool, max_pool_with_indices, their gradients, average_pool and
// average_pool_grad: NC + 1 to 3 spatial dims (ONNX MaxPool / AveragePool).
//
// Every spatial rank runs through one 3-D loop: 1-D and 2-D inputs get
// leading spatial dims of size 1 (kernel 1, stride 1, no padding).  For each
// output position along an axis the taps that land inside x are worked out
// once (first, last), so the inner loops have no bounds tests.  The (sample,
// channel) planes run on opforge's pool.  The op's check has validated the
// attributes and inference the output shape.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

namespace {

// Planes (N * C of them) are independent: they run on opforge's pool, in ranges of about this much work.
const int64_t kParallelWork = 1 << 15;

struct Axis {
  int64_t in = 1, out = 1, k = 1, s = 1, d = 1, pb = 0, pe = 0;
  std::vector<int64_t> first, last, padded;  // per output: taps [first, last) inside x; taps inside the padding too
};

struct Geometry {
  int64_t planes = 0;  // N * C
  Axis axis[3];
  int64_t in_size() const { return axis[0].in * axis[1].in * axis[2].in; }
  int64_t out_size() const { return axis[0].out * axis[1].out * axis[2].out; }
};

// Calls body(lo, hi) for ranges of planes on the pool, each worth a thread (per plane: its input and
// output, times the kernel's taps for `window` work).
template <typename Body>
void ForPlanes(const Geometry &g, bool window, Body body) {
  const int64_t taps = window ? g.axis[0].k * g.axis[1].k * g.axis[2].k : 1;
  const int64_t work = g.in_size() + g.out_size() * taps;
  opforge::parallel_for(0, g.planes, std::max<int64_t>(1, kParallelWork / std::max<int64_t>(1, work)), body);
}

// The geometry of x (params[0] shape) pooled into y (shape `out`); false on bad attributes.
bool ReadGeometry(AotExtra *extra, int rank, const int64_t *x, const int64_t *out, Geometry *g) {
  const int sp = rank - 2;
  if (sp < 1 || sp > 3) return false;
  std::vector<int64_t> k = extra->Attr<std::vector<int64_t>>("kernel_shape");
  std::vector<int64_t> s = extra->Attr<std::vector<int64_t>>("strides");
  std::vector<int64_t> p = extra->Attr<std::vector<int64_t>>("pads");
  std::vector<int64_t> d;
  if (extra->HasAttr("dilations")) d = extra->Attr<std::vector<int64_t>>("dilations");
  if (static_cast<int>(k.size()) != sp || (!s.empty() && static_cast<int>(s.size()) != sp) ||
      (!p.empty() && static_cast<int>(p.size()) != 2 * sp) || (!d.empty() && static_cast<int>(d.size()) != sp))
    return false;
  g->planes = x[0] * x[1];
  for (int j = 0; j < sp; j++) {
    Axis &a = g->axis[3 - sp + j];
    a.in = x[2 + j];
    a.out = out[2 + j];
    a.k = k[j];
    a.s = s.empty() ? 1 : s[j];
    a.d = d.empty() ? 1 : d[j];
    a.pb = p.empty() ? 0 : p[j];
    a.pe = p.empty() ? 0 : p[sp + j];
    if (a.k < 1 || a.s < 1 || a.d < 1) return false;
  }
  for (Axis &a : g->axis) {
    a.first.resize(a.out);
    a.last.resize(a.out);
    a.padded.resize(a.out);
    for (int64_t o = 0; o < a.out; o++) {
      const int64_t start = o * a.s - a.pb;
      int64_t first = start >= 0 ? 0 : (-start + a.d - 1) / a.d;
      int64_t last = start > a.in - 1 ? 0 : (a.in - 1 - start) / a.d + 1;
      if (last > a.k) last = a.k;
      if (first > last) first = last;
      a.first[o] = first;
      a.last[o] = last;
      // taps inside [-pb, in + pe): count_include_pad's divisor
      int64_t limit = a.in + a.pe - start;  // taps k with k * d < limit
      int64_t padded = limit <= 0 ? 0 : (limit - 1) / a.d + 1;
      a.padded[o] = padded > a.k ? a.k : padded;
    }
  }
  return true;
}

// What a window of padding only gives: -inf, or the type's lowest value.
template <typename T>
inline T Lowest() {
  return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                              : std::numeric_limits<T>::lowest();
}

// A tap as the passes compare it: NaN read as -inf.  A later tap must be strictly greater to win and
// -inf never is, so NaN never wins -- except as a window's first tap, which FirstRow lets win.
template <typename T>
inline T Clean(T v) {
  if constexpr (std::numeric_limits<T>::has_quiet_NaN) return v == v ? v : -std::numeric_limits<T>::infinity();
  return v;
}

// For every output row (i, j) of one plane: fold(row, first) for each row of x its windows cover (along
// the last axis), then finish(i, j, empty), which reduces the folded line along the last axis.
template <typename T, typename Line, typename Finish>
void ByRows(const Geometry &g, const T *xp, Line fold, Finish finish) {
  const Axis &A = g.axis[0], &B = g.axis[1];
  for (int64_t i = 0; i < A.out; i++)
    for (int64_t j = 0; j < B.out; j++) {
      const int64_t a0 = i * A.s - A.pb, b0 = j * B.s - B.pb;
      bool first = true;
      for (int64_t ta = A.first[i]; ta < A.last[i]; ta++)
        for (int64_t tb = B.first[j]; tb < B.last[j]; tb++) {
          fold(xp + ((a0 + ta * A.d) * B.in + b0 + tb * B.d) * g.axis[2].in, first);
          first = false;
        }
      finish(i, j, first);  // first still set: the window covers no row of x
    }
}

// The output columns [lo, hi) whose windows lie wholly inside x along the last axis.
inline void Interior(const Axis &C, int64_t *lo, int64_t *hi) {
  *lo = 0;
  while (*lo < C.out && !(C.first[*lo] == 0 && C.last[*lo] == C.k)) ++*lo;
  *hi = *lo;
  while (*hi < C.out && C.first[*hi] == 0 && C.last[*hi] == C.k) ++*hi;
}

// y[k] = line's taps k * s - pb + t * d (t < taps) folded with combine, in that order, for the interior
// outputs k in [lo, hi): with 2 or 3 taps (K) one pass over the outputs, else one pass per tap, so the loops
// vectorise (S: the stride compiled in, 1 or 2; 0 reads C.s).
template <int S, int K, typename T, typename Combine>
void InteriorFold(const Axis &C, int64_t lo, int64_t hi, const T *__restrict line, T *__restrict y,
                  Combine combine) {
  const int64_t s = S ? S : C.s;
  const T *t0 = line - C.pb, *t1 = t0 + C.d, *t2 = t1 + C.d;
  if constexpr (K == 3) {
    for (int64_t k = lo; k < hi; k++) y[k] = combine(combine(t0[k * s], t1[k * s]), t2[k * s]);
  } else if constexpr (K == 2) {
    for (int64_t k = lo; k < hi; k++) y[k] = combine(t0[k * s], t1[k * s]);
  } else {
    for (int64_t k = lo; k < hi; k++) y[k] = t0[k * s];
    for (int64_t t = 1; t < C.k; t++) {
      const T *tap = t0 + t * C.d;
      for (int64_t k = lo; k < hi; k++) y[k] = combine(y[k], tap[k * s]);
    }
  }
}

template <int S, typename T, typename Combine>
void InteriorFold(const Axis &C, int64_t lo, int64_t hi, const T *line, T *y, Combine combine) {
  if (C.k == 3) InteriorFold<S, 3>(C, lo, hi, line, y, combine);
  else if (C.k == 2) InteriorFold<S, 2>(C, lo, hi, line, y, combine);
  else InteriorFold<S, 0>(C, lo, hi, line, y, combine);
}

template <typename T, typename Combine>
void InteriorFold(const Axis &C, int64_t lo, int64_t hi, const T *line, T *y, Combine combine) {
  if (C.s == 1) InteriorFold<1>(C, lo, hi, line, y, combine);
  else if (C.s == 2) InteriorFold<2>(C, lo, hi, line, y, combine);
  else InteriorFold<0>(C, lo, hi, line, y, combine);
}

// -- 3 x 3 "same" pools --------------------------------------------------------------------------
//
// 2-D pools of 3 x 3 windows, stride 1, dilation 1 and one row and column of padding on every side (the
// pools inside inception modules) keep the plane's size, and each plane is a few whole-plane loops: two
// passes down fold every window's rows into `down` (each output row with the rows above and below it
// inside x), one across folds its columns; ByRows would make several short loops per output row (7 x 7
// to 28 x 28 planes: most of the time went into loop overhead).

inline bool SamePool3x3(const Geometry &g) {
  auto same = [](const Axis &a) {
    return a.k == 3 && a.s == 1 && a.d == 1 && a.pb == 1 && a.pe == 1 && a.out == a.in && a.in >= 2;
  };
  return g.axis[0].in == 1 && g.axis[0].k == 1 && same(g.axis[1]) && same(g.axis[2]);
}

// One plane (h x w) of a same pool: `fold` is max or +, `down` a plane of scratch that holds x's plane
// already (the first pass: a copy, NaN as -inf for max); y[q] = the fold of its window, times scale[q]
// where scale is given (average pools: 1 / the window's count).
template <typename T, typename Fold>
void SamePlane(int64_t h, int64_t w, const T *__restrict x, T *__restrict down, T *__restrict y,
               const T *__restrict scale, Fold fold) {
  const int64_t n = h * w;
  for (int64_t q = w; q < n; q++) down[q] = fold(down[q], x[q - w]);  // the row above
  for (int64_t q = 0; q < n - w; q++) down[q] = fold(down[q], x[q + w]);  // the row below
  // Across: every element from its left and right neighbours, then the first and last column of each
  // row again from the two columns inside (the flat pass read a neighbouring row's element there).
  for (int64_t q = 1; q < n - 1; q++) y[q] = fold(fold(down[q - 1], down[q]), down[q + 1]);
  for (int64_t r = 0; r < h; r++) {
    const int64_t first = r * w, last = first + w - 1;
    y[first] = fold(down[first], down[first + 1]);
    y[last] = fold(down[last - 1], down[last]);
  }
  if (scale != nullptr)
    for (int64_t q = 0; q < n; q++) y[q] *= scale[q];
}

// line[w] = the largest of line[w] and rows[r][w] (r < count <= 3) in one pass, a NaN tap never taking.
// Start: line's own values are not read: rows[0] stands first, read as Clean reads taps, and the result is
// whether rows[0] holds a NaN (false for integers: the compiler drops the test).
template <bool Start, typename T>
bool FoldRows(const T *const *rows, int count, T *__restrict line, int64_t n) {
  const T *__restrict r0 = rows[0], *__restrict r1 = rows[count > 1 ? 1 : 0], *__restrict r2 = rows[count - 1];
  auto take = [](T best, T v) { return v > best ? v : best; };
  if constexpr (!Start) {
    for (int64_t w = 0; w < n; w++) line[w] = take(take(take(line[w], r0[w]), r1[w]), r2[w]);
    return false;  // (a row given twice or thrice changes nothing)
  }
  int nan = 0;
  for (int64_t w = 0; w < n; w++) {
    nan |= r0[w] != r0[w];
    line[w] = take(take(Clean(r0[w]), r1[w]), r2[w]);
  }
  return nan != 0;
}

// The maximum alone (no position to track): the window's rows folded into one line with an elementwise
// max (contiguous, vectorised), then each output takes the max of its taps along that line.  Taps are
// compared as Clean reads them (a NaN that is not a window's first tap must not hide a larger tap in a
// later row), and a window whose first tap is NaN then takes that NaN: the argmax passes' answer.
template <typename T>
int MaxOnly(const Geometry &g, const T *x, T *y) {
  const Axis &C = g.axis[2];
  const int64_t in = g.in_size(), out = g.out_size();
  const T lowest = Lowest<T>();
  int64_t lo = 0, hi = 0;
  Interior(C, &lo, &hi);
  const bool same = SamePool3x3(g);
  ForPlanes(g, true, [&](int64_t first_plane, int64_t end_plane) {
    std::vector<T> line(C.in), down(same ? in : 0);
    const T *first_row = nullptr;  // the windows' first row inside x
    bool first_row_nan = false;
    for (int64_t plane = first_plane; plane < end_plane; plane++) {
      T *yp = y + plane * out;
      // (a plane holding a NaN takes the rows' path, which gives a window's NaN first tap its due)
      const T *whole[1] = {x + plane * in};  // the plane as one row, copied as Clean reads it
      if (same && !FoldRows<true>(whole, 1, down.data(), in)) {
        SamePlane(g.axis[1].in, C.in, x + plane * in, down.data(), yp, static_cast<const T *>(nullptr),
                  [](T best, T v) { return v > best ? v : best; });
        continue;
      }
      // A window's rows are folded into line three at a time (one pass each), the first of them read
      // with NaN as -inf.
      const T *pending[3];
      int n_pending = 0;
      bool started = false;
      auto flush = [&] {
        if (!started) {
          first_row = pending[0];
          first_row_nan = FoldRows<true>(pending, n_pending, line.data(), C.in);
          started = true;
        } else {
          FoldRows<false>(pending, n_pending, line.data(), C.in);
        }
        n_pending = 0;
      };
      ByRows(g, x + plane * in,
             [&](const T *row, bool first) {
               if (first) started = false;
               pending[n_pending++] = row;
               if (n_pending == 3) flush();
             },
             [&](int64_t, int64_t, bool empty) {
               if (n_pending > 0) flush();
               auto edge = [&](int64_t k) {  // a window reaching into the padding: its taps inside x
                 const int64_t c0 = k * C.s - C.pb;
                 T best = lowest;
                 if (!empty)
                   for (int64_t tc = C.first[k]; tc < C.last[k]; tc++) {
                     const T v = line[c0 + tc * C.d];
                     best = v > best ? v : best;
                   }
                 yp[k] = best;
               };
               if (empty) {
                 std::fill(yp, yp + C.out, lowest);
               } else {
                 for (int64_t k = 0; k < lo; k++) edge(k);
                 InteriorFold(C, lo, hi, line.data(), yp, [](T best, T v) { return v > best ? v : best; });
                 for (int64_t k = hi; k < C.out; k++) edge(k);
                 if (first_row_nan) {
                   for (int64_t k = 0; k < C.out; k++) {
                     if (C.first[k] >= C.last[k]) continue;  // no tap in x along this axis
                     const T v = first_row[k * C.s - C.pb + C.first[k] * C.d];
                     yp[k] = v != v ? v : yp[k];
                   }
                 }
               }
               yp += C.out;
             });
    }
  });
  return 0;
}

// -- the first maximum of each window and where it is -------------------------------------------
//
// The reference scans a window's taps in row-major order and keeps the first tap, then any tap strictly
// greater: the first of the largest values, NaN never winning unless it is the first tap.  The same
// answer, in two passes that vectorise: along the last axis every input row gets, per output column,
// the first largest of its taps (RowMax); then each output row folds the rows of its windows in tap
// order with the same strict rule (FirstRow, FoldRow), so ties go to the earlier row, then the earlier
// column.  Offsets within a plane are int32 where a plane allows (narrower index lanes), else int64.

// One thread's buffers: RowMax of every input row of a plane (value, column), then the plane's answer.
template <typename T, typename I>
struct ArgMaxWork {
  int64_t lo = 0, hi = 0;  // Interior() of the last axis
  std::vector<T> value, best;
  std::vector<I> column, at;
  std::vector<T> scratch;  // for the caller's use (left empty here)
  explicit ArgMaxWork(const Geometry &g)
      : value(g.axis[0].in * g.axis[1].in * g.axis[2].out), best(g.out_size()),
        column(value.size()), at(g.out_size()) {
    Interior(g.axis[2], &lo, &hi);
  }
};

// 32-byte vectors (GCC's vector extensions: one AVX register, two SSE ones) for RowMax: g++ does not
// vectorise its chain of NaN-aware selects by itself.
template <typename T>
struct Lanes {
  typedef T V __attribute__((vector_size(32)));
  typedef typename std::conditional<sizeof(T) == 4, int32_t, int64_t>::type E;
  typedef E M __attribute__((vector_size(32)));  // comparison masks (0 or -1 per lane), column offsets
  static constexpr int N = 32 / sizeof(T);
  static V Load(const T *p) {
    V v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
  }
  static V Clean(V v) {  // NaN lanes to -inf
    if constexpr (std::numeric_limits<T>::has_quiet_NaN) {
      const V low = V{} - std::numeric_limits<T>::infinity();
      return v > low ? v : low;
    }
    return v;
  }
  static V LoadEven(const T *p) {  // p[0], p[2], ..., p[2N - 2], reading nothing past p[2N - 2]
    const V a = Load(p), b = Load(p + N - 1);
    if constexpr (N == 8) return __builtin_shufflevector(a, b, 0, 2, 4, 6, 9, 11, 13, 15);
    else return __builtin_shufflevector(a, b, 0, 2, 5, 7);
  }
};

// Per output column k of one input row: the value and column of the first largest of its taps (NaN
// read as -inf); column -1 where the window has no tap in x.  S, K: the
// stride (1, 2) and kernel size (2, 3) when known at compile time, else 0.
template <int S, int K, typename T, typename I>
void RowMax(const Axis &C, int64_t lo, int64_t hi, const T *__restrict row, T *__restrict value,
            I *__restrict column) {
  const int64_t s = S ? S : C.s, d = C.d, pb = C.pb;
  auto edge = [&](int64_t k) {
    const int64_t c0 = k * s - pb;
    T best = Lowest<T>();
    I at = -1;
    for (int64_t tc = C.first[k]; tc < C.last[k]; tc++) {
      const T v = Clean(row[c0 + tc * d]);
      const bool take = (at < 0) | (v > best);  // selects: random data mispredicts branches
      best = take ? v : best;
      at = take ? static_cast<I>(c0 + tc * d) : at;
    }
    value[k] = best;
    column[k] = at;
  };
  for (int64_t k = 0; k < lo; k++) edge(k);
  int64_t k = lo;
  if constexpr (K > 0) {  // N columns at a time, the taps unrolled
    static_assert((S == 1 || S == 2) && (K == 2 || K == 3), "RowMax compiles in strides 1, 2 and kernels 2, 3");
    typedef Lanes<T> L;
    typedef typename L::V V;
    typedef typename L::M M;
    typedef typename L::E E;
    M lane;
    for (int j = 0; j < L::N; j++) lane[j] = static_cast<E>(j * S);
    for (; k < hi && hi - lo >= L::N; k += L::N) {
      if (k + L::N > hi) k = hi - L::N;  // the last columns: a block overlapping the one before
      const int64_t c = k * S - pb;
      auto load = [&](int64_t t) { return L::Clean(S == 1 ? L::Load(row + c + t) : L::LoadEven(row + c + t)); };
      V best = load(0);
      M tap = M{} + E(0);
      auto step = [&](int64_t t) {
        const V v = load(t);
        const M take = v > best;
        best = take ? v : best;
        tap = take ? M{} + static_cast<E>(t) : tap;
      };
      step(d);
      if constexpr (K == 3) step(2 * d);
      __builtin_memcpy(value + k, &best, sizeof best);
      const M at = tap + lane + static_cast<E>(c);
      if constexpr (sizeof(E) == sizeof(I)) {
        __builtin_memcpy(column + k, &at, sizeof at);
      } else {
        for (int j = 0; j < L::N; j++) column[k + j] = static_cast<I>(at[j]);
      }
    }
  } else {  // one pass over the columns per tap
    for (int64_t j = lo; j < hi; j++) {
      value[j] = Clean(row[j * s - pb]);
      column[j] = static_cast<I>(j * s - pb);
    }
    for (int64_t tc = 1; tc < C.k; tc++) {
      const int64_t off = tc * d - pb;
      for (int64_t j = lo; j < hi; j++) {
        const T v = Clean(row[j * s + off]);
        const bool take = v > value[j];
        value[j] = take ? v : value[j];
        column[j] = take ? static_cast<I>(j * s + off) : column[j];
      }
    }
    k = hi;
  }
  for (; k < C.out; k++) edge(k);
}

// An output row's running best (best, at: offsets in the plane) from the first row r of its windows,
// whose row of x is xr; windows whose first tap (there) is NaN take that tap.
template <int S, typename T, typename I>
void FirstRow(const Axis &C, int64_t lo, int64_t hi, int64_t r, const T *__restrict xr, const T *__restrict value,
              const I *__restrict column, T *__restrict best, I *__restrict at) {
  const I base = static_cast<I>(r * C.in), s = S ? S : static_cast<I>(C.s), pb = static_cast<I>(C.pb);
  auto edge = [&](int64_t k) {
    best[k] = value[k];
    at[k] = column[k] < 0 ? I(-1) : base + column[k];
    if (C.first[k] < C.last[k]) {
      const int64_t c = k * s - pb + C.first[k] * C.d;
      if (xr[c] != xr[c]) {
        best[k] = xr[c];
        at[k] = static_cast<I>(base + c);
      }
    }
  };
  for (int64_t k = 0; k < lo; k++) edge(k);
  for (I k = static_cast<I>(lo); k < static_cast<I>(hi); k++) {
    const T f = xr[k * s - pb];
    const bool nan = f != f;  // false for integers: the compiler drops it
    best[k] = nan ? f : value[k];
    at[k] = nan ? base + k * s - pb : base + column[k];
  }
  for (int64_t k = hi; k < static_cast<int64_t>(C.out); k++) edge(k);
}

// Folds row r's RowMax into an output row's running best; an empty column's Lowest never takes.
template <typename T, typename I>
void FoldRow(int64_t n, int64_t r, int64_t width, const T *__restrict value, const I *__restrict column,
             T *__restrict best, I *__restrict at) {
  const I base = static_cast<I>(r * width);
  int64_t k = 0;
  if constexpr (std::is_floating_point<T>::value && sizeof(typename Lanes<T>::E) == sizeof(I)) {
    // Written out: g++ would turn the selects into masked stores, which are slow on AMD cores.
    typedef Lanes<T> L;
    for (; k + L::N <= n; k += L::N) {
      typename L::V v = L::Load(value + k), b = L::Load(best + k);
      typename L::M c, a;
      __builtin_memcpy(&c, column + k, sizeof c);
      __builtin_memcpy(&a, at + k, sizeof a);
      const typename L::M take = v > b;
      b = take ? v : b;
      a = take ? c + static_cast<typename L::E>(base) : a;
      __builtin_memcpy(best + k, &b, sizeof b);
      __builtin_memcpy(at + k, &a, sizeof a);
    }
  }
  for (; k < n; k++) {
    if (value[k] > best[k]) {
      best[k] = value[k];
      at[k] = base + column[k];
    }
  }
}

// The window maxima of one plane xp, row-major, into work.best, and their offsets in the plane into
// work.at (-1 for a window of padding only).
template <int S, int K, typename T, typename I>
void PlaneArgMaxSK(const Geometry &g, const T *xp, ArgMaxWork<T, I> &work) {
  const Axis &A = g.axis[0], &B = g.axis[1], &C = g.axis[2];
  const int64_t rows = A.in * B.in;
  T *value = work.value.data();
  I *column = work.column.data();
  for (int64_t r = 0; r < rows; r++)
    RowMax<S, K>(C, work.lo, work.hi, xp + r * C.in, value + r * C.out, column + r * C.out);
  int64_t o = 0;
  for (int64_t i = 0; i < A.out; i++)
    for (int64_t j = 0; j < B.out; j++, o += C.out) {
      T *best = work.best.data() + o;
      I *at = work.at.data() + o;
      const int64_t a0 = i * A.s - A.pb, b0 = j * B.s - B.pb;
      bool first = true;
      for (int64_t ta = A.first[i]; ta < A.last[i]; ta++)
        for (int64_t tb = B.first[j]; tb < B.last[j]; tb++) {
          const int64_t r = (a0 + ta * A.d) * B.in + b0 + tb * B.d;
          if (first)
            FirstRow<S>(C, work.lo, work.hi, r, xp + r * C.in, value + r * C.out, column + r * C.out, best, at);
          else
            FoldRow(C.out, r, C.in, value + r * C.out, column + r * C.out, best, at);
          first = false;
        }
      if (first) {  // no row of x: padding only
        std::fill(best, best + C.out, Lowest<T>());
        std::fill(at, at + C.out, I(-1));
      }
    }
}

// PlaneArgMaxSK with the common strides and kernel sizes of the last axis compiled in (floating-point
// dtypes and int32 offsets: the ones that matter for speed).
template <typename T, typename I>
void PlaneArgMax(const Geometry &g, const T *xp, ArgMaxWork<T, I> &work) {
  if constexpr (std::is_floating_point<T>::value && sizeof(I) == 4) {
    const int64_t s = g.axis[2].s, k = g.axis[2].k;
    if (s == 2 && k == 3) return PlaneArgMaxSK<2, 3>(g, xp, work);
    if (s == 2 && k == 2) return PlaneArgMaxSK<2, 2>(g, xp, work);
    if (s == 1 && k == 3) return PlaneArgMaxSK<1, 3>(g, xp, work);
    if (s == 1 && k == 2) return PlaneArgMaxSK<1, 2>(g, xp, work);
  }
  PlaneArgMaxSK<0, 0>(g, xp, work);
}

template <typename T, typename I, typename Emit>
void ArgMaxPlanes(const Geometry &g, const T *x, int64_t lo, int64_t hi, Emit emit) {
  ArgMaxWork<T, I> work(g);
  for (int64_t plane = lo; plane < hi; plane++) {
    PlaneArgMax(g, x + plane * g.in_size(), work);
    emit(plane, work.best.data(), work.at.data(), work.scratch);
  }
}

// emit(plane, best, at, scratch) for every plane, on the pool; int32 offsets where a plane has fewer than 2^31
// elements.
template <typename T, typename Emit>
void ForArgMax(const Geometry &g, const T *x, Emit emit) {
  const bool narrow = g.in_size() <= std::numeric_limits<int32_t>::max();
  ForPlanes(g, true, [&](int64_t lo, int64_t hi) {
    if (narrow) ArgMaxPlanes<T, int32_t>(g, x, lo, hi, emit);
    else ArgMaxPlanes<T, int64_t>(g, x, lo, hi, emit);
  });
}

// The maximum and where it is (its flat offset in x, or -1 for a window of padding only).
template <typename T>
int MaxPoolIndicesT(const Geometry &g, const T *x, T *y, int64_t *indices, bool column_major) {
  const int64_t in = g.in_size(), out = g.out_size();
  const int64_t H = g.axis[1].in, W = g.axis[2].in, D = g.axis[0].in;
  ForArgMax(g, x, [&](int64_t plane, const T *best, const auto *at, std::vector<T> &) {
    std::copy(best, best + out, y + plane * out);
    int64_t *ip = indices + plane * out;
    const int64_t offset = plane * in;
    if (!column_major) {
      for (int64_t o = 0; o < out; o++) ip[o] = at[o] < 0 ? -1 : offset + at[o];
      return;
    }
    for (int64_t o = 0; o < out; o++) {  // the spatial position counted first dim fastest
      const int64_t index = at[o], w = index % W, h = index / W % H, d = index / (W * H);
      ip[o] = index < 0 ? -1 : offset + (w * H + h) * D + d;
    }
  });
  return 0;
}

// Gradients larger than this are written with non-temporal stores: they would not stay in cache anyway,
// and dx's lines are then not read before they are written.
const int64_t kStreamBytes = int64_t(1) << 22;

// n elements from src (in cache) to dst, streamed past the cache where `stream`.
template <typename T>
void WriteOut(const T *src, T *dst, int64_t n, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    char *d = reinterpret_cast<char *>(dst);
    const char *s = reinterpret_cast<const char *>(src);
    int64_t bytes = n * static_cast<int64_t>(sizeof(T));
    const int64_t head = std::min<int64_t>(bytes, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
    std::memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    for (; bytes >= 16; bytes -= 16, d += 16, s += 16)
      _mm_stream_si128(reinterpret_cast<__m128i *>(d), _mm_loadu_si128(reinterpret_cast<const __m128i *>(s)));
    std::memcpy(d, s, bytes);
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, n * sizeof(T));
}

// Planes up to this size are summed in a buffer of the thread's own, which stays in cache; larger ones
// straight in dx (a buffer would be one more pass over memory: a 4096^2 plane took 124 ms, not 81).
const int64_t kPlaneInCache = int64_t(1) << 18;

// One plane of a max_pool gradient: dy[o] (o < the plane's outputs) added at offset at[o] - base of the
// plane (below 0: nowhere).  A plane that fits in cache is summed in `sums` (one slot more, where the
// nowheres go: the loop has no branch) and written out to dx, streamed where the whole dx is large.
template <typename T, typename I>
void ScatterPlane(const Geometry &g, const T *dy, const I *at, int64_t base, std::vector<T> &sums, T *dx) {
  const int64_t in = g.in_size(), out = g.out_size(), bytes = in * static_cast<int64_t>(sizeof(T));
  if (bytes > kPlaneInCache) {
    std::memset(dx, 0, sizeof(T) * in);
    for (int64_t o = 0; o < out; o++)
      if (at[o] >= 0) dx[at[o] - base] += dy[o];
    return;
  }
  sums.assign(in + 1, T(0));
  for (int64_t o = 0; o < out; o++) {
    const int64_t k = at[o] - base;
    sums[k < 0 ? in : k] += dy[o];
  }
  WriteOut(sums.data(), dx, in, g.planes * bytes > kStreamBytes);
}

// dy added at each window's first maximum.
template <typename T>
int MaxPoolGradT(const Geometry &g, const T *dy, const T *x, T *dx) {
  const int64_t in = g.in_size(), out = g.out_size();
  ForArgMax(g, x, [&](int64_t plane, const T *, const auto *at, std::vector<T> &sums) {
    ScatterPlane(g, dy + plane * out, at, 0, sums, dx + plane * in);
  });
  return 0;
}

// dy added where indices (max_pool_with_indices's: flat offsets in x, -1 for nothing) say: no maximum is
// looked for again.  An index outside its own plane, which max_pool_with_indices never gives, fails the
// call (4) before that plane is written.
template <typename T>
int MaxPoolIndicesGradT(const Geometry &g, const T *dy, const int64_t *indices, T *dx, bool column_major) {
  const int64_t in = g.in_size(), out = g.out_size();
  const int64_t D = g.axis[0].in, H = g.axis[1].in, W = g.axis[2].in;
  std::atomic<bool> outside{false};
  ForPlanes(g, false, [&](int64_t lo, int64_t hi) {
    std::vector<T> sums;
    std::vector<int64_t> row_major(column_major ? out : 0);
    for (int64_t plane = lo; plane < hi; plane++) {
      const int64_t *ip = indices + plane * out, base = plane * in;
      uint64_t stray = 0;  // nonzero where an index is neither -1 nor in the plane
      for (int64_t o = 0; o < out; o++)
        stray |= (ip[o] != -1) &
                 (static_cast<uint64_t>(ip[o]) - static_cast<uint64_t>(base) >= static_cast<uint64_t>(in));
      if (stray) {
        outside = true;
        return;
      }
      if (column_major) {  // (w, h, d) counted d fastest
        for (int64_t o = 0; o < out; o++) {
          const int64_t c = ip[o] - base;
          row_major[o] = ip[o] == -1 ? -1 : base + ((c % D) * H + c / D % H) * W + c / (D * H);
        }
        ip = row_major.data();
      }
      ScatterPlane(g, dy + plane * out, ip, base, sums, dx + base);
    }
  });
  return outside ? 4 : 0;
}

// The divisor of output (i, j, k): the taps inside x, or inside x and its padding.
inline int64_t Count(const Geometry &g, int64_t i, int64_t j, int64_t k, bool include_pad) {
  const Axis &A = g.axis[0], &B = g.axis[1], &C = g.axis[2];
  if (include_pad) return A.padded[i] * B.padded[j] * C.padded[k];
  return (A.last[i] - A.first[i]) * (B.last[j] - B.first[j]) * (C.last[k] - C.first[k]);
}

// The window's rows summed into a line of x's last axis, zero-padded so that every window of the row reads
// inside it (taps in the padding, or past it with ceil_mode, add nothing): one vectorised pass per tap
// gives every output of the row, and each is scaled by 1 / its count, the count's two factors (rows,
// columns) inverted apart (within 2 ulp of the double quotient; none of the row's divisions).
template <typename T>
int AveragePoolT(const Geometry &g, const T *x, T *y, bool include_pad) {
  const Axis &A = g.axis[0], &B = g.axis[1], &C = g.axis[2];
  const int64_t in = g.in_size(), out = g.out_size();
  const int64_t width = std::max((C.out - 1) * C.s + (C.k - 1) * C.d + 1, C.pb + C.in);
  std::vector<double> inverse_columns(C.out);
  for (int64_t k = 0; k < C.out; k++) {
    const int64_t n = include_pad ? C.padded[k] : C.last[k] - C.first[k];
    inverse_columns[k] = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
  }
  if (SamePool3x3(g)) {  // nine taps: summed in T, as other libraries do, each plane in a few flat loops
    std::vector<T> scale(in);
    for (int64_t i = 0; i < B.out; i++) {
      const double rows = include_pad ? 3.0 : static_cast<double>(B.last[i] - B.first[i]);
      for (int64_t k = 0; k < C.out; k++) scale[i * C.out + k] = static_cast<T>(inverse_columns[k] / rows);
    }
    ForPlanes(g, true, [&](int64_t lo, int64_t hi) {
      std::vector<T> down(in);
      for (int64_t plane = lo; plane < hi; plane++) {
        std::copy(x + plane * in, x + (plane + 1) * in, down.begin());
        SamePlane(B.in, C.in, x + plane * in, down.data(), y + plane * out, scale.data(),
                  [](T sum, T v) { return sum + v; });
      }
    });
    return 0;
  }
  ForPlanes(g, true, [&](int64_t lo, int64_t hi) {
    std::vector<double> padded(width, 0.0), sums(C.out);
    double *line = padded.data() + C.pb;  // x's columns; the zeros around them are never written
    for (int64_t plane = lo; plane < hi; plane++) {
      T *yp = y + plane * out;
      ByRows(g, x + plane * in,
             [&](const T *row, bool first) {
               if (first) {
                 for (int64_t w = 0; w < C.in; w++) line[w] = row[w];
               } else {
                 for (int64_t w = 0; w < C.in; w++) line[w] += row[w];
               }
             },
             [&](int64_t i, int64_t j, bool empty) {
               const int64_t rows = include_pad ? A.padded[i] * B.padded[j]
                                                : (A.last[i] - A.first[i]) * (B.last[j] - B.first[j]);
               if (empty || rows <= 0) {
                 std::fill(yp, yp + C.out, T(0));
               } else {
                 InteriorFold(C, 0, C.out, line, sums.data(), [](double sum, double v) { return sum + v; });
                 const double inverse_rows = 1.0 / static_cast<double>(rows);
                 for (int64_t k = 0; k < C.out; k++)
                   yp[k] = static_cast<T>(sums[k] * (inverse_rows * inverse_columns[k]));
               }
               yp += C.out;
             });
    }
  });
  return 0;
}

// Each window's share of dy (dy over its count), one output row at a time, added to the window's taps
// row by row of x: the loops over a row's windows and taps keep to one row of dx.
template <typename T>
int AveragePoolGradT(const Geometry &g, const T *dy, T *dx, bool include_pad) {
  const Axis &A = g.axis[0], &B = g.axis[1], &C = g.axis[2];
  const int64_t in = g.in_size(), out = g.out_size();
  int64_t k_lo, k_hi;
  Interior(C, &k_lo, &k_hi);
  ForPlanes(g, true, [&](int64_t lo, int64_t hi) {
    std::vector<T> share(C.out);
    for (int64_t plane = lo; plane < hi; plane++) {
      const T *dyp = dy + plane * out;
      T *dxp = dx + plane * in;
      std::memset(dxp, 0, sizeof(T) * in);
      for (int64_t i = 0; i < A.out; i++)
        for (int64_t j = 0; j < B.out; j++, dyp += C.out) {
          for (int64_t k = 0; k < C.out; k++) {
            const int64_t n = Count(g, i, j, k, include_pad);
            share[k] = n > 0 ? dyp[k] / static_cast<T>(n) : T(0);
          }
          const int64_t a0 = i * A.s - A.pb, b0 = j * B.s - B.pb;
          for (int64_t ta = A.first[i]; ta < A.last[i]; ta++)
            for (int64_t tb = B.first[j]; tb < B.last[j]; tb++) {
              T *row = dxp + ((a0 + ta * A.d) * B.in + b0 + tb * B.d) * C.in;
              auto edge = [&](int64_t k) {
                for (int64_t tc = C.first[k]; tc < C.last[k]; tc++) row[k * C.s - C.pb + tc * C.d] += share[k];
              };
              for (int64_t k = 0; k < k_lo; k++) edge(k);
              for (int64_t tc = 0; tc < C.k; tc++) {  // the whole windows, a tap at a time: no inner bounds
                T *at = row + tc * C.d - C.pb;
                if (C.s == 2)
                  for (int64_t k = k_lo; k < k_hi; k++) at[2 * k] += share[k];
                else
                  for (int64_t k = k_lo; k < k_hi; k++) at[k * C.s] += share[k];
              }
              for (int64_t k = k_hi; k < C.out; k++) edge(k);
            }
        }
    }
  });
  return 0;
}

#define FLOAT_TYPES(X) X(float, "float32") X(double, "float64")
#define POOL_TYPES(X) FLOAT_TYPES(X) X(int8_t, "int8") X(uint8_t, "uint8") X(int32_t, "int32") X(int64_t, "int64")

}  // namespace

// params: x, y.  (max_pool)
extern "C" int MaxPool(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *stream, void *extra) {
  try {
    Geometry g;
    if (!ReadGeometry(static_cast<AotExtra *>(extra), ndims[0], shapes[0], shapes[1], &g)) return 1;
#define X(T, name) \
    if (!std::strcmp(dtypes[0], name)) \
      return MaxOnly<T>(g, static_cast<const T *>(params[0]), static_cast<T *>(params[1]));
    POOL_TYPES(X)
#undef X
  } catch (...) {  // (attribute lookup, the pool): nothing crosses the ABI
  }
  return 2;
}

// params: x, y, indices (int64).  (max_pool_with_indices)
extern "C" int MaxPoolIndices(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra_ptr) {
  try {
    AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
    Geometry g;
    if (!ReadGeometry(extra, ndims[0], shapes[0], shapes[1], &g)) return 1;
    const bool column_major = extra->Attr<int64_t>("storage_order") == 1;
    int64_t *indices = static_cast<int64_t *>(params[2]);
#define X(T, name) \
    if (!std::strcmp(dtypes[0], name)) \
      return MaxPoolIndicesT<T>(g, static_cast<const T *>(params[0]), static_cast<T *>(params[1]), indices, \
                                column_major);
    POOL_TYPES(X)
#undef X
  } catch (...) {  // (attribute lookup, the pool): nothing crosses the ABI
  }
  return 2;
}

// params: dy, x, dx.  (max_pool_grad)
extern "C" int MaxPoolGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                           void *stream, void *extra) {
  try {
    Geometry g;
    if (!ReadGeometry(static_cast<AotExtra *>(extra), ndims[1], shapes[1], shapes[0], &g)) return 1;
#define X(T, name) \
    if (!std::strcmp(dtypes[0], name)) \
      return MaxPoolGradT<T>(g, static_cast<const T *>(params[0]), static_cast<const T *>(params[1]), \
                             static_cast<T *>(params[2]));
    FLOAT_TYPES(X)
#undef X
  } catch (...) {  // (attribute lookup, the pool): nothing crosses the ABI
  }
  return 2;
}

// params: dy, indices (int64), x, dx (x lends its shape).  (max_pool_with_indices_grad)
extern "C" int MaxPoolIndicesGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                  void *stream, void *extra_ptr) {
  try {
    AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
    Geometry g;
    if (!ReadGeometry(extra, ndims[2], shapes[2], shapes[0], &g)) return 1;
    const bool column_major = extra->Attr<int64_t>("storage_order") == 1;
#define X(T, name) \
    if (!std::strcmp(dtypes[0], name)) \
      return MaxPoolIndicesGradT<T>(g, static_cast<const T *>(params[0]), static_cast<const int64_t *>(params[1]), \
                                    static_cast<T *>(params[3]), column_major);
    FLOAT_TYPES(X)
#undef X
  } catch (...) {  // (attribute lookup, the pool): nothing crosses the ABI
  }
  return 2;
}

// params: x, y.  (average_pool)
extern "C" int AveragePool(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                           void *stream, void *extra_ptr) {
  try {
    AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
    Geometry g;
    if (!ReadGeometry(extra, ndims[0], shapes[0], shapes[1], &g)) return 1;
    const bool include_pad = extra->Attr<bool>("count_include_pad");
#define X(T, name) \
    if (!std::strcmp(dtypes[0], name)) \
      return AveragePoolT<T>(g, static_cast<const T *>(params[0]), static_cast<T *>(params[1]), include_pad);
    FLOAT_TYPES(X)
#undef X
  } catch (...) {  // (attribute lookup, the pool): nothing crosses the ABI
  }
  return 2;
}

// params: dy, x, dx (x lends its shape).  (average_pool_grad)
extern "C" int AveragePoolGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra_ptr) {
  try {
    AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
    Geometry g;
    if (!ReadGeometry(extra, ndims[1], shapes[1], shapes[0], &g)) return 1;
    const bool include_pad = extra->Attr<bool>("count_include_pad");
#define X(T, name) \
    if (!std::strcmp(dtypes[0], name)) \
      return AveragePoolGradT<T>(g, static_cast<const T *>(params[0]), static_cast<T *>(params[2]), include_pad);
    FLOAT_TYPES(X)
#undef X
  } catch (...) {  // (attribute lookup, the pool): nothing crosses the ABI
  }
  return 2;
}
