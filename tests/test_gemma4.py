"""Gemma 4's layer (Hugging Face ``Gemma4TextDecoderLayer``, transformers 5.24) and the d2lmini options it needs.

Gemma 4 keeps Gemma's sandwich norms (gains ``w``, no longer ``1 + w``) and per-head QK-norm, and adds a
gainless RMSNorm on the values (``value_norm``), logit scale 1, a ``layer_scalar`` multiplying the whole
output, and global layers with their own head width and key/value heads, proportional RoPE
(``rope_scaling={'rope_type': 'proportional', ...}``) and keys reused as values (``k_eq_v``).
``reference.from_gemma4_layer`` builds each layer as a ``TransformerBlock``; the comparison runs the HF layer
with the masks its model builds (``hf_call``). Per-layer inputs, the MoE block and key/value sharing are refused.
"""

from __future__ import annotations

import pytest
import torch

from conftest import mutated
from d2lmini import TransformerBlock
from d2lmini.attention import MultiHeadAttention, rope_frequencies
from d2lmini.reference.gemma import GemmaAttention
from d2lmini.reference import (
    HF_CONVERTERS,
    TOLERANCE,
    Reference,
    compare_with_reference,
    from_gemma4_layer,
    hf_reference,
    tiny_config,
)


def _reference(layer_idx: int, scalar: bool = True, **overrides) -> Reference:
    pytest.importorskip("transformers")
    ref = hf_reference("Gemma 4", "gemma4", "Gemma4TextDecoderLayer", "Gemma4TextConfig",
                       tiny_config("gemma4", **overrides), layer_idx=layer_idx)
    if not scalar:
        return ref

    def make(seed):  # the layer_scalar buffer is not a parameter: give it a value of its own
        layer, config = ref.make(seed)
        layer.layer_scalar.fill_(0.6 + 0.1 * seed)
        return layer, config
    return Reference(ref.name, ref.model, make, ref.convert, ref.call, ref.causal)


def _worst(result) -> float:
    return max(result["max_abs_diff"], result["max_abs_grad_diff"])


def test_registered_in_from_hf():
    assert HF_CONVERTERS["Gemma4TextDecoderLayer"] is from_gemma4_layer


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("layer_idx", [0, 1], ids=["sliding", "full"])
def test_local_and_global_layers_match_hugging_face(layer_idx, padded):
    result = compare_with_reference(_reference(layer_idx), padded=padded)
    assert _worst(result) <= TOLERANCE, result
    assert result["max_abs_output"] > 0.1
    block = result["block"]
    att = block.attention
    assert block.layer_scalar == pytest.approx(0.6) and att.value_norm and att.logit_scale == 1.0
    if layer_idx == 0:
        assert (att.window, att.head_dim, att.num_kv_heads, att.k_eq_v, att.rope_scaling) == (5, 8, 2, False, None)
    else:
        assert (att.window, att.head_dim, att.num_kv_heads, att.k_eq_v, att.W_v) == (None, 16, 1, True, None)
        assert att.rope_scaling == {"rope_type": "proportional", "partial_rotary_factor": 0.25}


@pytest.mark.parametrize("layer_idx, overrides", [
    (1, dict(attention_k_eq_v=False)),
    (0, dict(attention_bias=True)),
    (1, dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                              "full_attention": {"rope_type": "proportional", "rope_theta": 1000.0,
                                                 "partial_rotary_factor": 0.5, "factor": 2.0}})),
    (0, dict(sliding_window=3, hidden_activation="gelu_pytorch_tanh")),
], ids=["global without k_eq_v", "attention bias", "proportional 0.5, factor 2", "window 3"])
def test_variants_match_hugging_face(layer_idx, overrides):
    result = compare_with_reference(_reference(layer_idx, **overrides), padded=True)
    assert _worst(result) <= TOLERANCE, result


@pytest.mark.parametrize("layer_idx, mutate", [
    (0, lambda block: setattr(block.attention, "value_norm", False)),
    (1, lambda block: setattr(block, "layer_scalar", 1.0)),
    (1, lambda block: setattr(block.attention, "rope_scaling", None)),
    (1, lambda block: block.attention.rope_scaling.update(partial_rotary_factor=0.5)),
    (0, lambda block: setattr(block.attention, "window", None)),
    (1, lambda block: setattr(block.attention, "scale", 0.25)),
], ids=["no value norm", "no layer scalar", "plain RoPE", "other proportion", "no window", "scale"])
def test_each_reproduced_feature_matters(layer_idx, mutate):
    result = compare_with_reference(mutated(_reference(layer_idx), mutate), padded=True)
    assert _worst(result) > 1e-3, result


