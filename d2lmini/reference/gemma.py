"""Gemma 2, 3 and 4: the Llama block in a sandwich of RMSNorms, with gains stored as ``w`` in ``1 + w``.

Relative to :func:`~d2lmini.reference.llama.from_llama_layer`: a norm before *and* after each
sublayer (``placement='sandwich'``), RMSNorm gains applied as ``1 + w`` (Gemma 2, 3), the logit
scale ``query_pre_attn_scalar ** -0.5``, GeGLU, local (sliding-window) and global layers with
their own RoPE; Gemma 2 soft-caps the attention logits, Gemma 3 adds per-head QK-norm, and
Gemma 4 applies its gains as ``w``, norms the values, scales the layer's output and gives its
global layers their own head width and proportional RoPE.
"""

from __future__ import annotations

import torch

from .._checks import check_bool, check_positive_float
from ..attention import MultiHeadAttention
from ..block import TransformerBlock
from ..norms import DEFAULT_EPS, unweighted_rms_norm
from .base import (converter, copy_linear, copy_mlp, copy_norm, gated_act, layer_type_of, rope_kwargs,
                   set_qk_norm_eps, start_conversion, window_of)
from .base import LayerRow, Row2026
from .llama import gated_decoder
from .tiny import TINY, WINDOW


class GemmaAttention(MultiHeadAttention):
    r""":class:`~d2lmini.attention.MultiHeadAttention` with Gemma's options that no chapter teaches.

    Args:
        num_hiddens, num_heads, ``**kwargs``: as :class:`~d2lmini.attention.MultiHeadAttention`.
        logit_softcap: ``None`` or a float ``c > 0``: Gemma 2's attention-logit soft-capping
            (``attn_logit_softcapping``; Hugging Face ``transformers`` 5.24
            ``modeling_gemma2.eager_attention_forward``), ``logits = tanh(logits / c) * c`` on the
            scaled logits, before the mask and the softmax. The fused kernel cannot cap, so
            :meth:`attend` then computes attention explicitly: matmul, cap, mask, float32 softmax,
            dropout, matmul.
        value_norm: ``True``: each value head divided by its root mean square, without a gain,
            ``v / sqrt(mean(v**2) + eps)`` (float32, cast back) -- Gemma 4's ``v_norm``
            (``modeling_gemma4.Gemma4TextAttention``: ``Gemma4RMSNorm(head_dim, with_scale=False)``).
        k_eq_v: ``True``: no value projection (``W_v`` is ``None``); the values are ``W_k`` of the
            ``values`` input, before the key's QK-norm and RoPE -- the global layers of Gemma 4 with
            ``attention_k_eq_v`` (``v_proj`` is ``None``, ``value_states = key_states`` before ``k_norm``).
        eps: the epsilon of the value norm (Gemma 4: ``rms_norm_eps``).

    Raises:
        ValueError / TypeError: as :class:`~d2lmini.attention.MultiHeadAttention`, ``logit_softcap`` not a
            finite float > 0, ``eps`` not a finite float > 0.
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, logit_softcap: float | None = None,
                 value_norm: bool = False, k_eq_v: bool = False, eps: float = DEFAULT_EPS["rms"], **kwargs):
        super().__init__(num_hiddens, num_heads, **kwargs)
        self.logit_softcap = None if logit_softcap is None else check_positive_float("logit_softcap", logit_softcap)
        self.value_norm, self.k_eq_v = check_bool("value_norm", value_norm), check_bool("k_eq_v", k_eq_v)
        self.eps = check_positive_float("eps", eps)
        if self.k_eq_v:
            self.W_v = None

    def value_heads(self, values: torch.Tensor) -> torch.Tensor:
        """The value heads: ``W_k``'s projection with ``k_eq_v``, each head over its RMS with ``value_norm``."""
        if self.k_eq_v:
            v = self.W_k(values).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        else:
            v = super().value_heads(values)
        return unweighted_rms_norm(v, self.eps, rounding="float32") if self.value_norm else v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
        """The kernel; with ``logit_softcap``, explicit as ``eager_attention_forward`` (sinks join after the cap)."""
        if self.logit_softcap is None:
            return super().attend(q, k, v, mask)
        group = self.num_heads // self.num_kv_heads  # grouped-query attention: share the key/value heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        logits = q @ k.transpose(-1, -2) * self.logit_scale
        logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        if self.sinks is not None:  # one more logit per head and query, not capped, dropped after the softmax
            sinks = self.sinks.to(logits.dtype)[:, None, None].expand(*logits.shape[:-1], 1)
            weights = torch.softmax(torch.cat((logits, sinks), dim=-1), dim=-1, dtype=torch.float32)[..., :-1].to(q.dtype)
        else:
            weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(q.dtype)
        dropout_p = self.dropout if self.training else 0.0
        return torch.nn.functional.dropout(weights, p=dropout_p, training=dropout_p > 0) @ v

    def extra_repr(self) -> str:
        return (super().extra_repr() + (f", logit_softcap={self.logit_softcap}" if self.logit_softcap is not None else "")
                + (", value_norm=True" if self.value_norm else "") + (", k_eq_v=True" if self.k_eq_v else ""))


