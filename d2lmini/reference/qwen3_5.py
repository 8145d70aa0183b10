"""Qwen3.5: the pre-norm block with two token mixers, gated attention and a Gated DeltaNet, dense or MoE.

Relative to :func:`~d2lmini.reference.llama.from_qwen3_layer`: three of every four layers replace
attention by a Gated DeltaNet (:class:`~d2lmini.deltanet.GatedDeltaNet`, linear attention with a
fixed-size state); the others gate their attention output (Qiu et al., 2025) and rotate only part
of each head; RMSNorm gains are stored as ``w`` in ``1 + w``; the MoE models route over softmax
experts plus a sigmoid-gated shared expert.
"""

from __future__ import annotations

from torch import nn

from .._checks import check_instance
from ..attention import GatedAttention
from ..block import TransformerBlock
from ..deltanet import GatedDeltaNet
from ..moe import MixtureOfExperts
from .base import (converter, copy_gated_mlp, copy_linear, copy_norm, layer_type_of, rope_kwargs,
                   set_qk_norm_eps, start_conversion)
from .base import Row2026


def from_qwen3_5_gated_deltanet(layer) -> GatedDeltaNet:
    """A :class:`GatedDeltaNet` with the sizes and weights of a HF ``Qwen3_5GatedDeltaNet``.

    Args:
        layer: a ``Qwen3_5GatedDeltaNet`` (``transformers`` 5.24, ``models/qwen3_5``), e.g.
            ``model.model.layers[0].linear_attn`` of a Qwen3.5 model; any module with its
            attributes and parameter names works (Qwen3-Next's interleaved ``in_proj_qkvz`` does not).

    Returns:
        the converted module in ``layer``'s dtype and device, in eval mode.

    Raises:
        TypeError: if ``layer`` is not an ``nn.Module`` or lacks the separate projections.
    """
    check_instance("layer", layer, nn.Module, "an nn.Module (a Qwen3_5GatedDeltaNet)")
    if not hasattr(layer, "in_proj_qkv"):
        raise TypeError(f"layer must be a Qwen3_5GatedDeltaNet (with in_proj_qkv), got {type(layer).__name__}")
    ours = GatedDeltaNet(layer.hidden_size, num_k_heads=layer.num_k_heads, num_v_heads=layer.num_v_heads,
                         head_k_dim=layer.head_k_dim, head_v_dim=layer.head_v_dim,
                         conv_kernel_size=layer.conv_kernel_size, eps=layer.layer_norm_epsilon)
    ref = layer.in_proj_qkv.weight
    ours.to(dtype=ref.dtype, device=ref.device).load_state_dict(layer.state_dict())
    return ours.eval()


def from_qwen3_5_attention(attn, config) -> GatedAttention:
    """A :class:`~d2lmini.attention.GatedAttention` with the weights of Hugging Face ``Qwen3_5Attention``.

    Qwen3.5's ``q_proj`` makes the query and the output gate together: its output, viewed
    as ``(h, 2 * head_dim)``, holds per head ``[q_i, gate_i]``; the rows split into
    ``W_q`` and ``W_gate``. QK-norm is per head with gains stored as ``w`` in ``1 + w``;
    RoPE is partial (``partial_rotary_factor``, half-split); for text the three M-RoPE
    sections read the same positions, so it is plain RoPE.

    Raises:
        ValueError: ``attention_bias=True`` (a gate bias, which ``GatedAttention.W_gate`` lacks).
    """
    if config.attention_bias:
        raise ValueError("Qwen3.5 with attention_bias=True has a gate bias, which GatedAttention.W_gate lacks")
    h, hd, d = config.num_attention_heads, attn.head_dim, config.hidden_size
    ours = GatedAttention(d, h, num_kv_heads=config.num_key_value_heads, head_dim=hd, causal=True,
                          qk_norm="per_head", **rope_kwargs(config, partial=True))
    set_qk_norm_eps(ours.attention, config.rms_norm_eps)
    q_and_gate = attn.q_proj.weight.view(h, 2, hd, d)  # per head: hd query rows, then hd gate rows
    copy_linear(ours.attention.W_q, q_and_gate[:, 0].reshape(h * hd, d))
    copy_linear(ours.W_gate, q_and_gate[:, 1].reshape(h * hd, d))
    copy_linear(ours.attention.W_k, attn.k_proj.weight)
    copy_linear(ours.attention.W_v, attn.v_proj.weight)
    copy_linear(ours.W_o, attn.o_proj.weight)
    copy_norm(ours.attention.q_norm, attn.q_norm, unit_offset=True)
    copy_norm(ours.attention.k_norm, attn.k_norm, unit_offset=True)
    return ours


