"""Multi-head (and grouped-query) scaled dot-product attention.

Introduced in the chapter "Anatomy"; QK-norm and RoPE are added in later chapters.
Shapes use d2l's names: ``(batch, num_steps, num_hiddens)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import (check_bool, check_dtype_matches, check_optional_choice,
                      check_nonnegative_int, check_positive_float, check_positive_int, check_probability,
                      check_sequence_tensor)
from ._shown import shown_in
from .cache import LayerCache
from .norms import DEFAULT_EPS, HeadwiseRMSNorm, RMSNorm

#: QK-norm variants with gains accepted by ``MultiHeadAttention(qk_norm=...)`` (the chapter
#: "QK-norm" compares them); all are RMSNorms applied to queries and keys after their
#: projections and before RoPE.
#:
#: * ``'per_head'``: over each head's ``head_dim`` features, one gain vector shared by
#:   all heads (separate for q and k) -- Qwen3, Gemma 3.
#: * ``'projection'``: over the whole projection (all heads' features at once), before
#:   it is split into heads -- OLMo 2, and MiniMax-M2 as implemented in Hugging Face
#:   ``transformers`` 5.24 (``tests/test_qknorm.py`` checks MiniMax-M2; the block zoo, OLMo 2).
#: * ``'per_head_distinct'``: over each head's features, a distinct gain vector for every
#:   head; in ``transformers`` 5.24 this layout appears only with a LayerNorm (Cohere's
#:   ``use_qk_norm``, StableLM's per-head norms, Chameleon), not with an RMSNorm.
QK_NORMS = ("per_head", "projection", "per_head_distinct")

# torch >= 2.5 lets SDPA share key/value heads itself (grouped-query attention).
_SDPA_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


#: RoPE scalings accepted by :func:`rope_frequencies` (``MultiHeadAttention(rope_scaling=...)``),
#: each with its required and optional keys, in the format of Hugging Face ``transformers``
#: 5.24 ``config.rope_parameters`` without ``rope_theta`` (passed as ``rope_theta=``).
#: ``'default'`` is unscaled RoPE. :class:`MultiHeadAttention` also reads ``partial_rotary_factor``
#: under every type (partial RoPE, as ``transformers`` does); other callers only under
#: ``'proportional'``.
ROPE_SCALINGS = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "llama3": (("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"), ()),
    "proportional": ((), ("factor", "partial_rotary_factor")),
}


def check_rope_scaling(scaling, *, partial: bool = False) -> dict:
    """Check a RoPE scaling dict (the format of :data:`ROPE_SCALINGS`) and return a clean copy.

    The one check of ``rope_scaling`` that :func:`rope_frequencies`, :class:`MultiHeadAttention`,
    :class:`~d2lmini.mla.MultiHeadLatentAttention` and DeepSeek-V4's compressed attention share.

    Args:
        scaling: ``{"rope_type": t, ...}`` with ``t`` a key of :data:`ROPE_SCALINGS` and that
            type's required keys (optional ones may be ``None``, meaning absent).
        partial: whether the caller rotates only part of each head, so that
            ``partial_rotary_factor`` is allowed under every ``rope_type`` (else only under
            ``'proportional'``).

    Returns:
        A new dict with ``rope_type`` and every key whose value is not ``None``, each number checked:
        ``original_max_position_embeddings`` a positive int, ``truncate`` a bool, the others positive floats.

    Raises:
        TypeError: ``scaling`` not a dict, or a value of the wrong type (the message names the key).
        ValueError: an unknown ``rope_type`` or key, a missing required key, ``factor < 1``,
            ``partial_rotary_factor > 1``, ``beta_fast < beta_slow``, ``mscale`` without
            ``mscale_all_dim`` (or the reverse), or Llama 3's ``high_freq_factor <= low_freq_factor``.
    """
    if not isinstance(scaling, dict):
        raise TypeError(f"rope_scaling must be None or a dict, got {type(scaling).__name__} {scaling!r}")
    rope_type = scaling.get("rope_type")
    if not isinstance(rope_type, str) or rope_type not in ROPE_SCALINGS:
        raise ValueError(f"rope_scaling['rope_type'] must be one of {tuple(ROPE_SCALINGS)}, got {rope_type!r} "
                         "(no scaling: rope_scaling=None)")
    required, optional = ROPE_SCALINGS[rope_type]
    allowed = ("rope_type",) + required + optional
    if partial and "partial_rotary_factor" not in allowed:
        allowed += ("partial_rotary_factor",)
    unknown = [key for key in scaling if key not in allowed]
    if unknown:
        raise ValueError(f"rope_scaling keys {unknown} are not allowed for rope_type={rope_type!r}; allowed: {allowed} "
                         "(rope_theta is its own argument; Ministral 3's llama_4_scaling_beta is "
                         "d2lmini.reference's query_scaling)")
    missing = [key for key in required if scaling.get(key) is None]
    if missing:
        raise ValueError(f"rope_scaling with rope_type={rope_type!r} needs the keys {required}; missing {missing}")
    out = {"rope_type": rope_type}
    for key, value in scaling.items():
        name = f"rope_scaling[{key!r}]"
        if key == "rope_type" or value is None:
            continue
        if key == "original_max_position_embeddings":
            out[key] = check_positive_int(name, value)
        elif key == "truncate":
            out[key] = check_bool(name, value)
        else:
            out[key] = check_positive_float(name, value)
    if out.get("factor", 1.0) < 1:  # 'proportional' alone has an optional factor (default 1)
        raise ValueError(f"rope_scaling['factor'] must be >= 1 (it stretches the context), got {out['factor']}")
    if out.get("partial_rotary_factor", 1.0) > 1:
        raise ValueError("rope_scaling['partial_rotary_factor'] must lie in (0, 1] (the share of the pairs that turn), "
                         f"got {out['partial_rotary_factor']}")
    if out.get("beta_fast", 32.0) < out.get("beta_slow", 1.0):
        raise ValueError(f"rope_scaling needs beta_fast >= beta_slow (defaults 32 and 1), "
                         f"got {out.get('beta_fast', 32.0)} and {out.get('beta_slow', 1.0)}")
    if ("mscale" in out) != ("mscale_all_dim" in out):
        raise ValueError("rope_scaling's mscale and mscale_all_dim go together (transformers uses them only when "
                         "both are set); give both or neither")
    if rope_type == "llama3" and out["high_freq_factor"] <= out["low_freq_factor"]:
        raise ValueError(f"rope_scaling needs high_freq_factor > low_freq_factor, "
                         f"got {out['high_freq_factor']} and {out['low_freq_factor']}")
    return out


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``sqrt(1/t) = 0.1 * mscale * ln(s) + 1`` (Peng et al., 2023, arXiv 2309.00071).

    For a context stretched ``s = factor`` times; 1 for ``s <= 1``. As ``get_mscale`` of Hugging Face
    ``transformers`` 5.24 ``modeling_rope_utils``; DeepSeek-V3's MLA squares it into its softmax scale.

    Args:
        factor: the YaRN stretch ``s`` (a float; no check, the callers pass checked scalings).
        mscale: the multiplier of ``ln(s)`` (``rope_scaling['mscale']``; default 1).

    Returns:
        The float multiplier.
    """
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(dim: int, theta: float = 10000.0, scaling: dict | None = None,
                     device=None) -> tuple[torch.Tensor, float]:
    """RoPE's inverse frequencies, optionally scaled for a longer context, and the attention factor.

    Unscaled, pair ``i`` of the ``dim`` rotated features turns by ``theta ** (-2i / dim)``
    radians per position (Su et al., 2021). ``scaling`` follows Hugging Face
    ``transformers`` 5.24 ``config.rope_parameters`` (without ``rope_theta``); checked
    against ``modeling_rope_utils.ROPE_INIT_FUNCTIONS``:

    * ``{"rope_type": "default"}``: unscaled. A ``partial_rotary_factor`` under this or the
      next three types is partial RoPE, which sets ``dim`` (:class:`MultiHeadAttention` reads it)
      and leaves the frequencies of those ``dim`` features as they are.
    * ``{"rope_type": "linear", "factor": s}``: position interpolation (Chen et al., 2023;
      kaiokendev), every frequency divided by ``s``; Gemma 3's global layers (``s = 8``).
    * ``{"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L, ...}``:
      YaRN (Peng et al., 2023, arXiv 2309.00071, "NTK-by-parts" + attention temperature).
      Pairs that turn more than ``beta_fast`` (default 32) times over the original context
      ``L`` keep their frequency, pairs that turn fewer than ``beta_slow`` (default 1) times
      are divided by ``s``, with a linear ramp between; the boundaries are the pair
      indices ``dim * ln(L / (2 pi beta)) / (2 ln theta)``, floored/ceiled if
      ``truncate`` (default ``True``), clipped to ``[0, dim - 1]``. The attention factor
      multiplies cos and sin (so every logit by its square): ``attention_factor`` if
      given, else ``m(s, mscale) / m(s, mscale_all_dim)`` if both are given (DeepSeek),
      else ``m(s, 1)``, with ``m(s, c) = 0.1 c ln(s) + 1`` (1 for ``s <= 1``).
      gpt-oss (``s = 32``, ``truncate=False``) and Ministral 3 use it.
    * ``{"rope_type": "llama3", "factor": s, "original_max_position_embeddings": L,
      "low_freq_factor": a, "high_freq_factor": b}``: Llama 3.1; wavelengths shorter than
      ``L / b`` are kept, longer than ``L / a`` divided by ``s``, smoothly in between.
    * ``{"rope_type": "proportional", "partial_rotary_factor": p, "factor": s}`` (both
      optional, default 1): Gemma 4's global layers (``p = 0.25``;
      ``modeling_rope_utils._compute_proportional_rope_parameters``). The first
      ``int(p * dim // 2)`` pairs keep the unscaled frequencies ``theta ** (-2i / dim)``
      (the exponent's denominator stays the whole ``dim``), the other pairs get frequency 0
      (they never turn), and every frequency is divided by ``s``. Unlike partial RoPE
      (``rotary_dim``), the table spans the whole head: in the half-split layout the
      turning features are ``j < r`` and ``dim/2 <= j < dim/2 + r`` with ``r`` those pairs.

    Args:
        dim: rotated features per head (``head_dim``, or ``rotary_dim`` for partial RoPE); even.
        theta: the RoPE base.
        scaling: ``None`` (plain RoPE) or a dict as above (see :data:`ROPE_SCALINGS`).
        device: of the returned frequencies.

    Returns:
        ``(inv_freq, attention_factor)``: float32 ``(dim // 2,)`` and a float (1.0 unless YaRN).

    Raises:
        ValueError: odd ``dim``, ``theta`` not > 0, an unknown ``rope_type``, a missing or
            unknown key (the message lists the allowed ones), ``factor < 1``,
            ``beta_fast < beta_slow``, only one of ``mscale``/``mscale_all_dim``,
            ``high_freq_factor <= low_freq_factor``, ``partial_rotary_factor > 1``, a number not > 0.
        TypeError: ``scaling`` not a dict, a value of the wrong type.
    """
    check_positive_int("dim", dim)
    if dim % 2:
        raise ValueError(f"RoPE needs an even number of rotated features, got {dim}")
    check_positive_float("theta", theta)
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    if scaling is None:
        return inv_freq, 1.0
    scaling = check_rope_scaling(scaling, partial=True)  # dim is the rotated width already
    kind, factor = scaling["rope_type"], scaling.get("factor", 1.0)
    if kind == "default":
        return inv_freq, 1.0
    if kind == "proportional":  # Gemma 4: the first int(p * dim // 2) pairs turn, the others stand still
        turning = int(scaling.get("partial_rotary_factor", 1.0) * dim // 2)
        inv_freq[turning:] = 0.0
        return inv_freq / factor, 1.0
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":  # 0: a long wavelength, divided by factor; 1: a short one, kept
        wavelength = 2 * math.pi / inv_freq
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        keep = ((scaling["original_max_position_embeddings"] / wavelength - low) / (high - low)).clamp(0, 1)
        return keep * inv_freq + (1 - keep) * inv_freq / factor, 1.0
    # YaRN: pair i turns L * inv_freq[i] / (2 pi) times over the original context L.
    def pair_turning(turns):  # the (fractional) pair index that turns `turns` times
        return dim * math.log(scaling["original_max_position_embeddings"] / (2 * math.pi * turns)) / (2 * math.log(theta))
    low, high = pair_turning(scaling.get("beta_fast", 32.0)), pair_turning(scaling.get("beta_slow", 1.0))
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid dividing by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    inv_freq = (1 - ramp) * inv_freq + ramp * inv_freq / factor  # ramp 0: kept (fast pairs), 1: interpolated
    if "attention_factor" in scaling:
        attention_factor = scaling["attention_factor"]
    elif "mscale" in scaling:
        attention_factor = yarn_mscale(factor, scaling["mscale"]) / yarn_mscale(factor, scaling["mscale_all_dim"])
    else:
        attention_factor = yarn_mscale(factor)
    return inv_freq, attention_factor


def rotary_cos_sin(num_steps, head_dim: int, theta: float = 10000.0, device=None, dtype=torch.float32,
                   *, scaling: dict | None = None, interleaved: bool = False):
    """Cosines and sines of rotary position embeddings (RoPE; Su et al., 2021).

    Position ``p`` and frequency ``i`` get the angle ``p * inv_freq[i]`` with
    ``inv_freq`` from :func:`rope_frequencies` (unscaled: ``theta**(-2i / head_dim)``,
    ``i = 0 .. head_dim/2 - 1``). Each angle is written twice, once for each feature of
    its pair: in the two halves of the head (the "half-split" layout used by Llama,
    Qwen3, OLMo 2 and Gemma in Hugging Face ``transformers``), or side by side with
    ``interleaved=True`` (pairs ``(2i, 2i + 1)``: RoFormer, DeepSeek-V4). Angles are
    computed in float32; cos and sin are multiplied by the scaling's attention factor
    (YaRN; else 1), then cast.

    Args:
        num_steps: sequence length ``n`` (positions ``0 .. n - 1``), or a 1-D tensor of
            the positions themselves (DeepSeek-V4's compressed entries sit at multiples of
            their window).
        head_dim: rotated features per head (``rotary_dim`` for partial RoPE); must be even.
        theta: the RoPE base (10,000 in RoFormer and Llama 2; 500,000 in Llama 3).
        device, dtype: of the returned tensors (a tensor of positions keeps its device
            when ``device`` is ``None``).
        scaling: ``None`` or a RoPE scaling dict (see :func:`rope_frequencies`).
        interleaved: the layout of the pairs, for :func:`apply_rotary` with the same flag.

    Returns:
        ``(cos, sin)``, each of shape ``(n, head_dim)``.

    Raises:
        ValueError / TypeError: as :func:`rope_frequencies`.
    """
    if isinstance(num_steps, torch.Tensor):
        positions = num_steps.to(device=device if device is not None else num_steps.device, dtype=torch.float32)
    else:
        positions = torch.arange(num_steps, dtype=torch.float32, device=device)
    inv_freq, attention_factor = rope_frequencies(head_dim, theta, scaling, positions.device)
    angles = positions[:, None] * inv_freq[None, :]
    angles = angles.repeat_interleave(2, dim=-1) if interleaved else torch.cat((angles, angles), dim=-1)
    if attention_factor == 1.0:
        return angles.cos().to(dtype), angles.sin().to(dtype)
    return (angles.cos() * attention_factor).to(dtype), (angles.sin() * attention_factor).to(dtype)


def interleaved_to_half_order(num_features: int) -> torch.Tensor:
    """The feature order ``0, 2, ..., 1, 3, ...`` that turns interleaved RoPE pairs into half-split ones.

    Interleaved RoPE (RoFormer, GPT-J, Cohere, DeepSeek, Llama 4) rotates features ``(2i, 2i + 1)``
    together; :func:`apply_rotary` rotates ``(i, i + r/2)``. Indexing the ``r = num_features``
    rotated features (rows of ``W_q`` and ``W_k``) by this order converts one into the other.
    """
    return torch.cat((torch.arange(0, num_features, 2), torch.arange(1, num_features, 2)))


def apply_rotary(X: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False) -> torch.Tensor:
    """Rotate query or key features by their positions' angles (RoPE).

    The first ``r = cos.shape[-1]`` features are rotated (all of ``head_dim``, or
    partial RoPE's ``rotary_dim``, as Phi, StableLM, GPT-NeoX); the rest pass
    unchanged. Each pair is rotated by its angle: ``x * cos + rot(x) * sin``. In the
    half-split layout (the default) feature ``j < r/2`` pairs with ``j + r/2`` and
    ``rot([x1, x2]) = [-x2, x1]`` (``rotate_half``); with ``interleaved=True`` feature
    ``2j`` pairs with ``2j + 1`` and ``rot([x0, x1, x2, x3, ...]) = [-x1, x0, -x3, x2, ...]``
    (RoFormer, DeepSeek-V4). Either layout is the other after a fixed reordering of the
    features (:func:`interleaved_to_half_order`). With ``-sin`` the rotation is undone.

    Args:
        X: ``(batch, heads, num_steps, head_dim)``, or any ``(..., num_steps, head_dim)``.
        cos, sin: ``(num_steps, r)`` from :func:`rotary_cos_sin` with the same
            ``interleaved``, ``r <= head_dim``.
        interleaved: the layout of the pairs.

    Returns:
        A tensor shaped like ``X``.
    """
    r = cos.shape[-1]
    x, rest = X[..., :r], X[..., r:]
    if interleaved:
        rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((-x[..., r // 2:], x[..., :r // 2]), dim=-1)
    out = x * cos + rotated * sin
    return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)


def valid_lens_mask(valid_lens: torch.Tensor | None, num_steps: int, min_len: int = 0) -> torch.Tensor | None:
    """Which positions of a padded batch are real: ``mask[..., t] = t < valid_lens[...]``.

    The one place d2lmini turns d2l-style ``valid_lens`` into a mask: attention masks
    the keys with it (``MultiHeadAttention``, with ``min_len=1``), the chapter
    "Normalization" averages over the real tokens with it, and
    :mod:`d2lmini.reference` derives the masks of PyTorch and Hugging Face layers from
    it (``~mask`` is their key-padding mask; an additive float mask is
    ``torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(dtype).min)``).

    Args:
        valid_lens: ``None`` (no padding), or an integer tensor of lengths: ``(b,)``,
            one per sequence, or ``(b, q)``, one per query (as in d2l's ``masked_softmax``).
        num_steps: ``n``, the padded length (for attention: the number of keys).
        min_len: the smallest length allowed; attention needs 1 (a query that may
            see no key has no defined output), a padding mask allows 0.

    Returns:
        ``None`` for ``valid_lens=None``; else a bool tensor of shape
        ``valid_lens.shape + (n,)`` -- ``(b, n)`` or ``(b, q, n)`` -- on ``valid_lens``'
        device, ``True`` at the real positions (the convention of
        ``torch.nn.functional.scaled_dot_product_attention``'s ``attn_mask``).

    Raises:
        TypeError: if ``valid_lens`` is neither ``None`` nor a tensor with an integer dtype.
        ValueError: if a length lies outside ``[min_len, num_steps]``.
    """
    if valid_lens is None:
        return None
    if not isinstance(valid_lens, torch.Tensor):
        raise TypeError(f"valid_lens must be None or an integer torch.Tensor, got {type(valid_lens).__name__}")
    if valid_lens.is_floating_point() or valid_lens.is_complex() or valid_lens.dtype == torch.bool:
        raise TypeError(f"valid_lens must have an integer dtype, got {valid_lens.dtype}")
    if valid_lens.numel() and (int(valid_lens.min()) < min_len or int(valid_lens.max()) > num_steps):
        raise ValueError(
            f"valid_lens values must lie in [{min_len}, {num_steps}], "
            f"got min {int(valid_lens.min())} and max {int(valid_lens.max())}"
        )
    return torch.arange(num_steps, device=valid_lens.device) < valid_lens[..., None]


def attention_mask(valid_lens: torch.Tensor | None, batch_size: int, num_queries: int, num_keys: int, device=None,
                   *, causal: bool = False, window: int | None = None, chunk: int | None = None,
                   start: int = 0) -> torch.Tensor | None:
    """The boolean ``attn_mask`` of ``scaled_dot_product_attention`` (``True``: the query may see the key).

    The one mask of d2lmini's softmax attention (:class:`MultiHeadAttention`,
    :class:`~d2lmini.mla.MultiHeadLatentAttention`): the keys at positions >= ``valid_lens``
    are masked (:func:`valid_lens_mask`, at least one key per query); with ``causal`` query ``i``
    sees keys ``j <= i`` only, with ``window`` also only ``j > i - window`` (Mistral's sliding
    window), with ``chunk`` only keys of its own chunk, ``floor(j / chunk) == floor(i / chunk)``
    (Llama 4's chunked attention). With a window or chunks a padded query that would see no real
    key sees itself. With a cache the queries are the last ``num_queries`` of ``num_keys = start +
    num_queries`` positions (query ``i`` at position ``start + i``).

    Args:
        valid_lens: ``None``, ``(batch_size,)`` or ``(batch_size, num_queries)`` integer lengths.
        batch_size, num_queries, num_keys: the attention's sizes ``b``, ``q``, ``k``.
        device: where the mask is made.
        causal, window: as :class:`MultiHeadAttention`'s arguments; chunk: Llama 4's chunked attention
            (:class:`~d2lmini.reference.llama4.Llama4Attention`), query ``i`` sees the keys of its own
            block of ``chunk`` positions (``window``/``chunk`` are read only with ``causal``; ``None``: none).
        start: the number of cached positions before the queries.

    Returns:
        ``None`` where nothing is masked (e.g. one new query at the end of a cache), else a bool
        tensor ``(b, 1, 1 or q, k)``, or ``(q, k)`` for a causal mask without padding.

    Raises:
        ValueError: ``causal`` with ``num_queries + start != num_keys``, or ``valid_lens`` of another shape.
        TypeError / ValueError: bad ``valid_lens`` values (see :func:`valid_lens_mask`).
    """
    if causal and num_queries + start != num_keys:
        raise ValueError("causal attention needs as many queries as keys (self-attention), "
                         f"got {num_queries} queries and {num_keys} keys")
    mask = valid_lens_mask(valid_lens, num_keys, min_len=1)  # (b, k) or (b, q, k)
    if mask is not None:
        if tuple(valid_lens.shape) not in ((batch_size,), (batch_size, num_queries)):
            raise ValueError(f"valid_lens must have shape ({batch_size},) or ({batch_size}, {num_queries}), "
                             f"got {tuple(valid_lens.shape)}")
        mask = mask.to(device)
        mask = mask[:, None, None] if valid_lens.dim() == 1 else mask[:, None]
    if causal:
        # An explicit mask, not SDPA's is_causal: on CPU its masked kernel is the faster one.
        if num_queries == 1 and mask is None and window is None and chunk is None:
            return None  # one new query at the end of a cache sees every key
        allowed = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril(start)
        if window is not None:  # and j > i - window: the band of the last `window` keys
            allowed = allowed.triu(start + 1 - window)
        if chunk is not None:  # and floor(j / C) == floor(i / C): the query's own chunk
            chunks = torch.arange(num_keys, device=device) // chunk
            allowed = allowed & (chunks[start:, None] == chunks[None, :])
        if mask is None:
            return allowed
        mask = mask & allowed
        if window is not None or chunk is not None:  # a padded query may see no real key: itself
            diagonal = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril(start).triu(start)
            mask = mask | (diagonal & ~mask.any(dim=-1, keepdim=True))
    return mask


def make_qk_norms(qk_norm: str | None, num_heads: int, num_kv_heads: int, head_dim: int,
                  eps: float = DEFAULT_EPS["rms"]) -> tuple[nn.Module | None, nn.Module | None]:
    """The query and key norms of a :data:`QK_NORMS` variant (``None``: ``(None, None)``), RMSNorms of epsilon ``eps``.

    ``'per_head'``: over ``head_dim`` features, one gain each for q and k; ``'projection'``: over all
    heads' features; ``'per_head_distinct'``: over ``head_dim`` features, a gain per head
    (:class:`~d2lmini.norms.HeadwiseRMSNorm`). The caller checks ``qk_norm``.
    """
    if qk_norm == "per_head":
        return RMSNorm(head_dim, eps), RMSNorm(head_dim, eps)
    if qk_norm == "projection":
        return RMSNorm(num_heads * head_dim, eps), RMSNorm(num_kv_heads * head_dim, eps)
    if qk_norm == "per_head_distinct":
        return HeadwiseRMSNorm(num_heads, head_dim, eps=eps), HeadwiseRMSNorm(num_kv_heads, head_dim, eps=eps)
    return None, None


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention (Vaswani et al., 2017) with grouped key/value heads, QK-norm, RoPE, a window and sinks.

    Queries, keys and values are projected by ``W_q``, ``W_k``, ``W_v`` and split into heads;
    queries and keys are optionally normalized (QK-norm) and rotated (RoPE), in that order; each
    head attends (``scaled_dot_product_attention``: the softmax of ``q k^T / sqrt(head_dim)``,
    masked, times the values); the heads are concatenated and projected back by ``W_o``.

    Args:
        num_hiddens: model width ``d`` (last dimension of inputs and output).
        num_heads: query heads ``h``.
        dropout: dropout on the attention weights (training only), in [0, 1).
        bias: whether the four projections have biases (2017, BERT, GPT-2: yes; Llama: no).
        num_kv_heads: key/value heads (default ``num_heads``), dividing ``num_heads``: grouped-query attention
            (Ainslie et al., 2023), query head ``i`` reads key/value head ``i // (num_heads // num_kv_heads)``.
        causal: if ``True``, query ``i`` sees only keys ``j <= i`` (decoder self-attention).
        head_dim: features per head (default ``num_hiddens // num_heads``, which must then divide exactly).
        qk_norm: ``None`` or one of :data:`QK_NORMS` (Henry et al., 2020; Dehghani et al., 2023; RMSNorms, eps 1e-6, before RoPE).
        rope_theta: the base of RoPE (Su et al., 2021; half-split layout, :func:`apply_rotary`);
            ``None`` (default): no rotary embedding.
        window: ``None`` or an int ``w >= 1``: sliding-window attention (needs ``causal=True``), query ``i``
            sees keys ``i - w < j <= i``, as Mistral's and ``transformers``' ``sliding_window``. With
            ``valid_lens``, a padded query whose window holds no real key attends to itself.
        rope_scaling: ``None`` or a dict as ``transformers``' ``config.rope_parameters`` without
            ``rope_theta`` (needs ``rope_theta``): the frequencies' scaling (:func:`rope_frequencies`)
            and, but under ``'proportional'``, partial RoPE: ``partial_rotary_factor`` ``p`` turns the
            first ``int(p * head_dim + 1e-9)`` features of each head (``transformers``: no ``1e-9``, rarely one less).
        sinks: ``True``: a learned logit per query head (``self.sinks``, initially 0) joins every query's
            softmax as one more key without a value, so the weights on the real keys sum to less than 1
            (gpt-oss; cf. Xiao et al., 2023, whose learnable sink is a token with a key and a value).

    Hooks: each step of :meth:`forward` is a method a subclass may override (:meth:`queries_and_keys`,
    :meth:`value_heads`, :meth:`mask`, :meth:`attend`), and ``scale``, the logit scale (``None``:
    ``1/sqrt(head_dim)``), may be set: the released models' variants in :mod:`d2lmini.reference` do.

    Attributes:
        W_q, W_k, W_v, W_o: the projections; q_norm, k_norm: the QK-norms, or ``None``;
        sinks: the sink logits ``(num_heads,)``, or ``None``; rotary_dim: the features of each head
        that RoPE turns (``None``: all); rope_scaling: the frequencies' scaling (``None``: unscaled).

    Shape:
        ``forward(queries, keys, values, valid_lens=None, cache=None)``: queries ``(b, n_q, d)``,
        keys and values ``(b, n_k, d)``, ``valid_lens`` ``None``, ``(b,)`` or ``(b, n_q)``
        (keys at positions >= the length are masked); returns ``(b, n_q, d)``.

    Raises:
        ValueError: sizes that do not divide, an unknown ``qk_norm``, an odd ``head_dim`` with RoPE, dropout
            outside [0, 1), ``window`` below 1 or without ``causal=True``, a bad ``rope_scaling`` or one without
            ``rope_theta``; at call time, inputs of the wrong shape, RoPE or causal attention with different
            query and key lengths, bad ``valid_lens``, a ``cache`` without ``causal`` or with ``valid_lens``.
        TypeError: arguments or inputs of the wrong type.
    """

    #: The logit scale handed to the kernel; ``None``: ``1 / sqrt(head_dim)``.
    scale: float | None = None

    def __init__(self, num_hiddens: int, num_heads: int, *, dropout: float = 0.0, bias: bool = False,
                 num_kv_heads: int | None = None, causal: bool = False, head_dim: int | None = None,
                 qk_norm: str | None = None, rope_theta: float | None = None, window: int | None = None,
                 rope_scaling: dict | None = None, sinks: bool = False):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_kv_heads = self.num_heads if num_kv_heads is None else check_positive_int("num_kv_heads", num_kv_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}")
        if head_dim is None and self.num_hiddens % self.num_heads:
            raise ValueError(f"num_hiddens={num_hiddens} must be divisible by num_heads={num_heads} "
                             "(or pass head_dim explicitly)")
        self.head_dim = check_positive_int("head_dim", self.num_hiddens // self.num_heads if head_dim is None else head_dim)
        self.dropout = check_probability("dropout", dropout)
        self.causal = check_bool("causal", causal)
        self.window = None if window is None else check_positive_int("window", window)
        if self.window is not None and not self.causal:
            raise ValueError(f"window={window} needs causal=True (sliding-window attention is causal: "
                             "query i sees keys i - window < j <= i); pass causal=True or window=None")
        self.qk_norm = check_optional_choice("qk_norm", qk_norm, QK_NORMS)
        self._set_rope(rope_theta, rope_scaling)
        self.sinks = nn.Parameter(torch.zeros(self.num_heads)) if check_bool("sinks", sinks) else None
        q_hiddens, kv_hiddens = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        check_bool("bias", bias)
        self.W_q = nn.Linear(num_hiddens, q_hiddens, bias=bias)
        self.W_k = nn.Linear(num_hiddens, kv_hiddens, bias=bias)
        self.W_v = nn.Linear(num_hiddens, kv_hiddens, bias=bias)
        self.W_o = nn.Linear(q_hiddens, num_hiddens, bias=bias)
        self.q_norm, self.k_norm = make_qk_norms(self.qk_norm, self.num_heads, self.num_kv_heads, self.head_dim)

    def _set_rope(self, rope_theta, rope_scaling) -> None:
        """Set ``rope_theta``, ``rotary_dim`` and ``rope_scaling`` (see the class's attributes)."""
        self.rope_theta = None if rope_theta is None else check_positive_float("rope_theta", rope_theta)
        if self.rope_theta is not None and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got head_dim={self.head_dim}")
        if rope_scaling is not None and self.rope_theta is None:
            raise ValueError(f"rope_scaling={rope_scaling!r} needs RoPE: pass rope_theta too")
        scaling = None if rope_scaling is None else check_rope_scaling(rope_scaling, partial=True)
        self.rotary_dim = None
        if scaling is not None and scaling["rope_type"] != "proportional":  # proportional: frequencies
            share = scaling.pop("partial_rotary_factor", 1.0)
            # transformers takes int(share * head_dim); + 1e-9 gives r back for share = r / head_dim
            rotary_dim = int(share * self.head_dim + 1e-9)
            if rotary_dim < 2 or rotary_dim % 2:
                raise ValueError(f"rope_scaling['partial_rotary_factor']={share} turns {rotary_dim} of "
                                 f"head_dim={self.head_dim} features; RoPE needs pairs (even, >= 2)")
            self.rotary_dim = None if rotary_dim == self.head_dim else rotary_dim
            scaling = None if scaling["rope_type"] == "default" else scaling
        self.rope_scaling = scaling
        self._rotary_cache: dict = {}

    @property
    def qk_norm_eps(self) -> float:
        """The epsilon of the QK-norms (1e-6 unless a converter sets the norms' ``eps``)."""
        return DEFAULT_EPS["rms"] if self.q_norm is None else self.q_norm.eps

    @property
    def logit_scale(self) -> float:
        """The factor ``q . k`` is multiplied by before the softmax: ``scale``, or ``1/sqrt(head_dim)``."""
        return self.scale if self.scale is not None else self.head_dim ** -0.5

    def _rotary(self, num_steps: int, like: torch.Tensor, offset: int = 0):
        """RoPE's ``(cos, sin)`` at positions ``offset ..``, from a table grown by doubling, keyed on its inputs."""
        key = (like.device, like.dtype, self.rope_theta, self.rotary_dim, self.head_dim, repr(self.rope_scaling))
        end = offset + num_steps
        cached = self._rotary_cache.get(key)
        if cached is None or cached[0].shape[0] < end:
            length = end if cached is None else max(end, 2 * cached[0].shape[0])
            cached = rotary_cos_sin(length, self.rotary_dim or self.head_dim, self.rope_theta,
                                    like.device, like.dtype, scaling=self.rope_scaling)
            self._rotary_cache = {key: cached}
        cos, sin = cached
        return cos[offset:end], sin[offset:end]

    @shown_in("ch06")
    def queries_and_keys(self, queries: torch.Tensor, keys: torch.Tensor,
                         start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys exactly as they enter the attention kernel (a hook).

        Project, QK-normalize (the whole projection, or each head), split into heads, rotate by
        RoPE: the norm before the rotation, as in Qwen3, OLMo 2 and Gemma 3. The chapter "QK-norm"
        reads the logits ``logit_scale * q @ k.transpose(-1, -2)``.

        Args:
            queries: ``(b, n_q, d)``; keys: ``(b, n_k, d)``; start: the position of the first
                query and key (0, or the number of positions already cached).

        Returns:
            ``(q, k)``, shapes ``(b, h, n_q, head_dim)`` and ``(b, h_kv, n_k, head_dim)``.

        Raises:
            TypeError / ValueError: inputs that are not floating ``(b, n, d)`` tensors of the
                weights' dtype and one batch size (with RoPE, also one length).
        """
        self._check_inputs(queries, keys, start)
        # (b, n_q, h * head_dim) and (b, n_k, h_kv * head_dim)
        q, k = self.W_q(queries), self.W_k(keys)
        if self.qk_norm == "projection":  # one statistic over all heads (OLMo 2)
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.unflatten(-1, (self.num_heads, self.head_dim))  # (b, n_q, h, head_dim)
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))  # (b, n_k, h_kv, head_dim)
        if self.qk_norm in ("per_head", "per_head_distinct"):  # one statistic a head
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # heads first
        if self.rope_theta is not None:
            cos, sin = self._rotary(q.shape[2], q, start)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k

    def _check_inputs(self, queries: torch.Tensor, keys: torch.Tensor, start: int = 0) -> None:
        """Raise for inputs :meth:`queries_and_keys` cannot take (``start``: an int >= 0)."""
        check_nonnegative_int("start", start)
        check_sequence_tensor("queries", queries, self.num_hiddens)
        check_dtype_matches("queries", queries, self)
        check_sequence_tensor("keys", keys, self.num_hiddens)
        if keys.shape[0] != queries.shape[0]:
            raise ValueError(f"queries and keys must have the same batch size, got {queries.shape[0]} and {keys.shape[0]}")
        if self.rope_theta is not None and queries.shape[1] != keys.shape[1]:
            raise ValueError("RoPE needs as many queries as keys (self-attention), "
                             f"got {queries.shape[1]} queries and {keys.shape[1]} keys")

    def value_heads(self, values: torch.Tensor) -> torch.Tensor:
        """The values projected and split into heads, ``(b, n_k, d)`` -> ``(b, h_kv, n_k, head_dim)`` (a hook)."""
        return self.W_v(values).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)

    def mask(self, valid_lens, batch_size: int, num_queries: int, num_keys: int, device,
             start: int = 0) -> torch.Tensor | None:
        """The boolean mask of :func:`attention_mask` with this module's ``causal`` and ``window`` (a hook)."""
        return attention_mask(valid_lens, batch_size, num_queries, num_keys, device, causal=self.causal,
                              window=self.window, start=start)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
        """The kernel (a hook): each query head's softmax over its keys, times the values.

        ``q`` ``(b, h, n_q, head_dim)``, ``k``, ``v`` ``(b, h_kv, n_k, head_dim)``, ``mask`` ``None`` or
        boolean (``True``: the query may see the key); returns ``(b, h, n_q, head_dim)``. Fused SDPA;
        with ``sinks``, one zero key and value more, whose logit a float mask sets to the head's sink.
        """
        extra = {}
        if self.num_kv_heads != self.num_heads:
            if _SDPA_HAS_GQA:  # SDPA reads the shared heads in place: no copies saved for backward
                extra["enable_gqa"] = True
            else:
                group = self.num_heads // self.num_kv_heads
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if self.sinks is not None:  # one zero key/value per head, whose logit the float mask sets to the sink's
            k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))
            mask = self._sink_mask(mask, q, k.shape[2] - 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                              dropout_p=self.dropout if self.training else 0.0, **extra)

    def _sink_mask(self, mask, q: torch.Tensor, num_keys: int) -> torch.Tensor:
        """The float mask (b, h, n_q, n_k + 1) of attention sinks: 0 / -inf from ``mask``, then each head's sink logit."""
        b, h, n_q = q.shape[:3]
        out = torch.zeros(b, h, n_q, num_keys + 1, dtype=q.dtype, device=q.device)  # filled in place: one pass
        if mask is not None:
            out[..., :num_keys].masked_fill_(~mask, float("-inf"))
        out[..., num_keys] = self.sinks.to(q.dtype)[:, None]  # (h, 1) -> every batch element and query
        return out

    @shown_in("ch08")
    def forward(self, queries, keys, values, valid_lens=None,
                cache: LayerCache | None = None) -> torch.Tensor:
        """Attend from ``queries`` (b, n_q, d) to ``keys`` and ``values`` (b, n_k, d); returns (b, n_q, d).

        ``cache``: a :class:`~d2lmini.cache.LayerCache` during generation (causal, no ``valid_lens``): the
        inputs are the new positions, which also attend to the cached keys; the cache keeps theirs."""
        if cache is not None and (not self.causal or valid_lens is not None):
            raise ValueError("a key/value cache is for causal self-attention without "
                             f"padding: causal must be True (got {self.causal}) and "
                             "valid_lens None")
        start = 0 if cache is None else len(cache)  # the positions already cached
        # (b, h, n_q, head_dim) and (b, h_kv, n_k, head_dim)
        q, k = self.queries_and_keys(queries, keys, start)
        check_sequence_tensor("values", values, self.num_hiddens)
        if keys.shape != values.shape:
            raise ValueError(f"keys and values must have the same shape, got "
                             f"{tuple(keys.shape)} and {tuple(values.shape)}")
        v = self.value_heads(values)  # (b, h_kv, n_k, head_dim)
        if cache is not None:  # every position so far; the cache keeps this step's k, v
            k, v = cache.update(k, v)
        mask = self.mask(valid_lens, queries.shape[0], queries.shape[1], k.shape[2],
                         queries.device, start)
        heads = self.attend(q, k, v, mask)  # (b, h, n_q, head_dim)
        # the heads side by side, projected back to d
        return self.W_o(heads.transpose(1, 2).flatten(-2))

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"causal={self.causal}, window={self.window}, qk_norm={self.qk_norm!r}, rope_theta={self.rope_theta}"
                + (f", rotary_dim={self.rotary_dim}" if self.rotary_dim is not None else "")
                + (f", rope_scaling={self.rope_scaling}" if self.rope_scaling is not None else "")
                + (", sinks=True" if self.sinks is not None else ""))


class GatedAttention(nn.Module):
    r"""Multi-head attention with a sigmoid gate on the heads' output (Arcee Trinity).

    ``out = W_o( Attn(X) * sigmoid(W_gate X) )``: every feature of the concatenated
    heads is multiplied by its own input-dependent gate in (0, 1) before the output
    projection (Qiu et al., 2025; used in every layer of Arcee Trinity). It wraps a
    :class:`~d2lmini.attention.MultiHeadAttention` whose own output projection is
    replaced by the identity, so the wrapped module returns the concatenated heads.
    Drop it into a block with ``TransformerBlock(d, h, attn_factory=lambda:
    GatedAttention(d, h, ...))``. ``ch11_beyond_softmax.verify_gated_attention`` and the block
    zoo's Qwen3.5 row check it against Qwen3.5's ``Qwen3_5Attention``.

    Args:
        num_hiddens: model width ``d``.
        num_heads: query heads ``h``.
        **attention_kwargs: passed to :class:`~d2lmini.attention.MultiHeadAttention`
            (``num_kv_heads``, ``head_dim``, ``qk_norm``, ``rope_theta``, ``causal``,
            ``window``, ``bias``, ...).

    Attributes:
        attention: the wrapped attention (``attention.W_o`` is ``nn.Identity``);
        W_gate: ``nn.Linear(d, h * head_dim, bias=False)``; W_o: the output projection.
        num_heads, num_kv_heads, head_dim, qk_norm, rope_theta, causal, window: read from
        the wrapped attention.

    Shape:
        ``forward(queries, keys, values, valid_lens=None)`` as
        :class:`~d2lmini.attention.MultiHeadAttention`; the gate reads ``queries``.
        Returns ``(b, n_queries, d)``.

    Raises:
        ValueError / TypeError: as :class:`~d2lmini.attention.MultiHeadAttention`.

    The block zoo uses it too.
    """

    def __init__(self, num_hiddens: int, num_heads: int, **attention_kwargs):
        super().__init__()
        self.attention = MultiHeadAttention(num_hiddens, num_heads, **attention_kwargs)
        q_hiddens = self.attention.num_heads * self.attention.head_dim
        bias = self.attention.W_o.bias is not None
        self.attention.W_o = nn.Identity()  # the wrapped module now returns the concatenated heads
        self.W_gate = nn.Linear(num_hiddens, q_hiddens, bias=False)
        self.W_o = nn.Linear(q_hiddens, num_hiddens, bias=bias)

    # What the rest of the book reads from an attention module, passed through from the wrapped one.
    num_hiddens = property(lambda self: self.attention.num_hiddens)
    num_heads = property(lambda self: self.attention.num_heads)
    num_kv_heads = property(lambda self: self.attention.num_kv_heads)
    head_dim = property(lambda self: self.attention.head_dim)
    qk_norm = property(lambda self: self.attention.qk_norm)
    rope_theta = property(lambda self: self.attention.rope_theta)
    causal = property(lambda self: self.attention.causal)
    window = property(lambda self: self.attention.window)

    @shown_in("ch11")
    def forward(self, queries, keys, values, valid_lens=None) -> torch.Tensor:
        """Attend, gate every head feature by ``sigmoid(W_gate queries)``, project; returns (b, q, d)."""
        heads = self.attention(queries, keys, values, valid_lens)
        return self.W_o(heads * torch.sigmoid(self.W_gate(queries)))
