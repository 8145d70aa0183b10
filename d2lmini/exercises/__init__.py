"""Self-checks for the book's exercises, and the prediction asked before each chapter's experiment.

``check("4.2", answer)`` compares a reader's answer to exercise 2 of chapter 4 with what the
package computes from that exercise's own settings, and says whether it is right; when it is
not, it gives a hint that does not give the answer away::

    >>> from d2lmini.exercises import check
    >>> check("3.1", 1e-7)   # doctest: +SKIP
    3.1: not yet. ...

The exercises of chapter ``N`` live in ``d2lmini.exercises.chNN`` (loaded on first use), each
an :class:`Exercise`: a numeric answer (one number, or several named ones), a function the
check runs on fresh inputs beside the package's, or a discussion question, which has a model
answer in the chapter's solutions notebook and no check.

:class:`Prediction` is the question before an experiment: a choice of two to four outcomes,
chosen live with a small widget, and revealed, folded until opened, after the run.

:func:`check_build` (in :mod:`d2lmini.exercises.build`) is the check after each chapter's
"Build it": the reader's module against ``d2lmini``'s, with a hint naming the part that differs.
"""

from __future__ import annotations

import html
import importlib
import itertools
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = ["Exercise", "Prediction", "Reveal", "Verdict", "check", "check_build", "exercise", "exercise_ids"]

#: The chapters that have exercises, by number, and the module holding each one's.
CHAPTER_MODULES = {n: f"ch{n:02d}" for n in range(1, 12)}

_ID = re.compile(r"^(\d+)\.(\d+)$")


@dataclass(frozen=True)
class Verdict:
    """What :func:`check` says: whether the answer is right, and a hint when it is not.

    Truthy exactly when the answer is right, so ``assert check("4.2", answer)`` works."""

    exercise: str
    correct: bool
    message: str

    def __bool__(self) -> bool:
        return self.correct

    def __repr__(self) -> str:
        return f"{self.exercise}: {'correct' if self.correct else 'not yet'}. {self.message}".rstrip()

    def _repr_markdown_(self) -> str:
        mark = "✅" if self.correct else "❌"
        return f"{mark} **{self.exercise}: {'correct' if self.correct else 'not yet'}.** {self.message}".rstrip()


Hint = tuple[Callable[[Any, Any], bool], str]


