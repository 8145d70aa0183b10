"""Live ipywidgets explorers for the chapters.

Each explorer owns exactly one pyplot-free figure and shows it as PNG bytes in
an ``ipywidgets.Image``: moving a slider redraws that figure in place, so no
second plot ever appears below the first (the classic ``interact`` + inline
backend trap) and pyplot's figure count never grows. Expensive results are
computed once per configuration and cached. Works with ipywidgets 7.7 (Colab)
and 8.x. ``ipywidgets`` is imported only when an explorer is made.
"""

from __future__ import annotations

import math

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


# --------------------------------------------------------------------------- static twins


def _round(values, digits: int = 4):
    return [None if v is None or v != v else float(f"{v:.{digits}g}") for v in values]


class StaticTwin:
    """A kernel-free copy of an explorer: every frame pre-computed, controls moved by a small script.

    The twin is HTML: the controls, an SVG canvas, the frames as embedded JSON and
    ``static_plot.js`` (shipped with d2lmini) inline. It works in the built HTML book,
    where no Python kernel runs, and as a cell output in Jupyter and Colab. Nothing is
    loaded from the network.

    Args:
        controls: list of dicts, each ``{"name", "label", "type": "range", "values": [...],
            "value"}`` (values ints or strings, so Python and JavaScript spell keys alike) or ``{"name", "label", "type": "select", "options": [[value, label], ...],
            "value"}``.
        panels: list of dicts ``{"title", "xlabel", "ylabel", "log": bool, "xmin", "xmax"}``
            with optional ``"ymin"``/``"ymax"``.
        frames: ``{key: {"title": str, "panels": [[series, ...] per panel]}}`` where ``key``
            joins the controls' values with ``"|"`` in control order, and a series is
            ``{"y": [...], "x0": first x, "dx": x step (default 1), "color", "label" (optional),
            "dash": bool}``.
        width, height: size of the drawing in pixels.
        description: accessible description of the figure.

    Raises:
        ValueError: if a combination of control values has no frame.
        TypeError: for float values on a range control.
    """

    def __init__(self, controls, panels, frames, width: int = 900, height: int = 300, description: str = ""):
        import itertools

        for c in controls:  # keys are built in Python and in JavaScript: both must spell them alike
            if c["type"] == "range" and any(isinstance(v, float) for v in c["values"]):
                raise TypeError(f"range control {c['name']!r}: values must be ints or strings, not floats")
        self.spec = dict(controls=controls, panels=panels, frames=frames, width=width, height=height,
                         description=description)
        choices = [[str(v) for v in c["values"]] if c["type"] == "range" else [str(o[0]) for o in c["options"]]
                   for c in controls]
        missing = ["|".join(combo) for combo in itertools.product(*choices) if "|".join(combo) not in frames]
        if missing:
            raise ValueError(f"frames are missing for {len(missing)} combinations, e.g. {missing[:3]}")

    def to_html(self) -> str:
        """The twin as one self-contained HTML fragment."""
        import json
        from importlib.resources import files

        script = files("d2lmini").joinpath("static_plot.js").read_text(encoding="utf-8")
        data = json.dumps(self.spec, separators=(",", ":")).replace("</", "<\\/")
        return (f'<div class="d2l-twin" style="font-family: sans-serif; margin: 0.5em 0;">'
                f'<div class="d2l-twin-controls" style="margin-bottom: 0.4em;"></div>'
                f'<script type="application/json">{data}</script></div>\n<script>{script}</script>')

    def _repr_html_(self) -> str:
        return self.to_html()


