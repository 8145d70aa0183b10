"""The parallel and partial-RoPE blocks: Phi, Phi-3, GPT-NeoX, GPT-J, Falcon, Cohere, StableLM.

Relative to the pre-norm block: attention and MLP read the same normalized input and both add
to the stream (``placement='parallel'``: ``x + Attn(LN(x)) + MLP(LN(x))``, Wang and Komatsuzaki,
2021) -- or the usual pre-norm, where a config says so -- with RoPE on only the first
``rotary_dim`` features of each head, fused q/k/v layouts, *interleaved* RoPE pairs (GPT-J,
Cohere; converted by permuting the rows of ``W_q`` and ``W_k``,
:func:`~d2lmini.reference.base.rope_interleaved_to_half`), and MLP biases that differ from the
attention's.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from ..attention import MultiHeadAttention
from ..block import TransformerBlock
from .base import (converter, copy_attention, copy_gated_mlp, copy_mlp, copy_norm, gated_act, hf_act,
                   start_conversion, unscaled_rope_theta)
from .base import LayerRow
from .llama import LlamaVariantAttention
from .tiny import TINY, WINDOW


def _refuse_layernorm_qk_norm(config, model: str, option: str) -> None:
    """Raise if ``config.<option>`` asks for a LayerNorm on each head's queries and keys (Phi's and StableLM's
    ``qk_layernorm``, Cohere's ``use_qk_norm``): d2lmini's QK-norms are RMSNorms."""
    if getattr(config, option):
        raise ValueError(f"{model}'s {option} (a LayerNorm per head) is not supported; d2lmini's QK-norms are "
                         f"RMSNorms. Use {option}=False")


def _rotary_block(config, *, num_kv_heads: int, head_dim: int, placement: str, norm: str, eps: float, act: str,
                  bias: bool | str, ffn_bias: bool, ffn_num_hiddens: int, rope_theta: float,
                  rotary_dim: int | None, window: int | None = None) -> TransformerBlock:
    """A causal block for the RoPE families below; ``rotary_dim == head_dim`` is full RoPE.

    ``bias`` is the attention's (``True``, ``False`` or ``'qkv'``: q, k and v only, as
    :class:`~d2lmini.reference.llama.LlamaVariantAttention`), ``ffn_bias`` the FFN's (they differ in
    GPT-J, GPT-NeoX without ``attention_bias``, Cohere with it).
    """
    d, h = config.hidden_size, config.num_attention_heads
    turned = None if rotary_dim in (None, head_dim) else {"rope_type": "default",
                                                         "partial_rotary_factor": rotary_dim / head_dim}
    options = dict(num_kv_heads=num_kv_heads, causal=True, head_dim=head_dim, rope_theta=rope_theta,
                   rope_scaling=turned, window=window)
    if bias == "qkv":
        attention = partial(LlamaVariantAttention, d, h, qkv_bias=True, **options)
    else:
        attention = partial(MultiHeadAttention, d, h, bias=bias, **options)
    return TransformerBlock(d, h, norm=norm, placement=placement, bias=ffn_bias, eps=eps, act=act,
                            ffn_num_hiddens=ffn_num_hiddens, attn_factory=attention)


def _copy_parallel_or_pre_norms(block: TransformerBlock, first: nn.Module, second: nn.Module | None) -> None:
    """Copy the norm before attention and, unless the block shares it (``'parallel'``), the one before the FFN."""
    copy_norm(block.addnorm1.norm_in, first)
    if block.placement != "parallel":
        copy_norm(block.addnorm2.norm_in, second)


@converter("PhiDecoderLayer")
def from_phi_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``PhiDecoderLayer`` (Phi-1, Phi-1.5, Phi-2; 2023).

    Attention and MLP in parallel on one shared LayerNorm (``placement='parallel'``:
    ``x + Attn(LN(x)) + MLP(LN(x))``, eps ``config.layer_norm_eps``), biases on every
    projection, a plain MLP ``fc2(gelu_new(fc1(x)))`` (tanh GELU), and partial RoPE on the
    first ``rotary_dim = int(head_dim * partial_rotary_factor)`` features of each head
    (0.5 in Phi-2; ``PhiAttention.rotary_ndims``), half-split layout.

    Args:
        layer, config: a ``PhiDecoderLayer`` and its ``PhiConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The ``'parallel'`` causal block with partial RoPE.

    Raises:
        ValueError: for ``qk_layernorm`` (a LayerNorm with bias on each head's queries and
            keys, which d2lmini's RMSNorm QK-norms do not implement), scaled RoPE, or an
            unsupported activation.
    """
    start_conversion(layer, config, layer_idx)
    _refuse_layernorm_qk_norm(config, "Phi", "qk_layernorm")
    attn = layer.self_attn
    block = _rotary_block(config, num_kv_heads=config.num_key_value_heads, head_dim=attn.head_dim,
                          placement="parallel", norm="layer", eps=config.layer_norm_eps, act=hf_act(config.hidden_act),
                          bias=True, ffn_bias=True, ffn_num_hiddens=config.intermediate_size,
                          rope_theta=unscaled_rope_theta(config, partial=True), rotary_dim=attn.rotary_ndims)
    copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.dense)
    copy_mlp(block, layer.mlp.fc1, layer.mlp.fc2)
    copy_norm(block.addnorm1.norm_in, layer.input_layernorm)  # addnorm2 shares it
    return block.to(attn.q_proj.weight).train(layer.training)


