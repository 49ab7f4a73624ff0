"""The blocked fast paths of pow and mod: results must not depend on whether a block of 256 elements holds a
special value (pow) or a quotient too large for the exact division (mod), at every ISA variant this CPU runs."""
import numpy as np
import pytest

import opforge
from opforge import ops
from opforge.runtime.cpu import cpu_features

ISAS = [isa for isa in ("generic", "avx2", "avx512") if cpu_features()[isa]]
BITS = {np.dtype("float32"): np.uint32, np.dtype("float64"): np.uint64}


@pytest.fixture(params=ISAS)
def isa(request):
    opforge.set_isa_cap(request.param)
    yield request.param
    opforge.set_isa_cap(None)


def same_bits(x, y):
    return np.array_equal(x.view(BITS[x.dtype]), y.view(BITS[y.dtype]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow_gives_the_same_bits_whether_or_not_a_block_holds_a_special_value(dtype, isa):
    rng = np.random.default_rng(1)
    n = 2048 + 37  # whole blocks and a tail
    a = rng.uniform(0.1, 3, n).astype(dtype)
    b = rng.uniform(-20, 20, n).astype(dtype)
    plain = ops.pow(a, b)
    for position in (0, 255, 256, 257, 1000, n - 1):  # block edges, a middle, the tail
        for special in (0.0, -2.0, np.inf, np.nan):
            a2 = a.copy()
            a2[position] = special
            got = ops.pow(a2, b)
            others = np.arange(n) != position
            assert same_bits(got[others], plain[others]), (position, special)
            with np.errstate(all="ignore"):
                want = np.power(a2[position], b[position])
            assert np.array_equal(got[position], want, equal_nan=True), (position, special, got[position], want)
    # a special exponent too, and broadcast runs (one base or one exponent for all)
    b2 = b.copy()
    b2[300] = np.inf
    assert same_bits(np.delete(ops.pow(a, b2), 300), np.delete(plain, 300))
    assert ops.pow(a, b2)[300] == np.power(a[300], np.inf)
    scalar = np.array(1.7, dtype)
    assert same_bits(ops.pow(np.broadcast_to(scalar, a.shape).copy(), b), ops.pow(scalar, b))
    assert same_bits(ops.pow(a, np.full(n, 2.5, dtype)), ops.pow(a, np.array(2.5, dtype)))


def quick_quotients(dtype, n, rng):
    """Divisors over many binades and dividends q b (q up to the exact division's limit), nudged by an ulp either
    way: the divisions that round onto an integer."""
    limit = 24 if dtype == "float32" else 51
    low = -120 if dtype == "float32" else -1000
    b = (rng.uniform(0.5, 2, n) * np.exp2(rng.integers(low, 100, n)) * rng.choice([-1, 1], n)).astype(dtype)
    a = np.floor(np.exp2(rng.uniform(0, limit, n))) * b.astype(np.float64)
    a = (a.astype(dtype) if dtype == "float32" else a) * rng.choice([-1, 1], n).astype(dtype)
    step = rng.integers(-1, 2, n)
    a = np.where(step > 0, np.nextafter(a, np.inf), np.where(step < 0, np.nextafter(a, -np.inf), a)).astype(dtype)
    keep = np.abs(a.astype(np.float64)) < 2.0 ** limit * np.abs(b.astype(np.float64))
    return a[keep], b[keep]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mod_without_libm_is_fmod_bit_for_bit(dtype, isa):
    rng = np.random.default_rng(2)
    a, b = quick_quotients(dtype, 200_000, rng)
    for fmod in (False, True):
        with np.errstate(all="ignore"):
            want = np.fmod(a, b) if fmod else np.mod(a, b)
        assert same_bits(ops.mod(a, b, fmod=fmod), want), fmod
    # Blocks holding one element the exact division does not serve (a huge quotient, a zero or infinite
    # divisor, NaN): that element as NumPy has it, the others unchanged.
    a, b = a[:1000].copy(), b[:1000].copy()
    plain = ops.mod(a, b)
    for position in (0, 255, 256, 999):
        for sa, sb in ((np.finfo(dtype).max, np.finfo(dtype).tiny), (1.5, 0.0), (np.inf, 2.0), (-3.0, np.inf),
                       (np.nan, 1.0), (1.0, np.nan)):
            a2, b2 = a.copy(), b.copy()
            a2[position], b2[position] = sa, sb
            got = ops.mod(a2, b2)
            with np.errstate(all="ignore"):
                want = np.mod(a2, b2)
            assert same_bits(np.delete(got, position), np.delete(plain, position))
            assert np.array_equal(got[position], want[position], equal_nan=True), (sa, sb, got[position])


def test_mod_of_a_row_by_a_column_broadcasts_through_the_fast_path():
    rng = np.random.default_rng(3)
    a = rng.uniform(-50, 50, (7, 300)).astype(np.float32)
    b = rng.uniform(0.5, 3, (7, 1)).astype(np.float32)
    np.testing.assert_array_equal(ops.mod(a, b), np.mod(a, b))
    np.testing.assert_array_equal(ops.mod(b, a), np.mod(b, a))
