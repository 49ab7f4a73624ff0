"""Fuzzing the schema parser: whatever the text, only an OpforgeError (a
SchemaError pointing at the column) escapes ``parse_schema`` and
``opforge.op``, and a valid schema round-trips through its canonical form."""
import keyword

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opforge
from opforge.dtypes import ABI_DTYPES
from opforge.errors import OpforgeError, SchemaError
from opforge.schema import parse_schema

FUZZ = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
identifiers = st.builds(str.__add__, st.sampled_from(LETTERS), st.text(LETTERS + "0123456789_", max_size=6))
param_names = identifiers.filter(lambda s: not keyword.iskeyword(s))

floats = st.floats(allow_nan=False)  # the schema has no NaN literal; 1e999 is inf
int64 = st.integers(-2**63, 2**63 - 1)
strings = st.text(max_size=6).filter(lambda s: not ("'" in s and '"' in s))  # no escapes inside a literal
DEFAULTS = {
    "bool": st.booleans(), "int": int64, "float": floats | int64, "str": strings,
    "int[]": st.lists(int64, max_size=3), "float[]": st.lists(floats, max_size=3),
    "int[][]": st.lists(st.lists(int64, max_size=2), max_size=2),
    "float[][]": st.lists(st.lists(floats, max_size=2), max_size=2),
    "Shape": st.lists(st.integers(-1, 2**63 - 1), max_size=3),
    "DType": st.sampled_from(ABI_DTYPES + ("float", "int", "double", "half")),
}


def literal(value, draw):
    """A default written the ways a person might: true/True, ints for floats, either quote."""
    if isinstance(value, bool):
        return draw(st.sampled_from(["true", "True"] if value else ["false", "False"]))
    if isinstance(value, list):
        return "[" + ", ".join(literal(v, draw) for v in value) + "]"
    if isinstance(value, float) and abs(value) == float("inf"):
        return "1e999" if value > 0 else "-1e999"
    return repr(value)


@st.composite
def schemas(draw):
    """A valid schema and what it declares: (text, input kinds, attribute types, outputs)."""
    names = draw(st.lists(param_names, min_size=1, max_size=7, unique=True))
    n_inputs = draw(st.integers(1, len(names)))
    inputs = [draw(st.sampled_from(["Tensor", "Tensor?", "Tensor[]"])) for _ in range(n_inputs)]
    params = [f"{kind} {name}" for kind, name in zip(inputs, names)]
    attr_types, star = [], False
    for name in names[n_inputs:]:
        if not star and draw(st.booleans()):
            params.append("*")
            star = True
        attr_type = draw(st.sampled_from(sorted(DEFAULTS)))
        attr_types.append(attr_type)
        default = draw(st.none() | DEFAULTS[attr_type])
        params.append(f"{attr_type} {name}" + ("" if default is None else f"={literal(default, draw)}"))
    outputs = draw(st.lists(param_names, min_size=1, max_size=3, unique=True))
    returns = ", ".join(f"Tensor {o}" for o in outputs)
    returns = f"({returns})" if len(outputs) > 1 or draw(st.booleans()) else returns
    op_name = draw(identifiers | st.sampled_from(keyword.kwlist))  # a Python keyword is a fine op name
    namespace = draw(st.sampled_from(["", "fuzz::", "lambda::"]))
    text = f"{namespace}{op_name}({', '.join(params)}) -> {returns}"
    return text, inputs, attr_types, outputs


def declare_or_schema_error(text):
    """opforge.op(text); the op, if declared, is checked for a working function and removed."""
    try:
        op = opforge.op(text)
    except OpforgeError:
        return None
    try:
        namespace, _, name = op.name.rpartition("::")
        assert getattr(getattr(opforge.ops, namespace) if namespace else opforge.ops, name).op is op
    finally:
        opforge.registry.unregister(op.name)
    return op


@FUZZ
@given(schemas())
def test_a_valid_schema_parses_and_round_trips(schema):
    text, inputs, attr_types, outputs = schema
    parsed = parse_schema(text)
    assert [("Tensor[]" if i.variadic else "Tensor?" if i.optional else "Tensor") for i in parsed.inputs] == inputs
    assert [a.type for a in parsed.attrs] == attr_types
    assert parsed.outputs == outputs
    assert parse_schema(str(parsed)) == parsed
    declare_or_schema_error(text)


@FUZZ
@given(st.text(max_size=80))
def test_random_text_raises_only_schema_errors(text):
    try:
        parse_schema(text)
    except SchemaError:
        pass
    declare_or_schema_error(text)


PIECES = ["(", ")", ",", "*", "=", "?", "[", "]", "[]", "::", "->", "'", '"', "-", ".", "e", "1", "9" * 30,
          " ", "Tensor", "Tensor?", "int", "float", "DType", "Shape", "x", "def", "_x", "None", "true", "\n", "é"]


@st.composite
def mutated(draw):
    """A valid schema with a few spans deleted, duplicated or replaced by schema-like pieces."""
    text = draw(schemas())[0]
    for _ in range(draw(st.integers(1, 4))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, min(len(text), start + 8)))
        edit = draw(st.sampled_from(["delete", "duplicate", "insert"]))
        if edit == "delete":
            text = text[:start] + text[end:]
        elif edit == "duplicate":
            text = text[:end] + text[start:end] + text[end:]
        else:
            text = text[:start] + draw(st.sampled_from(PIECES)) + text[start:]
    return text


@FUZZ
@given(mutated())
def test_mutated_schemas_raise_only_opforge_errors(text):
    try:
        parsed = parse_schema(text)
    except SchemaError as error:
        assert "at column" in str(error) or "non-empty string" in str(error)
    else:
        assert parse_schema(str(parsed)) == parsed
    declare_or_schema_error(text)


@pytest.mark.parametrize("value", [None, 3, b"f(Tensor x) -> Tensor", ["f(Tensor x) -> Tensor"]])
def test_a_schema_that_is_not_a_string(value):
    with pytest.raises(SchemaError, match="a schema is a non-empty string"):
        opforge.op(value)
