"""Graphs as JSON: ``to_json`` / ``save`` write, ``from_json`` / ``load`` read.

A graph file is untrusted input: it reaches kernels that write wherever
their output buffers are.  So reading checks every field against the
registered ops before the graph exists -- the op, its input and output
counts, attribute names and types (the op's own checking), dtypes, layouts,
shapes, that every value is defined before use, that constants hold what
they declare, and that each node's declared outputs agree with its op's
inference.  Every problem is a ``GraphError`` naming the node, the field and
what was expected.
"""
from __future__ import annotations

import json
import os
import reprlib
import tempfile
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import numpy as np

from ..dtypes import ABI_DTYPES, to_numpy
from ..errors import GraphError
from ..registry import lookup
from ..spec import LAYOUTS, TensorSpec
from .ir import Graph, Node, Value, compatible, constant_node, kernel_layout

if TYPE_CHECKING:
    from ..attrs import AttrValue
    from ..operator import Kernel, Op

_T = TypeVar("_T")

FORMAT = 1  # written as "format"; files without it are read as format 1
MAX_RANK = 32  # NumPy 1's limit on dims, and far beyond any kernel's
INT64_MAX = 2 ** 63 - 1

_show = reprlib.Repr()
_show.maxlevel, _show.maxstring, _show.maxother = 3, 60, 60


# -- writing -------------------------------------------------------------------

def to_json(graph: Graph) -> str:
    names = graph.value_names()

    def value(v: Value) -> dict[str, Any]:
        return {"name": names[v.id], "shape": list(v.spec.shape), "dtype": v.spec.dtype, "layout": v.spec.layout}

    nodes = []
    for node in graph.nodes:
        entry: dict[str, Any] = {"outputs": [value(v) for v in node.outputs]}
        if node.is_constant:
            entry.update(op="constant", value=node.value.tolist(), dtype=str(node.value.dtype))
        else:
            if getattr(node.op, "schema", None) is None:
                raise GraphError(f"graph '{graph.name}': op '{node.op.name}' is not registered with a schema, "
                                 "so it cannot be saved (declare it with opforge.op)")
            entry.update(op=node.op.name, inputs=[None if v is None else names[v.id] for v in node.inputs],
                         attrs={k: list(v) if isinstance(v, tuple) else v for k, v in node.attrs.items()})
            if node.kernel is not None:
                entry["kernel"] = node.kernel.name
        nodes.append(entry)
    return json.dumps({"format": FORMAT, "name": graph.name, "tuple_output": graph.tuple_output,
                       "inputs": [value(v) for v in graph.inputs], "nodes": nodes,
                       "outputs": [names[v.id] for v in graph.outputs]}, indent=1)


