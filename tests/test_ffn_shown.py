"""Small functions of chapter 7's module: memory sums and readings, validation losses and the
lockstep update the chapter prints."""

from __future__ import annotations

import pytest
import torch

from d2lmini.chapters.ch07_ffn import (memory_reading, sum_of_memories, validation_batches,
                                       validation_losses)
from d2lmini.data import python_reference_corpus
from d2lmini.ffn import FeedForward
from d2lmini.train import train_step


@pytest.mark.parametrize("act", ["relu", "gelu", "swiglu", "geglu"])
@pytest.mark.parametrize("bias", [False, True])
def test_sum_of_memories_rebuilds_the_ffn(act, bias):
    torch.manual_seed(0)
    ffn = FeedForward(16, act=act, bias=bias).eval()
    X = torch.randn(20, 16)
    m, rebuilt = sum_of_memories(ffn, X)
    assert m.shape == (20, ffn.ffn_num_hiddens) and rebuilt.shape == (20, 16)
    torch.testing.assert_close(rebuilt, ffn(X).detach())
    assert not m.requires_grad
    if act == "relu":  # a ReLU coefficient is exactly zero for a negative match
        assert torch.equal(m, torch.relu(X @ ffn.W_1.weight.T + (ffn.W_1.bias if bias else 0)).detach())


def test_validation_losses_average_the_batches():
    calls = []

    def losses_of(batches):
        calls.append(len(batches))
        X = batches[0][0]
        return torch.tensor([float(X.sum()), 2.0 * float(X.sum())])

    val = [(torch.full((1, 2), 1.0), None), (torch.full((1, 2), 3.0), None)]
    assert validation_losses(losses_of, 2, val) == [4.0, 8.0]
    assert calls == [2, 2]


def test_validation_batches_are_fixed_by_their_seed():
    corpus = python_reference_corpus()
    a, b = validation_batches(corpus, 4, 8, 3), validation_batches(corpus, 4, 8, 3)
    assert len(a) == 3 and all(torch.equal(x, y) for (x, _), (y, _) in zip(a, b))
    assert a[0][0].shape == (4, 8) and torch.equal(a[0][0][:, 1:], a[0][1][:, :-1])


@pytest.mark.parametrize("act", ["relu", "gelu", "swiglu"])
def test_memory_reading_measures_the_rebuild_and_the_zeros(act):
    torch.manual_seed(0)
    ffn = FeedForward(16, act=act).train()
    X = torch.randn(50, 16)
    reading = memory_reading(ffn, X, top_k=4)
    m, rebuilt = sum_of_memories(ffn, X)
    assert torch.equal(reading.coefficients, m) and ffn.training  # train mode restored
    assert reading.max_abs_diff == float((ffn(X).detach() - rebuilt).abs().max()) < 1e-5
    assert reading.active_fraction == float((m != 0).double().mean())
    assert (0.3 < reading.active_fraction < 0.7) if act == "relu" else reading.active_fraction == 1.0
    assert reading.top_k == 4 and 0 < reading.top_share <= 1


def test_train_step_of_several_models_equals_one_optimizer_per_model():
    torch.manual_seed(0)
    models = [torch.nn.Linear(3, 2) for _ in range(2)]
    alone = [torch.nn.Linear(3, 2) for _ in range(2)]
    for a, m in zip(alone, models):
        a.load_state_dict(m.state_dict())
    X = [torch.randn(4, 3), torch.randn(4, 3)]
    optimizer = torch.optim.AdamW([p for m in models for p in m.parameters()], lr=1.0, foreach=True)
    own = [torch.optim.AdamW(a.parameters(), lr=1.0) for a in alone]
    for lr in (0.1, 0.05):
        def losses_of(batches):
            return torch.stack([m(x).square().mean() for m, (x, _) in zip(models, batches)])

        train_step(losses_of, optimizer, [(x, None) for x in X], lr)
        for a, opt, x in zip(alone, own, X):
            opt.param_groups[0]["lr"] = lr
            opt.zero_grad()
            a(x).square().mean().backward()
            opt.step()
    assert optimizer.param_groups[0]["lr"] == 0.05
    for a, m in zip(alone, models):
        for p, q in zip(a.parameters(), m.parameters()):
            torch.testing.assert_close(p, q)
