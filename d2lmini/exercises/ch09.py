"""Self-checks of chapter 9's exercises (The 2026 block: both blocks trained, Mistral's layer, the cache, a MoE).

Exercise 9.1 trains both blocks 8 blocks deep (:data:`DEEP`); 9.2 trains the walk's last step with
a third seed, as the chapter's walk trains (``train_walk_step``).
"""

from __future__ import annotations

import torch
from torch import nn

from . import Exercise

#: Exercise 9.1's deeper pair: depth, steps and peak rate (seed 0); 9.2's seeds of the walk's last step.
DEEP = dict(num_blocks=8, num_steps=200, rate=0.01)  # the walk's steps and rate
SEEDS = (0, 1, 2)

_trained: dict[tuple[str, int], float] = {}  # (walk step, seed) -> validation loss


def _walk_names() -> list[str]:
    from d2lmini.chapters import ch09_the_2026_block as ch09

    return [name for name, _ in ch09.lm_walk()]


def _deep_pair():
    from d2lmini.chapters import ch09_the_2026_block as ch09
    from d2lmini.data import python_reference_corpus

    walk = ch09.lm_walk()
    old, new = ch09.train_group(python_reference_corpus(), [(name, kwargs, DEEP["rate"], 0) for name, kwargs in
                                                            (walk[0], walk[-1])],
                                num_blocks=DEEP["num_blocks"], num_steps=DEEP["num_steps"])
    return {"2017 block": old.val_loss, "2026 block": new.val_loss}


def _walk_pair() -> dict:
    """The walk's own seed-0 runs of its two ends, 2 blocks deep (9.1's comparison; a wrong answer)."""
    from d2lmini.chapters import ch09_the_2026_block as ch09
    from d2lmini.data import python_reference_corpus

    walk = ch09.lm_walk()
    return {name: ch09.train_walk_step(python_reference_corpus(), *walk[k], seeds=(0,))[0].val_loss
            for name, k in (("2017 block", 0), ("2026 block", -1))}


def _qk_norm_step():
    from d2lmini.chapters import ch09_the_2026_block as ch09
    from d2lmini.data import python_reference_corpus

    ends = ch09.lm_walk()[-2:]  # the walk's last step: QK-norm added to the block before it
    rows = [[run.val_loss for run in ch09.train_walk_step(python_reference_corpus(), name, kwargs, seeds=SEEDS)]
            for name, kwargs in ends]
    mean = [sum(row) / len(row) for row in rows]
    return {"change": mean[1] - mean[0], "spread": max(max(row) - min(row) for row in rows)}


# --------------------------------------------------------------------------- 9.3: Block2026 with a QK-norm flag

_SIZES = (64, 4, 2, 160)  # num_hiddens, num_heads, num_kv_heads, ffn_num_hiddens, as in the chapter
_MISTRAL_RENAME = {
    "input_layernorm": "norm1", "post_attention_layernorm": "norm2",
    "self_attn.q_proj": "attention.W_q", "self_attn.k_proj": "attention.W_k",
    "self_attn.v_proj": "attention.W_v", "self_attn.o_proj": "attention.W_o",
    "mlp.gate_proj": "ffn.W_g", "mlp.up_proj": "ffn.W_1", "mlp.down_proj": "ffn.W_2"}


def _mistral(X, valid_lens):
    """A tiny random ``MistralDecoderLayer`` and its output on ``X``, called as ``MistralModel`` calls it."""
    from transformers import masking_utils
    from transformers.models.mistral.modeling_mistral import MistralRotaryEmbedding

    from d2lmini import reference

    d, h, g, f = _SIZES
    tiny = dict(hidden_size=d, num_attention_heads=h, num_key_value_heads=g, intermediate_size=f, head_dim=d // h,
                num_hidden_layers=1, rope_theta=1e4, sliding_window=None)
    layer, config = reference.hf_make("mistral", "MistralDecoderLayer", "MistralConfig", tiny)(seed=0)
    position_ids = torch.arange(X.shape[1]).expand(X.shape[0], -1)
    padding = (position_ids < valid_lens[:, None]).long()
    mask = masking_utils.create_causal_mask(config=config, inputs_embeds=X, attention_mask=padding, cache=None,
                                            position_ids=position_ids)
    with torch.no_grad():
        out = layer(X, attention_mask=mask, position_embeddings=MistralRotaryEmbedding(config)(X, position_ids),
                    position_ids=position_ids)
    return layer, out[0] if isinstance(out, tuple) else out


