"""Residual connections: what the identity path ``x + F(x)`` does for a deep stack.

Introduced in the chapter "Residual connections: the gradient highway". Three
experiments, each deterministic for a given seed:

* :func:`depth_gradients` (with :func:`readout_gradients`) -- fresh stacks of blocks
  with and without skip connections, with and without norms: how much gradient
  reaches every block and the input, and how different the tokens stay, as the stack
  gets deeper;
* :func:`zeroed_block_gaps` -- a block whose output projections are zero is exactly
  the identity in pre-LN, and is not in post-LN or without the skip connection;
* :func:`skip_training` -- the same tiny language model trained with and without
  its skip connections.

Shapes use the legend b = batch, n = num_steps, d = num_hiddens.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import KW_ONLY, dataclass, field

import torch
from torch import nn

from .._checks import check_seed as _check_seed
from .._checks import check_seeds as _check_seeds
from .._checks import (check_bool, check_choice, check_int_at_least, check_int_sequence, check_int_tensor, check_pair,
                       check_positive_int, check_sequence, check_sequence_tensor)
from .._shown import shown_in
from ..attention import MultiHeadAttention
from ..block import TransformerBlock
from ..ffn import FeedForward
from ..norms import make_norm
from ..plot import SKIP_COLORS, SKIP_NORM_LABELS, skip_label, styled_figure
from ..probes import INITS, init_linear_weights_, stream_rms, token_spread
from ..seeding import seeded
from ..widgets import FrameExplorer, round_frame_values

#: Where a stack built by :func:`make_skip_stack` puts its norms:
#:
#: * ``'none'``: no norm anywhere (:class:`PlainBlock`), like the plain and residual
#:   networks of He et al. (2016) without their batch norm;
#: * ``'pre'``: ``x <- x + F(Norm(x))`` per sublayer, one final norm (GPT-2 onward);
#: * ``'post'``: ``x <- Norm(x + F(x))`` per sublayer (Vaswani et al., 2017).
#:
#: With ``residual=False`` the ``x +`` is dropped: ``x <- F(x)``, ``x <- F(Norm(x))``,
#: ``x <- Norm(F(x))``.
SKIP_PLACEMENTS = tuple(SKIP_NORM_LABELS)

#: The four stacks of the chapter's experiments, as ``(placement, residual)`` pairs.
SKIP_CONFIGS = (("none", False), ("none", True), ("pre", False), ("pre", True))

class PlainBlock(nn.Module):
    r"""A Transformer block without norms: attention, then the FFN, on one stream.

    With ``residual=True`` each sublayer's output is added to the stream,
    ``x <- x + F(x)``; with ``residual=False`` it replaces the stream,
    ``x <- F(x)``. These are the "residual" and "plain" networks of He et al.
    (2016), built from Transformer sublayers and without normalization. The
    sublayers are a :class:`~d2lmini.attention.MultiHeadAttention` and a
    :class:`~d2lmini.ffn.FeedForward`, without biases.

    Args:
        num_hiddens: width ``d``; num_heads: attention heads (must divide ``d``).
        act: FFN activation (see :data:`d2lmini.ffn.ACTS`).
        residual: whether the skip connections are there.
        causal: whether the attention is causal.

    Attributes:
        attention, ffn: the two sublayers.

    Shape:
        ``forward(X)``: ``X`` ``(b, n, d)``; returns ``(b, n, d)``.

    Raises:
        ValueError / TypeError: for arguments the sublayers reject, a non-bool
            ``residual``/``causal``; at call time an input that is not ``(b, n, d)``.
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, act: str = "relu", residual: bool = True,
                 causal: bool = False):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.residual = check_bool("residual", residual)
        self.attention = MultiHeadAttention(num_hiddens, num_heads, causal=check_bool("causal", causal))
        self.ffn = FeedForward(num_hiddens, act=act)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Apply attention, then the FFN, to ``X`` (b, n, d); returns (b, n, d)."""
        check_sequence_tensor("X", X, self.num_hiddens)
        Y = self.attention(X, X, X)
        X = X + Y if self.residual else Y
        Y = self.ffn(X)
        return X + Y if self.residual else Y

    def extra_repr(self) -> str:
        return f"residual={self.residual}"


def make_skip_stack(depth: int, placement: str = "pre", residual: bool = True, num_hiddens: int = 64,
                    num_heads: int = 4, act: str = "relu", norm: str = "layer", init: str = "torch_default",
                    seed: int = 0) -> nn.ModuleList:
    """A stack of ``depth`` fresh blocks, with or without skip connections.

    ``placement='none'`` builds :class:`PlainBlock` s; ``'pre'`` and ``'post'`` build
    :class:`~d2lmini.block.TransformerBlock` s with that placement, ``norm``,
    ``act``, no biases and ``residual`` (see :data:`SKIP_PLACEMENTS`). Block ``k``'s
    weights are drawn after block ``k - 1``'s, so a stack is the first ``depth``
    blocks of any deeper stack with the same seed.

    Args:
        depth: number of blocks ``L`` (>= 1).
        placement: one of :data:`SKIP_PLACEMENTS`.
        residual: whether the blocks add their sublayers' outputs to the stream.
        num_hiddens, num_heads, act: width ``d``, heads, FFN activation.
        norm: ``'layer'`` or ``'rms'`` (ignored for ``placement='none'``).
        init: ``'torch_default'`` (PyTorch's ``nn.Linear`` initialization) or
            ``'xavier_uniform'`` (see :func:`d2lmini.probes.init_linear_weights_`).
        seed: seeds the weights; the global RNG is left untouched.

    Returns:
        ``nn.ModuleList`` of ``depth`` blocks, each mapping ``(b, n, d)`` to ``(b, n, d)``.

    Raises:
        ValueError / TypeError: for an unknown ``placement``/``init``, a bad
            ``depth``/``seed``, or arguments the blocks reject.
    """
    depth = check_positive_int("depth", depth)
    check_choice("placement", placement, SKIP_PLACEMENTS)
    check_bool("residual", residual)
    check_choice("init", init, INITS)
    _check_seed(seed)

    def block():
        if placement == "none":
            return PlainBlock(num_hiddens, num_heads, act=act, residual=residual)
        return TransformerBlock(num_hiddens, num_heads, norm=norm, act=act, placement=placement,
                                residual=residual)

    with seeded(seed):
        return nn.ModuleList(init_linear_weights_(block(), init) for _ in range(depth))


def _weight_matrices(block: nn.Module) -> list[nn.Parameter]:
    """The block's weight matrices (``W_q, W_k, W_v, W_o, W_1, W_2``, ...; not the norms' gains)."""
    return [p for name, p in block.named_parameters() if p.dim() == 2 and name.endswith("weight")]


# --------------------------------------------------------------------------- depth sweep


@dataclass
class SkipProbe:
    """The measurements of one stack in :func:`depth_gradients`.

    Attributes:
        placement, residual: which stack (see :data:`SKIP_PLACEMENTS`).
        stream_rms: ``max(depths) + 1`` floats; entry ``k`` is the RMS of the stream
            after block ``k`` (entry 0: the input ``X_0``).
        token_spread: ``max(depths) + 1`` floats, :func:`d2lmini.probes.token_spread`
            of the stream after block ``k``.
        block_grad: depth ``L`` -> ``L`` floats; entry ``k - 1`` is the Frobenius norm
            of the gradient of the depth-``L`` loss with respect to all weight matrices
            of block ``k`` together.
        input_grad: depth ``L`` -> the Frobenius norm of the gradient of the
            depth-``L`` loss with respect to the input ``X_0``.
    """

    placement: str
    residual: bool
    _: KW_ONLY
    stream_rms: list[float]
    token_spread: list[float]
    block_grad: dict[int, list[float]] = field(default_factory=dict)
    input_grad: dict[int, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Legend label, e.g. ``'pre-LN, with skips'``."""
        return skip_label(self.placement, self.residual)

    @property
    def depths(self) -> list[int]:
        """The depths ``L`` at which gradients were taken."""
        return sorted(self.block_grad)

    def first_block_grad(self, depth: int) -> float:
        """Gradient norm of block 1's weights in the depth-``depth`` stack.

        Raises:
            ValueError: if ``depth`` was not measured.
        """
        if depth not in self.block_grad:
            raise ValueError(f"depth must be one of the measured depths {self.depths}, got {depth!r}")
        return self.block_grad[depth][0]


