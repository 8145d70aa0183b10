"""The book's training data: English prose that ships with Python, as characters.

Introduced in the chapter "Where the norm goes" (warm-up demo) and used again in
"The feed-forward network" (GELU vs SwiGLU). No download: the text is the Python
language reference's topic help (``pydoc_data.topics``, the text ``help('if')``
prints), which is part of the standard library on every machine.
"""

from __future__ import annotations

import hashlib
from dataclasses import KW_ONLY, dataclass, field

import torch

from ._checks import check_choice, check_instance, check_positive_int, check_real


def python_reference_text() -> str:
    """The Python language reference's help topics, concatenated in sorted topic order.

    About 465,000 characters of English technical prose on CPython 3.11; the exact
    text (and so its size and checksum) differs between Python versions.

    Returns:
        The text as one ``str``.
    """
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


@dataclass
class CharCorpus:
    """A character-level corpus: vocabulary, encoded text and a train/validation split.

    Build it with :meth:`from_text`. The last ``val_fraction`` of the text is held out
    for validation, so the two splits never share a window.

    Attributes:
        text: the raw text.
        vocab: the sorted distinct characters; token id ``i`` is ``vocab[i]``.
        train, val: 1-D ``torch.long`` tensors of token ids.
        sha256: hex SHA-256 of the UTF-8 text (to state exactly what was trained on).
    """

    text: str
    vocab: list[str]
    _: KW_ONLY
    train: torch.Tensor
    val: torch.Tensor
    sha256: str = field(repr=False)

    @classmethod
    def from_text(cls, text: str, val_fraction: float = 0.1) -> "CharCorpus":
        """Encode ``text`` character by character and split it.

        Raises:
            TypeError: if ``text`` is not a str or ``val_fraction`` not a number.
            ValueError: if ``text`` is too short or ``val_fraction`` is not in (0, 0.5].
        """
        if len(check_instance("text", text, str, "a str")) < 1000:
            raise ValueError(f"text must be at least 1000 characters long, got {len(text)}")
        if not 0.0 < check_real("val_fraction", val_fraction) <= 0.5:
            raise ValueError(f"val_fraction must be in (0, 0.5], got {val_fraction}")
        vocab = sorted(set(text))
        index = {ch: i for i, ch in enumerate(vocab)}
        ids = torch.tensor([index[ch] for ch in text], dtype=torch.long)
        split = int(len(ids) * (1 - val_fraction))
        sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return cls(text, vocab, train=ids[:split], val=ids[split:], sha256=sha256)

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters."""
        return len(self.vocab)

    def decode(self, ids) -> str:
        """Token ids (any iterable of ints) back to text."""
        return "".join(self.vocab[int(i)] for i in ids)

    def random_batch(self, batch_size: int, num_steps: int, generator: torch.Generator,
                     split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of ``num_steps`` characters and their next characters.

        Args:
            batch_size, num_steps: the batch's shape ``(b, n)``.
            generator: a seeded ``torch.Generator`` (makes the batches reproducible).
            split: ``'train'`` or ``'val'``.

        Returns:
            ``(X, Y)``, each ``(batch_size, num_steps)`` of token ids; ``Y`` is ``X``
            shifted left by one position.

        Raises:
            ValueError: for an unknown split or windows longer than the split.
        """
        batch_size = check_positive_int("batch_size", batch_size)
        num_steps = check_positive_int("num_steps", num_steps)
        check_choice("split", split, ("train", "val"))
        data = self.train if split == "train" else self.val
        if num_steps + 1 > len(data):
            raise ValueError(f"num_steps={num_steps} is longer than the {split} split ({len(data)} characters)")
        starts = torch.randint(0, len(data) - num_steps, (batch_size,), generator=generator)
        offsets = torch.arange(num_steps + 1)
        windows = data[starts[:, None] + offsets[None, :]]
        return windows[:, :-1], windows[:, 1:]


def frequency_loss(corpus: CharCorpus, split: str = "val") -> float:
    """The loss of predicting every character from its frequency alone (nats per character).

    The cross-entropy on one split of the training split's character frequencies (each
    count plus one, so that no character has probability 0): what a context-free model that
    learned the training text's frequencies reaches. Compare it with losses on the same text: ``split="val"``
    (the default) with validation losses, ``split="train"`` with training losses.

    Raises:
        TypeError: if ``corpus`` is not a :class:`~d2lmini.data.CharCorpus`.
        ValueError: if ``split`` is not ``"train"`` or ``"val"``.
    """
    check_instance("corpus", corpus, CharCorpus, "a CharCorpus")
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    counts = torch.bincount(corpus.train, minlength=corpus.vocab_size).double() + 1
    return float(-(counts / counts.sum()).log()[getattr(corpus, split)].mean())


def python_reference_corpus(val_fraction: float = 0.1) -> CharCorpus:
    """:class:`CharCorpus` of :func:`python_reference_text` (the book's training data)."""
    return CharCorpus.from_text(python_reference_text(), val_fraction)
