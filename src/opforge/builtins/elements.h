// Helpers for kernels that move elements without looking at their values
// (slice, pad, concat, expand, tile, squeeze, ...): one library serves every
// dtype, elements travel as unsigned integers of their width.
//
// Copies are split into ranges of at least OPFORGE_COPY_GRAIN bytes on
// opforge's threads; below that, waking the pool costs more than it saves.
#ifndef OPFORGE_BUILTINS_ELEMENTS_H_
#define OPFORGE_BUILTINS_ELEMENTS_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "opforge/parallel.h"

#ifndef OPFORGE_COPY_GRAIN
#define OPFORGE_COPY_GRAIN (256 << 10)
#endif
// Longest piece of one row a range takes, so that a few long rows (or one)
// still spread over the threads.
#ifndef OPFORGE_COPY_CHUNK
#define OPFORGE_COPY_CHUNK (64 << 10)
#endif

// Bytes per element of an ABI dtype name: the bit count it ends with, or 1 (bool).
static inline int64_t ElementSize(const char *dtype) {
  const char *digits = dtype + std::strcspn(dtype, "0123456789");
  return *digits ? std::atoi(digits) / 8 : 1;
}

static inline int64_t ElementCount(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

// Calls fn(lo, hi) over [0, bytes) in pieces of OPFORGE_COPY_CHUNK, in parallel ranges.
template <typename F>
static inline void ForByteChunks(int64_t bytes, const F &fn) {
  const int64_t chunk = OPFORGE_COPY_CHUNK, chunks = (bytes + chunk - 1) / chunk;
  opforge::parallel_for(0, chunks, OPFORGE_COPY_GRAIN / chunk, [&](int64_t c0, int64_t c1) {
    fn(c0 * chunk, std::min(c1 * chunk, bytes));
  });
}

// memcpy, threaded above the grain: one piece per thread, so that each is one
// long memcpy (glibc streams long copies past the cache).
static inline void ParallelCopy(void *dst, const void *src, int64_t bytes) {
  if (bytes <= 0) return;
  const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(opforge::num_threads(), bytes / OPFORGE_COPY_GRAIN));
  const int64_t width = (bytes / pieces + 63) / 64 * 64;  // whole cache lines
  opforge::parallel_for(0, pieces, 1, [&](int64_t p0, int64_t p1) {
    const int64_t lo = p0 * width, hi = std::min(p1 * width, bytes);
    if (hi > lo) std::memcpy(static_cast<char *>(dst) + lo, static_cast<const char *>(src) + lo, hi - lo);
  });
}

// y[0:n] = value (all-zero bytes: memset).
template <typename E>
static inline void FillRun(E *y, int64_t n, E value) {
  if (n <= 0) return;
  if (n < 16) {  // borders of a row: no call
    for (int64_t i = 0; i < n; i++) y[i] = value;
    return;
  }
  if (value == E(0)) std::memset(y, 0, n * sizeof(E));
  else std::fill(y, y + n, value);
}

template <typename E>
static inline void ParallelFill(E *y, int64_t n, E value) {
  const int64_t bytes = n * static_cast<int64_t>(sizeof(E));
  const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(opforge::num_threads(), bytes / OPFORGE_COPY_GRAIN));
  const int64_t width = (n / pieces + 63) / 64 * 64;
  opforge::parallel_for(0, pieces, 1, [&](int64_t p0, int64_t p1) {
    const int64_t lo = p0 * width, hi = std::min(p1 * width, n);
    FillRun(y + lo, hi - lo, value);
  });
}

// The work of a copy into a contiguous y seen as rows of `inner` elements:
// units are (row, piece of row), each piece at most OPFORGE_COPY_CHUNK bytes.
// Calls piece(row, begin, end) for the columns [begin, end) of a row, units
// in parallel ranges of at least the grain.
template <typename F>
static inline void ForRowPieces(int64_t rows, int64_t inner, int64_t size, const F &piece) {
  if (rows <= 0 || inner <= 0) return;
  const int64_t per = std::max<int64_t>(1, OPFORGE_COPY_CHUNK / size);  // elements per piece
  const int64_t pieces = (inner + per - 1) / per, width = (inner + pieces - 1) / pieces;
  const int64_t grain = std::max<int64_t>(1, OPFORGE_COPY_GRAIN / (width * size));
  opforge::parallel_for(0, rows * pieces, grain, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; u++) {
      const int64_t row = u / pieces, c = u % pieces;
      piece(row, c * width, std::min(inner, (c + 1) * width));
    }
  });
}

