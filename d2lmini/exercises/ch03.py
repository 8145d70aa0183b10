"""Self-checks of chapter 3's exercises (Normalization: why LayerNorm, not BatchNorm).

Every expected answer is computed here with :mod:`d2lmini.chapters.ch03_normalization`, from the
settings each exercise names: the padded batch ``nm.padded_batch(padding=0.7)`` (seed 0) for 3.1
and 3.2, and :func:`~d2lmini.chapters.ch03_normalization.same_sentence_elsewhere` for 3.3 and 3.4.
"""

from __future__ import annotations

import math
import numbers
from functools import lru_cache

import torch

from . import Exercise

#: Exercise 3.3's settings, in the order the answer lists them: (momentum, warmup).
MOMENTA_WARMUPS = ((0.01, 5), (0.01, 100), (0.5, 5), (0.5, 100))
#: Exercise 3.4's batch sizes; every sentence has 16 tokens.
BATCH_SIZES = (2, 8, 32, 128, 512)
NUM_STEPS = 16


def _nm():
    from ..chapters import ch03_normalization

    return ch03_normalization


def _batch():
    return _nm().padded_batch(padding=0.7)


# ------------------------------------------------------------------------------------- 3.1

def _largest_masked_difference() -> float:
    """Masked BatchNorm of the padded batch against BatchNorm of its real tokens alone, at the real tokens."""
    nm, batch = _nm(), _batch()
    masked = nm.batch_norm_by_hand(batch.X, valid_lens=batch.valid_lens)[batch.mask]
    alone = nm.batch_norm_by_hand(batch.X[batch.mask])
    return float((masked - alone).abs().max())


@lru_cache(maxsize=1)
def _unmasked_difference() -> float:
    """The same comparison with BatchNorm over every position, padding included: the padding's error."""
    nm, batch = _nm(), _batch()
    return float((nm.batch_norm_by_hand(batch.X)[batch.mask] - nm.batch_norm_by_hand(batch.X[batch.mask])).abs().max())


# ------------------------------------------------------------------------------------- 3.2

def _variances():
    nm, batch = _nm(), _batch()
    _, var_all = nm.batch_norm_stats(batch.X)
    _, var_real = nm.batch_norm_stats(batch.X, batch.valid_lens)
    return batch, var_all, var_real


def _indices(mask: torch.Tensor) -> set[int]:
    return set(mask.nonzero().flatten().tolist())


def _growing_features() -> set[int]:
    """The features whose variance over all positions exceeds their variance over the real tokens."""
    _, var_all, var_real = _variances()
    return _indices(var_all > var_real)


def _as_indices(answer, num_hiddens: int) -> set[int]:
    """A reader's answer to 3.2 as a set of feature indices: a list, tuple, set or range of ints, a 1-D
    integer tensor, or a boolean mask of shape ``(d,)``."""
    hand_in = "the indices of the features, e.g. [3, 17] or a boolean mask of shape (64,)"
    if isinstance(answer, (tuple, list)) and len(answer) == 1 and hasattr(answer[0], "__array__"):
        answer = answer[0]  # np.nonzero, torch.where, nonzero(as_tuple=True): one array per dimension
    if not isinstance(answer, torch.Tensor) and hasattr(answer, "__array__"):  # a NumPy array
        answer = torch.as_tensor(answer)
    if isinstance(answer, (list, tuple)) and len(answer) == num_hiddens and all(isinstance(a, bool) for a in answer):
        answer = torch.tensor(answer)  # a mask as a list of bools
    if isinstance(answer, torch.Tensor):
        if answer.dim() == 2 and answer.shape[-1] == 1:  # torch.nonzero's (count, 1)
            answer = answer.flatten()
        if answer.dtype == torch.bool:
            if tuple(answer.shape) != (num_hiddens,):
                raise ValueError(f"exercise 3.2: a boolean mask must have shape ({num_hiddens},) ({hand_in}), "
                                 f"got {tuple(answer.shape)}")
            return _indices(answer)
        if answer.is_floating_point() or answer.dim() > 1:
            raise ValueError(f"exercise 3.2: the answer must be feature indices ({hand_in}), got a "
                             f"{answer.dtype} tensor of shape {tuple(answer.shape)}")
        answer = answer.flatten().tolist()
    if isinstance(answer, (str, bytes)) or not isinstance(answer, (list, tuple, set, frozenset, range)):
        raise ValueError(f"exercise 3.2: the answer must be feature indices ({hand_in}), got {type(answer).__name__}")
    indices = set()
    for index in answer:
        if isinstance(index, torch.Tensor) and index.numel() == 1 and not index.is_floating_point():
            index = index.item()
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):  # NumPy's integers are Integral
            raise ValueError(f"exercise 3.2: every index must be an int ({hand_in}), got {index!r}")
        index = int(index)
        if not 0 <= index < num_hiddens:
            raise ValueError(f"exercise 3.2: the batch has features 0 to {num_hiddens - 1}, got index {index}")
        indices.add(index)
    return indices


