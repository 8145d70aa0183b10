"""Self-checks of chapter 4's exercises (Where the norm goes: post-LN, pre-LN and after).

Every expected answer is computed here from the settings each exercise names: the depth probes with
:func:`d2lmini.chapters.ch04_norm_placement.probe_placements` (in float64 and from seed 0, as in the
chapter, unless the exercise says otherwise) and the character models with
:func:`d2lmini.chapters.ch04_norm_placement.train_placements` (the chapter's high peak rate 0.003, 100 steps).
The two training exercises take the runs themselves: their checks compare each run's settings with
the exercise's and train its first steps again.
"""

from __future__ import annotations

import math
import numbers
from functools import lru_cache

import torch

from . import Exercise

DEPTH = 32
#: The chapter's high peak rate (HIGH there).
RATE = 3e-3
#: Exercise 4.3's sequence lengths and seeds, and the depth of its stacks.
LENGTHS, SEEDS, SHORT_DEPTH = (16, 256), (0, 1, 2), 16
#: Exercise 4.7's depths.
SANDWICH_DEPTHS = (8, 32)


def _ch04():
    from ..chapters import ch04_norm_placement

    return ch04_norm_placement


@lru_cache(maxsize=None)
def _probes(norm: str = "layer", init: str = "xavier_uniform", dtype: str = "float64", depth: int = DEPTH,
            placements: tuple = ("post", "pre")):
    return _ch04().probe_placements(depth, placements=placements, norm=norm, init=init,
                                    dtype=getattr(torch, dtype), seed=0)


def _close_all(answer: dict, other: dict, rel: float) -> bool:
    return all(math.isclose(answer[k], other[k], rel_tol=rel) for k in answer)


def _swapped(values: dict) -> dict:
    first, second = values
    return {first: values[second], second: values[first]}


# ------------------------------------------------------------------------------------- 4.1 and 4.2

SPREADS = ("post-LN spread", "pre-LN spread")


def _spreads(norm: str = "rms") -> dict[str, float]:
    probes = _probes(norm)
    return {SPREADS[0]: probes["post"].token_spread[DEPTH], SPREADS[1]: probes["pre"].token_spread[DEPTH]}


INIT_NAMES = ("pre-LN RMS", "post-LN spread")


def _init_effect(init: str = "torch_default") -> dict[str, float]:
    probes = _probes(init=init)
    return {INIT_NAMES[0]: probes["pre"].stream_rms[DEPTH], INIT_NAMES[1]: probes["post"].token_spread[DEPTH]}


# ------------------------------------------------------------------------------------- 4.3

LENGTH_NAMES = tuple(f"n={n}" for n in LENGTHS)


@lru_cache(maxsize=None)
def _short_spread(num_steps: int, seed: int) -> float:
    from ..probes import probe_depth

    probe = probe_depth("post", norm="layer", depth=SHORT_DEPTH, num_steps=num_steps, seed=seed, dtype=torch.float64)
    return probe.token_spread[SHORT_DEPTH]


def _spread_by_length(seeds=SEEDS) -> dict[str, float]:
    return {name: sum(_short_spread(n, seed) for seed in seeds) / len(seeds) for name, n in zip(LENGTH_NAMES, LENGTHS)}


def _reversed(values: dict) -> dict:
    return dict(zip(values, reversed(list(values.values()))))


# ------------------------------------------------------------------------------------- 4.4

RATIO_NAMES = ("float32", "float64")


def _ratios() -> dict[str, float]:
    return {dtype: _probes(dtype=dtype, placements=("post",))["post"].qk_vo_ratio(DEPTH) for dtype in RATIO_NAMES}


# ------------------------------------------------------------------------------------- 4.5 and 4.6

def _corpus():
    from ..data import python_reference_corpus

    return python_reference_corpus()


