"""Every built-in CPU kernel against NumPy and torch, at 1 thread and at all threads.

    python benchmarks/kernels.py [--threads 1,all] [--rounds N] [--ops a,b] [--quick]

What is measured
----------------
For each built-in op (``opforge ops``), one call on inputs large enough to
time -- 4M float32 elements for elementwise ops (int32 for the bitwise ops
and shifts; 16 matrices of 512^2 for trilu), (4096, 1024) rows for
reductions, cumsum, softmax, layer_norm, the gathers and scatters, 1024^2
matmul and gemm, a 4096^2 transpose, ResNet-like images (4 x 64 x 56 x 56,
the stem's 4 x 64 x 112 x 112 for max_pool) for convolution, pooling and
normalisation -- three ways:

* opforge: the op object called on NumPy arrays (``opforge.lookup(name)``),
  its attributes as keywords;
* NumPy: the equivalent NumPy expression (a short composition where NumPy
  has no function of its own, e.g. softmax or im2col + tensordot for conv);
* torch: the equivalent torch CPU call on tensors sharing the NumPy inputs'
  memory (``torch.from_numpy``); for gradient ops, torch's own backward op
  (``aten.threshold_backward``, ``aten.convolution_backward``, ...), from the
  inputs the opforge op takes (max_pool_grad's torch finds the indices from
  x first; max_pool_with_indices_grad's is given its own forward's).

opforge's ops return new arrays, so a peer whose expression would return a
view (reshape, transpose, slice, expand, ...) copies it (``.copy()``,
``.contiguous()``): every contender produces the same fresh array.  A peer
without an equivalent prints ``n/a``.  Before timing, each peer's result is
compared with opforge's; a peer that disagrees is marked ``!`` (its time is
still printed, but no ratio is taken against it).

Threads: each thread count runs in its own process, with
``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and
``OPFORGE_NUM_THREADS`` set before NumPy loads (opforge's own OpenBLAS stays on
one thread: its pool multiplies the blocks of a product), and
``OPENBLAS_THREAD_TIMEOUT=4`` so NumPy's BLAS threads sleep after each call
rather than poll into the next contender's sample, and ``GOMP_SPINCOUNT=10000``
for torch's OpenMP threads likewise (by default they poll 300000 rounds, 5-8 ms
here, past the pause below: the next contender's two-thread sample then ran on
one free core, a 1024^2 matmul 20% slower);
inside it ``opforge.set_num_threads`` and ``torch.set_num_threads`` set the
same count.  ``all`` is the cores this process may run on.

Timing: each contender is called twice (build, plan, first page faults) and
timed once to choose how many calls make one sample (at least 20 ms;
``--quick``: 2 ms); then ``--rounds`` rounds, each timing every contender once
in an order rotated by one per round, with ``time.perf_counter``; a 2 ms pause
before each sample lets the previous contender's threads go idle.  Figures are
medians over rounds, per call.  Only ratios within one run mean much.

Per op and thread count a row gives each contender's time, opforge's ratio to
the best peer (lower is better) and the kernel opforge dispatched to; matmul,
gemm and the convolutions also give GFLOP/s.  A table of the ratios per
thread count follows, and the run ends with

    matmul1024_vs_numpy_gflops: <ratio> (<threads>; ...)
    worst_kernel_vs_best_peer: <ratio> (<op>, <threads>)

(opforge's matmul GFLOP/s over NumPy's at the thread count where that is
lowest; the highest ratio to the best peer over all ops and thread counts).
``--quick`` shrinks every input and the rounds, for a smoke run (seconds for
a few ops): its figures mean nothing.

The build cache goes to a temporary folder (removed at exit) unless
``OPFORGE_CACHE_DIR`` is set.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

CONTENDERS = ("opforge", "numpy", "torch")
PEERS = CONTENDERS[1:]
PAUSE = 0.002  # seconds before each sample: spinning pool threads of the previous contender go to sleep


# -- sizes ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sizes:
    elems: tuple  # elementwise ops: 4M elements
    rows: tuple  # reductions, cumsum, softmax, layer_norm, gathers, scatters, topk
    matmul: int
    transpose: int
    image: tuple  # conv, pooling, normalisation, pad, resize (N, C, H, W)
    stem: tuple  # max_pool after a ResNet stem
    head: tuple  # global_average_pool before a ResNet head
    topk: int
    sample_s: float  # a sample lasts at least this long
    rounds: int


FULL = Sizes(elems=(2048, 2048), rows=(4096, 1024), matmul=1024, transpose=4096, image=(4, 64, 56, 56),
             stem=(4, 64, 112, 112), head=(32, 2048, 7, 7), topk=8, sample_s=0.02, rounds=7)
QUICK = Sizes(elems=(128, 256), rows=(128, 64), matmul=128, transpose=256, image=(1, 8, 12, 12),
              stem=(1, 8, 24, 24), head=(2, 64, 7, 7), topk=4, sample_s=0.002, rounds=3)


# -- inputs (one seeded generator per array) --------------------------------------------------

def normal(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def positive(shape, seed=0):
    """Values in [0.5, 1.5): sqrt and log arguments, pow bases, divisors, variances."""
    return (np.random.default_rng(seed).random(shape, dtype=np.float32) + np.float32(0.5))


def small_ints(shape, seed=0):
    """Small integers as float32, so that comparisons meet ties."""
    return np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float32)


def signed_positive(shape, seed=0):
    """Values in +-[0.5, 1.5): mod's divisors, off 0 with both signs."""
    sign = np.where(np.random.default_rng(seed + 1).random(shape) < 0.5, -1, 1).astype(np.float32)
    return positive(shape, seed) * sign


def unit(shape, seed=0):
    """Values in (-0.99, 0.99): asin, acos and atanh arguments."""
    return np.random.default_rng(seed).random(shape, dtype=np.float32) * np.float32(1.98) - np.float32(0.99)


def at_least_one(shape, seed=0):
    """Values in [1, 2): acosh arguments."""
    return np.random.default_rng(seed).random(shape, dtype=np.float32) + np.float32(1)


def int32s(shape, seed=0):
    """Any int32 (both signs): bitwise operands and shifted values."""
    info = np.iinfo(np.int32)
    return np.random.default_rng(seed).integers(info.min, info.max, size=shape, dtype=np.int32, endpoint=True)


def shift_counts(shape, seed=0):
    """int32 shift counts in 0..31."""
    return np.random.default_rng(seed).integers(0, 32, size=shape, dtype=np.int32)


