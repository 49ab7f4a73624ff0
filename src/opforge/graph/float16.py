"""float16 and bfloat16 graphs computed in float32.

A CPU without float16 arithmetic has nothing fast to run a float16 convolution
with: most built-ins have float32 kernels only, and their float16 inputs would
run the NumPy reference.  ``compute_in_float32`` does what onnxruntime's CPU
provider does instead: a node of float16 (or bfloat16) tensors that has a native
kernel for the same tensors in float32 runs that kernel, with casts at its
boundary -- its narrow inputs widened (exactly) to float32, its float32 results
rounded back to the narrow dtype where a narrow value is needed.  Results are
float32-computed, then rounded to float16: close to a float16 computation's,
usually closer to the exact value.

Casts are made once and cancel: the float32 value a node computed is what any
later float32-computed node reads, so a rounding to float16 followed by a
widening back to float32 between two such nodes never appears, and a CNN runs in
float32 from its input's cast to its output's.  Casts a converter wrote itself
take part the same way: ``cast(x16, float32)`` of a value already known in
float32 is that value, and a converter that computes a float16 op in float32
marks its cast back (``rounds_float32_result``), which float32 readers then skip.
Any other cast -- a model's own, or one whose rounding is the point, as in
QuantizeLinear's float16 division -- stays.  Constants are converted once when
the pass runs.

Which nodes move:

- a pure (``no_side_effect``) op with narrow float inputs and no native CPU kernel
  for them, but one for the same inputs in float32 that infers the same outputs
  with float32 in place of each narrow one;
- an op that does have a native narrow kernel (a reshape, a concat, a slice,
  ...) when every narrow input is already known in float32 and every output is a
  float, so that staying in float32 saves a cast on each side.

Graph inputs and outputs keep their dtypes.  The decision is made with the CPU's
kernels; a graph run on a GPU runs the same float32 nodes.  The first rule is
``runtime.widen``'s, which single calls on a framework's narrow tensors follow too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..runtime.widen import NARROW_FLOATS, float32_outputs, native_cpu_kernel
from ..spec import TensorSpec
from .ir import Node, Value, constant_node
from .passes import eliminate_dead_code

if TYPE_CHECKING:
    from .ir import Graph


def rounds_float32_result(value: Any) -> Any:
    """Mark ``value``, the cast back to float16 or bfloat16 of a result computed in float32 in its dtype's
    place, as such: float32-computed readers read the float32 result instead (see the module's
    docstring).  Returns ``value``; anything but a traced narrow-float value passes unmarked."""
    if isinstance(value, Value) and value.spec.dtype in NARROW_FLOATS:
        value.float32_rounding = True
    return value


def _float32_specs(node: Node, wide: dict[int, Value], constants: dict[int, Node]) -> list[TensorSpec] | None:
    """The node's output specs computed in float32, if it moves there (see the module's docstring); else None."""
    if node.kernel is not None:
        return None  # (a kernel pinned by the layout pass, or a loaded graph, was chosen for these dtypes)
    in_specs = [None if v is None else v.spec for v in node.inputs]
    out_specs = float32_outputs(node.op, node.attrs, in_specs, [v.spec for v in node.outputs])
    if out_specs is None:
        return None
    if not native_cpu_kernel(node.op, in_specs):
        return out_specs
    narrow_inputs = [v for v in node.inputs if v is not None and v.spec.dtype in NARROW_FLOATS]
    # A native narrow kernel: moved only when its inputs are known in float32 already and it makes floats.
    saves_casts = (all(v.id in wide or v.id in constants for v in narrow_inputs)
                   and any(v.id in wide for v in narrow_inputs)
                   and all(np.dtype(s.dtype).kind == "f" for s in out_specs))
    return out_specs if saves_casts else None


def compute_in_float32(graph: Graph) -> int:
    """Run the graph's float16 and bfloat16 nodes on float32 kernels, casting at the boundary of each
    float32 region only (see the module's docstring).  Changes the graph in place; returns the number of
    nodes that now compute in float32."""
    from ..registry import lookup

    cast_op = lookup("cast")
    if cast_op is None or not any(
            v.spec.dtype in NARROW_FLOATS for v in [*graph.inputs, *(o for n in graph.nodes for o in n.outputs)]):
        return 0
    nodes: list[Node] = []
    alias: dict[int, Value] = {}       # value id -> the value that replaces it
    wide: dict[int, Value] = {}        # narrow value id -> its float32 version (computed, or exactly widened)
    exact: dict[int, Value] = {}       # float32 value id -> the narrow value it exactly widens
    pending: dict[int, Value] = {}     # narrow values whose producer moved to float32: made from `wide` when read
    constants: dict[int, Node] = {}    # narrow value id -> its constant node
    moved = 0

    def cast(value: Value, dtype: str, spec: TensorSpec | None = None) -> Node:
        node = Node(cast_op, [value], cast_op.resolve_attrs({"dtype": dtype}),
                    [spec or TensorSpec(value.spec.shape, dtype, value.spec.layout)])
        nodes.append(node)
        return node

    def narrow(value: Value) -> Value:
        """``value`` itself, made (rounded from its float32 version) if nothing has made it yet."""
        if value.id in pending:
            made = cast(pending.pop(value.id), value.spec.dtype, value.spec)
            value.producer, value.index = made, 0  # the value its readers hold
            made.outputs = [value]
        return value

    def widened(value: Value) -> Value:
        """The float32 version of a narrow value: its float32-computed one, else an exact widening."""
        if value.id not in wide:
            if value.id in constants:
                array = np.asarray(constants[value.id].value).astype(np.float32)
                made = constant_node(array)
                made.outputs[0].name = f"{value.name}_float32"
                nodes.append(made)
                wide[value.id] = made.outputs[0]
            else:
                wide[value.id] = cast(narrow(value), "float32").outputs[0]
                exact[wide[value.id].id] = value
        return wide[value.id]

    for node in graph.nodes:
        node.inputs = [None if v is None else alias.get(v.id, v) for v in node.inputs]
        if node.is_constant:
            nodes.append(node)
            if node.outputs[0].spec.dtype in NARROW_FLOATS:
                constants[node.outputs[0].id] = node
            continue
        if node.op is cast_op:
            source, result = node.inputs[0], node.outputs[0]
            if source is not None and source.spec.dtype in NARROW_FLOATS and result.spec.dtype == "float32":
                if source.id in wide:  # cast(x16, float32) of a value known in float32: that value
                    alias[result.id] = wide[source.id]
                    continue
                wide[source.id] = result  # an exact widening, for later readers too
                exact[result.id] = source
            elif source is not None and source.spec.dtype == "float32" and result.spec.dtype in NARROW_FLOATS:
                if source.id in exact and exact[source.id].spec.dtype == result.spec.dtype:
                    alias[result.id] = exact[source.id]  # cast(cast(x16, float32), float16) is x16
                    continue
                if result.float32_rounding:
                    wide[result.id] = source  # readers in float32 read what was rounded
            node.inputs = [None if v is None else narrow(v) for v in node.inputs]
            nodes.append(node)
            continue
        out_specs = _float32_specs(node, wide, constants)
        if out_specs is None:
            node.inputs = [None if v is None else narrow(v) for v in node.inputs]
            nodes.append(node)
            continue
        inputs = [None if v is None else widened(v) if v.spec.dtype in NARROW_FLOATS else v for v in node.inputs]
        made = Node(node.op, inputs, node.attrs, out_specs, name=node.name)
        nodes.append(made)
        for old, new in zip(node.outputs, made.outputs):
            if old.spec.dtype in NARROW_FLOATS:
                new.name = f"{old.name}_float32"
                wide[old.id] = pending[old.id] = new
            else:
                new.name = old.name
                alias[old.id] = new
        moved += 1
    graph.outputs = [narrow(alias.get(v.id, v)) for v in graph.outputs]  # (may add casts to nodes)
    graph.nodes = nodes
    eliminate_dead_code(graph)
    graph.invalidate()
    return moved
