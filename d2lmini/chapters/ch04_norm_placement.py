"""Where the norm goes: the experiments of the chapter "Where the norm goes: post-LN, pre-LN and after".

* :func:`probe_placements` and :func:`depth_table` -- the depth experiment at
  initialization for every placement (the measurement itself is
  :func:`d2lmini.probes.probe_depth`);
* :func:`draw_placement_diagrams` -- one drawn block diagram per placement;
* :func:`warmup_comparison` -- post-LN with and without learning-rate warm-up against
  pre-LN, trained with :func:`d2lmini.train.train_lm`;
* :class:`DepthExplorer`, :func:`depth_explorer` and :func:`depth_explorer_static` --
  the depth, placement and norm sliders, live and pre-computed.
"""

from __future__ import annotations

import math

from .._checks import check_choice, check_int_in, check_positive_int
from .._shown import shown_in
from ..data import CharCorpus
from ..norms import NORMS
from ..plot import (NORM_LABELS, PLACEMENT_COLORS, PLACEMENT_FORMULAS, PLACEMENT_LABELS, STYLE, WEIGHT_COLORS,
                    figure_png, new_figure, styled_figure)
from ..probes import ATTENTION_WEIGHTS, PROBED_PLACEMENTS, DepthProbe, probe_depth
from ..train import TrainResult, train_lm
from ..widgets import StaticTwin, round_frame_values


@shown_in("ch04")
def probe_placements(depth: int = 32, placements=PROBED_PLACEMENTS, **kwargs) -> dict[str, DepthProbe]:
    """:func:`probe_depth` for several placements with everything else equal.

    ``'sandwich_scaled'`` is the depth-scaled sandwich: ``'sandwich'`` whose
    sublayer-output norms start with gain ``1/sqrt(depth)``.

    Args:
        depth: blocks in every stack.
        placements: names from :data:`PROBED_PLACEMENTS`.
        **kwargs: passed to :func:`probe_depth` (``norm``, ``seed``, ``dtype``, sizes).

    Returns:
        ``{placement: DepthProbe}`` in the order given.

    Raises:
        ValueError: for an unknown placement name.
    """
    probes = {}
    for name in placements:
        check_choice("placements", name, PROBED_PLACEMENTS)
        if name == "sandwich_scaled":
            probes[name] = probe_depth("sandwich", depth=depth, sublayer_norm_gain=1 / math.sqrt(depth), **kwargs)
        else:
            probes[name] = probe_depth(name, depth=depth, **kwargs)
    return probes


def depth_table(probes, ks=(8, 16, 32)):
    """A pandas DataFrame of the measurements of several probes at depths ``ks``.

    Args:
        probes: iterable of :class:`DepthProbe`.
        ks: depths (block indices) to report; each must be <= every probe's depth.

    Returns:
        ``pandas.DataFrame`` indexed by (placement, k) with columns stream RMS,
        token spread, the gradient norms of block k's ``W_q`` and ``W_v`` and its
        q,k : v,o ratio (:meth:`DepthProbe.qk_vo_ratio`, which uses all four).

    Raises:
        ValueError: if a ``k`` exceeds a probe's depth.
    """
    import pandas as pd  # the book has pandas; the package itself does not need it

    columns = {"stream_rms": "stream RMS", "token_spread": "token spread",
               "grad_W_q": "‖∇W_q‖", "grad_W_v": "‖∇W_v‖", "qk_vo_ratio": "q,k : v,o"}
    rows = [probe.at(k) for probe in probes for k in ks]
    frame = pd.DataFrame(rows).set_index(["placement", "k"])
    return frame[list(columns)].rename(columns=columns)


