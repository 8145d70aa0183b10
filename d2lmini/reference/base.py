"""What every family's converter shares: copying weights, reading configs, the registry and :func:`from_hf`.

Nothing here is a model: the family modules of :mod:`d2lmini.reference` build their blocks
from these pieces. The copy helpers (:func:`copy_weight`, :func:`copy_linear`, :func:`copy_norm`,
...) raise a ``ValueError`` naming the weight on a shape or bias mismatch, so a wrong layout
fails loudly; the config readers (:func:`start_conversion`, :func:`rope_kwargs`,
:func:`layer_type_of`, :func:`window_of`, ...) are the one place a Hugging Face config's layer
index, dropout, RoPE, layer types and windows are read. :data:`HF_CONVERTERS` maps a Hugging
Face layer class name to its converter; each family module fills it with the decorator
:func:`converter`, and every converter has the one signature ``(layer, config, layer_idx=None)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from .._checks import check_int_in, check_nonnegative_int, check_positive_float, check_positive_int
from ..attention import ROPE_SCALINGS, GatedAttention, interleaved_to_half_order
from ..block import TransformerBlock
from ..hyper import HyperConnectedBlock


def copy_weight(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy the tensor ``src`` into the parameter or buffer ``dst`` in place, without recording gradients.

    Every weight a converter copies goes through here, so a layout mistake fails at once.

    Raises:
        ValueError: ``src`` and ``dst`` of different shapes (the message gives both).
    """
    if dst.shape != src.shape:
        raise ValueError(f"cannot copy a weight of shape {tuple(src.shape)} into {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src)


def copy_linear(dst: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None = None,
                name: str = "a projection") -> None:
    """Copy a reference projection's ``weight`` ``(out, in)`` (and ``bias`` ``(out,)``) into the ``nn.Linear`` ``dst``.

    Raises:
        ValueError: a shape mismatch (:func:`copy_weight`), or a bias on only one side (the message
            names ``name`` and which side has it).
    """
    copy_weight(dst.weight, weight)
    if (bias is None) != (dst.bias is None):
        ours, theirs = ("has no", "has a") if bias is not None else ("has a", "has no")
        raise ValueError(f"bias mismatch in {name}: the reference layer {theirs} bias there, the d2lmini block "
                         f"{ours} bias")
    if bias is not None:
        copy_weight(dst.bias, bias)


def copy_norm(dst: nn.Module, src: nn.Module, unit_offset: bool = False) -> None:
    """Copy a norm's gain ``(d,)`` (and bias, if ``src`` has one) from ``src`` into ``dst``.

    ``unit_offset`` turns a gain stored as ``w`` and applied as ``1 + w`` (Gemma 2/3, Qwen3.5) into
    d2lmini's applied gain ``1 + w``, computed in float32 and cast to ``dst``'s dtype.

    Raises:
        ValueError: a shape mismatch (:func:`copy_weight`).
    """
    weight = src.weight.float() + 1.0 if unit_offset else src.weight
    copy_weight(dst.weight, weight.to(dst.weight.dtype))
    if getattr(src, "bias", None) is not None:
        copy_weight(dst.bias, src.bias)


def set_qk_norm_eps(attention, eps: float):
    """Give an attention's QK-norms the epsilon ``eps`` (a released model's ``rms_norm_eps``); returns the attention.

    :class:`~d2lmini.attention.MultiHeadAttention` builds its QK-norms with epsilon 1e-6; a converter whose
    model uses another sets it here, on ``q_norm`` and ``k_norm``.

    Raises:
        ValueError: an attention without QK-norms, or ``eps`` not a finite float > 0.
    """
    if attention.q_norm is None or attention.k_norm is None:
        raise ValueError("set_qk_norm_eps needs an attention with QK-norms (qk_norm set)")
    attention.q_norm.eps = attention.k_norm.eps = check_positive_float("eps", eps)
    return attention


def copy_qkv_packed(attention, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Copy a packed ``[q; k; v]`` projection ``(3d, d)`` (bias ``(3d,)`` or ``None``) into ``attention``'s
    ``W_q``, ``W_k`` and ``W_v``, as ``nn.MultiheadAttention`` (``in_proj_weight``) and GPT-2 store it.

    Raises:
        ValueError: as :func:`copy_linear`.
    """
    Wq, Wk, Wv = weight.chunk(3, dim=0)
    bq, bk, bv = bias.chunk(3) if bias is not None else (None, None, None)
    copy_linear(attention.W_q, Wq, bq)
    copy_linear(attention.W_k, Wk, bk)
    copy_linear(attention.W_v, Wv, bv)


def copy_gated_mlp(ffn, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> None:
    """Copy a bias-free gated MLP ``down(act(gate x) * up x)`` into a gated :class:`~d2lmini.ffn.FeedForward`.

    Args:
        ffn: the FeedForward (``W_g``, ``W_1``, ``W_2``).
        gate, up: ``(hidden, d)`` weights; down: ``(d, hidden)``.

    Raises:
        ValueError: as :func:`copy_linear` (a bias in ``ffn``, or a shape mismatch).
    """
    copy_linear(ffn.W_g, gate)
    copy_linear(ffn.W_1, up)
    copy_linear(ffn.W_2, down)


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
    head_dim = check_positive_int("head_dim", head_dim)
    r = head_dim if rotary_dim is None else check_int_in("rotary_dim", rotary_dim, 2, head_dim)
    if r % 2:
        raise ValueError(f"rotary_dim must be even (RoPE rotates pairs), got {r}")
    if weight.shape[0] % head_dim:
        raise ValueError(f"weight has {weight.shape[0]} rows, not a multiple of head_dim={head_dim}")
    order = torch.cat((interleaved_to_half_order(r), torch.arange(r, head_dim)))
    heads = weight.reshape(weight.shape[0] // head_dim, head_dim, *weight.shape[1:])
    return heads[:, order.to(weight.device)].reshape(weight.shape)


def copy_attention(block: TransformerBlock, q: nn.Module | tuple, k: nn.Module | tuple, v: nn.Module | tuple,
                   o: nn.Module, interleaved: int | None = None) -> None:
    """Copy a reference layer's q, k, v and o projections into ``block``'s attention.

    ``q``, ``k``, ``v`` are ``nn.Linear`` modules or ``(weight, bias)`` pairs (fused layouts split
    by the caller); ``o`` an ``nn.Linear``. The target is the block's
    :class:`~d2lmini.attention.MultiHeadAttention`, or the one inside its
    :class:`~d2lmini.attention.GatedAttention` (whose own ``W_o`` takes ``o``). With ``interleaved``
    (the rotated features per head) the q and k rows are permuted from interleaved RoPE pairs to
    the half-split layout (:func:`rope_interleaved_to_half`; GPT-J, Cohere, Llama 4).

    Raises:
        ValueError: as :func:`copy_linear` (names the projection) or :func:`rope_interleaved_to_half`.
    """
    gated = isinstance(block.attention, GatedAttention)
    att = block.attention.attention if gated else block.attention  # the MultiHeadAttention inside
    for ours, src in (("W_q", q), ("W_k", k), ("W_v", v)):
        weight, bias = src if isinstance(src, tuple) else (src.weight, src.bias)
        if interleaved is not None and ours != "W_v":
            weight = rope_interleaved_to_half(weight, att.head_dim, interleaved)
            bias = None if bias is None else rope_interleaved_to_half(bias, att.head_dim, interleaved)
        copy_linear(getattr(att, ours), weight, bias, name=ours)
    copy_linear(block.attention.W_o, o.weight, o.bias, name="W_o")


def copy_mlp(block: TransformerBlock, up: nn.Module, down: nn.Module, gate: nn.Module | None = None) -> None:
    """Copy a plain MLP ``down(act(up(x)))``, or a gated one ``down(act(gate(x)) * up(x))``, biases included,
    into ``block.ffn`` (``W_1``, ``W_2`` and ``W_g``).

    Raises:
        ValueError: as :func:`copy_linear` (names the FFN's matrix).
    """
    copy_linear(block.ffn.W_1, up.weight, up.bias, name="the FFN's W_1")
    copy_linear(block.ffn.W_2, down.weight, down.bias, name="the FFN's W_2")
    if gate is not None:
        copy_linear(block.ffn.W_g, gate.weight, gate.bias, name="the FFN's W_g")


#: The dropout probabilities of Hugging Face configs that act inside a decoder or encoder layer (on attention
#: weights, hidden units or branch outputs); the embeddings' (``embd_pdrop``, ``embedding_dropout``) act outside it.
LAYER_DROPOUTS = ("attention_dropout", "attention_probs_dropout_prob", "hidden_dropout_prob", "hidden_dropout",
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


def resolve_layer_idx(layer, layer_idx: int | None) -> int:
    """The index of a Hugging Face ``layer`` in its stack: ``layer_idx`` checked, or the layer's own.

    ``None`` is the index the layer (or its attention) was built with, 0 where it records none;
    a given one must be an int >= 0 equal to the layer's own.

    Raises:
        TypeError: a ``layer_idx`` that is not an int.
        ValueError: a negative one, or one unequal to the layer's own.
    """
    own = _own_layer_idx(layer)
    if layer_idx is None:
        return 0 if own is None else own
    layer_idx = check_nonnegative_int("layer_idx", layer_idx)
    if own is not None and own != layer_idx:
        raise ValueError(f"layer_idx={layer_idx}, but this {type(layer).__name__} was built with layer_idx={own}; "
                         "pass layer_idx=None (the layer's own)")
    return layer_idx


def start_conversion(layer, config, layer_idx: int | None = None, *, reproduced: tuple[str, ...] = ()) -> int:
    """The checks every Hugging Face converter (and :func:`from_hf`) runs first; returns the layer's index.

    ``layer_idx`` ``None`` is the index the layer was built with (its own ``layer_idx``; 0
    for a layer that records none); a given one must be an int >= 0 equal to the layer's
    own, so a converter called directly can never build the block of another layer type.
    A layer in training mode with a dropout probability > 0 in one of the config fields
    :data:`LAYER_DROPOUTS`, other than those the converter ``reproduced``, is refused: the
    block's one ``dropout`` (attention weights, FFN hidden units and branch outputs alike)
    cannot apply it where the layer does. In eval mode dropout does nothing and is ignored.

    Raises:
        TypeError: a ``layer_idx`` that is not an int.
        ValueError: a negative ``layer_idx`` or one unequal to the layer's own, or a layer in
            training mode with such a dropout (the message names the config field).
    """
    layer_idx = resolve_layer_idx(layer, layer_idx)
    if layer.training:
        for field in LAYER_DROPOUTS:
            p = getattr(config, field, None)
            if field not in reproduced and isinstance(p, (int, float)) and p > 0:
                raise ValueError(f"this {type(layer).__name__} is in training mode with config.{field}={p}, a "
                                 "dropout d2lmini's block cannot apply where the layer does: call layer.eval() "
                                 f"(dropout does nothing in eval mode) or set {field}=0")
    return layer_idx


def hf_act(name: str) -> str:
    """The d2lmini ``act`` of a plain (two-matrix) MLP with Hugging Face activation ``name``.

    ``'gelu'`` is the exact GELU, ``'gelu_new'`` and ``'gelu_pytorch_tanh'`` the tanh
    approximation (``'gelu_tanh'``; GPT-2, Phi), ``'relu'`` ReLU.

    Raises:
        ValueError: any other name (the message lists the supported ones).
    """
    table = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
    if name not in table:
        raise ValueError(f"unsupported activation {name!r}; supported: {tuple(table)}")
    return table[name]


def gated_act(name: str) -> str:
    """The d2lmini ``act`` of a gated MLP ``down(act(gate(x)) * up(x))`` with Hugging Face activation ``name``.

    ``'silu'`` is SwiGLU (Llama, Qwen, ...), ``'gelu_pytorch_tanh'`` and ``'gelu_new'`` GeGLU with the
    tanh GELU (Gemma).

    Raises:
        ValueError: any other name (the message lists the supported ones).
    """
    table = {"silu": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"}
    if name not in table:
        raise ValueError(f"unsupported gated-MLP activation {name!r}; supported: {tuple(table)}")
    return table[name]


#: RoPE types of ``config.rope_parameters`` whose frequencies d2lmini reproduces: ``'default'`` and
#: :data:`d2lmini.attention.ROPE_SCALINGS` (``'dynamic'`` and ``'longrope'`` are refused).
ROPE_TYPES = ("default",) + tuple(ROPE_SCALINGS)


def rope_kwargs(config, layer_type: str | None = None, *, partial: bool = False,
                query_scaling: bool = False) -> dict:
    """The RoPE of a layer of type ``layer_type`` as :class:`~d2lmini.block.TransformerBlock` arguments.

    The one place a Hugging Face ``config``'s RoPE is read. It follows what
    ``modeling_rope_utils`` (``standardize_rope_params`` and ``ROPE_INIT_FUNCTIONS``,
    ``transformers`` 5.24) computes for a rotary table: ``config.rope_parameters`` --
    the entry of ``layer_type`` where the parameters are given per layer type (Gemma 3,
    OLMo 3) -- or, in older configs, ``config.rope_theta``; the legacy key ``'type'``
    for ``'rope_type'``; ``partial_rotary_factor`` from the parameters or the config.

    Returns:
        ``{'rope_theta': float, 'rope_scaling': dict | None}``.
        ``rope_scaling`` (``None`` for full, unscaled RoPE) holds the keys the Hugging Face
        initializer of that ``rope_type`` reads, and nothing else (so model-specific
        keys such as Ministral 3's ``llama_4_scaling_beta`` are left out): for YaRN, a
        missing ``factor`` is ``max_position_embeddings / original_max_position_embeddings``,
        ``truncate`` is read from the top level of ``rope_parameters`` (as
        ``_compute_yarn_parameters`` does), and ``mscale``/``mscale_all_dim`` are kept only
        when both are set (non-zero), the only case in which ``transformers`` uses them.
        A ``partial_rotary_factor`` below 1 (from the parameters or the config) is kept in
        ``rope_scaling`` (``rope_type`` ``'default'`` if unscaled): partial RoPE for
        :class:`~d2lmini.attention.MultiHeadAttention`, or, under ``'proportional'`` (Gemma 4), which
        frequencies are zero.

    Args:
        config: a Hugging Face model configuration.
        layer_type: the layer's type (``config.layer_types[layer_idx]``) or ``None``.
        partial: whether the model's attention applies partial RoPE (rotates only the
            first ``rotary_dim`` features); if not, a ``partial_rotary_factor`` below 1 is refused.
        query_scaling: also return ``'query_scaling'`` (an argument of
            :class:`~d2lmini.reference.llama.LlamaVariantAttention`): ``(beta, L)`` with ``beta =
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
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type={rope_type!r} is not supported; supported: {ROPE_TYPES}")
    fraction = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if fraction not in (None, 1, 1.0) and rope_type != "proportional" and not partial:
        raise ValueError(f"only full RoPE is supported for this layer, got partial_rotary_factor={fraction!r}")
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
    if fraction not in (None, 1, 1.0) and rope_type != "proportional":  # proportional: read above
        scaling = {"rope_type": "default", **(scaling or {}), "partial_rotary_factor": fraction}
    rope = {"rope_theta": float(params["rope_theta"]), "rope_scaling": scaling}
    if query_scaling:
        beta, period = params.get("llama_4_scaling_beta"), params.get("original_max_position_embeddings")
        if beta is None or period is None:
            raise ValueError("Ministral 3 needs rope_parameters['llama_4_scaling_beta'] and "
                             f"['original_max_position_embeddings'] (its query scaling), got {beta!r} and {period!r}")
        rope["query_scaling"] = (beta, period) if beta else None
    return rope


def unscaled_rope_theta(config, layer_type: str | None = None, *, partial: bool = False) -> float:
    """The RoPE base ``theta`` (a float) of a layer with unscaled RoPE, read by :func:`rope_kwargs`.

    For the parallel and partial-RoPE families, which read their rotated width from the layer itself.

    Raises:
        ValueError: scaled RoPE (any ``rope_type`` but ``'default'``), partial RoPE unless ``partial``,
            or as :func:`rope_kwargs`.
    """
    rope = rope_kwargs(config, layer_type, partial=partial)
    if (rope["rope_scaling"] or {}).get("rope_type", "default") != "default":  # partial RoPE alone is fine
        raise ValueError(f"only default RoPE is supported here, got rope_type={rope['rope_scaling']['rope_type']!r}")
    return rope["rope_theta"]


def layer_type_of(config, layer_idx: int) -> str | None:
    """The type of layer ``layer_idx``: ``config.layer_types[layer_idx]`` (e.g. ``'sliding_attention'``,
    ``'linear_attention'``), or ``None`` for a model without layer types.

    Raises:
        ValueError: ``layer_idx`` outside ``config.layer_types``.
    """
    types = getattr(config, "layer_types", None)
    if types is None:
        return None
    if not 0 <= layer_idx < len(types):
        raise ValueError(f"layer_idx={layer_idx} is outside config.layer_types (length {len(types)})")
    return types[layer_idx]


def window_of(config, layer_idx: int) -> int | None:
    """The sliding window (an int, or ``None``) of layer ``layer_idx``: ``config.sliding_window`` where
    ``config.layer_types`` says ``'sliding_attention'`` (the layer type each model builds its
    sliding-window mask for), else ``None``.

    Raises:
        ValueError: as :func:`layer_type_of`.
    """
    return config.sliding_window if layer_type_of(config, layer_idx) == "sliding_attention" else None


#: ``from_hf``'s dispatch table: Hugging Face layer class name -> converter ``(layer, config, layer_idx=None)``,
#: filled by :func:`converter` in the family modules of :mod:`d2lmini.reference`.
HF_CONVERTERS: dict[str, Callable] = {}


def converter(*layer_classes: str) -> Callable:
    """Decorator: register a converter in :data:`HF_CONVERTERS` for the Hugging Face layer classes named.

    The one way the registry is filled. A converter takes ``(layer, config, layer_idx=None)``
    and returns the d2lmini block equal to ``layer`` (starting with :func:`start_conversion`);
    the decorator returns it unchanged.

    Args:
        *layer_classes: one or more class names, e.g. ``"Qwen3_5DecoderLayer", "Qwen3_5MoeDecoderLayer"``.

    Raises:
        ValueError: no class name, or one already registered (two converters for one class).
        TypeError: a class name that is not a string.
    """
    if not layer_classes:
        raise ValueError("converter needs at least one Hugging Face layer class name")
    for name in layer_classes:
        if not isinstance(name, str):
            raise TypeError(f"layer class names must be strings, got {type(name).__name__} {name!r}")

    def register(function: Callable) -> Callable:
        for name in layer_classes:
            if name in HF_CONVERTERS:
                raise ValueError(f"{name} already has a converter, {HF_CONVERTERS[name].__qualname__}")
            HF_CONVERTERS[name] = function
        return function

    return register


def from_hf(layer, config, layer_idx: int | None = None) -> TransformerBlock | HyperConnectedBlock:
    """The d2lmini block equal to a Hugging Face decoder (or encoder) layer.

    The one entry point for every supported layer: it dispatches on the layer's class
    name (so ``transformers`` stays an optional import) through :data:`HF_CONVERTERS`
    to the converter of that class, which returns a block holding copies of the layer's
    weights, on its device and dtype, in its train/eval mode. Called on ``X`` and
    ``valid_lens``, the block equals the layer called with its model's own masks (causal,
    sliding-window or chunked where the layer has one, right padding), rotary tables for
    positions ``0 .. n-1`` and position ids ``0 .. n-1`` -- at the valid positions (see
    :mod:`d2lmini.chapters.zoo`, which checks every row).

    Supported classes: the keys of :data:`HF_CONVERTERS`; each family module of
    :mod:`d2lmini.reference` registers its own (Llama-like models in
    :mod:`~d2lmini.reference.llama`, OLMo in :mod:`~d2lmini.reference.olmo`, Gemma in
    :mod:`~d2lmini.reference.gemma`, the parallel blocks in :mod:`~d2lmini.reference.parallel`,
    and so on). Every converter returns a :class:`~d2lmini.block.TransformerBlock` except
    DeepSeek-V4's (:func:`~d2lmini.reference.deepseek.from_deepseek_v4_layer`), which returns a
    :class:`~d2lmini.hyper.HyperConnectedBlock` on streams ``(b, n, hc_mult, d)``.

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
        The equivalent block: a :class:`~d2lmini.block.TransformerBlock`, or for DeepSeek-V4 a
        :class:`~d2lmini.hyper.HyperConnectedBlock`.

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
    return HF_CONVERTERS[name](layer, config, resolve_layer_idx(layer, layer_idx))


# --------------------------------------------------------------------------- the rows a family declares


@dataclass(frozen=True)
class LayerRow:
    """One layer a family reproduces: a row of the zoo, and with ``reference`` one of the harness's references.

    Each family module lists its rows in a module-level ``ROWS``; :mod:`d2lmini.reference` collects
    them in the order of :data:`~d2lmini.reference.FAMILIES`, and the zoo's table, the harness's
    :data:`~d2lmini.reference.harness.REFERENCES` and :data:`~d2lmini.reference.harness.HF_TINY` are
    built from them.

    Attributes:
        name: display name, e.g. ``'Gemma 2 (local)'``.
        family: the model family, e.g. ``'Gemma'``.
        year: the year the model was released.
        layer_class: the Hugging Face layer class (the key :func:`from_hf` dispatches on).
        model_type: the folder under ``transformers/models`` (e.g. ``'gemma2'``).
        config_class: the configuration class, e.g. ``'Gemma2Config'``.
        tiny: the tiny configuration, a key of :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
        layer_idx: the tested layer's index in the tiny stack (it selects the layer type).
        causal: whether the layer's self-attention is causal.
        attn_implementation: ``'sdpa'``, or ``'eager'`` where SDPA cannot run the layer.
        unit_offset_norms: whether the norm gains are stored as ``w`` in ``1 + w`` (Gemma).
        rotary: the rotary class, as :func:`~d2lmini.reference.harness.hf_call` takes it.
        call_kwargs: keyword arguments the model passes the layer beyond the usual ones
            (Falcon's ``alibi=None``).
        note: what the model does outside the layer (so not in the block), or ``''``.
        reference: the model name under which the row is also the harness's reference for its
            layer class (:data:`~d2lmini.reference.harness.REFERENCES`), or ``None``.
    """

    name: str
    family: str
    year: int
    layer_class: str
    model_type: str
    config_class: str
    tiny: str
    layer_idx: int = 0
    causal: bool = True
    attn_implementation: str = "sdpa"
    unit_offset_norms: bool = False
    rotary: str | bool = True
    call_kwargs: dict = field(default_factory=dict)
    note: str = ""
    reference: str | None = None


@dataclass(frozen=True)
class Row2026:
    """One released model of the zoo's 2026 table, declared by its family module in ``ROWS_2026``.

    Attributes:
        model, year: the model and the year of the release described.
        cite: its bibliography key (a report or model card), or ``''``.
        config: the ``transformers`` configuration class whose defaults the descriptive
            columns are read from (``'Kimi_K25Config.text_config'`` for a sub-configuration).
        modeling: the facts a configuration class does not hold, read from the model's modeling
            file (the decoder layer's and attention's ``__init__``): ``norm`` (the norms and where
            they sit), ``qk_norm``, ``gate`` (an output gate on the attention), ``sinks``, ``nope``
            (the layers without positions), ``router``, ``act``, ``shared_experts``.
        size: the released model the configuration (class defaults plus ``report``) describes,
            read off the layer count, width and expert count; ``None`` where the defaults match
            no released model (the row then shows the class's defaults).
        report: values the report or model card gives for the released model where the
            class defaults describe another model (Kimi K2.5's defaults are DeepSeek-V3's).
        class_default_cells: cells of a named size that still hold a class default the released
            model need not share (or is not known to share), with the note the cell gets.
        check: the name of the zoo's check that reproduces its layers, or ``None``.
        verify: the check itself, ``seed -> [comparison results]`` (one
            :func:`~d2lmini.reference.harness.compare_with_reference` result per layer compared), or
            ``None`` where ``zoo_rows`` are the check or there is none.
        missing: what d2lmini does not reproduce of the model's layers.
        zoo_rows: the names of the zoo's rows (:class:`LayerRow`) whose comparisons are the check,
            or ``()`` where the zoo has its own check for the model.
    """

    model: str
    year: int
    cite: str
    config: str
    modeling: dict
    size: str | None
    report: dict = field(default_factory=dict)
    class_default_cells: dict = field(default_factory=dict)
    check: str | None = None
    verify: Callable[[int], list] | None = None
    missing: str = ""
    zoo_rows: tuple[str, ...] = ()