def _judge_growing(answer) -> str | None:
    batch, var_all, var_real = _variances()
    got, want = _as_indices(answer, batch.X.shape[-1]), _indices(var_all > var_real)
    if got == want:
        return None
    shrinking = _indices(var_all < var_real)
    if got == {i + 1 for i in want}:
        return "every index is one too high: feature indices start at 0, as tensor indices do"
    m, s = batch.feature_mean, batch.feature_scale
    if got == _indices(m.pow(2) > s.pow(2)):
        return ("padding also multiplies the real tokens' variance s_j^2 by (1 - p): keep that factor "
                "when you solve the inequality for m_j^2")
    p = batch.padding_share
    if got == _indices((1 - p) * m.pow(2) > p * s.pow(2)):
        return "a factor p is left on s_j^2: after subtracting s_j^2, divide both sides by p"
    if got == _indices(p * m.pow(2) > (1 - p) * s.pow(2)):
        return "a p is left on m_j^2 and (1 - p) sits on s_j^2: after subtracting s_j^2, divide both sides by p"
    if got == _indices(m.pow(2) > (1 - p) * s.pow(2)):
        return "(1 - p) sits on the wrong side: to leave m_j^2 alone, divide by (1 - p), do not multiply"
    if got in (_indices(p * m.pow(2) > s.pow(2)), _indices(m.pow(2) > p * s.pow(2))):
        return ("the factor is not p: subtract s_j^2 from both sides, then divide by p, which leaves the "
                "(1 - p) of p(1 - p) on m_j^2")
    if got == shrinking:
        return "these are the features whose variance padding shrinks; the exercise asks for those it increases"
    if not got & want and len(got) > len(shrinking) / 2:  # most of the shrinking ones
        return ("padding increases none of these features' variance: is the comparison flipped? Keep the "
                "features whose variance over all positions is larger than over the real tokens (valid_lens)")
    if got > want:
        return ("some of these features' variance shrinks: compare the variance over all positions with "
                "the variance over the real tokens (valid_lens), feature by feature; if a condition chose "
                "them, it is too loose: redo its algebra")
    if not got:
        return ("none named, but padding does increase some features' variance: compare the variance over "
                "all positions with the variance over the real tokens (valid_lens), feature by feature; if a "
                "condition chose none, it is too strict: redo its algebra, squares included")
    if got < want:
        return ("every feature you named is right, but some are missing: check all 64 features; if a "
                "condition chose them, it is too strict: redo its algebra, squares included")
    return ("compare the variances, the second of the (mean, variance) pair nm.batch_norm_stats returns, "
            "of batch.X and of batch.X with batch.valid_lens, feature by feature, in nm.padded_batch(padding=0.7)")


def _mean_square_rule() -> list[int]:
    batch = _batch()
    return sorted(_indices(batch.feature_mean.pow(2) > batch.feature_scale.pow(2)))


def _factor_p_rule() -> list[int]:
    batch = _batch()
    return sorted(_indices(batch.padding_share * batch.feature_mean.pow(2) > batch.feature_scale.pow(2)))


