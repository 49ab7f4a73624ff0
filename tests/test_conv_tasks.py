"""conv, conv_transpose and conv_weight_grad as tasks on opforge's pool (OpenBLAS serial inside them),
and reduce_sum / mean per ISA: the same bits on any thread count and ISA, and the NumPy references."""
import numpy as np
import pytest

import opforge
from opforge import ops
from opforge.builtins.conv import conv_reference, conv_weight_grad_reference
from opforge.builtins.conv_transpose import conv_transpose_reference
from opforge.runtime import blas, cpu

needs_blas = pytest.mark.skipif(not blas.available(), reason="the conv kernels need OpenBLAS")


def on_threads(threads, fn):
    before = opforge.get_num_threads()
    try:
        opforge.set_num_threads(threads)
        return fn()
    finally:
        opforge.set_num_threads(before)


def normal(shape, seed, dtype="float32"):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


CONV_CASES = [  # x shape, w shape, attributes: few images (channel parts), many (column blocks), groups, 1 x 1
    ((1, 16, 9, 11), (70, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((3, 8, 40, 36), (12, 8, 3, 3), dict(pads=[1, 0, 1, 2], strides=[1, 2])),
    ((2, 12, 10, 10), (9, 4, 3, 3), dict(group=3, dilations=[2, 1], pads=[2, 1, 2, 1])),
    ((2, 24, 30, 30), (40, 24, 1, 1), {}),
    ((1, 6, 50), (80, 6, 5), dict(pads=[2, 2])),
]


@needs_blas
@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES)
def test_conv_family_gives_the_same_bits_on_any_thread_count(x_shape, w_shape, attrs):
    x, w, b = normal(x_shape, 1), normal(w_shape, 2), normal(w_shape[0], 3)
    geometry = {"strides": [], "pads": [], "dilations": [], "group": 1, **attrs}
    y = {t: on_threads(t, lambda: ops.conv(x, w, b, **attrs)) for t in (1, 2, 3)}
    expected = conv_reference(*(a.astype(np.float64) for a in (x, w, b)), **geometry)
    np.testing.assert_allclose(y[1], expected, rtol=1e-4, atol=1e-4)
    assert np.array_equal(y[1], y[2]) and np.array_equal(y[1], y[3])

    kernel = list(w_shape[2:])
    dw = {t: on_threads(t, lambda: ops.conv_weight_grad(x, y[1], kernel_shape=kernel, **attrs)) for t in (1, 2, 3)}
    expected = conv_weight_grad_reference(x.astype(np.float64), y[1].astype(np.float64), kernel_shape=kernel,
                                          **geometry)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(dw[1] / scale, expected / scale, rtol=0, atol=1e-5)
    assert np.array_equal(dw[1], dw[2]) and np.array_equal(dw[1], dw[3])


TRANSPOSE_CASES = [  # x shape, w shape (C x M/group x kernel), attributes
    ((1, 16, 7, 7), (16, 40, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
    ((4, 8, 12, 10), (8, 6, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 6, 9, 9), (6, 5, 3, 3), dict(group=2, strides=[2, 1], dilations=[1, 2])),
    ((1, 10, 8, 8), (10, 64, 1, 1), {}),
]


@needs_blas
@pytest.mark.parametrize("x_shape,w_shape,attrs", TRANSPOSE_CASES)
def test_conv_transpose_gives_the_same_bits_on_any_thread_count(x_shape, w_shape, attrs):
    group = attrs.get("group", 1)
    x, w, b = normal(x_shape, 4), normal(w_shape, 5), normal(w_shape[1] * group, 6)
    geometry = {"strides": [], "pads": [], "dilations": [], "group": 1, "output_padding": [], **attrs}
    y = {t: on_threads(t, lambda: ops.conv_transpose(x, w, b, **attrs)) for t in (1, 2, 3)}
    expected = conv_transpose_reference(*(a.astype(np.float64) for a in (x, w, b)), **geometry)
    np.testing.assert_allclose(y[1], expected, rtol=1e-4, atol=1e-4)
    assert np.array_equal(y[1], y[2]) and np.array_equal(y[1], y[3])


@needs_blas
def test_conv_leaves_openblas_its_thread_count():
    handle = blas.load()
    x, w = normal((2, 32, 20, 20), 7), normal((32, 32, 3, 3), 8)

    def run():
        ops.conv(x, w, None, pads=[1, 1, 1, 1])
        ops.conv_weight_grad(x, x, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        ops.conv_transpose(x, w, None, pads=[1, 1, 1, 1])
        return handle.scipy_openblas_get_num_threads()

    before = handle.scipy_openblas_get_num_threads()
    try:
        blas.set_num_threads(2)  # OpenBLAS given threads of its own: serial only while the tasks ran
        assert on_threads(2, run) == 2
        blas.set_num_threads(1)  # (as opforge loads it)
        assert on_threads(2, run) == 1 and on_threads(1, run) == 1
    finally:
        blas.set_num_threads(before)


@needs_blas
def test_conv_weight_grad_of_an_empty_batch_is_zero():
    x, dy = np.zeros((0, 4, 6, 6), np.float32), np.zeros((0, 5, 6, 6), np.float32)
    dw = ops.conv_weight_grad(x, dy, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    assert dw.shape == (5, 4, 3, 3) and not dw.any()


# -- reduce_sum / mean: every ISA variant adds in the same order ---------------------------------

@pytest.fixture
def isa_cap():
    yield opforge.set_isa_cap
    opforge.set_isa_cap(None)


REDUCTIONS = [((300, 1037), [-1]), ((1037, 300), [0]), ((5, 77, 3001), [1]), ((3, 40, 50), [0, 2]), ((70000,), [])]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("shape,axes", REDUCTIONS)
def test_reductions_give_the_same_bits_on_every_isa(isa_cap, shape, axes, dtype):
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    isas = [isa for isa in ("generic", "avx2", "avx512") if cpu.cpu_features()[isa]]
    results = {}
    for isa in isas:
        isa_cap(isa)
        results[isa] = [ops.reduce_sum(x, axes=axes)] + ([ops.mean(x, axes=axes)] if dtype.startswith("float") else [])
    for isa in isas:
        for got, want in zip(results[isa], results[isas[0]]):
            assert got.dtype == want.dtype and np.array_equal(got, want), isa
    expected = np.sum(x.astype(np.float64 if dtype.startswith("float") else x.dtype), axis=tuple(axes) or None)
    tolerance = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(results[isas[0]][0], expected, rtol=tolerance, atol=tolerance * np.abs(x).max())


def test_outer_axis_sums_are_pairwise_accurate():
    # 1 + 2^-24 ... summed down 2^16 rows: a running float32 sum would lose them; pairs keep them
    x = np.full((1 << 16, 40), 1.0 + 2.0 ** -20, np.float32)
    got = on_threads(1, lambda: ops.reduce_sum(x, axes=[0]))
    exact = float(np.float64(x[0, 0]) * x.shape[0])
    assert np.all(np.abs(got.astype(np.float64) - exact) <= 2 ** -24 * exact * 2)
    assert np.array_equal(got, on_threads(2, lambda: ops.reduce_sum(x, axes=[0])))


def test_isa_variants_are_registered():
    names = {kernel.isa for kernel in opforge.lookup("reduce_sum").kernels if kernel.device == "cpu"}
    assert {"avx2", "avx512"} <= {cpu.normalize_isa(n) for n in names if n}
    names = {kernel.isa for kernel in opforge.lookup("mean").kernels if kernel.device == "cpu"}
    assert {"avx2", "avx512"} <= {cpu.normalize_isa(n) for n in names if n}


@needs_blas
@pytest.mark.parametrize("threads", [1, 2])
def test_empty_batches_and_channels(threads):
    w, b = normal((5, 4, 3, 3), 9), normal(5, 10)
    y = on_threads(threads, lambda: ops.conv(np.zeros((0, 4, 6, 6), np.float32), w, b, pads=[1, 1, 1, 1]))
    assert y.shape == (0, 5, 6, 6)
    wt = normal((4, 5, 3, 3), 11)
    y = on_threads(threads, lambda: ops.conv_transpose(np.zeros((0, 4, 6, 6), np.float32), wt, b))
    assert y.shape == (0, 5, 8, 8)
    # no input channels: y is the bias
    y = on_threads(threads, lambda: ops.conv(np.zeros((2, 0, 6, 6), np.float32), np.zeros((5, 0, 3, 3), np.float32),
                                             b, pads=[1, 1, 1, 1]))
    np.testing.assert_array_equal(y, np.broadcast_to(b[:, None, None], (2, 5, 6, 6)))


PRODUCTS = [  # op, input shapes (None: absent), attributes
    ("matmul", [(256, 300), (300, 200)], {}),  # more rows than columns: cut by rows
    ("matmul", [(96, 400), (400, 520)], {}),  # cut by columns
    ("matmul", [(6, 64, 48), (6, 48, 40)], {}),  # small batch entries: a group of them per task
    ("matmul", [(3, 200, 160), (1, 160, 300)], {}),  # each large entry cut
    ("gemm", [(300, 160), (300, 170), (170,)], {"trans_a": True, "alpha": 0.5}),
    ("gemm", [(160, 300), (500, 300), None], {"trans_b": True}),
    # lengths just past a multiple of 16: no block may be one wide (gemv adds in another order)
    ("gemm", [(33, 8000), (8000, 33), None], {}),
    ("gemm", [(8000, 65), (65, 8000), None], {"trans_a": True, "trans_b": True}),
    ("matmul", [(33, 8000), (8000, 32)], {}),
    ("matmul", [(2, 3, 33, 8000), (2, 3, 8000, 33)], {}),
    ("matmul", [(5, 16, 40000), (5, 40000, 16)], {}),  # entries too narrow to cut: a group per task
    # one row or one column of output (gemv), each layout, lengths past a multiple of 16
    ("gemm", [(1, 3000), (4001, 3000), (4001,)], {"trans_b": True}),  # a batch-1 fully connected layer
    ("gemm", [(1, 3000), (3000, 4001), None], {}),
    ("gemm", [(3000, 1), (3000, 4001), None], {"trans_a": True}),
    ("matmul", [(4001, 3000), (3000, 1)], {}),
    ("gemm", [(3000, 4001), (1, 3000), None], {"trans_a": True, "trans_b": True}),
]


@needs_blas
@pytest.mark.parametrize("name,shapes,attrs", PRODUCTS)
def test_products_on_the_pool_give_the_same_bits_on_any_thread_count(name, shapes, attrs):
    inputs = [None if s is None else normal(s, k) for k, s in enumerate(shapes)]
    op = getattr(ops, name)
    y = {t: on_threads(t, lambda: op(*inputs, **attrs)) for t in (1, 2, 3)}
    wide = op(*[None if x is None else x.astype(np.float64) for x in inputs], **attrs)
    np.testing.assert_allclose(y[1], wide, rtol=1e-4, atol=1e-3)
    if blas.core_name() in blas.CUT_INVARIANT_CORES:
        assert np.array_equal(y[1], y[2]) and np.array_equal(y[1], y[3])
    else:  # OpenBLAS's Haswell kernels add a block's edge tiles in another order: the cuts agree to rounding
        for t in (2, 3):
            np.testing.assert_allclose(y[t], y[1], rtol=2e-6, atol=2e-6 * float(np.abs(wide).max()))


@needs_blas
@pytest.mark.parametrize("name,shapes,attrs", [
    # k <= 48: OpenBLAS has another gemv for up to 16384 outputs, which adds otherwise (not cut)
    ("matmul", [(1, 48), (48, 200000)], {}),
    ("gemm", [(48, 1), (48, 200000), None], {"trans_a": True}),
    ("matmul", [(1, 64), (64, 200000)], {}),  # k >= 64: cut, each block the same gemv as the whole
])
def test_vector_products_give_the_same_bits_on_many_threads(name, shapes, attrs):
    inputs = [None if s is None else normal(s, k) for k, s in enumerate(shapes)]
    op = getattr(ops, name)
    one, many = on_threads(1, lambda: op(*inputs, **attrs)), on_threads(16, lambda: op(*inputs, **attrs))
    assert np.array_equal(one, many)
