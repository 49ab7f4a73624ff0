"""Reverse-mode differentiation from per-op gradient rules.

``backward(graph)`` builds the backward graph of a traced graph: it replays
the forward nodes and applies each node's rule (``op.grad``) in reverse
order, summing gradients that meet, all under tracing, so the result is
itself a Graph of ordinary ops (it can be planned, saved, differentiated
again).  ``vjp`` and ``grad`` are the eager entry points: they trace the
function on the given arrays' specs and run the two graphs.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DTypeError, GradientError, ShapeError
from ..spec import TensorSpec
from .ir import Graph, Value
from .trace import same_trace, trace

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..attrs import AttrValue
    from ..operator import Op


class Saved:
    """What a gradient rule asked to keep: ``saved.x``, ``saved.y``...;
    ``saved.inputs`` / ``saved.outputs`` hold all of them in order."""

    def __init__(self, values: Mapping[str, Any], inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        self.__dict__.update(values)
        self.inputs = inputs
        self.outputs = outputs

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any: ...  # what the rule asked to keep, by name


def _zeros(spec: TensorSpec) -> npt.NDArray[Any]:
    if not spec.is_static:
        raise ShapeError(f"a zero gradient of dynamic shape {spec} is not supported; trace with static shapes")
    return np.zeros(spec.shape, spec.dtype)


def _rule(op: Op) -> Callable[..., Any]:
    if "no_grad" in op.traits:
        raise GradientError(f"op '{op.name}' has trait no_grad and cannot be differentiated")
    if op.grad_rule is None:
        raise GradientError(f"op '{op.name}' has no gradient rule; attach one with @op.grad "
                            "(or give Custom a bprop)")
    return op.grad_rule


def _depends_on(graph: Graph, wrt: Iterable[int]) -> set[int]:
    """Ids of the values that depend on the inputs selected by ``wrt``."""
    reached = {graph.inputs[k].id for k in wrt}
    for node in graph.nodes:
        if any(v is not None and v.id in reached for v in node.inputs):
            reached.update(v.id for v in node.outputs)
    return reached


def _replay_and_differentiate(graph: Graph, inputs: Sequence[Any], cotangents: Sequence[Any],
                              wrt: Sequence[int]) -> tuple[Any, ...]:
    """Inside a trace: the forward graph replayed on ``inputs``, then its VJP
    with respect to the inputs selected by ``wrt`` (nodes off their paths are
    not differentiated, so they need no rule)."""
    return _differentiate(graph, graph.replay(inputs), cotangents, wrt)


def _differentiate(graph: Graph, env: Mapping[int, Any], cotangents: Sequence[Any],
                   wrt: Sequence[int]) -> tuple[Any, ...]:
    """Inside a trace: the VJP of ``graph`` whose values are ``env`` (a replay's),
    with respect to the inputs selected by ``wrt``; the rules read the forward
    values from ``env``, so nothing is computed twice."""
    active = _depends_on(graph, wrt)
    value: Value | None
    grads: dict[int, Any] = {}  # value id -> its gradient (an array, or a traced value)

    def accumulate(value: Value, gradient: Any) -> None:
        if gradient is None:
            return
        grads[value.id] = gradient if value.id not in grads else grads[value.id] + gradient

    for value, cotangent in zip(graph.outputs, cotangents):
        accumulate(value, cotangent)
    for node in reversed(graph.nodes):
        if node.is_constant or not any(v.id in grads for v in node.outputs):
            continue
        if not any(v is not None and v.id in active for v in node.inputs):
            continue
        rule = _rule(node.op)
        douts = [grads.get(v.id) if v.id in grads else _zeros(v.spec) for v in node.outputs]
        names = [i.name for i in node.op.inputs] + list(node.op.outputs)
        ins = [None if v is None else env[v.id] for v in node.inputs]
        outs = [env[v.id] for v in node.outputs]
        saved = Saved({n: x for n, x in zip(names, ins + outs) if n in node.op.grad_saves}, ins, outs)
        dins = rule(saved, *douts, **node.attrs)
        dins = dins if isinstance(dins, (tuple, list)) else (dins,)
        if len(dins) != len(node.inputs):
            raise GradientError(f"op '{node.op.name}': the gradient rule returned {len(dins)} gradient(s) for "
                                f"{len(node.inputs)} input(s)")
        for value, gradient in zip(node.inputs, dins):
            if value is not None and gradient is not None and value.id in active:
                # (an array: a gradient computed while tracing, from constants alone)
                shape = gradient.spec.shape if isinstance(gradient, Value) else np.shape(gradient)
                known = gradient.spec.is_static if isinstance(gradient, Value) else True
                if tuple(shape) != value.spec.shape and value.spec.is_static and known:
                    raise GradientError(f"op '{node.op.name}': the gradient rule gave shape "
                                        f"{list(shape)} for input of shape {list(value.spec.shape)}")
                accumulate(value, gradient)
    return tuple(grads[graph.inputs[k].id] if graph.inputs[k].id in grads else _zeros(graph.inputs[k].spec)
                 for k in wrt)


def op_backward(op: Op, attrs: Mapping[str, AttrValue], in_specs: Sequence[TensorSpec | None],
                out_specs: Sequence[TensorSpec]) -> tuple[Graph, tuple[bool, ...]]:
    """The backward graph of one call of ``op``: inputs ``(*ins, *outs, *douts)``,
    outputs the gradients its rule gives, with no forward recomputation (the
    rule reads the saved inputs and outputs).  Returns ``(graph, present)``:
    ``present[k]`` tells whether input ``k`` gets a gradient (the rule's None
    is absent from the graph's outputs).  A framework that differentiates
    opforge ops itself (PyTorch's autograd, JAX's vjp) runs this graph's
    nodes as its own ops, so the gradient is differentiable again."""
    rule = _rule(op)
    n_in, n_out = len(in_specs), len(out_specs)
    names = [i.name for i in op.inputs] + list(op.outputs)
    present: list[bool] = []

    def pullback(*args: Any) -> tuple[Any, ...]:
        ins: Sequence[Any]
        ins, outs, douts = args[:n_in], args[n_in:n_in + n_out], args[n_in + n_out:]
        ins = [None if s is None else x for x, s in zip(ins, in_specs)]
        saved = Saved({n: x for n, x in zip(names, list(ins) + list(outs)) if n in op.grad_saves}, ins, outs)
        dins = rule(saved, *douts, **attrs)
        dins = dins if isinstance(dins, (tuple, list)) else (dins,)
        if len(dins) != n_in:
            raise GradientError(f"op '{op.name}': the gradient rule returned {len(dins)} gradient(s) for "
                                f"{n_in} input(s)")
        present[:] = [d is not None and s is not None for d, s in zip(dins, in_specs)]
        return tuple(d for d, keep in zip(dins, present) if keep)

    absent = TensorSpec([], "float32")  # stands in for an absent optional input; the rule never reads it
    specs = [absent if s is None else s for s in in_specs] + list(out_specs) + list(out_specs)
    graph = trace(pullback, *specs, name=f"{op.name}_backward")
    graph.tuple_output = True
    return graph, tuple(present)


def _indices(graph: Graph, wrt: int | Sequence[int] | None) -> list[int]:
    """``wrt`` (None: all, an index or indices, negative from the end) as a list of input indices."""
    n = len(graph.inputs)
    if wrt is None:
        return list(range(n))
    indices = [wrt] if isinstance(wrt, int) else list(wrt) if isinstance(wrt, (tuple, list, range)) else None
    if indices is None or not all(type(k) is int and -n <= k < n for k in indices):
        raise GradientError(f"'{graph.name}' takes {n} input(s): gradients are taken with respect to indices "
                            f"of them, got {wrt!r}")
    return [k % n for k in indices]


def _function(name: str, fn: object) -> Callable[..., Any]:
    if not callable(fn):
        raise GradientError(f"{name} differentiates a function of arrays (or a Graph), got {type(fn).__name__}")
    return fn


def _arrays(name: str, arrays: Iterable[object]) -> list[npt.NDArray[Any]]:
    """The arguments as arrays: gradients are taken with respect to tensors."""
    result = []
    for k, value in enumerate(arrays):
        try:
            array = np.asarray(value)
        except ValueError as error:  # ragged nested lists
            raise DTypeError(f"{name}: argument {k} is not a rectangular array: {error}") from None
        if array.dtype == object:
            raise DTypeError(f"{name}: argument {k} must be an array, got {type(value).__name__}")
        result.append(array)
    return result


def backward(graph: Graph, wrt: int | Sequence[int] | None = None) -> Graph:
    """The backward graph: inputs (x..., dy...) -> gradients of the inputs
    selected by ``wrt`` (indices; default all)."""
    if not isinstance(graph, Graph):
        raise GradientError(f"backward takes a Graph (from opforge.trace or Graph.load), got {type(graph).__name__}")
    wrt = _indices(graph, wrt)
    n = len(graph.inputs)

    def pullback(*args: Any) -> tuple[Any, ...]:
        return _replay_and_differentiate(graph, args[:n], args[n:], wrt)

    specs = [v.spec for v in graph.inputs] + [v.spec for v in graph.outputs]
    result = trace(pullback, *specs, name=f"{graph.name}_backward")
    result.tuple_output = True
    return result


def vjp(fn: Callable[..., Any], *arrays: Any) -> tuple[Any, Callable[..., Any]]:
    """``(outputs, pullback)``: ``pullback(*cotangents)`` returns the gradient
    of every argument of ``fn``."""
    arrays = _arrays("vjp", arrays)  # type: ignore[assignment]  # (a list now: only unpacked below)
    forward = trace(_function("vjp", fn), *arrays)
    outputs = forward(*arrays)
    backward_graph: Graph | None = None

    def pullback(*cotangents: Any) -> Any:
        nonlocal backward_graph
        if backward_graph is None:
            backward_graph = backward(forward)
        if len(cotangents) != len(forward.outputs):
            raise GradientError(f"pullback of '{forward.name}' takes {len(forward.outputs)} cotangent(s), "
                                f"got {len(cotangents)}")
        cotangents = [np.asarray(c, dtype=v.spec.dtype)  # type: ignore[assignment]  # (a list now: only unpacked)
                      for c, v in zip(cotangents, forward.outputs)]
        return backward_graph(*arrays, *cotangents)

    return outputs, pullback


def value_and_grad(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., tuple[Any, Any]]:
    """Like ``grad``, also returning ``fn``'s value.

    ``fn`` runs on symbolic values on every call (as JAX's grad traces it):
    arrays it reads from outside become constants, so a later call sees their
    new values.  Running it is cheap; planning is not: when a call makes the
    calls an earlier call traced -- the same ops, attributes and wiring, equal
    constants, checked one by one as ``fn`` runs on that trace's values, with
    no new graph built -- that call's joint graph runs again with its plans.
    The joint graph computes the value and the gradients in one pass: the
    backward part reads the forward part's values instead of recomputing them."""
    _function("grad", fn)
    single = isinstance(argnums, int)
    # (forward graph, joint graph), most recent first; a few, for alternating signatures
    joints: list[tuple[Graph, Graph]] = []

    def wrapped(*arrays: Any) -> tuple[Any, Any]:
        arrays = _arrays("grad", arrays)  # type: ignore[assignment]  # (a list now: only unpacked below)
        # fn runs against each cached trace first, checked call by call (no new graph): most calls are
        # the one traced before, with new values in the arrays.
        joint = next((j for f, j in joints if same_trace(fn, f, arrays)), None)
        if joint is None:
            # Unoptimized: later calls are checked against this trace as fn records it, and the joint graph
            # made from it is optimized as it is traced (the passes took a fifth of a small function's trace).
            forward = trace(fn, *arrays, optimize=False)
            if forward.tuple_output or len(forward.outputs) != 1:
                raise GradientError(f"grad needs '{forward.name}' to return one tensor")
            spec = forward.outputs[0].spec
            if spec.is_static and int(np.prod(spec.shape)) != 1:
                raise GradientError(f"grad needs '{forward.name}' to return a scalar, got shape {list(spec.shape)}")
            joint = joint_graph(forward, argnums)
            joints.insert(0, (forward, joint))
            del joints[JOINT_GRAPHS_KEPT:]
        value, *grads = joint(*arrays)
        return value, (grads[0] if single else tuple(grads))

    return wrapped


JOINT_GRAPHS_KEPT = 4


def joint_graph(forward: Graph, wrt: int | Sequence[int] | None = None) -> Graph:
    """One graph computing a scalar ``forward``'s value and its gradients with respect
    to the inputs selected by ``wrt``: inputs as forward's, outputs (value, *gradients).
    ``forward`` was traced on arrays, so its output's shape is known."""
    indices = _indices(forward, wrt)
    spec = forward.outputs[0].spec

    def value_and_gradients(*args: Any) -> tuple[Any, ...]:
        env = forward.replay(args)
        value = env[forward.outputs[0].id]
        return (value, *_differentiate(forward, env, [np.ones(spec.shape, spec.dtype)], indices))

    graph = trace(value_and_gradients, *[v.spec for v in forward.inputs], name=f"{forward.name}_value_and_grad")
    graph.tuple_output = True
    return graph


def grad(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """``grad(fn)(*arrays)``: gradient of scalar ``fn`` with respect to the
    argument(s) ``argnums`` (an int, or a tuple giving a tuple of gradients)."""
    both = value_and_grad(fn, argnums)
    return lambda *arrays: both(*arrays)[1]
