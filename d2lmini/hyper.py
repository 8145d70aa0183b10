r"""Manifold-constrained hyper-connections (mHC): ``n`` residual streams instead of one.

A hyper-connection (Zhu et al., 2024, "Hyper-Connections") widens the residual stream of a
Transformer into ``n`` parallel streams per token, ``x_l`` of shape ``(n, d)``, and lets
each sublayer ``F`` read a learned mix of them and write back into all of them:

.. math:: x_{l+1} = H^{\mathrm{res}}_l\, x_l + H^{\mathrm{post}\,\top}_l\,
          F\big(H^{\mathrm{pre}}_l\, x_l\big),

with ``H^pre`` (``1 x n``) collapsing the streams into the sublayer's input, ``H^post``
(``1 x n``) expanding its output back into ``n`` streams, and ``H^res`` (``n x n``) mixing
the streams among themselves. The manifold-constrained version (mHC; Xie et al., 2025,
"mHC: Manifold-Constrained Hyper-Connections") computes the three mappings from the
streams themselves and projects ``H^res`` onto the doubly-stochastic matrices (every row
and column sums to 1) with the Sinkhorn-Knopp algorithm, so that the mixing cannot stretch
the streams however many layers are stacked, and the mixing itself keeps the streams' mean
(up to the Sinkhorn rounds' approximation; the sublayers still add to it). DeepSeek-V4
uses it in every layer with ``n = 4`` streams.

This module follows Hugging Face ``transformers`` 5.24,
``models/deepseek_v4/modeling_deepseek_v4.py``: :func:`sinkhorn_knopp` and
:class:`HyperConnection` compute what ``DeepseekV4HyperConnection`` computes,
:class:`HyperHead` what ``DeepseekV4HyperHead`` computes, :class:`HyperConnectedBlock`
wires them around an attention and an FFN as ``DeepseekV4DecoderLayer`` does, and
:func:`expand_streams` copies an embedding into the streams as ``DeepseekV4Model`` does
(``tests/test_hyper.py`` checks all four against those classes).

Shapes: streams are ``(b, n_steps, n_streams, d)``; the sublayers see ``(b, n_steps, d)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ._checks import check_callable, check_int_at_least, check_positive_float, check_positive_int
from ._shown import shown_in
from .block import build_sublayer, make_attention
from .ffn import FeedForward
from .norms import DEFAULT_EPS, RMSNorm, unweighted_rms_norm

#: Standard deviation of the normal initialization of the projections ``phi`` of
#: :class:`HyperConnection` and :class:`HyperHead`: ``DeepseekV4Config.initializer_range``
#: (0.02), as ``DeepseekV4PreTrainedModel._init_weights`` draws ``fn`` and ``hc_fn``.
INIT_STD = 0.02

#: DeepSeek-V4's defaults (``DeepseekV4Config``): ``hc_mult`` streams, ``hc_sinkhorn_iters``
#: Sinkhorn-Knopp iterations, and ``hc_eps``, the floor added in the mappings.
DEFAULT_NUM_STREAMS, DEFAULT_SINKHORN_ITERS, DEFAULT_HC_EPS = 4, 20, 1e-6


@shown_in("ch10")
def sinkhorn_knopp(logits: torch.Tensor, *, iters: int = DEFAULT_SINKHORN_ITERS,
                   eps: float = DEFAULT_HC_EPS) -> torch.Tensor:
    r"""Project square matrices of logits onto (approximately) doubly-stochastic matrices.

    A matrix with positive entries is made doubly stochastic -- every row and every column
    sums to 1 -- by dividing its rows by their sums and its columns by theirs, in turn,
    until both hold (Sinkhorn & Knopp, 1967). Computed exactly as DeepSeek-V4's
    ``DeepseekV4HyperConnection`` does (Hugging Face ``transformers`` 5.24): a softmax over
    each row (positive entries, rows summing to 1) plus ``eps``; then the columns are
    normalized; then ``iters - 1`` times the rows and then the columns, each sum floored by
    ``+ eps``. The result ends on a column step, so its columns sum to 1 (up to ``eps``)
    and its rows approximately: after V4's 20 iterations, to about ``1e-4`` for 4 x 4
    standard-normal logits, a few percent for logits ten times larger.

    Args:
        logits: ``(..., n, n)`` floating tensor, e.g. ``(b, n_steps, n_streams, n_streams)``.
        iters: number of column normalizations, >= 1 (V4: ``hc_sinkhorn_iters = 20``).
        eps: the floor added to the softmax and to every sum, > 0 (V4: ``hc_eps = 1e-6``).

    Returns:
        A tensor of ``logits``' shape and dtype, nonnegative, rows and columns summing to ~1.

    Raises:
        TypeError / ValueError: ``logits`` not a floating tensor of square matrices,
            ``iters`` not an int >= 1, ``eps`` not a number > 0.
    """
    _check_square(logits)
    iters, eps = check_positive_int("iters", iters), check_positive_float("eps", eps)
    M = torch.softmax(logits, dim=-1) + eps  # rows sum to 1 (+ n eps)
    M = M / (M.sum(dim=-2, keepdim=True) + eps)  # columns
    for _ in range(iters - 1):
        M = M / (M.sum(dim=-1, keepdim=True) + eps)  # rows
        M = M / (M.sum(dim=-2, keepdim=True) + eps)  # columns
    return M


def _check_square(logits) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point torch.Tensor, got "
                        f"{getattr(logits, 'dtype', type(logits).__name__)}")
    if logits.dim() < 2 or logits.shape[-1] != logits.shape[-2]:
        raise ValueError(f"logits must be square matrices (..., n, n), got shape {tuple(logits.shape)}")


def _check_streams(streams, num_streams: int, num_hiddens: int) -> torch.Tensor:
    """Raise unless ``streams`` is a floating ``(b, n_steps, num_streams, num_hiddens)`` tensor."""
    if not isinstance(streams, torch.Tensor):
        raise TypeError(f"streams must be a torch.Tensor, got {type(streams).__name__}")
    if not streams.is_floating_point():
        raise TypeError(f"streams must be a floating-point tensor, got dtype {streams.dtype}")
    if streams.dim() != 4 or tuple(streams.shape[2:]) != (num_streams, num_hiddens):
        raise ValueError(f"streams must have shape (batch, num_steps, num_streams={num_streams}, "
                         f"num_hiddens={num_hiddens}), got shape {tuple(streams.shape)}")
    return streams


def expand_streams(X: torch.Tensor, num_streams: int = DEFAULT_NUM_STREAMS) -> torch.Tensor:
    """The entry of a hyper-connected stack: copy each token's vector into ``num_streams`` streams.

    ``(b, n_steps, d) -> (b, n_steps, num_streams, d)``, every stream equal to ``X`` (a copy,
    not a view), as ``DeepseekV4Model.forward`` expands the token embeddings (Hugging Face
    ``transformers`` 5.24). :class:`HyperHead` is the matching exit.

    Raises:
        TypeError / ValueError: ``X`` not a floating ``(b, n, d)`` tensor; ``num_streams``
            not an int >= 1.
    """
    num_streams = check_positive_int("num_streams", num_streams)
    if not isinstance(X, torch.Tensor) or not X.is_floating_point():
        raise TypeError(f"X must be a floating-point torch.Tensor, got {getattr(X, 'dtype', type(X).__name__)}")
    if X.dim() != 3:
        raise ValueError(f"X must have shape (batch, num_steps, num_hiddens), got shape {tuple(X.shape)}")
    return X.unsqueeze(2).expand(-1, -1, num_streams, -1).contiguous()


class HyperConnection(nn.Module):
    r"""One manifold-constrained hyper-connection (mHC) around one sublayer.

    From the streams ``x`` of a token, ``(n, d)``, flattened to ``n d`` features and
    RMS-normalized without a gain (``x'``), one linear map ``phi`` gives ``(2 + n) n``
    numbers, split into three mappings (Xie et al., 2025, Eqs. 7-8; the paper's
    ``alpha`` are ``self.alpha``, its ``b`` ``self.bias``):

    * ``H^pre  = sigmoid(alpha_pre  * x' phi_pre  + b_pre) + eps``, ``(n,)``: the weights
      that collapse the ``n`` streams into the sublayer's input ``sum_i H^pre_i x_i``;
    * ``H^post = 2 sigmoid(alpha_post * x' phi_post + b_post)``, ``(n,)``: how much of the
      sublayer's output each stream receives, in ``(0, 2)``;
    * ``H^res  = sinkhorn_knopp(alpha_res * mat(x' phi_res) + b_res)^T``, ``(n, n)``:
      the doubly-stochastic mixing of the streams (see :func:`sinkhorn_knopp`).

    :meth:`forward` then computes ``x <- H^res x + H^post F(H^pre x)`` (the outer
    product ``H^post_i F(...)`` for each stream ``i``). DeepSeek-V4 calls the matrix that
    :func:`sinkhorn_knopp` returns ``comb`` and mixes with its transpose
    (``DeepseekV4DecoderLayer``: ``comb.transpose(-1, -2) @ hidden_states``): here
    ``H^res = comb^T`` is returned already transposed, so it multiplies the streams as
    the paper writes, ``H^res x``. Since ``comb`` is not symmetric, the transpose matters.

    The mappings are computed in float32 whatever the streams' dtype (V4 keeps these
    modules in float32), and cast to the streams' dtype for the collapse and the mix.

    Initialization follows ``DeepseekV4PreTrainedModel._init_weights`` (Hugging Face
    ``transformers`` 5.24; the library's random initialization, not a documented training
    recipe): ``phi ~ N(0, INIT_STD^2)`` (``fn``; ``INIT_STD`` is V4's
    ``initializer_range``, 0.02), ``bias = 0`` (``base``), ``alpha = 1`` (``scale``). At
    initialization the mappings are thus random around ``H^pre = 1/2``, ``H^post = 1`` and
    ``H^res = J / n`` (every entry ``1/n``: the streams averaged), their logits of standard
    deviation ``INIT_STD * sqrt(n d)`` since ``x'`` has ``n d`` entries of RMS 1: 0.32 for
    ``n = 4, d = 64``, but 2.6 at ``n = 4, d = 4096`` (the default ``DeepseekV4Config`` width,
    whose docstring names the DeepSeek-V4-Flash-Base checkpoint).

    Args:
        num_hiddens: width ``d`` of each stream.
        num_streams: number of streams ``n`` (V4: ``hc_mult = 4``); ``n = 1`` is allowed
            (``H^res = 1``, a gated residual connection).
        sinkhorn_iters: Sinkhorn-Knopp iterations (V4: ``hc_sinkhorn_iters = 20``).
        eps: V4's ``hc_eps`` (1e-6): added to ``H^pre`` and inside Sinkhorn-Knopp.
        norm_eps: epsilon of the gain-free RMSNorm of the flattened streams (V4's
            ``rms_norm_eps``, 1e-6).

    Attributes:
        phi: ``((2 + n) n, n d)``, the projection (V4: ``fn``), rows ``[pre | post | res]``.
        bias: ``((2 + n) n,)``, the biases ``b`` (V4: ``base``).
        alpha: ``(3,)``, the scales ``alpha_pre, alpha_post, alpha_res`` (V4: ``scale``).

    Shape:
        ``forward(streams, sublayer)``: ``streams`` ``(b, n_steps, n, d)``, ``sublayer``
        maps ``(b, n_steps, d)`` to ``(b, n_steps, d)``; returns ``(b, n_steps, n, d)``.
        :meth:`mappings` returns ``H^pre`` ``(b, n_steps, n)``, ``H^post`` ``(b, n_steps, n)``
        and ``H^res`` ``(b, n_steps, n, n)``.

    Raises:
        TypeError / ValueError: a width or stream count that is not an int >= 1, an epsilon
            that is not > 0, ``sinkhorn_iters`` < 1; at call time streams that are not a
            floating ``(b, n_steps, num_streams, num_hiddens)`` tensor, a ``sublayer`` that
            is not callable.
    """

    def __init__(self, num_hiddens: int, num_streams: int = DEFAULT_NUM_STREAMS, *,
                 sinkhorn_iters: int = DEFAULT_SINKHORN_ITERS, eps: float = DEFAULT_HC_EPS,
                 norm_eps: float = DEFAULT_EPS["rms"]):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.num_streams = check_int_at_least("num_streams", num_streams, 1)
        self.sinkhorn_iters = check_positive_int("sinkhorn_iters", sinkhorn_iters)
        self.eps = check_positive_float("eps", eps)
        self.norm_eps = check_positive_float("norm_eps", norm_eps)
        n = self.num_streams
        self.phi = nn.Parameter(torch.randn((2 + n) * n, n * self.num_hiddens) * INIT_STD)
        self.bias = nn.Parameter(torch.zeros((2 + n) * n))
        self.alpha = nn.Parameter(torch.ones(3))

    @shown_in("ch10")
    def mappings(
        self, streams: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(H^pre, H^post, H^res)`` of ``streams`` ``(b, n_steps, n, d)``, in float32 (see the class)."""
        _check_streams(streams, self.num_streams, self.num_hiddens)
        n = self.num_streams
        # (b, n_steps, n d)
        x = unweighted_rms_norm(streams.flatten(2).float(), self.norm_eps)
        pre, post, res = (x @ self.phi.float().T).split([n, n, n * n], dim=-1)
        b_pre, b_post, b_res = self.bias.float().split([n, n, n * n])
        a_pre, a_post, a_res = self.alpha.float()
        h_pre = torch.sigmoid(a_pre * pre + b_pre) + self.eps
        h_post = 2 * torch.sigmoid(a_post * post + b_post)
        comb = sinkhorn_knopp(
            (a_res * res + b_res).unflatten(-1, (n, n)),
            iters=self.sinkhorn_iters,
            eps=self.eps,
        )
        return h_pre, h_post, comb.transpose(-1, -2)

    @shown_in("ch10")
    def forward(
        self, streams: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """``H^res x + H^post F(H^pre x)``: collapse ``streams`` (b, n_steps, n, d), apply ``sublayer``, expand, mix."""
        check_callable("sublayer", sublayer)
        h_pre, h_post, h_res = self.mappings(streams)
        # H^pre x: (b, n_steps, d)
        collapsed = (h_pre.unsqueeze(-1) * streams).sum(dim=2).to(streams.dtype)
        out = sublayer(collapsed)  # (b, n_steps, d)
        h_post, h_res = h_post.to(streams.dtype), h_res.to(streams.dtype)
        # (b, n_steps, n, d)
        return h_post.unsqueeze(-1) * out.unsqueeze(-2) + h_res @ streams

    def extra_repr(self) -> str:
        return (f"{self.num_hiddens}, num_streams={self.num_streams}, sinkhorn_iters={self.sinkhorn_iters}, "
                f"eps={self.eps}, norm_eps={self.norm_eps}")


class HyperHead(nn.Module):
    r"""The exit of a hyper-connected stack: collapse the ``n`` streams into one vector per token.

    ``y = sum_i H_i x_i`` with ``H = sigmoid(alpha * x' phi + b) + eps``, ``(n,)``, where
    ``x'`` is the gain-free RMSNorm of the token's flattened streams (``n d`` features) --
    the ``H^pre`` of :class:`HyperConnection` with its own parameters, and no sublayer
    after it. As ``DeepseekV4HyperHead`` (Hugging Face ``transformers`` 5.24), which
    ``DeepseekV4Model`` applies after its last layer, before its final RMSNorm. Computed
    in float32, the result cast to the streams' dtype. Initialized as V4's
    ``_init_weights`` does: ``phi ~ N(0, INIT_STD^2)`` (``hc_fn``), ``bias = 0``
    (``hc_base``), ``alpha = 1`` (``hc_scale``).

    Args:
        num_hiddens: width ``d`` of each stream.
        num_streams: number of streams ``n``.
        eps: V4's ``hc_eps``, added to the weights (1e-6).
        norm_eps: epsilon of the gain-free RMSNorm (V4's ``rms_norm_eps``, 1e-6).

    Attributes:
        phi: ``(n, n d)`` (V4: ``hc_fn``); bias: ``(n,)`` (``hc_base``); alpha: ``(1,)`` (``hc_scale``).

    Shape:
        ``(b, n_steps, n, d)`` in, ``(b, n_steps, d)`` out.

    Raises:
        TypeError / ValueError: as :class:`HyperConnection`.
    """

    def __init__(self, num_hiddens: int, num_streams: int = DEFAULT_NUM_STREAMS, *,
                 eps: float = DEFAULT_HC_EPS, norm_eps: float = DEFAULT_EPS["rms"]):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.num_streams = check_int_at_least("num_streams", num_streams, 1)
        self.eps = check_positive_float("eps", eps)
        self.norm_eps = check_positive_float("norm_eps", norm_eps)
        self.phi = nn.Parameter(torch.randn(self.num_streams, self.num_streams * self.num_hiddens) * INIT_STD)
        self.bias = nn.Parameter(torch.zeros(self.num_streams))
        self.alpha = nn.Parameter(torch.ones(1))

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        """Collapse ``streams`` ``(b, n_steps, n, d)`` into ``(b, n_steps, d)``."""
        _check_streams(streams, self.num_streams, self.num_hiddens)
        x = unweighted_rms_norm(streams.flatten(2).float(), self.norm_eps)
        h = torch.sigmoid(self.alpha.float() * (x @ self.phi.float().T) + self.bias.float()) + self.eps
        return (h.unsqueeze(-1) * streams).sum(dim=2).to(streams.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_hiddens}, num_streams={self.num_streams}, eps={self.eps}, norm_eps={self.norm_eps}"


class HyperConnectedBlock(nn.Module):
    r"""A DeepSeek-V4-style block: attention and FFN on ``n`` hyper-connected streams.

    For each sublayer, a :class:`HyperConnection` collapses the streams, an RMSNorm (with a
    gain) normalizes the collapsed input, the sublayer runs, and the connection expands its
    output and mixes the streams:

    .. math:: x \leftarrow H^{\mathrm{res}}_1 x + H^{\mathrm{post}}_1\,
              \mathrm{Attn}(\mathrm{RMSNorm}_1(H^{\mathrm{pre}}_1 x)),\qquad
              x \leftarrow H^{\mathrm{res}}_2 x + H^{\mathrm{post}}_2\,
              \mathrm{FFN}(\mathrm{RMSNorm}_2(H^{\mathrm{pre}}_2 x)),

    the wiring of ``DeepseekV4DecoderLayer`` (Hugging Face ``transformers`` 5.24: ``attn_hc``,
    ``input_layernorm``, ``self_attn``; ``ffn_hc``, ``post_attention_layernorm``, ``mlp``),
    with d2lmini's :class:`~d2lmini.attention.MultiHeadAttention` and
    :class:`~d2lmini.ffn.FeedForward` in place of V4's compressed attention and
    mixture of experts. A pre-LN block whose residual stream is ``n`` streams wide: a
    stack starts with :func:`expand_streams` and ends with :class:`HyperHead` (then, in
    V4, a final RMSNorm). Sources: Xie et al. (2025), mHC; Zhu et al. (2024),
    hyper-connections; DeepSeek-V4.

    Args:
        num_hiddens: width ``d`` of each stream.
        num_heads: attention heads.
        num_streams: number of streams ``n`` (default 4, V4's ``hc_mult``).
        act: FFN activation (default ``'swiglu'``); see :class:`~d2lmini.ffn.FeedForward`.
        ffn_num_hiddens: FFN hidden width (default: :class:`~d2lmini.ffn.FeedForward`'s).
        norm_eps: epsilon of the two RMSNorms and of the hyper-connections' gain-free
            RMSNorms (V4's ``rms_norm_eps``, 1e-6).
        sinkhorn_iters, hc_eps: the hyper-connections' ``sinkhorn_iters`` and ``eps``.
        attn_factory: zero-argument callable returning the attention module, called as
            ``attn(X, X, X, valid_lens)`` (as in :class:`~d2lmini.block.TransformerBlock`),
            e.g. DeepSeek-V4's own :class:`~d2lmini.deepseek_v4.CompressedAttention`;
            default ``None``: a :class:`~d2lmini.attention.MultiHeadAttention` built from
            ``num_heads`` and ``attention_kwargs`` (which must then be empty).
        ffn_factory: zero-argument callable returning the FFN module, called as ``ffn(X)``,
            or ``ffn(X, input_ids)`` when :meth:`forward` gets ``input_ids`` (DeepSeek-V4's
            hash-routed MoE, :class:`~d2lmini.deepseek_v4.HashRoutedMoE`); default ``None``: a
            :class:`~d2lmini.ffn.FeedForward` (then ``act`` and ``ffn_num_hiddens`` apply,
            otherwise they must keep their defaults).
        **attention_kwargs:
            keyword arguments of :class:`~d2lmini.attention.MultiHeadAttention`
            (e.g. ``causal=True``, ``num_kv_heads``, ``rope_theta``).

    Attributes:
        hc1, norm1, attention, hc2, norm2, ffn: the parts, in the order they run.

    Shape:
        ``forward(streams, valid_lens=None, *, input_ids=None)``: ``streams`` ``(b, n_steps, n, d)``,
        ``valid_lens`` ``None``, ``(b,)`` or ``(b, n_steps)`` (passed to the attention),
        ``input_ids`` ``None`` or the token ids ``(b, n_steps)`` (passed to the FFN);
        returns ``(b, n_steps, n, d)``.

    Raises:
        TypeError / ValueError: bad arguments (as :class:`HyperConnection`,
            :class:`~d2lmini.attention.MultiHeadAttention` and :class:`~d2lmini.ffn.FeedForward`);
            at call time streams that are not ``(b, n_steps, num_streams, num_hiddens)``, or
            bad ``valid_lens``; a factory that is not callable or does not return an
            ``nn.Module``, attention keyword arguments given with ``attn_factory``, ``act`` or
            ``ffn_num_hiddens`` given with ``ffn_factory``.
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, num_streams: int = DEFAULT_NUM_STREAMS,
                 act: str = "swiglu", ffn_num_hiddens: int | None = None, norm_eps: float = DEFAULT_EPS["rms"],
                 sinkhorn_iters: int = DEFAULT_SINKHORN_ITERS, hc_eps: float = DEFAULT_HC_EPS,
                 attn_factory: Callable[[], nn.Module] | None = None,
                 ffn_factory: Callable[[], nn.Module] | None = None, **attention_kwargs):
        super().__init__()
        hc = dict(sinkhorn_iters=sinkhorn_iters, eps=hc_eps, norm_eps=norm_eps)
        self.hc1 = HyperConnection(num_hiddens, num_streams, **hc)
        self.norm1 = RMSNorm(num_hiddens, norm_eps)
        self.attention = make_attention(num_hiddens, num_heads, attn_factory, **attention_kwargs)
        self.hc2 = HyperConnection(num_hiddens, num_streams, **hc)
        self.norm2 = RMSNorm(num_hiddens, norm_eps)
        if ffn_factory is None:
            self.ffn = FeedForward(num_hiddens, ffn_num_hiddens, act=act)
        else:
            if act != "swiglu" or ffn_num_hiddens is not None:
                raise ValueError("ffn_factory builds the FFN, so act and ffn_num_hiddens must keep their defaults")
            self.ffn = build_sublayer("ffn_factory", ffn_factory)
        self.num_hiddens, self.num_streams = self.hc1.num_hiddens, self.hc1.num_streams

    def forward(self, streams: torch.Tensor, valid_lens: torch.Tensor | None = None, *,
                input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the block to ``streams`` ``(b, n_steps, n, d)``; returns the same shape.

        ``input_ids``: ``None`` or the token ids ``(b, n_steps)``, passed to the FFN as ``ffn(X, input_ids)``
        (a hash-routed MoE selects its experts by them)."""
        streams = self.hc1(streams, lambda x: self.attention(*(self.norm1(x),) * 3, valid_lens))
        if input_ids is None:
            return self.hc2(streams, lambda x: self.ffn(self.norm2(x)))
        return self.hc2(streams, lambda x: self.ffn(self.norm2(x), input_ids))


__all__ = ["INIT_STD", "HyperConnectedBlock", "HyperConnection", "HyperHead", "expand_streams", "sinkhorn_knopp"]