def draw_placement_diagrams(placements=("post", "pre", "post_sublayer", "sandwich", "sandwich_scaled")):
    """Block diagrams of one residual sublayer for each norm placement, side by side.

    Each panel draws the residual stream as a vertical arrow (input at the bottom),
    the branch through the sublayer ``F`` on the right, the addition ``+`` where the
    branch rejoins the stream, and a norm box ``N`` wherever the placement puts one:
    on the stream after the addition (post-LN), before ``F`` (pre-LN), after ``F``
    inside the branch (OLMo 2), or both (sandwich). The depth-scaled sandwich marks
    its output norm's small initial gain ``gamma_0``.

    Args:
        placements: keys of :data:`PLACEMENT_FORMULAS`, one panel each.

    Returns:
        A ``matplotlib.figure.Figure``.

    Raises:
        ValueError: for an unknown placement name.
    """
    from matplotlib.patches import FancyBboxPatch

    for p in placements:
        check_choice("placements", p, PLACEMENT_FORMULAS)
    stream_x, branch_x, add_y = 0.3, 0.72, 0.72

    def box(ax, x, y, text, color, width=0.34, height=0.1):
        ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                    boxstyle="round,pad=0.01,rounding_size=0.02",
                                    facecolor=color, edgecolor="0.2", linewidth=1.0, zorder=3))
        ax.text(x, y, text, ha="center", va="center", fontsize=10, zorder=4,
                color="white" if color != "0.92" else "black")

    def arrow(ax, start, end):
        ax.annotate("", xy=end, xytext=start, zorder=2,
                    arrowprops=dict(arrowstyle="-|>", color="0.25", linewidth=1.2, shrinkA=0, shrinkB=0))

    with styled_figure(len(placements), width=1.75 * len(placements), height=3.4) as (fig, axes):
        for ax, placement in zip(axes if len(placements) > 1 else [axes], placements):
            color = PLACEMENT_COLORS[placement]
            has_in = placement in ("pre", "sandwich", "sandwich_scaled")
            has_out = placement in ("post_sublayer", "sandwich", "sandwich_scaled")
            top = 0.97 if placement != "post" else 0.81
            arrow(ax, (stream_x, 0.04), (stream_x, add_y - 0.03))
            arrow(ax, (stream_x, add_y + 0.03), (stream_x, top))
            if placement == "post":
                box(ax, stream_x, 0.86, "N", color, width=0.3)
                arrow(ax, (stream_x, 0.91), (stream_x, 0.99))
            # the branch: out of the stream, up through its boxes, back into the addition
            ax.plot([stream_x, branch_x], [0.14, 0.14], color="0.25", linewidth=1.2, zorder=2)
            stages = (["N"] if has_in else []) + ["F"] + (["N_out"] if has_out else [])
            ys = {1: [0.43], 2: [0.31, 0.53], 3: [0.26, 0.43, 0.60]}[len(stages)]
            previous = 0.14
            for stage, y in zip(stages, ys):
                arrow(ax, (branch_x, previous), (branch_x, y - 0.05))
                label = "F" if stage == "F" else ("N$_{\\gamma_0}$" if stage == "N_out" and placement == "sandwich_scaled"
                                                  else "N")
                box(ax, branch_x, y, label, "0.92" if stage == "F" else color)
                previous = y + 0.05
            ax.plot([branch_x, branch_x], [previous, add_y], color="0.25", linewidth=1.2, zorder=2)
            arrow(ax, (branch_x, add_y), (stream_x + 0.06, add_y))
            ax.text(stream_x, add_y, "+", ha="center", va="center", fontsize=11, zorder=4,
                    bbox=dict(boxstyle="circle,pad=0.15", facecolor="white", edgecolor="0.2"))
            ax.text(0.5, -0.06, PLACEMENT_LABELS[placement], ha="center", va="top", fontsize=9.5,
                    color=color, fontweight="bold", transform=ax.transAxes)
            ax.text(0.5, -0.16, PLACEMENT_FORMULAS[placement], ha="center", va="top", fontsize=9,
                    transform=ax.transAxes)
            ax.set(xlim=(0, 1), ylim=(0, 1))
            ax.axis("off")
    return fig


#: The three runs of the warm-up demonstration: (label, placement, uses warm-up).
WARMUP_RUNS = (("post-LN, no warm-up", "post", False),
               ("post-LN, warm-up", "post", True),
               ("pre-LN, no warm-up", "pre", False))


@shown_in("ch04")
def warmup_comparison(corpus: CharCorpus, num_steps: int = 300, lr: float = 1e-2, warmup_steps: int = 75,
                      seed: int = 0, **kwargs) -> dict[str, TrainResult]:
    """Post-LN with and without learning-rate warm-up against pre-LN without it.

    The experiment behind Xiong et al. (2020): the same model, data, seed and peak
    learning rate, trained three times -- post-LN without warm-up, post-LN with a
    linear warm-up over ``warmup_steps``, and pre-LN without warm-up.

    Args:
        corpus: training data.
        num_steps, lr, warmup_steps, seed: as in :func:`train_lm`.
        **kwargs: passed to :func:`train_lm` (model size, ``norm``, ``act``,
            ``batch_size``, ...); must not contain ``placement``.

    Returns:
        ``{label: TrainResult}`` with the labels of :data:`WARMUP_RUNS`.

    Raises:
        TypeError: if ``placement`` is passed in ``kwargs`` (``warmup_steps`` is a
            parameter of its own, so it never reaches ``kwargs``).
    """
    if "placement" in kwargs:
        raise TypeError("warmup_comparison sets placement itself")
    return {label: train_lm(corpus, num_steps=num_steps, lr=lr, warmup_steps=warmup_steps if warm else 0,
                            seed=seed, placement=placement, **kwargs)
            for label, placement, warm in WARMUP_RUNS}


