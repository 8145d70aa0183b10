r"""Gated DeltaNet: a linear-attention token mixer with a constant-size state.

Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2024, "Gated Delta Networks: Improving
Mamba2 with Delta Rule", https://arxiv.org/abs/2412.06464) replaces softmax attention's
growing key-value cache by one matrix per head, the *state* ``S`` (``d_k x d_v``), which
each token first decays and then corrects with the delta rule:

.. math::

    S_t = \alpha_t S_{t-1} + \beta_t\, k_t \bigl(v_t - \alpha_t S_{t-1}^\top k_t\bigr)^\top,
    \qquad o_t = S_t^\top q_t,

with the decay ``alpha_t = exp(g_t)`` in (0, 1] and the write strength ``beta_t`` in (0, 1).
``alpha_t S_{t-1}^T k_t`` is what the decayed state already stores under the key ``k_t``;
only the difference to ``v_t`` is written (the delta rule, Widrow & Hoff 1960; DeltaNet,
Schlag et al. 2021; Yang et al. 2024). Qwen3-Next and Qwen3.5 use it in three of every
four layers (the fourth is gated softmax attention).

:class:`GatedDeltaNet` follows ``Qwen3_5GatedDeltaNet`` of Hugging Face ``transformers``
5.24 (``models/qwen3_5/modeling_qwen3_5.py``) and is checked against it in
``tests/test_deltanet.py``; :func:`gated_delta_rule` is the recurrence above, a loop over
time; :func:`inference_state_bytes` compares its state with an attention layer's cache.

The loop is the *recurrent* form: ``n`` sequential steps, as in one-token decoding (HF's
``torch_recurrent_gated_delta_rule``, FLA's fused recurrent kernel). Training and prefill use
the *chunked* form (HF's ``torch_chunk_gated_delta_rule``, FLA's ``chunk_gated_delta_rule``):
inside each chunk of 64 tokens the product of the per-token updates ``(I - beta k k^T)`` is
folded into one triangular solve (the WY/UT representation), so the work becomes matrix
products done in parallel over all chunks, and only ``n / 64`` sequential state updates remain.
It buys speed and tensor-core use, not different numbers: the tests check that both forms agree
with this loop (to float32 summation order).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import (check_dtype_matches, check_instance, check_nonnegative_int, check_positive_float,
                      check_positive_int, check_sequence_tensor)
from .attention import GatedAttention, MultiHeadAttention, valid_lens_mask
from .mla import MultiHeadLatentAttention, kv_cache_bytes_per_token
from .norms import RMSNorm
from ._shown import shown_in

__all__ = ["GatedDeltaNet", "gated_delta_rule", "inference_state_bytes", "l2_normalize"]


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x**2, dim=-1) + eps)``: unit-length last dimension (the ``l2norm`` of HF and FLA).

    Shape: any ``(*, d)``; returns the same shape and dtype.
    """
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


