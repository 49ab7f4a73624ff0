"""Converters of ONNX's control flow: If, Loop, Scan.

A subgraph (a branch, a loop body) is converted inline, where its node
stands: ``node.run_graph(body, inputs)`` walks its nodes on the values given
(and on the names of the graphs around it), so its ops join the model's
graph.  If takes the branch its condition selects, which must then be known
while converting: a constant, a value computed from shapes (known once the
model is converted per input signature), or -- when the condition depends
on data -- the value of the call itself, the model running node by node.
Loop and Scan unroll: every iteration's body joins the graph, so the trip
count, the condition after each iteration and Scan's sequence length must be
known the same way; past ``MAX_UNROLLED`` iterations a loop runs node by node.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from .elementwise import dims_of
from .load import tracing
from .registry import converter

if TYPE_CHECKING:
    from .registry import NodeContext

# Tensors here are traced Values, or np.ndarrays known while converting: typed Any.
ops = opforge.ops

#: Most iterations a Loop or Scan unrolls into a graph; longer loops run node by node.
MAX_UNROLLED = 1024


def _known_bool(node: NodeContext, value: Any, what: str) -> bool:
    array = node.constant(value, what)
    if array is None or array.size != 1:
        raise node.error(f"{what} must hold one element, got shape {None if array is None else list(array.shape)}")
    return bool(array.reshape(-1)[0])


@converter("If", since=1)
def if_(node: NodeContext, condition: Any) -> Any:
    branch = "then_branch" if _known_bool(node, condition, "input 'cond'") else "else_branch"
    body = node.attr(branch)
    if body is None:
        raise node.error(f"attribute '{branch}' is missing")
    outputs = node.run_graph(body, [])
    if len(outputs) < node.num_outputs:
        raise node.error(f"its {branch} has {len(outputs)} output(s); the node declares {node.num_outputs}")
    return outputs


def _stacked(node: NodeContext, elements: list[Any], axis: int, what: str) -> Any:
    """The per-iteration ``elements`` stacked along a new ``axis``."""
    if not elements:
        raise node.error(f"{what} of zero iterations has no element to take its shape from; opforge needs one")
    ranks = {len(dims_of(e)) for e in elements}
    rank = ranks.pop() + 1
    position = axis + rank if axis < 0 else axis
    if ranks or not 0 <= position < rank:
        raise node.error(f"{what}: axis {axis} is out of range for stacking elements of rank {rank - 1}")
    parts = [ops.unsqueeze(e, axes=[position]) for e in elements]
    return parts[0] if len(parts) == 1 else ops.concat(parts, axis=position)


@converter("Loop", since=1)
def loop(node: NodeContext, trip_count: Any, condition: Any, *initial: Any) -> Any:
    body = node.attr("body")
    if body is None:
        raise node.error("attribute 'body' is missing")
    limit = None if trip_count is None else int(np.asarray(node.constant(trip_count, "input 'M'")).reshape(-1)[0])
    going = True if condition is None else _known_bool(node, condition, "input 'cond'")
    carried = list(initial)
    n_scans = len(body.output) - 1 - len(carried)
    if n_scans < 0:
        raise node.error(f"its body has {len(body.output)} outputs; it must return the condition and the "
                         f"{len(carried)} loop-carried value(s)")
    scans: list[list[Any]] = [[] for _ in range(n_scans)]
    unrolling = tracing()  # (converting into a graph: each iteration adds the body's nodes)
    iteration = 0
    while going and (limit is None or iteration < limit):
        if unrolling and iteration >= MAX_UNROLLED:
            raise node.unknown(f"a loop of more than {MAX_UNROLLED} iterations runs node by node")
        results = node.run_graph(body, [np.asarray(iteration, np.int64), np.asarray(going), *carried])
        going = _known_bool(node, results[0], "the condition its body returns")
        carried = results[1:1 + len(carried)]
        for collected, value in zip(scans, results[1 + len(carried):]):
            collected.append(value)
        iteration += 1
    return [*carried, *(_stacked(node, s, 0, f"scan output {k}") for k, s in enumerate(scans))]


@converter("Scan", since=9)
def scan(node: NodeContext, *inputs: Any) -> Any:
    body = node.attr("body")
    n_inputs = node.attr("num_scan_inputs")
    if body is None or n_inputs is None:
        raise node.error("attributes 'body' and 'num_scan_inputs' are required")
    n_states = len(inputs) - n_inputs
    if n_states < 0:
        raise node.error(f"it has {len(inputs)} inputs, fewer than num_scan_inputs {n_inputs}")
    states, sequences = list(inputs[:n_states]), list(inputs[n_states:])
    n_outputs = len(body.output) - n_states
    directions = node.attr("scan_input_directions", [0] * n_inputs)
    axes = node.attr("scan_input_axes", [0] * n_inputs)
    out_directions = node.attr("scan_output_directions", [0] * n_outputs)
    out_axes = node.attr("scan_output_axes", [0] * n_outputs)
    if not (len(directions) == len(axes) == n_inputs and len(out_directions) == len(out_axes) == n_outputs):
        raise node.error("scan_input_directions / scan_input_axes must list one entry per scan input, "
                         "scan_output_directions / scan_output_axes one per scan output")
    lengths = set()
    for k, (x, axis) in enumerate(zip(sequences, axes)):
        dims = dims_of(x)
        if not -len(dims) <= axis < len(dims):
            raise node.error(f"scan_input_axes[{k}] = {axis} is out of range for scan input {k} of rank {len(dims)}")
        lengths.add(dims[axis])
    if -1 in lengths:
        raise node.unknown("the sequence length of a scan input is known only at run time")
    if len(lengths) > 1:
        raise node.error(f"its scan inputs have different sequence lengths {sorted(lengths)}")
    length = lengths.pop() if lengths else 0
    if length > MAX_UNROLLED and tracing():
        raise node.unknown(f"a scan of more than {MAX_UNROLLED} steps runs node by node")
    collected: list[list[Any]] = [[] for _ in range(n_outputs)]
    for t in range(length):
        elements = [ops.gather(x, np.asarray(length - 1 - t if reverse else t, np.int64), axis=axis)
                    for x, reverse, axis in zip(sequences, directions, axes)]
        results = node.run_graph(body, [*states, *elements])
        states = results[:n_states]
        for k, value in enumerate(results[n_states:]):
            collected[k].append(value)
    outputs = [_stacked(node, c[::-1] if reverse else c, axis, f"scan output {k}")
               for k, (c, reverse, axis) in enumerate(zip(collected, out_directions, out_axes))]
    return [*states, *outputs]