// y (shape ys) = x (shape xs) shifted by `shift` per dim: y[o] = x[o - shift]
// where every o[d] - shift[d] lies in [0, xs[d]), else `fill`.  Pad (constant
// mode), its gradient, slice and slice's gradient with unit steps are all this
// copy.  Dims along which y is a whole, unshifted copy of x fold into the dim
// outside them, so each row's interior is one memcpy and its borders fills.
template <typename E>
static void ShiftCopy(const E *x, const int64_t *xs, E *y, const int64_t *ys, const int64_t *shift, int rank,
                      E fill) {
  std::vector<int64_t> Y, X, S;
  for (int d = 0; d < rank; d++) {
    const bool whole = shift[d] == 0 && xs[d] == ys[d];
    if (whole && ys[d] == 1) continue;
    if (whole && !Y.empty()) {
      Y.back() *= ys[d];
      X.back() *= xs[d];
      S.back() *= ys[d];
    } else {
      Y.push_back(ys[d]);
      X.push_back(xs[d]);
      S.push_back(shift[d]);
    }
  }
  if (Y.empty()) {  // one element, copied
    Y.push_back(1);
    X.push_back(1);
    S.push_back(0);
  }
  const int m = static_cast<int>(Y.size());
  std::vector<int64_t> xstride(m, 1);
  for (int d = m - 2; d >= 0; d--) xstride[d] = xstride[d + 1] * X[d + 1];
  int64_t rows = 1;
  for (int d = 0; d < m - 1; d++) rows *= Y[d];
  const int64_t inner = Y[m - 1], s = S[m - 1];
  const int64_t lo = std::clamp<int64_t>(s, 0, inner), hi = std::clamp<int64_t>(X[m - 1] + s, lo, inner);
  // One row: columns [a, b) of y's row at `out`, from x's row at `from` (-1: fill).
  auto piece = [&](E *out, int64_t from, int64_t a, int64_t b) {
    if (from < 0 || lo >= hi) {
      FillRun(out + a, b - a, fill);
      return;
    }
    const int64_t c0 = std::max(a, lo), c1 = std::min(b, hi);
    FillRun(out + a, std::min(b, lo) - a, fill);
    if (c1 > c0) std::memcpy(out + c0, x + from + c0 - s, (c1 - c0) * sizeof(E));
    const int64_t f0 = std::max(a, hi);
    FillRun(out + f0, b - f0, fill);
  };
  // x's offset of y's row `row`, or -1: the dims outside the last two by
  // division (once per plane of rows), the second-last one by a compare.
  const int64_t H = m >= 2 ? Y[m - 2] : 1, HS = m >= 2 ? S[m - 2] : 0, hstride = m >= 2 ? xstride[m - 2] : 0;
  const int64_t h0 = std::clamp<int64_t>(HS, 0, H), h1 = std::clamp<int64_t>((m >= 2 ? X[m - 2] : 1) + HS, h0, H);
  auto plane_source = [&](int64_t plane) {
    int64_t from = 0;
    for (int d = m - 3; d >= 0; d--) {
      const int64_t i = plane % Y[d] - S[d];
      plane /= Y[d];
      if (i < 0 || i >= X[d]) return int64_t(-1);
      from += i * xstride[d];
    }
    return from;
  };
  if (inner * static_cast<int64_t>(sizeof(E)) <= OPFORGE_COPY_CHUNK) {  // short rows: ranges of whole rows
    const int64_t grain = std::max<int64_t>(1, OPFORGE_COPY_GRAIN / (std::max<int64_t>(inner, 1) * sizeof(E)));
    opforge::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1;) {
        const int64_t plane = r / H, base = plane_source(plane);
        const int64_t j0 = r - plane * H, j1 = std::min(H, j0 + (r1 - r));
        E *out = y + r * inner;
        for (int64_t j = j0; j < j1; j++, out += inner)
          piece(out, base >= 0 && j >= h0 && j < h1 ? base + (j - HS) * hstride : -1, 0, inner);
        r += j1 - j0;
      }
    });
    return;
  }
  ForRowPieces(rows, inner, sizeof(E), [&](int64_t row, int64_t a, int64_t b) {
    const int64_t plane = row / H, j = row % H, base = plane_source(plane);
    piece(y + row * inner, base >= 0 && j >= h0 && j < h1 ? base + (j - HS) * hstride : -1, a, b);
  });
}

