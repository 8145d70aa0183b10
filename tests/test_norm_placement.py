"""The chapter "Where the norm goes": the measurement it prints (``d2lmini.probes.measure_stack``), its training runs and its figures."""

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


# --------------------------------------------------------------------------- training


_TINY = dict(num_steps=3, batch_size=2, seq_len=8, eval_batches=1)


@pytest.fixture(scope="module")
def corpus():
    from d2lmini.data import python_reference_corpus

    return python_reference_corpus()


def test_train_placements_trains_each_run_as_train_lm_does(corpus):
    from d2lmini.chapters.ch04_norm_placement import TRAINING_MODEL, train_placements
    from d2lmini.train import train_lm

    runs = train_placements(corpus, num_layers=2, lr=1e-2, runs=(("post", 1), ("pre", 1), ("post", 1 / 4)),
                            warmup_steps=2, seeds=(3, 4), **_TINY)
    assert [(r.config["placement"], r.config["lr"], r.config["seed"]) for r in runs] == [
        ("post", 1e-2, 3), ("post", 1e-2, 4), ("pre", 1e-2, 3), ("pre", 1e-2, 4), ("post", 2.5e-3, 3), ("post", 2.5e-3, 4)]
    for run in runs:
        alone = train_lm(corpus, num_steps=3, batch_size=2, seq_len=8, lr=run.config["lr"], warmup_steps=2,
                         schedule="cosine", betas=(0.9, 0.95), clip_norm=1.0, eval_every=3, eval_batches=1,
                         seed=run.config["seed"], num_layers=2, placement=run.config["placement"], **TRAINING_MODEL)
        assert run.train_loss == pytest.approx(alone.train_loss, rel=1e-5)
        assert run.val_loss == pytest.approx(alone.val_loss, rel=1e-5)
        assert run.lr == pytest.approx(alone.lr) and not run.diverged


def test_placement_groups_give_the_same_numbers_in_workers_as_here():
    from d2lmini.chapters.ch04_norm_placement import train_placement_groups

    groups = [dict(num_layers=1, lr=1e-2, runs=(("post", 1),), seeds=(0,), **_TINY),
              dict(num_layers=2, lr=1e-2, runs=(("pre", 1),), clip_norm=None, **_TINY)]
    here, there = train_placement_groups(groups, num_workers=1), train_placement_groups(groups, num_workers=2)
    assert [r.config["seed"] for r in here] == [0, 0, 1]
    assert [r.train_loss for r in here] == [r.train_loss for r in there]
    assert [r.val_loss for r in here] == [r.val_loss for r in there]
    with pytest.raises(TypeError, match="corpus"):
        train_placement_groups([dict(groups[0], corpus=None)])
    with pytest.raises(TypeError, match="groups"):
        train_placement_groups(groups[0])


@pytest.mark.parametrize("runs, error", [("post", TypeError), ((), TypeError), ((("post",),), TypeError),
                                         ((("middle", 1),), ValueError), ((("pre", 0),), ValueError)])
def test_train_placements_rejects_bad_runs(corpus, runs, error):
    from d2lmini.chapters.ch04_norm_placement import train_placements

    with pytest.raises(error, match="runs"):
        train_placements(corpus, num_layers=1, lr=1e-2, runs=runs, **_TINY)