#: Exercise 4.5's and 4.6's runs: the :func:`train_placements` arguments besides ``corpus`` (one seed, the
#: chapter's 100 steps of 8 windows of 64 characters). 4.5: is it the depth or the rate? 8 blocks at the
#: chapter's high rate. 4.6: does clipping hide or cause the stall? 16-block post-LN without it.
RATE_RUN = dict(num_layers=8, lr=RATE, runs=(("post", 1), ("pre", 1)), warmup_steps=0, seeds=(0,), clip_norm=1.0)
CLIP_RUN = dict(num_layers=16, lr=RATE, runs=(("post", 1),), warmup_steps=0, seeds=(0,), clip_norm=None)
NUM_STEPS = 100
#: The first training steps that the checks of 4.5 and 4.6 train again and compare, loss by loss.
CHECKED_STEPS = 2  # a step's loss is measured before its update, so the first two losses do not depend on the schedule's length


def _describe(spec: dict) -> str:
    runs = ", ".join(f"(\"{placement}\", {scale:g})" for placement, scale in spec["runs"])
    runs = f"({runs},)" if len(spec["runs"]) == 1 else f"({runs})"
    return (f"train_placements(corpus, num_layers={spec['num_layers']}, lr=HIGH, runs={runs}, seeds=(0,)"
            + (", clip_norm=None)" if spec["clip_norm"] is None else ")"))


def _training_judge(exercise_id: str, spec: dict):
    """A judge of the list of :class:`~d2lmini.train.TrainResult` that ``train_placements`` returned.

    It checks every run's settings against the exercise's, then trains the same models for the first
    :data:`CHECKED_STEPS` steps and compares their losses with the answer's first ones: the same model,
    data and rate give the same losses (the later ones follow the cosine schedule of the whole run,
    which a shorter run does not share; training all the steps again would double the exercise's time)."""
    call = _describe(spec)

    def judge(answer):
        from ..train import TrainResult

        if isinstance(answer, TrainResult):
            answer = [answer]
        if type(answer).__name__ in ("DataFrame", "Styler", "Series"):  # a table made from the results
            return (f"hand in the list of results that {call} returns, not a table made from them "
                    f"(training_table(results) and plot_training(results) read that list)")
        if isinstance(answer, numbers.Real) or (isinstance(answer, (list, tuple)) and answer
                                                 and all(isinstance(r, numbers.Real) for r in answer)):
            return (f"these are numbers: hand in the results themselves, the list that {call} returns, "
                    f"not their losses")
        if not isinstance(answer, (list, tuple)) or not all(isinstance(r, TrainResult) for r in answer):
            raise ValueError(f"exercise {exercise_id}: the answer must be the list of results that {call} returns, "
                             f"got {type(answer).__name__}")
        if len(answer) != len(spec["runs"]):
            return f"hand in the {len(spec['runs'])} result(s) of {call}, not {len(answer)}"
        for result, (placement, scale) in zip(answer, spec["runs"]):
            config = result.config
            if config.get("num_layers") != spec["num_layers"]:
                return f"the exercise trains {spec['num_layers']} blocks: num_layers={spec['num_layers']}"
            if config.get("placement") != placement or not math.isclose(config.get("lr", 0.0), RATE * scale,
                                                                         rel_tol=1e-9):
                return f"run {placement}-LN at {RATE * scale:g}, in the order of the exercise: {call}, with HIGH = {RATE:g}"
            if config.get("warmup_steps") != spec["warmup_steps"]:
                return "this exercise trains without warm-up: warmup_steps=0"
            if config.get("clip_norm") != spec["clip_norm"]:
                return (f"this exercise clips at clip_norm={spec['clip_norm']}" if spec["clip_norm"] is not None
                        else "this exercise trains without clipping: clip_norm=None")
            if config.get("seed") != 0 or config.get("num_steps") != NUM_STEPS:
                return f"train the one seed 0, seeds=(0,), for the chapter's num_steps={NUM_STEPS}"
        short = _ch04().train_placements(_corpus(), **dict(spec, num_steps=CHECKED_STEPS, eval_batches=1))
        for result, again in zip(answer, short):
            if len(result.train_loss) != NUM_STEPS or not all(
                    math.isclose(a, b, rel_tol=1e-5) for a, b in zip(result.train_loss, again.train_loss)):
                return (f"these runs did not train the chapter's models on the chapter's data: call {call} "
                        f"with corpus = python_reference_corpus()")
        return None

    return judge


