"""Self-checks of chapter 7's exercises (The feed-forward network: SwiGLU, then a mixture of experts).

Exercises 7.1-7.3 train the chapter's character model (:data:`~d2lmini.chapters.ch07_ffn.COMPARISON_CONFIG`)
for 600 or 1,200 steps, one seed, at its default peak rate 0.02 (each a few CPU-seconds per model);
7.4 measures how an FFN's output grows when its input doubles; 7.5 reruns the chapter's router
balancing with two other step sizes.
"""

from __future__ import annotations

import math

import torch

from . import Exercise

#: Exercise 7.1's four FFNs, in the order of Shazeer's (2020) table.
RANKED_ACTS = ("relu", "gelu", "swiglu", "geglu")


def _ranking() -> dict:
    """7.1: each FFN's validation loss after 600 steps of seed 0 at the rate 0.02."""
    from ..chapters import ch07_ffn as ffn

    result = ffn.ffn_comparison(acts=RANKED_ACTS, seeds=(0,), rates=None, workers=1, eval_steps=(600,))
    return {act: result.val_loss(act, 600)[0] for act in RANKED_ACTS}


def _longer_gap() -> tuple:
    """7.2: GELU's minus SwiGLU's loss after 600 and 1,200 of 1,200 steps, seed 0."""
    from ..chapters import ch07_ffn as ffn

    result = ffn.ffn_comparison(acts=("gelu", "swiglu"), seeds=(0,), rates=None, workers=1, num_steps=1200,
                                eval_steps=(600, 1200))
    return result.differences(600)[0], result.differences(1200)[0]


#: Exercise 7.3's hidden width: the gated FFNs' round(8d/3) for the chapter's d = 64.
NARROW_WIDTH = 171


def _narrow_gelu() -> tuple:
    """7.3: the GELU MLP at the gated FFNs' width 171, 600 steps of seed 0: its loss and its FFN parameters."""
    from ..chapters import ch07_ffn as ffn
    from ..data import python_reference_corpus

    run = ffn.train_ensemble(python_reference_corpus(), act="gelu", ffn_num_hiddens=NARROW_WIDTH, seeds=(0,),
                             lr=0.02, eval_steps=(600,))
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


def _balancing(gammas=(0.001, 0.1), row: str = "with a shared component, balanced") -> tuple:
    """7.5: the most and least loaded expert after 100 bias updates with gamma 0.001, then 0.1 (other
    ``gammas`` or ``row``: a wrong answer's, such as router_loads' default 0.01 for one of them)."""
    from ..chapters import ch07_ffn as ffn

    out = []
    for gamma in gammas:
        loads = ffn.router_loads(gamma=gamma)[row]
        out += [max(loads), min(loads)]
    return tuple(out)


def _published() -> dict:
    """Shazeer (2020), Table 1's losses after 65,536 steps, for exercise 7.1's FFNs (a wrong answer)."""
    from ..chapters.ch07_ffn import SHAZEER_2020_LOG_PERPLEXITY

    return {act: SHAZEER_2020_LOG_PERPLEXITY[act] for act in RANKED_ACTS}


def _each(test):
    """A hint test that holds when ``test(answer, expected)`` holds for every name of a dict answer."""
    return lambda a, e: all(test(a[k], e[k]) for k in e)