def depth_explorer_static(depths=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), placements=PROBED_PLACEMENTS,
                          norms=NORMS, depth: int = 32, placement: str = "post", norm: str = "layer",
                          **probe_kwargs) -> StaticTwin:
    """The static twin of :class:`DepthExplorer`: the same three panels on a grid of depths.

    Each (placement, norm, depth) on the grid is probed once with
    :func:`d2lmini.probes.probe_placements` and its curves are embedded; the page
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
                grads = [dict(y=_round(result.grad_norms[w]), x0=1, color=WEIGHT_COLORS[w], label=w,
                              dash=w in ("W_k", "W_o")) for w in ATTENTION_WEIGHTS]
                frames[f"{p}|{L}|{n}"] = dict(
                    title=(f"{PLACEMENT_LABELS[p]}, {'LayerNorm' if n == 'layer' else 'RMSNorm'}, L = {L}: "
                           f"RMS {result.stream_rms[-1]:.2f}, spread {result.token_spread[-1]:.1e}, "
                           f"q,k/v,o gradient ratio {result.qk_vo_ratio(L):.1e}"),
                    panels=[[dict(y=_round(result.stream_rms), x0=0, color=PLACEMENT_COLORS[p])],
                            [dict(y=_round(result.token_spread), x0=0, color=PLACEMENT_COLORS[p])],
                            grads])
    controls = [
        dict(name="placement", label="placement", type="select",
             options=[[p, PLACEMENT_LABELS[p]] for p in placements], value=placement),
        dict(name="depth", label="depth L", type="range", values=list(depths), value=depth),
        dict(name="norm", label="norm", type="select",
             options=[[n, "LayerNorm" if n == "layer" else "RMSNorm"] for n in norms], value=norm),
    ]
    panels = [dict(title="Size of the stream", xlabel="depth k", ylabel="stream RMS", log=False,
                   xmin=0, xmax=max(depths), ymin=0),
              dict(title="Token spread", xlabel="depth k", ylabel="token spread", log=True,
                   xmin=0, xmax=max(depths), ymin=1e-6, ymax=1.0),
              dict(title="Gradient per block", xlabel="block k", ylabel="gradient norm", log=True,
                   xmin=0, xmax=max(depths))]
    return StaticTwin(controls, panels, frames, width=960, height=320,
                      description="Stream RMS, token spread and per-block gradient norms of a fresh stack")


# --------------------------------------------------------------------------- explorers from frames


def draw_frame(fig, axes, panels, frame) -> None:
    """Draw one explorer frame (the format of :class:`StaticTwin`) with matplotlib.

    Args:
        fig, axes: a figure from :func:`d2lmini.plot.new_figure` with one axis per panel.
        panels: the panel specs (title, labels, ``log``, limits).
        frame: ``{"title": str, "panels": [[series, ...], ...]}``.
    """
    import matplotlib

    with matplotlib.rc_context(STYLE):
        for ax, panel, series in zip(axes, panels, frame["panels"]):
            ax.clear()
            for s in series:
                xs = [s["x0"] + i * s.get("dx", 1) for i, y in enumerate(s["y"]) if y is not None]
                ys = [y for y in s["y"] if y is not None]
                ax.plot(xs, ys, color=s["color"], linestyle="--" if s.get("dash") else "-", label=s.get("label"))
            values = [y for s in series for y in s["y"] if y is not None and (y > 0 or not panel.get("log"))]
            if panel.get("log"):  # whole decades, as the static twin draws them
                ax.set_yscale("log")
                low = panel.get("ymin", 10 ** math.floor(math.log10(min(values))) if values else 1e-3)
                high = panel.get("ymax", 10 ** math.ceil(math.log10(max(values))) if values else 1.0)
            else:
                low = panel.get("ymin", min(0.0, min(values, default=0.0)))
                high = panel.get("ymax", 1.08 * max(values, default=1.0))
            ax.set(title=panel["title"], xlabel=panel["xlabel"], ylabel=panel["ylabel"],
                   xlim=(panel["xmin"], panel["xmax"]), ylim=(low, high if high > low else low + 1))
            if any(s.get("label") for s in series):
                ax.legend(loc="best", fontsize=8)
            ax.grid(True, alpha=0.3)
        fig.suptitle(frame["title"], fontsize=10)


class FrameExplorer:
    """A live ipywidgets explorer over pre-computed frames, with a static twin of the same data.

    One description -- controls, panels and a frame for every combination of control
    values (the format of :class:`StaticTwin`) -- gives both views: :meth:`static`
    for the HTML book, and the live widget (display the explorer) for Jupyter and
    Colab, which draws each frame once with matplotlib into one figure and caches the
    picture. Works with ipywidgets 7.7 and 8.

    Args:
        controls, panels, frames: as for :class:`StaticTwin`.
        width, height: figure size in inches for the live view.
        description: accessible description for the static twin.

    Raises:
        ValueError: if a combination of control values has no frame.
    """

    def __init__(self, controls, panels, frames, width: float = 10.0, height: float = 3.4, description: str = ""):
        self.twin = StaticTwin(controls, panels, frames, description=description)  # checks completeness
        self.controls, self.panels, self.frames = controls, panels, frames
        self.size = (width, height)
        self._pictures: dict = {}
        self._widget = None

    def static(self) -> StaticTwin:
        """The kernel-free twin of this explorer."""
        return self.twin

    def key(self, **values) -> str:
        """The frame key for control values given by name (missing ones take their initial value)."""
        return "|".join(str(values.get(c["name"], c["value"])) for c in self.controls)

    def picture(self, key: str) -> bytes:
        """PNG of one frame, drawn once and cached."""
        if key not in self._pictures:
            fig, axes = new_figure(len(self.panels), width=self.size[0], height=self.size[1])
            axes = [axes] if len(self.panels) == 1 else list(axes)
            draw_frame(fig, axes, self.panels, self.frames[key])
            self._pictures[key] = figure_png(fig)
        return self._pictures[key]

    @property
    def widget(self):
        """The live explorer (an ``ipywidgets.VBox``), built on first use."""
        if self._widget is None:
            import ipywidgets as widgets

            inputs = {}
            for c in self.controls:
                if c["type"] == "range":
                    inputs[c["name"]] = widgets.SelectionSlider(options=list(c["values"]), value=c["value"],
                                                                description=c["label"], continuous_update=False)
                else:
                    inputs[c["name"]] = widgets.Dropdown(options=[(label, value) for value, label in c["options"]],
                                                         value=c["value"], description=c["label"])
            image = widgets.Image(format="png")

            def update(change=None):
                image.value = self.picture(self.key(**{name: w.value for name, w in inputs.items()}))

            for w in inputs.values():
                w.observe(update, names="value")
            update()
            self.inputs, self.image = inputs, image
            self._widget = widgets.VBox([widgets.HBox(list(inputs.values())), image])
        return self._widget

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def residual_explorer(depths=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), depth: int = 32, stack: str = "pre|True",
                      **kwargs) -> FrameExplorer:
    """Explorer for the chapter "Residual connections": depth x stack (norms, skips).

    For each stack of :data:`d2lmini.residual.SKIP_CONFIGS` (no norms or pre-LN, with or
    without skip connections) one call of :func:`d2lmini.residual.depth_gradients`
    measures every depth on the grid; the frames show the stream's RMS and token
    spread along the stack and the gradient reaching each block.

    Args:
        depths: the depth slider's stops.
        depth, stack: initial values (``stack`` is ``"<placement>|<residual>"``).
        **kwargs: passed to :func:`~d2lmini.residual.depth_gradients` (sizes, seed, dtype).

    Returns:
        A :class:`FrameExplorer`; display it for the live view, ``.static()`` for the twin.
    """
    from .residual import SKIP_COLORS, SKIP_CONFIGS, depth_gradients, skip_label

    result = depth_gradients(depths=tuple(depths), configs=SKIP_CONFIGS, **kwargs)
    frames = {}
    for probe in result.probes:
        color = SKIP_COLORS[probe.placement]
        for L in depths:
            frames[f"{L}|{probe.placement}|{probe.residual}"] = dict(
                title=(f"{probe.label}, L = {L}: gradient reaching block 1 {probe.first_block_grad(L):.1e}, "
                       f"reaching the input {probe.input_grad[L]:.1e}, token spread {probe.token_spread[L]:.1e}"),
                panels=[[dict(y=_round(probe.stream_rms[:L + 1]), x0=0, color=color)],
                        [dict(y=_round(probe.token_spread[:L + 1]), x0=0, color=color)],
                        [dict(y=_round(probe.block_grad[L]), x0=1, color=color)]])
    controls = [dict(name="depth", label="depth L", type="range", values=list(depths), value=depth),
                dict(name="stack", label="stack", type="select", value=stack,
                     options=[[f"{p}|{r}", skip_label(p, r)] for p, r in SKIP_CONFIGS])]
    top = max(depths)
    panels = [dict(title="Size of the stream", xlabel="depth k", ylabel="stream RMS", log=True, xmin=0, xmax=top),
              dict(title="Token spread", xlabel="depth k", ylabel="token spread", log=True, xmin=0, xmax=top),
              dict(title="Gradient per block", xlabel="block k", ylabel="gradient norm", log=True, xmin=0, xmax=top)]
    return FrameExplorer(controls, panels, frames, description="Residual stacks with and without skip connections")


def qk_scale_explorer(scales=None, qk_norms=(None, "per_head"), scale: float = 1.0, num_hiddens: int = 64,
                      num_heads: int = 4, num_steps: int = 64, seed: int = 0) -> FrameExplorer:
    """Explorer for the chapter "QK-norm": the logit scale ``s`` on ``W_q, W_k``, with or without QK-norm.

    Uses :func:`d2lmini.qknorm.logit_scale_sweep` for the entropy and the gradient
    reaching the queries at every ``s``, and shows, for the chosen ``s``, how one
    query (head 1) spreads its attention over the keys of a random sequence.

    Args:
        scales: the slider's stops (default :func:`d2lmini.qknorm.log_spaced_scales`,
            0.25 to 64, two per octave).
        qk_norms: the settings in the dropdown (``None`` = no QK-norm).
        scale: initial ``s`` (the nearest stop is used).
        num_hiddens, num_heads, num_steps, seed: the layer and the sequence.

    Returns:
        A :class:`FrameExplorer`; display it for the live view, ``.static()`` for the twin.
    """
    import torch

    from .qknorm import QK_COLORS, QK_LABELS, log_spaced_scales, logit_scale_sweep, make_attention, scale_qk_

    scales = list(scales or log_spaced_scales(0.25, 64.0, 2))
    sweep = logit_scale_sweep(scales, qk_norms, num_hiddens=num_hiddens, num_heads=num_heads,
                              num_steps=num_steps, seed=seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        X = torch.randn(1, num_steps, num_hiddens)
    log2 = [math.log2(s) for s in scales]
    step = (log2[-1] - log2[0]) / max(1, len(scales) - 1)
    frames = {}
    for qk in qk_norms:
        name = "none" if qk is None else qk
        for i, s in enumerate(scales):
            attention = scale_qk_(make_attention(qk, num_hiddens, num_heads, seed), s)
            with torch.no_grad():
                from .qknorm import attention_logits

                weights = torch.softmax(attention_logits(attention, X), dim=-1)[0, 0, 0]
            row = sweep.at(s, qk)
            frames[f"{s:.3g}|{name}"] = dict(
                title=(f"s = {s:g}, {QK_LABELS[qk]}: entropy {row['entropy']:.2f} nats "
                       f"(uniform {sweep.max_entropy:.2f}), max logit {row['max_logit']:.3g}, "
                       f"median query gradient {row['grad_q']:.1e}"),
                panels=[[dict(y=_round(weights.tolist()), x0=0, color=QK_COLORS[qk])],
                        [dict(y=_round(sweep.entropy[qk][:i + 1]), x0=log2[0], dx=step, color=QK_COLORS[qk])],
                        [dict(y=_round(sweep.grad_q[qk][:i + 1]), x0=log2[0], dx=step, color=QK_COLORS[qk])]])
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
    return FrameExplorer(controls, panels, frames,
                         description="Attention entropy and query gradients as W_q and W_k are scaled")
