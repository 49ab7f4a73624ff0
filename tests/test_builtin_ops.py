"""The built-in ops: every native kernel variant against the op's NumPy reference,
over random shapes (empty and 0-d included), plus checks, inference and the
functional API."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import opforge
from opforge import TensorSpec
from opforge.runtime.cpu import best_isa
from opforge.runtime.dispatch import select_kernel

FLOATS = ["float32", "float64"]
NUMERIC = FLOATS + ["int32", "int64"]
# Few examples per (op, dtype): the file runs in seconds, kernels compile once.
SETTINGS = settings(max_examples=20, deadline=None)

add, mul = opforge.lookup("add"), opforge.lookup("mul")
reduce_sum, softmax = opforge.lookup("reduce_sum"), opforge.lookup("softmax")
exp, tanh, matmul = opforge.lookup("exp"), opforge.lookup("tanh"), opforge.lookup("matmul")


# exp, tanh and softmax have SSE2 (unmarked), AVX2 and AVX-512 variants: dispatch runs the best.
VECMATH_ISAS = ["", "[avx2]", "[avx512]"]


def vecmath_kernel(function, dtype):
    best = best_isa()
    return f"{function}[{best}]<{dtype}>" if best in ("avx2", "avx512") else f"{function}<{dtype}>"


def tolerance(dtype):
    if dtype == np.float32:  # atol: sums of a few hundred terms of magnitude <= 10 differ in rounding order
        return dict(rtol=1e-5, atol=1e-4)
    if dtype == np.float64:
        return dict(rtol=1e-12, atol=1e-10)
    if dtype == np.float16:
        return dict(rtol=1e-3, atol=1e-3)
    return dict(rtol=0, atol=0)


def elements(dtype, bound=10):
    if dtype.startswith("float"):
        return st.floats(-bound, bound, width=32 if dtype == "float32" else 64)
    return st.integers(-100, 100)  # products stay far from int32 overflow


def arrays(data, dtype, shape, **kwargs):
    return data.draw(hnp.arrays(dtype, shape, elements=elements(dtype, **kwargs)))


def shapes(min_dims=0, max_dims=4, max_side=4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=max_side)


def check(op, inputs, *, kernel=None, **attrs):
    """op(*inputs) against the op's reference: values, shape and dtype (also
    against inference), and the inputs left untouched.  ``kernel``: the name
    of the kernel dispatch must pick for these inputs."""
    before = [np.copy(x) for x in inputs]
    if kernel is not None:
        assert select_kernel(op, [TensorSpec.of(x) for x in inputs]).name == kernel
    _, resolved = op.bind(list(inputs), attrs)
    got = op(*inputs, **attrs)
    want = op.reference_kernel.fn(*inputs, **resolved)
    spec = op.infer(*inputs, **attrs)
    assert got.shape == want.shape == spec.shape
    assert got.dtype == want.dtype == np.dtype(spec.dtype)
    np.testing.assert_allclose(got, want, **tolerance(got.dtype))
    for x, original in zip(inputs, before):
        np.testing.assert_array_equal(x, original)
    return got


def test_native_kernel_variants():
    names = {op.name: sorted(k.name for k in op.kernels
                             if not k.reference and k.layout == "ndarray" and k.device == "cpu")
             for op in (add, mul, reduce_sum, softmax, exp, tanh, matmul)}
    assert names == {
        "add": sorted(f"Add<{d},{d}>" for d in NUMERIC),
        "mul": sorted(f"Mul<{d},{d}>" for d in NUMERIC),
        "reduce_sum": sorted(f"ReduceSum{i}<{d}>" for d in NUMERIC for i in VECMATH_ISAS),
        "softmax": sorted(f"Softmax{i}<{d}>" for d in FLOATS for i in VECMATH_ISAS),
        "exp": sorted(f"Exp{i}<{d}>" for d in FLOATS for i in VECMATH_ISAS),
        "tanh": sorted(f"Tanh{i}<{d}>" for d in FLOATS for i in VECMATH_ISAS),
        "matmul": sorted(f"MatMul<{d},{d}>" for d in FLOATS),
    }
    for op in (add, mul, reduce_sum, softmax, exp, tanh, matmul):
        assert op.reference_kernel is not None


# -- exp, tanh ---------------------------------------------------------------

@pytest.mark.parametrize("op,function", [(exp, "Exp"), (tanh, "Tanh")])
@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(shape=shapes(), data=st.data())
def test_unary(op, function, dtype, shape, data):
    check(op, [arrays(data, dtype, shape)], kernel=vecmath_kernel(function, dtype))


@pytest.mark.parametrize("op", [exp, tanh])
def test_unary_rejects_integers_and_falls_back_for_float16(op):
    with pytest.raises(opforge.DTypeError, match=f"op '{op.name}'.*int32"):
        op(np.arange(3, dtype=np.int32))
    x = np.linspace(-2, 2, 5).astype(np.float16)
    assert select_kernel(op, [TensorSpec.of(x)]).reference  # no native float16 variant
    check(op, [x])


def test_unary_inference_propagates_unknowns():
    assert exp.infer(TensorSpec([None, 3], "float32")) == TensorSpec([-1, 3], "float32")
    assert tanh.infer(TensorSpec(None, "float64")).rank is None


# -- add, mul ----------------------------------------------------------------

BINARY = [(add, "Add", np.add), (mul, "Mul", np.multiply)]


@pytest.mark.parametrize("op,function,ufunc", BINARY)
@pytest.mark.parametrize("dtype", NUMERIC)
@SETTINGS
@given(pair=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=0, max_side=4),
       data=st.data())
def test_binary_broadcasting(op, function, ufunc, dtype, pair, data):
    a_shape, b_shape = pair.input_shapes
    a, b = arrays(data, dtype, a_shape), arrays(data, dtype, b_shape)
    got = check(op, [a, b], kernel=f"{function}<{dtype},{dtype}>")
    assert got.shape == pair.result_shape
    np.testing.assert_array_equal(got, ufunc(a, b))  # exact: one rounding per element either way


# Each fast path and the general walk: same shape, a size-1 (or 0-d) input on
# either side, and broadcasting over inner, outer and middle dims.
BROADCAST_CASES = [
    ((2, 3), (2, 3)), ((), ()), ((2, 3), ()), ((), (2, 3)), ((2, 3), (1, 1)), ((1,), (4, 1, 2)),
    ((2, 3), (3,)), ((3,), (2, 3)), ((3, 1), (1, 4)), ((2, 1, 3), (4, 1)), ((5,), (2, 3, 5)),
    ((2, 1, 4, 1), (3, 1, 5)), ((0, 3), (3,)), ((2, 0), (1,)), ((0,), ()), ((1, 0), (3, 1)),
]


@pytest.mark.parametrize("op,function,ufunc", BINARY)
@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("a_shape,b_shape", BROADCAST_CASES)
def test_binary_cases(op, function, ufunc, dtype, a_shape, b_shape):
    rng = np.random.default_rng(0)
    a = rng.integers(-50, 50, a_shape).astype(dtype)
    b = rng.integers(-50, 50, b_shape).astype(dtype)
    got = check(op, [a, b], kernel=f"{function}<{dtype},{dtype}>")
    np.testing.assert_array_equal(got, ufunc(a, b))


@pytest.mark.parametrize("op,function,ufunc", BINARY)
def test_binary_non_contiguous_and_mixed_dtypes(op, function, ufunc):
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    for x, y in [(a.T, a[::-1].T), (a.T, a[:, 2]), (a[::2, ::-1], a[1, ::-1])]:  # views
        np.testing.assert_array_equal(op(x, y), ufunc(x, y))
    # float32 with float64 matches no native variant: the reference runs, y has a's dtype
    b = np.arange(4, dtype=np.float32)
    assert select_kernel(op, [TensorSpec.of(b), TensorSpec.of(a)]).reference
    assert check(op, [b, a]).dtype == np.float32


@pytest.mark.parametrize("op", [add, mul])
def test_binary_inference(op):
    f32 = "float32"
    assert op.infer(TensorSpec([None, 3], f32), TensorSpec([3], f32)) == TensorSpec([-1, 3], f32)
    assert op.infer(TensorSpec([None, 1], f32), TensorSpec([1, 5], f32)) == TensorSpec([-1, 5], f32)
    assert op.infer(TensorSpec([None, 3], f32), TensorSpec([4, 1], f32)) == TensorSpec([4, 3], f32)
    assert op.infer(TensorSpec(None, f32), TensorSpec([3], f32)).rank is None
    with pytest.raises(opforge.ShapeError):
        op.infer(TensorSpec([2, 3], f32), TensorSpec([4], f32))
    with pytest.raises(opforge.ShapeError):
        op(np.ones((2, 3), np.float32), np.ones(4, np.float32))


# -- reduce_sum --------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMERIC)
@SETTINGS
@given(shape=shapes(), keep_dims=st.booleans(), data=st.data())
def test_reduce_sum(dtype, shape, keep_dims, data):
    x = arrays(data, dtype, shape)
    rank = len(shape)
    chosen = data.draw(st.lists(st.integers(0, max(rank - 1, 0)), unique=True, max_size=rank))
    axes = [a - rank if data.draw(st.booleans()) else a for a in chosen]  # negative axes too
    got = check(reduce_sum, [x], kernel=vecmath_kernel("ReduceSum", dtype), axes=axes, keep_dims=keep_dims)
    want = np.sum(x, axis=tuple(axes) if axes else None, keepdims=keep_dims)
    if dtype.startswith("int"):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("axes", [[], [0], [1], [2], [-1], [0, 2], [2, 0], [-3, -1], [0, 1, 2], [1, -1]])
@pytest.mark.parametrize("keep_dims", [False, True])
def test_reduce_sum_axes(dtype, axes, keep_dims):
    x = np.arange(24).reshape(2, 3, 4).astype(dtype)
    got = check(reduce_sum, [x], kernel=vecmath_kernel("ReduceSum", dtype), axes=axes, keep_dims=keep_dims)
    np.testing.assert_array_equal(got, np.sum(x, axis=tuple(axes) if axes else None, keepdims=keep_dims))


@pytest.mark.parametrize("keep_dims", [False, True])
def test_reduce_sum_over_an_empty_axis_is_zero(keep_dims):
    x = np.ones((3, 0, 2), np.float32)
    y = reduce_sum(x, axes=[1], keep_dims=keep_dims)
    assert y.shape == ((3, 1, 2) if keep_dims else (3, 2)) and y.dtype == np.float32
    np.testing.assert_array_equal(y, 0)
    np.testing.assert_array_equal(reduce_sum(np.ones(0, np.int64)), np.int64(0))
    assert reduce_sum(x, axes=[0]).shape == (0, 2)  # not reducing the empty axis: empty result


def test_reduce_sum_scalar_and_defaults():
    x = np.array(2.5, np.float64)
    assert check(reduce_sum, [x], kernel=vecmath_kernel("ReduceSum", "float64")) == 2.5
    assert check(reduce_sum, [x], keep_dims=True).shape == ()
    assert check(reduce_sum, [np.arange(6.0).reshape(2, 3)]).shape == ()  # default: every axis


@pytest.mark.parametrize("shape,axes,message", [
    ((2, 3), [2], "axis 2 is out of range"), ((2, 3), [-3], "axis -3 is out of range"),
    ((2, 3), [0, -2], r"axes \[0, -2\] name the same axis more than once"),
    ((2, 3), [1, 1], "more than once"), ((), [0], "axis 0 is out of range: input 'x' is 0-d"),
])
def test_reduce_sum_bad_axes(shape, axes, message):
    x = np.ones(shape, np.float32)
    with pytest.raises(opforge.CheckError, match=f"op 'reduce_sum': .*{message}"):
        reduce_sum(x, axes=axes)
    with pytest.raises(opforge.CheckError):
        reduce_sum.infer(TensorSpec(shape, "float32"), axes=axes)
    with pytest.raises(opforge.CheckError):
        opforge.ops.reduce_sum(x, axes=axes)


def test_reduce_sum_inference():
    f32 = "float32"
    assert reduce_sum.infer(TensorSpec([None, 3], f32), axes=[1]) == TensorSpec([-1], f32)
    assert reduce_sum.infer(TensorSpec([None, 3], f32), axes=[0], keep_dims=True) == TensorSpec([1, 3], f32)
    assert reduce_sum.infer(TensorSpec([None, 3], f32)) == TensorSpec([], f32)
    assert reduce_sum.infer(TensorSpec(None, f32), axes=[5]).rank is None  # no rank: nothing to check yet
    with pytest.raises(opforge.AttrError):
        reduce_sum(np.ones(3, np.float32), axes=[0.5])


# -- softmax -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(shape=shapes(), data=st.data())
def test_softmax(dtype, shape, data):
    x = arrays(data, dtype, shape, bound=50)
    rank = max(len(shape), 1)
    axis = data.draw(st.integers(-rank, rank - 1))
    y = check(softmax, [x], kernel=vecmath_kernel("Softmax", dtype), axis=axis)
    if y.size:
        np.testing.assert_allclose(np.sum(y, axis=axis if x.ndim else None), 1, rtol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [-3, -2, -1, 0, 1, 2])
def test_softmax_each_axis(dtype, axis):
    x = np.random.default_rng(1).normal(size=(3, 4, 5)).astype(dtype) * 10
    check(softmax, [x], kernel=vecmath_kernel("Softmax", dtype), axis=axis)


def softmax_reference_row(row):
    e = np.exp(np.array(row) - max(row))
    return e / e.sum()


def test_softmax_is_stable_and_defaults_to_the_last_axis():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0]], np.float32)
    y = softmax(x)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y[0], softmax_reference_row([0.0, 1.0, 2.0]), rtol=1e-6)
    np.testing.assert_allclose(y[1], softmax_reference_row([2.0, 1.0, 0.0]), rtol=1e-6)
    np.testing.assert_array_equal(softmax(np.array(3.0)), 1.0)  # 0-d: one element
    assert softmax(np.ones((2, 0), np.float64), axis=0).shape == (2, 0)


def test_softmax_rejects_bad_axis_and_integers():
    with pytest.raises(opforge.CheckError, match="op 'softmax': axis 2 is out of range"):
        softmax(np.ones((2, 3), np.float32), axis=2)
    with pytest.raises(opforge.CheckError):
        softmax(np.ones((), np.float32), axis=1)
    with pytest.raises(opforge.DTypeError, match="op 'softmax'"):
        softmax(np.ones(3, np.int64))
    assert softmax.infer(TensorSpec([None, 4], "float64"), axis=0) == TensorSpec([-1, 4], "float64")


# -- matmul ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(batch=shapes(max_dims=2, max_side=3), mkn=st.tuples(*[st.integers(0, 6)] * 3), data=st.data())
def test_matmul(dtype, batch, mkn, data):
    m, k, n = mkn
    a = arrays(data, dtype, batch + (m, k))
    b = arrays(data, dtype, batch + (k, n))
    check(matmul, [a, b], kernel=f"MatMul<{dtype},{dtype}>")


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_sizes(dtype):
    rng = np.random.default_rng(2)
    for shape_a, shape_b in [((1, 1), (1, 1)), ((7, 33), (33, 5)), ((2, 3, 4, 5), (2, 3, 5, 6)), ((4, 0), (0, 3))]:
        a, b = rng.normal(size=shape_a).astype(dtype), rng.normal(size=shape_b).astype(dtype)
        check(matmul, [a, b], kernel=f"MatMul<{dtype},{dtype}>")
    np.testing.assert_array_equal(matmul(np.ones((4, 0), dtype), np.ones((0, 3), dtype)), 0)  # empty sum


@pytest.mark.parametrize("shape_a,shape_b,message", [
    ((2, 3), (4, 5), r"a's last dim \(3\) must equal b's second-to-last dim \(4\)"),
    ((2, 2, 3), (3, 3, 4), r"batch dim 0 differs \(2 in a, 3 in b\)"),
    ((3,), (3, 4), "input 'a' has rank 1"),
    ((2, 3), (2, 3, 4), "ranks 2 and 3"),
])
def test_matmul_shape_errors(shape_a, shape_b, message):
    a, b = np.ones(shape_a, np.float32), np.ones(shape_b, np.float32)
    with pytest.raises(opforge.ShapeError, match=f"op 'matmul': .*{message}"):
        matmul(a, b)
    with pytest.raises(opforge.ShapeError, match=message):
        matmul.infer(TensorSpec(shape_a, "float32"), TensorSpec(shape_b, "float32"))


def test_matmul_inference_with_unknowns():
    f32 = "float32"

    def infer(a, b):
        return matmul.infer(TensorSpec(a, f32), TensorSpec(b, f32)).shape

    assert infer([None, 3], [3, 4]) == (-1, 4)
    assert infer([2, None], [None, None]) == (2, -1)
    assert infer([None, 2, 3], [5, 3, None]) == (5, 2, -1)
    assert infer(None, [2, 3, 4]) == (2, -1, 4)
    assert infer([2, 3, 4], None) == (2, 3, -1)
    assert infer(None, None) == (-2,)
    with pytest.raises(opforge.ShapeError):
        infer([None, 3], [4, None])
    with pytest.raises(opforge.ShapeError):
        infer(None, [4])


def test_matmul_mixed_dtypes_fall_back_to_the_reference():
    a, b = np.ones((2, 3), np.float32), np.ones((3, 2), np.float64)
    assert select_kernel(matmul, [TensorSpec.of(a), TensorSpec.of(b)]).reference
    assert check(matmul, [a, b]).dtype == np.float32


# -- functional API ------------------------------------------------------------

def test_functional_api():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(opforge.ops.add(a, b), a + b)
    np.testing.assert_array_equal(opforge.ops.mul(a, b=b), a * b)
    np.testing.assert_array_equal(opforge.ops.reduce_sum(a, axes=[-1], keep_dims=True), a.sum(-1, keepdims=True))
    np.testing.assert_allclose(opforge.ops.softmax(a, axis=0), softmax.reference_kernel.fn(a, axis=0), rtol=1e-6)
    np.testing.assert_allclose(opforge.ops.exp(a), np.exp(a), rtol=1e-6)
    np.testing.assert_allclose(opforge.ops.tanh(a), np.tanh(a), rtol=1e-6)
    np.testing.assert_allclose(opforge.ops.matmul(a, a.T), a @ a.T, rtol=1e-6)
    assert str(opforge.ops.reduce_sum.__signature__) == "(x, *, axes=(), keep_dims=False)"
    assert str(opforge.ops.softmax.__signature__) == "(x, *, axis=-1)"
    with pytest.raises(TypeError):
        opforge.ops.reduce_sum(a, [0])  # axes is keyword-only
