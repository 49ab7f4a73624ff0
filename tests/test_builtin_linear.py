"""matmul, gemm, conv, conv_transpose and conv_weight_grad: the OpenBLAS kernels against
the NumPy references (f32 and f64, shapes, strides, pads, dilations, groups), the
kernel choice with and without OpenBLAS, inference and errors, and the ONNX
converters (MatMul, Gemm, Conv, ConvTranspose) against onnxruntime."""
import copy
import os
import re
import time

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import opforge
import opforge.onnx as ox
from opforge import TensorSpec
from opforge.builtins.conv import output_padding_for
from opforge.operator import Op
from opforge.runtime import blas
from opforge.runtime.dispatch import select_kernel

ops = opforge.ops
matmul, gemm, conv, conv_transpose, conv_weight_grad = (
    opforge.lookup(name) for name in ("matmul", "gemm", "conv", "conv_transpose", "conv_weight_grad"))
FLOATS = ["float32", "float64"]


def r(*shape, dtype="float64", seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype)


def tolerance(dtype):
    return dict(rtol=1e-4, atol=1e-4) if np.dtype(dtype) == np.float32 else dict(rtol=1e-10, atol=1e-10)


def check(op, inputs, kernel, **attrs):
    """op(*inputs) by the kernel named ``kernel`` agrees with the reference, its inference and its dtype."""
    specs = [None if x is None else TensorSpec.of(x) for x in inputs]
    assert re.sub(r"\[\w+\]", "", select_kernel(op, specs).name) == kernel  # (conv is built per ISA)
    _, resolved = op.bind(list(inputs), attrs)
    got = op(*inputs, **attrs)
    want = op.reference_kernel.fn(*inputs, **resolved)
    assert got.shape == want.shape == op.infer(*specs, **attrs).shape
    assert got.dtype == want.dtype == inputs[0].dtype
    np.testing.assert_allclose(got, want, **tolerance(got.dtype))
    return got


# -- OpenBLAS and dispatch -----------------------------------------------------------

def test_openblas_is_found_and_loaded():
    path = blas.library_path()
    assert path is not None and path.exists()
    assert blas.available() and blas.reject_reason() is None
    assert blas.load().scipy_cblas_sgemm  # resolvable, so kernel libraries resolve it too


def test_openblas_threads_can_be_set():
    handle = blas.load()
    before = handle.scipy_openblas_get_num_threads()
    if "OPFORGE_BLAS_THREADS" not in os.environ:
        assert before == 1  # the pool gives the products their threads
    try:
        blas.set_num_threads(1)
        assert handle.scipy_openblas_get_num_threads() == 1
        x = r(40, 30, dtype="float32")
        np.testing.assert_allclose(matmul(x, x.T), x @ x.T, rtol=1e-4, atol=1e-5)  # summation orders differ by CPU
    finally:
        blas.set_num_threads(before)
    with pytest.raises(opforge.OpforgeError, match="positive int"):
        blas.set_num_threads(0)


def test_check_op_passes_for_every_linear_op():
    f32 = dict(dtype="float32")
    cases = [(conv, [r(1, 2, 5, 5, **f32), r(3, 2, 3, 3, **f32), r(3, **f32)], dict(pads=[1, 1, 1, 1])),
             (conv, [r(1, 2, 5, 5, **f32), r(3, 2, 3, 3, **f32), None], {}),
             (conv_transpose, [r(1, 2, 4, 4, **f32), r(2, 3, 3, 3, **f32), r(3, **f32)], dict(strides=[2, 2])),
             (gemm, [r(3, 4, **f32), r(4, 5, **f32), r(5, **f32)], {}),
             (matmul, [r(2, 3, 4, **f32), r(1, 4, 5, **f32)], {}),
             (conv_weight_grad, [r(1, 2, 5, 5, **f32), r(1, 3, 3, 3, **f32)], dict(kernel_shape=[3, 3]))]
    for op, inputs, attrs in cases:
        results = opforge.testing.check_op(op, *inputs, **attrs)
        assert results and not [entry for entry in results if entry[1] is False], op.name


