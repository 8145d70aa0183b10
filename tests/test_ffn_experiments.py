"""The experiments of the chapter "The feed-forward network: SwiGLU, then a mixture of experts"."""

from __future__ import annotations

import math

import pytest
import torch

from d2lmini.data import python_reference_corpus
from d2lmini.ffn import FeedForward
from d2lmini.chapters.ch07_ffn import (COMPARISON_CONFIG, MOE_MODELS, SHAZEER_2020_LOG_PERPLEXITY, SWEEP_RATES,
                                     LRSweep, balance_by_bias, ffn_as_memories, ffn_comparison,
                                     ffn_parameter_counts, lr_sweep, plot_activations, plot_ffn_comparison,
                                     router_loads, train_ensemble)
from d2lmini.moe import MixtureOfExperts
from d2lmini.train import TinyLM, evaluate, train_lm

# A model small enough to train in a fraction of a second; 8 * 24 / 3 = 64 exactly.
TINY = dict(num_steps=12, batch_size=4, seq_len=16, lr=1e-2, warmup_steps=3, schedule="cosine", betas=(0.9, 0.95),
            clip_norm=1.0, num_hiddens=24, num_heads=2, num_layers=1, eval_batches=2)
# The comparison's fixture: the same model, a little more data per step.
SMALL = {**{k: v for k, v in TINY.items() if k != "num_steps"}, "batch_size": 8, "lr": 2e-2}


@pytest.fixture(scope="module")
def corpus():
    return python_reference_corpus()


@pytest.fixture(scope="module")
def comparison(corpus):
    return ffn_comparison(corpus, seeds=(0, 1, 2), num_steps=24, eval_steps=(8, 16, 24), workers=2, **SMALL)


# ---------------------------------------------------------------- parameter budget

def test_plain_and_gated_ffns_cost_8_d_squared():
    d = 1024  # like the chapter's 4096, not a multiple of 3 (and 16x fewer weights to initialize)
    rows = {r["act"]: r for r in ffn_parameter_counts(d)}
    assert rows["relu"]["params"] == rows["gelu"]["params"] == 8 * d ** 2
    assert rows["swiglu"]["matrices"] == 3 and rows["swiglu"]["ffn_num_hiddens"] == round(8 * d / 3)
    for act in ("swiglu", "geglu"):
        assert rows[act]["params"] == 3 * d * rows[act]["ffn_num_hiddens"]
        assert abs(rows[act]["rel_diff"]) < 1e-3


@pytest.mark.parametrize("d", [24, 48, 64, 100, 128, 768])
def test_rounding_of_8d_over_3_is_the_only_difference(d):
    (row,) = ffn_parameter_counts(d, ["swiglu"])
    assert abs(row["rel_diff"]) <= 1 / (8 * d) + 1e-12
    assert (row["rel_diff"] == 0) == (d % 3 == 0)


def test_the_compared_models_differ_only_by_the_rounding_of_8d_over_3():
    shapes = {k: COMPARISON_CONFIG[k] for k in ("num_hiddens", "num_heads", "num_layers", "norm", "placement")}
    counts = {act: sum(p.numel() for p in TinyLM(103, max_len=64, act=act, **shapes).to("meta").parameters())
              for act in ("gelu", "geglu", "swiglu")}
    d, layers = COMPARISON_CONFIG["num_hiddens"], COMPARISON_CONFIG["num_layers"]
    assert counts["geglu"] == counts["swiglu"] == counts["gelu"] + layers * (3 * d * round(8 * d / 3) - 8 * d * d)
    assert counts["swiglu"] / counts["gelu"] - 1 < 0.002


def test_parameter_counts_reject_bad_arguments():
    with pytest.raises(ValueError, match="num_hiddens"):
        ffn_parameter_counts(0)
    with pytest.raises(ValueError, match="act"):
        ffn_parameter_counts(64, ["tanh"])
    with pytest.raises(TypeError, match="acts"):
        ffn_parameter_counts(64, "gelu")


def test_shazeer_table_is_the_published_order():
    t = SHAZEER_2020_LOG_PERPLEXITY
    assert t["relu"] > t["gelu"] > t["glu"] > t["swiglu"] > t["geglu"]


# ---------------------------------------------------------------- key-value memories