def _p_left_on_s_rule() -> list[int]:
    batch = _batch()
    p = batch.padding_share
    return sorted(_indices((1 - p) * batch.feature_mean.pow(2) > p * batch.feature_scale.pow(2)))


def _shrinking_features() -> list[int]:
    _, var_all, var_real = _variances()
    return sorted(_indices(var_all < var_real))


# ------------------------------------------------------------------------------------- 3.3 and 3.4

@lru_cache(maxsize=None)
def _rows(momentum: float = 0.1, warmup: int = 100, batch_size: int = 8) -> dict[str, dict]:
    rows = _nm().same_sentence_elsewhere(batch_size=batch_size, num_steps=NUM_STEPS, warmup=warmup,
                                         momentum=momentum)
    return {row["setting"]: row for row in rows}


SETTING_NAMES = tuple(f"momentum {momentum} warmup {warmup}" for momentum, warmup in MOMENTA_WARMUPS)


def _pairs_equal(answer: dict, pairs) -> bool:
    """Whether the answer's numbers at each pair of positions are equal (a setting left at its default)."""
    values = list(answer.values())
    return all(math.isclose(values[i], values[j], rel_tol=1e-9) for i, j in pairs)


def _evaluation_column(column: str = "bn_rms_delta", setting: str = "evaluation mode") -> dict[str, float]:
    return {name: _rows(momentum, warmup)[setting][column]
            for name, (momentum, warmup) in zip(SETTING_NAMES, MOMENTA_WARMUPS)}


def _close_all(answer: dict, other: dict, rel: float = 0.02) -> bool:
    return all(math.isclose(answer[k], other[k], rel_tol=rel) for k in answer)


def _transposed(values: dict) -> dict:
    """The four values in the other order: momentum inside, warm-up outside."""
    a, b, c, d = (values[name] for name in SETTING_NAMES)
    return dict(zip(SETTING_NAMES, (a, c, b, d)))


def _batch_mates_rms() -> list[float]:
    # The "other batch mates" row is measured before the warm-up, so the shortest warm-up (2) gives it.
    return [_rows(warmup=2, batch_size=batch_size)["other batch mates"]["bn_rms_delta"] for batch_size in BATCH_SIZES]


