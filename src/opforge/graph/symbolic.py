"""Symbolic dims: the unknown dims of traced values, and integer arithmetic on them.

``value.shape`` holds an int for each known dim and a ``SymDim`` for each
unknown one.  A SymDim is a polynomial with integer coefficients over atoms
(a dim of a traced value, or a floor division that does not simplify), so
``x.shape[0] * 2 - x.shape[0]`` is ``x.shape[0]`` and ``d - d`` is the int 0.
Comparisons answer when the answer holds for every size (dims are >= 0) and
raise ``TracingError`` otherwise.  A SymDim cannot become a Python int (an
attribute, a shape, ``range``): its size exists only at run time.

Where a SymDim meets a tensor (``x * x.shape[0]``) it becomes graph ops: the
built-in ``dim`` reads the size at run time in the tensor's dtype (the weak
rule Python scalars follow), and ``add`` / ``mul`` combine the terms.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..errors import TracingError
from ..registry import lookup


def call_builtin(name, *args, **attrs):
    """Call a built-in op through its one entry point (under a trace: records a node)."""
    op = lookup(name)
    if op is None:
        raise TracingError(f"tracing needs the built-in op '{name}', which is not registered")
    return op(*args, **attrs)


class _DimOf:
    """Atom: dim ``axis`` of a traced value."""

    def __init__(self, value, axis):
        self.value, self.axis = value, axis
        self.key = ("dim", value.id, axis)

    nonnegative = True

    def __repr__(self):
        return f"{self.value.name}.shape[{self.axis}]"

    def as_tensor(self, dtype):
        return call_builtin("dim", self.value, axis=self.axis, dtype=dtype)


class _FloorDiv:
    """Atom: ``numerator // divisor`` that does not simplify."""

    def __init__(self, numerator, divisor):
        self.numerator, self.divisor = numerator, divisor
        self.key = ("floordiv", _key(numerator), _key(divisor))
        low = _lower_bound(_terms(numerator))
        self.nonnegative = low is not None and low >= 0 and isinstance(divisor, int) and divisor > 0

    def __repr__(self):
        return f"({self.numerator!r} // {self.divisor!r})"

    def as_tensor(self, dtype):
        # A float quotient truncated to int64 is the floor for a non-negative numerator and a positive divisor.
        if not (self.nonnegative and isinstance(self.numerator, SymDim)):
            raise TracingError(f"{self!r} cannot be recorded as graph ops: only a non-negative size divided by a "
                               "positive int is (divide a tensor instead)")
        quotient = call_builtin("div", self.numerator.as_tensor("float64"), np.float64(self.divisor))
        floor = call_builtin("cast", quotient, dtype="int64")
        return floor if np.dtype(dtype) == np.int64 else call_builtin("cast", floor, dtype=dtype)


def _terms(x):
    """{monomial: coefficient} of an int or SymDim; a monomial is a tuple of atoms sorted by key."""
    return dict(x.terms) if isinstance(x, SymDim) else ({(): int(x)} if x else {})


def _key(x):
    return tuple(sorted(((tuple(a.key for a in m), c) for m, c in _terms(x).items())))


def _lower_bound(terms):
    """The least value the polynomial can take (atoms known non-negative), or None if unbounded."""
    bound = terms.get((), 0)
    for monomial, coefficient in terms.items():
        if monomial and (coefficient < 0 or not all(a.nonnegative for a in monomial)):
            return None
    return bound


def _integer(x):
    """x as an int or SymDim, or None when it is neither (a float, a tensor)."""
    if isinstance(x, SymDim):
        return x
    if isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)):
        return int(x)
    return None


def _make(terms):
    terms = {m: c for m, c in terms.items() if c}
    if not any(terms):  # only a constant (or nothing): a plain int
        return terms.get((), 0)
    return SymDim(terms)


def _add(a, b, sign=1):
    terms = _terms(a)
    for monomial, coefficient in _terms(b).items():
        terms[monomial] = terms.get(monomial, 0) + sign * coefficient
    return _make(terms)


def _mul(a, b):
    terms = {}
    for ma, ca in _terms(a).items():
        for mb, cb in _terms(b).items():
            monomial = tuple(sorted(ma + mb, key=lambda atom: atom.key))
            terms[monomial] = terms.get(monomial, 0) + ca * cb
    return _make(terms)