def test_every_linear_kernel_needs_openblas():
    for op in (matmul, gemm, conv, conv_transpose, conv_weight_grad):
        natives = [k for k in op.kernels if not k.reference and k.device == "cpu"]
        assert natives and all(k.requires is blas.reject_reason for k in natives), op.name


@pytest.fixture
def without_openblas(monkeypatch):
    monkeypatch.setattr(blas, "available", lambda: False)
    Op.forget_all_plans()
    yield
    monkeypatch.undo()
    Op.forget_all_plans()


def test_the_reference_runs_without_openblas(without_openblas):
    x, w, b = r(1, 2, 5, 5, dtype="float32"), r(3, 2, 3, 3, dtype="float32", seed=1), r(3, dtype="float32", seed=2)
    for op, inputs in ((conv, [x, w, b]), (conv, [x, w, None]), (matmul, [x, x]), (gemm, [x[0, 0], x[0, 1], None])):
        chosen = select_kernel(op, [None if a is None else TensorSpec.of(a) for a in inputs])
        assert chosen.reference, (op.name, chosen)
        assert op(*inputs).shape == op.infer(*inputs).shape
    assert "OpenBLAS" in blas.reject_reason()
    kernel = copy.copy(next(k for k in conv.kernels if not k.reference and k.requires is not None))
    kernel.library = None  # (a copy not loaded yet)
    with pytest.raises(opforge.KernelSourceError, match="OpenBLAS"):
        kernel.load()  # never dlopened without OpenBLAS (its gemm symbols would not resolve)


# -- matmul ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape_a,shape_b", [
    ((3, 4), (4, 5)), ((1, 1), (1, 7)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (1, 4, 5)), ((1, 3, 4), (3, 4, 2)),
    ((2, 1, 3, 4), (1, 3, 4, 2)), ((4, 2, 5, 3), (1, 1, 3, 6)), ((3, 0, 4), (3, 4, 2))])
def test_matmul_kernel_with_broadcast_batch_dims(dtype, shape_a, shape_b):
    a, b = r(*shape_a, dtype=dtype), r(*shape_b, dtype=dtype, seed=1)
    got = check(matmul, [a, b], f"MatMul<{dtype},{dtype}>")
    np.testing.assert_allclose(got, a @ b, **tolerance(dtype))


def test_matmul_broadcast_inference_and_errors():
    def infer(a, b):
        return matmul.infer(TensorSpec(a, "float32"), TensorSpec(b, "float32")).shape

    assert infer([1, 3, 4], [5, 4, 2]) == (5, 3, 2)
    assert infer([None, 3, 4], [1, 4, 2]) == (-1, 3, 2)
    assert infer([1, 3, 4], [None, 4, 2]) == (-1, 3, 2)
    with pytest.raises(opforge.ShapeError, match=r"batch dim 1 differs \(2 in a, 3 in b\)"):
        infer([1, 2, 3, 4], [1, 3, 4, 2])


