"""The Python blocks of the framework pages (docs/torch.md, docs/jax.md) run, and print
what the page says they print (a print line ending in a comment documents its output)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = ["torch.md", "jax.md"]
BLOCKS = [(page, code) for page in PAGES for code in re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)]


def test_each_page_has_blocks():
    assert {page for page, _ in BLOCKS} == set(PAGES)


@pytest.mark.parametrize("page, code", BLOCKS, ids=[f"{page}-{k}" for k, (page, _) in enumerate(BLOCKS)])
def test_block_runs_and_prints_what_the_page_says(tmp_path, page, code):
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"docs/{page} python block failed:\n{code}\n{done.stderr[-3000:]}"
    documented = [line.split("#", 1)[1].strip() for line in code.splitlines()
                  if line.startswith("print(") and "#" in line]
    if documented:
        assert done.stdout.strip().splitlines()[-len(documented):] == documented
