r"""Beyond one residual stream: the experiments of the chapter "Beyond one residual stream".

* :func:`mixing_matrices`, :func:`product_gains`, :func:`mixing_sweep`, :func:`mixing_table`
  and :func:`plot_mixing_products` -- what a stack of residual mixings ``H^res`` does to
  the streams: doubly stochastic (Sinkhorn-Knopp, mHC) or unconstrained near the
  identity (hyper-connections' starting point);
* :func:`first_block`, :func:`regime_table` and :func:`v4_logit_std` -- one fresh mHC block
  at a small width and at DeepSeek-V4-Flash's: how far its mappings are from their centres;
* :func:`probe_streams` -- chapter 4's depth experiment at initialization for pre-LN and
  for manifold-constrained hyper-connections (mHC) with several numbers of streams
  (the measurement itself is :func:`d2lmini.probes.probe_depth` with ``placement='mhc'``);
* :func:`stream_divergence` -- how far the streams of that mHC stack drift apart;
* :func:`compare_with_deepseek_v4` -- :mod:`d2lmini.hyper` against DeepSeek-V4's layers
  in the installed Hugging Face ``transformers`` (used by the tests);
* :func:`hyper_depth_explorer` and :func:`hyper_depth_explorer_static` -- chapter 4's depth
  explorer with pre-LN, mHC and a streams slider, live and pre-computed.

Sources: Zhu et al. (2024), "Hyper-Connections"; Xie et al. (2025), "mHC:
Manifold-Constrained Hyper-Connections"; DeepSeek-AI (2026), DeepSeek-V4.
"""

from __future__ import annotations

import math
import re

import torch

from .._checks import check_choice, check_int_at_least, check_int_sequence, check_positive_float, check_positive_int, check_seed
from .._shown import shown_in
from ..hyper import INIT_STD, HyperConnectedBlock, HyperConnection, HyperHead, expand_streams, sinkhorn_knopp
from ..plot import styled_figure
from ..probes import HYPER_PLACEMENT, init_linear_weights_, probe_depth
from ..reference import output_and_grad_differences, randomize_, tiny_config
from ..seeding import seeded
from .ch04_norm_placement import EXPLORED_STREAMS, DepthExplorer, depth_explorer_static

#: The residual mixings compared by :func:`mixing_matrices`, in the order shown.
MIXINGS = ("sinkhorn", "hc")
#: Their names in legends and tables.
MIXING_LABELS = {"sinkhorn": "mHC (Sinkhorn-Knopp)", "hc": "HC-style (I + s Z)"}
MIXING_COLORS = {"sinkhorn": "#17a589", "hc": "#c0392b"}


@shown_in("ch10")
def probe_streams(depth: int = 32, streams=(1, 2, 4, 8), **kwargs) -> dict:
    """Chapter 4's depth experiment for pre-LN and for mHC stacks of several widths.

    Every stack uses RMSNorm (mHC's blocks do) and everything else alike: one
    :func:`~d2lmini.probes.probe_depth` per configuration, same seed, sizes and weights' distribution.

    Args:
        depth: blocks in every stack.
        streams: numbers of streams ``n`` of the mHC stacks (ints >= 1).
        **kwargs: passed to :func:`~d2lmini.probes.probe_depth` (sizes, ``act``, ``seed``, ``dtype``, ...).

    Returns:
        ``{"pre": DepthProbe, n: DepthProbe for each n in streams}``.
    """
    probes = {"pre": probe_depth("pre", norm="rms", depth=depth, **kwargs)}
    for n in check_int_sequence("streams", streams, minimum=1, distinct=True):
        probes[n] = probe_depth(
            HYPER_PLACEMENT, norm="rms", depth=depth, num_streams=n, **kwargs
        )
    return probes


