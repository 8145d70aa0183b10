"""DeepSeek-V3 and V4: the pre-norm block with latent attention and group-routed experts (V3), on hyper-connected streams (V4).

Relative to the pre-norm block: DeepSeek-V3 (and Kimi K2) replace attention by multi-head latent
attention (:class:`~d2lmini.mla.MultiHeadLatentAttention`: keys and values rebuilt from one small
latent per token, interleaved RoPE reordered into the half-split layout) and, after the first
dense layers, the FFN by a mixture with group-limited sigmoid routing and a shared expert.
DeepSeek-V4 keeps the routed experts (hash-routed or top-k), replaces MLA by compressed attention
(:class:`~d2lmini.deepseek_v4.CompressedAttention`) and the residual stream by ``hc_mult``
hyper-connected streams (:class:`~d2lmini.hyper.HyperConnectedBlock`).
"""

from __future__ import annotations

from functools import partial

import torch

from ..attention import interleaved_to_half_order, valid_lens_mask
from ..block import TransformerBlock
from ..deepseek_v4 import CompressedAttention, HashRoutedMoE
from ..hyper import HyperConnectedBlock
from ..mla import DSAIndexer, MultiHeadLatentAttention
from ..moe import MixtureOfExperts
from ..seeding import seeded
from .base import (converter, copy_gated_mlp, copy_linear, copy_norm, copy_weight, rope_kwargs,
                   start_conversion)
from .base import Row2026
from .gpt_oss import ClampedSwiGLU
from .harness import output_and_grad_differences, randomize_
from .tiny import tiny_config


def from_deepseek_v3_attention(attn, config) -> MultiHeadLatentAttention:
    """A :class:`MultiHeadLatentAttention` equal to Hugging Face ``DeepseekV3Attention``.

    Copies every weight of ``transformers`` 5.24 ``DeepseekV3Attention``
    (``models/deepseek_v3/modeling_deepseek_v3.py``; DeepSeek-V2 and V3, Kimi K2 use the
    same layer). With ``config.rope_interleave`` (the default, DeepSeek's checkpoints) the
    rows producing the rotary query and key features (``q_proj``/``q_b_proj`` per head,
    ``kv_a_proj_with_mqa``) are reordered evens-then-odds, which turns the interleaved
    RoPE of ``apply_rotary_pos_emb_interleave`` into d2lmini's half-split RoPE with
    identical attention. The RoPE base and scaling are read by
    :func:`d2lmini.reference.base.rope_kwargs`.

    Args:
        attn: a ``DeepseekV3Attention``; its weights are copied, not shared.
        config: its ``DeepseekV3Config``.

    Returns:
        The module, on ``attn``'s device and dtype, in its train/eval mode.

    Raises:
        ValueError: grouped key/value heads (``num_key_value_heads != num_attention_heads``,
            which the layer ignores but we refuse rather than guess), a RoPE type d2lmini does
            not reproduce, or YaRN with ``mscale_all_dim`` but no ``mscale`` (the softmax
            scale would need the one and the rotary table ignores it).
    """
    return mla_from_hf(attn, config, interleaved=bool(getattr(config, "rope_interleave", False)))


