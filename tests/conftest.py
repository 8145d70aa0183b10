"""Shared fixtures: the repository root and the chapters the table of contents lists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def toc_files() -> list[str]:
    """Every document named in _toc.yml, in order (without suffix), root first."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return files


def chapter_notebooks() -> list[Path]:
    """The .ipynb chapters listed in _toc.yml."""
    return [ROOT / f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").exists()]


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests on one torch thread (tiny models; two threads mostly wait on each other)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


JUPYTER_BOOK = str(Path(sys.executable).with_name("jupyter-book"))
BUILD_FLAGS = ["-W", "--keep-going"]  # as in the README's build command


def build(source: Path, output: Path) -> subprocess.CompletedProcess:
    """Run the README's build command on ``source``, writing into ``output``/_build."""
    return subprocess.run([JUPYTER_BOOK, "build", str(source), "--path-output", str(output), *BUILD_FLAGS],
                          capture_output=True, text=True, timeout=3000)


@pytest.fixture(scope="session")
def html(tmp_path_factory) -> Path:
    """The whole book, built once per test session; the folder of its HTML pages."""
    out = tmp_path_factory.mktemp("book")
    proc = build(ROOT, out)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return out / "_build" / "html"
