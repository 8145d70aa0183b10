"""Self-checks of chapter 1's exercises (Anatomy: two sublayers on one residual stream).

Every expected answer is computed here from the exercise's own settings with the chapter's
module, :mod:`d2lmini.chapters.ch01_anatomy`, and :class:`d2lmini.block.TransformerBlock`.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from . import Exercise

#: The rename of the chapter's check of ``MiniBlock``: d2lmini's names -> the reader's.
MINIBLOCK_RENAME = {"addnorm1.norm_in": "norm1", "addnorm2.norm_in": "norm2", "ffn.W_1": "ffn.0", "ffn.W_2": "ffn.2",
                    **{f"attention.{W}": W for W in ("W_q", "W_k", "W_v", "W_o")}}


# --------------------------------------------------------------------------- 1.1 parameter counts

def _llama_counts() -> dict:
    from ..chapters import ch01_anatomy as anatomy

    shapes = {"GQA": anatomy.LLAMA3_8B_BLOCK, "MQA": {**anatomy.LLAMA3_8B_BLOCK, "num_kv_heads": 1}}
    rows = {row["model"]: row for row in anatomy.parameter_counts(shapes)}
    gqa, mqa = rows["GQA"]["counts"], rows["MQA"]["counts"]
    d2 = rows["GQA"]["num_hiddens"] ** 2
    return {"attention": gqa["attention"] / d2, "ffn": gqa["ffn"] / d2, "share": mqa["attention"] / mqa["total"]}


# --------------------------------------------------------------------------- 1.2 a token alone

@functools.cache
def _alone_ratios(field: str = "attention_alone_relative") -> dict:
    from ..chapters import ch01_anatomy as anatomy

    return {f"n{n}": getattr(anatomy.position_mixing(num_hiddens=64, num_heads=4, num_steps=n, seed=0), field)
            for n in (3, 48, 192)}


# --------------------------------------------------------------------------- 1.3 causal, swapped tokens

def changed_rows(block: nn.Module, X: torch.Tensor, order, threshold: float = 1e-4) -> int:
    """How many output rows of ``block`` move by more than ``threshold`` when the tokens of
    ``X`` (``(1, n, d)``) are put in ``order``."""
    with torch.no_grad():
        change = (block(X[:, order]) - block(X)).abs().amax(dim=-1)[0]  # (n,): largest change per row
    return int((change > threshold).sum())


def _swapped_first_two() -> dict:
    from ..block import TransformerBlock
    from ..seeding import seeded

    counts = {}
    for name, extra in (("causal", {}), ("rope", {"rope_theta": 10000.0})):
        with seeded(0):
            block = TransformerBlock(64, 4, causal=True, **extra).eval()
            X = torch.randn(1, 8, 64)
        counts[name] = changed_rows(block, X, [1, 0, 2, 3, 4, 5, 6, 7])
    return counts


# --------------------------------------------------------------------------- 1.4 norms on the branch

def _residual_sums(placement: str):
    from ..chapters import ch01_anatomy as anatomy

    return anatomy.residual_sum(placement, depth=6, num_hiddens=64, num_heads=4, num_steps=16, norm="layer",
                                act="relu", seed=0)


def _residual_sums_by_default(placement: str) -> float:
    """The output RMS of ``residual_sum`` at its own defaults, without the chapter's kwargs (a wrong answer)."""
    from ..chapters import ch01_anatomy as anatomy

    return anatomy.residual_sum(placement).output_rms


def _branch_norms() -> dict:
    post_sublayer, sandwich = _residual_sums("post_sublayer"), _residual_sums("sandwich")
    return {"post_sublayer": post_sublayer.sum_vs_output, "sandwich": sandwich.sum_vs_output,
            "output_rms": sandwich.output_rms}


# --------------------------------------------------------------------------- 1.5 tied weights

def _tied_stack() -> dict:
    from ..block import TransformerBlock
    from ..chapters import ch01_anatomy as anatomy
    from ..parameters import num_parameters

    block = TransformerBlock(64, 4, norm="layer", act="relu")
    stack = nn.Sequential(*[block] * 6)
    return {"parameters": num_parameters(stack), "shared": anatomy.shared_parameters(stack)}


