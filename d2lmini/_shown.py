"""A marker for the code the book prints, so that it stays printable, and the printer.

Chapters print package source with :func:`show_code`, which leaves out docstrings. Every
function, method or class they print carries ``@shown_in("chNN", ...)`` at its definition,
naming the chapters that print it (a page outside the numbered chapters is named by its file,
e.g. ``"zoo"`` for the appendix ``chapters/zoo.ipynb``); ``tests/test_shown.py`` reads the
notebooks and checks both ways: each printed object is marked with its chapter, and each
marked object is printed by the chapters it names, in at most 25 lines. Renaming or growing
printed code without its chapter then fails a test instead of a book build.
"""

from __future__ import annotations

from ._checks import check_choice

#: The pages that can print code: the chapters ``'ch01'`` to ``'ch11'`` and the appendix
#: ``'zoo'`` (the block zoo, ``chapters/zoo.ipynb``).
CHAPTERS = tuple(f"ch{k:02d}" for k in range(1, 12)) + ("zoo",)

#: Every marked object -> the chapters that print it, e.g. ``('ch02', 'ch04')``.
SHOWN: dict = {}


def shown_in(*chapters: str):
    """Decorator: mark a function, method or class as printed by ``chapters``.

    Records the object in :data:`SHOWN` and returns it unchanged (no wrapper, so its
    behaviour, signature and ``inspect.getsource`` stay those of the code below the
    marker; the source shown starts with the marker's line).

    Args:
        *chapters: one or more names from :data:`CHAPTERS`, e.g. ``"ch01"``.

    Raises:
        ValueError: if no chapter is given or a name is not in :data:`CHAPTERS`.
        TypeError: if a name is not a string.
    """
    if not chapters:
        raise ValueError(f"shown_in needs at least one chapter from {CHAPTERS}")
    for chapter in chapters:
        check_choice("chapter", chapter, CHAPTERS)

    def mark(obj):
        SHOWN[obj] = chapters
        return obj

    return mark


def source_without_docstrings(obj) -> str:
    """The source of ``obj`` as the book prints it: dedented, without docstrings or the marker.

    Takes :func:`inspect.getsource` of a function, method or class, removes the
    ``@shown_in(...)`` decorator line and every docstring in it (the function's own and,
    for a class, its methods'); comments and code stay as written.

    Args:
        obj: a function, method or class defined in a source file.

    Returns:
        The code as one string ending in a newline.

    Raises:
        TypeError: if ``obj`` has no Python source (a builtin, an object made at run time).
    """
    import ast
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(obj))
    except (TypeError, OSError) as error:
        raise TypeError(f"obj must be a function, method or class with Python source, got {obj!r}") from error
    lines = source.splitlines()
    drop = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("shown_in"):
                    drop.update(range(decorator.lineno - 2, decorator.end_lineno))  # the '@' line(s)
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                drop.update(range(body[0].lineno - 1, body[0].end_lineno))
    kept = [line for k, line in enumerate(lines) if k not in drop]
    return "\n".join(kept).rstrip("\n") + "\n"


def show_code(*objs):
    """Print the code of each object as the book shows it (:func:`source_without_docstrings`).

    The chapters call it to answer "how was this measured?" next to a result; the
    docstrings stay in the package and on the API page. Two listings are separated by a
    blank line.

    Args:
        *objs: functions, methods or classes, each marked ``@shown_in`` with the page
            that prints it (``tests/test_shown.py`` checks the marks and that each listing
            has at most 25 lines).

    Raises:
        ValueError: if no object is given.
        TypeError: if an object has no Python source.
    """
    if not objs:
        raise ValueError("show_code needs at least one function, method or class")
    print("\n".join(source_without_docstrings(obj) for obj in objs), end="")
