"""MindSpore's ``Custom`` / ``CustomRegOp`` / ``DataType``, as a frontend onto ``Op``.

``Custom("./kernel.cc:CustomKernel", out_shape, out_dtype, "aot", reg_info=...)``
builds an ``Op`` whose one kernel is the library function, whose inference
comes from ``out_shape``/``out_dtype`` (or the library's ``InferShape``), and
whose attributes are the registration's attrs.  Calls go through the same path
as every other op.
"""
from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .. import dtypes as _dtypes
from ..attrs import REQUIRED, AttrDef, check_attr
from ..errors import (ArityError, DTypeError, GradientError, InferenceError, OpforgeError, SchemaError,
                      ShapeError)
from ..operator import InputDef, Op, PyKernel
from ..runtime import build as _build
from ..runtime.aot import AotKernel, split_func
from ..spec import TensorSpec

if TYPE_CHECKING:
    import os
    from pathlib import Path

    from ..attrs import AttrValue
    from ..dtypes import DTypeLike
    from ..graph.autodiff import Saved


#: MindSpore's context: its ``device_target`` is where an aot Custom op with
#: no registered target runs.  ``compat.mindspore.set_context`` writes this
#: dict; an op reads it when it is made, as in MindSpore.
CONTEXT: dict[str, object] = {"device_target": "CPU"}


def kernel_device(path: Path, target: object) -> str:
    """The device an aot kernel runs on, chosen as MindSpore chooses: the
    registration's target; without one, a ``.cu`` source is GPU code, and
    anything else (a C++ source, a prebuilt library) runs on the context's
    ``device_target`` -- so MindSpore's ``Custom("./lib.so:Func", ...,
    reg_info=None)`` after ``set_context(device_target="GPU")`` is a GPU op."""
    if target is None:
        target = "GPU" if path.suffix == ".cu" else CONTEXT.get("device_target", "CPU")
    return "gpu" if target == "GPU" else "cpu"


class DataType:
    """(dtype, format) pairs for ``CustomRegOp.dtype_format``; "" means any."""

    None_None = ("", "")
    None_Default = ("", "DefaultFormat")


for _short, _name in [("BOOL", "bool"), ("I8", "int8"), ("I16", "int16"), ("I32", "int32"), ("I64", "int64"),
                      ("U8", "uint8"), ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
                      ("F16", "float16"), ("F32", "float32"), ("F64", "float64"), ("BF16", "bfloat16")]:
    setattr(DataType, f"{_short}_Default", (_name, "DefaultFormat"))
    setattr(DataType, f"{_short}_None", (_name, ""))


class CustomRegOp:
    """Registration info builder: inputs, outputs, dtype formats, attributes, target."""

    def __init__(self, op_name: str = "Custom") -> None:
        self._info: dict[str, Any] = {"op_name": op_name, "inputs": [], "outputs": [], "attr": [], "dtype_format": [],
                      "target": None}

    def input(self, index: int | None = None, name: str | None = None, param_type: str = "required",
              **kwargs: Any) -> CustomRegOp:
        self._info["inputs"].append({"index": index, "name": name, "param_type": param_type, **kwargs})
        return self

    def output(self, index: int | None = None, name: str | None = None, param_type: str = "required",
               **kwargs: Any) -> CustomRegOp:
        self._info["outputs"].append({"index": index, "name": name, "param_type": param_type, **kwargs})
        return self

    def dtype_format(self, *args: tuple[str, str]) -> CustomRegOp:
        for arg in args:
            if not (isinstance(arg, tuple) and len(arg) == 2 and all(isinstance(a, str) for a in arg)):
                raise SchemaError(f"CustomRegOp '{self._info['op_name']}': dtype_format takes DataType pairs such as "
                                  f"DataType.F32_Default, got {arg!r}")
        self._info["dtype_format"].append([list(a) for a in args])
        return self

    def attr(self, name: str | None = None, param_type: str | None = None, value_type: str | None = None,
             default_value: Any = None, **kwargs: Any) -> CustomRegOp:
        if not isinstance(name, str) or not name.isidentifier():
            raise SchemaError(f"CustomRegOp '{self._info['op_name']}': an attribute needs a name that is an "
                              f"identifier, got {name!r}")
        entry: dict[str, Any] = {"name": name, "param_type": param_type, "type": value_type}
        if default_value is not None:
            entry["default_value"] = default_value
        if "value" in kwargs:
            entry["value"] = kwargs.pop("value")
        entry.update(kwargs)
        self._info["attr"].append(entry)
        return self

    def target(self, target: str | None = None) -> CustomRegOp:
        if target not in ("CPU", "GPU", "Ascend", None):
            raise SchemaError(f"CustomRegOp '{self._info['op_name']}': target must be 'CPU' or 'GPU', got {target!r}")
        self._info["target"] = target
        return self

    def get_op_info(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self._info.items()}


