"""conv: N-d convolution of N x C x spatial input with M x C/group x kernel weights (ONNX Conv).

``strides`` and ``dilations`` hold one value per spatial dim (default 1),
``pads`` the begin pads of every spatial dim, then the end pads (default 0);
``group`` splits the channels into that many independent convolutions.
Output dim: ``(in + pad_begin + pad_end - ((k - 1) * d + 1)) / s + 1``,
rounded down.  ONNX's ``auto_pad`` is resolved into pads by the converter.

The kernel copies each group's input windows into a matrix (im2col: C/group
* prod(kernel) rows, one column per output position) and multiplies it by the
weights with OpenBLAS's gemm; a 1 x 1 convolution with stride 1 and no
padding multiplies the input directly, and a depthwise one (a channel per
group) adds the weighted windows without a product: in 2-d from a zero-padded
copy of each plane split into stride phases, the planes on the pool.  The
products are cut into tasks for opforge's pool -- a block of output
positions (its columns about 1 MiB, made in a per-thread buffer, still in
cache for the gemm) times, where there are few blocks, a part of the output
channels (a product whose weights outweigh its image's columns is cut into
parts of the output channels only: a block of columns would pack all of the
weights again) -- each calling OpenBLAS on its own thread: a free thread takes
what a busy one leaves, where OpenBLAS's own threads would wait for each
other.  How the work is cut depends on the shapes only, so the results are
the same on any number of threads.

A 2-d 3 x 3 convolution with stride 1 and dilation 1 (any pads, any group)
runs as Winograd's F(2 x 2, 3 x 3) where it pays: 16 products of the
transformed weights (m x c per group, made on every call) by the transformed
input tiles (c x tiles), 2.25 times fewer multiplies than im2col's; a task is
a block of an image's tiles (transform, 16 gemms, output transform plus the
bias), times a part of the output channels where there are few blocks.  It is taken with >= 8 input and >= 8 output channels per group and
>= 25 tiles (2 x 2 outputs) per image, thresholds measured on a 2-core
AVX-512 EPYC: with fewer tiles (resnet's 7 x 7 layers) each gemm packs its
m x c matrix for too few columns, and with 3 input channels (a network's
first layer) the transforms cost more than the products save.  Its error
against a float64 reference, over conv(|x|, |w|) + |b| per element, was at
most 1.9e-7 in float32 on N(0, 1) data (im2col's 3.2e-7 on the same shapes;
tests/test_conv_winograd.py holds it to 2e-6).  The C++ macro
OPFORGE_CONV_WINOGRAD (0 never, 2 wherever it applies) overrides the choice.
A batch_norm after a conv is folded into
its weights by the graph pass ``fold_batch_norm_into_conv``, and a relu
after it into the conv (``activation="relu"``, ``fold_relu_into_conv``):
each part of y is clipped as soon as a task has made it, still in cache,
where a relu node would pass over all of y again.
Where OpenBLAS is missing the NumPy reference runs.

The gradient: dx is ``conv_transpose`` of dy, dw is ``conv_weight_grad``
(the same im2col, multiplied by dy; its tasks are blocks of dw, each summed
over the batch in a fixed order), db sums dy.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import FLOATS, SIMD_ISAS, known_dims
from opforge.builtins.gemm import same_float_dtype, zeros_for_absent
from opforge.runtime import blas

if TYPE_CHECKING:
    import numpy.typing as npt

GEOMETRY_ATTRS = "int[] strides=[], int[] pads=[], int[] dilations=[], int group=1"

ACTIVATIONS = ("none", "relu")

conv = opforge.op(f'conv(Tensor x, Tensor w, Tensor? b, *, {GEOMETRY_ATTRS}, str activation="none") -> Tensor y',
                  traits=["no_side_effect"],
                  doc="ONNX Conv on N x C x spatial (any number of spatial dims): weights M x C/group x kernel, "
                      "optional bias of M; pads are begin pads then end pads; activation \"relu\" applies relu to "
                      "y (the graph passes fold a relu after a conv into it).")


# -- geometry shared with conv_transpose and conv_weight_grad ---------------------

def conv_params(op_name: str, spatial: int, strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                group: int) -> tuple[list[int], list[int], list[int]]:
    """(strides, pads, dilations) with defaults filled in; AttrError for wrong lengths or values."""
    strides = list(strides) or [1] * spatial
    dilations = list(dilations) or [1] * spatial
    pads = list(pads) or [0] * (2 * spatial)
    for name, values, length, low in (("strides", strides, spatial, 1), ("dilations", dilations, spatial, 1),
                                      ("pads", pads, 2 * spatial, 0)):
        if len(values) != length:
            raise opforge.AttrError(f"op '{op_name}': attribute '{name}' has {len(values)} values {values}; the input "
                                    f"has {spatial} spatial dim(s), so it needs {length}")
        if any(v < low for v in values):
            raise opforge.AttrError(f"op '{op_name}': attribute '{name}' is {values}; each value must be >= {low}")
    if group < 1:
        raise opforge.AttrError(f"op '{op_name}': attribute 'group' is {group}; it must be >= 1")
    return strides, pads, dilations


def conv_out_dim(n: int, k: int, s: int, pb: int, pe: int, d: int) -> int:
    """Output length of one spatial dim of a convolution (-1 when n or k is unknown)."""
    if -1 in (n, k):
        return -1
    return (n + pb + pe - ((k - 1) * d + 1)) // s + 1


def check_grouped(op_name: str, channels: int, per_group: int, group: int, what: str) -> None:
    """ShapeError unless ``channels`` (known, or -1) is ``per_group * group``."""
    if -1 not in (channels, per_group) and channels != per_group * group:
        raise opforge.ShapeError(f"op '{op_name}': {what}")


def spatial_rank(op_name: str, x: TensorSpec, w: TensorSpec) -> int | None:
    """The number of spatial dims, from x or w (None when both ranks are unknown)."""
    for name, spec in (("x", x), ("w", w)):
        if spec is not None and spec.rank is not None and spec.rank < 3:
            raise opforge.ShapeError(f"op '{op_name}': input '{name}' has shape {list(spec.shape)}; it needs rank >= 3 "
                                     "(N x C x spatial, or weights out x in x kernel)")
    if x.rank is not None and w.rank is not None and x.rank != w.rank:
        raise opforge.ShapeError(f"op '{op_name}': inputs 'x' and 'w' have ranks {x.rank} and {w.rank} (shapes "
                                 f"{list(x.shape)}, {list(w.shape)}); they must be equal")
    rank = x.rank if x.rank is not None else w.rank
    return None if rank is None else rank - 2


def check_bias(op_name: str, b: TensorSpec | None, channels: int) -> None:
    if b is not None and b.rank is not None and (b.rank != 1 or -1 not in (b.shape[0], channels)
                                                 and b.shape[0] != channels):
        raise opforge.ShapeError(f"op '{op_name}': input 'b' has shape {list(b.shape)}; it must be [{channels}] (one "
                                 "value per output channel)")


@conv.infer
def conv_infer(x: TensorSpec, w: TensorSpec, b: TensorSpec | None, *, strides: Sequence[int], pads: Sequence[int],
               dilations: Sequence[int], group: int, activation: str = "none") -> TensorSpec:
    if activation not in ACTIVATIONS:
        raise opforge.AttrError(f"op 'conv': attribute 'activation' is {activation!r}; expected one of "
                                f"{', '.join(map(repr, ACTIVATIONS))}")
    same_float_dtype("conv", [x, w, b], ["x", "w", "b"])
    spatial = spatial_rank("conv", x, w)
    if spatial is None:
        return TensorSpec(None, x.dtype)
    strides, pads, dilations = conv_params("conv", spatial, strides, pads, dilations, group)
    x_shape = x.shape if x.rank is not None else (-1,) * (spatial + 2)
    w_shape = w.shape if w.rank is not None else (-1,) * (spatial + 2)
    check_grouped("conv", x_shape[1], w_shape[1], group,
                  f"input 'x' has {x_shape[1]} channels, but w (shape {list(w_shape)}) takes {w_shape[1]} per group "
                  f"and group={group}")
    if w_shape[0] != -1 and w_shape[0] % group:
        raise opforge.ShapeError(f"op 'conv': w has {w_shape[0]} output channels, not a multiple of group={group}")
    check_bias("conv", b, w_shape[0])
    out = [conv_out_dim(x_shape[2 + j], w_shape[2 + j], strides[j], pads[j], pads[spatial + j], dilations[j])
           for j in range(spatial)]
    if any(n == 0 or n < -1 for n in out):
        raise opforge.ShapeError(f"op 'conv': input 'x' of shape {list(x_shape)} padded by {pads} is smaller than the "
                                 f"dilated kernel {list(w_shape[2:])} (dilations {dilations}): no output position")
    return TensorSpec((x_shape[0], w_shape[0], *out), x.dtype)


def windows(x: npt.NDArray[Any], kernel_shape: Sequence[int], out: Sequence[int], strides: Sequence[int],
            pads: Sequence[int], dilations: Sequence[int]) -> Iterator[tuple[tuple[int, ...], npt.NDArray[Any]]]:
    """Per kernel offset k: the padded input seen by kernel element k at every output
    position, as ``(k, view of shape N x C x out)``."""
    spatial = len(kernel_shape)
    padded = np.pad(x, [(0, 0), (0, 0)] + [(pads[j], pads[spatial + j]) for j in range(spatial)])
    for k in np.ndindex(*kernel_shape):
        window = tuple(slice(k[j] * dilations[j], k[j] * dilations[j] + (out[j] - 1) * strides[j] + 1, strides[j])
                       for j in range(spatial))
        yield k, padded[(Ellipsis,) + window]


@conv.reference(fallback=True)
def conv_reference(x: npt.NDArray[Any], w: npt.NDArray[Any], b: npt.NDArray[Any] | None, *, strides: Sequence[int],
                   pads: Sequence[int], dilations: Sequence[int], group: int,
                   activation: str = "none") -> npt.NDArray[Any]:
    spatial = x.ndim - 2
    strides, pads, dilations = conv_params("conv", spatial, strides, pads, dilations, group)
    out = [conv_out_dim(x.shape[2 + j], w.shape[2 + j], strides[j], pads[j], pads[spatial + j], dilations[j])
           for j in range(spatial)]
    n, m = x.shape[0], w.shape[0]
    y = np.zeros((n, group, m // group, *out), x.dtype)
    weights = w.reshape(group, m // group, w.shape[1], *w.shape[2:])
    for k, window in windows(x, w.shape[2:], out, strides, pads, dilations):
        grouped = window.reshape(n, group, w.shape[1], *out)
        y += np.einsum("ngc...,gmc->ngm...", grouped, weights[(Ellipsis,) + tuple(k)])
    y = y.reshape(n, m, *out)
    if b is not None:
        y += b.reshape(m, *[1] * spatial)
    if activation == "relu":
        y = np.maximum(y, 0)  # as relu's reference
    return y


def output_padding_for(x_dims: Sequence[int], w_dims: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                       dilations: Sequence[int]) -> list[int]:
    """The conv_transpose output_padding that gives back x's spatial dims from conv's output."""
    spatial = len(x_dims) - 2
    strides, pads, dilations = conv_params("conv", spatial, strides, pads, dilations, 1)
    if -1 in x_dims[2:] or -1 in w_dims[2:]:
        raise opforge.ShapeError(f"op 'conv': its gradient needs x's spatial dims and the kernel's known; x has "
                                 f"{list(x_dims)}, w {list(w_dims)}")
    return [(x_dims[2 + j] + pads[j] + pads[spatial + j] - ((w_dims[2 + j] - 1) * dilations[j] + 1)) % strides[j]
            for j in range(spatial)]


@conv.grad(save=["x", "w", "b", "y"])
def conv_grad(saved: Any, dy: Any, *, strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
              group: int, activation: str = "none") -> tuple[Any, Any, Any]:
    if activation == "relu":
        dy = opforge.ops.relu_grad(dy, saved.y)
    x_dims, w_dims = known_dims(saved.x), known_dims(saved.w)
    geometry = dict(strides=strides, pads=pads, dilations=dilations, group=group)
    dx = opforge.ops.conv_transpose(dy, saved.w, None, **geometry,
                                    output_padding=output_padding_for(x_dims, w_dims, strides, pads, dilations))
    dw = opforge.ops.conv_weight_grad(saved.x, dy, kernel_shape=list(w_dims[2:]), **geometry)
    db = None if saved.b is None else opforge.ops.reduce_sum(dy, axes=[0, *range(2, len(x_dims))])
    return dx, dw, db


# -- the C++ side ----------------------------------------------------------------
# Shared with conv_transpose and conv_weight_grad.  An "image" is one sample's
# channels of a group (channels x in...); its columns matrix has channels *
# prod(kernel) rows and prod(out) columns: row (c, k), column o holds the image
# at o * stride - pad_begin + k * dilation, or 0 in the padding.
CONV_COMMON = r"""
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"
#include "opforge_blas.h"

