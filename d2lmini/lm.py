"""A language model made of blocks, and text generation with a key/value cache.

Introduced in the chapter "The 2026 block", which trains the 2017 block and the 2026 block as
character language models and generates text from both. :class:`LanguageModel` is the
decoder-only stack every chapter's block goes into (GPT, Radford et al., 2018): token
embedding, positions, ``num_blocks`` causal blocks, a final norm (GPT-2's, Radford et al.,
2019; GPT-1 has none) and an output head. :func:`generate` decodes from it greedily or by
sampling, with Hugging Face ``transformers``' argument names (``max_new_tokens``,
``do_sample``, ``temperature``, ``top_k``) but its own defaults: ``top_k=None`` keeps every
token (Hugging Face's default is 50), and a ``top_k`` above the vocabulary is an error
(Hugging Face clamps it).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ._checks import (check_bool, check_choice, check_instance, check_int_tensor, check_nonnegative_int,
                      check_positive_float,
                      check_positive_int, check_seed)
from ._shown import shown_in
from .block import TransformerBlock
from .placements import PLACEMENT_TABLE
from .cache import KVCache
from .norms import make_norm

#: How a :class:`LanguageModel` tells the blocks where each token is: RoPE inside attention
#: (Su et al., 2021), or a learned or sinusoidal vector added to the token embedding
#: (Vaswani et al., 2017, section 3.5).
POSITIONS = ("rope", "learned", "sinusoidal")


def sinusoidal_positions(num_steps: int, num_hiddens: int) -> torch.Tensor:
    """The 2017 Transformer's positional encoding, ``(num_steps, num_hiddens)``.

    ``P[p, 2i] = sin(p / 10000^(2i/d))`` and ``P[p, 2i+1] = cos(p / 10000^(2i/d))``
    (Vaswani et al., 2017, section 3.5; d2l section 11.6).

    Raises:
        ValueError / TypeError: if either size is not a positive int, or ``num_hiddens`` is odd.
    """
    num_steps, num_hiddens = check_positive_int("num_steps", num_steps), check_positive_int("num_hiddens", num_hiddens)
    if num_hiddens % 2:
        raise ValueError(f"sinusoidal positions need an even num_hiddens, got {num_hiddens}")
    angles = torch.arange(num_steps, dtype=torch.float32)[:, None] / torch.pow(
        10000.0, torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens)
    P = torch.zeros(num_steps, num_hiddens)
    P[:, 0::2], P[:, 1::2] = torch.sin(angles), torch.cos(angles)
    return P


class LanguageModel(nn.Module):
    """A decoder-only language model: embedding, positions, causal blocks, final norm, head.

    Every block is a :class:`~d2lmini.block.TransformerBlock` with ``causal=True``. The
    stream after the last block is normalized by one more norm of the blocks' kind, except
    with post-LN, whose stream is already normalized (GPT-2 and every pre-norm model add it;
    the 2017 Transformer has none). The head is a linear map to next-token logits, without a
    bias and not tied to the embedding (as Llama and Qwen3 with ``tie_word_embeddings=False``).

    Args:
        vocab_size: number of distinct tokens.
        num_blocks: depth ``L``.
        context_len: the longest sequence the model takes (learned and sinusoidal positions
            cover ``0 .. context_len - 1``; RoPE could go further, but the model is held to it).
        positions: one of :data:`POSITIONS`: ``'rope'`` (the blocks get ``rope_theta``, 10,000
            unless given), ``'learned'`` (a trained vector per position, as GPT-2;
            initialized N(0, 0.02^2) as in ``transformers``' GPT-2, where the released code draws 0.01) or ``'sinusoidal'`` (the 2017 encoding, fixed).
        **block_kwargs: :class:`~d2lmini.block.TransformerBlock`'s arguments, ``num_hiddens`` and
            ``num_heads`` included (both required); ``causal`` is always True (an ``attn_factory``
            must return a causal module).

    Attributes:
        embedding, blocks, final_norm (``None`` with post-LN), head; ``pos_embedding`` (learned)
        or the buffer ``pos_encoding`` (sinusoidal), else ``None``.
        block_kwargs: the blocks' arguments (``num_hiddens`` and ``num_heads`` included): with
            ``vocab_size``, ``num_blocks``, ``context_len`` and ``positions``, what builds the same model.

    Shape:
        ``forward(tokens, cache=None)``: integer ids ``(b, n)``; returns logits
        ``(b, n, vocab_size)``. With a :class:`~d2lmini.cache.KVCache` the ids are the new
        positions only, and the cache grows by ``n``.

    Raises:
        TypeError: ``num_hiddens`` or ``num_heads`` missing, ``causal`` given, or arguments of
            the wrong type.
        ValueError: bad sizes, an unknown ``positions``, ``rope_theta`` with other positions,
            or any argument ``TransformerBlock`` rejects; at call time, ids that are not a
            ``(b, n)`` integer tensor, or more than ``context_len`` positions (cache included).
            (An id outside ``[0, vocab_size)`` raises the embedding's ``IndexError``;
            :func:`generate` checks its prompt's ids.)
    """

    #: Whether the output head has a bias (:class:`~d2lmini.train.TinyLM`, the early chapters' model, has one).
    head_bias = False
    #: the constructor's name for the context length, as error messages quote it
    context_arg = "context_len"

    def __init__(self, vocab_size: int, num_blocks: int, context_len: int, *, positions: str = "rope",
                 **block_kwargs):
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.context_len = check_positive_int("context_len", context_len)
        check_positive_int("num_blocks", num_blocks)
        self.positions = check_choice("positions", positions, POSITIONS)
        missing = [name for name in ("num_hiddens", "num_heads") if name not in block_kwargs]
        if missing:
            raise TypeError(f"LanguageModel needs the blocks' {' and '.join(missing)} (keyword arguments)")
        if "causal" in block_kwargs:
            raise TypeError("a language model's blocks are always causal; do not pass causal")
        if positions == "rope":
            if block_kwargs.get("attn_factory") is None:  # a factory's module has its own
                block_kwargs.setdefault("rope_theta", 10000.0)
        elif block_kwargs.get("rope_theta") is not None:
            raise ValueError(f"rope_theta={block_kwargs['rope_theta']!r} needs positions='rope', got {positions!r}")
        num_hiddens = check_positive_int("num_hiddens", block_kwargs.pop("num_hiddens"))
        num_heads = block_kwargs.pop("num_heads")
        self.block_kwargs = dict(num_hiddens=num_hiddens, num_heads=num_heads, **block_kwargs)
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_embedding = (nn.Parameter(torch.randn(context_len, num_hiddens) * 0.02)
                              if positions == "learned" else None)
        if positions == "sinusoidal":
            self.register_buffer("pos_encoding", sinusoidal_positions(context_len, num_hiddens), persistent=False)
        else:
            self.pos_encoding = None
        causal = {} if block_kwargs.get("attn_factory") is not None else {"causal": True}  # a factory's own
        self.blocks = nn.ModuleList(TransformerBlock(num_hiddens, num_heads, **causal, **block_kwargs)
                                    for _ in range(num_blocks))
        if any(_causal(block.attention) is not True for block in self.blocks):
            raise ValueError("a language model's attention must be causal: the module attn_factory returns "
                             "has causal=False, or no causal attribute")
        self.final_norm = (make_norm(self.blocks[0].norm, num_hiddens, block_kwargs.get("eps"))
                           if PLACEMENT_TABLE[self.blocks[0].placement].final_norm else None)
        self.head = nn.Linear(num_hiddens, vocab_size, bias=self.head_bias)

    @shown_in("ch09")
    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Next-token logits ``(b, n, vocab_size)`` for ids ``(b, n)`` (see the class docstring)."""
        # the positions already in the cache
        start = 0 if cache is None else self._check_cache(cache)
        self._check_tokens(tokens, start)
        X = self.embedding(tokens)
        if self.pos_embedding is not None:  # learned: one trained vector per position
            X = X + self.pos_embedding[start:start + tokens.shape[1]]
        if self.pos_encoding is not None:  # sinusoidal: the 2017 encoding
            X = X + self.pos_encoding[start:start + tokens.shape[1]]
        # RoPE, if any, is inside each block's attention
        for i, block in enumerate(self.blocks):
            X = block(X, cache=None if cache is None else cache.layers[i])
        if self.final_norm is not None:
            X = self.final_norm(X)
        return self.head(X)

    def _check_cache(self, cache) -> int:
        """The number of positions in ``cache``; raise unless it is a KVCache of one layer per block
        whose blocks' attention takes a cache."""
        check_instance("cache", cache, KVCache, "a d2lmini.KVCache (one LayerCache per block)")
        if len(cache.layers) != len(self.blocks):
            raise ValueError(f"cache has {len(cache.layers)} layers; this model has {len(self.blocks)} blocks")
        for i, block in enumerate(self.blocks):
            if "cache" not in inspect.signature(block.attention.forward).parameters:
                raise ValueError(f"block {i}'s {type(block.attention).__name__} takes no key/value cache: "
                                 "call the model without one (generate: use_cache=False)")
        return len(cache)

    def _check_tokens(self, tokens, start: int = 0) -> None:
        check_int_tensor("tokens", tokens)
        if tokens.dim() != 2 or tokens.shape[1] < 1:
            raise ValueError(f"tokens must have shape (batch, num_steps) with num_steps >= 1, got {tuple(tokens.shape)}")
        if start + tokens.shape[1] > self.context_len:
            raise ValueError(f"the model takes at most {self.context_arg}={self.context_len} positions, got "
                             f"{start + tokens.shape[1]}" + (f" ({start} cached + {tokens.shape[1]} new)" if start else ""))

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, context_len={self.context_len}, positions={self.positions!r}"


@shown_in("ch09")
def next_token(logits: torch.Tensor, do_sample: bool, temperature: float,
               top_k: int | None, generator: torch.Generator | None) -> torch.Tensor:
    """The next token of each row of ``logits`` (b, vocab): the most likely one, or a sample
    from ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely; returns (b,).

    Args:
        logits: ``(b, vocab)`` next-token logits.
        do_sample: sample (else the argmax); temperature: ``> 0``; top_k: ``None`` or ``1 .. vocab``;
        generator: the ``torch.Generator`` to sample with, or ``None`` (the global one).

    Raises:
        ValueError: logits that are not 2-D, ``temperature <= 0`` or ``top_k`` outside ``1 .. vocab``
            when sampling (:func:`generate` checks its arguments before every step).
    """
    if logits.dim() != 2:
        raise ValueError("logits must be (batch, vocab_size), "
                         f"got shape {tuple(logits.shape)}")
    vocab = logits.shape[-1]
    if do_sample and (temperature <= 0
                      or (top_k is not None and not 1 <= top_k <= vocab)):
        raise ValueError(f"sampling needs temperature > 0 and top_k in 1..{vocab}, "
                         f"got temperature={temperature}, top_k={top_k}")
    if not do_sample:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature  # in float32, as transformers' logits warpers
    # keep the k largest logits (ties with the k-th too), as TopKLogitsWarper does
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@shown_in("ch09")
@torch.no_grad()
def generate(model: LanguageModel, prompt: torch.Tensor, max_new_tokens: int, *,
             do_sample: bool = False, temperature: float = 1.0,
             top_k: int | None = None, seed: int | None = None,
             use_cache: bool = True) -> torch.Tensor:
    """Extend ``prompt`` by ``max_new_tokens`` tokens, one at a time.

    Greedy (the most likely token) unless ``do_sample``, which samples from the softmax of
    ``logits / temperature``, optionally over the ``top_k`` most likely tokens only (Fan et
    al., 2018). With ``use_cache`` each step feeds only the newest token and the blocks'
    :class:`~d2lmini.cache.KVCache` supplies the earlier keys and values; without it each step
    recomputes the whole sequence. Both give the same tokens (the logits agree to rounding).
    Past the model's context the window slides, as nanoGPT crops it: each step the model sees
    the last ``context_len`` tokens only (positions counted from the window's start), so the
    prompt and ``max_new_tokens`` may be as long as you like. Once the window slides, the
    cached keys and values no longer belong to the positions they were computed at, so the
    cached path then recomputes the window at every step, as the uncached one does.
    The model is put in eval mode for the call and restored after it.

    Args:
        model: a :class:`LanguageModel`.
        prompt: token ids, 1-D ``(n,)`` or 2-D ``(batch, n)``, ``n >= 1``, on any device (moved
            to the model's).
        max_new_tokens: how many tokens to add, ``>= 0`` (past ``model.context_len`` the window slides).
        do_sample, temperature, top_k: as Hugging Face ``generate``; ``temperature > 0`` and
            ``top_k`` in ``1 .. vocab_size`` are checked whenever given.
        seed: seeds the sampling (a ``torch.Generator`` of its own; the global random state is
            left alone); ``None`` draws from the global generator.
        use_cache: decode with the key/value cache (default) or by recomputing the prefix.

    Returns:
        The prompt with the new tokens appended: ``(n + max_new_tokens,)`` or
        ``(batch, n + max_new_tokens)``, as the prompt's shape, on the model's device.

    Raises:
        TypeError: a model that is not a :class:`LanguageModel`, a prompt that is not an integer
            tensor, or arguments of the wrong type.
        ValueError: a prompt that is empty, not 1-D or 2-D, or holding ids outside the vocabulary; ``max_new_tokens < 0``; ``top_k``
            outside ``1 .. vocab_size``; ``temperature <= 0``; ``use_cache=True`` with a block whose
            attention takes no cache (e.g. from an ``attn_factory``).
    """
    ids, generator = _check_generate(model, prompt, max_new_tokens, do_sample,
                                     temperature, top_k, seed, use_cache)
    was_training = model.training
    model.eval()
    context = model.context_len
    cache = KVCache(len(model.blocks)) if use_cache else None
    new = ids  # what the model has not seen yet: the prompt, then one token per step
    try:
        for _ in range(max_new_tokens):
            if cache is not None and len(cache) + new.shape[1] > context:
                # the window slides: refill it
                cache, new = KVCache(len(model.blocks)), ids[:, -context:]
            seen = new if use_cache else ids[:, -context:]  # no cache: the last window
            logits = model(seen, cache)[:, -1]
            token = next_token(logits, do_sample, temperature, top_k,
                               generator)[:, None]  # (b, 1)
            ids, new = torch.cat((ids, token), dim=1), token
    finally:
        model.train(was_training)
    return ids[0] if prompt.dim() == 1 else ids


def _check_generate(model, prompt, max_new_tokens, do_sample, temperature, top_k, seed, use_cache):
    """Check :func:`generate`'s arguments; return the prompt as (b, n) ids on the model's device, and the generator."""
    check_instance("model", model, LanguageModel, "a d2lmini.LanguageModel")
    check_int_tensor("prompt", prompt)
    if prompt.dim() not in (1, 2) or prompt.shape[-1] < 1 or prompt.dim() == 2 and prompt.shape[0] < 1:
        raise ValueError(f"prompt must be (n,) or (batch, n) with n >= 1 and batch >= 1, got shape {tuple(prompt.shape)}")
    max_new_tokens = check_nonnegative_int("max_new_tokens", max_new_tokens)
    check_bool("do_sample", do_sample)
    check_bool("use_cache", use_cache)
    check_positive_float("temperature", temperature)
    if top_k is not None and not 1 <= check_positive_int("top_k", top_k) <= model.vocab_size:
        raise ValueError(f"top_k must be in 1..vocab_size={model.vocab_size}, got {top_k}")
    if use_cache:
        model._check_cache(KVCache(len(model.blocks)))  # every block's attention must take a cache
    device = next(model.parameters()).device
    ids = (prompt[None] if prompt.dim() == 1 else prompt).to(device=device, dtype=torch.long)
    model._check_tokens(ids[:, -model.context_len:])
    if int(ids.min()) < 0 or int(ids.max()) >= model.vocab_size:
        raise ValueError(f"prompt's token ids must be in [0, vocab_size={model.vocab_size}), got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    generator = None if seed is None else torch.Generator(device=device).manual_seed(check_seed(seed))
    return ids, generator


def _causal(attention) -> bool | None:
    """An attention module's ``causal`` flag (a gated attention's inner one), or ``None`` if it has none."""
    if hasattr(attention, "causal"):
        return attention.causal
    return getattr(getattr(attention, "attention", None), "causal", None)


__all__ = ["POSITIONS", "LanguageModel", "generate", "next_token", "sinusoidal_positions"]
