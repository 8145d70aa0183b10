"""The anatomy of a Transformer block: shapes, where tokens meet, parameters, the residual stream.

Introduced in the chapter "Anatomy: two sublayers on one residual stream". The diagram
of the block (:func:`draw_block`) and five measurements on
:class:`~d2lmini.block.TransformerBlock`:

* :func:`stack_anatomy` (with :func:`shared_parameters` and :func:`w_q_gaps`) -- blocks map
  ``(b, n, d)`` to ``(b, n, d)`` and so stack, each with parameters of its own;
* :func:`position_mixing` (with :func:`permutation_gap` and
  :func:`alone_vs_in_sequence`) -- attention is the only sublayer in which positions
  interact;
* :func:`count_parameters`, :func:`parameter_counts` -- where a block's parameters
  are, counted from the modules themselves (:func:`d2lmini.parameters.num_parameters`);
* :func:`add_sublayer`, :func:`record_contributions`, :func:`residual_sum` -- the
  residual stream as a running sum of the sublayers' outputs;
* :func:`decoder_effects`, :func:`decoder_block_checks` -- the decoder block of an
  encoder-decoder model, whose third sublayer (cross-attention) reads the encoder.

Shapes use the legend b = batch, n = num_steps, d = num_hiddens.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

import torch
from torch import nn

from .._checks import check_seed as _check_seed
from .._checks import (check_bool, check_choice, check_float_dtype, check_instance, check_int_at_least,
                       check_positive_float, check_positive_int, check_sequence_tensor)
from .._shown import shown_in
from ..block import SEQUENTIAL_PLACEMENTS, TransformerBlock, TransformerDecoderBlock
from ..parameters import BLOCK_PARTS, num_parameters
from ..plot import PART_COLORS, PART_LABELS, RUNNING_SUM_COLOR, styled_figure
from ..probes import INITS, init_linear_weights_, stream_rms
from ..seeding import seeded

#: The two sublayers of a block, in the order they act on the stream.
SUBLAYERS = ("attention", "ffn")

#: Block shapes whose parameters :func:`parameter_counts` counts by default: name ->
#: keyword arguments of :class:`~d2lmini.block.TransformerBlock`. The 2017
#: Transformer's base model (Vaswani et al., 2017): d = 512, 8 heads, ReLU FFN of width
#: 4d = 2048, LayerNorm after each addition; biases in every linear map, as PyTorch's
#: ``nn.TransformerDecoderLayer`` has them (the paper's attention equations have none).
BLOCK_SHAPES = {
    "Transformer 2017, d = 512": dict(num_hiddens=512, num_heads=8, norm="layer", act="relu",
                                      placement="post", bias=True),
}

#: The block of Llama 3 8B (Grattafiori et al., 2024), for the chapter's exercise on
#: parameter counts: d = 4096, 32 query heads sharing 8 key/value heads (grouped-query
#: attention), SwiGLU FFN of width 14336, RMSNorm before each sublayer, no biases, RoPE
#: (which has no parameters).
LLAMA3_8B_BLOCK = dict(num_hiddens=4096, num_heads=32, num_kv_heads=8, ffn_num_hiddens=14336,
                       norm="rms", act="swiglu", placement="pre", bias=False, causal=True, rope_theta=500000.0)

#: The parts :func:`count_parameters` reports, in order (see :data:`d2lmini.parameters.BLOCK_PARTS`).
PARTS = tuple(BLOCK_PARTS)


def sublayer_labels(depth: int) -> list[str]:
    """Names of the ``2 * depth`` sublayers of a stack, bottom to top: ``'1 attn'``, ``'1 FFN'``, ...

    Raises:
        TypeError / ValueError: if ``depth`` is not an int >= 1.
    """
    depth = check_positive_int("depth", depth)
    return [f"{k} {name}" for k in range(1, depth + 1) for name in ("attn", "FFN")]


def make_stack(depth: int, num_hiddens: int = 64, num_heads: int = 4, seed: int = 0,
               init: str = "torch_default", **block_kwargs) -> nn.Sequential:
    """A stack of ``depth`` freshly initialized blocks, each with its own parameters.

    Args:
        depth: number of blocks ``L`` (>= 1).
        num_hiddens, num_heads: width ``d`` and heads of every block.
        seed: seeds every block's weights (the global RNG is left untouched).
        init: ``'torch_default'`` (PyTorch's ``nn.Linear`` initialization) or
            ``'xavier_uniform'`` (see :func:`d2lmini.probes.init_linear_weights_`).
        **block_kwargs: passed to :class:`~d2lmini.block.TransformerBlock`
            (``norm``, ``act``, ``placement``, ...).

    Returns:
        ``nn.Sequential`` of ``depth`` :class:`~d2lmini.block.TransformerBlock`;
        it maps ``(b, n, d)`` to ``(b, n, d)``.

    Raises:
        ValueError / TypeError: for a bad ``depth``, ``seed`` or ``init``, or any
            argument :class:`~d2lmini.block.TransformerBlock` rejects.
    """
    depth = check_positive_int("depth", depth)
    _check_seed(seed)
    check_choice("init", init, INITS)
    with seeded(seed):
        return nn.Sequential(*(init_linear_weights_(TransformerBlock(num_hiddens, num_heads, **block_kwargs), init)
                               for _ in range(depth)))


# --------------------------------------------------------------------------- the diagram


def draw_block(width: float = 6.2, height: float = 5.0):
    """Draw the pre-LN block: the residual stream as a straight line, the two sublayers beside it.

    The stream ``X`` (shape ``(n, d)``) runs from the bottom to the top. Each sublayer
    branches off it, passes through a norm and its sublayer (multi-head attention, then
    the FFN) and is added back at a ``+``; a note beside each sublayer says which
    positions it reads. The colours are those of :data:`d2lmini.plot.PART_COLORS`.

    Args:
        width, height: figure size in inches (positive numbers).

    Returns:
        A pyplot-free ``matplotlib.figure.Figure`` (:func:`d2lmini.plot.styled_figure`).

    Raises:
        ValueError / TypeError: if ``width`` or ``height`` is not a positive number.
    """
    from matplotlib.patches import FancyBboxPatch

    width, height = check_positive_float("width", width), check_positive_float("height", height)
    stream_x, branch_x = 0.2, 0.48
    line = dict(color="0.25", linewidth=1.3, zorder=2)

    def box(ax, y, text, color, text_color="white"):
        ax.add_patch(FancyBboxPatch((branch_x - 0.15, y - 0.035), 0.3, 0.07,
                                    boxstyle="round,pad=0.005,rounding_size=0.015",
                                    facecolor=color, edgecolor="0.2", linewidth=1.0, zorder=3))
        ax.text(branch_x, y, text, ha="center", va="center", fontsize=10.5, color=text_color, zorder=4)

    def arrow(ax, start, end, **style):
        ax.annotate("", xy=end, xytext=start, zorder=2,
                    arrowprops=dict(arrowstyle="-|>", shrinkA=0, shrinkB=0, **{**line, **style}))

    sublayers = ((0.12, "multi-head attention", "attention", "mixes the positions:\nrow $i$ reads every row $j$"),
                 (0.52, "FFN", "ffn", "one position at a time:\nrow $i$ reads row $i$"))
    with styled_figure(1, width=width, height=height) as (fig, ax):
        stream = dict(color=RUNNING_SUM_COLOR, linewidth=2.4)
        arrow(ax, (stream_x, 0.03), (stream_x, 0.96), **stream)
        for y0, name, part, note in sublayers:
            ax.plot([stream_x, branch_x, branch_x], [y0, y0, y0 + 0.065], **line)
            box(ax, y0 + 0.1, "Norm", PART_COLORS["norms"])
            arrow(ax, (branch_x, y0 + 0.135), (branch_x, y0 + 0.185))
            box(ax, y0 + 0.22, name, PART_COLORS[part])
            ax.plot([branch_x, branch_x], [y0 + 0.255, y0 + 0.32], **line)
            arrow(ax, (branch_x, y0 + 0.32), (stream_x + 0.025, y0 + 0.32))
            ax.text(stream_x, y0 + 0.32, "+", ha="center", va="center", fontsize=12, zorder=4,
                    bbox=dict(boxstyle="circle,pad=0.12", facecolor="white", edgecolor="0.2"))
            ax.text(branch_x + 0.18, y0 + 0.22, note, ha="left", va="center", fontsize=9.5, color="0.25")
        ax.text(stream_x, 0.0, r"$X$, shape $(n, d)$", ha="center", va="top", fontsize=10.5)
        ax.text(stream_x, 0.985, r"$X''$, shape $(n, d)$", ha="center", va="bottom", fontsize=10.5)
        ax.text(stream_x - 0.035, 0.3, "residual stream", rotation=90, ha="right", va="center", fontsize=10,
                color=RUNNING_SUM_COLOR)
        ax.text(stream_x - 0.03, 0.5, r"$X'$", ha="right", va="center", fontsize=10.5)
        ax.set(xlim=(0, 1), ylim=(-0.06, 1.04))
        ax.axis("off")
    return fig


# --------------------------------------------------------------------------- stacking


@dataclass
class StackAnatomy:
    """What :func:`stack_anatomy` found about a stack of blocks.

    Attributes:
        config: the arguments of the run.
        shapes: per block, ``(input shape, output shape)`` as tuples.
        parameter_shapes: parameter name -> shape, for block 1 (e.g.
            ``'attention.W_q.weight'``).
        same_parameter_shapes: whether every block has exactly these names and shapes.
        num_parameters: per block, its number of parameters.
        shared_tensors: how many parameter tensors share memory with a tensor of
            another block (0: every block owns its parameters).
        w_q_gap: per block ``k``, ``max |W_q^(k) - W_q^(1)|`` (0 for block 1; above 0:
            same shape, different values).
    """

    config: dict
    shapes: list[tuple[tuple[int, ...], tuple[int, ...]]]
    _: KW_ONLY
    parameter_shapes: dict[str, tuple[int, ...]]
    same_parameter_shapes: bool
    num_parameters: list[int]
    shared_tensors: int
    w_q_gap: list[float]

    @property
    def depth(self) -> int:
        """Number of blocks in the stack."""
        return len(self.shapes)

    def rows(self) -> list[dict]:
        """One dict per block (for a table): block, in/out shapes, parameter tensors, parameters, W_q gap."""
        return [{"block": k + 1, "input shape": str(shape_in), "output shape": str(shape_out),
                 "parameter tensors": len(self.parameter_shapes), "parameters": self.num_parameters[k],
                 "max |W_q − W_q of block 1|": self.w_q_gap[k]}
                for k, (shape_in, shape_out) in enumerate(self.shapes)]


def shared_parameters(blocks) -> int:
    """How many parameter tensors of ``blocks`` share memory with a parameter of another block.

    A stack built by calling a block constructor ``L`` times gives 0; listing the
    same block object twice (weight tying across depth) gives the number of its
    parameter tensors.

    Args:
        blocks: an iterable of ``nn.Module`` (e.g. an ``nn.Sequential`` of blocks).

    Returns:
        The number of parameter tensors, counted over blocks 2, 3, ..., whose storage
        already belongs to an earlier block.

    Raises:
        TypeError: if an element of ``blocks`` is not an ``nn.Module``.
        ValueError: if a parameter is on the ``meta`` device (it has no storage).
    """
    owner: dict[int, int] = {}
    shared = 0
    for k, block in enumerate(blocks):
        check_instance(f"blocks[{k}]", block, nn.Module, "an nn.Module")
        for p in block.parameters():
            if p.is_meta:
                raise ValueError("shared_parameters needs real tensors; meta tensors have no storage")
            if owner.setdefault(p.untyped_storage().data_ptr(), k) != k:
                shared += 1
    return shared


def w_q_gaps(blocks) -> list[float]:
    """Per block ``k``, ``max |W_q^(k) - W_q^(1)|``: how far its query projection is from block 1's.

    ``blocks`` is an iterable of :class:`~d2lmini.block.TransformerBlock` of one width.
    The first entry is 0; an entry above 0 means the same shape with different values.
    """
    w_q = [block.attention.W_q.weight.detach() for block in blocks]  # (d, d) each
    return [float((w - w_q[0]).abs().max()) for w in w_q]  # largest entry-wise difference


def stack_anatomy(depth: int = 4, num_hiddens: int = 64, num_heads: int = 4, num_steps: int = 10,
                  batch_size: int = 2, seed: int = 0, **block_kwargs) -> StackAnatomy:
    """Push a batch through a stack of blocks and take the stack apart.

    Builds :func:`make_stack` ``(depth, num_hiddens, num_heads, seed)``, feeds it a
    standard normal batch ``(batch_size, num_steps, num_hiddens)`` block by block,
    and records every block's input and output shapes, its parameters' names and
    shapes, whether any parameter tensor is shared between blocks (by storage), and
    how far each block's ``W_q`` is from block 1's.

    Args:
        depth: number of blocks (>= 2, so that blocks can be compared).
        num_hiddens, num_heads, num_steps, batch_size: ``d``, heads, ``n``, ``b``.
        seed: seeds weights and input; the global RNG is left untouched.
        **block_kwargs: passed to :class:`~d2lmini.block.TransformerBlock`.

    Returns:
        A :class:`StackAnatomy`.

    Raises:
        ValueError / TypeError: for a bad size or seed (``depth`` < 2 included), or
            any argument :class:`~d2lmini.block.TransformerBlock` rejects.
    """
    depth = check_int_at_least("depth", depth, 2, "to compare blocks")
    num_steps = check_positive_int("num_steps", num_steps)
    batch_size = check_positive_int("batch_size", batch_size)
    stack = make_stack(depth, num_hiddens, num_heads, seed, **block_kwargs)
    with seeded(seed + 1):
        X = torch.randn(batch_size, num_steps, num_hiddens)
    shapes = []
    with torch.no_grad():
        for block in stack:
            Y = block(X)
            shapes.append((tuple(X.shape), tuple(Y.shape)))
            X = Y
    first = {name: tuple(p.shape) for name, p in stack[0].named_parameters()}
    same = all({name: tuple(p.shape) for name, p in block.named_parameters()} == first for block in stack)
    gaps = w_q_gaps(stack)
    config = dict(depth=depth, num_hiddens=num_hiddens, num_heads=num_heads, num_steps=num_steps,
                  batch_size=batch_size, seed=seed, **block_kwargs)
    return StackAnatomy(config=config, shapes=shapes, parameter_shapes=first, same_parameter_shapes=same,
                        num_parameters=[num_parameters(block) for block in stack],
                        shared_tensors=shared_parameters(stack), w_q_gap=gaps)


# --------------------------------------------------------------------------- positions


@dataclass
class PositionMixing:
    """The measurements of :func:`position_mixing`; every entry is a maximum absolute difference.

    Attributes:
        config: the arguments of the run.
        permutation: the permutation of the ``num_steps`` positions that was applied.
        block_permuted: ``max |block(P X) - P block(X)|`` for a block without
            positional information (no RoPE, bidirectional): ~0, it commutes with P.
        ffn_alone: ``max_i max |FFN(x_i) - FFN(X)_i|``: ~0, the FFN sees one token at a time.
        attention_alone: ``max_i max |Attn(x_i) - Attn(X)_i|``: order 1, a token's
            attention output depends on the other tokens.
        attention_alone_relative: ``max_i ||Attn(x_i) - Attn(X)_i|| / ||Attn(X)_i||``
            (Euclidean norms of rows).
        attention_scale: ``max |Attn(X)|``, the size of what is being compared.
        block_permuted_causal: as ``block_permuted``, same weights, causal mask.
        block_permuted_rope: as ``block_permuted``, same weights, with RoPE.
    """

    config: dict
    permutation: list[int]
    _: KW_ONLY
    block_permuted: float
    ffn_alone: float
    attention_alone: float
    attention_alone_relative: float
    attention_scale: float
    block_permuted_causal: float
    block_permuted_rope: float


@shown_in("ch01")
def permutation_gap(block: nn.Module, X: torch.Tensor, perm: torch.Tensor) -> float:
    """``max |block(P X) - P block(X)|``: permute the tokens before or after the block.

    ``X`` is ``(b, n, d)`` and ``perm`` a permutation of the ``n`` positions. About
    1e-7 in float32 when the block does not see the order of its tokens.
    """
    before = block(X[:, perm])  # permute the input tokens, then apply the block
    after = block(X)[:, perm]  # apply the block, then permute its output rows
    return float((before - after).abs().max())


@shown_in("ch01")
def alone_vs_in_sequence(sublayer, X: torch.Tensor) -> tuple[float, float]:
    """How far a sublayer's output for token ``i`` alone is from row ``i`` of its output for all of ``X``.

    ``sublayer`` maps ``(b, n, d)`` to ``(b, n, d)``; ``X`` is ``(b, n, d)``. Returns
    ``(largest absolute difference of one entry, largest |difference| / |row|)``,
    both over all tokens ``i`` (row lengths are Euclidean norms).
    """
    with torch.no_grad():
        full = sublayer(X)
    gap = relative = 0.0
    for i in range(X.shape[1]):
        # token i alone vs. in the sequence
        with torch.no_grad():
            diff = sublayer(X[:, i : i + 1]) - full[:, i : i + 1]
        gap = max(gap, float(diff.abs().max()))
        relative = max(relative, float(diff.norm() / full[:, i].norm()))
    return gap, relative


def position_mixing(num_hiddens: int = 64, num_heads: int = 4, num_steps: int = 12, seed: int = 0,
                    rope_theta: float = 10000.0, **block_kwargs) -> PositionMixing:
    """Show that attention is the only sublayer in which positions interact.

    A block :class:`~d2lmini.block.TransformerBlock` ``(num_hiddens, num_heads)``
    without positional information (no RoPE, not causal) and one standard normal
    sequence ``X`` of ``num_steps`` tokens. Three checks, each a max absolute
    difference (float32, so ~1e-7 means "equal"):

    1. Permutation: ``block(P X)`` against ``P block(X)`` for a random permutation
       ``P`` of the positions (not the identity). Attention without positions is a
       function of the *set* of tokens, so the block commutes with ``P``.
    2. The FFN on one token alone, ``FFN(x_i)``, against row ``i`` of ``FFN(X)``.
    3. Attention on one token alone, ``Attn(x_i)`` (it can attend only to itself),
       against row ``i`` of ``Attn(X)`` (it attends to every token).

    For contrast, the permutation check is repeated with the same weights and a
    causal mask, and with RoPE (Su et al., 2021): both give attention a sense of
    position, so both break the symmetry.

    Args:
        num_hiddens, num_heads, num_steps: ``d``, heads, ``n`` (>= 2).
        seed: seeds weights, input and permutation; the global RNG is left untouched.
        rope_theta: RoPE base of the contrast block.
        **block_kwargs: passed to :class:`~d2lmini.block.TransformerBlock` (e.g.
            ``norm``, ``act``, ``placement``); ``causal`` and ``rope_theta`` are set here.

    Returns:
        A :class:`PositionMixing`.

    Raises:
        ValueError / TypeError: for bad sizes (``num_steps`` < 2 included), a bad
            seed, ``causal``/``rope_theta`` in ``block_kwargs``, or any argument
            :class:`~d2lmini.block.TransformerBlock` rejects.
    """
    num_steps = check_int_at_least("num_steps", num_steps, 2, "to permute positions")
    _check_seed(seed)
    for name in ("causal", "rope_theta"):
        if name in block_kwargs:
            raise ValueError(f"position_mixing sets {name} itself; do not pass it in block_kwargs")
    with seeded(seed):
        block = TransformerBlock(num_hiddens, num_heads, **block_kwargs)
        X = torch.randn(1, num_steps, num_hiddens)
        perm = torch.randperm(num_steps)
    if torch.equal(perm, torch.arange(num_steps)):
        perm = perm.flip(0)
    causal_block = TransformerBlock(num_hiddens, num_heads, causal=True, **block_kwargs)
    rope_block = TransformerBlock(num_hiddens, num_heads, rope_theta=rope_theta, **block_kwargs)
    causal_block.load_state_dict(block.state_dict())
    rope_block.load_state_dict(block.state_dict())
    for b in (block, causal_block, rope_block):
        b.eval()

    def attend(Z):
        return block.attention(Z, Z, Z)

    with torch.no_grad():
        ffn_gap, _ = alone_vs_in_sequence(block.ffn, X)
        attn_gap, attn_rel = alone_vs_in_sequence(attend, X)
        attn_all = attend(X)
        result = PositionMixing(
            config=dict(num_hiddens=num_hiddens, num_heads=num_heads, num_steps=num_steps, seed=seed,
                        rope_theta=rope_theta, **block_kwargs),
            permutation=perm.tolist(), block_permuted=permutation_gap(block, X, perm), ffn_alone=ffn_gap,
            attention_alone=attn_gap, attention_alone_relative=attn_rel,
            attention_scale=float(attn_all.abs().max()),
            block_permuted_causal=permutation_gap(causal_block, X, perm),
            block_permuted_rope=permutation_gap(rope_block, X, perm))
    return result


# --------------------------------------------------------------------------- parameters


def count_parameters(block: nn.Module) -> dict[str, int]:
    """Count a block's parameters per part, from the module itself.

    :func:`d2lmini.parameters.num_parameters` with :data:`~d2lmini.parameters.BLOCK_PARTS`:
    every parameter is assigned by the submodule that holds it: ``attention`` (and a
    decoder block's ``cross_attention``; QK-norm gains included) -> ``'attention'``;
    ``ffn`` -> ``'ffn'``; the residual connections' norms (``addnorm1``, ``addnorm2``,
    ...) -> ``'norms'``. Works on the ``meta`` device (only shapes are read).

    Args:
        block: a :class:`~d2lmini.block.TransformerBlock` (or decoder block).

    Returns:
        ``{'attention': int, 'ffn': int, 'norms': int, 'total': int}``; ``total`` is
        the block's whole parameter count and equals the sum of the three parts.

    Raises:
        TypeError: if ``block`` is not a :class:`~d2lmini.block.TransformerBlock`.
        ValueError: if the block holds a parameter outside those submodules.
    """
    check_instance("block", block, TransformerBlock, "a d2lmini TransformerBlock")
    return num_parameters(block, BLOCK_PARTS)


def parameter_counts(shapes: dict[str, dict] | None = None, device: str | torch.device = "meta") -> list[dict]:
    """Build one block per named shape and count its parameters per part.

    Args:
        shapes: name -> keyword arguments of :class:`~d2lmini.block.TransformerBlock`;
            default :data:`BLOCK_SHAPES` (the 2017 Transformer at d = 512); :data:`LLAMA3_8B_BLOCK`
            is a second shape to try.
        device: where the blocks are built; the default ``'meta'`` allocates no
            memory (a Llama 3 8B block would need 0.9 GB in float32), and counting
            needs only shapes.

    Returns:
        One dict per shape: ``model`` (the name), ``num_hiddens`` (``d``) and
        ``counts`` (:func:`count_parameters` of the block).

    Raises:
        TypeError: if ``shapes`` is not a dict of dicts.
        ValueError / TypeError: for any argument the block rejects.
    """
    shapes = BLOCK_SHAPES if shapes is None else check_instance("shapes", shapes, dict, "a dict of block arguments")
    rows = []
    for name, kwargs in shapes.items():
        check_instance(f"shapes[{name!r}]", kwargs, dict, "a dict of block arguments")
        with torch.device(device):
            block = TransformerBlock(**kwargs)
        rows.append({"model": name, "num_hiddens": block.num_hiddens, "counts": count_parameters(block)})
    return rows


def parameter_table(rows: list[dict], formatted: bool = False):
    """A pandas DataFrame of :func:`parameter_counts` rows: parts, totals, ``/ d^2`` and shares.

    Args:
        rows: the list :func:`parameter_counts` returns.
        formatted: if ``True``, the cells are strings for display: counts with
            thousands separators, ``÷ d²`` to four and shares (in percent) to three
            significant digits.

    Returns:
        ``pandas.DataFrame`` indexed by (model, part) with ``part`` in attention, FFN,
        norms, block, and columns ``parameters``, ``÷ d²`` and ``share of block``.

    Raises:
        TypeError: if ``formatted`` is not a bool.
    """
    check_bool("formatted", formatted)
    import pandas as pd  # the book has pandas; the package itself does not need it

    records = []
    for row in rows:
        counts, d2 = row["counts"], row["num_hiddens"] ** 2
        for part, label in PART_LABELS.items():
            records.append({"model": row["model"], "part": label, "parameters": counts[part],
                            "÷ d²": counts[part] / d2, "share of block": counts[part] / counts["total"]})
    table = pd.DataFrame(records).set_index(["model", "part"])
    if formatted:
        formats = {"parameters": "{:,}".format, "÷ d²": "{:.4g}".format,
                   "share of block": lambda share: f"{100 * share:.3g}%"}
        table = pd.DataFrame({column: table[column].map(fmt) for column, fmt in formats.items()})
    return table


# --------------------------------------------------------------------------- residual stream


@shown_in("ch01")
def add_sublayer(
    addnorm: nn.Module, branch, X: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sublayer's step on the stream, as :meth:`d2lmini.block.AddNorm.forward` takes it.

    ``addnorm`` is the block's :class:`~d2lmini.block.AddNorm` (``addnorm1`` or
    ``addnorm2``), ``branch`` the sublayer (attention or FFN) and ``X`` the stream
    ``(b, n, d)``. Returns ``(X', C)``: the stream after the step and ``C``, what the
    sublayer added to it (both ``(b, n, d)``).
    """
    # pre-LN: norm before F
    C = branch(X if addnorm.norm_in is None else addnorm.norm_in(X))
    if addnorm.norm_out is not None:  # 'post_sublayer', 'sandwich': norm F's output
        C = addnorm.norm_out(C)
    C = addnorm.dropout(C)
    # residual=False: C replaces X
    X = X + C if getattr(addnorm, "residual", True) else C
    if addnorm.norm_post is not None:  # post-LN: norm the stream after the addition
        X = addnorm.norm_post(X)
    return X, C


def record_contributions(blocks, X: torch.Tensor, valid_lens: torch.Tensor | None = None):
    r"""Run ``X`` through ``blocks`` and record what every sublayer adds to the stream.

    Performs the operations of :meth:`d2lmini.block.AddNorm.forward` itself, in its
    order, for each block's attention sublayer and then its FFN sublayer:
    ``Y = F(Norm_in(X))`` (if the placement has ``norm_in``), ``Y = Norm_out(Y)`` (if
    it has ``norm_out``), ``Y = dropout(Y)``; records ``Y``; then ``X = X + Y``
    and ``X = Norm_post(X)`` (if it has ``norm_post``). The recorded ``Y`` is the
    branch output that is added to the stream. For placements that leave the
    identity path untouched (``'pre'``, ``'post_sublayer'``, ``'sandwich'``) the output
    is then exactly ``X_0 + sum(contributions)``; for ``'post'`` it is not.

    Args:
        blocks: an iterable of :class:`~d2lmini.block.TransformerBlock` (e.g. an
            ``nn.Sequential`` from :func:`make_stack`); decoder blocks are not accepted.
        X: the stream entering the first block, ``(b, n, d)``.
        valid_lens: passed to every attention sublayer, as in ``block(X, valid_lens)``.

    Returns:
        ``(Y, contributions)``: the stream after the last block, ``(b, n, d)``, equal
        to ``blocks(X)`` in eval mode; and a list of ``2 L`` tensors ``(b, n, d)``,
        bottom to top (block 1 attention, block 1 FFN, block 2 attention, ...).

    Raises:
        TypeError: if an element of ``blocks`` is not a plain
            :class:`~d2lmini.block.TransformerBlock`, or ``X`` is not a floating tensor.
        ValueError: if ``X`` is not ``(b, n, d)`` with the blocks' ``d``, or a block has a
            parallel placement (:data:`d2lmini.block.PARALLEL_PLACEMENTS`) or scales set by
            :meth:`~d2lmini.block.TransformerBlock.set_scales`.
    """
    blocks = list(blocks)
    for k, block in enumerate(blocks):
        if not isinstance(block, TransformerBlock) or isinstance(block, TransformerDecoderBlock):
            raise TypeError(f"blocks[{k}] must be a d2lmini TransformerBlock (not a decoder block), "
                            f"got {type(block).__name__}")
        if block.placement not in SEQUENTIAL_PLACEMENTS:  # its FFN reads the block's input, not attention's output
            raise ValueError(f"blocks[{k}] has placement={block.placement!r}; record_contributions replays "
                             f"sequential blocks only, placements {SEQUENTIAL_PLACEMENTS}")
        if block.layer_scalar != 1.0 or any(a.residual_multiplier != 1.0 for a in block._addnorms()):
            raise ValueError(f"blocks[{k}] has scales set by set_scales; record_contributions replays "
                             f"blocks without them (residual_multiplier and layer_scalar 1)")
    if blocks:
        check_sequence_tensor("X", X, blocks[0].num_hiddens)
    contributions = []
    for block in blocks:
        def attend(Z, block=block):
            return block.attention(Z, Z, Z, valid_lens)

        for addnorm, branch in ((block.addnorm1, attend), (block.addnorm2, block.ffn)):
            X, C = add_sublayer(addnorm, branch, X)
            contributions.append(C)
    return X, contributions


@dataclass
class ResidualSum:
    """The measurements of one :func:`residual_sum` run.

    Attributes:
        config: the arguments of the run.
        labels: the ``2 L`` sublayer names (:func:`sublayer_labels`).
        input_rms: RMS of the input stream ``X_0``.
        contribution_rms: ``2 L`` floats, the RMS of what each sublayer added.
        stream_rms: ``2 L + 1`` floats, the RMS of the stream after each sublayer
            (entry 0 is ``X_0``).
        output_rms: RMS of the stack's output ``X_{2L}``.
        recorded_vs_block: ``max |X_{2L}(recorded) - stack(X_0)|``: the recording
            reproduces the blocks' own forward pass.
        sum_vs_output: ``max |X_0 + sum(contributions) - X_{2L}|``: ~1e-6 in float32
            when the identity path is untouched; order 1 for post-LN.
    """

    config: dict
    labels: list[str]
    _: KW_ONLY
    input_rms: float
    contribution_rms: list[float]
    stream_rms: list[float]
    output_rms: float
    recorded_vs_block: float
    sum_vs_output: float = field(default=float("nan"))

    @property
    def depth(self) -> int:
        """Number of blocks in the stack."""
        return len(self.contribution_rms) // 2

    def sublayer_rms(self, sublayer: str) -> list[float]:
        """The ``L`` contribution RMS values of ``'attention'`` or ``'ffn'``, bottom to top.

        Raises:
            ValueError: if ``sublayer`` is not one of :data:`SUBLAYERS`.
        """
        check_choice("sublayer", sublayer, SUBLAYERS)
        return self.contribution_rms[SUBLAYERS.index(sublayer)::2]


def residual_sum(placement: str = "pre", depth: int = 6, num_hiddens: int = 64, num_heads: int = 4,
                 num_steps: int = 16, norm: str = "rms", act: str = "swiglu", init: str = "xavier_uniform",
                 seed: int = 0, dtype: torch.dtype = torch.float32) -> ResidualSum:
    r"""Check that a stack's output is its input plus everything its sublayers added.

    Builds ``depth`` fresh blocks (:func:`make_stack`; bidirectional, no dropout,
    no biases), feeds them one standard normal sequence ``X_0`` of ``num_steps``
    tokens, records every sublayer's contribution with :func:`record_contributions`
    and compares

    .. math:: X_{2L} \quad\text{with}\quad X_0 + \sum_{i=1}^{2L} C_i.

    With ``placement='pre'`` (x <- x + F(Norm(x)), GPT-2 onward) the two agree to
    rounding; with ``'post'`` (x <- Norm(x + F(x)), Vaswani et al. 2017) every norm
    rescales the whole running sum and they do not.

    Args:
        placement: one of :data:`d2lmini.block.SEQUENTIAL_PLACEMENTS`.
        depth: number of blocks ``L`` (>= 1).
        num_hiddens, num_heads, num_steps: ``d``, heads, ``n``.
        norm, act: the blocks' norm (``'layer'``/``'rms'``) and FFN activation; the
            defaults are those of a Llama-style block.
        init: ``'xavier_uniform'`` (default, as in the chapter "Where the norm goes")
            or ``'torch_default'``.
        seed: seeds weights and input; the global RNG is left untouched.
        dtype: floating-point type of the computation.

    Returns:
        A :class:`ResidualSum`.

    Raises:
        ValueError / TypeError: for any invalid argument (unknown names are listed
            with the allowed ones).
    """
    check_choice("placement", placement, SEQUENTIAL_PLACEMENTS)
    depth = check_positive_int("depth", depth)
    num_steps = check_positive_int("num_steps", num_steps)
    _check_seed(seed)
    check_float_dtype("dtype", dtype)
    stack = make_stack(depth, num_hiddens, num_heads, seed, init, norm=norm, act=act, placement=placement)
    stack.to(dtype).eval()
    with seeded(seed + 1):
        X0 = torch.randn(1, num_steps, num_hiddens).to(dtype)
    with torch.no_grad():
        Y, contributions = record_contributions(stack, X0)
        reference = stack(X0)
        total = X0 + torch.stack(contributions).sum(dim=0)
        streams = [X0]
        for C in contributions:  # the running sum itself, sublayer by sublayer
            streams.append(streams[-1] + C)
    config = dict(placement=placement, depth=depth, num_hiddens=num_hiddens, num_heads=num_heads,
                  num_steps=num_steps, norm=norm, act=act, init=init, seed=seed,
                  dtype=str(dtype).replace("torch.", ""))
    return ResidualSum(config=config, labels=sublayer_labels(depth), input_rms=stream_rms(X0),
                       contribution_rms=[stream_rms(C) for C in contributions],
                       stream_rms=[stream_rms(S) for S in streams], output_rms=stream_rms(Y),
                       recorded_vs_block=float((Y - reference).abs().max()),
                       sum_vs_output=float((total - Y).abs().max()))


# --------------------------------------------------------------------------- the decoder block


@shown_in("ch01")
def decoder_effects(
    block: TransformerDecoderBlock, X: torch.Tensor, memory: torch.Tensor, t: int
) -> dict:
    """How far a decoder block's outputs move when a decoder token or the encoder output changes.

    Draws a new random decoder token at position ``t`` and, separately, a new random
    encoder output (from the global RNG), and runs the block on the original and on each
    changed input.

    Args:
        block: a :class:`~d2lmini.block.TransformerDecoderBlock` (no dropout in effect).
        X: ``(b, n, d)`` decoder input; memory: ``(b, m, d)`` encoder output; ``0 < t < n``.

    Returns:
        dict with ``output_shape``, ``future_leak`` (largest change at positions ``< t``;
        0 means causal), ``future_effect`` (at positions ``>= t``), ``memory_effect``
        (largest change anywhere) and ``memory_effect_least`` (the smallest, over the
        positions, of a position's largest change: > 0 means every position moved).
    """
    X2 = X.clone()
    X2[:, t] = torch.randn(X.shape[-1])  # a new decoder token at position t
    memory2 = torch.randn(memory.shape)  # a new encoder output
    with torch.no_grad():
        Y, Y_future, Y_memory = block(X, memory), block(X2, memory), block(X, memory2)
    return {
        "output_shape": tuple(Y.shape),
        "future_leak": float((Y_future - Y)[:, :t].abs().max()),
        "future_effect": float((Y_future - Y)[:, t:].abs().max()),
        "memory_effect": float((Y_memory - Y).abs().max()),
        "memory_effect_least": float((Y_memory - Y).abs().amax(dim=(0, 2)).min()),
    }


def decoder_block_checks(num_hiddens: int = 64, num_heads: int = 4, num_steps: int = 10, memory_steps: int = 7,
                         seed: int = 0) -> dict:
    """The encoder-decoder Transformer's decoder block: three sublayers, measured.

    Builds the 2017 decoder block (:class:`~d2lmini.block.TransformerDecoderBlock`:
    LayerNorm, post-LN, ReLU, biases; Vaswani et al., 2017), measures with
    :func:`decoder_effects` how its outputs move when the decoder token at ``t = n // 2``
    or the encoder output changes, and counts each sublayer's parameters.

    Args:
        num_hiddens, num_heads: ``d`` and ``h``.
        num_steps, memory_steps: decoder length ``n`` (at least 2) and encoder length ``m``.
        seed: seeds the weights and inputs; the global RNG is left untouched.

    Returns:
        dict with the keys of :func:`decoder_effects`, ``t`` and ``parameters``
        (``{'self-attention', 'cross-attention', 'FFN', 'norms'}`` -> count).

    Raises:
        ValueError / TypeError: for a bad size or seed, or sizes the block rejects.
    """
    n = check_int_at_least("num_steps", num_steps, 2, "to change one token and watch the earlier ones")
    m = check_positive_int("memory_steps", memory_steps)
    _check_seed(seed)
    with seeded(seed):
        block = TransformerDecoderBlock(num_hiddens, num_heads, norm="layer", act="relu", placement="post",
                                        bias=True).eval()
        X, memory = torch.randn(1, n, num_hiddens), torch.randn(1, m, num_hiddens)
        effects = decoder_effects(block, X, memory, t=n // 2)
    params = num_parameters(block, {"self-attention": "attention.", "cross-attention": "cross_attention.",
                                    "FFN": "ffn.", "norms": "addnorm"})
    params.pop("total")
    return {**effects, "t": n // 2, "parameters": params}


__all__ = [
    "BLOCK_SHAPES", "LLAMA3_8B_BLOCK", "PARTS", "SUBLAYERS", "PositionMixing", "ResidualSum", "StackAnatomy",
    "add_sublayer", "alone_vs_in_sequence", "count_parameters", "decoder_block_checks", "decoder_effects",
    "draw_block", "make_stack", "parameter_counts", "parameter_table", "permutation_gap", "position_mixing",
    "record_contributions", "residual_sum", "shared_parameters", "stack_anatomy", "sublayer_labels", "w_q_gaps",
]
