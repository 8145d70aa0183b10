"""The live explorers, driven the way a reader moves a slider."""

from __future__ import annotations

import warnings

import matplotlib
import pytest
import torch

import d2lmini

matplotlib.use("Agg")

SMALL = dict(num_hiddens=16, num_heads=2, num_steps=8)


def test_depth_explorer_redraws_its_one_figure_in_place():
    import matplotlib.pyplot as plt

    figures_before = plt.get_fignums()
    explorer = d2lmini.depth_explorer(max_depth=4, depth=4, placement="post", **SMALL)  # each depth: one PNG drawn
    first = explorer.image.value
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib's "More than 20 figures" warning
        # ...but not a library's deprecation notice (old matplotlib under new pyparsing says some)
        warnings.simplefilter("ignore", DeprecationWarning)
        for move in range(25):
            explorer.depth_slider.value = 1 + move % 4
    assert plt.get_fignums() == figures_before, "the explorer must not open pyplot figures"
    explorer.depth_slider.value = 4
    assert explorer.image.value == first, "same controls, same picture"
    explorer.placement_dropdown.value = "pre"
    assert explorer.image.value != first
    explorer.norm_toggle.value = "rms"
    assert len(explorer._cache) == 4 + 2  # 4 depths of post-LN, then pre-LN and pre-RMS at depth 4


def test_depth_explorer_caches_each_configuration():
    explorer = d2lmini.depth_explorer(max_depth=16, depth=16, placement="pre", **SMALL)
    calls = []
    original = d2lmini.chapters.ch04_norm_placement.probe_placements
    d2lmini.chapters.ch04_norm_placement.probe_placements = lambda *a, **k: calls.append((a, k["norm"])) or original(*a, **k)
    try:
        explorer.depth_slider.value = 15
        explorer.depth_slider.value = 16
        explorer.depth_slider.value = 15  # cached: no new measurement
    finally:
        d2lmini.chapters.ch04_norm_placement.probe_placements = original
    assert calls == [((15, ("pre",)), "layer")]


def test_depth_scaled_sandwich_is_one_of_the_placements():
    explorer = d2lmini.depth_explorer(max_depth=4, depth=4, placement="sandwich_scaled", **SMALL)
    probe = explorer.probe("sandwich_scaled", "layer", 4)
    assert probe.config["placement"] == "sandwich" and probe.config["sublayer_norm_gain"] == pytest.approx(0.5)


def test_depth_explorer_rejects_bad_initial_values():
    with pytest.raises(ValueError, match="placement must be one of"):
        d2lmini.depth_explorer(placement="middle")
    with pytest.raises(ValueError, match="depth must be in"):
        d2lmini.depth_explorer(depth=0)


def test_static_twin_embeds_every_frame_and_its_script():
    twin = d2lmini.depth_explorer_static(depths=(1, 2), placements=("post", "pre"), norms=("layer",),
                                         depth=2, **SMALL)
    html = twin.to_html()
    assert set(twin.spec["frames"]) == {"post|1", "post|2", "pre|1", "pre|2"}  # one norm: no norm control
    assert '<script type="application/json">' in html and "d2l-twin" in html
    script = html.split("<script>", 1)[1]
    assert not any(call in script for call in ("fetch(", "XMLHttpRequest", "import(", "src="))  # loads nothing
    assert twin._repr_html_() == html


def test_static_twin_refuses_missing_frames():
    controls = [dict(name="x", label="x", type="range", values=[1, 2], value=1)]
    panels = [dict(title="t", xlabel="k", ylabel="y", log=False, xmin=0, xmax=2)]
    frame = dict(title="one", panels=[[dict(y=[1.0, 2.0], x0=0, color="red")]])
    with pytest.raises(ValueError, match="missing"):
        d2lmini.StaticTwin(controls, panels, frames={"1": frame})


def test_residual_explorer_live_and_static_share_the_measurements():
    import matplotlib.pyplot as plt

    explorer = d2lmini.residual_explorer(depths=(1, 2, 4), depth=2, num_hiddens=16, num_heads=2, num_steps=4)
    assert len(explorer.frames) == 3 * 4  # depths x (no norms | pre-LN) x (with | without skips)
    figures = plt.get_fignums()
    widget = explorer.widget
    first = explorer.image.value
    explorer.inputs["stack"].value = "none|False"
    assert explorer.image.value != first
    for depth in (1, 4, 2, 1, 4):
        explorer.inputs["depth"].value = depth
    assert plt.get_fignums() == figures
    assert widget is explorer.widget
    assert explorer.static().spec["frames"] is explorer.frames


def test_qk_scale_explorer_covers_every_scale_and_setting():
    explorer = d2lmini.qk_scale_explorer(scales=(0.5, 8.0), num_hiddens=16, num_heads=2, num_steps=8)
    assert set(explorer.frames) == {"0.5|none", "8|none", "0.5|per_head", "8|per_head"}
    explorer.widget
    first = explorer.image.value
    explorer.inputs["scale"].value = "8"
    assert explorer.image.value != first
    with pytest.raises(TypeError, match="ints or strings"):
        d2lmini.StaticTwin([dict(name="s", label="s", type="range", values=[0.5], value=0.5)], [], frames={"0.5": {}})


# ----------------------------------------------------------------- bad values never reach the kernel


