"""Reverse-mode differentiation: every built-in gradient rule against finite
differences, grad / value_and_grad / vjp / backward against hand-derived
NumPy gradients, Custom's MindSpore-style bprop, and the errors."""
from pathlib import Path

import numpy as np
import pytest

import opforge
from helpers import declare
from opforge import Custom, CustomRegOp, TensorSpec
from opforge.errors import GradientError, OpforgeError
from opforge.graph import Graph
from opforge.testing import OpCheckFailure, gradcheck

ops = opforge.ops
OPS_CC = Path(__file__).resolve().parent / "kernels" / "ops.cc"


def rng(seed=0):
    return np.random.default_rng(seed)


def away_from_zero(x, margin=0.1):
    """Inputs of relu kept off its kink, where finite differences are meaningless."""
    return np.where(np.abs(x) < margin, np.sign(x + 1e-12) * (margin + np.abs(x)), x)




# -- gradcheck of every built-in rule ------------------------------------------------

def r(*shape, seed=0):
    return rng(seed).standard_normal(shape)


def positive(*shape, seed=0):
    return rng(seed).random(shape) + 0.5


def closing_over(fn, fixed, at=0):
    """``fn`` with argument ``at`` fixed (a condition, a shape donor), so gradcheck varies only the others."""
    def closed(*xs, **attrs):
        return fn(*xs[:at], fixed, *xs[at:], **attrs)

    closed.op = fn.op
    return closed


def scaled_by_shape(x):
    """x times its last dim, read by the shape op (whose rule gives x no gradient)."""
    return ops.mul(x, ops.cast(ops.shape(x, start=-1), dtype="float64"))


scaled_by_shape.op = ops.shape.op


def topk_values(x, **attrs):
    return ops.topk(x, **attrs)[0]


topk_values.op = ops.topk.op


def max_pool_values(x, **attrs):
    return ops.max_pool_with_indices(x, **attrs)[0]


max_pool_values.op = ops.max_pool_with_indices.op