@dataclass
class DepthGradients:
    """The result of :func:`depth_gradients`: one :class:`SkipProbe` per stack.

    Attributes:
        config: the arguments of the run.
        probes: one :class:`SkipProbe` per ``(placement, residual)`` pair, in the order asked.
    """

    config: dict
    probes: list[SkipProbe]

    def get(self, placement: str, residual: bool) -> SkipProbe:
        """The probe of the stack ``(placement, residual)``.

        Raises:
            ValueError: if that stack was not measured.
        """
        for probe in self.probes:
            if probe.placement == placement and probe.residual == residual:
                return probe
        measured = [(p.placement, p.residual) for p in self.probes]
        raise ValueError(f"(placement, residual) must be one of {measured}, got {(placement, residual)!r}")

    def rows(self, depths=None) -> list[dict]:
        """One dict per stack and depth (for a table): the gradient norms reaching block 1,
        block ``L`` and ``X_0``, and the token spread of the output ``X_L``.

        Args:
            depths: the depths to report (default: all measured).

        Raises:
            ValueError: if a depth was not measured.
        """
        measured = self.config["depths"]
        depths = measured if depths is None else list(depths)
        for L in depths:
            if L not in measured:
                raise ValueError(f"depths must be among the measured depths {measured}, got {L!r}")
        return [{"stack": probe.label, "L": L, "‖∇θ_1‖": probe.first_block_grad(L),
                 "‖∇θ_L‖": probe.block_grad[L][-1], "‖∇X_0‖": probe.input_grad[L],
                 "token spread": probe.token_spread[L]}
                for probe in self.probes for L in depths]

    def summary(self, depths=None, blocks=None) -> list[dict]:
        """One dict per stack (for a table): ``stack``, the gradient norm reaching block 1
        at each of ``depths`` (keys ``'‖∇θ_1‖, L = 8'``, ...), then the stream's RMS and
        the token spread after each block of ``blocks`` (keys ``'stream RMS after block 64'``,
        ``'token spread after block 64'``) in the deepest stack.

        Args:
            depths: the depths to report (default: all measured).
            blocks: the blocks ``k`` after which the stream is reported (default: the last,
                ``max(depths)``; ``0`` is the input).

        Raises:
            TypeError: if ``depths`` or ``blocks`` is not a sequence of ints.
            ValueError: if a depth was not measured or a block is outside ``0..max(depths)``.
        """
        measured = self.config["depths"]
        depths = measured if depths is None else check_int_sequence("depths", depths)
        top = measured[-1]
        blocks = [top] if blocks is None else check_int_sequence("blocks", blocks, minimum=0)
        for k in blocks:
            if not 0 <= k <= top:
                raise ValueError(f"blocks must lie in 0..{top}, got {k!r}")
        rows = []
        for probe in self.probes:
            row = {"stack": probe.label, **{f"‖∇θ_1‖, L = {L}": probe.first_block_grad(L) for L in depths}}
            for k in blocks:
                row[f"stream RMS after block {k}"] = probe.stream_rms[k]
                row[f"token spread after block {k}"] = probe.token_spread[k]
            rows.append(row)
        return rows


