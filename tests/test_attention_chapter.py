"""The experiments of the chapter "Beyond softmax attention" (d2lmini.chapters.ch11_beyond_softmax)."""

from __future__ import annotations

import math

import pytest
import torch

from d2lmini import GatedAttention, MultiHeadAttention
from d2lmini.chapters import ch11_beyond_softmax as attn26


@pytest.mark.parametrize("check", [attn26.verify_mla, attn26.verify_gated_attention, attn26.verify_gated_deltanet])
def test_verifications_match_transformers(check):
    pytest.importorskip("transformers")
    result = check(seed=0)
    assert result["status"] == "verified"
    assert result["max_abs_diff"] <= 1e-5
    assert result["max_abs_grad_diff"] <= 1e-5 * max(1.0, result["max_abs_grad"])
    assert result["max_abs_output"] > 0.1


def test_sinks_verification_matches_gpt_oss():
    pytest.importorskip("transformers")
    result = attn26.verify_sinks(seed=0)
    assert result["status"] == "verified"
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= 1e-5


def test_verification_reports_a_missing_class(monkeypatch):
    monkeypatch.setattr(attn26, "_available", lambda *args: False)
    assert attn26.verify_mla() == attn26.NOT_AVAILABLE
    assert attn26.verify_gated_attention()["status"] == "not available in this transformers"
    assert attn26.verify_gated_deltanet()["status"] == "not available in this transformers"


def test_compare_with_hf_sees_a_difference():
    layer = torch.nn.Linear(8, 8)
    result = attn26.compare_with_hf(lambda Z: layer(Z), lambda Z: layer(Z) * 1.01, 8, num_steps=4)
    assert result["max_abs_diff"] > 1e-4 and result["max_abs_grad_diff"] > 1e-4


@pytest.mark.parametrize("window, depth", [(4, 1), (4, 3), (3, 5)])
def test_receptive_field_of_local_layers_is_depth_times_window(window, depth):
    stack = attn26.local_global_stack("L", depth, window=window)
    field = attn26.receptive_field(stack, 40)
    expected = depth * (window - 1) + 1
    assert int(field.sum()) == expected
    assert field[-expected:].all()  # a contiguous band ending at the last token


def test_one_global_layer_reaches_everything():
    sizes = attn26.receptive_field_by_depth({"3:1": "LLLG", "all global": "G"}, window=4, num_steps=32,
                                            max_depth=5)
    assert sizes["3:1"][:3] == [4, 7, 10] and sizes["3:1"][3:] == [32, 32]
    assert sizes["all global"] == [32] * 5


def test_reach_matrix_is_a_causal_band():
    matrix = attn26.reach_matrix(attn26.local_global_stack("L", 2, window=3), 10)
    i, j = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    assert torch.equal(matrix, (j <= i) & (j > i - 5))


def test_local_global_stack_rejects_bad_patterns():
    for bad in ("", "LX", "lg"):
        with pytest.raises(ValueError, match="pattern"):
            attn26.local_global_stack(bad, 2, window=4)


def test_sink_share_matches_the_formula_and_grows_with_the_logit():
    sweep = attn26.sink_sweep([-2.0, 0.0, 3.0], num_steps=16, seed=0)
    share = sweep["share"]
    assert share.shape == (3, 16)
    assert (share[1:] > share[:-1]).all()  # a larger sink logit takes more
    assert (share[:, 0] > share[:, -1]).all()  # an early query (few keys) gives the sink more
    # the first query sees one key: share = e^s / (e^s + e^z) for its single logit z
    assert 0 < float(share[1, 0]) < 1


def test_sink_share_is_zero_without_a_sink_weight():
    with torch.no_grad():
        attention = MultiHeadAttention(8, 2, bias=True, causal=True, sinks=True)
        attention.sinks.fill_(-1e4)
    share = attn26.sink_share(attention, torch.randn(1, 5, 8))
    assert share.abs().max() < 1e-5


def test_sink_share_needs_its_layout():
    with pytest.raises(ValueError, match="bias=True"):
        attn26.sink_share(MultiHeadAttention(8, 2, sinks=True), torch.randn(1, 3, 8))


def test_rope_settings_table():
    rows = {r["setting"]: r for r in attn26.rope_settings_table(attn26.ROPE_SETTINGS, 4096)}
    assert rows["Llama 3"]["shortest"] == pytest.approx(2 * math.pi)
    assert rows["Llama 3"]["longest"] > rows["RoFormer / Llama 2"]["longest"]
    assert rows["Qwen3.5 (partial)"]["pairs"] == 32
    assert rows["gpt-oss, YaRN x32"]["attention factor"] == pytest.approx(0.1 * math.log(32) + 1)
    yarn = attn26.rope_wavelengths(attn26.ROPE_SETTINGS["gpt-oss, YaRN x32"])
    plain = attn26.rope_wavelengths(attn26.ROPE_SETTINGS["gpt-oss, unscaled"])
    assert yarn[0] == pytest.approx(plain[0]) and yarn[-1] == pytest.approx(32 * plain[-1])
    with pytest.raises(ValueError, match="'scaling'"):  # a scaling under another name is not ignored
        attn26.rope_wavelengths({**attn26.ROPE_SETTINGS["Llama 3"], "rope_scaling": {"factor": 8.0}})


def test_layer_patterns_read_from_transformers():
    pytest.importorskip("transformers")
    patterns = attn26.layer_patterns()
    assert patterns["Gemma 3"][1] == "LLLLLGLL"
    assert patterns["gpt-oss"][1] == "LGLGLGLG"
    assert patterns["SmolLM3"][1] == "RRRNRRRN"
    assert patterns["Qwen3.5"][1] == "DDDFDDDF"


def test_gated_attention_forward_is_the_gate_formula():
    gated = GatedAttention(8, 2, causal=True)
    X = torch.randn(1, 4, 8)
    heads = gated.attention(X, X, X)
    torch.testing.assert_close(gated(X, X, X), gated.W_o(heads * torch.sigmoid(gated.W_gate(X))))


def test_stack_state_bytes():
    mixers = attn26.qwen3_5_mixers()
    lengths = [1024, 4096, 65536]
    gdn = attn26.stack_state_bytes(["linear_attention"], mixers, lengths)
    full = attn26.stack_state_bytes(["full_attention"], mixers, lengths)
    local = attn26.stack_state_bytes(["sliding_attention"], mixers, lengths)
    assert gdn[0] == gdn[-1] > 0
    assert full == [n * 2 * 4 * 256 * 2 for n in lengths]
    assert local[-1] == local[1] == full[1]
    hybrid = attn26.stack_state_bytes(["linear_attention"] * 3 + ["full_attention"], mixers, lengths)
    assert hybrid == [3 * g + f for g, f in zip(gdn, full)]
