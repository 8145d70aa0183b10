"""A tiny character-level language model and the one loop that trains it.

Introduced in the chapter "Where the norm goes" (the warm-up demo); the chapters on
residual connections, QK-norm and the feed-forward network train the same model with
other flags. Every experiment goes through :func:`train_models`, which trains one
model or several in lockstep and calls a hook after every step: validation, the
attention-logit probe of the QK-norm chapter and the seed ensembles of the FFN
chapter are all built on it (:func:`train_lm` is the one-model case). Deterministic
for a given seed: the weights, the batches and the order of updates all come from it.
"""

from __future__ import annotations

import copy
import math
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import (check_bool, check_callable, check_choice, check_instance, check_nonnegative_int,
                      check_positive_float, check_positive_floats, check_positive_int, check_seed)
from ._shown import shown_in
from .data import CharCorpus
from .lm import LanguageModel
from .seeding import seeded


class TinyLM(LanguageModel):
    """The character language model of the early chapters: a :class:`~d2lmini.lm.LanguageModel`
    whose head has a bias and whose positions are learned unless the blocks use RoPE.

    Args:
        vocab_size: number of distinct tokens.
        num_hiddens, num_heads, num_layers: width ``d``, heads, depth ``L``.
        max_len: the context length (the longest sequence the learned positions cover).
        **block_kwargs: passed to every :class:`TransformerBlock` (``norm``, ``act``,
            ``placement``, ``rope_theta``, ``residual``, ...); ``causal`` is always True.

    Shape:
        ``forward(tokens)``: ``(b, n)`` integer ids with ``n <= max_len``; returns
        logits ``(b, n, vocab_size)``.

    Raises:
        ValueError / TypeError: as :class:`~d2lmini.lm.LanguageModel`.
    """

    head_bias = True
    context_arg = "max_len"

    def __init__(self, vocab_size: int, num_hiddens: int = 64, *, num_heads: int = 4, num_layers: int = 4,
                 max_len: int = 256, **block_kwargs):
        positions = "learned" if block_kwargs.get("rope_theta") is None else "rope"
        super().__init__(vocab_size, num_layers, max_len, positions=positions, num_hiddens=num_hiddens,
                         num_heads=num_heads, **block_kwargs)

    @property
    def max_len(self) -> int:
        """The context length."""
        return self.context_len


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


#: The book's training recipe, the settings of :func:`train_models` that every training chapter
#: starts from (chosen for loss per CPU-second on a 2-core machine): batches of 32 windows of 64
#: characters (2,048 tokens a step, enough that a step of a width-64 model is arithmetic rather
#: than per-operation overhead), AdamW with betas (0.9, 0.95) and no weight decay, a linear warm-up
#: over 50 steps, cosine decay to a tenth of the peak rate, and every model's gradient clipped to
#: norm 1. The peak rate is each chapter's own (it sweeps it).
RECIPE = dict(batch_size=32, seq_len=64, warmup_steps=50, schedule="cosine", betas=(0.9, 0.95),
              weight_decay=0.0, clip_norm=1.0)

#: The model the recipe is sized for: 4 blocks of width 64 with 4 heads (a pre-LN 2026 block of
#: this size reaches about 1.3 nats per character in 800 steps, a CPU-minute of one thread).
RECIPE_MODEL = dict(num_hiddens=64, num_heads=4, num_layers=4)


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


@shown_in("ch04")
def lr_at(step: int, lr: float, warmup_steps: int, num_steps: int,
          schedule: str) -> float:
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


