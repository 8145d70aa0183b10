"""The chapter "Normalization: why LayerNorm, not BatchNorm": its hand-written norms and measurements."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

from d2lmini.chapters import ch03_normalization as nm
from d2lmini.norms import SequenceBatchNorm


# --- the norms by hand -------------------------------------------------------------

def test_batch_norm_by_hand_matches_torch_training_mode():
    X = torch.randn(4, 9, 16) * 2 - 1
    bn = nn.BatchNorm1d(16).train()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_()
        theirs = bn(X.transpose(1, 2)).transpose(1, 2)
        assert torch.allclose(nm.batch_norm_by_hand(X, bn.weight, bn.bias), theirs, atol=1e-5)
        # the same on a flat (N, d) batch
        flat = X.reshape(-1, 16)
        assert torch.allclose(nm.batch_norm_by_hand(flat, bn.weight, bn.bias), bn(flat), atol=1e-5)


def test_batch_norm_stats_with_valid_lens_use_only_the_real_tokens():
    X = torch.randn(3, 5, 4, dtype=torch.float64)
    valid_lens = torch.tensor([5, 2, 1])
    rows = torch.cat([X[0, :5], X[1, :2], X[2, :1]])
    mean, var = nm.batch_norm_stats(X, valid_lens)
    assert torch.allclose(mean, rows.mean(0)) and torch.allclose(var, rows.var(0, unbiased=False))
    mean_all, var_all = nm.batch_norm_stats(X)
    assert torch.allclose(mean_all, X.reshape(-1, 4).mean(0))
    assert torch.allclose(var_all, X.reshape(-1, 4).var(0, unbiased=False))


def test_batch_norm_of_a_single_position_is_the_bias():
    bias = torch.arange(8.0)
    for _ in range(3):
        assert torch.equal(nm.batch_norm_by_hand(torch.randn(1, 1, 8), bias=bias), bias.expand(1, 1, 8))


def test_hand_norms_reject_bad_arguments():
    with pytest.raises(TypeError, match="X"):
        nm.batch_norm_by_hand(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        nm.batch_norm_by_hand(torch.ones(5))
    with pytest.raises(ValueError, match="weight"):
        nm.batch_norm_by_hand(torch.ones(2, 3), weight=torch.ones(4))
    with pytest.raises(ValueError, match="eps"):
        nm.batch_norm_by_hand(torch.ones(2, 3), eps=0.0)
    with pytest.raises(ValueError, match="valid_lens"):
        nm.batch_norm_stats(torch.ones(2, 3, 4), torch.tensor([1, 4]))
    with pytest.raises(TypeError, match="valid_lens"):
        nm.batch_norm_stats(torch.ones(2, 3, 4), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="no real position"):
        nm.batch_norm_stats(torch.ones(2, 3, 4), torch.tensor([0, 0]))


def test_sequence_batch_norm_wraps_batchnorm1d_and_checks_shapes():
    layer = SequenceBatchNorm(6).train()
    X = torch.randn(2, 5, 6)
    with torch.no_grad():
        assert torch.allclose(layer(X), nm.batch_norm_by_hand(X), atol=1e-5)
    with pytest.raises(ValueError, match="num_hiddens=6"):
        layer(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match="momentum"):
        SequenceBatchNorm(6, momentum=1.5)


# --- synthetic data ------------------------------------------------------------------

def test_padded_batch_shapes_padding_and_determinism():
    batch = nm.padded_batch(batch_size=16, max_len=40, padding=0.6, num_hiddens=8, seed=1)
    assert tuple(batch.X.shape) == (16, 40, 8) and tuple(batch.valid_lens.shape) == (16,)
    assert int(batch.valid_lens.max()) == 40 and int(batch.valid_lens.min()) >= 1
    assert torch.all(batch.X[~batch.mask] == 0) and torch.all(batch.X[batch.mask].abs().sum(-1) > 0)
    assert abs(batch.padding_share - 0.6) < 0.02
    again = nm.padded_batch(batch_size=16, max_len=40, padding=0.6, num_hiddens=8, seed=1)
    assert torch.equal(batch.X, again.X) and torch.equal(batch.valid_lens, again.valid_lens)
    other = nm.padded_batch(batch_size=16, max_len=40, padding=0.2, num_hiddens=8, seed=1)
    assert torch.equal(batch.feature_mean, other.feature_mean)  # same features at every share
    assert nm.padded_batch(4, 10, 0.0, 8).padding_share == 0.0


def test_padded_batch_features_are_not_standardized():
    batch = nm.padded_batch(padding=0.0, num_hiddens=64)
    assert batch.feature_mean.abs().mean() > 0.3
    assert batch.feature_scale.min() >= 0.5 and batch.feature_scale.max() <= 2.0
    assert batch.feature_scale.max() / batch.feature_scale.min() > 2


def test_padded_batch_rejects_bad_arguments():
    with pytest.raises(ValueError, match="padding"):
        nm.padded_batch(padding=1.0)
    with pytest.raises(ValueError, match="too high"):
        nm.padded_batch(batch_size=32, max_len=10, padding=0.99)
    with pytest.raises(ValueError, match="batch_size"):
        nm.padded_batch(batch_size=0)
    with pytest.raises(ValueError, match="batch_size must be >= 2"):
        nm.padded_batch(batch_size=1, padding=0.5)
    with pytest.raises(TypeError, match="seed"):
        nm.padded_batch(seed="0")


def test_the_global_rng_is_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    nm.padding_errors(padding=0.5, batch_size=8, max_len=20, num_hiddens=8)
    nm.same_sentence_elsewhere(batch_size=3, num_steps=4, num_hiddens=8, warmup=3)
    assert torch.equal(torch.rand(3), expected)


# --- the chapter's claims --------------------------------------------------------------

def test_padding_shrinks_the_mean_by_exactly_the_padding_share():
    result = nm.padding_errors(padding=0.7, batch_size=32, max_len=100, num_hiddens=32, seed=0)
    assert abs(result.padding_share - 0.7) < 0.01
    assert result.mean_error == pytest.approx(result.padding_share, abs=1e-9)
    assert result.var_error == pytest.approx(result.expected_var_error, abs=0.05)
    assert result.std_ratio < 0.8
    assert result.output_rms_error > 0.5
    assert result.layer_norm_max_delta < 1e-6


def test_padding_measurements_of_a_hand_made_batch():
    # Two sequences of 2 features; the second has one real token and one zero padding position.
    X = torch.tensor([[[1.0, 2.0], [3.0, 6.0]], [[2.0, 4.0], [0.0, 0.0]]])
    batch = nm.PaddedBatch(X=X, valid_lens=torch.tensor([2, 1]), feature_mean=torch.zeros(2),
                           feature_scale=torch.ones(2))
    got = nm.padding_measurements(batch)
    # real tokens: means (2, 4); all four positions: means (1.5, 3) -> relative error 0.25
    assert got["mean_error"] == pytest.approx(0.25)
    assert set(got) == {"mean_error", "var_error", "std_ratio", "output_rms_error", "output_max_error",
                        "layer_norm_max_delta"}
    assert got["layer_norm_max_delta"] < 1e-6 and got["output_rms_error"] > 0
    with pytest.raises(TypeError, match="batch"):
        nm.padding_measurements(X)


def test_padding_errors_reports_what_padding_measurements_measures():
    result = nm.padding_errors(padding=0.5, batch_size=8, max_len=20, num_hiddens=8, seed=1)
    got = nm.padding_measurements(nm.padded_batch(8, 20, 0.5, 8, seed=1))
    assert {name: getattr(result, name) for name in got} == got


def test_no_padding_means_no_error():
    result = nm.padding_errors(padding=0.0, batch_size=4, max_len=20, num_hiddens=8)
    assert result.mean_error < 1e-12 and result.var_error < 1e-12 and result.output_rms_error < 1e-9


def test_padding_sweep_errors_grow_with_padding_and_layer_norm_never_moves():
    sweep = nm.padding_sweep((0.0, 0.3, 0.6, 0.9), batch_size=16, max_len=50, num_hiddens=16, seed=2)
    errors = sweep.column("output_rms_error")
    assert errors == sorted(errors) and errors[-1] > 1.0
    assert max(sweep.column("layer_norm_max_delta")) < 1e-6
    assert len(sweep.curve_padding) == len(sweep.curve_var_error) > 50
    with pytest.raises(ValueError, match="paddings"):
        nm.padding_sweep(())


def test_expected_stat_errors_formula():
    m, s = torch.tensor([1.0, -2.0]), torch.tensor([1.0, 0.5])
    mean_error, var_error = nm.expected_stat_errors(0.5, m, s)
    # var_pad = 0.5 s^2 + 0.25 m^2 = [0.75, 1.125]; s^2 = [1, 0.25]
    assert mean_error == 0.5
    assert var_error == pytest.approx(((0.25 ** 2 + 0.875 ** 2) / (1 + 0.0625)) ** 0.5)


def test_one_sentence_elsewhere_moves_batch_norm_and_not_layer_norm():
    for seed in range(4):  # the chapter's margins, on other draws
        rows = nm.same_sentence_elsewhere(seed=seed)
        assert [r["setting"] for r in rows] == ["other batch mates", "evaluation mode", "one token at a time"]
        for row in rows:
            assert row["ln_max_delta"] < 1e-6
            assert row["bn_max_delta"] > 0.2 and row["bn_rms_delta"] > 0.05
        # generation runs BatchNorm in evaluation mode, position by position: the same output
        assert abs(rows[2]["bn_max_delta"] - rows[1]["bn_max_delta"]) < 1e-6
    assert rows == nm.same_sentence_elsewhere(seed=3)


def test_more_batch_mates_move_batch_norm_less():
    small, large = (nm.same_sentence_elsewhere(batch_size=b, num_steps=8, num_hiddens=16, warmup=4)[0]
                    for b in (2, 64))
    assert small["bn_rms_delta"] > 2 * large["bn_rms_delta"] > 0


def test_same_sentence_elsewhere_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        nm.same_sentence_elsewhere(batch_size=1)
    with pytest.raises(ValueError, match="warmup"):
        nm.same_sentence_elsewhere(warmup=1)
    with pytest.raises(ValueError, match="momentum"):
        nm.same_sentence_elsewhere(momentum=1.5)
    with pytest.raises(TypeError, match="seed"):
        nm.same_sentence_elsewhere(seed="0")


# --- figures ---------------------------------------------------------------------------

def test_figures():
    fig = nm.plot_norm_axes()
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    sweep = nm.padding_sweep((0.0, 0.5), batch_size=4, max_len=10, num_hiddens=8)
    fig = nm.plot_padding_sweep(sweep, mark=0.5)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert fig.axes[0].get_xlabel() == "padding share (%)"
    with pytest.raises(TypeError, match="PaddingSweep"):
        nm.plot_padding_sweep([1, 2])
    with pytest.raises(ValueError, match="lengths"):
        nm.plot_norm_axes(lengths=())
