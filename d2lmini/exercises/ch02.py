"""Self-checks of chapter 2's exercises (Residual connections: the gradient highway).

Every expected answer is computed here from the exercise's own settings with the chapter's
module, :mod:`d2lmini.chapters.ch02_residual`, and :mod:`d2lmini.train`. Exercise 2.4 trains
a one-block model for 200 steps (seconds) and, for its hint, the chapter's four-block one.
"""

from __future__ import annotations

import functools
import math

import torch

from . import Exercise

#: The chapter's language model and its training settings (its ``model`` and ``training``: the
#: book's recipe, :data:`d2lmini.train.RECIPE`, at a peak rate of 5e-3).
MODEL = dict(num_layers=4, num_hiddens=64, num_heads=4, norm="layer", act="relu")
TRAINING = dict(batch_size=32, seq_len=64, warmup_steps=50, schedule="cosine", betas=(0.9, 0.95),
                weight_decay=0.0, clip_norm=1.0, lr=5e-3)
#: The chapter's training length (steps).
NUM_STEPS = 200


# --------------------------------------------------------------------------- 2.1 Xavier initialization

@functools.cache
def _xavier_probe(init: str = "xavier_uniform"):
    from ..chapters import ch02_residual as residual

    sweep = residual.depth_gradients(depths=(2, 4, 8, 16, 32, 64), configs=[("none", True)], init=init)
    return sweep.probes[0]


def _first_depth_over_100(init: str = "xavier_uniform") -> int:
    """2.1's answer (``init="torch_default"``: with the chapter's default initialization instead, a mistake)."""
    probe = _xavier_probe(init)
    return next(L for L in probe.depths if probe.first_block_grad(L) > 100 * probe.first_block_grad(2))


# --------------------------------------------------------------------------- 2.2 post-LN without skips

def collapse_block(probe, threshold: float = 1e-14) -> int:
    """The first block ``k`` after which the token spread of ``probe`` stays below ``threshold``
    (every token the same vector up to rounding); ``len(probe.token_spread)`` if it never does."""
    spread = probe.token_spread
    return next((k for k in range(1, len(spread)) if max(spread[k:]) < threshold), len(spread))


@functools.cache
def _post_ln_sweep():
    from ..chapters import ch02_residual as residual

    return residual.depth_gradients(depths=(8, 16, 32, 64), configs=[("post", False), ("post", True)])


def _gradient_fall(probe, of: str = "block 1") -> float:
    """Block 1's weight gradient at L = 8 divided by that at L = 64 (``of="input"``: the input's gradient;
    ``of="block L"``: the last block's, wrong answers hints aim at)."""
    grad = (probe.first_block_grad if of == "block 1" else (lambda L: probe.block_grad[L][-1]) if of == "block L"
            else probe.input_grad.__getitem__)
    return grad(8) / grad(64)


def _post_ln_without_skips() -> dict:
    probe = _post_ln_sweep().get("post", False)
    return {"k": collapse_block(probe), "fall": _gradient_fall(probe)}


def _post_ln_gradient_gap() -> float:
    """2.2's wrong answer: depth 8's block-1 gradient minus depth 64's (a difference, not a factor)."""
    probe = _post_ln_sweep().get("post", False)
    return probe.first_block_grad(8) - probe.first_block_grad(64)


def _post_ln_input_fall() -> float:
    return _gradient_fall(_post_ln_sweep().get("post", False), of="input")


def _post_ln_with_skips_fall() -> float:
    return _gradient_fall(_post_ln_sweep().get("post", True))


@functools.cache
def _pre_ln_gradient_fall() -> float:
    from ..chapters import ch02_residual as residual

    return _gradient_fall(residual.depth_gradients(depths=(8, 16, 32, 64), configs=[("pre", False)]).probes[0])


# --------------------------------------------------------------------------- 2.3 scaled branches

