"""RMSNorm's chapter: how it relates to LayerNorm, what it costs and where its numerics bite.

Introduced in the chapter "RMSNorm: keep the scale, drop the centring". Root-mean-square
layer normalization (Zhang & Sennrich, 2019) divides every token by the root mean
square of its features, ``y = x / sqrt(mean(x**2) + eps) * weight``: no mean is
subtracted and there is no bias. The layer itself is :class:`d2lmini.RMSNorm`
(in :mod:`d2lmini.norms`); this module holds the chapter's measurements:

* :func:`compare_with_layernorm`: RMSNorm equals LayerNorm on zero-mean tokens;
* :func:`half_precision_errors`: the error of RMSNorm in bfloat16 and float16 with the
  float32 upcast (:class:`d2lmini.RMSNorm`) and without it
  (:func:`rms_norm_no_upcast`, the counter-example), for inputs of several scales,
  and :func:`plot_half_precision_errors` to draw it;
* :func:`norm_comparison`: the same small language model trained with LayerNorm and
  with RMSNorm over several seeds, all in lockstep (:func:`train_with_norms`).

The chapter's timing of the norms is :func:`d2lmini.timing.time_norms`.

Shapes use the legend ``*`` = any leading dimensions, ``d`` = num_hiddens.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from .._checks import check_seed as _check_seed
from .._checks import check_seeds as _check_seeds
from .._checks import (check_choice, check_dtype_name, check_instance, check_finite_float, check_float_tensor,
                       check_positive_float, check_positive_floats, check_positive_int, check_sequence, check_vector)
from ..data import CharCorpus
from ..norms import COMPARED_NORMS, NORMS, RMSNorm
from ..plot import HALF_VARIANT_COLORS, HALF_VARIANT_LABELS, styled_figure
from ..seeding import seeded
from ..train import run_in_workers, train_and_evaluate
from .._shown import shown_in

#: The epsilon this chapter uses for every RMSNorm: the ``rms_norm_eps`` of Qwen3's released
#: configurations (Llama 3's released configurations use 1e-5).
EPS = 1e-6

#: Half-precision dtypes accepted by :func:`half_precision_errors`, by name.
HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


#: The variants :func:`half_precision_errors` measures (their labels and colours:
#: :data:`d2lmini.plot.HALF_VARIANT_LABELS`, :data:`d2lmini.plot.HALF_VARIANT_COLORS`).
HALF_VARIANTS = tuple(HALF_VARIANT_LABELS)


# --- the counter-example and the same-style LayerNorm -------------------------------


def half_precision_sum(X: torch.Tensor) -> torch.Tensor:
    """Sum the last dimension of ``X`` pairwise, rounding every partial sum to ``X.dtype``.

    PyTorch's own ``sum`` and ``mean`` accumulate half-precision tensors in float32
    internally and round only the result. This function instead adds neighbours in a
    tree of ``ceil(log2(d))`` levels, and every addition is a separate tensor operation
    in ``X.dtype``, so each partial sum is stored in that dtype: what a reduction kept
    entirely in half precision does. (The tree is the kind case; a sequential loop
    loses far more.)

    Introduced in the chapter "RMSNorm".

    Args:
        X: floating tensor ``(*, d)``.

    Returns:
        ``(*, 1)`` tensor of ``X.dtype``. In float16 it is ``inf`` once a partial sum
        exceeds 65504.

    Raises:
        TypeError: if ``X`` is not a floating-point tensor.
        ValueError: if ``X`` is a scalar.
    """
    X = check_float_tensor("X", X)
    width = 1
    while width < X.shape[-1]:
        width *= 2
    if width != X.shape[-1]:  # pad with zeros up to a power of two
        X = torch.cat([X, X.new_zeros(*X.shape[:-1], width - X.shape[-1])], dim=-1)
    while X.shape[-1] > 1:
        X = X[..., 0::2] + X[..., 1::2]
    return X


@shown_in("ch05")
def rms_norm_no_upcast(X: torch.Tensor, weight: torch.Tensor | None = None,
                       eps: float = EPS) -> torch.Tensor:
    """RMSNorm computed entirely in ``X``'s dtype: the counter-example to the fp32 upcast.

    Squares, sum of squares (:func:`half_precision_sum`), mean, ``rsqrt`` and products
    all stay in ``X.dtype``. In float16 the sum of squares overflows to ``inf`` once
    ``d * mean(x**2)`` exceeds 65504 (for ``d = 4096``: an RMS above 4), and every
    output is then 0; squares below about 6e-5 lose digits as subnormals. In
    bfloat16 every partial sum keeps only 8 significant bits. Compare
    :class:`d2lmini.RMSNorm`, which computes the statistic in float32.

    Introduced in the chapter "RMSNorm".

    Args:
        X: floating tensor ``(*, d)``.
        weight: optional gain ``(d,)`` (applied in ``X.dtype``).
        eps: added to the mean square, > 0 (rounded to ``X.dtype``).

    Returns:
        Tensor of the same shape and dtype as ``X``.

    Raises:
        TypeError: if ``X`` is not a floating-point tensor or ``eps`` not a number.
        ValueError: if ``X`` is a scalar, ``eps <= 0``, or ``weight`` is not ``(d,)``.
    """
    X = check_float_tensor("X", X)
    eps = check_positive_float("eps", eps)
    weight = check_vector("weight", weight, X.shape[-1])
    mean_square = half_precision_sum(X * X) / X.shape[-1]
    Y = X * torch.rsqrt(mean_square + eps)
    return Y if weight is None else Y * weight.to(X.dtype)


def rms_norm_torch_mean(X: torch.Tensor, weight: torch.Tensor | None = None,
                        eps: float = EPS) -> torch.Tensor:
    """RMSNorm written with ``X.pow(2).mean()`` in ``X``'s dtype, with no explicit upcast.

    The obvious line of PyTorch. Its squares are stored in ``X.dtype`` (float16: ``inf``
    above 65504, i.e. for entries larger than 256 in magnitude; subnormal below about
    6e-5), but ``mean`` accumulates in float32 inside the kernel and rounds only the
    result to ``X.dtype``, so it is half-protected: it does not overflow where
    :func:`rms_norm_no_upcast` does.

    Introduced in the chapter "RMSNorm".

    Args:
        X: floating tensor ``(*, d)``.
        weight: optional gain ``(d,)``.
        eps: added to the mean square, > 0.

    Returns:
        Tensor of the same shape and dtype as ``X``.

    Raises:
        TypeError / ValueError: as :func:`rms_norm_no_upcast`.
    """
    X = check_float_tensor("X", X)
    eps = check_positive_float("eps", eps)
    weight = check_vector("weight", weight, X.shape[-1])
    Y = X * torch.rsqrt(X.pow(2).mean(dim=-1, keepdim=True) + eps)
    return Y if weight is None else Y * weight.to(X.dtype)


# --- RMSNorm against LayerNorm -------------------------------------------------------


@shown_in("ch05")
def layernorm_gap(X: torch.Tensor, eps: float = EPS) -> float:
    """The largest entry of ``|LayerNorm(X) - RMSNorm(X)|``, both norms as initialized.

    ``nn.LayerNorm`` (gain 1, bias 0) and :class:`d2lmini.RMSNorm` (gain 1) of width
    ``d`` with the same ``eps`` (Ba et al., 2016; Zhang & Sennrich, 2019), applied to
    the tokens ``X`` of shape ``(*, d)`` in float32. Zero up to rounding when every
    token has mean zero. Chapter "RMSNorm".

    Raises:
        TypeError: if ``X`` is not a floating-point tensor. ValueError: if it is a scalar.
    """
    X = check_float_tensor("X", X)
    layer = nn.LayerNorm(X.shape[-1], eps=eps)
    rms = RMSNorm(X.shape[-1], eps=eps)
    with torch.no_grad():
        return float((layer(X) - rms(X)).abs().max())


def compare_with_layernorm(num_hiddens: int = 512, num_tokens: int = 64, offset: float = 1.0,
                           eps: float = EPS, seed: int = 0) -> dict:
    """RMSNorm and LayerNorm on the same tokens, with and without their mean removed.

    For a token with zero mean, LayerNorm's variance ``mean((x - mean x)**2)`` is
    RMSNorm's ``mean(x**2)``, so at equal eps (gain 1, bias 0, as both are
    initialized) the two give the same output. Tokens are drawn standard normal,
    plus ``offset`` in every feature; the "centred" tokens have their own mean
    subtracted. All in float32.

    Introduced in the chapter "RMSNorm".

    Args:
        num_hiddens: ``d``.
        num_tokens: how many tokens are compared.
        offset: added to every feature of the raw tokens (makes their mean non-zero).
        eps: the epsilon of both norms, > 0.
        seed: seeds the random tokens (the global RNG is left untouched).

    Returns:
        A dict: ``"max_dev_centred"``, the largest ``abs(LN(x_c) - RMS(x_c))`` over the
        centred tokens; ``"max_dev_raw"``, the same for the raw tokens;
        ``"max_abs_token_mean"``, the largest ``abs(mean)`` of a centred token (floats);
        and the arguments ``"num_hiddens"``, ``"num_tokens"``, ``"offset"``.

    Raises:
        TypeError / ValueError: for a non-int ``num_hiddens``/``num_tokens``/``seed``,
            a non-positive size or ``eps``, or a non-finite ``offset``.
    """
    num_hiddens = check_positive_int("num_hiddens", num_hiddens)
    num_tokens = check_positive_int("num_tokens", num_tokens)
    eps = check_positive_float("eps", eps)
    seed = _check_seed(seed)
    offset = check_finite_float("offset", offset)
    with seeded(seed):
        X = torch.randn(num_tokens, num_hiddens) + float(offset)
    centred = X - X.mean(dim=-1, keepdim=True)
    return {
        "max_dev_centred": layernorm_gap(centred, eps),
        "max_dev_raw": layernorm_gap(X, eps),
        "max_abs_token_mean": float(centred.mean(dim=-1).abs().max()),
        "num_hiddens": num_hiddens,
        "num_tokens": num_tokens,
        "offset": float(offset),
    }


# --- does it train as well? ---------------------------------------------------------

#: The model and training run of :func:`norm_comparison`: the book's recipe
#: (:data:`d2lmini.train.RECIPE`, :data:`d2lmini.train.RECIPE_MODEL`), a 4-block, 64-wide pre-norm
#: character model (4 heads, SwiGLU, no biases inside the blocks, learned positions), trained for
#: 150 AdamW steps of 32 windows of 64 characters, peak rate 0.01 after 50 warm-up steps, cosine
#: decay to 10%, betas (0.9, 0.95), every model's gradient clipped to norm 1.
NORM_COMPARISON_CONFIG = dict(num_hiddens=64, num_heads=4, num_layers=4, placement="pre", act="swiglu",
                              bias=False, num_steps=150, batch_size=32, seq_len=64, lr=1e-2, warmup_steps=50,
                              betas=(0.9, 0.95), clip_norm=1.0, eval_batches=8)


@dataclass
class NormComparison:
    """The result of :func:`norm_comparison`.

    Introduced in the chapter "RMSNorm".

    Attributes:
        norms: the norms compared (``'layer'``, ``'rms'``).
        seeds: the seeds, the same for every norm.
        val_loss: norm -> one final validation loss per seed (nats per character).
        train_loss: norm -> one list of per-step training losses per seed.
        seconds: wall time of the whole comparison (every norm and seed).
        config: the model and training settings shared by every run.
    """

    norms: list[str]
    seeds: list[int]
    val_loss: dict[str, list[float]]
    train_loss: dict[str, list[list[float]]]
    seconds: float
    config: dict = field(default_factory=dict)

    def mean(self, norm: str) -> float:
        """Mean over the seeds of ``norm``'s final validation loss."""
        return statistics.fmean(self.val_loss[norm])

    def std(self, norm: str) -> float:
        """Sample standard deviation over the seeds of ``norm``'s final validation loss (0 for one seed)."""
        values = self.val_loss[norm]
        return statistics.stdev(values) if len(values) > 1 else 0.0

    def table(self):
        """A pandas DataFrame: one row per seed plus ``mean`` and ``std``, one column per norm."""
        import pandas as pd

        rows = {f"seed {s}": {n: self.val_loss[n][i] for n in self.norms} for i, s in enumerate(self.seeds)}
        rows["mean"] = {n: self.mean(n) for n in self.norms}
        rows["std"] = {n: self.std(n) for n in self.norms}
        return pd.DataFrame(rows).T.rename(columns={"layer": "LayerNorm", "rms": "RMSNorm"})


