"""The op model: schemas, registry, inference, kernels and dispatch, the
functional API, declarations files, check_op and the ops/doctor commands."""
import inspect
import json
import subprocess
import sys

import numpy as np
import pytest

import opforge
from helpers import WHICH_ISA, declare
from opforge import TensorSpec
from opforge.errors import (ArityError, AttrError, CheckError, DTypeError, InferenceError, NoKernelError, SchemaError,
                            ShapeError)
from opforge.runtime.dispatch import select_kernel
from opforge.schema import parse_schema
from opforge.testing import OpCheckFailure, check_op

SCALE = r"""
#include "custom_aot_extra.h"
extern "C" int Scale(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  const OPFORGE_T factor = static_cast<AotExtra *>(extra)->Attr<float>("factor");
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = factor * x[i];
#ifdef __AVX2__
  return 0;
#else
  return 0;
#endif
}
"""

# -- schemas ------------------------------------------------------------------

def test_schema_parses_inputs_attributes_and_outputs():
    parsed = parse_schema("lib::f(Tensor x, Tensor? bias=None, int axis=-1, *, int[] axes=[0, 1], "
                          "bool keep=false, str mode='a', float[][] m=[[1.0]], DType t='float32', Shape s=[2]) "
                          "-> (Tensor y, Tensor z)")
    assert parsed.qualified_name == "lib::f"
    assert [(i.name, i.optional) for i in parsed.inputs] == [("x", False), ("bias", True)]
    attrs = {a.name: a for a in parsed.attrs}
    assert attrs["axis"].positional and not attrs["axes"].positional
    assert attrs["axes"].default == (0, 1) and attrs["keep"].default is False
    assert attrs["m"].default == ((1.0,),) and attrs["t"].default == "float32"
    assert parsed.outputs == ["y", "z"]
    assert parse_schema("g(Tensor[] xs) -> Tensor").inputs[0].variadic


@pytest.mark.parametrize("schema, column, words", [
    ("f(Tensor x, floot a) -> Tensor", 13, "unknown type 'floot'"),
    ("f(Tensor x -> Tensor", 12, "expected ','"),
    ("f(Tensor x) ->", 15, "end of schema"),
    ("f(Tensor x, *, int a=1.5) -> Tensor", 22, "expects int"),
    ("f(Tensor x) -> Tensor y extra", 25, "unexpected 'extra'"),
    ("f(int a, Tensor x) -> Tensor", 10, "tensor inputs must come before attributes"),
    ("f(Tensor x, Tensor x) -> Tensor", 20, "declared twice"),
])
def test_malformed_schema_points_at_the_column(schema, column, words):
    with pytest.raises(SchemaError) as info:
        parse_schema(schema)
    message = str(info.value)
    assert words in message and f"column {column}" in message
    assert message.splitlines()[-1].index("^") - 2 == column - 1


