"""Publishing: the execution statistics page of the built book, the workflow that puts the book on
GitHub Pages (linted by actionlint, offline; building with the README's command), and the executed
notebooks it publishes for Colab, where every chapter's launch button points.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
import yaml
from bs4 import BeautifulSoup

from conftest import ROOT, code_notebooks, toc_files  # the html fixture (conftest.py) builds the book once
from test_repo import readme_commands

STATUS = "chapters/status"  # a Markdown page: myst-nb's execution table
ENVIRONMENT = "chapters/environment"  # a notebook: the releases and machine it ran on
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"


def status_page(html: Path, name: str = STATUS) -> BeautifulSoup:
    path = html / f"{name}.html"
    assert path.exists(), f"{name} was not built"
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def cells(row) -> list[str]:
    return [cell.get_text(" ", strip=True) for cell in row.find_all(["th", "td"])]


def table_with(soup: BeautifulSoup, text: str):
    """The page's one table with a cell that reads ``text``."""
    tables = [t for t in soup.find_all("table") if text in map(str.strip, t.find_all(string=True))]
    assert len(tables) == 1, f"{len(tables)} tables with a cell {text!r}"
    return tables[0]


def test_status_pages_are_back_matter():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    back = next(part for part in toc["parts"] if part.get("caption") == "Back matter")
    for name in (STATUS, ENVIRONMENT):
        assert {"file": name} in back["chapters"]
        assert name in toc_files()


def test_status_page_gives_every_notebooks_run_time(html):
    table = table_with(status_page(html), "Run Time (s)")  # myst-nb's nb-exec-table
    header = cells(table.find("thead"))
    rows = {row[0]: dict(zip(header, row)) for row in map(cells, table.find("tbody").find_all("tr"))}
    for notebook in code_notebooks():  # every chapter in the toc, and each back-matter notebook with code
        name = notebook.relative_to(ROOT).with_suffix("").as_posix()
        assert name in rows, f"{name} is missing from the execution table"
        assert float(rows[name]["Run Time (s)"]) > 0, rows[name]
        assert rows[name]["Status"] == "✅", rows[name]


