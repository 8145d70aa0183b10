"""Qwen3.5's MoE layers: ``MixtureOfExperts(shared_expert_gate=True)`` and ``from_qwen3_5_layer`` on
Hugging Face ``Qwen3_5MoeDecoderLayer`` (transformers 5.24), both layer types.

``Qwen3_5MoeSparseMoeBlock`` routes with a softmax over ``num_experts`` and renormalizes the
``num_experts_per_tok`` selected probabilities, runs SwiGLU experts stored fused
(``gate_up_proj``), and adds a SwiGLU shared expert scaled per token by
``sigmoid(shared_expert_gate(x))``. The layer comparisons run the HF layer with the masks its
model builds (``hf_call``): outputs and input gradients to 1e-5 absolute, padded and unpadded
(the Gated DeltaNet layer's gradients too, at these 16 steps; see tests/test_deltanet.py for
why longer inputs can need a relative bound).
"""

from __future__ import annotations

import pytest
import torch

from d2lmini import GatedAttention, MixtureOfExperts, TransformerBlock
from d2lmini.deltanet import GatedDeltaNet
from d2lmini.reference import (HF_CONVERTERS, TOLERANCE, compare_with_reference, from_hf, from_qwen3_5_layer, tiny_config,
                               hf_make, hf_reference)

#: Layer 0 is a Gated DeltaNet layer, layer 1 a gated-attention layer; every layer's FFN is the MoE block
#: (8 experts of width 16, top-2, a shared expert of width 32 = two expert widths).
TINY = tiny_config("qwen3_5_moe")
MIXERS = {0: GatedDeltaNet, 1: GatedAttention}


def _reference(layer_idx: int, **overrides):
    pytest.importorskip("transformers")
    return hf_reference("Qwen3.5 MoE", "qwen3_5_moe", "Qwen3_5MoeDecoderLayer", "Qwen3_5MoeTextConfig",
                        dict(TINY, **overrides), layer_idx=layer_idx, unit_offset_norms=True,
                        rotary="Qwen3_5MoeTextRotaryEmbedding")


def test_registered_in_from_hf():
    assert HF_CONVERTERS["Qwen3_5MoeDecoderLayer"] is from_qwen3_5_layer


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("layer_idx", [0, 1], ids=["gated deltanet", "gated attention"])
def test_both_moe_layer_types_match_hugging_face(layer_idx, padded):
    result = compare_with_reference(_reference(layer_idx), padded=padded)
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE, result
    assert result["max_abs_output"] > 0.1
    block = result["block"]
    assert isinstance(block, TransformerBlock) and isinstance(block.attention, MIXERS[layer_idx])
    moe = block.ffn
    assert isinstance(moe, MixtureOfExperts)
    assert (moe.num_experts, moe.top_k, moe.router_kind, moe.num_shared_experts) == (8, 2, "softmax", 2)
    assert moe.shared_expert_gate is not None and moe.experts[0].ffn_num_hiddens == 16


@pytest.mark.parametrize("layer_idx", [0, 1])
def test_same_parameter_count_and_an_ungated_shared_expert_is_caught(layer_idx):
    ref = _reference(layer_idx)
    layer, config = ref.make(0)
    block = from_hf(layer, config)
    assert sum(p.numel() for p in block.parameters()) == sum(p.numel() for p in layer.parameters())
    X = torch.randn(2, 8, TINY["hidden_size"])
    with torch.no_grad():
        assert (block(X) - ref.call(layer, config, X, None)).abs().max() <= TOLERANCE
        block.ffn.shared_expert_gate = None  # the mutation: the shared expert added ungated
        assert (block(X) - ref.call(layer, config, X, None)).abs().max() > 100 * TOLERANCE


def test_unsupported_moe_layers_are_refused():
    pytest.importorskip("transformers")
    layer, config = hf_make("qwen3_5_moe", "Qwen3_5MoeDecoderLayer", "Qwen3_5MoeTextConfig",
                            dict(TINY, shared_expert_intermediate_size=24), layer_idx=1)(0)
    with pytest.raises(ValueError, match="shared_expert_intermediate_size"):
        from_qwen3_5_layer(layer, config)
    layer, config = hf_make("qwen3_5_moe", "Qwen3_5MoeDecoderLayer", "Qwen3_5MoeTextConfig",
                            dict(TINY, hidden_act="gelu"), layer_idx=0)(0)
    with pytest.raises(ValueError, match="hidden_act"):
        from_qwen3_5_layer(layer, config)


# --------------------------------------------------------------------------- MixtureOfExperts(shared_expert_gate=...)


def test_shared_expert_gate_is_a_sigmoid_on_the_shared_expert():
    torch.manual_seed(0)
    moe = MixtureOfExperts(12, 4, top_k=2, ffn_num_hiddens=8, num_shared_experts=1, shared_expert_gate=True)
    assert tuple(moe.shared_expert_gate.weight.shape) == (1, 12) and moe.shared_expert_gate.bias is None
    X = torch.randn(3, 5, 12)
    gate = torch.sigmoid(moe.shared_expert_gate(X))
    shared = moe.shared(X)
    moe.shared_expert_gate, gated = None, moe.shared_expert_gate
    ungated = moe(X)
    moe.shared_expert_gate = gated
    torch.testing.assert_close(moe(X), ungated - shared + gate * shared)
    assert (moe(X) - ungated).abs().max() > 1e-3  # the option changes the output
    assert moe.num_active_parameters() == 12 + 12 * 4 + 2 * 3 * 12 * 8 + 3 * 12 * 8
    assert "shared_expert_gate=True" in repr(moe)


def test_default_has_no_shared_expert_gate():
    moe = MixtureOfExperts(12, 4, num_shared_experts=1)
    assert moe.shared_expert_gate is None and "shared_expert_gate" not in repr(moe)
    assert not any("shared_expert_gate" in name for name, _ in moe.named_parameters())


def test_bad_shared_expert_gate_is_rejected():
    with pytest.raises(ValueError, match="num_shared_experts"):
        MixtureOfExperts(12, 4, shared_expert_gate=True)
    with pytest.raises(TypeError, match="shared_expert_gate"):
        MixtureOfExperts(12, 4, num_shared_experts=1, shared_expert_gate=1)