@torch.no_grad()
def validation_loss(model: nn.Module, corpus: CharCorpus, seq_len: int, batch_size: int = 64) -> float:
    """Mean next-character cross-entropy over the whole validation split (nats per character).

    The split is cut into consecutive windows of ``seq_len + 1`` characters (the last, shorter
    remainder is left out); each window's ``seq_len`` predictions count once. Unlike
    :func:`evaluate`'s random windows this reads every held-out character, so two models are
    compared on exactly the same text, and its own sampling noise is small.

    Raises:
        ValueError / TypeError: sizes that are not positive ints, or windows longer than the split.
    """
    seq_len, batch_size = check_positive_int("seq_len", seq_len), check_positive_int("batch_size", batch_size)
    num_windows = (len(corpus.val) - 1) // seq_len
    if num_windows < 1:
        raise ValueError(f"seq_len={seq_len} is longer than the validation split ({len(corpus.val)} characters)")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    starts = torch.arange(num_windows) * seq_len
    offsets = torch.arange(seq_len + 1)
    total = 0.0
    for i in range(0, num_windows, batch_size):
        windows = corpus.val[starts[i:i + batch_size, None] + offsets[None, :]].to(device)
        logits = model(windows[:, :-1])
        total += float(F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten(), reduction="sum"))
    model.train(was_training)
    return total / (num_windows * seq_len)


#: The per-step hook of :func:`train_models`: ``on_step(step, models, losses)`` with the
#: 0-based step index, the models and their losses on that step's batches.
StepHook = Callable[[int, list[nn.Module], list[float]], None]

# Seeding goes through the global RNG, which threads share: threads that build models take turns.
_SEEDING_LOCK = threading.Lock()

# vmap has no batching rule for the CPU flash-attention kernel; PyTorch then loops over
# the models for that one op (correct, and cheap for a few models) and warns about it.
_SDPA_FALLBACK_WARNING = "There is a performance drop because we have not yet implemented the batching rule"


def seeded_tiny_lm(vocab_size: int, seed: int, **model_kwargs) -> TinyLM:
    """The :class:`TinyLM` whose initial weights are drawn from ``seed`` -- those :func:`train_lm` trains.

    The weights come from the global RNG seeded with ``seed`` inside :func:`d2lmini.seeding.seeded`,
    so the caller's random state is left as it was (and threads take turns).

    Args:
        vocab_size: number of distinct tokens.
        seed: seeds the weights.
        **model_kwargs: passed to :class:`TinyLM` (``num_hiddens``, ``max_len``, ``norm``, ...).

    Raises:
        ValueError / TypeError: for a seed that is not an int, or arguments ``TinyLM`` rejects.
    """
    with _SEEDING_LOCK, seeded(seed):
        return TinyLM(vocab_size, **model_kwargs)


def lockstep_losses(models: list[nn.Module], vectorize: bool = False):
    """A function from one ``(X, Y)`` batch per model to the models' losses.

    The returned ``losses_of(batches)`` takes a list of ``(X, Y)`` pairs of token ids
    ``(b, n)``, one per model, and returns the next-token cross-entropy of each model on
    its own batch, a tensor of shape ``(len(models),)`` through which gradients flow back
    to every model's own weights.

    Args:
        models: language models of the same architecture (logits ``(b, n, vocab)``).
        vectorize: instead of a Python loop over the models, stack their weights along a
            new leading dimension and run one forward pass of ``models[0]``'s architecture
            vectorized over it (``torch.vmap`` over ``torch.func.functional_call``): one
            kernel launch serves every model, the fast choice on a GPU. The weights are
            stacked anew at every call, so they are always the models' current ones.

    Raises:
        TypeError: if ``vectorize`` is not a bool.
        ValueError: with ``vectorize``, if the models differ in class, in their printed structure
            (``repr``) or in their parameters' and buffers' names and shapes (one forward pass of
            ``models[0]``'s architecture serves all).
    """
    if not check_bool("vectorize", vectorize):
        def losses_of(batches):
            return torch.stack([F.cross_entropy(model(X).flatten(0, 1), Y.flatten())
                                for model, (X, Y) in zip(models, batches)])
        return losses_of

    shapes = [{name: tuple(t.shape) for name, t in [*model.named_parameters(), *model.named_buffers()]}
              for model in models]
    for i, shape in enumerate(shapes[1:], 1):
        if shape != shapes[0] or type(models[i]) is not type(models[0]) or repr(models[i]) != repr(models[0]):
            raise ValueError(f"vectorize=True runs models[0]'s architecture for every model, but models[{i}] is "
                             f"built differently (its class, its printed structure or its parameters differ); "
                             f"train models of different architectures with vectorize=False or in separate calls")
    skeleton = copy.deepcopy(models[0]).to("meta")  # the architecture, no storage
    weights = [dict(model.named_parameters()) | dict(model.named_buffers()) for model in models]

    def member_loss(weights, X, Y):
        logits = torch.func.functional_call(skeleton, weights, (X,))
        return F.cross_entropy(logits.flatten(0, 1), Y.flatten())

    vectorized = torch.vmap(member_loss)

    def losses_of(batches):
        stacked = {name: torch.stack([w[name] for w in weights]) for name in weights[0]}
        Xs, Ys = zip(*batches)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SDPA_FALLBACK_WARNING)
            return vectorized(stacked, torch.stack(Xs), torch.stack(Ys))
    return losses_of


