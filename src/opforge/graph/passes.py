"""Graph passes: inference, dead-code elimination, constant folding, folding
batch_norm (and a per-channel mul / add) into convolutions, layout selection and memory planning.  Each
takes a Graph and changes it in place (or, for inference and planning,
returns what it found)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeGuard, cast

import numpy as np

from ..errors import DTypeError, NoKernelError, ShapeError
from ..runtime.dispatch import launcher_for, select_kernel
from ..spec import TensorSpec
from .ir import Node, Value, constant_node

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..operator import Kernel, Op
    from .ir import Graph

    class _Constant(Value):
        """A value made by a constant node (for the type checker: its producer is a Node)."""

        producer: Node


def infer_shapes(graph: Graph, input_specs: Sequence[TensorSpec] | None = None) -> dict[int, TensorSpec]:
    """Whole-graph inference.  With ``input_specs`` (e.g. concrete shapes for
    inputs declared with -1 dims), returns {value id: spec} for every value
    without changing the graph; otherwise re-infers the graph's own specs."""
    specs: dict[int, TensorSpec] = {}
    given = input_specs or [v.spec for v in graph.inputs]
    for value, spec in zip(graph.inputs, given):
        if spec.dtype != value.spec.dtype:
            raise DTypeError(f"graph '{graph.name}': input %{value.name} is declared {value.spec}, got {spec}")
        if spec.rank is not None and not value.spec.matches(spec.shape):
            raise ShapeError(f"graph '{graph.name}': input %{value.name} is declared {value.spec}, got {spec}")
        specs[value.id] = spec
    for node in graph.nodes:
        if node.is_constant:
            specs[node.outputs[0].id] = node.outputs[0].spec
            continue
        out = node.op.infer_specs([None if v is None else specs[v.id] for v in node.inputs], node.attrs)
        for value, spec in zip(node.outputs, out):
            # Shapes and dtypes come from inference; layouts are the graph's (the layout pass decides them).
            specs[value.id] = TensorSpec(spec.shape, spec.dtype, value.spec.layout)
    if input_specs is None:
        for node in graph.nodes:
            for value in node.outputs:
                value.spec = specs[value.id]
    return specs


def eliminate_dead_code(graph: Graph) -> int:
    """Drop nodes whose outputs nothing uses.  Ops without the trait
    ``no_side_effect`` are kept: opforge cannot know they are pure."""
    live = {v.id for v in graph.outputs}
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        needed = any(v.id in live for v in node.outputs) or (
            not node.is_constant and "no_side_effect" not in node.op.traits)
        if needed:
            kept.append(node)
            live.update(v.id for v in node.inputs if v is not None)
    removed = len(graph.nodes) - len(kept)
    graph.nodes = list(reversed(kept))
    graph.invalidate()
    return removed


def fold_constants(graph: Graph) -> int:
    """Evaluate nodes whose inputs are all constants; replace them by constants.
    Only ops declared ``no_side_effect``, and only in the plain layout."""
    folded = 0
    replacement: dict[int, Value] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        node.inputs = [replacement.get(v.id, v) if v is not None else None for v in node.inputs]
        if (not node.is_constant and node.inputs and "no_side_effect" in node.op.traits
                and all(v.spec.layout == "ndarray" for v in node.outputs)
                and all(v is None or (v.producer is not None and v.producer.is_constant) for v in node.inputs)):
            arrays = [None if v is None else cast("_Constant", v).producer.value for v in node.inputs]
            result = launcher_for(node.op, node.attrs, len(arrays))(*arrays)
            results = result if node.op.tuple_output else (result,)
            for value, array in zip(node.outputs, results):
                constant = constant_node(array)
                constant.outputs[0].name = value.name
                replacement[value.id] = constant.outputs[0]
                nodes.append(constant)
            folded += 1
            continue
        nodes.append(node)
    graph.nodes = nodes
    graph.outputs = [replacement.get(v.id, v) for v in graph.outputs]
    eliminate_dead_code(graph)
    return folded


def _readers(graph: Graph) -> dict[int, int]:
    """{value id: how many places read it}: node inputs, and the graph's outputs."""
    readers: dict[int, int] = {}
    for node in graph.nodes:
        for v in node.inputs:
            if v is not None:
                readers[v.id] = readers.get(v.id, 0) + 1
    for v in graph.outputs:
        readers[v.id] = readers.get(v.id, 0) + 1
    return readers


def _take_output(node: Node, follower: Node) -> None:
    """``node`` now computes ``follower``'s (one) output value, so that the value's readers stay as they are."""
    result = follower.outputs[0]
    result.producer, result.index = node, 0
    node.outputs = [result]


