"""How much a busy core slows the book's clean build.

    python benchmarks/bench_build.py [--rev REV] [--idle-only]

Builds the book twice from a clean copy of commit REV (default HEAD; ``git archive``, so no
execution cache and no ``_build``), with the README's build command
(``jupyter-book build . -W --keep-going``; the install half of the README's command is left
out, since the pinned set is already installed): once on the idle machine, once while a
competing process keeps one core busy (a Python loop, one thread). Each copy's own
``d2lmini`` is the one imported (it goes first on ``PYTHONPATH``), so an older commit is
measured with its own package. ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` are removed from
the builds' environment: the threads are whatever the book's own code sets, as for a reader.

Prints, last, ``build_busy_ratio ratio=R target<=1.3``: the busy build's wall time over the
idle build's, measured in the same run; and before it each build's seconds and every chapter's
run time from the build's execution cache. ``--idle-only`` builds once, idle, and prints no
ratio (to time an older commit, whose busy build can take many times as long).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JUPYTER_BOOK = str(Path(sys.executable).with_name("jupyter-book"))
TARGET = 1.3


def clean_copy(rev: str, where: Path) -> Path:
    """The files of commit ``rev`` in ``where``/book."""
    book = where / "book"
    book.mkdir(parents=True)
    archive = where / "book.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), rev], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(book, filter="data")
    archive.unlink()
    return book


def chapter_times(book: Path) -> dict[str, float]:
    """Seconds each notebook took, as the build's execution cache recorded them."""
    db = book / "_build" / ".jupyter_cache" / "global.db"
    if not db.exists():
        return {}
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT uri, data FROM nbcache").fetchall()
    import json

    times = {}
    for uri, data in rows:
        seconds = json.loads(data).get("execution_seconds") if data else None
        if seconds is not None:
            times[Path(uri).stem] = float(seconds)
    return times


def timed_build(book: Path) -> tuple[float, dict[str, float]]:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(book), *filter(None, [env.get("PYTHONPATH")])])
    start = time.perf_counter()
    proc = subprocess.run([JUPYTER_BOOK, "build", ".", "-W", "--keep-going"], cwd=book, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"the build of {book} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds, chapter_times(book)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--rev", default="HEAD", help="the commit to build (default HEAD)")
    parser.add_argument("--idle-only", action="store_true", help="build once, on the idle machine (no ratio)")
    args = parser.parse_args(argv)
    print(f"# {os.cpu_count()} logical CPUs; building {args.rev} "
          f"({subprocess.run(['git', '-C', str(ROOT), 'rev-parse', '--short', args.rev], capture_output=True, text=True).stdout.strip()})",
          flush=True)
    # Warm the file cache first (torch's libraries, transformers), so the idle build, which runs
    # first, does not pay a cold start that the busy one is spared.
    subprocess.run([sys.executable, "-c", "import torch, transformers, matplotlib, pandas, sphinx, myst_nb"],
                   check=True)
    with tempfile.TemporaryDirectory() as tmp:
        idle_seconds, idle_times = timed_build(clean_copy(args.rev, Path(tmp) / "idle"))
        print(f"build_idle seconds={idle_seconds:.0f}", flush=True)
        if args.idle_only:
            for name in sorted(idle_times):
                print(f"  {name}: {idle_times[name]:.0f} s idle")
            return
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # one core kept busy
        try:
            busy_seconds, busy_times = timed_build(clean_copy(args.rev, Path(tmp) / "busy"))
        finally:
            busy.kill()
            busy.wait()
        print(f"build_busy seconds={busy_seconds:.0f}", flush=True)
    for name in sorted(idle_times):
        print(f"  {name}: {idle_times[name]:.0f} s idle, {busy_times.get(name, float('nan')):.0f} s busy")
    ratio = busy_seconds / idle_seconds
    print(f"build_busy_ratio ratio={ratio:.2f} target<={TARGET}")


if __name__ == "__main__":
    main()