@shown_in("ch10")
def stream_divergence(depth: int = 32, num_streams: int = 4, num_hiddens: int = 128,
                      num_heads: int = 4, num_steps: int = 64, act: str = "relu",
                      init: str = "xavier_uniform", dtype: torch.dtype = torch.float64,
                      seed: int = 0) -> list[float]:
    """How far the streams of :func:`probe_streams`' mHC stack are from their mean, after every block.

    Rebuilds the stack of ``probe_depth('mhc', ...)`` with the same arguments (the same draws:
    the unused head is drawn only to keep them aligned) and returns, for blocks ``1..depth``,
    ``RMS(X - mean over streams) / RMS(X)`` over all tokens (0: equal streams).

    Raises:
        ValueError / TypeError: bad sizes, ``init`` or seed (as :func:`~d2lmini.probes.probe_depth`).
    """
    with seeded(check_seed(seed)):  # the draws of probe_depth, in its order
        blocks = []
        for _ in range(depth):  # a block, then its weights, as probe_depth draws them
            block = HyperConnectedBlock(num_hiddens, num_heads, num_streams=num_streams,
                                        act=act)
            blocks.append(init_linear_weights_(block, init))
        HyperHead(num_hiddens, num_streams)  # drawn by probe_depth before the input
        X = torch.randn(1, num_steps, num_hiddens, dtype=torch.float32).to(dtype)
    X = expand_streams(X, num_streams)  # (1, steps, streams, d), equal streams
    gaps = []
    with torch.no_grad():
        for block in blocks:
            X = block.to(dtype)(X)
            deviation = X - X.mean(dim=2, keepdim=True)  # each stream minus their mean
            gaps.append(float(deviation.pow(2).mean().sqrt() / X.pow(2).mean().sqrt()))
    return gaps


def streams_table(probes: dict, ks=(8, 16, 32)):
    """The measurements of :func:`probe_streams` at depths ``ks`` as a pandas DataFrame.

    Returns:
        ``pandas.DataFrame`` indexed by (stack, k): ``"pre-LN"`` or ``"mHC, n = 4"``, ...;
        columns stream RMS, token spread and the q,k : v,o gradient ratio
        (:meth:`~d2lmini.probes.DepthProbe.qk_vo_ratio`).
    """
    import pandas as pd

    rows = {}
    for name, probe in probes.items():
        for k in ks:
            row = probe.at(k)
            rows[("pre-LN" if name == "pre" else f"mHC, n = {name}", k)] = {
                "stream RMS": row["stream_rms"], "token spread": row["token_spread"], "q,k : v,o": row["qk_vo_ratio"]}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(["stack", "k"])


@shown_in("ch10")
def first_block(num_hiddens: int, num_heads: int, num_streams: int = 4,
                num_steps: int = 16, seed: int = 0) -> dict:
    """One fresh :class:`~d2lmini.hyper.HyperConnectedBlock` of width ``num_hiddens`` on equal streams.

    Attention and FFN (ReLU) drawn by Xavier-uniform, the mappings as ``transformers``'
    DeepSeek-V4 code draws them; the input is ``num_steps`` standard normal tokens copied
    into ``num_streams`` streams. Returns the logits' standard deviation (predicted,
    :func:`v4_logit_std`, and measured), the ranges ``(min, max)`` of the first
    connection's ``H^pre``, ``H^post`` and ``H^res`` entries over the tokens, and
    ``"apart"``: ``RMS(Y - mean over streams) / RMS(Y)`` of the block's output ``Y``.

    Raises:
        ValueError / TypeError: sizes that are not ints >= 1 (``num_steps`` >= 2), a bad seed.
    """
    with seeded(check_seed(seed)):
        block = HyperConnectedBlock(num_hiddens, num_heads, num_streams=num_streams,
                                    act="relu")
        block = init_linear_weights_(block, "xavier_uniform")
        num_steps = check_int_at_least("num_steps", num_steps, 2)
        X = expand_streams(torch.randn(1, num_steps, num_hiddens), num_streams)
    with torch.no_grad():
        # RMS-normalized, n d numbers
        flat = X.flatten(2) / X.flatten(2).pow(2).mean(dim=-1, keepdim=True).sqrt()
        logits = flat @ block.hc1.phi.T  # before alpha and bias (1 and 0 here)
        mappings = dict(zip(("H^pre", "H^post", "H^res"), block.hc1.mappings(X)))
        Y = block(X)
    apart = ((Y - Y.mean(dim=2, keepdim=True)).pow(2).mean().sqrt()
             / Y.pow(2).mean().sqrt())
    ranges = {name: (float(h.min()), float(h.max())) for name, h in mappings.items()}
    predicted = v4_logit_std(num_hiddens, num_streams)
    return {"d": num_hiddens, "logit std, predicted": predicted,
            "logit std, measured": float(logits.std()), **ranges, "apart": float(apart)}


