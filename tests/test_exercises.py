"""Exercises a reader can check: every exercise has a solution, every self-check accepts the right
answer and rejects plausible wrong ones with a hint aimed at each, and each chapter of Parts I and II asks for a
prediction (or more) before its experiment and reveals it after, with nothing in between that gives
the answer away."""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import nbformat
import pytest
import torch

from conftest import ROOT, chapter_notebooks, toc_files
from d2lmini import exercises
from d2lmini.exercises import Exercise, Prediction, check, exercise, exercise_ids

CHAPTERS = [p for p in chapter_notebooks() if re.match(r"\d\d_", p.name) and p.parent.name == "chapters"]
PREDICTED = [p for p in CHAPTERS if int(p.name[:2]) <= 9]  # Parts I and II
REVEAL_TITLE = "#@title Check your prediction"  # Colab shows the title and folds the code


def number_of(path: Path) -> int:
    return int(path.name[:2])


def exercises_cell(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "markdown" and re.search(r"^## Exercises", c.source, re.M)]
    assert len(cells) == 1, f"{path.name}: one Markdown cell holds the exercises"
    return cells[0].split("## Exercises", 1)[1]


def exercise_items(text: str) -> list[str]:
    """The numbered items of an exercises section, each with its continuation lines."""
    items = re.split(r"^(?=\d+\. )", text, flags=re.M)
    return [item for item in items if re.match(r"\d+\. ", item)]


def solutions_path(path: Path) -> Path:
    return path.parent / "solutions" / path.name


def anchor(exercise_id: str) -> str:
    """The link target of the heading ``## Exercise N.k``, as MyST's heading anchors spell it
    (GitHub's rule: punctuation dropped, spaces to hyphens): ``exercise-Nk``."""
    return "exercise-" + exercise_id.replace(".", "")


def html_id(exercise_id: str) -> str:
    """The id the built page gives that heading (docutils': ``exercise-N-k``)."""
    return "exercise-" + exercise_id.replace(".", "-")


# --------------------------------------------------------------------------- every exercise, its check and solution

@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_exercise_is_registered_and_links_to_its_solution(path):
    n = number_of(path)
    items = exercise_items(exercises_cell(path))
    ids = exercise_ids(n)
    assert ids == [f"{n}.{k}" for k in range(1, len(items) + 1)], (path.name, ids, len(items))
    for k, item in enumerate(items, 1):
        link = f"solutions/{path.name}#{anchor(f'{n}.{k}')}"
        assert f"]({link})" in item, f"{path.name}: exercise {k} must link to its solution, {link}"
        if exercise(f"{n}.{k}").kind != "discussion":
            assert f'check("{n}.{k}"' in item or "check(" in exercises_cell(path).split("1. ", 1)[0], \
                f"{path.name}: exercise {k} has a check: the section says how to run it"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_solutions_notebook_answers_each_exercise_in_the_toc(path):
    solutions = solutions_path(path)
    assert solutions.exists(), f"{solutions.relative_to(ROOT)} is missing"
    name = str(solutions.relative_to(ROOT).with_suffix(""))
    toc = toc_files()
    assert name in toc and toc.index(name) > max(toc.index(str(p.relative_to(ROOT).with_suffix(""))) for p in CHAPTERS)
    nb = nbformat.read(solutions, as_version=4)
    headings = [m for c in nb.cells if c.cell_type == "markdown" for m in re.findall(r"^## Exercise (\S+)", c.source, re.M)]
    assert headings == exercise_ids(number_of(path))
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for exercise_id in exercise_ids(number_of(path)):
        if exercise(exercise_id).kind != "discussion":
            assert f'check("{exercise_id}"' in code, f"{solutions.name}: the solution of {exercise_id} runs its check"


ALL_IDS = exercise_ids()
CHECKED = [i for i in ALL_IDS if exercise(i).kind != "discussion"]


def _param(exercise_id: str):
    return pytest.param(exercise_id, id=exercise_id, marks=[pytest.mark.slow] if exercise(exercise_id).slow else [])


@pytest.mark.parametrize("exercise_id", [_param(i) for i in CHECKED])
def test_each_check_accepts_the_answer_and_rejects_plausible_wrong_ones(exercise_id):
    ex = exercise(exercise_id)
    assert ex.wrong, f"{exercise_id}: at least one plausible wrong answer is tested"
    if ex.kind in ("number", "numbers"):
        expected = ex.answer()
        assert check(exercise_id, expected)
        wrongs = [make(expected) for make in ex.wrong]
        with pytest.raises(ValueError, match=exercise_id):
            check(exercise_id, "a string")
    else:
        wrongs = [make() for make in ex.wrong]
    for wrong in wrongs:
        verdict = check(exercise_id, wrong)
        assert not verdict, f"{exercise_id}: {wrong!r} was accepted"
        assert "Hint:" in verdict.message and verdict.message.count("Hint:") == 1
        if ex.kind != "custom":  # each plausible mistake gets a hint aimed at it, not the fallback
            assert not verdict.message.endswith(f"Hint: {ex.hint}"), f"{exercise_id}: {wrong!r} gets no aimed hint"
        if ex.kind == "numbers" and "percentages" in verdict.message:  # only on answers that are
            given = dict(zip(ex.names, wrong)) if isinstance(wrong, (tuple, list)) else wrong
            assert all(abs(given[n] - 100 * expected[n]) <= 0.5 * abs(100 * expected[n])
                       for n in ex.names if given[n] != expected[n]), f"{exercise_id}: {wrong!r}"


