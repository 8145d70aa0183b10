"""d2lmini.LanguageModel, the key/value cache and generate: cached decoding equals recomputing the
prefix, the errors name their argument, and the model converts to transformers' Llama and Qwen3."""

from __future__ import annotations

import pytest
import torch

import d2lmini
from d2lmini import KVCache, LanguageModel, generate
from d2lmini.cache import LayerCache
from d2lmini.seeding import seeded
from d2lmini.reference.gemma import GemmaAttention
from d2lmini.reference.llama4 import Llama4Attention

VOCAB = 40

CONFIGS = {
    "2026 (GQA, QK-norm, RoPE)": dict(positions="rope", num_hiddens=32, num_heads=4, num_kv_heads=2, qk_norm="per_head"),
    "MQA": dict(positions="rope", num_hiddens=32, num_heads=4, num_kv_heads=1),
    "2017 (post-LN, learned)": dict(positions="learned", num_hiddens=32, num_heads=4, norm="layer", act="relu",
                                    placement="post", bias=True),
    "sinusoidal": dict(positions="sinusoidal", num_hiddens=32, num_heads=4),
    "window and sinks": dict(positions="rope", num_hiddens=32, num_heads=4, window=5, sinks=True),
    "chunk, query scaling (Llama 4's attention)": dict(
        positions="rope", num_hiddens=32, num_heads=4,
        attn_factory=lambda: Llama4Attention(32, 4, causal=True, rope_theta=1e4, chunk=6, query_scaling=(0.1, 4))),
    "softcap (Gemma 2's attention)": dict(
        positions="rope", num_hiddens=32, num_heads=4,
        attn_factory=lambda: GemmaAttention(32, 4, causal=True, rope_theta=1e4, logit_softcap=30.0)),
}


def make(config: dict, num_blocks: int = 3, context_len: int = 48, seed: int = 0, spread: float = 0.3) -> LanguageModel:
    """A model whose weights (norm gains too) are spread out, so that every one of them matters."""
    with seeded(seed):
        model = LanguageModel(VOCAB, num_blocks, context_len, **config)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(spread * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("name", CONFIGS)
def test_cached_decoding_gives_the_logits_of_the_whole_prefix(name):
    model = make(CONFIGS[name], spread=0.05)  # logits of order 1, where 1e-5 is float32 rounding
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache(len(model.blocks))
        steps = [model(ids[:, :9], cache)] + [model(ids[:, t:t + 1], cache) for t in range(9, 33)]
        steps.append(model(ids[:, 33:], cache))  # several new tokens at once, after a cache
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert len(cache) == 40


@pytest.mark.parametrize("name", CONFIGS)
def test_generate_gives_the_same_tokens_with_and_without_the_cache(name):
    model = make(CONFIGS[name])
    prompt = torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(2))
    greedy = generate(model, prompt, 30)
    assert greedy.shape == (3, 35) and torch.equal(greedy[:, :5], prompt)
    assert torch.equal(greedy, generate(model, prompt, 30, use_cache=False))
    sampled = generate(model, prompt, 30, do_sample=True, temperature=0.8, top_k=7, seed=3)
    assert torch.equal(sampled, generate(model, prompt, 30, do_sample=True, temperature=0.8, top_k=7, seed=3,
                                         use_cache=False))
    assert not torch.equal(sampled, generate(model, prompt, 30, do_sample=True, temperature=0.8, top_k=7, seed=4))


def test_generate_greedy_picks_the_argmax_and_top_k_one_is_greedy():
    model = make(CONFIGS["2026 (GQA, QK-norm, RoPE)"])
    prompt = torch.tensor([3, 1, 4, 1, 5])
    out = generate(model, prompt, 6)
    assert out.shape == (11,)  # a 1-D prompt gives a 1-D result
    with torch.no_grad():
        for t in range(5, 11):  # every new token is the argmax of the logits after the tokens before it
            assert out[t] == model(out[None, :t])[0, -1].argmax()
    assert torch.equal(out, generate(model, prompt, 6, do_sample=True, top_k=1, seed=0))
    assert torch.equal(generate(model, prompt, 0), prompt)


def test_sampling_follows_the_tempered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(4000, -1)
    draws = d2lmini.lm.next_token(logits, True, 0.5, None, torch.Generator().manual_seed(0))
    expected = torch.softmax(logits[0] / 0.5, dim=-1)
    observed = torch.bincount(draws, minlength=4) / len(draws)
    torch.testing.assert_close(observed, expected, atol=0.03, rtol=0)
    top2 = d2lmini.lm.next_token(logits, True, 1.0, 2, torch.Generator().manual_seed(0))
    assert set(top2.tolist()) == {0, 1}


