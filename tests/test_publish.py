"""Publishing: the execution statistics page of the built book, and the workflow that puts
the book on GitHub Pages (linted by actionlint, offline; building with the README's command).
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
import sys
from pathlib import Path

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
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert any(step.get("uses", "").startswith("actions/deploy-pages@") for step in deploy["steps"])
