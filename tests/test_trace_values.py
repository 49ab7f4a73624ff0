"""Traced values: symbolic dims, operators, indexing, NumPy ufuncs and functions,
and the TracingError raised where Python asks a trace for data it does not have.
Every traced result is compared with NumPy on concrete arrays."""
import math
import operator

import numpy as np
import pytest

import opforge
from opforge import TensorSpec
from opforge.errors import OpforgeError, ShapeError, TracingError
from opforge.graph import Graph
from opforge.graph.symbolic import SymDim

ops = opforge.ops


def rng(seed=0):
    return np.random.default_rng(seed)


def positive(*shape, seed=0, dtype=np.float64):
    return (rng(seed).random(shape) + 0.5).astype(dtype)


def op_names(graph):
    return [node.op.name for node in graph.nodes if not node.is_constant]


# -- symbolic dims ---------------------------------------------------------------

def traced_dims(fn, shape=(None, 3)):
    """Call fn(x.shape, x) inside a trace of x with the given shape; return what it returns."""
    seen = []
    opforge.trace(lambda x: seen.append(fn(x.shape, x)) or x, TensorSpec(list(shape)))
    return seen[0]


def test_unknown_dims_are_symbolic_and_known_dims_are_ints():
    shape = traced_dims(lambda shape, x: shape)
    assert isinstance(shape[0], SymDim) and shape[1] == 3 and type(shape[1]) is int
    assert repr(shape[0]) == "x0.shape[0]"