def mla_from_hf(attn, config, *, interleaved: bool, indexer: DSAIndexer | None = None) -> MultiHeadLatentAttention:
    """The :class:`~d2lmini.mla.MultiHeadLatentAttention` of a DeepSeek-V3-style attention ``attn``, weights copied.

    :func:`from_deepseek_v3_attention`'s work with the RoPE layout given: ``interleaved`` reorders the
    rows producing the rotary query and key features from interleaved pairs to the half-split layout;
    ``indexer`` (a converted :class:`~d2lmini.mla.DSAIndexer`, GLM-5) is handed to the module. Shared
    by DeepSeek-V3 and GLM-5 (:func:`~d2lmini.reference.glm.from_glm_moe_dsa_attention`).

    Returns:
        The module, on ``attn``'s device and dtype, in its train/eval mode.

    Raises:
        ValueError: as :func:`from_deepseek_v3_attention`.
    """
    if config.num_key_value_heads != config.num_attention_heads:
        raise ValueError(f"DeepSeek-V3's MLA has one key and value per head; got num_key_value_heads="
                         f"{config.num_key_value_heads} != num_attention_heads={config.num_attention_heads}")
    params = getattr(config, "rope_parameters", None) or {}
    if params.get("mscale_all_dim") and not params.get("mscale"):
        raise ValueError("rope_parameters with mscale_all_dim but no mscale are not supported: set both (DeepSeek-V3 "
                         "uses mscale = mscale_all_dim = 1)")
    rope = rope_kwargs(config)
    nope, r, h = config.qk_nope_head_dim, config.qk_rope_head_dim, config.num_attention_heads
    ours = MultiHeadLatentAttention(config.hidden_size, h, q_lora_rank=config.q_lora_rank,
                                    kv_lora_rank=config.kv_lora_rank, qk_nope_head_dim=nope, qk_rope_head_dim=r,
                                    v_head_dim=config.v_head_dim, rope_theta=rope["rope_theta"],
                                    rope_scaling=rope["rope_scaling"], bias=bool(config.attention_bias),
                                    dropout=float(config.attention_dropout), eps=attn.kv_a_layernorm.variance_epsilon,
                                    indexer=indexer)
    q_rows = torch.arange(h * (nope + r)).view(h, nope + r)  # each head: nope rows, then rope rows
    kv_rows = torch.arange(config.kv_lora_rank + r)  # the latent, then the shared rope key
    if interleaved:
        q_rows[:, nope:] = q_rows[:, nope:][:, interleaved_to_half_order(r)]
        kv_rows[config.kv_lora_rank:] = kv_rows[config.kv_lora_rank:][interleaved_to_half_order(r)]
    q_rows = q_rows.flatten()

    def rows(linear, order):
        return linear.weight[order], None if linear.bias is None else linear.bias[order]

    if config.q_lora_rank is None:
        copy_linear(ours.W_q, *rows(attn.q_proj, q_rows))
    else:
        copy_linear(ours.W_dq, attn.q_a_proj.weight, attn.q_a_proj.bias)
        copy_norm(ours.q_latent_norm, attn.q_a_layernorm)
        copy_linear(ours.W_uq, *rows(attn.q_b_proj, q_rows))
        ours.q_latent_norm.eps = attn.q_a_layernorm.variance_epsilon
    copy_linear(ours.W_dkv, *rows(attn.kv_a_proj_with_mqa, kv_rows))
    copy_norm(ours.kv_latent_norm, attn.kv_a_layernorm)
    copy_linear(ours.W_ukv, attn.kv_b_proj.weight, attn.kv_b_proj.bias)
    copy_linear(ours.W_o, attn.o_proj.weight, attn.o_proj.bias)
    return ours.to(attn.o_proj.weight).train(attn.training)


def from_deepseek_v3_moe(moe, config) -> MixtureOfExperts:
    """A :class:`~d2lmini.moe.MixtureOfExperts` equal to Hugging Face ``DeepseekV3MoE`` (DeepSeek-V3, Kimi K2).

    ``DeepseekV3TopkRouter``: sigmoid scores of a float32 linear router, group-limited
    selection (``n_group`` groups, ``topk_group`` of them, each scored by the sum of its two
    best ``sigmoid + e_score_correction_bias``), the selected sigmoid scores renormalized and
    scaled by ``routed_scaling_factor``; ``DeepseekV3Experts``: SwiGLU experts stored as
    ``gate_up_proj`` ``(E, 2I, d)`` (gate rows first) and ``down_proj`` ``(E, d, I)``; and
    ``n_shared_experts`` shared experts fused into one always-on SwiGLU MLP. Kimi K2's
    text model is this class (``Kimi_K25Config.text_config`` is a ``DeepseekV3Config``).

    Args:
        moe: a ``DeepseekV3MoE`` (``layer.mlp`` of a layer at index >= ``first_k_dense_replace``).
        config: its ``DeepseekV3Config``.

    Returns:
        The mixture, on the module's device and dtype, in its train/eval mode.

    Raises:
        ValueError: ``norm_topk_prob=False`` (d2lmini always renormalizes the selected
            scores) or an activation other than SiLU.
    """
    if not config.norm_topk_prob:
        raise ValueError("DeepSeek-V3's MoE is supported with norm_topk_prob=True only")
    if config.hidden_act != "silu":
        raise ValueError(f"DeepSeek-V3's MoE is supported with hidden_act='silu' only, got {config.hidden_act!r}")
    experts, width = moe.experts, config.moe_intermediate_size
    ours = MixtureOfExperts(config.hidden_size, experts.num_experts, top_k=config.num_experts_per_tok,
                            ffn_num_hiddens=width, act="swiglu", router="sigmoid",
                            num_shared_experts=config.n_shared_experts,
                            route_scale=float(config.routed_scaling_factor), num_groups=config.n_group,
                            topk_groups=config.topk_group)
    copy_weight(ours.router.weight, moe.gate.weight)
    copy_weight(ours.expert_bias, moe.gate.e_score_correction_bias)
    for e, ffn in enumerate(ours.experts):
        gate_up = experts.gate_up_proj[e]
        copy_gated_mlp(ffn, gate_up[:width], gate_up[width:], experts.down_proj[e])
    shared = moe.shared_experts
    copy_gated_mlp(ours.shared, shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight)
    return ours.to(experts.down_proj).train(moe.training)


