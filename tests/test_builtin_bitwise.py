"""The bitwise integer built-ins (bitwise.py): every int/uint dtype against
NumPy and Python integers (shift counts out of range included), errors,
unknown dims, no gradients, and the ONNX Bitwise* / BitShift converters and
exporters against onnxruntime."""
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import opforge
import opforge.onnx
from opforge import TensorSpec
from opforge.builtins.bitwise import INTEGERS
from opforge.onnx.export import export
from opforge.testing import check_op

ops = opforge.ops


BITWISE_SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((4, 1), (1, 5)), ((), (3,)), ((0, 3), (3,)), ((), ())]


def random_integers(shape, dtype, seed):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def python_shift(x, count, bits, signed, left):
    """ONNX BitShift on Python ints: counts outside [0, bits) give the sign fill (right) or 0 (left)."""
    if not 0 <= count < bits:
        return -1 if (not left and x < 0) else 0
    if not left:
        return x >> count
    v = (x << count) & ((1 << bits) - 1)
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


@pytest.mark.parametrize("dtype", INTEGERS)
def test_bitwise_and_or_xor_not_agree_with_numpy_and_run_native_kernels(dtype):
    for k, (sa, sb) in enumerate(BITWISE_SHAPES):
        a, b = random_integers(sa, dtype, k), random_integers(sb, dtype, k + 20)
        for name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
            got = getattr(ops, name)(a, b)
            want = getattr(np, name)(a, b)
            assert got.dtype == np.dtype(dtype) and got.shape == want.shape
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {sa} {sb}")
            checks = check_op(getattr(ops, name), a, b)
            assert all(ok is not False for _, ok, _ in checks), [c for c in checks if c[1] is False]
            if got.size:
                assert [n for n, ok, _ in checks if ok and "agrees with" in n], f"no native kernel ran for {name}"
        got = ops.bitwise_not(a)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, np.invert(a))


@pytest.mark.parametrize("dtype", INTEGERS)
def test_shifts_follow_onnx_for_every_count_including_negative_and_too_large(dtype):
    info = np.iinfo(dtype)
    x = random_integers((3, 6), dtype, 1)
    x[0, :3] = [info.min, info.max, 0]
    counts = np.arange(-3 if info.min < 0 else 0, info.bits + 3)
    counts = np.resize(counts, (6,)) if counts.size < 6 else counts
    for k in range(0, counts.size, 6):
        c = counts[k:k + 6].astype(dtype)
        if c.size < 6:
            continue
        for name, left in (("left_shift", True), ("right_shift", False)):
            got = getattr(ops, name)(x, c)
            want = np.array([[python_shift(int(v), int(s), info.bits, info.min < 0, left) for v, s in zip(row, c)]
                             for row in x], dtype=dtype)
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} counts {c}")
            ref = opforge.lookup(name).reference_kernel.fn(x, c)
            np.testing.assert_array_equal(ref, want, err_msg=f"{name} reference")


