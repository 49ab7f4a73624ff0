"""Custom / CustomRegOp and the aot runtime, end to end through real C++ kernels.

The kernels live in tests/kernels/ (ops.cc, attr_probe.cc, prebuilt.cc,
mindspore_compat.cc).  Each
source is compiled once per session into the session's cache; ops built from
the same source share the loaded library.
"""
from __future__ import annotations

import ctypes
import gc
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import declare, encode_probe

import opforge
from opforge import Custom, CustomRegOp, DataType, TensorSpec
from opforge.runtime.aot import workspace_sizes

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")

KERNELS = Path(__file__).resolve().parent / "kernels"
OPS = KERNELS / "ops.cc"
PROBE = KERNELS / "attr_probe.cc"
COMPAT = KERNELS / "mindspore_compat.cc"
ABI1 = "-D_GLIBCXX_USE_CXX11_ABI=1"


# --------------------------------------------------------------------------
# helpers


def reg(op_name, inputs=("x",), outputs=("y",), attrs=None, positional=(), dtype_format=None, target="CPU"):
    """Registration info: ``attrs`` carry values, ``positional`` names value-less attributes."""
    info = CustomRegOp(op_name)
    for index, name in enumerate(inputs):
        info = info.input(index, name)
    for index, name in enumerate(outputs):
        info = info.output(index, name)
    if dtype_format is not None:
        info = info.dtype_format(*dtype_format)
    for name, value in (attrs or {}).items():
        info = info.attr(name, "required", "all", value=value)
    for name in positional:
        info = info.attr(name, "required", "all")
    return info.target(target).get_op_info()


def ops_custom(function, out_shape, out_dtype, **reg_kwargs):
    return Custom(f"{OPS}:{function}", out_shape, out_dtype, "aot",
                  reg_info=reg(reg_kwargs.pop("op_name", function), **reg_kwargs))


def rng(seed=0):
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def ops_lib(opforge_cache_dir):
    """ctypes view of the loaded ops.cc library (for its exported counters)."""
    op = ops_custom("Lin", lambda x, w: x, "float32", inputs=("x", "w"), attrs={"a": 1.0, "b": 1.0})
    lib = ctypes.CDLL(str(op.aot_kernel.library.path))
    # The same loaded instance as opforge's, so the counters are the kernels' own.
    assert ctypes.cast(lib.InitCalls, ctypes.c_void_p).value == op.aot_kernel.library.address("InitCalls")
    return lib


# --------------------------------------------------------------------------
# attributes of every type, through both string ABIs

PROBE_VALUES = [
    dict(flag=True, width=48, ratio=0.1, label="héllo wörld", ints=(3, -7, 2**40), floats=(0.25, -1.5, 3.3),
         grid=((1, 2, 3), (-4,)), table=((0.5, 1.25), (-2.75,), ())),
    # int read as float, empty string and lists, NUL inside a string, ints read as float lists
    dict(flag=False, width=40, ratio=-3, label="nul\x00inside", ints=(), floats=(1, 2),
         grid=((0,),), table=((1, 2), (3, 4))),
]


def probe_op(variant, values, monkeypatch):
    """(op, its AotKernel) for the attribute probe, built the way ``variant`` says."""
    if variant == "custom-abi0":  # Custom's default: -D_GLIBCXX_USE_CXX11_ABI=0, as MindSpore
        op = Custom(f"{PROBE}:AttrProbe", None, "float64", "aot", reg_info=reg("probe", attrs=values))
        return op, op.aot_kernel
    if variant == "custom-abi1":  # Custom has no cflags argument; the flags variable reaches its build
        with monkeypatch.context() as patch:
            patch.setenv("OPFORGE_CXXFLAGS", ABI1)
            op = Custom(f"{PROBE}:AttrProbe", None, "float64", "aot", reg_info=reg("probe", attrs=values))
        return op, op.aot_kernel
    assert variant == "aotkernel-abi1"  # the general Op with an AotKernel built with explicit cflags
    kernel = opforge.AotKernel(f"{PROBE}:AttrProbe", cflags=[ABI1])
    op = opforge.Op("probe_op", ["x"], ["y"], [opforge.AttrDef(k, "any", v) for k, v in values.items()])
    op.add_kernel(kernel.load())  # inference: the library's AttrProbeInferShape (dtype of the input)
    return op, kernel


@pytest.mark.parametrize("values", PROBE_VALUES, ids=["set-a", "set-b"])
@pytest.mark.parametrize("variant", ["custom-abi0", "custom-abi1", "aotkernel-abi1"])
def test_attributes_of_every_type_round_trip(variant, values, monkeypatch):
    op, kernel = probe_op(variant, values, monkeypatch)
    assert kernel.library.cxx11_abi is (variant != "custom-abi0")
    out = op(np.zeros(1, np.float64))
    assert out.shape == (2, values["width"])  # from AttrProbeInferShape, which reads Attr<int64_t>
    # row 0 was read in Init and kept as kernel data, row 1 in the kernel (through the workspace)
    np.testing.assert_array_equal(out, encode_probe(values))
    lib = ctypes.CDLL(str(kernel.library.path))
    assert lib.ProbeHeader() == 1  # opforge's own header
    assert lib.ProbeStringAbi() == (0 if variant == "custom-abi0" else 1)  # as compiled


