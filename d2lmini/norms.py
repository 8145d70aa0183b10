"""Every normalization layer of the book, and the factory every block uses to make its norms.

* :class:`RMSNorm` and :func:`make_norm` (``'layer'`` or ``'rms'``) -- the block's norms,
  introduced in the chapters "Where the norm goes" and "RMSNorm"; :func:`make_norm` also
  makes two LayerNorm variants of recent models, ``'layer_no_bias'`` (Cohere Command R)
  and ``'layer_nonparametric'`` (OLMo 1), both :class:`Float32LayerNorm`;
* :class:`HeadwiseRMSNorm` -- RMSNorm over each head with a gain per head, one of the
  QK-norm variants of the chapter "QK-norm";
* :class:`LayerNormByHand` -- LayerNorm written like :class:`RMSNorm`, for the timing of
  the chapter "RMSNorm";
* :class:`SequenceBatchNorm` -- BatchNorm for ``(b, n, d)`` sequences, the counter-example
  of the chapter "Normalization: why LayerNorm, not BatchNorm".
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import (check_choice, check_last_dim, check_positive_float, check_positive_int, check_probability,
                      check_real, check_sequence_tensor)
from ._shown import shown_in

#: Names accepted by :func:`make_norm` (and by ``TransformerBlock(norm=...)``).
NORMS = ("layer", "rms", "layer_no_bias", "layer_nonparametric")

#: The two norms the chapters compare (LayerNorm against RMSNorm): the options of
#: the depth explorer and the default of the norm comparison of the chapter "RMSNorm".
COMPARED_NORMS = ("layer", "rms")

#: Default epsilon of each norm: PyTorch's LayerNorm default; for RMSNorm the default of
#: ``LlamaConfig`` and ``Qwen3Config`` (Qwen3's released configurations use it too; Llama 3's
#: use 1e-5); ``CohereConfig.layer_norm_eps`` (1e-5)
#: and the 1e-5 that ``OlmoLayerNorm`` hard-codes, in Hugging Face ``transformers``.
DEFAULT_EPS = {"layer": 1e-5, "rms": 1e-6, "layer_no_bias": 1e-5, "layer_nonparametric": 1e-5}


class RMSNorm(nn.Module):
    r"""Root-mean-square layer normalization (Zhang & Sennrich, 2019).

    Computes ``y = x / sqrt(mean(x**2, dim=-1) + eps) * weight``: no mean is
    subtracted and there is no bias, so one statistic per token replaces
    LayerNorm's two. The statistic and the division are computed in float32
    even for bfloat16/float16 inputs (the "fp32 upcast" that Llama, Qwen3 and
    OLMo 2 share): summing thousands of squares in half precision loses digits or
    overflows. The result is cast back to the input's dtype before the gain is
    applied, as in Llama and Qwen3 (OLMo 2 applies the gain in float32 and casts
    afterwards): a module in the input's dtype returns that dtype.

    Args:
        num_hiddens: size of the normalized (last) dimension, ``d``.
        eps: added to the mean square before the square root; must be > 0.
            Default 1e-6, the default of ``Qwen3Config`` and ``LlamaConfig`` in
            Hugging Face ``transformers``. (``torch.nn.RMSNorm``
            with ``eps=None`` uses a machine epsilon instead, float32's for a float32
            input; the chapter "RMSNorm" shows what that changes.)
        gain: initial value of every entry of ``weight`` (default 1.0).

    Shape:
        input ``(*, num_hiddens)``, output the same shape; its dtype is the
        promotion of the input's and the weight's dtypes.

    Raises:
        TypeError / ValueError: if ``num_hiddens`` is not a positive int, or
            ``eps`` is not a positive number; at call time if the input's last
            dimension is not ``num_hiddens``.
    """

    def __init__(self, num_hiddens: int, eps: float = 1e-6, *, gain: float = 1.0):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.eps = check_positive_float("eps", eps)
        self.weight = nn.Parameter(torch.full((self.num_hiddens,), float(gain)))

    @shown_in("ch05")
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Normalize ``X``, shape ``(*, num_hiddens)``, over its last dimension; returns the same shape."""
        check_last_dim("X", X, self.num_hiddens)
        # at least float32; float64 stays
        X32 = X if X.dtype == torch.float64 else X.float()
        Y = X32 * torch.rsqrt(X32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return Y.to(X.dtype) * self.weight

    def extra_repr(self) -> str:
        return f"{self.num_hiddens}, eps={self.eps}"


class Float32LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` computed in at least float32, the result cast back to the input's dtype.

    LayerNorm (Ba, Kiros & Hinton, 2016) as Hugging Face ``transformers`` writes it for
    Cohere Command R (``CohereLayerNorm``: gain, no bias) and OLMo 1 (``OlmoLayerNorm``:
    neither gain nor bias): the input, and the gain and bias if any, are cast to float32
    (float64 stays float64), ``torch.nn.functional.layer_norm`` normalizes and applies
    them, and the result is cast to the input's dtype. A bfloat16 input thus gets the
    float32 statistics *and* the float32 gain of those models, rounded once at the end
    (``torch.nn.LayerNorm`` on bfloat16 can differ from them by one bfloat16 step).
    Made by :func:`make_norm` for ``'layer_no_bias'`` and ``'layer_nonparametric'``; it
    takes the arguments of ``torch.nn.LayerNorm``.

    Shape:
        ``(*, normalized_shape)`` in, the same shape and dtype out.
    """

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Normalize ``X`` over its last dimension(s) in float32 (or float64); returns ``X``'s shape and dtype."""
        X32 = X if X.dtype == torch.float64 else X.float()  # at least float32; float64 stays
        weight = None if self.weight is None else self.weight.to(X32.dtype)
        bias = None if self.bias is None else self.bias.to(X32.dtype)
        return nn.functional.layer_norm(X32, self.normalized_shape, weight, bias, self.eps).to(X.dtype)


def make_norm(norm: str, num_hiddens: int, eps: float | None = None, gain: float = 1.0) -> nn.Module:
    """Return a freshly initialized normalization layer.

    Args:
        norm: one of :data:`NORMS`:

            * ``'layer'``: ``torch.nn.LayerNorm`` (Ba, Kiros & Hinton, 2016; mean and
              variance over the features, with gain and bias);
            * ``'rms'``: :class:`RMSNorm` (Zhang & Sennrich, 2019);
            * ``'layer_no_bias'``: LayerNorm with a gain but no bias, as in Cohere's
              Command R (``CohereLayerNorm`` in Hugging Face ``transformers``), made as
              ``Float32LayerNorm(num_hiddens, eps=eps, bias=False)``. It computes what
              ``CohereLayerNorm`` computes (mean and variance in float32, the gain
              applied in float32, the result cast to the input's dtype), within float32
              rounding (``torch``'s fused kernel against Cohere's two-pass formula). One
              difference: a float64 input stays in float64 here, where Cohere's
              casts it to float32.
            * ``'layer_nonparametric'``: LayerNorm with neither gain nor bias, as in
              OLMo 1 (Groeneveld et al., 2024; ``OlmoLayerNorm`` in ``transformers``),
              made as ``Float32LayerNorm(num_hiddens, eps=eps,
              elementwise_affine=False)``: no parameters at all, and the same values as
              ``OlmoLayerNorm``, which calls ``layer_norm`` in float32 and casts back.
        num_hiddens: size of the normalized last dimension.
        eps: the norm's epsilon; ``None`` takes :data:`DEFAULT_EPS` for ``norm``.
        gain: initial value of the norm's gain (weight) entries. ``'layer_nonparametric'``
            has no gain, so it accepts only the default, 1.0.

    Returns:
        An ``nn.Module`` mapping ``(*, num_hiddens)`` to the same shape.

    Raises:
        ValueError: if ``norm`` is not one of :data:`NORMS` (the message lists them),
            ``num_hiddens``/``eps`` are out of range, or ``gain`` is not 1.0 for
            ``'layer_nonparametric'``.
        TypeError: if an argument has the wrong type.
    """
    check_choice("norm", norm, NORMS)
    num_hiddens = check_positive_int("num_hiddens", num_hiddens)
    eps = DEFAULT_EPS[norm] if eps is None else check_positive_float("eps", eps)
    gain = check_real("gain", gain)
    if norm == "rms":
        return RMSNorm(num_hiddens, eps=eps, gain=gain)
    if norm == "layer_nonparametric":
        if gain != 1.0:
            raise ValueError(f"gain must be 1.0 for norm='layer_nonparametric' (it has no gain to "
                             f"initialize), got {gain}")
        return Float32LayerNorm(num_hiddens, eps=eps, elementwise_affine=False)
    if norm == "layer":
        layer = nn.LayerNorm(num_hiddens, eps=eps)
    else:
        layer = Float32LayerNorm(num_hiddens, eps=eps, bias=False)
    with torch.no_grad():
        layer.weight.fill_(gain)
    return layer


#: How :func:`unweighted_rms_norm` rounds, by the models that round so (see there).
UNWEIGHTED_ROUNDINGS = ("statistic", "float32")


def unweighted_rms_norm(X: torch.Tensor, eps: float, *, rounding: str = "statistic") -> torch.Tensor:
    """RMS normalization without a gain: ``X / sqrt(mean(X**2) + eps)`` over the last dimension.

    The one gainless RMS normalization of the package, in the two roundings released models use
    (the weighted one is :class:`RMSNorm`, which computes like ``'float32'`` but keeps float64):

    * ``'statistic'`` (default): only the statistic ``rsqrt(mean(X**2) + eps)`` is computed in
      float32 and cast to ``X``'s dtype before it multiplies ``X``, as DeepSeek-V4's
      ``DeepseekV4UnweightedRMSNorm`` (Hugging Face ``transformers`` 5.24, ``models/deepseek_v4``);
      the hyper-connections of :mod:`d2lmini.hyper` (the chapter "Beyond one residual stream")
      and DeepSeek-V4's compressed attention.
    * ``'float32'``: ``X`` is cast to float32 (float64 too), normalized there and the result cast
      back, as Llama 4's ``Llama4TextL2Norm`` and Gemma 4's gainless value norm
      (``Gemma4RMSNorm(with_scale=False)``); :mod:`d2lmini.reference`'s ``Llama4Attention`` and ``GemmaAttention``.

    Args:
        X: a floating tensor ``(..., features)``.
        eps: added to the mean square (a float > 0; not checked here, the modules check theirs).
        rounding: one of :data:`UNWEIGHTED_ROUNDINGS`.

    Returns:
        A tensor shaped like ``X``, in its dtype.

    Raises:
        ValueError: an unknown ``rounding`` (the message lists the allowed ones).
    """
    if rounding == "statistic":
        return X * torch.rsqrt(X.float().pow(2).mean(dim=-1, keepdim=True) + eps).to(X.dtype)
    check_choice("rounding", rounding, UNWEIGHTED_ROUNDINGS)
    Y = X.float()
    return (Y * torch.rsqrt(Y.pow(2).mean(dim=-1, keepdim=True) + eps)).to(X.dtype)


class HeadwiseRMSNorm(RMSNorm):
    """RMSNorm over each head's features with a distinct gain vector per head (``qk_norm='per_head_distinct'``).

    :class:`RMSNorm`'s computation (its ``forward``), over the last dimension ``head_dim``, with
    a gain of shape ``(num_heads, head_dim)`` that broadcasts over batch and positions.

    Args:
        num_heads: heads ``h``; head_dim: features per head.
        eps: added to the mean square (default 1e-6).

    Shape:
        input ``(batch, num_steps, num_heads, head_dim)``, output the same.

    Raises:
        TypeError / ValueError: ``num_heads`` or ``head_dim`` not a positive int, ``eps`` not a
            positive number; at call time an input whose last dimension is not ``head_dim``.
    """

    def __init__(self, num_heads: int, head_dim: int, *, eps: float = 1e-6):
        super().__init__(check_positive_int("head_dim", head_dim), eps)
        self.weight = nn.Parameter(torch.ones(check_positive_int("num_heads", num_heads), self.num_hiddens))

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.num_hiddens}, eps={self.eps}"


class SequenceBatchNorm(nn.Module):
    """``nn.BatchNorm1d`` for the book's ``(b, n, d)`` tensors (the naive BatchNorm of a sequence model).

    ``nn.BatchNorm1d`` wants the features in dimension 1, ``(b, d, n)``; this
    wrapper transposes in and out. In training mode every feature is normalized
    by its mean and variance over all ``b * n`` positions, padding included; in
    evaluation mode by the running estimates. The chapter "Normalization: why LayerNorm,
    not BatchNorm" measures it (:func:`d2lmini.chapters.ch03_normalization.same_sentence_elsewhere`).

    Args:
        num_hiddens: ``d``.
        eps: added to the variance (default 1e-5).
        momentum: weight of the current batch in the running estimates (default 0.1).

    Attributes:
        bn: the wrapped ``nn.BatchNorm1d``.

    Shape:
        input ``(b, n, d)``, output the same.

    Raises:
        TypeError / ValueError: bad constructor arguments; at call time an input that
            is not ``(b, n, d)``, and (from PyTorch) a training-mode input with one
            position per feature.
    """

    def __init__(self, num_hiddens: int, eps: float = DEFAULT_EPS["layer"], *, momentum: float = 0.1):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.bn = nn.BatchNorm1d(self.num_hiddens, eps=check_positive_float("eps", eps),
                                 momentum=check_probability("momentum", momentum))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Normalize ``X`` (b, n, d) per feature; returns (b, n, d)."""
        check_sequence_tensor("X", X, self.num_hiddens)
        return self.bn(X.transpose(1, 2)).transpose(1, 2)


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
        check_last_dim("X", X, self.num_hiddens)
        X32 = X if X.dtype == torch.float64 else X.float()  # at least float32, as RMSNorm
        centred = X32 - X32.mean(dim=-1, keepdim=True)
        Y = centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return Y.to(X.dtype) * self.weight + self.bias