@pytest.mark.parametrize("overrides, message", [
    (dict(hidden_size_per_layer_input=8), "per-layer inputs"),
    (dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=8), "mixture-of-experts"),
])
def test_refuses_what_it_does_not_reproduce(overrides, message):
    layer, config = _reference(1, scalar=False, **overrides).make(0)
    with pytest.raises(ValueError, match=message):
        from_gemma4_layer(layer, config)


def test_refuses_a_kv_shared_layer():
    layer, config = _reference(3, scalar=False, num_kv_shared_layers=2).make(0)
    with pytest.raises(ValueError, match="reuses the keys and values"):
        from_gemma4_layer(layer, config)


def test_proportional_frequencies():
    plain, _ = rope_frequencies(16, 100.0)
    freq, factor = rope_frequencies(16, 100.0, {"rope_type": "proportional", "partial_rotary_factor": 0.25})
    assert factor == 1.0 and torch.equal(freq[:2], plain[:2]) and not freq[2:].any()
    freq, _ = rope_frequencies(16, 100.0, {"rope_type": "proportional", "factor": 4.0})
    torch.testing.assert_close(freq, plain / 4)


def test_bad_values_are_rejected():
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        rope_frequencies(16, 100.0, {"rope_type": "proportional", "partial_rotary_factor": 1.5})
    with pytest.raises(ValueError, match="factor"):
        rope_frequencies(16, 100.0, {"rope_type": "proportional", "factor": 0.5})
    # Under 'proportional' the factor says which frequencies are zero, not which features turn.
    proportional = MultiHeadAttention(32, 2, rope_theta=10.0,
                                      rope_scaling={"rope_type": "proportional", "partial_rotary_factor": 0.5})
    assert proportional.rotary_dim is None and proportional.rope_scaling["partial_rotary_factor"] == 0.5
    with pytest.raises(TypeError, match="value_norm"):
        GemmaAttention(32, 2, value_norm="yes")
    with pytest.raises(TypeError, match="k_eq_v"):
        GemmaAttention(32, 2, k_eq_v=1)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="layer_scalar"):
            TransformerBlock(32, 2).set_scales(layer_scalar=bad)
    with pytest.raises(TypeError, match="unknown argument.*k_eq_v"):  # Gemma's own: GemmaAttention
        TransformerBlock(32, 2, k_eq_v=True)


def test_defaults_change_nothing_and_options_change_the_output():
    torch.manual_seed(0)
    X = torch.randn(2, 6, 32)
    base = TransformerBlock(32, 4, causal=True, rope_theta=10.0)
    gemma = dict(attn_factory=lambda: GemmaAttention(32, 4, causal=True, rope_theta=10.0, value_norm=True))
    for kwargs in (gemma, dict(layer_scalar=0.5),
                   dict(causal=True, rope_theta=10.0, rope_scaling={"rope_type": "proportional", "partial_rotary_factor": 0.5})):
        scales = {"layer_scalar": kwargs.pop("layer_scalar")} if "layer_scalar" in kwargs else {}
        other = TransformerBlock(32, 4, **(kwargs or dict(causal=True, rope_theta=10.0))).set_scales(**scales)
        other.load_state_dict(base.state_dict())
        assert not torch.allclose(base(X), other(X), atol=1e-4), kwargs
    keqv = TransformerBlock(32, 4, attn_factory=lambda: GemmaAttention(32, 4, causal=True, k_eq_v=True))
    assert keqv.attention.W_v is None and "W_v" not in dict(keqv.attention.named_children())
    with torch.no_grad():  # keys as values: equal to a block whose W_v is W_k
        ref = TransformerBlock(32, 4, causal=True)
        ref.load_state_dict(keqv.state_dict(), strict=False)
        ref.attention.W_v.weight.copy_(keqv.attention.W_k.weight)
    torch.testing.assert_close(keqv(X), ref(X))
