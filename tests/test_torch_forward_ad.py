"""Forward-mode AD of opforge ops in PyTorch, from their reverse gradient rules
(``torch.autograd.forward_ad``, ``torch.func.jvp`` and ``jacfwd``), torch.func's reverse
transforms, and typed errors where a tangent cannot be had.  Each case runs with the C++
call path and without it (``OPFORGE_TORCH_FAST=0`` in a subprocess for the latter)."""
import subprocess
import sys
import warnings

import pytest
import torch
from torch.autograd import forward_ad

import opforge
import opforge.torch  # noqa: F401  (defines torch.ops.opforge.*)
from helpers import declare
from opforge.errors import GradientError

F64 = torch.float64


def rand(*shape):
    return torch.rand(*shape, dtype=F64, generator=GENERATOR) + 0.25


GENERATOR = torch.Generator().manual_seed(3)


def layer_norm(x, s, b):
    return torch.ops.opforge.layer_norm(x, s, b, axis=-1, epsilon=1e-5)[0]


def test_jvp_of_elementwise_matmul_and_layer_norm_equals_torchs():
    x, v = rand(4, 8), rand(4, 8)
    assert torch.allclose(torch.func.jvp(torch.ops.opforge.tanh, (x,), (v,))[1],
                          torch.func.jvp(torch.tanh, (x,), (v,))[1])
    w, vw = rand(8, 3), rand(8, 3)
    assert torch.allclose(torch.func.jvp(torch.ops.opforge.matmul, (x, w), (v, vw))[1], v @ w + x @ vw)
    s, b, vs, vb = rand(8), rand(8), rand(8), rand(8)
    ours = torch.func.jvp(layer_norm, (x, s, b), (v, vs, vb))[1]
    theirs = torch.func.jvp(lambda x, s, b: torch.nn.functional.layer_norm(x, (8,), s, b, 1e-5),
                            (x, s, b), (v, vs, vb))[1]
    assert torch.allclose(ours, theirs)


def test_dual_tensors_carry_tangents_through_opforge_ops():
    x, v, w = rand(3, 5), rand(3, 5), rand(5, 2)
    with forward_ad.dual_level():
        y = torch.ops.opforge.matmul(forward_ad.make_dual(x, v), w)  # one input with a tangent
        z = torch.ops.opforge.sigmoid(y)
        primal, tangent = forward_ad.unpack_dual(z)
    expected = torch.sigmoid(x @ w)
    assert torch.allclose(primal, expected)
    assert torch.allclose(tangent, expected * (1 - expected) * (v @ w))


def test_jacfwd_jacrev_and_grad_agree_with_torchs():
    x = rand(6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's vmap fallback warns about opforge ops' batching
        for transform in (torch.func.jacfwd, torch.func.jacrev):
            assert torch.allclose(transform(torch.ops.opforge.exp)(x), torch.diag(torch.exp(x)))
        assert torch.allclose(torch.func.grad(lambda t: torch.ops.opforge.tanh(t).sum())(x), 1 - torch.tanh(x) ** 2)


def test_forward_mode_without_a_rule_is_a_gradient_error(fresh):
    op = declare(fresh, "tfwd::plus_one(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))

    @op.kernel
    def _(x):
        return x + 1

    x = rand(3)
    with pytest.raises(GradientError, match="no gradient rule"):
        torch.func.jvp(torch.ops.tfwd.plus_one, (x,), (x,))
    with forward_ad.dual_level(), pytest.raises(GradientError, match="no gradient rule"):
        torch.ops.tfwd.plus_one(forward_ad.make_dual(x, x))
    assert torch.equal(torch.ops.tfwd.plus_one(x), x + 1)  # no tangent asked: the call runs


def test_nested_differentiating_transforms_are_a_gradient_error_and_create_graph_works():
    x = rand(4)

    def f(t):
        return torch.ops.opforge.tanh(t).sum()

    with pytest.raises(GradientError, match="cannot nest"):
        torch.func.hessian(f)(x)
    xr = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(xr), xr, create_graph=True)
    (g2,) = torch.autograd.grad(g.sum(), xr)
    assert torch.allclose(g2, -2 * torch.tanh(x) * (1 - torch.tanh(x) ** 2))


def test_forward_mode_on_the_python_call_path():
    code = ("import torch, opforge.torch\n"
            "x, v = torch.rand(5, dtype=torch.float64), torch.rand(5, dtype=torch.float64)\n"
            "y, t = torch.func.jvp(torch.ops.opforge.tanh, (x,), (v,))\n"
            "assert opforge.torch.fast_path.library() is None\n"
            "assert torch.allclose(t, (1 - torch.tanh(x) ** 2) * v), t\n"
            "print('ok')\n")
    env = {**__import__("os").environ, "OPFORGE_TORCH_FAST": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