@shown_in("ch02")
def readout_gradients(
    Y: torch.Tensor,
    R: torch.Tensor,
    X0: torch.Tensor,
    weights: list[list[torch.Tensor]],
    retain_graph: bool = False,
) -> tuple[float, list[float]]:
    r"""Backpropagate the read-out :math:`\ell = \sum_{ij} Y_{ij} R_{ij} / \sqrt{nd}` and measure its gradients.

    ``Y`` is the stack's output and ``R`` the fixed read-out, both ``(1, n, d)``;
    ``X0`` the input (it requires grad); ``weights[k]`` the weight matrices of block
    ``k + 1``. Returns ``(||grad of X0||, [||grad of block k's weights|| for every k])``,
    Frobenius norms, each block's matrices taken together.
    """
    loss = (Y * R).sum() / math.sqrt(Y.numel())
    grads = torch.autograd.grad(
        loss, [X0] + [w for ws in weights for w in ws], retain_graph=retain_graph
    )
    per_block, i = [], 1
    # block k's share of the gradient: sqrt of its squared entries' sum
    for ws in weights:
        per_block.append(
            math.sqrt(sum(float(g.pow(2).sum()) for g in grads[i : i + len(ws)]))
        )
        i += len(ws)
    return float(grads[0].norm()), per_block


def depth_gradients(depths=(8, 16, 32, 64), configs=SKIP_CONFIGS, num_hiddens: int = 64, num_heads: int = 4,
                    num_steps: int = 32, act: str = "relu", norm: str = "layer", init: str = "torch_default",
                    seed: int = 0, dtype: torch.dtype = torch.float64) -> DepthGradients:
    r"""Gradient reaching each block and the input of fresh stacks, with and without skips.

    For every ``(placement, residual)`` in ``configs`` this builds one stack of
    ``max(depths)`` blocks (:func:`make_skip_stack` with seed ``seed + 1``, the same
    for every stack) and pushes one sequence ``X_0`` of ``num_steps`` standard normal
    tokens (drawn from ``seed``, then the read-out ``R``) through it, recording the stream's RMS and token spread after every block.
    The stack of depth ``L`` is its first ``L`` blocks. For each ``L`` in ``depths``
    it backpropagates the scalar loss

    .. math:: \ell_L = \frac{1}{\sqrt{n d}} \sum_{i,j} (Y_L)_{ij} R_{ij},

    a fixed random linear read-out (``R`` standard normal, the same for every ``L``)
    of ``Y_L``: the stream ``X_L`` itself for ``'none'`` and ``'post'``, and
    ``Norm(X_L)`` with one final norm for ``'pre'``. It records the gradient norm
    of every block's weight matrices and of ``X_0``.

    He et al. (2016) compared plain and residual networks by their training error (Fig. 1
    and 4); this compares a Transformer stack's gradients at initialization, with and
    without skips. Runs in float64 by default,
    so that gradients far below float32's range are still measured.

    Args:
        depths: strictly increasing depths ``L`` at which gradients are taken.
        configs: ``(placement, residual)`` pairs; placements from :data:`SKIP_PLACEMENTS`.
        num_hiddens, num_heads, num_steps: width ``d``, heads, sequence length ``n`` (>= 2).
        act, norm, init: passed to :func:`make_skip_stack`.
        seed: seeds the input, the read-out and the weights; the global RNG is left untouched.
        dtype: floating-point type of the computation.

    Returns:
        A :class:`DepthGradients`.

    Raises:
        ValueError / TypeError: for bad depths, configs, sizes or seed (named in the message).
    """
    depths = check_int_sequence("depths", depths, increasing=True)
    configs = check_sequence("configs", configs, check_pair, "(placement, residual) pairs")
    for placement, residual in configs:
        skip_label(placement, residual)  # checks both
    num_steps = check_int_at_least("num_steps", num_steps, 2, "token spread compares tokens")
    _check_seed(seed)
    with seeded(seed):
        X0 = torch.randn(1, num_steps, num_hiddens, dtype=dtype)
        R = torch.randn(1, num_steps, num_hiddens, dtype=dtype)
    probes = []
    for placement, residual in configs:
        blocks = make_skip_stack(depths[-1], placement, residual, num_hiddens, num_heads, act, norm, init,
                                 seed + 1).to(dtype)
        final_norm = make_norm(norm, num_hiddens).to(dtype) if placement == "pre" else None
        X = X0.clone().requires_grad_(True)
        streams, rms, spread = [X], [stream_rms(X0)], [token_spread(X0)]
        for block in blocks:
            streams.append(block(streams[-1]))
            rms.append(stream_rms(streams[-1].detach()))
            spread.append(token_spread(streams[-1].detach()))
        probe = SkipProbe(placement, residual, stream_rms=rms, token_spread=spread)
        for L in depths:
            Y = streams[L] if final_norm is None else final_norm(streams[L])
            probe.input_grad[L], probe.block_grad[L] = readout_gradients(
                Y, R, X, [_weight_matrices(block) for block in blocks[:L]], retain_graph=L < depths[-1])
        probes.append(probe)
    config = dict(depths=depths, configs=configs, num_hiddens=num_hiddens, num_heads=num_heads,
                  num_steps=num_steps, act=act, norm=norm, init=init, seed=seed,
                  dtype=str(dtype).replace("torch.", ""))
    return DepthGradients(config, probes)