@shown_in("ch02", "ch07")
def train_step(losses_of, optimizer, batches, lr: float,
               stop_on_divergence: bool = True,
               clip_norm: float | None = None) -> list[float]:
    """One training step of :func:`train_models`: score every model's batch, then one AdamW update.

    ``losses_of`` comes from :func:`lockstep_losses`, ``batches`` holds one ``(X, Y)``
    pair of token ids ``(b, n)`` per model and ``lr`` is this step's learning rate (a
    parameter group with an ``"lr_scale"`` entry trains at that multiple of it). With
    ``clip_norm``, each parameter group's gradient (one group per model) is scaled down
    to that global norm if it is longer. Returns the models' losses (nats per character),
    measured before the update. If every loss is NaN or infinite and ``stop_on_divergence``
    is True, no update is taken.
    """
    # each model's next-character cross-entropy on its own batch
    losses = losses_of(batches)
    values = losses.detach().tolist()
    if any(math.isfinite(value) for value in values) or not stop_on_divergence:
        for group in optimizer.param_groups:
            # the scheduled rate (times the group's scale)
            group["lr"] = lr * group.get("lr_scale", 1.0)
        optimizer.zero_grad(set_to_none=True)
        # the models share no weights: each gets its own gradient
        losses.sum().backward()
        if clip_norm is not None:  # each model's gradient clipped to its own norm
            for group in optimizer.param_groups:
                nn.utils.clip_grad_norm_(group["params"], clip_norm, foreach=True)
        optimizer.step()  # AdamW
    return values


@dataclass
class TrainLog:
    """What :func:`train_models` records.

    Attributes:
        losses: ``[model][step]`` cross-entropy (nats per character) of each step's
            training batch, measured before that step's update.
        lr: the learning rate of every step.
        diverged: whether at some step every model's loss was NaN or infinite.
        seconds: wall time of the training steps alone (no set-up, no time spent in the hook).
    """

    losses: list[list[float]]
    lr: list[float] = field(default_factory=list)
    diverged: bool = False
    seconds: float = 0.0