@pytest.mark.parametrize("name", ["2026 (GQA, QK-norm, RoPE)", "2017 (post-LN, learned)", "sinusoidal"])
def test_generate_slides_the_window_past_the_context(name):
    """Past context_len the model sees the last context_len tokens, as nanoGPT crops them: every new
    token is the one a model fed exactly that window picks, with and without the cache."""
    model = make(CONFIGS[name], context_len=12)
    prompt = torch.randint(0, VOCAB, (2, 15), generator=torch.Generator().manual_seed(4))  # longer than the context
    out = generate(model, prompt, 20)
    assert out.shape == (2, 35) and torch.equal(out, generate(model, prompt, 20, use_cache=False))
    with torch.no_grad():
        for t in range(15, 35):
            assert torch.equal(model(out[:, t - 12:t])[:, -1].argmax(-1), out[:, t])
    short = prompt[:, :5]  # fills the context with the cache, then slides
    assert torch.equal(generate(model, short, 30), generate(model, short, 30, use_cache=False))
    sampled = [generate(model, short, 30, do_sample=True, temperature=0.9, seed=5, use_cache=c) for c in (True, False)]
    assert torch.equal(*sampled)


def test_generate_leaves_the_global_random_state_and_the_training_mode_alone():
    model = make(CONFIGS["MQA"]).train()
    state = torch.random.get_rng_state()
    generate(model, torch.tensor([1, 2]), 5, do_sample=True, seed=0)
    assert torch.equal(state, torch.random.get_rng_state()) and model.training


@pytest.mark.parametrize("call, error, match", [
    (lambda m: generate(m, torch.arange(3), -1), ValueError, "max_new_tokens"),
    (lambda m: generate(m, torch.arange(3), 2, do_sample=True, top_k=0), ValueError, "top_k"),
    (lambda m: generate(m, torch.arange(3), 2, do_sample=True, top_k=VOCAB + 1), ValueError, "top_k must be in 1..vocab_size=40"),
    (lambda m: generate(m, torch.arange(3), 2, do_sample=True, temperature=0.0), ValueError, "temperature"),
    (lambda m: generate(m, torch.arange(3), 2, do_sample=True, temperature=-1.0), ValueError, "temperature"),
    (lambda m: generate(m, torch.tensor([1, VOCAB]), 2), ValueError, "vocab_size=40"),
    (lambda m: generate(m, torch.tensor([-1, 2]), 2), ValueError, "vocab_size=40"),
    (lambda m: generate(m, torch.tensor([1.0, 2.0]), 2), TypeError, "integer"),
    (lambda m: generate(m, [1, 2], 2), TypeError, "prompt"),
    (lambda m: generate(m, torch.zeros(0, dtype=torch.long), 2), ValueError, "n >= 1"),
    (lambda m: generate(m, torch.zeros(1, 2, 3, dtype=torch.long), 2), ValueError, "prompt"),
    (lambda m: generate(m, torch.zeros(0, 3, dtype=torch.long), 2), ValueError, "batch >= 1"),
    (lambda m: generate(m, torch.tensor([True, False]), 2), TypeError, "integer"),
    (lambda m: generate(m, torch.arange(3), 2.0), TypeError, "max_new_tokens"),
    (lambda m: generate(m, torch.arange(3), 2, do_sample="yes"), TypeError, "do_sample"),
    (lambda m: generate(m, torch.arange(3), 2, seed=1.5), TypeError, "seed"),
    (lambda m: generate(torch.nn.Linear(2, 2), torch.arange(3), 2), TypeError, "LanguageModel"),
])
def test_generate_rejects_bad_arguments_by_name(call, error, match):
    with pytest.raises(error, match=match):
        call(make(CONFIGS["MQA"]))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(num_heads=4), TypeError, "num_hiddens"),
    (dict(num_hiddens=32), TypeError, "num_heads"),
    (dict(num_hiddens=32, num_heads=4, causal=True), TypeError, "causal"),
    (dict(num_hiddens=32, num_heads=4, positions="learned", rope_theta=1e4), ValueError, "rope_theta"),
    (dict(num_hiddens=32, num_heads=4, positions="alibi"), ValueError, "positions"),
    (dict(num_hiddens=31, num_heads=1, positions="sinusoidal"), ValueError, "even"),
    (dict(num_hiddens=32, num_heads=4, attn_factory=lambda: d2lmini.MultiHeadAttention(32, 4)), ValueError, "causal"),
    (dict(num_hiddens=32, num_heads=4, rope_theta=1e4,
          attn_factory=lambda: d2lmini.MultiHeadAttention(32, 4, causal=True)), ValueError, "rope_theta=10000.0 would be ignored"),
])
def test_language_model_checks_its_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        LanguageModel(VOCAB, 1, 8, **kwargs)


