"""Small helpers for the chapter notebooks (not needed to use the model code).

Introduced in the chapter "Where the norm goes".
"""

from __future__ import annotations

from ._checks import check_instance


def glue(name: str, value, display: bool = True) -> None:
    """Store ``value`` under ``name`` for the book's prose, or just show it outside the build.

    Inside the book build this is ``myst_nb.glue``: the value's displayed form is
    saved in the cell's output so that ``{glue:text}`name``` in the chapter's
    prose prints the number this run computed. Where ``myst_nb`` is not installed
    (Google Colab, a bare Jupyter) it shows the value when ``display`` is true and
    otherwise does nothing, so a chapter runs unchanged everywhere.

    Args:
        name: the key the prose refers to (unique within the book).
        value: any object with a display form (a number, a figure, a DataFrame).
        display: whether to also show the value in the cell's output.

    Raises:
        TypeError: if ``name`` is not a string.
    """
    check_instance("name", name, str, "a str")
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display:
            from IPython.display import display as show

            show(value)
        return
    myst_glue(name, value, display)
