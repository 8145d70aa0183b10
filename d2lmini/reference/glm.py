"""GLM-5 (``GlmMoeDsaDecoderLayer``): the DeepSeek-V3 layer whose latent attention attends only to the keys an indexer selects.

Relative to :func:`~d2lmini.reference.deepseek.from_deepseek_v3_layer`: always-interleaved RoPE,
and DeepSeek Sparse Attention -- a small indexer (:class:`~d2lmini.mla.DSAIndexer`) picks
``index_topk`` keys per query and the attention masks the rest.
"""

from __future__ import annotations

from ..block import TransformerBlock
from ..mla import DSAIndexer, MultiHeadLatentAttention
from .base import converter, copy_linear, copy_weight, rope_interleaved_to_half, start_conversion
from .base import Row2026
from .deepseek import TINY_CONFIGS as _DEEPSEEK_TINY
from .deepseek import mla_decoder_block, mla_from_hf
from .harness import hf_call


def from_glm_moe_dsa_attention(attn, config) -> MultiHeadLatentAttention:
    """A :class:`MultiHeadLatentAttention` with a :class:`DSAIndexer` equal to Hugging Face ``GlmMoeDsaAttention``.

    GLM-5's attention (``transformers`` 5.24, ``models/glm_moe_dsa/modeling_glm_moe_dsa.py``)
    is DeepSeek-V3's MLA with always-interleaved RoPE (no ``rope_interleave`` switch), plus
    DeepSeek Sparse Attention: ``GlmMoeDsaIndexer`` (``wq_b``, ``wk``, ``k_norm``,
    ``weights_proj``; interleaved RoPE on the first ``qk_rope_head_dim`` features, which are
    reordered here into the half-split layout, the LayerNorm's gain and bias with them)
    selects ``index_topk`` keys per query and ``GlmMoeDsaAttention`` masks the others (the
    SDPA and eager paths; the flash-mla kernel consumes the same indices).

    Args:
        attn: a ``GlmMoeDsaAttention`` that runs its own indexer (``config.indexer_types[i]
            == 'full'``); its weights are copied.
        config: its ``GlmMoeDsaConfig``.

    Returns:
        The module, on ``attn``'s device and dtype, in its train/eval mode.

    Raises:
        ValueError: a ``'shared'`` layer (``attn.indexer is None``: it reuses the top-k of an
            earlier layer, which one block cannot see), or as :func:`from_deepseek_v3_attention`.
    """
    source = attn.indexer
    if source is None:
        raise ValueError(f"layer {attn.layer_idx} is a 'shared' DSA layer (config.indexer_types): it reuses an "
                         "earlier layer's top-k selection, which a single d2lmini block cannot reproduce")
    r, D, H = config.qk_rope_head_dim, source.head_dim, source.n_heads
    indexer = DSAIndexer(config.hidden_size, config.q_lora_rank, num_heads=H, head_dim=D, rope_dim=r,
                         topk=source.index_topk, eps=source.k_norm.eps)
    def half_split(rows):  # per head: the rotary features, from interleaved pairs, then the rest
        return rope_interleaved_to_half(rows, D, r)

    copy_linear(indexer.W_q, half_split(source.wq_b.weight))
    copy_linear(indexer.W_k, half_split(source.wk.weight))
    copy_linear(indexer.W_w, source.weights_proj.weight)
    copy_weight(indexer.k_norm.weight, half_split(source.k_norm.weight))
    copy_weight(indexer.k_norm.bias, half_split(source.k_norm.bias))
    return mla_from_hf(attn, config, interleaved=True, indexer=indexer.to(attn.o_proj.weight))


