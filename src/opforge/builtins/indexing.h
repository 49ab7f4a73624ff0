// Helpers of the element indexing kernels (gather_elements, scatter_elements, gather_nd,
// scatter_nd): where an index lands in data, and the scatter reductions.  Every index is
// checked before anything is written; a kernel returns 4 for one out of range.
#ifndef OPFORGE_BUILTINS_INDEXING_H_
#define OPFORGE_BUILTINS_INDEXING_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "custom_aot_extra.h"
#include "elements.h"

// indices (rank r) walked row by row over its last dim: element j of row `row` reads or writes
// data at Base(row) + j * step + index * stride[axis].
struct AxisWalk {
  int rank = 0;
  int64_t axis = 0, last = 0, rows = 0, step = 1, axis_stride = 1, size = 0;
  std::vector<int64_t> stride, ishape;

  // 0, or 3 when indices is larger than data on an axis other than `axis`.
  int Init(int r, const int64_t *dshape, const int64_t *idims, int64_t a) {
    rank = r, axis = a;
    stride.assign(r, 1);
    ishape.assign(idims, idims + r);
    for (int d = r - 2; d >= 0; d--) stride[d] = stride[d + 1] * dshape[d + 1];
    for (int d = 0; d < r; d++)
      if (d != a && idims[d] > dshape[d]) return 3;
    last = idims[r - 1];
    rows = 1;
    for (int d = 0; d < r - 1; d++) rows *= idims[d];
    step = a == r - 1 ? 0 : 1;
    axis_stride = stride[a];
    size = dshape[a];
    return 0;
  }
  int64_t Base(int64_t row) const {
    int64_t base = 0;
    for (int d = rank - 2; d >= 0; d--) {
      const int64_t c = row % ishape[d];
      row /= ishape[d];
      if (d != axis) base += c * stride[d];
    }
    return base;
  }
  // Whether every index is in [-size, size).
  template <typename I>
  bool Fits(const I *indices) const {
    for (int64_t i = 0; i < rows * last; i++)
      if (int64_t(indices[i]) < -size || int64_t(indices[i]) >= size) return false;
    return true;
  }
  template <typename I>
  int64_t At(int64_t base, int64_t j, I index) const {
    const int64_t at = int64_t(index) < 0 ? int64_t(index) + size : int64_t(index);
    return base + j * step + at * axis_stride;
  }
};

// f(indices) with indices typed by their dtype name (int64 or int32); 2 for another dtype.
template <typename F>
static inline int ByIndexType(const char *dtype, const void *indices, F &&f) {
  if (!std::strcmp(dtype, "int64")) return f(static_cast<const int64_t *>(indices));
  if (!std::strcmp(dtype, "int32")) return f(static_cast<const int32_t *>(indices));
  return 2;
}

// axis from the attribute, made non-negative; -1 when it is out of range.
static inline int64_t AxisOf(void *extra, int rank) {
  int64_t axis = static_cast<AotExtra *>(extra)->Attr<int64_t>("axis");
  if (axis < 0) axis += rank;
  return axis < 0 || axis >= rank ? -1 : axis;
}

// data [batch..., tuple dims (k)..., slice dims...] and indices [batch..., outer..., k]:
// tuple t (counted over all batches) reads or writes the `slice` elements at Start(t, indices).
struct NdWalk {
  int64_t batches = 1, tuples = 1, k = 0, slice = 1, block = 1;
  std::vector<int64_t> sizes, strides;  // of the k tuple dims of data

