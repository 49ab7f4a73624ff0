"""opforge as an ONNX backend (``onnx.backend.base.Backend``), so onnx's own
conformance suite and any tool written for that interface can run models with it::

    from opforge.onnx.backend import OpforgeBackend
    outputs = OpforgeBackend.run_model(model, [x])     # or prepare(model).run([x]) repeatedly

Some inputs become opforge attributes: Reshape's shape, Slice's starts, Pad's
pads, TopK's k...  A model normally holds them as initializers, but one may
take them as graph inputs (onnx's node cases do).  ``run`` then converts the
model with those inputs bound to the values given: it finds them by loading,
and on the ``ModelError`` of a converter that needs an input at load time,
binding the graph input that feeds the node's input it names (else one the
message quotes, else the next integer, bool or scalar input) and retrying.
One graph is kept per tuple of bound values.
"""
from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt
import onnx
from onnx.backend.base import Backend, BackendRep

from ..bounded_cache import BoundedCache
from ..errors import ArityError, ModelError, UnsupportedOpError
from .load import DynamicModel, load, read_model

if TYPE_CHECKING:
    from .load import LoadedGraph, ModelSource

__all__ = ["OpforgeBackend", "OpforgeRep", "check_case", "conformance_cases", "converted_op_types", "prepare",
           "run_model", "run_node", "supports_device"]

# Inputs a converter may need at load time: integer and bool tensors (shapes, axes, counts, flags), then
# float scalars (Dropout's ratio, ...).
_BINDABLE = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}
_GRAPHS_PER_MODEL = 16
#: A converted graph's key: (name, dtype, shape, bytes) of each input bound at load time.
_GraphKey: TypeAlias = "tuple[tuple[str, str, tuple[int, ...], bytes], ...]"


class OpforgeRep(BackendRep):  # type: ignore[misc]  # onnx is untyped to mypy: its classes are Any
    """A prepared model: ``run(inputs)`` returns its outputs, in the model's order, as NumPy arrays."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        initializers = {t.name for t in model.graph.initializer}
        self.input_names: list[str] = [i.name for i in model.graph.input if i.name not in initializers]
        self.output_names: list[str] = [o.name for o in model.graph.output]
        self._bindable = _bindable_inputs(model, self.input_names)
        self._bound: tuple[str, ...] | None = None  # the inputs bound at load time, once found
        self._graphs: BoundedCache[_GraphKey, LoadedGraph | DynamicModel] = BoundedCache(_GRAPHS_PER_MODEL)
        self._lock = threading.Lock()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[npt.NDArray[Any], ...]:
        feeds = self._feeds(inputs)
        graph = self._graph_for(feeds)
        result = graph(*[feeds[name] for name in graph.input_names])
        outputs = result if isinstance(result, tuple) else (result,)
        return tuple(np.asarray(out) for out in outputs)

    def _feeds(self, inputs: Any) -> dict[str, npt.NDArray[Any]]:
        if isinstance(inputs, dict):
            unknown = sorted(set(inputs) - set(self.input_names))
            missing = [name for name in self.input_names if name not in inputs]
            if unknown or missing:
                raise ArityError(f"model '{self.model.graph.name}' takes inputs {self.input_names}; "
                                 f"missing {missing}, unknown {unknown}")
            return {name: np.asarray(inputs[name]) for name in self.input_names}
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        inputs = list(inputs)
        if len(inputs) != len(self.input_names):
            raise ArityError(f"model '{self.model.graph.name}' takes {len(self.input_names)} input(s) "
                             f"{self.input_names}, got {len(inputs)}")
        return {name: np.asarray(x) for name, x in zip(self.input_names, inputs)}

    def _graph_for(self, feeds: Mapping[str, npt.NDArray[Any]]) -> LoadedGraph | DynamicModel:
        bound = self._bound
        if bound is not None:
            return self._graphs.get_or_create(
                _key(bound, feeds), lambda: load(self.model, constants={n: feeds[n] for n in bound}))
        with self._lock:
            binding: list[str] = []
            while True:
                try:
                    graph = load(self.model, constants={n: feeds[n] for n in binding})
                except UnsupportedOpError:
                    raise
                except ModelError as error:
                    name = self._next_to_bind(error, binding)
                    if name is None:
                        raise
                    binding.append(name)
                    continue
                # A model that needs run-time values: binding the input they come from gives one graph per
                # value; values computed otherwise are left to the DynamicModel.
                name = self._next_to_bind(ModelError(graph.reason), binding) if isinstance(graph, DynamicModel) \
                    else None
                if name is None:
                    break
                binding.append(name)
            self._bound = tuple(binding)
            self._graphs.put(_key(self._bound, feeds), graph)
            return graph


    def _next_to_bind(self, error: ModelError, bound: Sequence[str]) -> str | None:
        """The input to bind after ``error``: None unless a converter said an input must be known at load
        time; then the graph input feeding the input it names, or one the message quotes, or the next
        integer, bool or scalar input."""
        message = str(error)
        if "known when the model is loaded" not in message:
            return None
        unbound = [name for name in self.input_names if name not in bound]
        named = _input_named(self.model, message)
        if named in unbound:
            return named
        for name in unbound:
            if f"'{name}'" in message:
                return name
        return next((name for name in self._bindable if name not in bound), None)


def _input_named(model: onnx.ModelProto, message: str) -> str | None:
    """The tensor feeding the input that ``message`` (a converter's ModelError: "node '<name or index>'
    (<op_type>): input '<formal name>' must be known...") names, or None."""
    found = re.search(r"node '(.*?)' \((\w+)\): input '(\w+)'", message)
    if found is None:
        return None
    label, op_type, formal = found.groups()
    nodes = list(model.graph.node)
    matching = [n for n in nodes if n.name == label and n.op_type == op_type]
    if not matching and label.isdigit() and int(label) < len(nodes) and nodes[int(label)].op_type == op_type:
        matching = [nodes[int(label)]]
    if len(matching) != 1:
        return None
    node = matching[0]
    opset = max((o.version for o in model.opset_import if o.domain == node.domain), default=None)
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain) if opset else \
            onnx.defs.get_schema(node.op_type, node.domain)
    except Exception:  # noqa: BLE001 -- an op onnx does not define (a custom domain): no formal names
        return None
    formals = [parameter.name for parameter in schema.inputs]
    if formal not in formals or formals.index(formal) >= len(node.input):
        return None
    return node.input[formals.index(formal)] or None