# --------------------------------------------------------------------------- 1.6 a causal MiniBlock

class _MiniBlock(nn.Module):
    """The chapter's ``MiniBlock`` with a ``causal`` flag; ``mask`` says how (for the wrong answers)."""

    mask = "before softmax"  # or "ignored", "diagonal too", "after softmax", "always"
    scale_by = "d_h"  # or "d": a slip outside the mask

    def __init__(self, num_hiddens, num_heads, causal=False):
        super().__init__()
        self.num_heads, self.causal = num_heads, causal
        self.norm1 = nn.LayerNorm(num_hiddens)
        self.W_q = nn.Linear(num_hiddens, num_hiddens, bias=False)
        self.W_k = nn.Linear(num_hiddens, num_hiddens, bias=False)
        self.W_v = nn.Linear(num_hiddens, num_hiddens, bias=False)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=False)
        self.norm2 = nn.LayerNorm(num_hiddens)
        self.ffn = nn.Sequential(nn.Linear(num_hiddens, 4 * num_hiddens, bias=False), nn.ReLU(),
                                 nn.Linear(4 * num_hiddens, num_hiddens, bias=False))

    def attention(self, X):
        def split(T):
            return T.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)

        Q, K, V = split(self.W_q(X)), split(self.W_k(X)), split(self.W_v(X))
        logits = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1] if self.scale_by == "d_h" else X.shape[-1])
        n = X.shape[1]
        future = torch.ones(n, n, dtype=torch.bool).triu(1 if self.mask != "diagonal too" else 0)
        if (self.causal and self.mask in ("before softmax", "diagonal too")) or self.mask == "always":
            logits = logits.masked_fill(future, float("-inf"))
        A = torch.softmax(logits, dim=-1)
        if self.causal and self.mask == "after softmax":
            A = A.masked_fill(future, 0.0)
        return self.W_o((A @ V).transpose(1, 2).flatten(-2))

    def forward(self, X):
        X = X + self.attention(self.norm1(X))
        return X + self.ffn(self.norm2(X))


def _wrong_miniblock(mask: str, scale_by: str = "d_h"):
    return type(f"MiniBlock_{mask.replace(' ', '_')}", (_MiniBlock,), {"mask": mask, "scale_by": scale_by})


def _judge_causal_miniblock(cls) -> str | None:
    from ..block import TransformerBlock
    from ..parameters import copy_parameters
    from ..seeding import seeded
    from .build import check_build

    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"exercise 1.6: the answer must be your class MiniBlock itself (not an instance), "
                         f"got {type(cls).__name__}")
    refs = {}
    with seeded(0):
        for causal in (True, False):
            refs[causal] = TransformerBlock(64, 4, norm="layer", act="relu", causal=causal)
        for name, p in refs[True].named_parameters():
            if "norm" in name:  # gains and biases away from 1 and 0, as in the chapter's check
                nn.init.normal_(p)
        refs[False].load_state_dict(refs[True].state_dict())
        X = torch.randn(2, 10, 64)
    outputs, mines = {}, {}
    for causal, ref in refs.items():
        try:
            mine = cls(64, 4, causal=causal)
        except TypeError as error:
            return f"MiniBlock(64, 4, causal=True) must build a block; it raised TypeError: {error}"
        try:
            copy_parameters(ref, mine, rename=MINIBLOCK_RENAME)
        except ValueError:
            return "keep MiniBlock's names for its parameters (norm1, W_q, ..., ffn): the check copies weights by name"
        with torch.no_grad():
            try:
                outputs[causal] = (mine(X), ref(X))
            except RuntimeError as error:  # the reader's forward failed: say how
                return (f"MiniBlock(64, 4, causal={causal}) failed on a batch of 10 tokens ({error}); the mask "
                        f"is (num_steps, num_steps), num_steps = X.shape[1]")
        mines[causal] = mine
    got, want = outputs[True]
    if not torch.isfinite(got).all():
        return "some rows are NaN: a row whose logits are all -inf has no softmax; row i must keep j = i"
    if torch.allclose(got, outputs[False][1], atol=1e-5):
        return ("with causal=True the block still reads later tokens: mask the logits of j > i before the softmax "
                "(masked_fill returns a new tensor: assign its result, S = S.masked_fill(...))")
    if not torch.allclose(*outputs[False], atol=1e-5):
        if torch.allclose(outputs[False][0], want, atol=1e-5):
            return "with causal=False (the default) the block masks too: mask only when causal is True"
        try:  # a slip outside the mask: the Build-it check names the part
            check_build(mines[False], refs[False], X, rename=MINIBLOCK_RENAME, rtol=0, atol=1e-5)
        except AssertionError as error:
            return "with causal=False your block is not yet the chapter's MiniBlock: " + \
                str(error).removeprefix("Hint: ")
        return "with causal=False (the default) the block must be the chapter's MiniBlock, unmasked"
    if not torch.allclose(got, want, atol=1e-5):
        return ("row i must read rows j <= i only, with weights that sum to 1: set the logits of j > i to -inf "
                "before the softmax")
    return None


