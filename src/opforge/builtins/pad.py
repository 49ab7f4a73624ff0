"""pad: x grown (or cropped, by negative pads) along every axis (ONNX Pad).

``pads`` holds the begin pads of every axis, then the end pads (2 * rank
entries).  ``mode``: ``constant`` fills with ``value``; ``edge`` repeats the
border element; ``reflect`` mirrors x without repeating the border
(``[a b c]`` padded by 2 -> ``c b [a b c] b a``); ``wrap`` continues
periodically.  Every output element comes from one element of x (or is the
constant): per axis the kernel maps output positions to input ones once,
then fills rows.  ``value`` crosses the ABI as a 32-bit float, so float64
and 64-bit integer kernels receive it rounded to single precision (the
reference does the same).  The gradient is ``pad_grad``: dy summed back onto
the elements each output came from.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import HEADER_DIRS
from opforge.builtins.max_pool import GRADIENT_DTYPES, gradient_op

if TYPE_CHECKING:
    import numpy.typing as npt

MODES = ("constant", "reflect", "edge", "wrap")
PAD_ATTRS = 'int[] pads, str mode="constant", float value=0.0'
PAD_DTYPES = ["float32", "float64", "int32", "int64", "int8", "uint8"]

pad = opforge.op(f"pad(Tensor x, *, {PAD_ATTRS}) -> Tensor y", traits=["no_side_effect"],
                 doc="ONNX Pad: begin pads then end pads per axis (negative ones crop); mode constant (value), "
                     "reflect, edge or wrap.")


@pad.check
def pad_check(x: TensorSpec, *, pads: Sequence[int], mode: str, value: float) -> str | None:
    if mode not in MODES:
        return f"'mode' is {mode!r}; it is one of {', '.join(MODES)}"
    if x.rank is None:
        return None
    if len(pads) != 2 * x.rank:
        return f"'pads' has {len(pads)} entries; input 'x' of rank {x.rank} needs {2 * x.rank} (begins, then ends)"
    for axis, n in enumerate(x.shape):
        out = n + pads[axis] + pads[x.rank + axis] if n != -1 else -1
        if n != -1 and out < 0:
            return f"pads {list(pads)} crop axis {axis} of input 'x' (size {n}) below 0"
        left = n - max(0, -pads[axis]) - max(0, -pads[x.rank + axis])
        if mode != "constant" and n != -1 and left <= 0 and out > 0:
            return f"mode {mode} cannot pad axis {axis} of input 'x': nothing is left of it after cropping"
    return None


@pad.infer
def pad_infer(x: TensorSpec, *, pads: Sequence[int], mode: str, value: float) -> TensorSpec:
    if x.rank is None:
        return TensorSpec(None, x.dtype)
    return TensorSpec([-1 if n == -1 else n + pads[k] + pads[x.rank + k] for k, n in enumerate(x.shape)], x.dtype)


def source_index(n: int, begin: int, end: int, mode: str) -> npt.NDArray[np.int64]:
    """For each output position along one axis, the input position it copies (-1: the constant).
    Negative pads crop first; the mode then pads what is left."""
    low, size = max(0, -begin), n - max(0, -begin) - max(0, -end)
    i = np.arange(size + max(begin, 0) + max(end, 0), dtype=np.int64) - max(begin, 0)
    if mode == "constant" or size <= 0:
        return np.where((i >= 0) & (i < size), i + low, -1)
    if mode == "edge":
        return np.clip(i, 0, size - 1) + low
    if mode == "wrap":
        return i % size + low
    if size == 1:  # reflect
        return np.zeros_like(i) + low
    i = np.abs(i) % (2 * (size - 1))
    return np.where(i >= size, 2 * (size - 1) - i, i) + low


def gather_index(x_shape: Sequence[int], pads: Sequence[int],
                 mode: str) -> tuple[tuple[npt.NDArray[Any], ...], npt.NDArray[np.bool_]]:
    """An index (np.ix_) taking every output's source from x, and the mask of constant outputs."""
    rank = len(x_shape)
    maps = [source_index(n, pads[k], pads[rank + k], mode) for k, n in enumerate(x_shape)]
    constant = np.zeros([len(m) for m in maps], bool)
    for k, m in enumerate(maps):
        constant |= (m < 0).reshape([-1 if j == k else 1 for j in range(rank)])
    return np.ix_(*[np.maximum(m, 0) for m in maps]), constant


def single(value: float) -> float:
    return float(np.float32(value))  # as the kernels receive it


@pad.reference(fallback=True)
def pad_reference(x: npt.NDArray[Any], *, pads: Sequence[int], mode: str, value: float) -> npt.NDArray[Any]:
    index, constant = gather_index(x.shape, pads, mode)
    fill = np.asarray(single(value)).astype(x.dtype)
    if x.size == 0:
        return np.full(constant.shape, fill, x.dtype)
    y: npt.NDArray[Any] = x[index] if x.ndim else x.copy()
    y[constant] = fill
    return y


@pad.grad(save=["x"])
def pad_grad_rule(saved: Any, dy: Any, *, pads: Sequence[int], mode: str, value: float) -> Any:
    return opforge.ops.pad_grad(dy, saved.x, pads=pads, mode=mode, value=value)


