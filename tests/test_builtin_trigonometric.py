"""The trigonometric built-ins (trigonometric.py): accuracy in ulps on a dense
sweep against a wider reference, special values, dtype errors, empty tensors,
unknown dims in a traced graph, gradients -- and their ONNX converters and
exporters against onnxruntime.  tests/test_builtin_scans.py and
tests/test_builtin_bitwise.py hold the other math ops of the same change."""
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import opforge
import opforge.onnx
from opforge import TensorSpec
from opforge.builtins.trigonometric import NAMES, NUMPY_NAMES
from opforge.onnx.export import export
from opforge.runtime.dispatch import select_kernel
from opforge.testing import check_op, gradcheck
from test_kernel_accuracy import ISAS, X32, X64, ulp_error

ops = opforge.ops
TRIGONOMETRIC = list(NAMES)
# max ulps, the bounds trigonometric.py's doc string states: float64 (libm) ...
BOUNDS = {"sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1,
          "sinh": 2, "cosh": 2, "asinh": 2, "acosh": 2, "atanh": 2}
# ... and float32 (vecmath.h's kernels: 1 ulp where libm takes over, 0.5 and a hair where they compute)
BOUNDS32 = 1
IN_DOUBLE_BOUND = 0.501
# where vecmath.h's NameInDouble serves a float32 x (NameInRange)
FLOAT_MAX = float(np.finfo(np.float32).max)
IN_RANGE = {"sin": (-65536, 65536), "cos": (-65536, 65536), "tan": (-65536, 65536), "asin": (-1, 1),
            "acos": (-1, 1), "atan": (-FLOAT_MAX, FLOAT_MAX), "sinh": (-90, 90), "cosh": (-90, 90),
            "asinh": (-FLOAT_MAX, FLOAT_MAX), "acosh": (1, FLOAT_MAX), "atanh": (-1, 1)}


def in_range(name, x):
    low, high = IN_RANGE[name]
    inside = (x >= low) & (x <= high)
    return inside & (np.abs(x) < 1) if name == "atanh" else inside
# where each function's gradient is finite, away from its edges
DOMAINS = {"asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9), "acosh": (1.2, 4.0),
           "tan": (-1.2, 1.2)}


def numpy_fn(name):
    return getattr(np, NUMPY_NAMES.get(name, name))


def interior(name, shape, seed):
    low, high = DOMAINS.get(name, (-3.0, 3.0))
    return np.random.default_rng(seed).uniform(low, high, shape)


def kernel_cases():
    """(name, dtype, isa): float32 has a vectorized kernel per instruction set, float64 one libm kernel for
    every ISA."""
    for name in TRIGONOMETRIC:
        for dtype in ("float32", "float64"):
            for isa in ISAS if dtype == "float32" else ["generic"]:
                yield name, dtype, isa


@pytest.mark.parametrize("name, dtype, isa", list(kernel_cases()))
def test_ulp_bound_on_a_dense_sweep(name, dtype, isa):
    x = X32 if dtype == "float32" else X64[::2]
    opforge.set_isa_cap(isa)
    try:
        chosen = select_kernel(opforge.lookup(name), [TensorSpec.of(x)]).name
        vectorized = dtype == "float32"
        # the C++ kernel, not the NumPy reference
        assert chosen == (f"{name.title()}Float{f'[{isa}]' if isa != 'generic' else ''}<float32>" if vectorized
                          else name.title()), chosen
        got = getattr(ops, name)(x)
    finally:
        opforge.set_isa_cap(None)
    with np.errstate(all="ignore"):
        want = numpy_fn(name)(x.astype(np.float64 if dtype == "float32" else np.longdouble))
    assert got.dtype == x.dtype and got.shape == x.shape
    err = ulp_error(got, want, dtype)
    worst = int(np.argmax(err))
    bound = BOUNDS32 if dtype == "float32" else BOUNDS[name]
    assert err[worst] <= bound, f"{name} {dtype}: {err[worst]:.3g} ulp at x={x[worst]!r}: {got[worst]!r}"
    if dtype == "float32":  # where vecmath.h computes in double: one rounding of a value good to ~1e-13
        inside = np.flatnonzero(in_range(name, x))
        assert inside.size > 100_000
        worst = inside[int(np.argmax(err[inside]))]
        assert err[worst] <= IN_DOUBLE_BOUND, f"{name}: {err[worst]:.3g} ulp at x={x[worst]!r}: {got[worst]!r}"


