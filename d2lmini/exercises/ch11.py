"""Self-checks of chapter 11's exercises (Beyond softmax attention).

Every expected answer is computed here with the chapter's own functions and settings
(:mod:`d2lmini.chapters.ch11_beyond_softmax`): the receptive field measured from a gradient's
exact zeros, the sink's share through the attention's forward pass, RoPE's frequencies from
:func:`~d2lmini.attention.rope_frequencies`, and the bytes a stack keeps between decoding steps.
"""

from __future__ import annotations

import math

from . import Exercise

# --------------------------------------------------------------------------- 11.1


def _field_after(window: int, depth: int = 4, num_steps: int = 64) -> int:
    """How many of ``num_steps`` positions reach the last token after ``depth`` local blocks of ``window``."""
    from ..chapters import ch11_beyond_softmax as attn26

    return attn26.receptive_field_by_depth({"local": "L"}, window=window, num_steps=num_steps,
                                           max_depth=depth, seed=0)["local"][-1]


def _smallest_window(depth: int = 4, num_steps: int = 64) -> int:
    """The smallest window for which ``depth`` local blocks let the last of ``num_steps`` tokens see the first,
    found by bisection on the measured receptive field (it grows with the window)."""
    low, high = 1, num_steps  # a window of num_steps reaches everything in one block
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if _field_after(middle, depth, num_steps) == num_steps else (middle, high)
    return high


# --------------------------------------------------------------------------- 11.2


def _sink_shares(position: int = -1, reduce: bool = False, seed: int = 0, log=math.log) -> dict:
    """The sink's share at query ``position`` (or averaged over all queries) with the sink logit at log n
    (``seed`` other than 0, or ``log`` other than the natural one: a wrong answer a hint aims at)."""
    from ..chapters import ch11_beyond_softmax as attn26

    out = {}
    for n in (16, 64):
        share = attn26.sink_sweep([log(n)], num_steps=n, seed=seed)["share"][0]
        out[f"n_{n}"] = float(share.mean() if reduce else share[position])
    return out


# --------------------------------------------------------------------------- 11.3