@converter("GlmMoeDsaDecoderLayer")
def from_glm_moe_dsa_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to a Hugging Face ``GlmMoeDsaDecoderLayer`` (GLM-5).

    ``transformers`` 5.24 ``models/glm_moe_dsa/modeling_glm_moe_dsa.py``: DeepSeek-V3's
    layer (pre-norm RMSNorm; a SwiGLU MLP in the first ``first_k_dense_replace`` layers, by
    ``config.mlp_layer_types``, DeepSeek-V3's mixture of experts after them) whose MLA attends
    only to the ``index_topk`` keys per query a DSA indexer selects
    (:func:`d2lmini.reference.glm.from_glm_moe_dsa_attention`, :class:`d2lmini.mla.DSAIndexer`).
    Called on ``X`` and ``valid_lens`` the block equals the layer called as
    ``GlmMoeDsaModel`` calls it (:func:`hf_glm_moe_dsa_call`) at the valid positions.

    Args:
        layer: a ``GlmMoeDsaDecoderLayer`` whose attention runs its own indexer; weights copied.
        config: its ``GlmMoeDsaConfig``.
        layer_idx: ``None`` (the layer's own) or that index (:func:`start_conversion`).

    Returns:
        The block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: a ``'shared'`` indexer layer (``config.indexer_types``: it reuses an
            earlier layer's selection), or as :func:`d2lmini.reference.glm.from_glm_moe_dsa_attention`,
            :func:`d2lmini.reference.deepseek.mla_decoder_block` and :func:`start_conversion`.
    """
    start_conversion(layer, config, layer_idx)
    return mla_decoder_block(layer, config, from_glm_moe_dsa_attention(layer.self_attn, config))


#: ``call(layer, config, X, valid_lens)`` running a ``GlmMoeDsaDecoderLayer`` as ``GlmMoeDsaModel.forward``
#: does: :func:`hf_call` with the causal mask always materialized (the indexer reads it even without
#: padding), position ids ``0 .. n-1`` and the tables of ``GlmMoeDsaRotaryEmbedding``.
hf_glm_moe_dsa_call = hf_call("glm_moe_dsa", "GlmMoeDsaDecoderLayer", materialize_mask=True)


# --------------------------------------------------------------------------- the family's tiny configurations

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    # GLM-5: the DeepSeek-V3 shapes plus a DSA indexer keeping 6 keys per query (the checks run 16 steps, so the
    # selection matters); layer 0 dense, layer 1 MoE (8 experts in 4 groups).
    "glm_moe_dsa": dict(_DEEPSEEK_TINY["deepseek_v3"], index_topk=6, index_head_dim=16, index_n_heads=8),
}


# --------------------------------------------------------------------------- the family's rows


def verify_glm5(seed: int) -> list[dict]:
    """GLM-5's decoder layers (0: dense, 1: MoE) of a tiny configuration against their conversions:
    :func:`~d2lmini.reference.harness.compare_with_reference`'s results, one per layer."""
    from .harness import Reference, compare_with_reference, hf_make
    from .tiny import tiny_config

    return [compare_with_reference(Reference("GlmMoeDsaDecoderLayer", "GLM-5",
                                             hf_make("glm_moe_dsa", "GlmMoeDsaDecoderLayer", "GlmMoeDsaConfig",
                                                     tiny_config("glm_moe_dsa"), layer_idx=i),
                                             from_glm_moe_dsa_layer, hf_glm_moe_dsa_call, causal=True), seed=seed)
            for i in (0, 1)]


#: The family's models in the zoo's 2026 table (:class:`~d2lmini.reference.base.Row2026`).
ROWS_2026 = (
    Row2026("GLM-5", 2026, "glm2026glm5", "GlmMoeDsaConfig",
            dict(norm="RMSNorm, pre", qk_norm="RMSNorm on the query and key/value latents", router="sigmoid"),
            "GLM-5 744B", class_default_cells={"positions": "GlmMoeDsaConfig's class default"},
            check="GLM-5 (sparse attention, dense and MoE layers)", verify=verify_glm5,
            missing="cross-layer top-k sharing (indexer_types 'shared', off by default)"),
)
