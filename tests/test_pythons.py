"""The package and its explorers on every Python the package supports (3.10-3.13), with both
ipywidgets 7.7.1 (Colab's) and 8.x, and with the oldest releases pyproject.toml admits.

The test session's own interpreter (in CI Python 3.11, with requirements.txt: ipywidgets 8,
torch 2.13) runs the whole suite; here the widget, package and training tests run again in
fresh virtual environments of the others:

* 3.10 with the floors of pyproject.toml: torch 2.4 (so SDPA without ``enable_gqa``),
  numpy 1.24, matplotlib 3.7, pandas 2.0, and ipywidgets 7.7.1;
* 3.12 with current releases and ipywidgets 8;
* 3.13 in the Colab-like environment the chapters run in (torch 2.11, ipywidgets 7.7.1).

An interpreter that is not installed on this machine is skipped, with the reason.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import COLAB_PYTHON, ROOT, find_python, make_venv, releases

# Other Python environments, each made fresh: out of the quick loop.
pytestmark = pytest.mark.slow

SUITES = ["tests/test_widgets.py", "tests/test_package.py", "tests/test_train.py"]

# Python -> (what is installed first, as a platform would have it; then the rest)
ENVIRONMENTS = {
    "3.10": (["torch==2.4.1"],
             ["numpy==1.24.4", "matplotlib==3.7.5", "pandas==2.0.3", "ipywidgets==7.7.1", "pytest"]),
    "3.12": (["torch==2.11.0"],
             ["numpy>=2.1", "matplotlib>=3.10", "pandas>=2.2", "ipywidgets>=8,<9", "pytest"]),
}


@pytest.fixture
def python_of(request, tmp_path_factory):
    """The python of a fresh environment for the version in ``request.param``; removed afterwards."""
    version = request.param
    interpreter = find_python(version)
    if interpreter is None:
        pytest.skip(f"Python {version} is not installed on this machine")
    if version == COLAB_PYTHON:
        yield request.getfixturevalue("colab_python")
        return
    where = tmp_path_factory.mktemp(f"py{version}") / "venv"
    first, rest = ENVIRONMENTS[version]
    # The package itself, with its extras, must install over those pins without changing them.
    yield make_venv(interpreter, where, first, rest, ["-e", f"{ROOT}[widgets,book]"])
    shutil.rmtree(where, ignore_errors=True)  # several GB


@pytest.mark.parametrize("python_of", [*ENVIRONMENTS, COLAB_PYTHON], indirect=True)
def test_package_and_explorers_pass(python_of, request):
    version = request.node.callspec.params["python_of"]
    installed = releases(python_of)
    print(installed)
    assert installed["python"] == version
    for pin in [pin for group in ENVIRONMENTS.get(version, ()) for pin in group]:
        name, _, wanted = pin.partition("==")  # the pins held: installing the package changed none
        if name in installed and wanted:
            assert installed[name].split("+")[0] == wanted, (name, installed[name])
    # Run from the checkout, so the tests import this checkout's d2lmini.
    proc = subprocess.run([str(python_of), "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]
    print(proc.stdout.splitlines()[-1])
