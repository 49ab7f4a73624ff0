// max_pool, max_pool_with_indices, max_pool_grad, average_pool and
// average_pool_grad: NC + 1 to 3 spatial dims (ONNX MaxPool / AveragePool).
//
// Every spatial rank runs through one 3-D loop: 1-D and 2-D inputs get
// leading spatial dims of size 1 (kernel 1, stride 1, no padding).  For each
// output position along an axis the taps that land inside x are worked out
// once (first, last), so the inner loops have no bounds tests.  The (sample,
// channel) planes run on opforge's pool.  The op's check has validated the
// attributes and inference the output shape.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

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

// Calls visit(out_offset, ranges...) for every output of one plane.
template <typename Visit>
void ForEachOutput(const Geometry &g, Visit visit) {
  const Axis &A = g.axis[0], &B = g.axis[1], &C = g.axis[2];
  int64_t o = 0;
  for (int64_t i = 0; i < A.out; i++)
    for (int64_t j = 0; j < B.out; j++)
      for (int64_t k = 0; k < C.out; k++, o++) visit(o, i, j, k);
}

// The taps of output (i, j, k) inside x: visit(input offset) for each.
template <typename Visit>
inline void ForEachTap(const Geometry &g, int64_t i, int64_t j, int64_t k, Visit visit) {
  const Axis &A = g.axis[0], &B = g.axis[1], &C = g.axis[2];
  const int64_t a0 = i * A.s - A.pb, b0 = j * B.s - B.pb, c0 = k * C.s - C.pb;
  for (int64_t ta = A.first[i]; ta < A.last[i]; ta++) {
    const int64_t ra = (a0 + ta * A.d) * B.in;
    for (int64_t tb = B.first[j]; tb < B.last[j]; tb++) {
      const int64_t rb = (ra + b0 + tb * B.d) * C.in + c0;
      for (int64_t tc = C.first[k]; tc < C.last[k]; tc++) visit(rb + tc * C.d);
    }
  }
}

// What a window of padding only gives: -inf, or the type's lowest value.
template <typename T>
inline T Lowest() {
  return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                              : std::numeric_limits<T>::lowest();
}