def plot_depth_gradients(result: DepthGradients, width: float = 10.0, height: float = 3.4):
    """Three panels on log scales: the gradient reaching block 1 versus depth ``L`` for the
    stacks without norms, the same for the stacks with norms (each panel with its own
    y-range, so that the curves with skips do not merge), and the token spread after every
    block of the deepest stacks, with an inset that shows the stacks with skips on a
    linear scale. Stacks without skips are dashed.

    Args:
        result: a :class:`DepthGradients`.
        width, height: figure size in inches.

    Returns:
        A pyplot-free ``matplotlib.figure.Figure`` (:func:`d2lmini.plot.new_figure`).
    """
    depths = result.config["depths"]
    placements = list(dict.fromkeys(probe.placement for probe in result.probes))[:2]
    with styled_figure(3, width=width, height=height) as (fig, axes):
        for probe in result.probes:
            # Stacks without skips are dashed and drawn on top, so that a dashed line
            # that lies on a solid one stays visible.
            style = dict(color=SKIP_COLORS[probe.placement], linestyle="-" if probe.residual else "--",
                         zorder=2 if probe.residual else 3)
            if probe.placement in placements:
                axes[placements.index(probe.placement)].semilogy(
                    depths, [probe.first_block_grad(L) for L in depths], marker="o", markersize=4,
                    label=probe.label, **style)
            axes[2].semilogy(range(depths[-1] + 1), probe.token_spread, label=probe.label, **style)
        for ax, placement in zip(axes[:2], placements):
            ax.set_xscale("log", base=2)
            ax.set_xticks(depths, [str(L) for L in depths])
            ax.minorticks_off()
            ax.set(xlabel="depth L (blocks)", ylabel=r"$\|\nabla_{\theta_1} \ell\|$",
                   title=f"Gradient at block 1, {SKIP_NORM_LABELS[placement]}")
            low, high = ax.get_ylim()
            if high < 1000 * low:  # a narrow log range: label it 1, 2, 5, 10, 20, 50, ...
                ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
                         for m in (1, 2, 5) if low <= m * 10.0 ** e <= high]
                ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
                ax.set_ylim(low, high)
        axes[2].set(xlabel="block k", ylabel=r"$\|X-\bar{X}\|_F \,/\, \|X\|_F$",
                    title=f"Token spread, L = {depths[-1]}")
        axes[2].set_xlim(0, depths[-1])
        # On the log scale the stacks with skips run along the top edge: an inset
        # shows them on a linear scale, in the empty middle of the panel.
        inset = axes[2].inset_axes([0.35, 0.3, 0.6, 0.4])
        for probe in result.probes:
            if probe.residual:
                inset.plot(range(depths[-1] + 1), probe.token_spread, color=SKIP_COLORS[probe.placement])
        inset.set(xlim=(0, depths[-1]), ylim=(0, 1), title="with skips, linear scale")
        inset.title.set_fontsize(8)
        inset.tick_params(labelsize=7)
        fig.legend(*axes[2].get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=9)
    return fig


# --------------------------------------------------------------------------- identity


