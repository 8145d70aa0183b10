"""The Llama family: pre-norm RMSNorm, grouped-query attention, RoPE and a gated MLP, and the models that change one thing.

The base is :func:`from_llama_layer` (Llama 3) on the shared mapping :func:`gated_decoder`
(``q/k/v/o_proj``, ``gate/up/down_proj``, RoPE read by
:func:`~d2lmini.reference.base.rope_kwargs`); relative to it Mistral adds a sliding window,
Ministral sets it per layer type, Ministral 3 adds YaRN and Llama 4-style query scaling, Qwen2
biases on q, k, v, Qwen3 per-head QK-norm and its own ``head_dim``, Granite two multipliers,
SmolLM3 NoPE layers, and StarCoder2 LayerNorm with biases and a plain MLP. OLMo, Gemma, Arcee
Trinity, gpt-oss and Llama 4 change more and have modules of their own.
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_bool, check_nonnegative_int, check_positive_float, check_positive_int
from ..attention import MultiHeadAttention
from ..block import TransformerBlock
from .base import (converter, copy_attention, copy_mlp, copy_norm, gated_act, hf_act, rope_kwargs, set_qk_norm_eps,
                   start_conversion, window_of)
from .base import LayerRow
from .tiny import TINY, WINDOW


def check_query_scaling(value) -> tuple:
    """Return ``query_scaling`` checked: ``(beta, period)`` or ``(beta, period, offset)`` (a float > 0, an int >= 1,
    an int >= 0) as a tuple, a triple with ``offset`` 0 as the pair.

    Raises:
        TypeError: not a pair or triple, or a member of the wrong type. ValueError: a member out of range.
    """
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
        raise TypeError("query_scaling must be None, a pair (beta, period) or a triple (beta, period, offset), "
                        f"got {type(value).__name__} {value!r}")
    out = (check_positive_float("query_scaling beta", value[0]), check_positive_int("query_scaling period", value[1]))
    offset = check_nonnegative_int("query_scaling offset", value[2]) if len(value) == 3 else 0
    return out + (offset,) if offset else out


class LlamaVariantAttention(MultiHeadAttention):
    """:class:`~d2lmini.attention.MultiHeadAttention` with the two options of Llama-family models that no chapter teaches.

    Args:
        num_hiddens, num_heads, ``**kwargs``: as :class:`~d2lmini.attention.MultiHeadAttention`.
        qkv_bias: ``True``: biases on ``W_q``, ``W_k`` and ``W_v`` only, ``W_o`` without one -- Qwen2
            (Hugging Face ``transformers`` 5.24 ``Qwen2Attention``: ``q/k/v_proj`` with ``bias=True``,
            ``o_proj`` without) and StableLM 2 (``use_qkv_bias``). Excludes ``bias=True``.
        query_scaling: ``None``, ``(beta, period)`` or ``(beta, period, offset)`` (a float ``beta > 0``,
            an int ``period >= 1``, an int ``offset >= 0``, default 0): after RoPE the query at position
            ``p`` is multiplied by ``1 + beta * log(1 + floor((p + offset) / period))``, so the logits
            grow as positions pass multiples of ``period``. ``(beta, period)`` is Ministral 3
            (``modeling_ministral3.get_llama_4_attn_scale`` with ``rope_parameters['llama_4_scaling_beta']``
            and ``['original_max_position_embeddings']``); ``(attn_scale, floor_scale, 1)`` is Llama 4's
            ``attn_temperature_tuning`` on its NoPE layers (``Llama4TextAttention.forward``). A triple
            with ``offset`` 0 is kept as the pair.

    Raises:
        ValueError / TypeError: as :class:`~d2lmini.attention.MultiHeadAttention`, ``qkv_bias`` with
            ``bias=True``, a bad ``query_scaling`` (:func:`check_query_scaling`).
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, qkv_bias: bool = False, query_scaling: tuple | None = None,
                 **kwargs):
        if check_bool("qkv_bias", qkv_bias) and kwargs.get("bias"):
            raise ValueError("qkv_bias=True puts biases on W_q, W_k and W_v only; it excludes bias=True")
        super().__init__(num_hiddens, num_heads, **{**kwargs, "bias": qkv_bias or kwargs.get("bias", False)})
        if qkv_bias:
            self.W_o.register_parameter("bias", None)  # Qwen2: o_proj has no bias
        self.query_scaling = None if query_scaling is None else check_query_scaling(query_scaling)

    def query_scales(self, num_steps: int, like: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The factors ``1 + beta * log(1 + floor((p + offset) / period))`` for ``p = start .. start + n - 1``.

        Computed in float32, cast to ``like``'s dtype; shape ``(num_steps, 1)`` (broadcasts over
        ``(b, h, n, head_dim)``). Raises ``ValueError`` without ``query_scaling``.
        """
        if self.query_scaling is None:
            raise ValueError("query_scales needs query_scaling=(beta, period) or (beta, period, offset)")
        beta, period, offset = (*self.query_scaling, 0)[:3]
        positions = torch.arange(start, start + num_steps, dtype=torch.float32, device=like.device) + offset
        return (1 + beta * torch.log(1 + torch.floor(positions / period)))[:, None].to(like.dtype)

    def queries_and_keys(self, queries: torch.Tensor, keys: torch.Tensor, start: int = 0):
        """As :meth:`MultiHeadAttention.queries_and_keys`, then the queries scaled by position (``query_scaling``)."""
        q, k = super().queries_and_keys(queries, keys, start)
        if self.query_scaling is not None:
            q = q * self.query_scales(q.shape[2], q, start)
        return q, k

    def extra_repr(self) -> str:
        return (super().extra_repr() + (", qkv_bias=True" if self.W_q.bias is not None and self.W_o.bias is None else "")
                + (f", query_scaling={self.query_scaling}" if self.query_scaling is not None else ""))


def gated_decoder(layer, config, placement: str, qk_norm: str | None, act: str = "swiglu",
                  unit_offset: bool = False, attn_scale: float | None = None,
                  layer_type: str | None = None, window: int | None = None,
                  residual_multiplier: float = 1.0, *, norm: str = "rms", eps: float | None = None,
                  bias: bool | str | None = None, rope: bool = True, query_scaling: bool = False,
                  attention: type = MultiHeadAttention, **attention_options) -> TransformerBlock:
    """Shared mapping of the Llama family (q/k/v/o_proj; gate/up/down_proj or c_fc/c_proj; RoPE).

    ``norm``/``eps`` are the block norms' type and epsilon (default RMSNorm with
    ``config.rms_norm_eps``, also the QK-norms' epsilon); ``bias`` is the attention's (q, k, v
    and o; ``'qkv'``: q, k, v, as :class:`LlamaVariantAttention`), default ``config.attention_bias``;
    the gated MLP has biases when ``config.mlp_bias`` (Llama, Granite, SmolLM3);
    ``rope=False`` is a NoPE layer, else the layer's RoPE (base, scaling and, with
    ``query_scaling``, Ministral 3's query scaling, as :func:`rope_kwargs` reads them); a plain
    MLP (``c_fc``/``c_proj``, StarCoder2) takes ``act`` as a plain activation and the attention's
    biases (``use_bias``). ``attn_scale`` is the attention's logit scale (``None``:
    ``1/sqrt(head_dim)``). The attention is an ``attention`` (a subclass of
    :class:`~d2lmini.attention.MultiHeadAttention`; :class:`LlamaVariantAttention` where ``bias='qkv'`` or
    ``query_scaling``) with ``attention_options`` too, handed to the block by ``attn_factory``. The block
    norms are *not* copied (their names differ by family: :func:`pre_norm_decoder`, OLMo's and Gemma's
    converters copy them).

    Returns:
        The causal :class:`~d2lmini.block.TransformerBlock` with the attention's, the MLP's and the
        QK-norms' weights copied (still on the CPU in float32: callers move it to the layer).

    Raises:
        ValueError: a RoPE type d2lmini does not reproduce (:func:`~d2lmini.reference.base.rope_kwargs`),
            or a weight whose shape or bias does not match (:func:`~d2lmini.reference.base.copy_linear`).
    """
    attn, mlp = layer.self_attn, layer.mlp
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rms_eps = getattr(config, "rms_norm_eps", None)
    bias = bool(getattr(config, "attention_bias", False)) if bias is None else bias
    plain = hasattr(mlp, "c_fc")  # a plain two-matrix MLP (StarCoder2), biased as the attention
    ffn_bias = bias is True if plain else bool(getattr(config, "mlp_bias", False))
    options = dict(num_kv_heads=config.num_key_value_heads, causal=True, head_dim=head_dim, qk_norm=qk_norm,
                   window=window, **(rope_kwargs(config, layer_type, query_scaling=query_scaling) if rope else {}),
                   **attention_options)
    if bias == "qkv" or query_scaling:
        attention = LlamaVariantAttention
    if bias == "qkv":
        options["qkv_bias"] = True
    else:
        options["bias"] = bias

    def make_attention():
        module = attention(config.hidden_size, config.num_attention_heads, **options)
        if attn_scale is not None:
            module.scale = float(attn_scale)
        return set_qk_norm_eps(module, rms_eps) if qk_norm else module

    block = TransformerBlock(config.hidden_size, config.num_attention_heads, norm=norm, placement=placement,
                             bias=ffn_bias, act=act, ffn_num_hiddens=config.intermediate_size,
                             eps=rms_eps if eps is None else eps, attn_factory=make_attention)
    block.set_scales(residual_multiplier=residual_multiplier)  # Granite's; 1.0 elsewhere
    copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    if plain:
        copy_mlp(block, mlp.c_fc, mlp.c_proj)
    else:
        copy_mlp(block, mlp.up_proj, mlp.down_proj, gate=mlp.gate_proj)
    if qk_norm is not None:
        copy_norm(block.attention.q_norm, attn.q_norm, unit_offset)
        copy_norm(block.attention.k_norm, attn.k_norm, unit_offset)
    return block


def pre_norm_decoder(layer, config, qk_norm: str | None = None, **kwargs) -> TransformerBlock:
    """The pre-norm Llama-family block of ``layer``: :func:`gated_decoder` with ``placement='pre'``, the gated
    activation of ``config.hidden_act``, and the norms ``input_layernorm`` and ``post_attention_layernorm``
    copied; on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: an activation :func:`~d2lmini.reference.base.gated_act` does not know, or as
            :func:`gated_decoder`.
    """
    block = gated_decoder(layer, config, "pre", qk_norm, act=gated_act(getattr(config, "hidden_act", "silu")),
                          **kwargs)
    copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    return block.to(layer.self_attn.q_proj.weight).train(layer.training)


@converter("LlamaDecoderLayer")
def from_llama_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``LlamaDecoderLayer`` (Llama 3).

    Pre-LN with RMSNorm, grouped-query attention, RoPE (``rope_theta``), SwiGLU, no biases.

    Args:
        layer, config: a ``LlamaDecoderLayer`` and its ``LlamaConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The pre-norm causal block with grouped-query attention and RoPE.

    Raises:
        ValueError: for a RoPE type d2lmini does not reproduce, MLP biases or an activation other than SiLU.
    """
    start_conversion(layer, config, layer_idx)
    return pre_norm_decoder(layer, config)


