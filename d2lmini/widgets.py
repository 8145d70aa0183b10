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

from .plot import STYLE, figure_png, new_figure


# --------------------------------------------------------------------------- static twins


def round_frame_values(values, digits: int = 4):
    """``values`` rounded to ``digits`` significant digits for a static twin's frames (smaller pages);
    ``None`` and NaN become ``None``. Returns a list of floats and ``None``."""
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

    def __init__(self, controls, panels, *, frames, width: int = 900, height: int = 300, description: str = ""):
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

    def __repr__(self) -> str:  # what a notebook shows where it cannot show HTML; no memory address
        names = ", ".join(c["name"] for c in self.spec["controls"])
        return f"<StaticTwin: {len(self.spec['frames'])} frames over {names or 'no controls'}>"


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

    def __init__(self, controls, panels, *, frames, width: float = 10.0, height: float = 3.4, description: str = ""):
        self.twin = StaticTwin(controls, panels, frames=frames, description=description)  # checks completeness
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




# --------------------------------------------------------------------------- text explorers


class TextTwin:
    """A kernel-free explorer of pre-computed texts: drop-down controls pick which text is shown.

    HTML with one ``<select>`` per control, a ``<pre>`` and the texts as embedded JSON; a few
    lines of inline script swap the text when a control changes (no library, nothing from the
    network). Works in the built HTML book and as a cell output in Jupyter and Colab.

    Args:
        controls: list of dicts ``{"name", "label", "options": [[value, label], ...], "value"}``
            (values are strings).
        texts: ``{key: str}`` where ``key`` joins the controls' values with ``"|"`` in control order.
        description: accessible description of the text.

    Raises:
        TypeError: option values or texts that are not strings, or a control without ``name``,
            ``label``, ``options`` or ``value``.
        ValueError: if a combination of control values has no text, or an initial value is not
            among its control's options.
    """

    def __init__(self, controls, texts: dict, *, description: str = ""):
        import itertools

        for c in controls:
            if not isinstance(c, dict) or not {"name", "label", "options", "value"} <= set(c):
                raise TypeError(f"every control must be a dict with name, label, options and value, got {c!r}")
            if not all(isinstance(v, str) and isinstance(label, str) for v, label in c["options"]):
                raise TypeError(f"control {c['name']!r}: option values and labels must be strings")
        if not isinstance(texts, dict) or not all(isinstance(t, str) for t in texts.values()):
            raise TypeError("texts must be a dict of str keys to str texts")
        for c in controls:
            if c["value"] not in [o[0] for o in c["options"]]:
                raise ValueError(f"control {c['name']!r}: initial value {c['value']!r} is not among its options")
        missing = ["|".join(combo) for combo in itertools.product(*[[o[0] for o in c["options"]] for c in controls])
                   if "|".join(combo) not in texts]
        if missing:
            raise ValueError(f"texts are missing for {len(missing)} combinations, e.g. {missing[:3]}")
        self.controls, self.texts, self.description = controls, texts, description

    def key(self, **values) -> str:
        """The text key for control values given by name (missing ones take their initial value)."""
        return "|".join(str(values.get(c["name"], c["value"])) for c in self.controls)

    def to_html(self) -> str:
        """The twin as one self-contained HTML fragment."""
        import html
        import json

        selects = "".join(
            f'<label style="margin-right: 1em;">{html.escape(c["label"])} <select data-control="{html.escape(c["name"])}">'
            + "".join(f'<option value="{html.escape(v)}"{" selected" if v == c["value"] else ""}>{html.escape(label)}</option>'
                      for v, label in c["options"]) + "</select></label>" for c in self.controls)
        data = json.dumps(self.texts, separators=(",", ":")).replace("</", "<\\/")
        return (f'<div class="d2l-text-twin" role="group" aria-label="{html.escape(self.description)}" '
                f'style="font-family: sans-serif; margin: 0.5em 0;">{selects}'
                f'<pre style="white-space: pre-wrap; margin-top: 0.4em;">{html.escape(self.texts[self.key()])}</pre>'
                f'<script type="application/json">{data}</script></div>\n'
                "<script>(function () { Array.prototype.forEach.call("  # every twin not yet wired, once each
                "document.querySelectorAll('.d2l-text-twin:not([data-ready])'), function (twin) {"
                " twin.setAttribute('data-ready', '1'); var texts = JSON.parse(twin.querySelector('script').textContent);"
                " var selects = twin.querySelectorAll('select'); function show() {"
                " twin.querySelector('pre').textContent = texts[Array.prototype.map.call(selects,"
                " function (s) { return s.value; }).join('|')]; }"
                " Array.prototype.forEach.call(selects, function (s) { s.addEventListener('change', show); }); }); })();"
                "</script>")

    def _repr_html_(self) -> str:
        return self.to_html()

    def __repr__(self) -> str:
        return f"TextTwin({', '.join(c['name'] for c in self.controls)}; {len(self.texts)} texts)"


class TextExplorer:
    """A live ipywidgets explorer over pre-computed texts, with a static twin of the same texts.

    Args:
        controls, texts, description: as for :class:`TextTwin`.

    Raises:
        ValueError: as :class:`TextTwin`.
    """

    def __init__(self, controls, texts: dict, *, description: str = ""):
        self.twin = TextTwin(controls, texts, description=description)  # checks completeness
        self._widget = None

    def static(self) -> TextTwin:
        """The kernel-free twin of this explorer."""
        return self.twin

    @property
    def widget(self):
        """The live explorer (an ``ipywidgets.VBox``), built on first use."""
        if self._widget is None:
            import ipywidgets as widgets

            inputs = {c["name"]: widgets.Dropdown(options=[(label, value) for value, label in c["options"]],
                                                  value=c["value"], description=c["label"])
                      for c in self.twin.controls}
            out = widgets.Textarea(layout=widgets.Layout(width="100%", height="6em"), disabled=True)

            def update(change=None):
                out.value = self.twin.texts[self.twin.key(**{name: w.value for name, w in inputs.items()})]

            for w in inputs.values():
                w.observe(update, names="value")
            update()
            self.inputs, self.output = inputs, out
            self._widget = widgets.VBox([widgets.HBox(list(inputs.values())), out])
        return self._widget

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