@shown_in("ch11")
def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, initial_state: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The gated delta rule, one token at a time: ``S <- e^g S + beta k (v - e^g S^T k)^T``, ``o = S^T q``.

    Per batch entry and head, the state ``S`` (``d_k x d_v``) maps keys to values: each step
    decays it, reads what it stores under ``k_t``, writes the error back with strength ``beta_t``
    and reads the output under ``q_t``. HF's ``torch_recurrent_gated_delta_rule`` computes the
    same; its ``torch_chunk_gated_delta_rule`` (training, prefill) too, chunk by chunk: same math,
    but matrix products parallel over chunks and ``n / 64`` sequential steps instead of ``n``.

    Args:
        q, k: ``(b, n, h, d_k)``, L2-normalized (``q`` also scaled); v: ``(b, n, h, d_v)``;
        g: log-decays ``(b, n, h)``, ``<= 0``; beta: write strengths ``(b, n, h)`` in ``[0, 1]``;
        initial_state: ``None`` (zeros) or ``(b, h, d_k, d_v)``.

    Returns:
        ``(out, final_state)``, ``(b, n, h, d_v)`` and ``(b, h, d_k, d_v)``, in ``v``'s dtype.

    Raises:
        TypeError / ValueError: inputs that are not tensors of these matching shapes.
    """
    _check_rule_inputs(q, k, v, g, beta, initial_state)
    b, n, h, d_k = k.shape
    S = (v.new_zeros(b, h, d_k, v.shape[-1]) if initial_state is None
         else initial_state.to(v.dtype))
    outs = []
    for t in range(n):
        S = S * g[:, t, :, None, None].exp()                  # decay:  S <- e^g S
        stored = torch.einsum("bhkv,bhk->bhv", S, k[:, t])     # read:   S^T k
        delta = beta[:, t, :, None] * (v[:, t] - stored)       # error:  beta(v - S^T k)
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], delta)  # write:  S += k delta^T
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))  # output: S^T q
    out = torch.stack(outs, dim=1) if outs else v.new_zeros(v.shape)
    return out, S


def _check_rule_inputs(q, k, v, g, beta, initial_state) -> None:
    """Raise TypeError/ValueError, naming the argument, unless the shapes of :func:`gated_delta_rule` hold."""
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_instance(name, x, torch.Tensor, "a torch.Tensor")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if k.dim() != 4:
        raise ValueError(f"k must have shape (b, n, h, d_k), got {tuple(k.shape)}")
    b, n, h, d_k = k.shape
    if tuple(q.shape) != tuple(k.shape):
        raise ValueError(f"q must have the shape of k, {tuple(k.shape)}, got {tuple(q.shape)}")
    if v.dim() != 4 or tuple(v.shape[:3]) != (b, n, h):
        raise ValueError(f"v must have shape ({b}, {n}, {h}, d_v), got {tuple(v.shape)}")
    for name, x in (("g", g), ("beta", beta)):
        if tuple(x.shape) != (b, n, h):
            raise ValueError(f"{name} must have shape ({b}, {n}, {h}), got {tuple(x.shape)}")
    if initial_state is not None:
        check_instance("initial_state", initial_state, torch.Tensor, "None or a torch.Tensor")
        if tuple(initial_state.shape) != (b, h, d_k, v.shape[-1]):
            raise ValueError(f"initial_state must have shape ({b}, {h}, {d_k}, {v.shape[-1]}), "
                             f"got {tuple(initial_state.shape)}")


class GatedDeltaNet(nn.Module):
    r"""The Gated DeltaNet token mixer of Qwen3-Next and Qwen3.5 (a drop-in for causal self-attention).

    For an input ``X`` ``(b, n, d)``:

    1. project ``X`` to ``q, k, v`` (``in_proj_qkv``), to the output gate ``z`` (``in_proj_z``),
       and to one ``b`` and one ``a`` per value head (``in_proj_b``, ``in_proj_a``);
    2. run a causal depthwise convolution (kernel ``conv_kernel_size``, no bias) over time on
       the ``q, k, v`` channels, then SiLU -- each channel mixes its last few tokens;
    3. split into ``num_k_heads`` query and key heads (``head_k_dim``) and ``num_v_heads``
       value heads (``head_v_dim``); L2-normalize ``q`` and ``k`` per head, scale ``q`` by
       ``head_k_dim**-0.5``, and repeat each query/key head for ``num_v_heads // num_k_heads``
       consecutive value heads (grouped as in GQA, but the *values* have more heads);
    4. ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)`` (Mamba 2's
       discretized decay, so ``exp(g)`` is in (0, 1)), and run :func:`gated_delta_rule`
       in float32;
    5. normalize each head's output with an RMSNorm over ``head_v_dim`` (one gain shared by
       the heads), multiply by ``silu(z)`` (HF's ``Qwen3_5RMSNormGated``: norm, then gate),
       and project back to ``d`` (``out_proj``).

    The parameters carry Hugging Face's names, so ``load_state_dict`` of a
    ``Qwen3_5GatedDeltaNet``'s state dict works as is (:func:`~d2lmini.reference.qwen3_5.from_qwen3_5_gated_deltanet`).
    Qwen3-Next stores the same weights interleaved per key head (``in_proj_qkvz``,
    ``in_proj_ba``); the math is the same.

    Args:
        num_hiddens: model width ``d``.
        num_k_heads: query/key heads (``linear_num_key_heads``, 16 in Qwen3.5's config).
        num_v_heads: value heads, a multiple of ``num_k_heads`` (``linear_num_value_heads``, 32).
        head_k_dim: query/key head size (``linear_key_head_dim``, 128).
        head_v_dim: value head size (``linear_value_head_dim``, 128).
        conv_kernel_size: width of the causal convolution (``linear_conv_kernel_dim``, default 4).
        eps: of the output RMSNorm (``rms_norm_eps``, default 1e-6).

    Attributes:
        in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj: bias-free ``nn.Linear`` layers;
        conv1d: depthwise ``nn.Conv1d`` over the ``2 * key_dim + value_dim`` channels of ``q, k, v``
        (its ``weight`` ``(channels, 1, conv_kernel_size)``; the module pads on the left itself);
        A_log, dt_bias: ``(num_v_heads,)``; norm: :class:`~d2lmini.norms.RMSNorm` over ``head_v_dim``;
        key_dim, value_dim, conv_dim: ``num_k_heads * head_k_dim``, ``num_v_heads * head_v_dim``,
        ``2 * key_dim + value_dim``; causal: always ``True``.

    Shape:
        ``forward(X, keys=None, values=None, valid_lens=None, *, state=None, return_state=False)``:
        ``X`` ``(b, n, d)``; ``keys``/``values`` are there so that the module answers
        :class:`~d2lmini.block.TransformerBlock`'s call ``attn(X, X, X, valid_lens)`` and must be
        ``None`` or ``X`` itself; ``valid_lens`` ``None`` or ``(b,)`` lengths of a right-padded
        batch. Returns ``(b, n, d)``, or ``((b, n, d), state)`` with ``return_state=True``, where
        ``state = (conv_state, recurrent_state)``: the last ``conv_kernel_size - 1`` inputs of the
        convolution ``(b, conv_dim, conv_kernel_size - 1)`` (in ``X``'s dtype) and ``S``
        ``(b, num_v_heads, head_k_dim, head_v_dim)`` (float32). Passing it back as ``state``
        continues the sequence: running a sequence in pieces gives the outputs of running it whole.

    Padding: the mixer is causal, so padded positions after a valid one cannot change it. As
    HF's ``apply_mask_to_padding_states``, the input at padded positions is set to zero first
    (which makes *left* padding neutral too: a zero input adds nothing to a zero state).

    Raises:
        TypeError / ValueError: bad constructor arguments (``num_v_heads`` not a multiple of
            ``num_k_heads``, non-positive sizes); at call time an ``X`` that is not a floating
            ``(b, n, d)`` tensor of the module's dtype, ``keys``/``values`` other than ``None``/``X``,
            bad ``valid_lens``, a malformed ``state``, or ``return_state=True`` with ``valid_lens``
            (the state would include the padding).
    """

    causal = True

    def __init__(self, num_hiddens: int, *, num_k_heads: int, num_v_heads: int, head_k_dim: int,
                 head_v_dim: int, conv_kernel_size: int = 4, eps: float = 1e-6):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.num_k_heads = check_positive_int("num_k_heads", num_k_heads)
        self.num_v_heads = check_positive_int("num_v_heads", num_v_heads)
        if num_v_heads % num_k_heads:
            raise ValueError(f"num_v_heads={num_v_heads} must be a multiple of num_k_heads={num_k_heads}")
        self.head_k_dim = check_positive_int("head_k_dim", head_k_dim)
        self.head_v_dim = check_positive_int("head_v_dim", head_v_dim)
        self.conv_kernel_size = check_positive_int("conv_kernel_size", conv_kernel_size)
        self.eps = check_positive_float("eps", eps)
        self.key_dim = num_k_heads * head_k_dim
        self.value_dim = num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.in_proj_qkv = nn.Linear(num_hiddens, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(num_hiddens, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(num_hiddens, num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(num_hiddens, num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel_size, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))  # HF's initialization
        self.A_log = nn.Parameter(torch.empty(num_v_heads).uniform_(0.01, 16).log())  # A in [0.01, 16], as HF
        self.norm = RMSNorm(head_v_dim, eps)
        self.out_proj = nn.Linear(self.value_dim, num_hiddens, bias=False)

    def forward(self, X: torch.Tensor, keys: torch.Tensor | None = None, values: torch.Tensor | None = None,
                valid_lens: torch.Tensor | None = None, *, state: tuple | None = None, return_state: bool = False):
        """Mix ``X`` ``(b, n, d)`` causally; see the class docstring for ``state`` and the shapes."""
        check_sequence_tensor("X", X, self.num_hiddens)
        check_dtype_matches("X", X, self)
        for name, other in (("keys", keys), ("values", values)):
            if other is not None and other is not X:
                raise ValueError(f"{name} must be None or the input X itself: GatedDeltaNet mixes one sequence")
        b, n, _ = X.shape
        mask = self._padding_mask(valid_lens, b, n, return_state)
        conv_state, S0 = self._check_state(state, X)
        if mask is not None:
            X = X * mask[..., None]  # HF's apply_mask_to_padding_states

        # Causal depthwise convolution over time on the q, k, v channels, then SiLU.
        qkv = torch.cat([conv_state, self.in_proj_qkv(X).transpose(1, 2)], dim=-1)  # (b, conv_dim, K-1+n)
        new_conv_state = qkv[..., qkv.shape[-1] - (self.conv_kernel_size - 1):]
        qkv = F.silu(F.conv1d(qkv, self.conv1d.weight, groups=self.conv_dim)).transpose(1, 2)  # (b, n, conv_dim)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)

        # Heads: unit-length q and k (float32), q scaled, each q/k head shared by r value heads.
        r, f32 = self.num_v_heads // self.num_k_heads, torch.promote_types(X.dtype, torch.float32)
        q = l2_normalize(q.reshape(b, n, self.num_k_heads, self.head_k_dim).to(f32)).repeat_interleave(r, dim=2)
        k = l2_normalize(k.reshape(b, n, self.num_k_heads, self.head_k_dim).to(f32)).repeat_interleave(r, dim=2)
        v = v.reshape(b, n, self.num_v_heads, self.head_v_dim).to(f32)
        beta = torch.sigmoid(self.in_proj_b(X)).to(f32)
        g = -self.A_log.to(f32).exp() * F.softplus(self.in_proj_a(X).to(f32) + self.dt_bias)
        out, S = gated_delta_rule(q * self.head_k_dim ** -0.5, k, v, g, beta, S0)

        # Per-head RMSNorm, gated by silu(z), then back to d.
        z = self.in_proj_z(X).reshape(b, n, self.num_v_heads, self.head_v_dim)
        out = (self.norm(out.to(X.dtype)) * F.silu(z.to(f32))).to(X.dtype)
        Y = self.out_proj(out.reshape(b, n, self.value_dim))
        return (Y, (new_conv_state, S)) if return_state else Y

    def _padding_mask(self, valid_lens, b: int, n: int, return_state) -> torch.Tensor | None:
        """The (b, n) bool mask of the real positions, or ``None``; checks ``valid_lens`` and ``return_state``."""
        if not isinstance(return_state, bool):
            raise TypeError(f"return_state must be True or False, got {type(return_state).__name__}")
        mask = valid_lens_mask(valid_lens, n)
        if mask is None:
            return None
        if tuple(valid_lens.shape) != (b,):
            raise ValueError(f"valid_lens must have shape ({b},), got {tuple(valid_lens.shape)}")
        if return_state:
            raise ValueError("return_state=True needs valid_lens=None: the final state would include the padding")
        return mask

    def _check_state(self, state, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``state`` checked, or the empty state: zeros for the convolution and ``None`` for ``S``."""
        b = X.shape[0]
        conv_shape = (b, self.conv_dim, self.conv_kernel_size - 1)
        if state is None:
            return X.new_zeros(conv_shape), None
        if not isinstance(state, (tuple, list)) or len(state) != 2 or not all(
                isinstance(s, torch.Tensor) for s in state):
            raise TypeError("state must be None or a (conv_state, recurrent_state) pair of tensors, "
                            f"got {type(state).__name__}")
        conv_state, S = state
        S_shape = (b, self.num_v_heads, self.head_k_dim, self.head_v_dim)
        for name, x, shape in (("state[0] (conv_state)", conv_state, conv_shape), ("state[1] (recurrent_state)",
                                                                                    S, S_shape)):
            if tuple(x.shape) != shape:
                raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
        return conv_state.to(X.dtype), S


def inference_state_bytes(module: nn.Module, num_steps: int, *, batch_size: int = 1,
                          dtype: torch.dtype | None = None) -> int:
    """Bytes a layer keeps between decoding steps after ``num_steps`` tokens, read from its shapes.

    * :class:`GatedDeltaNet`: constant in ``num_steps`` -- the recurrent state
      ``num_v_heads * head_k_dim * head_v_dim`` plus the convolution's last inputs
      ``conv_dim * (conv_kernel_size - 1)``, per sequence.
    * softmax attention (:class:`~d2lmini.attention.MultiHeadAttention`,
      :class:`~d2lmini.attention.GatedAttention`, :class:`~d2lmini.mla.MultiHeadLatentAttention`):
      the key-value cache, :func:`~d2lmini.mla.kv_cache_bytes_per_token` per cached token,
      ``min(num_steps, window)`` tokens -- growing with ``num_steps`` up to the window.

    Args:
        module: the layer's token mixer.
        num_steps: tokens seen so far, ``n >= 0``.
        batch_size: sequences decoded together (default 1).
        dtype: element type of the stored values (default: the module's parameters'; HF keeps
            the recurrent state in float32 on its torch path, the caches in the model's dtype).

    Returns:
        the size in bytes (an int).

    Raises:
        TypeError: a module of neither kind, or a ``dtype`` that is not a ``torch.dtype``;
        TypeError / ValueError: ``num_steps`` or ``batch_size`` not ints >= 0 / >= 1.
    """
    num_steps = check_nonnegative_int("num_steps", num_steps)
    batch_size = check_positive_int("batch_size", batch_size)
    check_instance("module", module, nn.Module, "an nn.Module")
    if dtype is None:
        dtype = next(module.parameters()).dtype
    check_instance("dtype", dtype, torch.dtype, "a torch.dtype")
    if isinstance(module, GatedDeltaNet):
        values = (module.num_v_heads * module.head_k_dim * module.head_v_dim
                  + module.conv_dim * (module.conv_kernel_size - 1))
        return batch_size * values * torch.empty((), dtype=dtype).element_size()
    if not isinstance(module, (MultiHeadAttention, GatedAttention, MultiHeadLatentAttention)):
        raise TypeError("module must be a GatedDeltaNet, MultiHeadAttention, GatedAttention or "
                        f"MultiHeadLatentAttention, got {type(module).__name__}")
    cached = num_steps if module.window is None else min(num_steps, module.window)
    return batch_size * cached * kv_cache_bytes_per_token(module, torch.empty((), dtype=dtype).element_size())
