"""The chapter "Where the norm goes": the measurement it prints, ``d2lmini.probes.measure_stack``."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from d2lmini import TransformerBlock
from d2lmini.norms import make_norm
from d2lmini.probes import ATTENTION_WEIGHTS, measure_stack, probe_depth, stream_rms, token_spread


def _stack(placement: str, depth: int = 2, num_hiddens: int = 16):
    torch.manual_seed(0)
    blocks = nn.ModuleList(TransformerBlock(num_hiddens, 2, norm="layer", act="relu", placement=placement)
                           for _ in range(depth))
    final_norm = None if placement == "post" else make_norm("layer", num_hiddens)
    return blocks, final_norm, torch.randn(1, 6, num_hiddens), torch.randn(1, 6, num_hiddens)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_measure_stack_records_every_depth_and_the_read_out_gradients(placement):
    blocks, final_norm, X, R = _stack(placement)
    rms, spread, grads = measure_stack(blocks, final_norm, X, R)
    # forward: the input and the stream after each block
    expected, Xk = [X], X
    for block in blocks:
        Xk = block(Xk)
        expected.append(Xk)
    assert rms == pytest.approx([stream_rms(x.detach()) for x in expected])
    assert spread == pytest.approx([token_spread(x.detach()) for x in expected])
    # backward: the gradients of the loss sum(Y * R) / sqrt(n d), block by block
    assert list(grads) == list(ATTENTION_WEIGHTS) + ["W_1", "W_2"]
    assert all(len(values) == len(blocks) for values in grads.values())
    Y = Xk if final_norm is None else final_norm(Xk)
    W_q = blocks[1].attention.W_q.weight
    (g,) = torch.autograd.grad((Y * R).sum() / math.sqrt(Y.numel()), W_q)
    assert grads["W_q"][1] == pytest.approx(float(g.norm()), rel=1e-5)


def test_probe_depth_reports_what_measure_stack_measures():
    probe = probe_depth("pre", depth=3, num_hiddens=16, num_heads=2, num_steps=8, seed=1)
    assert len(probe.stream_rms) == len(probe.token_spread) == 4
    assert set(probe.grad_norms) == set(ATTENTION_WEIGHTS) | {"W_1", "W_2"}
    assert probe.stream_rms == probe_depth("pre", depth=3, num_hiddens=16, num_heads=2, num_steps=8,
                                           seed=1).stream_rms


@pytest.mark.parametrize("name", ["placement", "lr", "seed"])
def test_warmup_comparison_sets_placement_lr_and_seed_itself(name):
    from d2lmini.chapters.ch04_norm_placement import warmup_comparison

    with pytest.raises(TypeError, match=name):
        warmup_comparison(None, **{name: 1})  # refused before any training


_TINY = dict(num_hiddens=16, num_heads=2, num_layers=2, norm="layer", act="relu", bias=True)


def test_train_seeds_trains_each_seed_as_train_lm_does():
    from d2lmini.chapters.ch04_norm_placement import train_seeds
    from d2lmini.data import python_reference_corpus
    from d2lmini.train import train_lm

    corpus = python_reference_corpus()
    runs = train_seeds(corpus, seeds=(3, 5), num_steps=6, batch_size=4, seq_len=16, lr=1e-2, warmup_steps=3,
                       eval_batches=2, placement="post", **_TINY)
    assert [run.config["seed"] for run in runs] == [3, 5]
    for seed, run in zip((3, 5), runs):
        alone = train_lm(corpus, num_steps=6, batch_size=4, seq_len=16, lr=1e-2, warmup_steps=3, eval_every=6,
                         eval_batches=2, seed=seed, placement="post", **_TINY)
        assert run.train_loss == pytest.approx(alone.train_loss, rel=1e-5)
        assert run.val_loss == pytest.approx(alone.val_loss, rel=1e-5)
        assert run.lr == alone.lr and not run.diverged


def test_warmup_comparison_runs_every_configuration_at_every_rate():
    from d2lmini.chapters.ch04_norm_placement import WARMUP_RUNS, warmup_comparison, warmup_table
    from d2lmini.data import python_reference_corpus

    runs = warmup_comparison(python_reference_corpus(), lrs=(1e-3, 1e-2), seeds=(0, 1), num_steps=4,
                             warmup_steps=2, batch_size=2, seq_len=8, eval_batches=1, **_TINY)
    assert list(runs) == [(lr, label) for lr in (1e-3, 1e-2) for label, _, _ in WARMUP_RUNS]
    for (lr, label), results in runs.items():
        placement, warm = {l: (p, w) for l, p, w in WARMUP_RUNS}[label]
        assert [r.config["placement"] for r in results] == [placement] * 2
        assert [r.config["warmup_steps"] for r in results] == [2 if warm else 0] * 2
        assert max(results[0].lr) == lr
    table = warmup_table(runs)
    assert list(table.columns) == ["seed 0", "seed 1", "mean", "std", "diverged"]
    row = table.loc[(1e-2, "pre-LN, no warm-up")]
    values = [r.val_loss[-1] for r in runs[(1e-2, "pre-LN, no warm-up")]]
    assert row["mean"] == pytest.approx(sum(values) / 2)
    assert row["std"] == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2))


def test_warmup_table_leaves_diverged_seeds_out_of_the_mean():
    from d2lmini.chapters.ch04_norm_placement import warmup_table
    from d2lmini.train import TrainResult

    results = [TrainResult({"seed": s}, val_loss=[v], diverged=not math.isfinite(v))
               for s, v in ((0, 2.0), (1, math.nan), (2, 3.0))]
    row = warmup_table({(0.01, "x"): results}).iloc[0]
    assert row["mean"] == pytest.approx(2.5) and row["diverged"] == 1
    assert math.isnan(row["seed 1"])
    with pytest.raises(TypeError, match="runs"):
        warmup_table([results])


def test_last_block_gradients_reads_block_L_of_each_probe():
    from d2lmini.chapters.ch04_norm_placement import BLOCK_WEIGHTS, last_block_gradients

    sizes = dict(num_hiddens=16, num_heads=2, num_steps=8)
    table = last_block_gradients(depths=(1, 3), placements=("pre",), seeds=(0, 2), **sizes)
    assert list(table.index) == [("pre", 1, 0), ("pre", 1, 2), ("pre", 3, 0), ("pre", 3, 2)]
    probe = probe_depth("pre", depth=3, seed=2, **sizes)
    row = table.loc[("pre", 3, 2)]
    assert [row[w] for w in BLOCK_WEIGHTS] == pytest.approx([probe.grad_norms[w][2] for w in BLOCK_WEIGHTS])
    assert row["all"] == pytest.approx(math.sqrt(sum(row[w] ** 2 for w in BLOCK_WEIGHTS)))
    with pytest.raises(ValueError, match="depths"):
        last_block_gradients(depths=(0, 2), **sizes)


def test_depth_exponents_recovers_a_power_law():
    import pandas as pd

    from d2lmini.chapters.ch04_norm_placement import depth_exponents

    index = pd.MultiIndex.from_tuples([(p, L, s) for p in ("post", "pre") for L in (2, 8, 32) for s in (0, 1)],
                                      names=["placement", "L", "seed"])
    values = [3.0 * (L ** -0.5 if p == "pre" else 1.0) * (1.1 if s else 0.9) for p, L, s in index]
    table = pd.DataFrame({"W_2": values}, index=index)
    assert depth_exponents(table) == pytest.approx({"post": 0.0, "pre": -0.5}, abs=1e-12)
    with pytest.raises(ValueError, match="column"):
        depth_exponents(table, "W_9")
