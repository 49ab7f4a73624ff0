"""The accuracy bound of the vecmath.h kernels (exp, log, pow, tanh, sigmoid, erf, gelu, softmax), in ulps.

Each op runs on a dense sweep -- a stride through every float32 bit pattern
(subnormals, infinities and NaNs included), random float64 bit patterns, a
fine grid over the range where the function varies, and the special values --
at every ISA variant this CPU can run (dispatch capped with set_isa_cap), and
its error against a float64 (for float32) or long double / mpmath (for
float64) reference must stay within the bound its doc string states.  Results
must not depend on the thread count."""
import math

import numpy as np
import pytest

import opforge
from opforge import TensorSpec, ops
from opforge.runtime.cpu import cpu_features
from opforge.runtime.dispatch import select_kernel

ISAS = [isa for isa in ("generic", "avx2", "avx512") if cpu_features()[isa]]
SPECIALS = [np.inf, -np.inf, np.nan, -0.0, 0.0, 1.0, -1.0]
# op case -> (max ulps for float32, for float64): the bounds the op doc strings state
BOUNDS = {"exp": (1.5, 1.5), "log": (1, 1), "tanh": (3, 3), "sigmoid": (3, 3), "erf": (3, 4), "gelu": (8, 6),
          "gelu_tanh": (256, 2048)}
GELU_TANH_MODERATE = 32  # ulps for x >= -4, both dtypes
K = math.sqrt(2 / math.pi)


def float32_sweep():
    bits = np.arange(0, 2 ** 32, 1531, dtype=np.uint64).astype(np.uint32)  # 2.8M patterns, every exponent
    grid = np.linspace(-30, 30, 600_001, dtype=np.float32)
    return np.concatenate([bits.view(np.float32), grid, np.array(SPECIALS, np.float32)])


def float64_sweep():
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2 ** 64, 600_000, dtype=np.uint64).view(np.float64)  # every exponent, both signs
    subnormal = rng.integers(1, 2 ** 52, 20_000, dtype=np.uint64).view(np.float64)
    grid = np.linspace(-40, 40, 800_001)
    return np.concatenate([bits, subnormal, -subnormal, grid, np.array(SPECIALS + [5e-324, -5e-324])])


X32, X64 = float32_sweep(), float64_sweep()
X32.setflags(write=False)
X64.setflags(write=False)
MATH_ERF, MATH_ERFC = np.frompyfunc(math.erf, 1, 1), np.frompyfunc(math.erfc, 1, 1)


def ulp_error(got, want, dtype):
    """|got - want| in ulps of want rounded to dtype (the subnormal spacing below the normals);
    0 where both are the same value (infinities, signed zeros) or both NaN, inf where only one is NaN."""
    want = np.asarray(want)
    with np.errstate(all="ignore"):  # (overflow to inf in the cast is intended)
        rounded = want.astype(dtype)
        err = np.abs(got.astype(np.longdouble) - want.astype(np.longdouble)) \
            / np.spacing(np.abs(rounded)).astype(np.longdouble)
    err[(got == rounded) | (np.isnan(got) & np.isnan(rounded))] = 0
    err[np.isnan(err)] = np.inf
    return err


def stable_sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def reference(case, x):
    """The float64 (float32 inputs) or long double (float64 inputs) value of the op at x."""
    with np.errstate(all="ignore"):  # (casting NaN, overflowing exp: intended)
        wide = x.astype(np.float64 if x.dtype == np.float32 else np.longdouble)
        if case == "exp":
            return np.exp(wide)
        if case == "log":
            return np.log(wide)
        if case == "tanh":
            return np.tanh(wide)
        if case == "sigmoid":
            return stable_sigmoid(wide)
        if case == "gelu_tanh":
            return wide * stable_sigmoid(2 * K * (wide + 0.044715 * wide ** 3))
        if case == "erf":  # math.erf: within an ulp of double
            return MATH_ERF(x.astype(np.float64)).astype(np.float64)
        if case == "gelu":  # (x / sqrt 2 in double: its rounding is far below a float ulp)
            return wide * MATH_ERFC(-x.astype(np.float64) / math.sqrt(2)).astype(np.float64) / 2
    raise AssertionError(case)


def run(case, x):
    return ops.gelu(x, approximate="tanh") if case == "gelu_tanh" else getattr(ops, case)(x)


def sweep(case, dtype):
    x = X32 if dtype == "float32" else X64
    if case in ("erf", "gelu"):  # a Python-level reference: a sparser sweep
        x = x[::4]
    if case == "gelu" and dtype == "float64":  # double's reference needs mpmath
        x = np.concatenate([np.linspace(-40, 8, 6_001), x[::60]])
    return np.ascontiguousarray(x)