typedef OPFORGE_T T;

struct ConvGeometry : AotKernelData {
  int rank = 0;                                              // spatial dims
  std::vector<int64_t> in, out, kernel, stride, pad, dilation;  // pad: the begin pads
  int64_t group = 1, in_size = 1, out_size = 1, kernel_size = 1;
  int64_t last_out = 1, outer = 1;  // out's last dim; how many runs of it make out (its other dims)
  bool direct = true;  // 1 x 1 kernel, stride 1, no padding: the columns matrix is the image itself
  bool relu = false;   // conv's activation="relu": each part of y is clipped at 0 as soon as it is made
};

// The products are cut into independent tasks that opforge's pool hands to whichever thread is free,
// each running OpenBLAS on its own thread (SerialBlas): on cores shared with other work this keeps
// both threads busy, where OpenBLAS's threads wait for one another inside every product.  A task's
// columns (im2col) are a block of about OPFORGE_CONV_BLOCK_BYTES, so they are still in cache when its
// gemm reads them.  How the work is cut depends on the shapes only, never on the thread count: every
// sum is added in the same order on any number of threads.
#ifndef OPFORGE_CONV_BLOCK_BYTES
#define OPFORGE_CONV_BLOCK_BYTES (1 << 20)
#endif
static const int64_t kTasks = 16;  // cut finer (more channel blocks) while there are fewer tasks than this
static const int64_t kTaskWork = 1 << 16;  // multiply-adds worth handing to another thread
static const int64_t kSumBlockBytes = 2 << 20;  // conv_weight_grad's blocks (see there)

// How many runs of last_out columns make a block of a columns matrix with `rows` rows (of about `bytes`).
static int64_t RunsPerBlock(const ConvGeometry &g, int64_t rows, int64_t bytes = OPFORGE_CONV_BLOCK_BYTES) {
  const int64_t run_bytes = std::max<int64_t>(1, rows * g.last_out * int64_t(sizeof(T)));
  return std::max<int64_t>(1, std::min(g.outer, bytes / run_bytes));
}

// Into how many parts of at least `least` to cut a range of n so that `tasks` tasks become about `target`.
static int64_t Parts(int64_t n, int64_t tasks, int64_t least, int64_t target = kTasks) {
  if (tasks >= target || tasks < 1) return 1;
  return std::max<int64_t>(1, std::min((target + tasks - 1) / tasks, n / std::max<int64_t>(least, 1)));
}

// A per-thread buffer of at least n elements, kept for the thread's next tasks.
static T *Scratch(int64_t n) {
  static thread_local std::vector<T> buffer;
  if (int64_t(buffer.size()) < n) buffer.resize(size_t(n));
  return buffer.data();
}

extern "C" {
int scipy_openblas_get_num_threads(void);
void scipy_openblas_set_num_threads(int);
}

