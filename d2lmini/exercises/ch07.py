"""Self-checks of chapter 7's exercises (The feed-forward network: SwiGLU, then a mixture of experts).

Exercises 7.1-7.3 train the chapter's character model (:data:`~d2lmini.chapters.ch07_ffn.COMPARISON_CONFIG`)
for 40 or 200 steps, one seed, at its default peak rate 0.01; 7.4 measures how an FFN's output grows
when its input doubles; 7.5 reruns the chapter's router balancing with two other step sizes.
"""

from __future__ import annotations

import torch

from . import Exercise

#: Exercise 7.1's four FFNs, in the order of Shazeer's (2020) table.
RANKED_ACTS = ("relu", "gelu", "swiglu", "geglu")


def _ranking() -> dict:
    """7.1: each FFN's validation loss after 40 steps of seed 0."""
    from ..chapters import ch07_ffn as ffn

    result = ffn.ffn_comparison(acts=RANKED_ACTS, seeds=(0,), num_steps=40, eval_steps=(40,))
    return {act: result.val_loss(act, 40)[0] for act in RANKED_ACTS}


def _longer_gap() -> tuple:
    """7.2: GELU's minus SwiGLU's loss after 100 and 200 of 200 steps, seed 1."""
    from ..chapters import ch07_ffn as ffn

    result = ffn.ffn_comparison(seeds=(1,), num_steps=200, eval_steps=(100, 200))
    return result.differences(100)[0], result.differences(200)[0]


def _narrow_gelu() -> tuple:
    """7.3: the GELU MLP at SwiGLU's width 128, 40 steps of seed 0: its loss and its FFN parameters."""
    from ..chapters import ch07_ffn as ffn
    from ..data import python_reference_corpus

    run = ffn.train_ensemble(python_reference_corpus(), act="gelu", ffn_num_hiddens=128, seeds=(0,),
                             num_steps=40, eval_steps=(40,))
    return run.val_loss[0][-1], run.ffn_params


def doubling_ratio(act: str, seed: int, num_tokens: int = 256, num_hiddens: int = 48) -> float:
    """``||FFN(2X)|| / ||FFN(X)||`` for a random :class:`~d2lmini.ffn.FeedForward` and standard normal tokens.

    Args:
        act: the FFN's activation; seed: draws the weights and the ``(num_tokens, num_hiddens)`` tokens.

    Returns:
        The ratio of the Frobenius norms (2 for a function that scales with its input, 4 for one
        that grows with its square).
    """
    from ..ffn import FeedForward
    from ..seeding import seeded

    with seeded(seed), torch.no_grad():
        ffn = FeedForward(num_hiddens, act=act)
        X = torch.randn(num_tokens, num_hiddens)
        return float(ffn(2 * X).norm() / ffn(X).norm())


def _doubling() -> dict:
    """7.4: the mean doubling ratio over four draws of weights and tokens (one draw is within about 4% of it)."""
    return {act: sum(doubling_ratio(act, seed) for seed in range(4)) / 4 for act in ("relu", "gelu", "swiglu")}


def _balancing() -> tuple:
    """7.5: the most and least loaded expert after 100 bias updates with gamma 0.001, then 0.1."""
    from ..chapters import ch07_ffn as ffn

    out = []
    for gamma in (0.001, 0.1):
        loads = ffn.router_loads(gamma=gamma)["with a shared component, balanced"]
        out += [max(loads), min(loads)]
    return tuple(out)


def _each(test):
    """A hint test that holds when ``test(answer, expected)`` holds for every name of a dict answer."""
    return lambda a, e: all(test(a[k], e[k]) for k in e)