def _fake_results(spec: dict, **change) -> list:
    """Results of runs with other settings than the exercise's (what the checks must reject), without training."""
    from ..train import TrainResult

    results = []
    for placement, scale in spec["runs"]:
        config = dict(placement=placement, num_layers=spec["num_layers"], lr=RATE * scale,
                      warmup_steps=spec["warmup_steps"], seed=0, num_steps=NUM_STEPS, clip_norm=spec["clip_norm"])
        config.update(change)
        results.append(TrainResult(config, [3.0] * NUM_STEPS, [NUM_STEPS], [3.0], [RATE * scale] * NUM_STEPS))
    return results


def _results_table(results: list):
    """The chapter's table of ``results``, a DataFrame: what a reader may hand in instead of the list."""
    return _ch04().training_table(results)


# ------------------------------------------------------------------------------------- 4.7

SANDWICH_NAMES = tuple(f"{name} L={depth}" for depth in SANDWICH_DEPTHS for name in ("sandwich", "scaled"))


def _sandwich_rms() -> dict[str, float]:
    values = []
    for depth in SANDWICH_DEPTHS:
        probes = _probes(depth=depth, placements=("sandwich", "sandwich_scaled"))
        values += [probes["sandwich"].stream_rms[depth], probes["sandwich_scaled"].stream_rms[depth]]
    return dict(zip(SANDWICH_NAMES, values))


def _read_off_deeper() -> dict[str, float]:
    """The answer with depth 8's numbers read at block 8 of the 32-block stacks (a mistake)."""
    probes = _probes(depth=SANDWICH_DEPTHS[-1], placements=("sandwich", "sandwich_scaled"))
    shallow = SANDWICH_DEPTHS[0]
    return {**_sandwich_rms(), SANDWICH_NAMES[0]: probes["sandwich"].stream_rms[shallow],
            SANDWICH_NAMES[1]: probes["sandwich_scaled"].stream_rms[shallow]}


def _pairs_swapped(values: dict) -> dict:
    a, b, c, d = values.values()
    return dict(zip(values, (b, a, d, c)))