@converter("Phi3DecoderLayer")
def from_phi3_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Phi3DecoderLayer`` (Phi-3, Phi-3.5, Phi-4-mini).

    Pre-LN with RMSNorm (``config.rms_norm_eps``), grouped-query attention without biases
    whose q, k and v come from one fused ``qkv_proj`` (rows: all query heads, then the key
    heads, then the value heads), a SwiGLU MLP whose gate and up projections are fused in
    ``gate_up_proj`` (gate in the first half of the rows, up in the second), RoPE on the
    first ``int(head_dim * partial_rotary_factor)`` features of each head (all of them in
    Phi-3; 0.75 in Phi-4-mini), and ``window=config.sliding_window`` (``None``: none;
    Phi-3-mini-4k has 2047, and ``Phi3Model`` then builds the sliding-window mask).

    Args:
        layer, config: a ``Phi3DecoderLayer`` and its ``Phi3Config``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The pre-norm causal block.

    Raises:
        ValueError: for scaled RoPE (``rope_type='longrope'``, the 128k-context Phi-3 models)
            or an unsupported gated activation.
    """
    start_conversion(layer, config, layer_idx)
    attn, mlp = layer.self_attn, layer.mlp
    head_dim, kv = attn.head_dim, config.num_key_value_heads
    fraction = config.rope_parameters.get("partial_rotary_factor", 1.0)
    block = _rotary_block(config, num_kv_heads=kv, head_dim=head_dim, placement="pre", norm="rms",
                          eps=config.rms_norm_eps, act=gated_act(config.hidden_act), bias=False, ffn_bias=False,
                          ffn_num_hiddens=config.intermediate_size, rope_theta=unscaled_rope_theta(config, partial=True),
                          rotary_dim=int(head_dim * fraction), window=config.sliding_window)
    q_rows = config.num_attention_heads * head_dim
    Wq, Wk, Wv = attn.qkv_proj.weight.split([q_rows, kv * head_dim, kv * head_dim])
    copy_attention(block, (Wq, None), (Wk, None), (Wv, None), attn.o_proj)
    gate, up = mlp.gate_up_proj.weight.chunk(2, dim=0)
    copy_gated_mlp(block.ffn, gate, up, mlp.down_proj.weight)
    _copy_parallel_or_pre_norms(block, layer.input_layernorm, layer.post_attention_layernorm)
    return block.to(attn.qkv_proj.weight).train(layer.training)


@converter("GPTNeoXLayer")
def from_gpt_neox_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``GPTNeoXLayer`` (GPT-NeoX-20B, Pythia; 2022).

    With ``use_parallel_residual`` (the default, and every released GPT-NeoX and Pythia
    model) attention and MLP in parallel, each on its own LayerNorm
    (``placement='parallel_two_norms'``: ``input_layernorm``, ``post_attention_layernorm``),
    else pre-LN. The fused ``query_key_value`` projection is laid out per head: rows
    ``(heads, [q, k, v], head_dim)``. RoPE on the first
    ``int(head_dim * partial_rotary_factor)`` features of each head (``rotary_pct``, 0.25 by
    default; ``GPTNeoXAttention.rotary_ndims``), half-split; a plain MLP with biases;
    attention biases when ``config.attention_bias``.

    Args:
        layer, config: a ``GPTNeoXLayer`` and its ``GPTNeoXConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The ``'parallel_two_norms'`` causal block with partial RoPE, or the ``'pre'`` one when
        ``config.use_parallel_residual`` is false.

    Raises:
        ValueError: for scaled RoPE or an unsupported activation.
    """
    start_conversion(layer, config, layer_idx)
    attn = layer.attention
    h, head_dim, bias = config.num_attention_heads, attn.head_size, bool(config.attention_bias)
    block = _rotary_block(config, num_kv_heads=h, head_dim=head_dim,
                          placement="parallel_two_norms" if config.use_parallel_residual else "pre", norm="layer",
                          eps=config.layer_norm_eps, act=hf_act(config.hidden_act), bias=bias, ffn_bias=True,
                          ffn_num_hiddens=config.intermediate_size, rope_theta=unscaled_rope_theta(config, partial=True),
                          rotary_dim=attn.rotary_ndims)
    W = attn.query_key_value.weight.reshape(h, 3, head_dim, -1)
    b = attn.query_key_value.bias
    b = None if b is None else b.reshape(h, 3, head_dim)
    q, k, v = ((W[:, i].reshape(h * head_dim, -1), None if b is None else b[:, i].reshape(-1)) for i in range(3))
    copy_attention(block, q, k, v, attn.dense)
    copy_mlp(block, layer.mlp.dense_h_to_4h, layer.mlp.dense_4h_to_h)
    _copy_parallel_or_pre_norms(block, layer.input_layernorm, layer.post_attention_layernorm)
    return block.to(W).train(layer.training)


