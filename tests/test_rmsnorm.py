"""The chapter "RMSNorm: keep the scale, drop the centring": its measurements and counter-example."""

from __future__ import annotations

import math

import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

import d2lmini
from d2lmini import timing as tm
from d2lmini.chapters import ch05_rmsnorm as rn
from d2lmini.norms import LayerNormByHand

# --- the counter-example and the same-style LayerNorm -------------------------------


def test_half_precision_sum_matches_sum_in_float64_and_pads():
    X = torch.randn(3, 37, dtype=torch.float64)  # 37: not a power of two
    assert torch.allclose(rn.half_precision_sum(X), X.sum(-1, keepdim=True))
    assert rn.half_precision_sum(X).shape == (3, 1)


def test_half_precision_sum_really_sums_in_half_precision():
    # bfloat16 keeps 8 significant bits: 1 + 2**-8 rounds to 1 at the first level of
    # the tree, so the small terms vanish; an exact sum keeps them.
    X = torch.tensor([1.0, 2.0**-8] * 2048, dtype=torch.bfloat16)[None]
    assert float(rn.half_precision_sum(X)) == 2048.0
    assert float(X.double().sum()) == 2056.0
    # float16 overflows once a partial sum passes 65504 (torch's float32 accumulator does not)
    Y = torch.full((1, 4096), 20.0, dtype=torch.float16)
    assert torch.isinf(rn.half_precision_sum(Y)).all()
    assert float(Y.mean()) == 20.0


def test_no_upcast_norm_overflows_where_the_upcast_does_not():
    X = (torch.randn(4, 4096) * 10).half()  # sum of squares ~ 4e5 > 65504
    assert (rn.rms_norm_no_upcast(X) == 0).all()
    Y = d2lmini.RMSNorm(4096).half()(X)
    assert torch.isfinite(Y).all() and Y.float().pow(2).mean(-1).sub(1).abs().max() < 1e-2


def test_variants_agree_with_rmsnorm_in_float64():
    X = torch.randn(5, 64, dtype=torch.float64) * 3
    weight = torch.rand(64, dtype=torch.float64) + 0.5
    ref = d2lmini.RMSNorm(64).double()
    with torch.no_grad():
        ref.weight.copy_(weight)
        expected = ref(X)
    assert torch.allclose(rn.rms_norm_no_upcast(X, weight), expected)
    assert torch.allclose(rn.rms_norm_torch_mean(X, weight), expected)


def test_layer_norm_by_hand_matches_torch():
    X = torch.randn(2, 7, 32) * 2 + 1
    ours, theirs = LayerNormByHand(32), nn.LayerNorm(32)
    with torch.no_grad():
        for p in (ours, theirs):
            p.weight.copy_(torch.linspace(0.5, 1.5, 32))
            p.bias.copy_(torch.linspace(-1, 1, 32))
        assert torch.allclose(ours(X), theirs(X), atol=1e-5)
    assert sum(p.numel() for p in ours.parameters()) == 64


@pytest.mark.parametrize("call, error", [
    (lambda: rn.rms_norm_no_upcast(torch.ones(3, 4, dtype=torch.int64)), TypeError),
    (lambda: rn.rms_norm_no_upcast([1.0, 2.0]), TypeError),
    (lambda: rn.rms_norm_no_upcast(torch.ones(3, 4), eps=0.0), ValueError),
    (lambda: rn.rms_norm_no_upcast(torch.ones(3, 4), weight=torch.ones(5)), ValueError),
    (lambda: rn.rms_norm_torch_mean(torch.tensor(1.0)), ValueError),
    (lambda: LayerNormByHand(0), ValueError),
    (lambda: LayerNormByHand(8)(torch.ones(2, 4)), ValueError),
])
def test_bad_arguments_of_the_norms(call, error):
    with pytest.raises(error):
        call()


# --- RMSNorm against LayerNorm -----------------------------------------------------