def _qwen3_5_moe(moe, config) -> MixtureOfExperts:
    """A :class:`~d2lmini.moe.MixtureOfExperts` with the weights of Hugging Face ``Qwen3_5MoeSparseMoeBlock``.

    Raises:
        ValueError: ``shared_expert_intermediate_size`` not a positive multiple of ``moe_intermediate_size``.
    """
    width, shared_width = config.moe_intermediate_size, config.shared_expert_intermediate_size
    if shared_width <= 0 or shared_width % width:
        raise ValueError(f"Qwen3.5's shared expert is supported with shared_expert_intermediate_size a multiple of "
                         f"moe_intermediate_size={width}, got {shared_width}")
    experts = moe.experts
    ours = MixtureOfExperts(config.hidden_size, config.num_experts, top_k=config.num_experts_per_tok,
                            ffn_num_hiddens=width, act="swiglu", router="softmax",
                            num_shared_experts=shared_width // width, shared_expert_gate=True)
    copy_linear(ours.router, moe.gate.weight)
    for e, ffn in enumerate(ours.experts):
        gate_up = experts.gate_up_proj[e]  # (2I, d): the gate's rows, then the up projection's
        copy_gated_mlp(ffn, gate_up[:width], gate_up[width:], experts.down_proj[e])
    shared = moe.shared_expert
    copy_gated_mlp(ours.shared, shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight)
    copy_linear(ours.shared_expert_gate, moe.shared_expert_gate.weight)
    return ours


@converter("Qwen3_5DecoderLayer", "Qwen3_5MoeDecoderLayer")
def from_qwen3_5_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Qwen3_5DecoderLayer`` or ``Qwen3_5MoeDecoderLayer`` (Qwen3.5, 2026).

    Qwen3.5 alternates two layer types (``config.layer_types``; the default three
    ``'linear_attention'`` layers per ``'full_attention'`` layer). Both are pre-norm
    blocks with Qwen3.5's RMSNorm (gains stored as ``w`` in ``1 + w``) and an FFN: in the
    dense models (``qwen3_5``) a SwiGLU MLP (``gate_proj``, ``up_proj``, ``down_proj``), in
    the MoE models (``qwen3_5_moe``, every layer) ``Qwen3_5MoeSparseMoeBlock``, built as a
    :class:`~d2lmini.moe.MixtureOfExperts` through ``ffn_factory``: a softmax router over
    ``num_experts`` whose ``num_experts_per_tok`` selected probabilities are always
    renormalized (``Qwen3_5MoeTopKRouter``; Qwen3.5 has no ``norm_topk_prob``), SwiGLU
    experts of width ``moe_intermediate_size`` stored as ``gate_up_proj`` ``(E, 2I, d)``
    (gate rows first) and ``down_proj`` ``(E, d, I)``, and one always-on SwiGLU shared
    expert of width ``shared_expert_intermediate_size`` scaled by ``sigmoid(w^T x)``
    (``shared_expert_gate=True``). Only the token mixer differs between the types:

    * ``'full_attention'``: gated attention (:class:`~d2lmini.attention.GatedAttention`,
      Qiu et al., 2025) with GQA, per-head QK-norm and partial RoPE
      (:func:`from_qwen3_5_attention`), through ``attn_factory``;
    * ``'linear_attention'``: a Gated DeltaNet (:class:`~d2lmini.deltanet.GatedDeltaNet`,
      :func:`~d2lmini.reference.qwen3_5.from_qwen3_5_gated_deltanet`), through ``attn_factory``:
      no positions, a fixed-size state instead of a key/value cache.

    Called on ``X`` and ``valid_lens``, the block equals the layer called as
    ``Qwen3_5TextModel`` calls it: a causal mask for the full layers, the 2-D padding
    mask (``create_recurrent_attention_mask``) for the linear ones.

    Args:
        layer, config: a ``Qwen3_5DecoderLayer`` and its ``Qwen3_5TextConfig``, or a
            ``Qwen3_5MoeDecoderLayer`` and its ``Qwen3_5MoeTextConfig``.
        layer_idx: the layer's position in the stack (selects its type); ``None`` (the
            default): the index the layer was built with (:func:`start_conversion`).

    Returns:
        The block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: a layer whose MLP is neither the dense SwiGLU one nor the sparse MoE
            block, a ``shared_expert_intermediate_size`` that is not a multiple of
            ``moe_intermediate_size`` (d2lmini's shared expert is ``num_shared_experts`` expert
            widths), ``attention_bias=True``, an activation other than SiLU, or as :func:`start_conversion`.
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    mlp = layer.mlp
    sparse = hasattr(mlp, "shared_expert_gate")  # Qwen3_5MoeSparseMoeBlock
    if not (sparse or hasattr(mlp, "gate_proj")):
        raise ValueError(f"only Qwen3.5's dense SwiGLU MLP and its sparse MoE block are supported, "
                         f"got a {type(mlp).__name__} MLP")
    if config.hidden_act != "silu":
        raise ValueError(f"Qwen3.5's MLP is supported with hidden_act='silu' only, got {config.hidden_act!r}")
    if layer_type_of(config, layer_idx) == "linear_attention":
        mixer = from_qwen3_5_gated_deltanet(layer.linear_attn).train()
    else:
        mixer = from_qwen3_5_attention(layer.self_attn, config)
    if sparse:
        ffn = _qwen3_5_moe(mlp, config)
        ffn_kwargs = dict(ffn_factory=lambda: ffn)
    else:
        ffn_kwargs = dict(act="swiglu", ffn_num_hiddens=mlp.gate_proj.out_features)
    block = TransformerBlock(config.hidden_size, config.num_attention_heads, norm="rms", placement="pre",
                             eps=config.rms_norm_eps, attn_factory=lambda: mixer, **ffn_kwargs)
    if not sparse:
        copy_gated_mlp(block.ffn, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    copy_norm(block.addnorm1.norm_in, layer.input_layernorm, unit_offset=True)
    copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm, unit_offset=True)
    return block.to(layer.input_layernorm.weight).train(layer.training)