def _sandwich_decoder(layer, config, qk_norm: str | None, layer_idx: int, **kwargs) -> TransformerBlock:
    """The Gemma 2/3 mapping: sandwich RMSNorms with ``1 + w`` gains, scale ``query_pre_attn_scalar ** -0.5``."""
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError("bidirectional Gemma layers (use_bidirectional_attention) are not supported")
    block = gated_decoder(layer, config, "sandwich", qk_norm, act=gated_act(config.hidden_activation),
                          unit_offset=True, attn_scale=config.query_pre_attn_scalar ** -0.5,
                          layer_type=layer_type_of(config, layer_idx), window=window_of(config, layer_idx),
                          attention=GemmaAttention, **kwargs)
    copy_norm(block.addnorm1.norm_in, layer.input_layernorm, unit_offset=True)
    copy_norm(block.addnorm1.norm_out, layer.post_attention_layernorm, unit_offset=True)
    copy_norm(block.addnorm2.norm_in, layer.pre_feedforward_layernorm, unit_offset=True)
    copy_norm(block.addnorm2.norm_out, layer.post_feedforward_layernorm, unit_offset=True)
    return block.to(layer.input_layernorm.weight).train(layer.training)


@converter("Gemma2DecoderLayer")
def from_gemma2_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Gemma2DecoderLayer`` (Gemma 2, 2024).

    Sandwich placement (RMSNorm before and after each sublayer) with gains applied as
    ``1 + w``, GeGLU with tanh GELU, logit scale ``query_pre_attn_scalar ** -0.5``,
    attention-logit soft-capping ``logit_softcap=config.attn_logit_softcapping``, one
    RoPE base for all layers, and on ``'sliding_attention'`` layers (``config.layer_types``;
    Gemma 2 alternates local and global) ``window=config.sliding_window``. The final-logit
    soft-capping and the embedding scale ``sqrt(d)`` act outside the decoder layers.

    Args:
        layer, config: a ``Gemma2DecoderLayer`` and its ``Gemma2Config``.
        layer_idx: the layer's position in the stack (selects local or global); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`start_conversion`).

    Returns:
        The ``'sandwich'`` block.

    Raises:
        ValueError: for bidirectional attention, a RoPE type d2lmini does not reproduce, or a ``layer_idx`` outside
            ``config.layer_types``.
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    return _sandwich_decoder(layer, config, None, layer_idx,
                             logit_softcap=config.attn_logit_softcapping)


@converter("Gemma3DecoderLayer")
def from_gemma3_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Gemma3DecoderLayer`` (Gemma 3, 2025).

    Sandwich placement (RMSNorm before and after each sublayer), gains applied as
    ``1 + w``, QK-norm per head (shared gain), logit scale
    ``query_pre_attn_scalar ** -0.5``, GeGLU with tanh GELU. A global
    (``'full_attention'``) layer uses ``rope_parameters['full_attention']``; a local
    (``'sliding_attention'``) layer gets ``window=config.sliding_window`` and the local
    RoPE base ``rope_parameters['sliding_attention']`` (``rope_local_base_freq`` in
    older configs).

    Args:
        layer, config: a ``Gemma3DecoderLayer`` and its ``Gemma3TextConfig``.
        layer_idx: the layer's position in the stack (selects local or global); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`start_conversion`).

    Returns:
        The ``'sandwich'`` block with per-head QK-norm.

    Raises:
        ValueError: for logit soft-capping, bidirectional attention, a RoPE type d2lmini does not reproduce, or a
            ``layer_idx`` outside ``config.layer_types``.
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ValueError("attention logit soft-capping is not supported for Gemma 3")
    return _sandwich_decoder(layer, config, "per_head", layer_idx)