@pytest.mark.parametrize("isa", ISAS)
def test_float32_sin_cos_and_tan_next_to_multiples_of_half_pi_and_at_the_edge_of_the_fast_range(isa):
    """Where x lies next to k pi/2, r = x - k pi/2 cancels (and tan's numerator or denominator is tiny): the
    floats within 16 ulps of each k pi/2 up to 2^16 (the range the polynomial serves), and the values around
    2^16 where libm takes over."""
    k = np.arange(1, 41_723, dtype=np.float64)
    near = (k * np.pi / 2).astype(np.float32).view(np.int32)[:, None] + np.arange(-16, 17, dtype=np.int32)
    x = near.reshape(-1).view(np.float32)
    edge = np.float32(65536).view(np.int32) + np.arange(-300, 300, dtype=np.int32)
    x = np.concatenate([x, -x, edge.view(np.float32), -edge.view(np.float32)])
    opforge.set_isa_cap(isa)
    try:
        for name, fn in (("sin", np.sin), ("cos", np.cos), ("tan", np.tan)):
            got = getattr(ops, name)(x)
            err = ulp_error(got, fn(x.astype(np.longdouble)), "float32")
            worst = int(np.argmax(err))
            assert err[worst] <= 1, f"{name} [{isa}]: {err[worst]:.3g} ulp at x={x[worst]!r}"
    finally:
        opforge.set_isa_cap(None)


def float32_edges():
    """float32 values around the places where vecmath.h's kernels change formula or hand over to libm (300
    floats either side of each, both signs), and the subnormals and smallest normals."""
    edges = [0.5, 1.0, np.tan(np.pi / 8), np.tan(3 * np.pi / 8), 65536.0, 90.0, 89.41598, 88.72284,
             np.log(2) / 2, 3 * np.log(2) / 2, 1e-4, 1.0 - 2.0 ** -24, 1e30, float(np.finfo(np.float32).max)]
    bits = np.array(edges, np.float32).view(np.int32)[:, None] + np.arange(-300, 301, dtype=np.int32)
    tiny = np.concatenate([np.arange(1, 2000, dtype=np.int32), np.arange(0x7ff000, 0x801000, 16, dtype=np.int32)])
    x = np.concatenate([bits.reshape(-1), tiny]).view(np.float32)
    x = x[np.isfinite(x)]
    return np.concatenate([x, -x, np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)])


@pytest.mark.parametrize("name", TRIGONOMETRIC)
def test_float32_around_every_formula_boundary_and_the_subnormals(name):
    x = float32_edges()
    with np.errstate(all="ignore"):
        want = numpy_fn(name)(x.astype(np.longdouble))
        numpy32 = numpy_fn(name)(x)
        overflows = np.isinf(want.astype(np.float32))
    tiny = (np.abs(x) < 1e-30) & (x != 0)
    for isa in ISAS:
        opforge.set_isa_cap(isa)
        try:
            got = getattr(ops, name)(x)
        finally:
            opforge.set_isa_cap(None)
        err = ulp_error(got, want, "float32")
        worst = int(np.argmax(err))
        assert err[worst] <= BOUNDS32, f"{name} [{isa}]: {err[worst]:.3g} ulp at x={x[worst]!r}: {got[worst]!r}"
        inside = np.flatnonzero(in_range(name, x))
        worst = inside[int(np.argmax(err[inside]))]
        assert err[worst] <= IN_DOUBLE_BOUND, f"{name} [{isa}]: {err[worst]:.3g} ulp at x={x[worst]!r}"
        # subnormal and tiny inputs give NumPy's values bit for bit (x itself, or cos/cosh 1, acos pi/2)
        np.testing.assert_array_equal(got[tiny], numpy32[tiny], err_msg=f"{name} [{isa}]")
        numbers = ~np.isnan(numpy32)  # signs as NumPy's, +-0.0 included
        np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(numpy32[numbers]), err_msg=name)
        # NaN exactly where NumPy has one (out of the domain), inf where NumPy overflows
        np.testing.assert_array_equal(np.isnan(got), np.isnan(numpy32), err_msg=f"{name} [{isa}]: NaNs")
        np.testing.assert_array_equal(np.isinf(got), overflows, err_msg=f"{name}: infs")