def windows(x, k, stride, pad=0, fill=0.0):
    """The k x k windows of an NCHW array (padded with ``fill``), strided: a view of shape (N, C, H', W', k, k)."""
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    return np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]


def _dims(shape):
    return " x ".join(map(str, shape))


# -- cases: one per op ------------------------------------------------------------------------

@dataclass
class Case:
    """One op's timed call: what it computes on (``what``), a zero-argument function per contender (or the
    reason it has none), and the floating-point operations of one call where GFLOP/s mean something."""
    what: str
    inputs: tuple  # opforge's tensor inputs, for the dispatched kernel's name
    opforge: Callable
    numpy: Callable | str
    torch: Callable | str
    flops: float = 0.0


CASES: dict[str, Callable] = {}  # op name -> builder(op, sizes, torch module) -> Case
SKIPPED = {"reorder": "graphs only (blocked layouts exist only inside graphs), no peer equivalent"}


def case(name):
    def register(builder):
        CASES[name] = builder
        return builder
    return register


def unary(name, np_fn, torch_fn, make=normal, **attrs):
    """An elementwise op of one input; ``np_fn`` / ``torch_fn`` a function, or a string: why none."""
    @case(name)
    def build(op, S, torch):
        x = make(S.elems, seed=1)
        t = torch.from_numpy(x)
        return Case(f"x {_dims(S.elems)} {x.dtype}", (x,), lambda: op(x, **attrs),
                    np_fn if isinstance(np_fn, str) else (lambda: np_fn(x)),
                    torch_fn if isinstance(torch_fn, str) else (lambda: torch_fn(torch, t)))


def binary(name, np_fn, torch_fn, make_a=normal, make_b=normal, **attrs):
    @case(name)
    def build(op, S, torch):
        a, b = make_a(S.elems, seed=2), make_b(S.elems, seed=3)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        return Case(f"a, b {_dims(S.elems)} {a.dtype}", (a, b), lambda: op(a, b, **attrs),
                    lambda: np_fn(a, b), lambda: torch_fn(torch, ta, tb))


F32 = np.float32

# elementwise, one input
unary("neg", np.negative, lambda torch, t: torch.neg(t))
unary("abs", np.abs, lambda torch, t: torch.abs(t))
unary("sqrt", np.sqrt, lambda torch, t: torch.sqrt(t), make=positive)
unary("log", np.log, lambda torch, t: torch.log(t), make=positive)
unary("exp", np.exp, lambda torch, t: torch.exp(t))
unary("tanh", np.tanh, lambda torch, t: torch.tanh(t))
unary("sigmoid", lambda x: F32(1) / (F32(1) + np.exp(-x)), lambda torch, t: torch.sigmoid(t))
unary("erf", "NumPy has no erf", lambda torch, t: torch.erf(t))
unary("gelu", "NumPy has no erf (exact gelu)", lambda torch, t: torch.nn.functional.gelu(t))
unary("relu", lambda x: np.maximum(x, F32(0)), lambda torch, t: torch.relu(t))
unary("leaky_relu", lambda x: np.where(x > 0, x, F32(0.1) * x),
      lambda torch, t: torch.nn.functional.leaky_relu(t, 0.1), alpha=0.1)
# alpha 1/6 is torch's hardsigmoid
unary("hard_sigmoid", lambda x: np.clip(x * F32(1 / 6) + F32(0.5), F32(0), F32(1)),
      lambda torch, t: torch.nn.functional.hardsigmoid(t), alpha=1 / 6, beta=0.5)
unary("clip", lambda x: np.clip(x, F32(-1), F32(0.5)), lambda torch, t: torch.clamp(t, -1.0, 0.5), min=-1.0, max=0.5)
unary("cast", lambda x: x.astype(np.float64), lambda torch, t: t.to(torch.float64), dtype="float64")
# trigonometric and hyperbolic (torch's function has the op's name), inputs inside each domain
for _name, _np_fn, _make in [("sin", np.sin, normal), ("cos", np.cos, normal), ("tan", np.tan, normal),
                             ("asin", np.arcsin, unit), ("acos", np.arccos, unit), ("atan", np.arctan, normal),
                             ("sinh", np.sinh, normal), ("cosh", np.cosh, normal), ("asinh", np.arcsinh, normal),
                             ("acosh", np.arccosh, at_least_one), ("atanh", np.arctanh, unit)]:
    unary(_name, _np_fn, lambda torch, t, _f=_name: getattr(torch, _f)(t), make=_make)
unary("bitwise_not", np.invert, lambda torch, t: torch.bitwise_not(t), make=int32s)

# elementwise, two inputs (same shape)
binary("add", np.add, lambda torch, a, b: torch.add(a, b))
binary("sub", np.subtract, lambda torch, a, b: torch.sub(a, b))
binary("mul", np.multiply, lambda torch, a, b: torch.mul(a, b))
binary("div", np.divide, lambda torch, a, b: torch.div(a, b), make_b=positive)
binary("pow", np.power, lambda torch, a, b: torch.pow(a, b), make_a=positive)
binary("maximum", np.maximum, lambda torch, a, b: torch.maximum(a, b))
binary("minimum", np.minimum, lambda torch, a, b: torch.minimum(a, b))
binary("mod", np.mod, lambda torch, a, b: torch.remainder(a, b), make_b=signed_positive)
for _name, _np_fn, _torch_name in [("equal", np.equal, "eq"), ("not_equal", np.not_equal, "ne"),
                                   ("less", np.less, "lt"), ("less_equal", np.less_equal, "le"),
                                   ("greater", np.greater, "gt"), ("greater_equal", np.greater_equal, "ge")]:
    binary(_name, _np_fn, lambda torch, a, b, _f=_torch_name: getattr(torch, _f)(a, b),
           make_a=small_ints, make_b=small_ints)
binary("relu_grad", lambda dy, y: np.where(y > 0, dy, F32(0)),
       lambda torch, dy, y: torch.ops.aten.threshold_backward(dy, y, 0), make_b=lambda s, seed: np.maximum(
           normal(s, seed), F32(0)))
# integer: int32, shift counts in 0..31
binary("bitwise_and", np.bitwise_and, lambda torch, a, b: torch.bitwise_and(a, b), make_a=int32s, make_b=int32s)
binary("bitwise_or", np.bitwise_or, lambda torch, a, b: torch.bitwise_or(a, b), make_a=int32s, make_b=int32s)
binary("bitwise_xor", np.bitwise_xor, lambda torch, a, b: torch.bitwise_xor(a, b), make_a=int32s, make_b=int32s)
binary("left_shift", np.left_shift, lambda torch, a, b: torch.bitwise_left_shift(a, b), make_a=int32s,
       make_b=shift_counts)
