"""Converters of onnxruntime's contrib ops (domain com.microsoft), the fused ops its transformer
optimizer (``onnxruntime.transformers.optimizer``) writes into saved BERT and GPT-2 models, each
composed of opforge ops.  The semantics are onnxruntime 1.32's CPU kernels, which the tests compare
against.

Activations: Gelu (erf), FastGelu (tanh; an optional bias added first), BiasGelu, QuickGelu
(x * sigmoid(alpha * x), alpha 1.702), BiasSplitGelu ((x + bias) halved along the last dim, the left
half times gelu of the right) and BiasAdd (x + bias + skip).

Normalizations: SkipLayerNormalization (layer_norm of input + skip (+ bias); its optional outputs
mean, inv_std_var and that sum), SkipSimplifiedLayerNormalization (the same with RMS normalization;
its mean output is zeros, as onnxruntime leaves it), SimplifiedLayerNormalization (RMS
normalization, outputs y and inv_std_var), LayerNormalization and EmbedLayerNormalization (word,
position and optional segment embeddings gathered and added, then layer_norm; ``mask_index`` counts
the 1s of each row of the mask, as onnxruntime does, zeros without a mask).  onnxruntime defines
SimplifiedLayerNormalization and its own LayerNormalization (the one models of opsets before 17 use)
in the ai.onnx domain, where the optimizer writes them, so both are registered there from opset 1
and under com.microsoft too.  Epsilon defaults to 1e-12 for the Skip and Embed ops, 1e-5 otherwise.

FusedMatMul (and its older name TransposeMatMul) is MatMul with ``transA`` / ``transB`` (the last
two dims swapped), ``transBatchA`` / ``transBatchB`` (dim 0 moved behind the other batch dims:
perm 1..r-2, 0, r-1, before transA / transB) and ``alpha``.

Attention: the packed projection input @ weights + bias split into Q, K and V (by
``qkv_hidden_sizes``, else in three), each split into ``num_heads`` heads, softmax(Q K^T * scale +
mask) V, the heads merged again.  ``mask_index`` may be key lengths (B: right padding), end then
start positions (2B: left padding), or a raw 0/1 mask (B, T) or (B, S, T); as in onnxruntime the
mask is added to the scores, 0 where a key is kept and ``mask_filter_value`` (-10000) where it is
not (so a row whose keys are all masked attends to every key), and ``unidirectional`` sets the
scores of later keys to the float's lowest value.  ``past`` (2, B, N, P, head) goes before the keys
and values and ``present`` is returned; ``attention_bias`` is added to the scores.  Refused with a
ModelError: the (3B + 2) and 4-D masks (onnxruntime's CPU kernel has neither), rotary embeddings,
``past_present_share_buffer`` and the ``past_sequence_length`` input.

MultiHeadAttention: query, key and value already projected, as (B, S, H) tensors (key and value
also as (B, N, L, head) heads), or packed (query (B, S, N, 3, head), key (B, L, N, 2, head)); the
optional bias is added to the 3-D ones; ``key_padding_mask`` takes the lengths and raw masks above,
``past_key`` / ``past_value`` go before the keys and values (``present_key`` / ``present_value``
returned).  The ``qk`` output, ``cache_indirection`` and ``past_sequence_length`` are refused.

Splitting heads reshapes (B, S, H) into (B, S, N, head), which needs the batch or the sequence length
known; a mask or a causal mask needs S and the total length T known.  When they are not when the
model loads, the converter says so (``node.unknown``) and ``load`` converts the model again per
input signature, where every dim is known.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from ..builtins.common import zeros_like
from ..spec import UNKNOWN_RANK
from .elementwise import dims_of, dtype_of, ones_like, scalar
from .linear import matmul
from .nn import layer_normalization
from .registry import converter
from .rms_normalization import rms_normalized
from .shape import rank_of

if TYPE_CHECKING:
    from .registry import NodeContext

ops = opforge.ops
MS = "com.microsoft"
SKIP_EPSILON = 1e-12  # onnxruntime's default for SkipLayerNormalization and EmbedLayerNormalization
MASK_FILTER_VALUE = -10000.0


# -- activations ------------------------------------------------------------------------------------

@converter("Gelu", domain=MS, since=1)
def gelu(node: NodeContext, x: Any) -> Any:
    return ops.gelu(x)


@converter("BiasGelu", domain=MS, since=1)
def bias_gelu(node: NodeContext, x: Any, bias: Any) -> Any:
    return ops.gelu(ops.add(x, bias))


@converter("FastGelu", domain=MS, since=1)
def fast_gelu(node: NodeContext, x: Any, bias: Any = None) -> Any:
    return ops.gelu(x if bias is None else ops.add(x, bias), approximate="tanh")


@converter("QuickGelu", domain=MS, since=1)
def quick_gelu(node: NodeContext, x: Any) -> Any:
    alpha = float(node.attr("alpha", 1.702))
    return ops.mul(x, ops.sigmoid(ops.mul(x, scalar(alpha, x)) if alpha != 1.0 else x))


@converter("BiasSplitGelu", domain=MS, since=1)
def bias_split_gelu(node: NodeContext, x: Any, bias: Any) -> Any:
    width = node.static_shape(bias, "input 'bias'")
    if len(width) != 1 or width[0] % 2:
        raise node.error(f"input 'bias' has shape {list(width)}; BiasSplitGelu takes a 1-D bias of even length")
    half = width[0] // 2
    total = ops.add(x, bias)
    left = ops.slice(total, starts=[0], ends=[half], axes=[-1])
    right = ops.slice(total, starts=[half], ends=[2 * half], axes=[-1])
    return ops.mul(left, ops.gelu(right))


@converter("BiasAdd", domain=MS, since=1)
def bias_add(node: NodeContext, x: Any, bias: Any, skip: Any) -> Any:
    return ops.add(ops.add(x, bias), skip)


# -- normalizations ---------------------------------------------------------------------------------

# onnxruntime's LayerNormalization of the ai.onnx domain before opset 17 has ONNX's later attributes
# and outputs, so the opset-17 converter serves it (and the name under com.microsoft).
converter("LayerNormalization", since=1)(layer_normalization)
converter("LayerNormalization", domain=MS, since=1)(layer_normalization)


def zero_beta(gamma: Any, x: Any) -> Any:
    """Zeros of gamma's shape when it is known (layer_norm keeps its native kernel), else None."""
    dims = dims_of(gamma)
    return None if dims == UNKNOWN_RANK or -1 in dims else np.zeros(dims, dtype_of(x))


