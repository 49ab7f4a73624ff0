"""``trace(fn, *specs_or_arrays)``: run ``fn`` on symbolic values and record
the op calls as a ``Graph``.

Ops see tracing through their one entry point: when a call's arguments
include a ``Value`` (or a symbolic dim), the runtime hands the call to ``_record`` (registered in
``runtime.dispatch.INTERCEPTORS``), which infers the outputs' specs before
any data exists and appends a node.  Arrays mixed into a traced call become
constant nodes; Python scalars take the traced operand's dtype; a symbolic
dim (``x.shape[0]`` of an unknown dim, see ``symbolic``) becomes ``dim``
ops computing its size at run time.  Operators, indexing and NumPy ufuncs
on values are op calls too (``array_syntax``).  Like any tracer, it sees
shapes, not values: Python control flow on tensor values cannot be recorded,
and asking for one (``bool(x)``, ``float(x)``) raises ``TracingError``.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..attrs import attr_key
from ..bounded_cache import BoundedCache
from ..errors import TracingError
from ..runtime import dispatch
from ..spec import TensorSpec
from .ir import Graph, Node, Value, constant_node
from .symbolic import SymDim

if TYPE_CHECKING:
    from ..attrs import AttrValue
    from ..operator import Op

    class _Local(threading.local):
        builders: list[_Builder]

_local = cast("_Local", threading.local())  # each thread's traces in progress, innermost last


def _builders() -> list[_Builder]:
    if not hasattr(_local, "builders"):
        _local.builders = []
    return _local.builders


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.constants: dict[int, tuple[object, Value]] = {}  # id(array) -> (array, its constant's value)

    def constant(self, array: object) -> Value:
        key = id(array)
        if key not in self.constants:
            self.constants[key] = (array, self._constant(array))  # keep the array alive: ids stay unique
        return self.constants[key][1]

    def _constant(self, array: object) -> Value:
        node = constant_node(np.array(array))
        self.nodes.append(node)
        return node.outputs[0]

    def record(self, op: Op, inputs: Sequence[Value | None], attrs: Mapping[str, AttrValue]) -> list[Value]:
        node = Node(op, inputs, attrs, _inferred([None if v is None else v.spec for v in inputs], op, attrs))
        self.nodes.append(node)
        return node.outputs


class _Mismatch(BaseException):
    """A call that a graph traced before does not make (``_Matcher``).  Not an Exception:
    a function that catches errors of its own must not go on with the wrong values."""


class _Matcher(_Builder):
    """Runs a function as tracing does, checking each call against the nodes of a
    graph it traced before, in order, instead of building new ones: the same op,
    attribute values and inputs, equal constants.  The calls get that graph's values,
    so their wiring is compared by identity; the first difference raises _Mismatch."""

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        self.expected = graph.nodes
        self.next = 0

    def _take(self) -> Node:
        if self.next >= len(self.expected):
            raise _Mismatch()
        self.next += 1
        return self.expected[self.next - 1]

    def _constant(self, array: object) -> Value:
        node, value = self._take(), np.asarray(array)
        if not (node.is_constant and node.value.dtype == value.dtype and np.array_equal(node.value, value)):
            raise _Mismatch()
        return node.outputs[0]

    def record(self, op: Op, inputs: Sequence[Value | None], attrs: Mapping[str, AttrValue]) -> list[Value]:
        node = self._take()
        if (node.op is not op or len(node.inputs) != len(inputs) or any(a is not b for a, b in zip(node.inputs, inputs))
                or attr_key(node.attrs) != attr_key(attrs)
                or [v.spec for v in node.outputs] != _inferred([None if v is None else v.spec for v in inputs], op,
                                                               attrs)):  # (an op declared again infers anew)
            raise _Mismatch()
        return node.outputs


def same_trace(fn: Callable[..., Any], graph: Graph, arrays: Sequence[Any]) -> bool:
    """Whether tracing ``fn`` on ``arrays`` would give ``graph`` (traced from ``fn``
    without the passes): the inputs' shapes and dtypes, then every call, checked as
    ``fn`` runs on ``graph``'s own values -- no new nodes, no inference."""
    if len(arrays) != len(graph.inputs) or any(
            a.shape != v.spec.shape or a.dtype.name != v.spec.dtype for a, v in zip(arrays, graph.inputs)):
        return False
    matcher = _Matcher(graph)
    _builders().append(matcher)
    try:
        outputs, several = _graph_outputs(fn(*graph.inputs), matcher)
    except _Mismatch:
        return False
    finally:
        _builders().pop()
    return (matcher.next == len(matcher.expected) and several == graph.tuple_output
            and len(outputs) == len(graph.outputs) and all(r is v for r, v in zip(outputs, graph.outputs)))