@converter("Gemma4TextDecoderLayer")
def from_gemma4_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Gemma4TextDecoderLayer`` (Gemma 4, 2026).

    ``transformers`` 5.24 ``models/gemma4/modeling_gemma4.py`` (``Gemma4TextDecoderLayer``,
    ``Gemma4TextAttention``, ``Gemma4RMSNorm``): Gemma's sandwich placement (RMSNorm before and
    after each sublayer), but with gains applied as ``w`` (``Gemma4RMSNorm``; Gemma 2/3 use
    ``1 + w``); QK-norm per head (gains ``w``) and a gainless RMSNorm on each value head
    (``value_norm=True``); logit scale ``attn.scaling`` (1.0: the QK-norms set the logits'
    size); GeGLU with tanh GELU; the whole output times the layer's ``layer_scalar`` buffer
    (:meth:`~d2lmini.block.TransformerBlock.set_scales`). A local (``'sliding_attention'``) layer gets
    ``window=config.sliding_window`` and ``rope_parameters['sliding_attention']``; a global
    (``'full_attention'``) layer has its own head width and key/value heads
    (``config.per_layer_config``: ``global_head_dim``, ``num_global_key_value_heads``, read
    from the layer's projections), ``rope_parameters['full_attention']`` -- proportional RoPE
    (``rope_scaling={'rope_type': 'proportional', 'partial_rotary_factor': 0.25}`` by
    default) -- and, with ``config.attention_k_eq_v``, no value projection
    (``k_eq_v=True``). The MLP's width is read from the layer (``use_double_wide_mlp``
    doubles it in key/value-sharing layers, which are refused anyway).

    Args:
        layer, config: a ``Gemma4TextDecoderLayer`` and its ``Gemma4TextConfig``.
        layer_idx: ``None`` (the layer's own) or that index (:func:`start_conversion`).

    Returns:
        The ``'sandwich'`` causal block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: per-layer inputs (``config.hidden_size_per_layer_input`` set: the layer
            takes a second input, ``per_layer_input``, which ``TransformerBlock(X, valid_lens)``
            has no place for), the mixture-of-experts FFN (``config.enable_moe_block``), a layer
            that reuses an earlier layer's keys and values (``config.num_kv_shared_layers``),
            ``use_bidirectional_attention='all'``, a RoPE type d2lmini does not reproduce, or as
            :func:`start_conversion`.
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    attn = layer.self_attn
    if layer.hidden_size_per_layer_input:
        raise ValueError(f"Gemma 4's per-layer inputs (hidden_size_per_layer_input="
                         f"{layer.hidden_size_per_layer_input}) are a second input to the layer, which "
                         "TransformerBlock(X, valid_lens) cannot take; set hidden_size_per_layer_input=0")
    if layer.enable_moe_block:
        raise ValueError("Gemma 4's mixture-of-experts block (enable_moe_block=True) is not reproduced")
    if attn.is_kv_shared_layer:
        raise ValueError(f"layer {layer_idx} reuses the keys and values of an earlier layer "
                         f"(num_kv_shared_layers={config.num_kv_shared_layers}), an input from outside the block")
    if getattr(config, "use_bidirectional_attention", None) == "all":
        raise ValueError("bidirectional Gemma 4 layers (use_bidirectional_attention='all') are not supported")
    d, head_dim = config.hidden_size, attn.head_dim
    bias = bool(config.attention_bias)
    act, width = gated_act(config.hidden_activation), layer.mlp.intermediate_size

    def attention():
        module = GemmaAttention(d, config.num_attention_heads, bias=bias, num_kv_heads=attn.k_proj.out_features // head_dim,
                                head_dim=head_dim, causal=True, qk_norm="per_head", window=window_of(config, layer_idx),
                                value_norm=True, k_eq_v=attn.v_proj is None, eps=config.rms_norm_eps,
                                **rope_kwargs(config.per_layer_config[layer_idx], layer_type_of(config, layer_idx)))
        module.scale = float(attn.scaling)
        return set_qk_norm_eps(module, config.rms_norm_eps)

    block = TransformerBlock(d, config.num_attention_heads, norm="rms", placement="sandwich", act=act,
                             ffn_num_hiddens=width, eps=config.rms_norm_eps, attn_factory=attention)
    block.set_scales(layer_scalar=float(layer.layer_scalar))
    ours = block.attention
    for name, src in (("W_q", attn.q_proj), ("W_k", attn.k_proj), ("W_v", attn.v_proj), ("W_o", attn.o_proj)):
        if src is not None:
            copy_linear(getattr(ours, name), src.weight, src.bias, name=name)
    copy_norm(ours.q_norm, attn.q_norm)
    copy_norm(ours.k_norm, attn.k_norm)
    copy_mlp(block, layer.mlp.up_proj, layer.mlp.down_proj, layer.mlp.gate_proj)
    copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    copy_norm(block.addnorm1.norm_out, layer.post_attention_layernorm)
    copy_norm(block.addnorm2.norm_in, layer.pre_feedforward_layernorm)
    copy_norm(block.addnorm2.norm_out, layer.post_feedforward_layernorm)
    return block.to(attn.q_proj.weight).train(layer.training)


# --------------------------------------------------------------------------- the family's tiny configurations

_GEMMA = dict(TINY, head_dim=32, query_pre_attn_scalar=24, sliding_window=WINDOW)

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    # one global layer; "gemma3_sliding" has a local layer before it
    "gemma3": dict(TINY, num_hidden_layers=1, head_dim=32, query_pre_attn_scalar=24, layer_types=["full_attention"]),
    "gemma3_sliding": dict(_GEMMA, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"]),
    "gemma2": dict(_GEMMA, num_hidden_layers=2, attn_logit_softcapping=5.0),  # layer types: local, global
    # Gemma 4 without per-layer inputs: local (sliding, window 5, head width 8, 2 key/value heads, plain RoPE) and
    # global layers (head width 16, one key/value head, keys as values, proportional RoPE on a quarter of the
    # pairs) alternate; four layers, so that the two tested ones (0 and 1) are not the last of their type, which
    # store their keys and values for later layers.
    "gemma4": dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=40,
                   num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=5,
                   hidden_size_per_layer_input=0, global_head_dim=16, num_global_key_value_heads=1,
                   attention_k_eq_v=True, max_position_embeddings=64, vocab_size=16, rms_norm_eps=1e-6),
}