#: Wrong answers whose hints once went to a neighbouring mistake: (exercise, the answer as a function of
#: the right one, or of nothing for a function exercise, a phrase its hint must hold).
def _eps_switch_attention():
    """6.3's attention done right but with another eps in its QK-norms (a wrong answer)."""
    from d2lmini.exercises.ch06 import _SwitchAttention

    class EpsSwitchAttention(_SwitchAttention):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, mistake="none", **kwargs)
            self.q_norm, self.k_norm = (torch.nn.RMSNorm(self.head_dim, eps=1e-2) for _ in range(2))

    return EpsSwitchAttention

AIMED = [
    ("6.3", lambda: functools.partial(exercises.ch06._SwitchAttention, mistake="unmasked"), "keep the causal mask"),
    ("5.3", lambda e: {**e, "error": exercises.ch05._sequential_bfloat16(tree=True)["error"]}, "your loop's running sum"),
    ("5.3", lambda e: exercises.ch05._sequential_bfloat16(swapped=True), "your output first"),
    ("5.6", lambda e: exercises.ch05._partial_rms("scaled_last"), "X[:, :32], the ones the partial RMS reads"),
    ("9.3", lambda: exercises.ch09._block_class(lambda flag: "per_head" if flag else None, causal=False),
     "both settings differ"),
    ("10.1", lambda e: {"kept": 4 * e["kept"], "removed": 6.48074069840786}, "H is J/4"),
    ("6.1", lambda e: {k: -v for k, v in e.items()}, "q or k entered with its sign flipped"),
    ("6.1", lambda e: {"logit_3_1": e["logit_1_3"], "logit_1_3": e["logit_3_1"]}, "your rotation runs backwards"),
    ("6.6", lambda: (lambda z, c: (1 - torch.tanh(z / c) ** 2) / c), "your slope is 1/c"),
    ("2.3", lambda e: {**e, "with": float("nan")}, "the stream overflowed"),
    ("8.3", lambda e: {**e, "parameters": e["parameters"] - 2048}, "the gains of the latents' norms"),
    ("10.2", lambda e: exercises.ch10._sinkhorn_errors(reduce="norm"), "not a norm of each matrix's row errors"),
    ("6.3", _eps_switch_attention, "use eps=1e-6"),
    ("5.1", lambda e: exercises.ch05._scale_and_shift(seed=1), "another draw"),
    ("5.1", lambda e: {**e, "ln_times_3": exercises.ch05._scale_and_shift(ln_eps=1e-6)["ln_times_3"]}, "yours has 1e-6"),
    ("9.5", lambda e: {**e, "active": 1581056}, "num_shared_experts=1"),
    ("11.1", lambda e: 15.75, "w - 1 is at least 63/4"),
    ("11.2", lambda e: {"n_16": 0.5059407949447632, "n_64": 0.49706488847732544}, "not this run's"),
    ("11.3", lambda e: {**e, "kept": 35, "ramp": 0}, "2,048 tokens"),
    ("8.2", lambda e: {k: v / 1024 if k.endswith("gib") else v for k, v in e.items()}, "not TiB or TB"),
    ("2.2", lambda e: {**e, "fall": exercises.ch02._gradient_fall(exercises.ch02._post_ln_sweep().get("post", False),
                                                                 of="block L")}, "the last block's gradient"),
    ("2.3", lambda e: {"without": exercises.ch02.scaled_stream_rms(1.0, blocks=(63,))["63"], "with": e["with"]},
     "after block 63"),
    ("11.2", lambda e: {"n_16": 0.9999983, "n_64": 1.0}, "math.log(n), not n"),
    ("5.3", lambda e: {**e, "sum_of_squares": 2080.0}, "the first token's running sum, sums[0]"),
    ("5.2", lambda e: {**e, "rms_at_1_percent": 0.01}, "not the 1% itself"),
    ("1.4", lambda e: {**e, "output_rms": exercises.ch01._residual_sums_by_default("sandwich")}, "residual_sum's defaults"),
    ("4.1", lambda e: {**e, "post-LN spread": 0.0}, "small, not 0"),
    ("10.4", lambda e: exercises.ch10._scaled_stack(scale=2.56), "2.56 is the standard deviation"),
    ("6.3", lambda: functools.partial(exercises.ch06._SwitchAttention, mistake="gainless"), "your norms have no gains"),
    ("6.1", lambda e: exercises.ch06._rotated_logits(adjacent=True), "adjacent features"),
    ("5.6", lambda e: {"random": e["large_first"], "large_first": e["large_first"]}, "not X in place"),
    ("5.3", lambda e: exercises.ch05._sequential_bfloat16(every_token=True), "added up or averaged"),
    ("5.6", lambda e: exercises.ch05._partial_rms("median"), "the median over the tokens"),
    ("2.5", lambda e: {**e, "w_o": e["w_o"] ** 2}, "the squared norm"),
    ("1.4", lambda e: {**e, "output_rms": 7 ** 0.5}, "two per block"),
    ("3.3", lambda e: {k: 0.0 for k in e}, "LayerNorm's column"),
    ("8.3", lambda e: {**e, "numbers": 768}, "not once per head"),
    ("8.3", lambda e: {**e, "parameters": e["parameters"] / 1e6}, "not in millions"),
    ("7.5", lambda e: {k: v / 8 for k, v in e.items()}, "shares of the T k expert assignments"),
    ("7.5", lambda e: {k: v / 4 for k, v in e.items()}, "shares of the tokens"),
    ("11.4", lambda e: {**e, "last": 35000}, "pass window=1024"),
    ("11.2", lambda e: exercises.ch11._sink_shares(position=-2), "second-last query"),
    ("11.2", lambda e: exercises.ch11._sink_shares(seed=3), "not this run's"),
    ("9.4", lambda e: {n: 2 * v for n, v in e.items()}, "ids of shape (1, 112)"),
    ("6.6", lambda: (lambda z, c: (z.abs() < c).float()), "a hard clip's"),
    ("2.3", lambda e: {"without": 69.906, "with": 1.0441}, "another draw of the stack or of its input"),
    ("5.6", lambda e: exercises.ch05._partial_rms("worst"), "the worst token's distance"),
    ("5.1", lambda e: exercises.ch05._scale_and_shift("relative"), "not a norm of the whole change"),
    ("5.1", lambda e: exercises.ch05._scale_and_shift("norm"), "not a norm of the whole change"),
    ("5.2", lambda e: {**e, "rms_at_1_percent": (9e-6 / 2) ** 0.5}, "0.01, not 1"),
    ("5.4", lambda e: 1.0, "round Gemma's float32 product to bfloat16 once"),
    ("8.2", lambda e: {k: v / 2 if k.endswith("gib") else 2 * v for k, v in e.items()}, "each number two bytes"),
    ("8.2", lambda e: {**e, "gqa_gib": e["mha_gib"], "gqa_sequences": e["mha_sequences"]}, "num_kv_heads=8"),
    ("9.4", lambda e: {n: 229376 for n in e}, "d_h stays num_hiddens / num_heads"),
    ("10.2", lambda e: exercises.ch10._sinkhorn_errors(reduce="sums"), "the row sums themselves"),
    ("10.3", lambda e: {**e, "hc_4096": 1.3 * e["hc_4096"]}, "spectral[:, -1]"),
    ("11.3", lambda e: {**e, "attention_factor": 0.0}, "multiplies them by 1, not 0"),
    ("2.2", lambda e: {**e, "fall": 1 - 1 / e["fall"]}, "not the fraction of the gradient lost"),
    ("2.3", lambda e: {**e, "with": exercises.ch02._scaled(1 / 16)["64"]}, "L is the number of blocks, 64"),
    ("3.2", lambda: [0], "the second of the (mean, variance) pair"),
    ("5.6", lambda e: exercises.ch05._partial_rms("ratio"), "not the ratio"),
    ("5.6", lambda e: exercises.ch05._partial_rms("undivided"), "divide each token's"),
    ("5.6", lambda e: exercises.ch05._partial_rms("sum"), "divide their sum by 32"),
    ("1.2", lambda e: {**e, "n48": e["n192"]}, "n48:"),
    ("1.2", lambda e: {**e, "n192": e["n48"]}, "n192:"),
    ("5.1", lambda e: {**e, "ln_times_3": 2e-5}, "each difference named above"),
    ("9.2", lambda e: {**e, "change": -e["change"]}, "the sign"),
    ("6.5", lambda e: {**e, "bound": exercises.ch06._logit_bound(pairing="rope_pairs")["bound"]}, "within RoPE's"),
    ("6.6", lambda: (lambda z, c: 1 - torch.tanh(z / c)), "the tanh is squared"),
    ("6.6", lambda: (lambda z, c: 1 / torch.cosh(z / c)), "the cosh is squared"),
    ("1.1", lambda e: {**e, "attention": 2.25}, "W_k and W_v of d × (8 · 128)"),
    ("1.1", lambda e: {**e, "ffn": 12.0}, "each d × 14,336"),
    ("1.6", lambda: exercises.ch01._wrong_miniblock("before softmax", scale_by="d"), "not by sqrt(num_hiddens)"),
    ("1.6", lambda: exercises.ch01._wrong_miniblock("always"), "masks too"),
    ("2.3", lambda e: {"without": e["with"], "with": e["with"]}, "measure the stack before you scale it"),
    ("2.4", lambda e: 3.20, "four-block model"),
    ("2.4", lambda e: exercises.ch02._unigram_entropy("val"), "unigram entropy"),
    ("4.7", lambda e: exercises.ch04._read_off_deeper(), "probe an 8-block stack"),
    ("5.1", lambda e: {**e, "rms_times_3": 4.8e-7}, "machine epsilon"),
    ("6.1", lambda e: {k: v / 4 for k, v in e.items()}, "without the division by sqrt(d_h)"),
    ("6.2", lambda e: {name: 4.16 for name in e}, "log 64"),
    ("6.2", lambda e: {**e, "per_head_distinct": 0.00236}, "without QK-norm"),
    ("7.4", lambda e: {k: v ** 2 for k, v in e.items()}, "squared norms"),
    ("8.3", lambda e: {k: 61 * v for k, v in e.items()}, "61 layers"),
    ("8.3", lambda e: {**e, "numbers": e["numbers"] - 2}, "the latent alone"),
    ("6.2", lambda e: {**e, "projection": exercises.ch06._per_head_entropy()}, "per-head variant's"),
    ("2.4", lambda e: exercises.ch02._no_skip_val(1, seed=1), "another draw"),
    ("5.5", lambda e: exercises.ch05._lower_rate(seed=0), "one seed's"),
    ("1.3", lambda e: {"causal": 128, "rope": 509}, "count rows, not entries"),
    ("1.4", lambda e: {**e, "output_rms": 12 ** 0.5}, "13 terms"),
    ("1.6", lambda: exercises.ch01._wrong_miniblock("before softmax", scale_by="d"), "sqrt(num_hiddens)"),
    ("2.2", lambda e: {**e, "fall": math.log10(e["fall"])}, "not its logarithm"),
    ("2.3", lambda e: {**e, "with": exercises.ch02._ffn_only()}, "attention.W_o and ffn.W_2"),
    ("2.5", lambda e: exercises.ch02._first_step_gradients(block=3), "another block's"),
    ("3.2", lambda: sorted(i + 1 for i in exercises.ch03._growing_features()), "one too high"),
    ("5.1", lambda e: exercises.ch05._scale_and_shift("mean"), "not the mean"),
    ("5.3", lambda e: {**e, "sum_of_squares": 32 * e["sum_of_squares"]}, "first token's running sum only"),
    ("5.4", lambda e: 1.0, "1 + g"),
    ("5.6", lambda e: exercises.ch05._partial_rms("last"), "X[..., :32]"),
    ("6.2", lambda e: {k: v / math.log(64) for k, v in e.items()}, "fraction of log 64"),
    ("8.1", lambda: exercises.ch08._TrimmedLate, "before the scores"),
    ("8.1", lambda: exercises.ch08._Untrimmed, "along the tokens' dimension"),
    ("1.2", lambda e: exercises.ch01._alone_ratios("block_permuted_causal"), "the causal block's row"),
    ("1.2", lambda e: exercises.ch01._alone_ratios("block_permuted_rope"), "the block with RoPE"),
    ("1.4", lambda e: {**e, "output_rms": exercises.ch01._residual_sums("sandwich").stream_rms[-2]},
     "an earlier entry of stream_rms"),
    ("10.3", lambda e: exercises.ch10._final_norms(depth=7), "at an earlier depth"),
    ("7.5", lambda e: exercises.ch07._balancing((0.01, 0.1)), "default gamma=0.01"),
    ("7.4", lambda e: {k: v / 2 for k, v in e.items()}, "divided by the factor 2"),
    ("2.3", lambda e: {"without": math.nan, "with": math.nan}, "each block already adds its own skip"),
    ("1.6", lambda: exercises.ch01._wrong_miniblock("ignored"), "assign its result"),
    ("2.3", lambda e: {k: v ** 2 for k, v in e.items()}, "those are mean squares"),
    ("6.1", lambda e: dict.fromkeys(e, exercises.ch06._unrotated_logit()), "both are q . k unrotated"),
    ("6.6", lambda: (lambda z, c: 1 - torch.tanh(z / c) ** 2 / c), "check the brackets"),
    ("5.2", lambda e: {**e, "diff_at_0.01": 8 * e["diff_at_0.01"], "diff_at_0.1": 8 * e["diff_at_0.1"]},
     "divide each by y_b.norm()"),
    ("11.4", lambda e: {**e, "last": e["last"] + 2}, "starts keeping less"),
    ("8.1", lambda: exercises.ch08._TrimmedAfterPast, "before past = k.shape[2] - n"),
    ("11.2", lambda e: exercises.ch11._sink_shares(log=math.log2), "the natural logarithm"),
    ("8.2", lambda e: {**e, "mha_gib": e["gqa_gib"], "gqa_gib": e["mha_gib"]}, "MHA caches every head"),
    ("7.4", lambda e: {"relu": 0.0, "gelu": 0.415, "swiglu": 2.542}, "how far each FFN is from scaling"),
    ("10.1", lambda e: exercises.ch10._average_of_streams(order=1), "the Euclidean norm"),
    ("3.1", lambda e: exercises.ch03._unmasked_difference(), "the real tokens alone"),
    ("9.5", lambda e: {**e, "dense": 3 * 512 * 1366}, "rather than by hand"),
    ("9.5", lambda e: {"k": 7, "active": exercises.ch09._active(7), "dense": exercises.ch09._whole_block()},
     "counts the whole block"),
    ("2.3", lambda e: {**e, "without": exercises.ch02._scaled(1.0)["32"]}, "after block 32"),
    ("5.2", lambda e: {**e, "rms_at_1_percent": 0.022}, "scan finer"),
    ("5.4", lambda e: exercises.ch05._gain_orders(product_in_float32=True), "Llama's product of two bfloat16"),
    ("7.5", lambda e: exercises.ch07._balancing(row="random tokens"), "the 'random tokens' row"),
    ("7.5", lambda e: exercises.ch07._balancing((0.001, 0.01)), "default gamma=0.01"),
    ("10.4", lambda e: exercises.ch10._scaled_stack(every=True), "scaling both phi and alpha"),
    ("10.4", lambda e: exercises.ch10._scaled_stack(scale=32.0), "multiply phi alone by the square root"),
    ("3.3", lambda e: dict(zip(e, [v for v in list(e.values())[1::2] for _ in (0, 1)])), "pass warmup=5"),
    ("3.3", lambda e: dict(zip(e, list(e.values())[:2] * 2)), "pass momentum=0.01"),
    ("10.2", lambda e: dict.fromkeys(e, e["iters_20"]), "pass iters=k"),
    ("10.2", lambda e: dict.fromkeys(e, 1.0), "not the sums"),
    ("11.3", lambda e: exercises.ch11._llama3_1_pairs(turn=1.0), "2 pi / omega"),
    ("11.3", lambda e: {**e, "attention_factor": 8.0}, "so every logit by its square"),
    ("11.4", lambda e: exercises.ch11._hybrid_range(window=4096), "pass window=1024"),
    ("6.5", lambda e: {**e, "logit": exercises.ch06._middle_rate_runs()["per_head"].max_logit_per_layer[0][-1]},
     "at the first step"),
    ("6.5", lambda e: {**e, "logit": exercises.ch06._middle_rate_runs()["per_head"].max_logit_per_layer[-1][0]},
     "first layer's largest logit at the last step"),
    ("9.4", lambda e: {n: 2 * v for n, v in e.items()}, "twice the cache"),
    ("9.5", lambda e: {**e, "k": 1}, "above or below"),
    ("5.4", lambda e: exercises.ch05._gain_orders(one_plus=True), "not Gemma's stored 1 + g"),
    ("11.4", lambda e: exercises.ch11._hybrid_range(groups=6, tail=0), "32 layers"),
    ("3.4", lambda e: exercises.ch03._batch_mates_slope(intercept=True, base=10), "intercept"),
    ("2.2", lambda e: {**e, "fall": math.log(e["fall"])}, "not its logarithm"),
    ("1.4", lambda e: {**e, "output_rms": 3.61}, "sqrt(13)"),
    ("2.5", lambda e: {k: round(v, 2) for k, v in e.items()}, "unrounded"),
    ("5.3", lambda e: exercises.ch05._sequential_bfloat16(tree=True), "pairwise tree"),
    ("5.1", lambda e: {k: 0.29 * v for k, v in e.items()}, "not divided by anything"),
    ("7.5", lambda e: (5, 7, 0, 4), "indices"),
    ("11.3", lambda e: {**e, "attention_factor": 8.0}, "not the attention factor"),
    ("1.2", lambda e: exercises.ch01._alone_ratios("attention_scale"), "attention_scale"),
    ("9.5", lambda e: {**e, "k": e["k"] - 1}, "above or below"),
    ("10.2", lambda e: exercises.ch10._sinkhorn_errors(scale=1.0), "2.56"),
    ("10.3", lambda e: exercises.ch10._final_norms(depth=0), "||P_1||"),
    ("10.4", lambda e: exercises.ch10._scaled_stack(connections=("hc2",)), "not one of them"),
    ("11.2", lambda e: exercises.ch11._sink_shares(seed=1), "another draw"),
    ("2.5", lambda e: {**e, "w_q": 2e-4}, "exactly one step"),
    ("2.3", lambda e: {**e, "with": exercises.ch02._scaled(1 / 128)["64"]}, "twice squares it"),
    ("2.2", lambda e: {**e, "fall": exercises.ch02._post_ln_gradient_gap()}, "not their difference"),
    ("1.5", lambda e: {**e, "shared": e["shared"] / 5}, "one block's tensors"),
    ("1.2", lambda e: {k: 100 * v for k, v in e.items()}, "these are percentages"),
    ("5.4", lambda e: exercises.ch05._gain_orders(no_upcast=True), "both orders normalize in float32"),
    ("5.6", lambda e: {k: 1.01 * v for k, v in e.items()}, "close, but not the run's"),
    ("6.1", lambda e: {k: v + 0.5 for k, v in e.items()}, "right after torch.manual_seed(0)"),
    ("6.6", lambda: (lambda z, c: c * torch.tanh(z / c)), "like the cap"),
    ("11.3", lambda e: {**e, "kept": 64, "divided": 0, "ramp": 0}, "never reached the frequencies"),
    ("9.2", lambda e: {**e, "spread": 2 * e["spread"]}, "not of both rows' six"),
    ("7.5", lambda e: exercises.ch07._balancing((0.005, 0.1)), "the chapter's gamma=0.005"),
    ("11.1", lambda e: 4 * (e - 1) + 1, "hand in the window w itself"),
    ("6.6", lambda: (lambda z, c: 1 - math.tanh(z / c) ** 2), "use the torch one"),
    ("9.5", lambda e: {**e, "active": e["active"] / 1e6, "dense": e["dense"] / 1e6}, "not in thousands or millions"),
    ("9.5", lambda e: {**e, "k": 1, "active": exercises.ch09._moe_total(1)}, "the mixture's whole count"),
    ("1.5", lambda e: {**e, "parameters": e["parameters"] / 1e3}, "not in thousands or millions"),
    ("3.2", lambda: exercises.ch03._shrinking_features()[1:], "is the comparison flipped?"),
    ("6.1", lambda e: {**e, "logit_1_3": exercises.ch06._rotated_logits(second=(3, 2))["logit_1_3"]},
     "one of the other printed logits"),
    ("1.4", lambda e: {**e, "output_rms": 13}, "that counts the terms"),
    ("1.4", lambda e: {**e, "output_rms": 13 ** 0.5 * exercises.ch01._residual_sums("sandwich").input_rms},
     "sqrt(13) is the size of 13 orthogonal terms"),
    ("8.2", lambda e: {**e, "mha_gib": e["mha_gib"] / 16, "gqa_gib": e["gqa_gib"] / 16}, "131,072 tokens"),
    ("2.3", lambda e: {**e, "with": e["without"] / math.sqrt(128)}, "not the stream afterwards"),
    ("2.2", lambda e: {**e, "k": e["k"] + 1}, "token_spread[0] is the input X_0"),
]