def _drop_folded(graph: Graph, nodes: list[Node], folded: set[int]) -> None:
    """The graph's nodes become ``nodes`` less those folded away (by id); what they alone read goes too."""
    graph.nodes = [n for n in nodes if id(n) not in folded]
    eliminate_dead_code(graph)
    graph.invalidate()


def fold_batch_norm_into_conv(graph: Graph) -> int:
    """Fold each inference-form ``batch_norm`` whose input is the only use of a
    ``conv``'s output into that conv's weights and bias, when the weights,
    the bias (if any) and the four statistics are constants: per output channel
    a = scale / sqrt(var + epsilon), w' = w * a, b' = (b - mean) * a + bias,
    computed in float64 and cast back.  Returns the number of batch_norms folded."""
    readers = _readers(graph)

    def constant(value: Value | None) -> TypeGuard[_Constant]:
        return value is not None and value.producer is not None and value.producer.is_constant

    norm_of = {n.inputs[0].id: n for n in graph.nodes  # the batch_norm reading each value
               if not n.is_constant and n.op.name == "batch_norm" and len(n.inputs) == 5 and n.inputs[0] is not None}
    nodes: list[Node]
    merged: set[int]
    folded, nodes, merged = 0, [], set()  # merged: ids of the batch_norm nodes folded away
    for node in graph.nodes:
        if id(node) in merged:
            continue
        nodes.append(node)
        if node.is_constant or node.op.name != "conv" or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        bn = norm_of.get(out.id)
        w = node.inputs[1]
        b = node.inputs[2] if len(node.inputs) > 2 else None
        if (bn is None or readers.get(out.id) != 1 or not constant(w) or (b is not None and not constant(b))
                or not all(constant(v) for v in bn.inputs[1:5]) or out.spec.layout != "ndarray"
                or bn.outputs[0].spec.layout != "ndarray" or w.spec.dtype != out.spec.dtype):
            continue
        weights = np.asarray(w.producer.value)
        channels = weights.shape[0] if weights.ndim >= 1 else -1
        scale, shift, mean, var = (np.asarray(v.producer.value, np.float64)
                                   for v in cast("list[_Constant]", bn.inputs[1:5]))
        if any(p.shape != (channels,) for p in (scale, shift, mean, var)):
            continue
        # epsilon crosses to the batch_norm kernel as a float32: fold with the same value
        a = scale / np.sqrt(var + np.float64(np.float32(cast(float, bn.attrs.get("epsilon", 1e-5)))))
        old_bias = np.zeros(channels) if b is None else np.asarray(b.producer.value, np.float64)
        new_w = constant_node((weights.astype(np.float64) * a.reshape((-1,) + (1,) * (weights.ndim - 1)))
                              .astype(weights.dtype))
        new_b = constant_node(((old_bias - mean) * a + shift).astype(weights.dtype))
        nodes[-1:] = [new_w, new_b, node]
        node.inputs = [node.inputs[0], new_w.outputs[0], new_b.outputs[0]]
        _take_output(node, bn)
        merged.add(id(bn))
        folded += 1
    if folded:
        _drop_folded(graph, nodes, merged)
    return folded


def fold_relu_into_conv(graph: Graph) -> int:
    """Fold each ``relu`` whose input is the only use of a ``conv``'s output into that conv
    (``activation="relu"``: the conv clips each part of its output while it is still in cache).
    Returns the number of relus folded."""
    readers = _readers(graph)
    relu_of = {n.inputs[0].id: n for n in graph.nodes
               if not n.is_constant and n.op.name == "relu" and n.inputs and n.inputs[0] is not None}
    folded, merged = 0, set[int]()
    for node in graph.nodes:
        if node.is_constant or node.op.name != "conv" or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        relu = relu_of.get(out.id)
        if (relu is None or readers.get(out.id) != 1 or node.attrs.get("activation", "none") != "none"
                or out.spec.layout != "ndarray" or relu.outputs[0].spec.layout != "ndarray"):
            continue
        node.attrs = {**node.attrs, "activation": "relu"}
        _take_output(node, relu)
        merged.add(id(relu))
        folded += 1
    if folded:
        _drop_folded(graph, graph.nodes, merged)
    return folded