def test_rmsnorm_equals_layernorm_on_centred_tokens_only():
    result = rn.compare_with_layernorm(num_hiddens=128, num_tokens=16, offset=2.0, seed=1)
    assert result["max_dev_centred"] < 1e-5
    assert result["max_dev_raw"] > 0.5  # with a mean of 2 they differ at order 1
    assert result["max_abs_token_mean"] < 1e-5
    assert result == rn.compare_with_layernorm(num_hiddens=128, num_tokens=16, offset=2.0, seed=1)
    assert result != rn.compare_with_layernorm(num_hiddens=128, num_tokens=16, offset=2.0, seed=2)


def test_compare_with_layernorm_rejects_bad_arguments():
    with pytest.raises(ValueError, match="offset"):
        rn.compare_with_layernorm(offset=float("nan"))
    with pytest.raises(TypeError, match="num_tokens"):
        rn.compare_with_layernorm(num_tokens=2.0)


# --- timing --------------------------------------------------------------------------


def test_machine_description_names_the_machine():
    machine = tm.machine_description()
    assert machine["processor"] and machine["torch"] == torch.__version__
    assert machine["threads"] == torch.get_num_threads()


def _assert_times_are_measurements(timing):
    """Both modes, every timed norm, each a positive finite number of milliseconds.

    Which norm is faster is not asserted: comparing two timings belongs to benchmarks/,
    which print ratios; a test only checks that the timing runs and reports sensibly."""
    assert set(timing.times_ms) == {"forward", "forward_backward"}
    for times in timing.times_ms.values():
        assert set(times) == set(tm.TIMED_NORMS)
        assert all(isinstance(t, float) and math.isfinite(t) and t > 0 for t in times.values()), times


def test_time_norms_in_process_shape_and_keys(two_threads):
    timing = tm.time_norms(shape=(1, 8, 64), repeats=3, warmup=1, fresh_process=False, clock="wall")
    assert torch.get_num_threads() == two_threads  # restored after timing on one thread
    _assert_times_are_measurements(timing)
    assert timing.machine["threads"] == 1
    assert timing.shape == (1, 8, 64) and timing.repeats == 3 and not timing.fresh_process
    forward = timing.times_ms["forward"]
    assert timing.ratio("rms_d2lmini", "layer_torch") == forward["rms_d2lmini"] / forward["layer_torch"]
    table = timing.table()
    assert list(table.index) == list(tm.TIMED_NORMS.values())
    assert table.iloc[:, 0].tolist() == list(forward.values())
    with pytest.raises(KeyError):
        timing.ratio("rms", "layer_torch")
    with pytest.raises(KeyError):
        timing.ratio("rms_torch", "layer_torch", mode="backward")


def test_time_norms_in_a_fresh_process():
    timing = tm.time_norms(shape=(1, 8, 64), repeats=3, warmup=1)
    assert timing.fresh_process and timing.clock == "thread"
    assert timing.machine["threads"] == 1
    _assert_times_are_measurements(timing)
    if timing.page_faults is not None:
        assert set(timing.page_faults) == {"forward", "forward_backward"}
        assert set(timing.page_faults["forward"]) == set(tm.TIMED_NORMS)
    # the fresh process lists every norm's operations (which ones is PyTorch's business)
    assert set(timing.ops) == set(tm.TIMED_NORMS)
    for ops in timing.ops.values():
        assert ops and all(isinstance(op, str) and op and not op.startswith("aten::") for op in ops), ops


class _ExpThenNeg(nn.Module):
    def forward(self, X):
        return torch.neg(torch.exp(X))


def test_forward_ops_lists_a_forwards_operations_in_call_order():
    assert tm.forward_ops(_ExpThenNeg(), torch.ones(2, 3)) == ["exp", "neg"]


def test_forward_ops_of_a_forward_without_operations_is_empty():
    # Fails if an empty event list is taken for a missing one.
    assert tm.forward_ops(nn.Identity(), torch.ones(2, 3)) == []


def test_forward_ops_rejects_bad_arguments():
    with pytest.raises(TypeError, match="norm"):
        tm.forward_ops(lambda X: X, torch.ones(2, 4))
    with pytest.raises(TypeError, match="X"):
        tm.forward_ops(nn.LayerNorm(4), [1.0, 2.0])