def test_keyword_calls_reuse_their_launcher_and_see_new_values(fresh, monkeypatch):
    op = declare(fresh, "kwc::scale(Tensor x, *, float s=1.0, int[] axes=[]) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x, s, axes: x * s + len(axes))
    x = np.ones(2, np.float32)
    asked = []  # the keyword calls the C base did not find among those it remembers
    original = type(op)._keyword_launcher
    monkeypatch.setattr(type(op), "_keyword_launcher", lambda self, args, kwargs: asked.append(dict(kwargs)) or
                        original(self, args, kwargs))
    assert op(x, s=2.0).tolist() == [2, 2] and op(x, s=2.0).tolist() == [2, 2] and len(asked) == 1
    assert op(x, s=3.0).tolist() == [3, 3] and len(asked) == 2
    assert op(x, s=2).tolist() == [2, 2] and len(asked) == 3  # an int is not the float 2.0's call
    axes = [1, 2]
    assert op(x, axes=axes).tolist() == [3, 3] and len(asked) == 4
    axes.append(3)  # the caller's list changed: a new call, not the remembered one
    assert op(x, axes=axes).tolist() == [4, 4] and len(asked) == 5
    assert op(x, axes=[1, 2]).tolist() == [3, 3] and len(asked) == 5
    assert op(x, s=2.0, axes=[1, 2]).tolist() == [4, 4] and op(x, axes=[1, 2], s=2.0).tolist() == [4, 4]
    with pytest.raises(AttrError, match="no attribute 't'"):
        op(x, t=1.0)


def test_registering_twice_needs_replace(fresh):
    first = declare(fresh, "t1::same(Tensor x) -> Tensor")
    with pytest.raises(SchemaError, match="already registered"):
        opforge.op("t1::same(Tensor x) -> Tensor")
    second = opforge.op("t1::same(Tensor x) -> Tensor", replace=True)
    assert opforge.lookup("t1::same") is second is not first
    assert declare(fresh, "t2::same(Tensor x) -> Tensor") is not second  # namespaces avoid clashes


def test_unknown_trait_is_rejected():
    with pytest.raises(SchemaError, match="unknown trait"):
        opforge.op("t3::f(Tensor x) -> Tensor", traits=["fast"])


# -- inference ------------------------------------------------------------------

def test_infer_shape_and_dtype_separately_with_unknown_dims(fresh):
    op = declare(fresh, "t4::pairs(Tensor x, *, int k=2) -> Tensor y")

    @op.infer_shape
    def _(shape, *, k):
        return shape if shape == (-2,) else (shape[0], k)

    @op.infer_dtype
    def _(dtype, *, k):
        return "int64"

    assert op.infer(TensorSpec([None, 7], "float32"), k=3) == TensorSpec([-1, 3], "int64")
    assert op.infer(TensorSpec(None, "float32")).shape == (-2,)


def test_check_function_rejects_bad_attributes(fresh):
    op = declare(fresh, "t5::pick(Tensor x, *, int axis=0) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))

    @op.check
    def _(x, *, axis):
        if x.rank is not None and not -x.rank <= axis < x.rank:
            return f"axis {axis} is out of range for rank {x.rank}"

    op.kernel(lambda x, axis: x.copy())
    assert op(np.ones(3), axis=0).shape == (3,)
    with pytest.raises(CheckError, match="t5::pick.*axis 4 is out of range"):
        op(np.ones(3), axis=4)


def test_inference_helpers_propagate_unknowns():
    from opforge.infer import broadcast_shapes, reduce_shape

    assert broadcast_shapes((4, 1), (3,)) == (4, 3)
    assert broadcast_shapes((-1, 1), (3,)) == (-1, 3)
    assert broadcast_shapes((-2,), (3,)) == (-2,)
    with pytest.raises(ShapeError):
        broadcast_shapes((2,), (3,))
    assert reduce_shape((2, -1, 4), [-1], True) == (2, -1, 1)
    assert reduce_shape((2, 3), [], False) == ()


def test_missing_inference_is_a_clear_error(fresh):
    op = declare(fresh, "t6::blank(Tensor x) -> Tensor")
    op.kernel(lambda x: x)
    with pytest.raises(InferenceError, match="t6::blank.*no shape inference"):
        op(np.ones(2))


def test_a_bug_in_an_ops_inference_or_check_names_the_op(fresh):
    op = declare(fresh, "t6b::pick(Tensor x) -> Tensor y")

    @op.infer
    def pick_shape(x):
        return TensorSpec([x.shape[5]], x.dtype)

    op.kernel(lambda x: x)
    with pytest.raises(InferenceError, match=r"t6b::pick.*'pick_shape' raised IndexError") as info:
        op(np.ones(2))
    assert isinstance(info.value.__cause__, IndexError)
    for returned, shown in (((4,), r"\(4,\)"), (4, "4")):
        op.def_infer(lambda x, returned=returned: returned)
        with pytest.raises(InferenceError, match=rf"must return a TensorSpec, or one per output, got {shown}$"):
            op(np.ones(2))
    op.def_infer(opforge.infer.same_as(0))
    op.check(lambda x: x.nonexistent)
    with pytest.raises(CheckError, match="t6b::pick.*check function.*raised AttributeError"):
        op(np.ones(2))


def test_an_attribute_given_by_position_is_told_to_go_by_keyword(fresh):
    op = declare(fresh, "t6c::scale(Tensor x, *, float k=1.0) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x, k: x * k)
    with pytest.raises(ArityError, match=r"t6c::scale.*got 2 positional arguments; pass attributes by keyword \(k="):
        op(np.ones(2), 2.0)


def test_a_compile_error_of_inline_code_names_the_op_and_kernel(fresh):
    op = declare(fresh, "t6d::broken(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    with pytest.raises(opforge.CompileError, match=r"^op 't6d::broken', kernel Broken: failed to compile") as info:
        op.kernel(code='extern "C" int Broken() { return 0 +; }', function="Broken")
        op(np.ones(2))
    assert "error" in info.value.output and info.value.command


def test_python_kernel_output_is_checked_against_inference(fresh):
    op = declare(fresh, "t7::liar(Tensor x) -> Tensor")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x: np.ones(5))
    with pytest.raises(ShapeError, match="t7::liar"):
        op(np.ones(2))
    halves = declare(fresh, "t7::halves(Tensor x) -> Tensor y")
    halves.def_infer(opforge.infer.same_as(0))
    halves.kernel(lambda x: x / 2)  # float64 values for an int32 output: truncating them would be silent
    with pytest.raises(DTypeError, match="t7::halves.*output 'y' of dtype float64, inference says int32"):
        halves(np.array([1, 3], np.int32))
    forgetful = declare(fresh, "t7::forgetful(Tensor x) -> Tensor y")
    forgetful.def_infer(opforge.infer.same_as(0))
    forgetful.kernel(lambda x: None)  # wrote nothing back
    with pytest.raises(InferenceError, match="t7::forgetful.*returned None; a kernel returns its output array"):
        forgetful(np.ones(2))
    np.testing.assert_array_equal(halves(np.array([1.0, 3.0], np.float32)), [0.5, 1.5])  # within a kind: cast


# -- kernels and dispatch ---------------------------------------------------------

def test_source_compiles_once_per_dtype_and_dispatches_by_dtype(fresh):
    op = declare(fresh, "t8::scale(Tensor x, *, float factor=2.0) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    kernels = op.kernel(code=SCALE, function="Scale", dtypes={"x": ["float32", "float64", "int32"]})
    assert [k.name for k in kernels] == ["Scale<float32>", "Scale<float64>", "Scale<int32>"]
    for dtype in ("float32", "float64", "int32"):
        x = np.arange(6, dtype=dtype).reshape(2, 3)
        assert select_kernel(op, [TensorSpec.of(x)]).name == f"Scale<{dtype}>"
        np.testing.assert_array_equal(op(x, factor=3.0), x * 3)
    assert len({k.library.path for k in kernels}) == 3  # three builds of one source
    with pytest.raises(DTypeError, match="t8::scale") as info:
        op(np.ones(2, np.int8))
    assert "int8" in str(info.value)


def test_best_isa_is_chosen_and_the_cap_is_honoured(fresh):
    op = declare(fresh, "t9::which(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    for isa in ("sse41", "avx2", "avx512"):
        op.kernel(code=WHICH_ISA, function="WhichIsa", isa=isa)
    features = opforge.cpu_features()
    best = max((isa for isa in ("sse41", "avx2", "avx512") if features[isa]),
               key=["sse41", "avx2", "avx512"].index, default=None)
    if best is None:
        pytest.skip("this CPU has none of SSE4.1, AVX2, AVX-512")
    codes = {"sse41": 41, "avx2": 2, "avx512": 512}
    assert op(np.zeros(1, np.float32))[0] == codes[best]
    opforge.set_isa_cap("sse41")
    try:
        assert op(np.zeros(2, np.float32))[0] == 41
        assert select_kernel(op, [TensorSpec([3], "float32")]).isa == "sse41"
    finally:
        opforge.set_isa_cap(None)
    assert op(np.zeros(3, np.float32))[0] == codes[best]


def test_isa_cap_from_the_environment():
    code = ("import opforge; from opforge.runtime.cpu import best_isa; print(best_isa(), opforge.isa_cap())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "OPFORGE_ISA": "sse41"}).stdout.split()
    assert out == ["sse41", "sse41"]


def test_no_kernel_lists_every_candidate(fresh):
    op = declare(fresh, "t10::narrow(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x: x, dtypes={"x": ["float64"]}, name="numpy64")
    op.kernel(lambda x: x, isa="sse41", name="numpy_sse")
    opforge.set_isa_cap("generic")
    try:
        with pytest.raises(NoKernelError) as info:
            op(np.ones(2, np.float32))
    finally:
        opforge.set_isa_cap(None)
    message = str(info.value)
    assert "numpy64" in message and "float64" in message and "numpy_sse" in message and "cap" in message
    with pytest.raises(DTypeError, match="takes float64"):  # the only candidate rejects the dtype
        op.kernels.pop()
        op(np.ones(2, np.float32))
    op.reference(lambda x: x)  # a reference is no candidate: the dtype is still what is wrong
    with pytest.raises(DTypeError, match="(?s)numpy64.*takes float64"):
        op(np.ones(2, np.float32))


def test_a_variadic_kernel_checks_the_dtype_of_every_tensor(fresh):
    op = declare(fresh, "t10v::total(Tensor[] xs) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda *xs: sum(xs), dtypes={"xs": ["float32"]})
    one = np.ones(2, np.float32)
    np.testing.assert_array_equal(op(one, one, one), 3 * one)
    np.testing.assert_array_equal(op([one, one, one]), 3 * one)  # a list of tensors, as torch passes one
    data = [np.float32(1), np.float32(2)]  # numbers: one tensor's data
    np.testing.assert_array_equal(op(data), [1, 2])
    with pytest.raises(DTypeError, match=r"t10v::total.*'xs\[2\]' has dtype float64, but the kernel takes float32"):
        op(one, one, one.astype(np.float64))


def test_a_tensor_list_keeps_its_attributes_whatever_the_calls_before():
    # The fast paths remember launchers by argument count: one list must not pass for one tensor.
    a, b = np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32)
    concat, total = opforge.ops.concat, opforge.ops.sum
    assert concat(a).shape == (2, 2) and concat(a, axis=1).shape == (2, 2)  # one-tensor launchers made first
    for _ in range(3):
        np.testing.assert_array_equal(concat([a, b], axis=1), np.concatenate([a, b], axis=1))
        np.testing.assert_array_equal(concat([a, b]), np.concatenate([a, b]))
        np.testing.assert_array_equal(total([a, b]), a + b)
    graph = opforge.trace(lambda x, y: concat([x, y], axis=1), TensorSpec([2, 2], "float32"),
                          TensorSpec([2, 2], "float32"))
    np.testing.assert_array_equal(graph(a, b), np.concatenate([a, b], axis=1))


def test_cpu_only_trait_rejects_gpu_kernels(fresh):
    op = declare(fresh, "t11::host(Tensor x) -> Tensor y", traits=["cpu_only"])
    with pytest.raises(SchemaError, match="cpu_only"):
        op.kernel(lambda x: x, device="gpu")


def test_the_kernel_is_skipped_only_when_every_output_is_empty(fresh):
    calls = []

    def kernel(*xs):
        calls.append([x.shape for x in xs])
        return np.concatenate(xs)

    same = declare(fresh, "t12::same(Tensor x) -> Tensor y")
    same.def_infer(opforge.infer.same_as(0))
    same.kernel(kernel)
    assert same(np.ones((0, 3))).shape == (0, 3) and calls == []  # nothing to write
    # An empty input with outputs to write runs the kernel: skipping it would hand back made-up values.
    joined = declare(fresh, "t12::joined(Tensor[] xs) -> Tensor y")
    joined.def_infer(lambda *xs: TensorSpec([sum(x.shape[0] for x in xs)], xs[0].dtype))
    joined.kernel(kernel)
    np.testing.assert_array_equal(joined(np.ones(0), np.array([1.0, 2.0])), [1.0, 2.0])
    assert calls == [[(0,), (2,)]]
    graph = opforge.trace(lambda a, b: joined(a, b), TensorSpec([None], "float64"), TensorSpec([2], "float64"))
    np.testing.assert_array_equal(graph(np.ones(0), np.array([3.0, 4.0])), [3.0, 4.0])
    eager = declare(fresh, "t12::eager(Tensor x) -> Tensor y", traits=["always_compute"])
    eager.def_infer(opforge.infer.same_as(0))
    eager.kernel(kernel)
    calls.clear()
    assert eager(np.ones((0, 3))).shape == (0, 3) and calls == [[(0, 3)]]


CAT2 = r"""
#include <cstdint>
extern "C" int Cat2(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                    void *extra) {
  const float *a = static_cast<const float *>(params[0]), *b = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  for (int64_t i = 0; i < shapes[0][0]; ++i) *y++ = a[i];
  for (int64_t i = 0; i < shapes[1][0]; ++i) *y++ = b[i];
  return 0;
}
"""


def test_an_empty_input_reaches_a_native_kernel_whose_output_is_not_empty(fresh):
    cat = declare(fresh, "t12n::cat2(Tensor a, Tensor b) -> Tensor y")
    cat.def_infer(lambda a, b: TensorSpec([a.shape[0] + b.shape[0]], a.dtype))
    cat.kernel(code=CAT2, function="Cat2", dtypes={"a": ["float32"], "b": ["float32"]})
    empty, two = np.ones(0, np.float32), np.array([1, 2], np.float32)
    for _ in range(2):  # the first call plans, the second takes the native path
        np.testing.assert_array_equal(cat(empty, two), two)
        np.testing.assert_array_equal(cat(two, empty), two)
    assert cat(empty, empty).shape == (0,)
    graph = opforge.trace(lambda a, b: cat(a, b), TensorSpec([None], "float32"), TensorSpec([2], "float32"))
    np.testing.assert_array_equal(graph(empty, two), two)


def test_support_non_contiguous_passes_views_to_python_kernels(fresh):
    seen = []
    op = declare(fresh, "t13::view(Tensor x) -> Tensor y", traits=["support_non_contiguous"])
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x: (seen.append(x.flags.c_contiguous), x.copy())[1])
    x = np.arange(12.0).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(op(x), x)
    assert seen == [False]


def test_optional_input(fresh):
    op = declare(fresh, "t14::bias(Tensor x, Tensor? b=None) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x, b: x if b is None else x + b)
    x = np.ones(3)
    np.testing.assert_array_equal(opforge.ops.t14.bias(x), x)
    np.testing.assert_array_equal(opforge.ops.t14.bias(x, np.ones(3)), 2 * x)


# -- functional API --------------------------------------------------------------

def test_functional_api_signature_doc_and_checking(fresh):
    op = declare(fresh, "t15::lerp(Tensor a, Tensor b, *, float w=0.5, str mode='linear') -> Tensor y",
                 doc="Blend two tensors.")
    op.def_infer(opforge.infer.broadcast())
    op.kernel(lambda a, b, w, mode: (1 - w) * a + w * b)
    f = opforge.ops.t15.lerp
    assert str(inspect.signature(f)) == "(a, b, *, w=0.5, mode='linear')"
    assert "t15::lerp(Tensor a" in f.__doc__ and "Blend two tensors." in f.__doc__ and "w (float)" in f.__doc__
    a, b = np.zeros(3), np.ones(3)
    np.testing.assert_allclose(f(a, b, w=0.25), 0.25 * b)
    np.testing.assert_allclose(f(a, b=b), 0.5 * b)
    with pytest.raises(AttrError, match="no input or attribute 'weight'"):
        f(a, b, weight=1.0)
    with pytest.raises(AttrError, match="'w' expects float"):
        f(a, b, w="heavy")
    assert "lerp" in dir(opforge.ops.t15) and "t15" in dir(opforge.ops)
    with pytest.raises(AttributeError, match="no op 't15::lerq' is registered"):
        opforge.ops.t15.lerq


def test_the_functional_api_follows_the_registry(fresh, monkeypatch):
    first = declare(fresh, "hot(Tensor x) -> Tensor y")
    first.def_infer(opforge.infer.same_as(0))
    first.kernel(lambda x: x + 1)
    present = []  # whether ops.hot was there while its replacement's function was being made
    make = opforge.ops.function_for
    monkeypatch.setattr(opforge.ops, "function_for", lambda op: present.append(hasattr(opforge.ops, "hot")) or make(op))
    second = opforge.op("hot(Tensor x) -> Tensor y", replace=True)
    second.def_infer(opforge.infer.same_as(0))
    second.kernel(lambda x: x + 2)
    assert present == [True] and opforge.ops.hot(np.zeros(1)).tolist() == [2.0]
    clash = declare(fresh, "hot::inner(Tensor x) -> Tensor y")  # a namespace named as an op: the op keeps the name
    clash.def_infer(opforge.infer.same_as(0))
    clash.kernel(lambda x: x)
    assert opforge.ops.hot.op is second
    opforge.registry.unregister("hot")
    assert opforge.ops.hot.inner.op is clash  # the name is free again: the namespace has it


def test_a_function_of_ops_pickles_by_name_and_keeps_a_set_doc(fresh):
    import copy
    import pickle
    import weakref

    op = declare(fresh, "pk::f(Tensor x) -> Tensor y")
    f = opforge.ops.pk.f
    assert pickle.loads(pickle.dumps(f)) is f and copy.deepcopy(opforge.ops.relu) is opforge.ops.relu
    assert weakref.ref(f)() is f
    op.kernel(lambda x: x)
    assert "Kernels: <lambda> (cpu)" in f.__doc__  # made when read: the kernel came after the function
    f.__doc__ = "Mine."
    assert f.__doc__ == "Mine."
    del f.__doc__
    assert f.__doc__.startswith("pk::f(Tensor x)")


def test_keyword_calls_survive_a_comparison_that_forgets_them(fresh):
    op = declare(fresh, "kwc::times(Tensor x, *, float s=1.0) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x, s: x * s)

    class Forgetful(float):  # its comparison drops the remembered calls, as another thread's op.kernel(...) would
        def __eq__(self, other):
            op._forget_keyword_calls()
            return float.__eq__(self, other)

        __hash__ = float.__hash__

    x = np.ones(2, np.float32)
    value = Forgetful(2.0)
    for _ in range(3):
        assert op(x, s=value).tolist() == [2.0, 2.0]
    assert op(x, s=3.0).tolist() == [3.0, 3.0]


def test_a_call_method_set_on_op_is_used(fresh, monkeypatch):
    op = declare(fresh, "kwc::plain(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x: x)
    monkeypatch.setattr(opforge.Op, "__call__", lambda self, *args, **kwargs: "patched")
    assert op(np.ones(1)) == "patched" and op(np.ones(1), s=1) == "patched"
    monkeypatch.undo()
    assert op(np.ones(1)).tolist() == [1.0]


def test_functional_api_of_builtins():
    x = np.array([-1.0, 2.0])
    np.testing.assert_array_equal(opforge.ops.relu(x), [0.0, 2.0])
    with pytest.raises(AttributeError, match="'nonexistent'"):  # Python's own message (it suggests close names)
        opforge.ops.nonexistent


# -- declarations files ------------------------------------------------------------

def test_load_ops_from_yaml_and_json(tmp_path, fresh):
    (tmp_path / "scale.cc").write_text(SCALE)
    (tmp_path / "ops.yaml").write_text(
        "ops:\n"
        "  - schema: \"t16::scale(Tensor x, *, float factor=2.0) -> Tensor y\"\n"
        "    doc: Multiply by a constant.\n"
        "    infer: same_as\n"
        "    kernels:\n"
        "      - source: scale.cc:Scale\n"
        "        dtypes: {x: [float32, float64]}\n")
    pytest.importorskip("yaml")
    (op,) = opforge.load_ops(tmp_path / "ops.yaml")
    fresh.append(op.name)
    np.testing.assert_array_equal(opforge.ops.t16.scale(np.ones(3, np.float32), factor=4.0), [4, 4, 4])
    (tmp_path / "ops.json").write_text(json.dumps([{
        "schema": "t17::neg(Tensor x) -> Tensor y", "infer": "same_as",
        "kernels": [{"python": "numpy:negative", "reference": True, "fallback": True}]}]))
    (neg,) = opforge.load_ops(tmp_path / "ops.json")
    fresh.append(neg.name)
    np.testing.assert_array_equal(opforge.ops.t17.neg(np.ones(2)), [-1, -1])
    (tmp_path / "bad.json").write_text(json.dumps([{"schema": "t18::f(Tensor x) -> Tensor", "kernel": []}]))
    with pytest.raises(SchemaError, match="unknown key"):
        opforge.load_ops(tmp_path / "bad.json")


def test_a_declarations_file_holds_check_gradient_and_sbp(tmp_path, fresh):
    (tmp_path / "t16b_rules.py").write_text(
        "def check(x, *, factor):\n"
        "    return 'factor must not be 0' if factor == 0 else None\n"
        "def grad(saved, dy, *, factor):\n"
        "    import opforge\n"
        "    return opforge.ops.mul(dy, factor)\n"
        "def kernel(x, *, factor):\n"
        "    return x * factor\n")
    (tmp_path / "ops.json").write_text(json.dumps([{
        "schema": "t16b::scale(Tensor x, *, float factor=2.0) -> Tensor y", "infer": "same_as",
        "traits": ["no_side_effect"],
        "check": "t16b_rules:check", "grad": {"rule": "t16b_rules:grad"},
        "sbp": [{"x": "S(0)", "y": "S(0)"}, {"x": "S(-1)", "y": "S(-1)"}],
        "kernels": [{"python": "t16b_rules:kernel"}]}]))
    (op,) = opforge.load_ops(tmp_path / "ops.json")
    fresh.append(op.name)
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(opforge.grad(lambda v: opforge.ops.reduce_sum(op(v, factor=3.0)))(x),
                                  np.full((2, 3), 3.0))
    with pytest.raises(CheckError, match="factor must not be 0"):
        op(x, factor=0.0)
    shown = [str(s) for s in op.sbp_signatures([TensorSpec([2, 3])])]
    assert shown[:2] == ["x:S(0) -> y:S(0)", "x:S(1) -> y:S(1)"]
    (tmp_path / "bad.json").write_text(json.dumps([{"schema": "t16c::f(Tensor x) -> Tensor y",
                                                    "sbp": [{"x": "S(x)", "y": "B"}]}]))
    with pytest.raises(SchemaError, match="t16c::f.*'S\\(x\\)' is not an SBP; expected S\\(axis\\), B or P"):
        opforge.load_ops(tmp_path / "bad.json")
    assert opforge.lookup("t16c::f") is None  # no half-declared op


# -- check_op ---------------------------------------------------------------------

def test_check_op_passes_a_correct_op_and_runs_every_variant(fresh):
    op = declare(fresh, "t19::scale(Tensor x, *, float factor=2.0) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.reference(lambda x, factor: (x * np.float32(factor)).astype(x.dtype))
    for isa in ("sse41", "avx2"):
        op.kernel(code=SCALE, function="Scale", dtypes={"x": ["float32", "float64"]}, isa=isa)
    checks = check_op(op, np.random.randn(4, 3).astype(np.float32), factor=1.5)
    agreed = [name for name, ok, _ in checks if ok and "agrees with" in name]
    assert len(agreed) == sum(opforge.cpu_features()[isa] for isa in ("sse41", "avx2"))
    assert any("rejects 'half'" in name for name, ok, _ in checks if ok)


def test_check_op_catches_a_wrong_kernel(fresh):
    op = declare(fresh, "t20::twice(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.reference(lambda x: 2 * x)
    op.kernel(lambda x: 2 * x + (x.size > 3), name="off_by_one")
    with pytest.raises(OpCheckFailure, match="off_by_one.*agrees with"):
        check_op(op, np.ones(5))


def test_check_op_catches_a_mutating_kernel(fresh):
    def sneaky(x):
        x += 1
        return x - 1

    op = declare(fresh, "t21::sneaky(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(sneaky, name="sneaky")
    with pytest.raises(OpCheckFailure, match="sneaky leaves inputs unchanged"):
        check_op(op, np.ones(3))


def test_check_op_catches_wrong_dynamic_inference(fresh):
    op = declare(fresh, "t22::grow(Tensor x) -> Tensor y")
    op.def_infer(lambda x: TensorSpec([x.shape[0] + 1], x.dtype))  # forgets that -1 means unknown
    op.kernel(lambda x: np.append(x, 0.0))
    with pytest.raises(OpCheckFailure, match="inference with unknown dims agrees"):
        check_op(op, np.ones(3))


# -- CLI ---------------------------------------------------------------------------

def test_cli_ops_and_doctor():
    ops = subprocess.run([sys.executable, "-m", "opforge", "ops"], capture_output=True, text=True, check=True)
    assert "relu(Tensor x) -> Tensor y" in ops.stdout and "kernel Relu<float32> (cpu)" in ops.stdout
    doctor = subprocess.run([sys.executable, "-m", "opforge", "doctor"], capture_output=True, text=True, check=True)
    assert "c++ compiler:" in doctor.stdout and "CPU features:" in doctor.stdout and "CUDA devices:" in doctor.stdout


def test_examples_define_op():
    out = subprocess.run([sys.executable, "examples/define_op.py"], capture_output=True, text=True, check=True,
                         cwd=__import__("pathlib").Path(__file__).resolve().parent.parent).stdout
    assert "selected kernel: LeakyRelu<float32>" in out and "matches reference: True" in out


def test_the_default_call_does_not_inherit_an_equal_attribute_of_another_type(fresh):
    op = declare(fresh, "t23::kind(Tensor x, *, int k=1) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x, k: x * 0 + (10 if type(k) is int else 20))
    x = np.zeros(1)
    with pytest.raises(AttrError):
        op(x, k=1.5)
    assert op(x)[0] == 10 and op(x, k=1)[0] == 10 and op(x)[0] == 10


def test_launcher_forget_keeps_it_usable():
    x = np.array([-1.0, 2.0])
    relu = opforge.lookup("relu")
    np.testing.assert_array_equal(relu(x), [0, 2])
    relu._default_launcher.forget()
    assert relu._default_launcher.stats["plans"] == 0
    np.testing.assert_array_equal(relu(x), [0, 2])


def test_a_launcher_takes_every_kind_of_call():
    """Plain arrays go straight to the kernel (vectorcall); everything else takes the general path."""
    a, b = np.arange(4.0), np.ones(4)
    opforge.lookup("add")(a, b)
    add = opforge.lookup("add")._default_launcher
    add.forget()
    np.testing.assert_array_equal(add(a, b), [1, 2, 3, 4])  # a plan miss: the planner gets the arrays as a tuple
    np.testing.assert_array_equal(add(*(a, b)), [1, 2, 3, 4])
    np.testing.assert_array_equal(type(add).__call__(add, a, b), [1, 2, 3, 4])  # tp_call, with a tuple
    np.testing.assert_array_equal(add([0.0, 1.0], b[:2]), [1, 2])  # a list: converted first
    np.testing.assert_array_equal(add(a[::2], b[:2]), [1, 3])  # a view that is not contiguous
    assert add.stats["plans"] == 2  # (float64 x2 at 4 and at 2 elements)
    before = sys.getrefcount(a), sys.getrefcount(b)
    for _ in range(100):
        add(a, b)
        add.forget()  # a plan miss each time too
    assert (sys.getrefcount(a), sys.getrefcount(b)) == before  # no reference kept or lost
    with pytest.raises(opforge.OpforgeError):
        add(a)  # one input of two
    with pytest.raises(opforge.OpforgeError):
        add(a, b, alpha=1.0)  # an attribute add does not have


def test_native_kernel_with_an_absent_optional_input_falls_back_or_says_why(fresh):
    op = declare(fresh, "t24::maybe(Tensor x, Tensor? b=None) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(code=SCALE.replace("Scale", "Maybe").replace('Attr<float>("factor")', "1"), function="Maybe",
              dtypes={"x": ["float64"]})
    with pytest.raises(NoKernelError, match="'b' is absent"):
        opforge.ops.t24.maybe(np.ones(2))
    op.reference(fallback=True)(lambda x, b: x if b is None else x + b)
    np.testing.assert_array_equal(opforge.ops.t24.maybe(np.ones(2)), [1, 1])


def test_clear_errors_for_bad_names_ragged_inputs_and_missing_sources(tmp_path):
    with pytest.raises(SchemaError, match="keyword"):
        parse_schema("f(Tensor x, *, float lambda=1.0) -> Tensor")
    with pytest.raises(SchemaError, match="starts with '_'"):
        parse_schema("f(Tensor _op) -> Tensor")
    with pytest.raises(DTypeError, match="relu.*rectangular"):
        opforge.ops.relu([[1.0, 2.0], [3.0]])
    with pytest.raises(opforge.KernelSourceError, match="missing.cc"):
        opforge.Custom(f"{tmp_path}/missing.cc:F", [1], "float32")


def test_keyword_calls_are_remembered_by_value_and_never_mix_up():
    rs = opforge.lookup("reduce_sum")
    x = np.arange(6.0).reshape(2, 3)
    axes = [0]
    np.testing.assert_array_equal(rs(x, axes=axes), x.sum(axis=0))
    axes[0] = 1  # the same list, changed in place: a new call
    np.testing.assert_array_equal(rs(x, axes=axes), x.sum(axis=1))
    np.testing.assert_array_equal(rs(x, axes=(0,)), x.sum(axis=0))
    np.testing.assert_array_equal(rs(x, axes=[1], keep_dims=True), x.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(rs(x, keep_dims=True, axes=[1]), x.sum(axis=1, keepdims=True))
    for _ in range(2):  # a bad value is refused every time, never remembered
        with pytest.raises(opforge.AttrError, match="keep_dims"):
            rs(x, axes=[1], keep_dims="yes")
    lr = opforge.lookup("leaky_relu")
    v = np.array([-2.0, 1.0])
    for alpha in (0.5, 0.25, 0.5, 0.125, 0.25):  # alternating values find their own launchers
        np.testing.assert_array_equal(lr(v, alpha=alpha), np.where(v > 0, v, alpha * v))


def test_the_functional_api_calls_the_op_object():
    x = np.array([-2.0, 1.0])
    np.testing.assert_allclose(opforge.ops.leaky_relu(x), [-0.02, 1.0], rtol=1e-7)  # alpha crosses as a float32
    assert opforge.ops.leaky_relu(x, alpha=0.5).tolist() == [-1.0, 1.0]
    assert opforge.ops.leaky_relu(x=x, alpha=0.25).tolist() == [-0.5, 1.0]  # a tensor by name: the general path
    assert opforge.ops.reduce_sum(np.ones((2, 3)), axes=[1]).tolist() == [3.0, 3.0]
