"""The one operator model.

An ``Op`` is a name, its tensor inputs and outputs, typed attributes and
traits, an inference function (shapes and dtypes from specs alone) and a list
of kernels.  Every way of declaring an op -- ``Custom``/``CustomRegOp``,
schemas, built-ins -- produces an ``Op``, and every call goes through
``Op.__call__``.
"""
from __future__ import annotations

import os
import string
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol, TypeAlias, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

from ._native import OpBase, use_vectorcall  # the C side of a call; imports nothing of opforge
from .attrs import REQUIRED, AttrDef, AttrValue, check_attr
from .bounded_cache import BoundedCache
from .dtypes import DTypeLike
from .dtypes import normalize as normalize_dtype
from .errors import (ArityError, AttrError, CheckError, DTypeError, InferenceError, OpforgeError, SchemaError,
                     ShapeError)
from .sbp import SBPDeclaration, Signature, checked_declaration, signatures
from .spec import TensorSpec

_F = TypeVar("_F", bound=Callable[..., Any])
_D = TypeVar("_D")

#: A kernel's accepted dtypes: one signature per variant, dtype names (None = any) for the inputs, then the outputs.
DTypeSignatures: TypeAlias = "Sequence[Sequence[str | None]]"
#: ``dtypes=`` of ``Op.kernel``: ``{"x": ["float32", "float64"], ...}`` (one entry per variant), or full signatures.
KernelDTypes: TypeAlias = "Mapping[str, DTypeLike | Sequence[DTypeLike]] | Sequence[Sequence[DTypeLike]] | None"
#: A native launcher: called with an op call's tensors, returns its output(s).
Launcher: TypeAlias = "Callable[..., Any]"


class _Clearable(Protocol):
    def clear(self) -> object: ...


class _Runtime:
    """What the core needs from the runtime above it, filled in by the runtime
    when it is imported (so imports point down): ``launcher_for(op, attrs, n)``
    and ``source_kernels(op, **options)``."""

    launcher_for: Callable[[Op, dict[str, AttrValue], int], Launcher]
    source_kernels: Callable[..., list[Kernel]]


RUNTIME = _Runtime()


@dataclass(frozen=True)
class InputDef:
    """A tensor input of a schema: ``Tensor``, ``Tensor?`` (optional) or ``Tensor[]`` (variadic)."""

    name: str
    optional: bool = False
    variadic: bool = False


