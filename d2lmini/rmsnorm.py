"""RMSNorm's chapter: how it relates to LayerNorm, what it costs and where its numerics bite.

Introduced in the chapter "RMSNorm: keep the scale, drop the centring". Root-mean-square
layer normalization (Zhang & Sennrich, 2019) divides every token by the root mean
square of its features, ``y = x / sqrt(mean(x**2) + eps) * weight``: no mean is
subtracted and there is no bias. The layer itself is :class:`d2lmini.RMSNorm`
(in :mod:`d2lmini.norms`); this module holds the chapter's measurements:

* :func:`compare_with_layernorm`: RMSNorm equals LayerNorm on zero-mean tokens;
* :func:`compare_with_torch`: ``d2lmini.RMSNorm`` against ``torch.nn.RMSNorm``, at
  equal eps and with PyTorch's default ``eps=None`` (a machine epsilon, not 1e-6);
* :func:`parameter_counts`: LayerNorm has ``2d`` parameters, RMSNorm ``d``;
* :func:`time_norms`: forward and forward + backward times of four norms measured in
  one run, alternating, as medians and ratios, with :func:`machine_description`;
* :func:`half_precision_errors`: the error of RMSNorm in bfloat16 and float16 with the
  float32 upcast (:class:`d2lmini.RMSNorm`) and without it
  (:func:`rms_norm_no_upcast`, the counter-example), for inputs of several scales,
  and :func:`plot_half_precision_errors` to draw it.

Shapes use the legend ``*`` = any leading dimensions, ``d`` = num_hiddens.
"""

from __future__ import annotations

import numbers
import os
import platform
import statistics
import time
from dataclasses import dataclass, field

import matplotlib
import torch
from torch import nn

from ._checks import check_seed as _check_seed
from ._checks import check_choice, check_positive_float, check_positive_int
from .block import TransformerBlock
from .norms import RMSNorm
from .plot import STYLE, new_figure

#: The epsilon this chapter uses for every RMSNorm (Llama 3, Qwen3, OLMo 2).
EPS = 1e-6

#: Half-precision dtypes accepted by :func:`half_precision_errors`, by name.
HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}

#: The norms :func:`time_norms` times, by key, with a label for tables and prose.
TIMED_NORMS = {
    "layer_torch": "torch.nn.LayerNorm",
    "rms_torch": "torch.nn.RMSNorm",
    "rms_d2lmini": "d2lmini.RMSNorm",
    "layer_by_hand": "LayerNormByHand",
}

#: Clocks :func:`time_norms` can read: CPU time of the calling thread, or wall-clock time.
CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}

#: The variants :func:`half_precision_errors` measures, with a label for legends.
HALF_VARIANTS = {
    "upcast": "float32 upcast (d2lmini.RMSNorm)",
    "torch_mean": "half, torch .mean()",
    "no_upcast": "half throughout",
}

#: One colour per variant in :func:`plot_half_precision_errors`.
HALF_COLORS = {"upcast": "#2471a3", "torch_mean": "#d68910", "no_upcast": "#c0392b"}


def _check_float_tensor(name: str, X) -> torch.Tensor:
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(X).__name__}")
    if not X.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {X.dtype}")
    if X.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (*, num_hiddens), got a scalar")
    return X


def _check_weight(weight, X: torch.Tensor):
    if weight is None:
        return None
    d = X.shape[-1]
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (d,):
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be None or a tensor of shape ({d},), got {shape}")
    return weight


def _check_scales(scales) -> tuple[float, ...]:
    if isinstance(scales, (str, bytes)) or not hasattr(scales, "__iter__"):
        raise TypeError(f"scales must be a sequence of positive floats, got {type(scales).__name__}")
    scales = tuple(check_positive_float("scales", s) for s in scales)
    if not scales:
        raise ValueError("scales must hold at least one value, got an empty sequence")
    return scales


def _check_dtype_name(name: str, value, allowed: dict) -> str:
    if isinstance(value, torch.dtype):
        value = next((k for k, v in allowed.items() if v == value), str(value))
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)} (or the torch dtypes), got {value!r}")
    return value


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
    X = _check_float_tensor("X", X)
    width = 1
    while width < X.shape[-1]:
        width *= 2
    if width != X.shape[-1]:  # pad with zeros up to a power of two
        X = torch.cat([X, X.new_zeros(*X.shape[:-1], width - X.shape[-1])], dim=-1)
    while X.shape[-1] > 1:
        X = X[..., 0::2] + X[..., 1::2]
    return X


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
    X = _check_float_tensor("X", X)
    eps = check_positive_float("eps", eps)
    weight = _check_weight(weight, X)
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
    X = _check_float_tensor("X", X)
    eps = check_positive_float("eps", eps)
    weight = _check_weight(weight, X)
    Y = X * torch.rsqrt(X.pow(2).mean(dim=-1, keepdim=True) + eps)
    return Y if weight is None else Y * weight.to(X.dtype)