def test_depth_explorer_controls_never_leave_their_range():
    from traitlets import TraitError

    explorer = d2lmini.depth_explorer(max_depth=8, depth=4, placement="post", **SMALL)
    first = explorer.image.value
    explorer.depth_slider.value = 100  # a slider clamps: it never holds a depth above its maximum...
    assert explorer.depth_slider.value == 8
    explorer.depth_slider.value = -3  # ...or below 1
    assert explorer.depth_slider.value == 1
    assert set(explorer._cache) == {("post", "layer", 4), ("post", "layer", 8), ("post", "layer", 1)}
    explorer.depth_slider.value = 4
    for control, value in ((explorer.placement_dropdown, "middle"), (explorer.norm_toggle, "batch")):
        with pytest.raises(TraitError):  # a dropdown or toggle refuses what it does not offer
            control.value = value
    assert (explorer.placement_dropdown.value, explorer.norm_toggle.value) == ("post", "layer")
    assert explorer.image.value == first and explorer.message.value == ""


def test_an_impossible_configuration_shows_a_message_and_the_explorer_goes_on():
    from d2lmini.probes import probe_memory_bytes

    budget = probe_memory_bytes(8, **SMALL)  # depth 8 fits, depth 9 and more do not
    explorer = d2lmini.depth_explorer(max_depth=64, depth=4, placement="pre", max_bytes=budget, **SMALL)
    first = explorer.image.value
    explorer.depth_slider.value = 64
    assert "cannot be drawn" in explorer.message.value and "max_bytes" in explorer.message.value
    assert "depth 64" in explorer.message.value
    assert explorer.image.value == first, "the last picture stays"
    assert ("pre", "layer", 64) not in explorer._cache, "nothing was built"
    explorer.depth_slider.value = 8  # the explorer goes on
    assert explorer.message.value == "" and explorer.image.value != first
    # An error inside the probe is shown the same way, and the kernel goes on.
    original = d2lmini.chapters.ch04_norm_placement.probe_placements

    def broken(*args, **kwargs):
        raise RuntimeError("a probe that fails")

    d2lmini.chapters.ch04_norm_placement.probe_placements = broken
    try:
        explorer.depth_slider.value = 3
    finally:
        d2lmini.chapters.ch04_norm_placement.probe_placements = original
    assert "a probe that fails" in explorer.message.value
    explorer.depth_slider.value = 2
    assert explorer.message.value == ""
    with pytest.raises(ValueError, match="max_bytes"):  # an impossible start is refused when the explorer is made
        d2lmini.depth_explorer(max_depth=64, depth=64, max_bytes=budget, **SMALL)


def test_frame_explorers_refuse_values_they_have_no_frame_for():
    from traitlets import TraitError

    explorer = d2lmini.residual_explorer(depths=(1, 2, 4), depth=2, num_hiddens=16, num_heads=2, num_steps=4)
    explorer.widget
    first = explorer.image.value
    for name, value in (("depth", 3), ("depth", 64), ("stack", "layer|True")):
        with pytest.raises(TraitError):
            explorer.inputs[name].value = value
    assert explorer.inputs["depth"].value == 2 and explorer.image.value == first


def test_probe_memory_estimate_counts_weights_gradients_and_activations():
    from d2lmini.probes import probe_memory_bytes

    d, n = 64, 16
    assert probe_memory_bytes(1, d, 4, n) == 1.5 * 4 * (24 * d * d + 24 * n * d + 3 * 4 * n * n)
    assert probe_memory_bytes(10, d, 4, n) == 10 * probe_memory_bytes(1, d, 4, n)
    assert probe_memory_bytes(1, d, 4, n, dtype=torch.float64) == 2 * probe_memory_bytes(1, d, 4, n)
    assert probe_memory_bytes(1, d, 4, n, num_streams=4) > probe_memory_bytes(1, d, 4, n)
    with pytest.raises(ValueError, match="depth"):
        probe_memory_bytes(0)
    with pytest.raises(TypeError, match="dtype"):
        probe_memory_bytes(dtype=torch.int64)


def test_static_twin_text_form_is_the_same_on_every_run():
    """Where a notebook cannot show HTML it shows the twin's text form: no memory address in it."""
    explorer = d2lmini.qk_scale_explorer(scales=(0.5, 8.0), num_hiddens=16, num_heads=2, num_steps=8)
    text = repr(explorer.static())
    assert text == "<StaticTwin: 4 frames over scale, qk_norm>", text


def test_the_depth_twin_with_one_norm_has_no_norm_control():
    twin = d2lmini.depth_explorer_static(depths=(1, 2), norms=("layer",), dtype=torch.float64,
                                         num_steps=8, num_hiddens=16, num_heads=2)
    assert [c["name"] for c in twin.spec["controls"]] == ["placement", "depth"]  # nothing that cannot move
    assert all(key.count("|") == 1 for key in twin.spec["frames"])


def test_text_twin_checks_its_controls_and_texts():
    from d2lmini.widgets import TextExplorer, TextTwin

    controls = [{"name": "t", "label": "temperature", "options": [["0.5", "0.5"], ["1.0", "1.0"]], "value": "1.0"}]
    twin = TextTwin(controls, {"0.5": "cold", "1.0": "warm"}, description="samples")
    html = twin.to_html()
    assert "warm" in html and "<select data-control=\"t\">" in html and 'value="1.0" selected' in html
    assert TextExplorer(controls, {"0.5": "cold", "1.0": "warm"}).static().key(t="0.5") == "0.5"
    with pytest.raises(ValueError, match="missing"):
        TextTwin(controls, {"0.5": "cold"})
    with pytest.raises(ValueError, match="initial value"):
        TextTwin([{**controls[0], "value": "2.0"}], {"0.5": "cold", "1.0": "warm"})
    with pytest.raises(TypeError, match="strings"):
        TextTwin([{**controls[0], "options": [[0.5, "0.5"]], "value": 0.5}], {"0.5": "cold"})
    with pytest.raises(TypeError, match="str texts"):
        TextTwin(controls, {"0.5": 1, "1.0": 2})
    with pytest.raises(TypeError, match="name, label"):
        TextTwin([{"name": "t"}], {})
