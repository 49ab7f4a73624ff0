"""sigmoid, hard_sigmoid, clip, erf, gelu and sum: every native kernel against
the NumPy reference (check_op), the references against independent formulas,
special values (infinities, NaN), the dtypes only the reference covers
(float16, integers), inference with unknown dims, and bad inputs as typed
errors.  (Each gradient rule is gradchecked in test_autodiff.py's GRADCHECKS.)"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import opforge
from opforge import TensorSpec
from opforge.errors import CheckError, DTypeError, OpforgeError
from opforge.testing import check_op

ops = opforge.ops
FLOATS = ["float32", "float64"]
SPECIALS = np.array([-np.inf, -30.0, -3.0, -1.0, -0.0, 0.0, 0.3, 1.0, 2.5, 30.0, np.inf, np.nan])
ERF = np.vectorize(math.erf, otypes=[np.float64])


def sample(shape, dtype, seed=0, scale=3.0):
    values = np.random.default_rng(seed).standard_normal(shape) * scale
    return values.astype(dtype) if np.dtype(dtype).kind == "f" else np.round(values).astype(dtype)


def native_kernels_ran(checks):
    return [name for name, ok, _ in checks if ok and "agrees with" in name]


def assert_checks_pass(checks):
    failed = [(name, detail) for name, ok, detail in checks if ok is False]
    assert not failed, failed


# (function, attributes, independent float64 formula)
UNARY = {
    "sigmoid": (ops.sigmoid, {}, lambda x: 1 / (1 + np.exp(-x))),
    "hard_sigmoid": (ops.hard_sigmoid, {"alpha": 0.25, "beta": 0.4}, lambda x: np.clip(0.25 * x + 0.4, 0, 1)),
    "clip": (ops.clip, {"min": -1.5, "max": 0.75}, lambda x: np.clip(x, -1.5, 0.75)),
    "erf": (ops.erf, {}, ERF),
    "gelu": (ops.gelu, {}, lambda x: x * 0.5 * (1 + ERF(x / np.sqrt(2)))),
    "gelu_tanh": (ops.gelu, {"approximate": "tanh"},
                  lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
}


@pytest.mark.parametrize("case", list(UNARY))
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 5), (), (0, 3)])
def test_unary_kernels_agree_with_reference_and_formula(case, dtype, shape):
    fn, attrs, formula = UNARY[case]
    x = sample(shape, dtype, seed=len(shape))
    checks = check_op(fn, x, **attrs)
    assert_checks_pass(checks)
    if x.size:
        assert native_kernels_ran(checks), f"no native kernel ran for {case} {dtype}"
    y = fn(x, **attrs)
    assert y.dtype == x.dtype and y.shape == x.shape
    # float attributes cross the ABI as 32-bit floats: float64 agrees to float32 rounding of the attributes
    rtol = 1e-5 if dtype == "float32" or attrs else 1e-12
    np.testing.assert_allclose(y, formula(x.astype(np.float64)), rtol=rtol, atol=1e-6 if dtype == "float32" else 1e-7)


@pytest.mark.parametrize("case", list(UNARY))
@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_special_values(case, dtype):
    fn, attrs, formula = UNARY[case]
    x = SPECIALS.astype(dtype)
    assert_checks_pass(check_op(fn, x, **attrs))
    y = fn(x, **attrs)
    assert np.isnan(y[-1])  # NaN stays NaN
    finite = np.isfinite(x)
    with np.errstate(all="ignore"):
        want = formula(x[finite].astype(np.float64))
    np.testing.assert_allclose(y[finite], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", list(UNARY))
def test_unary_float16_runs_through_the_reference(case):
    fn, attrs, formula = UNARY[case]
    x = sample((4, 5), "float16")
    y = fn(x, **attrs)
    assert y.dtype == np.float16 and y.shape == x.shape
    np.testing.assert_allclose(y.astype(np.float64), formula(x.astype(np.float64)), rtol=2e-3, atol=2e-3)


def test_saturation_limits():
    assert ops.sigmoid(np.array([-1000.0, 1000.0], np.float32)).tolist() == [0.0, 1.0]
    assert ops.sigmoid(np.array([-12.0], np.float16))[0] == np.float16(1 / (1 + np.exp(12.0))) > 0  # no float16 overflow
    assert ops.erf(np.array([-np.inf, np.inf])).tolist() == [-1.0, 1.0]
    assert ops.gelu(np.array([np.inf], np.float32))[0] == np.inf
    assert ops.hard_sigmoid(np.array([-np.inf, np.inf])).tolist() == [0.0, 1.0]


@pytest.mark.parametrize("case", [case for case in UNARY if case != "clip"])  # (clip takes integers: below)
def test_unary_rejects_integers(case):
    fn, attrs, _ = UNARY[case]
    with pytest.raises(DTypeError, match="floating-point"):
        fn(np.arange(4, dtype=np.int32), **attrs)


@pytest.mark.parametrize("case", list(UNARY))
def test_unary_inference_with_unknown_dims(case):
    fn, attrs, _ = UNARY[case]
    op = fn.op
    assert op.infer(TensorSpec([-1, 3], "float32"), **attrs) == TensorSpec([-1, 3], "float32")
    assert op.infer(TensorSpec(None, "float64"), **attrs).rank is None


# -- clip ---------------------------------------------------------------------------

def test_clip_defaults_are_infinite():
    x = SPECIALS.astype(np.float32)
    np.testing.assert_array_equal(ops.clip(x), x)
    np.testing.assert_array_equal(ops.clip(x, min=0.0), np.clip(x, 0.0, None))
    np.testing.assert_array_equal(ops.clip(x, max=0.0), np.clip(x, None, 0.0))


def test_clip_min_above_max_gives_max():
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    assert (ops.clip(x, min=2.0, max=1.0) == 1.0).all()
    assert (ops.clip(x.astype(np.int64), min=2.0, max=1.0) == 1).all()


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8"])
def test_clip_integers_exactly(dtype):
    info = np.iinfo(dtype)
    x = np.array([v for v in [info.min, -7, -1, 0, 3, 9, info.max] if info.min <= v], dtype)
    y = ops.clip(x, min=-2.5, max=8.0)
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, np.clip(x.astype(np.float64), -2, 8).astype(dtype))
    np.testing.assert_array_equal(ops.clip(x), x)  # infinite bounds
    np.testing.assert_array_equal(ops.clip(x, min=1e30), np.full_like(x, info.max))  # beyond the range: clamped


def test_clip_large_int64_is_exact():
    x = np.array([2 ** 62 + 1, -(2 ** 62) - 1, 5], np.int64)
    y = ops.clip(x, min=-(2.0 ** 62), max=2.0 ** 62)
    assert y.tolist() == [2 ** 62, -(2 ** 62), 5]


def test_clip_errors():
    with pytest.raises(CheckError, match="NaN"):
        ops.clip(np.ones(3, np.float32), min=float("nan"))
    with pytest.raises(DTypeError, match="bool"):
        ops.clip(np.ones(3, bool))


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(OpforgeError, match="approximate"):
        ops.gelu(np.ones(3, np.float32), approximate="erf")


# -- sum ----------------------------------------------------------------------------

SUM_SHAPES = [[(3, 4)], [(3, 4), (3, 4)], [(2, 3, 4), (3, 1), (4,)], [(4,), (3, 1), (2, 3, 4)], [(), ()],
              [(1,), (3, 1), (1, 5), ()], [(2, 1, 3), (1, 4, 1), (2, 4, 3), (3,)], [(0, 3), (3,)]]


@pytest.mark.parametrize("dtype", FLOATS + ["int32", "int64"])
@pytest.mark.parametrize("shapes", SUM_SHAPES)
def test_sum_agrees_with_numpy(dtype, shapes):
    inputs = [sample(s, dtype, seed=k) for k, s in enumerate(shapes)]
    checks = check_op(ops.sum, *inputs)
    assert_checks_pass(checks)
    want = inputs[0]
    for x in inputs[1:]:
        want = want + x
    got = ops.sum(*inputs)
    if want.size:
        assert native_kernels_ran(checks)
    assert got.dtype == np.dtype(dtype) and got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 7, 8, 11])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_sum_of_same_shape_inputs_adds_in_order_exactly(count, dtype, threads):
    # 70001 elements: more than two of the kernel's blocks and a tail; the inputs are folded four, then
    # three at a time, and must give exactly ((x0 + x1) + x2) + ...
    inputs = [sample((70001,), dtype, seed=k) * (10.0 ** (k % 5) if dtype == "float32" else 1)
              for k in range(count)]
    want = inputs[0].copy()
    for x in inputs[1:]:
        want = want + x
    np.testing.assert_array_equal(ops.sum(*inputs), want)


def test_sum_of_one_input_is_a_copy():
    x = sample((3,), "float32")
    y = ops.sum(x)
    np.testing.assert_array_equal(y, x)
    y[0] = 100
    assert x[0] != 100
    assert np.signbit(ops.sum(np.array([-0.0]))[0])  # -0.0 stays -0.0 (written, not added to 0)


def test_sum_float16_and_errors():
    a, b = sample((2, 3), "float16"), sample((3,), "float16", seed=1)
    np.testing.assert_array_equal(ops.sum(a, b), a + b)
    with pytest.raises(DTypeError, match="one dtype"):
        ops.sum(np.ones(3, np.float32), np.ones(3, np.float64))
    with pytest.raises(opforge.ShapeError):
        ops.sum(np.ones(3, np.float32), np.ones(4, np.float32))
    with pytest.raises(OpforgeError):
        ops.sum()


def test_sum_inference_with_unknown_dims():
    op = ops.sum.op
    assert op.infer(TensorSpec([-1, 3], "float32"), TensorSpec([4, 1], "float32")) == TensorSpec([4, 3], "float32")
    assert op.infer(TensorSpec([-1, 3], "float32"), TensorSpec(None, "float32")).rank is None


def test_sum_runs_channel_blocked_in_graphs():
    shape = (2, 20, 3, 5)  # 20 channels: the blocked buffers are padded
    a, b, c = (sample(shape, "float32", seed=k) for k in range(3))
    graph = opforge.trace(lambda x, y, z: ops.relu(ops.sum(ops.relu(x), y, z)),
                          *(TensorSpec(shape) for _ in range(3)))
    plain = graph(a, b, c)
    np.testing.assert_allclose(plain, np.maximum(np.maximum(a, 0) + b + c, 0), rtol=1e-6)
    opforge.graph.select_layouts(graph, prefer="nchw16c")
    layouts = {node.op.name: node.kernel.layout for node in graph.nodes if node.op.name != "reorder"}
    assert layouts == {"relu": "nchw16c", "sum": "nchw16c"}
    np.testing.assert_array_equal(graph(a, b, c), plain)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_sum_of_integers_wraps_as_numpy_does(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, 5], dtype)
    b = np.array([1, -1, 7], dtype)
    checks = check_op(ops.sum, a, b, b)
    assert_checks_pass(checks)
    assert native_kernels_ran(checks)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(ops.sum(a, b, b), a + b + b)


@settings(max_examples=40, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=4, min_side=0, max_side=4),
       dtype=st.sampled_from(FLOATS + ["int32", "int64"]), count=st.integers(1, 3))
def test_sum_broadcasts_any_shapes_as_numpy(shapes, dtype, count):
    inputs = [sample(s, dtype, seed=k) for k, s in enumerate(shapes.input_shapes[:count])]
    got = ops.sum(*inputs)
    want = np.broadcast_to(inputs[0], np.broadcast_shapes(*(x.shape for x in inputs))).copy()
    for x in inputs[1:]:
        want = want + x
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)