def test_list_valued_attributes_given_as_lists():
    values = dict(PROBE_VALUES[0], ints=[3, -7, 2**40], grid=[[1, 2, 3], [-4]])
    op = Custom(f"{PROBE}:AttrProbe", None, "float64", "aot", reg_info=reg("probe_lists", attrs=values))
    np.testing.assert_array_equal(op(np.zeros(1, np.float64)), encode_probe(values))


@pytest.mark.parametrize("value", [np.float32(2.0), np.int64(2), np.int32(2)], ids=["float32", "int64", "int32"])
def test_numpy_scalar_attribute_values(value):
    op = ops_custom("Scale", lambda x: x, "float32", attrs={"scale": value}, op_name="numpy_scale")
    np.testing.assert_array_equal(op(np.arange(3, dtype=np.float32)), np.arange(3, dtype=np.float32) * 2)


def test_numpy_scalar_trailing_attribute_values():
    op = ops_custom("Scale", lambda x: x, "float32", positional=("scale",), op_name="numpy_scale_trailing")
    x = np.arange(3, dtype=np.float32)
    for value in (np.float32(2.0), np.int64(2), np.float64(2.0)):
        np.testing.assert_array_equal(op(x, value), x * 2)


def test_int_attribute_reads_as_float_but_float_not_as_int():
    x = np.zeros(1, np.float32)
    as_float = ops_custom("ReadFloat", [1], "float64", attrs={"value": 7})
    assert as_float(x)[0] == 7.0
    as_int = ops_custom("ReadInt", [1], "float64", attrs={"value": 7})
    assert as_int(x)[0] == 7.0
    float_as_int = ops_custom("ReadInt", [1], "float64", attrs={"value": 2.5}, op_name="float_as_int")
    with pytest.raises(opforge.AttrError) as info:
        float_as_int(x)
    assert "float_as_int" in str(info.value) and "'value'" in str(info.value)
    assert as_int(x)[0] == 7.0  # the library still works afterwards


@pytest.mark.parametrize("first, second", [(2.0, 2), (2, 2.0), (True, 1), (1, True)])
def test_trailing_attribute_values_of_different_types_are_not_confused(first, second):
    op = ops_custom("ReadInt", [1], "float64", positional=("value",), op_name="read_int_trailing")
    x = np.zeros(1, np.float32)
    for value in (first, second):
        if type(value) is int:  # Attr<int64_t> accepts ints only
            assert op(x, value)[0] == value
        else:
            with pytest.raises(opforge.AttrError):
                op(x, value)


@pytest.mark.parametrize("function, attribute", [
    ("AskUnknown", "no_such_attr"),          # in the kernel
    ("AskUnknownInInit", "missing_in_init"),  # in Init
    ("SwallowUnknown", "ghost"),             # in the kernel, which catches (...) and returns 0
])
def test_unknown_attribute_is_an_attr_error_naming_op_and_attribute(function, attribute):
    op = ops_custom(function, [1], "float32", attrs={"present": 1}, op_name=f"op_{function}")
    for _ in range(2):  # and again: nothing is left in a broken state
        with pytest.raises(opforge.AttrError) as info:
            op(np.zeros(1, np.float32))
        message = str(info.value)
        assert f"op_{function}" in message and f"'{attribute}'" in message


def test_unknown_attribute_in_infer_shape_is_an_attr_error():
    op = ops_custom("RowSum", None, "float32", op_name="rowsum_without_keep_dim")
    with pytest.raises(opforge.AttrError) as info:
        op(np.ones((2, 3), np.float32))
    assert "rowsum_without_keep_dim" in str(info.value) and "'keep_dim'" in str(info.value)


# --------------------------------------------------------------------------
# workspace, Init reuse, kernel data lifetime


def test_workspaces_follow_outputs_in_params():
    op = ops_custom("AddMulWs", lambda x, w: x, "float32", inputs=("x", "w"))
    for shape in [(5,), (3, 7), (5,), (1, 2, 3)]:
        x = rng(1).standard_normal(shape).astype(np.float32)
        w = rng(2).standard_normal(shape).astype(np.float32)
        # AddMulWs returns 5 (-> KernelError) unless nparam == 2 inputs + 1 output + 2 workspaces
        np.testing.assert_allclose(op(x, w), (x + w) + (x * w), rtol=1e-6)


def test_workspace_sizes_are_rounded_to_64_after_the_input_floor():
    assert workspace_sizes([8, 8], 420, op="t", function="TInit") == (448, 448)
    assert workspace_sizes([100, 0], 0, op="t", function="TInit") == (128, 0)
    assert workspace_sizes([500], 420, op="t", function="TInit") == (512,)


TWO_WORKSPACES = r"""
#include <cstdint>
#include <cstring>
#include "custom_aot_extra.h"
extern "C" int TwoWorkspacesInit(int *ndims, int64_t **shapes, const char **dtypes, AotExtra *extra) {
  extra->SetWorkSpace({8, 8});
  return 0;
}
// y = x; 3 when a workspace does not start on 64 bytes.
extern "C" int TwoWorkspaces(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
  for (int k = 2; k < nparam; k++)
    if (reinterpret_cast<uintptr_t>(params[k]) % 64 != 0) return 3;
  std::memcpy(params[1], params[0], static_cast<size_t>(shapes[0][0]) * sizeof(float));
  return nparam == 4 ? 0 : 5;
}
"""


