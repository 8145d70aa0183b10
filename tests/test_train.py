"""The character corpus and the tiny language model's training loop."""

from __future__ import annotations

import math

import pytest
import torch

from d2lmini.data import CharCorpus, python_reference_corpus, python_reference_text
from d2lmini.train import TinyLM, evaluate, lr_at, seeded_tiny_lm, train_lm, train_models


@pytest.fixture(scope="module")
def corpus():
    return python_reference_corpus()


# A model and run small enough for a few hundredths of a second per step.
TINY = dict(batch_size=4, seq_len=16, num_hiddens=16, num_heads=2, num_layers=1, norm="rms", act="gelu")
# A run of that model, made to diverge by the hook below (its loss is NaN at its 8th step).
DIVERGING = dict(num_steps=12, lr=1e-2, warmup_steps=3, schedule="cosine", **{**TINY, "num_hiddens": 24})
# After this step's update, the hook below turns the token table to NaN, so the next step's loss
# is NaN on any machine (a learning rate high enough to diverge does so at a step that depends on
# the processor's rounding: lr = 30 diverged by step 12 on one machine and not on another).
POISONED_AFTER = 6


def poison(step, models, losses):
    if step == POISONED_AFTER:
        with torch.no_grad():
            next(models[0].parameters()).fill_(math.nan)


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
    with pytest.raises(ValueError, match="max_len=16"):
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


# --------------------------------------------------------------------------- the one loop and its hook


def test_the_hook_is_called_once_after_every_step_with_its_index(corpus):
    steps = []
    result = train_lm(corpus, num_steps=7, lr=1e-2, eval_every=3, eval_batches=1, seed=1,
                      on_step=lambda step, models, losses: steps.append(step), **TINY)
    assert steps == list(range(7)) and len(result.train_loss) == 7


def test_a_probe_in_the_hook_sees_the_results_losses_and_the_updated_model(corpus):
    seen, scores = [], {}

    def probe(step, models, losses):
        (model,) = models
        seen.append(losses[0])
        if (step + 1) % 3 == 0:  # the hook's own validation, on train_lm's batches
            scores[step + 1] = evaluate(model, corpus, TINY["batch_size"], TINY["seq_len"], 2)

    result = train_lm(corpus, num_steps=6, lr=1e-2, eval_every=3, eval_batches=2, seed=1, on_step=probe, **TINY)
    assert seen == result.train_loss
    assert list(scores) == result.val_steps and list(scores.values()) == result.val_loss


def test_models_in_lockstep_take_exactly_the_steps_they_take_alone(corpus):
    kwargs = dict(num_steps=5, batch_size=4, seq_len=16, lr=1e-2, warmup_steps=2, schedule="cosine")
    model = dict(max_len=16, num_hiddens=16, num_heads=2, num_layers=1, norm="rms", act="gelu")
    seen = []
    models = [seeded_tiny_lm(corpus.vocab_size, seed, **model) for seed in (0, 5)]
    log = train_models(models, corpus, [0, 5], on_step=lambda step, ms, losses: seen.append(losses), **kwargs)
    assert [list(column) for column in zip(*seen)] == log.losses and not log.diverged
    for i, seed in enumerate((0, 5)):
        alone = train_models([seeded_tiny_lm(corpus.vocab_size, seed, **model)], corpus, [seed], **kwargs)
        assert alone.losses[0] == log.losses[i] and alone.lr == log.lr


def test_a_learning_rate_sweep_in_lockstep_equals_train_lm_at_each_rate(corpus):
    # one parameter group per model: model i at lr_scales[i] times the scheduled rate
    kwargs = dict(num_steps=6, batch_size=4, seq_len=16, warmup_steps=2, schedule="cosine")
    model = dict(num_hiddens=16, num_heads=2, num_layers=1, norm="rms", act="gelu")
    scales = [0.25, 1.0, 2.0]  # powers of two: the scaled rates are exactly lr_at's
    models = [seeded_tiny_lm(corpus.vocab_size, 3, max_len=16, **model) for _ in scales]
    log = train_models(models, corpus, [3] * 3, lr=1e-2, lr_scales=scales, **kwargs)
    assert log.lr == [lr_at(step, 1e-2, 2, 6, "cosine") for step in range(6)]  # the unscaled schedule
    for i, scale in enumerate(scales):
        alone = train_lm(corpus, lr=1e-2 * scale, seed=3, eval_every=6, eval_batches=1, **kwargs, **model)
        assert alone.train_loss == log.losses[i]
    assert log.losses[0] != log.losses[2]
    # all scales 1 is the single-group optimizer, to the bit
    plain = train_models([seeded_tiny_lm(corpus.vocab_size, s, max_len=16, **model) for s in (0, 5)], corpus,
                         [0, 5], lr=1e-2, **kwargs)
    ones = train_models([seeded_tiny_lm(corpus.vocab_size, s, max_len=16, **model) for s in (0, 5)], corpus,
                        [0, 5], lr=1e-2, lr_scales=[1, 1.0], **kwargs)
    assert ones.losses == plain.losses


