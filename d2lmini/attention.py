"""Multi-head (and grouped-query) scaled dot-product attention.

Introduced in the chapter "Anatomy"; QK-norm and RoPE are added in later chapters.
Shapes use d2l's names: ``(batch, num_steps, num_hiddens)``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import check_bool, check_positive_int, check_probability, check_sequence_tensor


def valid_lens_mask(valid_lens, batch_size: int, num_queries: int, num_keys: int, device=None) -> torch.Tensor | None:
    """Turn d2l-style ``valid_lens`` into a boolean attention mask.

    Key position ``j`` is visible to query ``i`` of sequence ``b`` when
    ``j < valid_lens[b]`` (shape ``(batch,)``) or ``j < valid_lens[b, i]``
    (shape ``(batch, num_queries)``), as in d2l's ``masked_softmax``.

    Args:
        valid_lens: ``None`` (every key visible) or an integer tensor of shape
            ``(batch,)`` or ``(batch, num_queries)`` with values in ``[1, num_keys]``.
        batch_size, num_queries, num_keys: the sizes the mask must fit.
        device: where to build the mask (defaults to ``valid_lens``' device).

    Returns:
        ``None`` or a bool tensor of shape ``(batch, 1, num_queries, num_keys)``,
        ``True`` where attention is allowed (the convention of
        ``torch.nn.functional.scaled_dot_product_attention``).

    Raises:
        TypeError: if ``valid_lens`` is not an integer tensor.
        ValueError: if its shape does not match, or a value is outside
            ``[1, num_keys]`` (a query that may see no key has no defined output).
    """
    if valid_lens is None:
        return None
    if not isinstance(valid_lens, torch.Tensor):
        raise TypeError(f"valid_lens must be None or an integer torch.Tensor, got {type(valid_lens).__name__}")
    if valid_lens.is_floating_point() or valid_lens.is_complex() or valid_lens.dtype == torch.bool:
        raise TypeError(f"valid_lens must have an integer dtype, got {valid_lens.dtype}")
    if tuple(valid_lens.shape) not in ((batch_size,), (batch_size, num_queries)):
        raise ValueError(
            f"valid_lens must have shape ({batch_size},) or ({batch_size}, {num_queries}), "
            f"got {tuple(valid_lens.shape)}"
        )
    if valid_lens.numel() and (int(valid_lens.min()) < 1 or int(valid_lens.max()) > num_keys):
        raise ValueError(
            f"valid_lens values must lie in [1, {num_keys}] (the number of keys), "
            f"got min {int(valid_lens.min())} and max {int(valid_lens.max())}"
        )
    device = valid_lens.device if device is None else device
    lens = valid_lens.to(device)
    lens = lens[:, None] if lens.dim() == 1 else lens  # (batch, num_queries or 1)
    positions = torch.arange(num_keys, device=device)
    return (positions[None, None, :] < lens[:, :, None])[:, None]  # (batch, 1, q, k)


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention (Vaswani et al., 2017), with grouped-query key/value heads.

    Queries, keys and values are projected by ``W_q``, ``W_k``, ``W_v``, split
    into heads, combined by ``torch.nn.functional.scaled_dot_product_attention``
    (softmax of ``q k^T / sqrt(head_dim)``), concatenated and projected by ``W_o``.
    With ``num_kv_heads < num_heads`` it is grouped-query attention (Ainslie et
    al., 2023): query head ``i`` reads key/value head ``i // (num_heads // num_kv_heads)``.

    Args:
        num_hiddens: model width ``d`` (last dimension of inputs and output).
        num_heads: number of query heads; must divide ``num_hiddens``.
        dropout: dropout probability on the attention weights (training only), in [0, 1).
        bias: whether the four projections have biases (2017, BERT, GPT-2: yes; Llama: no).
        num_kv_heads: number of key/value heads (default ``num_heads``); must divide ``num_heads``.
        causal: if ``True``, query ``i`` sees only keys ``j <= i`` (decoder self-attention).

    Shape:
        ``forward(queries, keys, values, valid_lens=None)`` with queries
        ``(batch, num_queries, num_hiddens)``, keys and values
        ``(batch, num_keys, num_hiddens)``, ``valid_lens`` ``None``, ``(batch,)``
        or ``(batch, num_queries)``; returns ``(batch, num_queries, num_hiddens)``.

    Raises:
        ValueError: ``num_hiddens`` not divisible by ``num_heads``, ``num_heads``
            not divisible by ``num_kv_heads``, dropout outside [0, 1); at call time,
            inputs of the wrong rank or width, keys/values of different shapes,
            or bad ``valid_lens`` (see :func:`valid_lens_mask`).
        TypeError: arguments of the wrong type.
    """

    def __init__(self, num_hiddens: int, num_heads: int, dropout: float = 0.0, bias: bool = False,
                 num_kv_heads: int | None = None, causal: bool = False):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_kv_heads = self.num_heads if num_kv_heads is None else check_positive_int("num_kv_heads", num_kv_heads)
        self.dropout = check_probability("dropout", dropout)
        self.causal = check_bool("causal", causal)
        check_bool("bias", bias)
        if self.num_hiddens % self.num_heads:
            raise ValueError(f"num_hiddens={num_hiddens} must be divisible by num_heads={num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}")
        self.head_dim = self.num_hiddens // self.num_heads
        kv_hiddens = self.num_kv_heads * self.head_dim
        self.W_q = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(num_hiddens, kv_hiddens, bias=bias)
        self.W_v = nn.Linear(num_hiddens, kv_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def _split_heads(self, X: torch.Tensor, num_heads: int) -> torch.Tensor:
        # (batch, steps, heads * head_dim) -> (batch, heads, steps, head_dim)
        return X.unflatten(-1, (num_heads, self.head_dim)).transpose(1, 2)

    def forward(self, queries, keys, values, valid_lens=None) -> torch.Tensor:
        check_sequence_tensor("queries", queries, self.num_hiddens)
        check_sequence_tensor("keys", keys, self.num_hiddens)
        check_sequence_tensor("values", values, self.num_hiddens)
        if keys.shape != values.shape:
            raise ValueError(f"keys and values must have the same shape, got {tuple(keys.shape)} and {tuple(values.shape)}")
        if keys.shape[0] != queries.shape[0]:
            raise ValueError(f"queries and keys must have the same batch size, got {queries.shape[0]} and {keys.shape[0]}")
        batch_size, num_queries, _ = queries.shape
        num_keys = keys.shape[1]
        if self.causal and num_queries != num_keys:
            raise ValueError(f"causal attention needs as many queries as keys, got {num_queries} and {num_keys}")
        mask = valid_lens_mask(valid_lens, batch_size, num_queries, num_keys, device=queries.device)
        if self.causal:
            causal = torch.ones(num_queries, num_keys, dtype=torch.bool, device=queries.device).tril()
            mask = causal if mask is None else mask & causal

        q = self._split_heads(self.W_q(queries), self.num_heads)
        k = self._split_heads(self.W_k(keys), self.num_kv_heads)
        v = self._split_heads(self.W_v(values), self.num_kv_heads)
        if self.num_kv_heads != self.num_heads:
            group = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.W_o(out.transpose(1, 2).flatten(-2))

    def extra_repr(self) -> str:
        return (f"num_hiddens={self.num_hiddens}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, causal={self.causal}")
