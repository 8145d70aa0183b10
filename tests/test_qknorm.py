"""The chapter "QK-norm": logits from a module, the scale sweep, norm before RoPE, the variants, training."""

from __future__ import annotations

import math

import pytest
import torch
from matplotlib.figure import Figure

from d2lmini import QK_NORMS, MultiHeadAttention, TransformerBlock
from d2lmini.data import python_reference_corpus
from d2lmini.chapters.ch06_qk_norm import (LogitRecorder, attention_entropy, attention_logits, log_spaced_scales,
                            logit_scale_sweep, make_attention, plot_logit_scale_sweep,
                            plot_qk_norm_regimes, probed_training, qk_norm_regimes, qk_norm_training,
                            queries_and_keys_after_rope, regime_rows, rope_order_check, scale_qk_,
                            train_seeds_with_logit_probe, train_with_logit_probe)
from d2lmini.chapters.ch06_qk_norm import LogitTrainResult
from d2lmini.train import seeded_tiny_lm
from d2lmini.train import train_lm


@pytest.fixture(scope="module")
def corpus():
    return python_reference_corpus()


SCALES = (0.25, 1.0, 4.0, 16.0, 64.0)


@pytest.fixture(scope="module")
def sweep():
    return logit_scale_sweep(scales=SCALES, num_hiddens=32, num_heads=2, num_steps=32, seed=0)


TINY_RUN = dict(num_steps=60, batch_size=8, seq_len=32, num_hiddens=32, num_heads=2, num_layers=2,
                eval_batches=2, seed=0)


@pytest.fixture(scope="module")
def runs(corpus):
    return qk_norm_training(corpus, lr=3e-2, **TINY_RUN)


