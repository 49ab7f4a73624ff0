"""``check_op``: test an op against its own claims (like PyTorch's opcheck).

    opforge.testing.check_op(op, x, alpha=0.2)

For the given inputs and attributes it checks that

* inference agrees with every kernel's real outputs (shape and dtype), and
  inference on specs with unknown dims or rank stays consistent with them;
* every kernel that can run here (each dtype and ISA variant, not only the
  one dispatch picks) agrees with the reference kernel (else with the kernel
  dispatch picks);
* no kernel mutates its inputs;
* native CPU kernels write every element of every output and nothing past
  the end of a buffer: they run in checked mode (guard pages), twice, with
  outputs pre-filled with two different poison bytes; bytes that kept the
  poison in both runs were never written;
* the call path rejects an unknown attribute and a wrongly typed one.

It raises ``OpCheckFailure`` listing every failed check, and returns the
list of checks that ran.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .attrs import REQUIRED
from .errors import AttrError, DTypeError, OpforgeError
from .operator import Op
from . import _native
from .runtime import cpu
from .runtime.aot import AotKernel
from .runtime.dispatch import as_array, input_specs, select_kernel, skips_kernel
from .spec import TensorSpec

if TYPE_CHECKING:
    from .attrs import AttrDef, AttrValue
    from .operator import Kernel

    #: A check that ran: (name, ok, detail); ok is None for a skipped one.
    _Check = tuple[str, bool | None, str]


class OpCheckFailure(OpforgeError, AssertionError):
    """check_op found an op that does not keep its own promises."""


def _tolerance(dtype: npt.DTypeLike) -> dict[str, float]:
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return dict(rtol=1e-2, atol=1e-3)
    if dtype == np.float32:
        return dict(rtol=1e-5, atol=1e-6)
    if dtype == np.float64:
        return dict(rtol=1e-7, atol=1e-10)  # float attributes cross the ABI as 32-bit floats
    return dict(rtol=0, atol=0)


def _resolve(op: object) -> Op:
    if isinstance(op, Op):
        return op
    if hasattr(op, "op"):
        return op.op  # type: ignore[no-any-return]  # an opforge.ops function's op
    from .registry import lookup

    found = lookup(op) if isinstance(op, str) else None
    if found is None:
        raise OpforgeError(f"check_op needs an Op, an opforge.ops function or a registered name, got {op!r}")
    return found


def _runnable(op: Op, kernel: Kernel, specs: Sequence[TensorSpec | None]) -> str | None:
    reason = kernel.reject_reason(op, specs)
    if reason is None and kernel.device != "cpu":
        reason = f"{kernel.device} kernels are not checked on host arrays"
    if reason is None and kernel.isa is not None and not cpu.cpu_features()[cpu.normalize_isa(kernel.isa)]:
        reason = f"this CPU lacks {kernel.isa}"  # (the ISA cap limits dispatch, not what check_op tests)
    return reason


# Outputs start as these bytes in check_op's two runs of a native kernel.
POISONS = (_native.CHECKED_POISON, 0x7F)


def _never_written(first: npt.NDArray[Any], second: npt.NDArray[Any]) -> int:
    """Elements of an output that kept the poison in both runs."""
    if first.size == 0:
        return 0
    first = np.ascontiguousarray(first).view(np.uint8).reshape(first.size, -1)
    second = np.ascontiguousarray(second).view(np.uint8).reshape(second.size, -1)
    return int(((first == POISONS[0]) & (second == POISONS[1])).any(axis=1).sum())


def _run_poisoned(op: Op, kernel: AotKernel, arrays: Sequence[Any], attrs: Mapping[str, AttrValue],
                  out_specs: Sequence[TensorSpec], record: Callable[[str, bool, str], None]) -> Sequence[Any]:
    """Runs a native CPU kernel twice in checked mode, outputs poisoned; records what it never wrote."""
    outputs = kernel.run(op, arrays, attrs, out_specs, poison=POISONS[0])
    again = kernel.run(op, arrays, attrs, out_specs, poison=POISONS[1])
    for name, first, second in zip(op.outputs, outputs, again):
        missed = _never_written(first, second)
        record(f"kernel {kernel.name} writes every element of output '{name}'", missed == 0,
               f"{missed} of {first.size} element(s) never written (they hold whatever the memory held)")
    return outputs


def _wrong_value(attr: AttrDef) -> object:
    return {"bool": "yes", "int": "three", "float": "half", "str": 3, "int[]": "1,2", "float[]": "1,2",
            "int[][]": 5, "float[][]": 5, "Shape": "2x2", "DType": 3}.get(attr.type)


def check_op(op: Op | str | Callable[..., Any], *inputs: Any, **attrs: Any) -> list[_Check]:
    """Check ``op`` (an Op, its name or its ``opforge.ops`` function) on these inputs and attributes.

    Returns the list of checks that ran, each a tuple ``(name, ok, detail)``: ``ok`` is True
    (passed) or None (skipped, ``detail`` says why: a kernel this CPU cannot run, say).  When any
    check fails it raises ``OpCheckFailure`` listing every failure instead.
    """
    op = _resolve(op)
    checks: list[_Check]
    failures: list[str]
    checks, failures = [], []

    def record(name: str, ok: bool | None, detail: str = "") -> None:
        checks.append((name, ok, detail))
        if not ok:
            failures.append(f"{name}: {detail}")

    tensors, resolved = op.bind(inputs, attrs)
    arrays = [None if t is None else as_array(op, k, t) for k, t in enumerate(tensors)]
    specs = input_specs(op, arrays)
    out_specs = op.infer_specs(specs, resolved)
    skip_empty = skips_kernel(op, out_specs)

    reference = op.reference_kernel
    if reference is None:
        reference = select_kernel(op, specs)
    expected = None
    results: dict[Kernel, Sequence[Any]] = {}
    for kernel in op.kernels:
        reason = _runnable(op, kernel, specs)
        if reason is not None:
            checks.append((f"kernel {kernel.name}", None, f"skipped: {reason}"))
            continue
        if skip_empty:
            checks.append((f"kernel {kernel.name}", None, "skipped: every output is empty, the kernel is not called"))
            continue
        before: list[Any] = [None if a is None else a.copy() for a in arrays]
        try:
            if isinstance(kernel, AotKernel):
                outputs = _run_poisoned(op, kernel, arrays, resolved, out_specs, record)
            else:
                outputs = kernel.run(op, arrays, resolved, out_specs)
        except OpforgeError as error:
            record(f"kernel {kernel.name} runs", False, f"{type(error).__name__}: {error}")
            continue
        mutated = [op.input_name(k) for k, (a, b) in enumerate(zip(arrays, before))
                   if a is not None and not np.array_equal(a, b, equal_nan=True)]
        record(f"kernel {kernel.name} leaves inputs unchanged", not mutated, f"mutated {mutated}")
        for name, value, spec in zip(op.outputs, outputs, out_specs):
            ok = tuple(value.shape) == spec.shape and np.dtype(value.dtype) == np.dtype(spec.dtype)
            record(f"kernel {kernel.name} output '{name}' matches inference", ok,
                   f"kernel gave {list(value.shape)} {value.dtype}, inference says {spec}")
        results[kernel] = outputs
        if kernel is reference:
            expected = outputs

    if expected is None and results:
        expected = next(iter(results.values()))
    for kernel, outputs in results.items():
        if kernel is reference or outputs is expected:
            continue
        # (expected is set: results is not empty)
        for name, got, want in zip(op.outputs, outputs, expected):  # type: ignore[arg-type]
            ok = got.shape == want.shape and np.allclose(got, want, equal_nan=True, **_tolerance(want.dtype))
            worst = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) \
                if ok is False and got.shape == want.shape and got.size else None
            record(f"kernel {kernel.name} output '{name}' agrees with {reference.name}", ok,
                   f"max abs difference {worst}" if worst is not None else f"shapes {got.shape} vs {want.shape}")

    # Inference with unknown dims and unknown rank must not contradict the static answer.
    for mode in ("dims", "rank"):
        dynamic = [None if s is None else TensorSpec([-1] * len(s.shape) if mode == "dims" else None, s.dtype)
                   for s in specs]
        try:
            loose = op.infer_specs(dynamic, resolved)
        except OpforgeError as error:
            checks.append((f"inference with unknown {mode}", None, f"not supported: {error}"))
            continue
        ok = all(l.dtype == s.dtype and (l.rank is None or (l.rank == s.rank and
                 all(a in (-1, b) for a, b in zip(l.shape, s.shape)))) for l, s in zip(loose, out_specs))
        record(f"inference with unknown {mode} agrees", ok, f"{loose} vs {out_specs}")

    # Bad attributes are rejected by the call path, before any kernel runs.
    try:
        op.bind(inputs, {**attrs, "no_such_attribute__": 1})
        record("unknown attribute rejected", False, "no error")
    except AttrError:
        record("unknown attribute rejected", True)
    for attr in op.attrs.values():
        wrong = _wrong_value(attr)
        if wrong is None:
            continue
        try:
            op.bind(inputs, {**attrs, attr.name: wrong})
            record(f"attribute '{attr.name}' rejects {wrong!r}", False, "no error")
        except AttrError:
            record(f"attribute '{attr.name}' rejects {wrong!r}", True)
    for attr in op.attrs.values():
        if attr.default is REQUIRED and not attr.positional:
            try:
                op.bind(inputs, {k: v for k, v in attrs.items() if k != attr.name})
                record(f"missing '{attr.name}' rejected", False, "no error")
            except AttrError:
                record(f"missing '{attr.name}' rejected", True)

    if failures:
        raise OpCheckFailure(f"op '{op.name}' failed {len(failures)} check(s):\n  " + "\n  ".join(failures))
    return checks


def gradcheck(fn_or_op: Op | Callable[..., Any], *inputs: Any, eps: float = 1e-6, rtol: float = 1e-5,
              atol: float = 1e-7, **attrs: Any) -> float:
    """Compare analytical gradients (from the ops' rules) with central finite
    differences, in float64.  ``fn_or_op`` is a function of arrays or an op
    (called with ``attrs``); every output contributes.  Raises
    ``OpCheckFailure`` on a mismatch; returns the largest difference found."""
    from .graph.autodiff import vjp

    if isinstance(fn_or_op, Op) or hasattr(fn_or_op, "op"):
        op = fn_or_op

        def fn(*xs: Any) -> Any:
            return op(*xs, **attrs)
    else:
        fn = fn_or_op
    declared = [v.spec.dtype for v in getattr(fn, "inputs", ()) if hasattr(v, "spec")]  # a traced Graph's
    if any(dtype != "float64" for dtype in declared):
        raise DTypeError(f"gradcheck computes in float64, and graph '{getattr(fn, 'name', fn)}' takes "
                         f"{', '.join(declared)}: trace it with float64 specs, or pass the traced function itself")
    xs = [np.array(x, dtype=np.float64) for x in inputs]

    def flat_outputs(*arrays: Any) -> npt.NDArray[np.float64]:
        out = fn(*arrays)
        out = out if isinstance(out, tuple) else (out,)
        return np.concatenate([np.asarray(o, dtype=np.float64).ravel() for o in out])

    outputs, pullback = vjp(fn, *xs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    sizes = [np.asarray(o).size for o in outputs]
    m = sum(sizes)
    analytic = [np.zeros((m, x.size)) for x in xs]
    for row in range(m):
        basis = np.zeros(m)
        basis[row] = 1.0
        cotangents: list[Any]
        cotangents, start = [], 0
        for out, size in zip(outputs, sizes):
            cotangents.append(basis[start:start + size].reshape(np.shape(out)))
            start += size
        for k, g in enumerate(pullback(*cotangents)):
            analytic[k][row] = np.asarray(g, dtype=np.float64).ravel()
    worst = 0.0
    for k, x in enumerate(xs):
        numeric = np.zeros((m, x.size))
        for j in range(x.size):
            plus, minus = [a.copy() for a in xs], [a.copy() for a in xs]
            plus[k].flat[j] += eps
            minus[k].flat[j] -= eps
            numeric[:, j] = (flat_outputs(*plus) - flat_outputs(*minus)) / (2 * eps)
        difference = np.abs(analytic[k] - numeric)
        worst = max(worst, float(difference.max(initial=0.0)))
        if not np.allclose(analytic[k], numeric, rtol=rtol, atol=atol):
            name = getattr(fn_or_op, "name", getattr(fn_or_op, "__name__", "function"))
            raise OpCheckFailure(f"gradcheck of '{name}': input {k}: analytical and numerical gradients differ by "
                                 f"up to {difference.max():.3g}\nanalytical:\n{analytic[k]}\nnumerical:\n{numeric}")
    return worst
