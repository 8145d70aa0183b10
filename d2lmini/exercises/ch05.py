"""Self-checks of chapter 5's exercises (RMSNorm: keep the scale, drop the centring).

Every expected value is computed here, with the package, from the settings the exercise names.
"""

from __future__ import annotations

import functools
import math

import torch

from . import Exercise


def _scale_and_shift(reduce: str = "max", ln_eps: float = 1e-5, seed: int = 0) -> dict:
    """5.1: how much multiplying a token by 3, or adding 3 to it, moves each norm's output (the largest
    change; ``reduce`` names wrong answers the hints aim at: ``"mean"``, the mean change; ``"norm"``, the
    change's norm; ``"relative"``, that norm over the norm of the unchanged output; ``ln_eps`` and ``seed``
    other than 1e-5 and 0)."""
    from torch import nn

    from ..norms import RMSNorm

    torch.manual_seed(seed)
    X = torch.randn(8, 64)
    rms, layer = RMSNorm(64), nn.LayerNorm(64, eps=ln_eps)

    def size(norm, changed):
        change = norm(changed) - norm(X)
        if reduce in ("norm", "relative"):
            return float(change.norm() / (norm(X).norm() if reduce == "relative" else 1))
        return float(getattr(change.abs(), reduce)())

    with torch.no_grad():
        return {"rms_times_3": size(rms, 3 * X), "rms_plus_3": size(rms, X + 3),
                "ln_times_3": size(layer, 3 * X), "ln_plus_3": size(layer, X + 3)}


def _eps_difference(s: float, dtype=torch.float32) -> float:
    """The relative difference between RMSNorm(eps=1e-5) and RMSNorm(eps=1e-6) on a token of RMS s."""
    from ..norms import RMSNorm

    x = torch.full((1, 64), s, dtype=dtype)
    a, b = RMSNorm(64, eps=1e-5).to(dtype), RMSNorm(64, eps=1e-6).to(dtype)
    with torch.no_grad():
        return float((a(x) - b(x)).norm() / b(x).norm())


def _eps_differences() -> dict:
    """5.2: the measured differences at RMS 0.01 and 0.1, and the RMS where the difference is 1%."""
    low, high = 1e-3, 1.0  # the difference falls with s: bisect on log s, in float64
    for _ in range(60):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if _eps_difference(mid, torch.float64) > 0.01 else (low, mid)
    return {"diff_at_0.01": _eps_difference(0.01), "diff_at_0.1": _eps_difference(0.1),
            "rms_at_1_percent": math.sqrt(low * high)}


def _sequential_sum(X: torch.Tensor) -> torch.Tensor:
    """The last dimension of X added one entry at a time, the running sum kept in X.dtype."""
    total = X.new_zeros(*X.shape[:-1], 1)
    for i in range(X.shape[-1]):
        total = total + X[..., i:i + 1]
    return total


def _sequential_bfloat16(tree: bool = False, every_token: bool = False, swapped: bool = False) -> dict:
    """5.3: RMSNorm with a sequential bfloat16 sum of squares, at RMS 1 and d = 4096 (``tree``: the chapter's
    pairwise sum instead; ``every_token``: the running sums' mean over the tokens; ``swapped``: relative_error's
    arguments in the other order; wrong answers hints aim at)."""
    from ..chapters.ch05_rmsnorm import EPS, half_precision_sum, relative_error
    from ..norms import RMSNorm

    torch.manual_seed(0)
    X = torch.randn(32, 4096).bfloat16()
    sums = half_precision_sum(X * X) if tree else _sequential_sum(X * X)
    Y = X * torch.rsqrt(sums / X.shape[-1] + EPS)
    with torch.no_grad():
        reference = RMSNorm(4096)(X.float())
        error = relative_error(reference, Y) if swapped else relative_error(Y, reference)
    return {"error": error, "sum_of_squares": float(sums.float().mean() if every_token else sums[0])}