@converter("MistralDecoderLayer")
def from_mistral_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``MistralDecoderLayer`` (Mistral 7B).

    The Llama block plus sliding-window attention: ``window=config.sliding_window``
    (query ``i`` sees keys ``i - window < j <= i``, as ``transformers``'
    ``create_sliding_window_causal_mask``), or no window if it is ``None``.

    Args:
        layer, config: a ``MistralDecoderLayer`` and its ``MistralConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The pre-norm causal block with grouped-query attention, RoPE and the window.
    """
    start_conversion(layer, config, layer_idx)
    return pre_norm_decoder(layer, config, window=config.sliding_window)


@converter("MinistralDecoderLayer")
def from_ministral_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``MinistralDecoderLayer`` (Ministral 8B, 2024).

    The Mistral block whose window is set per layer: ``config.layer_types[layer_idx]``
    ``'sliding_attention'`` gives ``window=config.sliding_window``, ``'full_attention'``
    no window (``MinistralAttention.sliding_window``; ``MinistralModel`` builds the
    matching mask per layer type).

    Args:
        layer, config: a ``MinistralDecoderLayer`` and its ``MinistralConfig``.
        layer_idx: the layer's position in the stack (selects its layer type); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`start_conversion`).

    Returns:
        The pre-norm causal block, windowed on sliding layers.

    Raises:
        ValueError: for a RoPE type d2lmini does not reproduce or a ``layer_idx`` outside ``config.layer_types``.
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    return pre_norm_decoder(layer, config, window=window_of(config, layer_idx))


@converter("Ministral3DecoderLayer")
def from_ministral3_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Ministral3DecoderLayer`` (Ministral 3, 2025).

    The Mistral block (pre-norm RMSNorm, grouped-query attention, SwiGLU, no biases) with
    YaRN-scaled RoPE (``rope_scaling`` read from ``config.rope_parameters`` by
    :func:`rope_kwargs`) and Llama 4-style position-dependent query scaling: after RoPE
    the query at position ``p`` is multiplied by ``1 + beta * log(1 + floor(p / L))``,
    ``query_scaling=(beta, L)`` with ``beta = rope_parameters['llama_4_scaling_beta']`` and
    ``L = rope_parameters['original_max_position_embeddings']``
    (``modeling_ministral3.get_llama_4_attn_scale``); ``window=config.sliding_window`` on
    every layer when it is set (``Ministral3Attention`` passes it to every layer, and
    ``Ministral3Model`` builds one sliding-window mask for all of them).

    Args:
        layer, config: a ``Ministral3DecoderLayer`` and its ``Ministral3Config``.
        layer_idx: the layer's position in the stack (every layer is alike); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`start_conversion`).

    Returns:
        The pre-norm causal block with scaled RoPE and query scaling.

    Raises:
        ValueError: for ``rope_parameters`` without ``llama_4_scaling_beta`` or
            ``original_max_position_embeddings`` (the layer needs both), a RoPE type d2lmini
            does not reproduce, or MLP biases.
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    return pre_norm_decoder(layer, config, window=config.sliding_window, query_scaling=True)


@converter("Qwen2DecoderLayer")
def from_qwen2_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Qwen2DecoderLayer`` (Qwen2, 2024).

    The Llama block with biases on the query, key and value projections only
    (``bias='qkv'``; ``Qwen2Attention``'s ``o_proj`` has none). With
    ``use_sliding_window`` the layers from ``max_window_layers`` on are
    ``'sliding_attention'`` in ``config.layer_types`` and get ``window=config.sliding_window``.

    Args:
        layer, config: a ``Qwen2DecoderLayer`` and its ``Qwen2Config``.
        layer_idx: the layer's position in the stack (selects its layer type); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`start_conversion`).

    Returns:
        The pre-norm causal block with q/k/v biases.

    Raises:
        ValueError: for a RoPE type d2lmini does not reproduce or a ``layer_idx`` outside ``config.layer_types``.
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    return pre_norm_decoder(layer, config, bias="qkv", window=window_of(config, layer_idx))


@converter("Qwen3DecoderLayer")
def from_qwen3_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Qwen3DecoderLayer`` (Qwen3, 2025).

    As Llama, plus QK-norm per head with one gain shared by all heads, and a
    ``head_dim`` set independently of ``hidden_size / num_attention_heads``.

    Args:
        layer, config: a ``Qwen3DecoderLayer`` and its ``Qwen3Config``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The Llama-style block with per-head QK-norm.

    Raises:
        ValueError: for a sliding-window configuration (``use_sliding_window``), a RoPE type d2lmini does not reproduce.
    """
    start_conversion(layer, config, layer_idx)
    if getattr(config, "use_sliding_window", False):
        raise ValueError("Qwen3's use_sliding_window is not supported")
    return pre_norm_decoder(layer, config, "per_head")