@pytest.mark.parametrize("kwargs, error", [
    (dict(shape=(8, 64)), ValueError),
    (dict(shape=(1, 0, 8)), ValueError),
    (dict(repeats=0), ValueError),
    (dict(warmup=-1), ValueError),
    (dict(num_threads=0), ValueError),
    (dict(clock="cpu"), ValueError),
    (dict(fresh_process=1), TypeError),
])
def test_time_norms_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        tm.time_norms(**kwargs)


# --- the float32 upcast --------------------------------------------------------------


def test_half_precision_errors_show_the_claims():
    rows = rn.half_precision_errors(scales=(1e-3, 1.0, 10.0, 100.0), num_hiddens=4096,
                                    num_tokens=4, seed=0)
    by = {(r["dtype"], r["scale"]): r for r in rows}
    assert len(rows) == 8
    for row in rows:  # the upcast is at the dtype's rounding level everywhere
        assert row["upcast"] < (4e-3 if row["dtype"] == "bfloat16" else 5e-4)
    # float16 overflows: the sum of squares above 65504 (RMS 10), the squares above 256 (RMS 100)
    assert by["float16", 10.0]["no_upcast"] == 1.0 and by["float16", 10.0]["torch_mean"] < 2e-3
    assert by["float16", 100.0]["torch_mean"] == 1.0
    assert by["float16", 10.0]["max_sum_of_squares"] > 65504 > by["float16", 1.0]["max_sum_of_squares"]
    # float16 underflows: squares of 1e-3 are subnormal
    assert by["float16", 1e-3]["no_upcast"] > 10 * by["float16", 1e-3]["upcast"]
    # bfloat16 never overflows but rounds the statistic
    for scale in (1e-3, 1.0, 10.0, 100.0):
        assert by["bfloat16", scale]["upcast"] < by["bfloat16", scale]["no_upcast"] < 0.05
    assert rows == rn.half_precision_errors(scales=(1e-3, 1.0, 10.0, 100.0), num_hiddens=4096,
                                            num_tokens=4, seed=0)


def test_half_precision_errors_accepts_dtypes_and_rejects_bad_ones():
    rows = rn.half_precision_errors(dtypes=(torch.float16,), scales=(1.0,), num_hiddens=64,
                                    num_tokens=2)
    assert [r["dtype"] for r in rows] == ["float16"]
    with pytest.raises(ValueError, match="dtypes"):
        rn.half_precision_errors(dtypes=("float32",))
    with pytest.raises(TypeError, match="dtypes"):
        rn.half_precision_errors(dtypes=torch.float16)
    with pytest.raises(ValueError, match="scales"):
        rn.half_precision_errors(scales=(0.0,))


def test_relative_error():
    ref = torch.ones(2, 4)
    assert rn.relative_error(ref, ref) == 0.0
    assert rn.relative_error(torch.zeros(2, 4), ref) == 1.0
    assert math.isclose(rn.relative_error(ref * 1.5, ref), 0.5)
    with pytest.raises(ValueError):
        rn.relative_error(ref, torch.ones(4, 2))


def test_plot_half_precision_errors():
    rows = rn.half_precision_errors(scales=(0.1, 1.0), num_hiddens=64, num_tokens=2)
    fig = rn.plot_half_precision_errors(rows)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert all(len(ax.get_lines()) == len(rn.HALF_VARIANTS) for ax in fig.axes)
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_xlabel()
    with pytest.raises(ValueError):
        rn.plot_half_precision_errors([])
    table = rn.half_precision_table(rows)
    assert table.shape == (4, 4)
    assert list(table.index) == [("bfloat16", 0.1), ("bfloat16", 1.0), ("float16", 0.1),
                                 ("float16", 1.0)]
    assert list(table.columns) == ["max sum x²", "upcast", "torch .mean()", "half throughout"]
    with pytest.raises(ValueError):
        rn.half_precision_table([])


# --- the measuring cores the chapter prints ------------------------------------------


