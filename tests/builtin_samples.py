"""Sample calls of every built-in op, in one place.

``SAMPLES`` maps each built-in op's name to one or more ``Sample``s: the
positional tensor inputs (NumPy arrays, ``None`` for an absent ``Tensor?``
input; several arrays for the variadic ``concat`` and ``sum``), the
attributes by name, and which inputs a gradient check may vary.  Test files
run them through opforge itself (tests/test_builtin_samples.py), PyTorch's
``torch.library.opcheck`` and JAX's ``check_grads``, so every sample is

* small (a few dozen elements) and deterministic (one seeded
  ``np.random.default_rng`` per array);
* float64 where the op takes floats, so finite differences are meaningful;
* valid for the op's check, and for a gradient op consistent with its
  forward op (``dy`` shaped as the forward output, ``indices`` as topk
  returns them, ...);
* away from kinks and ties where the op has a gradient rule: relu / abs /
  leaky_relu inputs off 0, clip and hard_sigmoid inputs off their corners,
  maximum / minimum operands apart, max_pool and topk inputs without equal
  values, sqrt / log / pow bases positive, div denominators off 0.

``differentiable`` lists the inputs whose gradient the op's rule computes:
floating-point inputs only, and not those the rule gives no gradient
(``None``): shape donors (``slice_grad``'s x, ``gather_grad``'s data), masks
(``relu_grad``'s y), sizes (``shape``, ``dim``).  Their derivative is zero
at the sample, so varying them would test nothing.  It is ``()`` for ops
without a gradient rule, and for a sample a gradient check should skip
(``note`` says why: a float32 output is too coarse for finite differences).

``reorder`` is the one built-in that cannot run eagerly: blocked layouts
exist only inside graphs, so an eager call is refused (``GRAPH_ONLY`` says
so); run its sample inside ``opforge.trace``.
"""
from __future__ import annotations

import copy
import importlib
import pkgutil
from dataclasses import dataclass, field

import numpy as np

import opforge
from opforge.operator import Op


# eq=False: arrays do not compare as one bool, and a dict is not hashable; samples compare (and hash) by identity.
@dataclass(frozen=True, eq=False)
class Sample:
    args: tuple  # NumPy arrays (tensor inputs, None for an absent optional input) in the op's positional order
    attrs: dict = field(default_factory=dict)  # attribute values by name
    differentiable: tuple[int, ...] = ()  # indices of args a gradient check may vary; () without a gradient rule
    note: str = ""  # why a sample is shaped as it is, when not obvious


#: Built-ins an eager call refuses, and why: their samples run inside a traced graph.
GRAPH_ONLY = {
    "reorder": "an eager call would produce (or start from) the nchw16c layout, which exists only inside graphs",
}


# -- array helpers (each array comes from its own seeded generator) ------------------

def rng(seed):
    return np.random.default_rng(seed)


def normal(*shape, seed=0, scale=1.0):
    """Standard normal float64 values (times ``scale``)."""
    return np.asarray(rng(seed).standard_normal(shape) * scale)  # (an array when 0-d too)


def positive(*shape, seed=0):
    """float64 values in [0.5, 1.5): bases of sqrt, log and pow, variances."""
    return np.asarray(rng(seed).random(shape) + 0.5)


def away_from(x, *points, margin=0.1):
    """x with every value closer than ``margin`` to one of ``points`` (kinks) moved ``margin`` further away."""
    x = np.array(x, dtype=np.float64)
    for p in points:
        d = x - p
        near = np.abs(d) < margin
        x[near] = p + np.where(d[near] >= 0, 1.0, -1.0) * (margin + np.abs(d[near]))
    return x


def distinct(*shape, seed=0, step=0.25):
    """float64 values, shuffled, at least ``step / 4`` apart and none within ``step / 4`` of 0: no ties (max_pool,
    topk) that a finite-difference step could flip."""
    n = int(np.prod(shape))
    g = rng(seed)
    grid = (np.arange(n) - (n - 1) / 2) * step  # evenly spaced, centred on 0
    grid = np.where(np.abs(grid) < step / 2, step / 2, grid)  # (an odd n would put one value on 0)
    values = grid + g.uniform(-step / 8, step / 8, n)
    return values[g.permutation(n)].reshape(shape)


def apart_from(b, shape, seed=0, margin=0.3):
    """An array of ``shape`` (broadcasting with b) that differs from b by more than ``margin`` everywhere."""
    g = rng(seed)
    offset = (margin + g.random(shape)) * g.choice([-1.0, 1.0], size=shape)
    return np.broadcast_to(b, np.broadcast_shapes(shape, np.shape(b))) + offset