binary("right_shift", np.right_shift, lambda torch, a, b: torch.bitwise_right_shift(a, b), make_a=int32s,
       make_b=shift_counts)
binary("leaky_relu_grad", lambda dy, x: np.where(x > 0, dy, F32(0.1) * dy),
       lambda torch, dy, x: torch.ops.aten.leaky_relu_backward(dy, x, 0.1, False), alpha=0.1)


@case("where")
def _(op, S, torch):
    c, x, y = normal(S.elems, seed=4) > 0, normal(S.elems, seed=5), normal(S.elems, seed=6)
    tc, tx, ty = map(torch.from_numpy, (c, x, y))
    return Case(f"condition bool, x, y {_dims(S.elems)} float32", (c, x, y), lambda: op(c, x, y),
                lambda: np.where(c, x, y), lambda: torch.where(tc, tx, ty))


@case("sum")
def _(op, S, torch):
    xs = [normal(S.elems, seed=7 + k) for k in range(3)]
    ts = [torch.from_numpy(x) for x in xs]
    return Case(f"3 inputs {_dims(S.elems)} float32", tuple(xs), lambda: op(*xs),
                lambda: xs[0] + xs[1] + xs[2], lambda: ts[0] + ts[1] + ts[2])


# -- reductions, softmax, normalisation ------------------------------------------------------

@case("reduce_sum")
def _(op, S, torch):
    x = normal(S.rows, seed=10)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.rows)} float32, axes [-1]", (x,), lambda: op(x, axes=[-1]),
                lambda: np.sum(x, axis=-1), lambda: torch.sum(t, dim=-1))


@case("mean")
def _(op, S, torch):
    x = normal(S.rows, seed=11)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.rows)} float32, axes [-1]", (x,), lambda: op(x, axes=[-1]),
                lambda: np.mean(x, axis=-1), lambda: torch.mean(t, dim=-1))


@case("cumsum")
def _(op, S, torch):
    x = normal(S.rows, seed=86)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.rows)} float32, axis -1", (x,), lambda: op(x, axis=-1),
                lambda: np.cumsum(x, axis=-1), lambda: torch.cumsum(t, -1))


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


@case("softmax")
def _(op, S, torch):
    x = normal(S.rows, seed=12)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.rows)} float32, axis -1", (x,), lambda: op(x, axis=-1),
                lambda: np_softmax(x), lambda: torch.softmax(t, -1))


def np_layer_norm(x, scale, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(var + F32(eps)) * scale + bias


@case("layer_norm")
def _(op, S, torch):
    x, scale, bias = normal(S.rows, seed=13), positive(S.rows[-1:], seed=14), normal(S.rows[-1:], seed=15)
    t, ts, tb = map(torch.from_numpy, (x, scale, bias))
    eps = 1e-5
    return Case(f"x {_dims(S.rows)} float32, axis -1, scale and bias", (x, scale, bias),
                lambda: op(x, scale, bias, axis=-1, epsilon=eps), lambda: np_layer_norm(x, scale, bias, eps),
                lambda: torch.nn.functional.layer_norm(t, S.rows[-1:], ts, tb, eps))


@case("batch_norm")
def _(op, S, torch):
    c = S.image[1]
    x = normal(S.image, seed=16)
    scale, bias, mean, var = positive(c, seed=17), normal(c, seed=18), normal(c, seed=19), positive(c, seed=20)
    t, ts, tb, tm, tv = map(torch.from_numpy, (x, scale, bias, mean, var))
    eps = 1e-5

    def numpy_bn():
        factor = scale / np.sqrt(var + F32(eps))
        return x * factor[:, None, None] + (bias - mean * factor)[:, None, None]
    return Case(f"x {_dims(S.image)} float32, inference", (x, scale, bias, mean, var),
                lambda: op(x, scale, bias, mean, var, epsilon=eps), numpy_bn,
                lambda: torch.nn.functional.batch_norm(t, tm, tv, ts, tb, False, 0.0, eps))


LRN = {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}


def np_lrn(x, size, alpha, beta, bias):
    """Sum of squares over a window of channels (floor((size-1)/2) before, the rest after) by a running sum."""
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    squares = np.pad(x * x, ((0, 0), (before + 1, after), (0, 0), (0, 0)))
    running = np.cumsum(squares, axis=1)
    window = running[:, size:] - running[:, :-size]
    return x / (F32(bias) + F32(alpha / size) * window) ** F32(beta)


@case("lrn")
def _(op, S, torch):
    x = normal(S.image, seed=21)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.image)} float32, size 5", (x,), lambda: op(x, **LRN), lambda: np_lrn(x, **LRN),
                lambda: torch.nn.functional.local_response_norm(t, LRN["size"], LRN["alpha"], LRN["beta"],
                                                                LRN["bias"]))


@case("lrn_grad")
def _(op, S, torch):
    dy, x = normal(S.image, seed=22), normal(S.image, seed=23)
    why = "no backward op of its own (autograd would recompute the forward)"
    return Case(f"dy, x {_dims(S.image)} float32, size 5", (dy, x), lambda: op(dy, x, **LRN), why, why)


# -- shapes, copies, indexing --------------------------------------------------------------------

@case("reshape")
def _(op, S, torch):
    x = normal(S.elems, seed=30)
    t = torch.from_numpy(x)
    shape = [S.elems[0] // 2, S.elems[1] * 2]
    return Case(f"x {_dims(S.elems)} float32 -> {_dims(shape)} (peers copy their view)", (x,),
                lambda: op(x, shape=shape), lambda: x.reshape(shape).copy(), lambda: t.reshape(shape).clone())


@case("transpose")
def _(op, S, torch):
    x = normal((S.transpose, S.transpose), seed=31)
    t = torch.from_numpy(x)
    return Case(f"x {S.transpose}^2 float32 (peers copy their view)", (x,), lambda: op(x),
                lambda: np.ascontiguousarray(x.T), lambda: t.t().contiguous())


@case("squeeze")
def _(op, S, torch):
    x = normal((1, *S.elems), seed=32)
    t = torch.from_numpy(x)
    return Case(f"x 1 x {_dims(S.elems)} float32, axes [0] (peers copy)", (x,), lambda: op(x, axes=[0]),
                lambda: np.squeeze(x, 0).copy(), lambda: t.squeeze(0).clone())


@case("unsqueeze")
def _(op, S, torch):
    x = normal(S.elems, seed=33)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.elems)} float32, axes [0] (peers copy)", (x,), lambda: op(x, axes=[0]),
                lambda: x[None].copy(), lambda: t.unsqueeze(0).clone())


