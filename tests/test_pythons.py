"""The package and its explorers on the Pythons the package supports (3.10-3.13): the oldest and the
newest, with 3.11 the suite's own (3.12, between them, is not run again: each Python costs minutes);
with both ipywidgets 7.7.1 (Colab's) and 8.x, and with the oldest releases pyproject.toml admits.

The test session's own interpreter (in CI Python 3.11, with requirements.txt: ipywidgets 8,
torch 2.13) runs the whole suite; here the widget, package and training tests run again in
fresh virtual environments of the others:

* 3.10 with the floors of pyproject.toml: torch 2.4 (so SDPA without ``enable_gqa``),
  numpy 1.24, matplotlib 3.7, pandas 2.0, and ipywidgets 7.7.1;
* 3.13 in the Colab-like environment the chapters run in (torch 2.11, ipywidgets 7.7.1).

An interpreter that is not installed on this machine is skipped, with the reason.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import (CHECKOUT_BUILDS, COLAB_JOB, COLAB_PYTHON, ROOT, find_python, make_venv,
                      queue_colab_env, releases, uv_install)

# Other Python environments, each made fresh: out of the quick loop.
pytestmark = pytest.mark.slow

SUITES = ["tests/test_widgets.py", "tests/test_package.py", "tests/test_train.py"]

# Python -> (what is installed first, as a platform would have it; then the rest)
ENVIRONMENTS = {
    "3.10": (["torch==2.4.1"],
             ["numpy==1.24.4", "matplotlib==3.7.5", "pandas==2.0.3", "ipywidgets==7.7.1", "pytest"]),
}


def run_suites(version: str, jobs, where) -> tuple[dict, subprocess.CompletedProcess]:
    """The releases in a fresh environment of Python ``version`` (in ``where``), and the run of
    SUITES there; the environment is removed afterwards (several GB). For 3.13, the Colab-like one."""
    interpreter = find_python(version)
    if interpreter is None:
        pytest.skip(f"Python {version} is not installed on this machine")
    if version == COLAB_PYTHON:
        python = jobs.result(COLAB_JOB).python
    else:
        first, rest = ENVIRONMENTS[version]
        python = make_venv(interpreter, where / "venv", first, rest)
        # The package itself, with its extras, must install over those pins without changing them.
        with CHECKOUT_BUILDS:
            uv_install(python, ["-e", f"{ROOT}[widgets,book]"])
    try:
        installed = releases(python)
        # Run from the checkout, so the tests import this checkout's d2lmini.
        proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
                              cwd=ROOT, capture_output=True, text=True, timeout=1800)
    finally:
        shutil.rmtree(where / "venv", ignore_errors=True)
    return installed, proc


def queue_jobs(item, jobs, tmp_path_factory):
    """At the start of the session, queue each selected Python's environment and test run
    (conftest.Jobs): they run in the background, beside the book build."""
    version = item.callspec.params["python_run"]
    if version == COLAB_PYTHON:
        queue_colab_env(jobs, tmp_path_factory)
    where = tmp_path_factory.mktemp(f"py{version}")
    jobs.add(("Python", version), lambda: run_suites(version, jobs, where),
             uses=COLAB_JOB if version == COLAB_PYTHON else None, priority=1 if version == COLAB_PYTHON else 2)


@pytest.fixture
def python_run(request, jobs):
    """The releases in the environment of Python ``request.param`` and the finished run of SUITES there."""
    return jobs.result(("Python", request.param))


@pytest.mark.parametrize("python_run", [*ENVIRONMENTS, COLAB_PYTHON], indirect=True)
def test_package_and_explorers_pass(python_run, request):
    version = request.node.callspec.params["python_run"]
    installed, proc = python_run
    print(installed)
    assert installed["python"] == version
    for pin in [pin for group in ENVIRONMENTS.get(version, ()) for pin in group]:
        name, _, wanted = pin.partition("==")  # the pins held: installing the package changed none
        if name in installed and wanted:
            assert installed[name].split("+")[0] == wanted, (name, installed[name])
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]
    print(proc.stdout.splitlines()[-1])