EXERCISES = [
    Exercise("7.1", "a dict {act: validation loss after 600 steps} for relu, gelu, swiglu and geglu",
             kind="numbers", names=RANKED_ACTS, expected=_ranking, rel=0, abs=2e-3, slow=True,
             hints=[(_each(lambda a, e: abs(a * math.log(2) - e) < 0.01), "the losses are in nats, not bits"),
                    (_each(lambda a, e: abs(math.log(a) - e) < 0.01 if a > 0 else False),
                     "those are perplexities, exp(loss): hand in the losses themselves"),
                    (lambda a, e: all(abs(a[k] - _published()[k]) < 1e-3 for k in e),
                     "those are Shazeer's (2020) published losses, of a T5 model after 65,536 steps; hand in "
                     "your run's"),
                    (_each(lambda a, e: a > e + 0.1),
                     "these losses are higher than 600 steps at 0.02 reach: did you read an earlier step, or "
                     "train at another rate? rates=None trains every FFN at the default 0.02"),
                    (_each(lambda a, e: a < e - 0.1),
                     "these losses are lower than the exercise's run: 600 steps at the rate 0.02, seed 0"),
                    (lambda a, e: sorted(a.values()) == sorted(e.values()),
                     "the right losses under the wrong names: result.val_loss(act, 600)[0] for each act")],
             hint="compare each FFN's loss with result.val_loss(act, 600)[0] of "
                  "ffn_comparison(acts=..., seeds=(0,), rates=None, workers=1, eval_steps=(600,))",
             wrong=[lambda e: {k: v + 0.3 for k, v in e.items()},
                    lambda e: {k: v - 0.2 for k, v in e.items()},
                    lambda e: {k: v / math.log(2) for k, v in e.items()},
                    lambda e: {k: math.exp(v) for k, v in e.items()}, lambda e: _published()]),
    Exercise("7.2", "a tuple (GELU − SwiGLU after 600 steps, after 1,200 steps), nats per character",
             kind="numbers", names=("gap_600", "gap_1200"), expected=_longer_gap, rel=0, abs=2e-3, slow=True,
             hints=[(_each(lambda a, e: a > 1), "hand in the differences of the two losses, not the losses"),
                    (_each(lambda a, e: abs(a + e) < 2e-3 and abs(e) > 2e-3),
                     "the sign: GELU's loss minus SwiGLU's, positive when SwiGLU is ahead"),
                    (_each(lambda a, e: abs(a) < 0.5 and abs(a - e) > 2e-3),
                     "both gaps come from one run of 1,200 steps (its cosine schedule ends at step 1,200), seed 0, "
                     "read at steps 600 and 1,200")],
             hint="GELU's validation loss minus SwiGLU's, at steps 600 and 1,200 of one 1,200-step run, seed 0",
             wrong=[lambda e: {k: v + 0.05 for k, v in e.items()}, lambda e: {k: v - 0.05 for k, v in e.items()},
                    lambda e: {"gap_600": 1.7, "gap_1200": 1.6}]),
    Exercise("7.3", "a tuple (validation loss after 600 steps, FFN parameters of the model) for the GELU MLP "
                    "of width 171",
             kind="numbers", names=("loss", "ffn_params"), expected=_narrow_gelu, rel=0, abs=2e-3, slow=True,
             hints=[(lambda a, e: a["ffn_params"] == e["ffn_params"] // NARROW_WIDTH * 256,
                     "that is the FFN parameters of width 4d = 256: pass ffn_num_hiddens=171"),
                    (lambda a, e: a["ffn_params"] == e["ffn_params"] // 2 * 3,
                     "that is SwiGLU's count, three matrices: the GELU MLP has two"),
                    (lambda a, e: a["ffn_params"] == e["ffn_params"] and a["loss"] > e["loss"] + 0.1,
                     "this loss is higher than the narrow GELU model reaches in 600 steps at 0.02: pass lr=0.02 "
                     "and read the last validation loss"),
                    (lambda a, e: abs(a["loss"] - e["loss"]) <= 2e-3,
                     "ffn_params: run.ffn_params, the parameters of the FFNs' two matrices, not of the whole "
                     "model")],
             hint="train_ensemble(corpus, act='gelu', ffn_num_hiddens=171, seeds=(0,), lr=0.02, eval_steps=(600,)); "
                  "the loss is run.val_loss[0][-1]",
             wrong=[lambda e: {**e, "ffn_params": e["ffn_params"] // NARROW_WIDTH * 256},
                    lambda e: {**e, "loss": e["loss"] + 0.3}, lambda e: {**e, "ffn_params": 55847}]),
    Exercise("7.4", "a dict {act: ||FFN(2X)|| / ||FFN(X)||} for relu, gelu and swiglu",
             kind="numbers", names=("relu", "gelu", "swiglu"), expected=_doubling,
             rel={"relu": 1e-4, "gelu": 0.05, "swiglu": 0.05},  # ReLU's is exactly 2, whatever the draw
             hints=[(lambda a, e: abs(a["gelu"] - 2) < 0.01 or abs(a["swiglu"] - 2) < 0.01,
                     "run GELU and SwiGLU rather than assuming they scale like ReLU (2) or like a product of two "
                     "linear maps (4)"),
                    (lambda a, e: abs(a["relu"] - 1) < 1e-3,
                     "you divided by the factor 2 as well: hand in ffn(2 * X).norm() / ffn(X).norm() itself"),
                    (lambda a, e: abs(a["relu"]) < 1e-3,
                     "that is how far each FFN is from scaling like ReLU (0 for ReLU): hand in the ratio "
                     "ffn(2 * X).norm() / ffn(X).norm() itself"),
                    (lambda a, e: 0.45 < a["relu"] < 0.55,
                     "divide the norm of FFN(2X) by the norm of FFN(X), not the other way"),
                    (lambda a, e: all(abs(a[k] - e[k] ** 2) < 0.05 * e[k] ** 2 for k in e),
                     "those are ratios of squared norms: take .norm(), not its square"),
                    (lambda a, e: abs(a["relu"] - 2) > 1e-3,
                     "ReLU's ratio must be 2: the same ffn for FFN(2X) and FFN(X), the default bias=False "
                     "(a bias breaks the scaling), and tokens X = torch.randn(256, 48)"),
                    (lambda a, e: abs(a["swiglu"] - 4) < 0.05,
                     "swiglu: 4 is the estimate for a product of two linear maps, but SiLU is not linear; "
                     "measure it: FeedForward(48, act=\"swiglu\") on X = torch.randn(256, 48) (any seed lies "
                     "within the check's 5%)"),
                    (lambda a, e: all(0.75 < a[k] / e[k] < 1.33 for k in e),
                     "the ratios not right yet are near the run's but not within 5%: measure each one, "
                     "ffn(2 * X).norm() / ffn(X).norm() with FeedForward(48, act=act) and "
                     "X = torch.randn(256, 48), rather than estimating it")],
             hint="ratios of Frobenius norms, torch.linalg.norm or .norm(), for tokens X = torch.randn(256, 48)",
             wrong=[lambda e: {"relu": 2.0, "gelu": 2.0, "swiglu": 2.0},
                    lambda e: {k: 1 / v for k, v in e.items()}, lambda e: {k: v / 2 for k, v in e.items()},
                    lambda e: {**e, "swiglu": 4.0}, lambda e: {**e, "gelu": 2.4}, lambda e: {**e, "relu": 1.92},
                    lambda e: {"relu": 2.0, "gelu": 2.0, "swiglu": 4.0}, lambda e: {k: v ** 2 for k, v in e.items()}]),
    Exercise("7.5", "a tuple (most, least loaded with gamma=0.001, most, least loaded with gamma=0.1), "
                    "as multiples of the fair share",
             kind="numbers", names=("most_0.001", "least_0.001", "most_0.1", "least_0.1"), expected=_balancing,
             rel=0, abs=0.02, order="the order: gamma=0.001 first, then gamma=0.1, each as (most, least)",
             hints=[(lambda a, e: abs(a["most_0.001"] - e["most_0.1"]) < 0.02,
                     "the order: gamma=0.001 first, then gamma=0.1"),
                    (lambda a, e: all(float(v).is_integer() and 0 <= v < 8 for v in a.values()),
                     "these are experts' indices: hand in their loads, as multiples of the fair share"),
                    (lambda a, e: a["most_0.001"] > 50,
                     "as multiples of the fair share, as router_loads returns them: each expert's count of tokens "
                     "divided by the mean count"),
                    (lambda a, e: all(abs(x - y) < 0.002 for x, y in zip(a.values(), _balancing(row="random tokens"))),
                     "that is the 'random tokens' row, before any update: read the loads after the 100 updates, "
                     "the key 'with a shared component, balanced'"),
                    (lambda a, e: any(all(abs(x - y) < 0.002 for x, y in zip(a.values(), _balancing(gammas)))
                                      for gammas in ((0.01, 0.1), (0.001, 0.01), (0.01, 0.01))),
                     "one pair is router_loads' default gamma=0.01: pass gamma=0.001, then gamma=0.1"),
                    (lambda a, e: any(all(abs(x - y) < 0.002 for x, y in zip(a.values(), _balancing(gammas)))
                                      for gammas in ((0.005, 0.1), (0.001, 0.005), (0.005, 0.005))),
                     "one pair is the chapter's gamma=0.005: pass gamma=0.001, then gamma=0.1"),
                    (lambda a, e: a["most_0.001"] > 3,
                     "read the loads after the 100 updates (the key 'with a shared component, balanced')"),
                    (lambda a, e: all(abs(8 * a[k] - v) < 0.05 for k, v in e.items()),
                     "those are shares of the T k expert assignments (they add up to 1); the fair share is T k / E, "
                     "1/8 of them: hand in multiples of it, eight times these"),
                    (lambda a, e: all(abs(4 * a[k] - v) < 0.05 for k, v in e.items()),
                     "those are shares of the tokens (they add up to k = 2); the fair share is k / E = 1/4 of the "
                     "tokens: hand in multiples of it, four times these")],
             hint="router_loads(gamma=...)['with a shared component, balanced'], its max and min, for each gamma",
             wrong=[lambda e: (e["most_0.1"], e["least_0.1"], e["most_0.001"], e["least_0.001"]),
                    lambda e: {**e, "most_0.001": 3.3}, lambda e: {k: 600 * v for k, v in e.items()},
                    lambda e: (5, 7, 0, 4), lambda e: {k: v / 8 for k, v in e.items()},
                    lambda e: {k: v / 4 for k, v in e.items()}, lambda e: _balancing((0.01, 0.1)),
                    lambda e: _balancing((0.001, 0.01))]),
]
