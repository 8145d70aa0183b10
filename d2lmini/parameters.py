"""Counting parameters: how many numbers a module learns, in total or part by part.

Introduced in the chapter "Anatomy: two sublayers on one residual stream", which splits
a block into attention, FFN and norms; the chapters on RMSNorm, on the feed-forward
network and on the 2026 block count norms, FFNs, experts and whole models with the same
function.
"""

from __future__ import annotations

from torch import nn

from ._checks import check_instance
from ._shown import shown_in

#: How :func:`num_parameters` splits a :class:`~d2lmini.block.TransformerBlock` (or a
#: decoder block): part -> the prefixes of the parameter names that belong to it. The
#: QK-norm gains and a decoder block's cross-attention count as attention; the norms
#: of the residual connections (``addnorm1``, ``addnorm2``, ...) as norms.
BLOCK_PARTS = {"attention": ("attention.", "cross_attention."), "ffn": ("ffn.",), "norms": ("addnorm",)}


@shown_in("ch01")
def num_parameters(module: nn.Module, parts: dict | None = None) -> int | dict[str, int]:
    """Count the parameters of ``module``, in total or per part.

    Every parameter tensor is counted once, even if the module holds it twice (tied
    weights), as ``module.parameters()`` lists it. Only shapes are read, so it works on
    the ``meta`` device: an 8-billion-parameter model costs no memory to count.

    Introduced in the chapter "Anatomy: two sublayers on one residual stream".

    Args:
        module: any ``nn.Module``.
        parts: ``None`` for the total alone, or ``{part: prefixes}``: a parameter
            belongs to the first part one of whose prefixes (a string or a tuple of
            strings) starts its name in ``module.named_parameters()``. E.g.
            :data:`BLOCK_PARTS`.

    Returns:
        The number of parameters (an int) when ``parts`` is ``None``; otherwise a dict
        with one count per part, in the order of ``parts``, and ``'total'``, which is
        their sum.

    Raises:
        TypeError: if ``module`` is not an ``nn.Module``.
        ValueError: if a parameter belongs to none of ``parts`` (the message names it).
    """
    check_instance("module", module, nn.Module, "an nn.Module")
    total = sum(p.numel() for p in module.parameters())
    if parts is None:
        return total
    counts = dict.fromkeys(parts, 0)
    for name, p in module.named_parameters():
        part = next((part for part, prefixes in parts.items() if name.startswith(prefixes)), None)
        if part is None:
            raise ValueError(f"parameter {name!r} belongs to none of the parts {list(parts)}")
        counts[part] += p.numel()
    return {**counts, "total": total}


__all__ = ["BLOCK_PARTS", "num_parameters"]
