"""``load_ops(path)``: ops declared in a YAML (or JSON) file.

    ops:
      - schema: "mylib::scale(Tensor x, *, float factor=2.0) -> Tensor y"
        doc: Multiply by a constant.
        traits: [no_side_effect]
        infer: same_as            # same_as | broadcast | reduce | "module:function"
        check: "scale_rules:check"          # optional, as @op.check
        grad: {rule: "scale_rules:grad", save: [x]}   # optional, as @op.grad(save=...)
        sbp: [{x: "S(0)", y: "S(0)"}]       # optional, as @op.sbp: signatures, or "module:function"
        kernels:
          - source: scale.cc:Scale          # relative to this file
            dtypes: {x: [float32, float64]}
            isa: avx2                       # optional
          - python: "scale_kernels:scale_numpy"
            reference: true                 # the semantics kernels are checked against;
            fallback: true                  # also run for inputs no kernel takes

A ``"module:function"`` is imported from the file's own folder first, then
from ``sys.path``.  Every problem is a :class:`SchemaError` naming the file,
the op and what was expected.  YAML needs PyYAML (``pip install
opforge[yaml]``); JSON needs nothing.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import infer as infer_helpers
from .. import sbp
from ..errors import OpforgeError, SchemaError
from ..registry import op as declare
from ..registry import unregister
from ..spec import TensorSpec

if TYPE_CHECKING:
    from ..operator import Op

_INFER_RULES: dict[str, Callable[[], Callable[..., TensorSpec]]] = {
    "same_as": infer_helpers.same_as, "broadcast": infer_helpers.broadcast, "reduce": infer_helpers.reduce}
_OP_KEYS = {"schema", "doc", "traits", "infer", "check", "grad", "sbp", "kernels", "name"}
_SOURCE_OPTIONS = ("device", "dtypes", "isa", "layout", "cflags", "include_dirs", "name")
_PYTHON_OPTIONS = ("device", "dtypes", "isa", "layout", "name")
_KERNEL_KEYS = {"source", "python", "reference", "fallback", *_SOURCE_OPTIONS}


def _import(reference: object, folder: Path, where: str) -> Any:
    """``"module:function"``, the module looked up in ``folder`` first."""
    module_name, _, attribute = str(reference).partition(":")
    if not module_name or not attribute:
        raise SchemaError(f"{where}: expected 'module:function', got {reference!r}")
    search = str(folder)
    added = search not in sys.path
    if added:
        sys.path.insert(0, search)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SchemaError(f"{where}: cannot import module {module_name!r} (looked in {folder} and on "
                          f"sys.path): {exc}") from None
    except Exception as exc:  # the module itself failed while importing
        raise SchemaError(f"{where}: importing module {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    finally:
        if added:
            sys.path.remove(search)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise SchemaError(f"{where}: module {module_name!r} has no {attribute!r}") from None


def _read(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SchemaError(f"cannot read op declarations {path}: {exc.strerror or exc}") from None
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except ValueError as exc:
            raise SchemaError(f"{path}: not valid JSON: {exc}") from None
    try:
        import yaml
    except ImportError:
        raise SchemaError(f"{path}: reading YAML needs PyYAML (pip install 'opforge[yaml]'); "
                          "or write the declarations as JSON") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SchemaError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None


def _declare_kernel(new: Op, kernel: object, path: Path, where: str) -> None:
    if not isinstance(kernel, dict):
        raise SchemaError(f"{where}: each kernel is a mapping with 'source' or 'python', got {kernel!r}")
    unknown = set(kernel) - _KERNEL_KEYS
    if unknown:
        raise SchemaError(f"{where}: unknown kernel key(s) {sorted(unknown)}; expected some of "
                          f"{sorted(_KERNEL_KEYS)}")
    if "python" in kernel:
        function = _import(kernel["python"], path.resolve().parent, where)
        if kernel.get("reference"):
            new.reference(function, fallback=kernel.get("fallback", False), dtypes=kernel.get("dtypes"))
        else:
            new.kernel(function, **{k: kernel[k] for k in _PYTHON_OPTIONS if k in kernel})
    elif "source" in kernel:
        options = {k: kernel[k] for k in _SOURCE_OPTIONS if k in kernel}
        file, _, function = str(kernel["source"]).rpartition(":")
        new.kernel(source=str((path.parent / file).resolve()) + ":" + function, **options)
    else:
        raise SchemaError(f"{where}: a kernel needs 'source' or 'python'")


def _declare_rules(new: Op, entry: dict[str, Any], folder: Path, where: str) -> None:
    """The op's check, gradient rule and SBP signatures, each where the entry gives one."""
    if "check" in entry:
        new.check(_import(entry["check"], folder, where))
    grad = entry.get("grad")
    if grad is not None:
        if not isinstance(grad, dict) or "rule" not in grad or set(grad) - {"rule", "save"}:
            raise SchemaError(f"{where}: grad is {{rule: 'module:function', save: [names]}}, got {grad!r}")
        new.grad(_import(grad["rule"], folder, where), save=grad.get("save") or ())
    declared = entry.get("sbp")
    if isinstance(declared, str):
        new.sbp(_import(declared, folder, where))
    elif declared is not None:
        if not isinstance(declared, list) or not all(isinstance(row, dict) for row in declared):
            raise SchemaError(f"{where}: sbp is a list of signatures ({{name: 'S(0)' | 'B' | 'P'}}) or "
                              f"'module:function', got {declared!r}")
        new.sbp([{name: sbp.parse(value) for name, value in row.items()} for row in declared])


