"""opforge.compat.mindspore: context, GradOperation, arithmetic primitives with gradients, shape helpers, Cell checks.

Programs are written as for MindSpore, with only their imports changed.
"""
from __future__ import annotations

import runpy
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

TESTS = Path(__file__).resolve().parent
KERNELS = TESTS / "kernels"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")


def f32(*values):
    return np.array(values, np.float32)


# --------------------------------------------------------------------------
# context


@pytest.fixture
def restore_context():
    saved = dict(ms.context._settings)
    yield
    ms.context._settings.clear()
    ms.context._settings.update(saved)


def test_context_keeps_device_target_and_mode(restore_context):
    from opforge.compat.mindspore import context

    assert ms.get_context("device_target") == "CPU" and ms.get_context("mode") == ms.PYNATIVE_MODE
    ms.set_context(mode=ms.GRAPH_MODE, device_target="GPU", save_graphs=False)
    assert context.get_context("mode") == context.GRAPH_MODE == ms.GRAPH_MODE
    assert ms.get_context("device_target") == "GPU" and ms.get_context("save_graphs") is False
    context.set_context(device_target="CPU")
    ms.set_device("GPU", 1)
    assert (ms.get_context("device_target"), ms.get_context("device_id")) == ("GPU", 1)


@pytest.mark.parametrize("options", [dict(device_target="Ascend"), dict(mode=2), dict(device_id=-1)])
def test_bad_context_values_are_typed_errors(options, restore_context):
    with pytest.raises(opforge.SchemaError, match=next(iter(options))):
        ms.set_context(**options)
    assert ms.get_context("device_target") == "CPU"  # nothing was kept


def test_unknown_context_option_is_a_typed_error():
    with pytest.raises(opforge.OpforgeError, match="no_such_option"):
        ms.get_context("no_such_option")


def test_dtypes_at_the_top_level():
    assert ms.float32 == mstype.float32 and ms.int64 == mstype.int64
    assert Tensor(1, ms.float32).dtype == np.float32


# --------------------------------------------------------------------------
# arithmetic primitives: built-in ops, so they have gradient rules


@pytest.mark.parametrize("primitive, function", [(ops.Add, np.add), (ops.Sub, np.subtract),
                                                 (ops.Mul, np.multiply), (ops.Div, np.divide)])
def test_arithmetic_primitives(primitive, function):
    x, y = f32(1, 2, 3), f32(4, 5, 6)
    out = primitive()(Tensor(x), Tensor(y))
    assert isinstance(out, Tensor) and out.dtype == np.float32
    np.testing.assert_allclose(out.asnumpy(), function(x, y), rtol=1e-6)
    plain = primitive()(x, y)  # arrays in, arrays out (as inside a Cell)
    assert isinstance(plain, np.ndarray)
    np.testing.assert_allclose(primitive()(x, 2.0), function(x, 2.0).astype(np.float32), rtol=1e-6)


class Binary(Cell):
    def __init__(self, primitive):
        super().__init__()
        self.op = primitive()

    def construct(self, x, y):
        return self.op(x, y)


@pytest.mark.parametrize("primitive, dx, dy", [
    (ops.Add, lambda x, y, s: s, lambda x, y, s: s.sum(axis=0)),
    (ops.Sub, lambda x, y, s: s, lambda x, y, s: -s.sum(axis=0)),
    (ops.Mul, lambda x, y, s: s * y, lambda x, y, s: (s * x).sum(axis=0)),
    (ops.Div, lambda x, y, s: s / y, lambda x, y, s: (-s * x / y ** 2).sum(axis=0)),
])
def test_arithmetic_primitives_differentiate_with_broadcasting(primitive, dx, dy):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    y = (rng.random(3) + 0.5).astype(np.float32)  # broadcast along the first dim
    sens = rng.standard_normal((2, 3)).astype(np.float32)
    gx, gy = ops.GradOperation(get_all=True, sens_param=True)(Binary(primitive))(Tensor(x), Tensor(y), Tensor(sens))
    np.testing.assert_allclose(gx.asnumpy(), dx(x, y, sens), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gy.asnumpy(), dy(x, y, sens), rtol=1e-5, atol=1e-6)
    assert gy.shape == (3,)


# --------------------------------------------------------------------------
# GradOperation


