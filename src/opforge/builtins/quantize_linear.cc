// quantize_linear and dequantize_linear: linear (de)quantization with a
// scale and zero point per tensor, per slice along an axis, or per block of
// an axis.  One library for every dtype pair: the pair is read from the
// dtype names at run time, so it is compiled once.
//
// Both kernels walk x once.  x is viewed as [outer, D, inner] around the
// axis; the scale and zero point of element (o, d, i) sit at
//   o * so + (d / block) * sd + i * si
// which covers the three granularities:
//   per tensor:  one value (every step 0);
//   per axis:    a vector of D values (sd = 1);
//   blocked:     x's shape with D replaced by ceil(D / block) (so, sd, si
//                the strides of that tensor).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

namespace {

// Elements per parallel range: smaller arrays run on the calling thread.
constexpr int64_t kGrain = int64_t(1) << 16;

int64_t Count(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

// Where the scale of each element is: see the file comment.
struct Layout {
  int64_t outer = 1, d = 1, inner = 1, block = 1, so = 0, sd = 0, si = 0;
};

// The layout for x (rank, shape) and a scale (srank, sshape); false when
// they do not fit one granularity (the ops' checks refuse that first).
bool MakeLayout(int rank, const int64_t *shape, int srank, const int64_t *sshape, int64_t axis, int64_t block,
                Layout *out) {
  Layout l;
  const int64_t n = Count(rank, shape), ns = Count(srank, sshape);
  if (ns == 1 && srank <= 1) {  // per tensor: one run of n elements
    l.inner = n;
    *out = l;
    return true;
  }
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return false;
  for (int k = 0; k < rank; k++) {
    if (k < axis) l.outer *= shape[k];
    if (k > axis) l.inner *= shape[k];
  }
  l.d = shape[axis];
  if (srank == 1 && block <= 0) {  // per axis
    if (sshape[0] != l.d) return false;
    if (l.inner == 1) {  // the axis is the last: each row of D elements reads the scales in step
      l.inner = l.d;
      l.d = 1;
      l.si = 1;
    } else {
      l.sd = 1;
    }
    *out = l;
    return true;
  }
  if (srank != rank || block <= 0) return false;
  for (int k = 0; k < rank; k++)
    if (k != axis && sshape[k] != shape[k]) return false;
  const int64_t s = sshape[axis];
  if (s != (l.d + block - 1) / block) return false;
  l.block = block;
  l.si = 1;
  l.sd = l.inner;
  l.so = s * l.inner;
  *out = l;
  return true;
}

// fn(x_offset, scale_offset, scale_step, count) over the runs of elements that
// share (scale_step 0) or step through (1) the scale, in parallel ranges.
template <typename Fn>
void ForRuns(const Layout &l, const Fn &fn) {
  const int64_t n = l.outer * l.d * l.inner;
  opforge::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi;) {
      const int64_t row = j / l.inner, i = j - row * l.inner, o = row / l.d, d = row - o * l.d;
      const int64_t end = std::min(hi, (row + 1) * l.inner);
      fn(j, o * l.so + (d / l.block) * l.sd + i * l.si, l.si, end - j);
      j = end;
    }
  });
}

// Round half to even by the float adder: adding then subtracting 1.5 * 2^m
// (m: the mantissa bits) rounds |q| < 2^(m-1) to an integer in the current
// mode, round-to-nearest-even, and vectorizes where nearbyint may not.
template <typename T> struct Rounder;
template <> struct Rounder<float> {
  static constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  static constexpr float kLimit = 4194304.0f;   // 2^22: far beyond any target range
};
template <> struct Rounder<double> {
  static constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr double kLimit = 4194304.0;
};

// One element: v / s rounded half to even, plus z, saturated to [lo, hi];
// a NaN gives the zero point.  Clamped to +-kLimit first so the rounding
// trick holds and an infinity saturates.
template <typename T>
inline T QuantizeOne(T v, T s, T z, T lo, T hi) {
  T q = v / s;
  q = q == q ? q : T(0);
  q = std::min(std::max(q, -Rounder<T>::kLimit), Rounder<T>::kLimit);
  q = (q + Rounder<T>::kMagic) - Rounder<T>::kMagic + z;
  return std::min(std::max(q, lo), hi);
}

