"""``load(model)``: an ONNX model as an opforge ``Graph``.

The loader checks the model's structure (names defined before use, opsets
for every domain, tensor types opforge has), then lists every node no
converter covers and refuses the model once, naming them all.  Otherwise it
traces a function that walks the nodes in order and calls each node's
converter (``registry``) on traced values and on arrays: initializers,
``Constant`` outputs and whatever is computed from them only are arrays, so
constant subgraphs compute while the model loads and leave no node behind.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from ..bounded_cache import BoundedCache
from ..dtypes import ABI_DTYPES
from ..errors import ModelError, OpforgeError, UnsupportedOpError
from ..graph import trace
from ..runtime.progress import Progress
from ..spec import TensorSpec
from . import converters
from .registry import NodeContext, RunTimeValueError, find_converter, normalize_domain

if TYPE_CHECKING:
    import onnx

    from ..graph.ir import Graph
    from .registry import Converter

    class LoadedGraph(Graph):
        """The Graph ``load`` returns: a Graph that also names the model's interface and opsets."""

        input_names: list[str]
        output_names: list[str]
        opsets: dict[str, int]

__all__ = ["DynamicModel", "load", "read_model", "onnx_dtype", "attribute_values"]

#: What ``load`` reads a model from: a ModelProto, a file path or the serialized bytes.
ModelSource: TypeAlias = "onnx.ModelProto | str | os.PathLike[str] | bytes | bytearray | memoryview"


def read_model(model: ModelSource) -> onnx.ModelProto:
    """A ModelProto from a ModelProto, a file path or the serialized bytes; ModelError otherwise."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception as error:  # google.protobuf.message.DecodeError and friends
            raise ModelError(f"onnx.load: the bytes given are not a serialized ONNX model ({error})") from None
        return proto
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ModelError(f"onnx.load: no ONNX model file at {path!r}")
        try:
            return onnx.load(path)
        except Exception as error:
            raise ModelError(f"onnx.load: {path!r} is not a readable ONNX model ({type(error).__name__}: "
                             f"{error})") from None
    raise ModelError(f"onnx.load takes an onnx.ModelProto, a file path or the model's bytes, "
                     f"got {type(model).__name__}")


def onnx_dtype(elem_type: int, what: str) -> str:
    """The opforge dtype name of an ONNX TensorProto element type; ModelError naming ``what`` otherwise."""
    import onnx

    name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() \
        else str(elem_type)
    dtype: str | None
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:
        dtype = None
    if name == "BFLOAT16" and "bfloat16" in ABI_DTYPES:
        return "bfloat16"
    if dtype not in ABI_DTYPES or name in ("UNDEFINED", "STRING") or name.startswith(("COMPLEX", "FLOAT8",
                                                                                        "BFLOAT")):
        raise ModelError(f"{what} has ONNX element type {name}; opforge supports "
                         f"{', '.join(d for d in ABI_DTYPES)}")
    return dtype


def _array(tensor: onnx.TensorProto, what: str) -> npt.NDArray[Any]:
    import onnx.numpy_helper

    onnx_dtype(tensor.data_type, what)
    try:
        array = onnx.numpy_helper.to_array(tensor)
    except Exception as error:
        raise ModelError(f"{what} cannot be read: {type(error).__name__}: {error}") from None
    return np.require(array, requirements='C')  # ascontiguousarray would make 0-d arrays 1-d


# -- attributes -------------------------------------------------------------------

#: ONNX attribute types opforge reads; GRAPH(S) (If, Loop, Scan bodies) make a node unsupported.
SUBGRAPH_TYPES = ("GRAPH", "GRAPHS")


def attribute_values(node: onnx.NodeProto, what: str) -> tuple[dict[str, Any], dict[str, str]]:
    """({name: Python value}, {name: ONNX type name}) of a node's attributes."""
    import onnx

    values: dict[str, object] = {}
    types: dict[str, str] = {}
    kinds = onnx.AttributeProto.AttributeType
    for attr in node.attribute:
        kind = kinds.Name(attr.type) if attr.type in kinds.values() else str(attr.type)
        types[attr.name] = kind
        label = f"{what}: attribute '{attr.name}'"
        if kind == "FLOAT":
            values[attr.name] = float(attr.f)
        elif kind == "INT":
            values[attr.name] = int(attr.i)
        elif kind == "STRING":
            values[attr.name] = attr.s.decode("utf-8", errors="replace")
        elif kind == "FLOATS":
            values[attr.name] = [float(v) for v in attr.floats]
        elif kind == "INTS":
            values[attr.name] = [int(v) for v in attr.ints]
        elif kind == "STRINGS":
            values[attr.name] = [s.decode("utf-8", errors="replace") for s in attr.strings]
        elif kind == "TENSOR":
            values[attr.name] = _array(attr.t, label)
        elif kind == "TENSORS":
            values[attr.name] = [_array(t, label) for t in attr.tensors]
        elif kind == "SPARSE_TENSOR":
            values[attr.name] = _sparse_to_dense(attr.sparse_tensor, label)
        else:  # GRAPH(S), TYPE_PROTO(S), SPARSE_TENSORS: kept as protos
            values[attr.name] = onnx.helper.get_attribute_value(attr)
    return values, types