def _judge_flagged_block(cls) -> str | None:
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"exercise 9.3: hand in the class itself (your changed Block2026, a subclass of nn.Module), "
                         f"got {type(cls).__name__}")
    with torch.random.fork_rng(devices=[]):  # the reader's random numbers stay as they were
        return _compare_flagged_block(cls)


def _compare_flagged_block(cls) -> str | None:
    import d2lmini

    d, h, g, f = _SIZES
    X, valid_lens = torch.randn(2, 12, d, generator=torch.Generator().manual_seed(0)), torch.tensor([12, 7])
    try:
        plain = cls(d, h, g, f, rope_theta=1e4, qk_norm=False)
        default = cls(d, h, g, f, rope_theta=1e4)
    except (TypeError, ValueError) as error:
        if "qk_norm" in str(error) and "argument" not in str(error):  # accepted, then refused inside
            return (f"your __init__ accepts qk_norm, but a layer refused what it passed on ({error}): "
                    f"MultiHeadAttention takes qk_norm=None for no QK-norm, 'per_head' for it")
        return (f"building it as cls(d, h, g, f, rope_theta=1e4, qk_norm=False) failed ({error}): give __init__ "
                f"an argument qk_norm, True by default")
    layer, theirs = _mistral(X, valid_lens)
    try:
        d2lmini.copy_parameters(layer, plain, rename=_MISTRAL_RENAME)
    except ValueError as error:
        return (f"with qk_norm=False your block should hold exactly the tensors of Mistral's layer ({error}); "
                f"what does MultiHeadAttention build when its qk_norm is None?")
    with torch.no_grad():
        plain_differs = not torch.allclose(plain(X, valid_lens), theirs, atol=1e-5, rtol=1e-4)
    ref = d2lmini.TransformerBlock(d, h, num_kv_heads=g, ffn_num_hiddens=f, qk_norm="per_head", rope_theta=1e4,
                                   causal=True)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    try:
        d2lmini.copy_parameters(ref, default, rename={"addnorm1.norm_in": "norm1", "addnorm2.norm_in": "norm2"})
    except ValueError as error:
        return f"by default (qk_norm=True) the block must stay the chapter's Block2026, QK-norm included ({error})"
    with torch.no_grad():
        default_differs = not torch.allclose(default(X, valid_lens), ref(X, valid_lens), atol=1e-5, rtol=1e-4)
    if plain_differs and default_differs:
        return ("both settings differ from their references, so look at what qk_norm does not touch: the causal "
                "mask (causal=True) and valid_lens handed on to the attention")
    if plain_differs:
        return "with qk_norm=False, the weights fit but the outputs differ from MistralDecoderLayer's"
    if default_differs:
        return "by default (qk_norm=True) the outputs differ from the chapter's Block2026 (TransformerBlock)"
    return None