def test_status_page_shows_the_releases_this_build_ran(html):
    table = table_with(status_page(html, ENVIRONMENT), "torch threads")
    shown = {row[0]: row[1] for row in map(cells, table.find("tbody").find_all("tr"))}
    assert shown["Python"] == platform.python_version()
    assert shown["torch"] == torch.__version__
    for package in ("jupyter-book", "myst-nb", "transformers", "numpy", "d2lmini"):
        assert shown[package] == importlib.metadata.version(package), package
    assert shown["GPU"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
    assert int(shown["torch threads"]) >= 1
    assert shown["CPU"]


def workflow() -> dict:
    config = yaml.safe_load(WORKFLOW.read_text())
    config["on"] = config.pop(True, config.get("on"))  # YAML 1.1 reads the key `on` as true
    return config


ACTIONLINT = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")


def test_actionlint_finds_nothing_in_the_workflow():
    if ACTIONLINT is None:
        pytest.fail("actionlint is not installed (pip install -r requirements.txt installs it)")
    # actionlint reads only the files it is given (and shellcheck's, where that is installed):
    # no network.
    proc = subprocess.run([ACTIONLINT, "-no-color", "-oneline", str(WORKFLOW)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0 and report == "", report


def test_workflow_builds_with_the_readme_command_and_publishes_the_html():
    config = workflow()
    assert "main" in config["on"]["push"]["branches"]
    build_steps = config["jobs"]["build"]["steps"]
    runs = [step["run"].strip() for step in build_steps if "run" in step]
    build = next(command for command in readme_commands() if "jupyter-book build" in command)
    parts = [part.strip() for part in build.split("&&")]  # install, then build: one step each
    assert any(runs[i:i + len(parts)] == parts for i in range(len(runs))), (runs, parts)
    # Built from scratch (the status page says so): no execution cache carried between runs.
    assert not any(step.get("uses", "").startswith("actions/cache") for step in build_steps)
    upload = next(step for step in build_steps if step.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html"
    deploy = config["jobs"]["deploy"]
    assert deploy["needs"] == ["build", "notebooks"] and deploy["environment"]["name"] == "github-pages"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert any(step.get("uses", "").startswith("actions/deploy-pages@") for step in deploy["steps"])


# --------------------------------------------------------------------------- Colab with the results

PUBLISH = ROOT / ".github" / "publish_notebooks.py"
COLAB = "https://colab.research.google.com/github/"


def published_branch() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["branch"]


def publish(build: Path, out: Path) -> subprocess.CompletedProcess:
    """The workflow's step: the build's executed notebooks into ``out``."""
    return subprocess.run([sys.executable, str(PUBLISH), str(build), str(out), "0123abc"],
                          capture_output=True, text=True, timeout=300)


def test_workflow_publishes_the_executed_notebooks_to_the_launch_buttons_branch():
    config = workflow()
    steps = config["jobs"]["build"]["steps"]
    runs = [step.get("run", "") for step in steps]
    collect = next(i for i, run in enumerate(runs) if "publish_notebooks.py" in run)
    assert runs[collect].split()[:4] == ["python", ".github/publish_notebooks.py", "_build", "_build/notebooks"]
    assert collect > next(i for i, run in enumerate(runs) if "jupyter-book build" in run)
    upload = steps[collect + 1]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["with"]["path"] == "_build/notebooks"
    job = config["jobs"]["notebooks"]
    assert job["needs"] == "build" and job["permissions"] == {"contents": "write"}
    assert job["if"] == "github.ref == 'refs/heads/main'"  # only main's build fills the branch
    download = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"]["name"] == upload["with"]["name"]
    push = next(step["run"] for step in job["steps"] if "git push" in step.get("run", ""))
    branch = published_branch()
    assert branch != "main" and f"-b {branch}" in push and push.rstrip().endswith(f" {branch}")


def test_the_published_notebooks_have_their_outputs_and_validate(html, tmp_path):
    proc = publish(html.parent, tmp_path)
    assert proc.returncode == 0, proc.stderr
    for notebook in code_notebooks():
        name = notebook.relative_to(ROOT).as_posix()
        nb = nbformat.read(tmp_path / name, as_version=4)
        nbformat.validate(nb)
        assert "widgets" not in nb.metadata, name
        code = [cell for cell in nb.cells if cell.cell_type == "code"]
        stored = [cell for cell in nbformat.read(notebook, as_version=4).cells if cell.cell_type == "code"]
        assert [cell.source for cell in code] == [cell.source for cell in stored], f"{name}: not this commit's cells"
        assert sum(bool(cell.outputs) for cell in code) >= len(code) // 2, f"{name}: outputs are missing"
        assert not any("execution" in cell.metadata for cell in code), name
    assert "0123abc" in (tmp_path / "README.md").read_text()


def test_every_launch_button_opens_a_published_notebook(html, tmp_path):
    assert publish(html.parent, tmp_path).returncode == 0
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    prefix = COLAB + url.removeprefix("https://github.com/") + f"/blob/{published_branch()}/"
    opened = set()
    for notebook in code_notebooks():
        name = notebook.relative_to(ROOT).with_suffix("").as_posix()
        soup = BeautifulSoup((html / f"{name}.html").read_text(encoding="utf-8"), "html.parser")
        links = {a["href"] for a in soup.find_all("a", href=True) if a["href"].startswith(COLAB)}
        assert len(links) == 1, f"{name}: {links}"
        (link,) = links
        assert link.startswith(prefix), link
        path = link.removeprefix(prefix)
        assert path == f"{name}.ipynb" and (tmp_path / path).exists(), link
        opened.add(path)
    assert len(opened) == len(code_notebooks())


def test_publishing_refuses_a_missing_or_leaky_notebook(html, tmp_path):
    """The step fails, naming the page, when the build left no executed notebook or one that names
    a folder of the building machine."""
    build = tmp_path / "_build"
    shutil.copytree(html.parent / "jupyter_execute", build / "jupyter_execute")
    anatomy = build / "jupyter_execute" / "chapters" / "01_anatomy.ipynb"
    nb = nbformat.read(anatomy, as_version=4)
    code = next(cell for cell in nb.cells if cell.cell_type == "code")
    code.outputs.append(nbformat.v4.new_output("stream", name="stderr", text=f"warning from {ROOT}/d2lmini/x.py\n"))
    nbformat.write(nb, anatomy)
    proc = publish(build, tmp_path / "out")
    assert proc.returncode == 1 and "chapters/01_anatomy" in proc.stderr and "folders" in proc.stderr, proc.stderr
    anatomy.unlink()
    proc = publish(build, tmp_path / "out")
    assert proc.returncode == 1 and "chapters/01_anatomy: no executed notebook" in proc.stderr, proc.stderr
