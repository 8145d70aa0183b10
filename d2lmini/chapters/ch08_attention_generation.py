"""Attention for generation: what the key/value cache holds, for MHA, MQA, GQA and MLA.

The experiments of the chapter "Attention for generation: the cache, GQA and MLA":

* :func:`decode_step` -- one call of a plain :class:`~d2lmini.attention.MultiHeadAttention`
  with a key/value cache (its ``cache=``, a :class:`~d2lmini.cache.LayerCache`), and :func:`time_next_token`, the
  time one new token costs with the cache and by recomputing the whole prefix;
* :func:`attention_variants` and :func:`kv_cache_rows` -- key/value cache bytes per token of
  multi-head, multi-query, grouped-query and multi-head latent attention, read from modules
  built at real sizes on the meta device (:data:`LLAMA3_8B`, :data:`DEEPSEEK_V3`);
* :func:`plot_kv_cache` -- the figure of those sizes;
* :func:`mla_parameter_variants` and :func:`parameters_by_projection` -- where MLA's
  parameters go, projection by projection (:data:`PROJECTIONS`).

Shapes use the legend b = batch, n = num_steps, d = num_hiddens, h = heads.
"""

from __future__ import annotations

import statistics
import time

import torch

from .._checks import (check_dtype_matches, check_instance, check_int_sequence, check_positive_int, check_seed,
                       check_sequence_tensor)
from .._shown import shown_in
from ..attention import MultiHeadAttention
from ..cache import LayerCache
from ..mla import MultiHeadLatentAttention, kv_cache_bytes_per_token
from ..parameters import num_parameters
from ..plot import styled_figure

#: Llama 3 8B's attention (Grattafiori et al., 2024; ``LlamaConfig`` of the released model):
#: width 4,096, 32 query heads of 128 features, 8 key/value heads, 32 layers.
LLAMA3_8B = dict(num_hiddens=4096, num_heads=32, head_dim=128, num_kv_heads=8, num_layers=32)

#: DeepSeek-V3's attention (DeepSeek-AI, 2024, arXiv 2412.19437; ``DeepseekV3Config`` defaults
#: in ``transformers`` 5.24): width 7,168, 128 heads, latent ranks 1,536 (queries) and 512
#: (keys and values), 128 + 64 query/key features per head, 128 value features, 61 layers.
DEEPSEEK_V3 = dict(num_hiddens=7168, num_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                   qk_rope_head_dim=64, v_head_dim=128, num_layers=61)


#: Options of :class:`~d2lmini.attention.MultiHeadAttention` that :func:`decode_step` does not
#: reproduce (each is off when ``None``).
_PLAIN = ("qk_norm", "rope_theta", "window", "sinks")


def decode_step(attention: MultiHeadAttention, X: torch.Tensor, cache: tuple | None = None):
    """Attend from new tokens to the cached keys and values plus their own; return the output and the cache.

    What a decoder does with a plain causal :class:`~d2lmini.attention.MultiHeadAttention`
    (with or without grouped key/value heads) and its key/value cache (``cache=``, a
    :class:`~d2lmini.cache.LayerCache`): only the new tokens are projected, their keys and values
    are appended to ``cache``, and new token ``i`` (at position ``past + i``) sees keys ``0 .. past + i``.
    Called with the whole sequence and no cache it equals ``attention(X, X, X)``. Dropout
    is never applied (decoding runs the model in evaluation mode). Introduced in the chapter
    "Attention for generation", whose reader writes the same computation as ``MyGQA``.

    Args:
        attention: a causal ``MultiHeadAttention`` without QK-norm, RoPE, window or sinks.
        X: the new tokens, ``(b, n, d)``.
        cache: ``None`` (no earlier tokens) or the ``(k, v)`` a previous call returned,
            each ``(b, num_kv_heads, past, head_dim)``.

    Returns:
        ``(out, (k, v))``: ``(b, n, d)`` and the cache grown by ``n`` tokens.

    Raises:
        TypeError: ``attention`` not a ``MultiHeadAttention``; ``X`` not a floating tensor
            of the weights' dtype.
        ValueError: an option listed above, ``causal=False``, ``X`` not ``(b, n, d)``, or a
            cache that is not a pair of ``(b, num_kv_heads, past, head_dim)`` tensors.
    """
    check_instance("attention", attention, MultiHeadAttention, "a d2lmini MultiHeadAttention")
    options = [name for name in _PLAIN if getattr(attention, name) is not None]
    if options or not attention.causal:
        raise ValueError(f"decode_step needs a plain causal MultiHeadAttention; this one has {options or 'causal=False'}")
    check_sequence_tensor("X", X, attention.num_hiddens)
    check_dtype_matches("X", X, attention)
    layer = LayerCache()
    if cache is not None:
        _check_cache(cache, X.shape[0], attention.num_kv_heads, attention.head_dim)
        layer.keys, layer.values = cache
    out = attention(X, X, X, cache=layer)
    return out, (layer.keys, layer.values)


