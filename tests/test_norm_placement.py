"""The chapter "Where the norm goes": the measurement it prints, ``d2lmini.probes.measure_stack``."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from d2lmini import TransformerBlock
from d2lmini.norms import make_norm
from d2lmini.probes import ATTENTION_WEIGHTS, measure_stack, probe_depth, stream_rms, token_spread


def _stack(placement: str, depth: int = 2, num_hiddens: int = 16):
    torch.manual_seed(0)
    blocks = nn.ModuleList(TransformerBlock(num_hiddens, 2, norm="layer", act="relu", placement=placement)
                           for _ in range(depth))
    final_norm = None if placement == "post" else make_norm("layer", num_hiddens)
    return blocks, final_norm, torch.randn(1, 6, num_hiddens), torch.randn(1, 6, num_hiddens)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_measure_stack_records_every_depth_and_the_read_out_gradients(placement):
    blocks, final_norm, X, R = _stack(placement)
    rms, spread, grads = measure_stack(blocks, final_norm, X, R)
    # forward: the input and the stream after each block
    expected, Xk = [X], X
    for block in blocks:
        Xk = block(Xk)
        expected.append(Xk)
    assert rms == pytest.approx([stream_rms(x.detach()) for x in expected])
    assert spread == pytest.approx([token_spread(x.detach()) for x in expected])
    # backward: the gradients of the loss sum(Y * R) / sqrt(n d), block by block
    assert list(grads) == list(ATTENTION_WEIGHTS) + ["W_1", "W_2"]
    assert all(len(values) == len(blocks) for values in grads.values())
    Y = Xk if final_norm is None else final_norm(Xk)
    W_q = blocks[1].attention.W_q.weight
    (g,) = torch.autograd.grad((Y * R).sum() / math.sqrt(Y.numel()), W_q)
    assert grads["W_q"][1] == pytest.approx(float(g.norm()), rel=1e-5)


def test_probe_depth_reports_what_measure_stack_measures():
    probe = probe_depth("pre", depth=3, num_hiddens=16, num_heads=2, num_steps=8, seed=1)
    assert len(probe.stream_rms) == len(probe.token_spread) == 4
    assert set(probe.grad_norms) == set(ATTENTION_WEIGHTS) | {"W_1", "W_2"}
    assert probe.stream_rms == probe_depth("pre", depth=3, num_hiddens=16, num_heads=2, num_steps=8,
                                           seed=1).stream_rms


def test_warmup_comparison_sets_the_placement_itself():
    from d2lmini.chapters.ch04_norm_placement import warmup_comparison

    with pytest.raises(TypeError, match="placement"):
        warmup_comparison(None, placement="pre")  # refused before any training
