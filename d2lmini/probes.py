"""Depth measurements at initialization: what a stack of fresh blocks does to a sequence.

Introduced in the chapter "Where the norm goes". One deterministic forward and
backward pass through ``depth`` freshly initialized blocks records, after every
block, how large the residual stream is, how different its tokens still are,
and how much gradient each block's weights receive.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, field

import torch
from torch import nn

from ._checks import check_choice, check_instance, check_int_at_least, check_int_in, check_positive_int, check_seed
from ._shown import shown_in
from .block import TransformerBlock
from .placements import PLACEMENT_TABLE
from .hyper import HyperConnectedBlock, HyperHead, expand_streams
from .norms import make_norm
from .seeding import seeded

#: Initializations accepted by :func:`probe_depth`: Xavier/Glorot uniform for every
#: linear weight (the 2017 Transformer's choice), or PyTorch's default ``nn.Linear`` init.
INITS = ("xavier_uniform", "torch_default")

#: Weight matrices whose gradient norms :func:`probe_depth` records, per block.
ATTENTION_WEIGHTS = ("W_q", "W_k", "W_v", "W_o")


@shown_in("ch02")
def token_spread(X: torch.Tensor) -> float:
    r"""How different the tokens of one sequence are: ``||X - mean_tokens(X)||_F / ||X||_F``.

    1 means the tokens have zero mean (no shared component); 0 means every
    token is the same vector ("rank collapse", Dong, Cordonnier & Loukas, 2021).

    Args:
        X: ``(num_steps, num_hiddens)`` or ``(1, num_steps, num_hiddens)``.

    Returns:
        A Python float in [0, 1].

    Raises:
        TypeError: if ``X`` is not a tensor.
        ValueError: if ``X`` is not one sequence of shape ``(n, d)`` or ``(1, n, d)``.
    """
    check_instance("X", X, torch.Tensor)
    if X.dim() == 3 and X.shape[0] == 1:
        X = X[0]
    if X.dim() != 2:
        raise ValueError(f"X must have shape (num_steps, num_hiddens) or "
                         f"(1, num_steps, num_hiddens), got {tuple(X.shape)}")
    X = X.double()
    return float((X - X.mean(dim=0, keepdim=True)).norm() / X.norm())


def stream_rms(X: torch.Tensor) -> float:
    """Root mean square of all entries of ``X``: ``sqrt(mean(X**2))``, as a Python float."""
    return float(X.double().pow(2).mean().sqrt())


@dataclass
class DepthProbe:
    """The measurements of one :func:`probe_depth` run.

    Attributes:
        config: the arguments of the run (placement, norm, depth, sizes, seed, ...).
        stream_rms: ``depth + 1`` floats; entry ``k`` is the RMS of the stream after
            block ``k`` (entry 0 is the input sequence).
        token_spread: ``depth + 1`` floats; entry ``k`` is :func:`token_spread` of the
            stream after block ``k``.
        grad_norms: weight name -> ``depth`` floats; entry ``k - 1`` is the Frobenius
            norm of the loss gradient with respect to that weight of block ``k``.
            Names: ``W_q``, ``W_k``, ``W_v``, ``W_o`` (attention) and ``W_1``, ``W_2``
            (FFN; plus ``W_g`` for gated activations).
    """

    config: dict
    stream_rms: list[float]
    _: KW_ONLY
    token_spread: list[float]
    grad_norms: dict[str, list[float]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The placement's name, or ``'sandwich_scaled'`` for a sandwich with a sublayer-norm gain."""
        placement = self.config["placement"]
        if placement == "sandwich" and self.config.get("sublayer_norm_gain") is not None:
            return "sandwich_scaled"
        return placement

    @property
    def depth(self) -> int:
        """Number of blocks in the probed stack."""
        return len(self.stream_rms) - 1

    def qk_vo_ratio(self, k: int) -> float:
        """Gradient ratio of block ``k``: ``sqrt(|g_Wq| |g_Wk|) / sqrt(|g_Wv| |g_Wo|)``.

        Near 1 when queries and keys are learning as fast as values and outputs;
        tiny when the attention pattern no longer depends on W_q and W_k.

        Raises:
            ValueError: if ``k`` is not in ``[1, depth]``.
        """
        check_int_in("k", k, 1, self.depth)
        g = {name: self.grad_norms[name][k - 1] for name in ATTENTION_WEIGHTS}
        return math.sqrt(g["W_q"] * g["W_k"]) / math.sqrt(g["W_v"] * g["W_o"])

    def at(self, k: int) -> dict:
        """All measurements at depth ``k`` (after block ``k``) as one flat dict.

        Raises:
            ValueError: if ``k`` is not in ``[1, depth]``.
        """
        check_int_in("k", k, 1, self.depth)
        row = {"placement": self.key, "norm": self.config["norm"], "k": k,
               "stream_rms": self.stream_rms[k], "token_spread": self.token_spread[k]}
        row.update({f"grad_{name}": values[k - 1] for name, values in self.grad_norms.items()})
        row["qk_vo_ratio"] = self.qk_vo_ratio(k)
        return row


