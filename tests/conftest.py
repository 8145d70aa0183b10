"""Shared fixtures: the repository root, the chapters the table of contents lists, the built
book, the Colab-like environment; the quick loop's "slow" marker; and the background jobs that
let the slow tests use both cores (see Jobs)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The suite runs two processes at a time on its two cores (see Jobs below): the book build's
# kernels beside the Colab-like runs and the other Pythons' test runs. Each gets one torch
# thread: the models are tiny, and two threads per process on a busy machine mostly wait on
# each other (measured: 4x the CPU time for the same training). Set before torch is imported
# here, and inherited by every process the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")


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


def code_notebooks() -> list[Path]:
    """The notebooks of :func:`chapter_notebooks` that hold code (the glossary holds none)."""
    import nbformat

    return [path for path in chapter_notebooks()
            if any(cell.cell_type == "code" for cell in nbformat.read(path, as_version=4).cells)]


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
    env = _uv_env()
    subprocess.run([UV, "venv", "-q", "--seed", "--python", str(python), str(where)], check=True, env=env,
                   capture_output=True)
    venv_python = where / "bin" / "python"
    for packages in installs:
        uv_install(venv_python, packages)
    return venv_python


def _uv_env() -> dict:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}  # the interpreter given, never a download
    if os.environ.get("PIP_FIND_LINKS"):  # uv sees the local wheels pip is told of (torch's CPU build)
        env.setdefault("UV_FIND_LINKS", os.environ["PIP_FIND_LINKS"])
    return env


def uv_install(venv_python: Path, packages: list[str]) -> None:
    """Install ``packages`` into the environment of ``venv_python`` with uv."""
    # --compile-bytecode, as pip does: with PYTHONDONTWRITEBYTECODE set (CI sets it), every
    # process would otherwise compile torch's modules anew, seconds each time.
    proc = subprocess.run([UV, "pip", "install", "-q", "--compile-bytecode", "--python", str(venv_python),
                           *packages], capture_output=True, text=True, env=_uv_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


# Building d2lmini from this checkout writes into it (build/, d2lmini.egg-info): one build at a time.
CHECKOUT_BUILDS = threading.Lock()


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


@dataclass
class ColabEnv:
    """The Colab-like environment: its ``python``, the ``wheel`` of d2lmini that its pip built
    from this checkout (what each chapter's setup cell installs), the ``versions`` it runs
    (:func:`releases`), and whether it is the ``fallback`` (no Python 3.13 here)."""

    python: Path
    wheel: Path
    versions: dict
    fallback: bool


def make_colab_env(where: Path) -> ColabEnv:
    """A fresh virtual environment pinned like Google Colab (see above) in ``where``. Without
    Python 3.13 here, Colab's packages on this Python and the torch wheel on disk."""
    python, torch = find_python(COLAB_PYTHON), COLAB_TORCH
    fallback = python is None
    if fallback:
        python, torch = sys.executable, "torch==2.13.0"
    venv_python = make_venv(python, where / "venv", [torch], COLAB_PACKAGES)  # torch is preinstalled on Colab
    versions = releases(venv_python)
    assert versions["ipywidgets"] == "7.7.1" and versions["matplotlib"].startswith("3.10."), versions
    assert versions["numpy"].startswith("2.1.") and versions["torch"].startswith(torch.split("==")[1]), versions
    # d2lmini built from source once, by this environment's pip, as Colab's pip builds it from
    # the repository; each chapter then installs the wheel (several chapters, one build).
    with CHECKOUT_BUILDS:
        proc = subprocess.run([str(venv_python), "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                               str(where / "wheel"), str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (wheel,) = (where / "wheel").glob("d2lmini-*.whl")
    # Installed once here, by the command each chapter's setup cell runs, so that the chapters can
    # run side by side: in each of them the same command then finds it installed and changes nothing.
    proc = subprocess.run([str(venv_python), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return ColabEnv(venv_python, wheel, versions, fallback)


COLAB_JOB = "the Colab-like environment"


def queue_colab_env(jobs: "Jobs", tmp_path_factory) -> None:
    """Queue the Colab-like environment (once). It is removed (several GB, a minute) as soon as
    the last job that uses it has run, beside the other jobs rather than after them."""
    if COLAB_JOB not in jobs:
        where = tmp_path_factory.mktemp("colab")
        jobs.add(COLAB_JOB, lambda: make_colab_env(where), priority=2)
        jobs.after_last_use(COLAB_JOB, lambda: shutil.rmtree(where, ignore_errors=True))


@pytest.fixture(scope="session")
def colab_env(jobs) -> ColabEnv:
    """The Colab-like environment of this session (made in the background, see Jobs)."""
    env = jobs.result(COLAB_JOB)
    if env.fallback:
        warnings.warn(f"Python {COLAB_PYTHON} is not installed here; the Colab-like notebook runs "
                      f"use Python {sys.version_info.major}.{sys.version_info.minor} and torch 2.13.0")
    print("Colab-like environment: Python {python}, ipywidgets {ipywidgets}, matplotlib {matplotlib}, "
          "numpy {numpy}, torch {torch}".format(**env.versions))
    return env


# --------------------------------------------------------------------------- background jobs


class _Job:
    def __init__(self, fn, group, uses, priority):
        self.fn, self.group, self.uses, self.priority = fn, group, uses, priority
        self.state, self.value, self.error, self.seconds = "queued", None, None, None


class Jobs:
    """Slow work that runs in subprocesses (making the Colab-like environment, each chapter run
    alone in it, the other Pythons' test runs, the tiny books' builds), queued when the session
    starts and run by a background thread while the main thread runs the tests -- the book
    build first. Both threads mostly wait on subprocesses, so both cores are busy.

    A test asks for a job's result with :meth:`result`: if no thread has started the job, the
    asking thread runs it; while another thread runs it, the asking thread runs other queued
    jobs, or waits. An exception raised by a job (a failed assert, ``pytest.skip``) is raised
    again in each test that asks for its result. Jobs of one ``group`` never run at once. Jobs
    of a higher ``priority`` start first: the long ones that nothing waits for (the Colab-like
    environment, the oldest Python's environment and tests), then the chapters in the Colab-like
    environment (two at a time once the build is done), then the rest; a job that ``uses``
    another starts once that one is done.

    A test module queues its jobs with a function ``queue_jobs(item, jobs, tmp_path_factory)``,
    called at the start of the session for each of its selected tests; nothing is queued for
    tests that do not run (``pytest -m "not slow"`` starts nothing).
    """

    def __init__(self):
        self._jobs: dict = {}
        self._cleanups: list = []
        self._users: dict = {}  # key -> queued jobs that use its result, not yet run
        self._after_last_use: dict = {}
        self._changed = threading.Condition()
        self._busy_groups: set = set()
        self._thread = None

    def __contains__(self, key) -> bool:
        return key in self._jobs

    def add(self, key, fn, group: str | None = None, uses=None, priority: int = 0) -> None:
        """Queue ``fn()`` under ``key`` (once; a key already queued is kept). ``uses``: the key of
        a job whose result this one needs (see :meth:`after_last_use`); ``priority``: jobs of a
        higher one start first."""
        with self._changed:
            if key not in self._jobs:
                self._jobs[key] = _Job(fn, group, uses, priority)
                if uses is not None:
                    self._users[uses] = self._users.get(uses, 0) + 1

    def after_last_use(self, key, fn) -> None:
        """Call ``fn()`` once every queued job that uses ``key`` has run (by the thread that ran
        the last of them, while the other one goes on), or at the end of the session."""
        self._after_last_use[key] = fn

    def cleanup(self, fn) -> None:
        """Call ``fn()`` at the end of the session, after the jobs."""
        self._cleanups.append(fn)

    def start(self) -> None:
        if self._jobs and self._thread is None:
            self._thread = threading.Thread(target=self._work, name="pytest background jobs", daemon=True)
            self._thread.start()

    def _claim(self, *jobs):  # with self._changed held: the first of jobs (default: all) free to start
        for job in jobs or sorted(self._jobs.values(), key=lambda job: -job.priority):  # stable: queue order
            needed = self._jobs.get(job.uses) if jobs == () else None
            if needed is not None and needed.state != "done":
                continue  # what it needs is not ready: another job meanwhile
            if job.state == "queued" and job.group not in self._busy_groups:
                job.state = "running"
                if job.group is not None:
                    self._busy_groups.add(job.group)
                return job
        return None

    def _run(self, job) -> None:
        start = time.perf_counter()
        try:
            job.value = job.fn()
        except BaseException as error:  # noqa: BLE001 -- raised again in the test that asks
            job.error = error
        release = None
        with self._changed:
            job.seconds = time.perf_counter() - start
            job.state = "done"
            self._busy_groups.discard(job.group)
            if job.uses is not None:
                self._users[job.uses] -= 1
                if self._users[job.uses] == 0:
                    release = self._after_last_use.pop(job.uses, None)
            self._changed.notify_all()
        if release is not None:
            release()

    def _work(self) -> None:
        while True:
            with self._changed:
                job = self._claim()
                while job is None:
                    if not any(j.state == "queued" for j in self._jobs.values()):
                        return
                    self._changed.wait()  # the queued ones wait for their group
                    job = self._claim()
            self._run(job)

    def result(self, key):
        """The value ``fn()`` returned for ``key``, once it has run."""
        job = self._jobs[key]
        while True:
            with self._changed:
                if job.state == "done":
                    break
                mine = self._claim(job) or self._claim()  # this job, else another one meanwhile
                if mine is None:
                    self._changed.wait()
                    continue
            self._run(mine)
        if job.error is not None:
            raise job.error
        return job.value

    def seconds(self) -> dict:
        """Key -> seconds the job ran, for the jobs that ran."""
        return {key: job.seconds for key, job in self._jobs.items() if job.seconds is not None}

    def close(self) -> None:
        """Drop the jobs not started, wait for the running ones, then clean up."""
        with self._changed:
            for job in self._jobs.values():
                if job.state == "queued":
                    job.state, job.error = "done", RuntimeError("the session ended before this job ran")
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()
        while any(job.state == "running" for job in self._jobs.values()):  # run by a test's thread
            time.sleep(0.1)
        for fn in [*self._after_last_use.values(), *self._cleanups]:
            fn()
        self._after_last_use.clear()


_SESSION_JOBS: list[Jobs] = []


@pytest.fixture(scope="session", autouse=True)
def jobs(request, tmp_path_factory) -> Jobs:
    """This session's background jobs (see :class:`Jobs`), queued for the selected tests and
    started before the first test runs."""
    queue = Jobs()
    items = request.session.items
    if any("colab_env" in item.fixturenames for item in items):
        queue_colab_env(queue, tmp_path_factory)  # first: the chapter runs need it
    for item in items:
        queue_jobs = getattr(getattr(item, "module", None), "queue_jobs", None)
        if queue_jobs is not None:
            queue_jobs(item, queue, tmp_path_factory)
    queue.start()
    _SESSION_JOBS.append(queue)
    yield queue
    queue.close()


def pytest_terminal_summary(terminalreporter):
    """How long each background job ran (they overlap the tests, so --durations misses them)."""
    seconds = {key: s for queue in _SESSION_JOBS for key, s in queue.seconds().items()}
    if seconds:
        terminalreporter.section("background jobs")
        for key, s in seconds.items():
            terminalreporter.write_line(f"{s:7.1f}s  {key if isinstance(key, str) else ' '.join(map(str, key))}")
        terminalreporter.write_line(f"{sum(seconds.values()):7.1f}s  in all")


# --------------------------------------------------------------------------- the quick loop

# A test that uses one of these fixtures (directly or through another fixture) builds the
# book, drives the browser on it, or runs in another Python environment: minutes, not
# seconds. `pytest -m "not slow"` leaves them out; plain `pytest` runs everything.
SLOW_FIXTURES = frozenset({"html", "colab_env", "python_run"})


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test whose fixtures include one of :data:`SLOW_FIXTURES`, so a new
    test of the built book or of another environment is left out of the quick loop by itself."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)

    # The order: the book build (the longest single task) and its readers first, while the
    # background jobs start; then the tests that run here; last, the tests of modules with
    # background jobs (see Jobs), whose results are ready by then or being finished by both cores.
    def order(item) -> int:
        if "html" in getattr(item, "fixturenames", ()):
            return 0
        return 2 if hasattr(getattr(item, "module", None), "queue_jobs") else 1

    items.sort(key=order)


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


def mutated(reference, mutate):
    """``reference`` (a :class:`d2lmini.reference.Reference`) whose converted block is then changed
    by ``mutate(block)`` under ``torch.no_grad()``: for tests that show a reproduction check can fail."""
    import dataclasses

    import torch

    def wrong(layer, config):
        block = reference.convert(layer, config)
        with torch.no_grad():
            mutate(block)  # the rotary cache is keyed on every RoPE attribute: no stale table
        return block

    return dataclasses.replace(reference, convert=wrong)


def made_with(row, **changes):
    """``(layer, config)``: the tiny layer of a zoo ``row`` (seed 0), its config then given ``changes``
    (for tests of options a converter refuses)."""
    layer, config = row.make(0)
    for key, value in changes.items():
        setattr(config, key, value)
    return layer, config


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


OFFLINE = ROOT / "tests" / "offline"  # its sitecustomize.py blocks the network in every process started with it
OFFLINE_LOG = "offline.log"  # beside a build's _build folder: every connection the build tried


def offline_env(log: Path, **changes: str) -> dict:
    """This process's environment, with ``changes``, for a subprocess that has no network: every
    Python process it starts imports ``tests/offline/sitecustomize.py`` first, which refuses any
    connection or name lookup beyond this machine and appends each attempt to ``log``."""
    env = {**os.environ, **changes}
    env["PYTHONPATH"] = os.pathsep.join([str(OFFLINE), *filter(None, [env.get("PYTHONPATH")])])
    env["D2LMINI_OFFLINE_LOG"] = str(log)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"  # pip's own look for a newer pip (the Colab setup cell)
    return env


def network_attempts(log: Path) -> str:
    """What ``log`` (see :func:`offline_env`) recorded: empty when nothing tried to reach the network."""
    return log.read_text(encoding="utf-8") if log.exists() else ""


JUPYTER_BOOK = str(Path(sys.executable).with_name("jupyter-book"))
BUILD_FLAGS = ["-W", "--keep-going"]  # as in the README's build command


def build_command(source: Path, output: Path) -> list[str]:
    """The README's build command on ``source``, writing into ``output``/_build."""
    return [JUPYTER_BOOK, "build", str(source), "--path-output", str(output), *BUILD_FLAGS]


def build(source: Path, output: Path) -> subprocess.CompletedProcess:
    """Run the README's build command on ``source``, writing into ``output``/_build, with no network
    (:func:`offline_env`; what it tried is in ``output``/offline.log)."""
    return subprocess.run(build_command(source, output), capture_output=True, text=True, timeout=3000,
                          env=offline_env(output / OFFLINE_LOG))


@pytest.fixture(scope="session")
def html(tmp_path_factory) -> Path:
    """The whole book, built once per test session with no network; the folder of its HTML pages.
    The executed notebooks are in ``html.parent / "jupyter_execute"``."""
    out = tmp_path_factory.mktemp("book")
    proc = build(ROOT, out)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return out / "_build" / "html"


# --------------------------------------------------------------------------- a browser

#: Debian's Chromium (never a browser a test tool downloads), headless and offline.
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def require_chromium() -> None:
    """Skip the test where Debian's Chromium is not installed; in CI (``.ci/run`` installs it), fail."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing; .ci/run installs Debian's chromium")
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")


@contextlib.contextmanager
def serve_folder(directory: Path):
    """``directory`` over HTTP from localhost, without request logs; yields ``http://127.0.0.1:PORT``."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