def test_bitwise_errors_name_op_and_input():
    with pytest.raises(opforge.DTypeError, match=r"op 'bitwise_and': input 'a' has dtype float32; .*integer"):
        ops.bitwise_and(np.ones(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(opforge.DTypeError, match=r"op 'left_shift': input 'b' has dtype bool"):
        ops.left_shift(np.ones(3, np.int32), np.ones(3, bool))
    with pytest.raises(opforge.DTypeError, match=r"op 'bitwise_xor': inputs 'a' and 'b' have dtypes int32 and int64"):
        ops.bitwise_xor(np.ones(3, np.int32), np.ones(3, np.int64))
    with pytest.raises(opforge.DTypeError, match=r"op 'bitwise_not': input 'x' has dtype float64"):
        ops.bitwise_not(np.ones(3))
    with pytest.raises(opforge.OpforgeError, match="do not broadcast"):
        ops.bitwise_or(np.ones((2, 3), np.int32), np.ones(4, np.int32))


def test_bitwise_ops_keep_unknown_dims_and_have_no_gradient():
    op = opforge.lookup("bitwise_and")
    y = op.infer(TensorSpec([None, 1, 4], "int64"), TensorSpec([3, None], "int64"))
    assert y.shape == (-1, 3, 4) and y.dtype == "int64"
    assert "no_grad" in op.traits and "no_grad" in opforge.lookup("right_shift").traits
    graph = opforge.trace(lambda a, b: ops.bitwise_not(ops.right_shift(ops.bitwise_xor(a, b), b)),
                          TensorSpec([None, 3], "int32"), TensorSpec([3], "int32"))
    for n in (0, 2, 9):
        a = random_integers((n, 3), "int32", n)
        b = np.array([1, 5, 31], np.int32)
        np.testing.assert_array_equal(graph(a, b), ~((a ^ b) >> b))


def bitwise_model(op_type, elem, shapes, opset, **attrs):
    names = ["x", "y"][:len(shapes)]
    graph = helper.make_graph([helper.make_node(op_type, names, ["z"], **attrs)], op_type.lower(),
                              [helper.make_tensor_value_info(n, elem, s) for n, s in zip(names, shapes)],
                              [helper.make_tensor_value_info("z", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "int8", "int32", "int64"])
def test_onnx_bitwise_nodes_agree_with_onnxruntime(dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x, y = random_integers((2, 3, 4), dtype, 3), random_integers((4,), dtype, 4)
    bits = np.iinfo(dtype).bits
    counts = np.random.default_rng(5).integers(0, bits, (4,)).astype(dtype)  # (onnxruntime: counts in range)
    cases = [("BitwiseAnd", {}, y, 18), ("BitwiseOr", {}, y, 18), ("BitwiseXor", {}, y, 18),
             ("BitShift", {"direction": "LEFT"}, counts, 11), ("BitShift", {"direction": "RIGHT"}, counts, 11)]
    for op_type, attrs, second, opset in cases:
        if op_type == "BitShift" and dtype.startswith("int"):
            continue  # (signed BitShift is opset 28; the conformance cases cover it)
        model = bitwise_model(op_type, elem, [x.shape, second.shape], opset, **attrs)
        ours = opforge.onnx.load(model)(x, second)
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (theirs,) = session.run(None, {"x": x, "y": second})
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{op_type} {attrs}")
    model = bitwise_model("BitwiseNot", elem, [x.shape], 18)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(opforge.onnx.load(model)(x), session.run(None, {"x": x})[0])


def test_onnx_bitshift_errors():
    with pytest.raises(opforge.onnx.ModelError, match="attribute 'direction' is 'UP'"):
        opforge.onnx.load(bitwise_model("BitShift", TensorProto.UINT8, [[3], [3]], 11, direction="UP"))


def test_bitwise_ops_export_to_onnx():
    def f(a, b):
        return ops.bitwise_and(a, b), ops.bitwise_or(a, b), ops.bitwise_xor(a, b), ops.bitwise_not(a), \
            ops.left_shift(a, b), ops.right_shift(a, b)

    graph = opforge.trace(f, TensorSpec([None, 4], "uint32"), TensorSpec([4], "uint32"))
    model = export(graph, opset=18)
    onnx.checker.check_model(model, full_check=True)
    assert sorted(n.op_type for n in model.graph.node) == sorted(
        ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift", "BitShift"])
    a = random_integers((3, 4), "uint32", 7)
    b = np.array([0, 1, 7, 31], np.uint32)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, {i.name: v for i, v in zip(session.get_inputs(), (a, b))}), graph(a, b)):
        np.testing.assert_array_equal(got, want)
    signed = opforge.trace(lambda a, b: ops.right_shift(a, b), TensorSpec([3], "int32"), TensorSpec([3], "int32"))
    with pytest.raises(opforge.onnx.ModelError, match="BitShift of int32 from opset 28"):
        export(signed, opset=18)
    with pytest.raises(opforge.onnx.ModelError, match="ONNX has BitwiseAnd from opset 18; the model's opset is 17"):
        export(graph)  # opset 17 by default
