"""Real models' layers as d2lmini blocks: configure, copy the weights, compare.

Introduced in the chapter "One block, every configuration". For each reference
layer there is a ``from_*`` function that returns a d2lmini block configured like
the layer and holding copies of its weights (not shared), so both compute the same
function; the block is on the layer's device and dtype, in the layer's train/eval
mode. The
references are PyTorch's own ``nn.TransformerEncoderLayer`` and
``nn.TransformerDecoderLayer`` and, from Hugging Face ``transformers`` (an optional
dependency, imported only here), ``BertLayer``, ``GPT2Block``, ``LlamaDecoderLayer``, ``MistralDecoderLayer``,
``Qwen3DecoderLayer``, ``Olmo2DecoderLayer`` and ``Gemma3DecoderLayer``.

:data:`REFERENCES` and :func:`compare_with_reference` build a tiny randomly
initialized instance of each (no download), run both on the same padded batch
and report the largest output and input-gradient differences.

Traps handled here, each one a silent wrong answer if missed: BERT's LayerNorm eps
of 1e-12; GPT-2's ``Conv1D`` weights stored (in, out) and its tanh GELU; Gemma's
RMSNorm gain stored as ``w`` and applied as ``1 + w``, and its logit scale
``query_pre_attn_scalar ** -0.5``; OLMo 2's QK-norm over the whole projection;
Qwen3's ``head_dim`` unequal to ``d / h``; ``nn.TransformerEncoderLayer``'s fused
fast path (eval, no grad) which returns zeros at padded positions; and Hugging Face
layers called with ``attention_mask=None``, which are causal under SDPA but
bidirectional under eager attention -- so masks are always passed explicitly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ._shown import shown_in
from .attention import valid_lens_mask
from .block import TransformerBlock, TransformerDecoderBlock

# --------------------------------------------------------------------------- copying helpers


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"cannot copy a weight of shape {tuple(src.shape)} into {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src)


def _copy_linear(dst: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    _copy(dst.weight, weight)
    if (bias is None) != (dst.bias is None):
        raise ValueError("bias mismatch between the reference layer and the d2lmini block")
    if bias is not None:
        _copy(dst.bias, bias)


def _copy_norm(dst: nn.Module, src: nn.Module, unit_offset: bool = False) -> None:
    """Copy a norm's gain (and bias); ``unit_offset`` turns Gemma's stored ``w`` into ``1 + w``."""
    weight = src.weight.float() + 1.0 if unit_offset else src.weight
    _copy(dst.weight, weight.to(dst.weight.dtype))
    if getattr(src, "bias", None) is not None:
        _copy(dst.bias, src.bias)


def _copy_qkv_packed(attention, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Copy a packed (3d, d) [q; k; v] projection, as in ``nn.MultiheadAttention``."""
    Wq, Wk, Wv = weight.chunk(3, dim=0)
    bq, bk, bv = bias.chunk(3) if bias is not None else (None, None, None)
    _copy_linear(attention.W_q, Wq, bq)
    _copy_linear(attention.W_k, Wk, bk)
    _copy_linear(attention.W_v, Wv, bv)


def _torch_activation(layer) -> str:
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU) or act == "relu":
        return "relu"
    if act is F.gelu or isinstance(act, nn.GELU) or act == "gelu":
        if isinstance(act, nn.GELU) and act.approximate != "none":
            return "gelu_tanh"
        return "gelu"
    raise ValueError(f"unsupported activation {act!r}; supported: relu, gelu")


# --------------------------------------------------------------------------- PyTorch layers