def train_with_norms(corpus: CharCorpus, norms, seeds, config: dict, num_workers: int = 2) -> dict:
    """Train a TinyLM per (norm, seed), the seeds of a norm in lockstep; score each on the same held-out text.

    Model ``(norm, s)`` is what ``d2lmini.train.train_lm(corpus, seed=s, norm=norm, ...)``
    trains: weights and batches from seed ``s``, so the two norms of a seed start from
    the same weights (a LayerNorm's bias starts at 0) and see the same batches. Each norm's
    seeds train in one :func:`d2lmini.train.train_and_evaluate` call; the norms go to
    ``num_workers`` worker processes (:func:`d2lmini.train.run_in_workers`, the same numbers
    whatever ``num_workers``).
    Returns ``{norm: (final validation losses, per-step training losses)}``, one per seed.
    """
    model = {k: config[k] for k in ("num_hiddens", "num_heads", "num_layers", "placement", "act", "bias")}
    jobs = [dict(corpus=corpus, seeds=list(seeds), model_kwargs=[dict(model, norm=norm)] * len(seeds),
                 num_steps=config["num_steps"], batch_size=config["batch_size"], seq_len=config["seq_len"],
                 lr=config["lr"], warmup_steps=config["warmup_steps"], schedule="cosine",
                 eval_batches=config["eval_batches"], betas=tuple(config["betas"]), clip_norm=config["clip_norm"])
            for norm in norms]
    results = run_in_workers(train_and_evaluate, jobs, num_workers=num_workers)
    return {norm: (val, log.losses) for norm, (log, val) in zip(norms, results)}