def skip_sum(x: Any, skip: Any, bias: Any) -> Any:
    total = ops.add(x, skip)
    return total if bias is None else ops.add(total, bias)


def inverse(rms: Any) -> Any:
    return ops.div(np.ones((), dtype_of(rms)), rms)


@converter("SkipLayerNormalization", domain=MS, since=1)
def skip_layer_normalization(node: NodeContext, x: Any, skip: Any, gamma: Any, beta: Any = None,
                             bias: Any = None) -> Any:
    total = skip_sum(x, skip, bias)
    y, mean, inv_std_var = ops.layer_norm(total, gamma, zero_beta(gamma, x) if beta is None else beta, axis=-1,
                                          epsilon=float(node.attr("epsilon", SKIP_EPSILON)))
    return y, mean, inv_std_var, total


@converter("SkipSimplifiedLayerNormalization", domain=MS, since=1)
def skip_simplified_layer_normalization(node: NodeContext, x: Any, skip: Any, gamma: Any, bias: Any = None) -> Any:
    total = skip_sum(x, skip, bias)
    y, rms = rms_normalized(node, total, gamma, -1, float(node.attr("epsilon", SKIP_EPSILON)))
    if node.num_outputs <= 1:
        return y
    return y, zeros_like(rms, dtype_of(rms)), inverse(rms), total


@converter("SimplifiedLayerNormalization", since=1)
@converter("SimplifiedLayerNormalization", domain=MS, since=1)
def simplified_layer_normalization(node: NodeContext, x: Any, scale: Any) -> Any:
    y, rms = rms_normalized(node, x, scale, int(node.attr("axis", -1)), float(node.attr("epsilon", 1e-5)))
    return y if node.num_outputs <= 1 else (y, inverse(rms))


def as_int(x: Any) -> Any:
    """An integer input (ids, a mask) as int32 or int64, which the comparison and index kernels take."""
    return x if dtype_of(x) in ("int32", "int64") else ops.cast(x, dtype="int32")


