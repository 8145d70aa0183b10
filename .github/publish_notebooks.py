"""Collect a build's executed notebooks, as Colab's launch buttons open them.

    python .github/publish_notebooks.py BUILD OUT

BUILD is a built book's ``_build`` folder; the build wrote every executed notebook to
``BUILD/jupyter_execute/<page>.ipynb``. For every notebook page of ``_toc.yml`` this writes
``OUT/<page>.ipynb``: the executed notebook, outputs in place, so that a reader who opens a
chapter in Colab sees its figures and numbers before running anything. Left out: the
widget state (``metadata.widgets``: the live explorers need a kernel, and a stale state
shows as a broken widget) and the per-cell execution timestamps. Each notebook is checked
against the nbformat schema, and one whose outputs hold a path of the building machine is
refused. The publishing workflow pushes OUT to the branch that ``_config.yml``'s
``repository.branch`` names, where the launch buttons point.

Exits non-zero, naming the notebook, when a page's executed notebook is missing or invalid.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]

README = """# The executed notebooks of *The Transformer Block*

Made by the publishing workflow from `main` at {commit}: each chapter as the book's build
ran it, with its outputs. The launch buttons of the book open these in Colab; the first
cell of each installs `d2lmini` from `main`. Edit the chapters on `main`, not here.
"""


def notebook_pages(root: Path = ROOT) -> list[str]:
    """The pages of ``_toc.yml`` (root, parts, chapters, sections) whose source is a notebook."""
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    pages = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                pages.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [page for page in pages if (root / f"{page}.ipynb").exists()]


def clean(nb) -> None:
    """Drop what only the build's kernel could use: the widget state and the cells' execution timestamps."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)


def machine_folders(root: Path = ROOT) -> list[str]:
    """Folders of the building machine that must not appear in a published output: the checkout,
    the home folder, the Python installation and the temporary folder (the root ``/`` is left out)."""
    import sysconfig
    import tempfile

    folders = {str(root), str(Path.home()), sys.prefix, sys.base_prefix, tempfile.gettempdir(),
               *sysconfig.get_paths().values()}
    return sorted(folder for folder in folders if folder and len(Path(folder).parts) > 1)


def _strings(value):
    """Every string inside an output (its text, each MIME type's data, tracebacks)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def machine_paths(nb, folders) -> list[str]:
    """The outputs of ``nb`` that mention one of ``folders`` (of the building machine)."""
    patterns = [(folder, re.compile(re.escape(folder) + r"(?![\w.-])")) for folder in folders]
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            for text in _strings(output):
                found += [f"cell {index}: {folder}" for folder, pattern in patterns if pattern.search(text)]
    return found


def publish(build: Path, out: Path, root: Path = ROOT, commit: str = "HEAD") -> list[Path]:
    """Write the cleaned executed notebook of every notebook page to ``out``; returns their paths.

    Raises:
        FileNotFoundError: if a page has no executed notebook in ``build``.
        ValueError: if a notebook does not validate, or an output names a folder of this machine.
    """
    written = []
    here = machine_folders(root)
    for page in notebook_pages(root):
        source = build / "jupyter_execute" / f"{page}.ipynb"
        if not source.exists():
            raise FileNotFoundError(f"{page}: no executed notebook at {source} (was the book built?)")
        nb = nbformat.read(source, as_version=4)
        clean(nb)
        try:
            nbformat.validate(nb)
        except nbformat.ValidationError as error:
            raise ValueError(f"{page}: the executed notebook is not valid nbformat: {error.message}") from error
        leaks = machine_paths(nb, here)
        if leaks:
            raise ValueError(f"{page}: outputs name folders of the building machine: {leaks[:3]}")
        target = out / f"{page}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        written.append(target)
    (out / "README.md").write_text(README.format(commit=commit), encoding="utf-8")
    return written


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    build, out = Path(argv[0]), Path(argv[1])
    commit = argv[2] if len(argv) == 3 else "HEAD"
    try:
        written = publish(build, out, commit=commit)
    except (FileNotFoundError, ValueError) as error:
        print(f"publish_notebooks: {error}", file=sys.stderr)
        return 1
    print(f"{len(written)} executed notebooks in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