@pytest.mark.parametrize("exercise_id, make, phrase", [
    pytest.param(*case, id=f"{case[0]}-{k}", marks=[pytest.mark.slow] if exercise(case[0]).slow else [])
    for k, case in enumerate(AIMED)])
def test_a_wrong_answer_gets_the_hint_written_for_it(exercise_id, make, phrase):
    ex = exercise(exercise_id)
    wrong = make(ex.answer()) if ex.kind in ("number", "numbers") else make()
    verdict = check(exercise_id, wrong)
    assert not verdict and phrase in verdict.message, verdict.message


def test_a_function_check_runs_the_readers_function_on_fresh_inputs():
    ex = Exercise("0.1", "a function of X", kind="function", reference=lambda X: X.relu(),
                  inputs=lambda g: (torch.randn(3, 4, generator=g),), hints=[(lambda a, e: True, "clip at zero")],
                  wrong=[lambda: torch.tanh])
    assert ex.verdict(lambda X: X.clamp(min=0))
    wrong = ex.verdict(torch.tanh)
    assert not wrong and "clip at zero" in wrong.message
    assert "shape" in ex.verdict(lambda X: X.sum(0)).message
    assert "raised" in ex.verdict(lambda X: 1 / 0).message
    with pytest.raises(ValueError, match="must be a function"):
        ex.verdict(3.0)


