"""The position-wise feed-forward network (FFN): expand, activate, contract.

Introduced in the chapter "The feed-forward network: SwiGLU, then a mixture of experts".
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import (check_bool, check_choice, check_last_dim, check_positive_int,
                      check_probability)

#: Activations of a plain two-matrix MLP: ``W_2 act(W_1 x)``.
PLAIN_ACTS = {
    "relu": F.relu,                                           # Vaswani et al. 2017
    "gelu": F.gelu,                                           # exact erf GELU (BERT); Hendrycks & Gimpel 2016
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),     # GPT-2's tanh approximation
}
#: Gated activations, ``W_2 (act(W_g x) * W_1 x)`` (Shazeer, 2020).
GATED_ACTS = {
    "swiglu": F.silu,                                         # Llama, Qwen3, OLMo 2
    "geglu": lambda x: F.gelu(x, approximate="tanh"),         # Gemma
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
    processed alone: no information moves between positions. A gated FFN combines its two
    halves in :meth:`gated_units`, a hook (released models' clamped variants override it:
    :class:`d2lmini.reference.gpt_oss.ClampedSwiGLU`).

    Args:
        num_hiddens: model width ``d``.
        ffn_num_hiddens: hidden width ``h``; default :func:`default_ffn_num_hiddens`
            (``4d``, or ``round(8d/3)`` for gated activations).
        act: one of :data:`ACTS`.
        bias: whether the linear layers have biases.
        dropout: dropout on the hidden activations (training only), in [0, 1).

    Shape:
        input ``(*, num_hiddens)``, output the same shape.

    Raises:
        ValueError: unknown ``act`` (the message lists :data:`ACTS`), a width < 1,
            dropout outside [0, 1); at call time an input whose last dimension is not ``num_hiddens``.
        TypeError: arguments of the wrong type.
    """

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int | None = None, *, act: str = "gelu",
                 bias: bool = False, dropout: float = 0.0):
        super().__init__()
        self.act = check_choice("act", act, ACTS)
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
        return self.W_2(self.dropout(self.gated_units(self.W_g(X), self.W_1(X))))

    def gated_units(self, G: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
        """The hidden units of a gated FFN from its gate ``G = W_g x`` and linear half ``U = W_1 x``: ``act(G) * U``."""
        return self._act(G) * U

    def extra_repr(self) -> str:
        return f"act={self.act!r}, gated={self.gated}"


__all__ = ["FeedForward", "ACTS", "default_ffn_num_hiddens"]