def _sparse_to_dense(sparse: onnx.SparseTensorProto, what: str) -> npt.NDArray[Any]:
    dims = tuple(int(d) for d in sparse.dims)
    values = _array(sparse.values, what).reshape(-1)
    dense = np.zeros(dims, values.dtype)
    indices = _array(sparse.indices, what) if sparse.indices.dims else np.zeros((0,), np.int64)
    if indices.ndim == 1:  # linearised indices
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


# -- the graph's interface ------------------------------------------------------------

def _value_spec(info: onnx.ValueInfoProto, what: str) -> TensorSpec:
    kind = info.type.WhichOneof("value")
    if kind != "tensor_type":
        raise ModelError(f"{what} is of ONNX type {kind or 'unknown'}; opforge supports tensors only")
    tensor = info.type.tensor_type
    dtype = onnx_dtype(tensor.elem_type, what)
    if not tensor.HasField("shape"):
        return TensorSpec(None, dtype)
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else -1 for d in tensor.shape.dim]
    return TensorSpec(dims, dtype)


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    opsets = {}
    for entry in model.opset_import:
        opsets[normalize_domain(entry.domain)] = int(entry.version)
    return opsets


class _Plan:
    """What ``load`` found in the model before converting anything."""

    initializers: dict[str, onnx.TensorProto | onnx.SparseTensorProto]
    inputs: list[str]  # the graph's inputs, in order
    specs: list[TensorSpec]  # theirs
    bound: dict[str, npt.NDArray[Any]]  # inputs bound by constants=
    outputs: list[str]
    nodes: list[tuple[str, str, onnx.NodeProto]]  # (label, normalized domain, node), in order

    def __init__(self, model: onnx.ModelProto, constants: Mapping[str, Any] | None) -> None:
        import onnx

        graph = model.graph
        self.name = graph.name or "onnx_model"
        self.opsets = _opsets(model)
        newest = onnx.defs.onnx_opset_version()
        if self.opsets.get("", 0) > newest:
            raise ModelError(f"model '{self.name}' imports ONNX opset {self.opsets['']}; the onnx package here "
                             f"knows opsets up to {newest}")
        self.initializers = {}
        for tensor in graph.initializer:
            if not tensor.name:
                raise ModelError(f"model '{self.name}': an initializer has no name")
            self.initializers[tensor.name] = tensor
        for sparse in graph.sparse_initializer:
            name = sparse.values.name
            if not name:
                raise ModelError(f"model '{self.name}': a sparse initializer has no name")
            self.initializers[name] = sparse
        self.inputs, self.specs, self.bound = [], [], {}
        declared: set[str] = set()
        for info in graph.input:
            if not info.name:
                raise ModelError(f"model '{self.name}': graph input {len(declared)} has no name")
            if info.name in declared:
                raise ModelError(f"model '{self.name}': graph input '{info.name}' is declared twice")
            declared.add(info.name)
            if info.name in self.initializers and (constants is None or info.name not in constants):
                continue  # an initializer listed as an input: its value is the default
            spec = _value_spec(info, f"model '{self.name}': graph input '{info.name}'")
            if constants is not None and info.name in constants:
                self.bound[info.name] = _bound_constant(self.name, info.name, spec, constants[info.name])
                self.initializers.pop(info.name, None)  # constants= overrides an initializer's default
                continue
            self.inputs.append(info.name)
            self.specs.append(spec)
        unknown = sorted(set(constants or ()) - declared)
        if unknown:
            raise ModelError(f"model '{self.name}': constants= names {unknown}, which are not graph inputs "
                             f"(graph inputs: {', '.join(self.inputs) or 'none'})")
        self.outputs = []
        for k, info in enumerate(graph.output):
            if not info.name:
                raise ModelError(f"model '{self.name}': graph output {k} has no name")
            self.outputs.append(info.name)
        if not self.outputs:
            raise ModelError(f"model '{self.name}' has no outputs")
        self.bodies: dict[int, list[tuple[str, str, onnx.NodeProto]]] = {}  # id(subgraph) -> its nodes
        self.graph_attrs: dict[int, dict[str, Any]] = {}  # id(node) -> {attribute: its subgraph(s)}
        self.nodes = self._check_nodes(graph)
        self._arrays: dict[str, npt.NDArray[Any]] = {}

    def initializer_arrays(self) -> dict[str, npt.NDArray[Any]]:
        """{name: array} of the initializers, read once (read-only: every conversion of the model shares them)."""
        if len(self._arrays) != len(self.initializers):
            for name, tensor in self.initializers.items():
                if name not in self._arrays:
                    label = f"model '{self.name}': initializer '{name}'"
                    array = _sparse_to_dense(tensor, label) if hasattr(tensor, "values") else _array(tensor, label)
                    array.flags.writeable = False
                    self._arrays[name] = array
        return self._arrays

    def _check_nodes(self, graph: onnx.GraphProto, outer: frozenset[str] = frozenset(),
                     where: str = "") -> list[tuple[str, str, onnx.NodeProto]]:
        """graph's nodes as (label, normalized domain, node), in order, each read name defined before it (in
        graph or, for a subgraph, by the graphs around it: ``outer``); subgraphs are checked too."""
        defined = set(outer) | set(self.initializers) | set(self.inputs) | set(self.bound) if not where else \
            set(outer) | {t.name for t in graph.initializer} | {i.name for i in graph.input}
        nodes = []
        for k, node in enumerate(graph.node):
            label = f"{where}node '{node.name or k}' ({node.op_type})"
            if not node.op_type:
                raise ModelError(f"model '{self.name}': {where}node {node.name or k} has no op_type")
            domain = normalize_domain(node.domain)
            if domain not in self.opsets:
                raise ModelError(f"model '{self.name}': {label} is in domain '{node.domain or 'ai.onnx'}', which "
                                 f"the model's opset_import does not list (it lists: "
                                 f"{', '.join(repr(d or 'ai.onnx') for d in sorted(self.opsets)) or 'nothing'})")
            if domain == "":
                self._check_attributes(label, node)
            for name in node.input:
                if name and name not in defined:
                    raise ModelError(f"model '{self.name}': {label} reads '{name}', which no graph input, "
                                     f"initializer or earlier node defines")
            for attr in node.attribute:  # If's branches, Loop's and Scan's bodies see the names defined so far
                bodies = _subgraphs(attr)
                for body in bodies:
                    self.bodies[id(body)] = self._check_nodes(body, frozenset(defined),
                                                              f"{where}{label} attribute '{attr.name}': ")
                if bodies:  # the converter gets these very objects (protobuf makes a new one per access)
                    self.graph_attrs.setdefault(id(node), {})[attr.name] = bodies[0] if attr.type == 5 else bodies
            for name in node.output:
                if name in defined and name and not where:
                    raise ModelError(f"model '{self.name}': {label} defines '{name}', which is already defined")
                defined.add(name)
            nodes.append((label, domain, node))
        if not where:
            for name in self.outputs:
                if name not in defined:
                    raise ModelError(f"model '{self.name}': graph output '{name}' is not defined by any input, "
                                     f"initializer or node")
        return nodes

    def _check_attributes(self, label: str, node: onnx.NodeProto) -> None:
        """A standard node's attributes against its ONNX schema at the model's opset: an unknown name or a
        value of another type is a ModelError (onnxruntime refuses such a model too)."""
        import onnx

        try:
            schema = onnx.defs.get_schema(node.op_type, self.opsets[""], "")
        except onnx.defs.SchemaError:  # no such op: converters() names every one
            return
        for attribute in node.attribute:
            declared = schema.attributes.get(attribute.name)
            if declared is None:
                known = ", ".join(sorted(schema.attributes)) or "none"
                raise ModelError(f"model '{self.name}': {label} has attribute '{attribute.name}', which "
                                 f"{node.op_type} of opset {schema.since_version} does not (its attributes: {known})")
            if attribute.type != declared.type.value:
                given = onnx.AttributeProto.AttributeType.Name(attribute.type)
                raise ModelError(f"model '{self.name}': {label}: attribute '{attribute.name}' is ONNX {given}; "
                                 f"{node.op_type} takes {declared.type.name}")

    def converters(self) -> dict[int, Converter]:
        """{id(node): converter} of every node, subgraphs' included; UnsupportedOpError listing every node none
        covers."""
        chosen: dict[int, Converter] = {}
        missing: set[tuple[str, str, int]] = set()
        for nodes in [self.nodes, *self.bodies.values()]:
            for label, domain, node in nodes:
                opset = self.opsets[domain]
                entry = find_converter(domain, node.op_type, opset)
                if entry is None:
                    missing.add((domain or "ai.onnx", node.op_type, opset))
                else:
                    chosen[id(node)] = entry
        if missing:
            listed = sorted(missing)
            shown = ", ".join(f"{d}::{t} (opset {v})" for d, t, v in listed)
            raise UnsupportedOpError(f"model '{self.name}': no converter for {len(listed)} op type(s): {shown}",
                                     unsupported=listed)
        return chosen