def test_a_diverged_step_is_recorded_and_probed_but_takes_no_update(corpus):
    steps, weights = [], []

    def probe(step, models, losses):
        poison(step, models, losses)
        steps.append(step)
        weights.append([p.detach().clone() for p in models[0].parameters()])

    result = train_lm(corpus, eval_every=3, eval_batches=1, on_step=probe, **DIVERGING)
    n = len(result.train_loss)
    assert result.diverged and math.isnan(result.train_loss[-1]) and n == POISONED_AFTER + 2
    assert all(math.isfinite(v) for v in result.train_loss[:-1])
    assert steps == list(range(n)) and len(result.lr) == n
    assert result.val_steps == [s for s in (3, 6, 9) if s < n]  # the diverged step is not validated
    # no update at the NaN step (some weights are NaN already; an update would spread NaN to all)
    assert all(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) for a, b in zip(weights[-2], weights[-1]))
    model_keys = ("num_hiddens", "num_heads", "num_layers", "norm", "act")
    model = seeded_tiny_lm(corpus.vocab_size, 0, max_len=16, **{k: DIVERGING[k] for k in model_keys})
    run = {k: v for k, v in DIVERGING.items() if k not in model_keys}
    full = train_models([model], corpus, [0], stop_on_divergence=False, on_step=poison, **run)
    assert full.diverged and len(full.losses[0]) == 12 and full.losses[0][:n - 1] == result.train_loss[:n - 1]


def test_seeded_model_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b = (seeded_tiny_lm(20, 3, num_hiddens=8, num_heads=2, num_layers=1) for _ in range(2))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_bad_loop_arguments(corpus):
    model = TinyLM(corpus.vocab_size, num_hiddens=8, num_heads=2, num_layers=1, max_len=16)
    run = dict(num_steps=2, batch_size=2, seq_len=16)
    with pytest.raises(ValueError, match="one seed per model"):
        train_models([model], corpus, [0, 1], **run)
    with pytest.raises(ValueError, match="non-empty"):
        train_models([], corpus, [], **run)
    with pytest.raises(TypeError, match=r"\[model\]"):
        train_models(model, corpus, [0], **run)
    with pytest.raises(TypeError, match="seeds"):
        train_models([model], corpus, 0, **run)
    with pytest.raises(TypeError, match="on_step"):
        train_models([model], corpus, [0], on_step="print", **run)
    with pytest.raises(TypeError, match="stop_on_divergence"):
        train_models([model], corpus, [0], stop_on_divergence=1, **run)
    with pytest.raises(TypeError, match="warmup_steps"):
        train_models([model], corpus, [0], warmup_steps=1.5, **run)
    with pytest.raises(ValueError, match="lr_scales"):
        train_models([model], corpus, [0], lr_scales=[1.0, 2.0], **run)
    with pytest.raises(ValueError, match=r"lr_scales\[0\]"):
        train_models([model], corpus, [0], lr_scales=[0.0], **run)
    with pytest.raises(TypeError, match="lr_scales"):
        train_models([model], corpus, [0], lr_scales=2.0, **run)
    with pytest.raises(TypeError, match="on_step"):
        train_lm(corpus, on_step=42)
    with pytest.raises(ValueError, match="eval_every"):
        train_lm(corpus, eval_every=0)


def test_vectorized_training_refuses_models_of_different_architectures():
    """vmap runs the first model's architecture for all: a pre-LN model beside a post-LN one (same
    parameters), or a QK-norm model beside one without, would silently train as the first."""
    from d2lmini.train import lockstep_losses

    pre, post = (TinyLM(20, 16, num_heads=2, num_layers=2, max_len=8, placement=p) for p in ("pre", "post"))
    qk = TinyLM(20, 16, num_heads=2, num_layers=2, max_len=8, qk_norm="per_head")
    for other in (post, qk):
        with pytest.raises(ValueError, match=r"models\[1\] is built differently"):
            lockstep_losses([pre, other], vectorize=True)
    lockstep_losses([pre, TinyLM(20, 16, num_heads=2, num_layers=2, max_len=8, placement="pre")], vectorize=True)


