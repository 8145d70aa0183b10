"""Experiments of the chapter "The feed-forward network: SwiGLU, then a mixture of experts".

* :func:`ffn_parameter_counts` -- the parameter budget of every FFN variant of
  :class:`~d2lmini.ffn.FeedForward`: a plain MLP of width ``4d`` and a gated one of
  width ``8d/3`` both cost ``8 d^2`` weights (Shazeer, 2020).
* :func:`ffn_as_memories` -- the key-value-memory reading of the FFN (Geva et al.,
  2021): ``W_2 act(W_1 x)`` is a sum of value vectors weighted by how well ``x``
  matches each key.
* :func:`lr_sweep` -- every FFN at every peak learning rate of :data:`SWEEP_RATES`,
  one seed, the models in lockstep (``lr_scales`` of :func:`d2lmini.train.train_models`)
  shared between two worker processes (:func:`d2lmini.train.run_in_workers`).
* :func:`ffn_comparison` -- the training comparison: a small character language model
  (:class:`~d2lmini.train.TinyLM`) with a GELU MLP against the same model with GeGLU
  and with SwiGLU, at matched parameters, each at its better rate of the sweep, over
  three seeds (:func:`train_members`: each model exactly as :func:`d2lmini.train.train_lm`
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
from matplotlib.lines import Line2D
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
from ..train import TinyLM, lockstep_losses, run_in_workers, seeded_tiny_lm, train_models, training_tally

#: The model, data and optimizer of the chapter's comparison (:func:`ffn_comparison`):
#: a 1-block, 64-wide pre-norm character model (4 heads of 16 features, RMSNorm, no
#: biases inside the block, learned positions) trained on batches of 16 windows of 64
#: characters (1,024 tokens a step) with the book's recipe (:data:`d2lmini.train.RECIPE`):
#: AdamW with betas (0.9, 0.95) and no weight decay, 50 warm-up steps, cosine decay to
#: 10%, every model's gradient clipped to norm 1. One block and half the recipe's batch
#: keep the chapter's twelve models of 600 steps (three FFNs, each at two rates with one
#: seed and at its better rate with two more) within 3 TFLOP of training. The gated FFNs'
#: width ``round(8 * 64 / 3) = 171`` gives them 64 weights more than the GELU MLP's 256
#: (0.2%). The peak rate is only the default: the chapter gives each FFN the better of
#: :data:`SWEEP_RATES` (:func:`lr_sweep`).
COMPARISON_CONFIG = dict(num_hiddens=64, num_heads=4, num_layers=1, norm="rms", placement="pre",
                         batch_size=16, seq_len=64, lr=2e-2, warmup_steps=50, schedule="cosine",
                         betas=(0.9, 0.95), weight_decay=0.0, clip_norm=1.0, eval_batches=16)

#: The peak learning rates of the chapter's sweep (:func:`lr_sweep`): a factor of four
#: apart (a power of two, so that models at both rates train in one lockstep exactly as
#: alone), around the rates at which small character models of this kind train well.
SWEEP_RATES = (0.005, 0.02)

#: Shazeer (2020), "GLU Variants Improve Transformer", Table 1: held-out log-perplexity
#: of a T5-base-sized model (pre-trained on C4) after 65,536 steps, for the FFN variants
#: this book implements and for GLU, the sigmoid-gated FFN (``"glu"``, not implemented
#: here). Published numbers, not measured here.
SHAZEER_2020_LOG_PERPLEXITY = {"relu": 1.997, "gelu": 1.983, "glu": 1.982, "geglu": 1.942,
                               "swiglu": 1.944}


# --------------------------------------------------------------------------------------
# Parameter budget
# --------------------------------------------------------------------------------------

@shown_in("ch07")
def ffn_parameter_counts(num_hiddens: int = 768,
                         acts=("relu", "gelu", "swiglu", "geglu")) -> list[dict]:
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
    acts = check_sequence("acts", acts, lambda name, act: check_choice(name, act, ACTS),
                          f"names from {ACTS}")
    rows = []
    for act in acts:
        with torch.device("meta"):  # shapes only: no memory, no initialization
            ffn = FeedForward(num_hiddens, act=act)
        params = num_parameters(ffn)
        rows.append(dict(act=act, gated=act in GATED_ACTS,
                         matrices=3 if act in GATED_ACTS else 2,
                         ffn_num_hiddens=ffn.ffn_num_hiddens, params=params,
                         per_d2=params / num_hiddens ** 2,
                         rel_diff=params / (8 * num_hiddens ** 2) - 1))
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
            out of range, or ``ffn`` is a subclass (a clamped SwiGLU's units are not ``act(g_i . x) (k_i . x)``).

    Introduced in the chapter "The feed-forward network: SwiGLU, then a mixture of experts".
    """
    check_instance("ffn", ffn, FeedForward, "a d2lmini FeedForward")
    if type(ffn) is not FeedForward:  # a subclass may change gated_units: its coefficients are not read here
        raise ValueError("ffn_as_memories reads coefficients act(g_i . x) (k_i . x) of a FeedForward; a subclass "
                         f"({type(ffn).__name__}) may compute its units otherwise, so its memories are not read here")
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
# Training several models at once
# --------------------------------------------------------------------------------------

