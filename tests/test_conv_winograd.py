"""conv's Winograd F(2 x 2, 3 x 3) path: which shapes take it, its accuracy against the float64
reference, its bits on any thread count, and conv's gradient around it.

The path is compiled in or out by the macro OPFORGE_CONV_WINOGRAD (0 never, 1 where it pays: the
built-in, 2 wherever it applies); copies of conv's kernel built with 0 and 2 tell which path
ops.conv took: its bits equal one of them."""
import numpy as np
import pytest

import opforge
from opforge import ops
from opforge.builtins import conv as conv_module
from opforge.builtins.common import FLOATS
from opforge.builtins.conv import conv_reference
from opforge.runtime import blas
from opforge.testing import gradcheck
from test_conv_tasks import normal, on_threads

pytestmark = pytest.mark.skipif(not blas.available(), reason="conv's native kernel needs OpenBLAS")

# The bound tested for float32: |y - reference| <= FLOAT32_BOUND * (conv of |x| by |w|, + |b|), per
# element.  The worst measured on N(0, 1) data over the shapes below and resnet50's and squeezenet's
# 3 x 3 layers was 1.9e-7 (im2col: 3.2e-7); float64's was 3.5e-16, held to 1e-15 the same way.
FLOAT32_BOUND, FLOAT64_BOUND = 2e-6, 1e-15

_variants = {}


def conv_compiled_with(winograd):
    """conv's kernel, built with OPFORGE_CONV_WINOGRAD=winograd, as an op of its own."""
    if winograd not in _variants:
        op = opforge.op(f"winograd_test::conv_{winograd}(Tensor x, Tensor w, Tensor b, *, "
                        f"{conv_module.GEOMETRY_ATTRS}) -> Tensor y", traits=["no_side_effect"])
        op.infer(lambda x, w, b, **attrs: conv_module.conv_infer(x, w, b, **attrs))
        blas.requiring(op.kernel(function="Conv", dtypes={"x": FLOATS, "w": FLOATS, "b": FLOATS},
                                 code=conv_module.CONV, cflags=[f"-DOPFORGE_CONV_WINOGRAD={winograd}"]))
        _variants[winograd] = op
    return _variants[winograd]


def geometry(attrs):
    return {"strides": [], "pads": [], "dilations": [], "group": 1, **attrs}


def inputs(x_shape, w_shape, dtype="float32", seed=0):
    return normal(x_shape, seed, dtype), normal(w_shape, seed + 1, dtype), normal(w_shape[0], seed + 2, dtype)


def relative_error(y, x, w, b, attrs):
    """|y - reference| over conv(|x|, |w|) + |b|, the largest over y's elements."""
    wide = [a.astype(np.float64) for a in (x, w, b)]
    expected = conv_reference(*wide, **geometry(attrs))
    scale = conv_reference(*(np.abs(a) for a in wide), **geometry(attrs))
    return float(np.max(np.abs(y.astype(np.float64) - expected) / scale))