def test_results_do_not_depend_on_the_thread_count_or_the_isa(set_threads):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1e5, 1e5, 300_001).astype(np.float32)  # both paths, several ranges
    x[::1000] = np.float32(3e6)
    x[1::3] = rng.uniform(-1.2, 1.2, 100_000).astype(np.float32)  # (asin, acos, atanh: mostly in the domain)
    x[2::3] = rng.uniform(-100, 100, 100_000).astype(np.float32)  # (sinh and cosh: some overflow)
    set_threads(1)
    one = [getattr(ops, name)(x) for name in TRIGONOMETRIC]
    set_threads(2)
    two = [getattr(ops, name)(x) for name in TRIGONOMETRIC]
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    for isa in ISAS:  # (plain multiplies, adds, divisions and square roots: every ISA variant rounds alike)
        opforge.set_isa_cap(isa)
        try:
            for name, want in zip(TRIGONOMETRIC, one):
                np.testing.assert_array_equal(getattr(ops, name)(x), want, err_msg=f"{name} [{isa}]")
        finally:
            opforge.set_isa_cap(None)


def test_special_values_follow_numpy():
    for dtype in ("float32", "float64"):
        x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -2.0, 0.5, 1e-30, 800.0], dtype)
        for name in TRIGONOMETRIC:
            got = getattr(ops, name)(x)
            with np.errstate(all="ignore"):
                want = numpy_fn(name)(x)  # (NumPy's float32 sin and cos may be an ulp off: compare in ulps)
            assert np.all(ulp_error(got, want, dtype) <= BOUNDS[name]), f"{name} {dtype}: {got} != {want}"
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name} {dtype}: NaNs")
            numbers = ~np.isnan(want)  # (a NaN's sign bit means nothing)
            np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]),
                                          err_msg=f"{name} {dtype}: signs, -0.0 included")
    assert np.isnan(ops.asin(np.array([2.0]))[0]) and np.isnan(ops.acosh(np.array([0.5]))[0])
    np.testing.assert_array_equal(ops.atanh(np.array([1.0, -1.0])), [np.inf, -np.inf])


@pytest.mark.parametrize("name", TRIGONOMETRIC)
def test_check_op_runs_the_native_kernels_on_every_float_dtype_and_empty_tensors(name):
    for dtype in ("float32", "float64"):
        for shape in [(3, 5), (), (0, 4), (70_001,)]:  # (the last spans several ranges of the pool)
            x = interior(name, shape, 3).astype(dtype)
            checks = check_op(getattr(ops, name), x)
            assert all(ok is not False for _, ok, _ in checks), [c for c in checks if c[1] is False]
            if x.size:
                assert [n for n, ok, _ in checks if ok and "agrees with" in n], f"no native kernel ran for {name}"
            got = getattr(ops, name)(x)
            assert got.dtype == x.dtype and got.shape == shape
            np.testing.assert_allclose(got, numpy_fn(name)(x), rtol=4e-7 if dtype == "float32" else 1e-15)


@pytest.mark.parametrize("name", TRIGONOMETRIC)
def test_integer_and_bool_inputs_are_refused_naming_op_and_input(name):
    for dtype in ("int32", "int64", "bool"):
        with pytest.raises(opforge.DTypeError, match=rf"op '{name}': input 'x' has dtype {dtype}; .*floating-point"):
            getattr(ops, name)(np.ones(3, dtype))


@pytest.mark.parametrize("name", TRIGONOMETRIC)
def test_gradients_match_finite_differences(name):
    x = interior(name, (3, 4), 11)
    assert gradcheck(getattr(ops, name), x) < 1e-6
    # and through a traced graph with an unknown dim (the rule builds ops on traced values)
    graph = opforge.trace(lambda v: getattr(ops, name)(v), TensorSpec([None, 4], "float64"))
    assert gradcheck(graph, x) < 1e-6