def test_numbers_answers_by_name_or_order_and_say_which_is_off():
    ex = Exercise("0.2", "(a, b)", kind="numbers", names=("a", "b"), expected=lambda: (1.0, 2.0),
                  hints=[(lambda a, e: a["b"] == 2 * e["b"], "b is counted twice")])
    assert ex.verdict({"a": 1.0, "b": 2.0}) and ex.verdict((1.0, 2.0))
    verdict = ex.verdict((1.0, 4.0))
    assert not verdict and "b" in verdict.message and "counted twice" in verdict.message
    for bad, match in (((1.0,), "2 numbers"), ({"a": 1.0}, "missing"), ((1.0, "x"), "number"), (3.0, "tuple")):
        with pytest.raises(ValueError, match=match):
            ex.verdict(bad)
    swapped = ex.verdict((2.0, 1.0))
    assert not swapped and "another order: hand in (a, b)" in swapped.message
    shares = Exercise("0.7", "(a, b)", kind="numbers", names=("a", "b"), expected=lambda: (0.25, 0.001), abs=1e-3)
    percent, small = shares.verdict((25.0, 0.001)), shares.verdict((0.25, 0.1))
    assert not percent and "percentages" in percent.message
    assert not small and "percentages" not in small.message  # 100 x 0.001 is within 100 x abs of 0
    rounding = Exercise("0.8", "(a, b)", kind="numbers", names=("a", "b"), expected=lambda: (0.12345, 3.8e-5),
                        rel=1e-3)
    assert "unrounded" in rounding.verdict((0.12, 3.8e-5)).message
    assert "unrounded" in rounding.verdict((0.123, 0.0)).message
    assert "unrounded" not in rounding.verdict((0.13, 3.8e-5)).message
    counts = Exercise("0.9", "n", kind="number", expected=lambda: 269.0, rel=0, abs=0.5)
    assert "unrounded" not in counts.verdict(270).message  # a count is off, not rounded
    strict = Exercise("0.5", "(a, b)", kind="numbers", names=("a", "b"), expected=lambda: (2.0, 1.0),
                      rel={"a": 1e-6, "b": 0.1})
    assert strict.verdict((2.0, 1.05)) and not strict.verdict((2.01, 1.0))
    with pytest.raises(ValueError, match="rel"):
        Exercise("0.6", "x", kind="number", expected=lambda: 1.0, rel={"x": 0.1})