def from_deepseek_v3_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`~d2lmini.block.TransformerBlock` equal to a Hugging Face ``DeepseekV3DecoderLayer``.

    Pre-norm RMSNorm (``input_layernorm``, ``post_attention_layernorm``, epsilon
    ``config.rms_norm_eps``), :class:`MultiHeadLatentAttention`
    (:func:`from_deepseek_v3_attention`) and a SwiGLU MLP (``gate_proj``, ``up_proj``,
    ``down_proj``) in the first ``config.first_k_dense_replace`` layers of DeepSeek-V3
    (3 of 61), and in the later ones a mixture of experts with group-limited sigmoid
    routing, a selection bias and a shared expert (``DeepseekV3MoE``, through
    ``ffn_factory``: :func:`d2lmini.reference.from_deepseek_v3_moe`).

    Args:
        layer: a ``DeepseekV3DecoderLayer``, dense or MoE; its weights are copied.
        config: its ``DeepseekV3Config``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: an activation other than SiLU, or as :func:`from_deepseek_v3_attention`
            and :func:`d2lmini.reference.from_deepseek_v3_moe`.
    """
    start_conversion(layer, config, layer_idx, reproduced=("attention_dropout",))  # MLA drops out where it does
    return mla_decoder_block(layer, config, from_deepseek_v3_attention(layer.self_attn, config))


def mla_decoder_block(layer, config, attention: MultiHeadLatentAttention) -> TransformerBlock:
    """The block of a DeepSeek-V3-style layer around a converted ``attention`` (DeepSeek-V3, Kimi K2, GLM-5).

    Pre-norm RMSNorm (``input_layernorm``, ``post_attention_layernorm``, ``config.rms_norm_eps``)
    and, by ``layer.mlp``, a SwiGLU MLP (``gate_proj``, ``up_proj``, ``down_proj``) or the
    DeepSeek-V3 mixture of experts (:func:`d2lmini.reference.from_deepseek_v3_moe`, which
    ``GlmMoeDsaMoE`` equals: same router, experts and shared experts); weights copied.

    Args:
        layer: a ``DeepseekV3DecoderLayer`` or ``GlmMoeDsaDecoderLayer``.
        config: its configuration.
        attention: the layer's attention, already converted (:func:`from_deepseek_v3_attention`,
            :func:`from_glm_moe_dsa_attention`).

    Returns:
        The block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: an activation other than SiLU, or as :func:`d2lmini.reference.from_deepseek_v3_moe`.
    """
    mlp = layer.mlp
    if config.hidden_act != "silu":
        raise ValueError(f"the MLP of {type(layer).__name__} is supported with hidden_act='silu' only, got "
                         f"{config.hidden_act!r}")
    dense = hasattr(mlp, "gate_proj")
    moe = None if dense else from_deepseek_v3_moe(mlp, config)
    block = TransformerBlock(config.hidden_size, config.num_attention_heads, norm="rms", placement="pre",
                             eps=config.rms_norm_eps, attn_factory=lambda: attention,
                             **({"act": "swiglu", "ffn_num_hiddens": mlp.intermediate_size} if dense
                                else {"ffn_factory": lambda: moe}))
    if dense:
        copy_gated_mlp(block.ffn, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    return block.to(layer.input_layernorm.weight).train(layer.training)


#: ``DeepseekV4Config.layer_types`` -> ``CompressedAttention(compress=...)``.
_DEEPSEEK_V4_COMPRESS = {"sliding_attention": None, "heavily_compressed_attention": "hca",
                         "compressed_sparse_attention": "csa"}


def _deepseek_v4_rope(config, label: str) -> tuple[float, dict | None]:
    """``(theta, scaling)`` of ``config.rope_parameters[label]`` (``'main'`` or ``'compress'``) for d2lmini."""
    params = dict(config.rope_parameters[label])
    theta = float(params.pop("rope_theta"))
    params.pop("partial_rotary_factor", None)
    if params.get("rope_type", "default") == "default":
        return theta, None
    if params["rope_type"] != "yarn":
        raise ValueError(f"DeepSeek-V4's {label!r} RoPE is supported with rope_type 'default' or 'yarn', "
                         f"got {params['rope_type']!r}")
    params.setdefault("original_max_position_embeddings", config.max_position_embeddings)
    return theta, params


@converter("DeepseekV4DecoderLayer")
def from_deepseek_v4_layer(layer, config, layer_idx: int | None = None):
    """A :class:`~d2lmini.hyper.HyperConnectedBlock` equal to a Hugging Face ``DeepseekV4DecoderLayer``.

    ``transformers`` 5.24 ``models/deepseek_v4/modeling_deepseek_v4.py``, each of its three
    layer types (``config.layer_types[layer_idx]``): ``'sliding_attention'``,
    ``'heavily_compressed_attention'`` (HCA) and ``'compressed_sparse_attention'`` (CSA, with
    its lightning indexer) -- a :class:`~d2lmini.deepseek_v4.CompressedAttention` -- and both
    MoE kinds (``config.mlp_layer_types[layer_idx]``): ``'moe'``, a
    :class:`~d2lmini.moe.MixtureOfExperts` (``router='sqrtsoftplus'`` or V4's ``scoring_func``,
    clamped SwiGLU experts, one shared expert of the experts' width), and ``'hash_moe'``, a
    :class:`~d2lmini.deepseek_v4.HashRoutedMoE` holding the layer's ``tid2eid`` table; around
    them the two hyper-connections and RMSNorms (``attn_hc``, ``input_layernorm``, ``ffn_hc``,
    ``post_attention_layernorm``). Called on streams ``(b, n, hc_mult, d)``, ``valid_lens`` and
    (hash layers) ``input_ids``, the block equals the layer called as ``DeepseekV4Model`` calls it
    without a cache (:func:`hf_deepseek_v4_call`) at the valid positions; checked in
    ``tests/test_deepseek_v4.py`` and the block zoo.

    Args:
        layer: a ``DeepseekV4DecoderLayer``; weights copied.
        config: its ``DeepseekV4Config``.
        layer_idx: ``None`` (the layer's own) or that index (:func:`start_conversion`).

    Returns:
        The block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: a layer type or MLP layer type other than the above (named), a RoPE type other than
            ``'default'`` and ``'yarn'``, ``hidden_act`` other than ``'silu'``, a ``scoring_func`` other
            than ``'sqrtsoftplus'``, ``'softmax'`` and ``'sigmoid'``, or as :func:`start_conversion`.
    """
    idx = start_conversion(layer, config, layer_idx)
    kind, mlp_kind = config.layer_types[idx], config.mlp_layer_types[idx]
    if kind not in _DEEPSEEK_V4_COMPRESS:
        raise ValueError(f"DeepSeek-V4 layer {idx} has layer type {kind!r}; supported: {sorted(_DEEPSEEK_V4_COMPRESS)}")
    if mlp_kind not in ("moe", "hash_moe"):
        raise ValueError(f"DeepSeek-V4 layer {idx} has MLP layer type {mlp_kind!r}; supported: 'moe', 'hash_moe'")
    if config.hidden_act != "silu":
        raise ValueError(f"DeepSeek-V4 is supported with hidden_act='silu' only, got {config.hidden_act!r}")
    if config.scoring_func not in ("sqrtsoftplus", "softmax", "sigmoid"):
        raise ValueError(f"DeepSeek-V4's scoring_func must be 'sqrtsoftplus', 'softmax' or 'sigmoid', "
                         f"got {config.scoring_func!r}")
    attn, moe, compress = layer.self_attn, layer.mlp, _DEEPSEEK_V4_COMPRESS[kind]
    d, eps = config.hidden_size, config.rms_norm_eps
    theta, _ = _deepseek_v4_rope(config, "main")
    compress_theta, compress_scaling = _deepseek_v4_rope(config, "compress")
    attn_kwargs = dict(head_dim=config.head_dim, q_lora_rank=config.q_lora_rank, rope_dim=config.qk_rope_head_dim,
                       window=config.sliding_window, o_groups=config.o_groups, o_lora_rank=config.o_lora_rank,
                       rope_theta=theta, compress=compress, eps=eps)
    if compress is not None:
        attn_kwargs.update(compress_ratio=config.compress_rates[kind], compress_rope_theta=compress_theta,
                           compress_rope_scaling=compress_scaling)
    if compress == "csa":
        attn_kwargs.update(index_heads=config.index_n_heads, index_head_dim=config.index_head_dim,
                           index_topk=config.index_topk)
    moe_kwargs = dict(top_k=config.num_experts_per_tok, ffn_num_hiddens=config.moe_intermediate_size, act="swiglu",
                      router=config.scoring_func, num_shared_experts=1,
                      route_scale=float(config.routed_scaling_factor),
                      expert=partial(ClampedSwiGLU, swiglu_limit=float(config.swiglu_limit)))
    experts = moe.experts.num_experts
    if mlp_kind == "hash_moe":
        def ffn():
            return HashRoutedMoE(d, experts, vocab_size=config.vocab_size, **moe_kwargs)
    else:
        def ffn():
            return MixtureOfExperts(d, experts, **moe_kwargs)
    block = HyperConnectedBlock(d, config.num_attention_heads, num_streams=config.hc_mult, norm_eps=eps,
                                sinkhorn_iters=config.hc_sinkhorn_iters, hc_eps=config.hc_eps,
                                attn_factory=lambda: CompressedAttention(d, config.num_attention_heads, **attn_kwargs),
                                ffn_factory=ffn)
    for ours, theirs in ((block.hc1, layer.attn_hc), (block.hc2, layer.ffn_hc)):
        copy_weight(ours.phi, theirs.fn), copy_weight(ours.bias, theirs.base), copy_weight(ours.alpha, theirs.scale)
    copy_norm(block.norm1, layer.input_layernorm)
    copy_norm(block.norm2, layer.post_attention_layernorm)
    ours = block.attention
    for dst, src in ((ours.W_qa, attn.q_a_proj), (ours.W_qb, attn.q_b_proj), (ours.W_kv, attn.kv_proj),
                     (ours.W_ob, attn.o_b_proj)):
        copy_linear(dst, src.weight)
    copy_norm(ours.q_norm, attn.q_a_norm)
    copy_norm(ours.kv_norm, attn.kv_norm)
    copy_weight(ours.W_oa, attn.o_a_proj.weight.view(ours.W_oa.shape))
    copy_weight(ours.sinks, attn.sinks)
    if compress is not None:
        _copy_deepseek_v4_compressor(ours.compressor, attn.compressor)
    if compress == "csa":
        theirs = attn.compressor.indexer
        _copy_deepseek_v4_compressor(ours.indexer.compressor, theirs)
        copy_linear(ours.indexer.W_q, theirs.q_b_proj.weight)
        copy_linear(ours.indexer.W_w, theirs.scorer.weights_proj.weight)
    mix, width = block.ffn, config.moe_intermediate_size
    copy_weight(mix.router.weight, moe.gate.weight)
    if mlp_kind == "hash_moe":
        copy_weight(mix.token_experts, moe.gate.tid2eid)
    else:
        copy_weight(mix.expert_bias, moe.gate.e_score_correction_bias)
    for e, expert in enumerate(mix.experts):
        gate_up = moe.experts.gate_up_proj[e]
        copy_gated_mlp(expert, gate_up[:width], gate_up[width:], moe.experts.down_proj[e])
    shared = moe.shared_experts
    copy_gated_mlp(mix.shared, shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight)
    return block.to(attn.q_a_proj.weight).train(layer.training)


def _copy_deepseek_v4_compressor(ours, theirs) -> None:
    """Copy a ``DeepseekV4HCACompressor``/``CSACompressor``/``Indexer``'s compressor into a ``KVCompressor``."""
    copy_linear(ours.W_kv, theirs.kv_proj.weight)
    copy_linear(ours.W_z, theirs.gate_proj.weight)
    copy_weight(ours.position_bias, theirs.position_bias)
    copy_norm(ours.norm, theirs.kv_norm)


def hf_deepseek_v4_call(layer, config, streams: torch.Tensor, valid_lens: torch.Tensor | None = None,
                        input_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Call a ``DeepseekV4DecoderLayer`` as ``DeepseekV4Model.forward`` does (no cache); returns its streams.

    ``streams`` ``(b, n, hc_mult, d)`` right-padded to ``valid_lens`` (or ``None``); the model's
    mask (``create_sliding_window_causal_mask`` of the 2-D padding mask), position ids
    ``0 .. n-1``, both rotary tables of ``DeepseekV4RotaryEmbedding`` (``'main'`` and
    ``'compress'``), and ``input_ids`` ``(b, n)`` (read by hash-routed layers).
    """
    from transformers import masking_utils
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as modeling

    batch_size, num_steps = streams.shape[:2]
    X = streams[:, :, 0]
    padding = None if valid_lens is None else valid_lens_mask(valid_lens, num_steps).long()
    position_ids = torch.arange(num_steps, device=streams.device)[None].expand(batch_size, -1)
    mask = masking_utils.create_sliding_window_causal_mask(config=config, inputs_embeds=X, attention_mask=padding,
                                                           cache=None, position_ids=position_ids)
    rotary = modeling.DeepseekV4RotaryEmbedding(config).to(streams.device)
    tables = {label: rotary(X, position_ids=position_ids, layer_type=label) for label in ("main", "compress")}
    return layer(streams, input_ids=input_ids, position_embeddings=tables, position_ids=position_ids,
                 attention_mask=mask)


def hf_deepseek_v4_make(layer_idx: int, seed: int = 0, **config_overrides):
    """A tiny random ``DeepseekV4DecoderLayer`` and its config: ``(layer, config)``, eval mode.

    :func:`~d2lmini.reference.tiny.tiny_config` ``('deepseek_v4', **config_overrides)``, eager attention, every parameter
    seeded-random (:func:`randomize_`; the hyper-connections' projections, biases and scales and the
    sinks drawn normal so that their mappings are far from uniform), the top-k router's
    ``e_score_correction_bias`` random and the hash router's ``tid2eid`` a random table of distinct experts.

    Raises:
        ImportError / AttributeError: ``transformers`` lacks DeepSeek-V4.
    """
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as modeling

    torch.manual_seed(seed)
    config = DeepseekV4Config(**tiny_config("deepseek_v4", **config_overrides))
    config._attn_implementation, config._experts_implementation = "eager", "eager"
    layer = randomize_(modeling.DeepseekV4DecoderLayer(config, layer_idx), seed)
    gen = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        for hc in (layer.attn_hc, layer.ffn_hc):
            hc.fn.copy_(torch.randn(hc.fn.shape, generator=gen) * 0.1)
            hc.base.copy_(torch.randn(hc.base.shape, generator=gen))
            hc.scale.copy_(torch.randn(3, generator=gen) + 1)
        layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=gen))
        gate, experts = layer.mlp.gate, layer.mlp.experts.num_experts
        if hasattr(gate, "tid2eid"):
            gate.tid2eid.copy_(torch.stack([torch.randperm(experts, generator=gen)[:gate.top_k]
                                            for _ in range(config.vocab_size)]))
        else:
            gate.e_score_correction_bias.copy_(torch.randn(experts, generator=gen) * 0.1)
    return layer.eval(), config


def compare_deepseek_v4_layer(layer_idx: int, seed: int = 0, num_steps: int = 24, layer=None, config=None,
                              block=None) -> dict:
    """``DeepseekV4DecoderLayer`` against :func:`from_deepseek_v4_layer`'s block: outputs and input gradients.

    Both run on the same random streams ``(2, num_steps, hc_mult, d)`` (the second sequence padded to 17/24 of
    its length) and token ids, the layer as :func:`hf_deepseek_v4_call` calls it, the block with
    ``valid_lens`` (and ``input_ids`` for a hash-routed layer); compared at the valid positions
    (:func:`output_and_grad_differences`).

    Args:
        layer_idx: 0, 1 or 2 of the tiny ``"deepseek_v4"`` configuration (sliding + hash MoE, HCA, CSA).
        seed: seeds the weights (:func:`hf_deepseek_v4_make`) and the inputs.
        num_steps: the sequence length.
        layer, config, block: a given layer and config (default: :func:`hf_deepseek_v4_make`) and block
            (default: converted from the layer; pass a mutated one to see the comparison fail).

    Returns:
        dict with ``max_abs_diff``, ``max_abs_grad_diff``, ``max_abs_output`` and ``block``.
    """
    if layer is None:
        layer, config = hf_deepseek_v4_make(layer_idx, seed)
    block = from_deepseek_v4_layer(layer, config).eval() if block is None else block
    gen = torch.Generator().manual_seed(seed + 1)
    S = torch.randn(2, num_steps, config.hc_mult, config.hidden_size, generator=gen)
    R = torch.randn(S.shape, generator=gen)
    ids = torch.randint(0, config.vocab_size, (2, num_steps), generator=gen)
    valid_lens = torch.tensor([num_steps, max(1, num_steps * 17 // 24)])
    keep = (torch.arange(num_steps)[None] < valid_lens[:, None])[..., None, None]
    ours_ids = ids if isinstance(block.ffn, HashRoutedMoE) else None
    runs = (lambda Z: hf_deepseek_v4_call(layer, config, Z, valid_lens, ids),
            lambda Z: block(Z, valid_lens, input_ids=ours_ids))
    return {**output_and_grad_differences(runs, S, R, keep), "block": block}


# --------------------------------------------------------------------------- the family's tiny configurations

# A tiny DeepSeek-V3: layer 0 dense (MLA + SwiGLU), layer 1 a MoE layer whose 8 experts form 4 groups, a token's
# 2 experts from the best 2 groups; every width distinct, so a swapped one cannot pass.
_V3 = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=4, intermediate_size=80,
                    moe_intermediate_size=16, q_lora_rank=24, kv_lora_rank=20, qk_nope_head_dim=10,
                    qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                    topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, first_k_dense_replace=1,
                    num_hidden_layers=2, rms_norm_eps=1e-5, max_position_embeddings=64,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    "deepseek_v3": _V3,
    # DeepSeek-V4 with one layer of each type -- 0 sliding window + hash-routed MoE, 1 HCA + top-k MoE, 2 CSA +
    # top-k MoE -- sized so that everything acts within 24 steps: a window of 6, HCA entries of 8 tokens, CSA
    # entries of 4 of which the indexer keeps 3, RoPE on half of each head, a SwiGLU clamp of 1.
    "deepseek_v4": dict(
        vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, head_dim=16, q_lora_rank=16,
        partial_rotary_factor=0.5, o_groups=2, o_lora_rank=8, sliding_window=6,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}, index_n_heads=2,
        index_head_dim=8, index_topk=3, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        swiglu_limit=1.0, hc_mult=4,
        layer_types=["sliding_attention", "heavily_compressed_attention", "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe"]),
}


# --------------------------------------------------------------------------- the family's rows

_LATENT_NORMS = "RMSNorm on the query and key/value latents"


def verify_deepseek_v3(seed: int, layer_indices=(0, 1), **overrides) -> list[dict]:
    """DeepSeek-V3's decoder layers (0: dense, 1: MoE) of a tiny configuration (``overrides``
    change it) against their conversions: :func:`~d2lmini.reference.harness.compare_with_reference`'s
    results, one per layer."""
    from .harness import Reference, compare_with_reference, hf_call, hf_make

    results = []
    for i in layer_indices:
        make = hf_make("deepseek_v3", "DeepseekV3DecoderLayer", "DeepseekV3Config",
                       tiny_config("deepseek_v3", **overrides), layer_idx=i)
        call = hf_call("deepseek_v3", "DeepseekV3DecoderLayer", layer_idx=i, rotary="DeepseekV3RotaryEmbedding")
        ref = Reference("DeepseekV3DecoderLayer", "DeepSeek-V3", make, from_deepseek_v3_layer, call, causal=True)
        results.append(compare_with_reference(ref, seed=seed))
    return results


def deepseek_v4_wiring_check(seed: int = 0, num_streams: int = 4, num_steps: int = 8) -> dict:
    """d2lmini's :class:`~d2lmini.hyper.HyperConnectedBlock` against ``DeepseekV4DecoderLayer``'s wiring.

    V4's attention and MoE are not reproduced, so the HF layer gets the block's own
    attention and FFN modules (wrapped to V4's call signatures); what is compared is
    everything around them: the two hyper-connections (their projections, Sinkhorn-Knopp
    mixing, collapse and expansion of the ``num_streams`` streams) and the two RMSNorms,
    with every parameter random and the same values copied into V4's ``attn_hc``,
    ``ffn_hc``, ``input_layernorm`` and ``post_attention_layernorm``.

    Returns:
        dict with ``max_abs_diff``, ``max_abs_grad_diff`` and ``max_abs_output``, as
        :func:`d2lmini.reference.output_and_grad_differences` gives them on a padded
        batch of streams ``(2, num_steps, num_streams, 32)``.

    Raises:
        ImportError / AttributeError: ``transformers`` lacks DeepSeek-V4.
    """
    import importlib

    from torch import nn

    m = importlib.import_module("transformers.models.deepseek_v4.modeling_deepseek_v4")
    from transformers import DeepseekV4Config

    d = 32
    config = DeepseekV4Config(vocab_size=50, hidden_size=d, num_hidden_layers=1, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=16, q_lora_rank=16, moe_intermediate_size=16,
                              n_routed_experts=4, num_experts_per_tok=2, o_groups=2, o_lora_rank=16, index_n_heads=2,
                              index_head_dim=8, index_topk=4, hc_mult=num_streams)
    valid_lens = torch.tensor([num_steps, num_steps // 2])
    with seeded(seed):
        block = HyperConnectedBlock(d, 4, num_streams=num_streams, causal=True, num_kv_heads=2)
        randomize_(block, seed)
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():  # the mappings far from uniform: projections large, gains around 1
            for p in [*block.hc1.parameters(), *block.hc2.parameters()]:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() == 2 else 1.0) + (p.numel() <= 3))
        layer = m.DeepseekV4DecoderLayer(config, 0)

    class Attn(nn.Module):  # V4's call: (hidden_states, **kwargs) -> (out, weights)
        def forward(self, hidden_states, **kwargs):
            return block.attention(*(hidden_states,) * 3, valid_lens), None

    class MLP(nn.Module):  # V4's call: (hidden_states, input_ids=None) -> out
        def forward(self, hidden_states, input_ids=None):
            return block.ffn(hidden_states)

    layer.self_attn, layer.mlp = Attn(), MLP()
    with torch.no_grad():
        for theirs, ours in ((layer.attn_hc, block.hc1), (layer.ffn_hc, block.hc2)):
            theirs.fn.copy_(ours.phi), theirs.base.copy_(ours.bias), theirs.scale.copy_(ours.alpha)
        layer.input_layernorm.weight.copy_(block.norm1.weight)
        layer.post_attention_layernorm.weight.copy_(block.norm2.weight)
    gen = torch.Generator().manual_seed(seed + 2)
    S = torch.randn(2, num_steps, num_streams, d, generator=gen)
    R = torch.randn(S.shape, generator=gen)
    keep = (torch.arange(num_steps)[None] < valid_lens[:, None])[..., None, None]  # (b, n, 1, 1)
    return output_and_grad_differences([lambda Z: layer(Z), lambda Z: block(Z, valid_lens)], S, R, keep)


def verify_deepseek_v4(seed: int) -> list[dict]:
    """DeepSeek-V4: its hyper-connected wiring (:func:`deepseek_v4_wiring_check`), then whole decoder
    layers of each type (:func:`compare_deepseek_v4_layer`: 0 sliding with hash MoE, 1 HCA, 2 CSA)."""
    return [deepseek_v4_wiring_check(seed), *(compare_deepseek_v4_layer(i, seed) for i in (0, 1, 2))]


#: The family's models in the zoo's 2026 table (:class:`~d2lmini.reference.base.Row2026`).
ROWS_2026 = (
    Row2026("DeepSeek-V3", 2024, "deepseek2024v3", "DeepseekV3Config",
            dict(norm="RMSNorm, pre", qk_norm=_LATENT_NORMS, router="sigmoid"), "DeepSeek-V3 671B",
            check="DeepSeek-V3 layers", verify=verify_deepseek_v3),
    Row2026("Kimi K2.5", 2026, "kimi2025k2", "Kimi_K25Config.text_config",
            dict(norm="RMSNorm, pre", qk_norm=_LATENT_NORMS, router="sigmoid"), "Kimi K2.5 1T",
            report=dict(num_attention_heads=64, n_routed_experts=384, first_k_dense_replace=1, n_group=1,
                        topk_group=1),
            class_default_cells={"positions": "DeepSeek-V3's class default; Kimi's own base is larger"},
            check="DeepSeek-V3 layers, no expert groups",
            verify=partial(verify_deepseek_v3, layer_indices=(1,), n_group=1, topk_group=1)),
    Row2026("DeepSeek-V4", 2026, "", "DeepseekV4Config",
            dict(norm="RMSNorm, pre (inside each hyper-connection)", act="clamped SwiGLU",
                 qk_norm="QK-norm: RMSNorm without gain on each query head, with gain on the shared K/V head",
                 sinks=True), "DeepSeek-V4-Flash",
            class_default_cells={"shape": "class defaults; the docstring names DeepSeek-V4-Flash-Base",
                                 "positions": "class default"},
            check="DeepSeek-V4 (sliding, HCA and CSA layers, hash and top-k MoE)", verify=verify_deepseek_v4,
            missing="the key/value cache of the compressors (decoding token by token)"),
)