@pytest.mark.parametrize("act", ["relu", "gelu", "swiglu", "geglu"])
@pytest.mark.parametrize("bias", [False, True])
def test_ffn_is_a_weighted_sum_of_value_vectors(act, bias):
    torch.manual_seed(0)
    ffn = FeedForward(32, act=act, bias=bias)
    reading = ffn_as_memories(ffn, torch.randn(2, 10, 32), top_k=5)
    assert reading.max_abs_diff < 1e-5
    assert reading.coefficients.shape == (20, ffn.ffn_num_hiddens)
    assert 0 < reading.top_share <= 1


def test_relu_switches_off_about_half_the_memories_and_gelu_none():
    torch.manual_seed(0)
    X = torch.randn(64, 32)
    relu = ffn_as_memories(FeedForward(32, act="relu"), X)
    gelu = ffn_as_memories(FeedForward(32, act="gelu"), X)
    assert 0.35 < relu.active_fraction < 0.65
    assert gelu.active_fraction == 1.0


def test_memory_reading_rejects_bad_inputs():
    ffn = FeedForward(16, act="relu")
    with pytest.raises(TypeError, match="ffn"):
        ffn_as_memories(torch.nn.Linear(16, 16), torch.randn(3, 16))
    with pytest.raises(ValueError, match="X must have shape"):
        ffn_as_memories(ffn, torch.randn(3, 15))
    with pytest.raises(ValueError, match="top_k"):
        ffn_as_memories(ffn, torch.randn(3, 16), top_k=10_000)


def test_activation_plot():
    fig = plot_activations()
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) == 3 + 1  # three functions and the zero line
    with pytest.raises(ValueError, match="acts"):
        plot_activations(["tanh"])


# ---------------------------------------------------------------- training

@pytest.mark.parametrize("vectorize", [False, True])
def test_ensemble_trains_every_seed_exactly_as_train_lm(corpus, vectorize):
    kwargs = {k: v for k, v in TINY.items() if k != "eval_batches"}
    run = train_ensemble(corpus, act="swiglu", seeds=(0, 5), eval_steps=(6, 12), vectorize=vectorize, **TINY)
    assert run.val_steps == [6, 12]
    for i, seed in enumerate((0, 5)):
        ref = train_lm(corpus, seed=seed, eval_every=6, eval_batches=2, act="swiglu", norm="rms",
                       placement="pre", **kwargs)
        if vectorize:  # a vmapped forward pass rounds differently in the last bits
            assert run.train_loss[i] == pytest.approx(ref.train_loss, abs=1e-5)
        else:  # the same loop, the same arithmetic
            assert run.train_loss[i] == ref.train_loss
        # train_lm averages the validation batches in float64, the ensemble in float32
        assert run.val_loss[i] == pytest.approx(ref.val_loss, abs=1e-5)
    # the trained weights come back: the stored model scores the recorded final loss
    model = run.model(5, corpus.vocab_size)
    assert evaluate(model, corpus, TINY["batch_size"], TINY["seq_len"], 2) == pytest.approx(run.val_loss[1][-1],
                                                                                          abs=1e-5)


def test_ensemble_members_share_nothing_and_runs_repeat(corpus):
    both = train_ensemble(corpus, act="gelu", seeds=(1, 2), eval_steps=(12,), **TINY)
    again = train_ensemble(corpus, act="gelu", seeds=(1, 2), eval_steps=(12,), **TINY)
    alone = train_ensemble(corpus, act="gelu", seeds=(2,), eval_steps=(12,), **TINY)
    assert both.train_loss == again.train_loss and both.val_loss == again.val_loss
    assert both.train_loss[1] == pytest.approx(alone.train_loss[0], abs=1e-6)
    assert both.train_loss[0] != both.train_loss[1]
    assert both.train_loss[0][0] == pytest.approx(math.log(corpus.vocab_size), abs=0.6)
    assert both.num_params == sum(p.numel() for p in both.model(1, corpus.vocab_size).parameters())