# -- gemm ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("c_shape", [(), (1,), (5,), (3, 1), (1, 5), (3, 5)])
def test_gemm_kernel(dtype, trans_a, trans_b, c_shape):
    a = r(*((4, 3) if trans_a else (3, 4)), dtype=dtype)
    b = r(*((5, 4) if trans_b else (4, 5)), dtype=dtype, seed=1)
    c = r(*c_shape, dtype=dtype, seed=2)
    attrs = dict(alpha=0.25, beta=-1.5, trans_a=trans_a, trans_b=trans_b)
    got = check(gemm, [a, b, c], f"Gemm<{dtype},{dtype},{dtype}>", **attrs)
    want = (a.T if trans_a else a) @ (b.T if trans_b else b) * 0.25 - 1.5 * c
    np.testing.assert_allclose(got, want, **tolerance(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_gemm_without_c_passes_zeros_to_the_blas_kernel(dtype):
    a, b = r(3, 4, dtype=dtype), r(4, 5, dtype=dtype, seed=1)
    got = check(gemm, [a, b, None], "gemm_without_c", alpha=2.0)
    np.testing.assert_allclose(got, 2 * a @ b, **tolerance(dtype))


def test_gemm_errors():
    a, b = r(3, 4), r(5, 6)
    with pytest.raises(opforge.ShapeError, match="op 'gemm': the inner dims differ"):
        gemm(a, b, None)
    with pytest.raises(opforge.ShapeError, match="input 'c'"):
        gemm(a, r(4, 2), r(2, 3))
    with pytest.raises(opforge.ShapeError, match="matrices"):
        gemm(r(2, 3, 4), r(4, 2), None)
    with pytest.raises(opforge.DTypeError, match="input 'b' has dtype float32"):
        gemm(a, r(4, 2, dtype="float32"), None)
    assert gemm.infer(TensorSpec([None, 4]), TensorSpec([4, None]), None, trans_b=False).shape == (-1, -1)
    assert gemm.infer(TensorSpec(None), TensorSpec([7, 4]), None, trans_b=True).shape == (-1, 7)


# -- conv ------------------------------------------------------------------------------

CONV_CASES = [  # x shape, w shape, attributes
    ((2, 3, 7, 6), (4, 3, 3, 3), {}),
    ((1, 4, 9, 8), (6, 2, 3, 2), dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2], group=2)),
    ((2, 6, 5, 5), (6, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=6)),  # depthwise
    ((1, 4, 9, 8), (4, 1, 3, 2), dict(pads=[1, 0, 2, 1], strides=[2, 3], dilations=[2, 1], group=4)),
    ((1, 3, 10), (6, 1, 3), dict(group=3, pads=[1, 1])),  # a channel multiplier of 2: not depthwise
    ((1, 8, 5, 4), (4, 8, 1, 1), {}),  # 1 x 1: no im2col
    ((2, 4, 6, 6), (4, 4, 1, 1), dict(strides=[2, 2])),
    ((1, 3, 11), (2, 3, 4), dict(strides=[3], pads=[2, 3], dilations=[2])),  # 1-D
    ((1, 2, 4, 5, 6), (3, 2, 2, 3, 2), dict(pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 2])),  # 3-D
    ((1, 1, 3, 3), (1, 1, 5, 5), dict(pads=[2, 2, 2, 2])),  # kernel larger than the input
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES)
def test_conv_kernel(dtype, x_shape, w_shape, attrs):
    x, w, b = r(*x_shape, dtype=dtype), r(*w_shape, dtype=dtype, seed=1), r(w_shape[0], dtype=dtype, seed=2)
    with_bias = check(conv, [x, w, b], f"Conv<{dtype},{dtype},{dtype}>", **attrs)
    without = check(conv, [x, w, None], "conv_without_b", **attrs)
    np.testing.assert_allclose(with_bias - without, np.broadcast_to(b.reshape(-1, *[1] * (x.ndim - 2)),
                                                                     with_bias.shape), **tolerance(dtype))
    resolved = {k: v for k, v in conv.resolve_attrs(attrs).items() if k != "activation"}  # (conv's alone)
    dy = r(*with_bias.shape, dtype=dtype, seed=3)
    check(conv_weight_grad, [x, dy], f"ConvWeightGrad<{dtype},{dtype}>", kernel_shape=list(w_shape[2:]), **resolved)


@pytest.mark.parametrize("dtype", FLOATS)
def test_conv_ops_make_columns_a_block_at_a_time(dtype):
    # The columns of these inputs need more than the 8 MiB workspace, so the kernels go in blocks of rows.
    x, w = r(1, 64, 150, 151, dtype=dtype), r(4, 64, 3, 3, dtype=dtype, seed=1)
    y = check(conv, [x, w, None], "conv_without_b", pads=[1, 0, 0, 1], strides=[1, 2])
    dy = r(*y.shape, dtype=dtype, seed=2) / 20  # small: dw sums 11000 products per element
    check(conv_weight_grad, [x, dy], f"ConvWeightGrad<{dtype},{dtype}>",
          kernel_shape=[3, 3], strides=[1, 2], pads=[1, 0, 0, 1], dilations=[1, 1], group=1)
    back = r(1, 64, 150, 151, dtype=dtype, seed=3)
    check(conv_transpose, [back, r(64, 16, 3, 3, dtype=dtype, seed=4), None], "conv_transpose_without_b",
          strides=[2, 1])