def test_numpy_and_tensor_answers_are_taken_as_readers_hand_them_in():
    np = pytest.importorskip("numpy")
    _, var_all, var_real = exercises.ch03._variances()
    mask = var_all > var_real
    for answer in (mask, mask.numpy(), np.where(mask.numpy())[0], list(np.nonzero(mask.numpy())[0]),
                   mask.tolist(), torch.nonzero(mask), mask.nonzero().flatten(), sorted(mask.nonzero().flatten().tolist())):
        assert check("3.2", answer), type(answer)
    for answer in (np.nonzero(mask.numpy()), torch.where(mask), mask.nonzero(as_tuple=True)):  # one array a dim
        assert check("3.2", answer), type(answer)
    ratios = exercise("1.2").answer()
    assert check("1.2", np.array(list(ratios.values()))) and check("1.2", torch.tensor(list(ratios.values())))
    with pytest.raises(ValueError, match="3 numbers"):
        check("1.2", np.array([1.0, 2.0]))


def test_unknown_exercises_and_discussions_raise_a_clear_error():
    for bad, match in (("4", "look like"), (4.2, "string"), ("99.1", "no chapter 99"), ("1.99", "no exercise")):
        with pytest.raises(ValueError, match=match):
            check(bad, 1.0)
    discussions = [i for i in ALL_IDS if exercise(i).kind == "discussion"]
    if discussions:
        with pytest.raises(ValueError, match="discussion"):
            check(discussions[0], "my answer")
    with pytest.raises(ValueError, match="kind"):
        Exercise("0.3", "x", kind="essay")
    with pytest.raises(ValueError, match="expected"):
        Exercise("0.4", "x")
    tensor = pytest.importorskip("torch").ones(2)
    number = next((i for i in CHECKED if exercise(i).kind == "number" and not exercise(i).slow), None)
    if number:
        with pytest.raises(ValueError, match=r"shape \(2,\)"):
            check(number, tensor)