def test_ensemble_rejects_bad_arguments(corpus):
    with pytest.raises(ValueError, match="act"):
        train_ensemble(corpus, act="tanh", **TINY)
    with pytest.raises(ValueError, match="seeds must be distinct"):
        train_ensemble(corpus, seeds=(0, 0), **TINY)
    with pytest.raises(ValueError, match="seed"):
        train_ensemble(corpus, seeds=(-1,), **TINY)
    with pytest.raises(TypeError, match="seeds"):
        train_ensemble(corpus, seeds=3, **TINY)
    with pytest.raises(ValueError, match="eval_steps"):
        train_ensemble(corpus, eval_steps=(13,), **TINY)
    with pytest.raises(TypeError, match="vectorize"):
        train_ensemble(corpus, vectorize=1, eval_steps=(), **TINY)
    with pytest.raises(ValueError, match="warmup_steps"):
        train_ensemble(corpus, eval_steps=(), **{**TINY, "warmup_steps": -1})


# ---------------------------------------------------------------- the comparison

def test_comparison_records_every_seed_and_its_summary(comparison, corpus):
    assert set(comparison.runs) == {"gelu", "geglu", "swiglu"}
    assert comparison.sweep is not None and set(comparison.config["rates"]) == set(comparison.runs)
    for act, run in comparison.runs.items():  # seed 0 is the sweep's model at the chosen rate
        rate = comparison.config["rates"][act]
        assert rate == comparison.sweep.best_rate(act) and run.config["lr"] == rate
        assert run.val_loss[0] == comparison.sweep.runs[act][comparison.sweep.rates.index(rate)].val_loss[0]
    assert comparison.seeds == [0, 1, 2] and comparison.val_steps == [8, 16, 24]
    assert comparison.corpus_chars == len(corpus.text) and comparison.corpus_sha256 == corpus.sha256
    assert comparison.runs["geglu"].num_params == comparison.runs["swiglu"].num_params
    for run in comparison.runs.values():
        assert len(run.train_loss) == 3 and all(len(losses) == 24 for losses in run.train_loss)
        # the models learn: character statistics alone take the loss far below uniform
        assert max(losses[-1] for losses in run.val_loss) < math.log(corpus.vocab_size) - 1.0
    diffs = comparison.differences(24)
    assert diffs == pytest.approx([g - s for g, s in zip(comparison.val_loss("gelu", 24),
                                                        comparison.val_loss("swiglu", 24))])
    s = comparison.summary(24)
    assert s["mean"] == pytest.approx(sum(diffs) / 3) and s["min"] <= s["mean"] <= s["max"]
    assert s["wins"] == sum(d > 0 for d in diffs) and s["seeds"] == 3
    assert s["std"] == pytest.approx((sum((d - s["mean"]) ** 2 for d in diffs) / 2) ** 0.5)  # n - 1
    table = comparison.seed_table()
    assert table.shape == (3 * 3 + 3, 3)
    assert table.loc[("seed 1", 24), "difference"] == pytest.approx(diffs[1])
    with pytest.raises(ValueError, match="step"):
        comparison.val_loss("gelu", 7)
    with pytest.raises(ValueError, match="act"):
        comparison.val_loss("relu", 8)
    gaps = comparison.gap_table()
    assert gaps.shape == (3, 6) and list(gaps.index) == [8, 16, 24]
    assert gaps.iloc[2, 2] == pytest.approx(s["mean"]) and gaps.iloc[2, 3] == pytest.approx(s["std"])


def test_comparison_does_not_depend_on_the_workers(comparison, corpus):
    serial = ffn_comparison(corpus, seeds=(0, 1, 2), num_steps=24, eval_steps=(8, 16, 24), workers=1, **SMALL)
    for act in ("gelu", "geglu", "swiglu"):
        assert serial.runs[act].val_loss == comparison.runs[act].val_loss
        assert serial.runs[act].train_loss == comparison.runs[act].train_loss
    assert serial.config["rates"] == comparison.config["rates"]


def test_comparison_workers_restore_the_thread_count(corpus, two_threads):
    # two workers on two threads: each trains with one, and the caller gets its two back
    ffn_comparison(corpus, seeds=(0,), num_steps=2, eval_steps=(2,), workers=2, **SMALL)
    assert torch.get_num_threads() == two_threads