def float64_gelu_reference(x):
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    out = np.empty(x.shape, np.longdouble)
    for i, v in enumerate(x.tolist()):
        if math.isnan(v) or abs(v) > 40:  # Phi is 1 or 0 far beyond double's precision there
            out[i] = v if v > 0 or math.isnan(v) else (np.nan if v == -np.inf else -0.0)
        else:
            out[i] = np.longdouble(mpmath.nstr(mpmath.mpf(v) * mpmath.ncdf(mpmath.mpf(v)), 25))
    return out


@pytest.fixture(scope="module")
def references():
    cache = {}

    def get(case, dtype):
        if (case, dtype) not in cache:
            x = sweep(case, dtype)
            want = float64_gelu_reference(x) if (case, dtype) == ("gelu", "float64") else reference(case, x)
            cache[case, dtype] = x, want
        return cache[case, dtype]
    yield get
    opforge.set_isa_cap(None)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(BOUNDS))
def test_ulp_bound_on_a_dense_sweep(case, dtype, isa, references):
    x, want = references(case, dtype)
    opforge.set_isa_cap(isa)
    op = opforge.lookup("gelu" if case == "gelu_tanh" else case)
    chosen = select_kernel(op, [TensorSpec.of(x)]).name
    assert chosen.endswith(f"<{dtype}>") and (f"[{isa}]" in chosen) == (isa != "generic"), chosen
    got = run(case, x)
    err = ulp_error(got, want, dtype)
    worst = int(np.argmax(err))
    bound = BOUNDS[case][dtype == "float64"]
    assert err[worst] <= bound, f"{case} {dtype} [{isa}]: {err[worst]:.3g} ulp at x={x[worst]!r}: {got[worst]!r}"
    if case == "gelu_tanh":  # the tight bound away from the far negative tail
        moderate = x >= -4
        assert err[moderate].max() <= GELU_TANH_MODERATE
    # Special values, exactly as NumPy has them.
    specials = np.array(SPECIALS[:5], dtype)
    np.testing.assert_array_equal(run(case, specials), reference(case, specials).astype(dtype))
    assert np.signbit(run(case, np.array([-0.0], dtype)))[0] == (case != "exp" and case != "sigmoid")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_log_blocks_with_and_without_special_values_agree(dtype, isa):
    """VecLog skips the special cases in blocks of 256 elements that hold none: a block with one (a zero, a
    subnormal, a negative, inf or NaN) gives its other elements the same bits."""
    info = np.finfo(dtype)
    bits = np.uint32 if dtype == "float32" else np.uint64
    low, high = (np.array([info.smallest_normal, info.max], dtype).view(bits))
    x = np.random.default_rng(3).integers(low, high, 2000, dtype=bits, endpoint=True).view(dtype)  # every exponent
    x[:2] = info.smallest_normal, info.max
    opforge.set_isa_cap(isa)
    try:
        plain = ops.log(x)
        negative_nan = np.array(np.nan, dtype).view(bits) | bits(1 << (8 * x.itemsize - 1))
        for special in (0.0, -0.0, info.smallest_subnormal, -1.0, -np.inf, np.inf, np.nan, negative_nan.view(dtype)):
            mixed = x.copy()
            mixed[::251] = special  # one or two in every block, at a different place in each
            got = ops.log(mixed)
            kept = np.ones(x.size, bool)
            kept[::251] = False
            np.testing.assert_array_equal(got[kept], plain[kept])
            with np.errstate(all="ignore"):
                want = np.log(np.array([special], dtype))
            np.testing.assert_array_equal(got[~kept], np.repeat(want, (~kept).sum()))
    finally:
        opforge.set_isa_cap(None)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_ulp_bound(dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 2000)) * rng.choice([1, 10, 40], (64, 1))).astype(dtype)
    wide = x.astype(np.longdouble)
    distance = wide.max(axis=1, keepdims=True) - wide
    e = np.exp(-distance)
    want = e / e.sum(axis=1, keepdims=True)
    # x - max is rounded before exp (an error |x - max| times larger in the result), and the row sum once more
    bound = 4 * (distance + 1) + 64
    for isa in ISAS:
        opforge.set_isa_cap(isa)
        try:
            for axis, data, ref, limit in ((1, x, want, bound), (0, x.T.copy(), want.T, bound.T)):
                err = ulp_error(ops.softmax(data, axis=axis), ref, dtype)
                assert (err <= limit).all(), f"softmax {dtype} [{isa}] axis {axis}: {(err - limit).max():.3g} ulp over"
        finally:
            opforge.set_isa_cap(None)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_special_rows(dtype):
    x = np.array([[0.0, -np.inf, 1.0], [np.inf, 1.0, 2.0], [np.nan, 0.0, 1.0], [-np.inf] * 3, [5.0] * 3], dtype)
    got = ops.softmax(x)
    with np.errstate(invalid="ignore"):
        want = opforge.lookup("softmax").reference_kernel.fn(x, axis=-1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_results_do_not_depend_on_the_thread_count(dtype, set_threads):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(300_001) * 20).astype(dtype)  # ranges for several threads, an odd tail
    calls = [lambda: ops.exp(x), lambda: ops.log(x), lambda: ops.pow(np.abs(x), x / 8),
             lambda: ops.tanh(x), lambda: ops.sigmoid(x), lambda: ops.erf(x),
             lambda: ops.gelu(x), lambda: ops.gelu(x, approximate="tanh"),
             lambda: ops.softmax(x[None, :300_000]),                 # one long row, split by blocks
             lambda: ops.softmax(x[:300_000].reshape(600, 500)),     # rows split across threads
             lambda: ops.softmax(x[:300_000].reshape(60, 50, 100), axis=1)]  # lanes of a middle axis
    set_threads(1)
    one = [call() for call in calls]
    set_threads(2)
    two = [call() for call in calls]
    for k, (a, b) in enumerate(zip(one, two)):
        assert np.array_equal(a, b, equal_nan=True), f"call {k} changed with the thread count"
    long_row = one[8][0]
    assert abs(float(long_row.astype(np.float64).sum()) - 1) < 1e-4