def regime_table(results):
    """The dicts of :func:`first_block` as a table: one row per width, ranges as ``"min to max"``.

    Returns:
        ``pandas.DataFrame`` indexed by ``"d = ..."`` (one row per width: give distinct widths).
    """
    import pandas as pd

    rows = {}
    for r in results:
        rows[f"d = {r['d']}"] = {"logit std (0.02 sqrt(n d))": f"{r['logit std, predicted']:.2f}",
                                 "logit std, measured": f"{r['logit std, measured']:.2f}",
                                 **{name: f"{r[name][0]:.2f} to {r[name][1]:.2f}" for name in ("H^pre", "H^post", "H^res")},
                                 "streams apart after 1 block": f"{r['apart']:.1%}"}
    return pd.DataFrame.from_dict(rows, orient="index")


@shown_in("ch10")
def mixing_matrices(kind: str, depth: int, num_streams: int = 4, logit_std: float = 1.0,
                    num_stacks: int = 1, seed: int = 0) -> torch.Tensor:
    """Random residual mixings ``H^res`` for ``num_stacks`` stacks of ``depth`` layers, ``(stacks, depth, n, n)``, float64.

    One standard normal ``n x n`` draw ``Z`` per layer. ``'sinkhorn'``: mHC's mixing of the
    logits ``logit_std * Z``, :func:`~d2lmini.hyper.sinkhorn_knopp` transposed as
    :class:`~d2lmini.hyper.HyperConnection` uses it (rows and columns sum to 1).
    ``'hc'``: an unconstrained mixing near the identity, as hyper-connections (Zhu et al.,
    2024) start theirs, ``I + s Z`` with the same draws, ``s`` the standard deviation of
    the Sinkhorn mixings' entries around their centre ``1/n``: on average (the same RMS per
    entry) each HC-style mixing is as far from the identity as the mHC mixings are from ``J / n``.

    Raises:
        ValueError / TypeError: ``kind`` not in :data:`MIXINGS`; bad sizes, ``logit_std`` or seed.
    """
    check_choice("kind", kind, MIXINGS)
    depth = check_positive_int("depth", depth)
    n = check_positive_int("num_streams", num_streams)
    with seeded(check_seed(seed)):
        num_stacks = check_positive_int("num_stacks", num_stacks)
        Z = torch.randn(num_stacks, depth, n, n, dtype=torch.float64)
    logit_std = check_positive_float("logit_std", logit_std)
    mhc = sinkhorn_knopp(logit_std * Z).transpose(-1, -2)  # H^res = comb^T
    if kind == "sinkhorn":
        return mhc
    spread = (mhc - 1 / n).std()  # how far the mHC mixings are from their centre J / n
    # HC-style: as far from the identity
    return torch.eye(n, dtype=torch.float64) + spread * Z