def _per_channel(value: Value, like: Value) -> npt.NDArray[np.float64] | None:
    """A constant ``value`` as one float64 number per channel of ``like`` (N x C x ...), when it
    broadcasts against ``like`` along the channels alone (shape (C, 1, ..., 1), (1, C, 1, ...), or one
    element) and has its dtype; else None."""
    if value.producer is None or not value.producer.is_constant:
        return None
    array = np.asarray(value.producer.value)
    shape, rank = like.spec.shape, like.spec.rank
    if (rank is None or rank < 2 or shape[1] == -1 or array.ndim > rank or array.dtype != np.dtype(like.spec.dtype)
            or value.spec.layout != "ndarray"):
        return None
    aligned = (1,) * (rank - array.ndim) + array.shape
    if any(d != 1 for k, d in enumerate(aligned) if k != 1) or aligned[1] not in (1, shape[1]):
        return None
    return np.broadcast_to(array.astype(np.float64).reshape(-1), (shape[1],))


def fold_scale_and_shift(graph: Graph) -> int:
    """Fold a ``mul`` by, or an ``add`` of, a per-channel constant into the ``conv`` or inference-form
    ``batch_norm`` before it -- the Mul and Add a batch normalization becomes in some exported models --
    when the conv's or batch_norm's output is the mul's or add's only use and its parameters are
    constants: a conv's w' = w * s per output channel and b' = b * s, or b' = b + t; a batch_norm's
    scale' = scale * s and shift' = shift * s, or shift' = shift + t.  Computed in float64, cast back.
    Runs until nothing is left to fold; returns how many muls and adds went."""
    total = 0
    while True:
        folded = _fold_scale_and_shift_once(graph)
        if not folded:
            return total
        total += folded


def _fold_scale_and_shift_once(graph: Graph) -> int:
    readers = _readers(graph)
    user_of: dict[int, Node] = {}  # value id -> the mul or add reading it
    for n in graph.nodes:
        if not n.is_constant and n.op.name in ("mul", "add") and len(n.inputs) == 2:
            for v in n.inputs:
                if v is not None:
                    user_of[v.id] = n

    def constant(value: Value | None) -> TypeGuard[_Constant]:
        return value is not None and value.producer is not None and value.producer.is_constant

    folded: set[int] = set()
    nodes: list[Node] = []
    for node in graph.nodes:
        if id(node) in folded:
            continue
        nodes.append(node)
        if node.is_constant or node.op.name not in ("conv", "batch_norm") or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        user = user_of.get(out.id)
        if user is None or readers.get(out.id) != 1 or out.spec.layout != "ndarray" or id(user) in folded:
            continue
        other = user.inputs[1] if user.inputs[0] is out else user.inputs[0]
        factor = None if other is None else _per_channel(other, out)
        if factor is None or user.outputs[0].spec.shape != out.spec.shape:
            continue
        is_mul = user.op.name == "mul"
        if node.op.name == "conv":
            w = node.inputs[1]
            b = node.inputs[2] if len(node.inputs) > 2 else None
            if not constant(w) or (b is not None and not constant(b)):
                continue
            weights = np.asarray(w.producer.value)
            if weights.ndim < 1 or weights.shape[0] != factor.shape[0]:
                continue
            bias = np.zeros(weights.shape[0]) if b is None else np.asarray(b.producer.value, np.float64)
            if is_mul:
                weights = (weights.astype(np.float64) * factor.reshape((-1,) + (1,) * (weights.ndim - 1))
                           ).astype(weights.dtype)
            new_w = constant_node(weights) if is_mul else w.producer
            new_b = constant_node((bias * factor if is_mul else bias + factor).astype(weights.dtype))
            nodes[-1:] = ([new_w] if is_mul else []) + [new_b, node]
            node.inputs = [node.inputs[0], new_w.outputs[0], new_b.outputs[0]]
        else:  # batch_norm: x, scale, shift, mean, var
            if len(node.inputs) != 5 or not all(constant(v) for v in node.inputs[1:5]):
                continue
            scale_value, shift_value = cast("list[_Constant]", node.inputs[1:3])
            scale, shift = np.asarray(scale_value.producer.value), np.asarray(shift_value.producer.value)
            if scale.shape != factor.shape or shift.shape != factor.shape:
                continue
            dtype = scale.dtype
            new_scale = constant_node((scale * factor).astype(dtype)) if is_mul else scale_value.producer
            new_shift = constant_node((shift * factor if is_mul else shift + factor).astype(dtype))
            nodes[-1:] = ([new_scale] if is_mul else []) + [new_shift, node]
            node.inputs = [node.inputs[0], new_scale.outputs[0], new_shift.outputs[0], *node.inputs[3:]]
        _take_output(node, user)
        folded.add(id(user))
    if folded:
        _drop_folded(graph, nodes, folded)
    return len(folded)


# -- layouts ------------------------------------------------------------------