def from_torch_encoder_layer(layer: nn.TransformerEncoderLayer) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to ``torch.nn.TransformerEncoderLayer``.

    ``norm_first=False`` is post-LN (Vaswani et al., 2017), ``True`` is pre-LN;
    ReLU or exact GELU; LayerNorm with the layer's eps; biases as the layer has them.

    Args:
        layer: a ``batch_first=True`` ``nn.TransformerEncoderLayer``.

    Returns:
        A block on the layer's device and dtype, in the layer's train/eval mode.

    Raises:
        ValueError: for ``batch_first=False`` or an activation other than relu/gelu.
    """
    if not layer.self_attn.batch_first:
        raise ValueError("from_torch_encoder_layer needs batch_first=True (d2lmini tensors are (batch, steps, d))")
    attn = layer.self_attn
    d, h = attn.embed_dim, attn.num_heads
    bias = layer.linear1.bias is not None
    block = TransformerBlock(d, h, norm="layer", act=_torch_activation(layer),
                             placement="pre" if layer.norm_first else "post", bias=bias,
                             ffn_num_hiddens=layer.linear1.out_features, eps=layer.norm1.eps,
                             dropout=layer.dropout.p)
    _copy_qkv_packed(block.attention, attn.in_proj_weight, attn.in_proj_bias)
    _copy_linear(block.attention.W_o, attn.out_proj.weight, attn.out_proj.bias)
    _copy_linear(block.ffn.W_1, layer.linear1.weight, layer.linear1.bias)
    _copy_linear(block.ffn.W_2, layer.linear2.weight, layer.linear2.bias)
    slot = "norm_in" if layer.norm_first else "norm_post"
    _copy_norm(getattr(block.addnorm1, slot), layer.norm1)
    _copy_norm(getattr(block.addnorm2, slot), layer.norm2)
    return block.to(attn.in_proj_weight).train(layer.training)


def from_torch_decoder_layer(layer: nn.TransformerDecoderLayer) -> TransformerDecoderBlock:
    """A :class:`TransformerDecoderBlock` equal to ``torch.nn.TransformerDecoderLayer``.

    Self-attention (causal), cross-attention over the encoder's outputs, FFN; post-LN
    or pre-LN as ``norm_first`` says.

    Args:
        layer: a ``batch_first=True`` ``nn.TransformerDecoderLayer``.

    Returns:
        A decoder block holding the layer's weights (its self-attention is causal:
        call the reference with a causal ``tgt_mask`` to compare).

    Raises:
        ValueError: for ``batch_first=False`` or an activation other than relu/gelu.
    """
    if not layer.self_attn.batch_first:
        raise ValueError("from_torch_decoder_layer needs batch_first=True")
    attn, cross = layer.self_attn, layer.multihead_attn
    d, h = attn.embed_dim, attn.num_heads
    block = TransformerDecoderBlock(d, h, norm="layer", act=_torch_activation(layer),
                                    placement="pre" if layer.norm_first else "post",
                                    bias=layer.linear1.bias is not None,
                                    ffn_num_hiddens=layer.linear1.out_features, eps=layer.norm1.eps,
                                    dropout=layer.dropout.p)
    _copy_qkv_packed(block.attention, attn.in_proj_weight, attn.in_proj_bias)
    _copy_linear(block.attention.W_o, attn.out_proj.weight, attn.out_proj.bias)
    _copy_qkv_packed(block.cross_attention, cross.in_proj_weight, cross.in_proj_bias)
    _copy_linear(block.cross_attention.W_o, cross.out_proj.weight, cross.out_proj.bias)
    _copy_linear(block.ffn.W_1, layer.linear1.weight, layer.linear1.bias)
    _copy_linear(block.ffn.W_2, layer.linear2.weight, layer.linear2.bias)
    slot = "norm_in" if layer.norm_first else "norm_post"
    for addnorm, norm in ((block.addnorm1, layer.norm1), (block.addnorm2, layer.norm2),
                          (block.addnorm3, layer.norm3)):
        _copy_norm(getattr(addnorm, slot), norm)
    return block.to(attn.in_proj_weight).train(layer.training)


# --------------------------------------------------------------------------- Hugging Face layers


def from_bert_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``BertLayer`` (Devlin et al., 2019).

    Post-LN, LayerNorm with ``config.layer_norm_eps`` (1e-12 in BERT), exact GELU,
    biases everywhere, bidirectional attention.

    Args:
        layer, config: a ``BertLayer`` and its ``BertConfig``.

    Returns:
        The post-LN block.
    """
    attn = layer.attention.self
    block = TransformerBlock(config.hidden_size, config.num_attention_heads, norm="layer",
                             act=_hf_act(config.hidden_act), placement="post", bias=True,
                             ffn_num_hiddens=config.intermediate_size, eps=config.layer_norm_eps)
    _copy_linear(block.attention.W_q, attn.query.weight, attn.query.bias)
    _copy_linear(block.attention.W_k, attn.key.weight, attn.key.bias)
    _copy_linear(block.attention.W_v, attn.value.weight, attn.value.bias)
    out = layer.attention.output
    _copy_linear(block.attention.W_o, out.dense.weight, out.dense.bias)
    _copy_norm(block.addnorm1.norm_post, out.LayerNorm)
    _copy_linear(block.ffn.W_1, layer.intermediate.dense.weight, layer.intermediate.dense.bias)
    _copy_linear(block.ffn.W_2, layer.output.dense.weight, layer.output.dense.bias)
    _copy_norm(block.addnorm2.norm_post, layer.output.LayerNorm)
    return block.to(attn.query.weight).train(layer.training)