_VALUE_TYPES = {"bool": "bool", "int": "int", "float": "float", "str": "str", "listInt": "int[]",
                "listFloat": "float[]", "listListInt": "int[][]", "listListFloat": "float[][]"}


def _attr_defs(info: Mapping[str, Any]) -> tuple[list[AttrDef], dict[str, str]]:
    """The registration's attributes, and the kind each declares (for known value types).

    MindSpore hands an aot kernel each value as given: ``value=1`` declared
    "float" is still read with ``Attr<int64_t>``.  So every attribute keeps its
    value's own type (AttrDef type "any"); the declared kind only rejects
    values that cannot be of that kind at all."""
    attrs, kinds = [], {}
    for entry in info.get("attr", []):
        if "value" in entry:
            default = entry["value"]
        elif entry.get("default_value") is not None:
            default = entry["default_value"]
        else:
            default = REQUIRED
        kind = _VALUE_TYPES.get(entry.get("type"))
        if kind is not None:
            kinds[entry["name"]] = kind
            if default is not REQUIRED:
                check_attr(info.get("op_name") or "Custom", AttrDef(entry["name"], kind), default)
        attrs.append(AttrDef(entry["name"], "any", default, positional="value" not in entry))
    return attrs, kinds


def _signatures(info: Mapping[str, Any]) -> list[tuple[str | None, ...]] | None:
    rows = info.get("dtype_format") or []
    signatures = [tuple(pair[0] or None for pair in row) for row in rows]
    signatures = [s for s in signatures if any(d is not None for d in s)]
    return [tuple(None if d is None else _dtypes.normalize(d) for d in s) for s in signatures] or None


def _shape_list(shape: Sequence[int]) -> list[int]:
    return list(shape) if shape != (-2,) else [-2]


def _registration_dict(func: object, reg_info: Any) -> Any:
    """One registration as a dict: a CustomRegOp, its get_op_info() dict, or that dict as a JSON string."""
    if isinstance(reg_info, CustomRegOp):
        return reg_info.get_op_info()
    if isinstance(reg_info, str):
        try:
            reg_info = json.loads(reg_info)
        except json.JSONDecodeError as error:
            raise SchemaError(f"Custom({func!r}): reg_info is a string, so it must be a JSON object as "
                              f"get_op_info() gives it, and it is not JSON ({error})") from None
        if not isinstance(reg_info, dict):
            raise SchemaError(f"Custom({func!r}): reg_info's JSON must be an object (a registration), got "
                              f"{type(reg_info).__name__}")
        for entry in reg_info.get("attr") or ():  # MindSpore's documented key for an attribute's type
            if isinstance(entry, dict) and "value_type" in entry and "type" not in entry:
                entry["type"] = entry.pop("value_type")
    return reg_info


def _flattened(items: Sequence[Any]) -> list[Any]:
    """Nested lists of registrations as one list, as MindSpore reads them."""
    return [leaf for item in items
            for leaf in (_flattened(item) if isinstance(item, (list, tuple)) else [item])]


def _registration(func: object, reg_info: Any) -> dict[str, Any] | None:
    """``reg_info`` as ``get_op_info()``'s dict (or None); a malformed one is a SchemaError."""
    if isinstance(reg_info, (list, tuple)):  # one registration per target: the context's, else the first
        infos = [_registration_dict(func, r) for r in _flattened(reg_info)]
        reg_info = next((r for r in infos if isinstance(r, dict) and r.get("target") == CONTEXT.get("device_target")),
                        infos[0] if infos else None)
    reg_info = _registration_dict(func, reg_info)
    if reg_info is not None and not isinstance(reg_info, dict):
        raise SchemaError(f"Custom({func!r}): reg_info must be a CustomRegOp, its get_op_info() dict or that "
                          f"dict as a JSON string (or a list of them), got {type(reg_info).__name__}")
    for entry in (reg_info or {}).get("attr") or ():
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise SchemaError(f"Custom({func!r}): every reg_info attribute needs a name, got {entry!r}")
    return reg_info