def _block_class(qk_norm_of, flag: bool = True, causal: bool = True) -> type:
    """A Block2026 whose MultiHeadAttention gets ``qk_norm_of(flag)``; without ``flag``, no qk_norm argument;
    ``causal=False``: the mask left out in both settings (a wrong answer)."""
    import d2lmini

    class Block(nn.Module):
        def __init__(self, num_hiddens, num_heads, num_kv_heads, ffn_num_hiddens, rope_theta=1e4, **kw):
            if not flag and kw:
                raise TypeError(f"__init__() got an unexpected keyword argument {next(iter(kw))!r}")
            super().__init__()
            self.norm1 = d2lmini.RMSNorm(num_hiddens)
            self.attention = d2lmini.MultiHeadAttention(num_hiddens, num_heads, num_kv_heads=num_kv_heads,
                                                        qk_norm=qk_norm_of(kw.get("qk_norm", True)),
                                                        rope_theta=rope_theta, causal=causal)
            self.norm2 = d2lmini.RMSNorm(num_hiddens)
            self.ffn = d2lmini.FeedForward(num_hiddens, ffn_num_hiddens, act="swiglu")

        def forward(self, X, valid_lens=None):
            Y = self.norm1(X)
            X = X + self.attention(Y, Y, Y, valid_lens)
            return X + self.ffn(self.norm2(X))

    return Block


# --------------------------------------------------------------------------- 9.4 and 9.5: counting

_KV_HEADS = (4, 2, 1)
_CONTEXT = 112


def _cache_bytes():
    with torch.random.fork_rng(devices=[]):
        return _measure_cache_bytes()


def _measure_cache_bytes():
    import d2lmini
    from d2lmini.chapters import ch09_the_2026_block as ch09
    from d2lmini.data import python_reference_corpus

    vocab_size, out = python_reference_corpus().vocab_size, []
    for num_kv_heads in _KV_HEADS:
        torch.manual_seed(0)
        model = d2lmini.LanguageModel(vocab_size, **{**ch09.CAPSTONE_MODEL, "context_len": _CONTEXT},
                                      **{**ch09.lm_walk()[-1][1], "num_kv_heads": num_kv_heads})
        cache = d2lmini.KVCache(len(model.blocks))
        with torch.no_grad():
            model(torch.randint(0, vocab_size, (1, _CONTEXT)), cache)
        out.append(cache.num_bytes())
    return tuple(out)


def _moe(k: int):
    import d2lmini

    return d2lmini.TransformerBlock(512, 8, ffn_factory=lambda: d2lmini.MixtureOfExperts(
        512, 16, top_k=k, ffn_num_hiddens=256, num_shared_experts=1)).ffn


def _closest_top_k():
    from d2lmini.parameters import num_parameters
    import d2lmini

    with torch.device("meta"):
        dense = num_parameters(d2lmini.TransformerBlock(512, 8).ffn)
        active = {k: _moe(k).num_active_parameters() for k in range(1, 17)}
    k = min(active, key=lambda k: abs(active[k] - dense))
    return {"k": k, "active": active[k], "dense": dense}


def _active(k: int) -> int:
    with torch.device("meta"):
        return _moe(int(k)).num_active_parameters()


def _router_parameters() -> int:
    from d2lmini.parameters import num_parameters

    with torch.device("meta"):
        return num_parameters(_moe(1).router)


def _moe_total(k: int) -> int:
    from d2lmini.parameters import num_parameters

    with torch.device("meta"):
        return num_parameters(_moe(k))


def _whole_block() -> int:
    """The parameters of all of TransformerBlock(512, 8), norms and attention too (a wrong ``dense``)."""
    import d2lmini
    from d2lmini.parameters import num_parameters

    with torch.device("meta"):
        return num_parameters(d2lmini.TransformerBlock(512, 8))


def _relu_ffn_4d() -> int:
    import d2lmini
    from d2lmini.parameters import num_parameters

    with torch.device("meta"):
        return num_parameters(d2lmini.FeedForward(512, 4 * 512, act="relu", bias=True))


def _near(a, b, rel=0.02):
    return abs(a - b) <= rel * abs(b)


