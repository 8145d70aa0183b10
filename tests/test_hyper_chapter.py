"""The experiments of the chapter "Beyond one residual stream" (d2lmini.chapters.ch10_hyper_connections)."""

import math

import pytest
import torch

import d2lmini
from d2lmini.chapters import ch10_hyper_connections as ch10
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
    probes = ch10.probe_streams(depth=2, streams=(1, 3), **SMALL)
    assert list(probes) == ["pre", 1, 3]
    assert probes["pre"].config["norm"] == "rms" and probes[3].config["num_streams"] == 3
    table = ch10.streams_table(probes, ks=(1, 2))
    assert list(table.index.get_level_values("stack").unique()) == ["pre-LN", "mHC, n = 1", "mHC, n = 3"]


@pytest.mark.parametrize("kind", ch10.MIXINGS)
def test_mixing_matrices_are_normalized_as_named(kind):
    H = ch10.mixing_matrices(kind, depth=5, num_streams=4, logit_std=1.0, num_stacks=3, seed=2)
    assert H.shape == (3, 5, 4, 4) and H.dtype == torch.float64
    rows, cols = H.sum(dim=-1), H.sum(dim=-2)
    if kind == "sinkhorn":
        assert bool((H > 0).all())
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-3) and torch.allclose(cols, torch.ones_like(cols), atol=1e-3)
    else:  # the identity plus a perturbation: neither rows nor columns are normalized
        assert not torch.allclose(cols, torch.ones_like(cols), atol=1e-2)
        assert 0.5 < float(torch.diagonal(H, dim1=-2, dim2=-1).mean()) < 1.5


def test_hc_style_mixing_is_as_far_from_the_identity_as_mhc_from_its_centre():
    mhc = ch10.mixing_matrices("sinkhorn", depth=50, logit_std=2.0, num_stacks=4, seed=1)
    hc = ch10.mixing_matrices("hc", depth=50, logit_std=2.0, num_stacks=4, seed=1)
    assert float((hc - torch.eye(4, dtype=torch.float64)).std()) == pytest.approx(float((mhc - 0.25).std()), rel=0.1)


def test_product_gains_of_known_matrices():
    perm = torch.eye(3, dtype=torch.float64)[[1, 2, 0]]
    gains = ch10.product_gains(torch.stack([perm, 2 * perm]))  # one stack of two layers
    assert gains["spectral"].shape == (1, 2)
    assert gains["spectral"][0].tolist() == pytest.approx([1.0, 2.0])
    assert gains["mean_drift"][0].tolist() == pytest.approx([0.0, 1.0])
    both = ch10.product_gains(torch.stack([torch.stack([perm, perm]), torch.stack([perm, 2 * perm])]))
    torch.testing.assert_close(both["spectral"], torch.tensor([[1.0, 1.0], [1.0, 2.0]], dtype=torch.float64))