def save(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write ``graph`` to ``path``; the file is replaced only once the text is complete."""
    text = to_json(graph)
    try:
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".json.tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as error:
        raise GraphError(f"cannot write graph file '{path}': {error.strerror or error}") from None


# -- reading -------------------------------------------------------------------

def load(path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> Graph:
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise GraphError(f"Graph.load takes the path of a graph file, got {type(path).__name__}")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except (OSError, ValueError) as error:  # ValueError: a NUL in the path
        raise GraphError(f"cannot read graph file '{os.fsdecode(path)}': "
                         f"{getattr(error, 'strerror', None) or error}") from None
    try:
        return from_json(data)
    except GraphError as error:
        raise GraphError(f"graph file '{os.fsdecode(path)}': {error}") from None


def from_json(source: str | bytes | bytearray) -> Graph:
    """The graph in ``source`` (str, or bytes holding UTF-8 text), validated."""
    if isinstance(source, (bytes, bytearray)):
        try:
            source = bytes(source).decode("utf-8")
        except UnicodeDecodeError as error:
            raise GraphError(f"graph JSON is not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not isinstance(source, str):
        raise GraphError(f"graph JSON must be str or bytes, got {type(source).__name__}")
    try:
        data = json.loads(source, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise GraphError("graph JSON is nested too deeply") from None
    except GraphError:
        raise
    except ValueError as error:  # bad syntax, or an integer with too many digits
        raise GraphError(f"graph JSON does not parse: {error}") from None
    return _Reader(data).graph()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict; a repeated key would silently keep only its last value."""
    data = {}
    for key, value in pairs:
        if key in data:
            raise GraphError(f"graph JSON repeats the key '{key}' in one object")
        data[key] = value
    return data


_VALUE_KEYS = ({"name", "shape", "dtype"}, {"layout"})
_GRAPH_KEYS = ({"name", "inputs", "nodes", "outputs"}, {"format", "tuple_output"})
_CONSTANT_KEYS: tuple[set[str], set[str]] = ({"op", "outputs", "value", "dtype"}, set())
_NODE_KEYS = ({"op", "inputs", "outputs"}, {"attrs", "kernel"})


class _Reader:
    """Reads one graph object; ``where`` is the part being read, for messages."""

    def __init__(self, data: Any) -> None:  # parsed JSON
        self.data = data
        self.where = "graph"
        self.values: dict[str, Value] = {}  # name -> Value, as defined so far

    def fail(self, field: str, expected: str, got: object) -> NoReturn:
        raise GraphError(f"{self.where}: '{field}' must be {expected}, got {_show.repr(got)}")

    def keys(self, entry: object, allowed: tuple[set[str], set[str]], what: str) -> None:
        required, optional = allowed
        if not isinstance(entry, dict):
            raise GraphError(f"{self.where}: {what} must be an object with keys {sorted(required)}, "
                             f"got {_show.repr(entry)}")
        missing = sorted(required - entry.keys())
        if missing:
            raise GraphError(f"{self.where}: {what} lacks the key(s) {missing}")
        unknown = sorted(entry.keys() - required - optional)
        if unknown:
            raise GraphError(f"{self.where}: {what} has unknown key(s) {unknown}; "
                             f"expected {sorted(required | optional)}")

    def field(self, entry: dict[str, Any], key: str, kind: type[_T], expected: str) -> _T:
        value = entry[key]
        if not isinstance(value, kind):
            self.fail(key, expected, value)
        return value

    # -- the graph
    def graph(self) -> Graph:
        data = self.data
        self.keys(data, _GRAPH_KEYS, "a graph")
        version = data.get("format", FORMAT)
        if type(version) is not int or version != FORMAT:
            self.fail("format", f"{FORMAT} (the only graph format this opforge reads)", version)
        name = self.field(data, "name", str, "a string")
        self.where = f"graph '{name}'"
        tuple_output = data.get("tuple_output", True)
        if not isinstance(tuple_output, bool):
            self.fail("tuple_output", "true or false", tuple_output)
        inputs = []
        for k, entry in enumerate(self.field(data, "inputs", list, "a list of values")):
            self.where = f"graph '{name}': input {k}"
            value = Value(self.spec(entry, "a graph input"))
            if value.spec.layout != "ndarray":
                self.fail("layout", "ndarray (graphs take plain arrays)", value.spec.layout)
            inputs.append(self.define(value, entry))
        nodes = []
        for k, entry in enumerate(self.field(data, "nodes", list, "a list of nodes")):
            self.where = f"graph '{name}': node {k}"
            nodes.append(self.node(entry))
        self.where = f"graph '{name}'"
        names = self.field(data, "outputs", list, "a list of value names")
        if not tuple_output and len(names) != 1:
            self.fail("outputs", "one value name when 'tuple_output' is false", names)
        graph = Graph(inputs, nodes, [self.use(n, "outputs") for n in names], name=name)
        graph.tuple_output = tuple_output
        return graph

    # -- values
    def spec(self, entry: Any, what: str) -> TensorSpec:
        self.keys(entry, _VALUE_KEYS, what)
        shape = entry["shape"]
        if not isinstance(shape, list) or not all(type(d) is int for d in shape):
            self.fail("shape", "a list of ints", shape)
        if shape != [-2] and not all(-1 <= d <= INT64_MAX for d in shape) or len(shape) > MAX_RANK:
            self.fail("shape", f"at most {MAX_RANK} dims, each >= 0 or -1 (unknown) and within int64, "
                               "or [-2] (unknown rank)", shape)
        dtype = entry["dtype"]
        if not isinstance(dtype, str) or dtype not in ABI_DTYPES:
            self.fail("dtype", f"one of {', '.join(ABI_DTYPES)}", dtype)
        layout = entry.get("layout", "ndarray")
        if not isinstance(layout, str) or layout not in LAYOUTS:
            self.fail("layout", f"one of {', '.join(LAYOUTS)}", layout)
        return TensorSpec(shape, dtype, layout)

    def define(self, value: Value, entry: dict[str, Any]) -> Value:
        name = entry["name"]
        if not isinstance(name, str) or not name:
            self.fail("name", "a non-empty string", name)
        if name in self.values:
            self.fail("name", "a name no earlier value has", name)
        value.name = name
        self.values[name] = value
        return value

    def use(self, name: object, field: str) -> Value:
        if not isinstance(name, str) or name not in self.values:
            self.fail(field, "names of values defined earlier (graph inputs or outputs of earlier nodes)", name)
        return self.values[name]

    # -- nodes
    def node(self, entry: object) -> Node:
        if not isinstance(entry, dict) or not isinstance(entry.get("op"), str):
            raise GraphError(f"{self.where}: a node must be an object whose 'op' is an op name, "
                             f"got {_show.repr(entry)}")
        if entry["op"] == "constant":
            return self.constant(entry)
        op = lookup(entry["op"])
        self.where += f" ({entry['op']})"
        if op is None:
            raise GraphError(f"{self.where}: 'op' names op '{entry['op']}', which is not registered")
        self.keys(entry, _NODE_KEYS, "a node")
        inputs = self.inputs(op, self.field(entry, "inputs", list, "a list of value names (null: absent)"))
        attrs = self.attrs(op, entry.get("attrs", {}))
        outs = self.field(entry, "outputs", list, "a list of values")
        if len(outs) != len(op.outputs):
            self.fail("outputs", f"{len(op.outputs)} value(s) ({', '.join(op.outputs)})", outs)
        declared = [self.spec(out, "an output") for out in outs]
        in_specs = [None if v is None else v.spec for v in inputs]
        try:
            inferred = op.infer_specs(in_specs, attrs)
        except Exception as error:  # the op's own code: whatever it raises, the file is what is wrong
            raise GraphError(f"{self.where}: the op rejects inputs {in_specs} with attrs {attrs}: "
                             f"{type(error).__name__}: {error}") from error
        layout = kernel_layout(op, inputs)
        for name, mine, theirs in zip(op.outputs, declared, inferred):
            if not compatible(mine, theirs):
                self.fail("outputs", f"output '{name}' as inferred from the inputs, {theirs}", mine)
            expected = theirs.layout if layout is None else layout
            if mine.layout != expected:
                self.fail("outputs", f"output '{name}' in layout {expected}", mine.layout)
        node = Node(op, inputs, attrs, declared)
        if "kernel" in entry:
            node.kernel = self.kernel(op, entry["kernel"], layout)
        for value, out in zip(node.outputs, outs):
            self.define(value, out)
        return node

    def inputs(self, op: Op, names: list[Any]) -> list[Value | None]:
        if op.variadic:
            if None in names:
                self.fail("inputs", f"value names for the variadic input '{op.inputs[0].name}'", names)
            return [self.use(n, "inputs") for n in names]
        ok = len(names) <= len(op.inputs) and all(
            i.optional for i in op.inputs[len(names):]) and all(
            i.optional for i, n in zip(op.inputs, names) if n is None)
        if not ok:
            wanted = ", ".join(i.name + ("?" if i.optional else "") for i in op.inputs)
            self.fail("inputs", f"{len(op.inputs)} value name(s) ({wanted}; null only for '?' inputs)", names)
        names = names + [None] * (len(op.inputs) - len(names))
        return [None if n is None else self.use(n, "inputs") for n in names]

    def attrs(self, op: Op, values: object) -> dict[str, AttrValue]:
        if not isinstance(values, dict):
            self.fail("attrs", "an object of attribute values", values)
        unknown = sorted(values.keys() - op.attrs.keys())
        if unknown:
            self.fail("attrs", f"attributes of op '{op.name}' ({', '.join(op.attrs) or 'it has none'})", unknown)
        try:
            return op.resolve_attrs(values)
        except Exception as error:  # the op's own checking
            raise GraphError(f"{self.where}: 'attrs': {type(error).__name__}: {error}") from error

    def kernel(self, op: Op, name: object, layout: str | None) -> Kernel:
        found = next((k for k in op.kernels if k.name == name), None) if isinstance(name, str) else None
        if found is None:
            self.fail("kernel", f"the name of one of the op's kernels ({', '.join(k.name for k in op.kernels)})",
                      name)
        if layout is not None and found.layout not in ("any", layout):
            self.fail("kernel", f"a kernel for layout {layout} (its inputs' layout)", name)
        return found

    def constant(self, entry: dict[str, Any]) -> Node:
        self.where += " (constant)"
        self.keys(entry, _CONSTANT_KEYS, "a constant")
        outs = self.field(entry, "outputs", list, "a list of one value")
        if len(outs) != 1:
            self.fail("outputs", "a list of one value", outs)
        declared = self.spec(outs[0], "an output")
        dtype = entry["dtype"]
        if dtype != declared.dtype:
            self.fail("dtype", f"the output's dtype {declared.dtype}", dtype)
        array = self.decode(entry["value"], dtype)
        if declared.shape != array.shape or declared.layout != "ndarray":
            self.fail("outputs", f"the shape of 'value', {list(array.shape)}, in layout ndarray",
                      [list(declared.shape), declared.layout])
        node = constant_node(array)
        self.define(node.outputs[0], outs[0])
        return node

    def decode(self, value: object, dtype: str) -> np.ndarray:
        """The constant's array, only if ``value`` holds exactly such numbers."""
        kinds = "b" if dtype == "bool" else "iuf" if "float" in dtype else "iu"
        expected = f"a rectangular nested list of {'booleans' if kinds == 'b' else 'numbers'} that fit {dtype}"
        try:
            raw = np.array(value)
        except (ValueError, TypeError, OverflowError, RecursionError):
            self.fail("value", expected, value)
        if raw.ndim > MAX_RANK or (raw.size and raw.dtype.kind not in kinds):
            self.fail("value", expected, value)
        with np.errstate(over="ignore", invalid="ignore"):
            array = raw.astype(to_numpy(dtype))
            exact = np.array_equal(array, raw) if kinds == "iu" else \
                kinds == "b" or np.array_equal(np.isfinite(array), np.isfinite(raw))
        if not exact:
            self.fail("value", expected, value)
        return array