def small_ints(*shape, seed=0, low=-2, high=3, dtype=np.float64):
    """Small integers (as ``dtype``), so that comparisons meet ties."""
    return rng(seed).integers(low, high, size=shape).astype(dtype)


def op_named(name) -> Op:
    op = opforge.registry.lookup(name)
    if op is None:
        raise KeyError(f"no op named {name!r} is registered")
    return op


def output_shape(name, *args, index=0, **attrs):
    """The shape of op ``name``'s output ``index`` for these inputs (its inference): a gradient op's dy."""
    out = op_named(name).infer(*args, **attrs)
    return tuple((out[index] if isinstance(out, tuple) else out).shape)


def sample(*args, differentiable=(), note="", **attrs) -> Sample:
    return Sample(tuple(args), attrs, tuple(differentiable), note)


SAMPLES: dict[str, list[Sample]] = {}


def put(name, *samples):
    SAMPLES.setdefault(name, []).extend(samples)


# -- elementwise: unary --------------------------------------------------------------

put("neg", sample(normal(3, 4, seed=1), differentiable=[0]))
put("abs", sample(away_from(normal(3, 4, seed=2), 0), differentiable=[0], note="inputs off abs's kink at 0"))
put("sqrt", sample(positive(3, 4, seed=3), differentiable=[0]))
put("log", sample(positive(3, 4, seed=4), differentiable=[0]))
put("exp", sample(normal(3, 4, seed=5), differentiable=[0]))
put("tanh", sample(normal(3, 4, seed=6), differentiable=[0]))
put("sigmoid", sample(normal(3, 4, seed=7, scale=2.0), differentiable=[0]))
put("erf", sample(normal(3, 4, seed=8), differentiable=[0]))
put("gelu",
    sample(normal(3, 4, seed=9, scale=2.0), differentiable=[0]),
    sample(normal(3, 4, seed=10, scale=2.0), differentiable=[0], approximate="tanh"))

# Activations with kinks: inputs kept off them (finite differences across a kink are meaningless).
put("relu", sample(away_from(normal(3, 4, seed=11), 0), differentiable=[0]))
put("leaky_relu",
    sample(away_from(normal(3, 4, seed=12), 0), differentiable=[0], alpha=0.25),
    sample(away_from(normal(2, 5, seed=13), 0), differentiable=[0],
           note="the default alpha (0.01) is not a float32 value: the kernel receives it rounded"))
put("hard_sigmoid",
    sample(away_from(normal(3, 4, seed=14, scale=4.0), -2.0, 2.0), differentiable=[0], alpha=0.25, beta=0.5,
           note="alpha * x + beta reaches 0 and 1 at x = -2 and 2: inputs kept off those corners"),
    sample(away_from(normal(2, 6, seed=15, scale=4.0), -2.5, 2.5), differentiable=[0],
           note="defaults alpha 0.2, beta 0.5: corners at x = -2.5 and 2.5"))
put("clip",
    sample(away_from(normal(3, 4, seed=16, scale=2.0), -1.0, 0.5), differentiable=[0], min=-1.0, max=0.5,
           note="inputs off the bounds, where the gradient jumps"),
    sample(away_from(normal(3, 4, seed=17), 0.25), differentiable=[0], min=0.25))
put("cast",
    sample(normal(3, 4, seed=18), differentiable=[0], dtype="float64",
           note="float64 to float64: a gradient check stays in float64"),
    sample(normal(3, 4, seed=19), dtype="float32",
           note="float64 to float32: differentiable in principle, but finite differences of a float32 output are "
                "too coarse to check"),
    sample(normal(3, 4, seed=20, scale=3.0), dtype="int32", note="to an integer: no gradient"),
    sample(small_ints(2, 3, seed=21, low=-5, high=6, dtype=np.int64), dtype="float64",
           note="from an integer: no gradient"))

# -- elementwise: binary, with NumPy broadcasting -------------------------------------

put("add",
    sample(normal(3, 4, seed=22), normal(3, 4, seed=23), differentiable=[0, 1]),
    sample(normal(2, 3, 4, seed=24), normal(3, 1, seed=25), differentiable=[0, 1]),
    sample(normal(3, 1, seed=26), normal(1, 4, seed=27), differentiable=[0, 1], note="both operands broadcast"))
put("sub",
    sample(normal(2, 3, 4, seed=28), normal(4, seed=29), differentiable=[0, 1]),
    sample(normal(1, 4, seed=30), normal(3, 4, seed=31), differentiable=[0, 1]))
