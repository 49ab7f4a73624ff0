"""leaky_relu: every native variant (ISA x dtype) against the NumPy reference,
over random shapes (empty and 0-d included) and awkward alignments; dispatch
by ISA (best by default, the cap, OPFORGE_ISA); the functional API and its
errors."""
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import opforge
from helpers import WHICH_ISA
from opforge import TensorSpec, _native
from opforge.runtime.dispatch import select_kernel

leaky_relu = opforge.lookup("leaky_relu")
ISAS = ["sse41", "avx2", "avx512"]
FLOATS = ["float32", "float64"]
SETTINGS = settings(max_examples=15, deadline=None)  # kernels compile once per session
SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 3.0, -3.0]
# Every variant is built with streaming stores from this output size on
# (LEAKY_RELU_STREAM_BYTES in the kernel source).
STREAM_BYTES = 10 << 20


def kernel(isa, dtype):
    name = f"LeakyRelu[{isa}]<{dtype}>"
    found = [k for k in leaky_relu.kernels if k.name == name]
    assert len(found) == 1, [k.name for k in leaky_relu.kernels]
    return found[0]


def needs(isa):
    if not opforge.cpu_features()[isa]:
        pytest.skip(f"this CPU lacks {isa}; the {isa} variants cannot run here")


def best_isa():
    return [isa for isa in ISAS if opforge.cpu_features()[isa]][-1]


def expected(x, alpha):
    """The kernels' exact result: alpha crosses the ABI as a 32-bit float."""
    a = x.dtype.type(np.float32(alpha))
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(x > 0, x, a * x)


def check_against_reference(y, x, alpha):
    np.testing.assert_array_equal(y, expected(x, alpha))  # bit-exact (NaN == NaN, -0.0 == 0.0)
    reference = leaky_relu.reference_kernel.fn(x, alpha=alpha)
    assert y.dtype == reference.dtype == x.dtype and y.shape == reference.shape == x.shape
    np.testing.assert_allclose(y, reference, rtol=1e-7 if x.dtype == np.float64 else 0, atol=0)


def run_kernel(k, x, alpha):
    """The variant ``k`` on ``x`` through its own run (allocates the output)."""
    attrs = {"alpha": float(alpha)}
    return k.run(leaky_relu, [x], attrs, leaky_relu.infer_specs([TensorSpec.of(x)], attrs))[0]


def run_into(k, x, out, alpha):
    """The variant ``k`` on ``x`` into the preallocated ``out`` (any alignment)."""
    k.load()
    spec = TensorSpec.of(x)
    extra, _ = k.signature_state(leaky_relu, [spec, spec], {"alpha": float(alpha)})
    rc, error = _native.call_kernel(k._function, [x.ctypes.data, out.ctypes.data], [x.shape, out.shape],
                                    [str(x.dtype), str(out.dtype)], None, extra)
    assert rc == 0 and error is None, (rc, error)


def random_input(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = np.asarray(rng.standard_normal(shape) * 4, dtype=dtype)  # (0-d stays an array)
    flat = x.reshape(-1)
    if flat.size:
        spots = rng.integers(0, flat.size, size=min(flat.size, 4))
        flat[spots] = rng.choice(SPECIALS, size=spots.size)
    return x


alphas = st.one_of(st.sampled_from([0.01, 0.2, 0.0, 1.0, -0.5, 3.0]), st.floats(-10, 10, width=32))


# -- the declaration ---------------------------------------------------------
def test_one_variant_per_isa_and_dtype_plus_the_reference():
    names = [k.name for k in leaky_relu.kernels if k.layout == "ndarray" and k.device == "cpu"]
    assert names == ["leaky_relu_reference"] + [f"LeakyRelu[{isa}]<{d}>" for isa in ISAS for d in FLOATS]
    blocked = [k.name for k in leaky_relu.kernels if k.layout == "nchw16c"]
    assert blocked == [f"LeakyRelu[{isa}]<{d}>@nchw16c" for isa in ISAS for d in FLOATS]
    assert leaky_relu.reference_kernel.name == "leaky_relu_reference"
    assert "no_side_effect" in leaky_relu.traits
    assert len({kernel(isa, d).location for isa in ISAS for d in FLOATS}) == 1  # one source string


# -- every variant against the reference --------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("isa", ISAS)
def test_variant_matches_the_reference(isa, dtype):
    needs(isa)
    k = kernel(isa, dtype)

    @SETTINGS
    @given(shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40),
           alpha=alphas, seed=st.integers(0, 2**32 - 1))
    def check(shape, alpha, seed):
        x = random_input(shape, dtype, seed)
        y = run_kernel(k, x, alpha)
        check_against_reference(y, x, alpha)

    check()
    for shape in [(), (0,), (3, 0, 2), (1,), (1000, 33)]:  # always: 0-d, empty, a vector body + tail
        x = random_input(shape, dtype, 7)
        check_against_reference(run_kernel(k, x, 0.2), x, 0.2)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("isa", ISAS)
