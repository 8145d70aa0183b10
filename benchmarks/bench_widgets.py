"""Slider latency of the live explorers: the first visit of a configuration vs a cached redraw.

Prints ``NAME ratio=R target<=T`` lines with R = cached redraw time / first-visit time,
and the absolute times, for chapter 4's depth explorer (moving the depth slider to a
new depth, then back and forth) and chapter 2's residual explorer. The issue's target
is a cached redraw of at most 100 ms.

Run: ``python benchmarks/bench_widgets.py``.
"""

from __future__ import annotations

import platform
import statistics
import time

import torch

import d2lmini


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads")
    explorer = d2lmini.depth_explorer(max_depth=64, depth=32, placement="post", dtype=torch.float64)
    slider = explorer.depth_slider
    first = [timed(lambda d=d: setattr(slider, "value", d)) for d in (8, 16, 24, 48)]
    cached = [timed(lambda d=d: setattr(slider, "value", d)) for d in (8, 16, 24, 48) * 5]
    f, c = statistics.median(first), statistics.median(cached)
    print(f"depth_explorer_cached_redraw ratio={c / f:.4f} target<=1.0   "
          f"# first visit {f * 1e3:.0f} ms, cached redraw {c * 1e3:.2f} ms (target <= 100 ms)")

    residual = d2lmini.residual_explorer(depths=(1, 2, 4, 8, 16, 32, 64), depth=32)
    residual.widget  # builds the controls and draws the first frame
    stack = residual.inputs["stack"]
    first = [timed(lambda s=s: setattr(stack, "value", s)) for s in ("none|False", "none|True", "pre|False")]
    cached = [timed(lambda s=s: setattr(stack, "value", s))
              for s in ("none|False", "none|True", "pre|False", "pre|True") * 5]
    f, c = statistics.median(first), statistics.median(cached)
    print(f"residual_explorer_cached_redraw ratio={c / f:.4f} target<=1.0   "
          f"# first draw {f * 1e3:.0f} ms, cached redraw {c * 1e3:.2f} ms (target <= 100 ms)")


if __name__ == "__main__":
    main()
