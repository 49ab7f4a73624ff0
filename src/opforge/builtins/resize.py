"""resize: x resampled along some axes (ONNX Resize, opsets 10 to 19).

Each resized axis is independent (nearest, linear and cubic are all
separable), so both the reference and the kernel resample one axis at a
time: per output position, a few taps (input positions) and their weights.

* Output length: ``sizes`` (with ``keep_aspect_ratio_policy`` ``not_larger``
  / ``not_smaller``: one scale for all ``axes``, the smallest / largest
  ratio, lengths rounded), or ``floor(length * scale)`` for ``scales``
  (times the roi's extent for ``tf_crop_and_resize``).  The scale used for
  coordinates is the given one, or out / in for sizes.
* ``coordinate_transformation_mode`` maps an output position to an input
  coordinate: half_pixel, half_pixel_symmetric, pytorch_half_pixel,
  align_corners, asymmetric, tf_half_pixel_for_nn, tf_crop_and_resize
  (``roi``: starts then ends per axis, as fractions; coordinates outside x
  give ``extrapolation_value``).
* ``mode`` nearest (``nearest_mode`` round_prefer_floor, round_prefer_ceil,
  floor, ceil), linear, cubic (``cubic_coeff_a``).  Taps outside x repeat
  the border, or with ``exclude_outside`` are dropped and the rest
  renormalised.  ``antialias`` widens linear and cubic filters by 1 / scale
  when downsampling.

Floating-point; the C++ kernel (float32, float64) builds the same tap
tables, and sums in double.  The gradient is ``resize_grad``: dy sent back
through the taps (the transposed weights), by the same kernel source.  Where
only the last two axes resample (NCHW images), both go plane by plane on
opforge's threads; otherwise one axis at a time.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import FLOATS, floating_point
from opforge.builtins.max_pool import GRADIENT_DTYPES, gradient_op

if TYPE_CHECKING:
    import numpy.typing as npt

    #: A resampled axis of ``tables``: (axis, weights [out, in], nearest index or None).
    Table: TypeAlias = tuple[int, npt.NDArray[np.float64], list[int] | None]

MODES = ("nearest", "linear", "cubic")
TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
              "tf_half_pixel_for_nn", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
POLICIES = ("stretch", "not_larger", "not_smaller")

RESIZE_ATTRS = ('float[] scales=[], int[] sizes=[], int[] axes=[], str mode="nearest", '
                'str coordinate_transformation_mode="half_pixel", str nearest_mode="round_prefer_floor", '
                'float cubic_coeff_a=-0.75, bool exclude_outside=False, float extrapolation_value=0.0, '
                'bool antialias=False, float[] roi=[], str keep_aspect_ratio_policy="stretch"')
resize = opforge.op(f"resize(Tensor x, *, {RESIZE_ATTRS}) -> Tensor y", traits=["no_side_effect"],
                    doc="ONNX Resize: nearest / linear / cubic resampling of the given axes (default all) to sizes "
                        "or by scales.")
is_float = floating_point("resize", "x")


@resize.check
def resize_check(x: TensorSpec, *, scales: Sequence[float], sizes: Sequence[int], axes: Sequence[int], mode: str,
                 coordinate_transformation_mode: str, nearest_mode: str, cubic_coeff_a: float,
                 exclude_outside: bool, extrapolation_value: float, antialias: bool, roi: Sequence[float],
                 keep_aspect_ratio_policy: str) -> str | None:
    is_float(x)
    for name, value, allowed in (("mode", mode, MODES), ("coordinate_transformation_mode",
                                 coordinate_transformation_mode, TRANSFORMS),
                                 ("nearest_mode", nearest_mode, NEAREST_MODES),
                                 ("keep_aspect_ratio_policy", keep_aspect_ratio_policy, POLICIES)):
        if value not in allowed:
            return f"'{name}' is {value!r}; it is one of {', '.join(allowed)}"
    if bool(scales) == bool(sizes):
        return "give exactly one of 'scales' and 'sizes'"
    if any(s <= 0 for s in scales) or any(s < 0 for s in sizes):
        return f"'scales' must be > 0 and 'sizes' >= 0; got scales {list(scales)}, sizes {list(sizes)}"
    count = len(scales or sizes)
    if axes and len(axes) != count:
        return f"'axes' has {len(axes)} entries and {'scales' if scales else 'sizes'} {count}; they must match"
    if roi and len(roi) != 2 * count:
        return f"'roi' has {len(roi)} entries; {count} axes need {2 * count} (starts, then ends)"
    if x.rank is None:
        return None
    if not axes and count != x.rank:
        return f"{'scales' if scales else 'sizes'} has {count} entries; input 'x' of rank {x.rank} needs {x.rank}"
    if any(not -x.rank <= a < x.rank for a in axes):
        return f"'axes' {list(axes)} is out of range for input 'x' of rank {x.rank}"
    if len({a % x.rank for a in axes}) != len(axes):
        return f"'axes' {list(axes)} names an axis twice"
    return None


def plan(shape: Sequence[int], scales: Sequence[float], sizes: Sequence[int], axes: Sequence[int],
         roi: Sequence[float], transform: str, policy: str) -> list[tuple[int, int, float | None, float, float]]:
    """Per resized axis: (axis, output length, coordinate scale, roi start, roi end).  Unknown lengths -1."""
    rank = len(shape)
    axes = [a % rank for a in axes] if axes else list(range(rank))
    roi = list(roi) or [0.0] * len(axes) + [1.0] * len(axes)
    starts, ends = roi[:len(axes)], roi[len(axes):]
    if sizes and policy != "stretch":
        if any(shape[a] == -1 for a in axes):
            ratio = None
        else:
            ratios = [s / shape[a] if shape[a] else 1.0 for a, s in zip(axes, sizes)]
            ratio = min(ratios) if policy == "not_larger" else max(ratios)
        return [(a, -1 if ratio is None else int(math.floor(ratio * shape[a] + 0.5)), ratio, s, e)
                for a, s, e in zip(axes, starts, ends)]
    result = []
    for k, a in enumerate(axes):
        n = shape[a]
        if sizes:
            result.append((a, sizes[k], None if n in (-1, 0) else sizes[k] / n, starts[k], ends[k]))
        else:
            extent = np.float32(ends[k]) - np.float32(starts[k]) if transform == "tf_crop_and_resize" else 1.0
            # in float32, as ONNX's scales are (floor of a product that is a whole number in float32)
            out = -1 if n == -1 else int(math.floor(np.float32(n) * np.float32(extent) * np.float32(scales[k])))
            result.append((a, out, scales[k], starts[k], ends[k]))
    return result


@resize.infer
def resize_infer(x: TensorSpec, *, scales: Sequence[float], sizes: Sequence[int], axes: Sequence[int],
                 coordinate_transformation_mode: str, keep_aspect_ratio_policy: str, roi: Sequence[float],
                 **rest: Any) -> TensorSpec:
    if x.rank is None:
        return TensorSpec(None, x.dtype)
    shape = list(x.shape)
    for axis, out, *_ in plan(x.shape, scales, sizes, axes, roi, coordinate_transformation_mode,
                              keep_aspect_ratio_policy):
        shape[axis] = out
    return TensorSpec(shape, x.dtype)


def coordinate(o: int, n: int, m: int, scale: float, start: float, end: float, transform: str) -> float:
    """The input coordinate of output position o (n in, m out)."""
    if transform == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if transform == "half_pixel_symmetric":
        adjustment = m / (scale * n)
        return n / 2 * (1 - adjustment) + (o + 0.5) / scale - 0.5
    if transform == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if m > 1 else 0.0
    if transform == "align_corners":  # the output's length before flooring, as onnx's test cases have it
        length = n * scale
        return 0.0 if m == 1 or length == 1 else o * (n - 1) / (length - 1)
    if transform == "asymmetric":
        return o / scale
    if transform == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    # tf_crop_and_resize
    if m > 1:
        return start * (n - 1) + o * (end - start) * (n - 1) / (m - 1)
    return 0.5 * (start + end) * (n - 1)


def nearest(c: float, nearest_mode: str) -> int:
    if nearest_mode == "floor":
        return math.floor(c)
    if nearest_mode == "ceil":
        return math.ceil(c)
    if c == math.floor(c) + 0.5:
        return math.floor(c) if nearest_mode == "round_prefer_floor" else math.ceil(c)
    return math.floor(c + 0.5)


def cubic_weight(t: float, a: float) -> float:
    t = abs(t)
    if t <= 1:
        return ((a + 2) * t - (a + 3)) * t * t + 1
    if t < 2:
        return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return 0.0


def taps(n: int, m: int, scale: float, start: float, end: float, *, mode: str, coordinate_transformation_mode: str,
         nearest_mode: str, cubic_coeff_a: float, exclude_outside: bool, antialias: bool,
         **rest: Any) -> list[tuple[list[tuple[int, float]], bool]]:
    """Per output position along one axis: ([(input index, weight), ...], extrapolated?)."""
    rows = []
    for o in range(m):
        c = coordinate(o, n, m, scale, start, end, coordinate_transformation_mode)
        outside = coordinate_transformation_mode == "tf_crop_and_resize" and not 0 <= c <= n - 1
        if mode == "nearest":
            rows.append(([(min(max(nearest(c, nearest_mode), 0), n - 1), 1.0)], outside))
            continue
        width = 1.0 if mode == "linear" else 2.0
        stretch = scale if antialias and scale < 1 else 1.0  # the filter widens by 1 / scale
        support = width / stretch
        entries = []
        for i in range(math.floor(c - support) + 1, math.floor(c + support) + 1):
            t = (i - c) * stretch
            w = max(0.0, 1.0 - abs(t)) if mode == "linear" else cubic_weight(t, cubic_coeff_a)
            if not 0 <= i < n:
                if exclude_outside:
                    continue
                i = min(max(i, 0), n - 1)
            entries.append((i, w))
        total = sum(w for _, w in entries)
        if total != 0 and (exclude_outside or antialias):
            entries = [(i, w / total) for i, w in entries]
        rows.append((entries, outside))
    return rows


def tables(shape: Sequence[int], scales: Sequence[float], sizes: Sequence[int], axes: Sequence[int],
           roi: Sequence[float], keep_aspect_ratio_policy: str,
           attrs: Mapping[str, Any]) -> tuple[list[Table], npt.NDArray[np.bool_]]:
    """Per resampled axis that is not an identity: (axis, weights [out, in], nearest index or None); and the
    mask (broadcastable to the output) of positions outside the roi."""
    # float attributes cross the ABI as 32-bit floats: the reference rounds them the same way
    scales, roi = [float(np.float32(v)) for v in scales], [float(np.float32(v)) for v in roi]
    attrs = dict(attrs, cubic_coeff_a=float(np.float32(attrs["cubic_coeff_a"])))
    rank = len(shape)
    result, outside = [], np.zeros((1,) * rank, bool)
    for axis, m, scale, start, end in plan(shape, scales, sizes, axes, roi, attrs["coordinate_transformation_mode"],
                                           keep_aspect_ratio_policy):
        n = shape[axis]
        # (scale is None only where n is 0 or unknown, and an array's n is known)
        rows = taps(n, m, scale, start, end, **attrs) if n else []  # type: ignore[arg-type]
        weights = np.zeros((m, n))
        for o, (entries, _) in enumerate(rows):
            for i, w in entries:
                weights[o, i] += w
        extrapolated = np.array([out for _, out in rows], bool).reshape([-1 if d == axis else 1 for d in range(rank)])
        outside = outside | extrapolated
        if n == m and np.array_equal(weights, np.eye(n)):  # (weights summed per index, as in the kernel)
            continue
        index = [entries[0][0] for entries, _ in rows] if attrs["mode"] == "nearest" else None
        result.append((axis, weights, index))
    return result, outside


@resize.reference(fallback=True)
def resize_reference(x: npt.NDArray[Any], *, scales: Sequence[float], sizes: Sequence[int], axes: Sequence[int],
                     roi: Sequence[float], keep_aspect_ratio_policy: str, extrapolation_value: float,
                     **attrs: Any) -> npt.NDArray[Any]:
    y = x.astype(np.float64)
    resampled, outside = tables(x.shape, scales, sizes, axes, roi, keep_aspect_ratio_policy, attrs)
    for axis, weights, index in resampled:
        if index is not None:  # a gather: no 0 * inf
            y = np.take(y, np.asarray(index, np.int64), axis=axis)
        else:
            y = np.moveaxis(np.tensordot(weights, y, axes=([1], [axis])), 0, axis)
    y[np.broadcast_to(outside, y.shape)] = np.float32(extrapolation_value)
    return y.astype(x.dtype)


@resize.grad(save=["x"])
def resize_grad_rule(saved: Any, dy: Any, **attrs: Any) -> Any:
    return opforge.ops.resize_grad(dy, saved.x, **attrs)


# The kernel: resize_reference's tap tables, built the same way (once per signature, by the Inits); when only
# the last two axes resample, each output row blends rows of x straight into y (the gradient: each plane of dy
# sent back into a plane of double), rows and planes on opforge's threads; otherwise one axis at a time
# through buffers of double.
RESIZE_CC = r"""
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

