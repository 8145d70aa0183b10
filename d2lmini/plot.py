"""One house style for every figure of the book.

Figures are ``matplotlib.figure.Figure`` objects made without ``pyplot``: they are
never registered with pyplot's figure manager, so redrawing one inside a widget
never opens a second figure and never triggers the "too many figures" warning.
Every figure has an opaque white background so it stays legible in the book's
dark mode.
"""

from __future__ import annotations

import contextlib
import io

import matplotlib
import matplotlib.ticker
from matplotlib.figure import Figure

from ._checks import check_bool, check_choice
from .placements import placement_field

#: One colour per norm placement, used by every figure and widget (:data:`d2lmini.placements.PLACEMENT_TABLE`).
PLACEMENT_COLORS = placement_field("color")
#: Human-readable names of the placements, for legends and dropdowns.
PLACEMENT_LABELS = placement_field("label")
#: Colours of the attention weights in gradient plots: queries/keys blue, values/outputs red
#: (the second of each pair is drawn dashed).
WEIGHT_COLORS = {"W_q": "#1f5fa8", "W_k": "#1f5fa8", "W_v": "#c0392b", "W_o": "#c0392b"}

#: One colour per part of a block (the chapters "Anatomy" and "The 2026 block").
PART_COLORS = {"attention": "#1f5fa8", "ffn": "#d68910", "norms": "#7f8c8d"}
#: Names of the parts of a block (and of the whole, ``'total'``), for tables and legends.
PART_LABELS = {"attention": "attention", "ffn": "FFN", "norms": "norms", "total": "block"}
#: Colour of the residual stream's running sum in the chapter "Anatomy" (the pre-LN blue).
RUNNING_SUM_COLOR = PLACEMENT_COLORS["pre"]

#: The stacks of the chapter "Residual connections", by norm placement (no norms:
#: grey-brown; pre-LN: the book's pre-LN blue; post-LN: the book's post-LN red).
#: Stacks without skips are drawn dashed in the same colour.
SKIP_COLORS = {"none": "#7f6a4f", "pre": PLACEMENT_COLORS["pre"], "post": PLACEMENT_COLORS["post"]}
#: Names of those norm placements, for :func:`skip_label`.
SKIP_NORM_LABELS = {"none": "no norms", "pre": "pre-LN", "post": "post-LN"}

#: One colour per norm in the chapter "Normalization" (BatchNorm orange, LayerNorm blue).
NORM_COLORS = {"batch": "#d35400", "layer": "#2471a3"}
#: Names of the norms, for legends, controls and tables.
NORM_LABELS = {"batch": "BatchNorm", "layer": "LayerNorm", "rms": "RMSNorm",
               "layer_no_bias": "LayerNorm (no bias)", "layer_nonparametric": "LayerNorm (no parameters)"}
#: Fill of a real token's cell and edge of a padding cell in the chapter "Normalization".
CELL_COLORS = {"real": "#d6dbdf", "padding": "#99a3a4"}

#: The variants of RMSNorm in half precision (chapter "RMSNorm"), with a label for legends.
HALF_VARIANT_LABELS = {
    "upcast": "float32 upcast (d2lmini.RMSNorm)",
    "torch_mean": "half, torch .mean()",
    "no_upcast": "half throughout",
}
#: One colour per variant of :data:`HALF_VARIANT_LABELS`.
HALF_VARIANT_COLORS = {"upcast": "#2471a3", "torch_mean": "#d68910", "no_upcast": "#c0392b"}

#: Colour of each QK-norm setting in the chapter "QK-norm" (none: the book's red;
#: per head: the book's blue; the other two variants: purple and green).
QK_COLORS = {None: "#c0392b", "per_head": "#2471a3", "projection": "#7d3c98",
             "per_head_distinct": "#229954"}
#: Legend label of each QK-norm setting.
QK_LABELS = {None: "no QK-norm", "per_head": "QK-norm (per head)", "projection": "QK-norm (projection)",
             "per_head_distinct": "QK-norm (per head, distinct gains)"}

#: Colours of the FFN activations in the chapter "The feed-forward network" (plain MLPs
#: warm, gated cool).
ACT_COLORS = {"relu": "#7f8c8d", "gelu": "#c0392b", "gelu_tanh": "#e67e22",
              "swiglu": "#2471a3", "geglu": "#229954"}
#: Human-readable names of the FFN variants, for tables and legends.
ACT_LABELS = {"relu": "ReLU MLP", "gelu": "GELU MLP", "gelu_tanh": "GELU (tanh) MLP",
              "swiglu": "SwiGLU", "geglu": "GeGLU"}