def test_every_workspace_starts_aligned_eagerly_and_in_a_graph(fresh):
    op = declare(fresh, "tcustom::two_workspaces(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(code=TWO_WORKSPACES, function="TwoWorkspaces", dtypes={"x": ["float32"]})
    x = np.arange(105, dtype=np.float32)  # 420 bytes: the floor of both workspaces
    np.testing.assert_array_equal(op(x), x)
    graph = opforge.trace(op, TensorSpec([105], "float32"))
    np.testing.assert_array_equal(graph(x), x)


def scale_op(scale, name="scale"):
    return ops_custom("Scale", lambda x: x, "float32", attrs={"scale": scale}, op_name=name)


def test_init_runs_once_per_signature(ops_lib):
    start = ops_lib.InitCalls()
    op = scale_op(2.0)
    x4 = np.arange(4, dtype=np.float32)
    x23 = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(3):
        np.testing.assert_array_equal(op(x4), x4 * 2)
    assert ops_lib.InitCalls() - start == 1
    np.testing.assert_array_equal(op(x23), x23 * 2)  # new shape: Init again
    assert ops_lib.InitCalls() - start == 2
    np.testing.assert_array_equal(op(x4 + 1), (x4 + 1) * 2)  # known signature, new data: no Init
    np.testing.assert_array_equal(op(x23.astype(np.float32, order="F")), x23 * 2)  # same signature after copying
    assert ops_lib.InitCalls() - start == 2
    other = scale_op(3.0)  # a new attribute value: Init again, and it sees the new value
    np.testing.assert_array_equal(other(x4), x4 * 3)
    assert ops_lib.InitCalls() - start == 3
    np.testing.assert_array_equal(op(x4), x4 * 2)  # the first op keeps its own kernel data
    assert ops_lib.InitCalls() - start == 3


def test_kernel_data_is_deleted_once_when_the_op_is_dropped(ops_lib):
    gc.collect()
    inits, deleted = ops_lib.InitCalls(), ops_lib.DataDeleted()
    op = scale_op(0.5)
    for n in (1, 2, 3):
        op(np.ones(n, np.float32))
    assert ops_lib.InitCalls() - inits == 3
    assert ops_lib.DataDeleted() - deleted == 0  # still in use
    del op
    gc.collect()
    assert ops_lib.DataDeleted() - deleted == 3
    gc.collect()
    assert ops_lib.DataDeleted() - deleted == 3  # never twice


def test_init_cache_eviction_frees_kernel_data_exactly_once(ops_lib):
    """An Init entry evicted from the kernel's cache is freed once nothing holds it.

    The native launcher keeps its last ``MAX_PLANS`` plans, each holding its
    signature's extra, so what is freed after N signatures is what neither the
    Init cache nor the plan cache still holds."""
    from opforge import _native

    gc.collect()
    inits, deleted = ops_lib.InitCalls(), ops_lib.DataDeleted()
    op = scale_op(1.5, name="scale_evicting")
    op.aot_kernel.init_cache_size = 2
    n = _native.MAX_PLANS + 4
    for k in range(1, n + 1):
        x = np.full(k, k, np.float32)
        np.testing.assert_array_equal(op(x), x * 1.5)
    assert ops_lib.InitCalls() - inits == n
    assert op.aot_kernel.init_cache_entries <= 2
    # Entries still in either cache are alive; everything older is freed (plans hold at most MAX_PLANS).
    freed = ops_lib.DataDeleted() - deleted
    assert n - max(2, _native.MAX_PLANS) <= freed <= n - 2
    # The first signature was evicted everywhere: Init runs again, correctly.
    np.testing.assert_array_equal(op(np.ones(1, np.float32)), np.full(1, 1.5, np.float32))
    assert ops_lib.InitCalls() - inits == n + 1
    del op
    gc.collect()
    assert ops_lib.DataDeleted() - deleted == n + 1  # every Init's data, each exactly once
    gc.collect()
    assert ops_lib.DataDeleted() - deleted == n + 1


def test_failing_init_is_a_kernel_error_and_its_kernel_data_is_freed(ops_lib):
    def failure(op):
        try:
            op(np.ones(2, np.float32))
        except opforge.KernelError as error:  # keep no traceback: its frames would hold the Init's extra
            return error.op, error.function, error.code, str(error)
        pytest.fail("RejectedInit's non-zero return was not reported")

    gc.collect()
    deleted = ops_lib.DataDeleted()
    op = ops_custom("Rejected", lambda x: x, "float32", attrs={"code": 4}, op_name="rejected_op")
    for attempt in range(1, 3):
        name, function, code, message = failure(op)
        assert (name, function, code) == ("rejected_op", "RejectedInit", 4)
        assert "rejected_op" in message and "RejectedInit" in message and "4" in message
        gc.collect()
        assert ops_lib.DataDeleted() - deleted == attempt  # the failed Init's kernel data is not leaked


# --------------------------------------------------------------------------
# inference with dynamic dims


@pytest.fixture(scope="module")
def rowsum_ops():
    return {keep: ops_custom("RowSum", None, "float32", attrs={"keep_dim": keep}, op_name=f"rowsum_{keep}")
            for keep in (False, True)}


def test_infer_shape_with_unknown_dims_and_rank(rowsum_ops):
    drop, keep = rowsum_ops[False], rowsum_ops[True]
    assert drop.infer(TensorSpec([4, None], "float32")).shape == (4,)
    assert drop.infer(TensorSpec([None, 5], "float32")).shape == (-1,)
    assert keep.infer(TensorSpec([None, 5], "float32")).shape == (-1, 1)
    assert keep.infer(TensorSpec([7, None], "float32")).shape == (7, 1)
    assert drop.infer(TensorSpec(None, "float32")).shape == (-2,)
    assert drop.infer(TensorSpec(None, "float32")).rank is None
    x = rng(3).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_allclose(drop(x), x.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(keep(x), x.sum(axis=1, keepdims=True), rtol=1e-5)


def test_python_out_shape_callable_sees_dynamic_dims():
    seen = []

    def out_shape(x, w):
        seen.append((list(x), list(w)))
        return [x[0], w[-1]] if len(x) == 2 and x != [-2] else [-2]

    op = ops_custom("Lin", out_shape, "float32", inputs=("x", "w"), attrs={"a": 1.0, "b": 0.0})
    assert op.infer(TensorSpec([None, 3]), TensorSpec([2, None])).shape == (-1, -1)
    assert seen[-1] == ([-1, 3], [2, -1])
    assert op.infer(TensorSpec(None), TensorSpec([2, 3])).shape == (-2,)
    assert seen[-1] == ([-2], [2, 3])
    x = rng(4).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(op(x, x), x, rtol=1e-6)


def test_multi_output_infer_shape_returning_vector_of_vectors():
    op = ops_custom("SumDiffDot", None, ("float32", "float32", "float32"), inputs=("x", "w"),
                    outputs=("sum", "diff", "dot"))
    specs = op.infer(TensorSpec([2, None]), TensorSpec([2, None]))
    assert isinstance(specs, tuple) and [s.shape for s in specs] == [(2, -1), (2, -1), (1,)]
    x = rng(5).standard_normal((2, 5)).astype(np.float32)
    w = rng(6).standard_normal((2, 5)).astype(np.float32)
    total, diff, dot = op(x, w)
    np.testing.assert_allclose(total, x + w, rtol=1e-6)
    np.testing.assert_allclose(diff, x - w, rtol=1e-6)
    np.testing.assert_allclose(dot, [np.sum(x * w)], rtol=1e-5)


# --------------------------------------------------------------------------
# output structure


def test_three_outputs_from_static_out_shape():
    op = ops_custom("SumDiffDot", ([4], [4], [1]), ("float32",) * 3, inputs=("x", "w"), outputs=("s", "d", "p"))
    x, w = np.arange(4, dtype=np.float32), np.full(4, 2.0, np.float32)
    result = op(x, w)
    assert isinstance(result, tuple) and len(result) == 3
    assert all(isinstance(r, np.ndarray) and r.dtype == np.float32 for r in result)
    np.testing.assert_array_equal(result[0], x + w)
    np.testing.assert_array_equal(result[1], x - w)
    np.testing.assert_array_equal(result[2], [np.dot(x, w)])


@pytest.mark.parametrize("out_shape", [([3],), lambda x, w: (x,)], ids=["static", "callable"])
def test_out_dtype_tuple_of_one_gives_a_tuple(out_shape):
    op = ops_custom("Lin", out_shape, ("float32",), inputs=("x", "w"), attrs={"a": 2.0, "b": 1.0})
    x, w = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    result = op(x, w)
    assert isinstance(result, tuple) and len(result) == 1
    np.testing.assert_array_equal(result[0], 2 * x + w)


def test_single_out_dtype_gives_an_array():
    op = ops_custom("Lin", [3], "float32", inputs=("x", "w"), attrs={"a": 2.0, "b": 1.0})
    x, w = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    result = op(x, w)
    assert isinstance(result, np.ndarray) and result.shape == (3,)
    np.testing.assert_array_equal(result, 2 * x + w)


# --------------------------------------------------------------------------
# prebuilt libraries


@pytest.fixture(scope="module")
def prebuilt_so(tmp_path_factory):
    so = tmp_path_factory.mktemp("prebuilt") / "libaxpy.so"
    subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", "-O2", "-D_GLIBCXX_USE_CXX11_ABI=0",
                    "-I", opforge.include_dir(), str(KERNELS / "prebuilt.cc"), "-o", str(so)], check=True)
    return so