class DepthExplorer:
    """Depth x placement x norm explorer for the chapter "Where the norm goes".

    Controls: a depth slider ``L`` (1 to ``max_depth``), a placement dropdown and
    a norm toggle. For the chosen stack it shows, per depth, the stream RMS, the
    token spread and the gradient norms of every block's ``W_q, W_k, W_v, W_o``
    (:func:`d2lmini.probes.probe_depth`). Each (placement, norm, depth) is probed and
    drawn once; moving back to it shows the cached picture.

    Args:
        max_depth: largest depth on the slider (default 64).
        depth: initial depth (default 32).
        placement: initial placement, one of :data:`d2lmini.probes.PROBED_PLACEMENTS`
            (the four placements and ``'sandwich_scaled'``, the depth-scaled sandwich).
        norm: initial norm, ``'layer'`` or ``'rms'``.
        **probe_kwargs: passed to :func:`~d2lmini.probes.probe_depth` (sizes, seed, dtype, ...).

    Attributes:
        depth_slider, placement_dropdown, norm_toggle: the controls.
        image: the ``ipywidgets.Image`` the figure is drawn into.
        widget: the whole explorer (an ``ipywidgets.VBox``); displaying the
            explorer displays it.

    Raises:
        ValueError: for an initial value outside the allowed ones.
        TypeError: for a keyword that :func:`~d2lmini.probes.probe_depth` does not take.
    """

    def __init__(self, max_depth: int = 64, depth: int = 32, *, placement: str = "post", norm: str = "layer",
                 **probe_kwargs):
        import inspect

        import ipywidgets as widgets

        max_depth = check_positive_int("max_depth", max_depth)
        check_int_in("depth", depth, 1, max_depth)
        check_choice("placement", placement, PROBED_PLACEMENTS)
        check_choice("norm", norm, NORMS)
        allowed = set(inspect.signature(probe_depth).parameters) - {"placement", "norm", "depth", "sublayer_norm_gain"}
        unknown = sorted(set(probe_kwargs) - allowed)
        if unknown:
            raise TypeError(f"unknown probe_depth arguments {unknown}; allowed: {sorted(allowed)}")
        self.max_depth = max_depth
        self.probe_kwargs = probe_kwargs
        self._cache = {}   # (placement, norm, depth) -> DepthProbe
        self._frames = {}  # (placement, norm, depth) -> PNG bytes
        self.depth_slider = widgets.IntSlider(value=depth, min=1, max=max_depth, description="depth L",
                                              continuous_update=False)
        self.placement_dropdown = widgets.Dropdown(
            options=[(PLACEMENT_LABELS[p], p) for p in PROBED_PLACEMENTS], value=placement,
            description="placement")
        self.norm_toggle = widgets.ToggleButtons(options=[(NORM_LABELS[n], n) for n in NORMS],
                                                 value=norm, description="norm")
        self.image = widgets.Image(format="png")
        self.fig, self.axes = new_figure(3, width=10.0, height=3.4)
        for control in (self.depth_slider, self.placement_dropdown, self.norm_toggle):
            control.observe(self._on_change, names="value")
        self.widget = widgets.VBox([widgets.HBox([self.placement_dropdown, self.depth_slider]),
                                    self.norm_toggle, self.image])
        self.update()

    def probe(self, placement: str, norm: str, depth: int):
        """The (cached) :class:`~d2lmini.probes.DepthProbe` for one configuration."""
        key = (placement, norm, depth)
        if key not in self._cache:
            self._cache[key] = probe_placements(depth, (placement,), norm=norm, **self.probe_kwargs)[placement]
        return self._cache[key]

    def _on_change(self, change) -> None:
        self.update()

    def frame(self, placement: str, norm: str, depth: int) -> bytes:
        """The PNG picture of one configuration, drawn once and then cached."""
        key = (placement, norm, depth)
        if key not in self._frames:
            self._draw(placement, norm, depth)
            self._frames[key] = figure_png(self.fig)
        return self._frames[key]

    def update(self) -> None:
        """Show the picture for the controls' current values."""
        self.image.value = self.frame(self.placement_dropdown.value, self.norm_toggle.value,
                                      self.depth_slider.value)

    def _draw(self, placement: str, norm: str, depth: int) -> None:
        import matplotlib

        result = self.probe(placement, norm, depth)
        color = PLACEMENT_COLORS[placement]
        ks = range(depth + 1)
        blocks = range(1, depth + 1)
        with matplotlib.rc_context(STYLE):
            for ax in self.axes:
                ax.clear()
            rms, spread, grads = self.axes
            rms.plot(ks, result.stream_rms, color=color)
            rms.set(xlabel="depth k", ylabel="stream RMS", title="Size of the stream",
                    ylim=(0, max(1.5, 1.15 * max(result.stream_rms))))
            spread.semilogy(ks, result.token_spread, color=color)
            spread.set(xlabel="depth k", ylabel="token spread", title="Token spread", ylim=(1e-6, 2.0))
            for name in ATTENTION_WEIGHTS:
                grads.semilogy(blocks, result.grad_norms[name], color=WEIGHT_COLORS[name], label=name,
                               linestyle="--" if name in ("W_k", "W_o") else "-",
                               marker="." if depth < 16 else None)
            grads.set(xlabel="depth k", ylabel="gradient norm", title="Gradient per block")
            grads.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
            for ax in self.axes:
                ax.set_xlim(0, self.max_depth)
                ax.grid(True, alpha=0.3)
            self.fig.suptitle(f"{PLACEMENT_LABELS[placement]}, {NORM_LABELS[norm]}, "
                              f"L = {depth}: RMS {result.stream_rms[-1]:.2f}, spread {result.token_spread[-1]:.1e}, "
                              f"top-block q,k/v,o gradient ratio {result.qk_vo_ratio(depth):.1e}", fontsize=10)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def depth_explorer(**kwargs) -> DepthExplorer:
    """Make a :class:`DepthExplorer` (see there for the arguments); display it to use it."""
    return DepthExplorer(**kwargs)


