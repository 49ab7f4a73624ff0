"""PyTorch's autograd for opforge ops, from each op's gradient rule.

For each input signature the rule is traced once into a backward graph
(``graph.autodiff.op_backward``: saved inputs and outputs and the output
gradients in, the input gradients out, nothing recomputed).  ``backward``
replays that graph on tensors, every node as a torch op with its own
autograd, so the gradient can be differentiated again.  Only the inputs and
outputs the graph reads are saved.

``Gradient.kernel`` is the op's autograd kernel (PyTorch's ``Autograd``
dispatch key): a call that needs no gradient goes below autograd at once;
one that does runs the op's plain overload inside an ``autograd.Function``,
so graphs traced by ``torch.compile`` record the overload whose calls take
the C++ path.

An op that cannot give a gradient (trait ``no_grad``, no rule, or a rule that
fails for the call's signature) still records its call, and its backward
gives each input that needs a gradient the output of
``opforge::_opforge_refused_gradient``, an op whose kernel raises the
``GradientError`` (the rule's own error, for a rule that fails).
torch.compile traces the backward with the forward (AOTAutograd's joint
graph) before any gradient is asked for, so raising in ``backward`` itself
would fail the compilation of the forward; the op puts the error into the
compiled backward instead, where it is raised when (and only when) that
gradient is computed.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from .. import errors
from ..attrs import attr_key
from ..bounded_cache import BoundedCache
from ..errors import GradientError, OpforgeError
from ..graph.autodiff import op_backward
from ..graph.passes import infer_shapes
from ..spec import TensorSpec
from .sharding import constant_like
from .symbolic import Signature

if TYPE_CHECKING:
    from ..attrs import AttrValue
    from ..graph.ir import Graph
    from .calls import Binding

    #: ``rebuild(tensors)``: a call's (args, kwargs) with those tensors in their places.
    _Rebuild: TypeAlias = Callable[[Sequence[Any]], tuple[list[Any], dict[str, Any]]]
    #: A signature's (backward graph, present, used): see ``Gradient._graph_for``.
    _Backward: TypeAlias = tuple[Graph, Sequence[bool], list[bool]]

GRAPHS_PER_OP = 64

REFUSED = "_opforge_refused_gradient"  # opforge::<this>: "_opforge_" names are the bridge's own, as PYTHON_PREFIX
_library = torch.library.Library("opforge", "FRAGMENT")
_library.define(f"{REFUSED}(Tensor grad, SymInt[] size, ScalarType dtype, str error, str message) -> Tensor")


def _raise_refused(grad: Any, size: Sequence[int], dtype: Any, error: str, message: str) -> Any:
    """The kernel: raises opforge's ``error`` (a class of opforge.errors, by name) with ``message``."""
    kind = getattr(errors, error, None)
    raise (kind if isinstance(kind, type) and issubclass(kind, OpforgeError) else GradientError)(message)


def _refused_fake(grad: Any, size: Sequence[Any], dtype: Any, error: str, message: str) -> Any:
    # The gradient of the input: its size and dtype, on grad's device.  Taking grad keeps the op in
    # the backward graph (it depends on a tangent), so the partitioner never moves it into the forward.
    return grad.new_empty(size, dtype=dtype)


_library.impl(REFUSED, _raise_refused, "CompositeExplicitAutograd")
torch.library.register_fake(f"opforge::{REFUSED}", _refused_fake, lib=_library)


class _Apply(torch.autograd.Function):  # type: ignore[misc]  # torch is Any to mypy (follow_imports=skip)
    """One differentiable call: ``flat`` holds its tensors (a Tensor[] argument's
    elements each), ``rebuild(flat)`` gives the call's (args, kwargs) back."""

    @staticmethod
    def forward(ctx: Any, gradient: Gradient, rebuild: _Rebuild, slots: Sequence[int], *flat: Any) -> Any:
        args, kwargs = rebuild(flat)
        output = gradient.binding.packet.default(*args, **kwargs)  # grad mode is off in here
        outputs = output if gradient.binding.op.tuple_output else (output,)
        gradient.setup_context(ctx, args, kwargs, output)
        ctx.slots = slots
        ctx.flat_like = [(t.shape, t.dtype) for t in flat] if ctx.problem is not None else None
        # Floating outputs stay differentiable even when the op has no gradient: so do torch's own ops
        # without a derivative (torch.special.zeta's first input), whose backward raises.  Marking them
        # non-differentiable would let a gradient that needs this op skip it without an error (a layer
        # before the op would get no gradient at all).
        ctx.mark_non_differentiable(*[o for o in outputs if not (o.is_floating_point() or o.is_complex())])
        return output

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        if ctx.problem is not None:
            return (None, None, None, *ctx.gradient.refused(ctx, grads))
        per_input = ctx.gradient.backward(ctx, *grads)
        return (None, None, None, *[per_input[slot] for slot in ctx.slots])


