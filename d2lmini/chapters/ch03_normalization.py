"""BatchNorm and LayerNorm side by side: the same formula reduced over different axes.

Introduced in the chapter "Normalization: why LayerNorm, not BatchNorm". Both
norms compute ``(x - mean) / sqrt(var + eps)``, then a per-feature gain and bias.
Batch normalization (Ioffe & Szegedy, 2015) takes ``mean`` and ``var`` of each
feature over every position in the batch; layer normalization (Ba, Kiros &
Hinton, 2016) takes them over the features of each token. The reader writes
LayerNorm in the chapter; this module holds BatchNorm's statistics written by hand
(with an optional mask for the real tokens), synthetic padded batches of "token
embeddings", and the chapter's two measurements: what padding does to BatchNorm's
statistics (:func:`padding_measurements`, :func:`padding_sweep`) and how one
sentence's BatchNorm output changes with its batch mates, between training and
evaluation mode and one token at a time (:func:`same_sentence_elsewhere`).

Shapes use the legend b = batch, n = num_steps, d = num_hiddens.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

import torch
from matplotlib.patches import Rectangle
from torch import nn

from .._checks import check_seed as _check_seed
from .._shown import shown_in
from .._checks import (check_float_tensor, check_instance, check_int_at_least, check_int_sequence,
                       check_positive_float, check_positive_int, check_probability, check_sequence, check_vector)
from ..attention import valid_lens_mask
from ..norms import SequenceBatchNorm
from ..plot import CELL_COLORS, NORM_COLORS, styled_figure
from ..seeding import seeded

#: Default epsilon of both norms (PyTorch's ``nn.LayerNorm`` and ``nn.BatchNorm1d`` default).
EPS = 1e-5


def _affine(Y: torch.Tensor, weight, bias) -> torch.Tensor:
    check_vector("weight", weight, Y.shape[-1])
    check_vector("bias", bias, Y.shape[-1])
    if weight is not None:
        Y = Y * weight
    if bias is not None:
        Y = Y + bias
    return Y


def batch_norm_stats(X: torch.Tensor, valid_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """BatchNorm's per-feature mean and biased variance over the positions of a batch.

    Args:
        X: ``(N, d)`` or ``(b, n, d)``.
        valid_lens: ``None`` to average over every position (what a plain
            ``nn.BatchNorm1d`` does, padding included), or ``(b,)`` lengths to
            average over the real positions ``t < valid_lens[b]`` only (``X`` must
            then be ``(b, n, d)``).

    Returns:
        ``(mean, var)``, each of shape ``(d,)``; ``var`` divides by the number of
        positions (biased), as BatchNorm does in training mode.

    Raises:
        TypeError / ValueError: for a non-float ``X``, a wrong shape or bad ``valid_lens``.
    """
    check_float_tensor("X", X, min_dim=2)
    if valid_lens is None:
        rows = X.reshape(-1, X.shape[-1])
        mean = rows.mean(dim=0)
        return mean, (rows - mean).pow(2).mean(dim=0)
    if X.dim() != 3:
        raise ValueError(f"X must have shape (batch, num_steps, num_hiddens) with valid_lens, got {tuple(X.shape)}")
    mask = valid_lens_mask(valid_lens, X.shape[1])  # (b, n) when valid_lens is (b,)
    if tuple(mask.shape) != tuple(X.shape[:2]):
        raise ValueError(f"valid_lens must have shape ({X.shape[0]},), got {tuple(valid_lens.shape)}")
    rows = X[mask]
    if rows.shape[0] == 0:
        raise ValueError("valid_lens leaves no real position to average over")
    mean = rows.mean(dim=0)
    return mean, (rows - mean).pow(2).mean(dim=0)


def batch_norm_by_hand(X: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                       eps: float = EPS, valid_lens: torch.Tensor | None = None) -> torch.Tensor:
    r"""Batch normalization in training mode, written out: statistics per feature over the batch.

    For every feature ``j``: ``y[..., j] = (x[..., j] - mu_j) / sqrt(var_j + eps) *
    weight_j + bias_j``, where ``mu_j`` and the biased ``var_j`` are taken over all
    positions of the batch (:func:`batch_norm_stats`), as in Ioffe & Szegedy (2015)
    and ``torch.nn.BatchNorm1d`` in training mode (whose input is ``(b, d, n)``).
    A batch with a single position has ``var_j = 0`` and ``x = mu_j``, so every
    output is ``bias``: one value per feature carries nothing to normalize.

    Args:
        X: ``(N, d)`` or ``(b, n, d)``.
        weight, bias: ``(d,)`` gain and bias, or ``None``.
        eps: added to the variance, > 0.
        valid_lens: ``None`` (statistics over all positions) or ``(b,)`` lengths
            (statistics over the real positions only; all positions are normalized).

    Returns:
        A tensor of ``X``'s shape.

    Raises:
        TypeError / ValueError: as :func:`batch_norm_stats`, or for a bad gain/bias/eps.
    """
    eps = check_positive_float("eps", eps)
    mean, var = batch_norm_stats(X, valid_lens)
    return _affine((X - mean) / torch.sqrt(var + eps), weight, bias)


# ----------------------------------------------------------------------------------
# Synthetic token embeddings
# ----------------------------------------------------------------------------------

@dataclass
class PaddedBatch:
    """A batch of synthetic token embeddings, zero-padded to the longest sequence.

    Attributes:
        X: ``(b, n, d)`` float32; real tokens ``feature_mean + feature_scale * z``
            with ``z`` standard normal, padding positions all zero.
        valid_lens: ``(b,)`` int64, the length of every sequence; the longest is ``n``.
        feature_mean: ``(d,)``, the population mean of every feature.
        feature_scale: ``(d,)``, the population standard deviation of every feature.
    """

    X: torch.Tensor
    valid_lens: torch.Tensor
    _: KW_ONLY
    feature_mean: torch.Tensor
    feature_scale: torch.Tensor

    @property
    def mask(self) -> torch.Tensor:
        """``(b, n)`` bool, ``True`` at real tokens."""
        return valid_lens_mask(self.valid_lens, self.X.shape[1])

    @property
    def padding_share(self) -> float:
        """Fraction of the ``b * n`` positions that are padding."""
        return 1.0 - float(self.valid_lens.sum()) / self.X.shape[0] / self.X.shape[1]

    @property
    def mean_len(self) -> float:
        """Mean sequence length in tokens."""
        return float(self.valid_lens.double().mean())


def _feature_distribution(num_hiddens: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Every feature gets its own mean, N(0, 1), and scale, U(0.5, 2): like real
    # embeddings, the features are neither centred nor of unit variance.
    mean = torch.randn(num_hiddens)
    scale = 0.5 + 1.5 * torch.rand(num_hiddens)
    return mean, scale


def _draw_lengths(batch_size: int, max_len: int, padding: float) -> torch.Tensor:
    if padding == 0.0:
        return torch.full((batch_size,), max_len, dtype=torch.int64)
    if batch_size < 2:
        raise ValueError(f"batch_size must be >= 2 for padding > 0 (one sequence sets the padded "
                         f"length), got batch_size={batch_size} with padding={padding}")
    # One sequence is the longest (it sets the padded length); the others' mean
    # fraction of max_len is chosen so the padding share is `padding`.
    rest = (batch_size * (1.0 - padding) - 1.0) / (batch_size - 1)
    if rest * max_len < 1.0:
        raise ValueError(f"padding={padding} is too high for batch_size={batch_size} and max_len={max_len}: "
                         f"the sequences would be shorter than one token on average")
    if rest >= 1.0:
        return torch.full((batch_size,), max_len, dtype=torch.int64)
    concentration = 4.0  # Beta(4m, 4(1-m)): lengths spread widely around their mean m
    u = torch.distributions.Beta(concentration * rest, concentration * (1.0 - rest)).sample((batch_size - 1,))
    u = u.double()
    # Rescale the draw so its mean is exactly `rest` (a batch of 32 is too small for
    # the sample mean to be close): the realized padding share then matches `padding`
    # up to rounding the lengths to whole tokens.
    for _ in range(20):
        u = (u * rest / u.mean()).clamp(1.0 / max_len, 1.0)
    lengths = (u * max_len).round().clamp(1, max_len).to(torch.int64)
    return torch.cat([torch.tensor([max_len]), lengths])


def padded_batch(batch_size: int = 32, max_len: int = 100, padding: float = 0.7, num_hiddens: int = 64,
                 seed: int = 0) -> PaddedBatch:
    """Draw a batch of variable-length "sentences" of synthetic token embeddings, zero-padded.

    The data: ``d = num_hiddens`` features; feature ``j`` has its own mean
    ``mu_j ~ N(0, 1)`` and scale ``s_j ~ U(0.5, 2)``; every real token is
    ``mu + s * z`` with ``z ~ N(0, I_d)``, independently. One sequence has
    ``max_len`` tokens; the others' lengths are ``round(max_len * u)`` (at least 1)
    with ``u`` drawn from a Beta distribution and rescaled so that the share of
    padding positions equals ``padding`` (up to rounding to whole tokens). Shorter
    sequences are padded
    with zero vectors up to ``max_len``. The feature means and scales depend only
    on ``seed`` and ``num_hiddens``, so batches with different ``padding`` share them.

    Args:
        batch_size: ``b`` (>= 2 unless ``padding`` is 0).
        max_len: ``n``, the longest sequence and the padded length.
        padding: expected share of padding positions, in ``[0, 1)``; the realized
            share is :attr:`PaddedBatch.padding_share`.
        num_hiddens: ``d``.
        seed: seeds everything; the global RNG is left untouched.

    Returns:
        A :class:`PaddedBatch`.

    Raises:
        TypeError / ValueError: for bad sizes, a padding share outside ``[0, 1)`` or
            one so high that sequences would average under one token.
    """
    batch_size = check_positive_int("batch_size", batch_size)
    max_len = check_positive_int("max_len", max_len)
    padding = check_probability("padding", padding)
    num_hiddens = check_positive_int("num_hiddens", num_hiddens)
    with seeded(seed):
        feature_mean, feature_scale = _feature_distribution(num_hiddens)
        torch.manual_seed(seed + 1)
        Z = torch.randn(batch_size, max_len, num_hiddens)
        valid_lens = _draw_lengths(batch_size, max_len, padding)
    mask = valid_lens_mask(valid_lens, max_len)
    X = (feature_mean + feature_scale * Z) * mask[..., None]
    return PaddedBatch(X=X, valid_lens=valid_lens, feature_mean=feature_mean, feature_scale=feature_scale)


def token_embeddings(batch_size: int, num_steps: int, num_hiddens: int = 64, seed: int = 0,
                     feature_seed: int = 0) -> torch.Tensor:
    """Unpadded synthetic token embeddings ``mu + s * z`` from the distribution of :func:`padded_batch`.

    Args:
        batch_size, num_steps, num_hiddens: the shape ``(b, n, d)``.
        seed: seeds the tokens ``z``.
        feature_seed: seeds the feature means and scales (the same as
            :func:`padded_batch`'s ``seed`` gives the same features).

    Returns:
        ``(b, n, d)`` float32.

    Raises:
        TypeError / ValueError: for bad sizes or seeds.
    """
    shape = [check_positive_int(name, value) for name, value in
             (("batch_size", batch_size), ("num_steps", num_steps), ("num_hiddens", num_hiddens))]
    seed, feature_seed = _check_seed(seed), _check_seed(feature_seed)
    with seeded(feature_seed):
        feature_mean, feature_scale = _feature_distribution(shape[2])
        torch.manual_seed(seed)
        Z = torch.randn(*shape)
    return feature_mean + feature_scale * Z


# ----------------------------------------------------------------------------------
# The chapter's measurements
# ----------------------------------------------------------------------------------

def _max_abs(A: torch.Tensor, B: torch.Tensor) -> float:
    return float((A.double() - B.double()).abs().max())


def expected_stat_errors(padding: float, feature_mean: torch.Tensor, feature_scale: torch.Tensor) -> tuple:
    r"""What padding does to BatchNorm's statistics, from the formula.

    With a share ``p`` of zero vectors among the positions, a feature with real
    mean ``m`` and variance ``s**2`` gets the padded mean ``(1 - p) m`` and the
    padded variance ``(1 - p) s**2 + p (1 - p) m**2``. Returns the relative errors
    over the features, ``||mean_pad - m|| / ||m|| = p`` and
    ``||var_pad - s**2|| / ||s**2||``, for the population values given.

    Args:
        padding: ``p`` in ``[0, 1)``.
        feature_mean, feature_scale: ``(d,)`` tensors ``m`` and ``s``.

    Returns:
        ``(mean_error, var_error)`` as floats.

    Raises:
        TypeError / ValueError: if ``padding`` is not in ``[0, 1)``.
    """
    p = check_probability("padding", padding)
    m, s2 = feature_mean.double(), feature_scale.double().pow(2)
    var_pad = (1 - p) * s2 + p * (1 - p) * m.pow(2)
    return p, float((var_pad - s2).norm() / s2.norm())


@shown_in("ch03")
def padding_measurements(batch: PaddedBatch) -> dict:
    """BatchNorm with and without the padding of ``batch``, and LayerNorm in and out of it.

    BatchNorm's statistics over all ``b * n`` positions (padding included) are compared
    with those of the real tokens, in float64, as the relative errors of the ``(d,)``
    means and variances; so are the real tokens normalized with each. LayerNorm is
    applied to the padded ``(b, n, d)`` batch and to every sequence alone. Chapter
    "Normalization" (the argument of Ba, Kiros & Hinton, 2016, and Shen et al., 2020).

    Returns:
        dict of floats, the measured fields of :class:`PaddingErrors`.

    Raises:
        TypeError: if ``batch`` is not a :class:`PaddedBatch`.
    """
    check_instance("batch", batch, PaddedBatch)
    X, real = batch.X.double(), batch.mask
    mean_all, var_all = batch_norm_stats(X)                      # padding included
    mean_real, var_real = batch_norm_stats(X, batch.valid_lens)  # real tokens only
    diff = (batch_norm_by_hand(X)[real]
            - batch_norm_by_hand(X, valid_lens=batch.valid_lens)[real])
    ln, delta = nn.LayerNorm(X.shape[-1]), 0.0
    with torch.no_grad():
        in_batch = ln(batch.X)
        for b, length in enumerate(batch.valid_lens.tolist()):
            alone = ln(batch.X[b:b + 1, :length].clone())
            delta = max(delta, _max_abs(in_batch[b:b + 1, :length], alone))
    return dict(mean_error=float((mean_all - mean_real).norm() / mean_real.norm()),
                var_error=float((var_all - var_real).norm() / var_real.norm()),
                std_ratio=float((var_all / var_real).sqrt().median()),
                output_rms_error=float(diff.pow(2).mean().sqrt()),
                output_max_error=float(diff.abs().max()),
                layer_norm_max_delta=delta)


@dataclass
class PaddingErrors:
    """What padding does to one batch (:func:`padding_errors`).

    Attributes:
        padding_target: the requested padding share.
        padding_share: the realized share of padding positions.
        mean_len: mean sequence length (tokens); ``max_len``: the padded length.
        mean_error: ``||mu_all - mu_real|| / ||mu_real||`` over the ``d`` features, where
            ``mu_all`` is BatchNorm's per-feature mean over all positions and
            ``mu_real`` the mean over the real tokens only.
        var_error: the same for the biased variances.
        std_ratio: median over features of ``sigma_all / sigma_real``.
        output_rms_error / output_max_error: RMS and largest absolute difference, over the
            real tokens, between the tokens normalized with all-position statistics
            and with real-token statistics (no gain or bias; units of one standard
            deviation of the normalized feature).
        layer_norm_max_delta: largest absolute difference, over every real token of the
            batch, between ``nn.LayerNorm`` applied to the padded batch and to each
            sequence alone, unpadded.
        expected_mean_error / expected_var_error: :func:`expected_stat_errors` at the
            realized share with the population feature means and scales.
    """

    padding_target: float
    padding_share: float
    _: KW_ONLY
    mean_len: float
    max_len: int
    mean_error: float
    var_error: float
    std_ratio: float
    output_rms_error: float
    output_max_error: float
    layer_norm_max_delta: float
    expected_mean_error: float
    expected_var_error: float


def padding_errors(padding: float = 0.7, batch_size: int = 32, max_len: int = 100, num_hiddens: int = 64,
                   seed: int = 0) -> PaddingErrors:
    """Measure how zero padding corrupts BatchNorm's statistics and leaves LayerNorm alone.

    Draws a :func:`padded_batch` and measures it with :func:`padding_measurements`:
    BatchNorm's per-feature statistics as a naive BatchNorm over ``b * n`` positions
    computes them (padding included) against those of the real tokens only, the
    normalized real tokens under both, and ``nn.LayerNorm(d)`` applied to the padded
    batch against every sequence alone. The argument of
    Ba, Kiros & Hinton (2016) and Shen et al. (2020) for LayerNorm in sequence models.

    Args:
        padding: expected share of padding positions, in ``[0, 1)``.
        batch_size, max_len, num_hiddens: ``b``, ``n``, ``d``.
        seed: seeds the batch (and through it the feature distribution).

    Returns:
        A :class:`PaddingErrors`.

    Raises:
        TypeError / ValueError: as :func:`padded_batch`.
    """
    batch = padded_batch(batch_size, max_len, padding, num_hiddens, seed)
    share = batch.padding_share
    exp_mean, exp_var = expected_stat_errors(share, batch.feature_mean, batch.feature_scale)
    return PaddingErrors(padding_target=padding, padding_share=share, mean_len=batch.mean_len, max_len=max_len,
                         **padding_measurements(batch), expected_mean_error=exp_mean, expected_var_error=exp_var)


@dataclass
class PaddingSweep:
    """:func:`padding_errors` over a range of padding shares, plus the formula's curve.

    Attributes:
        results: one :class:`PaddingErrors` per requested share.
        curve_padding, curve_mean_error, curve_var_error: :func:`expected_stat_errors`
            on a fine grid of shares, for plotting.
    """

    results: list[PaddingErrors]
    curve_padding: list[float] = field(default_factory=list)
    _: KW_ONLY
    curve_mean_error: list[float] = field(default_factory=list)
    curve_var_error: list[float] = field(default_factory=list)

    def column(self, name: str) -> list[float]:
        """One attribute of every result, e.g. ``sweep.column('var_error')``."""
        return [getattr(r, name) for r in self.results]


def padding_sweep(paddings=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9), batch_size: int = 32,
                  max_len: int = 100, num_hiddens: int = 64, seed: int = 0) -> PaddingSweep:
    """Run :func:`padding_errors` for every share in ``paddings`` (same features, same seed).

    Args:
        paddings: expected padding shares, each in ``[0, 1)``.
        batch_size, max_len, num_hiddens, seed: as :func:`padding_errors`.

    Returns:
        A :class:`PaddingSweep`.

    Raises:
        TypeError / ValueError: for an empty ``paddings`` or any bad argument.
    """
    paddings = check_sequence("paddings", paddings, check_probability, "padding shares in [0, 1)")
    results = [padding_errors(p, batch_size, max_len, num_hiddens, seed) for p in paddings]
    batch = padded_batch(2, 1, 0.0, num_hiddens, seed)  # same seed: the same feature distribution
    grid = [i / 100 for i in range(0, 96)]
    curve = [expected_stat_errors(p, batch.feature_mean, batch.feature_scale) for p in grid]
    return PaddingSweep(results=results, curve_padding=grid, curve_mean_error=[c[0] for c in curve],
                        curve_var_error=[c[1] for c in curve])


@shown_in("ch03")
def same_sentence_elsewhere(batch_size: int = 8, num_steps: int = 16,
                            num_hiddens: int = 64, warmup: int = 100,
                            momentum: float = 0.1, seed: int = 0) -> list[dict]:
    """One sentence normalized in three other settings, by BatchNorm and by LayerNorm.

    A sentence of ``num_steps`` tokens (:func:`token_embeddings`, ``(1, n, d)``) is
    first in batch A of ``batch_size`` sentences; its output there, in training mode,
    is the reference. It is then normalized (1) in training mode in batch B, whose
    other sentences differ; (2) in batch A in evaluation mode, after ``warmup``
    training batches have set BatchNorm's running statistics (Ioffe & Szegedy, 2015:
    population statistics at inference; PyTorch starts them at mean 0, variance 1 and
    moves them by ``momentum`` per batch); (3) one token at a time, as generation feeds
    it, in evaluation mode, the only mode in which BatchNorm accepts a single token.
    LayerNorm (``nn.LayerNorm``) gets the same inputs. Chapter "Normalization".

    Returns:
        One dict per setting: ``setting``, ``bn_max_delta`` and ``bn_rms_delta`` (the
        largest and the RMS ``|output - reference|`` of BatchNorm over the sentence's
        ``n * d`` entries, in units of one standard deviation) and ``ln_max_delta``
        (the largest for LayerNorm).

    Raises:
        TypeError / ValueError: for ``batch_size`` or ``warmup`` below 2, a momentum
            outside ``[0, 1)`` or other bad sizes or seed.
    """
    # batch(k): the sentence first, then batch_size - 1 others drawn with seed k
    warmup, sentence, batch = _sentence_and_batches(batch_size, num_steps, num_hiddens,
                                                    warmup, seed)
    tokens = [sentence[:, t:t + 1] for t in range(num_steps)]  # as generation feeds it

    @torch.no_grad()
    def outputs(norm):  # the reference (in batch A), then the three settings
        ref, other = norm(batch(1))[0], norm(batch(2))[0]  # training mode: A, then B
        for k in range(3, warmup + 1):  # training batches move the running statistics
            norm(batch(k))
        norm.eval()  # evaluation mode: BatchNorm uses its running statistics
        evaluated, alone = norm(batch(1))[0], torch.cat([norm(x)[0] for x in tokens])
        return ref, {"other batch mates": other, "evaluation mode": evaluated,
                     "one token at a time": alone}

    bn_ref, bn = outputs(SequenceBatchNorm(num_hiddens, momentum=momentum).train())
    ln_ref, ln = outputs(nn.LayerNorm(num_hiddens))
    return [{"setting": name, "bn_max_delta": _max_abs(b, bn_ref),
             "ln_max_delta": _max_abs(ln[name], ln_ref),
             "bn_rms_delta": float((b - bn_ref).pow(2).mean().sqrt())}
            for name, b in bn.items()]


def _sentence_and_batches(batch_size, num_steps, num_hiddens, warmup, seed):
    """For :func:`same_sentence_elsewhere`: its checked ``warmup``, the sentence ``(1, n, d)``
    and ``batch(k)``, the sentence first in a batch with ``batch_size - 1`` other sentences
    drawn with seed ``seed + k`` (from the same feature distribution)."""
    check_int_at_least("batch_size", batch_size, 2, "the sentence needs batch mates")
    warmup = check_int_at_least("warmup", warmup, 2, "batches A and B are the first two")
    sentence = token_embeddings(1, num_steps, num_hiddens, seed=seed, feature_seed=seed)

    def batch(k):
        others = token_embeddings(batch_size - 1, num_steps, num_hiddens, seed=seed + k,
                                  feature_seed=seed)
        return torch.cat([sentence, others])

    return warmup, sentence, batch


# ----------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------

def plot_norm_axes(lengths=(4, 2, 3), num_hiddens: int = 5):
    """Draw which entries BatchNorm and LayerNorm average over, on a small padded batch.

    Each panel is the batch laid out as a grid: one column per position (the
    sequences side by side, each padded to the longest), one row per feature.
    Padding cells are white and hatched. The left panel highlights one feature's
    row (BatchNorm's statistics: every position, padding included); the right
    panel one token's column (LayerNorm's statistics: every feature of that token).

    Args:
        lengths: the sequences' lengths (tokens); the longest sets the padded length.
        num_hiddens: number of feature rows.

    Returns:
        A ``matplotlib.figure.Figure`` (8 x 3 inches).

    Raises:
        TypeError / ValueError: for empty or non-positive lengths or bad ``num_hiddens``.
    """
    lengths = check_int_sequence("lengths", lengths)
    d = check_positive_int("num_hiddens", num_hiddens)
    n, gap = max(lengths), 0.6
    starts = [s * (n + gap) for s in range(len(lengths))]
    width = starts[-1] + n
    panels = (
        ("BatchNorm: per feature, over the batch", "batch",
         "mean and variance of one feature over\nevery position, padding included"),
        ("LayerNorm: per token, over the features", "layer",
         "mean and variance of one token over\nits own features, no other token"),
    )
    with styled_figure(2, width=8.0, height=3.0) as (fig, axes):
        for ax, (title, kind, note) in zip(axes, panels):
            color = NORM_COLORS[kind]
            for x0, length in zip(starts, lengths):
                for t in range(n):
                    real = t < length
                    for j in range(d):
                        ax.add_patch(Rectangle((x0 + t, j), 1, 1, facecolor=CELL_COLORS["real"] if real else "white",
                                               edgecolor="white" if real else CELL_COLORS["padding"],
                                               hatch=None if real else "////", linewidth=1.2 if real else 0.6))
                ax.text(x0 + n / 2, -0.25, f"seq. {starts.index(x0) + 1}", ha="center", va="bottom", fontsize=10)
            if kind == "batch":  # one feature row, across every position of every sequence
                for x0 in starts:
                    ax.add_patch(Rectangle((x0, 1), n, 1, facecolor=color, alpha=0.6, edgecolor=color,
                                           linewidth=2))
            else:  # one token's column
                ax.add_patch(Rectangle((starts[0] + 1, 0), 1, d, facecolor=color, alpha=0.6, edgecolor=color,
                                       linewidth=2))
            ax.text(width / 2, d + 0.35, "positions (hatched: padding)", ha="center", va="top",
                    fontsize=10, color="0.3")
            ax.text(-0.3, d / 2, "features", rotation=90, ha="right", va="center", fontsize=10, color="0.3")
            ax.text(width / 2, d + 1.45, note, ha="center", va="top", fontsize=11, color=color)
            ax.set_xlim(-1.2, width + 0.2)
            ax.set_ylim(d + 2.9, -1.5)
            ax.set_title(title)
            ax.grid(False)
            ax.set_axis_off()
    return fig


def plot_padding_sweep(sweep: PaddingSweep, mark: float | None = None):
    """Plot BatchNorm's statistic errors and the resulting output error against the padding share.

    Left: relative error of the per-feature mean and variance, measured (hollow
    markers) and from the formula of :func:`expected_stat_errors` (lines drawn on top,
    so that both stay visible where they coincide). Right: RMS error of the normalized
    real tokens for BatchNorm with all-position statistics, and LayerNorm's largest
    change (zero).

    Args:
        sweep: a :class:`PaddingSweep`.
        mark: if given, a dotted vertical line at this padding share.

    Returns:
        A ``matplotlib.figure.Figure`` (8 x 3 inches).

    Raises:
        TypeError: if ``sweep`` is not a :class:`PaddingSweep`.
    """
    check_instance("sweep", sweep, PaddingSweep)
    share = [100 * p for p in sweep.column("padding_share")]
    grid = [100 * p for p in sweep.curve_padding]
    bn, ln = NORM_COLORS["batch"], NORM_COLORS["layer"]
    hollow = dict(linestyle="none", markerfacecolor="white", markersize=8, markeredgewidth=1.6, zorder=2)
    with styled_figure(2, width=8.0, height=3.0) as (fig, axes):
        ax = axes[0]
        ax.plot(share, sweep.column("mean_error"), "o", color=bn, label="mean, measured", **hollow)
        ax.plot(share, sweep.column("var_error"), "s", color="#7d3c98", label="variance, measured", **hollow)
        ax.plot(grid, sweep.curve_mean_error, color="0.15", linestyle="-", linewidth=1.0, zorder=3,
                label="mean, formula")
        ax.plot(grid, sweep.curve_var_error, color="0.15", linestyle="--", linewidth=1.0, zorder=3,
                label="variance, formula")
        ax.set(xlabel="padding share (%)", ylabel="relative error",
               title="BatchNorm's per-feature statistics")
        ax.legend(loc="upper left", fontsize=9)
        ax.set_ylim(-0.05, 1.25)
        ax = axes[1]
        ax.plot(share, sweep.column("output_rms_error"), "o-", color=bn, label="BatchNorm (RMS)")
        ax.plot(share, sweep.column("layer_norm_max_delta"), "s-", color=ln, label="LayerNorm (max |Δ|)")
        ax.set(xlabel="padding share (%)", ylabel="error (units of σ)",
               title="Normalized real tokens")
        ax.legend(loc="upper left", fontsize=9)
        ax.set_ylim(bottom=-0.1)
        for ax in axes:
            ax.set_xlim(-3, 100)
            if mark is not None:
                ax.axvline(100 * mark, color="0.4", linestyle=":", linewidth=1, zorder=1)
    return fig