def _graph_outputs(result: Any, builder: _Builder) -> tuple[list[Value], bool]:
    """A traced function's result as graph outputs (symbolic dims and arrays become values), and
    whether it gave several."""
    several = isinstance(result, (tuple, list))
    return [item if isinstance(item, Value) else item.as_tensor("int64") if isinstance(item, SymDim)
            else builder.constant(np.asarray(item)) for item in (result if several else [result])], several


def _record(op: Op, attrs: Mapping[str, AttrValue], args: Sequence[Any]) -> Any:
    if not any(isinstance(a, (Value, SymDim)) for a in args):
        return NotImplemented
    builders = _builders()
    if not builders:
        raise TracingError(f"op '{op.name}' was called on a traced value outside of opforge.trace")
    builder = builders[-1]
    # Python scalars and symbolic dims are weak, as in NumPy: they take the dtype of the traced operand
    # (a data operand rather than a bool condition, where there is one).
    dtypes = [a.spec.dtype for a in args if isinstance(a, Value)] or \
             [a.dtype.name for a in args if isinstance(a, np.ndarray)] or ["int64"]
    dtype = next((d for d in dtypes if d != "bool"), dtypes[0])
    args = [a.as_tensor(dtype) if isinstance(a, SymDim) else a for a in args]
    inputs = [a if isinstance(a, Value) or a is None else
              builder.constant(np.asarray(a, dtype) if type(a) in (int, float, bool) else a) for a in args]
    outputs = builder.record(op, inputs, attrs)
    return tuple(outputs) if op.tuple_output else outputs[0]


dispatch.INTERCEPTORS.append(_record)

# Output specs by (op, its inference and check functions, input specs, attributes):
# a function traced again (opforge.grad, for a new signature or constant) records the same calls again.
_INFERRED: BoundedCache[tuple[object, ...], tuple[TensorSpec, ...]] = BoundedCache(4096)


def _inferred(specs: Sequence[TensorSpec | None], op: Op, attrs: Mapping[str, AttrValue]) -> list[TensorSpec]:
    try:
        key = (op, op.infer_fn, op.check_fn, tuple(specs), attr_key(attrs))
        cached = _INFERRED.get(key)
    except TypeError:  # an unhashable attribute value: infer afresh
        return op.infer_specs(specs, attrs)
    if cached is None:
        cached = tuple(op.infer_specs(specs, attrs))
        _INFERRED.put(key, cached)
    return list(cached)


def _input_spec(k: int, arg: object) -> TensorSpec:
    if isinstance(arg, TensorSpec):
        return arg
    try:
        return TensorSpec.of(np.asarray(arg))
    except (ValueError, TypeError) as error:  # ragged lists, dtypes the kernel ABI lacks
        raise TracingError(f"opforge.trace: input {k} must be a TensorSpec or an array, got "
                           f"{type(arg).__name__}: {error}") from None


def trace(fn: Callable[..., Any], *specs_or_arrays: object, name: str | None = None, optimize: bool = True) -> Graph:
    """Trace ``fn`` into a Graph.  Each argument is a ``TensorSpec`` (shape with
    -1 / None for unknown dims) or an example array (its spec is used).  With
    ``optimize`` (the default) the graph passes run: dead code goes, float16 and
    bfloat16 nodes without native kernels of their own compute in float32 with casts
    at the float32 regions' boundaries (``graph.float16``), an inference batch_norm
    after a conv folds into its weights, a mul by or an add of a per-channel constant
    into the conv or batch_norm before it, and a relu after a conv into the conv
    (``graph.passes``)."""
    if not callable(fn):
        raise TracingError(f"opforge.trace takes the function to trace first, got {type(fn).__name__}")
    inputs = [Value(_input_spec(k, arg), name=f"x{k}") for k, arg in enumerate(specs_or_arrays)]
    builder = _Builder()
    _builders().append(builder)
    try:
        outputs, several = _graph_outputs(fn(*inputs), builder)
    finally:
        _builders().pop()
    # (mypy infers getattr's default in the context str | None, so it keeps None in the "or")
    graph = Graph(inputs, builder.nodes, outputs,
                  name=name or getattr(fn, "__name__", "graph"))  # type: ignore[arg-type]
    graph.tuple_output = several
    if optimize:
        from .float16 import compute_in_float32
        from .passes import eliminate_dead_code, fold_batch_norm_into_conv, fold_relu_into_conv, fold_scale_and_shift

        eliminate_dead_code(graph)
        compute_in_float32(graph)
        fold_batch_norm_into_conv(graph)
        fold_scale_and_shift(graph)
        fold_relu_into_conv(graph)
    return graph
