"""GatedAttention against Hugging Face Qwen3.5's gated attention (``Qwen3_5Attention``, transformers 5.24).

Qwen3.5's ``q_proj`` makes the query and the gate together: its output, viewed as
``(h, 2 * head_dim)``, holds per head ``[q_i, gate_i]``; the gate multiplies the heads'
output element-wise through a sigmoid before ``o_proj``. QK-norm is per head with
Qwen3.5's zero-centred RMSNorm (``x_hat * (1 + w)``), RoPE is partial
(``partial_rotary_factor`` 0.25, half-split), and for text the three M-RoPE sections
read the same positions, so it is plain RoPE. d2lmini's
:class:`~d2lmini.attention.GatedAttention` expresses all of it: the rows of ``q_proj``
split into ``W_q`` and ``W_gate``, the gains ``w`` become ``1 + w`` (the converter is
``d2lmini.reference.from_qwen3_5_layer``; ``tests/test_qwen3_5_layer.py`` checks both layer types).
"""

from __future__ import annotations

import pytest
import torch

from d2lmini import GatedAttention
from d2lmini.chapters.ch11_beyond_softmax import compare_with_hf
from d2lmini.reference import from_qwen3_5_attention, from_qwen3_5_layer, hf_call, hf_make

TOLERANCE = 1e-5  # max |Δ| in float32

#: A tiny Qwen3.5 text model with one full-attention layer: GQA 4/2, head_dim 16, rotary_dim 4.
TINY_QWEN3_5 = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=80, num_hidden_layers=1, layer_types=["full_attention"], rms_norm_eps=1e-5,
                    max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                 "partial_rotary_factor": 0.25})


def _qwen3_5(layer_class: str, seed: int = 0, **overrides):
    """A tiny random HF Qwen3.5 ``layer_class`` (norm gains stored as ``w`` in ``1 + w``) and its config."""
    pytest.importorskip("transformers")
    return hf_make("qwen3_5", layer_class, "Qwen3_5TextConfig", dict(TINY_QWEN3_5, **overrides),
                   unit_offset_norms=True)(seed)


def _from_qwen3_5_attention(attn, config) -> GatedAttention:
    """The GatedAttention of ``reference.from_qwen3_5_layer`` for a full-attention layer, in eval mode."""
    return from_qwen3_5_attention(attn, config).eval()


def _compare(layer, config, ours, layer_class: str, valid_lens, num_steps: int = 16, seed: int = 0) -> dict:
    """Max |Δ| of outputs (at real tokens) and input gradients, HF layer vs ours, on a (2, n, d) batch."""
    call = hf_call("qwen3_5", layer_class, rotary="Qwen3_5TextRotaryEmbedding")

    def run_ours(Z):
        return ours(Z, Z, Z, valid_lens) if isinstance(ours, GatedAttention) else ours(Z, valid_lens)

    return compare_with_hf(lambda Z: call(layer, config, Z, valid_lens), run_ours, config.hidden_size, valid_lens,
                           num_steps=num_steps, seed=seed)


FULL_ROPE_MHA = {"num_key_value_heads": 4,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1.0}}


@pytest.mark.parametrize("valid_lens", [None, torch.tensor([16, 11])], ids=["unpadded", "padded"])
@pytest.mark.parametrize("overrides", [{}, FULL_ROPE_MHA], ids=["gqa, partial rope", "mha, full rope"])
def test_gated_attention_matches_qwen3_5_attention(overrides, valid_lens):
    attn, config = _qwen3_5("Qwen3_5Attention", **overrides)
    ours = _from_qwen3_5_attention(attn, config)
    rotary_dim = ours.attention.rotary_dim
    assert rotary_dim == (4 if not overrides else None)
    result = _compare(attn, config, ours, "Qwen3_5Attention", valid_lens)
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE, result
    assert result["max_abs_output"] > 0.1


def test_qwen3_5_full_attention_layer_is_a_pre_norm_block_with_gated_attention():
    layer, config = _qwen3_5("Qwen3_5DecoderLayer")
    block = from_qwen3_5_layer(layer, config)
    assert sum(p.numel() for p in block.parameters()) == sum(p.numel() for p in layer.parameters())
    assert len(list(block.parameters())) == len(list(layer.parameters())) + 1  # q_proj is W_q and W_gate
    result = _compare(layer, config, block, "Qwen3_5DecoderLayer", torch.tensor([16, 9]))
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE, result


@pytest.mark.parametrize("break_it", ["q and gate halves swapped", "gains not offset", "no gate"])
def test_the_check_catches_a_wrong_conversion(break_it):
    attn, config = _qwen3_5("Qwen3_5Attention")
    ours = _from_qwen3_5_attention(attn, config)
    with torch.no_grad():
        if break_it == "q and gate halves swapped":
            W_q = ours.attention.W_q.weight.clone()
            ours.attention.W_q.weight.copy_(ours.W_gate.weight)
            ours.W_gate.weight.copy_(W_q)
        elif break_it == "gains not offset":
            ours.attention.q_norm.weight.sub_(1.0)
            ours.attention.k_norm.weight.sub_(1.0)
        else:  # a gate of sigmoid(large) = 1: plain attention
            ours.W_gate.weight.zero_()
            ours.W_gate.bias = torch.nn.Parameter(torch.full((ours.W_gate.out_features,), 30.0))
    result = _compare(attn, config, ours, "Qwen3_5Attention", None)
    assert result["max_abs_diff"] > 100 * TOLERANCE


def test_gate_bias_is_refused():
    attn, config = _qwen3_5("Qwen3_5Attention", attention_bias=True)
    with pytest.raises(ValueError, match="gate bias"):
        _from_qwen3_5_attention(attn, config)