GRADCHECKS = {
    "add": (ops.add, [r(3, 4), r(3, 4, seed=1)], {}),
    "add_broadcast_b": (ops.add, [r(2, 3, 4), r(3, 1, seed=1)], {}),
    "add_broadcast_a": (ops.add, [r(4), r(3, 4, seed=1)], {}),
    "add_broadcast_both": (ops.add, [r(3, 1), r(1, 4, seed=1)], {}),
    "add_scalar": (ops.add, [r(3, 4), r(seed=1)], {}),
    "sub_broadcast_b": (ops.sub, [r(2, 3, 4), r(4, seed=1)], {}),
    "sub_broadcast_a": (ops.sub, [r(1, 4), r(3, 4, seed=1)], {}),
    "mul": (ops.mul, [r(3, 4), r(3, 4, seed=1)], {}),
    "mul_broadcast_b": (ops.mul, [r(2, 3, 4), r(3, 1, seed=1)], {}),
    "mul_broadcast_a": (ops.mul, [r(3, 1), r(2, 1, 4, seed=1)], {}),
    "neg": (ops.neg, [r(3, 4)], {}),
    "reduce_sum_all": (ops.reduce_sum, [r(2, 3, 4)], {}),
    "reduce_sum_axis": (ops.reduce_sum, [r(2, 3, 4)], {"axes": [1]}),
    "reduce_sum_axes_keep": (ops.reduce_sum, [r(2, 3, 4)], {"axes": [0, -1], "keep_dims": True}),
    "reduce_sum_all_keep": (ops.reduce_sum, [r(2, 3)], {"keep_dims": True}),
    "softmax_0": (ops.softmax, [r(2, 3, 4)], {"axis": 0}),
    "softmax_1": (ops.softmax, [r(2, 3, 4)], {"axis": 1}),
    "softmax_2": (ops.softmax, [r(2, 3, 4)], {"axis": 2}),
    "softmax_-1": (ops.softmax, [r(2, 3, 4)], {"axis": -1}),
    "exp": (ops.exp, [r(3, 4)], {}),
    "tanh": (ops.tanh, [r(3, 4)], {}),
    "matmul": (ops.matmul, [r(3, 4), r(4, 5, seed=1)], {}),
    "matmul_batched": (ops.matmul, [r(2, 3, 4), r(2, 4, 2, seed=1)], {}),
    "relu": (ops.relu, [away_from_zero(r(3, 4))], {}),
    "reshape": (ops.reshape, [r(3, 4)], {"shape": [2, -1, 3]}),
    "transpose": (ops.transpose, [r(3, 4)], {}),
    "transpose_batched": (ops.transpose, [r(2, 3, 4)], {}),
    "relu_grad": (ops.relu_grad, [r(3, 4), away_from_zero(r(3, 4, seed=1))], {}),
    "leaky_relu": (ops.leaky_relu, [away_from_zero(r(3, 4))], {"alpha": 0.25}),
    "leaky_relu_grad": (ops.leaky_relu_grad, [r(3, 4), away_from_zero(r(3, 4, seed=1))], {"alpha": 0.25}),
    "div_broadcast_b": (ops.div, [r(2, 3, 4), positive(3, 1, seed=1)], {}),
    "div_broadcast_a": (ops.div, [r(4), positive(3, 4, seed=1)], {}),
    "pow": (ops.pow, [positive(3, 4), r(3, 4, seed=1)], {}),
    "pow_broadcast": (ops.pow, [positive(3, 1), r(4, seed=1)], {}),
    "maximum_broadcast": (ops.maximum, [r(3, 4), r(4, seed=1)], {}),
    "maximum_ties": (ops.maximum, [np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 5.0])], {}),
    "minimum_broadcast": (ops.minimum, [r(3, 1), r(2, 1, 4, seed=1)], {}),
    "where": (closing_over(ops.where, r(3, 4) > 0), [r(3, 4, seed=1), r(4, seed=2)], {}),
    "where_broadcast": (closing_over(ops.where, r(4) > 0), [r(3, 1, seed=1), r(seed=2)], {}),
    "sqrt": (ops.sqrt, [positive(3, 4)], {}),
    "log": (ops.log, [positive(3, 4)], {}),
    "abs": (ops.abs, [away_from_zero(r(3, 4))], {}),
    "cast": (ops.cast, [r(3, 4)], {"dtype": "float64"}),
    "slice": (ops.slice, [r(4, 5)], {"starts": [1, -1], "ends": [3, 0], "axes": [0, 1], "steps": [1, -2]}),
    "slice_grad": (closing_over(ops.slice_grad, r(4, 5), at=1), [r(2, 2)],
                   {"starts": [1, -1], "ends": [3, 0], "axes": [0, 1], "steps": [1, -2]}),
    "squeeze": (ops.squeeze, [r(1, 3, 1)], {"axes": [0, -1]}),
    "unsqueeze": (ops.unsqueeze, [r(3, 2)], {"axes": [0, -2]}),
    "concat": (ops.concat, [r(2, 3), r(2, 1, seed=1), r(2, 2, seed=2)], {"axis": -1}),
    "mean_all": (ops.mean, [r(2, 3, 4)], {}),
    "mean_axes_keep": (ops.mean, [r(2, 3, 4)], {"axes": [0, -1], "keep_dims": True}),
    "dim": (ops.dim, [r(2, 3)], {"axis": 1, "dtype": "float64"}),
    # sigmoid, hard_sigmoid, clip, erf, gelu, sum
    "sigmoid": (ops.sigmoid, [r(3, 4)], {}),
    "hard_sigmoid": (ops.hard_sigmoid, [r(3, 4) * 4], {"alpha": 0.25, "beta": 0.5}),
    "clip": (ops.clip, [r(3, 4) * 2], {"min": -1.0, "max": 0.5}),
    "clip_lower_only": (ops.clip, [r(3, 4)], {"min": 0.25}),
    "erf": (ops.erf, [r(3, 4)], {}),
    "gelu": (ops.gelu, [r(3, 4) * 2], {}),
    "gelu_tanh": (ops.gelu, [r(3, 4) * 2], {"approximate": "tanh"}),
    "sum": (ops.sum, [r(2, 3, 4), r(3, 1, seed=1), r(4, seed=2)], {}),
    "sum_one": (ops.sum, [r(3, 4)], {}),
    # transpose with perm, shape, constant_of_shape, gather, tile, expand, topk
    "transpose_perm": (ops.transpose, [r(2, 3, 4)], {"perm": [2, 0, -2]}),
    "shape": (scaled_by_shape, [r(3, 4)], {}),
    "constant_of_shape": (ops.constant_of_shape, [r(1)], {"shape": [2, 3]}),
    "gather": (closing_over(ops.gather, np.array([[0, 3], [3, -1]]), at=1), [r(2, 4, 3)], {"axis": 1}),
    "gather_grad": (closing_over(closing_over(ops.gather_grad, np.array([2, -1, 2]), at=1), r(4, 3), at=2),
                    [r(3, 3)], {"axis": 0}),
    "tile": (ops.tile, [r(3, 2)], {"repeats": [2, 3]}),
    "expand": (ops.expand, [r(3, 1)], {"shape": [2, 1, 4]}),
    "topk": (topk_values, [r(3, 5, 2)], {"k": 2, "axis": 1}),
    "topk_smallest": (topk_values, [r(4, 3)], {"k": 3, "axis": 0, "largest": False}),
    # max_pool, average_pool, global_average_pool, batch_norm, pad
    "max_pool": (ops.max_pool, [r(1, 2, 5, 6)],
                 {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "ceil_mode": True}),
    "max_pool_with_indices": (max_pool_values, [r(1, 2, 5, 6)],
                              {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "storage_order": 1}),
    "average_pool": (ops.average_pool, [r(1, 2, 5, 6)],
                     {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "ceil_mode": True}),
    "average_pool_include_pad_1d": (ops.average_pool, [r(2, 1, 7)],
                                    {"kernel_shape": [3], "dilations": [2], "pads": [2, 1],
                                     "count_include_pad": True}),
    "global_average_pool": (ops.global_average_pool, [r(2, 3, 2, 2)], {}),
    "batch_norm": (ops.batch_norm, [r(2, 3, 2), r(3, seed=1), r(3, seed=2), r(3, seed=3), positive(3, seed=4)],
                   {"epsilon": 1e-3}),
    "pad_constant": (ops.pad, [r(3, 4)], {"pads": [1, -1, 2, 2], "value": 0.5}),
    "pad_reflect": (ops.pad, [r(3, 4)], {"pads": [2, 1, 1, 3], "mode": "reflect"}),
    "layer_norm": (ops.layer_norm, [r(2, 3, 4), r(3, 4, seed=1), r(4, seed=2)], {"axis": 1}),
    "layer_norm_no_bias": (ops.layer_norm, [r(2, 5), r(5, seed=1)], {"epsilon": 1e-3}),
    "lrn": (ops.lrn, [r(2, 5, 3)], {"size": 3, "alpha": 0.3, "bias": 1.5}),
    "lrn_even": (ops.lrn, [r(1, 4, 2, 2)], {"size": 2, "alpha": 0.5, "beta": 0.6}),
    "resize_linear": (ops.resize, [r(1, 2, 4, 5)], {"scales": [1, 1, 2, 1.5], "mode": "linear"}),
    "resize_cubic_antialias": (ops.resize, [r(1, 2, 6, 5)], {"sizes": [3, 7], "axes": [2, 3], "mode": "cubic",
                                                             "antialias": True}),
    "resize_crop": (ops.resize, [r(1, 2, 4, 5)], {"scales": [1, 1, 1.5, 1.2], "mode": "linear",
                                                  "coordinate_transformation_mode": "tf_crop_and_resize",
                                                  "roi": [0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2]}),
    # matmul (broadcast), gemm, conv, conv_transpose
    "matmul_broadcast": (ops.matmul, [r(2, 1, 3, 4), r(1, 3, 4, 2, seed=1)], {}),
    "gemm": (ops.gemm, [r(3, 4), r(4, 5, seed=1), r(5, seed=2)], {"alpha": 0.5, "beta": 2.0}),
    "gemm_transposed": (ops.gemm, [r(4, 3), r(5, 4, seed=1), r(3, 1, seed=2)],
                        {"trans_a": True, "trans_b": True, "beta": -1.5}),
    "gemm_no_c": (closing_over(ops.gemm, None, at=2), [r(4, 3), r(4, 5, seed=1)], {"trans_a": True}),
    "conv": (ops.conv, [r(2, 4, 5, 6), r(6, 2, 3, 2, seed=1), r(6, seed=2)],
             {"strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2], "group": 2}),
    "conv_1d_no_bias": (closing_over(ops.conv, None, at=2), [r(1, 2, 7), r(3, 2, 3, seed=1)], {"strides": [2]}),
    "conv_transpose": (ops.conv_transpose, [r(1, 4, 3, 4), r(4, 3, 2, 3, seed=1), r(6, seed=2)],
                       {"strides": [2, 1], "pads": [1, 0, 0, 1], "group": 2, "output_padding": [1, 0]}),
    "conv_transpose_1d_no_bias": (closing_over(ops.conv_transpose, None, at=2), [r(2, 2, 4), r(2, 3, 3, seed=1)],
                                  {"strides": [3], "dilations": [2]}),
    # gather_elements, scatter_elements, gather_nd, scatter_nd (repeated indices add up; "none" writes once)
    "gather_elements": (closing_over(ops.gather_elements, np.array([[2, -1, 0], [0, 0, 1]]), at=1), [r(3, 4)],
                        {"axis": 0}),
    "scatter_elements": (closing_over(ops.scatter_elements, np.array([[1, 0, 3], [2, 3, 0]]), at=1),
                         [r(3, 4), r(2, 3, seed=1)], {"axis": 1}),
    "scatter_elements_add": (closing_over(ops.scatter_elements, np.array([[1, 1, 0]]), at=1),
                             [r(3, 4), r(1, 3, seed=1)], {"reduction": "add"}),
    "gather_nd": (closing_over(ops.gather_nd, np.array([[1, 2], [1, 2], [0, -1]]), at=1), [r(2, 3, 4)], {}),
    "gather_nd_batch": (closing_over(ops.gather_nd, np.array([[[2], [0]], [[1], [1]]]), at=1), [r(2, 3)],
                        {"batch_dims": 1}),
    "scatter_nd": (closing_over(ops.scatter_nd, np.array([[1], [0]]), at=1), [r(2, 3), r(2, 3, seed=1)], {}),
    "scatter_nd_add": (closing_over(ops.scatter_nd, np.array([[1, 2], [1, 2]]), at=1), [r(2, 3, 4), r(2, 4, seed=1)],
                       {"reduction": "add"}),
    # the trigonometric family (inputs inside each domain), cumsum, trilu
    **{name: (getattr(ops, name), [np.clip(r(3, 4) * 0.4, -0.9, 0.9)], {})
       for name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "atanh")},
    "acosh": (ops.acosh, [positive(3, 4) + 1.0], {}),
    "cumsum": (ops.cumsum, [r(3, 4)], {"axis": 1}),
    "cumsum_exclusive_reverse": (ops.cumsum, [r(2, 3, 4)], {"axis": 0, "exclusive": True, "reverse": True}),
    "trilu": (ops.trilu, [r(2, 4, 5)], {"k": 1}),
    "trilu_lower": (ops.trilu, [r(4, 4)], {"upper": False, "k": -1}),
}