def _declare(entry: object, path: Path, index: int, replace: bool) -> Op:
    if not isinstance(entry, dict) or "schema" not in entry:
        raise SchemaError(f"{path}: op #{index + 1}: each op needs a 'schema'")
    where = f"{path}: op '{str(entry['schema']).split('(')[0].strip()}'"
    unknown = set(entry) - _OP_KEYS
    if unknown:
        raise SchemaError(f"{where}: unknown key(s) {sorted(unknown)}; expected some of {sorted(_OP_KEYS)}")
    new: Op | None = None
    try:
        new = declare(entry["schema"], traits=entry.get("traits", ()), doc=entry.get("doc"), replace=replace)
        new.defined_at = f"{path} (op #{index + 1})"
        rule = entry.get("infer")
        if rule is not None:
            if rule in _INFER_RULES:
                new.def_infer(_INFER_RULES[rule]())
            elif ":" in str(rule):
                new.def_infer(_import(rule, path.resolve().parent, where))
            else:
                raise SchemaError(f"{where}: infer must be one of {', '.join(_INFER_RULES)} or "
                                  f"'module:function', got {rule!r}")
        _declare_rules(new, entry, path.resolve().parent, where)
        for kernel in entry.get("kernels") or ():
            _declare_kernel(new, kernel, path, where)
    except (OpforgeError, TypeError, ValueError) as exc:
        if new is not None:
            unregister(new.name)  # no half-declared op: the fixed file loads again
        if isinstance(exc, SchemaError) and str(exc).startswith(where):
            raise
        raise SchemaError(f"{where}: {exc}") from exc
    return new


def load_ops(path: str | os.PathLike[str], *, replace: bool = False) -> list[Op]:
    """Declare every op in the file; returns them in file order."""
    if not isinstance(path, (str, os.PathLike)):
        raise SchemaError(f"load_ops() takes the path of a YAML or JSON file, got {path!r}")
    path = Path(path)
    document = _read(path)
    entries = document.get("ops") if isinstance(document, dict) else document
    if not isinstance(entries, list):
        raise SchemaError(f"{path}: expected a list of ops (or a mapping with key 'ops')")
    return [_declare(entry, path, index, replace) for index, entry in enumerate(entries)]
