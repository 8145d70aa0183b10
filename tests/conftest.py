"""Shared fixtures: the repository root and the chapters the table of contents lists."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
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


def find_python(version: str) -> Path | None:
    """An interpreter of Python ``version`` (such as ``"3.13"``) on this machine, or None.

    Looks under pyenv's versions first (``$PYENV_ROOT``, by default ``~/.pyenv``), then for
    ``python3.X`` on PATH; a candidate counts only if it runs and reports that version.
    """
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = sorted(pyenv_root.glob(f"versions/{version}.*/bin/python{version}"), reverse=True)
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        try:  # (a pyenv shim of a version not selected exits non-zero; a broken file raises)
            proc = subprocess.run([str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0 and proc.stdout.strip() == version:
            return candidate
    return None


UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def make_venv(python: Path | str, where: Path, *installs: list[str]) -> Path:
    """A fresh virtual environment of ``python`` in ``where`` (with pip in it, as on Colab); each
    list in ``installs`` is installed in turn: first what a platform has preinstalled, then the
    rest. Returns the environment's python.

    Installs go through uv (requirements.txt), whose cache hard-links one unpacked copy of a
    wheel into every environment: several torch environments then cost seconds each, not
    minutes of unpacking gigabytes of CUDA libraries as pip would.
    """
    if UV is None:
        pytest.fail("uv is not installed (pip install -r requirements.txt installs it)")
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}  # the interpreter given, never a download
    if os.environ.get("PIP_FIND_LINKS"):  # uv sees the local wheels pip is told of (torch's CPU build)
        env.setdefault("UV_FIND_LINKS", os.environ["PIP_FIND_LINKS"])
    subprocess.run([UV, "venv", "-q", "--seed", "--python", str(python), str(where)], check=True, env=env)
    venv_python = where / "bin" / "python"
    for packages in installs:
        # --compile-bytecode, as pip does: with PYTHONDONTWRITEBYTECODE set (CI sets it), every
        # process would otherwise compile torch's modules anew, seconds each time.
        proc = subprocess.run([UV, "pip", "install", "-q", "--compile-bytecode", "--python", str(venv_python),
                               *packages],
                              capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return venv_python


def releases(python: Path | str) -> dict[str, str]:
    """What ``python`` runs: its ``'python'`` version (such as ``'3.13'``) and the releases of
    torch, numpy, matplotlib and ipywidgets installed there."""
    names = ["torch", "numpy", "matplotlib", "ipywidgets"]
    code = f"import sys, {', '.join(names)}; print('%d.%d' % sys.version_info[:2], " + \
        ", ".join(f"{name}.__version__" for name in names) + ")"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    return dict(zip(["python", *names], out.split()))


# A virtual environment pinned like Google Colab today: Python 3.13, torch 2.11 and transformers
# preinstalled (so installed here first), ipywidgets 7.7.1, matplotlib 3.10, numpy 2.1, and
# pytest (Colab has it too). PyPI's Linux torch is the CUDA build, about 4.5 GB installed; on
# Colab's CPU runtime the same code runs on the CPU, as here. d2lmini is not installed: each
# chapter's setup cell installs it, and the package tests import it from the checkout.
COLAB_PYTHON = "3.13"
COLAB_TORCH = "torch==2.11.0"
COLAB_PACKAGES = ["transformers==5.24.0", "ipywidgets==7.7.1", "matplotlib>=3.10,<3.11",
                  "numpy>=2.1,<2.2", "pandas>=2.2", "ipykernel", "nbclient", "nbformat", "pytest"]


@pytest.fixture(scope="session")
def colab_python(tmp_path_factory) -> Path:
    """The python of a fresh virtual environment pinned like Google Colab (see above); removed
    at the end of the session. Without Python 3.13 here, Colab's packages on this Python."""
    python = find_python(COLAB_PYTHON)
    torch = COLAB_TORCH
    if python is None:  # still Colab's packages, on this interpreter and the torch wheel on disk
        warnings.warn(f"Python {COLAB_PYTHON} is not installed here; the Colab-like notebook runs "
                      f"use Python {sys.version_info.major}.{sys.version_info.minor} and torch 2.13.0")
        python, torch = sys.executable, "torch==2.13.0"
    where = tmp_path_factory.mktemp("colab") / "venv"
    venv_python = make_venv(python, where, [torch], COLAB_PACKAGES)  # torch is preinstalled on Colab
    versions = releases(venv_python)
    print("Colab-like environment: Python {python}, ipywidgets {ipywidgets}, matplotlib {matplotlib}, "
          "numpy {numpy}, torch {torch}".format(**versions))
    assert versions["ipywidgets"] == "7.7.1" and versions["matplotlib"].startswith("3.10.")
    assert versions["numpy"].startswith("2.1.") and versions["torch"].startswith(torch.split("==")[1])
    yield venv_python
    shutil.rmtree(where, ignore_errors=True)  # several GB


# --------------------------------------------------------------------------- the quick loop

# A test that uses one of these fixtures (directly or through another fixture) builds the
# book, drives the browser on it, or runs in another Python environment: minutes, not
# seconds. `pytest -m "not slow"` leaves them out; plain `pytest` runs everything.
SLOW_FIXTURES = frozenset({"html", "colab_python", "python_of"})


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test whose fixtures include one of :data:`SLOW_FIXTURES`, so a new
    test of the built book or of another environment is left out of the quick loop by itself."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Every test runs on one torch thread: the models are tiny, and two threads mostly wait
    on each other -- on a busy 2-core machine a training test then costs 4x the CPU time.
    A test that checks a function restores the thread count asks for ``two_threads``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def two_threads(one_thread):
    """Two torch threads for one test, so that a function that sets one thread and is meant to
    restore the caller's count is seen to restore it (with one thread already, it cannot fail)."""
    import torch

    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(1)


@pytest.fixture
def sdpa_inputs(monkeypatch):
    """``sdpa_inputs(attention, X)``: runs ``attention(X, X, X)`` and returns the queries and keys
    its forward hands to ``torch.nn.functional.scaled_dot_product_attention``, each
    ``(b, heads, n, head_dim)`` (keys with the key/value heads only, when those are shared).

    What the module really computes, rather than a re-computation of it beside the module."""
    import torch

    def run(attention, X):
        seen = []
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def spy(q, k, v, *args, **kwargs):
            seen.append((q.detach(), k.detach()))
            return sdpa(q, k, v, *args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
            attention(X, X, X)
        assert len(seen) == 1, f"the forward called scaled_dot_product_attention {len(seen)} times"
        return seen[0]

    return run


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