// OpenBLAS on its caller's thread only while the pool runs the tasks (when `parallel`): tasks on two
// threads calling a threaded gemm at once would fight over OpenBLAS's threads.  It gets its count back
// unless someone set another meanwhile.
class SerialBlas {
 public:
  explicit SerialBlas(bool parallel) : before_(parallel ? scipy_openblas_get_num_threads() : 1) {
    if (before_ > 1) scipy_openblas_set_num_threads(1);
  }
  ~SerialBlas() {
    if (before_ > 1 && scipy_openblas_get_num_threads() == 1) scipy_openblas_set_num_threads(before_);
  }
  SerialBlas(const SerialBlas &) = delete;
  SerialBlas &operator=(const SerialBlas &) = delete;

 private:
  const int before_;
};

// Runs task(t) for t in [0, tasks) on the pool, OpenBLAS serial meanwhile; `work` is one task's.
template <typename F>
static void RunTasks(int64_t tasks, int64_t work, F task) {
  const int64_t grain = std::max<int64_t>(1, kTaskWork / std::max<int64_t>(work, 1));
  SerialBlas serial(tasks > grain && opforge::num_threads() > 1);
  opforge::parallel_for(0, tasks, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; t++) task(t);
  });
}

// Fills g from the image dims, the columns' output dims, the kernel dims and the op's attributes;
// false when they do not fit together (out is what a convolution of the image gives; up to that when
// !exact, as for conv_transpose, whose image may have extra rows at the end: output_padding).
static bool MakeGeometry(ConvGeometry *g, const int64_t *in, const int64_t *out, const int64_t *kernel, int rank,
                         AotExtra *extra, bool exact = true) {
  std::vector<int64_t> strides = extra->Attr<std::vector<int64_t>>("strides");
  std::vector<int64_t> pads = extra->Attr<std::vector<int64_t>>("pads");
  std::vector<int64_t> dilations = extra->Attr<std::vector<int64_t>>("dilations");
  g->group = extra->Attr<int64_t>("group");
  if (strides.empty()) strides.assign(rank, 1);
  if (dilations.empty()) dilations.assign(rank, 1);
  if (pads.empty()) pads.assign(2 * rank, 0);
  if (rank < 1 || g->group < 1 || int(strides.size()) != rank || int(dilations.size()) != rank ||
      int(pads.size()) != 2 * rank)
    return false;
  g->rank = rank;
  for (int r = 0; r < rank; r++) {
    if (strides[r] < 1 || dilations[r] < 1 || pads[r] < 0 || pads[rank + r] < 0) return false;
    const int64_t full = (in[r] + pads[r] + pads[rank + r] - ((kernel[r] - 1) * dilations[r] + 1)) / strides[r] + 1;
    if (out[r] < 1 || (exact ? out[r] != full : out[r] > full)) return false;
    g->in.push_back(in[r]);
    g->out.push_back(out[r]);
    g->kernel.push_back(kernel[r]);
    g->stride.push_back(strides[r]);
    g->pad.push_back(pads[r]);
    g->dilation.push_back(dilations[r]);
    g->in_size *= in[r];
    g->out_size *= out[r];
    g->kernel_size *= kernel[r];
    g->direct = g->direct && kernel[r] == 1 && strides[r] == 1 && pads[r] == 0 && pads[rank + r] == 0;
  }
  g->last_out = out[rank - 1];
  g->outer = g->out_size / g->last_out;
  return true;
}

// The common part of the Inits: the geometry from the image, columns and kernel shapes (each N x C x
// spatial or its like; a convolution's unless !exact), kept as the signature's kernel data.
// channels(g) is -1 when the op's channel counts do not fit g's group.
template <typename Channels>
static int InitGeometry(const int64_t *image, const int64_t *cols, const int64_t *kernel, int rank, AotExtra *extra,
                        bool exact, Channels channels) {
  auto *g = new ConvGeometry;
  const int64_t count = MakeGeometry(g, image + 2, cols + 2, kernel + 2, rank, extra, exact) ? channels(*g) : -1;
  if (count < 0) {
    delete g;
    return 2;
  }
  extra->SetKernelData(g);
  extra->SetWorkSpace({1});  // (the tasks' columns are per-thread buffers: Scratch)
  return 0;
}

static const ConvGeometry *GeometryOf(void *extra) {
  return static_cast<const ConvGeometry *>(static_cast<AotExtra *>(extra)->KernelData());
}

// conv's and conv_transpose's parameters: x, w, b, y, then the columns workspace.
struct ConvArgs {
  const T *x, *w, *b;
  T *y, *columns;
  ConvArgs(void **params)
      : x(static_cast<const T *>(params[0])), w(static_cast<const T *>(params[1])),
        b(static_cast<const T *>(params[2])), y(static_cast<T *>(params[3])), columns(static_cast<T *>(params[4])) {}

  // y (n x m x size) = the bias of each of its m channels, for the products to add to.
  void FillBias(int64_t n, int64_t m, int64_t size) const {
    for (int64_t i = 0; i < n * m; i++)
      for (int64_t j = 0; j < size; j++) y[i * size + j] = b[i % m];
  }
};

// For row (c, k) of a block of the columns matrix (runs first .. first + count - 1): calls
// row(image offset, columns offset, lo, hi, k, run) for each run of last_out columns whose image row
// lies inside the image (lo..hi: the columns inside it), and empty(columns offset) for those wholly in
// the padding.
template <typename Row, typename Empty>
static void ForEachRow(const ConvGeometry &g, int64_t channels, int64_t first, int64_t count, Row row, Empty empty) {
  const int R = g.rank;
  const int64_t last_out = g.out[R - 1], last_in = g.in[R - 1], s = g.stride[R - 1];
  std::vector<int64_t> k(R), o(R);
  int64_t column_row = 0;
  for (int64_t c = 0; c < channels; c++) {
    for (int64_t kk = 0; kk < g.kernel_size; kk++) {
      for (int64_t rest = kk, r = R - 1; r >= 0; r--) k[r] = rest % g.kernel[r], rest /= g.kernel[r];
      const int64_t start = k[R - 1] * g.dilation[R - 1] - g.pad[R - 1];  // image column of output column 0
      const int64_t lo = start >= 0 ? 0 : (-start + s - 1) / s;
      int64_t hi = last_in > start ? (last_in - start + s - 1) / s : 0;
      if (hi > last_out) hi = last_out;
      if (hi < lo) hi = lo;
      for (int64_t rest = first, r = R - 2; r >= 0; r--) o[r] = rest % g.out[r], rest /= g.out[r];
      for (int64_t oo = first; oo < first + count; oo++, column_row++) {
        int64_t offset = c;
        bool inside = true;
        for (int r = 0; r < R - 1; r++) {
          const int64_t i = o[r] * g.stride[r] - g.pad[r] + k[r] * g.dilation[r];
          inside = inside && i >= 0 && i < g.in[r];
          offset = offset * g.in[r] + i;
        }
        if (inside)
          row(offset * last_in + start, column_row * last_out, lo, hi, kk, oo);
        else
          empty(column_row * last_out);
        for (int r = R - 2; r >= 0 && ++o[r] == g.out[r]; r--) o[r] = 0;  // the next output position
      }
    }
  }
}

// image (channels x in...) -> a block of columns (channels * prod(kernel) x count * last_out); returns columns.
static const T *Im2Col(const ConvGeometry &g, int64_t channels, int64_t first, int64_t count, const T *image,
                       T *columns) {
  const int64_t n = g.last_out, s = g.stride[g.rank - 1];
  ForEachRow(g, channels, first, count,
             [&](int64_t from, int64_t to, int64_t lo, int64_t hi, int64_t, int64_t) {
               const T *src = image + from;
               T *dst = columns + to;
               for (int64_t j = 0; j < lo; j++) dst[j] = T(0);
               if (s == 1)
                 std::memcpy(dst + lo, src + lo, size_t(hi - lo) * sizeof(T));
               else if (s == 2)  // (the stride known here: its loads vectorise)
                 for (int64_t j = lo; j < hi; j++) dst[j] = src[2 * j];
               else
                 for (int64_t j = lo; j < hi; j++) dst[j] = src[j * s];
               for (int64_t j = hi; j < n; j++) dst[j] = T(0);
             },
             [&](int64_t to) { std::memset(columns + to, 0, size_t(n) * sizeof(T)); });
  return columns;
}