def test_integer_arithmetic_on_symbolic_dims_simplifies():
    d, ints = traced_dims(lambda shape, x: (shape[0], [shape[0] - shape[0], shape[0] * 2 - shape[0] - shape[0],
                                                        (shape[0] * 4 + 2) // 2 - 2 * shape[0],
                                                        (3 + shape[0]) - (shape[0] + 1) * 1]))
    assert ints == [0, 0, 1, 2] and all(type(i) is int for i in ints)
    assert repr(2 * d + 1) == "2*x0.shape[0] + 1" and repr(-d) == "-x0.shape[0]"
    assert repr(d // 2) == "(x0.shape[0] // 2)" and repr(d * d - d) == "x0.shape[0]*x0.shape[0] - x0.shape[0]"
    assert hash(d + 1) == hash(1 + d)


def test_powers_abs_and_divmod_of_symbolic_dims_are_symbolic():
    d, results = traced_dims(lambda shape, x: (shape[0], [shape[0] ** 2, shape[0] ** 0, abs(shape[0] + 1),
                                                          abs(-shape[0]), divmod(shape[0] * 4, 2)]))
    assert results[0] == d * d and results[1] == 1 and results[2] == d + 1 and results[3] == d
    assert results[4] == (2 * d, 0)
    for bad in (lambda d: 2 ** d, lambda d: d ** -1, lambda d: abs(d - 3)):
        with pytest.raises(TracingError):
            traced_dims(lambda shape, x: bad(shape[0]))
    x = np.arange(3.0)
    np.testing.assert_allclose(opforge.trace(lambda x: x * x.shape[0] ** 2, TensorSpec([None], "float64"))(x), x * 9)


def test_comparisons_answer_only_what_holds_for_every_size():
    results = traced_dims(lambda shape, x: [shape[0] >= 0, shape[0] + 1 > 0, shape[0] == -1, shape[0] != -1,
                                            shape[0] < 0, shape[0] + 2 <= 1, shape[0] * shape[0] >= 0,
                                            shape[0] == shape[0], shape == shape, bool(shape[0] + 1)])
    assert results == [True, True, False, True, False, False, True, True, True, True]
    for compare in (operator.gt, operator.lt, operator.eq, operator.ne, operator.le, operator.ge):
        with pytest.raises(TracingError, match="unknown dim"):
            traced_dims(lambda shape, x: compare(shape[0], 4))
    with pytest.raises(TracingError):  # two unknown dims of different values are unrelated
        opforge.trace(lambda x, y: x if x.shape[0] == y.shape[0] else y, TensorSpec([None]), TensorSpec([None]))
    with pytest.raises(TracingError):
        traced_dims(lambda shape, x: x if shape[0] else -x)


@pytest.mark.parametrize("use", [
    int, operator.index, float, range, lambda d: np.zeros((d, 2)),
    lambda d: TensorSpec([d, 2]),
    lambda d: d / 2, lambda d: d * 0.5,
])
def test_a_symbolic_dim_cannot_become_a_python_number(use):
    with pytest.raises(TracingError):
        traced_dims(lambda shape, x: use(shape[0]))


def test_a_symbolic_dim_in_an_attribute_raises_saying_what_to_use():
    with pytest.raises(TracingError, match="-1 for it in a reshape"):
        opforge.trace(lambda x: ops.reshape(x, shape=[x.shape[0], 3]), TensorSpec([None, 3]))
    graph = opforge.trace(lambda x: ops.reshape(x, shape=[-1, 3]), TensorSpec([None, 3]))  # the alternative
    np.testing.assert_array_equal(graph(np.ones((2, 3), np.float32)), np.ones((2, 3)))


def test_unknown_rank_has_no_shape():
    with pytest.raises(TracingError, match="unknown rank"):
        opforge.trace(lambda x: x * x.shape[0], TensorSpec(None))


# -- symbolic dims meeting tensors become graph ops -------------------------------------

def test_relu_of_x_times_its_length_works_for_every_length_and_after_saving(tmp_path):
    graph = opforge.trace(lambda x: ops.relu(x * x.shape[0]), TensorSpec([None]))
    assert "dim" in op_names(graph)
    path = tmp_path / "scaled.json"
    graph.save(path)
    loaded = Graph.load(path)
    for n in (1, 3, 7):
        x = rng(n).standard_normal(n).astype(np.float32)
        want = np.maximum(x * n, 0)
        for g in (graph, loaded):
            got = g(x)
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_expressions_of_dims_take_the_tensor_dtype_and_run_at_run_time():
    def fn(x):
        rows, cols = x.shape
        return (x * (rows * 2 + 1) - rows,           # polynomial in one dim
                rows * cols * x,                     # two unknown dims, reflected
                x / rows,                            # a mean by hand
                x + rows // 2,                       # floor division
                rows - x,
                x * np.float64(2) + rows % 3)
    graph = opforge.trace(fn, TensorSpec([None, None], "float64"))
    for shape in [(1, 2), (4, 3), (5, 1)]:
        x = rng(shape[0]).standard_normal(shape)
        n, m = shape
        want = (x * (n * 2 + 1) - n, n * m * x, x / n, x + n // 2, n - x, x * 2 + n % 3)
        for got, expected in zip(graph(x), want):
            assert got.dtype == np.float64
            np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_a_symbolic_dim_with_a_concrete_array_and_in_a_direct_op_call():
    c = np.arange(3, dtype=np.float32)
    graph = opforge.trace(lambda x: (c * x.shape[0] + x, ops.add(x, x.shape[0]), x.shape[0] - c),
                          TensorSpec([None], "float32"))
    x = np.ones(3, np.float32)
    for got, want in zip(graph(x), (c * 3 + x, x + 3, 3 - c)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want)


# -- operators -------------------------------------------------------------------

BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "pow": operator.pow, "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "eq": operator.eq, "ne": operator.ne,
}


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_operators_agree_with_numpy(name, dtype="float64"):
    fn = BINARY[name]
    a, b = positive(2, 3, seed=1, dtype=dtype), positive(3, seed=2, dtype=dtype)
    b[1] = a[0, 1]  # some equal elements for the comparisons
    graph = opforge.trace(lambda x, y: (fn(x, y), fn(x, 2), fn(2, x), fn(x, b), fn(a, y), fn(np.float32(1.5), x)),
                          TensorSpec([None, 3], dtype), TensorSpec([3], dtype))
    got = graph(a, b)
    want = (fn(a, b), fn(a, 2), fn(2, a), fn(a, b), fn(a, b), fn(np.asarray(1.5, dtype), a))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_unary_operators_matmul_and_reflected_arrays_agree_with_numpy():
    a, w = rng(3).standard_normal((4, 3)), rng(4).standard_normal((3, 2))
    graph = opforge.trace(lambda x, m: (-x, abs(x), +x, x @ m, a @ m, x @ w, 1 / (abs(x) + 1)),
                          TensorSpec([None, 3], "float64"), TensorSpec([3, 2], "float64"))
    for got, want in zip(graph(a, w), (-a, abs(a), a, a @ w, a @ w, a @ w, 1 / (abs(a) + 1))):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_python_and_numpy_scalars_take_the_traced_dtype():
    graph = opforge.trace(lambda x: (2 * x, 1 / x, np.float32(2) * x, x ** 2, x > 1), TensorSpec([3], "float64"))
    x = np.array([1.0, 2.0, 4.0])
    twice, inverse, numpy_twice, square, greater = graph(x)
    assert [r.dtype for r in (twice, inverse, numpy_twice, square)] == [np.float64] * 4
    assert greater.dtype == np.bool_
    np.testing.assert_array_equal(inverse, 1 / x)
    np.testing.assert_array_equal(greater, x > 1)


def test_values_hash_by_identity_and_compare_to_none_as_false():
    seen = []

    def fn(x):
        seen.append((hash(x) == object.__hash__(x), x == None, x != None, {x: 1}[x]))  # noqa: E711
        return x

    opforge.trace(fn, TensorSpec([2]))
    assert seen == [(True, False, True, 1)]


# -- NumPy ufuncs and functions -----------------------------------------------------

UNARY_UFUNCS = [np.negative, np.sqrt, np.log, np.exp, np.tanh, np.absolute]
BINARY_UFUNCS = [np.add, np.subtract, np.multiply, np.divide, np.power, np.maximum, np.minimum,
                 np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal]


@pytest.mark.parametrize("ufunc", UNARY_UFUNCS + BINARY_UFUNCS, ids=lambda u: u.__name__)
def test_ufuncs_are_recorded_and_agree_with_numpy(ufunc):
    a, b = positive(2, 3, seed=5), positive(2, 3, seed=6)
    b[0, 0] = a[0, 0]
    if ufunc.nin == 1:
        graph = opforge.trace(lambda x: ufunc(x), TensorSpec([None, 3], "float64"))
        got, want = graph(a), ufunc(a)
    else:
        graph = opforge.trace(lambda x, y: (ufunc(x, y), ufunc(a, y), ufunc(x, 2.0)),
                              TensorSpec([None, 3], "float64"), TensorSpec([2, 3], "float64"))
        got, want = graph(a, b), (ufunc(a, b), ufunc(a, b), ufunc(a, 2.0))
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_a_ufunc_without_an_op_raises_naming_it():
    with pytest.raises(TracingError, match="np.sin"):
        opforge.trace(lambda x: np.sin(x), TensorSpec([3]))
    with pytest.raises(TracingError, match="np.add.reduce"):
        opforge.trace(lambda x: np.add.reduce(x), TensorSpec([3]))
    with pytest.raises(TracingError, match="np.cumsum"):
        opforge.trace(lambda x: np.cumsum(x), TensorSpec([3]))


def test_numpy_functions_are_recorded_and_agree_with_numpy():
    a, b = rng(7).standard_normal((2, 3)), rng(8).standard_normal((2, 3))

    def fn(x, y):
        return (np.where(x > y, x, y), np.where(x > 0, x, 0.0), np.concatenate([x, y], axis=1),
                np.concatenate([x, b]), np.mean(x, axis=0), np.mean(x), np.sum(x, axis=1, keepdims=True),
                np.sum(x), np.reshape(x, (3, -1)), np.transpose(x))

    graph = opforge.trace(fn, TensorSpec([2, 3], "float64"), TensorSpec([2, 3], "float64"))
    for got, want in zip(graph(a, b), fn(a, b)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


# -- indexing ----------------------------------------------------------------------

INDICES = [
    np.s_[0], np.s_[-1], np.s_[2], np.s_[1:], np.s_[:-1], np.s_[::2], np.s_[::-1], np.s_[-2::-1],
    np.s_[1:-1:2], np.s_[-3:], np.s_[:, 1], np.s_[1, -2], np.s_[..., -1], np.s_[..., ::-2], np.s_[:, None, 1:],
    np.s_[None], np.s_[-1, ...], np.s_[-10:10], np.s_[5:1], np.s_[:, ::-3], np.s_[3:0:-1],
]


@pytest.mark.parametrize("index", INDICES, ids=str)
def test_indexing_agrees_with_numpy_on_static_dims(index):
    x = np.arange(20.0).reshape(5, 4)
    got = opforge.trace(lambda v: v[index], TensorSpec([5, 4], "float64"))(x)
    np.testing.assert_array_equal(got, x[index])


@pytest.mark.parametrize("index", INDICES, ids=str)
def test_indexing_agrees_with_numpy_on_unknown_dims(index):
    graph = opforge.trace(lambda v: v[index], TensorSpec([None, 4], "float64"))
    for n in (3, 5, 8):
        x = np.arange(n * 4.0).reshape(n, 4)
        np.testing.assert_array_equal(graph(x), x[index])


def test_iterating_and_len_need_a_known_leading_dim():
    graph = opforge.trace(lambda x: [row * k for k, row in enumerate(x)] + [x * len(x)], TensorSpec([3, 2]))
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    for got, want in zip(graph(x), [x[0] * 0, x[1], x[2] * 2, x * 3]):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(TracingError, match="leading dim"):
        opforge.trace(lambda x: len(x), TensorSpec([None, 2]))
    with pytest.raises(TracingError, match="leading dim"):
        opforge.trace(lambda x: [row for row in x], TensorSpec([None, 2]))


@pytest.mark.parametrize("bad, error", [
    (lambda x: x[3], ShapeError), (lambda x: x[0, 0, 0], ShapeError), (lambda x: x[::0], ShapeError),
    (lambda x: x[..., 0, ...], ShapeError), (lambda x: x[:, x.shape[1] // 2], TracingError),
    (lambda x: x[: x.shape[1] - 1], TracingError), (lambda x: x[np.array([0, 1])], TracingError),
    (lambda x: x[x > 0], TracingError), (lambda x: x[1.5], TracingError), (lambda x: x[True], TracingError),
])
def test_bad_indices_raise_typed_errors(bad, error):
    with pytest.raises(error):
        opforge.trace(bad, TensorSpec([3, None]))


# -- what a trace cannot record -----------------------------------------------------

@pytest.mark.parametrize("fn", [
    lambda x: x if x else -x,
    lambda x: x if x.sum() > 0 else -x,
    lambda x: float(x.sum()),
    lambda x: int(x.sum()),
    lambda x: [1, 2][x.sum()],
    lambda x: int(x.shape[0]),
    lambda x: np.asarray(x),
    lambda x: x.__setitem__(0, 1.0),
    lambda x: x and x,
    lambda x: round(x.sum()),
    lambda x: math.trunc(x.sum()),
], ids=["if", "if-compare", "float", "int", "index", "int-dim", "asarray", "setitem", "and", "round", "trunc"])
def test_data_dependent_python_raises_tracing_error_saying_what_to_use(fn):
    with pytest.raises(TracingError) as caught:
        opforge.trace(fn, TensorSpec([None], "float64"))
    assert isinstance(caught.value, OpforgeError)
    assert any(hint in str(caught.value) for hint in ("opforge.ops.where", "x.shape[0]", "reshape", "opforge ops",
                                                      "immutable"))


def test_where_replaces_the_python_branch():
    graph = opforge.trace(lambda x: ops.where(x > 0, x, -x), TensorSpec([None], "float64"))
    x = np.array([-2.0, 0.5, 3.0])
    np.testing.assert_array_equal(graph(x), np.abs(x))


# -- gradients through the recorded syntax ------------------------------------------

def smooth(x):
    """/ , **, slicing and a dim of the input, reduced to a scalar."""
    ratio = x[1:] / (x[:-1] ** 2 + 1.0)
    return ops.reduce_sum(ratio * x[::-1][1:] ** 3 - x[-1] / x.shape[0])


def test_gradient_through_division_power_and_slicing_matches_finite_differences():
    x = rng(9).standard_normal(6)
    opforge.testing.gradcheck(smooth, x)
    analytic = opforge.grad(smooth)(x)
    eps = 1e-6
    numeric = np.array([(smooth_numpy(x + eps * e) - smooth_numpy(x - eps * e)) / (2 * eps) for e in np.eye(6)])
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7)


def smooth_numpy(x):
    return float(np.sum(x[1:] / (x[:-1] ** 2 + 1.0) * x[::-1][1:] ** 3 - x[-1] / x.shape[0]))


def test_gradient_rules_keep_working_on_unknown_dims():
    """Rules reason about specs (-1 dims) where a traced value's shape now holds symbolic dims."""
    forward = opforge.trace(lambda x, b: ops.reshape(ops.tanh(x + b), shape=[-1]),
                            TensorSpec([None, 3], "float64"), TensorSpec([3], "float64"))
    backward = opforge.backward(forward)
    b = rng(10).standard_normal(3)
    for n in (1, 4):
        x, dy = rng(n).standard_normal((n, 3)), rng(n + 1).standard_normal(n * 3)
        dz = (1 - np.tanh(x + b) ** 2) * dy.reshape(n, 3)
        dx, db = backward(x, b, dy)
        np.testing.assert_allclose(dx, dz, rtol=1e-12)
        np.testing.assert_allclose(db, dz.sum(0), rtol=1e-12)


def test_backward_through_a_symbolic_dim_on_an_unknown_length():
    """dim reads only x's shape: no gradient flows through it, and the backward graph runs for any length."""
    forward = opforge.trace(lambda x: ops.reduce_sum(x * x.shape[0]) - ops.reduce_sum(x[1:] / x.shape[0]),
                            TensorSpec([None], "float64"))
    backward = opforge.backward(forward)
    for n in (2, 5):
        x = rng(n).standard_normal(n)
        want = np.full(n, float(n))
        want[1:] -= 1.0 / n
        np.testing.assert_allclose(backward(x, np.float64(1.0))[0], want, rtol=1e-12)
    opforge.testing.gradcheck(lambda x: ops.reduce_sum(x * x.shape[0]), rng(3).standard_normal(4))


def test_a_traced_function_may_return_a_symbolic_dim():
    graph = opforge.trace(lambda x: (x.shape[0], x.shape[1]), TensorSpec([None, None]))
    n, m = graph(np.ones((4, 5), np.float32))
    assert n.dtype == np.int64 and (int(n), int(m)) == (4, 5)


@pytest.mark.parametrize("args", [(None,), ("f",), (lambda x: x, None), (lambda x: x, "abc"),
                                  (lambda x: x, [[1.0], [1.0, 2.0]]), (lambda x: x, object())])
def test_trace_given_no_function_or_no_tensor_raises_tracing_error(args):
    with pytest.raises(TracingError, match="opforge.trace"):
        opforge.trace(*args)