def _check_outputs(name: str, info: Mapping[str, Any], inputs: Sequence[InputDef], outputs: Sequence[str],
                   out_dtype: Any) -> None:
    """out_dtype and the dtype_format rows agree with the declared inputs and outputs."""
    if isinstance(out_dtype, (tuple, list)) and len(out_dtype) != len(outputs):
        raise SchemaError(f"op '{name}': out_dtype gives {len(out_dtype)} dtype(s), and reg_info declares "
                          f"{len(outputs)} output(s) ({', '.join(outputs)})")
    for dtype in (out_dtype if isinstance(out_dtype, (tuple, list)) else [out_dtype]):
        if dtype is not None and not callable(dtype):
            try:
                _dtypes.normalize(dtype)
            except DTypeError as error:
                raise DTypeError(f"op '{name}': out_dtype {out_dtype!r}: {error}") from None
    for row in info.get("dtype_format") or ():
        if info.get("inputs") and len(row) != len(inputs) + len(outputs):
            raise SchemaError(f"op '{name}': a dtype_format row has {len(row)} entries for {len(inputs)} "
                              f"input(s) and {len(outputs)} output(s)")


class Custom(Op):
    """MindSpore-compatible custom op: ``Custom(func, out_shape, out_dtype, func_type, bprop, reg_info)``."""

    def __init__(self, func: Any, out_shape: Any = None, out_dtype: Any = None,
                 func_type: str = "aot", bprop: Callable[..., Any] | None = None, reg_info: Any = None, *,
                 cflags: Iterable[str] = (), include_dirs: Iterable[str | os.PathLike[str]] = (),
                 cxx11_abi: bool | None = None) -> None:
        """MindSpore's arguments, plus opforge's keyword-only build options for
        sources: extra compiler flags, include folders, and the libstdc++ string
        ABI (default: MindSpore's ``-D_GLIBCXX_USE_CXX11_ABI=0`` for sources, read
        from the symbols for prebuilt libraries)."""
        reg_info = _registration(func, reg_info)
        info = reg_info or {}
        several = isinstance(out_dtype, (tuple, list)) or len(info.get("outputs") or ()) > 1 or (
            isinstance(out_shape, tuple) and bool(out_shape) and isinstance(out_shape[0], (list, tuple)))

        if func_type == "aot":
            path, function = split_func(func)
            default_name = function
        elif func_type == "pyfunc":
            if not callable(func):
                raise SchemaError("Custom(func_type='pyfunc') needs a Python function")
            default_name = func.__name__
        else:
            raise SchemaError(f"Custom: func_type {func_type!r} is not supported; use 'aot' (C/C++/CUDA) or 'pyfunc'")

        name: str = (info.get("op_name")  # type: ignore[assignment]  # not None: checked on the next line
                     if info.get("op_name") not in (None, "Custom") else default_name)
        if info.get("inputs"):
            inputs = [InputDef(i.get("name") or f"x{k}", optional=i.get("param_type") == "optional")
                      for k, i in enumerate(info["inputs"])]
        else:
            inputs = [InputDef("x", variadic=True)]
        n_out = len(out_dtype) if isinstance(out_dtype, (tuple, list)) else (
            len(info["outputs"]) if info.get("outputs") else len(out_shape) if several else 1)
        outputs = [o.get("name") or f"y{k}" for k, o in enumerate(info.get("outputs", []))] or (
            [f"y{k}" for k in range(n_out)] if n_out > 1 else ["y"])
        _check_outputs(name, info, inputs, outputs, out_dtype)
        attrs, self._attr_kinds = _attr_defs(info)
        # MindSpore always launches a Custom kernel, even on empty inputs.
        super().__init__(name, inputs, outputs, attrs, tuple_output=several, traits=["always_compute"],
                         doc=f"Custom op from {func!r}")
        # Without a registration the kernel's input count is unknown until out_shape's
        # parameters or the first call tell it; calls that disagree would hand the
        # kernel outputs as inputs.
        self._input_count = _parameter_count(out_shape) if self.variadic else None
        self._input_count_lock = threading.Lock()
        self.func = func
        self.func_type = func_type
        self.out_shape = out_shape
        self.out_dtype = out_dtype
        self.bprop = bprop
        self.reg_info = reg_info

        signatures = _signatures(info)
        self._rows = signatures or ()
        target = info.get("target")
        if func_type == "aot":
            self.aot_kernel = AotKernel(func, device=kernel_device(path, target), dtypes=signatures, name=function,
                                        cflags=cflags, include_dirs=include_dirs, cxx11_abi=cxx11_abi).load()
            if out_shape is None and not self.aot_kernel.has_infer_shape:
                raise InferenceError(f"op '{name}': out_shape is None, so the library must export "
                                     f"{function}InferShape, and {self.aot_kernel.location} does not")
            self.add_kernel(self.aot_kernel)
        else:
            if out_shape is None:
                raise InferenceError(f"op '{name}': a pyfunc Custom needs out_shape (a list, a tuple of lists, "
                                     "or a function of the input shapes)")
            self.add_kernel(PyKernel(func, dtypes=signatures))
        self.def_infer(self._infer)
        if bprop is not None:
            self._attach_bprop(bprop)

    def _attach_bprop(self, bprop: Callable[..., Any]) -> None:
        """MindSpore's ``bprop(*inputs, out, dout) -> input gradients`` as this op's
        gradient rule: a backward op whose Python kernel calls ``bprop`` on arrays."""
        n_out = len(self.outputs)
        several = self.tuple_output

        def run_bprop(*arrays: Any) -> tuple[npt.NDArray[Any], ...]:
            inputs, outs, douts = arrays[:-2 * n_out], arrays[-2 * n_out:-n_out], arrays[-n_out:]
            result = bprop(*inputs, outs if several else outs[0], douts if several else douts[0])
            result = result if isinstance(result, (tuple, list)) else (result,)
            if len(result) != len(inputs):
                raise GradientError(f"op '{self.name}': bprop returned {len(result)} gradient(s) for "
                                    f"{len(inputs)} input(s)")
            return tuple(np.asarray(r) for r in result)

        def infer_grads(*specs: TensorSpec) -> list[TensorSpec]:
            return [TensorSpec(s.shape, s.dtype) for s in specs[:-2 * n_out]]

        backward_ops: dict[int, Op] = {}  # one per input count: a variadic Custom may be called with any

        def backward_op_for(n_in: int) -> Op:
            if n_in not in backward_ops:
                op = Op(f"{self.name}_bprop", [InputDef("tensors", variadic=True)],
                        [f"d{k}" for k in range(n_in)], tuple_output=True)
                op.add_kernel(PyKernel(run_bprop, name=getattr(bprop, "__name__", "bprop")))
                op.def_infer(infer_grads)
                backward_ops[n_in] = op
            return backward_ops[n_in]

        def rule(saved: Saved, *douts: Any, **attrs: Any) -> Any:  # bprop takes tensors only, as in MindSpore
            return backward_op_for(len(saved.inputs))(*saved.inputs, *saved.outputs, *douts)

        self.grad(rule, save=())

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, AttrValue]]:
        if self.variadic:
            with self._input_count_lock:
                if self._input_count is None and args:
                    self._input_count = len(args)
            if self._input_count is None or len(args) != self._input_count:
                expected = "at least one" if self._input_count is None else self._input_count
                raise ArityError(f"op '{self.name}' takes {expected} tensor input(s) (fixed by "
                                 f"{self._count_source()}), got {len(args)}")
        return super().bind(args, kwargs)

    def _count_source(self) -> str:
        return "out_shape's parameters" if _parameter_count(self.out_shape) is not None else "its first call"

    def resolve_attrs(self, values: Mapping[str, object]) -> dict[str, AttrValue]:
        for name, value in values.items():  # values keep their own type (see _attr_defs)
            if name in self._attr_kinds:
                check_attr(self.name, AttrDef(name, self._attr_kinds[name]), value)
        return super().resolve_attrs(values)

    def _infer(self, *specs: TensorSpec, **attrs: Any) -> list[TensorSpec]:
        shapes_in = [_shape_list(s.shape) for s in specs]
        if self.out_shape is None:
            # kernel 0 is the AotKernel, whose infer gives a list of specs
            shapes = [s.shape for s in self.kernels[0].infer(self, specs, attrs)]  # type: ignore[union-attr]
        else:
            shapes = self._user("out_shape", *shapes_in) if callable(self.out_shape) else self.out_shape
            shapes = list(shapes) if self.tuple_output else [shapes]
        if callable(self.out_dtype):
            out_dtypes = self._user("out_dtype", *[_dtypes.to_numpy(s.dtype) for s in specs])
        else:
            out_dtypes = self.out_dtype
        if out_dtypes is not None:
            out_dtypes = list(out_dtypes) if isinstance(out_dtypes, (tuple, list)) else [out_dtypes] * len(shapes)
        n_dtypes = len(self.outputs) if out_dtypes is None else len(out_dtypes)
        if len(shapes) != len(self.outputs) or n_dtypes != len(self.outputs):
            raise InferenceError(f"op '{self.name}': out_shape gives {len(shapes)} shape(s) and out_dtype "
                                 f"{n_dtypes} dtype(s) for {len(self.outputs)} output(s)")
        out_dtypes = self._output_dtypes(specs, out_dtypes)
        result = []
        for name, shape, dtype in zip(self.outputs, shapes, out_dtypes):
            try:
                result.append(TensorSpec(shape, dtype))
            except ShapeError as error:
                raise ShapeError(f"op '{self.name}': output '{name}': {error}") from None
        return result

    def _user(self, which: str, *args: Any) -> Any:
        """Call the user's out_shape or out_dtype function; its own errors name the op."""
        try:
            return getattr(self, which)(*args)
        except OpforgeError:
            raise
        except Exception as error:
            raise InferenceError(f"op '{self.name}': {which} raised {type(error).__name__}: {error} "
                                 f"(called with {', '.join(map(str, args))})") from error

    def _output_dtypes(self, specs: Sequence[TensorSpec | None], wanted: Sequence[DTypeLike] | None) -> list[str]:
        """Each output's dtype, from the dtype_format row the input dtypes select:
        the kernel writes what that row says, so out_dtype must agree with it
        (None takes the row's).  Without a row, out_dtype, else the first input's."""
        n_in, n_out = len(specs), len(self.outputs)
        given = [None if s is None else s.dtype for s in specs]
        rows = [row for row in self._rows if all(w is None or g is None or w == g for w, g in zip(row, given))]
        fallback = next((d for d in given if d is not None), "float32")
        # A None entry (or out_dtype=None) leaves that output's dtype to the row.
        wanted = [None if d is None else _dtypes.normalize(d) for d in (wanted or [None] * n_out)]
        if not rows:
            return [d or fallback for d in wanted]
        row_outputs = [(list(row[n_in:]) + [None] * n_out)[:n_out] for row in rows]
        for outputs in row_outputs:
            if all(r is None or w is None or r == w for r, w in zip(outputs, wanted)):
                return [w or r or fallback for r, w in zip(outputs, wanted)]
        index = next(k for k, (r, w) in enumerate(zip(row_outputs[0], wanted))
                     if r is not None and w is not None and r != w)
        names = [self.input_name(k) for k in range(n_in)] + list(self.outputs)
        described = ", ".join(f"{n}={d or 'any'}" for n, d in zip(names, rows[0]))
        raise DTypeError(f"op '{self.name}': output '{self.outputs[index]}' is {wanted[index]} by out_dtype, but the "
                         f"dtype_format row ({described}) selected by the input dtypes gives "
                         f"{row_outputs[0][index]}; the kernel writes what the row says")


def _parameter_count(fn: object) -> int | None:
    """How many tensors a callable ``out_shape`` takes, when its signature fixes it."""
    if not callable(fn):
        return None
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind not in positional or p.default is not p.empty for p in parameters):
        return None
    return len(parameters)
