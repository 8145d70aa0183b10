"""The experiments of the chapter "Beyond one residual stream" (d2lmini.chapters.ch05_hyper_connections)."""

import math

import pytest
import torch

import d2lmini
from d2lmini.chapters import ch05_hyper_connections as ch05
from d2lmini.hyper import HyperConnectedBlock, HyperHead, expand_streams
from d2lmini.probes import measure_stack, probe_depth

SMALL = dict(num_hiddens=16, num_heads=2, num_steps=8)


def test_probe_depth_mhc_is_measure_stack_on_a_hyper_connected_stack():
    probe = probe_depth("mhc", norm="rms", depth=3, num_streams=2, seed=1, **SMALL)
    assert probe.config["num_streams"] == 2 and probe.depth == 3
    assert set(probe.grad_norms) == {"W_q", "W_k", "W_v", "W_o", "W_1", "W_2"}
    assert 0 < probe.token_spread[0] <= 1 and probe.stream_rms[0] > 0
    assert probe.stream_rms == probe_depth("mhc", norm="rms", depth=3, num_streams=2, seed=1, **SMALL).stream_rms


def test_measure_stack_takes_streams():
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(HyperConnectedBlock(16, 2, num_streams=3, act="relu") for _ in range(2))
    final = torch.nn.Sequential(HyperHead(16, 3), d2lmini.make_norm("rms", 16))
    X, R = expand_streams(torch.randn(1, 8, 16), 3), torch.randn(1, 8, 16)
    rms, spread, grads = measure_stack(blocks, final, X, R)
    assert len(rms) == len(spread) == 3 and all(len(v) == 2 and min(v) > 0 for v in grads.values())
    assert spread[0] == pytest.approx(d2lmini.token_spread(X[:, :, 0]))  # equal streams: X_0's spread


def test_probe_depth_mhc_rejects_layernorm_and_bad_streams():
    with pytest.raises(ValueError, match="RMSNorm"):
        probe_depth("mhc", norm="layer", depth=1, **SMALL)
    with pytest.raises(ValueError, match="num_streams"):
        probe_depth("mhc", norm="rms", depth=1, num_streams=0, **SMALL)


def test_probe_streams_runs_pre_ln_and_every_width():
    probes = ch05.probe_streams(depth=2, streams=(1, 3), **SMALL)
    assert list(probes) == ["pre", 1, 3]
    assert probes["pre"].config["norm"] == "rms" and probes[3].config["num_streams"] == 3
    table = ch05.streams_table(probes, ks=(1, 2))
    assert list(table.index.get_level_values("stack").unique()) == ["pre-LN", "mHC, n = 1", "mHC, n = 3"]


@pytest.mark.parametrize("kind", ch05.MIXINGS)
def test_mixing_matrices_are_positive_and_normalized_as_named(kind):
    H = ch05.mixing_matrices(kind, depth=5, num_streams=4, logit_std=1.0, seed=2)
    assert H.shape == (5, 4, 4) and H.dtype == torch.float64 and bool((H > 0).all())
    rows, cols = H.sum(dim=-1), H.sum(dim=-2)
    if kind == "sinkhorn":
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-3) and torch.allclose(cols, torch.ones_like(cols), atol=1e-3)
    elif kind == "softmax":
        assert torch.allclose(rows, torch.ones_like(rows)) and not torch.allclose(cols, torch.ones_like(cols), atol=1e-2)
    else:
        assert not torch.allclose(rows, torch.ones_like(rows), atol=1e-2)


def test_product_gains_of_known_matrices():
    perm = torch.eye(3, dtype=torch.float64)[[1, 2, 0]]
    gains = ch05.product_gains(torch.stack([perm, 2 * perm]))
    assert gains["spectral"] == pytest.approx([1.0, 2.0]) and gains["mean_drift"] == pytest.approx([0.0, 1.0])


def test_doubly_stochastic_products_do_not_expand_and_unnormalized_ones_do():
    sweep = ch05.mixing_sweep(logit_stds=(2.0,), depth=32, seed=0)
    assert max(sweep[(2.0, "sinkhorn")]["spectral"]) < 1.01
    assert max(sweep[(2.0, "softmax")]["spectral"]) <= math.sqrt(4) + 1e-9  # a row-stochastic matrix: <= sqrt(n)
    assert sweep[(2.0, "unnormalized")]["spectral"][-1] > 1e6


def test_v4_logit_std():
    assert ch05.v4_logit_std(4096, 4) == pytest.approx(0.02 * 128)


def test_mixing_matrices_bad_input():
    with pytest.raises(ValueError, match="kind"):
        ch05.mixing_matrices("doubly", 2)
    with pytest.raises(ValueError, match="logit_std"):
        ch05.mixing_matrices("sinkhorn", 2, logit_std=0.0)


