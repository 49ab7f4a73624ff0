"""Converters of ONNX's recurrent ops: LSTM, GRU and RNN (from opset 7;
``layout`` from opset 14).

Each node becomes existing ops unrolled over time, so the sequence length
(X's time dim) must be known when the node converts; when it is not, the
converter raises ``node.unknown`` and ``load`` converts the model once per
input signature, where it is.  X·Wᵀ of every step and direction is one
matmul before the loop, the biases Wb + Rb added to it once (under GRU's
``linear_before_reset`` the reset gate scales H·Rhᵀ + Rbh, so Rbh stays in
the step); a step adds only the recurrent product H·Rᵀ and the gates.

``sequence_lens`` masks the steps past a sequence's end with where: the
state stays as it was and Y is 0 there, so Y_h and Y_c are each sequence's
state at its last step, and a reverse pass, which walks t from the end,
starts each sequence at its own last element.  Lengths known at load time
drop the mask of every step all sequences take, and skip the steps none
takes; lengths computed at run time mask every step.  An absent initial
state is zeros: the first step then has no recurrent product.

``activations`` take the ONNX names (case-insensitive): Sigmoid, Tanh, Relu,
Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign,
Softplus; ``activation_alpha`` / ``activation_beta`` are consumed in order
by the activations that take them (each takes its ONNX default when the
list runs out); a bidirectional node names both directions'.  ``clip`` bounds every gate's input to its activation.
float16 and bfloat16 compute in float32 and are cast back.

onnxruntime's com.microsoft DynamicQuantizeLSTM (the LSTM ``quantize_dynamic`` writes) takes W and R as
int8 / uint8, transposed ([directions, input or hidden, 4 * hidden]), with scales and zero points per
direction or per column: they are dequantized, transposed into LSTM's layout, and the node converts as an
LSTM in float.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from ..spec import UNKNOWN_RANK
from .elementwise import FLOATS, dims_of, dtype_of, exponential_linear, scalar, softplus, softsign
from .registry import converter

if TYPE_CHECKING:
    from .registry import NodeContext

ops = opforge.ops
Activation = Callable[[Any], Any]

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


# -- activations ---------------------------------------------------------------------

def _affine(node: NodeContext, x: Any, alpha: float, beta: float) -> Any:
    return ops.add(ops.mul(x, scalar(alpha, x)), scalar(beta, x))


def _thresholded_relu(node: NodeContext, x: Any, alpha: float, beta: float) -> Any:
    return ops.where(ops.greater(x, scalar(alpha, x)), x, scalar(0, x))


def _scaled_tanh(node: NodeContext, x: Any, alpha: float, beta: float) -> Any:
    return ops.mul(ops.tanh(ops.mul(x, scalar(beta, x))), scalar(alpha, x))


# lower-case name -> (fn(node, x, alpha, beta), default alpha or None (takes none), default beta or None)
ACTIVATIONS: dict[str, tuple[Callable[[NodeContext, Any, float, float], Any], float | None, float | None]] = {
    "sigmoid": (lambda node, x, a, b: ops.sigmoid(x), None, None),
    "tanh": (lambda node, x, a, b: ops.tanh(x), None, None),
    "relu": (lambda node, x, a, b: ops.relu(x), None, None),
    "affine": (_affine, 1.0, 0.0),
    "leakyrelu": (lambda node, x, a, b: ops.leaky_relu(x, alpha=a), 0.01, None),
    "thresholdedrelu": (_thresholded_relu, 1.0, None),
    "scaledtanh": (_scaled_tanh, 1.0, 1.0),
    "hardsigmoid": (lambda node, x, a, b: ops.hard_sigmoid(x, alpha=a, beta=b), 0.2, 0.5),
    "elu": (lambda node, x, a, b: exponential_linear(x, a), 1.0, None),
    "softsign": (lambda node, x, a, b: softsign(node, x), None, None),
    "softplus": (lambda node, x, a, b: softplus(node, x), None, None),
}


def bound(node: NodeContext, fn: Callable[[NodeContext, Any, float, float], Any], alpha: float | None,
          beta: float | None) -> Activation:
    """fn as a function of x alone, its alpha and beta fixed (0 where it takes none)."""
    return lambda x: fn(node, x, alpha or 0.0, beta or 0.0)


def activations(node: NodeContext, directions: int, kind: str | None = None) -> list[list[Activation]]:
    """The activation functions of each direction, in the op's order (LSTM f, g, h; GRU f, g; RNN f);
    ``kind`` is the op's (LSTM, GRU or RNN), the node's type by default."""
    kind = kind or node.op_type
    default = DEFAULT_ACTIVATIONS[kind]
    names = list(node.attr("activations", []) or default * directions)
    if len(names) != len(default) * directions:
        raise node.error(f"attribute 'activations' has {len(names)} names; {kind} takes {len(default)} per "
                         f"direction ({', '.join(default)}), {len(default) * directions} here")
    alphas = [float(a) for a in node.attr("activation_alpha", [])]
    betas = [float(b) for b in node.attr("activation_beta", [])]
    chosen: list[Activation] = []
    for name in names:
        entry = ACTIVATIONS.get(str(name).lower())
        if entry is None:
            raise node.error(f"activation {name!r} is not supported (supported: Sigmoid, Tanh, Relu, Affine, "
                             "LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus)")
        fn, alpha, beta = entry
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        chosen.append(bound(node, fn, alpha, beta))
    per = len(default)
    return [chosen[d * per:(d + 1) * per] for d in range(directions)]


# -- small helpers ---------------------------------------------------------------------

def plus(a: Any, b: Any) -> Any:
    """a + b, where None is zero."""
    return a if b is None else b if a is None else ops.add(a, b)


def times(a: Any, b: Any) -> Any:
    """a * b, where None is zero."""
    return None if a is None or b is None else ops.mul(a, b)


def columns(x: Any, start: int, end: int) -> Any:
    """x[:, start:end] of a 2-D x (a 1-D x: x[start:end])."""
    return ops.slice(x, starts=[start], ends=[end], axes=[-1])


def direction_of(x: Any, d: int) -> Any:
    """x[d] of a tensor whose first dim is the direction."""
    return ops.squeeze(ops.slice(x, starts=[d], ends=[d + 1], axes=[0]), axes=[0])


def empty_to_zero(lens: Any, state: Any) -> Any:
    """state, with the rows of sequences of length 0 zeroed (as onnxruntime gives them, not the initial state)."""
    if isinstance(lens, np.ndarray):
        return state if lens.all() else ops.where(lens.reshape(-1, 1) > 0, state, scalar(0, state))
    running = ops.unsqueeze(ops.greater(lens, np.zeros((), dtype_of(lens))), axes=[1])
    return ops.where(running, state, scalar(0, state))


class Masks:
    """Which sequences take step t: None (all of them), False (none), or a [batch, 1] bool tensor."""

    def __init__(self, lens: Any) -> None:
        self.lens = lens

    def __call__(self, t: int) -> Any:
        lens = self.lens
        if lens is None:
            return None
        if isinstance(lens, np.ndarray):
            running = lens > t
            return None if running.all() else False if not running.any() else running.reshape(-1, 1)
        return ops.unsqueeze(ops.greater(lens, np.asarray(t, dtype_of(lens))), axes=[1])


# -- the cells: one step's new state from xw (X·Wᵀ + biases of the step) and the previous state --

class Cell:
    """One direction's weights and activations; ``step(xw, h, c)`` -> (h, c) (c None but for LSTM).
    ``h`` / ``c`` None are zeros (the first step without an initial state)."""

    def __init__(self, node: NodeContext, hidden: int, r: Any, rbh: Any, p: Any, fns: list[Activation]) -> None:
        self.node, self.hidden, self.fns = node, hidden, fns
        self.r = ops.transpose(r, perm=[1, 0])  # [hidden, gates * hidden]
        self.rbh = rbh  # GRU with linear_before_reset: Rbh, [hidden] (None without B)
        self.p = p  # LSTM peepholes, [3 * hidden] (i, o, f), or None
        clip = node.attr("clip")
        self.clip = None if clip is None else float(clip)

    def gate(self, x: Any, k: int) -> Any:
        return columns(x, k * self.hidden, (k + 1) * self.hidden)

    def bounded(self, x: Any) -> Any:
        return x if self.clip is None else ops.clip(x, min=-self.clip, max=self.clip)

    def recurrent(self, h: Any, r: Any) -> Any:
        return None if h is None else ops.matmul(h, r)

    def step(self, xw: Any, h: Any, c: Any) -> tuple[Any, Any]:
        raise NotImplementedError


class RNNCell(Cell):
    def step(self, xw: Any, h: Any, c: Any) -> tuple[Any, Any]:
        (f,) = self.fns
        return f(self.bounded(plus(xw, self.recurrent(h, self.r)))), None


class LSTMCell(Cell):
    def step(self, xw: Any, h: Any, c: Any) -> tuple[Any, Any]:
        f, g, act_h = self.fns
        gates = plus(xw, self.recurrent(h, self.r))
        i, o, forget, candidate = (self.gate(gates, k) for k in range(4))
        p = self.p
        if p is not None:
            i = plus(i, times(self.gate(p, 0), c))
            forget = plus(forget, times(self.gate(p, 2), c))
        i = f(self.bounded(i))
        if self.node.attr("input_forget", 0):
            forget = ops.sub(scalar(1, i), i)
        else:
            forget = f(self.bounded(forget))
        new_c = plus(ops.mul(i, g(self.bounded(candidate))), times(forget, c))
        if p is not None:
            o = ops.add(o, ops.mul(self.gate(p, 1), new_c))
        new_h = ops.mul(f(self.bounded(o)), act_h(new_c))
        return new_h, new_c


class GRUCell(Cell):
    def step(self, xw: Any, h: Any, c: Any) -> tuple[Any, Any]:
        f, g = self.fns
        size = self.hidden
        if self.node.attr("linear_before_reset", 0):
            recurrent = self.recurrent(h, self.r)  # [batch, 3 * hidden]: z, r and h's H·Rhᵀ at once
            z = f(self.bounded(plus(self.gate(xw, 0), None if h is None else self.gate(recurrent, 0))))
            reset = f(self.bounded(plus(self.gate(xw, 1), None if h is None else self.gate(recurrent, 1))))
            linear = plus(None if h is None else self.gate(recurrent, 2), self.rbh)
            candidate = g(self.bounded(plus(self.gate(xw, 2), times(reset, linear))))
        else:
            recurrent = self.recurrent(h, columns(self.r, 0, 2 * size))  # z and r
            z = f(self.bounded(plus(self.gate(xw, 0), None if h is None else self.gate(recurrent, 0))))
            reset = f(self.bounded(plus(self.gate(xw, 1), None if h is None else self.gate(recurrent, 1))))
            reset_h = self.recurrent(times(reset, h), columns(self.r, 2 * size, 3 * size))
            candidate = g(self.bounded(plus(self.gate(xw, 2), reset_h)))
        if h is None:  # (1 - z) * candidate
            return ops.sub(candidate, ops.mul(z, candidate)), None
        return ops.add(candidate, ops.mul(z, ops.sub(h, candidate))), None  # (1 - z) * candidate + z * h


CELLS: dict[str, type[Cell]] = {"LSTM": LSTMCell, "GRU": GRUCell, "RNN": RNNCell}


# -- the unrolled node -----------------------------------------------------------------

def recurrent_node(node: NodeContext, x: Any, w: Any, r: Any, b: Any, lens: Any, h0: Any,
                   c0: Any = None, p: Any = None, kind: str | None = None) -> tuple[Any, ...]:
    """The outputs of an LSTM, GRU or RNN node (``kind``; the node's type by default)."""
    kind = kind or node.op_type
    gates = GATES[kind]
    layout = int(node.attr("layout", 0))  # (from opset 14; the loader refuses it before)
    if layout not in (0, 1):
        raise node.error(f"attribute 'layout' is {layout}; it must be 0 or 1")
    direction = node.attr("direction", "forward")
    if direction not in DIRECTIONS:
        raise node.error(f"attribute 'direction' is {direction!r}; it must be 'forward', 'reverse' or "
                         "'bidirectional'")
    directions = DIRECTIONS[direction]
    fns = activations(node, directions, kind)
    dtype = dtype_of(x)
    if dtype not in FLOATS + ("float16", "bfloat16"):
        raise node.error(f"input 'X' has dtype {dtype}; {kind} takes floating-point tensors")
    for name, value in (("W", w), ("R", r), ("B", b), ("initial_h", h0), ("initial_c", c0), ("P", p)):
        if value is not None and dtype_of(value) != dtype:
            raise node.error(f"input '{name}' has dtype {dtype_of(value)}; X's is {dtype}")
    if lens is not None and dtype_of(lens) not in ("int32", "int64"):
        raise node.error(f"input 'sequence_lens' has dtype {dtype_of(lens)}; it must be int32")
    compute = dtype if dtype in FLOATS else "float32"
    if compute != dtype:
        x, w, r, b, h0, c0, p = (None if v is None else ops.cast(v, dtype=compute) for v in (x, w, r, b, h0, c0, p))

    x_dims, w_dims, r_dims = dims_of(x), dims_of(w), dims_of(r)
    if x_dims == UNKNOWN_RANK or len(x_dims) != 3:
        raise node.unknown(f"{kind} needs X's rank (3) known when the node converts") if x_dims == UNKNOWN_RANK \
            else node.error(f"input 'X' has shape {list(x_dims)}; it must be 3-D")
    steps = x_dims[1 if layout else 0]
    if steps == -1:
        raise node.unknown(f"{kind} is unrolled over time, so it needs X's sequence length (dim "
                           f"{1 if layout else 0}) known; it is known only at run time here")
    if steps == 0:
        raise node.error("input 'X' has no time steps (its sequence length is 0)")
    hidden = node.attr("hidden_size")
    if hidden is None:
        if r_dims == UNKNOWN_RANK or r_dims[-1] == -1:
            raise node.unknown("attribute 'hidden_size' is absent and R's shape is unknown")
        hidden = r_dims[-1]
    hidden = int(hidden)
    expected = {"W": (directions, gates * hidden, -1), "R": (directions, gates * hidden, hidden)}
    for name, dims in (("W", w_dims), ("R", r_dims)):
        want = expected[name]
        if dims != UNKNOWN_RANK and (len(dims) != 3 or any(-1 not in (a, e) and a != e for a, e in zip(dims, want))):
            shown = [e if e != -1 else "input_size" for e in want]
            raise node.error(f"input '{name}' has shape {list(dims)}; it must be {shown} (direction "
                             f"{direction!r}, hidden_size {hidden}, {gates} gate(s))")
    if layout:  # batch first: [batch, seq, input] and states [batch, directions, hidden]
        x = ops.transpose(x, perm=[1, 0, 2])
        h0, c0 = (None if v is None else ops.transpose(v, perm=[1, 0, 2]) for v in (h0, c0))
    width = gates * hidden

    # X·Wᵀ of every step and direction: [seq, batch, directions * gates * hidden]
    w_all = ops.reshape(ops.transpose(w, perm=[2, 0, 1]), shape=[-1, directions * width])
    xw = ops.matmul(x, ops.unsqueeze(w_all, axes=[0]))
    rbh = [None] * directions
    if b is not None:
        wb, rb = columns(b, 0, width), columns(b, width, 2 * width)
        if kind == "GRU" and node.attr("linear_before_reset", 0):
            bias = ops.concat([ops.add(columns(wb, 0, 2 * hidden), columns(rb, 0, 2 * hidden)),
                               columns(wb, 2 * hidden, 3 * hidden)], axis=1)
            rbh = [direction_of(columns(rb, 2 * hidden, 3 * hidden), d) for d in range(directions)]
        else:
            bias = ops.add(wb, rb)
        xw = ops.add(xw, ops.reshape(bias, shape=[directions * width]))

    masks = Masks(lens)
    batch = x_dims[0 if layout else 1] if lens is None or not isinstance(lens, np.ndarray) else lens.shape[0]
    outputs: list[list[Any]] = []
    final_h: list[Any] = []
    final_c: list[Any] = []
    for d in range(directions):
        cell = CELLS[kind](node, hidden, direction_of(r, d), rbh[d], None if p is None else direction_of(p, d),
                           fns[d])
        h = None if h0 is None else direction_of(h0, d)
        c = None if c0 is None else direction_of(c0, d)
        ys: list[Any] = [None] * steps
        backward = direction == "reverse" or d == 1
        for t in (reversed(range(steps)) if backward else range(steps)):
            running = masks(t)
            if running is False:  # no sequence takes this step (lengths known: so is the batch)
                ys[t] = np.zeros((batch, hidden), compute)
                continue
            step_xw = ops.squeeze(ops.slice(xw, starts=[t, d * width], ends=[t + 1, (d + 1) * width], axes=[0, 2]),
                                  axes=[0])
            new_h, new_c = cell.step(step_xw, h, c)
            if running is None:
                h, c, ys[t] = new_h, new_c, new_h
                continue
            zero = scalar(0, new_h)
            ys[t] = ops.where(running, new_h, zero)
            h = ops.where(running, new_h, zero if h is None else h)
            if new_c is not None:
                c = ops.where(running, new_c, zero if c is None else c)
        if h is None or (kind == "LSTM" and c is None):  # every step skipped, no initial state
            h = np.zeros((batch, hidden), compute) if h is None else h
            c = np.zeros((batch, hidden), compute) if kind == "LSTM" and c is None else c
        if lens is not None and (h0 is not None or c0 is not None):  # an empty sequence's states are 0
            h, c = (None if v is None else empty_to_zero(lens, v) for v in (h, c))
        outputs.append(ys)
        final_h.append(h)
        final_c.append(c)

    wanted = [bool(name) for name in node.output_names]
    results: list[Any] = [None] * len(wanted)
    if wanted and wanted[0]:
        results[0] = sequence_output(outputs, layout)
    for k, finals in ((1, final_h), (2, final_c)):
        if k < len(wanted) and wanted[k]:
            axis = 1 if layout else 0
            results[k] = concat([ops.unsqueeze(v, axes=[axis]) for v in finals], axis)
    if compute != dtype:
        results = [None if v is None else ops.cast(v, dtype=dtype) for v in results]
    return tuple(results)


def concat(values: Sequence[Any], axis: int) -> Any:
    return values[0] if len(values) == 1 else ops.concat(list(values), axis=axis)


def sequence_output(outputs: list[list[Any]], layout: int) -> Any:
    """Y from each direction's per-step outputs: [seq, directions, batch, hidden] (layout 1: [batch, seq,
    directions, hidden])."""
    time_axis, direction_axis = (1, 2) if layout else (0, 1)
    axes = [1, 2] if layout else [0, 1]
    steps = [concat([ops.unsqueeze(ys[t], axes=axes) for ys in outputs], direction_axis)
             for t in range(len(outputs[0]))]
    return concat(steps, time_axis)


@converter("RNN", since=7)
@converter("RNN", since=14)  # layout
def rnn(node: NodeContext, x: Any, w: Any, r: Any, b: Any = None, sequence_lens: Any = None,
        initial_h: Any = None) -> Any:
    return recurrent_node(node, x, w, r, b, sequence_lens, initial_h)


@converter("GRU", since=7)
@converter("GRU", since=14)  # layout
def gru(node: NodeContext, x: Any, w: Any, r: Any, b: Any = None, sequence_lens: Any = None,
        initial_h: Any = None) -> Any:
    return recurrent_node(node, x, w, r, b, sequence_lens, initial_h)


@converter("LSTM", since=7)
@converter("LSTM", since=14)  # layout
def lstm(node: NodeContext, x: Any, w: Any, r: Any, b: Any = None, sequence_lens: Any = None,
         initial_h: Any = None, initial_c: Any = None, p: Any = None) -> Any:
    return recurrent_node(node, x, w, r, b, sequence_lens, initial_h, initial_c, p)


# -- com.microsoft DynamicQuantizeLSTM ----------------------------------------------------------------

QUANTIZED_WEIGHTS = ("int8", "uint8")


def dequantized(node: NodeContext, q: Any, scale: Any, zero_point: Any, name: str, dtype: str) -> Any:
    """(q - zero_point) * scale of DynamicQuantizeLSTM's W or R ([directions, rows, 4 * hidden]), in ``dtype``,
    transposed into ONNX LSTM's layout [directions, 4 * hidden, rows].  The scale and zero point are per
    direction ([directions]) or per column ([directions, 4 * hidden]).  q - zero_point is an integer of at
    most 9 bits, exact in any float; the product is rounded once."""
    if dtype_of(q) not in QUANTIZED_WEIGHTS:
        raise node.error(f"input '{name}' has dtype {dtype_of(q)}; it must be int8 or uint8")
    if dtype_of(zero_point) != dtype_of(q):
        raise node.error(f"input '{name}_zero_point' has dtype {dtype_of(zero_point)}; {name}'s is {dtype_of(q)}")
    if dtype_of(scale) not in FLOATS + ("float16",):
        raise node.error(f"input '{name}_scale' has dtype {dtype_of(scale)}; it must be float32 (or float16, "
                         "float64)")
    q_dims = dims_of(q)
    if q_dims == UNKNOWN_RANK or len(q_dims) != 3:
        raise node.error(f"input '{name}' has shape {list(q_dims) if q_dims != UNKNOWN_RANK else 'unknown'}; it "
                         f"must be 3-D [num_directions, {'input' if name == 'W' else 'hidden'}_size, 4*hidden_size]")
    directions, width = q_dims[0], q_dims[2]
    scale_dims = node.static_shape(scale, f"input '{name}_scale'")
    zp_dims = node.static_shape(zero_point, f"input '{name}_zero_point'")
    per_column = len(scale_dims) == 2
    fits = (len(scale_dims) in (1, 2) and zp_dims == scale_dims and directions in (-1, scale_dims[0])
            and (not per_column or width in (-1, scale_dims[1])))
    if not fits:
        raise node.error(f"inputs '{name}_scale' and '{name}_zero_point' have shapes {list(scale_dims)} and "
                         f"{list(zp_dims)}; they must both be [num_directions] (per direction) or [num_directions, "
                         f"4*hidden_size] (per column), {name} being {list(q_dims)}")
    broadcast = [-1, 1, scale_dims[1] if per_column else 1]
    parts = (q, scale, zero_point)
    if all(isinstance(v, np.ndarray) for v in parts):  # initializers, as quantize_dynamic writes them
        shifted = q.astype(np.int32) - zero_point.astype(np.int32).reshape(broadcast)
        w = (shifted.astype(np.float64) * scale.astype(np.float64).reshape(broadcast)).astype(dtype_of(scale))
        w = w.transpose(0, 2, 1)
        return w if w.dtype.name == dtype else w.astype(dtype)
    shifted = ops.sub(ops.cast(q, dtype="float32"), ops.reshape(ops.cast(zero_point, dtype="float32"),
                                                                 shape=broadcast))
    if dtype_of(scale) != "float32":
        shifted = ops.cast(shifted, dtype=dtype_of(scale))
    w = ops.transpose(ops.mul(shifted, ops.reshape(scale, shape=broadcast)), perm=[0, 2, 1])
    return w if dtype_of(scale) == dtype else ops.cast(w, dtype=dtype)


@converter("DynamicQuantizeLSTM", domain="com.microsoft", since=1)
def dynamic_quantize_lstm(node: NodeContext, x: Any, w: Any, r: Any, b: Any = None, sequence_lens: Any = None,
                          initial_h: Any = None, initial_c: Any = None, p: Any = None, w_scale: Any = None,
                          w_zero_point: Any = None, r_scale: Any = None, r_zero_point: Any = None) -> Any:
    """onnxruntime's LSTM on 8-bit weights (what ``onnxruntime.quantization.quantize_dynamic`` makes of an
    LSTM): W [directions, input, 4 * hidden] and R [directions, hidden, 4 * hidden], quantized per direction
    or per column, are dequantized (at load time when they are initializers) and the node runs as a float
    LSTM.  onnxruntime also quantizes X and H to uint8 at each product, which opforge does not: its outputs
    differ from opforge's by that rounding."""
    for name, value in (("W_scale", w_scale), ("W_zero_point", w_zero_point), ("R_scale", r_scale),
                        ("R_zero_point", r_zero_point)):
        if value is None:
            raise node.error(f"input '{name}' is missing")
    dtype = dtype_of(x)
    if dtype not in FLOATS + ("float16", "bfloat16"):
        raise node.error(f"input 'X' has dtype {dtype}; DynamicQuantizeLSTM takes floating-point tensors")
    w = dequantized(node, w, w_scale, w_zero_point, "W", dtype)
    r = dequantized(node, r, r_scale, r_zero_point, "R", dtype)
    return recurrent_node(node, x, w, r, b, sequence_lens, initial_h, initial_c, p, kind="LSTM")
