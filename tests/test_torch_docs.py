"""docs/torch.md's Python blocks run, and print what the page says they print."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "torch.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


def test_the_page_has_blocks():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs_and_prints_what_the_page_says(tmp_path, index):
    code = BLOCKS[index]
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"docs/torch.md python block {index} failed:\n{code}\n{done.stderr[-3000:]}"
    documented = [line.split("#", 1)[1].strip() for line in code.splitlines()
                  if line.startswith("print(") and "#" in line]
    if documented:
        assert done.stdout.strip().splitlines()[-len(documented):] == documented
