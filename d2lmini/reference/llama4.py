"""Llama 4: the Llama block with interleaved-RoPE chunked layers, NoPE full layers and a sigmoid-gated mixture.

Relative to :func:`~d2lmini.reference.llama.from_llama_layer`: RoPE in the interleaved layout
(rows of ``W_q`` and ``W_k`` permuted) with a gainless L2 QK-norm after it, chunked attention on
the RoPE layers, NoPE layers with temperature-tuned queries, and on the MoE layers one routed
expert whose input the router's sigmoid scales, plus a shared expert.
"""

from __future__ import annotations

import torch

from .._checks import check_positive_float, check_positive_int
from ..attention import attention_mask
from ..block import TransformerBlock
from ..ffn import FeedForward
from ..moe import MixtureOfExperts
from ..norms import unweighted_rms_norm
from .base import (converter, copy_attention, copy_gated_mlp, copy_linear, copy_norm, gated_act, layer_type_of,
                   rope_kwargs, start_conversion)
from .base import Row2026
from .llama import LlamaVariantAttention


class Llama4Attention(LlamaVariantAttention):
    """Llama 4's attention: :class:`~d2lmini.reference.llama.LlamaVariantAttention` with chunks and an L2 QK-norm.

    Args:
        num_hiddens, num_heads, ``**kwargs``: as :class:`~d2lmini.reference.llama.LlamaVariantAttention`
            (``query_scaling=(attn_scale, floor_scale, 1)``: the temperature tuning of the NoPE layers).
        chunk: ``None`` or an int ``C >= 1``: chunked attention, query ``i`` sees only keys ``j <= i`` of
            its own chunk, ``floor(j / C) == floor(i / C)`` -- the ``'chunked_attention'`` layers
            (``Llama4TextConfig.attention_chunk_size``; ``transformers`` 5.24 ``masking_utils.chunked_overlay``,
            and-ed with the causal mask, chunks counted from position 0). Needs ``causal=True``. One more
            term of the boolean mask (:func:`~d2lmini.attention.attention_mask`); with ``valid_lens`` a
            padded query whose chunk holds no real key attends to itself.
        l2_norm_eps: ``None`` or a float ``eps > 0``: each query and key head divided by its root mean
            square, without a gain, *after* RoPE, in float32 (``Llama4TextL2Norm``, eps ``rms_norm_eps``,
            applied after ``apply_rotary_emb`` on the RoPE layers with ``use_qk_norm``). Excludes
            ``qk_norm`` and ``query_scaling`` (Llama 4 uses it on its RoPE layers, the query scaling on
            its NoPE layers).

    Raises:
        ValueError / TypeError: as :class:`~d2lmini.reference.llama.LlamaVariantAttention`, ``chunk`` below 1
            or without ``causal=True``, ``l2_norm_eps`` not a float > 0 or given with ``qk_norm`` or ``query_scaling``.
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, chunk: int | None = None,
                 l2_norm_eps: float | None = None, **kwargs):
        super().__init__(num_hiddens, num_heads, **kwargs)
        self.chunk = None if chunk is None else check_positive_int("chunk", chunk)
        if self.chunk is not None and not self.causal:
            raise ValueError(f"chunk={chunk} needs causal=True (chunked attention is causal: query i sees keys "
                             "j <= i of its own chunk); pass causal=True or chunk=None")
        self.l2_norm_eps = None if l2_norm_eps is None else check_positive_float("l2_norm_eps", l2_norm_eps)
        if self.l2_norm_eps is not None and (self.qk_norm is not None or self.query_scaling is not None):
            raise ValueError("l2_norm_eps (Llama 4's RoPE layers) excludes qk_norm and query_scaling (its NoPE layers')")

    def queries_and_keys(self, queries: torch.Tensor, keys: torch.Tensor, start: int = 0):
        """As :meth:`LlamaVariantAttention.queries_and_keys`, then (with ``l2_norm_eps``) the gainless norm per head."""
        q, k = super().queries_and_keys(queries, keys, start)
        if self.l2_norm_eps is not None:
            q = unweighted_rms_norm(q, self.l2_norm_eps, rounding="float32")
            k = unweighted_rms_norm(k, self.l2_norm_eps, rounding="float32")
        return q, k

    def mask(self, valid_lens, batch_size: int, num_queries: int, num_keys: int, device, start: int = 0):
        """The mask of :func:`~d2lmini.attention.attention_mask` with ``causal``, ``window`` and ``chunk``."""
        return attention_mask(valid_lens, batch_size, num_queries, num_keys, device, causal=self.causal,
                              window=self.window, chunk=self.chunk, start=start)

    def extra_repr(self) -> str:
        return (super().extra_repr() + (f", chunk={self.chunk}" if self.chunk is not None else "")
                + (f", l2_norm_eps={self.l2_norm_eps}" if self.l2_norm_eps is not None else ""))


@converter("Llama4TextDecoderLayer")
def from_llama4_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Llama4TextDecoderLayer`` (Llama 4, 2025), every kind.

    Pre-norm RMSNorm (``rms_norm_eps``), grouped-query attention with ``attention_bias`` on
    all four projections and the scale ``1/sqrt(head_dim)``, then a dense SwiGLU MLP of width
    ``intermediate_size_mlp`` or, on the layers of ``config.moe_layers``, Llama 4's mixture
    (``Llama4TextMoe``): ``num_local_experts`` SwiGLU experts of width ``intermediate_size``,
    the top ``num_experts_per_tok`` logits (one) choose, the sigmoid of each chosen logit
    scales that expert's *input* (``router='sigmoid_input'`` of
    :class:`~d2lmini.moe.MixtureOfExperts`), plus one always-on shared expert of the same width.
    The attention has two kinds, chosen by ``layer_idx``:

    * RoPE layers (``config.no_rope_layers[layer_idx] == 1``): RoPE in Llama 4's *interleaved*
      layout (``apply_rotary_emb`` multiplies the feature pairs ``(2l, 2l + 1)``, as complex
      numbers, by ``freqs_cis``), reproduced by permuting the rows of ``W_q`` and ``W_k``
      (:func:`rope_interleaved_to_half`), base and scaling read by :func:`rope_kwargs`; and,
      with ``use_qk_norm``, the gainless ``Llama4TextL2Norm`` on each query and key head
      *after* RoPE (:class:`Llama4Attention`'s ``l2_norm_eps=rms_norm_eps``).
    * NoPE layers (``no_rope_layers[layer_idx] == 0``): no positions, no QK-norm and, with
      ``attn_temperature_tuning``, the query at position ``p`` times
      ``1 + attn_scale * log(1 + floor((p + 1) / floor_scale))``
      (``query_scaling=(attn_scale, floor_scale, 1)``).

    The mask follows ``config.layer_types`` (by default chunked exactly on the RoPE layers):
    ``'chunked_attention'`` is ``chunk=config.attention_chunk_size`` (query ``i`` sees keys
    ``j <= i`` of its own chunk, ``masking_utils.create_chunked_causal_mask``), else full
    causal attention.

    Args:
        layer, config: a ``Llama4TextDecoderLayer`` and its ``Llama4TextConfig``.
        layer_idx: the layer's position in the stack (selects its kind); ``None`` (the
            default): the index the layer was built with; a given one must equal it (:func:`start_conversion`).

    Returns:
        The pre-norm causal block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: a ``layer_idx`` outside ``config.no_rope_layers`` or ``config.layer_types``,
            a ``floor_scale`` below 1 (``query_scaling``'s period), a RoPE type d2lmini does not reproduce,
            an activation other than SiLU (or tanh GELU), or as :func:`start_conversion`.

    Introduced in the chapter "The 2026 block".
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    attn, mlp = layer.self_attn, layer.feed_forward
    if not 0 <= layer_idx < len(config.no_rope_layers):
        raise ValueError(f"layer_idx={layer_idx} is outside config.no_rope_layers "
                         f"(length {len(config.no_rope_layers)})")
    use_rope = bool(config.no_rope_layers[layer_idx])
    d, h, hd = config.hidden_size, config.num_attention_heads, attn.head_dim
    act = gated_act(config.hidden_act)
    chunk = config.attention_chunk_size if layer_type_of(config, layer_idx) == "chunked_attention" else None
    attention = {"l2_norm_eps": config.rms_norm_eps if use_rope and config.use_qk_norm else None}
    if use_rope:
        attention.update(rope_kwargs(config))
    elif config.attn_temperature_tuning and config.attn_scale:
        attention["query_scaling"] = (float(config.attn_scale), config.floor_scale, 1)
    if layer.is_moe_layer:
        def ffn():
            return MixtureOfExperts(d, config.num_local_experts, top_k=config.num_experts_per_tok,
                                    ffn_num_hiddens=config.intermediate_size, act=act, router="sigmoid_input",
                                    num_shared_experts=1)
    else:
        def ffn():
            return FeedForward(d, config.intermediate_size_mlp, act=act, bias=False)
    block = TransformerBlock(d, h, norm="rms", placement="pre", eps=config.rms_norm_eps, ffn_factory=ffn,
                             attn_factory=lambda: Llama4Attention(d, h, bias=bool(config.attention_bias), causal=True,
                                                                  num_kv_heads=config.num_key_value_heads, head_dim=hd,
                                                                  chunk=chunk, **attention))
    copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, interleaved=hd if use_rope else None)
    copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    if layer.is_moe_layer:
        experts, width = mlp.experts, config.intermediate_size
        copy_linear(block.ffn.router, mlp.router.weight, mlp.router.bias, name="the router")
        for e, expert in enumerate(block.ffn.experts):
            gate_up = experts.gate_up_proj[e]  # (d, 2 * width), laid out (in, out): gate columns, then up
            copy_gated_mlp(expert, gate_up[:, :width].t(), gate_up[:, width:].t(), experts.down_proj[e].t())
        shared = mlp.shared_expert
        copy_gated_mlp(block.ffn.shared, shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight)
    else:
        copy_gated_mlp(block.ffn, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    return block.to(layer.input_layernorm.weight).train(layer.training)


# --------------------------------------------------------------------------- the family's tiny configurations

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    # Llama 4 with each of its four layer kinds: 0 RoPE (chunked, L2 QK-norm) + dense MLP, 1 NoPE (full, temperature
    # tuning) + MoE, 2 RoPE + MoE, 3 NoPE + dense. Chunks of 5 and floor_scale 3 so that both vary within the
    # 16-step test sequence.
    "llama4": dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=24,
                   intermediate_size_mlp=40, num_local_experts=4, num_experts_per_tok=1, num_hidden_layers=4,
                   no_rope_layers=[1, 0, 1, 0], moe_layers=[1, 2], attention_chunk_size=5, floor_scale=3,
                   attn_scale=0.5, rms_norm_eps=1e-5, max_position_embeddings=64, vocab_size=16,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}


# --------------------------------------------------------------------------- the family's rows


def verify_llama4(seed: int) -> list[dict]:
    """Llama 4's first four decoder layers (RoPE and NoPE, dense and MoE) of a tiny configuration
    against their conversions: four comparison results."""
    from .harness import compare_with_reference, hf_reference
    from .tiny import tiny_config

    return [compare_with_reference(hf_reference(f"Llama 4 (layer {i})", "llama4", "Llama4TextDecoderLayer",
                                                "Llama4TextConfig", tiny_config("llama4"), layer_idx=i), seed=seed)
            for i in range(4)]


#: The family's models in the zoo's 2026 table (:class:`~d2lmini.reference.base.Row2026`).
ROWS_2026 = (
    Row2026("Llama 4", 2025, "", "Llama4TextConfig",
            dict(norm="RMSNorm, pre",
                 qk_norm="QK-norm per head: RMSNorm without gain, after RoPE (RoPE layers only)", shared_experts=1,
                 router="sigmoid"), "Llama 4 Scout 17B-16E", check="Llama 4 (RoPE and NoPE layers, dense and MoE)",
            verify=verify_llama4),
)
