"""A tiny character-level language model and the loop that trains it.

Introduced in the chapter "Where the norm goes" (the warm-up demo); the chapters on
residual connections and on the feed-forward network train the same model with
other flags. Deterministic for a given seed: the weights, the batches and the
order of updates all come from it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import check_choice, check_positive_float, check_positive_int
from .block import TransformerBlock
from .data import CharCorpus
from .norms import make_norm


class TinyLM(nn.Module):
    """Decoder-only character language model built from :class:`TransformerBlock`.

    Token embedding (plus learned position embeddings, unless the blocks use
    RoPE), ``num_layers`` causal blocks, one final norm (except for post-LN, whose
    stream is already normalized) and a linear head to next-character logits.

    Args:
        vocab_size: number of distinct tokens.
        num_hiddens, num_heads, num_layers: width ``d``, heads, depth ``L``.
        max_len: longest sequence the learned positions cover.
        **block_kwargs: passed to every :class:`TransformerBlock` (``norm``, ``act``,
            ``placement``, ``rope_theta``, ``residual``, ...); ``causal`` is always True.

    Shape:
        ``forward(tokens)``: ``(b, n)`` integer ids with ``n <= max_len``; returns
        logits ``(b, n, vocab_size)``.

    Raises:
        ValueError / TypeError: for invalid sizes or block arguments; at call time
            for sequences longer than ``max_len``.
    """

    def __init__(self, vocab_size: int, num_hiddens: int = 64, *, num_heads: int = 4, num_layers: int = 4,
                 max_len: int = 256, **block_kwargs):
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.max_len = check_positive_int("max_len", max_len)
        check_positive_int("num_layers", num_layers)
        if "causal" in block_kwargs:
            raise TypeError("TinyLM's blocks are always causal; do not pass causal")
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_embedding = (None if block_kwargs.get("rope_theta") is not None
                              else nn.Parameter(torch.randn(max_len, num_hiddens) * 0.02))
        self.blocks = nn.ModuleList(TransformerBlock(num_hiddens, num_heads, causal=True, **block_kwargs)
                                    for _ in range(num_layers))
        placement = self.blocks[0].placement
        self.final_norm = None if placement == "post" else make_norm(self.blocks[0].norm, num_hiddens,
                                                                      block_kwargs.get("eps"))
        self.head = nn.Linear(num_hiddens, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``(b, n, vocab_size)`` for token ids ``(b, n)``."""
        if tokens.dim() != 2 or tokens.shape[1] > self.max_len:
            raise ValueError(f"tokens must have shape (batch, num_steps <= {self.max_len}), got {tuple(tokens.shape)}")
        X = self.embedding(tokens)
        if self.pos_embedding is not None:
            X = X + self.pos_embedding[: tokens.shape[1]]
        for block in self.blocks:
            X = block(X)
        if self.final_norm is not None:
            X = self.final_norm(X)
        return self.head(X)


def moving_average(values, window: int = 20) -> list[float]:
    """Mean of the last ``window`` values (fewer at the start) at every position.

    Raises:
        ValueError / TypeError: if ``window`` is not a positive int.
    """
    window = check_positive_int("window", window)
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


@dataclass
class TrainResult:
    """Losses of one :func:`train_lm` run.

    Attributes:
        config: the arguments of the run.
        train_loss: mean cross-entropy (nats per character) of every step's batch.
        val_steps, val_loss: steps at which the validation loss was measured, and its values.
        lr: the learning rate used at every step.
        diverged: whether a loss became NaN or infinite (training then stopped).
        seconds: wall time of the run.
    """

    config: dict
    train_loss: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    diverged: bool = False
    seconds: float = 0.0

    def smoothed(self, window: int = 20) -> list[float]:
        """Training loss averaged over the last ``window`` steps at every step."""
        return moving_average(self.train_loss, window)


