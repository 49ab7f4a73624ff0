"""Converters of ONNX's shape and indexing ops: Reshape, Transpose, Concat,
Squeeze, Unsqueeze, Slice, Shape, Size, ConstantOfShape, Constant, Gather,
Split, Tile, TopK, Flatten, Expand.

Inputs that become opforge attributes (Reshape's shape, Slice's starts, the
axes of Squeeze from opset 13, ...) must be known when the model loads
(``node.constant``).  Shape of a tensor whose dims are all known is a
constant, so the Shape -> Gather -> Concat -> Reshape chains exporters
write fold away while the model loads; with unknown dims, those chains
still give Reshape and Expand a pattern they can use (see KNOWN below).
Split becomes one slice per output (an opforge op has a fixed number of
outputs).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from ..builtins.slice import index_of
from ..dtypes import ABI_DTYPES
from ..errors import TracingError
from ..graph.symbolic import SymDim
from ..spec import UNKNOWN_RANK
from .elementwise import dims_of
from .registry import converter

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy.typing as npt

    from .registry import NodeContext

# Tensors here are traced Values, or np.ndarrays known when the model loads: typed Any.
ops = opforge.ops
INT64_MAX = 2**63 - 1


def rank_of(node: NodeContext, x: Any, what: str = "input 'data'") -> int:
    dims = dims_of(x)
    if dims == UNKNOWN_RANK:
        raise node.unknown(f"the rank of {what} must be known when the model is loaded")
    return len(dims)


def ints(node: NodeContext, x: Any, what: str) -> list[int]:
    """A constant input as a list of Python ints."""
    return [int(v) for v in np.asarray(node.constant(x, what)).reshape(-1)]


# -- shape tensors computed at run time --------------------------------------------------
# Shape of a tensor with unknown dims runs at run time, but which dims its elements are is known
# while loading.  Traced values carry that as an object array of ints and SymDims (KNOWN), which
# Gather, Unsqueeze, Squeeze, Slice and Concat carry along, so Reshape(x, Concat(Unsqueeze(Gather(
# Shape(x), 0)), [-1])) -- x.view(x.size(0), -1) exported -- still reshapes with a known pattern.
KNOWN = "_onnx_known_elements"


def known_elements(x: Any) -> npt.NDArray[np.object_] | None:
    """x's elements as an object array of ints and SymDims, or None when they exist only at run time."""
    if x is None:
        return None
    if isinstance(x, (np.ndarray, np.generic, int)):
        array = np.asarray(x)
        return array.astype(object) if array.dtype.kind in "iu" else None
    known: npt.NDArray[np.object_] | None = getattr(x, KNOWN, None)
    return known


def with_known(value: Any, elements: npt.NDArray[np.object_] | None) -> Any:
    """value, with ``elements`` recorded on it when it is a traced value."""
    if elements is not None and not isinstance(value, np.ndarray) and hasattr(value, "spec"):
        setattr(value, KNOWN, elements)
    return value


def same_dim(a: object, b: object) -> bool:
    """Whether a and b are the same size for every input (a SymDim against a SymDim or an int)."""
    try:
        return bool(a == b)
    except TracingError:  # not decided by arithmetic: the same dim of the same value is still the same
        return type(a) is type(b) and hash(a) == hash(b) and repr(a) == repr(b)


def carry(result: Any, function: Callable[..., Any], *inputs: Any) -> Any:
    """result, knowing ``function`` of the inputs' known elements when they all have some."""
    if isinstance(result, np.ndarray) or not all(isinstance(x, np.ndarray) or hasattr(x, "spec") for x in inputs):
        return result
    known = [known_elements(x) for x in inputs]
    if any(k is None for k in known):
        return result
    try:
        elements = np.asarray(function(*known), dtype=object)
    except (ValueError, IndexError, TypeError, TracingError):  # not what the op computed: know nothing
        return result
    return with_known(result, elements) if elements.shape == dims_of(result) else result


def object_array(items: Sequence[object]) -> npt.NDArray[np.object_]:
    array = np.empty(len(items), object)
    for k, item in enumerate(items):
        array[k] = item
    return array


# -- Reshape, Flatten --------------------------------------------------------------