@converter("EmbedLayerNormalization", domain=MS, since=1)
def embed_layer_normalization(node: NodeContext, input_ids: Any, segment_ids: Any, word_embedding: Any,
                              position_embedding: Any, segment_embedding: Any, gamma: Any, beta: Any,
                              mask: Any = None, position_ids: Any = None) -> Any:
    for name, value in (("input_ids", input_ids), ("word_embedding", word_embedding),
                        ("position_embedding", position_embedding), ("gamma", gamma)):
        if value is None:
            raise node.error(f"input '{name}' is missing")
    if rank_of(node, input_ids, "input 'input_ids'") != 2:
        raise node.error(f"input 'input_ids' has shape {list(dims_of(input_ids))}; it must be (batch, sequence)")
    input_ids = as_int(input_ids)
    total = ops.gather(word_embedding, input_ids, axis=0)
    if position_ids is not None:
        positions = ops.gather(position_embedding, as_int(position_ids), axis=0)
    else:  # rows 0..S-1, broadcast over the batch
        seq, rows = dims_of(input_ids)[1], dims_of(position_embedding)[0]
        if seq != -1 and rows != -1 and seq > rows:
            raise node.error(f"the sequence length {seq} exceeds the {rows} rows of input 'position_embedding'")
        positions = (ops.slice(position_embedding, starts=[0], ends=[seq], axes=[0]) if seq != -1 else
                     ops.gather(position_embedding, ops.cumsum(ones_like(input_ids, dtype_of(input_ids)), axis=1,
                                                               exclusive=True), axis=0))
    total = ops.add(total, positions)
    if segment_ids is not None:
        if segment_embedding is None:
            raise node.error("input 'segment_ids' is given without input 'segment_embedding'")
        total = ops.add(total, ops.gather(segment_embedding, as_int(segment_ids), axis=0))
    y, _, _ = ops.layer_norm(total, gamma, zero_beta(gamma, total) if beta is None else beta, axis=-1,
                             epsilon=float(node.attr("epsilon", SKIP_EPSILON)))
    if node.num_outputs <= 1:
        return y
    ones = zeros_like(input_ids, "int32") if mask is None else \
        ops.cast(ops.equal(as_int(mask), scalar(1, as_int(mask))), dtype="int32")
    return y, ops.reduce_sum(ones, axes=[1]), total


# -- FusedMatMul ------------------------------------------------------------------------------------

def fused_operand(node: NodeContext, x: Any, batch: bool, last: bool, what: str) -> Any:
    """x transposed as FusedMatMul's transBatch* (dim 0 behind the batch dims) and trans* (the last two) say."""
    if not batch and not last:
        return x
    rank = rank_of(node, x, what)
    if rank < 2:
        return x
    perm = list(range(1, rank - 1)) + [0, rank - 1] if batch else list(range(rank))
    if last:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    return x if perm == sorted(perm) else ops.transpose(x, perm=perm)


@converter("FusedMatMul", domain=MS, since=1)
@converter("TransposeMatMul", domain=MS, since=1)
def fused_matmul(node: NodeContext, a: Any, b: Any) -> Any:
    a = fused_operand(node, a, bool(node.attr("transBatchA", 0)), bool(node.attr("transA", 0)), "input 'A'")
    b = fused_operand(node, b, bool(node.attr("transBatchB", 0)), bool(node.attr("transB", 0)), "input 'B'")
    y = matmul(node, a, b)
    alpha = float(node.attr("alpha", 1.0))
    return y if alpha == 1.0 else ops.mul(y, scalar(alpha, y))


# -- Attention, MultiHeadAttention ------------------------------------------------------------------

def one_unknown(node: NodeContext, shape: Sequence[int], what: str) -> list[int]:
    """A reshape target with its unknown entries (-1) checked: opforge's reshape infers one."""
    if sum(d < 0 for d in shape) > 1:
        raise node.unknown(f"reshaping {what} needs its batch size or sequence length known when the model is "
                           f"loaded")
    return [int(d) for d in shape]


def split_heads(node: NodeContext, t: Any, batch: int, seq: int, num_heads: int, head_size: int) -> Any:
    """(B, S, N * head) -> (B, N, S, head)."""
    shape = one_unknown(node, [batch, seq, num_heads, head_size], "the projections into heads")
    return ops.transpose(ops.reshape(t, shape=shape), perm=[0, 2, 1, 3])