@pytest.mark.parametrize("dtype", FLOATS)
def test_empty_products_leave_the_bias(dtype):
    # No input channels, no inner dim: y is the bias (beta * c), not the zeros of a skipped kernel.
    b = r(3, dtype=dtype, seed=2)
    y = check(conv, [r(2, 0, 4, 4, dtype=dtype), r(3, 0, 3, 3, dtype=dtype), b], f"Conv<{dtype},{dtype},{dtype}>",
              pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(y, np.broadcast_to(b.reshape(3, 1, 1), (2, 3, 4, 4)))
    y = check(conv_transpose, [r(1, 0, 3, dtype=dtype), r(0, 3, 2, dtype=dtype), b],
              f"ConvTranspose<{dtype},{dtype},{dtype}>")
    np.testing.assert_array_equal(y, np.broadcast_to(b.reshape(3, 1), (1, 3, 4)))
    y = check(gemm, [r(2, 0, dtype=dtype), r(0, 3, dtype=dtype), b], f"Gemm<{dtype},{dtype},{dtype}>", beta=2.0)
    np.testing.assert_array_equal(y, np.broadcast_to(2 * b, (2, 3)))
    assert check(conv, [r(0, 2, 4, 4, dtype=dtype), r(3, 2, 3, 3, dtype=dtype), b],
                 f"Conv<{dtype},{dtype},{dtype}>").shape == (0, 3, 2, 2)


@pytest.mark.parametrize("dtype", FLOATS + ["float16"])
def test_an_empty_batch_has_a_zero_weight_gradient(dtype):
    # x and dy empty, dw not: the kernel (or float16's reference) sums over no samples
    x, dy = np.ones((0, 2, 4, 4), dtype), np.ones((0, 3, 2, 2), dtype)
    dw = ops.conv_weight_grad(x, dy, kernel_shape=[3, 3])
    assert dw.dtype == dtype
    np.testing.assert_array_equal(dw, np.zeros((3, 2, 3, 3), dtype))


def test_float16_runs_the_references():
    x, w, b = r(1, 2, 5, 5), r(3, 2, 3, 3, seed=1), r(3, seed=2)
    for op, inputs in ((conv, [x, w, b]), (conv_transpose, [x, r(2, 3, 3, 3), None]), (gemm, [x[0, 0, :, :3], w[0, 0], b])):
        half = [None if a is None else a.astype(np.float16) for a in inputs]
        assert select_kernel(op, [None if a is None else TensorSpec.of(a) for a in half]).reference
        got = op(*half)
        assert got.dtype == np.float16
        np.testing.assert_allclose(got, op(*inputs), rtol=2e-2, atol=5e-2)


def test_conv_reference_is_a_plain_sum():
    # The reference against the definition, written out for one small 2-D case.
    x, w, b = r(1, 2, 5, 4), r(2, 1, 2, 3, seed=1), r(2, seed=2)
    got = conv.reference_kernel.fn(x, w, b, strides=[2, 1], pads=[1, 0, 0, 2], dilations=[2, 1], group=2)
    padded = np.pad(x, [(0, 0), (0, 0), (1, 0), (0, 2)])
    want = np.zeros((1, 2, 2, 4))
    for m in range(2):
        for i in range(2):
            for j in range(4):
                window = padded[0, m, i * 2:i * 2 + 3:2, j:j + 3]
                want[0, m, i, j] = (window * w[m, 0]).sum() + b[m]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_conv_inference_with_unknown_dims():
    spec = conv.infer(TensorSpec([None, 3, None, 9]), TensorSpec([8, 3, 3, 3]), None, strides=[1, 2])
    assert spec.shape == (-1, 8, -1, 4)
    assert conv.infer(TensorSpec(None), TensorSpec([8, 3, 3, 3]), None).shape == (-1, 8, -1, -1)
    assert conv.infer(TensorSpec(None), TensorSpec(None), None).rank is None
    assert conv_transpose.infer(TensorSpec([2, 4, None]), TensorSpec([4, 3, 3]), None, strides=[2],
                                group=2).shape == (2, 6, -1)


@pytest.mark.parametrize("call,error,message", [
    (lambda: conv(r(1, 3, 5, 5), r(4, 2, 3, 3), None), opforge.ShapeError, "input 'x' has 3 channels"),
    (lambda: conv(r(1, 4, 5, 5), r(3, 2, 3, 3), None, group=2), opforge.ShapeError, "not a multiple of group=2"),
    (lambda: conv(r(1, 3, 2, 2), r(4, 3, 3, 3), None), opforge.ShapeError, "smaller than the dilated kernel"),
    (lambda: conv(r(1, 3, 5, 5), r(4, 3, 3), None), opforge.ShapeError, "ranks 4 and 3"),
    (lambda: conv(r(3, 5), r(4, 3), None), opforge.ShapeError, "rank >= 3"),
    (lambda: conv(r(1, 3, 5, 5), r(4, 3, 3, 3), r(3)), opforge.ShapeError, "input 'b' has shape"),
    (lambda: conv(r(1, 3, 5, 5), r(4, 3, 3, 3), None, strides=[1]), opforge.AttrError, "'strides' has 1 values"),
    (lambda: conv(r(1, 3, 5, 5), r(4, 3, 3, 3), None, pads=[1, 1, -1, 1]), opforge.AttrError, "'pads'"),
    (lambda: conv(r(1, 3, 5, 5), r(4, 3, 3, 3), None, dilations=[0, 1]), opforge.AttrError, "'dilations'"),
    (lambda: conv(r(1, 3, 5, 5), r(4, 3, 3, 3), None, group=0), opforge.AttrError, "'group'"),
    (lambda: conv(r(1, 3, 5, 5, dtype="int64"), r(4, 3, 3, 3, dtype="int64"), None), opforge.DTypeError,
     "float16, float32 or float64"),
    (lambda: conv_transpose(r(1, 3, 5), r(4, 2, 3), None), opforge.ShapeError, "w .* takes 4"),
    (lambda: conv_transpose(r(1, 3, 5), r(3, 2, 3), None, output_padding=[-1]), opforge.AttrError,
     "'output_padding'"),
])
def test_conv_errors_name_the_op_and_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


# -- conv_transpose ----------------------------------------------------------------------

CONV_TRANSPOSE_CASES = [
    ((2, 3, 4, 3), (3, 2, 3, 3), {}),
    ((1, 4, 3, 4), (4, 3, 2, 3), dict(strides=[2, 1], pads=[1, 0, 0, 1], group=2, output_padding=[1, 0])),
    ((1, 2, 3, 3), (2, 1, 3, 3), dict(strides=[2, 2], dilations=[3, 3], output_padding=[2, 2])),
    ((1, 8, 5, 4), (8, 4, 1, 1), {}),  # 1 x 1: no col2im
    ((2, 2, 5), (2, 3, 4), dict(strides=[3], pads=[1, 2], dilations=[2])),  # 1-D
    ((1, 2, 2, 3, 2), (2, 2, 2, 2, 3), dict(strides=[2, 1, 2], pads=[0, 1, 1, 1, 0, 0])),  # 3-D
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_TRANSPOSE_CASES)
def test_conv_transpose_kernel(dtype, x_shape, w_shape, attrs):
    x, w = r(*x_shape, dtype=dtype), r(*w_shape, dtype=dtype, seed=1)
    b = r(w_shape[1] * attrs.get("group", 1), dtype=dtype, seed=2)
    check(conv_transpose, [x, w, b], f"ConvTranspose<{dtype},{dtype},{dtype}>", **attrs)
    check(conv_transpose, [x, w, None], "conv_transpose_without_b", **attrs)


def test_check_op_over_every_conv_case():
    # check_op runs native kernels in checked mode: a write past any buffer, or output never written, fails.
    for x_shape, w_shape, attrs in CONV_CASES:
        x, w = r(*x_shape, dtype="float64"), r(*w_shape, dtype="float64", seed=1)
        for op, inputs in ((conv, [x, w, r(w_shape[0], dtype="float64")]),
                           (conv_transpose, [conv(x, w, None, **attrs), w,
                                             r(w_shape[1] * attrs.get("group", 1), dtype="float64")])):
            results = opforge.testing.check_op(op, *inputs, **attrs)
            assert not [entry for entry in results if entry[1] is False], (op.name, x_shape)
            assert any("writes every element" in entry[0] for entry in results)


def test_conv_transpose_is_the_adjoint_of_conv():
    # <conv(x, w), y> == <x, conv_transpose(y, w)> when the output padding restores x's size.
    x, w = r(2, 4, 9, 8), r(6, 2, 3, 2, seed=1)
    geometry = dict(strides=[2, 3], pads=[1, 0, 2, 1], dilations=[1, 2], group=2)
    y = r(*conv(x, w, None, **geometry).shape, seed=2)
    padding = output_padding_for(x.shape, w.shape, geometry["strides"], geometry["pads"], geometry["dilations"])
    assert padding == [1, 0]
    back = conv_transpose(y, w, None, output_padding=padding, **geometry)
    assert back.shape == x.shape
    np.testing.assert_allclose((conv(x, w, None, **geometry) * y).sum(), (x * back).sum(), rtol=1e-10)


# -- graphs and gradients ----------------------------------------------------------------

def test_a_traced_conv_network_runs_and_differentiates():
    w1, b1, w2 = r(4, 3, 3, 3, seed=1), r(4, seed=2), r(4, 2, 2, 2, seed=3)

    def net(x):
        h = ops.relu(ops.conv(x, w1, b1, pads=[1, 1, 1, 1]))
        return ops.reduce_sum(ops.conv_transpose(h, w2, None, strides=[2, 2]) ** 2.0)

    x = r(2, 3, 5, 5)
    graph = opforge.trace(net, TensorSpec([None, 3, 5, 5], "float64"))
    np.testing.assert_allclose(graph(x), net(x), rtol=1e-12)
    dx = opforge.grad(net)(x)
    v, eps = r(*x.shape, seed=4), 1e-6  # a directional derivative by central differences
    np.testing.assert_allclose((net(x + eps * v) - net(x - eps * v)) / (2 * eps), (dx * v).sum(), rtol=1e-6)
    opforge.testing.gradcheck(lambda x, w: ops.conv(x, w, None, strides=[2, 2]), r(1, 2, 5, 5), r(3, 2, 3, 3))


# -- ONNX converters against onnxruntime -----------------------------------------------------

ELEM = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("float64"): TensorProto.DOUBLE}


