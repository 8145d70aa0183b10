"""Chapter 9's capstone helpers: matched widths, one training group, samples and the cache measurement."""

from __future__ import annotations

import pytest
import torch

from d2lmini import LanguageModel, num_parameters
from d2lmini.chapters import ch09_the_2026_block as ch09
from d2lmini.data import python_reference_corpus


@pytest.fixture(scope="module")
def corpus():
    return python_reference_corpus()


def test_every_model_of_the_walk_is_matched_to_the_2017_count(corpus):
    walk = ch09.lm_walk()
    assert walk[0][1] == ch09.LM_2017 and walk[-1][1]["qk_norm"] == "per_head" and len(walk) == 8
    for depth in (ch09.CAPSTONE_MODEL["num_blocks"], ch09.WALK_DEPTH):
        target = ch09.model_parameters(corpus.vocab_size, ch09.LM_2017, depth)
        with torch.device("meta"):
            for name, kwargs in walk:
                width = ch09.matched_ffn_num_hiddens(corpus.vocab_size, kwargs, target, depth)
                model = LanguageModel(corpus.vocab_size, **{**ch09.CAPSTONE_MODEL, "num_blocks": depth},
                                      ffn_num_hiddens=width, **kwargs)
                assert abs(num_parameters(model) - target) < 0.01 * target, (name, depth)


@pytest.mark.parametrize("call, error, match", [
    (lambda c: ch09.matched_ffn_num_hiddens(c.vocab_size, dict(ffn_num_hiddens=3), 10**5), ValueError, "ffn_num_hiddens"),
    (lambda c: ch09.matched_ffn_num_hiddens(c.vocab_size, {}, 10), ValueError, "no FFN width"),
    (lambda c: ch09.matched_ffn_num_hiddens(c.vocab_size, {}, 0), ValueError, "target"),
    (lambda c: ch09.train_group(c, []), ValueError, "non-empty"),
    (lambda c: ch09.train_group(c, [("a", {}, 0.0, 0)]), ValueError, "rate"),
    (lambda c: ch09.train_group(c, [("a", {}, 1e-3)]), TypeError, "every run"),
    (lambda c: ch09.train_group(c, [("a", {}, 1e-3, 0)], num_blocks=0), ValueError, "num_blocks"),
    (lambda c: ch09.sample_explorer([], c, prompt="\x00"), ValueError, "characters"),
    (lambda c: ch09.sample_explorer([], c, prompt=""), ValueError, "non-empty"),
    (lambda c: ch09.word_share("12 + 3", c), ValueError, "no word"),
    (lambda c: ch09.word_share(b"the", c), TypeError, "text"),
    (lambda c: ch09.walk_table([]), ValueError, "every model of the walk"),
    (lambda c: ch09.cache_measurements(c.vocab_size, prompt_len=0), ValueError, "prompt_len"),
    (lambda c: ch09.cache_measurements(c.vocab_size, seed=0.5), TypeError, "seed"),
])
def test_the_capstone_helpers_reject_bad_arguments_by_name(corpus, call, error, match):
    with pytest.raises(error, match=match):
        call(corpus)


def test_a_training_group_trains_and_reports_each_model(corpus):
    runs = ch09.train_group(corpus, [("2026 block", ch09.lm_walk()[-1][1], 1e-2, 0)], num_blocks=1, num_steps=150)
    (run,) = runs
    assert run.rate == 1e-2 and run.seed == 0 and len(run.train_loss) == 150 and run.depth == 1
    assert run.final_loss < run.train_loss[0] - 0.5 and run.parameters == num_parameters(run.model)


def test_the_word_share_counts_the_words_the_corpus_holds(corpus):
    assert ch09.word_share("The value of the object", corpus) == 1.0
    assert ch09.word_share("the xqzzy of 12 zzqx", corpus) == 0.5  # 'the' and 'of' of four words
    assert ch09.word_share("class-def", corpus) == 1.0  # letters-only runs: 'class' and 'def'


def test_the_cache_measurement_counts_positions_and_bytes(corpus):
    m = ch09.cache_measurements(corpus.vocab_size, prompt_len=4, max_new_tokens=6)
    assert m["positions computed with cache"] == 4 + 5 and m["positions computed without cache"] == sum(range(4, 10))
    L, h, d_head = ch09.CAPSTONE_MODEL["num_blocks"], 4, 16  # k and v, L blocks, 4 heads of 16
    assert m["MHA cache bytes"] == 2 * m["GQA cache bytes"] == 2 * L * h * d_head * 10 * 4
    assert torch.equal(m["tokens with cache"], m["tokens without cache"])