EXERCISES = [
    Exercise("7.1", "a dict {act: validation loss after 40 steps} for relu, gelu, swiglu and geglu",
             kind="numbers", names=RANKED_ACTS, expected=_ranking, rel=0, abs=0.005, slow=True,
             hints=[(_each(lambda a, e: a < e - 0.03),
                     "these losses are lower than 40 steps reach: pass num_steps=40 and read the loss at step 40"),
                    (_each(lambda a, e: a > e + 0.03),
                     "these losses are higher than the exercise's run: 40 steps at the default rate 0.01, "
                     "seed 0, read after step 40"),
                    (lambda a, e: sorted(a.values()) == sorted(e.values()) or abs(a["relu"] - e["gelu"]) < 0.005,
                     "the right losses under the wrong names: result.val_loss(act, 40)[0] for each act")],
             hint="compare each FFN's loss with result.val_loss(act, 40)[0] of "
                  "ffn_comparison(acts=..., seeds=(0,), num_steps=40, eval_steps=(40,))",
             wrong=[lambda e: {k: v - 0.1 for k, v in e.items()},
                    lambda e: {**e, "relu": e["gelu"], "gelu": e["relu"]}]),
    Exercise("7.2", "a tuple (GELU − SwiGLU after 100 steps, after 200 steps), nats per character",
             kind="numbers", names=("gap_100", "gap_200"), expected=_longer_gap, rel=0, abs=0.006, slow=True,
             hints=[(_each(lambda a, e: abs(a + e) < 0.006), "the sign: GELU's loss minus SwiGLU's, "
                                                             "positive when SwiGLU is ahead"),
                    (_each(lambda a, e: a > 1), "hand in the differences of the two losses, not the losses"),
                    (lambda a, e: abs(a["gap_100"] - e["gap_200"]) < 0.006 and abs(a["gap_200"] - e["gap_100"]) < 0.006,
                     "the order: the gap after 100 steps first")],
             hint="one run of 200 steps (its cosine schedule ends at step 200), seed 1, read at steps 100 and 200; "
                  "the chapter's 100-step run is another schedule",
             wrong=[lambda e: {k: -v for k, v in e.items()}, lambda e: {k: v + 0.03 for k, v in e.items()}]),
    Exercise("7.3", "a tuple (validation loss after 40 steps, FFN parameters of the model) for the GELU MLP of width 128",
             kind="numbers", names=("loss", "ffn_params"), expected=_narrow_gelu, rel=0, abs=0.005,
             hints=[(lambda a, e: a["ffn_params"] == 1.5 * e["ffn_params"],
                     "that is the FFN parameters of width 4d = 192: pass ffn_num_hiddens=128"),
                    (lambda a, e: a["ffn_params"] in (e["ffn_params"] / 2, e["ffn_params"] / 2 * 1.5),
                     "count the FFNs of both blocks (run.ffn_params)"),
                    (lambda a, e: a["ffn_params"] == e["ffn_params"] and a["loss"] < e["loss"] - 0.015,
                     "this loss is lower than the narrow GELU model reaches in 40 steps: did you hand in the "
                     "wide GELU's or SwiGLU's, or train longer?")],
             hint="train_ensemble(corpus, act='gelu', ffn_num_hiddens=128, seeds=(0,), num_steps=40, "
                  "eval_steps=(40,)); the loss is run.val_loss[0][-1]",
             wrong=[lambda e: {**e, "ffn_params": 1.5 * e["ffn_params"]},
                    lambda e: {**e, "loss": e["loss"] - 0.03}]),
    Exercise("7.4", "a dict {act: ||FFN(2X)|| / ||FFN(X)||} for relu, gelu and swiglu",
             kind="numbers", names=("relu", "gelu", "swiglu"), expected=_doubling, rel=0.05,
             hints=[(lambda a, e: abs(a["gelu"] - 2) < 0.01 or abs(a["swiglu"] - 2) < 0.01,
                     "run GELU and SwiGLU rather than assuming they scale like ReLU"),
                    (lambda a, e: a["relu"] < 1, "divide the norm of FFN(2X) by the norm of FFN(X), not the other way"),
                    (lambda a, e: abs(a["relu"] - 2) > 1e-3,
                     "ReLU's ratio must be 2: keep the default bias=False (a bias breaks the scaling), "
                     "and use tokens X = torch.randn(256, 48)")],
             hint="ratios of Frobenius norms, torch.linalg.norm or .norm(), for tokens X = torch.randn(256, 48)",
             wrong=[lambda e: {"relu": 2.0, "gelu": 2.0, "swiglu": 2.0},
                    lambda e: {k: 1 / v for k, v in e.items()}]),
    Exercise("7.5", "a tuple (most, least loaded with gamma=0.001, most, least loaded with gamma=0.1), "
                    "as multiples of the fair share",
             kind="numbers", names=("most_0.001", "least_0.001", "most_0.1", "least_0.1"), expected=_balancing,
             rel=0, abs=0.02,
             hints=[(lambda a, e: abs(a["most_0.001"] - e["most_0.1"]) < 0.02,
                     "the order: gamma=0.001 first, then gamma=0.1"),
                    (lambda a, e: a["most_0.001"] > 3,
                     "read the loads after the 100 updates (the key 'with a shared component, balanced')")],
             hint="router_loads(gamma=...)['with a shared component, balanced'], its max and min, for each gamma",
             wrong=[lambda e: (e["most_0.1"], e["least_0.1"], e["most_0.001"], e["least_0.001"]),
                    lambda e: {**e, "most_0.001": 3.3}]),
]