def _floordiv(a, b):
    if isinstance(b, int):
        if b == 0:
            raise TracingError(f"{a!r} // 0: division by zero")
        if all(c % b == 0 for c in _terms(a).values()):
            return _make({m: c // b for m, c in _terms(a).items()})
    return SymDim({(_FloorDiv(a, b),): 1})


def _tensor(x):
    """Whether x is a concrete tensor (array or NumPy scalar) a SymDim combines with as graph ops."""
    return isinstance(x, (np.ndarray, np.generic)) and not isinstance(x, (np.integer, np.bool_))


class SymDim:
    """An unknown dim of a traced value, or integer arithmetic on unknown dims."""

    __slots__ = ("terms",)
    __array_ufunc__ = None  # ndarray (op) SymDim defers to SymDim's reflected operators

    def __init__(self, terms):
        self.terms = terms

    @classmethod
    def of(cls, value, axis):
        return cls({(_DimOf(value, axis),): 1})

    def __repr__(self):
        text = ""
        for monomial, coefficient in sorted(self.terms.items(), key=lambda item: (-len(item[0]), _key_of(item[0]))):
            factors = [repr(atom) for atom in monomial]
            if abs(coefficient) != 1 or not factors:
                factors.insert(0, str(abs(coefficient)))
            sign = "-" if coefficient < 0 else "+"
            text += f" {sign} " + "*".join(factors) if text else ("-" if coefficient < 0 else "") + "*".join(factors)
        return text

    def __hash__(self):
        return hash(_key(self))

    # -- integer arithmetic: stays symbolic; with a tensor: graph ops --------
    def _binary(self, other, integer, tensor):
        value = _integer(other)
        if value is not None:
            return integer(value)
        if _tensor(other):
            return tensor(self.as_tensor(np.asarray(other).dtype), other)
        if isinstance(other, float):
            raise TracingError(f"{self!r} is an unknown dim; mixing it with the float {other!r} has no dtype to "
                               "record it in: combine it with a tensor instead (x * 0.5 * x.shape[0]), or use "
                               "a NumPy scalar (np.float32(0.5))")
        return NotImplemented  # a traced Value answers with its reflected operator

    def __add__(self, other):
        return self._binary(other, lambda o: _add(self, o), lambda s, o: call_builtin("add", s, o))

    def __radd__(self, other):
        return self._binary(other, lambda o: _add(o, self), lambda s, o: call_builtin("add", o, s))

    def __sub__(self, other):
        return self._binary(other, lambda o: _add(self, o, -1), lambda s, o: call_builtin("sub", s, o))

    def __rsub__(self, other):
        return self._binary(other, lambda o: _add(o, self, -1), lambda s, o: call_builtin("sub", o, s))

    def __mul__(self, other):
        return self._binary(other, lambda o: _mul(self, o), lambda s, o: call_builtin("mul", s, o))

    def __rmul__(self, other):
        return self._binary(other, lambda o: _mul(o, self), lambda s, o: call_builtin("mul", o, s))

    def __floordiv__(self, other):
        return self._binary(other, lambda o: _floordiv(self, o), self._no_tensor("//"))

    def __rfloordiv__(self, other):
        return self._binary(other, lambda o: _floordiv(o, self), self._no_tensor("//"))

    def __mod__(self, other):
        return self._binary(other, lambda o: _add(self, _mul(_floordiv(self, o), o), -1), self._no_tensor("%"))

    def __truediv__(self, other):
        return self._binary(other, self._no_int("/"), lambda s, o: call_builtin("div", s, o))

    def __rtruediv__(self, other):
        return self._binary(other, self._no_int("/"), lambda s, o: call_builtin("div", o, s))

    def __neg__(self):
        return _mul(self, -1)

    def __pos__(self):
        return self

    def _no_tensor(self, symbol):
        def refuse(lowered, other):
            raise TracingError(f"{self!r} {symbol} a tensor has no built-in op to record it")
        return refuse

    def _no_int(self, symbol):
        def refuse(other):
            raise TracingError(f"{self!r} {symbol} {other!r}: true division of an unknown dim by an int gives a "
                               "float with no dtype to record it in; use // for a size, or divide a tensor "
                               "(x / x.shape[0])")
        return refuse

    # -- comparisons: answered when the answer holds for every size --------
    def _compare(self, other, symbol, holds):
        value = _integer(other)
        if value is None:
            return NotImplemented
        difference = _terms(_add(self, value, -1))
        low = _lower_bound(difference)
        high = _lower_bound({m: -c for m, c in difference.items()})
        high = None if high is None else -high
        answer = holds(low, high)
        if answer is None:
            raise TracingError(f"{self!r} {symbol} {other!r} depends on the size of an unknown dim, which exists "
                               "only at run time: Python control flow on it cannot be recorded. Trace with a "
                               "static shape, or compute on tensors (opforge.ops.where chooses elementwise)")
        return answer

    def __eq__(self, other):
        return self._compare(other, "==", lambda low, high: False if (low is not None and low > 0) or
                             (high is not None and high < 0) else (True if low == high == 0 else None))

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __lt__(self, other):
        return self._compare(other, "<", lambda low, high: True if high is not None and high < 0 else
                             (False if low is not None and low >= 0 else None))

    def __le__(self, other):
        return self._compare(other, "<=", lambda low, high: True if high is not None and high <= 0 else
                             (False if low is not None and low > 0 else None))

    def __gt__(self, other):
        return self._compare(other, ">", lambda low, high: True if low is not None and low > 0 else
                             (False if high is not None and high <= 0 else None))

    def __ge__(self, other):
        return self._compare(other, ">=", lambda low, high: True if low is not None and low >= 0 else
                             (False if high is not None and high < 0 else None))

    def __bool__(self):
        return self != 0

    # -- what needs a concrete int ------------------------------------------
    def _no_python_number(self, *_):
        raise TracingError(f"{self!r} is an unknown dim: its size exists only at run time, so it cannot become a "
                           "Python number (an op attribute, a shape, range(), an index). Use -1 for it in a "
                           "reshape shape, or keep the arithmetic on tensors: x * x.shape[0] records graph ops")

    __int__ = __index__ = __float__ = __complex__ = __round__ = __trunc__ = _no_python_number

    def as_tensor(self, dtype):
        """This size as a 0-d tensor of ``dtype``, computed at run time by graph ops."""
        dtype = np.dtype(dtype).name
        total = None
        for monomial, coefficient in self.terms.items():
            if not monomial:
                continue
            term = None
            for atom in monomial:
                factor = atom.as_tensor(dtype)
                term = factor if term is None else call_builtin("mul", term, factor)
            if coefficient != 1:
                term = call_builtin("mul", term, np.asarray(coefficient, dtype))
            total = term if total is None else call_builtin("add", total, term)
        constant = self.terms.get((), 0)
        return call_builtin("add", total, np.asarray(constant, dtype)) if constant else total


def _key_of(monomial):
    return tuple(a.key for a in monomial)


numbers.Integral.register(SymDim)  # so int-expecting code calls __int__/__index__ and gets a TracingError
