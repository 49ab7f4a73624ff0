"""The graph IR: ``Value`` (a tensor known by its ``TensorSpec``), ``Node``
(one op call with its attributes) and ``Graph`` (inputs, nodes in
topological order, outputs).  Constants are nodes of the op ``constant``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import count
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..errors import OpforgeError, TracingError
from ..spec import TensorSpec
from .array_syntax import ArraySyntax
from .symbolic import SymDim, call_builtin

if TYPE_CHECKING:
    import os

    import numpy.typing as npt

    from ..attrs import AttrValue
    from ..operator import Kernel, Op
    from .executor import Executor

_T = TypeVar("_T")

_ids = count()


class Value(ArraySyntax):
    """A tensor in a graph.  During tracing it stands in for an array:
    operators, indexing, NumPy ufuncs and op calls on it add nodes instead
    of computing (see ``array_syntax``)."""

    def __init__(self, spec: TensorSpec, producer: Node | None = None, index: int = 0, name: str | None = None) -> None:
        self.spec = spec
        self.producer = producer  # the Node computing it; None for graph inputs
        self.index = index        # which output of the producer
        self.id = next(_ids)
        self.name = name or f"v{self.id}"
        # A float16 / bfloat16 value that only rounds back a result computed in float32 in the narrow
        # dtype's place (a converter's widening): float32 readers may read the result unrounded (graph.float16).
        self.float32_rounding = False

    @property
    def shape(self) -> tuple[int | SymDim, ...]:
        """Known dims as ints, unknown ones as ``SymDim`` (their size at run time, usable in arithmetic)."""
        if self.spec.rank is None:
            raise TracingError(f"traced %{self.name} has unknown rank, so it has no shape to read; trace with a "
                               "TensorSpec of known rank (None for unknown dims)")
        return tuple(d if d >= 0 else SymDim.of(self, k) for k, d in enumerate(self.spec.shape))

    @property
    def dtype(self) -> str:
        return self.spec.dtype

    @property
    def ndim(self) -> int | None:
        return self.spec.rank

    def __repr__(self) -> str:
        return f"%{self.name}: {self.spec}"

    def sum(self, axes: Iterable[int] = (), keep_dims: bool = False) -> Any:
        return call_builtin("reduce_sum", self, axes=list(axes), keep_dims=keep_dims)


class Node:
    """One op call: ``outputs = op(*inputs, **attrs)``.  ``kernel`` is chosen
    by the layout pass (None: dispatch at run time).  The outputs' layout is
    ``kernel_layout``'s, whatever inference said: the executor sizes output
    buffers by it, and the kernel writes in its inputs' layout."""

    def __init__(self, op: Op | None, inputs: Iterable[Value | None], attrs: Mapping[str, AttrValue],
                 out_specs: Sequence[TensorSpec], name: str | None = None) -> None:
        # None only in a constant node (is_constant), which has no op: code reads op after checking that
        self.op: Op = op  # type: ignore[assignment]
        self.inputs: list[Value | None] = list(inputs)  # None: an absent optional input
        self.attrs = dict(attrs)
        layout = None if op is None else kernel_layout(op, self.inputs)
        if layout is not None and any(s.layout != layout for s in out_specs):
            out_specs = [TensorSpec(s.shape, s.dtype, layout) for s in out_specs]
        self.outputs = [Value(spec, self, k) for k, spec in enumerate(out_specs)]
        self.name = name or f"n{next(_ids)}"
        self.kernel: Kernel | None = None
        # the array of a constant node (an op node has None, and code reads it after checking is_constant)
        self.value: npt.NDArray[Any] = None  # type: ignore[assignment]

    @property
    def is_constant(self) -> bool:
        return self.op is None

    def text(self, names: Mapping[int, str] | None = None) -> str:
        """One line; ``names`` maps value ids to the names to print (a graph's ``value_names``)."""
        def name(value: Value | None) -> str:
            return "None" if value is None else "%" + (names or {}).get(value.id, value.name)

        outs = ", ".join(f"{name(v)}: {v.spec}" for v in self.outputs)
        if self.is_constant:
            return f"{outs} = constant({np.array2string(self.value, threshold=6)})"
        args = [name(v) for v in self.inputs] + [f"{k}={v!r}" for k, v in self.attrs.items()]
        layout = f"  [{self.kernel.name}]" if self.kernel is not None else ""
        return f"{outs} = {self.op.name}({', '.join(args)}){layout}"

    def __repr__(self) -> str:
        return self.text()


def constant_node(array: npt.ArrayLike) -> Node:
    array = np.asarray(array)
    node = Node(None, [], {}, [TensorSpec.of(array)])
    node.value = array
    return node


def kernel_layout(op: Op, inputs: Iterable[Value | None]) -> str | None:
    """The layout a node's kernel writes its outputs in: that of its inputs,
    since kernels are chosen by it (mixed layouts: no kernel takes them, so
    ndarray); None for an op that converts layouts (a kernel of layout "any"),
    whose inference gives the output's layout."""
    if op.converts_layout:
        return None
    layouts = {v.spec.layout for v in inputs if v is not None}
    return layouts.pop() if len(layouts) == 1 else "ndarray"