// The adjoint: adds each entry of a block of columns to the image element it was copied from.
static void Col2ImAdd(const ConvGeometry &g, int64_t channels, int64_t first, int64_t count, const T *columns,
                      T *image) {
  const int64_t s = g.stride[g.rank - 1];
  ForEachRow(g, channels, first, count,
             [&](int64_t to, int64_t from, int64_t lo, int64_t hi, int64_t, int64_t) {
               T *dst = image + to;
               const T *src = columns + from;
               if (s == 2)  // (as in Im2Col)
                 for (int64_t j = lo; j < hi; j++) dst[2 * j] += src[j];
               else
                 for (int64_t j = lo; j < hi; j++) dst[j * s] += src[j];
             },
             [](int64_t) {});
}

// A depthwise group (one image channel, one output channel): out += sum over k of w[k] * columns row k,
// without making the columns (a product with one row is memory-bound: gemm gains nothing).
static void DepthwiseAdd(const ConvGeometry &g, const T *image, const T *w, T *out) {
  const int64_t s = g.stride[g.rank - 1];
  ForEachRow(g, 1, 0, g.outer,
             [&](int64_t from, int64_t, int64_t lo, int64_t hi, int64_t k, int64_t run) {
               const T weight = w[k];
               const T *src = image + from;
               T *dst = out + run * g.last_out;
               if (s == 1)
                 for (int64_t j = lo; j < hi; j++) dst[j] += weight * src[j];
               else
                 for (int64_t j = lo; j < hi; j++) dst[j] += weight * src[j * s];
             },
             [](int64_t) {});
}

static bool Fits(const ConvGeometry &g, int64_t rows, int64_t inner) {
  return OpforgeBlasFits({rows, inner, g.out_size, g.in_size, g.kernel_size * inner});
}
"""

CONV = CONV_COMMON + r"""
// y = max(y, 0) over n elements (NaN passes, as relu's): the fused activation, on a part of y still in cache.
static void Relu(T *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = y[i] > T(0) || y[i] != y[i] ? y[i] : T(0);
}

// Work (multiply-adds or copied elements) worth handing to another thread.
static const int64_t kParallelWork = 1 << 15;
static const int64_t kConvTasks = 4;  // tasks per convolution to aim for (more cost packing w again)
static const int64_t kLeastWidth = 128;  // columns of a block: narrower ones run gemm below speed

// Depthwise 2-d convolution (one input channel per group, m_group output channels each): every output
// plane is its bias plus, per kernel tap, the tap's weight times a strided window of the input plane.
// The plane is first copied, zero-padded, into stride_h * stride_w phases (padded element (r, c) goes
// to phase (r % stride_h, c % stride_w) at (r / stride_h, c / stride_w)); there each tap's window is
// the phase's rows laid end to end, from an offset, whatever the strides.  So a tap is one multiply-add
// along a flat run of `span` elements (the phases' extra columns are computed and dropped), done a
// block at a time so the sums stay in registers while every tap adds to them.  Planes run on the pool.
// A block is four of the ISA's vectors of sums (held in registers; loads may be unaligned).
#if defined(__AVX512F__)
#define OPFORGE_VECTOR_BYTES 64
#elif defined(__AVX__)
#define OPFORGE_VECTOR_BYTES 32
#else
#define OPFORGE_VECTOR_BYTES 16
#endif
typedef T Vec __attribute__((vector_size(OPFORGE_VECTOR_BYTES), aligned(sizeof(T)), may_alias));
static const int64_t kLanes = OPFORGE_VECTOR_BYTES / sizeof(T), kDepthwiseBlock = 4 * kLanes;

// dst[0, n) = src[0, n): the rows are short (7 to 112 elements), where a call to memcpy costs more
// (the tail is written without a loop, which GCC would turn back into one).
typedef T Vec16 __attribute__((vector_size(16), aligned(sizeof(T)), may_alias));
static inline void CopyRow(T *__restrict__ dst, const T *__restrict__ src, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) *reinterpret_cast<Vec *>(dst + i) = *reinterpret_cast<const Vec *>(src + i);
  for (; i + int64_t(16 / sizeof(T)) <= n; i += 16 / sizeof(T))
    *reinterpret_cast<Vec16 *>(dst + i) = *reinterpret_cast<const Vec16 *>(src + i);
  if (i < n) dst[i] = src[i];  // up to 3 floats (1 double) are left
  if (i + 1 < n) dst[i + 1] = src[i + 1];
  if (i + 2 < n) dst[i + 2] = src[i + 2];
}

static void Depthwise2D(const ConvGeometry &g, int64_t n, int64_t m, const ConvArgs &a) {
  const int64_t ih = g.in[0], iw = g.in[1], oh = g.out[0], ow = g.out[1], kh = g.kernel[0], kw = g.kernel[1];
  const int64_t sh = g.stride[0], sw = g.stride[1], dh = g.dilation[0], dw = g.dilation[1];
  // the padded plane: just the rows and columns the taps reach (end pads may be left partly unread)
  const int64_t ph = (oh - 1) * sh + (kh - 1) * dh + 1, pw = (ow - 1) * sw + (kw - 1) * dw + 1;
  const int64_t width = (pw + sw - 1) / sw, phase_size = (ph + sh - 1) / sh * width;
  const int64_t top = g.pad[0], left = g.pad[1], m_group = m / g.group;
  const int64_t span = (oh - 1) * width + ow;  // output (oy, ox) is at oy * width + ox
  const int64_t blocks = (span + kDepthwiseBlock - 1) / kDepthwiseBlock;
  // the last blocks read past the phases: into a zeroed tail
  const int64_t padded_size = sh * sw * phase_size + kDepthwiseBlock;
  std::vector<int64_t> taps(size_t(kh * kw));  // where each tap's window starts
  for (int64_t ky = 0; ky < kh; ky++)
    for (int64_t kx = 0; kx < kw; kx++)
      taps[ky * kw + kx] = (ky * dh % sh * sw + kx * dw % sw) * phase_size + ky * dh / sh * width + kx * dw / sw;
  const int64_t work = ph * pw + m_group * blocks * kDepthwiseBlock * kh * kw;
  const int64_t first = std::min(left, pw), last = std::min(pw, left + iw);  // padded columns in the image
  const int64_t row_begin = std::min(top, ph), row_end = std::min(ph, top + ih);  // and rows
  opforge::parallel_for(0, n * g.group, std::max<int64_t>(1, kParallelWork / work), [&](int64_t lo, int64_t hi) {
    std::vector<T> phases(static_cast<size_t>(padded_size)), sums(static_cast<size_t>(blocks * kDepthwiseBlock));
    T *__restrict__ padded = phases.data();
    T *__restrict__ acc = sums.data();
    for (int64_t plane = lo; plane < hi; plane++) {  // plane: sample plane / group, input channel plane % group
      const T *image = a.x + plane * ih * iw;
      std::fill(padded, padded + padded_size, T(0));
      for (int64_t r = row_begin, r_phase = row_begin % sh, r_row = row_begin / sh; r < row_end; r++) {
        const T *src = image + (r - top) * iw - left;
        T *row = padded + r_phase * sw * phase_size + r_row * width;  // padded row r: r % sh, r / sh
        if (++r_phase == sh) r_phase = 0, r_row++;
        if (sw == 1) {
          CopyRow(row + first, src + first, last - first);
          continue;
        }
        if (sw == 2) {  // the common stride: two phases, pairs of loads the compiler vectorizes
          int64_t c = first;
          if (c < last && c % 2) row[phase_size + c / 2] = src[c], c++;
          T *__restrict__ even = row + c / 2;
          T *__restrict__ odd = row + phase_size + c / 2;
          const T *__restrict__ from = src + c;
          const int64_t pairs = std::max<int64_t>(0, last - c) / 2;
          for (int64_t k = 0; k < pairs; k++) even[k] = from[2 * k], odd[k] = from[2 * k + 1];
          if (c + 2 * pairs < last) even[pairs] = src[last - 1];
          continue;
        }
        for (int64_t q = 0; q < sw; q++) {
          T *__restrict__ dst = row + q * phase_size;
          const int64_t c0 = first + (q - first % sw + sw) % sw;  // the phase's first column in the image
          for (int64_t c = c0, k = c0 / sw; c < last; c += sw, k++) dst[k] = src[c];
        }
      }
      const int64_t sample = plane / g.group, group = plane - sample * g.group;
      for (int64_t j = 0; j < m_group; j++) {
        const int64_t channel = group * m_group + j;
        const T *w = a.w + channel * kh * kw;
        const T bias = a.b[channel];
        for (int64_t i0 = 0; i0 < blocks * kDepthwiseBlock; i0 += kDepthwiseBlock) {
          Vec s0 = Vec{} + bias, s1 = s0, s2 = s0, s3 = s0;
          for (int64_t k = 0; k < kh * kw; k++) {
            const Vec weight = Vec{} + w[k];
            const Vec *src = reinterpret_cast<const Vec *>(padded + taps[k] + i0);
            s0 += weight * src[0];
            s1 += weight * src[1];
            s2 += weight * src[2];
            s3 += weight * src[3];
          }
          Vec *dst = reinterpret_cast<Vec *>(acc + i0);
          dst[0] = s0, dst[1] = s1, dst[2] = s2, dst[3] = s3;
        }
        T *out = a.y + (sample * m + channel) * oh * ow;
        for (int64_t oy = 0; oy < oh; oy++) CopyRow(out + oy * ow, acc + oy * width, ow);
        if (g.relu) Relu(out, oh * ow);
      }
    }
  });
}