@case("expand")
def _(op, S, torch):
    x = normal((1, S.elems[1]), seed=34)
    t = torch.from_numpy(x)
    return Case(f"x 1 x {S.elems[1]} float32 -> {_dims(S.elems)}", (x,), lambda: op(x, shape=list(S.elems)),
                lambda: np.broadcast_to(x, S.elems).copy(), lambda: t.expand(*S.elems).contiguous())


@case("tile")
def _(op, S, torch):
    half = (S.elems[0] // 2, S.elems[1] // 2)
    x = normal(half, seed=35)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(half)} float32, repeats [2, 2]", (x,), lambda: op(x, repeats=[2, 2]),
                lambda: np.tile(x, (2, 2)), lambda: t.repeat(2, 2))


@case("trilu")
def _(op, S, torch):
    side = S.elems[1] // 4  # as many elements as S.elems, in square matrices
    shape = (S.elems[0] * S.elems[1] // (side * side), side, side)
    x = normal(shape, seed=87)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(shape)} float32, upper, k 0", (x,), lambda: op(x, upper=True, k=0),
                lambda: np.triu(x), lambda: torch.triu(t))


@case("concat")
def _(op, S, torch):
    part = (S.elems[0], S.elems[1] // 4)
    xs = [normal(part, seed=36 + k) for k in range(4)]
    ts = [torch.from_numpy(x) for x in xs]
    return Case(f"4 inputs {_dims(part)} float32, axis -1", tuple(xs), lambda: op(*xs, axis=-1),
                lambda: np.concatenate(xs, axis=-1), lambda: torch.cat(ts, -1))


@case("shape")
def _(op, S, torch):
    x = normal(S.elems, seed=40)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.elems)} float32 (a call's fixed cost)", (x,), lambda: op(x),
                lambda: np.array(x.shape, np.int64), lambda: torch.tensor(t.shape, dtype=torch.int64))


@case("dim")
def _(op, S, torch):
    x = normal(S.elems, seed=41)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.elems)} float32, axis 1 (a call's fixed cost)", (x,), lambda: op(x, axis=1),
                lambda: np.array(x.shape[1], np.int64), lambda: torch.tensor(t.shape[1], dtype=torch.int64))


@case("constant_of_shape")
def _(op, S, torch):
    value = np.array([0.5], np.float32)
    return Case(f"-> {_dims(S.elems)} float32", (value,), lambda: op(value, shape=list(S.elems)),
                lambda: np.full(S.elems, value[0]), lambda: torch.full(S.elems, 0.5, dtype=torch.float32))


def _slice_bounds(S):
    cols = S.elems[1]
    return cols // 8, cols - cols // 8


@case("slice")
def _(op, S, torch):
    x = normal(S.elems, seed=42)
    t = torch.from_numpy(x)
    lo, hi = _slice_bounds(S)
    return Case(f"x {_dims(S.elems)} float32, [:, {lo}:{hi}] (peers copy)", (x,),
                lambda: op(x, starts=[lo], ends=[hi], axes=[1]), lambda: x[:, lo:hi].copy(),
                lambda: t[:, lo:hi].clone())


@case("slice_grad")
def _(op, S, torch):
    x = normal(S.elems, seed=43)
    lo, hi = _slice_bounds(S)
    dy = normal((S.elems[0], hi - lo), seed=44)
    tdy = torch.from_numpy(dy)

    def numpy_grad():
        dx = np.zeros_like(x)
        dx[:, lo:hi] = dy
        return dx
    return Case(f"dy {_dims(dy.shape)} -> x {_dims(S.elems)} float32", (dy, x),
                lambda: op(dy, x, starts=[lo], ends=[hi], axes=[1]), numpy_grad,
                lambda: torch.ops.aten.slice_backward(tdy, list(x.shape), 1, lo, hi, 1))


@case("gather")
def _(op, S, torch):
    data = normal(S.rows, seed=45)
    indices = np.random.default_rng(46).integers(0, S.rows[0], size=S.rows[0])
    td, ti = torch.from_numpy(data), torch.from_numpy(indices)
    return Case(f"data {_dims(S.rows)} float32, {S.rows[0]} int64 row indices, axis 0", (data, indices),
                lambda: op(data, indices, axis=0), lambda: np.take(data, indices, axis=0),
                lambda: torch.index_select(td, 0, ti))


@case("gather_grad")
def _(op, S, torch):
    data, dy = normal(S.rows, seed=47), normal(S.rows, seed=48)
    indices = np.random.default_rng(49).integers(0, S.rows[0], size=S.rows[0])
    tdata, tdy, ti = map(torch.from_numpy, (data, dy, indices))

    def numpy_grad():
        dx = np.zeros_like(data)
        np.add.at(dx, indices, dy)
        return dx
    return Case(f"dy {_dims(S.rows)} float32, {S.rows[0]} int64 row indices (repeated ones add up)",
                (dy, indices, data), lambda: op(dy, indices, data, axis=0), numpy_grad,
                lambda: torch.zeros_like(tdata).index_add_(0, ti, tdy))


@case("gather_elements")
def _(op, S, torch):
    data = normal(S.rows, seed=88)
    indices = np.random.default_rng(89).integers(0, S.rows[1], size=S.rows)
    td, ti = torch.from_numpy(data), torch.from_numpy(indices)
    return Case(f"data {_dims(S.rows)} float32, int64 indices of its shape, axis -1", (data, indices),
                lambda: op(data, indices, axis=-1), lambda: np.take_along_axis(data, indices, axis=-1),
                lambda: torch.gather(td, -1, ti))


@case("scatter_elements")
def _(op, S, torch):
    width = S.rows[1] // 4
    data, updates = normal(S.rows, seed=90), normal((S.rows[0], width), seed=91)
    # per row, distinct columns: with reduction none every peer writes the same
    rows = np.broadcast_to(np.arange(S.rows[1]), S.rows)
    indices = np.random.default_rng(92).permuted(rows, axis=-1)[:, :width].copy()
    td, ti, tu = map(torch.from_numpy, (data, indices, updates))

    def numpy_scatter():
        y = data.copy()
        np.put_along_axis(y, indices, updates, axis=-1)
        return y
    return Case(f"data {_dims(S.rows)} float32, updates {_dims(updates.shape)} at distinct int64 columns, "
                f"axis -1", (data, indices, updates), lambda: op(data, indices, updates, axis=-1),
                numpy_scatter, lambda: torch.scatter(td, -1, ti, tu))


