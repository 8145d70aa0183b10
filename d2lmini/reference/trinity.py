"""Arcee Trinity (``AfmoeDecoderLayer``): the Gemma-style sandwich with gated attention, NoPE global layers and a mixture of experts.

Relative to the sandwich of :mod:`d2lmini.reference.gemma`: gains stored as ``w``, the attention
output gated per feature by ``sigmoid(W_gate x)`` (:class:`~d2lmini.attention.GatedAttention`),
global layers without any position encoding, local layers with RoPE and a window, and after the
first dense layers a sigmoid-routed mixture of SwiGLU experts with a shared expert.
"""

from __future__ import annotations

from ..attention import GatedAttention
from ..block import TransformerBlock
from ..ffn import FeedForward
from ..moe import MixtureOfExperts
from .base import (converter, copy_attention, copy_gated_mlp, copy_linear, copy_norm, copy_weight, gated_act,
                   layer_type_of, rope_kwargs, set_qk_norm_eps, start_conversion, window_of)
from .base import LayerRow, Row2026
from .tiny import TINY, WINDOW


@converter("AfmoeDecoderLayer")
def from_afmoe_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``AfmoeDecoderLayer`` (Arcee Trinity, 2025).

    ``AfmoeDecoderLayer`` is the ``transformers`` layer of Arcee's Trinity models
    (Singh et al., 2026): sandwich placement with RMSNorm, QK-norm per head (one gain
    shared by the heads), grouped-query attention gated by ``sigmoid(W_gate x)``
    (:class:`~d2lmini.attention.GatedAttention`), and -- after the first
    ``num_dense_layers`` layers -- a mixture of SwiGLU experts with sigmoid routing, an
    expert bias used only for selection, and an always-on shared expert
    (:class:`~d2lmini.moe.MixtureOfExperts`). Layers alternate by
    ``config.layer_types``: a global (``'full_attention'``) layer applies no position
    encoding at all, a local (``'sliding_attention'``) layer applies RoPE (the model's one
    ``rope_parameters``, :func:`rope_kwargs`) and ``window=config.sliding_window``
    (``AfmoeAttention.is_local_attention``; ``AfmoeModel`` builds the sliding-window mask
    for those layers). ``mup_enabled`` scales the embeddings, outside the layers.

    Args:
        layer: an ``AfmoeDecoderLayer``; its weights are copied, not shared.
        config: the layer's ``AfmoeConfig``.
        layer_idx: the layer's position in the stack (selects global or local); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`start_conversion`).

    Returns:
        A block on the layer's device and dtype, in the layer's train/eval mode.

    Raises:
        ValueError: for a ``layer_idx`` outside ``config.layer_types``, a RoPE type d2lmini does
            not reproduce (local layers), or an activation other than SiLU.

    Introduced in the appendix "The block zoo".
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    attn = layer.self_attn
    local = layer_type_of(config, layer_idx) == "sliding_attention"  # RoPE, window: AfmoeAttention.is_local_attention
    if gated_act(config.hidden_act) != "swiglu":
        raise ValueError(f"AFMoE's MLPs are supported with hidden_act='silu' only, got {config.hidden_act!r}")
    d, h, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    bias = bool(getattr(config, "attention_bias", False))
    local_kwargs = dict(window=window_of(config, layer_idx), **rope_kwargs(config)) if local else {}

    def attention():
        gated = GatedAttention(d, h, num_kv_heads=kv, head_dim=attn.head_dim, causal=True, qk_norm="per_head",
                               bias=bias, **local_kwargs)
        gated.attention.scale = float(attn.scaling)
        set_qk_norm_eps(gated.attention, config.rms_norm_eps)
        return gated

    if layer.moe_enabled:
        def ffn():
            return MixtureOfExperts(d, config.num_experts, top_k=config.num_experts_per_tok,
                                    ffn_num_hiddens=config.moe_intermediate_size, act="swiglu", router="sigmoid",
                                    num_shared_experts=config.num_shared_experts,
                                    route_scale=float(config.route_scale))
    else:
        def ffn():
            return FeedForward(d, config.intermediate_size, act="swiglu")
    block = TransformerBlock(d, h, norm="rms", placement="sandwich", eps=config.rms_norm_eps,
                             attn_factory=attention, ffn_factory=ffn)
    ours = block.attention
    copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    copy_linear(ours.W_gate, attn.gate_proj.weight, attn.gate_proj.bias, name="W_gate")
    copy_norm(ours.attention.q_norm, attn.q_norm)
    copy_norm(ours.attention.k_norm, attn.k_norm)
    for mine, theirs in ((block.addnorm1.norm_in, layer.input_layernorm),
                         (block.addnorm1.norm_out, layer.post_attention_layernorm),
                         (block.addnorm2.norm_in, layer.pre_mlp_layernorm),
                         (block.addnorm2.norm_out, layer.post_mlp_layernorm)):
        copy_norm(mine, theirs)
    mlp = layer.mlp
    if layer.moe_enabled:
        copy_linear(block.ffn.router, mlp.router.gate.weight)
        copy_weight(block.ffn.expert_bias, mlp.expert_bias)
        for e, expert in enumerate(block.ffn.experts):
            gate, up = mlp.experts.gate_up_proj[e].chunk(2, dim=0)  # (2 * hidden, d): gate rows, then up rows
            copy_gated_mlp(expert, gate, up, mlp.experts.down_proj[e])
        shared = mlp.shared_experts
        copy_gated_mlp(block.ffn.shared, shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight)
    else:
        copy_gated_mlp(block.ffn, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    return block.to(layer.input_layernorm.weight).train(layer.training)


# --------------------------------------------------------------------------- the family's tiny configurations

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    # Arcee Trinity: a local (sliding-window, RoPE) and a global (no positions) layer, both with the MoE FFN.
    "afmoe": dict(TINY, head_dim=32, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                  num_shared_experts=1, num_dense_layers=0, num_hidden_layers=2, sliding_window=WINDOW,
                  layer_types=["sliding_attention", "full_attention"]),
    # one global layer of the same shapes (the chapter "The 2026 block")
    "afmoe_global": dict(TINY, head_dim=32, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                         num_shared_experts=1, num_dense_layers=0, num_hidden_layers=1,
                         layer_types=["full_attention"]),
}


# --------------------------------------------------------------------------- the family's rows

_NOTE = "gated attention, MoE FFN (sigmoid router, shared expert)"

#: The layers of the family the zoo reproduces (:class:`~d2lmini.reference.base.LayerRow`).
ROWS = (
    LayerRow("Arcee Trinity (local)", "Arcee", 2025, "AfmoeDecoderLayer", "afmoe", "AfmoeConfig", "afmoe",
             layer_idx=0, note=_NOTE),
    LayerRow("Arcee Trinity (global)", "Arcee", 2025, "AfmoeDecoderLayer", "afmoe", "AfmoeConfig", "afmoe",
             layer_idx=1, note=_NOTE + "; no position encoding in global layers"),
)

#: The family's models in the zoo's 2026 table (:class:`~d2lmini.reference.base.Row2026`). ``size`` is
#: ``None``: the class defaults have 16 K/V heads and 64 experts, every released Trinity GQA and more experts.
ROWS_2026 = (
    Row2026("Arcee Trinity", 2025, "singh2026trinity", "AfmoeConfig",
            dict(norm="RMSNorm, sandwich", qk_norm="QK-norm per head", gate=True, nope="full-attention layers",
                 router="sigmoid"), None, check="Arcee Trinity",
            zoo_rows=("Arcee Trinity (local)", "Arcee Trinity (global)")),
)
