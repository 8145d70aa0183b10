"""Multi-head (and grouped-query) scaled dot-product attention.

Introduced in the chapter "Anatomy"; QK-norm and RoPE are added in later chapters.
Shapes use d2l's names: ``(batch, num_steps, num_hiddens)``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import (check_bool, check_bool_or_choice, check_choice, check_dtype_matches, check_positive_float, check_positive_int,
                      check_probability, check_sequence_tensor)
from ._shown import shown_in
from .norms import DEFAULT_EPS, HeadwiseRMSNorm, RMSNorm

#: QK-norm variants accepted by ``MultiHeadAttention(qk_norm=...)``; all are RMSNorms
#: applied to queries and keys right before the dot product, and before RoPE.
#:
#: * ``'per_head'``: over each head's ``head_dim`` features, one gain vector shared by
#:   all heads (separate for q and k) -- Qwen3, Gemma 3.
#: * ``'projection'``: over the whole projection (all heads' features at once), before
#:   it is split into heads -- OLMo 2, and MiniMax-M2 as implemented in Hugging Face
#:   ``transformers`` 5.24 (the chapter "QK-norm" checks it).
#: * ``'per_head_distinct'``: over each head's features, a distinct gain vector for every
#:   head (a d2lmini option; we found no released model that uses it).
QK_NORMS = ("per_head", "projection", "per_head_distinct")

# torch >= 2.5 lets SDPA share key/value heads itself (grouped-query attention).
_SDPA_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def rotary_cos_sin(num_steps: int, head_dim: int, theta: float = 10000.0, device=None, dtype=torch.float32):
    """Cosines and sines of rotary position embeddings (RoPE; Su et al., 2021).

    Position ``p`` and frequency ``i`` get the angle ``p * theta**(-2i / head_dim)``,
    ``i = 0 .. head_dim/2 - 1``; each angle is repeated for the two halves of the
    head (the "half-split" layout used by Llama, Qwen3, OLMo 2 and Gemma in
    Hugging Face ``transformers``). Angles are computed in float32, then cast.

    Args:
        num_steps: sequence length ``n``.
        head_dim: features per head; must be even.
        theta: the RoPE base (10,000 in RoFormer and Llama 2; 500,000 in Llama 3).
        device, dtype: of the returned tensors.

    Returns:
        ``(cos, sin)``, each of shape ``(num_steps, head_dim)``.

    Raises:
        ValueError: if ``head_dim`` is odd or ``theta`` is not positive.
    """
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    check_positive_float("theta", theta)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    angles = torch.arange(num_steps, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(X: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate query or key features by their positions' angles (half-split RoPE).

    Feature ``j`` in the first half is paired with feature ``j + head_dim/2``; each
    pair is rotated by its angle: ``X * cos + rotate_half(X) * sin`` with
    ``rotate_half([x1, x2]) = [-x2, x1]``.

    Args:
        X: ``(batch, heads, num_steps, head_dim)``.
        cos, sin: ``(num_steps, head_dim)`` from :func:`rotary_cos_sin`.

    Returns:
        A tensor shaped like ``X``.
    """
    half = X.shape[-1] // 2
    rotated = torch.cat((-X[..., half:], X[..., :half]), dim=-1)
    return X * cos + rotated * sin


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


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention (Vaswani et al., 2017) with GQA, QK-norm and RoPE options.

    Queries, keys and values are projected by ``W_q``, ``W_k``, ``W_v`` and split
    into heads; optionally normalized (QK-norm) and rotated (RoPE), in that order;
    combined by ``torch.nn.functional.scaled_dot_product_attention`` (softmax of
    ``scale * q k^T``); concatenated and projected back by ``W_o``.

    * Grouped-query attention (Ainslie et al., 2023): with ``num_kv_heads <
      num_heads``, query head ``i`` reads key/value head
      ``i // (num_heads // num_kv_heads)``.
    * QK-norm (Dehghani et al., 2023; Wortsman et al., 2023): see :data:`QK_NORMS`.
      It is applied before RoPE, as in Qwen3, OLMo 2 and Gemma 3.
    * RoPE (Su et al., 2021): half-split layout, base ``rope_theta``, positions
      ``0 .. n-1`` for queries and keys (self-attention).

    Args:
        num_hiddens: model width ``d`` (last dimension of inputs and output).
        num_heads: number of query heads ``h``.
        dropout: dropout on the attention weights (training only), in [0, 1).
        bias: whether the four projections have biases (2017, BERT, GPT-2: yes; Llama: no),
            or ``'qkv'``: biases on ``W_q``, ``W_k``, ``W_v`` only, ``W_o`` without one, as
            Hugging Face ``transformers`` 5.24 ``Qwen2Attention`` (Qwen2: ``q/k/v_proj``
            with ``bias=True``, ``o_proj`` with ``bias=False``).
        num_kv_heads: key/value heads (default ``num_heads``); must divide ``num_heads``.
        causal: if ``True``, query ``i`` sees only keys ``j <= i`` (decoder self-attention).
        head_dim: features per head (default ``num_hiddens // num_heads``, which then
            must divide exactly); Qwen3 and Gemma 3 set it independently of ``d / h``.
        qk_norm: ``None`` or one of :data:`QK_NORMS`.
        qk_norm_eps: epsilon of the QK-norms (default 1e-6).
        rope_theta: RoPE base; ``None`` (default) for no rotary embedding.
        scale: the logit scale; default ``1 / sqrt(head_dim)`` (Gemma 3 uses
            ``query_pre_attn_scalar ** -0.5``).
        window: ``None`` (default: no window) or an int ``w >= 1``: sliding-window
            (local) attention, query ``i`` sees only keys ``j`` with ``i - w < j <= i``,
            i.e. itself and the ``w - 1`` keys before it (``w = 1``: itself alone).
            This is the convention of Hugging Face ``transformers`` 5.24
            (``masking_utils.sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``,
            and-ed with the causal mask), as used by Mistral 7B v0.1
            (``MistralConfig.sliding_window``) and the ``"sliding_attention"`` layers of
            Gemma 3. It needs ``causal=True`` (``ValueError`` otherwise): the models that
            use it are causal, and ``transformers``' bidirectional windows disagree on
            the edge (``masking_utils``: ``|i - j| <= w``; Gemma 3's bidirectional
            option: ``|i - j| < w``), so a non-causal window would be ambiguous.
            The window is one more term of the boolean mask handed to SDPA (fused path
            kept); a window ``>= n`` equals plain causal attention. With ``valid_lens``,
            a padded query whose window holds no real key attends to itself alone, so
            its (meaningless) output stays finite on every torch version.
        logit_softcap: ``None`` (default) or a float ``c > 0``: attention logit soft-capping,
            ``logits = tanh(logits / c) * c``, applied to the scaled logits
            ``scale * q k^T`` before masking and softmax, as Gemma 2's
            ``attn_logit_softcapping`` (Hugging Face ``transformers`` 5.24,
            ``models/gemma2/modeling_gemma2.py``, ``eager_attention_forward``). SDPA cannot
            soft-cap, so with a cap the attention is computed by an explicit (unfused)
            path: matmul, cap, mask, float32 softmax, dropout, matmul; without one the
            fused SDPA path is kept.

    Every argument after ``num_heads`` is keyword-only.

    Attributes:
        W_q, W_k, W_v, W_o: the projections (``nn.Linear``).
        q_norm, k_norm: the QK-norms, or ``None``.

    :meth:`queries_and_keys` returns the queries and keys exactly as :meth:`forward`
    hands them to the attention kernel.

    Shape:
        ``forward(queries, keys, values, valid_lens=None)`` with queries
        ``(batch, num_queries, num_hiddens)``, keys and values
        ``(batch, num_keys, num_hiddens)``, ``valid_lens`` ``None``, ``(batch,)``
        or ``(batch, num_queries)`` (keys at positions >= the valid length are
        masked); returns ``(batch, num_queries, num_hiddens)``.

    Raises:
        ValueError: ``num_hiddens`` not divisible by ``num_heads`` (without an explicit
            ``head_dim``), ``num_heads`` not divisible by ``num_kv_heads``, an unknown
            ``qk_norm`` (the message lists the allowed ones), an odd ``head_dim`` with
            RoPE, dropout outside [0, 1), ``bias`` a string other than ``'qkv'``,
            ``logit_softcap`` not > 0 or not finite, ``window`` below 1 or given without
            ``causal=True``; at call time, inputs of the wrong rank or
            width, keys and values of different shapes, RoPE or causal attention with
            different query and key lengths, or bad ``valid_lens`` (see
            :func:`valid_lens_mask`).
        TypeError: arguments of the wrong type.
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, dropout: float = 0.0, bias: bool = False,
                 num_kv_heads: int | None = None, causal: bool = False, head_dim: int | None = None,
                 qk_norm: str | None = None, qk_norm_eps: float | None = None,
                 rope_theta: float | None = None, scale: float | None = None, window: int | None = None,
                 logit_softcap: float | None = None):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_kv_heads = self.num_heads if num_kv_heads is None else check_positive_int("num_kv_heads", num_kv_heads)
        self.dropout = check_probability("dropout", dropout)
        self.causal = check_bool("causal", causal)
        check_bool_or_choice("bias", bias, ("qkv",))
        if head_dim is None:
            if self.num_hiddens % self.num_heads:
                raise ValueError(f"num_hiddens={num_hiddens} must be divisible by num_heads={num_heads} "
                                 "(or pass head_dim explicitly)")
            head_dim = self.num_hiddens // self.num_heads
        self.head_dim = check_positive_int("head_dim", head_dim)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}")
        self.qk_norm = None if qk_norm is None else check_choice("qk_norm", qk_norm, QK_NORMS)
        self.rope_theta = None if rope_theta is None else check_positive_float("rope_theta", rope_theta)
        if self.rope_theta is not None and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got head_dim={self.head_dim}")
        self.scale = None if scale is None else check_positive_float("scale", scale)
        self.window = None if window is None else check_positive_int("window", window)
        if self.window is not None and not self.causal:
            raise ValueError(f"window={window} needs causal=True (sliding-window attention is causal: "
                             "query i sees keys i - window < j <= i); pass causal=True or window=None")
        self.logit_softcap = None if logit_softcap is None else check_positive_float("logit_softcap", logit_softcap)

        q_hiddens, kv_hiddens = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv_bias = bias is True or bias == "qkv"  # 'qkv': Qwen2, no bias on W_o
        self.W_q = nn.Linear(num_hiddens, q_hiddens, bias=qkv_bias)
        self.W_k = nn.Linear(num_hiddens, kv_hiddens, bias=qkv_bias)
        self.W_v = nn.Linear(num_hiddens, kv_hiddens, bias=qkv_bias)
        self.W_o = nn.Linear(q_hiddens, num_hiddens, bias=bias is True)

        eps = DEFAULT_EPS["rms"] if qk_norm_eps is None else check_positive_float("qk_norm_eps", qk_norm_eps)
        if self.qk_norm == "per_head":
            self.q_norm, self.k_norm = RMSNorm(self.head_dim, eps), RMSNorm(self.head_dim, eps)
        elif self.qk_norm == "projection":
            self.q_norm, self.k_norm = RMSNorm(q_hiddens, eps), RMSNorm(kv_hiddens, eps)
        elif self.qk_norm == "per_head_distinct":
            self.q_norm = HeadwiseRMSNorm(self.num_heads, self.head_dim, eps=eps)
            self.k_norm = HeadwiseRMSNorm(self.num_kv_heads, self.head_dim, eps=eps)
        else:
            self.q_norm = self.k_norm = None
        self._rotary_cache: dict = {}

    def _rotary(self, num_steps: int, like: torch.Tensor):
        key = (num_steps, like.device, like.dtype)
        if key not in self._rotary_cache:
            self._rotary_cache = {key: rotary_cos_sin(num_steps, self.head_dim, self.rope_theta,
                                                      like.device, like.dtype)}
        return self._rotary_cache[key]

    @property
    def logit_scale(self) -> float:
        """The factor ``q . k`` is multiplied by before the softmax: ``scale``, or ``1/sqrt(head_dim)``."""
        return self.scale if self.scale is not None else self.head_dim ** -0.5

    @shown_in("ch06")
    def queries_and_keys(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys exactly as they enter the attention kernel.

        Project, QK-normalize (if ``qk_norm``: the whole projection, or each head),
        split into heads, then rotate by RoPE (if ``rope_theta``): the norm comes before
        the rotation, as in Qwen3, OLMo 2 and Gemma 3. Used by :meth:`forward` and by
        the chapter "QK-norm" (logits ``logit_scale * q @ k.transpose(-1, -2)``).

        Args:
            queries: ``(b, n_q, d)``; keys: ``(b, n_k, d)``.

        Returns:
            ``(q, k)``, shapes ``(b, h, n_q, head_dim)`` and ``(b, h_kv, n_k, head_dim)``;
            with grouped-query attention query head ``i`` reads key head ``i // (h // h_kv)``.

        Raises:
            TypeError / ValueError: inputs that are not floating ``(b, n, d)`` tensors of
                the weights' dtype and one batch size (with RoPE, also one length).
        """
        self._check_inputs(queries, keys)
        q, k = self.W_q(queries), self.W_k(keys)  # (b, n_q, h * head_dim), (b, n_k, h_kv * head_dim)
        if self.qk_norm == "projection":  # one statistic over all heads (OLMo 2)
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.unflatten(-1, (self.num_heads, self.head_dim))  # (b, n_q, h, head_dim)
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))  # (b, n_k, h_kv, head_dim)
        if self.qk_norm is not None and self.qk_norm != "projection":  # one statistic per head (Qwen3)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # heads first
        if self.rope_theta is not None:
            cos, sin = self._rotary(q.shape[2], q)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k

    def _check_inputs(self, queries: torch.Tensor, keys: torch.Tensor) -> None:
        """Raise for inputs :meth:`queries_and_keys` cannot take.

        Raises:
            TypeError: inputs that are not floating tensors, or not of the weights' dtype.
            ValueError: inputs that are not ``(b, n, d)``, different batch sizes, or RoPE
                with different query and key lengths.
        """
        check_sequence_tensor("queries", queries, self.num_hiddens)
        check_dtype_matches("queries", queries, self)
        check_sequence_tensor("keys", keys, self.num_hiddens)
        if keys.shape[0] != queries.shape[0]:
            raise ValueError(f"queries and keys must have the same batch size, got {queries.shape[0]} and {keys.shape[0]}")
        if self.rope_theta is not None and queries.shape[1] != keys.shape[1]:
            raise ValueError("RoPE needs as many queries as keys (self-attention), "
                             f"got {queries.shape[1]} queries and {keys.shape[1]} keys")

    def _mask(self, valid_lens, batch_size: int, num_queries: int, num_keys: int, device) -> torch.Tensor | None:
        """The boolean ``attn_mask``, (b, 1, 1 or q, k), of ``valid_lens``, ``causal`` and ``window``; ``None`` if none."""
        if self.causal and num_queries != num_keys:
            raise ValueError("causal attention needs as many queries as keys (self-attention), "
                             f"got {num_queries} queries and {num_keys} keys")
        mask = valid_lens_mask(valid_lens, num_keys, min_len=1)  # (b, k) or (b, q, k)
        if mask is not None:
            if tuple(valid_lens.shape) not in ((batch_size,), (batch_size, num_queries)):
                raise ValueError(f"valid_lens must have shape ({batch_size},) or ({batch_size}, {num_queries}), "
                                 f"got {tuple(valid_lens.shape)}")
            mask = mask.to(device)
            mask = mask[:, None, None] if valid_lens.dim() == 1 else mask[:, None]
        if self.causal:
            # An explicit mask, not SDPA's is_causal: on CPU its masked kernel is the faster one.
            causal = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril()
            if self.window is not None:  # and j > i - window: the band of the last `window` keys
                causal = causal.triu(1 - self.window)
            if mask is None:
                return causal
            mask = mask & causal
            if self.window is not None:  # a padded query may see no real key: let it see itself
                diagonal = torch.eye(num_queries, num_keys, dtype=torch.bool, device=device)
                mask = mask | (diagonal & ~mask.any(dim=-1, keepdim=True))
        return mask

    def forward(self, queries, keys, values, valid_lens=None) -> torch.Tensor:
        """Attend from ``queries`` (b, q, d) to ``keys``/``values`` (b, k, d); returns (b, q, d).

        ``valid_lens``: ``None``, ``(b,)`` or ``(b, q)`` integer lengths in ``[1, k]``;
        keys at positions >= the length are masked. See the class docstring for errors.
        """
        q, k = self.queries_and_keys(queries, keys)
        check_sequence_tensor("values", values, self.num_hiddens)
        if keys.shape != values.shape:
            raise ValueError(f"keys and values must have the same shape, got {tuple(keys.shape)} and {tuple(values.shape)}")
        mask = self._mask(valid_lens, queries.shape[0], queries.shape[1], keys.shape[1], queries.device)
        v = self.W_v(values).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        extra = {}
        if self.num_kv_heads != self.num_heads:
            if _SDPA_HAS_GQA:  # SDPA reads the shared heads in place: no copies saved for backward
                extra["enable_gqa"] = True
            else:
                group = self.num_heads // self.num_kv_heads
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
        dropout_p = self.dropout if self.training else 0.0
        if self.logit_softcap is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                                 dropout_p=dropout_p, **extra)
        else:
            out = self._explicit_attention(q, k, v, mask, dropout_p)
        return self.W_o(out.transpose(1, 2).flatten(-2))

    def _explicit_attention(self, q, k, v, mask, dropout_p: float) -> torch.Tensor:
        """Unfused attention with logit soft-capping (Gemma 2), as ``eager_attention_forward``.

        ``logits = tanh(scale * q k^T / cap) * cap`` (no cap: the plain scaled logits), then the mask, a float32 softmax,
        dropout and the weighted sum of values; returns ``(b, h, n_q, head_dim)``.
        """
        if k.shape[1] != q.shape[1]:  # grouped-query attention: share the key/value heads
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        logits = q @ k.transpose(-1, -2) * self.logit_scale
        if self.logit_softcap is not None:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(q.dtype)
        weights = F.dropout(weights, p=dropout_p, training=dropout_p > 0)
        return weights @ v

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"causal={self.causal}, window={self.window}, qk_norm={self.qk_norm!r}, rope_theta={self.rope_theta}"
                + (f", logit_softcap={self.logit_softcap}" if self.logit_softcap is not None else ""))


class GatedAttention(nn.Module):
    r"""Multi-head attention with a sigmoid gate on the heads' output (Arcee Trinity).

    ``out = W_o( Attn(X) * sigmoid(W_gate X) )``: every feature of the concatenated
    heads is multiplied by its own input-dependent gate in (0, 1) before the output
    projection (Qiu et al., 2025; used in every layer of Arcee Trinity). It wraps a
    :class:`~d2lmini.attention.MultiHeadAttention` whose own output projection is
    replaced by the identity, so the wrapped module returns the concatenated heads.
    Drop it into a block with ``TransformerBlock(d, h, attn_factory=lambda:
    GatedAttention(d, h, ...))``.

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

    Introduced in the chapter "One block, every configuration".
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

    def forward(self, queries, keys, values, valid_lens=None) -> torch.Tensor:
        """Attend, gate every head feature by ``sigmoid(W_gate queries)``, project; returns (b, q, d)."""
        heads = self.attention(queries, keys, values, valid_lens)
        return self.W_o(heads * torch.sigmoid(self.W_gate(queries)))