// -- Winograd F(2 x 2, 3 x 3) ------------------------------------------------------------------
// A 2-d 3 x 3 convolution with stride 1 and dilation 1 (any pads) multiplies 2.25 times fewer
// values as Winograd's F(2 x 2, 3 x 3): the output is cut into 2 x 2 tiles, each computed from the
// 4 x 4 input window around it (zero outside the image; tiles past the right or bottom edge are
// computed and cut).  In the transformed domain the convolution becomes 16 independent products
//   M_k (m_group x tiles) = U_k (m_group x c_group) @ V_k (c_group x tiles),   k = (row, col) of 4 x 4,
// U = G g G^T for each 3 x 3 kernel g (made on every call: the weights may change between calls),
// V = B^T d B for each 4 x 4 input window d, and a tile's output Y = A^T M A (+ the bias), with
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1].
// A task is a block of an image's tiles (an image: a sample's group), or a part of its output channels
// for them: it transforms their input into V (16 x c_group x count, a per-thread buffer), runs the 16
// gemms into M and writes their output, so
// V and M stay in cache.  The blocks depend on the shapes only: the same bits on any thread count.
// OPFORGE_CONV_WINOGRAD: 0 never, 1 where it pays (WinogradPays), 2 wherever it applies.
#ifndef OPFORGE_CONV_WINOGRAD
#define OPFORGE_CONV_WINOGRAD 1
#endif
#ifndef OPFORGE_CONV_WINOGRAD_MIN_C
#define OPFORGE_CONV_WINOGRAD_MIN_C 8
#endif
#ifndef OPFORGE_CONV_WINOGRAD_MIN_M
#define OPFORGE_CONV_WINOGRAD_MIN_M 8
#endif
#ifndef OPFORGE_CONV_WINOGRAD_MIN_TILES
#define OPFORGE_CONV_WINOGRAD_MIN_TILES 25
#endif
static const int64_t kWinogradBlockBytes = 1 << 20;  // a task's V and M together
static const int64_t kWinogradLeastTiles = 64;       // gemm's n: narrower products run below speed

static bool WinogradApplies(const ConvGeometry &g) {
  return g.rank == 2 && g.kernel[0] == 3 && g.kernel[1] == 3 && g.stride[0] == 1 && g.stride[1] == 1 &&
         g.dilation[0] == 1 && g.dilation[1] == 1;
}

// Measured (see the module's docstring): gemm with a short inner dim (c_group) or few rows (m_group)
// runs well below speed while the transforms cost the same per tile and channel, and with few tiles
// per image each gemm packs its U_k (m_group x c_group, out of cache for many channels) for few columns.
static bool WinogradPays(const ConvGeometry &g, int64_t c_group, int64_t m_group) {
  const int64_t tiles = (g.out[0] + 1) / 2 * ((g.out[1] + 1) / 2);
  return c_group >= OPFORGE_CONV_WINOGRAD_MIN_C && m_group >= OPFORGE_CONV_WINOGRAD_MIN_M &&
         tiles >= OPFORGE_CONV_WINOGRAD_MIN_TILES;
}

// w (m x c_group x 3 x 3) -> u: per group, 16 matrices of m_group x c_group (k major), on the pool.
// An output channel's 16 rows are made in a per-thread buffer, then copied out row by row (written
// straight, the 16 rows m_group * c_group apart would fight over the same cache sets).
static void WinogradWeights(const T *w, int64_t m, int64_t m_group, int64_t c_group, T *u) {
  const T h = T(0.5);
  opforge::parallel_for(0, m, std::max<int64_t>(1, kParallelWork / (32 * std::max<int64_t>(c_group, 1))),
                        [&](int64_t lo, int64_t hi) {
    T *rows = Scratch(16 * c_group);
    for (int64_t o = lo; o < hi; o++) {
      for (int64_t c = 0; c < c_group; c++) {
        const T *k = w + (o * c_group + c) * 9;
        T t[4][3];  // G g
        for (int j = 0; j < 3; j++) {
          t[0][j] = k[j];
          t[1][j] = h * (k[j] + k[3 + j] + k[6 + j]);
          t[2][j] = h * (k[j] - k[3 + j] + k[6 + j]);
          t[3][j] = k[6 + j];
        }
        for (int i = 0; i < 4; i++) {  // (G g) G^T
          rows[(4 * i) * c_group + c] = t[i][0];
          rows[(4 * i + 1) * c_group + c] = h * (t[i][0] + t[i][1] + t[i][2]);
          rows[(4 * i + 2) * c_group + c] = h * (t[i][0] - t[i][1] + t[i][2]);
          rows[(4 * i + 3) * c_group + c] = t[i][2];
        }
      }
      T *dst = u + (o / m_group * 16 * m_group + o % m_group) * c_group;
      for (int64_t k = 0; k < 16; k++)
        std::memcpy(dst + k * m_group * c_group, rows + k * c_group, size_t(c_group) * sizeof(T));
    }
  });
}

// Loads and stores of a Vec (any alignment) or of one T, for the transforms' loops and their tails.
static inline Vec LoadAs(const Vec *, const T *p) { return *reinterpret_cast<const Vec *>(p); }
static inline T LoadAs(const T *, const T *p) { return *p; }
static inline void Store(T *p, const Vec &v) { *reinterpret_cast<Vec *>(p) = v; }
static inline void Store(T *p, T v) { *p = v; }

// Narrower vectors for the tails of short runs (a 56-wide image has runs of 28 tiles: with 16 lanes,
// 12 would otherwise be done one at a time).
#if OPFORGE_VECTOR_BYTES > 32
typedef T Vec32 __attribute__((vector_size(32), aligned(sizeof(T)), may_alias));
static inline Vec32 LoadAs(const Vec32 *, const T *p) { return *reinterpret_cast<const Vec32 *>(p); }
static inline void Store(T *p, const Vec32 &v) { *reinterpret_cast<Vec32 *>(p) = v; }
#endif
#if OPFORGE_VECTOR_BYTES > 16
static inline Vec16 LoadAs(const Vec16 *, const T *p) { return *reinterpret_cast<const Vec16 *>(p); }
static inline void Store(T *p, const Vec16 &v) { *reinterpret_cast<Vec16 *>(p) = v; }
#endif

