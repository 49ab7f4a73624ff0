"""conv's direct paths (depthwise 2-d, 1 x 1 without im2col, im2col on the pool) against its NumPy reference."""
import numpy as np
import pytest

import opforge
from opforge import ops
from opforge.builtins.conv import conv_reference
from opforge.runtime import blas

pytestmark = pytest.mark.skipif(not blas.available(), reason="conv's native kernel needs OpenBLAS")


def _check(x_shape, w_shape, dtype="float32", threads=None, **attrs):
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    geometry = {"strides": [], "pads": [], "dilations": [], "group": 1, **attrs}
    expected = conv_reference(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **geometry)
    before = opforge.get_num_threads()
    try:
        if threads:
            opforge.set_num_threads(threads)
        got = ops.conv(x, w, b, **attrs)
    finally:
        opforge.set_num_threads(before)
    assert got.dtype == np.dtype(dtype) and got.shape == expected.shape
    tolerance = 1e-4 if dtype == "float32" else 1e-11
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


DEPTHWISE = [  # x shape, w shape, attributes
    ((1, 8, 7, 7), (8, 1, 3, 3), dict(group=8, pads=[1, 1, 1, 1])),
    ((2, 6, 14, 13), (6, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1])),
    ((1, 5, 12, 11), (5, 1, 3, 3), dict(group=5, strides=[2, 2], pads=[1, 1, 1, 1])),   # odd first column
    ((1, 5, 12, 11), (5, 1, 3, 3), dict(group=5, strides=[2, 2], pads=[0, 0, 0, 0])),   # even first column
    ((1, 4, 17, 16), (4, 1, 5, 5), dict(group=4, strides=[3, 2], pads=[2, 1, 0, 2])),
    ((1, 4, 15, 15), (4, 1, 3, 3), dict(group=4, dilations=[2, 3], pads=[2, 3, 2, 3])),
    ((1, 3, 9, 10), (3, 1, 3, 5), dict(group=3, strides=[1, 3], pads=[4, 0, 1, 4])),  # pads wider than the kernel
    ((1, 3, 6, 6), (3, 1, 1, 1), dict(group=3)),
    ((1, 3, 1, 40), (3, 1, 1, 3), dict(group=3, pads=[0, 1, 0, 1])),
    ((2, 4, 8, 9), (12, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),   # three outputs per channel
    ((1, 2, 8, 9), (12, 1, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),   # six: the gemm path
    ((1, 1, 9, 9), (2, 1, 3, 3), dict(pads=[1, 1, 1, 1])),             # one input channel, group 1
    ((2, 6, 9), (6, 1, 3), dict(group=6, pads=[1, 1], strides=[2])),  # 1-d: the generic taps
    ((1, 4, 5, 6, 7), (4, 1, 3, 3, 3), dict(group=4, pads=[1] * 6)),  # 3-d
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("x_shape,w_shape,attrs", DEPTHWISE)
def test_depthwise_matches_the_reference(x_shape, w_shape, attrs, dtype):
    _check(x_shape, w_shape, dtype, **attrs)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_depthwise_and_im2col_agree_on_any_thread_count(threads):
    _check((2, 64, 20, 20), (64, 1, 3, 3), threads=threads, group=64, pads=[1, 1, 1, 1])
    _check((2, 64, 20, 20), (64, 1, 3, 3), threads=threads, group=64, strides=[2, 2], pads=[1, 1, 1, 1])
    _check((2, 48, 20, 20), (16, 12, 3, 3), threads=threads, group=4, pads=[1, 1, 1, 1])
    _check((1, 96, 13, 13), (32, 96, 3, 3), threads=threads, strides=[2, 2])


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((2, 12, 7, 9), (8, 12, 1, 1), {}),
    ((1, 12, 7, 9), (8, 3, 1, 1), dict(group=4)),
    ((1, 6, 7, 9), (4, 6, 1, 1), dict(strides=[2, 2])),
    ((1, 6, 7, 9), (4, 6, 1, 1), dict(pads=[1, 0, 0, 1])),
])
def test_one_by_one(x_shape, w_shape, attrs):
    _check(x_shape, w_shape, **attrs)


@pytest.mark.parametrize("threads", [1, 2])
def test_pooling_and_batch_norm_on_the_pool_match_their_references(threads):
    x = np.random.default_rng(5).standard_normal((2, 96, 15, 17)).astype(np.float32)
    before = opforge.get_num_threads()
    try:
        opforge.set_num_threads(threads)
        for name, attrs in (("max_pool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
                            ("average_pool", dict(kernel_shape=[3, 3], strides=[1, 2], pads=[1, 0, 1, 0]))):
            op = opforge.lookup(name)
            np.testing.assert_allclose(op(x, **attrs), op.reference_kernel.fn(x, **op.bind([x], attrs)[1]),
                                       rtol=1e-6, atol=1e-6)
        params = [np.random.default_rng(k).uniform(0.5, 1.5, 96).astype(np.float32) for k in range(4)]
        reference = opforge.lookup("batch_norm").reference_kernel.fn(x, *params, epsilon=1e-5)
        np.testing.assert_allclose(ops.batch_norm(x, *params), reference, rtol=1e-5, atol=1e-5)
    finally:
        opforge.set_num_threads(before)