def _slope(xs, ys, intercept: bool = False, base: float = math.e) -> float:
    """The least-squares slope of log(ys) against log(xs) (``intercept``: the line's intercept instead, which
    depends on the logarithm's ``base``)."""
    lx, ly = [math.log(x, base) for x in xs], [math.log(y, base) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    slope = sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / sum((x - mx) ** 2 for x in lx)
    return my - slope * mx if intercept else slope


def _batch_mates_slope(intercept: bool = False, base: float = math.e) -> float:
    return _slope([batch_size * NUM_STEPS for batch_size in BATCH_SIZES], _batch_mates_rms(), intercept, base)


EXERCISES = [
    Exercise(
        "3.1", "the largest absolute difference at the real tokens, one number",
        expected=_largest_masked_difference, rel=0.0, abs=1e-5,
        hints=[(lambda a, e: a < 0, "a difference's size is its absolute value: take .abs() before .max()"),
               (lambda a, e: math.isclose(a, _unmasked_difference(), rel_tol=0.01),
                "that is the error of BatchNorm over every position: pass valid_lens=batch.valid_lens to the "
                "padded batch's BatchNorm, and compare it with BatchNorm of the real tokens alone, "
                "nm.batch_norm_by_hand(batch.X[batch.mask])"),
               (lambda a, e: a > 1e-3, "compare only the real tokens: index the padded batch's output with "
                                       "batch.mask, which gives the same (N, d) rows as batch.X[batch.mask]")],
        wrong=[lambda e: _unmasked_difference(), lambda e: e + 0.5]),
    Exercise(
        "3.2", "the indices of the features whose variance padding increases, e.g. [3, 17]", kind="custom",
        judge=_judge_growing,
        wrong=[_mean_square_rule, _factor_p_rule, _p_left_on_s_rule, _shrinking_features, lambda: list(range(64)),
               lambda: sorted(i + 1 for i in _growing_features())]),
    Exercise(
        "3.3", "BatchNorm's RMS |Δ| in evaluation mode for (momentum, warmup) = (0.01, 5), (0.01, 100), "
               "(0.5, 5), (0.5, 100), in that order",
        kind="numbers", names=SETTING_NAMES, expected=_evaluation_column, rel=0.02,
        hints=[(lambda a, e: _close_all(a, _evaluation_column("bn_max_delta")),
                "these are the largest changes; hand in the RMS column, bn_rms_delta"),
               (lambda a, e: _close_all(a, _evaluation_column(setting="other batch mates")),
                "take the evaluation-mode row: the other batch mates' row is measured before any warm-up, "
                "so it does not depend on the momentum"),
               (lambda a, e: all(abs(v) < 1e-6 for v in a.values()),
                "that is LayerNorm's column (0: it never reads the batch); hand in BatchNorm's, bn_rms_delta"),
               (lambda a, e: _pairs_equal(a, ((0, 1), (2, 3))),
                "each momentum gives the same number at both warm-ups: pass warmup=5 and warmup=100 as well "
                "(the default is 100)"),
               (lambda a, e: _pairs_equal(a, ((0, 2), (1, 3))),
                "each warm-up gives the same number at both momenta: pass momentum=0.01 and momentum=0.5 as "
                "well (the default is 0.1)")],
        order="the order is momentum 0.01 with warm-ups 5 and 100, then momentum 0.5 with 5 and 100",
        wrong=[lambda e: _evaluation_column("bn_max_delta"), _transposed,
               lambda e: dict(zip(e, reversed(list(e.values())))),
               lambda e: _evaluation_column(setting="other batch mates"),
               lambda e: dict(zip(e, [v for v in list(e.values())[1::2] for _ in (0, 1)])),
               lambda e: dict(zip(e, list(e.values())[:2] * 2))]),
    Exercise(
        "3.4", "the slope of log RMS |Δ| against log(tokens in the batch), one number",
        expected=_batch_mates_slope, rel=0.0, abs=0.005,
        hints=[(lambda a, e: min(abs(a - _batch_mates_slope(intercept=True, base=base)) for base in (math.e, 10, 2))
                < 0.01,
                "that is the line's intercept: np.polyfit(x, y, 1) returns [slope, intercept], so take [0]"),
               (lambda a, e: a > 0, "the change shrinks as the batch grows: the slope is negative"),
               (lambda a, e: abs(a + 0.5) < 0.005, "-1/2 is the exponent a mean's sampling error predicts; hand "
                                                  "in the slope your five points fit"),
               (lambda a, e: math.isclose(a, 2 * e, rel_tol=0.05),
                "fit the RMS itself, not its square"),
               (lambda a, e: math.isclose(a, 1 / e, rel_tol=0.05),
                "fit log RMS as a function of log tokens, not the other way round"),
               (lambda a, e: math.isclose(a, _slope([b * NUM_STEPS for b in BATCH_SIZES],
                                                    [_rows(warmup=2, batch_size=b)["other batch mates"]["bn_max_delta"]
                                                     for b in BATCH_SIZES]), rel_tol=0.01),
                "that is the largest change; fit the RMS column, bn_rms_delta")],
        hint="fit the 'other batch mates' row's bn_rms_delta at batch sizes 2, 8, 32, 128 and 512 (16 tokens "
             "each), both axes logarithmic: np.polyfit(np.log(tokens), np.log(rms), 1)[0]",
        wrong=[lambda e: -0.5, lambda e: 2 * e, lambda e: 1 / e, lambda e: -e,
               lambda e: _batch_mates_slope(intercept=True), lambda e: _batch_mates_slope(intercept=True, base=10)]),
    Exercise("3.5", "a short paragraph", kind="discussion"),
]