def test_layernorm_gap_is_rounding_on_centred_tokens_and_large_otherwise():
    X = torch.randn(8, 128) + 1.0
    centred = X - X.mean(-1, keepdim=True)
    assert rn.layernorm_gap(centred) < 1e-5
    assert rn.layernorm_gap(X) > 0.5
    with pytest.raises(TypeError):
        rn.layernorm_gap(torch.ones(2, 4, dtype=torch.int64))


def test_half_precision_row_reports_the_float16_overflow():
    X = (10 * torch.randn(4, 4096)).half()
    row = rn.half_precision_row(X)
    assert set(row) == {"max_sum_of_squares", *rn.HALF_VARIANTS}
    assert row["max_sum_of_squares"] > 65504 and row["no_upcast"] == 1.0
    assert row["upcast"] < 1e-3 and row["torch_mean"] < 1e-2
    assert rn.half_precision_errors(dtypes=("float16",), scales=(10.0,), num_tokens=4)[0]["scale"] == 10.0


# --- does it train as well? ---------------------------------------------------------


def _tiny_corpus():
    from d2lmini.data import CharCorpus
    text = "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(200))
    return CharCorpus.from_text(text)


def test_norm_comparison_equals_one_train_lm_per_norm_and_seed():
    """Each norm's seeds train in one lockstep, the norms in two workers: every model's losses are
    those train_lm gives it alone."""
    from d2lmini.train import train_lm
    corpus = _tiny_corpus()
    small = dict(num_steps=6, batch_size=4, seq_len=16, eval_batches=2, warmup_steps=2)
    result = rn.norm_comparison(corpus, seeds=(0, 3), **small)
    assert result.norms == ["layer", "rms"] and result.seeds == [0, 3]
    cfg = result.config
    for norm in ("layer", "rms"):
        for i, seed in enumerate((0, 3)):
            alone = train_lm(corpus, num_steps=6, batch_size=4, seq_len=16, lr=cfg["lr"], warmup_steps=2,
                             schedule="cosine", eval_every=6, eval_batches=2, seed=seed, norm=norm,
                             num_hiddens=cfg["num_hiddens"], num_heads=cfg["num_heads"],
                             num_layers=cfg["num_layers"], placement="pre", act="swiglu", bias=False,
                             betas=cfg["betas"], clip_norm=cfg["clip_norm"])
            assert result.train_loss[norm][i] == pytest.approx(alone.train_loss, rel=1e-5, abs=1e-6)
            assert result.val_loss[norm][i] == pytest.approx(alone.val_loss[-1], rel=1e-5, abs=1e-6)
    table = result.table()
    assert list(table.columns) == ["LayerNorm", "RMSNorm"]
    assert list(table.index) == ["seed 0", "seed 3", "mean", "std"]
    assert table.loc["mean", "RMSNorm"] == pytest.approx(sum(result.val_loss["rms"]) / 2)
    assert result.std("rms") >= 0 and result.seconds > 0


def test_the_two_norms_of_a_seed_start_from_the_same_weights():
    from d2lmini.train import seeded_tiny_lm
    a = seeded_tiny_lm(30, 5, num_hiddens=16, num_heads=2, num_layers=1, norm="layer").state_dict()
    b = seeded_tiny_lm(30, 5, num_hiddens=16, num_heads=2, num_layers=1, norm="rms").state_dict()
    assert set(b) <= set(a)
    for name, value in b.items():
        assert torch.equal(a[name], value), name


@pytest.mark.parametrize("kwargs, error", [
    (dict(corpus="text"), TypeError),
    (dict(norms=("layer", "batch")), ValueError),
    (dict(norms=("rms", "rms")), ValueError),
    (dict(seeds=(1, 1)), ValueError),
    (dict(seeds=(-1,)), ValueError),
    (dict(num_stepz=3), TypeError),
    (dict(num_steps=0), ValueError),
])
def test_norm_comparison_rejects_bad_arguments(kwargs, error):
    corpus = kwargs.pop("corpus", None) or _tiny_corpus()
    with pytest.raises(error):
        rn.norm_comparison(corpus, **kwargs)