class Poly(Cell):
    """x * y + x: dx = y + 1, dy = x."""

    def __init__(self):
        super().__init__()
        self.mul, self.add = ops.Mul(), ops.Add()

    def construct(self, x, y):
        return self.add(self.mul(x, y), x)


def test_a_custom_op_called_directly_gives_tensors_for_tensors():
    double = ops.Custom(lambda x: x * 2, lambda x: x, mstype.float32, "pyfunc")
    out = double(Tensor(np.array([1.0, 2.0], np.float32)))  # PyNative: no Cell around it
    assert isinstance(out, Tensor)
    np.testing.assert_array_equal(out.asnumpy(), [2.0, 4.0])
    assert isinstance(double(np.ones(2, np.float32)), np.ndarray)  # arrays in, arrays out
    pair = ops.Custom(lambda x: (x, x + 1), lambda x: (x, x), (mstype.float32, mstype.float32), "pyfunc")
    assert all(isinstance(t, Tensor) for t in pair(Tensor(np.zeros(3, np.float32))))


def test_grad_operation_first_input_all_inputs_and_sens():
    x, y = Tensor(f32(1, 2)), Tensor(f32(3, 4))
    first = ops.GradOperation()(Poly())(x, y)
    assert isinstance(first, Tensor)
    np.testing.assert_array_equal(first.asnumpy(), [4, 5])  # sens defaults to ones
    dx, dy = ops.GradOperation(get_all=True)(Poly())(x, y)
    np.testing.assert_array_equal(dx.asnumpy(), [4, 5])
    np.testing.assert_array_equal(dy.asnumpy(), [1, 2])
    dx = ops.GradOperation(sens_param=True)(Poly())(x, y, Tensor(f32(2, -1)))
    np.testing.assert_array_equal(dx.asnumpy(), [8, -5])


def test_grad_operation_of_a_plain_function_calling_a_cell():
    net = Poly()

    def twice(x, y):
        return ops.Mul()(net(x, y), 2.0)

    np.testing.assert_array_equal(ops.GradOperation()(twice)(f32(1, 2), f32(3, 4)).asnumpy(), [8, 10])


def test_grad_operation_refuses_what_it_cannot_do():
    with pytest.raises(opforge.GradientError, match="get_by_list"):
        ops.GradOperation(get_by_list=True)
    with pytest.raises(opforge.GradientError, match="weights"):
        ops.GradOperation()(Poly(), weights=[Tensor(f32(1))])
    with pytest.raises(opforge.GradientError, match="sens"):
        ops.GradOperation(sens_param=True)(lambda: None)()
    with pytest.raises(opforge.GradientError):  # two sens for one output
        ops.GradOperation(sens_param=True)(Poly())(f32(1), f32(2), (f32(1), f32(1)))


def test_cell_bprop_replaces_the_cells_own_gradient():
    """MindSpore's example: a Cell's bprop is its gradient, whatever construct computes."""
    class Net(Cell):
        def construct(self, x, y):
            z = x * y
            z = z * y
            return z

        def bprop(self, x, y, out, dout):
            x_dout = x + y
            y_dout = x * y
            return x_dout, y_dout

    grad_all = ops.GradOperation(get_all=True)
    dx, dy = grad_all(Net())(ms.Tensor(1, ms.float32), ms.Tensor(2, ms.float32))
    assert (float(dx.asnumpy()), float(dy.asnumpy())) == (3.0, 2.0)
    assert float(Net()(ms.Tensor(1, ms.float32), ms.Tensor(2, ms.float32)).asnumpy()) == 4.0  # eager: construct

    class Outer(Cell):  # the bprop Cell inside another: only its part follows bprop
        def __init__(self):
            super().__init__()
            self.inner = Net()

        def construct(self, x, y):
            return ops.Mul()(self.inner(x, y), 3.0)

    dx = ops.GradOperation(sens_param=True)(Outer())(f32(1, 2), f32(2, 2), f32(1, 1))
    np.testing.assert_array_equal(dx.asnumpy(), [3, 4])  # bprop ignores dout, as written


@needs_gxx
def test_seed_style_bprop_program_differentiates_a_custom_op(monkeypatch, capsys):
    monkeypatch.chdir(KERNELS)  # the program refers to "./mindspore_compat.cc", as MindSpore's examples do
    runpy.run_path(str(TESTS / "seeds" / "seed_custom_bprop.py"), run_name="__main__")
    assert capsys.readouterr().out == "[2.  8.  4.5]\n[4. 8. 6.] [ 1.  4. 18.]\n[4. 8. 3.]\n"
    ms.set_context(mode=ms.PYNATIVE_MODE)


