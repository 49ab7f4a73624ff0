"""SBP signatures (opforge.sbp): the kinds, derivation from traits, each built-in's declarations,
validation -- and every built-in signature checked numerically by running the op on shards."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from builtin_samples import every_builtin_op, normal, positive, small_ints
from helpers import declare

import opforge
from opforge import SchemaError, TensorSpec
from opforge import cli
from opforge.sbp import Signature, Split, broadcast, elementwise_splits, partial_sum, signatures, split

B, P = broadcast, partial_sum
S = split


def signature_strings(name, *specs, **attrs):
    return [str(s) for s in opforge.lookup(name).sbp_signatures(specs, attrs)]


# -- the kinds and Signature ------------------------------------------------------------

def test_kinds_print_as_oneflow_does_and_stay_themselves():
    assert [repr(S(0)), repr(B), repr(P)] == ["S(0)", "B", "P"]
    assert S(np.int64(2)) == Split(2) and type(S(np.int64(2)).axis) is int
    for kind in (B, P):
        assert copy.deepcopy(kind) is kind and pickle.loads(pickle.dumps(kind)) is kind
        assert type(kind)() is kind
    assert pickle.loads(pickle.dumps(S(-1))) == S(-1)
    for bad in ("0", 1.0, True):
        with pytest.raises(SchemaError, match="split"):
            S(bad)


def test_signature_is_a_frozen_mapping_in_the_ops_order():
    signature = Signature({"x": S(0), "w": B, "bias": None}, {"y": S(0)})
    assert str(signature) == "x:S(0), w:B, bias:None -> y:S(0)"
    assert signature.inputs == (S(0), B, None) and signature.outputs == (S(0),)
    assert signature.input_names == ("x", "w", "bias") and signature.output_names == ("y",)
    assert signature["w"] is B and len(signature) == 4 and list(signature) == ["x", "w", "bias", "y"]
    assert signature == {"x": S(0), "w": B, "bias": None, "y": S(0)}
    assert len({signature, Signature({"x": S(0), "w": B, "bias": None}, {"y": S(0)})}) == 1
    with pytest.raises(TypeError):
        signature["x"] = B


# -- derived from traits ------------------------------------------------------------------

def test_elementwise_splits_follow_numpy_broadcasting():
    # add of [4, 1, 3] and [3]: y is [4, 1, 3].  Axis 0: only a has it (b is B); axis 1: no input has a
    # non-1 dim, so splitting y there would compute it whole on each device (no signature); axis 2: both.
    a, b = TensorSpec([4, 1, 3]), TensorSpec([3])
    found = opforge.lookup("add").sbp_signatures([a, b])
    splits = [s for s in found if isinstance(s["y"], Split)]
    assert [(s["a"], s["b"], s["y"]) for s in splits] == [(S(0), B, S(0)), (S(2), S(0), S(2))]
    assert {"a": B, "b": B, "y": B} in found
    assert elementwise_splits((4, 1, 3), (3,)) == [(0, (S(0), B)), (2, (S(2), S(0)))]


def test_elementwise_with_unknown_ranks_and_dims():
    # Unknown rank: no splits, only all-broadcast (and add's partial sums, which need no shapes).
    assert signature_strings("relu", TensorSpec(None)) == ["x:B -> y:B"]
    assert signature_strings("add", TensorSpec(None), TensorSpec([3])) == ["a:P, b:P -> y:P", "a:B, b:B -> y:B"]
    # An unknown dim may be a broadcast 1: no split where another input has the axis too...
    assert signature_strings("maximum", TensorSpec([-1, 3]), TensorSpec([-1, 3])) == \
        ["a:S(1), b:S(1) -> y:S(1)", "a:B, b:B -> y:B"]
    # ...but an input alone on its axis splits whatever its size.
    assert signature_strings("maximum", TensorSpec([-1, 3]), TensorSpec([3])) == \
        ["a:S(0), b:B -> y:S(0)", "a:S(1), b:S(0) -> y:S(1)", "a:B, b:B -> y:B"]
    assert signature_strings("relu", TensorSpec([])) == ["x:B -> y:B"]  # 0-d: nothing to split


def test_traits_derive_signatures_for_a_users_op(fresh):
    both = declare(fresh, "t_sbp::both(Tensor a, Tensor b) -> Tensor y", traits=["no_side_effect", "elementwise"])
    assert [str(s) for s in both.sbp_signatures([TensorSpec([2, 4]), TensorSpec([2, 1])])] == \
        ["a:S(0), b:S(0) -> y:S(0)", "a:S(1), b:B -> y:S(1)", "a:B, b:B -> y:B"]
    pure = declare(fresh, "t_sbp::pure(Tensor x) -> Tensor y", traits=["no_side_effect"])
    assert [str(s) for s in pure.sbp_signatures([TensorSpec([2, 4])])] == ["x:B -> y:B"]
    effectful = declare(fresh, "t_sbp::effectful(Tensor x) -> Tensor y")
    assert effectful.sbp_signatures([TensorSpec([2, 4])]) == []


def test_elementwise_is_a_known_trait():
    assert "elementwise" in opforge.registry.TRAITS
    elementwise = {op.name for op in every_builtin_op() if "elementwise" in op.traits}
    assert {"add", "cast", "where", "relu_grad", "leaky_relu_grad", "less_equal", "mod"} <= elementwise
    assert not {"matmul", "reshape", "softmax", "reduce_sum"} & elementwise


# -- each explicit built-in declaration -------------------------------------------------------

def test_matmul_signatures():
    assert signature_strings("matmul", TensorSpec([4, 6]), TensorSpec([6, 8])) == [
        "a:S(0), b:B -> y:S(0)", "a:B, b:S(1) -> y:S(1)", "a:S(1), b:S(0) -> y:P",
        "a:P, b:B -> y:P", "a:B, b:P -> y:P", "a:B, b:B -> y:B"]
    # Batch dims split as elementwise ones do: both split on axis 0, only b on axis 1 (a's is 1).
    batched = signature_strings("matmul", TensorSpec([2, 1, 4, 6]), TensorSpec([2, 3, 6, 8]))
    assert batched[:3] == ["a:S(2), b:B -> y:S(2)", "a:B, b:S(3) -> y:S(3)", "a:S(3), b:S(2) -> y:P"]
    assert "a:S(0), b:S(0) -> y:S(0)" in batched and "a:B, b:S(1) -> y:S(1)" in batched
    # Unknown ranks keep the axes as written, from the end.
    assert signature_strings("matmul", TensorSpec(None), TensorSpec(None))[0] == "a:S(-2), b:B -> y:S(-2)"


@pytest.mark.parametrize("keep_dims, kept", [(False, ["x:S(0) -> y:S(0)", "x:S(2) -> y:S(1)"]),
                                             (True, ["x:S(0) -> y:S(0)", "x:S(2) -> y:S(2)"])])
def test_reduce_sum_signatures(keep_dims, kept):
    assert signature_strings("reduce_sum", TensorSpec([4, 2, 6]), axes=[-2], keep_dims=keep_dims) == \
        kept + ["x:S(1) -> y:P", "x:P -> y:P", "x:B -> y:B"]
    # No axes: every axis reduced, every split gives partial sums.
    assert signature_strings("reduce_sum", TensorSpec([4, 2])) == \
        ["x:S(0) -> y:P", "x:S(1) -> y:P", "x:P -> y:P", "x:B -> y:B"]
    assert signature_strings("reduce_sum", TensorSpec(None), axes=[1]) == ["x:P -> y:P", "x:B -> y:B"]


def test_mean_transpose_softmax_reshape_cast_signatures():
    assert signature_strings("mean", TensorSpec([4, 2, 6]), axes=[0, 2]) == ["x:S(1) -> y:S(0)", "x:B -> y:B"]
    assert signature_strings("transpose", TensorSpec([2, 4, 6]), perm=[2, 0, 1]) == \
        ["x:S(2) -> y:S(0)", "x:S(0) -> y:S(1)", "x:S(1) -> y:S(2)", "x:B -> y:B"]
    assert signature_strings("transpose", TensorSpec([2, 4, 6])) == \
        ["x:S(0) -> y:S(0)", "x:S(2) -> y:S(1)", "x:S(1) -> y:S(2)", "x:B -> y:B"]
    assert signature_strings("softmax", TensorSpec([4, 2, 6]), axis=-2) == \
        ["x:S(0) -> y:S(0)", "x:S(2) -> y:S(2)", "x:B -> y:B"]
    assert signature_strings("reshape", TensorSpec([4, 2]), shape=[8]) == ["x:B -> y:B"]
    # cast keeps partial sums only from float to float.
    assert "x:P -> y:P" in signature_strings("cast", TensorSpec([4], "float64"), dtype="float32")
    assert "x:P -> y:P" not in signature_strings("cast", TensorSpec([4], "float64"), dtype="int32")
    assert "x:P -> y:P" not in signature_strings("cast", TensorSpec([4], "int32"), dtype="float32")
    # Mixed dtypes or bools do not add up: no partial sums.
    assert "a:P, b:P -> y:P" not in signature_strings("add", TensorSpec([4], "int32"), TensorSpec([4], "float32"))
    assert "a:P, b:P -> y:P" not in signature_strings("add", TensorSpec([4], "bool"), TensorSpec([4], "bool"))


# -- declaring and validation ------------------------------------------------------------------

def test_a_static_list_and_a_function_declare_signatures(fresh):
    scale = declare(fresh, "t_sbp::scale(Tensor x, *, float factor=2.0) -> Tensor y", traits=["no_side_effect"])
    scale.def_infer(opforge.infer.same_as(0))  # (a split output's axis is checked against its inferred rank)
    declared = [{"x": P, "y": P}, {"x": S(-1), "y": S(-1)}]
    assert scale.sbp(declared) is declared
    assert [str(s) for s in scale.sbp_signatures([TensorSpec([2, 4])])] == \
        ["x:P -> y:P", "x:S(1) -> y:S(1)", "x:B -> y:B"]

    @scale.sbp
    def scale_sbp(x, *, factor):
        return [{"x": S(k), "y": S(k)} for k in range(x.rank)] if factor > 0 else []

    assert [str(s) for s in scale.sbp_signatures([TensorSpec([2, 4])], {"factor": 3})] == \
        ["x:S(0) -> y:S(0)", "x:S(1) -> y:S(1)", "x:B -> y:B"]
    assert [str(s) for s in scale.sbp_signatures([TensorSpec([2, 4])], {"factor": -1})] == ["x:B -> y:B"]
    assert scale.sbp_signatures([np.zeros((2, 4))]) == signatures(scale, [TensorSpec([2, 4])], {})


def test_an_absent_optional_input_has_no_sbp(fresh):
    op = declare(fresh, "t_sbp::biased(Tensor x, Tensor? bias) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0))
    op.sbp([{"x": S(0), "bias": B, "y": S(0)}])
    assert [str(s) for s in op.sbp_signatures([TensorSpec([4])])] == ["x:S(0), bias:None -> y:S(0)",
                                                                       "x:B, bias:None -> y:B"]
    assert str(op.sbp_signatures([TensorSpec([4]), TensorSpec([4])])[0]) == "x:S(0), bias:B -> y:S(0)"


@pytest.mark.parametrize("declared, message", [
    ([{"x": S(2), "y": S(0)}], "split axis 2 of 'x' is out of range for rank 2"),
    ([{"x": S(0), "y": S(-3)}], "split axis -3 of 'y' is out of range for rank 2"),
    ([{"x": S(0), "z": S(0), "y": S(0)}], "'z' is not an input or output"),
    ([{"x": S(0)}], "output 'y' has no SBP"),
    ([{"y": B}], "input 'x' has no SBP"),
    ([{"x": "S(0)", "y": B}], "an SBP is split(axis), broadcast or partial_sum"),
    (["x:S(0) -> y:S(0)"], "a dict of input and output names"),
])
def test_bad_declarations_raise_schema_errors_naming_the_op(fresh, declared, message):
    op = declare(fresh, "t_sbp::bad(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.sbp(lambda x: declared)  # a function: checked when signatures are asked for, with the ranks known
    with pytest.raises(SchemaError, match=r"op 't_sbp::bad'.*" + message.replace("(", r"\(").replace(")", r"\)")):
        op.sbp_signatures([TensorSpec([2, 4])])
    if "range" not in message:  # a static list is checked at once (names and kinds; axes need ranks)
        with pytest.raises(SchemaError, match="op 't_sbp::bad'"):
            op.sbp(declared)


def test_a_declaration_that_is_not_a_list_is_refused(fresh):
    op = declare(fresh, "t_sbp::odd(Tensor x) -> Tensor y")
    with pytest.raises(SchemaError, match="op 't_sbp::odd'"):
        op.sbp({"x": B, "y": B})
    op.sbp(lambda x: None)  # forgot to return the list
    with pytest.raises(SchemaError, match="op 't_sbp::odd'.*must return a list"):
        op.sbp_signatures([TensorSpec([2])])


def test_signatures_refuse_missing_required_inputs_and_unknown_attributes():
    matmul, reduce_sum = opforge.lookup("matmul"), opforge.lookup("reduce_sum")
    with pytest.raises(SchemaError, match="op 'matmul' takes 2 input"):
        matmul.sbp_signatures([TensorSpec([8, 4])])  # b is required: no signature may leave it out
    with pytest.raises(opforge.AttrError, match="op 'reduce_sum' has no attribute 'axis'"):
        reduce_sum.sbp_signatures([TensorSpec([4, 6])], {"axis": 1})  # (axes was meant)


# -- every built-in signature holds, numerically -------------------------------------------------
#
# A signature is a claim: run the op on each device's pieces and the outputs are pieces of the whole
# result.  Each one is checked on two shards: S(a) halves along a (every split dim here is even), B
# gives each the whole array, P two random addends; the outputs are put back together (S concatenated,
# B equal on both, P summed) and compared with the op on the whole inputs.

def ints(*shape, seed=0):
    return small_ints(*shape, seed=seed, low=-9, high=10, dtype=np.int64)


def binary(a=(4, 1, 6), b=(6,), make_b=normal):
    """Broadcasting operands: b is missing on axes 0-1 of y [4, 1, 6], a is 1 on axis 1."""
    return [((normal(*a), make_b(*b, seed=1)), {})]


UNARY = [((normal(4, 6),), {})]
SAMPLES = {
    "add": binary() + [((ints(4, 6), ints(2, 4, 1, seed=1)), {})],
    "sub": binary(),
    "mul": binary(),
    "div": binary(make_b=positive),
    "pow": [((positive(4, 1, 6), normal(6, seed=1)), {})],
    "maximum": binary(), "minimum": binary(),
    "mod": binary(make_b=positive) + [((ints(4, 6), ints(6, seed=1) % 5 + 1), {"fmod": True})],
    **{name: [((small_ints(4, 1, 6), small_ints(6, seed=1)), {})]
       for name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")},
    **{name: UNARY for name in ("neg", "abs", "exp", "tanh", "sigmoid", "relu", "erf")},
    "log": [((positive(4, 6),), {})], "sqrt": [((positive(4, 6),), {})],
    "hard_sigmoid": [((normal(4, 6),), {"alpha": 0.3})],
    "leaky_relu": [((normal(4, 6),), {"alpha": 0.2})],
    "gelu": [((normal(4, 6),), {"approximate": "tanh"})],
    "clip": [((normal(4, 6),), {"min": -0.5, "max": 0.5})],
    "relu_grad": [((normal(4, 6), normal(4, 6, seed=1)), {})],
    "leaky_relu_grad": [((normal(4, 6), normal(4, 6, seed=1)), {"alpha": 0.2})],
    "where": [((normal(4, 1, 6) > 0, normal(2, 6, seed=1), normal(4, 2, 1, seed=2)), {})],
    "cast": [((normal(4, 6),), {"dtype": "float32"}), ((normal(4, 6) * 5,), {"dtype": "int32"})],
    "matmul": [((normal(2, 1, 4, 6), normal(2, 2, 6, 8, seed=1)), {}), ((normal(4, 6), normal(6, 2, seed=1)), {})],
    "reduce_sum": [((normal(4, 2, 6),), {"axes": [1], "keep_dims": False}),
                   ((normal(4, 2, 6),), {"axes": [0, -1], "keep_dims": True}),
                   ((ints(4, 2),), {})],
    "mean": [((normal(4, 2, 6),), {"axes": [0, 2], "keep_dims": False}),
             ((normal(4, 2, 6),), {"axes": [1], "keep_dims": True})],
    "softmax": [((normal(4, 2, 6),), {"axis": 1}), ((normal(4, 6),), {"axis": -1})],
    "transpose": [((normal(2, 4, 6),), {"perm": [2, 0, 1]}), ((normal(2, 4, 6),), {})],
    **{name: [((np.clip(normal(4, 6) * 0.4, -0.9, 0.9),), {})]
       for name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "atanh")},
    "acosh": [((positive(4, 6) + 1.0,), {})],
    **{name: [((ints(4, 1, 6), ints(6, seed=1)), {})]
       for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift")},
    "bitwise_not": [((ints(4, 6),), {})],
    "cumsum": [((normal(4, 2, 6),), {"axis": 1}), ((ints(4, 6),), {"axis": 0, "exclusive": True, "reverse": True})],
    "trilu": [((normal(2, 4, 4, 6),), {"k": 1}), ((normal(4, 6),), {"upper": False})],
}


def shards(x, sbp, rng):
    """x's two pieces under ``sbp``."""
    if sbp is None:  # an absent optional input
        return None, None
    if isinstance(sbp, Split):
        assert x.shape[sbp.axis] % 2 == 0, f"sample dim {sbp.axis} of shape {x.shape} is odd"
        return tuple(np.ascontiguousarray(piece) for piece in np.array_split(x, 2, axis=sbp.axis))
    if sbp is B:
        return x, x
    assert sbp is P and x.dtype != bool, "partial sums of a bool tensor"
    addend = rng.standard_normal(x.shape) if x.dtype.kind == "f" else rng.integers(-9, 10, x.shape)
    addend = addend.astype(x.dtype)
    return addend, x - addend