# --------------------------------------------------------------------------- predict, then run

def test_a_prediction_shows_its_choices_and_reveals_folded_or_with_the_guess():
    p = Prediction("Which grows?", ["the first", "the second", "neither"])
    assert "**Predict.** Which grows?" in p._repr_markdown_() and "* (c) neither" in p._repr_markdown_()
    folded = p.reveal(1, "it grew 3-fold")._repr_html_()
    assert folded.startswith('<details class="d2l-prediction">') and "(b) the second" in folded
    p.widget.value = 0  # the live guess
    shown = p.reveal(1, "it grew 3-fold")
    assert p.guess == 0 and "<details class=\"d2l-prediction\" open>" in shown._repr_html_()
    assert "You chose (a): not this time." in repr(shown)
    for bad, kind in (((["a"],), ValueError), ((["a"] * 3,), ValueError), ((["a", ""],), TypeError),
                      (("a, b",), TypeError)):
        with pytest.raises(kind):
            Prediction("Q?", *bad)
    for answer, why, kind in ((3, "x", ValueError), (True, "x", TypeError), (0, " ", TypeError)):
        with pytest.raises(kind):
            p.reveal(answer, why)


def ends_in_reveal(source: str) -> bool:
    """Whether a cell's last statement is ``prediction.reveal(...)``, whose value the cell shows."""
    import ast

    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    return bool(body) and isinstance(body[-1], ast.Expr) and isinstance(body[-1].value, ast.Call) \
        and ast.unparse(body[-1].value.func) == "prediction.reveal"


