"""The book's numbers do not depend on the machine, and its build survives an interruption and no network.

* Every chapter fixes its own threads (the setup cell, the same in every notebook).
* The chapters that train run again in a fresh kernel on another thread environment
  (``OMP_NUM_THREADS``, ``torch.set_num_threads`` and the hash seed changed before the book's
  code runs): every text, Markdown, HTML and figure output equals the build's, except the
  measured times that cells tagged ``timing`` quote and the time measurements tagged ``clock``.
* The book builds, and every chapter runs alone as in Colab, with the network blocked at the
  socket level (``tests/offline``): nothing even tries to connect.
* A build killed while a chapter executes, then run again, exits 0 with the pages of an
  uninterrupted build (a small book with this repository's ``_config.yml``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from conftest import OFFLINE_LOG, ROOT, build_command, code_notebooks, network_attempts, offline_env

SETUP_THREADS = "torch.set_num_threads(1)"

# The chapters whose experiments train models (their modules call d2lmini.train; checked below).
TRAINING_CHAPTERS = ("02_residual", "04_norm_placement", "05_rmsnorm", "06_qk_norm", "07_ffn", "09_the_2026_block")

# The training chapter that runs again on another thread environment: every chapter fixes its threads
# in the same setup cell and no module reads the machine's core count (both checked below for every
# chapter), and the one training loop gives each model of a lockstep, a vmap ensemble or a worker
# thread what it gets alone (tests/test_train.py, tests/test_ffn_experiments.py); so one chapter shows
# the mechanism, where rerunning every training chapter would cost minutes.
RERUN_CHAPTERS = ("02_residual",)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# Cells whose outputs depend on the clock, tagged by the chapter: in a cell tagged `timing`, each
# measured time it quotes (a number with its unit) is masked and the rest compared; a cell tagged
# `clock` is a time measurement as a whole (times, their ratios, what the text says of them) and is
# not compared.
TIME = re.compile(r" *\d[\d,.]*(?:e[-+]?\d+)?\s*(?:ms|µs|μs|us|ns|s|sec|seconds|min|minutes|h|hours)\b")


# --------------------------------------------------------------------------- one place fixes the threads

def setup_cell(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return next(cell.source for cell in nb.cells if cell.cell_type == "code")


def test_every_chapter_starts_with_the_same_setup_cell_which_fixes_the_threads():
    setups = {path.name: setup_cell(path) for path in code_notebooks()}
    first = next(iter(setups.values()))
    assert all(source == first for source in setups.values()), sorted(setups)
    import ast

    top_level = [ast.unparse(node) for node in ast.parse(first).body]  # not inside an `if`: run everywhere
    assert SETUP_THREADS in top_level, top_level
    assert "os.cpu_count" not in first and "get_num_threads" not in first


def test_no_experiment_reads_the_machines_core_count():
    """The package never sizes its work from the machine: threads come from the caller (the setup cell).
    (d2lmini.timing reports the machine a time was measured on, and sizes nothing by it.)"""
    for path in (ROOT / "d2lmini").rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        if path.name == "timing.py":
            source = source.replace('"cpu_count": os.cpu_count() or 0', "")
        assert "os.cpu_count" not in source and "multiprocessing.cpu_count" not in source, path
        assert "sched_getaffinity" not in source, path


def test_the_training_chapters_are_the_ones_whose_modules_train():
    """Every chapter module that imports d2lmini.train (the one training loop) is in TRAINING_CHAPTERS,
    so a new chapter that trains is compared too."""
    chapters = ROOT / "d2lmini" / "chapters"
    training = {path.stem.split("_", 1)[1] for path in chapters.glob("ch*_*.py")
                if re.search(r"from \.\.train import (?:.*\b(?:train_models|train_lm|train_and_evaluate)\b)",
                             path.read_text(encoding="utf-8"))}
    listed = {name.split("_", 1)[1] for name in TRAINING_CHAPTERS}
    assert training <= listed, training - listed
    for name in TRAINING_CHAPTERS:
        assert (ROOT / "chapters" / f"{name}.ipynb").exists(), name


# --------------------------------------------------------------------------- the outputs to compare

def _merged(outputs) -> list:
    """Outputs with consecutive stream outputs of one stream joined (as the build's nb_merge_streams)."""
    merged = []
    for output in outputs:
        if (output.output_type == "stream" and merged and merged[-1]["output_type"] == "stream"
                and merged[-1]["name"] == output.name):
            merged[-1]["text"] += output.text
        else:
            merged.append(dict(output))
    return merged


def shown_outputs(nb) -> list[tuple[int, list[tuple[str, str]]]]:
    """Per code cell (by its index among the code cells): what it shows, as (kind, text) pairs --
    streams, every MIME type of a display or result but widget views, and errors. In a cell tagged
    ``timing`` the measured times are masked; a cell tagged ``clock`` is left out."""
    cells = []
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    for index, cell in enumerate(code):
        if "clock" in cell.metadata.get("tags", []):
            continue
        shown = []
        for output in _merged(cell.outputs):
            kind = output["output_type"]
            if kind == "stream":  # (the build's copy keeps no final newline)
                shown.append((output["name"], output["text"].rstrip("\n")))
            elif kind in ("display_data", "execute_result"):
                data = output["data"]
                rich = len(data) > 1  # then text/plain is only the fallback no reader sees (and may
                for mime, value in sorted(data.items()):  # hold a memory address: pandas' Styler)
                    if mime != WIDGET_VIEW and not (rich and mime == "text/plain"):
                        shown.append((mime, value if isinstance(value, str) else "".join(value)))
            elif kind == "error":
                shown.append(("error", f"{output['ename']}: {output['evalue']}"))
        if "timing" in cell.metadata.get("tags", []):
            shown = [(kind, TIME.sub("<time>", text)) for kind, text in shown]
        cells.append((index, shown))
    return cells


def differences(built, rerun) -> list[str]:
    """The outputs of ``rerun`` that differ from ``built``'s (same notebook), as short reports."""
    found = []
    a, b = shown_outputs(built), shown_outputs(rerun)
    if len(a) != len(b):
        return [f"{len(a)} code cells in the build, {len(b)} in the rerun"]
    if [index for index, _ in a] != [index for index, _ in b]:
        return ["the build and the rerun tag different cells `clock`"]
    for (index, ours), (_, theirs) in zip(a, b):
        if ours != theirs:
            kinds = sorted({k for k, _ in ours} | {k for k, _ in theirs})
            first = next(((x, y) for x, y in zip(ours, theirs) if x != y), (ours[len(theirs):], theirs[len(ours):]))
            found.append(f"code cell {index} ({', '.join(kinds)}): build {str(first[0])[:300]!r} "
                         f"vs rerun {str(first[1])[:300]!r}")
    return found


def test_a_changed_number_is_a_difference():
    """The comparison can fail: one digit changed in a figure, a sentence or a table is found."""
    nb = new_notebook(cells=[new_code_cell("x")])
    nb.cells[0].outputs = [nbformat.v4.new_output("display_data", data={"text/markdown": "loss 2.31 after 1.5 s",
                                                                        "image/svg+xml": "<path d='M 1 2'/>"})]
    other = nbformat.reads(nbformat.writes(nb), as_version=4)
    assert differences(nb, other) == []
    other.cells[0].outputs[0]["data"]["image/svg+xml"] = "<path d='M 1 3'/>"
    assert differences(nb, other)
    other = nbformat.reads(nbformat.writes(nb), as_version=4)
    other.cells[0].outputs[0]["data"]["text/markdown"] = "loss 2.32 after 1.5 s"
    assert differences(nb, other)
    # A time differs only where the cell is tagged as measuring one, and only the time is masked.
    other = nbformat.reads(nbformat.writes(nb), as_version=4)
    other.cells[0].outputs[0]["data"]["text/markdown"] = "loss 2.31 after 9.7 s"
    assert differences(nb, other)
    for notebook in (nb, other):
        notebook.cells[0].metadata["tags"] = ["timing"]
    assert differences(nb, other) == []
    other.cells[0].outputs[0]["data"]["text/markdown"] = "loss 2.39 after 9.7 s"
    assert differences(nb, other)
    for notebook in (nb, other):  # a time measurement as a whole is left out
        notebook.cells[0].metadata["tags"] = ["clock"]
    assert differences(nb, other) == [] and shown_outputs(nb) == []


# --------------------------------------------------------------------------- another thread environment

# Runs one chapter in a fresh kernel as the build does (cells tagged skip-execution skipped), after
# a first cell that sets what a machine of other cores would have set before the book's code runs.
RERUN = """
import sys, nbformat
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell
source, target, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
nb = nbformat.read(source, as_version=4)
nb.cells.insert(0, new_code_cell(f"import torch\\ntorch.set_num_threads({threads})"))
NotebookClient(nb, timeout=900, kernel_name="python3",
               resources={"metadata": {"path": str(__import__("pathlib").Path(source).parent)}}).execute()
nb.cells.pop(0)
nbformat.write(nb, target)
"""

OTHER_THREADS = 3  # neither the suite's 1 nor this machine's 2


def rerun(name: str, folder: Path) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Run chapter ``name`` again on another thread environment, offline; the process, the executed
    notebook and the network log."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.ipynb"
    shutil.copy(ROOT / "chapters" / f"{name}.ipynb", source)
    log = folder / OFFLINE_LOG
    env = offline_env(log, OMP_NUM_THREADS=str(OTHER_THREADS), MKL_NUM_THREADS=str(OTHER_THREADS),
                      PYTHONHASHSEED="4242")
    target = folder / "executed.ipynb"
    proc = subprocess.run([sys.executable, "-c", RERUN, str(source), str(target), str(OTHER_THREADS)],
                          capture_output=True, text=True, env=env, cwd=folder, timeout=1800)
    return proc, target, log


def queue_jobs(item, jobs, tmp_path_factory):
    """At the start of the session, queue the reruns and the interrupted builds (conftest.Jobs)."""
    if item.originalname == "test_a_training_chapter_gives_the_builds_outputs_on_other_threads":
        name = item.callspec.params["name"]
        folder = tmp_path_factory.mktemp(f"rerun_{name}")
        jobs.add(("rerun", name), lambda: rerun(name, folder), group="reruns")
    if item.originalname == "test_a_killed_build_run_again_gives_the_uninterrupted_books_pages":
        folder = tmp_path_factory.mktemp("interrupted")
        jobs.add("interrupted build", lambda: interrupted_builds(folder))


def test_the_reruns_are_training_chapters():
    assert set(RERUN_CHAPTERS) <= set(TRAINING_CHAPTERS)


@pytest.mark.parametrize("name", RERUN_CHAPTERS)
def test_a_training_chapter_gives_the_builds_outputs_on_other_threads(name, html, jobs):
    proc, target, log = jobs.result(("rerun", name))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    assert network_attempts(log) == ""
    built = nbformat.read(html.parent / "jupyter_execute" / "chapters" / f"{name}.ipynb", as_version=4)
    found = differences(built, nbformat.read(target, as_version=4))
    compared = sum(len(shown) for _, shown in shown_outputs(built))
    print(f"{name}: {compared} outputs compared, {len(found)} differ")
    assert compared > 0 and not found, "\n".join(found)


# --------------------------------------------------------------------------- no network

def test_the_book_builds_with_the_network_blocked(html):
    """The html fixture builds with tests/offline's guard: not one connection or name lookup was tried."""
    assert network_attempts(html.parent.parent / OFFLINE_LOG) == ""


def test_the_guard_refuses_a_connection_and_logs_it(tmp_path):
    """The guard works: a lookup and a connection beyond this machine fail and are logged; loopback is allowed."""
    log = tmp_path / "attempts.log"
    code = ("import socket\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); port = s.getsockname()[1]\n"
            "socket.create_connection(('localhost', port)).close()\n"
            "tries = [lambda: socket.socket().connect(('192.0.2.1', 80)),\n"
            "         lambda: socket.socket(socket.AF_INET6).connect(('2001:db8::1', 80, 0, 0)),\n"
            "         lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'?', ('192.0.2.2', 53)),\n"
            "         lambda: socket.create_connection(('example.org', 443), timeout=1),\n"
            "         lambda: socket.gethostbyname('example.net')]\n"
            "for attempt in tries:\n"
            "    try:\n"
            "        attempt()\n"
            "    except OSError as error:\n"
            "        print('refused', type(error).__name__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=offline_env(log),
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:5] == ["refused OSError"] * 3 + ["refused gaierror"] * 2, proc.stdout
    attempts = network_attempts(log)
    for target in ("192.0.2.1", "2001:db8::1", "192.0.2.2", "example.org", "example.net"):
        assert target in attempts, target
    assert "127.0.0.1" not in attempts and "localhost" not in attempts


# --------------------------------------------------------------------------- an interrupted build

SLOW_CELL = """import os, time
from pathlib import Path
Path(os.environ["D2LMINI_TEST_STARTED"]).write_text(str(os.getpid()))  # the build is now executing this chapter
time.sleep(float(os.environ.get("D2LMINI_TEST_SLEEP", "0")))
print("the slow chapter finished")"""

FIGURE_CELL = """import matplotlib
from d2lmini import plot
plot.use_svg_display()
fig, ax = plot.new_figure()
ax.plot([0, 1, 2, 3], [3.0, 1.0, 2.0, 0.5], label="loss")
ax.legend()
display(fig)"""


def interruption_book(folder: Path) -> Path:
    """A small book with this repository's _config.yml: a chapter with a figure, then a slow chapter."""
    book = folder / "book"
    book.mkdir(parents=True)
    shutil.copy(ROOT / "_config.yml", book / "_config.yml")
    shutil.copy(ROOT / "references.bib", book / "references.bib")
    (book / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: figure\n  - file: slow\n")
    (book / "intro.md").write_text("# Fixture\n\nA book whose second chapter takes its time.\n")
    for name, cell in (("figure", FIGURE_CELL), ("slow", SLOW_CELL)):
        nb = new_notebook(cells=[new_markdown_cell(f"# The {name} chapter"), new_code_cell(cell),
                                 new_code_cell("print(6 * 7)")])
        nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
        nbformat.write(nb, book / f"{name}.ipynb")
    return book


def pages(html: Path) -> dict[str, bytes]:
    return {path.relative_to(html).as_posix(): path.read_bytes()
            for path in sorted(html.rglob("*")) if path.is_file() and path.suffix in (".html", ".svg", ".png", ".js")
            and "_static" not in path.parts}


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def interrupted_builds(folder: Path) -> dict:
    """Build the small book once whole; then build a copy, kill the build (SIGKILL to its process group)
    while the slow chapter executes, and run the same command again. Returns what the test checks."""
    book = interruption_book(folder)
    whole = subprocess.run(build_command(book, folder / "whole"), capture_output=True, text=True, timeout=1200,
                           env=offline_env(folder / OFFLINE_LOG, D2LMINI_TEST_STARTED=str(folder / "ran")))
    # The same book, interrupted: the build command started as from a shell, killed mid-chapter.
    started, out = folder / "started", folder / "interrupted"
    out.mkdir()
    env = offline_env(out / OFFLINE_LOG, D2LMINI_TEST_STARTED=str(started), D2LMINI_TEST_SLEEP="60")
    process = subprocess.Popen(build_command(book, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env, start_new_session=True)
    deadline = time.monotonic() + 600
    while not started.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    was_executing = started.exists() and process.poll() is None
    kernel = int(started.read_text()) if started.exists() else None
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    # The orphaned kernel notices that its parent is gone and exits by itself.
    deadline = time.monotonic() + 30
    while kernel is not None and _alive(kernel) and time.monotonic() < deadline:
        time.sleep(0.2)
    kernel_left = kernel is not None and _alive(kernel)
    if kernel_left:
        os.kill(kernel, signal.SIGKILL)
    again = subprocess.run(build_command(book, out), capture_output=True, text=True, timeout=1200,
                           env={**env, "D2LMINI_TEST_SLEEP": "0"})
    return dict(whole=whole, offline=network_attempts(folder / OFFLINE_LOG) + network_attempts(out / OFFLINE_LOG),
                was_executing=was_executing, killed=process.returncode, kernel_left=kernel_left,
                again=again, whole_pages=pages(folder / "whole" / "_build" / "html"),
                again_pages=pages(out / "_build" / "html"))


@pytest.mark.slow  # three builds of a small book (about 30 s, in the background)
def test_a_killed_build_run_again_gives_the_uninterrupted_books_pages(jobs):
    result = jobs.result("interrupted build")
    whole, again = result["whole"], result["again"]
    assert whole.returncode == 0, whole.stdout[-4000:] + whole.stderr[-4000:]
    assert result["was_executing"], "the build was not executing the slow chapter when it was killed"
    assert result["killed"] == -signal.SIGKILL
    assert not result["kernel_left"], "the killed build's kernel kept running"
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert "the slow chapter finished" in result["again_pages"]["slow.html"].decode()
    assert result["offline"] == ""
    assert sorted(result["again_pages"]) == sorted(result["whole_pages"])
    changed = [name for name, content in result["again_pages"].items() if content != result["whole_pages"][name]]
    assert changed == [], changed


def test_a_styled_table_is_the_same_html_on_every_run():
    import pandas as pd

    from d2lmini import plot

    a = pd.DataFrame({"loss": [2.31, 2.29]})
    html = plot.table_style(a).format("{:.2f}").to_html()
    assert plot.table_style(a.copy()).format("{:.2f}").to_html() == html
    assert a.style.to_html() != a.style.to_html(), "pandas' own id is random (what table_style fixes)"
    other = plot.table_style(pd.DataFrame({"loss": [2.31, 2.28]})).to_html()
    assert other.split("T_")[1][:11] != html.split("T_")[1][:11], "two tables, two ids"
    with pytest.raises(TypeError, match="DataFrame"):
        plot.table_style([1, 2])


@pytest.mark.parametrize("path", code_notebooks(), ids=lambda p: p.stem)
def test_every_styled_table_takes_its_id_from_its_content(path):
    """A chapter styles a table with ``plot.table_style(df)``, never ``df.style`` (pandas' own id
    is random, so the page would change on every run)."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            assert not re.search(r"\.style\b(?!_)", cell.source), f"{path.name}: use plot.table_style(df)"
