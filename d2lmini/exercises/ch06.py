"""Self-checks of chapter 6's exercises (QK-norm: the same discipline inside attention).

Every expected value is computed here, with the package, from the settings the exercise names.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from . import Exercise


def _rotated_logits(adjacent: bool = False, second=(1, 3)) -> dict:
    """6.1: the chapter's query and key (seed 0) at positions (3, 1) and (1, 3) (``adjacent``: with the pairs
    (2i, 2i + 1) of Su et al.'s layout instead of ``rotate``'s (i, i + d/2); ``second``: another pair of
    positions in place of (1, 3), such as the printed (3, 2); wrong answers hints aim at)."""
    from ..attention import apply_rotary, rotary_cos_sin

    torch.manual_seed(0)
    q, k = torch.randn(1, 16), torch.randn(1, 16)
    cos, sin = rotary_cos_sin(4, 16, 10000.0)

    def turn(x, p):  # adjacent pairs: pair i is features (2i, 2i + 1), angle p * 10000^(-2i/16)
        angle = p * 10000.0 ** (-torch.arange(8) * 2 / 16)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * angle.cos() - odd * angle.sin(), even * angle.sin() + odd * angle.cos()), -1)

    def logit(m, n):  # q at position m, k at position n
        if adjacent:
            return float((turn(q, m) * turn(k, n)).sum())
        rotated_q = apply_rotary(q[None, None], cos[m:m + 1], sin[m:m + 1])
        rotated_k = apply_rotary(k[None, None], cos[n:n + 1], sin[n:n + 1])
        return float((rotated_q * rotated_k).sum())

    return {"logit_3_1": logit(3, 1), "logit_1_3": logit(*second)}


def _unrotated_logit() -> float:
    """6.1: the chapter's query and key (seed 0) multiplied without a rotation, both at position 0 (a wrong
    answer's)."""
    return _rotated_logits(second=(0, 0))["logit_1_3"]


def _per_head_entropy() -> float:
    """The chapter's per-head QK-norm entropy at s = 64 (a wrong answer to 6.2)."""
    from ..chapters.ch06_qk_norm import logit_scale_sweep

    return logit_scale_sweep(qk_norms=("per_head",)).at(64.0, "per_head")["entropy"]


def _variant_entropies() -> dict:
    """6.2: the attention entropy at s = 64 of the two other QK-norm variants."""
    from ..chapters.ch06_qk_norm import logit_scale_sweep

    sweep = logit_scale_sweep(qk_norms=(None, "projection", "per_head_distinct"))
    return {name: sweep.at(64.0, name)["entropy"] for name in ("projection", "per_head_distinct")}


# ------------------------------------------------------------------ 6.3: the norm before or after RoPE


def _causal_output(attention, q, k, X, causal: bool = True):
    """The output of d2lmini's ``attention`` on ``X`` from given (rotated, normalized) queries and keys
    (``causal=False``: without the mask, a wrong answer's)."""
    v = attention.W_v(X).unflatten(-1, (attention.num_heads, attention.head_dim)).transpose(1, 2)
    n = X.shape[1]
    logits = q @ k.transpose(-1, -2) / attention.head_dim ** 0.5
    if causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return attention.W_o((torch.softmax(logits, dim=-1) @ v).transpose(1, 2).flatten(-2))


class _SwitchAttention(nn.Module):
    """The chapter's attention with a ``norm_after_rope`` switch, done wrong in one of two ways.

    ``mistake="ignore"``: the switch changes nothing; ``"keys"``: after RoPE only the queries are normalized;
    ``"gainless"``: after RoPE both are normalized without their gains (as Llama 4's norm, which has none);
    ``"unmasked"``: the after-RoPE path drops the causal mask.
    """

    def __init__(self, num_hiddens, num_heads, qk_norm=True, theta=10000.0, norm_after_rope=False, mistake="ignore"):
        super().__init__()
        self.num_heads, self.head_dim, self.theta = num_heads, num_hiddens // num_heads, theta
        self.norm_after_rope, self.mistake = norm_after_rope, mistake
        for name in ("W_q", "W_k", "W_v", "W_o"):
            setattr(self, name, nn.Linear(num_hiddens, num_hiddens, bias=False))
        self.q_norm, self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6), nn.RMSNorm(self.head_dim, eps=1e-6)

    def forward(self, X):
        from ..attention import apply_rotary, rotary_cos_sin

        b, n, _ = X.shape
        q, k, v = (W(X).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
                   for W in (self.W_q, self.W_k, self.W_v))
        after = self.norm_after_rope and self.mistake != "ignore"
        if not after:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rotary_cos_sin(n, self.head_dim, self.theta)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if after and self.mistake == "gainless":
            q, k = (nn.functional.rms_norm(t, (self.head_dim,), eps=1e-6) for t in (q, k))
        elif after:
            q = self.q_norm(q)
            k = k if self.mistake == "keys" else self.k_norm(k)
        logits = q @ k.transpose(-1, -2) / self.head_dim ** 0.5
        if not (after and self.mistake == "unmasked"):
            logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return self.W_o((torch.softmax(logits, dim=-1) @ v).transpose(1, 2).reshape(b, n, -1))