@shown_in("ch02")
def zero_output_projections_(block: nn.Module) -> nn.Module:
    """Set the attention's ``W_o`` and the FFN's ``W_2`` (weights and biases) to zero, in place.

    Both sublayers then output exactly zero, ``F = 0``, whatever their input.

    Args:
        block: a :class:`~d2lmini.block.TransformerBlock` or :class:`PlainBlock`.

    Returns:
        ``block``, for chaining.

    Raises:
        TypeError: if ``block`` has no ``attention.W_o`` and ``ffn.W_2``.
    """
    try:
        layers = (block.attention.W_o, block.ffn.W_2)
    except AttributeError:
        raise TypeError(
            f"block must have attention.W_o and ffn.W_2, got {type(block).__name__}"
        ) from None
    with torch.no_grad():
        for layer in layers:
            layer.weight.zero_()
            if layer.bias is not None:
                layer.bias.zero_()
    return block


#: The blocks :func:`zeroed_block_gaps` checks: name -> ``TransformerBlock`` arguments.
ZEROED_BLOCKS = {
    "pre-LN": dict(placement="pre", residual=True),
    "post-LN": dict(placement="post", residual=True),
    "pre-LN, no skips": dict(placement="pre", residual=False),
}


def zeroed_block_gaps(num_hiddens: int = 64, num_heads: int = 4, num_steps: int = 16, depth: int = 4,
                      norm: str = "layer", act: str = "relu", seed: int = 0) -> list[dict]:
    """Does a block with ``F = 0`` return its input? And does an added zero block change a stack?

    For each block of :data:`ZEROED_BLOCKS`: a fresh block (with biases, so its
    norms' and projections' biases exist too) has its output projections zeroed
    (:func:`zero_output_projections_`) and is applied to an input ``X`` whose
    entries are ``N(0.5, 2^2)`` (a stream that is not normalized, as in a deep pre-LN
    stack). Then a stack of ``depth`` fresh blocks of the same kind is applied to
    ``X`` with and without ``depth`` zeroed blocks appended.

    Args:
        num_hiddens, num_heads, num_steps: ``d``, heads, ``n``.
        depth: blocks in the stack of the second check.
        norm, act: the blocks' norm and FFN activation.
        seed: seeds weights and input; the global RNG is left untouched.

    Returns:
        One dict per block kind: ``block``, ``max |X|``, ``block gap`` (``max |block(X) - X|``)
        and ``stack gap`` (``max |deeper(X) - stack(X)|``, the deeper stack having the
        zeroed blocks on top). Pre-LN gives exactly 0.0 for both.

    Raises:
        ValueError / TypeError: for bad sizes or seed.
    """
    depth = check_positive_int("depth", depth)
    _check_seed(seed)
    rows = []
    with seeded(seed):
        X = 0.5 + 2.0 * torch.randn(1, check_positive_int("num_steps", num_steps), num_hiddens)
        for name, kwargs in ZEROED_BLOCKS.items():
            def make():
                return TransformerBlock(num_hiddens, num_heads, norm=norm, act=act, bias=True, **kwargs)

            zeroed = zero_output_projections_(make())
            stack = nn.Sequential(*(make() for _ in range(depth)))
            deeper = nn.Sequential(*stack, *(zero_output_projections_(make()) for _ in range(depth)))
            with torch.no_grad():
                rows.append({"block": name, "max |X|": float(X.abs().max()),
                             "block gap": float((zeroed(X) - X).abs().max()),
                             "stack gap": float((deeper(X) - stack(X)).abs().max())})
    return rows


# --------------------------------------------------------------------------- training


def unigram_entropy(tokens: torch.Tensor) -> float:
    """Entropy of the token frequencies of ``tokens`` in nats: ``-sum_c p_c log p_c``.

    The cross-entropy of the best prediction that ignores the context (the same
    distribution at every position), measured on the same text.

    Args:
        tokens: 1-D integer tensor of token ids.

    Raises:
        TypeError / ValueError: if ``tokens`` is not a non-empty 1-D integer tensor.
    """
    check_int_tensor("tokens", tokens)
    if tokens.dim() != 1 or tokens.numel() == 0:
        raise ValueError(f"tokens must be a non-empty 1-D tensor, got shape {tuple(tokens.shape)}")
    counts = Counter(tokens.tolist())
    total = tokens.numel()
    return -sum(c / total * math.log(c / total) for c in counts.values())


