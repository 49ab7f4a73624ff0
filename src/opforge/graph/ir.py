"""The graph IR: ``Value`` (a tensor known by its ``TensorSpec``), ``Node``
(one op call with its attributes) and ``Graph`` (inputs, nodes in
topological order, outputs).  Constants are nodes of the op ``constant``.
"""
from __future__ import annotations

import json
from itertools import count

import numpy as np

from ..errors import OpforgeError
from ..spec import TensorSpec

_ids = count()


class Value:
    """A tensor in a graph.  During tracing it stands in for an array:
    ops called on it add nodes instead of computing."""

    __array_priority__ = 1000  # so that ndarray + Value defers to Value

    def __init__(self, spec: TensorSpec, producer=None, index=0, name=None):
        self.spec = spec
        self.producer = producer  # the Node computing it; None for graph inputs
        self.index = index        # which output of the producer
        self.id = next(_ids)
        self.name = name or f"v{self.id}"

    @property
    def shape(self):
        return self.spec.shape

    @property
    def dtype(self):
        return self.spec.dtype

    @property
    def ndim(self):
        return self.spec.rank

    def __repr__(self):
        return f"%{self.name}: {self.spec}"

    # Arithmetic traces the built-in ops, so model code reads naturally.
    def _op(self, name, *args):
        from ..registry import lookup

        return lookup(name)(*args)

    def __add__(self, other):
        return self._op("add", self, other)

    def __radd__(self, other):
        return self._op("add", other, self)

    def __sub__(self, other):
        return self._op("sub", self, other)

    def __rsub__(self, other):
        return self._op("sub", other, self)

    def __mul__(self, other):
        return self._op("mul", self, other)

    def __rmul__(self, other):
        return self._op("mul", other, self)

    def __matmul__(self, other):
        return self._op("matmul", self, other)

    def __rmatmul__(self, other):
        return self._op("matmul", other, self)

    def __neg__(self):
        return self._op("neg", self)

    def sum(self, axes=(), keep_dims=False):
        from ..registry import lookup

        return lookup("reduce_sum")(self, axes=list(axes), keep_dims=keep_dims)


class Node:
    """One op call: ``outputs = op(*inputs, **attrs)``.  ``kernel`` is chosen
    by the layout pass (None: dispatch at run time)."""

    def __init__(self, op, inputs, attrs, out_specs, name=None):
        self.op = op
        self.inputs = list(inputs)
        self.attrs = dict(attrs)
        self.outputs = [Value(spec, self, k) for k, spec in enumerate(out_specs)]
        self.name = name or f"n{next(_ids)}"
        self.kernel = None
        self.value = None  # the array of a constant node

    @property
    def is_constant(self):
        return self.op is None

    def __repr__(self):
        outs = ", ".join(repr(v) for v in self.outputs)
        if self.is_constant:
            return f"{outs} = constant({np.array2string(self.value, threshold=6)})"
        args = [f"%{v.name}" for v in self.inputs] + [f"{k}={v!r}" for k, v in self.attrs.items()]
        layout = f"  [{self.kernel.name}]" if self.kernel is not None else ""
        return f"{outs} = {self.op.name}({', '.join(args)}){layout}"


def constant_node(array) -> Node:
    array = np.asarray(array)
    node = Node(None, [], {}, [TensorSpec.of(array)])
    node.value = array
    return node