put("mul",
    sample(normal(3, 4, seed=32), normal(3, 4, seed=33), differentiable=[0, 1]),
    sample(normal(3, 1, seed=34), normal(2, 1, 4, seed=35), differentiable=[0, 1]),
    sample(normal(3, 4, seed=36), normal(seed=37), differentiable=[0, 1], note="b is 0-d"))
put("div",
    sample(normal(2, 3, 4, seed=38), positive(3, 1, seed=39), differentiable=[0, 1]),
    sample(normal(4, seed=40), -positive(3, 4, seed=41), differentiable=[0, 1], note="denominators off 0"))
put("pow",
    sample(positive(3, 4, seed=42), normal(3, 4, seed=43), differentiable=[0, 1], note="positive bases"),
    sample(positive(3, 1, seed=44), normal(4, seed=45), differentiable=[0, 1]))
put("maximum",
    sample(apart_from(normal(4, seed=46), (3, 4), seed=47), normal(4, seed=46), differentiable=[0, 1],
           note="a and b apart everywhere: no ties, where the gradient splits"),
    sample(normal(3, 1, seed=48), apart_from(normal(3, 1, seed=48), (2, 1, 4), seed=49), differentiable=[0, 1]))
put("minimum",
    sample(apart_from(normal(3, 1, seed=50), (3, 4), seed=51), normal(3, 1, seed=50), differentiable=[0, 1]),
    sample(normal(4, seed=52), apart_from(normal(4, seed=52), (2, 4), seed=53), differentiable=[0, 1]))
put("mod",
    sample(normal(3, 4, seed=54, scale=3.0), away_from(normal(3, 4, seed=55, scale=2.0), 0, margin=0.5),
           note="floats; divisors off 0 (where the result is NaN); signs mixed for the floor rule"),
    sample(normal(3, 4, seed=56, scale=3.0), away_from(normal(4, seed=57, scale=2.0), 0, margin=0.5), fmod=True),
    sample(small_ints(3, 4, seed=58, low=-9, high=10, dtype=np.int64),
           np.array([3, -4, 0, 5], np.int64), note="integers: signs mixed, and a divisor of 0 (gives 0)"),
    sample(small_ints(2, 5, seed=59, low=-9, high=10, dtype=np.int32),
           np.array([[2], [-3]], np.int32), fmod=True))

# Comparisons: small integers, so that every comparison meets ties; no gradient.
for _name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
    put(_name,
        sample(small_ints(3, 4, seed=60), small_ints(4, seed=61)),
        sample(small_ints(2, 3, seed=62, dtype=np.int64), small_ints(2, 1, seed=63, dtype=np.int64)))

put("where",
    sample(normal(3, 4, seed=64) > 0, normal(3, 4, seed=65), normal(4, seed=66), differentiable=[1, 2],
           note="condition is bool: no gradient"),
    sample(normal(4, seed=67) > 0, normal(3, 1, seed=68), normal(seed=69), differentiable=[1, 2]))
put("sum",
    sample(normal(2, 3, 4, seed=70), normal(3, 1, seed=71), normal(4, seed=72), differentiable=[0, 1, 2],
           note="variadic: three inputs, broadcast"),
    sample(normal(3, 4, seed=73), differentiable=[0], note="variadic: one input"))

# -- reductions and softmax ------------------------------------------------------------

put("reduce_sum",
    sample(normal(2, 3, 4, seed=74), differentiable=[0]),
    sample(normal(2, 3, 4, seed=75), differentiable=[0], axes=[1]),
    sample(normal(2, 3, 4, seed=76), differentiable=[0], axes=[0, -1], keep_dims=True),
    sample(normal(2, 3, seed=77), differentiable=[0], keep_dims=True))
put("mean",
    sample(normal(2, 3, 4, seed=78), differentiable=[0]),
    sample(normal(2, 3, 4, seed=79), differentiable=[0], axes=[0, -1], keep_dims=True),
    sample(normal(2, 3, 4, seed=80), differentiable=[0], axes=[1]))
put("softmax",
    sample(normal(2, 3, 4, seed=81), differentiable=[0]),
    sample(normal(2, 3, 4, seed=82), differentiable=[0], axis=0),
    sample(normal(2, 3, 4, seed=83), differentiable=[0], axis=1))

# -- shapes, sizes and copies ------------------------------------------------------------

put("reshape", sample(normal(3, 4, seed=84), differentiable=[0], shape=[2, -1, 3]))
put("transpose",
    sample(normal(2, 3, 4, seed=85), differentiable=[0], note="empty perm: the last two axes swapped"),
    sample(normal(2, 3, 4, seed=86), differentiable=[0], perm=[2, 0, -2]))