#: Llama 3.1's RoPE (base 500,000, heads of 128) and its "llama3" scaling, as Meta's reference code sets it.
LLAMA3_1 = dict(theta=5e5, head_dim=128, rotary_dim=None,
                scaling={"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0})


def _llama3_1_pairs(theta: float = 5e5, turn: float = 2 * math.pi) -> dict:
    """How many of the 64 pairs the scaling keeps, divides by 8 and ramps, and its attention factor;
    ``turn`` other than 2 pi: the counts of wavelengths taken as ``turn / omega`` (a wrong answer's)."""
    from ..attention import rope_frequencies
    from ..chapters import ch11_beyond_softmax as attn26

    setting = dict(LLAMA3_1, theta=theta)
    unscaled = attn26.rope_wavelengths(dict(setting, scaling=None))
    ratio = attn26.rope_wavelengths(setting) / unscaled
    factor = setting["scaling"]["factor"]
    kept, divided = int((ratio < 1 + 1e-4).sum()), int((ratio > factor * (1 - 1e-4)).sum())
    if turn != 2 * math.pi:  # the wavelengths against the scaling's two thresholds, 2,048 and 8,192
        scaling, wavelengths = setting["scaling"], unscaled * turn / (2 * math.pi)
        original = scaling["original_max_position_embeddings"]
        kept = int((wavelengths < original / scaling["high_freq_factor"]).sum())
        divided = int((wavelengths > original / scaling["low_freq_factor"]).sum())
    _, attention_factor = rope_frequencies(setting["head_dim"], setting["theta"], setting["scaling"])
    return {"kept": kept, "divided": divided, "ramp": len(ratio) - kept - divided,
            "attention_factor": float(attention_factor)}


# --------------------------------------------------------------------------- 11.4


def _stacks(window: int, groups: int = 5, tail: int = 2):
    from ..chapters import ch11_beyond_softmax as attn26

    mixers = attn26.qwen3_5_mixers(window=window)
    local_global = (["sliding_attention"] * 5 + ["full_attention"]) * groups + ["sliding_attention"] * tail
    hybrid = ["linear_attention"] * 3 + ["full_attention"]
    return attn26.stack_state_bytes, mixers, local_global, hybrid * 8


def _hybrid_range(window: int = 1024, strict: bool = True, groups: int = 5, tail: int = 2) -> dict:
    """The shortest and the longest context (in tokens) at which Qwen3.5's 3:1 stack keeps strictly less
    (``strict=False``: at most as much) than the 5:1 local:global stack with ``window`` (``groups`` of five
    local layers and a global one, then ``tail`` local ones: other than 5 and 2, the wrong answers of hints).

    The difference (hybrid minus 5:1) falls until the window fills and rises after it, so the lengths
    where it is negative form one range; each end is found by bisection on ``stack_state_bytes``.
    """
    state_bytes, mixers, local_global, hybrid = _stacks(window, groups, tail)

    def less(n: int) -> bool:
        [a], [b] = state_bytes(hybrid, mixers, [n]), state_bytes(local_global, mixers, [n])
        return a < b if strict else a <= b

    if not less(window):
        raise ValueError(f"the hybrid never holds less than the window stack with window {window}")
    low, high = 1, window  # less(window) holds: find the first length where it does
    if less(low):
        high = low
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if less(middle) else (middle, high)
    first = high
    low, high = window, 2 * window
    while less(high):  # past the window the hybrid's eight growing caches overtake: bracket the last length
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if less(middle) else (low, middle)
    return {"first": first, "last": low}


EXERCISES = [
    Exercise(
        "11.1", "the smallest window (an integer number of tokens)", expected=_smallest_window, rel=0, abs=0,
        hints=[(lambda a, e: a != int(a) and math.ceil(a) == e - 1,
                "A window counts the token itself: w - 1 is at least 63/4, so w is that bound plus one, rounded up."),
               (lambda a, e: a != int(a), "A window is a whole number of tokens: round the bound up."),
               (lambda a, e: a == e - 1,
                "A window of w tokens is the token itself and the w - 1 before it: L layers reach L(w - 1) + 1 "
                "positions. Does the first token reach the last with this window?"),
               (lambda a, e: a >= 64,
                "That counts positions reached (L(w - 1) + 1 with L = 4 blocks); hand in the window w itself."),
               (lambda a, e: a > e, "A smaller window already lets the last token see the first.")],
        hint="Call receptive_field_by_depth with four local blocks on 64 tokens and look for the smallest window "
             "whose field after four blocks is all 64 positions.",
        wrong=[lambda e: e - 1, lambda e: e + 1, lambda e: 63 / 4 + 1]),
    Exercise(
        "11.2", "(n_16, n_64): the sink's share at the last query with the sink logit at log n, for n = 16 and 64 "
                "(share[0, -1] of sink_sweep's result)",
        kind="numbers", names=("n_16", "n_64"), expected=_sink_shares, rel=2e-3,
        order="the order is (n = 16, n = 64)",
        hints=[(lambda a, e: all(abs(a[k] - e[k]) < 0.02 * e[k] and float(f"{a[k]:.3g}") == a[k] for k in e),
                "Close: give three significant digits."),
               (lambda a, e: all(abs(a[k] - v) < 2e-3 for k, v in _sink_shares(position=0).items()),
                "That is the first query's share: it sees a single key. The last query (index -1) sees all n."),
               (lambda a, e: min(a.values()) > 0.9,
                "The sink takes nearly everything: its logit is log n, math.log(n), not n."),
               (lambda a, e: all(abs(a[k] - (1 - e[k])) < 2e-3 * e[k] for k in e),
                "sink_sweep's share is the sink's weight; you handed in what is left for the real keys."),
               (lambda a, e: any(all(abs(a[k] - v) < 2e-3 * v for k, v in _sink_shares(seed=s).items())
                                 for s in (1, 2)),
                "That is another draw: seed=0."),
               (lambda a, e: any(all(abs(a[k] - v) < 2e-3 * v for k, v in _sink_shares(log=log).items())
                                 for log in (math.log2, math.log10)),
                "log n is the natural logarithm, math.log(n), not log2 or log10."),
               (lambda a, e: all(a[k] == 0.5 for k in a),
                "Measure it rather than assume it: the real logits are near zero, not exactly zero."),
               (lambda a, e: all(abs(a[k] - v) < 0.02 * v for k, v in _sink_shares(reduce=True).items()),
                "Take the share at the last query, not an average over the queries; num_steps=n, seed 0."),
               (lambda a, e: all(abs(a[k] - v) < 2e-3 * v for k, v in _sink_shares(position=-2).items()),
                "That is the second-last query's: the last is share[0, -1]."),
               (lambda a, e: all(abs(a[k] - e[k]) < 0.25 for k in e),
                "Close in size but not this run's: share[0, -1] of sink_sweep([math.log(n)], num_steps=n, "
                "seed=0), the sink logit exactly log n.")],
        hint="Run sink_sweep([math.log(n)], num_steps=n, seed=0) for each n and read share[0, -1].",
        wrong=[lambda e: {k: 1 - v for k, v in e.items()}, lambda e: _sink_shares(position=0),
               lambda e: {"n_16": e["n_64"], "n_64": e["n_16"]},
               lambda e: _sink_shares(reduce=True), lambda e: {k: 100 * v for k, v in e.items()},
               lambda e: _sink_shares(seed=1)]),
    Exercise(
        "11.3", "(kept, divided, ramp, attention_factor) for Llama 3.1's 64 pairs",
        kind="numbers", names=("kept", "divided", "ramp", "attention_factor"), expected=_llama3_1_pairs,
        rel=0, abs=1e-6,
        hints=[(lambda a, e: a["kept"] + a["divided"] + a["ramp"] == 32,
                "A head of 128 features has 64 rotated pairs, not 32."),
               (lambda a, e: a["kept"] + a["divided"] + a["ramp"] != 64,
                "Every one of the 64 pairs is kept, divided by 8 or on the ramp: the three counts add up to 64."),
               (lambda a, e: a["attention_factor"] == 8,
                "8 is the factor the slow wavelengths grow by, not the attention factor, which multiplies the "
                "queries and keys (so every logit by its square)"),
               (lambda a, e: a["attention_factor"] == 0 and e["attention_factor"] == 1,
                "A scaling that leaves the logits as they are multiplies them by 1, not 0."),
               (lambda a, e: a["attention_factor"] != e["attention_factor"],
                "d2lmini.attention.rope_frequencies returns the attention factor beside the frequencies: hand in the one it returns "
                "for Llama 3.1's scaling, not YaRN's."),
               (lambda a, e: a["kept"] == 64,
                "Every pair kept: the scaling never reached the frequencies. Put its dict under the setting's "
                "\"scaling\" key, as ROPE_SETTINGS[\"gpt-oss, YaRN x32\"] does."),
               (lambda a, e: a == _llama3_1_pairs(turn=1.0),
                "A wavelength is the tokens of one full turn, 2 pi / omega: without the 2 pi every wavelength "
                "comes out 6.28 times too short."),
               (lambda a, e: a["kept"] != e["kept"],
                "A pair is kept when its wavelength is below original_max_position_embeddings / high_freq_factor "
                "= 8,192 / 4 = 2,048 tokens, divided by 8 above 8,192 / low_freq_factor = 8,192, ramped between; "
                "compare the wavelengths with and without the scaling, at Llama 3.1's base of 500,000.")],
        hint="Compute the ratio of the scaled to the unscaled wavelengths: 1 means kept, 8 divided, in between "
             "the ramp.",
        wrong=[lambda e: {**e, "attention_factor": 0.1 * math.log(8) + 1}, lambda e: _llama3_1_pairs(theta=1e4),
               lambda e: {**e, "kept": e["kept"] - 1, "ramp": e["ramp"] + 1}, lambda e: {**e, "attention_factor": 8.0},
               lambda e: {**e, "attention_factor": 0.0}, lambda e: _llama3_1_pairs(turn=1.0)]),
    Exercise(
        "11.4", "(first, last): the shortest and the longest context, in tokens, at which the 3:1 hybrid "
                "keeps strictly less than the 5:1 stack with a window of 1,024",
        kind="numbers", names=("first", "last"), expected=_hybrid_range, rel=0, abs=0,
        hints=[(lambda a, e: a["first"] == e["first"] - 1 or a["last"] == e["last"] + 1,
                "At that length the two stacks keep exactly the same: hand in where the hybrid keeps strictly less."),
               (lambda a, e: a["last"] == e["last"] + 2,
                "That is where the 5:1 stack starts keeping less: hand in the last length at which the hybrid "
                "keeps strictly less."),
               (lambda a, e: a in (_hybrid_range(groups=5, tail=0), _hybrid_range(groups=6, tail=0)),
                "The chapter's 5:1 stack has 32 layers, as many as the hybrid: five times five local and one "
                "global, then two local."),
               (lambda a, e: a == _hybrid_range(window=4096) or a["last"] > 4 * e["last"],
                "qwen3_5_mixers() has a window of 4,096: pass window=1024."),
               (lambda a, e: all(math.log2(v).is_integer() for v in a.values()),
                "The powers of two only bracket the ends of the range: search between them, one token at a time.")],
        hint="Compare stack_state_bytes of both stacks at every length (a grid of step 1 around each crossing), "
             "the 5:1 stack with window=1024.",
        wrong=[lambda e: _hybrid_range(strict=False), lambda e: _hybrid_range(window=4096),
               lambda e: {"first": 512, "last": 4096}, lambda e: _hybrid_range(groups=5, tail=0)]),
]
