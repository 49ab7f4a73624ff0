"""Bad input gets a typed error (an OpforgeError naming the op, the argument
and what was expected), never an exception from Python's or NumPy's insides."""
import inspect

import numpy as np
import pytest

import opforge
from helpers import declare
from opforge import TensorSpec
from opforge.errors import ArityError, AttrError, DTypeError, OpforgeError, SchemaError, ShapeError

X = np.arange(3, dtype=np.float32)


def _identity(fresh, schema):
    op = declare(fresh, schema)
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x, *rest, **attrs: x)
    return op


# -- the functional API -----------------------------------------------------------

def test_an_op_named_by_a_python_keyword_has_a_function(fresh):
    _identity(fresh, "kw::def(Tensor x, *, int n=1) -> Tensor y")
    function = getattr(opforge.ops.kw, "def")
    assert function.__name__ == "def" and str(inspect.signature(function)) == "(x, *, n=1)"
    np.testing.assert_array_equal(function(X, n=2), X)
    np.testing.assert_array_equal(opforge.lookup("kw::def")(X), X)


@pytest.mark.parametrize("call, error, words", [
    (lambda add: add(X), ArityError, "missing: b"),
    (lambda add: add(), ArityError, "missing: a, b"),
    (lambda add: add(X, X, X), ArityError, "takes 2 positional"),
    (lambda add: add(X, b=X, a=X), ArityError, "'a' is given twice"),
    (lambda add: add(X, X, alpha=1.0), AttrError, "no input or attribute 'alpha'"),
])
def test_the_functional_api_raises_the_ops_typed_errors(call, error, words):
    with pytest.raises(error, match=words) as caught:
        call(opforge.ops.add)
    assert "op 'add'" in str(caught.value)


