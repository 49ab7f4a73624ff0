"""Converters of ONNX's pooling, normalization, padding and resizing ops:
MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, LpPool, BatchNormalization,
LRN, LayerNormalization, Pad, Resize, Upsample, GlobalLpPool, InstanceNormalization,
GroupNormalization, CenterCropPad.

Pooling: ``auto_pad`` (SAME_UPPER, SAME_LOWER, VALID) becomes explicit pads
here, so the spatial dims of the input must be known when the model loads
for SAME_*; the attributes each opset added (storage_order 8, ceil_mode and
dilations 10 -- 19 for AveragePool --, count_include_pad 7) take their
defaults in older models.  MaxPool's optional Indices output uses
``max_pool_with_indices``.  GlobalMaxPool is max_pool with one window
covering the (known) spatial dims.

BatchNormalization runs with the given statistics; training mode
(``training_mode=1`` from opset 14, or the extra outputs of opsets before 9
with ``is_test=0``) computes the batch statistics with ops and returns the
updated running mean and variance.  ``spatial=0`` (per-element statistics,
opsets before 9) is refused.

Pad takes its pads (and from opset 18 its axes) from attributes, then from
inputs that must be known when the model loads; a ``constant_value`` known
only at run time is added where the padding is.  LayerNormalization's
Mean and InvStdDev have the stash type (float32).  Resize and Upsample: the
scales, sizes and roi inputs must be known when the model loads (they
decide the output's shape); opset 10 Resize and Upsample use asymmetric
coordinates, nearest rounding down (up when shrinking).  align_corners with
scales divides by the unrounded output length (``in * scale - 1``), as
onnx's test cases do; onnxruntime divides by the rounded one.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from ..builtins.common import zeros_like
from ..builtins.max_pool import pooled_dim
from ..spec import UNKNOWN_RANK
from .elementwise import dims_of, dtype_of
from .registry import converter
from .shape import ints, rank_of

if TYPE_CHECKING:
    from .registry import NodeContext

ops = opforge.ops


# -- pooling ------------------------------------------------------------------------------

def explicit_pads(node: NodeContext, x: Any, kernel_shape: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int]) -> list[int]:
    """The node's pads, with auto_pad resolved (SAME_* needs x's spatial dims)."""
    spatial = len(kernel_shape)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", ""):
        return list(node.attr("pads", [])) or [0] * (2 * spatial)
    if auto_pad == "VALID":
        return [0] * (2 * spatial)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise node.error(f"attribute 'auto_pad' is {auto_pad!r}; supported: NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    dims = dims_of(x)
    if dims == UNKNOWN_RANK or len(dims) != spatial + 2 or -1 in dims[2:]:
        raise node.unknown(f"auto_pad {auto_pad} needs the spatial dims of input 'X' known when the model is "
                         f"loaded; they are {'unknown' if dims == UNKNOWN_RANK else list(dims[2:])}")
    totals = [max(0, (-(-n // s) - 1) * s + (k - 1) * d + 1 - n)
              for n, k, s, d in zip(dims[2:], kernel_shape, strides, dilations)]
    return split_pads(totals, auto_pad)


def split_pads(totals: Sequence[int], auto_pad: str) -> list[int]:
    """Each axis's total padding as ONNX pads (begins, then ends): the odd one at the end for SAME_UPPER, at the
    beginning otherwise."""
    begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
    return begin + [t - b for t, b in zip(totals, begin)]


def window_attrs(node: NodeContext, x: Any) -> dict[str, Any]:
    """kernel_shape, strides, pads, dilations, ceil_mode of a pooling node."""
    kernel_shape = list(node.attr("kernel_shape", []))
    if not kernel_shape:
        raise node.error("attribute 'kernel_shape' is missing")
    spatial = len(kernel_shape)
    strides = list(node.attr("strides", [])) or [1] * spatial
    dilations = list(node.attr("dilations", [])) or [1] * spatial
    pads = explicit_pads(node, x, kernel_shape, strides, dilations)
    return dict(kernel_shape=kernel_shape, strides=strides, pads=pads, dilations=dilations,
                ceil_mode=bool(node.attr("ceil_mode", 0)))


@converter("MaxPool", since=1)
def max_pool(node: NodeContext, x: Any) -> Any:
    attrs = window_attrs(node, x)
    storage_order = node.attr("storage_order", 0)
    if node.num_outputs > 1:
        return ops.max_pool_with_indices(x, storage_order=storage_order, **attrs)
    return ops.max_pool(x, storage_order=storage_order, **attrs)


@converter("AveragePool", since=1)
def average_pool(node: NodeContext, x: Any) -> Any:
    return ops.average_pool(x, count_include_pad=bool(node.attr("count_include_pad", 0)), **window_attrs(node, x))


@converter("GlobalAveragePool", since=1)
def global_average_pool(node: NodeContext, x: Any) -> Any:
    return ops.global_average_pool(x)


@converter("GlobalMaxPool", since=1)
def global_max_pool(node: NodeContext, x: Any) -> Any:
    dims = node.static_shape(x, "input 'X'")
    if len(dims) < 3:
        raise node.error(f"input 'X' has shape {list(dims)}; GlobalMaxPool needs N x C x spatial dims")
    return ops.max_pool(x, kernel_shape=list(dims[2:]))


@converter("LpPool", since=2)
def lp_pool(node: NodeContext, x: Any) -> Any:
    """(sum over each window of |x|^p)^(1/p): |x|^p zero-padded (the end widened so that ceil_mode's last
    windows fit), average_pool with every window inside, times the window's size."""
    attrs = window_attrs(node, x)
    p = node.attr("p", 2)
    dtype = dtype_of(x)
    spatial = len(attrs["kernel_shape"])
    pads = list(attrs.pop("pads"))
    if attrs.pop("ceil_mode"):
        dims = node.static_shape(x, "input 'X'")[2:]
        for j, n in enumerate(dims):
            k, s, d = attrs["kernel_shape"][j], attrs["strides"][j], attrs["dilations"][j]
            out = pooled_dim(n, k, s, pads[j], pads[spatial + j], d, True)
            pads[spatial + j] = max(pads[spatial + j], (out - 1) * s + (k - 1) * d + 1 - n - pads[j])
    powered = ops.pow(ops.abs(x), np.asarray(p, dtype))
    padded_x = ops.pad(powered, pads=[0, 0] + pads[:spatial] + [0, 0] + pads[spatial:])
    total = ops.mul(ops.average_pool(padded_x, **attrs), np.asarray(np.prod(attrs["kernel_shape"]), dtype))
    return ops.pow(total, np.asarray(1.0 / p, dtype))


