"""The README's code runs: its C++ kernel is compiled and every Python block executed."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README.read_text(), re.S)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readme")
    (cpp,) = [code for lang, code in BLOCKS if lang == "cpp"]
    (folder / "scale.cc").write_text(cpp)
    for code in (code for lang, code in BLOCKS if lang == "yaml"):  # a file named by its first line: "# ops.yaml"
        (folder / code.split()[1]).write_text(code)
    return folder


def test_the_readme_opens_with_the_two_commands():
    lines = [code for lang, code in BLOCKS if lang == "bash"][0].strip().splitlines()
    assert lines == ['pip install . && python examples/seed_add_reduce.py',
                     'pip install ".[test]" && python -m pytest']


@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_python_block_runs(workdir, index):
    done = subprocess.run([sys.executable, "-c", PYTHON[index]], cwd=workdir, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"README python block {index} failed:\n{PYTHON[index]}\n{done.stderr[-3000:]}"
    # A print whose line ends in a comment documents its output: hold the README to it.
    documented = [line.split("#", 1)[1].strip() for line in PYTHON[index].splitlines()
                  if line.startswith("print(") and "#" in line]
    printed = done.stdout.strip().splitlines()
    if documented:
        assert printed == documented


def test_the_readme_lists_every_builtin_op():
    """The README's list of built-in ops names each op opforge.ops holds (gradient ops by example only)."""
    text = README.read_text()
    bullet = text[text.index("- Built-in ops, one file each"):]
    bullet = bullet[:bullet.index("\n- ")]
    listed = {word for span in re.findall(r"`([^`]*)`", bullet) for word in span.split()}
    # In a fresh interpreter: ops other tests register in this process are not built-ins.
    script = "import opforge; print(*(op.name for op in opforge.registered_ops()))"
    names = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           timeout=300).stdout.split()
    builtins = {name for name in names if "::" not in name and not name.endswith("_grad") and not name.startswith("_")}
    assert len(builtins) > 50 and sorted(builtins - listed) == []