  // 0, or 3 when the shapes do not fit (the op's check rejects these first).
  int Init(int rank, const int64_t *dshape, int qrank, const int64_t *ishape, int64_t batch_dims) {
    if (batch_dims < 0 || qrank <= batch_dims || rank <= batch_dims) return 3;
    k = ishape[qrank - 1];
    if (k < 0 || batch_dims + k > rank) return 3;
    for (int d = 0; d < batch_dims; d++) {
      if (dshape[d] != ishape[d]) return 3;
      batches *= dshape[d];
    }
    for (int d = batch_dims; d < qrank - 1; d++) tuples *= ishape[d];
    for (int d = int(batch_dims + k); d < rank; d++) slice *= dshape[d];
    sizes.assign(dshape + batch_dims, dshape + batch_dims + k);
    strides.assign(k, slice);
    for (int64_t j = k - 2; j >= 0; j--) strides[j] = strides[j + 1] * sizes[j + 1];
    block = k ? strides[0] * sizes[0] : slice;
    return 0;
  }
  template <typename I>
  bool Fits(const I *indices) const {
    for (int64_t t = 0; t < batches * tuples; t++)
      for (int64_t j = 0; j < k; j++) {
        const int64_t at = int64_t(indices[t * k + j]);
        if (at < -sizes[j] || at >= sizes[j]) return false;
      }
    return true;
  }
  // The element offset in data of tuple t (counted over all batches).
  template <typename I>
  int64_t Start(int64_t t, const I *indices) const {
    int64_t start = (t / tuples) * block;
    for (int64_t j = 0; j < k; j++) {
      const int64_t at = int64_t(indices[t * k + j]);
      start += (at < 0 ? at + sizes[j] : at) * strides[j];
    }
    return start;
  }
};

// Integers wrap as NumPy's do, computed on uint64_t (signed overflow is undefined in C++, and a
// uint16_t product would overflow the int it promotes to); the cast back keeps the low bits.
template <typename E>
static inline E WrapAdd(E a, E b) {
  if constexpr (std::is_integral_v<E> && !std::is_same_v<E, bool>)
    return static_cast<E>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  else
    return E(a + b);
}
template <typename E>
static inline E WrapMul(E a, E b) {
  if constexpr (std::is_integral_v<E> && !std::is_same_v<E, bool>)
    return static_cast<E>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  else
    return E(a * b);
}

template <int R, typename E>
static inline void Reduce(E &into, E update) {
  if (R == 0) into = update;
  if (R == 1) into = WrapAdd(into, update);
  if (R == 2) into = WrapMul(into, update);
  // max / min: a NaN on either side wins, as NumPy's maximum / minimum (the reference) give.
  if (R == 3 && (update > into || update != update)) into = update;
  if (R == 4 && (update < into || update != update)) into = update;
}

// The reduction attribute's number (none 0, add 1, mul 2, max 3, min 4); -1 for another name.
static inline int ReductionOf(void *extra) {
  const std::string name = static_cast<AotExtra *>(extra)->Attr<std::string>("reduction");
  const char *names[] = {"none", "add", "mul", "max", "min"};
  for (int r = 0; r < 5; r++)
    if (name == names[r]) return r;
  return -1;
}

// F(R, E) for reduction r and element type E: by size for "none" (a write moves bytes), else by
// dtype name.  Returns F's status, or 2 for a dtype without arithmetic here.
#define OPFORGE_SCATTER_DISPATCH(r, dtype, F)                                                   \
  do {                                                                                          \
    if (r == 0) {                                                                               \
      switch (ElementSize(dtype)) {                                                             \
        case 1: return F(0, uint8_t);                                                         \
        case 2: return F(0, uint16_t);                                                        \
        case 4: return F(0, uint32_t);                                                        \
        case 8: return F(0, uint64_t);                                                        \
        default: return 2;                                                                      \
      }                                                                                         \
    }                                                                                           \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "float32", float)                                        \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "float64", double)                                       \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "int8", int8_t)                                          \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "int16", int16_t)                                        \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "int32", int32_t)                                        \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "int64", int64_t)                                        \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "uint8", uint8_t)                                        \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "uint16", uint16_t)                                      \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "uint32", uint32_t)                                      \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "uint64", uint64_t)                                      \
    OPFORGE_SCATTER_TYPED(r, dtype, F, "bool", bool)                                            \
    return 2;                                                                                   \
  } while (0)
#define OPFORGE_SCATTER_TYPED(r, dtype, F, name, E)                                             \
  if (!std::strcmp(dtype, name)) {                                                              \
    if (r == 1) return F(1, E);                                                               \
    if (r == 2) return F(2, E);                                                               \
    if (r == 3) return F(3, E);                                                               \
    return F(4, E);                                                                           \
  }

#endif  // OPFORGE_BUILTINS_INDEXING_H_
