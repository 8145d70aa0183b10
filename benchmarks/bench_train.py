"""Speed of the chapter-7 training comparison (GELU MLP vs SwiGLU), the book's heaviest cell.

Prints two lines, ``NAME ratio=R target>=T`` / ``NAME value=V target<=T``:

* ``train_mfu``: model FLOP/s of the training loop divided by the FLOP/s of fp32
  ``torch.mm`` measured in the same run, on this machine, on matrices of the size the
  model multiplies (the FFN's up-projection of one training batch: ``(b n, d) @ (d, 4d)``).
  The peer is the faster of two ways of using the cores: one ``torch.mm`` with every
  thread, or one single-threaded ``torch.mm`` per worker thread side by side (how the
  comparison trains). Both rates are FLOPs per second of this process's CPU time
  (``time.process_time``, summed over its threads): on a quiet machine that is the
  wall-clock FLOP/s divided by the number of busy cores, for both sides alike, and
  unlike wall-clock time it does not drop when other programs share the cores. The
  wall-clock ratio is printed too, as a comment. Model FLOPs per training token are
  ``6 N + 12 L n d`` (Kaplan et al. 2020; Chowdhery et al. 2022, appendix B), where
  ``N`` is the number of parameters, ``L`` the number of blocks, ``n`` the sequence
  length and ``d`` the width; the second term is attention's ``Q K^T`` and ``A V``,
  forward and backward, counted in full although the mask is causal. ``N`` counts
  *every* parameter, the definition this benchmark's target was set with; the token and
  position embeddings are table look-ups rather than matrix products, so the ratio
  with ``N`` counting only the other parameters (Kaplan et al.'s convention; the output
  head is included) is printed too, as a comment. The validation passes are not
  counted as FLOPs but their time is.
* ``train_comparison_s``: wall time in seconds of ``d2lmini.chapters.ch07_ffn.ffn_comparison()``
  with its defaults -- 2 activations x 3 seeds x 600 steps, as the chapter runs it.

Timings depend on what else the machine is doing; the header line names the machine
and the load average at the start and the end.

Run: ``python benchmarks/bench_train.py`` (``--quick``: 60 steps instead of 600, for a smoke test).
"""

from __future__ import annotations

import argparse
import os
import platform
import threading
import time

import torch

from d2lmini.chapters.ch07_ffn import COMPARISON_CONFIG, ffn_comparison


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


def process_and_workers_time() -> float:
    """CPU seconds of this process and of its finished child processes (the comparison's workers)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def mm_flops(m: int, k: int, n: int, workers: int, seconds: float = 2.0) -> tuple[float, float]:
    """fp32 ``(m, k) @ (k, n)`` throughput: ``workers`` threads each multiplying its own pair
    single-threaded, or (``workers == 0``) one product at a time using every intra-op thread.

    Returns:
        ``(FLOP per wall-clock second, FLOP per second of process CPU time)``.
    """
    flops = [0.0] * max(workers, 1)

    def run(index):
        A, B = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            A @ B
        start, reps = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            A @ B
            reps += 1
        flops[index] = reps * 2.0 * m * k * n

    threads = torch.get_num_threads()
    wall, cpu = time.perf_counter(), time.process_time()
    if workers == 0:
        run(0)
    else:
        torch.set_num_threads(1)
        try:
            pool = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        finally:
            torch.set_num_threads(threads)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return sum(flops) / wall, sum(flops) / cpu


def model_flops(result, embeddings: bool = True) -> float:
    """Training FLOPs of every model of an FFNComparison: steps x tokens x (6 N + 12 L n d).

    ``embeddings=False`` leaves the token and position tables out of ``N``."""
    total = 0.0
    for run in result.runs.values():
        c = run.config
        d, n, L = c["num_hiddens"], c["seq_len"], c["num_layers"]
        tables = result.vocab_size * d + n * d        # token table + learned positions
        N = run.num_params - (0 if embeddings else tables)
        tokens = c["batch_size"] * n
        total += c["num_steps"] * len(run.seeds) * tokens * (6 * N + 12 * L * n * d)
    return total


def main(quick: bool = False) -> None:
    threads = torch.get_num_threads()
    print(f"# {processor_name()}; {os.cpu_count()} logical CPUs, torch {torch.__version__} "
          f"with {threads} intra-op threads; float32; load average {load_average()}", flush=True)
    steps = 60 if quick else 600
    eval_steps = (20, 40, 60) if quick else (200, 400, 600)
    start, cpu = time.perf_counter(), process_and_workers_time()
    workers = min(2, threads)  # GELU and SwiGLU side by side, as chapter 9 trains them, where the cores allow
    result = ffn_comparison(num_steps=steps, eval_steps=eval_steps, workers=workers)
    wall, cpu = time.perf_counter() - start, process_and_workers_time() - cpu
    flops = model_flops(result)

    c = COMPARISON_CONFIG
    m, k, n = c["batch_size"] * c["seq_len"], c["num_hiddens"], 4 * c["num_hiddens"]
    peers = {"all threads": mm_flops(m, k, n, workers=0)}
    if workers > 1:
        peers[f"{workers} single-threaded workers"] = mm_flops(m, k, n, workers=workers)
    peer_wall = max(p[0] for p in peers.values())
    peer_cpu = max(p[1] for p in peers.values())
    print(f"# model: {result.runs['gelu'].num_params:,} parameters (GELU), "
          f"{result.runs['swiglu'].num_params:,} (SwiGLU); {flops / 1e12:.2f} TFLOP in {wall:.1f} s wall, "
          f"{cpu:.1f} s CPU: {flops / wall / 1e9:.1f} GFLOP/s, {flops / cpu / 1e9:.1f} GFLOP per CPU-s",
          flush=True)
    for name, (w, p) in peers.items():
        print(f"# torch.mm ({m}x{k})@({k}x{n}) fp32, {name}: {w / 1e9:.1f} GFLOP/s, "
              f"{p / 1e9:.1f} GFLOP per CPU-s", flush=True)
    s = result.summary(result.val_steps[-1])
    print(f"# GELU - SwiGLU validation loss at step {s['step']}: mean {s['mean']:+.3f} nats, "
          f"std {s['std']:.3f}, SwiGLU lower in {s['wins']} of {s['seeds']} seeds", flush=True)
    flops_no_tables = model_flops(result, embeddings=False)
    print(f"# wall-clock ratio (shared machines: lower): {flops / wall / peer_wall:.3f}; "
          f"with N without the embedding tables: {flops_no_tables / cpu / peer_cpu:.3f} (CPU time), "
          f"{flops_no_tables / wall / peer_wall:.3f} (wall clock)")
    print(f"train_mfu ratio={flops / cpu / peer_cpu:.3f} target>=0.6")
    print(f"train_comparison_s value={wall:.1f} target<=120" + ("   # --quick: 60 steps" if quick else ""))
    print(f"# load average at the end {load_average()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 steps instead of 600")
    main(parser.parse_args().quick)
