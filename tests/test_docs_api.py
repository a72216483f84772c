"""docs/api.md's examples run as written (CPU, a few seconds): every ```python block, in order, in one namespace."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import markdown_python_blocks, run_markdown_python_blocks

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


@pytest.mark.usefixtures("one_thread")
def test_every_python_block_of_the_api_page_runs():
    namespace = run_markdown_python_blocks(API_PAGE)
    assert namespace["result"].passed  # the first example's check_equivariance


def test_the_first_example_stays_short():
    """The README reuses it: a plain-PyTorch loop step and the check, about 15 lines of code."""
    _, first = markdown_python_blocks(API_PAGE)[0]
    code = [line for line in first.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(code) <= 20, len(code)


def test_a_failing_block_names_the_file_and_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# title\n\n```python\nx = 1\n```\n\ntext\n\n```python\nassert x == 2\n```\n\n```bash\nexit 1\n```\n")
    with pytest.raises(AssertionError) as failure:
        run_markdown_python_blocks(page)
    frame = failure.traceback[-1]
    assert Path(str(frame.path)) == page and frame.lineno + 1 == 10  # pytest's lineno is 0-based
    assert [line for line, _ in markdown_python_blocks(page)] == [4, 10]
    empty = tmp_path / "empty.md"
    empty.write_text("no code\n")
    with pytest.raises(AssertionError, match="no ```python block"):
        run_markdown_python_blocks(empty)
