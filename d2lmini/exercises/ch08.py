"""Self-checks of chapter 8's exercises (Attention for generation: the cache, GQA and MLA).

8.1 runs the reader's sliding-window ``MyGQA`` token by token beside
``d2lmini.MultiHeadAttention(..., window=5)``; 8.2 and 8.3 read cache sizes and parameters off
modules built on the meta device; 8.4 compares MLA's scores with explicit keys and with the
absorbed query.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import Exercise

#: Exercise 8.1's layer and run: width 64, 8 query heads, 2 key/value heads, a window of 5 keys,
#: 20 tokens decoded one at a time for a batch of 2.
WINDOW_LAYER = dict(num_hiddens=64, num_heads=8, num_kv_heads=2, window=5)
WINDOW_STEPS = 20

#: Llama 3 70B's attention (Grattafiori et al., 2024, Table 3; ``LlamaConfig`` of the released
#: model): width 8,192, 64 query heads of 128 features, 8 key/value heads, 80 layers.
LLAMA3_70B = dict(num_hiddens=8192, num_heads=64, head_dim=128, num_kv_heads=8, num_layers=80)


# --------------------------------------------------------------------------- 8.1, a sliding window


class _WindowGQA(nn.Module):
    """``MyGQA`` of the chapter with a cache of the last ``window + keep_extra`` tokens (the wrong
    answers of 8.1: ``keep_extra=None`` keeps every token, ``-1`` one too few; ``short_cache``:
    attends to ``window`` tokens but returns the last ``window - 1`` as the cache; ``trim_late``: trims
    the cache after the scores, which then read ``window + 1`` keys; ``stale_mask``: masks with ``past``
    counted before the trim, a mask wider than the kept keys)."""

    keep_extra: int | None = 0
    short_cache = False
    trim_late = False
    stale_mask = False

    def __init__(self, num_hiddens, num_heads, num_kv_heads, window):
        super().__init__()
        self.h, self.g, self.d_h, self.w = num_heads, num_kv_heads, num_hiddens // num_heads, window
        self.W_q = nn.Linear(num_hiddens, num_heads * self.d_h, bias=False)
        self.W_k = nn.Linear(num_hiddens, num_kv_heads * self.d_h, bias=False)
        self.W_v = nn.Linear(num_hiddens, num_kv_heads * self.d_h, bias=False)
        self.W_o = nn.Linear(num_heads * self.d_h, num_hiddens, bias=False)

    def forward(self, X, cache=None):  # one new token at a time
        b, n, _ = X.shape
        q = self.W_q(X).view(b, n, self.h, self.d_h).transpose(1, 2)
        k = self.W_k(X).view(b, n, self.g, self.d_h).transpose(1, 2)
        v = self.W_v(X).view(b, n, self.g, self.d_h).transpose(1, 2)
        if cache is not None:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        past = k.shape[2] - n  # before any trim
        if self.keep_extra is not None and not self.trim_late:
            keep = self.w + self.keep_extra
            k, v = k[:, :, -keep:], v[:, :, -keep:]
        group = self.h // self.g
        K, V = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ K.transpose(-1, -2) / self.d_h ** 0.5
        if self.stale_mask:  # (n, past + n) against the kept keys: a shape error once the window is full
            scores = scores.masked_fill(~torch.ones(n, past + n, dtype=torch.bool).tril(diagonal=past), float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if self.trim_late:
            k, v = k[:, :, -self.w:], v[:, :, -self.w:]
        if self.short_cache:
            k, v = k[:, :, 1 - self.w:], v[:, :, 1 - self.w:]
        return self.W_o((weights @ V).transpose(1, 2).reshape(b, n, -1)), (k, v)


class _Untrimmed(_WindowGQA):
    keep_extra = None


class _OneShort(_WindowGQA):
    keep_extra = -1


class _ShortCache(_WindowGQA):
    short_cache = True


class _TrimmedLate(_WindowGQA):
    trim_late = True


class _TrimmedAfterPast(_WindowGQA):
    stale_mask = True


def _decode(layer, X):
    """Feed ``X`` (b, n, d) to ``layer`` one token at a time; the outputs (b, n, d) and the last cache."""
    outputs, cache = [], None
    for t in range(X.shape[1]):
        out, cache = layer(X[:, t:t + 1], cache)
        outputs.append(out[:, -1])
    return torch.stack(outputs, dim=1), cache


def _judge_window(answer) -> str | None:
    """8.1: decode with the reader's class beside d2lmini's windowed attention on the whole prefix."""
    from ..attention import MultiHeadAttention
    from ..parameters import copy_parameters

    if not (isinstance(answer, type) and issubclass(answer, nn.Module)):
        raise ValueError("exercise 8.1: hand in the class itself (MyWindowGQA, not MyWindowGQA(...)), an "
                         f"nn.Module subclass built as MyWindowGQA(num_hiddens, num_heads, num_kv_heads, window); "
                         f"got {type(answer).__name__}")
    d, h, g, w = (WINDOW_LAYER[k] for k in ("num_hiddens", "num_heads", "num_kv_heads", "window"))
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))  # fresh inputs each time
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (), generator=generator)))
        ref = MultiHeadAttention(d, h, num_kv_heads=g, causal=True, window=w)
        plain = MultiHeadAttention(d, h, num_kv_heads=g, causal=True)
        copy_parameters(ref, plain)
        try:
            mine = answer(d, h, g, w)
        except Exception as error:
            return f"MyWindowGQA({d}, {h}, {g}, {w}) raised {type(error).__name__}: {error}"
        try:
            copy_parameters(ref, mine)
        except ValueError as error:
            return f"keep MyGQA's four projections W_q, W_k, W_v, W_o and nothing else with weights ({error})"
        X = torch.randn(2, WINDOW_STEPS, d, generator=generator)
        try:
            got, cache = _decode(mine.eval(), X)
        except Exception as error:
            stale = (": trim the cache right after appending, before past = k.shape[2] - n, so that past and the "
                     "mask count the keys you keep") if "must match the size" in str(error) else ""
            return f"decoding one token at a time raised {type(error).__name__}: {error}{stale}"
        want = torch.stack([ref(X[:, :t + 1], X[:, :t + 1], X[:, :t + 1])[:, -1] for t in range(WINDOW_STEPS)], 1)
        if got.shape != want.shape:
            return f"each call must return (output, cache), the output (b, 1, {d}); got {tuple(got.shape)} in all"
        close = (got - want).abs().amax(dim=(0, 2)) <= 1e-5 + 1e-5 * want.abs().amax(dim=(0, 2))
        if not bool(close.all()):
            first = int((~close).nonzero()[0])
            full = torch.stack([plain(X[:, :t + 1], X[:, :t + 1], X[:, :t + 1])[:, -1]
                                for t in range(WINDOW_STEPS)], 1)
            if torch.allclose(got, full, atol=1e-5, rtol=1e-5):
                return ("your outputs attend to the whole prefix: after appending, keep only the last w keys and "
                        "values, along the tokens' dimension (the cache is (b, g, tokens, d_h): k[:, :, -w:])")
            if first < w - 1:
                return (f"token {first} already differs, before the window is full: start from MyGQA's forward "
                        "and change only what the cache keeps")
            wider = MultiHeadAttention(d, h, num_kv_heads=g, causal=True, window=w + 1)
            copy_parameters(ref, wider)
            late = torch.stack([wider(X[:, :t + 1], X[:, :t + 1], X[:, :t + 1])[:, -1]
                                for t in range(WINDOW_STEPS)], 1)
            if torch.allclose(got, late, atol=1e-5, rtol=1e-5):
                return ("your outputs read w + 1 keys: keep the last w after appending and before the scores, "
                        "not only in the cache you return")
            return (f"the outputs agree up to token {first - 1} and differ from token {first} on: the window holds "
                    "w keys, the new token's own included (token t sees tokens t - w + 1 to t)")
        shape = (2, g, w, d // h)
        if not isinstance(cache, (tuple, list)) or len(cache) != 2 or tuple(cache[0].shape) != shape:
            kept = tuple(cache[0].shape) if isinstance(cache, (tuple, list)) and len(cache) else cache
            if isinstance(kept, tuple) and len(kept) == 4 and kept[2] in (w - 1, w + 1):
                return (f"the outputs are right, but the cache keeps {kept[2]} keys and values: return the last "
                        f"w = {w}, the new token's own included, {shape}")
            return (f"the outputs are right, but after {WINDOW_STEPS} tokens the cached keys are {kept}, "
                    f"not {shape}: return the trimmed keys and values as the cache")
    return None


# --------------------------------------------------------------------------- 8.2-8.4, sizes and scores


def _llama70b_variants() -> dict:
    from ..attention import MultiHeadAttention

    d, h, hd, g = (LLAMA3_70B[k] for k in ("num_hiddens", "num_heads", "head_dim", "num_kv_heads"))
    return {"MHA": lambda: MultiHeadAttention(d, h, head_dim=hd, causal=True),
            "GQA": lambda: MultiHeadAttention(d, h, head_dim=hd, num_kv_heads=g, causal=True)}


def _llama70b_cache() -> dict:
    """8.2: GiB of cache of one 131,072-token sequence, and how many fit in 400 GiB, MHA and GQA."""
    from ..chapters import ch08_attention_generation as gen

    rows = {row["attention"]: row for row in gen.kv_cache_rows(
        _llama70b_variants(), num_layers=LLAMA3_70B["num_layers"], context=128 * 1024)}
    return {"mha_gib": rows["MHA"]["GiB"], "gqa_gib": rows["GQA"]["GiB"],
            "mha_sequences": 400 // rows["MHA"]["GiB"], "gqa_sequences": 400 // rows["GQA"]["GiB"]}


def _small_rope_mla(rope_dim: int = 2):
    """DeepSeek-V3's MLA layer on the meta device with a rotary key of ``rope_dim`` features."""
    from ..chapters import ch08_attention_generation as gen
    from ..mla import MultiHeadLatentAttention

    sizes = {k: v for k, v in gen.DEEPSEEK_V3.items() if k not in ("num_hiddens", "num_heads", "num_layers")}
    with torch.device("meta"):
        return MultiHeadLatentAttention(7168, 128, rope_theta=1e4, **{**sizes, "qk_rope_head_dim": rope_dim})