# -- BatchNormalization -------------------------------------------------------------------

def batch_statistics(node: NodeContext, x: Any, mean: Any, var: Any, momentum: float) -> tuple[Any, Any, Any, Any]:
    """Training mode: y normalised by the batch's mean and (population) variance, and the running
    statistics moved toward them."""
    dims = dims_of(x)
    if dims == UNKNOWN_RANK:
        raise node.unknown("training mode needs the rank of input 'X' known when the model is loaded")
    axes = [0] + list(range(2, len(dims)))
    batch_mean = ops.mean(x, axes=axes)
    centred = ops.sub(x, ops.reshape(batch_mean, shape=[1, -1] + [1] * (len(dims) - 2)))
    batch_var = ops.mean(ops.mul(centred, centred), axes=axes)
    m = np.asarray(momentum, dtype_of(mean))
    one_minus = np.asarray(1 - momentum, dtype_of(mean))
    running_mean = ops.add(ops.mul(mean, m), ops.mul(batch_mean, one_minus))
    running_var = ops.add(ops.mul(var, m), ops.mul(batch_var, one_minus))
    return batch_mean, batch_var, running_mean, running_var


def batch_norm(node: NodeContext, x: Any, scale: Any, bias: Any, mean: Any, var: Any, training: bool) -> Any:
    if node.attr("spatial", 1) == 0:
        raise node.error("attribute 'spatial' is 0 (statistics per element); opforge supports spatial=1")
    epsilon = node.attr("epsilon", 1e-5)
    dtype = dtype_of(x)
    params = [p if dtype_of(p) == dtype else ops.cast(p, dtype=dtype) for p in (scale, bias, mean, var)]
    if not training:
        y = ops.batch_norm(x, *params, epsilon=epsilon)
        return y if node.num_outputs == 1 else (y,) + (None,) * (node.num_outputs - 1)
    batch_mean, batch_var, running_mean, running_var = batch_statistics(node, x, params[2], params[3],
                                                                        node.attr("momentum", 0.9))
    y = ops.batch_norm(x, params[0], params[1], batch_mean, batch_var, epsilon=epsilon)
    if node.opset >= 14:
        return (y, running_mean, running_var)[:max(node.num_outputs, 1)]
    # opsets 6-13: Y, running mean and var, saved mean and (the inverse square root of) saved var
    saved_var = ops.div(np.ones((), dtype), ops.sqrt(ops.add(batch_var, np.asarray(epsilon, dtype))))
    return (y, running_mean, running_var, batch_mean, saved_var)[:max(node.num_outputs, 1)]