@needs_gxx
def test_multi_output_custom_with_bprop_in_a_cell():
    """The seed's AOTMultiOutputNet on CPU: add(aot[0], aot[1]) * aot[2], where aot = (x + w, x - w, [x . w])."""
    info = CustomRegOp().input(0, "x1").input(1, "x2").output(0, "y1").output(1, "y2").output(2, "y3") \
        .dtype_format(*[DataType.F32_Default] * 5).target("CPU").get_op_info()

    def bprop(x, w, out, dout):
        d_sum, d_diff, d_dot = dout
        return d_sum + d_diff + d_dot * w, d_sum - d_diff + d_dot * x

    # The seed program's Cell, as MindSpore's tutorial writes it
    AOTMultiOutputNet = runpy.run_path(str(TESTS.parent / "examples" / "seed_add_mul_div.py"))["AOTMultiOutputNet"]
    net = AOTMultiOutputNet(f"{KERNELS / 'ops.cc'}:SumDiffDot", ([3], [3], [1]),
                            (mstype.float32, mstype.float32, mstype.float32), bprop=bprop, reg=info)
    x, w, s = f32(1, 2, 3), f32(0.5, -1, 2), f32(1, 2, -1)
    dot = float(x @ w)
    np.testing.assert_allclose(net(Tensor(x), Tensor(w)).asnumpy(), 2 * x * dot, rtol=1e-6)
    dx, dw = ops.GradOperation(get_all=True, sens_param=True)(net)(Tensor(x), Tensor(w), Tensor(s))
    np.testing.assert_allclose(dx.asnumpy(), 2 * s * dot + 2 * (s @ x) * w, rtol=1e-5)
    np.testing.assert_allclose(dw.asnumpy(), 2 * (s @ x) * x, rtol=1e-5)


# --------------------------------------------------------------------------
# dynamic-shape helpers


def test_shape_helpers():
    x = Tensor(np.zeros((4, 5), np.float32))
    assert ops.Shape()(x) == ops.shape(x) == (4, 5)
    for shape_tensor in (ops.TensorShape()(x), ops.DynamicShape()(x), ops.dyn_shape(x)):
        assert isinstance(shape_tensor, Tensor) and shape_tensor.dtype == np.int64
        np.testing.assert_array_equal(shape_tensor.asnumpy(), [4, 5])
    placeholder = Tensor(shape=[None, 4], dtype=mstype.float32)
    assert ops.shape(placeholder) == (-1, 4)
    with pytest.raises(opforge.TracingError, match="unknown dims"):
        ops.dyn_shape(placeholder)


def test_shape_helpers_inside_a_differentiated_cell():
    class ScaleByRows(Cell):
        def construct(self, x):
            rows = ops.Shape()(x)[0]
            return ops.Mul()(x, float(rows))

    grad = ops.GradOperation()(ScaleByRows())(Tensor(np.ones((3, 2), np.float32)))
    np.testing.assert_array_equal(grad.asnumpy(), np.full((3, 2), 3.0))


# --------------------------------------------------------------------------
# Cell.set_inputs


class Identity(Cell):
    def construct(self, x):
        return x


def test_set_inputs_dtype_mismatch_is_a_dtype_error_naming_input_and_both_dtypes():
    net = Identity()
    net.set_inputs(Tensor(shape=[None, 4], dtype=mstype.float32))
    assert net(Tensor(np.ones((2, 4), np.float32))).shape == (2, 4)
    with pytest.raises(opforge.DTypeError) as info:
        net(Tensor(np.ones((2, 4), np.float64)))
    message = str(info.value)
    assert "input 0" in message and "float64" in message and "float32" in message
    with pytest.raises(opforge.ShapeError):  # a shape mismatch stays a ShapeError
        net(Tensor(np.ones((2, 5), np.float32)))


def test_placeholder_tensor_mistakes_are_typed_errors():
    with pytest.raises(opforge.OpforgeError):
        Tensor(shape=[None, 4])
    with pytest.raises(opforge.OpforgeError):
        Tensor(shape=[None, 4], dtype=mstype.float32).asnumpy()
    with pytest.raises(opforge.DTypeError, match="rectangular"):
        Tensor([[1, 2], [3]])
