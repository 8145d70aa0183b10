"""The position-wise feed-forward network (FFN): expand, activate, contract.

Introduced in the chapter "The feed-forward network: SwiGLU, then a mixture of experts".
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import (check_bool, check_choice, check_last_dim, check_positive_float, check_positive_int,
                      check_probability)

#: Activations of a plain two-matrix MLP: ``W_2 act(W_1 x)``.
PLAIN_ACTS = {
    "relu": F.relu,                                           # Vaswani et al. 2017
    "gelu": F.gelu,                                           # exact erf GELU (BERT); Hendrycks & Gimpel 2016
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),     # GPT-2's tanh approximation
}
#: gpt-oss's Swish slope: its gate is ``z * sigmoid(1.702 z)`` (the sigmoid approximation
#: of GELU, Hendrycks & Gimpel 2016), where SwiGLU's SiLU is ``z * sigmoid(z)``.
SWIGLU_CLAMPED_ALPHA = 1.702
#: gpt-oss's default ``swiglu_limit``, the clamp of :class:`FeedForward` with ``act='swiglu_clamped'``.
SWIGLU_CLAMPED_LIMIT = 7.0

#: Gated activations, ``W_2 (act(W_g x) * W_1 x)`` (Shazeer, 2020); for ``'swiglu_clamped'``
#: both halves are clamped first and the linear one shifted by 1 (see :class:`FeedForward`).
GATED_ACTS = {
    "swiglu": F.silu,                                         # Llama, Qwen3, OLMo 2
    "geglu": lambda x: F.gelu(x, approximate="tanh"),         # Gemma
    "swiglu_clamped": lambda x: x * torch.sigmoid(SWIGLU_CLAMPED_ALPHA * x),  # gpt-oss
}
#: Every name accepted by ``FeedForward(act=...)`` and ``TransformerBlock(act=...)``.
ACTS = tuple(PLAIN_ACTS) + tuple(GATED_ACTS)


def default_ffn_num_hiddens(num_hiddens: int, act: str) -> int:
    """Default hidden width of the FFN: ``4 d``, or ``round(8 d / 3)`` for gated acts.

    A gated FFN has three ``d x h`` matrices instead of two, so ``h = 8d/3``
    keeps its parameter count at the plain FFN's ``8 d^2`` (Shazeer, 2020).

    Raises:
        ValueError / TypeError: for a bad ``num_hiddens`` or an unknown ``act``.
    """
    num_hiddens = check_positive_int("num_hiddens", num_hiddens)
    check_choice("act", act, ACTS)
    return round(8 * num_hiddens / 3) if act in GATED_ACTS else 4 * num_hiddens


class FeedForward(nn.Module):
    r"""Position-wise feed-forward network, plain or gated.

    Plain (``'relu'``, ``'gelu'``, ``'gelu_tanh'``): ``W_2 act(W_1 x)``, the
    2017 Transformer's FFN (ReLU) and BERT/GPT-2's (GELU).
    Gated (``'swiglu'``, ``'geglu'``): ``W_2 (act(W_g x) * W_1 x)`` (Shazeer,
    2020), where ``act`` is SiLU (SwiGLU) or tanh-GELU (GeGLU). Each token is
    processed alone: no information moves between positions.

    ``'swiglu_clamped'`` is OpenAI gpt-oss's gated FFN (Hugging Face
    ``GptOssExperts._apply_gate``): with ``g = min(W_g x, L)`` and
    ``u = clamp(W_1 x, -L, L)`` for the limit ``L = swiglu_limit``,

    .. math:: \mathrm{FFN}(x) = W_2\big(g\,\sigma(1.702\,g) \odot (u + 1)\big),

    a Swish gate of slope ``alpha = 1.702`` (:data:`SWIGLU_CLAMPED_ALPHA`) times the
    clamped linear half plus one. Without the clamps, the ``+ 1`` and with slope 1
    it is SwiGLU: the gated formula above is its special case. ``act='swiglu'`` with a
    ``swiglu_limit`` ``L`` is DeepSeek-V4's clamped SwiGLU (Hugging Face
    ``DeepseekV4MLP`` and ``DeepseekV4Experts._apply_gate``, ``swiglu_limit = 10``):
    ``W_2(SiLU(min(W_g x, L)) * clamp(W_1 x, -L, L))``, the same clamps without the
    slope and without the ``+ 1``. (gpt-oss stores
    ``W_g`` and ``W_1`` fused and interleaved, gate in the even columns; see
    :func:`d2lmini.reference.gpt_oss.copy_gptoss_experts`.)

    Args:
        num_hiddens: model width ``d``.
        ffn_num_hiddens: hidden width ``h``; default :func:`default_ffn_num_hiddens`
            (``4d``, or ``round(8d/3)`` for gated activations).
        act: one of :data:`ACTS`.
        bias: whether the linear layers have biases.
        dropout: dropout on the hidden activations (training only), in [0, 1).
        swiglu_limit: the clamp ``L > 0`` of ``act='swiglu_clamped'`` (gpt-oss's
            ``swiglu_limit``; ``None`` means :data:`SWIGLU_CLAMPED_LIMIT`, 7.0) or of
            ``act='swiglu'`` (DeepSeek-V4's; ``None``, the default, means no clamp); it must
            stay ``None`` for every other act.

    Attributes:
        swiglu_limit: the clamp in use, or ``None`` (every act but ``'swiglu_clamped'``).

    Shape:
        input ``(*, num_hiddens)``, output the same shape.

    Raises:
        ValueError: unknown ``act`` (the message lists :data:`ACTS`), a width < 1,
            dropout outside [0, 1), ``swiglu_limit`` not a finite float > 0 or given with
            an act other than ``'swiglu_clamped'`` and ``'swiglu'``; at call time an input whose last
            dimension is not ``num_hiddens``.
        TypeError: arguments of the wrong type.
    """

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int | None = None, *, act: str = "gelu",
                 bias: bool = False, dropout: float = 0.0, swiglu_limit: float | None = None):
        super().__init__()
        self.act = check_choice("act", act, ACTS)
        if act not in ("swiglu_clamped", "swiglu") and swiglu_limit is not None:
            raise ValueError(f"swiglu_limit applies only to act='swiglu_clamped' (gpt-oss) and act='swiglu' "
                             f"(DeepSeek-V4), got swiglu_limit={swiglu_limit!r} with act={act!r}")
        if swiglu_limit is not None:
            self.swiglu_limit = check_positive_float("swiglu_limit", swiglu_limit)
        else:
            self.swiglu_limit = SWIGLU_CLAMPED_LIMIT if act == "swiglu_clamped" else None
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.ffn_num_hiddens = (default_ffn_num_hiddens(num_hiddens, act) if ffn_num_hiddens is None
                                else check_positive_int("ffn_num_hiddens", ffn_num_hiddens))
        check_bool("bias", bias)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        self.gated = act in GATED_ACTS
        self._act = GATED_ACTS[act] if self.gated else PLAIN_ACTS[act]
        self.W_1 = nn.Linear(num_hiddens, self.ffn_num_hiddens, bias=bias)
        self.W_g = nn.Linear(num_hiddens, self.ffn_num_hiddens, bias=bias) if self.gated else None
        self.W_2 = nn.Linear(self.ffn_num_hiddens, num_hiddens, bias=bias)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Apply the FFN to every position of ``X``, shape ``(*, num_hiddens)``; returns the same shape."""
        check_last_dim("X", X, self.num_hiddens)
        if not self.gated:
            return self.W_2(self.dropout(self._act(self.W_1(X))))
        G, U = self.W_g(X), self.W_1(X)
        if self.swiglu_limit is not None:  # gpt-oss and DeepSeek-V4: clamp both halves
            G, U = G.clamp(max=self.swiglu_limit), U.clamp(-self.swiglu_limit, self.swiglu_limit)
            U = U + 1 if self.act == "swiglu_clamped" else U  # gpt-oss also shifts the linear one by 1
        return self.W_2(self.dropout(self._act(G) * U))

    def extra_repr(self) -> str:
        limit = "" if self.swiglu_limit is None else f", swiglu_limit={self.swiglu_limit}"
        return f"act={self.act!r}, gated={self.gated}{limit}"


__all__ = ["FeedForward", "ACTS", "SWIGLU_CLAMPED_ALPHA", "SWIGLU_CLAMPED_LIMIT", "default_ffn_num_hiddens"]