@converter("BatchNormalization", since=1)
def batch_normalization_v1(node: NodeContext, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    return batch_norm(node, x, scale, bias, mean, var, training=node.num_outputs > 1 and not node.attr("is_test", 0))


@converter("BatchNormalization", since=7)
def batch_normalization_v7(node: NodeContext, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    # no is_test: extra outputs mean training
    return batch_norm(node, x, scale, bias, mean, var, training=node.num_outputs > 1)


@converter("BatchNormalization", since=14)
def batch_normalization_v14(node: NodeContext, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    return batch_norm(node, x, scale, bias, mean, var, training=bool(node.attr("training_mode", 0)))


# -- LRN ----------------------------------------------------------------------------------

@converter("LRN", since=1)
def lrn(node: NodeContext, x: Any) -> Any:
    size = node.attr("size")
    if size is None:
        raise node.error("attribute 'size' is missing")
    return ops.lrn(x, size=size, alpha=node.attr("alpha", 1e-4), beta=node.attr("beta", 0.75),
                   bias=node.attr("bias", 1.0))


# -- Pad ----------------------------------------------------------------------------------

def padded(node: NodeContext, x: Any, pads: Iterable[int], mode: str, value: float,
           axes: Iterable[int] | None = None) -> Any:
    """ops.pad with ONNX's pads (for ``axes``, default all) spread over every axis of x."""
    rank = rank_of(node, x)
    pads = [int(p) for p in pads]
    axes = list(range(rank)) if axes is None else [int(a) % max(rank, 1) for a in axes]
    if len(pads) != 2 * len(axes):
        raise node.error(f"'pads' has {len(pads)} entries; {len(axes)} axes need {2 * len(axes)}")
    full = [0] * (2 * rank)
    for k, axis in enumerate(axes):
        full[axis], full[rank + axis] = pads[k], pads[len(axes) + k]
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise node.error(f"attribute 'mode' is {mode!r}; supported: constant, reflect, edge, wrap")
    return ops.pad(x, pads=full, mode=mode, value=float(value))


@converter("Pad", since=1)
def pad_v1(node: NodeContext, x: Any) -> Any:
    return padded(node, x, node.attr("paddings", []), node.attr("mode", "constant"), node.attr("value", 0.0))


@converter("Pad", since=2)
def pad_v2(node: NodeContext, x: Any) -> Any:
    return padded(node, x, node.attr("pads", []), node.attr("mode", "constant"), node.attr("value", 0.0))


@converter("Pad", since=11)
def pad_v11(node: NodeContext, x: Any, pads: Any, constant_value: Any = None, axes: Any = None) -> Any:
    pads = ints(node, pads, "input 'pads'")
    if axes is not None:
        axes = ints(node, axes, "input 'axes'")
    mode = node.attr("mode", "constant")
    if constant_value is None or isinstance(constant_value, np.ndarray):
        value = 0.0 if constant_value is None or not np.size(constant_value) else constant_value.reshape(-1)[0]
        return padded(node, x, pads, mode, value, axes)
    # a constant known only at run time: zeros padded, plus the value where the padding is
    if mode != "constant":
        return padded(node, x, pads, mode, 0.0, axes)
    dtype = dtype_of(x)
    inside = padded(node, ops.add(zeros_like(x, dtype), np.ones((), dtype)), pads, mode, 0.0, axes)
    outside = ops.sub(np.ones((), dtype), inside)
    value = ops.reshape(constant_value, shape=[])
    return ops.add(padded(node, x, pads, mode, 0.0, axes), ops.mul(outside, value))


# -- LayerNormalization -------------------------------------------------------------------

@converter("LayerNormalization", since=17)
def layer_normalization(node: NodeContext, x: Any, scale: Any, bias: Any = None) -> Any:
    y, mean, inv_std_dev = ops.layer_norm(x, scale, bias, axis=node.attr("axis", -1),
                                          epsilon=node.attr("epsilon", 1e-5))
    if node.num_outputs <= 1:
        return y
    if node.attr("stash_type", 1) == 1 and dtype_of(x) != "float32":  # the statistics' type U is float32
        mean, inv_std_dev = ops.cast(mean, dtype="float32"), ops.cast(inv_std_dev, dtype="float32")
    return (y, mean, inv_std_dev)[:node.num_outputs]


# -- Resize, Upsample ---------------------------------------------------------------------

def floats(node: NodeContext, value: Any, what: str) -> list[float]:
    return [] if value is None else [float(v) for v in np.asarray(node.constant(value, what)).reshape(-1)]


def resized(node: NodeContext, x: Any, scales: list[float], sizes: list[int], roi: list[float], **attrs: Any) -> Any:
    if scales and sizes:
        raise node.error("inputs 'scales' and 'sizes' are both given; give one")
    if not scales and not sizes:
        raise node.error("neither input 'scales' nor 'sizes' is given")
    return ops.resize(x, scales=scales, sizes=sizes, roi=roi, **attrs)


def resize_attrs(node: NodeContext) -> dict[str, Any]:
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise node.error(f"attribute 'mode' is {mode!r}; supported: nearest, linear, cubic")
    return dict(mode=mode,
                coordinate_transformation_mode=node.attr("coordinate_transformation_mode", "half_pixel"),
                nearest_mode=node.attr("nearest_mode", "round_prefer_floor"),
                cubic_coeff_a=float(node.attr("cubic_coeff_a", -0.75)),
                exclude_outside=bool(node.attr("exclude_outside", 0)),
                extrapolation_value=float(node.attr("extrapolation_value", 0.0)),
                antialias=bool(node.attr("antialias", 0)),
                axes=list(node.attr("axes", [])),
                keep_aspect_ratio_policy=node.attr("keep_aspect_ratio_policy", "stretch"))


def upsample_like(node: NodeContext, x: Any, scales: Sequence[float]) -> Any:
    """Opset 10 Resize and Upsample: asymmetric coordinates; nearest rounds down (up when shrinking)."""
    mode = node.attr("mode", "nearest")
    if mode in ("bilinear", "linear"):
        mode = "linear"
    elif mode != "nearest":
        raise node.error(f"attribute 'mode' is {mode!r}; supported: nearest, linear")
    return ops.resize(x, scales=scales, mode=mode, coordinate_transformation_mode="asymmetric",
                      nearest_mode="ceil" if any(s < 1 for s in scales) else "floor")


@converter("Upsample", since=7)
def upsample_v7(node: NodeContext, x: Any) -> Any:
    return upsample_like(node, x, [float(s) for s in node.attr("scales", [])])


@converter("Upsample", since=9)
def upsample_v9(node: NodeContext, x: Any, scales: Any) -> Any:
    return upsample_like(node, x, floats(node, scales, "input 'scales'"))


@converter("Resize", since=10)
def resize_v10(node: NodeContext, x: Any, scales: Any) -> Any:
    return upsample_like(node, x, floats(node, scales, "input 'scales'"))


@converter("Resize", since=11)
def resize_v11(node: NodeContext, x: Any, roi: Any = None, scales: Any = None, sizes: Any = None) -> Any:
    attrs = resize_attrs(node)
    roi = floats(node, roi, "input 'roi'") if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize" else []
    sizes = [] if sizes is None else ints(node, sizes, "input 'sizes'")
    return resized(node, x, floats(node, scales, "input 'scales'"), sizes, roi, **attrs)


# -- GlobalLpPool, InstanceNormalization, GroupNormalization --------------------------------

def spatial_axes(node: NodeContext, x: Any, what: str = "input 'X'") -> list[int]:
    dims = dims_of(x)
    if dims == UNKNOWN_RANK or len(dims) < 2:
        raise node.unknown(f"{what} must have a known rank >= 2 (N x C x ...) when the model is loaded")
    return list(range(2, len(dims)))


@converter("GlobalLpPool", since=2)
def global_lp_pool(node: NodeContext, x: Any) -> Any:
    p, dtype = node.attr("p", 2), dtype_of(x)
    total = ops.reduce_sum(ops.pow(ops.abs(x), np.asarray(p, dtype)), axes=spatial_axes(node, x), keep_dims=True)
    return ops.pow(total, np.asarray(1.0 / p, dtype))


def per_channel(v: Any, rank: int) -> Any:
    return ops.reshape(v, shape=[-1] + [1] * (rank - 2))


@converter("InstanceNormalization", since=1)
def instance_normalization(node: NodeContext, x: Any, scale: Any, bias: Any) -> Any:
    """layer_norm over each (n, c) plane (the spatial dims), then the per-channel scale and bias."""
    axes = spatial_axes(node, x)
    dtype = dtype_of(x)
    if not axes:  # N x C: each plane is one element, normalised to 0
        return ops.add(ops.mul(x, np.zeros((), dtype)), bias)
    one = np.ones((1,) * len(axes), dtype)
    y, _, _ = ops.layer_norm(x, one, np.zeros_like(one), axis=2, epsilon=node.attr("epsilon", 1e-5))
    return ops.add(ops.mul(y, per_channel(scale, len(axes) + 2)), per_channel(bias, len(axes) + 2))


@converter("GroupNormalization", since=18)
def group_normalization(node: NodeContext, x: Any, scale: Any, bias: Any) -> Any:
    """x as N x groups x (C / groups * spatial), layer_norm over the last dim, then the scale and bias: per
    group before opset 21, per channel from 21."""
    dims = node.static_shape(x, "input 'X'")
    groups = node.attr("num_groups")
    if groups is None or len(dims) < 2 or dims[1] % groups:
        raise node.error(f"attribute 'num_groups' ({groups}) must divide the channels of input 'X' {list(dims)}")
    dtype = dtype_of(x)
    one = np.ones(1, dtype)
    grouped = ops.reshape(x, shape=[dims[0], groups, -1])
    y, _, _ = ops.layer_norm(grouped, one, np.zeros_like(one), axis=2, epsilon=node.attr("epsilon", 1e-5))
    y = ops.reshape(y, shape=list(dims))
    if node.opset < 21:  # scale and bias per group: repeated over the group's channels
        def per_channel_of(v: Any) -> Any:
            return ops.reshape(ops.expand(ops.reshape(v, shape=[groups, 1]), shape=[groups, dims[1] // groups]),
                               shape=[-1])

        scale, bias = per_channel_of(scale), per_channel_of(bias)
    return ops.add(ops.mul(y, per_channel(scale, len(dims))), per_channel(bias, len(dims)))


@converter("CenterCropPad", since=18)
def center_crop_pad(node: NodeContext, x: Any, shape: Any) -> Any:
    """pad with negative pads where the target is smaller: centred, the odd element at the end."""
    dims = node.static_shape(x, "input 'input_data'")
    target = ints(node, shape, "input 'shape'")
    axes = [a % len(dims) for a in node.attr("axes", range(len(dims)))]
    if len(axes) != len(target):
        raise node.error(f"input 'shape' has {len(target)} entries for {len(axes)} axes")
    begin, end = [0] * len(dims), [0] * len(dims)
    for axis, size in zip(axes, target):
        change = size - dims[axis]
        begin[axis] = change // 2 if change >= 0 else -(-change // 2)
        end[axis] = change - begin[axis]
    return ops.pad(x, pads=begin + end)