def norm_comparison(corpus: CharCorpus, norms=COMPARED_NORMS, seeds=(0, 1, 2), num_workers: int = 2,
                    **overrides) -> NormComparison:
    """Does RMSNorm train a language model as well as LayerNorm? One small run per norm and seed.

    Trains the :class:`~d2lmini.train.TinyLM` of :data:`NORM_COMPARISON_CONFIG` (pre-norm,
    so the norms sit before each sublayer and before the output layer) once per norm
    and seed, the seeds of a norm in one lockstep through :func:`d2lmini.train.train_models`
    and the norms in worker processes (:func:`train_with_norms`), and records each run's final validation loss
    (:func:`d2lmini.train.evaluate` on the same fixed windows of the held-out text).
    Zhang and Sennrich (2019) report that RMSNorm matches LayerNorm's quality; this
    measures it on the book's model.

    Introduced in the chapter "RMSNorm".

    Args:
        corpus: the data (:func:`d2lmini.data.python_reference_corpus`).
        norms: names from :data:`d2lmini.norms.NORMS`, each once (default
            :data:`d2lmini.norms.COMPARED_NORMS`, LayerNorm and RMSNorm).
        seeds: distinct ints >= 0, the same for every norm.
        num_workers: worker processes (the norms go to different workers; the numbers do not
            depend on it).
        **overrides: replace entries of :data:`NORM_COMPARISON_CONFIG` (e.g. ``num_steps=600``).

    Returns:
        A :class:`NormComparison`.

    Raises:
        TypeError / ValueError: for a corpus that is not a ``CharCorpus``, unknown or
            repeated norms, bad seeds, unknown override names, or values the model or
            the training loop rejects.
    """
    check_instance("corpus", corpus, CharCorpus, "a d2lmini.data.CharCorpus")
    norms = check_sequence("norms", norms, lambda name, n: check_choice(name, n, NORMS), f"names from {NORMS}")
    if len(set(norms)) != len(norms):
        raise ValueError(f"norms must be distinct, got {norms}")
    seeds = _check_seeds(seeds)
    unknown = sorted(set(overrides) - set(NORM_COMPARISON_CONFIG))
    if unknown:
        raise TypeError(f"norm_comparison got unknown settings {unknown}; "
                        f"the settings are {sorted(NORM_COMPARISON_CONFIG)}")
    config = {**NORM_COMPARISON_CONFIG, **overrides}
    for name in ("num_steps", "batch_size", "seq_len", "eval_batches"):
        config[name] = check_positive_int(name, config[name])
    start = time.perf_counter()
    runs = train_with_norms(corpus, norms, seeds, config, num_workers)
    return NormComparison(norms, seeds, {n: runs[n][0] for n in norms}, {n: runs[n][1] for n in norms},
                          time.perf_counter() - start, config)