class Kernel:
    """One implementation of an op: where it runs and what it accepts.

    Subclasses implement ``run`` (and the runtime's native kernels ``plan``).
    ``dtypes`` is None (any) or a list of accepted signatures, each a tuple of
    dtype names (None = any) for the inputs followed by the outputs.
    """

    device = "cpu"
    priority = 1  # dispatch prefers higher: native kernels are 2
    reference = False
    dispatchable = True  # False: a reference kept for checks only, never chosen by dispatch
    #: None, or a callable ``() -> None | str`` for a kernel that needs something besides the CPU (a
    #: library such as OpenBLAS): it makes that ready and returns None, or says why it cannot; dispatch
    #: then skips the kernel, as it does one whose ISA the CPU lacks.
    requires: Callable[[], str | None] | None = None
    #: What a C kernel's non-zero return codes mean ({4: "input 'indices' holds ..."}): KernelError says so.
    error_messages: Mapping[int, str] = {}
    #: Names of ``Tensor?`` inputs the kernel is for calls without (``kernel(absent_inputs=...)``): it takes
    #: only calls where each of them is absent.  A native kernel takes no other absent input (the C ABI
    #: passes present tensors only), so a variant compiled for "no bias" is how it serves such calls.
    absent_inputs: frozenset[str] = frozenset()

    def __init__(self, *, device: str = "cpu", dtypes: DTypeSignatures | None = None, isa: str | None = None,
                 layout: str = "ndarray", name: str | None = None) -> None:
        self.device = device.lower()
        self.dtypes = dtypes
        self.isa = isa
        self.layout = layout
        self.name = name or type(self).__name__
        self.op_name: str | None = None  # the op that holds it (set by Op.add_kernel): for messages

    def reject_reason(self, op: Op, specs: Sequence[TensorSpec | None]) -> str | None:
        """Why this kernel cannot take inputs of these specs, or None if it can."""
        missing = self.requires() if self.requires is not None else None
        if missing:
            return missing
        for index, spec in enumerate(specs):
            if spec is not None and op.input_name(index) in self.absent_inputs:
                return f"input '{op.input_name(index)}' is given; the kernel is for calls without it"
            if spec is not None and self.layout != "any" and spec.layout != self.layout:
                return f"input '{op.input_name(index)}' is in layout {spec.layout}, the kernel takes {self.layout}"
        if self.dtypes is None:
            return None
        given = tuple(s.dtype if s is not None else None for s in specs)
        # a signature has one dtype per declared input; a variadic input's holds for each of its tensors
        inputs_of = ((lambda sig: (sig[0],) * len(given)) if op.variadic
                     else (lambda sig: sig[: len(given)]))
        for signature in self.dtypes:
            if all(w is None or g is None or w == g for w, g in zip(inputs_of(signature), given)):
                return None
        if len(self.dtypes) == 1:  # name the first input that is off
            for index, (w, g) in enumerate(zip(inputs_of(self.dtypes[0]), given)):
                if w is not None and w != g:
                    return f"input '{op.input_name(index)}' has dtype {g}, but the kernel takes {w}"
        named = ", ".join(f"{op.input_name(k)}={g}" for k, g in enumerate(given))
        accepted = "; ".join(", ".join(d or "any" for d in inputs_of(sig)) for sig in self.dtypes)
        return f"input dtypes ({named}) match none of the kernel's signatures ({accepted})"

    def infer(self, op: Op, specs: Sequence[TensorSpec | None],
              attrs: Mapping[str, AttrValue]) -> TensorSpec | Sequence[TensorSpec] | None:
        """Kernel-provided inference (e.g. a C++ InferShape); None if it has none."""
        return None

    def run(self, op: Op, arrays: Sequence[Any], attrs: Mapping[str, AttrValue], out_specs: Sequence[TensorSpec],
            in_specs: Sequence[TensorSpec | None] | None = None) -> Sequence[Any]:
        """Run on the input arrays; returns the output arrays, one per output spec (``in_specs``: the
        inputs' specs where the caller has them, as a graph's executor does)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.name} device={self.device}>"


class PyKernel(Kernel):
    """A kernel written in Python on NumPy arrays (MindSpore's "pyfunc").

    ``fn(*arrays, **attrs)`` returns one array, or a tuple for several outputs;
    results are checked against the op's inference.
    """

    def __init__(self, fn: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(name=kwargs.pop("name", None) or getattr(fn, "__name__", "python_kernel"), **kwargs)
        self.fn = fn

    def run(self, op: Op, arrays: Sequence[Any], attrs: Mapping[str, AttrValue], out_specs: Sequence[TensorSpec],
            in_specs: Sequence[TensorSpec | None] | None = None) -> list[npt.NDArray[Any]]:
        result = self.fn(*arrays, **attrs)
        if result is None:
            raise InferenceError(f"op '{op.name}': Python kernel '{self.name}' returned None; a kernel returns its "
                                 "output array (a tuple of them for several outputs)")
        outputs = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(outputs) != len(out_specs):
            raise InferenceError(f"op '{op.name}': Python kernel '{self.name}' returned {len(outputs)} output(s), "
                                 f"the op declares {len(out_specs)}")
        checked = []
        for name, value, spec in zip(op.outputs, outputs, out_specs):
            value = np.asarray(value)
            if not spec.matches(value.shape):
                raise ShapeError(f"op '{op.name}': Python kernel '{self.name}' returned output '{name}' of shape "
                                 f"{list(value.shape)}, inference says {list(spec.shape)}")
            # a cast within a kind (float64 -> float32) is the kernel's NumPy promotion; one across kinds
            # (float -> int) would truncate values the kernel meant
            if not np.can_cast(value.dtype, spec.dtype, casting="same_kind"):
                raise DTypeError(f"op '{op.name}': Python kernel '{self.name}' returned output '{name}' of dtype "
                                 f"{value.dtype}, inference says {spec.dtype}")
            checked.append(np.array(value, dtype=spec.dtype, order="C"))
        return checked


def holds_tensors(value: Any) -> bool:
    """A non-empty list or tuple of array objects (not of numbers or nested lists: that is one tensor's data)."""
    return (isinstance(value, (list, tuple)) and len(value) > 0
            and not any(isinstance(v, (bool, int, float, complex, list, tuple, np.generic)) or v is None
                        for v in value))


def _check_names(name: Any, inputs: Any, outputs: Any, attrs: Any) -> None:
    """SchemaError unless the op's name is a string and its inputs, outputs and
    attributes are sequences (not strings) of names / InputDefs / AttrDefs."""
    if not isinstance(name, str) or not name:
        raise SchemaError(f"an op's name is a non-empty string such as 'mylib::scale', got {name!r}")
    for what, items, kinds in (("inputs", inputs, (str, InputDef)), ("outputs", outputs, (str,)),
                               ("attrs", attrs, (AttrDef,))):
        if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
            raise SchemaError(f"op '{name}': {what} must be a list, got {items!r}")
        bad = [item for item in items if not isinstance(item, kinds)]
        if bad:
            expected = " or ".join(k.__name__ for k in kinds)
            raise SchemaError(f"op '{name}': {what} must hold {expected} items, got {bad[0]!r}")
    if not outputs:
        raise SchemaError(f"op '{name}' needs at least one output")


class Op(OpBase):
    """An operator: schema, inference and kernels.  Call it on arrays.

    Calling goes through the C base ``OpBase``: with no keyword arguments, a
    call goes straight to ``_default_launcher`` (the native fast path);
    otherwise to ``call(args, kwargs)``.
    """

    # every live op, so a dispatch setting can reset them all
    _instances: ClassVar[weakref.WeakSet[Op]] = weakref.WeakSet()
    _instances_lock = threading.Lock()  # a WeakSet cannot be copied while another thread adds to it
    #: Set by ``opforge.op`` and declaration files only (absent otherwise): the schema text, and where it was declared.
    schema: str
    defined_at: str | None
    _shape_fn: Callable[..., Any]  # MindSpore-style halves of the inference, set by infer_shape / infer_dtype
    _dtype_fn: Callable[..., Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        use_vectorcall(cls)

    @classmethod
    def forget_all_plans(cls) -> None:
        """Drop every op's cached kernel choices (after the ISA cap changed)."""
        with cls._instances_lock:
            ops = list(cls._instances)
        for op in ops:
            op._forget_plans()

    def __init__(self, name: str, inputs: Iterable[str | InputDef], outputs: Iterable[str],
                 attrs: Iterable[AttrDef] = (), *, traits: Iterable[str] = (), doc: str | None = None,
                 tuple_output: bool | None = None) -> None:
        _check_names(name, inputs, outputs, attrs)
        self.name = name
        self.inputs = tuple(i if isinstance(i, InputDef) else InputDef(i) for i in inputs)
        self.outputs = tuple(outputs)
        # Defaults are normalised once (lists -> tuples, NumPy scalars -> Python).
        self.attrs = {a.name: a if a.default is REQUIRED else replace(a, default=check_attr(name, a, a.default))
                      for a in attrs}
        self.traits = frozenset(traits)
        self.doc = doc
        self.tuple_output = len(self.outputs) > 1 if tuple_output is None else tuple_output
        self.variadic = len(self.inputs) == 1 and self.inputs[0].variadic
        if any(i.variadic for i in self.inputs) and not self.variadic:
            raise SchemaError(f"op '{name}': a variadic input must be the op's only tensor input")
        self.kernels: list[Kernel] = []
        self.converts_layout = False  # a kernel of layout "any" (a reorder): inference gives its outputs' layout
        self.infer_fn: Callable[..., Any] | None = None
        self.check_fn: Callable[..., Any] | None = None
        self.grad_rule: Callable[..., Any] | None = None
        self.grad_saves: tuple[str, ...] = ()
        self.sbp_declaration: SBPDeclaration | None = None  # see Op.sbp
        self.expression: str | None = None  # see Op.fuse_as
        # (frozen attribute values, n inputs) -> runtime Launcher
        self._launchers: BoundedCache[tuple[object, int], Launcher] = BoundedCache(64)
        # caches a frontend keeps per op (a torch op's plans): dropped with the launchers
        self.plan_caches: list[_Clearable] = []
        with Op._instances_lock:
            Op._instances.add(self)
        self._default_launcher = None

    # -- declaration ------------------------------------------------------
    def add_kernel(self, kernel: Kernel) -> Kernel:
        """Attach a kernel object (what ``kernel`` does after building one)."""
        if "cpu_only" in self.traits and kernel.device != "cpu":
            raise SchemaError(f"op '{self.name}' has trait cpu_only; it cannot take a {kernel.device} kernel")
        kernel.op_name = kernel.op_name or self.name
        self.kernels.append(kernel)
        self.converts_layout = self.converts_layout or kernel.layout == "any"
        self._forget_plans()
        return kernel

    @overload
    def kernel(self, fn: _F, *, device: str = "cpu", dtypes: KernelDTypes = None, isa: str | None = None,
               layout: str = "ndarray", name: str | None = None, reference: bool = False) -> _F: ...

    @overload
    def kernel(self, fn: None = None, *, device: str = "cpu", dtypes: KernelDTypes = None, isa: str | None = None,
               layout: str = "ndarray", name: str | None = None,
               reference: bool = False) -> Callable[[_F], _F]: ...

    @overload
    def kernel(self, fn: None = None, *, source: str | os.PathLike[str] | None = None, code: str | None = None,
               function: str | None = None, device: str = "cpu", dtypes: KernelDTypes = None, isa: str | None = None,
               layout: str = "ndarray", cflags: Sequence[str] = (), include_dirs: Sequence[str | os.PathLike[str]] = (),
               name: str | None = None, reference: bool = False, errors: Mapping[int, str] | None = None,
               absent_inputs: Iterable[str] = ()) -> Any: ...  # a Kernel, or a list: one per variant

    def kernel(self, fn: Callable[..., Any] | None = None, *, source: str | os.PathLike[str] | None = None,
               code: str | None = None, function: str | None = None, device: str = "cpu", dtypes: KernelDTypes = None,
               isa: str | None = None, layout: str = "ndarray", cflags: Sequence[str] = (),
               include_dirs: Sequence[str | os.PathLike[str]] = (), name: str | None = None,
               reference: bool = False, errors: Mapping[int, str] | None = None,
               absent_inputs: Iterable[str] = ()) -> Any:
        """Add a kernel.

        * ``op.kernel(source="leaky_relu.cc:LeakyRelu", ...)``: a C/C++/CUDA
          function on the aot ABI (a relative path resolves from the caller's cwd);
        * ``op.kernel(code=CPP, function="LeakyRelu", ...)``: the same from a string;
        * ``@op.kernel(device="cpu")`` on ``fn(*arrays, **attrs)``: a NumPy kernel.
          ``reference=True`` marks it as the semantics other kernels are checked
          against (see ``Op.reference``: a kernel only for its declared ``dtypes``).

        ``dtypes={"x": ["float32", "float64"]}`` compiles a source once per
        listed dtype, with ``OPFORGE_T`` defined as the C type (and
        ``OPFORGE_DTYPE_<NAME>`` set); ``isa`` ("sse41", "avx", "avx2",
        "avx512") compiles with that instruction set and lets dispatch pick
        the best one the CPU has.  ``errors={4: "input 'indices' holds an index
        out of range"}`` says what a C kernel's return codes mean: the
        ``KernelError`` of a failed call quotes it.  ``absent_inputs=["bias"]``
        (``Tensor?`` inputs) makes a kernel for calls without those inputs:
        it takes exactly the calls where they are absent, and its C function
        gets the present tensors only (a C kernel otherwise takes no call with
        an absent input).  Returns the kernel (or list of kernels).
        """
        if errors is not None and not (isinstance(errors, Mapping) and all(
                isinstance(c, int) and not isinstance(c, bool) and c != 0 and isinstance(m, str)
                for c, m in errors.items())):
            raise OpforgeError(f"op '{self.name}': errors= maps a kernel's non-zero return codes (int) to what they "
                               f"mean (str), e.g. {{4: \"input 'x' is out of range\"}}; got {errors!r}")
        if errors and source is None and code is None:
            raise OpforgeError(f"op '{self.name}': errors= explains a C kernel's return codes (with source= or "
                               "code=); a Python kernel raises its own opforge error")
        absent = frozenset(absent_inputs)
        optional = {i.name for i in self.inputs if i.optional}
        if not absent <= optional:
            raise SchemaError(f"op '{self.name}': absent_inputs names {sorted(absent - optional)}; only optional "
                              f"(Tensor?) inputs can be absent: {sorted(optional) or 'none'}")
        if fn is None and source is None and code is None:
            return lambda f: self.kernel(f, device=device, dtypes=dtypes, isa=isa, layout=layout, name=name,
                                         reference=reference, absent_inputs=absent)
        signatures = self._dtype_signatures(dtypes)
        if fn is not None:
            kernel = PyKernel(fn, device=device, dtypes=signatures, isa=isa, layout=layout, name=name)
            kernel.reference = reference
            kernel.dispatchable = not reference or signatures is not None  # see Op.reference
            kernel.absent_inputs = absent
            self.add_kernel(kernel)
            return fn
        kernels = RUNTIME.source_kernels(self, source=source, code=code, function=function, device=device,
                                 signatures=signatures, dtypes=dtypes, isa=isa, layout=layout, cflags=cflags,
                                 include_dirs=include_dirs, name=name)
        for made in kernels:
            if errors:
                made.error_messages = dict(errors)
            made.absent_inputs = absent
            self.add_kernel(made)
        return kernels[0] if len(kernels) == 1 else kernels

    @overload
    def reference(self, fn: _F, *, fallback: bool = False, dtypes: KernelDTypes = None) -> _F: ...

    @overload
    def reference(self, fn: None = None, *, fallback: bool = False,
                  dtypes: KernelDTypes = None) -> Callable[[_F], _F]: ...

    def reference(self, fn: _F | None = None, *, fallback: bool = False,
                  dtypes: KernelDTypes = None) -> _F | Callable[[_F], _F]:
        """Decorator: the op's NumPy reference, the semantics its kernels are
        checked against (``opforge.testing.check_op``).

        It is not a kernel unless the op says so: ``fallback=True`` lets
        dispatch run it for inputs no other kernel takes, ``dtypes={...}``
        (as for ``op.kernel``) for those dtypes only.  Otherwise such calls
        raise what they would without it (``DTypeError`` for a dtype no
        kernel takes, else ``NoKernelError``).
        """
        if fn is None:
            return lambda f: self.reference(f, fallback=fallback, dtypes=dtypes)
        self.kernel(fn, reference=True, dtypes=dtypes)
        if fallback:
            self.kernels[-1].dispatchable = True
        return fn

    @property
    def reference_kernel(self) -> Kernel | None:
        return next((k for k in self.kernels if getattr(k, "reference", False)), None)

    def _dtype_signatures(self, dtypes: KernelDTypes) -> list[tuple[str | None, ...]] | None:
        """{"x": [...], ...} -> one signature per variant (inputs then outputs; None = any)."""
        if dtypes is None:
            return None
        if not isinstance(dtypes, dict):  # a list of full signatures
            return [tuple(None if d is None else normalize_dtype(d) for d in sig) for sig in dtypes]
        names = [i.name for i in self.inputs] + list(self.outputs)
        for key in dtypes:
            if key not in names:
                raise SchemaError(f"op '{self.name}': kernel dtypes name '{key}', which is not an input or output "
                                  f"(inputs and outputs: {', '.join(names)})")
        lists = {k: [normalize_dtype(d) for d in ([v] if isinstance(v, str) else v)] for k, v in dtypes.items()}
        lengths = {len(v) for v in lists.values()}
        if len(lengths) != 1:
            raise SchemaError(f"op '{self.name}': kernel dtype lists must have one entry per variant, "
                              f"got lengths {sorted(lengths)}")
        return [tuple(lists[n][k] if n in lists else None for n in names) for k in range(lengths.pop())]

    def def_infer(self, fn: _F) -> _F:
        """Set ``fn(*input_specs, **attrs) -> TensorSpec or tuple`` as the op's inference."""
        self.infer_fn = fn
        self._forget_plans()
        return fn

    def infer_shape(self, fn: _F) -> _F:
        """Decorator (MindSpore style): ``fn(*shapes, **attrs) -> shape or tuple of shapes``."""
        self._shape_fn = fn
        return self._combine_shape_dtype(fn)

    def infer_dtype(self, fn: _F) -> _F:
        """Decorator (MindSpore style): ``fn(*dtypes, **attrs) -> dtype or tuple of dtypes``."""
        self._dtype_fn = fn
        return self._combine_shape_dtype(fn)

    def _combine_shape_dtype(self, returned: _F) -> _F:
        shape_fn, dtype_fn = getattr(self, "_shape_fn", None), getattr(self, "_dtype_fn", None)

        def infer(*specs: TensorSpec | None, **attrs: Any) -> list[TensorSpec]:
            # Either half may be missing: every output then takes the first input's shape (or dtype).
            n = len(self.outputs)
            present = [s for s in specs if s is not None]
            if not present and not (shape_fn and dtype_fn):
                raise InferenceError(f"op '{self.name}': inference without infer_shape and infer_dtype "
                                     "copies the first input, but no input was given")
            if shape_fn is None:
                shapes = [present[0].shape] * n
            else:
                shapes = shape_fn(*[s and s.shape for s in specs], **attrs)
                shapes = list(shapes) if self.tuple_output else [shapes]
            if dtype_fn is None:
                dtypes = [present[0].dtype] * n
            else:
                dtypes = dtype_fn(*[s and s.dtype for s in specs], **attrs)
                dtypes = list(dtypes) if isinstance(dtypes, (tuple, list)) else [dtypes] * n
            if len(shapes) != n or len(dtypes) != n:
                raise InferenceError(f"op '{self.name}' declares {n} output(s) ({', '.join(self.outputs)}); "
                                     f"infer_shape gave {len(shapes)} shape(s) and infer_dtype {len(dtypes)} dtype(s)")
            return [TensorSpec(shape, dtype) for shape, dtype in zip(shapes, dtypes)]

        self.def_infer(infer)
        return returned

    @overload
    def grad(self, fn: _F, *, save: Iterable[str] = ()) -> _F: ...

    @overload
    def grad(self, fn: None = None, *, save: Iterable[str] = ()) -> Callable[[_F], _F]: ...

    def grad(self, fn: _F | None = None, *, save: Iterable[str] = ()) -> _F | Callable[[_F], _F]:
        """Attach the gradient rule (capture / apply).

        ``save`` names the inputs and outputs the rule needs; the rule is
        called as ``rule(saved, *output_grads, **attrs)`` with ``saved.<name>``
        those values, and returns the input gradients (a tuple for several
        inputs; None where an input has none).  Rules are written with ops,
        so they are traced into backward graphs like any other code.
        """
        if fn is None:
            return lambda f: self.grad(f, save=save)
        names = {i.name for i in self.inputs} | set(self.outputs)
        unknown = [n for n in save if n not in names]
        if unknown:
            raise SchemaError(f"op '{self.name}': the gradient rule saves {unknown}, which are not inputs or outputs")
        self.grad_rule = fn
        self.grad_saves = tuple(save)
        return fn

    def check(self, fn: _F) -> _F:
        """Decorator (OneFlow's check_fn): ``fn(*input_specs, **attrs)`` raises, or returns
        an error message, when the inputs or attributes are invalid."""
        self.check_fn = fn
        self._forget_plans()
        return fn

    def sbp(self, declaration: _D) -> _D:
        """Declare the op's SBP signatures (OneFlow's get_sbp_fn; see ``opforge.sbp``).

        As a decorator on ``fn(*input_specs, **attrs)`` returning a list of
        signatures, each a dict naming every input and output:
        ``{"a": split(0), "b": broadcast, "y": split(0)}``; or given a list of
        such dicts directly, for signatures that do not depend on shapes.
        """
        self.sbp_declaration = checked_declaration(self, declaration)
        return declaration

    def fuse_as(self, expression: str) -> Op:
        """Declare the op as one C++ expression of its inputs' element values and
        its attributes, e.g. ``"{x} > 0 ? {x} : {alpha} * {x}"``, so a graph can
        fuse a chain of such ops into one generated kernel (``graph.fusion``).
        The expression is evaluated in the element type ``T`` of a float
        signature whose inputs have the output's shape or one element."""
        if "elementwise" not in self.traits or len(self.outputs) != 1 or self.variadic:
            raise SchemaError(f"op '{self.name}': fuse_as needs the elementwise trait and one output")
        try:
            fields = {name for _, name, _, _ in string.Formatter().parse(expression) if name is not None}
        except ValueError as error:
            raise SchemaError(f"op '{self.name}': fuse_as expression {expression!r}: {error}") from None
        known = {i.name for i in self.inputs} | set(self.attrs)
        if not fields <= known:
            raise SchemaError(f"op '{self.name}': fuse_as expression names {sorted(fields - known)}; "
                              f"expected input or attribute names: {sorted(known)}")
        self.expression = expression
        return self

    def sbp_signatures(self, specs: Iterable[object], attrs: Mapping[str, object] | None = None) -> list[Signature]:
        """The op's valid SBP signatures for these input specs and attribute values (``opforge.sbp.signatures``)."""
        return signatures(self, specs, attrs)

    def _forget_plans(self) -> None:
        self._launchers.clear()
        self._forget_keyword_calls()
        for cache in self.plan_caches:
            cache.clear()
        self._default_launcher = None

    # -- binding ----------------------------------------------------------
    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, AttrValue]]:
        """Split a call's arguments into tensor inputs and checked attributes."""
        if self.variadic:  # any number of tensors, no positional attributes
            if len(args) == 1 and holds_tensors(args[0]):
                args = tuple(args[0])  # a list of them, as torch passes a Tensor[] argument
            tensors, extra = list(args), []
            n_in = len(tensors)
        else:
            n_in = len(self.inputs)
            tensors, extra = list(args[:n_in]), list(args[n_in:])
        if len(tensors) < n_in:
            missing = [i.name for i in self.inputs[len(tensors):] if not i.optional]
            if missing:
                raise ArityError(
                    f"op '{self.name}' takes {n_in} tensor input(s) ({', '.join(i.name for i in self.inputs)}), "
                    f"got {len(tensors)}; missing: {', '.join(missing)}")
            tensors += [None] * (n_in - len(tensors))
        self.check_present(tensors)
        positional = [a for a in self.attrs.values() if a.positional]
        if len(extra) > len(positional):
            keyword = [a.name for a in self.attrs.values() if not a.positional]
            raise ArityError(
                f"op '{self.name}' takes {n_in} tensor input(s) ({', '.join(i.name for i in self.inputs)})"
                + (f" and {len(positional)} positional attribute(s)" if positional else "")
                + f", got {len(args)} positional arguments"
                + (f"; pass attributes by keyword ({', '.join(f'{n}=...' for n in keyword)})" if keyword else ""))
        values = {a.name: v for a, v in zip(positional, extra)}
        for name, value in kwargs.items():
            if name not in self.attrs:
                known = ", ".join(self.attrs) or "none"
                raise AttrError(f"op '{self.name}' has no attribute '{name}' (attributes: {known})")
            if name in values:
                raise AttrError(f"op '{self.name}': attribute '{name}' given twice")
            values[name] = value
        return tensors, self.resolve_attrs(values)

    def resolve_attrs(self, values: Mapping[str, object]) -> dict[str, AttrValue]:
        """Fill defaults, reject missing required attributes, check types."""
        resolved: dict[str, AttrValue] = {}
        for name, attr in self.attrs.items():
            if name in values:
                resolved[name] = check_attr(self.name, attr, values[name])
            elif attr.default is not REQUIRED:
                resolved[name] = cast(AttrValue, attr.default)  # checked by __init__
            else:
                raise AttrError(f"op '{self.name}': required attribute '{name}' ({attr.type}) was not given")
        return resolved

    # -- inference --------------------------------------------------------
    def infer_specs(self, specs: Sequence[TensorSpec | None], attrs: Mapping[str, AttrValue],
                    kernel: Kernel | None = None) -> list[TensorSpec]:
        """Output specs for input specs; the op's inference, else the kernel's (a C++ InferShape)."""
        if self.check_fn is not None:
            problem = self._user_function(self.check_fn, CheckError, specs, attrs)
            if problem:
                raise CheckError(f"op '{self.name}': {problem}")
        if self.infer_fn is not None:
            try:
                result = self._user_function(self.infer_fn, InferenceError, specs, attrs)
            except (ShapeError, InferenceError) as error:  # a shared helper's message: say whose call it was
                if f"op '{self.name}'" in str(error) or len(error.args) != 1:
                    raise
                raise type(error)(f"op '{self.name}': {error}") from None
        else:
            candidates = [kernel] if kernel is not None else self.kernels
            result = None
            for k in candidates:
                result = k.infer(self, specs, attrs)
                if result is not None:
                    break
            if result is None:
                raise InferenceError(f"op '{self.name}' has no shape inference: give it an infer function "
                                     "(or out_shape), or a kernel library that exports an InferShape function")
        returned = result
        result = [result] if isinstance(result, TensorSpec) or not hasattr(result, "__iter__") else list(result)
        if not all(isinstance(spec, TensorSpec) for spec in result):
            raise InferenceError(f"op '{self.name}': inference must return a TensorSpec, or one per output, "
                                 f"got {returned!r}")
        if len(result) != len(self.outputs):
            raise InferenceError(f"op '{self.name}': inference returned {len(result)} output spec(s), "
                                 f"the op declares {len(self.outputs)} ({', '.join(self.outputs)})")
        return result

    def _user_function(self, fn: Callable[..., Any], error_type: type[OpforgeError],
                       specs: Sequence[TensorSpec | None], attrs: Mapping[str, AttrValue]) -> Any:
        """fn(*specs, **attrs), a check or inference the op's author wrote: a bug in it (an IndexError, a
        TypeError) is an error of this op's, named so, with the original as its cause."""
        try:
            return fn(*specs, **attrs)
        except OpforgeError:
            raise
        except Exception as error:
            what = "check" if error_type is CheckError else "inference"
            raise error_type(f"op '{self.name}': its {what} function {getattr(fn, '__name__', fn)!r} raised "
                             f"{type(error).__name__}: {error}") from error

    @overload
    def infer(self, fn: _F, /) -> _F: ...

    @overload
    def infer(self, *args: Any, **attrs: Any) -> Any: ...

    def infer(self, *args: Any, **attrs: Any) -> Any:
        """Output spec(s) for input specs (or arrays); -1 dims and [-2] ranks propagate.

        Used as a decorator on a function, sets the op's inference instead.
        """
        if len(args) == 1 and callable(args[0]) and not attrs and not hasattr(args[0], "shape"):
            return self.def_infer(args[0])
        tensors, attr_values = self.bind(args, attrs)
        specs = [t if isinstance(t, TensorSpec) or t is None else TensorSpec.of(t) for t in tensors]
        out = self.infer_specs(specs, attr_values)
        return tuple(out) if self.tuple_output else out[0]

    # -- calling ----------------------------------------------------------
    def _keyword_launcher(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Launcher | None:
        """The launcher of a call whose positional arguments are all its tensors and whose
        keywords are all attributes (the C base remembers it for calls with the same
        values), or None for any other call; raises the op's errors for bad values."""
        n_tensors = len(args) if self.variadic else len(self.inputs)
        if len(args) != n_tensors or not all(name in self.attrs for name in kwargs):
            return None
        if self.variadic and len(args) == 1 and holds_tensors(args[0]):
            return None  # a list of the tensors: bind unpacks it, call by call (a launcher takes them one by one)
        tensors, attrs = self.bind(args, kwargs)
        return RUNTIME.launcher_for(self, attrs, len(tensors))

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The general call path: bind, then run through the attributes' launcher."""
        tensors, attr_values = self.bind(args, kwargs)
        return RUNTIME.launcher_for(self, attr_values, len(tensors))(*tensors)

    def check_present(self, tensors: Sequence[object]) -> None:
        """ArityError for None given where the schema wants a tensor (only ``Tensor?`` inputs may be None)."""
        for index, tensor in enumerate(tensors):
            if tensor is None and (self.variadic or not self.inputs[index].optional):
                raise ArityError(f"op '{self.name}': input '{self.input_name(index)}' is a required tensor, got None "
                                 "(only inputs declared 'Tensor?' may be None)")

    def input_name(self, index: int) -> str:
        return f"{self.inputs[0].name}[{index}]" if self.variadic else self.inputs[index].name

    def check_output_shape(self, spec: TensorSpec) -> None:
        if not spec.is_static:
            raise ShapeError(f"op '{self.name}': inference gave output shape {list(spec.shape)} for concrete inputs; "
                             "an eager call needs every output dim known")

    def __repr__(self) -> str:
        ins = ", ".join(i.name for i in self.inputs)
        attrs = ", ".join(self.attrs)
        return f"<opforge.Op {self.name}({ins}{'; ' + attrs if attrs else ''}) -> {', '.join(self.outputs)}>"


use_vectorcall(Op)  # keyword calls need no dict (Python before 3.12 does not pass vectorcall on to subclasses)