@dataclass
class SkipTraining:
    """The result of :func:`skip_training`.

    Attributes:
        runs: ``residual`` (True/False) -> one :class:`~d2lmini.train.TrainResult` per seed.
        seeds: the seeds, the same for both stacks.
        unigram_entropy: :func:`unigram_entropy` of the training split (nats per character).
        init_token_spread: ``residual`` (True/False) -> ``num_layers + 1`` floats: the
            token spread (:func:`d2lmini.probes.token_spread`, averaged over validation
            windows) of the model's stream after the embedding and after every block,
            with the initial weights of the first seed.
        config: the arguments shared by every run.
        final_train_text_loss: ``residual`` (True/False) -> one float per seed: the trained
            model's mean cross-entropy on fixed windows of the *training* text, scored like
            the validation loss (after the last step, ``eval_batches`` batches): set beside
            the validation loss it separates the difference of the two texts from the lag of
            the moving-average training loss.
    """

    runs: dict[bool, list]
    seeds: list[int]
    unigram_entropy: float
    init_token_spread: dict[bool, list[float]]
    config: dict
    final_train_text_loss: dict[bool, list[float]] = field(default_factory=dict)

    @property
    def with_skips(self):
        """The first seed's :class:`~d2lmini.train.TrainResult` with skip connections."""
        return self.runs[True][0]

    @property
    def without_skips(self):
        """The first seed's :class:`~d2lmini.train.TrainResult` without skip connections."""
        return self.runs[False][0]

    def final_val(self, residual: bool) -> list[float]:
        """One final validation loss per seed of the stack with (True) or without (False) skips."""
        return [run.val_loss[-1] for run in self.runs[check_bool("residual", residual)]]

    def effect(self) -> float:
        """Mean final validation loss without skips minus with skips (nats per character)."""
        return _mean(self.final_val(False)) - _mean(self.final_val(True))

    def spread(self) -> float:
        """The seed spread: the larger of the two stacks' ranges (max - min over the seeds) of
        the final validation loss (0 for one seed)."""
        return max(max(values) - min(values) for values in (self.final_val(True), self.final_val(False)))

    def rows(self, window: int = 20) -> list[dict]:
        """One dict per stack (for a table), means over the seeds: ``stack``, the training loss
        averaged over the last ``window`` steps, the trained models' losses on fixed windows
        of the training text and of the validation text (nats per character), the range of
        the validation loss over the seeds, and the token spread after the last block at
        initialization.

        Raises:
            ValueError / TypeError: if ``window`` is not a positive int.
        """
        check_positive_int("window", window)
        placement = self.config["placement"]
        return [{"stack": skip_label(placement, residual) if placement in SKIP_COLORS else f"skips: {residual}",
                 f"training loss (running, last {window} steps)": _mean([run.smoothed(window)[-1] for run in runs]),
                 "final model scored on training text": _mean(self.final_train_text_loss[residual]),
                 "final model scored on validation text": _mean(self.final_val(residual)),
                 "validation, range over seeds": max(self.final_val(residual)) - min(self.final_val(residual)),
                 "token spread at init (last block, first seed)": self.init_token_spread[residual][-1]}
                for residual, runs in ((True, self.runs[True]), (False, self.runs[False]))]


def _mean(values) -> float:
    return sum(values) / len(values)


def _init_token_spread(corpus, seed: int, num_windows: int, seq_len: int, **model_kwargs) -> list[float]:
    """Token spread after the embedding and after every block of the TinyLM that
    :func:`d2lmini.train.train_lm` builds from ``seed``, on ``num_windows`` validation windows."""
    from ..train import seeded_tiny_lm

    model = seeded_tiny_lm(corpus.vocab_size, seed, max_len=seq_len, **model_kwargs)
    X, _ = corpus.random_batch(num_windows, seq_len, torch.Generator().manual_seed(seed), split="val")
    model.eval()
    with torch.no_grad():
        H = model.embedding(X)
        if model.pos_embedding is not None:
            H = H + model.pos_embedding[:seq_len]
        spreads = [[token_spread(h) for h in H]]
        for block in model.blocks:
            H = block(H)
            spreads.append([token_spread(h) for h in H])
    return [sum(values) / len(values) for values in spreads]


def train_skip_group(corpus, residual: bool, seeds, model: dict, training: dict, eval_every: int,
                     eval_batches: int) -> tuple[list, list[float]]:
    """Train one TinyLM per seed of one stack (with or without skips) in lockstep.

    Model ``i`` is what :func:`d2lmini.train.train_lm` trains with ``seed=seeds[i]``,
    ``residual`` and the same settings (weights and batches from that seed), scored every
    ``eval_every`` steps and after the last by :func:`d2lmini.train.evaluate`. A module-level
    function, so that :func:`d2lmini.train.run_in_workers` can run the two stacks in two workers.

    Args:
        corpus: a :class:`~d2lmini.data.CharCorpus`.
        residual: whether the blocks have their skip connections.
        seeds: one int per model.
        model: :class:`~d2lmini.train.TinyLM` settings (``num_layers``, ``num_hiddens``, ...).
        training: :func:`~d2lmini.train.train_models` settings (``num_steps``, ``batch_size``,
            ``seq_len``, ``lr``, ``warmup_steps``, ``schedule``, ``betas``, ``weight_decay``, ``clip_norm``).
        eval_every, eval_batches: validation interval (steps) and batches.

    Returns:
        ``(results, train_text_losses)``: one :class:`~d2lmini.train.TrainResult` per seed,
        and each trained model's loss on fixed windows of the training text.

    Raises:
        ValueError / TypeError: for arguments the model or :func:`~d2lmini.train.train_models` rejects.
    """
    import time

    from ..train import TrainResult, evaluate, seeded_tiny_lm, train_models

    seeds = _check_seeds(seeds)
    num_steps, batch_size, seq_len = training["num_steps"], training["batch_size"], training["seq_len"]
    start = time.perf_counter()
    models = [seeded_tiny_lm(corpus.vocab_size, seed, max_len=seq_len, residual=residual, **model)
              for seed in seeds]
    results = [TrainResult(dict(training, seed=seed, residual=residual, **model)) for seed in seeds]

    def validate(step, models, losses):
        if (step + 1) % eval_every == 0 or step + 1 == num_steps:
            for lm, result, loss in zip(models, results, losses):
                if math.isfinite(loss):
                    result.val_steps.append(step + 1)
                    result.val_loss.append(evaluate(lm, corpus, batch_size, seq_len, eval_batches))

    log = train_models(models, corpus, seeds, on_step=validate, **training)
    for result, losses in zip(results, log.losses):
        result.train_loss, result.lr, result.diverged = losses, log.lr, not all(map(math.isfinite, losses))
        result.seconds = time.perf_counter() - start
    train_text = [_training_text_loss(lm, corpus, batch_size, seq_len, eval_batches) for lm in models]
    return results, train_text