def _subgraphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    """The graphs an attribute holds (GRAPH: one, GRAPHS: a list)."""
    return [attr.g] if attr.type == 5 else list(attr.graphs) if attr.type == 10 else []


def _bound_constant(model_name: str, name: str, spec: TensorSpec, value: Any) -> npt.NDArray[Any]:
    array = np.asarray(value)
    if array.dtype.name != spec.dtype:
        raise ModelError(f"model '{model_name}': constants['{name}'] is {array.dtype.name}; the input is "
                         f"declared {spec.dtype}")
    if spec.rank is not None and not spec.matches(array.shape):
        raise ModelError(f"model '{model_name}': constants['{name}'] has shape {list(array.shape)}; the input "
                         f"is declared {list(spec.shape)}")
    return np.require(array, requirements='C')  # ascontiguousarray would make 0-d arrays 1-d


def _is_placeholder(name: object) -> bool:
    return isinstance(name, str) and name[:1] == "v" and name[1:].isdigit()


def _outputs_of(ctx: NodeContext, result: Any) -> list[Any]:
    """A converter's result as a list of one entry per declared output."""
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(results) < ctx.num_outputs:
        raise ctx.error(f"the converter returned {len(results)} output(s); the node declares {ctx.num_outputs}")
    converted = []
    for value in results:
        if isinstance(value, (bool, int, float, np.generic)):
            value = np.asarray(value)
        converted.append(value)
    return converted


