"""The check after each chapter's "Build it": the reader's module against ``d2lmini``'s, with a hint.

:func:`check_build` compares the two on the same inputs after
:func:`d2lmini.copy_parameters` has copied ``d2lmini``'s random weights into the reader's
module. When they agree it returns quietly; when they do not, it looks for the part that
differs, so that the error says where to look instead of only how large the difference is:

1. every submodule of the reader's (``norm1``, ``ffn``, each expert, ...), run alone on a
   random input beside the ``d2lmini`` submodule its weights came from (an attention part on
   the same tensor as queries, keys and values, and with ``valid_lens`` too where its forward
   takes them);
2. two submodules of the same kind and shapes used in each other's place (the two norms of a
   block, say), found by exchanging their weights and comparing again;
3. for a norm written by hand, the usual slips (the unbiased variance, ``eps`` outside the
   square root, the gain forgotten, the statistic over the wrong axis);
4. for a pre-LN or post-LN block written by hand, the usual slips of its ``forward`` (the other
   placement, a skip dropped or kept, the FFN reading the block's input or ``norm1``, the
   stream normalized; in attention written out, the scale, the softmax's axis, the heads'
   columns), each computed with ``d2lmini``'s parts;
5. otherwise the wiring of ``forward``, in the words of the chapter's ``hint``.
"""

from __future__ import annotations

import copy
import itertools
import re

import torch
from torch import nn

__all__ = ["check_build"]


def _output(value):
    """The tensor a module returned: the first entry of a tuple (e.g. ``(output, cache)``)."""
    return value[0] if isinstance(value, (tuple, list)) else value


def _differs(a, b, rtol, atol) -> float | None:
    """The largest absolute difference of ``a`` and ``b`` when they are not close, else None."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return float("inf")
    try:
        torch.testing.assert_close(a, b.to(a.dtype), rtol=rtol, atol=atol)
    except AssertionError:
        return float((a.double() - b.double()).abs().max())
    return None


def _parts(module: nn.Module, prefix: str = "") -> dict[str, nn.Module]:
    """The reader's parts: the children of ``module``, with lists and dicts of modules opened up."""
    parts = {}
    for name, child in module.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            parts.update(_parts(child, f"{prefix}{name}."))
        else:
            parts[prefix + name] = child
    return parts


def _source_of(name: str, ref: nn.Module, rename: dict) -> str | None:
    """The name in ``ref`` of the module whose weights ``copy_parameters(ref, mine, rename)`` put in ``name``."""
    candidates = [source for source, target in rename.items() if target == name] + [name]
    for candidate in candidates:
        try:
            ref.get_submodule(candidate)
        except AttributeError:
            continue
        return candidate
    return None


def _uncopied(mine: nn.Module, ref: nn.Module, rename: dict) -> tuple[str, str] | None:
    """The first part of ``mine`` whose tensors have the shapes of its source's in ``ref`` but other values
    (``copy_parameters`` not called), as ``(name, source)``; None when every such part holds ``ref``'s."""
    for name, part in _parts(mine).items():
        source = _source_of(name, ref, rename)
        if source is None:
            continue
        mine_state, ref_state = part.state_dict(), ref.get_submodule(source).state_dict()
        if mine_state.keys() != ref_state.keys() or not mine_state:
            continue
        if all(a.shape == b.shape for a, b in zip(mine_state.values(), (ref_state[k] for k in mine_state))) \
                and not all(torch.equal(mine_state[k], ref_state[k]) for k in mine_state):
            return name, source
    return None


def _width(module: nn.Module) -> int | None:
    """The width of the last dimension ``module`` reads, from its first parameter (None without one)."""
    weight = next(module.parameters(), None)
    if weight is None:
        return None
    return int(weight.shape[-1] if weight.dim() >= 2 else weight.shape[0])


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def _forward_advice(error: Exception, ref: nn.Module, hint: str | None, built_in: str | None) -> str:
    """What to add to the message of an error the reader's forward raised: the dtype to build in, a name to
    import, the keepdim a norm's statistic needs to broadcast, or else the check's own ``hint``."""
    if built_in and "dtype" in str(error):
        return f". {built_in[0].upper()}{built_in[1:]}."
    if isinstance(error, NameError):
        return ". Import that name (e.g. import math) or define it before your class."
    if _is_norm(ref) and "must match the size of tensor" in str(error):
        return (". A statistic of each token, such as X.mean(dim=-1), needs keepdim=True (shape (b, n, 1)) to "
                "broadcast against X")
    return f". Check in forward: {hint}." if hint else ""


def _part_hint(name: str, source: str, module: nn.Module, gap: float, called: str | None = None,
               small: bool = False) -> str:
    """The hint for a part that differs alone; ``module``: d2lmini's part (what kind of part it is, whatever the
    reader's class is called); ``called``: how an attention part was called (None: one tensor)."""
    attention = called is not None
    what = ("its statistic (over the last dimension), eps (inside the square root) and its gain"
            + (" and bias" if sum(1 for _ in module.parameters()) > 1 else "")
            if _is_norm(module) else
            "the arguments it is built with (heads, bias, mask, positions, norms, dropout) and, if you wrote it, "
            "each head's softmax(Q_h K_h^T / sqrt(d_h)) and W_o on the concatenated heads" if attention
            else "its layers, their order and the activation between them")
    return (f"`{name}` alone computes something else than d2lmini's `{source}`, whose weights it holds "
            f"(largest difference {gap:.2g} on the same random input{', times 1e-3' if small else ''}"
            f"{', ' + called if called else ''}): check {what}.")


