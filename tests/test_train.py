"""The character corpus and the tiny language model's training loop."""

from __future__ import annotations

import math

import pytest
import torch

from d2lmini.data import CharCorpus, python_reference_corpus, python_reference_text
from d2lmini.train import TinyLM, lr_at, train_lm


@pytest.fixture(scope="module")
def corpus():
    return python_reference_corpus()


def test_python_reference_text_is_real_prose_of_the_stated_size(corpus):
    text = python_reference_text()
    assert 300_000 < len(text) < 700_000
    assert "The \"if\" statement" in text or "if_stmt" in text
    assert len(corpus.sha256) == 64
    assert corpus.decode(corpus.train[:50]) == text[:50]
    assert len(corpus.train) + len(corpus.val) == len(text)


def test_batches_are_shifted_windows_and_reproducible(corpus):
    X, Y = corpus.random_batch(4, 16, torch.Generator().manual_seed(0))
    X2, _ = corpus.random_batch(4, 16, torch.Generator().manual_seed(0))
    assert X.shape == Y.shape == (4, 16)
    assert torch.equal(X[:, 1:], Y[:, :-1])
    assert torch.equal(X, X2)


def test_tiny_lm_shapes_and_causality():
    torch.manual_seed(0)
    model = TinyLM(20, num_hiddens=32, num_heads=4, num_layers=2, max_len=16, norm="rms", act="swiglu")
    tokens = torch.randint(0, 20, (3, 10))
    logits = model(tokens)
    assert logits.shape == (3, 10, 20)
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 20  # a later token cannot change earlier predictions
    torch.testing.assert_close(model(changed)[:, :7], logits[:, :7])
    with pytest.raises(ValueError, match="num_steps"):
        model(torch.randint(0, 20, (1, 17)))


def test_training_learns_and_is_deterministic(corpus):
    kwargs = dict(num_steps=60, batch_size=8, seq_len=32, lr=3e-3, eval_every=30, eval_batches=2,
                  num_hiddens=32, num_heads=2, num_layers=2, norm="layer", act="gelu", placement="pre")
    a, b = train_lm(corpus, seed=0, **kwargs), train_lm(corpus, seed=0, **kwargs)
    assert a.train_loss == b.train_loss and a.val_loss == b.val_loss
    assert a.val_steps == [30, 60]
    start = math.log(corpus.vocab_size)
    assert a.train_loss[0] == pytest.approx(start, abs=0.6)  # near-uniform predictions at step 0
    assert a.smoothed(10)[-1] < start - 1.0  # it learned character statistics
    c = train_lm(corpus, seed=1, **kwargs)
    assert c.train_loss != a.train_loss


def test_warmup_schedule():
    assert lr_at(0, 1.0, 10, 100, "constant") == pytest.approx(0.1)
    assert lr_at(9, 1.0, 10, 100, "constant") == pytest.approx(1.0)
    assert lr_at(50, 1.0, 10, 100, "constant") == 1.0
    assert lr_at(100, 1.0, 10, 100, "cosine") == pytest.approx(0.1)


def test_bad_training_arguments(corpus):
    with pytest.raises(ValueError, match="warmup_steps"):
        train_lm(corpus, warmup_steps=-1)
    with pytest.raises(ValueError, match="schedule"):
        train_lm(corpus, schedule="linear")
    with pytest.raises(ValueError, match="val_fraction"):
        CharCorpus.from_text("x" * 2000, val_fraction=0.9)


def test_warmup_comparison_runs_the_three_configurations(corpus):
    from d2lmini.chapters.ch04_norm_placement import warmup_comparison

    results = warmup_comparison(corpus, num_steps=20, lr=1e-3, warmup_steps=10, batch_size=4, seq_len=16,
                                eval_every=20, eval_batches=1, num_hiddens=16, num_heads=2, num_layers=2,
                                norm="layer", act="relu")
    assert list(results) == ["post-LN, no warm-up", "post-LN, warm-up", "pre-LN, no warm-up"]
    assert results["post-LN, warm-up"].lr[0] == pytest.approx(1e-4)
    assert results["post-LN, no warm-up"].lr[0] == 1e-3
    assert results["pre-LN, no warm-up"].config["placement"] == "pre"
    with pytest.raises(TypeError, match="placement"):
        warmup_comparison(corpus, placement="pre")