@pytest.mark.parametrize("case", list(GRADCHECKS))
def test_gradcheck_builtin_rules(case):
    fn, inputs, attrs = GRADCHECKS[case]
    worst = gradcheck(fn, *inputs, **attrs)
    assert 0.0 <= worst < 1e-6


def test_gradcheck_takes_a_float64_graph_and_says_what_to_do_with_another():
    def fn(x, w):
        return opforge.ops.tanh(opforge.ops.matmul(x, w))

    x, w = np.linspace(-1, 1, 6).reshape(2, 3), np.linspace(-0.5, 0.5, 12).reshape(3, 4)
    graph64 = opforge.trace(fn, opforge.TensorSpec([None, 3], "float64"), opforge.TensorSpec([3, 4], "float64"))
    assert gradcheck(graph64, x, w) < 1e-6
    graph32 = opforge.trace(fn, opforge.TensorSpec([None, 3], "float32"), opforge.TensorSpec([3, 4], "float32"))
    with pytest.raises(opforge.DTypeError, match="gradcheck computes in float64.*trace it with float64 specs"):
        gradcheck(graph32, x, w)


def test_every_builtin_rule_is_gradchecked():
    checked = {fn.op.name for fn, _, _ in GRADCHECKS.values()}
    # reorder is checked through vjp below.
    skipped = {"opforge.builtins.reorder"}
    with_rules = {op.name for op in opforge.registered_ops()
                  if op.grad_rule is not None and op.grad_rule.__module__.startswith("opforge.builtins")
                  and op.grad_rule.__module__ not in skipped}
    assert {"add", "matmul", "relu_grad"} <= with_rules
    assert with_rules <= checked


