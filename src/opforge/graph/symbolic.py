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

import math
import numbers
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import numpy as np

from ..errors import TracingError
from ..registry import lookup

if TYPE_CHECKING:
    from ..dtypes import DTypeLike
    from .ir import Value

#: An atom of a polynomial: a dim of a traced value, or a floor division that does not simplify.
_Atom: TypeAlias = "_DimOf | _FloorDiv"
#: A product of atoms, sorted by key (the empty tuple: the constant term).
_Monomial: TypeAlias = "tuple[_Atom, ...]"
#: {monomial: coefficient}: a polynomial with integer coefficients.
_Terms: TypeAlias = "dict[_Monomial, int]"
#: An integer size: an int, or a SymDim.
_Size: TypeAlias = "int | SymDim"
#: What identifies an atom, a monomial or a polynomial (hashable, sortable).
_Key: TypeAlias = "tuple[object, ...]"


def call_builtin(name: str, *args: Any, **attrs: Any) -> Any:
    """Call a built-in op through its one entry point (under a trace: records a node)."""
    op = lookup(name)
    if op is None:
        raise TracingError(f"tracing needs the built-in op '{name}', which is not registered")
    return op(*args, **attrs)


class _DimOf:
    """Atom: dim ``axis`` of a traced value."""

    def __init__(self, value: Value, axis: int) -> None:
        self.value, self.axis = value, axis
        self.key: _Key = ("dim", value.id, axis)

    nonnegative = True

    def __repr__(self) -> str:
        return f"{self.value.name}.shape[{self.axis}]"

    def as_tensor(self, dtype: str) -> Any:
        return call_builtin("dim", self.value, axis=self.axis, dtype=dtype)


class _FloorDiv:
    """Atom: ``numerator // divisor`` that does not simplify."""

    def __init__(self, numerator: _Size, divisor: _Size) -> None:
        self.numerator, self.divisor = numerator, divisor
        self.key: _Key = ("floordiv", _key(numerator), _key(divisor))
        self.nonnegative = _bounds(_terms(numerator))[0] >= 0 and isinstance(divisor, int) and divisor > 0

    def __repr__(self) -> str:
        return f"({self.numerator!r} // {self.divisor!r})"

    def as_tensor(self, dtype: str) -> Any:
        # A float quotient truncated to int64 is the floor for a non-negative numerator and a positive divisor.
        if not (self.nonnegative and isinstance(self.numerator, SymDim)):
            raise TracingError(f"{self!r} cannot be recorded as graph ops: only a non-negative size divided by a "
                               "positive int is (divide a tensor instead)")
        quotient = call_builtin("div", self.numerator.as_tensor("float64"), np.float64(self.divisor))
        floor = call_builtin("cast", quotient, dtype="int64")
        return floor if np.dtype(dtype) == np.int64 else call_builtin("cast", floor, dtype=dtype)


def _key_of(monomial: _Monomial) -> _Key:
    return tuple(atom.key for atom in monomial)


def _terms(x: _Size) -> _Terms:
    """{monomial: coefficient} of an int or SymDim; a monomial is a tuple of atoms sorted by key."""
    return dict(x.terms) if isinstance(x, SymDim) else ({(): int(x)} if x else {})


def _key(x: _Size) -> _Key:
    return tuple(sorted((_key_of(m), c) for m, c in _terms(x).items()))


def _bounds(terms: _Terms) -> tuple[float, float]:
    """(least, greatest) value of a polynomial whose atoms may be any non-negative size; +-inf if unbounded."""
    constant = terms.get((), 0)
    signs = {c > 0 if all(atom.nonnegative for atom in m) else None for m, c in terms.items() if m}
    return constant if signs <= {True} else -math.inf, constant if signs <= {False} else math.inf


def _make(terms: _Terms) -> _Size:
    terms = {m: c for m, c in terms.items() if c}
    if not any(terms):  # only a constant (or nothing): a plain int
        return terms.get((), 0)
    return SymDim(terms)


def _add(a: _Size, b: _Size, sign: int = 1) -> _Size:
    terms = _terms(a)
    for monomial, coefficient in _terms(b).items():
        terms[monomial] = terms.get(monomial, 0) + sign * coefficient
    return _make(terms)


