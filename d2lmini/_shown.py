"""A marker for the code the book prints, so that it stays printable.

Chapters print package source with ``inspect.getsource``. Every function, method or
class they print carries ``@shown_in("chNN", ...)`` at its definition, naming the
chapters that print it (a page outside the numbered chapters is named by its file,
e.g. ``"zoo"`` for the appendix ``chapters/zoo.ipynb``); ``tests/test_shown.py`` reads the notebooks and checks both
ways: each printed object is marked with its chapter, and each marked object is
printed by the chapters it names, in 5 to 40 lines. Renaming or growing printed code
without its chapter then fails a test instead of a book build.
"""

from __future__ import annotations

from ._checks import check_choice

#: The pages that can print code: the chapters ``'ch01'`` to ``'ch10'`` and the appendix
#: ``'zoo'`` (the block zoo, ``chapters/zoo.ipynb``).
CHAPTERS = tuple(f"ch{k:02d}" for k in range(1, 11)) + ("zoo",)

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