def assembled(pieces, sbp):
    """The whole output from its two pieces under ``sbp``."""
    if isinstance(sbp, Split):
        return np.concatenate(pieces, axis=sbp.axis)
    if sbp is B:
        np.testing.assert_array_equal(pieces[0], pieces[1], err_msg="B output differs between devices")
        return pieces[0]
    return pieces[0] + pieces[1]


def outputs(op, args, attrs):
    result = op(*args, **attrs)
    return list(result) if op.tuple_output else [result]


def check_signature(op, signature, args, attrs, seed=0):
    """AssertionError unless running ``op`` on shards per ``signature`` gives the whole result."""
    rng = np.random.default_rng(seed)
    pieces = [shards(x, sbp, rng) for x, sbp in zip(args, signature.inputs)]
    on_device = [outputs(op, [p[d] for p in pieces], attrs) for d in range(2)]
    for name, sbp, whole, parts in zip(op.outputs, signature.outputs, outputs(op, args, attrs), zip(*on_device)):
        got = assembled(parts, sbp)
        context = f"op '{op.name}' {signature} output '{name}'"
        assert got.shape == whole.shape, f"{context}: shape {got.shape}, expected {whole.shape}"
        if whole.dtype.kind == "f":
            tight = whole.dtype == np.float64
            np.testing.assert_allclose(got, whole, rtol=1e-6 if tight else 1e-5, atol=1e-12 if tight else 1e-6,
                                       err_msg=context)
        else:
            np.testing.assert_array_equal(got, whole, err_msg=context)