@dataclass
class EnsembleRun:
    """Losses of one activation over several seeds (:func:`train_ensemble`, :func:`ffn_comparison`).

    Attributes:
        act: the FFN activation of every model.
        seeds: the seeds, one model each.
        num_params: parameters of one model (all of them, embeddings included).
        ffn_params: parameters of the FFNs of one model (all blocks).
        train_loss: ``[seed][step]`` mean cross-entropy of each step's training batch
            (nats per character), before that step's update.
        val_steps: steps after which the validation loss was measured.
        val_loss: ``[seed][i]`` validation loss after ``val_steps[i]`` steps.
        seconds: wall time of the training of these models (their share of the lockstep
            they trained in, set-up and validation included).
        train_seconds: their share of the training steps alone (no set-up, no validation).
        config: the settings of the models and their training (``lr``: their peak rate).
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


#: The model settings of :func:`train_members` (passed to :class:`~d2lmini.train.TinyLM`).
_MODEL_KEYS = ("num_hiddens", "num_heads", "num_layers", "norm", "placement", "bias", "ffn_num_hiddens")


def train_members(corpus: CharCorpus, members, num_steps: int, eval_steps, config: dict) -> dict:
    """Train one model per ``(act, seed, peak rate)`` member, all in one lockstep, and score them.

    Model ``i`` is :func:`d2lmini.train.seeded_tiny_lm` of ``seed_i`` with FFN ``act_i``; it
    reads the batches of ``seed_i`` and trains at peak rate ``rate_i`` (``lr_scales`` of
    :func:`d2lmini.train.train_models` relative to the highest rate: exactly the run alone
    when the rates are powers of two apart), so it gets the losses :func:`d2lmini.train.train_lm`
    gives it alone. After each of ``eval_steps`` every model is scored on the same
    :func:`validation_batches`. A module-level function, so that
    :func:`d2lmini.train.run_in_workers` can run it in a worker process.

    Args:
        corpus: the data; members: ``(act, seed, rate)`` triples; num_steps: optimizer steps.
        eval_steps: sorted steps in ``[1, num_steps]``.
        config: the model (``num_hiddens``, ``num_heads``, ``num_layers``, ``norm``,
            ``placement``, ``bias``, ``ffn_num_hiddens``) and the training (``batch_size``,
            ``seq_len``, ``warmup_steps``, ``schedule``, ``betas``, ``weight_decay``,
            ``clip_norm``, ``eval_batches``, ``vectorize``, ``device``).

    Returns:
        A dict of lists, one entry per member: ``train_loss``, ``val_loss``, ``num_params``,
        ``ffn_params``, ``state`` (its trained weights); and ``seconds`` (the whole call) and
        ``train_seconds`` (the steps alone).
    """
    start = time.perf_counter()
    device = config.get("device", "cpu")
    shape = {k: config.get(k) for k in _MODEL_KEYS}
    models = [seeded_tiny_lm(corpus.vocab_size, seed, max_len=config["seq_len"], act=act, **shape).to(device)
              for act, seed, _ in members]
    top = max(rate for _, _, rate in members)
    losses_of = lockstep_losses(models, config.get("vectorize", False))
    val = [(X.to(device), Y.to(device)) for X, Y in
           validation_batches(corpus, config["batch_size"], config["seq_len"], config["eval_batches"])]
    val_loss = [[] for _ in members]

    def validate(step, models, losses):
        if step + 1 in eval_steps:
            for history, value in zip(val_loss, validation_losses(losses_of, len(models), val)):
                history.append(value)

    log = train_models(models, corpus, [seed for _, seed, _ in members], num_steps, config["batch_size"],
                       config["seq_len"], top, config["warmup_steps"], config["schedule"], tuple(config["betas"]),
                       config["weight_decay"], vectorize=config.get("vectorize", False), stop_on_divergence=False,
                       on_step=validate, lr_scales=[rate / top for _, _, rate in members],
                       clip_norm=config.get("clip_norm"))
    return dict(train_loss=log.losses, val_loss=val_loss, num_params=[num_parameters(m) for m in models],
                ffn_params=[sum(num_parameters(block.ffn) for block in m.blocks) for m in models],
                state=[{k: v.detach().cpu() for k, v in m.state_dict().items()} for m in models],
                seconds=time.perf_counter() - start, train_seconds=log.seconds)


def _check_eval_steps(eval_steps, num_steps: int) -> list[int]:
    """Sorted distinct steps in ``[1, num_steps]``; None: six evenly spaced, the last one ``num_steps``."""
    if eval_steps is None:
        return sorted({max(1, round(num_steps * k / 6)) for k in range(1, 7)})
    if isinstance(eval_steps, (str, bytes)) or not hasattr(eval_steps, "__iter__"):
        raise TypeError(f"eval_steps must be a sequence of ints, got {type(eval_steps).__name__}")
    eval_steps = sorted({check_positive_int("eval_steps", s) for s in eval_steps})
    if eval_steps and eval_steps[-1] > num_steps:
        raise ValueError(f"eval_steps must lie in [1, num_steps={num_steps}], got {eval_steps}")
    return eval_steps


def _run_members(corpus, members, num_steps, eval_steps, config, workers) -> list[dict]:
    """:func:`train_members` over ``workers`` processes (contiguous shares of the members); one dict per member."""
    members = list(members)
    workers = min(workers, len(members))
    bounds = [round(i * len(members) / workers) for i in range(workers + 1)]
    chunks = [members[a:b] for a, b in zip(bounds, bounds[1:])]
    jobs = [dict(corpus=corpus, members=chunk, num_steps=num_steps, eval_steps=eval_steps, config=config)
            for chunk in chunks]
    outs = run_in_workers(train_members, jobs, num_workers=workers)
    results = []
    for chunk, out in zip(chunks, outs):
        for i in range(len(chunk)):
            results.append({key: out[key][i] for key in ("train_loss", "val_loss", "num_params", "ffn_params",
                                                         "state")}
                           | {"seconds": out["seconds"] / len(chunk),
                              "train_seconds": out["train_seconds"] / len(chunk)})
    return results


def _ensemble(act, seeds, parts, eval_steps, config) -> EnsembleRun:
    """One :class:`EnsembleRun` from the :func:`_run_members` results ``parts`` of ``act``'s seeds."""
    return EnsembleRun(act, list(seeds), parts[0]["num_params"], parts[0]["ffn_params"],
                       [p["train_loss"] for p in parts], list(eval_steps), [p["val_loss"] for p in parts],
                       sum(p["seconds"] for p in parts), sum(p["train_seconds"] for p in parts), config,
                       {k: torch.stack([p["state"][k] for p in parts]) for k in parts[0]["state"]})


