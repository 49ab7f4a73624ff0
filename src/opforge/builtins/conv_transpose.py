"""conv_transpose: the transpose (adjoint) of conv, x: N x C x in..., w: C x M/group x kernel... (ONNX ConvTranspose).

Each input position i scatters ``x[i] * w`` onto the output from
``i * stride - pad_begin`` on, kernel element k landing ``k * dilation``
further.  Output dim: ``(in - 1) * s + output_padding + (k - 1) * d + 1 -
pad_begin - pad_end``; attributes as for conv (the converter resolves ONNX's
``output_shape`` and ``auto_pad`` into pads and output_padding).

The kernel multiplies each group's weights (transposed) by its input with
OpenBLAS's gemm into a columns matrix and adds the columns into the output
(col2im, conv's im2col run backwards).  Its tasks on opforge's pool are
parts of each sample's output channels, which write disjoint parts of y
(OpenBLAS on each task's own thread, as in conv).  The gradient: dx is conv of dy, dw is
``conv_weight_grad`` with the roles of x and dy swapped, db sums dy.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import FLOATS, known_dims
from opforge.builtins.conv import CONV_COMMON, GEOMETRY_ATTRS, check_bias, check_grouped, conv_params, spatial_rank
from opforge.builtins.gemm import same_float_dtype, zeros_for_absent
from opforge.runtime import blas

if TYPE_CHECKING:
    import numpy.typing as npt

conv_transpose = opforge.op(f"conv_transpose(Tensor x, Tensor w, Tensor? b, *, {GEOMETRY_ATTRS}, "
                            "int[] output_padding=[]) -> Tensor y",
                            traits=["no_side_effect"],
                            doc="ONNX ConvTranspose on N x C x spatial: weights C x M/group x kernel, optional bias "
                                "of M; pads are begin pads then end pads, output_padding adds to the end.")


def transposed_dims(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                    dilations: Sequence[int], output_padding: Sequence[int]) -> list[int]:
    spatial = len(x_shape) - 2
    out = []
    for j in range(spatial):
        n, k = x_shape[2 + j], w_shape[2 + j]
        out.append(-1 if -1 in (n, k) else (n - 1) * strides[j] + output_padding[j] + (k - 1) * dilations[j] + 1
                   - pads[j] - pads[spatial + j])
    return out


def output_padding_of(spatial: int, output_padding: Sequence[int]) -> list[int]:
    output_padding = list(output_padding) or [0] * spatial
    if len(output_padding) != spatial or any(p < 0 for p in output_padding):
        raise opforge.AttrError(f"op 'conv_transpose': attribute 'output_padding' is {output_padding}; it needs "
                                f"{spatial} values >= 0")
    return output_padding


@conv_transpose.infer
def conv_transpose_infer(x: TensorSpec, w: TensorSpec, b: TensorSpec | None, *, strides: Sequence[int],
                         pads: Sequence[int], dilations: Sequence[int], group: int,
                         output_padding: Sequence[int]) -> TensorSpec:
    same_float_dtype("conv_transpose", [x, w, b], ["x", "w", "b"])
    spatial = spatial_rank("conv_transpose", x, w)
    if spatial is None:
        return TensorSpec(None, x.dtype)
    strides, pads, dilations = conv_params("conv_transpose", spatial, strides, pads, dilations, group)
    output_padding = output_padding_of(spatial, output_padding)
    x_shape = x.shape if x.rank is not None else (-1,) * (spatial + 2)
    w_shape = w.shape if w.rank is not None else (-1,) * (spatial + 2)
    check_grouped("conv_transpose", x_shape[1], w_shape[0], 1,
                  f"input 'x' has {x_shape[1]} channels, w (shape {list(w_shape)}) takes {w_shape[0]}")
    if x_shape[1] != -1 and x_shape[1] % group:
        raise opforge.ShapeError(f"op 'conv_transpose': input 'x' has {x_shape[1]} channels, not a multiple of "
                                 f"group={group}")
    channels = -1 if w_shape[1] == -1 else w_shape[1] * group
    check_bias("conv_transpose", b, channels)
    out = transposed_dims(x_shape, w_shape, strides, pads, dilations, output_padding)
    if any(n == 0 or n < -1 for n in out):
        raise opforge.ShapeError(f"op 'conv_transpose': pads {pads} remove the whole output (x {list(x_shape)}, "
                                 f"w {list(w_shape)})")
    return TensorSpec((x_shape[0], channels, *out), x.dtype)


@conv_transpose.reference(fallback=True)
def conv_transpose_reference(x: npt.NDArray[Any], w: npt.NDArray[Any], b: npt.NDArray[Any] | None, *,
                             strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int], group: int,
                             output_padding: Sequence[int]) -> npt.NDArray[Any]:
    spatial = x.ndim - 2
    strides, pads, dilations = conv_params("conv_transpose", spatial, strides, pads, dilations, group)
    output_padding = output_padding_of(spatial, output_padding)
    n, c, m_group = x.shape[0], x.shape[1], w.shape[1]
    out = transposed_dims(x.shape, w.shape, strides, pads, dilations, output_padding)
    # Scatter into the padded output (y with its pads in place), then cut the pads off.
    padded = np.zeros((n, group, m_group, *[o + pads[j] + pads[spatial + j] for j, o in enumerate(out)]), x.dtype)
    grouped = x.reshape(n, group, c // group, *x.shape[2:])
    weights = w.reshape(group, c // group, m_group, *w.shape[2:])
    for k in np.ndindex(*w.shape[2:]):
        taps = tuple(slice(k[j] * dilations[j], k[j] * dilations[j] + (x.shape[2 + j] - 1) * strides[j] + 1, strides[j])
                     for j in range(spatial))
        window = padded[(Ellipsis,) + taps]
        window += np.einsum("ngc...,gcm->ngm...", grouped, weights[(Ellipsis,) + tuple(k)])
    inside = tuple(slice(pads[j], pads[j] + out[j]) for j in range(spatial))
    y = padded[(Ellipsis,) + inside].reshape(n, group * m_group, *out)
    if b is not None:
        y = y + b.reshape(-1, *[1] * spatial)
    return np.ascontiguousarray(y)


@conv_transpose.grad(save=["x", "w", "b"])
def conv_transpose_grad(saved: Any, dy: Any, *, strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                        group: int, output_padding: Sequence[int]) -> tuple[Any, Any, Any]:
    geometry = dict(strides=strides, pads=pads, dilations=dilations, group=group)
    dx = opforge.ops.conv(dy, saved.w, None, **geometry)
    dw = opforge.ops.conv_weight_grad(dy, saved.x, kernel_shape=list(known_dims(saved.w)[2:]), **geometry)
    db = None if saved.b is None else opforge.ops.reduce_sum(dy, axes=[0, *range(2, len(known_dims(dy)))])
    return dx, dw, db


CONV_TRANSPOSE = CONV_COMMON + r"""
// x: N x C x in..., w: C x M/group x kernel..., b: M -> y: N x M x out...  The geometry is that of a
// convolution of y (the image) giving x's positions (the columns).
extern "C" int ConvTransposeInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  const int rank = ndims[0] - 2;
  if (rank < 1 || ndims[1] != ndims[0] || ndims[3] != ndims[0]) return 1;
  return InitGeometry(shapes[3], shapes[0], shapes[1], rank, extra, false, [&](const ConvGeometry &g) {
    const bool fit = shapes[0][1] == shapes[1][0] && shapes[0][1] % g.group == 0 &&
                     shapes[3][1] == shapes[1][1] * g.group;
    return fit ? shapes[1][1] : -1;
  });
}