def _blocks(S):
    """S.rows as a 3-D data whose rows gather_nd / scatter_nd address by (i, j) tuples."""
    return (S.rows[0] // 64, 64, S.rows[1])


@case("gather_nd")
def _(op, S, torch):
    shape = _blocks(S)
    data = normal(shape, seed=93)
    rng = np.random.default_rng(94)
    indices = np.stack([rng.integers(0, shape[0], S.rows[0]), rng.integers(0, shape[1], S.rows[0])], axis=-1)
    td, ti = torch.from_numpy(data), torch.from_numpy(indices)
    return Case(f"data {_dims(shape)} float32, {S.rows[0]} int64 (i, j) tuples -> rows of {shape[2]}",
                (data, indices), lambda: op(data, indices), lambda: data[indices[:, 0], indices[:, 1]],
                lambda: td[ti[:, 0], ti[:, 1]])


@case("scatter_nd")
def _(op, S, torch):
    shape = _blocks(S)
    count = S.rows[0] // 2
    data, updates = normal(shape, seed=95), normal((count, shape[2]), seed=96)
    flat = np.random.default_rng(97).permutation(shape[0] * shape[1])[:count]  # distinct tuples
    indices = np.stack(np.divmod(flat, shape[1]), axis=-1).astype(np.int64)
    td, ti, tu = map(torch.from_numpy, (data, indices, updates))

    def numpy_scatter():
        y = data.copy()
        y[indices[:, 0], indices[:, 1]] = updates
        return y
    return Case(f"data {_dims(shape)} float32, {count} distinct int64 (i, j) tuples, updates "
                f"{_dims(updates.shape)}", (data, indices, updates), lambda: op(data, indices, updates),
                numpy_scatter, lambda: td.index_put((ti[:, 0], ti[:, 1]), tu))


def np_topk(x, k):
    """The k largest values along the last axis, largest first."""
    part = np.take_along_axis(x, np.argpartition(x, -k, axis=-1)[..., -k:], axis=-1)
    return -np.sort(-part, axis=-1)


@case("topk")
def _(op, S, torch):
    x = normal(S.rows, seed=50)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.rows)} float32, k {S.topk}, axis -1", (x,), lambda: op(x, k=S.topk, axis=-1),
                lambda: np_topk(x, S.topk), lambda: torch.topk(t, S.topk, -1))


@case("topk_grad")
def _(op, S, torch):
    x = normal(S.rows, seed=51)
    t = torch.from_numpy(x)
    indices = torch.topk(t, S.topk, -1).indices.numpy()
    dv = normal(indices.shape, seed=52)
    tdv, ti = torch.from_numpy(dv), torch.from_numpy(indices)

    def numpy_grad():
        dx = np.zeros_like(x)
        np.put_along_axis(dx, indices, dv, axis=-1)
        return dx
    return Case(f"dvalues {_dims(dv.shape)} -> x {_dims(S.rows)} float32", (dv, indices, x),
                lambda: op(dv, indices, x, axis=-1), numpy_grad,
                lambda: torch.zeros_like(t).scatter_(-1, ti, tdv))


PAD = [0, 0, 1, 1, 0, 0, 1, 1]


@case("pad")
def _(op, S, torch):
    x = normal(S.image, seed=53)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.image)} float32, 1 on each side of H and W, constant 0", (x,),
                lambda: op(x, pads=PAD), lambda: np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))),
                lambda: torch.nn.functional.pad(t, (1, 1, 1, 1)))


@case("pad_grad")
def _(op, S, torch):
    x = normal(S.image, seed=54)
    n, c, h, w = S.image
    dy = normal((n, c, h + 2, w + 2), seed=55)
    tdy = torch.from_numpy(dy)
    return Case(f"dy {_dims(dy.shape)} -> x {_dims(S.image)} float32 (a crop)", (dy, x),
                lambda: op(dy, x, pads=PAD), lambda: dy[:, :, 1:-1, 1:-1].copy(),
                lambda: tdy[:, :, 1:-1, 1:-1].clone())


@case("resize")
def _(op, S, torch):
    x = normal(S.image, seed=56)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.image)} float32, scales 2 x 2, linear, half_pixel", (x,),
                lambda: op(x, scales=[1, 1, 2, 2], mode="linear"), "NumPy has no resampling",
                lambda: torch.nn.functional.interpolate(t, scale_factor=2, mode="bilinear", align_corners=False))


@case("resize_grad")
def _(op, S, torch):
    x = normal(S.image, seed=57)
    n, c, h, w = S.image
    dy = normal((n, c, 2 * h, 2 * w), seed=58)
    tdy = torch.from_numpy(dy)
    return Case(f"dy {_dims(dy.shape)} -> x {_dims(S.image)} float32, linear", (dy, x),
                lambda: op(dy, x, scales=[1, 1, 2, 2], mode="linear"), "NumPy has no resampling",
                lambda: torch.ops.aten.upsample_bilinear2d_backward(tdy, [2 * h, 2 * w], list(x.shape), False,
                                                                    2.0, 2.0))


# -- pooling ---------------------------------------------------------------------------------------

MAX_POOL = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}  # ResNet's stem
AVERAGE_POOL = {"kernel_shape": [3, 3], "strides": [2, 2]}


@case("max_pool")
def _(op, S, torch):
    x = normal(S.stem, seed=60)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.stem)} float32, 3 x 3, stride 2, pad 1", (x,), lambda: op(x, **MAX_POOL),
                lambda: windows(x, 3, 2, pad=1, fill=-np.inf).max(axis=(-2, -1)),
                lambda: torch.nn.functional.max_pool2d(t, 3, 2, 1))


@case("max_pool_with_indices")
def _(op, S, torch):
    x = normal(S.stem, seed=61)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.stem)} float32, 3 x 3, stride 2, pad 1 (values compared)", (x,),
                lambda: op(x, **MAX_POOL), "NumPy has no argmax over windows",
                lambda: torch.nn.functional.max_pool2d(t, 3, 2, 1, return_indices=True))


