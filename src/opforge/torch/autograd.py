"""PyTorch's autograd for opforge ops, from each op's gradient rule.

For each input signature the rule is traced once into a backward graph
(``graph.autodiff.op_backward``: saved inputs and outputs and the output
gradients in, the input gradients out, nothing recomputed).  ``backward``
replays that graph on tensors, so every node runs as a torch op with its own
autograd, and the gradient can be differentiated again.  Only the inputs and
outputs the graph reads are saved.
"""
from __future__ import annotations

import torch

from ..attrs import attr_key
from ..bounded_cache import BoundedCache
from ..errors import GradientError, OpforgeError
from ..graph.autodiff import op_backward

GRAPHS_PER_OP = 64


class Gradient:
    def __init__(self, binding):
        self.binding = binding
        self.graphs = BoundedCache(GRAPHS_PER_OP)

    def _problem(self):
        op = self.binding.op
        if "no_grad" in op.traits:
            return f"op '{op.name}' has trait no_grad and cannot be differentiated"
        if op.grad_rule is None:
            return f"op '{op.name}' has no gradient rule; attach one with @op.grad (or give Custom a bprop)"
        return None

    def setup_context(self, ctx, inputs, output, keyword_only_inputs=None):
        binding = self.binding
        tensors, attrs = binding.split(inputs, keyword_only_inputs or {})
        outputs = list(output) if binding.op.tuple_output else [output]
        ctx.n_args, ctx.n_tensors = len(inputs), len(tensors)
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

    def _graph_for(self, attrs, tensors, outputs):
        """(backward graph, present, used) for this signature.  Symbolic dims (SymInts, when
        torch traces) stay unknown to the trace; a rule that needs their sizes (one that
        slices by them, say) is traced again with the sizes themselves, which makes torch
        specialize the graph to them (a guard, and a recompilation for other sizes)."""
        binding = self.binding
        names = binding.op.outputs
        in_specs, out_specs = binding.unknown_specs(tensors), binding.unknown_specs(outputs, names)
        try:
            return self.graphs.get_or_create((attr_key(attrs), tuple(in_specs), tuple(out_specs)),
                                             lambda: self._backward_graph(attrs, in_specs, out_specs))
        except OpforgeError:
            if in_specs == binding.specs(tensors, concrete=True):
                raise
        in_specs, out_specs = binding.specs(tensors, concrete=True), binding.specs(outputs, names, concrete=True)
        return self.graphs.get_or_create((attr_key(attrs), tuple(in_specs), tuple(out_specs)),
                                         lambda: self._backward_graph(attrs, in_specs, out_specs))

    def _backward_graph(self, attrs, in_specs, out_specs):
        graph, present = op_backward(self.binding.op, attrs, in_specs, out_specs)
        read = {v.id for node in graph.nodes for v in node.inputs if v is not None} | {v.id for v in graph.outputs}
        n_saved = len(in_specs) + len(out_specs)
        return graph, present, [v.id in read for v in graph.inputs[:n_saved]]

    def backward(self, ctx, *grads):
        if isinstance(ctx.problem, Exception):
            raise ctx.problem
        if ctx.problem is not None:
            raise GradientError(ctx.problem)
        saved = list(ctx.saved_tensors)
        grads = [torch.zeros(shape, dtype=dtype, device=device) if g is None else g
                 for g, (shape, dtype, device) in zip(grads, ctx.output_like)]
        found = iter(replay(ctx.graph, saved + grads, like=grads[0]))
        gradients = [next(found) if keep else None for keep in ctx.present]
        if self.binding.variadic:
            return (gradients,) + (None,) * (ctx.n_args - 1)
        return tuple(gradients) + (None,) * (ctx.n_args - ctx.n_tensors)


def replay(graph, args, like):
    """The graph's outputs for ``args``, each node run as its torch op (so the result is
    differentiable again); constants become tensors on ``like``'s device."""
    from . import torch_op_call

    env = {v.id: x for v, x in zip(graph.inputs, args)}
    for node in graph.nodes:
        if node.is_constant:
            env[node.outputs[0].id] = torch.as_tensor(node.value, device=like.device)
            continue
        result = torch_op_call(node.op, node.attrs, [None if v is None else env[v.id] for v in node.inputs])
        for value, out in zip(node.outputs, result if node.op.tuple_output else (result,)):
            env[value.id] = out
    return [env[v.id] for v in graph.outputs]