class Gradient:
    def __init__(self, binding: Binding) -> None:
        self.binding = binding
        self.graphs: BoundedCache[tuple[Any, ...], _Backward] = BoundedCache(GRAPHS_PER_OP)
        binding.op.plan_caches.append(self.graphs)
        # Named after the op, so a tensor's grad_fn says which op made it (opforge_reluBackward).
        self.function: Any = type(binding.packet._qualified_op_name.replace("::", "_"), (_Apply,), {})

    # -- the autograd kernel -------------------------------------------------------
    def kernel(self, below_autograd: Callable[..., Any]) -> Callable[..., Any]:
        """The op's autograd kernel; ``below_autograd(*args, **kwargs)`` runs the call
        below autograd (the same overload, with the autograd keys excluded)."""
        def autograd_kernel(*args: Any, **kwargs: Any) -> Any:
            flat, slots, rebuild = self._flatten(args, kwargs)
            if not (torch.is_grad_enabled() and any(t.requires_grad for t in flat)):
                with torch._C._AutoDispatchBelowAutograd():
                    return below_autograd(*args, **kwargs)
            return self.function.apply(self, rebuild, slots, *flat)

        return autograd_kernel

    def _problem(self) -> str | None:
        op = self.binding.op
        if "no_grad" in op.traits:
            return f"op '{op.name}' has trait no_grad and cannot be differentiated"
        if op.grad_rule is None:
            return f"op '{op.name}' has no gradient rule; attach one with @op.grad (or give Custom a bprop)"
        return None

    def _flatten(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], list[int], _Rebuild]:
        """(the call's tensors, the op input each belongs to, rebuild): ``rebuild(tensors)``
        gives the call's (args, kwargs) with those tensors in their places."""
        n = len(args)
        values = list(args) + list(kwargs.values())
        names = list(kwargs)
        places: list[tuple[int, int | None]]
        flat: list[Any]
        slots: list[int]
        places, flat, slots = [], [], []
        for at, value in enumerate(values):
            if isinstance(value, torch.Tensor):
                places.append((at, None))
                flat.append(value)
            elif isinstance(value, (list, tuple)) and self.binding.variadic and at == 0:
                places.extend((at, k) for k in range(len(value)))
                flat.extend(value)
                slots.extend(range(len(value)))
                continue
            else:
                continue
            name = names[at - n] if at >= n else None
            slots.append(at if name is None else [i.name for i in self.binding.op.inputs].index(name))

        def rebuild(tensors: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
            out = list(values)
            out[0] = list(out[0]) if self.binding.variadic and values else out[0]
            for (at, k), tensor in zip(places, tensors):
                if k is None:
                    out[at] = tensor
                else:
                    out[at][k] = tensor
            return out[:n], dict(zip(names, out[n:]))

        return flat, slots, rebuild

    def setup_context(self, ctx: Any, inputs: Sequence[Any], keyword_only_inputs: Mapping[str, Any],
                      output: Any) -> None:
        binding = self.binding
        tensors, attrs = binding.split(inputs, keyword_only_inputs)
        outputs = list(output) if binding.op.tuple_output else [output]
        ctx.gradient = self
        ctx.output_like = [(o.shape, o.dtype, o.device) for o in outputs]  # zeros for an absent output gradient
        ctx.problem = self._problem()
        if ctx.problem is not None:
            return
        try:
            ctx.graph, ctx.present, used = self._graph_for(attrs, tensors, outputs)
        except OpforgeError as error:  # raised when the gradient is asked for, not by the forward call
            ctx.problem = error
            return
        ctx.save_for_backward(*[v if keep else None for v, keep in zip(tensors + outputs, used)])

    def _graph_for(self, attrs: dict[str, AttrValue], tensors: Sequence[Any],
                   outputs: Sequence[Any]) -> _Backward:
        """(backward graph, present, used) for this signature.  Symbolic dims (SymInts, when
        torch traces) stay unknown to the trace, and the graph is checked by inference at
        the sizes torch traces with: a rule that needs their sizes (one that builds an
        attribute from them, say) is traced again with the sizes themselves, which makes
        torch specialize the graph to them (a guard, and a recompilation for other sizes)."""
        binding = self.binding
        names = binding.op.outputs
        ins, outs = Signature(binding.op, tensors), Signature(binding.op, outputs, names)
        if ins.symbols or outs.symbols:
            key = (attr_key(attrs), tuple(ins.unknown), tuple(outs.unknown))
            try:
                found = self.graphs.get_or_create(key, lambda: self._backward_graph(attrs, ins.unknown, outs.unknown))
                hinted = ins.evaluated() + outs.evaluated()
                if _holds_at(found[0], hinted + outs.evaluated()):
                    return found
            except OpforgeError:
                pass
        in_specs, out_specs = binding.specs(tensors, concrete=True), binding.specs(outputs, names, concrete=True)
        return self.graphs.get_or_create((attr_key(attrs), tuple(in_specs), tuple(out_specs)),
                                         lambda: self._backward_graph(attrs, in_specs, out_specs))

    def _backward_graph(self, attrs: dict[str, AttrValue], in_specs: Sequence[TensorSpec | None],
                        out_specs: Sequence[TensorSpec | None]) -> _Backward:
        # (out_specs hold no None: an output is never absent)
        graph, present = op_backward(self.binding.op, attrs, in_specs, out_specs)  # type: ignore[arg-type]
        read = {v.id for node in graph.nodes for v in node.inputs if v is not None} | {v.id for v in graph.outputs}
        n_saved = len(in_specs) + len(out_specs)
        return graph, present, [v.id in read for v in graph.inputs[:n_saved]]

    def refused(self, ctx: Any, grads: Sequence[Any]) -> list[Any]:
        """For a call whose gradient cannot be had (``ctx.problem``): for each of its tensors that
        needs a gradient, a call of ``opforge::_opforge_refused_gradient``, which raises the error
        when it runs (eagerly: at once; compiled: in the backward graph); None for the others."""
        problem = ctx.problem
        error = problem if isinstance(problem, OpforgeError) else GradientError(problem)
        grad = next(g for g in grads if g is not None)  # autograd calls backward with some gradient
        refuse = getattr(torch.ops.opforge, REFUSED).default
        return [refuse(grad, list(shape), dtype, type(error).__name__, str(error)) if needed else None
                for needed, (shape, dtype) in zip(ctx.needs_input_grad[3:], ctx.flat_like)]

    def backward(self, ctx: Any, *grads: Any) -> list[Any]:
        """The gradient of each tensor input of the op (of each element of a Tensor[] one)."""
        saved = list(ctx.saved_tensors)
        like = next(g for g in grads if g is not None)  # autograd calls backward with some gradient
        # (grads, the *args tuple, becomes a list)
        grads = [constant_like(torch.zeros(shape, dtype=dtype, device=device), like)  # type: ignore[assignment]
                 if g is None else g for g, (shape, dtype, device) in zip(grads, ctx.output_like)]
        found = iter(replay(ctx.graph, saved + grads, like=like))  # type: ignore[operator]  # as above
        return [next(found) if keep else None for keep in ctx.present]


def _holds_at(graph: Graph, specs: Sequence[TensorSpec | None]) -> bool:
    """Whether the graph, traced with unknown dims, infers every value at these concrete sizes."""
    absent = TensorSpec([], "float32")
    try:
        found = infer_shapes(graph, [absent if s is None else s for s in specs])
    except OpforgeError:
        return False
    return all(spec.is_static for spec in found.values())


def replay(graph: Graph, args: Sequence[Any], like: Any) -> list[Any]:
    """The graph's outputs for ``args``, each node run as its torch op (so the result is
    differentiable again); constants become tensors as ``like`` is (``constant_like``)."""
    from . import torch_op_call

    env = {v.id: x for v, x in zip(graph.inputs, args)}
    for node in graph.nodes:
        if node.is_constant:
            env[node.outputs[0].id] = constant_like(torch.as_tensor(node.value, device=like.device), like)
            continue
        result = torch_op_call(node.op, node.attrs, [None if v is None else env[v.id] for v in node.inputs])
        for value, out in zip(node.outputs, result if node.op.tuple_output else (result,)):
            env[value.id] = out
    return [env[v.id] for v in graph.outputs]