def scaled_stream_rms(scale: float, blocks=(8, 32, 64), ffn_too: bool = True, attention_too: bool = True) -> dict:
    """The stream's RMS after each of ``blocks`` (keys ``"8"``, ...) of the chapter's 64-block stack
    without norms, with skips (``make_skip_stack(64, "none", True, seed=1)``), every ``W_o`` and
    ``W_2`` times ``scale`` (``ffn_too=False``: ``W_o`` only; ``attention_too=False``: ``W_2`` only), on
    the input ``torch.randn(1, 32, 64)`` of a generator seeded with 0."""
    from ..chapters import ch02_residual as residual
    from ..probes import stream_rms

    stack = residual.make_skip_stack(64, "none", True, seed=1)
    with torch.no_grad():
        for block in stack:
            if attention_too:
                block.attention.W_o.weight.mul_(scale)
            if ffn_too:
                block.ffn.W_2.weight.mul_(scale)
        X = torch.randn(1, 32, 64, generator=torch.Generator().manual_seed(0))
        rms = {}
        for k, block in enumerate(stack, 1):
            X = block(X)
            rms[k] = stream_rms(X)
    return {str(k): rms[k] for k in blocks}


_scaled = functools.cache(lambda scale: scaled_stream_rms(scale))
_attention_only = functools.cache(lambda: scaled_stream_rms(1 / math.sqrt(128), ffn_too=False)["64"])
_ffn_only = functools.cache(lambda: scaled_stream_rms(1 / math.sqrt(128), attention_too=False)["64"])


def _rms_after_64() -> dict:
    return {"without": _scaled(1.0)["64"], "with": _scaled(1 / math.sqrt(128))["64"]}


# --------------------------------------------------------------------------- 2.4 one block without skips

@functools.cache
def _no_skip_val(num_layers: int, residual: bool = False, seed: int = 0) -> float:
    """The final validation loss of the chapter's model with ``num_layers`` blocks (``seed`` 0 but in a
    wrong answer), trained like the chapter's for its 200 steps."""
    from ..data import python_reference_corpus
    from ..train import train_lm

    corpus = python_reference_corpus()
    model = dict(MODEL, num_layers=num_layers)
    return train_lm(corpus, residual=residual, num_steps=NUM_STEPS, seed=seed, **model, **TRAINING).val_loss[-1]


def _unigram_entropy(split: str) -> float:
    """The unigram entropy of the chapter's corpus' ``split`` ("train" or "val"), nats per character."""
    from ..chapters.ch02_residual import unigram_entropy
    from ..data import python_reference_corpus

    return unigram_entropy(getattr(python_reference_corpus(), split))


# --------------------------------------------------------------------------- 2.5 start as the identity

@functools.cache
def _first_step(seed: int) -> tuple:
    """Every block's gradient norms of ``W_o`` and ``W_q`` in the first training step of the chapter's
    model of ``seed`` with every block's output projections zeroed, one dict per block."""
    from ..chapters import ch02_residual as residual
    from ..data import python_reference_corpus
    from ..train import seeded_tiny_lm, train_models

    corpus = python_reference_corpus()
    lm = seeded_tiny_lm(corpus.vocab_size, seed, max_len=TRAINING["seq_len"], **MODEL)
    for each in lm.blocks:
        residual.zero_output_projections_(each)
    train_models([lm], corpus, [seed], num_steps=1, **TRAINING)  # each .grad keeps that step's gradient
    return tuple({"w_o": float(b.attention.W_o.weight.grad.norm()), "w_q": float(b.attention.W_q.weight.grad.norm())}
                 for b in lm.blocks)


def _first_step_gradients(block: int = 0, seed: int = 0) -> dict:
    """2.5: block 1's gradient norms of the first step, seed 0 (another ``block`` index or ``seed``: the wrong
    answers hints aim at)."""
    return dict(_first_step(seed)[block])