@case("max_pool_grad")
def _(op, S, torch):
    x = normal(S.stem, seed=62)
    t = torch.from_numpy(x)
    dy = normal(tuple(torch.nn.functional.max_pool2d(t, 3, 2, 1).shape), seed=63)
    tdy = torch.from_numpy(dy)

    def torch_grad():  # from dy and x alone, as the op: the maxima are found, then dy scattered
        _, indices = torch.nn.functional.max_pool2d(t, 3, 2, 1, return_indices=True)
        return torch.ops.aten.max_pool2d_with_indices_backward(tdy, t, [3, 3], [2, 2], [1, 1], [1, 1], False,
                                                               indices)
    return Case(f"dy {_dims(dy.shape)} -> x {_dims(S.stem)} float32 (from x: torch finds the indices, then "
                f"scatters)", (dy, x), lambda: op(dy, x, **MAX_POOL), "NumPy has no scatter of window maxima",
                torch_grad)


@case("max_pool_with_indices_grad")
def _(op, S, torch):
    import opforge  # (the worker's: loaded with its thread settings)

    x = normal(S.stem, seed=62)
    t = torch.from_numpy(x)
    _, indices = opforge.ops.max_pool_with_indices(x, **MAX_POOL)
    _, tindices = torch.nn.functional.max_pool2d(t, 3, 2, 1, return_indices=True)
    dy = normal(indices.shape, seed=63)
    tdy = torch.from_numpy(dy)
    return Case(f"dy {_dims(dy.shape)} -> x {_dims(S.stem)} float32 (each given its forward's indices)",
                (dy, indices, x), lambda: op(dy, indices, x, **MAX_POOL), "NumPy has no scatter of window maxima",
                lambda: torch.ops.aten.max_pool2d_with_indices_backward(tdy, t, [3, 3], [2, 2], [1, 1], [1, 1],
                                                                        False, tindices))


@case("average_pool")
def _(op, S, torch):
    x = normal(S.image, seed=64)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.image)} float32, 3 x 3, stride 2", (x,), lambda: op(x, **AVERAGE_POOL),
                lambda: windows(x, 3, 2).mean(axis=(-2, -1)), lambda: torch.nn.functional.avg_pool2d(t, 3, 2))


@case("average_pool_grad")
def _(op, S, torch):
    x = normal(S.image, seed=65)
    t = torch.from_numpy(x)
    n, c, h, w = S.image
    dy = normal((n, c, (h - 3) // 2 + 1, (w - 3) // 2 + 1), seed=66)
    tdy = torch.from_numpy(dy)
    return Case(f"dy {_dims(dy.shape)} -> x {_dims(S.image)} float32", (dy, x),
                lambda: op(dy, x, **AVERAGE_POOL), "NumPy has no scatter over windows",
                lambda: torch.ops.aten.avg_pool2d_backward(tdy, t, [3, 3], [2, 2], [0, 0], False, True, None))


@case("global_average_pool")
def _(op, S, torch):
    x = normal(S.head, seed=67)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.head)} float32", (x,), lambda: op(x),
                lambda: np.mean(x, axis=(2, 3), keepdims=True), lambda: t.mean((2, 3), keepdim=True))


# -- linear algebra and convolution ------------------------------------------------------------------

@case("matmul")
def _(op, S, torch):
    m = S.matmul
    a, b = normal((m, m), seed=70), normal((m, m), seed=71)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return Case(f"{m} x {m} @ {m} x {m} float32", (a, b), lambda: op(a, b), lambda: np.matmul(a, b),
                lambda: torch.matmul(ta, tb), flops=2.0 * m ** 3)


@case("gemm")
def _(op, S, torch):
    m = S.matmul
    a, b, c = normal((m, m), seed=72), normal((m, m), seed=73), normal(m, seed=74)
    ta, tb, tc = map(torch.from_numpy, (a, b, c))
    return Case(f"{m} x {m} @ {m} x {m} + c ({m},) float32", (a, b, c), lambda: op(a, b, c),
                lambda: a @ b + c, lambda: torch.addmm(tc, ta, tb), flops=2.0 * m ** 3)


def np_conv3x3(x, w, b):
    """3 x 3 convolution, stride 1, pad 1: im2col (a copy of the windows) and one tensordot (BLAS)."""
    y = np.tensordot(windows(x, 3, 1, pad=1), w, axes=([1, 4, 5], [1, 2, 3]))  # N, H, W, O
    y += b
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


@case("conv")
def _(op, S, torch):
    n, c, h, w_ = S.image
    x, w, b = normal(S.image, seed=75), normal((c, c, 3, 3), seed=76) * F32(0.05), normal(c, seed=77)
    tx, tw, tb = map(torch.from_numpy, (x, w, b))
    return Case(f"x {_dims(S.image)}, w {c} x {c} x 3 x 3, bias, pad 1, float32", (x, w, b),
                lambda: op(x, w, b, pads=[1, 1, 1, 1]), lambda: np_conv3x3(x, w, b),
                lambda: torch.nn.functional.conv2d(tx, tw, tb, padding=1), flops=2.0 * n * c * h * w_ * c * 9)