// Runs body(V(), q) for q = 0, lanes, 2 * lanes, ... while a Vec fits in n, then with narrower
// vectors while they fit, then body(T(), q) for the rest.
template <typename Body>
static inline void Lanes(int64_t n, Body body) {
  int64_t q = 0;
  for (; q + kLanes <= n; q += kLanes) body(static_cast<const Vec *>(nullptr), q);
#if OPFORGE_VECTOR_BYTES > 32
  for (; q + int64_t(32 / sizeof(T)) <= n; q += 32 / sizeof(T)) body(static_cast<const Vec32 *>(nullptr), q);
#endif
#if OPFORGE_VECTOR_BYTES > 16
  for (; q + int64_t(16 / sizeof(T)) <= n; q += 16 / sizeof(T)) body(static_cast<const Vec16 *>(nullptr), q);
#endif
  for (; q < n; q++) body(static_cast<const T *>(nullptr), q);
}

// Input row r (of in_w) split into even[q] = row[2 q + shift] and odd[q] = row[2 q + shift + 1] for
// q <= seg, zero outside the row.
static void SplitRow(const T *__restrict__ row, int64_t iw, int64_t shift, int64_t seg, T *__restrict__ even,
                     T *__restrict__ odd) {
  // q in [lo, hi): both columns inside the row
  int64_t lo = shift >= 0 ? 0 : (-shift + 1) / 2, hi = iw - 2 - shift >= 0 ? (iw - 2 - shift) / 2 + 1 : 0;
  lo = std::min(lo, seg + 1), hi = std::min(std::max(hi, lo), seg + 1);
  for (int64_t q = 0; q <= seg; q++) {
    if (q == lo) q = hi;  // (the inside is done below, without the checks)
    if (q > seg) break;
    const int64_t col = 2 * q + shift;
    even[q] = col >= 0 && col < iw ? row[col] : T(0);
    odd[q] = col + 1 >= 0 && col + 1 < iw ? row[col + 1] : T(0);
  }
  const T *src = row + shift;
  for (int64_t q = lo; q < hi; q++) even[q] = src[2 * q], odd[q] = src[2 * q + 1];
}

// V of the tiles first .. first + count - 1 of an image (c_group x in_h x in_w) into v (16 x c_group
// x count).  Per tile row and channel, each of the 4 input rows is split into its even and odd
// columns, where tile tx reads even[tx], odd[tx], even[tx + 1], odd[tx + 1]: the transform is then
// the same arithmetic on runs of tiles, a vector of them at a time.
static void WinogradInput(const ConvGeometry &g, int64_t c_group, int64_t first, int64_t count, const T *image,
                          T *__restrict__ v, T *__restrict__ rows) {
  const int64_t ih = g.in[0], iw = g.in[1], top = g.pad[0], left = g.pad[1], tw = (g.out[1] + 1) / 2;
  const int64_t step = c_group * count;  // from one of the 16 matrices to the next
  for (int64_t t = first; t < first + count;) {
    const int64_t ty = t / tw, tx0 = t % tw, seg = std::min(tw - tx0, first + count - t), at = t - first;
    for (int64_t c = 0; c < c_group; c++) {
      const T *plane = image + c * ih * iw;
      const T *even[4], *odd[4];
      for (int i = 0; i < 4; i++) {
        T *e = rows + 2 * i * (seg + 1), *o = e + seg + 1;
        even[i] = e, odd[i] = o;
        const int64_t r = 2 * ty - top + i;
        if (r < 0 || r >= ih)
          std::fill(e, e + 2 * (seg + 1), T(0));
        else
          SplitRow(plane + r * iw, iw, 2 * tx0 - left, seg, e, o);
      }
      T *out = v + c * count + at;
      Lanes(seg, [&](auto *kind, int64_t q) {
        typedef typename std::remove_const<typename std::remove_pointer<decltype(kind)>::type>::type V;
        V d[4][4];  // d B, row by row
        for (int i = 0; i < 4; i++) {
          const V e0 = LoadAs(kind, even[i] + q), e1 = LoadAs(kind, even[i] + q + 1);
          const V o0 = LoadAs(kind, odd[i] + q), o1 = LoadAs(kind, odd[i] + q + 1);
          d[i][0] = e0 - e1, d[i][1] = o0 + e1, d[i][2] = e1 - o0, d[i][3] = o0 - o1;
        }
        for (int j = 0; j < 4; j++) {  // B^T (d B)
          Store(out + j * step + q, V(d[0][j] - d[2][j]));
          Store(out + (4 + j) * step + q, V(d[1][j] + d[2][j]));
          Store(out + (8 + j) * step + q, V(d[2][j] - d[1][j]));
          Store(out + (12 + j) * step + q, V(d[1][j] - d[3][j]));
        }
      });
    }
    t += seg;
  }
}

// The output of those tiles from M (16 x m_group x count): y (m_group x out_h x out_w, from the
// image's first output channel) = A^T M A + the bias, the tiles' rows and columns past the edges cut.
static void WinogradOutput(const ConvGeometry &g, int64_t m_group, int64_t first, int64_t count, const T *mt,
                           const T *bias, T *y, T *__restrict__ rows) {
  const int64_t oh = g.out[0], ow = g.out[1], tw = (ow + 1) / 2;
  const int64_t step = m_group * count;
  for (int64_t t = first; t < first + count;) {
    const int64_t ty = t / tw, tx0 = t % tw, seg = std::min(tw - tx0, first + count - t), at = t - first;
    const int64_t x0 = 2 * tx0, width = std::min(2 * seg, ow - x0);  // the segment's output columns
    const bool two = 2 * ty + 1 < oh;
    for (int64_t r = 0; r < m_group; r++) {
      const T *src = mt + r * count + at;
      T *__restrict__ y00 = rows, *__restrict__ y01 = rows + seg, *__restrict__ y10 = rows + 2 * seg,
                      *__restrict__ y11 = rows + 3 * seg;
      const T b = bias[r];
      Lanes(seg, [&](auto *kind, int64_t q) {
        typedef typename std::remove_const<typename std::remove_pointer<decltype(kind)>::type>::type V;
        V s[4][2];  // M A, row by row
        for (int i = 0; i < 4; i++) {
          const V m0 = LoadAs(kind, src + (4 * i) * step + q), m1 = LoadAs(kind, src + (4 * i + 1) * step + q);
          const V m2 = LoadAs(kind, src + (4 * i + 2) * step + q), m3 = LoadAs(kind, src + (4 * i + 3) * step + q);
          s[i][0] = m0 + m1 + m2, s[i][1] = m1 - m2 - m3;
        }
        Store(y00 + q, V(b + (s[0][0] + s[1][0] + s[2][0])));  // A^T (M A)
        Store(y01 + q, V(b + (s[0][1] + s[1][1] + s[2][1])));
        Store(y10 + q, V(b + (s[1][0] - s[2][0] - s[3][0])));
        Store(y11 + q, V(b + (s[1][1] - s[2][1] - s[3][1])));
      });
      if (g.relu) Relu(rows, 4 * seg);
      T *__restrict__ out = y + (r * oh + 2 * ty) * ow + x0;
      const int64_t pairs = width / 2;
      for (int64_t q = 0; q < pairs; q++) out[2 * q] = y00[q], out[2 * q + 1] = y01[q];
      if (width % 2) out[width - 1] = y00[pairs];
      if (!two) continue;
      out += ow;
      for (int64_t q = 0; q < pairs; q++) out[2 * q] = y10[q], out[2 * q + 1] = y11[q];
      if (width % 2) out[width - 1] = y10[pairs];
    }
    t += seg;
  }
}

// The weights' transform, kept by the calling thread for its next calls (the tasks use Scratch).
static T *WinogradWeightBuffer(int64_t n) {
  static thread_local std::vector<T> buffer;
  if (int64_t(buffer.size()) < n) buffer.resize(size_t(n));
  return buffer.data();
}