def compatible(declared: TensorSpec, given: TensorSpec) -> bool:
    """Whether two specs can describe the same tensor: equal dtypes, and
    shapes that agree wherever both are known."""
    if declared.dtype != given.dtype:
        return False
    if declared.rank is None or given.rank is None:
        return True
    return declared.rank == given.rank and all(
        a == b or -1 in (a, b) for a, b in zip(declared.shape, given.shape))


def _list_of(kind: type[_T], items: object, field: str, graph_name: str) -> list[_T]:
    from ..errors import GraphError

    items = list(items) if isinstance(items, (list, tuple)) else None
    if items is None or not all(isinstance(item, kind) for item in items):
        raise GraphError(f"graph '{graph_name}': {field} must be a list of {kind.__name__}s")
    return items


class Graph:
    """Inputs, nodes in topological order, outputs.  Call it on arrays."""

    def __init__(self, inputs: Sequence[Value], nodes: Sequence[Node], outputs: Sequence[Value],
                 name: str = "graph") -> None:
        self.inputs = _list_of(Value, inputs, "inputs", name)
        self.nodes = _list_of(Node, nodes, "nodes", name)
        self.outputs = _list_of(Value, outputs, "outputs", name)
        self.name = name
        self.tuple_output = True
        self._executor: Executor | None = None

    def __call__(self, *arrays: Any) -> Any:
        executor = self._executor
        if executor is None:
            from .executor import Executor

            executor = self._executor = Executor(self)
        for a in arrays:
            if isinstance(a, Value):  # inside a trace (grad of a graph): record its ops
                return self._inline(arrays)
        return executor.run(arrays)  # torch, JAX, CuPy, ... arrays too: outputs of their kind

    def input_name(self, index: int) -> str:
        """How errors name input ``index`` (as ops name theirs)."""
        return f"%{self.inputs[index].name}" if index < len(self.inputs) else f"#{index}"

    def _inline(self, args: Sequence[Any]) -> Any:
        from ..errors import ArityError, DTypeError, ShapeError

        if len(args) != len(self.inputs):
            raise ArityError(f"graph '{self.name}' takes {len(self.inputs)} input(s), got {len(args)}")
        for value, arg in zip(self.inputs, args):
            spec = arg.spec if isinstance(arg, Value) else TensorSpec.of(np.asarray(arg))
            if not compatible(value.spec, spec):
                error = DTypeError if spec.dtype != value.spec.dtype else ShapeError
                raise error(f"graph '{self.name}': input %{value.name} is declared {value.spec}, got {spec}")
        env = self.replay(args)
        outputs = tuple(env[v.id] for v in self.outputs)
        return outputs if self.tuple_output else outputs[0]

    def replay(self, args: Sequence[Any]) -> dict[int, Any]:
        """Run the nodes one op call at a time on ``args`` (arrays, or traced
        values: then the calls are recorded into the current trace).  Returns
        {value id: array or value} for every value of the graph."""
        from ..runtime.dispatch import launcher_for

        env = {v.id: x for v, x in zip(self.inputs, args)}
        for node in self.nodes:
            if node.is_constant:  # the array itself: a trace makes its own constant
                env[node.outputs[0].id] = node.value
                continue
            result = launcher_for(node.op, node.attrs, len(node.inputs))(
                *[None if v is None else env[v.id] for v in node.inputs])
            for value, out in zip(node.outputs, result if node.op.tuple_output else (result,)):
                env[value.id] = out
        return env

    def invalidate(self) -> None:
        """Call after changing the graph: drops compiled plans."""
        self._executor = None

    def value_names(self) -> dict[int, str]:
        """{value id: name}, the names both printing and JSON use: a value keeps
        its own name, unless that is a tracer's placeholder (v<number>) or
        already taken; those are numbered v0, v1, ... in order of definition."""
        names: dict[int, str]
        taken: set[str]
        names, taken, number = {}, set(), 0
        for value in self.inputs + [v for node in self.nodes for v in node.outputs]:
            name = value.name
            placeholder = not isinstance(name, str) or not name or (
                name[0] == "v" and name[1:].isascii() and name[1:].isdigit())
            if placeholder or name in taken:
                while f"v{number}" in taken:
                    number += 1
                name = f"v{number}"
            names[value.id] = name
            taken.add(name)
        return names

    def __repr__(self) -> str:
        names = self.value_names()
        lines = [f"graph {self.name}(" + ", ".join(f"%{names[v.id]}: {v.spec}" for v in self.inputs) + ") {"]
        lines += [f"  {node.text(names)}" for node in self.nodes]
        lines.append("  return " + ", ".join(f"%{names.get(v.id, v.name)}" for v in self.outputs))
        lines.append("}")
        return "\n".join(lines)

    # -- JSON (graph.serialize): a loaded graph is validated against the registered ops
    def to_json(self) -> str:
        """The graph as JSON text (ops by name, constants inline); ``from_json`` reads it back."""
        from .serialize import to_json

        return to_json(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the graph as JSON; the file is replaced only once the text is complete."""
        from .serialize import save

        save(self, path)

    @classmethod
    def from_json(cls, text: str | bytes | bytearray) -> Graph:
        """The graph in ``text`` (str or UTF-8 bytes); any problem is a GraphError."""
        from .serialize import from_json

        return from_json(text)

    @classmethod
    def load(cls, path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> Graph:
        """Read a graph written by ``save``; its ops must be registered."""
        from .serialize import load

        return load(path)