# --------------------------------------------------------------------------- 1.7 no attention

class ZeroAttention(nn.Module):
    """An attention sublayer that returns zeros of its queries' shape, ``(b, n, d)``."""

    def forward(self, queries, keys, values, valid_lens=None):
        return torch.zeros_like(queries)


def _zero_attention_gap() -> float:
    from ..block import TransformerBlock
    from ..chapters import ch01_anatomy as anatomy
    from ..seeding import seeded

    with seeded(0):
        block = TransformerBlock(64, 4, norm="layer", act="relu", attn_factory=ZeroAttention).eval()
        X = torch.randn(1, 12, 64)
    with torch.no_grad():
        return anatomy.alone_vs_in_sequence(block, X)[0]


EXERCISES = [
    Exercise("1.1", "(attention, ffn, share): Llama 3 8B's attention and FFN in units of d², and attention's "
             "share of the block with num_kv_heads=1, as a fraction", kind="numbers",
             names=("attention", "ffn", "share"), expected=_llama_counts, rel=5e-3,
             hints=[(lambda a, e: a["attention"] > 1000 or a["ffn"] > 1000,
                     "in units of d²: divide the parameter counts by d² (d = 4,096)"),
                    (lambda a, e: abs(a["attention"] - 4) < 0.01, "attention: W_k and W_v are narrower than W_q"),
                    (lambda a, e: abs(a["ffn"] - 8) < 0.01,
                     "ffn: three matrices of d × 14,336 (or 14,336 × d), not two of d × 4d"),
                    (lambda a, e: abs(a["ffn"] - 7) < 0.01,
                     "ffn: three matrices of d × 14,336, W_1, the gate W_g and W_2, not two"),
                    (lambda a, e: abs(a["attention"] - (2 + 2 / 32)) < 0.01,
                     "attention and ffn are Llama 3 8B's as released, with 8 key/value heads; only share "
                     "uses num_kv_heads=1"),
                    (lambda a, e: abs(a["share"] - e["share"] / (1 - e["share"])) < 2e-3
                     or abs(a["share"] - 2.5 / 10.5) < 2e-3,
                     "share: of the block, attention / (attention + ffn), not attention / ffn"),
                    (lambda a, e: abs(a["share"] - 2.5 / 13) < 0.003,
                     "share: with num_kv_heads=1, W_k and W_v shrink to one head's width"),
                    (lambda a, e: abs(a["share"] - (1 - e["share"])) < 2e-3,
                     "share: attention's share of the block, not the FFN's"),
                    (lambda a, e: abs(a["share"] - e["share"] * e["ffn"] / (1 - e["share"])
                                      / (e["attention"] + e["ffn"])) < 1e-3,
                     "share: of the block with num_kv_heads=1, whose total is smaller too"),
                    (lambda a, e: abs(a["attention"] - e["attention"]) > 5e-3 * e["attention"],
                     "attention: four matrices, W_q and W_o of d × d, and W_k and W_v of d × (8 · 128) each, "
                     "8 key/value heads of width 128"),
                    (lambda a, e: abs(a["ffn"] - e["ffn"]) > 5e-3 * e["ffn"],
                     "ffn: three matrices, W_1, the gate W_g and W_2, each d × 14,336 (or 14,336 × d)"),
                    (lambda a, e: True,
                     "share: attention / (attention + ffn) with num_kv_heads=1, where W_k and W_v are d × 128 "
                     "each and the FFN keeps its size")],
             wrong=[lambda e: {**e, "attention": 4.0}, lambda e: {**e, "ffn": 7.0},
                    lambda e: {**e, "attention": 2.25}, lambda e: {**e, "ffn": 12.0}, lambda e: {**e, "share": 0.15},
                    lambda e: {**e, "share": 100 * e["share"]},
                    lambda e: {**e, "share": e["share"] / (1 - e["share"])},
                    lambda e: {**e, "attention": 2 + 2 / 32}, lambda e: {**e, "share": round(e["share"], 2)},
                    lambda e: {**e, "share": 1 - e["share"]},
                    lambda e: {**e, "share": e["share"] * e["ffn"] / (1 - e["share"]) / (e["attention"] + e["ffn"])},
                    lambda e: {"attention": e["ffn"], "ffn": e["attention"], "share": e["share"]}]),
    Exercise("1.2", "(n3, n48, n192): attention_alone_relative of position_mixing at num_steps 3, 48 and 192",
             kind="numbers", names=("n3", "n48", "n192"), expected=_alone_ratios, rel=2e-2,
             hints=[(lambda a, e: max(a.values()) < 1e-4,
                     "those are rounding errors (ffn_alone's or block_permuted's): hand in "
                     "attention_alone_relative"),
                    (lambda a, e: len(set(a.values())) == 1,
                     "three equal numbers: the ratio changes with the length; measure it at each of 3, 48 and "
                     "192 tokens"),
                    (lambda a, e: all(abs(a[k] - v) < 0.02 * v for k, v in _alone_ratios("attention_alone").items()),
                     "that is attention_alone, the absolute difference: hand in attention_alone_relative"),
                    (lambda a, e: all(abs(a[k] - v) < 0.02 * v for k, v in _alone_ratios("attention_scale").items()),
                     "that is attention_scale, the size of the attention outputs compared: hand in "
                     "attention_alone_relative"),
                    (lambda a, e: all(abs(a[k] - v) < 0.02 * v for k, v in _alone_ratios("block_permuted_causal").items()),
                     "that is block_permuted_causal, the causal block's row: hand in attention_alone_relative"),
                    (lambda a, e: all(abs(a[k] - v) < 0.02 * v for k, v in _alone_ratios("block_permuted_rope").items()),
                     "that is block_permuted_rope, the row of the block with RoPE: hand in "
                     "attention_alone_relative"),
                    (lambda a, e: a["n192"] < a["n3"],
                     "the ratio divides by the row in the sequence: how does an average of n vectors shrink?"),
                    (lambda a, e: a["n192"] <= a["n48"] and abs(a["n192"] - e["n192"]) > 0.02 * e["n192"],
                     "n192: the ratio keeps growing from 48 to 192 tokens: run num_steps=192"),
                    (lambda a, e: not a["n3"] < a["n48"] < a["n192"] and abs(a["n48"] - e["n48"]) > 0.02 * e["n48"],
                     "n48: the ratio grows with n, so the one at 48 tokens lies between those at 3 and 192: "
                     "run num_steps=48"),
                    (lambda a, e: all(abs(a[k] - 100 * e[k]) < 2 * e[k] for k in e),
                     "these are percentages: hand in the ratios themselves, |Δ| / |row in the sequence|"),
                    (lambda a, e: all(abs(a[k] - 1 / e[k]) < 0.05 / e[k] for k in e),
                     "you inverted the ratio: |Δ| / |row in the sequence|"),
                    (lambda a, e: all(0.5 < a[k] / e[k] < 2 for k in e),
                     "these ratios grow with n as they should, but are not the run's (within 2%): "
                     "hand in the measured attention_alone_relative of "
                     "anatomy.position_mixing(num_hiddens=64, num_heads=4, num_steps=n, seed=0)")],
             wrong=[lambda e: {k: 1 / v for k, v in e.items()}, lambda e: {**e, "n192": e["n48"]},
                    lambda e: {k: math.sqrt(int(k[1:])) for k in e}, lambda e: {k: 2.4e-7 for k in e},
                    lambda e: _alone_ratios("attention_alone"), lambda e: {**e, "n48": e["n192"]},
                    lambda e: {k: 1.0 for k in e}, lambda e: _alone_ratios("attention_scale"),
                    lambda e: _alone_ratios("block_permuted_causal"), lambda e: _alone_ratios("block_permuted_rope")]),
    Exercise("1.3", "(causal, rope): how many of the 8 output rows move when the first two tokens are swapped, "
             "in the causal block, then with rope_theta=10000.0", kind="numbers", names=("causal", "rope"),
             expected=_swapped_first_two, rel=0, abs=0.1,
             hints=[(lambda a, e: max(a.values()) > 8,
                     "count rows, not entries: take each row's largest change, .amax(-1), then count those "
                     "above 1e-4"),
                    (lambda a, e: a["causal"] == 8,
                     "causal: a later row sees the same tokens, in another order; does attention without positions "
                     "see the order?"),
                    (lambda a, e: a["causal"] < 1, "causal: row 0 sees token 0 only, and that token changed"),
                    (lambda a, e: a["causal"] in (6, 7),
                     "causal: count the rows that move; rows 2 to 7 see the same set of tokens, with the same "
                     "query, as before"),
                    (lambda a, e: a["causal"] == 1,
                     "causal: row 1 sees the same two tokens as before, but its own query is now the other "
                     "token's"),
                    (lambda a, e: a["rope"] < 8, "rope: with RoPE a query scores a key by their distance")],
             wrong=[lambda e: {"causal": 8, "rope": 8}, lambda e: {**e, "rope": e["causal"]},
                    lambda e: {**e, "causal": 1}, lambda e: {**e, "causal": 6},
                    lambda e: {"causal": 128, "rope": 509}]),
    Exercise("1.4", "(post_sublayer, sandwich, output_rms): sum_vs_output of both placements, and the sandwich "
             "stack's output_rms", kind="numbers", names=("post_sublayer", "sandwich", "output_rms"),
             expected=_branch_norms, rel={"post_sublayer": 1e-2, "sandwich": 1e-2, "output_rms": 2e-3}, abs=1e-4,
             hints=[(lambda a, e: max(a["post_sublayer"], a["sandwich"]) > 0.01,
                     "run residual_sum with the placement's name as its first argument and the chapter's kwargs; "
                     "a norm on the branch leaves the stream's path alone"),
                    (lambda a, e: abs(a["output_rms"] - _residual_sums("pre").output_rms) < 0.01,
                     "output_rms: that is the pre-LN stack's; take the sandwich stack's"),
                    (lambda a, e: abs(a["output_rms"] - _residual_sums("post_sublayer").output_rms) < 2e-3,
                     "output_rms: that is the post_sublayer stack's; take the sandwich stack's"),
                    (lambda a, e: abs(a["output_rms"] - _residual_sums_by_default("sandwich")) < 2e-3,
                     "output_rms: that is residual_sum's defaults (RMSNorm, SwiGLU); pass the chapter's kwargs "
                     "(LayerNorm, ReLU), as its cells do"),
                    (lambda a, e: any(abs(a["output_rms"] - v) < 1e-3
                                      for v in _residual_sums("sandwich").stream_rms[1:-1]),
                     "output_rms: that is an earlier entry of stream_rms, the stream before the last sublayers; "
                     "X_2L's is the last, output_rms (stream_rms[-1])"),
                    (lambda a, e: any(abs(a["output_rms"] - 13 ** 0.5 * size) < 0.02 * 13 ** 0.5 * size
                                      for size in (1, _residual_sums("sandwich").input_rms)),
                     "output_rms: sqrt(13) is the size of 13 orthogonal terms of size 1; the terms are only "
                     "nearly orthogonal: measure it"),
                    (lambda a, e: min(abs(a["output_rms"] - k ** 0.5) / k ** 0.5 for k in (6, 7, 12)) < 0.02,
                     "output_rms: X_2L sums 13 terms, the input X_0 and the 12 sublayers' contributions (two "
                     "per block)"),
                    (lambda a, e: abs(a["output_rms"] - _residual_sums("sandwich").input_rms) < 1e-3,
                     "output_rms: that is the input's RMS, X_0's; hand in the output's, X_2L's"),
                    (lambda a, e: a["output_rms"] in (12, 13),
                     "output_rms: that counts the terms; hand in the measured RMS of their sum, X_2L"),
                    (lambda a, e: abs(a["output_rms"] - 1) < 0.01,
                     "output_rms: that is the size of each contribution; hand in the size of the output X_2L, "
                     "which sums 13 terms"),
                    (lambda a, e: abs(a["output_rms"] - e["output_rms"] ** 2) < 0.1,
                     "output_rms: that is the mean square; the RMS is its square root")],
             wrong=[lambda e: {**e, "sandwich": 1.5}, lambda e: {**e, "output_rms": _residual_sums("pre").output_rms},
                    lambda e: {**e, "output_rms": 13 ** 0.5}, lambda e: {**e, "output_rms": 1.0},
                    lambda e: {**e, "output_rms": _residual_sums("post_sublayer").output_rms},
                    lambda e: {**e, "output_rms": e["output_rms"] ** 2}, lambda e: {**e, "output_rms": 3.6},
                    lambda e: {**e, "output_rms": 12 ** 0.5},
                    lambda e: {**e, "output_rms": _residual_sums("sandwich").input_rms},
                    lambda e: {**e, "output_rms": _residual_sums("sandwich").stream_rms[-2]}]),
    Exercise("1.5", "(parameters, shared): num_parameters(stack) and anatomy.shared_parameters(stack) for six "
             "copies of one block", kind="numbers", names=("parameters", "shared"), expected=_tied_stack, rel=0,
             abs=0.5,
             hints=[(lambda a, e: a["parameters"] == 6 * e["parameters"],
                     "parameters: stack.parameters() lists a tensor once, however often the stack holds it"),
                    (lambda a, e: a["shared"] == 6 / 5 * e["shared"],
                     "shared: block 1 owns its tensors; only blocks 2 to 6 share them"),
                    (lambda a, e: a["shared"] == 0, "shared: the six entries are one object"),
                    (lambda a, e: a["shared"] in (5 * e["shared"], 6 * e["shared"]),
                     "shared: each of blocks 2 to 6 counts each of its tensors once (it belongs to an earlier "
                     "block), not once for every other block that holds it"),
                    (lambda a, e: a["shared"] in (5 * e["parameters"], 6 * e["parameters"]),
                     "shared_parameters counts parameter tensors, not numbers: how many tensors of blocks 2 to 6 "
                     "belong to block 1?"),
                    (lambda a, e: any(abs(a["parameters"] * unit - e["parameters"]) < 0.01 * e["parameters"]
                                      for unit in (1e3, 1e6)),
                     "parameters: the count itself, not in thousands or millions"),
                    (lambda a, e: a["shared"] == e["shared"] / 5,
                     "shared: that is one block's tensors; count them in each of blocks 2 to 6, which all hold "
                     "block 1's tensors"),
                    (lambda a, e: a["shared"] in (1, 5, 6),
                     "shared counts parameter tensors, not blocks: each of blocks 2 to 6 holds all of block 1's "
                     "tensors")],
             wrong=[lambda e: {**e, "parameters": 6 * e["parameters"]}, lambda e: {**e, "shared": 0},
                    lambda e: {**e, "shared": 6 / 5 * e["shared"]}, lambda e: {**e, "shared": 5},
                    lambda e: {**e, "shared": e["shared"] / 5}, lambda e: {**e, "shared": 6 * e["parameters"]}]),
    Exercise("1.6", "your class MiniBlock(num_hiddens, num_heads, causal=False)", kind="custom",
             judge=_judge_causal_miniblock,
             wrong=[lambda: _wrong_miniblock("ignored"), lambda: _wrong_miniblock("diagonal too"),
                    lambda: _wrong_miniblock("after softmax"), lambda: _wrong_miniblock("always"),
                    lambda: _wrong_miniblock("before softmax", scale_by="d")]),
    Exercise("1.7", "the largest difference alone_vs_in_sequence(block, X) returns (its first number)",
             expected=_zero_attention_gap, rel=0, abs=1e-5,
             hints=[(lambda a, e: a > 1e-3, "attention still reads other rows: does attn_factory return your module, "
                                            "and does its forward return zeros of the queries' shape?")],
             wrong=[lambda e: 1.0, lambda e: 0.05]),
]
