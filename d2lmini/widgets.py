"""Live ipywidgets explorers for the chapters.

Each explorer owns exactly one pyplot-free figure and shows it as PNG bytes in
an ``ipywidgets.Image``: moving a slider redraws that figure in place, so no
second plot ever appears below the first (the classic ``interact`` + inline
backend trap) and pyplot's figure count never grows. Expensive results are
computed once per configuration and cached. Works with ipywidgets 7.7 (Colab)
and 8.x. ``ipywidgets`` is imported only when an explorer is made.
"""

from __future__ import annotations

from .norms import NORMS
from .plot import PLACEMENT_COLORS, PLACEMENT_LABELS, STYLE, WEIGHT_COLORS, figure_png, new_figure
from .probes import ATTENTION_WEIGHTS, PROBED_PLACEMENTS, probe_depth, probe_placements


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

    def __init__(self, max_depth: int = 64, depth: int = 32, placement: str = "post", norm: str = "layer",
                 **probe_kwargs):
        import inspect

        import ipywidgets as widgets

        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
        if not 1 <= depth <= max_depth:
            raise ValueError(f"depth must be in [1, max_depth={max_depth}], got {depth}")
        if placement not in PROBED_PLACEMENTS:
            raise ValueError(f"placement must be one of {PROBED_PLACEMENTS}, got {placement!r}")
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
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
        self.norm_toggle = widgets.ToggleButtons(options=[("LayerNorm", "layer"), ("RMSNorm", "rms")],
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
            self.fig.suptitle(f"{PLACEMENT_LABELS[placement]}, {'LayerNorm' if norm == 'layer' else 'RMSNorm'}, "
                              f"L = {depth}: RMS {result.stream_rms[-1]:.2f}, spread {result.token_spread[-1]:.1e}, "
                              f"top-block q,k/v,o gradient ratio {result.qk_vo_ratio(depth):.1e}", fontsize=10)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def depth_explorer(**kwargs) -> DepthExplorer:
    """Make a :class:`DepthExplorer` (see there for the arguments); display it to use it."""
    return DepthExplorer(**kwargs)