def _name_constants(env: Mapping[str, Any]) -> None:
    """Constant nodes the trace made from the model's arrays take their names (initializers, Constant
    outputs, folded values), so a printed or exported graph shows them."""
    from ..graph.trace import _builders

    names = {id(value): name for name, value in env.items() if isinstance(value, np.ndarray)}
    for array, value in _builders()[-1].constants.values():
        name = names.get(id(array))
        if name is not None and _is_placeholder(value.name):
            value.name = name


# -- walking the nodes ----------------------------------------------------------------

class _Walk:
    """One conversion of a model: the nodes walked in order, each converter called on traced values or on
    arrays (all of them arrays when the model runs node by node on a call's inputs)."""

    def __init__(self, plan: _Plan, chosen: Mapping[int, Converter], quiet: bool = False) -> None:
        self.plan, self.chosen, self.quiet = plan, chosen, quiet

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        plan = self.plan
        env: dict[str, Any] = {}
        for name, value in zip(plan.inputs, inputs):
            if hasattr(value, "spec"):
                value.name = name
            env[name] = value
        env.update(plan.bound)
        env.update(plan.initializer_arrays())
        progress = None if self.quiet else Progress(f"converting model '{plan.name}'", len(plan.nodes))
        self.nodes(plan.nodes, env, progress)
        if progress is not None:
            progress.close()
        if tracing():
            _name_constants(env)
        return tuple(env[name] for name in plan.outputs)

    def nodes(self, nodes: list[tuple[str, str, onnx.NodeProto]], env: dict[str, Any],
              progress: Progress | None = None) -> None:
        plan = self.plan
        for index, (label, domain, node) in enumerate(nodes):
            if progress is not None:
                progress.step(index)
            attrs, types = attribute_values(node, f"model '{plan.name}': {label}")
            attrs.update(plan.graph_attrs.get(id(node), {}))
            ctx = NodeContext(name=node.name or str(index), op_type=node.op_type, domain=domain,
                              opset=plan.opsets[domain], attrs=attrs, input_names=node.input,
                              output_names=node.output, attr_types=types)
            ctx.run_graph = functools.partial(self._body_in, env, label)
            args = [env[name] if name else None for name in node.input]
            try:
                result = self.chosen[id(node)].call(ctx, args)
            except ModelError as error:  # a converter's (node.error): say whose model it is, as the others do
                if not str(error).startswith("model '"):
                    raise type(error)(f"model '{plan.name}': {error}") from None
                raise
            except OpforgeError as error:
                raise ModelError(f"model '{plan.name}': {label}: {type(error).__name__}: {error}") from error
            except (TypeError, ValueError, IndexError, KeyError) as error:  # a required input or attribute missing
                raise ModelError(f"model '{plan.name}': {label}: cannot convert it ({type(error).__name__}: "
                                 f"{error}); check its inputs {list(node.input)} and attributes against "
                                 f"{node.op_type}'s definition") from error
            for name, value in zip(node.output, _outputs_of(ctx, result)):
                if not name:
                    continue
                if value is None:
                    raise ctx.error(f"the converter gave no value for output '{name}'")
                if hasattr(value, "spec") and _is_placeholder(getattr(value, "name", None)):
                    value.name = name
                env[name] = value

    def _body_in(self, outer: Mapping[str, Any], label: str, graph: onnx.GraphProto,
                 values: Sequence[Any]) -> list[Any]:
        """A subgraph's outputs for its inputs ``values``; it reads the names of the graphs around it too."""
        nodes = self.plan.bodies.get(id(graph))
        if nodes is None:  # checked and listed with the model: a graph the node did not hold
            raise ModelError(f"model '{self.plan.name}': {label}: a subgraph that is not one of its attributes")
        if len(values) != len(graph.input):
            raise ModelError(f"model '{self.plan.name}': {label}: its subgraph '{graph.name}' takes "
                             f"{len(graph.input)} input(s), the node gives it {len(values)}")
        env = dict(outer)
        for tensor in graph.initializer:
            env[tensor.name] = _array(tensor, f"model '{self.plan.name}': {label}: initializer '{tensor.name}'")
        for info, value in zip(graph.input, values):
            env[info.name] = value
        self.nodes(nodes, env)
        return [env[info.name] for info in graph.output]