def lr_at(step: int, lr: float, warmup_steps: int, num_steps: int, schedule: str) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up over ``warmup_steps``, then
    constant (``'constant'``) or cosine decay to 10% at ``num_steps`` (``'cosine'``)."""
    if warmup_steps and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    progress = (step - warmup_steps) / max(1, num_steps - warmup_steps)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: nn.Module, corpus: CharCorpus, batch_size: int, num_steps: int, num_batches: int,
             seed: int = 1234) -> float:
    """Mean validation cross-entropy over ``num_batches`` fixed random windows (nats per character)."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    total = 0.0
    for _ in range(num_batches):
        X, Y = corpus.random_batch(batch_size, num_steps, gen, split="val")
        logits = model(X.to(device))
        total += float(F.cross_entropy(logits.flatten(0, 1), Y.to(device).flatten()))
    model.train(was_training)
    return total / num_batches


def train_lm(corpus: CharCorpus, num_steps: int = 300, batch_size: int = 32, seq_len: int = 64,
             lr: float = 1e-3, warmup_steps: int = 0, schedule: str = "constant",
             betas: tuple[float, float] = (0.9, 0.98), weight_decay: float = 0.0,
             eval_every: int = 100, eval_batches: int = 8, seed: int = 0, device: str = "cpu",
             **model_kwargs) -> TrainResult:
    """Train a :class:`TinyLM` on ``corpus`` with Adam(W) and return its loss curves.

    Every step draws a random batch of windows (from a generator seeded with
    ``seed``), computes the next-character cross-entropy and takes one AdamW step
    at the scheduled learning rate (:func:`lr_at`). The model's weights are
    initialized from ``seed`` too, so two runs with the same arguments give the
    same losses.

    Args:
        corpus: the data (see :func:`d2lmini.data.python_reference_corpus`).
        num_steps: optimizer steps.
        batch_size, seq_len: windows per batch and characters per window.
        lr: peak learning rate; warmup_steps: linear warm-up length (0 = none);
        schedule: ``'constant'`` or ``'cosine'`` after the warm-up.
        betas, weight_decay: AdamW's (the 2017 Transformer used betas (0.9, 0.98)).
        eval_every, eval_batches: validation every so many steps (and at the end),
            on so many fixed batches.
        seed: seeds weights and batches.
        device: where to train.
        **model_kwargs: passed to :class:`TinyLM` (``num_hiddens``, ``num_layers``,
            ``norm``, ``act``, ``placement``, ...).

    Returns:
        :class:`TrainResult`. If a loss becomes NaN or infinite, training stops
        and ``diverged`` is True.

    Raises:
        ValueError / TypeError: for invalid arguments.
    """
    num_steps = check_positive_int("num_steps", num_steps)
    check_positive_float("lr", lr)
    check_choice("schedule", schedule, ("constant", "cosine"))
    if not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
    config = dict(num_steps=num_steps, batch_size=batch_size, seq_len=seq_len, lr=lr, warmup_steps=warmup_steps,
                  schedule=schedule, betas=betas, weight_decay=weight_decay, seed=seed, **model_kwargs)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLM(corpus.vocab_size, max_len=max(seq_len, model_kwargs.pop("max_len", seq_len)),
                       **model_kwargs).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    result = TrainResult(config)
    model.train()
    for step in range(num_steps):
        step_lr = lr_at(step, lr, warmup_steps, num_steps, schedule)
        for group in optimizer.param_groups:
            group["lr"] = step_lr
        X, Y = corpus.random_batch(batch_size, seq_len, gen)
        logits = model(X.to(device))
        loss = F.cross_entropy(logits.flatten(0, 1), Y.to(device).flatten())
        value = float(loss.detach())
        result.train_loss.append(value)
        result.lr.append(step_lr)
        if not math.isfinite(value):
            result.diverged = True
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % eval_every == 0 or step + 1 == num_steps:
            result.val_steps.append(step + 1)
            result.val_loss.append(evaluate(model, corpus, batch_size, seq_len, eval_batches))
    result.seconds = time.perf_counter() - start
    return result


