"""The Transformer block: two sublayers on one residual stream, norms placed by a flag.

Introduced in the chapter "Anatomy"; the placements are the subject of "Where the
norm goes". Shapes use the legend b = batch, n = num_steps, d = num_hiddens.
"""

from __future__ import annotations

import copy
import inspect
from typing import Callable

import torch
from torch import nn

from ._checks import (check_bool, check_choice, check_dtype_matches, check_left_at_default,
                      check_positive_float, check_positive_int, check_probability, check_sequence_tensor)
from ._shown import shown_in
from .attention import MultiHeadAttention
from .ffn import FeedForward
from .norms import NORMS, make_norm
from .placements import PLACEMENT_TABLE, placements

#: Where the norm goes, with the update each placement applies to the stream x
#: for a sublayer F:
#:
#: * ``'post'``: ``x <- Norm(x + F(x))`` -- Vaswani et al. 2017, BERT.
#: * ``'pre'``: ``x <- x + F(Norm(x))`` -- GPT-2 onward, Llama, Qwen3.
#: * ``'post_sublayer'``: ``x <- x + Norm(F(x))`` -- OLMo 2.
#: * ``'sandwich'``: ``x <- x + Norm_out(F(Norm_in(x)))`` -- CogView, Gemma 2/3, Peri-LN.
#:
#: The two parallel placements apply attention and FFN side by side, both reading the
#: same stream, in one update per block (:class:`TransformerBlock` only):
#:
#: * ``'parallel'``: ``x <- x + Attn(Norm(x)) + FFN(Norm(x))``, one shared norm -- GPT-J
#:   (``ln_1``), PaLM, Falcon-7B (``parallel_attn``, one ``input_layernorm``), Phi-1/2,
#:   Cohere Command R, StableLM with ``use_parallel_residual``.
#: * ``'parallel_two_norms'``: ``x <- x + Attn(Norm_1(x)) + FFN(Norm_2(x))`` -- GPT-NeoX and
#:   Pythia (``use_parallel_residual``: ``input_layernorm``, ``post_attention_layernorm``),
#:   Falcon-40B/180B (``new_decoder_architecture``: ``ln_attn``, ``ln_mlp``).
PLACEMENTS = placements(in_block=True)  # one record each: d2lmini.placements.PLACEMENT_TABLE

#: Placements with one residual connection per sublayer, applied one after the other
#: (those :class:`AddNorm` implements, and the ones the chapters compare).
SEQUENTIAL_PLACEMENTS = placements(in_block=True, parallel=False)

#: Placements where attention and FFN read the same stream (see :data:`PLACEMENTS`).
PARALLEL_PLACEMENTS = placements(in_block=True, parallel=True)

#: Placements that normalize the sublayer's output (where ``sublayer_norm_gain`` applies).
SUBLAYER_NORM_PLACEMENTS = placements(in_block=True, norm_out=True)