def test_gradient_through_reorder_round_trip():
    # (Not gradcheck: its finite differences call reorder eagerly, which overruns its output buffer --
    # see test_graph.py::test_eager_reorder_to_nchw16c_does_not_overrun_its_output.)
    def fn(x):
        return ops.reorder(ops.reorder(x, layout="nchw16c"), layout="ndarray") * x

    x, dy = r(2, 20, 3, 5), r(2, 20, 3, 5, seed=1)
    out, pullback = opforge.vjp(fn, x)
    np.testing.assert_array_equal(out, x * x)
    np.testing.assert_allclose(pullback(dy)[0], 2 * x * dy, rtol=1e-12)


def test_gradcheck_of_a_composite_function():
    w = r(4, 3, seed=2)

    def fn(x, b):
        return ops.softmax(ops.tanh(x @ w) + b, axis=0), ops.reduce_sum(ops.exp(x) * x, axes=[1])

    gradcheck(fn, r(2, 4), r(3, seed=3))


def test_gradcheck_catches_a_wrong_rule(fresh):
    cube = declare(fresh, "tautodiff::cube(Tensor x) -> Tensor y", traits=["no_side_effect"])
    cube.def_infer(opforge.infer.same_as(0))

    @cube.kernel
    def _(x):
        return x * x * x

    @cube.grad(save=["x"])
    def _(saved, dy):
        return dy * saved.x * saved.x  # should be 3 x^2

    x = r(5) + 2.0
    with pytest.raises(OpCheckFailure, match="tautodiff::cube"):
        gradcheck(cube, x)

    @cube.grad(save=["x"])
    def _(saved, dy):
        return dy * saved.x * saved.x * np.array(3.0)

    gradcheck(cube, x)


# -- grad, value_and_grad, vjp -----------------------------------------------------

def mlp_loss(x, w1, b1, w2, y):
    h = ops.tanh(ops.add(ops.matmul(x, w1), b1))
    d = ops.sub(ops.matmul(h, w2), y)
    return ops.reduce_sum(ops.mul(d, d))


def mlp_reference(x, w1, b1, w2, y):
    h = np.tanh(x @ w1 + b1)
    d = h @ w2 - y
    dd = 2 * d
    dw2 = h.T @ dd
    dz = (dd @ w2.T) * (1 - h * h)
    return {"loss": float((d * d).sum()), "x": dz @ w1.T, "w1": x.T @ dz, "b1": dz.sum(0), "w2": dw2}


def mlp_args(seed=40):
    g = rng(seed)
    return [g.standard_normal(s) for s in [(5, 3), (3, 4), (4,), (4, 2), (5, 2)]]


def test_grad_with_int_and_tuple_argnums():
    args = mlp_args()
    want = mlp_reference(*args)
    dw1 = opforge.grad(mlp_loss, argnums=1)(*args)
    assert isinstance(dw1, np.ndarray) and dw1.shape == (3, 4)
    np.testing.assert_allclose(dw1, want["w1"], rtol=1e-10, atol=1e-12)
    dx = opforge.grad(mlp_loss)(*args)  # argnums defaults to 0
    np.testing.assert_allclose(dx, want["x"], rtol=1e-10, atol=1e-12)
    grads = opforge.grad(mlp_loss, argnums=(1, 2, 3))(*args)
    assert isinstance(grads, tuple) and len(grads) == 3
    for got, name in zip(grads, ["w1", "b1", "w2"]):
        np.testing.assert_allclose(got, want[name], rtol=1e-10, atol=1e-12)