@dataclass
class Exercise:
    """One exercise: what to hand in, how the package computes the right answer, how to compare.

    Attributes:
        id: ``"N.k"``, exercise ``k`` of chapter ``N``.
        hand_in: what the answer is, in words (shown when its type or shape is wrong).
        kind: ``"number"`` (one real number), ``"numbers"`` (several, named by ``names``:
            a dict with those keys, or a tuple in that order), ``"function"`` (a callable,
            run by the check on fresh inputs beside ``reference``), ``"custom"`` (``judge``
            decides) or ``"discussion"`` (no check: a model answer in the solutions).
        expected: for ``"number"``/``"numbers"``: a function of no arguments computing the
            answer with the package, from the exercise's settings (evaluated once, on first use).
        names: the names of a ``"numbers"`` answer, in order.
        rel, abs: the tolerance, ``|answer - expected| <= abs + rel * |expected|`` per number;
            for ``"numbers"``, ``rel`` may be a dict giving some names their own (the others
            keep the default, 1e-2).
        reference, inputs: for ``"function"``: the package's function, and a function of a
            ``torch.Generator`` returning a tuple of fresh arguments for both.
        judge: for ``"custom"``: a function of the answer returning ``None`` when right and
            a hint when not (raising ``ValueError`` for an answer of the wrong type).
        hints: ``(test, hint)`` pairs tried in order on a wrong answer; ``test(answer,
            expected)`` says whether ``hint`` fits (for functions: the reader's output and
            ``reference``'s on the same inputs).
        hint: the hint when no test fits.
        order: for ``"numbers"``: the hint for the right numbers handed in another order (tried
            before ``hints``); None: a hint naming ``names`` in order.
        wrong: plausible wrong answers, as functions of the expected answer (``"number(s)"``)
            or of nothing (``"function"``/``"custom"``): the tests check that each is rejected.
        slow: True if computing the expected answer takes more than a few seconds.
    """

    id: str
    hand_in: str
    kind: str = "number"
    expected: Callable[[], Any] | None = None
    names: tuple[str, ...] = ()
    rel: float | dict[str, float] = 1e-2
    abs: float = 0.0
    reference: Callable | None = None
    inputs: Callable[[torch.Generator], tuple] | None = None
    judge: Callable[[Any], str | None] | None = None
    hints: list[Hint] = field(default_factory=list)
    hint: str = "Rerun the exercise's code with exactly the settings it names."
    order: str | None = None
    wrong: list[Callable] = field(default_factory=list)
    slow: bool = False
    _value: Any = field(default=None, repr=False)
    _computed: bool = field(default=False, repr=False)

    KINDS = ("number", "numbers", "function", "custom", "discussion")

    def __post_init__(self):
        if self.kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {self.kind!r}")
        if self.kind in ("number", "numbers") and self.expected is None:
            raise ValueError(f"exercise {self.id}: a {self.kind!r} exercise needs expected")
        if self.kind == "numbers" and not self.names:
            raise ValueError(f"exercise {self.id}: a 'numbers' exercise needs names")
        if self.kind == "function" and (self.reference is None or self.inputs is None):
            raise ValueError(f"exercise {self.id}: a 'function' exercise needs reference and inputs")
        if self.kind == "custom" and self.judge is None:
            raise ValueError(f"exercise {self.id}: a 'custom' exercise needs judge")
        if isinstance(self.rel, dict) and (self.kind != "numbers" or not set(self.rel) <= set(self.names)):
            raise ValueError(f"exercise {self.id}: rel as a dict is for a 'numbers' exercise, keyed by its names")

    def _rel(self, name: str | None = None) -> float:
        """The relative tolerance of the number called ``name`` (None: of a one-number answer)."""
        return self.rel.get(name, 1e-2) if isinstance(self.rel, dict) else self.rel

    def answer(self):
        """The right answer, computed by the package (once per process); None for functions,
        custom checks and discussions."""
        if self.kind not in ("number", "numbers"):
            return None
        if not self._computed:
            value = self.expected()
            self._value = (_as_number(self.id, "expected", value) if self.kind == "number"
                           else _as_numbers(self, value))
            self._computed = True
        return self._value

    def verdict(self, answer) -> Verdict:
        """Judge ``answer`` (see :func:`check`)."""
        if self.kind == "discussion":
            raise ValueError(f"exercise {self.id} is a discussion question: it has no check; compare your "
                             f"answer with the model answer in the chapter's solutions notebook")
        if self.kind == "function":
            return self._judge_function(answer)
        if self.kind == "custom":
            hint = self.judge(answer)
            return Verdict(self.id, hint is None, "" if hint is None else f"Hint: {hint}")
        expected = self.answer()
        given = (_as_number(self.id, "answer", answer, self.hand_in) if self.kind == "number"
                 else _as_numbers(self, answer, self.hand_in))
        if self.kind == "number":
            right = _close(given, expected, self._rel(), self.abs)
            off = []
        else:
            off = [name for name in self.names if not _close(given[name], expected[name], self._rel(name), self.abs)]
            right = not off
        if right:
            return Verdict(self.id, True, "")
        return Verdict(self.id, False, self._hint(given, expected, off))

    def _hint(self, given, expected, off) -> str:
        where = f"Not right yet: {', '.join(off)}. " if off else ""
        if self.kind == "numbers" and self._reordered(given, expected):
            order = self.order or f"these are the right numbers in another order: hand in ({', '.join(self.names)})"
            return f"{where}Hint: {order}"
        if self._percentages(given, expected, off):
            return f"{where}Hint: these are percentages: hand in the numbers themselves (0.25, not 25)"
        rounded = (f"{where}Hint: rounded, {'these are' if len(off) > 1 else 'that is'} off by more than the "
                   f"check allows: hand in the numbers as your code computes them, unrounded")
        if self._rounded(given, expected, off, to_zero=False):
            return rounded
        for test, hint in self.hints:
            try:
                fits = test(given, expected)
            except (ArithmeticError, KeyError, TypeError, ValueError):
                fits = False
            if fits:
                return f"{where}Hint: {hint}"
        if self._rounded(given, expected, off):  # 0.0 for a small number: after the hints, which may expect 0
            if (given == 0) if self.kind == "number" else all(given[name] == 0 for name in off):
                return (f"{where}Hint: {'that is' if len(off) <= 1 else 'these are'} 0, but what your code "
                        f"measures is small, not 0: hand in the number it computes, not 0 or a rounding to 0")
            return rounded
        return f"{where}Hint: {self.hint}"

    def _percentages(self, given, expected, off: list[str]) -> bool:
        """Whether every wrong number of ``given`` is 100 times the right one, far enough from 0 that the
        percentage, within 100 times the tolerance, cannot be 0 or the number's negative, and at least one
        of them a fraction (0 < |x| <= 1): a count handed in 100-fold is not taken for a percentage."""
        pairs = [(given, expected, None)] if self.kind == "number" else [(given[n], expected[n], n) for n in off]

        def percentage(got, want, name):
            window = 100 * (self.abs + self._rel(name) * abs(want))
            return 100 * abs(want) > 2 * window and abs(got - 100 * want) <= window

        return (bool(pairs) and all(percentage(*pair) for pair in pairs)
                and any(0 < abs(want) <= 1 for _, want, _ in pairs))

    def _rounded(self, given, expected, off: list[str], to_zero: bool = True) -> bool:
        """Whether every wrong number of ``given`` is the right one rounded, to two or three significant
        digits or to two to four decimals (with ``to_zero``, 0.0 too: a small number rounded away); one digit is
        a guess, and a count is not rounded."""
        pairs = [(given, expected)] if self.kind == "number" else [(given[n], expected[n]) for n in off]

        def rounded(got, want):
            if float(want).is_integer():  # a count is not rounded
                return False
            roundings = {float(f"{want:.{k}g}") for k in (2, 3)} | {round(want, k) for k in (2, 3, 4)}
            return got in roundings and got != want and (to_zero or got != 0)

        return bool(pairs) and all(rounded(*pair) for pair in pairs)

    def _reordered(self, given: dict, expected: dict) -> bool:
        """Whether ``given`` holds ``expected``'s numbers, within the tolerance, in another order."""
        want = [expected[name] for name in self.names]
        return any(all(_close(given[name], value, self._rel(name), self.abs) for name, value in zip(self.names, order))
                   for order in itertools.permutations(want) if list(order) != want)

    def _judge_function(self, fn) -> Verdict:
        if not callable(fn):
            raise ValueError(f"exercise {self.id}: the answer must be a function ({self.hand_in}), "
                             f"got {type(fn).__name__}")
        generator = torch.Generator().manual_seed(torch.randint(0, 2**31 - 1, ()).item())  # fresh inputs each time
        for _ in range(3):
            args = self.inputs(generator)
            want = self.reference(*args)
            try:
                got = fn(*args)
            except Exception as error:  # the reader's code failed: say how, as a hint
                scalar = "one element tensors can be converted" in str(error) or "must be real number" in str(error)
                advice = (" (a math function takes one number: use the torch one, such as torch.tanh, which acts on "
                          "every entry of a tensor)") if scalar else ""
                return Verdict(self.id, False, f"Hint: your function raised {type(error).__name__}: {error}{advice}")
            if not isinstance(got, torch.Tensor):
                return Verdict(self.id, False, f"Hint: your function must return a tensor, got {type(got).__name__}")
            if got.shape != want.shape:
                return Verdict(self.id, False, f"Hint: your function returns shape {tuple(got.shape)}; "
                                               f"the input's shape says it should be {tuple(want.shape)}")
            if not torch.allclose(got.to(want.dtype), want, rtol=max(self._rel(), 1e-5), atol=max(self.abs, 1e-5)):
                return Verdict(self.id, False, self._hint(got.to(want.dtype), want, []))
        return Verdict(self.id, True, "It agrees with the package's on three fresh random inputs.")


