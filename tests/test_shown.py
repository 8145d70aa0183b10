"""The code the book prints stays printable.

Every chapter notebook that prints package source calls ``inspect.getsource(<expr>)`` in
a code cell. Each ``<expr>`` is resolved against the notebook's own imports, and must be
an object marked ``@shown_in(<that chapter>)`` (d2lmini/_shown.py); every marked object
must be printed by the chapters it names; and what a cell prints must be 5 to 40 lines.
So renaming or growing a printed function without its chapter fails here, not in the
book build.
"""

from __future__ import annotations

import ast
import contextlib
import io

import nbformat
import pytest

import d2lmini  # noqa: F401  (imports every module, so every marker is registered)
from conftest import chapter_notebooks
from d2lmini._shown import SHOWN


def _getsource_calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("inspect.getsource", "getsource") and node.args]


def page_name(path) -> str:
    """The name ``@shown_in`` uses for a notebook: ``'ch04'`` for ``04_norm_placement.ipynb``,
    the file's stem for a page outside the numbered chapters (``'zoo'``)."""
    return f"ch{path.stem[:2]}" if path.stem[:2].isdigit() else path.stem


def printed_code() -> list[dict]:
    """One dict per ``inspect.getsource(<expr>)`` in a chapter's code cells.

    Keys: ``chapter`` (``'ch01'``..., or ``'zoo'``: :func:`page_name`), ``expr``, ``cell`` (the cell's source), ``scope``
    (the namespace of the notebook's import statements) and ``obj`` (the object, or
    ``None`` if the expression does not resolve).
    """
    found = []
    for path in chapter_notebooks():
        cells = [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]
        trees = [ast.parse(source) for source in cells]
        scope: dict = {}
        for tree in trees:  # the notebook's own imports, top-level statements only
            imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
            exec(compile(ast.Module(imports, type_ignores=[]), str(path), "exec"), scope)
        for source, tree in zip(cells, trees):
            for call in _getsource_calls(tree):
                expr = ast.unparse(call.args[0])
                try:
                    obj = eval(expr, dict(scope))
                except AttributeError:
                    obj = None
                found.append(dict(chapter=page_name(path), expr=expr, cell=source, scope=scope, obj=obj))
    return found


PRINTED = printed_code()


def test_the_chapters_print_code():
    assert len(PRINTED) >= 8


@pytest.mark.parametrize("shown", PRINTED, ids=[f"{p['chapter']}:{p['expr']}" for p in PRINTED])
def test_printed_object_exists_and_is_marked_with_its_chapter(shown):
    obj, where = shown["obj"], f"{shown['chapter']} prints inspect.getsource({shown['expr']})"
    assert obj is not None, f"{where}, which does not exist: rename it in the notebook too"
    assert obj in SHOWN, f"{where}, which is not marked: add @shown_in({shown['chapter']!r}) at its definition"
    assert shown["chapter"] in SHOWN[obj], f"{where}, but it is marked @shown_in{SHOWN[obj]}"


@pytest.mark.parametrize("obj", list(SHOWN), ids=[obj.__qualname__ for obj in SHOWN])
def test_marked_object_is_printed_by_the_chapters_it_names(obj):
    printed_by = {p["chapter"] for p in PRINTED if p["obj"] is obj}
    assert printed_by == set(SHOWN[obj]), (f"{obj.__module__}.{obj.__qualname__} is marked @shown_in{SHOWN[obj]} "
                                           f"but printed by {sorted(printed_by) or 'no chapter'}")


#: Listings known to be too long, with what to do; strict, so the entry must go once it is fixed.
TOO_LONG = {}


@pytest.mark.parametrize("shown", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=TOO_LONG[f"{p['chapter']}:{p['expr']}"]))
    if f"{p['chapter']}:{p['expr']}" in TOO_LONG else p for p in PRINTED],
    ids=[f"{p['chapter']}:{p['expr']}" for p in PRINTED])
def test_printed_source_fits_on_a_page(shown):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(shown["cell"], dict(shown["scope"]))  # the cell prints the source, nothing else
    lines = out.getvalue().rstrip("\n").splitlines()
    assert 5 <= len(lines) <= 40, f"{shown['chapter']} prints {len(lines)} lines of {shown['expr']}"