put("squeeze", sample(normal(1, 3, 1, seed=87), differentiable=[0], axes=[0, -1]))
put("unsqueeze", sample(normal(3, 2, seed=88), differentiable=[0], axes=[0, -2]))
put("expand",
    sample(normal(3, 1, seed=89), differentiable=[0], shape=[2, 1, 4], note="a 1 in shape keeps x's dim"))
put("tile", sample(normal(3, 2, seed=90), differentiable=[0], repeats=[2, 3]))
put("concat",
    sample(normal(2, 3, seed=91), normal(2, 1, seed=92), normal(2, 2, seed=93), differentiable=[0, 1, 2], axis=-1,
           note="variadic: three inputs"),
    sample(normal(1, 3, seed=94), normal(2, 3, seed=95), differentiable=[0, 1]))
put("shape",
    sample(normal(2, 3, 4, seed=96), note="a size: the rule gives x no gradient"),
    sample(normal(2, 3, 4, seed=97), start=-2),
    sample(normal(2, 3, 4, seed=98), start=1, end=-1))
put("dim",
    sample(normal(2, 3, seed=99), axis=1, note="a size: the rule gives x no gradient"),
    sample(normal(2, 3, seed=100), axis=-2, dtype="float64"))
put("constant_of_shape",
    sample(normal(1, seed=101), differentiable=[0], shape=[2, 3]),
    sample(np.array(7, np.int64), shape=[3], note="an integer, 0-d value"))

SLICE_ATTRS = {"starts": [1, -1], "ends": [3, 0], "axes": [0, 1], "steps": [1, -2]}
put("slice",
    sample(normal(4, 5, seed=102), differentiable=[0], **SLICE_ATTRS),
    sample(normal(3, 4, 2, seed=103), differentiable=[0], starts=[0, 1], ends=[100, -1],
           note="default axes and steps; an end past the dim is clamped"))
put("slice_grad",
    sample(normal(*output_shape("slice", normal(4, 5), **SLICE_ATTRS), seed=104), normal(4, 5, seed=105),
           differentiable=[0], **SLICE_ATTRS, note="dy shaped as slice of x; x lends only its shape"))

GATHER_INDICES = np.array([[0, 3], [3, -1]], np.int64)
put("gather",
    sample(normal(2, 4, 3, seed=106), GATHER_INDICES, differentiable=[0], axis=1),
    sample(normal(5, 2, seed=107), np.array([4, 0, -2, 4], np.int32), differentiable=[0],
           note="int32 indices, one repeated"))
put("gather_grad",
    sample(normal(3, 3, seed=108), np.array([2, -1, 2], np.int64), normal(4, 3, seed=109), differentiable=[0],
           note="dy shaped as gather(data, indices); a repeated index adds up; data lends only its shape"),
    sample(normal(*output_shape("gather", normal(2, 4, 3), GATHER_INDICES, axis=1), seed=110), GATHER_INDICES,
           normal(2, 4, 3, seed=111), differentiable=[0], axis=1))

# gather_elements / scatter_elements: indices of data's rank, no larger than data on the other axes.
ELEMENT_INDICES = np.array([[2, -1, 0, 1], [0, 0, -3, 2]], np.int64)  # along axis 0 of a [3, 4] data
put("gather_elements",
    sample(normal(3, 4, seed=401), ELEMENT_INDICES, differentiable=[0], note="repeated and negative indices"),
    sample(normal(4, 5, seed=402), np.array([[4, 0], [-1, 3], [2, 2]], np.int32), differentiable=[0], axis=1,
           note="int32 indices smaller than data on axis 0"))
put("scatter_elements",
    sample(normal(3, 4, seed=403), np.array([[2, 0, 1, -1], [0, 1, 2, 0]], np.int64), normal(2, 4, seed=404),
           differentiable=[0, 2], note="no index repeated in a column: each update lands once"),
    sample(normal(3, 4, seed=405), ELEMENT_INDICES, normal(2, 4, seed=406), differentiable=[0, 2],
           reduction="add", note="a repeated index adds up"),
    sample(normal(4, 5, seed=407), np.array([[4, 0], [-1, 3]], np.int32), normal(2, 2, seed=408), axis=1,
           reduction="max", note="no gradient rule for max"),
    sample(np.arange(6, dtype=np.int64).reshape(2, 3), np.array([[1, 1, 0]], np.int64),
           np.array([[5, 6, 7]], np.int64), reduction="mul", note="integers"))