def _close(a: float, b: float, rel: float, abs_: float) -> bool:
    if math.isnan(b):
        return math.isnan(a)
    if math.isinf(b):
        return a == b
    return math.isfinite(a) and abs(a - b) <= abs_ + rel * abs(b)


def _as_number(exercise_id: str, what: str, value, hand_in: str = "a number") -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"exercise {exercise_id}: the {what} must be one number ({hand_in}), "
                             f"got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"exercise {exercise_id}: the {what} must be a number ({hand_in}), "
                         f"got {type(value).__name__}")
    return float(value)


def _as_numbers(ex: Exercise, value, hand_in: str | None = None) -> dict[str, float]:
    what = "answer" if hand_in is not None else "expected"
    hand_in = hand_in or ex.hand_in
    names = ex.names
    if isinstance(value, dict):
        missing, extra = [n for n in names if n not in value], [k for k in value if k not in names]
        if missing or extra:
            raise ValueError(f"exercise {ex.id}: the {what} must be a dict with the keys {list(names)} "
                             f"({hand_in}); missing {missing}, unexpected {extra}")
        items = [value[n] for n in names]
    elif isinstance(value, (tuple, list)) or (hasattr(value, "__array__") and getattr(value, "ndim", 0) == 1):
        if len(value) != len(names):  # a tuple, a list, or a 1-D tensor or NumPy array
            raise ValueError(f"exercise {ex.id}: the {what} must hold {len(names)} numbers, {', '.join(names)} "
                             f"in this order ({hand_in}); got {len(value)}")
        items = list(value)
    else:
        raise ValueError(f"exercise {ex.id}: the {what} must be a tuple of {len(names)} numbers "
                         f"({', '.join(names)}) or a dict with those keys ({hand_in}); got {type(value).__name__}")
    return {n: _as_number(ex.id, f"{what}'s {n!r}", v, hand_in) for n, v in zip(names, items)}


