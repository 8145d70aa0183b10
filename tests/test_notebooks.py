"""Chapter notebooks: stored clean, set up the same way, and run top to bottom in a fresh kernel."""

from __future__ import annotations

import re

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

from conftest import ROOT, chapter_notebooks, toc_files

NOTEBOOKS = chapter_notebooks()


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
    assert "widgets" not in nb.metadata


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_setup_cell_installs_from_the_configured_repository(path):
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url, branch = config["repository"]["url"], config["repository"]["branch"]
    nb = nbformat.read(path, as_version=4)
    setup = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert '"google.colab" in sys.modules' in setup.source, "the setup cell must act only in Colab"
    sources = re.findall(r"git\+(\S+?)@(\w+)", setup.source)
    assert sources == [(url, branch)]
    for package in ("ipywidgets", "torch", "matplotlib"):
        assert package not in setup.source, f"the setup cell must never install {package}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_a_fresh_kernel(path):
    nb = nbformat.read(path, as_version=4)
    # The book's build skips cells tagged "skip-execution" (the live widgets, which
    # need a kernel); a reader in Jupyter or Colab runs them, so this test does too.
    client = NotebookClient(nb, timeout=600, kernel_name="python3", skip_cells_with_tag="run-every-cell",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    widget_views = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
                    if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(widget_views) == sum("skip-execution" in c.metadata.get("tags", []) for c in nb.cells)