def _bindable_inputs(model: onnx.ModelProto, names: Sequence[str]) -> list[str]:
    """The inputs ``run`` may bind at load time, in the order it tries them."""
    infos = {i.name: i.type.tensor_type for i in model.graph.input}

    def scalar(name: str) -> bool:
        tensor = infos[name]
        return tensor.HasField("shape") and len(tensor.shape.dim) == 0

    integral = [n for n in names if infos[n].elem_type in _BINDABLE]
    return integral + [n for n in names if n not in integral and scalar(n)]


def _key(names: Iterable[str], feeds: Mapping[str, npt.NDArray[Any]]) -> _GraphKey:
    return tuple((name, feeds[name].dtype.str, feeds[name].shape, feeds[name].tobytes()) for name in names)


class OpforgeBackend(Backend):  # type: ignore[misc]  # onnx is untyped to mypy: its classes are Any
    """``onnx.backend.base.Backend`` running models as opforge graphs, on the CPU."""

    @classmethod
    def prepare(cls, model: ModelSource, device: str = "CPU", **kwargs: Any) -> OpforgeRep:
        if not cls.supports_device(device):
            raise ModelError(f"opforge's ONNX backend runs on CPU; device '{device}' is not supported")
        return OpforgeRep(read_model(model))

    @classmethod
    def run_model(cls, model: ModelSource, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[npt.NDArray[Any], ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[npt.DTypeLike, Sequence[int | str | None]]] | None = None,
                 **kwargs: Any) -> tuple[npt.NDArray[Any], ...]:
        """Run one NodeProto on ``inputs`` (a list, in the node's input order, or a dict by input name)."""
        names = [name for name in node.input if name]
        if isinstance(inputs, dict):
            arrays = [np.asarray(inputs[name]) for name in names]
        else:
            arrays = [np.asarray(x) for x in inputs]
        if len(arrays) != len(names):
            raise ArityError(f"node '{node.name}' ({node.op_type}) takes {len(names)} input(s), got {len(arrays)}")
        feeds = dict(reversed(list(zip(names, arrays))))  # a name the node reads twice: its first array
        graph_inputs = [onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(x.dtype), x.shape) for name, x in feeds.items()]
        outputs = [name for name in node.output if name]
        graph_outputs = []
        for k, name in enumerate(outputs):
            if outputs_info is not None and k < len(outputs_info):
                dtype, shape = outputs_info[k]
                graph_outputs.append(onnx.helper.make_tensor_value_info(
                    name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
            else:
                graph_outputs.append(onnx.helper.make_empty_tensor_value_info(name))
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        opsets = [onnx.helper.make_opsetid("", opset)]
        if domain:
            opsets.append(onnx.helper.make_opsetid(domain, 1))
        model = onnx.helper.make_model(
            onnx.helper.make_graph([node], node.name or node.op_type, graph_inputs, graph_outputs),
            opset_imports=opsets)
        return cls.prepare(model, device).run(feeds)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.split(":")[0].upper() == "CPU"


prepare = OpforgeBackend.prepare
run_model = OpforgeBackend.run_model
run_node = OpforgeBackend.run_node
supports_device = OpforgeBackend.supports_device


def converted_op_types(domain: str = "") -> list[str]:
    """The op types of ``domain`` (ai.onnx by default) that opforge's own converters cover, sorted
    (converters users register elsewhere are not counted)."""
    from . import converters, registry

    converters.import_converters()
    domain = registry.normalize_domain(domain)
    return sorted(op for (d, op), entries in list(registry._CONVERTERS.items())
                  if d == domain and any(e.function.__module__.startswith(f"{__package__}.") for e in entries))


def conformance_cases(op_types: Iterable[str] | None = None) -> dict[str, list[Any]]:
    """onnx's node conformance cases by the op they test: {op_type: [TestCase]}.

    A case tests the op of its one node; an ``_expanded`` case (the op's
    function body, several nodes) counts for the op of the case it expands.
    ``op_types`` keeps only those ops.
    """
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):  # making some cases' data overflows on purpose
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    single = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    chosen = None if op_types is None else set(op_types)
    found: dict[str, list[Any]] = {}
    for case in cases:
        op = single.get(re.sub(r"_expanded(_ver\d+)?$", "", case.name)) or single.get(case.name)
        if op is not None and (chosen is None or op in chosen):
            found.setdefault(op, []).append(case)
    return found


def check_case(backend: Any, case: Any) -> None:
    """Run one conformance case (a ``TestCase`` of ``conformance_cases``) with ``backend`` and compare
    as onnx's runner does: exact shapes and dtypes, values within the case's rtol and atol.
    Raises what the backend raises, or AssertionError."""
    from onnx.backend.test.runner import Runner

    def array(x: Any) -> Any:
        return onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x

    rep = backend.prepare(case.model, "CPU")
    for inputs, expected in case.data_sets:
        outputs = rep.run([array(x) for x in inputs])
        Runner.assert_similar_outputs([array(x) for x in expected], list(outputs), rtol=case.rtol, atol=case.atol)
