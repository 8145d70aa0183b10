"""The 2026 block: the 2017 block in five substitutions, both trained.

Introduced in the chapter "The 2026 block". It holds what that chapter shows:

* :func:`constructor_groups` -- the arguments of :class:`~d2lmini.block.TransformerBlock`
  grouped as sizes, flags the chapters teach, factories, and the options only the
  converters of released models need;
* :func:`substitution_steps` -- the 2017 block turned into the 2026 block, one
  constructor argument at a time (:func:`step_table`), and :func:`rope_relative_check`
  for the exercises;
* :func:`train_capstone` -- the 2017 and the 2026 block trained as character language
  models of one size (:class:`~d2lmini.lm.LanguageModel`) with the book's recipe, at two rates
  and with a second seed (:func:`capstone_table`, :func:`plot_capstone`), and one substitution
  at a time with two seeds per step (:func:`lm_walk`, :func:`train_walk_step`,
  :func:`walk_table`), spread over two worker processes; :func:`sample_explorer` and
  :func:`sampled_word_shares`, their samples and how many of their words the corpus holds;
  :func:`cache_measurements`, decoding with and without the key/value cache.

The catalogue of released blocks that the appendix "The Block Zoo" shows is
:mod:`d2lmini.chapters.zoo`.

Shapes use the legend b = batch, n = num_steps, d = num_hiddens.
"""

from __future__ import annotations

import inspect
import math
import re
import time
from dataclasses import KW_ONLY, dataclass, field

import torch

from .._checks import check_bool, check_instance, check_positive_float, check_positive_int, check_seed
from .._shown import shown_in
from ..attention import apply_rotary, rotary_cos_sin
from ..block import ATTENTION_OPTIONS, TransformerBlock
from ..cache import KVCache
from ..lm import LanguageModel, generate
from ..widgets import TextExplorer
from ..data import frequency_loss
from ..train import RECIPE, moving_average, run_in_workers, train_models, validation_loss
from ..lm import sinusoidal_positions  # re-exported: the exercises use it
from ..parameters import BLOCK_PARTS, num_parameters
from ..plot import plot_loss_curves, styled_figure
from ..seeding import seeded

# --------------------------------------------------------------------------- the constructor

#: The arguments of :class:`~d2lmini.block.TransformerBlock` the chapters teach, by group:
#: sizes (the weight matrices' shapes), flags (the variants Parts I and II measure, with
#: ``residual``, chapter 2's switch for the skips, and the norms' ``eps``), factories
#: (a whole sublayer handed over) and long context (the sliding window of chapter 8, the
#: sinks and RoPE's partial rotation and scaling of chapter 11). Every other argument is
#: an option only a released model's converter needs (:func:`constructor_groups`).
CONSTRUCTOR_GROUPS = {
    "sizes": ("num_hiddens", "num_heads", "num_kv_heads", "head_dim", "ffn_num_hiddens"),
    "flags": ("norm", "placement", "act", "bias", "causal", "qk_norm", "rope_theta", "residual", "eps", "dropout"),
    "factories": ("attn_factory", "ffn_factory"),
    "long context": ("window", "sinks", "rope_scaling"),
}