EXERCISES = [
    Exercise("2.1", "the depth L, one of 2, 4, 8, 16, 32, 64", expected=_first_depth_over_100, rel=0, abs=0.5,
             hints=[(lambda a, e: a not in (2, 4, 8, 16, 32, 64),
                     "hand in the depth L (one of 2, 4, 8, 16, 32, 64), not a gradient or a ratio"),
                    (lambda a, e: a == _first_depth_over_100("torch_default"),
                     "that is where the chapter's default initialization takes off: pass init=\"xavier_uniform\""),
                    (lambda a, e: a > e, "compare every depth's gradient with depth 2's, "
                                         "probe.first_block_grad(L) / probe.first_block_grad(2)"),
                    (lambda a, e: a < e, "more than 100 times depth 2's value: a factor of 3 or 4 is not yet")],
             wrong=[lambda e: 2 * e, lambda e: e / 2, lambda e: 6047.76,
                    lambda e: _first_depth_over_100("torch_default")]),
    Exercise("2.2", "(k, fall) of post-LN without skips: the first block from which the token "
             "spread stays below 1e-14, and block 1's gradient at L = 8 divided by that at L = 64",
             kind="numbers", names=("k", "fall"), expected=_post_ln_without_skips, rel=2e-2,
             hints=[(lambda a, e: abs(a["fall"] - _pre_ln_gradient_fall()) < 0.05 * a["fall"],
                     "fall: that is the pre-LN stack's; use sweep.get('post', False)"),
                    (lambda a, e: abs(a["fall"] - _post_ln_input_fall()) < 0.02 * a["fall"],
                     "fall: block 1's weights' gradient, probe.first_block_grad(L), not the gradient "
                     "reaching the input (input_grad)"),
                    (lambda a, e: abs(math.exp(a["fall"]) - e["fall"]) < 0.05 * e["fall"]
                     or abs(10 ** a["fall"] - e["fall"]) < 0.05 * e["fall"],
                     "fall: the factor itself, not its logarithm"),
                    (lambda a, e: abs(a["fall"] - _post_ln_with_skips_fall()) < 0.02 * a["fall"],
                     "fall: that is post-LN with skips; use sweep.get('post', False)"),
                    (lambda a, e: abs(a["fall"] - _gradient_fall(_post_ln_sweep().get("post", False), of="block L"))
                     < 0.02 * a["fall"],
                     "fall: that is the last block's gradient (block_grad[L][-1]); block 1's is "
                     "probe.first_block_grad(L)"),
                    (lambda a, e: abs(a["fall"] - _post_ln_gradient_gap()) < 0.02 * abs(a["fall"]),
                     "fall: a factor, depth 8's gradient divided by depth 64's, not their difference"),
                    (lambda a, e: abs(a["fall"] * e["fall"] - 1) < 0.05,
                     "fall: depth 8's gradient divided by depth 64's, not the other way round"),
                    (lambda a, e: abs(a["fall"] - (1 - 1 / e["fall"])) < 0.02,
                     "fall: the ratio itself, depth 8's gradient divided by depth 64's, not the fraction of "
                     "the gradient lost"),
                    (lambda a, e: a["k"] != e["k"],
                     "k: look at probe.token_spread[k] for k = 1, 2, 3, ... (token_spread[0] is the input X_0); "
                     "from which block on is every value below 1e-14?")],
             wrong=[lambda e: {**e, "fall": 1 / e["fall"]},
                    lambda e: {**e, "k": e["k"] - 1},
                    lambda e: {**e, "fall": _pre_ln_gradient_fall()},
                    lambda e: {**e, "fall": _post_ln_with_skips_fall()},
                    lambda e: {**e, "fall": _post_ln_input_fall()}, lambda e: {**e, "fall": math.log10(e["fall"])},
                    lambda e: {**e, "fall": math.log(e["fall"])}, lambda e: {**e, "fall": 1 - 1 / e["fall"]}]),
    Exercise("2.3", "(without, with): the stream's RMS after block 64, without and with the scaling",
             kind="numbers", names=("without", "with"), expected=_rms_after_64,
             rel={"without": 0.05, "with": 3e-3},  # without: 66.4 to 68.0 by processor (float32 rounding)
             hints=[(lambda a, e: not (math.isfinite(a["with"]) or math.isfinite(a["without"])),
                     "both overflowed: each block already adds its own skip, so apply it as X = block(X), not "
                     "X + block(X)"),
                    (lambda a, e: math.isnan(a["with"]) or math.isinf(a["with"]),
                     "with: the stream overflowed: multiply the weights by 1/sqrt(2L), a factor below 1, not by "
                     "sqrt(2L)"),
                    (lambda a, e: all(abs(a[k] - v ** 2) < 0.02 * v ** 2 for k, v in e.items()),
                     "those are mean squares: the RMS is their square root, X.pow(2).mean().sqrt()"),
                    (lambda a, e: abs(a["without"] - scaled_stream_rms(1.0, blocks=(63,))["63"]) < 1e-3 * a["without"],
                     "that is the RMS after block 63: the list of RMS values starts with X_0's, so block 64's is "
                     "the last entry"),
                    (lambda a, e: abs(a["without"] - _scaled(1.0)["32"]) < 3e-3 * _scaled(1.0)["32"],
                     "that is the RMS after block 32: hand in the one after block 64, the last"),
                    (lambda a, e: 0.02 < abs(a["without"] / e["without"] - 1) < 0.5 and 0.5 < a["with"] < 2,
                     "without is off too: another draw of the stack or of its input; build the stack with "
                     "seed=1 and draw X with torch.randn(1, 32, 64, generator=torch.Generator().manual_seed(0))"),
                    (lambda a, e: abs(a["without"] - e["with"]) < 3e-3 * e["with"],
                     "without: measure the stack before you scale it (the scaling is in place), or build "
                     "it again"),
                    (lambda a, e: abs(a["with"] - a["without"]) < 1e-3 * a["without"],
                     "with: multiply the weights in place, under torch.no_grad(), before applying the blocks"),
                    (lambda a, e: abs(a["with"] - _scaled(1 / 8)["64"]) < 3e-3 * a["with"],
                     "with: 2L, since a block has two sublayers: L = 64 blocks add 128 branches"),
                    (lambda a, e: abs(a["with"] - _scaled(1 / 128)["64"]) < 3e-3 * a["with"],
                     "with: scale by the square root of 1/(2L) (running the in-place scaling twice squares it: "
                     "rebuild the stack first)"),
                    (lambda a, e: abs(a["with"] - e["without"] / math.sqrt(128)) < 3e-3 * a["with"],
                     "with: scale the weights attention.W_o and ffn.W_2 before running the blocks, not the "
                     "stream afterwards"),
                    (lambda a, e: abs(a["with"] - _scaled(1 / 16)["64"]) < 3e-3 * a["with"],
                     "with: L is the number of blocks, 64, so the factor is 1/sqrt(2 * 64): the 2 already "
                     "counts the two sublayers of a block"),
                    (lambda a, e: abs(a["with"] - e["without"]) < 3e-3 * e["without"],
                     "the first number is the stack as built, the second the scaled one"),
                    (lambda a, e: min(abs(a["with"] - _attention_only()), abs(a["with"] - _ffn_only()))
                     < 3e-3 * a["with"],
                     "with: scale both residual projections of every block, attention.W_o and ffn.W_2")],
             wrong=[lambda e: {**e, "with": _scaled(1 / 8)["64"]}, lambda e: {**e, "with": _attention_only()},
                    lambda e: {"without": e["with"], "with": e["without"]}, lambda e: {**e, "with": e["without"]},
                    lambda e: {"without": e["with"], "with": e["with"]}, lambda e: {**e, "with": _ffn_only()},
                    lambda e: {**e, "with": _scaled(1 / 16)["64"]}]),
    Exercise("2.4", "run.val_loss[-1]: the final validation loss of the one-block model without skips",
             expected=lambda: _no_skip_val(1), rel=0, abs=3e-3, slow=True,  # the check trains the same run
             hints=[(lambda a, e: abs(a - _no_skip_val(4)) < 0.05,
                     "that is the chapter's four-block model: pass num_layers=1 after **model, or change it there"),
                    (lambda a, e: abs(a - _no_skip_val(1, True)) < 0.005,
                     "train with residual=False: the model without skips"),
                    (lambda a, e: 2e-3 < abs(a - e) < 0.05 and abs(a - _no_skip_val(1, seed=1)) < 2e-3,
                     "that is another draw: train with seed=0"),
                    (lambda a, e: abs(a * math.log(2) - e) < 0.015, "the losses are in nats, not bits"),
                    (lambda a, e: min(abs(a - _unigram_entropy(split)) for split in ("train", "val")) < 0.01,
                     "that is a text's unigram entropy, the loss of a model that ignores the context: hand in "
                     "the trained model's run.val_loss[-1]"),
                    (lambda a, e: 2.9 < a < 3.4,
                     "that is about the chapter's four-block model's loss: pass num_layers=1 after **model"),
                    (lambda a, e: True, "run.val_loss[-1] of train_lm with the chapter's training settings, "
                                        "num_steps=200, seed=0, residual=False and the model with num_layers=1")],
             wrong=[lambda e: _no_skip_val(4), lambda e: e / math.log(2), lambda e: _unigram_entropy("val"),
                    lambda e: 3.20, lambda e: _no_skip_val(1, seed=1)]),
    Exercise("2.5", "(w_o, w_q): the norms of the first step's gradients of block 1's attention.W_o.weight and "
             "attention.W_q.weight, output projections zeroed", kind="numbers", names=("w_o", "w_q"),
             expected=_first_step_gradients, rel=1e-3, abs=1e-6,  # one step, in the reader's process
             hints=[(lambda a, e: any(abs(a["w_o"] - _first_step_gradients(k)["w_o"]) < 1e-3 * a["w_o"]
                                      for k in range(1, MODEL["num_layers"])),
                     "w_o: that is another block's; block 1 is lm.blocks[0]"),
                    (lambda a, e: abs(a["w_o"] - _first_step_gradients(seed=1)["w_o"]) < 1e-3 * a["w_o"],
                     "w_o: that is another draw: the model and the batches of seed 0"),
                    (lambda a, e: a["w_o"] < 1e-6 and abs(a["w_q"] - e["w_o"]) < 0.05 * e["w_o"],
                     "the order is (w_o, w_q)"),
                    (lambda a, e: a["w_q"] > 1,
                     "w_q: that is the size of a weight, not of its gradient: hand in .weight.grad.norm()"),
                    (lambda a, e: a["w_q"] > 1e-6, "w_q: zero the output projections of a freshly built model "
                                                  "and take exactly one step (after a step W_o is no longer zero); "
                                                  "then ask what W_q's output can change while W_o is zero"),
                    (lambda a, e: a["w_o"] < 1e-6, "w_o: its gradient multiplies the gradient at the sublayer's "
                                                   "output by W_o's input; is either of them zero?"),
                    (lambda a, e: abs(a["w_o"] - e["w_o"] ** 2) < 1e-3 * e["w_o"] ** 2,
                     "w_o: that is the squared norm; hand in .norm(), its square root"),
                    (lambda a, e: True, "zero the output projections of every block "
                                        "(residual.zero_output_projections_), take one step of train_models on "
                                        "the model of seed 0 with the batches of seed 0, then the .grad of "
                                        "lm.blocks[0].attention.W_o.weight and its .norm()")],
             wrong=[lambda e: {"w_o": 0.0, "w_q": 0.0}, lambda e: {**e, "w_q": e["w_o"]},
                    lambda e: {"w_o": 0.0, "w_q": e["w_o"]}, lambda e: {"w_o": 0.0, "w_q": 4.6},
                    lambda e: _first_step_gradients(block=3), lambda e: _first_step_gradients(seed=1)]),
]
