"""The chapter "Residual connections": skip stacks, gradients with depth, identity blocks, training."""

from __future__ import annotations

import math

import pytest
import torch
from matplotlib.figure import Figure

from d2lmini import TransformerBlock
from d2lmini.data import python_reference_corpus
from d2lmini.plot import skip_label
from d2lmini.chapters.ch02_residual import (SKIP_CONFIGS, PlainBlock, depth_gradients, make_skip_stack,
                                            plot_depth_gradients, plot_skip_training, skip_training, unigram_entropy,
                                            zero_output_projections_, zeroed_block_gaps)

SMALL = dict(num_hiddens=16, num_heads=2)


@pytest.fixture(scope="module")
def sweep():
    return depth_gradients(depths=(2, 4, 8), num_steps=8, seed=0, **SMALL)


@pytest.fixture(scope="module")
def corpus():
    return python_reference_corpus()


TINY_LM = dict(num_layers=3, num_hiddens=32, num_heads=2, num_steps=60, batch_size=8, seq_len=32, lr=3e-3,
               warmup_steps=5, eval_batches=2, num_workers=1)


@pytest.fixture(scope="module")
def training(corpus):
    return skip_training(corpus, seeds=(0, 1), **TINY_LM)


# --------------------------------------------------------------------------- blocks and stacks


def test_plain_block_adds_or_replaces_and_keeps_the_shape():
    torch.manual_seed(0)
    X = torch.randn(2, 5, 16)
    for residual in (True, False):
        block = PlainBlock(16, 2, residual=residual)
        Y = block.attention(X, X, X)
        H = X + Y if residual else Y
        expected = H + block.ffn(H) if residual else block.ffn(H)
        torch.testing.assert_close(block(X), expected)
        assert block(X).shape == X.shape
    with pytest.raises(ValueError, match="X"):
        PlainBlock(16, 2)(torch.randn(2, 5, 8))
    with pytest.raises(TypeError, match="residual"):
        PlainBlock(16, 2, residual="yes")


def test_make_skip_stack_nests_is_deterministic_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    deep = make_skip_stack(4, "pre", False, seed=3, **SMALL)
    shallow = make_skip_stack(2, "pre", False, seed=3, **SMALL)
    other = make_skip_stack(2, "pre", False, seed=4, **SMALL)
    assert torch.equal(torch.random.get_rng_state(), state)
    for a, b in zip(shallow.parameters(), deep[:2].parameters()):
        assert torch.equal(a, b)  # the shallow stack is the deep one's first blocks
    assert not torch.equal(shallow[0].attention.W_q.weight, other[0].attention.W_q.weight)
    assert isinstance(make_skip_stack(1, "none", True, **SMALL)[0], PlainBlock)
    block = make_skip_stack(1, "post", False, **SMALL)[0]
    assert isinstance(block, TransformerBlock) and block.placement == "post" and not block.addnorm1.residual


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(depth=0), ValueError, "depth"),
    (dict(depth=2, placement="sandwich"), ValueError, "placement"),
    (dict(depth=2, residual=1), TypeError, "residual"),
    (dict(depth=2, init="zeros"), ValueError, "init"),
    (dict(depth=2, seed=1.5), TypeError, "seed"),
])
def test_make_skip_stack_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        make_skip_stack(**kwargs)


def test_skip_label():
    assert skip_label("pre", True) == "pre-LN, with skips"
    assert skip_label("none", False) == "no norms, no skips"
    with pytest.raises(ValueError, match="placement"):
        skip_label("middle", True)


# --------------------------------------------------------------------------- depth sweep


def test_without_norms_and_skips_the_gradient_vanishes_geometrically(sweep):
    plain = sweep.get("none", False)
    g = [plain.first_block_grad(L) for L in (2, 4, 8)]
    assert g[0] > g[1] > g[2]
    assert (g[2] / g[0]) ** (1 / 6) < 0.2  # shrinks by a constant factor per added block
    assert plain.input_grad[8] < 1e-6 * plain.input_grad[2]
    assert plain.stream_rms[8] < 1e-6  # the forward signal vanishes too
    for residual_probe in (sweep.get("none", True), sweep.get("pre", True)):
        for L in (2, 4, 8):
            assert 0.5 < residual_probe.first_block_grad(L) < 50
            assert 0.3 < residual_probe.input_grad[L] < 5