def test_prebuilt_library_by_path(prebuilt_so):
    op = Custom(f"{prebuilt_so}:PrebuiltAxpy", lambda x, w: x, "float32", "aot",
                reg_info=reg("axpy", inputs=("x", "w"), attrs={"alpha": 3.0}))
    x = rng(7).standard_normal(8).astype(np.float32)
    w = rng(8).standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(op(x, w), 3 * x + w, rtol=1e-6)


def test_missing_symbol_suggests_a_close_exported_name(prebuilt_so):
    with pytest.raises(opforge.SymbolNotFoundError) as info:
        Custom(f"{prebuilt_so}:PrebuiltAxpi", [3], "float32", "aot", reg_info=reg("axpy_typo", attrs={"alpha": 1.0}))
    assert "PrebuiltAxpi" in str(info.value)
    assert "PrebuiltAxpy" in str(info.value)
    assert "PrebuiltAxpy" in info.value.close_matches


# --------------------------------------------------------------------------
# input layouts


@pytest.fixture(scope="module")
def lin():
    return ops_custom("Lin", lambda x, w: x, "float32", inputs=("x", "w"), attrs={"a": 2.0, "b": -0.5})


def _layouts():
    base = rng(9).standard_normal((6, 8)).astype(np.float32)
    return {
        "strided-slice": base[::2, 1::3],
        "fortran": np.asfortranarray(base),
        "transposed": base.T,
        "negative-strides": base[::-1, ::-2],
        "big-endian": base.astype(">f4"),
    }


