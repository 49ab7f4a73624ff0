"""Imports point down: core -> runtime -> graph -> frontends (docs/architecture.md)."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "opforge"
LAYERS = {
    "core": ["errors", "dtypes", "spec", "attrs", "schema", "operator", "registry", "infer"],
    "runtime": ["runtime"],
    "graph": ["graph", "testing"],
}
ABOVE = {
    "core": {"runtime", "graph", "testing", "ops", "builtins", "frontends", "compat", "cli", "onnx", "torch"},
    "runtime": {"graph", "testing", "ops", "builtins", "frontends", "compat", "cli", "onnx", "torch"},
    "graph": {"ops", "builtins", "frontends", "compat", "cli", "onnx", "torch"},
}


def imported_modules(path):
    """First component below opforge of every module a file imports (at any depth)."""
    tree = ast.parse(path.read_text())
    package_depth = len(path.relative_to(PACKAGE).parts) - 1
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] == "opforge":
                    yield parts[1] if len(parts) > 1 else (node.names[0].name)
            elif node.level - 1 >= package_depth:  # relative import reaching the package root
                module = node.module or node.names[0].name
                yield module.split(".")[0]
            else:
                yield path.relative_to(PACKAGE).parts[0]


@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_imports_nothing_above_it(layer):
    offenders = []
    for name in LAYERS[layer]:
        files = [PACKAGE / f"{name}.py"] if (PACKAGE / f"{name}.py").exists() else \
            sorted((PACKAGE / name).rglob("*.py"))
        for path in files:
            for module in imported_modules(path):
                if module in ABOVE[layer]:
                    offenders.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert offenders == []