def test_clipping_is_per_model_so_models_in_lockstep_clip_as_they_would_alone(corpus):
    kwargs = dict(num_steps=5, batch_size=4, seq_len=16, lr=1e-2, warmup_steps=2, schedule="cosine")
    model = dict(max_len=16, num_hiddens=16, num_heads=2, num_layers=1, norm="rms", act="gelu")
    log = train_models([seeded_tiny_lm(corpus.vocab_size, seed, **model) for seed in (0, 5)], corpus, [0, 5],
                       clip_norm=0.05, **kwargs)
    for i, seed in enumerate((0, 5)):
        alone = train_models([seeded_tiny_lm(corpus.vocab_size, seed, **model)], corpus, [seed], clip_norm=0.05,
                             **kwargs)
        assert alone.losses[0] == log.losses[i]
    unclipped = train_models([seeded_tiny_lm(corpus.vocab_size, 0, **model)], corpus, [0], **kwargs)
    assert unclipped.losses[0][1:] != log.losses[0][1:]  # norm 0.05 is far below these gradients' norms
    with pytest.raises(ValueError, match="clip_norm"):
        train_models([seeded_tiny_lm(corpus.vocab_size, 0, **model)], corpus, [0], clip_norm=0.0, **kwargs)


def test_runs_spread_over_workers_give_every_number_they_give_here(corpus):
    """run_in_workers: two processes of one thread each, or one after another here: the same losses,
    bit for bit, in the jobs' order."""
    from d2lmini.train import RECIPE, flops_per_token, run_in_workers, training_tally

    jobs = [dict(corpus=corpus, num_steps=6, seed=seed, eval_every=6, eval_batches=1, lr=3e-3, warmup_steps=2,
                 schedule="cosine", clip_norm=RECIPE["clip_norm"], **TINY) for seed in (0, 1, 2)]
    start = training_tally()
    here = run_in_workers(train_lm, jobs, num_workers=1)
    middle = training_tally()
    spread = run_in_workers(train_lm, jobs, num_workers=2)
    end = training_tally()
    model = seeded_tiny_lm(corpus.vocab_size, 0, max_len=16, **{k: v for k, v in TINY.items() if k not in ("batch_size", "seq_len")})
    expected = 3 * 6 * 4 * 16 * flops_per_token(model, 16)  # 3 runs of 6 steps of 4 windows of 16
    assert middle["flops"] - start["flops"] == end["flops"] - middle["flops"] == expected  # the workers' too
    assert [r.train_loss for r in here] == [r.train_loss for r in spread]
    assert [r.val_loss for r in here] == [r.val_loss for r in spread]
    assert here[0].train_loss != here[1].train_loss and torch.get_num_threads() >= 1
    with pytest.raises(TypeError, match="jobs"):
        run_in_workers(train_lm, dict(corpus=corpus))
    with pytest.raises(ValueError, match="num_workers"):
        run_in_workers(train_lm, jobs, num_workers=0)


def test_the_validation_loss_reads_every_held_out_character_once(corpus):
    from torch.nn import functional as F

    from d2lmini.train import validation_loss

    model = seeded_tiny_lm(corpus.vocab_size, 0, max_len=32, num_hiddens=16, num_heads=2, num_layers=1)
    n = (len(corpus.val) - 1) // 32
    windows = corpus.val[:n * 32 + 1]
    with torch.no_grad():  # the same windows, one by one
        total = sum(float(F.cross_entropy(model(windows[i * 32:(i + 1) * 32][None])[0],
                                          windows[i * 32 + 1:(i + 1) * 32 + 1], reduction="sum")) for i in range(n))
    assert validation_loss(model, corpus, 32, batch_size=50) == pytest.approx(total / (n * 32), rel=1e-5)
    with pytest.raises(ValueError, match="seq_len"):
        validation_loss(model, corpus, len(corpus.val))
    with pytest.raises(ValueError, match="batch_size"):
        validation_loss(model, corpus, 32, batch_size=0)


def test_flops_per_token_counts_the_weights_that_multiply_and_attention():
    """6 N + 12 L n d, N without the tables a token or position only looks up: a larger vocabulary
    adds only the head's multiplies, a longer context only attention's."""
    from d2lmini.lm import LanguageModel
    from d2lmini.train import flops_per_token

    def model(vocab_size, context_len, positions="learned"):
        return LanguageModel(vocab_size, num_blocks=2, context_len=context_len, positions=positions,
                             num_hiddens=16, num_heads=2)

    base = flops_per_token(model(50, 32), 32)
    assert flops_per_token(model(60, 32), 32) - base == 6 * 10 * 16  # 10 more rows of the head only
    assert flops_per_token(model(50, 64), 32) == base  # a longer position table is still a lookup
    assert flops_per_token(model(50, 32), 64) - base == 12 * 2 * 32 * 16
    m = model(50, 32)
    lookups = m.embedding.weight.numel() + m.pos_embedding.numel()
    assert base == 6 * (sum(p.numel() for p in m.parameters()) - lookups) + 12 * 2 * 32 * 16
    with pytest.raises(TypeError, match="model"):
        flops_per_token("model", 32)