def test_comparison_plot(comparison):
    fig = plot_ffn_comparison(comparison)
    assert len(fig.axes) == 2
    assert len(fig.axes[0].lines) == 3  # one mean per activation, each with a band over the seeds
    assert len(fig.axes[0].collections) == 3
    assert list(fig.axes[0].lines[2].get_ydata()) == pytest.approx(
        [sum(comparison.val_loss("swiglu", s)) / 3 for s in (8, 16, 24)])
    # per gated FFN: the mean gap, then one marker line per seed; then the zero line
    assert len(fig.axes[1].lines) == 2 * (1 + 3) + 1 and len(fig.axes[1].collections) == 2
    swiglu_mean, swiglu_seed_0 = fig.axes[1].lines[4], fig.axes[1].lines[5]
    assert list(swiglu_mean.get_xdata()) == [8, 16, 24]
    assert list(swiglu_mean.get_ydata()) == pytest.approx([comparison.summary(s)["mean"] for s in (8, 16, 24)])
    assert list(swiglu_seed_0.get_ydata()) == pytest.approx([comparison.differences(s)[0] for s in (8, 16, 24)])
    with pytest.raises(ValueError, match="act"):
        plot_ffn_comparison(comparison, baseline="relu")


def test_comparison_rejects_bad_arguments(corpus):
    with pytest.raises(TypeError, match="act"):
        ffn_comparison(corpus, act="gelu")
    with pytest.raises(TypeError, match="acts"):
        ffn_comparison(corpus, acts="gelu")
    with pytest.raises(ValueError, match="distinct"):
        ffn_comparison(corpus, acts=("gelu", "gelu"))
    with pytest.raises(ValueError, match="acts"):
        ffn_comparison(corpus, acts=("gelu", "tanh"))
    with pytest.raises(ValueError, match="workers"):
        ffn_comparison(corpus, workers=0)
    with pytest.raises(TypeError, match="rates"):
        ffn_comparison(corpus, rates=0.01)
    with pytest.raises(TypeError, match="unknown"):
        ffn_comparison(corpus, dropout=0.1)


# ---------------------------------------------------------------- the learning-rate sweep

# lr_sweep's settings for the TINY model (everything but lr and num_steps)
SWEEP = dict(batch_size=4, seq_len=16, warmup_steps=3, num_hiddens=24, num_heads=2, num_layers=1, eval_batches=2)


@pytest.fixture(scope="module")
def sweep(corpus):
    return lr_sweep(corpus, rates=(0.02, 0.005, 0.01), seed=5, num_steps=12, **SWEEP)


def test_sweep_trains_every_pair_as_it_trains_alone(sweep, corpus):
    assert sweep.rates == [0.005, 0.01, 0.02] and sweep.acts == ["gelu", "geglu", "swiglu"] and sweep.seed == 5
    for act in ("gelu", "swiglu"):
        for i, rate in enumerate(sweep.rates):
            alone = train_ensemble(corpus, act=act, seeds=(5,), lr=rate, eval_steps=(12,), num_steps=12, **SWEEP)
            assert sweep.train_loss[act][i] == alone.train_loss[0]  # scales 1/4, 1/2, 1: exact rates
            assert sweep.val_loss[act][i] == pytest.approx(alone.val_loss[0][0], abs=1e-6)
    assert sweep.train_loss["gelu"][0] != sweep.train_loss["gelu"][2]
    assert "lr" not in sweep.config and sweep.config["num_steps"] == 12


def test_sweep_best_rate_and_table(sweep):
    for act in sweep.acts:
        losses = sweep.val_loss[act]
        assert sweep.best_rate(act) == sweep.rates[losses.index(min(losses))]
    table = sweep.table()
    assert table.shape == (3, 3) and list(table.index) == sweep.rates
    assert table.iloc[1, 2] == sweep.val_loss["swiglu"][1]
    diverged = LRSweep(["gelu"], [0.01, 0.1], 0, {"gelu": [2.0, math.nan]}, {}, 0.0, {})
    assert diverged.best_rate("gelu") == 0.01
    with pytest.raises(ValueError, match="every rate"):
        LRSweep(["gelu"], [0.1], 0, {"gelu": [math.nan]}, {}, 0.0, {}).best_rate("gelu")
    with pytest.raises(ValueError, match="act"):
        sweep.best_rate("relu")


def test_sweep_rates_are_powers_of_two_apart_and_hold_the_default_rate():
    assert COMPARISON_CONFIG["lr"] in SWEEP_RATES
    assert all(math.log2(b / a) == round(math.log2(b / a)) > 0 for a, b in zip(SWEEP_RATES, SWEEP_RATES[1:]))


