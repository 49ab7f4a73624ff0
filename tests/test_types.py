"""The package's type hints: mypy passes with the project's configuration ([tool.mypy] in pyproject.toml), and
what type checkers see as opforge's public names matches what it exports."""
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import opforge
from opforge import errors

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_passes(tmp_path):
    pytest.importorskip("mypy", reason="the type check needs mypy (pip install '.[test]')")
    if not (ROOT / "src" / "opforge").is_dir():
        pytest.skip("the type check runs on a source checkout")
    # A fresh cache in tmp_path: no state shared with other runs; a cold check takes some seconds.
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "mypy"), "--no-color-output"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mypy found problems:\n{done.stdout}{done.stderr}"
    assert "Success" in done.stdout


def test_package_is_marked_typed():
    package = Path(opforge.__file__).parent
    assert (package / "py.typed").is_file()
    assert (package / "_native.pyi").is_file()  # types of the C extension


def test_public_names_exist():
    missing = [name for name in opforge.__all__ if not hasattr(opforge, name)]
    assert not missing
    assert len(set(opforge.__all__)) == len(opforge.__all__)


def test_every_error_class_is_exported():
    classes = {name for name, value in vars(errors).items()
               if inspect.isclass(value) and issubclass(value, errors.OpforgeError)}
    assert classes == set(errors.__all__)
    assert classes <= set(opforge.__all__)
    assert all(getattr(opforge, name) is getattr(errors, name) for name in classes)
