"""Ops declared in YAML/JSON files (opforge.load_ops): modules beside the file, typed errors."""
import json
import sys

import numpy as np
import pytest

import opforge
from opforge.errors import SchemaError

HELPERS = """\
import numpy as np

def infer(x):
    return x

def triple(x):
    return x * np.asarray(3, x.dtype)
"""


def declarations(tmp_path, module, *, infer=None, kernel=None, extra_op_keys=None):
    """An ops.yaml in its own folder, with ``module``.py beside it; returns its path."""
    folder = tmp_path / "decl"
    folder.mkdir(exist_ok=True)
    (folder / f"{module}.py").write_text(HELPERS)
    entry = {"schema": f"decl_test::{module}(Tensor x) -> Tensor y",
             "infer": infer or f"{module}:infer",
             "kernels": [kernel or {"python": f"{module}:triple", "reference": True, "fallback": True}]}
    entry.update(extra_op_keys or {})
    path = folder / "ops.json"
    path.write_text(json.dumps({"ops": [entry]}))
    return path


def load_expecting_error(path, *words):
    name = json.loads(path.read_text())["ops"][0]["schema"].split("(")[0]
    with pytest.raises(SchemaError) as caught:
        opforge.load_ops(path)
    assert opforge.registry.lookup(name) is None  # nothing half-declared is left behind
    message = str(caught.value)
    assert str(path) in message
    for word in words:
        assert word in message, message
    return message


def test_modules_resolve_from_the_files_folder(tmp_path, monkeypatch, fresh):
    monkeypatch.chdir(tmp_path)  # not the declarations' folder
    path = declarations(tmp_path, "decl_beside_a")
    path_before = list(sys.path)
    (op,) = opforge.load_ops(path)
    fresh.append(op.name)
    assert sys.path == path_before  # the folder was searched, not left on sys.path
    assert op.infer(opforge.TensorSpec([2], "float32")) == opforge.TensorSpec([2], "float32")
    np.testing.assert_array_equal(opforge.ops.decl_test.decl_beside_a(np.ones(2, np.float32)), [3, 3])


def test_yaml_and_json_declare_the_same(tmp_path, fresh):
    path = declarations(tmp_path, "decl_beside_b")
    yaml = pytest.importorskip("yaml")
    yaml_path = path.with_suffix(".yaml")
    yaml_path.write_text(yaml.safe_dump(json.loads(path.read_text())))
    (op,) = opforge.load_ops(yaml_path)
    fresh.append(op.name)
    assert [k.name for k in op.kernels] == ["triple"]


def test_missing_module_names_file_op_and_module(tmp_path):
    path = declarations(tmp_path, "decl_missing", infer="decl_no_such_module:infer")
    load_expecting_error(path, "op 'decl_test::decl_missing'", "'decl_no_such_module'", str(path.parent))


def test_missing_function_and_failing_module(tmp_path):
    path = declarations(tmp_path, "decl_nofn", kernel={"python": "decl_nofn:absent"})
    load_expecting_error(path, "module 'decl_nofn' has no 'absent'")
    path = declarations(tmp_path, "decl_other", kernel={"python": "decl_raises:f"})
    (tmp_path / "decl" / "decl_raises.py").write_text("raise RuntimeError('broken on import')\n")
    load_expecting_error(path, "'decl_raises'", "RuntimeError", "broken on import")


@pytest.mark.parametrize("change, words", [
    ({"infer": "same"}, ["infer must be one of same_as, broadcast, reduce"]),
    ({"kernel": {"python": "decl_keys:triple", "dtype": ["float32"]}}, ["unknown kernel key(s) ['dtype']"]),
    ({"kernel": {"reference": True}}, ["a kernel needs 'source' or 'python'"]),
    ({"kernel": "decl_keys:triple"}, ["each kernel is a mapping"]),
    ({"infer": "decl_keys"}, ["infer must be one of"]),
])
def test_malformed_entries(tmp_path, change, words):
    path = declarations(tmp_path, "decl_keys", **change)
    load_expecting_error(path, "op 'decl_test::decl_keys'", *words)


def test_unreadable_files(tmp_path):
    with pytest.raises(SchemaError, match="cannot read op declarations .*absent.yaml"):
        opforge.load_ops(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.json"
    broken.write_text("{ops: [")
    with pytest.raises(SchemaError, match="broken.json: not valid JSON"):
        opforge.load_ops(broken)
    pytest.importorskip("yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("ops:\n  - schema: [unclosed\n")
    with pytest.raises(SchemaError, match="broken.yaml: not valid YAML"):
        opforge.load_ops(broken)