def test_product_gains_bad_input():
    with pytest.raises(TypeError, match="matrices"):
        ch10.product_gains(torch.ones(2, 3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="matrices"):
        ch10.product_gains(torch.ones(2, 3, 4))


def test_doubly_stochastic_products_do_not_expand_and_hc_style_ones_do():
    sweep = ch10.mixing_sweep(logit_stds=(2.0,), depth=32, num_stacks=50, seed=0)
    assert float(sweep[(2.0, "sinkhorn")]["spectral"].max()) < 1.01
    assert float(sweep[(2.0, "hc")]["spectral"][:, -1].median()) > 10
    table = ch10.mixing_table(sweep, ks=(1, 32), names={2.0: "two"})
    assert list(table.index) == [("two", ch10.MIXING_LABELS["sinkhorn"]), ("two", ch10.MIXING_LABELS["hc"])]
    assert list(table.columns) == ["||P_1||", "||P_32||", "largest ||P_k||", "column-sum error, k = 32"]


def test_v4_logit_std():
    assert ch10.v4_logit_std(4096, 4) == pytest.approx(0.02 * 128)


def test_mixing_matrices_bad_input():
    with pytest.raises(ValueError, match="kind"):
        ch10.mixing_matrices("doubly", 2)
    with pytest.raises(ValueError, match="logit_std"):
        ch10.mixing_matrices("sinkhorn", 2, logit_std=0.0)
    with pytest.raises(ValueError, match="num_stacks"):
        ch10.mixing_matrices("hc", 2, num_stacks=0)


def test_first_block_measures_the_mappings_and_the_streams():
    small = ch10.first_block(16, 2, num_streams=3, num_steps=4, seed=0)
    assert small["d"] == 16 and small["logit std, predicted"] == pytest.approx(0.02 * math.sqrt(48))
    assert 0 < small["H^pre"][0] <= small["H^pre"][1] < 1.01 and 0 < small["H^post"][0] <= small["H^post"][1] < 2
    assert 0 <= small["H^res"][0] <= small["H^res"][1] <= 1 + 1e-5
    assert 0 < small["apart"] < 1 and small == ch10.first_block(16, 2, num_streams=3, num_steps=4, seed=0)
    one = ch10.first_block(16, 2, num_streams=1, num_steps=4, seed=0)
    assert one["apart"] == 0.0  # a single stream has no spread around its mean
    table = ch10.regime_table([small, ch10.first_block(24, 2, num_steps=4)])
    assert list(table.index) == ["d = 16", "d = 24"] and table.iloc[0]["H^post"].count(" to ") == 1
    with pytest.raises(ValueError, match="num_steps"):
        ch10.first_block(16, 2, num_steps=1)


def test_logit_scale_of_the_first_block_grows_with_the_width():
    """The measured logits follow 0.02 sqrt(n d), and the wider block spreads H^post further."""
    narrow, wide = ch10.first_block(32, 2, num_steps=8), ch10.first_block(512, 2, num_steps=8)
    for r in (narrow, wide):
        assert r["logit std, measured"] == pytest.approx(r["logit std, predicted"], rel=0.25)
    assert wide["H^post"][1] - wide["H^post"][0] > narrow["H^post"][1] - narrow["H^post"][0]


def test_compare_with_deepseek_v4_is_exact_or_unavailable():
    result = ch10.compare_with_deepseek_v4(num_hiddens=32, num_streams=3)
    if result is None:
        pytest.skip("this transformers has no DeepSeek-V4")
    assert set(result) == {"DeepseekV4HyperConnection", "DeepseekV4HyperHead"}
    assert all(out <= 1e-5 and grad <= 1e-5 for out, grad in result.values()), result


def test_compare_with_deepseek_v4_reports_a_missing_model(monkeypatch):
    monkeypatch.setattr(ch10, "_v4_classes", lambda *args: None)
    assert ch10.compare_with_deepseek_v4() is None


def test_hyper_twin_has_a_streams_slider_and_a_frame_for_every_setting():
    twin = ch10.hyper_depth_explorer_static(depths=(1, 2), streams=(1, 2), depth=2, num_streams=2, **SMALL)
    assert [c["name"] for c in twin.spec["controls"]] == ["placement", "depth", "streams"]
    assert set(twin.spec["frames"]) == {f"{p}|{L}|{n}" for p in ("pre", "mhc") for L in (1, 2) for n in (1, 2)}
    # the dashed reference makes every control change the drawing, pre-LN's frames included
    assert twin.spec["frames"]["pre|2|1"] != twin.spec["frames"]["pre|2|2"]
    # every stack of this explorer uses RMSNorm, so its pre-LN is named so (chapter 4's keeps "pre-LN (GPT-2)")
    assert twin.spec["frames"]["mhc|2|1"]["panels"][0][1]["label"] == "pre-LN (RMSNorm)"
    assert ["pre", "pre-LN (RMSNorm)"] in twin.spec["controls"][0]["options"]
    assert twin.spec["frames"]["pre|2|1"]["title"].startswith("pre-LN (RMSNorm), L = 2: ")  # RMSNorm named once
    assert twin.spec["frames"]["mhc|2|1"]["title"].startswith("mHC, n = 1, L = 2: ")  # as in streams_table
    assert twin.spec["frames"]["pre|2|2"]["panels"][0][1]["label"] == "mHC, n = 2"


def test_chapter_4_explorer_keeps_its_pre_ln_label():
    twin = d2lmini.depth_explorer_static(depths=(1,), placements=("post", "pre"), norms=("layer",), depth=1,
                                         placement="pre", **SMALL)
    assert ["pre", "pre-LN (GPT-2)"] in twin.spec["controls"][0]["options"]
    assert twin.spec["frames"]["pre|1"]["title"].startswith("pre-LN (GPT-2), ")  # one norm: no norm in the key


def test_hyper_explorer_live_has_streams_and_caches():
    import matplotlib

    matplotlib.use("Agg")
    explorer = ch10.hyper_depth_explorer(max_depth=4, depth=2, streams=(1, 2), num_streams=2, **SMALL)
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
        ch10.hyper_depth_explorer(max_depth=2, depth=1, streams=(1, 2), num_streams=4, **SMALL)


def test_stream_divergence_rebuilds_probe_depths_stack():
    """Same draws as probe_depth('mhc'): equal streams stay apart by a measurable, positive gap."""
    gaps = ch10.stream_divergence(depth=3, num_streams=2, seed=1, dtype=torch.float64, **SMALL)
    assert len(gaps) == 3 and all(0 < g < 1 for g in gaps)
    # a single stream has no spread around its mean
    assert ch10.stream_divergence(depth=2, num_streams=1, seed=1, **SMALL) == [0.0, 0.0]


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