def test_language_model_takes_an_attention_factory_with_rope_positions():
    model = LanguageModel(VOCAB, 1, 8, num_hiddens=32, num_heads=4,
                          attn_factory=lambda: d2lmini.MultiHeadAttention(32, 4, causal=True, rope_theta=1e4))
    assert model.positions == "rope" and model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, VOCAB)


def test_language_model_forward_checks_its_input():
    model = make(CONFIGS["MQA"], context_len=8)
    with pytest.raises(ValueError, match="context_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    cache = KVCache(len(model.blocks))
    model(torch.zeros(1, 6, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"6 cached \+ 3 new"):
        model(torch.zeros(1, 3, dtype=torch.long), cache)
    with pytest.raises(TypeError, match="integer"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="batch, num_steps"):
        model(torch.zeros(3, dtype=torch.long))


def test_forward_checks_the_cache_it_is_given():
    model = make(CONFIGS["MQA"])
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="2 layers; this model has 3 blocks"):
        model(ids, KVCache(2))
    with pytest.raises(TypeError, match="KVCache"):
        model(ids, LayerCache())
    with pytest.raises(ValueError, match="start"):
        model.blocks[0].attention.queries_and_keys(torch.zeros(1, 4, 32), torch.zeros(1, 4, 32), start=-1)


def test_next_token_checks_what_it_samples_with():
    logits = torch.zeros(2, 5)
    with pytest.raises(ValueError, match="top_k"):
        d2lmini.lm.next_token(logits, True, 1.0, 6, None)
    with pytest.raises(ValueError, match="temperature"):
        d2lmini.lm.next_token(logits, True, 0.0, None, None)
    with pytest.raises(ValueError, match="batch, vocab_size"):
        d2lmini.lm.next_token(logits[0], False, 1.0, None, None)


def test_the_cache_holds_one_key_and_value_per_key_value_head():
    for num_kv_heads in (4, 2, 1):
        model = make({**CONFIGS["MQA"], "num_kv_heads": num_kv_heads})
        cache = KVCache(len(model.blocks))
        with torch.no_grad():
            model(torch.zeros(2, 10, dtype=torch.long), cache)
        assert cache.num_bytes() == 2 * len(model.blocks) * 2 * num_kv_heads * 8 * 10 * 4  # k and v, float32
        assert cache.layers[0].keys.shape == (2, num_kv_heads, 10, 8)


def test_layer_cache_and_attention_reject_what_they_cannot_hold():
    layer = LayerCache()
    with pytest.raises(ValueError, match="one shape"):
        layer.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 5))
    layer.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="do not extend"):
        layer.update(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4))
    with pytest.raises(ValueError, match="num_layers"):
        KVCache(0)
    with pytest.raises(ValueError, match="num_kv_heads"):
        LayerCache().update(torch.zeros(3, 4), torch.zeros(3, 4))
    X = torch.randn(1, 4, 16)
    with pytest.raises(ValueError, match="causal"):
        d2lmini.MultiHeadAttention(16, 2)(X, X, X, cache=LayerCache())
    with pytest.raises(ValueError, match="valid_lens"):
        d2lmini.MultiHeadAttention(16, 2, causal=True)(X, X, X, torch.tensor([3]), cache=LayerCache())


def test_tiny_lm_is_the_language_model_with_a_head_bias():
    with seeded(0):
        tiny = d2lmini.train.TinyLM(VOCAB, 32, num_heads=4, num_layers=2, max_len=16)
    with seeded(0):
        lm = LanguageModel(VOCAB, 2, 16, positions="learned", num_hiddens=32, num_heads=4)
    assert tiny.head.bias is not None and lm.head.bias is None and tiny.max_len == 16
    ids = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        lm.head.weight.copy_(tiny.head.weight)
        torch.testing.assert_close(tiny(ids) - tiny.head.bias, lm(ids), atol=1e-6, rtol=0)


def test_a_trained_model_saves_and_loads_with_weights_only(tmp_path):
    model = make(CONFIGS["2026 (GQA, QK-norm, RoPE)"])
    torch.save(model.state_dict(), tmp_path / "model.pt")
    loaded = LanguageModel(VOCAB, 3, 48, **CONFIGS["2026 (GQA, QK-norm, RoPE)"])
    loaded.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    prompt = torch.tensor([1, 2, 3])
    assert torch.equal(generate(loaded.eval(), prompt, 10), generate(model, prompt, 10))


# --------------------------------------------------------------------------- the same model in transformers