def with_signatures():
    """Built-ins whose signatures go beyond all-broadcast: a trait derives them or the op declares them."""
    return sorted(op.name for op in every_builtin_op()
                  if "elementwise" in op.traits or op.sbp_declaration is not None)


def test_every_builtin_with_signatures_has_a_sample():
    missing = sorted(set(with_signatures()) - set(SAMPLES))
    assert missing == [], f"add samples to tests/test_sbp.py for {missing}"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_signature_holds_on_shards(name):
    op = opforge.lookup(name)
    for args, attrs in SAMPLES[name]:
        found = op.sbp_signatures(args, attrs)
        assert any(sbp is not B for s in found for sbp in s.values() if sbp is not None), \
            f"op '{name}': the sample {[a.shape for a in args]} {attrs} gives only all-broadcast"
        for seed, signature in enumerate(found):
            check_signature(op, signature, args, attrs, seed)


@pytest.mark.parametrize("name, wrong, args, attrs", [
    ("softmax", {"x": S(1), "y": S(1)}, (normal(4, 6),), {"axis": 1}),  # split along the normalised axis
    ("mean", {"x": S(0), "y": P}, (normal(4, 6),), {"axes": [0], "keep_dims": False}),  # means do not add
    ("mul", {"a": P, "b": P, "y": P}, (normal(4, 6), normal(4, 6, seed=1)), {}),  # not bilinear in sums
    ("transpose", {"x": S(0), "y": S(0)}, (normal(2, 4),), {}),  # the split must move with its axis
])
def test_the_numerical_check_catches_a_wrong_signature(name, wrong, args, attrs):
    op = opforge.lookup(name)
    signature = Signature({i.name: wrong[i.name] for i in op.inputs}, {o: wrong[o] for o in op.outputs})
    assert signature not in op.sbp_signatures(args, attrs)
    with pytest.raises(AssertionError):
        check_signature(op, signature, args, attrs)


# -- the command line ---------------------------------------------------------------------------

def test_opforge_ops_prints_an_sbp_line_per_op(capsys):
    assert cli.main(["ops"]) == 0
    out = capsys.readouterr().out
    blocks = {}  # op name -> its sbp line
    lines = out.splitlines()
    schemas = [k for k, line in enumerate(lines) if not line.startswith(" ")]
    for start, end in zip(schemas, schemas[1:] + [len(lines)]):
        block = lines[start:end]
        sbp = [line for line in block if line.startswith("    sbp: ")]
        assert len(sbp) == 1, f"{block[0]}: {len(sbp)} sbp lines"
        blocks[block[0].split("(")[0]] = sbp[0]
    assert blocks["neg"] == "    sbp: elementwise splits | x:P -> y:P | x:B -> y:B"
    assert blocks["matmul"] == "    sbp: declared (depends on shapes) | all broadcast"
    assert blocks["relu"] == "    sbp: elementwise splits | all broadcast"
    assert blocks["reshape"] == "    sbp: all broadcast"