def train_ensemble(corpus: CharCorpus, act: str = "swiglu", seeds=(0, 1, 2), num_steps: int = 600,
                   batch_size: int = 16, seq_len: int = 64, lr: float = 1e-2, warmup_steps: int = 50,
                   schedule: str = "cosine", betas: tuple[float, float] = (0.9, 0.95),
                   weight_decay: float = 0.0, clip_norm: float | None = 1.0, eval_steps=None,
                   eval_batches: int = 16, num_hiddens: int = 64, num_heads: int = 4, num_layers: int = 1,
                   norm: str = "rms", placement: str = "pre", bias: bool = False,
                   ffn_num_hiddens: int | None = None, vectorize: bool = False, device: str = "cpu") -> EnsembleRun:
    """Train one :class:`~d2lmini.train.TinyLM` per seed, all seeds in lockstep, and record losses.

    The book's one training loop, :func:`d2lmini.train.train_models`, with one model
    per seed (:func:`train_members`): every seed's model is what :func:`d2lmini.train.train_lm`
    trains with that seed -- the same initial weights, the same stream of random training
    batches, the same AdamW updates at the same scheduled learning rate
    (:func:`d2lmini.train.lr_at`), and the same losses. At every step each model
    computes its loss and gradients, then *one* ``foreach`` AdamW step updates the
    weights of all of them (AdamW acts on each number separately, so this equals one
    optimizer per model, with a few large kernel calls instead of many small ones).
    The validation is the loop's per-step hook. The defaults are :data:`COMPARISON_CONFIG`.

    With ``vectorize=True`` the models' weights are instead stacked along a new
    leading dimension and one forward pass of the real ``TinyLM`` is vectorized over
    that dimension (``torch.vmap`` over ``torch.func.functional_call``, see
    :func:`d2lmini.train.lockstep_losses`): one kernel launch serves every seed, the
    fast choice on a GPU; the results are the same up to rounding.

    Args:
        corpus: the data (:func:`d2lmini.data.python_reference_corpus`).
        act: FFN activation, one of :data:`d2lmini.ffn.ACTS`.
        seeds: distinct ints >= 0; seed ``s`` draws model ``s``'s weights and batches.
        num_steps: optimizer steps.
        batch_size, seq_len: training windows per step and characters per window.
        lr, warmup_steps, schedule: peak learning rate, linear warm-up steps and
            ``'constant'`` / ``'cosine'`` (to 10% at ``num_steps``), as in ``train_lm``.
        betas, weight_decay: AdamW's; clip_norm: each model's gradient norm cap (None: none).
        eval_steps: steps after which every model is scored on the same fixed
            validation batches (:func:`validation_batches`); each in ``[1, num_steps]``
            (None: six evenly spaced, the last after ``num_steps``).
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
    check_positive_int("seq_len", seq_len)  # also the models' max_len
    check_positive_int("eval_batches", eval_batches)
    check_positive_float("lr", lr)
    eval_steps = _check_eval_steps(eval_steps, num_steps)
    if not isinstance(vectorize, bool):
        raise TypeError(f"vectorize must be a bool, got {type(vectorize).__name__}")
    if clip_norm is not None:
        check_positive_float("clip_norm", clip_norm)
    if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
    config = dict(seeds=seeds, num_steps=num_steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
                  warmup_steps=warmup_steps, schedule=schedule, betas=tuple(betas), weight_decay=weight_decay,
                  clip_norm=clip_norm, eval_steps=eval_steps, eval_batches=eval_batches, vectorize=vectorize,
                  device=device, num_hiddens=num_hiddens, num_heads=num_heads, num_layers=num_layers, norm=norm,
                  placement=placement, bias=bias, act=act, ffn_num_hiddens=ffn_num_hiddens)
    parts = _run_members(corpus, [(act, seed, lr) for seed in seeds], num_steps, eval_steps, config, 1)
    return _ensemble(act, seeds, parts, eval_steps, config)


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
        runs: ``{act: [EnsembleRun per rate]}``, every model's record (one seed each).
    """

    acts: list[str]
    rates: list[float]
    seed: int
    val_loss: dict
    train_loss: dict = field(repr=False)
    seconds: float
    config: dict
    runs: dict = field(default_factory=dict, repr=False)

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


