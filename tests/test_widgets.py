"""The live explorers, driven the way a reader moves a slider."""

from __future__ import annotations

import time
import warnings

import matplotlib
import pytest

import d2lmini

matplotlib.use("Agg")

SMALL = dict(num_hiddens=16, num_heads=2, num_steps=8)


def test_depth_explorer_redraws_its_one_figure_in_place():
    import matplotlib.pyplot as plt

    figures_before = plt.get_fignums()
    explorer = d2lmini.depth_explorer(max_depth=8, depth=4, placement="post", **SMALL)
    first = explorer.image.value
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib's "More than 20 figures" warning
        for move in range(25):
            explorer.depth_slider.value = 1 + move % 8
    assert plt.get_fignums() == figures_before, "the explorer must not open pyplot figures"
    explorer.depth_slider.value = 4
    assert explorer.image.value == first, "same controls, same picture"
    explorer.placement_dropdown.value = "pre"
    assert explorer.image.value != first
    explorer.norm_toggle.value = "rms"
    assert len(explorer._cache) == 8 + 2  # 8 depths of post-LN, then pre-LN and pre-RMS at depth 4


def test_depth_explorer_caches_each_configuration():
    explorer = d2lmini.depth_explorer(max_depth=16, depth=16, placement="pre", **SMALL)
    calls = []
    original = d2lmini.widgets.probe_placements
    d2lmini.widgets.probe_placements = lambda *a, **k: calls.append((a, k["norm"])) or original(*a, **k)
    try:
        explorer.depth_slider.value = 15
        explorer.depth_slider.value = 16
        start = time.perf_counter()
        explorer.depth_slider.value = 15
        cached_redraw = time.perf_counter() - start
    finally:
        d2lmini.widgets.probe_placements = original
    assert calls == [((15, ("pre",)), "layer")]
    assert cached_redraw < 5.0  # a sanity bound only; latency is measured in benchmarks/


def test_depth_scaled_sandwich_is_one_of_the_placements():
    explorer = d2lmini.depth_explorer(max_depth=4, depth=4, placement="sandwich_scaled", **SMALL)
    probe = explorer.probe("sandwich_scaled", "layer", 4)
    assert probe.config["placement"] == "sandwich" and probe.config["sublayer_norm_gain"] == pytest.approx(0.5)


def test_depth_explorer_rejects_bad_initial_values():
    with pytest.raises(ValueError, match="placement must be one of"):
        d2lmini.depth_explorer(placement="middle")
    with pytest.raises(ValueError, match="depth must be in"):
        d2lmini.depth_explorer(depth=0)