def from_gpt2_block(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``GPT2Block`` (Radford et al., 2019).

    Pre-LN, LayerNorm (eps 1e-5), tanh-approximated GELU, biases, causal attention.
    GPT-2 stores its projections as ``Conv1D`` with weights of shape (in, out):
    they are transposed into ``nn.Linear``'s (out, in).

    Args:
        layer, config: a ``GPT2Block`` and its ``GPT2Config``.

    Returns:
        The pre-LN causal block.

    Raises:
        ValueError: for GPT-2 options d2lmini does not implement
            (``scale_attn_by_inverse_layer_idx``, unscaled attention).
    """
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) or not getattr(config, "scale_attn_weights", True):
        raise ValueError("only GPT-2's default attention scaling 1/sqrt(head_dim) is supported")
    d, h = config.n_embd, config.n_head
    inner = config.n_inner or 4 * d
    block = TransformerBlock(d, h, norm="layer", act=_hf_act(config.activation_function), placement="pre",
                             bias=True, ffn_num_hiddens=inner, eps=config.layer_norm_epsilon, causal=True)
    W, b = layer.attn.c_attn.weight.t(), layer.attn.c_attn.bias  # (3d, d) after the transpose
    _copy_qkv_packed(block.attention, W, b)
    _copy_linear(block.attention.W_o, layer.attn.c_proj.weight.t(), layer.attn.c_proj.bias)
    _copy_linear(block.ffn.W_1, layer.mlp.c_fc.weight.t(), layer.mlp.c_fc.bias)
    _copy_linear(block.ffn.W_2, layer.mlp.c_proj.weight.t(), layer.mlp.c_proj.bias)
    _copy_norm(block.addnorm1.norm_in, layer.ln_1)
    _copy_norm(block.addnorm2.norm_in, layer.ln_2)
    return block.to(W).train(layer.training)


def _hf_act(name: str) -> str:
    table = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
    if name not in table:
        raise ValueError(f"unsupported activation {name!r}; supported: {tuple(table)}")
    return table[name]


def _rope_theta(config, layer_type: str | None = None) -> float:
    params = getattr(config, "rope_parameters", None)
    if params is None:
        return float(config.rope_theta)
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    if params.get("rope_type", "default") != "default":
        raise ValueError(f"only default RoPE is supported, got rope_type={params.get('rope_type')!r}")
    return float(params["rope_theta"])


def _gated_decoder(layer, config, placement: str, qk_norm: str | None, act: str = "swiglu",
                   unit_offset: bool = False, attn_scale: float | None = None,
                   layer_type: str | None = None, window: int | None = None,
                   residual_multiplier: float = 1.0) -> TransformerBlock:
    """Shared mapping of the Llama family (q/k/v/o_proj, gate/up/down_proj, RMSNorm, RoPE)."""
    attn, mlp = layer.self_attn, layer.mlp
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    block = TransformerBlock(config.hidden_size, config.num_attention_heads, norm="rms", act=act,
                             placement=placement, bias=bool(getattr(config, "attention_bias", False)),
                             num_kv_heads=config.num_key_value_heads, ffn_num_hiddens=config.intermediate_size,
                             eps=config.rms_norm_eps, causal=True, head_dim=head_dim, qk_norm=qk_norm,
                             qk_norm_eps=config.rms_norm_eps, rope_theta=_rope_theta(config, layer_type),
                             attn_scale=attn_scale, window=window, residual_multiplier=residual_multiplier)
    for ours, theirs in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"), ("W_o", "o_proj")):
        src = getattr(attn, theirs)
        _copy_linear(getattr(block.attention, ours), src.weight, src.bias)
    if getattr(config, "mlp_bias", False):
        raise ValueError("MLP biases are not supported for this family")
    _copy_linear(block.ffn.W_g, mlp.gate_proj.weight)
    _copy_linear(block.ffn.W_1, mlp.up_proj.weight)
    _copy_linear(block.ffn.W_2, mlp.down_proj.weight)
    if qk_norm is not None:
        _copy_norm(block.attention.q_norm, attn.q_norm, unit_offset)
        _copy_norm(block.attention.k_norm, attn.k_norm, unit_offset)
    return block


def from_llama_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``LlamaDecoderLayer`` (Llama 3).

    Pre-LN with RMSNorm, grouped-query attention, RoPE (``rope_theta``), SwiGLU, no biases.

    Args:
        layer, config: a ``LlamaDecoderLayer`` and its ``LlamaConfig``.

    Returns:
        The pre-norm causal block with grouped-query attention and RoPE.
    """
    block = _gated_decoder(layer, config, "pre", None)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    _copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    return block.to(layer.input_layernorm.weight).train(layer.training)


def from_mistral_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``MistralDecoderLayer`` (Mistral 7B).

    The Llama block plus sliding-window attention: ``window=config.sliding_window``
    (query ``i`` sees keys ``i - window < j <= i``, as ``transformers``'
    ``create_sliding_window_causal_mask``), or no window if it is ``None``.

    Args:
        layer, config: a ``MistralDecoderLayer`` and its ``MistralConfig``.

    Returns:
        The pre-norm causal block with grouped-query attention, RoPE and the window.
    """
    block = _gated_decoder(layer, config, "pre", None, window=config.sliding_window)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    _copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    return block.to(layer.input_layernorm.weight).train(layer.training)


def from_qwen3_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Qwen3DecoderLayer`` (Qwen3, 2025).

    As Llama, plus QK-norm per head with one gain shared by all heads, and a
    ``head_dim`` set independently of ``hidden_size / num_attention_heads``.

    Args:
        layer, config: a ``Qwen3DecoderLayer`` and its ``Qwen3Config``.

    Returns:
        The Llama-style block with per-head QK-norm.

    Raises:
        ValueError: for a sliding-window layer (d2lmini has no sliding window).
    """
    if getattr(config, "use_sliding_window", False):
        raise ValueError("sliding-window attention is not supported")
    block = _gated_decoder(layer, config, "pre", "per_head")
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    _copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    return block.to(layer.input_layernorm.weight).train(layer.training)


def from_olmo2_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Olmo2DecoderLayer`` (OLMo 2, 2024).

    RMSNorm on each sublayer's *output* inside the residual branch
    (``placement='post_sublayer'``), QK-norm over the whole q and k projections
    before the head split, RoPE, SwiGLU.

    Args:
        layer, config: a ``Olmo2DecoderLayer`` and its ``Olmo2Config``.

    Returns:
        The ``'post_sublayer'`` block with QK-norm over the projection.
    """
    block = _gated_decoder(layer, config, "post_sublayer", "projection")
    _copy_norm(block.addnorm1.norm_out, layer.post_attention_layernorm)
    _copy_norm(block.addnorm2.norm_out, layer.post_feedforward_layernorm)
    return block.to(layer.post_attention_layernorm.weight).train(layer.training)


def from_gemma3_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to a global-attention Hugging Face ``Gemma3DecoderLayer``.

    Sandwich placement (RMSNorm before and after each sublayer), gains applied as
    ``1 + w``, QK-norm per head (shared gain), logit scale
    ``query_pre_attn_scalar ** -0.5``, GeGLU with tanh GELU, RoPE with the global
    layers' base.

    Args:
        layer, config: a ``Gemma3DecoderLayer`` and its ``Gemma3TextConfig``.

    Returns:
        The ``'sandwich'`` block with per-head QK-norm.

    Raises:
        ValueError: for a sliding-window (local) layer, or logit soft-capping.
    """
    if getattr(layer.self_attn, "sliding_window", None) is not None:
        raise ValueError("sliding-window (local) Gemma 3 layers are not supported; use a full_attention layer")
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ValueError("attention logit soft-capping is not supported")
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError("bidirectional Gemma 3 layers are not supported")
    block = _gated_decoder(layer, config, "sandwich", "per_head", act=_hf_act(config.hidden_activation)
                           .replace("gelu_tanh", "geglu"), unit_offset=True,
                           attn_scale=config.query_pre_attn_scalar ** -0.5, layer_type="full_attention")
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm, unit_offset=True)
    _copy_norm(block.addnorm1.norm_out, layer.post_attention_layernorm, unit_offset=True)
    _copy_norm(block.addnorm2.norm_in, layer.pre_feedforward_layernorm, unit_offset=True)
    _copy_norm(block.addnorm2.norm_out, layer.post_feedforward_layernorm, unit_offset=True)
    return block.to(layer.input_layernorm.weight).train(layer.training)