def _check_cache(cache, b: int, g: int, hd: int) -> None:
    """Raise ``ValueError`` unless ``cache`` is a pair of tensors of one shape ``(b, g, past, hd)``."""
    pair = isinstance(cache, tuple) and len(cache) == 2 and all(isinstance(c, torch.Tensor) for c in cache)
    if not pair or cache[0].shape != cache[1].shape or cache[0].dim() != 4 or (
            tuple(cache[0].shape[:2]), cache[0].shape[3]) != ((b, g), hd):
        raise ValueError(f"cache must be None or a pair (k, v) of ({b}, {g}, past, {hd}) tensors, the cache "
                         "decode_step returned for this batch")


def _median_seconds(fn, repeats: int) -> float:
    """The median wall-clock time of ``repeats`` calls of ``fn()``, after one call to warm up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@shown_in("ch08")
def time_next_token(attention, prefix_lens, *, repeats: int = 5,
                    seed: int = 0) -> list[dict]:
    """Wall-clock time of one new token after prefixes of ``prefix_lens`` tokens, recomputed and cached.

    Returns one dict per prefix: ``prefix``, ``recompute (ms)`` (the whole sequence through
    ``attention``, keeping the last output), ``cached (ms)`` (:func:`decode_step` on the new
    token with the prefix's cache) and ``speed-up`` (their ratio); medians of ``repeats``
    wall-clock times, without gradients. The inputs are random, drawn from ``seed``.

    Raises:
        TypeError: ``attention`` not a ``MultiHeadAttention``; a prefix length not an int.
        ValueError: a prefix length below 1, ``repeats`` below 1, or an attention
            :func:`decode_step` refuses.
    """
    check_instance("attention", attention, MultiHeadAttention,
                   "a d2lmini MultiHeadAttention")
    check_int_sequence("prefix_lens", prefix_lens)
    check_positive_int("repeats", repeats)
    generator = torch.Generator().manual_seed(check_seed(seed))
    rows = []
    for n in prefix_lens:
        # the prefix and one new token
        X = torch.randn(1, n + 1, attention.num_hiddens, generator=generator)
        with torch.no_grad():
            # the prefix's keys and values, computed once
            _, cache = decode_step(attention, X[:, :n])
            recompute = _median_seconds(lambda: attention(X, X, X)[:, -1], repeats)
            cached = _median_seconds(lambda: decode_step(attention, X[:, n:], cache),
                                     repeats)
        rows.append({"prefix": n, "recompute (ms)": 1e3 * recompute,
                     "cached (ms)": 1e3 * cached, "speed-up": recompute / cached})
    return rows


def attention_variants(size: dict) -> dict:
    """Zero-argument builders of the attention variants compared at one model size.

    Args:
        size: :data:`LLAMA3_8B` (multi-head, grouped-query with its 8 key/value heads, multi-query)
            or :data:`DEEPSEEK_V3` (the same three with 128 heads of ``v_head_dim`` features, and
            multi-head latent attention).

    Returns:
        ``{name: callable}``; each callable returns a fresh module (build it on the meta device).

    Raises:
        ValueError: for any other ``size``.
    """
    if size is LLAMA3_8B:
        d, h, hd, g = size["num_hiddens"], size["num_heads"], size["head_dim"], size["num_kv_heads"]
    elif size is DEEPSEEK_V3:
        d, h, hd, g = size["num_hiddens"], size["num_heads"], size["v_head_dim"], 8
    else:
        raise ValueError("size must be ch08_attention_generation.LLAMA3_8B or DEEPSEEK_V3")
    variants = {"MHA": lambda: MultiHeadAttention(d, h, head_dim=hd, causal=True),
                f"GQA ({g} groups)": lambda: MultiHeadAttention(d, h, head_dim=hd, num_kv_heads=g, causal=True),
                "MQA": lambda: MultiHeadAttention(d, h, head_dim=hd, num_kv_heads=1, causal=True)}
    if size is DEEPSEEK_V3:
        mla = {k: v for k, v in size.items() if k not in ("num_hiddens", "num_heads", "num_layers")}
        variants["MLA"] = lambda: MultiHeadLatentAttention(d, h, rope_theta=1e4, **mla)
    return variants


@shown_in("ch08")
def kv_cache_rows(
    variants: dict, *, num_layers: int, context: int, dtype_bytes: int = 2
) -> list[dict]:
    """Cache per token and per model of each attention variant, read off modules on the meta device.

    The meta device gives every parameter a shape but no memory and no values, so a
    layer of a 671-billion-parameter model costs nothing to build.

    Returns:
        one dict per variant: ``attention``, ``parameters`` (of one layer), ``numbers``
        and ``bytes`` cached per token and layer, and ``GiB`` for ``context`` tokens in
        all ``num_layers`` layers, at ``dtype_bytes`` bytes per number (2: bfloat16).
    """
    check_positive_int("num_layers", num_layers)
    check_positive_int("context", context)
    rows = []
    for name, build in variants.items():
        with torch.device("meta"):
            attention = build()
        per_token = kv_cache_bytes_per_token(attention, dtype_bytes)
        rows.append(
            {
                "attention": name,
                "parameters": num_parameters(attention),
                "numbers": per_token // dtype_bytes,
                "bytes": per_token,
                "GiB": per_token * num_layers * context / 2**30,
            }
        )
    return rows


def plot_kv_cache(rows_by_size: dict):
    """Figure: bytes cached per token and layer (log scale), one bar per variant and model size."""
    with styled_figure(1, width=8.0, height=3.0) as (fig, ax):
        labels, values, colors = [], [], []
        palette = {"MHA": "#c0392b", "GQA": "#2471a3", "MQA": "#7d3c98", "MLA": "#1e8449"}
        for size, rows in rows_by_size.items():
            for row in rows:
                labels.append(f"{size}: {row['attention']}")
                values.append(row["bytes"])
                colors.append(palette[row["attention"].split()[0]])
        ax.barh(range(len(values)), values, color=colors)
        ax.set_yticks(range(len(values)), labels)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("key/value cache per token and layer (bytes, bfloat16)")
        for i, v in enumerate(values):
            ax.text(v * 1.1, i, f"{v:,}", va="center", fontsize=8)
        ax.set_xlim(100, max(values) * 8)  # from 100 bytes, so the smallest bar is visible
    return fig


#: The parts :func:`parameters_by_projection` counts, as prefixes of the parameter names of
#: :class:`~d2lmini.attention.MultiHeadAttention` and :class:`~d2lmini.mla.MultiHeadLatentAttention`
#: (the latents' RMSNorm gains count with their projection).
PROJECTIONS = {"queries": ("W_q.", "W_dq.", "q_latent_norm.", "W_uq."),
               "keys and values": ("W_k.", "W_v.", "W_dkv.", "kv_latent_norm.", "W_ukv."),
               "output": ("W_o.",)}


def mla_parameter_variants() -> dict:
    """Builders of three attention layers at DeepSeek-V3's size, from multi-head attention to MLA.

    ``"MHA"`` (128 heads of 128 features, as in :func:`attention_variants`), ``"MLA, full-rank
    queries"`` (DeepSeek-V3's MLA with ``q_lora_rank=None``: the key/value latent and the rotary
    features, no query latent) and ``"MLA"`` (DeepSeek-V3's, :data:`DEEPSEEK_V3`). Build them on
    the meta device.

    Returns:
        ``{name: callable}``; each callable returns a fresh module.
    """
    variants = attention_variants(DEEPSEEK_V3)
    mla = {k: v for k, v in DEEPSEEK_V3.items() if k not in ("num_hiddens", "num_heads", "num_layers")}
    d, h = DEEPSEEK_V3["num_hiddens"], DEEPSEEK_V3["num_heads"]
    return {"MHA": variants["MHA"],
            "MLA, full-rank queries": lambda: MultiHeadLatentAttention(d, h, rope_theta=1e4,
                                                                       **{**mla, "q_lora_rank": None}),
            "MLA": variants["MLA"]}


def parameters_by_projection(variants: dict) -> list[dict]:
    """Parameters of each attention variant, split by :data:`PROJECTIONS`, counted on the meta device.

    Args:
        variants: ``{name: callable}`` returning a ``MultiHeadAttention`` or a
            ``MultiHeadLatentAttention`` (e.g. :func:`mla_parameter_variants`).

    Returns:
        one dict per variant: ``attention``, then the parameters of ``queries``,
        ``keys and values``, ``output`` and their ``total``.

    Raises:
        ValueError: a module with a parameter outside :data:`PROJECTIONS`.
    """
    rows = []
    for name, build in variants.items():
        with torch.device("meta"):
            attention = build()
        rows.append({"attention": name, **num_parameters(attention, PROJECTIONS)})
    return rows


__all__ = ["DEEPSEEK_V3", "LLAMA3_8B", "PROJECTIONS", "attention_variants", "decode_step", "kv_cache_rows",
           "mla_parameter_variants", "parameters_by_projection", "plot_kv_cache", "time_next_token"]