static void Winograd2D(const ConvGeometry &g, int64_t n, int64_t m, int64_t c_group, const ConvArgs &a) {
  const int64_t m_group = m / g.group, images = n * g.group, tw = (g.out[1] + 1) / 2;
  const int64_t tiles = (g.out[0] + 1) / 2 * tw;
  T *u = WinogradWeightBuffer(16 * m * c_group);
  WinogradWeights(a.w, m, m_group, c_group, u);
  // Blocks of about kWinogradBlockBytes of V and M, but at least kWinogradLeastTiles (each gemm packs
  // its U_k again); more blocks (down to 32 tiles) while there are fewer than kConvTasks tasks, all of
  // about the same size, and then two parts of the output channels (each transforming the input again).
  const int64_t tile_bytes = 16 * (c_group + m_group) * int64_t(sizeof(T));
  const int64_t widest = std::max(kWinogradLeastTiles, kWinogradBlockBytes / tile_bytes);
  int64_t blocks = (tiles + widest - 1) / widest;
  if (images * blocks < kConvTasks)
    blocks = std::max(blocks, std::min((kConvTasks + images - 1) / std::max<int64_t>(images, 1), tiles / 32));
  const int64_t per_block = (tiles + blocks - 1) / blocks;
  blocks = (tiles + per_block - 1) / per_block;
  const int64_t parts = Parts(m_group, images * blocks, 64, 2);
  RunTasks(images * blocks * parts, 16 * m_group / parts * c_group * per_block, [&](int64_t t) {
    const int64_t part = t % parts, block = t / parts % blocks, image = t / parts / blocks;
    const int64_t first = block * per_block, count = std::min(per_block, tiles - first);
    const int64_t r0 = m_group * part / parts, rows_of_part = m_group * (part + 1) / parts - r0;
    const int64_t group = image % g.group, channel0 = image / g.group * m + group * m_group + r0;
    T *v = Scratch(16 * (c_group + rows_of_part) * count + 8 * (tw + 1));
    T *mt = v + 16 * c_group * count, *rows = mt + 16 * rows_of_part * count;
    WinogradInput(g, c_group, first, count, a.x + image * c_group * g.in_size, v, rows);
    const T *uk = u + (group * 16 * m_group + r0) * c_group;
    for (int64_t k = 0; k < 16; k++)
      OpforgeGemm(false, false, rows_of_part, count, c_group, T(1), uk + k * m_group * c_group, c_group,
                  v + k * c_group * count, count, T(0), mt + k * rows_of_part * count, count);
    WinogradOutput(g, rows_of_part, first, count, mt, a.b + channel0 % m, a.y + channel0 * g.out_size, rows);
  });
}

// x: N x C x in..., w: M x C/group x kernel..., b: M -> y: N x M x out...
extern "C" int ConvInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  const int rank = ndims[0] - 2;
  if (rank < 1 || ndims[1] != ndims[0] || ndims[3] != ndims[0]) return 1;
  // (ops declared with this source and without the attribute -- a user's copy of conv -- have no activation)
  const bool relu = extra->HasAttr("activation") && extra->Attr<std::string>("activation") == "relu";
  return InitGeometry(shapes[0], shapes[3], shapes[1], rank, extra, true, [&](ConvGeometry &g) {
    g.relu = relu;
    return shapes[0][1] != shapes[1][1] * g.group || shapes[1][0] % g.group ? -1 : shapes[1][1];
  });
}

extern "C" int Conv(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                    void *extra) {
  const ConvArgs a(params);
  const ConvGeometry *g = GeometryOf(extra);
  if (g == nullptr) return 1;
  const int64_t n = shapes[0][0], m = shapes[1][0], c_group = shapes[1][1], m_group = m / g->group;
  const int64_t inner = c_group * g->kernel_size;  // the product's inner dim
  if (!Fits(*g, m_group, inner)) return 3;
  try {
    if (c_group == 1 && m_group <= 4 && g->rank == 2) {  // (more outputs per channel: gemm does better)
      Depthwise2D(*g, n, m, a);
      return 0;
    }
    if (OPFORGE_CONV_WINOGRAD && WinogradApplies(*g) &&
        (OPFORGE_CONV_WINOGRAD == 2 || WinogradPays(*g, c_group, m_group))) {
      Winograd2D(*g, n, m, c_group, a);
      return 0;
    }
    if (c_group == 1 && m_group == 1) {  // depthwise in 1 or 3+ spatial dims: the generic taps
      a.FillBias(n, m, g->out_size);
      opforge::parallel_for(0, n * g->group, std::max<int64_t>(1, kParallelWork / (g->out_size * g->kernel_size)),
                         [&](int64_t lo, int64_t hi) {
                           for (int64_t p = lo; p < hi; p++) {
                             DepthwiseAdd(*g, a.x + p * g->in_size, a.w + p % g->group * inner,
                                          a.y + p * g->out_size);
                             if (g->relu) Relu(a.y + p * g->out_size, g->out_size);
                           }
                         });
      return 0;
    }
    // Per image (a sample's group): y[:, columns] = w (m_group x inner) @ the columns (inner x width).
    // A task is a block of columns (made by im2col, unless direct) times a part of the output channels.
    // Images with few blocks are cut into smaller ones (down to kLeastWidth columns) to give the pool
    // kConvTasks tasks, and only then the channels into two parts (each part makes its columns again,
    // so one thread does extra work for them).
    const int64_t images = n * g->group;
    int64_t runs = RunsPerBlock(*g, inner), blocks = (g->outer + runs - 1) / runs;
    // A product whose weights outweigh its image's columns (deep layers on small images) is not cut into
    // blocks of columns, each of which would pack all of w again; only into parts of the output channels
    // (each packing its rows of w, and making the columns again).
    const bool weights_heavier = m_group > g->out_size;
    if (images > 0 && images * blocks < kConvTasks && !weights_heavier) {
      const int64_t per_image = (kConvTasks + images - 1) / images;
      const int64_t least = (kLeastWidth + g->last_out - 1) / g->last_out;
      runs = std::min(runs, std::max(least, (g->outer + per_image - 1) / per_image));
      blocks = (g->outer + runs - 1) / runs;
    }
    runs = (g->outer + blocks - 1) / blocks;  // blocks of one size: a short last one would idle a thread
    const int64_t parts = Parts(m_group, images * blocks, 128, 2);
    RunTasks(images * blocks * parts, m_group / parts * inner * runs * g->last_out, [&](int64_t t) {
      const int64_t part = t % parts, block = t / parts % blocks, image = t / parts / blocks;
      const int64_t first = block * runs, count = std::min(runs, g->outer - first);
      const int64_t column0 = first * g->last_out, width = count * g->last_out;
      const int64_t r0 = m_group * part / parts, r1 = m_group * (part + 1) / parts;
      const int64_t channel0 = image / g->group * m + image % g->group * m_group + r0;
      const T *x = a.x + image * c_group * g->in_size;
      T *out = a.y + channel0 * g->out_size + column0;
      for (int64_t r = 0; r < r1 - r0; r++) std::fill(out + r * g->out_size, out + r * g->out_size + width,
                                                     a.b[channel0 % m + r]);
      const T *columns = g->direct ? x + column0 : Im2Col(*g, c_group, first, count, x, Scratch(inner * width));
      OpforgeGemm(false, false, r1 - r0, width, inner, T(1), a.w + (image % g->group * m_group + r0) * inner, inner,
                  columns, g->direct ? g->out_size : width, T(1), out, g->out_size);
      if (g->relu)
        for (int64_t r = 0; r < r1 - r0; r++) Relu(out + r * g->out_size, width);
    });
  } catch (...) {  // (a failed allocation, the pool): nothing crosses the ABI
    return 2;
  }
  return 0;
}
"""
# Built per ISA: the depthwise taps and Winograd's transforms take the widest vectors the CPU has.
for _isa in SIMD_ISAS:
    blas.requiring(conv.kernel(function="Conv", dtypes={"x": FLOATS, "w": FLOATS, "b": FLOATS}, code=CONV, isa=_isa))
del _isa
zeros_for_absent(conv, 2, lambda x, w, b, **_: np.zeros(w.shape[0], x.dtype), {"x": FLOATS, "w": FLOATS})


# -- conv_weight_grad: dw of conv ----------------------------------------------------

conv_weight_grad = opforge.op(f"conv_weight_grad(Tensor x, Tensor dy, *, int[] kernel_shape, {GEOMETRY_ATTRS}) "
                              "-> Tensor dw", traits=["no_side_effect"],
                              doc="Gradient of conv with respect to its weights: x's windows times dy, summed over "
                                  "the batch and the output positions.")


@conv_weight_grad.infer
def conv_weight_grad_infer(x: TensorSpec, dy: TensorSpec, *, kernel_shape: Sequence[int], strides: Sequence[int],
                           pads: Sequence[int], dilations: Sequence[int], group: int) -> TensorSpec:
    same_float_dtype("conv_weight_grad", [x, dy], ["x", "dy"])
    spatial = spatial_rank("conv_weight_grad", x, dy)
    if spatial is not None and len(kernel_shape) != spatial:
        raise opforge.AttrError(f"op 'conv_weight_grad': attribute 'kernel_shape' is {list(kernel_shape)}; x has "
                                f"{spatial} spatial dim(s)")
    conv_params("conv_weight_grad", len(kernel_shape), strides, pads, dilations, group)
    channels = x.shape[1] if x.rank is not None else -1
    out_channels = dy.shape[1] if dy.rank is not None else -1
    for name, count in (("x", channels), ("dy", out_channels)):
        if count != -1 and count % group:
            raise opforge.ShapeError(f"op 'conv_weight_grad': input '{name}' has {count} channels, not a multiple of "
                                     f"group={group}")
    return TensorSpec((out_channels, -1 if channels == -1 else channels // group, *kernel_shape), x.dtype)


@conv_weight_grad.reference(fallback=True)
def conv_weight_grad_reference(x: npt.NDArray[Any], dy: npt.NDArray[Any], *, kernel_shape: Sequence[int],
                               strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                               group: int) -> npt.NDArray[Any]:
    spatial = x.ndim - 2
    strides, pads, dilations = conv_params("conv_weight_grad", spatial, strides, pads, dilations, group)
    n, c, m = x.shape[0], x.shape[1], dy.shape[1]
    out = dy.shape[2:]
    dw = np.zeros((group, m // group, c // group, *kernel_shape), x.dtype)
    positions = int(np.prod(out))  # (not -1: an empty batch leaves nothing to infer it from)
    grads = dy.reshape(n, group, m // group, positions)
    for k, window in windows(x, kernel_shape, out, strides, pads, dilations):
        grouped = window.reshape(n, group, c // group, positions)
        dw[(Ellipsis,) + tuple(k)] = np.einsum("ngcl,ngml->gmc", grouped, grads)
    return dw.reshape(m, c // group, *kernel_shape)


CONV_WEIGHT_GRAD = CONV_COMMON + r"""
// x: N x C x in..., dy: N x M x out... -> dw: M x C/group x kernel...
extern "C" int ConvWeightGradInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  const int rank = ndims[0] - 2;
  if (rank < 1 || ndims[1] != ndims[0] || ndims[2] != ndims[0]) return 1;
  return InitGeometry(shapes[0], shapes[1], shapes[2], rank, extra, true, [&](const ConvGeometry &g) {
    const bool fit = shapes[1][1] % g.group == 0 && shapes[2][0] == shapes[1][1] &&
                     shapes[2][1] * g.group == shapes[0][1] && shapes[1][0] == shapes[0][0];
    return fit ? shapes[2][1] : -1;
  });
}

