"""Self-checks of chapter 10's exercises (Beyond one residual stream: hyper-connections and mHC).

Every expected answer is computed here with the chapter's own functions and settings:
:func:`~d2lmini.hyper.sinkhorn_knopp`, :func:`~d2lmini.chapters.ch10_hyper_connections.mixing_sweep`
and the draws of :func:`~d2lmini.chapters.ch10_hyper_connections.stream_divergence`.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from . import Exercise

# --------------------------------------------------------------------------- 10.1


def _average_of_streams(x=(3.0, 1.0, 0.0, 0.0), order: int = 2) -> dict:
    """``H = J / n`` on four streams of width 1: the norm of what it keeps and of what it removes
    (``order`` 1: the sums of absolute values, a wrong answer's)."""
    x = torch.tensor(x, dtype=torch.float64)
    H = torch.full((len(x), len(x)), 1 / len(x), dtype=torch.float64)
    kept = H @ x
    return {"kept": float(kept.norm(p=order)), "removed": float((x - kept).norm(p=order))}


# --------------------------------------------------------------------------- 10.2

SINKHORN_ITERS = (1, 2, 5, 20)


def _sinkhorn_errors(dim: int = -1, reduce: str = "max", scale: float = 2.56) -> dict:
    """Largest (``reduce="max"``, or ``"mean"``) ``|sum - 1|`` of the rows (``dim=-1``) or columns (``dim=-2``)
    of :func:`~d2lmini.hyper.sinkhorn_knopp` of 100 random 4 x 4 logits of standard deviation 2.56;
    ``"signed max"``: the largest ``sum - 1`` without the absolute value, ``"sums"``: the largest row sum
    itself, ``"norm"``: the largest over the matrices of the norm of their rows' errors, and ``scale`` other than 2.56 (wrong answers hints aim at)."""
    from ..hyper import sinkhorn_knopp

    logits = scale * torch.randn(100, 4, 4, generator=torch.Generator().manual_seed(0))
    out = {}
    for k in SINKHORN_ITERS:
        error = sinkhorn_knopp(logits, iters=k).sum(dim=dim) - 1
        out[f"iters_{k}"] = float({"max": error.abs().max, "mean": error.abs().mean, "signed max": error.max,
                                   "sums": (error + 1).max, "norm": error.norm(dim=-1).max}[reduce]())
    return out


# --------------------------------------------------------------------------- 10.3

NUM_STACKS = 51  # odd: the median is one stack's, whichever median a reader takes


@lru_cache(maxsize=None)
def _sweep(num_streams: int, scale_streams: int):
    """:func:`mixing_sweep` with ``num_streams`` streams at the logit scales of d = 128 and 4096
    computed for ``scale_streams`` streams (the same number, unless by mistake), 51 stacks."""
    from ..chapters import ch10_hyper_connections as hc

    stds = (hc.v4_logit_std(128, scale_streams), hc.v4_logit_std(4096, scale_streams))
    sweep = hc.mixing_sweep(logit_stds=stds, depth=64, num_streams=num_streams, num_stacks=NUM_STACKS, seed=0)
    return stds, sweep


def _final_norms(num_streams: int = 16, scale_streams: int = 16, statistic: str = "median", depth: int = -1) -> dict:
    """The median (or mean) over the stacks of ``||P_64||_2`` (``depth=0``: of ``||P_1||_2``, a mistake), per
    mixing and logit scale."""
    stds, sweep = _sweep(num_streams, scale_streams)
    out = {}
    for kind, name in (("hc", "hc"), ("sinkhorn", "mhc")):
        for std, width in zip(stds, (128, 4096)):
            last = sweep[(std, kind)]["spectral"][:, depth]
            out[f"{name}_{width}"] = float(last.median() if statistic == "median" else last.mean())
    return out


# --------------------------------------------------------------------------- 10.4


def _scaled_stack(scale: float = math.sqrt(4096 / 128), connections=("hc1", "hc2"), every: bool = False) -> dict:
    """``stream_divergence``'s n = 4 stack with the ``phi`` of ``connections`` multiplied by ``scale``:
    how far apart the streams are after blocks 1, 8 and 32, and the token spread after block 32
    (``every``: each parameter of the connections scaled, a wrong answer's)."""
    from ..hyper import HyperConnectedBlock, HyperHead, expand_streams
    from ..probes import init_linear_weights_, token_spread
    from ..seeding import seeded

    with seeded(0):  # the draws of stream_divergence (and probe_depth), in their order
        blocks = [init_linear_weights_(HyperConnectedBlock(128, 4, num_streams=4, act="relu"), "xavier_uniform")
                  for _ in range(32)]
        HyperHead(128, 4)
        X = torch.randn(1, 64, 128, dtype=torch.float32).to(torch.float64)
    X = expand_streams(X, 4)
    gaps = []
    with torch.no_grad():
        for block in blocks:
            for name in connections:
                connection = getattr(block, name)
                for weight in (connection.parameters() if every else [connection.phi]):
                    weight.mul_(scale)
            X = block.to(torch.float64)(X)
            deviation = X - X.mean(dim=2, keepdim=True)
            gaps.append(float(deviation.pow(2).mean().sqrt() / X.pow(2).mean().sqrt()))
    return {"apart_1": gaps[0], "apart_8": gaps[7], "apart_32": gaps[31], "token_spread_32": token_spread(X.flatten(2))}


EXERCISES = [
    Exercise(
        "10.1", "(kept, removed): the norms ||Hx|| and ||x - Hx|| for H = J/4 and x = (3, 1, 0, 0)",
        kind="numbers", names=("kept", "removed"), expected=_average_of_streams, rel=1e-4,
        order="the order is (kept, removed): ||Hx|| first",
        hints=[(lambda a, e: abs(a["kept"] - math.sqrt(10)) < 1e-3,
                "J/4 is not the identity: every entry of Hx is the average of all four entries of x."),
               (lambda a, e: abs(a["kept"] - 1) < 1e-3,
                "Hx is a vector of four entries (each the mean of x): hand in the norm of that vector."),
               (lambda a, e: abs(a["removed"] - (math.sqrt(10) - e["kept"])) < 1e-3,
                "The removed part is the vector x - Hx; take its norm, not the difference of two norms."),
               (lambda a, e: all(abs(a[k] - e[k] ** 2) < 1e-3 for k in e),
                "Those are the squared norms ||Hx||^2 and ||x - Hx||^2: take their square roots."),
               (lambda a, e: all(abs(a[k] - v) < 1e-3 for k, v in _average_of_streams(order=1).items()),
                "||.|| is the Euclidean norm, the square root of the sum of squares, not the sum of absolute "
                "values."),
               (lambda a, e: any(abs(a["kept"] - m * e["kept"]) < 1e-3 for m in (2, 4)),
                "H is J/4, the all-ones matrix divided by 4: every entry of Hx is the mean of x, 1.")],
        hint="Compute Hx and x - Hx as vectors, then the Euclidean norm of each; their squares add up to ||x||^2.",
        wrong=[lambda e: {**e, "kept": 1.0}, lambda e: {**e, "removed": math.sqrt(10) - e["kept"]},
               lambda e: {"kept": math.sqrt(10), "removed": 0.0},
               lambda e: {"kept": e["removed"], "removed": e["kept"]},
               lambda e: {k: v ** 2 for k, v in e.items()}, lambda e: _average_of_streams(order=1)]),
    Exercise(
        "10.2", "the largest |row sum - 1| over the 100 matrices after iters = 1, 2, 5 and 20, a tuple of four",
        kind="numbers", names=tuple(f"iters_{k}" for k in SINKHORN_ITERS), expected=_sinkhorn_errors, rel=2e-2,
        hints=[(lambda a, e: max(a.values()) < 1e-3,
                "Those are the columns' errors (a sum over dim=-2): the rows sum over the last dimension."),
               (lambda a, e: all(math.isclose(a[k], v, rel_tol=0.02, abs_tol=1e-9)
                                 for k, v in _sinkhorn_errors(reduce="signed max").items()),
                "The error is |sum - 1|: take .abs() before the max."),
               (lambda a, e: all(math.isclose(a[k], v, rel_tol=0.02, abs_tol=1e-9)
                                 for k, v in _sinkhorn_errors(scale=1.0).items()),
                "The logits are 2.56 * torch.randn(100, 4, 4, ...): the standard deviation of d = 4096's."),
               (lambda a, e: all(a[k] < 0.6 * e[k] for k in e),
                "Hand in the largest error over the 100 matrices, not their mean."),
               (lambda a, e: all(math.isclose(a[k], v, rel_tol=0.02) for k, v in _sinkhorn_errors(reduce="sums").items()),
                "Those are the row sums themselves: hand in their distance from 1, |sum - 1|."),
               (lambda a, e: all(math.isclose(a[k], v, rel_tol=0.02) for k, v in _sinkhorn_errors(reduce="norm").items()),
                "Take each row's |sum - 1| and the largest over every row of the 100 matrices, not a norm of each "
                "matrix's row errors."),
               (lambda a, e: abs(a["iters_20"] - 1) < 0.05,
                "After 20 rounds the rows sum to about 1: hand in each sum's distance from 1, |sum - 1|, "
                "not the sums."),
               (lambda a, e: len({round(v, 12) for v in a.values()}) == 1,
                "All four numbers are the same: pass iters=k to sinkhorn_knopp for each k (its default is "
                "20 rounds)."),
               (lambda a, e: a["iters_20"] > 0.5,
                "After 20 rounds the rows are near 1: call sinkhorn_knopp(logits, iters=k) for each k, "
                "not one fixed number of rounds.")],
        hint="Draw the logits exactly as the exercise says (seed 0, shape (100, 4, 4), times 2.56), then "
             "take (M.sum(dim=-1) - 1).abs().max() for each number of iterations.",
        wrong=[lambda e: _sinkhorn_errors(dim=-2), lambda e: _sinkhorn_errors(reduce="mean"),
               lambda e: _sinkhorn_errors(reduce="signed max"),
               lambda e: dict(zip(e, reversed(list(e.values())))), lambda e: {k: 100 * v for k, v in e.items()},
               lambda e: _sinkhorn_errors(scale=1.0), lambda e: _sinkhorn_errors(reduce="sums"),
               lambda e: dict.fromkeys(e, e["iters_20"])]),
    Exercise(
        "10.3", "the medians of ||P_64||_2 with 16 streams: a dict with keys hc_128, hc_4096, mhc_128, mhc_4096",
        kind="numbers", names=("hc_128", "hc_4096", "mhc_128", "mhc_4096"), expected=_final_norms, rel=1e-2,
        hints=[(lambda a, e: math.isclose(a["hc_4096"], _final_norms(depth=0)["hc_4096"], rel_tol=0.02),
                "That is ||P_1||, after the first block: take the last depth, spectral[:, -1]."),
               (lambda a, e: any(all(math.isclose(a[k], v, rel_tol=0.02) for k, v in _final_norms(depth=j).items())
                                 for j in range(1, 63)),
                "That is ||P_k|| at an earlier depth, another column of spectral: take the last depth, "
                "spectral[:, -1], ||P_64||."),
               (lambda a, e: a["hc_4096"] < e["hc_4096"] / 20,
                "With 16 streams both the mixings and their logits change: v4_logit_std takes the number of "
                "streams too, and mixing_sweep needs num_streams=16."),
               (lambda a, e: math.isclose(a["hc_4096"], _final_norms(statistic="mean")["hc_4096"], rel_tol=0.02),
                "Hand in the median over the stacks, not the mean: a few stacks stretch far more than the rest."),
               (lambda a, e: 1.01 < a["hc_4096"] / e["hc_4096"] < 3 or 0.33 < a["hc_4096"] / e["hc_4096"] < 0.99,
                "Close, but another draw or depth: 51 stacks (num_stacks=51), depth 64, seed 0, and the last "
                "depth, spectral[:, -1]."),
               (lambda a, e: abs(a["mhc_128"] - 1) > 0.05 or abs(a["mhc_4096"] - 1) > 0.05,
                "The mHC products are doubly stochastic: their norms should stay at 1. Take the last depth, "
                "spectral[:, -1].")],
        hint="Use mixing_sweep with depth 64, 51 stacks and seed 0, and the median of spectral[:, -1].",
        wrong=[lambda e: _final_norms(statistic="mean"), lambda e: _final_norms(num_streams=4, scale_streams=4),
               lambda e: _final_norms(num_streams=16, scale_streams=4), lambda e: _final_norms(depth=0),
               lambda e: _final_norms(depth=7)]),
    Exercise(
        "10.4", "a dict with keys apart_1, apart_8, apart_32 (the streams' distance after those blocks) "
                "and token_spread_32", kind="numbers", names=("apart_1", "apart_8", "apart_32", "token_spread_32"),
        expected=_scaled_stack, rel={"apart_1": 2e-2, "apart_8": 2e-2, "apart_32": 2e-2, "token_spread_32": 3e-3},
        hints=[(lambda a, e: any(all(abs(a[k] / v[k] - 1) < 0.02 for k in e)
                                 for v in (_scaled_stack(connections=("hc1",)), _scaled_stack(connections=("hc2",)))),
                "Scale the phi of both connections of every block, hc1 and hc2, not one of them."),
               (lambda a, e: all(abs(a[k] / v - 1) < 0.02 for k, v in _scaled_stack(scale=2.56).items()),
                "2.56 is the standard deviation the logits should reach; phi's entries are multiplied by the "
                "factor that gets them there from d = 128's, sqrt(4096/128)."),
               (lambda a, e: a["apart_1"] < 0.6 * e["apart_1"],
                "The logits are still those of d = 128: multiply the phi of both connections, hc1 and hc2, of "
                "every block, before the first forward pass."),
               (lambda a, e: all(abs(a[k] / v - 1) < 0.02 for k, v in _scaled_stack(every=True).items()),
                "These logits grew by 4096/128 = 32: multiply phi alone by the square root, sqrt(32) (alpha "
                "multiplies x' phi too, so scaling both phi and alpha by sqrt(32) also gives 32)."),
               (lambda a, e: a["apart_1"] > 1.2 * e["apart_1"],
                "Scale phi by the square root of 4096/128: the logits' standard deviation grows as the square root "
                "of the width."),
               (lambda a, e: all(abs(a[k] / e[k] - 1) < 0.02 for k in ("apart_1", "apart_8", "apart_32")),
                "Take the token spread of the last block's output with each token's four streams as one vector "
                "of 4 d numbers, X.flatten(2), as measure_stack does.")],
        hint="Copy stream_divergence's code so that the draws are its draws (seed 0), and read the distances "
             "after blocks 1, 8 and 32 (list indices 0, 7 and 31).",
        wrong=[lambda e: _scaled_stack(scale=1.0), lambda e: _scaled_stack(scale=32.0),
               lambda e: _scaled_stack(connections=("hc1",)), lambda e: _scaled_stack(connections=("hc2",)),
               lambda e: {k: 100 * v for k, v in e.items()}, lambda e: _scaled_stack(scale=2.56),
               lambda e: _scaled_stack(every=True)]),
]