def _kernels_by_layout(node: Node) -> dict[str, Kernel]:
    found = {}
    for layout in sorted({k.layout for k in node.op.kernels} - {"any"}):
        candidates = [k for k in node.op.kernels if k.layout == layout]
        specs = [None if v is None else TensorSpec(v.spec.shape, v.spec.dtype, layout) for v in node.inputs]
        try:
            found[layout] = select_kernel(node.op, specs, kernels=candidates)
        except (NoKernelError, DTypeError):
            continue
    return found


def select_layouts(graph: Graph, prefer: str | None = None, reorder_op: Op | None = None) -> int:
    """Choose a data layout per node and insert reorder nodes where a producer
    and its consumer disagree (PPLNN's approach).

    A node runs in a blocked layout (``nchw16c``) when it has a kernel for it
    and its tensor inputs already arrive blocked, or when blocked is its only
    layout, or ``prefer`` names it; otherwise it runs in ``ndarray``.  Graph
    inputs and outputs are ``ndarray``.  Returns the number of reorders
    inserted."""
    from ..registry import lookup

    reorder = cast("Op", reorder_op or lookup("reorder"))  # a built-in op: registered
    layout_of = {v.id: "ndarray" for v in graph.inputs}
    nodes: list[Node]
    converted: dict[tuple[int, str], Value]
    nodes, inserted, converted = [], 0, {}

    def convert(value: Value, layout: str) -> Value:
        nonlocal inserted
        key = (value.id, layout)
        if key not in converted:
            spec = TensorSpec(value.spec.shape, value.spec.dtype, layout)
            node = Node(reorder, [value], reorder.resolve_attrs({"layout": layout}), [spec])
            node.kernel = select_kernel(reorder, [value.spec])
            nodes.append(node)
            layout_of[node.outputs[0].id] = layout
            converted[key] = node.outputs[0]
            inserted += 1
        return converted[key]

    for node in graph.nodes:
        if node.is_constant or node.op is reorder:
            nodes.append(node)
            for v in node.outputs:
                layout_of[v.id] = v.spec.layout
            continue
        kernels = _kernels_by_layout(node)
        if "ndarray" in kernels and len(kernels) == 1 or not kernels:
            node.inputs = [v if v is None or layout_of[v.id] == "ndarray" else convert(v, "ndarray")
                           for v in node.inputs]
            nodes.append(node)
            for v in node.outputs:
                layout_of[v.id] = "ndarray"
            continue
        incoming = {layout_of[v.id] for v in node.inputs if v is not None}
        # Blocked kernels are elementwise over the padded buffer: 4-d tensors of the output's shape.
        blocked = [l for l in kernels if l != "ndarray" and all(
            v is None or (len(v.spec.shape) == 4 and v.spec.shape == node.outputs[0].spec.shape)
            for v in node.inputs)]
        if blocked and ("ndarray" not in kernels or incoming == {blocked[0]} or prefer == blocked[0]):
            layout = blocked[0]
        else:
            layout = "ndarray"
        if layout not in kernels:
            raise NoKernelError(f"op '{node.op.name}' has kernels only for layouts {sorted(kernels)}, which its "
                                f"inputs {[v.spec for v in node.inputs if v is not None]} do not fit")
        node.inputs = [v if v is None or layout_of[v.id] == layout else convert(v, layout) for v in node.inputs]
        node.kernel = kernels[layout]
        for v in node.outputs:
            layout_of[v.id] = layout
            v.spec = TensorSpec(v.spec.shape, v.spec.dtype, layout)
        nodes.append(node)
    graph.nodes = nodes
    graph.outputs = [v if layout_of[v.id] == "ndarray" else convert(v, "ndarray") for v in graph.outputs]
    graph.invalidate()
    return inserted


# -- memory --------------------------------------------------------------------

ALIGN = 64


def plan_memory(sizes: Sequence[int], lifetimes: Sequence[tuple[int, int]]) -> tuple[list[int], int]:
    """Offsets for buffers in one arena, reusing space of buffers whose
    lifetimes (first, last step) don't overlap.  Greedy by size, first fit.
    Returns (offsets, arena bytes)."""
    order = sorted(range(len(sizes)), key=lambda k: -sizes[k])
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    offsets = [0] * len(sizes)
    for k in order:
        size = -(-sizes[k] // ALIGN) * ALIGN
        first, last = lifetimes[k]
        busy = sorted((o, s) for o, s, f, l in placed if not (l < first or f > last))
        offset = 0
        for o, s in busy:
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        offsets[k] = offset
        placed.append((offset, size, first, last))
    arena = max((o + s for o, s, _, _ in placed), default=0)
    return offsets, arena
