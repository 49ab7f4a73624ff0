"""max_pool: the maximum over sliding windows of an NC + 1..3 spatial-dim tensor (ONNX MaxPool).

``kernel_shape`` is one size per spatial dim; ``strides`` (default 1),
``dilations`` (default 1) too; ``pads`` holds the begin pads of every
spatial dim, then the end pads (default 0).  Output dim:
``(in + pads - ((k - 1) * d + 1)) / s + 1``, rounded down, or up with
``ceil_mode`` -- where a last window starting inside the end padding is
dropped.  Padding never wins a maximum.  ``max_pool_with_indices`` also
returns where each maximum came from (ONNX's optional ``Indices`` output:
flat offsets into x, the spatial dims counted row-major, or column-major
with ``storage_order=1``).

The kernels (pool.cc, shared with average_pool) take float32, float64,
int8, uint8, int32 and int64; other dtypes run the NumPy reference.  The
gradient is ``max_pool_grad``: dy added at each window's (first) maximum,
found again from x.  ``max_pool_with_indices``'s gradient,
``max_pool_with_indices_grad``, adds dy where its indices say and finds
nothing again (the backward PyTorch and onnxruntime train with), for models
that carry the indices.  Computing them only for the backward gains nothing:
writing them forward costs what max_pool_grad's own search does.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import TensorSpec
from opforge.builtins.common import FLOATS, shapes_agree

if TYPE_CHECKING:
    import numpy.typing as npt

    from opforge import Op

POOL_ATTRS = "int[] kernel_shape, int[] strides=[], int[] pads=[], int[] dilations=[], bool ceil_mode=False"
MAX_ATTRS = f"{POOL_ATTRS}, int storage_order=0"
POOL_CC = str(Path(__file__).with_name("pool.cc"))
POOL_DTYPES = ["float32", "float64", "int8", "uint8", "int32", "int64"]


def pool_kernels(op: Op, function: str, dtypes: Sequence[Sequence[str]]) -> None:
    """pool.cc's ``function`` as ``op``'s kernel, built plain and for AVX2.  -fno-trapping-math lets g++
    turn the loops' compare-and-select into vector blends."""
    for isa in (None, "avx2"):
        op.kernel(source=POOL_CC, function=function, dtypes=dtypes, isa=isa,
                  cflags=["-fno-trapping-math", "-Wno-psabi"])

max_pool = opforge.op(f"max_pool(Tensor x, *, {MAX_ATTRS}) -> Tensor y", traits=["no_side_effect"],
                      doc="ONNX MaxPool on N x C x spatial (1 to 3 dims): the maximum of each window; "
                          "pads are begin pads then end pads, padding never wins.")


# -- geometry shared by the pooling ops ---------------------------------------------

def pool_params(spatial: int, kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                dilations: Sequence[int]) -> list[tuple[int, int, int, int, int]]:
    """Per spatial dim: (k, s, pad begin, pad end, d), defaults filled in."""
    strides = list(strides) or [1] * spatial
    dilations = list(dilations) or [1] * spatial
    pads = list(pads) or [0] * (2 * spatial)
    return [(kernel_shape[j], strides[j], pads[j], pads[spatial + j], dilations[j]) for j in range(spatial)]


def pooled_dim(n: int, k: int, s: int, pb: int, pe: int, d: int, ceil_mode: bool) -> int:
    """Output length of one spatial dim (-1 when n is unknown)."""
    if n == -1:
        return -1
    span = n + pb + pe - ((k - 1) * d + 1)
    if span < 0:
        return 0
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= n + pb:  # the last window would start in the end padding
        out -= 1
    return out


def pool_problem(name: str, x: TensorSpec, kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                 dilations: Sequence[int]) -> str | None:
    """What is wrong with a pooling op's attributes for input spec x, or None."""
    if not kernel_shape:
        return "'kernel_shape' is empty; give one size per spatial dim"
    spatial = len(kernel_shape)
    for attr, values, want in (("strides", strides, spatial), ("dilations", dilations, spatial),
                               ("pads", pads, 2 * spatial)):
        if values and len(values) != want:
            return f"'{attr}' has {len(values)} entries; kernel_shape {list(kernel_shape)} needs {want} (or none)"
    for attr, values, low in (("kernel_shape", kernel_shape, 1), ("strides", strides, 1),
                              ("dilations", dilations, 1), ("pads", pads, 0)):
        if any(v < low for v in values):
            return f"'{attr}' {list(values)} has an entry below {low}"
    if spatial > 3:
        return f"kernel_shape {list(kernel_shape)} has {spatial} dims; {name} takes 1 to 3 spatial dims"
    if x.rank is None:
        return None
    if x.rank != spatial + 2:
        return (f"input 'x' has rank {x.rank}; kernel_shape {list(kernel_shape)} needs rank {spatial + 2} "
                f"(N, C and {spatial} spatial dim(s))")
    for j, (k, s, pb, pe, d) in enumerate(pool_params(spatial, kernel_shape, strides, pads, dilations)):
        n = x.shape[2 + j]
        if n != -1 and n + pb + pe < (k - 1) * d + 1:
            return (f"spatial dim {j} of input 'x' ({n}, padded by {pb} + {pe}) is smaller than the window "
                    f"({(k - 1) * d + 1} with kernel {k}, dilation {d})")
    return None