def _gain_orders(gain_first: bool = False, one_plus: bool = False, product_in_float32: bool = False,
                 no_upcast: bool = False) -> float:
    """5.4: how often Llama's order (round, then gain) and Gemma 3's (gain, then round) differ in bfloat16
    (``gain_first``: with g drawn before X; ``one_plus``: with Gemma's 1 + g in both orders;
    ``product_in_float32``: Llama's product left unrounded; ``no_upcast``: Llama's token normalized in
    bfloat16 throughout; mistakes)."""
    from ..chapters.ch05_rmsnorm import EPS

    torch.manual_seed(0)
    if gain_first:
        g = torch.empty(512).uniform_(0.5, 1.5).bfloat16()
    X = torch.randn(64, 512).bfloat16()
    if not gain_first:
        g = torch.empty(512).uniform_(0.5, 1.5).bfloat16()
    X32 = X.float()
    normalized = X32 * torch.rsqrt(X32.pow(2).mean(dim=-1, keepdim=True) + EPS)
    if one_plus:  # Gemma's code stores w and multiplies by 1 + w: here g took w's place, in both orders
        llama, gemma = normalized.bfloat16() * (1 + g), (normalized * (1 + g.float())).bfloat16()
    else:
        llama, gemma = normalized.bfloat16() * g, (normalized * g.float()).bfloat16()
    if product_in_float32:
        llama = normalized.bfloat16().float() * g.float()
    if no_upcast:
        llama = X * torch.rsqrt(X.pow(2).mean(dim=-1, keepdim=True) + EPS) * g
    return float((llama != gemma).float().mean())


@functools.cache
def _lower_rate_run():
    from ..chapters.ch05_rmsnorm import norm_comparison
    from ..data import python_reference_corpus

    return norm_comparison(python_reference_corpus(), seeds=(0, 1), lr=0.005, batch_size=8)


def _lower_rate(seed: int | None = None) -> dict:
    """5.5: the mean validation losses of both norms at half the chapter's rate, batches of 8 (``seed``: that
    seed's losses alone, a wrong answer a hint aims at)."""
    run = _lower_rate_run()
    if seed is not None:
        return {norm: run.val_loss[norm][run.seeds.index(seed)] for norm in ("layer", "rms")}
    return {"layer": run.mean("layer"), "rms": run.mean("rms")}


def _partial_rms(measure: str = "distance") -> dict:
    """5.6: how far partial RMSNorm (the first 32 of 512 features) lands from RMSNorm: the mean over
    tokens of ||y_p - y|| / ||y||; ``measure`` names a wrong way to measure it (for the hints):
    ``"worst"`` (the largest over tokens, as ``relative_error`` takes), ``"median"`` (the median over
    tokens), ``"whole"`` (one ratio of whole tensors), ``"ratio"`` (||y_p|| / ||y||), ``"undivided"``
    (||y_p - y|| alone), ``"mismatched"`` (y of the unscaled tokens against y_p of the scaled ones),
    ``"sum"`` (the partial statistic a sum of the 32 squares, not their mean), ``"last"`` (the statistic
    of the last 32), ``"scaled_last"`` (the last 32 features scaled by 10, not the first)."""
    from ..chapters.ch05_rmsnorm import EPS

    def norms(X, k=32):
        y = X * torch.rsqrt(X.pow(2).mean(dim=-1, keepdim=True) + EPS)
        read = X[..., -k:] if measure == "last" else X[..., :k]
        partial = read.pow(2).sum(dim=-1, keepdim=True) if measure == "sum" else read.pow(2).mean(dim=-1, keepdim=True)
        return y, X * torch.rsqrt(partial + EPS)

    def distance(y, y_p):
        if measure in ("worst", "median"):
            ratios = (y_p - y).norm(dim=-1) / y.norm(dim=-1)
            return float(ratios.max() if measure == "worst" else ratios.median())
        if measure == "whole":
            return float((y_p - y).norm() / y.norm())
        if measure == "ratio":
            return float((y_p.norm(dim=-1) / y.norm(dim=-1)).mean())
        if measure == "undivided":
            return float((y_p - y).norm(dim=-1).mean())
        return float(((y_p - y).norm(dim=-1) / y.norm(dim=-1)).mean())

    torch.manual_seed(0)
    X = torch.randn(256, 512)
    large = X.clone()
    large[:, slice(-32, None) if measure == "scaled_last" else slice(0, 32)] *= 10
    (y, y_p), (y_large, y_p_large) = norms(X), norms(large)
    return {"random": distance(y, y_p),
            "large_first": distance(y if measure == "mismatched" else y_large, y_p_large)}


