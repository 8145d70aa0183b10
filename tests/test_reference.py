"""d2lmini blocks against the real layers: same weights, same outputs and input gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import d2lmini
from d2lmini import reference
from d2lmini.reference import REFERENCES, compare_with_reference

TOLERANCE = 1e-5  # max |Δ| in float32


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_block_equals_reference_layer(name, padded):
    if REFERENCES[name].needs_transformers:
        pytest.importorskip("transformers")
    result = compare_with_reference(name, batch_size=2, num_steps=16, seed=0, padded=padded)
    assert result["max_abs_output"] > 0.5  # a real signal, not zeros compared with zeros
    assert result["max_abs_diff"] <= TOLERANCE
    assert result["max_abs_grad_diff"] <= TOLERANCE


def test_every_layer_the_issue_names_is_covered():
    names = set(REFERENCES)
    assert {"BertLayer", "GPT2Block", "LlamaDecoderLayer", "Qwen3DecoderLayer", "Olmo2DecoderLayer",
            "Gemma3DecoderLayer", "TransformerDecoderLayer"} <= names
    encoders = [n for n in names if n.startswith("TransformerEncoderLayer")]
    assert len(encoders) == 4  # norm_first False/True x relu/gelu


def test_the_comparison_catches_a_wrong_weight():
    ref = REFERENCES["LlamaDecoderLayer"]
    layer, config = ref.make(0)
    original = ref.convert

    def off_by_one_percent(layer, config):
        block = original(layer, config)
        with torch.no_grad():
            block.ffn.W_2.weight.mul_(1.01)
        return block

    ref.convert = off_by_one_percent
    try:
        assert compare_with_reference("LlamaDecoderLayer")["max_abs_diff"] > 100 * TOLERANCE
    finally:
        ref.convert = original


def test_gemma_gain_is_one_plus_w():
    pytest.importorskip("transformers")
    layer, config = REFERENCES["Gemma3DecoderLayer"].make(0)
    block = reference.from_gemma3_layer(layer, config)
    torch.testing.assert_close(block.addnorm1.norm_in.weight, 1 + layer.input_layernorm.weight)
    assert block.attention.scale == pytest.approx(config.query_pre_attn_scalar ** -0.5)
    assert block.attention.qk_norm == "per_head"


def test_qwen3_head_dim_is_not_d_over_h():
    pytest.importorskip("transformers")
    layer, config = REFERENCES["Qwen3DecoderLayer"].make(0)
    block = reference.from_qwen3_layer(layer, config)
    assert block.attention.head_dim == 32 != config.hidden_size // config.num_attention_heads


def test_torch_encoder_fast_path_agrees_on_valid_positions():
    """In eval mode without grad, nn.TransformerEncoderLayer takes a fused path (nested tensors)."""
    layer, _ = REFERENCES["TransformerEncoderLayer(norm_first=False, activation='relu')"].make(0)
    block = reference.from_torch_encoder_layer(layer).eval()
    X = torch.randn(2, 16, 64)
    valid_lens = torch.tensor([16, 10])
    padding = torch.arange(16)[None, :] >= valid_lens[:, None]
    with torch.no_grad():
        fast = layer(X, src_key_padding_mask=padding)
        ours = block(X, valid_lens)
    torch.testing.assert_close(ours[0], fast[0], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(ours[1, :10], fast[1, :10], atol=TOLERANCE, rtol=0)


def test_hf_mask_none_means_causal_under_sdpa_but_not_under_eager():
    """Why the harness always passes explicit masks."""
    pytest.importorskip("transformers")
    ref = REFERENCES["LlamaDecoderLayer"]
    layer, config = ref.make(0)
    X = torch.randn(1, 8, 64)
    import transformers as tf

    rotary = tf.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    position_ids = torch.arange(8)[None]
    kwargs = dict(position_embeddings=rotary(X, position_ids), position_ids=position_ids)
    with torch.no_grad():
        config._attn_implementation = "sdpa"
        sdpa = layer(X, attention_mask=None, **kwargs)
        config._attn_implementation = "eager"
        eager = layer(X, attention_mask=None, **kwargs)
        eager_masked = ref.call(layer, config, X, None)
        config._attn_implementation = "sdpa"
        block = ref.convert(layer, config)
        causal_ours = block(X)
    assert (sdpa - eager).abs().max() > 1e-3
    torch.testing.assert_close(causal_ours, sdpa, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(causal_ours, eager_masked, atol=TOLERANCE, rtol=0)


def test_from_torch_encoder_layer_rejects_sequence_first_layers():
    layer = nn.TransformerEncoderLayer(16, 2, batch_first=False)
    with pytest.raises(ValueError, match="batch_first=True"):
        reference.from_torch_encoder_layer(layer)


def test_unknown_reference_lists_the_known_ones():
    with pytest.raises(KeyError, match="LlamaDecoderLayer"):
        compare_with_reference("MistralDecoderLayer")


def test_decoder_block_cross_attends_to_the_encoder():
    block = d2lmini.TransformerDecoderBlock(32, 4, norm="layer", act="relu", placement="post")
    X, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    base = block(X, memory, torch.tensor([7, 4]))
    changed = memory.clone()
    changed[1, 4:] += 10.0  # only padded encoder positions of sequence 1
    torch.testing.assert_close(block(X, changed, torch.tensor([7, 4])), base)
    changed[1, 0] += 1.0
    assert not torch.allclose(block(X, changed, torch.tensor([7, 4]))[1], base[1])


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_decoder_block_matches_torch_transformer_decoder_layer(norm_first):
    # Fails if the decoder block's cross-attention or third residual connection is built from the
    # wrong settings (e.g. without biases, or sharing addnorm2's norms: copying norm3 into it
    # would overwrite norm2), or if the masks disagree with torch's padding masks.
    torch.manual_seed(0)
    layer = reference.randomize_(nn.TransformerDecoderLayer(32, 4, dim_feedforward=64, dropout=0.0,
                                                             activation="gelu", batch_first=True,
                                                             norm_first=norm_first), seed=1).eval()
    block = reference.from_torch_decoder_layer(layer).eval()
    assert block.attention.causal and not block.cross_attention.causal
    X, memory = torch.randn(2, 6, 32), torch.randn(2, 5, 32)
    valid_lens, memory_lens = torch.tensor([6, 4]), torch.tensor([5, 3])
    expected = layer(X, memory, tgt_mask=torch.ones(6, 6, dtype=torch.bool).triu(1),
                     tgt_key_padding_mask=torch.arange(6) >= valid_lens[:, None],
                     memory_key_padding_mask=torch.arange(5) >= memory_lens[:, None])
    ours = block(X, memory, memory_lens, valid_lens)
    keep = torch.arange(6) < valid_lens[:, None]
    torch.testing.assert_close(ours[keep], expected[keep], atol=TOLERANCE, rtol=0)
