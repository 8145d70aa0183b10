"""Real models' layers as d2lmini blocks: configure, copy the weights, compare.

Introduced in the appendix "The block zoo". For each reference
layer there is a ``from_*`` function that returns a d2lmini block configured like
the layer and holding copies of its weights (not shared), so both compute the same
function; the block is on the layer's device and dtype, in the layer's train/eval
mode. Dropout: in eval mode it does nothing and is not converted; a Hugging Face layer in
training mode with a dropout probability > 0 is converted only where the block applies
it where the layer does (BERT's and GPT-2's, when their attention and branch dropouts are
equal), and refused with a ``ValueError`` naming the config field otherwise. The
references are PyTorch's own ``nn.TransformerEncoderLayer`` and
``nn.TransformerDecoderLayer`` and, from Hugging Face ``transformers`` (an optional
dependency, imported only inside functions), the decoder and encoder layers of
:data:`HF_CONVERTERS`: :func:`from_hf` converts any of them, dispatching on the layer's
class name (BERT, GPT-2, Llama, Mistral, Ministral, Qwen2, Qwen3, Gemma 2, Gemma 3, OLMo,
OLMo 2, OLMo 3, StarCoder2, Granite, SmolLM3, Ministral 3, Arcee Trinity, gpt-oss, Llama 4
(its RoPE and NoPE layers, dense and MoE, checked in ``tests/test_llama4.py`` and the block zoo), and the
parallel or partial-RoPE Phi, Phi-3, GPT-NeoX, GPT-J, Falcon, Cohere, StableLM;
:mod:`d2lmini.zoo` checks each of them; and Qwen3.5's two layer types, dense and MoE, checked in
``tests/test_qwen3_5_layer.py``, ``tests/test_qwen3_5_moe.py`` and the block zoo; GLM-5's, checked in ``tests/test_glm5.py`` and the block zoo).
:func:`hf_make` and :func:`hf_call` build a tiny random Hugging Face layer and call it
as its model does (the model's own masks from ``transformers.masking_utils`` and its
own rotary tables).

:data:`REFERENCES` and :func:`compare_with_reference` build a tiny randomly
initialized instance of each (no download), run both on the same padded batch
and report the largest output and input-gradient differences.

Traps handled here, each one a silent wrong answer if missed: BERT's LayerNorm eps
of 1e-12; GPT-2's ``Conv1D`` weights stored (in, out) and its tanh GELU; Gemma's
RMSNorm gain stored as ``w`` and applied as ``1 + w``, and its logit scale
``query_pre_attn_scalar ** -0.5``; OLMo 2's QK-norm over the whole projection;
Qwen3's ``head_dim`` unequal to ``d / h``; OLMo's parameter-free LayerNorm with
its eps fixed at 1e-5 (and ``clip_qkv``, refused); Qwen2's biases on q, k, v but not o;
Gemma 3's local layers, which use their own RoPE base; keys of ``rope_parameters`` that
``transformers`` reads for one RoPE type but not another (YaRN's ``truncate`` from the top
level, ``mscale`` only with ``mscale_all_dim``; :func:`_rope_kwargs`); Ministral 3's query
scaling, whose period is YaRN's ``original_max_position_embeddings``; Arcee Trinity's global
layers, which apply no RoPE though the model computes a rotary table; layer types (sliding or full,
RoPE or NoPE) chosen by ``layer_idx``; ``nn.TransformerEncoderLayer``'s fused
fast path (eval, no grad) which returns zeros at padded positions; and Hugging Face
layers called with ``attention_mask=None``, which are causal under SDPA but
bidirectional under eager attention -- so masks are always passed explicitly.
Among the parallel and partial-RoPE layers: GPT-J's and Cohere's *interleaved* RoPE pairs
(converted by permuting the rows of ``W_q`` and ``W_k``, :func:`rope_interleaved_to_half`),
partial RoPE on ``int(head_dim * partial_rotary_factor)`` features, the fused q/k/v layouts
of GPT-NeoX (per head), Phi-3 (q, then k, then v) and Falcon (three of them), MLP biases
that differ from the attention's (GPT-J, GPT-NeoX), and Falcon's required ``alibi`` argument.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import check_bool, check_choice, check_nonnegative_int
from ._shown import shown_in
from .attention import ROPE_SCALINGS, GatedAttention, MultiHeadAttention, interleaved_to_half_order, valid_lens_mask
from .block import TransformerBlock, TransformerDecoderBlock
from .ffn import FeedForward
from .moe import MixtureOfExperts
from .parameters import copy_parameters

# --------------------------------------------------------------------------- copying helpers


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"cannot copy a weight of shape {tuple(src.shape)} into {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src)


def _copy_linear(dst: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 name: str = "a projection") -> None:
    """Copy ``weight`` (and ``bias``) into ``dst``; ValueError naming ``name`` if only one of the two has a bias."""
    _copy(dst.weight, weight)
    if (bias is None) != (dst.bias is None):
        ours, theirs = ("has no", "has a") if bias is not None else ("has a", "has no")
        raise ValueError(f"bias mismatch in {name}: the reference layer {theirs} bias there, the d2lmini block "
                         f"{ours} bias")
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


#: The dropout probabilities of Hugging Face configs that act inside a decoder or encoder layer (on attention
#: weights, hidden units or branch outputs); the embeddings' (``embd_pdrop``, ``embedding_dropout``) act outside it.
_LAYER_DROPOUTS = ("attention_dropout", "attention_probs_dropout_prob", "hidden_dropout_prob", "hidden_dropout",
                   "attn_pdrop", "resid_pdrop", "residual_dropout")


def _own_layer_idx(layer) -> int | None:
    """The ``layer_idx`` a Hugging Face layer was built with, where the layer or its attention records it."""
    for path in ("", "self_attn", "attn", "attention", "attention.self", "self_attention"):
        module = layer
        for part in filter(None, path.split(".")):
            module = getattr(module, part, None)
        if module is not None and isinstance(getattr(module, "layer_idx", None), int):
            return module.layer_idx
    return None


def _resolve_layer_idx(layer, layer_idx: int | None) -> int:
    """``layer_idx``, checked: ``None`` is the layer's own index (0 where it records none); a given
    one must be an int >= 0 equal to the layer's own (TypeError/ValueError otherwise)."""
    own = _own_layer_idx(layer)
    if layer_idx is None:
        return 0 if own is None else own
    layer_idx = check_nonnegative_int("layer_idx", layer_idx)
    if own is not None and own != layer_idx:
        raise ValueError(f"layer_idx={layer_idx}, but this {type(layer).__name__} was built with layer_idx={own}; "
                         "pass layer_idx=None (the layer's own)")
    return layer_idx


def _start(layer, config, layer_idx: int | None = None, *, reproduced: tuple[str, ...] = ()) -> int:
    """The checks every Hugging Face converter (and :func:`from_hf`) runs first; returns the layer's index.

    ``layer_idx`` ``None`` is the index the layer was built with (its own ``layer_idx``; 0
    for a layer that records none); a given one must be an int >= 0 equal to the layer's
    own, so a converter called directly can never build the block of another layer type.
    A layer in training mode with a dropout probability > 0 in one of the config fields
    :data:`_LAYER_DROPOUTS`, other than those the converter ``reproduced``, is refused: the
    block's one ``dropout`` (attention weights, FFN hidden units and branch outputs alike)
    cannot apply it where the layer does. In eval mode dropout does nothing and is ignored.

    Raises:
        TypeError: a ``layer_idx`` that is not an int.
        ValueError: a negative ``layer_idx`` or one unequal to the layer's own, or a layer in
            training mode with such a dropout (the message names the config field).
    """
    layer_idx = _resolve_layer_idx(layer, layer_idx)
    if layer.training:
        for field in _LAYER_DROPOUTS:
            p = getattr(config, field, None)
            if field not in reproduced and isinstance(p, (int, float)) and p > 0:
                raise ValueError(f"this {type(layer).__name__} is in training mode with config.{field}={p}, a "
                                 "dropout d2lmini's block cannot apply where the layer does: call layer.eval() "
                                 f"(dropout does nothing in eval mode) or set {field}=0")
    return layer_idx


def _attention_and_branch_dropout(layer, config, attention: str, branch: str) -> float:
    """The block ``dropout`` reproducing a layer that drops out its attention weights with ``config.<attention>``
    and each branch output (before the residual sum) with ``config.<branch>`` and nothing else (BERT, GPT-2):
    the common probability in training mode when the two are equal, else 0 (where :func:`_start` refuses a
    training-mode layer with either > 0). The block then needs an FFN without dropout (:func:`_ffn_kwargs`)."""
    p_attention, p_branch = getattr(config, attention), getattr(config, branch)
    return float(p_branch) if layer.training and p_attention == p_branch else 0.0


def _ffn_kwargs(d: int, ffn_num_hiddens: int, act: str, bias: bool, dropout: float) -> dict:
    """``TransformerBlock`` FFN arguments: ``act``/``ffn_num_hiddens``, or with a block ``dropout`` > 0 an
    ``ffn_factory`` of a :class:`~d2lmini.ffn.FeedForward` without dropout on its hidden units."""
    if dropout == 0:
        return {"act": act, "ffn_num_hiddens": ffn_num_hiddens}
    return {"ffn_factory": lambda: FeedForward(d, ffn_num_hiddens, act=act, bias=bias)}


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
    biases everywhere, bidirectional attention -- or causal with ``config.is_decoder``
    (``BertLayer`` passes ``is_causal=config.is_decoder`` to its attention). In training
    mode, BERT's dropouts (``attention_probs_dropout_prob`` on the attention weights,
    ``hidden_dropout_prob`` on each branch output) are reproduced when they are equal
    (BERT's default: 0.1): ``dropout=p`` and an FFN without dropout on its hidden units.

    Args:
        layer, config: a ``BertLayer`` and its ``BertConfig``.

    Returns:
        The post-LN block.

    Raises:
        ValueError: for ``config.add_cross_attention`` (a decoder layer with cross-attention,
            which a :class:`TransformerBlock` does not have), a layer in training mode whose two
            dropouts differ, or an unsupported activation.
    """
    if getattr(config, "add_cross_attention", False):
        raise ValueError("BERT with add_cross_attention=True (cross-attention to an encoder) is not supported; "
                         "use add_cross_attention=False")
    dropout = _attention_and_branch_dropout(layer, config, "attention_probs_dropout_prob", "hidden_dropout_prob")
    _start(layer, config, reproduced=("attention_probs_dropout_prob", "hidden_dropout_prob") if dropout else ())
    attn = layer.attention.self
    d = config.hidden_size
    block = TransformerBlock(d, config.num_attention_heads, norm="layer", placement="post", bias=True,
                             eps=config.layer_norm_eps, causal=bool(config.is_decoder), dropout=dropout,
                             **_ffn_kwargs(d, config.intermediate_size, _hf_act(config.hidden_act), True, dropout))
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
    they are transposed into ``nn.Linear``'s (out, in). In training mode, GPT-2's dropouts
    (``attn_pdrop`` on the attention weights, ``resid_pdrop`` on each branch output) are
    reproduced when they are equal (GPT-2's default: 0.1): ``dropout=p`` and an FFN
    without dropout on its hidden units.

    Args:
        layer, config: a ``GPT2Block`` and its ``GPT2Config``.

    Returns:
        The pre-LN causal block.

    Raises:
        ValueError: for GPT-2 options d2lmini does not implement
            (``scale_attn_by_inverse_layer_idx``, unscaled attention, ``add_cross_attention``), a
            layer in training mode whose two dropouts differ, or an unsupported activation.
    """
    if getattr(config, "add_cross_attention", False):
        raise ValueError("GPT-2 with add_cross_attention=True is not supported; use add_cross_attention=False")
    dropout = _attention_and_branch_dropout(layer, config, "attn_pdrop", "resid_pdrop")
    _start(layer, config, reproduced=("attn_pdrop", "resid_pdrop") if dropout else ())
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) or not getattr(config, "scale_attn_weights", True):
        raise ValueError("only GPT-2's default attention scaling 1/sqrt(head_dim) is supported")
    d, h = config.n_embd, config.n_head
    inner = config.n_inner or 4 * d
    block = TransformerBlock(d, h, norm="layer", placement="pre", bias=True, eps=config.layer_norm_epsilon,
                             causal=True, dropout=dropout,
                             **_ffn_kwargs(d, inner, _hf_act(config.activation_function), True, dropout))
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