def test_sweep_rejects_bad_arguments(corpus):
    with pytest.raises(TypeError, match="acts"):
        lr_sweep(corpus, acts="gelu")
    with pytest.raises(ValueError, match="acts"):
        lr_sweep(corpus, acts=("gelu", "tanh"))
    with pytest.raises(ValueError, match="distinct"):
        lr_sweep(corpus, rates=(0.01, 0.01))
    with pytest.raises(ValueError, match=r"rates\[1\]"):
        lr_sweep(corpus, rates=(0.01, -1.0))
    with pytest.raises(ValueError, match="seed"):
        lr_sweep(corpus, seed=-1)
    with pytest.raises(ValueError, match="num_steps"):
        lr_sweep(corpus, num_steps=0)
    with pytest.raises(TypeError, match="rates="):
        lr_sweep(corpus, lr=0.01)
    with pytest.raises(TypeError, match="unknown"):
        lr_sweep(corpus, dropout=0.1)


def test_comparison_at_each_activations_own_rate(corpus):
    both = dict(acts=("gelu", "swiglu"), seeds=(0,), num_steps=4, eval_steps=(4,), workers=1, **{**SMALL, "lr": 1e-2})
    result = ffn_comparison(corpus, rates={"swiglu": 5e-3}, **both)
    assert result.config["rates"] == {"gelu": 1e-2, "swiglu": 5e-3}
    assert result.runs["gelu"].config["lr"] == 1e-2 and result.runs["swiglu"].config["lr"] == 5e-3
    alone = train_ensemble(corpus, act="swiglu", seeds=(0,), num_steps=4, eval_steps=(4,),
                           **{**SMALL, "lr": 5e-3})
    assert result.runs["swiglu"].train_loss == alone.train_loss
    with pytest.raises(ValueError, match="rates"):
        ffn_comparison(corpus, rates={"relu": 1e-2}, **both)
    with pytest.raises(ValueError, match="rates"):
        ffn_comparison(corpus, rates={"gelu": 0}, **both)
    with pytest.raises(TypeError, match="rates"):
        ffn_comparison(corpus, rates="0.01", **both)


# ---------------------------------------------------------------- the router's load

def test_balance_by_bias_evens_out_a_skewed_router():
    torch.manual_seed(0)
    moe = MixtureOfExperts(16, 4, top_k=1, router="sigmoid")
    tokens = torch.randn(2000, 16) + 3.0 * torch.randn(16)  # a shared component skews the choice
    with torch.no_grad():
        weights_before = moe.route(tokens)[0]
    loads = balance_by_bias(moe, tokens, num_updates=200, gamma=0.01)
    assert len(loads) == 201 and all(load.shape == (4,) for load in loads)
    assert all(float(load.mean()) == pytest.approx(1.0) for load in loads)  # multiples of the fair share
    assert float(loads[0].max()) > 1.5 and float(loads[-1].max()) < 1.2
    assert float(moe.expert_bias.abs().sum()) > 0
    assert weights_before.shape == (2000, 1)


def test_router_loads_measures_three_routings():
    result = router_loads(num_hiddens=16, num_experts=4, top_k=2, num_tokens=1000, num_updates=50, seed=1)
    assert set(result) == {"random tokens", "with a shared component", "with a shared component, balanced",
                           "chance_std"}
    assert result["chance_std"] == pytest.approx(math.sqrt((1 - 0.5) / (1000 * 0.5)))
    for name in ("random tokens", "with a shared component", "with a shared component, balanced"):
        assert len(result[name]) == 4 and sum(result[name]) == pytest.approx(4.0)
    assert result == router_loads(num_hiddens=16, num_experts=4, top_k=2, num_tokens=1000, num_updates=50,
                                  seed=1)
    assert max(result["with a shared component"]) > max(result["with a shared component, balanced"])
    with pytest.raises(ValueError, match="offset"):
        router_loads(offset=-1.0)
    with pytest.raises(ValueError, match="num_tokens"):
        router_loads(num_tokens=0)
    with pytest.raises(ValueError, match="gamma"):
        router_loads(gamma=0.0)


def test_moe_models_active_is_a_fraction_of_total():
    for sizes in MOE_MODELS.values():
        assert sizes["per_token"] < sizes["routed"] and sizes["active"] < sizes["total"]
    assert MOE_MODELS["DeepSeek-V3"]["shared"] == 1 and MOE_MODELS["Qwen3-235B-A22B"]["shared"] == 0