def _mla_parameters(rope_dim: int) -> int:
    from ..parameters import num_parameters

    return num_parameters(_small_rope_mla(rope_dim))


def _small_rope_numbers() -> tuple:
    """8.3: numbers cached per token and parameters of DeepSeek-V3's MLA with a rotary key of 2 features."""
    from ..mla import kv_cache_bytes_per_token

    return kv_cache_bytes_per_token(_small_rope_mla(), dtype_bytes=1), _mla_parameters(2)


#: Exercise 8.4's MLA layer: 4 heads, no query latent, a key/value latent of 16, 8 + 4 query/key features.
ABSORPTION_LAYER = dict(num_hiddens=64, num_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
                        qk_rope_head_dim=4, v_head_dim=8, rope_theta=1e4)


def absorption_scores(mla, X: torch.Tensor) -> tuple:
    """Head 0's position-free scores ``q^T k`` of every query/key pair, with explicit keys and absorbed.

    Args:
        mla: a :class:`~d2lmini.mla.MultiHeadLatentAttention` without a query latent; X: ``(1, n, d)``.

    Returns:
        ``(explicit, absorbed)``, each ``(n, n)``: ``q (W^UK_0 c)^T`` and ``(q W^UK_0) c^T``.
    """
    nope = mla.qk_nope_head_dim
    with torch.no_grad():
        q = X[0] @ mla.W_q.weight[:nope].T           # (n, nope): head 0's position-free queries
        W_uk = mla.W_ukv.weight[:nope]               # (nope, kv_lora_rank): head 0's key-building matrix
        c = mla.latent_kv(X)[0][0]                   # (n, kv_lora_rank): the cached latents
        return q @ (c @ W_uk.T).T, (q @ W_uk) @ c.T