@shown_in("ch10")
def product_gains(matrices: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the first ``k`` mixings of every stack do together: ``P_k = H_k ... H_2 H_1``, ``k = 1 .. depth``.

    ``matrices``: ``(stacks, depth, n, n)`` (or ``(depth, n, n)``, one stack). ``x_k = P_k x_0``
    when the sublayers add nothing. Returns ``{"spectral": ||P_k||_2``, the most that
    ``P_k`` can stretch the streams (its largest singular value); ``"mean_drift":
    max_j |sum_i (P_k)_ij - 1|``, how far ``P_k`` is from keeping the streams' mean (0 when
    every column sums to 1)``}``, each ``(stacks, depth)``.

    Raises:
        TypeError / ValueError: ``matrices`` not a floating tensor of square matrices, 3-D or 4-D.
    """
    _check_matrices(matrices)
    H = matrices if matrices.dim() == 4 else matrices.unsqueeze(0)
    # (stacks, n, n)
    P = torch.eye(H.shape[-1], dtype=H.dtype).expand(H.shape[0], -1, -1)
    spectral, drift = [], []
    for k in range(H.shape[1]):
        P = H[:, k] @ P
        spectral.append(torch.linalg.matrix_norm(P, ord=2))
        drift.append((P.sum(dim=-2) - 1).abs().amax(dim=-1))
    return {
        "spectral": torch.stack(spectral, dim=1),
        "mean_drift": torch.stack(drift, dim=1),
    }


def _check_matrices(matrices) -> None:
    if not isinstance(matrices, torch.Tensor) or not matrices.is_floating_point():
        raise TypeError(f"matrices must be a floating-point torch.Tensor, got "
                        f"{getattr(matrices, 'dtype', type(matrices).__name__)}")
    if matrices.dim() not in (3, 4) or matrices.shape[-1] != matrices.shape[-2]:
        raise ValueError(f"matrices must be (depth, n, n) or (stacks, depth, n, n), got shape {tuple(matrices.shape)}")


def mixing_sweep(logit_stds=(0.45, 2.56), kinds=MIXINGS, depth: int = 64, num_streams: int = 4,
                 num_stacks: int = 200, seed: int = 0) -> dict:
    """:func:`product_gains` of :func:`mixing_matrices` for every kind and logit scale.

    Returns:
        ``{(logit_std, kind): {"spectral": (stacks, depth), "mean_drift": (stacks, depth)}}``;
        the same draws (same seed) for every kind and scale.
    """
    return {(std, kind): product_gains(mixing_matrices(kind, depth, num_streams, std, num_stacks, seed))
            for std in logit_stds for kind in kinds}


def mixing_table(sweep: dict, ks=(1, 8, 64), names: dict | None = None):
    """The medians over the stacks of :func:`mixing_sweep`'s ``||P_k||_2`` at ``ks``, as a pandas DataFrame.

    Args:
        sweep: the dict of :func:`mixing_sweep`.
        ks: depths (1-based) of the columns.
        names: optional ``{logit_std: name}`` for the rows' first level.

    Returns:
        Indexed by (logit scale, mixing); columns ``||P_k||_2`` (the median over the stacks)
        for each ``k``, the largest ``||P_k||_2`` over every stack and depth, and the median
        column-sum error (``mean_drift``) of the deepest product.
    """
    import pandas as pd

    rows = {}
    for (std, kind), gains in sweep.items():
        spectral = gains["spectral"]
        row = {f"||P_{k}||": float(spectral[:, k - 1].median()) for k in ks}
        row["largest ||P_k||"] = float(spectral.max())
        row[f"column-sum error, k = {spectral.shape[1]}"] = float(gains["mean_drift"][:, -1].median())
        rows[((names or {}).get(std, f"logit std {std:.2f}"), MIXING_LABELS[kind])] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(["logits", "mixing"])


def v4_logit_std(num_hiddens: int, num_streams: int = 4) -> float:
    """The standard deviation of mHC's logits at ``transformers``' DeepSeek-V4 initialization: ``INIT_STD sqrt(n d)``.

    (``DeepseekV4PreTrainedModel._init_weights``, the library's random initialization.)

    The projection ``phi`` has ``N(0, INIT_STD^2)`` entries and reads the ``n d`` numbers of
    a token's streams after an RMSNorm (each of RMS 1), so every logit is a sum of ``n d``
    terms of variance ``INIT_STD^2`` (see :class:`~d2lmini.hyper.HyperConnection`).
    """
    return INIT_STD * math.sqrt(check_positive_int("num_streams", num_streams)
                                * check_positive_int("num_hiddens", num_hiddens))


def plot_mixing_products(sweep: dict, titles: dict | None = None, ymax: float = 1e4):
    """``||P_k||_2`` against the depth ``k``: one panel per logit scale, the median over the stacks and a 10-90% band.

    Args:
        sweep: the dict of :func:`mixing_sweep`.
        titles: optional ``{logit_std: panel title}``.
        ymax: top of the (log) y axis.

    Returns:
        A ``matplotlib.figure.Figure`` (log scale, a dotted line at 1).
    """
    stds = list(dict.fromkeys(std for std, _ in sweep))
    with styled_figure(len(stds), width=4.2 * len(stds), height=3.3) as (fig, axes):
        axes = axes if len(stds) > 1 else [axes]
        for ax, std in zip(axes, stds):
            for (s, kind), gains in sweep.items():
                if s == std:
                    spectral = gains["spectral"]
                    ks = range(1, spectral.shape[1] + 1)
                    low, mid, high = (spectral.quantile(q, dim=0).tolist() for q in (0.1, 0.5, 0.9))
                    ax.fill_between(ks, low, high, color=MIXING_COLORS[kind], alpha=0.2, linewidth=0)
                    ax.semilogy(ks, mid, color=MIXING_COLORS[kind], label=MIXING_LABELS[kind], linewidth=2)
            ax.axhline(1.0, color="0.4", linestyle=":", linewidth=1)
            ax.set_ylim(0.5, ymax)
            ax.set(xlabel="layers k", title=(titles or {}).get(std, f"logits of std {std:g}"))
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel(r"$\|H_k \cdots H_1\|_2$ (median, 10-90%)")
        axes[0].legend(loc="upper left", fontsize=8)
    return fig


def _v4_classes(num_hiddens: int, num_streams: int):
    """DeepSeek-V4's modeling module and its tiny config at this width and number of streams, or ``None``
    if ``transformers`` lacks it."""
    try:
        from transformers.models.deepseek_v4 import configuration_deepseek_v4 as c
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m
    except ImportError:
        return None
    return m, c.DeepseekV4Config(**tiny_config("deepseek_v4", hidden_size=num_hiddens, hc_mult=num_streams))


def _max_diff(run_a, run_b, X: torch.Tensor) -> tuple[float, float]:
    """Largest |difference| of the outputs of ``run_a`` and ``run_b`` on ``X``, and of the input gradients
    of one random read-out of the outputs (:func:`~d2lmini.reference.output_and_grad_differences`; a tuple
    of outputs is compared as one flat vector)."""
    def flat(run):
        def flat_run(Z):
            Y = run(Z)
            return torch.cat([y.flatten() for y in Y]) if isinstance(Y, tuple) else Y.flatten()
        return flat_run

    runs = (flat(run_a), flat(run_b))
    size = runs[0](X).numel()
    R = torch.randn(size, generator=torch.Generator().manual_seed(1))
    result = output_and_grad_differences(runs, X, R, torch.ones(size, dtype=torch.bool))
    return result["max_abs_diff"], result["max_abs_grad_diff"]


def compare_with_deepseek_v4(num_hiddens: int = 32, num_streams: int = 4, seed: int = 0) -> dict | None:
    """d2lmini's mHC against DeepSeek-V4's layers in the installed Hugging Face ``transformers``.

    Random parameters (large enough that ``H^res`` is far from uniform) are copied into
    ``DeepseekV4HyperConnection`` and ``DeepseekV4HyperHead``; both sides get the same
    random streams ``(2, 6, n, d)``. Returns ``{name: (max |output diff|, max |input-gradient diff|)}``,
    or ``None`` when this ``transformers`` has no DeepSeek-V4 (before 5.24).
    """
    found = _v4_classes(num_hiddens, num_streams)
    if found is None:
        return None
    m, config = found
    hc, head = HyperConnection(num_hiddens, num_streams), HyperHead(num_hiddens, num_streams)
    for module, offset in ((hc, seed), (head, seed + 1)):
        randomize_(module, seed=offset)
    theirs_hc, theirs_head = m.DeepseekV4HyperConnection(config), m.DeepseekV4HyperHead(config)
    with torch.no_grad():
        for ours, fn, base, scale in ((hc, theirs_hc.fn, theirs_hc.base, theirs_hc.scale),
                                      (head, theirs_head.hc_fn, theirs_head.hc_base, theirs_head.hc_scale)):
            fn.copy_(ours.phi), base.copy_(ours.bias), scale.copy_(ours.alpha)
    X = torch.randn(2, 6, num_streams, num_hiddens, generator=torch.Generator().manual_seed(seed))

    def ours_hc(S):  # V4 returns (H^post, comb = H^res transposed, the collapsed input)
        h_pre, h_post, h_res = hc.mappings(S)
        return h_post, h_res.transpose(-1, -2), (h_pre.unsqueeze(-1) * S).sum(dim=2)

    return {"DeepseekV4HyperConnection": _max_diff(ours_hc, theirs_hc, X),
            "DeepseekV4HyperHead": _max_diff(head, theirs_head, X)}


def hyper_depth_explorer(**kwargs) -> DepthExplorer:
    """Chapter 4's :class:`~d2lmini.chapters.ch04_norm_placement.DepthExplorer` with pre-LN and mHC.

    RMSNorm, a placement dropdown (pre-LN, mHC) and a streams slider (``n`` in 1, 2, 4, 8);
    display it to use it. ``kwargs`` as for the explorer (``max_depth``, ``depth``,
    ``placement``, ``num_streams``, sizes, ``dtype``, ...).
    """
    return DepthExplorer(**{"placement": HYPER_PLACEMENT, **kwargs, "placements": ("pre", HYPER_PLACEMENT),
                            "norm": "rms"})


def hyper_depth_explorer_static(depths=(1, 2, 4, 8, 16, 32, 64), streams=EXPLORED_STREAMS, **kwargs):
    """The static twin of :func:`hyper_depth_explorer`: placements pre-LN and mHC, RMSNorm, a streams slider.

    ``kwargs``: ``depth``, ``placement``, ``num_streams`` (initial values) and
    :func:`~d2lmini.probes.probe_depth`'s sizes, ``seed``, ``dtype``. Returns a
    :class:`~d2lmini.widgets.StaticTwin` whose titles name RMSNorm once (in "pre-LN (RMSNorm)")
    and whose mHC stacks are labelled ``"mHC, n = 4"``, as in :func:`streams_table`.
    """
    twin = depth_explorer_static(depths=depths, placements=("pre", HYPER_PLACEMENT), norms=("rms",),
                                 streams=streams, **{"placement": HYPER_PLACEMENT, "norm": "rms", **kwargs})
    for frame in twin.spec["frames"].values():  # every stack uses RMSNorm: say it once
        frame["title"] = _streams_label(frame["title"].replace(", RMSNorm, L = ", ", L = "))
        for series in (s for panel in frame["panels"] for s in panel if "label" in s):
            series["label"] = _streams_label(series["label"])
    return twin


def _streams_label(text: str) -> str:
    """``text`` with chapter 4's ``"mHC, 4 streams"`` written ``"mHC, n = 4"``, as in :func:`streams_table`."""
    return re.sub(r"mHC, (\d+) streams", r"mHC, n = \1", text)


__all__ = ["MIXINGS", "compare_with_deepseek_v4", "first_block", "hyper_depth_explorer",
           "hyper_depth_explorer_static", "mixing_matrices", "mixing_sweep", "mixing_table", "plot_mixing_products",
           "probe_streams", "product_gains", "regime_table", "stream_divergence", "streams_table", "v4_logit_std"]