PAD_CC = r"""
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "custom_aot_extra.h"
#include "elements.h"

namespace {

// Per axis: for every output position, the input position it copies, or -1 (the constant).
bool SourceMaps(AotExtra *extra, int rank, const int64_t *x, const int64_t *y,
                std::vector<std::vector<int64_t>> *maps) {
  const std::vector<int64_t> pads = extra->Attr<std::vector<int64_t>>("pads");
  const std::string mode = extra->Attr<std::string>("mode");
  if (static_cast<int>(pads.size()) != 2 * rank) return false;
  maps->resize(rank);
  for (int d = 0; d < rank; d++) {
    // negative pads crop first; the mode pads what is left: [low, low + n)
    const int64_t begin = pads[d], end = pads[rank + d];
    const int64_t low = begin < 0 ? -begin : 0, n = x[d] - low - (end < 0 ? -end : 0);
    std::vector<int64_t> &m = (*maps)[d];
    m.resize(y[d]);
    for (int64_t o = 0; o < y[d]; o++) {
      int64_t i = o - (begin > 0 ? begin : 0);
      if (mode == "constant" || n <= 0) {
        i = i >= 0 && i < n ? i : -1 - low;
      } else if (mode == "edge") {
        i = i < 0 ? 0 : i >= n ? n - 1 : i;
      } else if (mode == "wrap") {
        i = ((i % n) + n) % n;
      } else if (mode == "reflect") {
        if (n == 1) {
          i = 0;
        } else {
          i = (i < 0 ? -i : i) % (2 * (n - 1));
          if (i >= n) i = 2 * (n - 1) - i;
        }
      } else {
        return false;
      }
      m[o] = i + low;
    }
  }
  return true;
}

// x's offset of y's row `r` (all dims but the last), or -1 when the row is the constant.
int64_t RowSource(int rank, const int64_t *x, const int64_t *y, const std::vector<std::vector<int64_t>> &maps,
                  int64_t r) {
  int64_t src = 0, stride = rank ? x[rank - 1] : 1;
  for (int d = rank - 2; d >= 0; d--) {
    const int64_t i = maps[d][r % y[d]];
    r /= y[d];
    if (i < 0) return -1;
    src += i * stride;
    stride *= x[d];
  }
  return src;
}

// Other modes (edge, reflect, wrap): rows in parallel, each row's longest
// run of consecutive sources one memcpy, the rest element by element.
template <typename E>
int PadMapped(int rank, const int64_t *xs, const int64_t *ys, const E *x, E *y, E value,
              const std::vector<std::vector<int64_t>> &maps) {
  if (rank == 0) {
    y[0] = x[0];
    return 0;
  }
  const std::vector<int64_t> &last = maps[rank - 1];
  const int64_t width = ys[rank - 1];
  int64_t run0 = 0, run1 = 0;  // the longest run of last with last[j + 1] == last[j] + 1
  for (int64_t j = 0; j < width;) {
    int64_t k = j + 1;
    while (last[j] >= 0 && k < width && last[k] == last[k - 1] + 1) k++;
    if (last[j] >= 0 && k - j > run1 - run0) run0 = j, run1 = k;
    j = k;
  }
  int64_t rows = 1;
  for (int d = 0; d < rank - 1; d++) rows *= ys[d];
  opforge::parallel_for(0, rows, std::max<int64_t>(1, OPFORGE_COPY_GRAIN / (sizeof(E) * std::max<int64_t>(width, 1))),
                     [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      E *out = y + r * width;
      const int64_t in = RowSource(rank, xs, ys, maps, r);
      if (in < 0) {
        FillRun(out, width, value);
        continue;
      }
      const E *row = x + in;
      for (int64_t j = 0; j < run0; j++) out[j] = last[j] < 0 ? value : row[last[j]];
      if (run1 > run0) std::memcpy(out + run0, row + last[run0], (run1 - run0) * sizeof(E));
      for (int64_t j = run1; j < width; j++) out[j] = last[j] < 0 ? value : row[last[j]];
    }
  });
  return 0;
}

// The gradient of the other modes: dy added back onto its sources (serial: sources repeat).
template <typename T>
int PadGradMapped(int rank, const int64_t *xs, const int64_t *ys, const T *dy, T *dx,
                  const std::vector<std::vector<int64_t>> &maps) {
  ParallelFill(dx, ElementCount(rank, xs), T(0));
  if (rank == 0) {
    dx[0] = dy[0];
    return 0;
  }
  const std::vector<int64_t> &last = maps[rank - 1];
  const int64_t width = ys[rank - 1];
  const int64_t rows = ElementCount(rank - 1, ys);
  for (int64_t r = 0; r < rows; r++) {
    const int64_t in = RowSource(rank, xs, ys, maps, r);
    if (in < 0) continue;
    for (int64_t j = 0; j < width; j++)
      if (last[j] >= 0) dx[in + last[j]] += dy[r * width + j];
  }
  return 0;
}

bool Constant(AotExtra *extra, int rank, std::vector<int64_t> *begins) {
  if (extra->Attr<std::string>("mode") != "constant") return false;
  const std::vector<int64_t> pads = extra->Attr<std::vector<int64_t>>("pads");
  if (static_cast<int>(pads.size()) != 2 * rank) return false;
  begins->assign(pads.begin(), pads.begin() + rank);
  return true;
}

// The value's bits, as ShiftCopy moves them.
template <typename T>
int PadConstant(void **params, int64_t **shapes, int rank, const std::vector<int64_t> &begins, T value) {
  typedef typename ElementBits<sizeof(T)>::type E;
  E fill;
  std::memcpy(&fill, &value, sizeof(T));
  ShiftCopy<E>(static_cast<const E *>(params[0]), shapes[0], static_cast<E *>(params[1]), shapes[1],
               begins.data(), rank, fill);
  return 0;
}

}  // namespace

// params: x, y.  Constant mode is a shifted copy: y[o] = x[o - begin], the value elsewhere.
extern "C" int Pad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                   void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const int rank = ndims[0];
  const float value = extra->Attr<float>("value");
  std::vector<int64_t> begins;
  if (Constant(extra, rank, &begins)) {
#define PAD_CASE(T, name) \
    if (!std::strcmp(dtypes[0], name)) return PadConstant<T>(params, shapes, rank, begins, static_cast<T>(value));
    PAD_CASE(float, "float32") PAD_CASE(double, "float64") PAD_CASE(int32_t, "int32")
    PAD_CASE(int64_t, "int64") PAD_CASE(int8_t, "int8") PAD_CASE(uint8_t, "uint8")
#undef PAD_CASE
    return 2;
  }
  std::vector<std::vector<int64_t>> maps;
  if (!SourceMaps(extra, rank, shapes[0], shapes[1], &maps)) return 1;
#define PAD_CASE(T, name)                                                                                \
  if (!std::strcmp(dtypes[0], name))                                                                    \
    return PadMapped<T>(rank, shapes[0], shapes[1], static_cast<const T *>(params[0]),                   \
                        static_cast<T *>(params[1]), static_cast<T>(value), maps);
  PAD_CASE(float, "float32") PAD_CASE(double, "float64") PAD_CASE(int32_t, "int32")
  PAD_CASE(int64_t, "int64") PAD_CASE(int8_t, "int8") PAD_CASE(uint8_t, "uint8")
#undef PAD_CASE
  return 2;
}

// params: dy, x, dx (x lends its shape).  Constant mode: each x element is
// copied at most once, so dx is dy shifted back, zeros where x was cropped.
extern "C" int PadGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *stream, void *extra_ptr) {
  AotExtra *extra = static_cast<AotExtra *>(extra_ptr);
  const int rank = ndims[1];
  const int64_t size = ElementSize(dtypes[0]);
  if (size != 4 && size != 8) return 2;
  std::vector<int64_t> begins;
  if (Constant(extra, rank, &begins)) {
    for (int64_t &b : begins) b = -b;
    if (size == 4)
      ShiftCopy<uint32_t>(static_cast<const uint32_t *>(params[0]), shapes[0], static_cast<uint32_t *>(params[2]),
                          shapes[1], begins.data(), rank, 0u);
    else
      ShiftCopy<uint64_t>(static_cast<const uint64_t *>(params[0]), shapes[0], static_cast<uint64_t *>(params[2]),
                          shapes[1], begins.data(), rank, uint64_t(0));
    return 0;
  }
  std::vector<std::vector<int64_t>> maps;
  if (!SourceMaps(extra, rank, shapes[1], shapes[0], &maps)) return 1;
  if (!std::strcmp(dtypes[0], "float32"))
    return PadGradMapped<float>(rank, shapes[1], shapes[0], static_cast<const float *>(params[0]),
                                static_cast<float *>(params[2]), maps);
  if (!std::strcmp(dtypes[0], "float64"))
    return PadGradMapped<double>(rank, shapes[1], shapes[0], static_cast<const double *>(params[0]),
                                 static_cast<double *>(params[2]), maps);
  return 2;
}
"""
pad.kernel(function="Pad", dtypes=[(d,) for d in PAD_DTYPES], code=PAD_CC, include_dirs=HEADER_DIRS)


# -- the gradient -----------------------------------------------------------------

pad_grad = gradient_op("pad", PAD_ATTRS, pad_check, pad_infer,
                       doc="Gradient of pad: zeros like x, with each dy added to the element of x it was copied "
                           "from (constant outputs contribute nothing; x lends only its shape).")


@pad_grad.reference(fallback=True)
def pad_grad_reference(dy: npt.NDArray[Any], x: npt.NDArray[Any], *, pads: Sequence[int], mode: str,
                       value: float) -> npt.NDArray[Any]:
    dx = np.zeros(x.shape, dy.dtype)
    if x.size == 0:
        return dx
    index, constant = gather_index(x.shape, pads, mode)
    np.add.at(dx, index, np.where(constant, 0, dy))
    return dx


pad_grad.kernel(function="PadGrad", dtypes=GRADIENT_DTYPES, code=PAD_CC, include_dirs=HEADER_DIRS)
