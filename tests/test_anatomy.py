"""The chapter "Anatomy": the diagram, stacking, where positions meet, parameters, the running sum, the decoder."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from d2lmini import TransformerBlock, TransformerDecoderBlock
from d2lmini.chapters import ch01_anatomy as anatomy
from d2lmini.chapters.ch01_anatomy import (count_parameters, decoder_block_checks, decoder_effects, draw_block,
                                           make_stack, parameter_counts, parameter_table, position_mixing,
                                           record_contributions, residual_sum, shared_parameters, stack_anatomy,
                                           sublayer_labels)

SMALL = dict(num_hiddens=16, num_heads=2)


# --------------------------------------------------------------------------- stacking


def test_stacked_blocks_keep_the_shape_and_own_their_parameters():
    result = stack_anatomy(depth=3, num_steps=5, batch_size=2, seed=0, **SMALL)
    assert result.depth == 3
    assert result.shapes == [((2, 5, 16), (2, 5, 16))] * 3
    assert result.same_parameter_shapes
    assert result.shared_tensors == 0
    assert result.w_q_gap[0] == 0.0 and min(result.w_q_gap[1:]) > 1e-3
    assert len(set(result.num_parameters)) == 1
    assert result.num_parameters[0] == sum(p.numel() for p in TransformerBlock(16, 2).parameters())
    rows = result.rows()
    assert [row["block"] for row in rows] == [1, 2, 3]
    assert rows[0]["parameter tensors"] == len(result.parameter_shapes)


def test_shared_parameters_counts_a_block_listed_twice():
    block = TransformerBlock(**SMALL)
    tensors = len(list(block.parameters()))
    assert shared_parameters(nn.Sequential(block, TransformerBlock(**SMALL))) == 0
    assert shared_parameters([block, block]) == tensors
    assert shared_parameters([block, block, block]) == 2 * tensors
    with pytest.raises(TypeError, match="blocks\\[1\\]"):
        shared_parameters([block, "not a block"])


def test_make_stack_is_deterministic_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b = make_stack(2, seed=3, **SMALL), make_stack(2, seed=3, **SMALL)
    c = make_stack(2, seed=4, **SMALL)
    assert torch.equal(torch.random.get_rng_state(), state)
    for pa, pb, pc in zip(a.parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb)
    assert not torch.equal(a[0].attention.W_q.weight, c[0].attention.W_q.weight)


# --------------------------------------------------------------------------- positions


@pytest.mark.parametrize("block_kwargs", [{}, dict(placement="post", norm="layer", act="relu", bias=True)])
def test_only_attention_mixes_positions(block_kwargs):
    result = position_mixing(num_steps=6, seed=1, **SMALL, **block_kwargs)
    assert sorted(result.permutation) == list(range(6)) and result.permutation != list(range(6))
    assert result.block_permuted < 1e-5      # the block commutes with a permutation
    assert result.ffn_alone < 1e-5           # a token alone gets its own FFN row
    assert result.attention_alone > 1e-2     # ... but not its own attention row
    assert result.attention_alone_relative > 0.1
    assert result.attention_scale > 0
    assert result.block_permuted_causal > 1e-2  # positional information breaks the symmetry
    assert result.block_permuted_rope > 1e-3


def test_position_mixing_is_deterministic():
    assert position_mixing(num_steps=5, seed=2, **SMALL) == position_mixing(num_steps=5, seed=2, **SMALL)
    assert position_mixing(num_steps=5, seed=2, **SMALL) != position_mixing(num_steps=5, seed=3, **SMALL)


# --------------------------------------------------------------------------- parameters


def test_counts_match_the_formulas_for_a_2017_block():
    d = 32
    counts = count_parameters(TransformerBlock(d, 4, norm="layer", act="relu", placement="post", bias=True))
    assert counts["attention"] == 4 * d * d + 4 * d
    assert counts["ffn"] == 8 * d * d + 4 * d + d
    assert counts["norms"] == 2 * 2 * d
    assert counts["total"] == counts["attention"] + counts["ffn"] + counts["norms"]


def test_counts_for_gated_grouped_and_qk_normed_blocks():
    d, h, kv = 32, 8, 2
    counts = count_parameters(TransformerBlock(d, h, num_kv_heads=kv, qk_norm="per_head"))
    head_dim = d // h
    assert counts["attention"] == 2 * d * d + 2 * d * kv * head_dim + 2 * head_dim
    assert counts["ffn"] == 3 * d * round(8 * d / 3)
    assert counts["norms"] == 2 * d
    assert counts["total"] == sum(counts[part] for part in anatomy.PARTS)
    decoder = count_parameters(TransformerDecoderBlock(d, h))
    assert decoder["attention"] == 2 * 4 * d * d and decoder["norms"] == 3 * d


def test_default_shapes_are_counted_on_the_meta_device():
    rows = {row["model"]: row for row in parameter_counts()}
    assert list(rows) == ["Transformer 2017, d = 512"]
    t2017 = rows["Transformer 2017, d = 512"]
    d = 512
    assert t2017["counts"]["total"] == 12 * d * d + 4 * d + 4 * d + d + 4 * d
    llama = parameter_counts({"Llama 3 8B": anatomy.LLAMA3_8B_BLOCK})[0]
    d = 4096
    assert llama["counts"]["attention"] == 2.5 * d * d    # grouped-query attention: k, v are d/4 wide
    assert llama["counts"]["ffn"] == 3 * d * 14336        # SwiGLU, three matrices
    assert llama["counts"]["norms"] == 2 * d
    both = [t2017, llama]
    table = parameter_table(both)
    assert len(table) == 8
    for model in ("Transformer 2017, d = 512", "Llama 3 8B"):
        shares = table.loc[model, "share of block"]
        assert shares["block"] == 1.0
        assert abs(shares[["attention", "FFN", "norms"]].sum() - 1.0) < 1e-12
    assert 0.66 < table.loc["Transformer 2017, d = 512", "share of block"]["FFN"] < 0.67
    shown = parameter_table(both, formatted=True)
    assert shown.loc[("Llama 3 8B", "attention")].tolist() == ["41,943,040", "2.5", "19.2%"]
    with pytest.raises(TypeError, match="formatted"):
        parameter_table(both, formatted="yes")


def test_parameter_counts_builds_on_the_device_it_is_given():
    rows = parameter_counts({"tiny": dict(num_hiddens=8, num_heads=2)}, device="cpu")
    assert rows[0]["counts"] == count_parameters(TransformerBlock(8, 2))


def test_count_parameters_rejects_what_it_cannot_attribute():
    with pytest.raises(TypeError, match="TransformerBlock"):
        count_parameters(nn.Linear(4, 4))
    block = TransformerBlock(**SMALL)
    block.extra = nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="extra"):
        count_parameters(block)
    with pytest.raises(TypeError, match="shapes"):
        parameter_counts({"bad": 512})


# --------------------------------------------------------------------------- residual stream


@pytest.mark.parametrize("placement", ["pre", "post", "post_sublayer", "sandwich"])
def test_recording_reproduces_the_blocks_forward(placement):
    stack = make_stack(3, placement=placement, norm="layer", act="gelu", bias=True, **SMALL).eval()
    X = torch.randn(2, 5, 16)
    with torch.no_grad():
        Y, contributions = record_contributions(stack, X)
    assert len(contributions) == 6 and all(C.shape == X.shape for C in contributions)
    with torch.no_grad():
        torch.testing.assert_close(Y, stack(X), rtol=0, atol=0)
    gap = float((X + sum(contributions) - Y).abs().max())
    if placement == "post":
        assert gap > 0.1  # post-LN renormalizes the running sum
    else:
        assert gap < 1e-5


def test_recording_passes_valid_lens_to_attention():
    stack = make_stack(2, **SMALL).eval()
    X, lens = torch.randn(2, 5, 16), torch.tensor([5, 2])
    Y, _ = record_contributions(stack, X, valid_lens=lens)
    expected = stack[1](stack[0](X, lens), lens)
    torch.testing.assert_close(Y, expected, rtol=0, atol=0)
    assert not torch.allclose(Y, stack(X))


def test_recording_rejects_decoder_blocks_and_bad_inputs():
    with pytest.raises(TypeError, match="decoder"):
        record_contributions([TransformerDecoderBlock(**SMALL)], torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match="num_hiddens=16"):
        record_contributions(make_stack(1, **SMALL), torch.randn(1, 3, 8))
    for scales in ({"residual_multiplier": 0.5}, {"layer_scalar": 0.5}):
        with pytest.raises(ValueError, match="set_scales"):
            record_contributions([make_stack(1, **SMALL)[0].set_scales(**scales)], torch.randn(1, 3, 16))


def test_recording_follows_blocks_without_skip_connections():
    stack = make_stack(2, residual=False, **SMALL).eval()
    X = torch.randn(1, 4, 16)
    Y, contributions = record_contributions(stack, X)
    torch.testing.assert_close(Y, stack(X), rtol=0, atol=0)
    torch.testing.assert_close(Y, contributions[-1], rtol=0, atol=0)


def test_pre_ln_output_is_the_input_plus_every_contribution():
    result = residual_sum("pre", depth=4, num_steps=8, **SMALL)
    assert result.depth == 4 and result.labels == sublayer_labels(4)
    assert len(result.contribution_rms) == 8 and len(result.stream_rms) == 9
    assert result.recorded_vs_block == 0.0
    assert result.sum_vs_output < 1e-5
    assert abs(result.stream_rms[-1] - result.output_rms) < 1e-5
    assert result.stream_rms[0] == result.input_rms
    assert all(r > 0 for r in result.contribution_rms)
    assert result.sublayer_rms("attention") == result.contribution_rms[0::2]
    assert result.sublayer_rms("ffn") == result.contribution_rms[1::2]


def test_post_ln_output_is_not_a_running_sum():
    result = residual_sum("post", depth=4, num_steps=8, norm="layer", act="relu", **SMALL)
    assert result.recorded_vs_block == 0.0
    assert result.sum_vs_output > 0.1
    assert abs(result.output_rms - 1.0) < 1e-3  # the stream leaves through a LayerNorm


def test_residual_sum_is_deterministic_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a = residual_sum(depth=2, num_steps=6, seed=5, **SMALL)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a == residual_sum(depth=2, num_steps=6, seed=5, **SMALL)
    assert a.contribution_rms != residual_sum(depth=2, num_steps=6, seed=6, **SMALL).contribution_rms


def test_residual_sum_in_float64_is_exact_to_float64_rounding():
    result = residual_sum(depth=3, num_steps=6, dtype=torch.float64, **SMALL)
    assert result.sum_vs_output < 1e-12


def test_draw_block_draws_the_stream_two_norms_and_two_sublayers():
    fig = draw_block()
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("Norm") == 2 and texts.count("+") == 2
    assert "multi-head attention" in texts and "FFN" in texts and "residual stream" in texts
    assert len(ax.patches) == 4  # two norms, two sublayers
    with pytest.raises(ValueError, match="width"):
        draw_block(width=0)


@pytest.mark.parametrize("call, error, match", [
    (lambda: residual_sum("middle"), ValueError, "placement"),
    (lambda: residual_sum(depth=0), ValueError, "depth"),
    (lambda: residual_sum(seed=1.5), TypeError, "seed"),
    (lambda: residual_sum(dtype=torch.int64), TypeError, "dtype"),
    (lambda: residual_sum(init="zeros"), ValueError, "init"),
    (lambda: position_mixing(num_steps=1), ValueError, "num_steps"),
    (lambda: position_mixing(causal=True), ValueError, "causal"),
    (lambda: position_mixing(seed="0"), TypeError, "seed"),
    (lambda: stack_anatomy(depth=1), ValueError, "depth"),
    (lambda: make_stack(2, seed=True), TypeError, "seed"),
    (lambda: sublayer_labels(-1), ValueError, "depth"),
    (lambda: residual_sum(depth=1).sublayer_rms("norm"), ValueError, "sublayer"),
    (lambda: decoder_block_checks(num_steps=1), ValueError, "num_steps"),
    (lambda: decoder_block_checks(memory_steps=0), ValueError, "memory_steps"),
    (lambda: decoder_block_checks(seed=0.5), TypeError, "seed"),
    (lambda: draw_block(height="5"), TypeError, "height"),
])
def test_bad_arguments_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_num_parameters_counts_totals_parts_and_tied_weights_once():
    from d2lmini.parameters import BLOCK_PARTS, num_parameters

    block = TransformerBlock(**SMALL)
    assert num_parameters(block) == sum(p.numel() for p in block.parameters())
    assert num_parameters(block, BLOCK_PARTS) == count_parameters(block)
    linear = nn.Linear(4, 4)
    assert num_parameters(nn.Sequential(linear, linear)) == 20  # a tied layer counts once
    assert num_parameters(linear, {"weights": "weight", "biases": ("bias",)}) == {"weights": 16, "biases": 4,
                                                                              "total": 20}
    with pytest.raises(ValueError, match="'bias' belongs to none"):
        num_parameters(linear, {"weights": "weight"})
    with pytest.raises(TypeError, match="module"):
        num_parameters([linear])


# --------------------------------------------------------------------------- the printed measuring cores


def test_permutation_gap_is_zero_without_positions_and_not_with_a_causal_mask():
    # Fails if permutation_gap compares the wrong rows, or stops applying the permutation.
    torch.manual_seed(0)
    X, perm = torch.randn(1, 6, 16), torch.tensor([5, 3, 1, 0, 2, 4])
    block = TransformerBlock(16, 2).eval()
    with torch.no_grad():
        assert anatomy.permutation_gap(block, X, perm) < 1e-5
        assert anatomy.permutation_gap(block, X, torch.arange(6)) == 0.0
        causal = TransformerBlock(16, 2, causal=True).eval()
        causal.load_state_dict(block.state_dict())
        assert anatomy.permutation_gap(causal, X, perm) > 1e-2


def test_alone_vs_in_sequence_measures_each_token_against_its_row():
    # A sublayer that replaces every row by the mean of all rows: token i alone gives x_i,
    # in the sequence it gives the mean, so the gaps are known exactly.
    X = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [2.0, -4.0]]])
    mean = X.mean(dim=1, keepdim=True)  # [[2, 0]]
    gap, relative = anatomy.alone_vs_in_sequence(lambda Z: Z.mean(dim=1, keepdim=True).expand_as(Z), X)
    assert gap == pytest.approx(float((X - mean).abs().max()))  # 4
    assert relative == pytest.approx(float((X - mean).norm(dim=-1).max() / mean.norm()))  # sqrt(17) / 2
    # A row-wise sublayer (the FFN) gives the same output alone and in the sequence.
    ffn = TransformerBlock(16, 2).ffn
    with torch.no_grad():
        assert anatomy.alone_vs_in_sequence(ffn, torch.randn(2, 5, 16))[0] < 1e-5


@pytest.mark.parametrize("placement", ["pre", "post", "post_sublayer", "sandwich"])
def test_add_sublayer_takes_the_step_of_addnorm(placement):
    # Fails if add_sublayer drifts from AddNorm.forward, or returns something other than
    # the branch output that is added (for every placement but post-LN, X' = X + C).
    block = TransformerBlock(16, 2, placement=placement).eval()
    X = torch.randn(2, 5, 16)
    with torch.no_grad():
        X_next, C = anatomy.add_sublayer(block.addnorm2, block.ffn, X)
        assert torch.equal(X_next, block.addnorm2(X, block.ffn))
        if placement != "post":
            assert torch.equal(X_next, X + C)


def test_w_q_gaps_is_zero_for_block_one_and_for_a_tied_block_only():
    stack = make_stack(3, seed=0, **SMALL)
    gaps = anatomy.w_q_gaps(stack)
    assert len(gaps) == 3 and gaps[0] == 0.0 and min(gaps[1:]) > 1e-3
    assert gaps == stack_anatomy(depth=3, seed=0, **SMALL).w_q_gap  # what the chapter's table shows
    assert anatomy.w_q_gaps([stack[0], stack[0]]) == [0.0, 0.0]


# --------------------------------------------------------------------------- the decoder block


def test_decoder_effects_see_the_mask_and_the_memory():
    torch.manual_seed(0)
    block = TransformerDecoderBlock(16, 2, norm="layer", act="relu", placement="post", bias=True).eval()
    effects = decoder_effects(block, torch.randn(1, 6, 16), torch.randn(1, 4, 16), t=3)
    assert effects["output_shape"] == (1, 6, 16)
    assert effects["future_leak"] == 0.0
    assert effects["future_effect"] > 0 and effects["memory_effect"] > 0
    assert 0 < effects["memory_effect_least"] <= effects["memory_effect"]  # every position reads the memory


def test_decoder_effects_sees_a_block_that_is_not_causal():
    # Fails if decoder_effects compares the wrong positions: without the mask, earlier positions move.
    torch.manual_seed(0)
    block = TransformerDecoderBlock(16, 2, causal=False).eval()
    effects = decoder_effects(block, torch.randn(1, 6, 16), torch.randn(1, 4, 16), t=3)
    assert effects["future_leak"] > 1e-3


def test_decoder_block_is_causal_reads_the_encoder_and_counts_its_sublayers():
    state = torch.random.get_rng_state()
    result = decoder_block_checks(num_hiddens=32, num_heads=4, num_steps=6, memory_steps=5, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert result["output_shape"] == (1, 6, 32) and result["t"] == 3
    assert result["future_leak"] == 0.0 and result["future_effect"] > 0.05
    assert result["memory_effect_least"] > 0.01
    params = result["parameters"]
    assert params["self-attention"] == params["cross-attention"] == 4 * 32 * 32 + 4 * 32
    assert params["FFN"] == 8 * 32 * 32 + 4 * 32 + 32
    assert params["norms"] == 3 * 2 * 32
    assert result == decoder_block_checks(num_hiddens=32, num_heads=4, num_steps=6, memory_steps=5, seed=1)