def _split(exercise_id) -> tuple[int, int]:
    if not isinstance(exercise_id, str):
        raise ValueError(f"exercise must be a string such as '4.2' (chapter 4, exercise 2), "
                         f"got {type(exercise_id).__name__} {exercise_id!r}")
    match = _ID.match(exercise_id.strip())
    if match is None:
        raise ValueError(f"exercise must look like '4.2' (chapter 4, exercise 2), got {exercise_id!r}")
    return int(match[1]), int(match[2])


def _chapter(number: int) -> dict[str, Exercise]:
    if number not in CHAPTER_MODULES:
        raise ValueError(f"there is no chapter {number} with exercises; chapters: {sorted(CHAPTER_MODULES)}")
    try:
        module = importlib.import_module(f"{__name__}.{CHAPTER_MODULES[number]}")
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{CHAPTER_MODULES[number]}":
            raise
        return {}
    return {ex.id: ex for ex in module.EXERCISES}


def exercise(exercise_id: str) -> Exercise:
    """The :class:`Exercise` of ``exercise_id`` (``"N.k"``).

    Raises:
        ValueError: for an id that is not ``"N.k"`` or names no exercise of the book.
    """
    chapter, _ = _split(exercise_id)
    found = _chapter(chapter)
    key = exercise_id.strip()
    if key not in found:
        known = ", ".join(sorted(found, key=lambda k: _split(k)[1])) or "none with a check yet"
        raise ValueError(f"there is no exercise {key!r}; chapter {chapter}'s exercises: {known}")
    return found[key]


def exercise_ids(chapter: int | None = None) -> list[str]:
    """The ids of every registered exercise, of one chapter or (``None``) of the whole book, in order."""
    chapters = sorted(CHAPTER_MODULES) if chapter is None else [chapter]
    return [k for n in chapters for k in sorted(_chapter(n), key=lambda k: _split(k)[1])]


def check(exercise_id: str, answer) -> Verdict:
    """Check ``answer`` to exercise ``exercise_id``: right or not, and a hint when not.

    Args:
        exercise_id: ``"N.k"``, exercise ``k`` of chapter ``N`` (as the chapter numbers them).
        answer: what the exercise asks to hand in: a number (a Python number or a one-element
            tensor), a tuple or dict of named numbers, or a function, as the exercise says.

    Returns:
        A :class:`Verdict` (truthy when right), shown as one line in a notebook.

    Raises:
        ValueError: for an unknown exercise id, a discussion question (no check), or an answer
            of the wrong type or shape (the message says what the exercise expects).
    """
    return exercise(exercise_id).verdict(answer)


# --------------------------------------------------------------------------- predictions

_LETTERS = "abcd"