def test_hand_derived_gradients_at_chosen_points():
    x = np.array([0.25, 0.5])
    expected = {"sin": np.cos(x), "cos": -np.sin(x), "tan": 1 / np.cos(x) ** 2, "asin": 1 / np.sqrt(1 - x * x),
                "acos": -1 / np.sqrt(1 - x * x), "atan": 1 / (1 + x * x), "sinh": np.cosh(x), "cosh": np.sinh(x),
                "asinh": 1 / np.sqrt(x * x + 1), "atanh": 1 / (1 - x * x)}
    for name, want in expected.items():
        got = opforge.grad(lambda v, f=getattr(ops, name): ops.reduce_sum(f(v)))(x)
        np.testing.assert_allclose(got, want, rtol=1e-14, err_msg=name)
    at = np.array([1.5, 3.0])
    got = opforge.grad(lambda v: ops.reduce_sum(ops.acosh(v)))(at)
    np.testing.assert_allclose(got, 1 / np.sqrt(at * at - 1), rtol=1e-14)


def test_inference_keeps_unknown_dims_and_rank_and_a_traced_graph_runs_any_size():
    for name in TRIGONOMETRIC:
        op = opforge.lookup(name)
        y = op.infer(TensorSpec([None, 3], "float32"))
        assert y.shape == (-1, 3) and y.dtype == "float32"
        assert op.infer(TensorSpec(None, "float64")).rank is None
    # a rotary embedding's core: x * cos(t) + rotate(x) * sin(t), with the sequence length unknown
    graph = opforge.trace(lambda x, t: ops.add(ops.mul(x, ops.cos(t)), ops.mul(x, ops.sin(t))),
                          TensorSpec([None, 8], "float32"), TensorSpec([None, 8], "float32"))
    for n in (0, 1, 17):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
        t = np.random.default_rng(n + 1).uniform(-50, 50, (n, 8)).astype(np.float32)
        np.testing.assert_allclose(graph(x, t), x * np.cos(t) + x * np.sin(t), rtol=1e-6, atol=1e-6)


def test_float16_runs_through_the_reference():
    x = np.linspace(-1, 1, 9).astype(np.float16)
    got = ops.sin(x)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.sin(x))


# -- ONNX ----------------------------------------------------------------------------

def unary_model(op_type, elem, opset):
    graph = helper.make_graph([helper.make_node(op_type, ["x"], ["y"])], op_type.lower(),
                              [helper.make_tensor_value_info("x", elem, ["n", 6])],
                              [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op_type", ["Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
                                     "Atanh"])
def test_onnx_nodes_agree_with_onnxruntime(op_type, dtype):
    name = op_type.lower()
    x = interior(name, (5, 6), 21).astype(dtype)
    for opset in (9, 13, 22):  # the versions before and after opset 22 added bfloat16
        model = unary_model(op_type, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), opset)
        ours = opforge.onnx.load(model)(x)
        assert ours.dtype == np.dtype(dtype) and ours.shape == x.shape
        rtol = {"float16": 1e-3, "float32": 2e-6, "float64": 1e-14}[dtype]
        want = numpy_fn(name)(x.astype(np.float64)).astype(dtype)
        np.testing.assert_allclose(ours, want, rtol=rtol, atol=rtol, err_msg=f"{op_type} opset {opset}")
        if dtype == "float32":  # (onnxruntime's CPU provider has no float16 or float64 kernel for several)
            session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            (theirs,) = session.run(None, {"x": x})
            np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=rtol, err_msg=f"{op_type} opset {opset}")


def test_onnx_integer_input_is_a_model_error():
    model = unary_model("Sin", TensorProto.INT32, 13)
    with pytest.raises(opforge.onnx.ModelError, match="int32"):
        opforge.onnx.load(model)


def test_export_writes_one_node_each_and_onnxruntime_agrees():
    names = TRIGONOMETRIC

    def f(x, y):
        return tuple(getattr(ops, n)(y if n in ("acosh",) else x) for n in names)

    graph = opforge.trace(f, TensorSpec([None, 4], "float32"), TensorSpec([None, 4], "float32"))
    model = export(graph, opset=17)
    onnx.checker.check_model(model, full_check=True)
    assert sorted(node.op_type for node in model.graph.node) == sorted(n.title() for n in names)
    x = interior("asin", (3, 4), 31).astype(np.float32)
    y = interior("acosh", (3, 4), 32).astype(np.float32)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, {i.name: a for i, a in zip(session.get_inputs(), (x, y))}), graph(x, y)):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
