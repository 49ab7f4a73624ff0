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
from torch.autograd import forward_ad

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
    elements each), ``rebuild(flat)`` gives the call's (args, kwargs) back;
    ``tangents``: whether any carries a forward-mode tangent."""

    @staticmethod
    def forward(gradient: Gradient, rebuild: _Rebuild, slots: Sequence[int], tangents: bool, *flat: Any) -> Any:
        args, kwargs = rebuild(flat)
        with torch._C._AutoDispatchBelowAutograd():  # the plain call, whatever tangents its inputs carry
            return gradient.binding.packet.default(*args, **kwargs)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        gradient, rebuild, slots, tangents, *flat = inputs
        args, kwargs = rebuild(flat)
        outputs = output if gradient.binding.op.tuple_output else (output,)
        gradient.setup_context(ctx, args, kwargs, output, tangents)
        ctx.slots = slots
        ctx.flat_like = [(t.shape, t.dtype) for t in flat] if ctx.problem is not None else None
        # Floating outputs stay differentiable even when the op has no gradient: so do torch's own ops
        # without a derivative (torch.special.zeta's first input), whose backward raises.  Marking them
        # non-differentiable would let a gradient that needs this op skip it without an error (a layer
        # before the op would get no gradient at all).
        ctx.mark_non_differentiable(*[o for o in outputs if not (o.is_floating_point() or o.is_complex())])
        # An output no gradient reached comes to backward as None, which makes its zeros like the others
        # (autograd's own zeros would be plain tensors beside a DTensor's gradients).
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        if all(g is None for g in grads):  # no gradient reached any output: none reaches the inputs
            return (None,) * len(ctx.needs_input_grad)
        if ctx.problem is not None:
            return (None, None, None, None, *ctx.gradient.refused(ctx, grads))
        per_input = ctx.gradient.backward(ctx, *grads)
        return (None, None, None, None, *[per_input[slot] for slot in ctx.slots])

    @staticmethod
    def jvp(ctx: Any, _gradient: Any, _rebuild: Any, _slots: Any, _tangents: Any, *tangents: Any) -> Any:
        return ctx.gradient.jvp(ctx, tangents)


def _apply(function: type, *args: Any) -> Any:
    """``function.apply(*args)`` from the autograd key.  Inside one of torch.func's
    differentiating transforms (grad, vjp, jvp; jacrev and jacfwd add vmap, which is
    fine) the tensors here are already that transform's: the Function is applied at
    its level alone, as torch.func applies a Function it lowers itself.  Two such
    transforms nested (hessian, jvp of grad) would need the op's forward to run again
    at the outer level, which torch gives custom ops no way to do: a GradientError
    there, not the zeros the outer transform would see."""
    apply = super(torch.autograd.Function, function).apply
    if not torch._C._are_functorch_transforms_active():
        return apply(*args)
    from torch._C._functorch import TransformType
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    from torch._functorch.utils import enable_single_level_autograd_function

    differentiating = [i for i in retrieve_all_functorch_interpreters()
                       if i.key() in (TransformType.Grad, TransformType.Jvp)]
    if len(differentiating) > 1:
        raise GradientError(f"op '{args[0].binding.op.name}': torch.func cannot nest differentiating transforms "
                            "(hessian, jvp of grad, ...) over an opforge op; take higher derivatives with "
                            "torch.autograd.grad(..., create_graph=True), which differentiates its gradient "
                            "rule again")
    with enable_single_level_autograd_function():
        return apply(*args)


def _has_tangent(tensor: Any) -> bool:
    """Whether ``tensor`` carries a forward-mode tangent (``torch.func.jvp``, ``forward_ad``)."""
    return forward_ad._current_level >= 0 and forward_ad.unpack_dual(tensor).tangent is not None


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
            tangents = any(_has_tangent(t) for t in flat)
            if not tangents and not (torch.is_grad_enabled() and any(t.requires_grad for t in flat)):
                with torch._C._AutoDispatchBelowAutograd():
                    return below_autograd(*args, **kwargs)
            # Function.apply without its torch.func dispatch: this kernel runs at the autograd key,
            # below torch.func's transforms, which have unwrapped the tensors to their own level already.
            return _apply(self.function, self, rebuild, slots, tangents, *flat)

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
                      output: Any, tangents: bool = False) -> None:
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
        kept = [v if keep else None for v, keep in zip(tensors + outputs, used)]
        ctx.save_for_backward(*kept)
        if tangents:  # for jvp, which runs as the call returns (forward AD is off in forward itself)
            ctx.forward_saved = kept

    def _graph_for(self, attrs: dict[str, AttrValue], tensors: Sequence[Any],
                   outputs: Sequence[Any]) -> _Backward:
        """(backward graph, present, used) for this signature.  Symbolic dims (SymInts, when
        torch traces) stay unknown to the trace, and the graph is checked by inference at
        the sizes torch traces with: a rule that needs their sizes (one that builds an
        attribute from them, say) is traced again with the sizes themselves, which makes
        torch specialize the graph to them (a guard, and a recompilation for other sizes)."""
        binding = self.binding
        names = binding.op.outputs
        sizes = [None if t is None else (tuple(t.shape), t.dtype) for t in (*tensors, *outputs)]
        if all(s is None or all(type(d) is int for d in s[0]) for s in sizes):  # no SymInt: keyed as torch gives it
            return self.graphs.get_or_create((attr_key(attrs), tuple(sizes)), lambda: self._backward_graph(
                attrs, binding.specs(tensors), binding.specs(outputs, names)))
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
                for needed, (shape, dtype) in zip(ctx.needs_input_grad[4:], ctx.flat_like)]

    def backward(self, ctx: Any, *grads: Any) -> list[Any]:
        """The gradient of each tensor input of the op (of each element of a Tensor[] one)."""
        saved = list(ctx.saved_tensors)
        like = next(g for g in grads if g is not None)  # autograd calls backward with some gradient
        # (grads, the *args tuple, becomes a list)
        grads = [constant_like(torch.zeros(shape, dtype=dtype, device=device), like)  # type: ignore[assignment]
                 if g is None else g for g, (shape, dtype, device) in zip(grads, ctx.output_like)]
        found = iter(replay(ctx.graph, saved + grads, like=like))  # type: ignore[operator]  # as above
        return [next(found) if keep else None for keep in ctx.present]

    def jvp(self, ctx: Any, tangents: Sequence[Any]) -> Any:
        """Forward mode from the reverse rule: the backward graph is linear in the output
        gradients, so the product of the Jacobian with the input tangents is the gradient,
        with respect to those output gradients, of the backward graph's results dotted with
        the tangents.  The backward graph is replayed once on probe gradients (its nodes
        record torch's autograd) and differentiated once."""
        if ctx.problem is not None:  # asked for now: forward mode computes the tangent with the call
            problem = ctx.problem
            raise problem if isinstance(problem, OpforgeError) else GradientError(problem)
        op = self.binding.op
        saved = ctx.forward_saved
        del ctx.forward_saved
        like = next(t for t in saved + list(tangents) if t is not None)
        with torch.enable_grad():
            probes = [torch.zeros(shape, dtype=dtype, device=device, requires_grad=True)
                      for shape, dtype, device in ctx.output_like]
            found = iter(replay(ctx.graph, saved + probes, like=like))
            per_input = [next(found) if keep else None for keep in ctx.present]
            pairs = [(per_input[slot], t) for slot, t in zip(ctx.slots, tangents)
                     if t is not None and per_input[slot] is not None and per_input[slot].requires_grad]
            try:
                out_tangents = torch.autograd.grad([g for g, _ in pairs], probes, [t for _, t in pairs],
                                                   allow_unused=True) if pairs else [None] * len(probes)
            except OpforgeError as error:
                raise GradientError(f"op '{op.name}': forward-mode AD differentiates its gradient rule, which "
                                    f"failed: {error}") from error
        out_tangents = [torch.zeros(shape, dtype=dtype, device=device) if t is None else t.detach()
                        for t, (shape, dtype, device) in zip(out_tangents, ctx.output_like)]
        return tuple(out_tangents) if op.tuple_output else out_tangents[0]


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