def _calls(module: nn.Module, Z: torch.Tensor) -> list[tuple[tuple, torch.Tensor]]:
    """The calls that compare a part alone, with ``module``'s (d2lmini's) output for each.

    A part that reads one tensor is called on ``Z``; an attention part, whose forward reads
    queries, keys and values, on ``(Z, Z, Z)``, and where its forward takes ``valid_lens``, also on
    ``(Z, Z, Z, valid_lens)`` with the lengths n, n - 1, ... (padding masked in all but the first
    sequence). Empty when neither runs."""
    try:
        return [((Z,), _output(module(Z)))]
    except Exception:
        pass
    try:
        calls = [((Z, Z, Z), _output(module(Z, Z, Z)))]
    except Exception:
        return []
    valid_lens = torch.arange(Z.shape[1], Z.shape[1] - Z.shape[0], -1).clamp(min=1)
    try:
        calls.append(((Z, Z, Z, valid_lens), _output(module(Z, Z, Z, valid_lens))))
    except Exception:  # a forward without valid_lens
        pass
    return calls


def _words(args: tuple, Z: torch.Tensor) -> str:
    """How a part was called, in words: one tensor, or the queries, keys, values (and valid_lens)."""
    shape = tuple(Z.shape)
    if len(args) == 1:
        return f"a tensor of shape {shape}"
    lens = f" and valid_lens={args[3].tolist()}" if len(args) > 3 else ""
    return f"one tensor of shape {shape} as queries, keys and values{lens}"


#: The epsilons of other norms, which a reader may have typed instead of the one the check uses.
_OTHER_EPS = (1e-3, 1e-5, 1e-6, 1e-8, 1e-12)


def _whose(ref: nn.Module) -> str:
    """Whose module ``ref`` is, for a hint: d2lmini's, PyTorch's (``nn.LayerNorm``'s) or the reference's."""
    module = type(ref).__module__
    if module.startswith("d2lmini"):
        return "d2lmini's"
    if module.startswith("torch.nn"):
        return f"nn.{type(ref).__name__}'s"
    return "the reference's"


def _other_eps(part: nn.Module, theirs: nn.Module) -> str | None:
    """The words for a norm of the other kind (LayerNorm for RMSNorm, or the reverse), or whose ``eps``
    attribute is a number other than d2lmini's, else None."""
    kinds = ["RMS" in type(m).__name__ for m in (part, theirs)]
    if _is_norm(part) and _is_norm(theirs) and kinds[0] != kinds[1] and (
            "LayerNorm" in type(part).__name__ or kinds[0]):
        a = ["an" if type(m).__name__.startswith(("RMS", "A", "E", "I", "O", "U")) else "a" for m in (part, theirs)]
        return (f"it is {a[0]} {type(part).__name__}, d2lmini's is {a[1]} {type(theirs).__name__}: "
                + ("RMSNorm subtracts no mean and has no bias" if kinds[1] else
                   "LayerNorm subtracts each token's mean and adds a bias"))
    mine, ref = getattr(part, "eps", None), getattr(theirs, "eps", None)
    numbers = all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in (mine, ref))
    if not numbers or not _is_norm(theirs) or mine == ref:
        return None
    return f"{_whose(theirs)} eps is {ref:g}, yours {mine:g}"


def _norm_slip(ref: nn.Module, ref_inputs: tuple, got: torch.Tensor, want: torch.Tensor) -> str | None:
    """The words of the first usual slip of a norm written by hand that ``got`` matches (much closer to
    it than to ``want``, d2lmini's output), or None."""
    if not (_is_norm(ref) and len(ref_inputs) == 1 and isinstance(ref_inputs[0], torch.Tensor)):
        return None
    off = float((got.double() - want.double()).abs().max())
    for words, slipped in _norm_slips(ref, ref_inputs[0]):
        if slipped.dtype in (torch.bfloat16, torch.float16):
            if _differs(got, slipped, 0, 0) is None:
                return words
        elif _differs(got.double(), slipped, 1e-4, 1e-4) is None and \
                float((got.double() - slipped).abs().max()) <= 0.1 * off:
            return words
    return None