def prediction_spans(cells) -> list[tuple[int, int]]:
    """Each prediction of a chapter as (the cell that asks it, the cell that reveals it), in order."""
    asks = [i for i, c in enumerate(cells) if c.cell_type == "code" and "exercises.Prediction(" in c.source]
    reveals = [i for i, c in enumerate(cells) if c.cell_type == "code" and ends_in_reveal(c.source)]
    assert len(asks) == len(reveals), f"{len(asks)} predictions asked, {len(reveals)} revealed"
    spans = list(zip(asks, reveals))
    assert all(ask < reveal for ask, reveal in spans) and all(
        reveal < ask for (_, reveal), (ask, _) in zip(spans, spans[1:])), "each prediction is revealed before the next"
    return spans


def prediction_choices(source: str) -> list[str]:
    """The choices of the ``Prediction(question, choices)`` a cell asks."""
    import ast

    call = next(node for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Prediction"))
    return list(ast.literal_eval(call.args[1]))


def comments(source: str) -> list[str]:
    """The comments of a code cell."""
    import io
    import tokenize

    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return re.findall(r"#.*", source)


def names_a_choice(text: str, choices: list[str]) -> str | None:
    """The choice ``text`` names, by its letter, ``(b)``, or by three words in a row that this choice
    has and not every other (words all the choices share name none of them); else None."""
    label = re.search(r"\([a-d]\)", text)
    if label:
        return label[0]

    def trigrams(t: str) -> set[str]:
        w = re.findall(r"[a-z0-9%]+", t.lower())
        return {" ".join(w[k:k + 3]) for k in range(len(w) - 2)}

    said = trigrams(text)
    shared = set.intersection(*(trigrams(c) for c in choices))
    for choice in choices:
        if (trigrams(choice) - shared) & said:
            return choice
    return None


def names_a_choice_verbatim(text: str, choices: list[str]) -> str | None:
    """The choice ``text`` names by its letter, ``(b)``, or by its whole text; else None."""
    label = re.search(r"\([a-d]\)", text)
    return label[0] if label else next((c for c in choices if c.lower() in text.lower()), None)


def answers_early(cells, ask: int, reveal: int) -> list[str]:
    """What the cells between a prediction (and its live widget) and its reveal give away: an
    ``assert`` (the lesson, stated before the run is shown), or a comment or sentence naming a choice."""
    import ast

    choices = prediction_choices(cells[ask].source)
    found = []
    for i in range(ask + 2, reveal):
        cell = cells[i]
        if cell.cell_type == "code":
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:
                tree = None
            if tree is not None and any(isinstance(node, ast.Assert) for node in ast.walk(tree)):
                found.append(f"cell {i} asserts the outcome before the reveal")
            if cell.source.lstrip().startswith("#@title"):
                found.append(f"cell {i} writes the run's prose before the reveal")
            texts = comments(cell.source)
            named_by = names_a_choice
        else:  # a caption describes what is drawn: only a choice's letter or its whole text names it
            texts = [cell.source]
            named_by = names_a_choice_verbatim
        for text in texts:
            named = named_by(text, choices)
            if named:
                found.append(f"cell {i} names the choice {named!r}: {text.strip()[:80]!r}")
    return found


@pytest.mark.parametrize("path", PREDICTED, ids=lambda p: p.stem)
def test_each_chapter_asks_for_a_prediction_before_its_experiment(path):
    cells = nbformat.read(path, as_version=4).cells
    spans = prediction_spans(cells)
    assert spans, f"{path.name}: at least one prediction"
    for ask, reveal in spans:
        assert cells[ask].source.rstrip().splitlines()[-1].strip() == "prediction"
        live = cells[ask + 1]
        assert "skip-execution" in live.metadata.get("tags", []) and live.source.startswith("prediction.widget")
        assert reveal > ask + 2, f"{path.name}: the reveal of cell {ask}'s prediction comes after the experiment"
        lesson = cells[reveal:reveal + 2]  # the reveal and the cell right after it
        assert any(c.cell_type == "code" and "assert" in c.source for c in lesson), \
            f"{path.name}: the lesson of cell {ask}'s prediction is asserted with the reveal or right after it"
        # the reveal's code (its asserts and comments state the answer) folds until the reader opens it
        folded = cells[reveal].metadata
        assert "hide-input" in folded.get("tags", []) and folded.get("jupyter", {}).get("source_hidden") \
            and folded.get("cellView") == "form" and cells[reveal].source.startswith(REVEAL_TITLE), \
            f"{path.name}: the reveal of cell {ask}'s prediction folds its code in every reader " \
            f"(hide-input, source_hidden, and a Colab form titled {REVEAL_TITLE!r})"


@pytest.mark.parametrize("path", PREDICTED, ids=lambda p: p.stem)
def test_no_cell_answers_a_prediction_before_its_reveal(path):
    cells = nbformat.read(path, as_version=4).cells
    found = [f"prediction of cell {ask}: {what}" for ask, reveal in prediction_spans(cells)
             for what in answers_early(cells, ask, reveal)]
    assert not found, f"{path.name}: " + "; ".join(found)


def test_a_cell_that_asserts_or_names_a_choice_before_the_reveal_is_found():
    from nbformat.v4 import new_code_cell, new_markdown_cell

    ask = new_code_cell('prediction = d2lmini.exercises.Prediction("Q?", ["it grows with s", "it stays flat"])\n'
                        "prediction")
    live = new_code_cell("prediction.widget")
    reveal = new_code_cell("prediction.reveal(1, 'flat')")
    for experiment, expected in ((new_code_cell("x = run()\nassert x < 1"), "asserts"),
                                 (new_code_cell("x = run()  # (b): flat"), "(b)"),
                                 (new_code_cell("x = run()  # so it stays flat at every s"), "it stays flat"),
                                 (new_markdown_cell("The curve stays flat, as (b) says."), "(b)"),
                                 (new_markdown_cell("So it stays flat."), "it stays flat"),
                                 (new_code_cell('#@title Run to fill in the numbers\nMarkdown(f"{x}")'),
                                  "prose")):
        found = answers_early([ask, live, experiment, reveal], 0, 3)
        assert found and expected in found[0], (experiment.source, found)
    quiet = new_code_cell("x = run()  # s = 1 ... 64\nshow(x)")
    caption = new_markdown_cell("**Figure 1.** The gradient against s, per head, as it grows.")
    assert answers_early([ask, live, quiet, caption, reveal], 0, 4) == []


# --------------------------------------------------------------------------- in the built book

@pytest.mark.slow
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_each_built_solution_shows_its_checks_correct(html, path):
    from bs4 import BeautifulSoup

    page = html / "chapters" / "solutions" / path.with_suffix(".html").name
    text = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser").get_text(" ")
    assert "not yet" not in text, f"{page.name}: a check said 'not yet'"
    for exercise_id in exercise_ids(number_of(path)):
        if exercise(exercise_id).kind != "discussion":
            assert f"{exercise_id}: correct" in text, f"{page.name}: {exercise_id}'s check did not say correct"
        assert page.with_suffix(".html").exists()
        assert f'id="{html_id(exercise_id)}"' in page.read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("path", PREDICTED, ids=lambda p: p.stem)
def test_each_built_chapter_folds_its_prediction_answer(html, path):
    from bs4 import BeautifulSoup

    soup = BeautifulSoup((html / "chapters" / path.with_suffix(".html").name).read_text(encoding="utf-8"), "html.parser")
    details = soup.select("details.d2l-prediction")
    asks = len(prediction_spans(nbformat.read(path, as_version=4).cells))
    assert len(details) == asks and not any(d.has_attr("open") for d in details)
    assert "Predict." in soup.get_text(" ")


def test_a_fraction_handed_in_as_a_percentage_is_told_so():
    expected = exercise("5.4").answer()
    percentage, agreeing = check("5.4", 100 * expected), check("5.4", 1 - expected)
    assert not percentage and "percentages: hand in the numbers themselves" in percentage.message
    assert not agreeing and "not of those that agree" in agreeing.message