@pytest.mark.parametrize("name, cls", [("2026 (GQA, QK-norm, RoPE)", "Qwen3ForCausalLM"), ("MQA", "LlamaForCausalLM")])
def test_to_hf_gives_transformers_model_with_the_same_logits_and_tokens(name, cls):
    from d2lmini.reference import to_hf

    model = make(CONFIGS[name], num_blocks=2)
    hf = to_hf(model)
    assert type(hf).__name__ == cls and not hf.training
    ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-4, rtol=0)
    theirs = hf.generate(ids, max_new_tokens=20, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0)
    assert torch.equal(theirs, generate(model, ids, 20))
    with torch.no_grad():  # the weights were copied, not shared
        next(model.parameters()).add_(1.0)
        assert not torch.allclose(hf(ids).logits, model(ids))


def test_to_hf_generate_does_not_stop_at_any_token():
    """LlamaConfig's default eos_token_id is 2: a converted model must not stop there."""
    from d2lmini.reference import to_hf

    for seed in range(20):  # a model of 4 tokens whose greedy text holds token 2 after the prompt
        with seeded(seed):
            model = LanguageModel(4, 1, 32, **CONFIGS["MQA"]).eval()
        prompt = torch.tensor([[0, 1, 3]])
        ours = generate(model, prompt, 12)
        if 2 in ours[0, 3:-1].tolist():
            break
    else:
        pytest.fail("no seed gave a text with token 2")
    theirs = to_hf(model).generate(prompt, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(prompt))
    assert torch.equal(theirs, ours)


def test_generate_with_an_attention_that_takes_no_cache_says_so():
    model = LanguageModel(VOCAB, 1, 16, num_hiddens=32, num_heads=4, positions="learned",
                          attn_factory=lambda: d2lmini.MultiHeadLatentAttention(
                              32, 4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                              v_head_dim=8, rope_theta=1e4))
    with pytest.raises(ValueError, match="use_cache=False"):
        generate(model, torch.tensor([1, 2]), 3)
    assert generate(model, torch.tensor([1, 2]), 3, use_cache=False).shape == (5,)


@pytest.mark.parametrize("change, match", [
    (dict(positions="learned"), "positions='rope'"),
    (dict(window=4), "window=4"),
    (dict(qk_norm="projection"), "qk_norm='projection'"),
    (dict(bias=True), "attention bias=True"),
    (dict(placement="post"), "placement='post'"),
    (dict(norm="layer"), "norm='layer'"),
    (dict(act="gelu"), "act='gelu'"),
    (dict(sinks=True), "sinks=True"),
    ("scale", "scale=0.5"),
])
def test_to_hf_refuses_what_llama_and_qwen3_cannot_express(change, match):
    from d2lmini.reference import to_hf

    model = LanguageModel(VOCAB, 1, 16, **{**CONFIGS["MQA"], **({} if change == "scale" else change)})
    if change == "scale":
        model.blocks[0].attention.scale = 0.5
    with pytest.raises(ValueError, match=match):
        to_hf(model)


def test_to_hf_refuses_a_head_bias_other_kinds_and_unlike_blocks():
    from d2lmini.reference import to_hf

    moe = LanguageModel(VOCAB, 1, 16, **CONFIGS["MQA"], ffn_factory=lambda: d2lmini.MixtureOfExperts(32, 4, top_k=2))
    with pytest.raises(ValueError, match="FeedForward"):
        to_hf(moe)
    with pytest.raises(ValueError, match="bias"):
        to_hf(d2lmini.train.TinyLM(VOCAB, 32, num_heads=4, num_layers=1, rope_theta=1e4))
    with pytest.raises(TypeError, match="LanguageModel"):
        to_hf(torch.nn.Linear(2, 2))
    model = LanguageModel(VOCAB, 2, 16, **CONFIGS["MQA"])
    model.blocks[1] = d2lmini.TransformerBlock(32, 4, num_kv_heads=2, causal=True, rope_theta=1e4)
    with pytest.raises(ValueError, match="block 1 differs"):
        to_hf(model)


# --------------------------------------------------------------------------- any device

@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_training_and_generation_run_on_cuda():
    from d2lmini.data import python_reference_corpus
    from d2lmini.train import train_models

    corpus = python_reference_corpus()
    model = LanguageModel(corpus.vocab_size, 2, 32, num_hiddens=32, num_heads=4, num_kv_heads=2,
                          qk_norm="per_head").cuda()
    log = train_models([model], corpus, [0], 20, batch_size=8, seq_len=32, lr=1e-2)
    assert log.losses[0][-1] < log.losses[0][0]
    prompt = torch.tensor([1, 2, 3])
    out = generate(model, prompt, 20)
    assert out.device.type == "cuda" and torch.equal(out, generate(model, prompt, 20, use_cache=False))
    sampled = generate(model, prompt, 20, do_sample=True, top_k=5, seed=0)
    assert torch.equal(sampled, generate(model, prompt, 20, do_sample=True, top_k=5, seed=0))
