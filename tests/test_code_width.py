"""The code the book shows fits its page: at most 88 characters a line.

The HTML book's column shows about 88 characters of code; a longer line scrolls sideways,
and a comment at its end is out of sight. Two kinds of code are shown: the visible code
cells of every page in ``_toc.yml`` (chapters, the zoo, the solutions), and the listings
that ``d2lmini.show_code`` prints from the package (every object marked ``@shown_in``,
printed as ``source_without_docstrings`` prints it). A code cell is hidden, and not
checked, when a tag removes or folds its code in the HTML book (:data:`HIDDEN_TAGS`) and
Jupyter and Colab hide it too (``metadata.jupyter.source_hidden``); a folded cell that
Jupyter shows is checked.

Nothing is exempt: a line that does not fit is wrapped where its meaning allows (or its
comment moved above it), never fitted by cutting a comment the reader needs.
"""

from __future__ import annotations

import importlib
import pkgutil

import nbformat
import pytest

import d2lmini
from conftest import chapter_notebooks

# Every module, so every @shown_in marker is registered.
for _module in pkgutil.walk_packages(d2lmini.__path__, "d2lmini."):
    importlib.import_module(_module.name)
from d2lmini._shown import SHOWN, source_without_docstrings  # noqa: E402

WIDTH = 88

#: Tags that remove or fold a code cell's source in the HTML book (Jupyter Book 1.x).
HIDDEN_TAGS = {"remove-input", "remove-cell", "hide-input", "hide-cell"}

def _page(path) -> str:
    return f"solutions/{path.stem}" if path.parent.name == "solutions" else path.stem


def wide_cells() -> dict[tuple[str, str], list[str]]:
    """``{(page, cell id): [its lines wider than WIDTH]}`` over the visible code cells."""
    found = {}
    for path in chapter_notebooks():
        for cell in nbformat.read(path, as_version=4).cells:
            hidden_everywhere = HIDDEN_TAGS & set(cell.metadata.get("tags", [])) and (
                cell.metadata.get("jupyter", {}).get("source_hidden")
                or "remove-cell" in cell.metadata.get("tags", []))
            if cell.cell_type != "code" or hidden_everywhere:
                continue
            wide = [line for line in cell.source.splitlines() if len(line) > WIDTH]
            if wide:
                found[(_page(path), cell.get("id"))] = wide
    return found


def wide_listings() -> dict[str, list[str]]:
    """``{module.qualname: [its printed lines wider than WIDTH]}`` over the marked objects."""
    found = {}
    for obj in SHOWN:
        wide = [line for line in source_without_docstrings(obj).splitlines() if len(line) > WIDTH]
        if wide:
            found[f"{obj.__module__}.{obj.__qualname__}"] = wide
    return found


def test_visible_code_cells_fit_the_page():
    wide = wide_cells()
    assert not wide, "visible code lines over %d characters (wrap them):\n%s" % (WIDTH, "\n".join(
        f"{page}, cell {cell}: {line}" for (page, cell), lines in wide.items() for line in lines))


def test_printed_listings_fit_the_page():
    wide = wide_listings()
    assert not wide, "printed lines over %d characters (wrap them):\n%s" % (WIDTH, "\n".join(
        f"{name}: {line}" for name, lines in wide.items() for line in lines))


@pytest.mark.parametrize("tag", sorted(HIDDEN_TAGS))
def test_hidden_tags_are_tags_the_book_uses(tag):
    # A tag listed here must hide something somewhere, or it exempts nothing and hides a typo.
    tags = {t for path in chapter_notebooks() for cell in nbformat.read(path, as_version=4).cells
            for t in cell.metadata.get("tags", [])}
    assert tag in tags