def skip_training(corpus=None, num_layers: int = 4, num_steps: int = 200, batch_size: int = 32,
                  seq_len: int = 64, lr: float = 5e-3, num_hiddens: int = 64, num_heads: int = 4,
                  norm: str = "layer", act: str = "relu", placement: str = "pre", seeds=(0, 1),
                  warmup_steps: int = 50, schedule: str = "cosine", betas=(0.9, 0.95), weight_decay: float = 0.0,
                  clip_norm: float | None = 1.0,
                  eval_every: int | None = None, eval_batches: int = 4, num_workers: int = 2) -> SkipTraining:
    """Train the same character language model with and without its skip connections, over seeds.

    For every seed, two runs with identical settings, initial weights and batches; the only
    difference is ``residual=True`` versus ``residual=False`` in every block (the "forgot
    the skip connections" bug). The seeds of one stack train together in one lockstep
    (:func:`train_skip_group`); the two stacks go to two worker processes
    (:func:`d2lmini.train.run_in_workers`; the numbers do not depend on ``num_workers``).
    The defaults are the book's recipe (:data:`d2lmini.train.RECIPE` and
    :data:`d2lmini.train.RECIPE_MODEL`). It also measures, before training, how different
    the tokens of a few validation windows stay through each model's blocks.

    Args:
        corpus: a :class:`~d2lmini.data.CharCorpus` (default
            :func:`d2lmini.data.python_reference_corpus`).
        num_layers, num_hiddens, num_heads, norm, act, placement: the model
            (:class:`~d2lmini.train.TinyLM`, causal blocks).
        num_steps, batch_size, seq_len, lr, warmup_steps, schedule, betas, weight_decay, clip_norm:
            the training run (AdamW; see :func:`~d2lmini.train.train_models`), so that
            ``**d2lmini.train.RECIPE`` can be passed.
        seeds: distinct ints >= 0; each seeds the weights and batches of both stacks.
        eval_every: validation interval in steps (default ``num_steps // 4``);
            eval_batches: validation batches.
        num_workers: worker processes (1: both stacks here, one after the other).

    Returns:
        A :class:`SkipTraining`.

    Raises:
        ValueError / TypeError: for bad ``seeds`` and arguments :func:`~d2lmini.train.train_models` rejects.
    """
    from ..data import python_reference_corpus
    from ..train import run_in_workers

    corpus = python_reference_corpus() if corpus is None else corpus
    num_steps = check_positive_int("num_steps", num_steps)
    seq_len = check_positive_int("seq_len", seq_len)
    seeds = _check_seeds(seeds)
    eval_every = max(1, num_steps // 4) if eval_every is None else check_positive_int("eval_every", eval_every)
    model = dict(num_layers=num_layers, num_hiddens=num_hiddens, num_heads=num_heads, norm=norm, act=act,
                 placement=placement)
    training = dict(num_steps=num_steps, batch_size=batch_size, seq_len=seq_len, lr=lr, warmup_steps=warmup_steps,
                    schedule=schedule, betas=tuple(betas), weight_decay=weight_decay, clip_norm=clip_norm)
    config = dict(seeds=seeds, eval_every=eval_every, eval_batches=eval_batches, **training, **model)
    jobs = [dict(corpus=corpus, residual=residual, seeds=seeds, model=model, training=training,
                 eval_every=eval_every, eval_batches=eval_batches) for residual in (True, False)]
    groups = run_in_workers(train_skip_group, jobs, num_workers=num_workers)
    runs = {residual: group[0] for residual, group in zip((True, False), groups)}
    train_text = {residual: group[1] for residual, group in zip((True, False), groups)}
    spreads = {residual: _init_token_spread(corpus, seeds[0], 8, seq_len, residual=residual, **model)
               for residual in (True, False)}
    return SkipTraining(runs, seeds, unigram_entropy(corpus.train), spreads, config, train_text)


@torch.no_grad()
def _training_text_loss(model, corpus, batch_size: int, seq_len: int, num_batches: int,
                        seed: int = 1234) -> float:
    """Mean cross-entropy of ``model`` on ``num_batches`` fixed random windows of the training
    split, in evaluation mode: :func:`d2lmini.train.evaluate`, on the training text."""
    from torch.nn import functional as F

    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(num_batches):
        X, Y = corpus.random_batch(batch_size, seq_len, gen, split="train")
        total += float(F.cross_entropy(model(X).flatten(0, 1), Y.flatten()))
    model.train(was_training)
    return total / num_batches


def plot_skip_training(result: SkipTraining, window: int = 20, width: float = 8.0, height: float = 3.0):
    """Training loss (smoothed over ``window`` steps) of both runs, their validation losses
    as markers, and the unigram entropy as a dotted line.

    Args:
        result: a :class:`SkipTraining`.
        window: smoothing window in steps.
        width, height: figure size in inches.

    Returns:
        A pyplot-free ``matplotlib.figure.Figure``.
    """
    color = SKIP_COLORS[result.config["placement"]] if result.config["placement"] in SKIP_COLORS else None
    with styled_figure(1, width=width, height=height) as (fig, ax):
        for run, residual in ((result.with_skips, True), (result.without_skips, False)):
            label = skip_label(result.config["placement"], residual) if color else f"skips: {residual}"
            style = dict(color=color, linestyle="-" if residual else "--")
            ax.plot(range(1, len(run.train_loss) + 1), run.smoothed(window), label=f"{label} (train)", **style)
            ax.plot(run.val_steps, run.val_loss, marker="o", linestyle="none", color=color,
                    markerfacecolor="white" if not residual else color, label=f"{label} (validation)")
        ax.axhline(result.unigram_entropy, color="0.3", linestyle=":", linewidth=1.2,
                   label="unigram entropy (no context)")
        ax.set(xlabel="training step", ylabel="cross-entropy (nats / char)",
               title=f"{result.config['num_layers']}-block character LM, same seed and data")
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize=9)
    return fig