def constructor_arguments() -> list[str]:
    """Every option a ``TransformerBlock`` takes, read from the signatures, in order.

    Returns:
        The named arguments of :class:`~d2lmini.block.TransformerBlock` (``self`` and
        ``**attention_kwargs`` left out), then the :class:`~d2lmini.attention.MultiHeadAttention`
        options ``**attention_kwargs`` passes on (:data:`~d2lmini.block.ATTENTION_OPTIONS`, less
        ``dropout`` and ``bias``, which the block names itself), then the two stream scalings of
        :meth:`~d2lmini.block.TransformerBlock.set_scales`.

    Introduced in the chapter "The 2026 block".
    """
    params = inspect.signature(TransformerBlock.__init__).parameters.values()
    named = [p.name for p in params if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    scales = [n for n in inspect.signature(TransformerBlock.set_scales).parameters if n != "self"]
    return named + [n for n in ATTENTION_OPTIONS if n not in named] + scales


def constructor_groups() -> dict[str, list[str]]:
    """The arguments of ``TransformerBlock(...)``, grouped, read from its signatures (:func:`constructor_arguments`).

    Returns:
        ``{group: [argument, ...]}`` with the groups of :data:`CONSTRUCTOR_GROUPS` in their
        order and, last, ``'released models'``: every other argument, in signature order
        (the options the converters of :mod:`d2lmini.reference` set; the appendix "The
        block zoo" uses them).

    Raises:
        KeyError: if an argument of :data:`CONSTRUCTOR_GROUPS` is no longer in the
            constructor (so the chapter's list cannot name an argument that is gone).

    Introduced in the chapter "The 2026 block".
    """
    names = constructor_arguments()
    grouped = [n for group in CONSTRUCTOR_GROUPS.values() for n in group]
    gone = [n for n in grouped if n not in names]
    if gone:
        raise KeyError(f"CONSTRUCTOR_GROUPS names arguments TransformerBlock no longer has: {gone}")
    return {**{group: list(args) for group, args in CONSTRUCTOR_GROUPS.items()},
            "released models": [n for n in names if n not in grouped]}


# --------------------------------------------------------------------------- 2017 -> 2026


#: The 2017 block, as ``TransformerBlock`` arguments (Vaswani et al., 2017), built causal
#: so that every step of :data:`SUBSTITUTIONS` is a decoder-only block.
BLOCK_2017 = dict(norm="layer", act="relu", placement="post", bias=True, causal=True)

#: The substitutions from the 2017 block to the 2026 block, in order: (short name,
#: what changes, the constructor arguments that change, whether it is one of the five
#: core substitutions). The last two are the extras of the 2026 block.
SUBSTITUTIONS = (
    ("LayerNorm → RMSNorm", "norm='rms'", dict(norm="rms"), True),
    ("post-LN → pre-LN", "placement='pre'", dict(placement="pre"), True),
    ("MHA → GQA", "num_kv_heads=h/4", dict(num_kv_heads="h/4"), True),
    ("ReLU FFN → SwiGLU", "act='swiglu'", dict(act="swiglu"), True),
    ("sinusoidal → RoPE", "rope_theta=1e4", dict(rope_theta=10000.0), True),
    ("drop the biases", "bias=False", dict(bias=False), False),
    ("+ QK-norm", "qk_norm='per_head'", dict(qk_norm="per_head"), False),
)


@dataclass
class Step:
    """One block of :func:`substitution_steps`.

    Attributes:
        name: what changed (``'2017 Transformer'`` for the start).
        flag: the constructor argument that changed (``''`` for the start).
        core: whether it is one of the five core substitutions.
        kwargs: all ``TransformerBlock`` arguments of this block (after ``num_hiddens``, ``num_heads``).
        parameters: ``{'attention', 'ffn', 'norms', 'total'}`` counts.
        kv_cache_per_token: keys and values a decoder caches per token and block.
        output_shape: shape of the block's output on the test batch.
    """

    name: str
    flag: str
    _: KW_ONLY
    core: bool
    kwargs: dict
    parameters: dict
    kv_cache_per_token: int
    output_shape: tuple = field(default_factory=tuple)


@shown_in("ch09")
def substitution_steps(num_hiddens: int = 512, num_heads: int = 8, batch_size: int = 2,
                       num_steps: int = 16, seed: int = 0) -> list[Step]:
    """Turn the 2017 block into the 2026 block one constructor argument at a time.

    Starts from :data:`BLOCK_2017` and applies :data:`SUBSTITUTIONS` cumulatively; each
    block is built (seeded), counted per part (:data:`~d2lmini.parameters.BLOCK_PARTS`)
    and run on one random ``(b, n, d)`` batch.

    Args:
        num_hiddens, num_heads: ``d`` and ``h`` (``h`` divisible by 4 for the GQA step).
        batch_size, num_steps: the test batch; seed: seeds the weights and the batch.

    Returns:
        ``len(SUBSTITUTIONS) + 1`` :class:`Step` records, the 2017 block first.

    Raises:
        ValueError: if ``num_heads`` is not divisible by 4, or for sizes the block rejects.

    Introduced in the chapter "The 2026 block".
    """
    num_hiddens = check_positive_int("num_hiddens", num_hiddens)
    if check_positive_int("num_heads", num_heads) % 4:
        raise ValueError("num_heads must be divisible by 4 "
                         f"(GQA uses h/4 key/value heads), got {num_heads}")
    kwargs, steps = dict(BLOCK_2017), []
    walk = (("2017 Transformer", "", {}, True),) + SUBSTITUTIONS  # the 2017 block first
    with seeded(seed):
        X = torch.randn(check_positive_int("batch_size", batch_size),
                        check_positive_int("num_steps", num_steps), num_hiddens)
        for name, flag, change, core in walk:
            kwargs.update({k: (num_heads // 4 if v == "h/4" else v)
                           for k, v in change.items()})
            block = TransformerBlock(num_hiddens, num_heads, **kwargs)
            with torch.no_grad():
                shape = tuple(block(X).shape)
            att = block.attention
            steps.append(Step(name, flag, core=core, kwargs=dict(kwargs),
                              parameters=num_parameters(block, BLOCK_PARTS),
                              kv_cache_per_token=2 * att.num_kv_heads * att.head_dim,
                              output_shape=shape))
    return steps


def step_table(steps: list[Step], formatted: bool = False):
    """A pandas DataFrame of :func:`substitution_steps`: change, flag, parameters, their change, K/V cache.

    Args:
        steps: from :func:`substitution_steps`.
        formatted: if ``True``, the numbers are strings for display (thousands
            separators; the change with its sign).

    Returns:
        DataFrame indexed by step name with columns ``flag``, ``parameters``,
        ``Δ parameters`` (against the previous row), ``of which FFN`` and ``K/V numbers per token and block`` (integers,
        or strings when ``formatted``).

    Raises:
        TypeError: if ``formatted`` is not a bool.
    """
    check_bool("formatted", formatted)
    import pandas as pd  # the book has pandas; the package itself does not need it

    records, previous = [], None
    for step in steps:
        total = step.parameters["total"]
        delta = 0 if previous is None else total - previous
        records.append({"step": step.name, "flag": step.flag or "(start)",
                        "parameters": f"{total:,}" if formatted else total,
                        "Δ parameters": (f"{delta:+,}" if delta else "0") if formatted else delta,
                        "of which FFN": f"{step.parameters['ffn']:,}" if formatted else step.parameters["ffn"],
                        "K/V numbers per token and block": f"{step.kv_cache_per_token:,}" if formatted else step.kv_cache_per_token})
        previous = total
    return pd.DataFrame(records).set_index("step")


def rope_relative_check(num_hiddens: int = 64, head_dim: int = 32, num_tokens: int = 4, num_steps: int = 24,
                        shifts=(1, 5, 17), theta: float = 10000.0, seed: int = 0) -> dict:
    r"""Does an attention logit change when both positions move by the same shift?

    For every pair of ``num_tokens`` random tokens ``(a, b)`` at positions ``(p, p')``,
    ``p, p' < num_steps``, computes the logit ``q_a(p) . k_b(p')`` (random ``W_q``, ``W_k``
    of shape ``d x head_dim``, even ``head_dim``) with RoPE (Su et al., 2021) and with
    sinusoids added to the tokens (Vaswani et al., 2017), then again with both
    positions moved by each shift ``s`` in ``shifts``; ``theta`` is the RoPE base.

    Returns:
        dict with ``rope_max_abs_diff`` and ``sinusoidal_max_abs_diff`` (largest change
        of any logit under any shift) and ``max_abs_logit`` (the logits' scale).

    Raises:
        ValueError / TypeError: for non-positive sizes or an odd ``head_dim``.

    Introduced in the chapter "The 2026 block".
    """
    check_positive_int("num_tokens", num_tokens)
    n = check_positive_int("num_steps", num_steps)
    total = n + max(shifts)
    with seeded(seed):
        tokens = torch.randn(num_tokens, num_hiddens)
        W_q = torch.randn(num_hiddens, head_dim) / math.sqrt(num_hiddens)
        W_k = torch.randn(num_hiddens, head_dim) / math.sqrt(num_hiddens)
    cos, sin = rotary_cos_sin(total, head_dim, theta)
    q = apply_rotary((tokens @ W_q)[:, None, :].expand(-1, total, -1), cos, sin)  # (tokens, positions, hd)
    k = apply_rotary((tokens @ W_k)[:, None, :].expand(-1, total, -1), cos, sin)
    rope = torch.einsum("aph,bqh->abpq", q, k)
    X = tokens[:, None, :] + sinusoidal_positions(total, num_hiddens)[None]  # (tokens, positions, d)
    absolute = torch.einsum("aph,bqh->abpq", X @ W_q, X @ W_k)
    diffs = {"rope": 0.0, "sinusoidal": 0.0}
    for s in shifts:
        for key, L in (("rope", rope), ("sinusoidal", absolute)):
            diffs[key] = max(diffs[key], float((L[..., s:s + n, s:s + n] - L[..., :n, :n]).abs().max()))
    return {"rope_max_abs_diff": diffs["rope"], "sinusoidal_max_abs_diff": diffs["sinusoidal"],
            "max_abs_logit": float(torch.cat([rope.flatten(), absolute.flatten()]).abs().max())}


# --------------------------------------------------------------------------- the capstone: both blocks trained

#: The capstone's character language models (:class:`~d2lmini.lm.LanguageModel`): 4 blocks of
#: width 64 with 4 heads, a context of 64 characters. Shallow enough that post-LN trains (chapter 4
#: shows where depth breaks it), wide enough that a training step is arithmetic, not overhead.
CAPSTONE_MODEL = dict(num_blocks=4, num_hiddens=64, num_heads=4, context_len=64)

#: Their training: the book's recipe (:data:`~d2lmini.train.RECIPE`: warm-up, cosine decay,
#: clipping) on batches of 16 windows of 64 characters (1,024 tokens a step), for 1,000 steps.
CAPSTONE_TRAINING = dict(RECIPE, batch_size=16, num_steps=1000)

#: The peak learning rates swept for each block (seed 0).
RATES = (0.005, 0.01)

#: The substitution walk: every model of :func:`lm_walk` at :data:`WALK_SEEDS`, trained smaller and
#: shorter than the headline pair (2 blocks, 200 steps of the same recipe) at :data:`WALK_RATE`.
WALK_DEPTH, WALK_STEPS, WALK_RATE, WALK_SEEDS = 2, 200, 0.01, (0, 1)

#: The 2017 block in a language model (Vaswani et al., 2017): post-LN, LayerNorm, a ReLU FFN of
#: width 4d, multi-head attention, biases, and the paper's sinusoidal positions added to the input
#: (section 3.5; learned ones did as well after 100,000 steps, Table 3 row E, but start from nothing).
LM_2017 = dict(positions="sinusoidal", norm="layer", act="relu", placement="post", bias=True)


def lm_walk(num_kv_heads: int = 2) -> list[tuple[str, dict]]:
    """The language models from the 2017 block to the 2026 block, one substitution of
    :data:`SUBSTITUTIONS` at a time: ``(name, LanguageModel kwargs)``, the 2017 block first.

    The GQA step keeps ``num_kv_heads`` key/value heads; the RoPE step replaces the sinusoidal
    positions (``positions='rope'``).
    """
    kwargs, walk = dict(LM_2017), [("2017 block", dict(LM_2017))]
    for name, _, change, _ in SUBSTITUTIONS:
        for key, value in change.items():
            if key == "rope_theta":
                kwargs["positions"] = "rope"
            else:
                kwargs[key] = num_kv_heads if value == "h/4" else value
        walk.append((name, dict(kwargs)))
    return walk


def matched_ffn_num_hiddens(vocab_size: int, kwargs: dict, target: int, num_blocks: int | None = None) -> int:
    """The FFN width at which a :class:`~d2lmini.lm.LanguageModel` of :data:`CAPSTONE_MODEL` (``num_blocks``
    deep, if given) and ``kwargs`` holds closest to ``target`` parameters (counted on the ``meta`` device:
    the count is linear in the width).

    Raises:
        ValueError / TypeError: sizes that are not positive ints, ``kwargs`` that set
            ``ffn_num_hiddens`` themselves, or a ``target`` no width >= 1 reaches.
    """
    check_positive_int("vocab_size", vocab_size)
    check_positive_int("target", target)
    if "ffn_num_hiddens" in kwargs:
        raise ValueError("kwargs must leave ffn_num_hiddens out: it is what this function chooses")
    if num_blocks is not None:
        check_positive_int("num_blocks", num_blocks)

    def count(width):
        return model_parameters(vocab_size, dict(kwargs, ffn_num_hiddens=width), num_blocks)
    base, per_unit = count(64), count(65) - count(64)
    width = round(64 + (target - base) / per_unit)
    if width < 1:
        raise ValueError(f"no FFN width reaches target={target} parameters (width 1 holds {count(1)})")
    return width


def model_parameters(vocab_size: int, kwargs: dict, num_blocks: int | None = None) -> int:
    """Parameters of the language model of :data:`CAPSTONE_MODEL` (``num_blocks`` deep, if given) and
    ``kwargs``, counted on the ``meta`` device (no weights are drawn)."""
    shape = dict(CAPSTONE_MODEL, **({} if num_blocks is None else {"num_blocks": num_blocks}))
    with torch.device("meta"):
        return num_parameters(LanguageModel(vocab_size, **shape, **kwargs))


@dataclass
class Run:
    """One trained language model of the capstone.

    Attributes:
        name: the block (``'2017 block'``, ``'2026 block'`` or a step of :func:`lm_walk`).
        rate, seed: its peak learning rate and its seed (weights and batches).
        parameters: its parameter count.
        train_loss: the training loss of every step (nats per character).
        val_loss: the validation loss after training, over the whole validation split
            (:func:`~d2lmini.train.validation_loss`).
        model: the trained model.
        val_curve: ``(step, validation loss)`` during training, if it was recorded (else empty).
    """

    name: str
    rate: float
    seed: int
    parameters: int
    train_loss: list
    val_loss: float
    model: LanguageModel = field(repr=False)
    val_curve: list = field(default_factory=list)

    @property
    def depth(self) -> int:
        """The number of blocks (:data:`CAPSTONE_MODEL`'s for the headline pair, :data:`WALK_DEPTH` in the walk)."""
        return len(self.model.blocks)

    @property
    def final_loss(self) -> float:
        """Mean training loss of the last 50 steps."""
        return sum(self.train_loss[-50:]) / len(self.train_loss[-50:])

    def smoothed(self, window: int = 50) -> list[float]:
        """Training loss averaged over the last ``window`` steps at every step."""
        return moving_average(self.train_loss, window)


#: Colours of the capstone's rates and seeds.
RATE_COLORS = {"rate 0.005": "#2471a3", "rate 0.01": "#c0392b", "rate 0.005, seed 1": "#85c1e9",
               "rate 0.01, seed 1": "#f1948a"}


def plot_capstone(runs: list[Run], corpus):
    """Training loss (50-step mean, lines) and validation loss (dots) of the 2017 block (left) and the
    2026 block (right) of the headline pair at each rate and seed, with the loss on the training
    text of predicting each character from its frequency alone (the yardstick of the lines)."""
    with styled_figure(2, width=10, height=3.6, sharey=True) as (fig, axes):
        for ax, name in zip(axes, ("2017 block", "2026 block")):
            ax.axhline(frequency_loss(corpus, split="train"), ls=":", color="#7f8c8d",
                       label="character frequencies alone, training text")
            curves = {f"rate {r.rate:g}" + (f", seed {r.seed}" if r.seed else ""): r
                      for r in runs if r.name == name and r.depth == CAPSTONE_MODEL["num_blocks"]}
            plot_loss_curves(curves, fig=fig, ax=ax, title=name, colors=RATE_COLORS, window=50)
            for label, run in curves.items():
                steps, losses = zip(*run.val_curve)
                ax.plot(steps, losses, "o", ms=3.5, color=RATE_COLORS.get(label))
            ax.set_ylim(1.0, 3.4)
        axes[0].set_ylabel("loss (nats per character)")
        axes[1].set_ylabel("")
    return fig


def train_group(corpus, runs: list[tuple[str, dict, float, int]], target: int | None = None,
                num_blocks: int | None = None, num_steps: int | None = None, vectorize: bool = False,
                eval_every: int | None = None) -> list[Run]:
    """Train language models of :data:`CAPSTONE_MODEL` on ``corpus`` in one lockstep, as :func:`train_capstone` does.

    Args:
        corpus: a :class:`~d2lmini.data.CharCorpus` (the book's: ``python_reference_corpus()``).
        runs: ``(name, LanguageModel kwargs, peak rate, seed)`` per model (e.g. from :func:`lm_walk`).
        target: a parameter count every model's FFN width is matched to at its depth
            (:func:`matched_ffn_num_hiddens`), or ``None`` for the default widths.
        num_blocks: the depth, if not :data:`CAPSTONE_MODEL`'s.
        num_steps: the training steps, if not :data:`CAPSTONE_TRAINING`'s (the rest of the recipe is its).
        vectorize: train under ``torch.vmap`` (all models of one architecture).
        eval_every: record every model's validation loss every so many steps (``Run.val_curve``), or ``None``.

    Returns:
        One :class:`Run` per model.

    Raises:
        ValueError / TypeError: empty ``runs``, a run that is not ``(name, kwargs, rate, seed)`` with a
            rate > 0, or arguments the model or the training loop rejects.
    """
    if not isinstance(runs, (list, tuple)) or not runs:
        raise ValueError("runs must be a non-empty list of (name, kwargs, rate, seed)")
    for run in runs:
        if not isinstance(run, (list, tuple)) or len(run) != 4 or not isinstance(run[1], dict):
            raise TypeError(f"every run must be (name, LanguageModel kwargs, rate, seed), got {run!r}")
        check_positive_float("rate", run[2])
    shape = dict(CAPSTONE_MODEL, **({} if num_blocks is None else {"num_blocks": check_positive_int("num_blocks",
                                                                                                    num_blocks)}))
    training = dict(CAPSTONE_TRAINING, **({} if num_steps is None else {"num_steps": num_steps}))
    models = []
    for name, kwargs, rate, seed in runs:
        width = None if target is None else matched_ffn_num_hiddens(corpus.vocab_size, kwargs, target,
                                                                    shape["num_blocks"])
        with seeded(seed):
            models.append(LanguageModel(corpus.vocab_size, **shape, ffn_num_hiddens=width, **kwargs))
    curves = [[] for _ in models]

    def validate(step, models, losses):
        if eval_every is not None and (step + 1) % eval_every == 0:
            for curve, model in zip(curves, models):
                curve.append((step + 1, validation_loss(model, corpus, training["seq_len"])))

    if eval_every is not None:
        check_positive_int("eval_every", eval_every)
    base = runs[0][2]
    log = train_models(models, corpus, [seed for *_, seed in runs], lr=base,
                       lr_scales=[rate / base for _, _, rate, _ in runs], vectorize=vectorize,
                       stop_on_divergence=False, on_step=validate, **training)
    return [Run(name, rate, seed, num_parameters(model), losses,
                curve[-1][1] if curve and curve[-1][0] == training["num_steps"]
                else validation_loss(model, corpus, training["seq_len"]), model, curve)
            for (name, _, rate, seed), model, losses, curve in zip(runs, models, log.losses, curves)]


def train_walk_step(corpus, name: str, kwargs: dict, seeds=WALK_SEEDS) -> list[Run]:
    """One model of the walk (:func:`lm_walk`) at every seed of ``seeds``, trained together as
    :func:`train_capstone` trains the walk: :data:`WALK_DEPTH` blocks, matched to the 2017 block's size
    at that depth, :data:`WALK_STEPS` steps at :data:`WALK_RATE`.

    Raises:
        ValueError / TypeError: as :func:`train_group`.
    """
    target = model_parameters(corpus.vocab_size, LM_2017, WALK_DEPTH)
    return train_group(corpus, [(name, kwargs, WALK_RATE, seed) for seed in seeds], target=target,
                       num_blocks=WALK_DEPTH, num_steps=WALK_STEPS)


@shown_in("ch09")
def train_capstone(corpus, seeds=(0, 1), num_workers: int = 2) -> list[Run]:
    """Train the 2017 and the 2026 block as character LMs at one parameter count, on equal tokens:
    each at every rate of :data:`RATES`, then a second seed of each at its better rate; and the walk
    of :func:`lm_walk` between them, every step with :data:`WALK_SEEDS` (2 blocks, shorter)."""
    ends = [("2017 block", LM_2017), ("2026 block", lm_walk()[-1][1])]
    # every model is matched to the 2017 block's size
    target = model_parameters(corpus.vocab_size, LM_2017)
    seed, other = seeds
    # one lockstep per block, the two blocks in two workers
    sweep = [dict(corpus=corpus, runs=[(name, kw, rate, seed) for rate in RATES],
                  target=target, eval_every=100) for name, kw in ends]
    runs = [run for group in run_in_workers(train_group, sweep, num_workers)
            for run in group]
    best = best_runs(runs, seed)
    second = [dict(corpus=corpus, runs=[(name, kw, best[name].rate, other)],
                   target=target, eval_every=100) for name, kw in ends]
    runs += [run for group in run_in_workers(train_group, second, num_workers)
             for run in group]
    # one job per model of the walk, its seeds trained together
    steps = [dict(corpus=corpus, name=name, kwargs=kw) for name, kw in lm_walk()]
    runs += [run for group in run_in_workers(train_walk_step, steps, num_workers)
             for run in group]
    return runs


def best_runs(runs: list[Run], seed: int = 0) -> dict[str, Run]:
    """Each block's headline run (:data:`CAPSTONE_MODEL`'s depth) at its best rate (lowest validation loss) for ``seed``."""
    names = ("2017 block", "2026 block")
    return {name: min((r for r in runs if r.name == name and r.seed == seed and r.depth == CAPSTONE_MODEL["num_blocks"]),
                      key=lambda r: r.val_loss) for name in names}


def capstone_table(runs: list[Run]):
    """A pandas DataFrame of the headline pair: one row per run of either block at :data:`CAPSTONE_MODEL`'s
    depth, with its rate, seed, parameters, FFN width, and training and validation loss."""
    import pandas as pd

    rows = [{"block": r.name, "peak rate": r.rate, "seed": r.seed,
             "parameters": r.parameters, "FFN width": r.model.blocks[0].ffn.ffn_num_hiddens,
             "training loss": r.final_loss, "validation loss": r.val_loss}
            for r in runs if r.name in ("2017 block", "2026 block") and r.depth == CAPSTONE_MODEL["num_blocks"]]
    return pd.DataFrame(rows).sort_values(["block", "seed", "peak rate"]).reset_index(drop=True)


def walk_table(runs: list[Run]):
    """A pandas DataFrame of the walk (:data:`WALK_DEPTH` blocks, :data:`WALK_RATE`): each model's mean
    validation loss over :data:`WALK_SEEDS`, the seeds' spread (max - min), and the change of the mean
    from the model before it."""
    import pandas as pd

    names = [name for name, _ in lm_walk()]
    losses = {name: [r.val_loss for r in runs if r.name == name and r.depth == WALK_DEPTH] for name in names}
    if any(len(value) != len(WALK_SEEDS) for value in losses.values()):
        raise ValueError(f"runs must hold every model of the walk at depth {WALK_DEPTH} with seeds {WALK_SEEDS}")
    means = [sum(losses[name]) / len(losses[name]) for name in names]
    width = {r.name: r.model.blocks[0].ffn.ffn_num_hiddens for r in runs if r.depth == WALK_DEPTH}
    labels = names[:-1] + [f"{SUBSTITUTIONS[-1][0]} (the 2026 block)"]
    return pd.DataFrame({"FFN width": [width[name] for name in names], "validation loss": means,
                         "seed spread": [max(losses[name]) - min(losses[name]) for name in names],
                         "change": [float("nan")] + [b - a for a, b in zip(means, means[1:])]},
                        index=pd.Index(labels, name="after"))


#: The prompt of the capstone's samples, how many characters each sample adds (the window slides
#: past the models' context of 64), and the settings the sample explorer offers (``'greedy'``:
#: ``do_sample=False``; ``'all'``: no top-k). The samples the text quotes use :data:`SAMPLE_TEMPERATURE`.
SAMPLE_PROMPT = "The value of "
SAMPLE_LENGTH = 300
TEMPERATURES = ("greedy", "0.5", "0.8", "1.0", "1.5")
SAMPLE_TEMPERATURE = "0.8"
TOP_KS = ("all", "5")


def word_share(text: str, corpus) -> float:
    """The share of ``text``'s words (maximal runs of letters) that occur as words in the corpus's
    training text: 1.0 when every word the model wrote is one it read.

    Raises:
        TypeError: ``text`` not a str. ValueError: a text without a word.
    """
    check_instance("text", text, str, "a str")
    words = re.findall(r"[A-Za-z]+", text)
    if not words:
        raise ValueError(f"text holds no word (no run of letters): {text[:80]!r}")
    known = set(re.findall(r"[A-Za-z]+", corpus.text[:len(corpus.train)]))
    return sum(word in known for word in words) / len(words)


@shown_in("ch09")
def sampled_word_shares(runs: list[Run], corpus,
                        num_samples: int = 4) -> dict[str, float]:
    """For each block of :func:`best_runs`: the :func:`word_share` of ``num_samples`` samples (seeds
    0, 1, ...) of :data:`SAMPLE_LENGTH` characters at :data:`SAMPLE_TEMPERATURE`, pooled; and, as
    yardsticks, that of as many characters of held-out text and of characters drawn at their frequencies."""
    ids = torch.tensor([corpus.vocab.index(ch) for ch in SAMPLE_PROMPT])
    shares = {}
    for name, run in best_runs(runs).items():
        samples = [generate(run.model, ids, SAMPLE_LENGTH, do_sample=True, seed=seed,
                            temperature=float(SAMPLE_TEMPERATURE))[len(ids):]
                   for seed in range(check_positive_int("num_samples", num_samples))]
        shares[name] = word_share(" ".join(map(corpus.decode, samples)), corpus)
    n = num_samples * SAMPLE_LENGTH
    shares["held-out text"] = word_share(corpus.decode(corpus.val[:n]), corpus)
    # each character's frequency in the training text
    counts = torch.bincount(corpus.train, minlength=corpus.vocab_size).double()
    drawn = torch.multinomial(counts, n, replacement=True,
                              generator=torch.Generator().manual_seed(0))
    shares["characters at their frequencies"] = word_share(corpus.decode(drawn), corpus)
    return shares


def sample_explorer(runs: list[Run], corpus, prompt: str = SAMPLE_PROMPT, seed: int = 0) -> TextExplorer:
    """Samples from both trained blocks (:func:`best_runs`) for every temperature and top-k of
    :data:`TEMPERATURES` and :data:`TOP_KS`, each continuing ``prompt`` by :data:`SAMPLE_LENGTH`
    characters, as a :class:`~d2lmini.widgets.TextExplorer` (live) with its static twin. Every sample
    uses the generator seeded with ``seed``.

    Raises:
        ValueError: a prompt with a character outside the corpus's vocabulary, or an empty one;
            TypeError: a seed that is not an int.
    """
    check_instance("prompt", prompt, str, "a str")
    check_seed(seed)
    unknown = sorted(set(prompt) - set(corpus.vocab))
    if unknown or not prompt:
        raise ValueError(f"prompt must be non-empty and hold only characters of the corpus; unknown: {unknown}")
    ids = torch.tensor([corpus.vocab.index(ch) for ch in prompt])
    texts = {}
    for name, run in best_runs(runs).items():
        greedy = corpus.decode(generate(run.model, ids, SAMPLE_LENGTH))  # top-k does not change the argmax
        for temperature in TEMPERATURES:
            for top_k in TOP_KS:
                texts[f"{name}|{temperature}|{top_k}"] = greedy if temperature == "greedy" else corpus.decode(generate(
                    run.model, ids, SAMPLE_LENGTH, do_sample=True, temperature=float(temperature),
                    top_k=None if top_k == "all" else int(top_k), seed=seed))
    controls = [{"name": "block", "label": "block", "options": [[n, n] for n in ("2017 block", "2026 block")],
                 "value": "2026 block"},
                {"name": "temperature", "label": "temperature", "options": [[t, t] for t in TEMPERATURES],
                 "value": SAMPLE_TEMPERATURE},
                {"name": "top_k", "label": "top-k", "options": [[k, k] for k in TOP_KS], "value": "all"}]
    return TextExplorer(controls, texts, description="Samples of both trained language models")


@shown_in("ch09")
def cache_measurements(vocab_size: int, prompt_len: int = 16, max_new_tokens: int = 96,
                       seed: int = 0) -> dict:
    """Decode ``max_new_tokens`` greedily with and without the key/value cache on the 2026 block's
    model (untrained: speed does not depend on the weights), and measure the cache of MHA and GQA.

    Returns:
        dict: ``'MHA cache bytes'`` and ``'GQA cache bytes'`` (a full context's keys and values,
        from the tensors), and for the GQA model ``'tokens with cache'`` / ``'tokens without cache'``
        (the ids), ``'tokens/s ...'`` (CPU time of this thread) and ``'positions computed ...'``.

    Raises:
        ValueError / TypeError: sizes that are not positive ints, or a seed that is not an int.
    """
    kwargs = _lm_2026_kwargs(vocab_size, prompt_len, max_new_tokens, seed)  # GQA
    mha = {**kwargs, "num_kv_heads": kwargs["num_heads"]}  # a key/value head per head
    out = {}
    for name, config in (("MHA", mha), ("GQA", kwargs)):
        with seeded(seed):
            model = LanguageModel(vocab_size, **config).eval()
            prompt = torch.randint(0, vocab_size, (1, prompt_len))
        cache = KVCache(len(model.blocks))
        with torch.no_grad():  # a full context's keys and values
            model(torch.randint(0, vocab_size, (1, config["context_len"])), cache)
        out[f"{name} cache bytes"] = cache.num_bytes()
    positions = []  # how many positions each call of the model computes
    hook = model.embedding.register_forward_hook(
        lambda module, inputs, output: positions.append(inputs[0].shape[1]))
    for use_cache, label in ((True, "with cache"), (False, "without cache")):
        positions.clear()
        start = time.thread_time()
        out[f"tokens {label}"] = generate(model, prompt, max_new_tokens,
                                          use_cache=use_cache)
        out[f"tokens/s {label}"] = max_new_tokens / (time.thread_time() - start)
        out[f"positions computed {label}"] = sum(positions)
    hook.remove()
    return out


def _lm_2026_kwargs(vocab_size, prompt_len, max_new_tokens, seed) -> dict:
    """For :func:`cache_measurements`: check its arguments, and return the 2026 block's
    :class:`~d2lmini.lm.LanguageModel` arguments (the last model of :func:`lm_walk`, GQA) at
    :data:`CAPSTONE_MODEL`'s size, its context the prompt and the new tokens."""
    for name, value in (("vocab_size", vocab_size), ("prompt_len", prompt_len),
                        ("max_new_tokens", max_new_tokens)):
        check_positive_int(name, value)
    check_seed(seed)
    return dict(lm_walk()[-1][1], **{**CAPSTONE_MODEL, "context_len": prompt_len + max_new_tokens})


# --------------------------------------------------------------------------- the models in the page


def model_explorer(runs: list[Run], corpus, prompt: str = SAMPLE_PROMPT):
    """Both trained blocks (:func:`best_runs`) running in the page: a
    :class:`~d2lmini.webmodel.ModelExplorer` (live, in Jupyter and Colab) whose ``static()`` twin
    generates in the HTML book, with no kernel, from the prompt box (starting at ``prompt``, for
    :data:`SAMPLE_LENGTH` characters), and shows each head's attention and the stream's RMS.

    Raises:
        ValueError: an empty prompt or one with characters outside the corpus's vocabulary.
    """
    from ..webmodel import ModelExplorer

    return ModelExplorer({name: run.model for name, run in best_runs(runs).items()}, corpus.vocab,
                         prompt=prompt, max_new_tokens=SAMPLE_LENGTH)


def float16_agreement(runs: list[Run], corpus, prompt: str = SAMPLE_PROMPT) -> dict[str, int]:
    """For each trained block (:func:`best_runs`), how many of the first :data:`SAMPLE_LENGTH` greedy
    characters after ``prompt`` the model keeps when its weights are rounded to float16, as the page
    holds them (:func:`~d2lmini.webmodel.float16_rounded`): the length of the common start.
    """
    from ..webmodel import float16_rounded

    ids = torch.tensor([corpus.vocab.index(ch) for ch in prompt])
    agreement = {}
    for name, run in best_runs(runs).items():
        full, rounded = generate(run.model, ids, SAMPLE_LENGTH), generate(float16_rounded(run.model), ids, SAMPLE_LENGTH)
        differ = (full != rounded).nonzero()
        agreement[name] = int(differ[0, 0]) - len(ids) if len(differ) else SAMPLE_LENGTH
    return agreement


__all__ = [
    "BLOCK_2017", "CAPSTONE_MODEL", "CAPSTONE_TRAINING", "CONSTRUCTOR_GROUPS", "LM_2017", "RATES",
    "SAMPLE_PROMPT", "SUBSTITUTIONS", "TEMPERATURES", "TOP_KS",
    "WALK_RATE", "Run",
    "best_runs", "cache_measurements", "capstone_table", "float16_agreement", "lm_walk", "matched_ffn_num_hiddens",
    "model_explorer", "plot_capstone", "sample_explorer", "train_capstone", "walk_table",
    "Step",
    "constructor_arguments", "constructor_groups",
    "rope_relative_check", "sinusoidal_positions",
    "step_table", "substitution_steps",
]