template <typename T, typename Q>
void Quantize(const T *x, const T *scale, const Q *zero_point, Q *y, const Layout &l) {
  ForRuns(l, [&](int64_t at, int64_t s_at, int64_t step, int64_t count) {
    // Locals, not captures: stores through an 8-bit y may alias anything, and
    // would make the compiler reload captured values on every element.
    const T lo = static_cast<T>(std::numeric_limits<Q>::min()), hi = static_cast<T>(std::numeric_limits<Q>::max());
    const T *xs = x + at;
    Q *ys = y + at;
    if (step == 0) {
      const T s = scale[s_at], z = static_cast<T>(zero_point[s_at]);
      for (int64_t k = 0; k < count; k++)
        ys[k] = static_cast<Q>(static_cast<int32_t>(QuantizeOne(xs[k], s, z, lo, hi)));
    } else {
      const T *ss = scale + s_at;
      const Q *zs = zero_point + s_at;
      for (int64_t k = 0; k < count; k++)
        ys[k] = static_cast<Q>(static_cast<int32_t>(QuantizeOne(xs[k], ss[k], static_cast<T>(zs[k]), lo, hi)));
    }
  });
}

// x - zero_point exactly: in int32 for the 8- and 16-bit types, int64 for int32.
template <typename Q> struct Wide { typedef int32_t type; };
template <> struct Wide<int32_t> { typedef int64_t type; };

template <typename Q, typename T>
void Dequantize(const Q *x, const T *scale, const Q *zero_point, T *y, const Layout &l) {
  typedef typename Wide<Q>::type W;
  ForRuns(l, [&](int64_t at, int64_t s_at, int64_t step, int64_t count) {
    const Q *xs = x + at;
    T *ys = y + at;
    if (step == 0) {
      const T s = scale[s_at];
      const W z = static_cast<W>(zero_point[s_at]);
      for (int64_t k = 0; k < count; k++) ys[k] = static_cast<T>(static_cast<W>(xs[k]) - z) * s;
    } else {
      const T *ss = scale + s_at;
      const Q *zs = zero_point + s_at;
      for (int64_t k = 0; k < count; k++)
        ys[k] = static_cast<T>(static_cast<W>(xs[k]) - static_cast<W>(zs[k])) * ss[k];
    }
  });
}

bool Is(const char *dtype, const char *name) { return !std::strcmp(dtype, name); }

template <typename T>
int QuantizeTo(void **params, const char *q, const Layout &l) {
  const T *x = static_cast<const T *>(params[0]), *s = static_cast<const T *>(params[1]);
#define OPFORGE_QUANTIZE(name, Q)                                                                        \
  if (Is(q, name)) {                                                                                     \
    Quantize<T, Q>(x, s, static_cast<const Q *>(params[2]), static_cast<Q *>(params[3]), l);             \
    return 0;                                                                                            \
  }
  OPFORGE_QUANTIZE("int8", int8_t)
  OPFORGE_QUANTIZE("uint8", uint8_t)
  OPFORGE_QUANTIZE("int16", int16_t)
  OPFORGE_QUANTIZE("uint16", uint16_t)
#undef OPFORGE_QUANTIZE
  return 2;
}

template <typename Q>
int DequantizeFrom(void **params, const char *t, const Layout &l) {
  const Q *x = static_cast<const Q *>(params[0]), *z = static_cast<const Q *>(params[2]);
  if (Is(t, "float32"))
    Dequantize<Q, float>(x, static_cast<const float *>(params[1]), z, static_cast<float *>(params[3]), l);
  else if (Is(t, "float64"))
    Dequantize<Q, double>(x, static_cast<const double *>(params[1]), z, static_cast<double *>(params[3]), l);
  else
    return 2;
  return 0;
}

// The layout of x and scale; false when it has none, or when zero_point is not scale's shape (it is read
// at scale's offsets).
bool Prepare(int *ndims, int64_t **shapes, void *extra, Layout *l) {
  if (ndims[2] != ndims[1]) return false;
  for (int d = 0; d < ndims[1]; d++)
    if (shapes[2][d] != shapes[1][d]) return false;
  auto *e = static_cast<AotExtra *>(extra);
  return MakeLayout(ndims[0], shapes[0], ndims[1], shapes[1], e->Attr<int64_t>("axis"),
                    e->Attr<int64_t>("block_size"), l);
}

}  // namespace