def _sub(a: _Size, b: _Size) -> _Size:
    return _add(a, b, -1)


def _mul(a: _Size, b: _Size) -> _Size:
    terms: _Terms = {}
    for ma, ca in _terms(a).items():
        for mb, cb in _terms(b).items():
            monomial = tuple(sorted(ma + mb, key=lambda atom: atom.key))
            terms[monomial] = terms.get(monomial, 0) + ca * cb
    return _make(terms)


def _floordiv(a: _Size, b: _Size) -> _Size:
    if isinstance(b, int):
        if b == 0:
            raise TracingError(f"{a!r} // 0: division by zero")
        if all(c % b == 0 for c in _terms(a).values()):
            return _make({m: c // b for m, c in _terms(a).items()})
    return SymDim({(_FloorDiv(a, b),): 1})


def _mod(a: _Size, b: _Size) -> _Size:
    return _sub(a, _mul(_floordiv(a, b), b))


def _power(a: _Size, b: _Size) -> _Size:
    if isinstance(b, int) and b >= 0:  # a size times itself b times is still a size
        result: _Size = 1
        for _ in range(b):
            result = _mul(result, a)
        return result
    raise TracingError(f"{a!r} ** {b!r}: only a non-negative int power of an unknown dim is a size; raise a tensor "
                       "to a power instead (x ** x.shape[0])")


def _integer(x: object) -> _Size | None:
    """x as an int or SymDim, or None when it is neither (a float, a tensor)."""
    if isinstance(x, SymDim):
        return x
    if isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)):
        return int(x)
    return None


def _tensor(x: object) -> bool:
    """Whether x is a concrete tensor (an array, a NumPy float) that a SymDim meets as graph ops."""
    return isinstance(x, (np.ndarray, np.generic)) and not isinstance(x, (np.integer, np.bool_))


def _operator(symbol: str, symbolic: Callable[[_Size, _Size], _Size] | None, builtin: str | None,
              reflected: bool = False) -> Callable[[SymDim, object], Any]:
    """A binary operator of SymDim: ``symbolic(a, b)`` with ints and SymDims, the op ``builtin`` with a tensor."""

    def method(self: SymDim, other: object) -> Any:  # an int, a SymDim, a traced value, or NotImplemented
        value = _integer(other)
        if value is not None:
            if symbolic is None:
                raise TracingError(f"{self!r} {symbol} {other!r}: true division of an unknown dim gives a float, "
                                   "with no dtype to record it in; use // for a size, or divide a tensor "
                                   "(x / x.shape[0])")
            return symbolic(value, self) if reflected else symbolic(self, value)
        if _tensor(other):
            if builtin is None:
                raise TracingError(f"{self!r} {symbol} a tensor: no built-in op records it")
            lowered = self.as_tensor(np.asarray(other).dtype)
            return call_builtin(builtin, other, lowered) if reflected else call_builtin(builtin, lowered, other)
        if isinstance(other, float):
            raise TracingError(f"{self!r} {symbol} {other!r}: an unknown dim with a Python float has no dtype to "
                               "record it in; combine it with a tensor instead (x * 0.5 * x.shape[0]), or use a "
                               "NumPy scalar (np.float32(0.5))")
        return NotImplemented  # a traced Value answers with its reflected operator

    return method


def _comparison(symbol: str, test: Callable[[float, float], bool] | None) -> Callable[[SymDim, object], bool]:
    """A comparison of SymDim, answered when it holds for every size or for none."""

    def method(self: SymDim, other: object) -> Any:  # a bool, or NotImplemented
        value = _integer(other)
        if value is None:
            return NotImplemented
        low, high = _bounds(_terms(_sub(self, value)))
        if test is None:  # == and !=
            answer = True if low == high == 0 else False if not low <= 0 <= high else None
            answer = answer if answer is None or symbol == "==" else not answer
        else:  # monotone in the difference: the same at both ends means the same everywhere
            answer = test(low, 0) if test(low, 0) == test(high, 0) else None
        if answer is None:
            raise TracingError(f"{self!r} {symbol} {other!r} depends on the size of an unknown dim, which exists "
                               "only at run time: Python control flow on it cannot be recorded. Trace with a "
                               "static shape, or compute on tensors (opforge.ops.where chooses elementwise)")
        return answer

    return method