namespace {

struct Settings {
  std::string mode, transform, nearest;
  double a = -0.75;
  bool exclude = false, antialias = false;
};

struct Tap {
  int64_t index;
  double weight;
};

double Coordinate(int64_t o, int64_t n, int64_t m, double scale, double start, double end, const std::string &t) {
  if (t == "half_pixel") return (o + 0.5) / scale - 0.5;
  if (t == "half_pixel_symmetric") return n / 2.0 * (1 - m / (scale * n)) + (o + 0.5) / scale - 0.5;
  if (t == "pytorch_half_pixel") return m > 1 ? (o + 0.5) / scale - 0.5 : 0.0;
  if (t == "align_corners") {
    const double length = n * scale;
    return m == 1 || length == 1 ? 0.0 : o * (n - 1) / (length - 1);
  }
  if (t == "asymmetric") return o / scale;
  if (t == "tf_half_pixel_for_nn") return (o + 0.5) / scale;
  if (m > 1) return start * (n - 1) + o * (end - start) * (n - 1) / (m - 1);  // tf_crop_and_resize
  return 0.5 * (start + end) * (n - 1);
}

int64_t Nearest(double c, const std::string &mode) {
  if (mode == "floor") return static_cast<int64_t>(std::floor(c));
  if (mode == "ceil") return static_cast<int64_t>(std::ceil(c));
  if (c == std::floor(c) + 0.5)
    return static_cast<int64_t>(mode == "round_prefer_floor" ? std::floor(c) : std::ceil(c));
  return static_cast<int64_t>(std::floor(c + 0.5));
}

double Cubic(double t, double a) {
  t = std::fabs(t);
  if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
  return 0.0;
}

// The taps of every output position along one axis; outside[o]: the coordinate left x (tf_crop_and_resize).
void Taps(int64_t n, int64_t m, double scale, double start, double end, const Settings &s,
          std::vector<std::vector<Tap>> *rows, std::vector<char> *outside) {
  rows->assign(m, {});
  outside->assign(m, 0);
  for (int64_t o = 0; o < m; o++) {
    const double c = Coordinate(o, n, m, scale, start, end, s.transform);
    (*outside)[o] = s.transform == "tf_crop_and_resize" && !(c >= 0 && c <= n - 1);
    std::vector<Tap> &row = (*rows)[o];
    if (s.mode == "nearest") {
      row.push_back({std::min(std::max<int64_t>(Nearest(c, s.nearest), 0), n - 1), 1.0});
      continue;
    }
    const double stretch = s.antialias && scale < 1 ? scale : 1.0;
    const double support = (s.mode == "linear" ? 1.0 : 2.0) / stretch;
    double total = 0;
    const int64_t first = static_cast<int64_t>(std::floor(c - support)) + 1;
    const int64_t last = static_cast<int64_t>(std::floor(c + support));
    for (int64_t i = first; i <= last; i++) {
      const double t = (i - c) * stretch;
      const double w = s.mode == "linear" ? std::max(0.0, 1.0 - std::fabs(t)) : Cubic(t, s.a);
      int64_t at = i;
      if (i < 0 || i >= n) {
        if (s.exclude) continue;
        at = std::min(std::max<int64_t>(i, 0), n - 1);
      }
      row.push_back({at, w});
      total += w;
    }
    if (total != 0 && (s.exclude || s.antialias))
      for (Tap &tap : row) tap.weight /= total;
  }
}

// Every output copies the input at its own position (weight 1, the other taps 0): nothing to do.
bool Identity(int64_t n, int64_t m, const std::vector<std::vector<Tap>> &rows) {
  if (n != m) return false;
  for (int64_t o = 0; o < m; o++) {  // weights summed per index (a clamped tap may repeat one)
    double own = 0;
    for (const Tap &tap : rows[o]) {
      if (tap.index == o) own += tap.weight;
      else if (tap.weight != 0) return false;
    }
    if (own != 1.0) return false;
  }
  return true;
}

// The taps of every resized axis of x (in_shape) resampled to out_shape that is not an identity (rows[axis]
// empty otherwise) and the positions outside the roi; false on attributes the op's check refuses.
bool AllTaps(AotExtra *extra, int rank, const int64_t *in_shape, const int64_t *out_shape,
             std::vector<std::vector<std::vector<Tap>>> *rows, std::vector<std::vector<char>> *outside,
             std::string *transform) {
  Settings s;
  s.mode = extra->Attr<std::string>("mode");
  s.transform = *transform = extra->Attr<std::string>("coordinate_transformation_mode");
  s.nearest = extra->Attr<std::string>("nearest_mode");
  s.a = extra->Attr<float>("cubic_coeff_a");
  s.exclude = extra->Attr<bool>("exclude_outside");
  s.antialias = extra->Attr<bool>("antialias");
  const std::vector<float> scales = extra->Attr<std::vector<float>>("scales");
  const std::vector<int64_t> sizes = extra->Attr<std::vector<int64_t>>("sizes");
  std::vector<int64_t> axes = extra->Attr<std::vector<int64_t>>("axes");
  const std::vector<float> roi = extra->Attr<std::vector<float>>("roi");
  const std::string policy = extra->Attr<std::string>("keep_aspect_ratio_policy");
  const size_t count = scales.empty() ? sizes.size() : scales.size();
  if (axes.empty())
    for (int d = 0; d < rank; d++) axes.push_back(d);
  if (axes.size() != count || (!roi.empty() && roi.size() != 2 * count)) return false;
  for (int64_t &a : axes) {
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) return false;
  }
  double ratio = 0;  // keep_aspect_ratio_policy's one scale
  if (!sizes.empty() && policy != "stretch") {
    for (size_t k = 0; k < count; k++) {
      const double r = in_shape[axes[k]] ? static_cast<double>(sizes[k]) / in_shape[axes[k]] : 1.0;
      ratio = k == 0 ? r : policy == "not_larger" ? std::min(ratio, r) : std::max(ratio, r);
    }
  }
  rows->assign(rank, {});
  outside->assign(rank, {});
  for (size_t k = 0; k < count; k++) {
    const int64_t axis = axes[k], n = in_shape[axis], m = out_shape[axis];
    double scale;
    if (!scales.empty()) scale = scales[k];
    else if (policy != "stretch") scale = ratio;
    else scale = n ? static_cast<double>(m) / n : 1.0;
    const double start = roi.empty() ? 0.0 : roi[k], end = roi.empty() ? 1.0 : roi[count + k];
    if (n == 0 && m > 0) return false;
    Taps(n, m, scale, start, end, s, &(*rows)[axis], &(*outside)[axis]);
    if (Identity(n, m, (*rows)[axis])) (*rows)[axis].clear();
  }
  for (int d = 0; d < rank; d++)
    if ((*rows)[d].empty() && in_shape[d] != out_shape[d]) return false;
  return true;
}