def test_with_norms_the_gradient_does_not_vanish_but_the_tokens_collapse(sweep):
    pre_ns, pre = sweep.get("pre", False), sweep.get("pre", True)
    for L in (2, 4, 8):
        assert pre_ns.first_block_grad(L) > 0.2 * pre.first_block_grad(L)
        assert pre_ns.input_grad[L] > 0.05
    assert pre_ns.token_spread[8] < 1e-12 and sweep.get("none", False).token_spread[8] < 1e-12
    assert pre.token_spread[8] > 0.5 and sweep.get("none", True).token_spread[8] > 0.5


def test_depth_gradients_shapes_rows_and_determinism(sweep):
    assert [(p.placement, p.residual) for p in sweep.probes] == list(SKIP_CONFIGS)
    for probe in sweep.probes:
        assert probe.depths == [2, 4, 8]
        assert len(probe.stream_rms) == len(probe.token_spread) == 9
        assert [len(probe.block_grad[L]) for L in (2, 4, 8)] == [2, 4, 8]
        assert all(math.isfinite(v) and v > 0 for v in probe.block_grad[8])
    rows = sweep.rows(depths=(2, 8))
    assert len(rows) == 8 and rows[0]["stack"] == "no norms, no skips" and rows[0]["L"] == 2
    assert rows[0]["‖∇θ_1‖"] == sweep.probes[0].first_block_grad(2)
    again = depth_gradients(depths=(2, 4, 8), num_steps=8, seed=0, **SMALL)
    assert again.rows() == sweep.rows()
    other = depth_gradients(depths=(2,), configs=[("pre", True)], num_steps=8, seed=1, **SMALL)
    assert other.probes[0].first_block_grad(2) != sweep.get("pre", True).first_block_grad(2)
    with pytest.raises(ValueError, match="depths"):
        sweep.rows(depths=(3,))
    with pytest.raises(ValueError, match="placement, residual"):
        other.get("none", True)
    with pytest.raises(ValueError, match="depth"):
        other.probes[0].first_block_grad(4)


def test_depth_gradients_summary_has_one_row_per_stack(sweep):
    rows = sweep.summary(depths=(2, 8))
    assert [row["stack"] for row in rows] == [skip_label(*config) for config in SKIP_CONFIGS]
    for row, probe in zip(rows, sweep.probes):
        assert list(row) == ["stack", "‖∇θ_1‖, L = 2", "‖∇θ_1‖, L = 8", "stream RMS after block 8",
                             "token spread after block 8"]
        assert row["‖∇θ_1‖, L = 8"] == probe.first_block_grad(8)
        assert row["stream RMS after block 8"] == probe.stream_rms[8]
        assert row["token spread after block 8"] == probe.token_spread[8]
    assert len(sweep.summary()[0]) == 6  # every measured depth, then the last block's stream
    row = sweep.summary(depths=(2,), blocks=(0, 4))[1]
    assert list(row)[2:] == ["stream RMS after block 0", "token spread after block 0", "stream RMS after block 4",
                             "token spread after block 4"]
    assert row["stream RMS after block 4"] == sweep.probes[1].stream_rms[4]
    with pytest.raises(ValueError, match="blocks"):
        sweep.summary(blocks=(9,))
    with pytest.raises(TypeError, match="blocks"):
        sweep.summary(blocks=4)
    with pytest.raises(ValueError, match="depth"):
        sweep.summary(depths=(3,))
    with pytest.raises(TypeError, match="depths"):
        sweep.summary(depths=8)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(depths=(4, 2)), ValueError, "increasing"),
    (dict(depths=()), ValueError, "depths"),
    (dict(depths=8), TypeError, "depths"),
    (dict(configs=[("pre", "yes")]), TypeError, "residual"),
    (dict(configs=[("side", True)]), ValueError, "placement"),
    (dict(configs=["pre"]), TypeError, "pair"),
    (dict(num_steps=1), ValueError, "num_steps"),
    (dict(seed="0"), TypeError, "seed"),
])
def test_depth_gradients_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        depth_gradients(**{**dict(depths=(2,), num_steps=4, **SMALL), **kwargs})


# --------------------------------------------------------------------------- identity