def train_models(models: list[nn.Module], corpus: CharCorpus, seeds, num_steps: int, batch_size: int = 32,
                 seq_len: int = 64, lr: float = 1e-3, warmup_steps: int = 0, schedule: str = "constant",
                 betas: tuple[float, float] = (0.9, 0.98), weight_decay: float = 0.0, vectorize: bool = False,
                 stop_on_divergence: bool = True, on_step: StepHook | None = None, lr_scales=None,
                 clip_norm: float | None = None) -> TrainLog:
    """Train one or several language models in lockstep with AdamW: the book's one training loop.

    At every step, model ``i`` draws a random batch of windows from its own generator
    (seeded with ``seeds[i]``) and computes its next-character cross-entropy; then one
    AdamW step at the scheduled learning rate (:func:`lr_at`) updates every model. The
    models share no weights, so the gradient of the summed losses is each model's own
    gradient, and AdamW acts on every number separately, so one multi-tensor
    (``foreach``) update of all of them equals one optimizer per model -- training
    several seeds together gives each the losses it gets alone.

    After every step, ``on_step(step, models, losses)`` is called with the 0-based
    step index, the models (already updated) and the list of their losses on this
    step's batches (before the update): what a probe, a validation or a plot needs.
    If every model's loss is NaN or infinite, ``diverged`` becomes True and (unless
    ``stop_on_divergence`` is False) that step takes no update; the hook is still
    called, then training stops.

    Args:
        models: :class:`TinyLM` or any modules mapping token ids ``(b, n)`` to logits
            ``(b, n, vocab)``, all on the same device; with ``vectorize`` of one architecture.
        corpus: the data (see :func:`d2lmini.data.python_reference_corpus`).
        seeds: one int per model, seeding that model's batches.
        num_steps: optimizer steps.
        batch_size, seq_len: windows per batch and characters per window.
        lr: peak learning rate; warmup_steps: linear warm-up length (0 = none);
        schedule: ``'constant'`` or ``'cosine'`` (to 10% at ``num_steps``) after the warm-up.
        betas, weight_decay: AdamW's (the 2017 Transformer used betas (0.9, 0.98)).
        vectorize: compute the losses with ``torch.vmap`` (see :func:`lockstep_losses`).
        stop_on_divergence: False trains all ``num_steps`` whatever the losses (a model
            that diverged keeps recording NaN), so that every list has the same length.
        on_step: the hook, or None.
        lr_scales: None (every model at the scheduled rate), or one positive float per
            model: model ``i`` then trains at ``lr_scales[i]`` times the scheduled rate
            (one AdamW parameter group per model), which is what it gets alone with peak
            rate ``lr * lr_scales[i]`` (up to the rounding of that product; exactly for a
            power-of-two scale) -- a learning-rate sweep in one lockstep. ``TrainLog.lr``
            records the unscaled rate.
        clip_norm: None (no clipping), or a positive float: before every update each model's
            gradient is scaled down to this global norm if it is longer
            (``torch.nn.utils.clip_grad_norm_`` over that model's parameters alone, so a model
            clips as it would alone).

    Returns:
        A :class:`TrainLog`.

    Raises:
        ValueError / TypeError: for invalid arguments, e.g. not one seed per model.
    """
    if not isinstance(models, (list, tuple)) or not all(isinstance(model, nn.Module) for model in models):
        raise TypeError(f"models must be a list of torch.nn.Module (for one model: [model]), "
                        f"got {type(models).__name__}")
    if not isinstance(seeds, (list, tuple)):
        raise TypeError(f"seeds must be a list of ints, one per model, got {type(seeds).__name__} {seeds!r}")
    if not models or len(seeds) != len(models):
        raise ValueError(f"models and seeds must be non-empty and of equal length (one seed per model), "
                         f"got {len(models)} models and {len(seeds)} seeds")
    seeds = [check_seed(seed) for seed in seeds]
    num_steps = check_positive_int("num_steps", num_steps)
    batch_size, seq_len = check_positive_int("batch_size", batch_size), check_positive_int("seq_len", seq_len)
    check_positive_float("lr", lr)
    warmup_steps = check_nonnegative_int("warmup_steps", warmup_steps)
    check_choice("schedule", schedule, ("constant", "cosine"))
    check_bool("stop_on_divergence", stop_on_divergence)
    if on_step is not None:
        check_callable("on_step", on_step)
    if clip_norm is not None:
        clip_norm = check_positive_float("clip_norm", clip_norm)
    if lr_scales is None:
        lr_scales = [1.0] * len(models)
    lr_scales = check_positive_floats("lr_scales", lr_scales)
    if len(lr_scales) != len(models):
        raise ValueError(f"lr_scales must hold one scale per model, got {len(lr_scales)} scales "
                         f"for {len(models)} models")
    parameters = [{"params": list(model.parameters()), "lr_scale": scale}  # one group per model
                  for model, scale in zip(models, lr_scales)]
    losses_of = lockstep_losses(models, vectorize)
    device = next(models[0].parameters()).device
    optimizer = torch.optim.AdamW(parameters, lr=lr, betas=betas, weight_decay=weight_decay, foreach=True)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]  # one batch stream per model
    step_flops = batch_size * seq_len * sum(flops_per_token(model, seq_len) for model in models)
    embedding = getattr(models[0], "embedding", None)
    shape = (batch_size * seq_len, getattr(embedding, "embedding_dim", None))  # tokens a step, width
    log = TrainLog([[] for _ in models])
    for model in models:
        model.train()
    for step in range(num_steps):
        tick, cpu = time.perf_counter(), time.thread_time()
        step_lr = lr_at(step, lr, warmup_steps, num_steps, schedule)
        batches = [corpus.random_batch(batch_size, seq_len, gen) for gen in generators]
        values = train_step(losses_of, optimizer, [(X.to(device), Y.to(device)) for X, Y in batches], step_lr,
                            stop_on_divergence, clip_norm)
        for history, value in zip(log.losses, values):
            history.append(value)
        log.lr.append(step_lr)
        if not any(math.isfinite(value) for value in values):
            log.diverged = True
        stop = log.diverged and stop_on_divergence
        log.seconds += time.perf_counter() - tick
        _add_to_tally(step_flops, time.thread_time() - cpu, shape)
        if on_step is not None:
            on_step(step, models, values)
        if stop:
            break
    return log