def init_linear_weights_(module: nn.Module, init: str = "xavier_uniform") -> nn.Module:
    """Re-initialize every ``nn.Linear`` in ``module`` in place; biases become zero.

    Args:
        module: any module; its ``nn.Linear`` submodules are re-initialized.
        init: ``'xavier_uniform'`` (Glorot & Bengio 2010; U(-a, a) with
            ``a = sqrt(6 / (fan_in + fan_out))``) or ``'torch_default'`` (leave
            PyTorch's own initialization).

    Returns:
        ``module``, for chaining. Uses the global torch RNG: seed it first.

    Raises:
        ValueError: if ``init`` is not one of :data:`INITS`.
    """
    check_choice("init", init, INITS)
    if init == "xavier_uniform":
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                nn.init.xavier_uniform_(layer.weight)
                if layer.bias is not None:
                    nn.init.zeros_(layer.bias)
    return module


def probe_depth(placement: str = "pre", norm: str = "layer", depth: int = 32, num_hiddens: int = 128,
                num_heads: int = 4, num_steps: int = 64, act: str = "relu", init: str = "xavier_uniform",
                sublayer_norm_gain: float | None = None, residual: bool = True, seed: int = 0,
                dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                num_streams: int = 4) -> DepthProbe:
    r"""Push one random sequence through ``depth`` fresh blocks and measure every depth.

    The stack is ``depth`` blocks (:class:`~d2lmini.block.TransformerBlock`;
    bidirectional self-attention, no dropout, no biases: with ``init='xavier_uniform'``
    biases would start at zero, so leaving them out changes nothing; PyTorch's default
    draws them nonzero) with the given placement, norm and
    activation, every linear weight drawn by ``init``. The input is one sequence
    ``X_0`` of ``num_steps`` tokens with i.i.d. standard normal entries. After every
    block it records the stream RMS and the token spread. Then it backpropagates
    the scalar loss

    .. math:: \ell = \frac{1}{\sqrt{n d}} \sum_{i,j} Y_{ij} R_{ij},

    a fixed random linear read-out (``R`` standard normal) of the stack's output
    ``Y``: ``Y = X_L`` for ``'post'``, whose stream is already normalized, and
    ``Y = Norm(X_L)`` with one final norm for the other placements, as GPT-2-style
    models do. It records the gradient norm of every block's attention and FFN
    weights. Everything is drawn from ``seed``, so the same seed gives the same
    numbers; the global RNG state is restored afterwards.

    This is the experiment behind the post-LN/pre-LN comparison of Xiong et al.
    (2020) and the rank-collapse analysis of Dong, Cordonnier & Loukas (2021).

    ``placement='mhc'`` probes manifold-constrained hyper-connections instead (chapter
    "Beyond one residual stream"): ``depth`` :class:`~d2lmini.hyper.HyperConnectedBlock`
    with ``num_streams`` streams (RMSNorm only, so ``norm`` must be ``'rms'``), attention
    and FFN drawn by ``init`` as above, the mappings' projections as DeepSeek-V4 draws
    them. The stack starts with :func:`~d2lmini.hyper.expand_streams` (every stream a copy
    of ``X_0``) and ends as DeepSeek-V4's does: a :class:`~d2lmini.hyper.HyperHead`, then the
    final RMSNorm. The stream measurements take a token's whole state, its ``num_streams``
    streams (``num_streams d`` numbers), as its vector.

    Args:
        placement: ``'post'``, ``'pre'``, ``'post_sublayer'`` or ``'sandwich'``.
        norm: one of :data:`d2lmini.norms.NORMS`.
        depth: number of blocks ``L`` (>= 1).
        num_hiddens, num_heads, num_steps: model width ``d``, heads, sequence length ``n`` (>= 2).
        act: FFN activation (default ``'relu'``, as in 2017).
        init: one of :data:`INITS`.
        sublayer_norm_gain: initial gain of the sublayer-output norms
            (``'post_sublayer'``/``'sandwich'`` only), e.g. ``1/sqrt(depth)``.
        residual: ``False`` removes the skip connections (chapter "Residual connections").
        seed: seeds the weights, the input and the read-out.
        dtype: floating-point type of weights and activations (float64 shows values
            below float32's resolution; results are returned as Python floats).
        device: where the computation runs.
        num_streams: streams of ``'mhc'`` (ignored by the other placements).

    Returns:
        A :class:`DepthProbe` with ``depth + 1`` stream measurements and ``depth``
        gradient norms per weight.

    Raises:
        ValueError / TypeError: for any invalid argument (unknown names are listed
            with the allowed ones).
    """
    depth = check_positive_int("depth", depth)
    num_steps = check_int_at_least("num_steps", num_steps, 2, "token spread compares tokens")
    check_choice("init", init, INITS)
    seed = check_seed(seed)
    config = dict(placement=placement, norm=norm, depth=depth, num_hiddens=num_hiddens, num_heads=num_heads,
                  num_steps=num_steps, act=act, init=init, sublayer_norm_gain=sublayer_norm_gain,
                  residual=residual, seed=seed,
                  dtype=str(dtype).replace("torch.", ""))

    if placement == "mhc":
        check_choice("norm (mHC blocks use RMSNorm)", norm, ("rms",))
        config["num_streams"] = num_streams = check_positive_int("num_streams", num_streams)
    with seeded(seed):
        if placement == "mhc":
            blocks = nn.ModuleList(
                init_linear_weights_(HyperConnectedBlock(num_hiddens, num_heads, num_streams=num_streams, act=act), init)
                for _ in range(depth))
            final_norm = nn.Sequential(HyperHead(num_hiddens, num_streams), make_norm("rms", num_hiddens))
        else:
            blocks = nn.ModuleList(
                init_linear_weights_(
                    TransformerBlock(num_hiddens, num_heads, norm=norm, act=act, placement=placement,
                                     sublayer_norm_gain=sublayer_norm_gain, residual=residual), init)
                for _ in range(depth)
            )
            final_norm = make_norm(norm, num_hiddens) if PLACEMENT_TABLE[placement].final_norm else None
        X = torch.randn(1, num_steps, num_hiddens)
        R = torch.randn(1, num_steps, num_hiddens)
    blocks.to(device=device, dtype=dtype)
    if final_norm is not None:
        final_norm.to(device=device, dtype=dtype)
    X, R = X.to(device=device, dtype=dtype), R.to(device=device, dtype=dtype)
    if placement == "mhc":
        X = expand_streams(X, num_streams)  # (1, n, num_streams, d)

    rms, spread, grad_norms = measure_stack(blocks, final_norm, X, R)
    return DepthProbe(config=config, stream_rms=rms, token_spread=spread, grad_norms=grad_norms)