def merge_heads(node: NodeContext, t: Any, batch: int, seq: int, width: int) -> Any:
    """(B, N, S, head) -> (B, S, N * head)."""
    shape = one_unknown(node, [batch, seq, width], "the heads into the output")
    return ops.reshape(ops.transpose(t, perm=[0, 2, 1, 3]), shape=shape)


def with_past(node: NodeContext, past: Any, current: Any, what: str) -> Any:
    """past (B, N, P, head) before current (B, N, S, head) along the sequence."""
    if past is None:
        return current
    if rank_of(node, past, what) != 4:
        raise node.error(f"{what} has shape {list(dims_of(past))}; it must be (batch, num_heads, past_sequence, "
                         f"head_size)")
    return ops.concat([past, current], axis=2)


def mask_bias(node: NodeContext, mask: Any, batch: int, seq: int, total: int, dtype: str,
              filter_value: float, what: str) -> Any:
    """The mask as an addend of the scores, (B, 1, 1 or S, T): 0 where a key is kept, filter_value where not."""
    mask = as_int(mask)
    dims = node.static_shape(mask, what)
    positions = np.arange(total, dtype=dtype_of(mask))
    if len(dims) == 1:
        if dims[0] == batch:  # key lengths: keys from each length on are padding
            keep = ops.less(positions, ops.reshape(mask, shape=[batch, 1]))
        elif dims[0] == 2 * batch:  # end positions, then start positions
            ends = ops.reshape(ops.slice(mask, starts=[0], ends=[batch], axes=[0]), shape=[batch, 1])
            starts = ops.reshape(ops.slice(mask, starts=[batch], ends=[2 * batch], axes=[0]), shape=[batch, 1])
            keep = ops.where(ops.less(positions, ends), ops.greater_equal(positions, starts), np.zeros((), bool))
        else:
            raise node.error(f"{what} has shape {list(dims)}; a 1-D mask holds {batch} key lengths or {2 * batch} "
                             f"end and start positions (the {3 * batch + 2} form is not supported)")
        keep = ops.reshape(keep, shape=[batch, 1, 1, total])
    elif len(dims) in (2, 3):
        expected = [batch, total] if len(dims) == 2 else [batch, seq, total]
        if list(dims) != expected:
            raise node.error(f"{what} has shape {list(dims)}; a {len(dims)}-D mask must be {expected}")
        keep = ops.unsqueeze(ops.greater(mask, scalar(0, mask)), axes=[1, 2] if len(dims) == 2 else [1])
    else:
        raise node.error(f"{what} has shape {list(dims)}; supported: (batch), (2 * batch), (batch, total_sequence) "
                         f"and (batch, sequence, total_sequence)")
    return ops.where(keep, np.zeros((), dtype), np.asarray(filter_value, dtype))


def causal(bias: Any, seq: int, total: int, past: int, dtype: str) -> Any:
    """bias with the scores of keys after each query set to the lowest value: query i sees keys 0..past + i."""
    allowed = np.arange(total)[None, :] <= past + np.arange(seq)[:, None]
    lowest = np.asarray(np.finfo(dtype).min, dtype)
    if bias is None:
        return np.where(allowed, np.zeros((), dtype), lowest)
    return ops.where(allowed, bias, lowest)


def attend(node: NodeContext, q: Any, k: Any, v: Any, mask: Any, attention_bias: Any, batch: int, seq: int,
           past: int, scale: float, what: str) -> Any:
    """softmax(q k^T * scale + mask + attention_bias) v of (B, N, S, head) queries and (B, N, T, head) keys
    and values, the first ``past`` of them from the past."""
    dtype = dtype_of(q)
    scores = ops.matmul(ops.mul(q, scalar(scale, q)), ops.transpose(k, perm=[0, 1, 3, 2]))
    unidirectional = bool(node.attr("unidirectional", 0))
    if mask is not None or unidirectional:
        total = dims_of(k)[2]
        if seq < 0 or total < 0 or past < 0 or (mask is not None and batch < 0):
            raise node.unknown(f"{what} and unidirectional need the batch size and the sequence lengths known when "
                               f"the model is loaded")
        filter_value = float(node.attr("mask_filter_value", MASK_FILTER_VALUE))
        bias = None if mask is None else mask_bias(node, mask, batch, seq, total, dtype, filter_value, what)
        if unidirectional:
            bias = causal(bias, seq, total, past, dtype)
        scores = ops.add(scores, bias)
    if attention_bias is not None:
        scores = ops.add(scores, attention_bias)
    return ops.matmul(ops.softmax(scores, axis=-1), v)