@converter("GraniteDecoderLayer")
def from_granite_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``GraniteDecoderLayer`` (IBM Granite 3.0, 2024).

    The Llama block with ``residual_multiplier`` scaling both branches
    (``x + m * F(Norm(x))``) and ``attention_multiplier`` as the logit scale
    (the attention's ``scale``) instead of ``1/sqrt(head_dim)``. Granite's two other multipliers,
    ``embedding_multiplier`` (on the token embeddings) and ``logits_scaling`` (dividing
    the LM head's logits), act outside the decoder layers and are not part of the block.

    Args:
        layer, config: a ``GraniteDecoderLayer`` and its ``GraniteConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The pre-norm causal block with both multipliers.

    Raises:
        ValueError: for MLP biases or a RoPE type d2lmini does not reproduce.
    """
    start_conversion(layer, config, layer_idx)
    return pre_norm_decoder(layer, config, attn_scale=config.attention_multiplier,
                            residual_multiplier=config.residual_multiplier)


@converter("SmolLM3DecoderLayer")
def from_smollm3_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``SmolLM3DecoderLayer`` (SmolLM3, 2025).

    The Llama block, except on the NoPE layers: ``config.no_rope_layers[layer_idx] == 0``
    means the layer applies no rotary embedding (``SmolLM3Attention.use_rope``), so the
    block gets ``rope_theta=None``. A ``'sliding_attention'`` layer of ``config.layer_types``
    (by default, with ``use_sliding_window``, the RoPE layers) gets ``window=config.sliding_window``:
    ``SmolLM3Model`` builds the sliding-window mask for those layers whatever
    ``use_sliding_window`` says (``SmolLM3Attention.sliding_window``, read only by
    flash-attention kernels, also requires it), and the block follows the mask (SDPA, eager).

    Args:
        layer, config: a ``SmolLM3DecoderLayer`` and its ``SmolLM3Config``.
        layer_idx: the layer's position in the stack (selects RoPE or NoPE, and the window); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`start_conversion`).

    Returns:
        The pre-norm causal block, with or without RoPE.

    Raises:
        ValueError: for a RoPE type d2lmini does not reproduce or a ``layer_idx`` outside ``config.layer_types``
            or ``config.no_rope_layers``.
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    window = window_of(config, layer_idx)  # as SmolLM3Model's masks, whatever use_sliding_window says
    if not 0 <= layer_idx < len(config.no_rope_layers):
        raise ValueError(f"layer_idx={layer_idx} is outside config.no_rope_layers "
                         f"(length {len(config.no_rope_layers)})")
    return pre_norm_decoder(layer, config, rope=bool(config.no_rope_layers[layer_idx]), window=window)


@converter("Starcoder2DecoderLayer")
def from_starcoder2_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Starcoder2DecoderLayer`` (StarCoder2, 2024).

    Pre-LN with LayerNorm (gain and bias, eps ``config.norm_epsilon``), grouped-query
    attention with RoPE and ``window=config.sliding_window`` (``None``: none), a plain
    two-matrix MLP ``c_proj(act(c_fc(x)))`` (tanh GELU in StarCoder2), biases on every
    projection when ``config.use_bias``.

    Args:
        layer, config: a ``Starcoder2DecoderLayer`` and its ``Starcoder2Config``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The pre-LN causal block.

    Raises:
        ValueError: for an unsupported activation or a RoPE type d2lmini does not reproduce.
    """
    start_conversion(layer, config, layer_idx)
    block = gated_decoder(layer, config, "pre", None, act=hf_act(config.hidden_act), norm="layer",
                          eps=config.norm_epsilon, bias=bool(config.use_bias), window=config.sliding_window)
    copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    return block.to(layer.self_attn.q_proj.weight).train(layer.training)


# --------------------------------------------------------------------------- the family's tiny configurations

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    # released Llama 3's base and eps (LlamaConfig's defaults are 10,000 and 1e-6)
    "llama": dict(TINY, num_hidden_layers=1, rope_theta=500000.0, rms_norm_eps=1e-5),
    "qwen3": dict(TINY, num_hidden_layers=1, head_dim=32, rope_theta=1000000.0),  # released Qwen3's base
    "mistral": dict(TINY, num_hidden_layers=1, sliding_window=WINDOW, rope_theta=10000.0),
    "starcoder2": dict(TINY, num_hidden_layers=1, sliding_window=WINDOW, bos_token_id=None, eos_token_id=None),
    "qwen2": dict(TINY, num_hidden_layers=1, use_sliding_window=False),
    "ministral": dict(TINY, num_hidden_layers=2, head_dim=16, sliding_window=WINDOW,  # head_dim: no default
                      layer_types=["full_attention", "sliding_attention"]),
    "granite": dict(TINY, num_hidden_layers=1, residual_multiplier=0.22, attention_multiplier=0.0078,
                    embedding_multiplier=12.0, logits_scaling=8.0),
    "smollm3": dict(TINY, num_hidden_layers=4),  # layers 0-2 RoPE, 3 NoPE (no_rope_layer_interval=4)
    # Ministral 3: YaRN over an "original" context of 4 positions, so the query scaling 1 + beta log(1 + floor(p / 4))
    # changes within the 16 test steps (the released models: 16384, factor 16).
    "ministral3": dict(TINY, num_hidden_layers=1, head_dim=16, max_position_embeddings=64,
                       rope_parameters=dict(rope_type="yarn", rope_theta=1_000_000.0, factor=16.0,
                                            original_max_position_embeddings=4, beta_fast=32.0, beta_slow=1.0,
                                            mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)),
}


# --------------------------------------------------------------------------- the family's rows

#: The layers of the family the zoo reproduces (:class:`~d2lmini.reference.base.LayerRow`).
ROWS = (
    LayerRow("Mistral 7B", "Mistral", 2023, "MistralDecoderLayer", "mistral", "MistralConfig", "mistral"),
    LayerRow("StarCoder2", "StarCoder", 2024, "Starcoder2DecoderLayer", "starcoder2", "Starcoder2Config",
             "starcoder2"),
    LayerRow("Llama 3", "Llama", 2024, "LlamaDecoderLayer", "llama", "LlamaConfig", "llama", reference="Llama 3"),
    LayerRow("Qwen2", "Qwen", 2024, "Qwen2DecoderLayer", "qwen2", "Qwen2Config", "qwen2"),
    LayerRow("Ministral 8B (sliding)", "Mistral", 2024, "MinistralDecoderLayer", "ministral", "MinistralConfig",
             "ministral", layer_idx=1),
    LayerRow("Ministral 8B (full)", "Mistral", 2024, "MinistralDecoderLayer", "ministral", "MinistralConfig",
             "ministral", layer_idx=0),
    LayerRow("Granite 3.0", "Granite", 2024, "GraniteDecoderLayer", "granite", "GraniteConfig", "granite",
             note="embedding_multiplier and logits_scaling act on the embeddings and logits (outside the layer)"),
    LayerRow("Qwen3", "Qwen", 2025, "Qwen3DecoderLayer", "qwen3", "Qwen3Config", "qwen3", reference="Qwen3"),
    LayerRow("SmolLM3 (RoPE)", "SmolLM", 2025, "SmolLM3DecoderLayer", "smollm3", "SmolLM3Config", "smollm3"),
    LayerRow("SmolLM3 (NoPE)", "SmolLM", 2025, "SmolLM3DecoderLayer", "smollm3", "SmolLM3Config", "smollm3",
             layer_idx=3, note="every fourth layer has no positional encoding"),
    LayerRow("Ministral 3", "Mistral", 2025, "Ministral3DecoderLayer", "ministral3", "Ministral3Config",
             "ministral3"),
)
