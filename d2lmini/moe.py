"""Mixture-of-experts feed-forward sublayer, a drop-in for :class:`~d2lmini.block.TransformerBlock`'s ``ffn_factory``."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import (check_bool, check_callable, check_choice, check_last_dim, check_nonnegative_int,
                      check_positive_float, check_positive_int)
from ._shown import shown_in
from .ffn import ACTS, FeedForward
from .parameters import num_parameters


#: Routers accepted by :class:`MixtureOfExperts`.
ROUTERS = ("softmax", "sigmoid", "sigmoid_input", "sqrtsoftplus")


class MixtureOfExperts(nn.Module):
    r"""A sparse mixture-of-experts FFN: each token is sent to ``top_k`` of ``num_experts`` FFNs.

    A linear router scores every expert for every token; the token goes to the
    ``top_k`` best-scoring experts (:class:`~d2lmini.ffn.FeedForward` modules), whose
    outputs are added with weights that sum to ``route_scale``:

    .. math:: \mathrm{MoE}(x) = S(x) + \sum_{e \in \mathrm{top}_k(x)} w_e(x)\, E_e(x)

    where ``S`` is an optional always-on shared expert. The weights come from the
    router scores ``s = router(x)``: ``'softmax'`` takes ``softmax(s)`` (Shazeer et
    al., 2017's top-k gating: the selected probabilities renormalized to sum to 1);
    ``'sigmoid'`` takes ``sigmoid(s)``, selects with ``sigmoid(s) + expert_bias`` and
    renormalizes the selected scores (DeepSeek-V3 and Arcee Trinity's routing;
    ``expert_bias`` is a buffer a load balancer adjusts outside gradient descent,
    zero by default). The softmax router's weights equal a softmax over the ``top_k``
    selected logits alone, which is how OpenAI gpt-oss computes them (Hugging Face
    ``GptOssTopKRouter``: top-k of the logits, then a softmax over those k); gpt-oss's
    router also has a bias (``router_bias=True``) and its experts clamped SwiGLU FFNs
    with biases (``expert=``, ``bias=True``). Each token runs through
    only ``top_k`` experts, so the parameters grow with ``num_experts`` while the
    computation per token grows with ``top_k``. With ``num_groups > 1`` the routing is
    *group-limited*, as in DeepSeek-V3 (Hugging Face ``DeepseekV3TopkRouter``: ``n_group``,
    ``topk_group``): the experts form ``num_groups`` equal groups, each group is scored by
    the sum of its two best selection scores (``sigmoid(s) + expert_bias``, or the softmax
    probabilities), and the ``top_k`` experts are chosen only within the ``topk_groups``
    best groups (in DeepSeek-V3 a token's 8 experts come from 4 of 8 groups, so from at
    most 4 groups of devices). ``'sigmoid_input'`` is Llama 4's router (Hugging Face
    ``transformers`` 5.24, ``Llama4Router`` and ``Llama4TextMoe``): the ``top_k`` largest
    logits (Llama 4: one) select the experts, and each chosen expert's weight
    ``sigmoid(s_e)``, *not* renormalized, multiplies the expert's *input*,
    ``MoE(x) = S(x) + sum_e E_e(w_e(x) x)`` (an expert is not linear, so this differs from
    weighting its output); with ``route_scale`` ``r`` the weights are ``r sigmoid(s_e)``.
    ``'sqrtsoftplus'`` is DeepSeek-V4's (Hugging Face ``transformers`` 5.24,
    ``DeepseekV4TopKRouter``): ``'sigmoid'``'s routing with the scores
    ``sqrt(softplus(s))`` instead of ``sigmoid(s)`` (selected with ``+ expert_bias``,
    renormalized, times ``route_scale``). Drop it into a block with
    ``TransformerBlock(d, h, ffn_factory=lambda: MixtureOfExperts(d))``.

    Args:
        num_hiddens: model width ``d``.
        num_experts: routed experts ``E`` (>= 1).
        top_k: experts per token, ``1 <= top_k <= num_experts``.
        ffn_num_hiddens: hidden width of each expert (default: FeedForward's default
            for ``act``).
        act: the experts' activation, one of :data:`~d2lmini.ffn.ACTS`.
        router: ``'softmax'``, ``'sigmoid'``, ``'sigmoid_input'`` or ``'sqrtsoftplus'`` (see above).
        num_shared_experts: shared experts, fused into one always-on FFN of width
            ``num_shared_experts * ffn_num_hiddens`` (0: none).
        route_scale: factor on the routed experts' weights (Trinity's ``route_scale``).
        bias: whether the experts' linear layers have biases.
        router_bias: whether the router has a bias, ``router(x) = W x + b`` (gpt-oss); default
            ``False`` (Mixtral, DeepSeek, Qwen3-MoE, Trinity).
        expert: ``None`` (default: :class:`~d2lmini.ffn.FeedForward`) or a callable
            ``expert(num_hiddens, ffn_num_hiddens, act=act, bias=bias)`` returning each expert (and
            the shared expert, with its width): a subclass of FeedForward such as the clamped
            SwiGLU of gpt-oss and DeepSeek-V4 (:class:`d2lmini.reference.gpt_oss.ClampedSwiGLU`).
        num_groups: expert groups for group-limited routing; must divide ``num_experts``
            (default 1: no groups, every expert can be chosen).
        topk_groups: how many groups a token's experts may come from, ``1 <= topk_groups <=
            num_groups``, with ``top_k <= topk_groups * num_experts / num_groups`` (default
            ``None``: ``num_groups``, no limit).
        shared_expert_gate: whether the shared expert's output is scaled per token by
            ``sigmoid(w^T x)``, a learned gate ``nn.Linear(d, 1, bias=False)`` on the input:
            ``S(x) = sigmoid(w^T x) FFN(x)`` (Qwen2-MoE, Qwen3-Next, Qwen3.5; Hugging Face
            ``Qwen3_5MoeSparseMoeBlock.shared_expert_gate``). Needs ``num_shared_experts >= 1``;
            default ``False``: the shared expert is added ungated.

    Attributes:
        router: ``nn.Linear(d, E, bias=router_bias)``; experts: ``nn.ModuleList`` of ``E``
        FeedForwards; shared: the shared FFN or ``None``; shared_expert_gate: the shared
        expert's gate ``nn.Linear(d, 1, bias=False)`` or ``None``; expert_bias: buffer ``(E,)``.

    Shape:
        input ``(*, d)``, output the same shape.

    Raises:
        ValueError / TypeError: for sizes out of range, ``top_k > num_experts``, groups that
            do not divide the experts or cannot supply ``top_k`` of them, an
            unknown ``router`` or ``act``, an ``expert`` that is not callable, a
            ``shared_expert_gate`` that is not a bool or has no shared expert to gate; at call
            time an input whose last dimension is not ``d``.

    Introduced in the chapter "The feed-forward network".
    """

    def __init__(self, num_hiddens: int, num_experts: int = 8, *, top_k: int = 2, ffn_num_hiddens: int | None = None,
                 act: str = "swiglu", router: str = "softmax", num_shared_experts: int = 0,
                 route_scale: float = 1.0, bias: bool = False, router_bias: bool = False,
                 expert: Callable[..., nn.Module] | None = None, num_groups: int = 1, topk_groups: int | None = None,
                 shared_expert_gate: bool = False):
        super().__init__()
        self.num_hiddens = check_positive_int("num_hiddens", num_hiddens)
        self.num_experts = check_positive_int("num_experts", num_experts)
        self.top_k = check_positive_int("top_k", top_k)
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k must be <= num_experts={num_experts}, got top_k={top_k}")
        check_choice("act", act, ACTS)
        self.router_kind = check_choice("router", router, ROUTERS)
        self.num_shared_experts = check_nonnegative_int("num_shared_experts", num_shared_experts)
        self.route_scale = check_positive_float("route_scale", route_scale)
        check_bool("bias", bias)
        self.router = nn.Linear(num_hiddens, num_experts, bias=check_bool("router_bias", router_bias))
        make = FeedForward if expert is None else check_callable("expert", expert)
        self.experts = nn.ModuleList(make(num_hiddens, ffn_num_hiddens, act=act, bias=bias) for _ in range(num_experts))
        width = self.experts[0].ffn_num_hiddens
        self.act = self.experts[0].act  # as the experts name it (a clamped SwiGLU's name, say)
        self.shared = make(num_hiddens, width * num_shared_experts, act=act, bias=bias) if num_shared_experts else None
        if check_bool("shared_expert_gate", shared_expert_gate) and self.shared is None:
            raise ValueError("shared_expert_gate=True needs num_shared_experts >= 1, got num_shared_experts=0")
        self.shared_expert_gate = nn.Linear(num_hiddens, 1, bias=False) if shared_expert_gate else None
        self.register_buffer("expert_bias", torch.zeros(num_experts))
        self.num_groups = check_positive_int("num_groups", num_groups)
        if self.num_experts % self.num_groups:
            raise ValueError(f"num_groups must divide num_experts={num_experts}, got num_groups={num_groups}")
        self.topk_groups = self.num_groups if topk_groups is None else check_positive_int("topk_groups", topk_groups)
        if self.topk_groups > self.num_groups:
            raise ValueError(f"topk_groups must be <= num_groups={num_groups}, got topk_groups={topk_groups}")
        if self.top_k > self.topk_groups * (self.num_experts // self.num_groups):
            raise ValueError(f"top_k={top_k} experts cannot come from topk_groups={self.topk_groups} groups of "
                             f"{self.num_experts // self.num_groups} experts")

    def route(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Choose experts for every token of ``X`` ``(T, d)``.

        Returns:
            ``(weights, experts)``, both ``(T, top_k)``: the mixing weights (float32,
            summing to ``route_scale`` per token; ``'sigmoid_input'``: ``route_scale`` times
            the sigmoid of each chosen logit, not renormalized) and the chosen expert indices.
        """
        scores = self.router_scores(X)
        choice = scores + self.expert_bias.float()
        if self.topk_groups < self.num_groups:  # group-limited routing (DeepSeek-V3)
            grouped = choice.view(-1, self.num_groups, self.num_experts // self.num_groups)
            group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
            best = group_scores.topk(self.topk_groups, dim=-1).indices
            allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
            choice = choice.masked_fill(~allowed.repeat_interleave(grouped.shape[-1], dim=-1), float("-inf"))
        _, experts = torch.topk(choice, self.top_k, dim=-1)
        return self.mix_weights(scores, experts), experts

    def router_scores(self, X: torch.Tensor) -> torch.Tensor:
        """The router's score of every expert for every token of ``X`` ``(T, d)``: ``(T, num_experts)``, float32.

        The logits ``router(X)`` in float32 (routing decisions are made in float32, as the models
        do), then softmax (``'softmax'``), ``sqrt(softplus)`` (``'sqrtsoftplus'``, DeepSeek-V4) or
        the sigmoid (``'sigmoid'``, ``'sigmoid_input'``). The one scoring of every router here:
        :meth:`route` and DeepSeek-V4's hash-routed layers (:class:`~d2lmini.deepseek_v4.HashRoutedMoE`) use it.
        """
        logits = self.router(X).float()  # routing decisions in float32, as the models do
        if self.router_kind == "softmax":
            return logits.softmax(dim=-1)
        if self.router_kind == "sqrtsoftplus":  # DeepSeek-V4
            return F.softplus(logits).sqrt()
        return torch.sigmoid(logits)

    def mix_weights(self, scores: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """The mixing weights ``(T, top_k)`` of the chosen ``experts`` ``(T, top_k)`` from ``scores`` ``(T, num_experts)``.

        The chosen scores, normalized to sum to ``route_scale`` per token; ``'sigmoid_input'``
        (Llama 4): ``route_scale`` times the chosen sigmoids, not renormalized.
        """
        weights = scores.gather(-1, experts)
        if self.router_kind == "sigmoid_input":  # Llama 4: the sigmoids themselves
            return weights * self.route_scale
        return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * self.route_scale

    @shown_in("ch07")
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Mix the chosen experts' outputs for every position of ``X`` (*, d); returns (*, d).

        (With ``router='sigmoid_input'``, each chosen expert reads its weight times ``X``.)"""
        check_last_dim("X", X, self.num_hiddens)
        tokens = X.reshape(-1, self.num_hiddens)
        weights, experts = self.route(tokens)
        return self.combine(tokens, weights, experts).reshape(X.shape)

    def combine(self, tokens: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Run each token of ``tokens`` ``(T, d)`` through its ``experts`` ``(T, top_k)`` (indices), weighted by
        ``weights`` ``(T, top_k)``, and add the shared expert; returns ``(T, d)``. (What :meth:`forward` does after
        :meth:`route`; a router of another kind, e.g. DeepSeek-V4's hash routing, reuses it.)"""
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token_idx, slot = torch.where(experts == e)
            if token_idx.numel():  # each expert sees only the tokens routed to it
                w = weights[token_idx, slot, None].to(tokens.dtype)
                if self.router_kind == "sigmoid_input":  # Llama 4: the weight scales the expert's input
                    y = expert(tokens[token_idx] * w)
                else:
                    y = expert(tokens[token_idx]) * w
                out = out.index_add(0, token_idx, y)
        if self.shared is not None:
            shared = self.shared(tokens)
            if self.shared_expert_gate is not None:  # Qwen2-MoE, Qwen3-Next, Qwen3.5: a sigmoid gate per token
                shared = torch.sigmoid(self.shared_expert_gate(tokens)) * shared
            out = out + shared
        return out

    def num_active_parameters(self) -> int:
        """Parameters one token uses: router, shared expert and ``top_k`` routed experts."""
        shared = 0 if self.shared is None else num_parameters(self.shared)
        if self.shared_expert_gate is not None:
            shared += num_parameters(self.shared_expert_gate)
        return num_parameters(self.router) + shared + self.top_k * num_parameters(self.experts[0])

    def extra_repr(self) -> str:
        groups = (f", num_groups={self.num_groups}, topk_groups={self.topk_groups}"
                  if self.topk_groups < self.num_groups else "")
        return (f"num_experts={self.num_experts}, top_k={self.top_k}, router={self.router_kind!r}, "
                f"num_shared_experts={self.num_shared_experts}{groups}"
                + (", shared_expert_gate=True" if self.shared_expert_gate is not None else ""))