TAKE_IT = [  # x shape, w shape, attributes: shapes the built-in sends down the Winograd path
    ((1, 16, 12, 12), (16, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((1, 64, 30, 30), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1])),        # blocks cut inside rows of tiles
    ((2, 8, 11, 13), (12, 8, 3, 3), {}),                                # pads 0, odd output (9 x 11)
    ((1, 12, 13, 10), (9, 12, 3, 3), dict(pads=[2, 0, 1, 3])),        # asymmetric pads, odd output rows
    ((3, 24, 17, 15), (40, 12, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),
    ((1, 48, 13, 13), (192, 48, 3, 3), dict(pads=[1, 1, 1, 1])),       # squeezenet's
]
PASS_BY = [  # below the thresholds or not a Winograd shape: the paths of before
    ((1, 512, 7, 7), (64, 512, 3, 3), dict(pads=[1, 1, 1, 1])),        # 16 tiles per image
    ((1, 3, 20, 20), (16, 3, 3, 3), dict(pads=[1, 1, 1, 1])),          # 3 input channels
    ((1, 16, 20, 20), (4, 16, 3, 3), dict(pads=[1, 1, 1, 1])),         # 4 output channels
    ((1, 16, 20, 20), (16, 16, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 16, 20, 20), (16, 16, 3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2])),
    ((1, 16, 20, 20), (16, 16, 5, 5), dict(pads=[2, 2, 2, 2])),
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", TAKE_IT)
def test_shapes_above_the_thresholds_take_the_winograd_path(x_shape, w_shape, attrs):
    x, w, b = inputs(x_shape, w_shape)
    y = ops.conv(x, w, b, **attrs)
    winograd = conv_compiled_with(2)(x, w, b, **attrs)
    im2col = conv_compiled_with(0)(x, w, b, **attrs)
    assert np.array_equal(y, winograd) and not np.array_equal(y, im2col)
    assert relative_error(y, x, w, b, attrs) <= FLOAT32_BOUND


@pytest.mark.parametrize("x_shape,w_shape,attrs", PASS_BY)
def test_other_shapes_keep_their_paths(x_shape, w_shape, attrs):
    x, w, b = inputs(x_shape, w_shape)
    y = ops.conv(x, w, b, **attrs)
    assert np.array_equal(y, conv_compiled_with(0)(x, w, b, **attrs))
    assert relative_error(y, x, w, b, attrs) <= FLOAT32_BOUND


EVERYWHERE = [  # the path forced (OPFORGE_CONV_WINOGRAD=2) on small and edge shapes
    ((1, 1, 3, 3), (1, 1, 3, 3), {}),                                   # one output, one tile
    ((1, 2, 4, 3), (3, 2, 3, 3), {}),                                   # a 2 x 1 output
    ((2, 3, 5, 6), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((1, 4, 6, 7), (5, 4, 3, 3), dict(pads=[0, 3, 2, 0])),             # pads on one side, wider than 1
    ((1, 6, 9, 9), (6, 2, 3, 3), dict(group=3, pads=[1, 0, 0, 1])),
    ((2, 5, 2, 2), (4, 5, 3, 3), dict(pads=[1, 1, 1, 1])),             # an image smaller than the kernel
    ((1, 16, 9, 11), (70, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("x_shape,w_shape,attrs", EVERYWHERE + TAKE_IT)
def test_winograd_matches_the_reference(x_shape, w_shape, attrs, dtype):
    x, w, b = inputs(x_shape, w_shape, dtype, seed=sum(x_shape))
    y = conv_compiled_with(2)(x, w, b, **attrs)
    assert y.dtype == np.dtype(dtype) and y.shape == conv_reference(x, w, b, **geometry(attrs)).shape
    assert relative_error(y, x, w, b, attrs) <= (FLOAT32_BOUND if dtype == "float32" else FLOAT64_BOUND)


def test_the_weights_are_transformed_on_every_call():
    x, w, b = inputs((1, 16, 12, 12), (16, 16, 3, 3))
    first = ops.conv(x, w, b, pads=[1, 1, 1, 1])
    w[:] = normal(w.shape, 99)  # the same buffer, other weights
    second = ops.conv(x, w, b, pads=[1, 1, 1, 1])
    assert not np.array_equal(first, second)
    assert relative_error(second, x, w, b, dict(pads=[1, 1, 1, 1])) <= FLOAT32_BOUND


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("x_shape,w_shape,attrs", TAKE_IT)
def test_winograd_gives_the_same_bits_on_any_thread_count(x_shape, w_shape, attrs, dtype):
    x, w, b = inputs(x_shape, w_shape, dtype, seed=7)
    y = {t: on_threads(t, lambda: ops.conv(x, w, b, **attrs)) for t in (1, 2, 3)}
    assert np.array_equal(y[1], y[2]) and np.array_equal(y[1], y[3])


def test_gradients_of_a_winograd_shape():
    # float64 finite differences through conv (its forward on the Winograd path) and its rule
    x, w, b = inputs((1, 8, 10, 10), (8, 8, 3, 3), "float64", seed=3)
    assert np.array_equal(ops.conv(x, w, b, pads=[1, 0, 1, 1]),
                          conv_compiled_with(2)(x, w, b, pads=[1, 0, 1, 1]))
    assert 0.0 <= gradcheck(ops.conv, x, w, b, pads=[1, 0, 1, 1]) < 1e-6