def tracing() -> bool:
    """Whether a conversion into a graph is under way (else converters run on arrays, node by node)."""
    from ..graph.trace import _builders

    return bool(_builders())


def _traced(plan: _Plan, chosen: Mapping[int, Converter], specs: Sequence[TensorSpec]) -> LoadedGraph:
    graph = cast("LoadedGraph", trace(_Walk(plan, chosen), *specs, name=plan.name))  # its ONNX attributes below
    for value, name in zip(graph.outputs, plan.outputs):
        if _is_placeholder(value.name):
            value.name = name
    graph.tuple_output = len(plan.outputs) > 1
    graph.input_names = list(plan.inputs)
    graph.output_names = list(plan.outputs)
    graph.opsets = dict(plan.opsets)
    return graph


# -- models whose shapes are computed at run time ------------------------------------

#: Input signatures a DynamicModel keeps a converted graph (or the node-by-node mode) for.
SIGNATURES_KEPT = 16


class DynamicModel:
    """An ONNX model that computes, at run time, values its conversion needs (a shape from unknown dims,
    a Range's length, an If's condition, a NonZero's count): what ``load`` returns for it.

    Called like a Graph.  Each new input signature (shapes and dtypes) converts the model with every dim
    known, so shape computations fold to constants, into a Graph kept for that signature (its plans,
    fusion and memory planning as any graph's); a model that still needs values its inputs hold (control
    flow on data, value-sized outputs) runs node by node on the call's arrays instead, each op eagerly.
    ``graph_for(*arrays)`` / ``specialize(*specs)`` give the graph of one signature, ``mode(*arrays)`` says
    which way a signature runs, ``reason`` why the model could not become one graph at load time.
    """

    def __init__(self, plan: _Plan, chosen: Mapping[int, Converter], reason: str) -> None:
        from ..graph.ir import Value

        self._plan, self._chosen, self.reason = plan, chosen, reason
        self.name = plan.name
        self.input_names, self.output_names = list(plan.inputs), list(plan.outputs)
        self.opsets = dict(plan.opsets)
        self.inputs = [Value(spec, name=name) for spec, name in zip(plan.specs, plan.inputs)]
        self.tuple_output = len(plan.outputs) > 1
        self._graphs: BoundedCache[tuple[object, ...], LoadedGraph | None] = BoundedCache(SIGNATURES_KEPT)

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}: {s}" for n, s in zip(self.input_names, self._plan.specs))
        return f"DynamicModel('{self.name}', inputs ({shown}); shapes computed per input signature)"

    def _specs(self, arrays: Sequence[Any]) -> list[TensorSpec]:
        from ..errors import ArityError, DTypeError, ShapeError

        if len(arrays) != len(self._plan.inputs):
            raise ArityError(f"model '{self.name}' takes {len(self._plan.inputs)} input(s) "
                             f"{self._plan.inputs}, got {len(arrays)}")
        specs = []
        for name, declared, array in zip(self._plan.inputs, self._plan.specs, arrays):
            spec = array if isinstance(array, TensorSpec) else TensorSpec(tuple(array.shape), _dtype_name(array))
            if spec.rank is None or any(d < 0 for d in spec.shape):
                raise ShapeError(f"model '{self.name}': input '{name}' needs every dim known, got {spec}")
            if spec.dtype != declared.dtype:
                raise DTypeError(f"model '{self.name}': input '{name}' is {spec.dtype}; the model declares "
                                 f"{declared.dtype}")
            if declared.rank is not None and not declared.matches(spec.shape):
                raise ShapeError(f"model '{self.name}': input '{name}' has shape {list(spec.shape)}; the model "
                                 f"declares {declared}")
            specs.append(spec)
        return specs

    def _graph(self, specs: Sequence[TensorSpec]) -> LoadedGraph | None:
        def convert() -> LoadedGraph | None:
            try:
                return _traced(self._plan, self._chosen, specs)
            except RunTimeValueError:  # values the inputs hold: node by node on each call's arrays
                return None

        return self._graphs.get_or_create(tuple((s.shape, s.dtype) for s in specs), convert)

    def specialize(self, *specs: Any) -> LoadedGraph:
        """The Graph of one input signature (TensorSpecs or example arrays, every dim known); ModelError when
        the model needs the inputs' values, not only their shapes."""
        graph = self._graph(self._specs(specs))
        if graph is None:
            raise ModelError(f"model '{self.name}' needs the values of its inputs, not only their shapes, to "
                             f"become a graph (it runs node by node): {self.reason}")
        return graph

    graph_for = specialize

    def mode(self, *arrays: Any) -> str:
        """'graph' (a converted graph of the signature runs) or 'eager' (the nodes run one by one)."""
        return "eager" if self._graph(self._specs(arrays)) is None else "graph"

    def __call__(self, *arrays: Any) -> Any:
        graph = self._graph(self._specs(arrays))
        if graph is not None:
            return graph(*arrays)
        outputs = _Walk(self._plan, self._chosen, quiet=True)(*[_host_array(a) for a in arrays])
        outputs = tuple(np.asarray(out) for out in outputs)
        return outputs if self.tuple_output else outputs[0]