@case("conv_transpose")
def _(op, S, torch):
    n, c, h, w_ = S.image
    shape = (n, c, h // 2, w_ // 2)
    x, w, b = normal(shape, seed=78), normal((c, c // 2, 3, 3), seed=79) * F32(0.05), normal(c // 2, seed=80)
    tx, tw, tb = map(torch.from_numpy, (x, w, b))
    return Case(f"x {_dims(shape)}, w {c} x {c // 2} x 3 x 3, bias, stride 2, pad 1, output_padding 1, float32",
                (x, w, b), lambda: op(x, w, b, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
                "NumPy has no transposed convolution",
                lambda: torch.nn.functional.conv_transpose2d(tx, tw, tb, stride=2, padding=1, output_padding=1),
                flops=2.0 * n * c * (h // 2) * (w_ // 2) * (c // 2) * 9)


@case("conv_weight_grad")
def _(op, S, torch):
    n, c, h, w_ = S.image
    x, dy = normal(S.image, seed=81), normal(S.image, seed=82)
    weight = np.zeros((c, c, 3, 3), np.float32)  # torch's backward takes the weight for its shape
    tx, tdy, tw = map(torch.from_numpy, (x, dy, weight))
    return Case(f"x, dy {_dims(S.image)} float32 -> dw {c} x {c} x 3 x 3, pad 1", (x, dy),
                lambda: op(x, dy, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                lambda: np.tensordot(dy, windows(x, 3, 1, pad=1), axes=([0, 2, 3], [0, 2, 3])),
                lambda: torch.ops.aten.convolution_backward(tdy, tx, tw, None, [1, 1], [1, 1], [1, 1], False,
                                                            [0, 0], 1, [False, True, False])[1],
                flops=2.0 * n * c * h * w_ * c * 9)


@case("quantize_linear")
def _(op, S, torch):
    x, scale, zero = normal(S.elems, seed=83), np.float32(0.02), np.uint8(128)
    t = torch.from_numpy(x)
    return Case(f"x {_dims(S.elems)} float32 -> uint8, per tensor", (x, scale, zero), lambda: op(x, scale, zero),
                lambda: np.clip(np.rint(x / scale) + np.float32(zero), 0, 255).astype(np.uint8),
                lambda: torch.quantize_per_tensor(t, 0.02, 128, torch.quint8).int_repr())


@case("dequantize_linear")
def _(op, S, torch):
    x = np.random.default_rng(84).integers(0, 256, S.elems).astype(np.uint8)
    scale, zero = np.float32(0.02), np.uint8(128)
    q = torch._make_per_tensor_quantized_tensor(torch.from_numpy(x), 0.02, 128)
    return Case(f"x {_dims(S.elems)} uint8 -> float32, per tensor", (x, scale, zero), lambda: op(x, scale, zero),
                lambda: (x.astype(np.float32) - np.float32(zero)) * scale, lambda: q.dequantize())


@case("dynamic_quantize_linear")
def _(op, S, torch):
    x = normal(S.elems, seed=85)

    def numpy_dynamic():
        low, high = np.float32(min(0, x.min())), np.float32(max(0, x.max()))
        scale = (high - low) / np.float32(255)
        zero = np.clip(np.rint(-low / scale), 0, 255)
        return np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.uint8), scale, np.uint8(zero)

    return Case(f"x {_dims(S.elems)} float32 -> uint8, scale and zero point from its range", (x,), lambda: op(x),
                numpy_dynamic, "no single op (torch.quantize_per_tensor_dynamic returns a quantized tensor type)")


# -- measuring (in the worker process of one thread count) --------------------------------------------

def first_array(result):
    """The array to compare: a tuple's first output (topk's values, max_pool_with_indices' y), torch as NumPy."""
    if isinstance(result, (tuple, list)):
        result = result[0]
    if hasattr(result, "detach"):
        result = result.detach().numpy()
    return np.asarray(result)


def agrees(ours, theirs):
    """Same shape and values: exact for bools and integers; else within 1e-3 (relative to the values' scale),
    allowing one element in 10 000 to differ (a floor mod or a max picked on the other side of a rounding)."""
    if ours.shape != theirs.shape:
        return False
    if ours.dtype.kind in "biu" or theirs.dtype.kind in "biu":
        return bool(np.array_equal(ours, theirs))
    a, b = ours.astype(np.float64), theirs.astype(np.float64)
    scale = max(float(np.max(np.abs(a), initial=0.0)), 1e-30)
    close = np.isclose(a, b, rtol=1e-3, atol=1e-3 * scale) | (np.isnan(a) & np.isnan(b))
    return bool(np.count_nonzero(~close) <= a.size // 10000)


def measure(fns, rounds, sample_s):
    """Median seconds per call of each zero-argument function, timed in rotating order."""
    number = {}
    for label, fn in fns.items():
        fn()
        t0 = time.perf_counter()
        fn()
        once = time.perf_counter() - t0
        number[label] = max(1, min(10000, math.ceil(sample_s / max(once, 1e-7))))
    labels = list(fns)
    samples = {label: [] for label in labels}
    for r in range(rounds):
        k = r % len(labels)
        for label in labels[k:] + labels[:k]:
            fn, n = fns[label], number[label]
            time.sleep(PAUSE)
            t0 = time.perf_counter()
            for _ in range(n):
                result = fn()
            t1 = time.perf_counter()
            del result  # the last output is freed outside the timed region
            samples[label].append((t1 - t0) / n)
    return {label: statistics.median(s) for label, s in samples.items()}


def fmt_time(seconds):
    if seconds is None:
        return "n/a"
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


def threads_label(n):
    return f"{n} thread" + ("s" if n != 1 else "")


def dispatched(op, inputs):
    import opforge
    from opforge.runtime.dispatch import select_kernel

    try:
        return select_kernel(op, [opforge.TensorSpec.of(a) for a in inputs]).name
    except Exception as error:  # noqa: BLE001 - a name for the table, never fatal
        return f"? ({type(error).__name__})"


def run_worker(threads, names, sizes, rounds, results_path):
    """Time ``names`` at ``threads`` threads (the environment already says so); print rows, write JSON."""
    import opforge
    import torch

    opforge.set_num_threads(threads)
    torch.set_num_threads(threads)
    rows = []
    print(f"\n== {threads_label(threads)}: opforge {opforge.get_num_threads()}, torch {torch.get_num_threads()}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} ==")
    print(f"{'op':26s} {'opforge':>11s} {'numpy':>12s} {'torch':>12s} {'vs best':>8s}  best   opforge kernel")
    for name in names:
        row = {"op": name, "threads": threads, "times": {}, "why": {}, "differs": []}
        try:
            op = opforge.lookup(name)
            c = CASES[name](op, sizes, torch)
            row.update(what=c.what, flops=c.flops, kernel=dispatched(op, c.inputs))
            fns = {"opforge": c.opforge}
            for peer in PEERS:
                fn = getattr(c, peer)
                if isinstance(fn, str):
                    row["why"][peer] = fn
                else:
                    fns[peer] = fn
            ours = first_array(c.opforge())
            for peer in list(fns)[1:]:
                if not agrees(ours, first_array(fns[peer]())):
                    row["differs"].append(peer)
            del ours
            row["times"] = measure(fns, rounds, sizes.sample_s)
        except Exception as error:  # noqa: BLE001 - one broken op must not hide the others' figures
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        finally:
            c = fns = None
            gc.collect()
        rows.append(row)
        print_row(row)
    Path(results_path).write_text(json.dumps(rows))


def best_peer(row):
    """(peer, seconds) of the fastest peer whose result agrees with opforge's, or None."""
    timed = [(row["times"][p], p) for p in PEERS if p in row["times"] and p not in row["differs"]]
    if not timed:
        return None
    seconds, peer = min(timed)
    return peer, seconds


def ratio(row):
    best = best_peer(row)
    if "error" in row or best is None:
        return None
    return row["times"]["opforge"] / best[1]


def print_row(row):
    if "error" in row:
        print(f"{row['op']:26s} error: {row['error']}", flush=True)
        return
    cells = []
    for who in CONTENDERS:
        cell = fmt_time(row["times"].get(who))
        cells.append(cell + ("!" if who in row["differs"] else " "))
    r, best = ratio(row), best_peer(row)
    vs = f"{r:8.2f}  {best[0]:6s}" if r is not None else f"{'n/a':>8s}  {'':6s}"
    print(f"{row['op']:26s} {cells[0][:-1]:>11s} {cells[1]:>12s} {cells[2]:>12s} {vs} {row['kernel']}")
    details = [row["what"]]
    if row["flops"]:
        details.append("GFLOP/s " + " / ".join(
            f"{who} {row['flops'] / row['times'][who] / 1e9:.1f}" for who in CONTENDERS if who in row["times"]))
    details += [f"{peer}: n/a ({why})" for peer, why in row["why"].items()]
    details += [f"{peer}'s result differs from opforge's (no ratio taken)" for peer in row["differs"]]
    print(f"{'':26s}   {'; '.join(details)}", flush=True)


# -- the command ----------------------------------------------------------------------------------------

def all_threads():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_threads(text):
    counts = []
    for item in text.split(","):
        item = item.strip()
        count = all_threads() if item == "all" else int(item) if item.isdigit() else 0
        if count < 1:
            raise argparse.ArgumentTypeError(f"--threads takes positive counts or 'all', got {item!r}")
        if count not in counts:
            counts.append(count)
    return counts


def uncovered_ops():
    """Built-in CPU ops this benchmark has no case for (a new op should get one)."""
    import opforge

    names = {op.name for op in opforge.registered_ops() if "::" not in op.name and any(
        k.device == "cpu" and k.dispatchable for k in op.kernels)}
    return sorted(names - set(CASES) - set(SKIPPED))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=parse_threads, default="1,all",
                        help="thread counts, comma-separated; 'all' is every core (default 1,all)")
    parser.add_argument("--rounds", type=int, help=f"rounds per op (default {FULL.rounds}; --quick {QUICK.rounds})")
    parser.add_argument("--ops", help="only these ops, comma-separated (default: every built-in)")
    parser.add_argument("--quick", action="store_true", help="tiny inputs and few rounds: a smoke run")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # one thread count, in a child process
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or sizes.rounds
    names = [n.strip() for n in args.ops.split(",")] if args.ops else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"no case for {', '.join(unknown)}" + "".join(
            f" ({n}: {SKIPPED[n]})" for n in unknown if n in SKIPPED) + f"; ops with one: {', '.join(CASES)}")

    if args.worker:
        run_worker(args.worker, names, sizes, rounds, args.results)
        return

    if "OPFORGE_CACHE_DIR" not in os.environ:
        cache = tempfile.mkdtemp(prefix="opforge-bench-kernels-")
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
        os.environ["OPFORGE_CACHE_DIR"] = cache
    import platform

    import opforge
    import torch

    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    print(f"opforge {opforge.__version__}, NumPy {np.__version__} ({blas.get('name')} {blas.get('version')}), "
          f"torch {torch.__version__}, Python {platform.python_version()}; {all_threads()} cores, "
          f"{', '.join(k for k, v in opforge.cpu_features().items() if v)}")
    print(f"median of {rounds} rounds per op{' (--quick: tiny inputs, figures mean nothing)' if args.quick else ''}; "
          f"'vs best' is opforge's time over the best peer's (lower is better); '!' marks a peer whose result "
          f"differs from opforge's")
    missing = uncovered_ops()
    if missing:
        print(f"warning: built-in ops without a case here: {', '.join(missing)}")
    del opforge, torch

    rows = []
    with tempfile.TemporaryDirectory(prefix="opforge-bench-kernels-results-") as folder:
        for threads in args.threads:
            env = dict(os.environ)
            for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPFORGE_NUM_THREADS"):
                env[var] = str(threads)
            env.pop("OPFORGE_BLAS_THREADS", None)  # opforge's OpenBLAS on one thread: the pool multiplies
            # NumPy's OpenBLAS threads sleep right after a call instead of polling ~0.1 s into the next
            # contender's sample (they halved opforge's two-thread matmul right after NumPy's)
            env.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
            env.setdefault("GOMP_SPINCOUNT", "10000")  # the same for torch's OpenMP (libgomp) threads
            results = Path(folder) / f"{threads}.json"
            command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(threads), "--results",
                       str(results), "--rounds", str(rounds), "--ops", ",".join(names)]
            sys.stdout.flush()
            subprocess.run(command + (["--quick"] if args.quick else []), env=env, check=True)
            rows += json.loads(results.read_text())
    summarize(rows, args.threads, names, sizes)


def summarize(rows, thread_counts, names, sizes):
    by = {(row["op"], row["threads"]): row for row in rows}
    print("\nopforge's time over the best peer's, per thread count (lower is better; n/a: no peer)")
    print(f"{'op':26s}" + "".join(f" {threads_label(t):>11s}" for t in thread_counts))
    for name in names:
        cells = []
        for t in thread_counts:
            row = by[(name, t)]
            r = ratio(row)
            cells.append("error" if "error" in row else f"{r:.2f}" if r is not None else "n/a")
        print(f"{name:26s}" + "".join(f" {c:>11s}" for c in cells))

    errors = [row for row in rows if "error" in row]
    if errors:
        print(f"\nfailed: {', '.join(sorted({row['op'] for row in errors}))}")

    matmul = [by[("matmul", t)] for t in thread_counts if ("matmul", t) in by]
    matmul = [row for row in matmul if "error" not in row and "numpy" in row["times"]]
    if matmul:
        # GFLOP/s ratio: NumPy's time over opforge's
        worst = min(matmul, key=lambda row: row["times"]["numpy"] / row["times"]["opforge"])
        gf = {who: worst["flops"] / worst["times"][who] / 1e9 for who in ("opforge", "numpy")}
        size = "" if sizes.matmul == 1024 else f"; --quick: {sizes.matmul}^2, not 1024^2"
        print(f"\nmatmul1024_vs_numpy_gflops: {gf['opforge'] / gf['numpy']:.3f} ({threads_label(worst['threads'])}: "
              f"opforge {gf['opforge']:.1f}, NumPy {gf['numpy']:.1f} GFLOP/s{size})")
    else:
        print("\nmatmul1024_vs_numpy_gflops: n/a (matmul not measured)")
    rated = [(ratio(row), row["op"], row["threads"]) for row in rows if ratio(row) is not None]
    if rated:
        r, op, threads = max(rated)
        print(f"worst_kernel_vs_best_peer: {r:.3f} ({op}, {threads_label(threads)})")
    else:
        print("worst_kernel_vs_best_peer: n/a (no op with a peer measured)")


if __name__ == "__main__":
    main()