// Calls visit(offset) for every element of `shape` whose position is outside the roi along some axis.
template <typename Visit>
void ForEachOutside(int rank, const int64_t *shape, const std::vector<std::vector<char>> &outside, Visit visit) {
  int64_t total = 1;
  for (int d = 0; d < rank; d++) total *= shape[d];
  std::vector<int64_t> index(rank, 0);
  for (int64_t i = 0; i < total; i++) {
    for (int d = 0; d < rank; d++)
      if (!outside[d].empty() && outside[d][index[d]]) {
        visit(i);
        break;
      }
    for (int d = rank - 1; d >= 0; d--) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

// *cur (dims `from`) resampled to dims `to` one axis at a time, through the taps of each axis whose rows
// are not empty.  transposed (the gradient; from: the output's dims, to: the input's): each output's value
// sent back to its taps with their weights.
void ByAxes(int rank, const int64_t *from, const int64_t *to, const std::vector<std::vector<std::vector<Tap>>> &rows,
            bool transposed, std::vector<double> *cur) {
  std::vector<int64_t> shape(from, from + rank);
  std::vector<double> next;
  for (int axis = 0; axis < rank; axis++) {
    if (rows[axis].empty()) continue;
    const int64_t n = shape[axis], m = to[axis];  // the axis's length before and after
    const int64_t outputs = transposed ? n : m, inputs = transposed ? m : n;  // of the taps
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= shape[d];
    for (int d = axis + 1; d < rank; d++) inner *= shape[d];
    next.assign(outer * m * inner, 0.0);
    for (int64_t o = 0; o < outer; o++)
      for (int64_t j = 0; j < outputs; j++)
        for (const Tap &tap : rows[axis][j]) {
          const int64_t output = (o * outputs + j) * inner, input = (o * inputs + tap.index) * inner;
          double *dst = next.data() + (transposed ? input : output);
          const double *src = cur->data() + (transposed ? output : input);
          for (int64_t i = 0; i < inner; i++) dst[i] += tap.weight * src[i];
        }
    cur->swap(next);
    shape[axis] = m;
  }
}

// Elements a task handles at least; below that, waking the pool costs more than it saves.
constexpr int64_t kParallelWork = int64_t(1) << 15;

// Whether only the last two axes resample: then each plane goes straight from x to y, no buffers.
bool Planar(int rank, const std::vector<std::vector<std::vector<Tap>>> &rows) {
  bool planar = rank >= 2;
  for (int d = 0; d + 2 < rank; d++) planar = planar && rows[d].empty();
  return planar;
}

// An axis's taps, one per position with weight 1 where it does not resample (rows empty).
std::vector<std::vector<Tap>> AxisTaps(const std::vector<std::vector<Tap>> &rows, int64_t length) {
  if (!rows.empty()) return rows;
  std::vector<std::vector<Tap>> same(length);
  for (int64_t o = 0; o < length; o++) same[o].push_back({o, 1.0});
  return same;
}

// An axis's taps as a table, `count` (the most any output has) per output, so that the loops over them
// have a length the compiler knows when every output has as many (uniform: all but antialiasing and
// exclude_outside); sizes[o]: how many of its entries output o has (the rest are never read).
struct TapTable {
  int64_t count = 1;
  bool uniform = true;
  std::vector<int64_t> index, sizes;
  std::vector<double> weight;
};

TapTable Table(const std::vector<std::vector<Tap>> &rows) {
  TapTable table;
  for (const auto &row : rows) table.count = std::max<int64_t>(table.count, row.size());
  table.index.assign(rows.size() * table.count, 0);
  table.weight.assign(rows.size() * table.count, 0.0);
  for (size_t o = 0; o < rows.size(); o++) {
    table.sizes.push_back(rows[o].size());
    table.uniform = table.uniform && int64_t(rows[o].size()) == table.count;
    for (size_t t = 0; t < rows[o].size(); t++) {
      table.index[o * table.count + t] = rows[o][t].index;
      table.weight[o * table.count + t] = rows[o][t].weight;
    }
  }
  return table;
}

// out[j] = the taps of output j along `table` over line; K: the table's count, when uniform (0: each
// output's own size).
template <int K, typename T>
void Blend(const TapTable &table, const double *line, T *out, int64_t length) {
  const int64_t *index = table.index.data();
  const double *weight = table.weight.data();
  for (int64_t j = 0; j < length; j++, index += table.count, weight += table.count) {
    const int64_t count = K ? K : table.sizes[j];
    double acc = 0;
    for (int64_t t = 0; t < count; t++) acc += weight[t] * line[index[t]];
    out[j] = static_cast<T>(acc);
  }
}

// AllTaps of a signature, made once by its Init (ResizeInit, ResizeGradInit) for every call; where only the
// last two axes resample (planar), their taps as tables, every position listed.
struct Plan : AotKernelData {
  bool ok = false;  // AllTaps accepted the attributes (a call with outputs to compute returns 1 otherwise)
  std::vector<std::vector<std::vector<Tap>>> rows;
  std::vector<std::vector<char>> outside;
  std::string transform;
  bool planar = false;
  TapTable height_table, width_table;
};

int InitPlan(AotExtra *extra, int rank, const int64_t *in_shape, const int64_t *out_shape) {
  Plan *plan = new Plan;
  plan->ok = AllTaps(extra, rank, in_shape, out_shape, &plan->rows, &plan->outside, &plan->transform);
  plan->planar = plan->ok && Planar(rank, plan->rows);
  if (plan->planar) {
    plan->height_table = Table(AxisTaps(plan->rows[rank - 2], out_shape[rank - 2]));
    plan->width_table = Table(AxisTaps(plan->rows[rank - 1], out_shape[rank - 1]));
  }
  extra->SetKernelData(plan);
  return 0;
}

const Plan *PlanOf(AotExtra *extra) {
  const Plan *plan = static_cast<const Plan *>(extra->KernelData());
  return plan != nullptr && plan->ok ? plan : nullptr;
}

template <typename T>
int Run(void **params, int *ndims, int64_t **shapes, AotExtra *extra) {
  const int rank = ndims[0];
  const int64_t *in_shape = shapes[0], *out_shape = shapes[1];
  int64_t out_total = 1;
  for (int d = 0; d < rank; d++) out_total *= out_shape[d];
  if (out_total == 0) return 0;
  const Plan *plan = PlanOf(extra);
  if (plan == nullptr) return 1;
  const auto &rows = plan->rows;
  T *y = static_cast<T *>(params[1]);
  if (plan->planar) {
    const int64_t h = in_shape[rank - 2], w = in_shape[rank - 1], oh = out_shape[rank - 2], ow = out_shape[rank - 1];
    const TapTable &rh = plan->height_table, &rw = plan->width_table;
    const T *x = static_cast<const T *>(params[0]);
    // the output rows of every plane, in ranges on opforge's threads
    const int64_t grain = std::max<int64_t>(1, kParallelWork / (w + ow));
    opforge::parallel_for(0, out_total / ow, grain, [&](int64_t r0, int64_t r1) {
      std::vector<double> line(w);
      for (int64_t r = r0; r < r1; r++) {
        const int64_t p = r / oh, i = r % oh;
        const T *xp = x + p * h * w;
        std::fill(line.begin(), line.end(), 0.0);  // the rows of x blended for output row i
        for (int64_t t = 0; t < rh.sizes[i]; t++) {
          const T *src = xp + rh.index[i * rh.count + t] * w;
          const double weight = rh.weight[i * rh.count + t];
          for (int64_t j = 0; j < w; j++) line[j] += weight * src[j];
        }
        T *out = y + r * ow;
        switch (rw.uniform ? rw.count : 0) {  // then blended along the row
          case 1: Blend<1>(rw, line.data(), out, ow); break;
          case 2: Blend<2>(rw, line.data(), out, ow); break;
          case 4: Blend<4>(rw, line.data(), out, ow); break;
          default: Blend<0>(rw, line.data(), out, ow);
        }
      }
    });
  } else {
    int64_t total = 1;
    for (int d = 0; d < rank; d++) total *= in_shape[d];
    std::vector<double> cur(static_cast<const T *>(params[0]), static_cast<const T *>(params[0]) + total);
    ByAxes(rank, in_shape, out_shape, rows, false, &cur);
    for (int64_t i = 0; i < out_total; i++) y[i] = static_cast<T>(cur[i]);
  }
  if (plan->transform == "tf_crop_and_resize") {
    const T value = static_cast<T>(extra->Attr<float>("extrapolation_value"));
    ForEachOutside(rank, out_shape, plan->outside, [&](int64_t i) { y[i] = value; });
  }
  return 0;
}

// resize_grad: params dy, x (its shape), dx.  Each axis's taps transposed: dy scattered back with the weights.
template <typename T>
int RunGrad(void **params, int *ndims, int64_t **shapes, AotExtra *extra) {
  const int rank = ndims[1];
  const int64_t *in_shape = shapes[1], *out_shape = shapes[0];
  int64_t in_total = 1, out_total = 1;
  for (int d = 0; d < rank; d++) {
    in_total *= in_shape[d];
    out_total *= out_shape[d];
  }
  T *dx = static_cast<T *>(params[2]);
  if (out_total == 0 || in_total == 0) {
    std::fill(dx, dx + in_total, T(0));
    return 0;
  }
  const Plan *plan = PlanOf(extra);
  if (plan == nullptr) return 1;
  if (plan->planar && plan->transform != "tf_crop_and_resize") {
    // each plane of dx summed in a buffer of double from its plane of dy, the planes on opforge's threads:
    // a row of dy sent back along the width's taps, then that line along the height's taps of the row
    const int64_t h = in_shape[rank - 2], w = in_shape[rank - 1], oh = out_shape[rank - 2], ow = out_shape[rank - 1];
    const TapTable &rh = plan->height_table, &rw = plan->width_table;
    const T *dy = static_cast<const T *>(params[0]);
    opforge::parallel_for(0, in_total / (h * w), std::max<int64_t>(1, kParallelWork / (h * w + oh * ow)),
                          [&](int64_t p0, int64_t p1) {
      std::vector<double> plane(h * w), line(w);
      for (int64_t p = p0; p < p1; p++) {
        std::fill(plane.begin(), plane.end(), 0.0);
        const T *dyp = dy + p * oh * ow;
        for (int64_t i = 0; i < oh; i++) {
          std::fill(line.begin(), line.end(), 0.0);
          for (int64_t j = 0; j < ow; j++)
            for (int64_t t = 0; t < rw.sizes[j]; t++)
              line[rw.index[j * rw.count + t]] += rw.weight[j * rw.count + t] * dyp[i * ow + j];
          for (int64_t t = 0; t < rh.sizes[i]; t++) {
            double *to = plane.data() + rh.index[i * rh.count + t] * w;
            const double weight = rh.weight[i * rh.count + t];
            for (int64_t j = 0; j < w; j++) to[j] += weight * line[j];
          }
        }
        for (int64_t k = 0; k < h * w; k++) dx[p * h * w + k] = static_cast<T>(plane[k]);
      }
    });
    return 0;
  }
  std::vector<double> cur(static_cast<const T *>(params[0]), static_cast<const T *>(params[0]) + out_total);
  if (plan->transform == "tf_crop_and_resize")  // extrapolated outputs hold a constant
    ForEachOutside(rank, out_shape, plan->outside, [&](int64_t i) { cur[i] = 0; });
  ByAxes(rank, out_shape, in_shape, plan->rows, true, &cur);
  for (int64_t i = 0; i < in_total; i++) dx[i] = static_cast<T>(cur[i]);
  return 0;
}

}  // namespace

// params: x, y.
extern "C" int ResizeInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  return InitPlan(extra, ndims[0], shapes[0], shapes[1]);
}