# --- the float32 upcast --------------------------------------------------------------


def relative_error(Y: torch.Tensor, reference: torch.Tensor) -> float:
    """Worst token's relative error: ``max over tokens of ||y - ref||_2 / ||ref||_2``.

    Introduced in the chapter "RMSNorm".

    Args:
        Y, reference: tensors of the same shape ``(*, d)`` (any floating dtypes; compared
            in float64; their gradients are not tracked).

    Returns:
        A Python float (1.0 for an output of zeros; ``inf``/``nan`` propagate).

    Raises:
        ValueError: if the shapes differ.
    """
    if Y.shape != reference.shape:
        raise ValueError(f"Y and reference must have the same shape, got {tuple(Y.shape)} "
                         f"and {tuple(reference.shape)}")
    Y, reference = Y.detach().double(), reference.detach().double()
    return float(((Y - reference).norm(dim=-1) / reference.norm(dim=-1)).max())


def half_precision_errors(dtypes=("bfloat16", "float16"), scales=(1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0),
                          num_hiddens: int = 4096, num_tokens: int = 32, eps: float = EPS,
                          seed: int = 0) -> list[dict]:
    """How far RMSNorm in half precision lands from float32, with and without the upcast.

    For every dtype and scale ``s``, the tokens are ``s * randn(num_tokens, num_hiddens)``
    rounded to the dtype (so their RMS is about ``s``). Three computations on that
    same half-precision input are compared with the float32 reference
    (:class:`d2lmini.RMSNorm` in float32 on the input's exact values):

    * ``"upcast"``: :class:`d2lmini.RMSNorm` in the dtype: statistic in float32,
      the normalized output rounded to the dtype before the gain (Llama's and
      Qwen3's order; OLMo 2 also upcasts but applies its gain before rounding);
    * ``"torch_mean"``: :func:`rms_norm_torch_mean`, squares in the dtype, PyTorch's
      ``mean`` (float32 accumulator inside, result rounded to the dtype);
    * ``"no_upcast"``: :func:`rms_norm_no_upcast`, everything in the dtype.

    The error is :func:`relative_error` (worst token). Also recorded: the largest
    sum of squares of a token, the quantity that overflows float16 above 65504.

    Introduced in the chapter "RMSNorm".

    Args:
        dtypes: names (or torch dtypes) among ``"bfloat16"``, ``"float16"``.
        scales: input RMS values, each > 0.
        num_hiddens: ``d`` (4096 is a Llama-7B-sized width).
        num_tokens: tokens per (dtype, scale).
        eps: the norms' epsilon, > 0.
        seed: seeds the tokens (the same draws for every dtype); the global RNG is
            left untouched.

    Returns:
        A list of dicts, one per (dtype, scale), with keys ``"dtype"``, ``"scale"``,
        ``"max_sum_of_squares"`` and one per variant of :data:`HALF_VARIANTS`.

    Raises:
        TypeError / ValueError: for unknown dtypes, non-positive scales or sizes, bad seed.
    """
    names = check_sequence("dtypes", dtypes, lambda name, d: check_dtype_name(name, d, HALF_DTYPES),
                           f"dtype names from {tuple(HALF_DTYPES)}")
    scales = check_positive_floats("scales", scales)
    num_hiddens = check_positive_int("num_hiddens", num_hiddens)
    num_tokens = check_positive_int("num_tokens", num_tokens)
    eps = check_positive_float("eps", eps)
    with seeded(seed):
        Z = torch.randn(len(scales), num_tokens, num_hiddens)
    return [{"dtype": name, "scale": s, **half_precision_row((s * z).to(HALF_DTYPES[name]), eps)}
            for name in names for s, z in zip(scales, Z)]


