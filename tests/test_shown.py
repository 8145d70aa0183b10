"""The code the book prints stays printable.

Every chapter notebook that prints package source calls ``d2lmini.show_code(<expr>, ...)``
in a code cell, which prints the code without its docstrings. Each ``<expr>`` is resolved
against the notebook's own imports, and must be an object marked
``@shown_in(<that chapter>)`` (d2lmini/_shown.py); every marked object must be printed by
the chapters it names; and each listing is 3 to 25 lines, with no docstring left in it.
So renaming or growing a printed function without its chapter fails here, not in the
book build.
"""

from __future__ import annotations

import ast
import contextlib
import io

import nbformat
import pytest

import importlib
import pkgutil

import d2lmini

# Every module, so every marker is registered (``import d2lmini`` loads the chapter modules lazily).
for _module in pkgutil.walk_packages(d2lmini.__path__, "d2lmini."):
    importlib.import_module(_module.name)
from conftest import chapter_notebooks
from d2lmini._shown import SHOWN, source_without_docstrings


def _show_calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("d2lmini.show_code", "show_code") and node.args]


def _getsource_calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("getsource")]


def page_name(path) -> str:
    """The name ``@shown_in`` uses for a notebook: ``'ch04'`` for ``04_norm_placement.ipynb``,
    the file's stem for a page outside the numbered chapters (``'zoo'``)."""
    return f"ch{path.stem[:2]}" if path.stem[:2].isdigit() else path.stem


def printed_code() -> list[dict]:
    """One dict per object a chapter's ``show_code(<expr>, ...)`` prints.

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
            for call in _show_calls(tree):
                for arg in call.args:
                    expr = ast.unparse(arg)
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
    obj, where = shown["obj"], f"{shown['chapter']} prints show_code({shown['expr']})"
    assert obj is not None, f"{where}, which does not exist: rename it in the notebook too"
    assert obj in SHOWN, f"{where}, which is not marked: add @shown_in({shown['chapter']!r}) at its definition"
    assert shown["chapter"] in SHOWN[obj], f"{where}, but it is marked @shown_in{SHOWN[obj]}"


@pytest.mark.parametrize("obj", list(SHOWN), ids=[obj.__qualname__ for obj in SHOWN])
def test_marked_object_is_printed_by_the_chapters_it_names(obj):
    printed_by = {p["chapter"] for p in PRINTED if p["obj"] is obj}
    assert printed_by == set(SHOWN[obj]), (f"{obj.__module__}.{obj.__qualname__} is marked @shown_in{SHOWN[obj]} "
                                           f"but printed by {sorted(printed_by) or 'no chapter'}")


@pytest.mark.parametrize("shown", PRINTED, ids=[f"{p['chapter']}:{p['expr']}" for p in PRINTED])
def test_printed_listing_is_short_and_without_docstring(shown):
    text = source_without_docstrings(shown["obj"])
    lines = text.rstrip("\n").splitlines()
    assert 3 <= len(lines) <= 25, f"{shown['chapter']} prints {len(lines)} lines of {shown['expr']}"
    assert '"""' not in text and "shown_in(" not in text, f"{shown['expr']}: a docstring or the marker is printed"


def test_no_chapter_prints_source_another_way():
    for path in chapter_notebooks():
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                assert not _getsource_calls(ast.parse(cell.source)), f"{path.name}: use d2lmini.show_code"


def test_show_code_drops_docstrings_and_marker_and_refuses_bad_input():
    text = source_without_docstrings(d2lmini.RMSNorm)
    assert "class RMSNorm" in text and "def forward" in text and '"""' not in text
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        d2lmini.show_code(d2lmini.num_parameters)
    assert out.getvalue().startswith("def num_parameters") and "shown_in" not in out.getvalue()
    with pytest.raises(ValueError, match="at least one"):
        d2lmini.show_code()
    with pytest.raises(TypeError, match="obj must be"):
        source_without_docstrings(len)