class Graph:
    """Inputs, nodes in topological order, outputs.  Call it on arrays."""

    def __init__(self, inputs, nodes, outputs, name="graph"):
        self.inputs = list(inputs)
        self.nodes = list(nodes)
        self.outputs = list(outputs)
        self.name = name
        self.tuple_output = True
        self._executor = None

    def __call__(self, *arrays):
        from .executor import Executor

        if self._executor is None:
            self._executor = Executor(self)
        return self._executor.run(arrays)

    def invalidate(self):
        """Call after changing the graph: drops compiled plans."""
        self._executor = None

    def __repr__(self):
        lines = [f"graph {self.name}(" + ", ".join(repr(v) for v in self.inputs) + ") {"]
        lines += [f"  {node!r}" for node in self.nodes]
        lines.append("  return " + ", ".join(f"%{v.name}" for v in self.outputs))
        lines.append("}")
        return "\n".join(lines)

    # -- JSON ---------------------------------------------------------------
    def to_json(self) -> str:
        names = {}

        def ref(value):
            return names.setdefault(value.id, f"v{len(names)}")

        def spec(value):
            return {"shape": list(value.spec.shape), "dtype": value.spec.dtype, "layout": value.spec.layout}

        inputs = [dict(name=ref(v), **spec(v)) for v in self.inputs]
        nodes = []
        for node in self.nodes:
            entry = {"outputs": [dict(name=ref(v), **spec(v)) for v in node.outputs]}
            if node.is_constant:
                entry.update(op="constant", value=node.value.tolist(), dtype=str(node.value.dtype))
            else:
                if getattr(node.op, "schema", None) is None:
                    raise OpforgeError(f"graph '{self.name}': op '{node.op.name}' is not registered with a schema, "
                                       "so it cannot be saved (declare it with opforge.op)")
                entry.update(op=node.op.name, inputs=[None if v is None else ref(v) for v in node.inputs],
                             attrs={k: list(v) if isinstance(v, tuple) else v for k, v in node.attrs.items()})
                if node.kernel is not None:
                    entry["kernel"] = node.kernel.name
            nodes.append(entry)
        return json.dumps({
            "name": self.name,
            "tuple_output": self.tuple_output,
            "inputs": inputs,
            "nodes": nodes,
            "outputs": [ref(v) for v in self.outputs],
        }, indent=1)

    def save(self, path):
        """Write the graph as JSON; the file is replaced only once the text is complete."""
        import os
        import tempfile

        text = self.to_json()
        folder = os.path.dirname(os.path.abspath(path))
        fd, temporary = tempfile.mkstemp(dir=folder, suffix=".json.tmp")
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(temporary, path)

    @classmethod
    def from_json(cls, text: str) -> "Graph":
        try:
            return cls._from_json(json.loads(text))
        except (KeyError, TypeError, ValueError, IndexError) as error:
            if isinstance(error, OpforgeError):
                raise
            raise OpforgeError(f"malformed graph JSON: {type(error).__name__}: {error}") from None

    @classmethod
    def _from_json(cls, data) -> "Graph":
        from ..registry import lookup

        values = {}

        def spec(entry):
            return TensorSpec(entry["shape"], entry["dtype"], entry.get("layout", "ndarray"))

        inputs = []
        for entry in data["inputs"]:
            value = Value(spec(entry), name=entry["name"])
            values[entry["name"]] = value
            inputs.append(value)
        nodes = []
        for entry in data["nodes"]:
            if entry["op"] == "constant":
                node = constant_node(np.array(entry["value"], dtype=entry["dtype"]))
            else:
                op = lookup(entry["op"])
                if op is None:
                    raise OpforgeError(f"graph '{data['name']}' uses op '{entry['op']}', which is not registered")
                try:
                    args = [None if name is None else values[name] for name in entry["inputs"]]
                except KeyError as missing:
                    raise OpforgeError(f"graph '{data['name']}': node {entry['op']} reads {missing}, "
                                       "which no earlier node defines") from None
                node = Node(op, args, op.resolve_attrs(entry.get("attrs", {})),
                            [spec(o) for o in entry["outputs"]])
                if "kernel" in entry:
                    node.kernel = next((k for k in op.kernels if k.name == entry["kernel"]), None)
            for value, out in zip(node.outputs, entry["outputs"]):
                value.name = out["name"]
                values[out["name"]] = value
            nodes.append(node)
        graph = cls(inputs, nodes, [values[name] for name in data["outputs"]], name=data["name"])
        graph.tuple_output = data.get("tuple_output", True)
        return graph

    @classmethod
    def load(cls, path) -> "Graph":
        with open(path) as handle:
            return cls.from_json(handle.read())
