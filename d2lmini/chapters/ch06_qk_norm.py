"""QK-norm: RMSNorm on queries and keys, right before the dot product.

Introduced in the chapter "QK-norm: the same discipline inside attention". The
pre-LN block normalizes what enters each sublayer, but nothing bounds the
attention logits ``q . k / sqrt(d_h)``: if training makes ``W_q`` and ``W_k``
large, the softmax saturates and the gradient reaching queries and keys dies.
Three experiments, each deterministic for a given seed:

* :func:`logit_scale_sweep` -- multiply ``W_q`` and ``W_k`` of one attention layer
  by a scale ``s``: attention entropy and the gradient reaching ``q`` and ``k``,
  with and without QK-norm;
* :func:`rope_order_check` -- QK-norm before RoPE versus after it: equal while the
  norm's gains are all equal, different (and no longer relative-position
  attention) once they are not;
* :func:`qk_norm_training` / :func:`qk_norm_regimes` -- a tiny language model
  trained with and without QK-norm, at a high learning rate (where QK-norm
  matters) and a modest one (where it does not), recording the largest attention
  logit.

Shapes use the legend b = batch, h = heads, n = num_steps, d = num_hiddens,
d_h = head_dim.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from dataclasses import KW_ONLY, dataclass, field

import torch
from torch import nn

from .._checks import check_seed as _check_seed
from .._checks import check_seeds
from .._checks import (check_bool, check_choice, check_float_dtype, check_float_tensor, check_instance,
                       check_int_at_least, check_optional_choice, check_positive_float, check_positive_floats,
                       check_positive_int, check_sequence, check_sequence_tensor)
from ..attention import QK_NORMS, MultiHeadAttention, apply_rotary, rotary_cos_sin
from ..plot import QK_COLORS, QK_LABELS, styled_figure
from .._shown import shown_in
from ..seeding import seeded
from ..widgets import FrameExplorer, round_frame_values

# The two checks of this module's arguments, bound once: a QK-norm setting (None or a
# variant) and an attention module.
_check_qk_norm = functools.partial(check_optional_choice, allowed=QK_NORMS)
_check_attention = functools.partial(check_instance, "attention", kind=MultiHeadAttention,
                                     what="a d2lmini MultiHeadAttention")


# --------------------------------------------------------------------------- logits from a module


def queries_and_keys_after_rope(attention: MultiHeadAttention, queries: torch.Tensor, keys: torch.Tensor):
    """The wrong order, spelled out: project, split into heads, rotate by RoPE, *then* QK-normalize.

    The twin of ``MultiHeadAttention.queries_and_keys`` with the norm moved behind
    the rotation (Su et al., 2021), the porting bug of the chapter "QK-norm".
    ``queries`` and ``keys`` are ``(b, n, d)``; returns ``q`` ``(b, h, n, d_h)`` and
    ``k`` ``(b, h_kv, n, d_h)``. Raises ValueError without RoPE or for unequal lengths.
    """
    if attention.rope_theta is None:
        raise ValueError("norm_after_rope=True needs an attention module with RoPE (rope_theta set)")
    if queries.shape[1] != keys.shape[1]:
        raise ValueError("RoPE needs as many queries as keys (self-attention), "
                         f"got {queries.shape[1]} queries and {keys.shape[1]} keys")
    cos, sin = rotary_cos_sin(queries.shape[1], attention.head_dim, attention.rope_theta,
                              queries.device, queries.dtype)
    out = []
    for X, W, norm, heads in ((queries, attention.W_q, attention.q_norm, attention.num_heads),
                              (keys, attention.W_k, attention.k_norm, attention.num_kv_heads)):
        Y = apply_rotary(W(X).unflatten(-1, (heads, attention.head_dim)).transpose(1, 2), cos, sin)
        if norm is not None and attention.qk_norm == "projection":  # (b, heads, n, d_h) -> (b, n, heads * d_h)
            Y = norm(Y.transpose(1, 2).flatten(-2)).unflatten(-1, (heads, attention.head_dim)).transpose(1, 2)
        elif norm is not None:
            Y = norm(Y.transpose(1, 2)).transpose(1, 2)
        out.append(Y)
    return tuple(out)


def attention_logits(attention: MultiHeadAttention, queries: torch.Tensor, keys: torch.Tensor | None = None,
                     norm_after_rope: bool = False) -> torch.Tensor:
    r"""The scaled attention logits ``scale * q . k`` that ``attention`` feeds its softmax.

    Takes the queries and keys exactly as the module hands them to
    ``scaled_dot_product_attention`` (``attention.queries_and_keys``: project,
    QK-normalize if the module has QK-norm, split into heads, rotate if it has
    RoPE) and returns ``attention.logit_scale * q k^T`` (``1/sqrt(d_h)`` unless the
    module sets its own scale). No mask is applied. With ``norm_after_rope=True`` it
    applies the QK-norm *after* the rotation instead (:func:`queries_and_keys_after_rope`) -- the bug
    the chapter demonstrates.

    Args:
        attention: a :class:`~d2lmini.attention.MultiHeadAttention`.
        queries: ``(b, n_q, d)``.
        keys: ``(b, n_k, d)``; default ``queries`` (self-attention).
        norm_after_rope: apply the QK-norm after RoPE (wrong) instead of before it.

    Returns:
        ``(b, h, n_q, n_k)`` logits; with grouped-query attention every query head
        is paired with the key head it reads.

    Raises:
        TypeError: ``attention`` is not a ``MultiHeadAttention``, or the inputs are
            not floating tensors.
        ValueError: inputs of the wrong shape; ``norm_after_rope=True`` for a
            module without RoPE; RoPE with different query and key lengths.
    """
    _check_attention(attention)
    keys = queries if keys is None else keys
    check_bool("norm_after_rope", norm_after_rope)
    if norm_after_rope:
        check_sequence_tensor("queries", queries, attention.num_hiddens)
        check_sequence_tensor("keys", keys, attention.num_hiddens)
        q, k = queries_and_keys_after_rope(attention, queries, keys)
    else:
        q, k = attention.queries_and_keys(queries, keys)
    k = k.repeat_interleave(attention.num_heads // attention.num_kv_heads, dim=1)  # query head i reads i // group
    return q @ k.transpose(-1, -2) * attention.logit_scale


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    r"""Entropy ``-sum_j p_j log p_j`` of every row of attention weights, in nats.

    0 when a query puts all its weight on one key; ``log n_k`` when it spreads
    its weight evenly over ``n_k`` keys.

    Args:
        weights: ``(..., n_k)`` probabilities (rows sum to 1; masked keys 0).

    Returns:
        ``(...)``: one entropy per row.

    Raises:
        TypeError: if ``weights`` is not a floating tensor.
    """
    check_float_tensor("weights", weights)
    return -(weights * torch.log(weights.clamp_min(torch.finfo(weights.dtype).tiny))).sum(dim=-1)


# --------------------------------------------------------------------------- the scale sweep


def make_attention(qk_norm: str | None = None, num_hiddens: int = 64, num_heads: int = 4, seed: int = 0,
                   **kwargs) -> MultiHeadAttention:
    """A fresh :class:`~d2lmini.attention.MultiHeadAttention` whose projections depend only on ``seed``.

    The same ``seed`` gives the same ``W_q``, ``W_k``, ``W_v``, ``W_o`` whatever
    ``qk_norm`` is (QK-norm gains start at 1), so layers with and without QK-norm
    can be compared weight for weight. The global RNG is left untouched.

    Args:
        qk_norm: ``None`` or one of :data:`d2lmini.attention.QK_NORMS`.
        num_hiddens, num_heads: width ``d`` and heads ``h``.
        seed: seeds the projections (PyTorch's default ``nn.Linear`` initialization).
        **kwargs: passed to ``MultiHeadAttention`` (``rope_theta``, ``num_kv_heads``, ...).

    Returns:
        The module, in float32 and in eval mode.

    Raises:
        ValueError / TypeError: for invalid arguments.
    """
    _check_seed(seed)
    qk_norm = _check_qk_norm("qk_norm", qk_norm)
    with seeded(seed):
        layer = MultiHeadAttention(num_hiddens, num_heads, qk_norm=qk_norm, **kwargs)
    return layer.eval()


def scale_qk_(attention: MultiHeadAttention, scale: float) -> MultiHeadAttention:
    """Multiply ``W_q`` and ``W_k`` (weights and biases) of ``attention`` by ``scale``, in place.

    Without QK-norm every logit is then multiplied by ``scale**2``; with QK-norm
    the logits do not change (up to the norm's epsilon).

    Returns:
        ``attention``, for chaining.

    Raises:
        TypeError / ValueError: if ``attention`` is not a ``MultiHeadAttention`` or
            ``scale`` is not a positive finite number.
    """
    _check_attention(attention)
    scale = check_positive_float("scale", scale)
    with torch.no_grad():
        for layer in (attention.W_q, attention.W_k):
            layer.weight.mul_(scale)
            if layer.bias is not None:
                layer.bias.mul_(scale)
    return attention


@dataclass
class LogitScaleSweep:
    """The result of :func:`logit_scale_sweep`.

    Every list has one float per scale; every dict is keyed by the QK-norm setting
    (``None`` or a variant name). "Per-token gradient" means the norm of the
    loss gradient with respect to one query (or key) vector of one head, taken
    where it enters the dot product (after QK-norm and RoPE, if any).

    Attributes:
        scales: the factors ``s`` that multiplied ``W_q`` and ``W_k``.
        entropy: attention entropy in nats, averaged over heads and queries.
        max_logit: the largest scaled logit ``q . k / sqrt(d_h)``.
        rms_logit: the root mean square of all scaled logits: their typical size.
        grad_q, grad_k: the median per-token gradient over all heads and queries
            (keys): what a typical query (key) receives.
        zero_q: the fraction of queries whose gradient is exactly zero in the
            run's dtype.
        grad_W_q: Frobenius norm of the gradient reaching the weight of ``W_q``
            (behind any QK-norm).
        grad_v: Frobenius norm of the gradient at the values ``X W_v``.
        max_entropy: ``log n``, the entropy of uniform attention over ``n`` keys.
        config: the arguments of the run.
    """

    scales: list[float]
    entropy: dict = field(default_factory=dict)
    _: KW_ONLY
    max_logit: dict = field(default_factory=dict)
    grad_q: dict = field(default_factory=dict)
    grad_k: dict = field(default_factory=dict)
    zero_q: dict = field(default_factory=dict)
    rms_logit: dict = field(default_factory=dict)
    grad_W_q: dict = field(default_factory=dict)
    grad_v: dict = field(default_factory=dict)
    max_entropy: float = 0.0
    config: dict = field(default_factory=dict)

    #: The per-scale series, in the order :meth:`at` returns them.
    SERIES = ("entropy", "max_logit", "rms_logit", "grad_q", "grad_k", "zero_q", "grad_W_q", "grad_v")

    def at(self, scale: float, qk_norm: str | None) -> dict:
        """All measurements at ``scale`` (one of :attr:`scales`) for one setting, as a dict.

        Raises:
            ValueError: if ``scale`` was not swept or ``qk_norm`` was not measured.
        """
        matches = [i for i, s in enumerate(self.scales) if math.isclose(s, scale)]
        if not matches:
            raise ValueError(f"scale must be one of the swept scales {self.scales}, got {scale}")
        if qk_norm not in self.entropy:
            raise ValueError(f"qk_norm must be one of the measured settings {list(self.entropy)}, got {qk_norm!r}")
        row = {"scale": self.scales[matches[0]], "qk_norm": qk_norm}
        row.update({name: getattr(self, name)[qk_norm][matches[0]] for name in self.SERIES})
        return row


def log_spaced_scales(low: float = 0.25, high: float = 64.0, per_octave: int = 2) -> list[float]:
    """Scales ``low * 2**(i / per_octave)`` from ``low`` up to ``high`` (both included if on the grid).

    Raises:
        ValueError / TypeError: if ``low``/``high`` are not positive with ``low < high``,
            or ``per_octave`` is not a positive int.
    """
    low, high = check_positive_float("low", low), check_positive_float("high", high)
    per_octave = check_positive_int("per_octave", per_octave)
    if not low < high:
        raise ValueError(f"low must be smaller than high, got low={low}, high={high}")
    count = int(math.floor(per_octave * math.log2(high / low) + 1e-9)) + 1
    return [low * 2 ** (i / per_octave) for i in range(count)]


def logit_scale_sweep(scales=None, qk_norms=(None, "per_head"), num_hiddens: int = 64, num_heads: int = 4,
                      num_steps: int = 64, seed: int = 0, dtype: torch.dtype = torch.float64) -> LogitScaleSweep:
    r"""Inflate ``W_q`` and ``W_k`` by ``s`` and measure what the softmax and the gradients do.

    One attention layer (:func:`make_attention`, bidirectional, no RoPE) and one
    input sequence ``X`` of ``num_steps`` tokens with i.i.d. standard normal
    entries. For every scale ``s``, a copy of the layer gets ``s W_q`` and
    ``s W_k`` (:func:`scale_qk_`); it records the attention entropy, the largest
    logit, and the gradients (see :class:`LogitScaleSweep`) of the scalar loss

    .. math:: \ell = \frac{1}{\sqrt{n d}} \sum_{i,j} Y_{ij} R_{ij},

    a fixed random read-out of the layer's output ``Y``: ``Y`` projected on a fixed
    random tensor ``R`` and summed, so that there is a gradient to measure. Every setting in
    ``qk_norms`` starts from the same projections. Without QK-norm the logits
    grow like ``s**2``, the softmax saturates (entropy -> 0), and the typical
    query and key receive no gradient; with QK-norm the logits, and every
    gradient at the dot product, do not depend on ``s`` at all.

    The saturation mechanism is the one Dehghani et al. (2023) saw in ViT-22B and
    Wortsman et al. (2023) reproduced in small models.

    Args:
        scales: the factors ``s`` (default :func:`log_spaced_scales`: 0.25 ... 64,
            two per octave).
        qk_norms: settings to compare: ``None`` and/or names in :data:`QK_NORMS`.
        num_hiddens, num_heads, num_steps: width ``d``, heads ``h``, tokens ``n`` (>= 2).
        seed: seeds the layer, the input and the read-out.
        dtype: ``torch.float64`` (default: tiny gradients are measured, not rounded
            to zero) or ``torch.float32`` (what training uses: see ``zero_q``).

    Returns:
        A :class:`LogitScaleSweep`.

    Raises:
        ValueError / TypeError: invalid scales, settings, sizes or dtype.
    """
    scales = log_spaced_scales() if scales is None else check_positive_floats("scales", scales)
    qk_norms = tuple(check_sequence("qk_norms", qk_norms, _check_qk_norm, "None or names from QK_NORMS"))
    num_steps = check_int_at_least("num_steps", num_steps, 2)
    _check_seed(seed)
    check_float_dtype("dtype", dtype, (torch.float32, torch.float64))
    config = dict(qk_norms=qk_norms, num_hiddens=num_hiddens, num_heads=num_heads, num_steps=num_steps,
                  seed=seed, dtype=str(dtype).replace("torch.", ""))
    with seeded(seed + 1):
        X = torch.randn(1, num_steps, num_hiddens, dtype=torch.float64).to(dtype)
        R = torch.randn(1, num_steps, num_hiddens, dtype=torch.float64).to(dtype)
    result = LogitScaleSweep(scales=list(scales), max_entropy=math.log(num_steps), config=config)
    for qk_norm in qk_norms:
        base = make_attention(qk_norm, num_hiddens, num_heads, seed).to(dtype)
        series = {name: [] for name in LogitScaleSweep.SERIES}
        for s in scales:
            measured = saturation_probe(scale_qk_(copy.deepcopy(base), s), X, R)
            for name in LogitScaleSweep.SERIES:
                series[name].append(measured[name])
        for name, values in series.items():
            getattr(result, name)[qk_norm] = values
    return result


def _check_probe_layer(layer) -> None:
    """Raise ValueError unless ``layer`` is what :func:`saturation_probe` computes by hand."""
    _check_attention(layer)
    if layer.causal or layer.num_kv_heads != layer.num_heads or layer.scale is not None \
            or type(layer) is not MultiHeadAttention:
        raise ValueError("saturation_probe needs a bidirectional MultiHeadAttention (not a subclass) with one key "
                         "head per query head and the scale 1/sqrt(d_h) (make_attention's defaults)")


@shown_in("ch06")
def saturation_probe(
    layer: MultiHeadAttention, X: torch.Tensor, R: torch.Tensor
) -> dict:
    """One layer's softmax saturation: entropy, logits, gradients at q, k, v and W_q.

    Runs ``layer`` (bidirectional, one key head per query head: :func:`make_attention`)
    on ``X`` ``(b, n, d)`` as its ``forward`` does, and differentiates the read-out loss
    ``sum(Y * R) / sqrt(Y.numel())`` (``R`` a fixed random tensor like ``X``). Returns
    the keys of :attr:`LogitScaleSweep.SERIES` (Dehghani et al., 2023). Chapter "QK-norm".
    Raises ValueError for another kind of layer; errors on bad shapes propagate.
    """
    # bidirectional, one key head per query head, scale 1/sqrt(d_h)
    _check_probe_layer(layer)
    # (b, h, n, d_h), QK-normalized if the layer has it
    q, k = layer.queries_and_keys(X, X)
    v = layer.W_v(X).unflatten(-1, (layer.num_heads, layer.head_dim)).transpose(1, 2)
    logits = q @ k.transpose(-1, -2) / layer.head_dim**0.5  # no mask
    weights = torch.softmax(logits, dim=-1)
    Y = layer.W_o((weights @ v).transpose(1, 2).flatten(-2))  # (b, n, d)
    loss = (Y * R).sum() / math.sqrt(Y.numel())  # the fixed random read-out
    g_q, g_k, g_v, g_W_q = torch.autograd.grad(loss, (q, k, v, layer.W_q.weight))
    # one per head and token
    per_q, per_k = g_q.norm(dim=-1).flatten(), g_k.norm(dim=-1).flatten()
    return {
        "entropy": float(attention_entropy(weights.detach()).mean()),
        "max_logit": float(logits.detach().max()),
        "rms_logit": float(logits.detach().pow(2).mean().sqrt()),
        "grad_q": float(per_q.median()),
        "grad_k": float(per_k.median()),
        "zero_q": float((per_q == 0).double().mean()),
        "grad_W_q": float(g_W_q.norm()),
        "grad_v": float(g_v.norm()),
    }


def plot_logit_scale_sweep(result: LogitScaleSweep, floor: float = 1e-20, mark: float | None = None,
                           width: float = 8.0, height: float = 3.0):
    """Attention entropy (left) and the typical gradient at ``q`` and ``k`` (right) against ``s``.

    Args:
        result: a :class:`LogitScaleSweep`.
        floor: bottom of the gradient axis; smaller values, down to exactly zero,
            are drawn as open triangles on it.
        mark: if given, a dashed vertical line at that scale.
        width, height: figure size in inches.

    Returns:
        A pyplot-free ``matplotlib.figure.Figure``.
    """
    floor = check_positive_float("floor", floor)
    with styled_figure(2, width=width, height=height) as (fig, (ax_h, ax_g)):
        for qk_norm in result.entropy:
            color, label = QK_COLORS.get(qk_norm), QK_LABELS.get(qk_norm, str(qk_norm))
            ax_h.plot(result.scales, result.entropy[qk_norm], marker="o", markersize=3.5, color=color,
                      label=label)
            for name, style in (("grad_q", "-"), ("grad_k", "--")):
                values = getattr(result, name)[qk_norm]
                shown = [max(g, floor) for g in values]
                ax_g.plot(result.scales, shown, linestyle=style, color=color, label=f"{label}: {name[-1]}")
                below = [(s, floor) for s, g in zip(result.scales, values) if g < floor]
                if below:
                    ax_g.plot(*zip(*below), linestyle="none", marker="v", markersize=6, color=color,
                              markerfacecolor="white", clip_on=False)
        ax_h.axhline(result.max_entropy, color="0.4", linestyle=":", linewidth=1.2)
        ax_h.text(result.scales[-1], result.max_entropy, "uniform: log n ", ha="right", va="bottom", fontsize=9,
                  color="0.3")
        ax_h.set(xlabel="scale s of $W_q$ and $W_k$", ylabel="entropy (nats)", title="Attention entropy",
                 ylim=(0, result.max_entropy * 1.15))
        ax_g.set_yscale("log")
        ax_g.set(xlabel="scale s of $W_q$ and $W_k$", ylabel="median per-token gradient",
                 title="Gradient reaching q and k", ylim=(floor / 3, None))
        ticks = [t for t in (1 / 16, 1 / 4, 1, 4, 16, 64, 256, 1024)
                 if min(result.scales) <= t <= max(result.scales)]
        for ax in (ax_h, ax_g):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            if mark is not None:
                ax.axvline(mark, color="0.4", linestyle="--", linewidth=1)
        ax_h.legend(loc="lower left")
        ax_g.legend(loc="lower left", fontsize=8.5)
    return fig


# --------------------------------------------------------------------------- QK-norm and RoPE


@dataclass
class RopeOrderCheck:
    """The result of :func:`rope_order_check`.

    Attributes:
        equal_gains: largest absolute attention-weight difference between norm-before-RoPE and
            norm-after-RoPE when every gain is 1 (as at initialization).
        unequal_gains: the same after the gains were drawn at random.
        shift_change: ``'before'``/``'after'`` -> largest absolute logit change between the same
            tokens when the whole sequence is shifted ``shift`` positions later (with
            random gains). RoPE makes logits depend only on relative positions, so
            the correct order gives rounding error only.
        config: the arguments of the run.
    """

    equal_gains: float
    unequal_gains: float
    _: KW_ONLY
    shift_change: dict
    config: dict


def rope_order_check(qk_norm: str = "per_head", num_hiddens: int = 64, num_heads: int = 4,
                     num_steps: int = 16, shift: int = 5, gain_spread: float = 0.5, rope_theta: float = 10000.0,
                     seed: int = 0, dtype: torch.dtype = torch.float64) -> RopeOrderCheck:
    """QK-norm before RoPE (right) versus after RoPE (a known bug), measured.

    RoPE rotates each pair of features ``(j, j + d_h/2)`` of a query or key by an
    angle that depends on its position. A rotation keeps the vector's length, so
    the RMS statistic is the same before and after it; but the norm's gain
    multiplies feature ``j`` and feature ``j + d_h/2`` by different numbers once
    the gains are not all equal, and that does not commute with the rotation.
    The function compares both orders on one random sequence:

    1. all gains 1 (initialization): the two orders agree to rounding error --
       which is why a test at initialization does not catch the bug;
    2. gains drawn from ``1 + gain_spread * N(0, 1)``: the attention weights differ;
    3. the relative-position test: prepend ``shift`` random tokens, so every
       original token sits ``shift`` positions later, and compare the logits among
       the original tokens. Norm before RoPE leaves them unchanged; norm after RoPE
       does not.

    Args:
        qk_norm: one of :data:`QK_NORMS`.
        num_hiddens, num_heads, num_steps: sizes; ``num_steps`` >= 2.
        shift: positions to shift by (>= 1).
        gain_spread: standard deviation of the random gains around 1 (> 0).
        rope_theta: RoPE base.
        seed: seeds the layer, the gains and the tokens.
        dtype: float64 by default, so that "equal" means equal to ~1e-15.

    Returns:
        A :class:`RopeOrderCheck`.

    Raises:
        ValueError / TypeError: for invalid arguments.
    """
    qk_norm = check_choice("qk_norm", qk_norm, QK_NORMS)
    num_steps, shift = check_int_at_least("num_steps", num_steps, 2), check_positive_int("shift", shift)
    gain_spread = check_positive_float("gain_spread", gain_spread)
    _check_seed(seed)
    check_float_dtype("dtype", dtype, (torch.float32, torch.float64))
    config = dict(qk_norm=qk_norm, num_hiddens=num_hiddens, num_heads=num_heads, num_steps=num_steps,
                  shift=shift, gain_spread=gain_spread, rope_theta=rope_theta, seed=seed,
                  dtype=str(dtype).replace("torch.", ""))
    layer = make_attention(qk_norm, num_hiddens, num_heads, seed, rope_theta=rope_theta).to(dtype)
    with seeded(seed + 1):
        X = torch.randn(1, num_steps + shift, num_hiddens, dtype=dtype)
        gains = [1 + gain_spread * torch.randn(norm.weight.shape, dtype=dtype)
                 for norm in (layer.q_norm, layer.k_norm)]

    equal = rope_order_gaps(layer, X, shift)["weights"]
    with torch.no_grad():
        for norm, gain in zip((layer.q_norm, layer.k_norm), gains):
            norm.weight.copy_(gain)
    gaps = rope_order_gaps(layer, X, shift)
    change = {"before": gaps["before"], "after": gaps["after"]}
    return RopeOrderCheck(equal_gains=equal, unequal_gains=gaps["weights"], shift_change=change, config=config)


def rope_order_gaps(layer: MultiHeadAttention, X: torch.Tensor, shift: int) -> dict:
    """QK-norm before RoPE against after RoPE, on ``layer`` (with QK-norm and RoPE).

    ``X`` is ``(b, shift + n, d)``: the last ``n`` tokens are the sequence, the first
    ``shift`` a prefix that moves it ``shift`` positions later (Su et al., 2021).
    Returns ``"weights"``, the largest attention-weight difference between the two
    orders on the sequence alone, and ``"before"`` / ``"after"``, the largest change
    of the logits among the sequence's tokens when the prefix is added, in each order.
    Chapter "QK-norm". Raises ValueError (from :func:`attention_logits`) without RoPE.
    """
    tokens, orders = X[:, shift:], {"before": False, "after": True}
    with torch.no_grad():
        logits = {name: attention_logits(layer, tokens, norm_after_rope=after) for name, after in orders.items()}
        weights = {name: torch.softmax(z, dim=-1) for name, z in logits.items()}
        gaps = {"weights": float((weights["before"] - weights["after"]).abs().max())}
        for name, after in orders.items():
            shifted = attention_logits(layer, X, norm_after_rope=after)[..., shift:, shift:]
            gaps[name] = float((logits[name] - shifted).abs().max())
    return gaps


# --------------------------------------------------------------------------- training at a high learning rate


def logit_statistics(attention: MultiHeadAttention, X: torch.Tensor) -> tuple[float, float]:
    """The largest attention logit of ``attention`` on ``X`` and its mean attention entropy.

    Recomputes, without gradient, the logits ``attention`` feeds its softmax for the
    self-attention of ``X`` ``(b, n, d)`` (:func:`attention_logits`), masks the future
    if the module is causal, and returns the largest logit and the entropy in nats
    averaged over heads and queries (the growth Wortsman et al., 2023 track).
    Chapter "QK-norm". Raises TypeError / ValueError as :func:`attention_logits`.
    """
    with torch.no_grad():
        logits = attention_logits(attention, X)
        if attention.causal:
            n = logits.shape[-1]
            visible = torch.ones(n, n, dtype=torch.bool, device=logits.device).tril()
            logits = logits.masked_fill(~visible, float("-inf"))
        entropy = attention_entropy(torch.softmax(logits.float(), dim=-1)).mean()
        return float(logits.max()), float(entropy)


class LogitRecorder:
    """Forward pre-hooks that record the largest causal attention logit of every attention module.

    Attach it to a model built from :class:`~d2lmini.block.TransformerBlock`
    (every ``MultiHeadAttention`` inside is hooked). On each forward pass it
    recomputes, without gradient, the scaled logits of every attention module
    with :func:`attention_logits` (only self-attention is recorded; the causal
    mask is applied when the module is causal) and stores their maximum and the
    mean attention entropy per module, in module order. The model's outputs and
    gradients are unchanged; the cost is one extra ``W_q``, ``W_k`` projection
    and logit product per module.

    Attributes:
        max_logit, entropy: lists, one float per hooked module, of the last forward pass.

    Use as a context manager (``with LogitRecorder(model) as rec: ...``) or call
    :meth:`remove` when done.
    """

    def __init__(self, model: nn.Module):
        modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
        if not modules:
            raise ValueError("model contains no MultiHeadAttention module to record")
        self.max_logit: list[float] = [math.nan] * len(modules)
        self.entropy: list[float] = [math.nan] * len(modules)
        self._handles = [m.register_forward_pre_hook(self._hook(i)) for i, m in enumerate(modules)]

    def _hook(self, index: int):
        def hook(module, args):
            queries, keys = args[0], args[1]
            if queries is not keys:
                return
            self.max_logit[index], self.entropy[index] = logit_statistics(module, queries)
        return hook

    def remove(self) -> None:
        """Detach every hook."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> "LogitRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


@dataclass
class LogitTrainResult:
    """One :func:`train_with_logit_probe` run.

    Attributes:
        config: the arguments of the run.
        train_loss: cross-entropy (nats per character) of every step's batch.
        max_logit: per step, the largest causal attention logit over all layers and
            heads (measured in the forward pass of that step, before the update).
        max_logit_per_layer: per step, one float per layer.
        entropy: per step, the mean attention entropy (nats) over layers, heads and queries.
        val_loss: validation loss after the last step (nats per character).
        qk_gains: all QK-norm gain entries (every layer, queries and keys) after the
            last step, flattened; empty without QK-norm. They start at 1.
        diverged: whether a loss became NaN or infinite (training then stopped).
        seconds: wall time of the run.
    """

    config: dict
    train_loss: list[float] = field(default_factory=list)
    max_logit: list[float] = field(default_factory=list)
    max_logit_per_layer: list[list[float]] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    val_loss: float = math.nan
    qk_gains: list[float] = field(default_factory=list)
    diverged: bool = False
    seconds: float = 0.0

    def smoothed(self, window: int = 20) -> list[float]:
        """Training loss averaged over the last ``window`` steps at every step."""
        from ..train import moving_average

        return moving_average(self.train_loss, window)


def train_with_logit_probe(corpus, qk_norm: str | None = None, lr: float = 3e-2, num_steps: int = 200,
                           batch_size: int = 32, seq_len: int = 64, num_hiddens: int = 64, num_heads: int = 4,
                           num_layers: int = 2, rope_theta: float | None = 10000.0,
                           betas: tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.0,
                           eval_batches: int = 8, seed: int = 0, **model_kwargs) -> LogitTrainResult:
    """Train :class:`~d2lmini.train.TinyLM` exactly as :func:`d2lmini.train.train_lm` does, recording attention logits.

    :func:`train_seeds_with_logit_probe` with the one seed ``seed`` (see there for the arguments).

    Returns:
        A :class:`LogitTrainResult`.

    Raises:
        ValueError / TypeError: for invalid arguments.
    """
    return train_seeds_with_logit_probe(corpus, qk_norm, lr, num_steps, batch_size, seq_len, num_hiddens, num_heads,
                                        num_layers, rope_theta, betas, weight_decay, eval_batches, seeds=(seed,),
                                        **model_kwargs)[0]


def train_seeds_with_logit_probe(corpus=None, qk_norm: str | None = None, lr: float = 3e-2, num_steps: int = 200,
                                 batch_size: int = 32, seq_len: int = 64, num_hiddens: int = 64, num_heads: int = 4,
                                 num_layers: int = 2, rope_theta: float | None = 10000.0,
                                 betas: tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.0,
                                 eval_batches: int = 8, seeds=(0, 1), **model_kwargs) -> list[LogitTrainResult]:
    """Train one :class:`~d2lmini.train.TinyLM` per seed in one lockstep, recording attention logits.

    The loop of :func:`d2lmini.train.train_lm` (:func:`d2lmini.train.train_models`): each model's
    weights and batches come from its seed, AdamW at a constant learning rate with no warm-up
    and no clipping -- every model gets the losses ``train_lm`` gives it alone with the same
    arguments. The probe is a :class:`LogitRecorder` attached to each model, which measures the
    logits during each step's forward pass, and a per-step hook that stores what it measured.

    Args:
        corpus: a :class:`~d2lmini.data.CharCorpus`, or None for
            :func:`d2lmini.data.python_reference_corpus`.
        qk_norm: ``None`` or one of :data:`QK_NORMS`.
        lr: the learning rate (constant).
        num_steps, batch_size, seq_len: the run.
        num_hiddens, num_heads, num_layers, rope_theta: the model (RoPE by default,
            as in Qwen3 and OLMo 2).
        betas, weight_decay: AdamW's.
        eval_batches: validation batches measured after the last step.
        seeds: distinct ints, one model each.
        **model_kwargs: passed to ``TinyLM`` (``norm``, ``act``, ``placement``, ...).

    Returns:
        One :class:`LogitTrainResult` per seed, in order.

    Raises:
        ValueError / TypeError: for invalid arguments.
    """
    from ..data import python_reference_corpus
    from ..train import seeded_tiny_lm

    qk_norm = _check_qk_norm("qk_norm", qk_norm)
    seeds = check_seeds(seeds)
    seq_len = check_positive_int("seq_len", seq_len)  # also the model's max_len
    eval_batches = check_positive_int("eval_batches", eval_batches)
    corpus = python_reference_corpus() if corpus is None else corpus
    start = time.perf_counter()
    results, models = [], []
    for seed in seeds:
        results.append(LogitTrainResult(dict(
            qk_norm=qk_norm, lr=lr, num_steps=num_steps, batch_size=batch_size, seq_len=seq_len,
            num_hiddens=num_hiddens, num_heads=num_heads, num_layers=num_layers, rope_theta=rope_theta,
            betas=betas, weight_decay=weight_decay, seed=seed, **model_kwargs)))
        models.append(seeded_tiny_lm(corpus.vocab_size, seed, num_hiddens=num_hiddens, num_heads=num_heads,
                                     num_layers=num_layers, max_len=seq_len, qk_norm=qk_norm,
                                     rope_theta=rope_theta, **model_kwargs))
    probed_training(models, corpus, results, seeds, num_steps, batch_size, seq_len, lr, betas, weight_decay,
                    eval_batches)
    for result in results:
        result.seconds = time.perf_counter() - start
    return results


@shown_in("ch06")
def probed_training(models, corpus, results, seeds, num_steps, batch_size, seq_len, lr,
                    betas, weight_decay, eval_batches):
    """The measuring core of :func:`train_seeds_with_logit_probe`: train ``models``, filling ``results``.

    :func:`d2lmini.train.train_models` runs the steps (AdamW on each batch's
    cross-entropy, all models in lockstep); a :class:`LogitRecorder` on each model measures
    every layer's logits in each step's forward pass, and ``record`` stores them after the
    step. Then the validation losses and the QK-norm gains. Returns ``results``.
    Chapter "QK-norm".
    """
    from ..train import evaluate, train_models

    def record(step, models, losses):  # called after every step
        for recorder, result in zip(recorders, results):
            result.max_logit_per_layer.append(list(recorder.max_logit))
            result.max_logit.append(max(recorder.max_logit))
            result.entropy.append(sum(recorder.entropy) / len(recorder.entropy))

    recorders = [LogitRecorder(model) for model in models]
    log = train_models(models, corpus, seeds, num_steps, batch_size, seq_len, lr,
                       betas=betas, weight_decay=weight_decay, on_step=record)
    for recorder, model, result, losses in zip(recorders, models, results, log.losses):
        recorder.remove()
        result.train_loss = losses
        result.diverged = not all(math.isfinite(loss) for loss in losses)
        if not result.diverged:
            result.val_loss = evaluate(model, corpus, batch_size, seq_len, eval_batches)
        result.qk_gains = [float(w) for m in model.modules()
                           if isinstance(m, MultiHeadAttention) if m.q_norm is not None
                           for norm in (m.q_norm, m.k_norm)
                           for w in norm.weight.detach().flatten()]
    return results


def qk_norm_training(corpus=None, qk_norms=(None, "per_head"), lr: float = 3e-2, num_steps: int = 200,
                     seed: int = 0, **kwargs) -> dict:
    """The same tiny language model trained at a high learning rate with and without QK-norm.

    One :func:`train_with_logit_probe` run per setting in ``qk_norms``, with the
    same seed (so the same initial projections and the same batches) and the same
    settings otherwise -- the small-scale experiment of Wortsman et al. (2023).

    Args:
        corpus: a :class:`~d2lmini.data.CharCorpus` (default
            :func:`d2lmini.data.python_reference_corpus`).
        qk_norms: settings to train: ``None`` and/or names in :data:`QK_NORMS`.
        lr, num_steps, seed: as in :func:`train_with_logit_probe`.
        **kwargs: passed to :func:`train_with_logit_probe` (model size, batch, ...).

    Returns:
        ``{qk_norm: LogitTrainResult}`` in the order of ``qk_norms``.

    Raises:
        ValueError / TypeError: for invalid arguments.
    """
    from ..data import python_reference_corpus

    qk_norms = tuple(_check_qk_norm("qk_norms", q) for q in qk_norms)
    if not qk_norms:
        raise ValueError("qk_norms must name at least one setting (None or a QK_NORMS variant)")
    if "qk_norm" in kwargs:
        raise TypeError("qk_norm_training sets qk_norm itself; pass qk_norms=(...)")
    corpus = python_reference_corpus() if corpus is None else corpus
    return {qk_norm: train_with_logit_probe(corpus, qk_norm, lr=lr, num_steps=num_steps, seed=seed, **kwargs)
            for qk_norm in qk_norms}


def qk_norm_regimes(corpus=None, rates=(3e-2, 3e-3), seeds=(0, 1), qk_norms=(None, "per_head"),
                    num_workers: int = 2, **kwargs) -> dict:
    """The tiny language model with and without QK-norm, at several learning rates and seeds.

    One :func:`train_seeds_with_logit_probe` lockstep (all seeds) per rate and setting, the
    lockstep groups spread over ``num_workers`` processes of one torch thread
    (:func:`d2lmini.train.run_in_workers`; the numbers are the same whatever ``num_workers``):
    at a high constant rate the unnormalized model's attention logits grow and its loss falls
    behind, at a modest one the two settings train alike (Wortsman et al., 2023). Every
    setting of one seed starts from the same projections and sees the same batches.

    Args:
        corpus: a :class:`~d2lmini.data.CharCorpus` (default
            :func:`d2lmini.data.python_reference_corpus`, loaded in each worker).
        rates: constant learning rates, each > 0.
        seeds: distinct ints >= 0; each seeds the weights and the batches of its runs.
        qk_norms: settings to train: ``None`` and/or names in :data:`QK_NORMS`.
        num_workers: processes, ``>= 1``.
        **kwargs: passed to :func:`train_seeds_with_logit_probe` (``num_steps``, model size, ...).

    Returns:
        ``{(lr, qk_norm, seed): LogitTrainResult}``, rates outermost, then seeds, then settings.

    Raises:
        ValueError / TypeError: for invalid rates, seeds or other arguments.
    """
    from ..train import run_in_workers

    rates, seeds = check_positive_floats("rates", rates), check_seeds(seeds)
    qk_norms = tuple(_check_qk_norm("qk_norms", q) for q in qk_norms)
    if not qk_norms:
        raise ValueError("qk_norms must name at least one setting (None or a QK_NORMS variant)")
    if "qk_norm" in kwargs or "lr" in kwargs:
        raise TypeError("qk_norm_regimes sets qk_norm and lr itself; pass qk_norms=(...) and rates=(...)")
    groups = [(lr, qk_norm) for lr in rates for qk_norm in qk_norms]
    jobs = [dict(corpus=corpus, qk_norm=qk_norm, lr=lr, seeds=seeds, **kwargs) for lr, qk_norm in groups]
    trained = dict(zip(groups, run_in_workers(train_seeds_with_logit_probe, jobs, num_workers)))
    return {(lr, qk_norm, seed): trained[lr, qk_norm][i] for lr in rates for i, seed in enumerate(seeds)
            for qk_norm in qk_norms}


def regime_rows(runs: dict) -> list[dict]:
    """One row per run of :func:`qk_norm_regimes`: ``lr``, ``qk_norm`` (its label), ``seed``,
    ``val_loss`` and ``peak_logit`` (the largest attention logit over all steps).

    Raises:
        TypeError: if ``runs`` is not a dict of :class:`LogitTrainResult` keyed by ``(lr, qk_norm, seed)``.
    """
    if not isinstance(runs, dict) or not all(isinstance(key, tuple) and len(key) == 3 and
                                             isinstance(run, LogitTrainResult) for key, run in runs.items()):
        raise TypeError("runs must be the dict qk_norm_regimes returns")
    return [{"lr": lr, "qk_norm": QK_LABELS.get(qk_norm, str(qk_norm)), "seed": seed, "val_loss": run.val_loss,
             "peak_logit": max(run.max_logit)} for (lr, qk_norm, seed), run in runs.items()]


def plot_qk_norm_regimes(runs: dict, seed: int = 0, window: int = 20, width: float = 8.0, height: float = 3.2):
    """Largest attention logit (left, log scale) and training loss (right) against the step, for one seed.

    Colour: the QK-norm setting; solid line: the highest rate in ``runs``, dashed: the others.

    Args:
        runs: ``{(lr, qk_norm, seed): LogitTrainResult}`` from :func:`qk_norm_regimes`.
        seed: which seed's runs to draw.
        window: moving-average window of the loss, in steps.
        width, height: figure size in inches.

    Returns:
        A pyplot-free ``matplotlib.figure.Figure``.

    Raises:
        ValueError: if ``runs`` holds no run of ``seed``.
    """
    chosen = {(lr, qk): run for (lr, qk, s), run in runs.items() if s == seed}
    if not chosen:
        raise ValueError(f"runs holds no run with seed {seed!r}")
    top = max(lr for lr, _ in chosen)
    with styled_figure(2, width=width, height=height) as (fig, (ax_l, ax_loss)):
        for (lr, qk_norm), run in chosen.items():
            style = dict(color=QK_COLORS.get(qk_norm), linestyle="-" if lr == top else "--",
                         label=f"{QK_LABELS.get(qk_norm, str(qk_norm))}, lr {lr:g}")
            steps = range(1, len(run.train_loss) + 1)
            ax_l.semilogy(steps, run.max_logit, **style)
            ax_loss.plot(steps, run.smoothed(window), **style)
        finite = [v for run in chosen.values() for v in run.smoothed(window)[len(run.train_loss) // 10:]
                  if math.isfinite(v)]
        if finite:  # leave out the steep start so the gaps are visible
            low, high = min(finite), max(finite)
            ax_loss.set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))
        ax_l.set(xlabel="training step", ylabel=r"max $q\cdot k/\sqrt{d_h}$", title="Largest attention logit")
        ax_loss.set(xlabel="training step", ylabel=f"loss (nats/char, {window}-step mean)",
                    title="Training loss")
        ax_loss.legend(loc="upper right", fontsize=8.5)  # the loss panel's upper right is empty
    return fig


__all__ = [
    "LogitRecorder", "LogitScaleSweep", "LogitTrainResult",
    "RopeOrderCheck", "attention_entropy", "attention_logits", "log_spaced_scales", "logit_scale_sweep",
    "logit_statistics", "make_attention", "plot_logit_scale_sweep", "plot_qk_norm_regimes", "qk_norm_training",
    "qk_norm_regimes", "regime_rows", "rope_order_check", "rope_order_gaps", "saturation_probe", "scale_qk_",
    "train_seeds_with_logit_probe", "train_with_logit_probe",
]


def qk_scale_explorer(scales=None, qk_norms=(None, "per_head"), scale: float = 1.0, num_hiddens: int = 64,
                      num_heads: int = 4, num_steps: int = 64, seed: int = 0) -> FrameExplorer:
    """Explorer for the chapter "QK-norm": the logit scale ``s`` on ``W_q, W_k``, with or without QK-norm.

    Uses :func:`d2lmini.chapters.ch06_qk_norm.logit_scale_sweep` for the entropy and the gradient
    reaching the queries at every ``s``, and shows, for the chosen ``s``, how one
    query (head 1) spreads its attention over the keys of a random sequence.

    Args:
        scales: the slider's stops (default :func:`d2lmini.chapters.ch06_qk_norm.log_spaced_scales`,
            0.25 to 64, two per octave).
        qk_norms: the settings in the dropdown (``None`` = no QK-norm).
        scale: initial ``s`` (the nearest stop is used).
        num_hiddens, num_heads, num_steps, seed: the layer and the sequence.

    Returns:
        A :class:`FrameExplorer`; display it for the live view, ``.static()`` for the twin.
    """
    import torch

    scales = list(scales or log_spaced_scales(0.25, 64.0, 2))
    sweep = logit_scale_sweep(scales, qk_norms, num_hiddens=num_hiddens, num_heads=num_heads,
                              num_steps=num_steps, seed=seed)
    with seeded(seed + 1):
        X = torch.randn(1, num_steps, num_hiddens)
    log2 = [math.log2(s) for s in scales]
    step = (log2[-1] - log2[0]) / max(1, len(scales) - 1)
    frames = {}
    for qk in qk_norms:
        name = "none" if qk is None else qk
        for i, s in enumerate(scales):
            attention = scale_qk_(make_attention(qk, num_hiddens, num_heads, seed), s)
            with torch.no_grad():
                weights = torch.softmax(attention_logits(attention, X), dim=-1)[0, 0, 0]
            row = sweep.at(s, qk)
            frames[f"{s:.3g}|{name}"] = dict(
                title=(f"s = {s:g}, {QK_LABELS[qk]}: entropy {row['entropy']:.2f} nats "
                       f"(uniform {sweep.max_entropy:.2f}), max logit {row['max_logit']:.3g}, "
                       f"median query gradient {row['grad_q']:.1e}"),
                panels=[[dict(y=round_frame_values(weights.tolist()), x0=0, color=QK_COLORS[qk])],
                        [dict(y=round_frame_values(sweep.entropy[qk][:i + 1]), x0=log2[0], dx=step, color=QK_COLORS[qk])],
                        [dict(y=round_frame_values(sweep.grad_q[qk][:i + 1]), x0=log2[0], dx=step, color=QK_COLORS[qk])]])
    initial = min(scales, key=lambda s: abs(math.log(s / scale)))
    controls = [dict(name="scale", label="scale s", type="range", values=[f"{s:.3g}" for s in scales],
                     value=f"{initial:.3g}"),
                dict(name="qk_norm", label="", type="select", value="none" if qk_norms[0] is None else qk_norms[0],
                     options=[["none" if q is None else q, QK_LABELS[q]] for q in qk_norms])]
    grads = [g for q in qk_norms for g in sweep.grad_q[q] if g > 0]
    panels = [dict(title="Attention of one query", xlabel="key position", ylabel="attention weight", log=False,
                   xmin=0, xmax=num_steps - 1, ymin=0, ymax=1),
              dict(title="Attention entropy", xlabel="log2 s", ylabel="entropy (nats)", log=False,
                   xmin=log2[0], xmax=log2[-1], ymin=0, ymax=1.05 * sweep.max_entropy),
              dict(title="Gradient reaching a query", xlabel="log2 s", ylabel="median per-token gradient",
                   log=True, xmin=log2[0], xmax=log2[-1],
                   ymin=max(1e-16, 10 ** math.floor(math.log10(min(grads)))) if grads else 1e-12,
                   ymax=10 ** math.ceil(math.log10(max(grads))) if grads else 1.0)]
    return FrameExplorer(controls, panels, frames=frames,
                         description="Attention entropy and query gradients as W_q and W_k are scaled")
