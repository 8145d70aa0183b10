"""Live ipywidgets explorers for the chapters.

Each explorer owns exactly one pyplot-free figure and shows it as PNG bytes in
an ``ipywidgets.Image``: moving a slider redraws that figure in place, so no
second plot ever appears below the first (the classic ``interact`` + inline
backend trap) and pyplot's figure count never grows. Expensive results are
computed once per configuration and cached. Works with ipywidgets 7.7 (Colab)
and 8.x. ``ipywidgets`` is imported only when an explorer is made.
"""

from __future__ import annotations

from .block import PLACEMENTS
from .norms import NORMS
from .plot import PLACEMENT_COLORS, PLACEMENT_LABELS, STYLE, WEIGHT_COLORS, figure_png, new_figure
from .probes import ATTENTION_WEIGHTS, probe_depth


class DepthExplorer:
    """Depth x placement x norm explorer for the chapter "Where the norm goes".

    Controls: a depth slider ``L`` (1 to ``max_depth``), a placement dropdown and
    a norm toggle. For the chosen stack it shows, per depth, the stream RMS, the
    token spread and the gradient norms of every block's ``W_q, W_k, W_v, W_o``
    (:func:`d2lmini.probes.probe_depth`). Each (placement, norm, depth) is probed
    once and cached.

    Args:
        max_depth: largest depth on the slider (default 64).
        depth: initial depth (default 32).
        placement: initial placement, one of :data:`d2lmini.block.PLACEMENTS`.
        norm: initial norm, ``'layer'`` or ``'rms'``.
        **probe_kwargs: passed to :func:`~d2lmini.probes.probe_depth` (sizes, seed, dtype, ...).

    Attributes:
        depth_slider, placement_dropdown, norm_toggle: the controls.
        image: the ``ipywidgets.Image`` the figure is drawn into.
        widget: the whole explorer (an ``ipywidgets.VBox``); displaying the
            explorer displays it.

    Raises:
        ValueError: for an initial value outside the allowed ones.
    """

    def __init__(self, max_depth: int = 64, depth: int = 32, placement: str = "post", norm: str = "layer",
                 **probe_kwargs):
        import ipywidgets as widgets

        if not 1 <= depth <= max_depth:
            raise ValueError(f"depth must be in [1, max_depth={max_depth}], got {depth}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        self.max_depth = max_depth
        self.probe_kwargs = probe_kwargs
        self._cache = {}
        self.depth_slider = widgets.IntSlider(value=depth, min=1, max=max_depth, description="depth L",
                                              continuous_update=False)
        self.placement_dropdown = widgets.Dropdown(
            options=[(PLACEMENT_LABELS[p], p) for p in PLACEMENTS], value=placement, description="placement")
        self.norm_toggle = widgets.ToggleButtons(options=[("LayerNorm", "layer"), ("RMSNorm", "rms")],
                                                 value=norm, description="norm")
        self.image = widgets.Image(format="png")
        self.fig, self.axes = new_figure(3, width=10.5, height=3.2)
        for control in (self.depth_slider, self.placement_dropdown, self.norm_toggle):
            control.observe(self._on_change, names="value")
        self.widget = widgets.VBox([widgets.HBox([self.placement_dropdown, self.depth_slider]),
                                    self.norm_toggle, self.image])
        self.update()

    def probe(self, placement: str, norm: str, depth: int):
        """The (cached) :class:`~d2lmini.probes.DepthProbe` for one configuration."""
        key = (placement, norm, depth)
        if key not in self._cache:
            self._cache[key] = probe_depth(placement, norm, depth, **self.probe_kwargs)
        return self._cache[key]

    def _on_change(self, change) -> None:
        self.update()

    def update(self) -> None:
        """Redraw the figure for the controls' current values."""
        import matplotlib

        placement, norm = self.placement_dropdown.value, self.norm_toggle.value
        depth = self.depth_slider.value
        result = self.probe(placement, norm, depth)
        color = PLACEMENT_COLORS[placement]
        ks = range(depth + 1)
        blocks = range(1, depth + 1)
        with matplotlib.rc_context(STYLE):
            for ax in self.axes:
                ax.clear()
            self.axes[0].plot(ks, result.stream_rms, color=color)
            self.axes[0].set(xlabel="depth k", ylabel="stream RMS", title="Size of the stream", ylim=(0, None))
            self.axes[1].semilogy(ks, result.token_spread, color=color)
            self.axes[1].set(xlabel="depth k", ylabel="token spread", title="Token spread")
            for name in ATTENTION_WEIGHTS:
                self.axes[2].semilogy(blocks, result.grad_norms[name], color=WEIGHT_COLORS[name], label=name,
                                      marker="." if depth < 16 else None)
            self.axes[2].set(xlabel="block k", ylabel="gradient norm", title="Gradient per block")
            self.axes[2].legend(loc="lower left", ncol=2)
            for ax in self.axes:
                ax.set_xlim(0, self.max_depth)
                ax.grid(True, alpha=0.3)
            self.fig.suptitle(f"{PLACEMENT_LABELS[placement]}, {'LayerNorm' if norm == 'layer' else 'RMSNorm'}, "
                              f"L = {depth}: RMS {result.stream_rms[-1]:.2f}, spread {result.token_spread[-1]:.1e}, "
                              f"top-block q,k/v,o gradient ratio {result.qk_vo_ratio(depth):.1e}", fontsize=10)
        self.image.value = figure_png(self.fig)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def depth_explorer(**kwargs) -> DepthExplorer:
    """Make a :class:`DepthExplorer` (see there for the arguments); display it to use it."""
    return DepthExplorer(**kwargs)
