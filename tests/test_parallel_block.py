"""Parallel attention + FFN: TransformerBlock(placement='parallel' | 'parallel_two_norms').

``x <- x + Attn(N_1(x)) + FFN(N_2(x))``: the update rule, the shared norm, dropout, training and
bad input. The comparisons with the real layers of ``transformers`` (``GPTNeoXLayer``,
``PhiDecoderLayer``, ``GPTJBlock``, ``CohereDecoderLayer``, Falcon-7B's and Falcon-40B's
``FalconDecoderLayer``, StableLM with ``use_parallel_residual``), converted by
``reference.from_hf`` and run with their models' own masks and rotary tables, are in
``tests/test_zoo.py`` and ``tests/test_zoo_parallel.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from d2lmini import AddNorm, TransformerBlock, TransformerDecoderBlock
from d2lmini.block import PARALLEL_PLACEMENTS, PLACEMENTS, SEQUENTIAL_PLACEMENTS
from d2lmini.reference import randomize_

# --------------------------------------------------------------------------- structure


def _block(placement, **kwargs):
    torch.manual_seed(0)
    block = TransformerBlock(32, 4, norm="layer", placement=placement, **kwargs).eval()
    randomize_(block, 0)
    return block


@pytest.mark.parametrize("placement", PARALLEL_PLACEMENTS)
def test_parallel_block_is_the_update_rule(placement):
    block = _block(placement)
    X = torch.randn(2, 5, 32)
    a1, a2 = block.addnorm1, block.addnorm2
    attended = block.attention(*(a1.norm_in(X),) * 3)
    expected = X + attended + block.ffn(a2.norm_in(X))
    torch.testing.assert_close(block(X), expected, atol=1e-6, rtol=1e-6)


def test_parallel_shares_one_norm_and_two_norms_have_their_own():
    shared, two = _block("parallel"), _block("parallel_two_norms")
    assert shared.addnorm2.norm_in is shared.addnorm1.norm_in
    assert two.addnorm2.norm_in is not two.addnorm1.norm_in
    norm_params = 2 * 32  # LayerNorm gain and bias
    assert sum(p.numel() for p in two.parameters()) - sum(p.numel() for p in shared.parameters()) == norm_params
    assert not any(a.norm_out is not None or a.norm_post is not None for a in (shared.addnorm1, shared.addnorm2))


@pytest.mark.parametrize("placement", PARALLEL_PLACEMENTS)
def test_parallel_differs_from_pre(placement):
    """The option changes the output: same weights in a sequential pre-norm block."""
    block = _block(placement)
    pre = TransformerBlock(32, 4, norm="layer", placement="pre").eval()
    state = block.state_dict()
    if placement == "parallel":  # the shared norm, once per connection
        state["addnorm2.norm_in.weight"] = state["addnorm1.norm_in.weight"]
        state["addnorm2.norm_in.bias"] = state["addnorm1.norm_in.bias"]
    pre.load_state_dict(state)
    X = torch.randn(2, 5, 32)
    assert (pre(X) - block(X)).abs().max() > 1e-2


def test_residual_false_leaves_the_sum_of_the_two_branches():
    block = _block("parallel_two_norms")
    plain = TransformerBlock(32, 4, norm="layer", placement="parallel_two_norms", residual=False).eval()
    plain.load_state_dict(block.state_dict())
    X = torch.randn(2, 5, 32)
    torch.testing.assert_close(plain(X), block(X) - X, atol=1e-5, rtol=1e-5)


def test_dropout_on_each_branch_in_training():
    block = TransformerBlock(32, 4, placement="parallel", dropout=0.5).train()
    assert block.addnorm1.dropout.p == block.addnorm2.dropout.p == 0.5
    X = torch.randn(2, 5, 32)
    torch.manual_seed(1)
    Y1 = block(X)
    torch.manual_seed(2)
    assert not torch.allclose(Y1, block(X))
    block.eval()
    torch.testing.assert_close(block(X), block(X))


@pytest.mark.parametrize("placement", PARALLEL_PLACEMENTS)
def test_parallel_block_trains_and_every_parameter_gets_a_gradient(placement):
    block = TransformerBlock(32, 4, placement=placement, causal=True, bias=True)
    X = torch.randn(2, 5, 32, requires_grad=True)
    block(X, torch.tensor([5, 3])).pow(2).mean().backward()
    assert torch.isfinite(X.grad).all()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in block.parameters())


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("placement", PARALLEL_PLACEMENTS)
def test_parallel_rejects_sublayer_norm_gain_and_residual_multiplier(placement):
    with pytest.raises(ValueError, match=f"placement='{placement}' takes no sublayer_norm_gain"):
        TransformerBlock(32, 4, placement=placement, sublayer_norm_gain=0.5)
    with pytest.raises(ValueError, match=f"residual_multiplier applies only to placement='pre'"):
        TransformerBlock(32, 4, placement=placement).set_scales(residual_multiplier=0.22)


def test_parallel_rejects_a_residual_multiplier_of_the_wrong_type():
    with pytest.raises(TypeError, match="residual_multiplier"):
        TransformerBlock(32, 4, placement="parallel").set_scales(residual_multiplier="2")


@pytest.mark.parametrize("placement", PARALLEL_PLACEMENTS)
def test_addnorm_and_decoder_block_reject_parallel_placements(placement):
    with pytest.raises(ValueError, match="combines two sublayers"):
        AddNorm(32, placement)
    with pytest.raises(ValueError, match="one after the other"):
        TransformerDecoderBlock(32, 4, placement=placement)


def test_unknown_placement_lists_all_six():
    with pytest.raises(ValueError, match="parallel_two_norms"):
        TransformerBlock(32, 4, placement="paralel")
    assert PLACEMENTS == SEQUENTIAL_PLACEMENTS + PARALLEL_PLACEMENTS


def test_chapter_one_replay_rejects_parallel_blocks():
    from d2lmini.chapters.ch01_anatomy import record_contributions, residual_sum

    with pytest.raises(ValueError, match="sequential blocks only"):
        record_contributions([TransformerBlock(32, 4, placement="parallel")], torch.randn(1, 3, 32))
    with pytest.raises(ValueError, match="placement"):
        residual_sum("parallel", depth=1)


def test_decoder_block_still_takes_sequential_placements():
    for placement in SEQUENTIAL_PLACEMENTS:
        block = TransformerDecoderBlock(32, 4, placement=placement)
        assert block(torch.randn(1, 3, 32), torch.randn(1, 4, 32)).shape == (1, 3, 32)
    assert isinstance(block.addnorm3, nn.Module)