def probe_memory_bytes(depth: int = 32, num_hiddens: int = 128, num_heads: int = 4, num_steps: int = 64,
                       dtype: torch.dtype = torch.float32, num_streams: int = 1) -> int:
    """An estimate of the memory one :func:`probe_depth` call takes, in bytes, with a margin.

    Each block holds about ``12 d^2`` weights (attention ``4 d^2``, an FFN of width ``4 d``
    or SwiGLU's matched ``8d/3``) and as many gradients; the backward pass keeps about
    ``24 n d`` activations per block (``num_streams`` times that for hyper-connected blocks)
    and three ``heads x n x n`` attention maps. That count comes within a few percent of the
    measured peak at widths 512 to 1024; the estimate is 1.5 times it, for the allocator's
    overhead. The explorers refuse a configuration above their memory budget before building
    it, rather than let the kernel be killed.

    Args:
        depth, num_hiddens, num_heads, num_steps: as for :func:`probe_depth` (positive ints).
        dtype: the floating-point type of the probe.
        num_streams: streams of the hyper-connected stack (1 otherwise).

    Returns:
        The estimate, an int.

    Raises:
        ValueError / TypeError: for a size that is not a positive int, or ``dtype`` that is
            not a floating-point ``torch.dtype``.

    Introduced in the chapter "Where the norm goes".
    """
    depth, d, heads, n, streams = (check_positive_int(name, value) for name, value in (
        ("depth", depth), ("num_hiddens", num_hiddens), ("num_heads", num_heads), ("num_steps", num_steps),
        ("num_streams", num_streams)))
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    size = torch.empty((), dtype=dtype).element_size()
    per_block = 2 * 12 * d * d + 24 * n * d * streams + 3 * heads * n * n
    return 3 * size * depth * per_block // 2