def reshaped(node: NodeContext, data: Any, shape: Sequence[int], allowzero: bool = False,
             copies: Sequence[int] = (), unknown: Sequence[int] = ()) -> Any:
    """data reshaped to ONNX ``shape``: 0 copies data's dim (unless allowzero), one -1 is inferred.
    ``copies``: further positions that copy data's dim; ``unknown``: positions whose size is known only at
    run time (found from the others when they allow)."""
    dims = dims_of(data)
    target = list(shape)
    shown = [("?" if k in unknown else "(copied)" if k in copies else d) for k, d in enumerate(target)]
    if target.count(-1) > 1:
        raise node.error(f"input 'shape' {shown} has more than one -1")
    if any(d < -1 for d in target):
        raise node.error(f"input 'shape' {shown} has a dim below -1")
    zeros = [] if allowzero else [k for k, d in enumerate(target) if d == 0 and k not in unknown]
    copied = sorted(set(copies) | set(zeros))
    if copied:
        if dims == UNKNOWN_RANK or max(copied) >= len(dims):
            raise node.error(f"input 'shape' {shown} copies dims (0 entries) of input 'data' of shape "
                             f"{'unknown rank' if dims == UNKNOWN_RANK else list(dims)}, which it does not have")
        for k in copied:
            target[k] = dims[k]
    for k in unknown:
        target[k] = -1
    unknown = [k for k, d in enumerate(target) if d == -1]
    if len(unknown) > 1 and dims != UNKNOWN_RANK:
        # A -1 beside copied unknown dims: its size is what the dims not copied hold, if they are known.
        rest = [d for k, d in enumerate(dims) if k not in copied]
        fixed = [d for k, d in enumerate(target) if k not in copied and d != -1]
        if -1 not in rest and len(unknown) - 1 == sum(dims[k] == -1 for k in copied):
            size, known = int(np.prod(rest)), int(np.prod(fixed))
            if known == 0 or size % known:
                raise node.error(f"cannot reshape input 'data' of shape {list(dims)} into {shown}")
            target[next(k for k in unknown if k not in copied)] = size // known
            unknown = [k for k in unknown if k in copied]
    if len(unknown) > 1:
        raise node.unknown(f"reshaping input 'data' of shape {list(dims)} into {shown} leaves "
                         f"{len(unknown)} dims unknown when the model is loaded; opforge's reshape takes one")
    return ops.reshape(data, shape=target)


@converter("Reshape", since=1)
def reshape_v1(node: NodeContext, data: Any) -> Any:
    return reshaped(node, data, node.attr("shape", []))


@converter("Reshape", since=5)
def reshape_v5(node: NodeContext, data: Any, shape: Any) -> Any:
    allowzero = bool(node.attr("allowzero", 0))
    known = None if isinstance(shape, np.ndarray) else known_elements(shape)
    if known is None:
        return reshaped(node, data, ints(node, shape, "input 'shape'"), allowzero)
    # Computed at run time from dims (x.size(0) and friends): an unknown dim of data at its own
    # position is a copy; any other unknown entry is found from the rest, if it can be.
    target, copies, unknown = [], [], []
    dims = data.shape if dims_of(data) != UNKNOWN_RANK and not isinstance(data, np.ndarray) else None
    for k, entry in enumerate(known.reshape(-1)):
        if isinstance(entry, SymDim):
            if dims is not None and k < len(dims) and same_dim(entry, dims[k]):
                copies.append(k)
            else:
                unknown.append(k)
            target.append(0)
        else:
            target.append(int(entry))
    return reshaped(node, data, target, allowzero, copies, unknown)


@converter("Flatten", since=1)
def flatten(node: NodeContext, x: Any) -> Any:
    dims = dims_of(x)
    rank = rank_of(node, x, "input 'input'")
    axis = node.attr("axis", 1)
    if not -rank <= axis <= rank:
        raise node.error(f"attribute 'axis' {axis} is out of range for input of rank {rank} "
                         f"(valid: {-rank}..{rank})")
    axis += rank if axis < 0 else 0
    halves = [dims[:axis], dims[axis:]]
    target = [-1 if -1 in half else int(np.prod(half)) for half in halves]
    if target == [-1, -1]:
        raise node.unknown(f"flattening input of shape {list(dims)} at axis {axis} leaves both output dims "
                         "unknown when the model is loaded; opforge's reshape takes one")
    return ops.reshape(x, shape=target)