// The offset of the first maximum of output (i, j, k), or -1 for a window of padding only.
template <typename T>
inline int64_t ArgMax(const Geometry &g, const T *x, int64_t i, int64_t j, int64_t k, T *best) {
  int64_t at = -1;
  T top = Lowest<T>();
  ForEachTap(g, i, j, k, [&](int64_t p) {
    if (at < 0 || x[p] > top) {
      top = x[p];
      at = p;
    }
  });
  *best = top;
  return at;
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

// The maximum alone (no position to track): the window's rows folded into one line with an elementwise
// max (contiguous, vectorised), then each output takes the max of its taps along that line.
template <typename T>
int MaxOnly(const Geometry &g, const T *x, T *y) {
  const Axis &C = g.axis[2];
  const int64_t in = g.in_size(), out = g.out_size();
  const T lowest = Lowest<T>();
  ForPlanes(g, true, [&](int64_t lo, int64_t hi) {
    std::vector<T> line(C.in);
    for (int64_t plane = lo; plane < hi; plane++) {
      T *yp = y + plane * out;
      ByRows(g, x + plane * in,
             [&](const T *row, bool first) {
               if (first) {
                 std::copy(row, row + C.in, line.begin());
                 return;
               }
               for (int64_t w = 0; w < C.in; w++) line[w] = row[w] > line[w] ? row[w] : line[w];
             },
             [&](int64_t, int64_t, bool empty) {
               for (int64_t k = 0; k < C.out; k++) {
                 const int64_t c0 = k * C.s - C.pb;
                 T best = lowest;
                 if (!empty)
                   for (int64_t tc = C.first[k]; tc < C.last[k]; tc++) {
                     const T v = line[c0 + tc * C.d];
                     best = v > best ? v : best;
                   }
                 *yp++ = best;
               }
             });
    }
  });
  return 0;
}

// The maximum and where it is (its flat offset in x, or -1 for a window of padding only).
template <typename T>
int MaxPoolIndicesT(const Geometry &g, const T *x, T *y, int64_t *indices, bool column_major) {
  const int64_t in = g.in_size(), out = g.out_size();
  const int64_t H = g.axis[1].in, W = g.axis[2].in, D = g.axis[0].in;
  ForPlanes(g, true, [&](int64_t lo, int64_t hi) {
    for (int64_t plane = lo; plane < hi; plane++) {
      const T *xp = x + plane * in;
      T *yp = y + plane * out;
      ForEachOutput(g, [&](int64_t o, int64_t i, int64_t j, int64_t k) {
        T best;
        const int64_t at = ArgMax(g, xp, i, j, k, &best);
        yp[o] = best;
        int64_t index = at;
        if (at >= 0 && column_major) {  // the spatial position counted first dim fastest
          const int64_t w = at % W, h = at / W % H, d = at / (W * H);
          index = (w * H + h) * D + d;
        }
        indices[plane * out + o] = at < 0 ? -1 : plane * in + index;
      });
    }
  });
  return 0;
}

template <typename T>
int MaxPoolGradT(const Geometry &g, const T *dy, const T *x, T *dx) {
  const int64_t in = g.in_size(), out = g.out_size();
  ForPlanes(g, true, [&](int64_t lo, int64_t hi) {
    std::memset(dx + lo * in, 0, sizeof(T) * (hi - lo) * in);
    for (int64_t plane = lo; plane < hi; plane++) {
      const T *xp = x + plane * in, *dyp = dy + plane * out;
      T *dxp = dx + plane * in;
      ForEachOutput(g, [&](int64_t o, int64_t i, int64_t j, int64_t k) {
        T best;
        const int64_t at = ArgMax(g, xp, i, j, k, &best);
        if (at >= 0) dxp[at] += dyp[o];
      });
    }
  });
  return 0;
}

// The divisor of output (i, j, k): the taps inside x, or inside x and its padding.
inline int64_t Count(const Geometry &g, int64_t i, int64_t j, int64_t k, bool include_pad) {
  const Axis &A = g.axis[0], &B = g.axis[1], &C = g.axis[2];
  if (include_pad) return A.padded[i] * B.padded[j] * C.padded[k];
  return (A.last[i] - A.first[i]) * (B.last[j] - B.first[j]) * (C.last[k] - C.first[k]);
}

template <typename T>
int AveragePoolT(const Geometry &g, const T *x, T *y, bool include_pad) {
  const Axis &C = g.axis[2];
  const int64_t in = g.in_size(), out = g.out_size();
  ForPlanes(g, true, [&](int64_t lo, int64_t hi) {
    std::vector<double> line(C.in);  // the window's rows summed
    for (int64_t plane = lo; plane < hi; plane++) {
      T *yp = y + plane * out;
      ByRows(g, x + plane * in,
             [&](const T *row, bool first) {
               if (first) std::fill(line.begin(), line.end(), 0.0);
               for (int64_t w = 0; w < C.in; w++) line[w] += row[w];
             },
             [&](int64_t i, int64_t j, bool empty) {
               for (int64_t k = 0; k < C.out; k++) {
                 const int64_t c0 = k * C.s - C.pb;
                 double sum = 0;
                 if (!empty)
                   for (int64_t tc = C.first[k]; tc < C.last[k]; tc++) sum += line[c0 + tc * C.d];
                 const int64_t n = Count(g, i, j, k, include_pad);
                 *yp++ = n > 0 ? static_cast<T>(sum / n) : T(0);
               }
             });
    }
  });
  return 0;
}

template <typename T>
int AveragePoolGradT(const Geometry &g, const T *dy, T *dx, bool include_pad) {
  const int64_t in = g.in_size(), out = g.out_size();
  ForPlanes(g, true, [&](int64_t lo, int64_t hi) {
    std::memset(dx + lo * in, 0, sizeof(T) * (hi - lo) * in);
    for (int64_t plane = lo; plane < hi; plane++) {
      const T *dyp = dy + plane * out;
      T *dxp = dx + plane * in;
      ForEachOutput(g, [&](int64_t o, int64_t i, int64_t j, int64_t k) {
        const int64_t n = Count(g, i, j, k, include_pad);
        if (n == 0) return;
        const T share = dyp[o] / static_cast<T>(n);
        ForEachTap(g, i, j, k, [&](int64_t p) { dxp[p] += share; });
      });
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