#: The activation functions themselves (SiLU is SwiGLU's), as drawn in the same chapter.
ACT_FUNCTION_LABELS = {"relu": "ReLU", "gelu": r"GELU  $x\,\Phi(x)$", "gelu_tanh": "GELU (tanh)",
                       "silu": r"SiLU  $x\,\sigma(x)$"}
#: Their colours: those of the FFNs that use them.
ACT_FUNCTION_COLORS = {"relu": ACT_COLORS["relu"], "gelu": ACT_COLORS["gelu"], "gelu_tanh": ACT_COLORS["gelu_tanh"],
                       "silu": ACT_COLORS["swiglu"]}

#: Short names for the "who uses what" table of the block zoo (appendix).
PLACEMENT_SHORT_LABELS = placement_field("short_label")
QK_SHORT_LABELS = {None: "—", "per_head": "per head", "projection": "whole projection",
                   "per_head_distinct": "per head, own gains"}
ACT_SHORT_LABELS = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU (tanh)", "swiglu": "SwiGLU", "geglu": "GeGLU",
                    "swiglu_clamped": "SwiGLU (clamped)"}


def skip_label(placement: str, residual: bool) -> str:
    """Legend label of a stack of the chapter "Residual connections", e.g. ``'pre-LN, with skips'``.

    Args:
        placement: a key of :data:`SKIP_NORM_LABELS` (``'none'``, ``'pre'``, ``'post'``).
        residual: whether the stack has its skip connections.

    Raises:
        ValueError / TypeError: unknown ``placement`` or non-bool ``residual``.
    """
    check_choice("placement", placement, SKIP_NORM_LABELS)
    check_bool("residual", residual)
    return f"{SKIP_NORM_LABELS[placement]}, {'with' if residual else 'no'} skips"


STYLE = {
    "font.size": 11,
    "axes.titlesize": 11,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "axes.facecolor": "white",
    "lines.linewidth": 1.8,
}


def use_svg_display() -> None:
    """Show figures as SVG in Jupyter (crisp at any zoom), as d2l does. No-op outside IPython.

    The SVG of a figure is the same text on every run: matplotlib's element ids are hashed
    with a fixed salt instead of a random one, and no date is written into the file. So
    two builds of the book give the same pages, and a test can compare figures as text.
    """
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:  # pragma: no cover - matplotlib-inline ships with ipykernel
        return
    matplotlib.rcParams["svg.hashsalt"] = "d2lmini"
    set_matplotlib_formats("svg", metadata={"Date": None})


def table_style(table):
    """``table.style`` (a ``pandas`` ``Styler``) whose HTML is the same text on every run.

    A ``Styler`` scopes its CSS with a random id, so the same table would give a different page
    on every build; this one takes its id from the table's content (the same table, the same id;
    two different tables on a page, two ids).

    Args:
        table: a ``pandas.DataFrame``.

    Returns:
        The ``Styler``, to chain ``.format(...)`` and the rest on.

    Raises:
        TypeError: if ``table`` has no ``style`` (not a ``DataFrame``).
    """
    import hashlib

    if not hasattr(table, "style") or not hasattr(table, "to_csv"):
        raise TypeError(f"table must be a pandas.DataFrame, got {type(table).__name__}")
    return table.style.set_uuid("t" + hashlib.sha256(table.to_csv().encode("utf-8")).hexdigest()[:10])


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 9.0, height: float = 3.0, **subplot_kw):
    """A house-style figure with an ``nrows x ncols`` grid of axes.

    Args:
        ncols, nrows: the grid of axes.
        width, height: figure size in inches.
        **subplot_kw: passed to ``Figure.subplots``.

    Returns:
        ``(fig, axes)``: a pyplot-free ``matplotlib.figure.Figure`` with constrained
        layout, and the axes (a single ``Axes`` when the grid is 1 x 1, else an array).
    """
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width, height), layout="constrained")
        axes = fig.subplots(nrows, ncols, **subplot_kw)
    # rc_context only holds while artists are created; store the style on the figure.
    fig.set_facecolor("white")
    return fig, axes