def _settings(overrides: dict, function: str) -> dict:
    """:data:`COMPARISON_CONFIG` with ``overrides`` (known keys, or ``device`` / ``vectorize`` / ``bias`` /
    ``ffn_num_hiddens``)."""
    known = set(COMPARISON_CONFIG) | {"device", "vectorize", "bias", "ffn_num_hiddens"}
    unknown = set(overrides) - known
    if unknown:
        raise TypeError(f"{function} got unknown settings {sorted(unknown)}; known: {sorted(known)}")
    config = {"bias": False, "ffn_num_hiddens": None, **COMPARISON_CONFIG, **overrides}
    check_positive_int("seq_len", config["seq_len"])
    check_positive_int("batch_size", config["batch_size"])
    check_positive_int("eval_batches", config["eval_batches"])
    return config


def lr_sweep(corpus: CharCorpus | None = None, acts=("gelu", "geglu", "swiglu"), rates=SWEEP_RATES,
             seed: int = 0, num_steps: int = 600, eval_steps=None, workers: int = 2, **overrides) -> LRSweep:
    """Train the comparison's model with every FFN at every peak learning rate, one seed.

    The ``len(acts) * len(rates)`` models train in lockstep (:func:`train_members`, with
    ``lr_scales``), shared between ``workers`` processes (:func:`d2lmini.train.run_in_workers`):
    each model gets exactly the steps it would get alone with its own peak rate, whatever
    ``workers``, for rates a power of two apart such as :data:`SWEEP_RATES` (else up to the
    rounding of the rate). Everything else is :data:`COMPARISON_CONFIG` (warm-up, cosine
    decay to 10% at ``num_steps``, batches, clipping), and every model is scored after each
    of ``eval_steps`` on the comparison's fixed validation batches (:func:`validation_batches`).

    Args:
        corpus: the data (default :func:`d2lmini.data.python_reference_corpus`).
        acts: activations (names from :data:`d2lmini.ffn.ACTS`, distinct).
        rates: distinct peak learning rates (> 0).
        seed: the seed of every model's weights and batches.
        num_steps: training steps per model.
        eval_steps: validation steps (None: six evenly spaced, the last after ``num_steps``).
        workers: worker processes (one torch thread each; 1: here, one model after another).
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
    eval_steps = _check_eval_steps(eval_steps, num_steps)
    workers = check_positive_int("workers", workers)
    if "lr" in overrides:
        raise TypeError("lr_sweep sets the learning rates itself; pass rates=...")
    config = _settings(overrides, "lr_sweep")
    del config["lr"]
    config |= dict(num_steps=num_steps, eval_steps=eval_steps)
    corpus = python_reference_corpus() if corpus is None else corpus
    start = time.perf_counter()
    pairs = [(act, rate) for act in acts for rate in rates]
    parts = _run_members(corpus, [(act, seed, rate) for act, rate in pairs], num_steps, eval_steps, config, workers)
    runs = {act: [] for act in acts}
    for (act, rate), part in zip(pairs, parts):
        runs[act].append(_ensemble(act, [seed], [part], eval_steps, {**config, "act": act, "lr": rate}))
    return LRSweep(acts, rates, seed, {act: [run.val_loss[0][-1] for run in runs[act]] for act in acts},
                   {act: [run.train_loss[0] for run in runs[act]] for act in acts},
                   time.perf_counter() - start, config, runs)


# --------------------------------------------------------------------------------------
# The chapter's comparison: GELU MLP against GeGLU and SwiGLU
# --------------------------------------------------------------------------------------

@dataclass
class FFNComparison:
    """The result of :func:`ffn_comparison`.

    Attributes:
        runs: ``{act: EnsembleRun}``, one entry per activation, same seeds in the same order.
        corpus_chars: characters in the whole text (training + validation).
        corpus_sha256: hex SHA-256 of the text.
        vocab_size: distinct characters.
        seconds: wall time of the whole comparison (sweep, every activation and seed).
        config: the settings shared by every run (``rates``: each activation's peak rate).
        sweep: the :class:`LRSweep` on the first seed that chose the rates, or None.
        flops: the model FLOPs of all that training (:meth:`training_flops`).
    """

    runs: dict
    corpus_chars: int
    corpus_sha256: str
    vocab_size: int
    seconds: float
    config: dict
    sweep: LRSweep | None = field(default=None, repr=False)
    flops: float = 0.0

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

    def gap_table(self, pairs=(("gelu", "geglu"), ("gelu", "swiglu"), ("swiglu", "geglu"))):
        """A ``pandas.DataFrame``: per validation step (rows), for each ``(baseline, other)`` pair the
        mean of ``baseline``'s minus ``other``'s loss over the seeds and its seed spread (the sample
        standard deviation of the per-seed differences)."""
        import pandas as pd

        columns = {}
        for baseline, other in pairs:
            name = f"{ACT_LABELS.get(baseline, baseline)} − {ACT_LABELS.get(other, other)}"
            rows = [self.summary(step, baseline, other) for step in self.val_steps]
            columns[(name, "mean")] = [r["mean"] for r in rows]
            columns[(name, "spread")] = [r["std"] for r in rows]
        return pd.DataFrame(columns, index=pd.Index(self.val_steps, name="step"))

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

    def training_flops(self) -> float:
        """Model FLOPs of all the training, the sweep's models included, as
        :func:`d2lmini.train.training_tally` counted them (``6 N + 12 L n d`` a token, see
        :func:`d2lmini.train.flops_per_token`)."""
        return self.flops

    def _run(self, act: str) -> EnsembleRun:
        if act not in self.runs:
            raise ValueError(f"act must be one of the compared activations {tuple(self.runs)}, got {act!r}")
        return self.runs[act]


def ffn_comparison(corpus: CharCorpus | None = None, acts=("gelu", "geglu", "swiglu"), seeds=(0, 1, 2),
                   num_steps: int = 600, eval_steps=None, workers: int = 2, rates=SWEEP_RATES,
                   **overrides) -> FFNComparison:
    """Train the same small character LM with each FFN activation, over several seeds.

    The chapter's experiment: for every activation in ``acts`` (by default a GELU MLP
    of width ``4d`` against GeGLU and SwiGLU of width ``8d/3``, matched in parameters)
    and every seed, a :class:`~d2lmini.train.TinyLM` with the settings of
    :data:`COMPARISON_CONFIG` is trained for ``num_steps`` AdamW steps. Seed ``s`` fixes
    the initial weights and the batch stream, so the models of one seed see the same
    characters in the same order and start with the same embeddings, attention and norms
    (the FFN differs, and so does the output layer, drawn after it). Every model is scored after each
    of ``eval_steps`` on the same held-out batches.

    With a sequence of ``rates`` (the default, :data:`SWEEP_RATES`), each activation trains
    at every rate with the first seed (:func:`lr_sweep`), and the other seeds train at the
    rate where that seed's final validation loss was lowest; the first seed's model at that
    rate is one of the comparison's. Both stages share their models between ``workers``
    processes (:func:`train_members` on :func:`d2lmini.train.run_in_workers`); the numbers
    do not depend on ``workers``.

    Args:
        corpus: the data (default :func:`d2lmini.data.python_reference_corpus`).
        acts: activations to compare (names from :data:`d2lmini.ffn.ACTS`, distinct).
        seeds: distinct ints >= 0.
        num_steps: training steps per model.
        eval_steps: steps after which the validation loss is recorded (None: six evenly
            spaced, the last after ``num_steps``).
        workers: worker processes, one torch thread each (1: here, one after another).
        rates: a sequence of peak rates to choose from on the first seed, as above; or
            ``{act: peak rate}`` for activations that train at a fixed rate (the others at
            the configuration's ``lr``); or None (every activation at ``lr``).
            ``config["rates"]`` of the result holds every activation's rate.
        **overrides: replace entries of :data:`COMPARISON_CONFIG` (e.g. ``lr``,
            ``num_hiddens``, ``batch_size``), or ``device``, ``vectorize``.

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
    acts = [check_choice("acts", act, ACTS) for act in acts]
    if len(set(acts)) != len(acts):
        raise ValueError(f"acts must be distinct, got {acts}")
    seeds = _check_seeds(seeds)
    num_steps = check_positive_int("num_steps", num_steps)
    eval_steps = _check_eval_steps(eval_steps, num_steps)
    workers = check_positive_int("workers", workers)
    config = _settings(overrides, "ffn_comparison")
    check_positive_float("lr", config["lr"])
    corpus = python_reference_corpus() if corpus is None else corpus
    start, tally = time.perf_counter(), training_tally()["flops"]
    sweep = None
    if rates is None or isinstance(rates, dict):
        rates = {} if rates is None else rates
        for act, rate in rates.items():
            check_choice("rates", act, acts)
            check_positive_float(f"rates[{act!r}]", rate)
        chosen = {act: float(rates.get(act, config["lr"])) for act in acts}
        todo = seeds
    elif isinstance(rates, (list, tuple)):
        sweep = lr_sweep(corpus, acts, rates, seeds[0], num_steps, eval_steps, workers,
                         **{k: v for k, v in overrides.items() if k != "lr"})
        chosen = {act: sweep.best_rate(act) for act in acts}
        todo = seeds[1:]
    else:
        raise TypeError(f"rates must be a sequence of peak rates, a dict {{act: peak rate}} or None, "
                        f"got {type(rates).__name__}")
    config |= dict(num_steps=num_steps, eval_steps=eval_steps, rates=chosen)
    members = [(act, seed, chosen[act]) for act in acts for seed in todo]
    parts = _run_members(corpus, members, num_steps, eval_steps, config, workers) if members else []
    runs = {}
    for act in acts:
        own = [part for (a, _, _), part in zip(members, parts) if a == act]
        if sweep is not None:
            own = [_member_of(sweep.runs[act][sweep.rates.index(chosen[act])])] + own
        runs[act] = _ensemble(act, seeds, own, eval_steps, {**config, "act": act, "lr": chosen[act]})
    return FFNComparison(runs, len(corpus.text), corpus.sha256, corpus.vocab_size,
                         time.perf_counter() - start, config, sweep, training_tally()["flops"] - tally)


def _member_of(run: EnsembleRun) -> dict:
    """The :func:`_run_members` record of a one-seed :class:`EnsembleRun`."""
    return dict(train_loss=run.train_loss[0], val_loss=run.val_loss[0], num_params=run.num_params,
                ffn_params=run.ffn_params, state={k: v[0] for k, v in run.state.items()},
                seconds=run.seconds, train_seconds=run.train_seconds)


#: Markers of the seeds in :func:`plot_ffn_comparison`; the colour says which FFN.
_SEED_MARKERS = ("o", "s", "^", "D")


def plot_ffn_comparison(result: FFNComparison, baseline: str = "gelu", others=None,
                        width: float = 9.0, height: float = 3.4):
    """Validation losses of every activation (left) and the gaps to ``baseline`` (right).

    Left: per activation, the mean validation loss over the seeds at each of
    ``result.val_steps``, with a band from the lowest to the highest seed. Right: for each
    of ``others``, ``baseline``'s validation loss minus its own (above zero: the other is
    ahead; the models of a seed read the same batches), the mean over the seeds as a line,
    a band of twice the seed spread (sample standard deviation) around it, and each seed's
    gap as a marker (one shape per seed, named in the legend). The legends sit below the panels,
    off the data.

    Args:
        result: an :class:`FFNComparison` (at most four seeds).
        baseline: the activation the others are measured against.
        others: activations to contrast (default: every other one of the comparison).
        width, height: figure size in inches.

    Returns:
        A pyplot-free ``matplotlib.figure.Figure``.

    Raises:
        ValueError: if an activation was not part of the comparison, or there are more
            seeds than markers.
    """
    result._run(baseline)
    others = [act for act in result.runs if act != baseline] if others is None else list(others)
    for act in others:
        result._run(act)
    if len(result.seeds) > len(_SEED_MARKERS):
        raise ValueError(f"result must have at most {len(_SEED_MARKERS)} seeds, got {len(result.seeds)}")
    steps = result.val_steps
    with styled_figure(2, width=width, height=height) as (fig, (ax, ax_gap)):
        for act in [baseline, *others]:
            run = result.runs[act]
            per_step = list(zip(*run.val_loss))                                 # [step][seed]
            color = ACT_COLORS.get(act)
            ax.fill_between(steps, [min(v) for v in per_step], [max(v) for v in per_step], color=color,
                            alpha=0.2, linewidth=0)
            ax.plot(steps, [statistics.fmean(v) for v in per_step], color=color, marker="o", markersize=3.5,
                    linewidth=1.5, label=ACT_LABELS.get(act, act))
        ax.set(xlabel="training step", ylabel="validation loss (nats / char)", title="Loss, mean over seeds")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(others) + 1, fontsize=9,
                  frameon=False)
        base = ACT_LABELS.get(baseline, baseline)
        for act in others:
            color = ACT_COLORS.get(act)
            rows = [result.summary(step, baseline, act) for step in steps]
            mean = [r["mean"] for r in rows]
            ax_gap.fill_between(steps, [m - 2 * r["std"] for m, r in zip(mean, rows)],
                                [m + 2 * r["std"] for m, r in zip(mean, rows)], color=color, alpha=0.15,
                                linewidth=0)
            ax_gap.plot(steps, mean, color=color, linewidth=1.5, label=f"{base} − {ACT_LABELS.get(act, act)}")
            gaps = [result.differences(step, baseline, act) for step in steps]  # [step][seed]
            for i, _ in enumerate(result.seeds):
                ax_gap.plot(steps, [g[i] for g in gaps], color=color, linestyle="none", marker=_SEED_MARKERS[i],
                            markersize=3.5, alpha=0.8)
        ax_gap.axhline(0.0, color="0.6", linewidth=1.0)
        ax_gap.set(xlabel="training step", ylabel="difference (nats / char)",
                   title=f"{base} minus each other FFN (> 0: the other is ahead)")
        handles, _ = ax_gap.get_legend_handles_labels()  # the means, then a grey marker per seed
        handles += [Line2D([], [], color="0.35", linestyle="none", marker=_SEED_MARKERS[i], markersize=3.5,
                           label=f"seed {seed}") for i, seed in enumerate(result.seeds)]
        ax_gap.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25),
                      ncol=max(len(others), len(result.seeds)), fontsize=9, frameon=False)
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
def balance_by_bias(
    moe: MixtureOfExperts, tokens: torch.Tensor, num_updates: int, gamma: float
) -> list:
    """DeepSeek-V3's balancing without an auxiliary loss, on fixed ``tokens`` ``(T, d)``.

    After each round of routing, every overloaded expert's ``expert_bias`` drops by
    ``gamma`` and every underloaded one's rises by ``gamma``. The bias only changes which
    experts are chosen, not their weights. Returns each round's load per expert, as a
    multiple of the fair share ``top_k T / E`` (``num_updates + 1`` tensors ``(E,)``).
    """
    loads = []
    with torch.no_grad():
        for update in range(num_updates + 1):
            # (T, top_k) chosen experts
            _, experts = moe.route(tokens)
            load = torch.bincount(experts.flatten(), minlength=moe.num_experts).float()
            # 1.0: the fair share
            loads.append(load / load.mean())
            if update < num_updates:
                # up if underloaded, down if over
                moe.expert_bias += gamma * torch.sign(load.mean() - load)
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
    "train_ensemble", "train_members", "validation_batches", "validation_losses",
]