def test_training_table_puts_post_ln_beside_pre_ln_per_configuration():
    from d2lmini.chapters.ch04_norm_placement import plot_training, seed_losses, training_table
    from d2lmini.train import TrainResult

    def result(placement, num_layers, lr, warmup_steps, loss, seed=0):
        config = dict(placement=placement, num_layers=num_layers, lr=lr, warmup_steps=warmup_steps, seed=seed)
        return TrainResult(config, train_loss=[4.0, loss], val_steps=[2], val_loss=[loss])

    results = [result("post", 8, 0.02, 0, 3.2), result("post", 8, 0.02, 0, 3.3, seed=1), result("pre", 8, 0.02, 0, 2.5),
               result("post", 8, 0.005, 0, 2.4), result("post", 8, 0.02, 75, 3.3), result("post", 2, 0.02 / 4, 0, 2.41),
               result("pre", 2, 0.005, 0, 2.4)]
    assert seed_losses(results)[8, 0.02, 0, "post"] == [3.2, 3.3]
    table = training_table(results)
    assert list(table.index) == [(8, 0.02, 0), (8, 0.02, 75), (8, 0.005, 0), (2, 0.005, 0)]
    assert list(table.columns) == ["post-LN", "pre-LN", "post-LN seed range", "pre-LN seed range"]
    assert table["post-LN"].tolist() == pytest.approx([3.25, 3.3, 2.4, 2.41])
    assert table.loc[(8, 0.02, 0), "post-LN seed range"] == pytest.approx(0.1)
    assert table.loc[(2, 0.005, 0), "pre-LN"] == 2.4 and table.loc[(2, 0.005, 0), "pre-LN seed range"] == 0
    assert math.isnan(table.loc[(8, 0.02, 75), "pre-LN"])  # not trained: left empty
    one_seed = training_table([r for r in results if r.config["seed"] == 0])
    assert list(one_seed.columns) == ["post-LN", "pre-LN"]  # one seed has no range
    fig = plot_training(results, reference=3.0)
    assert [ax.get_title() for ax in fig.axes] == ["8 blocks, peak rates 0.02 and 0.005", "2 blocks, peak rate 0.005"]
    assert [text.get_text() for text in fig.legends[0].get_texts()] == [
        "post-LN, peak rate 0.02", "pre-LN, peak rate 0.02", "post-LN, peak rate 0.005",
        "post-LN, peak rate 0.02, warm-up 75", "frequencies alone", "pre-LN, peak rate 0.005"]
    with pytest.raises(TypeError, match="results"):
        training_table({"post": results[0]})
    with pytest.raises(ValueError, match="two post-LN runs"):
        training_table(results + [result("post", 8, 0.02, 0, 3.0)])


def test_frequency_loss_is_the_cross_entropy_of_the_training_frequencies():
    from d2lmini.data import frequency_loss
    from d2lmini.data import CharCorpus

    corpus = CharCorpus.from_text("aab" * 400 + "abc", val_fraction=0.1)
    counts = torch.bincount(corpus.train, minlength=corpus.vocab_size).double() + 1
    expected = -sum(math.log(counts[c] / counts.sum()) for c in corpus.val.tolist()) / len(corpus.val)
    assert frequency_loss(corpus) == pytest.approx(float(expected))
    on_train = -sum(math.log(counts[c] / counts.sum()) for c in corpus.train.tolist()) / len(corpus.train)
    assert frequency_loss(corpus, split="train") == pytest.approx(float(on_train))  # beside training losses
    with pytest.raises(TypeError, match="corpus"):
        frequency_loss("aab")
    with pytest.raises(ValueError, match="split"):
        frequency_loss(corpus, split="test")


# --------------------------------------------------------------------------- five placements


_SMALL = dict(num_hiddens=16, num_heads=2, num_steps=8, dtype=torch.float64)


def test_plot_placements_gives_each_placement_its_line_style():
    from d2lmini.chapters.ch04_norm_placement import PLACEMENT_STYLES, plot_placements, probe_placements

    probes = probe_placements(4, **_SMALL)
    fig = plot_placements(probes)
    for ax in fig.axes:
        assert [line.get_linestyle() for line in ax.get_lines()] == [
            {"-": "-", "--": "--", ":": ":", "-.": "-."}[PLACEMENT_STYLES[p]["linestyle"]] for p in probes]
    assert len(fig.legends) == 1
    with pytest.raises(TypeError, match="probes"):
        plot_placements(list(probes.values()))


def test_static_explorer_uses_known_probes_instead_of_probing_again(monkeypatch):
    import d2lmini
    from d2lmini.chapters import ch04_norm_placement as chapter

    known = chapter.probe_placements(4, **_SMALL)
    fresh = d2lmini.depth_explorer_static(depths=(2, 4), norms=("layer",), **_SMALL).to_html()
    calls = []
    original = chapter.probe_placements
    monkeypatch.setattr(chapter, "probe_placements", lambda *a, **k: calls.append(a) or original(*a, **k))
    reused = d2lmini.depth_explorer_static(depths=(2, 4), norms=("layer",), known=known.values(), **_SMALL)
    assert reused.to_html() == fresh
    assert sorted(depth for depth, _ in calls) == [2] * 5  # only the depth the known probes lack
    other_seed = chapter.probe_placements(4, placements=("post",), seed=1, **_SMALL).values()
    calls.clear()
    d2lmini.depth_explorer_static(depths=(4,), placements=("post",), norms=("layer",), known=other_seed, **_SMALL)
    assert len(calls) == 1  # a probe of another seed is not this twin's
    with pytest.raises(TypeError, match="known"):
        d2lmini.depth_explorer_static(depths=(4,), norms=("layer",), known=[1.0], **_SMALL)
