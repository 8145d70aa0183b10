"""The repository's promises: the README's two commands, CI running the same, pinned requirements."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import d2lmini
from conftest import ROOT

BUILD = "pip install -r requirements.txt && jupyter-book build . -W --keep-going"
TEST = "pip install -r requirements.txt && pytest"


def readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", readme, flags=re.S)]


def test_readme_gives_exactly_the_build_and_test_commands():
    assert readme_commands() == [BUILD, TEST]


def test_ci_runs_the_readme_test_command_in_a_fresh_venv():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv" in ci and "mktemp -d" in ci
    assert TEST in ci.splitlines()


def test_requirements_pin_the_build_set_and_install_d2lmini_from_the_repo():
    lines = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert "torch==2.13.0" in lines
    assert "-e ." in lines
    assert any(re.fullmatch(r"jupyter-book==1\.[\d.a-z]+", line) for line in lines)
    pinned = [line for line in lines if line != "-e ."]
    assert all("==" in line for line in pinned), "every requirement is pinned"


def test_package_requirement_on_torch_stays_loose_for_colab():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"torch>=2.4"' in pyproject
    assert 'requires-python = ">=3.10"' in pyproject




def test_the_wheel_holds_every_subpackage(tmp_path):
    """A package folder left out of the wheel imports in an editable checkout and fails everywhere
    else (Colab installs the wheel): build one and list what it holds."""
    import zipfile

    import shutil

    source = tmp_path / "source"  # a clean copy: a build/ folder left by an earlier build would hide a gap
    shutil.copytree(ROOT / "d2lmini", source / "d2lmini", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True)
    (wheel,) = tmp_path.glob("d2lmini-*.whl")
    held = {Path(name).parent.as_posix() for name in zipfile.ZipFile(wheel).namelist() if name.endswith("__init__.py")}
    folders = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "d2lmini").rglob("__init__.py")}
    assert folders <= held, sorted(folders - held)