def _norm_slips(ref: nn.Module, X: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """What a norm written by hand computes with a usual slip, for ``ref``'s weights and input ``X``."""
    weight = getattr(ref, "weight", None)
    bias = getattr(ref, "bias", None)
    if weight is None:
        return []
    eps = float(ref.eps if hasattr(ref, "eps") and ref.eps is not None else 1e-5)
    X32, g = X.double(), weight.double()
    b = bias.double() if bias is not None else torch.zeros_like(g)
    slips = []
    if bias is not None:  # LayerNorm: mean and variance over the last dimension, gain and bias
        mu = X32.mean(-1, keepdim=True)
        var = X32.var(-1, keepdim=True, unbiased=False)
        formula = "(x - mu) / sqrt(var + eps)"
        with_eps = lambda e: g * (X32 - mu) / torch.sqrt(var + e) + b  # noqa: E731 (the norm at another eps)
        slips += [
            ("the variance divides by num_hiddens, the biased variance (torch.var's default divides by "
             "num_hiddens - 1: pass unbiased=False, or average the squares)",
             g * (X32 - mu) / torch.sqrt(X32.var(-1, keepdim=True) + eps) + b),
            ("eps goes inside the square root: (x - mu) / sqrt(var + eps)",
             g * (X32 - mu) / (torch.sqrt(var) + eps) + b),
            ("divide by the square root of var + eps, the standard deviation, not by the variance itself",
             g * (X32 - mu) / (var + eps) + b),
            ("the output is gamma * x_hat + beta: multiply by the gain gamma", (X32 - mu) / torch.sqrt(var + eps) + b),
            ("the output is gamma * x_hat + beta: add the bias beta", g * (X32 - mu) / torch.sqrt(var + eps)),
            ("the output is gamma * x_hat + beta: the gain and the bias are both missing",
             (X32 - mu) / torch.sqrt(var + eps)),
            ("the output is gamma * x_hat + beta: the gain multiplies, the bias adds",
             b * (X32 - mu) / torch.sqrt(var + eps) + g),
            ("the bias is added after the gain: gamma * x_hat + beta, not gamma * (x_hat + beta)",
             g * ((X32 - mu) / torch.sqrt(var + eps) + b)),
        ]
        slips.append(("subtract each token's mean before dividing: gamma * (x - mu) / sqrt(var + eps) + beta",
                      g * X32 / torch.sqrt(var + eps) + b))
        slips.append(("LayerNorm subtracts each token's mean, in the variance and in the numerator: "
                      "gamma * (x - mu) / sqrt(mean((x - mu)^2) + eps) + beta",
                      g * X32 / torch.sqrt(X32.pow(2).mean(-1, keepdim=True) + eps) + b))
        slips.append(("the variance is the mean of (x - mu)^2, the squares of the centred token",
                      g * (X32 - mu) / torch.sqrt(X32.pow(2).mean(-1, keepdim=True) + eps) + b))
        for dims, words in (((0,), "the batch"), ((1,), "the positions"), ((0, 1), "the batch and the positions")):
            m, v = X32.mean(dims, keepdim=True), X32.var(dims, keepdim=True, unbiased=False)
            slips.append((f"the statistics are per token, over its features (dim=-1), not over {words}",
                          g * (X32 - m) / torch.sqrt(v + eps) + b))
    else:  # RMSNorm: the root mean square over the last dimension, a gain
        ms = X32.pow(2).mean(-1, keepdim=True)
        formula = "x * rsqrt(mean(x**2) + eps)"
        with_eps = lambda e: g * X32 * torch.rsqrt(ms + e)  # noqa: E731 (the norm at another eps)
        slips += [
            ("RMSNorm subtracts no mean: divide x itself by its root mean square",
             g * (X32 - X32.mean(-1, keepdim=True)) / torch.sqrt(X32.var(-1, keepdim=True, unbiased=False) + eps)),
            ("RMSNorm subtracts no mean: multiply x itself, not x - mean(x), by rsqrt(mean(x**2) + eps)",
             g * (X32 - X32.mean(-1, keepdim=True)) * torch.rsqrt(ms + eps)),
            ("the statistic is mean(x**2), the mean square of x itself, not its variance: RMSNorm "
             "subtracts no mean, not even inside the statistic",
             g * X32 * torch.rsqrt(X32.var(-1, keepdim=True, unbiased=False) + eps)),
            ("eps goes inside the square root: x * rsqrt(mean(x**2) + eps)", g * X32 / (torch.sqrt(ms) + eps)),
            ("divide by the root mean square, sqrt(mean(x**2) + eps), not by the mean square itself",
             g * X32 / (ms + eps)),
            ("the output is multiplied by the gain gamma", X32 * torch.rsqrt(ms + eps)),
            ("the statistic is the mean of the squares over the last dimension (dim=-1, keepdim=True)",
             g * X32 * torch.rsqrt(X32.pow(2).mean((0, 1), keepdim=True) + eps)),
            ("the statistic is the mean of the squares, mean(x**2), not their sum",
             g * X32 * torch.rsqrt(X32.pow(2).sum(-1, keepdim=True) + eps)),
        ]
    slips.append((f"add eps, the module's own, inside the square root, {formula}: without it (or with a "
                  f"much smaller one) small tokens are blown up", with_eps(0.0)))
    typed = "compute with the eps given to __init__ (self.eps), not a number typed in"
    slips += [(f"{_whose(ref)} eps is {eps:g}; yours computes as with {other:g}: {typed}", with_eps(other))
              for other in _OTHER_EPS if other != eps]
    if bias is None:  # nn.RMSNorm's eps=None: float32's machine epsilon, whatever the input's dtype
        machine = torch.finfo(torch.float32).eps
        slips.append((f"{_whose(ref)} eps is {eps:g}; yours computes as with float32's machine epsilon, {machine:.3g}, "
                      f"the default "
                      f"(eps=None) of nn.RMSNorm", with_eps(machine)))
    if bias is None and X.dtype == torch.float32:  # rounded to a 16-bit type whatever the input's
        Xf = X.float()
        normed = Xf * torch.rsqrt(Xf.pow(2).mean(-1, keepdim=True) + eps)
        slips += [(f"round back to the input's dtype, Y.to(X.dtype), not to {half}: the input here is float32",
                   (normed.to(half).float() * weight.float()).double()) for half in (torch.bfloat16, torch.float16)]
    if bias is None and X.dtype in (torch.bfloat16, torch.float16):  # RMSNorm's two orders of a 16-bit input
        Xf = X.float()
        normed = Xf * torch.rsqrt(Xf.pow(2).mean(-1, keepdim=True) + eps)
        slips += [
            ("upcast first: compute the statistic and normalize in float32 (X.float()), then round back",
             X * torch.rsqrt(X.pow(2).mean(-1, keepdim=True) + eps) * weight.to(X.dtype)),
            ("normalize in float32 too: X.float() * rsqrt(mean(x**2) + eps), then round back only the result",
             X * torch.rsqrt(Xf.pow(2).mean(-1, keepdim=True) + eps).to(X.dtype) * weight.to(X.dtype)),
            ("round back to the input's dtype first, then multiply by the gain",
             (normed * weight.float()).to(X.dtype)),
        ]
    return slips


def _attention_slips(attention: nn.Module) -> list[tuple[str, object]]:
    """The usual slips of multi-head attention written out, as functions of one tensor (queries, keys
    and values alike), with the weights of d2lmini's ``attention`` (causal or not, GQA, QK-norm and RoPE
    included; the head-splitting slips only without QK-norm and RoPE); empty for windows and sinks."""
    from ..attention import apply_rotary

    if type(attention).__name__ != "MultiHeadAttention" or attention.window is not None \
            or attention.sinks is not None:
        return []
    h, g, d_h = attention.num_heads, attention.num_kv_heads, attention.head_dim
    plain = attention.qk_norm is None and attention.rope_theta is None
    rotated = attention.rope_theta is not None
    mask_words = ("this attention is causal: query i sees keys 0 to i, so mask the later keys, j > i "
                  "(torch.ones(n, n).triu(1)), before the softmax")

    def attend(Y, scale=attention.logit_scale, axis=-1, columns="per head", merge="transposed",
               mask="as given", raw="", repeat="interleave", rotate_values=False):
        def project(W, T):  # nn.Linear computes T W^T + b; a raw one multiplies by W itself
            if W is not getattr(attention, raw, None):
                return W(T)
            return T @ W.weight + (0 if W.bias is None else W.bias)

        def split(T, heads):  # (b, n, heads d_h) -> (b, heads, n, d_h)
            if columns == "interleaved":  # head i on columns i, i + heads, i + 2 heads, ...
                return T.unflatten(-1, (d_h, heads)).permute(0, 3, 1, 2)
            if columns == "reshaped":  # (b, n, heads d_h) read as (b, heads, n, d_h) without the transpose
                return T.reshape(T.shape[0], heads, T.shape[1], d_h)
            if columns == "untransposed":  # (b, n, heads, d_h): each token's heads attend to one another
                return T.unflatten(-1, (heads, d_h))
            if columns == "one head":  # (b, 1, n, heads d_h): all columns attended to as a single head
                return T.unsqueeze(1)
            return T.unflatten(-1, (heads, d_h)).transpose(1, 2)
        if plain:
            Q = split(project(attention.W_q, Y), h)
            K, V = (split(project(W, Y), g) for W in (attention.W_k, attention.W_v))
        else:  # normed and rotated as d2lmini's, then the kernel's slips
            Q, K = attention.queries_and_keys(Y, Y)
            V = attention.value_heads(Y)
            if rotate_values:
                V = apply_rotary(V, *attention._rotary(V.shape[2], V))
        if g < h:  # query head i reads key/value head i // (h / g); repeat gives i % g instead
            axis_of_heads = 2 if columns == "untransposed" else 1
            K, V = (T.repeat_interleave(h // g, dim=axis_of_heads) if repeat == "interleave"
                    else torch.cat([T] * (h // g), dim=axis_of_heads) for T in (K, V))
        S = Q @ K.transpose(-2, -1) * scale
        mask = ("causal" if attention.causal else "none") if mask == "as given" else mask
        if mask != "none":  # "causal": keys after the query hidden; "reversed": those before it
            hidden = torch.ones(S.shape[-2:], dtype=torch.bool)
            S = S.masked_fill(hidden.triu(1) if mask == "causal" else hidden.tril(-1), float("-inf"))
        heads = torch.softmax(S, dim=axis) @ V  # (b, h, n, d_h)
        if columns == "untransposed":  # merged back as it was split
            return project(attention.W_o, heads.flatten(-2))
        if merge == "reshaped":  # read as (b, n, h d_h) without the transpose
            return project(attention.W_o, heads.reshape(Y.shape[0], Y.shape[1], h * d_h))
        if merge == "no W_o":
            return heads.transpose(1, 2).flatten(-2)
        return project(attention.W_o, heads.transpose(1, 2).flatten(-2))

    slips = [
        ("each head's logits are divided by sqrt(d_h), d_h = num_hiddens / num_heads, not by sqrt(num_hiddens)",
         lambda Y: attend(Y, scale=(h * d_h) ** -0.5)),
        ("divide each head's logits by sqrt(d_h)", lambda Y: attend(Y, scale=1.0)),
        ("divide each head's logits by sqrt(d_h), not by d_h", lambda Y: attend(Y, scale=1 / d_h)),
        ("divide each head's logits by sqrt(d_h); do not multiply", lambda Y: attend(Y, scale=d_h ** 0.5)),
        ("the softmax runs over the keys, the last dimension of Q_h K_h^T (dim=-1), not over the heads",
         lambda Y: attend(Y, axis=1)),
        ("the softmax runs over the keys, the last dimension of Q_h K_h^T (dim=-1), so that each query's "
         "weights sum to 1", lambda Y: attend(Y, axis=-2)),
        ("before W_o, bring the heads back beside each other: (b, num_heads, n, d_h), transpose(1, 2), then "
         "(b, n, num_hiddens); a reshape alone mixes positions and heads", lambda Y: attend(Y, merge="reshaped")),
        ("the concatenated heads pass through the output projection W_o", lambda Y: attend(Y, merge="no W_o")),
    ]
    if attention.causal:
        slips += [(mask_words, lambda Y: attend(Y, mask="none")),
                  ("mask the keys after each query, j > i (triu(1)), not those before it, j < i: query i sees "
                   "keys 0 to i", lambda Y: attend(Y, mask="reversed"))]
    else:
        slips.append(("this attention has no mask: every query sees every key, earlier and later ones",
                      lambda Y: attend(Y, mask="causal")))
    if g < h:
        slips.append((f"query head i reads key/value head i // {h // g} (groups of {h // g} consecutive heads): "
                      f"repeat_interleave({h // g}, dim=1) repeats each key/value head {h // g} times in a row; "
                      f"repeat or cat tiles them, giving i % {g}", lambda Y: attend(Y, repeat="tile")))
    if rotated:
        slips.append(("RoPE rotates the queries and the keys only: the values are not rotated",
                      lambda Y: attend(Y, rotate_values=True)))
    if plain:
        slips += [
            ("after splitting the heads, transpose(1, 2) to (b, num_heads, n, d_h): without it each token's heads "
             "attend to one another instead of each head attending over the tokens",
             lambda Y: attend(Y, columns="untransposed")),
            ("head i reads columns i*d_h to (i+1)*d_h - 1: unflatten the last dimension as (num_heads, d_h)",
             lambda Y: attend(Y, columns="interleaved")),
            ("split the heads as (b, n, num_heads, d_h), then transpose(1, 2) to (b, num_heads, n, d_h): a "
             "reshape alone mixes positions and heads", lambda Y: attend(Y, columns="reshaped")),
            ("split the heads as (b, n, num_heads, d_h), then transpose(1, 2), and undo both before W_o: a "
             "reshape alone, both ways, mixes positions and heads",
             lambda Y: attend(Y, columns="reshaped", merge="reshaped")),
        ] + [(f"call the layer, {W}(T): an nn.Linear computes T W^T (+ b), not T @ {W}.weight",
              lambda Y, W=W: attend(Y, raw=W)) for W in ("W_q", "W_k", "W_v", "W_o")]
        if 1 < h == g:  # the heads never split: one softmax over all columns' logits
            slips += [("attention runs as num_heads heads of d_h features each, not one head over all "
                       "num_hiddens columns: split Q, K and V with T.unflatten(-1, (num_heads, d_h)).transpose(1, 2)",
                       lambda Y, scale=scale: attend(Y, columns="one head", scale=scale))
                      for scale in (d_h ** -0.5, (h * d_h) ** -0.5)]
    return slips


def _block_slips(ref: nn.Module, X: torch.Tensor, *rest) -> list[tuple[str, torch.Tensor]]:
    """What a pre-LN or post-LN block written by hand computes with a usual slip in its ``forward``, with the
    parts of d2lmini's ``ref`` (a plain :class:`~d2lmini.block.TransformerBlock`) on input ``X`` (``rest``:
    the block's other arguments, ``valid_lens``, handed to its attention); empty for any other module."""
    from ..block import TransformerBlock

    if type(ref) is not TransformerBlock or ref.placement not in ("pre", "post") or ref.layer_scalar != 1.0 \
            or any(a.residual_multiplier != 1.0 for a in ref._addnorms()):
        return []
    pre, skips = ref.placement == "pre", ref.addnorm1.residual
    n1, n2 = ((a.norm_in if pre else a.norm_post) for a in ref._addnorms())
    F = ref.ffn

    def block(placement=ref.placement, skip1=skips, skip2=skips, ffn_reads="X'", norm2=n2, stream_normed=False,
              attend=lambda Y: _output(ref.attention(Y, Y, Y, *rest)), unnormed=(), ffn_adds_to="X'", F=F):
        if placement == "pre":
            Z = n1(X) if stream_normed in (True, "attention") else X  # the stream itself normalized: a slip
            X1 = (Z if skip1 else 0) + attend(X if "attention" in unnormed else n1(X))
            Z1 = norm2(X1) if stream_normed in (True, "ffn") else (X1 if ffn_adds_to == "X'" else X)
            read = X1 if ffn_reads == "X'" else X
            return (Z1 if skip2 else 0) + F(read if "ffn" in unnormed else norm2(read))
        if placement == "post_sublayer":  # a norm on each branch: X + norm(F(X))
            X1 = X + n1(attend(X))
            return X1 + norm2(F(X1))
        X1 = n1((X if skip1 else 0) + attend(X))
        return norm2((X1 if skip2 else 0) + F(X1 if ffn_reads == "X'" else X))

    name = ({True: "pre-LN, X + F(norm(X))", False: "post-LN, norm(X + F(X))"} if skips else
            {True: "pre-LN, F(norm(X))", False: "post-LN, norm(F(X))"})
    after = {(True, True): "X + Attn(norm1(X))", (True, False): "Attn(norm1(X))",
             (False, True): "norm1(X + Attn(X))", (False, False): "norm1(Attn(X))"}[pre, skips]
    slips = [(f"this is {name[not pre]}; the block is {name[pre]}", block(placement="post" if pre else "pre")),
             (f"the FFN reads the stream after attention, X' = {after}, not the block's input X",
              block(ffn_reads="X")),
             ("the FFN's norm is norm2: your forward uses norm1 twice", block(norm2=n1))]
    if skips:
        slips += [(f"both skips are missing: each step adds its input, {name[pre].split(', ')[1]}",
                   block(skip1=False, skip2=False)),
                  ("attention's output is added to the stream X (its skip connection)", block(skip1=False)),
                  ("the FFN's output is added to the stream X' (its skip connection)", block(skip2=False))]
        right = "pre-LN normalizes each sublayer's input, X + F(norm(X))" if pre else \
            "post-LN normalizes the sum, norm(X + F(X))"
        slips.append((f"this is X + norm(F(X)), a norm on each branch; {right}", block(placement="post_sublayer")))
        if pre:
            slips += [("the FFN's output is added to X', the stream after attention, not to the block's "
                       "input X", block(ffn_adds_to="X")),
                      *((f"add each sublayer's output to the stream itself, not to its norm: in pre-LN the "
                         f"stream is never normalized", block(stream_normed=where))
                        for where in (True, "attention", "ffn"))]
    else:
        step = "F(norm(X))" if pre else "norm(F(X))"
        slips += [(f"residual=False: no skips, each step returns {step} with no X added",
                   block(skip1=True, skip2=True)),
                  (f"residual=False: yours still adds X to attention's output; without skips that step "
                   f"returns {step} alone", block(skip1=True)),
                  (f"residual=False: yours still adds X' to the FFN's output; without skips that step "
                   f"returns {step} alone", block(skip2=True))]
    if pre:
        slips += [("the queries, keys and values all come from norm1(X), not only the queries",
                   block(attend=lambda Y: _output(ref.attention(Y, X, X, *rest)))),
                  ("attention reads norm1(X), not the stream X itself: in pre-LN each sublayer's input is "
                   "normalized", block(unnormed=("attention",))),
                  ("the FFN reads norm2(X'), not the stream X' itself: in pre-LN each sublayer's input is "
                   "normalized", block(unnormed=("ffn",))),
                  ("each sublayer reads its norm's output, norm1(X) and norm2(X'), not the stream itself: in "
                   "pre-LN each sublayer's input is normalized", block(unnormed=("attention", "ffn")))]
    if rest:
        slips.append(("hand valid_lens on to the attention, self.attention(Y, Y, Y, valid_lens): without it "
                      "the padded positions' queries read the padding keys",
                      block(attend=lambda Y: _output(ref.attention(Y, Y, Y)))))
    slips += [(words, block(attend=attend)) for words, attend in _attention_slips(ref.attention)]
    if type(F).__name__ == "FeedForward" and not F.gated and F.act in ("relu", "gelu"):  # the other activation
        other = {"relu": torch.nn.functional.gelu, "gelu": torch.relu}[F.act]
        slips.append((f"the FFN's activation is {F.act}: W_2 {F.act}(W_1 x)",
                      block(F=lambda Z: F.W_2(other(F.W_1(Z))))))
    return slips


def check_build(mine: nn.Module, ref: nn.Module, *inputs, ref_inputs: tuple | None = None,
                rename: dict | None = None, rtol: float | None = None, atol: float | None = None,
                hint: str | None = None):
    """Check that the module a reader built computes what ``d2lmini``'s computes; say where it does not.

    Call it after ``d2lmini.copy_parameters(ref, mine, rename)``. It runs ``mine(*inputs)`` and
    ``ref(*ref_inputs)`` (``ref(*inputs)`` by default) without gradients and compares the two
    outputs (the first entry of a tuple) with :func:`torch.testing.assert_close`; where ``ref`` holds
    a norm, once more with the first input times 1e-3, where a norm's eps weighs.

    Args:
        mine: the reader's module; ref: ``d2lmini``'s, whose weights ``mine`` holds.
        inputs: the arguments of ``mine``; ref_inputs: those of ``ref``, when they differ.
        rename: the dict given to ``copy_parameters``: which part of ``ref`` each part of ``mine``
            came from (parts of the same name need no entry).
        rtol, atol: the tolerance, as in ``assert_close`` (None: its defaults for the dtype).
        hint: what to check in ``forward`` when every part agrees alone (None: a general hint).

    Returns:
        ``mine``'s output.

    Raises:
        AssertionError: when the outputs differ; the message starts with ``Hint:`` and names the
            part that differs, the two parts used in each other's place, the slip in a norm written
            by hand, or (every part agreeing alone) what to check in ``forward``.
        TypeError: if ``mine`` or ``ref`` is not an ``nn.Module``, or ``rename`` not a dict.
    """
    if not isinstance(mine, nn.Module) or not isinstance(ref, nn.Module):
        raise TypeError(f"mine and ref must be nn.Modules, got {type(mine).__name__} and {type(ref).__name__}")
    if rename is not None and not isinstance(rename, dict):
        raise TypeError(f"rename must be the dict given to copy_parameters, got {type(rename).__name__}")
    rename = rename or {}
    ref_inputs = inputs if ref_inputs is None else tuple(ref_inputs)
    trained, kept = dict(mine.named_parameters()), dict(mine.named_buffers())

    def renamed(name):
        return next((target + name[len(source):] for source, target in rename.items()
                     if name == source or name.startswith(source + ".")), name)

    for name, _ in ref.named_buffers():  # a buffer is state the optimizer must not train
        if renamed(name) in trained:
            raise AssertionError(f"Hint: `{renamed(name)}` is a parameter in yours, a buffer in d2lmini's: register "
                                 f"it with self.register_buffer, so that an optimizer does not train it.")
    for name, _ in ref.named_parameters():  # and a parameter is what it trains
        if renamed(name) in kept:
            raise AssertionError(f"Hint: `{renamed(name)}` is a buffer in yours, a parameter in d2lmini's: make it "
                                 f"an nn.Parameter, so that an optimizer trains it.")
    with torch.no_grad():
        first = next((x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()), None)
        odd = [] if first is None else [(name, p.dtype) for name, p in mine.named_parameters()
                                        if p.is_floating_point() and p.dtype != first.dtype]
        built_in = (f"`{odd[0][0]}` is {odd[0][1]}, the input {first.dtype}: build every part in the input's "
                    f"dtype (leave dtype= out)") if odd else None
        try:
            got = _output(mine(*inputs))
        except Exception as error:  # the reader's forward failed: say how, as a hint
            raise AssertionError(f"Hint: calling your module raised {type(error).__name__}: "
                                 f"{str(error).rstrip('.')}{_forward_advice(error, ref, hint, built_in)}") from error
        want = _output(ref(*ref_inputs))
        if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != want.dtype:
            raise AssertionError(f"Hint: your module returns {got.dtype}, d2lmini's {want.dtype}: " + (
                built_in or "the last step must be in the input's dtype (the gain too; round back with "
                            "Y.to(X.dtype), X the input as it came in, not X = X.float())") + ".")
        if isinstance(got, torch.Tensor) and got.is_floating_point() and got.isnan().any() \
                and not want.isnan().any():
            raise AssertionError("Hint: your output holds NaN where d2lmini's does not: a softmax over a row whose "
                                 "every key is masked gives NaN (a causal mask hides the keys j > i, "
                                 "triu(diagonal=1), and keeps the diagonal), as does 0 / 0 (a norm without eps on "
                                 "a row of zeros, say).")
        again = _output(mine(*inputs))
        if isinstance(got, torch.Tensor) and isinstance(again, torch.Tensor) and not torch.equal(got, again):
            raise AssertionError("Hint: your module gives two different outputs for the same input: is a dropout "
                                 "still in training mode? Build it without dropout (dropout=0), as d2lmini's is.")
        gap = _differs(got, want, rtol, atol)
        if gap is None:
            small, small_ref = _small(ref, inputs), _small(ref, ref_inputs)
            if small is None or small_ref is None:
                return got
            output = got  # a norm's eps weighs only on small tokens: compare those too
            got, want = _output(mine(*small)), _output(ref(*small_ref))
            gap = _differs(got, want, rtol, atol)
            if gap is None:
                return output
            inputs, ref_inputs = small, small_ref
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise AssertionError(f"Hint: your module returns {shape}; d2lmini's returns shape {tuple(want.shape)}.")
        raise AssertionError(_diagnose(mine, ref, inputs, ref_inputs, rename, got, want, gap, rtol, atol, hint))


def _not_called(mine: nn.Module, ref: nn.Module, rename: dict, inputs: tuple, ref_inputs: tuple) -> list[str]:
    """The parts of ``mine`` holding weights that its forward never calls while ``ref``'s forward calls the part
    they came from (a part used by its weights alone, or not at all)."""
    called, hooks = set(), []
    pairs = {name: _source_of(name, ref, rename) for name, part in _parts(mine).items()
             if next(part.parameters(), None) is not None}
    pairs = {name: source for name, source in pairs.items() if source is not None}
    for name, source in pairs.items():
        for key, module in ((("mine", name), mine.get_submodule(name)), (("ref", source), ref.get_submodule(source))):
            hooks.append(module.register_forward_hook(lambda *_, key=key: called.add(key)))
    try:
        mine(*inputs)
        ref(*ref_inputs)
    except Exception:
        return []
    finally:
        for hook in hooks:
            hook.remove()
    return [name for name, source in pairs.items() if ("ref", source) in called and ("mine", name) not in called]


def _built_otherwise(part: nn.Module, theirs: nn.Module) -> tuple[str, str] | None:
    """The settings (``name=value`` of ``extra_repr``) in which two modules of one class differ, as two
    strings, or None (other classes, or the same settings)."""
    if type(part) is not type(theirs):
        return None
    settings = [dict(re.findall(r"(\w+)=([^,=]+?)(?=, \w+=|$)", m.extra_repr())) for m in (part, theirs)]
    names = [k for k in settings[1] if k in settings[0] and settings[0][k] != settings[1][k]]
    if not names:
        return None
    return tuple(", ".join(f"{k}={s[k]}" for k in names) for s in settings)


def _small(ref: nn.Module, inputs: tuple) -> tuple | None:
    """``inputs`` with the first, a floating-point tensor, times 1e-3 (and each other input that is the same
    tensor, as queries, keys and values are), where ``ref`` holds a norm; else None."""
    if not inputs or not isinstance(inputs[0], torch.Tensor) or not inputs[0].is_floating_point() \
            or not any(_is_norm(m) for m in ref.modules()):
        return None
    small = 1e-3 * inputs[0]
    return tuple(small if x is inputs[0] else x for x in inputs)


def _diagnose(mine, ref, inputs, ref_inputs, rename, got, want, gap, rtol, atol, hint) -> str:
    difference = f" (largest difference {gap:.2g})"
    slip = _other_eps(mine, ref) or _norm_slip(ref, ref_inputs, got, want)
    if slip is not None:
        return f"Hint: {slip}{difference}."
    rounding = max(1e-3, 4 * torch.finfo(got.dtype).eps) if got.is_floating_point() else 1e-3
    if _differs(got, want, rounding, rounding) is None and (rtol, atol) == (0, 0):
        return ("Hint: your output agrees within rounding but not bit for bit" + difference + ": follow "
                "d2lmini's order of operations, in the same dtype at each step, and torch.rsqrt for 1/sqrt.")
    uncopied = _uncopied(mine, ref, rename)
    if uncopied is not None:
        return (f"Hint: `{uncopied[0]}` holds other weights than d2lmini's `{uncopied[1]}`: copy them first, "
                f"`mine = d2lmini.copy_parameters(ref, mine, rename)`, then check again.")
    generator = torch.Generator().manual_seed(0)
    agreeing = {}
    for name, part in _parts(mine).items():
        source = _source_of(name, ref, rename)
        width = _width(part)
        if source is None or width is None:
            continue
        theirs = ref.get_submodule(source)
        dtype = next(part.parameters()).dtype
        Z = (2 * torch.randn(3, 5, width, generator=generator, dtype=torch.float64) + 0.5).to(dtype)
        calls = _calls(theirs, Z)
        if not calls:  # a part that takes other inputs: compared as a whole only
            continue
        if _is_norm(theirs):  # small tokens too, where eps weighs
            calls += _calls(theirs, 1e-3 * Z)
        for args, expected in calls:
            words = _words(args, Z)
            try:
                alone = _output(part(*args))
            except Exception as error:
                if len(args) > 3:  # a forward of the reader's own without valid_lens: not this call
                    continue
                return f"Hint: `{name}` alone, called with {words}, raised {type(error).__name__}: {error}"
            part_gap = _differs(alone, expected, rtol, atol)
            if part_gap is not None:
                built = _built_otherwise(part, theirs)
                if built is not None:
                    return f"Hint: `{name}` is built with {built[0]}, d2lmini's `{source}` with {built[1]}."
                slip = _other_eps(part, theirs) or _norm_slip(theirs, args, alone, expected)
                if slip is not None:
                    size = "" if args[0] is Z else ", times 1e-3"
                    return (f"Hint: `{name}` alone differs from d2lmini's `{source}`: {slip} (largest difference "
                            f"{part_gap:.2g} on a random input of shape {tuple(Z.shape)}{size}).")
                return "Hint: " + _part_hint(name, source, theirs, part_gap, words if len(args) > 1 else None,
                                             small=args[0] is not Z)
        agreeing[name] = part
    kinds = {}
    for name, part in agreeing.items():
        key = (type(part).__name__, tuple(tuple(t.shape) for t in part.state_dict().values()))
        kinds.setdefault(key, []).append(name)
    for names in kinds.values():
        for a, b in itertools.combinations(names, 2):
            exchanged = copy.deepcopy(mine)
            state_a = copy.deepcopy(exchanged.get_submodule(a).state_dict())
            exchanged.get_submodule(a).load_state_dict(exchanged.get_submodule(b).state_dict())
            exchanged.get_submodule(b).load_state_dict(state_a)
            try:
                swapped = _output(exchanged(*inputs))
            except Exception:
                continue
            if _differs(swapped, want, rtol, atol) is None:
                ends = {_source_of(n, ref, rename).rpartition(".")[2] for n in (a, b)}
                look = (", or the order of the scores' product: Q K^T, not K Q^T" if ends == {"W_q", "W_k"}
                        else "" if _is_norm(agreeing[a]) or ends <= {"W_q", "W_k", "W_v", "W_o"}
                        else ", and which one passes through an activation")
                return (f"Hint: `{a}` and `{b}` each compute alone what d2lmini's do, but your forward uses "
                        f"`{a}` where `{b}` belongs and `{b}` where `{a}` belongs: with their weights exchanged "
                        f"your module matches d2lmini's. See which input each one reads{look}.")
    first_tensor = bool(ref_inputs) and isinstance(ref_inputs[0], torch.Tensor)
    try:  # a block whose attention takes arguments it was not given has none
        slips = _block_slips(ref, *ref_inputs) if first_tensor else []
    except (TypeError, ValueError, RuntimeError):
        slips = []
    if first_tensor and len(ref_inputs) == 3 and all(x is ref_inputs[0] for x in ref_inputs):
        for words, attend in _attention_slips(ref):  # an attention alone, on one tensor
            try:
                slips.append((words, attend(ref_inputs[0])))
            except (TypeError, ValueError, RuntimeError):  # a slip these shapes cannot make
                continue
    for words, slipped in slips:
        if _differs(slipped, want, rtol, atol) is not None and _differs(got, slipped, rtol, atol) is None:
            return f"Hint: {words}{difference}."
    unused = _not_called(mine, ref, rename, inputs, ref_inputs)
    if unused:
        return (f"Hint: your forward never calls `{unused[0]}` as a layer, `{unused[0]}(...)`, where d2lmini's calls "
                f"its `{_source_of(unused[0], ref, rename)}`: see which part computes each step{difference}.")
    if _is_norm(ref) and not agreeing:
        gain = "the gain and the bias (gamma * x_hat + beta)" if getattr(ref, "bias", None) is not None else "the gain"
        return ("Hint: " + (hint or "check the statistic (over the last dimension), eps (inside the square root) "
                                    f"and {gain}") + difference + ".")
    groups = {}
    for name in agreeing:  # experts.0, experts.1, ... are named once, as `experts` (all 8)
        head, _, tail = name.rpartition(".")
        groups.setdefault(head if head and tail.isdigit() else name, []).append(name)
    parts = ", ".join(f"`{names[0]}`" if len(names) == 1 else f"`{key}` (all {len(names)})"
                      for key, names in groups.items())
    alone = f"Every part ({parts}) computes alone what d2lmini's does, so look at forward: " \
        if agreeing else "The difference is in forward: "
    return "Hint: " + alone + (hint or "which input each part reads, the order of the steps, and how their "
                                       "results are combined") + difference + "."