def model_of(op_type, inputs, attrs, opset, constant):
    names = [f"x{k}" if x is not None else "" for k, x in enumerate(inputs)]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, ELEM[x.dtype], x.shape)
                    for n, x in zip(names, inputs) if x is not None and n not in constant]
    initializers = [numpy_helper.from_array(x, n) for n, x in zip(names, inputs) if n in constant]
    graph = helper.make_graph([node], "m", graph_inputs, [helper.make_empty_tensor_value_info("y")], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def agrees_with_onnxruntime(op_type, inputs, attrs=None, opset=13, constant=("x1",)):
    model = model_of(op_type, inputs, attrs or {}, opset, constant)
    feeds = {f"x{k}": x for k, x in enumerate(inputs) if x is not None and f"x{k}" not in constant}
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph = ox.load(model)
    got = graph(*[feeds[name] for name in graph.input_names])
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return graph


@pytest.mark.parametrize("shape_a,shape_b", [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 5)),
    ((5, 3, 4), (4,)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 2, 4, 1))])
def test_onnx_matmul(shape_a, shape_b):
    agrees_with_onnxruntime("MatMul", [r(*shape_a, dtype="float32"), r(*shape_b, dtype="float32", seed=1)])
    agrees_with_onnxruntime("MatMul", [r(*shape_a, dtype="float32"), r(*shape_b, dtype="float32", seed=1)],
                            opset=1, constant=())