#: What :func:`train_models` has trained in this process (and, through :func:`run_in_workers`, in
#: its workers): model FLOPs and the CPU seconds of the training steps, in all and per step shape
#: (tokens a step, model width).
_TALLY = {"flops": 0.0, "cpu_seconds": 0.0, "shapes": {}}


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs per token of ``model`` on windows of ``seq_len`` tokens: ``6 N + 12 L n d``.

    ``6 N`` is the forward and backward pass's FLOPs (3 multiply-adds of 2 FLOPs each per weight)
    over the ``N`` weights that multiply (Kaplan et al. 2020, Section 2.1; their Table 1 gives the
    forward pass's ``2 N``): every parameter but the tables a token or a position only looks up
    (``embedding``, unless the head shares it, and learned ``pos_embedding``); the output head is
    counted. ``12 L n d`` is attention's ``Q K^T`` and ``A V`` in ``L`` blocks of width ``d``,
    forward and backward, counted in full although the mask is causal (Chowdhery et al. 2022,
    appendix B). A model without ``blocks`` and ``embedding`` attributes is counted by ``6 N``
    over all its parameters.

    Raises:
        TypeError / ValueError: ``model`` not a module, ``seq_len`` not a positive int.
    """
    check_instance("model", model, nn.Module, "a torch.nn.Module")
    seq_len = check_positive_int("seq_len", seq_len)
    blocks, embedding = getattr(model, "blocks", None), getattr(model, "embedding", None)
    head = getattr(model, "head", None)
    lookups = {id(p) for p in (getattr(embedding, "weight", None), getattr(model, "pos_embedding", None))
               if isinstance(p, torch.Tensor)}
    lookups.discard(id(getattr(head, "weight", None)))
    N = sum(p.numel() for p in model.parameters() if id(p) not in lookups)
    attention = 12 * len(blocks) * seq_len * embedding.embedding_dim if blocks is not None and embedding is not None else 0
    return 6.0 * N + attention


def training_tally() -> dict:
    """What :func:`train_models` has trained so far in this process, its workers' jobs included:
    ``'flops'``, the model FLOPs (see :func:`flops_per_token`); ``'cpu_seconds'``, the CPU time of the
    steps (of the thread that trains: the book trains on one torch thread); ``'shapes'``, the same two
    per ``(tokens a step, width)`` of the models trained, ``{shape: [flops, cpu_seconds]}``. A chapter
    or a benchmark reads it before and after an experiment to state what it cost."""
    return {"flops": _TALLY["flops"], "cpu_seconds": _TALLY["cpu_seconds"],
            "shapes": {shape: list(value) for shape, value in _TALLY["shapes"].items()}}


def _add_to_tally(flops: float, cpu_seconds: float, shape: tuple) -> None:
    _TALLY["flops"] += flops
    _TALLY["cpu_seconds"] += cpu_seconds
    entry = _TALLY["shapes"].setdefault(shape, [0.0, 0.0])
    entry[0] += flops
    entry[1] += cpu_seconds


def _run_and_tally(function: Callable, job: dict):
    """A worker's job: ``function(**job)``, and what its training added to the tally."""
    before = training_tally()
    result = function(**job)
    after = training_tally()
    return result, {shape: [flops - before["shapes"].get(shape, [0.0, 0.0])[0],
                            cpu - before["shapes"].get(shape, [0.0, 0.0])[1]]
                    for shape, (flops, cpu) in after["shapes"].items()}


def _one_thread() -> None:
    """A worker's start: one torch thread, as the book's kernels (the numbers do not depend on it)."""
    torch.set_num_threads(1)


def _worker_context():
    """The start method of :func:`run_in_workers`' processes: a fork server that imports torch (with
    ``torch._dynamo``, which an optimizer's first construction imports), ``d2lmini.train`` and
    ``d2lmini.plot`` (matplotlib, which every chapter module imports) once, so that each worker starts
    in a fraction of a second instead of importing them again; ``spawn`` where the platform has no
    fork server (Windows). Either way a worker is a fresh process that shares no state with the caller."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch._dynamo", "d2lmini.train", "d2lmini.plot"])
    return context


def run_in_workers(function: Callable, jobs, num_workers: int = 2) -> list:
    """``[function(**job) for job in jobs]``, the jobs spread over ``num_workers`` processes.

    Each worker is a fresh Python process (forked from a server that has imported torch, or spawned
    where there is none: it works in Jupyter, Colab and scripts alike) running one torch thread; the
    results come back in the order of ``jobs``. A job must
    draw all its randomness from its own seeds (as :func:`seeded_tiny_lm` and
    :func:`train_models` do), so every result is the same whatever ``num_workers``: with
    ``num_workers=1`` the jobs run here, one after another, on one torch thread (the thread count
    is restored afterwards). ``function`` must be importable by name (a module's top-level
    function, not one defined in a notebook), and its arguments and results picklable (tensors,
    modules, dataclasses). In a script, call it under ``if __name__ == "__main__":``: a spawned
    worker imports the script's main module again.

    Training runs of different architectures cannot share one vectorized lockstep; two such
    groups in two workers keep both cores of a 2-core machine busy.

    Args:
        function: called as ``function(**job)``.
        jobs: a list of dicts of keyword arguments.
        num_workers: processes to use, ``>= 1`` (never more than there are jobs).

    Returns:
        The list of results, ``results[i] = function(**jobs[i])``.

    Raises:
        TypeError: ``function`` not callable, ``jobs`` not a list of dicts, ``num_workers`` not an int.
        ValueError: ``num_workers < 1``. An exception raised by a job is raised again here.
    """
    check_callable("function", function)
    if not isinstance(jobs, (list, tuple)) or not all(isinstance(job, dict) for job in jobs):
        raise TypeError(f"jobs must be a list of dicts of keyword arguments, got {type(jobs).__name__}")
    num_workers = min(check_positive_int("num_workers", num_workers), max(1, len(jobs)))
    if num_workers == 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return [function(**job) for job in jobs]
        finally:
            torch.set_num_threads(threads)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(num_workers, mp_context=_worker_context(),
                             initializer=_one_thread) as pool:
        futures = [pool.submit(_run_and_tally, function, job) for job in jobs]
        results = []
        for future in futures:
            result, shapes = future.result()
            for shape, (flops, cpu_seconds) in shapes.items():
                _add_to_tally(flops, cpu_seconds, shape)
            results.append(result)
        return results


@shown_in("ch05")
def train_and_evaluate(corpus: CharCorpus, seeds, model_kwargs, num_steps: int,
                       batch_size: int, seq_len: int, lr: float, warmup_steps: int = 0,
                       schedule: str = "constant", eval_batches: int = 8,
                       betas: tuple[float, float] = (0.9, 0.98),
                       clip_norm: float | None = None) -> tuple[TrainLog, list[float]]:
    """Train one seeded :class:`TinyLM` per ``(seed, model_kwargs)`` pair in lockstep; score each at the end.

    Model ``i`` is :func:`seeded_tiny_lm` of ``seeds[i]`` with ``model_kwargs[i]`` and reads
    the batches of ``seeds[i]``, so it is what :func:`train_lm` trains with that seed; all
    train in one :func:`train_models` call (a diverged model keeps recording NaN while the
    others train on). After the last step each model is scored by :func:`evaluate` on the
    held-out batches ``train_lm`` uses (NaN for a diverged model). ``betas`` and ``clip_norm``
    are :func:`train_models`'s.

    Returns:
        The :class:`TrainLog` and one final validation loss per model.

    Raises:
        ValueError / TypeError: for invalid arguments (each names the argument).
    """
    seq_len = check_positive_int("seq_len", seq_len)  # also the models' max_len
    eval_batches = check_positive_int("eval_batches", eval_batches)
    models = [seeded_tiny_lm(corpus.vocab_size, seed, max_len=seq_len, **kwargs)
              for seed, kwargs in zip(seeds, model_kwargs, strict=True)]
    log = train_models(models, corpus, list(seeds), num_steps, batch_size, seq_len, lr,
                       warmup_steps, schedule, betas, stop_on_divergence=False,
                       clip_norm=clip_norm)
    val = [evaluate(model, corpus, batch_size, seq_len, eval_batches)
           if all(math.isfinite(value) for value in losses) else math.nan
           for model, losses in zip(models, log.losses)]
    return log, val


def train_lm(corpus: CharCorpus, num_steps: int = 300, batch_size: int = 32, seq_len: int = 64,
             lr: float = 1e-3, warmup_steps: int = 0, schedule: str = "constant",
             betas: tuple[float, float] = (0.9, 0.98), weight_decay: float = 0.0,
             eval_every: int = 100, eval_batches: int = 8, seed: int = 0, device: str = "cpu",
             on_step: StepHook | None = None, clip_norm: float | None = None, **model_kwargs) -> TrainResult:
    """Train a :class:`TinyLM` on ``corpus`` with AdamW and return its loss curves.

    :func:`train_models` with one model: every step draws a random batch of windows
    (from a generator seeded with ``seed``), computes the next-character cross-entropy
    and takes one AdamW step at the scheduled learning rate (:func:`lr_at`). The
    model's weights are initialized from ``seed`` too (:func:`seeded_tiny_lm`), so two
    runs with the same arguments give the same losses. The validation is itself a
    hook: every ``eval_every`` steps and after the last one it scores the model with
    :func:`evaluate`.

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
        on_step: called after every step as ``on_step(step, [model], [loss])`` (after
            that step's validation, if any); see :func:`train_models`.
        clip_norm: clip the gradient to this global norm (None: no clipping).
        **model_kwargs: passed to :class:`TinyLM` (``num_hiddens``, ``num_layers``,
            ``norm``, ``act``, ``placement``, ...).

    Returns:
        :class:`TrainResult`. If the loss becomes NaN or infinite, training stops
        and ``diverged`` is True.

    Raises:
        ValueError / TypeError: for invalid arguments.
    """
    seq_len = check_positive_int("seq_len", seq_len)  # also the model's max_len
    eval_every = check_positive_int("eval_every", eval_every)
    if on_step is not None:
        check_callable("on_step", on_step)
    config = dict(num_steps=num_steps, batch_size=batch_size, seq_len=seq_len, lr=lr, warmup_steps=warmup_steps,
                  schedule=schedule, betas=betas, weight_decay=weight_decay, seed=seed, clip_norm=clip_norm,
                  **model_kwargs)
    start = time.perf_counter()
    model = seeded_tiny_lm(corpus.vocab_size, seed, max_len=max(seq_len, model_kwargs.pop("max_len", seq_len)),
                           **model_kwargs).to(device)
    result = TrainResult(config)

    def validate(step, models, losses):
        if math.isfinite(losses[0]) and ((step + 1) % eval_every == 0 or step + 1 == num_steps):
            result.val_steps.append(step + 1)
            result.val_loss.append(evaluate(model, corpus, batch_size, seq_len, eval_batches))
        if on_step is not None:
            on_step(step, models, losses)

    log = train_models([model], corpus, [seed], num_steps, batch_size, seq_len, lr, warmup_steps, schedule,
                       betas, weight_decay, on_step=validate, clip_norm=clip_norm)
    result.train_loss, result.lr, result.diverged = log.losses[0], log.lr, log.diverged
    result.seconds = time.perf_counter() - start
    return result