# --------------------------------------------------------------------------- the comparison harness


def additive_mask(valid_lens: torch.Tensor | None, num_steps: int, causal: bool, dtype=torch.float32,
                  batch_size: int | None = None) -> torch.Tensor:
    """A float mask ``(b, 1, n, n)``: 0 where attention is allowed, the dtype's minimum elsewhere.

    This is the explicit mask Hugging Face layers take (valid for both SDPA and eager
    attention): the boolean :func:`d2lmini.attention.valid_lens_mask` of the keys
    (positions >= ``valid_lens[b]`` are masked), with ``causal`` also every key after
    the query, turned into an additive mask.

    Args:
        valid_lens: ``None`` (no padding) or ``(b,)`` integer lengths in ``[0, n]``.
        num_steps: ``n``, queries and keys.
        causal: whether to mask the keys after each query as well.
        dtype: of the mask (the layer's dtype).
        batch_size: ``b`` when ``valid_lens`` is ``None`` (default 1).

    Raises:
        TypeError / ValueError: bad ``valid_lens`` (see :func:`~d2lmini.attention.valid_lens_mask`).
    """
    allowed = torch.ones(num_steps, num_steps, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if valid_lens is None:
        allowed = allowed.expand(batch_size or 1, -1, -1)
    else:
        allowed = allowed & valid_lens_mask(valid_lens, num_steps)[:, None, :]  # (b, n, n)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def _randomize_(module: nn.Module, seed: int, unit_offset_norms: bool = False) -> nn.Module:
    """Give every parameter a seeded random value, so that no weight is a default 0 or 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                bound = math.sqrt(6.0 / (p.shape[0] + p.shape[-1]))  # Xavier-uniform-sized, any layout
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * bound)
            elif name.endswith("bias"):
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * 0.1)
            else:  # a norm gain: around 1 (or around 0 where it is stored as w in 1 + w)
                centre = 0.0 if unit_offset_norms else 1.0
                p.copy_(centre + (torch.rand(p.shape, generator=gen) - 0.5) * 0.5)
    return module


@dataclass
class Reference:
    """One reference layer: how to make a tiny one, convert it, and call it.

    Attributes:
        name: the layer class, e.g. ``'LlamaDecoderLayer'``.
        model: the model or paper it stands for, e.g. ``'Llama 3'``.
        make: ``seed -> (layer, config)``, a tiny randomly initialized layer in eval mode.
        convert: ``(layer, config) -> d2lmini block``.
        call: ``(layer, config, X, valid_lens) -> output``; passes explicit masks.
        causal: whether the layer's self-attention is causal.
        needs_transformers: whether ``transformers`` must be installed.
        memory: for decoder layers with cross-attention, the encoder length (else 0).
    """

    name: str
    model: str
    make: Callable
    convert: Callable
    call: Callable
    causal: bool
    needs_transformers: bool = True
    memory: int = 0


TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=160)


def _padding(valid_lens: torch.Tensor | None, num_steps: int) -> torch.Tensor | None:
    """The key-padding mask of ``nn.Transformer*`` layers, ``(b, n)``: ``True`` at padding (masked)."""
    return None if valid_lens is None else ~valid_lens_mask(valid_lens, num_steps)


def _torch_encoder(norm_first: bool, activation: str):
    def make(seed):
        torch.manual_seed(seed)
        layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=256, dropout=0.0, activation=activation,
                                           batch_first=True, norm_first=norm_first)
        return _randomize_(layer, seed).eval(), None

    def call(layer, config, X, valid_lens):
        return layer(X, src_key_padding_mask=_padding(valid_lens, X.shape[1]))

    return make, call


def _torch_decoder_make(seed):
    torch.manual_seed(seed)
    layer = nn.TransformerDecoderLayer(64, 4, dim_feedforward=256, dropout=0.0, batch_first=True)
    return _randomize_(layer, seed).eval(), None


def _hf_layer(kind: str):
    """make/call for a Hugging Face layer class, tiny config, SDPA attention."""

    def make(seed):
        import transformers as tf

        torch.manual_seed(seed)
        if kind == "bert":
            config = tf.BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=256)
            config._attn_implementation = "sdpa"
            layer = tf.models.bert.modeling_bert.BertLayer(config)
        elif kind == "gpt2":
            config = tf.GPT2Config(n_embd=64, n_head=4)
            config._attn_implementation = "sdpa"
            layer = tf.models.gpt2.modeling_gpt2.GPT2Block(config, layer_idx=0)
        elif kind == "llama":
            config = tf.LlamaConfig(**TINY, num_hidden_layers=1, rope_theta=500000.0)
            config._attn_implementation = "sdpa"
            layer = tf.models.llama.modeling_llama.LlamaDecoderLayer(config, layer_idx=0)
        elif kind == "qwen3":
            config = tf.Qwen3Config(**TINY, num_hidden_layers=1, head_dim=32)  # head_dim != 64 / 4
            config._attn_implementation = "sdpa"
            layer = tf.models.qwen3.modeling_qwen3.Qwen3DecoderLayer(config, layer_idx=0)
        elif kind == "olmo2":
            config = tf.Olmo2Config(**TINY, num_hidden_layers=1)
            config._attn_implementation = "sdpa"
            layer = tf.models.olmo2.modeling_olmo2.Olmo2DecoderLayer(config, layer_idx=0)
        elif kind == "gemma3":
            config = tf.Gemma3TextConfig(**TINY, num_hidden_layers=1, head_dim=32, query_pre_attn_scalar=24,
                                         layer_types=["full_attention"])
            config._attn_implementation = "sdpa"
            layer = tf.models.gemma3.modeling_gemma3.Gemma3DecoderLayer(config, layer_idx=0)
        else:  # pragma: no cover - internal table
            raise ValueError(kind)
        return _randomize_(layer, seed, unit_offset_norms=kind == "gemma3").eval(), config

    def call(layer, config, X, valid_lens):
        import transformers as tf

        batch_size, num_steps, _ = X.shape
        causal = kind not in ("bert",)
        mask = additive_mask(valid_lens, num_steps, causal, X.dtype, batch_size)
        kwargs = {}
        if kind in ("llama", "qwen3", "olmo2", "gemma3"):
            module = {"llama": tf.models.llama.modeling_llama.LlamaRotaryEmbedding,
                      "qwen3": tf.models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding,
                      "olmo2": tf.models.olmo2.modeling_olmo2.Olmo2RotaryEmbedding,
                      "gemma3": tf.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding}[kind]
            rotary = module(config)
            position_ids = torch.arange(num_steps)[None].expand(batch_size, -1)
            extra = ("full_attention",) if kind == "gemma3" else ()
            kwargs["position_embeddings"] = rotary(X, position_ids, *extra)
            kwargs["position_ids"] = position_ids
        out = layer(X, attention_mask=mask, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    return make, call


def _build_references() -> dict[str, Reference]:
    refs = {}
    for norm_first in (False, True):
        for activation in ("relu", "gelu"):
            make, call = _torch_encoder(norm_first, activation)
            name = f"TransformerEncoderLayer(norm_first={norm_first}, activation={activation!r})"
            refs[name] = Reference(name, "PyTorch, " + ("pre-LN" if norm_first else "post-LN, Transformer (2017)"),
                                   make, lambda layer, config: from_torch_encoder_layer(layer), call,
                                   causal=False, needs_transformers=False)

    def decoder_call(layer, config, X, valid_lens, memory, memory_valid_lens):
        n = X.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = masked, as nn.Transformer* expects
        return layer(X, memory, tgt_mask=causal, tgt_key_padding_mask=_padding(valid_lens, n),
                     memory_key_padding_mask=_padding(memory_valid_lens, memory.shape[1]))

    refs["TransformerDecoderLayer"] = Reference(
        "TransformerDecoderLayer", "PyTorch, encoder-decoder Transformer (2017)", _torch_decoder_make,
        lambda layer, config: from_torch_decoder_layer(layer), decoder_call, causal=True,
        needs_transformers=False, memory=12)
    for kind, name, model, convert, causal in (
        ("bert", "BertLayer", "BERT", from_bert_layer, False),
        ("gpt2", "GPT2Block", "GPT-2", from_gpt2_block, True),
        ("llama", "LlamaDecoderLayer", "Llama 3", from_llama_layer, True),
        ("qwen3", "Qwen3DecoderLayer", "Qwen3", from_qwen3_layer, True),
        ("olmo2", "Olmo2DecoderLayer", "OLMo 2", from_olmo2_layer, True),
        ("gemma3", "Gemma3DecoderLayer", "Gemma 3", from_gemma3_layer, True),
    ):
        make, call = _hf_layer(kind)
        refs[name] = Reference(name, model, make, convert, call, causal)
    return refs


#: Every reference layer d2lmini is checked against, by name.
REFERENCES: dict[str, Reference] = _build_references()


def compare_with_reference(name: str, batch_size: int = 2, num_steps: int = 16, seed: int = 0,
                           padded: bool = True) -> dict:
    """Run a reference layer and its d2lmini twin on one batch; return the differences.

    Builds the tiny reference ``REFERENCES[name]`` (seeded random weights, eval mode,
    float32), converts it with its ``from_*`` function, feeds both the same random
    batch -- with the second sequence padded to 5/8 of its length when ``padded`` --
    and backpropagates the same random read-out of the outputs to the inputs. Only
    valid (non-padded) positions are compared.

    Args:
        name: a key of :data:`REFERENCES`, or a :class:`Reference` object (for a
            reference kept elsewhere, e.g. Arcee Trinity in :mod:`d2lmini.chapters.ch08_the_2026_block`).
        batch_size, num_steps: the batch's shape (batch >= 1, steps >= 2).
        seed: seeds the weights and the inputs.
        padded: whether to pad the second sequence (``valid_lens``).

    Returns:
        dict with ``max_abs_diff`` (outputs), ``max_abs_grad_diff`` (gradients with
        respect to the input), ``max_abs_output`` (scale of the outputs) and ``block``.

    Raises:
        KeyError: for an unknown ``name`` (the message lists the known ones).
        ImportError: if the reference needs ``transformers`` and it is not installed.
    """
    if isinstance(name, Reference):
        ref = name
    elif name in REFERENCES:
        ref = REFERENCES[name]
    else:
        raise KeyError(f"unknown reference {name!r}; known: {sorted(REFERENCES)}")
    layer, config = ref.make(seed)
    block = ref.convert(layer, config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    d = block.num_hiddens
    X = torch.randn(batch_size, num_steps, d, generator=gen)
    R = torch.randn(batch_size, num_steps, d, generator=gen)
    valid_lens = None
    if padded and batch_size > 1:
        valid_lens = torch.full((batch_size,), num_steps)
        valid_lens[1] = max(1, num_steps * 5 // 8)
    extra_ref, extra_ours = (), ()
    if ref.memory:
        memory = torch.randn(batch_size, ref.memory, d, generator=gen)
        memory_valid_lens = None if valid_lens is None else torch.full((batch_size,), ref.memory).index_fill_(0, torch.tensor([1]), ref.memory // 2)
        extra_ref, extra_ours = (memory, memory_valid_lens), (memory, memory_valid_lens)
    keep = torch.ones(batch_size, num_steps, 1, dtype=torch.bool)  # (b, n, 1): the positions compared
    if valid_lens is not None:
        keep = valid_lens_mask(valid_lens, num_steps)[..., None]
    runs = (lambda Z: ref.call(layer, config, Z, valid_lens, *extra_ref),
            lambda Z: block(Z, *extra_ours, valid_lens) if ref.memory else block(Z, valid_lens))
    return {**output_and_grad_differences(runs, X, R, keep), "block": block}


@shown_in("ch08")
def output_and_grad_differences(runs, X: torch.Tensor, R: torch.Tensor, keep: torch.Tensor) -> dict:
    """Feed two implementations the same input; compare their outputs and input gradients.

    Each of the two ``runs`` maps a ``(b, n, d)`` input to a ``(b, n, d)`` output (or a
    tuple that starts with it). Each gets its own copy of ``X``, and the same random
    read-out ``R`` of its output, restricted to the positions ``keep`` (``(b, n, 1)``
    bool), is backpropagated to that copy.

    Returns:
        dict with ``max_abs_diff`` (outputs, at the kept positions), ``max_abs_grad_diff``
        (gradients with respect to the input) and ``max_abs_output`` (the first run's scale).
    """
    outputs, grads = [], []
    for run in runs:
        Z = X.clone().requires_grad_(True)  # grad mode: nn.TransformerEncoderLayer takes its exact path
        Y = run(Z)
        Y = Y[0] if isinstance(Y, tuple) else Y
        (Y * R * keep).sum().backward()
        outputs.append(Y.detach())
        grads.append(Z.grad)
    keep = keep.expand_as(outputs[0])
    return {"max_abs_diff": float((outputs[0] - outputs[1])[keep].abs().max()),
            "max_abs_grad_diff": float((grads[0] - grads[1]).abs().max()),
            "max_abs_output": float(outputs[0][keep].abs().max())}


# --------------------------------------------------------------------------- gpt-oss


def _copy_gptoss_experts(experts: nn.ModuleList, src) -> None:
    """Copy Hugging Face ``GptOssExperts``' fused weights into ``E`` d2lmini FeedForwards.

    gpt-oss stores all experts in three tensors, laid out (in, out): ``gate_up_proj``
    ``(E, d, 2h)`` with gate and up *interleaved* (gate in the even columns ``[..., ::2]``,
    up in the odd ones ``[..., 1::2]``, as ``GptOssExperts._apply_gate`` splits them),
    ``gate_up_proj_bias`` ``(E, 2h)``, ``down_proj`` ``(E, h, d)`` and ``down_proj_bias``
    ``(E, d)``. Expert ``e`` becomes ``experts[e]``: ``W_g`` from the gate columns, ``W_1``
    from the up columns, ``W_2`` from ``down_proj[e]``, each transposed into ``nn.Linear``'s
    (out, in), biases included.

    Args:
        experts: ``E`` :class:`~d2lmini.ffn.FeedForward` modules with ``act='swiglu_clamped'``,
            biases and the source's ``swiglu_limit`` (e.g. ``MixtureOfExperts.experts``).
        src: a ``GptOssExperts`` (``GptOssMLP.experts``).

    Raises:
        ValueError: a different number of experts, an act other than ``'swiglu_clamped'``,
            a limit unequal to ``src.limit``, ``src.alpha`` not 1.702, or mismatched shapes.
    """
    from .ffn import SWIGLU_CLAMPED_ALPHA

    if len(experts) != src.num_experts:
        raise ValueError(f"gpt-oss has {src.num_experts} experts, got {len(experts)} FeedForwards")
    if float(src.alpha) != SWIGLU_CLAMPED_ALPHA:
        raise ValueError(f"only gpt-oss's swiglu_alpha={SWIGLU_CLAMPED_ALPHA} is supported, got {src.alpha}")
    for e, ffn in enumerate(experts):
        if ffn.act != "swiglu_clamped" or ffn.swiglu_limit != float(src.limit):
            raise ValueError(f"experts[{e}] must have act='swiglu_clamped' and swiglu_limit={float(src.limit)}, "
                             f"got act={ffn.act!r}, swiglu_limit={ffn.swiglu_limit}")
        gate_up, gate_up_bias = src.gate_up_proj[e], src.gate_up_proj_bias[e]  # (d, 2h), (2h,)
        _copy_linear(ffn.W_g, gate_up[:, ::2].t(), gate_up_bias[::2])
        _copy_linear(ffn.W_1, gate_up[:, 1::2].t(), gate_up_bias[1::2])
        _copy_linear(ffn.W_2, src.down_proj[e].t(), src.down_proj_bias[e])