extern "C" int ConvWeightGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  const T *x = static_cast<const T *>(params[0]);
  const T *dy = static_cast<const T *>(params[1]);
  T *dw = static_cast<T *>(params[2]);
  const ConvGeometry *g = GeometryOf(extra);
  if (g == nullptr) return 1;
  const int64_t n = shapes[0][0], m = shapes[1][1], c_group = shapes[2][1], m_group = m / g->group;
  const int64_t inner = c_group * g->kernel_size;
  if (!Fits(*g, m_group, inner)) return 3;
  if (n == 0) {  // no samples: nothing to sum
    std::fill(dw, dw + m * inner, T(0));
    return 0;
  }
  // A task is a block of dw (a group's output channels r0..r1 by input channels c0..c1, every tap of
  // them), summed over the samples and their output positions in a fixed order: dy's rows times the
  // columns (im2col) of those input channels, a block of output positions at a time.
  // Parts of >= 128 input rows (gemm's n; a narrower dw is slower to make), and parts of the output
  // channels (each making its columns again) only where there are fewer than 4 tasks.  The blocks of
  // positions are gemm's inner dim: long ones (kSumBlockBytes) make it pack less often.
  const int64_t least = std::max<int64_t>(1, (128 + g->kernel_size - 1) / g->kernel_size);
  const int64_t c_parts = Parts(c_group, g->group, least), m_parts = Parts(m_group, g->group * c_parts, 32, 4);
  const int64_t c_most = (c_group + c_parts - 1) / c_parts;  // channels of the widest part
  const int64_t runs = RunsPerBlock(*g, c_most * g->kernel_size, kSumBlockBytes);
  const int64_t blocks = (g->outer + runs - 1) / runs;
  try {
    RunTasks(g->group * c_parts * m_parts, n * m_group * inner * g->out_size / (g->group * c_parts * m_parts),
             [&](int64_t t) {
      const int64_t mp = t % m_parts, cp = t / m_parts % c_parts, grp = t / m_parts / c_parts;
      const int64_t r0 = m_group * mp / m_parts, r1 = m_group * (mp + 1) / m_parts;
      const int64_t c0 = c_group * cp / c_parts, c1 = c_group * (cp + 1) / c_parts;
      const int64_t rows = (c1 - c0) * g->kernel_size;  // of the task's columns
      T *out = dw + (grp * m_group + r0) * inner + c0 * g->kernel_size;
      T *columns = g->direct ? nullptr : Scratch(rows * runs * g->last_out);
      // The task's block of dw is summed transposed (rows x r1 - r0): gemm is faster with the output
      // channels, the fewer, as its n (OpenBLAS: 90 against 64 GFLOP/s for 64 x 3136 x 576).
      std::vector<T> sum(size_t(rows * (r1 - r0)));
      for (int64_t s = 0; s < n; s++) {
        const T *image = x + ((s * g->group + grp) * c_group + c0) * g->in_size;
        const T *grads = dy + (s * m + grp * m_group + r0) * g->out_size;
        for (int64_t block = 0; block < blocks; block++) {
          const int64_t first = block * runs, count = std::min(runs, g->outer - first);
          const int64_t column0 = first * g->last_out, width = count * g->last_out;
          // sum (rows x r1 - r0) (+)= the block's columns @ grads[:, block]^T
          OpforgeGemm(false, true, rows, r1 - r0, width, T(1),
                      g->direct ? image + column0 : Im2Col(*g, c1 - c0, first, count, image, columns),
                      g->direct ? g->out_size : width, grads + column0, g->out_size,
                      T(s == 0 && block == 0 ? 0 : 1), sum.data(), r1 - r0);
        }
      }
      for (int64_t r = 0; r < r1 - r0; r++)
        for (int64_t j = 0; j < rows; j++) out[r * inner + j] = sum[j * (r1 - r0) + r];
    });
  } catch (...) {  // (a failed allocation, the pool): nothing crosses the ABI
    return 2;
  }
  return 0;
}
"""
blas.requiring(conv_weight_grad.kernel(function="ConvWeightGrad", dtypes={"x": FLOATS, "dy": FLOATS},
                                       code=CONV_WEIGHT_GRAD))