def _gated_act(name: str) -> str:
    """The d2lmini name of a gated MLP ``down(act(gate(x)) * up(x))`` with Hugging Face activation ``name``."""
    table = {"silu": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"}
    if name not in table:
        raise ValueError(f"unsupported gated-MLP activation {name!r}; supported: {tuple(table)}")
    return table[name]


#: RoPE types of ``config.rope_parameters`` whose frequencies d2lmini reproduces: ``'default'`` and
#: :data:`d2lmini.attention.ROPE_SCALINGS` (``'dynamic'`` and ``'longrope'`` are refused).
_ROPE_TYPES = ("default",) + tuple(ROPE_SCALINGS)


def _rope_kwargs(config, layer_type: str | None = None, *, partial: bool = False,
                 query_scaling: bool = False) -> dict:
    """The RoPE of a layer of type ``layer_type`` as :class:`~d2lmini.block.TransformerBlock` arguments.

    The one place a Hugging Face ``config``'s RoPE is read. It follows what
    ``modeling_rope_utils`` (``standardize_rope_params`` and ``ROPE_INIT_FUNCTIONS``,
    ``transformers`` 5.24) computes for a rotary table: ``config.rope_parameters`` --
    the entry of ``layer_type`` where the parameters are given per layer type (Gemma 3,
    OLMo 3) -- or, in older configs, ``config.rope_theta``; the legacy key ``'type'``
    for ``'rope_type'``; ``partial_rotary_factor`` from the parameters or the config.

    Returns:
        ``{'rope_theta': float, 'rope_scaling': dict | None, 'rotary_dim': int | None}``.
        ``rope_scaling`` (``None`` for ``'default'``) holds the keys the Hugging Face
        initializer of that ``rope_type`` reads, and nothing else (so model-specific
        keys such as Ministral 3's ``llama_4_scaling_beta`` are left out): for YaRN, a
        missing ``factor`` is ``max_position_embeddings / original_max_position_embeddings``,
        ``truncate`` is read from the top level of ``rope_parameters`` (as
        ``_compute_yarn_parameters`` does), and ``mscale``/``mscale_all_dim`` are kept only
        when both are set (non-zero), the only case in which ``transformers`` uses them.
        ``rotary_dim`` is ``int(head_dim * partial_rotary_factor)``, or ``None`` for full RoPE;
        for ``'proportional'`` (Gemma 4) ``partial_rotary_factor`` stays in ``rope_scaling``
        (it sets which frequencies are zero, not which features rotate) and ``rotary_dim`` is ``None``.

    Args:
        config: a Hugging Face model configuration.
        layer_type: the layer's type (``config.layer_types[layer_idx]``) or ``None``.
        partial: whether the model's attention applies partial RoPE (rotates only the
            first ``rotary_dim`` features); if not, a ``partial_rotary_factor`` below 1 is refused.
        query_scaling: also return ``'query_scaling'``: ``(beta, L)`` with ``beta =
            rope_parameters['llama_4_scaling_beta']`` and ``L =
            rope_parameters['original_max_position_embeddings']`` (Ministral 3's Llama 4-style
            query scaling, ``modeling_ministral3.get_llama_4_attn_scale``), or ``None`` where ``beta`` is 0.

    Raises:
        ValueError: a ``rope_type`` d2lmini does not reproduce (``'dynamic'``, whose
            frequencies change with the sequence length, ``'longrope'``, ...), partial
            RoPE where ``partial`` is ``False``, or with ``query_scaling`` parameters without
            ``llama_4_scaling_beta`` or ``original_max_position_embeddings``.
    """
    params = getattr(config, "rope_parameters", None)
    if params is None:
        params = {"rope_theta": config.rope_theta}
    top = params
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise ValueError(f"rope_type={rope_type!r} is not supported; supported: {_ROPE_TYPES}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    fraction = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    rotary_dim = None
    if fraction not in (None, 1, 1.0) and rope_type != "proportional":  # proportional: a frequency rule
        if not partial:
            raise ValueError(f"only full RoPE is supported for this layer, got partial_rotary_factor={fraction!r}")
        rotary_dim = int(head_dim * fraction)
    scaling = None
    if rope_type != "default":
        required, optional = ROPE_SCALINGS[rope_type]
        scaling = {"rope_type": rope_type}
        scaling.update({key: params[key] for key in required + optional if params.get(key) is not None})
        if rope_type == "yarn":
            if scaling.get("factor") is None and "original_max_position_embeddings" in scaling:
                scaling["factor"] = config.max_position_embeddings / scaling["original_max_position_embeddings"]
            scaling.pop("truncate", None)
            if top.get("truncate") is not None:
                scaling["truncate"] = top["truncate"]
            if not (scaling.get("mscale") and scaling.get("mscale_all_dim")):
                scaling.pop("mscale", None)
                scaling.pop("mscale_all_dim", None)
    rope = {"rope_theta": float(params["rope_theta"]), "rope_scaling": scaling, "rotary_dim": rotary_dim}
    if query_scaling:
        beta, period = params.get("llama_4_scaling_beta"), params.get("original_max_position_embeddings")
        if beta is None or period is None:
            raise ValueError("Ministral 3 needs rope_parameters['llama_4_scaling_beta'] and "
                             f"['original_max_position_embeddings'] (its query scaling), got {beta!r} and {period!r}")
        rope["query_scaling"] = (beta, period) if beta else None
    return rope


def _rope_theta(config, layer_type: str | None = None, *, partial: bool = False) -> float:
    """The RoPE base of a layer with unscaled RoPE (:func:`_rope_kwargs`); ValueError for scaled RoPE, and for
    partial RoPE unless ``partial`` (the layer then reads its rotated width itself)."""
    rope = _rope_kwargs(config, layer_type, partial=partial)
    if rope["rope_scaling"] is not None:
        raise ValueError(f"only default RoPE is supported here, got rope_type={rope['rope_scaling']['rope_type']!r}")
    return rope["rope_theta"]


def _layer_type(config, layer_idx: int) -> str | None:
    """``config.layer_types[layer_idx]`` (e.g. ``'sliding_attention'``), or ``None`` for a model without them."""
    types = getattr(config, "layer_types", None)
    if types is None:
        return None
    if not 0 <= layer_idx < len(types):
        raise ValueError(f"layer_idx={layer_idx} is outside config.layer_types (length {len(types)})")
    return types[layer_idx]


def _window(config, layer_idx: int) -> int | None:
    """The window of layer ``layer_idx``: ``config.sliding_window`` where ``config.layer_types`` says
    ``'sliding_attention'`` (the layer type each model builds its sliding-window mask for), else ``None``."""
    return config.sliding_window if _layer_type(config, layer_idx) == "sliding_attention" else None


def _gated_decoder(layer, config, placement: str, qk_norm: str | None, act: str = "swiglu",
                   unit_offset: bool = False, attn_scale: float | None = None,
                   layer_type: str | None = None, window: int | None = None,
                   residual_multiplier: float = 1.0, *, norm: str = "rms", eps: float | None = None,
                   bias: bool | str | None = None, rope: bool = True,
                   logit_softcap: float | None = None,
                   query_scaling: bool = False) -> TransformerBlock:
    """Shared mapping of the Llama family (q/k/v/o_proj; gate/up/down_proj or c_fc/c_proj; RoPE).

    ``norm``/``eps`` are the block norms' type and epsilon (default RMSNorm with
    ``config.rms_norm_eps``); ``bias`` is the attention's (q, k, v and o; ``'qkv'``: q, k, v),
    default ``config.attention_bias``; the gated MLP has biases when ``config.mlp_bias`` (Llama,
    Granite, SmolLM3), and where they differ from the attention's the FFN comes from
    ``ffn_factory`` (any combination of ``attention_bias`` and ``mlp_bias`` is reproduced);
    ``rope=False`` is a NoPE layer, else the layer's RoPE (base, scaling and, with
    ``query_scaling``, Ministral 3's query scaling, as :func:`_rope_kwargs` reads them); a plain
    MLP (``c_fc``/``c_proj``, StarCoder2) takes ``act`` as a plain
    activation and the attention's biases (``use_bias``).
    """
    attn, mlp = layer.self_attn, layer.mlp
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rms_eps = getattr(config, "rms_norm_eps", None)
    bias = bool(getattr(config, "attention_bias", False)) if bias is None else bias
    plain = hasattr(mlp, "c_fc")  # a plain two-matrix MLP (StarCoder2), biased as the attention
    ffn_bias = bias is True if plain else bool(getattr(config, "mlp_bias", False))
    ffn = {"act": act, "ffn_num_hiddens": config.intermediate_size}
    if ffn_bias != (bias is True):
        ffn = {"ffn_factory": lambda: FeedForward(config.hidden_size, config.intermediate_size, act=act, bias=ffn_bias)}
    block = TransformerBlock(config.hidden_size, config.num_attention_heads, norm=norm,
                             placement=placement, bias=bias, num_kv_heads=config.num_key_value_heads, **ffn,
                             eps=rms_eps if eps is None else eps, causal=True, head_dim=head_dim, qk_norm=qk_norm,
                             qk_norm_eps=rms_eps if qk_norm else None,
                             attn_scale=attn_scale, window=window, logit_softcap=logit_softcap,
                             residual_multiplier=residual_multiplier,
                             **(_rope_kwargs(config, layer_type, query_scaling=query_scaling) if rope else {}))
    _copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    if plain:
        _copy_mlp(block, mlp.c_fc, mlp.c_proj)
    else:
        _copy_mlp(block, mlp.up_proj, mlp.down_proj, gate=mlp.gate_proj)
    if qk_norm is not None:
        _copy_norm(block.attention.q_norm, attn.q_norm, unit_offset)
        _copy_norm(block.attention.k_norm, attn.k_norm, unit_offset)
    return block


def _pre_norm_decoder(layer, config, qk_norm: str | None = None, **kwargs) -> TransformerBlock:
    """A pre-norm Llama-family block (``input_layernorm``, ``post_attention_layernorm``) with the norms copied."""
    block = _gated_decoder(layer, config, "pre", qk_norm, act=_gated_act(getattr(config, "hidden_act", "silu")),
                           **kwargs)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    _copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    return block.to(layer.self_attn.q_proj.weight).train(layer.training)


def from_llama_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``LlamaDecoderLayer`` (Llama 3).

    Pre-LN with RMSNorm, grouped-query attention, RoPE (``rope_theta``), SwiGLU, no biases.

    Args:
        layer, config: a ``LlamaDecoderLayer`` and its ``LlamaConfig``.

    Returns:
        The pre-norm causal block with grouped-query attention and RoPE.

    Raises:
        ValueError: for a RoPE type d2lmini does not reproduce, MLP biases or an activation other than SiLU.
    """
    _start(layer, config)
    return _pre_norm_decoder(layer, config)


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
    _start(layer, config)
    return _pre_norm_decoder(layer, config, window=config.sliding_window)


def from_ministral_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``MinistralDecoderLayer`` (Ministral 8B, 2024).

    The Mistral block whose window is set per layer: ``config.layer_types[layer_idx]``
    ``'sliding_attention'`` gives ``window=config.sliding_window``, ``'full_attention'``
    no window (``MinistralAttention.sliding_window``; ``MinistralModel`` builds the
    matching mask per layer type).

    Args:
        layer, config: a ``MinistralDecoderLayer`` and its ``MinistralConfig``.
        layer_idx: the layer's position in the stack (selects its layer type); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`_start`).

    Returns:
        The pre-norm causal block, windowed on sliding layers.

    Raises:
        ValueError: for a RoPE type d2lmini does not reproduce or a ``layer_idx`` outside ``config.layer_types``.
    """
    layer_idx = _start(layer, config, layer_idx)
    return _pre_norm_decoder(layer, config, window=_window(config, layer_idx))


def from_qwen2_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Qwen2DecoderLayer`` (Qwen2, 2024).

    The Llama block with biases on the query, key and value projections only
    (``bias='qkv'``; ``Qwen2Attention``'s ``o_proj`` has none). With
    ``use_sliding_window`` the layers from ``max_window_layers`` on are
    ``'sliding_attention'`` in ``config.layer_types`` and get ``window=config.sliding_window``.

    Args:
        layer, config: a ``Qwen2DecoderLayer`` and its ``Qwen2Config``.
        layer_idx: the layer's position in the stack (selects its layer type); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`_start`).

    Returns:
        The pre-norm causal block with q/k/v biases.

    Raises:
        ValueError: for a RoPE type d2lmini does not reproduce or a ``layer_idx`` outside ``config.layer_types``.
    """
    layer_idx = _start(layer, config, layer_idx)
    return _pre_norm_decoder(layer, config, bias="qkv", window=_window(config, layer_idx))


def from_qwen3_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Qwen3DecoderLayer`` (Qwen3, 2025).

    As Llama, plus QK-norm per head with one gain shared by all heads, and a
    ``head_dim`` set independently of ``hidden_size / num_attention_heads``.

    Args:
        layer, config: a ``Qwen3DecoderLayer`` and its ``Qwen3Config``.

    Returns:
        The Llama-style block with per-head QK-norm.

    Raises:
        ValueError: for a sliding-window configuration (``use_sliding_window``), a RoPE type d2lmini does not reproduce.
    """
    _start(layer, config)
    if getattr(config, "use_sliding_window", False):
        raise ValueError("Qwen3's use_sliding_window is not supported")
    return _pre_norm_decoder(layer, config, "per_head")


def from_granite_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``GraniteDecoderLayer`` (IBM Granite 3.0, 2024).

    The Llama block with ``residual_multiplier`` scaling both branches
    (``x + m * F(Norm(x))``) and ``attention_multiplier`` as the logit scale
    (``attn_scale``) instead of ``1/sqrt(head_dim)``. Granite's two other multipliers,
    ``embedding_multiplier`` (on the token embeddings) and ``logits_scaling`` (dividing
    the LM head's logits), act outside the decoder layers and are not part of the block.

    Args:
        layer, config: a ``GraniteDecoderLayer`` and its ``GraniteConfig``.

    Returns:
        The pre-norm causal block with both multipliers.

    Raises:
        ValueError: for MLP biases or a RoPE type d2lmini does not reproduce.
    """
    _start(layer, config)
    return _pre_norm_decoder(layer, config, attn_scale=config.attention_multiplier,
                             residual_multiplier=config.residual_multiplier)


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
            index the layer was built with; a given one must equal it (:func:`_start`).

    Returns:
        The pre-norm causal block, with or without RoPE.

    Raises:
        ValueError: for a RoPE type d2lmini does not reproduce or a ``layer_idx`` outside ``config.layer_types``
            or ``config.no_rope_layers``.
    """
    layer_idx = _start(layer, config, layer_idx)
    window = _window(config, layer_idx)  # as SmolLM3Model's masks, whatever use_sliding_window says
    if not 0 <= layer_idx < len(config.no_rope_layers):
        raise ValueError(f"layer_idx={layer_idx} is outside config.no_rope_layers "
                         f"(length {len(config.no_rope_layers)})")
    return _pre_norm_decoder(layer, config, rope=bool(config.no_rope_layers[layer_idx]), window=window)


def from_olmo_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``OlmoDecoderLayer`` (OLMo, 2024).

    Pre-LN with a *non-parametric* LayerNorm (no gain, no bias; ``OlmoLayerNorm``, whose
    eps is fixed at 1e-5 whatever the config says), RoPE, SwiGLU, no biases.

    Args:
        layer, config: a ``OlmoDecoderLayer`` and its ``OlmoConfig``.

    Returns:
        The pre-norm block with ``norm='layer_nonparametric'``.

    Raises:
        ValueError: for ``clip_qkv`` (OLMo's clamping of q, k and v, which d2lmini does not
            implement), biases or a RoPE type d2lmini does not reproduce.
    """
    _start(layer, config)
    if getattr(config, "clip_qkv", None) is not None:
        raise ValueError(f"OLMo's clip_qkv={config.clip_qkv!r} is not supported; use clip_qkv=None")
    block = _gated_decoder(layer, config, "pre", None, act=_gated_act(config.hidden_act),
                           norm="layer_nonparametric", eps=1e-5)
    return block.to(layer.self_attn.q_proj.weight).train(layer.training)


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
    return from_olmo3_layer(layer, config)


def from_olmo3_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Olmo3DecoderLayer`` (OLMo 3, 2025).

    OLMo 2's block (``'post_sublayer'`` RMSNorm, QK-norm over the projection) with
    layer types: a ``'sliding_attention'`` layer in ``config.layer_types`` gets
    ``window=config.sliding_window`` and the RoPE base of
    ``config.rope_parameters['sliding_attention']``, a ``'full_attention'`` layer no
    window and the full layers' RoPE.

    Args:
        layer, config: a ``Olmo3DecoderLayer`` and its ``Olmo3Config`` (or an OLMo 2 pair).
        layer_idx: the layer's position in the stack (selects its type); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`_start`).

    Returns:
        The ``'post_sublayer'`` block, windowed on sliding layers.

    Raises:
        ValueError: for a RoPE type d2lmini does not reproduce (YaRN, as on the full layers of
            released OLMo 3 models, is reproduced) or a ``layer_idx`` outside ``config.layer_types``.
    """
    layer_idx = _start(layer, config, layer_idx)
    block = _gated_decoder(layer, config, "post_sublayer", "projection", act=_gated_act(config.hidden_act),
                           layer_type=_layer_type(config, layer_idx), window=_window(config, layer_idx))
    _copy_norm(block.addnorm1.norm_out, layer.post_attention_layernorm)
    _copy_norm(block.addnorm2.norm_out, layer.post_feedforward_layernorm)
    return block.to(layer.post_attention_layernorm.weight).train(layer.training)


def from_starcoder2_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Starcoder2DecoderLayer`` (StarCoder2, 2024).

    Pre-LN with LayerNorm (gain and bias, eps ``config.norm_epsilon``), grouped-query
    attention with RoPE and ``window=config.sliding_window`` (``None``: none), a plain
    two-matrix MLP ``c_proj(act(c_fc(x)))`` (tanh GELU in StarCoder2), biases on every
    projection when ``config.use_bias``.

    Args:
        layer, config: a ``Starcoder2DecoderLayer`` and its ``Starcoder2Config``.

    Returns:
        The pre-LN causal block.

    Raises:
        ValueError: for an unsupported activation or a RoPE type d2lmini does not reproduce.
    """
    _start(layer, config)
    block = _gated_decoder(layer, config, "pre", None, act=_hf_act(config.hidden_act), norm="layer",
                           eps=config.norm_epsilon, bias=bool(config.use_bias), window=config.sliding_window)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    _copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    return block.to(layer.self_attn.q_proj.weight).train(layer.training)


def _sandwich_decoder(layer, config, qk_norm: str | None, layer_idx: int, **kwargs) -> TransformerBlock:
    """The Gemma 2/3 mapping: sandwich RMSNorms with ``1 + w`` gains, scale ``query_pre_attn_scalar ** -0.5``."""
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError("bidirectional Gemma layers (use_bidirectional_attention) are not supported")
    block = _gated_decoder(layer, config, "sandwich", qk_norm, act=_gated_act(config.hidden_activation),
                           unit_offset=True, attn_scale=config.query_pre_attn_scalar ** -0.5,
                           layer_type=_layer_type(config, layer_idx), window=_window(config, layer_idx), **kwargs)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm, unit_offset=True)
    _copy_norm(block.addnorm1.norm_out, layer.post_attention_layernorm, unit_offset=True)
    _copy_norm(block.addnorm2.norm_in, layer.pre_feedforward_layernorm, unit_offset=True)
    _copy_norm(block.addnorm2.norm_out, layer.post_feedforward_layernorm, unit_offset=True)
    return block.to(layer.input_layernorm.weight).train(layer.training)


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
            index the layer was built with; a given one must equal it (:func:`_start`).

    Returns:
        The ``'sandwich'`` block.

    Raises:
        ValueError: for bidirectional attention, a RoPE type d2lmini does not reproduce, or a ``layer_idx`` outside
            ``config.layer_types``.
    """
    layer_idx = _start(layer, config, layer_idx)
    return _sandwich_decoder(layer, config, None, layer_idx,
                             logit_softcap=config.attn_logit_softcapping)


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
            index the layer was built with; a given one must equal it (:func:`_start`).

    Returns:
        The ``'sandwich'`` block with per-head QK-norm.

    Raises:
        ValueError: for logit soft-capping, bidirectional attention, a RoPE type d2lmini does not reproduce, or a
            ``layer_idx`` outside ``config.layer_types``.
    """
    layer_idx = _start(layer, config, layer_idx)
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ValueError("attention logit soft-capping is not supported for Gemma 3")
    return _sandwich_decoder(layer, config, "per_head", layer_idx)


# --------------------------------------------------------------------------- Ministral 3, Arcee Trinity, gpt-oss


def from_ministral3_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Ministral3DecoderLayer`` (Ministral 3, 2025).

    The Mistral block (pre-norm RMSNorm, grouped-query attention, SwiGLU, no biases) with
    YaRN-scaled RoPE (``rope_scaling`` read from ``config.rope_parameters`` by
    :func:`_rope_kwargs`) and Llama 4-style position-dependent query scaling: after RoPE
    the query at position ``p`` is multiplied by ``1 + beta * log(1 + floor(p / L))``,
    ``query_scaling=(beta, L)`` with ``beta = rope_parameters['llama_4_scaling_beta']`` and
    ``L = rope_parameters['original_max_position_embeddings']``
    (``modeling_ministral3.get_llama_4_attn_scale``); ``window=config.sliding_window`` on
    every layer when it is set (``Ministral3Attention`` passes it to every layer, and
    ``Ministral3Model`` builds one sliding-window mask for all of them).

    Args:
        layer, config: a ``Ministral3DecoderLayer`` and its ``Ministral3Config``.
        layer_idx: the layer's position in the stack (every layer is alike); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`_start`).

    Returns:
        The pre-norm causal block with scaled RoPE and query scaling.

    Raises:
        ValueError: for ``rope_parameters`` without ``llama_4_scaling_beta`` or
            ``original_max_position_embeddings`` (the layer needs both), a RoPE type d2lmini
            does not reproduce, or MLP biases.
    """
    layer_idx = _start(layer, config, layer_idx)
    return _pre_norm_decoder(layer, config, window=config.sliding_window, query_scaling=True)


def _copy_gated_mlp(ffn, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> None:
    """Copy a bias-free gated MLP ``down(act(gate x) * up x)`` into a gated :class:`~d2lmini.ffn.FeedForward`."""
    _copy_linear(ffn.W_g, gate)
    _copy_linear(ffn.W_1, up)
    _copy_linear(ffn.W_2, down)


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
    ``rope_parameters``, :func:`_rope_kwargs`) and ``window=config.sliding_window``
    (``AfmoeAttention.is_local_attention``; ``AfmoeModel`` builds the sliding-window mask
    for those layers). ``mup_enabled`` scales the embeddings, outside the layers.

    Args:
        layer: an ``AfmoeDecoderLayer``; its weights are copied, not shared.
        config: the layer's ``AfmoeConfig``.
        layer_idx: the layer's position in the stack (selects global or local); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`_start`).

    Returns:
        A block on the layer's device and dtype, in the layer's train/eval mode.

    Raises:
        ValueError: for a ``layer_idx`` outside ``config.layer_types``, a RoPE type d2lmini does
            not reproduce (local layers), or an activation other than SiLU.

    Introduced in the appendix "The block zoo".
    """
    layer_idx = _start(layer, config, layer_idx)
    attn = layer.self_attn
    local = _layer_type(config, layer_idx) == "sliding_attention"  # RoPE, window: AfmoeAttention.is_local_attention
    if _gated_act(config.hidden_act) != "swiglu":
        raise ValueError(f"AFMoE's MLPs are supported with hidden_act='silu' only, got {config.hidden_act!r}")
    d, h, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    bias = bool(getattr(config, "attention_bias", False))
    local_kwargs = dict(window=_window(config, layer_idx), **_rope_kwargs(config)) if local else {}

    def attention():
        return GatedAttention(d, h, num_kv_heads=kv, head_dim=attn.head_dim, causal=True, qk_norm="per_head",
                              qk_norm_eps=config.rms_norm_eps, scale=attn.scaling, bias=bias, **local_kwargs)

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
    _copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    _copy_linear(ours.W_gate, attn.gate_proj.weight, attn.gate_proj.bias, name="W_gate")
    _copy_norm(ours.attention.q_norm, attn.q_norm)
    _copy_norm(ours.attention.k_norm, attn.k_norm)
    for mine, theirs in ((block.addnorm1.norm_in, layer.input_layernorm),
                         (block.addnorm1.norm_out, layer.post_attention_layernorm),
                         (block.addnorm2.norm_in, layer.pre_mlp_layernorm),
                         (block.addnorm2.norm_out, layer.post_mlp_layernorm)):
        _copy_norm(mine, theirs)
    mlp = layer.mlp
    if layer.moe_enabled:
        _copy_linear(block.ffn.router, mlp.router.gate.weight)
        _copy(block.ffn.expert_bias, mlp.expert_bias)
        for e, expert in enumerate(block.ffn.experts):
            gate, up = mlp.experts.gate_up_proj[e].chunk(2, dim=0)  # (2 * hidden, d): gate rows, then up rows
            _copy_gated_mlp(expert, gate, up, mlp.experts.down_proj[e])
        shared = mlp.shared_experts
        _copy_gated_mlp(block.ffn.shared, shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight)
    else:
        _copy_gated_mlp(block.ffn, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    return block.to(layer.input_layernorm.weight).train(layer.training)


def from_gpt_oss_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``GptOssDecoderLayer`` (OpenAI gpt-oss, 2025).

    Pre-norm RMSNorm; grouped-query attention with biases on q, k, v and o, a learned
    sink logit per head (``sinks=True``: ``GptOssAttention.sinks`` joins every softmax),
    YaRN-scaled RoPE (:func:`_rope_kwargs`; gpt-oss: factor 32, ``truncate=False``) and, on
    the ``'sliding_attention'`` layers of ``config.layer_types`` (gpt-oss alternates
    sliding and full layers), ``window=config.sliding_window``; and a mixture of experts
    (:class:`~d2lmini.moe.MixtureOfExperts`): a router with a bias taking the top-k
    logits and a softmax over them (``GptOssTopKRouter``; equal to the renormalized
    softmax router), experts with biases and the clamped SwiGLU
    (``act='swiglu_clamped'``, ``swiglu_limit=config.swiglu_limit``; ``GptOssExperts``,
    weights copied by :func:`_copy_gptoss_experts`), no shared expert.

    Args:
        layer, config: a ``GptOssDecoderLayer`` and its ``GptOssConfig`` (call it with
            ``attn_implementation='eager'``: gpt-oss does not support SDPA).
        layer_idx: the layer's position in the stack (selects sliding or full); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`_start`).

    Returns:
        The pre-norm causal block with sinks and the MoE FFN.

    Raises:
        ValueError: for a ``layer_idx`` outside ``config.layer_types``, a RoPE type d2lmini does
            not reproduce, or a ``swiglu_alpha`` other than 1.702.
    """
    layer_idx = _start(layer, config, layer_idx)
    attn, mlp = layer.self_attn, layer.mlp
    window = _window(config, layer_idx)
    d, num_experts = config.hidden_size, config.num_local_experts

    def ffn():
        return MixtureOfExperts(d, num_experts, top_k=config.num_experts_per_tok,
                                ffn_num_hiddens=config.intermediate_size, act="swiglu_clamped", router="softmax",
                                bias=True, router_bias=True, swiglu_limit=float(config.swiglu_limit))

    block = TransformerBlock(d, config.num_attention_heads, norm="rms", placement="pre",
                             bias=bool(config.attention_bias), num_kv_heads=config.num_key_value_heads,
                             eps=config.rms_norm_eps, causal=True, head_dim=attn.head_dim, window=window,
                             sinks=True, ffn_factory=ffn, **_rope_kwargs(config))
    _copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    _copy(block.attention.sinks, attn.sinks)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    _copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    _copy_linear(block.ffn.router, mlp.router.weight, mlp.router.bias)
    _copy_gptoss_experts(block.ffn.experts, mlp.experts)
    return block.to(layer.input_layernorm.weight).train(layer.training)


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
      (:func:`rope_interleaved_to_half`), base and scaling read by :func:`_rope_kwargs`; and,
      with ``use_qk_norm``, the gainless ``Llama4TextL2Norm`` on each query and key head
      *after* RoPE (``qk_norm='l2'``, eps ``rms_norm_eps``).
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
            default): the index the layer was built with; a given one must equal it (:func:`_start`).

    Returns:
        The pre-norm causal block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: a ``layer_idx`` outside ``config.no_rope_layers`` or ``config.layer_types``,
            a ``floor_scale`` below 1 (``query_scaling``'s period), a RoPE type d2lmini does not reproduce,
            an activation other than SiLU (or tanh GELU), or as :func:`_start`.

    Introduced in the chapter "The 2026 block".
    """
    layer_idx = _start(layer, config, layer_idx)
    attn, mlp = layer.self_attn, layer.feed_forward
    if not 0 <= layer_idx < len(config.no_rope_layers):
        raise ValueError(f"layer_idx={layer_idx} is outside config.no_rope_layers "
                         f"(length {len(config.no_rope_layers)})")
    use_rope = bool(config.no_rope_layers[layer_idx])
    d, h, hd = config.hidden_size, config.num_attention_heads, attn.head_dim
    act = _gated_act(config.hidden_act)
    chunk = config.attention_chunk_size if _layer_type(config, layer_idx) == "chunked_attention" else None
    attention = {"qk_norm": "l2" if use_rope and config.use_qk_norm else None, "qk_norm_eps": config.rms_norm_eps}
    if use_rope:
        attention.update(_rope_kwargs(config))
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
    block = TransformerBlock(d, h, norm="rms", placement="pre", bias=bool(config.attention_bias),
                             num_kv_heads=config.num_key_value_heads, eps=config.rms_norm_eps, causal=True,
                             head_dim=hd, chunk=chunk, ffn_factory=ffn, **attention)
    _copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, interleaved=hd if use_rope else None)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    _copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    if layer.is_moe_layer:
        experts, width = mlp.experts, config.intermediate_size
        _copy_linear(block.ffn.router, mlp.router.weight, mlp.router.bias, name="the router")
        for e, expert in enumerate(block.ffn.experts):
            gate_up = experts.gate_up_proj[e]  # (d, 2 * width), laid out (in, out): gate columns, then up
            _copy_gated_mlp(expert, gate_up[:, :width].t(), gate_up[:, width:].t(), experts.down_proj[e].t())
        shared = mlp.shared_expert
        _copy_gated_mlp(block.ffn.shared, shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight)
    else:
        _copy_gated_mlp(block.ffn, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    return block.to(layer.input_layernorm.weight).train(layer.training)


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
                          qk_norm="per_head", qk_norm_eps=config.rms_norm_eps, **_rope_kwargs(config, partial=True))
    q_and_gate = attn.q_proj.weight.view(h, 2, hd, d)  # per head: hd query rows, then hd gate rows
    _copy_linear(ours.attention.W_q, q_and_gate[:, 0].reshape(h * hd, d))
    _copy_linear(ours.W_gate, q_and_gate[:, 1].reshape(h * hd, d))
    _copy_linear(ours.attention.W_k, attn.k_proj.weight)
    _copy_linear(ours.attention.W_v, attn.v_proj.weight)
    _copy_linear(ours.W_o, attn.o_proj.weight)
    _copy_norm(ours.attention.q_norm, attn.q_norm, unit_offset=True)
    _copy_norm(ours.attention.k_norm, attn.k_norm, unit_offset=True)
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
    _copy_linear(ours.router, moe.gate.weight)
    for e, ffn in enumerate(ours.experts):
        gate_up = experts.gate_up_proj[e]  # (2I, d): the gate's rows, then the up projection's
        _copy_gated_mlp(ffn, gate_up[:width], gate_up[width:], experts.down_proj[e])
    shared = moe.shared_expert
    _copy_gated_mlp(ours.shared, shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight)
    _copy_linear(ours.shared_expert_gate, moe.shared_expert_gate.weight)
    return ours


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
      :func:`~d2lmini.deltanet.from_qwen3_5_gated_deltanet`), through ``attn_factory``:
      no positions, a fixed-size state instead of a key/value cache.

    Called on ``X`` and ``valid_lens``, the block equals the layer called as
    ``Qwen3_5TextModel`` calls it: a causal mask for the full layers, the 2-D padding
    mask (``create_recurrent_attention_mask``) for the linear ones.

    Args:
        layer, config: a ``Qwen3_5DecoderLayer`` and its ``Qwen3_5TextConfig``, or a
            ``Qwen3_5MoeDecoderLayer`` and its ``Qwen3_5MoeTextConfig``.
        layer_idx: the layer's position in the stack (selects its type); ``None`` (the
            default): the index the layer was built with (:func:`_start`).

    Returns:
        The block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: a layer whose MLP is neither the dense SwiGLU one nor the sparse MoE
            block, a ``shared_expert_intermediate_size`` that is not a multiple of
            ``moe_intermediate_size`` (d2lmini's shared expert is ``num_shared_experts`` expert
            widths), ``attention_bias=True``, an activation other than SiLU, or as :func:`_start`.
    """
    from .deltanet import from_qwen3_5_gated_deltanet

    layer_idx = _start(layer, config, layer_idx)
    mlp = layer.mlp
    sparse = hasattr(mlp, "shared_expert_gate")  # Qwen3_5MoeSparseMoeBlock
    if not (sparse or hasattr(mlp, "gate_proj")):
        raise ValueError(f"only Qwen3.5's dense SwiGLU MLP and its sparse MoE block are supported, "
                         f"got a {type(mlp).__name__} MLP")
    if config.hidden_act != "silu":
        raise ValueError(f"Qwen3.5's MLP is supported with hidden_act='silu' only, got {config.hidden_act!r}")
    if _layer_type(config, layer_idx) == "linear_attention":
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
        _copy_gated_mlp(block.ffn, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm, unit_offset=True)
    _copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm, unit_offset=True)
    return block.to(layer.input_layernorm.weight).train(layer.training)


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
    _copy(ours.router.weight, moe.gate.weight)
    _copy(ours.expert_bias, moe.gate.e_score_correction_bias)
    for e, ffn in enumerate(ours.experts):
        gate_up = experts.gate_up_proj[e]
        _copy_gated_mlp(ffn, gate_up[:width], gate_up[width:], experts.down_proj[e])
    shared = moe.shared_experts
    _copy_gated_mlp(ours.shared, shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight)
    return ours.to(experts.down_proj).train(moe.training)


# --------------------------------------------------------------------------- parallel blocks, partial and interleaved RoPE


def rope_interleaved_to_half(weight: torch.Tensor, head_dim: int, rotary_dim: int | None = None) -> torch.Tensor:
    """Reorder a query or key projection from interleaved RoPE pairs to the half-split layout.

    Interleaved RoPE (RoFormer; GPT-J's ``rotate_every_two``, Cohere's ``rotate_half``)
    rotates the features ``(2l, 2l + 1)`` of each head together by the angle of frequency
    ``l``; the half-split layout of :func:`d2lmini.attention.apply_rotary` rotates
    ``(l, l + r/2)``, ``r`` the rotated features. Moving, within each head, feature ``2l``
    to ``l`` and ``2l + 1`` to ``l + r/2`` (features from ``r`` on stay) turns the one
    into the other, and a checkpoint converts by permuting the rows of ``W_q`` and
    ``W_k`` (and of their biases) this way: queries and keys are permuted alike, so
    every dot product ``q . k``, hence the attention, is unchanged, while values and
    ``W_o`` are not touched (the chapter "QK-norm", section "Before RoPE, not after").

    Args:
        weight: rows grouped by head, ``(heads * head_dim, ...)``: a ``W_q``/``W_k``
            weight ``(heads * head_dim, d)`` or bias ``(heads * head_dim,)``.
        head_dim: features per head.
        rotary_dim: the first ``rotary_dim`` features of each head are rotated (partial
            RoPE, GPT-J); ``None``: all ``head_dim`` (Cohere). Even.

    Returns:
        A new tensor shaped like ``weight``, rows permuted.

    Raises:
        ValueError: ``weight``'s first dimension not a multiple of ``head_dim``, or
            ``rotary_dim`` odd or outside ``[2, head_dim]``.
        TypeError: a non-int ``head_dim``/``rotary_dim``.
    """
    from ._checks import check_int_in, check_positive_int

    head_dim = check_positive_int("head_dim", head_dim)
    r = head_dim if rotary_dim is None else check_int_in("rotary_dim", rotary_dim, 2, head_dim)
    if r % 2:
        raise ValueError(f"rotary_dim must be even (RoPE rotates pairs), got {r}")
    if weight.shape[0] % head_dim:
        raise ValueError(f"weight has {weight.shape[0]} rows, not a multiple of head_dim={head_dim}")
    order = torch.cat((interleaved_to_half_order(r), torch.arange(r, head_dim)))
    heads = weight.reshape(weight.shape[0] // head_dim, head_dim, *weight.shape[1:])
    return heads[:, order.to(weight.device)].reshape(weight.shape)


def _rotary_block(config, *, num_kv_heads: int, head_dim: int, placement: str, norm: str, eps: float, act: str,
                  bias: bool | str, ffn_bias: bool, ffn_num_hiddens: int, rope_theta: float,
                  rotary_dim: int | None, window: int | None = None) -> TransformerBlock:
    """A causal block for the RoPE families below; ``rotary_dim == head_dim`` is full RoPE.

    ``bias`` is the attention's (``True``, ``False`` or ``'qkv'``); an FFN whose biases
    differ from it (GPT-J, GPT-NeoX without ``attention_bias``, Cohere with it) comes from
    ``ffn_factory``.
    """
    from functools import partial

    from .ffn import FeedForward

    d = config.hidden_size
    kwargs = {"act": act, "ffn_num_hiddens": ffn_num_hiddens}
    if ffn_bias != (bias is True):
        kwargs = {"ffn_factory": partial(FeedForward, d, ffn_num_hiddens, act=act, bias=ffn_bias)}
    return TransformerBlock(d, config.num_attention_heads, norm=norm, placement=placement, bias=bias,
                            num_kv_heads=num_kv_heads, eps=eps, causal=True, head_dim=head_dim,
                            rope_theta=rope_theta, rotary_dim=None if rotary_dim == head_dim else rotary_dim,
                            window=window, **kwargs)


def _copy_attention(block: TransformerBlock, q: nn.Module | tuple, k: nn.Module | tuple, v: nn.Module | tuple,
                    o: nn.Module, interleaved: int | None = None) -> None:
    """Copy q, k, v (``nn.Linear`` or ``(weight, bias)``) and o into the block's attention (or the
    attention inside its :class:`~d2lmini.attention.GatedAttention`); with ``interleaved`` (the rotated
    features per head), permute the q and k rows from interleaved RoPE pairs (:func:`rope_interleaved_to_half`)."""
    gated = isinstance(block.attention, GatedAttention)
    att = block.attention.attention if gated else block.attention  # the MultiHeadAttention inside
    for ours, src in (("W_q", q), ("W_k", k), ("W_v", v)):
        weight, bias = src if isinstance(src, tuple) else (src.weight, src.bias)
        if interleaved is not None and ours != "W_v":
            weight = rope_interleaved_to_half(weight, att.head_dim, interleaved)
            bias = None if bias is None else rope_interleaved_to_half(bias, att.head_dim, interleaved)
        _copy_linear(getattr(att, ours), weight, bias, name=ours)
    _copy_linear(block.attention.W_o, o.weight, o.bias, name="W_o")


def _copy_mlp(block: TransformerBlock, up: nn.Module, down: nn.Module, gate: nn.Module | None = None) -> None:
    """Copy a plain MLP ``down(act(up(x)))``, or a gated one ``down(act(gate(x)) * up(x))``, with its biases."""
    _copy_linear(block.ffn.W_1, up.weight, up.bias, name="the FFN's W_1")
    _copy_linear(block.ffn.W_2, down.weight, down.bias, name="the FFN's W_2")
    if gate is not None:
        _copy_linear(block.ffn.W_g, gate.weight, gate.bias, name="the FFN's W_g")


def _copy_parallel_or_pre_norms(block: TransformerBlock, first: nn.Module, second: nn.Module | None) -> None:
    """Copy the norm before attention and, unless the block shares it (``'parallel'``), the one before the FFN."""
    _copy_norm(block.addnorm1.norm_in, first)
    if block.placement != "parallel":
        _copy_norm(block.addnorm2.norm_in, second)


def from_phi_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``PhiDecoderLayer`` (Phi-1, Phi-1.5, Phi-2; 2023).

    Attention and MLP in parallel on one shared LayerNorm (``placement='parallel'``:
    ``x + Attn(LN(x)) + MLP(LN(x))``, eps ``config.layer_norm_eps``), biases on every
    projection, a plain MLP ``fc2(gelu_new(fc1(x)))`` (tanh GELU), and partial RoPE on the
    first ``rotary_dim = int(head_dim * partial_rotary_factor)`` features of each head
    (0.5 in Phi-2; ``PhiAttention.rotary_ndims``), half-split layout.

    Args:
        layer, config: a ``PhiDecoderLayer`` and its ``PhiConfig``.

    Returns:
        The ``'parallel'`` causal block with partial RoPE.

    Raises:
        ValueError: for ``qk_layernorm`` (a LayerNorm with bias on each head's queries and
            keys, which d2lmini's RMSNorm QK-norms do not implement), scaled RoPE, or an
            unsupported activation.
    """
    _start(layer, config)
    if config.qk_layernorm:
        raise ValueError("Phi's qk_layernorm (LayerNorm with bias on q and k) is not supported; use qk_layernorm=False")
    attn = layer.self_attn
    block = _rotary_block(config, num_kv_heads=config.num_key_value_heads, head_dim=attn.head_dim,
                          placement="parallel", norm="layer", eps=config.layer_norm_eps, act=_hf_act(config.hidden_act),
                          bias=True, ffn_bias=True, ffn_num_hiddens=config.intermediate_size,
                          rope_theta=_rope_theta(config, partial=True), rotary_dim=attn.rotary_ndims)
    _copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.dense)
    _copy_mlp(block, layer.mlp.fc1, layer.mlp.fc2)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)  # addnorm2 shares it
    return block.to(attn.q_proj.weight).train(layer.training)


def from_phi3_layer(layer, config) -> TransformerBlock:
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

    Returns:
        The pre-norm causal block.

    Raises:
        ValueError: for scaled RoPE (``rope_type='longrope'``, the 128k-context Phi-3 models)
            or an unsupported gated activation.
    """
    _start(layer, config)
    attn, mlp = layer.self_attn, layer.mlp
    head_dim, kv = attn.head_dim, config.num_key_value_heads
    fraction = config.rope_parameters.get("partial_rotary_factor", 1.0)
    block = _rotary_block(config, num_kv_heads=kv, head_dim=head_dim, placement="pre", norm="rms",
                          eps=config.rms_norm_eps, act=_gated_act(config.hidden_act), bias=False, ffn_bias=False,
                          ffn_num_hiddens=config.intermediate_size, rope_theta=_rope_theta(config, partial=True),
                          rotary_dim=int(head_dim * fraction), window=config.sliding_window)
    q_rows = config.num_attention_heads * head_dim
    Wq, Wk, Wv = attn.qkv_proj.weight.split([q_rows, kv * head_dim, kv * head_dim])
    _copy_attention(block, (Wq, None), (Wk, None), (Wv, None), attn.o_proj)
    gate, up = mlp.gate_up_proj.weight.chunk(2, dim=0)
    _copy_gated_mlp(block.ffn, gate, up, mlp.down_proj.weight)
    _copy_parallel_or_pre_norms(block, layer.input_layernorm, layer.post_attention_layernorm)
    return block.to(attn.qkv_proj.weight).train(layer.training)


def from_gpt_neox_layer(layer, config) -> TransformerBlock:
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

    Returns:
        The ``'parallel_two_norms'`` (or ``'pre'``) causal block with partial RoPE.

    Raises:
        ValueError: for scaled RoPE or an unsupported activation.
    """
    _start(layer, config)
    attn = layer.attention
    h, head_dim, bias = config.num_attention_heads, attn.head_size, bool(config.attention_bias)
    block = _rotary_block(config, num_kv_heads=h, head_dim=head_dim,
                          placement="parallel_two_norms" if config.use_parallel_residual else "pre", norm="layer",
                          eps=config.layer_norm_eps, act=_hf_act(config.hidden_act), bias=bias, ffn_bias=True,
                          ffn_num_hiddens=config.intermediate_size, rope_theta=_rope_theta(config, partial=True),
                          rotary_dim=attn.rotary_ndims)
    W = attn.query_key_value.weight.reshape(h, 3, head_dim, -1)
    b = attn.query_key_value.bias
    b = None if b is None else b.reshape(h, 3, head_dim)
    q, k, v = ((W[:, i].reshape(h * head_dim, -1), None if b is None else b[:, i].reshape(-1)) for i in range(3))
    _copy_attention(block, q, k, v, attn.dense)
    _copy_mlp(block, layer.mlp.dense_h_to_4h, layer.mlp.dense_4h_to_h)
    _copy_parallel_or_pre_norms(block, layer.input_layernorm, layer.post_attention_layernorm)
    return block.to(W).train(layer.training)


def from_gptj_block(layer, config) -> TransformerBlock:
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

    Returns:
        The ``'parallel'`` causal block with partial RoPE.

    Raises:
        ValueError: for an unsupported activation.
    """
    _start(layer, config)
    attn = layer.attn
    block = _rotary_block(config, num_kv_heads=config.num_attention_heads, head_dim=attn.head_dim,
                          placement="parallel", norm="layer", eps=config.layer_norm_epsilon,
                          act=_hf_act(config.activation_function), bias=False, ffn_bias=True,
                          ffn_num_hiddens=layer.mlp.fc_in.out_features, rope_theta=10000.0,
                          rotary_dim=config.rotary_dim)
    _copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj, interleaved=config.rotary_dim)
    _copy_mlp(block, layer.mlp.fc_in, layer.mlp.fc_out)
    _copy_norm(block.addnorm1.norm_in, layer.ln_1)  # addnorm2 shares it
    return block.to(attn.q_proj.weight).train(layer.training)


def from_falcon_layer(layer, config) -> TransformerBlock:
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
    refused (:func:`_start`); in eval mode dropout does nothing.

    Args:
        layer, config: a ``FalconDecoderLayer`` and its ``FalconConfig``.

    Returns:
        The causal block.

    Raises:
        ValueError: for ALiBi (``config.alibi``, Falcon-RW), scaled RoPE or an unsupported
            activation.
    """
    _start(layer, config)
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
                          eps=config.layer_norm_epsilon, act=_hf_act(config.activation), bias=bool(config.bias),
                          ffn_bias=bool(config.bias), ffn_num_hiddens=config.ffn_hidden_size,
                          rope_theta=_rope_theta(config, partial=True), rotary_dim=head_dim)
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
    _copy_attention(block, q, k, v, attn.dense)
    _copy_mlp(block, layer.mlp.dense_h_to_4h, layer.mlp.dense_4h_to_h)
    if placement == "parallel_two_norms":
        _copy_parallel_or_pre_norms(block, layer.ln_attn, layer.ln_mlp)
    else:
        _copy_parallel_or_pre_norms(block, layer.input_layernorm, getattr(layer, "post_attention_layernorm", None))
    return block.to(W).train(layer.training)


def from_cohere_layer(layer, config) -> TransformerBlock:
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

    Returns:
        The ``'parallel'`` causal block.

    Raises:
        ValueError: for ``use_qk_norm`` (Command R+'s QK-norm is a mean-subtracting
            LayerNorm with a distinct gain per head; d2lmini's QK-norms are RMSNorms),
            scaled RoPE or an unsupported gated activation.
    """
    _start(layer, config)
    if config.use_qk_norm:
        raise ValueError("Cohere's use_qk_norm (a LayerNorm per head) is not supported; d2lmini's QK-norms are "
                         "RMSNorms. Use use_qk_norm=False")
    attn, mlp = layer.self_attn, layer.mlp
    block = _rotary_block(config, num_kv_heads=config.num_key_value_heads, head_dim=attn.head_dim,
                          placement="parallel", norm="layer_no_bias", eps=config.layer_norm_eps,
                          act=_gated_act(config.hidden_act), bias=bool(config.attention_bias), ffn_bias=False,
                          ffn_num_hiddens=config.intermediate_size, rope_theta=_rope_theta(config, partial=True),
                          rotary_dim=attn.head_dim)
    _copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, interleaved=attn.head_dim)
    _copy_mlp(block, mlp.up_proj, mlp.down_proj, gate=mlp.gate_proj)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)  # addnorm2 shares it
    return block.to(attn.q_proj.weight).train(layer.training)


def from_stablelm_layer(layer, config) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``StableLmDecoderLayer`` (StableLM 3B, StableLM 2; 2023-24).

    Pre-LN with LayerNorm (gain and bias, eps ``config.layer_norm_eps``), or with
    ``use_parallel_residual`` (StableLM 2 12B) attention and MLP in parallel on the one
    ``input_layernorm`` (``placement='parallel'``); grouped-query attention with biases on
    q, k and v only when ``use_qkv_bias`` (StableLM 2: ``bias='qkv'``), a SwiGLU MLP
    without biases, RoPE on the first ``int(head_dim * partial_rotary_factor)`` features
    of each head (0.25; ``StableLmAttention.rotary_ndims``), half-split. StableLM drops
    out only the MLP branch (``hidden_dropout``), which the block, dropping out each branch,
    cannot: a layer in training mode with a dropout > 0 is refused (:func:`_start`); in
    eval mode dropout does nothing.

    Args:
        layer, config: a ``StableLmDecoderLayer`` and its ``StableLmConfig``.

    Returns:
        The ``'pre'`` (or ``'parallel'``) causal block with partial RoPE.

    Raises:
        ValueError: for ``qk_layernorm`` (a LayerNorm per head, StableLM 2 12B; d2lmini's
            QK-norms are RMSNorms), scaled RoPE or an unsupported gated activation.
    """
    _start(layer, config)
    if config.qk_layernorm:
        raise ValueError("StableLM's qk_layernorm (a LayerNorm per head) is not supported; d2lmini's QK-norms are "
                         "RMSNorms. Use qk_layernorm=False")
    attn, mlp = layer.self_attn, layer.mlp
    block = _rotary_block(config, num_kv_heads=config.num_key_value_heads, head_dim=attn.head_dim,
                          placement="parallel" if config.use_parallel_residual else "pre", norm="layer",
                          eps=config.layer_norm_eps, act=_gated_act(config.hidden_act),
                          bias="qkv" if config.use_qkv_bias else False, ffn_bias=False,
                          ffn_num_hiddens=config.intermediate_size, rope_theta=_rope_theta(config, partial=True),
                          rotary_dim=attn.rotary_ndims)
    _copy_attention(block, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    _copy_mlp(block, mlp.up_proj, mlp.down_proj, gate=mlp.gate_proj)
    _copy_parallel_or_pre_norms(block, layer.input_layernorm, layer.post_attention_layernorm)
    return block.to(attn.q_proj.weight).train(layer.training)


#: ``from_hf``'s dispatch table: Hugging Face layer class name -> converter ``(layer, config, layer_idx)``.
HF_CONVERTERS: dict[str, Callable] = {
    "BertLayer": lambda layer, config, layer_idx: from_bert_layer(layer, config),
    "GPT2Block": lambda layer, config, layer_idx: from_gpt2_block(layer, config),
    "LlamaDecoderLayer": lambda layer, config, layer_idx: from_llama_layer(layer, config),
    "MistralDecoderLayer": lambda layer, config, layer_idx: from_mistral_layer(layer, config),
    "MinistralDecoderLayer": from_ministral_layer,
    "Qwen2DecoderLayer": from_qwen2_layer,
    "Qwen3DecoderLayer": lambda layer, config, layer_idx: from_qwen3_layer(layer, config),
    "Gemma2DecoderLayer": from_gemma2_layer,
    "Gemma3DecoderLayer": from_gemma3_layer,
    "OlmoDecoderLayer": lambda layer, config, layer_idx: from_olmo_layer(layer, config),
    "Olmo2DecoderLayer": lambda layer, config, layer_idx: from_olmo2_layer(layer, config),
    "Olmo3DecoderLayer": from_olmo3_layer,
    "Starcoder2DecoderLayer": lambda layer, config, layer_idx: from_starcoder2_layer(layer, config),
    "GraniteDecoderLayer": lambda layer, config, layer_idx: from_granite_layer(layer, config),
    "SmolLM3DecoderLayer": from_smollm3_layer,
    "Ministral3DecoderLayer": from_ministral3_layer,
    "AfmoeDecoderLayer": from_afmoe_layer,
    "GptOssDecoderLayer": from_gpt_oss_layer,
    "Qwen3_5DecoderLayer": from_qwen3_5_layer,
    "Llama4TextDecoderLayer": from_llama4_layer,
    "Qwen3_5MoeDecoderLayer": from_qwen3_5_layer,
    "PhiDecoderLayer": lambda layer, config, layer_idx: from_phi_layer(layer, config),
    "Phi3DecoderLayer": lambda layer, config, layer_idx: from_phi3_layer(layer, config),
    "GPTNeoXLayer": lambda layer, config, layer_idx: from_gpt_neox_layer(layer, config),
    "GPTJBlock": lambda layer, config, layer_idx: from_gptj_block(layer, config),
    "FalconDecoderLayer": lambda layer, config, layer_idx: from_falcon_layer(layer, config),
    "CohereDecoderLayer": lambda layer, config, layer_idx: from_cohere_layer(layer, config),
    "StableLmDecoderLayer": lambda layer, config, layer_idx: from_stablelm_layer(layer, config),
}


def from_hf(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to a Hugging Face decoder (or encoder) layer.

    The one entry point for every supported layer: it dispatches on the layer's class
    name (so ``transformers`` stays an optional import) through :data:`HF_CONVERTERS`
    to the ``from_*`` function of that class, which returns a block holding copies of
    the layer's weights, on its device and dtype, in its train/eval mode. Called on
    ``X`` and ``valid_lens``, the block equals the layer called with its model's own
    masks (causal, sliding-window or chunked where the layer has one, right padding), rotary
    tables for positions ``0 .. n-1`` and position ids ``0 .. n-1`` -- at the valid
    positions (see :mod:`d2lmini.zoo`, which checks every row).

    Supported classes: ``BertLayer`` (BERT), ``GPT2Block`` (GPT-2),
    ``LlamaDecoderLayer`` (Llama), ``MistralDecoderLayer`` (Mistral),
    ``MinistralDecoderLayer`` (Ministral), ``Qwen2DecoderLayer`` (Qwen2),
    ``Qwen3DecoderLayer`` (Qwen3), ``Gemma2DecoderLayer`` (Gemma 2),
    ``Gemma3DecoderLayer`` (Gemma 3), ``OlmoDecoderLayer`` (OLMo),
    ``Olmo2DecoderLayer`` (OLMo 2), ``Olmo3DecoderLayer`` (OLMo 3),
    ``Starcoder2DecoderLayer`` (StarCoder2), ``GraniteDecoderLayer`` (IBM Granite),
    ``SmolLM3DecoderLayer`` (SmolLM3), ``Ministral3DecoderLayer`` (Ministral 3),
    ``AfmoeDecoderLayer`` (Arcee Trinity), ``GptOssDecoderLayer`` (gpt-oss),
    ``Qwen3_5DecoderLayer`` and ``Qwen3_5MoeDecoderLayer`` (Qwen3.5, both layer types, dense and MoE),
    ``GlmMoeDsaDecoderLayer`` (GLM-5: MLA with DeepSeek Sparse Attention, dense and MoE layers;
    :func:`from_glm_moe_dsa_layer`), ``Llama4TextDecoderLayer`` (Llama 4, RoPE and NoPE layers, dense
    and MoE), ``Gemma4TextDecoderLayer`` (Gemma 4, local and global layers without per-layer inputs or
    MoE; :func:`from_gemma4_layer`), ``DeepseekV4DecoderLayer`` (DeepSeek-V4: sliding-window, HCA and CSA
    layers with hash-routed or top-k MoE, on hyper-connected streams ``(b, n, hc_mult, d)``;
    :func:`from_deepseek_v4_layer`), and the parallel or partial-RoPE layers
    ``PhiDecoderLayer`` (Phi-1/2), ``Phi3DecoderLayer`` (Phi-3, Phi-4-mini),
    ``GPTNeoXLayer`` (GPT-NeoX, Pythia), ``GPTJBlock`` (GPT-J), ``FalconDecoderLayer``
    (Falcon), ``CohereDecoderLayer`` (Command R) and ``StableLmDecoderLayer`` (StableLM).

    Args:
        layer: an instance of a supported class, built from ``config``.
        config: the layer's model configuration.
        layer_idx: the layer's position in the stack (an int >= 0), or ``None`` (the default):
            the index the layer was built with. It selects the layer type of models that
            alternate them (sliding or full attention: Gemma 2/3, Ministral, OLMo 3, Qwen2,
            SmolLM3, Arcee Trinity, gpt-oss; full or linear attention: Qwen3.5; RoPE or NoPE: SmolLM3;
            chunked RoPE or full NoPE, dense or MoE: Llama 4) and must equal the index
            the layer was built with where the layer records one.

    Returns:
        The equivalent :class:`TransformerBlock`.

    Raises:
        TypeError: for a layer of an unsupported class (the message lists the supported
            ones), or a ``layer_idx`` that is not an int.
        ValueError: for a negative ``layer_idx``, one unequal to the layer's own, a layer in
            training mode with a dropout the block cannot apply where the layer does (eval mode:
            dropout is ignored, it does nothing), or a configuration option of the layer that
            d2lmini does not implement (the converter's error names it).
    """
    name = type(layer).__name__
    if name not in HF_CONVERTERS:
        raise TypeError(f"from_hf does not support {name}; supported Hugging Face layer classes: "
                        f"{', '.join(sorted(HF_CONVERTERS))}")
    return HF_CONVERTERS[name](layer, config, _resolve_layer_idx(layer, layer_idx))


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


def hf_make(model_type: str, layer_class: str, config_class: str, config_kwargs: dict, *, layer_idx: int = 0,
            attn_implementation: str = "sdpa", unit_offset_norms: bool = False) -> Callable:
    """A ``make(seed) -> (layer, config)`` for a tiny random Hugging Face layer (no download).

    The layer is ``transformers.models.<model_type>.modeling_<model_type>.<layer_class>``
    built from ``transformers.<config_class>(**config_kwargs)`` at position ``layer_idx``
    of the stack, in eval mode, every parameter seeded-random (:func:`_randomize_`; norm
    gains stored as ``w`` in ``1 + w`` centred at 0 when ``unit_offset_norms``).

    Args:
        model_type: the folder under ``transformers/models`` (e.g. ``'gemma2'``).
        layer_class, config_class: class names in the modeling module and in ``transformers``.
        config_kwargs: the tiny configuration.
        layer_idx: the layer's position in the stack (passed to the layer's constructor).
        attn_implementation: ``'sdpa'`` or ``'eager'`` (``'eager'`` where SDPA cannot run
            the layer, e.g. Gemma 2's logit soft-capping).
        unit_offset_norms: whether the layer's norm gains are stored as ``w`` in ``1 + w``.

    Raises:
        ImportError: at call time, without ``transformers``.
    """

    def make(seed):
        import importlib

        import transformers as tf

        modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        torch.manual_seed(seed)
        config = getattr(tf, config_class)(**copy.deepcopy(config_kwargs))  # configs edit nested dicts in place
        config._attn_implementation = attn_implementation
        config._experts_implementation = "eager"  # MoE layers (Trinity, gpt-oss): the plain loop over experts
        layer = getattr(modeling, layer_class)(config, layer_idx=layer_idx)
        return _randomize_(layer, seed, unit_offset_norms=unit_offset_norms).eval(), config

    return make


_MASKS = ("causal", "sliding", "bidirectional", "recurrent", "chunked")


def hf_call(model_type: str, layer_class: str, *, layer_idx: int = 0, causal: bool = True,
            mask: str | None = None, rotary: str | None | bool = True, materialize_mask: bool = False) -> Callable:
    """A ``call(layer, config, X, valid_lens)`` running a Hugging Face layer as its model would.

    Builds what the model's ``forward`` builds for layer ``layer_idx`` of a batch ``X``
    ``(b, n, d)`` right-padded to ``valid_lens``: the 2-D padding mask (1 at real tokens)
    turned into the layer's attention mask by ``transformers.masking_utils`` --
    ``create_bidirectional_mask`` for an encoder (``causal=False``),
    ``create_recurrent_attention_mask`` (the 2-D padding mask itself) for a linear-attention
    layer (``config.layer_types[layer_idx] == 'linear_attention'``, Qwen3.5's Gated DeltaNet),
    ``create_sliding_window_causal_mask`` for a sliding layer (``config.layer_types[layer_idx]
    == 'sliding_attention'``, or, in a model without layer types, ``config.sliding_window``
    set, as Mistral and StarCoder2 decide), ``create_chunked_causal_mask`` for a chunked layer
    (``config.layer_types[layer_idx] == 'chunked_attention'``, Llama 4), ``create_causal_mask``
    otherwise -- position ids
    ``0 .. n-1`` and, for a layer with RoPE, the rotary tables of the model's own
    ``<Prefix>RotaryEmbedding(config)`` (with the layer type where its ``forward`` takes one).

    Args:
        model_type, layer_class: as :func:`hf_make`.
        layer_idx: the layer's position in the stack.
        causal: ``False`` for an encoder layer.
        mask: ``None`` (the rule above), or ``'causal'``, ``'sliding'``, ``'bidirectional'``, ``'recurrent'``,
            ``'chunked'``.
        rotary: ``True``: the modeling module's ``<Prefix>RotaryEmbedding`` if it has one
            (``<Prefix>`` is ``layer_class`` without ``DecoderLayer``); a class name; or
            ``False``/``None``: no rotary tables.
        materialize_mask: build the causal, sliding or chunked mask even without padding
            (``allow_is_causal_skip=False``), as a model whose layer reads the mask itself
            does (GLM-5's sparse-attention indexer); by default ``masking_utils`` may leave
            it to the kernel's causal flag.

    Returns:
        The callable; it returns the layer's output ``(b, n, d)``.

    Raises:
        ValueError: for a ``mask`` other than those above (at once); TypeError: a non-bool
            ``materialize_mask``; ``ImportError``/``AttributeError``
            at call time for a ``model_type``/``layer_class``/``rotary`` the installed
            ``transformers`` lacks.
    """
    if mask is not None:
        check_choice("mask", mask, _MASKS)
    check_bool("materialize_mask", materialize_mask)

    def call(layer, config, X, valid_lens):
        import importlib
        import inspect

        from transformers import masking_utils

        modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        batch_size, num_steps, _ = X.shape
        padding = None if valid_lens is None else valid_lens_mask(valid_lens, num_steps).long()
        position_ids = torch.arange(num_steps, device=X.device)[None].expand(batch_size, -1)
        kind = mask
        if kind is None:
            layer_type = _layer_type(config, layer_idx)
            sliding = (layer_type == "sliding_attention" if layer_type is not None
                       else getattr(config, "sliding_window", None) is not None)
            kind = "bidirectional" if not causal else "sliding" if sliding else "causal"
            kind = "recurrent" if layer_type == "linear_attention" else kind
            kind = "chunked" if layer_type == "chunked_attention" else kind
        if kind == "recurrent":
            attention_mask = masking_utils.create_recurrent_attention_mask(config=config, inputs_embeds=X,
                                                                           attention_mask=padding)
        elif kind == "bidirectional":
            attention_mask = masking_utils.create_bidirectional_mask(config=config, inputs_embeds=X,
                                                                     attention_mask=padding)
        else:
            build = {"sliding": masking_utils.create_sliding_window_causal_mask,
                     "chunked": masking_utils.create_chunked_causal_mask}.get(kind, masking_utils.create_causal_mask)
            skip = {"allow_is_causal_skip": False} if materialize_mask else {}
            attention_mask = build(config=config, inputs_embeds=X, attention_mask=padding, cache=None,
                                   position_ids=position_ids, **skip)
        kwargs = {"attention_mask": attention_mask}
        name = rotary
        if name is True:
            name = layer_class.replace("DecoderLayer", "") + "RotaryEmbedding"
            name = name if hasattr(modeling, name) else None
        if name:
            module = getattr(modeling, name)(config).to(X.device)
            extra = ()
            if "layer_type" in inspect.signature(module.forward).parameters:
                extra = (_layer_type(config, layer_idx),)
            kwargs.update(position_embeddings=module(X, position_ids, *extra), position_ids=position_ids)
        out = layer(X, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    return call


def hf_reference(model: str, model_type: str, layer_class: str, config_class: str, config_kwargs: dict, *,
                 layer_idx: int = 0, causal: bool = True, attn_implementation: str = "sdpa",
                 unit_offset_norms: bool = False, mask: str | None = None,
                 rotary: str | None | bool = True) -> Reference:
    """A :class:`Reference` for a Hugging Face layer: :func:`hf_make`, :func:`from_hf`, :func:`hf_call`.

    Args:
        model: the model it stands for (``Reference.model``), e.g. ``'Gemma 2 (local)'``.
        model_type, layer_class, config_class, config_kwargs: as :func:`hf_make`.
        layer_idx, attn_implementation, unit_offset_norms: as :func:`hf_make`.
        causal, mask, rotary: as :func:`hf_call`.
    """
    make = hf_make(model_type, layer_class, config_class, config_kwargs, layer_idx=layer_idx,
                   attn_implementation=attn_implementation, unit_offset_norms=unit_offset_norms)
    call = hf_call(model_type, layer_class, layer_idx=layer_idx, causal=causal, mask=mask, rotary=rotary)
    return Reference(layer_class, model, make, lambda layer, config: from_hf(layer, config, layer_idx), call,
                     causal)


#: Largest absolute difference (float32) of outputs and of input gradients for a reference layer to count as
#: reproduced (the zoo's tables).
TOLERANCE = 1e-5


#: The tiny configurations of the Hugging Face layers in :data:`REFERENCES`, by layer class:
#: ``(model, model_type, config class, config kwargs)``.
HF_TINY = {
    "BertLayer": ("BERT", "bert", "BertConfig", dict(hidden_size=64, num_attention_heads=4, intermediate_size=256)),
    "GPT2Block": ("GPT-2", "gpt2", "GPT2Config", dict(n_embd=64, n_head=4)),
    "LlamaDecoderLayer": ("Llama 3", "llama", "LlamaConfig", dict(**TINY, num_hidden_layers=1, rope_theta=500000.0)),
    "Qwen3DecoderLayer": ("Qwen3", "qwen3", "Qwen3Config", dict(**TINY, num_hidden_layers=1, head_dim=32)),
    "Olmo2DecoderLayer": ("OLMo 2", "olmo2", "Olmo2Config", dict(**TINY, num_hidden_layers=1)),
    "Gemma3DecoderLayer": ("Gemma 3", "gemma3", "Gemma3TextConfig",
                           dict(**TINY, num_hidden_layers=1, head_dim=32, query_pre_attn_scalar=24,
                                layer_types=["full_attention"])),
}


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
    for name, (model, model_type, config_class, kwargs) in HF_TINY.items():
        refs[name] = hf_reference(model, model_type, name, config_class, kwargs, causal=name != "BertLayer",
                                  unit_offset_norms=name == "Gemma3DecoderLayer")
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
            reference kept elsewhere, e.g. Arcee Trinity in :mod:`d2lmini.chapters.ch09_the_2026_block`).
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


@shown_in("zoo")
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


# --------------------------------------------------------------------------- GLM-5 (MLA with DeepSeek Sparse Attention)


def from_glm_moe_dsa_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to a Hugging Face ``GlmMoeDsaDecoderLayer`` (GLM-5).

    ``transformers`` 5.24 ``models/glm_moe_dsa/modeling_glm_moe_dsa.py``: DeepSeek-V3's
    layer (pre-norm RMSNorm; a SwiGLU MLP in the first ``first_k_dense_replace`` layers, by
    ``config.mlp_layer_types``, DeepSeek-V3's mixture of experts after them) whose MLA attends
    only to the ``index_topk`` keys per query a DSA indexer selects
    (:func:`d2lmini.mla.from_glm_moe_dsa_attention`, :class:`d2lmini.mla.DSAIndexer`).
    Called on ``X`` and ``valid_lens`` the block equals the layer called as
    ``GlmMoeDsaModel`` calls it (:func:`hf_glm_moe_dsa_call`) at the valid positions.

    Args:
        layer: a ``GlmMoeDsaDecoderLayer`` whose attention runs its own indexer; weights copied.
        config: its ``GlmMoeDsaConfig``.
        layer_idx: ``None`` (the layer's own) or that index (:func:`_start`).

    Returns:
        The block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: a ``'shared'`` indexer layer (``config.indexer_types``: it reuses an
            earlier layer's selection), or as :func:`d2lmini.mla.from_glm_moe_dsa_attention`,
            :func:`d2lmini.mla.mla_decoder_block` and :func:`_start`.
    """
    from .mla import from_glm_moe_dsa_attention, mla_decoder_block

    _start(layer, config, layer_idx)
    return mla_decoder_block(layer, config, from_glm_moe_dsa_attention(layer.self_attn, config))


HF_CONVERTERS["GlmMoeDsaDecoderLayer"] = from_glm_moe_dsa_layer


#: ``call(layer, config, X, valid_lens)`` running a ``GlmMoeDsaDecoderLayer`` as ``GlmMoeDsaModel.forward``
#: does: :func:`hf_call` with the causal mask always materialized (the indexer reads it even without
#: padding), position ids ``0 .. n-1`` and the tables of ``GlmMoeDsaRotaryEmbedding``.
hf_glm_moe_dsa_call = hf_call("glm_moe_dsa", "GlmMoeDsaDecoderLayer", materialize_mask=True)


# --------------------------------------------------------------------------- Gemma 4


def from_gemma4_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Gemma4TextDecoderLayer`` (Gemma 4, 2026).

    ``transformers`` 5.24 ``models/gemma4/modeling_gemma4.py`` (``Gemma4TextDecoderLayer``,
    ``Gemma4TextAttention``, ``Gemma4RMSNorm``): Gemma's sandwich placement (RMSNorm before and
    after each sublayer), but with gains applied as ``w`` (``Gemma4RMSNorm``; Gemma 2/3 use
    ``1 + w``); QK-norm per head (gains ``w``) and a gainless RMSNorm on each value head
    (``value_norm=True``); logit scale ``attn.scaling`` (1.0: the QK-norms set the logits'
    size); GeGLU with tanh GELU; the whole output times the layer's ``layer_scalar`` buffer
    (``layer_scalar=``). A local (``'sliding_attention'``) layer gets
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
        layer_idx: ``None`` (the layer's own) or that index (:func:`_start`).

    Returns:
        The ``'sandwich'`` causal block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: per-layer inputs (``config.hidden_size_per_layer_input`` set: the layer
            takes a second input, ``per_layer_input``, which ``TransformerBlock(X, valid_lens)``
            has no place for), the mixture-of-experts FFN (``config.enable_moe_block``), a layer
            that reuses an earlier layer's keys and values (``config.num_kv_shared_layers``),
            ``use_bidirectional_attention='all'``, a RoPE type d2lmini does not reproduce, or as
            :func:`_start`.
    """
    layer_idx = _start(layer, config, layer_idx)
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
    act, width = _gated_act(config.hidden_activation), layer.mlp.intermediate_size
    ffn = ({"ffn_factory": lambda: FeedForward(d, width, act=act, bias=False)} if bias
           else {"act": act, "ffn_num_hiddens": width})
    block = TransformerBlock(d, config.num_attention_heads, norm="rms", placement="sandwich", bias=bias,
                             num_kv_heads=attn.k_proj.out_features // head_dim, head_dim=head_dim,
                             eps=config.rms_norm_eps, causal=True, qk_norm="per_head",
                             qk_norm_eps=config.rms_norm_eps, attn_scale=float(attn.scaling),
                             window=_window(config, layer_idx), value_norm=True, k_eq_v=attn.v_proj is None,
                             layer_scalar=float(layer.layer_scalar),
                             **_rope_kwargs(config.per_layer_config[layer_idx], _layer_type(config, layer_idx)), **ffn)
    ours = block.attention
    for name, src in (("W_q", attn.q_proj), ("W_k", attn.k_proj), ("W_v", attn.v_proj), ("W_o", attn.o_proj)):
        if src is not None:
            _copy_linear(getattr(ours, name), src.weight, src.bias, name=name)
    _copy_norm(ours.q_norm, attn.q_norm)
    _copy_norm(ours.k_norm, attn.k_norm)
    _copy_mlp(block, layer.mlp.up_proj, layer.mlp.down_proj, layer.mlp.gate_proj)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    _copy_norm(block.addnorm1.norm_out, layer.post_attention_layernorm)
    _copy_norm(block.addnorm2.norm_in, layer.pre_feedforward_layernorm)
    _copy_norm(block.addnorm2.norm_out, layer.post_feedforward_layernorm)
    return block.to(attn.q_proj.weight).train(layer.training)


HF_CONVERTERS["Gemma4TextDecoderLayer"] = from_gemma4_layer


# --------------------------------------------------------------------------- DeepSeek-V4


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
        layer_idx: ``None`` (the layer's own) or that index (:func:`_start`).

    Returns:
        The block, on the layer's device and dtype, in its train/eval mode.

    Raises:
        ValueError: a layer type or MLP layer type other than the above (named), a RoPE type other than
            ``'default'`` and ``'yarn'``, ``hidden_act`` other than ``'silu'``, a ``scoring_func`` other
            than ``'sqrtsoftplus'``, ``'softmax'`` and ``'sigmoid'``, or as :func:`_start`.
    """
    from .deepseek_v4 import CompressedAttention, HashRoutedMoE
    from .hyper import HyperConnectedBlock

    idx = _start(layer, config, layer_idx)
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
                      route_scale=float(config.routed_scaling_factor), swiglu_limit=float(config.swiglu_limit))
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
        _copy(ours.phi, theirs.fn), _copy(ours.bias, theirs.base), _copy(ours.alpha, theirs.scale)
    _copy_norm(block.norm1, layer.input_layernorm)
    _copy_norm(block.norm2, layer.post_attention_layernorm)
    ours = block.attention
    for dst, src in ((ours.W_qa, attn.q_a_proj), (ours.W_qb, attn.q_b_proj), (ours.W_kv, attn.kv_proj),
                     (ours.W_ob, attn.o_b_proj)):
        _copy_linear(dst, src.weight)
    _copy_norm(ours.q_norm, attn.q_a_norm)
    _copy_norm(ours.kv_norm, attn.kv_norm)
    _copy(ours.W_oa, attn.o_a_proj.weight.view(ours.W_oa.shape))
    _copy(ours.sinks, attn.sinks)
    if compress is not None:
        _copy_deepseek_v4_compressor(ours.compressor, attn.compressor)
    if compress == "csa":
        theirs = attn.compressor.indexer
        _copy_deepseek_v4_compressor(ours.indexer.compressor, theirs)
        _copy_linear(ours.indexer.W_q, theirs.q_b_proj.weight)
        _copy_linear(ours.indexer.W_w, theirs.scorer.weights_proj.weight)
    mix, width = block.ffn, config.moe_intermediate_size
    _copy(mix.router.weight, moe.gate.weight)
    if mlp_kind == "hash_moe":
        _copy(mix.token_experts, moe.gate.tid2eid)
    else:
        _copy(mix.expert_bias, moe.gate.e_score_correction_bias)
    for e, expert in enumerate(mix.experts):
        gate_up = moe.experts.gate_up_proj[e]
        _copy_gated_mlp(expert, gate_up[:width], gate_up[width:], moe.experts.down_proj[e])
    shared = moe.shared_experts
    _copy_gated_mlp(mix.shared, shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight)
    return block.to(attn.q_a_proj.weight).train(layer.training)


def _copy_deepseek_v4_compressor(ours, theirs) -> None:
    """Copy a ``DeepseekV4HCACompressor``/``CSACompressor``/``Indexer``'s compressor into a ``KVCompressor``."""
    _copy_linear(ours.W_kv, theirs.kv_proj.weight)
    _copy_linear(ours.W_z, theirs.gate_proj.weight)
    _copy(ours.position_bias, theirs.position_bias)
    _copy_norm(ours.norm, theirs.kv_norm)


HF_CONVERTERS["DeepseekV4DecoderLayer"] = from_deepseek_v4_layer


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


#: A tiny ``DeepseekV4Config`` with one layer of each type -- 0 sliding window + hash-routed MoE, 1 HCA + top-k
#: MoE, 2 CSA + top-k MoE -- sized so that everything acts within 24 steps: a window of 6, HCA entries of 8
#: tokens, CSA entries of 4 of which the indexer keeps 3, RoPE on half of each head, a SwiGLU clamp of 1.
DEEPSEEK_V4_TINY = dict(
    vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, head_dim=16, q_lora_rank=16,
    partial_rotary_factor=0.5, o_groups=2, o_lora_rank=8, sliding_window=6,
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}, index_n_heads=2,
    index_head_dim=8, index_topk=3, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
    swiglu_limit=1.0, hc_mult=4,
    layer_types=["sliding_attention", "heavily_compressed_attention", "compressed_sparse_attention"],
    mlp_layer_types=["hash_moe", "moe", "moe"])


def hf_deepseek_v4_make(layer_idx: int, seed: int = 0, **config_overrides):
    """A tiny random ``DeepseekV4DecoderLayer`` and its config: ``(layer, config)``, eval mode.

    :data:`DEEPSEEK_V4_TINY` updated by ``config_overrides``, eager attention, every parameter
    seeded-random (:func:`_randomize_`; the hyper-connections' projections, biases and scales and the
    sinks drawn normal so that their mappings are far from uniform), the top-k router's
    ``e_score_correction_bias`` random and the hash router's ``tid2eid`` a random table of distinct experts.

    Raises:
        ImportError / AttributeError: ``transformers`` lacks DeepSeek-V4.
    """
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as modeling

    torch.manual_seed(seed)
    config = DeepseekV4Config(**copy.deepcopy({**DEEPSEEK_V4_TINY, **config_overrides}))
    config._attn_implementation, config._experts_implementation = "eager", "eager"
    layer = _randomize_(modeling.DeepseekV4DecoderLayer(config, layer_idx), seed)
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
        layer_idx: 0, 1 or 2 of :data:`DEEPSEEK_V4_TINY` (sliding + hash MoE, HCA, CSA).
        seed: seeds the weights (:func:`hf_deepseek_v4_make`) and the inputs.
        num_steps: the sequence length.
        layer, config, block: a given layer and config (default: :func:`hf_deepseek_v4_make`) and block
            (default: converted from the layer; pass a mutated one to see the comparison fail).

    Returns:
        dict with ``max_abs_diff``, ``max_abs_grad_diff``, ``max_abs_output`` and ``block``.
    """
    from .deepseek_v4 import HashRoutedMoE

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


# --------------------------------------------------------------------------- a d2lmini language model as a Hugging Face one

def _hf_causal_lm_config(lm) -> tuple[str, dict]:
    """The Hugging Face model class (``'llama'`` or ``'qwen3'``) and config that compute what ``lm`` does.

    Raises ``ValueError`` naming the first setting of ``lm`` that neither ``LlamaForCausalLM``
    nor ``Qwen3ForCausalLM`` has.
    """
    from .lm import LanguageModel

    if not isinstance(lm, LanguageModel):
        raise TypeError(f"lm must be a d2lmini.LanguageModel, got {type(lm).__name__}")
    if lm.positions != "rope":
        raise ValueError(f"to_hf needs positions='rope' (Llama and Qwen3 have no position embedding), "
                         f"got positions={lm.positions!r}")
    if lm.head.bias is not None:
        raise ValueError("to_hf needs an output head without a bias (lm_head has none); this model's head has one")
    first = lm.blocks[0]
    attention = first.attention
    if type(first.ffn) is not FeedForward:
        raise ValueError(f"to_hf supports d2lmini's FeedForward (SwiGLU), got {type(first.ffn).__name__}")
    wanted = {"placement": ("pre", first.placement), "norm": ("rms", first.norm), "act": ("swiglu", first.ffn.act),
              "swiglu_limit": (None, first.ffn.swiglu_limit)}
    if type(attention) is not MultiHeadAttention:
        raise ValueError(f"to_hf supports d2lmini's MultiHeadAttention (MHA, GQA), got {type(attention).__name__}")
    if attention.qk_norm not in (None, "per_head"):
        raise ValueError(f"to_hf: qk_norm={attention.qk_norm!r} has no counterpart in LlamaForCausalLM or "
                         "Qwen3ForCausalLM (allowed: None, or 'per_head' as Qwen3)")
    wanted.update({"attention bias": (False, attention.W_q.bias is not None or attention.W_o.bias is not None),
                   "FFN bias": (False, first.ffn.W_1.bias is not None)})
    for name in ("window", "chunk", "logit_softcap", "rotary_dim", "rope_scaling", "query_scaling", "scale"):
        wanted[name] = (None, getattr(attention, name))
    wanted["sinks"] = (False, attention.sinks is not None)
    wanted.update({"value_norm": (False, attention.value_norm), "k_eq_v": (False, attention.k_eq_v),
                   "residual": (True, first.addnorm1.residual), "layer_scalar": (1.0, first.layer_scalar),
                   "residual_multiplier": (1.0, first.addnorm1.residual_multiplier)})
    for name, (allowed, value) in wanted.items():
        if value != allowed:
            raise ValueError(f"to_hf: {name}={value!r} has no counterpart in LlamaForCausalLM or Qwen3ForCausalLM "
                             f"(allowed: {allowed!r})")
    for i, block in enumerate(lm.blocks[1:], start=1):
        if repr(block) != repr(first):
            raise ValueError(f"to_hf needs every block configured alike; block {i} differs from block 0")
    eps = first.addnorm1.norm_in.eps
    if attention.qk_norm is not None and attention.qk_norm_eps != eps:
        raise ValueError(f"to_hf: Qwen3's QK-norm uses rms_norm_eps={eps}, got qk_norm_eps={attention.qk_norm_eps}")
    config = dict(vocab_size=lm.vocab_size, hidden_size=first.num_hiddens, intermediate_size=first.ffn.ffn_num_hiddens,
                  num_hidden_layers=len(lm.blocks), num_attention_heads=attention.num_heads,
                  num_key_value_heads=attention.num_kv_heads, head_dim=attention.head_dim,
                  max_position_embeddings=lm.context_len, rms_norm_eps=eps, hidden_act="silu",
                  rope_parameters={"rope_type": "default", "rope_theta": attention.rope_theta},
                  tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)  # no token ends generation
    return ("qwen3" if attention.qk_norm == "per_head" else "llama"), config


@shown_in("ch09")
def to_hf(lm):
    """The Hugging Face causal language model that computes what the d2lmini ``lm`` computes.

    ``Qwen3ForCausalLM`` when the blocks have QK-norm (per head, before RoPE, as Qwen3), else
    ``LlamaForCausalLM``: the config is derived from ``lm`` (nothing is downloaded), the weights
    are copied (not shared), and the model is in eval mode, on ``lm``'s device and dtype. Its
    logits agree with ``lm``'s to rounding, and its ``generate(do_sample=False)`` gives
    :func:`d2lmini.generate`'s tokens: the config names no end-of-sequence token (``LlamaConfig``'s
    default ``eos_token_id=2`` would stop generation at token 2), so neither stops early.

    Raises:
        TypeError: if ``lm`` is not a :class:`~d2lmini.lm.LanguageModel`.
        ValueError: a model either class cannot express (learned or sinusoidal positions, a head
            with a bias, another placement, norm or FFN, biases, windows, sinks, ...): the message
            names the setting and what is allowed.
    """
    import transformers

    family, config = _hf_causal_lm_config(lm)
    Config, Model = ((transformers.Qwen3Config, transformers.Qwen3ForCausalLM) if family == "qwen3"
                     else (transformers.LlamaConfig, transformers.LlamaForCausalLM))
    hf = Model(Config(**config))
    rename = {"embedding": "model.embed_tokens", "final_norm": "model.norm", "head": "lm_head"}
    for i in range(len(lm.blocks)):
        ours, theirs = f"blocks.{i}", f"model.layers.{i}"
        for a, b in (("attention.W_q", "self_attn.q_proj"), ("attention.W_k", "self_attn.k_proj"),
                     ("attention.W_v", "self_attn.v_proj"), ("attention.W_o", "self_attn.o_proj"),
                     ("attention.q_norm", "self_attn.q_norm"), ("attention.k_norm", "self_attn.k_norm"),
                     ("ffn.W_g", "mlp.gate_proj"), ("ffn.W_1", "mlp.up_proj"), ("ffn.W_2", "mlp.down_proj"),
                     ("addnorm1.norm_in", "input_layernorm"), ("addnorm2.norm_in", "post_attention_layernorm")):
            rename[f"{ours}.{a}"] = f"{theirs}.{b}"
    parameter = next(lm.parameters())
    copy_parameters(lm, hf.to(device=parameter.device, dtype=parameter.dtype), rename)
    return hf.eval()
