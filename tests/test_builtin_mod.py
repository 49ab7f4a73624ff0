"""mod: the C++ kernel against NumPy (% and fmod) for every dtype, and the ONNX Mod node against onnxruntime."""
import numpy as np
import onnx
import pytest
from onnx import helper

import opforge
import opforge.onnx
from opforge.builtins.mod import MOD_DTYPES
from opforge.testing import check_op

ops = opforge.ops
SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (3, 1)), ((4,), (2, 1, 4)), ((3, 4), ()), ((), ()), ((0, 3), (3,))]


def sample(shape, dtype, seed, nonzero=False):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        values = rng.uniform(-20, 20, shape).astype(dtype)
    else:
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        small = rng.integers(max(info.min, -9), 10, shape).astype(dtype)
        values = np.where(rng.random(shape) < 0.5, values, small)  # small divisors too, not only huge ones
    if nonzero:
        values = np.where(values == 0, np.asarray(3, dtype), values)
    return values


def numpy_mod(a, b, fmod):
    with np.errstate(all="ignore"):
        return np.fmod(a, b) if fmod else np.mod(a, b)


def native_kernels_ran(checks):
    return [name for name, ok, _ in checks if ok and "agrees with" in name]


@pytest.mark.parametrize("dtype", MOD_DTYPES)
@pytest.mark.parametrize("fmod", [False, True])
def test_mod_agrees_with_numpy_for_every_dtype(dtype, fmod):
    for k, (sa, sb) in enumerate(SHAPES):
        a, b = sample(sa, dtype, k), sample(sb, dtype, k + 50)
        checks = check_op(ops.mod, a, b, fmod=fmod)
        if a.size and b.size:
            assert native_kernels_ran(checks), f"no native kernel ran for mod {dtype}"
        got = ops.mod(a, b, fmod=fmod)
        assert got.dtype == np.dtype(dtype) and got.shape == np.broadcast_shapes(sa, sb)
        np.testing.assert_array_equal(got, numpy_mod(a, b, fmod))


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint64"])
def test_integer_division_by_zero_gives_zero_and_the_most_negative_value_mod_minus_one_does_not_trap(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.min, info.max, 7, 0, 5], dtype)
    b = np.array([0, 0, 0, 0, 1], dtype)
    for fmod in (False, True):
        np.testing.assert_array_equal(ops.mod(a, b, fmod=fmod), np.zeros(5, dtype))
    if info.min < 0:
        minus_one = np.full(5, -1, dtype)
        for fmod in (False, True):
            np.testing.assert_array_equal(ops.mod(a, minus_one, fmod=fmod), np.zeros(5, dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_signs_zeros_infinities_and_nan_follow_numpy(dtype):
    a = np.array([-7.5, 7.5, -7.5, 7.5, 6, -6, 3, -3, np.inf, np.nan, 1, 0, -0.0, 1e-30], dtype)
    b = np.array([2, -2, -2, 2, 3, 3, np.inf, np.inf, 2, 2, 0, -5, 5, -1], dtype)
    for fmod in (False, True):
        got = ops.mod(a, b, fmod=fmod)
        want = numpy_mod(a, b, fmod)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))  # zeros keep NumPy's sign


def test_float16_and_mixed_dtypes_run_through_the_reference():
    a, b = sample((3, 4), "float16", 1), sample((4,), "float16", 2, nonzero=True)
    np.testing.assert_array_equal(ops.mod(a, b), np.mod(a, b))
    np.testing.assert_array_equal(ops.mod(a, b, fmod=True), np.fmod(a, b))
    x, y = np.array([7, -7], np.int32), np.array([2.5, -2.5], np.float64)
    np.testing.assert_array_equal(ops.mod(x, y), np.mod(x, y).astype(np.int32))


def test_mod_inference_keeps_unknown_dims_and_has_no_gradient():
    op = ops.mod.op
    y = op.infer(opforge.TensorSpec([None, 1, 4], "int64"), opforge.TensorSpec([3, None], "int64"))
    assert y.shape == (-1, 3, 4) and y.dtype == "int64"
    assert op.infer(opforge.TensorSpec(None), opforge.TensorSpec([3])).rank is None
    with pytest.raises(opforge.OpforgeError, match="do not broadcast"):
        op.infer(opforge.TensorSpec([2, 3]), opforge.TensorSpec([4]))
    assert "no_grad" in op.traits
    _, pullback = opforge.vjp(lambda x: ops.mod(x, x * 2.0), np.ones(3))
    with pytest.raises(opforge.GradientError, match="'mod' has trait no_grad"):
        pullback(np.ones(3))

    def f(a, b):
        return ops.mod(a, b, fmod=True)

    graph = opforge.trace(f, opforge.TensorSpec((-1, 3), "float32"), opforge.TensorSpec((3,), "float32"))
    a, b = sample((5, 3), "float32", 3), sample((3,), "float32", 4, nonzero=True)
    np.testing.assert_array_equal(graph(a, b), np.fmod(a, b))


ONNX_DTYPES = ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
               "float16"]


@pytest.mark.parametrize("dtype", ONNX_DTYPES)
def test_onnx_mod_computed_at_run_time_agrees_with_onnxruntime(dtype):
    import onnxruntime

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    a, b = sample((2, 3, 4), dtype, 7), sample((3, 4), dtype, 8, nonzero=True)
    for fmod in (1,) if np.dtype(dtype).kind == "f" else (0, 1):  # onnxruntime requires fmod=1 for floats
        node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
        graph = helper.make_graph([node], "mod", [helper.make_tensor_value_info("a", elem, a.shape),
                                                  helper.make_tensor_value_info("b", elem, b.shape)],
                                  [helper.make_tensor_value_info("y", elem, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        ours = opforge.onnx.load(model)(a, b)
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (theirs,) = session.run(None, {"a": a, "b": b})
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(ours, numpy_mod(a, b, fmod))


def test_onnx_mod_of_floats_with_fmod_0_follows_numpy():
    a, b = sample((4, 5), "float32", 9), sample((5,), "float32", 10, nonzero=True)
    node = helper.make_node("Mod", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "mod", [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, a.shape),
                                              helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, b.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    ours = opforge.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))(a, b)
    np.testing.assert_array_equal(ours, np.mod(a, b))
