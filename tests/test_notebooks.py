"""Chapter notebooks: stored clean, set up the same way, and run alone, top to bottom, as in Colab."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
import yaml

from conftest import (COLAB_JOB, OFFLINE_LOG, ROOT, chapter_notebooks, code_notebooks, network_attempts,
                      offline_env, toc_files)
from test_readers import prose_cells, quoted_numbers

NOTEBOOKS = chapter_notebooks()
CODE_NOTEBOOKS = code_notebooks()  # the ones with a setup cell and something to run


def test_toc_lists_only_files_that_exist():
    for name in toc_files():
        assert any((ROOT / f"{name}{suffix}").exists() for suffix in (".ipynb", ".md")), name
    assert NOTEBOOKS, "the table of contents lists no chapter notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs are stored"
    for i, cell in enumerate(nb.cells):  # e.g. "\a" of a lost backslash in "\approx"
        assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", cell.source), f"{path.name}: control character in cell {i}"
    assert "widgets" not in nb.metadata


@pytest.mark.parametrize("path", CODE_NOTEBOOKS, ids=lambda p: p.stem)
def test_setup_cell_installs_from_the_configured_repository(path):
    # The launch buttons open the executed notebooks from their own branch (_config.yml's
    # repository.branch, see test_publish.py); the package itself always comes from main.
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    nb = nbformat.read(path, as_version=4)
    setup = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert '"google.colab" in sys.modules' in setup.source, "the setup cell must act only in Colab"
    sources = re.findall(r"git\+(\S+?)@(\w+)", setup.source)
    assert sources == [(url, "main")]
    installs = [line for line in setup.source.splitlines() if "install" in line or "D2LMINI =" in line]
    for package in ("ipywidgets", "torch", "matplotlib"):
        assert not any(package in line for line in installs), f"the setup cell must never install {package}"


# Each chapter runs alone in the Colab-like environment (conftest.colab_env), as a reader's
# notebook would; only d2lmini comes from the chapter's own setup cell, pointed through
# D2LMINI_SOURCE at the wheel that environment's pip built from this checkout.
RUNNER = """
import sys, nbformat
from nbclient import NotebookClient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
# Run every cell, the live widgets too (the book's build skips those tagged skip-execution).
NotebookClient(nb, timeout=900, kernel_name="python3", skip_cells_with_tag="run-every-cell",
               resources={"metadata": {"path": str(__import__("pathlib").Path(path).parent)}}).execute()
views = sum("application/vnd.jupyter.widget-view+json" in o.get("data", {})
            for c in nb.cells if c.cell_type == "code" for o in c.outputs)
errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
print("widget views:", views, "errors:", len(errors))
nbformat.write(nb, sys.argv[2])  # what the reader now sees, for the tests to read
"""


EXECUTED = "executed.ipynb"  # the run's notebook, with its outputs, in the run's folder


def run_alone(path: Path, colab, folder: Path) -> subprocess.CompletedProcess:
    """Run the chapter ``path``, copied alone into the empty ``folder``, in the Colab-like environment,
    with the network blocked (what was tried is in ``folder``/offline.log)."""
    alone = folder / path.name
    shutil.copy(path, alone)
    env = offline_env(folder / OFFLINE_LOG, D2LMINI_SOURCE=str(colab.wheel))  # no network, as the build
    return subprocess.run([str(colab.python), "-c", RUNNER, str(alone), str(folder / EXECUTED)],
                          capture_output=True, text=True, env=env, cwd=folder, timeout=1800)


def queue_jobs(item, jobs, tmp_path_factory):
    """At the start of the session, queue the Colab-like run of each selected chapter (conftest.Jobs):
    they run in the background, beside the book build, and two at a time after it (d2lmini is
    installed with the environment, so each chapter's install finds it there and changes nothing)."""
    if item.originalname == "test_notebook_runs_alone_in_a_colab_like_environment":
        path, folder = item.callspec.params["path"], tmp_path_factory.mktemp(item.callspec.id)
        jobs.add(alone_job(path), lambda: run_alone(path, jobs.result(COLAB_JOB), folder),
                 uses=COLAB_JOB, priority=1)


def alone_job(path: Path) -> tuple[str, str]:
    """The background job of a notebook's Colab-like run, named by its path in the book (a chapter and
    its solutions share a file name)."""
    return ("alone", path.relative_to(ROOT).as_posix())


@pytest.mark.parametrize("path", CODE_NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_alone_in_a_colab_like_environment(path, colab_env, jobs):
    proc = jobs.result(alone_job(path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    skipped_in_build = sum("skip-execution" in c.metadata.get("tags", [])
                           for c in nbformat.read(path, as_version=4).cells)
    assert f"widget views: {skipped_in_build} errors: 0" in proc.stdout, proc.stdout
    assert network_attempts(Path(proc.args[-1]).parent / OFFLINE_LOG) == "", "the chapter tried to reach the network"


@pytest.mark.parametrize("path", CODE_NOTEBOOKS, ids=lambda p: p.stem)
def test_the_text_shows_this_runs_numbers_in_a_colab_like_run(path, colab_env, jobs):
    """Every paragraph that quotes measured numbers appears, filled in, once its cell has run.

    In Colab and Jupyter such a paragraph is the Markdown output of a collapsed code cell:
    each one must have written exactly one piece of Markdown, every field filled in with a
    number of this run (which may differ from the book's: another torch, another machine).
    """
    proc = jobs.result(alone_job(path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    ran = nbformat.read(Path(proc.args[-1]), as_version=4)
    for cell in prose_cells(ran):
        shown = [output["data"]["text/markdown"] for output in cell.outputs if "text/markdown" in output.get("data", {})]
        assert len(shown) == 1, f"{path.name}: a prose cell wrote {len(shown)} pieces of Markdown: {cell.source[:120]!r}"
        text = shown[0]
        assert "numbers[" not in text and not re.search(r"\bnan\b", text), text
        assert quoted_numbers(text), f"{path.name}: no number in {text[:200]!r}"


@pytest.mark.parametrize("path", CODE_NOTEBOOKS, ids=lambda p: p.stem)
def test_every_module_attribute_a_chapter_reads_exists(path):
    """``module.name`` in a code cell, for a module the notebook imports, names something the module has:
    a renamed or removed package function fails here, in the quick loop, not only when the book is built."""
    import ast
    import types

    cells = [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]
    trees = [ast.parse(source) for source in cells if not source.lstrip().startswith(("%", "!"))]
    scope: dict = {}
    for tree in trees:
        imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        exec(compile(ast.Module(imports, type_ignores=[]), str(path), "exec"), scope)
    for tree in trees:
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and isinstance(scope.get(node.value.id), types.ModuleType)):
                assert hasattr(scope[node.value.id], node.attr), f"{path.name}: {node.value.id}.{node.attr}"