@shown_in("ch05")
def half_precision_row(X: torch.Tensor, eps: float = EPS) -> dict:
    """The three ways of computing RMSNorm on the half-precision tokens ``X``, ``(*, d)``.

    Each result's :func:`relative_error` (worst token) against :class:`d2lmini.RMSNorm`
    in float32 on the same values, under the keys of :data:`HALF_VARIANTS`, and the
    largest sum of squares of a token, ``"max_sum_of_squares"``. Chapter "RMSNorm".

    Raises:
        TypeError: if ``X`` is not a floating-point tensor. ValueError: if it is a scalar.
    """
    X = check_float_tensor("X", X)
    d = X.shape[-1]
    with torch.no_grad():
        reference = RMSNorm(d, eps=eps)(X.float())
        upcast = RMSNorm(d, eps=eps).to(X.dtype)(X)
        return {
            "max_sum_of_squares": float(X.double().pow(2).sum(dim=-1).max()),
            "upcast": relative_error(upcast, reference),
            "torch_mean": relative_error(rms_norm_torch_mean(X, eps=eps), reference),
            "no_upcast": relative_error(rms_norm_no_upcast(X, eps=eps), reference),
        }


def half_precision_table(rows: list[dict]):
    """The output of :func:`half_precision_errors` as a pandas DataFrame, one row per result.

    Indexed by (``dtype``, ``input RMS``); columns ``max sum x²`` (the largest sum of
    squares of a token) and one per variant (``upcast``, ``torch .mean()``,
    ``half throughout``), the relative errors.

    Introduced in the chapter "RMSNorm".

    Raises:
        ValueError: if ``rows`` is empty.
    """
    import pandas as pd

    if not rows:
        raise ValueError("rows must hold at least one result of half_precision_errors, got none")
    return pd.DataFrame({
        "dtype": [r["dtype"] for r in rows],
        "input RMS": [r["scale"] for r in rows],
        "max sum x²": [r["max_sum_of_squares"] for r in rows],
        "upcast": [r["upcast"] for r in rows],
        "torch .mean()": [r["torch_mean"] for r in rows],
        "half throughout": [r["no_upcast"] for r in rows],
    }).set_index(["dtype", "input RMS"])