def pooled_spec(x: TensorSpec, kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                dilations: Sequence[int], ceil_mode: bool, dtype: str | None = None) -> TensorSpec:
    dtype = dtype or x.dtype
    if x.rank is None:
        return TensorSpec(None, dtype)
    params = pool_params(len(kernel_shape), kernel_shape, strides, pads, dilations)
    return TensorSpec(list(x.shape[:2]) + [pooled_dim(n, *p, ceil_mode) for n, p in zip(x.shape[2:], params)],
                      dtype)


def windows(x: npt.NDArray[Any], kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
            dilations: Sequence[int], ceil_mode: bool, fill: float
            ) -> tuple[list[int], Callable[[Sequence[int]], npt.NDArray[Any]], list[range], npt.NDArray[Any]]:
    """For the reference kernels: the output's spatial shape; a function giving, for one tap (an offset per
    spatial dim), the view of x padded with ``fill`` (its ends widened for ceil_mode) that the tap reads for
    every output; the taps; and the padded x itself (the views write through to it)."""
    spatial = x.ndim - 2
    params = pool_params(spatial, kernel_shape, strides, pads, dilations)
    out = [pooled_dim(n, *p, ceil_mode) for n, p in zip(x.shape[2:], params)]
    widths = [(0, 0), (0, 0)]
    for n, o, (k, s, pb, pe, d) in zip(x.shape[2:], out, params):
        widths.append((pb, max(pe, (o - 1) * s + (k - 1) * d + 1 - n - pb, 0)))
    padded = np.pad(x, widths, constant_values=fill)

    def tap(offsets: Sequence[int]) -> npt.NDArray[Any]:
        index: list[slice] = [np.s_[:], np.s_[:]]
        for t, o, (k, s, pb, pe, d) in zip(offsets, out, params):
            index.append(np.s_[t * d: t * d + (o - 1) * s + 1: s])
        return padded[tuple(index)]

    return out, tap, [range(k) for k in kernel_shape], padded


def lowest(dtype: np.dtype[Any]) -> float:
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def max_pool_argmax(x: npt.NDArray[Any], kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                    dilations: Sequence[int], ceil_mode: bool) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    """The maximum of every window and its flat spatial offset in x (-1 for a window of padding only)."""
    spatial_size = int(np.prod(x.shape[2:]))
    positions = np.arange(spatial_size, dtype=np.int64).reshape((1, 1) + x.shape[2:])
    out, tap, taps, _ = windows(x, kernel_shape, strides, pads, dilations, ceil_mode, lowest(x.dtype))
    _, where, _, _ = windows(positions, kernel_shape, strides, pads, dilations, ceil_mode, -1)
    best = np.full(x.shape[:2] + tuple(out), lowest(x.dtype), x.dtype)
    at = np.full(x.shape[:2] + tuple(out), -1, np.int64)
    for offsets in itertools.product(*taps):
        value, position = tap(offsets), where(offsets)
        better = (position >= 0) & ((value > best) | (at < 0))
        best = np.where(better, value, best)
        at = np.where(better, position, at)
    return best, at


@max_pool.check
def max_pool_check(x: TensorSpec, *, kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                   dilations: Sequence[int], ceil_mode: bool, storage_order: int) -> str | None:
    if storage_order not in (0, 1):
        return f"'storage_order' is {storage_order}; it is 0 (row-major) or 1 (column-major)"
    return pool_problem("max_pool", x, kernel_shape, strides, pads, dilations)


@max_pool.infer
def max_pool_infer(x: TensorSpec, *, kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                   dilations: Sequence[int], ceil_mode: bool, storage_order: int) -> TensorSpec:
    return pooled_spec(x, kernel_shape, strides, pads, dilations, ceil_mode)


