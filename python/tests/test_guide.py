"""The Python code blocks of docs/guide/13-python.md, run as written."""

import pathlib
import re

import pytest

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide" / "13-python.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


def test_the_chapter_has_code():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_guide_block_runs(code):
    if "torch" in code:
        pytest.importorskip("torch")
    exec(compile(code, str(GUIDE), "exec"), {})