@pytest.mark.parametrize("attrs,c_shape,opset", [
    ({}, (5,), 13), (dict(transA=1, alpha=0.5), (3, 5), 13), (dict(transB=1, beta=2.0), (1, 5), 11),
    (dict(transA=1, transB=1), (), 9), (dict(beta=0.5), (5,), 7), ({}, None, 11), (dict(alpha=3.0), None, 13)])
def test_onnx_gemm(attrs, c_shape, opset):
    a = r(*((4, 3) if attrs.get("transA") else (3, 4)), dtype="float32")
    b = r(*((5, 4) if attrs.get("transB") else (4, 5)), dtype="float32", seed=1)
    c = None if c_shape is None else r(*c_shape, dtype="float32", seed=2)
    agrees_with_onnxruntime("Gemm", [a, b, c], attrs, opset=opset, constant=("x1", "x2"))


def test_onnx_gemm_before_opset_7_broadcasts_c():
    # (onnxruntime has no Gemm before opset 7.)
    a, b, c = r(3, 4, dtype="float32"), r(4, 5, dtype="float32", seed=1), r(5, dtype="float32", seed=2)
    model = model_of("Gemm", [a, b, c], dict(broadcast=1, beta=0.5), 6, ("x1", "x2"))
    np.testing.assert_allclose(ox.load(model)(a), a @ b + 0.5 * c, rtol=1e-5)