# -- Transpose, Concat -------------------------------------------------------------

@converter("Transpose", since=1)
def transpose(node: NodeContext, data: Any) -> Any:
    perm = node.attr("perm")
    if perm is None:  # ONNX's default reverses the axes
        perm = list(range(rank_of(node, data)))[::-1]
    if not perm:  # a 0-d tensor: nothing moves
        return data
    return ops.transpose(data, perm=list(perm))


@converter("Concat", since=1)
def concat(node: NodeContext, *inputs: Any) -> Any:
    present = [x for x in inputs if x is not None]
    if not present:
        raise node.error("Concat needs at least one input")
    axis = node.attr("axis", 1)
    return carry(ops.concat(*present, axis=axis), lambda *xs: np.concatenate(xs, axis=axis), *present)


@converter("Concat", since=4)
def concat_v4(node: NodeContext, *inputs: Any) -> Any:
    if "axis" not in node.attrs:
        raise node.error("attribute 'axis' is required from opset 4")
    return concat(node, *inputs)


# -- Squeeze, Unsqueeze ------------------------------------------------------------

def squeezed(node: NodeContext, data: Any, axes: Sequence[int] | None) -> Any:
    if axes is None:  # every size-1 dim, so they must be known
        dims = dims_of(data)
        if dims == UNKNOWN_RANK or -1 in dims:
            raise node.unknown(f"Squeeze without axes needs every dim of input 'data' known when the model is "
                             f"loaded; its shape is {'unknown' if dims == UNKNOWN_RANK else list(dims)}")
        axes = [k for k, d in enumerate(dims) if d == 1]
    return carry(ops.squeeze(data, axes=list(axes)), lambda x: np.squeeze(x, axis=tuple(axes)), data)


@converter("Squeeze", since=1)
def squeeze_v1(node: NodeContext, data: Any) -> Any:
    return squeezed(node, data, node.attr("axes"))


@converter("Squeeze", since=13)
def squeeze_v13(node: NodeContext, data: Any, axes: Any = None) -> Any:
    return squeezed(node, data, None if axes is None else ints(node, axes, "input 'axes'"))


@converter("Unsqueeze", since=1)
def unsqueeze_v1(node: NodeContext, data: Any) -> Any:
    axes = node.attr("axes")
    if axes is None:
        raise node.error("attribute 'axes' is required")
    return unsqueezed(data, list(axes))


@converter("Unsqueeze", since=13)
def unsqueeze_v13(node: NodeContext, data: Any, axes: Any) -> Any:
    return unsqueezed(data, ints(node, axes, "input 'axes'"))


def unsqueezed(data: Any, axes: list[int]) -> Any:
    return carry(ops.unsqueeze(data, axes=axes), lambda x: np.expand_dims(x, tuple(axes)), data)


# -- Slice ---------------------------------------------------------------------------

def sliced(node: NodeContext, data: Any, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None,
           steps: Sequence[int] | None) -> Any:
    if len(starts) != len(ends):
        raise node.error(f"'starts' has {len(starts)} entries and 'ends' {len(ends)}; they must match")
    if not starts:
        return data
    attrs = dict(starts=list(starts), ends=list(ends), axes=list(axes or []), steps=list(steps or []))
    return carry(ops.slice(data, **attrs), lambda x: x[index_of(x, **attrs)], data)


@converter("Slice", since=1)
def slice_v1(node: NodeContext, data: Any) -> Any:
    return sliced(node, data, node.attr("starts", []), node.attr("ends", []), node.attr("axes"), None)