def test_compare_with_deepseek_v4_is_exact_or_unavailable():
    result = ch05.compare_with_deepseek_v4(num_hiddens=32, num_streams=3)
    if result is None:
        pytest.skip("this transformers has no DeepSeek-V4")
    assert set(result) == {"DeepseekV4HyperConnection", "DeepseekV4HyperHead"}
    assert all(out <= 1e-5 and grad <= 1e-5 for out, grad in result.values()), result


def test_compare_with_deepseek_v4_reports_a_missing_model(monkeypatch):
    monkeypatch.setattr(ch05, "_v4_classes", lambda *args: None)
    assert ch05.compare_with_deepseek_v4() is None


def test_hyper_twin_has_a_streams_slider_and_a_frame_for_every_setting():
    twin = ch05.hyper_depth_explorer_static(depths=(1, 2), streams=(1, 2), depth=2, num_streams=2, **SMALL)
    assert [c["name"] for c in twin.spec["controls"]] == ["placement", "depth", "streams"]
    assert set(twin.spec["frames"]) == {f"{p}|{L}|{n}" for p in ("pre", "mhc") for L in (1, 2) for n in (1, 2)}
    # the dashed reference makes every control change the drawing, pre-LN's frames included
    assert twin.spec["frames"]["pre|2|1"] != twin.spec["frames"]["pre|2|2"]
    # every stack of this explorer uses RMSNorm, so its pre-LN is named so (chapter 4's keeps "pre-LN (GPT-2)")
    assert twin.spec["frames"]["mhc|2|1"]["panels"][0][1]["label"] == "pre-LN (RMSNorm)"
    assert ["pre", "pre-LN (RMSNorm)"] in twin.spec["controls"][0]["options"]
    assert twin.spec["frames"]["pre|2|1"]["title"].startswith("pre-LN (RMSNorm), ")


def test_chapter_4_explorer_keeps_its_pre_ln_label():
    twin = d2lmini.depth_explorer_static(depths=(1,), placements=("post", "pre"), norms=("layer",), depth=1,
                                         placement="pre", **SMALL)
    assert ["pre", "pre-LN (GPT-2)"] in twin.spec["controls"][0]["options"]
    assert twin.spec["frames"]["pre|1|layer"]["title"].startswith("pre-LN (GPT-2), ")


def test_hyper_explorer_live_has_streams_and_caches():
    import matplotlib

    matplotlib.use("Agg")
    explorer = ch05.hyper_depth_explorer(max_depth=4, depth=2, streams=(1, 2), num_streams=2, **SMALL)
    first = explorer.image.value
    explorer.streams_slider.value = 1
    assert explorer.image.value != first
    explorer.streams_slider.value = 2
    assert explorer.image.value == first
    explorer.placement_dropdown.value = "pre"
    assert ("pre", "rms", 2) in explorer._cache and ("mhc", "rms", 2, 2) in explorer._cache


def test_explorers_refuse_mhc_with_layernorm():
    with pytest.raises(ValueError, match="RMSNorm"):
        d2lmini.depth_explorer_static(depths=(1,), placements=("pre", "mhc"), norms=("layer", "rms"), **SMALL)
    with pytest.raises(ValueError, match="num_streams"):
        ch05.hyper_depth_explorer(max_depth=2, depth=1, streams=(1, 2), num_streams=4, **SMALL)


def test_stream_divergence_rebuilds_probe_depths_stack():
    """Same draws as probe_depth('mhc'): equal streams stay apart by a measurable, positive gap."""
    gaps = ch05.stream_divergence(depth=3, num_streams=2, seed=1, dtype=torch.float64, **SMALL)
    assert len(gaps) == 3 and all(0 < g < 1 for g in gaps)
    # a single stream has no spread around its mean
    assert ch05.stream_divergence(depth=2, num_streams=1, seed=1, **SMALL) == [0.0, 0.0]


def test_stream_divergence_uses_the_probed_weights():
    from d2lmini.probes import stream_rms
    probe = probe_depth("mhc", norm="rms", depth=2, num_streams=2, seed=3, dtype=torch.float64, **SMALL)
    # rebuild as stream_divergence does and compare the stream RMS after each block
    from d2lmini.probes import init_linear_weights_
    from d2lmini.seeding import seeded
    with seeded(3):
        blocks = [init_linear_weights_(HyperConnectedBlock(16, 2, num_streams=2, act="relu"), "xavier_uniform")
                  for _ in range(2)]
        HyperHead(16, 2)
        X = torch.randn(1, 8, 16).double()
    X = expand_streams(X, 2)
    with torch.no_grad():
        for k, block in enumerate(blocks, start=1):
            X = block.double()(X)
            assert stream_rms(X) == pytest.approx(probe.stream_rms[k], rel=1e-12)