def _judge_norm_switch(answer) -> str | None:
    """6.3: build the reader's class both ways, with random gains, and compare it with d2lmini's two orders."""
    from ..attention import MultiHeadAttention
    from ..chapters.ch06_qk_norm import queries_and_keys_after_rope
    from ..parameters import copy_parameters

    if isinstance(answer, nn.Module):
        return "hand in the class itself, MyAttention, not a module built from it: the check builds it both ways"
    if not callable(answer):
        raise ValueError(f"exercise 6.3: hand in your attention class (MyAttention with a norm_after_rope "
                         f"switch), got {type(answer).__name__}")
    generator = torch.Generator().manual_seed(6)
    X = torch.randn(2, 12, 64, generator=generator)
    ref = MultiHeadAttention(64, 4, qk_norm="per_head", rope_theta=10000.0, causal=True)
    with torch.no_grad():
        for norm in (ref.q_norm, ref.k_norm):
            norm.weight.copy_(1 + 0.5 * torch.randn(norm.weight.shape, generator=generator))
        before = ref(X, X, X)
        after = _causal_output(ref, *queries_and_keys_after_rope(ref, X, X), X)
        after_unmasked = _causal_output(ref, *queries_and_keys_after_rope(ref, X, X), X, causal=False)
        gains = [norm.weight.clone() for norm in (ref.q_norm, ref.k_norm)]
        for norm in (ref.q_norm, ref.k_norm):
            norm.weight.fill_(1.0)
        after_without_gains = _causal_output(ref, *queries_and_keys_after_rope(ref, X, X), X)
        for norm, gain in zip((ref.q_norm, ref.k_norm), gains):
            norm.weight.copy_(gain)
    outputs = {}
    for flag in (False, True):
        try:
            mine = copy_parameters(ref, answer(64, 4, norm_after_rope=flag))
            with torch.no_grad():
                outputs[flag] = mine(X)
        except Exception as error:  # the reader's class failed: say how
            return (f"building or running YourClass(64, 4, norm_after_rope={flag}) raised "
                    f"{type(error).__name__}: {error}. Keep MyAttention's arguments and layer names "
                    f"(W_q, W_k, W_v, W_o, q_norm, k_norm) and add norm_after_rope as a keyword argument")
    close = functools.partial(torch.allclose, rtol=1e-4, atol=1e-5)
    eps = [getattr(getattr(mine, name, None), "eps", None) for name in ("q_norm", "k_norm")]
    if any(isinstance(e, float) and e != 1e-6 for e in eps) and not close(outputs[False], before):
        return f"q_norm and k_norm use eps=1e-6, as the chapter's (yours: {eps[0]}, {eps[1]})"
    if outputs[False].shape != before.shape or not close(outputs[False], before):
        return "with norm_after_rope=False the class should still compute the chapter's attention (norm, then RoPE)"
    if close(outputs[True], before):
        return "with norm_after_rope=True the output did not change: apply the norms after the rotation"
    if not close(outputs[True], after) and close(outputs[True], after_unmasked):
        return "with norm_after_rope=True your path attends to later tokens: keep the causal mask there too"
    if not close(outputs[True], after) and close(outputs[True], after_without_gains):
        return ("with norm_after_rope=True your norms have no gains: apply q_norm and k_norm themselves, whose "
                "gains the check makes random")
    if not close(outputs[True], after):
        return ("with norm_after_rope=True, rotate the queries and keys first, then apply both q_norm and "
                "k_norm over each head's features, and only after the rotation")
    return None


# ------------------------------------------------------------------ 6.4 and 6.5: training at lr = 1e-2