@pytest.mark.parametrize("layout", list(_layouts()))
def test_non_contiguous_inputs(lin, layout):
    x = _layouts()[layout]
    x_before = np.array(x, copy=True)
    w = np.asfortranarray(rng(10).standard_normal(np.shape(x)).astype(np.float32))
    w_before = w.copy()
    y = lin(x, w)
    np.testing.assert_allclose(y, 2 * np.asarray(x, np.float32) - 0.5 * w, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(x), x_before)  # inputs are not mutated
    np.testing.assert_array_equal(w, w_before)


def test_contiguous_inputs_are_not_mutated(lin):
    x = rng(11).standard_normal(16).astype(np.float32)
    w = rng(12).standard_normal(16).astype(np.float32)
    x0, w0 = x.copy(), w.copy()
    y = lin(x, w)
    np.testing.assert_allclose(y, 2 * x0 - 0.5 * w0, rtol=1e-6)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(w, w0)
    assert not np.shares_memory(y, x) and not np.shares_memory(y, w)


# --------------------------------------------------------------------------
# value-less attributes as trailing arguments


@pytest.fixture(scope="module")
def lin_trailing():
    return ops_custom("Lin", lambda x, w: x, "float32", inputs=("x", "w"), attrs={"a": 2.0}, positional=("b",),
                      op_name="lin_trailing")


def test_trailing_positional_attribute(lin_trailing):
    x = np.arange(5, dtype=np.float32)
    w = np.full(5, 10.0, np.float32)
    np.testing.assert_allclose(lin_trailing(x, w, 0.7), 2 * x + np.float32(0.7) * w, rtol=1e-6)
    np.testing.assert_allclose(lin_trailing(x, w, -1.0), 2 * x - w, rtol=1e-6)
    np.testing.assert_allclose(lin_trailing(x, w, b=0.25), 2 * x + 0.25 * w, rtol=1e-6)


def test_missing_trailing_attribute_is_an_attr_error(lin_trailing):
    x = np.ones(3, np.float32)
    with pytest.raises(opforge.AttrError) as info:
        lin_trailing(x, x)
    assert "'b'" in str(info.value) and "lin_trailing" in str(info.value)


def test_extra_positional_argument_is_an_arity_error(lin_trailing, lin):
    x = np.ones(3, np.float32)
    with pytest.raises(opforge.ArityError):
        lin_trailing(x, x, 0.7, 0.8)
    with pytest.raises(opforge.ArityError):
        lin(x, x, 0.7)  # no value-less attribute at all


# --------------------------------------------------------------------------
# errors


def test_nonzero_return_is_a_kernel_error_with_op_function_and_code():
    op = ops_custom("FailWith", [1], "float32", attrs={"code": 7}, op_name="failing_op")
    with pytest.raises(opforge.KernelError) as info:
        op(np.zeros(1, np.float32))
    error = info.value
    assert (error.op, error.function, error.code) == ("failing_op", "FailWith", 7)
    message = str(error)
    assert "failing_op" in message and "FailWith" in message and "7" in message


RETURNS_CODE = r"""
#include <cstdint>
extern "C" int ReturnsCode(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                           void *stream, void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  return x[0] > 0 ? static_cast<int>(x[0]) : 0;  // x[0] = 3 or 4: those codes; else success
}
"""


def test_a_kernels_error_codes_are_explained_in_its_kernel_error(fresh):
    op = declare(fresh, "errors_demo(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(code=RETURNS_CODE, function="ReturnsCode", dtypes={"x": ["float32"]},
              errors={4: "input 'x' starts with 4, which this kernel refuses"})
    with pytest.raises(opforge.KernelError, match=r"returned error code 4: input 'x' starts with 4, which this "
                                                  r"kernel refuses$") as info:
        op(np.array([4.0], np.float32))
    assert info.value.code == 4
    with pytest.raises(opforge.KernelError, match=r"returned error code 3$"):  # a code the mapping lacks
        op(np.array([3.0], np.float32))
    graph = opforge.trace(op, opforge.TensorSpec([1], "float32"))  # the graph executor says the same
    with pytest.raises(opforge.KernelError, match="starts with 4, which this kernel refuses"):
        graph(np.array([4.0], np.float32))
    for bad in ({"4": "text"}, {0: "success is not an error"}, {4: 5}, [(4, "text")]):
        with pytest.raises(opforge.OpforgeError, match="errors= maps a kernel's non-zero return codes"):
            op.kernel(code=RETURNS_CODE, function="ReturnsCode", errors=bad)
    with pytest.raises(opforge.OpforgeError, match="errors= explains a C kernel's return codes"):
        op.kernel(lambda x: x, errors={4: "text"})


def test_cpp_exception_is_a_kernel_error_and_the_process_survives(lin):
    op = ops_custom("Throw", [1], "float32", attrs={"why": "the moon is full"}, op_name="throwing_op")
    for _ in range(2):
        with pytest.raises(opforge.KernelError) as info:
            op(np.zeros(1, np.float32))
        assert "kernel gave up: the moon is full" in str(info.value)
        assert info.value.op == "throwing_op" and info.value.function == "Throw"
    x = np.ones(2, np.float32)
    np.testing.assert_allclose(lin(x, x), 1.5 * x)  # still alive and working


def test_wrong_arity_is_an_arity_error(lin):
    x = np.ones(3, np.float32)
    with pytest.raises(opforge.ArityError):
        lin(x)
    with pytest.raises(opforge.ArityError):
        lin()


