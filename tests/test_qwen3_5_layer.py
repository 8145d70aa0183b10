"""reference.from_qwen3_5_layer against Hugging Face ``Qwen3_5DecoderLayer`` (transformers 5.24), both layer types.

Qwen3.5 stacks three Gated DeltaNet ("linear_attention") layers per gated-attention
("full_attention") layer. The converter builds either as a pre-norm RMSNorm SwiGLU
``TransformerBlock`` whose token mixer comes from ``attn_factory``; the comparison runs
the HF layer with the mask its model builds for that layer type (``hf_call``).
"""

from __future__ import annotations

import pytest
import torch

from d2lmini import GatedAttention, TransformerBlock
from d2lmini.deltanet import GatedDeltaNet
from d2lmini.reference import (HF_CONVERTERS, TOLERANCE, compare_with_reference, from_hf, from_qwen3_5_layer, tiny_config,
                               hf_make, hf_reference)

#: Layer 0 is a Gated DeltaNet layer, layer 1 a gated-attention layer (GQA 4/2, partial RoPE).
TINY = tiny_config("qwen3_5")
MIXERS = {0: GatedDeltaNet, 1: GatedAttention}


def _reference(layer_idx: int, **overrides):
    pytest.importorskip("transformers")
    return hf_reference("Qwen3.5", "qwen3_5", "Qwen3_5DecoderLayer", "Qwen3_5TextConfig", dict(TINY, **overrides),
                        layer_idx=layer_idx, unit_offset_norms=True, rotary="Qwen3_5TextRotaryEmbedding")


def test_registered_in_from_hf():
    assert HF_CONVERTERS["Qwen3_5DecoderLayer"] is from_qwen3_5_layer


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("layer_idx", [0, 1], ids=["gated deltanet", "gated attention"])
def test_both_layer_types_match_hugging_face(layer_idx, padded):
    result = compare_with_reference(_reference(layer_idx), padded=padded)
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE, result
    assert result["max_abs_output"] > 0.1
    block = result["block"]
    assert isinstance(block, TransformerBlock) and isinstance(block.attention, MIXERS[layer_idx])
    assert (block.norm, block.placement, block.ffn.act) == ("rms", "pre", "swiglu")


@pytest.mark.parametrize("layer_idx", [0, 1])
def test_same_parameter_count_and_a_wrong_copy_is_caught(layer_idx):
    ref = _reference(layer_idx)
    layer, config = ref.make(0)
    block = from_hf(layer, config)
    assert sum(p.numel() for p in block.parameters()) == sum(p.numel() for p in layer.parameters())
    with torch.no_grad():
        block.addnorm1.norm_in.weight.sub_(1.0)  # the gains as stored (w), not as applied (1 + w)
    X = torch.randn(2, 8, TINY["hidden_size"])
    assert (block(X) - ref.call(layer, config, X, None)).abs().max() > 100 * TOLERANCE


def test_unsupported_layers_are_refused():
    pytest.importorskip("transformers")
    layer, config = hf_make("qwen3_5", "Qwen3_5DecoderLayer", "Qwen3_5TextConfig", dict(TINY, attention_bias=True),
                            layer_idx=1)(0)
    with pytest.raises(ValueError, match="gate bias"):
        from_qwen3_5_layer(layer, config)
    layer, config = hf_make("qwen3_5", "Qwen3_5DecoderLayer", "Qwen3_5TextConfig", TINY, layer_idx=1)(0)
    with pytest.raises(ValueError, match="layer_idx"):
        from_qwen3_5_layer(layer, config, 0)  # another layer's index would build the other type
    layer.mlp = torch.nn.Linear(2, 2)  # stands in for a MoE block without gate_proj
    with pytest.raises(ValueError, match="dense"):
        from_qwen3_5_layer(layer, config)