def test_value_and_grad():
    args = mlp_args(41)
    want = mlp_reference(*args)
    value, (dw1, dw2) = opforge.value_and_grad(mlp_loss, argnums=(1, 3))(*args)
    assert float(value) == pytest.approx(want["loss"], rel=1e-12)
    np.testing.assert_allclose(dw1, want["w1"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dw2, want["w2"], rtol=1e-10, atol=1e-12)
    # A second call with new values (same shapes) reuses the graphs but not the numbers.
    args2 = mlp_args(42)
    value2, (dw1_2, _) = opforge.value_and_grad(mlp_loss, argnums=(1, 3))(*args2)
    assert float(value2) == pytest.approx(mlp_reference(*args2)["loss"], rel=1e-12)
    np.testing.assert_allclose(dw1_2, mlp_reference(*args2)["w1"], rtol=1e-10, atol=1e-12)


def test_grad_of_a_relu_mlp_in_float32():
    g = rng(43)
    x = g.standard_normal((8, 6)).astype(np.float32)
    w = g.standard_normal((6, 5)).astype(np.float32)
    loss = opforge.grad(lambda x, w: ops.reduce_sum(ops.relu(ops.matmul(x, w))), argnums=1)
    dw = loss(x, w)
    assert dw.dtype == np.float32
    z = x.astype(np.float64) @ w
    np.testing.assert_allclose(dw, x.T.astype(np.float64) @ (z > 0).astype(np.float64), rtol=1e-5, atol=1e-5)


def test_vjp_with_a_non_scalar_output_and_explicit_cotangents():
    g = rng(44)
    x, w = g.standard_normal((4, 3)), g.standard_normal((3, 2))
    out, pullback = opforge.vjp(lambda x, w: ops.tanh(ops.matmul(x, w)), x, w)
    t = np.tanh(x @ w)
    np.testing.assert_allclose(out, t, rtol=1e-12)
    for seed in (45, 46):
        dy = rng(seed).standard_normal((4, 2))
        dx, dw = pullback(dy)
        dz = dy * (1 - t * t)
        np.testing.assert_allclose(dx, dz @ w.T, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(dw, x.T @ dz, rtol=1e-10, atol=1e-12)
    with pytest.raises(GradientError):
        pullback(dy, dy)


def test_vjp_of_several_outputs():
    g = rng(47)
    a, b = g.standard_normal((2, 3)), g.standard_normal(3)
    (s, p), pullback = opforge.vjp(lambda a, b: (a + b, ops.reduce_sum(a * b, axes=[1])), a, b)
    np.testing.assert_allclose(s, a + b, rtol=1e-12)
    np.testing.assert_allclose(p, (a * b).sum(1), rtol=1e-12)
    ds, dp = g.standard_normal((2, 3)), g.standard_normal(2)
    da, db = pullback(ds, dp)
    np.testing.assert_allclose(da, ds + dp[:, None] * b, rtol=1e-12)
    np.testing.assert_allclose(db, ds.sum(0) + (dp[:, None] * a).sum(0), rtol=1e-12)


def test_gradients_accumulate_when_a_value_is_used_twice():
    x = np.array([1.0, -2.0, 3.5])
    np.testing.assert_allclose(opforge.grad(lambda x: ops.reduce_sum(x * x + x))(x), 2 * x + 1, rtol=1e-12)
    np.testing.assert_allclose(opforge.grad(lambda x: ops.reduce_sum(ops.tanh(x) * ops.exp(x) - x))(x),
                               (1 - np.tanh(x) ** 2) * np.exp(x) + np.tanh(x) * np.exp(x) - 1, rtol=1e-12)


def test_an_unused_argument_gets_a_zero_gradient():
    dx, dy = opforge.grad(lambda x, y: ops.reduce_sum(x), argnums=(0, 1))(np.ones((2, 2)), np.ones(3))
    np.testing.assert_array_equal(dx, np.ones((2, 2)))
    np.testing.assert_array_equal(dy, np.zeros(3))


# -- errors ------------------------------------------------------------------------

def test_no_grad_trait_and_missing_rule_raise_gradient_error_naming_the_op(fresh):
    stop = declare(fresh, "tautodiff::stop(Tensor x) -> Tensor y", traits=["no_grad", "no_side_effect"])
    stop.def_infer(opforge.infer.same_as(0))
    stop.kernel(lambda x: x.copy())
    stop.grad(lambda saved, dy: dy)  # ignored: no_grad wins
    x = r(3)
    np.testing.assert_array_equal(stop(x), x)
    with pytest.raises(GradientError, match="tautodiff::stop"):
        opforge.grad(lambda x: ops.reduce_sum(stop(x)))(x)

    norule = declare(fresh, "tautodiff::norule(Tensor x) -> Tensor y", traits=["no_side_effect"])
    norule.def_infer(opforge.infer.same_as(0))
    norule.kernel(lambda x: 2 * x)
    with pytest.raises(GradientError, match="tautodiff::norule"):
        opforge.grad(lambda x: ops.reduce_sum(norule(x)))(x)
    _, pullback = opforge.vjp(lambda x: norule(x), x)
    with pytest.raises(GradientError, match="tautodiff::norule"):
        pullback(np.ones(3))


def test_ops_without_rules_off_the_differentiated_path_are_fine(fresh):
    stop = declare(fresh, "tautodiff::stop2(Tensor x) -> Tensor y", traits=["no_grad", "no_side_effect"])
    stop.def_infer(opforge.infer.same_as(0))
    stop.kernel(lambda x: x.copy())
    norule = declare(fresh, "tautodiff::norule2(Tensor x) -> Tensor y", traits=["no_side_effect"])
    norule.def_infer(opforge.infer.same_as(0))
    norule.kernel(lambda x: 2 * x)
    x, y = r(3), r(3, seed=1)
    grads = opforge.grad(lambda x, y: ops.reduce_sum(x * x) + ops.reduce_sum(norule(y)), argnums=0)(x, y)
    np.testing.assert_allclose(grads, 2 * x, rtol=1e-12)
    grads = opforge.grad(lambda x, y: ops.reduce_sum(x * stop(y)), argnums=0)(x, y)
    np.testing.assert_allclose(grads, y, rtol=1e-12)


def test_grad_of_a_non_scalar_function_raises():
    with pytest.raises(GradientError, match="scalar"):
        opforge.grad(lambda x: x * x)(r(3))
    with pytest.raises(GradientError):
        opforge.grad(lambda x: (ops.reduce_sum(x), ops.reduce_sum(x)))(r(3))


def test_a_rule_returning_the_wrong_number_of_gradients_raises(fresh):
    op = declare(fresh, "tautodiff::product(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda a, b: a * b)

    @op.grad(save=["a", "b"])
    def _(saved, dy):
        return dy * saved.b  # forgets b's gradient

    with pytest.raises(GradientError, match="tautodiff::product"):
        opforge.grad(lambda a, b: ops.reduce_sum(op(a, b)))(r(3), r(3, seed=1))

    @op.grad(save=["a", "b"])
    def _(saved, dy):
        return dy * saved.b, dy * saved.a, dy

    with pytest.raises(GradientError, match="3 gradient"):
        opforge.grad(lambda a, b: ops.reduce_sum(op(a, b)))(r(3), r(3, seed=1))


def test_a_rule_returning_a_wrongly_shaped_gradient_raises(fresh):
    op = declare(fresh, "tautodiff::twice(Tensor x) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x: 2 * x)
    op.grad(lambda saved, dy: ops.reduce_sum(dy))
    with pytest.raises(GradientError, match="shape"):
        opforge.grad(lambda x: ops.reduce_sum(op(x)))(r(3))


# -- backward graphs ---------------------------------------------------------------

def test_backward_graph_takes_inputs_then_cotangents_and_runs(tmp_path):
    forward = opforge.trace(lambda x, w: (ops.tanh(ops.matmul(x, w)), ops.reduce_sum(x, axes=[1])),
                            TensorSpec([4, 3], "float64"), TensorSpec([3, 2], "float64"))
    backward = opforge.backward(forward)
    assert isinstance(backward, Graph)
    assert [v.spec for v in backward.inputs] == [TensorSpec([4, 3], "float64"), TensorSpec([3, 2], "float64"),
                                                  TensorSpec([4, 2], "float64"), TensorSpec([4], "float64")]
    assert [v.spec for v in backward.outputs] == [TensorSpec([4, 3], "float64"), TensorSpec([3, 2], "float64")]
    g = rng(48)
    x, w, dy, ds = (g.standard_normal(s) for s in [(4, 3), (3, 2), (4, 2), (4,)])
    t = np.tanh(x @ w)
    dz = dy * (1 - t * t)
    want = (dz @ w.T + ds[:, None], x.T @ dz)
    dx, dw = backward(x, w, dy, ds)
    np.testing.assert_allclose(dx, want[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dw, want[1], rtol=1e-10, atol=1e-12)

    only_w = opforge.backward(forward, wrt=[1])
    assert len(only_w.outputs) == 1 and len(only_w.inputs) == 4
    np.testing.assert_allclose(only_w(x, w, dy, ds)[0], want[1], rtol=1e-10, atol=1e-12)

    path = tmp_path / "backward.json"
    backward.save(path)
    loaded = Graph.load(path)
    for got, expected in zip(loaded(x, w, dy, ds), want):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_backward_graph_with_an_unknown_batch():
    w = r(3, 2, seed=49)
    forward = opforge.trace(lambda x: ops.tanh(x @ w), TensorSpec([-1, 3], "float64"))
    backward = opforge.backward(forward)
    assert backward.inputs[1].spec.shape == (-1, 2)
    for n in (2, 5):
        x, dy = r(n, 3, seed=n), r(n, 2, seed=n + 10)
        np.testing.assert_allclose(backward(x, dy)[0], (dy * (1 - np.tanh(x @ w) ** 2)) @ w.T, rtol=1e-10)


def test_backward_of_a_dynamic_batch_reduction_works_or_raises_an_opforge_error():
    forward = opforge.trace(lambda x: ops.reduce_sum(ops.tanh(x), axes=[1]), TensorSpec([-1, 3], "float64"))
    try:
        backward = opforge.backward(forward)
    except OpforgeError:
        return  # a typed refusal is acceptable
    x, dy = r(4, 3), r(4, seed=1)
    np.testing.assert_allclose(backward(x, dy)[0], dy[:, None] * (1 - np.tanh(x) ** 2), rtol=1e-10)


# -- Custom with bprop ------------------------------------------------------------

def test_pyfunc_custom_bprop_gives_gradients():
    seen = []

    def product(x, y):
        return x * y

    def bprop(x, y, out, dout):
        seen.append((x, y, out, dout))
        return dout * y, dout * x

    op = Custom(product, lambda x, y: x, lambda x, y: x, "pyfunc", bprop=bprop)
    x, y = r(3), r(3, seed=1)
    np.testing.assert_allclose(op(x, y), x * y, rtol=1e-12)
    dx, dy = opforge.grad(lambda a, b: ops.reduce_sum(ops.tanh(op(a, b))), argnums=(0, 1))(x, y)
    sech2 = 1 - np.tanh(x * y) ** 2
    np.testing.assert_allclose(dx, sech2 * y, rtol=1e-10)
    np.testing.assert_allclose(dy, sech2 * x, rtol=1e-10)
    # bprop saw arrays: the inputs, the forward output and the incoming gradient
    bx, by, bout, bdout = seen[-1]
    np.testing.assert_allclose(bout, x * y, rtol=1e-12)
    np.testing.assert_allclose(bdout, sech2, rtol=1e-10)

    out, pullback = opforge.vjp(op, x, y)
    cot = np.array([1.0, -2.0, 0.5])
    dx, dy = pullback(cot)
    np.testing.assert_allclose(dx, cot * y, rtol=1e-12)
    np.testing.assert_allclose(dy, cot * x, rtol=1e-12)


def test_aot_custom_bprop_gives_gradients():
    """ops.cc's SumDiffDot: (x + w, x - w, [sum(x * w)]), shapes from its InferShape."""
    seen = []

    def bprop(x, w, out, dout):
        seen.append(dout)
        ds, dd, dp = dout
        return ds + dd + dp * w, ds - dd + dp * x

    info = (CustomRegOp("tautodiff_sum_diff_dot").input(0, "x").input(1, "w")
            .output(0, "s").output(1, "d").output(2, "p").target("CPU").get_op_info())
    op = Custom(f"{OPS_CC}:SumDiffDot", None, ("float32",) * 3, "aot", bprop=bprop, reg_info=info)
    x = r(2, 3).astype(np.float32)
    w = r(2, 3, seed=1).astype(np.float32)
    s, d, p = op(x, w)
    np.testing.assert_allclose(s, x + w, rtol=1e-6)
    np.testing.assert_allclose(d, x - w, rtol=1e-6)
    np.testing.assert_allclose(p, [(x * w).sum()], rtol=1e-5)

    c = r(2, 3, seed=2).astype(np.float32)

    def loss(x, w):
        s, d, p = op(x, w)
        return ops.reduce_sum(s * c) + ops.reduce_sum(ops.reshape(p, shape=[]) * d)

    dx, dw = opforge.grad(loss, argnums=(0, 1))(x, w)
    total_d = (x - w).sum()
    dot = (x * w).sum()
    np.testing.assert_allclose(dx, c + dot + total_d * w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw, c - dot + total_d * x, rtol=1e-4, atol=1e-5)
    assert all(isinstance(dout, tuple) and len(dout) == 3 for dout in seen)

    _, pullback = opforge.vjp(op, x, w)
    ones = np.ones((2, 3), np.float32)
    dx, dw = pullback(ones, 2 * ones, np.array([3.0], np.float32))
    np.testing.assert_allclose(dx, 3 + 3 * w, rtol=1e-6)
    np.testing.assert_allclose(dw, -1 + 3 * x, rtol=1e-6)


def test_aot_custom_with_attributes_and_bprop_gives_gradients():
    a, b = 2.0, -0.5
    info = (CustomRegOp("tautodiff_lin").input(0, "x").input(1, "w").output(0, "y")
            .attr("a", "required", "all", value=a).attr("b", "required", "all", value=b).target("CPU").get_op_info())

    def bprop(x, w, out, dout):
        return dout * np.float32(a), dout * np.float32(b)

    lin = Custom(f"{OPS_CC}:Lin", lambda x, w: x, "float32", "aot", bprop=bprop, reg_info=info)
    x = r(2, 3).astype(np.float32)
    w = r(2, 3, seed=1).astype(np.float32)
    np.testing.assert_allclose(lin(x, w), a * x + b * w, rtol=1e-6)
    c = r(2, 3, seed=2).astype(np.float32)
    dx, dw = opforge.grad(lambda x, w: ops.reduce_sum(lin(x, w) * c), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(dx, a * c, rtol=1e-6)
    np.testing.assert_allclose(dw, b * c, rtol=1e-6)


def test_multi_output_custom_bprop_receives_tuples():
    seen = []

    def sum_and_product(x, y):
        return x + y, x * y

    def bprop(x, y, out, dout):
        seen.append((out, dout))
        ds, dp = dout
        return ds + dp * y, ds + dp * x

    op = Custom(sum_and_product, ([3], [3]), ("float64", "float64"), "pyfunc", bprop=bprop)
    x, y = r(3), r(3, seed=1)
    s, p = op(x, y)
    np.testing.assert_allclose(s, x + y, rtol=1e-12)
    np.testing.assert_allclose(p, x * y, rtol=1e-12)

    _, pullback = opforge.vjp(op, x, y)
    ds, dp = np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.5, 2.0])
    dx, dy = pullback(ds, dp)
    np.testing.assert_allclose(dx, ds + dp * y, rtol=1e-12)
    np.testing.assert_allclose(dy, ds + dp * x, rtol=1e-12)
    out, dout = seen[-1]
    assert isinstance(out, tuple) and isinstance(dout, tuple) and len(out) == len(dout) == 2
    np.testing.assert_allclose(out[0], x + y, rtol=1e-12)
    np.testing.assert_allclose(out[1], x * y, rtol=1e-12)
    np.testing.assert_array_equal(dout[0], ds)
    np.testing.assert_array_equal(dout[1], dp)

    # Only the product reaches the loss: the sum's cotangent arrives as zeros.
    dx, dy = opforge.grad(lambda a, b: ops.reduce_sum(op(a, b)[1]), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(dx, y, rtol=1e-12)
    np.testing.assert_allclose(dy, x, rtol=1e-12)
    np.testing.assert_array_equal(seen[-1][1][0], np.zeros(3))


def test_multi_output_custom_with_callable_inference_and_bprop():
    def bprop(x, y, out, dout):
        ds, dp = dout
        return ds + dp * y, ds + dp * x

    info = (CustomRegOp("tautodiff_sum_product").input(0, "x").input(1, "y").output(0, "s").output(1, "p")
            .target("CPU").get_op_info())
    op = Custom(lambda x, y: (x + y, x * y), lambda x, y: (x, x), lambda x, y: (x, x), "pyfunc",
                bprop=bprop, reg_info=info)
    x, y = r(3), r(3, seed=1)
    s, p = op(x, y)
    np.testing.assert_allclose(p, x * y, rtol=1e-12)
    dx, dy = opforge.grad(lambda a, b: ops.reduce_sum(op(a, b)[1]), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(dx, y, rtol=1e-12)


def test_grad_sees_arrays_the_function_reads_from_outside():
    weights = {"w": np.full((3, 2), 2.0)}

    def loss(x):
        return ops.reduce_sum(x @ weights["w"])

    g = opforge.grad(loss)
    x = np.ones((1, 3))
    np.testing.assert_allclose(g(x), [[4.0, 4.0, 4.0]])
    weights["w"] = np.full((3, 2), 5.0)
    np.testing.assert_allclose(g(x), [[10.0, 10.0, 10.0]])
    weights["w"][:] = 7.0
    np.testing.assert_allclose(g(x), [[14.0, 14.0, 14.0]])


def test_value_and_grad_plans_once_per_graph_and_retraces_what_changed(monkeypatch):
    from opforge.graph import autodiff

    made = []
    joint_graph = autodiff.joint_graph
    monkeypatch.setattr(autodiff, "joint_graph", lambda *a: made.append(1) or joint_graph(*a))
    scale = {"by": np.full(3, 2.0)}

    def f(x):
        return ops.reduce_sum(ops.tanh(x) * scale["by"])

    vg = opforge.value_and_grad(f)
    x = r(3)
    for _ in range(3):
        value, g = vg(x)
    assert len(made) == 1  # one trace-to-graph, planned once, for three calls
    np.testing.assert_allclose(g, 2 * (1 - np.tanh(x) ** 2), rtol=1e-12)
    scale["by"] = np.full(3, 3.0)  # a new constant: a new graph
    np.testing.assert_allclose(vg(x)[1], 3 * (1 - np.tanh(x) ** 2), rtol=1e-12)
    assert len(made) == 2
    scale["by"] = np.full(4, 3.0)
    vg(r(4))  # a new shape: a new graph
    assert len(made) == 3


def test_a_call_like_an_earlier_one_is_checked_as_it_runs_without_a_new_trace(monkeypatch):
    from opforge.graph import autodiff

    traced = []  # the traces of f itself (joint graphs are traces too)
    trace = autodiff.trace
    monkeypatch.setattr(autodiff, "trace", lambda fn, *a, **k: traced.append(fn is f) or trace(fn, *a, **k))
    state = {"axis": -1, "bias": np.zeros(3), "branch": False}

    def f(x):
        y = ops.softmax(x, axis=state["axis"]) + state["bias"]
        if state["branch"]:  # Python control flow: another sequence of calls
            y = ops.exp(y)
        return ops.reduce_sum(y * y)

    vg = opforge.value_and_grad(f)
    x = r(2, 3)
    want = vg(x)
    for _ in range(3):  # the same calls: no trace
        got = vg(x)
    assert traced.count(True) == 1
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
    reference = opforge.value_and_grad(f)  # a fresh one traces every time it is asked here
    np.testing.assert_allclose(vg(2 * x)[1], reference(2 * x)[1], rtol=1e-12)  # new values: still no trace of vg's
    assert traced.count(True) == 2
    for change, value in [("axis", 0), ("bias", np.ones(3)), ("branch", True)]:
        state[change] = value  # an attribute, a constant, the calls themselves: each is a new trace
        before = traced.count(True)
        np.testing.assert_allclose(vg(x)[1], opforge.value_and_grad(f)(x)[1], rtol=1e-12)
        assert traced.count(True) == before + 2  # vg's and the fresh one's


def test_a_function_that_swallows_errors_cannot_hide_a_different_call():
    calls = {"attribute": 1.0}

    def f(x):
        try:
            y = ops.leaky_relu(x, alpha=calls["attribute"])
        except Exception:  # the check of a later call must not be swallowed here
            y = x
        return ops.reduce_sum(y * 3.0)

    vg = opforge.value_and_grad(f)
    x = -np.ones(3)
    np.testing.assert_allclose(vg(x)[1], [3.0, 3.0, 3.0])
    calls["attribute"] = 0.5
    np.testing.assert_allclose(vg(x)[1], [1.5, 1.5, 1.5])


def test_the_joint_graph_computes_the_forward_once():
    from opforge.graph.autodiff import joint_graph

    forward = opforge.trace(lambda x: ops.reduce_sum(ops.tanh(ops.exp(x))), TensorSpec([5], "float64"))
    joint = joint_graph(forward)
    names = [node.op.name for node in joint.nodes if not node.is_constant]
    assert names.count("exp") == 1 and names.count("tanh") == 1  # the rules read the forward's values
    x = r(5)
    value, gradient = joint(x)
    assert float(value) == pytest.approx(np.tanh(np.exp(x)).sum(), rel=1e-12)
    np.testing.assert_allclose(gradient, (1 - np.tanh(np.exp(x)) ** 2) * np.exp(x), rtol=1e-12)