def _dtype_name(array: Any) -> str:
    dtype = array.dtype
    try:
        return str(np.dtype(dtype).name)
    except TypeError:  # torch.float32 and the like
        return str(dtype).rpartition(".")[2]


def _host_array(array: Any) -> npt.NDArray[Any]:
    if isinstance(array, np.ndarray):
        return np.require(array, requirements='C')
    if hasattr(array, "__dlpack__"):
        return np.require(np.from_dlpack(array), requirements='C')
    return np.require(np.asarray(array), requirements='C')


def load(model: ModelSource, *, constants: dict[str, Any] | None = None) -> LoadedGraph | DynamicModel:
    """The ONNX model (a ModelProto, a file path or its bytes) as an opforge ``Graph``.

    The graph's inputs are the model's graph inputs that are not initializers,
    in order (``graph.input_names``); ``constants={name: array}`` binds some of
    them to arrays instead, which then fold like initializers.  Unknown dims
    (``dim_param``) are -1.  Call the graph positionally; it returns one array,
    or a tuple when the model has several outputs (``graph.output_names``).

    A model whose conversion needs values it computes at run time (shapes
    computed from unknown dims, control flow, value-sized outputs) is a
    ``DynamicModel`` instead: called the same way, converted per input
    signature.
    """
    if constants is not None and not isinstance(constants, dict):
        raise ModelError(f"onnx.load: constants= is a dict {{input name: array}}, got {type(constants).__name__}")
    proto = read_model(model)
    plan = _Plan(proto, constants)
    converters.import_converters()
    chosen = plan.converters()
    try:
        return _traced(plan, chosen, plan.specs)
    except RunTimeValueError as error:
        return DynamicModel(plan, chosen, str(error))
