"""Converters of ONNX's linear ops: MatMul, Gemm, Conv, ConvTranspose.

MatMul (every opset: only its types changed) follows NumPy: a 1-D operand
becomes a matrix (a row for A, a column for B) and loses that dim again in
the result, and the operand of lower rank gains leading dims of 1, which
opforge's matmul broadcasts; the ranks must be known when the model loads.
Gemm: C is optional from opset 11; the ``broadcast`` attribute of opsets
before 7 is accepted either way (opforge's gemm always broadcasts C).
Conv and ConvTranspose: ``auto_pad`` becomes explicit pads (SAME_* needs the
input's spatial dims), as does ConvTranspose's ``output_shape``: a total
padding split as the ONNX spec says, and output rows beyond the natural
size given as ``output_padding``.  An absent bias becomes zeros when the
weights' output channels are known, so the node keeps its native kernel.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

import opforge
from ..spec import UNKNOWN_RANK
from .elementwise import dims_of, dtype_of
from .nn import explicit_pads, split_pads
from .registry import converter

if TYPE_CHECKING:
    from .registry import NodeContext

ops = opforge.ops


@converter("MatMul", since=1)
def matmul(node: NodeContext, a: Any, b: Any) -> Any:
    known = [len(d) if d != UNKNOWN_RANK else None for d in (dims_of(a), dims_of(b))]
    if None in known:
        raise node.unknown("MatMul needs the ranks of both inputs known when the model is loaded")
    ranks = cast("list[int]", known)  # both known: checked above
    if 0 in ranks:
        raise node.error(f"MatMul of a 0-d input (input ranks {ranks}); it needs rank >= 1")
    squeeze = []
    if ranks[0] == 1:
        a, ranks[0] = ops.unsqueeze(a, axes=[0]), 2
        squeeze.append(-2)
    if ranks[1] == 1:
        b, ranks[1] = ops.unsqueeze(b, axes=[1]), 2
        squeeze.append(-1)
    rank = max(ranks)
    if ranks[0] < rank:
        a = ops.unsqueeze(a, axes=list(range(rank - ranks[0])))
    if ranks[1] < rank:
        b = ops.unsqueeze(b, axes=list(range(rank - ranks[1])))
    y = ops.matmul(a, b)
    return ops.squeeze(y, axes=[rank + axis for axis in squeeze]) if squeeze else y


@converter("Gemm", since=1)
def gemm(node: NodeContext, a: Any, b: Any, c: Any = None) -> Any:
    if c is None:  # zeros keep the native kernel (which needs every input)
        c = np.zeros((), dtype_of(a))
    return ops.gemm(a, b, c, alpha=float(node.attr("alpha", 1.0)), beta=float(node.attr("beta", 1.0)),
                    trans_a=bool(node.attr("transA", 0)), trans_b=bool(node.attr("transB", 0)))


def conv_geometry(node: NodeContext, x: Any, w: Any) -> tuple[list[int], list[int], list[int], int]:
    """kernel_shape, strides, dilations, group of a Conv or ConvTranspose node."""
    w_dims, x_dims = dims_of(w), dims_of(x)
    kernel_shape = list(node.attr("kernel_shape", []))
    if not kernel_shape:
        if w_dims != UNKNOWN_RANK:
            kernel_shape = list(w_dims[2:])
        elif x_dims != UNKNOWN_RANK:
            kernel_shape = [-1] * (len(x_dims) - 2)
        else:
            raise node.error("the ranks of X and W are unknown and the node has no 'kernel_shape'")
    if w_dims != UNKNOWN_RANK and -1 not in w_dims[2:] and list(w_dims[2:]) != kernel_shape:
        raise node.error(f"attribute 'kernel_shape' is {kernel_shape}, but W has shape {list(w_dims)}")
    spatial = len(kernel_shape)
    strides = list(node.attr("strides", [])) or [1] * spatial
    dilations = list(node.attr("dilations", [])) or [1] * spatial
    return kernel_shape, strides, dilations, int(node.attr("group", 1))


def zero_bias(b: Any, x: Any, channels: int) -> Any:
    """``b``, or zeros for an absent bias when the output channels are known."""
    return np.zeros(channels, dtype_of(x)) if b is None and channels != -1 else b


@converter("Conv", since=1)
def conv(node: NodeContext, x: Any, w: Any, b: Any = None) -> Any:
    kernel_shape, strides, dilations, group = conv_geometry(node, x, w)
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID") and -1 in kernel_shape:
        raise node.unknown("auto_pad SAME_* needs W's shape known when the model is loaded")
    pads = explicit_pads(node, x, kernel_shape, strides, dilations)
    w_dims = dims_of(w)
    b = zero_bias(b, x, -1 if w_dims == UNKNOWN_RANK else w_dims[0])
    return ops.conv(x, w, b, strides=strides, pads=pads, dilations=dilations, group=group)


@converter("ConvTranspose", since=1)
def conv_transpose(node: NodeContext, x: Any, w: Any, b: Any = None) -> Any:
    kernel_shape, strides, dilations, group = conv_geometry(node, x, w)
    spatial = len(kernel_shape)
    output_padding = list(node.attr("output_padding", [])) or [0] * spatial
    auto_pad = node.attr("auto_pad", "NOTSET")
    output_shape = list(node.attr("output_shape", []))
    pads = list(node.attr("pads", [])) or [0] * (2 * spatial)
    if auto_pad not in ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise node.error(f"attribute 'auto_pad' is {auto_pad!r}; supported: NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):  # output_shape wins over pads and auto_pad
        x_dims = dims_of(x)
        if -1 in kernel_shape or x_dims == UNKNOWN_RANK or -1 in x_dims[2:]:
            raise node.error("output_shape / auto_pad SAME_* need X's spatial dims and W's shape known when the "
                             "model is loaded")
        if len(output_shape) == spatial + 2:  # some models include N and C
            output_shape = output_shape[2:]
        if not output_shape:  # SAME: the output is the input times the stride
            output_shape = [n * s for n, s in zip(x_dims[2:], strides)]
        if len(output_shape) != spatial:
            raise node.error(f"attribute 'output_shape' is {output_shape}; it needs {spatial} spatial dims")
        totals = []
        for j in range(spatial):
            total = (strides[j] * (x_dims[2 + j] - 1) + output_padding[j] + (kernel_shape[j] - 1) * dilations[j] + 1
                     - output_shape[j])
            if total < 0:  # an output larger than the natural one: the extra rows come at the end
                output_padding[j] -= total
                total = 0
            totals.append(total)
        pads = split_pads(totals, auto_pad)
    elif auto_pad == "VALID":
        pads = [0] * (2 * spatial)
    w_dims = dims_of(w)
    b = zero_bias(b, x, -1 if w_dims == UNKNOWN_RANK or w_dims[1] == -1 else w_dims[1] * group)
    return ops.conv_transpose(x, w, b, strides=strides, pads=pads, dilations=dilations, group=group,
                              output_padding=output_padding)
