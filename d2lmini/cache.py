"""The key/value cache of a decoder: what generation keeps from one token to the next.

Introduced in the chapter "Attention for generation" (why it exists, how large it is per
token) and used by :func:`d2lmini.generate` in "The 2026 block". A causal self-attention
layer that is handed a :class:`LayerCache` attends from its new queries to every key it has
seen, and appends its new keys and values to the cache: decoding one token then costs one
row of attention instead of recomputing the whole prefix.
"""

from __future__ import annotations

import torch

from ._checks import check_positive_int


class LayerCache:
    """The keys and values one attention layer has computed so far.

    Keys are stored as they enter the attention kernel (after QK-norm and RoPE), values after
    their projection; both ``(batch, num_kv_heads, length, head_dim)``. With grouped-query
    attention (Ainslie et al., 2023) only the ``num_kv_heads`` shared heads are stored, which
    is what makes its cache smaller than multi-head attention's.

    Attributes:
        keys, values: the cached tensors, or ``None`` before the first :meth:`update`.
    """

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        """Number of positions cached."""
        return 0 if self.keys is None else self.keys.shape[2]

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new ``keys`` and ``values`` (b, h_kv, n_new, head_dim); return all of them so far.

        Args:
            keys, values: the new positions' keys and values, ``(b, h_kv, n_new, head_dim)`` each.

        Raises:
            TypeError: if either is not a tensor.
            ValueError: if they are not 4-D, their shapes differ from each other or, except in
                the length, from what is cached.
        """
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            raise TypeError(f"keys and values must be torch.Tensors, got {type(keys).__name__} and {type(values).__name__}")
        if keys.dim() != 4:
            raise ValueError(f"keys and values must be (batch, num_kv_heads, num_steps, head_dim), got {tuple(keys.shape)}")
        if keys.shape != values.shape:
            raise ValueError(f"keys and values must have one shape, got {tuple(keys.shape)} and {tuple(values.shape)}")
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            if keys.shape[:2] != self.keys.shape[:2] or keys.shape[3] != self.keys.shape[3]:
                raise ValueError(f"new keys {tuple(keys.shape)} do not extend the cached {tuple(self.keys.shape)}")
            self.keys = torch.cat((self.keys, keys), dim=2)
            self.values = torch.cat((self.values, values), dim=2)
        return self.keys, self.values


class KVCache:
    """One :class:`LayerCache` per block of a language model.

    Args:
        num_layers: the number of blocks (each has its own cache).

    Attributes:
        layers: the per-block caches; block ``i`` reads and extends ``layers[i]``.

    Raises:
        ValueError / TypeError: if ``num_layers`` is not a positive int.
    """

    def __init__(self, num_layers: int):
        self.layers = [LayerCache() for _ in range(check_positive_int("num_layers", num_layers))]

    def __len__(self) -> int:
        """Number of positions cached (the same in every block)."""
        return len(self.layers[0])

    def num_bytes(self) -> int:
        """Bytes the cached keys and values occupy, summed over the blocks (measured from the tensors)."""
        return sum(t.numel() * t.element_size() for layer in self.layers
                   for t in (layer.keys, layer.values) if t is not None)


__all__ = ["KVCache", "LayerCache"]
