"""tests/builtin_samples.py itself: every built-in op has samples, each runs eagerly and matches the op's NumPy
reference, and the ops with gradient rules pass gradcheck on them (varying only the ``differentiable`` inputs)."""
import numpy as np
import pytest

import opforge
from builtin_samples import GRAPH_ONLY, SAMPLES, every_builtin_op, op_named, samples_for
from opforge.testing import gradcheck

CASES = [(name, k) for name in sorted(SAMPLES) for k in range(len(SAMPLES[name]))]
IDS = [f"{name}-{k}" for name, k in CASES]


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def test_every_builtin_op_has_a_sample():
    builtins = {op.name for op in every_builtin_op()}
    assert {"add", "conv", "max_pool_grad", "topk_grad", "reorder"} <= builtins
    missing = sorted(builtins - set(SAMPLES))
    assert not missing, f"built-in ops without samples in tests/builtin_samples.py: {missing}"
    assert set(SAMPLES) <= builtins, f"samples for ops that are not built-ins: {sorted(set(SAMPLES) - builtins)}"
    assert all(SAMPLES[name] for name in builtins)


def test_every_builtin_op_leaves_out_ops_declared_elsewhere(fresh):
    from helpers import declare

    declare(fresh, "tsamples::other(Tensor x) -> Tensor y")
    names = {op.name for op in every_builtin_op()}
    assert "tsamples::other" not in names and "relu" in names


def test_samples_for_returns_copies():
    first = samples_for("relu")[0]
    first.args[0][...] = 0
    assert np.any(samples_for("relu")[0].args[0] != 0)
    with pytest.raises(KeyError):
        samples_for("no_such_op")


@pytest.mark.parametrize("name, k", CASES, ids=IDS)
def test_sample_is_well_formed(name, k):
    op, s = op_named(name), SAMPLES[name][k]
    assert isinstance(s.args, tuple) and isinstance(s.attrs, dict)
    assert set(s.attrs) <= set(op.attrs), f"unknown attributes {sorted(set(s.attrs) - set(op.attrs))}"
    if op.variadic:
        assert s.args and all(isinstance(a, np.ndarray) for a in s.args)
    else:
        assert len(s.args) == len(op.inputs)
        for arg, spec in zip(s.args, op.inputs):
            assert isinstance(arg, np.ndarray) or (arg is None and spec.optional)
    assert sum(a.size for a in s.args if a is not None) <= 200, "keep samples small"
    if op.grad_rule is None:
        assert s.differentiable == (), f"'{name}' has no gradient rule"
    assert len(set(s.differentiable)) == len(s.differentiable)
    for index in s.differentiable:
        assert 0 <= index < len(s.args)
        assert isinstance(s.args[index], np.ndarray) and s.args[index].dtype.kind == "f", \
            f"differentiable input {index} is not a floating-point array"


@pytest.mark.parametrize("name, k", [c for c in CASES if c[0] not in GRAPH_ONLY],
                         ids=[i for c, i in zip(CASES, IDS) if c[0] not in GRAPH_ONLY])
def test_sample_runs_eagerly_and_matches_the_reference(name, k):
    op, s = op_named(name), SAMPLES[name][k]
    out = as_tuple(op(*s.args, **s.attrs))
    assert len(out) == len(op.outputs)
    if op.reference_kernel is None:
        return
    want = as_tuple(op.reference_kernel.fn(*s.args, **op.resolve_attrs(s.attrs)))
    for got, expected, output in zip(out, want, op.outputs):
        assert got.dtype == expected.dtype and got.shape == expected.shape, output
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0, err_msg=f"{name} output '{output}'")


def vary_only(op, s):
    """A function of the differentiable inputs alone: the others (integer indices, bool conditions, masks, shape
    donors, absent inputs) stay as the sample has them -- tests/test_autodiff.py's closing_over, for every
    fixed input at once -- returning only the op's floating-point outputs (topk's indices cannot move)."""
    kept = [k for k, o in enumerate(as_tuple(op(*s.args, **s.attrs))) if np.asarray(o).dtype.kind == "f"]

    def fn(*varied):
        args = list(s.args)
        for index, value in zip(s.differentiable, varied):
            args[index] = value
        out = as_tuple(op(*args, **s.attrs))
        return tuple(out[k] for k in kept) if len(kept) > 1 else out[kept[0]]

    fn.__name__ = op.name
    return fn


GRADCHECKED = [c for c in CASES if SAMPLES[c[0]][c[1]].differentiable and c[0] not in GRAPH_ONLY]


@pytest.mark.parametrize("name, k", GRADCHECKED, ids=[f"{n}-{k}" for n, k in GRADCHECKED])
def test_gradcheck_on_the_differentiable_inputs(name, k):
    op, s = op_named(name), SAMPLES[name][k]
    worst = gradcheck(vary_only(op, s), *(s.args[i] for i in s.differentiable))
    assert 0.0 <= worst < 1e-6


def test_every_op_with_a_gradient_rule_is_gradchecked():
    checked = {name for name, _ in GRADCHECKED} | set(GRAPH_ONLY)
    sizes_only = {"shape", "dim"}  # their rules give x no gradient
    with_rules = {op.name for op in every_builtin_op() if op.grad_rule is not None}
    assert with_rules - sizes_only <= checked


def test_reorder_sample_round_trips_in_a_graph():
    from opforge.builtins.reorder import to_blocked

    ops = opforge.ops
    (s,) = SAMPLES["reorder"]
    (x,) = s.args
    with pytest.raises(opforge.OpforgeError, match="nchw16c"):
        ops.reorder(x, **s.attrs)
    blocked = opforge.trace(lambda x: ops.reorder(x, **s.attrs), x)(x)
    np.testing.assert_array_equal(np.ravel(blocked), to_blocked(x).ravel())

    def round_trip(x):
        return ops.reorder(ops.reorder(x, **s.attrs), layout="ndarray") * x

    graph = opforge.trace(round_trip, x)
    np.testing.assert_array_equal(graph(x), x * x)
    assert gradcheck(graph, x) < 1e-6