class LayerNormByHand(nn.Module):
    """LayerNorm written in the same style as :class:`d2lmini.RMSNorm`, for a fair timing.

    Computes ``y = (x - mean(x)) / sqrt(mean((x - mean(x))**2) + eps) * weight + bias``
    (Ba, Kiros & Hinton, 2016) with the same PyTorch operations RMSNorm uses: the
    statistics in float32, cast back to the input's dtype before the gain. Against
    RMSNorm it has one more reduction (the mean), one more subtraction and the bias.
    Numerically it equals ``torch.nn.LayerNorm``; it exists so that
    :func:`time_norms` can compare two norms written alike.

    Introduced in the chapter "RMSNorm".

    Args:
        num_hiddens: size ``d`` of the normalized last dimension.
        eps: added to the variance, > 0 (default 1e-5, as ``torch.nn.LayerNorm``).

    Shape:
        ``(*, d)`` in, the same shape out.

    Raises:
        TypeError / ValueError: if ``num_hiddens`` is not a positive int or ``eps`` not > 0.
    """

    def __init__(self, num_hiddens: int, eps: float = 1e-5):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.eps = check_positive_float("eps", eps)
        self.weight = nn.Parameter(torch.ones(self.num_hiddens))
        self.bias = nn.Parameter(torch.zeros(self.num_hiddens))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Normalize ``X``, shape ``(*, d)``, over its last dimension; returns the same shape."""
        if not isinstance(X, torch.Tensor) or X.dim() == 0 or X.shape[-1] != self.num_hiddens:
            shape = tuple(X.shape) if isinstance(X, torch.Tensor) else type(X).__name__
            raise ValueError(f"LayerNormByHand input must have last dimension {self.num_hiddens}, "
                             f"got {shape}")
        X32 = X.float()
        centred = X32 - X32.mean(dim=-1, keepdim=True)
        Y = centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return Y.to(X.dtype) * self.weight + self.bias


# --- RMSNorm against LayerNorm and against torch.nn.RMSNorm --------------------------


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
    if isinstance(offset, bool) or not isinstance(offset, numbers.Real) or not abs(offset) < float("inf"):
        raise ValueError(f"offset must be a finite number, got {offset!r}")
    layer, rms = nn.LayerNorm(num_hiddens, eps=eps), RMSNorm(num_hiddens, eps=eps)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        X = torch.randn(num_tokens, num_hiddens) + float(offset)
    centred = X - X.mean(dim=-1, keepdim=True)
    with torch.no_grad():
        return {
            "max_dev_centred": float((layer(centred) - rms(centred)).abs().max()),
            "max_dev_raw": float((layer(X) - rms(X)).abs().max()),
            "max_abs_token_mean": float(centred.mean(dim=-1).abs().max()),
            "num_hiddens": num_hiddens,
            "num_tokens": num_tokens,
            "offset": float(offset),
        }


@dataclass
class TorchComparison:
    """The result of :func:`compare_with_torch`.

    Introduced in the chapter "RMSNorm".

    Attributes:
        scales: the input RMS values tried (the standard deviation of the tokens).
        eps: the epsilon given to both implementations in the "equal eps" columns.
        equal_eps: dtype name -> one float per scale, ``max |ours - torch|`` at equal eps.
        default_eps_dev: dtype name -> one float per scale, ``max |ours - torch|`` when
            torch's ``eps`` is ``None``.
        default_eps_fit: dtype name -> {candidate eps: max over all scales of
            ``|ours(eps=candidate) - torch(eps=None)|``}, for the candidates
            ``torch.finfo(dtype).eps`` and ``torch.finfo(torch.float32).eps``.
        config: the other arguments of the run.
    """

    scales: list[float]
    eps: float
    equal_eps: dict[str, list[float]]
    default_eps_dev: dict[str, list[float]]
    default_eps_fit: dict[str, dict[float, float]]
    config: dict = field(default_factory=dict)

    @property
    def default_eps(self) -> dict[str, float]:
        """dtype name -> the candidate eps that best reproduces ``torch.nn.RMSNorm(eps=None)``."""
        return {name: min(fit, key=fit.get) for name, fit in self.default_eps_fit.items()}

    def table(self):
        """A pandas DataFrame indexed by input RMS, one column per (dtype, eps setting)."""
        import pandas as pd

        columns = {}
        for name in self.equal_eps:
            columns[f"{name}, equal eps"] = self.equal_eps[name]
            columns[f"{name}, eps=None"] = self.default_eps_dev[name]
        return pd.DataFrame(columns, index=pd.Index(self.scales, name="input RMS"))


def compare_with_torch(num_hiddens: int = 512, num_tokens: int = 64,
                       scales=(1.0, 0.1, 0.02, 0.01, 0.001), eps: float = EPS,
                       dtypes=("float32", "bfloat16"), seed: int = 0) -> TorchComparison:
    """``d2lmini.RMSNorm`` against ``torch.nn.RMSNorm``: max deviation, and the eps trap.

    For every scale ``s`` the tokens are ``s * randn(num_tokens, num_hiddens)``, so
    their RMS is about ``s``, rounded to each dtype. Both norms have their initial
    gain of 1, so only the statistic is compared. "Equal
    eps" gives PyTorch's norm the same ``eps``; "eps=None" leaves PyTorch's default,
    a machine epsilon (1.19e-7 for float32 inputs), which changes the output by about
    ``(eps_a - eps_b) / (2 s**2)`` relative once ``s**2`` is not large against the
    epsilons. Which machine epsilon PyTorch takes for half-precision inputs is
    measured, not assumed: both candidates are tried (see
    :attr:`TorchComparison.default_eps_fit`).

    Introduced in the chapter "RMSNorm".

    Args:
        num_hiddens: ``d``.
        num_tokens: tokens per scale.
        scales: input RMS values, each > 0.
        eps: the epsilon of ``d2lmini.RMSNorm`` (and of torch's in the equal-eps case).
        dtypes: names among ``"float32"``, ``"bfloat16"``, ``"float16"``.
        seed: seeds the random tokens (the global RNG is left untouched).

    Returns:
        A :class:`TorchComparison`.

    Raises:
        TypeError / ValueError: for bad sizes, scales, eps, dtype names or seed.
    """
    num_hiddens = check_positive_int("num_hiddens", num_hiddens)
    num_tokens = check_positive_int("num_tokens", num_tokens)
    scales = _check_scales(scales)
    eps = check_positive_float("eps", eps)
    seed = _check_seed(seed)
    allowed = {"float32": torch.float32, **HALF_DTYPES}
    if isinstance(dtypes, (str, torch.dtype)) or not hasattr(dtypes, "__iter__"):
        raise TypeError(f"dtypes must be a sequence of dtype names from {tuple(allowed)}, got {dtypes!r}")
    names = [_check_dtype_name("dtypes", d, allowed) for d in dtypes]
    if not names:
        raise ValueError("dtypes must hold at least one dtype name, got an empty sequence")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        Z = torch.randn(len(scales), num_tokens, num_hiddens)

    def max_dev(A, B):
        return float((A.double() - B.double()).abs().max())

    equal, default, fit = {}, {}, {}
    for name in names:
        dtype = allowed[name]
        ours = RMSNorm(num_hiddens, eps=eps).to(dtype)
        same = nn.RMSNorm(num_hiddens, eps=eps).to(dtype)
        unset = nn.RMSNorm(num_hiddens, eps=None).to(dtype)
        candidates = {float(torch.finfo(dtype).eps): None, float(torch.finfo(torch.float32).eps): None}
        trial = {c: RMSNorm(num_hiddens, eps=c).to(dtype) for c in candidates}
        equal[name], default[name], fit[name] = [], [], {c: 0.0 for c in candidates}
        with torch.no_grad():
            for s, z in zip(scales, Z):
                X = (s * z).to(dtype)
                Y, Y_unset = ours(X), unset(X)
                equal[name].append(max_dev(Y, same(X)))
                default[name].append(max_dev(Y, Y_unset))
                for c, norm in trial.items():
                    fit[name][c] = max(fit[name][c], max_dev(norm(X), Y_unset))
    return TorchComparison(scales=list(scales), eps=eps, equal_eps=equal, default_eps_dev=default,
                           default_eps_fit=fit,
                           config={"num_hiddens": num_hiddens, "num_tokens": num_tokens, "seed": seed})


def parameter_counts(num_hiddens=(512, 4096), block_num_hiddens: int = 512,
                     num_heads: int = 8) -> dict:
    """Parameters of LayerNorm and RMSNorm, counted from the modules, and a block for scale.

    Introduced in the chapter "RMSNorm".

    Args:
        num_hiddens: widths ``d`` at which the norms are counted.
        block_num_hiddens: width of the :class:`d2lmini.TransformerBlock` (pre-norm, no
            biases, SwiGLU FFN) built with each norm, to show the norms' share.
        num_heads: its number of heads (must divide ``block_num_hiddens``).

    Returns:
        A dict with ``"rows"``, one dict per width with keys ``"d"``, ``"LayerNorm"``,
        ``"RMSNorm"`` and ``"torch.nn.RMSNorm"`` (parameter counts), and ``"block"``,
        a dict with keys ``"d"``, ``"layer"`` and ``"rms"``: the parameter count of one
        block with two LayerNorms or two RMSNorms.

    Raises:
        TypeError / ValueError: for a width that is not a positive int, or heads that
            do not divide the block's width.
    """
    if isinstance(num_hiddens, (str, bytes)) or not hasattr(num_hiddens, "__iter__"):
        raise TypeError(f"num_hiddens must be a sequence of positive ints, got {num_hiddens!r}")
    widths = [check_positive_int("num_hiddens", d) for d in num_hiddens]
    if not widths:
        raise ValueError("num_hiddens must hold at least one width, got an empty sequence")

    def count(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    rows = [{"d": d, "LayerNorm": count(nn.LayerNorm(d)), "RMSNorm": count(RMSNorm(d)),
             "torch.nn.RMSNorm": count(nn.RMSNorm(d))} for d in widths]
    block = {"d": check_positive_int("block_num_hiddens", block_num_hiddens)}
    for norm in ("layer", "rms"):
        block[norm] = count(TransformerBlock(block_num_hiddens, num_heads, norm=norm,
                                             act="swiglu", placement="pre"))
    return {"rows": rows, "block": block}


# --- timing --------------------------------------------------------------------------


def machine_description() -> dict:
    """Where a timing ran: processor, machine, torch version, threads and load.

    ``platform.processor()`` is often empty on Linux; the ``model name`` line of
    ``/proc/cpuinfo`` is used then.

    Introduced in the chapter "RMSNorm".

    Returns:
        A dict with keys ``"processor"``, ``"machine"``, ``"torch"`` (strings),
        ``"threads"``, ``"cpu_count"`` (ints) and ``"load_avg_1min"`` (a float, or
        ``None`` where the system does not report it).
    """
    processor = platform.processor()
    if not processor:
        try:
            with open("/proc/cpuinfo") as f:
                processor = next((line.split(":", 1)[1].strip() for line in f
                                  if line.startswith("model name")), "")
        except OSError:
            processor = ""
    try:
        load = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        load = None
    return {"processor": processor or "unknown", "machine": platform.machine(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count() or 0, "load_avg_1min": load}


#: Operations :func:`forward_ops` leaves out: memory bookkeeping and dtype casts that
#: touch no data here, and the wrappers that only dispatch to the real kernels.
BOOKKEEPING_OPS = {"aten::to", "aten::_to_copy", "aten::empty", "aten::empty_strided", "aten::view",
                   "aten::result_type", "aten::fill_", "aten::copy_", "aten::type_as",
                   "aten::detach", "aten::reshape", "aten::expand", "aten::as_strided"}
WRAPPER_OPS = {"aten::rms_norm", "aten::_fused_rms_norm", "aten::layer_norm"}


def forward_ops(norm: nn.Module, X: torch.Tensor) -> list[str]:
    """The PyTorch operations a norm's forward runs, outermost first, in call order.

    Records one forward pass (under ``torch.no_grad()``) with PyTorch's profiler and
    keeps each ATen operation that is not bookkeeping (:data:`BOOKKEEPING_OPS`) or a
    dispatch wrapper (:data:`WRAPPER_OPS`) and not called from inside one already kept:
    a fused kernel appears once (``native_layer_norm``), a composed norm as its
    sequence of elementwise operations and reductions (``pow``, ``mean``, ...).
    The ``aten::`` prefix is removed.

    Introduced in the chapter "RMSNorm".

    Args:
        norm: a module mapping ``(*, d)`` to ``(*, d)``.
        X: an input for it.

    Returns:
        A list of operation names.

    Raises:
        TypeError: if ``norm`` is not an ``nn.Module`` or ``X`` not a tensor.
    """
    if not isinstance(norm, nn.Module):
        raise TypeError(f"norm must be a torch.nn.Module, got {type(norm).__name__}")
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"X must be a torch.Tensor, got {type(X).__name__}")
    try:  # the legacy CPU profiler starts in milliseconds, Kineto's first start takes seconds
        with torch.autograd.profiler.profile(use_kineto=False) as prof, torch.no_grad():
            norm(X)
    except (TypeError, RuntimeError):  # pragma: no cover - a PyTorch without the legacy profiler
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
            norm(X)
    kept, names = set(), []
    events = getattr(prof, "function_events", None) or prof.events()
    for event in sorted(events, key=lambda e: e.time_range.start):
        if not event.name.startswith("aten::") or event.name in BOOKKEEPING_OPS | WRAPPER_OPS:
            continue
        parent, inside = event.cpu_parent, False
        while parent is not None:
            inside = inside or id(parent) in kept
            parent = parent.cpu_parent
        if not inside:
            kept.add(id(event))
            names.append(event.name.removeprefix("aten::"))
    return names


@dataclass
class NormTiming:
    """The result of :func:`time_norms`.

    Introduced in the chapter "RMSNorm".

    Attributes:
        shape: the input's shape ``(batch, num_steps, num_hiddens)``.
        repeats: timed rounds per mode (each round runs every norm once, alternating).
        times_ms: mode (``"forward"``, ``"forward_backward"``) -> norm key (see
            :data:`TIMED_NORMS`) -> median time in milliseconds.
        machine: :func:`machine_description` of the process that measured.
        clock: ``"thread"`` (CPU time of the timing thread) or ``"wall"``.
        page_faults: mode -> norm key -> median number of minor page faults per call
            (Linux only; ``None`` elsewhere). Zero means the time is the norm's own work.
        fresh_process: whether the measurement ran in a fresh Python process.
        ops: norm key -> :func:`forward_ops` of that norm (empty if not recorded).
    """

    shape: tuple[int, ...]
    repeats: int
    times_ms: dict[str, dict[str, float]]
    machine: dict
    clock: str = "thread"
    page_faults: dict | None = None
    fresh_process: bool = False
    ops: dict[str, list[str]] = field(default_factory=dict)

    def ratio(self, numerator: str, denominator: str, mode: str = "forward") -> float:
        """``times_ms[mode][numerator] / times_ms[mode][denominator]``.

        Raises:
            KeyError: naming the mode or norm if it was not timed.
        """
        if mode not in self.times_ms:
            raise KeyError(f"mode must be one of {tuple(self.times_ms)}, got {mode!r}")
        times = self.times_ms[mode]
        for key in (numerator, denominator):
            if key not in times:
                raise KeyError(f"norm must be one of {tuple(times)}, got {key!r}")
        return times[numerator] / times[denominator]

    def table(self):
        """A pandas DataFrame of the median times (ms): one row per norm, one column per mode."""
        import pandas as pd

        keys = list(next(iter(self.times_ms.values())))
        return pd.DataFrame({f"{mode.replace('_', ' + ')} (ms)": [times[k] for k in keys]
                             for mode, times in self.times_ms.items()},
                            index=[TIMED_NORMS[k] for k in keys])


#: Environment of the fresh process :func:`time_norms` measures in: glibc's malloc
#: keeps freed blocks (up to 256 MiB) instead of handing them back to the system.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def time_norms(shape=(4, 256, 1024), repeats: int = 31, warmup: int = 3, num_threads: int = 1,
               clock: str = "thread", fresh_process: bool = True, seed: int = 0) -> NormTiming:
    """Median forward and forward + backward times of four norms, measured in one run.

    The norms (:data:`TIMED_NORMS`): ``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm``
    (PyTorch's own), :class:`d2lmini.RMSNorm`, and :class:`LayerNormByHand`, a LayerNorm
    written with the same operations as ``d2lmini.RMSNorm``. All run in float32 on the
    CPU, on the same input. Every round runs each norm once in turn, so all four see
    the same machine state; the median over ``repeats`` rounds is kept. Forward runs
    under ``torch.no_grad()``; forward + backward computes the gradient with respect
    to the input and the parameters for a fixed random output gradient.

    The numbers are times on whatever machine runs this (see
    :func:`machine_description`); on a shared machine they are noisy, and only ratios
    measured in the same run are worth comparing. Two precautions make them
    repeatable on a busy machine:

    * ``clock="thread"`` measures the CPU time of the calling thread
      (``time.thread_time``), which leaves out the time the operating system gives to
      other processes. It counts all of a norm's work only with one intra-op thread,
      so ``num_threads=1`` is the default. ``clock="wall"`` reads ``time.perf_counter``.
    * glibc's ``malloc`` hands large freed blocks back to the system, and the next
      allocation pays page faults for fresh zeroed pages; which norm pays depends on
      the order of the calls, and the kernel time can exceed the norm's arithmetic.
      With ``fresh_process=True`` the measurement runs in a new Python process whose
      malloc keeps freed memory (:data:`MALLOC_ENV`); the median page faults per call
      are recorded so you can check (Linux). The fresh process also lists each norm's
      :func:`forward_ops` (the profiler's messages stay in that process).

    Introduced in the chapter "RMSNorm".

    Args:
        shape: input shape ``(batch, num_steps, num_hiddens)``, positive ints.
        repeats: timed rounds per mode (>= 1; odd gives a true median).
        warmup: untimed rounds before timing, >= 0.
        num_threads: ``torch.set_num_threads`` for the measurement, >= 1 (restored
            afterwards when measuring in this process).
        clock: ``"thread"`` (CPU time of this thread) or ``"wall"`` (wall clock).
        fresh_process: measure in a new Python process (about a second or two to start)
            instead of this one.
        seed: seeds the input (the global RNG is left untouched).

    Returns:
        A :class:`NormTiming`.

    Raises:
        TypeError / ValueError: for a shape that is not three positive ints, or bad
            ``repeats``/``warmup``/``num_threads``/``clock``/``seed``.
        RuntimeError: if the fresh process fails (its error output is included).
    """
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__") or len(tuple(shape)) != 3:
        raise ValueError(f"shape must be three positive ints (batch, num_steps, num_hiddens), got {shape!r}")
    shape = tuple(check_positive_int("shape", s) for s in shape)
    repeats = check_positive_int("repeats", repeats)
    if isinstance(warmup, bool) or not isinstance(warmup, numbers.Integral) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    num_threads = check_positive_int("num_threads", num_threads)
    check_choice("clock", clock, CLOCKS)
    if not isinstance(fresh_process, bool):
        raise TypeError(f"fresh_process must be True or False, got {fresh_process!r}")
    seed = _check_seed(seed)
    config = {"shape": list(shape), "repeats": repeats, "warmup": int(warmup),
              "num_threads": num_threads, "clock": clock, "seed": seed, "ops": fresh_process}
    if fresh_process:
        result = _measure_in_fresh_process(config)
    else:
        threads_before = torch.get_num_threads()
        try:
            result = _measure(config)
        finally:
            torch.set_num_threads(threads_before)
    return NormTiming(shape=shape, repeats=repeats, times_ms=result["times_ms"],
                      machine=result["machine"], clock=clock, page_faults=result["page_faults"],
                      fresh_process=fresh_process, ops=result["ops"])


def _measure_in_fresh_process(config: dict) -> dict:
    import json
    import subprocess
    import sys

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, **MALLOC_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    code = ("import json, sys; from d2lmini.rmsnorm import _measure; "
            "print(json.dumps(_measure(json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(config)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the timing process failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _thread_faults():
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    except (ImportError, AttributeError, OSError):
        return None


def _measure(config: dict) -> dict:
    """Run one timing described by ``config`` in this process (see :func:`time_norms`)."""
    torch.set_num_threads(config["num_threads"])
    shape, now = tuple(config["shape"]), CLOCKS[config["clock"]]
    d = shape[-1]
    norms = {"layer_torch": nn.LayerNorm(d), "rms_torch": nn.RMSNorm(d, eps=EPS),
             "rms_d2lmini": RMSNorm(d, eps=EPS), "layer_by_hand": LayerNormByHand(d)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config["seed"])
        X, grad = torch.randn(*shape), torch.randn(*shape)

    def forward(norm):
        with torch.no_grad():
            norm(X)

    def forward_backward(norm):
        Z = X.detach().requires_grad_(True)
        norm(Z).backward(grad)
        norm.zero_grad(set_to_none=True)

    times_ms, faults = {}, {}
    for mode, step in (("forward", forward), ("forward_backward", forward_backward)):
        samples = {key: [] for key in norms}
        fault_counts = {key: [] for key in norms}
        for _ in range(config["warmup"]):
            for norm in norms.values():
                step(norm)
        for _ in range(config["repeats"]):
            for key, norm in norms.items():
                faults_before = _thread_faults()
                start = now()
                step(norm)
                samples[key].append(now() - start)
                if faults_before is not None:
                    fault_counts[key].append(_thread_faults() - faults_before)
        times_ms[mode] = {key: 1e3 * statistics.median(v) for key, v in samples.items()}
        faults[mode] = {key: statistics.median(v) if v else None for key, v in fault_counts.items()}
    if all(v is None for mode in faults.values() for v in mode.values()):
        faults = None
    ops = {key: forward_ops(norm, X) for key, norm in norms.items()} if config.get("ops") else {}
    return {"times_ms": times_ms, "page_faults": faults, "machine": machine_description(), "ops": ops}


# --- the float32 upcast --------------------------------------------------------------


def relative_error(Y: torch.Tensor, reference: torch.Tensor) -> float:
    """Worst token's relative error: ``max over tokens of ||y - ref||_2 / ||ref||_2``.

    Introduced in the chapter "RMSNorm".

    Args:
        Y, reference: tensors of the same shape ``(*, d)`` (any floating dtypes; compared
            in float64).

    Returns:
        A Python float (1.0 for an output of zeros; ``inf``/``nan`` propagate).

    Raises:
        ValueError: if the shapes differ.
    """
    if Y.shape != reference.shape:
        raise ValueError(f"Y and reference must have the same shape, got {tuple(Y.shape)} "
                         f"and {tuple(reference.shape)}")
    Y, reference = Y.double(), reference.double()
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
      the output rounded to the dtype (as Llama and OLMo 2 do);
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
    if isinstance(dtypes, (str, torch.dtype)) or not hasattr(dtypes, "__iter__"):
        raise TypeError(f"dtypes must be a sequence of names from {tuple(HALF_DTYPES)}, got {dtypes!r}")
    names = [_check_dtype_name("dtypes", d, HALF_DTYPES) for d in dtypes]
    if not names:
        raise ValueError("dtypes must hold at least one dtype name, got an empty sequence")
    scales = _check_scales(scales)
    num_hiddens = check_positive_int("num_hiddens", num_hiddens)
    num_tokens = check_positive_int("num_tokens", num_tokens)
    eps = check_positive_float("eps", eps)
    seed = _check_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        Z = torch.randn(len(scales), num_tokens, num_hiddens)
    reference_norm = RMSNorm(num_hiddens, eps=eps)
    rows = []
    with torch.no_grad():
        for name in names:
            dtype = HALF_DTYPES[name]
            upcast = RMSNorm(num_hiddens, eps=eps).to(dtype)
            for s, z in zip(scales, Z):
                X = (s * z).to(dtype)
                reference = reference_norm(X.float())
                rows.append({
                    "dtype": name,
                    "scale": s,
                    "max_sum_of_squares": float(X.double().pow(2).sum(dim=-1).max()),
                    "upcast": relative_error(upcast(X), reference),
                    "torch_mean": relative_error(rms_norm_torch_mean(X, eps=eps), reference),
                    "no_upcast": relative_error(rms_norm_no_upcast(X, eps=eps), reference),
                })
    return rows


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
    fig, axes = new_figure(len(names), width=8.0, height=3.1, sharey=True)
    axes = [axes] if len(names) == 1 else list(axes)
    with matplotlib.rc_context(STYLE):
        for ax, name in zip(axes, names):
            mine = [r for r in rows if r["dtype"] == name]
            scales = [r["scale"] for r in mine]
            for variant, label in HALF_VARIANTS.items():
                ax.loglog(scales, [r[variant] for r in mine], marker="o", markersize=4,
                          color=HALF_COLORS[variant], label=label,
                          linestyle="--" if variant == "torch_mean" else "-")
            ax.set(xlabel="input RMS", title=name)
        axes[0].set_ylabel("relative error vs float32\n(worst token)")
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center",
                   ncol=len(HALF_VARIANTS), frameon=False)
    return fig