// params: x, scale, zero_point, y.  x and scale float32 or float64 (one dtype),
// zero_point and y int8, uint8, int16 or uint16.
extern "C" int QuantizeLinear(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  try {
    Layout l;
    if (!Prepare(ndims, shapes, extra, &l)) return 3;
    if (Count(ndims[0], shapes[0]) == 0) return 0;
    if (std::strcmp(dtypes[0], dtypes[1])) return 2;
    if (Is(dtypes[0], "float32")) return QuantizeTo<float>(params, dtypes[2], l);
    if (Is(dtypes[0], "float64")) return QuantizeTo<double>(params, dtypes[2], l);
    return 2;
  } catch (...) {  // the pool's own failures stay on this side of the ABI
    return 4;
  }
}

// params: x, scale, zero_point, y.  x and zero_point int8, uint8, int16,
// uint16 or int32; scale and y float32 or float64.
extern "C" int DequantizeLinear(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                void *stream, void *extra) {
  try {
    Layout l;
    if (!Prepare(ndims, shapes, extra, &l)) return 3;
    if (Count(ndims[0], shapes[0]) == 0) return 0;
    const char *q = dtypes[0], *t = dtypes[1];
    if (Is(q, "int8")) return DequantizeFrom<int8_t>(params, t, l);
    if (Is(q, "uint8")) return DequantizeFrom<uint8_t>(params, t, l);
    if (Is(q, "int16")) return DequantizeFrom<int16_t>(params, t, l);
    if (Is(q, "uint16")) return DequantizeFrom<uint16_t>(params, t, l);
    if (Is(q, "int32")) return DequantizeFrom<int32_t>(params, t, l);
    return 2;
  } catch (...) {
    return 4;
  }
}

// params: x (float32), y (uint8), y_scale (float32, 0-d), y_zero_point (uint8,
// 0-d).  The range [min(x, 0), max(x, 0)] maps onto 0..255 (ONNX
// DynamicQuantizeLinear): the minimum and maximum in parallel chunks (NaNs
// skipped), then the scale and zero point in float32 as the spec writes
// them, then the quantization pass.
extern "C" int DynamicQuantizeLinear(int nparam, void **params, int *ndims, int64_t **shapes,
                                     const char **dtypes, void *stream, void *extra) {
  try {
    const float *x = static_cast<const float *>(params[0]);
    const int64_t n = Count(ndims[0], shapes[0]);
    const int64_t chunks = (n + kGrain - 1) / kGrain;
    std::vector<float> lows(chunks, 0.0f), highs(chunks, 0.0f);  // 0 is in the range whatever x holds
    opforge::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; c++) {
        // 16 lanes of running extremes, so the compiler keeps them in vector
        // registers (a single min is a reduction it will not reorder).
        float lo[16] = {}, hi[16] = {};
        int64_t i = c * kGrain;
        const int64_t end = std::min(n, (c + 1) * kGrain);
        for (; i + 16 <= end; i += 16)
          for (int k = 0; k < 16; k++) {
            lo[k] = x[i + k] < lo[k] ? x[i + k] : lo[k];
            hi[k] = x[i + k] > hi[k] ? x[i + k] : hi[k];
          }
        for (; i < end; i++) {
          lo[0] = x[i] < lo[0] ? x[i] : lo[0];
          hi[0] = x[i] > hi[0] ? x[i] : hi[0];
        }
        lows[c] = *std::min_element(lo, lo + 16);
        highs[c] = *std::max_element(hi, hi + 16);
      }
    });
    float lo = 0.0f, hi = 0.0f;
    for (int64_t c = 0; c < chunks; c++) {
      lo = std::min(lo, lows[c]);
      hi = std::max(hi, highs[c]);
    }
    const float scale = (hi == lo ? 1.0f : hi - lo) / 255.0f;
    const float zero = QuantizeOne(-lo, scale, 0.0f, 0.0f, 255.0f);  // saturate(round(0 - lo / scale))
    *static_cast<float *>(params[2]) = scale;
    *static_cast<uint8_t *>(params[3]) = static_cast<uint8_t>(zero);
    Layout l;
    l.inner = n;
    Quantize<float, uint8_t>(x, static_cast<float *>(params[2]), static_cast<uint8_t *>(params[3]),
                             static_cast<uint8_t *>(params[1]), l);
    return 0;
  } catch (...) {
    return 4;
  }
}