def plot_half_precision_errors(rows: list[dict]):
    """Error against input RMS, one panel per dtype, one line per variant (log-log).

    Introduced in the chapter "RMSNorm".

    Args:
        rows: the output of :func:`half_precision_errors`.

    Returns:
        A ``matplotlib.figure.Figure`` (8 x 3 inches) made with :func:`d2lmini.plot.new_figure`.

    Raises:
        ValueError: if ``rows`` is empty.
    """
    if not rows:
        raise ValueError("rows must hold at least one result of half_precision_errors, got none")
    names = list(dict.fromkeys(r["dtype"] for r in rows))
    with styled_figure(len(names), width=8.0, height=3.1, sharey=True) as (fig, axes):
        axes = [axes] if len(names) == 1 else list(axes)
        for ax, name in zip(axes, names):
            mine = [r for r in rows if r["dtype"] == name]
            scales = [r["scale"] for r in mine]
            for variant, label in HALF_VARIANT_LABELS.items():
                ax.loglog(scales, [r[variant] for r in mine], marker="o", markersize=4,
                          color=HALF_VARIANT_COLORS[variant], label=label,
                          linestyle="--" if variant == "torch_mean" else "-")
            ax.set(xlabel="input RMS", title=name)
        axes[0].set_ylabel("relative error vs float32\n(worst token)")
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center",
                   ncol=len(HALF_VARIANTS), frameon=False)
    return fig
