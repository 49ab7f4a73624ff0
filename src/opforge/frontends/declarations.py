"""``load_ops(path)``: ops declared in a YAML (or JSON) file.

    ops:
      - schema: "mylib::scale(Tensor x, *, float factor=2.0) -> Tensor y"
        doc: Multiply by a constant.
        traits: [no_side_effect]
        infer: same_as            # same_as | broadcast | reduce | "package.module:function"
        kernels:
          - source: scale.cc:Scale          # relative to this file
            dtypes: {x: [float32, float64]}
            isa: avx2                       # optional
          - python: "mypackage.kernels:scale_numpy"
            reference: true

YAML needs PyYAML (``pip install opforge[yaml]``); JSON needs nothing.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path

from .. import infer as infer_helpers
from ..errors import SchemaError
from ..registry import op as declare

_INFER_RULES = {"same_as": infer_helpers.same_as, "broadcast": infer_helpers.broadcast,
                "reduce": infer_helpers.reduce}


def _import(reference, where):
    module, _, name = str(reference).partition(":")
    if not name:
        raise SchemaError(f"{where}: expected 'package.module:function', got {reference!r}")
    return getattr(importlib.import_module(module), name)


def _read(path: Path):
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    try:
        import yaml
    except ImportError:
        raise SchemaError(f"{path}: reading YAML needs PyYAML (pip install 'opforge[yaml]'); "
                          "or write the declarations as JSON") from None
    return yaml.safe_load(text)


def load_ops(path, *, replace=False):
    """Declare every op in the file; returns them in file order."""
    path = Path(path)
    document = _read(path)
    entries = document.get("ops") if isinstance(document, dict) else document
    if not isinstance(entries, list):
        raise SchemaError(f"{path}: expected a list of ops (or a mapping with key 'ops')")
    ops = []
    for index, entry in enumerate(entries):
        where = f"{path}: op #{index + 1}"
        if not isinstance(entry, dict) or "schema" not in entry:
            raise SchemaError(f"{where}: each op needs a 'schema'")
        unknown = set(entry) - {"schema", "doc", "traits", "infer", "kernels", "name"}
        if unknown:
            raise SchemaError(f"{where}: unknown key(s) {sorted(unknown)}")
        new = declare(entry["schema"], traits=entry.get("traits", ()), doc=entry.get("doc"), replace=replace)
        rule = entry.get("infer")
        if rule is not None:
            new.def_infer(_INFER_RULES[rule]() if rule in _INFER_RULES else _import(rule, where))
        for kernel in entry.get("kernels", ()):
            options = {k: kernel[k] for k in ("device", "dtypes", "isa", "layout", "cflags", "include_dirs", "name")
                       if k in kernel}
            if "python" in kernel:
                new.kernel(_import(kernel["python"], where), reference=kernel.get("reference", False), **{
                    k: v for k, v in options.items() if k in ("device", "dtypes", "isa", "layout", "name")})
            elif "source" in kernel:
                file, _, function = str(kernel["source"]).rpartition(":")
                new.kernel(source=str((path.parent / file).resolve()) + ":" + function, **options)
            else:
                raise SchemaError(f"{where}: a kernel needs 'source' or 'python'")
        ops.append(new)
    return ops