@contextlib.contextmanager
def styled_figure(ncols: int = 1, nrows: int = 1, width: float = 9.0, height: float = 3.0, **subplot_kw):
    """A :func:`new_figure`, drawn on in the house style: ``with styled_figure(2) as (fig, axes): ...``.

    Every figure function of the chapters starts this way: the figure and its axes are
    made, and everything drawn inside the ``with`` block uses :data:`STYLE`.

    Args:
        ncols, nrows, width, height: as for :func:`new_figure`.
        **subplot_kw: as for :func:`new_figure`.

    Yields:
        ``(fig, axes)``, as :func:`new_figure` returns them.
    """
    fig, axes = new_figure(ncols, nrows, width, height, **subplot_kw)
    with matplotlib.rc_context(STYLE):
        yield fig, axes


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    """Render ``fig`` to PNG bytes (for image widgets and static twins)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, facecolor="white")
    return buffer.getvalue()


def plot_depth_probes(probes, labels=None, fig=None, axes=None, mark_depth: int | None = None, colors=None,
                      styles=None):
    """Draw stream RMS, token spread and the q,k / v,o gradient ratio against depth.

    Args:
        probes: iterable of :class:`d2lmini.probes.DepthProbe`.
        labels: legend label per probe (default: its placement's label).
        fig, axes: draw into these (three axes) instead of a new figure.
        mark_depth: if given, a dashed vertical line at that depth.
        colors: colour per probe (default: its placement's colour).
        styles: line keywords per probe (``linestyle``, ``linewidth``, ``alpha``; default: solid), so
            that curves which coincide or share a hue stay apart.

    Returns:
        The figure (a new one from :func:`new_figure` unless ``fig`` was given).
    """
    probes = list(probes)
    if fig is None:
        with matplotlib.rc_context(STYLE):
            fig, axes = new_figure(3, width=8.0, height=3.1)
    labels = labels or [PLACEMENT_LABELS.get(p.key, p.key) for p in probes]
    colors = colors or [PLACEMENT_COLORS.get(p.key) for p in probes]
    styles = styles or [{}] * len(probes)
    with matplotlib.rc_context(STYLE):
        for probe, label, color, style in zip(probes, labels, colors, styles):
            ks = range(probe.depth + 1)
            axes[0].plot(ks, probe.stream_rms, color=color, label=label, **style)
            axes[1].semilogy(ks, probe.token_spread, color=color, label=label, **style)
            blocks = range(1, probe.depth + 1)
            axes[2].semilogy(blocks, [probe.qk_vo_ratio(k) for k in blocks], color=color, label=label, **style)
        for ax in axes[1:]:  # log axes spanning a decade or two: minor ticks at 2 and 5, labelled
            ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(subs=(2.0, 5.0)))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.LogFormatterSciNotation(
                labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        axes[0].set(xlabel="depth k (blocks)", ylabel="stream RMS", title="Stream RMS")
        axes[1].set(xlabel="depth k (blocks)", ylabel=r"$\|X-\bar{X}\|_F \,/\, \|X\|_F$",
                    title="Token spread")
        axes[2].set(xlabel="block k", ylabel=r"$\sqrt{g_q g_k}\,/\,\sqrt{g_v g_o}$",
                    title=r"Gradient ratio $W_{q,k}$ : $W_{v,o}$")
        for ax in axes:
            ax.set_xlim(left=0)
            if mark_depth is not None:
                ax.axvline(mark_depth, color="0.4", linestyle="--", linewidth=1)
        axes[0].set_ylim(bottom=0)
        if len(probes) <= 2:
            axes[0].legend(loc="upper left")
        else:  # many curves: one legend above the panels
            fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center",
                       ncol=min(len(probes), 3), frameon=False)
    return fig


def plot_loss_curves(results: dict, window: int = 20, fig=None, ax=None, title: str | None = None,
                     colors: dict | None = None):
    """Training-loss curves (moving average over ``window`` steps) of several runs on one axis.

    Args:
        results: ``{label: TrainResult}`` (see :mod:`d2lmini.train`).
        window: moving-average window in steps.
        fig, ax: draw into this axis instead of a new figure.
        title: the axis title.
        colors: optional ``{label: colour}``.

    Returns:
        The figure. Runs that diverged end where their loss stopped being finite.
    """
    if fig is None:
        fig, ax = new_figure(1, width=6.5, height=3.2)
    with matplotlib.rc_context(STYLE):
        for label, result in results.items():
            curve = result.smoothed(window)
            ax.plot(range(1, len(curve) + 1), curve, label=label, color=(colors or {}).get(label))
        ax.set(xlabel="training step", ylabel=f"training loss (nats/char, {window}-step mean)")
        if title:
            ax.set_title(title)
        ax.legend(loc="upper right")
    return fig


#: The update each placement applies, as printed under its diagram.
PLACEMENT_FORMULAS = placement_field("formula")