def test_variant_at_every_alignment_and_length(isa, dtype):
    """The head peel, the vector body and the scalar remainder: output and input
    at each element offset within 64 bytes, lengths around the vector widths."""
    needs(isa)
    k = kernel(isa, dtype)
    item = np.dtype(dtype).itemsize
    lanes = 64 // item
    base_x = random_input(4 * lanes + 200, dtype, 1)
    base_y = np.empty(4 * lanes + 200, dtype)
    for n in [0, 1, lanes - 1, lanes, lanes + 1, 4 * lanes - 1, 4 * lanes + 3, 5 * lanes + 7, 130]:
        for ox in (0, 1, lanes // 2 + 1):
            for oy in range(lanes):
                x = base_x[ox:ox + n]
                out = base_y[oy:oy + n]
                guard = base_y.copy()
                run_into(k, x, out, 0.3)
                np.testing.assert_array_equal(out, expected(x, 0.3))
                outside = np.ones(base_y.size, bool)
                outside[oy:oy + n] = False
                np.testing.assert_array_equal(base_y[outside], guard[outside])  # nothing written outside


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("isa", ISAS)
def test_large_outputs_take_the_streaming_path(isa, dtype):
    needs(isa)
    k = kernel(isa, dtype)
    item = np.dtype(dtype).itemsize
    n = STREAM_BYTES // item + 37
    x = random_input(n, dtype, 3)
    for oy in (0, 3):  # NumPy puts large arrays 16 bytes past a page boundary; then 3 elements on
        store = np.full(n + 16, 7, dtype)
        out = store[oy:oy + n]
        run_into(k, x, out, 0.25)
        np.testing.assert_array_equal(out, expected(x, 0.25))
        assert (store[:oy] == 7).all() and (store[oy + n:] == 7).all()
    check_against_reference(run_kernel(k, x, 0.25), x, 0.25)


def test_check_op_agrees():
    """opforge.testing.check_op: inference, every runnable variant vs the reference,
    no input mutation, attribute errors."""
    for dtype in FLOATS:
        checks = opforge.testing.check_op(leaky_relu, random_input((7, 33), dtype, 5), alpha=0.2)
        assert checks


# -- dispatch -------------------------------------------------------------------
@pytest.fixture
def isa_cap():
    """Set the ISA cap for one test; lifted afterwards whatever happens."""
    yield opforge.set_isa_cap
    opforge.set_isa_cap(None)


@pytest.mark.parametrize("dtype", FLOATS)
def test_dispatch_picks_the_best_isa_by_default(dtype):
    chosen = select_kernel(leaky_relu, [TensorSpec([5, 3], dtype)])
    assert chosen.name == f"LeakyRelu[{best_isa()}]<{dtype}>"
    x = random_input((5, 3), dtype, 11)
    check_against_reference(leaky_relu(x, alpha=0.2), x, 0.2)


@pytest.mark.parametrize("cap", ISAS)
def test_dispatch_honours_the_cap(isa_cap, cap):
    needs(cap)
    isa_cap(cap)
    for dtype in FLOATS:
        assert select_kernel(leaky_relu, [TensorSpec([4], dtype)]).name == f"LeakyRelu[{cap}]<{dtype}>"
        # A shape no call has planned yet (see test_the_cap_applies_to_signatures_already_called).
        shape = (3, 101 + ISAS.index(cap))
        x = random_input(shape, dtype, 13)
        check_against_reference(opforge.ops.leaky_relu(x, alpha=0.2), x, 0.2)


def test_below_every_variant_the_reference_runs(isa_cap):
    isa_cap("generic")
    assert select_kernel(leaky_relu, [TensorSpec([4], "float32")]).reference
    x = random_input((4, 97), "float32", 17)
    check_against_reference(opforge.ops.leaky_relu(x, alpha=0.2), x, 0.2)


def test_the_cap_applies_to_signatures_already_called(isa_cap):
    """Which variant leaky_relu ran is not observable, so a private op whose
    kernel reports its ISA shows it."""
    if best_isa() == "sse41":
        pytest.skip("this CPU has nothing above sse41 to cap")
    op = opforge.op("test_leaky_relu::which_isa(Tensor x, *, float alpha=0.01) -> Tensor y")
    try:
        op.def_infer(opforge.infer.same_as(0))
        for isa in ISAS:
            op.kernel(code=WHICH_ISA, function="WhichIsa", isa=isa)
        x = np.zeros(4, np.float32)
        assert op(x)[0] != 41
        isa_cap("sse41")
        assert op(np.zeros(5, np.float32))[0] == 41  # a new signature: re-dispatched
        assert op(x)[0] == 41  # the signature called before the cap: still the old kernel
    finally:
        opforge.registry.unregister(op.name)


@pytest.mark.parametrize("env_isa", ISAS)
def test_opforge_isa_environment_variable(env_isa):
    needs(env_isa)
    code = ("import numpy as np, opforge\n"
            "from opforge.runtime.dispatch import select_kernel\n"
            "op = opforge.lookup('leaky_relu')\n"
            "print(select_kernel(op, [opforge.TensorSpec([3], 'float32')]).name)\n"
            "x = np.array([-2.0, 0.0, 3.0], np.float32)\n"
            "print(opforge.ops.leaky_relu(x, alpha=0.5).tolist())\n")
    env = {**os.environ, "OPFORGE_ISA": env_isa}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == f"LeakyRelu[{env_isa}]<float32>"
    assert lines[1] == "[-1.0, 0.0, 3.0]"


# -- the functional API ---------------------------------------------------------
def test_functional_api():
    x = random_input((6, 5), "float32", 19)
    check_against_reference(opforge.ops.leaky_relu(x, alpha=0.2), x, 0.2)
    check_against_reference(opforge.ops.leaky_relu(x), x, 0.01)  # the default
    check_against_reference(opforge.ops.leaky_relu(x, alpha=2), x, 2.0)  # an int is a float attribute
    check_against_reference(leaky_relu(x, alpha=0.2), x, 0.2)  # the op object, same path
    strided = random_input((8, 10), "float64", 23)[:, ::3]  # non-contiguous input: copied first
    check_against_reference(opforge.ops.leaky_relu(strided, alpha=0.1), np.ascontiguousarray(strided), 0.1)
    lists = opforge.ops.leaky_relu([[-1.0, 2.0]], alpha=0.5)  # array-likes become arrays
    np.testing.assert_array_equal(lists, np.array([[-0.5, 2.0]]))


def test_empty_and_zero_dim_through_the_call_path():
    for dtype in FLOATS:
        scalar = np.array(-4.0, dtype)
        y = opforge.ops.leaky_relu(scalar, alpha=0.25)
        assert y.shape == () and y.dtype == dtype and y == -1.0
        empty = np.empty((0, 3), dtype)
        y = opforge.ops.leaky_relu(empty, alpha=0.25)
        assert y.shape == (0, 3) and y.dtype == dtype


def test_signature_and_doc():
    signature = inspect.signature(opforge.ops.leaky_relu)
    assert str(signature) == "(x, *, alpha=0.01)"
    assert signature.parameters["alpha"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "alpha (float): default 0.01" in opforge.ops.leaky_relu.__doc__
    assert "LeakyRelu[avx2]<float32>" in opforge.ops.leaky_relu.__doc__


def test_inference():
    assert leaky_relu.infer(TensorSpec([2, -1], "float64"), alpha=0.5) == TensorSpec([2, -1], "float64")


def test_int32_input_falls_to_the_reference():
    """No native int kernel: dispatch takes the NumPy reference, whose result is
    cast back to int32 (alpha * x truncated toward zero)."""
    x = np.array([-7, -3, -1, 0, 1, 5, 2**31 - 1, -(2**31)], np.int32)
    assert select_kernel(leaky_relu, [TensorSpec.of(x)]).reference
    y = opforge.ops.leaky_relu(x, alpha=0.2)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, leaky_relu.reference_kernel.fn(x, alpha=0.2))
    np.testing.assert_array_equal(y, [-1, 0, 0, 0, 1, 5, 2**31 - 1, -429496729])


def test_wrong_attribute_type_is_an_attr_error():
    x = np.ones(3, np.float32)
    with pytest.raises(opforge.AttrError, match="alpha"):
        opforge.ops.leaky_relu(x, alpha="a")
    with pytest.raises(opforge.AttrError, match="alpha"):
        leaky_relu(x, alpha=True)  # bool is not a float here


def test_unknown_attribute():
    x = np.ones(3, np.float32)
    with pytest.raises(TypeError, match="beta"):
        opforge.ops.leaky_relu(x, beta=1.0)  # the generated function's own signature rejects it
    with pytest.raises(TypeError):
        opforge.ops.leaky_relu(x, 0.2)  # alpha is keyword-only
    with pytest.raises(opforge.AttrError, match="beta"):
        leaky_relu(x, beta=1.0)  # the op object binds by the schema
