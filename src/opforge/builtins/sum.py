"""sum: y = inputs[0] + inputs[1] + ..., elementwise with NumPy broadcasting of all.

A variadic op (ONNX Sum): ``sum(a, b, c)``.  Every input has one dtype;
the output has their broadcast shape.  Inputs of y's shape are added a
block at a time (each block of y in cache while every input is added to it),
the blocks on opforge's pool; otherwise the kernel writes the first input
into y and adds the others in, each read through broadcast strides (add.py's
helpers); the gradient of each input is dy summed back to its shape.  A
channel-blocked (nchw16c) variant adds inputs of one 4-d shape in graphs.
Integers wrap around on overflow, as in NumPy (the kernel adds them as
unsigned, where C++ defines the wrap).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.add import BROADCAST_HELPERS, sum_to
from opforge.builtins.common import FLOATS, NUMERIC, SIMD_ISAS, every_dtype

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import TensorSpec

sum = opforge.op("sum(Tensor[] inputs) -> Tensor y", traits=["no_side_effect"],  # noqa: A001 - the op's name
                 doc="Elementwise sum of one or more tensors of one dtype, with NumPy broadcasting.")
sum.def_infer(infer.broadcast())


@sum.check
def sum_check(*inputs: TensorSpec) -> str | None:
    if not inputs:
        return "needs at least one input"
    for k, spec in enumerate(inputs[1:], 1):
        if spec.dtype != inputs[0].dtype:
            raise opforge.DTypeError(f"op 'sum': input 'inputs[{k}]' has dtype {spec.dtype}, "
                                     f"'inputs[0]' has {inputs[0].dtype}; sum takes one dtype")
    return None


@sum.reference(fallback=True)
def sum_reference(*inputs: npt.NDArray[Any]) -> npt.NDArray[Any]:
    shape = np.broadcast_shapes(*(x.shape for x in inputs))
    total = functools.reduce(np.add, inputs[1:], np.broadcast_to(inputs[0], shape))
    return np.array(total, dtype=inputs[0].dtype)  # a copy: never a view of an input


@sum.grad(save=["inputs"])
def sum_grad(saved: Any, dy: Any) -> tuple[Any, ...]:
    return tuple(sum_to(dy, x) for x in saved.inputs)


SUM = BROADCAST_HELPERS + r"""
#include <algorithm>
#include <type_traits>

#include "opforge/parallel.h"

// a + b; integers through their unsigned type, so overflow wraps (signed overflow is undefined in C++).
template <typename V, bool Integral = std::is_integral<V>::value>
struct Plus {
  static V Apply(V a, V b) { return a + b; }
};
template <typename V>
struct Plus<V, true> {
  typedef typename std::make_unsigned<V>::type U;
  static V Apply(V a, V b) { return static_cast<V>(static_cast<U>(a) + static_cast<U>(b)); }
};

// y = x (first) or y += x, x read through its broadcast strides at y's shape.
template <bool First>
static void Accumulate(const T *x, int ndim, const int64_t *shape, T *y, int rank, const int64_t *out, int64_t n) {
  const int64_t nx = Count(ndim, shape);
  if (nx == n) {  // laid out like y (broadcasting only adds size-1 dims)
    for (int64_t i = 0; i < n; i++) y[i] = First ? x[i] : Plus<T>::Apply(y[i], x[i]);
    return;
  }
  if (nx == 1) {
    const T s = x[0];
    for (int64_t i = 0; i < n; i++) y[i] = First ? s : Plus<T>::Apply(y[i], s);
    return;
  }
  // rank >= 1 here: a 0-d y has n == 1, and then nx == 1.
  std::vector<int64_t> strides(rank), index(rank, 0);
  BroadcastStrides(ndim, shape, rank, strides.data());
  const int64_t inner = out[rank - 1], step = strides[rank - 1];
  int64_t offset = 0;
  for (int64_t start = 0; start < n; start += inner) {
    T *row = y + start;
    const T *xs = x + offset;
    for (int64_t j = 0; j < inner; j++) row[j] = First ? xs[j * step] : Plus<T>::Apply(row[j], xs[j * step]);
    for (int d = rank - 2; d >= 0; d--) {
      offset += strides[d];
      if (++index[d] < out[d]) break;
      offset -= strides[d] * out[d];
      index[d] = 0;
    }
  }
}

