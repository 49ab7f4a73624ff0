"""torch.library.opcheck passes for every built-in op on its samples (tests/builtin_samples.py):
the schema, the autograd registration, the fake kernel against the real one, and compiled
(aot_eager, dynamic shapes) against eager, forward and backward.  torch.autograd.gradcheck
agrees with opforge.testing.gradcheck on every sample with a gradient."""
import numpy as np
import pytest
import torch

import opforge.torch as ot
from builtin_samples import GRAPH_ONLY, SAMPLES, op_named, samples_for
from opforge.testing import gradcheck

CASES = [(name, k) for name in sorted(SAMPLES) for k in range(len(SAMPLES[name])) if name not in GRAPH_ONLY]
IDS = [f"{name}-{k}" for name, k in CASES]


def torch_call(name, k, requires_grad=True):
    """(torch op, args, kwargs) of sample k of op ``name``; differentiable inputs require grad."""
    op, sample = op_named(name), samples_for(name)[k]
    tensors = [None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in sample.args]
    for index in sample.differentiable:
        tensors[index].requires_grad_(requires_grad)
    attrs = {key: getattr(torch, value) if op.attrs[key].type == "DType" else value
             for key, value in sample.attrs.items()}
    args = [tensors] if op.variadic else tensors
    return ot.register(op).default, args, attrs


def test_every_builtin_but_the_graph_only_ones_is_checked():
    assert {name for name, _ in CASES} == set(SAMPLES) - set(GRAPH_ONLY)
    assert set(GRAPH_ONLY) == {"reorder"}  # blocked layouts exist only inside graphs, in torch as in opforge


@pytest.mark.parametrize("name, k", CASES, ids=IDS)
def test_opcheck(name, k):
    packet, args, kwargs = torch_call(name, k)
    result = torch.library.opcheck(packet, tuple(args), kwargs)
    assert set(result.values()) == {"SUCCESS"}, result


GRADIENT_CASES = [(name, k) for name, k in CASES if SAMPLES[name][k].differentiable]


@pytest.mark.parametrize("name, k", GRADIENT_CASES, ids=[f"{n}-{k}" for n, k in GRADIENT_CASES])
def test_torch_gradcheck_agrees_with_opforge_gradcheck(name, k):
    op, sample = op_named(name), samples_for(name)[k]
    packet, args, kwargs = torch_call(name, k)
    tensors = args[0] if op.variadic else args
    varied = [tensors[i] for i in sample.differentiable]

    def f(*values):
        call = list(tensors)
        for index, value in zip(sample.differentiable, values):
            call[index] = value
        out = packet(*([call] if op.variadic else call), **kwargs)
        return tuple(o for o in (out if isinstance(out, tuple) else (out,)) if o.is_floating_point())

    assert torch.autograd.gradcheck(f, tuple(varied), eps=1e-6, atol=1e-5, rtol=1e-4)
    # opforge's own check of the same rule, on the same inputs (it raises OpCheckFailure when off)
    fixed = list(sample.args)

    def g(*values):
        call = list(fixed)
        for index, value in zip(sample.differentiable, values):
            call[index] = value
        out = op(*call, **sample.attrs)
        return tuple(o for o in (out if isinstance(out, tuple) else (out,)) if np.dtype(o.dtype).kind == "f")

    g.op = op
    assert gradcheck(g, *[fixed[i] for i in sample.differentiable]) < 1e-6