// params: dy, x, dx.
extern "C" int ResizeGradInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  return InitPlan(extra, ndims[1], shapes[1], shapes[0]);
}

extern "C" int Resize(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                      void *extra) {
  AotExtra *e = static_cast<AotExtra *>(extra);
  if (!std::strcmp(dtypes[0], "float32")) return Run<float>(params, ndims, shapes, e);
  if (!std::strcmp(dtypes[0], "float64")) return Run<double>(params, ndims, shapes, e);
  return 2;
}

extern "C" int ResizeGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                          void *stream, void *extra) {
  AotExtra *e = static_cast<AotExtra *>(extra);
  if (!std::strcmp(dtypes[0], "float32")) return RunGrad<float>(params, ndims, shapes, e);
  if (!std::strcmp(dtypes[0], "float64")) return RunGrad<double>(params, ndims, shapes, e);
  return 2;
}
"""
resize.kernel(function="Resize", dtypes=[(d,) for d in FLOATS], code=RESIZE_CC)


# -- the gradient -----------------------------------------------------------------

resize_grad = gradient_op("resize", RESIZE_ATTRS, resize_check, resize_infer,
                          doc="Gradient of resize: dy sent back through each axis's taps with their weights "
                              "(outputs outside the roi contribute nothing; x lends only its shape).")


@resize_grad.reference(fallback=True)
def resize_grad_reference(dy: npt.NDArray[Any], x: npt.NDArray[Any], *, scales: Sequence[float], sizes: Sequence[int],
                          axes: Sequence[int], roi: Sequence[float], keep_aspect_ratio_policy: str,
                          extrapolation_value: float, **attrs: Any) -> npt.NDArray[Any]:
    resampled, outside = tables(x.shape, scales, sizes, axes, roi, keep_aspect_ratio_policy, attrs)
    dx = np.where(np.broadcast_to(outside, dy.shape), 0, dy.astype(np.float64))
    for axis, weights, _ in reversed(resampled):
        dx = np.moveaxis(np.tensordot(weights.T, dx, axes=([1], [axis])), 0, axis)
    return dx.reshape(x.shape).astype(dy.dtype)


resize_grad.kernel(function="ResizeGrad", dtypes=GRADIENT_DTYPES, code=RESIZE_CC)