@max_pool.reference(fallback=True)
def max_pool_reference(x: npt.NDArray[Any], *, kernel_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                       dilations: Sequence[int], ceil_mode: bool, storage_order: int) -> npt.NDArray[Any]:
    return max_pool_argmax(x, kernel_shape, strides, pads, dilations, ceil_mode)[0]


@max_pool.grad(save=["x"])
def max_pool_grad_rule(saved: Any, dy: Any, **attrs: Any) -> Any:
    return opforge.ops.max_pool_grad(dy, saved.x, **attrs)


pool_kernels(max_pool, "MaxPool", [(d,) for d in POOL_DTYPES])


# -- with ONNX's Indices output ---------------------------------------------------

max_pool_with_indices = opforge.op(
    f"max_pool_with_indices(Tensor x, *, {MAX_ATTRS}) -> (Tensor y, Tensor indices)", traits=["no_side_effect"],
    doc="max_pool, and where each maximum is: its flat offset in x (int64; the spatial dims row-major, or "
        "column-major with storage_order=1; -1 for a window of padding only).")
max_pool_with_indices.check(max_pool_check)


@max_pool_with_indices.infer
def max_pool_with_indices_infer(x: TensorSpec, **attrs: Any) -> tuple[TensorSpec, TensorSpec]:
    y = max_pool_infer(x, **attrs)
    return y, TensorSpec(y.shape if y.rank is not None else None, "int64")


@max_pool_with_indices.reference(fallback=True)
def max_pool_with_indices_reference(x: npt.NDArray[Any], *, kernel_shape: Sequence[int], strides: Sequence[int],
                                    pads: Sequence[int], dilations: Sequence[int], ceil_mode: bool,
                                    storage_order: int) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    best, at = max_pool_argmax(x, kernel_shape, strides, pads, dilations, ceil_mode)
    if storage_order == 1 and x.ndim > 2:  # the same position counted with the first spatial dim fastest
        coords = np.unravel_index(np.maximum(at, 0), x.shape[2:])
        at = np.where(at < 0, -1, np.ravel_multi_index(coords, x.shape[2:], order="F"))
    plane = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[:2] + (1,) * (x.ndim - 2))
    return best, np.where(at < 0, -1, at + plane * int(np.prod(x.shape[2:])))


pool_kernels(max_pool_with_indices, "MaxPoolIndices", [(d,) for d in POOL_DTYPES])


# -- the gradient -----------------------------------------------------------------

def gradient_check(name: str, check: Callable[..., str | None],
                   infer: Callable[..., TensorSpec]) -> Callable[..., str | None]:
    """The check of the gradient op of ``name`` (inputs dy, x): one dtype, attributes valid for x (``check``),
    and dy shaped as the op's output for x (``infer``)."""
    def gradient_check_fn(dy: TensorSpec, x: TensorSpec, **attrs: Any) -> str | None:
        if dy.dtype != x.dtype:
            raise opforge.DTypeError(f"op '{name}_grad': inputs 'dy' ({dy.dtype}) and 'x' ({x.dtype}) must have "
                                     f"one dtype")
        problem = check(x, **attrs)
        if problem is None and dy.rank is not None:
            want = infer(x, **attrs)
            if want.rank is not None and not shapes_agree(want.shape, dy.shape):
                problem = f"input 'dy' has shape {list(dy.shape)}; {name} of 'x' has {list(want.shape)}"
        return problem

    return gradient_check_fn


def shaped_like_x(dy: TensorSpec, x: TensorSpec, **attrs: Any) -> TensorSpec:
    """Inference of a gradient op (inputs dy, x): dx has x's shape and dy's dtype."""
    return TensorSpec(x.shape if x.rank is not None else None, dy.dtype)


GRADIENT_DTYPES = [(d, d) for d in FLOATS]  # (dy, x) of the gradient kernels


def gradient_op(name: str, attrs: str, check: Callable[..., str | None], infer: Callable[..., TensorSpec], doc: str,
                traits: Iterable[str] = ("no_side_effect",)) -> Op:
    """``{name}_grad(dy, x, *, attrs) -> dx``, the gradient op of ``name`` whose dx has x's shape: its check
    (``gradient_check`` of ``check`` and ``infer``) and inference (``shaped_like_x``)."""
    op = opforge.op(f"{name}_grad(Tensor dy, Tensor x, *, {attrs}) -> Tensor dx", traits=list(traits), doc=doc)
    op.check(gradient_check(name, check, infer))
    op.def_infer(shaped_like_x)
    return op