# gather_nd / scatter_nd: index tuples along indices' last axis.
ND_INDICES = np.array([[[1, -1], [0, 2]], [[1, 0], [1, -1]]], np.int64)  # 2 x 2 tuples into [2, 3, ...] data
put("gather_nd",
    sample(normal(2, 3, 4, seed=409), ND_INDICES, differentiable=[0], note="a repeated tuple adds up in the gradient"),
    sample(normal(2, 3, 2, seed=410), np.array([[[2], [0]], [[-1], [1]]], np.int32), differentiable=[0],
           batch_dims=1, note="int32 indices, one batch dim"))
put("scatter_nd",
    sample(normal(2, 3, 4, seed=411), np.array([[1, 2], [0, 0], [1, -3]], np.int64), normal(3, 4, seed=412),
           differentiable=[0, 2], note="tuples all distinct: each slice lands once"),
    sample(normal(2, 3, seed=413), ND_INDICES[0], normal(2, seed=414), differentiable=[0, 2], reduction="add"),
    sample(normal(2, 3, 2, seed=415), np.array([[[2], [2]], [[-1], [0]]], np.int32), normal(2, 2, 2, seed=416),
           reduction="min", batch_dims=1, note="no gradient rule for min"))

# topk: no equal values along the axis (a tie would let the picked index jump under a small change).
put("topk",
    sample(distinct(3, 5, 2, seed=112), differentiable=[0], k=2, axis=1, note="values all distinct: no ties"),
    sample(distinct(4, 3, seed=113), differentiable=[0], k=3, axis=0, largest=False),
    sample(distinct(2, 6, seed=114), differentiable=[0], k=4, sorted=False))
_topk_x = distinct(3, 5, 2, seed=115)
_topk_values, _topk_indices = op_named("topk").reference_kernel.fn(_topk_x, k=2, axis=1, largest=True, sorted=True)
put("topk_grad",
    sample(normal(*_topk_values.shape, seed=116), _topk_indices, _topk_x, axis=1,
           note="indices as topk(x, k=2, axis=1) returns them; x lends only its shape"))

# -- pooling, padding, resampling -----------------------------------------------------------

MAX_POOL_2D = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "ceil_mode": True}
MAX_POOL_1D = {"kernel_shape": [3], "dilations": [2], "pads": [2, 1]}
put("max_pool",
    sample(distinct(1, 2, 4, 5, seed=117), differentiable=[0], **MAX_POOL_2D,
           note="values all distinct: every window has one maximum"),
    sample(distinct(2, 1, 7, seed=118), differentiable=[0], **MAX_POOL_1D))
put("max_pool_with_indices",
    sample(distinct(1, 2, 4, 5, seed=119), differentiable=[0], **MAX_POOL_2D),
    sample(distinct(1, 2, 4, 3, seed=120), differentiable=[0], kernel_shape=[2, 2], pads=[1, 1, 0, 0],
           storage_order=1, note="storage_order 1: indices count the spatial dims column-major"))
put("max_pool_grad",
    sample(normal(*output_shape("max_pool", distinct(1, 2, 4, 5), **MAX_POOL_2D), seed=121),
           distinct(1, 2, 4, 5, seed=122), **MAX_POOL_2D, note="dy shaped as max_pool's output; x without ties"),
    sample(normal(*output_shape("max_pool", distinct(2, 1, 7), **MAX_POOL_1D), seed=123),
           distinct(2, 1, 7, seed=124), **MAX_POOL_1D))


def pool_indices(x, **attrs):
    """max_pool_with_indices's indices of x, from its reference."""
    from opforge.builtins.max_pool import max_pool_with_indices_reference

    return max_pool_with_indices_reference(x, **op_named("max_pool_with_indices").resolve_attrs(attrs))[1]


put("max_pool_with_indices_grad",
    sample(normal(*output_shape("max_pool", distinct(1, 2, 4, 5), **MAX_POOL_2D), seed=131),
           pool_indices(distinct(1, 2, 4, 5, seed=132), **MAX_POOL_2D), distinct(1, 2, 4, 5, seed=132),
           **MAX_POOL_2D, note="indices are max_pool_with_indices's of x"),
    sample(normal(*output_shape("max_pool", distinct(2, 1, 7), **MAX_POOL_1D), seed=133),
           pool_indices(distinct(2, 1, 7, seed=134), storage_order=1, **MAX_POOL_1D), distinct(2, 1, 7, seed=134),
           storage_order=1, **MAX_POOL_1D))

AVERAGE_POOL_2D = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "ceil_mode": True}
AVERAGE_POOL_1D = {"kernel_shape": [3], "dilations": [2], "pads": [2, 1], "count_include_pad": True}
put("average_pool",
    sample(normal(1, 2, 4, 5, seed=125), differentiable=[0], **AVERAGE_POOL_2D),
    sample(normal(2, 1, 7, seed=126), differentiable=[0], **AVERAGE_POOL_1D))