# --------------------------------------------------------------------------- the family's rows

_SQRT_D = "embeddings scaled by sqrt(d)"

#: The layers of the family the zoo reproduces (:class:`~d2lmini.reference.base.LayerRow`).
ROWS = (
    LayerRow("Gemma 2 (local)", "Gemma", 2024, "Gemma2DecoderLayer", "gemma2", "Gemma2Config", "gemma2", layer_idx=0,
             attn_implementation="eager", unit_offset_norms=True,
             note=_SQRT_D + "; final-logit soft-capping (outside the layer)"),
    LayerRow("Gemma 2 (global)", "Gemma", 2024, "Gemma2DecoderLayer", "gemma2", "Gemma2Config", "gemma2", layer_idx=1,
             attn_implementation="eager", unit_offset_norms=True,
             note=_SQRT_D + "; final-logit soft-capping (outside the layer)"),
    LayerRow("Gemma 3 (local)", "Gemma", 2025, "Gemma3DecoderLayer", "gemma3", "Gemma3TextConfig", "gemma3_sliding",
             layer_idx=0, unit_offset_norms=True, note=_SQRT_D + " (outside the layer)"),
    LayerRow("Gemma 3 (global)", "Gemma", 2025, "Gemma3DecoderLayer", "gemma3", "Gemma3TextConfig", "gemma3",
             unit_offset_norms=True, note=_SQRT_D + " (outside the layer)", reference="Gemma 3"),
)


def verify_gemma4(seed: int) -> list[dict]:
    """Gemma 4's decoder layers (0: local, sliding; 1: global) of a tiny configuration against their
    conversions: two comparison results."""
    from .harness import compare_with_reference, hf_reference
    from .tiny import tiny_config

    return [compare_with_reference(hf_reference(f"Gemma 4 (layer {i})", "gemma4", "Gemma4TextDecoderLayer",
                                                "Gemma4TextConfig", tiny_config("gemma4"), layer_idx=i), seed=seed)
            for i in (0, 1)]


#: The family's models in the zoo's 2026 table (:class:`~d2lmini.reference.base.Row2026`). ``size`` is
#: ``None``: the class docstring names gemma-4-e2b-it, whose width and depth differ from the defaults.
ROWS_2026 = (
    Row2026("Gemma 4", 2026, "", "Gemma4TextConfig",
            dict(norm="RMSNorm, sandwich", qk_norm="QK-norm per head; RMSNorm without gain on the values"), None,
            check="Gemma 4 (local and global layers, dense)", verify=verify_gemma4,
            missing="per-layer inputs (a second input to each layer), the MoE block (26B-A4B) and key/value "
                    "sharing across layers"),
)