def _absorption() -> tuple:
    """8.4: the largest difference between the two ways, and the features each compares per key."""
    from ..mla import MultiHeadLatentAttention
    from ..seeding import seeded

    with seeded(0):
        mla = MultiHeadLatentAttention(**ABSORPTION_LAYER)
        X = torch.randn(1, 6, 64)
    explicit, absorbed = absorption_scores(mla, X)
    return float((explicit - absorbed).abs().max()), mla.qk_nope_head_dim, mla.kv_lora_rank


EXERCISES = [
    Exercise("8.1", "the class MyWindowGQA(num_hiddens, num_heads, num_kv_heads, window), MyGQA with a "
                    "cache of the last window tokens", kind="custom", judge=_judge_window,
             wrong=[lambda: _Untrimmed, lambda: _OneShort, lambda: _ShortCache, lambda: _TrimmedLate]),
    Exercise("8.2", "a dict {'mha_gib', 'gqa_gib', 'mha_sequences', 'gqa_sequences'}: GiB of cache of one "
                    "sequence of 131,072 tokens, and whole sequences in 400 GiB",
             kind="numbers", names=("mha_gib", "gqa_gib", "mha_sequences", "gqa_sequences"),
             expected=_llama70b_cache, rel=1e-3,
             order="these are the right numbers in another order: MHA caches every head (the larger cache, "
                   "fewer sequences), GQA 8 key/value heads; hand in mha_gib, gqa_gib, mha_sequences, "
                   "gqa_sequences",
             hints=[(lambda a, e: abs(a["mha_gib"] - e["mha_gib"] / 2) < 1,
                     "half the cache: a token caches a key and a value for every key/value head, each number two "
                     "bytes in bfloat16 (kv_cache_rows' default dtype_bytes=2)"),
                    (lambda a, e: math.isclose(a["gqa_gib"], e["mha_gib"], rel_tol=1e-3),
                     "gqa_gib: that is the MHA cache; build the GQA layer with num_kv_heads=8"),
                    (lambda a, e: abs(a["mha_gib"] - 2 * e["mha_gib"]) < 1, "bfloat16: two bytes per number"),
                    (lambda a, e: any(abs(a["mha_gib"] * unit - e["mha_gib"]) < 1e-3 * e["mha_gib"]
                                      for unit in (1024, 1e12 / 2 ** 30)),
                     "in GiB (2^30 bytes), not TiB or TB"),
                    (lambda a, e: any(abs(a["mha_gib"] * 2 ** k - e["mha_gib"]) < 1e-3 * e["mha_gib"]
                                      for k in range(1, 8)),
                     "the cache of a full context, 131,072 tokens (context=131072), for all 80 layers"),
                    (lambda a, e: a["mha_gib"] < e["mha_gib"] / 10, "every one of the 80 layers has its own cache"),
                    (lambda a, e: abs(a["mha_gib"] / e["mha_gib"] - 2 ** 30 / 1e9) < 1e-3,
                     "a GiB is 2^30 bytes, not 10^9"),
                    (lambda a, e: a["mha_sequences"] != int(a["mha_sequences"]) or a["gqa_sequences"] != int(
                        a["gqa_sequences"]), "whole sequences only: round down"),
                    (lambda a, e: math.isclose(a["mha_gib"], e["mha_gib"], rel_tol=1e-3)
                     and math.isclose(a["gqa_gib"], e["gqa_gib"], rel_tol=1e-3),
                     "the sizes are right; count the whole sequences that fit, floor(400 / GiB)")],
             hint="kv_cache_rows(builders, num_layers=80, context=131072), each builder a function of no "
                  "arguments returning d2lmini.MultiHeadAttention(8192, 64, ...)",
             wrong=[lambda e: {**e, "mha_gib": e["mha_gib"] / 2, "gqa_gib": e["gqa_gib"] / 2},
                    lambda e: {**e, "mha_sequences": 400 / e["mha_gib"], "gqa_sequences": 400 / e["gqa_gib"]},
                    lambda e: {**e, "mha_sequences": math.ceil(400 / e["mha_gib"])},
                    lambda e: {k: v * 2 ** 30 / 1e9 if k.endswith("gib") else v for k, v in e.items()},
                    lambda e: {**e, "gqa_gib": e["mha_gib"], "gqa_sequences": e["mha_sequences"]}]),
    Exercise("8.3", "a tuple (numbers cached per token and layer, parameters of the layer)",
             kind="numbers", names=("numbers", "parameters"), expected=_small_rope_numbers, rel=0, abs=0.5,
             hints=[(lambda a, e: a["numbers"] == 2 * e["numbers"],
                     "that is bytes at bfloat16: hand in numbers (dtype_bytes=1 counts them)"),
                    (lambda a, e: a["numbers"] == e["numbers"] + 62,
                     "576 is DeepSeek-V3's own: pass qk_rope_head_dim=2"),
                    (lambda a, e: a["numbers"] == e["numbers"] - 2,
                     "numbers: the latent alone; the shared rotary key (qk_rope_head_dim=2 features) is cached "
                     "too"),
                    (lambda a, e: a["parameters"] == _mla_parameters(64),
                     "parameters: that is the layer with 64 rotary features, DeepSeek-V3's own: build it with "
                     "qk_rope_head_dim=2"),
                    (lambda a, e: a["numbers"] == 61 * e["numbers"] or a["parameters"] == 61 * e["parameters"],
                     "per layer: hand in one layer's numbers and parameters, not those of DeepSeek-V3's 61 layers"),
                    (lambda a, e: abs(a["parameters"] * 1e6 - e["parameters"]) < 1e6,
                     "parameters: the count itself, not in millions"),
                    (lambda a, e: a["numbers"] == e["numbers"] and e["parameters"] - 10_000 < a["parameters"]
                     < e["parameters"],
                     "parameters: d2lmini.num_parameters(layer) counts every parameter, the gains of the latents' "
                     "norms too"),
                    (lambda a, e: e["numbers"] < a["numbers"] < 2 * e["numbers"] and (a["numbers"] - e["numbers"]) % 2 == 0,
                     "numbers: the rotary key (qk_rope_head_dim=2 features) is cached once per token, shared by "
                     "all heads, not once per head"),
                    (lambda a, e: a["numbers"] != e["numbers"],
                     "numbers: kv_cache_bytes_per_token(mla, dtype_bytes=1), the latent and the one rotary key "
                     "all heads share")],
             hint="build it inside `with torch.device('meta'):` and count with d2lmini.num_parameters",
             wrong=[lambda e: {**e, "numbers": 2 * e["numbers"]}, lambda e: {"numbers": 576.0,
                                                                             "parameters": e["parameters"] + 1e6},
                    lambda e: {k: 61 * v for k, v in e.items()}, lambda e: {**e, "numbers": e["numbers"] - 2},
                    lambda e: {**e, "parameters": _mla_parameters(64)},
                    lambda e: {**e, "numbers": e["numbers"] - 2 + 2 * 128},
                    lambda e: {**e, "parameters": e["parameters"] / 1e6}]),
    Exercise("8.4", "a tuple (largest difference, features compared per key with explicit keys, with the "
                    "absorbed query)",
             kind="numbers", names=("max_difference", "explicit_features", "absorbed_features"),
             expected=_absorption, rel=0, abs=1e-4,
             order="the order: an explicit key has qk_nope_head_dim features, the latent kv_lora_rank",
             hints=[(lambda a, e: a["max_difference"] > 1e-4,
                     "Both ways must compute the same qᵀk; check which rows of W_ukv are head 0's key part."),
                    (lambda a, e: a["explicit_features"] == e["explicit_features"] + ABSORPTION_LAYER[
                        "qk_rope_head_dim"] or a["absorbed_features"] == e["absorbed_features"] + ABSORPTION_LAYER[
                        "qk_rope_head_dim"],
                     "the position-free scores leave out the qk_rope_head_dim rotary features")],
             hint="count the features of the two vectors each score is a dot product of",
             wrong=[lambda e: {**e, "max_difference": 0.5},
                    lambda e: {**e, "explicit_features": e["explicit_features"] + 4,
                               "absorbed_features": e["absorbed_features"] + 4},
                    lambda e: {**e, "explicit_features": e["absorbed_features"],
                               "absorbed_features": e["explicit_features"]}]),
]