def head_count(node: NodeContext) -> int:
    num_heads = node.attr("num_heads")
    if not isinstance(num_heads, int) or num_heads < 1:
        raise node.error(f"attribute 'num_heads' is {num_heads!r}; it must be a positive int")
    return num_heads


def scale_of(node: NodeContext, head_size: int) -> float:
    scale = float(node.attr("scale", 0.0))
    return scale if scale != 0.0 else 1.0 / math.sqrt(head_size)


@converter("Attention", domain=MS, since=1)
def attention(node: NodeContext, x: Any, weights: Any, bias: Any = None, mask_index: Any = None, past: Any = None,
              attention_bias: Any = None, past_sequence_length: Any = None) -> Any:
    for name in ("do_rotary", "past_present_share_buffer"):
        if node.attr(name, 0):
            raise node.error(f"attribute '{name}' is set; opforge's Attention supports neither rotary embeddings "
                             f"nor a past buffer shared with present")
    if past_sequence_length is not None:
        raise node.error("input 'past_sequence_length' (for past_present_share_buffer) is not supported")
    num_heads = head_count(node)
    if rank_of(node, x, "input 'input'") != 3:
        raise node.error(f"input 'input' has shape {list(dims_of(x))}; it must be (batch, sequence, hidden)")
    w_dims = node.static_shape(weights, "input 'weights'")
    if len(w_dims) != 2:
        raise node.error(f"input 'weights' has shape {list(w_dims)}; it must be (input_hidden, 3 * hidden)")
    sizes = [int(s) for s in node.attr("qkv_hidden_sizes", [])] or [w_dims[1] // 3] * 3
    if (len(sizes) != 3 or sum(sizes) != w_dims[1] or sizes[0] != sizes[1]
            or any(s <= 0 or s % num_heads for s in sizes)):
        raise node.error(f"the Q, K and V hidden sizes {sizes} must be three positive multiples of num_heads "
                         f"{num_heads}, Q's equal to K's, adding up to the {w_dims[1]} columns of input 'weights'")
    batch, seq = dims_of(x)[:2]
    projected = matmul(node, x, weights)
    if bias is not None:
        projected = ops.add(projected, bias)
    starts = [0, sizes[0], sizes[0] + sizes[1]]
    q, k, v = (split_heads(node, ops.slice(projected, starts=[s], ends=[s + n], axes=[2]), batch, seq, num_heads,
                           n // num_heads) for s, n in zip(starts, sizes))
    present, past_length = None, 0
    if past is not None:
        if sizes[0] != sizes[2]:
            raise node.error(f"input 'past' needs equal Q, K and V hidden sizes; they are {sizes}")
        past_dims = dims_of(past)
        if past_dims == UNKNOWN_RANK or len(past_dims) != 5 or past_dims[0] != 2:
            raise node.error(f"input 'past' has shape {list(past_dims)}; it must be (2, batch, num_heads, "
                             f"past_sequence, head_size)")
        past_length = past_dims[3]
        k = with_past(node, ops.gather(past, np.asarray(0, np.int64), axis=0), k, "input 'past'")
        v = with_past(node, ops.gather(past, np.asarray(1, np.int64), axis=0), v, "input 'past'")
    if node.num_outputs > 1:
        present = ops.concat([ops.unsqueeze(k, axes=[0]), ops.unsqueeze(v, axes=[0])], axis=0)
    out = attend(node, q, k, v, mask_index, attention_bias, batch, seq, past_length,
                 scale_of(node, sizes[0] // num_heads), "input 'mask_index'")
    out = merge_heads(node, out, batch, seq, sizes[2])
    return out if present is None else (out, present)


@converter("MultiHeadAttention", domain=MS, since=1)
def multi_head_attention(node: NodeContext, query: Any, key: Any = None, value: Any = None, bias: Any = None,
                         key_padding_mask: Any = None, attention_bias: Any = None, past_key: Any = None,
                         past_value: Any = None, past_sequence_length: Any = None,
                         cache_indirection: Any = None) -> Any:
    if past_sequence_length is not None or cache_indirection is not None:
        raise node.error("inputs 'past_sequence_length' and 'cache_indirection' (buffer sharing, beam search) are "
                         "not supported")
    if node.num_outputs > 3:
        raise node.error("output 'qk' is not supported")
    num_heads = head_count(node)
    q_dims = dims_of(query)
    if q_dims == UNKNOWN_RANK or len(q_dims) not in (3, 5):
        raise node.error(f"input 'query' has shape {list(q_dims)}; it must be (batch, sequence, hidden) or packed "
                         f"(batch, sequence, num_heads, 3, head_size)")
    batch, seq = q_dims[:2]
    if len(q_dims) == 5:  # packed Q, K and V
        if key is not None or value is not None or bias is not None or q_dims[2:4] != (num_heads, 3):
            raise node.error(f"packed input 'query' of shape {list(q_dims)} must be (batch, sequence, {num_heads}, "
                             f"3, head_size), without key, value or bias")
        q, k, v = (ops.transpose(ops.gather(query, np.asarray(j, np.int64), axis=3), perm=[0, 2, 1, 3])
                   for j in range(3))
        head_size = q_dims[4]
    else:
        hidden = node.static_shape(query, "input 'query'")[2] if q_dims[2] < 0 else q_dims[2]
        if hidden % num_heads:
            raise node.error(f"the query's hidden size {hidden} is not a multiple of num_heads {num_heads}")
        head_size = hidden // num_heads
        if key is None:
            raise node.error("input 'key' is missing (only a packed 5-D query comes without it)")
        k_dims = dims_of(key)
        if k_dims == UNKNOWN_RANK or len(k_dims) not in (3, 4, 5):
            raise node.error(f"input 'key' has shape {list(k_dims)}; it must be (batch, kv_sequence, hidden), "
                             f"(batch, num_heads, kv_sequence, head_size) or packed (batch, kv_sequence, num_heads, "
                             f"2, head_size)")
        sizes = None
        if bias is not None:
            (width,) = node.static_shape(bias, "input 'bias'")
            v_hidden = width - 2 * hidden
            if v_hidden <= 0 or len(k_dims) != 3:
                raise node.error(f"input 'bias' of {width} elements needs 3-D query, key and value (hidden "
                                 f"{hidden}, {hidden}, and the rest)")
            sizes = [hidden, hidden, v_hidden]
            starts = [0, hidden, 2 * hidden]
            q_bias, k_bias, v_bias = (ops.slice(bias, starts=[s], ends=[s + n], axes=[0])
                                      for s, n in zip(starts, sizes))
            query, key = ops.add(query, q_bias), ops.add(key, k_bias)
            if value is not None:
                value = ops.add(value, v_bias)
        q = split_heads(node, query, batch, seq, num_heads, head_size)
        if len(k_dims) == 5:  # packed K and V
            if value is not None or k_dims[2:4] != (num_heads, 2):
                raise node.error(f"packed input 'key' of shape {list(k_dims)} must be (batch, kv_sequence, "
                                 f"{num_heads}, 2, head_size), without value")
            k, v = (ops.transpose(ops.gather(key, np.asarray(j, np.int64), axis=3), perm=[0, 2, 1, 3])
                    for j in range(2))
        elif value is None:
            raise node.error("input 'value' is missing")
        elif len(k_dims) == 4:  # heads already split
            k, v = key, value
        else:
            v_dims = dims_of(value)
            if v_dims == UNKNOWN_RANK or len(v_dims) != 3:
                raise node.error(f"input 'value' has shape {list(v_dims)}; with a 3-D key it must be (batch, "
                                 f"kv_sequence, v_hidden)")
            v_width = node.static_shape(value, "input 'value'")[2] if v_dims[2] < 0 else v_dims[2]
            if v_width % num_heads:
                raise node.error(f"the value's hidden size {v_width} is not a multiple of num_heads {num_heads}")
            kv_seq = k_dims[1]
            k = split_heads(node, key, batch, kv_seq, num_heads, head_size)
            v = split_heads(node, value, batch, kv_seq, num_heads, v_width // num_heads)
    k = with_past(node, past_key, k, "input 'past_key'")
    v = with_past(node, past_value, v, "input 'past_value'")
    past_length = 0 if past_key is None else dims_of(past_key)[2]
    out = attend(node, q, k, v, key_padding_mask, attention_bias, batch, seq, past_length, scale_of(node, head_size),
                 "input 'key_padding_mask'")
    v_head = dims_of(v)[3]
    out = merge_heads(node, out, batch, seq, num_heads * v_head if v_head >= 0 else -1)
    return out, k, v