class SymDim:
    """An unknown dim of a traced value, or integer arithmetic on unknown dims."""

    __slots__ = ("terms",)
    __array_ufunc__ = None  # ndarray (op) SymDim defers to SymDim's reflected operators

    def __init__(self, terms: _Terms) -> None:
        self.terms = terms

    @classmethod
    def of(cls, value: Value, axis: int) -> SymDim:
        return cls({(_DimOf(value, axis),): 1})

    def __repr__(self) -> str:
        text = ""
        for monomial, coefficient in sorted(self.terms.items(), key=lambda item: (-len(item[0]), _key_of(item[0]))):
            factors = [repr(atom) for atom in monomial]
            if abs(coefficient) != 1 or not factors:
                factors.insert(0, str(abs(coefficient)))
            sign = "-" if coefficient < 0 else "+"
            text += f" {sign} " + "*".join(factors) if text else ("-" if coefficient < 0 else "") + "*".join(factors)
        return text

    def __hash__(self) -> int:
        return hash(_key(self))

    __add__, __radd__ = _operator("+", _add, "add"), _operator("+", _add, "add", True)
    __sub__, __rsub__ = _operator("-", _sub, "sub"), _operator("-", _sub, "sub", True)
    __mul__, __rmul__ = _operator("*", _mul, "mul"), _operator("*", _mul, "mul", True)
    __floordiv__, __rfloordiv__ = _operator("//", _floordiv, None), _operator("//", _floordiv, None, True)
    __mod__, __rmod__ = _operator("%", _mod, None), _operator("%", _mod, None, True)
    __truediv__, __rtruediv__ = _operator("/", None, "div"), _operator("/", None, "div", True)
    __pow__, __rpow__ = _operator("**", _power, "pow"), _operator("**", _power, "pow", True)

    __eq__, __ne__ = _comparison("==", None), _comparison("!=", None)
    __lt__, __le__ = _comparison("<", operator.lt), _comparison("<=", operator.le)
    __gt__, __ge__ = _comparison(">", operator.gt), _comparison(">=", operator.ge)

    def __neg__(self) -> _Size:
        return _mul(self, -1)

    def __pos__(self) -> SymDim:
        return self

    def __abs__(self) -> _Size:
        low, high = _bounds(self.terms)
        if low < 0 < high:
            raise TracingError(f"abs({self!r}) depends on the size of an unknown dim, which exists only at run "
                               "time; take abs of a tensor instead (abs(x * x.shape[0]))")
        return self if low >= 0 else -self

    def __divmod__(self, other: object) -> tuple[Any, Any]:
        return self // other, self % other

    def __rdivmod__(self, other: Any) -> tuple[Any, Any]:
        return other // self, other % self

    def __bool__(self) -> bool:
        return self != 0

    def _no_python_number(self, *_: object) -> NoReturn:
        raise TracingError(f"{self!r} is an unknown dim: its size exists only at run time, so it cannot become a "
                           "Python number (an op attribute, a shape, range(), an index). Use -1 for it in a "
                           "reshape shape, or keep the arithmetic on tensors: x * x.shape[0] records graph ops")

    __int__ = __index__ = __float__ = __complex__ = __round__ = __trunc__ = _no_python_number

    def as_tensor(self, dtype: DTypeLike) -> Any:
        """This size as a 0-d tensor of ``dtype``, computed at run time by graph ops."""
        dtype = np.dtype(dtype).name
        total: Any = None  # traced values
        for monomial, coefficient in self.terms.items():
            if not monomial:
                continue
            term: Any = None
            for atom in monomial:
                factor = atom.as_tensor(dtype)
                term = factor if term is None else call_builtin("mul", term, factor)
            if coefficient != 1:
                term = call_builtin("mul", term, np.asarray(coefficient, dtype))
            total = term if total is None else call_builtin("add", total, term)
        constant = self.terms.get((), 0)
        return call_builtin("add", total, np.asarray(constant, dtype)) if constant else total


numbers.Integral.register(SymDim)  # so int-expecting code calls __int__/__index__ and gets a TracingError