class AddNorm(nn.Module):
    """One residual connection with its norms placed as ``placement`` says.

    Generalizes d2l's ``AddNorm`` (which is the ``'post'`` case) to every
    placement in :data:`SEQUENTIAL_PLACEMENTS` (a parallel :class:`TransformerBlock`
    builds its two connections as ``'pre'`` ones, the second without a skip). It holds up to two norms:
    ``norm_in`` (on the sublayer's input: ``'pre'``, ``'sandwich'``),
    ``norm_out`` (on the sublayer's output, inside the residual branch:
    ``'post_sublayer'``, ``'sandwich'``) or ``norm_post`` (on the stream after the
    addition: ``'post'``); absent ones are ``None``.

    Args:
        num_hiddens: width ``d`` of the stream.
        placement: one of :data:`SEQUENTIAL_PLACEMENTS`.
        norm: one of :data:`d2lmini.norms.NORMS` (see :func:`d2lmini.norms.make_norm`).
        eps: the norms' epsilon (``None``: the norm type's default).
        dropout: dropout on the branch output before it is added, in [0, 1).
        sublayer_norm_gain: initial gain of ``norm_out`` (e.g. ``1/sqrt(L)`` for
            a depth-scaled sandwich); only for :data:`SUBLAYER_NORM_PLACEMENTS`.
        residual: ``True`` adds the branch to the stream; ``False`` *replaces* the stream
            by the branch (no skip connection; for the experiments of the chapter
            "Residual connections", He et al. 2016).

    Attributes:
        residual_multiplier: a constant ``m`` scaling the branch output before it is added,
            ``x <- x + m * F(Norm(x))``; 1.0 (the plain connection, bit for bit) unless
            :meth:`TransformerBlock.set_scales` changes it.

    Shape:
        ``forward(X, branch)``: ``X`` is ``(b, n, d)``; ``branch`` is a callable
        mapping ``(b, n, d)`` to ``(b, n, d)`` (the sublayer). Returns ``(b, n, d)``.

    Raises:
        ValueError: unknown ``placement``/``norm`` (the message lists the allowed
            names), or ``sublayer_norm_gain`` given for a placement without a
            sublayer-output norm.
    """

    def __init__(self, num_hiddens: int, placement: str = "pre", *, norm: str = "rms",
                 eps: float | None = None, dropout: float = 0.0, sublayer_norm_gain: float | None = None,
                 residual: bool = True):
        super().__init__()
        if placement in PARALLEL_PLACEMENTS:
            raise ValueError(f"placement={placement!r} combines two sublayers, so one AddNorm cannot apply it; "
                             f"use TransformerBlock(placement={placement!r}) or one of {SEQUENTIAL_PLACEMENTS}")
        self.placement = check_choice("placement", placement, SEQUENTIAL_PLACEMENTS)
        self.residual = check_bool("residual", residual)
        self.residual_multiplier = 1.0  # set by TransformerBlock.set_scales (the one place it is checked)
        check_choice("norm", norm, NORMS)
        if sublayer_norm_gain is not None and placement not in SUBLAYER_NORM_PLACEMENTS:
            raise ValueError(
                f"sublayer_norm_gain applies only to placements {SUBLAYER_NORM_PLACEMENTS}, "
                f"got placement={placement!r}"
            )
        gain = 1.0 if sublayer_norm_gain is None else sublayer_norm_gain
        norms = PLACEMENT_TABLE[placement]  # which norms this placement has
        self.norm_in = make_norm(norm, num_hiddens, eps) if norms.norm_in else None
        self.norm_out = make_norm(norm, num_hiddens, eps, gain) if norms.norm_out else None
        self.norm_post = make_norm(norm, num_hiddens, eps) if norms.norm_post else None
        self.dropout = nn.Dropout(check_probability("dropout", dropout))

    @shown_in("ch04")
    def forward(self, X: torch.Tensor,
                branch: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The stream ``X`` ``(b, n, d)`` updated by ``branch`` (a sublayer) with this placement's norms."""
        Y = branch(X if self.norm_in is None else self.norm_in(X))
        if self.norm_out is not None:
            Y = self.norm_out(Y)
        if self.residual_multiplier != 1.0:  # set_scales' m: x + m * F(Norm(x))
            Y = Y * self.residual_multiplier
        X = X + self.dropout(Y) if self.residual else self.dropout(Y)
        return X if self.norm_post is None else self.norm_post(X)


def build_sublayer(name: str, factory: Callable[[], nn.Module]) -> nn.Module:
    """Call a sublayer factory and check that it returned a module.

    Args:
        name: the factory's argument name (``'attn_factory'``, ``'ffn_factory'``), for the messages.
        factory: a zero-argument callable returning an ``nn.Module``.

    Returns:
        The module ``factory()`` built.

    Raises:
        TypeError: ``factory`` is a module itself (pass its class or ``lambda: module``), is not
            callable, or returns something that is not an ``nn.Module``.

    Used by :class:`TransformerBlock` and :class:`~d2lmini.hyper.HyperConnectedBlock`.
    """
    if isinstance(factory, nn.Module):  # a module is callable too: calling it would run its forward
        raise TypeError(f"{name} must build the module, not be it: pass its class or a function returning it "
                        f"({name}=lambda: module), got a {type(factory).__name__} instance")
    if not callable(factory):
        raise TypeError(f"{name} must be None or a callable returning an nn.Module, got {type(factory).__name__}")
    module = factory()
    if not isinstance(module, nn.Module):
        raise TypeError(f"{name} must return an nn.Module, got {type(module).__name__}")
    return module


#: The arguments :class:`~d2lmini.attention.MultiHeadAttention` takes after its first two,
#: read from its signature: the ones a block's ``**attention_kwargs`` may name.
ATTENTION_OPTIONS = tuple(name for name in inspect.signature(MultiHeadAttention.__init__).parameters
                          if name not in ("self", "num_hiddens", "num_heads"))


def make_attention(num_hiddens: int, num_heads: int, attn_factory: Callable[[], nn.Module] | None = None,
                   **attention_kwargs) -> nn.Module:
    """The self-attention of a block: built by ``attn_factory``, or a :class:`MultiHeadAttention`.

    The one place where a block's attention options reach the attention: every block
    (:class:`TransformerBlock`, :class:`TransformerDecoderBlock`,
    :class:`~d2lmini.hyper.HyperConnectedBlock`) calls it with its ``**attention_kwargs``.

    Args:
        num_hiddens: model width ``d``.
        num_heads: query heads ``h``; with ``attn_factory``, checked against the module's
            ``num_heads`` where it has one.
        attn_factory: ``None``, or a zero-argument callable returning the attention module
            (called as ``attn(X, X, X, valid_lens)``); it then configures the module alone.
        **attention_kwargs: options of :class:`MultiHeadAttention` (:data:`ATTENTION_OPTIONS`:
            ``num_kv_heads``, ``causal``, ``qk_norm``, ``rope_theta``, ``window``, ``dropout``,
            ``bias``, ...); only without ``attn_factory``.

    Returns:
        The attention module.

    Raises:
        TypeError: a name in ``attention_kwargs`` that :class:`MultiHeadAttention` does not take
            (the message lists those it takes), or a bad ``attn_factory`` (see :func:`build_sublayer`).
        ValueError: ``attention_kwargs`` given together with ``attn_factory``, or ``num_heads``
            unequal to the factory's module's; and whatever :class:`MultiHeadAttention` rejects.
    """
    unknown = sorted(set(attention_kwargs) - set(ATTENTION_OPTIONS))
    if unknown:
        raise TypeError(f"unknown argument(s) {unknown}: a block passes its attention options to MultiHeadAttention, "
                        f"which takes {list(ATTENTION_OPTIONS)}")
    if attn_factory is None:
        return MultiHeadAttention(num_hiddens, num_heads, **attention_kwargs)
    if attention_kwargs:
        given = ", ".join(f"{name}={value!r}" for name, value in attention_kwargs.items())
        raise ValueError(f"{given} would be ignored: attn_factory builds the attention, so set these on the "
                         f"module it returns")
    attention = build_sublayer("attn_factory", attn_factory)
    check_positive_int("num_heads", num_heads)
    heads = getattr(attention, "num_heads", num_heads)  # checked where the module has one
    if heads != num_heads:
        raise ValueError(f"num_heads={num_heads} differs from the num_heads={heads} of the module "
                         f"attn_factory returned; pass num_heads={heads}")
    return attention


#: Block arguments of earlier versions that now live elsewhere, with where: the message
#: :class:`TransformerBlock` gives when one is passed.
MOVED = {"attn_scale": "pass scale=... (the attention's own name for it)",
         "residual_multiplier": "call block.set_scales(residual_multiplier=...) after building the block",
         "layer_scalar": "call block.set_scales(layer_scalar=...) after building the block"}


class TransformerBlock(nn.Module):
    r"""A Transformer block: self-attention, then an FFN, each added to the stream.

    One constructor covers the designs from the 2017 Transformer to 2026 decoders:
    ``TransformerBlock(d, h, norm='layer', act='relu', placement='post', bias=True)``
    is Vaswani et al. (2017); the defaults (RMSNorm, SwiGLU, pre-LN, no biases) are
    the Llama-style block. Every block owns its parameters; input and output
    have the same shape, which is what makes blocks stackable.

    Args:
        num_hiddens: width ``d`` of the residual stream.
        num_heads: attention heads; must divide ``num_hiddens`` unless ``head_dim`` is given.
        dropout: dropout on attention weights, FFN hidden units and each branch
            output before it is added (training only), in [0, 1).
        norm: ``'layer'`` (LayerNorm), ``'rms'`` (RMSNorm), ``'layer_no_bias'`` (LayerNorm
            without bias, Cohere Command R) or ``'layer_nonparametric'`` (LayerNorm without
            gain or bias, OLMo 1); see :func:`d2lmini.norms.make_norm`.
        act: FFN activation, one of :data:`~d2lmini.ffn.ACTS` (see :class:`~d2lmini.ffn.FeedForward`).
        placement: where the norms go: ``'post'``, ``'pre'``, ``'post_sublayer'``,
            ``'sandwich'``, or attention and FFN in parallel, ``x <- x + Attn(N_1(x)) +
            FFN(N_2(x))``, with one shared norm ``N_1 = N_2`` (``'parallel'``: GPT-J, PaLM,
            Falcon-7B, Phi-1/2, Cohere) or two (``'parallel_two_norms'``: GPT-NeoX, Falcon-40B);
            see :data:`PLACEMENTS`. A parallel block has a dropout on each branch (as GPT-NeoX
            and Phi; Falcon drops out their sum once, and StableLM only the FFN branch, which
            differs in training only),
            takes neither ``sublayer_norm_gain`` nor ``residual_multiplier``, and
            ``residual=False`` leaves ``Attn(N_1(x)) + FFN(N_2(x))``. With ``'parallel'``,
            ``addnorm2.norm_in`` *is* ``addnorm1.norm_in`` (one module, one set of weights).
        bias: whether the attention and FFN linear layers have biases.
        ffn_num_hiddens: FFN hidden width (default ``4d``, or ``round(8d/3)`` gated).
        eps: epsilon of every norm (default: 1e-5 for LayerNorm, 1e-6 for RMSNorm).
        residual: ``False`` removes both skip connections (see :class:`AddNorm`).
        sublayer_norm_gain: initial gain of the norms on the sublayer outputs, for
            ``'post_sublayer'`` and ``'sandwich'`` (a depth-scaled sandwich uses e.g. ``1/sqrt(L)``).
        attn_factory: zero-argument callable returning the attention module, called as
            ``attn(X, X, X, valid_lens)`` (with ``cache=`` during generation); default a
            :class:`MultiHeadAttention` built from ``**attention_kwargs``. When given, the
            module is configured by the factory alone: ``attention_kwargs`` must be empty, and
            ``num_heads`` must equal the module's ``num_heads`` if it has one (``ValueError``
            otherwise). A released model's attention (:mod:`d2lmini.reference`) comes this way.
        ffn_factory: zero-argument callable returning the FFN module, called as
            ``ffn(X)``; default a :class:`~d2lmini.ffn.FeedForward`. When given, ``act``
            and ``ffn_num_hiddens`` must keep their defaults.
        **attention_kwargs: the attention's own options, passed to :class:`MultiHeadAttention`
            with ``dropout`` and ``bias`` (see :func:`make_attention`, the one place they go
            through): ``num_kv_heads`` (grouped-query attention, default ``num_heads``),
            ``causal`` (decoder-only models), ``head_dim``, ``qk_norm`` (QK-norm variant),
            ``rope_theta`` (RoPE base, ``None``: no rotary positions), ``rope_scaling`` (its
            scaling and partial rotation), ``window`` (sliding window; needs ``causal=True``) and ``sinks``
            (:data:`ATTENTION_OPTIONS`).

    Two constant scalings of the stream that some released models use are set with :meth:`set_scales`.

    Attributes:
        attention, ffn: the two sublayers.
        addnorm1, addnorm2: their residual connections and norms (:class:`AddNorm`); in a
            parallel block ``'pre'`` connections, ``addnorm2`` without its skip.

    Shape:
        ``forward(X, valid_lens=None)``: ``X`` ``(b, n, d)``; ``valid_lens`` ``None``,
        ``(b,)`` or ``(b, n)`` (keys at positions >= valid length are masked).
        Returns ``(b, n, d)``.

    Raises:
        ValueError: an unknown ``norm``, ``act`` or ``placement`` (the message lists
            the allowed names), a parallel placement with ``sublayer_norm_gain`` or
            ``residual_multiplier != 1``, ``num_hiddens`` not divisible by ``num_heads``,
            ``num_heads`` not divisible by ``num_kv_heads``, dropout outside [0, 1), an
            argument that a factory makes meaningless set to a non-default value, or
            ``num_heads`` unequal to the factory's module's; at call time an input that
            is not ``(b, n, d)`` or bad ``valid_lens``.
        TypeError: arguments or inputs of the wrong type (every argument after
            ``num_heads`` is keyword-only), an attention option :class:`MultiHeadAttention`
            does not take, a factory that is not callable or does not
            return an ``nn.Module``, or an input whose dtype differs from the block's weights.
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, dropout: float = 0.0, norm: str = "rms",
                 act: str = "swiglu", placement: str = "pre", bias: bool = False,
                 ffn_num_hiddens: int | None = None, eps: float | None = None, residual: bool = True,
                 sublayer_norm_gain: float | None = None, attn_factory: Callable[[], nn.Module] | None = None,
                 ffn_factory: Callable[[], nn.Module] | None = None, **attention_kwargs):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.placement = check_choice("placement", placement, PLACEMENTS)
        self.norm = check_choice("norm", norm, NORMS)
        check_bool("bias", bias)
        moved = {name: MOVED[name] for name in attention_kwargs if name in MOVED}
        if moved:
            raise TypeError(f"TransformerBlock takes no {', '.join(moved)}: "
                            + "; ".join(f"{name} -> {where}" for name, where in moved.items()))
        shared = {} if attn_factory is not None else dict(dropout=dropout, bias=bias)  # the block's, given to MHA
        self.attention = make_attention(num_hiddens, num_heads, attn_factory, **shared, **attention_kwargs)
        if ffn_factory is None:
            self.ffn = FeedForward(num_hiddens, ffn_num_hiddens, act=act, bias=bias, dropout=dropout)
        else:
            check_left_at_default("ffn_factory builds the FFN, so set these on the module it returns",
                                  TransformerBlock.__init__, act=act, ffn_num_hiddens=ffn_num_hiddens)
            self.ffn = build_sublayer("ffn_factory", ffn_factory)
        parallel = placement in PARALLEL_PLACEMENTS
        if parallel and sublayer_norm_gain is not None:
            raise ValueError(f"placement={placement!r} takes no sublayer_norm_gain, "
                             f"got sublayer_norm_gain={sublayer_norm_gain!r}")
        addnorm = dict(placement="pre" if parallel else placement, norm=norm, eps=eps, dropout=dropout,
                       sublayer_norm_gain=sublayer_norm_gain, residual=residual)
        self.layer_scalar = 1.0
        self.addnorm1 = AddNorm(num_hiddens, **addnorm)
        self.addnorm2 = AddNorm(num_hiddens, **{**addnorm, "residual": residual and not parallel})
        if placement == "parallel":  # one norm feeds both sublayers (GPT-J's ln_1)
            self.addnorm2.norm_in = self.addnorm1.norm_in

    def set_scales(self, *, residual_multiplier: float = 1.0, layer_scalar: float = 1.0) -> "TransformerBlock":
        r"""Set the two constant scalings of the stream some released models use; returns the block.

        Args:
            residual_multiplier: a finite float ``m > 0`` scaling both sublayer outputs before
                they are added, ``x <- x + m * F(Norm(x))`` (IBM Granite, see
                :func:`d2lmini.reference.from_granite_layer`). Only for ``placement='pre'`` with
                ``residual=True``. ``1.0`` is the plain block, bit for bit.
            layer_scalar: a finite float ``s > 0`` multiplying the block's whole output, stream
                included, after both sublayers, ``x <- s * block(x)`` (Gemma 4, see
                :func:`d2lmini.reference.from_gemma4_layer`); a plain float (no gradient, not in
                the ``state_dict``). ``1.0`` is the plain block, bit for bit.

        Returns:
            ``self``, so that a converter can write ``TransformerBlock(...).set_scales(...)``.

        Raises:
            TypeError: a value that is not a real number.
            ValueError: a value that is not a finite float > 0, or ``residual_multiplier != 1``
                with a placement other than ``'pre'`` (parallel ones included) or with
                ``residual=False``.

        The converters of :mod:`d2lmini.reference` (Granite, Gemma 4) call it; no chapter does.
        """
        m = check_positive_float("residual_multiplier", residual_multiplier)
        s = check_positive_float("layer_scalar", layer_scalar)
        if m != 1.0 and (self.placement != "pre" or not self.addnorm1.residual):
            raise ValueError(f"residual_multiplier applies only to placement='pre' with residual=True (IBM Granite), "
                             f"got residual_multiplier={residual_multiplier!r} with placement={self.placement!r}, "
                             f"residual={self.addnorm1.residual!r}")
        for addnorm in self._addnorms():
            addnorm.residual_multiplier = m
        self.layer_scalar = s
        return self

    def _addnorms(self) -> list[AddNorm]:
        """The block's residual connections, in order (two here; three in the decoder block)."""
        return [self.addnorm1, self.addnorm2]

    def forward(self, X: torch.Tensor, valid_lens: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """Apply the block to ``X`` (b, n, d); ``valid_lens`` ``None``, (b,) or (b, n). Returns (b, n, d).

        ``cache``: ``None``, or the :class:`~d2lmini.cache.LayerCache` of this block during generation,
        handed to the attention (``X`` then holds the new positions only; see
        :meth:`MultiHeadAttention.forward`).

        Raises ``ValueError``/``TypeError`` for an input that is not a floating
        (b, n, d) tensor of the block's dtype, or bad ``valid_lens``.
        """
        check_sequence_tensor("X", X, self.num_hiddens)
        check_dtype_matches("X", X, self)
        extra = {} if cache is None else {"cache": cache}  # (an attention from a factory may take no cache)
        attended = self.addnorm1(X, lambda Y: self.attention(Y, Y, Y, valid_lens, **extra))
        if self.placement in PARALLEL_PLACEMENTS:  # x + Attn(N1(x)) + FFN(N2(x)); addnorm2 adds no skip
            out = attended + self.addnorm2(X, self.ffn)
        else:
            out = self.addnorm2(attended, self.ffn)
        return out if self.layer_scalar == 1.0 else out * self.layer_scalar  # Gemma 4: the whole output scaled

    def extra_repr(self) -> str:
        return f"placement={self.placement!r}, norm={self.norm!r}"


class TransformerDecoderBlock(TransformerBlock):
    r"""The decoder block of an encoder-decoder Transformer: three sublayers on one stream.

    Causal self-attention, then cross-attention (queries from the decoder's stream,
    keys and values from the encoder's outputs), then the FFN, each with its own
    residual connection and norms placed as ``placement`` says (Vaswani et al., 2017,
    Section 3.1). It takes every argument of :class:`TransformerBlock` (all but the
    first two keyword-only); the ones below differ.

    Args:
        placement: one of :data:`SEQUENTIAL_PLACEMENTS` (the parallel placements of
            :class:`TransformerBlock` are rejected: no model runs self-attention,
            cross-attention and FFN side by side).
        causal: whether the self-attention is causal (default ``True``). With
            ``attn_factory`` the module it returns decides, and ``causal`` must stay ``True``.
        dropout, bias, num_kv_heads, head_dim: as in :class:`TransformerBlock`, and also
            those of the cross-attention, a plain :class:`MultiHeadAttention` (no RoPE,
            no QK-norm, not causal). With ``attn_factory``, ``num_kv_heads`` and
            ``head_dim`` configure the cross-attention only.
        window: passed (with the other :class:`TransformerBlock` arguments) to the
            self-attention only; the cross-attention never has a window.

    Attributes:
        attention, cross_attention, ffn: the three sublayers.
        addnorm1, addnorm2, addnorm3: their residual connections (self-attention,
            cross-attention, FFN).

    Shape:
        ``forward(X, enc_outputs, enc_valid_lens=None, valid_lens=None)``: ``X``
        ``(b, n, d)``; ``enc_outputs`` ``(b, m, d)``; ``enc_valid_lens`` ``None`` or
        ``(b,)`` (encoder padding); ``valid_lens`` ``None``, ``(b,)`` or ``(b, n)``
        (decoder padding, combined with the causal mask). Returns ``(b, n, d)``.

    Raises:
        ValueError / TypeError: as :class:`TransformerBlock`, and ``causal=False`` with
            ``attn_factory`` or a parallel ``placement``; at call time also for ``enc_outputs`` that is not
            ``(b, m, d)`` or bad ``enc_valid_lens``.
    """

    def __init__(self, num_hiddens: int, num_heads: int, *, causal: bool = True, dropout: float = 0.0,
                 bias: bool = False, num_kv_heads: int | None = None, head_dim: int | None = None,
                 attn_factory: Callable[[], nn.Module] | None = None, **kwargs):
        if attn_factory is None:  # the self-attention gets the cross-attention's heads, and is causal
            kwargs.update(causal=causal, num_kv_heads=num_kv_heads, head_dim=head_dim)
        else:
            check_left_at_default("attn_factory builds the self-attention, so make the module it returns causal",
                                  TransformerDecoderBlock.__init__, causal=causal)
        if kwargs.get("placement") in PARALLEL_PLACEMENTS:  # no model runs three sublayers in parallel
            raise ValueError(f"TransformerDecoderBlock applies its three sublayers one after the other; "
                             f"placement must be one of {SEQUENTIAL_PLACEMENTS}, got {kwargs['placement']!r}")
        super().__init__(num_hiddens, num_heads, dropout=dropout, bias=bias, attn_factory=attn_factory, **kwargs)
        self.cross_attention = MultiHeadAttention(num_hiddens, num_heads, dropout=dropout, bias=bias,
                                                  num_kv_heads=num_kv_heads, head_dim=head_dim)
        # A third residual connection like the other two: same placement, norms, dropout; its own weights.
        self.addnorm3 = copy.deepcopy(self.addnorm2)

    def _addnorms(self) -> list[AddNorm]:
        """The three residual connections: self-attention, cross-attention, FFN."""
        return [self.addnorm1, self.addnorm2, self.addnorm3]

    def forward(self, X: torch.Tensor, enc_outputs: torch.Tensor, enc_valid_lens: torch.Tensor | None = None,
                valid_lens: torch.Tensor | None = None) -> torch.Tensor:
        """Self-attend (causally), cross-attend to ``enc_outputs`` (b, m, d), then the FFN; returns (b, n, d)."""
        check_sequence_tensor("X", X, self.num_hiddens)
        check_dtype_matches("X", X, self)
        check_sequence_tensor("enc_outputs", enc_outputs, self.num_hiddens)
        X = self.addnorm1(X, lambda Y: self.attention(Y, Y, Y, valid_lens))
        X = self.addnorm2(X, lambda Y: self.cross_attention(Y, enc_outputs, enc_outputs, enc_valid_lens))
        X = self.addnorm3(X, self.ffn)
        return X if self.layer_scalar == 1.0 else X * self.layer_scalar
