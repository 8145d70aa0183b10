"""What each training chapter's training costs, and how well a step uses the CPU.

Each training chapter (and chapter 9's solutions, whose exercises train) is executed as the
build executes it, in a fresh kernel on one torch thread; a last cell reads
``d2lmini.train.training_tally()``, the model FLOPs that ``train_models`` counted in that kernel
and in its worker processes (``6 N + 12 L n d`` per token, see ``flops_per_token``) and the CPU
time of the training steps. For each chapter it prints:

* ``train_tflop_<chapter> value=V target<=T``: the chapter's training in model TFLOP
  (machine-independent; the budget is 3 TFLOP a chapter, 12 for chapter 9);
* ``train_mfu_<chapter> ratio=R target>=0.4``: model FLOP per CPU-second of the chapter's training
  steps, divided by the FLOP per CPU-second of one single-threaded fp32 ``torch.mm`` at the shape
  the chapter's main model multiplies most, its FFN's up-projection ``(b n, d) @ (d, 4d)`` (the
  shape that carried most of the chapter's FLOPs), measured in the same run: how much of each
  step is arithmetic rather than per-operation overhead;
* ``chapter_s_<chapter> value=S``: the notebook's wall time here (a comment on a busy machine).

Then ``train_step_vs_hf ratio=R target<=1.0``: the CPU time of one AdamW training step of chapter
9's trained-size 2026 model in d2lmini, divided by the same step of the same model converted to
``transformers`` (``d2lmini.reference.to_hf``, a ``Qwen3ForCausalLM``), on the capstone's batch of 16
windows of 64 characters, one thread, the median of several steps.

Run: ``python benchmarks/bench_train.py`` (all chapters, about ten minutes on two cores), or
``--chapters 07 09``; ``--step-only`` for the last line alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = {"02": "02_residual", "04": "04_norm_placement", "05": "05_rmsnorm", "06": "06_qk_norm",
            "07": "07_ffn", "09": "09_the_2026_block"}
BUDGET_TFLOP = {"09": 12.0}  # every other chapter: 3
TALLY_CELL = ("import json, d2lmini.train\n"
              "_t = d2lmini.train.training_tally()\n"
              "print('TALLY', json.dumps({'flops': _t['flops'], 'cpu_seconds': _t['cpu_seconds'],\n"
              "      'shapes': [[list(k), v] for k, v in _t['shapes'].items()]}))")


def processor_name() -> str:
    """The CPU model from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return "%.2f" % os.getloadavg()[0]
    except OSError:
        return "n/a"


def mm_flops_per_cpu_second(m: int, k: int, n: int, seconds: float = 1.5) -> float:
    """FLOP per CPU-second of one single-threaded fp32 ``(m, k) @ (k, n)``, repeated for ``seconds``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        A, B = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            A @ B
        start, cpu, reps = time.perf_counter(), time.thread_time(), 0
        while time.perf_counter() - start < seconds:
            A @ B
            reps += 1
        return reps * 2.0 * m * k * n / (time.thread_time() - cpu)
    finally:
        torch.set_num_threads(threads)


def run_notebook(path: Path) -> tuple[dict, float]:
    """Execute ``path`` as the build does (skip-execution cells skipped) plus the tally cell; return
    the tally and the wall time."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(TALLY_CELL))
    start = time.perf_counter()
    NotebookClient(nb, timeout=1800, kernel_name="python3", skip_cells_with_tag="skip-execution",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    wall = time.perf_counter() - start
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    tally = json.loads(text.split("TALLY", 1)[1])
    return tally, wall


def bench_chapter(key: str, path: Path) -> None:
    tally, wall = run_notebook(path)
    tflop, budget = tally["flops"] / 1e12, BUDGET_TFLOP.get(key, 3.0)
    print(f"train_tflop_{key} value={tflop:.2f} target<={budget:g}   # {path.relative_to(ROOT)}", flush=True)
    if not tally["shapes"]:
        return
    (tokens, width), (flops, cpu) = max(tally["shapes"], key=lambda item: item[1][0])
    peer = mm_flops_per_cpu_second(tokens, width, 4 * width)
    rate = tally["flops"] / tally["cpu_seconds"]
    print(f"# {key}: {tally['cpu_seconds']:.0f} CPU-s of training steps, {rate / 1e9:.1f} GFLOP per CPU-s; "
          f"main shape {tokens} tokens a step at width {width}: torch.mm ({tokens}x{width})@({width}x{4 * width}) "
          f"{peer / 1e9:.1f} GFLOP per CPU-s", flush=True)
    print(f"train_mfu_{key} ratio={rate / peer:.3f} target>=0.4", flush=True)
    print(f"chapter_s_{key} value={wall:.0f}   # wall time of the whole notebook here, load {load_average()}",
          flush=True)


def step_seconds(model, batch, labels, repeats: int) -> float:
    """Median CPU time of one AdamW step (forward, cross-entropy, backward, update) of ``model``."""
    from torch.nn import functional as F

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    times = []
    for i in range(repeats + 2):
        cpu = time.thread_time()
        out = model(batch)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if i >= 2:  # the first steps warm up the allocator and the optimizer's state
            times.append(time.thread_time() - cpu)
    return statistics.median(times)


def bench_step_vs_hf(repeats: int = 15) -> None:
    from d2lmini import LanguageModel
    from d2lmini.chapters import ch09_the_2026_block as ch09
    from d2lmini.data import python_reference_corpus
    from d2lmini.reference import to_hf
    from d2lmini.seeding import seeded

    corpus = python_reference_corpus()
    kwargs = ch09.lm_walk()[-1][1]
    width = ch09.matched_ffn_num_hiddens(corpus.vocab_size, kwargs, ch09.model_parameters(corpus.vocab_size,
                                                                                           ch09.LM_2017))
    with seeded(0):
        ours = LanguageModel(corpus.vocab_size, **ch09.CAPSTONE_MODEL, ffn_num_hiddens=width, **kwargs)
    theirs = to_hf(ours)
    theirs.train()
    t = ch09.CAPSTONE_TRAINING
    X, Y = corpus.random_batch(t["batch_size"], t["seq_len"], torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = [], []
        for _ in range(3):  # interleaved, so a change in the machine's load hits both
            a.append(step_seconds(ours, X, Y, repeats))
            b.append(step_seconds(theirs, X, Y, repeats))
    finally:
        torch.set_num_threads(threads)
    mine, hf = statistics.median(a), statistics.median(b)
    print(f"# training step of the capstone's 2026 model ({sum(p.numel() for p in ours.parameters()):,} parameters, "
          f"{t['batch_size']}x{t['seq_len']} tokens, one thread): d2lmini {mine * 1e3:.1f} ms, "
          f"{type(theirs).__name__} {hf * 1e3:.1f} ms (CPU time, medians)", flush=True)
    print(f"train_step_vs_hf ratio={mine / hf:.3f} target<=1.0", flush=True)


def main(chapters: list[str], step_only: bool) -> None:
    print(f"# {processor_name()}; {os.cpu_count()} logical CPUs, torch {torch.__version__}; "
          f"load average {load_average()}", flush=True)
    if not step_only:
        for key in chapters:
            bench_chapter(key, ROOT / "chapters" / f"{CHAPTERS[key]}.ipynb")
    bench_step_vs_hf()
    print(f"# load average at the end {load_average()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", nargs="*", default=list(CHAPTERS), choices=list(CHAPTERS))
    parser.add_argument("--step-only", action="store_true", help="only the training step against transformers")
    args = parser.parse_args()
    main(args.chapters, args.step_only)
