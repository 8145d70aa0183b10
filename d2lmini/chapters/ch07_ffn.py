"""Experiments of the chapter "The feed-forward network: SwiGLU, then a mixture of experts".

* :func:`ffn_parameter_counts` -- the parameter budget of every FFN variant of
  :class:`~d2lmini.ffn.FeedForward`: a plain MLP of width ``4d`` and a gated one of
  width ``8d/3`` both cost ``8 d^2`` weights (Shazeer, 2020).
* :func:`ffn_as_memories` -- the key-value-memory reading of the FFN (Geva et al.,
  2021): ``W_2 act(W_1 x)`` is a sum of value vectors weighted by how well ``x``
  matches each key.
* :func:`lr_sweep` -- both FFNs at every peak learning rate of :data:`SWEEP_RATES`,
  one seed, all models in one lockstep (``lr_scales`` of :func:`d2lmini.train.train_models`).
* :func:`ffn_comparison` -- the training comparison: a small character language model
  (:class:`~d2lmini.train.TinyLM`) with a GELU MLP against the same model with SwiGLU,
  at matched parameters, over several seeds (the seeds of one activation train in
  lockstep, :func:`train_ensemble`, each exactly as :func:`d2lmini.train.train_lm`
  would train it alone; the tests check that).
* :func:`router_loads` -- how evenly a mixture of experts' router spreads tokens, and
  what DeepSeek-V3's bias update (:func:`balance_by_bias`) does to it.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import KW_ONLY, dataclass, field

import torch
from torch.nn import functional as F

from .._checks import check_seeds as _check_seeds
from .._checks import (check_choice, check_float_tensor, check_instance, check_int_at_least, check_int_in,
                       check_last_dim, check_positive_float, check_positive_floats, check_positive_int, check_seed,
                       check_sequence)
from .._shown import shown_in
from ..data import CharCorpus
from ..block import TransformerBlock
from ..ffn import ACTS, GATED_ACTS, FeedForward
from ..moe import MixtureOfExperts
from ..parameters import num_parameters
from ..plot import ACT_COLORS, ACT_FUNCTION_COLORS, ACT_FUNCTION_LABELS, ACT_LABELS, styled_figure, table_style
from ..seeding import seeded
from ..train import TinyLM, TrainLog, lockstep_losses, seeded_tiny_lm, train_models

#: The model, data and optimizer of the chapter's comparison (:func:`ffn_comparison`):
#: a 2-block, 48-wide pre-norm character model (2 heads of 24 features, RMSNorm, no
#: biases inside the blocks, learned positions) trained on batches of 16 windows of 32
#: characters with AdamW without weight decay (peak rate 0.01, 10 warm-up steps, cosine
#: decay to 10%). ``8 * 48 / 3 = 128`` exactly, so the GELU and SwiGLU models have
#: *identical* parameter counts. Small enough that the chapter's sweep and comparison
#: (twelve models of 100 steps) train on one CPU thread. The peak rate
#: is only the default: the chapter gives each FFN its own, the best of a sweep
#: (:func:`lr_sweep`, :data:`SWEEP_RATES`).
COMPARISON_CONFIG = dict(num_hiddens=48, num_heads=2, num_layers=2, norm="rms", placement="pre",
                         batch_size=16, seq_len=32, lr=1e-2, warmup_steps=10, schedule="cosine",
                         betas=(0.9, 0.98), weight_decay=0.0, eval_batches=8)

#: The peak learning rates of the chapter's sweep (:func:`lr_sweep`): factors of two
#: around :data:`COMPARISON_CONFIG`'s 0.01.
SWEEP_RATES = (0.005, 0.01, 0.02)

#: Shazeer (2020), "GLU Variants Improve Transformer", Table 1: held-out log-perplexity
#: of a T5-base-sized model (pre-trained on C4) after 65,536 steps, for the FFN variants
#: this book implements. Published numbers, not measured here.
SHAZEER_2020_LOG_PERPLEXITY = {"relu": 1.997, "gelu": 1.983, "geglu": 1.942, "swiglu": 1.944}


# --------------------------------------------------------------------------------------
# Parameter budget
# --------------------------------------------------------------------------------------

@shown_in("ch07")
def ffn_parameter_counts(num_hiddens: int = 768, acts=("relu", "gelu", "swiglu", "geglu")) -> list[dict]:
    """Parameters of one :class:`~d2lmini.ffn.FeedForward` per activation, at default width.

    A plain MLP (``'relu'``, ``'gelu'``) has two ``d x 4d`` matrices, ``8 d^2`` weights;
    a gated one (``'swiglu'``, ``'geglu'``) has three ``d x h`` matrices with
    ``h = round(8d/3)``, so ``3 d h`` weights -- ``8 d^2`` up to the rounding of ``h``,
    a relative difference of at most ``1 / (8d)`` (zero when 3 divides ``d``).

    Args:
        num_hiddens: model width ``d``.
        acts: activations (names from :data:`d2lmini.ffn.ACTS`).

    Returns:
        One dict per activation, in order, with keys ``act``, ``gated`` (bool),
        ``matrices`` (2 or 3), ``ffn_num_hiddens`` (``h``), ``params`` (counted from the
        module, no biases), ``per_d2`` (``params / d^2``) and ``rel_diff`` (``params /
        8d^2 - 1``).

    Raises:
        ValueError / TypeError: for a bad ``num_hiddens`` or an unknown activation.

    Introduced in the chapter "The feed-forward network: SwiGLU, then a mixture of experts".
    """
    num_hiddens = check_positive_int("num_hiddens", num_hiddens)
    acts = check_sequence("acts", acts, lambda name, act: check_choice(name, act, ACTS), f"names from {ACTS}")
    rows = []
    for act in acts:
        ffn = FeedForward(num_hiddens, act=act).to("meta")  # shapes only, no memory
        params = num_parameters(ffn)
        rows.append(dict(act=act, gated=act in GATED_ACTS, matrices=3 if act in GATED_ACTS else 2,
                         ffn_num_hiddens=ffn.ffn_num_hiddens, params=params,
                         per_d2=params / num_hiddens ** 2, rel_diff=params / (8 * num_hiddens ** 2) - 1))
    return rows


#: The legend labels of :func:`plot_activations`, written in the chapter's letter for a
#: pre-activation, ``z``.
_Z_LABELS = {"gelu": r"GELU  $z\,\Phi(z)$", "silu": r"SiLU  $z\,\sigma(z)$"}


def plot_activations(acts=("relu", "gelu", "silu"), lo: float = -4.0, hi: float = 3.0,
                     width: float = 4.5, height: float = 3.0):
    """The activation functions on ``[lo, hi]``, in one panel.

    Args:
        acts: any of ``'relu'`` (``max(0, x)``), ``'gelu'`` (``x Phi(x)``, the exact
            erf form), ``'gelu_tanh'`` (GPT-2's tanh approximation) and ``'silu'``
            (``x sigmoid(x)``, the "Swish" inside SwiGLU).
        lo, hi: the input range.
        width, height: figure size in inches.

    Returns:
        A pyplot-free ``matplotlib.figure.Figure``.

    Raises:
        ValueError: for an unknown activation name or ``lo >= hi``.
    """
    functions = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
                 "silu": F.silu}
    for act in acts:
        check_choice("acts", act, tuple(functions))
    if not lo < hi:
        raise ValueError(f"lo must be < hi, got lo={lo}, hi={hi}")
    x = torch.linspace(lo, hi, 401, dtype=torch.float64)
    with styled_figure(1, width=width, height=height) as (fig, ax):
        for act in acts:
            color, label = ACT_FUNCTION_COLORS[act], _Z_LABELS.get(act, ACT_FUNCTION_LABELS[act])
            ax.plot(x, functions[act](x), color=color, label=label)
        ax.axhline(0.0, color="0.8", linewidth=0.8, zorder=0)
        ax.set(xlabel="pre-activation $z$", ylabel=r"$\varphi(z)$")
        ax.legend(loc="upper left")
    return fig


# --------------------------------------------------------------------------------------
# The key-value-memory reading
# --------------------------------------------------------------------------------------

@dataclass
class MemoryReading:
    """The result of :func:`ffn_as_memories`.

    Attributes:
        act: the FFN's activation.
        coefficients: ``(n, h)`` tensor, the memory coefficients ``m_i(x)`` of every token.
        max_abs_diff: largest ``|FFN(x) - sum_i m_i(x) v_i|`` over all tokens (float).
        active_fraction: share of coefficients that are not exactly zero.
        top_share: mean share of ``sum_i |m_i|`` carried by each token's ``top_k``
            largest coefficients.
        top_k: the ``k`` of ``top_share``.
    """

    act: str
    coefficients: torch.Tensor = field(repr=False)
    _: KW_ONLY
    max_abs_diff: float
    active_fraction: float
    top_share: float
    top_k: int


def sum_of_memories(ffn: FeedForward, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""An FFN's memory coefficients, and its output rebuilt from them (Geva et al., 2021).

    Key ``k_i`` is row ``i`` of ``W_1``, value ``v_i`` column ``i`` of ``W_2``. The
    coefficient is ``m_i(x) = act(k_i . x)`` for a plain MLP and ``act(g_i . x) (k_i . x)``
    for a gated FFN (``g_i``: row ``i`` of ``W_g``); biases are added where present.

    Args:
        ffn: a :class:`~d2lmini.ffn.FeedForward`; X: ``(tokens, d)`` token vectors.

    Returns:
        ``m`` of shape ``(tokens, h)`` and ``sum_i m_i(x) v_i`` (+ bias), ``(tokens, d)``.
    """
    def bias(linear):
        return linear.bias if linear.bias is not None else 0
    with torch.no_grad():
        match = X @ ffn.W_1.weight.T + bias(ffn.W_1)                     # k_i . x, (tokens, h)
        if ffn.gated:
            m = ffn._act(X @ ffn.W_g.weight.T + bias(ffn.W_g)) * match
        else:
            m = ffn._act(match)
        return m, m @ ffn.W_2.weight.T + bias(ffn.W_2)                  # sum_i m_i v_i


def ffn_as_memories(ffn: FeedForward, X: torch.Tensor, top_k: int = 10) -> MemoryReading:
    r"""Rewrite an FFN's output as a weighted sum of value vectors (Geva et al., 2021).

    Row ``i`` of ``W_1`` is a *key* ``k_i``, column ``i`` of ``W_2`` a *value*
    ``v_i``. For a plain MLP the coefficient of memory ``i`` is
    ``m_i(x) = act(k_i . x)``; for a gated FFN it is ``act(g_i . x) (k_i . x)`` with
    ``g_i`` row ``i`` of ``W_g``. Then ``FFN(x) = sum_i m_i(x) v_i`` (+ bias), which
    this function checks numerically (:func:`sum_of_memories`); it checks its arguments
    and leaves the measuring to :func:`memory_reading`.

    Args:
        ffn: a :class:`~d2lmini.ffn.FeedForward` (any activation, no dropout in effect).
        X: ``(n, d)`` or ``(b, n, d)`` token vectors (flattened to ``(tokens, d)``).
        top_k: how many of the largest coefficients ``top_share`` measures.

    Returns:
        A :class:`MemoryReading`.

    Raises:
        TypeError: if ``ffn`` is not a ``FeedForward`` or ``X`` not a tensor.
        ValueError: if ``X``'s last dimension is not ``ffn.num_hiddens``, ``top_k`` is
            out of range, or ``ffn.act`` is ``'swiglu_clamped'``.

    Introduced in the chapter "The feed-forward network: SwiGLU, then a mixture of experts".
    """
    check_instance("ffn", ffn, FeedForward, "a d2lmini FeedForward")
    if ffn.act == "swiglu_clamped":  # its coefficients are not act(g_i . x) (k_i . x)
        raise ValueError("ffn_as_memories reads coefficients act(g_i . x) (k_i . x); act='swiglu_clamped' "
                         "(gpt-oss) clamps both and adds 1, so its memories are not read here")
    check_last_dim("X", check_float_tensor("X", X, min_dim=2), ffn.num_hiddens)
    top_k = check_int_in("top_k", top_k, 1, ffn.ffn_num_hiddens)
    return memory_reading(ffn, X.reshape(-1, ffn.num_hiddens), top_k)


def memory_reading(ffn: FeedForward, X: torch.Tensor, top_k: int = 10) -> MemoryReading:
    """The measurements of :func:`ffn_as_memories`, for checked ``(tokens, d)`` inputs ``X``.

    Compares the FFN's own output with the sum of weighted values, and counts the
    coefficients that are not exactly zero (:class:`MemoryReading`).
    """
    m, memory_sum = sum_of_memories(ffn, X)                     # m_i(x), sum_i m_i(x) v_i
    with torch.no_grad():
        was_training = ffn.training
        ffn.eval()
        out = ffn(X)                                              # FFN(x), the module itself
        ffn.train(was_training)
        size = m.abs()
        top = size.topk(top_k, dim=-1).values.sum(-1) / size.sum(-1).clamp_min(1e-30)
    return MemoryReading(ffn.act, m,
                         max_abs_diff=float((out - memory_sum).abs().max()),   # max |FFN(x) - sum|
                         active_fraction=float((m != 0).double().mean()),      # share of m_i != 0
                         top_share=float(top.mean()), top_k=top_k)


# --------------------------------------------------------------------------------------
# Training several seeds at once
# --------------------------------------------------------------------------------------

@dataclass
class EnsembleRun:
    """Losses of one :func:`train_ensemble` call: one activation, several seeds.

    Attributes:
        act: the FFN activation of every model.
        seeds: the seeds, one model each.
        num_params: parameters of one model (all of them, embeddings included).
        ffn_params: parameters of the FFNs of one model (all blocks).
        train_loss: ``[seed][step]`` mean cross-entropy of each step's training batch
            (nats per character), before that step's update.
        val_steps: steps after which the validation loss was measured.
        val_loss: ``[seed][i]`` validation loss after ``val_steps[i]`` steps.
        seconds: wall time of the whole call.
        train_seconds: wall time of the training steps alone (no set-up, no validation).
        config: the arguments of the call.
        state: the trained weights, ``{name: (len(seeds), *shape)}`` (see :meth:`model`).
    """

    act: str
    seeds: list[int]
    num_params: int
    ffn_params: int
    train_loss: list[list[float]]
    val_steps: list[int]
    val_loss: list[list[float]]
    seconds: float
    train_seconds: float
    config: dict
    state: dict = field(default_factory=dict, repr=False)

    def model(self, seed: int, vocab_size: int) -> TinyLM:
        """The trained :class:`~d2lmini.train.TinyLM` of ``seed`` (in eval mode, on the CPU).

        Raises:
            ValueError: if ``seed`` was not trained here or ``vocab_size`` does not fit.
        """
        if seed not in self.seeds:
            raise ValueError(f"seed must be one of the trained seeds {self.seeds}, got {seed!r}")
        keys = ("num_hiddens", "num_heads", "num_layers", "norm", "placement", "bias", "act", "ffn_num_hiddens")
        model = TinyLM(vocab_size, max_len=self.config["seq_len"], **{k: self.config[k] for k in keys})
        i = self.seeds.index(seed)
        model.load_state_dict({k: v[i].cpu() for k, v in self.state.items()})
        return model.eval()


def validation_batches(corpus: CharCorpus, batch_size: int, seq_len: int, num_batches: int,
                       seed: int = 1234) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed held-out batches every model is scored on (those of :func:`d2lmini.train.evaluate`).

    Returns:
        ``num_batches`` pairs ``(X, Y)`` of ``(batch_size, seq_len)`` token ids from the
        validation split, drawn from a generator seeded with ``seed``.
    """
    gen = torch.Generator().manual_seed(seed)
    return [corpus.random_batch(batch_size, seq_len, gen, split="val") for _ in range(num_batches)]


def validation_losses(losses_of, num_models: int, val: list) -> list[float]:
    """Each model's validation loss: its mean next-token cross-entropy over the batches ``val``.

    Args:
        losses_of: from :func:`d2lmini.train.lockstep_losses`: one ``(X, Y)`` batch per
            model to each model's cross-entropy in nats per character, ``(num_models,)``.
        num_models: how many models; val: the ``(X, Y)`` pairs of :func:`validation_batches`.

    Returns:
        ``num_models`` floats.
    """
    with torch.no_grad():
        total = sum(losses_of([(X, Y)] * num_models) for X, Y in val)
    return (total / len(val)).tolist()


def train_ensemble(corpus: CharCorpus, act: str = "swiglu", seeds=(0, 1, 2), num_steps: int = 100,
                   batch_size: int = 16, seq_len: int = 32, lr: float = 1e-2, warmup_steps: int = 10,
                   schedule: str = "cosine", betas: tuple[float, float] = (0.9, 0.98),
                   weight_decay: float = 0.0, eval_steps=(50, 100), eval_batches: int = 8,
                   num_hiddens: int = 48, num_heads: int = 2, num_layers: int = 2, norm: str = "rms",
                   placement: str = "pre", bias: bool = False, ffn_num_hiddens: int | None = None,
                   vectorize: bool = False, device: str = "cpu") -> EnsembleRun:
    """Train one :class:`~d2lmini.train.TinyLM` per seed, all seeds in lockstep, and record losses.

    The book's one training loop, :func:`d2lmini.train.train_models`, with one model
    per seed: every seed's model is what :func:`d2lmini.train.train_lm` trains with that
    seed -- the same initial weights, the same stream of random training batches, the
    same AdamW updates at the same scheduled learning rate
    (:func:`d2lmini.train.lr_at`), and the same losses. At every step each model
    computes its loss and gradients, then *one* ``foreach`` AdamW step updates the
    weights of all of them (AdamW acts on each number separately, so this equals one
    optimizer per model, with a few large kernel calls instead of many small ones).
    The validation is the loop's per-step hook.

    With ``vectorize=True`` the models' weights are instead stacked along a new
    leading dimension and one forward pass of the real ``TinyLM`` is vectorized over
    that dimension (``torch.vmap`` over ``torch.func.functional_call``, see
    :func:`d2lmini.train.lockstep_losses`): one kernel launch serves every seed, the
    fast choice on a GPU. On a CPU it is slower, because PyTorch has no vmap rule for
    the CPU attention kernel and loops over the seeds for that op; the results are the
    same.

    Args:
        corpus: the data (:func:`d2lmini.data.python_reference_corpus`).
        act: FFN activation, one of :data:`d2lmini.ffn.ACTS`.
        seeds: distinct ints >= 0; seed ``s`` draws model ``s``'s weights and batches.
        num_steps: optimizer steps.
        batch_size, seq_len: training windows per step and characters per window.
        lr, warmup_steps, schedule: peak learning rate, linear warm-up steps and
            ``'constant'`` / ``'cosine'`` (to 10% at ``num_steps``), as in ``train_lm``.
        betas, weight_decay: AdamW's.
        eval_steps: steps after which every model is scored on the same fixed
            validation batches (:func:`validation_batches`); each in ``[1, num_steps]``.
        eval_batches: how many validation batches of ``(batch_size, seq_len)``.
        num_hiddens, num_heads, num_layers, norm, placement, bias, ffn_num_hiddens:
            the model (:class:`~d2lmini.train.TinyLM` of causal
            :class:`~d2lmini.block.TransformerBlock`; ``ffn_num_hiddens=None`` is ``4d``
            for plain and ``round(8d/3)`` for gated activations).
        vectorize: ``torch.vmap`` over stacked weights instead of a loop over models.
        device: where to train.

    Returns:
        An :class:`EnsembleRun`. The trained weights are in its ``state``.

    Raises:
        ValueError / TypeError: for invalid arguments (each names the argument).

    Introduced in the chapter "The feed-forward network: SwiGLU, then a mixture of experts".
    """
    check_choice("act", act, ACTS)
    seeds = _check_seeds(seeds)
    num_steps = check_positive_int("num_steps", num_steps)
    seq_len = check_positive_int("seq_len", seq_len)  # also the models' max_len
    eval_batches = check_positive_int("eval_batches", eval_batches)
    if isinstance(eval_steps, (str, bytes)) or not hasattr(eval_steps, "__iter__"):
        raise TypeError(f"eval_steps must be a sequence of ints, got {type(eval_steps).__name__}")
    eval_steps = sorted({check_positive_int("eval_steps", s) for s in eval_steps})
    if eval_steps and eval_steps[-1] > num_steps:
        raise ValueError(f"eval_steps must lie in [1, num_steps={num_steps}], got {eval_steps}")
    model_kwargs = dict(num_hiddens=num_hiddens, num_heads=num_heads, num_layers=num_layers, norm=norm,
                        placement=placement, bias=bias, act=act, ffn_num_hiddens=ffn_num_hiddens)
    config = dict(seeds=seeds, num_steps=num_steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
                  warmup_steps=warmup_steps, schedule=schedule, betas=tuple(betas), weight_decay=weight_decay,
                  eval_steps=eval_steps, eval_batches=eval_batches, vectorize=vectorize, **model_kwargs)

    start = time.perf_counter()
    models = [seeded_tiny_lm(corpus.vocab_size, seed, max_len=seq_len, **model_kwargs).to(device) for seed in seeds]
    num_params = num_parameters(models[0])
    ffn_params = sum(num_parameters(block.ffn) for block in models[0].blocks)
    losses_of = lockstep_losses(models, vectorize)
    val = [(X.to(device), Y.to(device)) for X, Y in validation_batches(corpus, batch_size, seq_len, eval_batches)]
    val_loss = [[] for _ in seeds]

    def validate(step, models, losses):
        if step + 1 in eval_steps:
            for history, value in zip(val_loss, validation_losses(losses_of, len(models), val)):
                history.append(value)

    log = train_models(models, corpus, seeds, num_steps, batch_size, seq_len, lr, warmup_steps, schedule,
                       tuple(betas), weight_decay, vectorize=vectorize, stop_on_divergence=False,
                       on_step=validate)
    state = {k: torch.stack([m.state_dict()[k] for m in models]).detach() for k in models[0].state_dict()}
    return EnsembleRun(act, seeds, num_params, ffn_params, log.losses, eval_steps, val_loss,
                       time.perf_counter() - start, log.seconds, config, state)


# --------------------------------------------------------------------------------------
# The chapter's comparison: GELU MLP against SwiGLU
# --------------------------------------------------------------------------------------

@dataclass
class FFNComparison:
    """The result of :func:`ffn_comparison`.

    Attributes:
        runs: ``{act: EnsembleRun}``, one entry per activation, same seeds in the same order.
        corpus_chars: characters in the whole text (training + validation).
        corpus_sha256: hex SHA-256 of the text.
        vocab_size: distinct characters.
        seconds: wall time of the whole comparison (every activation and seed).
        config: the settings shared by every run.
    """

    runs: dict
    corpus_chars: int
    corpus_sha256: str
    vocab_size: int
    seconds: float
    config: dict

    @property
    def seeds(self) -> list[int]:
        """The seeds, one model per activation each."""
        return next(iter(self.runs.values())).seeds

    @property
    def val_steps(self) -> list[int]:
        """The steps after which the validation loss was measured."""
        return next(iter(self.runs.values())).val_steps

    def val_loss(self, act: str, step: int) -> list[float]:
        """Every seed's validation loss of ``act`` after ``step`` steps (nats per character)."""
        run = self._run(act)
        if step not in run.val_steps:
            raise ValueError(f"step must be one of the validation steps {run.val_steps}, got {step!r}")
        i = run.val_steps.index(step)
        return [losses[i] for losses in run.val_loss]

    def differences(self, step: int, baseline: str = "gelu", other: str = "swiglu") -> list[float]:
        """Per seed, ``baseline``'s minus ``other``'s validation loss after ``step`` steps.

        Positive means ``other`` (by default SwiGLU) reached the lower loss.
        """
        return [a - b for a, b in zip(self.val_loss(baseline, step), self.val_loss(other, step))]

    def summary(self, step: int, baseline: str = "gelu", other: str = "swiglu") -> dict:
        """Mean, sample standard deviation (n - 1; 0 for one seed), minimum and maximum
        of :meth:`differences` over the seeds, and how many seeds favour ``other``."""
        d = self.differences(step, baseline, other)
        return dict(step=step, mean=statistics.fmean(d), std=statistics.stdev(d) if len(d) > 1 else 0.0,
                    min=min(d), max=max(d), wins=sum(x > 0 for x in d), seeds=len(d))

    def seed_table(self, baseline: str = "gelu", other: str = "swiglu"):
        """A ``pandas.DataFrame``: one row per (seed, step) with both validation losses and
        their difference; then one row per step with the means over seeds."""
        import pandas as pd

        rows, index = [], []
        names = (ACT_LABELS.get(baseline, baseline), ACT_LABELS.get(other, other), "difference")
        for i, seed in enumerate(self.seeds):
            for step in self.val_steps:
                a, b = self.val_loss(baseline, step)[i], self.val_loss(other, step)[i]
                rows.append((a, b, a - b))
                index.append((f"seed {seed}", step))
        for step in self.val_steps:
            a = statistics.fmean(self.val_loss(baseline, step))
            b = statistics.fmean(self.val_loss(other, step))
            rows.append((a, b, a - b))
            index.append(("mean", step))
        return pd.DataFrame(rows, columns=list(names),
                            index=pd.MultiIndex.from_tuples(index, names=["seed", "step"]))

    def _run(self, act: str) -> EnsembleRun:
        if act not in self.runs:
            raise ValueError(f"act must be one of the compared activations {tuple(self.runs)}, got {act!r}")
        return self.runs[act]


def ffn_comparison(corpus: CharCorpus | None = None, acts=("gelu", "swiglu"), seeds=(0, 1, 2),
                   num_steps: int = 100, eval_steps=(25, 50, 75, 100), workers: int = 1,
                   rates: dict | None = None, **overrides) -> FFNComparison:
    """Train the same small character LM with each FFN activation, over several seeds.

    The chapter's experiment: for every activation in ``acts`` (by default a GELU MLP
    of width ``4d`` and SwiGLU of width ``8d/3``, so both models have the same number
    of parameters) and every seed, a :class:`~d2lmini.train.TinyLM` with the settings
    of :data:`COMPARISON_CONFIG` is trained for ``num_steps`` AdamW steps. Seed ``s``
    fixes the batch stream, so the models of one seed see the same characters in the
    same order; only the FFN differs. The seeds of one activation train together as
    one ensemble (:func:`train_ensemble`). Every model is scored after each of
    ``eval_steps`` on the same held-out batches.

    Args:
        corpus: the data (default :func:`d2lmini.data.python_reference_corpus`).
        acts: activations to compare (names from :data:`d2lmini.ffn.ACTS`).
        seeds: distinct ints >= 0.
        num_steps: training steps per model.
        eval_steps: steps after which the validation loss is recorded.
        workers: how many activations train at the same time, each in its own Python
            thread with ``torch.get_num_threads() // workers`` torch threads (at least
            one). The default, 1, trains them one after another (the chapter's choice,
            on the one torch thread its setup cell fixes). With one torch thread per
            worker the numbers are the same for any ``workers``.
        rates: ``{act: peak learning rate}`` for activations that train at their own
            rate (e.g. each at its best rate of :func:`lr_sweep`); the others train at
            the configuration's ``lr``. ``config["rates"]`` of the result holds every
            activation's rate.
        **overrides: replace entries of :data:`COMPARISON_CONFIG` (e.g. ``lr``,
            ``num_hiddens``, ``batch_size``) or pass other :func:`train_ensemble`
            arguments (``device``).

    Returns:
        An :class:`FFNComparison`.

    Raises:
        ValueError / TypeError: for invalid arguments, or ``act``/``seeds`` passed in
            ``overrides``.

    Follows the comparison of Shazeer (2020), "GLU Variants Improve Transformer", at a
    scale that runs on a laptop CPU. Introduced in the chapter
    "The feed-forward network: SwiGLU, then a mixture of experts".
    """
    from ..data import python_reference_corpus

    for name in ("act", "seeds"):
        if name in overrides:
            raise TypeError(f"ffn_comparison sets {name} itself; pass acts=... / seeds=...")
    if isinstance(acts, str) or not acts:
        raise TypeError(f"acts must be a non-empty sequence of names from {ACTS}, got {acts!r}")
    for act in acts:
        check_choice("acts", act, ACTS)
    if len(set(acts)) != len(acts):
        raise ValueError(f"acts must be distinct, got {acts}")
    rates = {} if rates is None else rates
    if not isinstance(rates, dict):
        raise TypeError(f"rates must be a dict {{act: learning rate}} or None, got {type(rates).__name__}")
    for act, rate in rates.items():
        check_choice("rates", act, acts)
        check_positive_float(f"rates[{act!r}]", rate)
    corpus = python_reference_corpus() if corpus is None else corpus
    config = {**COMPARISON_CONFIG, **overrides, "num_steps": num_steps, "eval_steps": tuple(eval_steps)}
    config["rates"] = {act: float(rates.get(act, config["lr"])) for act in acts}
    own = {act: {**{k: v for k, v in config.items() if k != "rates"}, "lr": config["rates"][act]} for act in acts}
    threads = torch.get_num_threads()
    workers = check_positive_int("workers", workers)
    start = time.perf_counter()
    if workers == 1:
        runs = {act: train_ensemble(corpus, act=act, seeds=seeds, **own[act]) for act in acts}
    else:
        # One activation per worker thread, each with an equal share of the cores. The
        # kernels release the GIL, so the workers run side by side; on small tensors this
        # uses the cores better than splitting every kernel between them.
        from concurrent.futures import ThreadPoolExecutor

        torch.set_num_threads(max(1, threads // workers))
        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = {act: pool.submit(train_ensemble, corpus, act=act, seeds=seeds, **own[act])
                           for act in acts}
                runs = {act: future.result() for act, future in futures.items()}
        finally:
            torch.set_num_threads(threads)
    return FFNComparison(runs, len(corpus.text), corpus.sha256, corpus.vocab_size,
                         time.perf_counter() - start, config)


# --------------------------------------------------------------------------------------
# The learning-rate sweep
# --------------------------------------------------------------------------------------

@dataclass
class LRSweep:
    """The result of :func:`lr_sweep`.

    Attributes:
        acts: the activations; rates: the peak learning rates, ascending.
        seed: the one seed of every model (its initial weights and its batches).
        val_loss: ``{act: [loss per rate]}``, validation loss after the last step (NaN
            for a model that diverged).
        train_loss: ``{act: [[loss per step] per rate]}``, the training-batch losses.
        seconds: wall time of the whole sweep; config: the settings shared by every model.
    """

    acts: list[str]
    rates: list[float]
    seed: int
    val_loss: dict
    train_loss: dict = field(repr=False)
    seconds: float
    config: dict

    def best_rate(self, act: str) -> float:
        """The rate at which ``act`` reached its lowest validation loss (diverged runs excluded).

        Raises:
            ValueError: if ``act`` was not swept or diverged at every rate.
        """
        if act not in self.val_loss:
            raise ValueError(f"act must be one of the swept activations {tuple(self.val_loss)}, got {act!r}")
        finite = [(loss, rate) for loss, rate in zip(self.val_loss[act], self.rates) if math.isfinite(loss)]
        if not finite:
            raise ValueError(f"act {act!r} diverged at every rate")
        return min(finite)[1]

    def table(self):
        """A ``pandas.DataFrame``: one row per peak rate, one column of validation losses per activation."""
        import pandas as pd

        frame = pd.DataFrame({ACT_LABELS.get(act, act): self.val_loss[act] for act in self.acts},
                             index=pd.Index(self.rates, name="peak learning rate"))
        return frame


def sweep_in_lockstep(corpus: CharCorpus, pairs: list[tuple[str, float]], seed: int, num_steps: int,
                      config: dict) -> tuple[TrainLog, list[float]]:
    """Train one model per ``(activation, peak rate)`` pair, all in one lockstep.

    Every model starts from the weights of ``seed`` and reads the batches of ``seed``;
    the model of rate ``r`` follows the schedule of the highest rate scaled by
    ``r / highest`` (its own optimizer parameter group). Returns the training log and
    every model's validation loss after the last step.
    """
    shape = {k: config[k] for k in ("num_hiddens", "num_heads", "num_layers", "norm", "placement")}
    models = [seeded_tiny_lm(corpus.vocab_size, seed, max_len=config["seq_len"], act=act, bias=False, **shape)
              for act, _ in pairs]
    top = max(rate for _, rate in pairs)
    log = train_models(models, corpus, [seed] * len(pairs), num_steps, config["batch_size"], config["seq_len"],
                       top, config["warmup_steps"], config["schedule"], tuple(config["betas"]),
                       config["weight_decay"], stop_on_divergence=False,
                       lr_scales=[rate / top for _, rate in pairs])
    val = validation_batches(corpus, config["batch_size"], config["seq_len"], config["eval_batches"])
    return log, validation_losses(lockstep_losses(models), len(pairs), val)


def lr_sweep(corpus: CharCorpus | None = None, acts=("gelu", "swiglu"), rates=SWEEP_RATES, seed: int = 0,
             num_steps: int = 100, **overrides) -> LRSweep:
    """Train the comparison's model with every FFN at every peak learning rate, one seed.

    The models of all ``len(acts) * len(rates)`` pairs train in one lockstep
    (:func:`sweep_in_lockstep` on :func:`d2lmini.train.train_models` with ``lr_scales``):
    each model gets exactly the steps it would get alone with its own peak rate, up to
    the rounding of the rate (exactly, for rates a power of two apart such as
    :data:`SWEEP_RATES`). Everything else is :data:`COMPARISON_CONFIG` (warm-up, cosine
    decay to 10% at ``num_steps``, batches), and every model is scored after the last
    step on the comparison's fixed validation batches (:func:`validation_batches`).

    Args:
        corpus: the data (default :func:`d2lmini.data.python_reference_corpus`).
        acts: activations (names from :data:`d2lmini.ffn.ACTS`, distinct).
        rates: distinct peak learning rates (> 0).
        seed: the seed of every model's weights and batches.
        num_steps: training steps per model.
        **overrides: replace entries of :data:`COMPARISON_CONFIG` except ``lr``.

    Returns:
        An :class:`LRSweep`.

    Raises:
        ValueError / TypeError: for invalid arguments (each names the argument).

    Introduced in the chapter "The feed-forward network: SwiGLU, then a mixture of experts".
    """
    from ..data import python_reference_corpus

    if isinstance(acts, str) or not acts:
        raise TypeError(f"acts must be a non-empty sequence of names from {ACTS}, got {acts!r}")
    acts = [check_choice("acts", act, ACTS) for act in acts]
    rates = sorted(check_positive_floats("rates", rates))
    if len(set(acts)) != len(acts) or len(set(rates)) != len(rates):
        raise ValueError(f"acts and rates must be distinct, got {acts} and {rates}")
    seed = check_int_at_least("seed", seed, 0)
    num_steps = check_positive_int("num_steps", num_steps)
    if "lr" in overrides:
        raise TypeError("lr_sweep sets the learning rates itself; pass rates=...")
    unknown = set(overrides) - set(COMPARISON_CONFIG)
    if unknown:
        raise TypeError(f"lr_sweep got unknown settings {sorted(unknown)}; known: {sorted(COMPARISON_CONFIG)}")
    corpus = python_reference_corpus() if corpus is None else corpus
    config = {**COMPARISON_CONFIG, **overrides, "num_steps": num_steps}
    del config["lr"]
    start = time.perf_counter()
    pairs = [(act, rate) for act in acts for rate in rates]
    log, val = sweep_in_lockstep(corpus, pairs, seed, num_steps, config)
    k = len(rates)
    return LRSweep(acts, rates, seed, {act: val[i * k:(i + 1) * k] for i, act in enumerate(acts)},
                   {act: log.losses[i * k:(i + 1) * k] for i, act in enumerate(acts)},
                   time.perf_counter() - start, config)


#: Line styles of the seeds in :func:`plot_ffn_comparison`; the colour says which FFN.
_SEED_STYLES = ("-", "--", ":", "-.")


def plot_ffn_comparison(result: FFNComparison, baseline: str = "gelu", other: str = "swiglu",
                        width: float = 9.0, height: float = 3.2):
    """Validation losses of both activations (left) and their per-seed gap (right).

    Left: per activation, the mean validation loss over the seeds at each of
    ``result.val_steps``, with a band from the lowest to the highest seed. Right: per
    seed (one line style each),
    ``baseline``'s validation loss minus ``other``'s (above zero: ``other`` is ahead; both
    models of a seed read the same batches), and their mean over the seeds as black bars.
    The legends sit below the panels, off the data.

    Args:
        result: an :class:`FFNComparison` (at most four seeds).
        baseline, other: the two activations to contrast.
        width, height: figure size in inches.

    Returns:
        A pyplot-free ``matplotlib.figure.Figure``.

    Raises:
        ValueError: if ``baseline`` or ``other`` was not part of the comparison, or there
            are more seeds than line styles.
    """
    runs = (result._run(baseline), result._run(other))
    if len(result.seeds) > len(_SEED_STYLES):
        raise ValueError(f"result must have at most {len(_SEED_STYLES)} seeds, got {len(result.seeds)}")
    names = [ACT_LABELS.get(run.act, run.act) for run in runs]
    steps = result.val_steps
    with styled_figure(2, width=width, height=height) as (fig, (ax, ax_gap)):
        for run, label in zip(runs, names):
            per_step = list(zip(*run.val_loss))                                 # [step][seed]
            color = ACT_COLORS.get(run.act)
            ax.fill_between(steps, [min(v) for v in per_step], [max(v) for v in per_step], color=color,
                            alpha=0.2, linewidth=0)
            ax.plot(steps, [statistics.fmean(v) for v in per_step], color=color, marker="o", markersize=3.5,
                    linewidth=1.5, label=label)
        ax.set(xlabel="training step", ylabel="validation loss (nats / char)", title="Loss, mean over seeds")
        ax.set_xticks(steps)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, fontsize=9, frameon=False)
        gaps = [result.differences(step, baseline, other) for step in steps]    # [step][seed]
        for i, seed in enumerate(result.seeds):
            ax_gap.plot(steps, [g[i] for g in gaps], color="0.35", linestyle=_SEED_STYLES[i], marker="o",
                        markersize=3.5, linewidth=1.2, label=f"seed {seed}")
        ax_gap.plot(steps, [statistics.fmean(g) for g in gaps], linestyle="none", marker="_", markersize=18,
                    markeredgewidth=2.5, color="black", label="mean")
        ax_gap.axhline(0.0, color="0.6", linewidth=1.0)
        values = [x for g in gaps for x in g]
        pad = 0.1 * (max(values + [0.0]) - min(values + [0.0])) + 0.005
        ax_gap.set_ylim(min(values + [0.0]) - pad, max(values + [0.0]) + pad)
        ax_gap.set_xticks(steps)
        ax_gap.set(xlabel="training step", ylabel="difference (nats / char)",
                   title=f"{names[0]} − {names[1]} (> 0: {names[1]} ahead)")
        ax_gap.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(result.seeds) + 1,
                      fontsize=9, frameon=False)
    return fig


# --------------------------------------------------------------------------- mixture of experts, measured


def dense_mixture(moe: MixtureOfExperts, tokens: torch.Tensor) -> torch.Tensor:
    """A :class:`MixtureOfExperts` computed the slow way, to check its sparse forward pass.

    Every expert runs on every token; an expert the router did not choose for a token
    gets the weight 0 there. Takes ``tokens`` of shape ``(t, d)``, returns ``(t, d)``.
    Introduced in the chapter "The feed-forward network: SwiGLU, then a mixture of experts".
    """
    weights, experts = moe.route(tokens)
    full = torch.zeros(tokens.shape[0], moe.num_experts).scatter(1, experts, weights)
    out = sum(full[:, e, None] * expert(tokens) for e, expert in enumerate(moe.experts))
    return out + (moe.shared(tokens) if moe.shared is not None else 0)


#: Two mixture-of-experts models as their papers describe them: routed experts per block,
#: shared experts, routed experts a token uses, and parameters in all and used per token.
#: Qwen3-235B-A22B: Yang et al. (2025), "Qwen3 Technical Report", Table 2 (no shared expert);
#: DeepSeek-V3: DeepSeek-AI (2024), "DeepSeek-V3 Technical Report", Sections 2.1 and 4.2.
MOE_MODELS = {
    "Qwen3-235B-A22B": dict(routed=128, shared=0, per_token=8, total=235e9, active=22e9),
    "DeepSeek-V3": dict(routed=256, shared=1, per_token=8, total=671e9, active=37e9),
}


@shown_in("ch07")
def balance_by_bias(moe: MixtureOfExperts, tokens: torch.Tensor, num_updates: int, gamma: float) -> list:
    """DeepSeek-V3's balancing without an auxiliary loss, on fixed ``tokens`` ``(T, d)``.

    After each round of routing, every overloaded expert's ``expert_bias`` drops by
    ``gamma`` and every underloaded one's rises by ``gamma``. The bias only changes which
    experts are chosen, not their weights. Returns each round's load per expert, as a
    multiple of the fair share ``top_k T / E`` (``num_updates + 1`` tensors ``(E,)``).
    """
    loads = []
    with torch.no_grad():
        for update in range(num_updates + 1):
            _, experts = moe.route(tokens)                                   # (T, top_k) chosen experts
            load = torch.bincount(experts.flatten(), minlength=moe.num_experts).float()
            loads.append(load / load.mean())                                 # 1.0: the fair share
            if update < num_updates:
                moe.expert_bias += gamma * torch.sign(load.mean() - load)    # up if underloaded, down if over
    return loads


def router_loads(num_hiddens: int = 64, num_experts: int = 8, top_k: int = 2, num_tokens: int = 4096,
                 offset: float = 1.0, num_updates: int = 100, gamma: float = 0.01, seed: int = 0) -> dict:
    """How evenly an untrained router spreads tokens, and what DeepSeek-V3's bias does to it.

    A sigmoid router (DeepSeek-V3's, :class:`~d2lmini.moe.MixtureOfExperts` with
    ``router='sigmoid'``) with seeded random weights routes ``num_tokens`` standard normal
    tokens, then the same tokens plus one shared vector of length ``offset * sqrt(d)``
    (a component every token of a text has in common), first as they are and then after
    ``num_updates`` rounds of :func:`balance_by_bias`.

    Returns:
        A dict with three ``(E,)`` tensors of the load per expert as a multiple of the fair
        share, under the keys ``"random tokens"``, ``"with a shared component"`` and
        ``"with a shared component, balanced"``, and ``"chance_std"``: the standard
        deviation of that multiple if each token chose its ``top_k`` experts at random,
        ``sqrt((1 - k/E) / (T k/E))``.

    Raises:
        ValueError / TypeError: for sizes out of range or a bad ``offset``, ``gamma`` or seed.

    Introduced in the chapter "The feed-forward network: SwiGLU, then a mixture of experts".
    """
    num_tokens = check_positive_int("num_tokens", num_tokens)
    num_updates = check_int_at_least("num_updates", num_updates, 0)
    gamma = check_positive_float("gamma", gamma)
    if not isinstance(offset, (int, float)) or isinstance(offset, bool) or not 0 <= offset < math.inf:
        raise ValueError(f"offset must be a finite number >= 0, got {offset!r}")
    with seeded(check_seed(seed)):
        moe = MixtureOfExperts(num_hiddens, num_experts, top_k=top_k, router="sigmoid")
        tokens = torch.randn(num_tokens, num_hiddens)
        shared = torch.randn(num_hiddens)
    shifted = tokens + offset * math.sqrt(num_hiddens) * shared / shared.norm()
    centred = balance_by_bias(moe, tokens, 0, gamma)[0]
    loads = balance_by_bias(moe, shifted, num_updates, gamma)
    share = top_k / num_experts
    return {"random tokens": centred.tolist(), "with a shared component": loads[0].tolist(),
            "with a shared component, balanced": loads[-1].tolist(),
            "chance_std": math.sqrt((1 - share) / (num_tokens * share))}


__all__ = [
    "COMPARISON_CONFIG", "MOE_MODELS", "SHAZEER_2020_LOG_PERPLEXITY", "SWEEP_RATES",
    "EnsembleRun", "FFNComparison", "LRSweep", "MemoryReading",
    "balance_by_bias", "dense_mixture", "ffn_as_memories", "ffn_comparison", "ffn_parameter_counts", "lr_sweep",
    "memory_reading", "plot_activations", "plot_ffn_comparison", "router_loads", "sum_of_memories",
    "sweep_in_lockstep", "train_ensemble", "validation_batches", "validation_losses",
]