extern "C" int ConvTranspose(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
  const ConvArgs a(params);
  const ConvGeometry *g = GeometryOf(extra);
  if (g == nullptr) return 1;
  const int64_t n = shapes[0][0], c = shapes[0][1], c_group = c / g->group, m_group = shapes[1][1];
  const int64_t m = m_group * g->group, rows = m_group * g->kernel_size;  // rows of the columns matrix
  if (!Fits(*g, rows, c_group)) return 3;
  // A task is a part of an image's output channels (c0..c1 of a sample's group): its bias, then per block
  // of x's positions the columns (its channels' rows of w[grp]^T @ x[s, grp][:, block]) added into y by
  // col2im (directly, for a 1 x 1 kernel of stride 1).  Parts write disjoint channels of y.
  const int64_t images = n * g->group;
  const int64_t parts = Parts(m_group, images, std::max<int64_t>(1, (32 + g->kernel_size - 1) / g->kernel_size));
  const int64_t most = (m_group + parts - 1) / parts * g->kernel_size;  // rows of the widest part's columns
  const int64_t runs = RunsPerBlock(*g, most), blocks = (g->outer + runs - 1) / runs;
  try {
    RunTasks(images * parts, most * c_group * g->out_size, [&](int64_t t) {
      const int64_t part = t % parts, image = t / parts, s = image / g->group, grp = image % g->group;
      const int64_t c0 = m_group * part / parts, c1 = m_group * (part + 1) / parts;
      T *y = a.y + (s * m + grp * m_group + c0) * g->in_size;
      for (int64_t ch = c0; ch < c1; ch++) std::fill(y + (ch - c0) * g->in_size, y + (ch - c0 + 1) * g->in_size,
                                                    a.b[grp * m_group + ch]);
      const T *in = a.x + (s * c + grp * c_group) * g->out_size;
      const T *w = a.w + grp * c_group * rows + c0 * g->kernel_size;
      T *columns = g->direct ? nullptr : Scratch(most * runs * g->last_out);
      for (int64_t block = 0; block < blocks; block++) {
        const int64_t first = block * runs, count = std::min(runs, g->outer - first);
        const int64_t column0 = first * g->last_out, width = count * g->last_out;
        OpforgeGemm(true, false, (c1 - c0) * g->kernel_size, width, c_group, T(1), w, rows, in + column0,
                    g->out_size, T(g->direct ? 1 : 0), g->direct ? y + column0 : columns,
                    g->direct ? g->out_size : width);
        if (!g->direct) Col2ImAdd(*g, c1 - c0, first, count, columns, y);
      }
    });
  } catch (...) {  // (a failed allocation, the pool): nothing crosses the ABI
    return 2;
  }
  return 0;
}
"""
blas.requiring(conv_transpose.kernel(function="ConvTranspose", dtypes={"x": FLOATS, "w": FLOATS, "b": FLOATS},
                                     code=CONV_TRANSPOSE))
zeros_for_absent(conv_transpose, 2, lambda x, w, b, *, group, **_: np.zeros(w.shape[1] * group, x.dtype),
                 {"x": FLOATS, "w": FLOATS})