@converter("Slice", since=10)
def slice_v10(node: NodeContext, data: Any, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> Any:
    def read(x: Any, what: str) -> list[int] | None:
        return None if x is None else ints(node, x, f"input '{what}'")
    # starts, ends: required inputs, None only when a malformed node omits them (sliced then raises TypeError)
    return sliced(node, data, read(starts, "starts"), read(ends, "ends"),  # type: ignore[arg-type]
                  read(axes, "axes"), read(steps, "steps"))


# -- Shape, ConstantOfShape, Constant ---------------------------------------------------

def shape_of(node: NodeContext, data: Any, start: int = 0, end: int | None = None) -> Any:
    dims = dims_of(data)
    end = INT64_MAX if end is None else end
    if dims != UNKNOWN_RANK and -1 not in dims:  # known now: a constant
        return np.asarray(dims[start:end] if (start, end) != (0, INT64_MAX) else dims, np.int64).reshape(-1)
    result = ops.shape(data, start=start, end=end)
    return result if dims == UNKNOWN_RANK else with_known(result, object_array(data.shape[start:end]))


@converter("Shape", since=1)
def shape(node: NodeContext, data: Any) -> Any:
    return shape_of(node, data)


@converter("Shape", since=15)
def shape_v15(node: NodeContext, data: Any) -> Any:
    return shape_of(node, data, node.attr("start", 0), node.attr("end"))


@converter("Size", since=1)
def size(node: NodeContext, data: Any) -> Any:
    dims = dims_of(data)
    if dims != UNKNOWN_RANK and -1 not in dims:
        return np.asarray(int(np.prod(dims)), np.int64)
    # Known at run time: the length of data flattened, as a 0-d tensor.
    return ops.reshape(ops.shape(ops.reshape(data, shape=[-1])), shape=[])


@converter("ConstantOfShape", since=9)
def constant_of_shape(node: NodeContext, shape: Any) -> Any:
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if value.size != 1:
        raise node.error(f"attribute 'value' has {value.size} elements; it must hold exactly one")
    target = ints(node, shape, "input 'input'")
    if any(d < 0 for d in target):
        raise node.error(f"input 'input' {target} has negative dims")
    return ops.constant_of_shape(np.ascontiguousarray(value.reshape(1)), shape=target)


CONSTANT_ATTRIBUTES = ("value", "sparse_value", "value_float", "value_floats", "value_int", "value_ints",
                       "value_string", "value_strings")


def constant_value(node: NodeContext) -> npt.NDArray[Any]:
    """The array a Constant node holds, from whichever value_* attribute it has."""
    given = [name for name in CONSTANT_ATTRIBUTES if name in node.attrs]
    if len(given) != 1:
        raise node.error(f"a Constant needs exactly one value attribute; it has {', '.join(given) or 'none'} "
                         f"(give exactly one of {', '.join(CONSTANT_ATTRIBUTES)})")
    name = given[0]
    if name in ("value_string", "value_strings"):
        raise node.error(f"attribute '{name}': string tensors are not supported (opforge supports "
                         f"{', '.join(ABI_DTYPES)})")
    value = node.attrs[name]
    if name in ("value_float", "value_floats"):
        return np.asarray(value, np.float32)
    if name in ("value_int", "value_ints"):
        return np.asarray(value, np.int64)
    return np.asarray(value)


converter("Constant", since=1)(constant_value)  # later opsets only add value_* attributes


# -- Gather, Tile, Expand, TopK, Split ---------------------------------------------------

@converter("Gather", since=1)
def gather(node: NodeContext, data: Any, indices: Any) -> Any:
    axis = node.attr("axis", 0)
    dims = dims_of(data)
    if isinstance(indices, np.ndarray) and dims != UNKNOWN_RANK and -len(dims) <= axis < len(dims):
        size = dims[axis]
        bad = indices[(indices < -size) | (indices >= size)] if size != -1 else indices[:0]
        if bad.size:
            raise node.error(f"input 'indices' holds {bad.reshape(-1)[0]}, out of range for axis {axis} of "
                             f"size {size} (valid: {-size}..{size - 1})")
    result = ops.gather(data, indices, axis=axis)
    if isinstance(indices, np.ndarray):  # (indices past the end have raised already)
        result = carry(result, lambda x: np.take(x, indices, axis=axis), data)
    return result


@converter("Tile", since=6)
def tile(node: NodeContext, x: Any, repeats: Any) -> Any:
    return ops.tile(x, repeats=ints(node, repeats, "input 'repeats'"))


@converter("Expand", since=8)
def expand(node: NodeContext, x: Any, shape: Any) -> Any:
    known = None if isinstance(shape, np.ndarray) else known_elements(shape)
    if known is None:
        return ops.expand(x, shape=ints(node, shape, "input 'shape'"))
    # Computed at run time from dims: an unknown entry that is x's own dim there keeps it (as a 1 does).
    target, dims = [], x.shape if not isinstance(x, np.ndarray) and dims_of(x) != UNKNOWN_RANK else None
    entries = list(known.reshape(-1))
    for k, entry in enumerate(entries):
        if isinstance(entry, SymDim):
            at = k - (len(entries) - len(dims)) if dims is not None else -1
            # dims None: at is -1, so len(dims) and dims[at] are never reached
            if not (0 <= at < len(dims) and same_dim(entry, dims[at])):  # type: ignore[arg-type, index]

                raise node.unknown(f"input 'shape' holds {entry!r}, a size known only at run time that is not the "
                                 "input's own dim there; opforge's expand needs the sizes when the model is loaded")
            entry = 1
        target.append(int(entry))
    return ops.expand(x, shape=target)


def top_k(node: NodeContext, x: Any, k: int) -> Any:
    return ops.topk(x, k=k, axis=node.attr("axis", -1), largest=bool(node.attr("largest", 1)),
                    sorted=bool(node.attr("sorted", 1)))


@converter("TopK", since=1)
def topk_v1(node: NodeContext, x: Any) -> Any:
    return top_k(node, x, node.attr("k"))


@converter("TopK", since=10)
def topk_v10(node: NodeContext, x: Any, k: Any) -> Any:
    count = ints(node, k, "input 'K'")
    if len(count) != 1:
        raise node.error(f"input 'K' must hold one value, got {count}")
    return top_k(node, x, count[0])


def split_pieces(node: NodeContext, x: Any, axis: int, sizes: Sequence[int] | None, count: int) -> tuple[Any, ...]:
    """The Split outputs as slices of x along axis: ``sizes`` given, or ``count`` pieces of equal size
    (the last smaller when the dim does not divide, from opset 18)."""
    rank = rank_of(node, x, "input 'input'")
    if not -rank <= axis < rank:
        raise node.error(f"attribute 'axis' {axis} is out of range for input of rank {rank}")
    dim = dims_of(x)[axis]
    if sizes is None:
        if count < 1:
            raise node.error("Split needs at least one output")
        if dim == -1:
            raise node.unknown(f"splitting axis {axis} into equal parts needs its size known when the model is "
                             "loaded; it is unknown (give the 'split' sizes)")
        if node.opset < 18 and dim % count:
            raise node.error(f"axis {axis} of size {dim} does not split into {count} equal parts")
        piece = -(-dim // count)
        sizes = [max(0, min(piece, dim - k * piece)) for k in range(count)]
    if any(s < 0 for s in sizes):
        raise node.error(f"'split' {sizes} has negative sizes")
    if dim != -1 and sum(sizes) != dim:
        raise node.error(f"'split' {sizes} adds up to {sum(sizes)}, but axis {axis} has size {dim}")
    if len(sizes) < node.num_outputs:
        raise node.error(f"'split' has {len(sizes)} sizes for {node.num_outputs} outputs")
    outputs, start = [], 0
    for size in sizes:
        outputs.append(ops.slice(x, starts=[start], ends=[start + size], axes=[axis]))
        start += size
    return tuple(outputs)


@converter("Split", since=1)
def split_v1(node: NodeContext, x: Any, split: Any = None) -> tuple[Any, ...]:
    sizes = node.attr("split")
    if split is not None:
        sizes = ints(node, split, "input 'split'")
    return split_pieces(node, x, node.attr("axis", 0), sizes or None, node.num_outputs)


@converter("Split", since=2)
def split_v2(node: NodeContext, x: Any) -> tuple[Any, ...]:
    return split_pieces(node, x, node.attr("axis", 0), node.attr("split") or None, node.num_outputs)


@converter("Split", since=13)
def split_v13(node: NodeContext, x: Any, split: Any = None) -> tuple[Any, ...]:

    sizes = None if split is None else ints(node, split, "input 'split'")
    count = node.attr("num_outputs", node.num_outputs) if node.opset >= 18 else node.num_outputs
    if node.opset >= 18 and sizes is None and "num_outputs" not in node.attrs:
        raise node.error("from opset 18, Split needs input 'split' or attribute 'num_outputs'")
    return split_pieces(node, x, node.attr("axis", 0), sizes, count)