# --------------------------------------------------------------------------- the family's tiny configurations

# A tiny Qwen3.5: layer 0 a Gated DeltaNet layer, layer 1 a gated-attention layer (GQA 4/2, partial RoPE).
_TINY_BASE = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=80,
                num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], rms_norm_eps=1e-5,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
                linear_conv_kernel_dim=4, max_position_embeddings=64, vocab_size=16,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    "qwen3_5": _TINY_BASE,
    # The same shapes with Qwen3.5's MoE FFN in every layer (Qwen3_5MoeSparseMoeBlock): 8 experts of width 16,
    # top-2, and a shared expert of width 32 behind its sigmoid gate.
    "qwen3_5_moe": dict({k: v for k, v in _TINY_BASE.items() if k != "intermediate_size"}, moe_intermediate_size=16,
                        shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2),
}


# --------------------------------------------------------------------------- the family's rows


def verify_qwen3_5(seed: int) -> list[dict]:
    """Qwen3.5's decoder layers (0: Gated DeltaNet, 1: gated attention) of the dense and the MoE
    model, tiny configurations, against their conversions: four comparison results."""
    from .harness import compare_with_reference, hf_reference
    from .tiny import tiny_config

    return [compare_with_reference(hf_reference("Qwen3.5", model_type, f"{prefix}DecoderLayer", f"{prefix}TextConfig",
                                                tiny_config(model_type), layer_idx=i, unit_offset_norms=True,
                                                rotary=f"{prefix}TextRotaryEmbedding"), seed=seed)
            for model_type, prefix in (("qwen3_5", "Qwen3_5"), ("qwen3_5_moe", "Qwen3_5Moe"))
            for i in (0, 1)]


#: The family's models in the zoo's 2026 table (:class:`~d2lmini.reference.base.Row2026`).
ROWS_2026 = (
    Row2026("Qwen3.5", 2026, "", "Qwen3_5MoeTextConfig",
            dict(norm="RMSNorm (1 + w), pre", qk_norm="QK-norm per head", gate=True, router="softmax"),
            "Qwen3.5-35B-A3B", class_default_cells={"positions": "class default; the released models use a larger base"},
            check="Qwen3.5 (both layer types, dense and MoE)",
            verify=verify_qwen3_5),
)