def test_the_functional_api_binds_by_name_as_python_would(fresh):
    op = declare(fresh, "fn::mix(Tensor x, Tensor? b=None, float s=2.0, *, int n) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x, b, s, n: x * s * n if b is None else x + b)
    mix = opforge.ops.fn.mix
    assert str(inspect.signature(mix)) == "(x, b=None, s=2.0, *, n)"
    np.testing.assert_array_equal(mix(X, n=1), 2 * X)
    np.testing.assert_array_equal(mix(X, None, 3.0, n=1), 3 * X)
    np.testing.assert_array_equal(mix(b=X, x=X, n=1), 2 * X)
    np.testing.assert_array_equal(mix(X, s=1.0, n=2), 2 * X)
    with pytest.raises(AttrError, match="required attribute 'n'"):
        mix(X)
    with pytest.raises(AttrError, match="'s' is given twice"):
        mix(X, None, 1.0, s=1.0, n=1)
    with pytest.raises(ArityError, match="missing: x"):
        mix(b=X, n=1)


def _frames_of(call):
    """The code files of the Python frames a call runs."""
    import sys

    seen = []
    sys.setprofile(lambda frame, event, arg: seen.append(frame.f_code.co_filename) if event == "call" else None)
    try:
        result = call()
    finally:
        sys.setprofile(None)
    return result, seen


def test_usual_functional_calls_are_the_op_objects_own(fresh):
    mix = declare(fresh, "fn::scale(Tensor x, Tensor? b=None, *, float s=2.0, int n) -> Tensor y")
    mix.def_infer(opforge.infer.same_as(0))
    mix.kernel(lambda x, b, s, n: x * s * n if b is None else x + b)
    function = opforge.ops.fn.scale
    assert repr(function) == "<function opforge.ops.scale>" and function.op is mix
    for call, expected in ((lambda: function(X, None, n=3), 6 * X), (lambda: function(X, None, s=1.0, n=3), 3 * X)):
        # tensors by position, attributes by keyword, the required one given: no frame of the generated function
        result, frames = _frames_of(call)
        assert "<opforge.ops.scale>" not in frames
        np.testing.assert_array_equal(result, expected)
    for call in (lambda: function(X, n=3), lambda: function(x=X, n=3), lambda: function(X, None, s=1.0)):
        # a tensor left out or given by name, or a required attribute missing: bound by name
        _, frames = _frames_of(lambda: _result_or_error(call))
        assert "<opforge.ops.scale>" in frames
    with pytest.raises(AttrError, match="required attribute 'n'"):
        function(X, None)
    with pytest.raises(AttrError, match="no input or attribute 'm'"):
        function(X, None, n=1, m=2)
    concat = opforge.ops.concat  # variadic: any number of tensors by position
    _, frames = _frames_of(lambda: concat(X, X, X, axis=0))
    assert "<opforge.ops.concat>" not in frames
    np.testing.assert_array_equal(concat(X, X, axis=0), np.concatenate([X, X]))


def _result_or_error(call):
    try:
        return call()
    except OpforgeError as error:
        return error


def test_a_function_of_ops_binds_as_a_method_as_python_functions_do():
    class Holder:
        add = opforge.ops.add

    np.testing.assert_array_equal(Holder.add(X, X), 2 * X)
    with pytest.raises(ArityError, match="takes 2 positional"):
        Holder().add(X, X)  # self is the first tensor, as with any function stored on a class


# -- attribute values that cannot reach a kernel ---------------------------------

@pytest.fixture
def ranged(fresh):
    return _identity(fresh, "rng::f(Tensor x, *, int n=0, float f=0.0, int[] ns=[], float[][] fs=[], "
                            "Shape shape=[], DType dtype='float32') -> Tensor y")


@pytest.mark.parametrize("attrs, words", [
    ({"n": 2**63}, "'n' \\(int\\): 9223372036854775808 is outside int64"),
    ({"n": -2**63 - 1}, "'n' \\(int\\): -9223372036854775809 is outside int64"),
    ({"n": np.uint64(2**64 - 1)}, "'n' \\(int\\): 18446744073709551615 is outside int64"),
    ({"ns": [1, 2**64]}, "'ns' \\(int\\[\\]\\): 18446744073709551616 is outside int64"),
    ({"shape": [2**70]}, "'shape' \\(Shape\\): .* is outside int64"),
    ({"f": 10**400}, "'f' \\(float\\): an int of 1329 bits is too large for a double"),
    ({"fs": [[1.0, -10**309]]}, "'fs' \\(float\\[\\]\\[\\]\\): .* is too large for a double"),
    ({"n": 10**5000}, "'n' \\(int\\): an int of 16610 bits"),  # more digits than Python will print
])
def test_attributes_out_of_range_name_op_and_attribute(ranged, attrs, words):
    with pytest.raises(AttrError, match=f"op 'rng::f': attribute {words}"):
        ranged(X, **attrs)


def test_attributes_at_the_edge_of_the_range_are_accepted(ranged):
    ranged(X, n=2**63 - 1, ns=[-2**63], f=float("inf"), fs=[[2**1000]])


@pytest.mark.parametrize("value", ["i4,,", "i4,f4", "O", "(2,)i4", "bogus", "V8", ""])
def test_bad_dtype_attributes_list_the_supported_names(ranged, value):
    with pytest.raises(AttrError, match="op 'rng::f': attribute 'dtype' expects a dtype name.*float32, float64"):
        ranged(X, dtype=value)


@pytest.mark.parametrize("default, words", [
    ("int n=9223372036854775808", "'n' \\(int\\): 9223372036854775808 is outside int64"),
    ("int[] n=[0, -9223372036854775809]", "'n' \\(int\\[\\]\\): .* is outside int64"),
    ("DType d='i4,,'", "'d' expects a dtype name"),
])
def test_a_bad_default_is_a_schema_error_at_declaration(default, words):
    with pytest.raises(SchemaError, match=f"op 'bad::f': attribute {words}.* at column"):
        opforge.op(f"bad::f(Tensor x, *, {default}) -> Tensor y")
    assert opforge.lookup("bad::f") is None


# -- dtypes, shapes and layouts ---------------------------------------------------

@pytest.mark.parametrize("dtype", ["i4,,", "(2)i4", "i4,f4", object, None, [1, 2], "float32x"])
def test_bad_dtypes_are_dtype_errors(dtype):
    with pytest.raises(DTypeError, match="expected one of bool, int8"):
        TensorSpec([2], dtype)


@pytest.mark.parametrize("shape, words", [
    ([2.7], "dim 2.7 \\(float\\) in shape \\[2.7\\] is not an int"),
    ([2, float("nan")], "dim nan \\(float\\)"),
    ([np.float64(3.0)], "dim 3.0 \\(float64\\)"),
    ([True, 2], "dim True \\(bool\\)"),
    ([2**63], "dim 9223372036854775808 .* is out of range"),
    ([-3], "dim -3 .* is out of range"),
    ([4, -2], "invalid dim -2"),
    ("ab", "a shape is a sequence of dims, got 'ab'"),
    (7, "a shape is a sequence of dims, got 7"),
])
def test_bad_dims_are_shape_errors_saying_what_is_allowed(shape, words):
    with pytest.raises(ShapeError, match=words) as caught:
        TensorSpec(shape)
    assert "-1 or None for an unknown dim" in str(caught.value)


def test_good_dims_are_kept():
    assert TensorSpec([np.int64(3), None, -1, 2**63 - 1]).shape == (3, -1, -1, 2**63 - 1)
    assert TensorSpec([-2]).rank is None and TensorSpec(None).rank is None
    assert TensorSpec([2**40, 2**40], "float64").nbytes == 2**83  # exact, no wrap-around


@pytest.mark.parametrize("layout", ["bogus", None, 5])
def test_a_bad_layout_is_a_shape_error(layout):
    with pytest.raises(ShapeError, match="layout is one of ndarray, nchw16c"):
        TensorSpec([2], "float32", layout)


def test_a_float_dim_from_inference_is_an_error_not_truncated(fresh):
    op = declare(fresh, "dims::half(Tensor x) -> Tensor y")
    op.def_infer(lambda x: TensorSpec([x.shape[0] / 2], x.dtype))
    op.kernel(lambda x: x[: len(x) // 2])
    with pytest.raises(ShapeError, match="dim 1.5 \\(float\\)"):
        op(X)
    with pytest.raises(ShapeError, match="dim 2.7"):
        opforge.Custom(lambda x: x, out_shape=lambda x: [2.7], out_dtype="float32", func_type="pyfunc")(X)


def test_every_error_class_derives_from_opforge_error():
    classes = [v for v in vars(opforge.errors).values() if isinstance(v, type) and issubclass(v, BaseException)]
    assert len(classes) > 10
    for cls in classes:
        assert issubclass(cls, OpforgeError), cls
        assert getattr(opforge, cls.__name__) is cls  # exported from the package too


# -- every public name, given bad input ------------------------------------------------

def _public_callables():
    """(qualified name, callable) for the public functions and classes of opforge,
    opforge.infer, opforge.testing and opforge.errors: names without a leading
    underscore, defined in that module (the package: every opforge object it
    exports), plus the alternative constructors of exported classes.  The ops of
    opforge.ops have their own test below (a float is a fine input to them)."""
    found = {}
    for module in (opforge, opforge.infer, opforge.testing, opforge.errors):
        for name in dir(module):
            obj = getattr(module, name)
            if name.startswith("_") or inspect.ismodule(obj) or not callable(obj):
                continue
            home = getattr(obj, "__module__", None) or ""
            if home == module.__name__ or module is opforge and home.startswith("opforge"):
                found.setdefault(id(obj), (f"{module.__name__}.{name}", obj))
                if isinstance(obj, type):
                    for method in ("of", "load"):
                        bound = getattr(obj, method, None)
                        if inspect.ismethod(bound):  # a classmethod
                            found.setdefault(id(bound), (f"{module.__name__}.{name}.{method}", bound))
    return sorted(found.values(), key=lambda item: item[0])


BAD_VALUES = {"None": None, "str": "not an array", "float": 2.5, "object": object()}


def _bad_calls():
    for name, fn in _public_callables():
        if isinstance(fn, type) and issubclass(fn, BaseException):
            continue  # error classes take any message
        parameters = inspect.signature(fn).parameters.values()
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in positional if p.default is p.empty]
        count = len(required) or min(len(positional), 1) or any(p.kind == p.VAR_POSITIONAL for p in parameters)
        for kind in BAD_VALUES:
            yield pytest.param(name, fn, kind, int(count), id=f"{name}({kind})")


@pytest.fixture
def global_settings():
    """Bad calls may flip process-wide settings (the ISA cap, checked mode); put them back."""
    cap, checks = opforge.runtime.cpu._cap, opforge.checks_enabled()
    yield
    opforge.set_isa_cap(cap)
    opforge.set_checks(checks)


@pytest.mark.parametrize("name, fn, kind, count", list(_bad_calls()))
def test_public_callables_raise_only_typed_errors(global_settings, name, fn, kind, count):
    """Every required positional parameter (or the first one) gets the bad value.
    Calls that do not match a signature at all are never made: Python's own
    TypeError for those is the one untyped error allowed."""
    try:
        fn(*[BAD_VALUES[kind]] * count)
    except OpforgeError:
        pass


# The built-in ops: namespaces in dir(opforge.ops) hold ops other test modules register for a while.
BUILTIN_OP_NAMES = [name for name in dir(opforge.ops) if "::" not in name and opforge.lookup(name) is not None]


@pytest.mark.parametrize("name", BUILTIN_OP_NAMES)
def test_ops_raise_only_typed_errors_for_bad_calls(name):
    function = getattr(opforge.ops, name)
    op = function.op
    n = len(op.inputs)
    x = np.ones((2, 3), np.float32)
    calls = [(), ("not an array",) * n, (object(),) * n, ([[1.0], [1.0, 2.0]],) * n]
    if not op.variadic:
        calls.append((x,) * (n + 3))
    keywords = [{"bogus": 1}] + [{a: bad} for a in op.attrs for bad in (object(), "zz", 10**400, [None])]
    for target in (function, op):
        for args in calls:
            with pytest.raises(OpforgeError):
                target(*args)
        for attrs in keywords:
            with pytest.raises(OpforgeError):
                target(*(x,) * n, **attrs)
        with pytest.raises(OpforgeError):
            op.infer(*("not a spec",) * n)


@pytest.mark.parametrize("name", ["reduce_sum", "matmul"])
def test_none_for_a_required_tensor_is_typed_in_inference_and_check_op(name):
    op = opforge.lookup(name)
    with pytest.raises(OpforgeError):
        op.infer(*[None] * len(op.inputs))
    with pytest.raises(OpforgeError):
        opforge.testing.check_op(op, *[None] * len(op.inputs))


def test_the_package_exports_only_opforge_names():
    exported = {name: getattr(opforge, name) for name in dir(opforge) if not name.startswith("_")}
    foreign = [name for name, obj in exported.items() if not inspect.ismodule(obj)
               and not (getattr(obj, "__module__", None) or "opforge").startswith("opforge")]
    assert foreign == []