def test_dtype_contradicting_dtype_format_names_the_input():
    op = ops_custom("Lin", lambda x, w: x, "float32", inputs=("lhs", "rhs"), attrs={"a": 1.0, "b": 1.0},
                    dtype_format=(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default),
                    op_name="typed_lin")
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(op(x, x), 2 * x)
    with pytest.raises(opforge.DTypeError) as info:
        op(x, np.ones(3, np.float64))
    assert "'rhs'" in str(info.value) and "float64" in str(info.value)


def test_compile_error_reports_file_and_line(tmp_path):
    source = tmp_path / "broken_kernel.cc"
    source.write_text('#include "custom_aot_extra.h"\n'
                      'extern "C" int Broken(int nparam, void **params, int *ndims, int64_t **shapes,\n'
                      '                      const char **dtypes, void *stream, void *extra) {\n'
                      '  return 0 +;\n'
                      '}\n')
    with pytest.raises(opforge.CompileError) as info:
        Custom(f"{source}:Broken", [1], "float32", "aot")
    assert "broken_kernel.cc:4" in str(info.value)
    assert "error" in info.value.output


def test_missing_compiler_is_compiler_not_found(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "fresh-cache"))
    monkeypatch.setenv("OPFORGE_CXX", "/nonexistent/g++")
    with pytest.raises(opforge.CompilerNotFoundError) as info:
        ops_custom("Lin", lambda x, w: x, "float32", inputs=("x", "w"), attrs={"a": 1.0, "b": 1.0})
    assert "/nonexistent/g++" in str(info.value)


def test_out_shape_none_needs_an_infer_shape_export():
    with pytest.raises(opforge.InferenceError) as info:
        ops_custom("Lin", None, "float32", inputs=("x", "w"), attrs={"a": 1.0, "b": 1.0})
    assert "LinInferShape" in str(info.value)


@pytest.mark.parametrize("func", [str(OPS), "Lin", f"{OPS}:", f"{OPS}:not an identifier"])
def test_func_must_be_path_colon_function(func):
    with pytest.raises(opforge.SchemaError):
        Custom(func, [1], "float32", "aot")


@pytest.mark.parametrize("func_type", ["akg", "tbe", "hybrid", "julia", ""])
def test_unsupported_func_type_is_a_schema_error(func_type):
    with pytest.raises(opforge.SchemaError) as info:
        Custom(f"{OPS}:Lin", [1], "float32", func_type)
    assert repr(func_type) in str(info.value)


# --------------------------------------------------------------------------
# pyfunc


def test_pyfunc_custom():
    def clipped_sum(x, y):
        return np.clip(x + y, -1.0, 1.0)

    op = Custom(clipped_sum, lambda x, y: x, "float32", "pyfunc",
                reg_info=reg("clipped_sum", inputs=("x", "y")))
    x = rng(13).standard_normal((3, 4)).astype(np.float32)
    y = rng(14).standard_normal((3, 4)).astype(np.float32)
    result = op(x, y)
    assert result.dtype == np.float32 and result.shape == (3, 4)
    np.testing.assert_allclose(result, np.clip(x + y, -1, 1), rtol=1e-6)


def test_pyfunc_output_shape_is_checked_against_out_shape():
    op = Custom(lambda x: np.concatenate([x, x]), lambda x: x, "float32", "pyfunc")
    with pytest.raises(opforge.ShapeError):
        op(np.ones(3, np.float32))
    fixed = Custom(lambda x: np.zeros(4), [5], "float32", "pyfunc")
    with pytest.raises(opforge.ShapeError):
        fixed(np.ones(3, np.float32))


# --------------------------------------------------------------------------
# every dtype name of the ABI reaches the kernel

ABI_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64"]


@pytest.mark.parametrize("dtype", ABI_DTYPES)
def test_dtype_string_reaches_the_kernel(dtype):
    op = ops_custom("DtypeName", [16], "uint8", attrs={"expected": dtype}, op_name=f"dtype_name_{dtype}")
    out = op(np.zeros((2, 3), dtype=dtype))  # DtypeName returns 3 (-> KernelError) if dtypes[0] != expected
    assert out.dtype == np.uint8
    assert bytes(out).rstrip(b"\0").decode() == dtype
    assert dtype in opforge.ABI_DTYPES


def test_dtype_mismatch_in_the_kernel_is_seen():
    op = ops_custom("DtypeName", [16], "uint8", attrs={"expected": "float32"}, op_name="dtype_mismatch")
    with pytest.raises(opforge.KernelError) as info:
        op(np.zeros(3, np.int32))
    assert info.value.code == 3


# --------------------------------------------------------------------------
# threads


def test_kernels_run_concurrently_with_private_workspaces(ops_lib):
    """Rendezvous only returns once `parties` calls are inside it together:
    impossible unless the GIL is released during kernels.  Each call copies
    its input through its workspace, so a shared workspace would mix results."""
    parties = 4
    op = ops_custom("Rendezvous", lambda x: x, "float32", attrs={"parties": parties})
    # No warm-up: the first round also plans the signature from several threads at once.
    for round_ in range(2):
        ops_lib.ResetBarrier()
        inputs = [np.full(1000, 10 * round_ + k, np.float32) for k in range(parties)]
        results, errors = concurrently(op, inputs)
        assert not errors, errors
        for k in range(parties):
            np.testing.assert_array_equal(results[k], 2 * inputs[k])


