"""The documentation site builds with warnings as errors, and its reference pages keep up with the code.

The site is MkDocs with mkdocstrings (``mkdocs.yml``; ``pip install -e ".[docs]" && mkdocs serve``).
The blocks of every page run in tests/test_doc_pages.py.
"""
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import opforge

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ERRORS_PAGE = DOCS / "reference" / "errors.md"
API_PAGE = DOCS / "reference" / "api.md"
# Modules that define error classes of their own, besides opforge.errors.
ERROR_MODULES = ["opforge.errors", "opforge.testing", "opforge.cli", "opforge.onnx", "opforge.runtime.cuda_graph"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip('mkdocs and mkdocstrings are not installed (pip install -e ".[docs]")')
    folder = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(folder)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    return done, folder


def test_the_site_builds_strict_without_a_warning(site):
    done, folder = site
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-5000:]}"
    assert "WARNING" not in done.stderr, done.stderr
    assert (folder / "index.html").is_file()


def test_the_api_page_renders_the_public_names(site):
    done, folder = site
    assert done.returncode == 0
    html = (folder / "reference" / "api" / "index.html").read_text()
    for name in ["opforge.op", "opforge.Op", "opforge.TensorSpec", "opforge.trace", "opforge.onnx.load",
                 "check_op", "gradcheck", "set_num_threads", "register_all", "same_as", "signatures"]:
        assert name in html, f"{name} is missing from the rendered API reference"


def test_the_ops_page_lists_every_built_in_op(site):
    done, folder = site
    assert done.returncode == 0
    html = (folder / "reference" / "ops" / "index.html").read_text()
    package = str(Path(opforge.__file__).resolve().parent)
    built_in = [op for op in opforge.registered_ops() if str(getattr(op, "defined_at", "")).startswith(package)]
    assert len(built_in) > 40
    for op in built_in:
        assert f'id="{op.name}"' in html, f"built-in op {op.name} is missing from the ops page"
    assert f"{len(built_in)} ops." in html


def _error_classes():
    found = {}
    for module in ERROR_MODULES:
        for value in vars(importlib.import_module(module)).values():
            if inspect.isclass(value) and issubclass(value, opforge.OpforgeError):
                found[value.__name__] = value
    return found


def test_every_error_class_has_a_section_on_the_errors_page():
    text = ERRORS_PAGE.read_text()
    sections = set(re.findall(r"^### `(\w+)`$", text, re.M))
    classes = _error_classes()
    assert set(vars(opforge.errors)) & set(classes) >= {"OpforgeError", "ShapeError", "UnsupportedOpError"}
    undocumented = sorted(set(classes) - sections)
    assert not undocumented, f"docs/reference/errors.md has no section for {undocumented}"
    stale = sorted(sections - set(classes))
    assert not stale, f"docs/reference/errors.md documents classes that do not exist: {stale}"
    for name, cls in classes.items():  # the hierarchy drawn at the top names each class's built-in bases
        builtin = [b.__name__ for b in cls.__bases__ if b.__module__ == "builtins"]
        if builtin:
            assert f"{name} [{builtin[0]}]" in text, f"the hierarchy on the errors page misdraws {name}"


def test_every_public_name_of_opforge_is_in_the_api_reference():
    text = API_PAGE.read_text()
    documented = set(re.findall(r"^::: ([\w.]+)", text, re.M))
    headings = set(re.findall(r"^      heading: ([\w.]+)", text, re.M))
    errors = set(_error_classes())
    missing = []
    for name, value in vars(opforge).items():
        if name.startswith("_") or name in errors or inspect.ismodule(value):
            continue
        if not (getattr(value, "__module__", "") or "").startswith("opforge") and not name.isupper():
            continue  # typing names a star-import brought along, not opforge's own
        if f"opforge.{name}" not in documented | headings:
            missing.append(name)
    assert not missing, f"docs/reference/api.md has no ':::' entry for opforge.{missing}"