// Appends a dim of `size` read at `step` to a copy's (dim, stride) lists: merged into the last dim where
// it continues it (that dim's stride is size * step), dropped when of size 1.
static inline void AppendDim(std::vector<int64_t> &dim, std::vector<int64_t> &stride, int64_t size, int64_t step) {
  if (size == 1) return;
  if (!dim.empty() && stride.back() == step * size) {
    dim.back() *= size;
    stride.back() = step;
  } else {
    dim.push_back(size);
    stride.push_back(step);
  }
}

// y (contiguous, shape out) = x read at element strides `from` (0 along
// broadcast dims, negative for reversed ones) from x's element 0.  Dims are
// merged where x steps through them alike, size-1 dims dropped; each row is a
// memcpy (unit stride), a fill (stride 0) or a strided gather.
template <typename E>
static void StridedCopy(const E *x, E *y, const int64_t *out, const int64_t *from, int rank) {
  std::vector<int64_t> dim, stride;
  int64_t n = 1;
  for (int d = 0; d < rank; d++) {
    n *= out[d];
    AppendDim(dim, stride, out[d], from[d]);
  }
  if (n == 0) return;
  if (dim.empty()) {
    y[0] = x[0];
    return;
  }
  const int m = static_cast<int>(dim.size());
  int64_t rows = 1;
  for (int d = 0; d < m - 1; d++) rows *= dim[d];
  const int64_t inner = dim[m - 1], step = stride[m - 1];
  ForRowPieces(rows, inner, sizeof(E), [&](int64_t row, int64_t a, int64_t b) {
    int64_t offset = a * step;
    for (int64_t r = row, d = m - 2; d >= 0; d--) {
      offset += (r % dim[d]) * stride[d];
      r /= dim[d];
    }
    E *o = y + row * inner + a;
    const E *i = x + offset;
    if (step == 1) std::memcpy(o, i, (b - a) * sizeof(E));
    else if (step == 0) FillRun(o, b - a, i[0]);
    else for (int64_t j = 0; j < b - a; j++) o[j] = i[j * step];
  });
}

// The unsigned integer of N bytes, which moves an element of that size.
template <int N> struct ElementBits;
template <> struct ElementBits<1> { typedef uint8_t type; };
template <> struct ElementBits<2> { typedef uint16_t type; };
template <> struct ElementBits<4> { typedef uint32_t type; };
template <> struct ElementBits<8> { typedef uint64_t type; };

// The unsigned type of an element size (1, 2, 4, 8 bytes): CALL(E), or return 2.
#define OPFORGE_BY_ELEMENT_SIZE(size, CALL) \
  switch (size) {                           \
    case 1: CALL(uint8_t);                  \
    case 2: CALL(uint16_t);                 \
    case 4: CALL(uint32_t);                 \
    case 8: CALL(uint64_t);                 \
    default: return 2;                      \
  }

// StridedCopy of elements of `dtype`, moved as unsigned integers of their size; 0, or 2 for an
// element size it does not know.
static inline int StridedCopyOf(const char *dtype, const void *x, void *y, const std::vector<int64_t> &out,
                                const std::vector<int64_t> &from) {
#define OPFORGE_STRIDED_COPY(E)                                                                       \
  StridedCopy<E>(static_cast<const E *>(x), static_cast<E *>(y), out.data(), from.data(),             \
                 static_cast<int>(out.size()));                                                       \
  return 0
  OPFORGE_BY_ELEMENT_SIZE(ElementSize(dtype), OPFORGE_STRIDED_COPY)
#undef OPFORGE_STRIDED_COPY
}

#endif  // OPFORGE_BUILTINS_ELEMENTS_H_
