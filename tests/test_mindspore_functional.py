"""opforge.compat.mindspore, MindSpore 2.x style: ms.grad / value_and_grad, Tensor arithmetic outside Cells,
Tensor.dtype against mstype, JSON-string reg_info, and ops.operations._inner_ops.ConvertToDynamic.

Programs are written as for MindSpore, with only their imports changed.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import opforge
import opforge.compat.mindspore as ms
import opforge.compat.mindspore.ops as ops
from opforge.compat.mindspore import Tensor
from opforge.compat.mindspore import dtype as mstype
from opforge.compat.mindspore.nn import Cell
from opforge.compat.mindspore.ops import CustomRegOp, DataType
from opforge.compat.mindspore.ops.operations import _inner_ops as inner

KERNELS = Path(__file__).resolve().parent / "kernels"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")


def f32(*values):
    return np.array(values, np.float32)


def assert_tensor(value, expected):
    assert isinstance(value, Tensor), type(value)
    np.testing.assert_allclose(value.asnumpy(), expected, rtol=1e-6, atol=1e-6)


class XYZ(Cell):
    def construct(self, x, y, z):
        return x * y * z


X, Y, Z = Tensor([1, 2], ms.float32), Tensor([-2, 3], ms.float32), Tensor([0, 3], ms.float32)


# --------------------------------------------------------------------------
# ms.grad / ops.grad


def test_grad_of_one_input_and_of_several():
    assert ms.grad is ops.grad
    assert_tensor(ms.grad(XYZ())(X, Y, Z), [0, 9])  # d(xyz)/dx = yz, grad_position=0
    dy, dz = ms.grad(XYZ(), grad_position=(1, 2))(X, Y, Z)
    assert_tensor(dy, [0, 6])
    assert_tensor(dz, [-2, 6])
    (only,) = ms.grad(XYZ(), grad_position=(2,))(X, Y, Z)  # a one-element tuple gives a tuple
    assert_tensor(only, [-2, 6])


def test_grad_of_several_outputs_sums_them_and_has_aux_keeps_the_first():
    def fn(x, y, z):
        return x * y * z, x + y

    assert_tensor(ms.grad(fn)(X, Y, Z), [0 + 1, 9 + 1])  # every output's gradient is ones
    (dy, dz), aux = ms.grad(fn, (1, 2), None, True)(X, Y, Z)
    assert_tensor(dy, [0, 6])
    assert_tensor(dz, [-2, 6])
    assert isinstance(aux, tuple) and len(aux) == 1
    assert_tensor(aux[0], [-1, 5])  # x + y, returned as it is


def test_grad_return_ids_pairs_each_gradient_with_its_position():
    (i, dy), (j, dz) = ms.grad(XYZ(), grad_position=(1, 2), return_ids=True)(X, Y, Z)
    assert (i, j) == (1, 2)
    assert_tensor(dy, [0, 6])
    assert_tensor(dz, [-2, 6])


def test_value_and_grad():
    assert ms.value_and_grad is ops.value_and_grad
    value, dx = ms.value_and_grad(XYZ())(X, Y, Z)
    assert_tensor(value, [0, 18])
    assert_tensor(dx, [0, 9])

    def fn(x, y, z):
        return x * y * z, z

    (out, aux), (dy,) = ms.value_and_grad(fn, grad_position=(1,), has_aux=True)(X, Y, Z)
    assert_tensor(out, [0, 18])
    assert_tensor(aux, [0, 3])  # with has_aux the value is every output
    assert_tensor(dy, [0, 6])  # only the first output is differentiated


def test_grad_goes_through_a_custom_ops_bprop_and_builtin_rules():
    square = ops.Custom(lambda x: x * x, lambda x: x, mstype.float32, "pyfunc",
                        bprop=lambda x, out, dout: (3 * x * dout,))  # a deliberately "wrong" rule: bprop decides

    class Net(Cell):
        def __init__(self):
            super().__init__()
            self.square, self.add = square, ops.Add()

        def construct(self, x, y):
            return self.add(self.square(x), y * x)

    dx, dy = ms.grad(Net(), (0, 1))(Tensor(f32(1, 2)), Tensor(f32(5, 7)))
    assert_tensor(dx, [3 * 1 + 5, 3 * 2 + 7])
    assert_tensor(dy, [1, 2])


def test_grad_mistakes_are_gradient_errors():
    with pytest.raises(opforge.GradientError, match="weights"):
        ms.grad(XYZ(), weights=[X])
    with pytest.raises(opforge.GradientError, match="both None"):
        ms.grad(XYZ(), grad_position=None)
    with pytest.raises(opforge.GradientError, match="grad_position"):
        ms.grad(XYZ(), grad_position="x")
    with pytest.raises(opforge.GradientError, match="grad_position 5"):
        ms.grad(XYZ(), grad_position=5)(X, Y, Z)
    with pytest.raises(opforge.GradientError, match="more than one output"):
        ms.value_and_grad(XYZ(), has_aux=True)(X, Y, Z)


# --------------------------------------------------------------------------
# Tensor.dtype and mstype


def test_tensor_dtype_is_an_mstype_equal_both_ways_and_hashing_alike():
    t = Tensor(f32(1, 2))
    assert t.dtype == mstype.float32 and mstype.float32 == t.dtype
    assert t.dtype != mstype.int32 and not (mstype.int32 == t.dtype)
    assert repr(t.dtype) == "Float32"  # as MindSpore prints it
    assert t.dtype == np.float32 and np.float32 == t.dtype and np.dtype("float32") == t.dtype
    assert t.dtype == "float32" and mstype.float32 != "junk"
    assert {mstype.float32: "f32"}[t.dtype] == "f32" and t.dtype in {mstype.float32}
    assert hash(mstype.float32) == hash(t.dtype) == hash(np.dtype(np.float32))
    assert t.dtype in (mstype.float16, mstype.float32)
    assert Tensor(np.arange(3)).dtype == mstype.int64
    assert Tensor(shape=[None, 2], dtype=mstype.float16).dtype == mstype.float16  # a placeholder's too
    assert np.zeros(2, t.dtype).dtype == np.float32  # NumPy takes an mstype as a dtype
    assert Tensor([1, 2], t.dtype).dtype == mstype.float32


# --------------------------------------------------------------------------
# Tensor arithmetic outside Cells (PyNative)


@pytest.mark.parametrize("expression, expected", [
    (lambda x, y: x + y, lambda x, y: x + y),
    (lambda x, y: x - y, lambda x, y: x - y),
    (lambda x, y: x * y, lambda x, y: x * y),
    (lambda x, y: x / y, lambda x, y: x / y),
    (lambda x, y: x ** 2, lambda x, y: x ** 2),
    (lambda x, y: -x, lambda x, y: -x),
    (lambda x, y: abs(-x), lambda x, y: x),
    (lambda x, y: 2 * x - 1, lambda x, y: 2 * x - 1),
    (lambda x, y: 1 / y, lambda x, y: 1 / y),
    (lambda x, y: np.float32(3) - x, lambda x, y: 3 - x),
    (lambda x, y: y.asnumpy() + x, lambda x, y: y + x),  # a NumPy array on the left
    (lambda x, y: x * y.asnumpy(), lambda x, y: x * y),
])
def test_tensor_arithmetic_gives_tensors(expression, expected):
    x, y = f32(1, 2, 3), f32(4, 5, 6)
    out = expression(Tensor(x), Tensor(y))
    assert isinstance(out, Tensor) and out.dtype == mstype.float32
    np.testing.assert_allclose(out.asnumpy(), expected(x, y), rtol=1e-6)


def test_tensor_comparisons_give_bool_tensors():
    x, y = Tensor(f32(1, 5, 3)), Tensor(f32(4, 5, 2))
    for out, expected in [(x < y, [1, 0, 0]), (x <= y, [1, 1, 0]), (x > y, [0, 0, 1]), (x >= y, [0, 1, 1]),
                          (x == y, [0, 1, 0]), (x != y, [1, 0, 1]), (x > 2, [0, 1, 1]), (2 < x, [0, 1, 1]),
                          (np.ones(3, np.float32) == x, [1, 0, 0])]:
        assert isinstance(out, Tensor) and out.dtype == mstype.bool_
        np.testing.assert_array_equal(out.asnumpy(), np.array(expected, bool))
    assert (x == None) is False and x != "text"  # noqa: E711 - not an operand: Python's answer
    assert bool(Tensor(f32(1)) > 0) and len({x, y}) == 2  # truth of one element; hashed by identity


def test_tensor_matmul_follows_numpy_for_vectors_and_matrices():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    v, w = f32(1, -1, 2), f32(3, 0, 1)
    for out, expected in [(Tensor(a) @ Tensor(b), a @ b), (Tensor(a) @ v, a @ v), (v @ Tensor(b), v @ b),
                          (Tensor(v) @ Tensor(w), v @ w), (a @ Tensor(b), a @ b)]:
        assert isinstance(out, Tensor)
        assert out.shape == np.shape(expected)
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-6)


def test_tensor_arithmetic_promotes_mixed_dtypes_as_mindspore():
    ints = Tensor(np.array([1, 2, 3], np.int32))
    assert (ints * 2).dtype == mstype.int32  # an int scalar takes the Tensor's dtype
    halves = ints + 0.5  # a float meeting an int Tensor: float32
    assert halves.dtype == mstype.float32
    np.testing.assert_allclose(halves.asnumpy(), [1.5, 2.5, 3.5])
    wide = Tensor(f32(1, 2, 3)) + Tensor(np.array([1, 1, 1], np.float64))
    assert wide.dtype == mstype.float64
    assert (Tensor(f32(1, 2)) * 2.0).dtype == mstype.float32  # a float scalar is weak


def test_gradients_flow_through_tensor_arithmetic():
    w = Tensor(f32(3, 4))  # read from outside the differentiated function
    m = Tensor(np.eye(2, dtype=np.float32) * 2)

    def loss(x):
        return w * x - (x @ m) + (-x) / 2

    # d/dx of sum(w * x - 2x - x / 2) = w - 2 - 0.5
    assert_tensor(ms.grad(loss)(Tensor(f32(1, 2))), [3 - 2.5, 4 - 2.5])

    class Scaled(Cell):
        def __init__(self):
            super().__init__()
            self.w = w

        def construct(self, x):
            return self.w * x * x  # inside a Cell: Tensor attribute times a traced value

    assert_tensor(ops.GradOperation()(Scaled())(Tensor(f32(1, 2))), [2 * 3 * 1, 2 * 4 * 2])
    assert_tensor(Scaled()(Tensor(f32(1, 2))), [3, 16])  # eager, the same Tensors


# --------------------------------------------------------------------------
# reg_info as a JSON string


def square_info(target="CPU", op_name="square_cpu"):
    return CustomRegOp(op_name).input(0, "x").output(0, "y") \
        .dtype_format(DataType.F32_Default, DataType.F32_Default).target(target).get_op_info()


@needs_gxx
@pytest.mark.parametrize("reg_info", [
    json.dumps(square_info()),
    [json.dumps(square_info("GPU", "square_gpu")), json.dumps(square_info())],  # the context's target is chosen
    [[square_info("GPU", "square_gpu")], (json.dumps(square_info()),)],  # nested, as MindSpore flattens them
], ids=["string", "list", "nested"])
def test_reg_info_as_a_json_string(reg_info):
    op = ops.Custom(f"{KERNELS / 'mindspore_compat.cc'}:Square", lambda x: x, mstype.float32, "aot",
                    reg_info=reg_info)
    assert op.name == "square_cpu" and op.aot_kernel.device == "cpu"
    assert [i.name for i in op.inputs] == ["x"] and list(op.outputs) == ["y"]
    assert_tensor(op(Tensor(f32(1, 2, 3))), [1, 4, 9])


@needs_gxx
def test_reg_info_json_attributes_with_mindspores_documented_keys():
    text = json.dumps({"op_name": "axis_probe", "inputs": [{"index": 0, "name": "x", "param_type": "required"}],
                       "outputs": [{"index": 0, "name": "y", "param_type": "required"}],
                       "attr": [{"name": "reduce_axis", "param_type": "required", "value_type": "int", "value": 1},
                                {"name": "scale", "param_type": "required", "value_type": "float", "value": 0.5}],
                       "dtype_format": [[["float64", "DefaultFormat"], ["float64", "DefaultFormat"]]],
                       "target": "CPU"})
    op = ops.Custom(f"{KERNELS / 'mindspore_compat.cc'}:Axis", [2], mstype.float64, "aot", reg_info=text)
    np.testing.assert_array_equal(op(np.zeros(1)), [1, 0.5])
    with pytest.raises(opforge.AttrError):  # value_type is checked as "type" is: an int attribute
        op(np.zeros(1), reduce_axis="one")


@pytest.mark.parametrize("text, match", [("{not json", "not JSON"), ("[1, 2]", "must be an object"),
                                         ('"a string"', "must be an object")])
def test_malformed_json_reg_info_is_a_schema_error(text, match):
    with pytest.raises(opforge.SchemaError, match=match):
        ops.Custom(f"{KERNELS / 'mindspore_compat.cc'}:Square", [3], mstype.float32, "aot", reg_info=text)


# --------------------------------------------------------------------------
# ops.operations._inner_ops.ConvertToDynamic


def test_convert_to_dynamic_passes_its_input_through():
    convert = inner.ConvertToDynamic(is_dynamic_rank=True).add_prim_attr("primitive_target", "CPU")
    assert isinstance(convert, inner.ConvertToDynamic) and isinstance(convert, ops.Primitive)
    assert convert.attrs == {"is_dynamic_rank": True, "primitive_target": "CPU"} and convert.is_dynamic_rank
    assert not inner.ConvertToDynamic().is_dynamic_rank
    x = Tensor(f32(1, 2))
    assert convert(x) is x
    assert ops.operations._inner_ops is inner and ops.operations.Add is ops.Add
    with pytest.raises(opforge.SchemaError, match="is_dynamic_rank"):
        inner.ConvertToDynamic(is_dynamic_rank="yes")


def test_gradients_flow_through_convert_to_dynamic():
    convert = inner.ConvertToDynamic()
    assert_tensor(ms.grad(lambda x: convert(x) * x)(Tensor(f32(1, 3))), [2, 6])


@needs_gxx
def test_mindspores_dynamic_shape_test_nets():
    """The shape of MindSpore's test_custom_aot.py nets: ConvertToDynamic before an aot op whose output shape
    comes from the library's InferShape (ReduceDynNet), or from out_shape (AOTSingleOutputDynNet)."""
    class ReduceDynNet(Cell):
        def __init__(self, func, out_types, keep_dim):
            super(ReduceDynNet, self).__init__()
            reduce_cpu_info = CustomRegOp("row_sum_cpu") \
                .input(0, "x1") \
                .output(0, "y") \
                .dtype_format(DataType.None_None, DataType.None_None) \
                .attr("keep_dim", "required", "bool", value=keep_dim) \
                .target("CPU") \
                .get_op_info()
            self.program = ops.Custom(func, None, out_types, "aot", reg_info=reduce_cpu_info)
            self.convert_to_dynamic = inner.ConvertToDynamic(
                is_dynamic_rank=True).add_prim_attr("primitive_target", "CPU")

        def construct(self, x):
            x = self.convert_to_dynamic(x)
            return self.program(x)

    class AOTSingleOutputDynNet(Cell):
        def __init__(self, func, out_types, reg=None):
            super(AOTSingleOutputDynNet, self).__init__()
            self.program = ops.Custom(func, lambda x: x, out_types, "aot", reg_info=reg)
            self.convert_to_dynamic = inner.ConvertToDynamic(
                is_dynamic_rank=True).add_prim_attr("primitive_target", "CPU")

        def construct(self, x):
            x = self.convert_to_dynamic(x)
            return self.program(x)

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    try:
        rng = np.random.default_rng(0)
        for shape in [(4, 5), (3, 7)]:
            input_x = rng.normal(0, 1, shape).astype(np.float32)
            for keep_dim in (False, True):
                test = ReduceDynNet(f"{KERNELS / 'ops.cc'}:RowSum", mstype.float32, keep_dim)
                output = test(Tensor(input_x))
                assert np.allclose(np.sum(input_x, 1, keepdims=keep_dim), output.asnumpy(), 0.001, 0.001)
            square = AOTSingleOutputDynNet(f"{KERNELS / 'mindspore_compat.cc'}:Square", mstype.float32)
            assert np.allclose(input_x * input_x, square(Tensor(input_x)).asnumpy(), 0.001, 0.001)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