// y = ((x0 + x1) + x2) + x3 over n elements, with as many of x1..x3 as are not null; x0 may be y itself.
static void Fold(T *y, const T *x0, const T *__restrict x1, const T *__restrict x2, const T *__restrict x3,
                 int64_t n) {
  typedef Plus<T> P;
  if (x3 != nullptr) {
    for (int64_t i = 0; i < n; i++) y[i] = P::Apply(P::Apply(P::Apply(x0[i], x1[i]), x2[i]), x3[i]);
  } else if (x2 != nullptr) {
    for (int64_t i = 0; i < n; i++) y[i] = P::Apply(P::Apply(x0[i], x1[i]), x2[i]);
  } else if (x1 != nullptr) {
    for (int64_t i = 0; i < n; i++) y[i] = P::Apply(x0[i], x1[i]);
  } else {
    for (int64_t i = 0; i < n; i++) y[i] = x0[i];
  }
}

// Inputs laid out like y (n elements each): y = ((x0 + x1) + x2) + ..., a block at a time, the blocks on
// opforge's pool.  The first four inputs are added in one pass, then three more per pass onto y's block,
// which stays in cache meanwhile: every input is read from memory once and y written once, and the
// additions keep the order of one input at a time.
static void SumSameShape(void **params, int inputs, T *y, int64_t n) {
  const int64_t kBlock = 1 << 15;  // elements: y's block stays in L2 while the inputs stream by
  opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; b += kBlock) {
      const int64_t e = std::min(hi, b + kBlock);
      auto at = [&](int k) { return k < inputs ? static_cast<const T *>(params[k]) + b : nullptr; };
      Fold(y + b, at(0), at(1), at(2), at(3), e - b);
      for (int k = 4; k < inputs; k += 3) Fold(y + b, y + b, at(k), at(k + 1), at(k + 2), e - b);
    }
  });
}

extern "C" int Sum(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                   void *stream, void *extra) {
  const int inputs = nparam - 1;  // the inputs, then y
  if (inputs < 1) return 1;
  T *y = static_cast<T *>(params[inputs]);
#ifdef OPFORGE_LAYOUT_NCHW16C
  // Channel-blocked tensors of one shape (the layout pass's condition): elementwise over the padded buffer.
  for (int k = 0; k <= inputs; k++) {
    if (ndims[k] != 4) return 3;
    for (int d = 0; d < 4; d++)
      if (shapes[k][d] != shapes[inputs][d]) return 4;
  }
  const int64_t *s = shapes[inputs];
  try {
    SumSameShape(params, inputs, y, s[0] * ((s[1] + 15) / 16 * 16) * s[2] * s[3]);
  } catch (...) {  // (the pool): nothing crosses the ABI
    return 5;
  }
  return 0;
#endif
  const int rank = ndims[inputs];
  const int64_t *out = shapes[inputs];
  const int64_t n = Count(rank, out);
  if (n == 0) return 0;
  bool same = true;  // every input laid out like y
  for (int k = 0; k < inputs; k++) same = same && ndims[k] <= rank && Count(ndims[k], shapes[k]) == n;
  if (same) {
    try {
      SumSameShape(params, inputs, y, n);
    } catch (...) {
      return 5;
    }
    return 0;
  }
  for (int k = 0; k < inputs; k++) {
    if (ndims[k] > rank) return 2;  // inference gives y the broadcast rank
    const T *x = static_cast<const T *>(params[k]);
    if (k == 0) Accumulate<true>(x, ndims[k], shapes[k], y, rank, out, n);
    else Accumulate<false>(x, ndims[k], shapes[k], y, rank, out, n);
  }
  return 0;
}
"""
for _isa in SIMD_ISAS:  # the blocks' adds in the widest vectors the CPU has
    sum.kernel(function="Sum", code=every_dtype(SUM, "Sum", NUMERIC), dtypes=[(d,) for d in NUMERIC], isa=_isa)
    sum.kernel(function="Sum", code=every_dtype(SUM, "Sum", FLOATS), dtypes=[(d,) for d in FLOATS], layout="nchw16c",
               isa=_isa)
del _isa