@pytest.mark.parametrize("x_shape,w_shape,attrs,bias", [
    ((1, 3, 8, 8), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1]), True),
    ((2, 4, 7, 9), (6, 2, 3, 3), dict(strides=[2, 2], group=2, dilations=[1, 2]), False),
    ((1, 3, 7, 8), (2, 3, 3, 2), dict(auto_pad="SAME_UPPER", strides=[2, 3]), True),
    ((1, 3, 7, 8), (2, 3, 4, 4), dict(auto_pad="SAME_LOWER", kernel_shape=[4, 4]), False),
    ((1, 3, 7, 8), (2, 3, 3, 3), dict(auto_pad="VALID"), True),
    ((1, 2, 10), (3, 2, 3), dict(strides=[2], pads=[1, 0]), True),
    ((1, 2, 4, 5, 3), (2, 2, 3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1]), False),
])
def test_onnx_conv(x_shape, w_shape, attrs, bias):
    x, w = r(*x_shape, dtype="float32"), r(*w_shape, dtype="float32", seed=1)
    b = r(w_shape[0], dtype="float32", seed=2) if bias else None
    graph = agrees_with_onnxruntime("Conv", [x, w, b], attrs, opset=11, constant=("x1", "x2"))
    conv_nodes = [n for n in graph.nodes if n.op is not None and n.op.name == "conv"]
    assert len(conv_nodes) == 1 and conv_nodes[0].inputs[2] is not None  # zeros for an absent bias


