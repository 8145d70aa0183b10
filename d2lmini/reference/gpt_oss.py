"""OpenAI gpt-oss: the Llama block with attention sinks, biases, YaRN and a mixture of clamped-SwiGLU experts.

Relative to :func:`~d2lmini.reference.llama.from_llama_layer`: biases on q, k, v and o, a learned
sink logit per head joining every softmax, alternating sliding and full layers, and a
mixture of experts whose experts are stored fused and interleaved (:func:`copy_gptoss_experts`).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .._checks import check_positive_float
from ..block import TransformerBlock
from ..ffn import FeedForward
from ..moe import MixtureOfExperts
from .base import (converter, copy_attention, copy_linear, copy_norm, copy_weight, rope_kwargs, start_conversion,
                   window_of)
from .base import LayerRow, Row2026
from .tiny import TINY, WINDOW


#: gpt-oss's Swish slope: its gate is ``z * sigmoid(1.702 z)`` (the sigmoid approximation
#: of GELU, Hendrycks & Gimpel 2016), where SwiGLU's SiLU is ``z * sigmoid(z)``.
SWIGLU_CLAMPED_ALPHA = 1.702
#: gpt-oss's default ``swiglu_limit``.
SWIGLU_CLAMPED_LIMIT = 7.0


class ClampedSwiGLU(FeedForward):
    r"""The clamped SwiGLU FFN of gpt-oss and DeepSeek-V4: :class:`~d2lmini.ffn.FeedForward` with its gate and linear
    half clamped.

    With ``g = min(W_g x, L)`` and ``u = clamp(W_1 x, -L, L)`` for the limit ``L = swiglu_limit``:

    * gpt-oss (``alpha=1.702``; Hugging Face ``transformers`` 5.24 ``GptOssExperts._apply_gate``):
      ``W_2(g sigmoid(alpha g) * (u + 1))``, a Swish gate of slope ``alpha`` times the clamped linear
      half plus one; its ``act`` is ``'swiglu_clamped'``. (gpt-oss stores ``W_g`` and ``W_1`` fused and
      interleaved, gate in the even columns; see :func:`copy_gptoss_experts`.)
    * DeepSeek-V4 (``alpha=None``; ``DeepseekV4MLP`` and ``DeepseekV4Experts._apply_gate``,
      ``swiglu_limit = 10``): ``W_2(SiLU(g) * u)``, the same clamps without the slope and the ``+ 1``;
      its ``act`` is ``'swiglu'``.

    Without the clamps, the ``+ 1`` and with slope 1 it is SwiGLU.

    Args:
        num_hiddens, ffn_num_hiddens, bias, dropout: as :class:`~d2lmini.ffn.FeedForward`.
        act: ``'swiglu'`` (the only gated act it clamps; the argument lets
            :class:`~d2lmini.moe.MixtureOfExperts` build it as any expert).
        swiglu_limit: the clamp ``L > 0`` (default :data:`SWIGLU_CLAMPED_LIMIT`, gpt-oss's 7.0).
        alpha: ``None`` (DeepSeek-V4) or the gate's Swish slope with the ``+ 1`` shift (gpt-oss: 1.702).

    Raises:
        ValueError / TypeError: as :class:`~d2lmini.ffn.FeedForward`, an ``act`` other than ``'swiglu'``,
            ``swiglu_limit`` or ``alpha`` not a finite float > 0.
    """

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int | None = None, *, act: str = "swiglu",
                 swiglu_limit: float = SWIGLU_CLAMPED_LIMIT, alpha: float | None = None, bias: bool = False,
                 dropout: float = 0.0):
        if act != "swiglu":
            raise ValueError(f"ClampedSwiGLU clamps a SwiGLU: act must be 'swiglu', got {act!r}")
        super().__init__(num_hiddens, ffn_num_hiddens, act=act, bias=bias, dropout=dropout)
        self.swiglu_limit = check_positive_float("swiglu_limit", swiglu_limit)
        self.alpha = None if alpha is None else check_positive_float("alpha", alpha)
        if self.alpha is not None:
            self.act = "swiglu_clamped"

    def gated_units(self, G: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
        """``SiLU(min(G, L)) * clamp(U, -L, L)``; with ``alpha`` (gpt-oss) ``g sigmoid(alpha g) * (u + 1)``."""
        G, U = G.clamp(max=self.swiglu_limit), U.clamp(-self.swiglu_limit, self.swiglu_limit)
        if self.alpha is None:
            return self._act(G) * U
        return G * torch.sigmoid(self.alpha * G) * (U + 1)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", swiglu_limit={self.swiglu_limit}" + (
            f", alpha={self.alpha}" if self.alpha is not None else "")


@converter("GptOssDecoderLayer")
def from_gpt_oss_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``GptOssDecoderLayer`` (OpenAI gpt-oss, 2025).

    Pre-norm RMSNorm; grouped-query attention with biases on q, k, v and o, a learned
    sink logit per head (``sinks=True``: ``GptOssAttention.sinks`` joins every softmax),
    YaRN-scaled RoPE (:func:`rope_kwargs`; gpt-oss: factor 32, ``truncate=False``) and, on
    the ``'sliding_attention'`` layers of ``config.layer_types`` (gpt-oss alternates
    sliding and full layers), ``window=config.sliding_window``; and a mixture of experts
    (:class:`~d2lmini.moe.MixtureOfExperts`): a router with a bias taking the top-k
    logits and a softmax over them (``GptOssTopKRouter``; equal to the renormalized
    softmax router), experts with biases and the clamped SwiGLU
    (:class:`ClampedSwiGLU` with ``alpha=1.702``, ``swiglu_limit=config.swiglu_limit``; ``GptOssExperts``,
    weights copied by :func:`copy_gptoss_experts`), no shared expert.

    Args:
        layer, config: a ``GptOssDecoderLayer`` and its ``GptOssConfig`` (call it with
            ``attn_implementation='eager'``: gpt-oss does not support SDPA).
        layer_idx: the layer's position in the stack (selects sliding or full); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`start_conversion`).

    Returns:
        The pre-norm causal block with sinks and the MoE FFN.

    Raises:
        ValueError: for a ``layer_idx`` outside ``config.layer_types``, a RoPE type d2lmini does
            not reproduce, or a ``swiglu_alpha`` other than 1.702.
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    attn, mlp = layer.self_attn, layer.mlp
    window = window_of(config, layer_idx)
    d, num_experts = config.hidden_size, config.num_local_experts

    def ffn():
        return MixtureOfExperts(d, num_experts, top_k=config.num_experts_per_tok,
                                ffn_num_hiddens=config.intermediate_size, router="softmax", bias=True, router_bias=True,
                                expert=partial(ClampedSwiGLU, swiglu_limit=float(config.swiglu_limit),
                                               alpha=SWIGLU_CLAMPED_ALPHA))

    block = TransformerBlock(d, config.num_attention_heads, norm="rms", placement="pre",
                             bias=bool(config.attention_bias), num_kv_heads=config.num_key_value_heads,
                             eps=config.rms_norm_eps, causal=True, head_dim=attn.head_dim, window=window,
                             sinks=True, ffn_factory=ffn, **rope_kwargs(config))
    copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    copy_weight(block.attention.sinks, attn.sinks)
    copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    copy_linear(block.ffn.router, mlp.router.weight, mlp.router.bias)
    copy_gptoss_experts(block.ffn.experts, mlp.experts)
    return block.to(layer.input_layernorm.weight).train(layer.training)


def copy_gptoss_experts(experts: nn.ModuleList, src) -> None:
    """Copy Hugging Face ``GptOssExperts``' fused weights into ``E`` d2lmini FeedForwards.

    gpt-oss stores all experts in three tensors, laid out (in, out): ``gate_up_proj``
    ``(E, d, 2h)`` with gate and up *interleaved* (gate in the even columns ``[..., ::2]``,
    up in the odd ones ``[..., 1::2]``, as ``GptOssExperts._apply_gate`` splits them),
    ``gate_up_proj_bias`` ``(E, 2h)``, ``down_proj`` ``(E, h, d)`` and ``down_proj_bias``
    ``(E, d)``. Expert ``e`` becomes ``experts[e]``: ``W_g`` from the gate columns, ``W_1``
    from the up columns, ``W_2`` from ``down_proj[e]``, each transposed into ``nn.Linear``'s
    (out, in), biases included.

    Args:
        experts: ``E`` :class:`ClampedSwiGLU` modules of gpt-oss (``act='swiglu_clamped'``),
            biases and the source's ``swiglu_limit`` (e.g. ``MixtureOfExperts.experts``).
        src: a ``GptOssExperts`` (``GptOssMLP.experts``).

    Raises:
        ValueError: a different number of experts, an act other than ``'swiglu_clamped'``,
            a limit unequal to ``src.limit``, ``src.alpha`` not 1.702, or mismatched shapes.
    """
    if len(experts) != src.num_experts:
        raise ValueError(f"gpt-oss has {src.num_experts} experts, got {len(experts)} FeedForwards")
    if float(src.alpha) != SWIGLU_CLAMPED_ALPHA:
        raise ValueError(f"only gpt-oss's swiglu_alpha={SWIGLU_CLAMPED_ALPHA} is supported, got {src.alpha}")
    for e, ffn in enumerate(experts):
        limit = getattr(ffn, "swiglu_limit", None)
        if ffn.act != "swiglu_clamped" or limit != float(src.limit):
            raise ValueError(f"experts[{e}] must have act='swiglu_clamped' and swiglu_limit={float(src.limit)}, "
                             f"got act={ffn.act!r}, swiglu_limit={limit}")
        gate_up, gate_up_bias = src.gate_up_proj[e], src.gate_up_proj_bias[e]  # (d, 2h), (2h,)
        copy_linear(ffn.W_g, gate_up[:, ::2].t(), gate_up_bias[::2])
        copy_linear(ffn.W_1, gate_up[:, 1::2].t(), gate_up_bias[1::2])
        copy_linear(ffn.W_2, src.down_proj[e].t(), src.down_proj_bias[e])


# --------------------------------------------------------------------------- the family's tiny configurations

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    # gpt-oss: layers alternate sliding (layer 0) and full; YaRN as released (factor 32 over 4096, not truncated);
    # a SwiGLU clamp of 1 (released: 7) so that the tiny layer's activations reach it.
    "gpt_oss": dict(TINY, head_dim=16, num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                    sliding_window=WINDOW, swiglu_limit=1.0,
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                         beta_slow=1.0, truncate=False, original_max_position_embeddings=4096)),
}


# --------------------------------------------------------------------------- the family's rows

#: The layers of the family the zoo reproduces (:class:`~d2lmini.reference.base.LayerRow`).
ROWS = (
    LayerRow("gpt-oss (sliding)", "gpt-oss", 2025, "GptOssDecoderLayer", "gpt_oss", "GptOssConfig", "gpt_oss", layer_idx=0,
             attn_implementation="eager", note="sliding layer; the full-attention layers alternate with it"),
    LayerRow("gpt-oss (full)", "gpt-oss", 2025, "GptOssDecoderLayer", "gpt_oss", "GptOssConfig", "gpt_oss",
             layer_idx=1, attn_implementation="eager", note="full-attention layer"),
)

#: The family's models in the zoo's 2026 table (:class:`~d2lmini.reference.base.Row2026`).
ROWS_2026 = (
    Row2026("gpt-oss", 2025, "openai2025gptoss", "GptOssConfig",
            dict(norm="RMSNorm, pre", sinks=True, router="softmax", act="clamped SwiGLU"), "gpt-oss-120b",
            check="gpt-oss", zoo_rows=("gpt-oss (sliding)", "gpt-oss (full)")),
)