def concurrently(op, inputs):
    """Calls op(x) for every x in ``inputs``, each on its own thread; returns (results, errors)."""
    results, errors = [None] * len(inputs), []

    def call(k):
        try:
            results[k] = op(inputs[k])
        except Exception as error:  # noqa: BLE001 - reported by the caller
            errors.append(error)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results, errors


def test_many_threads_many_calls(lin):
    n_threads, n_calls = 8, 40
    failures = []

    def work(seed):
        r = rng(seed)
        try:
            for _ in range(n_calls):
                shape = (int(r.integers(1, 5)), int(r.integers(1, 300)))
                x = r.standard_normal(shape).astype(np.float32)
                w = r.standard_normal(shape).astype(np.float32)
                y = lin(x, w)
                if not np.allclose(y, 2 * x - 0.5 * w, rtol=1e-6, atol=1e-6):
                    failures.append((seed, shape))
        except Exception as error:  # noqa: BLE001 - reported below
            failures.append(error)

    threads = [threading.Thread(target=work, args=(100 + k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures


def test_custom_takes_build_options(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "factor.h").write_text("#define FACTOR_FROM_HEADER 3\n")
    (tmp_path / "k.cc").write_text(
        '#include "custom_aot_extra.h"\n#include "factor.h"\n#include <string>\n'
        'extern "C" int K(int n, void **p, int *nd, int64_t **s, const char **d, void *st, void *e) {\n'
        '  std::string mode = static_cast<AotExtra *>(e)->Attr<std::string>("mode");\n'
        '  static_cast<float *>(p[1])[0] = FACTOR_FROM_HEADER * EXTRA_TERM + mode.size()\n'
        '      + 100 * _GLIBCXX_USE_CXX11_ABI;\n  return 0;\n}\n')
    info = (CustomRegOp("build_options").input(0, "x").output(0, "y")
            .attr("mode", "required", "str", value="ab").target("CPU").get_op_info())
    for abi in (False, True):
        op = Custom(f"{tmp_path}/k.cc:K", [1], "float32", "aot", reg_info=info, cflags=["-DEXTRA_TERM=2"],
                    include_dirs=[tmp_path / "inc"], cxx11_abi=abi)
        assert op(np.zeros(1, np.float32))[0] == 3 * 2 + 2 + 100 * abi
        assert op.aot_kernel.library.cxx11_abi is abi


def test_registration_and_pyfunc_mistakes_are_typed_errors():
    with pytest.raises(opforge.SchemaError, match="attribute needs a name"):
        CustomRegOp("unnamed").attr(None, "required", "all", value=1)
    with pytest.raises(opforge.InferenceError, match="pyfunc Custom needs out_shape"):
        Custom(lambda x: x, None, "float32", "pyfunc")


# --------------------------------------------------------------------------
# outputs follow the registration; the input count is fixed; values keep their type


def rowmax(out_dtype):
    """Row maximum (float64) and its column (int64), registered for float64 input only."""
    info = reg("rowmax", outputs=("top", "where"),
               dtype_format=(DataType.F64_Default, DataType.F64_Default, DataType.I64_Default))
    return Custom(f"{COMPAT}:RowMaxArg", lambda x: ([x[0]], [x[0]]), out_dtype, "aot", reg_info=info)


ROWS = np.array([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])


def test_out_dtype_none_takes_each_output_dtype_from_the_registration():
    top, where = rowmax(None)(ROWS)
    assert top.dtype == np.float64 and where.dtype == np.int64  # not the input's float64 for both
    np.testing.assert_array_equal(top, [5.0, 7.0])
    np.testing.assert_array_equal(where, [1, 0])
    specs = rowmax(None).infer(TensorSpec([None, 3], "float64"))
    assert [s.dtype for s in specs] == ["float64", "int64"]


@pytest.mark.parametrize("out_dtype", [["float32", "int64"], ("float64", "int32"), "float64"])
def test_out_dtype_contradicting_the_registration_is_a_dtype_error(out_dtype):
    op = rowmax(out_dtype)  # the kernel would write float64/int64 into buffers sized for out_dtype
    with pytest.raises(opforge.DTypeError) as info:
        op(ROWS)
    message = str(info.value)
    wrong = "top" if "float32" in out_dtype else "where"
    assert f"output '{wrong}'" in message and "rowmax" in message
    assert "x=float64, top=float64, where=int64" in message  # the row
    with pytest.raises(opforge.DTypeError):
        op.infer(TensorSpec([2, 3], "float64"))


def test_out_dtype_agreeing_with_the_registration_runs():
    top, where = rowmax(["float64", "int64"])(ROWS)
    np.testing.assert_array_equal(where, [1, 0])
    assert top.dtype == np.float64


def test_out_dtype_entry_none_takes_that_output_dtype_from_the_registration():
    top, where = rowmax(["float64", None])(ROWS)
    assert top.dtype == np.float64 and where.dtype == np.int64
    np.testing.assert_array_equal(where, [1, 0])


def test_out_dtype_function_is_checked_against_the_registration():
    with pytest.raises(opforge.DTypeError, match="output 'where'"):
        rowmax(lambda x: (x, x))(ROWS)


def test_dtype_format_row_of_the_wrong_length_is_a_schema_error():
    with pytest.raises(opforge.SchemaError, match="2 entries for 1 input"):
        Custom(f"{COMPAT}:RowMaxArg", lambda x: ([x[0]], [x[0]]), None, "aot",
               reg_info=reg("short_row", outputs=("top", "where"),
                            dtype_format=(DataType.F64_Default, DataType.F64_Default)))


def test_input_count_without_registration_is_fixed_by_the_first_call():
    op = Custom(f"{COMPAT}:Square", [3], "float32", "aot")
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(op(x), x * x)
    for args in [(x, x), (), (x, x, x)]:  # the kernel would read an output (or nothing) as its input
        with pytest.raises(opforge.ArityError) as info:
            op(*args)
        assert "'Square' takes 1 tensor input(s)" in str(info.value) and f"got {len(args)}" in str(info.value)
    np.testing.assert_array_equal(op(x + 1), (x + 1) ** 2)  # still works


def test_input_count_without_registration_is_fixed_by_out_shape_parameters():
    op = Custom(f"{COMPAT}:Square", lambda x: x, "float32", "aot")
    with pytest.raises(opforge.ArityError, match="takes 1 tensor input.*out_shape's parameters.*got 2"):
        op(np.ones(2, np.float32), np.ones(2, np.float32))  # even as the first call
    with pytest.raises(opforge.ArityError):
        op.infer(TensorSpec([2]), TensorSpec([2]))
    np.testing.assert_array_equal(op(np.full(2, 3, np.float32)), [9, 9])


def test_zero_inputs_on_a_first_call_is_an_arity_error():
    op = Custom(f"{COMPAT}:Square", [3], "float32", "aot")
    with pytest.raises(opforge.ArityError, match="at least one"):
        op()


def axis_op(kind, value, scale=2.5):
    info = (CustomRegOp("axis_attr").input(0, "x").output(0, "y")
            .attr("reduce_axis", "required", kind, value=value)
            .attr("scale", "required", "float", value=scale).target("CPU").get_op_info())
    return Custom(f"{COMPAT}:Axis", [2], "float64", "aot", reg_info=info)


@pytest.mark.parametrize("kind", ["float", "int", "all"])
def test_attribute_values_keep_their_own_type(kind):
    # MindSpore hands the kernel value=1 as an int64 whatever the declared type says.
    out = axis_op(kind, 1)(np.zeros(1, np.float32))
    np.testing.assert_array_equal(out, [1.0, 2.5])
    assert axis_op(kind, 1).attrs["reduce_axis"].default == 1
    assert type(axis_op(kind, 1).attrs["reduce_axis"].default) is int


def test_trailing_attribute_values_keep_their_own_type():
    info = (CustomRegOp("axis_trailing").input(0, "x").output(0, "y")
            .attr("reduce_axis", "required", "float").attr("scale", "required", "float", value=0.5)
            .target("CPU").get_op_info())
    op = Custom(f"{COMPAT}:Axis", [2], "float64", "aot", reg_info=info)
    np.testing.assert_array_equal(op(np.zeros(1, np.float32), 3), [3.0, 0.5])
    with pytest.raises(opforge.AttrError, match="'reduce_axis' expects float"):
        op(np.zeros(1, np.float32), "three")  # not a number at all


@pytest.mark.parametrize("kind, value", [("float", "1"), ("int", 2.5), ("float", [1.0]), ("listInt", 3),
                                         ("bool", 1), ("str", 1)])
def test_attribute_value_that_cannot_be_of_its_declared_kind_is_an_attr_error(kind, value):
    with pytest.raises(opforge.AttrError, match="'reduce_axis'"):
        axis_op(kind, value)


@pytest.mark.parametrize("make, error, words", [
    (lambda: Custom(f"{COMPAT}:Square", [3], "floaty", "aot"), opforge.DTypeError, ["'Square'", "floaty"]),
    (lambda: Custom(f"{COMPAT}:Square", ([3], [3], [3]), ("float32",) * 3, "aot", reg_info=reg("two", outputs="ab")),
     opforge.SchemaError, ["'two'", "3 dtype(s)", "2 output(s)"]),
    (lambda: Custom(f"{COMPAT}:Square", [3], "float32", "aot", reg_info="junk"), opforge.SchemaError, ["reg_info"]),
    (lambda: Custom(f"{COMPAT}:Square", [3], "float32", "aot", reg_info={"attr": [{"value": 1}]}),
     opforge.SchemaError, ["needs a name"]),
])
def test_custom_declaration_mistakes_are_typed_errors(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert all(word in str(info.value) for word in words)


@pytest.mark.parametrize("out_shape, error, words", [
    (lambda x: x[5], opforge.InferenceError, ["'Square'", "out_shape raised IndexError"]),
    (lambda x: "abc", opforge.ShapeError, ["'Square'", "output 'y'"]),
    ([2.7], opforge.ShapeError, ["'Square'", "2.7"]),
])
def test_out_shape_mistakes_are_typed_errors_naming_the_op(out_shape, error, words):
    with pytest.raises(error) as info:
        Custom(f"{COMPAT}:Square", out_shape, "float32", "aot")(np.ones(3, np.float32))
    assert all(word in str(info.value) for word in words)


def test_bprop_returning_the_wrong_number_of_gradients_is_a_gradient_error():
    op = Custom(f"{COMPAT}:Square", lambda x: x, "float32", "aot", bprop=lambda x, out, dout: (dout, dout))
    with pytest.raises(opforge.GradientError, match="'Square': bprop returned 2 gradient.*1 input"):
        opforge.grad(lambda v: opforge.ops.reduce_sum(op(v)))(np.ones(3, np.float32))