@functools.lru_cache(maxsize=1)
def _middle_rate_runs():
    """Both models of exercises 6.4 and 6.5, trained once per process."""
    from ..chapters.ch06_qk_norm import qk_norm_training
    from ..data import python_reference_corpus

    return qk_norm_training(python_reference_corpus(), lr=1e-2, seed=2, num_layers=2, num_steps=200,
                            batch_size=32, seq_len=64)


def _middle_rate(train: bool = False) -> dict:
    """6.4: the largest logit without QK-norm, and how much QK-norm lowers the validation loss (``train``:
    the last training losses instead, the wrong answer a hint aims at)."""
    runs = _middle_rate_runs()
    loss = (lambda run: run.train_loss[-1]) if train else (lambda run: run.val_loss)
    return {"peak_logit": max(runs[None].max_logit), "loss_gap": loss(runs[None]) - loss(runs["per_head"])}


def _logit_bound(layer: int = -1, pairing: str = "max_each") -> dict:
    """6.5: the bound sqrt(d_h) max|gamma_q| max|gamma_k| of the last layer and that layer's last largest logit.

    ``layer`` (0: the first), ``pairing="max_product"`` (the largest |gamma_q,i gamma_k,i| of one
    feature) and ``"rope_pairs"`` (the largest over RoPE's pairs) give the wrong answers the hints aim at."""
    run = _middle_rate_runs()["per_head"]
    start = 32 * (layer % (len(run.qk_gains) // 32))  # 32 gains a layer
    gains = run.qk_gains[start:start + 32]  # one layer: 16 query gains, then 16 key gains
    if pairing == "max_product":
        largest = max(abs(q * k) for q, k in zip(gains[:16], gains[16:]))
    elif pairing == "rope_pairs":  # RoPE rotates feature i with i + 8 only
        pair = lambda g, i: max(abs(g[i]), abs(g[i + 8]))  # noqa: E731
        largest = max(pair(gains[:16], i) * pair(gains[16:], i) for i in range(8))
    else:
        largest = max(abs(g) for g in gains[:16]) * max(abs(g) for g in gains[16:])
    return {"bound": math.sqrt(16) * largest, "logit": run.max_logit_per_layer[-1][-1]}


def _cap_derivative(z: torch.Tensor, c: float) -> torch.Tensor:
    """6.6: d/dz of c * tanh(z / c)."""
    return 1 - torch.tanh(z / c) ** 2


EXERCISES = [
    Exercise("6.1", "(logit_3_1, logit_1_3): the two logits", kind="numbers", expected=_rotated_logits,
             names=("logit_3_1", "logit_1_3"), rel=1e-3, abs=1e-4,
             order="these are the right numbers in the other order: hand in (logit_3_1, logit_1_3), or, if that "
                   "is their order, your rotation runs backwards (R_{m-n} for R_{n-m}) or q and k sit at each "
                   "other's positions",
             hints=[(lambda a, e: all(abs(v - _unrotated_logit()) < 1e-3 for v in a.values()),
                     "both are q . k unrotated: rotate q and k to their positions first, "
                     "rotate(q, torch.tensor([m])) and rotate(k, torch.tensor([n]))"),
                    (lambda a, e: abs(a["logit_3_1"] - a["logit_1_3"]) < 1e-3,
                     "your two logits are equal: put q at position 3 and k at 1, then q at 1 and k at 3"),
                    (lambda a, e: all(abs(a[k] + e[k]) < 1e-3 * abs(e[k]) + 1e-4 for k in e),
                     "both signs are flipped: q or k entered with its sign flipped; check the rotation's formula, "
                     "x cos + rotate_half(x) sin with rotate_half(x) = (-x2, x1)"),
                    (lambda a, e: abs(a["logit_3_1"] + a["logit_1_3"]) < 1e-3,
                     "the second logit is not the first with its sign flipped: recompute it with rotate"),
                    (lambda a, e: all(abs(a[k] - e[k]) < 0.01 * abs(e[k]) for k in e),
                     "close, but rounded: hand in the logits as computed (four digits or more)"),
                    (lambda a, e: all(abs(a[k] - e[k] / 4) < 0.01 * abs(e[k] / 4) for k in e),
                     "logit(m, n) in rotate's check is the dot product of the rotated q and k, without the "
                     "division by sqrt(d_h) = 4"),
                    (lambda a, e: all(abs(a[k] - v) < 1e-3 * abs(v) + 1e-4 for k, v in _rotated_logits(True).items()),
                     "those pair adjacent features (2i, 2i + 1); the chapter's rotate pairs feature i with "
                     "i + d_h/2: use rotate"),
                    (lambda a, e: any(abs(a["logit_1_3"] - _rotated_logits(second=pair)["logit_1_3"]) < 1e-3
                                      for pair in ((3, 2), (8, 6))),
                     "logit_1_3: that is one of the other printed logits, (3, 2) or (8, 6); compute logit(1, 3), "
                     "q at position 1 and k at position 3"),
                    (lambda a, e: True,
                     "take q and k as rotate's check draws them, right after torch.manual_seed(0): "
                     "q = torch.randn(1, 16), then k = torch.randn(1, 16)")],
             wrong=[lambda e: {k: v / 4 for k, v in e.items()}, lambda e: {**e, "logit_1_3": e["logit_3_1"]},
                    lambda e: {**e, "logit_1_3": -e["logit_3_1"]},
                    lambda e: {k: round(v, 2) for k, v in e.items()},
                    lambda e: {"logit_3_1": e["logit_1_3"], "logit_1_3": e["logit_3_1"]},
                    lambda e: _rotated_logits(adjacent=True)]),
    Exercise("6.2", "(projection, per_head_distinct): the two variants' entropies at s = 64, in nats",
             kind="numbers", expected=_variant_entropies, names=("projection", "per_head_distinct"), rel=1e-3,
             hints=[(lambda a, e: max(abs(v - math.log(64)) for v in a.values()) < 0.01,
                     "log 64 is the entropy of uniform attention, not what the variants measure at s = 64"),
                    (lambda a, e: all(abs(a[k] * math.log(64) - e[k]) < 0.01 for k in e),
                     "in nats, as sweep.at(64.0, name)[\"entropy\"] gives it, not as a fraction of log 64"),
                    (lambda a, e: all(abs(a[k] * math.log(2) - e[k]) < 0.01 for k in e),
                     "in nats, not bits"),
                    (lambda a, e: min(a.values()) < 0.1,
                     "an entropy near 0 is the layer without QK-norm: read the variants' rows"),
                    (lambda a, e: any(abs(v - _per_head_entropy()) < 5e-3 and abs(v - e[k]) > 5e-3
                                      for k, v in a.items()),
                     "that is the per-head variant's entropy, the chapter's; read sweep.at(64.0, name) with "
                     "name \"projection\" and \"per_head_distinct\""),
                    (lambda a, e: abs(a["projection"] - a["per_head_distinct"]) < 1e-4,
                     "the two variants' entropies differ: read each one's own, sweep.at(64.0, name)[\"entropy\"]")],
             wrong=[lambda e: {**e, "projection": e["per_head_distinct"]},
                    lambda e: {"projection": e["per_head_distinct"], "per_head_distinct": e["projection"]},
                    lambda e: {name: math.log(64) for name in e}, lambda e: {name: 4.16 for name in e},
                    lambda e: {**e, "per_head_distinct": 0.00236}, lambda e: {**e, "projection": _per_head_entropy()},
                    lambda e: {k: v / math.log(64) for k, v in e.items()}]),
    Exercise("6.3", "your attention class: MyAttention with a norm_after_rope switch", kind="custom",
             judge=_judge_norm_switch,
             wrong=[lambda: functools.partial(_SwitchAttention, mistake="ignore"),
                    lambda: functools.partial(_SwitchAttention, mistake="keys"),
                    lambda: functools.partial(_SwitchAttention, mistake="gainless"),
                    lambda: functools.partial(_SwitchAttention, mistake="unmasked")]),
    Exercise("6.4", "(peak_logit, loss_gap): the largest logit without QK-norm, and the validation loss "
             "without QK-norm minus with it", kind="numbers", expected=_middle_rate,
             names=("peak_logit", "loss_gap"), rel=0.01, abs=2e-3, slow=True,
             hints=[(lambda a, e: abs(a["peak_logit"] - max(_middle_rate_runs()["per_head"].max_logit)) < 0.01
                     and a["loss_gap"] < 0 < e["loss_gap"],
                     "you read the QK-norm model as the model without it: the one without is runs[None]"),
                    (lambda a, e: a["loss_gap"] < 0 < e["loss_gap"],
                     "subtract the QK-norm model's validation loss from the other's, not the reverse"),
                    (lambda a, e: abs(a["peak_logit"] - max(_middle_rate_runs()["per_head"].max_logit)) < 0.01,
                     "peak_logit: the model without QK-norm, runs[None]"),
                    (lambda a, e: abs(a["loss_gap"] - _middle_rate(train=True)["loss_gap"]) < 0.005,
                     "loss_gap: the validation losses, run.val_loss of each model, not their last training "
                     "losses"),
                    (lambda a, e: a["peak_logit"] > 2 * e["peak_logit"],
                     "the recorded logits are already divided by sqrt(d_h): take max(run.max_logit)"),
                    (lambda a, e: abs(a["peak_logit"] - _middle_rate_runs()[None].max_logit[-1]) < 0.01
                     < abs(e["peak_logit"] - _middle_rate_runs()[None].max_logit[-1]),
                     "peak_logit: that is the last step's; the peak is the largest over all steps, "
                     "max(run.max_logit)")],
             hint="Train with exactly the settings named (lr=1e-2, seed=2 and the chapter's model and run); "
                  "the peak is the largest entry of max_logit over all steps.",
             wrong=[lambda e: {**e, "loss_gap": -e["loss_gap"]},
                    lambda e: {**e, "peak_logit": 4 * e["peak_logit"]},
                    lambda e: {**e, "loss_gap": _middle_rate(train=True)["loss_gap"]},
                    lambda e: {**e, "peak_logit": max(_middle_rate_runs()["per_head"].max_logit)},
                    lambda e: {"peak_logit": max(_middle_rate_runs()["per_head"].max_logit),
                               "loss_gap": -e["loss_gap"]},
                    lambda e: {**e, "peak_logit": _middle_rate_runs()[None].max_logit[-1]}]),
    Exercise("6.5", "(bound, logit): the last layer's bound and its largest logit at the last step",
             kind="numbers", expected=_logit_bound, names=("bound", "logit"), rel={"bound": 0.02, "logit": 0.05},
             slow=True,
             hints=[(lambda a, e: abs(a["bound"] - 4) < 1e-3,
                     "4 is the bound with every gain at 1, as at initialization: take the trained gains of the "
                     "last layer, qk_gains[-32:]"),
                    (lambda a, e: abs(a["bound"] - e["bound"] / 4) < 0.1 * e["bound"],
                     "the bound has a factor sqrt(d_h) = 4: a normalized query or key has length sqrt(d_h)"),
                    (lambda a, e: abs(a["bound"] - 2 * e["bound"]) < 0.04 * e["bound"],
                     "the factor is sqrt(d_h) = 4, of one head's 16 features, not sqrt(d) = 8"),
                    (lambda a, e: abs(a["bound"] - 4 * e["bound"]) < 0.4 * e["bound"],
                     "the factor is sqrt(d_h), not d_h: two lengths sqrt(d_h), divided by sqrt(d_h)"),
                    (lambda a, e: abs(a["bound"] - _logit_bound(layer=0)["bound"]) < 0.01 * e["bound"],
                     "that is the first layer's bound: the last layer's gains are qk_gains[-32:]"),
                    (lambda a, e: abs(a["bound"] - _logit_bound(pairing="rope_pairs")["bound"]) < 0.01 * e["bound"],
                     "that is the most a logit can reach within RoPE's pairs; the bound asked for takes the "
                     "largest gain of each kind over all 16"),
                    (lambda a, e: abs(a["bound"] - _logit_bound(pairing="max_product")["bound"]) < 0.01 * e["bound"],
                     "the largest |gamma_q| times the largest |gamma_k|, each over its 16 gains: RoPE rotates "
                     "between the norm and the dot product, pairing query feature i with key features i and "
                     "i +- d_h/2, so the largest gains need not meet on one feature"),
                    (lambda a, e: abs(a["logit"] - _middle_rate_runs()[None].max_logit_per_layer[-1][-1])
                     < 0.01 * a["logit"],
                     "logit: that is the model without QK-norm, which has no bound; take the QK-norm model's"),
                    (lambda a, e: abs(a["logit"] - _middle_rate_runs()["per_head"].max_logit_per_layer[0][-1])
                     < 0.01 * a["logit"],
                     "logit: that is the last layer's largest logit at the first step; max_logit_per_layer "
                     "holds one list per step, so the last step's is max_logit_per_layer[-1][-1]"),
                    (lambda a, e: abs(a["logit"] - _middle_rate_runs()["per_head"].max_logit_per_layer[-1][0])
                     < 0.01 * a["logit"],
                     "logit: that is the first layer's largest logit at the last step; the last layer's is "
                     "max_logit_per_layer[-1][-1]")],
             wrong=[lambda e: {**e, "bound": e["bound"] / 4}, lambda e: {**e, "bound": 4 * e["bound"]},
                    lambda e: {**e, "bound": 4.0}, lambda e: {**e, "bound": 2 * e["bound"]},
                    lambda e: {**e, "logit": _middle_rate_runs()[None].max_logit_per_layer[-1][-1]},
                    lambda e: {**e, "logit": _middle_rate_runs()["per_head"].max_logit_per_layer[0][-1]},
                    lambda e: {**e, "logit": _middle_rate_runs()["per_head"].max_logit_per_layer[-1][0]},
                    lambda e: {**e, "bound": _logit_bound(layer=0)["bound"]},
                    lambda e: {**e, "bound": _logit_bound(pairing="max_product")["bound"]},
                    lambda e: {**e, "bound": _logit_bound(pairing="rope_pairs")["bound"]}]),
    Exercise("6.6", "a function cap_grad(z, c): the derivative of c * tanh(z / c) for a tensor z", kind="function",
             reference=_cap_derivative,
             inputs=lambda g: (torch.cat([torch.zeros(1), 100 * torch.randn(63, generator=g)]), 50.0),  # z[0] = 0
             hints=[(lambda got, _: abs(float(got[0]) - 50) < 1e-3,
                     "at z = 0 your slope is c: the inner derivative 1/c cancels the c in front"),
                    (lambda got, _: abs(float(got[0]) - 1 / 50) < 1e-6,
                     "at z = 0 your slope is 1/c: the c in front cancels the inner derivative 1/c"),
                    (lambda got, want: bool(((got >= -1e-6) & (got <= 1 + 1e-6)).all())
                     and torch.allclose(got.square(), want, atol=1e-5),
                     "the derivative of tanh(u) is 1 - tanh(u)^2 = 1 / cosh(u)^2: the cosh is squared"),
                    (lambda got, want: torch.allclose((1 - got).square(), 1 - want, atol=1e-5),
                     "the derivative of tanh(u) is 1 - tanh(u)^2: the tanh is squared"),
                    (lambda got, want: torch.allclose((1 - got) * 50, 1 - want, atol=1e-5),
                     "check the brackets: only tanh(z / c)^2 is subtracted from 1, and nothing is divided by c "
                     "(the inner 1/c cancels the c in front)"),
                    (lambda got, _: abs(float(got[0])) < 1e-6 and bool((got < -1e-6).any()),
                     "your function is 0 at z = 0 and negative for z < 0, like the cap c * tanh(z / c) itself: "
                     "hand in its derivative, the slope"),
                    (lambda got, _: bool((got > 1 + 1e-6).any()), "the derivative of tanh is at most 1"),
                    (lambda got, _: bool((got < -1e-6).any()), "the derivative of a rising function is never negative"),
                    (lambda got, _: abs(float(got[0]) - 1) > 1e-3,
                     "At z = 0 the cap is the identity: what must the slope be there?"),
                    (lambda got, _: bool(((got - 1).abs() < 1e-6).logical_or(got.abs() < 1e-6).all()),
                     "a slope of 1 or 0 is a hard clip's, clamp(z, -c, c); tanh bends smoothly, with slope "
                     "1 - tanh(z / c)^2 everywhere"),
                    (lambda got, _: float((got[1:] < 1e-6).float().mean()) > 0.5,
                     "your slope is right at z = 0 but falls to zero within a few units of z, where the cap "
                     "bends over a scale of c = 50: tanh's argument is z / c")],
             hint="Apply the chain rule to c·tanh(z/c).",
             wrong=[lambda: (lambda z, c: 1 / torch.cosh(z / c)), lambda: (lambda z, c: 1 - torch.tanh(z / c)),
                    lambda: (lambda z, c: c * (1 - torch.tanh(z / c) ** 2)),
                    lambda: (lambda z, c: (1 - torch.tanh(z / c) ** 2) / c),
                    lambda: (lambda z, c: 1 / torch.cosh(z) ** 2),
                    lambda: (lambda z, c: (z.abs() < c).float()),
                    lambda: (lambda z, c: (1 - torch.tanh(z / c) ** 2) / c),
                    lambda: (lambda z, c: 1 - torch.tanh(z / c) ** 2 / c)]),
]