class Prediction:
    """A question asked before an experiment: two to four possible outcomes, one of them right.

    Shown as the question and its lettered choices (HTML and Markdown, so the built book, Jupyter
    and Colab show it alike); :attr:`widget` is the live choice (``ipywidgets.RadioButtons``), which
    records the reader's guess; after the experiment, :meth:`reveal` says which outcome the run
    showed and why, folded until opened.

    Args:
        question: the question, one sentence.
        choices: two to four distinct outcomes, each a short sentence.

    Raises:
        TypeError / ValueError: for a question that is not a non-empty string, or choices that
            are not two to four distinct non-empty strings.
    """

    def __init__(self, question: str, choices):
        if not isinstance(question, str) or not question.strip():
            raise TypeError(f"question must be a non-empty string, got {question!r}")
        if not isinstance(choices, (list, tuple)) or not all(isinstance(c, str) and c.strip() for c in choices):
            raise TypeError(f"choices must be a list of non-empty strings, got {choices!r}")
        if not 2 <= len(choices) <= 4 or len(set(choices)) != len(choices):
            raise ValueError(f"choices must hold 2 to 4 distinct outcomes, got {len(choices)}: {list(choices)}")
        self.question, self.choices = question.strip(), [c.strip() for c in choices]
        self.guess: int | None = None
        self._widget = None

    def label(self, index: int) -> str:
        """``"(b) the second choice"``."""
        return f"({_LETTERS[index]}) {self.choices[index]}"

    def _repr_markdown_(self) -> str:
        lines = [f"**Predict.** {self.question}", ""] + [f"* {self.label(i)}" for i in range(len(self.choices))]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return "\n".join([f"Predict. {self.question}"] + [f"  {self.label(i)}" for i in range(len(self.choices))])

    @property
    def widget(self):
        """The live choice: ``ipywidgets.RadioButtons`` of the choices; picking one records :attr:`guess`."""
        if self._widget is None:
            import ipywidgets as widgets

            buttons = widgets.RadioButtons(options=[(self.label(i), i) for i in range(len(self.choices))],
                                           value=None, description="Your guess:",
                                           layout=widgets.Layout(width="max-content"))

            def record(change):
                self.guess = change["new"]

            buttons.observe(record, names="value")
            self._widget = buttons
        return self._widget

    def _ipython_display_(self):
        from IPython.display import Markdown, display

        display(Markdown(self._repr_markdown_()))

    def reveal(self, answer: int, why: str) -> "Reveal":
        """Which choice the run showed, and why, as a :class:`Reveal`.

        Args:
            answer: the index of the right choice (0 for (a)), computed from the run's numbers.
            why: one or two sentences with the run's numbers.

        Raises:
            TypeError / ValueError: for an index outside the choices or an empty ``why``.
        """
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise TypeError(f"answer must be the index of a choice (an int), got {type(answer).__name__}")
        if not 0 <= answer < len(self.choices):
            raise ValueError(f"answer must be 0..{len(self.choices) - 1} (one of the choices), got {answer}")
        if not isinstance(why, str) or not why.strip():
            raise TypeError(f"why must be a non-empty string, got {why!r}")
        return Reveal(self, answer, why.strip(), self.guess)


@dataclass(frozen=True)
class Reveal:
    """The answer to a :class:`Prediction`: an HTML ``<details>`` element, folded unless the reader
    guessed live (then open, saying whether the guess was right)."""

    prediction: Prediction
    answer: int
    why: str
    guess: int | None = None

    def summary(self) -> str:
        """One line on the reader's guess: open, right, or not this time."""
        if self.guess is None:
            return "Which was right? (open)"
        verdict = "right" if self.guess == self.answer else "not this time"
        return f"You chose ({_LETTERS[self.guess]}): {verdict}."

    def _repr_html_(self) -> str:
        is_open = "" if self.guess is None else " open"
        body = html.escape(self.why)
        return (f'<details class="d2l-prediction"{is_open}><summary>{html.escape(self.summary())}</summary>'
                f'<p><strong>{html.escape(self.prediction.label(self.answer))}</strong>. {body}</p></details>')

    def __repr__(self) -> str:
        return f"{self.summary()} The run says {self.prediction.label(self.answer)}. {self.why}"


from .build import check_build  # noqa: E402 (the check after each chapter's "Build it")