def test_a_zeroed_pre_ln_block_is_exactly_the_identity_and_post_ln_is_not():
    rows = {row["block"]: row for row in zeroed_block_gaps(num_hiddens=16, num_heads=2, num_steps=6, depth=2)}
    assert rows["pre-LN"]["block gap"] == 0.0 and rows["pre-LN"]["stack gap"] == 0.0
    assert rows["post-LN"]["block gap"] > 0.5  # Norm(x) != x for an unnormalized x
    assert 0.0 < rows["post-LN"]["stack gap"] < 1e-3  # normalizing twice is almost normalizing once
    assert rows["pre-LN, no skips"]["block gap"] == rows["pre-LN, no skips"]["max |X|"]  # output is zero
    assert rows == {row["block"]: row for row in zeroed_block_gaps(num_hiddens=16, num_heads=2, num_steps=6,
                                                                    depth=2)}


def test_zero_output_projections_zeroes_both_sublayers_outputs():
    block = zero_output_projections_(TransformerBlock(16, 2, bias=True))
    X = torch.randn(1, 3, 16)
    assert torch.equal(block.attention(X, X, X), torch.zeros_like(X))
    assert torch.equal(block.ffn(X), torch.zeros_like(X))
    with pytest.raises(TypeError, match="W_o"):
        zero_output_projections_(torch.nn.Linear(4, 4))


# --------------------------------------------------------------------------- training


def test_unigram_entropy():
    assert unigram_entropy(torch.tensor([0, 1, 2, 3] * 5)) == pytest.approx(math.log(4))
    assert unigram_entropy(torch.tensor([7, 7, 7])) == 0.0
    with pytest.raises(TypeError, match="integer"):
        unigram_entropy(torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="1-D"):
        unigram_entropy(torch.zeros(2, 2, dtype=torch.long))


def test_training_without_skips_stalls_near_the_unigram_entropy(training, corpus):
    with_skips, without = training.with_skips, training.without_skips
    assert not with_skips.diverged and not without.diverged
    assert len(with_skips.train_loss) == len(without.train_loss) == 60
    assert with_skips.smoothed(10)[-1] < without.smoothed(10)[-1] - 0.2
    assert abs(without.smoothed(10)[-1] - training.unigram_entropy) < 0.25
    assert training.unigram_entropy == pytest.approx(unigram_entropy(corpus.train))
    assert 3.0 < training.unigram_entropy < 3.5
    spread = training.init_token_spread
    assert spread[True][0] == spread[False][0]  # same embedding: same initial weights
    assert len(spread[True]) == 4 and spread[False][-1] < spread[True][-1] - 0.3


def test_skip_training_is_deterministic_and_the_same_in_two_workers(training, corpus):
    again = skip_training(corpus, seeds=(0, 1), **dict(TINY_LM, num_workers=2))
    for residual in (True, False):
        assert [r.train_loss for r in again.runs[residual]] == [r.train_loss for r in training.runs[residual]]
        assert [r.val_loss for r in again.runs[residual]] == [r.val_loss for r in training.runs[residual]]
        assert again.final_train_text_loss[residual] == training.final_train_text_loss[residual]
    with pytest.raises(TypeError, match="seeds"):
        skip_training(corpus, seeds=None, **TINY_LM)
    with pytest.raises(ValueError, match="seeds"):
        skip_training(corpus, seeds=(0, 0), **TINY_LM)


def test_skip_training_seeds_train_as_they_would_alone(training, corpus):
    """Seed 1's run in the lockstep is train_lm's run with seed 1 (weights and batches of that seed)."""
    from d2lmini.train import train_lm

    settings = {k: v for k, v in TINY_LM.items() if k != "num_workers"}
    alone = train_lm(corpus, residual=False, seed=1, norm="layer", act="relu", placement="pre",
                     eval_every=15, clip_norm=1.0, betas=(0.9, 0.95), schedule="cosine", **settings)
    lockstep = training.runs[False][1]
    assert lockstep.train_loss == alone.train_loss and lockstep.val_loss == alone.val_loss
    assert training.seeds == [0, 1] and training.effect() == pytest.approx(
        sum(training.final_val(False)) / 2 - sum(training.final_val(True)) / 2)
    assert training.spread() == max(max(v) - min(v) for v in (training.final_val(True), training.final_val(False)))


# --------------------------------------------------------------------------- figures


