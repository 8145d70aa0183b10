"""What the book's code prints fits its page: at most 88 characters a line.

The HTML book's column shows about 88 characters of a cell's output, as of its code
(``test_code_width.py``); a longer printed line scrolls sideways, and its end is out of
sight. Checked on the executed notebooks of the built book (``html.parent /
"jupyter_execute"``): every line a code cell prints (its ``stdout`` and ``stderr``
streams) and every result shown as plain text only (a value at the end of a cell, a
``display`` of one). Not checked: outputs the book renders otherwise (Markdown, HTML
tables, figures); cells whose output the HTML book removes (:data:`REMOVED_TAGS`); and
error outputs, tracebacks in Python's own layout, which the book never shows: a cell that
raises fails the build (``raise_on_error`` in ``_config.yml``). An error message that a
cell catches and prints on purpose is a printed line, and checked.

Nothing is exempt: a line that does not fit is split where its meaning allows (one fact a
line, a long list or dict wrapped with ``textwrap`` or printed an item a line), never
fitted by cutting what it says.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

# The html fixture (conftest.py) builds the book once.
from test_code_width import WIDTH  # the same width as the code's

#: Tags that remove a cell's output from the HTML book (Jupyter Book 1.x).
REMOVED_TAGS = {"remove-output", "remove-cell"}


def printed_text(output) -> str:
    """What ``output`` prints as plain text in the book, or "" when it renders otherwise."""
    if output.output_type == "stream":
        return output.text
    plain_only = set(output.get("data", {})) == {"text/plain"}
    if output.output_type in ("execute_result", "display_data") and plain_only:
        return output.data["text/plain"]
    return ""


def wide_outputs(executed: Path) -> dict[tuple[str, int], list[str]]:
    """``{(page, cell index): [its printed lines wider than WIDTH]}`` over the executed
    notebooks under ``executed`` (a built book's ``jupyter_execute`` folder)."""
    found = {}
    for path in sorted(executed.rglob("*.ipynb")):
        page = path.relative_to(executed).with_suffix("").as_posix()
        for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type != "code" or REMOVED_TAGS & set(cell.metadata.get("tags", [])):
                continue
            wide = [line for output in cell.get("outputs", [])
                    for line in printed_text(output).splitlines() if len(line) > WIDTH]
            if wide:
                found[(page, index)] = wide
    return found


def test_wide_outputs_finds_the_printed_lines_only(tmp_path):
    wide, fits = "x" * (WIDTH + 1), "x" * WIDTH
    shown = new_code_cell("", outputs=[
        new_output("stream", name="stdout", text=f"{fits}\n{wide}\n"),
        new_output("execute_result", {"text/plain": wide}, execution_count=1),
        new_output("display_data", {"text/html": wide, "text/plain": wide}),
        new_output("error", ename="ValueError", evalue=wide, traceback=[wide])])
    removed = new_code_cell("", metadata={"tags": ["remove-output"]},
                            outputs=[new_output("stream", name="stdout", text=wide)])
    (tmp_path / "chapters").mkdir()
    nbformat.write(new_notebook(cells=[shown, removed]), tmp_path / "chapters" / "page.ipynb")
    assert wide_outputs(tmp_path) == {("chapters/page", 0): [wide, wide]}


@pytest.mark.slow
def test_printed_output_fits_the_page(html):
    wide = wide_outputs(html.parent / "jupyter_execute")
    assert not wide, "printed output lines over %d characters (split them):\n%s" % (
        WIDTH, "\n".join(f"{page}, cell {index}: {line}"
                         for (page, index), lines in wide.items() for line in lines))