EXERCISES = [
    Exercise("5.1", "(rms_times_3, rms_plus_3, ln_times_3, ln_plus_3): four largest output differences",
             kind="numbers", expected=_scale_and_shift,
             names=("rms_times_3", "rms_plus_3", "ln_times_3", "ln_plus_3"), rel=0.01, abs=1e-6,
             order="the order is (rms_times_3, rms_plus_3, ln_times_3, ln_plus_3): RMSNorm's two first",
             hints=[(lambda a, e: a["ln_plus_3"] > 0.1,
                     "ln_plus_3: compute norm(X + 3) - norm(X) with nn.LayerNorm(64), adding 3 to every feature"),
                    (lambda a, e: a["rms_plus_3"] < 0.1,
                     "RMSNorm subtracts no mean: add 3 to every feature (X + 3) and compare "
                     "d2lmini.RMSNorm(64)'s outputs"),
                    (lambda a, e: max(a["rms_times_3"], a["ln_times_3"]) > 1e-3,
                     "multiply the whole token (3 * X), not one feature"),
                    (lambda a, e: min(a["rms_times_3"], a["ln_times_3"]) < 1e-7,
                     "the x3 shifts are small but not 0: eps weighs less against a mean square nine times "
                     "larger. Measure them"),
                    (lambda a, e: 0 < min(a[k] / e[k] for k in e) and max(a[k] / e[k] for k in e)
                     < min(1.2 * a[k] / e[k] for k in e) < 0.9,
                     "each is the same fraction of the right difference: hand in the largest absolute "
                     "difference itself, not divided by anything"),
                    (lambda a, e: all(abs(a[k] - v) < 0.05 * v for k, v in _scale_and_shift("mean").items()),
                     "each is the largest change over the entries, .abs().max(), not the mean"),
                    (lambda a, e: any(all(abs(a[k] - v) < 0.05 * v for k, v in _scale_and_shift(r).items())
                                      for r in ("norm", "relative")),
                     "each is the largest change of one entry, (norm(changed X) - norm(X)).abs().max(), not a "
                     "norm of the whole change"),
                    (lambda a, e: abs(a["ln_times_3"] - _scale_and_shift(ln_eps=1e-6)["ln_times_3"]) < 1e-9
                     and abs(a["rms_times_3"] - e["rms_times_3"]) < 1e-9,
                     "ln_times_3: nn.LayerNorm(64)'s eps is 1e-5, its default; yours has 1e-6"),
                    (lambda a, e: all(abs(a[k] - v) < 0.01 * v + 1e-9 for k, v in _scale_and_shift(seed=1).items()),
                     "another draw: X = torch.randn(8, 64) right after torch.manual_seed(0)"),
                    (lambda a, e: a["rms_times_3"] > 4 * e["rms_times_3"],
                     "rms_times_3: is your RMSNorm's eps 1e-6, d2lmini.RMSNorm(64)'s? With Llama 3's 1e-5 the shift "
                     "is about ten times larger"),
                    (lambda a, e: a["rms_times_3"] < e["rms_times_3"] / 2,
                     "rms_times_3: is your RMSNorm's eps 1e-6? torch.nn.RMSNorm(64)'s default, eps=None, is "
                     "float32's machine epsilon, 1.19e-7; d2lmini.RMSNorm(64) has 1e-6"),
                    (lambda a, e: 0.2 < a["rms_plus_3"] / e["rms_plus_3"] < 5
                     and not math.isclose(a["rms_plus_3"], e["rms_plus_3"], rel_tol=0.01),
                     "rms_plus_3 is measured, not estimated: the largest |RMSNorm(X + 3) - RMSNorm(X)| over "
                     "every entry of the 8 tokens, with d2lmini.RMSNorm(64) (gain 1) and X drawn right after "
                     "torch.manual_seed(0)")],
             hint="each difference named above is the largest entry of |norm(changed X) - norm(X)| over the "
                  "8 tokens of X = torch.randn(8, 64) drawn right after torch.manual_seed(0), with "
                  "d2lmini.RMSNorm(64) or nn.LayerNorm(64)",
             wrong=[lambda e: {**e, "rms_plus_3": e["ln_plus_3"], "ln_plus_3": e["rms_plus_3"]},
                    lambda e: {**e, "rms_plus_3": e["rms_plus_3"] / 3},
                    lambda e: {**e, "rms_plus_3": 2.0},
                    lambda e: {**e, "rms_times_3": 0.0, "ln_times_3": 0.0, "ln_plus_3": 0.0},
                    lambda e: {**e, "rms_times_3": 4.8e-7}, lambda e: _scale_and_shift("mean"),
                    lambda e: {**e, "rms_times_3": 1.74e-5}, lambda e: {k: 0.29 * v for k, v in e.items()},
                    lambda e: _scale_and_shift("norm"), lambda e: _scale_and_shift("relative")]),
    Exercise("5.2", "(diff_at_0.01, diff_at_0.1, rms_at_1_percent): two relative differences and an RMS",
             kind="numbers", expected=_eps_differences,
             names=("diff_at_0.01", "diff_at_0.1", "rms_at_1_percent"), rel=0.02,
             hints=[(lambda a, e: a["diff_at_0.01"] > 2 * e["diff_at_0.01"]
                     and abs(a["diff_at_0.01"] / e["diff_at_0.01"] / (a["diff_at_0.1"] / e["diff_at_0.1"]) - 1) < 0.05,
                     "those are the differences' norms: divide each by y_b.norm(), a relative difference"),
                    (lambda a, e: abs(a["rms_at_1_percent"] - math.sqrt(1e-5 / 0.02)) < 2e-4,
                     "the difference comes from eps_a - eps_b = 9e-6, not from eps_a alone"),
                    (lambda a, e: abs(a["rms_at_1_percent"] - e["rms_at_1_percent"] ** 2) < 0.1 * e["rms_at_1_percent"] ** 2,
                     "the difference falls like 1/s**2: solve for s**2, then take the square root"),
                    (lambda a, e: abs(a["diff_at_0.01"] - (1e-5 - 1e-6) / (2 * 0.01**2)) < 1e-3,
                     "that is the first-order formula; at RMS 0.01 the mean square is only ten times "
                     "eps_a, so measure the two norms' outputs instead"),
                    (lambda a, e: abs(a["diff_at_0.01"] - e["diff_at_0.01"] / (1 - e["diff_at_0.01"]))
                     < 0.01 * e["diff_at_0.01"],
                     "divide by the norm of the eps=1e-6 output, not of the eps=1e-5 one"),
                    (lambda a, e: abs(a["rms_at_1_percent"] - e["rms_at_1_percent"] * math.sqrt(2)) < 0.05 * e["rms_at_1_percent"],
                     "the difference is (eps_a - eps_b) / (2 s**2): keep the 2 when you solve it for s (or, if you "
                     "scanned values of s, scan finer)"),
                    (lambda a, e: a["rms_at_1_percent"] == 0.01,
                     "rms_at_1_percent is the RMS s of the token at which the relative difference falls to 1%, "
                     "not the 1% itself"),
                    (lambda a, e: abs(a["rms_at_1_percent"] - e["rms_at_1_percent"] / 10) < 0.05 * a["rms_at_1_percent"],
                     "rms_at_1_percent: 1% is a relative difference of 0.01, not 1"),
                    (lambda a, e: 0.02 < abs(a["rms_at_1_percent"] / e["rms_at_1_percent"] - 1) < 0.1,
                     "rms_at_1_percent: close, but the crossing lies between your grid's points: scan finer, or "
                     "solve (eps_a - eps_b) / (2 s**2) = 0.01 for s")],
             wrong=[lambda e: {**e, "diff_at_0.01": 100 * e["diff_at_0.1"]},
                    lambda e: {**e, "rms_at_1_percent": e["rms_at_1_percent"] ** 2},
                    lambda e: {**e, "rms_at_1_percent": e["rms_at_1_percent"] * math.sqrt(2)},
                    lambda e: {"diff_at_0.01": 100 * e["diff_at_0.01"], "diff_at_0.1": 100 * e["diff_at_0.1"],
                               "rms_at_1_percent": e["rms_at_1_percent"]},
                    lambda e: {**e, "rms_at_1_percent": math.sqrt(1e-5 / 0.02)},
                    lambda e: {**e, "rms_at_1_percent": math.sqrt(9e-6 / 2)},
                    lambda e: {**e, "rms_at_1_percent": round(e["rms_at_1_percent"] * 1.05, 3)}]),
    Exercise("5.3", "(error, sum_of_squares): the relative error at RMS 1 and the first token's running sum",
             kind="numbers", expected=_sequential_bfloat16, names=("error", "sum_of_squares"), rel=0.01,
             hints=[(lambda a, e: all(abs(a[k] - v) < 0.01 * v for k, v in _sequential_bfloat16(tree=True).items()),
                     "that is the chapter's pairwise tree, half_precision_sum: add one square at a time in a "
                     "loop, rounding the running sum to bfloat16 after each"),
                    (lambda a, e: a["sum_of_squares"] == e["sum_of_squares"]
                     and abs(a["error"] - _sequential_bfloat16(tree=True)["error"]) < 1e-4,
                     "error: normalize with your loop's running sum; rms_norm_no_upcast sums in the pairwise tree"),
                    (lambda a, e: abs(a["error"] - _sequential_bfloat16(swapped=True)["error"]) < 1e-4,
                     "error: relative_error(Y, reference), your output first, the float32 RMSNorm's second"),
                    (lambda a, e: a["sum_of_squares"] > 8 * e["sum_of_squares"]
                     or abs(a["sum_of_squares"] - _sequential_bfloat16(every_token=True)["sum_of_squares"]) < 1,
                     "sum_of_squares: the first token's running sum only, not every token's added up or averaged"),
                    (lambda a, e: a["error"] < 0.05 or a["sum_of_squares"] > 3000,
                     "the running sum must be rounded to bfloat16 after every addition (torch.sum and "
                     "torch.cumsum accumulate in float32): add one square at a time to a bfloat16 tensor"),
                    (lambda a, e: a["sum_of_squares"] < 100,
                     "hand in the sum of the first token's 4096 squares, before dividing by d"),
                    (lambda a, e: 1000 < a["sum_of_squares"] < 8000 and a["sum_of_squares"] != e["sum_of_squares"],
                     "sum_of_squares: the first token's running sum, sums[0], of X drawn right after "
                     "torch.manual_seed(0)")],
             wrong=[lambda e: {"error": 0.004, "sum_of_squares": 4040.0},
                    lambda e: {**e, "sum_of_squares": e["sum_of_squares"] / 4096},
                    lambda e: {**e, "sum_of_squares": 32 * e["sum_of_squares"]}, lambda e: _sequential_bfloat16(True),
                    lambda e: _sequential_bfloat16(every_token=True)]),
    Exercise("5.4", "the fraction of outputs in which the two orders differ, one number", expected=_gain_orders,
             rel=2e-3,  # the same on torch 2.11 and 2.13; g drawn first gives 0.3% more
             hints=[(lambda a, e: a < 0.01,
                     "the orders must round at different places: Llama's rounds the normalized token to "
                     "bfloat16 and then multiplies by g (rounding again), Gemma 3's multiplies in float32 "
                     "and rounds once"),
                    (lambda a, e: a > 1, "a fraction between 0 and 1 (the differing outputs over all of them), "
                                        "not a count"),
                    (lambda a, e: a == 1,
                     "every output differs: round Gemma's float32 product to bfloat16 once, at the end, compare "
                     "entry by entry (64 x 512 of them), not token by token, and multiply by g itself (not "
                     "Gemma's 1 + g): only the place of the rounding may differ"),
                    (lambda a, e: abs(a - (1 - e)) < 0.02,
                     "hand in the fraction of outputs that differ, not of those that agree"),
                    (lambda a, e: abs(a - _gain_orders(one_plus=True)) < 1e-3,
                     "multiply by g itself in both orders, not Gemma's stored 1 + g: the orders differ only in "
                     "where they round"),
                    (lambda a, e: abs(a - _gain_orders(gain_first=True)) < 1e-4,
                     "draw X first, right after torch.manual_seed(0), then g"),
                    (lambda a, e: abs(a - _gain_orders(product_in_float32=True)) < 0.01,
                     "Llama's product of two bfloat16 tensors is itself bfloat16, rounded: compare the two "
                     "outputs in bfloat16, not Llama's product in float32"),
                    (lambda a, e: abs(a - _gain_orders(no_upcast=True)) < 0.01,
                     "both orders normalize in float32 (the upcast, as MyRMSNorm does); they differ only in "
                     "where the product with g is rounded")],
             wrong=[lambda e: 0.0, lambda e: 1 - e, lambda e: 100 * e, lambda e: _gain_orders(gain_first=True),
                    lambda e: _gain_orders(one_plus=True), lambda e: _gain_orders(product_in_float32=True),
                    lambda e: _gain_orders(no_upcast=True)]),
    Exercise("5.5", "(layer, rms): the two norms' mean validation losses, nats per character",
             kind="numbers", expected=_lower_rate, names=("layer", "rms"), rel=0, abs=2e-3, slow=True,
             hints=[(lambda a, e: abs(a["layer"] * math.log(2) - e["layer"]) < 0.02,
                     "the losses are in nats per character, not bits"),
                    (lambda a, e: abs(a["layer"] / 2 - e["layer"]) < 0.02,
                     "hand in the mean over the two seeds (run.mean), not the sum"),
                    (lambda a, e: any(all(abs(a[n] - v) < 1e-3 for n, v in _lower_rate(seed).items())
                                      for seed in (0, 1)),
                     "that is one seed's: hand in the mean over the two seeds, run.mean('layer') and "
                     "run.mean('rms')")],
             hint="Rerun norm_comparison with exactly seeds=(0, 1), lr=0.005 and batch_size=8, "
                  "and hand in run.mean('layer') and run.mean('rms').",
             wrong=[lambda e: {k: v / math.log(2) for k, v in e.items()},
                    lambda e: {k: 2 * v for k, v in e.items()}, lambda e: _lower_rate(seed=0)]),
    Exercise("5.6", "(random, large_first): the mean relative distance from RMSNorm, for both kinds of tokens",
             kind="numbers", expected=_partial_rms, names=("random", "large_first"), rel=2e-4,
             hints=[(lambda a, e: abs(a["random"] - 3) < 0.3,
                     "the partial RMS is the root of the mean of the first 32 squares: divide their sum by 32, "
                     "not by d = 512"),
                    (lambda a, e: abs(a["large_first"] - e["large_first"]) < 0.01 * e["large_first"]
                     and abs(a["random"] - a["large_first"]) < 0.01 * e["large_first"],
                     "random is measured on the tokens as drawn: scale a copy, large = X.clone(), not X in place"),
                    (lambda a, e: abs(a["large_first"] - a["random"]) < 0.05,
                     "multiply the first 32 features of every token by 10 before normalizing it "
                     "with both norms"),
                    (lambda a, e: all(abs(a[k] - v) < 0.03 * v for k, v in _partial_rms("last").items()),
                     "the partial RMS reads the first 32 features, X[..., :32], the ones scaled by 10"),
                    (lambda a, e: all(abs(a[k] - v) < 0.02 * v for k, v in _partial_rms("worst").items()),
                     "that is the worst token's distance (relative_error takes the largest over the tokens): "
                     "hand in the mean over the 256 tokens of ||y_p - y|| / ||y||"),
                    (lambda a, e: all(abs(a[k] - v) < 0.01 * v for k, v in _partial_rms("median").items()),
                     "that is the median over the tokens: hand in the mean of ||y_p - y|| / ||y|| over the 256"),
                    (lambda a, e: all(abs(a[k] - v) < 0.01 * v for k, v in _partial_rms("scaled_last").items()),
                     "scale the first 32 features, X[:, :32], the ones the partial RMS reads, not the last"),
                    (lambda a, e: a["random"] > 1 and a["large_first"] > 1,
                     "divide each token's ||y_p - y|| by ||y||, the norm of RMSNorm's output"),
                    (lambda a, e: abs(a["random"] - _partial_rms("sum")["random"]) < 0.02,
                     "the partial RMS is the root of the mean of the first 32 squares: divide their sum by 32"),
                    (lambda a, e: a["large_first"] > 1,
                     "divide by the norm of RMSNorm's output, not of the partial norm's"),
                    (lambda a, e: abs(a["random"] - _partial_rms("whole")["random"]) < 0.02 * a["random"],
                     "random: take each token's ||y_p - y|| / ||y||, then the mean over the tokens, not one "
                     "ratio of the whole tensors"),
                    (lambda a, e: abs(a["large_first"] - _partial_rms("ratio")["large_first"]) < 0.02,
                     "the distance is ||y_p - y|| / ||y||, not the ratio ||y_p|| / ||y||"),
                    (lambda a, e: abs(a["large_first"] - _partial_rms("mismatched")["large_first"]) < 0.02,
                     "large_first: compare y and y_p of the same tokens, both computed after scaling their "
                     "first 32 features"),
                    (lambda a, e: all(0.8 < a[k] / v < 1.25 for k, v in e.items()),
                     "close, but not the run's: read exactly the first 32 features, X[..., :32], scale exactly "
                     "those by 10, and draw X right after torch.manual_seed(0)")],
             wrong=[lambda e: {**e, "large_first": 1 / (1 - e["large_first"]) - 1},
                    lambda e: {**e, "large_first": e["random"]}, lambda e: {"random": 3.068, "large_first": 0.076},
                    lambda e: _partial_rms("whole"), lambda e: _partial_rms("ratio"), lambda e: _partial_rms("undivided"),
                    lambda e: _partial_rms("sum"),
                    lambda e: {**e, "large_first": _partial_rms("mismatched")["large_first"]},
                    lambda e: _partial_rms("last"), lambda e: _partial_rms("worst"), lambda e: _partial_rms("median")]),
]