__all__ = [
    "SKIP_CONFIGS", "SKIP_PLACEMENTS", "DepthGradients", "PlainBlock", "SkipProbe", "SkipTraining",
    "depth_gradients", "make_skip_stack", "plot_depth_gradients", "plot_skip_training", "readout_gradients",
    "skip_training", "train_skip_group", "unigram_entropy", "zero_output_projections_", "zeroed_block_gaps",
]


def residual_explorer(depths=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), depth: int = 32, stack: str = "pre|True",
                      **kwargs) -> FrameExplorer:
    """Explorer for the chapter "Residual connections": depth x stack (norms, skips).

    For each stack of :data:`d2lmini.chapters.ch02_residual.SKIP_CONFIGS` (no norms or pre-LN, with or
    without skip connections) one call of :func:`d2lmini.chapters.ch02_residual.depth_gradients`
    measures every depth on the grid; the frames show the stream's RMS and token
    spread along the stack and the gradient reaching each block.

    Args:
        depths: the depth slider's stops.
        depth, stack: initial values (``stack`` is ``"<placement>|<residual>"``).
        **kwargs: passed to :func:`~d2lmini.chapters.ch02_residual.depth_gradients` (sizes, seed, dtype).

    Returns:
        A :class:`FrameExplorer`; display it for the live view, ``.static()`` for the twin.
    """
    result = depth_gradients(depths=tuple(depths), configs=SKIP_CONFIGS, **kwargs)
    frames = {}
    for probe in result.probes:
        color = SKIP_COLORS[probe.placement]
        for L in depths:
            frames[f"{L}|{probe.placement}|{probe.residual}"] = dict(
                title=(f"{probe.label}, L = {L}: gradient reaching block 1 {probe.first_block_grad(L):.1e}, "
                       f"token spread {probe.token_spread[L]:.1e}"),
                panels=[[dict(y=round_frame_values(probe.stream_rms[:L + 1]), x0=0, color=color)],
                        [dict(y=round_frame_values(probe.token_spread[:L + 1]), x0=0, color=color)],
                        [dict(y=round_frame_values(probe.block_grad[L]), x0=1, color=color)]])
    controls = [dict(name="depth", label="depth L", type="range", values=list(depths), value=depth),
                dict(name="stack", label="stack", type="select", value=stack,
                     options=[[f"{p}|{r}", skip_label(p, r)] for p, r in SKIP_CONFIGS])]
    top = max(depths)
    panels = [dict(title="Size of the stream", xlabel="depth k", ylabel="stream RMS", log=True, xmin=0, xmax=top),
              dict(title="Token spread", xlabel="depth k", ylabel="token spread", log=True, xmin=0, xmax=top),
              dict(title="Gradient per block", xlabel="block k", ylabel="gradient norm", log=True, xmin=0, xmax=top)]
    return FrameExplorer(controls, panels, frames=frames, description="Residual stacks with and without skip connections")