EXERCISES = [
    Exercise(
        "4.1", "post-LN's and pre-LN's token spread after block 32 with RMSNorm, as (post, pre)",
        kind="numbers", names=SPREADS, expected=_spreads, rel=0.005, order="post-LN first, then pre-LN",
        hints=[(lambda a, e: _close_all(a, _spreads("layer"), 0.005),
                "these are LayerNorm's spreads: pass norm=\"rms\" to probe_placements"),
               (lambda a, e: math.isclose(a[SPREADS[0]], 1.0, rel_tol=1e-3),
                "1 is post-LN's stream RMS; hand in the token spread column")],
        hint="probe 32 blocks as the chapter does (dtype=torch.float64, seed=0) with norm=\"rms\", and read "
             "token_spread[32]",
        wrong=[lambda e: _spreads("layer"), _swapped]),
    Exercise(
        "4.2", "pre-LN's stream RMS and post-LN's token spread after block 32 with init=\"torch_default\"",
        kind="numbers", names=INIT_NAMES, expected=_init_effect, rel=0.01,
        hints=[(lambda a, e: _close_all(a, _init_effect("xavier_uniform"), 0.01),
                "these are the Xavier-uniform values: pass init=\"torch_default\" to probe_placements"),
               (lambda a, e: math.isclose(a[INIT_NAMES[0]], 1.0, rel_tol=1e-3),
                "post-LN's RMS is pinned at 1; hand in pre-LN's")],
        hint="probe 32 blocks (norm=\"layer\", dtype=torch.float64, seed=0) with init=\"torch_default\", and read "
             "stream_rms[32] of pre-LN and token_spread[32] of post-LN",
        wrong=[lambda e: _init_effect("xavier_uniform"), lambda e: {**e, INIT_NAMES[0]: 1.0}, _swapped]),
    Exercise(
        "4.3", "post-LN's token spread after block 16 of a 16-block stack, the mean over seeds 0, 1 and 2, for "
               "16 and for 256 tokens",
        kind="numbers", names=LENGTH_NAMES, expected=_spread_by_length, rel=0.01,
        order="the order is 16 tokens, then 256",
        hints=[(lambda a, e: _close_all(a, _spread_by_length((0,)), 0.01), "average over the three seeds 0, 1 and 2"),
               (lambda a, e: _close_all(a, {k: 3 * v for k, v in e.items()}, 0.01),
                "the mean over the three seeds: divide their sum by 3")],
        hint="probe 16-block stacks, d2lmini.probe_depth(\"post\", depth=16, num_steps=n, seed=seed, "
             "dtype=torch.float64), and average token_spread[16] over the seeds 0, 1 and 2",
        wrong=[lambda e: _spread_by_length((0,)), _reversed, lambda e: {k: 3 * v for k, v in e.items()}]),
    Exercise(
        "4.4", "post-LN's q,k : v,o ratio at block 32 in float32 and in float64, as (float32, float64)",
        kind="numbers", names=RATIO_NAMES, expected=_ratios,
        rel={"float32": 0.5, "float64": 0.02},  # float32's is rounding: 1.2e-7 to 2.0e-7 by processor
        order="float32's ratio first, then float64's",
        hints=[(lambda a, e: _close_all(a, {k: 1 / v for k, v in e.items()}, 0.02),
                "the ratio puts queries and keys on top: qk_vo_ratio(32)"),
               (lambda a, e: math.isclose(a["float32"], a["float64"], rel_tol=0.02),
                "your two ratios agree: the dtypes part only where the tokens have collapsed, at block 32 of "
                "the 32-block post-LN stack; read its qk_vo_ratio(32) once with each dtype")],
        hint="probe the post-LN stack of 32 blocks (norm=\"layer\", seed=0) once with dtype=torch.float32 and once "
             "with torch.float64, and read qk_vo_ratio(32)",
        wrong=[_swapped, lambda e: {k: 1 / v for k, v in e.items()}, lambda e: {k: e["float64"] for k in e}]),
    Exercise(
        "4.5", "the list of two results that train_placements returns for 8-block post-LN and pre-LN at the "
               "high rate, seed 0",
        kind="custom", judge=_training_judge("4.5", RATE_RUN),
        wrong=[lambda: _fake_results(RATE_RUN)[::-1], lambda: _fake_results(RATE_RUN, lr=RATE / 3),
               lambda: _fake_results(RATE_RUN, num_layers=16), lambda: _fake_results(RATE_RUN),
               lambda: _results_table(_fake_results(RATE_RUN)),
               lambda: [r.val_loss[-1] for r in _fake_results(RATE_RUN)],
               lambda: _fake_results(RATE_RUN)[0].val_loss[-1]]),
    Exercise(
        "4.6", "the list that train_placements returns for 16-block post-LN at the high rate without clipping, "
               "seed 0",
        kind="custom", judge=_training_judge("4.6", CLIP_RUN),
        wrong=[lambda: _fake_results(CLIP_RUN, clip_norm=1.0), lambda: _fake_results(CLIP_RUN, warmup_steps=50),
               lambda: _fake_results(CLIP_RUN, seed=1), lambda: _fake_results(CLIP_RUN)]),
    Exercise(
        "4.7", "the stream RMS after the last block of the sandwich and the depth-scaled sandwich at depth 8, "
               "then at depth 32",
        kind="numbers", names=SANDWICH_NAMES, expected=_sandwich_rms, rel=0.01,
        order="depth 8 first, then 32, and at each depth the sandwich, then the depth-scaled sandwich",
        hints=[(lambda a, e: _close_all(a, {k: v ** 2 for k, v in e.items()}, 0.01),
                "that is the mean square; the RMS is its square root"),
               (lambda a, e: abs(a[SANDWICH_NAMES[1]] - _read_off_deeper()[SANDWICH_NAMES[1]])
                < 0.01 * abs(_read_off_deeper()[SANDWICH_NAMES[1]]),
                "the depth-scaled sandwich's gain starts at 1/sqrt(L) of its own stack's L: probe an 8-block "
                "stack for depth 8, not block 8 of the 32-block one")],
        hint="probe_placements(depth, placements=(\"sandwich\", \"sandwich_scaled\"), norm=\"layer\", "
             "dtype=torch.float64) at depths 8 and 32, and read stream_rms[depth]",
        wrong=[_pairs_swapped, lambda e: {k: v ** 2 for k, v in e.items()},
               lambda e: dict(zip(e, (e[k] for k in SANDWICH_NAMES[::2] + SANDWICH_NAMES[1::2]))),
               lambda e: _read_off_deeper()]),
]
