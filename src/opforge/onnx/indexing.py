"""Converters of ONNX's element indexing and layout ops: GatherElements,
ScatterElements (and Scatter, its older name), ScatterND, GatherND, Einsum,
DepthToSpace, SpaceToDepth, OneHot.

GatherElements, ScatterElements, ScatterND and GatherND map onto built-ins
of their own (their kernels check every index); Einsum, DepthToSpace,
SpaceToDepth and OneHot compose existing ops, from an equation, a block size
or a depth known when the model loads.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import opforge
from .registry import converter

if TYPE_CHECKING:
    from .registry import NodeContext

# Tensors here are traced Values, or np.ndarrays known when the model loads: typed Any.
ops = opforge.ops


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- GatherElements, ScatterElements, Scatter ----------------------------------------------

@converter("GatherElements", since=11)
def gather_elements(node: NodeContext, data: Any, indices: Any) -> Any:
    return ops.gather_elements(data, indices, axis=node.attr("axis", 0))


@converter("ScatterElements", since=11)
def scatter_elements(node: NodeContext, data: Any, indices: Any, updates: Any) -> Any:
    # reduction: add and mul from opset 16, max and min from 18; the op's check names a wrong one
    return ops.scatter_elements(data, indices, updates, axis=node.attr("axis", 0),
                                reduction=text(node.attr("reduction", "none")))


converter("Scatter", since=9)(scatter_elements)  # ScatterElements before opset 11 (no reduction)


# -- GatherND, ScatterND -------------------------------------------------------------------

@converter("GatherND", since=11)
def gather_nd(node: NodeContext, data: Any, indices: Any) -> Any:
    return ops.gather_nd(data, indices, batch_dims=node.attr("batch_dims", 0))  # batch_dims from opset 12


@converter("ScatterND", since=11)
def scatter_nd(node: NodeContext, data: Any, indices: Any, updates: Any) -> Any:
    return ops.scatter_nd(data, indices, updates, reduction=text(node.attr("reduction", "none")))
