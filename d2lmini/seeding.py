"""Seeded randomness that leaves the rest of the program alone.

Every experiment of the book draws its weights and data from its own seed, inside
:func:`seeded`: PyTorch's global random number generator is seeded for the draws and
put back as it was afterwards, so running one cell never changes what the next one
draws (the tests check that the global generator is left untouched).
"""

from __future__ import annotations

import contextlib

import torch

from ._checks import check_seed


@contextlib.contextmanager
def seeded(seed: int):
    """Run the ``with`` block with the global torch RNG seeded by ``seed``, then restore it.

    ``with seeded(0): W = torch.randn(3, 3)`` draws the same ``W`` every time and leaves
    the global CPU generator in the state it had before the block.

    Introduced in the chapter "Anatomy: two sublayers on one residual stream".

    Args:
        seed: an int (any sign, as ``torch.manual_seed`` takes).

    Raises:
        TypeError: if ``seed`` is not an int.
    """
    seed = check_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