max_pool_grad = gradient_op("max_pool", MAX_ATTRS, max_pool_check, max_pool_infer,
                            doc="Gradient of max_pool: zeros like x, with each dy added at its window's first maximum.")


@max_pool_grad.reference(fallback=True)
def max_pool_grad_reference(dy: npt.NDArray[Any], x: npt.NDArray[Any], *, kernel_shape: Sequence[int],
                            strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int], ceil_mode: bool,
                            storage_order: int) -> npt.NDArray[Any]:
    _, at = max_pool_argmax(x, kernel_shape, strides, pads, dilations, ceil_mode)
    planes = x.shape[0] * x.shape[1]
    if planes == 0:
        return np.zeros(x.shape, dy.dtype)
    dx = np.zeros((planes, int(np.prod(x.shape[2:]))), dy.dtype)
    at, dy = at.reshape(planes, -1), dy.reshape(planes, -1)
    for plane in range(planes):
        taken = at[plane] >= 0
        np.add.at(dx[plane], at[plane][taken], dy[plane][taken])
    return dx.reshape(x.shape)


pool_kernels(max_pool_grad, "MaxPoolGrad", GRADIENT_DTYPES)


# -- the gradient from the forward's indices --------------------------------------

max_pool_with_indices_grad = opforge.op(
    f"max_pool_with_indices_grad(Tensor dy, Tensor indices, Tensor x, *, {MAX_ATTRS}) -> Tensor dx",
    traits=["no_side_effect"],
    doc="Gradient of max_pool_with_indices: zeros like x, with each dy added at the offset indices gives "
        "(max_pool_with_indices's; -1 adds nothing).  x lends its shape; no maximum is looked for again.")
check_dy_and_x = gradient_check("max_pool_with_indices", max_pool_check, max_pool_infer)


@max_pool_with_indices_grad.check
def max_pool_with_indices_grad_check(dy: TensorSpec, indices: TensorSpec, x: TensorSpec, **attrs: Any) -> str | None:
    if indices.dtype != "int64":
        raise opforge.DTypeError(f"op 'max_pool_with_indices_grad': input 'indices' has dtype {indices.dtype}; "
                                 "expected int64 (max_pool_with_indices's indices)")
    if dy.rank is not None and indices.rank is not None and not shapes_agree(dy.shape, indices.shape):
        return f"input 'indices' has shape {list(indices.shape)}; it must be dy's, {list(dy.shape)}"
    return check_dy_and_x(dy, x, **attrs)


@max_pool_with_indices_grad.infer
def max_pool_with_indices_grad_infer(dy: TensorSpec, indices: TensorSpec, x: TensorSpec, **attrs: Any) -> TensorSpec:
    return shaped_like_x(dy, x)


@max_pool_with_indices_grad.reference(fallback=True)
def max_pool_with_indices_grad_reference(dy: npt.NDArray[Any], indices: npt.NDArray[np.int64], x: npt.NDArray[Any],
                                         *, storage_order: int, **attrs: Any) -> npt.NDArray[Any]:
    planes, size = x.shape[0] * x.shape[1], int(np.prod(x.shape[2:]))
    if planes == 0:
        return np.zeros(x.shape, dy.dtype)
    at = indices.reshape(planes, -1) - np.arange(planes, dtype=np.int64)[:, None] * size
    taken = indices.reshape(planes, -1) != -1
    if np.any(taken & ((at < 0) | (at >= size))):
        raise opforge.ShapeError("op 'max_pool_with_indices_grad': input 'indices' holds an offset outside its "
                                 f"own (sample, channel) plane of x {list(x.shape)}")
    if storage_order == 1 and x.ndim > 2:  # back to row-major positions
        at = np.where(taken, np.ravel_multi_index(np.unravel_index(np.where(taken, at, 0), x.shape[2:], order="F"),
                                                  x.shape[2:]), -1)
    dx = np.zeros((planes, size), dy.dtype)
    dy = dy.reshape(planes, -1)
    for plane in range(planes):
        np.add.at(dx[plane], at[plane][taken[plane]], dy[plane][taken[plane]])
    return dx.reshape(x.shape)


@max_pool_with_indices.grad(save=["x", "indices"])
def max_pool_with_indices_grad_rule(saved: Any, dy: Any, dindices: Any, **attrs: Any) -> Any:
    return opforge.ops.max_pool_with_indices_grad(dy, saved.indices, saved.x, **attrs)


pool_kernels(max_pool_with_indices_grad, "MaxPoolIndicesGrad", [(d, "int64", d) for d in FLOATS])
