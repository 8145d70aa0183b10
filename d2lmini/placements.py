"""Where the norms go: one record per norm placement, read by the block, the figures, the zoo and chapter 4.

A placement is one :class:`Placement` in :data:`PLACEMENT_TABLE`: which norms it has (on the
sublayer's input, on its output inside the residual branch, on the stream after the addition),
whether its two sublayers run side by side, and how the book writes and draws it (label, short
label, formula, colour). :class:`~d2lmini.block.AddNorm` builds its norms from the record;
:mod:`d2lmini.plot` reads its labels, short labels, formulas and colours from it (for chapter 4's
figures and explorers and the zoo's tables); the tuples of :mod:`d2lmini.block` (``PLACEMENTS``,
``SEQUENTIAL_PLACEMENTS``, ...) are built from it, and so are the language model's final norm
(:attr:`Placement.final_norm`) and chapter 4's diagrams. A new placement is one entry here (and, for
a block, its branch in :class:`~d2lmini.block.AddNorm` or :class:`~d2lmini.block.TransformerBlock`
if its norms are not one of those three).

Two entries are not arguments of a block but configurations the probes of chapter 4 draw beside
them: ``'sandwich_scaled'`` (a sandwich whose sublayer-output norm starts at a gain below one) and
``'mhc'`` (manifold-constrained hyper-connections, chapter 10).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """One norm placement: its norms, and how the book names, writes and colours it.

    Attributes:
        name: the ``placement`` argument, e.g. ``'sandwich'``.
        norm_in: a norm on the sublayer's input, ``x + F(N(x))`` (pre-LN, sandwich).
        norm_out: a norm on the sublayer's output inside the branch, ``x + N(F(x))``
            (post-sublayer, sandwich), where ``sublayer_norm_gain`` applies.
        norm_post: a norm on the stream after the addition, ``N(x + F(x))`` (post-LN).
        parallel: attention and FFN read the same stream in one update per block
            (:class:`~d2lmini.block.TransformerBlock` only).
        in_block: whether it is a ``placement`` of :class:`~d2lmini.block.TransformerBlock`
            (``False`` for the probes' configurations drawn beside them).
        label: the name in legends and dropdowns, e.g. ``'sandwich (Gemma 2/3)'``, or ``None``.
        short_label: the name in the zoo's tables, or ``None``.
        formula: the update as printed under its diagram (LaTeX), or ``None``.
        color: its colour in every figure and widget, or ``None``.
    """

    name: str
    norm_in: bool = False
    norm_out: bool = False
    norm_post: bool = False
    parallel: bool = False
    in_block: bool = True
    label: str | None = None
    short_label: str | None = None
    formula: str | None = None
    color: str | None = None

    @property
    def final_norm(self) -> bool:
        """Whether a stack of these blocks ends with a norm before the output head: it does unless
        the stream is normalized after each addition (``norm_post``), as in post-LN."""
        return not self.norm_post


#: Every placement, in the order the tables, legends and dropdowns list them (the parallel ones:
#: :data:`d2lmini.block.PLACEMENTS`).
PLACEMENT_TABLE: dict[str, Placement] = {p.name: p for p in (
    Placement("post", norm_post=True, label="post-LN (2017)", short_label="post",
              formula=r"$x \leftarrow \mathrm{N}(x + F(x))$", color="#c0392b"),
    Placement("pre", norm_in=True, label="pre-LN (GPT-2)", short_label="pre",
              formula=r"$x \leftarrow x + F(\mathrm{N}(x))$", color="#2471a3"),
    Placement("post_sublayer", norm_out=True, label="post-sublayer (OLMo 2)", short_label="post-sublayer",
              formula=r"$x \leftarrow x + \mathrm{N}(F(x))$", color="#7d3c98"),
    Placement("sandwich", norm_in=True, norm_out=True, label="sandwich (Gemma 2/3)", short_label="sandwich",
              formula=r"$x \leftarrow x + \mathrm{N}(F(\mathrm{N}(x)))$", color="#229954"),
    Placement("parallel", norm_in=True, parallel=True, short_label="parallel"),
    Placement("parallel_two_norms", norm_in=True, parallel=True, short_label="parallel, two norms"),
    Placement("sandwich_scaled", norm_in=True, norm_out=True, in_block=False, label="depth-scaled sandwich",
              formula=r"$x \leftarrow x + \mathrm{N}_{\gamma_0}(F(\mathrm{N}(x)))$", color="#d68910"),
    Placement("mhc", in_block=False, label="mHC (DeepSeek-V4)", color="#17a589"),
)}


def placements(**where) -> tuple[str, ...]:
    """The names of the placements whose record has every attribute given, in table order.

    ``placements(in_block=True, parallel=False)`` gives the sequential placements.

    Raises:
        TypeError: a keyword that is not an attribute of :class:`Placement`.
    """
    unknown = sorted(set(where) - set(Placement.__dataclass_fields__))
    if unknown:
        raise TypeError(f"placements() got unknown attributes {unknown}; known: {sorted(Placement.__dataclass_fields__)}")
    return tuple(name for name, p in PLACEMENT_TABLE.items() if all(getattr(p, k) == v for k, v in where.items()))


def placement_field(attribute: str) -> dict[str, str]:
    """``{name: record.attribute}`` for every placement that sets ``attribute`` (``label``, ``color``, ...)."""
    if attribute not in Placement.__dataclass_fields__:
        raise TypeError(f"placement_field: {attribute!r} is not an attribute of Placement")
    return {name: getattr(p, attribute) for name, p in PLACEMENT_TABLE.items() if getattr(p, attribute) is not None}