@converter("GPTJBlock")
def from_gptj_block(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``GPTJBlock`` (GPT-J-6B, 2021).

    Attention and MLP in parallel on one shared LayerNorm ``ln_1`` (``placement='parallel'``,
    eps ``config.layer_norm_epsilon``); no biases on q, k, v and the output projection, a
    plain MLP ``fc_out(gelu_new(fc_in(x)))`` *with* biases; RoPE with base 10,000 on the
    first ``config.rotary_dim`` features of each head (64 of 256 in GPT-J-6B) in the
    *interleaved* layout (``rotate_every_two``: pairs ``(2l, 2l + 1)``), converted to the
    block's half-split layout by permuting the rows of ``W_q`` and ``W_k``
    (:func:`rope_interleaved_to_half`).

    Args:
        layer, config: a ``GPTJBlock`` and its ``GPTJConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The ``'parallel'`` causal block with RoPE on the first ``rotary_dim`` features of each head, its
        ``W_q`` and ``W_k`` rows reordered to the half-split layout.

    Raises:
        ValueError: for an unsupported activation.
    """
    start_conversion(layer, config, layer_idx)
    attn = layer.attn
    block = _rotary_block(config, num_kv_heads=config.num_attention_heads, head_dim=attn.head_dim,
                          placement="parallel", norm="layer", eps=config.layer_norm_epsilon,
                          act=hf_act(config.activation_function), bias=False, ffn_bias=True,
                          ffn_num_hiddens=layer.mlp.fc_in.out_features, rope_theta=10000.0,
                          rotary_dim=config.rotary_dim)
    copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj, interleaved=config.rotary_dim)
    copy_mlp(block, layer.mlp.fc_in, layer.mlp.fc_out)
    copy_norm(block.addnorm1.norm_in, layer.ln_1)  # addnorm2 shares it
    return block.to(attn.q_proj.weight).train(layer.training)


@converter("FalconDecoderLayer")
def from_falcon_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``FalconDecoderLayer`` (Falcon, 2023).

    Three layouts, read from the config:

    * Falcon-7B (``parallel_attn``, ``multi_query``): attention and MLP in parallel on one
      shared ``input_layernorm`` (``placement='parallel'``), one key/value head; the fused
      ``query_key_value`` rows are ``[q (all heads); k; v]``.
    * Falcon-40B/180B (``new_decoder_architecture``): parallel, with ``ln_attn`` and
      ``ln_mlp`` (``'parallel_two_norms'``; with ``num_ln_in_parallel_attn=1`` one shared
      ``input_layernorm``), ``num_kv_heads`` key/value heads; fused rows grouped per
      key/value head, ``(groups, [q_1 .. q_{h/kv}, k, v], head_dim)``.
    * neither ``multi_query`` nor the new architecture: rows ``(heads, [q, k, v], head_dim)``;
      without ``parallel_attn`` the block is pre-LN (``input_layernorm``,
      ``post_attention_layernorm``).

    Full RoPE (half-split, ``FalconRotaryEmbedding`` ignores ``partial_rotary_factor``),
    exact GELU by default, biases on every projection when ``config.bias`` (Falcon: none).
    Falcon drops out the sum of the two branches once (``hidden_dropout``), which the
    block, dropping out each branch, cannot: a layer in training mode with a dropout > 0 is
    refused (:func:`start_conversion`); in eval mode dropout does nothing.

    Args:
        layer, config: a ``FalconDecoderLayer`` and its ``FalconConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The causal block.

    Raises:
        ValueError: for ALiBi (``config.alibi``, Falcon-RW), scaled RoPE or an unsupported
            activation.
    """
    start_conversion(layer, config, layer_idx)
    if config.alibi:
        raise ValueError("Falcon with alibi=True (ALiBi position biases, Falcon-RW) is not supported; "
                         "d2lmini implements RoPE")
    attn = layer.self_attention
    h, head_dim, d = config.num_attention_heads, attn.head_dim, config.hidden_size
    if config.new_decoder_architecture:
        kv = config.num_kv_heads
        placement = "parallel_two_norms" if hasattr(layer, "ln_attn") else "parallel"
    else:
        kv = 1 if config.multi_query else h
        placement = "parallel" if config.parallel_attn else "pre"
    block = _rotary_block(config, num_kv_heads=kv, head_dim=head_dim, placement=placement, norm="layer",
                          eps=config.layer_norm_epsilon, act=hf_act(config.activation), bias=bool(config.bias),
                          ffn_bias=bool(config.bias), ffn_num_hiddens=config.ffn_hidden_size,
                          rope_theta=unscaled_rope_theta(config, partial=True), rotary_dim=head_dim)
    W, b = attn.query_key_value.weight, attn.query_key_value.bias
    rows = torch.arange(W.shape[0], device=W.device)
    if config.new_decoder_architecture:  # (groups, [q_1 .. q_{h/kv}, k, v], head_dim)
        rows = rows.reshape(kv, h // kv + 2, head_dim)
        q_rows, k_rows, v_rows = rows[:, :-2], rows[:, -2], rows[:, -1]
    elif config.multi_query:  # [q; k; v], one key/value head
        q_rows, k_rows, v_rows = rows.split([d, head_dim, head_dim])
    else:  # (heads, [q, k, v], head_dim)
        rows = rows.reshape(h, 3, head_dim)
        q_rows, k_rows, v_rows = rows[:, 0], rows[:, 1], rows[:, 2]
    q, k, v = ((W[r.reshape(-1)], None if b is None else b[r.reshape(-1)]) for r in (q_rows, k_rows, v_rows))
    copy_attention(block, q, k, v, attn.dense)
    copy_mlp(block, layer.mlp.dense_h_to_4h, layer.mlp.dense_4h_to_h)
    if placement == "parallel_two_norms":
        _copy_parallel_or_pre_norms(block, layer.ln_attn, layer.ln_mlp)
    else:
        _copy_parallel_or_pre_norms(block, layer.input_layernorm, getattr(layer, "post_attention_layernorm", None))
    return block.to(W).train(layer.training)


@converter("CohereDecoderLayer")
def from_cohere_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``CohereDecoderLayer`` (Cohere Command R, 2024).

    Attention and a SwiGLU MLP in parallel on one shared LayerNorm *without bias*
    (``placement='parallel'``, ``norm='layer_no_bias'``; ``CohereLayerNorm``, eps
    ``config.layer_norm_eps``), grouped-query attention with biases when
    ``config.attention_bias`` (the MLP has none), and full RoPE in the *interleaved*
    layout (``CohereRotaryEmbedding`` repeats each frequency twice, ``repeat_interleave``,
    and ``rotate_half`` pairs ``(2l, 2l + 1)``), converted to the half-split layout by
    permuting the rows of ``W_q`` and ``W_k`` and of their biases
    (:func:`rope_interleaved_to_half`). Command R's ``logit_scale`` multiplies the LM
    head's logits, outside the decoder layers.

    Args:
        layer, config: a ``CohereDecoderLayer`` and its ``CohereConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The ``'parallel'`` causal block.

    Raises:
        ValueError: for ``use_qk_norm`` (Command R+'s QK-norm is a mean-subtracting
            LayerNorm with a distinct gain per head; d2lmini's QK-norms are RMSNorms),
            scaled RoPE or an unsupported gated activation.
    """
    start_conversion(layer, config, layer_idx)
    _refuse_layernorm_qk_norm(config, "Cohere", "use_qk_norm")
    attn, mlp = layer.self_attn, layer.mlp
    block = _rotary_block(config, num_kv_heads=config.num_key_value_heads, head_dim=attn.head_dim,
                          placement="parallel", norm="layer_no_bias", eps=config.layer_norm_eps,
                          act=gated_act(config.hidden_act), bias=bool(config.attention_bias), ffn_bias=False,
                          ffn_num_hiddens=config.intermediate_size, rope_theta=unscaled_rope_theta(config, partial=True),
                          rotary_dim=attn.head_dim)
    copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, interleaved=attn.head_dim)
    copy_mlp(block, mlp.up_proj, mlp.down_proj, gate=mlp.gate_proj)
    copy_norm(block.addnorm1.norm_in, layer.input_layernorm)  # addnorm2 shares it
    return block.to(attn.q_proj.weight).train(layer.training)


@converter("StableLmDecoderLayer")
def from_stablelm_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``StableLmDecoderLayer`` (StableLM 3B, StableLM 2; 2023-24).

    Pre-LN with LayerNorm (gain and bias, eps ``config.layer_norm_eps``), or with
    ``use_parallel_residual`` (StableLM 2 12B) attention and MLP in parallel on the one
    ``input_layernorm`` (``placement='parallel'``); grouped-query attention with biases on
    q, k and v only when ``use_qkv_bias`` (StableLM 2: ``bias='qkv'``), a SwiGLU MLP
    without biases, RoPE on the first ``int(head_dim * partial_rotary_factor)`` features
    of each head (0.25; ``StableLmAttention.rotary_ndims``), half-split. StableLM drops
    out only the MLP branch (``hidden_dropout``), which the block, dropping out each branch,
    cannot: a layer in training mode with a dropout > 0 is refused (:func:`start_conversion`); in
    eval mode dropout does nothing.

    Args:
        layer, config: a ``StableLmDecoderLayer`` and its ``StableLmConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The ``'pre'`` (or ``'parallel'``) causal block with partial RoPE.

    Raises:
        ValueError: for ``qk_layernorm`` (a LayerNorm per head, StableLM 2 12B; d2lmini's
            QK-norms are RMSNorms), scaled RoPE or an unsupported gated activation.
    """
    start_conversion(layer, config, layer_idx)
    _refuse_layernorm_qk_norm(config, "StableLM", "qk_layernorm")
    attn, mlp = layer.self_attn, layer.mlp
    block = _rotary_block(config, num_kv_heads=config.num_key_value_heads, head_dim=attn.head_dim,
                          placement="parallel" if config.use_parallel_residual else "pre", norm="layer",
                          eps=config.layer_norm_eps, act=gated_act(config.hidden_act),
                          bias="qkv" if config.use_qkv_bias else False, ffn_bias=False,
                          ffn_num_hiddens=config.intermediate_size, rope_theta=unscaled_rope_theta(config, partial=True),
                          rotary_dim=attn.rotary_ndims)
    copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    copy_mlp(block, mlp.up_proj, mlp.down_proj, gate=mlp.gate_proj)
    _copy_parallel_or_pre_norms(block, layer.input_layernorm, layer.post_attention_layernorm)
    return block.to(attn.q_proj.weight).train(layer.training)


# --------------------------------------------------------------------------- the family's tiny configurations

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    "phi": dict(TINY, num_key_value_heads=4, num_hidden_layers=1, partial_rotary_factor=0.5),
    "phi3": dict(TINY, num_key_value_heads=4, num_hidden_layers=1, sliding_window=WINDOW, pad_token_id=0),
    "phi4_mini": dict(TINY, num_hidden_layers=1, partial_rotary_factor=0.75, pad_token_id=0),  # Phi3Config
    "gpt_neox": dict(hidden_size=64, num_attention_heads=4, intermediate_size=160, num_hidden_layers=1,
                     rotary_pct=0.25),
    "gptj": dict(n_embd=64, n_head=2, n_inner=160, n_layer=1, rotary_dim=8),
    "falcon": dict(hidden_size=64, num_attention_heads=4, multi_query=True, parallel_attn=True,
                   new_decoder_architecture=False, alibi=False, bias=False, ffn_hidden_size=160, num_hidden_layers=1),
    "cohere": dict(TINY, num_hidden_layers=1),  # CohereConfig's default and the released model: no biases
    "stablelm": dict(TINY, num_hidden_layers=1, partial_rotary_factor=0.25, use_qkv_bias=True,
                     use_parallel_residual=False),
}


# --------------------------------------------------------------------------- the family's rows

_INTERLEAVED = "interleaved RoPE pairs (2l, 2l+1), converted by permuting the rows of W_q and W_k"

#: The layers of the family the zoo reproduces (:class:`~d2lmini.reference.base.LayerRow`): parallel
#: attention and FFN, partial and interleaved RoPE.
ROWS = (
    LayerRow("Phi-2", "Phi", 2023, "PhiDecoderLayer", "phi", "PhiConfig", "phi"),
    LayerRow("Phi-3 mini", "Phi", 2024, "Phi3DecoderLayer", "phi3", "Phi3Config", "phi3"),
    LayerRow("Phi-4-mini", "Phi", 2025, "Phi3DecoderLayer", "phi3", "Phi3Config", "phi4_mini",
             note="Phi3DecoderLayer with partial_rotary_factor=0.75"),
    LayerRow("GPT-NeoX", "GPT-NeoX", 2022, "GPTNeoXLayer", "gpt_neox", "GPTNeoXConfig", "gpt_neox",
             rotary="GPTNeoXRotaryEmbedding"),
    LayerRow("GPT-J", "GPT-J", 2021, "GPTJBlock", "gptj", "GPTJConfig", "gptj", rotary="GPTJRotaryEmbedding",
             note=_INTERLEAVED),
    LayerRow("Falcon-7B", "Falcon", 2023, "FalconDecoderLayer", "falcon", "FalconConfig", "falcon",
             attn_implementation="eager",  # SDPA does not broadcast the single key/value head
             call_kwargs={"alibi": None},  # FalconModel passes None for its RoPE models
             note="Falcon-40B/180B (new_decoder_architecture) convert to 'parallel_two_norms'"),
    LayerRow("Command R", "Cohere", 2024, "CohereDecoderLayer", "cohere", "CohereConfig", "cohere",
             note=_INTERLEAVED + "; logit_scale multiplies the logits (outside the layer)"),
    LayerRow("StableLM 2", "StableLM", 2024, "StableLmDecoderLayer", "stablelm", "StableLmConfig", "stablelm"),
)
