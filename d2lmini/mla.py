"""Multi-head latent attention (DeepSeek-V2 and V3) and the key/value cache it shrinks.

:class:`MultiHeadLatentAttention` is the attention of DeepSeek-V2 (DeepSeek-AI, 2024,
arXiv 2405.04434, section 2.1) and DeepSeek-V3 (arXiv 2412.19437): keys and values are
rebuilt from one small latent vector per token, so a decoder caches that latent (and one
shared rotary key) instead of every head's key and value. :func:`kv_cache_bytes_per_token`
measures the cache of any d2lmini attention module. :class:`DSAIndexer` adds DeepSeek Sparse
Attention (DeepSeek-V3.2, GLM-5: each query attends to the keys a small indexer selects) to MLA.
The converters of Hugging Face's DeepSeek-V3 and GLM-5 layers into these modules live with the
real models' layers (:mod:`d2lmini.reference.deepseek`, :mod:`d2lmini.reference.glm`). Shapes use
d2l's names: ``(batch, num_steps, num_hiddens)``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import (check_bool, check_dtype_matches, check_positive_float, check_positive_int, check_probability,
                      check_sequence_tensor)
from .attention import (GatedAttention, MultiHeadAttention, apply_rotary, attention_mask, check_rope_scaling,
                        rotary_cos_sin, yarn_mscale)
from .norms import DEFAULT_EPS, RMSNorm


class DSAIndexer(nn.Module):
    r"""The indexer of DeepSeek Sparse Attention, DSA (DeepSeek-V3.2, arXiv 2512.02556; GLM-5).

    A small, cheap scorer that picks, for every query, the ``topk`` keys the attention may
    see. With ``H`` indexer heads of ``D`` features:

    * **Queries** from the attention's query latent ``c_q``: ``q = W_q c_q``, ``H`` heads
      of ``D`` features.
    * **One key** per token, shared by the heads: ``k = LayerNorm(W_k x)`` (``D`` features,
      a LayerNorm with gain and bias).
    * RoPE (half-split, the attention's ``cos``/``sin``) rotates the first ``rope_dim``
      features of each query and key; the others pass unchanged.
    * **Per-head weights** ``w = W_w x * H ** -0.5`` (``H`` numbers per token).
    * **Index score** of key ``t`` for query ``s``: ``I[s, t] = sum_h w[s, h] *
      ReLU(q[s, h] . k[t] * D ** -0.5)``; masked keys (causal, padding) score ``-inf``.
    * **Selection**: the ``min(topk, n)`` keys of largest ``I[s, t]`` per query.

    :meth:`forward` returns the selection as a boolean ``(b, n, n)`` mask (``True`` at the
    selected keys), one more term of the mask that
    :class:`MultiHeadLatentAttention` hands to SDPA (``indexer=``); with ``topk >= n``
    every unmasked key is selected and the attention is dense MLA again. The selection is
    not differentiable: gradients reach the selected keys through the attention, never the
    indexer's weights (Hugging Face runs its indexer under ``torch.no_grad``; DeepSeek
    trains it with a separate distillation loss, not reproduced here).

    Checked against Hugging Face ``transformers`` 5.24 ``GlmMoeDsaIndexer``
    (``models/glm_moe_dsa/modeling_glm_moe_dsa.py``); the names map as ``W_q`` = ``wq_b``,
    ``W_k`` = ``wk``, ``k_norm`` = ``k_norm``, ``W_w`` = ``weights_proj``. GLM-5 stores
    the rotary features interleaved; :func:`~d2lmini.reference.glm.from_glm_moe_dsa_attention` reorders the rows
    (and the LayerNorm's gain and bias) into the half-split layout.

    Args:
        num_hiddens: model width ``d``.
        q_lora_rank: width of the attention's query latent ``c_q``.
        num_heads: indexer heads ``H`` (GLM-5: 32).
        head_dim: features ``D`` per indexer head and of the key (GLM-5: 128).
        rope_dim: rotated features, even and ``<= head_dim`` (the attention's ``qk_rope_head_dim``).
        topk: keys kept per query (GLM-5: 2048).
        eps: the key LayerNorm's epsilon (1e-6, as Hugging Face).

    Raises:
        ValueError: a size not a positive int, an odd ``rope_dim`` or one above ``head_dim``;
            at call time, inputs of the wrong shape.
        TypeError: arguments of the wrong type.
    """

    def __init__(self, num_hiddens: int, q_lora_rank: int, *, num_heads: int, head_dim: int, rope_dim: int,
                 topk: int, eps: float = 1e-6):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.q_lora_rank = check_positive_int("q_lora_rank", q_lora_rank)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.rope_dim = check_positive_int("rope_dim", rope_dim)
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ValueError(f"rope_dim must be even and <= head_dim={head_dim}, got {rope_dim}")
        self.topk = check_positive_int("topk", topk)
        check_positive_float("eps", eps)
        self.W_q = nn.Linear(self.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.W_k = nn.Linear(self.num_hiddens, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=eps)
        self.W_w = nn.Linear(self.num_hiddens, self.num_heads, bias=False)

    def scores(self, X: torch.Tensor, c_q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The index scores ``I``, ``(b, n, n)`` (query, key), before masking.

        Args:
            X: the attention's input ``(b, n, d)``.
            c_q: the normalized query latent ``(b, n, q_lora_rank)``.
            cos, sin: ``(n, rope_dim)`` rotary tables (:func:`~d2lmini.attention.rotary_cos_sin`).
        """
        check_sequence_tensor("X", X, self.num_hiddens)
        check_sequence_tensor("c_q", c_q, self.q_lora_rank)
        q = self.W_q(c_q).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)  # (b, H, n, D)
        k = self.k_norm(self.W_k(X))[:, None]  # (b, 1, n, D): one key for all heads
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)  # the first rope_dim features
        per_head = F.relu(q @ k.transpose(-1, -2) * self.head_dim ** -0.5)  # (b, H, n, n)
        weights = self.W_w(X) * self.num_heads ** -0.5  # (b, n, H)
        return torch.einsum("bsh,bhst->bst", weights, per_head)

    @torch.no_grad()
    def forward(self, X: torch.Tensor, c_q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """The selected keys: a boolean ``(b, n, n)``, ``True`` at each query's ``min(topk, n)`` best keys.

        ``mask``: ``None`` or the attention's boolean mask, broadcastable to ``(b, 1, n, n)``
        (``True`` = may attend); masked keys score ``-inf``, so they are chosen only when a query
        has fewer than ``topk`` unmasked keys (and stay masked in the attention). Other
        arguments as :meth:`scores`.
        """
        index = self.scores(X, c_q, cos, sin)
        if mask is not None:  # (n, n), (b, 1, 1, n) or (b, 1, n, n) -> (b, n, n)
            index = index.masked_fill(~torch.broadcast_to(mask, (index.shape[0], 1, *index.shape[1:]))[:, 0],
                                      float("-inf"))
        chosen = index.topk(min(self.topk, index.shape[-1]), dim=-1).indices
        return torch.zeros_like(index, dtype=torch.bool).scatter_(-1, chosen, True)

    def extra_repr(self) -> str:
        return (f"q_lora_rank={self.q_lora_rank}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"rope_dim={self.rope_dim}, topk={self.topk}")


class MultiHeadLatentAttention(nn.Module):
    r"""Multi-head latent attention, MLA (DeepSeek-V2, arXiv 2405.04434; DeepSeek-V3, arXiv 2412.19437).

    For every token ``x`` (width ``d``), with ``h`` heads:

    * **Queries** (optionally low-rank): ``c_q = RMSNorm(W_dq x)`` (``q_lora_rank``
      features), ``q = W_uq c_q``; or ``q = W_q x`` when ``q_lora_rank`` is ``None``
      (DeepSeek-V2-Lite). Each head's query has ``qk_nope_head_dim`` features without
      position ("nope") followed by ``qk_rope_head_dim`` features that RoPE rotates.
    * **Keys and values** from a latent: ``W_dkv x`` gives the latent ``c_kv``
      (``kv_lora_rank`` features) and one rotary key ``k_rope`` (``qk_rope_head_dim``
      features) shared by all heads (as in multi-query attention); ``c_kv`` is
      RMS-normalized and ``W_ukv c_kv`` gives every head's ``k_nope``
      (``qk_nope_head_dim``) and value (``v_head_dim``).
    * **Attention**: head ``i``'s key is ``[k_nope_i, RoPE(k_rope)]``, its query
      ``[q_nope_i, RoPE(q_rope_i)]``; softmax of ``scale * q k^T`` over the keys
      (masked by ``causal`` and ``valid_lens`` as in
      :class:`~d2lmini.attention.MultiHeadAttention`), times the values; the heads'
      outputs (``h * v_head_dim``) are projected back by ``W_o``.

    A decoder caches only ``c_kv`` and the rotated ``k_rope`` per token
    (:meth:`latent_kv`; ``kv_lora_rank + qk_rope_head_dim`` numbers: 576 in DeepSeek-V3
    instead of the ``2 * 128 * 128 = 32,768`` of multi-head attention with its 128 heads
    of 128 features; :func:`kv_cache_bytes_per_token`). RoPE touches only the separate
    ``k_rope``, so at inference ``W_uk`` can be absorbed into the query projection (and
    ``W_uv`` into ``W_o``) and the keys never be materialized; a rotation of ``k_nope``, which
    depends on the key's position, would sit between them (DeepSeek-V2, Section 2.1.3). This
    module computes the keys explicitly, as ``DeepseekV3Attention`` does.

    The scale is ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``, times ``m ** 2``
    under YaRN with ``mscale_all_dim``, ``m = 0.1 * mscale_all_dim * ln(factor) + 1``
    (DeepSeek-V3's long-context setting); YaRN's own attention factor multiplies cos and
    sin (:func:`~d2lmini.attention.rope_frequencies`).

    RoPE uses d2lmini's half-split layout (:func:`~d2lmini.attention.apply_rotary`:
    feature ``j`` pairs with ``j + r/2``). DeepSeek's checkpoints store the rotary
    features interleaved (pairs ``(0, 1), (2, 3), ...``; ``config.rope_interleave=True``,
    ``apply_rotary_pos_emb_interleave``); that layout is the half-split one after
    reordering the rows of the projections that produce those features (evens first,
    then odds), which :func:`~d2lmini.reference.deepseek.from_deepseek_v3_attention` does, so no option is needed here.

    Checked against Hugging Face ``transformers`` 5.24 ``DeepseekV3Attention``
    (``models/deepseek_v3/modeling_deepseek_v3.py``); the names map as ``W_q`` =
    ``q_proj``, ``W_dq`` = ``q_a_proj`` (the paper's :math:`W^{DQ}`), ``q_latent_norm`` =
    ``q_a_layernorm``, ``W_uq`` = ``q_b_proj`` (:math:`W^{UQ}` and :math:`W^{QR}`),
    ``W_dkv`` = ``kv_a_proj_with_mqa`` (:math:`W^{DKV}` and :math:`W^{KR}`),
    ``kv_latent_norm`` = ``kv_a_layernorm``, ``W_ukv`` = ``kv_b_proj`` (:math:`W^{UK}` and
    :math:`W^{UV}`), ``W_o`` = ``o_proj``.

    Args:
        num_hiddens: model width ``d``.
        num_heads: heads ``h``.
        q_lora_rank: width of the query latent ``c_q``, or ``None`` for a full-rank
            query projection ``W_q`` (DeepSeek-V3: 1536; V2-Lite: ``None``).
        kv_lora_rank: width of the key/value latent ``c_kv`` (DeepSeek-V2 and V3: 512).
        qk_nope_head_dim: query/key features per head without position (128).
        qk_rope_head_dim: rotated query/key features per head, even (64).
        v_head_dim: value features per head (128).
        rope_theta: the RoPE base (DeepSeek-V3: 10,000).
        causal: whether query ``i`` sees only keys ``j <= i`` (default ``True``, as DeepSeek).
        rope_scaling: ``None`` or a RoPE scaling dict (:func:`~d2lmini.attention.rope_frequencies`;
            DeepSeek-V3 uses YaRN with ``factor`` 40, ``mscale`` = ``mscale_all_dim`` = 1).
        bias: biases on ``W_dq``, ``W_dkv`` and ``W_o`` (``config.attention_bias``; the
            other projections never have one); default ``False``.
        dropout: dropout on the attention weights (training only), in [0, 1).
        eps: epsilon of the two latent RMSNorms (default 1e-6: ``DeepseekV3Attention``
            builds them with the default of ``DeepseekV3RMSNorm``, not ``config.rms_norm_eps``).
        indexer: ``None`` (default: dense attention) or a :class:`DSAIndexer` (DeepSeek
            Sparse Attention: DeepSeek-V3.2, GLM-5): each query then attends only to the keys
            the indexer selects, its selection one more term of the boolean mask (``and``-ed
            with the causal and padding masks). Needs a query latent (``q_lora_rank``) of the
            indexer's width and the indexer's ``rope_dim`` equal to ``qk_rope_head_dim``.

    Attributes:
        W_q, W_dq, q_latent_norm, W_uq, W_dkv, kv_latent_norm, W_ukv, W_o: the parts above
            (``W_q`` is ``None`` with a query latent; ``W_dq``, ``q_latent_norm`` and ``W_uq``
            are ``None`` without one).
        indexer: the argument.
        num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim: the arguments.
        num_hiddens, rope_theta, rope_scaling, causal, dropout: the arguments.
        qk_head_dim: ``qk_nope_head_dim + qk_rope_head_dim``.
        scale: the logit scale (above).
        window: always ``None``: MLA has no sliding window (the readers of any attention module, such as
            :func:`~d2lmini.deltanet.inference_state_bytes` and the block zoo's table, ask for one).

    Shape:
        ``forward(queries, keys, values, valid_lens=None)`` as
        :class:`~d2lmini.attention.MultiHeadAttention`, for self-attention only:
        ``queries``, ``keys`` and ``values`` must be the same ``(b, n, d)`` tensor (as
        :class:`~d2lmini.block.TransformerBlock` passes it). Returns ``(b, n, d)``.

    Raises:
        ValueError: a width or rank not a positive int, an odd ``qk_rope_head_dim``,
            ``dropout`` outside [0, 1), a bad ``rope_scaling``, an ``indexer`` without a query
            latent or of another latent width or rotary width; at call time, ``keys`` or
            ``values`` that are not the ``queries`` tensor, an input that is not ``(b, n, d)``,
            or bad ``valid_lens`` (see :func:`~d2lmini.attention.valid_lens_mask`).
        TypeError: arguments or inputs of the wrong type or dtype.
    """

    window = None  # no sliding window (read by inference_state_bytes and the zoo's description of a block)

    def __init__(self, num_hiddens: int, num_heads: int, *, q_lora_rank: int | None, kv_lora_rank: int,
                 qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int, rope_theta: float,
                 causal: bool = True, rope_scaling: dict | None = None, bias: bool = False,
                 dropout: float = 0.0, eps: float = DEFAULT_EPS["rms"], indexer: DSAIndexer | None = None):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.q_lora_rank = None if q_lora_rank is None else check_positive_int("q_lora_rank", q_lora_rank)
        self.kv_lora_rank = check_positive_int("kv_lora_rank", kv_lora_rank)
        self.qk_nope_head_dim = check_positive_int("qk_nope_head_dim", qk_nope_head_dim)
        self.qk_rope_head_dim = check_positive_int("qk_rope_head_dim", qk_rope_head_dim)
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs), got {qk_rope_head_dim}")
        self.v_head_dim = check_positive_int("v_head_dim", v_head_dim)
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.rope_theta = check_positive_float("rope_theta", rope_theta)
        self.rope_scaling = None if rope_scaling is None else check_rope_scaling(rope_scaling)
        self.causal = check_bool("causal", causal)
        check_bool("bias", bias)
        self.dropout = check_probability("dropout", dropout)
        check_positive_float("eps", eps)

        h = self.num_heads
        if self.q_lora_rank is None:
            self.W_q = nn.Linear(num_hiddens, h * self.qk_head_dim, bias=False)
            self.W_dq = self.q_latent_norm = self.W_uq = None
        else:
            self.W_q = None
            self.W_dq = nn.Linear(num_hiddens, self.q_lora_rank, bias=bias)
            self.q_latent_norm = RMSNorm(self.q_lora_rank, eps)
            self.W_uq = nn.Linear(self.q_lora_rank, h * self.qk_head_dim, bias=False)
        self.W_dkv = nn.Linear(num_hiddens, self.kv_lora_rank + self.qk_rope_head_dim, bias=bias)
        self.kv_latent_norm = RMSNorm(self.kv_lora_rank, eps)
        self.W_ukv = nn.Linear(self.kv_lora_rank, h * (self.qk_nope_head_dim + self.v_head_dim), bias=False)
        self.W_o = nn.Linear(h * self.v_head_dim, num_hiddens, bias=bias)

        scale = self.qk_head_dim ** -0.5
        if self.rope_scaling is not None and self.rope_scaling.get("mscale_all_dim"):  # DeepSeek's YaRN
            scale *= yarn_mscale(self.rope_scaling["factor"], self.rope_scaling["mscale_all_dim"]) ** 2
        self.scale = scale
        if indexer is not None:
            if not isinstance(indexer, DSAIndexer):
                raise TypeError(f"indexer must be None or a DSAIndexer, got {type(indexer).__name__}")
            if self.q_lora_rank is None or indexer.q_lora_rank != self.q_lora_rank:
                raise ValueError(f"indexer reads the query latent: its q_lora_rank={indexer.q_lora_rank} must equal "
                                 f"the attention's q_lora_rank={self.q_lora_rank}")
            if indexer.rope_dim != self.qk_rope_head_dim or indexer.num_hiddens != self.num_hiddens:
                raise ValueError(f"indexer must have rope_dim={self.qk_rope_head_dim} and num_hiddens="
                                 f"{self.num_hiddens}, got {indexer.rope_dim} and {indexer.num_hiddens}")
        self.indexer = indexer

    def _rotary(self, num_steps: int, like: torch.Tensor):
        """``(cos, sin)``, each ``(num_steps, qk_rope_head_dim)``, in ``like``'s device and dtype."""
        return rotary_cos_sin(num_steps, self.qk_rope_head_dim, self.rope_theta, like.device, like.dtype,
                              scaling=self.rope_scaling)

    def latent_kv(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What a decoder caches per token: the normalized latent and the rotated shared key.

        Args:
            X: ``(b, n, d)``, positions ``0 .. n-1``.

        Returns:
            ``(c_kv, k_rope)``: ``(b, n, kv_lora_rank)`` and ``(b, n, qk_rope_head_dim)``.
        """
        c_kv, k_rope = self.W_dkv(X).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        cos, sin = self._rotary(X.shape[1], X)
        return self.kv_latent_norm(c_kv), apply_rotary(k_rope, cos, sin)

    def forward(self, queries, keys, values, valid_lens=None) -> torch.Tensor:
        """Self-attend over ``queries`` (b, n, d) (``keys`` and ``values`` must be that tensor); returns (b, n, d).

        ``valid_lens``: ``None``, ``(b,)`` or ``(b, n)`` integer lengths in ``[1, n]``;
        keys at positions >= the length are masked. See the class docstring for errors.
        """
        if keys is not queries or values is not queries:
            raise ValueError("MultiHeadLatentAttention is self-attention only: pass the same tensor as queries, "
                             "keys and values (as TransformerBlock does)")
        X = queries
        check_sequence_tensor("queries", X, self.num_hiddens)
        check_dtype_matches("queries", X, self)
        b, n, _ = X.shape
        h = self.num_heads
        c_q = None if self.W_q is not None else self.q_latent_norm(self.W_dq(X))  # the query latent
        q = self.W_q(X) if c_q is None else self.W_uq(c_q)
        q = q.unflatten(-1, (h, self.qk_head_dim)).transpose(1, 2)  # (b, h, n, nope + rope)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        cos, sin = self._rotary(n, X)
        q = torch.cat((q_nope, apply_rotary(q_rope, cos, sin)), dim=-1)

        c_kv, k_rope = self.latent_kv(X)  # (b, n, kv_lora_rank), (b, n, rope): the cache
        kv = self.W_ukv(c_kv).unflatten(-1, (h, self.qk_nope_head_dim + self.v_head_dim)).transpose(1, 2)
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)  # (b, h, n, nope), (b, h, n, v)
        k = torch.cat((k_nope, k_rope[:, None].expand(-1, h, -1, -1)), dim=-1)  # one rotary key for all heads

        # The mask of MultiHeadAttention (valid_lens, causal; no window), one code path for both.
        mask = attention_mask(valid_lens, b, n, n, X.device, causal=self.causal)
        if self.indexer is not None:  # DSA: only the keys the indexer selects, (b, 1, n, n)
            selected = self.indexer(X, c_q, cos, sin, mask)[:, None]
            mask = selected if mask is None else mask & selected
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.W_o(out.transpose(1, 2).flatten(-2))  # (b, n, h * v_head_dim) -> (b, n, d)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, q_lora_rank={self.q_lora_rank}, kv_lora_rank={self.kv_lora_rank}, "
                f"qk_nope_head_dim={self.qk_nope_head_dim}, qk_rope_head_dim={self.qk_rope_head_dim}, "
                f"v_head_dim={self.v_head_dim}, causal={self.causal}, rope_theta={self.rope_theta}"
                + (f", rope_scaling={self.rope_scaling}" if self.rope_scaling is not None else ""))


def kv_cache_bytes_per_token(module: nn.Module, dtype_bytes: int = 2) -> int:
    """Bytes of key/value cache one token costs in one attention layer, read from the module.

    * :class:`MultiHeadLatentAttention`: ``kv_lora_rank + qk_rope_head_dim`` numbers
      (the latent ``c_kv`` and the shared rotary key, :meth:`MultiHeadLatentAttention.latent_kv`),
      plus the indexer's key (``head_dim`` numbers) with a :class:`DSAIndexer`.
    * :class:`~d2lmini.attention.MultiHeadAttention` and
      :class:`~d2lmini.attention.GatedAttention`: ``2 * num_kv_heads * head_dim`` (a key
      and a value per key/value head): multi-head (``num_kv_heads = num_heads``),
      grouped-query and multi-query (``num_kv_heads = 1``) attention alike. A sliding
      window caps how many tokens are kept, not what each costs.

    Args:
        module: one of those attention modules, or a block holding one as ``.attention``
            (:class:`~d2lmini.block.TransformerBlock`).
        dtype_bytes: bytes per cached number (2: bfloat16/float16; 1: FP8; 4: float32).

    Returns:
        The bytes per token and layer (an int).

    Raises:
        TypeError: ``module`` is none of those; ``dtype_bytes`` not a positive int.
    """
    check_positive_int("dtype_bytes", dtype_bytes)
    attention = module.attention if isinstance(getattr(module, "attention", None), nn.Module) and not isinstance(
        module, GatedAttention) else module
    if isinstance(attention, MultiHeadLatentAttention):
        numbers = attention.kv_lora_rank + attention.qk_rope_head_dim
        if attention.indexer is not None:  # DSA caches the indexer's key as well
            numbers += attention.indexer.head_dim
    elif isinstance(attention, (MultiHeadAttention, GatedAttention)):
        numbers = 2 * attention.num_kv_heads * attention.head_dim
    else:
        raise TypeError("module must be a MultiHeadAttention, GatedAttention, MultiHeadLatentAttention or a block "
                        f"holding one as .attention, got {type(module).__name__}")
    return numbers * dtype_bytes
