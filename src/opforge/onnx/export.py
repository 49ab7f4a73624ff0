"""Export an opforge ``Graph`` as an ONNX model: ``opforge.onnx.export(graph, path=None, *, opset=17)``.

Graph inputs and outputs keep their names, dtypes and shapes (an unknown dim
becomes a ``dim_param``), constants become initializers, and each node
becomes ONNX nodes:

- a built-in op through ``EXPORTERS``, the table below: opforge op name ->
  function writing the standard ONNX node(s) from the node's attributes
  (``reduce_sum`` -> ``ReduceSum`` with its axes as an input from opset 13 on,
  as an attribute before; ``dim`` -> ``Shape`` + ``Gather``; ...);
- any other op (a user's) -> one node of its own domain: ``com.example::MyOp``
  is op_type ``MyOp`` in domain ``com.example``, an op without namespace is in
  domain ``opforge``; its attributes are written as ONNX attributes and the
  domain is added to ``opset_import`` (version 1).  opforge ops have no
  decomposition into other ops, so no ``FunctionProto`` is written: a runtime
  needs the op itself (``opforge.onnx.load`` binds such a node back to the op
  of that name).

Layouts do not exist in ONNX: ``reorder`` is an ``Identity``.  A built-in
op with no ONNX form (``slice_grad``) is a ``ModelError`` listing every such
op at once, before anything is written.  The model passes
``onnx.checker.check_model``.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

import numpy as np
import numpy.typing as npt
import onnx
from onnx import helper, numpy_helper

from ..dtypes import to_numpy
from ..errors import ModelError

if TYPE_CHECKING:
    from ..dtypes import DTypeLike
    from ..graph.ir import Graph, Node, Value
    from ..operator import Op
    from ..spec import TensorSpec

__all__ = ["export", "exporter", "EXPORTERS", "MIN_OPSET"]

MIN_OPSET = 11  # Slice, Squeeze and Clip take their inputs as in every later opset
CUSTOM_DOMAIN_VERSION = 1

#: An exporter: writes one node's ONNX form through its NodeExport.
Exporter: TypeAlias = "Callable[[NodeExport], None]"
_E = TypeVar("_E", bound=Exporter)

#: opforge op name -> function(NodeExport) writing the node's ONNX form.
EXPORTERS: dict[str, Exporter] = {}


def exporter(*names: str) -> Callable[[_E], _E]:
    """Register the decorated function as the ONNX form of the opforge ops ``names``."""
    def register(function: _E) -> _E:
        for name in names:
            EXPORTERS[name] = function
        return function
    return register


def elem_type(dtype: DTypeLike) -> int:
    """The ONNX TensorProto element type of an opforge dtype name."""
    onnx_type: int = helper.np_dtype_to_tensor_dtype(to_numpy(dtype))
    return onnx_type


class _ModelBuilder:
    """The ONNX graph being written: nodes, initializers, names in use."""

    def __init__(self, graph: Graph, opset: int) -> None:
        self.graph = graph
        self.opset = opset
        self.names: dict[int, str] = graph.value_names()  # {value id: name}
        self.taken = set(self.names.values())
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.domains: dict[str, int] = {}  # custom domain -> its opset version
        self.counter = 0

    def fresh(self, hint: str) -> str:
        while True:
            self.counter += 1
            name = f"{hint}_{self.counter}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def constant(self, array: npt.ArrayLike, hint: str = "const") -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name


class NodeExport:
    """What an exporter writes one opforge node with.

    ``inputs`` / ``outputs``: the ONNX names of the node's values ("" for an
    omitted optional input); ``attrs``: the node's attribute values;
    ``opset``: the model's ai.onnx opset."""

    def __init__(self, builder: _ModelBuilder, node: Node, inputs: list[str], outputs: list[str]) -> None:
        self.builder = builder
        self.node = node
        self.inputs = inputs
        self.outputs = outputs
        self.attrs: dict[str, Any] = node.attrs
        self.opset = builder.opset

    @property
    def op_name(self) -> str:
        name: str = self.node.op.name
        return name

    def error(self, message: str) -> ModelError:
        return ModelError(f"export: op '{self.op_name}' (node {self.node.name}): {message}")

    def spec(self, k: int = 0) -> TensorSpec:
        spec: TensorSpec = cast("Value", self.node.inputs[k]).spec  # exporters ask for inputs the node has
        return spec

    def rank(self, k: int = 0, why: str = "") -> int:
        rank = self.spec(k).rank
        if rank is None:
            raise self.error(f"input {k} has unknown rank, which its ONNX form needs{why}")
        return rank

    def dtype(self, k: int = 0) -> np.dtype[Any]:
        return to_numpy(self.spec(k).dtype)

    def const(self, value: npt.ArrayLike, dtype: npt.DTypeLike = "int64") -> str:
        """An initializer holding ``value`` (an int64 1-D or 0-d tensor by default); returns its name."""
        return self.builder.constant(np.asarray(value, dtype=dtype), f"{self.node.name}_c")

    def ints(self, values: Iterable[int]) -> str:
        return self.const(list(values))

    def emit(self, op_type: str, inputs: Iterable[str], outputs: int | Sequence[str] = 1, *, domain: str = "",
             **attrs: Any) -> list[str]:
        """Add one ONNX node; ``outputs`` is a list of names or a count of new ones.  Returns the output names;
        attributes whose value is None are left out."""
        if isinstance(outputs, int):
            outputs = [self.builder.fresh(f"{self.node.name}_{op_type.lower()}") for _ in range(outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.builder.nodes.append(helper.make_node(op_type, list(inputs), list(outputs),
                                                   name=self.builder.fresh(self.node.name), domain=domain, **attrs))
        return list(outputs)

    def result(self, op_type: str, inputs: Iterable[str], **attrs: Any) -> list[str]:
        """Add the node computing this opforge node's outputs."""
        return self.emit(op_type, inputs, self.outputs, **attrs)


# --------------------------------------------------------------------------
# The table: built-in ops.

def _same(op_type: str, *attr_names: str) -> Exporter:
    """An op that is one ONNX node of the same inputs, with attributes copied under the names given as
    ``onnx_name=opforge_name`` pairs ("alpha" alone keeps the name)."""
    def write(e: NodeExport) -> None:
        attrs = {}
        for pair in attr_names:
            onnx_name, _, name = pair.partition("=")
            attrs[onnx_name] = e.attrs[name or onnx_name]
        e.result(op_type, e.inputs, **attrs)
    return write


for _name, _op_type in {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "neg": "Neg",
                        "abs": "Abs", "sqrt": "Sqrt", "log": "Log", "exp": "Exp", "tanh": "Tanh", "relu": "Relu",
                        "maximum": "Max", "minimum": "Min", "matmul": "MatMul", "where": "Where",
                        "equal": "Equal", "less": "Less", "greater": "Greater", "sigmoid": "Sigmoid", "erf": "Erf",
                        "sum": "Sum", "global_average_pool": "GlobalAveragePool",
                        "reorder": "Identity"}.items():  # a layout is storage only: the values are the same
    EXPORTERS[_name] = _same(_op_type)
EXPORTERS["leaky_relu"] = _same("LeakyRelu", "alpha")
EXPORTERS["concat"] = _same("Concat", "axis")
EXPORTERS["hard_sigmoid"] = _same("HardSigmoid", "alpha", "beta")
EXPORTERS["gather"] = _same("Gather", "axis")
EXPORTERS["batch_norm"] = _same("BatchNormalization", "epsilon")
EXPORTERS["lrn"] = _same("LRN", "size", "alpha", "beta", "bias")
EXPORTERS["gather_elements"] = _same("GatherElements", "axis")
for _name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"):
    EXPORTERS[_name] = _same(_name.title())
del _name, _op_type


@exporter("not_equal")
def _(e: NodeExport) -> None:
    e.result("Not", e.emit("Equal", e.inputs))


@exporter("less_equal", "greater_equal")
def _(e: NodeExport) -> None:
    # LessOrEqual / GreaterOrEqual exist from opset 12; before, the negation of the strict opposite.
    if e.opset >= 12:
        e.result("LessOrEqual" if e.op_name == "less_equal" else "GreaterOrEqual", e.inputs)
    else:
        e.result("Not", e.emit("Greater" if e.op_name == "less_equal" else "Less", e.inputs))


@exporter("mod")
def _(e: NodeExport) -> None:
    if e.attrs["fmod"] or e.dtype(0).kind in "iu":
        e.result("Mod", e.inputs, fmod=int(e.attrs["fmod"]))
        return
    # ONNX Mod of floats is fmod only: the remainder takes b's sign where it is non-zero and its sign differs
    a, b = e.inputs
    remainder = e.emit("Mod", [a, b], fmod=1)
    zero = e.const(0, e.dtype(0))
    nonzero = e.emit("Not", e.emit("Equal", remainder + [zero]))
    signs_differ = e.emit("Not", e.emit("Equal", e.emit("Less", remainder + [zero]) + e.emit("Less", [b, zero])))
    e.result("Where", e.emit("And", nonzero + signs_differ) + e.emit("Add", remainder + [b]) + remainder)


@exporter("cast")
def _(e: NodeExport) -> None:
    e.result("Cast", e.inputs, to=elem_type(e.attrs["dtype"]))


@exporter("softmax")
def _(e: NodeExport) -> None:
    axis = e.attrs["axis"]
    if e.opset >= 13 or axis == -1:  # before 13, Softmax flattens at axis: the same only for the last axis
        e.result("Softmax", e.inputs, axis=axis)
        return
    rank = e.rank(0, " (softmax over an axis other than the last, at opset < 13)")
    axis %= rank
    if axis == rank - 1:
        e.result("Softmax", e.inputs, axis=axis)
        return
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    inner = e.emit("Softmax", e.emit("Transpose", e.inputs, perm=perm), axis=rank - 1)
    e.result("Transpose", inner, perm=perm)


def _axes_op(op_type: str, axes_input_since: int = 13) -> Exporter:
    """An op whose axes are an input from opset ``axes_input_since``, an attribute before; a reduction's
    ``keep_dims`` is ``keepdims``."""
    def write(e: NodeExport) -> None:
        axes, keep_dims = list(e.attrs["axes"]), e.attrs.get("keep_dims")
        keepdims = None if keep_dims is None else int(keep_dims)
        if e.opset >= axes_input_since:
            e.result(op_type, e.inputs + ([e.ints(axes)] if axes else []), keepdims=keepdims)
        else:
            e.result(op_type, e.inputs, axes=axes or None, keepdims=keepdims)
    return write


EXPORTERS["reduce_sum"] = _axes_op("ReduceSum")
EXPORTERS["mean"] = _axes_op("ReduceMean", 18)
EXPORTERS["squeeze"] = _axes_op("Squeeze")
EXPORTERS["unsqueeze"] = _axes_op("Unsqueeze")


@exporter("reshape")
def _(e: NodeExport) -> None:
    shape = list(e.attrs["shape"])
    if 0 in shape:  # opforge's 0 is an empty dim; ONNX's copies the input's dim unless allowzero
        if e.opset < 14:
            raise e.error(f"shape {shape} has a 0 dim, which ONNX Reshape takes literally only from opset 14 "
                          "(allowzero)")
        e.result("Reshape", [e.inputs[0], e.ints(shape)], allowzero=1)
    else:
        e.result("Reshape", [e.inputs[0], e.ints(shape)])


@exporter("transpose")
def _(e: NodeExport) -> None:
    perm = list(e.attrs.get("perm") or ())
    if not perm:  # swap the last two axes
        rank = e.rank(0, " (transpose of the last two axes)")
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    e.result("Transpose", e.inputs, perm=perm)


@exporter("slice")
def _(e: NodeExport) -> None:
    starts = list(e.attrs["starts"])
    inputs = [e.inputs[0], e.ints(starts), e.ints(e.attrs["ends"])]
    axes, steps = list(e.attrs["axes"]), list(e.attrs["steps"])
    if axes or steps:
        inputs.append(e.ints(axes or range(len(starts))))
    if steps:
        inputs.append(e.ints(steps))
    e.result("Slice", inputs)


@exporter("dim")
def _(e: NodeExport) -> None:
    shape = e.emit("Shape", e.inputs[:1])
    if e.attrs["dtype"] == "int64":
        e.result("Gather", shape + [e.const(e.attrs["axis"])], axis=0)
    else:
        e.result("Cast", e.emit("Gather", shape + [e.const(e.attrs["axis"])], axis=0),
                 to=elem_type(e.attrs["dtype"]))


@exporter("relu_grad")
def _(e: NodeExport) -> None:  # dy where y > 0, else 0
    dy, y = e.inputs
    zero = e.const(0, e.dtype(1))
    e.result("Where", e.emit("Greater", [y, zero]) + [dy, e.const(0, e.dtype(0))])


@exporter("leaky_relu_grad")
def _(e: NodeExport) -> None:  # dy where x > 0, else alpha * dy
    dy, x = e.inputs
    scaled = e.emit("Mul", [dy, e.const(np.float32(e.attrs["alpha"]), e.dtype(0))])
    e.result("Where", e.emit("Greater", [x, e.const(0, e.dtype(1))]) + [dy] + scaled)


@exporter("clip")
def _(e: NodeExport) -> None:  # from opset 11 min and max are inputs; an infinite bound is left out
    if e.dtype(0).kind in "iu" and e.opset < 12:
        raise e.error(f"ONNX Clip takes {e.dtype(0)} from opset 12; the model's is {e.opset}")
    bounds = [e.const(e.attrs[k], e.dtype(0)) if math.isfinite(e.attrs[k]) else "" for k in ("min", "max")]
    e.result("Clip", [e.inputs[0]] + (bounds if bounds[1] else bounds[:1] if bounds[0] else []))


@exporter("gelu")
def _(e: NodeExport) -> None:  # an op from opset 20; before, its formula
    x, approximate = e.inputs[0], e.attrs["approximate"]
    if e.opset >= 20:
        e.result("Gelu", [x], approximate=approximate)
        return

    def c(value: float) -> str:
        return e.const(value, e.dtype(0))
    if approximate == "tanh":  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        cube = e.emit("Mul", e.emit("Mul", [x, x]) + [x])
        inner = e.emit("Add", [x] + e.emit("Mul", cube + [c(0.044715)]))
        core = e.emit("Tanh", e.emit("Mul", inner + [c(math.sqrt(2 / math.pi))]))
    else:  # 0.5 x (1 + erf(x / sqrt 2))
        core = e.emit("Erf", e.emit("Mul", [x, c(1 / math.sqrt(2))]))
    e.result("Mul", e.emit("Mul", [x, c(0.5)]) + e.emit("Add", core + [c(1.0)]))


@exporter("shape")
def _(e: NodeExport) -> None:
    start, end = e.attrs["start"], e.attrs["end"]
    end = None if end >= 2 ** 63 - 1 else end
    if e.opset >= 15:
        e.result("Shape", e.inputs, start=start or None, end=end)
    elif start == 0 and end is None:
        e.result("Shape", e.inputs)
    else:
        e.result("Slice", e.emit("Shape", e.inputs) + [e.ints([start]), e.ints([2 ** 63 - 1 if end is None else end])])


@exporter("constant_of_shape")
def _(e: NodeExport) -> None:  # the value is a tensor input here, an attribute in ONNX's ConstantOfShape: expand it
    e.result("Expand", e.emit("Reshape", [e.inputs[0], e.ints([])]) + [e.ints(e.attrs["shape"])])


@exporter("expand")
def _(e: NodeExport) -> None:
    e.result("Expand", [e.inputs[0], e.ints(e.attrs["shape"])])


@exporter("tile")
def _(e: NodeExport) -> None:
    e.result("Tile", [e.inputs[0], e.ints(e.attrs["repeats"])])


@exporter("topk")
def _(e: NodeExport) -> None:
    e.result("TopK", [e.inputs[0], e.ints([e.attrs["k"]])], axis=e.attrs["axis"], largest=int(e.attrs["largest"]),
             sorted=int(e.attrs["sorted"]))


@exporter("gemm")
def _(e: NodeExport) -> None:
    e.result("Gemm", e.inputs, alpha=e.attrs["alpha"], beta=e.attrs["beta"], transA=int(e.attrs["trans_a"]),
             transB=int(e.attrs["trans_b"]))


def conv_attributes(e: NodeExport) -> dict[str, Any]:
    return {"strides": list(e.attrs["strides"]) or None, "pads": list(e.attrs["pads"]) or None,
            "dilations": list(e.attrs["dilations"]) or None, "group": e.attrs["group"]}


@exporter("conv")
def _(e: NodeExport) -> None:
    if e.attrs.get("activation", "none") == "relu":  # a relu the graph passes folded in: ONNX's Conv, then Relu
        e.result("Relu", e.emit("Conv", e.inputs, **conv_attributes(e)))
    else:
        e.result("Conv", e.inputs, **conv_attributes(e))


@exporter("conv_transpose")
def _(e: NodeExport) -> None:
    e.result("ConvTranspose", e.inputs, output_padding=list(e.attrs["output_padding"]) or None, **conv_attributes(e))


@exporter("pad")
def _(e: NodeExport) -> None:
    mode = e.attrs["mode"]
    if mode == "wrap" and e.opset < 19:
        raise e.error(f"mode 'wrap' needs opset 19 or later (ONNX Pad); the model's is {e.opset}")
    inputs = [e.inputs[0], e.ints(e.attrs["pads"])]
    if mode == "constant":  # the value crosses the kernel ABI as a float32: the same rounding here
        inputs.append(e.const(np.float32(e.attrs["value"]), e.dtype(0)))
    e.result("Pad", inputs, mode=mode)


@exporter("gather_nd")
def _(e: NodeExport) -> None:
    batch_dims = e.attrs["batch_dims"]
    if batch_dims and e.opset < 12:
        raise e.error(f"batch_dims {batch_dims} needs opset 12 or later (ONNX GatherND); the model's is {e.opset}")
    e.result("GatherND", e.inputs, batch_dims=batch_dims or None)


@exporter("scatter_elements", "scatter_nd")
def _(e: NodeExport) -> None:
    # ONNX's reduction attribute: add and mul from opset 16, max and min from 18; "none" is the default.
    reduction = e.attrs["reduction"]
    since = {"none": 11, "add": 16, "mul": 16, "max": 18, "min": 18}[reduction]
    if e.opset < since:
        raise e.error(f"reduction {reduction!r} needs opset {since} or later; the model's is {e.opset}")
    if e.attrs.get("batch_dims", 0):
        raise e.error(f"batch_dims {e.attrs['batch_dims']}: ONNX ScatterND has no batch dims (only 0 exports)")
    axis = {"axis": e.attrs["axis"]} if e.op_name == "scatter_elements" else {}
    e.result("ScatterElements" if e.op_name == "scatter_elements" else "ScatterND", e.inputs,
             reduction=reduction if reduction != "none" else None, **axis)


def reduce_mean(e: NodeExport, x: str, axes: list[int]) -> list[str]:
    """ReduceMean over ``axes`` keeping dims (axes an input from opset 18); returns the output's names."""
    if e.opset >= 18:
        return e.emit("ReduceMean", [x, e.ints(axes)], keepdims=1)
    return e.emit("ReduceMean", [x], axes=axes, keepdims=1)


@exporter("layer_norm")
def _(e: NodeExport) -> None:
    x, scale, bias = (e.inputs + ["", ""])[:3]
    axis, epsilon = e.attrs["axis"], e.attrs["epsilon"]
    # LayerNormalization (opset 17) computes Mean and InvStdDev in float32: the op itself for float32 x only
    if e.opset >= 17 and e.spec(0).dtype == "float32":
        e.result("LayerNormalization", [x, scale] + ([bias] if bias else []), axis=axis, epsilon=epsilon)
        return
    rank = e.rank(0, " (layer_norm before opset 17 or of a dtype other than float32 is written as its formula)")
    axes = list(range(axis % rank, rank))
    mean = reduce_mean(e, x, axes)
    centered = e.emit("Sub", [x] + mean)
    variance = reduce_mean(e, e.emit("Mul", centered + centered)[0], axes)
    e.emit("Reciprocal", e.emit("Sqrt", e.emit("Add", variance + [e.const(epsilon, e.dtype(0))])), e.outputs[2:3])
    e.emit("Identity", mean, e.outputs[1:2])
    scaled = e.emit("Mul", e.emit("Mul", centered + e.outputs[2:3]) + [scale], 1 if bias else e.outputs[:1])
    if bias:
        e.emit("Add", scaled + [bias], e.outputs[:1])


@exporter("resize")
def _(e: NodeExport) -> None:
    a = e.attrs
    scales, sizes, axes, roi = list(a["scales"]), list(a["sizes"]), list(a["axes"]), list(a["roi"])
    transform, policy = a["coordinate_transformation_mode"], a["keep_aspect_ratio_policy"]
    needs = [(transform == "half_pixel_symmetric", 19, f"coordinate_transformation_mode '{transform}'"),
             (bool(a["antialias"]), 18, "antialias"), (policy != "stretch", 18, f"keep_aspect_ratio_policy '{policy}'")]
    for used, since, what in needs:
        if used and e.opset < since:
            raise e.error(f"{what} needs opset {since} or later (ONNX Resize); the model's is {e.opset}")
    if transform == "tf_half_pixel_for_nn" and e.opset >= 13:
        raise e.error(f"coordinate_transformation_mode '{transform}' exists in ONNX Resize before opset 13 only; "
                      f"the model's is {e.opset}")
    if axes and e.opset < 18:  # no axes attribute yet: every axis, the others kept
        rank = e.rank(0, " (resize of some axes before opset 18)")
        axes = [axis % rank for axis in axes]
        if sizes:
            dims = e.spec(0).shape
            if any(dims[k] < 0 for k in range(rank) if k not in axes):
                raise e.error(f"resizing axes {axes} of a tensor with unknown dims {list(dims)} elsewhere needs "
                              "opset 18 (the axes attribute)")
            sizes = [sizes[axes.index(k)] if k in axes else dims[k] for k in range(rank)]
        else:
            scales = [scales[axes.index(k)] if k in axes else 1.0 for k in range(rank)]
        if roi:
            roi = [roi[axes.index(k)] if k in axes else 0.0 for k in range(rank)] + \
                  [roi[len(axes) + axes.index(k)] if k in axes else 1.0 for k in range(rank)]
        axes = []
    empty = e.const([], "float32") if e.opset < 13 else ""  # roi and scales are required inputs before 13
    inputs = [e.inputs[0], e.const(roi, "float32") if roi else empty, e.const(scales, "float32") if scales else empty]
    if sizes:
        inputs.append(e.ints(sizes))
    while not inputs[-1]:
        inputs.pop()
    newer = {"antialias": int(a["antialias"]), "keep_aspect_ratio_policy": policy, "axes": axes or None} \
        if e.opset >= 18 else {}
    e.result("Resize", inputs, mode=a["mode"], coordinate_transformation_mode=transform,
             nearest_mode=a["nearest_mode"], cubic_coeff_a=a["cubic_coeff_a"],
             exclude_outside=int(a["exclude_outside"]), extrapolation_value=a["extrapolation_value"], **newer)


def pool_attributes(e: NodeExport, dilations_since: int) -> dict[str, Any]:
    """kernel_shape, strides, pads, dilations, ceil_mode of a pooling node, defaults left out."""
    dilations = list(e.attrs.get("dilations") or ())
    if any(d != 1 for d in dilations) and e.opset < dilations_since:
        raise e.error(f"dilations {dilations} need opset {dilations_since} or later (ONNX "
                      f"{'MaxPool' if dilations_since == 10 else 'AveragePool'}); the model's is {e.opset}")
    return {"kernel_shape": list(e.attrs["kernel_shape"]), "strides": list(e.attrs["strides"]) or None,
            "pads": list(e.attrs["pads"]) or None,
            "dilations": dilations if any(d != 1 for d in dilations) else None,
            "ceil_mode": int(e.attrs["ceil_mode"]) or None}


@exporter("max_pool", "max_pool_with_indices")
def _(e: NodeExport) -> None:
    e.result("MaxPool", e.inputs, storage_order=e.attrs["storage_order"] or None, **pool_attributes(e, 10))


@exporter("average_pool")
def _(e: NodeExport) -> None:
    e.result("AveragePool", e.inputs, count_include_pad=int(e.attrs["count_include_pad"]) or None,
             **pool_attributes(e, 19))


@exporter("quantize_linear", "dequantize_linear")
def _(e: NodeExport) -> None:
    # ONNX has no float64 scale; per-axis scales need opset 13, blocks and 16-bit types opset 21.
    quantize = e.op_name == "quantize_linear"
    scale, zero_point = e.spec(1), e.spec(2)
    if scale.dtype != "float32":
        raise e.error(f"the scale is {scale.dtype}; ONNX's {'Q' if quantize else 'Deq'}uantizeLinear takes float32 "
                      "(cast the op's inputs to float32 first)")
    block = e.attrs["block_size"]
    per_tensor = scale.rank == 0 or (scale.rank == 1 and scale.shape[0] == 1)
    need = 21 if block or zero_point.dtype in ("int16", "uint16") else 10 if per_tensor else 13
    if e.opset < need:
        raise e.error(f"this quantization (scale {list(scale.shape)}, block_size {block}, {zero_point.dtype}) "
                      f"needs opset {need}; exporting at {e.opset}")
    e.result("QuantizeLinear" if quantize else "DequantizeLinear", e.inputs,
             axis=None if per_tensor else e.attrs["axis"], block_size=block or None)


@exporter("dynamic_quantize_linear")
def _(e: NodeExport) -> None:
    e.result("DynamicQuantizeLinear", e.inputs)


@exporter("cumsum")
def _(e: NodeExport) -> None:  # the axis is an input in ONNX (opset 11 on)
    if e.opset < 11:
        raise e.error(f"ONNX has CumSum from opset 11; the model's opset is {e.opset}")
    e.result("CumSum", [e.inputs[0], e.const(e.attrs["axis"])], exclusive=int(e.attrs["exclusive"]),
             reverse=int(e.attrs["reverse"]))


@exporter("trilu")
def _(e: NodeExport) -> None:
    if e.opset < 14:
        raise e.error(f"ONNX has Trilu from opset 14; the model's opset is {e.opset}")
    e.result("Trilu", [e.inputs[0], e.const(e.attrs["k"])], upper=int(e.attrs["upper"]))


@exporter("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not")
def _(e: NodeExport) -> None:
    op_type = e.op_name.title().replace("_", "")
    if e.opset < 18:
        raise e.error(f"ONNX has {op_type} from opset 18; the model's opset is {e.opset} (export with opset=18 "
                      "or later)")
    e.result(op_type, e.inputs)


@exporter("left_shift", "right_shift")
def _(e: NodeExport) -> None:  # unsigned integers from opset 11; signed ones from opset 28
    if e.opset < 11 or (e.dtype(0).kind == "i" and e.opset < 28):
        raise e.error(f"ONNX has BitShift of {e.dtype(0).name} from opset {28 if e.dtype(0).kind == 'i' else 11}; "
                      f"the model's opset is {e.opset}")
    e.result("BitShift", e.inputs, direction="LEFT" if e.op_name == "left_shift" else "RIGHT")


# --------------------------------------------------------------------------
# User ops: a node of their own domain.

def split_name(name: str) -> tuple[str, str]:
    """``com.example::MyOp`` -> (``com.example``, ``MyOp``); ``a::b::op`` -> (``a.b``, ``op``); no namespace ->
    domain ``opforge``."""
    namespace, _, op_type = name.rpartition("::")
    return (namespace.replace("::", ".") or "opforge"), op_type


def onnx_attribute(value: Any) -> int | float | str | list[int] | list[float] | None:
    """An opforge attribute value as something ``helper.make_attribute`` writes with the matching ONNX type:
    bool -> INT, DType and str -> STRING, Shape / int[] -> INTS, float[] -> FLOATS.  Nested lists have no ONNX
    attribute type: None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, tuple):
        if any(isinstance(v, tuple) for v in value):
            return None
        if any(isinstance(v, float) for v in value):
            return [float(v) for v in value]
        return [int(v) for v in value]
    return None


def _user_op(e: NodeExport) -> None:
    domain, op_type = split_name(e.op_name)
    plain: dict[str, int | float | str | list[int] | list[float]] = {}
    made: list[onnx.AttributeProto] = []
    for name, value in e.attrs.items():
        if value is None:  # an optional attribute not given
            continue
        converted = onnx_attribute(value)
        if converted is None:
            raise e.error(f"attribute '{name}' = {value!r} has no ONNX attribute type (nested lists and "
                          "None-valued attributes are not exportable)")
        if isinstance(converted, list) and not converted:  # an empty list has no element type in ONNX
            attr_def = e.node.op.attrs.get(name)
            kind = onnx.AttributeProto.FLOATS if attr_def is not None and attr_def.type == "float[]" \
                else onnx.AttributeProto.INTS
            made.append(helper.make_attribute(name, [], attr_type=kind))
        else:
            plain[name] = converted
    e.builder.domains[domain] = CUSTOM_DOMAIN_VERSION
    e.result(op_type, e.inputs, domain=domain, **plain)
    e.builder.nodes[-1].attribute.extend(made)


def is_builtin(op: Op) -> bool:
    """Whether ``op`` is one of opforge's built-in ops (declared in ``opforge.builtins``)."""
    functions = [op.infer_fn, op.check_fn, op.grad_rule] + [getattr(k, "fn", None) for k in op.kernels]
    return any(getattr(f, "__module__", "").startswith("opforge.builtins") for f in functions if f is not None)


# --------------------------------------------------------------------------

def _value_info(graph: Graph, name: str, spec: TensorSpec, what: str) -> onnx.ValueInfoProto:
    if spec.rank is None:  # the checker requires a shape for every graph input and output
        raise ModelError(f"export: graph '{graph.name}': {what} '{name}' has unknown rank; an ONNX graph's inputs "
                         "and outputs have a rank (trace with a TensorSpec of known rank, None for unknown dims)")
    shape = [d if d >= 0 else f"{name}_dim{k}" for k, d in enumerate(spec.shape)]
    return helper.make_tensor_value_info(name, elem_type(spec.dtype), shape)


def export(graph: Graph, path: str | os.PathLike[str] | None = None, *, opset: int = 17) -> onnx.ModelProto:
    """The ONNX model of ``graph`` (an opforge ``Graph``); written to ``path`` when given.

    ``opset`` is the ai.onnx opset the model imports (from ``MIN_OPSET`` to the installed onnx's newest).  Raises
    ``ModelError`` listing every op with no ONNX form, or for an attribute value ONNX cannot express."""
    from ..graph.ir import Graph
    from .load import DynamicModel

    if isinstance(graph, DynamicModel):
        raise ModelError(f"export: model '{graph.name}' computes its shapes at run time, so it has a graph per input "
                         f"signature; export one: export(model.specialize(x, ...)) ({graph.reason})")
    if not isinstance(graph, Graph):
        raise ModelError(f"export takes an opforge Graph, got {type(graph).__name__}")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ModelError(f"export: path must be a file path (str or os.PathLike), got {type(path).__name__}")
    newest = onnx.defs.onnx_opset_version()
    if not isinstance(opset, int) or isinstance(opset, bool) or not MIN_OPSET <= opset <= newest:
        raise ModelError(f"export: opset must be an int from {MIN_OPSET} to {newest}, got {opset!r}")
    missing = sorted({node.op.name for node in graph.nodes if not node.is_constant
                      and node.op.name not in EXPORTERS and is_builtin(node.op)})
    if missing:
        raise ModelError(f"export: graph '{graph.name}' holds op(s) with no ONNX form: {', '.join(missing)}")

    builder = _ModelBuilder(graph, opset)
    names = builder.names
    graph_inputs = [_value_info(graph, names[v.id], v.spec, "input") for v in graph.inputs]
    for node in graph.nodes:
        if node.is_constant:
            builder.initializers.append(numpy_helper.from_array(node.value, names[node.outputs[0].id]))
            continue
        inputs = ["" if v is None else names[v.id] for v in node.inputs]
        while inputs and not inputs[-1]:
            inputs.pop()
        entry = NodeExport(builder, node, inputs, [names[v.id] for v in node.outputs])
        EXPORTERS.get(node.op.name, _user_op)(entry)

    # ONNX graph outputs must be node outputs with distinct names: an output that is a graph input, a constant
    # or listed twice is copied by an Identity.
    outputs: list[onnx.ValueInfoProto] = []
    seen: set[str] = set()
    plain = {names[v.id] for n in graph.nodes if not n.is_constant for v in n.outputs}
    for value in graph.outputs:
        name = names[value.id]
        if name in seen or name not in plain:
            copy = builder.fresh(f"{name}_out")
            builder.nodes.append(helper.make_node("Identity", [name], [copy], name=builder.fresh("identity")))
            name = copy
        seen.add(name)
        outputs.append(_value_info(graph, name, value.spec, "output"))

    onnx_graph = helper.make_graph(builder.nodes, graph.name, graph_inputs, outputs, initializer=builder.initializers)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in sorted(builder.domains.items())]
    model = helper.make_model(onnx_graph, opset_imports=opsets, producer_name="opforge",
                              ir_version=helper.find_min_ir_version_for(opsets, ignore_unknown=True))
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        raise ModelError(f"export: graph '{graph.name}' gives an invalid ONNX model: {str(error).splitlines()[0]}") \
            from None
    if path is not None:
        try:
            onnx.save(model, os.fspath(path))
        except OSError as error:
            raise ModelError(f"export: cannot write '{path}': {error.strerror or error}") from None
    return model
