"""Chapter 9, "The 2026 block" (the constructor's groups, the 2017 -> 2026 steps, the Llama 3 count), the
catalogue the block zoo shows (who uses what), and the mixture of experts and gated attention as sublayers."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from d2lmini import FeedForward, MultiHeadAttention, TransformerBlock
from d2lmini.chapters import ch09_the_2026_block as ch09
from d2lmini.chapters import zoo
from d2lmini.chapters.ch07_ffn import dense_mixture
from d2lmini import GatedAttention, MixtureOfExperts
from d2lmini.chapters.ch09_the_2026_block import (constructor_groups, rope_relative_check, sinusoidal_positions,
                                                  step_table, substitution_steps)
from d2lmini.chapters.zoo import describe, who_uses_what

TOLERANCE = 1e-5  # max |Δ| in float32


def _has_afmoe() -> bool:
    try:
        from transformers.models.afmoe.modeling_afmoe import AfmoeDecoderLayer  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- the constructor


def test_constructor_groups_cover_every_argument_once():
    groups = constructor_groups()
    assert list(groups) == ["sizes", "flags", "factories", "long context", "released models"]
    names = [n for n in inspect.signature(TransformerBlock.__init__).parameters
             if n not in ("self", "attention_kwargs")]
    names += [n for n in inspect.signature(MultiHeadAttention.__init__).parameters
              if n not in ("self", "num_hiddens", "num_heads", *names)]
    names += ["residual_multiplier", "layer_scalar"]  # TransformerBlock.set_scales
    listed = [n for args in groups.values() for n in args]
    assert sorted(listed) == sorted(names) and len(listed) == len(set(listed))
    assert groups["factories"] == ["attn_factory", "ffn_factory"]
    assert {"norm", "placement", "act", "qk_norm", "rope_theta"} <= set(groups["flags"])
    assert "window" in groups["long context"] and "num_kv_heads" in groups["sizes"]
    assert groups["released models"] == ["sublayer_norm_gain", "residual_multiplier", "layer_scalar"]


def test_a_grouped_argument_the_constructor_lost_is_caught(monkeypatch):
    monkeypatch.setitem(ch09.CONSTRUCTOR_GROUPS, "flags", ch09.CONSTRUCTOR_GROUPS["flags"] + ("gone",))
    with pytest.raises(KeyError, match="gone"):
        constructor_groups()


# --------------------------------------------------------------------------- mixture of experts


def test_sparse_moe_equals_the_dense_computation():
    torch.manual_seed(0)
    for router, shared in (("softmax", 0), ("sigmoid", 1)):
        moe = MixtureOfExperts(16, num_experts=5, top_k=2, router=router, num_shared_experts=shared)
        X = torch.randn(3, 7, 16)
        dense = dense_mixture(moe, X.reshape(-1, 16)).reshape(X.shape)
        assert (moe(X) - dense).abs().max() <= TOLERANCE
        assert moe(X).shape == X.shape


def test_one_expert_top_one_is_that_ffn():
    moe = MixtureOfExperts(16, num_experts=1, top_k=1, act="gelu")
    X = torch.randn(2, 5, 16)
    torch.testing.assert_close(moe(X), moe.experts[0](X), rtol=0, atol=1e-6)


def test_routing_weights_sum_to_route_scale_and_bias_steers_selection():
    torch.manual_seed(1)
    moe = MixtureOfExperts(16, num_experts=6, top_k=3, router="sigmoid", route_scale=2.5)
    tokens = torch.randn(40, 16)
    weights, experts = moe.route(tokens)
    assert weights.shape == experts.shape == (40, 3)
    torch.testing.assert_close(weights.sum(-1), torch.full((40,), 2.5))
    moe.expert_bias[4] = 100.0  # a load balancer's push: expert 4 is always chosen ...
    _, experts_biased = moe.route(tokens)
    assert (experts_biased == 4).any(-1).all()
    assert not (experts == 4).any(-1).all()  # ... which it was not before


def test_moe_counts_active_parameters():
    moe = MixtureOfExperts(32, num_experts=8, top_k=2, ffn_num_hiddens=48, num_shared_experts=1)
    per_expert = 3 * 32 * 48
    assert sum(p.numel() for p in moe.parameters()) == 32 * 8 + 8 * per_expert + per_expert
    assert moe.num_active_parameters() == 32 * 8 + per_expert + 2 * per_expert


def test_moe_drops_into_a_block_and_trains():
    block = TransformerBlock(16, 2, causal=True, ffn_factory=lambda: MixtureOfExperts(16, 4, top_k=2))
    X = torch.randn(2, 6, 16, requires_grad=True)
    block(X).pow(2).mean().backward()
    assert block.ffn.router.weight.grad.abs().sum() > 0  # the router learns through the mixing weights
    assert X.grad.shape == X.shape


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(num_experts=2, top_k=3), ValueError, "top_k must be <= num_experts=2"),
    (dict(router="relu"), ValueError, "router"),
    (dict(num_shared_experts=-1), ValueError, "num_shared_experts"),
    (dict(act="tanh"), ValueError, "act"),
    (dict(route_scale=0.0), ValueError, "route_scale"),
    (dict(top_k=1.5), TypeError, "top_k"),
])
def test_moe_rejects_bad_arguments(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        MixtureOfExperts(16, **kwargs)


def test_moe_rejects_a_wrong_width():
    with pytest.raises(ValueError, match="last dimension 16"):
        MixtureOfExperts(16)(torch.randn(2, 3, 8))


# --------------------------------------------------------------------------- gated attention


def test_gated_attention_with_a_zero_gate_halves_plain_attention():
    torch.manual_seed(0)
    gated = GatedAttention(16, 4, num_kv_heads=2, causal=True, qk_norm="per_head")
    plain = MultiHeadAttention(16, 4, num_kv_heads=2, causal=True, qk_norm="per_head")
    plain.load_state_dict({k.replace("attention.", "", 1): v for k, v in gated.state_dict().items()
                           if k.startswith("attention.")}, strict=False)
    with torch.no_grad():
        plain.W_o.weight.copy_(gated.W_o.weight)
        gated.W_gate.weight.zero_()  # sigmoid(0) = 1/2 on every feature
    X = torch.randn(2, 5, 16)
    torch.testing.assert_close(gated(X, X, X), 0.5 * plain(X, X, X), rtol=0, atol=1e-6)
    assert (gated.num_heads, gated.num_kv_heads, gated.qk_norm, gated.causal) == (4, 2, "per_head", True)


# --------------------------------------------------------------------------- 2017 -> 2026


def test_substitution_steps_keep_the_skeleton_and_change_what_they_should():
    d, h = 64, 8
    steps = substitution_steps(num_hiddens=d, num_heads=h, batch_size=2, num_steps=5, seed=0)
    assert len(steps) == len(ch09.SUBSTITUTIONS) + 1 and sum(s.core for s in steps[1:]) == 5
    assert all(s.output_shape == (2, 5, d) for s in steps)
    totals = [s.parameters["total"] for s in steps]
    delta = [b - a for a, b in zip(totals, totals[1:])]
    assert delta[0] == -2 * d                 # two LayerNorms lose their biases
    assert delta[1] == 0                      # moving a norm costs nothing
    kv = (h // 4) * (d // h)
    assert delta[2] == -2 * (d * d + d - (d * kv + kv))  # W_k, W_v shrink to h/4 heads
    assert abs(delta[3]) < 0.02 * totals[3]   # SwiGLU at 8d/3 keeps the FFN's budget
    assert delta[4] == 0                      # RoPE has no parameters
    assert delta[6] == 2 * (d // h)           # QK-norm: two gains of head_dim
    assert steps[3].kv_cache_per_token * 4 == steps[0].kv_cache_per_token
    final = steps[-1].kwargs
    assert final["norm"] == "rms" and final["placement"] == "pre" and final["act"] == "swiglu"
    assert final["rope_theta"] and final["qk_norm"] == "per_head" and final["bias"] is False
    table = step_table(steps, formatted=True)
    assert list(table.columns) == ["flag", "parameters", "Δ parameters", "of which FFN", "K/V numbers per token and block"]
    assert table["Δ parameters"].iloc[1] == f"{-2 * d:+,}"


def test_substitution_steps_need_heads_divisible_by_four():
    with pytest.raises(ValueError, match="divisible by 4"):
        substitution_steps(num_hiddens=48, num_heads=6)


def test_sinusoidal_positions_follow_the_2017_formula():
    P = sinusoidal_positions(10, 8)
    assert P.shape == (10, 8)
    assert P[3, 2].item() == pytest.approx(math.sin(3 / 10000 ** (2 / 8)), abs=1e-6)
    assert P[3, 3].item() == pytest.approx(math.cos(3 / 10000 ** (2 / 8)), abs=1e-6)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_positions(4, 7)


def test_rope_logits_depend_on_offsets_only_and_sinusoidal_do_not():
    result = rope_relative_check(num_hiddens=32, head_dim=16, num_tokens=3, num_steps=12, shifts=(1, 7), seed=2)
    assert result["rope_max_abs_diff"] < 1e-4 * max(1.0, result["max_abs_logit"])
    assert result["sinusoidal_max_abs_diff"] > 0.1 * result["max_abs_logit"]
    assert rope_relative_check(seed=2) == rope_relative_check(seed=2)


# --------------------------------------------------------------------------- who uses what


@pytest.fixture(scope="module")
def rows():
    pytest.importorskip("transformers")
    return who_uses_what(seed=0)


def test_every_model_of_the_table_is_there_in_order(rows):
    assert [r["model"] for r in rows] == ["Transformer (2017)", "BERT", "GPT-2", "Llama 3", "Qwen3", "Gemma 3",
                                          "OLMo 2", "Arcee Trinity"]


def test_every_row_with_a_reference_layer_is_verified(rows):
    for row in rows:
        if row["model"] == "Arcee Trinity" and not _has_afmoe():
            assert row["status"] == "not verified (no reference layer)"
            continue
        assert row["status"] == "verified", row
        assert row["max_abs_diff"] <= TOLERANCE and row["max_abs_grad_diff"] <= TOLERANCE
        assert row["max_abs_output"] > 0.5  # a real signal


def test_descriptive_columns_come_from_the_configured_blocks(rows):
    by_model = {r["model"]: r for r in rows}
    assert by_model["Transformer (2017)"]["placement"] == "post"
    assert by_model["Transformer (2017)"]["positions"] == "sinusoidal, added to the input"
    assert by_model["GPT-2"]["placement"] == "pre" and by_model["GPT-2"]["attention"].startswith("MHA ")
    assert by_model["GPT-2"]["attention"].endswith(", causal")
    assert by_model["BERT"]["attention"].endswith(", bidirectional")
    assert by_model["Llama 3"]["norm"].startswith("RMSNorm (eps") and by_model["Llama 3"]["qk_norm"] == "—"
    assert by_model["Qwen3"]["qk_norm"] == "per head"
    assert by_model["OLMo 2"]["placement"] == "post-sublayer" and by_model["OLMo 2"]["qk_norm"] == "whole projection"
    assert by_model["Gemma 3"]["placement"] == "sandwich" and by_model["Gemma 3"]["ffn"].startswith("GeGLU, ")
    assert by_model["Arcee Trinity"]["placement"] == "sandwich"
    assert "MoE" in by_model["Arcee Trinity"]["ffn"] and "sigmoid" in by_model["Arcee Trinity"]["ffn"]
    assert "sigmoid output gate" in by_model["Arcee Trinity"]["attention"]
    for model in ("Llama 3", "Qwen3", "Gemma 3", "OLMo 2"):
        assert by_model[model]["positions"].startswith("RoPE, base ")
    table = zoo.catalog_table(rows)
    assert list(table.columns) == ["norm", "placement", "QK-norm", "FFN", "attention (test layer)",
                                   "positions"]
    assert len(zoo.verification_table(rows)) == 8


def test_describe_reads_the_modules_with_plots_labels():
    block = TransformerBlock(16, 4, num_kv_heads=2, rope_theta=1e4, qk_norm="projection", placement="sandwich")
    assert describe(block) == {"norm": "RMSNorm (eps 1e-06)", "placement": "sandwich", "qk_norm": "whole projection",
                               "attention": "GQA 4/2 heads x 4, bidirectional", "positions": "RoPE, base 10000",
                               "ffn": "SwiGLU, 43 hidden", "bias": "none", "residual": "1"}
    no_rope = TransformerBlock(16, 4)
    assert describe(no_rope)["positions"] == "none in the layer"
    assert describe(no_rope, "learned, added to the input")["positions"] == "learned, added to the input"
    with pytest.raises(TypeError, match="TransformerBlock"):
        describe(FeedForward(16))


@pytest.mark.skipif(not _has_afmoe(), reason="this transformers has no AfmoeDecoderLayer")
def test_trinity_comparison_can_fail(monkeypatch):
    from d2lmini.reference import HF_CONVERTERS

    original = HF_CONVERTERS["AfmoeDecoderLayer"]

    def off_by_one_percent(layer, config, layer_idx=None):
        block = original(layer, config, layer_idx)
        with torch.no_grad():
            block.ffn.shared.W_2.weight.mul_(1.01)  # the shared expert sees every token
        return block

    monkeypatch.setitem(HF_CONVERTERS, "AfmoeDecoderLayer", off_by_one_percent)
    assert zoo.compare_with_trinity()["max_abs_diff"] > 100 * TOLERANCE


@pytest.mark.skipif(not _has_afmoe(), reason="this transformers has no AfmoeDecoderLayer")
def test_trinity_converter_is_the_reference_one_and_takes_local_layers():
    from transformers import AfmoeConfig
    from transformers.models.afmoe.modeling_afmoe import AfmoeDecoderLayer

    from d2lmini import reference

    assert zoo.from_afmoe_layer is reference.from_afmoe_layer  # one converter, re-exported for the chapter
    config = AfmoeConfig(**reference.tiny_config("afmoe_global", layer_types=["sliding_attention"], sliding_window=5))
    block = zoo.from_afmoe_layer(AfmoeDecoderLayer(config, layer_idx=0), config)
    assert block.attention.window == 5 and block.attention.rope_theta == config.rope_parameters["rope_theta"]


# --------------------------------------------------------------------------- the whole model


def test_experiments_leave_the_global_rng_alone():
    state = torch.random.get_rng_state()
    substitution_steps(num_hiddens=32, num_heads=4, num_steps=3)
    rope_relative_check(num_steps=4, shifts=(1,))
    assert torch.equal(state, torch.random.get_rng_state())