POW_BOUNDS = {"float32": 1, "float64": 2}  # ulps, as pow's doc string states
POW_SPECIALS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, 2.5, -2.5, np.inf, -np.inf, np.nan,
                1e-30, -1e-30, 0.3, 100.0, -7.0, 8388609.0, 16777215.0, 2.0 ** 60, -(2.0 ** 60)]


def pow_sweep(dtype):
    """Bases over many binades and near 1, exponents chosen so that the results run from below the
    subnormals to beyond overflow, and negative bases with integer exponents."""
    rng = np.random.default_rng(5)
    n = 300_000
    a = np.concatenate([np.exp2(rng.uniform(-30, 30, n)), 1 + rng.uniform(-1e-3, 1e-3, n // 4),
                        rng.uniform(0, 4, n // 4)])
    limit = 88 if dtype == "float32" else 700
    with np.errstate(divide="ignore"):
        b = rng.uniform(-1.05 * limit, 1.05 * limit, a.size) / np.log(a)
    negative = -rng.uniform(0.5, 2, 40_000)
    odd_or_even = rng.integers(-60, 60, 40_000).astype(np.float64)
    return (np.concatenate([a, negative]).astype(dtype), np.concatenate([b, odd_or_even]).astype(dtype))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow_ulp_bound_and_special_values(dtype, isa):
    a, b = pow_sweep(dtype)
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64 if dtype == "float32" else np.longdouble),
                        b.astype(np.float64 if dtype == "float32" else np.longdouble))
    opforge.set_isa_cap(isa)
    try:
        chosen = select_kernel(opforge.lookup("pow"), [TensorSpec.of(a), TensorSpec.of(b)]).name
        assert (f"[{isa}]" in chosen) == (isa != "generic"), chosen
        err = ulp_error(ops.pow(a, b), want, dtype)
        worst = int(np.argmax(err))
        assert err[worst] <= POW_BOUNDS[dtype], \
            f"pow {dtype} [{isa}]: {err[worst]:.3g} ulp at {a[worst]!r} ** {b[worst]!r}"
        # Every pair of special values: as NumPy's power (C99), the sign of zeros included.
        grid = np.array(POW_SPECIALS, dtype)
        sa, sb = (np.ascontiguousarray(v.ravel()) for v in np.meshgrid(grid, grid))
        with np.errstate(all="ignore"):
            expected = np.power(sa, sb)
        got = ops.pow(sa, sb)
        special = ~np.isfinite(sa) | ~np.isfinite(sb) | (sa == 0) | (np.abs(sa) == 1) | (sb == 0)
        np.testing.assert_array_equal(got[special], expected[special])
        assert (np.signbit(got) == np.signbit(expected))[~np.isnan(expected)].all()
        wide = np.float64 if dtype == "float32" else np.longdouble
        with np.errstate(all="ignore"):
            ordinary = ulp_error(got, np.power(sa.astype(wide), sb.astype(wide)), dtype)[~special]
        assert ordinary.max() <= POW_BOUNDS[dtype]
        # A scalar exponent's shortcuts agree with the general path (pow(-0.0, 0.5) = +0, pow(-inf, 0.5) = inf).
        for s in (0.0, 1.0, 2.0, -1.0, 0.5):
            general = ops.pow(grid, np.full(grid.shape, s, dtype))
            short = ops.pow(grid, np.array(s, dtype))
            edge = ~np.isfinite(grid) | (grid == 0)
            np.testing.assert_array_equal(short[edge], general[edge])
            assert (np.signbit(short) == np.signbit(general))[~np.isnan(general)].all()
            with np.errstate(all="ignore"):
                rounding = ulp_error(short, np.power(grid.astype(wide), np.full(grid.shape, s, wide)), dtype)
            assert rounding[~edge].max() <= 0.5  # correctly rounded
    finally:
        opforge.set_isa_cap(None)
