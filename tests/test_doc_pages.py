"""Every page under docs/ runs: each ```python block in a fresh interpreter prints what the page says.

How a page's blocks are run (README.md has its own test, tests/test_readme.py):

* Each ```python block runs in a new ``python -c``, in a folder of the page's own.
* A block in another language whose first line is a comment naming a file (``// scale.cc``,
  ``# ops.yaml``) is written into that folder first, so the page's Python can build or load it.
* A ``print(...)`` line ending in ``# text`` documents its output: the block's last printed lines
  are those texts, in order.
* A block whose first line is ``# needs: cuda`` runs only where a CUDA device is present (else it is
  skipped with the reason); one that also imports torch needs a torch built with CUDA, one that
  imports CuPy needs CuPy, one that calls ``opforge.build`` needs nvcc.  Other names after
  ``needs:`` are modules to import (``# needs: mindspore``) or ``nvcc``.  Skipped blocks must
  still compile.
* ```bash, ```text, ```cpp and the other languages are not run.
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opforge.runtime import cuda

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
FILE_NAME = re.compile(r"^(?://|#)\s*([\w.-]+\.\w+)\s*$")  # "// scale.cu", "# ops.yaml"


def blocks(page):
    return FENCE.findall((DOCS / page).read_text())


PYTHON = [(page, code) for page in PAGES for lang, code in blocks(page) if lang == "python"]


def files_of(page):
    """{file name: text} for the non-Python blocks whose first line names a file."""
    found = {}
    for lang, code in blocks(page):
        first = FILE_NAME.match(code.splitlines()[0]) if lang != "python" and code.strip() else None
        if first:
            found[first.group(1)] = code
    return found


def requirements(code):
    """What a block needs, from its first line (``# needs: cuda, cupy``)."""
    first = code.splitlines()[0] if code.strip() else ""
    if first.startswith("# needs:"):
        needs = re.findall(r"[\w.-]+", first[len("# needs:"):].split("(")[0])
    elif first.startswith("# needs a GPU"):  # docs/gpu.md's wording, the same as "# needs: cuda"
        needs = ["cuda"]
    else:
        return []
    if "cuda" in needs:  # what a GPU block uses, read from its code
        if re.search(r"^(import|from) torch\b", code, re.M):
            needs.append("torch-cuda")
        if re.search(r"^(import|from) cupy\b", code, re.M) and "cupy" not in needs:
            needs.append("cupy")
        if "opforge.build(" in code and "nvcc" not in needs:
            needs.append("nvcc")
    return needs


def missing(need):
    """Why ``need`` is not met here, or None."""
    if need == "cuda":
        return None if cuda.device_count() > 0 else "no CUDA device (opforge.cuda.device_count() == 0)"
    if need == "nvcc":
        return None if shutil.which("nvcc") else "nvcc not found"
    if need == "torch-cuda":
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed"
        import torch

        return None if torch.cuda.is_available() else "this torch has no CUDA (a CPU build)"
    return None if importlib.util.find_spec(need) is not None else f"{need} is not installed"


@pytest.fixture(scope="module")
def page_folders(tmp_path_factory):
    made = {}

    def folder(page):
        if page not in made:
            made[page] = tmp_path_factory.mktemp(re.sub(r"\W", "-", page))
            for name, text in files_of(page).items():
                (made[page] / name).write_text(text)
        return made[page]

    return folder


def test_pages_hold_python_blocks():
    pages = {page for page, _ in PYTHON}
    assert {"index.md", "torch.md", "jax.md", "gpu.md", "onnx.md", "reference/errors.md"} <= pages


@pytest.mark.parametrize("page, code", PYTHON, ids=[f"{page}-{k}" for k, (page, _) in enumerate(PYTHON)])
def test_block_runs_and_prints_what_the_page_says(page_folders, page, code):
    compile(code, f"docs/{page}", "exec")  # even a block skipped here is Python
    for need in requirements(code):
        reason = missing(need)
        if reason:
            pytest.skip(f"docs/{page} block needs {need}: {reason}")
    needs = requirements(code)
    # A block that needs no GPU shows the host path: JAX would put its arrays on a GPU where it has one.
    env = os.environ if "cuda" in needs else {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], cwd=page_folders(page), capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, f"docs/{page} python block failed:\n{code}\n{done.stderr[-3000:]}"
    documented = [line.split("#", 1)[1].strip() for line in code.splitlines()
                  if line.startswith("print(") and "#" in line]
    if documented:
        printed = done.stdout.strip().splitlines()
        assert printed[-len(documented):] == documented, f"docs/{page} block printed:\n{done.stdout}"


def test_requirements_are_read_from_the_first_line():
    assert requirements("# needs: cuda\nimport torch\n") == ["cuda", "torch-cuda"]
    assert requirements("# needs: cuda, cupy (and a GPU)\nimport cupy\n") == ["cuda", "cupy"]
    assert requirements("# needs a GPU (and CuPy)\nimport cupy\n") == ["cuda", "cupy"]
    assert requirements('# needs: cuda\nopforge.build("scale.cu")\n') == ["cuda", "nvcc"]
    assert requirements("import numpy\n# needs: cuda\n") == []
    assert missing("no_such_module_for_docs") == "no_such_module_for_docs is not installed"


def test_file_blocks_are_named_by_their_first_line():
    files = files_of("gpu.md")
    assert "scale.cu" in files and files["scale.cu"].startswith("// scale.cu")
