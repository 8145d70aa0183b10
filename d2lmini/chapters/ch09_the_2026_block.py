"""The 2026 block: the 2017 block in five substitutions, both trained, and the catalogue the zoo shows.

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

It also holds the catalogue of the appendix "The block zoo" (``chapters/zoo.ipynb``):

* :func:`who_uses_what` -- eight models' blocks, each described from a d2lmini block
  configured like the model and, where a reference layer class exists, verified
  against it (via :mod:`d2lmini.reference`, plus :func:`compare_with_trinity` for
  Arcee Trinity's ``AfmoeDecoderLayer``);
* :func:`table_2026` -- the 2026 table: ten models of late 2024 to 2026 described from
  their ``transformers`` configuration classes (:func:`describe_config`, with the
  modeling-file facts of :data:`MODELING`) and, where d2lmini rebuilds their layers,
  verified (:func:`verify_2026`, :data:`CHECKS`; :func:`deepseek_v4_wiring_check` for
  DeepSeek-V4's hyper-connections); :func:`feature_counts` and :func:`the_2026_block`,
  the block most of those rows share;
* :func:`zoo_switches` -- three rows of the block zoo (:mod:`d2lmini.zoo`) side by
  side, as the constructor arguments their converted blocks hold.

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
from ..attention import GatedAttention, apply_rotary, rotary_cos_sin
from ..moe import ROUTERS, MixtureOfExperts
from ..block import ATTENTION_OPTIONS, TransformerBlock
from ..cache import KVCache
from ..lm import LanguageModel, generate
from ..widgets import TextExplorer
from ..data import frequency_loss
from ..train import RECIPE, moving_average, run_in_workers, train_models, validation_loss
from ..lm import sinusoidal_positions  # re-exported: the exercises use it
from ..parameters import BLOCK_PARTS, num_parameters
from ..reference import TOLERANCE as _TOLERANCE
from ..reference import from_afmoe_layer  # Trinity's converter (global and local layers); re-exported here
from ..plot import (ACT_SHORT_LABELS, NORM_LABELS, PLACEMENT_SHORT_LABELS, QK_SHORT_LABELS, plot_loss_curves,
                    styled_figure, table_style)
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
    "long context": ("window", "sinks", "rotary_dim", "rope_scaling"),
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
def substitution_steps(num_hiddens: int = 512, num_heads: int = 8, batch_size: int = 2, num_steps: int = 16,
                       seed: int = 0) -> list[Step]:
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
        raise ValueError(f"num_heads must be divisible by 4 (GQA uses h/4 key/value heads), got {num_heads}")
    kwargs, steps = dict(BLOCK_2017), []
    with seeded(seed):
        X = torch.randn(check_positive_int("batch_size", batch_size),
                        check_positive_int("num_steps", num_steps), num_hiddens)
        for name, flag, change, core in (("2017 Transformer", "", {}, True),) + SUBSTITUTIONS:
            kwargs.update({k: (num_heads // 4 if v == "h/4" else v) for k, v in change.items()})
            block = TransformerBlock(num_hiddens, num_heads, **kwargs)
            with torch.no_grad():
                shape = tuple(block(X).shape)
            att = block.attention
            steps.append(Step(name, flag, core=core, kwargs=dict(kwargs),
                              parameters=num_parameters(block, BLOCK_PARTS),
                              kv_cache_per_token=2 * att.num_kv_heads * att.head_dim, output_shape=shape))
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

    The GQA step keeps ``num_kv_heads`` key/value heads; the RoPE step replaces the learned
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
    target = model_parameters(corpus.vocab_size, LM_2017)  # every model is matched to the 2017 block's size
    seed, other = seeds
    sweep = [dict(corpus=corpus, runs=[(name, kw, rate, seed) for rate in RATES], target=target, eval_every=100)
             for name, kw in ends]  # one lockstep per block, the two blocks in two workers
    runs = [run for group in run_in_workers(train_group, sweep, num_workers) for run in group]
    best = best_runs(runs, seed)
    second = [dict(corpus=corpus, runs=[(name, kw, best[name].rate, other)], target=target, eval_every=100)
              for name, kw in ends]
    runs += [run for group in run_in_workers(train_group, second, num_workers) for run in group]
    steps = [dict(corpus=corpus, name=name, kwargs=kw) for name, kw in lm_walk()]  # a step's seeds together
    runs += [run for group in run_in_workers(train_walk_step, steps, num_workers) for run in group]
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
def sampled_word_shares(runs: list[Run], corpus, num_samples: int = 4) -> dict[str, float]:
    """For each block of :func:`best_runs`: the :func:`word_share` of ``num_samples`` samples (seeds
    0, 1, ...) of :data:`SAMPLE_LENGTH` characters at :data:`SAMPLE_TEMPERATURE`, pooled; and, as
    yardsticks, that of as many characters of held-out text and of characters drawn at their frequencies."""
    ids = torch.tensor([corpus.vocab.index(ch) for ch in SAMPLE_PROMPT])
    shares = {}
    for name, run in best_runs(runs).items():
        samples = [corpus.decode(generate(run.model, ids, SAMPLE_LENGTH, do_sample=True, seed=seed,
                                          temperature=float(SAMPLE_TEMPERATURE))[len(ids):])
                   for seed in range(check_positive_int("num_samples", num_samples))]
        shares[name] = word_share(" ".join(samples), corpus)
    n = num_samples * SAMPLE_LENGTH
    shares["held-out text"] = word_share(corpus.decode(corpus.val[:n]), corpus)
    counts = torch.bincount(corpus.train, minlength=corpus.vocab_size).double()  # each character's frequency
    drawn = torch.multinomial(counts, n, replacement=True, generator=torch.Generator().manual_seed(0))
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
def cache_measurements(vocab_size: int, prompt_len: int = 16, max_new_tokens: int = 96, seed: int = 0) -> dict:
    """Decode ``max_new_tokens`` greedily with and without the key/value cache on the 2026 block's
    model (untrained: speed does not depend on the weights), and measure the cache of MHA and GQA.

    Returns:
        dict: ``'MHA cache bytes'`` and ``'GQA cache bytes'`` (a full context's keys and values,
        from the tensors), and for the GQA model ``'tokens with cache'`` / ``'tokens without cache'``
        (the ids), ``'tokens/s ...'`` (CPU time of this thread) and ``'positions computed ...'``.

    Raises:
        ValueError / TypeError: sizes that are not positive ints, or a seed that is not an int.
    """
    for name, value in (("vocab_size", vocab_size), ("prompt_len", prompt_len), ("max_new_tokens", max_new_tokens)):
        check_positive_int(name, value)
    check_seed(seed)
    kwargs = dict(lm_walk()[-1][1], **{**CAPSTONE_MODEL, "context_len": prompt_len + max_new_tokens})
    heads = kwargs["num_heads"]
    out = {}
    for name, num_kv_heads in (("MHA", heads), ("GQA", kwargs["num_kv_heads"])):
        with seeded(seed):
            model = LanguageModel(vocab_size, **{**kwargs, "num_kv_heads": num_kv_heads}).eval()
            prompt = torch.randint(0, vocab_size, (1, prompt_len))
        cache = KVCache(len(model.blocks))
        with torch.no_grad():
            model(torch.randint(0, vocab_size, (1, kwargs["context_len"])), cache)  # a full context's keys and values
        out[f"{name} cache bytes"] = cache.num_bytes()
    positions = []  # how many positions each call of the model computes
    hook = model.embedding.register_forward_hook(lambda module, inputs, output: positions.append(inputs[0].shape[1]))
    for use_cache, label in ((True, "with cache"), (False, "without cache")):
        positions.clear()
        start = time.thread_time()
        out[f"tokens {label}"] = generate(model, prompt, max_new_tokens, use_cache=use_cache)
        out[f"tokens/s {label}"] = max_new_tokens / (time.thread_time() - start)
        out[f"positions computed {label}"] = sum(positions)
    hook.remove()
    return out


# --------------------------------------------------------------------------- Arcee Trinity (AFMoE)


def compare_with_trinity(batch_size: int = 2, num_steps: int = 16, seed: int = 0, padded: bool = True) -> dict:
    """Arcee Trinity's layer and its d2lmini twin on one batch: the differences.

    :func:`d2lmini.reference.compare_with_reference` on a tiny seeded global
    ``AfmoeDecoderLayer`` (the tiny configuration ``"afmoe_global"``, called as
    ``AfmoeModel`` calls it), converted with :func:`from_afmoe_layer`: both get the same
    random batch (the second sequence padded to 5/8 of its length when ``padded``) and the
    same random read-out is backpropagated to the inputs. Only valid positions are compared.

    Returns:
        dict with ``max_abs_diff`` (outputs), ``max_abs_grad_diff`` (input gradients),
        ``max_abs_output`` and ``block``.

    Raises:
        ImportError: if ``transformers`` has no AFMoE model.

    Introduced in the chapter "The 2026 block".
    """
    from ..reference import compare_with_reference, hf_reference, tiny_config

    trinity = hf_reference("Arcee Trinity", "afmoe", "AfmoeDecoderLayer", "AfmoeConfig", tiny_config("afmoe_global"))
    return compare_with_reference(trinity, batch_size, num_steps, seed, padded)


# --------------------------------------------------------------------------- who uses what

#: The models of the "who uses what" table, in order: (model, reference layer name,
#: bibliography key, where its positions come from when its blocks have no RoPE).
#: A reference name is a key of :data:`d2lmini.reference.REFERENCES`, or
#: ``'AfmoeDecoderLayer'`` (:func:`compare_with_trinity`).
MODELS = (
    ("Transformer (2017)", "TransformerEncoderLayer(norm_first=False, activation='relu')",
     "vaswani2017attention", "sinusoidal, added to the input"),
    ("BERT", "BertLayer", "devlin2019bert", "learned, added to the input"),
    ("GPT-2", "GPT2Block", "radford2019language", "learned, added to the input"),
    ("Llama 3", "LlamaDecoderLayer", "grattafiori2024llama3", None),
    ("Qwen3", "Qwen3DecoderLayer", "yang2025qwen3", None),
    ("Gemma 3", "Gemma3DecoderLayer", "gemma2025gemma3", None),
    ("OLMo 2", "Olmo2DecoderLayer", "olmo2024olmo2", None),
    ("Arcee Trinity", "AfmoeDecoderLayer", "singh2026trinity", "none in global layers (RoPE in local ones)"),
)

#: Largest absolute difference (float32) of outputs and input gradients for a row to count as verified
#: (the zoo's, :data:`d2lmini.reference.TOLERANCE`).
TOLERANCE = _TOLERANCE


@shown_in("zoo")
def describe_block(block: TransformerBlock, positions_note: str | None = None) -> dict:
    """The "who uses what" columns, read from a block's modules rather than typed.

    Args:
        block: a :class:`~d2lmini.block.TransformerBlock` (its attention may be a
            :class:`GatedAttention`, its FFN a :class:`MixtureOfExperts`).
        positions_note: where the positions come from when the block has no RoPE.

    Returns:
        dict of short strings: ``norm``, ``placement``, ``qk_norm``, ``ffn``,
        ``attention`` and ``positions``.

    Raises:
        TypeError: if ``block`` is not a TransformerBlock.
        ValueError: if the block has no RoPE and no ``positions_note`` is given.
    """
    check_instance("block", block, TransformerBlock, "a d2lmini TransformerBlock")
    att, ffn = block.attention, block.ffn
    if isinstance(ffn, MixtureOfExperts):
        ffn_name = f"{ACT_SHORT_LABELS[ffn.act]} MoE ({ffn.router_kind} router"
        ffn_name += ", shared expert)" if ffn.shared is not None else ")"
    else:
        ffn_name = ACT_SHORT_LABELS[ffn.act]
    kind = "MHA" if att.num_kv_heads == att.num_heads else "GQA"
    kind = ("gated " + kind) if isinstance(att, GatedAttention) else kind
    if att.rope_theta is not None:
        positions = "RoPE"
    elif positions_note is None:
        raise ValueError("the block has no RoPE: pass positions_note (where the model's positions come from)")
    else:
        positions = positions_note
    return {"norm": NORM_LABELS[block.norm], "placement": PLACEMENT_SHORT_LABELS[block.placement],
            "qk_norm": QK_SHORT_LABELS[att.qk_norm], "ffn": ffn_name,
            "attention": f"{kind}, {'causal' if att.causal else 'bidirectional'}", "positions": positions}


def who_uses_what(seed: int = 0, num_steps: int = 16) -> list[dict]:
    """Configure a d2lmini block as each model of :data:`MODELS`, describe it, verify it.

    For every model with a reference layer class, a tiny random instance of that
    layer is converted into a d2lmini block and both are run on the same padded
    batch (:func:`d2lmini.reference.compare_with_reference`, or
    :func:`compare_with_trinity`); the table's descriptive columns are then read
    from that very block (:func:`describe_block`).

    Args:
        seed: seeds every reference layer and batch.
        num_steps: length of the test sequences.

    Returns:
        One dict per model: ``model``, ``cite``, ``layer``, the columns of
        :func:`describe_block`, ``max_abs_diff``, ``max_abs_grad_diff``,
        ``max_abs_output`` (``None`` when not verified) and ``status``
        (``'verified'``, ``'MISMATCH'`` or ``'not verified (...)'``).

    Raises:
        ImportError: if ``transformers`` is not installed (the Hugging Face rows need it).

    Introduced in the chapter "The 2026 block".
    """
    from ..reference import compare_with_reference

    rows = []
    with torch.random.fork_rng(devices=[]):
        for model, layer_name, cite, note in MODELS:
            row = {"model": model, "cite": cite, "layer": layer_name}
            try:
                result = (compare_with_trinity(num_steps=num_steps, seed=seed) if layer_name == "AfmoeDecoderLayer"
                          else compare_with_reference(layer_name, num_steps=num_steps, seed=seed))
            except ImportError:
                if layer_name != "AfmoeDecoderLayer":
                    raise
                row.update(describe_trinity_without_reference(note), max_abs_diff=None, max_abs_grad_diff=None,
                           max_abs_output=None, status="not verified (no reference layer)", layer="—")
                rows.append(row)
                continue
            row.update(describe_block(result["block"], note))
            ok = max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE
            row.update(max_abs_diff=result["max_abs_diff"], max_abs_grad_diff=result["max_abs_grad_diff"],
                       max_abs_output=result["max_abs_output"], status="verified" if ok else "MISMATCH")
            rows.append(row)
    return rows


def describe_trinity_without_reference(positions_note: str) -> dict:
    """:func:`describe_block` of a Trinity-like block built without a reference layer.

    Used when ``transformers`` has no ``AfmoeDecoderLayer``: the block is configured
    from the tiny configuration ``"afmoe_global"`` directly, so the row still describes a d2lmini block.
    """
    from ..reference import tiny_config

    c = tiny_config("afmoe_global")
    block = TransformerBlock(c["hidden_size"], c["num_attention_heads"], norm="rms", placement="sandwich",
                             attn_factory=lambda: GatedAttention(c["hidden_size"], c["num_attention_heads"],
                                                                 num_kv_heads=c["num_key_value_heads"],
                                                                 head_dim=c["head_dim"], causal=True,
                                                                 qk_norm="per_head"),
                             ffn_factory=lambda: MixtureOfExperts(c["hidden_size"], c["num_experts"],
                                                                  top_k=c["num_experts_per_tok"],
                                                                  ffn_num_hiddens=c["moe_intermediate_size"],
                                                                  router="sigmoid",
                                                                  num_shared_experts=c["num_shared_experts"]))
    return describe_block(block, positions_note)


def catalog_table(rows: list[dict]):
    """The "who uses what" table: a DataFrame indexed by model with the six descriptive columns.

    The attention column is headed "attention (test layer)": whether it says MHA or GQA
    depends on the tiny test instance's key/value heads, not on every released model.
    """
    import pandas as pd

    columns = {"norm": "norm", "placement": "placement", "qk_norm": "QK-norm", "ffn": "FFN",
               "attention": "attention (test layer)", "positions": "positions"}
    return pd.DataFrame([{"model": r["model"], **{label: r[key] for key, label in columns.items()}}
                         for r in rows]).set_index("model")


def fit_to_page(table, font_size: str = "0.9em"):
    """Style a wide DataFrame so it wraps inside the book's text column instead of scrolling.

    Args:
        table: a ``pandas.DataFrame``.
        font_size: CSS font size of the cells.

    Returns:
        A ``pandas.io.formats.style.Styler`` whose HTML table takes the column's full
        width, wraps long cells and aligns text to the left.
    """
    return (table_style(table).set_table_attributes('class="dataframe" style="width: 100%"')
            .set_table_styles([{"selector": "td, th",
                                "props": [("white-space", "normal"), ("text-align", "left"),
                                          ("font-size", font_size)]}]))


def verification_table(rows: list[dict]):
    """The verification table: reference layer, largest output and input-gradient differences, status."""
    import pandas as pd

    def fmt(value):
        return "—" if value is None else f"{value:.2g}"

    return pd.DataFrame([{"model": r["model"], "reference layer": r["layer"].split("(")[0],
                          "max |Δ| output": fmt(r["max_abs_diff"]),
                          "max |Δ| input grad": fmt(r["max_abs_grad_diff"]), "status": r["status"]}
                         for r in rows]).set_index("model")


# --------------------------------------------------------------------------- the 2026 table

#: The facts of each 2026 row that a configuration class does not hold, read from the model's
#: modeling file in ``transformers`` 5.24 (the decoder layer's and attention's ``__init__``):
#: the norms and where they sit, QK-norm, an output gate on the attention, sinks, NoPE layers.
MODELING = {
    "DeepSeek-V3": dict(norm="RMSNorm, pre", qk_norm="RMSNorm on the query and key/value latents",
                        router="sigmoid"),
    "Kimi K2.5": dict(norm="RMSNorm, pre", qk_norm="RMSNorm on the query and key/value latents", router="sigmoid"),
    "DeepSeek-V4": dict(norm="RMSNorm, pre (inside each hyper-connection)", act="clamped SwiGLU",
                        qk_norm="QK-norm: RMSNorm without gain on each query head, with gain on the shared K/V head",
                        sinks=True),
    "Qwen3.5": dict(norm="RMSNorm (1 + w), pre", qk_norm="QK-norm per head", gate=True, router="softmax"),
    "Gemma 4": dict(norm="RMSNorm, sandwich", qk_norm="QK-norm per head; RMSNorm without gain on the values"),
    "gpt-oss": dict(norm="RMSNorm, pre", sinks=True, router="softmax", act="clamped SwiGLU"),
    "Llama 4": dict(norm="RMSNorm, pre", qk_norm="QK-norm per head: RMSNorm without gain, after RoPE (RoPE layers only)", shared_experts=1,
                    router="sigmoid"),
    "OLMo 3": dict(norm="RMSNorm, on each sublayer's output", qk_norm="QK-norm over the whole projection"),
    "GLM-5": dict(norm="RMSNorm, pre", qk_norm="RMSNorm on the query and key/value latents", router="sigmoid"),
    "Arcee Trinity": dict(norm="RMSNorm, sandwich", qk_norm="QK-norm per head", gate=True,
                          nope="full-attention layers", router="sigmoid"),
}


@dataclass(frozen=True)
class Row2026:
    """One model of the 2026 table.

    Attributes:
        model, year: the model and the year of the release described.
        cite: its bibliography key (a report or model card).
        config: the ``transformers`` configuration class whose defaults the descriptive
            columns are read from (``'Kimi_K25Config.text_config'`` for a sub-configuration).
        report: values the report or model card gives for the released model where the
            class defaults describe another model (Kimi K2.5's defaults are DeepSeek-V3's).
        check: the name of the check in :data:`CHECKS` that reproduces its layer, or ``None``.
        missing: what d2lmini does not reproduce of the model's layers.
    """

    model: str
    year: int
    cite: str
    config: str
    report: dict = field(default_factory=dict)
    check: str | None = None
    missing: str = ""


ROWS_2026 = (
    Row2026("DeepSeek-V3", 2024, "deepseek2024v3", "DeepseekV3Config", check="DeepSeek-V3 layers"),
    Row2026("Kimi K2.5", 2026, "kimi2025k2", "Kimi_K25Config.text_config",
            report=dict(num_attention_heads=64, n_routed_experts=384, first_k_dense_replace=1, n_group=1,
                        topk_group=1),
            check="DeepSeek-V3 layers, no expert groups"),
    Row2026("DeepSeek-V4", 2026, "", "DeepseekV4Config",
            check="DeepSeek-V4 (sliding, HCA and CSA layers, hash and top-k MoE)",
            missing="the key/value cache of the compressors (decoding token by token)"),
    Row2026("Qwen3.5", 2026, "", "Qwen3_5MoeTextConfig", check="Qwen3.5 (both layer types, dense and MoE)"),
    Row2026("Gemma 4", 2026, "", "Gemma4TextConfig", check="Gemma 4 (local and global layers, dense)",
            missing="per-layer inputs (a second input to each layer), the MoE block (26B-A4B) and key/value "
                    "sharing across layers"),
    Row2026("gpt-oss", 2025, "openai2025gptoss", "GptOssConfig", check="gpt-oss"),
    Row2026("Llama 4", 2025, "", "Llama4TextConfig", check="Llama 4 (RoPE and NoPE layers, dense and MoE)"),
    Row2026("OLMo 3", 2025, "olmo2025olmo3", "Olmo3Config", check="OLMo 3"),
    Row2026("GLM-5", 2026, "glm2026glm5", "GlmMoeDsaConfig", check="GLM-5 (sparse attention, dense and MoE layers)",
            missing="cross-layer top-k sharing (indexer_types 'shared', off by default)"),
    Row2026("Arcee Trinity", 2025, "singh2026trinity", "AfmoeConfig", check="Arcee Trinity"),
)
ROWS_2026 = tuple(sorted(ROWS_2026, key=lambda row: row.year))  # release order (a stable sort)

#: The released model that each row's configuration (class defaults plus ``report``) describes, read off
#: the layer count, width and expert count; ``None`` where the defaults match no released model (Gemma 4:
#: the class docstring names gemma-4-e2b-it, whose width and depth differ; Trinity: the defaults have
#: 16 K/V heads and 64 experts, every released Trinity GQA and more experts). Such a row shows the class's
#: defaults and is left out of :func:`feature_counts`.
SIZES = {"DeepSeek-V3": "DeepSeek-V3 671B", "gpt-oss": "gpt-oss-120b", "Llama 4": "Llama 4 Scout 17B-16E",
         "OLMo 3": "OLMo 3 7B", "Kimi K2.5": "Kimi K2.5 1T", "DeepSeek-V4": "DeepSeek-V4-Flash",
         "Qwen3.5": "Qwen3.5-35B-A3B", "Gemma 4": None, "GLM-5": "GLM-5 744B", "Arcee Trinity": None}

#: Cells of a named size that still hold a class default the released model does not share.
CLASS_DEFAULT_CELLS = {
    "Kimi K2.5": {"positions": "DeepSeek-V3's class default; Kimi's own base is larger"},
    "Qwen3.5": {"positions": "class default; the released models use a larger base"},
    "GLM-5": {"positions": "GlmMoeDsaConfig's class default"},
}

#: DeepSeek-V4's RoPE labels (``rope_parameters``' keys) as the layers that use them: in
#: ``DeepseekV4Attention``, ``rope_layer_type = "main" if layer_type == "sliding_attention"
#: else "compress"``, so a CSA or HCA layer rotates all of its attention with "compress".
_ROPE_LABELS = {"main": "sliding-only layers", "compress": "CSA and HCA layers"}


def config_2026(row: Row2026):
    """The configuration of ``row``: its class's defaults, with ``row.report`` set on top.

    Raises:
        ImportError / AttributeError: ``transformers`` lacks the class (see
            :func:`d2lmini.zoo.missing_from_transformers`).
    """
    import transformers

    name, _, sub = row.config.partition(".")
    config = getattr(transformers, name)()
    config = getattr(config, sub) if sub else config
    for key, value in row.report.items():
        setattr(config, key, value)
    return config


def _ratio(a: int, b: int) -> str:
    g = math.gcd(a, b) or 1
    return f"{a // g}:{b // g}"


def _layer_counts(config) -> dict:
    types = list(getattr(config, "layer_types", None) or [])
    return {t: types.count(t) for t in dict.fromkeys(types)}


def _first(config, *names, default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _rope_text(params: dict) -> str:
    text = f"RoPE θ = {params.get('rope_theta', 0):,.0f}"
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        text += f" on {params['partial_rotary_factor']:g} of each head"
    return text  # long-context scaling (YaRN) is left out: a class default carries it for some rows only


def describe_config(row: Row2026) -> dict:
    """The descriptive columns of a 2026 row, read from its configuration (:func:`config_2026`).

    Returns:
        dict of short strings: ``shape`` (layers and width), ``norm`` (type and placement,
        from :data:`MODELING`), ``residual`` (one stream, or ``n`` hyper-connected ones:
        ``hc_mult``), ``mixer`` (softmax, or hybrid with the count of linear-attention
        layers in ``layer_types``), ``attention`` (MHA/GQA/MQA/MLA from the head counts and
        ``kv_lora_rank``; the layer pattern from ``layer_types`` with the window or chunk;
        output gate, sinks and QK-norm from :data:`MODELING`), ``positions`` (the RoPE of
        each layer type from ``rope_parameters``: base and partial fraction, without
        long-context scaling; NoPE layers) and ``ffn`` (dense and its gated activation, or
        experts / active / shared, the dense layers first and the router), each cell of
        :data:`CLASS_DEFAULT_CELLS` with its note; ``size`` (:data:`SIZES`); ``local_global``
        (the ratio of sliding-window to global layers, or ``None``) and ``features`` (a dict
        feature -> bool, for :func:`feature_counts`: from the configuration and from the
        notes of :data:`MODELING`; RoPE is in every row, by inspection).
    """
    c, m = config_2026(row), MODELING[row.model]
    counts, n = _layer_counts(c), c.num_hidden_layers
    h, kv = c.num_attention_heads, c.num_key_value_heads
    linear = counts.get("linear_attention", 0)
    mixer = f"hybrid: {linear} Gated DeltaNet, {n - linear} softmax ({_ratio(linear, n - linear)})" if linear \
        else "softmax"
    if getattr(c, "kv_lora_rank", None):
        heads = f"MLA, {h} heads, latent {c.kv_lora_rank}"
    elif kv == 1:
        heads = f"MQA, {h} heads, one K/V head of {c.head_dim}"
    else:
        heads = f"GQA {h}/{kv}" if kv < h else f"MHA, {h} heads"
    parts = [heads]
    full = counts.get("full_attention", 0)
    if counts.get("sliding_attention") and full:
        parts.append(f"window {c.sliding_window}, local:global {_ratio(counts['sliding_attention'], full)}")
    if counts.get("chunked_attention"):
        parts.append(f"chunks of {c.attention_chunk_size}, chunked:global {_ratio(counts['chunked_attention'], full)}")
    if counts.get("compressed_sparse_attention"):  # the class's default layer pattern is V4-Pro's: no counts
        parts.append(f"compressed (CSA and HCA layers), window {c.sliding_window}")
    if counts.get("indexed_attention"):
        parts.append(f"sparse: top {c.index_topk} tokens (DSA)")
    parts += [label for key, label in (("gate", "output gate"), ("sinks", "sinks")) if m.get(key)]
    parts += [m["qk_norm"]] if m.get("qk_norm") else []
    ffn = _ffn(c, m)
    params = c.rope_parameters
    mla = bool(getattr(c, "kv_lora_rank", None))
    partial = any(p.get("partial_rotary_factor", 1.0) < 1.0  # or MLA's rotary slice of each head
                  for p in ([params] if "rope_theta" in params else params.values())) \
        or (mla and getattr(c, "qk_nope_head_dim", 0) > 0)
    qk = m.get("qk_norm", "")
    features = {"RMSNorm": m["norm"].startswith("RMSNorm"), "pre-norm": ", pre" in m["norm"],
                "fewer keys and values than MHA (GQA, MQA or MLA)": kv < h or mla,
                "fewer K/V heads than query heads (GQA, MQA)": kv < h and not mla, "latent K/V (MLA)": mla,
                "sliding-window and global layers": bool(counts.get("sliding_attention")),
                "chunked and global layers": bool(counts.get("chunked_attention")),
                "QK-norm (any form)": qk.startswith("QK-norm"),
                "QK-norm per head": "per head" in qk or "each query head" in qk,
                "RoPE (by inspection)": True, "partial RoPE (incl. MLA's rotary slice)": partial,
                "softmax layers without positions (NoPE)": bool(getattr(c, "no_rope_layers", None) or m.get("nope")),
                "SwiGLU": "SwiGLU" in ffn, "MoE": ffn.startswith("MoE"), "shared expert": "shared" in ffn,
                "sigmoid router": ffn.endswith("sigmoid router"),
                "MoE with a shared expert and a sigmoid router": "shared" in ffn and ffn.endswith("sigmoid router"),
                "linear attention (hybrid)": bool(linear), "attention output gate": bool(m.get("gate")),
                "sinks": bool(m.get("sinks")), "hyper-connections": bool(getattr(c, "hc_mult", None))}
    cells = {"shape": f"{n} layers, d = {c.hidden_size}", "norm": m["norm"], "ffn": ffn,
             "residual": f"{c.hc_mult} streams (mHC)" if getattr(c, "hc_mult", None) else "one stream",
             "mixer": mixer, "attention": "; ".join(parts), "positions": _positions(c, m, counts)}
    for key, note in CLASS_DEFAULT_CELLS.get(row.model, {}).items():  # after the RoPE base, else at the end
        cells[key] = re.sub(r"(RoPE θ = [\d,]+)", rf"\1 ({note})", cells[key], count=1) \
            if "RoPE θ" in cells[key] else cells[key] + f" ({note})"
    return {**cells, "features": features, "size": SIZES[row.model],
            "local_global": _ratio(counts["sliding_attention"], full)
            if full and counts.get("sliding_attention") else None}


def _positions(c, m: dict, counts: dict) -> str:
    params = c.rope_parameters
    if "rope_theta" in params:
        text = _rope_text(params)
    else:  # one RoPE per layer type (or V4's main / compressed)
        texts = {kind: _rope_text(p) for kind, p in params.items()}
        text = next(iter(texts.values())) if len(set(texts.values())) == 1 else \
            "; ".join(f"{_ROPE_LABELS.get(kind, kind.replace('_attention', ''))}: {t}" for kind, t in texts.items())
    no_rope = getattr(c, "no_rope_layers", None)
    if no_rope:
        text += f"; NoPE in {no_rope.count(0)} of {len(no_rope)} layers"
    if m.get("nope"):
        text += f"; NoPE in the {counts.get('full_attention', 0)} {m['nope']}"
    if counts.get("linear_attention"):
        text += " (softmax layers); the Gated DeltaNet layers take order from their recurrence"
    return text


def _ffn(c, m: dict) -> str:
    act = m.get("act") or {"silu": "SwiGLU", "gelu_pytorch_tanh": "GeGLU"}.get(
        _first(c, "hidden_act", "hidden_activation"), "?")
    experts = _first(c, "n_routed_experts", "num_experts", "num_local_experts")
    if not experts:
        return f"dense {act}, width {c.intermediate_size}"
    router = _first(c, "scoring_func", default=m.get("router", "?")).replace("sqrtsoftplus", "sqrt-softplus")
    text = f"MoE, {experts} {act} experts, {_first(c, 'num_experts_per_tok', 'top_k_experts')} active"
    shared = _first(c, "n_shared_experts", "num_shared_experts", default=m.get("shared_experts", 0))
    shared = shared or (1 if getattr(c, "shared_expert_intermediate_size", None) else 0)
    text += f" + {shared} shared" if shared else ""
    kinds = list(getattr(c, "mlp_layer_types", None) or [])
    dense = _first(c, "first_k_dense_replace", "num_dense_layers", default=kinds.count("dense"))
    if dense:
        text += f"; first {dense} layer{'s' * (dense > 1)} dense"
    if kinds.count("hash_moe"):
        text += f"; first {kinds.count('hash_moe')} routed by token hash"
    return text + f"; {router} router"


def _check_deepseek_v3(layer_indices=(0, 1), **overrides):
    def check(seed: int) -> list[dict]:
        from ..reference import Reference, compare_with_reference, from_deepseek_v3_layer, hf_call, hf_make, tiny_config

        results = []
        for i in layer_indices:  # 0: dense, 1: MoE
            make = hf_make("deepseek_v3", "DeepseekV3DecoderLayer", "DeepseekV3Config",
                           tiny_config("deepseek_v3", **overrides), layer_idx=i)
            call = hf_call("deepseek_v3", "DeepseekV3DecoderLayer", layer_idx=i, rotary="DeepseekV3RotaryEmbedding")
            ref = Reference("DeepseekV3DecoderLayer", "DeepSeek-V3", make, from_deepseek_v3_layer, call, causal=True)
            results.append(compare_with_reference(ref, seed=seed))
        return results
    return check


def _check_glm5(seed: int) -> list[dict]:
    from ..reference import (Reference, compare_with_reference, from_glm_moe_dsa_layer, hf_glm_moe_dsa_call, hf_make,
                             tiny_config)

    return [compare_with_reference(Reference("GlmMoeDsaDecoderLayer", "GLM-5",
                                             hf_make("glm_moe_dsa", "GlmMoeDsaDecoderLayer", "GlmMoeDsaConfig",
                                                     tiny_config("glm_moe_dsa"), layer_idx=i),
                                             from_glm_moe_dsa_layer, hf_glm_moe_dsa_call, causal=True), seed=seed)
            for i in (0, 1)]  # 0: dense, 1: MoE


def _check_qwen3_5(seed: int) -> list[dict]:
    from ..reference import compare_with_reference, hf_reference, tiny_config

    return [compare_with_reference(hf_reference("Qwen3.5", model_type, f"{prefix}DecoderLayer", f"{prefix}TextConfig",
                                                tiny_config(model_type), layer_idx=i, unit_offset_norms=True,
                                                rotary=f"{prefix}TextRotaryEmbedding"), seed=seed)
            for model_type, prefix in (("qwen3_5", "Qwen3_5"), ("qwen3_5_moe", "Qwen3_5Moe"))
            for i in (0, 1)]  # 0: Gated DeltaNet, 1: gated attention; dense, then MoE


def _check_llama4(seed: int) -> list[dict]:
    from ..reference import compare_with_reference, hf_reference, tiny_config

    return [compare_with_reference(hf_reference(f"Llama 4 (layer {i})", "llama4", "Llama4TextDecoderLayer",
                                                "Llama4TextConfig", tiny_config("llama4"), layer_idx=i), seed=seed)
            for i in range(4)]


def _check_gemma4(seed: int) -> list[dict]:
    from ..reference import compare_with_reference, hf_reference, tiny_config

    return [compare_with_reference(hf_reference(f"Gemma 4 (layer {i})", "gemma4", "Gemma4TextDecoderLayer",
                                                "Gemma4TextConfig", tiny_config("gemma4"), layer_idx=i), seed=seed)
            for i in (0, 1)]  # 0: local (sliding), 1: global


def _check_zoo(*names: str):
    def check(seed: int) -> list[dict]:
        from ..reference import compare_with_reference
        from ..zoo import ZOO

        return [compare_with_reference(row.reference(), seed=seed) for row in ZOO if row.name in names]
    return check


def _check_deepseek_v4(seed: int) -> list[dict]:
    """Whole ``DeepseekV4DecoderLayer``s of each type (:func:`d2lmini.reference.compare_deepseek_v4_layer`)."""
    from ..reference import compare_deepseek_v4_layer

    return [compare_deepseek_v4_layer(i, seed) for i in (0, 1, 2)]  # sliding + hash MoE, HCA, CSA


def deepseek_v4_wiring_check(seed: int = 0, num_streams: int = 4, num_steps: int = 8) -> dict:
    """d2lmini's :class:`~d2lmini.hyper.HyperConnectedBlock` against ``DeepseekV4DecoderLayer``'s wiring.

    V4's attention and MoE are not reproduced, so the HF layer gets the block's own
    attention and FFN modules (wrapped to V4's call signatures); what is compared is
    everything around them: the two hyper-connections (their projections, Sinkhorn-Knopp
    mixing, collapse and expansion of the ``num_streams`` streams) and the two RMSNorms,
    with every parameter random and the same values copied into V4's ``attn_hc``,
    ``ffn_hc``, ``input_layernorm`` and ``post_attention_layernorm``.

    Returns:
        dict with ``max_abs_diff``, ``max_abs_grad_diff`` and ``max_abs_output``, as
        :func:`d2lmini.reference.output_and_grad_differences` gives them on a padded
        batch of streams ``(2, num_steps, num_streams, 32)``.

    Raises:
        ImportError / AttributeError: ``transformers`` lacks DeepSeek-V4.
    """
    import importlib

    from torch import nn

    from ..hyper import HyperConnectedBlock
    from ..reference import output_and_grad_differences, randomize_ as _randomize_

    m = importlib.import_module("transformers.models.deepseek_v4.modeling_deepseek_v4")
    from transformers import DeepseekV4Config

    d = 32
    config = DeepseekV4Config(vocab_size=50, hidden_size=d, num_hidden_layers=1, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=16, q_lora_rank=16, moe_intermediate_size=16,
                              n_routed_experts=4, num_experts_per_tok=2, o_groups=2, o_lora_rank=16, index_n_heads=2,
                              index_head_dim=8, index_topk=4, hc_mult=num_streams)
    valid_lens = torch.tensor([num_steps, num_steps // 2])
    with seeded(seed):
        block = HyperConnectedBlock(d, 4, num_streams=num_streams, causal=True, num_kv_heads=2)
        _randomize_(block, seed)
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():  # the mappings far from uniform: projections large, gains around 1
            for p in [*block.hc1.parameters(), *block.hc2.parameters()]:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() == 2 else 1.0) + (p.numel() <= 3))
        layer = m.DeepseekV4DecoderLayer(config, 0)

    class Attn(nn.Module):  # V4's call: (hidden_states, **kwargs) -> (out, weights)
        def forward(self, hidden_states, **kwargs):
            return block.attention(*(hidden_states,) * 3, valid_lens), None

    class MLP(nn.Module):  # V4's call: (hidden_states, input_ids=None) -> out
        def forward(self, hidden_states, input_ids=None):
            return block.ffn(hidden_states)

    layer.self_attn, layer.mlp = Attn(), MLP()
    with torch.no_grad():
        for theirs, ours in ((layer.attn_hc, block.hc1), (layer.ffn_hc, block.hc2)):
            theirs.fn.copy_(ours.phi), theirs.base.copy_(ours.bias), theirs.scale.copy_(ours.alpha)
        layer.input_layernorm.weight.copy_(block.norm1.weight)
        layer.post_attention_layernorm.weight.copy_(block.norm2.weight)
    gen = torch.Generator().manual_seed(seed + 2)
    S = torch.randn(2, num_steps, num_streams, d, generator=gen)
    R = torch.randn(S.shape, generator=gen)
    keep = (torch.arange(num_steps)[None] < valid_lens[:, None])[..., None, None]  # (b, n, 1, 1)
    return output_and_grad_differences([lambda Z: layer(Z), lambda Z: block(Z, valid_lens)], S, R, keep)


#: The checks of the 2026 table, by name: ``seed -> list of comparison results``.
CHECKS = {
    "DeepSeek-V3 layers": _check_deepseek_v3(),
    "DeepSeek-V3 layers, no expert groups": _check_deepseek_v3((1,), n_group=1, topk_group=1),
    "DeepSeek-V4 (sliding, HCA and CSA layers, hash and top-k MoE)": lambda seed: [
        deepseek_v4_wiring_check(seed), *_check_deepseek_v4(seed)],
    "Qwen3.5 (both layer types, dense and MoE)": _check_qwen3_5,
    "GLM-5 (sparse attention, dense and MoE layers)": _check_glm5,
    "Llama 4 (RoPE and NoPE layers, dense and MoE)": _check_llama4,
    "Gemma 4 (local and global layers, dense)": _check_gemma4,
    "gpt-oss": _check_zoo("gpt-oss", "gpt-oss (full)"),  # its sliding and full-attention layers
    "OLMo 3": _check_zoo("OLMo 3 (sliding)", "OLMo 3 (full)"),
    "Arcee Trinity": _check_zoo("Arcee Trinity (local)", "Arcee Trinity (global)"),
}


@shown_in("zoo")
def verify_2026(row: Row2026, seed: int = 0) -> dict:
    """Reproduce ``row``'s layers with d2lmini where a check exists; report the largest differences.

    Each check (:data:`CHECKS`) builds tiny random instances of the model's own layer
    classes, converts each into d2lmini modules with the same weights and compares
    outputs and input gradients on a padded batch
    (:func:`d2lmini.reference.output_and_grad_differences`). A check whose class the
    installed ``transformers`` lacks is reported in ``status``, not raised.

    Returns:
        dict with ``max_abs_diff``, ``max_abs_grad_diff`` (``None`` when nothing ran) and
        ``status``: ``'verified'``, ``'MISMATCH'``, ``'not reproduced here'`` or
        ``'not in this transformers <version>'``.
    """
    from ..zoo import missing_from_transformers, transformers_version

    if row.check is None:
        return {"max_abs_diff": None, "max_abs_grad_diff": None, "status": "not reproduced here"}
    try:
        results = CHECKS[row.check](seed)
    except (ImportError, AttributeError) as error:
        if missing_from_transformers(error) is None:
            raise  # a real failure, not an older transformers
        return {"max_abs_diff": None, "max_abs_grad_diff": None,
                "status": f"not in this transformers {transformers_version()}"}
    diff = max(r["max_abs_diff"] for r in results)
    grad = max(r["max_abs_grad_diff"] for r in results)
    status = "verified" if max(diff, grad) <= TOLERANCE else "MISMATCH"
    return {"max_abs_diff": diff, "max_abs_grad_diff": grad, "status": status}


def table_2026(seed: int = 0) -> list[dict]:
    """Every row of :data:`ROWS_2026`: :func:`describe_config` and :func:`verify_2026`.

    A row whose configuration class the installed ``transformers`` lacks keeps its name and
    says so in ``status``.

    Returns:
        One dict per row: ``model``, ``year``, ``cite``, ``check``, ``missing``, the columns
        of :func:`describe_config` and those of :func:`verify_2026`.

    Raises:
        ImportError: if ``transformers`` is not installed.
    """
    from transformers.utils import logging as hf_logging  # the table needs transformers; fails clearly without it


    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # not the notices that the tiny layers run transformers' PyTorch fallbacks
    try:
        with torch.random.fork_rng(devices=[]):
            return _table_2026_rows(seed)
    finally:
        hf_logging.set_verbosity(verbosity)


def _table_2026_rows(seed: int) -> list[dict]:
    from ..zoo import missing_from_transformers, transformers_version

    done, rows = {}, []
    for row in ROWS_2026:
        out = {"model": row.model, "year": row.year, "cite": row.cite, "check": row.check, "missing": row.missing}
        try:
            out.update(describe_config(row))
        except (ImportError, AttributeError) as error:
            if missing_from_transformers(error) is None:
                raise
            out.update(status=f"not in this transformers {transformers_version()}", max_abs_diff=None,
                       max_abs_grad_diff=None)
            rows.append(out)
            continue
        if row.check not in done:  # Kimi K2.5 and DeepSeek-V3 share a layer class, not a check
            done[row.check] = verify_2026(row, seed)
        out.update(done[row.check])
        rows.append(out)
    return rows


#: The columns of the 2026 table, as :func:`frame_2026` heads them.
COLUMNS_2026 = {"shape": "layers", "norm": "norm", "residual": "residual", "mixer": "token mixer",
                "attention": "attention", "positions": "positions", "ffn": "FFN", "verified": "reproduced"}


def frame_2026(rows: list[dict]):
    """The 2026 table as a DataFrame indexed by model; the last column says what was verified and how closely."""
    import pandas as pd

    def verified(r):
        if r.get("max_abs_diff") is None:
            return r["status"] + (f": {r['missing']}" if r.get("missing") and r["status"] != "verified" else "")
        text = f"{r['check']}: {r['status']}, max |Δ| {max(r['max_abs_diff'], r['max_abs_grad_diff']):.1e}"
        return text + (f"; not reproduced: {r['missing']}" if r["missing"] else "")

    def name(r):
        size = r.get("size") or f"{r['model']}: class defaults, no released size"
        return f"{size} ({r['year']})"

    return pd.DataFrame([{"model": name(r),
                          **{label: (verified(r) if key == "verified" else r.get(key, "—"))
                             for key, label in COLUMNS_2026.items()}} for r in rows]).set_index("model")


def feature_counts(rows: list[dict]):
    """How many rows of the 2026 table have each feature of :func:`describe_config`, and which.

    Only rows that describe a released model (``size`` not ``None``, see :data:`SIZES`) are
    counted, so that no count rests on a configuration class's defaults.

    Returns:
        A DataFrame indexed by feature with ``rows`` (the count) and ``models``, most common first.
    """
    import pandas as pd

    described = [r for r in rows if "features" in r and r.get("size")]
    names = list(described[0]["features"]) if described else []
    table = pd.DataFrame([{"feature": f, "rows": sum(r["features"][f] for r in described),
                           "models": ", ".join(r["model"] for r in described if r["features"][f])} for f in names])
    return table.sort_values("rows", ascending=False, kind="stable").set_index("feature")


def the_2026_block(num_hiddens: int = 256, num_heads: int = 8, *, num_layers: int = 4, num_kv_heads: int = 2,
                   window: int = 64, local_global: str | None = None, qk_norm: str | None = None,
                   rope_theta: float = 1e4, num_experts: int = 8, top_k: int = 2, expert_hiddens: int = 128,
                   num_shared_experts: int = 1, router: str = "sigmoid") -> torch.nn.ModuleList:
    """A stack of ``num_layers`` 2026 blocks: the most common choice per column of the 2026 table.

    Pre-norm RMSNorm blocks with GQA (``num_kv_heads`` key/value heads), RoPE, ``qk_norm``
    (``None`` or a :class:`~d2lmini.block.TransformerBlock` variant) and a mixture of SwiGLU
    experts with shared experts; with ``local_global`` (e.g. ``'3:1'``), that many local layers
    with a sliding ``window`` per global layer, the local ones first; with ``None``, every layer
    global. The other arguments are those of :class:`~d2lmini.block.TransformerBlock` and
    :class:`~d2lmini.moe.MixtureOfExperts` (which check them).

    Raises:
        ValueError: ``local_global`` neither ``None`` nor of the form ``'3:1'``, or as the block and the mixture.
    """
    if local_global is not None and not (isinstance(local_global, str)
                                         and re.fullmatch(r"\d+:[1-9]\d*", local_global)):
        raise ValueError(f"local_global must be None or read 'local:global', e.g. '3:1', got {local_global!r}")
    local, full = (int(x) for x in (local_global or "0:1").split(":"))

    def moe():
        return MixtureOfExperts(num_hiddens, num_experts, top_k=top_k, ffn_num_hiddens=expert_hiddens, act="swiglu",
                                router=router, num_shared_experts=num_shared_experts)

    blocks = []
    for i in range(num_layers):
        is_local = i % (local + full) < local
        blocks.append(TransformerBlock(num_hiddens, num_heads, norm="rms", placement="pre", bias=False,
                                       num_kv_heads=num_kv_heads, rope_theta=rope_theta, qk_norm=qk_norm,
                                       causal=True, window=window if is_local else None, ffn_factory=moe))
    return torch.nn.ModuleList(blocks)


#: The rows of the block zoo that :func:`zoo_switches` puts side by side by default:
#: an encoder of 2018, a local layer of 2024 and a sliding-window layer of 2025.
ZOO_DECADE = ("BERT", "Gemma 2 (local)", "OLMo 3 (sliding)")

#: The arguments :func:`block_switches` reads back, in order.
SWITCHES = ("norm", "placement", "act", "bias", "causal", "qk_norm", "rope_theta", "window", "logit_softcap",
            "scale", "residual_multiplier")


def block_switches(block: TransformerBlock) -> dict:
    """The constructor arguments of a block that are not sizes, read back from its modules.

    Args:
        block: a :class:`~d2lmini.block.TransformerBlock` with the default attention and FFN.

    Returns:
        dict ``argument -> value`` (the keys of :data:`SWITCHES`) as
        :class:`~d2lmini.block.TransformerBlock` would take it: ``norm``, ``placement``, ``act``, ``bias`` (``True``, ``False`` or ``'qkv'``),
        ``causal``, ``qk_norm``, ``rope_theta``, ``window``, ``logit_softcap``, ``scale`` (the
        attention's logit scale; ``None``: ``1/sqrt(head_dim)``) and ``residual_multiplier`` (as
        :meth:`~d2lmini.block.TransformerBlock.set_scales` takes it).

    Raises:
        TypeError: if ``block`` is not a TransformerBlock.
    """
    check_instance("block", block, TransformerBlock, "a d2lmini TransformerBlock")
    att = block.attention
    bias = att.W_q.bias is not None
    if bias and block.ffn.W_1.bias is None:
        bias = "qkv"
    values = (block.norm, block.placement, block.ffn.act, bias, att.causal, att.qk_norm, att.rope_theta, att.window,
              getattr(att, "logit_softcap", None), att.scale, block.addnorm1.residual_multiplier)
    return dict(zip(SWITCHES, values))


def zoo_switches(names=ZOO_DECADE, seed: int = 0):
    """Rows of the block zoo side by side, as the arguments their converted blocks hold.

    Each named row of :data:`d2lmini.zoo.ZOO` is built, converted and checked by
    :func:`d2lmini.zoo.zoo_table`; :func:`block_switches` then reads the arguments
    back from the converted block.

    Args:
        names: display names of zoo rows (default :data:`ZOO_DECADE`).
        seed: seeds the tiny layers and the check.

    Returns:
        ``(table, rows)``: a ``pandas.DataFrame`` with one line per argument and one
        column per model (values written as in Python, e.g. ``'rms'``, ``None``; a
        model whose layer class the installed ``transformers`` lacks has its status in
        every line), and the rows of :func:`~d2lmini.zoo.zoo_table`.

    Raises:
        ValueError: if a name is not a row of the zoo (the message lists them).
    """
    import pandas as pd

    from .. import zoo

    by_name = {row.name: row for row in zoo.ZOO}
    for name in names:
        if name not in by_name:
            raise ValueError(f"names: {name!r} is not a row of d2lmini.zoo.ZOO; rows: {sorted(by_name)}")
    rows = zoo.zoo_table(seed=seed, rows=[by_name[name] for name in names])

    def written(value):  # as in Python, with non-round floats to four digits
        return f"{value:.4g}" if isinstance(value, float) and not value.is_integer() else repr(value)

    columns = {}
    for row in rows:
        header = f"{row['name']}, {row['year']}"
        if row["block"] is None:
            columns[header] = dict.fromkeys(SWITCHES, row["status"])
        else:
            columns[header] = {key: written(value) for key, value in block_switches(row["block"]).items()}
    return pd.DataFrame(columns).rename_axis("argument"), rows



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
    "BLOCK_2017", "CAPSTONE_MODEL", "CAPSTONE_TRAINING", "CONSTRUCTOR_GROUPS", "LM_2017", "MODELS", "RATES",
    "ROUTERS", "SAMPLE_PROMPT", "SUBSTITUTIONS", "TEMPERATURES", "TOLERANCE", "TOP_KS",
    "WALK_RATE", "WARMUP_STEPS", "Run",
    "best_runs", "cache_measurements", "capstone_table", "float16_agreement", "lm_walk", "matched_ffn_num_hiddens",
    "model_explorer", "plot_capstone", "sample_explorer", "train_capstone", "walk_table",
    "GatedAttention", "MixtureOfExperts", "Step",
    "catalog_table", "compare_with_trinity", "constructor_arguments", "constructor_groups", "describe_block",
    "fit_to_page", "from_afmoe_layer",
    "rope_relative_check", "sinusoidal_positions",
    "step_table", "substitution_steps", "verification_table", "who_uses_what",
]
