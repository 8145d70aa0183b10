"""Llama 4's layer (Hugging Face ``Llama4TextDecoderLayer``, transformers 5.24) and the d2lmini options it needs.

Llama 4 has two attention kinds -- RoPE layers (interleaved RoPE, gainless "L2" QK-norm after
RoPE, chunked attention) and NoPE layers (no positions, attention temperature tuning, full
causal attention) -- and two FFNs, a dense SwiGLU MLP and a mixture whose top-1 router's
sigmoid scales the expert's input, plus a shared expert. ``reference.from_llama4_layer``
builds each as a ``TransformerBlock`` whose attention is a ``Llama4Attention`` with ``chunk=``,
``l2_norm_eps=``, ``query_scaling=(attn_scale, floor_scale, 1)``, and ``MixtureOfExperts(router='sigmoid_input')``;
the comparison runs the HF layer with the masks its model builds (``hf_call``).
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from d2lmini import MultiHeadAttention, TransformerBlock
from d2lmini.chapters.zoo import ROWS_2026, verify_2026
from d2lmini.moe import MixtureOfExperts
from d2lmini.reference.llama4 import Llama4Attention
from d2lmini.reference import (HF_CONVERTERS, TOLERANCE, Reference, compare_with_reference, from_hf,
                               from_llama4_layer, hf_reference, tiny_config)

#: layer -> (RoPE?, MoE?) in the tiny "llama4" configuration: every combination once.
KINDS = {0: (True, False), 1: (False, True), 2: (True, True), 3: (False, False)}


def _reference(layer_idx: int, **overrides):
    pytest.importorskip("transformers")
    return hf_reference("Llama 4", "llama4", "Llama4TextDecoderLayer", "Llama4TextConfig",
                        tiny_config("llama4", **overrides), layer_idx=layer_idx)


def _mutated(ref: Reference, mutate) -> Reference:
    def convert(layer, config):
        block = ref.convert(layer, config)
        mutate(block, layer, config)
        return block
    return Reference(ref.name, ref.model, ref.make, convert, ref.call, ref.causal)


def _worst(result) -> float:
    return max(result["max_abs_diff"], result["max_abs_grad_diff"])


def test_registered_in_from_hf():
    assert HF_CONVERTERS["Llama4TextDecoderLayer"] is from_llama4_layer


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("layer_idx", sorted(KINDS), ids=["rope-dense", "nope-moe", "rope-moe", "nope-dense"])
def test_every_layer_kind_matches_hugging_face(layer_idx, padded):
    result = compare_with_reference(_reference(layer_idx), padded=padded)
    assert _worst(result) <= TOLERANCE, result
    assert result["max_abs_output"] > 0.1
    rope, moe = KINDS[layer_idx]
    att, ffn = result["block"].attention, result["block"].ffn
    assert (att.chunk, att.l2_norm_eps, att.rope_theta is not None) == ((5, 1e-5, True) if rope else (None, None, False))
    assert att.query_scaling == (None if rope else (0.5, 3, 1))
    assert isinstance(ffn, MixtureOfExperts) == moe
    if moe:
        assert (ffn.router_kind, ffn.top_k, ffn.shared is not None) == ("sigmoid_input", 1, True)


@pytest.mark.parametrize("layer_idx, overrides", [
    (2, dict(num_experts_per_tok=2)),
    (1, dict(num_experts_per_tok=3, floor_scale=2, attn_scale=0.1)),
    (0, dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8})),
    # YaRN's attention factor scales q and k; the L2 norm after RoPE removes it again (before it would not)
    (0, dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 16})),
    (2, dict(attention_bias=True)),
    (0, dict(use_qk_norm=False, attention_chunk_size=3)),
    (3, dict(attn_temperature_tuning=False)),
    (0, dict(attention_chunk_size=None)),  # no chunked layers: every layer full causal
], ids=["top-2", "top-3 nope", "llama3 rope", "yarn rope", "attention bias", "no qk-norm", "no tuning", "no chunks"])
def test_variants_match_hugging_face(layer_idx, overrides):
    result = compare_with_reference(_reference(layer_idx, **overrides))
    assert _worst(result) <= TOLERANCE, result


def test_layer_types_decide_the_mask_independently_of_rope():
    kinds = ["full_attention", "chunked_attention", "chunked_attention", "full_attention"]
    for i in (0, 1):  # a full RoPE layer and a chunked NoPE layer
        result = compare_with_reference(_reference(i, layer_types=kinds))
        assert _worst(result) <= TOLERANCE, result
        assert result["block"].attention.chunk == (5 if kinds[i] == "chunked_attention" else None)


def _unpermuted(block, layer, config):
    with torch.no_grad():
        block.attention.W_q.weight.copy_(layer.self_attn.q_proj.weight)
        block.attention.W_k.weight.copy_(layer.self_attn.k_proj.weight)


MUTATIONS = {
    "chunk": (0, lambda block, layer, config: setattr(block.attention, "chunk", None)),
    "l2 qk-norm": (2, lambda block, layer, config: setattr(block.attention, "l2_norm_eps", None)),
    "interleaved rope": (0, _unpermuted),
    "temperature": (1, lambda block, layer, config: setattr(block.attention, "query_scaling", None)),
    "temperature offset": (3, lambda block, layer, config: setattr(block.attention, "query_scaling", (0.5, 3))),
    "router on the input": (1, lambda block, layer, config: setattr(block.ffn, "router_kind", "sigmoid")),
    "shared expert": (2, lambda block, layer, config: setattr(block.ffn, "shared", None)),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_feature_is_needed(name):
    layer_idx, mutate = MUTATIONS[name]
    ref = _reference(layer_idx)
    assert _worst(compare_with_reference(ref)) <= TOLERANCE
    assert _worst(compare_with_reference(_mutated(ref, mutate))) > 100 * TOLERANCE


def test_same_parameter_count_and_layer_idx_checked():
    for i in KINDS:
        layer, config = _reference(i).make(0)
        block = from_hf(layer, config)
        assert sum(p.numel() for p in block.parameters()) == sum(p.numel() for p in layer.parameters())
    with pytest.raises(ValueError, match="layer_idx"):
        from_llama4_layer(layer, config, layer_idx=1)


def test_a_floor_scale_below_one_is_refused():
    layer, config = _reference(1).make(0)
    config.floor_scale = 0
    with pytest.raises(ValueError, match="period"):
        from_llama4_layer(layer, config)


def test_the_2026_row_is_verified_and_nothing_is_missing():
    row = next(row for row in ROWS_2026 if row.model == "Llama 4")
    assert row.missing == "" and row.check is not None
    result = verify_2026(row)
    assert result["status"] == "verified", result


# --------------------------------------------------------------------------- chunk=


def test_chunk_mask_is_causal_within_chunks():
    attn = Llama4Attention(16, 2, causal=True, chunk=3)
    mask = attn.mask(None, 1, 8, 8, "cpu")
    i, j = torch.arange(8)[:, None], torch.arange(8)[None]
    assert torch.equal(mask, (j <= i) & (i // 3 == j // 3))


def test_chunk_changes_the_output_and_a_long_chunk_is_plain_causal():
    torch.manual_seed(0)
    X = torch.randn(2, 10, 16)
    causal = MultiHeadAttention(16, 2, causal=True).eval()
    for chunk, same in ((4, False), (10, True), (25, True)):
        chunked = Llama4Attention(16, 2, causal=True, chunk=chunk).eval()
        chunked.load_state_dict(causal.state_dict())
        assert torch.allclose(chunked(X, X, X), causal(X, X, X), atol=1e-6) == same
    # the first query of each chunk sees itself alone: its output is its own value, projected
    chunked = Llama4Attention(16, 2, causal=True, chunk=4).eval()
    alone = chunked.W_o(chunked.W_v(X[:, 4]))
    assert torch.allclose(chunked(X, X, X)[:, 4], alone, atol=1e-6)


def test_chunk_with_padding_stays_finite():
    attn = Llama4Attention(16, 2, causal=True, chunk=3)
    X = torch.randn(2, 8, 16)
    out = attn(X, X, X, torch.tensor([8, 2]))  # queries 3..7 of the second sequence see no real key
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("value, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)])
def test_bad_chunk_is_rejected_naming_it(value, error):
    with pytest.raises(error, match="chunk"):
        Llama4Attention(16, 2, causal=True, chunk=value)


def test_chunk_needs_causal_and_reaches_a_block_through_its_factory():
    with pytest.raises(ValueError, match="chunk.*causal"):
        Llama4Attention(16, 2, chunk=4)
    with pytest.raises(TypeError, match="unknown argument.*chunk"):  # not an option of the chapters' attention
        TransformerBlock(16, 2, causal=True, chunk=4)
    assert TransformerBlock(16, 2, attn_factory=lambda: Llama4Attention(16, 2, causal=True, chunk=4)).attention.chunk == 4
    assert inspect.signature(Llama4Attention).parameters["chunk"].kind is inspect.Parameter.KEYWORD_ONLY


# --------------------------------------------------------------------------- l2_norm_eps, query_scaling offset


def test_l2_qk_norm_is_a_gainless_rms_norm_after_rope():
    torch.manual_seed(0)
    attn = Llama4Attention(32, 4, causal=True, l2_norm_eps=1e-5, rope_theta=100.0)
    assert attn.q_norm is None and attn.k_norm is None and sum(p.numel() for p in attn.parameters()) == 4 * 32 * 32
    X = torch.randn(2, 6, 32)
    q, _ = attn.queries_and_keys(X, X)
    assert torch.allclose(q.pow(2).mean(-1), torch.ones(()), atol=1e-3)  # unit mean square: no gain
    plain = MultiHeadAttention(32, 4, causal=True, rope_theta=100.0)
    plain.load_state_dict(attn.state_dict())
    q0, _ = plain.queries_and_keys(X, X)
    assert torch.allclose(q, q0 * torch.rsqrt(q0.pow(2).mean(-1, keepdim=True) + 1e-5), atol=1e-6)
    assert not torch.allclose(attn(X, X, X), plain(X, X, X), atol=1e-3)
    for other in (dict(qk_norm="per_head"), dict(query_scaling=(0.5, 3))):
        with pytest.raises(ValueError, match="l2_norm_eps"):
            Llama4Attention(32, 4, causal=True, l2_norm_eps=1e-5, rope_theta=100.0, **other)


def test_query_scaling_offset_shifts_the_positions():
    attn = Llama4Attention(16, 2, causal=True, query_scaling=(0.5, 3, 1))
    scales = attn.query_scales(7, torch.zeros(()))[:, 0]
    expected = [1 + 0.5 * math.log(1 + math.floor((p + 1) / 3)) for p in range(7)]
    assert torch.allclose(scales, torch.tensor(expected))
    assert Llama4Attention(16, 2, query_scaling=(0.5, 3, 0)).query_scaling == (0.5, 3)
    assert attn.query_scaling == (0.5, 3, 1)


# --------------------------------------------------------------------------- router='sigmoid_input'


def test_sigmoid_input_router_scales_the_expert_input_without_renormalizing():
    torch.manual_seed(0)
    moe = MixtureOfExperts(8, 4, top_k=2, ffn_num_hiddens=6, router="sigmoid_input", num_shared_experts=1)
    X = torch.randn(5, 8)
    logits = moe.router(X)
    top, idx = logits.topk(2, dim=-1)
    expected = moe.shared(X).clone()
    for t in range(5):
        for s in range(2):
            expected[t] += moe.experts[int(idx[t, s])](torch.sigmoid(top[t, s]) * X[t])
    assert torch.allclose(moe(X), expected, atol=1e-6)
    other = MixtureOfExperts(8, 4, top_k=2, ffn_num_hiddens=6, router="sigmoid", num_shared_experts=1)
    other.load_state_dict(moe.state_dict())
    assert not torch.allclose(other(X), moe(X), atol=1e-3)


def test_unknown_router_lists_sigmoid_input():
    with pytest.raises(ValueError, match="sigmoid_input"):
        MixtureOfExperts(8, 4, router="sigmoid_top1")