def depth_explorer_static(depths=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), placements=PROBED_PLACEMENTS,
                          norms=NORMS, depth: int = 32, placement: str = "post", norm: str = "layer",
                          **probe_kwargs) -> StaticTwin:
    """The static twin of :class:`DepthExplorer`: the same three panels on a grid of depths.

    Each (placement, norm, depth) on the grid is probed once with
    :func:`d2lmini.chapters.ch04_norm_placement.probe_placements` and its curves are embedded; the page
    redraws them when a control moves.

    Args:
        depths: the depth slider's stops.
        placements, norms: the dropdowns' options.
        depth, placement, norm: the initial values.
        **probe_kwargs: passed to :func:`~d2lmini.probes.probe_depth` (sizes, seed, dtype).

    Returns:
        A :class:`StaticTwin` (display it, or call ``to_html()``).
    """
    frames = {}
    for p in placements:
        for n in norms:
            for L in depths:
                result = probe_placements(L, (p,), norm=n, **probe_kwargs)[p]
                grads = [dict(y=round_frame_values(result.grad_norms[w]), x0=1, color=WEIGHT_COLORS[w], label=w,
                              dash=w in ("W_k", "W_o")) for w in ATTENTION_WEIGHTS]
                frames[f"{p}|{L}|{n}"] = dict(
                    title=(f"{PLACEMENT_LABELS[p]}, {NORM_LABELS[n]}, L = {L}: "
                           f"RMS {result.stream_rms[-1]:.2f}, spread {result.token_spread[-1]:.1e}, "
                           f"q,k/v,o gradient ratio {result.qk_vo_ratio(L):.1e}"),
                    panels=[[dict(y=round_frame_values(result.stream_rms), x0=0, color=PLACEMENT_COLORS[p])],
                            [dict(y=round_frame_values(result.token_spread), x0=0, color=PLACEMENT_COLORS[p])],
                            grads])
    controls = [
        dict(name="placement", label="placement", type="select",
             options=[[p, PLACEMENT_LABELS[p]] for p in placements], value=placement),
        dict(name="depth", label="depth L", type="range", values=list(depths), value=depth),
        dict(name="norm", label="norm", type="select",
             options=[[n, NORM_LABELS[n]] for n in norms], value=norm),
    ]
    panels = [dict(title="Size of the stream", xlabel="depth k", ylabel="stream RMS", log=False,
                   xmin=0, xmax=max(depths), ymin=0),
              dict(title="Token spread", xlabel="depth k", ylabel="token spread", log=True,
                   xmin=0, xmax=max(depths), ymin=1e-6, ymax=1.0),
              dict(title="Gradient per block", xlabel="block k", ylabel="gradient norm", log=True,
                   xmin=0, xmax=max(depths))]
    return StaticTwin(controls, panels, frames=frames, width=960, height=320,
                      description="Stream RMS, token spread and per-block gradient norms of a fresh stack")