def _sdpa_by_hand(layer: MultiHeadAttention, X: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """The module's output rebuilt from attention_logits: softmax, values, W_o."""
    logits = attention_logits(layer, X)
    if causal:
        n = X.shape[1]
        logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    V = layer.W_v(X).unflatten(-1, (layer.num_kv_heads, layer.head_dim)).transpose(1, 2)
    V = V.repeat_interleave(layer.num_heads // layer.num_kv_heads, dim=1)
    return layer.W_o((torch.softmax(logits, dim=-1) @ V).transpose(1, 2).flatten(-2))


# --------------------------------------------------------------------------- logits and entropy


@pytest.mark.parametrize("qk_norm", (None,) + QK_NORMS)
@pytest.mark.parametrize("rope_theta", (None, 10000.0))
@pytest.mark.parametrize("num_kv_heads", (4, 2))
def test_attention_logits_are_what_the_module_feeds_its_softmax(qk_norm, rope_theta, num_kv_heads):
    layer = make_attention(qk_norm, 32, 4, seed=1, rope_theta=rope_theta, num_kv_heads=num_kv_heads,
                           causal=True)
    with torch.no_grad():  # gains that are not all one, so every norm matters
        for norm in (layer.q_norm, layer.k_norm):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
    X = torch.randn(2, 7, 32)
    torch.testing.assert_close(_sdpa_by_hand(layer, X, causal=True), layer(X, X, X), atol=1e-5, rtol=1e-5)
    assert attention_logits(layer, X).shape == (2, 4, 7, 7)


def test_attention_logits_cross_attention_and_bad_arguments():
    layer = make_attention(None, 16, 2)
    assert attention_logits(layer, torch.randn(1, 3, 16), torch.randn(1, 5, 16)).shape == (1, 2, 3, 5)
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        attention_logits(torch.nn.Linear(16, 16), torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match="last dimension"):
        attention_logits(layer, torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match="rope_theta"):
        attention_logits(layer, torch.randn(1, 3, 16), norm_after_rope=True)
    with pytest.raises(TypeError, match="norm_after_rope"):
        attention_logits(layer, torch.randn(1, 3, 16), norm_after_rope=1)
    roped = make_attention("per_head", 16, 2, rope_theta=100.0)
    with pytest.raises(ValueError, match="as many queries as keys"):
        attention_logits(roped, torch.randn(1, 3, 16), torch.randn(1, 4, 16))


def test_attention_entropy_of_uniform_and_one_hot_rows():
    uniform = torch.full((3, 8), 1 / 8)
    torch.testing.assert_close(attention_entropy(uniform), torch.full((3,), math.log(8)))
    one_hot = torch.eye(5)
    assert float(attention_entropy(one_hot).abs().max()) == 0.0
    with pytest.raises(TypeError, match="floating"):
        attention_entropy(torch.ones(3, 3, dtype=torch.long))


# --------------------------------------------------------------------------- inflating W_q and W_k


def test_make_attention_shares_projections_across_settings_and_keeps_the_global_rng():
    state = torch.random.get_rng_state()
    layers = [make_attention(q, 32, 4, seed=3) for q in (None,) + QK_NORMS]
    assert torch.equal(state, torch.random.get_rng_state())
    for layer in layers[1:]:
        for name in ("W_q", "W_k", "W_v", "W_o"):
            assert torch.equal(getattr(layer, name).weight, getattr(layers[0], name).weight)
    assert not torch.equal(make_attention(None, 32, 4, seed=4).W_q.weight, layers[0].W_q.weight)
    with pytest.raises(ValueError, match="qk_norm"):
        make_attention("after_rope", 32, 4)
    with pytest.raises(TypeError, match="seed"):
        make_attention(None, 32, 4, seed=1.5)


def _fed_logits(sdpa_inputs, layer, X):
    """q . k as the module's forward computes them (before its softmax's scale)."""
    q, k = sdpa_inputs(layer, X)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return q @ k.transpose(-1, -2)


def test_scaling_wq_wk_multiplies_logits_by_s_squared_unless_qk_normed(sdpa_inputs):
    X = torch.randn(1, 6, 32)
    for qk_norm in (None,) + QK_NORMS:
        layer = make_attention(qk_norm, 32, 4, seed=0, bias=True)
        before = attention_logits(layer, X).detach()
        fed_before = _fed_logits(sdpa_inputs, layer, X)
        after = attention_logits(scale_qk_(layer, 3.0), X).detach()
        fed_after = _fed_logits(sdpa_inputs, layer, X)
        factor = 9.0 if qk_norm is None else 1.0
        torch.testing.assert_close(after, before * factor, rtol=1e-4, atol=1e-5)
        # ... and so do the logits the forward itself feeds its softmax
        torch.testing.assert_close(fed_after, fed_before * factor, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="scale"):
        scale_qk_(make_attention(None, 16, 2), 0.0)
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        scale_qk_(torch.nn.Linear(2, 2), 2.0)


def test_log_spaced_scales():
    scales = log_spaced_scales()
    assert len(scales) == 17 and scales[0] == 0.25 and math.isclose(scales[-1], 64.0)
    assert log_spaced_scales(1.0, 8.0, per_octave=1) == [1.0, 2.0, 4.0, 8.0]
    with pytest.raises(ValueError, match="low must be smaller"):
        log_spaced_scales(4.0, 2.0)
    with pytest.raises(TypeError, match="per_octave"):
        log_spaced_scales(per_octave=1.5)


def test_sweep_saturates_without_qk_norm_and_not_with_it(sweep):
    assert sweep.scales == list(SCALES) and math.isclose(sweep.max_entropy, math.log(32))
    plain = [sweep.at(s, None) for s in SCALES]
    normed = [sweep.at(s, "per_head") for s in SCALES]
    # Without QK-norm: logits grow like s^2, entropy collapses, the typical q and k stop learning.
    assert math.isclose(plain[-1]["max_logit"] / plain[1]["max_logit"], 64.0 ** 2, rel_tol=1e-6)
    assert plain[0]["entropy"] > 0.95 * sweep.max_entropy
    assert plain[-1]["entropy"] < 0.05
    assert plain[-1]["grad_q"] < 1e-6 * plain[1]["grad_q"]
    assert plain[-1]["grad_k"] < 1e-6 * plain[1]["grad_k"]
    assert plain[-1]["grad_v"] > plain[1]["grad_v"]  # values still receive gradient
    # With QK-norm: nothing at the dot product depends on s ...
    for key in ("entropy", "max_logit", "rms_logit", "grad_q", "grad_k", "grad_v"):
        values = [row[key] for row in normed]
        assert max(values) - min(values) <= 1e-4 * max(abs(v) for v in values), key
    assert normed[-1]["entropy"] > 0.5 * sweep.max_entropy
    # ... and the gradient reaching W_q, behind the norm, falls like 1/s.
    assert math.isclose(normed[0]["grad_W_q"] / normed[-1]["grad_W_q"], 256.0, rel_tol=1e-3)


def test_float32_sweep_rounds_most_saturated_gradients_to_exactly_zero():
    sweep32 = logit_scale_sweep(scales=(1.0, 64.0), num_hiddens=32, num_heads=2, num_steps=32,
                                dtype=torch.float32)
    assert sweep32.at(1.0, None)["zero_q"] == 0.0
    assert sweep32.at(64.0, None)["zero_q"] > 0.5
    assert sweep32.at(64.0, "per_head")["zero_q"] == 0.0


def test_sweep_is_deterministic_and_checks_its_arguments(sweep):
    again = logit_scale_sweep(scales=SCALES, num_hiddens=32, num_heads=2, num_steps=32, seed=0)
    assert again.entropy == sweep.entropy and again.grad_q == sweep.grad_q
    other = logit_scale_sweep(scales=SCALES, num_hiddens=32, num_heads=2, num_steps=32, seed=1)
    assert other.entropy != sweep.entropy
    with pytest.raises(ValueError, match="scales"):
        logit_scale_sweep(scales=(1.0, -2.0))
    with pytest.raises(ValueError, match="scales"):
        logit_scale_sweep(scales=())
    with pytest.raises(ValueError, match="qk_norms"):
        logit_scale_sweep(qk_norms=("layer",))
    with pytest.raises(ValueError, match="num_steps"):
        logit_scale_sweep(num_steps=1)
    with pytest.raises(TypeError, match="dtype"):
        logit_scale_sweep(dtype=torch.float16)
    with pytest.raises(ValueError, match="swept scales"):
        sweep.at(3.0, None)
    with pytest.raises(ValueError, match="measured settings"):
        sweep.at(1.0, "projection")


# --------------------------------------------------------------------------- norm before RoPE


@pytest.mark.parametrize("qk_norm", QK_NORMS)
def test_norm_after_rope_differs_only_once_gains_differ(qk_norm):
    check = rope_order_check(qk_norm, num_hiddens=32, num_heads=2, num_steps=12, seed=0)
    assert check.equal_gains < 1e-5  # invisible at initialization ...
    assert check.unequal_gains > 0.05  # ... visible once the gains have moved apart
    assert check.shift_change["before"] < 1e-4  # logits depend on relative positions only
    assert check.shift_change["after"] > 0.1  # the bug breaks that
    again = rope_order_check(qk_norm, num_hiddens=32, num_heads=2, num_steps=12, seed=0)
    assert again.unequal_gains == check.unequal_gains


@pytest.mark.parametrize("qk_norm", QK_NORMS)
def test_queries_and_keys_after_rope_only_swaps_the_order(qk_norm):
    layer = make_attention(qk_norm, num_hiddens=32, num_heads=4, seed=0, rope_theta=10000.0,
                           num_kv_heads=2).double()
    X = torch.randn(2, 7, 32, dtype=torch.float64)
    q, k = queries_and_keys_after_rope(layer, X, X)
    right_q, right_k = layer.queries_and_keys(X, X)
    assert q.shape == right_q.shape == (2, 4, 7, 8) and k.shape == right_k.shape == (2, 2, 7, 8)
    torch.testing.assert_close(q, right_q, atol=1e-6, rtol=0)  # gains 1: equal up to float32 angles
    with torch.no_grad():
        layer.q_norm.weight.mul_(torch.linspace(0.5, 1.5, layer.q_norm.weight.numel()).view_as(layer.q_norm.weight))
    assert (queries_and_keys_after_rope(layer, X, X)[0] - layer.queries_and_keys(X, X)[0]).abs().max() > 1e-2
    with pytest.raises(ValueError, match="RoPE"):
        queries_and_keys_after_rope(make_attention(qk_norm, num_hiddens=32, num_heads=4), X, X)
    with pytest.raises(ValueError, match="as many queries as keys"):
        queries_and_keys_after_rope(layer, X, X[:, :5])


def test_rope_order_check_arguments():
    with pytest.raises(ValueError, match="qk_norm"):
        rope_order_check("none")
    with pytest.raises(ValueError, match="gain_spread"):
        rope_order_check(gain_spread=0.0)
    with pytest.raises(ValueError, match="shift"):
        rope_order_check(shift=0)
    with pytest.raises(ValueError, match="num_steps"):
        rope_order_check(num_steps=1)


# --------------------------------------------------------------------------- the variants


def test_minimax_m2_normalizes_the_whole_projection_like_olmo2():
    """The chapter says MiniMax-M2's QK-norm is the 'projection' variant: check it against transformers."""
    tf = pytest.importorskip("transformers")
    pytest.importorskip("transformers.models.minimax_m2")
    from transformers.models.minimax_m2 import modeling_minimax_m2 as mm

    from d2lmini.reference import additive_mask

    config = tf.MiniMaxM2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                intermediate_size=32, num_hidden_layers=1, num_local_experts=2,
                                num_experts_per_tok=1, rope_parameters={"rope_type": "default",
                                                                        "rope_theta": 10000.0})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    theirs = mm.MiniMaxM2Attention(config, layer_idx=0).eval()
    assert tuple(theirs.q_norm.weight.shape) == (4 * 16,) and tuple(theirs.k_norm.weight.shape) == (2 * 16,)
    with torch.no_grad():
        theirs.q_norm.weight.uniform_(0.5, 1.5)
        theirs.k_norm.weight.uniform_(0.5, 1.5)
    X = torch.randn(2, 9, 64)
    position_ids = torch.arange(9)[None].expand(2, -1)
    cos_sin = mm.MiniMaxM2RotaryEmbedding(config)(X, position_ids)
    expected = theirs(X, cos_sin, additive_mask(None, 9, True, X.dtype, 2))[0]
    outputs = {}
    for variant in ("projection", "per_head_distinct"):  # the two with a gain for every head's features
        ours = MultiHeadAttention(64, 4, num_kv_heads=2, head_dim=16, causal=True, qk_norm=variant,
                                  rope_theta=10000.0).eval()
        with torch.no_grad():
            for name, proj in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"), ("W_o", "o_proj")):
                getattr(ours, name).weight.copy_(getattr(theirs, proj).weight)
            ours.q_norm.weight.copy_(theirs.q_norm.weight.view(ours.q_norm.weight.shape))
            ours.k_norm.weight.copy_(theirs.k_norm.weight.view(ours.k_norm.weight.shape))
        outputs[variant] = ours(X, X, X).detach()
    torch.testing.assert_close(outputs["projection"], expected, atol=1e-5, rtol=1e-5)
    assert float((outputs["per_head_distinct"] - expected).detach().abs().max()) > 1e-3


# --------------------------------------------------------------------------- training


def test_logit_recorder_matches_attention_logits_and_leaves_outputs_alone():
    torch.manual_seed(0)
    block = TransformerBlock(32, 2, causal=True, qk_norm="per_head", rope_theta=10000.0)
    X = torch.randn(2, 8, 32)
    plain = block(X)
    with LogitRecorder(block) as recorder:
        hooked = block(X)
    assert torch.equal(plain, hooked)
    logits = attention_logits(block.attention, X).detach()
    logits = logits.masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf"))
    assert math.isclose(recorder.max_logit[0], float(logits.max()), rel_tol=1e-6)
    assert 0 < recorder.entropy[0] < math.log(8)
    recorder.max_logit[0] = -1.0
    block(X)  # removed: nothing recorded any more
    assert recorder.max_logit[0] == -1.0
    with pytest.raises(ValueError, match="no MultiHeadAttention"):
        LogitRecorder(torch.nn.Linear(3, 3))


def test_training_with_the_probe_takes_the_same_steps_as_train_lm(corpus):
    settings = dict(num_steps=6, batch_size=4, seq_len=16, lr=3e-2, num_hiddens=16, num_heads=2, num_layers=2,
                    seed=2)
    probed = train_with_logit_probe(corpus, "per_head", eval_batches=2, **settings)
    reference = train_lm(corpus, qk_norm="per_head", rope_theta=10000.0, eval_every=6, eval_batches=2,
                         betas=(0.9, 0.95), **settings)
    assert probed.train_loss == reference.train_loss
    assert math.isclose(probed.val_loss, reference.val_loss[-1], rel_tol=1e-9)
    assert len(probed.max_logit) == 6 and len(probed.max_logit_per_layer[0]) == 2
    assert len(probed.qk_gains) == 2 * 2 * 8  # 2 layers x (q, k) x head_dim


def test_probed_training_records_every_step_and_the_gains(corpus):
    model = seeded_tiny_lm(corpus.vocab_size, 0, num_hiddens=16, num_heads=2, num_layers=3, max_len=16,
                           qk_norm="per_head", rope_theta=10000.0)
    (result,) = probed_training([model], corpus, [LogitTrainResult({})], [0], 5, 4, 16, 3e-2, (0.9, 0.98), 0.0, 2)
    assert len(result.train_loss) == len(result.max_logit) == len(result.entropy) == 5
    assert all(len(layers) == 3 and max(layers) == top
               for layers, top in zip(result.max_logit_per_layer, result.max_logit))
    assert math.isfinite(result.val_loss) and not result.diverged
    assert len(result.qk_gains) == 3 * 2 * 8  # 3 layers x (q, k) x head_dim
    plain = seeded_tiny_lm(corpus.vocab_size, 0, num_hiddens=16, num_heads=2, num_layers=1, max_len=16)
    (result,) = probed_training([plain], corpus, [LogitTrainResult({})], [0], 2, 4, 16, 3e-2, (0.9, 0.98), 0.0, 1)
    assert result.qk_gains == [] and not plain._forward_pre_hooks and all(
        not m._forward_pre_hooks for m in plain.modules())  # the recorders are removed


def test_seeds_trained_together_get_the_losses_they_get_alone(corpus):
    settings = dict(lr=3e-2, num_steps=4, batch_size=4, seq_len=16, num_hiddens=16, num_heads=2, num_layers=1,
                    eval_batches=1)
    together = train_seeds_with_logit_probe(corpus, "per_head", seeds=(3, 1), **settings)
    for seed, run in zip((3, 1), together):
        alone = train_with_logit_probe(corpus, "per_head", seed=seed, **settings)
        assert run.config["seed"] == seed
        assert run.train_loss == pytest.approx(alone.train_loss, rel=1e-6)
        assert run.max_logit == pytest.approx(alone.max_logit, rel=1e-5)
    with pytest.raises(ValueError, match="seeds"):
        train_seeds_with_logit_probe(corpus, None, seeds=(1, 1), **settings)


def test_a_diverged_run_is_probed_up_to_its_nan_step(corpus, monkeypatch):
    # A run that diverges at a known step, on any processor (how soon a high rate overflows is not):
    # the model's fifth forward pass returns NaN.
    import d2lmini.train

    made = d2lmini.train.seeded_tiny_lm

    def diverging_lm(*args, **kwargs):
        model, calls = made(*args, **kwargs), []

        def fifth_is_nan(module, inputs, output):
            calls.append(None)
            return output * float("nan") if len(calls) == 5 else output

        model.register_forward_hook(fifth_is_nan)
        return model

    monkeypatch.setattr(d2lmini.train, "seeded_tiny_lm", diverging_lm)
    run = train_with_logit_probe(corpus, None, lr=3e-2, num_steps=12, batch_size=4, seq_len=16, num_hiddens=24,
                                 num_heads=2, num_layers=1, norm="rms", act="gelu", eval_batches=2)
    assert run.diverged and math.isnan(run.train_loss[-1]) and math.isnan(run.val_loss)
    assert all(math.isfinite(loss) for loss in run.train_loss[:-1])
    assert len(run.max_logit) == len(run.entropy) == len(run.max_logit_per_layer) == len(run.train_loss) == 5


def test_qk_norm_keeps_the_largest_logit_small_at_a_high_learning_rate(runs):
    plain, normed = runs[None], runs["per_head"]
    assert list(runs) == [None, "per_head"]
    assert not plain.diverged and not normed.diverged
    assert plain.train_loss[0] == pytest.approx(normed.train_loss[0], abs=0.1)  # same start
    assert max(plain.max_logit) > 3 * max(normed.max_logit)
    assert plain.qk_gains == [] and len(normed.qk_gains) == 2 * 2 * 16
    assert all(math.isfinite(v) for v in plain.entropy + normed.entropy)


def test_training_is_deterministic_and_checks_arguments(corpus, runs):
    again = train_with_logit_probe(corpus, None, lr=3e-2, **TINY_RUN)
    assert again.train_loss == runs[None].train_loss and again.max_logit == runs[None].max_logit
    with pytest.raises(TypeError, match="sets qk_norm itself"):
        qk_norm_training(corpus, qk_norm="per_head")
    with pytest.raises(ValueError, match="qk_norms"):
        qk_norm_training(corpus, qk_norms=())
    with pytest.raises(ValueError, match="lr"):
        train_with_logit_probe(corpus, None, lr=0.0)
    with pytest.raises(ValueError, match="qk_norm"):
        train_with_logit_probe(corpus, "rms")


def test_regimes_train_every_rate_seed_and_setting_and_draw(corpus, runs):
    small = dict(TINY_RUN, num_steps=20)
    small.pop("seed")
    regimes = qk_norm_regimes(corpus, rates=(3e-2, 3e-3), seeds=(0, 1), num_workers=1, **small)
    assert list(regimes) == [(lr, qk, seed) for lr in (3e-2, 3e-3) for seed in (0, 1) for qk in (None, "per_head")]
    alone = train_with_logit_probe(corpus, "per_head", lr=3e-3, seed=1, **small)
    assert regimes[(3e-3, "per_head", 1)].train_loss == alone.train_loss  # each run is the run alone
    rows = regime_rows(regimes)
    assert len(rows) == 8 and rows[0]["qk_norm"] == "no QK-norm" and rows[1]["qk_norm"] == "QK-norm (per head)"
    assert rows[0]["peak_logit"] == max(regimes[(3e-2, None, 0)].max_logit)
    assert isinstance(plot_qk_norm_regimes(regimes, seed=1), Figure)
    with pytest.raises(ValueError, match="seed"):
        plot_qk_norm_regimes(regimes, seed=5)
    with pytest.raises(ValueError, match="rates"):
        qk_norm_regimes(corpus, rates=(), **small)
    with pytest.raises(ValueError, match="seeds"):
        qk_norm_regimes(corpus, seeds=(0, 0), **small)
    with pytest.raises(TypeError, match="runs"):
        regime_rows(runs)


def test_the_figures_draw(sweep):
    assert isinstance(plot_logit_scale_sweep(sweep, mark=64.0), Figure)


# --- the measuring cores the chapter prints ------------------------------------------


def test_saturation_probe_sees_the_softmax_saturate_without_qk_norm_only():
    from d2lmini.chapters.ch06_qk_norm import LogitScaleSweep, make_attention, saturation_probe

    X = torch.randn(1, 16, 32, dtype=torch.float64)
    R = torch.randn(1, 16, 32, dtype=torch.float64)
    probe = {(qk, s): saturation_probe(scale_qk_(make_attention(qk, 32, 2, seed=0).double(), s), X, R)
             for qk in (None, "per_head") for s in (1.0, 64.0)}
    assert set(probe[None, 1.0]) == set(LogitScaleSweep.SERIES)
    assert probe[None, 64.0]["entropy"] < 0.1 < probe[None, 1.0]["entropy"]
    assert probe[None, 64.0]["grad_q"] < 1e-6 * probe[None, 1.0]["grad_q"]
    assert math.isclose(probe["per_head", 1.0]["entropy"], probe["per_head", 64.0]["entropy"], rel_tol=1e-6)
    # the probe's gradients are those of backward() through the module's own forward
    layer = make_attention(None, 32, 2, seed=0).double()
    ((layer(X, X, X) * R).sum() / math.sqrt(R.numel())).backward()
    assert math.isclose(probe[None, 1.0]["grad_W_q"], float(layer.W_q.weight.grad.norm()), rel_tol=1e-9)
    scaled = make_attention(None, 32, 2, seed=0).double()
    scaled.scale = 0.5
    for bad in (make_attention(None, 32, 2, seed=0, causal=True), make_attention(None, 32, 2, seed=0, num_kv_heads=1),
                scaled):
        with pytest.raises(ValueError, match="saturation_probe needs"):
            saturation_probe(bad.double(), X, R)
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        saturation_probe(torch.nn.Linear(32, 32), X, R)


def test_rope_order_gaps_separates_the_orders_once_gains_differ():
    from d2lmini.chapters.ch06_qk_norm import make_attention, rope_order_gaps

    layer = make_attention("per_head", 32, 2, seed=0, rope_theta=10000.0).double()
    X = torch.randn(1, 3 + 10, 32, dtype=torch.float64)
    assert rope_order_gaps(layer, X, 3)["weights"] < 1e-6
    with torch.no_grad():
        layer.q_norm.weight.copy_(torch.linspace(0.5, 1.5, layer.q_norm.weight.numel()))
    gaps = rope_order_gaps(layer, X, 3)
    assert gaps["weights"] > 1e-3 and gaps["after"] > 1e-3 > 1e-5 > gaps["before"]
    with pytest.raises(ValueError):
        rope_order_gaps(make_attention("per_head", 32, 2, seed=0), X.float(), 3)  # no RoPE


def test_logit_statistics_masks_the_future_of_a_causal_layer():
    from d2lmini.chapters.ch06_qk_norm import logit_statistics, make_attention

    X = torch.randn(1, 8, 32)
    layer = make_attention(None, 32, 2, seed=0)
    largest, entropy = logit_statistics(layer, X)
    with torch.no_grad():
        assert math.isclose(largest, float(attention_logits(layer, X).max()), rel_tol=1e-6)
    assert 0 < entropy <= math.log(8) + 1e-6
    layer.causal = True
    _, causal_entropy = logit_statistics(layer, X)
    assert causal_entropy < entropy  # the first query sees one key: entropy 0