put("average_pool_grad",
    sample(normal(*output_shape("average_pool", normal(1, 2, 4, 5), **AVERAGE_POOL_2D), seed=127),
           normal(1, 2, 4, 5, seed=128), **AVERAGE_POOL_2D, note="dy shaped as average_pool's output"),
    sample(normal(*output_shape("average_pool", normal(2, 1, 7), **AVERAGE_POOL_1D), seed=129),
           normal(2, 1, 7, seed=130), **AVERAGE_POOL_1D))
put("global_average_pool",
    sample(normal(2, 3, 2, 2, seed=131), differentiable=[0]),
    sample(normal(2, 3, 5, seed=132), differentiable=[0]))

PAD_MODES = [
    {"pads": [1, -1, 2, 2], "value": 0.5},  # constant; a negative pad crops
    {"pads": [2, 1, 1, 3], "mode": "reflect"},
    {"pads": [1, 0, 2, 1], "mode": "edge"},
    {"pads": [0, 3, 2, 1], "mode": "wrap"},
]
put("pad", *(sample(normal(3, 4, seed=133 + k), differentiable=[0], **attrs) for k, attrs in enumerate(PAD_MODES)))
put("pad_grad", *(sample(normal(*output_shape("pad", normal(3, 4), **attrs), seed=137 + k), normal(3, 4, seed=141 + k),
                         **attrs, note="dy shaped as pad's output")
                  for k, attrs in enumerate(PAD_MODES)))

RESIZES = [
    ((1, 1, 3, 4), {"scales": [1, 1, 2, 1.5]}),  # nearest (with a coordinate on .5: round_prefer_floor), half_pixel
    ((1, 1, 3, 4), {"scales": [1, 1, 2, 1.5], "mode": "linear"}),
    ((1, 1, 6, 5), {"sizes": [3, 7], "axes": [2, 3], "mode": "cubic", "antialias": True}),  # down, then up
    ((1, 1, 4, 5), {"scales": [1, 1, 1.5, 1.25], "mode": "linear",  # a roi reaching past x: extrapolated values
                    "coordinate_transformation_mode": "tf_crop_and_resize",
                    "roi": [0, 0, 0.25, 0.125, 1, 1, 0.875, 1.25]}),
]
put("resize", *(sample(normal(*shape, seed=145 + k), differentiable=[0], **attrs)
                for k, (shape, attrs) in enumerate(RESIZES)))
put("resize_grad", *(sample(normal(*output_shape("resize", normal(*shape), **attrs), seed=149 + k),
                            normal(*shape, seed=153 + k), **attrs, note="dy shaped as resize's output")
                     for k, (shape, attrs) in enumerate(RESIZES)))

# -- normalisation -------------------------------------------------------------------------

put("batch_norm",
    sample(normal(2, 3, 2, seed=157), normal(3, seed=158), normal(3, seed=159), normal(3, seed=160),
           positive(3, seed=161), differentiable=[0, 1, 2, 3, 4], epsilon=1e-3, note="variances positive"),
    sample(normal(1, 2, 2, 3, seed=162), normal(2, seed=163), normal(2, seed=164), normal(2, seed=165),
           positive(2, seed=166), differentiable=[0, 1, 2, 3, 4]))
put("layer_norm",
    sample(normal(2, 3, 4, seed=167), normal(3, 4, seed=168), normal(4, seed=169), differentiable=[0, 1, 2], axis=1,
           note="bias broadcast over the normalised dims"),
    sample(normal(2, 5, seed=170), normal(5, seed=171), None, differentiable=[0, 1], epsilon=1e-3,
           note="no bias (absent optional input)"))
put("lrn",
    sample(normal(2, 5, 3, seed=172), differentiable=[0], size=3, alpha=0.25, bias=1.5),
    sample(normal(1, 4, 2, 2, seed=173), differentiable=[0], size=2, alpha=0.5, beta=0.625,
           note="an even size: the window reaches one channel further after than before"))
put("lrn_grad",
    sample(normal(2, 5, 3, seed=174), normal(2, 5, 3, seed=175), size=3, alpha=0.25, bias=1.5),
    sample(normal(1, 4, 2, 2, seed=176), normal(1, 4, 2, 2, seed=177), size=2, alpha=0.5, beta=0.625))

# -- linear algebra and convolution ---------------------------------------------------------