EXERCISES = [
    Exercise(
        "9.1", "the validation losses of the 8-block models, (2017 block, 2026 block)", kind="numbers",
        names=("2017 block", "2026 block"), expected=_deep_pair, rel=2e-3, slow=True,
        order="the order: the 2017 block first, then the 2026 block",
        hints=[(lambda a, e: all(abs(a[n] - v) < 0.01 for n, v in _walk_pair().items()),
                "those are the walk's runs, 2 blocks deep: train both 8 blocks deep, train_group(..., "
                "num_blocks=8, num_steps=200)"),
               (lambda a, e: any(a[n] > e[n] + 0.05 for n in e),
                "higher than 8 blocks reach in 200 steps: train num_blocks=8 for num_steps=200, and hand in "
                "each run's val_loss (on held-out text), not its last training loss"),
               (lambda a, e: min(a[n] - e[n] for n in e) < -0.05,
                "lower than the exercise's run: train_group(..., num_blocks=8, num_steps=200) with the default "
                "widths and nothing else (no target=)")],
        hint="train both at the rate 0.01 and seed 0, 8 blocks deep for 200 steps, as the exercise's call does",
        wrong=[lambda e: {"2017 block": e["2026 block"], "2026 block": e["2017 block"]},
               lambda e: {n: v + 0.2 for n, v in e.items()},
               lambda e: {**e, "2026 block": e["2026 block"] + 0.12}, lambda e: _walk_pair()]),
    Exercise(
        "9.2", "(change, spread): the 2026 block's mean loss over seeds 0-2 minus the step before's, and the "
               "largest max - min of one row's three losses", kind="numbers",
        names=("change", "spread"), expected=_qk_norm_step, rel=0, abs=2e-3, slow=True,
        hints=[(lambda a, e: _near(a["change"], -e["change"], 0.1),
                "the sign: the change is the 2026 block's mean minus the mean of the step before it"),
               (lambda a, e: 0 < a["spread"] < 0.75 * e["spread"],
                "the spread is the largest value minus the smallest of one row's three losses, for the row where "
                "it is larger"),
               (lambda a, e: a["spread"] > 1.25 * e["spread"],
                "spread: max - min of one row's three losses (the row where it is larger), not of both rows' six "
                "losses together")],
        hint="train both rows with ch09.train_walk_step(corpus, name, kwargs, seeds=(0, 1, 2))",
        wrong=[lambda e: {**e, "change": -e["change"]}, lambda e: {**e, "spread": e["spread"] / 2}]),
    Exercise(
        "9.3", "your changed Block2026 class, with an argument qk_norm (True by default)", kind="custom",
        judge=_judge_flagged_block,
        wrong=[lambda: _block_class(lambda flag: "per_head", flag=False),  # the chapter's class, no flag
               lambda: _block_class(lambda flag: "per_head"),  # a flag that changes nothing
               lambda: _block_class(lambda flag: None),  # QK-norm gone by default too
               lambda: _block_class(lambda flag: flag),  # the bool passed on to the attention
               lambda: _block_class(lambda flag: "per_head" if flag else None, causal=False)]),  # no mask
    Exercise(
        "9.4", "the three caches' num_bytes(), for num_kv_heads 4, 2 and 1 in that order", kind="numbers",
        names=("num_kv_heads=4", "num_kv_heads=2", "num_kv_heads=1"), expected=_cache_bytes, rel=0, abs=0.5,
        order="the order: 4, 2, then 1",
        hints=[(lambda a, e: any(all(_near(a[n] * unit, e[n], 0.1) for n in e)
                                 for unit in (2 ** 10, 1e3, 2 ** 20, 1e6)),
                "in bytes, as cache.num_bytes() returns them, not KiB, kB, MiB or MB"),
               (lambda a, e: all(_near(a[n], 2 * e[n]) for n in e),
                "twice the cache: one sequence, ids of shape (1, 112), and 4 bytes per float32 number, for one "
                "key and one value per head and token"),
               (lambda a, e: all(_near(a[n], e[n] / 2) for n in e),
                "half: the cache holds keys and values, and a float32 takes 4 bytes"),
               (lambda a, e: all(_near(a[n], e[n] / 4) for n in e),
                "a factor of 4 is missing: each of the 4 blocks keeps a cache of its own, and a float32 takes "
                "4 bytes"),
               (lambda a, e: all(_near(a[n], 4 * e[n]) for n in e),
                "d_h is the width of one head, num_hiddens / num_heads"),
               (lambda a, e: all(_near(a[n], e[n] * 64 / 112) for n in e), "the 112 tokens of the exercise"),
               (lambda a, e: len(set(a.values())) == 1,
                "the cache holds num_kv_heads key and value heads: halving num_kv_heads halves it (d_h "
                "stays num_hiddens / num_heads whatever num_kv_heads is)")],
        wrong=[lambda e: {n: v / 2 for n, v in e.items()}, lambda e: {n: v / 4 for n, v in e.items()},
               lambda e: {n: v / 2 ** 10 for n, v in e.items()},
               lambda e: dict(zip(e, reversed(list(e.values())))),
               lambda e: {n: e["num_kv_heads=4"] for n in e}, lambda e: {n: 2 * v for n, v in e.items()}]),
    Exercise(
        "9.5", "(k, the mixture's num_active_parameters() at that k, the dense SwiGLU FFN's parameters)",
        kind="numbers", names=("k", "active", "dense"), expected=_closest_top_k, rel=0, abs=0.5,
        hints=[(lambda a, e: any(all(abs(a[n] * unit - e[n]) < 0.01 * e[n] for n in ("active", "dense"))
                                 for unit in (1e3, 1e6)),
                "active and dense: the counts themselves, not in thousands or millions"),
               (lambda a, e: a["k"] in range(1, 17) and a["active"] == _moe_total(int(a["k"])),
                "active: that is the mixture's whole count; a token uses only its top-k experts, the shared expert "
                "and the router: num_active_parameters()"),
               (lambda a, e: a["dense"] == _whole_block(),
                "dense: that counts the whole block; the dense FFN is TransformerBlock(512, 8).ffn, and k is "
                "chosen against its count"),
               (lambda a, e: a["dense"] != e["dense"] and a["k"] != e["k"],
                "dense: the dense FFN is TransformerBlock(512, 8)'s own, .ffn (SwiGLU at width 8d/3, no "
                "biases); choose k against its count"),
               (lambda a, e: a["active"] > 1.5 * e["dense"] and a["k"] == e["k"],
                "a token uses only its top-k experts, the shared expert and the router: num_active_parameters()"),
               (lambda a, e: a["k"] == e["k"] + 1 and a["active"] == _active(e["k"] + 1),
                "the closest k, above or below: compare |active - dense| for each k"),
               (lambda a, e: a["k"] == e["k"] + 1, "the shared expert runs for every token, beside the top-k"),
               (lambda a, e: a["k"] != e["k"], "the closest k, above or below: compare |active - dense| for each k"),
               (lambda a, e: a["k"] == e["k"] and a["active"] == e["active"] - _router_parameters(),
                "num_active_parameters() counts the router too: every token runs it"),
               (lambda a, e: a["k"] == e["k"] and a["active"] < e["active"],
                "active: build the mixture with its shared expert, num_shared_experts=1, which every token runs"),
               (lambda a, e: a["k"] == e["k"] and a["active"] == e["active"],
                "the dense FFN is TransformerBlock(512, 8)'s own: SwiGLU at width 8d/3, no biases; count it with "
                "num_parameters(TransformerBlock(512, 8).ffn) rather than by hand (the width is rounded)")],
        wrong=[lambda e: {**e, "k": e["k"] + 1}, lambda e: {**e, "active": _moe_total(int(e["k"]))},
               lambda e: {**e, "k": e["k"] + 1, "active": _active(e["k"] + 1)},
               lambda e: {**e, "dense": _relu_ffn_4d()}, lambda e: {**e, "k": e["k"] - 1},
               lambda e: {**e, "active": e["active"] - _router_parameters()},
               lambda e: {"k": 7, "active": _active(7), "dense": _whole_block()}]),
]
