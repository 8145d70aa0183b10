"""The tiny configurations of the reference layers, for the zoo, the chapters and the tests.

Each family module declares its own (its ``TINY_CONFIGS``, next to its rows); :mod:`d2lmini.reference`
collects them here, in :data:`TINY_CONFIGS`. Each entry is the keyword arguments of one ``transformers``
configuration class (:func:`~d2lmini.reference.harness.hf_make` builds a layer from it): small enough that
the layer builds and runs in milliseconds on a CPU, and shaped so that every feature its converter reads is
exercised -- sliding windows and attention chunks shorter than the 16 steps of the test sequences, distinct
widths where a swapped one must not pass, enough layers that the tested one has the type under test. A tiny
configuration is not a released model: the released values are in the converters' docstrings and the zoo's
notes.

Not a family: it holds the shared base and the collected configurations, and imports nothing.
"""

from __future__ import annotations

import copy

#: The shared base: width 64, 4 query heads sharing 2 key/value heads, an FFN of 160.
TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=160)

#: Every sliding window of the tiny configurations: shorter than the 16-step test sequences.
WINDOW = 5

#: The tiny configurations by name (mostly the ``transformers`` model type; a second name where one model type
#: is tested in two shapes): every family's ``TINY_CONFIGS``, filled by :mod:`d2lmini.reference` on import.
TINY_CONFIGS: dict[str, dict] = {}


def tiny_config(name: str, **overrides) -> dict:
    """A fresh copy of the tiny configuration ``name``, with ``overrides`` applied.

    Args:
        name: a key of :data:`TINY_CONFIGS`.
        **overrides: configuration keys to set or replace (e.g. ``layer_types=[...]``).

    Returns:
        A new dict (nested lists and dicts copied too: ``transformers`` configurations edit them in place).

    Raises:
        ValueError: an unknown ``name`` (the message lists the known ones).
    """
    if name not in TINY_CONFIGS:
        raise ValueError(f"unknown tiny configuration {name!r}; known: {sorted(TINY_CONFIGS)}")
    return copy.deepcopy({**TINY_CONFIGS[name], **overrides})


__all__ = ["TINY", "TINY_CONFIGS", "WINDOW", "tiny_config"]