put("matmul",
    sample(normal(3, 4, seed=178), normal(4, 5, seed=179), differentiable=[0, 1]),
    sample(normal(2, 3, 4, seed=180), normal(2, 4, 2, seed=181), differentiable=[0, 1]),
    sample(normal(2, 1, 3, 4, seed=182), normal(1, 3, 4, 2, seed=183), differentiable=[0, 1],
           note="batch dims of 1 broadcast"))
put("gemm",
    sample(normal(3, 4, seed=184), normal(4, 5, seed=185), normal(5, seed=186), differentiable=[0, 1, 2],
           alpha=0.5, beta=2.0),
    sample(normal(4, 3, seed=187), normal(5, 4, seed=188), normal(3, 1, seed=189), differentiable=[0, 1, 2],
           trans_a=True, trans_b=True, beta=-1.5),
    sample(normal(4, 3, seed=190), normal(4, 5, seed=191), None, differentiable=[0, 1], trans_a=True,
           note="no c (absent optional input)"))

CONV_GROUPED = {"strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2], "group": 2}
CONV_1D = {"strides": [2]}
put("conv",
    sample(normal(1, 4, 3, 5, seed=192), normal(2, 2, 3, 2, seed=193), normal(2, seed=194),
           differentiable=[0, 1, 2], **CONV_GROUPED, note="grouped, strided, dilated, padded"),
    sample(normal(1, 2, 7, seed=195), normal(3, 2, 3, seed=196), None, differentiable=[0, 1], **CONV_1D,
           note="1-d, no bias"),
    sample(normal(1, 3, 4, 4, seed=197), normal(3, 1, 2, 2, seed=198), normal(3, seed=199), differentiable=[0, 1, 2],
           group=3, pads=[1, 1, 0, 0], note="depthwise (a channel per group)"),
    sample(normal(2, 3, 2, 3, seed=200), normal(4, 3, 1, 1, seed=201), None, differentiable=[0, 1],
           note="1 x 1, stride 1, no padding: the kernel multiplies x directly"))
put("conv_transpose",
    sample(normal(1, 4, 3, 4, seed=202), normal(4, 2, 2, 2, seed=203), normal(4, seed=204), differentiable=[0, 1, 2],
           strides=[2, 1], pads=[1, 0, 0, 1], group=2, output_padding=[1, 0]),
    sample(normal(2, 2, 4, seed=205), normal(2, 3, 3, seed=206), None, differentiable=[0, 1], strides=[3],
           dilations=[2], note="1-d, no bias"))
put("conv_weight_grad",
    sample(normal(1, 4, 3, 5, seed=207),
           normal(*output_shape("conv", normal(1, 4, 3, 5), normal(2, 2, 3, 2), None, **CONV_GROUPED), seed=208),
           kernel_shape=[3, 2], **CONV_GROUPED, note="dy shaped as conv's output for 2 x 2 x 3 x 2 weights"),
    sample(normal(1, 2, 7, seed=209), normal(*output_shape("conv", normal(1, 2, 7), normal(3, 2, 3), None, **CONV_1D),
                                            seed=210), kernel_shape=[3], **CONV_1D))

# -- gradient ops with rules of their own ---------------------------------------------------

put("relu_grad",
    sample(normal(3, 4, seed=211), np.maximum(away_from(normal(3, 4, seed=212), 0), 0), differentiable=[0],
           note="y is relu's output; the rule gives y (a mask) no gradient"))
put("leaky_relu_grad",
    sample(normal(3, 4, seed=213), away_from(normal(3, 4, seed=214), 0), differentiable=[0], alpha=0.25,
           note="x off 0; the rule gives x (a mask) no gradient"))

# -- quantization (no gradients: rounding is flat, integers do not vary) ----------------------

put("quantize_linear",
    sample(normal(3, 4, seed=901, scale=4.0), np.asarray(0.5), np.asarray(3, np.int8),
           note="per tensor; values past int8's range saturate"),
    sample(normal(2, 3, 4, seed=902, scale=100.0), positive(3, seed=903), np.array([0, 128, 255], np.uint8), axis=1,
           note="per axis: one scale and zero point per slice of axis 1"),
    sample(normal(2, 5, seed=904, scale=50.0), positive(2, 3, seed=905), np.full((2, 3), -7, np.int16), axis=1,
           block_size=2, note="blocked: each scale covers 2 elements along axis 1 (the last block holds 1)"))
put("dequantize_linear",
    sample(small_ints(3, 4, seed=906, low=0, high=256, dtype=np.uint8), np.asarray(0.25), np.asarray(128, np.uint8)),
    sample(small_ints(2, 3, seed=907, low=-128, high=128, dtype=np.int8), positive(3, seed=908),
           np.array([-1, 0, 5], np.int8), axis=-1, note="per axis along the last dim"),
    sample(small_ints(4, 2, seed=909, low=-1000, high=1000, dtype=np.int32), positive(2, 2, seed=910),
           np.zeros((2, 2), np.int32), axis=0, block_size=2, note="int32 (an accumulator), blocked along axis 0"))
put("dynamic_quantize_linear",
    sample(normal(3, 4, seed=911).astype(np.float32), note="float32 only (ONNX's DynamicQuantizeLinear)"))

# -- layouts (graphs only: see GRAPH_ONLY) -----------------------------------------------------

put("reorder",
    sample(normal(1, 20, 2, 3, seed=215), differentiable=[0], layout="nchw16c",
           note="graphs only; 20 channels pad to two blocks of 16. Round-trip it: reorder(.., 'ndarray')"))


# -- math: trigonometric family (inputs inside each function's domain, off its edges) -----------------

for _k, _name in enumerate(("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")):
    _x = rng(300 + _k).uniform(-0.9, 0.9, (3, 4))
    put(_name, sample(_x + 2.1 if _name == "acosh" else _x, differentiable=[0]))
del _k, _name, _x

put("cumsum",
    sample(normal(3, 4, seed=320), differentiable=[0], axis=1),
    sample(normal(2, 3, 4, seed=321), differentiable=[0], axis=0, exclusive=True, reverse=True),
    sample(normal(2, 5, seed=322), differentiable=[0], axis=-1, reverse=True),
    sample(small_ints(4, 3, seed=323, dtype=np.int32), axis=0, exclusive=True))
put("trilu",
    sample(normal(4, 5, seed=330), differentiable=[0]),
    sample(normal(2, 3, 3, seed=331), differentiable=[0], upper=False, k=-1),
    sample(small_ints(3, 4, seed=332, dtype=np.int64), upper=False, k=2))

# -- math: bitwise integer ops (no gradients) ---------------------------------------------------------

for _k, _name in enumerate(("bitwise_and", "bitwise_or", "bitwise_xor")):
    put(_name, sample(rng(340 + _k).integers(-100, 100, (3, 4)).astype(np.int32),
                      rng(350 + _k).integers(-100, 100, (4,)).astype(np.int32)),
        sample(rng(360 + _k).integers(0, 255, (2, 3), dtype=np.uint8), rng(370 + _k).integers(0, 255, (2, 1),
                                                                                               dtype=np.uint8)))
put("bitwise_not", sample(rng(380).integers(-100, 100, (3, 4)).astype(np.int64)),
    sample(rng(381).integers(0, 255, (5,), dtype=np.uint8)))
for _k, _name in enumerate(("left_shift", "right_shift")):
    put(_name, sample(rng(390 + _k).integers(-1000, 1000, (3, 4)).astype(np.int32),
                      rng(395 + _k).integers(-2, 35, (3, 4)).astype(np.int32),
                      note="counts outside [0, 32) included: ONNX BitShift's rule, 0 or the sign fill"),
        sample(rng(392 + _k).integers(0, 255, (4,), dtype=np.uint8), np.array(3, np.uint8)))
del _k, _name


# -- lookups -------------------------------------------------------------------------------

def _defined_in_builtins(op):
    """Whether the op's own Python parts (check, gradient rule, reference) come from ``opforge.builtins``."""
    parts = (op.check_fn, op.grad_rule, op.reference_kernel and op.reference_kernel.fn)
    return any(getattr(f, "__module__", "").startswith("opforge.builtins.") for f in parts if f is not None)


def every_builtin_op() -> list[Op]:
    """Every registered op defined in a module of ``opforge.builtins`` (not ops tests or users declare): the
    ops those modules hold, and any op made there without a name of its own (its functions say where)."""
    import opforge.builtins

    held = set()
    for info in pkgutil.iter_modules(opforge.builtins.__path__):
        module = importlib.import_module(f"opforge.builtins.{info.name}")
        held.update(id(value) for value in vars(module).values() if isinstance(value, Op))
    return [op for op in opforge.registered_ops() if id(op) in held or _defined_in_builtins(op)]


def samples_for(op_name) -> list[Sample]:
    """Copies of the op's samples (a caller may change the arrays); KeyError for an op without samples."""
    if op_name not in SAMPLES:
        raise KeyError(f"no samples for op {op_name!r}; add them to tests/builtin_samples.py")
    return [Sample(copy.deepcopy(s.args), copy.deepcopy(s.attrs), s.differentiable, s.note) for s in SAMPLES[op_name]]