@pytest.mark.parametrize("x_shape,w_shape,attrs,bias", [
    ((1, 3, 4, 4), (3, 2, 3, 3), {}, True),
    ((1, 2, 3, 3), (2, 3, 3, 3), dict(strides=[3, 2], output_padding=[1, 1]), False),
    ((1, 2, 3, 3), (2, 3, 3, 3), dict(strides=[3, 2], output_shape=[10, 8]), True),
    ((1, 2, 3, 3), (2, 3, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER"), False),
    ((1, 2, 3, 4), (2, 3, 4, 3), dict(strides=[2, 3], auto_pad="SAME_LOWER"), True),
    ((1, 4, 3, 3), (4, 1, 2, 2), dict(group=2, dilations=[2, 2], pads=[1, 0, 0, 1]), True),
    ((1, 2, 5), (2, 2, 3), dict(strides=[2], pads=[1, 1]), False),
    ((1, 2, 5), (2, 2, 3), dict(strides=[2], auto_pad="VALID"), True),
    ((1, 2, 5), (2, 2, 3), dict(strides=[2], auto_pad="VALID", output_shape=[10]), True),
    ((1, 2, 5), (2, 2, 3), dict(strides=[2], pads=[2, 2], output_shape=[9]), False),
])
def test_onnx_conv_transpose(x_shape, w_shape, attrs, bias):
    x, w = r(*x_shape, dtype="float32"), r(*w_shape, dtype="float32", seed=1)
    b = r(w_shape[1] * attrs.get("group", 1), dtype="float32", seed=2) if bias else None
    agrees_with_onnxruntime("ConvTranspose", [x, w, b], attrs, opset=11, constant=("x1", "x2"))


def test_onnx_cnn_with_a_dynamic_batch():
    # Conv -> Relu -> ConvTranspose -> Flatten -> Gemm -> MatMul, batch dim "N", against onnxruntime.
    f32 = dict(dtype="float32")
    weights = {"w1": r(4, 3, 3, 3, **f32), "b1": r(4, **f32), "w2": r(4, 2, 2, 2, **f32),
               "g": r(2 * 8 * 8, 5, **f32), "c": r(5, **f32), "m": r(5, 3, **f32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["h1"], ["h2"]),
             helper.make_node("ConvTranspose", ["h2", "w2"], ["h3"], strides=[2, 2]),
             helper.make_node("Flatten", ["h3"], ["h4"]),
             helper.make_node("Gemm", ["h4", "g", "c"], ["h5"], alpha=0.5),
             helper.make_node("MatMul", ["h5", "m"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    loaded = ox.load(model)
    for batch in (1, 3):
        x = r(batch, 3, 8, 8, **f32, seed=batch)
        np.testing.assert_allclose(loaded(x), session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_onnx_conv_same_padding_of_unknown_dims_converts_per_input_shape():
    w = r(2, 3, 3, 3, dtype="float32")
    model = model_of("Conv", [r(1, 3, 8, 8, dtype="float32"), w], dict(auto_pad="SAME_UPPER"), 11, ("x1",))
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    graph = ox.load(model)
    assert isinstance(graph, ox.DynamicModel) and "auto_pad SAME_UPPER" in graph.reason
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for h in (8, 5):
        x = r(1, 3, h, 8, dtype="float32")
        np.testing.assert_allclose(graph(x), session.run(None, {"x0": x})[0], rtol=1e-5, atol=1e-5)


# -- speed -------------------------------------------------------------------------------------

def test_a_resnet_conv_takes_milliseconds():
    x, w, b = r(1, 64, 56, 56, dtype="float32"), r(64, 64, 3, 3, dtype="float32", seed=1), np.zeros(64, np.float32)
    conv(x, w, b, pads=[1, 1, 1, 1])
    start = time.perf_counter()
    for _ in range(5):
        conv(x, w, b, pads=[1, 1, 1, 1])
    assert (time.perf_counter() - start) / 5 < 0.25  # a few ms; generous for a busy machine


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m, n", [(1, 7), (5, 1), (1, 1)])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_one_row_or_column_products_take_gemv_and_agree(m, n, trans_a, trans_b, dtype):
    # batch-1 fully connected layers: OpforgeGemm forwards these to gemv
    k = 9
    a = r(*((k, m) if trans_a else (m, k)), dtype=dtype, seed=1)
    b = r(*((n, k) if trans_b else (k, n)), dtype=dtype, seed=2)
    c = r(n, dtype=dtype, seed=3)
    want = (a.T if trans_a else a) @ (b.T if trans_b else b)
    got = gemm(a, b, c, alpha=0.5, beta=2.0, trans_a=trans_a, trans_b=trans_b)
    np.testing.assert_allclose(got, 0.5 * want + 2.0 * c, **tolerance(dtype))
    if not trans_a and not trans_b:
        np.testing.assert_allclose(matmul(a, b), want, **tolerance(dtype))
    assert select_kernel(gemm, [TensorSpec.of(a), TensorSpec.of(b), TensorSpec.of(c)]).name.startswith("Gemm<")
