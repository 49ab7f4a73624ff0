"""layer_norm and lrn (and lrn_grad) kernels on opforge's thread pool against their NumPy references: rows and
blocks of positions past the grain, widths that are not multiples of a vector, data far from zero, 1 and 2
threads."""
import numpy as np
import pytest

import opforge
from opforge.builtins.layer_norm import layer_norm_reference
from opforge.builtins.lrn import lrn_grad_reference, lrn_reference
from helpers import assert_native

ops = opforge.ops
TOLERANCE = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-7, atol=1e-10)}


def normal(shape, dtype, seed, loc=0.0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale + loc).astype(dtype)


@pytest.mark.parametrize("shape, axis", [((300, 257), -1), ((3, 50, 1001), 1), ((2, 5000), 1), ((513, 7), 1),
                                         ((4, 3, 70000), 2)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("loc", [0.0, 300.0])  # a mean far from zero: the variance must not cancel
def test_layer_norm_matches_reference(shape, axis, dtype, loc, threads):
    x = normal(shape, dtype, seed=1, loc=loc)
    normalised = shape[axis % len(shape):]
    scale, bias = normal(normalised, dtype, seed=2), normal(normalised[-1:], dtype, seed=3)  # bias broadcast
    assert_native("layer_norm", x, scale, bias)
    got = ops.layer_norm(x, scale, bias, axis=axis, epsilon=1e-5)
    want = layer_norm_reference(x, scale, bias, axis=axis, epsilon=1e-5)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, **TOLERANCE[dtype])


def test_layer_norm_constant_rows():
    """Zero variance: inv_std_dev is 1 / sqrt(epsilon) exactly as the reference has it, y is the bias."""
    x = np.full((3, 40), 2.5, np.float32)
    scale, bias = np.ones(40, np.float32), np.arange(40, dtype=np.float32)
    y, mean, inv = ops.layer_norm(x, scale, bias, epsilon=1e-3)
    np.testing.assert_array_equal(mean, np.full((3, 1), 2.5, np.float32))
    np.testing.assert_allclose(inv, np.full((3, 1), 1 / np.sqrt(np.float32(1e-3))), rtol=1e-6)
    np.testing.assert_array_equal(y, np.broadcast_to(bias, (3, 40)))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_layer_norm_over_no_elements_gives_nan_statistics(dtype):
    """Rows of nothing to normalise (a 0 normalised dim): the kernel runs for mean and inv_std_dev, which are
    NaN, the mean of nothing, as the reference (float16's kernel) gives them; y is empty."""
    x, scale, bias = np.ones((3, 0), dtype), np.ones(0, dtype), np.ones(0, dtype)
    for given in ((x, scale, bias), (x, scale)):
        y, mean, inv = ops.layer_norm(*given)
        assert y.shape == (3, 0) and mean.shape == inv.shape == (3, 1)
        assert np.isnan(mean).all() and np.isnan(inv).all(), (given, mean, inv)
    assert opforge.testing.check_op(ops.layer_norm, x, scale, bias)


LRN_CASES = [((2, 64, 19, 23), dict(size=5, alpha=1e-4, beta=0.75, bias=1.0)),  # blocks of positions, a tail
             ((3, 7, 300), dict(size=3, alpha=0.3, beta=0.6, bias=1.5)),
             ((1, 9, 2), dict(size=4, alpha=0.5, beta=1.3, bias=0.5)),  # fewer positions than a vector
             ((2, 3, 700), dict(size=8, alpha=0.2, beta=0.75, bias=2.0))]  # a window wider than the channels


@pytest.mark.parametrize("shape, attrs", LRN_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lrn_and_gradient_match_references(shape, attrs, dtype, threads):
    x, dy = normal(shape, dtype, seed=4, scale=3.0), normal(shape, dtype, seed=5)
    assert_native("lrn", x)
    assert_native("lrn_grad", dy, x)
    np.testing.assert_allclose(ops.lrn(x, **attrs), lrn_reference(x, **attrs), **TOLERANCE[dtype])
    np.testing.assert_allclose(ops.lrn_grad(dy, x, **attrs), lrn_grad_reference(dy, x, **attrs), **TOLERANCE[dtype])


# -- layer_norm without a bias: its own native variant (absent_inputs) ------------------------------------
def layer_norm_kernel(*specs):
    from opforge import TensorSpec
    from opforge.runtime.dispatch import select_kernel

    return select_kernel(opforge.lookup("layer_norm"),
                         [None if s is None else TensorSpec(s.shape, str(s.dtype)) for s in specs])


@pytest.mark.parametrize("shape, axis, scale_shape", [((300, 257), -1, (257,)), ((3, 50, 101), 1, (50, 101)),
                                                      ((3, 50, 101), 1, (1, 101)), ((4, 6, 9), 0, (1,)),
                                                      ((2, 5000), 1, (5000,)), ((5, 0), 1, (0,))])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_without_bias_runs_natively_and_matches(shape, axis, scale_shape, dtype, threads):
    from opforge.runtime.aot import AotKernel

    x, scale = normal(shape, dtype, seed=4, loc=3.0), normal(scale_shape, dtype, seed=5)
    kernel = layer_norm_kernel(x, scale, None)
    assert isinstance(kernel, AotKernel) and kernel.absent_inputs == {"bias"}, kernel
    got = ops.layer_norm(x, scale, axis=axis, epsilon=1e-5)
    want = layer_norm_reference(x, scale, axis=axis, epsilon=1e-5)
    with_zero_bias = ops.layer_norm(x, scale, np.zeros(scale_shape[-1:], dtype), axis=axis, epsilon=1e-5)
    for g, w, z in zip(got, want, with_zero_bias):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, **TOLERANCE[dtype])
        np.testing.assert_array_equal(g, z)  # the same arithmetic as the kernel with a bias of zeros


def test_a_call_without_bias_stays_in_the_native_launcher(monkeypatch):
    """The launcher plans a signature with an absent input as any other (None is part of it) and hands the
    kernel the present inputs: after the first call, Python runs nothing (CallPlanner.run is for calls the
    launcher cannot make)."""
    from opforge.runtime.dispatch import CallPlanner

    x, scale = normal((16, 32), "float32", 8), normal((32,), "float32", 9)
    first = ops.layer_norm(x, scale, None)
    python_runs = []
    run = CallPlanner.run
    monkeypatch.setattr(CallPlanner, "run", lambda self, arrays: python_runs.append(self.op.name) or run(self, arrays))
    again = ops.layer_norm(x + 1, scale, None)
    assert python_runs == []
    np.testing.assert_allclose(again[0], layer_norm_reference(x + 1, scale, axis=-1, epsilon=1e-5)[0], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(first[0], ops.layer_norm(x, scale, None)[0])
    bias = normal((32,), "float32", 10)  # the same launcher, another signature: a plan of its own
    np.testing.assert_allclose(ops.layer_norm(x, scale, bias)[0], first[0] + bias, rtol=1e-5, atol=1e-5)
    assert python_runs == []


def test_layer_norm_kernel_without_bias_is_refused_a_bias():
    x, scale, bias = normal((4, 8), "float32", 1), normal((8,), "float32", 2), normal((8,), "float32", 3)
    no_bias = layer_norm_kernel(x, scale, None)
    assert layer_norm_kernel(x, scale, bias) is not no_bias
    reason = no_bias.reject_reason(opforge.lookup("layer_norm"), [opforge.TensorSpec.of(a) for a in (x, scale, bias)])
    assert reason is not None and "'bias'" in reason


def test_layer_norm_without_bias_in_a_graph_and_its_gradient():
    """A graph runs the no-bias kernel in its native program; the gradient (dx, dscale) is right."""
    from opforge.testing import gradcheck

    x, scale = normal((3, 4, 5), "float64", 6), normal((4, 5), "float64", 7)
    fn = opforge.trace(lambda a, s: ops.layer_norm(a, s, axis=1)[0], x, scale)
    np.testing.assert_allclose(fn(x, scale), layer_norm_reference(x, scale, axis=1, epsilon=1e-5)[0], rtol=1e-7)
    (plan,) = fn._executor.plans.values()
    assert plan.program is not None  # the native program: its kernel takes the call without a bias
    assert gradcheck(ops.layer_norm, x, scale, axis=1) < 1e-6
    y, pullback = opforge.vjp(lambda a, s: ops.layer_norm(a, s, axis=1)[0], x, scale)
    dx, dscale = pullback(np.ones_like(y))
    assert dx.shape == x.shape and dscale.shape == scale.shape and np.isfinite(dx).all()


def test_absent_inputs_name_optional_inputs_only():
    op = opforge.op("test_absent::scaled(Tensor x, Tensor? s=None) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    with pytest.raises(opforge.SchemaError, match="absent_inputs"):
        op.kernel(lambda x, s: x, absent_inputs=["x"])