@shown_in("ch04", "ch10")
def measure_stack(
    blocks: nn.ModuleList,
    final_norm: nn.Module | None,
    X: torch.Tensor,
    R: torch.Tensor,
):
    r"""The measurements of :func:`probe_depth`: one forward and one backward pass through ``blocks``.

    Records the stream RMS and :func:`token_spread` of the input ``X`` ``(1, n, d)`` (or the
    ``(1, n, S, d)`` streams of hyper-connected blocks, a token's ``S d`` numbers its vector) and
    after every block, then backpropagates the read-out loss
    :math:`\ell = \sum_{ij} Y_{ij} R_{ij} / \sqrt{nd}` of ``Y = final_norm(X_L)`` (``X_L``
    if ``final_norm`` is ``None``) and returns the gradient norm of every block's
    attention and FFN weights. Chapter "Where the norm goes" (Xiong et al., 2020).

    Returns:
        ``(stream_rms, token_spread, grad_norms)`` as in :class:`DepthProbe`.
    """
    rms, spread = [stream_rms(X)], [token_spread(X.flatten(2))]
    for block in blocks:
        X = block(X)
        rms.append(stream_rms(X.detach()))
        spread.append(token_spread(X.detach().flatten(2)))
    Y = X if final_norm is None else final_norm(X)
    loss = (Y * R).sum() / math.sqrt(Y.numel())
    loss.backward()
    grad_norms = {}  # weight name -> one Frobenius norm per block
    for name in ATTENTION_WEIGHTS + ("W_1", "W_g", "W_2"):  # W_g: gated FFNs only
        part = "attention" if name in ATTENTION_WEIGHTS else "ffn"
        layers = [getattr(getattr(block, part), name, None) for block in blocks]
        if layers[0] is not None:
            grad_norms[name] = [float(layer.weight.grad.norm()) for layer in layers]
    return rms, spread, grad_norms


#: The placements compared in the chapter "Where the norm goes", in the order shown.
PROBED_PLACEMENTS = ("post", "pre", "post_sublayer", "sandwich", "sandwich_scaled")
#: What :func:`probe_depth` also takes: ``'mhc'``, the hyper-connected stack of the chapter
#: "Beyond one residual stream".
HYPER_PLACEMENT = "mhc"