def test_plots_return_figures(sweep, training):
    fig = plot_depth_gradients(sweep)
    assert isinstance(fig, Figure) and len(fig.axes) == 3 and fig.legends
    assert all(ax.get_xlabel() and ax.get_ylabel() for ax in fig.axes)
    assert [len(ax.get_lines()) for ax in fig.axes] == [2, 2, 4]  # no norms | pre-LN | every stack
    assert len(fig.legends[0].get_texts()) == 4
    fig = plot_skip_training(training)
    assert isinstance(fig, Figure) and len(fig.axes) == 1 and fig.legends
    assert len(fig.legends[0].get_texts()) == 5  # two curves, two sets of circles, the entropy


# --------------------------------------------------------------------------- the printed measuring cores


def test_readout_gradients_match_autograd_on_a_linear_stack():
    # Y = X0 W1 W2 (two "blocks" with one matrix each); the gradients are known in closed form.
    from d2lmini.chapters.ch02_residual import readout_gradients
    g = torch.Generator().manual_seed(0)
    X0 = torch.randn(1, 3, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    W1 = torch.randn(4, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    W2 = torch.randn(4, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    R = torch.randn(1, 3, 4, generator=g, dtype=torch.float64)
    Y = X0 @ W1 @ W2
    input_grad, per_block = readout_gradients(Y, R, X0, [[W1], [W2]])
    G = R[0] / math.sqrt(12)  # dl/dY
    with torch.no_grad():
        assert input_grad == pytest.approx(float((G @ W2.T @ W1.T).norm()))
        assert per_block[0] == pytest.approx(float((X0[0].T @ G @ W2.T).norm()))
        assert per_block[1] == pytest.approx(float(((X0[0] @ W1).T @ G).norm()))


def test_train_step_updates_once_from_the_losses_before_the_update():
    from d2lmini.train import lockstep_losses, train_step

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    X = torch.tensor([[0, 1, 2]])
    batches = [(X, (X + 1) % 5)]
    losses_of = lockstep_losses([model])
    before = float(losses_of(batches)[0].detach())
    values = train_step(losses_of, optimizer, batches, lr=0.1)
    assert math.isclose(values[0], before, rel_tol=1e-6)  # recorded before the update
    assert optimizer.param_groups[0]["lr"] == 0.1
    assert float(losses_of(batches)[0].detach()) < before  # one step down the gradient

    nan_losses = lambda batches: torch.full((1,), float("nan"), requires_grad=True)  # noqa: E731
    weights = model[0].weight.detach().clone()
    assert math.isnan(train_step(nan_losses, optimizer, batches, lr=0.1)[0])
    assert torch.equal(model[0].weight, weights)  # a diverged step takes no update


def test_skip_training_scores_the_trained_models_on_training_text():
    from d2lmini.chapters import ch02_residual as rs
    from d2lmini.data import CharCorpus
    corpus = CharCorpus.from_text("".join(f"x{i} = {i} * y\n" for i in range(300)))
    result = rs.skip_training(corpus, num_layers=2, num_steps=4, batch_size=4, seq_len=16, num_hiddens=16,
                              num_heads=2, eval_batches=2, seeds=(0,), num_workers=1)
    assert set(result.final_train_text_loss) == {True, False}
    for residual, run in ((True, result.with_skips), (False, result.without_skips)):
        (loss,) = result.final_train_text_loss[residual]
        assert 0 < loss < 10 and loss != run.val_loss[-1]


def test_skip_training_rows_gather_the_table(training):
    rows = training.rows()
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    assert [row["stack"] for row in rows] == ["pre-LN, with skips", "pre-LN, no skips"]
    for row, residual in zip(rows, (True, False)):
        runs = training.runs[residual]
        assert row["training loss (running, last 20 steps)"] == pytest.approx(mean([r.smoothed(20)[-1] for r in runs]))
        assert row["final model scored on training text"] == pytest.approx(mean(training.final_train_text_loss[residual]))
        assert row["final model scored on validation text"] == pytest.approx(mean([r.val_loss[-1] for r in runs]))
        assert row["validation, range over seeds"] == pytest.approx(
            max(r.val_loss[-1] for r in runs) - min(r.val_loss[-1] for r in runs))
        assert row["token spread at init (last block, first seed)"] == training.init_token_spread[residual][-1]
    assert "training loss (running, last 5 steps)" in training.rows(window=5)[0]
    with pytest.raises(ValueError, match="window"):
        training.rows(window=0)
